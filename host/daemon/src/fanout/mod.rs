//! Fan-out: the cursors that copy a parent partition into a child, commit before advance.
//!
//! One cursor runs per (parent partition, child) pair on the node that owns the parent
//! partition. Its loop ([`cursor`]) calls one module per step of a slab, in order,
//! and each step hands its result to the next; none calls back into the loop:
//!
//! 0. **Position** ([`position`]): where the cursor starts or resumes, once, before the loop.
//!    The attach fixes it: the parent's high watermarks read while the attach was processed, 0
//!    for partitions added later, the live tail for links that predate attach points. An offset
//!    file of this epoch is resumed, after checking it against the parent's end and against
//!    what the child holds (rewinding, never skipping); without one, the child's newest slab
//!    of this epoch names where to resume. Writing a new offset file waits for the metastore to
//!    confirm the epoch.
//! 1. **Read a slab** ([`slab`]): long-poll the parent for up to
//!    [`FanoutTiming::slab_long_poll`], then top up to [`SLAB_MAX_RECORDS`] records or
//!    [`SLAB_MAX_BYTES`] bytes, or until [`FanoutTiming::slab_linger`] passes. A delay child
//!    reads through the gate ([`gate`]): only records committed at or before `now - delay` on
//!    this node's clock; at the first record not due it sleeps until that record is due, at
//!    most [`FanoutTiming::delay_max_sleep`].
//! 2. **Route** ([`route`]): after checking that the cursor's attach epoch is still the link's,
//!    the link's plugin chain gives every record a child partition, under the child's current
//!    partition count.
//! 3. **Bucket** ([`bucket`]): a counting sort by child partition (`narad_runtime::bucket`),
//!    slab order kept within each bucket; each bucket is a batch carrying its origin.
//! 4. **Commit** ([`commit`]): each bucket is appended to its child partition (the produce
//!    path: append, `fdatasync`, verify), [`COMMITS_IN_FLIGHT`] at a time, with quick retries
//!    ([`FanoutTiming::quick_retry_pauses`]). Failed buckets only are held (copied) and, after
//!    [`FanoutTiming::retry_backoff`], go through steps 2 to 4 again. In cluster mode the
//!    committer is [`remote_commit::ClusterCommitter`]: a child partition of another node gets
//!    its bucket over the internal commit call, and a dead owner stalls only its buckets.
//! 5. **Advance** ([`advance`]): only when every bucket is acknowledged (the proof commit
//!    hands out), the offset file (`narad_storage::cursor`) moves past the slab. A crash in
//!    between repeats the slab: duplicates in the child, never a gap.
//!
//! A link with a shadow ([`shadow`]) also offers each slab, once step 2 routed it, to a
//! candidate chain that runs beside the loop: the offer never waits, and nothing the candidate
//! decides is committed.
//!
//! The loop is pipelined one commit deep: step 5 for the slabs before and step 1 for the slabs
//! after run while the current slabs go through steps 2 to 4, so the child's `fdatasync` and
//! the offset file's overlap; step 5 still only ever follows acknowledged slabs, in slab
//! order. With a backlog, the slabs read ahead (up to [`SLABS_PER_COMMIT`]) are committed
//! together: each is routed and bucketed on its own, and each child partition gets their
//! buckets in one commit, in slab order (one `fdatasync` on one node); a bucket is never
//! acknowledged ahead of an earlier slab's bucket for the same child partition. While the cursor copies at full
//! speed, step 5 writes the position at once and syncs it at most every
//! [`FanoutTiming::offset_sync_every`], one sync covering the slabs delivered since; an idle,
//! paused or stopping cursor syncs at once.
//!
//! A cursor behind the parent's log start skips the aged-out records and counts them as
//! dropped; one past the parent's end goes back to it ([`advance`], [`status`], metrics).
//! Every wait of the loop comes from the cursor's [`FanoutTiming`] (defaults: the reference
//! constants below) and every reading of the time from its clock, so tests shorten both.

pub mod advance;
pub(crate) mod bucket;
pub(crate) mod commit;
pub mod committer;
pub mod cursor;
pub(crate) mod dead_letter;
pub mod gap_book;
pub(crate) mod gate;
pub(crate) mod link_runtime;
pub mod metrics;
pub(crate) mod peer_calls;
pub(crate) mod plugin_metrics;
pub mod position;
pub(crate) mod remote_child;
pub(crate) mod remote_commit;
pub mod route;
pub mod shadow;
pub(crate) mod slab;
pub(crate) mod stall_log;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use narad_storage::fs::FileSystem;
use narad_storage::{Clock, Store};

pub use link_runtime::LinkRuntime;

use crate::metastore::Metastore;
use committer::ChildCommitter;

/// Identity of one fan-out cursor: a (parent partition, child) pair under one attach epoch.
///
/// The epoch is part of the identity so that a detach followed by a re-attach is a stop of the
/// old cursor and a start of a new one, never a silent resume of the old position. The
/// reconciler compares sets of these to decide which cursors to start and stop.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CursorKey {
    /// Parent topic name.
    pub parent: String,
    /// Parent partition index.
    pub partition: u32,
    /// Child topic name.
    pub child: String,
    /// Attach epoch of the link the cursor serves (16 lowercase hex digits).
    pub epoch: String,
}

/// The parts of the daemon a cursor uses.
pub struct CursorDeps {
    /// The local store: the parent partition and (on one node) the child partitions.
    pub store: Arc<Store>,
    /// The file system the store runs on, for the offset file.
    pub fs: Arc<dyn FileSystem>,
    /// Where child buckets are committed.
    pub committer: Arc<dyn ChildCommitter>,
    /// The metadata: topics, links, and the linearizable epoch check.
    pub metastore: Arc<dyn Metastore>,
    /// The clock the delay gate reads (this node's clock).
    pub clock: Arc<dyn Clock>,
    /// Every wait of the cursor (the reference constants by default).
    pub timing: FanoutTiming,
    /// Cluster mode: how the start-up scan of the child's tails reads the child partitions
    /// other nodes own. `None` on one node, where every child partition must be here (a
    /// missing one is an error).
    pub remote_tails: Option<Arc<dyn position::RemoteTails>>,
    /// Cluster mode: this node's id, written with every range on a cursor's gap ledger.
    pub node: Option<String>,
    /// Whether a starting cursor leaves out of the slabs it reads again the records its child
    /// already holds ([`position::Held`]). The daemon always sets it; only the
    /// baseline of `narad bench once` runs without, to measure what the check costs.
    pub leave_out_held: bool,
}

/// Long-poll on the parent before a slab read gives up and reports no data (engine
/// reference: slab long-poll 1 s).
pub(crate) const SLAB_LONG_POLL: Duration = Duration::from_secs(1);

/// Most records in one slab (engine reference: fanout.max_batch_records = 4,096).
pub const SLAB_MAX_RECORDS: usize = 4_096;

/// Most record bytes in one slab (engine reference: fanout.max_batch_bytes = 4 MiB).
pub const SLAB_MAX_BYTES: usize = 4 * 1024 * 1024;

/// How long a partial slab waits for more records before it ships (engine reference: 25 ms).
pub(crate) const SLAB_LINGER: Duration = Duration::from_millis(25);

/// Child-partition commits in flight per slab (engine reference: 16, from v3.1.0).
pub const COMMITS_IN_FLIGHT: usize = 16;

/// Pauses between the quick tries of a failed bucket commit: 3 tries, 100 ms then 200 ms
/// apart (engine reference).
pub(crate) const QUICK_RETRY_PAUSES: [Duration; 2] =
    [Duration::from_millis(100), Duration::from_millis(200)];

/// Back-off before retrying buckets that failed their quick tries, and between routing
/// attempts of a slab a plugin failed (engine reference: retry backoff 1 s).
pub(crate) const RETRY_BACKOFF: Duration = Duration::from_secs(1);

/// Longest sleep of a delay cursor waiting for its next record to come due, so its gauges and
/// view of the metadata stay fresh (engine reference: defaultFanoutDueWakeCap = 30 s).
pub(crate) const DELAY_MAX_SLEEP: Duration = Duration::from_secs(30);

/// Longest back-off of a cursor whose remote child's target keeps failing: the wait starts at
/// [`RETRY_BACKOFF`] and doubles with each failed try of the same slab, up to this, so a target
/// that is down or refusing is not asked every second by every cursor (ours; the reference
/// retries remote sends with back-off and names no cap).
pub(crate) const REMOTE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Longest a cursor copying at full speed leaves its offset file unsynced (ours; the reference
/// syncs it once per slab). Past a delivered slab the position is written at once (a restart
/// after the process dies resumes there), but its `fdatasync` waits until this long after the
/// last one, so that one sync covers every slab delivered meanwhile: at full speed a cursor's
/// syncs fell from two per slab to little more than one (the child commit's), which on a disk
/// that flushes one request at a time was the difference between half the raw loop and most
/// of it (docs/benchmarks.md). What a power loss can cost is bounded by it: the durable
/// position is at most this much copying behind, so a restart repeats at most that (50 ms of
/// copying is at most about 50,000 records at a cursor's top speed, within the children's
/// 65,536-origin dedupe windows), and skips nothing. An idle, paused or stopping cursor syncs
/// at once.
pub const OFFSET_SYNC_EVERY: Duration = Duration::from_millis(50);

/// Most consecutive slabs a cursor commits together (ours; the reference commits each slab
/// on its own). A cursor with a backlog reads the next slabs while it commits, and the slabs
/// read by then join the next commit: each child partition gets their buckets in one commit,
/// in slab order, which on one node is one append with one `fdatasync` and one read-back
/// for all of them. Every slab is still routed on its own (a plugin sees at most
/// [`SLAB_MAX_RECORDS`] records a call), no bucket is acknowledged unless the earlier slabs'
/// buckets for the same child partition are, and the offset file moves past the slabs only
/// once all are acknowledged: a crash repeats at most this many slabs. It bounds what a
/// cursor holds to twice this many slabs (those committing and those read ahead).
pub const SLABS_PER_COMMIT: usize = 2;

/// A running cursor that has records to copy and has not moved its position for this long is
/// reported `stalled` ("no progress for N s"), whatever holds it: a commit or read that does
/// not return shows as trouble, not as a healthy cursor. Longer than the slowest healthy
/// slab (a remote child's commit may take 90 s before it fails and is retried).
pub const NO_PROGRESS_AFTER: Duration = Duration::from_secs(120);

/// Every wait of a cursor, and how many slabs it commits together, carried to it with its
/// clock (`CursorDeps`). [`Default`] gives the constants above; tests shorten the waits
/// instead of sleeping for seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FanoutTiming {
    /// Long-poll on the parent before a slab read reports no data ([`SLAB_LONG_POLL`]).
    pub slab_long_poll: Duration,
    /// How long a partial slab waits for more records before it ships ([`SLAB_LINGER`]).
    pub slab_linger: Duration,
    /// Pauses between the quick tries of a failed bucket commit, one more try per pause
    /// ([`QUICK_RETRY_PAUSES`]).
    pub quick_retry_pauses: [Duration; 2],
    /// Back-off before failed buckets go round again, after a failed routing, and after any
    /// failed step of the loop ([`RETRY_BACKOFF`]).
    pub retry_backoff: Duration,
    /// Longest sleep of a delay cursor waiting for a record to come due ([`DELAY_MAX_SLEEP`]).
    pub delay_max_sleep: Duration,
    /// Longest back-off between tries of a slab a remote child's target did not take
    /// ([`REMOTE_BACKOFF_MAX`]).
    pub remote_backoff_max: Duration,
    /// Longest a cursor copying at full speed leaves a written position unsynced
    /// ([`OFFSET_SYNC_EVERY`]); zero syncs the offset file past every slab.
    pub offset_sync_every: Duration,
    /// Most consecutive slabs committed together ([`SLABS_PER_COMMIT`]); 1 commits each slab
    /// on its own, as the reference engine does (0 counts as 1).
    pub slabs_per_commit: usize,
    /// How long a running cursor with records to copy may go without moving its position
    /// before it is reported stalled, whatever holds it ([`NO_PROGRESS_AFTER`]).
    pub no_progress_after: Duration,
}

impl FanoutTiming {
    /// The back-off after the `failures`-th failed try in a row of one slab at a remote
    /// target: [`FanoutTiming::retry_backoff`], doubled per failure after the first, at most
    /// [`FanoutTiming::remote_backoff_max`].
    pub(crate) fn remote_backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.retry_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.remote_backoff_max)
    }
}

impl Default for FanoutTiming {
    fn default() -> FanoutTiming {
        FanoutTiming {
            slab_long_poll: SLAB_LONG_POLL,
            slab_linger: SLAB_LINGER,
            quick_retry_pauses: QUICK_RETRY_PAUSES,
            retry_backoff: RETRY_BACKOFF,
            delay_max_sleep: DELAY_MAX_SLEEP,
            remote_backoff_max: REMOTE_BACKOFF_MAX,
            offset_sync_every: OFFSET_SYNC_EVERY,
            slabs_per_commit: SLABS_PER_COMMIT,
            no_progress_after: NO_PROGRESS_AFTER,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_timing_is_the_engine_reference() {
        let timing = FanoutTiming::default();
        assert_eq!(timing.slab_long_poll, Duration::from_secs(1));
        assert_eq!(timing.slab_linger, Duration::from_millis(25));
        assert_eq!(
            timing.quick_retry_pauses,
            [Duration::from_millis(100), Duration::from_millis(200)]
        );
        assert_eq!(timing.retry_backoff, Duration::from_secs(1));
        assert_eq!(timing.delay_max_sleep, Duration::from_secs(30));
    }

    #[test]
    fn a_failing_remote_target_is_tried_again_after_doubling_waits_up_to_the_cap() {
        let timing = FanoutTiming::default();
        let waits: Vec<u64> = (1..=7)
            .map(|n| timing.remote_backoff(n).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(timing.remote_backoff(u32::MAX), REMOTE_BACKOFF_MAX);
    }
}
