//! The fan-out's Prometheus series, per (parent, child, partition).
//!
//! Each series belongs to the cursor running on the parent partition's owner: it is set while
//! the cursor runs and removed when the cursor stops, so a sum over nodes counts every
//! partition once. The one exception is counted by the sending node's child committer, per
//! child, for as long as the process runs: records the owner of a child partition on another
//! node already held ([`FanoutMetrics::commit_deduplicated`]).

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::family::MetricConstructor;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of every per-cursor series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CursorLabels {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
    /// Parent partition index.
    pub partition: u32,
}

/// Labels of the cursor-state series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
    /// Parent partition index.
    pub partition: u32,
    /// One of the cursor states.
    pub state: StateLabel,
}

/// Labels of the per-child series the child committer counts (not per cursor: a commit does
/// not know which parent its bucket came from).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ChildLabels {
    /// Child topic.
    pub child: String,
}

/// A cursor state as a label value.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StateLabel {
    /// Copying.
    running,
    /// Waiting for a delayed record to come due.
    waiting,
    /// Retrying after a plugin or commit failure.
    stalled,
    /// Paused by an operator.
    paused,
    /// Halted before records that aged out of the parent (`on_gap: halt`).
    halted,
}

/// Every fan-out series.
#[derive(Debug, Default)]
pub struct FanoutMetrics {
    /// `narad_fanout_lag_messages`: parent high watermark minus the cursor's next offset.
    pub lag_messages: Family<CursorLabels, Gauge<i64, AtomicI64>>,
    /// `narad_fanout_due_lag_seconds`: how far behind the due frontier the cursor runs.
    pub due_lag_seconds: Family<CursorLabels, Gauge<f64, AtomicU64>>,
    /// `narad_fanout_last_progress_timestamp_seconds`: when the cursor's position last moved
    /// or it last found nothing to copy (Unix seconds).
    pub(crate) last_progress: Family<CursorLabels, Gauge<f64, AtomicU64>>,
    /// `narad_fanout_child_dropped_messages`: records skipped because they aged out of the
    /// parent before the cursor reached them. A gauge so the series keeps the engine's exact
    /// name (Prometheus counters get a `_total` suffix); it only grows while the cursor runs.
    pub dropped_messages: Family<CursorLabels, Gauge<i64, AtomicI64>>,
    /// `narad_fanout_records_copied_total`: records committed to the child.
    pub(crate) records_copied: Family<CursorLabels, Counter>,
    /// `narad_fanout_slabs_total`: slabs fully committed (the offset file advanced).
    pub slabs: Family<CursorLabels, Counter>,
    /// `narad_fanout_commit_retries_total`: bucket commits that failed and were retried.
    pub commit_retries: Family<CursorLabels, Counter>,
    /// `narad_fanout_route_failures_total`: slabs the router chain could not route.
    pub route_failures: Family<CursorLabels, Counter>,
    /// `narad_fanout_cursor_rewinds_total`: start-ups that found the cursor ahead of what its
    /// child holds and moved it back.
    pub(crate) rewinds: Family<CursorLabels, Counter>,
    /// `narad_fanout_cursor_parent_end_rewinds_total`: times the cursor found its position
    /// past the parent's high watermark (the parent lost records it had copied) and moved
    /// back to the parent's end.
    pub parent_end_rewinds: Family<CursorLabels, Counter>,
    /// `narad_fanout_seek_skipped_records_total`: records an operator's forward seek skipped
    /// on purpose (never counted as dropped).
    pub(crate) seek_skipped: Family<CursorLabels, Counter>,
    /// `narad_fanout_dead_lettered_records_total`: records the router chain could not route
    /// that the cursor committed to the link's dead-letter topic instead of the child.
    pub(crate) dead_lettered: Family<CursorLabels, Counter>,
    /// `narad_fanout_remote_sent_bytes_total`: key, value and header bytes a remote child's
    /// target acknowledged (repeats after a failed slab included).
    pub(crate) remote_sent_bytes: Family<CursorLabels, Counter>,
    /// `narad_fanout_remote_send_failures_total`: requests to a remote child's target that
    /// were not acknowledged (no answer, or a refusal).
    pub(crate) remote_send_failures: Family<CursorLabels, Counter>,
    /// `narad_fanout_cursor_state`: 1 for the state the cursor is in, 0 for the others.
    pub state: Family<StateLabels, Gauge>,
    /// `narad_fanout_commit_deduplicated_records_total`: records of child commits sent to
    /// another node that its child partition already held (a retried commit whose first try
    /// was stored), so they were not stored again. Per child, on the sending node, never
    /// removed.
    pub(crate) commit_deduplicated: Family<ChildLabels, Counter>,
    /// `narad_fanout_peer_commits_in_flight`: child commits this node has sent to another
    /// node and not had answered, per that node (at most
    /// [`super::peer_calls::COMMITS_IN_FLIGHT_PER_PEER`]; held there while it hangs).
    pub(crate) peer_commits_in_flight: Family<PeerLabels, Gauge>,
    /// `narad_reconciler_pass_seconds`: how long each reconciler tick took, by what it did.
    pub(crate) reconciler_pass: PassFamily,
}

/// The reconciler-pass series (a newtype, for the `Default` a histogram family lacks).
#[derive(Clone, Debug)]
pub(crate) struct PassFamily(pub(crate) Family<PassLabels, Histogram, PassBuckets>);

impl Default for PassFamily {
    fn default() -> PassFamily {
        PassFamily(Family::new_with_constructor(PassBuckets))
    }
}

/// Labels of the reconciler-pass series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PassLabels {
    /// What the tick did.
    pub kind: PassKind,
}

/// What a reconciler tick did.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum PassKind {
    /// No metadata version moved and nothing was due: it compared nothing.
    skip,
    /// A full pass: every link compared with the running cursors.
    full,
    /// A full pass that also swept the partition directories for orphaned cursor files.
    sweep,
}

/// The reconciler-pass buckets: 10 us to about 10 s, by powers of 4.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PassBuckets;

impl MetricConstructor<Histogram> for PassBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            1e-5, 4.0, 11,
        ))
    }
}

/// Labels of the per-peer series: the other node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PeerLabels {
    /// The other node's id.
    pub node: String,
}

impl FanoutMetrics {
    /// Registers every series in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "narad_fanout_lag_messages",
            "Parent high watermark minus the cursor's next offset: records not yet copied to the child",
            self.lag_messages.clone(),
        );
        registry.register(
            "narad_fanout_due_lag_seconds",
            "Seconds the oldest due, uncopied record has waited past its due time (the health signal for delay children)",
            self.due_lag_seconds.clone(),
        );
        registry.register(
            "narad_fanout_last_progress_timestamp_seconds",
            "When the cursor's position last moved or it last found nothing to copy (Unix seconds); a cursor with records to copy that has not moved for 120 s is reported stalled",
            self.last_progress.clone(),
        );
        registry.register(
            "narad_fanout_child_dropped_messages",
            "Records skipped because they left the parent's retention before the cursor copied them (bounded loss: alert on any increase)",
            self.dropped_messages.clone(),
        );
        registry.register(
            "narad_fanout_records_copied",
            "Records committed to the child by the cursor",
            self.records_copied.clone(),
        );
        registry.register(
            "narad_fanout_slabs",
            "Slabs fully committed to the child (the cursor's offset file advanced past them)",
            self.slabs.clone(),
        );
        registry.register(
            "narad_fanout_commit_retries",
            "Child bucket commits that failed and were tried again",
            self.commit_retries.clone(),
        );
        registry.register(
            "narad_fanout_route_failures",
            "Slabs the link's router chain failed to route (the cursor stalls and retries)",
            self.route_failures.clone(),
        );
        registry.register(
            "narad_fanout_cursor_rewinds",
            "Cursor start-ups that found the offset ahead of what the child holds and moved it back",
            self.rewinds.clone(),
        );
        registry.register(
            "narad_fanout_cursor_parent_end_rewinds",
            "Times a cursor found its position past the parent's high watermark (the parent lost records the cursor had already copied, such as a torn tail cut at start-up) and moved back to the parent's end so records written again at those offsets are copied",
            self.parent_end_rewinds.clone(),
        );
        registry.register(
            "narad_fanout_seek_skipped_records",
            "Records an operator's forward seek of a paused cursor skipped on purpose (not counted as dropped)",
            self.seek_skipped.clone(),
        );
        registry.register(
            "narad_fanout_dead_lettered_records",
            "Records the router chain could not route that were committed, whole, to the link's dead-letter topic instead of the child",
            self.dead_lettered.clone(),
        );
        registry.register(
            "narad_fanout_remote_sent_bytes",
            "Key, value and header bytes a remote child's target acknowledged (repeats included)",
            self.remote_sent_bytes.clone(),
        );
        registry.register(
            "narad_fanout_remote_send_failures",
            "Requests to a remote child's target that were not acknowledged (no answer, or a refusal); the cursor retries",
            self.remote_send_failures.clone(),
        );
        registry.register(
            "narad_fanout_cursor_state",
            "1 for the state each cursor is in (running, waiting, stalled, paused, halted), 0 for the others",
            self.state.clone(),
        );
        registry.register(
            "narad_fanout_commit_deduplicated_records",
            "Records of child commits sent to another node that the child partition's owner already held (a retry of a commit it had stored) and did not store again",
            self.commit_deduplicated.clone(),
        );
        registry.register(
            "narad_reconciler_pass_seconds",
            "How long each reconciler tick took: skip (no metadata version moved), full (links compared with running cursors), sweep (a full pass that also looked for orphaned cursor files)",
            self.reconciler_pass.0.clone(),
        );
        registry.register(
            "narad_fanout_peer_commits_in_flight",
            "Child commits sent to another node and not answered yet, per node; stuck at the per-peer bound while that node hangs",
            self.peer_commits_in_flight.clone(),
        );
    }

    /// Removes every series of one cursor (it stopped, or its partition moved away).
    pub(crate) fn remove_cursor(&self, labels: &CursorLabels) {
        self.lag_messages.remove(labels);
        self.due_lag_seconds.remove(labels);
        self.last_progress.remove(labels);
        self.dropped_messages.remove(labels);
        self.records_copied.remove(labels);
        self.slabs.remove(labels);
        self.commit_retries.remove(labels);
        self.route_failures.remove(labels);
        self.rewinds.remove(labels);
        self.parent_end_rewinds.remove(labels);
        self.seek_skipped.remove(labels);
        self.dead_lettered.remove(labels);
        self.remote_sent_bytes.remove(labels);
        self.remote_send_failures.remove(labels);
        for state in [
            StateLabel::running,
            StateLabel::waiting,
            StateLabel::stalled,
            StateLabel::paused,
            StateLabel::halted,
        ] {
            self.state.remove(&StateLabels {
                parent: labels.parent.clone(),
                child: labels.child.clone(),
                partition: labels.partition,
                state,
            });
        }
    }
}
