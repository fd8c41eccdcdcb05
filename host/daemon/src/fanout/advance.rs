//! Step 5 of a slab, advance: the offset file moves past the slab, and only then.
//!
//! The offset file (`narad_storage::cursor`: one 256-byte write and one `fdatasync`) is the
//! cursor's durable position. It moves forward past a slab only with the [`Acknowledged`]
//! that [`super::commit::commit`] hands out once every bucket is acknowledged, so a crash
//! before the move repeats the slab (duplicates in the child, never a gap). It moves in two
//! other cases, neither of which can lose a record the parent still holds: past records that
//! aged out of the parent ([`OffsetFile::past_aged_out`]: they are gone, the cursor counts
//! them as dropped), and back to the parent's end when the parent lost records the cursor had
//! copied ([`OffsetFile::back_to_parent_end`]: backwards only, so duplicates at worst).
//!
//! A move past a slab may be [`Durability::Coalesced`]: the position is written at once and
//! synced only once [`super::FanoutTiming::offset_sync_every`] has passed since the last sync,
//! so one `fdatasync` covers every slab delivered meanwhile. Whatever is written, synced or
//! not, is a position past acknowledged slabs only: a power loss leaves an older one (more to
//! copy again), never a newer one. Every other move, and [`OffsetFile::flush`], is durable on
//! return.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use narad_storage::cursor::{CursorError, CursorFile};

use super::commit::Acknowledged;
use crate::blocking::BlockingError;

/// Why the offset file could not be moved; the cursor stalls with this text and tries again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdvanceError {
    /// Writing the new position to the offset file failed.
    #[error("advancing the offset file failed: {0}")]
    Write(#[source] CursorError),
    /// The task writing the offset file on the blocking pool did not return.
    #[error("offset-file task failed: {0}")]
    Task(#[from] BlockingError),
}

/// Whether a move past a slab must be durable when it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Synced before returning: the cursor is about to wait (idle, paused, stopping).
    Now,
    /// Written now, synced once the sync interval has passed since the last sync: the
    /// cursor is copying at full speed and the next move comes within a slab.
    Coalesced,
}

/// The file and when it was last made durable.
struct Synced {
    file: CursorFile,
    at: Instant,
}

/// A running cursor's offset file.
pub struct OffsetFile {
    file: Arc<Mutex<Synced>>,
    /// Longest a coalesced move stays unsynced.
    sync_every: Duration,
}

impl OffsetFile {
    /// The offset file `file`, opened (durably) at the cursor's start
    /// ([`super::position::open`]); coalesced moves are synced at most `sync_every` apart.
    pub fn new(file: CursorFile, sync_every: Duration) -> OffsetFile {
        OffsetFile {
            file: Arc::new(Mutex::new(Synced {
                file,
                at: Instant::now(),
            })),
            sync_every,
        }
    }

    /// The first parent offset not yet committed to the child, as the file holds it (written;
    /// a power loss now could leave an older one, see [`OffsetFile::flush`]).
    pub fn next_offset(&self) -> u64 {
        lock(&self.file).file.next_offset()
    }

    /// Moves the position past a slab every bucket of which is acknowledged, to `next_offset`
    /// (one past the slab's last record), durably now or coalesced with the next moves.
    pub(crate) async fn past_slab(
        &self,
        _every_bucket: &Acknowledged,
        next_offset: u64,
        durability: Durability,
    ) -> Result<(), AdvanceError> {
        let sync_every = self.sync_every;
        self.run(move |synced| {
            if durability == Durability::Now || synced.at.elapsed() >= sync_every {
                synced.file.advance(next_offset)?;
                synced.at = Instant::now();
            } else {
                synced.file.advance_unsynced(next_offset)?;
            }
            Ok(())
        })
        .await
    }

    /// Makes the position on file durable, if a coalesced move left it unsynced.
    pub(crate) async fn flush(&self) -> Result<(), AdvanceError> {
        if self.is_durable() {
            return Ok(());
        }
        self.run(|synced| {
            synced.file.sync()?;
            synced.at = Instant::now();
            Ok(())
        })
        .await
    }

    /// Whether the position on file is durable (nothing written since the last sync).
    fn is_durable(&self) -> bool {
        let synced = lock(&self.file);
        synced.file.durable_offset() == synced.file.next_offset()
    }

    /// Moves the position up to the parent's log start `log_start`: the records before it
    /// aged out before the cursor copied them.
    pub(crate) async fn past_aged_out(&self, log_start: u64) -> Result<(), AdvanceError> {
        self.write(log_start).await
    }

    /// Moves the position back to the parent's high watermark `high`: the parent lost records
    /// the cursor had copied, and the offsets it reuses for new records must be copied too.
    pub(crate) async fn back_to_parent_end(&self, high: u64) -> Result<(), AdvanceError> {
        self.write(high).await
    }

    /// Moves the position to `next_offset`, forward or back, on an operator's order (a seek
    /// of a paused cursor): records skipped forward are the operator's choice, not a loss.
    pub async fn seek(&self, next_offset: u64) -> Result<(), AdvanceError> {
        self.write(next_offset).await
    }

    /// Moves the position to `next_offset`, durably.
    async fn write(&self, next_offset: u64) -> Result<(), AdvanceError> {
        self.run(move |synced| {
            synced.file.advance(next_offset)?;
            synced.at = Instant::now();
            Ok(())
        })
        .await
    }

    /// Runs `step` on the file on the blocking pool.
    async fn run(
        &self,
        step: impl FnOnce(&mut Synced) -> Result<(), CursorError> + Send + 'static,
    ) -> Result<(), AdvanceError> {
        let file = Arc::clone(&self.file);
        crate::blocking::run(move || step(&mut lock(&file)))
            .await?
            .map_err(AdvanceError::Write)
    }
}

fn lock(file: &Mutex<Synced>) -> MutexGuard<'_, Synced> {
    // A panic inside a move leaves the position it had; the file itself is consistent.
    file.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_failed_offset_file_advance_stalls_with_the_same_reason_text() {
        let error = AdvanceError::Write(CursorError::Io {
            op: "fsync",
            path: PathBuf::from("/data/fanout-child.offset"),
            source: std::io::Error::other("disk gone"),
        });
        assert!(matches!(error, AdvanceError::Write(_)));
        assert_eq!(
            error.to_string(),
            "advancing the offset file failed: fsync /data/fanout-child.offset: disk gone"
        );
    }
}
