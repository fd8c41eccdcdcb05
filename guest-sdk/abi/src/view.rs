//! Guest-side zero-copy reader of the input buffer (see [`crate::layout`]).
//!
//! [`SlabView::parse`] checks the header once (magic, fields word, and that the context,
//! table, key hashes and arena lie inside the buffer); per-record accessors then check each
//! key, headers or value range against the arena as they are read. Nothing here panics or
//! reads out of bounds, whatever the bytes: hostile input gives a [`LayoutError`].

use crate::context::RouteContextRef;
use crate::error::{Field, LayoutError, Region};
use crate::layout::{
    ENTRY_LEN_BYTES, HEADER_LEN_BYTES, KEY_HASH_HEADER_LEN_BYTES, KEY_HASH_LEN_BYTES,
    KEY_HASH_PRESENT, MAGIC, NO_KEY, Needs, entry, header,
};
use crate::partitioner::murmur2;

/// Reads the little-endian `u32` at `at` of a fixed-size array (bounds known at compile time
/// for constant `at`, so no run-time check survives optimisation). Copied out as one 4-byte
/// block, which compiles to one Wasm `i32.load`; assembling four bytes by hand sometimes stays
/// four byte loads, shifts and ors.
#[inline(always)]
fn le_u32<const N: usize>(b: &[u8; N], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(bytes)
}

#[inline(always)]
fn le_u64<const N: usize>(b: &[u8; N], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// A parsed input buffer: the route context bytes, the record table, the key hashes (when
/// given) and the arena.
#[derive(Clone, Copy, Debug)]
pub struct SlabView<'a> {
    context: &'a [u8],
    /// Number of records (the table's length, or the hashes' without a table).
    count: usize,
    /// One entry per record, or empty for a buffer without a table (`key_hash_only`).
    table: &'a [[u8; ENTRY_LEN_BYTES]],
    /// One entry per record when `needs` has the key hashes, else empty.
    hashes: &'a [[u8; KEY_HASH_LEN_BYTES]],
    arena: &'a [u8],
    needs: Needs,
}

impl<'a> SlabView<'a> {
    /// Checks the header of `buf` and the bounds of the regions it points at.
    pub fn parse(buf: &'a [u8]) -> Result<Self, LayoutError> {
        let head: &[u8; HEADER_LEN_BYTES] = buf
            .first_chunk()
            .ok_or(LayoutError::TooShort { len: buf.len() })?;
        let magic = [head[0], head[1], head[2], head[3]];
        if magic != MAGIC {
            return Err(LayoutError::BadMagic { found: magic });
        }
        let bits = le_u32(head, header::FIELDS);
        let needs = Needs::from_bits(bits).ok_or(LayoutError::BadFields { bits })?;
        let count = le_u32(head, header::RECORD_COUNT);
        let context = region(
            buf,
            Region::Context,
            le_u32(head, header::CONTEXT_OFFSET),
            u64::from(le_u32(head, header::CONTEXT_LEN)),
        )?;
        let entry_len = if needs.table() { ENTRY_LEN_BYTES } else { 0 };
        let table_len = u64::from(count) * entry_len as u64;
        let table = region(
            buf,
            Region::Table,
            le_u32(head, header::TABLE_OFFSET),
            table_len,
        )?;
        let arena = region(
            buf,
            Region::Arena,
            le_u32(head, header::ARENA_OFFSET),
            u64::from(le_u32(head, header::ARENA_LEN)),
        )?;
        let hashes: &[u8] = if needs.key_hash() {
            let head: &[u8; KEY_HASH_HEADER_LEN_BYTES] = buf
                .first_chunk()
                .ok_or(LayoutError::TooShort { len: buf.len() })?;
            region(
                buf,
                Region::KeyHashes,
                le_u32(head, header::KEY_HASHES_OFFSET),
                u64::from(count) * KEY_HASH_LEN_BYTES as u64,
            )?
        } else {
            &[]
        };
        let (table, rest) = table.as_chunks::<ENTRY_LEN_BYTES>();
        debug_assert!(
            rest.is_empty(),
            "table length is a multiple of the entry size"
        );
        let (hashes, rest) = hashes.as_chunks::<KEY_HASH_LEN_BYTES>();
        debug_assert!(rest.is_empty(), "one entry per record");
        Ok(Self {
            context,
            // Fits: `count` entries of at least 8 bytes lie inside the buffer.
            count: count as usize,
            table,
            hashes,
            arena,
            needs,
        })
    }

    /// Number of records in the slab (and of output slots).
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the slab holds no record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Which record fields the host copied in.
    pub fn needs(&self) -> Needs {
        self.needs
    }

    /// The raw postcard-encoded route context.
    pub fn context_bytes(&self) -> &'a [u8] {
        self.context
    }

    /// The decoded route context, borrowing its strings and config from the buffer.
    pub fn context(&self) -> Result<RouteContextRef<'a>, LayoutError> {
        Ok(RouteContextRef::decode(self.context)?)
    }

    /// Record `index`; [`LayoutError::NoRecordTable`] for a slab of key hashes alone (see
    /// [`Self::records`]).
    pub fn record(&self, index: usize) -> Result<RecordView<'a>, LayoutError> {
        if !self.needs.table() {
            return Err(LayoutError::NoRecordTable);
        }
        let entry = self.table.get(index).ok_or(LayoutError::RecordOutOfRange {
            index,
            count: self.count,
        })?;
        Ok(RecordView {
            entry,
            arena: self.arena,
            needs: self.needs,
            index,
            host_key_hash: self.hashes.get(index).map_or(0, |h| u64::from_le_bytes(*h)),
        })
    }

    /// The key hashes of the records in slab order (`None` for a keyless record), when the
    /// host handed them in (the manifest asks for `key_hash`); `None` otherwise, and then
    /// [`RecordView::key_hash`] computes each one from the key bytes.
    ///
    /// The fastest way through a slab for a router that only needs the hashes: it reads the
    /// dense key-hash region alone (8 bytes a record, not the 40-byte table entries), and
    /// zipped with the output slots it compiles to one indexed loop.
    #[inline]
    pub fn key_hashes(&self) -> Option<impl ExactSizeIterator<Item = Option<u32>> + 'a> {
        if !self.needs.key_hash() {
            return None;
        }
        Some(self.hashes.iter().map(|entry| {
            let entry = u64::from_le_bytes(*entry);
            (entry & KEY_HASH_PRESENT != 0).then_some(entry as u32)
        }))
    }

    /// The records in slab order.
    ///
    /// A plugin whose manifest asks for `key_hash_only` gets no record table, so for it this
    /// yields nothing: it reads [`Self::key_hashes`] and writes the output slots in the same
    /// order (zipped with `Decisions::slots_mut`), one per record of [`Self::len`].
    pub fn records(&self) -> Records<'a> {
        Records {
            entries: self.table.iter().enumerate(),
            hashes: self.hashes.iter(),
            arena: self.arena,
            needs: self.needs,
        }
    }
}

/// The sub-slice `offset..offset + len` of `buf`, or the error naming `region`.
fn region(buf: &[u8], region: Region, offset: u32, len: u64) -> Result<&[u8], LayoutError> {
    let start = u64::from(offset);
    let end = start + len; // both below 2^33: cannot overflow u64
    let out_of_bounds = LayoutError::RegionOutOfBounds {
        region,
        offset: start,
        len,
        buffer_len: buf.len(),
    };
    if end > buf.len() as u64 {
        return Err(out_of_bounds);
    }
    // Both fit in usize now: they are at most buf.len().
    buf.get(start as usize..end as usize).ok_or(out_of_bounds)
}

/// Iterator over a slab's records in order.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    entries: core::iter::Enumerate<core::slice::Iter<'a, [u8; ENTRY_LEN_BYTES]>>,
    /// As long as `entries` when the key hashes are given, else empty.
    hashes: core::slice::Iter<'a, [u8; KEY_HASH_LEN_BYTES]>,
    arena: &'a [u8],
    needs: Needs,
}

impl<'a> Iterator for Records<'a> {
    type Item = RecordView<'a>;

    #[inline]
    fn next(&mut self) -> Option<RecordView<'a>> {
        let (index, entry) = self.entries.next()?;
        let host_key_hash = self.hashes.next().map_or(0, |h| u64::from_le_bytes(*h));
        Some(RecordView {
            entry,
            arena: self.arena,
            needs: self.needs,
            index,
            host_key_hash,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.entries.size_hint()
    }
}

impl ExactSizeIterator for Records<'_> {}

/// One record of the slab, read in place.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    entry: &'a [u8; ENTRY_LEN_BYTES],
    arena: &'a [u8],
    needs: Needs,
    index: usize,
    /// The host's key hash entry; meaningful only when `needs` has the key hashes.
    host_key_hash: u64,
}

impl<'a> RecordView<'a> {
    /// Position of the record in the slab; its decision goes in output slot `index()`.
    #[inline]
    pub fn index(&self) -> usize {
        self.index
    }

    /// The record's offset in its parent partition.
    #[inline]
    pub fn parent_offset(&self) -> u64 {
        le_u64(self.entry, entry::PARENT_OFFSET)
    }

    /// When the record was committed to the parent, in milliseconds since the Unix epoch.
    #[inline]
    pub fn committed_at_ms(&self) -> i64 {
        le_u64(self.entry, entry::COMMITTED_AT_MS) as i64
    }

    /// Whether the record has a key (an empty key is a key).
    #[inline]
    pub fn has_key(&self) -> bool {
        le_u32(self.entry, entry::KEY_LEN) != NO_KEY
    }

    /// The key: `None` when the record has none, `Some(b"")` for an empty key.
    /// [`LayoutError::NotRequested`] for a keyed record when the manifest asked for key hashes
    /// alone (`needs = [key_hash]`), so the host did not copy key bytes in.
    #[inline]
    pub fn key(&self) -> Result<Option<&'a [u8]>, LayoutError> {
        let len = le_u32(self.entry, entry::KEY_LEN);
        if len == NO_KEY {
            return Ok(None);
        }
        if !self.needs.keys() {
            return Err(LayoutError::NotRequested { field: Field::Key });
        }
        self.arena_bytes(le_u32(self.entry, entry::KEY_OFFSET), len, Field::Key)
            .map(Some)
    }

    /// Kafka's murmur2 hash of the key as a `u32` (the bits of [`crate::murmur2`]), or `None`
    /// for a record without a key; an empty key is a key and has a hash.
    ///
    /// When the manifest asks for `key_hash`, this is the hash the host computed natively and
    /// wrote next to the record table: a load, no hashing in the plugin. Otherwise it is
    /// computed here from the key bytes, with the same result, so a plugin routes the same
    /// with or without the need. `(hash & 0x7fff_ffff) % partitions`, which
    /// [`crate::partition_for_hash`] computes, is the partition Kafka's default partitioner
    /// gives the key.
    #[inline]
    pub fn key_hash(&self) -> Result<Option<u32>, LayoutError> {
        if !self.has_key() {
            return Ok(None);
        }
        if self.needs.key_hash() {
            return Ok(Some(self.host_key_hash as u32));
        }
        Ok(self.key()?.map(|key| murmur2(key) as u32))
    }

    /// The record's headers; [`LayoutError::NotRequested`] unless the manifest asked for them.
    pub fn headers(&self) -> Result<Headers<'a>, LayoutError> {
        if !self.needs.headers() {
            return Err(LayoutError::NotRequested {
                field: Field::Headers,
            });
        }
        let region = self.arena_bytes(
            le_u32(self.entry, entry::HEADERS_OFFSET),
            le_u32(self.entry, entry::HEADERS_LEN),
            Field::Headers,
        )?;
        let malformed = LayoutError::MalformedHeaders { record: self.index };
        let (count, rest) = region.split_first_chunk::<4>().ok_or(malformed)?;
        Ok(Headers {
            bytes: rest,
            remaining: u32::from_le_bytes(*count),
            record: self.index,
            failed: false,
        })
    }

    /// The value of the first header called `name`, or `None` when there is none.
    pub fn header(&self, name: &str) -> Result<Option<&'a [u8]>, LayoutError> {
        for h in self.headers()? {
            let h = h?;
            if h.name == name {
                return Ok(Some(h.value));
            }
        }
        Ok(None)
    }

    /// The value; [`LayoutError::NotRequested`] unless the manifest asked for values.
    pub fn value(&self) -> Result<&'a [u8], LayoutError> {
        if !self.needs.values() {
            return Err(LayoutError::NotRequested {
                field: Field::Value,
            });
        }
        self.arena_bytes(
            le_u32(self.entry, entry::VALUE_OFFSET),
            le_u32(self.entry, entry::VALUE_LEN),
            Field::Value,
        )
    }

    #[inline]
    fn arena_bytes(&self, offset: u32, len: u32, field: Field) -> Result<&'a [u8], LayoutError> {
        let start = offset as usize;
        start
            .checked_add(len as usize)
            .and_then(|end| self.arena.get(start..end))
            .ok_or(LayoutError::FieldOutOfBounds {
                record: self.index,
                field,
            })
    }
}

/// One record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    /// The header name (UTF-8).
    pub name: &'a str,
    /// The header value bytes.
    pub value: &'a [u8],
}

/// Iterator over one record's headers, in the order they were produced. Yields an error (and
/// then stops) when the region is malformed.
#[derive(Clone, Debug)]
pub struct Headers<'a> {
    bytes: &'a [u8],
    remaining: u32,
    record: usize,
    failed: bool,
}

impl<'a> Headers<'a> {
    /// The header count the region declares.
    pub fn declared_len(&self) -> u32 {
        self.remaining
    }

    fn take(&mut self) -> Option<&'a [u8]> {
        let (len, rest) = self.bytes.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return None;
        }
        let (item, rest) = rest.split_at(len);
        self.bytes = rest;
        Some(item)
    }

    fn next_header(&mut self) -> Result<Header<'a>, LayoutError> {
        let malformed = LayoutError::MalformedHeaders {
            record: self.record,
        };
        let name = self.take().ok_or(malformed)?;
        let value = self.take().ok_or(malformed)?;
        let name = core::str::from_utf8(name).map_err(|_| LayoutError::HeaderNameNotUtf8 {
            record: self.record,
        })?;
        Ok(Header { name, value })
    }
}

impl<'a> Iterator for Headers<'a> {
    type Item = Result<Header<'a>, LayoutError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.remaining == 0 {
            if self.bytes.is_empty() {
                return None;
            }
            self.failed = true;
            return Some(Err(LayoutError::MalformedHeaders {
                record: self.record,
            }));
        }
        self.remaining -= 1;
        let item = self.next_header();
        self.failed = item.is_err();
        Some(item)
    }
}
