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
use crate::log::recovery::{self, OpenError};
use crate::log::retention::{self, Trimmed};
use crate::log::start::{self, Head};
use crate::log::{self, Log, LogError, hwm, segment, torn};
use crate::name::{MAX_PARTITION_INDEX, PartitionId, validate_topic_name};
use crate::record::{
    AppendBatch, Appended, EncodedBatch, LogConfig, PartitionState, PartitionStats, ReadOptions,
    ReadResult, RetentionReport, StampedBatch,
};
use crate::transfer::{self, Manifest, Staging};

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
}

impl Partition {
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

    /// Registers a partition and creates its directory durably (idempotent; an existing
    /// registration takes the new config).
    pub fn create_partition(&self, id: &PartitionId, config: LogConfig) -> Result<()> {
        self.register(id, config, true)
    }

    /// Registers a partition recorded earlier, whose directory must therefore exist (an
    /// existing registration takes the new config). A missing directory is never made again
    /// empty: the partition is registered quarantined ([`Damage::DirectoryMissing`]), refusing
    /// reads and appends, until an operator restores the directory or makes it to accept the
    /// loss, and the store is opened again.
    pub fn register_partition(&self, id: &PartitionId, config: LogConfig) -> Result<()> {
        self.register(id, config, false)
    }

    fn register(&self, id: &PartitionId, config: LogConfig, make_missing: bool) -> Result<()> {
        validate_topic_name(&id.topic)?;
        if id.partition > MAX_PARTITION_INDEX {
            return Err(StorageError::PartitionOutOfRange {
                partition: id.partition,
                max: MAX_PARTITION_INDEX,
            });
        }
        let topic_dir = self.topic_dir(&id.topic);
        let dir = topic_dir.join(id.dir_name());
        if let Some(p) = log::read(&self.partitions).get(id)
            && matches!(
                &*log::read(&p.slot),
                Slot::Quarantined(Damage::DirectoryMissing { .. })
            )
        {
            // Registered as lost: only a new store (after the operator acted) looks again.
            *log::lock(&p.config) = config;
            return Ok(());
        }
        let exists = self
            .fs
            .exists(&dir)
            .map_err(io(format!("checking {}", dir.display())))?;
        let missing =
            (!exists && !make_missing).then(|| Damage::DirectoryMissing { dir: dir.clone() });
        if !exists && missing.is_none() {
            self.fs
                .create_dir_all(&dir)
                .map_err(io(format!("creating {}", dir.display())))?;
            // Each new directory entry must be durable in its parent.
            for d in [topic_dir.as_path(), &self.dir.join(TOPICS_DIR_NAME)] {
                self.fs
                    .sync_dir(d)
                    .map_err(io(format!("syncing {}", d.display())))?;
            }
        }
        let mut map = log::write(&self.partitions);
        match map.get(id) {
            Some(p) => *log::lock(&p.config) = config,
            None => {
                let (signal, _) = watch::channel(if missing.is_some() {
                    Signal::Broken
                } else {
                    Signal::Unknown
                });
                if let Some(damage) = &missing {
                    tracing::error!(partition = %id, reason = %damage, "partition quarantined");
                }
                map.insert(
                    id.clone(),
                    Arc::new(Partition {
                        id: id.clone(),
                        dir,
                        config: Mutex::new(config),
                        slot: RwLock::new(match missing {
                            Some(damage) => Slot::Quarantined(damage),
                            None => Slot::Closed,
                        }),
                        last_access_ms: AtomicI64::new(self.clock.now_ms()),
                        signal,
                        incarnation: self.registrations.fetch_add(1, Ordering::Relaxed),
                    }),
                );
            }
        }
        Ok(())
    }

    /// A number that changes each time `id` is registered anew (after it was forgotten or
    /// removed, such as a partition that moved to another node and back), `None` while it is
    /// not registered. What a caller keeps about a partition's log (an idempotent producer's
    /// recent batches) is stale once this differs from when it was learned.
    pub fn incarnation(&self, id: &PartitionId) -> Option<u64> {
        log::read(&self.partitions).get(id).map(|p| p.incarnation)
    }

    /// Whether `id` is registered (by [`Store::create_partition`]) and not deleted.
    pub fn has_partition(&self, id: &PartitionId) -> bool {
        log::read(&self.partitions).contains_key(id)
    }

    /// Replaces a registered partition's config (retention, segment size).
    pub fn set_config(&self, id: &PartitionId, config: LogConfig) -> Result<()> {
        *log::lock(&self.partition(id)?.config) = config;
        Ok(())
    }

    /// The topics that have at least one registered partition, sorted.
    pub fn registered_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = log::read(&self.partitions)
            .keys()
            .map(|id| id.topic.clone())
            .collect();
        topics.sort();
        topics.dedup();
        topics
    }

    /// Every registered partition, sorted.
    pub fn registered_partitions(&self) -> Vec<PartitionId> {
        let mut ids: Vec<PartitionId> = log::read(&self.partitions).keys().cloned().collect();
        ids.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        ids
    }

    /// Unregisters partition `id`, closing its log, and leaves its directory on disk as it is
    /// (for the caller to set aside). Unknown partitions are not an error.
    pub fn forget_partition(&self, id: &PartitionId) {
        let victim = log::write(&self.partitions).remove(id);
        if let Some(p) = victim {
            retire(&p);
        }
    }

    /// Unregisters every partition of `topic`, closing its open logs, and leaves its directory
    /// on disk as it is (for the caller to set aside). Unknown topics are not an error.
    pub fn forget_topic(&self, topic: &str) {
        let victims: Vec<Arc<Partition>> = {
            let mut map = log::write(&self.partitions);
            let ids: Vec<PartitionId> = map.keys().filter(|k| k.topic == topic).cloned().collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        for p in victims {
            retire(&p);
        }
    }

    /// Unregisters every partition of `topic` and removes `topics/{topic}`: the directory is
    /// first renamed into the trash directory (durably), then removed, so a crash never leaves
    /// a half-deleted topic in place. Deleting a topic with no directory is not an error.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        validate_topic_name(topic)?;
        self.forget_topic(topic);
        let dir = self.topic_dir(topic);
        if !self
            .fs
            .exists(&dir)
            .map_err(io(format!("checking {}", dir.display())))?
        {
            return Ok(());
        }
        self.trash(&dir, topic, &self.dir.join(TOPICS_DIR_NAME))
    }

    /// Removes directory `dir` (whose parent is `parent`) through the trash: renamed there
    /// under `label` durably first, so a crash never leaves it half deleted in place (the
    /// trash is emptied at the next open), then removed.
    fn trash(&self, dir: &Path, label: &str, parent: &Path) -> Result<()> {
        let n = self.trash_counter.fetch_add(1, Ordering::Relaxed);
        let trash = self
            .dir
            .join(TRASH_DIR_NAME)
            .join(format!("{label}.{}.{n}", self.clock.now_ms()));
        self.fs.rename(dir, &trash).map_err(io(format!(
            "moving {} to {}",
            dir.display(),
            trash.display()
        )))?;
        for d in [parent.to_path_buf(), self.dir.join(TRASH_DIR_NAME)] {
            self.fs
                .sync_dir(&d)
                .map_err(io(format!("syncing {}", d.display())))?;
        }
        self.fs
            .remove_dir_all(&trash)
            .map_err(io(format!("removing {}", trash.display())))
    }

    /// Seals `id` for a move to another node: its log is closed cleanly (opened and recovered
    /// first if it was closed after a crash, so the high-watermark file is exact), an append in
    /// flight finishes first, and from then on appends get [`StorageError::Sealed`] and
    /// long-polls on it end, while reads go on from the closed log. Idempotent. A quarantined or failed
    /// partition cannot be sealed (it could not be copied faithfully): its error is returned.
    pub fn seal(&self, id: &PartitionId) -> Result<()> {
        let p = self.partition(id)?;
        if matches!(*log::read(&p.slot), Slot::Sealed(_)) {
            return Ok(());
        }
        // Recovery runs on open: a log left by a crash gets an exact end before it is closed.
        let opened = self.open_log(&p)?;
        let mut slot = log::write(&p.slot);
        let kept = match &*slot {
            Slot::Sealed(_) => return Ok(()),
            Slot::Open(l) => {
                l.close()?;
                Arc::clone(l)
            }
            // Closed for idleness in between: that close wrote the same clean end.
            Slot::Closed => opened,
            other => {
                return Err(p
                    .broken_error(other)
                    .unwrap_or(StorageError::LogClosed { id: id.clone() }));
            }
        };
        *slot = Slot::Sealed(Some(kept));
        p.signal.send_replace(Signal::Broken);
        tracing::info!(partition = %id, "partition sealed for a move");
        Ok(())
    }

    /// Ends a seal whose move was cancelled: the partition serves again (its log reopens on
    /// the next use). Not sealed: nothing to do.
    pub fn unseal(&self, id: &PartitionId) -> Result<()> {
        let p = self.partition(id)?;
        let mut slot = log::write(&p.slot);
        if matches!(*slot, Slot::Sealed(_)) {
            *slot = Slot::Closed;
            tracing::info!(partition = %id, "partition unsealed: its move was cancelled");
        }
        Ok(())
    }

    /// Whether `id` is registered and sealed.
    pub fn is_sealed(&self, id: &PartitionId) -> bool {
        self.partition(id)
            .map(|p| matches!(*log::read(&p.slot), Slot::Sealed(_)))
            .unwrap_or(false)
    }

    /// The registered partitions that are sealed.
    pub fn sealed_partitions(&self) -> Vec<PartitionId> {
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        parts
            .into_iter()
            .filter(|p| matches!(*log::read(&p.slot), Slot::Sealed(_)))
            .map(|p| p.id.clone())
            .collect()
    }

    fn sealed(&self, id: &PartitionId) -> Result<Arc<Partition>> {
        let p = self.partition(id)?;
        if !matches!(*log::read(&p.slot), Slot::Sealed(_)) {
            return Err(StorageError::NoSuchFile {
                id: id.clone(),
                name: "(the partition is not sealed for a move)".to_owned(),
            });
        }
        Ok(p)
    }

    /// Every file of sealed partition `id`, with its length and CRC-32C, and the log's end.
    pub fn manifest(&self, id: &PartitionId) -> Result<Manifest> {
        let p = self.sealed(id)?;
        let files = transfer::describe(self.fs.as_ref(), &p.dir)?;
        let end = hwm::read(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the high-watermark file of {id}")))?
            .filter(|h| h.clean)
            .ok_or_else(|| StorageError::HighWatermarkUnknown { id: id.clone() })?;
        Ok(Manifest {
            files,
            high_watermark: end.next_offset,
        })
    }

    /// At most `max` bytes (capped at [`transfer::MAX_CHUNK_BYTES`]) of file `name` of sealed
    /// partition `id`, from `offset`.
    pub fn read_sealed_file(
        &self,
        id: &PartitionId,
        name: &str,
        offset: u64,
        max: u64,
    ) -> Result<Vec<u8>> {
        let p = self.sealed(id)?;
        transfer::read_chunk(self.fs.as_ref(), id, &p.dir, name, offset, max)
    }

    /// Starts receiving partition `id` from another node ([`Staging`]); it must not be
    /// registered here.
    pub fn stage(&self, id: &PartitionId) -> Result<Staging> {
        validate_topic_name(&id.topic)?;
        let target = self.topic_dir(&id.topic).join(id.dir_name());
        Staging::begin(Arc::clone(&self.fs), &self.dir, id, target)
    }

    /// Unregisters partition `id` and removes its directory (through the trash, durably, as
    /// [`Store::delete_topic`] does): for the old copy of a partition whose move has ended.
    /// Unknown partitions are not an error.
    pub fn remove_partition(&self, id: &PartitionId) -> Result<()> {
        validate_topic_name(&id.topic)?;
        self.forget_partition(id);
        let dir = self.topic_dir(&id.topic).join(id.dir_name());
        if !self
            .fs
            .exists(&dir)
            .map_err(io(format!("checking {}", dir.display())))?
        {
            return Ok(());
        }
        let label = format!("{}.{}", id.topic, id.dir_name());
        self.trash(&dir, &label, &self.topic_dir(&id.topic))
    }

    /// The open log of a partition, opening (and recovering) it if closed, or if it failed at
    /// least `failed_reopen_after` ago.
    fn open_log(&self, p: &Partition) -> Result<Arc<Log>> {
        {
            let slot = log::read(&p.slot);
            if let Slot::Open(l) = &*slot {
                return Ok(l.clone());
            }
            if !self.may_reopen(&slot)
                && let Some(e) = p.broken_error(&slot)
            {
                return Err(e);
            }
        }
        let mut slot = log::write(&p.slot);
        if let Slot::Open(l) = &*slot {
            return Ok(l.clone());
        }
        let reopening = self.may_reopen(&slot);
        if reopening {
            // The same recovery a restart runs, for this partition alone: the log on disk is
            // scanned and cut back to its last intact frame. If the disk still fails, the
            // partition fails again (and waits again) or the open reports the I/O error.
            tracing::warn!(partition = %p.id, "reopening a failed partition");
            *slot = Slot::Closed;
        } else if let Some(e) = p.broken_error(&slot) {
            return Err(e);
        }
        let opened = match recovery::open(self.fs.clone(), &p.dir, self.clock.as_ref()) {
            Ok(mut l) => {
                l.counters = Arc::clone(&self.append_counters);
                l.verify_buffers = Arc::clone(&self.verify_buffers);
                l.read_buffers = Arc::clone(&self.read_buffers);
                let l = Arc::new(l);
                *slot = Slot::Open(l.clone());
                let hw = l.high_watermark();
                if *p.signal.borrow() == Signal::Broken {
                    // A failed partition back in service (now, or after a reopen whose recovery
                    // hit an I/O error): waiters were told "broken" and may wait again.
                    p.signal.send_replace(Signal::Hw(hw));
                    tracing::info!(partition = %p.id, high_watermark = hw,
                        "failed partition reopened and serving");
                } else {
                    p.publish_hw(hw);
                }
                Ok(l)
            }
            Err(OpenError::Corrupt(reason)) => {
                tracing::error!(partition = %p.id, %reason, "partition quarantined");
                *slot = Slot::Quarantined(reason.clone());
                p.signal.send_replace(Signal::Broken);
                Err(StorageError::Quarantined {
                    id: p.id.clone(),
                    reason: Box::new(reason),
                })
            }
            Err(OpenError::Io(e)) => Err(self.log_error(p, e)),
        };
        drop(slot);
        if opened.is_ok() {
            self.keep_open_logs_within_limit(&p.id);
        }
        opened
    }

    /// Caps the logs open at once at `max` (each holds descriptors: its segment and
    /// high-watermark files). Opening one more closes the least recently used others, down to
    /// nine tenths of `max`, as idle closing would; they reopen on their next use. A request
    /// naming thousands of partitions then cannot take every descriptor the daemon has.
    pub fn limit_open_logs(&self, max: usize) {
        self.max_open_logs.store(max.max(1), Ordering::Relaxed);
    }

    /// After `opened` was opened: when the logs open could be over the limit, counts them and
    /// closes the least recently used (never `opened`) down to nine tenths of it.
    fn keep_open_logs_within_limit(&self, opened: &PartitionId) {
        let max = self.max_open_logs.load(Ordering::Relaxed);
        if self.open_logs_bound.fetch_add(1, Ordering::Relaxed) < max {
            return;
        }
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let mut open: Vec<(i64, Arc<Partition>)> = parts
            .into_iter()
            .filter(|p| &p.id != opened)
            .filter(|p| matches!(p.slot.try_read().as_deref(), Ok(Slot::Open(_))))
            .map(|p| (p.last_access_ms.load(Ordering::Relaxed), p))
            .collect();
        let target = (max / 10 * 9).max(1);
        // `opened` is open too.
        let counted = open.len() + 1;
        let excess = counted.saturating_sub(target);
        open.sort_by_key(|(at, _)| *at);
        let mut closed = 0;
        for (_, p) in open.into_iter().take(excess) {
            // A log busy right now is left open; the next pass finds it idle.
            let Ok(mut slot) = p.slot.try_write() else {
                continue;
            };
            if let Slot::Open(l) = &*slot {
                if let Err(e) = l.close() {
                    tracing::warn!(partition = %p.id, error = %e, "closing a log to stay within the open-log limit failed");
                }
                *slot = Slot::Closed;
                closed += 1;
            }
        }
        self.open_logs_bound
            .store(counted - closed, Ordering::Relaxed);
        if closed > 0 {
            tracing::debug!(
                closed,
                max,
                "closed the least recently used logs to stay within the open-log limit"
            );
        }
    }

    /// Whether `slot` is a failed partition whose wait before a reopen is over.
    fn may_reopen(&self, slot: &Slot) -> bool {
        matches!(slot, Slot::Failed { since, .. } if since.elapsed() >= self.failed_reopen_after)
    }

    /// Turns a log error into the caller's error, moving the partition to `Quarantined` or
    /// `Failed` when the error demands it.
    fn log_error(&self, p: &Partition, e: LogError) -> StorageError {
        match e {
            LogError::Io(e) => e,
            LogError::BelowStart {
                requested,
                log_start,
            } => StorageError::OffsetBelowLogStart {
                id: p.id.clone(),
                requested,
                log_start,
            },
            LogError::BeyondEnd {
                requested,
                high_watermark,
            } => StorageError::OffsetBeyondEnd {
                id: p.id.clone(),
                requested,
                high_watermark,
            },
            LogError::Closed => StorageError::LogClosed { id: p.id.clone() },
            LogError::Corrupt(reason) => {
                tracing::error!(partition = %p.id, %reason, "partition quarantined");
                let mut slot = log::write(&p.slot);
                if let Slot::Open(l) = &*slot {
                    l.abandon();
                }
                *slot = Slot::Quarantined(reason.clone());
                p.signal.send_replace(Signal::Broken);
                StorageError::Quarantined {
                    id: p.id.clone(),
                    reason: Box::new(reason),
                }
            }
            LogError::Failed(reason) => {
                let mut slot = log::write(&p.slot);
                if let Slot::Open(l) = &*slot {
                    // Nobody may append through it again; a reopen builds a new log.
                    l.abandon();
                }
                *slot = Slot::Failed {
                    reason: reason.clone(),
                    since: Instant::now(),
                };
                p.signal.send_replace(Signal::Broken);
                StorageError::Failed {
                    id: p.id.clone(),
                    reason: Box::new(reason),
                }
            }
        }
    }

    /// Appends a batch: encode, then under the partition's produce lock write, `fdatasync` and
    /// read back; returns only once the batch is durable. The commit time is stamped just
    /// before the produce lock and raised under it to the partition's newest commit time, so
    /// it never decreases. Opens the log if closed. An empty batch is refused.
    pub fn append(&self, id: &PartitionId, batch: AppendBatch) -> Result<Appended> {
        let mut encoded = EncodedBatch::encode(&batch.records, batch.origin.as_ref())?;
        self.append_encoded(id, &mut encoded)
    }

    /// Appends, segment syncs and waiting appends of every partition since the store opened:
    /// how much appends arriving together share their `fdatasync`s.
    pub fn append_stats(&self) -> AppendStats {
        let c = &self.append_counters;
        AppendStats {
            appends: c.appends.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
        }
    }

    /// From now on (`on`), appends write only frames that builds from before null values and
    /// producer stamps read: a null value is written empty and a producer stamp is left out.
    /// For a cluster in a rolling upgrade, where a partition written here may move to a node
    /// still on the older build (docs/operator-guide.md, upgrades).
    pub fn write_original_frames(&self, on: bool) {
        self.original_frames.store(on, Ordering::Relaxed);
    }

    /// `batch` in the original frame layout when [`Store::write_original_frames`] is on.
    fn in_original_layout(&self, batch: &mut EncodedBatch) -> Result<()> {
        if self.original_frames.load(Ordering::Relaxed) {
            batch.to_original_layout()?;
        }
        Ok(())
    }

    /// Appends a batch encoded by [`EncodedBatch::encode`], as [`Store::append`] does. On an
    /// error the batch is unchanged and may be appended again (a fan-out cursor's quick
    /// retries do), without encoding its records again.
    pub fn append_encoded(&self, id: &PartitionId, batch: &mut EncodedBatch) -> Result<Appended> {
        self.in_original_layout(batch)?;
        let p = self.partition(id)?;
        self.stamp(&p);
        let config = p.config();
        loop {
            let log = self.open_log(&p)?;
            match log.append(
                &mut batch.frame,
                batch.body_crc,
                batch.count,
                self.clock.as_ref(),
                &config,
                |hw| p.publish_hw(hw),
            ) {
                Ok(a) => return Ok(a),
                // Closed for idleness between lookup and lock: open again and retry.
                Err(LogError::Closed) => {
                    let slot = log::read(&p.slot);
                    if let Some(e) = p.broken_error(&slot) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(self.log_error(&p, e)),
            }
        }
    }

    /// Appends `batches` (each encoded by [`EncodedBatch::encode`]) in this order, as
    /// [`Store::append_encoded`] does each, but together: they share one `fdatasync` and one
    /// read-back (two when a segment roll falls between them). A batch is never durable
    /// unless every one before it is, so a later batch cannot land ahead of an earlier one
    /// that failed. `Ok` with one [`Appended`] per batch once all are durable; otherwise how
    /// many from the first are, and the error that stopped the rest (which are unchanged and
    /// may be appended again).
    pub fn append_encoded_in_order(
        &self,
        id: &PartitionId,
        batches: &mut [EncodedBatch],
    ) -> std::result::Result<Vec<Appended>, InOrderError> {
        let failed = |appended: Vec<Appended>, error: StorageError| InOrderError {
            durable: appended.len(),
            appended,
            error,
        };
        for batch in batches.iter_mut() {
            self.in_original_layout(batch)
                .map_err(|e| failed(Vec::new(), e))?;
        }
        let p = self.partition(id).map_err(|e| failed(Vec::new(), e))?;
        self.stamp(&p);
        let config = p.config();
        let mut appended = Vec::with_capacity(batches.len());
        while appended.len() < batches.len() {
            let log = match self.open_log(&p) {
                Ok(log) => log,
                Err(e) => return Err(failed(appended, e)),
            };
            let mut frames: Vec<log::writer::FrameToAppend<'_>> = batches[appended.len()..]
                .iter_mut()
                .map(|b| log::writer::FrameToAppend {
                    frame: &mut b.frame,
                    body_crc: b.body_crc,
                    count: b.count,
                })
                .collect();
            let answers = log.append_in_order(&mut frames, self.clock.as_ref(), &config, |hw| {
                p.publish_hw(hw)
            });
            for answer in answers {
                match answer {
                    Ok(a) => appended.push(a),
                    // Closed for idleness between lookup and lock (nothing of this call was
                    // written then): open again and go on from the first not appended.
                    Err(LogError::Closed) => {
                        let slot = log::read(&p.slot);
                        if let Some(e) = p.broken_error(&slot) {
                            drop(slot);
                            return Err(failed(appended, e));
                        }
                        break;
                    }
                    Err(e) => {
                        let e = self.log_error(&p, e);
                        return Err(failed(appended, e));
                    }
                }
            }
        }
        Ok(appended)
    }

    /// Reads records from `opts.offset` (see [`ReadOptions`]). Stamps last access; opens the
    /// log if closed. Below the log start: [`StorageError::OffsetBelowLogStart`]; past the high
    /// watermark: [`StorageError::OffsetBeyondEnd`]; at it: no records.
    pub fn read(&self, id: &PartitionId, opts: &ReadOptions) -> Result<ReadResult> {
        let p = self.partition(id)?;
        self.stamp(&p);
        let log = self.readable_log(&p)?;
        log.read(opts).map_err(|e| self.log_error(&p, e))
    }

    /// The log reads of `p` go to: the closed log a partition sealed for a move keeps serving
    /// reads from, else the open log (opened if closed).
    fn readable_log(&self, p: &Partition) -> Result<Arc<Log>> {
        let sealed = match &*log::read(&p.slot) {
            Slot::Sealed(Some(l)) => Some(Arc::clone(l)),
            _ => None,
        };
        match sealed {
            Some(log) => Ok(log),
            None => self.open_log(p),
        }
    }

    /// The batches idempotent producers wrote ([`crate::EncodedBatch::encode_stamped`]) in
    /// about the last `max_bytes` of the partition, oldest first: what lets a restarted daemon
    /// know a producer's recent batches again. Opens the log if closed.
    pub fn producer_batches(&self, id: &PartitionId, max_bytes: u64) -> Result<Vec<StampedBatch>> {
        let p = self.partition(id)?;
        self.stamp(&p);
        let log = self.readable_log(&p)?;
        log.producer_batches(max_bytes)
            .map_err(|e| self.log_error(&p, e))
    }

    /// Resolves `Ok(true)` as soon as the high watermark is above `offset`, `Ok(false)` when
    /// `timeout` passes first. Woken by appends through a watch channel (no polling). Errors
    /// for unknown, deleted, quarantined or failed partitions (a failed one whose wait is over
    /// is reopened first). Stamps last access. A closed log
    /// is not opened if its high-watermark file gives the exact end; otherwise it is opened
    /// (blocking I/O, only after a crash).
    pub async fn wait_for_data(
        &self,
        id: &PartitionId,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool> {
        let p = self.partition(id)?;
        self.stamp(&p);
        let mut rx = p.signal.subscribe();
        let mut current = *rx.borrow_and_update();
        if current == Signal::Broken {
            // A failed partition whose wait is over is reopened here; any other broken
            // partition (or a failed one still waiting) returns its error.
            self.open_log(&p)?;
            current = *rx.borrow_and_update();
        }
        if current == Signal::Unknown {
            let hw = match self.peek_partition(&p)?.high_watermark {
                Some(hw) => hw,
                None => self.open_log(&p)?.high_watermark(),
            };
            p.publish_hw(hw);
        }
        let waited = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| matches!(s, Signal::Hw(hw) if *hw > offset) || *s == Signal::Broken),
        )
        .await;
        match waited {
            Err(_) => Ok(false),
            Ok(Err(_)) => Err(StorageError::UnknownPartition { id: id.clone() }),
            Ok(Ok(s)) if *s == Signal::Broken => {
                drop(s);
                let slot = log::read(&p.slot);
                Err(p
                    .broken_error(&slot)
                    .unwrap_or(StorageError::UnknownPartition { id: id.clone() }))
            }
            Ok(Ok(_)) => Ok(true),
        }
    }

    /// The partition's committed high watermark now: from [`Store::peek`] when that knows it
    /// (an open log, or a cleanly closed one), else by opening the log (a closed log whose
    /// high-watermark file does not cover its records, after a crash). A quarantined or failed
    /// partition is an error, as for a read (which reopens a failed one whose wait is over).
    pub fn high_watermark(&self, id: &PartitionId) -> Result<u64> {
        let stats = self.peek(id)?;
        match (stats.state, stats.high_watermark) {
            (PartitionState::Quarantined { reason }, _) => Err(StorageError::Quarantined {
                id: id.clone(),
                reason: Box::new(reason),
            }),
            // A failed partition has no known end: the read below reopens it if its wait is
            // over, or reports it failed.
            (_, Some(high)) => Ok(high),
            (_, None) => {
                let opts = ReadOptions {
                    offset: stats.log_start_offset,
                    max_records: 1,
                    max_bytes: 1,
                    max_committed_at_ms: None,
                };
                match self.read(id, &opts) {
                    Ok(read) => Ok(read.high_watermark),
                    // Retention moved the start between the peek and the read: opening the log
                    // made the peek exact.
                    Err(StorageError::OffsetBelowLogStart { .. }) => self
                        .peek(id)?
                        .high_watermark
                        .ok_or_else(|| StorageError::HighWatermarkUnknown { id: id.clone() }),
                    Err(other) => Err(other),
                }
            }
        }
    }

    /// Describes a partition without opening a closed log and without stamping last access.
    /// A closed log is described from its directory: exact when it was closed cleanly,
    /// `high_watermark: None` when its high-watermark file does not cover the record bytes.
    /// Its log start is the one the log-start file records, never merely the oldest segment
    /// file; a closed log whose oldest segments are missing is quarantined here, as opening
    /// it would. `recovered_cut` summarises the torn tails kept aside in its `torn/` directory.
    pub fn peek(&self, id: &PartitionId) -> Result<PartitionStats> {
        let p = self.partition(id)?;
        self.peek_partition(&p)
    }

    /// The high watermark of a partition whose log is open, from memory; `None` when it is
    /// not open (or not registered). No file is read: a caller asking for thousands of
    /// partitions every second (the reconciler's lag refresh) pays no I/O for closed logs,
    /// which nothing appends to until they are opened again.
    pub fn open_high_watermark(&self, id: &PartitionId) -> Option<u64> {
        let p = self.partition(id).ok()?;
        let slot = log::read(&p.slot);
        match &*slot {
            Slot::Open(l) => Some(l.stats().high_watermark),
            _ => None,
        }
    }

    fn peek_partition(&self, p: &Partition) -> Result<PartitionStats> {
        let slot = log::read(&p.slot);
        let state = match &*slot {
            Slot::Open(l) => {
                let s = l.stats();
                return Ok(PartitionStats {
                    log_start_offset: s.log_start,
                    high_watermark: Some(s.high_watermark),
                    size_bytes: s.size_bytes,
                    segment_count: s.segment_count,
                    state: PartitionState::Open,
                    recovered_cut: s.recovered_cut,
                });
            }
            Slot::Closed => PartitionState::Closed,
            Slot::Quarantined(r) => PartitionState::Quarantined { reason: r.clone() },
            Slot::Failed { reason, .. } => PartitionState::Failed {
                reason: reason.clone(),
            },
            Slot::Sealed(_) => PartitionState::Sealed,
            Slot::Deleted => return Err(StorageError::UnknownPartition { id: p.id.clone() }),
        };
        if let PartitionState::Quarantined {
            reason: Damage::DirectoryMissing { .. },
        } = &state
        {
            // Nothing to list: the reason says so.
            return Ok(PartitionStats {
                log_start_offset: 0,
                high_watermark: None,
                size_bytes: 0,
                segment_count: 0,
                state,
                recovered_cut: Default::default(),
            });
        }
        // Describing a closed log reads the directory listing and the 64-byte high-watermark
        // file; the slot's read lock keeps it from being opened meanwhile.
        let files = segment::list(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("listing {}", p.dir.display())))?;
        let h = hwm::read(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the high-watermark file of {}", p.id)))?;
        let recorded = start::read(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the log-start file of {}", p.id)))?;
        // The log start is what the log recorded, not whatever segment happens to be oldest:
        // a missing head is damage (the open would quarantine it, so peek does too), and
        // segments left below the recorded start by an interrupted step are already gone.
        let log_start_offset = match start::check_head(&p.dir, &files, recorded) {
            Head::Interrupted { start, .. } => start,
            Head::Damaged(reason) if matches!(state, PartitionState::Closed) => {
                drop(slot);
                self.quarantine_closed(p, reason);
                return self.peek_partition(p);
            }
            Head::Damaged(_) | Head::Agrees | Head::Unrecorded => match recorded {
                start::Recorded::Start(s) => s,
                _ => files.first().map_or(0, |f| f.base),
            },
        };
        let recovered_cut = torn::summary(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the kept-aside torn tails of {}", p.id)))?;
        let high_watermark = match (files.last(), h) {
            (None, None) => Some(0),
            (Some(last), Some(h))
                if h.clean && h.segment_base == last.base && h.segment_pos == last.len =>
            {
                Some(h.next_offset)
            }
            _ => None,
        };
        let healthy = matches!(state, PartitionState::Closed | PartitionState::Sealed);
        Ok(PartitionStats {
            log_start_offset,
            high_watermark: if healthy { high_watermark } else { None },
            size_bytes: files.iter().map(|f| f.len).sum(),
            segment_count: u32::try_from(files.len()).unwrap_or(u32::MAX),
            state,
            recovered_cut,
        })
    }

    /// Quarantines a closed partition whose directory shows damage (found by `peek` without
    /// opening the log); does nothing if the slot changed meanwhile.
    fn quarantine_closed(&self, p: &Partition, reason: Damage) {
        let mut slot = log::write(&p.slot);
        if matches!(*slot, Slot::Closed) {
            tracing::error!(partition = %p.id, %reason, "partition quarantined");
            *slot = Slot::Quarantined(reason);
            p.signal.send_replace(Signal::Broken);
        }
    }

    /// Deletes whole segments past retention in every registered partition (age judged by a
    /// segment's newest commit time; the active segment is never deleted), advancing the log
    /// start offset. Closed logs are trimmed from their directory without being opened.
    /// Quarantined and failed partitions are left alone. Returns what was deleted; the first
    /// error is returned after every partition has been tried.
    pub fn enforce_retention(&self) -> Result<RetentionReport> {
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let now = self.clock.now_ms();
        let mut report = RetentionReport::default();
        let mut first_error = None;
        for p in parts {
            let config = p.config();
            if config.retention_ms.is_none() && config.retention_bytes.is_none() {
                continue;
            }
            let outcome: std::result::Result<Trimmed, LogError> = {
                let slot = log::read(&p.slot);
                match &*slot {
                    Slot::Open(l) => l.enforce_retention(&config, now),
                    Slot::Closed => {
                        retention::enforce_closed(self.fs.as_ref(), &p.dir, &config, now)
                    }
                    _ => Ok(Trimmed::default()),
                }
            };
            match outcome {
                Ok(t) => {
                    report.segments_deleted += t.segments;
                    report.bytes_deleted += t.bytes;
                    if let Some(start) = t.new_log_start {
                        report.advanced.push((p.id.clone(), start));
                    }
                }
                Err(e) => {
                    let e = self.log_error(&p, e);
                    tracing::warn!(partition = %p.id, error = %e, "retention failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Closes logs not read or appended for longer than `idle_close_after` (writing their
    /// high-watermark files); they reopen on demand. Returns how many were closed.
    pub fn close_idle(&self) -> usize {
        let now = self.clock.now_ms();
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let mut closed = 0;
        for p in parts {
            let idle_for = now.saturating_sub(p.last_access_ms.load(Ordering::Relaxed));
            if idle_for <= self.idle_close_after_ms {
                continue;
            }
            let mut slot = log::write(&p.slot);
            if let Slot::Open(l) = &*slot {
                if let Err(e) = l.close() {
                    tracing::warn!(partition = %p.id, error = %e, "closing an idle log failed");
                }
                *slot = Slot::Closed;
                closed += 1;
            }
        }
        closed
    }

    /// Clean shutdown: closes every open log, writing each high-watermark file with the clean
    /// flag. Returns the first error after trying all of them.
    pub fn close(&self) -> Result<()> {
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let mut first_error = None;
        for p in parts {
            let mut slot = log::write(&p.slot);
            if let Slot::Open(l) = &*slot {
                if let Err(e) = l.close() {
                    first_error.get_or_insert(e);
                }
                *slot = Slot::Closed;
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
