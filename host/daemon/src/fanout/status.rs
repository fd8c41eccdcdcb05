//! A cursor's live status: what the children listing shows and the gauges export.

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::metrics::{CursorLabels, FanoutMetrics, StateLabel, StateLabels};

/// What a cursor is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CursorState {
    /// Copying, or idle at the parent's tail.
    Running,
    /// A delay cursor sleeping until its next record is due.
    Waiting,
    /// Retrying after a failure (plugin error, failing child commit, offset file I/O); the
    /// reason is in `last_error`. A stalled cursor never skips a record.
    Stalled,
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
    /// Running, waiting or stalled.
    pub state: CursorState,
    /// Why the cursor is stalled, or the last failure it recovered from.
    pub last_error: Option<String>,
}

#[derive(Debug)]
struct Inner {
    next_offset: Option<u64>,
    high_watermark: Option<u64>,
    due_lag_seconds: f64,
    dropped: u64,
    state: CursorState,
    last_error: Option<String>,
}

/// Shared status of one cursor; every change also updates its metric series.
#[derive(Debug)]
pub struct CursorStatus {
    labels: CursorLabels,
    metrics: Arc<FanoutMetrics>,
    inner: Mutex<Inner>,
}

impl CursorStatus {
    /// A fresh status for the cursor named by `labels`.
    pub fn new(labels: CursorLabels, metrics: Arc<FanoutMetrics>) -> CursorStatus {
        let status = CursorStatus {
            labels,
            metrics,
            inner: Mutex::new(Inner {
                next_offset: None,
                high_watermark: None,
                due_lag_seconds: 0.0,
                dropped: 0,
                state: CursorState::Running,
                last_error: None,
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
        let _ = m.records_copied.get_or_create(&self.labels);
        let _ = m.slabs.get_or_create(&self.labels);
        let _ = m.commit_retries.get_or_create(&self.labels);
        let _ = m.route_failures.get_or_create(&self.labels);
        let _ = m.rewinds.get_or_create(&self.labels);
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
    pub fn set_position(&self, next_offset: u64, high_watermark: u64) {
        let mut inner = self.lock();
        inner.next_offset = Some(next_offset);
        inner.high_watermark = Some(high_watermark.max(next_offset));
        let lag = high_watermark.saturating_sub(next_offset);
        self.metrics
            .lag_messages
            .get_or_create(&self.labels)
            .set(i64::try_from(lag).unwrap_or(i64::MAX));
    }

    /// Records how far behind the due frontier the cursor is.
    pub fn set_due_lag(&self, seconds: f64) {
        self.lock().due_lag_seconds = seconds;
        self.metrics
            .due_lag_seconds
            .get_or_create(&self.labels)
            .set(seconds);
    }

    /// Counts `count` records skipped by drop-behind.
    pub fn add_dropped(&self, count: u64) {
        let mut inner = self.lock();
        inner.dropped += count;
        self.metrics
            .dropped_messages
            .get_or_create(&self.labels)
            .set(i64::try_from(inner.dropped).unwrap_or(i64::MAX));
    }

    /// Counts a fully committed slab of `records` records.
    pub fn slab_committed(&self, records: u64) {
        self.metrics
            .records_copied
            .get_or_create(&self.labels)
            .inc_by(records);
        self.metrics.slabs.get_or_create(&self.labels).inc();
    }

    /// Counts failed bucket commits that will be retried.
    pub fn commit_retried(&self, buckets: u64) {
        self.metrics
            .commit_retries
            .get_or_create(&self.labels)
            .inc_by(buckets);
    }

    /// Counts a slab the router could not route.
    pub fn route_failed(&self) {
        self.metrics
            .route_failures
            .get_or_create(&self.labels)
            .inc();
    }

    /// Counts a start-up rewind (the cursor was ahead of its child).
    pub fn rewound(&self) {
        self.metrics.rewinds.get_or_create(&self.labels).inc();
    }

    /// Marks the cursor running (clears nothing: the last error stays visible).
    pub fn running(&self) {
        self.set_state(CursorState::Running, None);
    }

    /// Marks the cursor waiting for a delayed record.
    pub fn waiting(&self) {
        self.set_state(CursorState::Waiting, None);
    }

    /// Marks the cursor stalled, with the reason.
    pub fn stalled(&self, reason: String) {
        self.set_state(CursorState::Stalled, Some(reason));
    }

    fn set_state(&self, state: CursorState, error: Option<String>) {
        let mut inner = self.lock();
        let changed = inner.state != state;
        inner.state = state;
        if error.is_some() {
            inner.last_error = error;
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
            state: inner.state,
            last_error: inner.last_error.clone(),
        }
    }

    /// Removes the cursor's series (it stopped).
    pub fn retire(&self) {
        self.metrics.remove_cursor(&self.labels);
    }
}
