//! Host-side encoder of the input buffer (see [`crate::layout`]).
//!
//! Two steps so the host can write straight into guest memory: [`SlabEncoder::layout`]
//! measures the records (one pass over their lengths), the host asks the guest for a buffer of
//! [`SlabLayout::total_len`] bytes, then [`SlabEncoder::write`] fills it in one pass. Every
//! byte of the buffer is written (padding included), so stale guest memory never leaks into
//! the input. The arena holds all keys first, then all headers regions, then all values, so a
//! keys-only plugin reads one dense run of keys. For a plugin that asks for key hashes, the
//! write pass also computes Kafka's murmur2 of each key natively (the key is in cache at that
//! moment) and stores it in the key-hashes region between the table and the arena.

use alloc::vec;
use alloc::vec::Vec;

use crate::context::RouteContextRef;
use crate::error::EncodeError;
use crate::layout::{
    ENTRY_LEN_BYTES, KEY_HASH_LEN_BYTES, KEY_HASH_PRESENT, MAGIC, NO_KEY, Needs, align_table,
    entry, header, header_len,
};
use crate::partitioner::murmur2_inlined;

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
    /// Where the key hashes start; 0 when they are not given.
    key_hashes_offset: u32,
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
        let records = records.into_iter();
        let needs = self.needs;
        if !needs.keys() && !needs.headers() && !needs.values() {
            // Nothing variable-length to measure (key hashes alone): only the count, which a
            // slice's iterator knows without visiting a record. An iterator that lies about
            // its length is caught by `write`, which checks the records against the layout.
            count = match records.size_hint() {
                (low, Some(high)) if low == high => low as u64,
                _ => records.count() as u64,
            };
        } else {
            for r in records {
                count += 1;
                if needs.keys() {
                    keys += r.key().map_or(0, |k| k.len() as u64);
                }
                if needs.headers() {
                    headers += headers_region_len(&r);
                }
                if needs.values() {
                    values += r.value().len() as u64;
                }
            }
        }
        let to_u32 = |v: u64| u32::try_from(v).map_err(|_| EncodeError::TooLarge);
        let context_end = header_len(self.needs) + self.context.len();
        let table_offset = align_table(context_end).ok_or(EncodeError::TooLarge)? as u64;
        let entry_len = if needs.table() { ENTRY_LEN_BYTES } else { 0 };
        let table_end = table_offset + count * entry_len as u64;
        let (key_hashes_offset, arena_offset) = if self.needs.key_hash() {
            (table_end, table_end + count * KEY_HASH_LEN_BYTES as u64)
        } else {
            (0, table_end)
        };
        let total = arena_offset + keys + headers + values;
        Ok(SlabLayout {
            record_count: to_u32(count)?,
            table_offset: to_u32(table_offset)?,
            key_hashes_offset: to_u32(key_hashes_offset)?,
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
        let head_len = header_len(self.needs);
        let head: [u32; 7] = [
            layout.record_count,
            head_len as u32,
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
        let (table_and_hashes, arena) = rest
            .split_at_mut_checked(arena_offset - table_offset)
            .ok_or(EncodeError::LayoutMismatch)?;
        let entries_expected = if self.needs.table() {
            layout.record_count()
        } else {
            0
        };
        let table_len = entries_expected * ENTRY_LEN_BYTES;
        let (table, hashes) = table_and_hashes
            .split_at_mut_checked(table_len)
            .ok_or(EncodeError::LayoutMismatch)?;

        // Header, context, zero padding up to the table.
        prefix.fill(0);
        prefix[..4].copy_from_slice(&MAGIC);
        for (i, v) in head.iter().enumerate() {
            let at = header::RECORD_COUNT + 4 * i;
            prefix[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        if self.needs.key_hash() {
            prefix
                .get_mut(header::KEY_HASHES_OFFSET..header::KEY_HASHES_OFFSET + 4)
                .ok_or(EncodeError::LayoutMismatch)?
                .copy_from_slice(&layout.key_hashes_offset.to_le_bytes());
        }
        prefix
            .get_mut(head_len..head_len + self.context.len())
            .ok_or(EncodeError::LayoutMismatch)?
            .copy_from_slice(&self.context);

        let (entries, rest) = table.as_chunks_mut::<ENTRY_LEN_BYTES>();
        if !rest.is_empty() || entries.len() != entries_expected {
            return Err(EncodeError::LayoutMismatch);
        }
        // Empty unless key hashes are given; then one slot per record.
        let (hashes, rest) = hashes.as_chunks_mut::<KEY_HASH_LEN_BYTES>();
        let hashes_expected = if self.needs.key_hash() {
            layout.record_count()
        } else {
            0
        };
        if !rest.is_empty() || hashes.len() != hashes_expected {
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
        if !self.needs.table() {
            write_hashes_only(hashes, &mut records)?;
            if records.next().is_some() {
                return Err(EncodeError::LayoutMismatch);
            }
            return Ok(total);
        }
        let table = Table { entries, hashes };
        // One loop per field set, so the keys-only loop (the usual one) carries no branch or
        // code for headers, values or hashes.
        macro_rules! write_as {
            ($($keys:literal $hash:literal $headers:literal $values:literal),* $(,)?) => {
                match (
                    self.needs.keys(),
                    self.needs.key_hash(),
                    self.needs.headers(),
                    self.needs.values(),
                ) {
                    $(($keys, $hash, $headers, $values) => write_entries::<
                        _, $keys, $hash, $headers, $values,
                    >(table, &mut records, &mut parts)?,)*
                    // Every `Needs` has the key bytes or the key hashes (see its doc).
                    (false, false, _, _) => return Err(EncodeError::LayoutMismatch),
                }
            };
        }
        write_as!(
            true false false false, true false true false, true false false true,
            true false true true, true true false false, true true true false,
            true true false true, true true true true, false true false false,
            false true true false, false true false true, false true true true,
        );
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

/// The record table and, when key hashes are given, their region (else empty).
struct Table<'b> {
    entries: &'b mut [[u8; ENTRY_LEN_BYTES]],
    hashes: &'b mut [[u8; KEY_HASH_LEN_BYTES]],
}

/// Fills the record table (the key hashes when `HASH`, and the arena through `parts`) from
/// `records`, copying key bytes, headers and values only when `KEYS`, `HEADERS` and `VALUES`
/// say so.
#[inline(always)]
fn write_entries<I, const KEYS: bool, const HASH: bool, const HEADERS: bool, const VALUES: bool>(
    table: Table<'_>,
    records: &mut I,
    parts: &mut Parts<'_>,
) -> Result<(), EncodeError>
where
    I: Iterator,
    I::Item: SlabRecord,
{
    let mut hashes = table.hashes.iter_mut();
    for e in table.entries.iter_mut() {
        let r = records.next().ok_or(EncodeError::LayoutMismatch)?;
        // The entry is built on the stack and stored with one 40-byte copy: cheaper than
        // eight bounds-checked stores into the table (this loop runs once per record).
        let mut buf = [0u8; ENTRY_LEN_BYTES];
        put_u64(&mut buf, entry::PARENT_OFFSET, r.parent_offset());
        put_u64(&mut buf, entry::COMMITTED_AT_MS, r.committed_at_ms() as u64);
        let mut hash_entry = 0u64;
        match r.key() {
            Some(k) => {
                if KEYS {
                    let at = parts.keys.put(k)?;
                    put_u32(&mut buf, entry::KEY_OFFSET, at);
                    // Fits: it was copied into an arena of at most u32::MAX bytes.
                    put_u32(&mut buf, entry::KEY_LEN, k.len() as u32);
                } else {
                    // Not copied, so nothing has bounded it yet: a length of NO_KEY or more
                    // cannot be told from "no key".
                    let len = u32::try_from(k.len())
                        .ok()
                        .filter(|&l| l != NO_KEY)
                        .ok_or(EncodeError::TooLarge)?;
                    put_u32(&mut buf, entry::KEY_LEN, len);
                }
                if HASH {
                    hash_entry = KEY_HASH_PRESENT | u64::from(murmur2_inlined(k) as u32);
                }
            }
            None => put_u32(&mut buf, entry::KEY_LEN, NO_KEY),
        }
        if HASH {
            let slot = hashes.next().ok_or(EncodeError::LayoutMismatch)?;
            *slot = hash_entry.to_le_bytes();
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

/// Fills the key hash region of a buffer without a record table (`key_hash_only`): one entry
/// per record of `records`, the only bytes a record gets.
fn write_hashes_only<I>(
    hashes: &mut [[u8; KEY_HASH_LEN_BYTES]],
    records: &mut I,
) -> Result<(), EncodeError>
where
    I: Iterator,
    I::Item: SlabRecord,
{
    for slot in hashes.iter_mut() {
        let r = records.next().ok_or(EncodeError::LayoutMismatch)?;
        // Spelled out here rather than through a helper shared with the table encoder: with
        // the helper (even `#[inline(always)]`) this loop measured 5.8 ns a record instead of
        // 4.7 (`breakdown/encode_input`), and the Wasm chain 7.8 instead of 6.7.
        let entry = r.key().map_or(0, |k| {
            KEY_HASH_PRESENT | u64::from(murmur2_inlined(k) as u32)
        });
        *slot = entry.to_le_bytes();
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
