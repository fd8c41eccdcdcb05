//! Error types of the ABI crate. `Display` and `core::error::Error` are written by hand
//! because `thiserror`'s default `std` feature would link std (and its panic handler) into
//! `no_std` guests.

use core::fmt;

/// A part of the input buffer that the header points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// The postcard-encoded route context.
    Context,
    /// The record table.
    Table,
    /// The key/header/value arena.
    Arena,
    /// The key hashes (one `u32` per record), present when the plugin asked for them.
    KeyHashes,
}

/// A per-record field of the input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// The record key.
    Key,
    /// The record's headers region.
    Headers,
    /// The record value.
    Value,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Key => "key",
            Field::Headers => "headers",
            Field::Value => "value",
        })
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Region::Context => "context",
            Region::Table => "record table",
            Region::Arena => "arena",
            Region::KeyHashes => "key hashes",
        })
    }
}

/// The route context bytes could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContextError {
    /// The bytes end inside `field`.
    Truncated {
        /// The context field being read.
        field: &'static str,
    },
    /// A varint of `field` is longer than five bytes or above `u32::MAX`.
    VarintOverflow {
        /// The context field being read.
        field: &'static str,
    },
    /// The string `field` is not UTF-8.
    InvalidUtf8 {
        /// The context field being read.
        field: &'static str,
    },
    /// `count` bytes follow the last field (the host and guest disagree on the layout).
    TrailingBytes {
        /// How many bytes follow the context.
        count: usize,
    },
}

impl fmt::Display for ContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { field } => write!(f, "route context ends inside `{field}`"),
            Self::VarintOverflow { field } => {
                write!(f, "route context field `{field}` overflows u32")
            }
            Self::InvalidUtf8 { field } => {
                write!(f, "route context field `{field}` is not UTF-8")
            }
            Self::TrailingBytes { count } => {
                write!(f, "{count} unexpected bytes after the route context")
            }
        }
    }
}

impl core::error::Error for ContextError {}

/// The input buffer is malformed, or a plugin asked for something it does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// The buffer is shorter than its header (32 bytes, 36 with key hashes).
    TooShort {
        /// The buffer's length.
        len: usize,
    },
    /// The buffer does not start with `b"NRS1"`.
    BadMagic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// The `fields` word has neither the keys bit nor the key-hash bit, or has a bit the ABI
    /// does not define.
    BadFields {
        /// The `fields` word found.
        bits: u32,
    },
    /// A region the header points at does not lie inside the buffer.
    RegionOutOfBounds {
        /// Which region.
        region: Region,
        /// Its offset from the buffer start.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The buffer's length.
        buffer_len: usize,
    },
    /// A record index at or past the record count.
    RecordOutOfRange {
        /// The index asked for.
        index: usize,
        /// The slab's record count.
        count: usize,
    },
    /// A record's key, headers or value range does not lie inside the arena.
    FieldOutOfBounds {
        /// Index of the record in the slab.
        record: usize,
        /// Which field.
        field: Field,
    },
    /// The plugin read key bytes, headers or values but its manifest did not ask for them, so
    /// the host did not copy them in (key bytes are left out only for a plugin that asked for
    /// key hashes alone).
    NotRequested {
        /// Which field.
        field: Field,
    },
    /// The plugin asked for a record, but its manifest asks for `key_hash_only`: the slab
    /// holds the key hashes and no record table.
    NoRecordTable,
    /// A record's headers region ends inside a header, or has bytes after the last one.
    MalformedHeaders {
        /// Index of the record in the slab.
        record: usize,
    },
    /// A header name is not UTF-8.
    HeaderNameNotUtf8 {
        /// Index of the record in the slab.
        record: usize,
    },
    /// The route context could not be decoded.
    Context(ContextError),
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { len } => {
                write!(f, "input of {len} bytes is shorter than its header")
            }
            Self::BadMagic { found } => write!(f, "input magic {found:02x?} is not \"NRS1\""),
            Self::BadFields { bits } => write!(f, "input fields word {bits:#x} is invalid"),
            Self::RegionOutOfBounds {
                region,
                offset,
                len,
                buffer_len,
            } => write!(
                f,
                "{region} at {offset}+{len} lies outside the {buffer_len}-byte input"
            ),
            Self::RecordOutOfRange { index, count } => {
                write!(f, "record {index} asked of a slab of {count}")
            }
            Self::FieldOutOfBounds { record, field } => {
                write!(f, "record {record}: {field} lies outside the arena")
            }
            Self::NotRequested { field } => write!(
                f,
                "the plugin read {field} but its manifest's `needs` does not ask for them"
            ),
            Self::NoRecordTable => f.write_str(
                "the plugin read a record, but its manifest's `needs` is `key_hash_only`: the slab has key hashes and no record table",
            ),
            Self::MalformedHeaders { record } => {
                write!(f, "record {record}: headers region is malformed")
            }
            Self::HeaderNameNotUtf8 { record } => {
                write!(f, "record {record}: a header name is not UTF-8")
            }
            Self::Context(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for LayoutError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Context(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ContextError> for LayoutError {
    fn from(e: ContextError) -> Self {
        Self::Context(e)
    }
}

/// The host could not encode an input buffer.
#[cfg(feature = "alloc")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The buffer would exceed the ABI's 32-bit offsets (4 GiB), or a key is `u32::MAX`
    /// bytes long (that length means "no key").
    TooLarge,
    /// The output slice is shorter than the layout's total length.
    BufferTooSmall {
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The records given to `write` differ from those given to `layout` (count or sizes).
    LayoutMismatch,
}

#[cfg(feature = "alloc")]
impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge => f.write_str("slab too large for the ABI's 32-bit offsets"),
            Self::BufferTooSmall { needed, got } => {
                write!(f, "output buffer of {got} bytes, {needed} needed")
            }
            Self::LayoutMismatch => f.write_str("records written differ from the records measured"),
        }
    }
}

#[cfg(feature = "alloc")]
impl core::error::Error for EncodeError {}

/// A manifest breaks a rule of ABI v1.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManifestError {
    /// The plugin name is empty or longer than 64 bytes.
    NameLength {
        /// The name's length in bytes.
        len: usize,
    },
    /// The plugin name has a character outside `[a-z0-9-_]`.
    NameCharacter {
        /// The first offending character.
        found: char,
    },
    /// The manifest's `abi` is not [`crate::ABI_VERSION`].
    UnsupportedAbi {
        /// The `abi` found.
        found: u32,
    },
    /// The version is empty, longer than 64 bytes, or has whitespace or control characters.
    BadVersion,
    /// The description is longer than 200 bytes or is not a single line.
    BadDescription,
}

#[cfg(feature = "alloc")]
impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NameLength { len } => {
                write!(f, "plugin name must be 1 to 64 bytes, got {len}")
            }
            Self::NameCharacter { found } => {
                write!(
                    f,
                    "plugin name may hold only a-z, 0-9, '-' and '_', found {found:?}"
                )
            }
            Self::UnsupportedAbi { found } => write!(
                f,
                "manifest declares ABI version {found}, this host speaks {}",
                crate::ABI_VERSION
            ),
            Self::BadVersion => f.write_str(
                "plugin version must be 1 to 64 bytes with no whitespace or control characters",
            ),
            Self::BadDescription => {
                f.write_str("plugin description must be one line of at most 200 bytes")
            }
        }
    }
}

#[cfg(feature = "alloc")]
impl core::error::Error for ManifestError {}
