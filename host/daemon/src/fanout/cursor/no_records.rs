//! A read that brought no records: idle at the tail, a delay child's record not due yet, a
//! position that aged out of the parent (skipped and counted, or halted on), or a parent that
//! got shorter under the cursor.

use std::time::Duration;

use narad_storage::StorageError;
use narad_storage::cursor::gaps::GapReason;

use super::{Cursor, CursorExit};
use crate::fanout::advance::OffsetFile;
use crate::fanout::gap_book::GapBook;
use crate::fanout::gate;
use crate::fanout::position::{self};
use crate::fanout::slab::{NoRecords, SlabError};
use crate::fanout::status::HaltedGap;

impl Cursor {
    /// A read that brought no records: idle at the parent's tail, a delay cursor's next
    /// record not due yet, or a position that aged out of the parent.
    pub(super) async fn nothing_to_copy(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        from: u64,
        delay_ms: u64,
        why: NoRecords,
    ) -> Result<(), CursorExit> {
        match why {
            NoRecords::Idle { high_watermark } => {
                self.healthy_at(from, high_watermark);
                Ok(())
            }
            NoRecords::NotDue {
                committed_at_ms,
                high_watermark,
            } => {
                self.wait_until_due(from, high_watermark, committed_at_ms, delay_ms)
                    .await
            }
            NoRecords::BelowLogStart { log_start } => {
                self.skip_aged_out(offsets, gaps, from, log_start).await
            }
        }
    }

    /// A read that failed: past the parent's end means the parent lost records the cursor
    /// had copied (it goes back to the end); anything else stalls and reads again later.
    pub(super) async fn read_failed(
        &self,
        offsets: &OffsetFile,
        from: u64,
        error: SlabError,
    ) -> Result<(), CursorExit> {
        match error {
            SlabError::Storage(StorageError::OffsetBeyondEnd { high_watermark, .. })
                if high_watermark < from =>
            {
                self.back_to_parent_end(offsets, from, high_watermark).await
            }
            error => {
                self.stall(format!("reading {} at {from} failed: {error}", self.parent))
                    .await
            }
        }
    }

    /// A delay cursor whose next record is not due: sleeps until it is (at most the timing's
    /// cap), then the loop reads again through the gate.
    pub(super) async fn wait_until_due(
        &self,
        from: u64,
        high_watermark: u64,
        committed_at_ms: i64,
        delay_ms: u64,
    ) -> Result<(), CursorExit> {
        self.status.set_position(from, high_watermark);
        self.status.set_due_lag(0.0);
        self.status.waiting();
        let now_ms = self.deps.clock.now_ms();
        let cap = self.deps.timing.delay_max_sleep;
        let wait = gate::sleep_until_due(committed_at_ms, delay_ms, now_ms, cap);
        // Wake at least a millisecond later so the gate has moved past the record.
        self.pause(wait.max(Duration::from_millis(1))).await
    }

    /// The position aged out of the parent: skip to its log start, counting the records lost,
    /// unless the link halts on a gap the operator has not accepted.
    pub(super) async fn skip_aged_out(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        from: u64,
        log_start: u64,
    ) -> Result<(), CursorExit> {
        if !self.current_link()?.may_skip_gap(self.key.partition, from) {
            return self.halt_before_gap(from, log_start).await;
        }
        let dropped = log_start.saturating_sub(from);
        tracing::warn!(parent = %self.parent, child = %self.key.child, from, to = log_start, dropped,
            "the cursor's position is below the parent's log start (records aged out by \
             retention, or the partition was re-created after a loss); skipping them, counted \
             as dropped");
        // On record before the move (see `gap_book`): never a skip that is not on record.
        if let Err(e) = gaps
            .record(from, log_start, GapReason::Retention, &self.status)
            .await
        {
            return self.stall(e.to_string()).await;
        }
        match offsets.past_aged_out(log_start).await {
            Ok(()) => {
                self.status.set_position(log_start, log_start);
                self.status.running();
                Ok(())
            }
            Err(e) => self.stall(e.to_string()).await,
        }
    }

    /// `on_gap: halt`: stays before the records `[from, log_start)` that aged out, reporting
    /// them, until the link changes (an acceptance, a pause, a new policy) or a back-off
    /// passes; the loop then reads again, so records restored in the parent are copied and
    /// nothing is skipped without the operator's word.
    pub(super) async fn halt_before_gap(
        &self,
        from: u64,
        log_start: u64,
    ) -> Result<(), CursorExit> {
        let gap = HaltedGap {
            from,
            to: log_start,
        };
        if self.status.report().halted_gap != Some(gap) {
            tracing::warn!(parent = %self.parent, child = %self.key.child, from, to = log_start,
                lost = log_start.saturating_sub(from),
                "halted: records the cursor has not copied aged out of the parent; the link \
                 halts on a gap, so nothing is skipped until an operator accepts it");
        }
        let changed = self.link.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        self.status.halted(
            gap,
            format!(
                "halted before parent offsets {from} to {log_start} ({} records): they aged out \
                 of {} before they were copied; accept the loss with `narad child resume {} {} \
                 --accept-gap`, or pause and seek",
                log_start.saturating_sub(from),
                self.parent,
                self.key.parent,
                self.key.child
            ),
        );
        tokio::select! {
            _ = tokio::time::sleep(self.deps.timing.retry_backoff) => Ok(()),
            _ = changed => Ok(()),
            _ = self.stop.wait() => Err(CursorExit::Stopped),
        }
    }

    /// The parent's log got shorter under the cursor (reopened after a crash or repair): go
    /// back to its end rather than wait for offsets it will reuse. Counted once it is
    /// durable: a failed write is retried on the next read.
    pub(super) async fn back_to_parent_end(
        &self,
        offsets: &OffsetFile,
        from: u64,
        high: u64,
    ) -> Result<(), CursorExit> {
        match offsets.back_to_parent_end(high).await {
            Ok(()) => {
                position::note_parent_end_rewind(from, high, &self.key, &self.status);
                self.status.set_position(high, high);
                self.status.running();
                Ok(())
            }
            Err(e) => self.stall(e.to_string()).await,
        }
    }
}
