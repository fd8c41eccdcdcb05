//! A cursor's live status: what the children listing shows and the gauges export; and
//! [`FanoutView`], every running cursor's status on this node, which the reconciler keeps and
//! the API lists.
//!
//! `last_error` is the error of the trouble the cursor is in now: set when it stalls, and
//! cleared as soon as the cursor is healthy again (a slab committed, a read that found nothing
//! to do, its position opened or moved). The error it recovered from stays visible as
//! `previous_error`, with the time it was last seen, so an operator can still tell what
//! happened. Every error is escaped and cut by [`narad_runtime::text::sanitize`] before it is
//! stored: part of it may come from a plugin.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use narad_storage::cursor::gaps::GapLedger;

use super::CursorKey;
use super::metrics::{ChildLabels, CursorLabels, FanoutMetrics, StateLabel, StateLabels};

/// What a cursor is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CursorState {
    /// Copying, or idle at the parent's tail.
    Running,
    /// A delay cursor sleeping until its next record is due.
    Waiting,
    /// Retrying after a failure (plugin error, failing child commit, offset file I/O); the
    /// reason is in `last_error` until the cursor is healthy again. A stalled cursor never
    /// skips a record.
    Stalled,
    /// Paused by an operator (`POST .../pause`): its position is on file and it copies
    /// nothing until resumed; its lag keeps counting.
    Paused,
    /// Stopped before records it has not copied that aged out of the parent, on a link with
    /// `on_gap: halt`: `halted_gap` names them. It skips nothing until an operator accepts the
    /// loss (`resume --accept-gap`) or moves it (pause, seek).
    Halted,
    /// No report (only in a listing): the node that runs this cursor did not answer, or no
    /// cursor runs for the partition now (its parent partition is quarantined, has no live
    /// owner, or its cursor is starting); `last_error` says which.
    Unknown,
}

/// The records a halted cursor would lose: parent offsets `[from, to)`, gone from the parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltedGap {
    /// The cursor's position.
    pub from: u64,
    /// The parent's oldest record when the cursor last looked.
    pub to: u64,
}

/// How a remote child's cursor is doing, as its listing names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteState {
    /// Delivering, idle at the tail, waiting for a delayed record, or paused.
    Running,
    /// Stalled on a target that does not answer, fails (5xx) or sheds load (429): retried.
    Retrying,
    /// Stalled on a refusal (401/403, the topic gone, a record refused): retried every
    /// back-off, never skipped, until the target's side is fixed.
    Failed,
}

impl CursorReport {
    /// The listing's row for parent partition `partition` when no cursor reported it:
    /// state [`CursorState::Unknown`], `reason` in `last_error`, `node` the parent partition's
    /// owner when known.
    pub fn unknown(partition: u32, node: Option<String>, reason: String) -> CursorReport {
        CursorReport {
            partition,
            next_offset: None,
            lag_messages: None,
            due_lag_seconds: 0.0,
            dropped_messages: 0,
            parent_end_rewinds: 0,
            skipped_by_seek: 0,
            dead_lettered: 0,
            state: CursorState::Unknown,
            halted_gap: None,
            last_error: Some(reason),
            last_error_at_ms: None,
            previous_error: None,
            previous_error_at_ms: None,
            last_progress_at_ms: None,
            node,
            refused: false,
            remote_state: None,
            recovery_point: None,
        }
    }

    /// Fills the remote child's fields ([`CursorReport::remote_state`],
    /// [`CursorReport::recovery_point`]) from the cursor's state.
    pub(crate) fn mark_remote(&mut self) {
        self.remote_state = Some(match (self.state, self.refused) {
            (CursorState::Stalled, true) => RemoteState::Failed,
            (CursorState::Stalled, false) => RemoteState::Retrying,
            _ => RemoteState::Running,
        });
        self.recovery_point = self.next_offset;
    }
}

/// One cursor's figures, as the children listing reports them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CursorReport {
    /// Parent partition.
    pub partition: u32,
    /// First parent offset not yet committed to the child (`None` before the cursor has
    /// resolved its start).
    pub next_offset: Option<u64>,
    /// Parent high watermark minus `next_offset`.
    pub lag_messages: Option<u64>,
    /// Seconds the oldest due, uncopied record has waited past its due time.
    pub due_lag_seconds: f64,
    /// Records skipped because they aged out of the parent before being copied.
    pub dropped_messages: u64,
    /// Times this cursor found its position past the parent's high watermark (the parent lost
    /// records the cursor had already copied, such as a torn tail cut at start-up) and moved
    /// back to the parent's end, so records written again at those offsets are copied too.
    #[serde(default)]
    pub parent_end_rewinds: u64,
    /// Records operators' forward seeks skipped on purpose (not dropped).
    #[serde(default)]
    pub skipped_by_seek: u64,
    /// Records the router chain could not route that went to the link's dead-letter topic
    /// (since this cursor started).
    #[serde(default)]
    pub dead_lettered: u64,
    /// Running, waiting, stalled, paused or halted.
    pub state: CursorState,
    /// A halted cursor: the parent offsets it would lose by going on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_gap: Option<HaltedGap>,
    /// Why the cursor is stalled now; `None` once it is healthy again. Escaped and cut to
    /// [`MAX_ERROR_TEXT_BYTES`].
    pub last_error: Option<String>,
    /// When `last_error` was last recorded (Unix ms, this node's clock).
    #[serde(default)]
    pub last_error_at_ms: Option<i64>,
    /// The last error of the most recent trouble the cursor recovered from.
    #[serde(default)]
    pub previous_error: Option<String>,
    /// When `previous_error` was last recorded (Unix ms, this node's clock).
    #[serde(default)]
    pub previous_error_at_ms: Option<i64>,
    /// When the cursor's position last moved, or it last found nothing to copy (Unix ms, the
    /// node's clock).
    #[serde(default)]
    pub last_progress_at_ms: Option<i64>,
    /// Cluster mode: the node that runs this cursor (the parent partition's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The stall is a refusal by a remote child's target (its token, its topic gone, a record
    /// it will not take) that only a change there, or of the link, can lift.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// A remote child: `running`, `retrying` (stalled, the target away or overloaded) or
    /// `failed` (stalled on a refusal); absent for a local child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_state: Option<RemoteState>,
    /// A remote child: the offset a restart would resume from (the offset file's position).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_point: Option<u64>,
}

/// Longest error text the status keeps, in bytes (plus a cut marker): room for a message of
/// the daemon's own around two pieces of plugin text of
/// [`narad_runtime::text::MAX_PLUGIN_TEXT_BYTES`] each (a routing failure names the failure of
/// the slab and that of its poison record).
pub(crate) const MAX_ERROR_TEXT_BYTES: usize = 2048;

/// Milliseconds since the Unix epoch on this node's clock (0 if it is before 1970).
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[derive(Debug)]
struct Inner {
    next_offset: Option<u64>,
    high_watermark: Option<u64>,
    due_lag_seconds: f64,
    /// The slab being committed now: its oldest record's commit time and the link's delay,
    /// so the due lag keeps rising while the commit waits ([`CursorStatus::refresh`]).
    committing: Option<(i64, u64)>,
    dropped: u64,
    parent_end_rewinds: u64,
    skipped_by_seek: u64,
    dead_lettered: u64,
    /// The cursor's gap ledger as last written.
    gaps: Option<Arc<GapLedger>>,
    /// When the position last moved, or the cursor last found nothing to copy (monotonic,
    /// and the wall clock for the report).
    progress_at: std::time::Instant,
    progress_at_ms: i64,
    state: CursorState,
    /// The current stall is a remote target's refusal.
    refused: bool,
    /// What a halted cursor would lose.
    halted: Option<HaltedGap>,
    /// The current error and when it was recorded.
    last_error: Option<(String, i64)>,
    /// The last error of the previous trouble and when it was recorded.
    previous_error: Option<(String, i64)>,
}

/// Shared status of one cursor; every change also updates its metric series.
#[derive(Debug)]
pub struct CursorStatus {
    labels: CursorLabels,
    metrics: Arc<FanoutMetrics>,
    inner: Mutex<Inner>,
    /// An operator's seek waiting for the (paused) cursor to carry it out.
    seek: Mutex<Option<SeekOrder>>,
    /// Wakes the paused cursor when a seek is ordered.
    seek_ordered: tokio::sync::Notify,
}

/// An operator's order to move a paused cursor to `offset`, and where its answer goes.
#[derive(Debug)]
pub(crate) struct SeekOrder {
    /// The parent offset the cursor is to copy next.
    pub offset: u64,
    /// The outcome, or why the seek was refused.
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<SeekDone, SeekError>>,
}

/// Why an operator's seek was refused or failed; the cursor's position is unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeekError {
    /// The cursor is not paused.
    #[error("the cursor of parent partition {partition} is not paused; pause it first")]
    NotPaused {
        /// The parent partition.
        partition: u32,
    },
    /// The offset is outside the parent's records.
    #[error("offset {to} is outside the records {parent} holds: {start} to {high}")]
    OutOfRange {
        /// The parent partition.
        parent: narad_storage::PartitionId,
        /// The offset asked for.
        to: u64,
        /// The parent's log start.
        start: u64,
        /// Its high watermark.
        high: u64,
    },
    /// The skipped range could not be put on the gap ledger.
    #[error(transparent)]
    Gaps(#[from] super::gap_book::GapBookError),
    /// The new position could not be written.
    #[error(transparent)]
    Offsets(#[from] super::advance::AdvanceError),
}

/// A seek carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeekDone {
    /// The parent partition.
    pub partition: u32,
    /// The position before.
    pub from: u64,
    /// The position now (on file).
    pub to: u64,
    /// Records skipped (a forward seek); 0 for a backward one, whose records are copied again.
    pub skipped: u64,
}

impl CursorStatus {
    /// A fresh status for the cursor named by `labels`.
    pub fn new(labels: CursorLabels, metrics: Arc<FanoutMetrics>) -> CursorStatus {
        let status = CursorStatus {
            labels,
            metrics,
            seek: Mutex::new(None),
            seek_ordered: tokio::sync::Notify::new(),
            inner: Mutex::new(Inner {
                next_offset: None,
                high_watermark: None,
                due_lag_seconds: 0.0,
                committing: None,
                dropped: 0,
                parent_end_rewinds: 0,
                skipped_by_seek: 0,
                dead_lettered: 0,
                gaps: None,
                progress_at: std::time::Instant::now(),
                progress_at_ms: wall_clock_ms(),
                state: CursorState::Running,
                refused: false,
                halted: None,
                last_error: None,
                previous_error: None,
            }),
        };
        status.publish_state(CursorState::Running);
        status.publish_zeros();
        status
    }

    /// Creates the cursor's counters at 0, so its series exist from the start: a rule such
    /// as `increase(...) > 0` then sees the first event, not a series appearing.
    fn publish_zeros(&self) {
        let m = &self.metrics;
        let _ = m.dropped_messages.get_or_create(&self.labels);
        m.last_progress
            .get_or_create(&self.labels)
            .set(wall_clock_ms() as f64 / 1000.0);
        let _ = m.records_copied.get_or_create(&self.labels);
        let _ = m.slabs.get_or_create(&self.labels);
        let _ = m.commit_retries.get_or_create(&self.labels);
        let _ = m.route_failures.get_or_create(&self.labels);
        let _ = m.rewinds.get_or_create(&self.labels);
        let _ = m.parent_end_rewinds.get_or_create(&self.labels);
        let _ = m.seek_skipped.get_or_create(&self.labels);
        let _ = m.dead_lettered.get_or_create(&self.labels);
        // Zero for a local child, so every cursor has the same series.
        let _ = m.remote_sent_bytes.get_or_create(&self.labels);
        let _ = m.remote_send_failures.get_or_create(&self.labels);
        // Per child, not per cursor (the committer counts it), and never removed.
        let _ = m.commit_deduplicated.get_or_create(&ChildLabels {
            child: self.labels.child.clone(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere must not take the status (and the listing) down with it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The labels of this cursor's series.
    pub fn labels(&self) -> &CursorLabels {
        &self.labels
    }

    /// Records the cursor's durable position and the parent's high watermark.
    pub(crate) fn set_position(&self, next_offset: u64, high_watermark: u64) {
        let mut inner = self.lock();
        inner.progress_at = std::time::Instant::now();
        inner.progress_at_ms = wall_clock_ms();
        self.metrics
            .last_progress
            .get_or_create(&self.labels)
            .set(inner.progress_at_ms as f64 / 1000.0);
        inner.committing = None;
        inner.next_offset = Some(next_offset);
        inner.high_watermark = Some(high_watermark.max(next_offset));
        let lag = high_watermark.saturating_sub(next_offset);
        self.metrics
            .lag_messages
            .get_or_create(&self.labels)
            .set(i64::try_from(lag).unwrap_or(i64::MAX));
    }

    /// A slab whose oldest record was committed at `oldest_committed_at_ms` is being committed
    /// to the child (of a link with `delay_ms`); its due lag is set now and kept rising by
    /// [`CursorStatus::refresh`] until the cursor's position moves.
    pub(crate) fn committing(
        &self,
        oldest_committed_at_ms: Option<i64>,
        delay_ms: u64,
        now_ms: i64,
    ) {
        self.lock().committing = oldest_committed_at_ms.map(|at| (at, delay_ms));
        self.set_due_lag(super::gate::due_lag_seconds(
            oldest_committed_at_ms,
            delay_ms,
            now_ms,
        ));
    }

    /// Brings the lag series up to date without the cursor: the parent's high watermark as
    /// it is now, and the due lag of a slab still waiting for its commit. A cursor stalled on
    /// a dead child owner sets neither itself, and its lag must keep rising, or a lag alert
    /// never fires (the reconciler calls this every tick).
    pub(crate) fn refresh(
        &self,
        parent_high_watermark: Option<u64>,
        now_ms: i64,
        no_progress_after: std::time::Duration,
    ) {
        let (position, committing, parent_high_watermark) = {
            let inner = self.lock();
            // Unknown now (the parent's log is closed): the last one seen still holds, as
            // nothing appends to a closed log.
            (
                inner.next_offset,
                inner.committing,
                parent_high_watermark.or(inner.high_watermark),
            )
        };
        self.check_progress(parent_high_watermark, no_progress_after);
        if let (Some(next), Some(high)) = (position, parent_high_watermark) {
            let mut inner = self.lock();
            // Only forward: a position the cursor moved meanwhile wins.
            if inner.next_offset == Some(next) {
                let high = high.max(next).max(inner.high_watermark.unwrap_or(0));
                inner.high_watermark = Some(high);
                self.metrics
                    .lag_messages
                    .get_or_create(&self.labels)
                    .set(i64::try_from(high - next).unwrap_or(i64::MAX));
            }
        }
        if let Some((oldest, delay_ms)) = committing {
            self.set_due_lag(super::gate::due_lag_seconds(Some(oldest), delay_ms, now_ms));
        }
    }

    /// Reports a running cursor stalled when it has records to copy (`high` past its position)
    /// and its position has not moved for `after`: something it waits on does not return.
    /// Cleared as any stall is, once the cursor is healthy again.
    fn check_progress(&self, high: Option<u64>, after: std::time::Duration) {
        let idle_for = {
            let inner = self.lock();
            let has_work =
                matches!((inner.next_offset, high), (Some(next), Some(high)) if high > next);
            if inner.state != CursorState::Running || !has_work {
                return;
            }
            inner.progress_at.elapsed()
        };
        if idle_for < after {
            return;
        }
        self.stalled(format!(
            "no progress for {} s while records wait to be copied: a commit or read that does \
             not return (a hung child owner or disk?)",
            idle_for.as_secs()
        ));
    }

    /// Records how far behind the due frontier the cursor is.
    pub(crate) fn set_due_lag(&self, seconds: f64) {
        self.lock().due_lag_seconds = seconds;
        self.metrics
            .due_lag_seconds
            .get_or_create(&self.labels)
            .set(seconds);
    }

    /// Sets the records lost (`lost`: retention, re-creation) and skipped by seeks
    /// (`skipped`) to the totals of the cursor's gap ledger, which outlives the process.
    pub(crate) fn set_gap_totals(&self, lost: u64, skipped: u64) {
        let mut inner = self.lock();
        inner.dropped = lost;
        let more_skipped = skipped.saturating_sub(inner.skipped_by_seek);
        inner.skipped_by_seek += more_skipped;
        self.metrics
            .dropped_messages
            .get_or_create(&self.labels)
            .set(i64::try_from(lost).unwrap_or(i64::MAX));
        self.metrics
            .seek_skipped
            .get_or_create(&self.labels)
            .inc_by(more_skipped);
    }

    /// Keeps `ledger` (as just written) for [`CursorStatus::gaps`].
    pub(crate) fn set_gaps(&self, ledger: &GapLedger) {
        self.lock().gaps = Some(Arc::new(ledger.clone()));
    }

    /// The cursor's gap ledger; `None` before the cursor has read it.
    pub fn gaps(&self) -> Option<Arc<GapLedger>> {
        self.lock().gaps.clone()
    }

    /// Counts a fully committed slab of `records` records.
    pub(crate) fn slab_committed(&self, records: u64) {
        self.metrics
            .records_copied
            .get_or_create(&self.labels)
            .inc_by(records);
        self.metrics.slabs.get_or_create(&self.labels).inc();
    }

    /// Counts failed bucket commits that will be retried.
    pub(crate) fn commit_retried(&self, buckets: u64) {
        self.metrics
            .commit_retries
            .get_or_create(&self.labels)
            .inc_by(buckets);
    }

    /// Counts a slab the router could not route.
    pub(crate) fn route_failed(&self) {
        self.metrics
            .route_failures
            .get_or_create(&self.labels)
            .inc();
    }

    /// Counts a start-up rewind (the cursor was ahead of its child).
    pub(crate) fn rewound(&self) {
        self.metrics.rewinds.get_or_create(&self.labels).inc();
    }

    /// Counts a rewind to the parent's end (the cursor's position was past the parent's high
    /// watermark).
    pub(crate) fn rewound_to_parent_end(&self) {
        self.lock().parent_end_rewinds += 1;
        self.metrics
            .parent_end_rewinds
            .get_or_create(&self.labels)
            .inc();
    }

    /// Marks the cursor running: it is healthy, so the current error (if any) becomes the
    /// previous one.
    pub fn running(&self) {
        self.set_state(CursorState::Running, None);
    }

    /// Marks the cursor waiting for a delayed record (healthy, like [`CursorStatus::running`]).
    pub fn waiting(&self) {
        self.set_state(CursorState::Waiting, None);
    }

    /// Hands a seek to the cursor, which carries it out only while paused; answers at once
    /// when the cursor is not paused. A second order before the first is taken replaces it
    /// (the first one's caller gets an error).
    pub fn order_seek(
        &self,
        offset: u64,
    ) -> tokio::sync::oneshot::Receiver<Result<SeekDone, SeekError>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.lock().state != CursorState::Paused {
            let _ = reply.send(Err(SeekError::NotPaused {
                partition: self.labels.partition,
            }));
            return answer;
        }
        *self.seek.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(SeekOrder { offset, reply });
        self.seek_ordered.notify_waiters();
        answer
    }

    /// Completes once a seek is ordered after it was enabled (`Notified::enable`).
    pub(crate) fn seek_ordered(&self) -> tokio::sync::futures::Notified<'_> {
        self.seek_ordered.notified()
    }

    /// The seek waiting to be carried out, if any.
    pub(crate) fn take_seek(&self) -> Option<SeekOrder> {
        self.seek
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Counts what a remote child's target acknowledged (`bytes`), or one request it did not
    /// (`bytes` is `None`).
    pub(crate) fn remote_sent(&self, bytes: Option<u64>) {
        match bytes {
            Some(bytes) => {
                self.metrics
                    .remote_sent_bytes
                    .get_or_create(&self.labels)
                    .inc_by(bytes);
            }
            None => {
                self.metrics
                    .remote_send_failures
                    .get_or_create(&self.labels)
                    .inc();
            }
        }
    }

    /// Marks the cursor paused (healthy: a pause is no trouble).
    pub fn paused(&self) {
        self.set_state(CursorState::Paused, None);
    }

    /// Marks the cursor stalled, with the reason (escaped and cut to
    /// [`MAX_ERROR_TEXT_BYTES`]).
    pub fn stalled(&self, reason: String) {
        self.lock().refused = false;
        self.set_state(CursorState::Stalled, Some(reason));
    }

    /// [`CursorStatus::stalled`] on a remote target's refusal (see
    /// [`CursorReport::refused`]); cleared by the next stall for another reason, or once the
    /// cursor is healthy.
    pub(crate) fn stalled_refused(&self, reason: String) {
        self.lock().refused = true;
        self.set_state(CursorState::Stalled, Some(reason));
    }

    /// Counts `records` of a repeated slab the child already held, so not committed again
    /// (on `narad_fanout_commit_deduplicated_records_total`, with the repeats child partitions
    /// absorbed).
    pub(crate) fn repeats_dropped(&self, records: u64) {
        self.metrics
            .commit_deduplicated
            .get_or_create(&ChildLabels {
                child: self.labels.child.clone(),
            })
            .inc_by(records);
    }

    /// Counts a record committed to the link's dead-letter topic.
    pub(crate) fn dead_lettered(&self) {
        self.lock().dead_lettered += 1;
        self.metrics.dead_lettered.get_or_create(&self.labels).inc();
    }

    /// Marks the cursor halted before `gap` (a link with `on_gap: halt`), with the reason an
    /// operator reads.
    pub(crate) fn halted(&self, gap: HaltedGap, reason: String) {
        self.lock().halted = Some(gap);
        self.set_state(CursorState::Halted, Some(reason));
    }

    fn set_state(&self, state: CursorState, error: Option<String>) {
        let mut inner = self.lock();
        let changed = inner.state != state;
        inner.state = state;
        if state != CursorState::Halted {
            inner.halted = None;
        }
        match error {
            Some(reason) => {
                let shown = narad_runtime::text::sanitize(&reason, MAX_ERROR_TEXT_BYTES);
                inner.last_error = Some((shown, wall_clock_ms()));
            }
            None => {
                // Healthy again: the trouble is over, its error is history.
                inner.refused = false;
                if let Some(ended) = inner.last_error.take() {
                    inner.previous_error = Some(ended);
                }
            }
        }
        drop(inner);
        if changed {
            self.publish_state(state);
        }
    }

    fn publish_state(&self, state: CursorState) {
        for (label, value) in [
            (StateLabel::running, state == CursorState::Running),
            (StateLabel::waiting, state == CursorState::Waiting),
            (StateLabel::stalled, state == CursorState::Stalled),
            (StateLabel::paused, state == CursorState::Paused),
            (StateLabel::halted, state == CursorState::Halted),
        ] {
            self.metrics
                .state
                .get_or_create(&StateLabels {
                    parent: self.labels.parent.clone(),
                    child: self.labels.child.clone(),
                    partition: self.labels.partition,
                    state: label,
                })
                .set(i64::from(value));
        }
    }

    /// The cursor's figures for the children listing.
    pub fn report(&self) -> CursorReport {
        let inner = self.lock();
        CursorReport {
            partition: self.labels.partition,
            next_offset: inner.next_offset,
            lag_messages: match (inner.high_watermark, inner.next_offset) {
                (Some(high), Some(next)) => Some(high.saturating_sub(next)),
                _ => None,
            },
            due_lag_seconds: inner.due_lag_seconds,
            dropped_messages: inner.dropped,
            parent_end_rewinds: inner.parent_end_rewinds,
            skipped_by_seek: inner.skipped_by_seek,
            dead_lettered: inner.dead_lettered,
            state: inner.state,
            halted_gap: inner.halted,
            last_error: inner.last_error.as_ref().map(|(text, _)| text.clone()),
            last_error_at_ms: inner.last_error.as_ref().map(|&(_, at)| at),
            previous_error: inner.previous_error.as_ref().map(|(text, _)| text.clone()),
            previous_error_at_ms: inner.previous_error.as_ref().map(|&(_, at)| at),
            last_progress_at_ms: Some(inner.progress_at_ms),
            node: None,
            refused: inner.refused,
            remote_state: None,
            recovery_point: None,
        }
    }

    /// Removes the cursor's series (it stopped).
    pub(crate) fn retire(&self) {
        self.metrics.remove_cursor(&self.labels);
    }
}

/// The statuses of one link's cursors, by parent partition.
type LinkCursors = BTreeMap<u32, Arc<CursorStatus>>;

/// Live fan-out state this node exposes: per link, its cursors' reports.
///
/// The reconciler writes it (a cursor's status goes in when the cursor starts and out when it
/// stops or exits); the API only reads it, through [`FanoutView::reports`].
#[derive(Default)]
pub struct FanoutView {
    cursors: Mutex<BTreeMap<(String, String), LinkCursors>>,
    shadows: super::shadow::ShadowBoard,
}

impl FanoutView {
    /// The shadows running on this node (the reconciler lists them, the API reads reports).
    pub fn shadows(&self) -> &super::shadow::ShadowBoard {
        &self.shadows
    }

    /// Refreshes the lag series of every cursor on this node ([`CursorStatus::refresh`]),
    /// with each parent partition's high watermark from `high_watermark` (which must not
    /// open a log: `Store::peek`).
    pub(crate) fn refresh_lags(
        &self,
        high_watermark: impl Fn(&str, u32) -> Option<u64>,
        now_ms: i64,
        no_progress_after: std::time::Duration,
    ) {
        let statuses: Vec<(String, u32, Arc<CursorStatus>)> = {
            let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
            cursors
                .iter()
                .flat_map(|((parent, _), by_partition)| {
                    by_partition
                        .iter()
                        .map(|(p, s)| (parent.clone(), *p, Arc::clone(s)))
                })
                .collect()
        };
        for (parent, partition, status) in statuses {
            status.refresh(
                high_watermark(&parent, partition),
                now_ms,
                no_progress_after,
            );
        }
    }

    /// Reports of the cursors running for `parent -> child`, by parent partition.
    pub fn reports(&self, parent: &str, child: &str) -> Vec<CursorReport> {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .get(&(parent.to_string(), child.to_string()))
            .map(|by_partition| by_partition.values().map(|s| s.report()).collect())
            .unwrap_or_default()
    }

    /// The gap ledgers of the cursors running for `parent -> child`, by parent partition (a
    /// cursor that has not read its ledger yet is left out).
    pub fn gaps(&self, parent: &str, child: &str) -> Vec<(u32, Arc<GapLedger>)> {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .get(&(parent.to_string(), child.to_string()))
            .map(|by_partition| {
                by_partition
                    .iter()
                    .filter_map(|(p, s)| Some((*p, s.gaps()?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many cursors (of any link) read parent partition `partition` of `parent` now. A
    /// cursor leaves the view only after its task has ended, so 0 means none is running.
    pub(crate) fn running_on(&self, parent: &str, partition: u32) -> usize {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .iter()
            .filter(|((p, _), by_partition)| p == parent && by_partition.contains_key(&partition))
            .count()
    }

    /// The status of the cursor of `parent -> child` on parent partition `partition`, if one
    /// runs here.
    pub fn status(&self, parent: &str, child: &str, partition: u32) -> Option<Arc<CursorStatus>> {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .get(&(parent.to_string(), child.to_string()))
            .and_then(|by_partition| by_partition.get(&partition).cloned())
    }

    /// Lists the cursor `key` with its `status`, replacing any status listed for the same
    /// link and parent partition.
    pub fn insert(&self, key: &CursorKey, status: Arc<CursorStatus>) {
        let mut cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .entry((key.parent.clone(), key.child.clone()))
            .or_default()
            .insert(key.partition, status);
    }

    /// Stops listing the cursor of `key`'s link and parent partition; a link left with no
    /// cursor disappears from the view.
    pub fn remove(&self, key: &CursorKey) {
        let mut cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        let link = (key.parent.clone(), key.child.clone());
        if let Some(by_partition) = cursors.get_mut(&link) {
            by_partition.remove(&key.partition);
            if by_partition.is_empty() {
                cursors.remove(&link);
            }
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_remote_child_is_failed_only_while_stalled_on_a_refusal_and_resumes_where_its_file_says() {
        let status = CursorStatus::new(
            CursorLabels {
                parent: "orders".into(),
                child: "to-b".into(),
                partition: 0,
            },
            Arc::new(FanoutMetrics::default()),
        );
        status.set_position(40, 90);
        let state = |status: &CursorStatus| {
            let mut report = status.report();
            report.mark_remote();
            (report.remote_state, report.recovery_point)
        };
        assert_eq!(state(&status), (Some(RemoteState::Running), Some(40)));
        status.stalled("retrying: no answer".into());
        assert_eq!(state(&status).0, Some(RemoteState::Retrying));
        status.stalled_refused("failed: 404".into());
        assert_eq!(state(&status).0, Some(RemoteState::Failed));
        // Healthy again: the refusal is over.
        status.running();
        assert_eq!(state(&status).0, Some(RemoteState::Running));
        status.stalled("retrying: 503".into());
        assert_eq!(state(&status).0, Some(RemoteState::Retrying));
    }
    use super::*;

    fn status() -> CursorStatus {
        CursorStatus::new(
            CursorLabels {
                parent: "orders".into(),
                child: "copy".into(),
                partition: 0,
            },
            Arc::new(FanoutMetrics::default()),
        )
    }

    #[test]
    fn a_cursor_waiting_in_a_commit_has_its_lag_and_due_lag_kept_rising_until_it_moves() {
        let status = status();
        status.set_position(40, 40);
        // A delay-10 s slab whose oldest record was committed at t = 100 s, read at t = 115 s.
        status.committing(Some(100_000), 10_000, 115_000);
        assert_eq!(status.report().due_lag_seconds, 5.0);
        // The commit waits while the parent grows and time passes.
        status.refresh(Some(90), 145_000, crate::fanout::NO_PROGRESS_AFTER);
        let report = status.report();
        assert_eq!(report.lag_messages, Some(50));
        assert_eq!(report.due_lag_seconds, 35.0);
        // Once it moves, the cursor's own figures win again.
        status.set_position(60, 90);
        status.refresh(Some(95), 160_000, crate::fanout::NO_PROGRESS_AFTER);
        let report = status.report();
        assert_eq!(report.lag_messages, Some(35));
        assert_eq!(
            report.due_lag_seconds, 35.0,
            "no slab waits now: the due lag is not re-aged"
        );
    }

    #[test]
    fn a_running_cursor_with_work_that_does_not_move_is_reported_stalled_and_an_idle_one_is_not() {
        let bound = std::time::Duration::from_millis(20);
        let idle = status();
        idle.set_position(40, 40);
        let paused = status();
        paused.set_position(10, 40);
        paused.paused();
        let stuck = status();
        stuck.set_position(10, 40);
        stuck.refresh(Some(40), 0, bound);
        assert_eq!(stuck.report().state, CursorState::Running, "not yet");
        std::thread::sleep(bound * 2);
        for s in [&idle, &paused, &stuck] {
            s.refresh(Some(40), 0, bound);
        }
        assert_eq!(idle.report().state, CursorState::Running, "nothing to copy");
        assert_eq!(paused.report().state, CursorState::Paused);
        let report = stuck.report();
        assert_eq!(report.state, CursorState::Stalled);
        assert!(
            report
                .last_error
                .is_some_and(|e| e.starts_with("no progress for")),
        );
        // Moving again clears it, as any stall.
        stuck.set_position(20, 40);
        stuck.running();
        assert_eq!(stuck.report().last_error, None);
    }

    #[test]
    fn a_cursor_healthy_again_shows_no_current_error_and_keeps_it_as_previous() {
        let status = status();
        status.stalled("routing failed: plugin trapped".into());
        let stalled = status.report();
        assert_eq!(stalled.state, CursorState::Stalled);
        assert_eq!(
            stalled.last_error.as_deref(),
            Some("routing failed: plugin trapped")
        );
        assert!(stalled.last_error_at_ms.is_some());

        status.slab_committed(10);
        status.running();
        let recovered = status.report();
        assert_eq!(recovered.state, CursorState::Running);
        assert_eq!(recovered.last_error, None);
        assert_eq!(recovered.last_error_at_ms, None);
        assert_eq!(
            recovered.previous_error.as_deref(),
            Some("routing failed: plugin trapped")
        );
        assert_eq!(recovered.previous_error_at_ms, stalled.last_error_at_ms);

        // Idle reads while healthy keep the history as it is.
        status.running();
        assert_eq!(status.report().previous_error, recovered.previous_error);
    }

    #[test]
    fn an_error_is_stored_escaped_and_cut_to_the_cap() {
        let status = status();
        status.stalled(format!("a\nforged\0{}", "E".repeat(8 * 1024)));
        let shown = status.report().last_error.unwrap_or_default();
        assert!(shown.starts_with("a\\nforged\\0E"), "{shown:?}");
        assert!(!shown.chars().any(char::is_control));
        assert!(
            shown.len() <= MAX_ERROR_TEXT_BYTES + narad_runtime::text::CUT_MARKER_MAX_BYTES,
            "{} bytes",
            shown.len()
        );
    }

    #[test]
    fn a_rewind_to_the_parents_end_is_counted_in_the_report() {
        let status = status();
        status.rewound_to_parent_end();
        assert_eq!(status.report().parent_end_rewinds, 1);
    }
}
