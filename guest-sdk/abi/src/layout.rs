//! Byte layout of the `narad_route` input buffer (all integers little-endian).
//!
//! ```text
//! offset  size  field
//! 0       4     magic = b"NRS1"
//! 4       4     record_count (u32)                 n
//! 8       4     context_offset (u32, from buffer start)
//! 12      4     context_len (u32)
//! 16      4     table_offset (u32)                 n entries of 40 bytes, 8-aligned
//! 20      4     arena_offset (u32)                 key/header/value bytes
//! 24      4     arena_len (u32)
//! 28      4     fields (u32 bit set)               bit0 key bytes, bit1 headers, bit2 values,
//!                                                  bit3 key hashes (bit0 or bit3 always set),
//!                                                  bit4 key hashes only (with bit3 alone)
//! 32      4     key_hashes_offset (u32)            only when fields bit3 is set: n u64 entries
//! ```
//!
//! With fields bit 4 (manifest need `key_hash_only`) the buffer has no record table and an
//! empty arena: `table_offset` equals `key_hashes_offset`, `arena_offset` is the end of the
//! hashes and `arena_len` is 0. It carries the record count, the context and one key hash
//! entry per record, nothing else: the host writes 8 bytes a record instead of 48.
//!
//! Record table entry `i` at `table_offset + 40 * i`:
//!
//! ```text
//! 0   8  parent_offset (u64)
//! 8   8  committed_at_ms (i64)
//! 16  4  key_offset (u32, relative to arena_offset) 0 unless key bytes were asked for
//! 20  4  key_len (u32; NO_KEY = absent, 0 = empty key; given whether or not the bytes are)
//! 24  4  headers_offset (u32, relative to arena)   0 unless headers were asked for
//! 28  4  headers_len (u32)
//! 32  4  value_offset (u32, relative to arena)     0 unless values were asked for
//! 36  4  value_len (u32)
//! ```
//!
//! Key hash entry `i` at `key_hashes_offset + 8 * i` (when fields bit 3 is set), a `u64`:
//! bits 0..32 Kafka's murmur2 of record `i`'s key (`murmur2(key) as u32`, computed by the
//! host), bit 32 set when the record has a key ([`KEY_HASH_PRESENT`]), the other bits 0; a
//! record without a key has entry 0. The region is 8-aligned (it follows the table) and a
//! reader of hashes alone needs nothing else per record.
//!
//! Headers region of one record: `u32 count`, then per header `u32 name_len, name bytes,
//! u32 value_len, value bytes`.

/// First four bytes of every input buffer ("Narad Route Slab", layout 1).
pub const MAGIC: [u8; 4] = *b"NRS1";
/// Size in bytes of the fixed buffer header (without the key-hash word; see [`header_len`]).
pub const HEADER_LEN_BYTES: usize = 32;
/// Size in bytes of the header when key hashes are given: the fixed header and the
/// `key_hashes_offset` word.
pub const KEY_HASH_HEADER_LEN_BYTES: usize = 36;
/// Size in bytes of one key hash entry (a little-endian `u64`: the hash and a presence bit).
pub const KEY_HASH_LEN_BYTES: usize = 8;
/// The bit of a key hash entry that says the record has a key (bit 32, just above the hash).
pub const KEY_HASH_PRESENT: u64 = 1 << 32;
/// Size in bytes of one record table entry.
pub const ENTRY_LEN_BYTES: usize = 40;
/// Alignment in bytes of the record table relative to the buffer start (its `u64` fields).
pub const TABLE_ALIGN_BYTES: usize = 8;
/// `key_len` value meaning the record has no key (an empty key has length 0).
pub const NO_KEY: u32 = u32::MAX;

/// Header field offsets.
pub mod header {
    /// `magic` (4 bytes).
    pub const MAGIC: usize = 0;
    /// `record_count` (u32).
    pub const RECORD_COUNT: usize = 4;
    /// `context_offset` (u32).
    pub const CONTEXT_OFFSET: usize = 8;
    /// `context_len` (u32).
    pub const CONTEXT_LEN: usize = 12;
    /// `table_offset` (u32).
    pub const TABLE_OFFSET: usize = 16;
    /// `arena_offset` (u32).
    pub const ARENA_OFFSET: usize = 20;
    /// `arena_len` (u32).
    pub const ARENA_LEN: usize = 24;
    /// `fields` (u32 bit set of [`crate::Needs`]).
    pub const FIELDS: usize = 28;
    /// `key_hashes_offset` (u32); present only when `fields` has [`crate::Needs::KEY_HASH_BIT`].
    pub const KEY_HASHES_OFFSET: usize = 32;
}

/// Bytes of the header of a buffer carrying `needs`: [`KEY_HASH_HEADER_LEN_BYTES`] when it
/// holds key hashes, else [`HEADER_LEN_BYTES`].
pub const fn header_len(needs: Needs) -> usize {
    if needs.key_hash() {
        KEY_HASH_HEADER_LEN_BYTES
    } else {
        HEADER_LEN_BYTES
    }
}

/// Record table entry field offsets.
pub mod entry {
    /// `parent_offset` (u64).
    pub const PARENT_OFFSET: usize = 0;
    /// `committed_at_ms` (i64).
    pub const COMMITTED_AT_MS: usize = 8;
    /// `key_offset` (u32).
    pub const KEY_OFFSET: usize = 16;
    /// `key_len` (u32).
    pub const KEY_LEN: usize = 20;
    /// `headers_offset` (u32).
    pub const HEADERS_OFFSET: usize = 24;
    /// `headers_len` (u32).
    pub const HEADERS_LEN: usize = 28;
    /// `value_offset` (u32).
    pub const VALUE_OFFSET: usize = 32;
    /// `value_len` (u32).
    pub const VALUE_LEN: usize = 36;
}

/// What a plugin needs to see of each record: the manifest's `needs` and the input buffer's
/// `fields` word. Key bytes are given unless the plugin asks for key hashes alone; headers and
/// values are copied into the guest only when asked for, so payloads are not copied for a
/// plugin that routes by key. Key hashes (Kafka's murmur2 of each key, computed by the host)
/// are given only when asked for.
///
/// Every set has the key bytes or the key hashes (or both): whether a record has a key is
/// always known from its table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Needs(u32);

impl Needs {
    /// Bit of the record keys' bytes (set unless the plugin asked for key hashes alone).
    pub const KEYS_BIT: u32 = 1 << 0;
    /// Bit of the record headers.
    pub const HEADERS_BIT: u32 = 1 << 1;
    /// Bit of the record values.
    pub const VALUES_BIT: u32 = 1 << 2;
    /// Bit of the key hashes region (manifest need `key_hash`).
    pub const KEY_HASH_BIT: u32 = 1 << 3;
    /// Bit of a buffer holding the key hashes and no record table (manifest need
    /// `key_hash_only`); only ever set with [`Self::KEY_HASH_BIT`] and no other bit.
    pub const KEY_HASH_ONLY_BIT: u32 = 1 << 4;
    /// Every bit the ABI defines.
    pub const ALL_BITS: u32 = Self::KEYS_BIT
        | Self::HEADERS_BIT
        | Self::VALUES_BIT
        | Self::KEY_HASH_BIT
        | Self::KEY_HASH_ONLY_BIT;

    /// Keys only (the default).
    pub const KEYS: Self = Self(Self::KEYS_BIT);
    /// Keys and headers.
    pub const HEADERS: Self = Self(Self::KEYS_BIT | Self::HEADERS_BIT);
    /// Keys and values.
    pub const VALUES: Self = Self(Self::KEYS_BIT | Self::VALUES_BIT);
    /// Keys, headers and values (not key hashes: they cost the host a hash per key, so they
    /// are given only to a plugin that asks).
    pub const ALL: Self = Self(Self::KEYS_BIT | Self::HEADERS_BIT | Self::VALUES_BIT);
    /// Key hashes and no key bytes (the record table still gives each record's parent
    /// offset, commit time and key length).
    pub const KEY_HASH: Self = Self(Self::KEY_HASH_BIT);
    /// The key hashes and nothing else, no record table: all a plugin that partitions by
    /// Kafka's hash reads, and the cheapest buffer for the host to write.
    pub const KEY_HASH_ONLY: Self = Self(Self::KEY_HASH_BIT | Self::KEY_HASH_ONLY_BIT);

    /// The set for a raw `fields` word, or `None` when it has a bit the ABI does not define,
    /// has neither the keys bit nor the key-hash bit, or has the key-hash-only bit with any
    /// bit but the key-hash bit.
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL_BITS != 0
            || bits & (Self::KEYS_BIT | Self::KEY_HASH_BIT) == 0
            || (bits & Self::KEY_HASH_ONLY_BIT != 0 && bits != Self::KEY_HASH_ONLY.0)
        {
            None
        } else {
            Some(Self(bits))
        }
    }

    /// The set with keys and, as asked, headers and values.
    pub const fn new(headers: bool, values: bool) -> Self {
        let mut bits = Self::KEYS_BIT;
        if headers {
            bits |= Self::HEADERS_BIT;
        }
        if values {
            bits |= Self::VALUES_BIT;
        }
        Self(bits)
    }

    /// The set of exactly these fields; with neither `keys` nor `key_hash`, the key bytes are
    /// included (a set always tells whether each record has a key).
    pub const fn from_flags(keys: bool, headers: bool, values: bool, key_hash: bool) -> Self {
        let mut bits = Self::new(headers, values).0;
        if !keys && key_hash {
            bits &= !Self::KEYS_BIT;
        }
        if key_hash {
            bits |= Self::KEY_HASH_BIT;
        }
        Self(bits)
    }

    /// This set with the key hashes added.
    pub const fn with_key_hash(self) -> Self {
        Self(self.0 | Self::KEY_HASH_BIT)
    }

    /// The raw `fields` word.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether the key bytes are included.
    pub const fn keys(self) -> bool {
        self.0 & Self::KEYS_BIT != 0
    }

    /// Whether headers are included.
    pub const fn headers(self) -> bool {
        self.0 & Self::HEADERS_BIT != 0
    }

    /// Whether values are included.
    pub const fn values(self) -> bool {
        self.0 & Self::VALUES_BIT != 0
    }

    /// Whether the key hashes are included.
    pub const fn key_hash(self) -> bool {
        self.0 & Self::KEY_HASH_BIT != 0
    }

    /// Whether the record table is included (parent offsets, commit times, key lengths):
    /// in every set but [`Self::KEY_HASH_ONLY`].
    pub const fn table(self) -> bool {
        self.0 & Self::KEY_HASH_ONLY_BIT == 0
    }

    /// The union of two sets (what a chain needs when several plugins share one input): a
    /// buffer without the record table only when both go without it.
    pub const fn union(self, other: Self) -> Self {
        let bits = self.0 | other.0;
        if self.table() || other.table() {
            Self(bits & !Self::KEY_HASH_ONLY_BIT)
        } else {
            Self(bits)
        }
    }

    /// The manifest names of the set, in the order the manifest lists them: `keys` (when the
    /// key bytes are included), `headers`, `values`, `key_hash`; or `key_hash_only` alone.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        let table = self.table();
        [
            (self.keys(), "keys"),
            (self.headers(), "headers"),
            (self.values(), "values"),
            (table && self.key_hash(), "key_hash"),
            (!table, "key_hash_only"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
    }
}

impl Default for Needs {
    /// Keys only.
    fn default() -> Self {
        Self::KEYS
    }
}

/// Rounds `n` up to a multiple of [`TABLE_ALIGN_BYTES`], or `None` on overflow.
#[cfg_attr(not(feature = "alloc"), allow(dead_code))] // used by the encoder and tests
pub(crate) const fn align_table(n: usize) -> Option<usize> {
    match n.checked_add(TABLE_ALIGN_BYTES - 1) {
        Some(v) => Some(v & !(TABLE_ALIGN_BYTES - 1)),
        None => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    #[test]
    fn needs_always_include_keys_and_reject_unknown_bits() {
        assert_eq!(Needs::from_bits(0), None);
        assert_eq!(Needs::from_bits(Needs::HEADERS_BIT), None);
        assert_eq!(Needs::from_bits(16 | 1), None);
        assert_eq!(Needs::from_bits(7), Some(Needs::ALL));
        assert_eq!(Needs::new(true, false), Needs::HEADERS);
        assert!(!Needs::default().headers() && !Needs::default().values());
        assert_eq!(Needs::HEADERS.union(Needs::VALUES), Needs::ALL);
    }

    #[test]
    fn key_hashes_may_replace_the_key_bytes_but_one_of_the_two_is_always_there() {
        assert_eq!(Needs::from_bits(Needs::KEY_HASH_BIT), Some(Needs::KEY_HASH));
        assert_eq!(
            Needs::from_bits(Needs::KEY_HASH_BIT | Needs::HEADERS_BIT),
            Some(Needs::from_flags(false, true, false, true))
        );
        assert!(!Needs::KEY_HASH.keys() && Needs::KEY_HASH.key_hash());
        assert_eq!(Needs::from_flags(false, false, false, false), Needs::KEYS);
        assert_eq!(
            Needs::from_flags(true, false, false, true),
            Needs::KEYS.with_key_hash()
        );
        assert!(!Needs::ALL.key_hash());
        assert_eq!(header_len(Needs::KEYS), HEADER_LEN_BYTES);
        assert_eq!(header_len(Needs::KEY_HASH), KEY_HASH_HEADER_LEN_BYTES);
    }

    #[test]
    fn key_hashes_alone_without_the_table_come_with_no_other_field() {
        let only = Needs::KEY_HASH_BIT | Needs::KEY_HASH_ONLY_BIT;
        assert_eq!(Needs::from_bits(only), Some(Needs::KEY_HASH_ONLY));
        for other in [Needs::KEYS_BIT, Needs::HEADERS_BIT, Needs::VALUES_BIT] {
            assert_eq!(Needs::from_bits(only | other), None, "{other:#x}");
        }
        assert_eq!(Needs::from_bits(Needs::KEY_HASH_ONLY_BIT), None);
        let n = Needs::KEY_HASH_ONLY;
        assert!(n.key_hash() && !n.table() && !n.keys() && !n.headers() && !n.values());
        assert!(Needs::KEY_HASH.table() && Needs::KEYS.table());
        assert_eq!(header_len(n), KEY_HASH_HEADER_LEN_BYTES);
        // Sharing a buffer with a plugin that reads the table gives the table.
        assert_eq!(n.union(Needs::KEY_HASH), Needs::KEY_HASH);
        assert_eq!(n.union(Needs::KEYS), Needs::KEYS.with_key_hash());
        assert_eq!(n.union(n), n);
        assert!(n.names().eq(["key_hash_only"]));
    }

    #[test]
    fn needs_name_themselves_as_the_manifest_does() {
        assert!(Needs::KEYS.names().eq(["keys"]));
        assert!(Needs::KEY_HASH.names().eq(["key_hash"]));
        assert!(
            Needs::ALL
                .with_key_hash()
                .names()
                .eq(["keys", "headers", "values", "key_hash"])
        );
    }

    #[test]
    fn table_alignment_rounds_up_to_eight() {
        assert_eq!(align_table(32), Some(32));
        assert_eq!(align_table(33), Some(40));
        assert_eq!(align_table(usize::MAX), None);
    }
}
