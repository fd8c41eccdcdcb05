//! One partition's log: segment files of batch frames, a durable high-watermark file, and the
//! in-memory state that serves appends and reads.
//!
//! - `crc_combine`: the CRC of two byte runs joined, from theirs (for sealing frames).
//! - `format`: the batch frame (encode, seal, parse, decode).
//! - `hwm`: the fixed-size high-watermark file (durable boundary, clean-close flag).
//! - `start`: the log-start file (the oldest offset the log holds, moved only by retention).
//! - `torn`: torn tails cut by recovery, kept aside in `torn/` with a note.
//! - `segment`: segment naming and listing, the frame scanner, the sparse index.
//! - `recovery`: opening a log: scan, truncate a torn tail, or refuse with a corruption report.
//! - `writer`: append + `fdatasync` + verify, segment roll, failure handling, close.
//! - `reader`: reads by offset with record/byte limits and the commit-time gate.
//! - `read_buffers`: the store's pool of buffers large reads are lent.
//! - `retention`: deleting whole old segments by age and size.
//!
//! Concurrency. The writer state sits behind one mutex, the partition's produce lock, held for
//! the whole write + sync + verify. Readers never take it: they look at a separate `View` (the
//! segments and how many of their bytes are durable) under a short read lock, then read the
//! files without any lock. The writer publishes to the view only after a batch is durable and
//! verified, which is what keeps readers from ever seeing bytes past the high watermark.

pub(crate) mod crc_combine;
pub mod format;
pub mod hwm;
pub(crate) mod read_buffers;
pub(crate) mod reader;
pub(crate) mod recovery;
pub(crate) mod retention;
pub mod segment;
pub mod start;
pub mod torn;
pub(crate) mod writer;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::damage::{Damage, Failure};
use crate::error::StorageError;
use crate::fs::{File, FileSystem};
use crate::record::RecoveredCut;
use segment::SparseIndex;

/// What a log operation can fail with; the store turns these into [`StorageError`]s and
/// partition state changes.
#[derive(Debug)]
pub(crate) enum LogError {
    /// The log was closed (idle close) while the caller held it; reopen and retry.
    Closed,
    /// An fsync failure could not be undone; the partition must stop.
    Failed(Failure),
    /// Damage where acknowledged records live; the partition must be quarantined.
    Corrupt(Damage),
    /// Read below the log start offset.
    BelowStart { requested: u64, log_start: u64 },
    /// Read past the high watermark.
    BeyondEnd { requested: u64, high_watermark: u64 },
    /// An I/O error the log recovered from (the operation failed, the log is usable).
    Io(StorageError),
}

impl LogError {
    pub(crate) fn io(context: impl Into<String>, e: std::io::Error) -> Self {
        LogError::Io(StorageError::io(context, e))
    }

    /// The same error for another append of the same failed group commit (an I/O error is
    /// not `Clone`: its copy keeps the OS code, or the kind and the message).
    pub(crate) fn for_another(&self) -> Self {
        match self {
            LogError::Closed => LogError::Closed,
            LogError::Failed(f) => LogError::Failed(f.clone()),
            LogError::Corrupt(d) => LogError::Corrupt(d.clone()),
            LogError::BelowStart {
                requested,
                log_start,
            } => LogError::BelowStart {
                requested: *requested,
                log_start: *log_start,
            },
            LogError::BeyondEnd {
                requested,
                high_watermark,
            } => LogError::BeyondEnd {
                requested: *requested,
                high_watermark: *high_watermark,
            },
            LogError::Io(StorageError::Io { context, source }) => {
                let copy = match source.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                };
                LogError::io(context.clone(), copy)
            }
            LogError::Io(other) => LogError::io(
                "an append of the same group commit",
                std::io::Error::other(other.to_string()),
            ),
        }
    }
}

/// Why a writer stopped: the error every later append gets.
#[derive(Clone, Debug)]
pub(crate) enum Stopped {
    /// The device lost acknowledged records.
    Damaged(Damage),
    /// A failure could not be undone.
    Failed(Failure),
}

impl Stopped {
    /// The error an append gets from a stopped writer.
    pub(crate) fn error(&self) -> LogError {
        match self {
            Stopped::Damaged(d) => LogError::Corrupt(d.clone()),
            Stopped::Failed(f) => LogError::Failed(f.clone()),
        }
    }
}

/// A segment as readers see it.
#[derive(Clone, Debug)]
pub(crate) struct SegView {
    pub(crate) base: u64,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn File>,
    /// Durable, verified bytes: readers never look past this.
    pub(crate) len: u64,
    /// One past the last durable record of this segment.
    pub(crate) next_offset: u64,
    /// Newest commit time in the segment (`None` while empty).
    pub(crate) newest_committed_at_ms: Option<i64>,
    pub(crate) index: SparseIndex,
}

/// What readers see: the durable part of the log.
#[derive(Debug)]
pub(crate) struct View {
    /// Never empty: the last one is the active segment.
    pub(crate) segments: Vec<SegView>,
    /// The high watermark.
    pub(crate) next_offset: u64,
}

impl View {
    pub(crate) fn log_start(&self) -> u64 {
        self.segments.first().map_or(self.next_offset, |s| s.base)
    }
}

/// The writer's state, guarded by the produce lock.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) active: Arc<dyn File>,
    pub(crate) active_base: u64,
    pub(crate) active_len: u64,
    pub(crate) next_offset: u64,
    /// Floor for commit times: the newest the partition has committed.
    pub(crate) newest_committed_at_ms: i64,
    pub(crate) hwm_file: Option<Box<dyn File>>,
    /// When the high-watermark file was last written (or tried), on the store's clock.
    pub(crate) last_hwm_write_ms: i64,
    pub(crate) closed: bool,
    /// Why the writer stopped taking appends, once it has.
    pub(crate) failed: Option<Stopped>,
    /// A roll failed (its segment file may exist, empty): the next append rolls whatever its
    /// size, to the same base, so that file is used and never left behind with a base offset
    /// that later appends to the old segment would make wrong.
    pub(crate) roll_due: bool,
}

/// An open partition log.
#[derive(Debug)]
pub(crate) struct Log {
    pub(crate) dir: PathBuf,
    pub(crate) fs: Arc<dyn FileSystem>,
    pub(crate) writer: Mutex<Writer>,
    pub(crate) view: RwLock<View>,
    /// What recovery has cut off this log and kept aside, as found when it was opened.
    pub(crate) recovered_cut: Option<RecoveredCut>,
    /// Frames reads stopped inside, checked once for the life of this open log.
    pub(crate) frames: Mutex<reader::FrameMemo>,
    /// Appends waiting for the produce lock: the next holder writes them all with one
    /// `fdatasync` (a group commit).
    pub(crate) queue: Mutex<writer::AppendQueue>,
    /// The store's append and sync counts, shared by every log it opens.
    pub(crate) counters: Arc<AppendCounters>,
    /// The store's read-back buffers, shared by every log it opens.
    pub(crate) verify_buffers: Arc<writer::VerifyBuffers>,
    /// The store's buffers for large reads, shared by every log it opens.
    pub(crate) read_buffers: Arc<read_buffers::ReadBuffers>,
}

/// Appends and segment `fdatasync`s of every log of a store, and the appends waiting for a
/// produce lock now: `appends / syncs` is how many appends a group commit shares a sync among.
#[derive(Debug, Default)]
pub(crate) struct AppendCounters {
    pub(crate) appends: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) waiting: AtomicU64,
}

/// Figures for `peek` of an open log.
#[derive(Clone, Debug)]
pub(crate) struct OpenStats {
    pub(crate) log_start: u64,
    pub(crate) high_watermark: u64,
    pub(crate) size_bytes: u64,
    pub(crate) segment_count: u32,
    pub(crate) recovered_cut: Option<RecoveredCut>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a panic elsewhere; the guarded state is still consistent because
    // every update is published only after it is complete.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl Log {
    /// The current figures, without touching any file.
    pub(crate) fn stats(&self) -> OpenStats {
        let v = read(&self.view);
        OpenStats {
            log_start: v.log_start(),
            high_watermark: v.next_offset,
            size_bytes: v.segments.iter().map(|s| s.len).sum(),
            segment_count: u32::try_from(v.segments.len()).unwrap_or(u32::MAX),
            recovered_cut: self.recovered_cut.clone(),
        }
    }

    /// The high watermark.
    pub(crate) fn high_watermark(&self) -> u64 {
        read(&self.view).next_offset
    }
}
