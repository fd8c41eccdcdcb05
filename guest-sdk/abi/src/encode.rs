//! Host-side encoder of the input buffer (see [`crate::layout`]).
//!
//! Two steps so the host can write straight into guest memory: [`SlabEncoder::layout`]
//! measures the records (one pass over their lengths), the host asks the guest for a buffer of
//! [`SlabLayout::total_len`] bytes, then [`SlabEncoder::write`] fills it in one pass. Every
//! byte of the buffer is written (padding included), so stale guest memory never leaks into
//! the input. The arena holds all keys first, then all headers regions, then all values, so a
//! keys-only plugin reads one dense run of keys.

use alloc::vec;
use alloc::vec::Vec;

use crate::context::RouteContextRef;
use crate::error::EncodeError;
use crate::layout::{
    ENTRY_LEN_BYTES, HEADER_LEN_BYTES, MAGIC, NO_KEY, Needs, align_table, entry, header,
};

/// What the encoder reads of one record. Implement it for the host's own record type.
pub trait SlabRecord {
    /// The record's offset in its parent partition.
    fn parent_offset(&self) -> u64;
    /// When the record was committed to the parent, in ms since the Unix epoch.
    fn committed_at_ms(&self) -> i64;
    /// The key; `None` for a record without one (which differs from an empty key).
    fn key(&self) -> Option<&[u8]>;
    /// The headers as `(name, value)` pairs, in order; names must be UTF-8. Called twice per
    /// encode (measure, then write) and must yield the same pairs both times.
    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])>;
    /// The value bytes.
    fn value(&self) -> &[u8];
}

impl<T: SlabRecord + ?Sized> SlabRecord for &T {
    fn parent_offset(&self) -> u64 {
        (**self).parent_offset()
    }
    fn committed_at_ms(&self) -> i64 {
        (**self).committed_at_ms()
    }
    fn key(&self) -> Option<&[u8]> {
        (**self).key()
    }
    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        (**self).headers()
    }
    fn value(&self) -> &[u8] {
        (**self).value()
    }
}

/// A plain borrowed record, for tests and for hosts that have nothing better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordInput<'a> {
    /// The record's offset in its parent partition.
    pub parent_offset: u64,
    /// Commit time in ms since the Unix epoch.
    pub committed_at_ms: i64,
    /// The key, `None` for none.
    pub key: Option<&'a [u8]>,
    /// `(name, value)` header pairs.
    pub headers: &'a [(&'a [u8], &'a [u8])],
    /// The value.
    pub value: &'a [u8],
}

impl SlabRecord for RecordInput<'_> {
    fn parent_offset(&self) -> u64 {
        self.parent_offset
    }
    fn committed_at_ms(&self) -> i64 {
        self.committed_at_ms
    }
    fn key(&self) -> Option<&[u8]> {
        self.key
    }
    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers.iter().map(|(n, v)| (*n, *v))
    }
    fn value(&self) -> &[u8] {
        self.value
    }
}

/// Sizes and offsets of one input buffer, computed by [`SlabEncoder::layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabLayout {
    record_count: u32,
    table_offset: u32,
    arena_offset: u32,
    keys_len: u32,
    headers_len: u32,
    values_len: u32,
    total_len: u32,
}

impl SlabLayout {
    /// Bytes of the whole buffer: what to ask `narad_alloc` for and pass as `input_len`.
    pub fn total_len(&self) -> usize {
        self.total_len as usize
    }

    /// Number of records (and of `u32` output slots).
    pub fn record_count(&self) -> usize {
        self.record_count as usize
    }
}

/// Writes input buffers for one route call: a route context and the fields a plugin needs.
#[derive(Clone, Debug)]
pub struct SlabEncoder {
    context: Vec<u8>,
    needs: Needs,
}

impl SlabEncoder {
    /// An encoder for `context`, copying in the fields `needs` asks for (keys always).
    pub fn new(context: RouteContextRef<'_>, needs: Needs) -> Result<Self, EncodeError> {
        let len = context.encoded_len().ok_or(EncodeError::TooLarge)?;
        let mut bytes = vec![0u8; len];
        let written = context
            .encode_into(&mut bytes)
            .ok_or(EncodeError::TooLarge)?;
        debug_assert_eq!(written, len);
        Ok(Self {
            context: bytes,
            needs,
        })
    }

    /// The fields this encoder copies in.
    pub fn needs(&self) -> Needs {
        self.needs
    }

    /// Measures `records`: the offsets and the total length of their buffer.
    pub fn layout<I>(&self, records: I) -> Result<SlabLayout, EncodeError>
    where
        I: IntoIterator,
        I::Item: SlabRecord,
    {
        let (mut count, mut keys, mut headers, mut values) = (0u64, 0u64, 0u64, 0u64);
        for r in records {
            count += 1;
            keys += r.key().map_or(0, |k| k.len() as u64);
            if self.needs.headers() {
                headers += headers_region_len(&r);
            }
            if self.needs.values() {
                values += r.value().len() as u64;
            }
        }
        let to_u32 = |v: u64| u32::try_from(v).map_err(|_| EncodeError::TooLarge);
        let context_end = HEADER_LEN_BYTES + self.context.len();
        let table_offset = align_table(context_end).ok_or(EncodeError::TooLarge)? as u64;
        let arena_offset = table_offset + count * ENTRY_LEN_BYTES as u64;
        let total = arena_offset + keys + headers + values;
        Ok(SlabLayout {
            record_count: to_u32(count)?,
            table_offset: to_u32(table_offset)?,
            arena_offset: to_u32(arena_offset)?,
            keys_len: to_u32(keys)?,
            headers_len: to_u32(headers)?,
            values_len: to_u32(values)?,
            total_len: to_u32(total)?,
        })
    }

    /// Writes the buffer of `records` (the same ones, in the same order, as measured into
    /// `layout`) at the start of `out`, returning its length.
    pub fn write<I>(
        &self,
        layout: &SlabLayout,
        records: I,
        out: &mut [u8],
    ) -> Result<usize, EncodeError>
    where
        I: IntoIterator,
        I::Item: SlabRecord,
    {
        let total = layout.total_len();
        let got = out.len();
        let out = out
            .get_mut(..total)
            .ok_or(EncodeError::BufferTooSmall { needed: total, got })?;
        let context_len = self.context.len() as u32; // fits: checked by `layout`
        let head: [u32; 7] = [
            layout.record_count,
            HEADER_LEN_BYTES as u32,
            context_len,
            layout.table_offset,
            layout.arena_offset,
            layout.keys_len + layout.headers_len + layout.values_len,
            self.needs.bits(),
        ];
        let table_offset = layout.table_offset as usize;
        let arena_offset = layout.arena_offset as usize;
        let (prefix, rest) = out
            .split_at_mut_checked(table_offset)
            .ok_or(EncodeError::LayoutMismatch)?;
        let (table, arena) = rest
            .split_at_mut_checked(arena_offset - table_offset)
            .ok_or(EncodeError::LayoutMismatch)?;

        // Header, context, zero padding up to the table.
        prefix.fill(0);
        prefix[..4].copy_from_slice(&MAGIC);
        for (i, v) in head.iter().enumerate() {
            let at = header::RECORD_COUNT + 4 * i;
            prefix[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        prefix
            .get_mut(HEADER_LEN_BYTES..HEADER_LEN_BYTES + self.context.len())
            .ok_or(EncodeError::LayoutMismatch)?
            .copy_from_slice(&self.context);

        let (entries, rest) = table.as_chunks_mut::<ENTRY_LEN_BYTES>();
        if !rest.is_empty() || entries.len() != layout.record_count() {
            return Err(EncodeError::LayoutMismatch);
        }
        // The arena's three parts; each record's bytes must fit in its own part.
        let (key_part, rest) = arena
            .split_at_mut_checked(layout.keys_len as usize)
            .ok_or(EncodeError::LayoutMismatch)?;
        let (hdr_part, val_part) = rest
            .split_at_mut_checked(layout.headers_len as usize)
            .ok_or(EncodeError::LayoutMismatch)?;
        let mut parts = Parts {
            keys: Cursor::new(key_part, 0),
            hdrs: Cursor::new(hdr_part, layout.keys_len),
            vals: Cursor::new(val_part, layout.keys_len + layout.headers_len),
        };
        let mut records = records.into_iter();
        // One loop per field set, so the keys-only loop (the usual one) carries no branch or
        // code for headers and values.
        match (self.needs.headers(), self.needs.values()) {
            (false, false) => write_entries::<_, false, false>(entries, &mut records, &mut parts)?,
            (true, false) => write_entries::<_, true, false>(entries, &mut records, &mut parts)?,
            (false, true) => write_entries::<_, false, true>(entries, &mut records, &mut parts)?,
            (true, true) => write_entries::<_, true, true>(entries, &mut records, &mut parts)?,
        }
        if records.next().is_some()
            || !parts.keys.full()
            || !parts.hdrs.full()
            || !parts.vals.full()
        {
            return Err(EncodeError::LayoutMismatch);
        }
        Ok(total)
    }

    /// Measures and writes `records` into a new vector (for tests and the CLI; the daemon
    /// writes into guest memory with [`Self::layout`] and [`Self::write`]).
    pub fn encode_to_vec<I>(&self, records: I) -> Result<Vec<u8>, EncodeError>
    where
        I: IntoIterator + Clone,
        I::Item: SlabRecord,
    {
        let layout = self.layout(records.clone())?;
        let mut out = vec![0u8; layout.total_len()];
        self.write(&layout, records, &mut out)?;
        Ok(out)
    }
}

/// Write positions in the arena's three parts.
struct Parts<'b> {
    keys: Cursor<'b>,
    hdrs: Cursor<'b>,
    vals: Cursor<'b>,
}

/// Fills the record table (and the arena through `parts`) from `records`, copying headers
/// and values only when `HEADERS` and `VALUES` say so.
#[inline(always)]
fn write_entries<I, const HEADERS: bool, const VALUES: bool>(
    entries: &mut [[u8; ENTRY_LEN_BYTES]],
    records: &mut I,
    parts: &mut Parts<'_>,
) -> Result<(), EncodeError>
where
    I: Iterator,
    I::Item: SlabRecord,
{
    for e in entries.iter_mut() {
        let r = records.next().ok_or(EncodeError::LayoutMismatch)?;
        // The entry is built on the stack and stored with one 40-byte copy: cheaper than
        // eight bounds-checked stores into the table (this loop runs once per record).
        let mut buf = [0u8; ENTRY_LEN_BYTES];
        put_u64(&mut buf, entry::PARENT_OFFSET, r.parent_offset());
        put_u64(&mut buf, entry::COMMITTED_AT_MS, r.committed_at_ms() as u64);
        match r.key() {
            Some(k) => {
                let at = parts.keys.put(k)?;
                put_u32(&mut buf, entry::KEY_OFFSET, at);
                put_u32(&mut buf, entry::KEY_LEN, k.len() as u32); // fits: it was copied
            }
            None => put_u32(&mut buf, entry::KEY_LEN, NO_KEY),
        }
        if HEADERS {
            let hdrs = &mut parts.hdrs;
            let start = hdrs.offset();
            let n = u32::try_from(r.headers().count()).map_err(|_| EncodeError::TooLarge)?;
            hdrs.put(&n.to_le_bytes())?;
            for (name, value) in r.headers() {
                hdrs.put(&len_u32(name)?.to_le_bytes())?;
                hdrs.put(name)?;
                hdrs.put(&len_u32(value)?.to_le_bytes())?;
                hdrs.put(value)?;
            }
            put_u32(&mut buf, entry::HEADERS_OFFSET, start);
            put_u32(&mut buf, entry::HEADERS_LEN, hdrs.offset() - start);
        }
        if VALUES {
            let v = r.value();
            let at = parts.vals.put(v)?;
            put_u32(&mut buf, entry::VALUE_OFFSET, at);
            put_u32(&mut buf, entry::VALUE_LEN, v.len() as u32); // fits: it was copied
        }
        *e = buf;
    }
    Ok(())
}

fn len_u32(b: &[u8]) -> Result<u32, EncodeError> {
    u32::try_from(b.len()).map_err(|_| EncodeError::TooLarge)
}

/// Bytes of one record's headers region: `u32 count` then `u32 len + bytes` per name and value.
fn headers_region_len<R: SlabRecord>(r: &R) -> u64 {
    4 + r
        .headers()
        .map(|(n, v)| 8 + n.len() as u64 + v.len() as u64)
        .sum::<u64>()
}

#[inline(always)]
fn put_u32(buf: &mut [u8; ENTRY_LEN_BYTES], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline(always)]
fn put_u64(buf: &mut [u8; ENTRY_LEN_BYTES], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// `dst.copy_from_slice(src)` (same lengths). A key of 8 to 16 bytes (the usual size: ids,
/// UUIDs) is moved with two overlapping 8-byte copies, which compile to plain loads and stores;
/// through `memcpy` the call would cost more than the copy.
#[inline(always)]
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if (8..=16).contains(&n) && dst.len() == n {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..].copy_from_slice(&src[n - 8..]);
    } else {
        dst.copy_from_slice(src);
    }
}

/// A write position inside one part of the arena (keys, headers or values).
struct Cursor<'b> {
    part: &'b mut [u8],
    pos: usize,
    /// Arena offset of the part's first byte (< 2^32: checked by `layout`).
    base: u32,
}

impl<'b> Cursor<'b> {
    fn new(part: &'b mut [u8], base: u32) -> Self {
        Self { part, pos: 0, base }
    }

    /// Arena offset of the next byte written.
    fn offset(&self) -> u32 {
        // The part lies inside the arena, whose length fits in u32 (checked by `layout`).
        self.base + self.pos as u32
    }

    /// Copies `bytes` at the cursor, returning their arena offset; an error when they run
    /// past the part (the records differ from the ones measured).
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) -> Result<u32, EncodeError> {
        let at = self.offset();
        // No overflow: `pos` is at most the part's length and both are slice lengths.
        let end = self.pos + bytes.len();
        let dst = self
            .part
            .get_mut(self.pos..end)
            .ok_or(EncodeError::LayoutMismatch)?;
        copy_bytes(dst, bytes);
        self.pos = end;
        Ok(at)
    }

    fn full(&self) -> bool {
        self.pos == self.part.len()
    }
}
