//! Fan-out: the cursors that copy a parent partition into a child, commit before advance.
//!
//! One cursor runs per (parent partition, child) pair on the node that owns the parent
//! partition. Its loop, and the promise each step keeps:
//!
//! 1. **Read a slab** ([`slab`]): long-poll the parent for up to [`SLAB_LONG_POLL`], then top up
//!    to [`SLAB_MAX_RECORDS`] records or [`SLAB_MAX_BYTES`] bytes, or until [`SLAB_LINGER`]
//!    passes. A delay child reads through the gate ([`gate`]): only records committed at or
//!    before `now - delay` on this node's clock; at the first record not due it sleeps until
//!    that record is due, at most [`DELAY_MAX_SLEEP`].
//! 2. **Route** ([`router`]): the link's plugin chain gives every record a child partition.
//! 3. **Commit** ([`deliver`]): records are bucketed per child partition in slab order and each
//!    bucket is appended to its child partition (the produce path: append, `fdatasync`,
//!    verify), [`COMMITS_IN_FLIGHT`] at a time. Failed buckets get quick retries, then the
//!    cursor backs off and retries only them, re-routed under the child's current partition
//!    count, after checking that its attach epoch is still the link's.
//! 4. **Advance** ([`cursor`]): only when every bucket is acknowledged, the offset file
//!    (`narad_storage::cursor`) moves past the slab. A crash in between repeats the slab:
//!    duplicates in the child, never a gap.
//!
//! Where a cursor starts ([`start`]) is fixed by the attach: the parent's high watermarks read
//! while the attach was processed, 0 for partitions added later, the live tail for links that
//! predate attach points. A cursor behind the parent's log start skips the aged-out records and
//! counts them as dropped ([`status`], metrics).

pub mod committer;
pub mod cursor;
pub mod deliver;
pub mod gate;
pub mod metrics;
pub mod plugin_metrics;
pub mod provenance;
pub mod router;
pub mod slab;
pub mod start;
pub mod status;
pub mod wasm_router;

use std::time::Duration;

/// Long-poll on the parent before a slab read gives up and reports no data (engine
/// reference: slab long-poll 1 s).
pub const SLAB_LONG_POLL: Duration = Duration::from_secs(1);

/// Most records in one slab (engine reference: fanout.max_batch_records = 4,096).
pub const SLAB_MAX_RECORDS: usize = 4_096;

/// Most record bytes in one slab (engine reference: fanout.max_batch_bytes = 4 MiB).
pub const SLAB_MAX_BYTES: usize = 4 * 1024 * 1024;

/// How long a partial slab waits for more records before it ships (engine reference: 25 ms).
pub const SLAB_LINGER: Duration = Duration::from_millis(25);

/// Child-partition commits in flight per slab (engine reference: 16, from v3.1.0).
pub const COMMITS_IN_FLIGHT: usize = 16;

/// Pauses between the quick tries of a failed bucket commit: 3 tries, 100 ms then 200 ms
/// apart (engine reference).
pub const QUICK_RETRY_PAUSES: [Duration; 2] =
    [Duration::from_millis(100), Duration::from_millis(200)];

/// Back-off before retrying buckets that failed their quick tries, and between routing
/// attempts of a slab a plugin failed (engine reference: retry backoff 1 s).
pub const RETRY_BACKOFF: Duration = Duration::from_secs(1);

/// Longest sleep of a delay cursor waiting for its next record to come due, so its gauges and
/// view of the metadata stay fresh (engine reference: defaultFanoutDueWakeCap = 30 s).
pub const DELAY_MAX_SLEEP: Duration = Duration::from_secs(30);
