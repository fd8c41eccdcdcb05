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

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use narad_storage::cursor::gaps::GapLedger;
use prometheus_client::metrics::gauge::Gauge;

use super::metrics::{ChildLabels, CursorLabels, FanoutMetrics, StateLabel, StateLabels};

mod report;
mod view;

pub use report::{CursorReport, CursorState, HaltedGap, RemoteState};
pub use view::FanoutView;

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
    /// The series an idle cursor sets every second, looked up once: a lookup hashes and
    /// compares the labels' strings in a family of every cursor, which thousands of idle
    /// cursors paid thousands of times a second. They are this cursor's until [`retire`]
    /// removes them, and the reconciler starts the next cursor of the same labels only after
    /// that.
    ///
    /// [`retire`]: CursorStatus::retire
    gauges: HotGauges,
    inner: Mutex<Inner>,
    /// An operator's seek waiting for the (paused) cursor to carry it out.
    seek: Mutex<Option<SeekOrder>>,
    /// Wakes the paused cursor when a seek is ordered.
    seek_ordered: tokio::sync::Notify,
}

/// Handles on a cursor's series that change every second ([`CursorStatus::gauges`]).
#[derive(Debug)]
struct HotGauges {
    lag_messages: Gauge<i64, AtomicI64>,
    due_lag_seconds: Gauge<f64, AtomicU64>,
    last_progress: Gauge<f64, AtomicU64>,
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
        let gauges = HotGauges {
            lag_messages: metrics.lag_messages.get_or_create(&labels).clone(),
            due_lag_seconds: metrics.due_lag_seconds.get_or_create(&labels).clone(),
            last_progress: metrics.last_progress.get_or_create(&labels).clone(),
        };
        let status = CursorStatus {
            labels,
            metrics,
            gauges,
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
        self.gauges
            .last_progress
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
        self.gauges
            .last_progress
            .set(inner.progress_at_ms as f64 / 1000.0);
        inner.committing = None;
        inner.next_offset = Some(next_offset);
        inner.high_watermark = Some(high_watermark.max(next_offset));
        let lag = high_watermark.saturating_sub(next_offset);
        self.gauges
            .lag_messages
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
                self.gauges
                    .lag_messages
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
        self.gauges.due_lag_seconds.set(seconds);
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

#[cfg(test)]
mod tests;
