//! The batch frame: the only unit written to a segment file. `docs/storage.md` describes it
//! byte by byte; this module is the single place that encodes and decodes it.
//!
//! ```text
//!  0  magic "NRDB"            4 bytes
//!  4  format version          u16 LE (1)
//!  6  frame length            u32 LE, whole frame including this header
//! 10  crc32c                  u32 LE, Castagnoli, over bytes 14..frame length
//! 14  base offset             u64 LE
//! 22  record count            u32 LE (>= 1)
//! 26  committed_at_ms         i64 LE (one commit time per batch)
//! 34  flags                   u16 LE (bit 0: origin present; bit 1: null values may
//!                             appear; bit 2: producer present; other bits zero)
//! 36  [origin]                epoch 8 bytes, parent partition u32 LE, slab start u64 LE,
//!                             first parent offset u64 LE, then count-1 zigzag varint deltas
//!     [producer]              with flag bit 2: producer id i64 LE, epoch i16 LE, base
//!                             sequence i32 LE
//!     records                 count times: attributes u8 (bit 0: key present; bit 1: value
//!                             null, only with flag bit 1), [key len varint, key], header count
//!                             varint, per header (name len varint, name UTF-8, value len
//!                             varint, value), [value len varint, value: absent when null]
//! ```
//!
//! Do not reorder fields: this layout is persisted; change it only with a new format version.

use bytes::Bytes;

use crate::error::StorageError;
use crate::record::{
    AppendBatch, BatchOrigin, Header, NewRecord, ProducerStamp, RecordOrigin, StoredRecord,
};

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"NRDB";
/// The frame layout version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Size of the fixed frame header in bytes (the offsets in the module table).
pub const HEADER_LEN: usize = 36;
/// Hard upper bound on one frame: 64 MiB, so a damaged length field can never make a reader
/// allocate gigabytes, and far above the daemon's 1 MiB record limit times a 4 MiB slab.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Flag bit: the batch carries an origin section.
pub const FLAG_ORIGIN: u16 = 1;
/// Flag bit: some record of the batch may have a null value (record attribute bit
/// [`ATTR_NULL_VALUE`]). Set only when one does, so frames without null values stay readable by
/// builds that predate it; those refuse a frame with it rather than misread it.
pub const FLAG_NULL_VALUES: u16 = 2;
/// Flag bit: the batch carries a producer section (an idempotent Kafka producer's id, epoch
/// and first sequence) after the origin section. Set only on such batches, so every other
/// frame stays readable by builds that predate it.
pub const FLAG_PRODUCER: u16 = 4;
/// Size of the producer section.
const PRODUCER_LEN: usize = 14;
/// Record attribute bit: the key is present.
const ATTR_KEY: u8 = 1;
/// Record attribute bit: the value is null (a Kafka tombstone); no value length or bytes
/// follow. Allowed only in a frame with [`FLAG_NULL_VALUES`].
const ATTR_NULL_VALUE: u8 = 2;
/// Byte position where the checksummed region starts (just after the CRC field).
const CRC_START: usize = 14;

/// The fixed part of a frame, as persisted at the byte positions of the module table (do not
/// reorder the encoded fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Whole frame length in bytes.
    pub frame_len: u32,
    /// Stored CRC-32C of bytes 14..frame_len.
    pub crc: u32,
    /// Offset of the first record.
    pub base_offset: u64,
    /// Number of records.
    pub record_count: u32,
    /// Commit time of the batch.
    pub committed_at_ms: i64,
    /// Flag bits.
    pub flags: u16,
}

impl FrameHeader {
    /// One past the last record's offset.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
}

/// Why bytes are not a valid frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes remain than the header or the stated length needs.
    #[error("frame is cut short: {needed} bytes needed, {available} available")]
    Short {
        /// Bytes the frame needs.
        needed: u64,
        /// Bytes that are there.
        available: u64,
    },
    /// The first four bytes are not the magic.
    #[error("no frame magic")]
    BadMagic,
    /// A version this build does not know.
    #[error("unknown frame format version {0}")]
    UnsupportedVersion(u16),
    /// A length below the header size or above the frame limit, or a zero record count.
    #[error("implausible frame header ({0})")]
    BadHeader(&'static str),
    /// The checksum does not match the bytes.
    #[error("CRC-32C mismatch (stored {stored:08x}, computed {computed:08x})")]
    CrcMismatch {
        /// CRC in the frame.
        stored: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// The checksum matched but the body does not parse (a bug or a CRC collision).
    #[error("malformed frame body ({0})")]
    Malformed(&'static str),
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// What the encoder needs of a record: its key, headers and value, borrowed. Implemented for
/// [`NewRecord`] (produce) and [`StoredRecord`] (a fan-out cursor encodes a child frame straight
/// from the parent records it read, without building new records or touching refcounts).
pub trait RecordParts {
    /// The key, `None` when absent (absent differs from empty).
    fn key(&self) -> Option<&[u8]>;
    /// The headers, in order.
    fn headers(&self) -> &[Header];
    /// The value, `None` when null (null differs from empty).
    fn value(&self) -> Option<&[u8]>;
}

impl RecordParts for NewRecord {
    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }
    fn headers(&self) -> &[Header] {
        &self.headers
    }
    fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }
}

impl RecordParts for StoredRecord {
    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }
    fn headers(&self) -> &[Header] {
        &self.headers
    }
    fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }
}

impl<R: RecordParts + ?Sized> RecordParts for &R {
    fn key(&self) -> Option<&[u8]> {
        (**self).key()
    }
    fn headers(&self) -> &[Header] {
        (**self).headers()
    }
    fn value(&self) -> Option<&[u8]> {
        (**self).value()
    }
}

/// Encoded size of one record (what `max_bytes` of a read counts).
fn record_len<R: RecordParts>(r: &R) -> usize {
    fn varint_len(v: usize) -> usize {
        let mut n = 1;
        let mut v = v >> 7;
        while v > 0 {
            n += 1;
            v >>= 7;
        }
        n
    }
    let mut n = 1;
    if let Some(k) = r.key() {
        n += varint_len(k.len()) + k.len();
    }
    n += varint_len(r.headers().len());
    for h in r.headers() {
        n += varint_len(h.name.len()) + h.name.len() + varint_len(h.value.len()) + h.value.len();
    }
    n + r.value().map_or(0, |v| varint_len(v.len()) + v.len())
}

/// Encodes a batch into `out` (cleared first) with a placeholder header; [`seal`] fills in the
/// offset, commit time and CRC once the writer holds the produce lock. Checks the frame limit
/// and that an origin has one parent offset per record. Returns the CRC-32C of the body (bytes
/// from [`HEADER_LEN`] on), computed record by record while the bytes are still in cache, for
/// [`seal`] to combine with the header's.
pub fn encode_batch<R: RecordParts>(
    records: &[R],
    origin: Option<&BatchOrigin>,
    out: &mut Vec<u8>,
) -> Result<u32, StorageError> {
    encode_stamped_batch(records, origin, None, out)
}

/// [`encode_batch`] with a producer section when `stamp` is given.
pub fn encode_stamped_batch<R: RecordParts>(
    records: &[R],
    origin: Option<&BatchOrigin>,
    stamp: Option<&ProducerStamp>,
    out: &mut Vec<u8>,
) -> Result<u32, StorageError> {
    if records.is_empty() {
        return Err(StorageError::EmptyBatch);
    }
    let count = u32::try_from(records.len()).map_err(|_| StorageError::RecordTooLarge {
        size: usize::MAX,
        max: MAX_FRAME_BYTES,
    })?;
    if let Some(o) = origin
        && o.parent_offsets.len() != records.len()
    {
        return Err(StorageError::OriginMismatch {
            records: records.len(),
            offsets: o.parent_offsets.len(),
        });
    }
    let estimate: usize = HEADER_LEN
        + origin.map_or(0, |o| 28 + o.parent_offsets.len() * 10)
        + stamp.map_or(0, |_| PRODUCER_LEN)
        + records.iter().map(record_len).sum::<usize>();
    if estimate > MAX_FRAME_BYTES {
        return Err(StorageError::RecordTooLarge {
            size: estimate,
            max: MAX_FRAME_BYTES,
        });
    }
    out.clear();
    out.reserve(estimate);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // frame length, below
    out.extend_from_slice(&[0; 4]); // crc, in seal
    out.extend_from_slice(&[0; 8]); // base offset, in seal
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&[0; 8]); // committed_at, in seal
    // Flag bit 1 is added below if a record turns out to have a null value (the flags sit
    // in the header, outside the body CRC, so they can change after the body is encoded).
    let flags = if origin.is_some() { FLAG_ORIGIN } else { 0 }
        | if stamp.is_some() { FLAG_PRODUCER } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    if let Some(o) = origin {
        out.extend_from_slice(&o.epoch);
        out.extend_from_slice(&o.parent_partition.to_le_bytes());
        out.extend_from_slice(&o.slab_start.to_le_bytes());
        let first = o.parent_offsets[0];
        out.extend_from_slice(&first.to_le_bytes());
        let mut prev = first;
        for &off in &o.parent_offsets[1..] {
            put_varint(out, zigzag(off.wrapping_sub(prev) as i64));
            prev = off;
        }
    }
    if let Some(stamp) = stamp {
        out.extend_from_slice(&stamp.producer_id.to_le_bytes());
        out.extend_from_slice(&stamp.epoch.to_le_bytes());
        out.extend_from_slice(&stamp.base_sequence.to_le_bytes());
    }
    let mut body_crc = crc32c::crc32c(&out[HEADER_LEN..]);
    let mut crc_done = out.len();
    let mut any_null = false;
    for r in records {
        let value = r.value();
        any_null |= value.is_none();
        let null = if value.is_none() { ATTR_NULL_VALUE } else { 0 };
        match r.key() {
            Some(k) => {
                out.push(ATTR_KEY | null);
                put_varint(out, k.len() as u64);
                out.extend_from_slice(k);
            }
            None => out.push(null),
        }
        put_varint(out, r.headers().len() as u64);
        for h in r.headers() {
            put_varint(out, h.name.len() as u64);
            out.extend_from_slice(h.name.as_bytes());
            put_varint(out, h.value.len() as u64);
            out.extend_from_slice(&h.value);
        }
        if let Some(value) = value {
            put_varint(out, value.len() as u64);
            out.extend_from_slice(value);
        }
        body_crc = crc32c::crc32c_append(body_crc, &out[crc_done..]);
        crc_done = out.len();
    }
    let len = out.len();
    if len > MAX_FRAME_BYTES {
        return Err(StorageError::RecordTooLarge {
            size: len,
            max: MAX_FRAME_BYTES,
        });
    }
    // Fits: len <= MAX_FRAME_BYTES < u32::MAX.
    out[6..10].copy_from_slice(&(len as u32).to_le_bytes());
    if any_null {
        out[34..36].copy_from_slice(&(flags | FLAG_NULL_VALUES).to_le_bytes());
    }
    Ok(body_crc)
}

/// Whether an encoded frame uses a flag that builds before null values and producer stamps
/// refuse ([`FLAG_NULL_VALUES`], [`FLAG_PRODUCER`]).
pub fn uses_newer_flags(frame: &[u8]) -> bool {
    frame.len() >= HEADER_LEN && u16_at(frame, 34) & (FLAG_NULL_VALUES | FLAG_PRODUCER) != 0
}

/// Fills the base offset and commit time of an encoded frame and its CRC, combining the
/// header's CRC with `body_crc` (what [`encode_batch`] returned) instead of reading the body
/// again. Sealing the same frame again (a retried append) gives the right CRC for the new
/// values.
pub fn seal(frame: &mut [u8], body_crc: u32, base_offset: u64, committed_at_ms: i64) {
    frame[14..22].copy_from_slice(&base_offset.to_le_bytes());
    frame[26..34].copy_from_slice(&committed_at_ms.to_le_bytes());
    let head_crc = crc32c::crc32c(&frame[CRC_START..HEADER_LEN]);
    let crc = crate::log::crc_combine::crc32c_combine(head_crc, body_crc, frame.len() - HEADER_LEN);
    frame[10..14].copy_from_slice(&crc.to_le_bytes());
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Parses and sanity-checks a frame header from the first [`HEADER_LEN`] bytes of `buf`.
pub fn parse_header(buf: &[u8]) -> Result<FrameHeader, FrameError> {
    if buf.len() < HEADER_LEN {
        if !MAGIC.starts_with(&buf[..buf.len().min(4)]) {
            return Err(FrameError::BadMagic);
        }
        return Err(FrameError::Short {
            needed: HEADER_LEN as u64,
            available: buf.len() as u64,
        });
    }
    if buf[0..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let version = u16_at(buf, 4);
    if version != FORMAT_VERSION {
        return Err(FrameError::UnsupportedVersion(version));
    }
    let h = FrameHeader {
        frame_len: u32_at(buf, 6),
        crc: u32_at(buf, 10),
        base_offset: u64_at(buf, 14),
        record_count: u32_at(buf, 22),
        committed_at_ms: u64_at(buf, 26) as i64,
        flags: u16_at(buf, 34),
    };
    // The smallest record is two bytes: attributes and a header count (a null value, no key).
    if (h.frame_len as usize) < HEADER_LEN + h.record_count as usize * 2 {
        return Err(FrameError::BadHeader("length too small for its records"));
    }
    if h.frame_len as usize > MAX_FRAME_BYTES {
        return Err(FrameError::BadHeader("length above the frame limit"));
    }
    if h.record_count == 0 {
        return Err(FrameError::BadHeader("zero records"));
    }
    if h.flags & !(FLAG_ORIGIN | FLAG_NULL_VALUES | FLAG_PRODUCER) != 0 {
        return Err(FrameError::BadHeader("unknown flag bits"));
    }
    Ok(h)
}

/// Checks the CRC of a whole frame whose header has been parsed.
pub fn check_crc(header: &FrameHeader, frame: &[u8]) -> Result<(), FrameError> {
    let computed = crc32c::crc32c(&frame[CRC_START..]);
    if computed != header.crc {
        return Err(FrameError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    Ok(())
}

/// A decoded record with its encoded size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedRecord {
    /// The record (offset, commit time and origin filled in).
    pub record: StoredRecord,
    /// Encoded size in bytes.
    pub encoded_len: usize,
}

/// One record's key, headers and value, as [`Cursor::record`] takes them.
type RecordFields = (Option<Bytes>, Vec<Header>, Option<Bytes>);

struct Cursor<'a> {
    frame: &'a Bytes,
    pos: usize,
    /// The record attribute bits the frame's flags allow.
    attrs: u8,
}

/// The record attribute bits a frame with `flags` may use.
fn allowed_attrs(flags: u16) -> u8 {
    if flags & FLAG_NULL_VALUES != 0 {
        ATTR_KEY | ATTR_NULL_VALUE
    } else {
        ATTR_KEY
    }
}

impl Cursor<'_> {
    fn byte(&mut self) -> Result<u8, FrameError> {
        let b = *self
            .frame
            .get(self.pos)
            .ok_or(FrameError::Malformed("ends inside a record"))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, FrameError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(FrameError::Malformed("varint longer than ten bytes"))
    }

    fn take(&mut self, n: u64) -> Result<Bytes, FrameError> {
        let n = usize::try_from(n).map_err(|_| FrameError::Malformed("length overflow"))?;
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.frame.len())
            .ok_or(FrameError::Malformed("length runs past the frame"))?;
        let out = self.frame.slice(self.pos..end);
        self.pos = end;
        Ok(out)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let b = self.take(N as u64)?;
        let mut a = [0; N];
        a.copy_from_slice(&b);
        Ok(a)
    }

    /// Moves past `n` bytes without taking them.
    fn skip(&mut self, n: u64) -> Result<(), FrameError> {
        let n = usize::try_from(n).map_err(|_| FrameError::Malformed("length overflow"))?;
        self.pos = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.frame.len())
            .ok_or(FrameError::Malformed("length runs past the frame"))?;
        Ok(())
    }

    /// Checks one record's attributes, key, headers (names UTF-8) and value and moves past it,
    /// building nothing.
    fn check_record(&mut self) -> Result<(), FrameError> {
        let attrs = self.byte()?;
        if attrs & !self.attrs != 0 {
            return Err(FrameError::Malformed("unknown record attribute bits"));
        }
        if attrs & ATTR_KEY != 0 {
            let n = self.varint()?;
            self.skip(n)?;
        }
        for _ in 0..self.varint()? {
            let n = self.varint()?;
            let from = self.pos;
            self.skip(n)?;
            std::str::from_utf8(&self.frame[from..self.pos])
                .map_err(|_| FrameError::Malformed("header name is not UTF-8"))?;
            let n = self.varint()?;
            self.skip(n)?;
        }
        if attrs & ATTR_NULL_VALUE != 0 {
            return Ok(());
        }
        let n = self.varint()?;
        self.skip(n)
    }

    /// Takes one record's key, headers and value (slices of the frame, not copies).
    fn record(&mut self) -> Result<RecordFields, FrameError> {
        let attrs = self.byte()?;
        if attrs & !self.attrs != 0 {
            return Err(FrameError::Malformed("unknown record attribute bits"));
        }
        let key = if attrs & ATTR_KEY != 0 {
            let n = self.varint()?;
            Some(self.take(n)?)
        } else {
            None
        };
        let header_count = self.varint()?;
        let mut headers = Vec::new();
        for _ in 0..header_count {
            let n = self.varint()?;
            let name = self.take(n)?;
            let name = std::str::from_utf8(&name)
                .map_err(|_| FrameError::Malformed("header name is not UTF-8"))?
                .to_string();
            let n = self.varint()?;
            headers.push(Header {
                name,
                value: self.take(n)?,
            });
        }
        if attrs & ATTR_NULL_VALUE != 0 {
            return Ok((key, headers, None));
        }
        let n = self.varint()?;
        Ok((key, headers, Some(self.take(n)?)))
    }
}

/// The origin section of a frame, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FrameOrigin {
    epoch: [u8; 8],
    parent_partition: u32,
    slab_start: u64,
    parent_offsets: Vec<u64>,
}

/// Where each record of a checked frame starts, and its origin: what lets a read decode just
/// the records it returns ([`FrameIndex::decode`]) instead of the whole frame. Built by
/// [`index_frame`], which checks the whole body once, exactly as [`decode_batch`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameIndex {
    /// Byte position of every record, then the frame's end (`record_count + 1` entries).
    starts: Vec<u32>,
    origin: Option<FrameOrigin>,
    producer: Option<ProducerStamp>,
}

/// Checks the body of a frame (header parsed and CRC checked by the caller) the way
/// [`decode_batch`] does (origin section, every record, nothing left over) without building
/// any record, and returns where each record starts. A frame this refuses, `decode_batch`
/// refuses with the same error.
pub fn index_frame(header: &FrameHeader, frame: &Bytes) -> Result<FrameIndex, FrameError> {
    if frame.len() != header.frame_len as usize {
        return Err(FrameError::Malformed(
            "frame length differs from the header",
        ));
    }
    let mut c = Cursor {
        frame,
        pos: HEADER_LEN,
        attrs: allowed_attrs(header.flags),
    };
    let count = header.record_count as usize;
    let origin = if header.flags & FLAG_ORIGIN != 0 {
        let epoch = c.fixed::<8>()?;
        let parent_partition = u32::from_le_bytes(c.fixed::<4>()?);
        let slab_start = u64::from_le_bytes(c.fixed::<8>()?);
        let mut parent_offsets = Vec::with_capacity(count);
        let mut prev = u64::from_le_bytes(c.fixed::<8>()?);
        parent_offsets.push(prev);
        for _ in 1..count {
            prev = prev.wrapping_add(unzigzag(c.varint()?) as u64);
            parent_offsets.push(prev);
        }
        Some(FrameOrigin {
            epoch,
            parent_partition,
            slab_start,
            parent_offsets,
        })
    } else {
        None
    };
    let producer = if header.flags & FLAG_PRODUCER != 0 {
        Some(ProducerStamp {
            producer_id: i64::from_le_bytes(c.fixed::<8>()?),
            epoch: i16::from_le_bytes(c.fixed::<2>()?),
            base_sequence: i32::from_le_bytes(c.fixed::<4>()?),
        })
    } else {
        None
    };
    let mut starts = Vec::with_capacity(count + 1);
    for _ in 0..count {
        // Fits: a frame is at most MAX_FRAME_BYTES < u32::MAX.
        starts.push(c.pos as u32);
        c.check_record()?;
    }
    if c.pos != frame.len() {
        return Err(FrameError::Malformed("bytes left after the last record"));
    }
    starts.push(c.pos as u32);
    Ok(FrameIndex {
        starts,
        origin,
        producer,
    })
}

impl FrameIndex {
    /// The producer the frame is stamped with, if any.
    pub fn producer(&self) -> Option<ProducerStamp> {
        self.producer
    }

    /// Number of records in the frame.
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// True for a frame with no records (never, for a frame [`index_frame`] accepted).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Encoded size of record `i` (what `max_bytes` of a read counts), without decoding it.
    pub fn encoded_len(&self, i: usize) -> usize {
        match (self.starts.get(i), self.starts.get(i + 1)) {
            (Some(&a), Some(&b)) => (b - a) as usize,
            _ => 0,
        }
    }

    /// Decodes record `i` of `frame` (the frame this index was built from): values, keys and
    /// header values are slices of `frame`, not copies.
    pub fn decode(
        &self,
        header: &FrameHeader,
        frame: &Bytes,
        i: usize,
    ) -> Result<DecodedRecord, FrameError> {
        let (Some(&start), Some(&end)) = (self.starts.get(i), self.starts.get(i + 1)) else {
            return Err(FrameError::Malformed("record index past the frame"));
        };
        let mut c = Cursor {
            frame,
            pos: start as usize,
            attrs: allowed_attrs(header.flags),
        };
        let (key, headers, value) = c.record()?;
        if c.pos != end as usize {
            return Err(FrameError::Malformed("record ends elsewhere than indexed"));
        }
        Ok(DecodedRecord {
            record: StoredRecord {
                offset: header.base_offset + i as u64,
                committed_at_ms: header.committed_at_ms,
                key,
                headers,
                value,
                origin: self.origin.as_ref().map(|o| RecordOrigin {
                    epoch: o.epoch,
                    parent_partition: o.parent_partition,
                    parent_offset: o.parent_offsets[i],
                    slab_start: o.slab_start,
                }),
            },
            encoded_len: (end - start) as usize,
        })
    }

    /// The frame's origin, as the batch it was encoded from carried it, if it has one.
    pub fn into_origin(self) -> Option<BatchOrigin> {
        self.origin.map(|o| BatchOrigin {
            epoch: o.epoch,
            parent_partition: o.parent_partition,
            slab_start: o.slab_start,
            parent_offsets: o.parent_offsets,
        })
    }

    /// Bytes this index holds on the heap (what a read memo counts against its budget).
    pub fn heap_bytes(&self) -> usize {
        self.starts.capacity() * 4
            + self
                .origin
                .as_ref()
                .map_or(0, |o| o.parent_offsets.capacity() * 8)
    }
}

/// Decodes a whole frame (header parsed and CRC checked by the caller) into records. Values,
/// keys and header values are slices of `frame`, not copies.
pub fn decode_batch(header: &FrameHeader, frame: &Bytes) -> Result<Vec<DecodedRecord>, FrameError> {
    let index = index_frame(header, frame)?;
    (0..index.len())
        .map(|i| index.decode(header, frame, i))
        .collect()
}

/// Decodes a frame as [`encode_batch`] wrote it back into the records and provenance it was
/// encoded from: what lets a batch encoded for a local append be sent to another node instead.
/// The CRC, base offset and commit time are not read (an unsealed frame holds placeholders
/// there); everything else is checked as [`decode_batch`] checks it (header, origin section,
/// every record, nothing left over). Keys, values and header values are slices of `frame`.
pub fn decode_unsealed(frame: &Bytes) -> Result<AppendBatch, FrameError> {
    let header = parse_header(frame)?;
    let index = index_frame(&header, frame)?;
    let records = (0..index.len())
        .map(|i| {
            index.decode(&header, frame, i).map(|d| NewRecord {
                key: d.record.key,
                headers: d.record.headers,
                value: d.record.value,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AppendBatch {
        records,
        origin: index.into_origin(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(key: Option<&[u8]>, value: &[u8], headers: &[(&str, &[u8])]) -> NewRecord {
        NewRecord {
            key: key.map(Bytes::copy_from_slice),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.to_string(),
                    value: Bytes::copy_from_slice(v),
                })
                .collect(),
            value: Some(Bytes::copy_from_slice(value)),
        }
    }

    fn roundtrip(records: &[NewRecord], origin: Option<&BatchOrigin>) -> Vec<StoredRecord> {
        let mut buf = Vec::new();
        let body = encode_batch(records, origin, &mut buf).unwrap();
        seal(&mut buf, body, 42, 1_700_000_000_123);
        let h = parse_header(&buf).unwrap();
        assert_eq!(h.frame_len as usize, buf.len());
        check_crc(&h, &buf).unwrap();
        let frame = Bytes::from(buf);
        decode_batch(&h, &frame)
            .unwrap()
            .into_iter()
            .map(|d| d.record)
            .collect()
    }

    #[test]
    fn a_batch_round_trips_with_absent_and_empty_keys_kept_apart() {
        let records = vec![
            rec(None, b"v0", &[]),
            rec(Some(b""), b"", &[("h", b"x"), ("h", b"")]),
            rec(Some(b"k"), &[0xff; 300], &[]),
        ];
        let out = roundtrip(&records, None);
        assert_eq!(out.len(), 3);
        for (i, (r, o)) in records.iter().zip(&out).enumerate() {
            assert_eq!(o.offset, 42 + i as u64);
            assert_eq!(o.committed_at_ms, 1_700_000_000_123);
            assert_eq!(o.key, r.key);
            assert_eq!(o.headers, r.headers);
            assert_eq!(o.value, r.value);
            assert_eq!(o.origin, None);
        }
        assert_eq!(out[0].key, None);
        assert_eq!(out[1].key, Some(Bytes::new()));
    }

    #[test]
    fn an_origin_round_trips_with_any_parent_offsets() {
        let origin = BatchOrigin {
            epoch: *b"\x67\x95\x34\x71\xcc\x57\xa3\x2a",
            parent_partition: 7,
            slab_start: 9,
            parent_offsets: vec![10, 11, 12, 9, u64::MAX, 0],
        };
        let records: Vec<_> = (0..6).map(|i| rec(None, &[i], &[])).collect();
        let out = roundtrip(&records, Some(&origin));
        let got: Vec<u64> = out
            .iter()
            .map(|r| r.origin.as_ref().unwrap().parent_offset)
            .collect();
        assert_eq!(got, origin.parent_offsets);
        assert_eq!(out[3].origin.as_ref().unwrap().parent_partition, 7);
        assert!(
            out.iter()
                .all(|r| r.origin.as_ref().unwrap().slab_start == 9)
        );
    }

    #[test]
    fn an_origin_with_the_wrong_number_of_offsets_is_refused() {
        let origin = BatchOrigin {
            epoch: [0; 8],
            parent_partition: 0,
            slab_start: 1,
            parent_offsets: vec![1],
        };
        let err = encode_batch(
            &[rec(None, b"a", &[]), rec(None, b"b", &[])],
            Some(&origin),
            &mut Vec::new(),
        );
        assert!(matches!(
            err,
            Err(StorageError::OriginMismatch {
                records: 2,
                offsets: 1
            })
        ));
    }

    #[test]
    fn an_empty_batch_and_an_oversized_batch_are_refused() {
        assert!(matches!(
            encode_batch::<NewRecord>(&[], None, &mut Vec::new()),
            Err(StorageError::EmptyBatch)
        ));
        let big = rec(None, &vec![0; MAX_FRAME_BYTES], &[]);
        assert!(matches!(
            encode_batch(&[big], None, &mut Vec::new()),
            Err(StorageError::RecordTooLarge { .. })
        ));
    }

    #[test]
    fn the_header_sits_at_the_documented_byte_positions() {
        let mut buf = Vec::new();
        let body = encode_batch(&[rec(Some(b"k"), b"v", &[])], None, &mut buf).unwrap();
        seal(&mut buf, body, 0x0102_0304_0506_0708, -5);
        assert_eq!(&buf[0..4], b"NRDB");
        assert_eq!(&buf[4..6], &[1, 0]);
        assert_eq!(u32_at(&buf, 6) as usize, buf.len());
        assert_eq!(u32_at(&buf, 10), crc32c::crc32c(&buf[14..]));
        assert_eq!(u64_at(&buf, 14), 0x0102_0304_0506_0708);
        assert_eq!(u32_at(&buf, 22), 1);
        assert_eq!(u64_at(&buf, 26) as i64, -5);
        assert_eq!(u16_at(&buf, 34), 0);
        // attributes (key present), key len 1, "k", 0 headers, value len 1, "v"
        assert_eq!(&buf[36..], &[1, 1, b'k', 0, 1, b'v']);
    }

    #[test]
    fn the_example_frame_in_the_storage_docs_is_what_we_write() {
        let mut buf = Vec::new();
        let body = encode_batch(&[rec(Some(b"k"), b"v", &[("h", b"x")])], None, &mut buf).unwrap();
        seal(&mut buf, body, 7, 1_767_225_600_000);
        let expected: Vec<u8> = "4e 52 44 42 01 00 2e 00 00 00 d4 4b 17 6c 07 00 \
                                 00 00 00 00 00 00 01 00 00 00 00 a8 da 76 9b 01 \
                                 00 00 00 00 01 01 6b 01 01 68 01 78 01 76"
            .split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect();
        assert_eq!(buf, expected);
    }

    #[test]
    fn null_and_empty_values_read_back_apart_and_only_a_frame_with_a_null_is_flagged() {
        let mut records = vec![rec(Some(b"k"), b"", &[])];
        let mut buf = Vec::new();
        encode_batch(&records, None, &mut buf).unwrap();
        assert_eq!(
            u16_at(&buf, 34),
            0,
            "no null value: the frame older builds read"
        );
        assert_eq!(&buf[36..], &[1, 1, b'k', 0, 0]);

        records.push(NewRecord {
            key: Some(Bytes::from_static(b"k")),
            headers: Vec::new(),
            value: None,
        });
        buf.clear();
        encode_batch(&records, None, &mut buf).unwrap();
        assert_eq!(u16_at(&buf, 34), FLAG_NULL_VALUES);
        // The empty value: length 0; the null one: attribute bit 1 and nothing after headers.
        assert_eq!(&buf[36..], &[1, 1, b'k', 0, 0, 3, 1, b'k', 0]);
        let out = roundtrip(&records, None);
        assert_eq!(out[0].value.as_deref(), Some(&b""[..]));
        assert_eq!(out[1].value, None);
    }

    #[test]
    fn a_null_value_in_a_frame_not_flagged_for_them_is_refused() {
        let null = NewRecord {
            key: None,
            headers: Vec::new(),
            value: None,
        };
        let mut buf = Vec::new();
        let body = encode_batch(&[null], None, &mut buf).unwrap();
        buf[34..36].copy_from_slice(&0u16.to_le_bytes());
        let body_crc = crc32c::crc32c(&buf[HEADER_LEN..]);
        assert_eq!(body_crc, body, "the flag sits outside the body");
        seal(&mut buf, body_crc, 0, 0);
        let h = parse_header(&buf).unwrap();
        check_crc(&h, &buf).unwrap();
        assert_eq!(
            decode_batch(&h, &Bytes::from(buf)),
            Err(FrameError::Malformed("unknown record attribute bits"))
        );
    }

    proptest! {
        #[test]
        fn any_single_bit_flip_is_detected(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..6),
            flip in any::<proptest::sample::Index>(),
            bit in 0u8..8,
        ) {
            let records: Vec<_> = values.iter().map(|v| rec(None, v, &[])).collect();
            let mut buf = Vec::new();
            let body = encode_batch(&records, None, &mut buf).unwrap();
            seal(&mut buf, body, 3, 4);
            let at = flip.index(buf.len());
            buf[at] ^= 1 << bit;
            let ok = parse_header(&buf).and_then(|h| {
                if h.frame_len as usize != buf.len() {
                    return Err(FrameError::BadHeader("length"));
                }
                check_crc(&h, &buf)
            });
            prop_assert!(ok.is_err(), "flip at {} bit {} went unnoticed", at, bit);
        }

        #[test]
        fn any_batch_round_trips(
            recs in proptest::collection::vec(
                (proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
                 proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
                 proptest::collection::vec(("[a-z]{0,8}", proptest::collection::vec(any::<u8>(), 0..10)), 0..3)),
                1..20),
        ) {
            let records: Vec<NewRecord> = recs.iter().map(|(k, v, hs)| NewRecord {
                key: k.as_ref().map(|k| Bytes::copy_from_slice(k)),
                headers: hs.iter().map(|(n, v)| Header { name: n.clone(), value: Bytes::copy_from_slice(v) }).collect(),
                value: v.as_ref().map(|v| Bytes::copy_from_slice(v)),
            }).collect();
            let out = roundtrip(&records, None);
            prop_assert_eq!(out.len(), records.len());
            for (r, o) in records.iter().zip(&out) {
                prop_assert_eq!(&o.key, &r.key);
                prop_assert_eq!(&o.headers, &r.headers);
                prop_assert_eq!(&o.value, &r.value);
            }
        }
    }
}
