//! Wire contract shared by the Narad host and its routing plugins (ABI v1).
//!
//! `no_std` so that it builds for `wasm32-unknown-unknown` inside a plugin and natively inside
//! the host, and both sides agree bit for bit on one implementation of the layout.
//!
//! Layout:
//! - this file: the ABI version, [`UNDECIDED`], the manifest section name, log levels, limits.
//! - [`symbols`]: export and import names the host looks up and the guest defines.
//! - [`status`]: `narad_route` return codes.
//! - [`layout`]: byte offsets of the input buffer (header, record table entry, key hashes)
//!   and [`Needs`].
//! - [`context`]: the route context, postcard-encoded by hand ([`RouteContextRef`], zero-copy)
//!   and, with `alloc`, the owned [`RouteContext`].
//! - [`view`]: the guest-side zero-copy reader ([`SlabView`], [`RecordView`], [`Headers`]);
//!   every accessor is bounds-checked and returns a typed error on hostile bytes.
//! - [`encode`] (feature `alloc`): the host-side [`SlabEncoder`] that writes a whole input
//!   buffer in one pass.
//! - [`manifest`] (feature `alloc`): the `narad.manifest` JSON document and its validation.
//! - [`error`]: the error types of all of the above.
//! - [`partitioner`]: Kafka's default partitioner (`murmur2`), used by produce, by the host
//!   to write the key hashes a plugin asks for, and by the `key-hash` plugin, so a key lands
//!   where a Kafka client would put it.
//!
//! Features: `alloc` (owned types, encoder, manifest) and `serde` (serde derives, host side).
#![no_std]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod context;
#[cfg(feature = "alloc")]
pub mod encode;
pub mod error;
pub mod layout;
#[cfg(feature = "alloc")]
pub mod manifest;
pub mod partitioner;
pub mod status;
pub mod symbols;
mod varint;
pub mod view;

#[cfg(feature = "alloc")]
pub use context::RouteContext;
pub use context::RouteContextRef;
#[cfg(feature = "alloc")]
pub use encode::{RecordInput, SlabEncoder, SlabLayout, SlabRecord};
pub use error::{ContextError, Field, LayoutError, Region};
#[cfg(feature = "alloc")]
pub use error::{EncodeError, ManifestError};
pub use layout::Needs;
#[cfg(feature = "alloc")]
pub use manifest::{Manifest, validate_plugin_name};
pub use partitioner::{murmur2, partition_for_hash, partition_for_key};
pub use status::RouteStatus;
pub use view::{Header, Headers, RecordView, Records, SlabView};

/// The ABI version this crate implements. `narad_abi_version()` must return it and the
/// manifest's `abi` field must equal it; the host rejects anything else at deploy.
pub const ABI_VERSION: u32 = 1;

/// The decision slot value meaning "not decided by this plugin; leave it to the next one of
/// the chain". Chosen as `u32::MAX` because no child topic can have that many partitions.
pub const UNDECIDED: u32 = u32::MAX;

/// Name of the Wasm custom section holding the plugin's manifest (UTF-8 JSON).
pub const MANIFEST_SECTION: &str = "narad.manifest";

/// Most bytes of a `narad_last_error` message the host reads (4 KiB, from the ABI v1
/// contract); longer messages are cut at a character boundary by the guest SDK.
pub const LAST_ERROR_MAX_BYTES: usize = 4096;

/// Alignment in bytes `narad_alloc` must give (8, from the ABI v1 contract) so the record
/// table (which holds `u64` fields) can be read with aligned loads.
pub const ALLOC_ALIGN_BYTES: usize = 8;

/// Severity of a `narad.log` line; the `level` argument of the import.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(i32)]
pub enum LogLevel {
    /// Something failed.
    Error = 0,
    /// Something looks wrong but routing goes on.
    Warn = 1,
    /// Routine information.
    Info = 2,
    /// Detail for debugging a plugin.
    Debug = 3,
}

impl LogLevel {
    /// The level for a raw `level` argument, or `None` for a value outside 0..=3.
    pub const fn from_i32(level: i32) -> Option<Self> {
        match level {
            0 => Some(Self::Error),
            1 => Some(Self::Warn),
            2 => Some(Self::Info),
            3 => Some(Self::Debug),
            _ => None,
        }
    }

    /// The raw `level` argument for the `narad.log` import.
    pub const fn as_i32(self) -> i32 {
        self as i32
    }
}
