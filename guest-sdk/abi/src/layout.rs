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
//! 28      4     fields (u32 bit set)               bit0 keys (always), bit1 headers, bit2 values
//! ```
//!
//! Record table entry `i` at `table_offset + 40 * i`:
//!
//! ```text
//! 0   8  parent_offset (u64)
//! 8   8  committed_at_ms (i64)
//! 16  4  key_offset (u32, relative to arena_offset)
//! 20  4  key_len (u32; NO_KEY = absent, 0 = empty key)
//! 24  4  headers_offset (u32, relative to arena)   0 unless headers were asked for
//! 28  4  headers_len (u32)
//! 32  4  value_offset (u32, relative to arena)     0 unless values were asked for
//! 36  4  value_len (u32)
//! ```
//!
//! Headers region of one record: `u32 count`, then per header `u32 name_len, name bytes,
//! u32 value_len, value bytes`.

/// First four bytes of every input buffer ("Narad Route Slab", layout 1).
pub const MAGIC: [u8; 4] = *b"NRS1";
/// Size in bytes of the fixed buffer header.
pub const HEADER_LEN_BYTES: usize = 32;
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
/// `fields` word. Keys are always included; headers and values are copied into the guest only
/// when asked for, so payloads are not copied for a plugin that routes by key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Needs(u32);

impl Needs {
    /// Bit of the record keys (always set).
    pub const KEYS_BIT: u32 = 1 << 0;
    /// Bit of the record headers.
    pub const HEADERS_BIT: u32 = 1 << 1;
    /// Bit of the record values.
    pub const VALUES_BIT: u32 = 1 << 2;
    /// Every bit ABI v1 defines.
    pub const ALL_BITS: u32 = Self::KEYS_BIT | Self::HEADERS_BIT | Self::VALUES_BIT;

    /// Keys only (the default).
    pub const KEYS: Self = Self(Self::KEYS_BIT);
    /// Keys and headers.
    pub const HEADERS: Self = Self(Self::KEYS_BIT | Self::HEADERS_BIT);
    /// Keys and values.
    pub const VALUES: Self = Self(Self::KEYS_BIT | Self::VALUES_BIT);
    /// Keys, headers and values.
    pub const ALL: Self = Self(Self::ALL_BITS);

    /// The set for a raw `fields` word, or `None` when it has a bit ABI v1 does not define
    /// or lacks the keys bit.
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL_BITS != 0 || bits & Self::KEYS_BIT == 0 {
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

    /// The raw `fields` word.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether headers are included.
    pub const fn headers(self) -> bool {
        self.0 & Self::HEADERS_BIT != 0
    }

    /// Whether values are included.
    pub const fn values(self) -> bool {
        self.0 & Self::VALUES_BIT != 0
    }

    /// The union of two sets (what a chain needs when several plugins share one input).
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
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
        assert_eq!(Needs::from_bits(8 | 1), None);
        assert_eq!(Needs::from_bits(7), Some(Needs::ALL));
        assert_eq!(Needs::new(true, false), Needs::HEADERS);
        assert!(!Needs::default().headers() && !Needs::default().values());
        assert_eq!(Needs::HEADERS.union(Needs::VALUES), Needs::ALL);
    }

    #[test]
    fn table_alignment_rounds_up_to_eight() {
        assert_eq!(align_table(32), Some(32));
        assert_eq!(align_table(33), Some(40));
        assert_eq!(align_table(usize::MAX), None);
    }
}
