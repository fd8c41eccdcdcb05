//! A paused cursor: its lag kept current while it waits, and operators' seeks carried out.

use std::sync::Arc;
use std::time::Duration;

use narad_storage::StorageError;
use narad_storage::cursor::gaps::GapReason;

use super::{Cursor, CursorExit};
use crate::fanout::advance::OffsetFile;
use crate::fanout::gap_book::GapBook;
use crate::fanout::status::SeekError;

/// How often a paused cursor refreshes its lag (records keep arriving in the parent). A
/// resume (the reconciler swaps the link's metadata in) and a seek wake it at once, so this
/// only bounds how stale a paused cursor's lag is: one blocking read a second per paused
/// cursor, not ten.
const PAUSED_LAG_EVERY: Duration = Duration::from_secs(1);

impl Cursor {
    /// Waits while the link has this cursor's partition paused, keeping its lag current
    /// (records keep arriving in the parent) and carrying out operators' seeks. Returns the
    /// position to go on from.
    pub(super) async fn while_paused(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        mut next: u64,
    ) -> Result<u64, CursorExit> {
        tracing::info!(parent = %self.parent, child = %self.key.child, next_offset = next, "cursor paused");
        self.status.paused();
        loop {
            // Armed before the check, so a resume or a seek between the check and the wait
            // still wakes it.
            let resumed = self.link.changed.notified();
            let seek = self.status.seek_ordered();
            tokio::pin!(resumed, seek);
            resumed.as_mut().enable();
            seek.as_mut().enable();
            if !self.current_link()?.paused.contains(&self.key.partition) {
                break;
            }
            let store = Arc::clone(&self.deps.store);
            let parent = self.parent.clone();
            let bounds = crate::blocking::run(move || {
                let high = store.high_watermark(&parent)?;
                let start = store.peek(&parent)?.log_start_offset;
                Ok::<_, StorageError>((start, high))
            })
            .await;
            if let Ok(Ok((start, high))) = bounds {
                self.status.set_position(next, high);
                if let Some(order) = self.status.take_seek() {
                    let done = self
                        .seek(offsets, gaps, next, order.offset, start, high)
                        .await;
                    if let Ok(done) = &done {
                        next = done.to;
                        self.status.set_position(next, high);
                    }
                    let _ = order.reply.send(done);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(PAUSED_LAG_EVERY) => {}
                _ = resumed => {}
                _ = seek => {}
                _ = self.stop.wait() => return Err(CursorExit::Stopped),
            }
        }
        tracing::info!(parent = %self.parent, child = %self.key.child, next_offset = next, "cursor resumed");
        self.status.running();
        Ok(next)
    }

    /// An operator's seek of this paused cursor from `from` to `to`, within the parent's
    /// records `[start, high]`: written to the offset file before it is reported done.
    async fn seek(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        from: u64,
        to: u64,
        start: u64,
        high: u64,
    ) -> Result<crate::fanout::status::SeekDone, SeekError> {
        if to < start || to > high {
            return Err(SeekError::OutOfRange {
                parent: self.parent.clone(),
                to,
                start,
                high,
            });
        }
        let skipped = to.saturating_sub(from);
        if skipped > 0 {
            // On record before the move: a crash in between leaves the range on record and
            // the position before it, and the skip is the operator's to order again.
            gaps.record(from, to, GapReason::Seek, &self.status).await?;
        }
        offsets.seek(to).await?;
        tracing::warn!(parent = %self.parent, child = %self.key.child, from, to, skipped,
            replayed = from.saturating_sub(to), "operator seek of a paused cursor: position moved on purpose");
        Ok(crate::fanout::status::SeekDone {
            partition: self.key.partition,
            from,
            to,
            skipped,
        })
    }
}
