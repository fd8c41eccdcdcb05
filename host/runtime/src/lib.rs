//! Narad's host runtime for routing plugins: a wasmtime engine with limits, validated plugins,
//! per-link chains of plugin instances, and the bucketing of their decisions.
//!
//! Layout:
//! - [`engine`]: [`Runtime`], the wasmtime engine (Cranelift, fuel, epochs), its linker (only
//!   `narad.log`) and its compiled-module cache; [`RuntimeConfig`].
//! - [`limits`]: [`Limits`] (deadline, memory, tables, stack, log rate), the fuel budget of a
//!   call ([`limits::FuelBudget`]) and the store's resource limiter.
//! - [`ticker`]: the one epoch ticker thread per runtime.
//! - [`cache`]: compiled modules on disk, keyed by content digest and engine fingerprint.
//! - [`plugin`]: [`Plugin::load`] validates a `.wasm` (imports, exports, manifest, ABI version,
//!   the built-in test slab) and gives a [`Plugin`] with its [`Digest`].
//! - [`precheck`]: the shape check (function count and sizes, locals, segments) a module
//!   passes before it is compiled; [`ModuleShape`].
//! - [`testslab`]: the built-in test slab of the deploy check, and [`probe_link`], the same
//!   records routed with a link's real context at attach.
//! - [`instance`]: [`Instance`], one store of one plugin, rebuilt after any failure; the slab
//!   buffer in guest memory; classification of traps into [`Failure`]s.
//! - `hostlog`: the rate-limited `narad.log` import.
//! - [`chain`]: [`Chain`], 1..=8 instances routing a slab, each seeing only undecided records;
//!   [`PluginStats`] per plugin and failure kind; [`Chain::bisect`] for the poison record.
//! - [`bucket`](mod@bucket): the stable counting sort from decisions to per-partition buckets.
//! - [`trial`]: [`run_trial`], a chain run locally on given records (`narad plugin test`).
//! - [`error`]: the typed errors.
//! - `testkit` (feature `test-support`, and this crate's tests): `WatRouter`, routing plugins
//!   written in WAT for tests.
//! - [`text`]: [`text::sanitize`], escaping and capping text a plugin controls before it is
//!   logged or shown by the API.
//!
//! Threading: [`Runtime`] and [`Plugin`] are `Send + Sync + Clone`; [`Chain`] and [`Instance`]
//! are `Send` (one owner at a time). Routing is CPU work bounded by the deadline: the daemon
//! runs [`Chain::route`] on a blocking pool (`spawn_blocking`), never on an I/O thread.
//!
//! Determinism: plugins get no clock, randomness or WASI; fuel budgets depend only on the slab;
//! so a slab routes (or fails) the same way on replay.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod bucket;
pub mod cache;
pub mod chain;
pub mod engine;
pub mod error;
mod gate;
mod hostlog;
pub mod instance;
mod interface;
pub mod limits;
pub mod plugin;
pub mod precheck;
#[cfg(any(test, feature = "test-support"))]
pub mod testkit;
pub mod testslab;
pub mod text;
pub mod ticker;
pub mod trial;

pub use bucket::{BucketError, Buckets, bucket};
pub use cache::CacheOutcome;
pub use chain::{Chain, MAX_CHAIN_LEN, PluginStats, PoisonRecord};
pub use engine::{DEFAULT_COMPILE_CONCURRENCY, Runtime, RuntimeConfig};
pub use error::{
    ChainError, EngineError, ErrorCode, Failure, FailureKind, LoadError, ModuleLimit, PluginError,
    Violation,
};
pub use hostlog::MAX_LOG_LINE_BYTES;
pub use instance::{Instance, InstanceCounters};
pub use limits::{FuelBudget, Limits, ModuleLimits};
pub use plugin::{Digest, Plugin};
pub use precheck::ModuleShape;
pub use testslab::{DeployProbe, probe_link};
pub use trial::{TrialError, TrialReport, run_trial};

/// The ABI types a caller needs to route (re-exported so the daemon and CLI need not name
/// `narad-abi` for them).
pub use narad_abi::{RecordInput, RouteContext, SlabRecord, UNDECIDED};
