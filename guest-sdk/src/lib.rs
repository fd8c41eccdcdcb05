//! SDK for Narad routing plugins (ABI v1): write one safe function, register it with
//! [`router`], build for `wasm32-unknown-unknown`, deploy.
//!
//! ```
//! use narad_guest::{Decisions, RouteContext, RouteError, Slab, partition_for_key};
//!
//! #[narad_guest::router(name = "by-key", description = "hashes keys like Kafka")]
//! fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
//!     for record in slab.records() {
//!         if let Some(key) = record.key()? {
//!             let p = partition_for_key(key, ctx.child_partition_count)
//!                 .ok_or_else(|| RouteError::plugin("child has no partitions"))?;
//!             out.decide(&record, p);
//!         }
//!     }
//!     Ok(())
//! }
//!
//! // Natively, the harness runs it like the host would.
//! let slab = narad_guest::testing::SlabBuilder::new().child("c", 4).keyed("k").keyless();
//! let out = slab.route(&PLUGIN).unwrap();
//! assert_eq!(out, [partition_for_key(b"k", 4).unwrap(), narad_guest::UNDECIDED]);
//! ```
//!
//! Layout:
//! - this file: the author-facing re-exports ([`RouteContext`], [`Slab`], [`Record`],
//!   [`murmur2`], [`partition_for_key`], [`partition_for_hash`], [`UNDECIDED`], ...).
//! - [`macro@router`] (crate `narad-guest-macros`): generates the wasm exports, the
//!   `narad.manifest` section and the [`Plugin`] descriptor `PLUGIN`.
//! - `decisions.rs` ([`Decisions`]), `error.rs` ([`RouteError`]), `plugin.rs` ([`Plugin`]).
//! - [`config`]: `key=value` config parsing for a link's config bytes.
//! - `log.rs`: [`log!`] and [`log_line`] through the host's `narad.log` import.
//! - `sys.rs`: the only `extern` block (wasm32 only); `stub.rs`: its native stand-in.
//! - `heap.rs`: the wasm32 global allocator (size classes + free lists over `memory.grow`).
//! - `rt.rs`: the glue behind the exports, the panic handler (`__private`, not public API).
//! - [`testing`] (native only): `SlabBuilder`, `Instance`, `run_chain` for `cargo test`.
//!
//! # Partitioning by Kafka's hash: `needs = [key_hash]`
//!
//! A router that places keyed records by Kafka's murmur2 need not hash in Wasm: with
//! `key_hash` in `needs`, the host computes each key's hash natively while it writes the slab,
//! and [`Record::key_hash`] reads it (`Ok(None)` for a keyless record). `needs = [key_hash]`
//! alone also leaves the key bytes out (the host copies less; [`Record::key`] then answers
//! [`LayoutError::NotRequested`] for a keyed record, while [`Record::has_key`] still works);
//! `needs = [keys, key_hash]` gives both. Without the need, `key_hash()` hashes the key
//! bytes itself, with the same result, so the need changes cost, never routing.
//!
//! `needs = [key_hash_only]` (alone) is cheaper still for the host: the slab then holds the
//! hashes and no record table, so [`Slab::records`] yields nothing and the router reads
//! [`Slab::key_hashes`] (one `Option<u32>` per record, in slab order) zipped with
//! [`Decisions::slots_mut`]:
//!
//! ```
//! use narad_guest::{Decisions, RouteContext, RouteError, Slab, partition_for_hash};
//!
//! #[narad_guest::router(name = "by-hash", description = "Kafka's partitioner", needs = [key_hash_only])]
//! fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
//!     let hashes = slab.key_hashes().ok_or_else(|| RouteError::plugin("no key hashes"))?;
//!     for (hash, slot) in hashes.zip(out.slots_mut()) {
//!         if let Some(hash) = hash {
//!             *slot = partition_for_hash(hash, ctx.child_partition_count)
//!                 .ok_or_else(|| RouteError::plugin("child has no partitions"))?;
//!         }
//!     }
//!     Ok(())
//! }
//!
//! let out = narad_guest::testing::SlabBuilder::new().child("c", 4).keyed("k").keyless()
//!     .route(&PLUGIN)
//!     .unwrap();
//! assert_eq!(out, [narad_guest::partition_for_key(b"k", 4).unwrap(), narad_guest::UNDECIDED]);
//! ```
//!
//! With the record table (`needs = [key_hash]`):
//!
//! ```
//! use narad_guest::{Decisions, RouteContext, RouteError, Slab, partition_for_hash};
//!
//! #[narad_guest::router(name = "by-hash", description = "Kafka's partitioner", needs = [key_hash])]
//! fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
//!     for (record, slot) in slab.records().zip(out.slots_mut()) {
//!         if let Some(hash) = record.key_hash()? {
//!             *slot = partition_for_hash(hash, ctx.child_partition_count)
//!                 .ok_or_else(|| RouteError::plugin("child has no partitions"))?;
//!         }
//!     }
//!     Ok(())
//! }
//!
//! let out = narad_guest::testing::SlabBuilder::new().child("c", 4).keyed("k").keyless()
//!     .route(&PLUGIN)
//!     .unwrap();
//! assert_eq!(out, [narad_guest::partition_for_key(b"k", 4).unwrap(), narad_guest::UNDECIDED]);
//! ```
//!
//! Features (both on by default, both wasm32-only): `global-allocator`, `panic-handler`.
#![no_std]

extern crate alloc;

pub mod config;
mod decisions;
mod error;
mod heap;
mod log;
mod plugin;
mod rt;
#[cfg(not(target_arch = "wasm32"))]
mod stub;
#[cfg(target_arch = "wasm32")]
mod sys;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

pub use decisions::Decisions;
pub use error::RouteError;
pub use log::log_line;
pub use narad_abi::{
    Header, Headers, LayoutError, LogLevel, Needs, RecordView as Record, RouteStatus, UNDECIDED,
    murmur2, partition_for_hash, partition_for_key,
};
/// Registers a router function and generates the plugin around it.
///
/// ```text
/// #[narad_guest::router(
///     name = "header-route",          // required: 1..=64 of [a-z0-9-_]
///     version = "1.0.0",              // optional: defaults to the crate's version
///     description = "one line",       // required
///     needs = [headers],              // optional: any of keys, headers, values, key_hash
///                                     // (keys are given unless key_hash comes without them),
///                                     // or key_hash_only alone
/// )]
/// fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError>
/// ```
///
/// A stateful router takes its per-instance state first: `fn route(state: &mut MyState, ctx,
/// slab, out)` with `MyState: Default`; the host keeps one instance per link.
///
/// Generates, next to the function: `pub static PLUGIN: narad_guest::Plugin<State>` (for
/// the native test harness), and on wasm32 only the exports `narad_abi_version`,
/// `narad_alloc`, `narad_dealloc`, `narad_route`, `narad_last_error` and the
/// `narad.manifest` custom section. Use it once per crate.
pub use narad_guest_macros::router;
pub use plugin::{Plugin, RouteFn};

/// The route context: topics, partition counts, attempt and the link's config bytes,
/// borrowed from the input buffer.
pub type RouteContext<'a> = narad_abi::RouteContextRef<'a>;

/// The slab of records handed to a router, read in place.
pub type Slab<'a> = narad_abi::SlabView<'a>;

#[doc(hidden)]
pub mod __private {
    pub use crate::rt::*;
}
