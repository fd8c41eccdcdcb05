//! A running cursor's gap ledger (`narad_storage::cursor::gaps`): every range it moves past
//! without copying is written down, durably, before the offset file moves past it, and the
//! cursor's loss counters start from what the ledger holds, so a restart or a move does not
//! forget a loss.
//!
//! Written before the move, a range whose move then fails (or a crash in between) is on
//! record without having been skipped yet; the cursor skips it on its next try and records
//! it again, which adds nothing (the ledger counts a range once). So the ledger may run ahead
//! of the offset file by one range, never behind it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use narad_storage::cursor::gaps::{self, Gap, GapLedger, GapReason, GapsLoad};
use narad_storage::fs::FileSystem;
use narad_storage::{Clock, PartitionId};

use super::position::cursor_path;
use super::status::CursorStatus;
use super::{CursorDeps, CursorKey};
use crate::blocking::BlockingError;

/// Why the gap ledger could not be read or written; the cursor does not skip without it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GapBookError {
    /// Reading (or setting aside a damaged) ledger failed.
    #[error("reading the gap ledger: {0}")]
    Read(#[source] narad_storage::cursor::CursorError),
    /// Writing the ledger failed: nothing new is on record.
    #[error("writing the gap ledger: {0}")]
    Write(#[source] narad_storage::cursor::CursorError),
    /// The blocking task failed.
    #[error(transparent)]
    Task(#[from] BlockingError),
}

/// The ledger of one cursor, as on file.
pub(crate) struct GapBook {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    /// The node that records, in cluster mode.
    node: Option<String>,
    /// When a range is recorded.
    clock: Arc<dyn Clock>,
    ledger: Mutex<GapLedger>,
}

/// The ledger path of the cursor of `child` on `parent`: beside its offset file.
pub(crate) fn gaps_path(
    store: &narad_storage::Store,
    parent: &PartitionId,
    child: &str,
) -> PathBuf {
    cursor_path(store, parent, child).with_file_name(gaps::gaps_file_name(child))
}

impl GapBook {
    /// Reads the ledger of the cursor `key` and sets `status`'s loss counters from it. A ledger
    /// of another attach epoch is not this link's: the book starts empty (the file is replaced
    /// at the first range). A damaged file is set aside beside it, kept, and reported; the book
    /// starts empty.
    pub(crate) async fn open(
        deps: &CursorDeps,
        key: &CursorKey,
        status: &CursorStatus,
    ) -> Result<GapBook, GapBookError> {
        let parent = PartitionId::new(key.parent.clone(), key.partition);
        let path = gaps_path(&deps.store, &parent, &key.child);
        let (fs, read_path, now_ms) = (Arc::clone(&deps.fs), path.clone(), deps.clock.now_ms());
        let loaded = crate::blocking::run(move || {
            let loaded = gaps::load(fs.as_ref(), &read_path)?;
            if let GapsLoad::Damaged(reason) = &loaded {
                let aside = gaps::set_aside(fs.as_ref(), &read_path, now_ms)?;
                tracing::warn!(path = %read_path.display(), aside = %aside.display(), %reason,
                    "the cursor's gap ledger is damaged; kept aside, starting a new one (losses it \
                     held are no longer counted)");
            }
            Ok::<_, narad_storage::cursor::CursorError>(loaded)
        })
        .await?
        .map_err(GapBookError::Read)?;
        let ledger = match loaded {
            GapsLoad::Found(ledger) if ledger.epoch == key.epoch => ledger,
            _ => GapLedger::new(key.epoch.clone()),
        };
        status.set_gap_totals(ledger.lost(), ledger.skipped_by_seek());
        status.set_gaps(&ledger);
        Ok(GapBook {
            fs: Arc::clone(&deps.fs),
            path,
            node: deps.node.clone(),
            clock: Arc::clone(&deps.clock),
            ledger: Mutex::new(ledger),
        })
    }

    /// Writes `[from, to)` down for `reason`, durably; returns the records that adds (0 for a
    /// range already on record) and updates `status`. On error nothing is on record and the
    /// caller must not skip.
    pub(crate) async fn record(
        &self,
        from: u64,
        to: u64,
        reason: GapReason,
        status: &CursorStatus,
    ) -> Result<u64, GapBookError> {
        let mut next = self.ledger().clone();
        let added = next.add(Gap {
            from,
            to,
            reason,
            at_ms: self.clock.now_ms(),
            node: self.node.clone(),
        });
        if added == 0 {
            return Ok(0);
        }
        let (fs, path, written) = (Arc::clone(&self.fs), self.path.clone(), next.clone());
        crate::blocking::run(move || gaps::write(fs.as_ref(), &path, &written))
            .await?
            .map_err(GapBookError::Write)?;
        status.set_gap_totals(next.lost(), next.skipped_by_seek());
        status.set_gaps(&next);
        *self.ledger() = next;
        Ok(added)
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, GapLedger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
