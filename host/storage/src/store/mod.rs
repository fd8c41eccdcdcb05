//! The store: one data directory, its lock, and the partitions registered with it.
//!
//! Each partition has a slot that is `Closed`, `Open` (an open partition log), `Quarantined`,
//! `Failed` or `Sealed` (closed for a move to another node, still read: see
//! [`crate::transfer`]). Logs open lazily on the first read or append (recovery runs then), are closed
//! when idle, and are described by `peek` without being opened. A `watch` channel per
//! partition carries the high watermark so long-polls wake on appends instead of polling.
//!
//! A `Failed` partition is reopened by running recovery on new file descriptors. Those do not
//! see the writeback error that failed it (Linux reports one once per open file description),
//! and the page cache may still hold the failed bytes marked clean; before this was known, the
//! reopen trusted that cache and set the durable boundary past bytes the device never held (see
//! `log::writer`). Recovery now reads the last segment from the device whenever the log was not
//! closed cleanly, which is always the case after a failure. Opening the store also makes every
//! data-directory entry owner-only ([`crate::fs::FileSystem::restrict_tree`]).
//!
//! One `impl Store` per concern, each in its own file: `registry` (which partitions exist),
//! `open_logs` (opening, the open-log limit, slot changes on a log error), `append`,
//! `read` (reads and the long-poll), `describe` (what a partition holds without opening
//! it), `moves` (sealing and staging for a move to another node) and `upkeep` (retention,
//! idle close, close). This file holds the store's state and its opening.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::clock::{Clock, SystemClock};
use crate::damage::{Damage, Failure};
use crate::error::{Result, StorageError};
use crate::fs::{FileSystem, LockGuard, RealFs};
use crate::log::writer::CleanEnd;
use crate::log::{self, Log};
use crate::name::PartitionId;
use crate::record::{Appended, LogConfig};

mod append;
mod describe;
pub use describe::CLOSED_END_RECHECK;
mod moves;
mod open_logs;
mod read;
mod registry;
mod upkeep;

/// Name of the lock file in the data directory.
pub const LOCK_FILE_NAME: &str = "LOCK";
/// Directory under the data directory holding one directory per topic.
pub const TOPICS_DIR_NAME: &str = "topics";
/// Directory under the data directory where deleted topics are moved before removal. Its name
/// is not a valid place for a topic, so a half-deleted topic never looks live.
pub const TRASH_DIR_NAME: &str = "trash";
/// Default idle time after which a log is closed: 5 minutes, long enough that a partition read
/// every few seconds stays open, short enough that idle partitions release files and memory.
pub const DEFAULT_IDLE_CLOSE_AFTER: Duration = Duration::from_secs(300);
/// Default time a `Failed` partition stays stopped before its next use reopens it: 10 s, so a
/// disk that comes back (space freed, a path failed over) serves again without a restart, while
/// a disk that keeps failing is not hammered by every request.
pub const DEFAULT_FAILED_REOPEN_AFTER: Duration = Duration::from_secs(10);

/// How a store is wired.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The file system ([`RealFs`] by default; `fault::FaultFs` in tests).
    pub fs: Arc<dyn FileSystem>,
    /// The wall clock for commit times and idle tracking.
    pub clock: Arc<dyn Clock>,
    /// Logs not read or appended for this long are closed by [`Store::close_idle`].
    pub idle_close_after: Duration,
    /// A `Failed` partition used this long after it failed is reopened, running the same
    /// recovery as a restart would; until then every use gets the original error.
    pub failed_reopen_after: Duration,
}

impl std::fmt::Debug for dyn Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            fs: Arc::new(RealFs),
            clock: Arc::new(SystemClock),
            idle_close_after: DEFAULT_IDLE_CLOSE_AFTER,
            failed_reopen_after: DEFAULT_FAILED_REOPEN_AFTER,
        }
    }
}

/// What the watch channel of a partition says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    /// Not known yet (not opened since the store started).
    Unknown,
    /// The high watermark.
    Hw(u64),
    /// Quarantined, failed or deleted: waiters must stop and look at the slot.
    Broken,
}

#[derive(Debug)]
enum Slot {
    Closed,
    Open(Arc<Log>),
    Quarantined(Damage),
    Failed {
        reason: Failure,
        since: Instant,
    },
    /// Closed cleanly for a move to another node: refuses appends; reads go on from the
    /// closed log it keeps (its files no longer change).
    Sealed(Option<Arc<Log>>),
    Deleted,
}

#[derive(Debug)]
struct Partition {
    id: PartitionId,
    dir: PathBuf,
    config: Mutex<LogConfig>,
    slot: RwLock<Slot>,
    last_access_ms: AtomicI64,
    signal: watch::Sender<Signal>,
    /// Which registration of this partition this is ([`Store::incarnation`]).
    incarnation: u64,
    /// Where its log ended when this store last closed it cleanly; meaningful only while the
    /// slot is `Closed` ([`Store::known_high_watermark`]).
    closed_end: Mutex<Option<CleanEnd>>,
    /// When a `stat` last found `closed_end` still true (the store's clock, ms; `i64::MIN`:
    /// not since it closed), so [`Store::recent_high_watermark`] can answer without one.
    closed_end_checked_ms: AtomicI64,
}

impl Partition {
    /// Closes its open `log` (the caller then marks the slot `Closed`), keeping where the log
    /// ended when it closed cleanly.
    fn close_log(&self, log: &Log) -> Result<()> {
        let closed = log.close();
        *log::lock(&self.closed_end) = closed.as_ref().ok().and_then(|()| log.clean_end());
        self.closed_end_checked_ms
            .store(i64::MIN, Ordering::Relaxed);
        closed
    }

    fn config(&self) -> LogConfig {
        log::lock(&self.config).clone()
    }

    fn publish_hw(&self, hw: u64) {
        self.signal.send_if_modified(|s| match s {
            Signal::Hw(cur) if *cur >= hw => false,
            Signal::Broken => false,
            _ => {
                *s = Signal::Hw(hw);
                true
            }
        });
    }

    fn broken_error(&self, slot: &Slot) -> Option<StorageError> {
        match slot {
            Slot::Quarantined(reason) => Some(StorageError::Quarantined {
                id: self.id.clone(),
                reason: Box::new(reason.clone()),
            }),
            Slot::Failed { reason, .. } => Some(StorageError::Failed {
                id: self.id.clone(),
                reason: Box::new(reason.clone()),
            }),
            Slot::Deleted => Some(StorageError::UnknownPartition {
                id: self.id.clone(),
            }),
            Slot::Sealed(_) => Some(StorageError::Sealed {
                id: self.id.clone(),
            }),
            Slot::Closed | Slot::Open(_) => None,
        }
    }
}

/// The embedded partition store of one data directory. Share it as `Arc<Store>`; every method
/// but [`Store::wait_for_data`] does blocking file I/O. Dropping a store without
/// [`Store::close`] is handled like a crash: nothing acknowledged is lost, the next open of each
/// log recovers it, and until then `peek` reports no high watermark for it.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    fs: Arc<dyn FileSystem>,
    clock: Arc<dyn Clock>,
    idle_close_after_ms: i64,
    failed_reopen_after: Duration,
    partitions: RwLock<HashMap<PartitionId, Arc<Partition>>>,
    trash_counter: AtomicU64,
    /// Registrations made so far: each new one is a partition's next incarnation.
    registrations: AtomicU64,
    /// Whether appends write only the frame layout builds before null values and producer
    /// stamps read ([`Store::write_original_frames`]).
    original_frames: std::sync::atomic::AtomicBool,
    /// Appends and syncs of every log this store opens (see [`Store::append_stats`]).
    append_counters: Arc<log::AppendCounters>,
    /// Most logs open at once ([`Store::limit_open_logs`]; no limit until set).
    max_open_logs: AtomicUsize,
    /// Logs opened since the open ones were last counted, plus that count: an upper bound on
    /// the logs open now, so the count (a pass over every partition) runs only when it could
    /// be over the limit.
    open_logs_bound: AtomicUsize,
    /// Read-back buffers every open log shares.
    verify_buffers: Arc<log::writer::VerifyBuffers>,
    /// Buffers large reads of every open log are lent.
    read_buffers: Arc<log::read_buffers::ReadBuffers>,
    _lock: Box<dyn LockGuard>,
}

/// Why [`Store::append_encoded_in_order`] did not append every batch: the first `durable`
/// batches are durable, and `error` stopped the one after them (those after it were not
/// appended either).
#[derive(Debug, thiserror::Error)]
#[error("{error} ({durable} batches before it were appended)")]
pub struct InOrderError {
    /// How many batches, from the first, are durable.
    pub durable: usize,
    /// What each of those was assigned.
    pub appended: Vec<Appended>,
    /// What stopped the next one.
    pub error: StorageError,
}

/// What [`Store::append_stats`] reports: totals since the store was opened, across every
/// partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendStats {
    /// Appends written (each acknowledged or failed as a whole).
    pub appends: u64,
    /// Segment `fdatasync`s they took: fewer than `appends` when appends to one partition
    /// arrived together and shared one (a group commit).
    pub syncs: u64,
    /// Appends waiting for their partition's produce lock right now.
    pub waiting: u64,
}

/// Marks an unregistered partition deleted: its open log (if any) is dropped without touching
/// its files, and long-polls on it end.
fn retire(p: &Partition) {
    let mut slot = log::write(&p.slot);
    if let Slot::Open(log) = &*slot {
        log.abandon();
    }
    *slot = Slot::Deleted;
    p.signal.send_replace(Signal::Broken);
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StorageError {
    let context = context.into();
    move |e| StorageError::io(context, e)
}

impl Store {
    /// Opens a data directory (created if missing), taking an exclusive lock on `{dir}/LOCK`.
    /// A second opener, in this or another process, gets [`StorageError::DataDirLocked`]. No
    /// partition is opened or recovered here: logs open lazily.
    pub fn open(dir: &Path, opts: StoreOptions) -> Result<Store> {
        let fs = opts.fs;
        fs.create_dir_all(dir)
            .map_err(io(format!("creating the data directory {}", dir.display())))?;
        let lock_path = dir.join(LOCK_FILE_NAME);
        let lock = match fs.try_lock_exclusive(&lock_path) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(StorageError::DataDirLocked { path: lock_path });
            }
            Err(e) => {
                return Err(StorageError::io(
                    format!("locking {}", lock_path.display()),
                    e,
                ));
            }
        };
        for sub in [TOPICS_DIR_NAME, TRASH_DIR_NAME] {
            fs.create_dir_all(&dir.join(sub))
                .map_err(io(format!("creating {}", dir.join(sub).display())))?;
        }
        fs.sync_dir(dir)
            .map_err(io(format!("syncing {}", dir.display())))?;
        // Owner-only, whatever an older version or the umask left (issue 12): segments hold
        // records and the metastore may hold plugin secrets.
        match fs.restrict_tree(dir) {
            Ok(0) => {}
            Ok(n) => tracing::warn!(dir = %dir.display(), entries = n,
                "made data-directory entries owner-only (they were open to group or others)"),
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e,
                "could not make every data-directory entry owner-only"),
        }
        // Finish deletions a crash interrupted. What is in the trash is already gone from the
        // store's point of view, so a failure here is worth a warning, not a refusal to start.
        let trash = dir.join(TRASH_DIR_NAME);
        for entry in fs
            .read_dir(&trash)
            .map_err(io(format!("listing {}", trash.display())))?
        {
            let path = trash.join(&entry.name);
            let removed = if entry.is_dir {
                fs.remove_dir_all(&path)
            } else {
                fs.remove_file(&path)
            };
            if let Err(e) = removed {
                tracing::warn!(path = %path.display(), error = %e, "could not empty the trash");
            }
        }
        Ok(Store {
            dir: dir.to_path_buf(),
            fs,
            clock: opts.clock,
            idle_close_after_ms: i64::try_from(opts.idle_close_after.as_millis())
                .unwrap_or(i64::MAX),
            failed_reopen_after: opts.failed_reopen_after,
            partitions: RwLock::new(HashMap::new()),
            trash_counter: AtomicU64::new(0),
            registrations: AtomicU64::new(0),
            original_frames: std::sync::atomic::AtomicBool::new(false),
            append_counters: Arc::default(),
            max_open_logs: AtomicUsize::new(usize::MAX),
            open_logs_bound: AtomicUsize::new(0),
            verify_buffers: Arc::default(),
            read_buffers: Arc::default(),
            _lock: lock,
        })
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    fn topic_dir(&self, topic: &str) -> PathBuf {
        self.dir.join(TOPICS_DIR_NAME).join(topic)
    }

    fn partition(&self, id: &PartitionId) -> Result<Arc<Partition>> {
        log::read(&self.partitions)
            .get(id)
            .cloned()
            .ok_or_else(|| StorageError::UnknownPartition { id: id.clone() })
    }

    fn stamp(&self, p: &Partition) {
        p.last_access_ms
            .store(self.clock.now_ms(), Ordering::Relaxed);
    }
}
