//! One fan-out cursor: resolve the start, then read, deliver, advance, until stopped.
//!
//! A cursor never waits past the parent's end. Its position can be beyond the parent's high
//! watermark when the parent lost records the cursor had already copied: a torn tail cut at
//! start-up with no high-watermark file to refuse the cut, for example. Waiting there would
//! skip every record the parent writes again at the reused offsets, so the cursor moves back
//! to the parent's end instead ([`rewind_to_parent_end`]), at start and whenever a read says
//! the position is past the end; it logs both offsets and counts the rewind. This only ever
//! moves the cursor back toward records it has not copied (duplicates in the child, never a
//! gap), so it keeps the cursor's epoch and needs no confirmation from the metastore. When
//! records were already written again at the lost offsets before the cursor starts, its
//! position is not past the end any more; the content of the copies in the child then shows
//! the reuse ([`provenance::first_reused_offset`], [`rewind_past_reused_offsets`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use narad_storage::cursor::{self as cursor_file, CursorFile, CursorLoad, CursorRecord};
use narad_storage::fs::FileSystem;
use narad_storage::{Clock, PartitionId, StorageError, Store};

use super::RETRY_BACKOFF;
use super::committer::ChildCommitter;
use super::deliver::{Delivery, DeliveryEnv, LinkGone, LinkView, SlabJob, deliver};
use super::gate;
use super::provenance;
use super::router::SharedRouter;
use super::slab::{SlabRead, read_slab};
use super::start::{StartPoint, start_point};
use super::status::CursorStatus;
use crate::metastore::link::{BadEpoch, LinkMeta, epoch_bytes};
use crate::metastore::{BoxFuture, Metastore, MetastoreError};
use crate::shutdown::ShutdownSignal;

/// Identity of one fan-out cursor: a (parent partition, child) pair under one attach epoch.
///
/// The epoch is part of the identity so that a detach followed by a re-attach is a stop of the
/// old cursor and a start of a new one, never a silent resume of the old position. The
/// reconciler compares sets of these to decide which cursors to start and stop.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CursorKey {
    /// Parent topic name.
    pub parent: String,
    /// Parent partition index.
    pub partition: u32,
    /// Child topic name.
    pub child: String,
    /// Attach epoch of the link the cursor serves (16 lowercase hex digits).
    pub epoch: String,
}

/// The parts of the daemon a cursor uses.
pub struct CursorDeps {
    /// The local store: the parent partition and (on one node) the child partitions.
    pub store: Arc<Store>,
    /// The file system the store runs on, for the offset file.
    pub fs: Arc<dyn FileSystem>,
    /// Where child buckets are committed.
    pub committer: Arc<dyn ChildCommitter>,
    /// The metadata: topics, links, and the linearizable epoch check.
    pub metastore: Arc<dyn Metastore>,
    /// The clock the delay gate reads (this node's clock).
    pub clock: Arc<dyn Clock>,
}

/// A link as the cursors of this node see it: its metadata, swapped when the link changes,
/// and its router chain, shared by its cursors.
pub struct LinkRuntime {
    meta: RwLock<Arc<LinkMeta>>,
    /// The router chain; replacing what it holds takes effect at every cursor's next slab.
    pub router: SharedRouter,
}

impl LinkRuntime {
    /// A link runtime for `meta` routing through `router`.
    pub fn new(meta: LinkMeta, router: SharedRouter) -> LinkRuntime {
        LinkRuntime {
            meta: RwLock::new(Arc::new(meta)),
            router,
        }
    }

    /// The link's current metadata.
    pub fn meta(&self) -> Arc<LinkMeta> {
        match self.meta.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the link's metadata (router change, topic change).
    pub fn set_meta(&self, meta: LinkMeta) {
        match self.meta.write() {
            Ok(mut guard) => *guard = Arc::new(meta),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(meta),
        }
    }
}

/// Why a cursor stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum CursorExit {
    /// Told to stop (detach, shutdown, ownership moved).
    Stopped,
    /// Its epoch is no longer the link's; the reconciler starts the right cursor.
    LinkGone(LinkGone),
    /// Its start could not be confirmed against the metastore; retried on a later tick.
    Deferred(Deferred),
}

/// Why a cursor did not start yet; the reconciler tries again on a later tick.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Deferred {
    /// The cursor had to write a new offset file (none, a corrupt one, or one of another
    /// attach), and the metastore, read linearizably, did not have its epoch as the link's.
    #[error("epoch {epoch} of {parent} -> {child} not confirmed by the metastore")]
    EpochNotConfirmed {
        /// The cursor's attach epoch.
        epoch: String,
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
}

/// Why a step of a cursor failed for now: the cursor reports it as its stall reason, waits
/// and retries. The `Display` text is the stall reason operators see.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CursorStepError {
    /// Reading the metastore (topics, links, the linearizable epoch check) failed.
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// The cursor's epoch is not 16 lowercase hex digits.
    #[error(transparent)]
    BadEpoch(#[from] BadEpoch),
    /// Storage failed while resolving the start: scanning the child's tails or reading the
    /// parent's end.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Loading or writing the offset file failed while resolving the start.
    #[error(transparent)]
    OffsetFile(#[from] cursor_file::CursorError),
    /// A task on the blocking pool panicked or was cancelled while resolving the start.
    #[error("blocking task failed: {0}")]
    BlockingTask(tokio::task::JoinError),
    /// The task advancing the offset file panicked or was cancelled.
    #[error("offset-file task failed: {0}")]
    OffsetFileTask(tokio::task::JoinError),
    /// Writing the advanced position to the offset file failed.
    #[error("advancing the offset file failed: {0}")]
    Advance(cursor_file::CursorError),
}

/// Where resolving a cursor's start ended.
enum Opened {
    /// The offset file, at the position the cursor starts from.
    File(CursorFile),
    /// The start cannot be written now; the cursor exits and is started again later.
    Deferred(Deferred),
}

/// The offset-file path of a cursor: `topics/{parent}/p{00000}/fanout-{child}.offset`.
pub fn cursor_path(store: &Store, parent: &PartitionId, child: &str) -> PathBuf {
    store
        .data_dir()
        .join("topics")
        .join(&parent.topic)
        .join(parent.dir_name())
        .join(cursor_file::cursor_file_name(child))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CursorStepError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(CursorStepError::BlockingTask)
}

struct Env<'a> {
    deps: &'a CursorDeps,
    key: &'a CursorKey,
}

impl DeliveryEnv for Env<'_> {
    fn link_view(&self) -> BoxFuture<'_, Result<LinkView, MetastoreError>> {
        Box::pin(link_view(self.deps, self.key))
    }
}

/// Reads the link's current state from the metastore: is the cursor's epoch still the link's,
/// and the partition counts and config to route with.
async fn link_view(deps: &CursorDeps, key: &CursorKey) -> Result<LinkView, MetastoreError> {
    let snapshot = deps.metastore.snapshot().await?;
    let link = snapshot
        .links
        .get(&(key.parent.clone(), key.child.clone()))
        .filter(|link| link.attach_epoch == key.epoch);
    let child = snapshot.topics.get(&key.child).map(|t| t.partitions);
    let parent = snapshot.topics.get(&key.parent).map(|t| t.partitions);
    Ok(match (link, child, parent) {
        (Some(link), Some(child_partitions), Some(parent_partitions)) => LinkView {
            current: true,
            child_partitions,
            parent_partitions,
            config: link.config.clone().into_bytes(),
        },
        _ => LinkView {
            current: false,
            child_partitions: 0,
            parent_partitions: 0,
            config: Vec::new(),
        },
    })
}

/// Whether the metastore, read linearizably, still has `key`'s epoch as the link's epoch.
async fn epoch_confirmed(deps: &CursorDeps, key: &CursorKey) -> Result<bool, MetastoreError> {
    let snapshot = deps.metastore.confirm().await?;
    Ok(snapshot
        .links
        .get(&(key.parent.clone(), key.child.clone()))
        .is_some_and(|link| link.attach_epoch == key.epoch))
}

/// Resolves where the cursor starts and opens its offset file.
async fn open_position(
    deps: &Arc<CursorDeps>,
    key: &CursorKey,
    link: &LinkMeta,
    status: &CursorStatus,
) -> Result<Opened, CursorStepError> {
    let parent = PartitionId::new(key.parent.clone(), key.partition);
    let path = cursor_path(&deps.store, &parent, &key.child);
    let epoch = epoch_bytes(&key.epoch)?;
    let child_partitions = deps
        .metastore
        .topic(&key.child)
        .await?
        .map_or(0, |t| t.partitions);

    let (fs, load_path) = (Arc::clone(&deps.fs), path.clone());
    let loaded = blocking(move || cursor_file::load(fs.as_ref(), &load_path)).await??;
    let (store, child, partition) = (Arc::clone(&deps.store), key.child.clone(), key.partition);
    let (evidence, copies) = blocking(move || {
        provenance::scan_child_tails_with_copies(&store, &child, child_partitions, epoch, partition)
    })
    .await??;
    // The parent's end, read now (opening the log if a crash left its end unknown): nothing
    // may start past it.
    let (store, high_id) = (Arc::clone(&deps.store), parent.clone());
    let high = blocking(move || store.high_watermark(&high_id)).await??;
    let (store, peek_id) = (Arc::clone(&deps.store), parent.clone());
    let stats = blocking(move || store.peek(&peek_id)).await??;

    match loaded {
        CursorLoad::Found { record, layout } if record.epoch == key.epoch => {
            let mut position = rewind_to_parent_end(record.next_offset, high, key, status);
            let floor = match start_point(link.attach_offsets.as_deref(), key.partition) {
                StartPoint::LiveTail => None,
                point => Some(point.resolve(0)),
            };
            if let Some(target) =
                provenance::rewind_target(position, evidence, stats.log_start_offset, floor)
            {
                tracing::warn!(parent = %parent, child = %key.child, from = position, to = target,
                    "cursor is ahead of what its child holds; rewinding so nothing is missing");
                status.rewound();
                position = target;
            }
            let position =
                rewind_past_reused_offsets(deps, &parent, key, position, copies, status).await?;
            let fs = Arc::clone(&deps.fs);
            let rewound = position != record.next_offset;
            let file = blocking(move || {
                let record = CursorRecord {
                    epoch: record.epoch,
                    next_offset: position,
                };
                if rewound {
                    CursorFile::anchor(fs, &path, record)
                } else {
                    CursorFile::resume(fs, &path, record, layout)
                }
            })
            .await??;
            Ok(Opened::File(file))
        }
        other => {
            match &other {
                CursorLoad::Found { record, .. } => {
                    tracing::info!(parent = %parent, child = %key.child,
                    found = %record.epoch, wanted = %key.epoch, "offset file belongs to another attach; not resuming it")
                }
                CursorLoad::Corrupt { reason } => {
                    tracing::warn!(parent = %parent, child = %key.child,
                    %reason, "offset file is corrupt; rebuilding the position")
                }
                CursorLoad::Missing => {}
            }
            // Anchoring overwrites the file: only with the epoch confirmed linearizably.
            if !epoch_confirmed(deps, key).await? {
                return Ok(Opened::Deferred(Deferred::EpochNotConfirmed {
                    epoch: key.epoch.clone(),
                    parent: key.parent.clone(),
                    child: key.child.clone(),
                }));
            }
            let position = match evidence.evidence {
                // The child holds slabs of this epoch: resume at the newest one's start.
                Some(found) if found.newest_slab_start >= stats.log_start_offset => {
                    found.newest_slab_start
                }
                _ => start_point(link.attach_offsets.as_deref(), key.partition).resolve(high),
            };
            // Evidence or an attach point past the parent's end: the parent lost records since.
            let position = rewind_to_parent_end(position, high, key, status);
            let position =
                rewind_past_reused_offsets(deps, &parent, key, position, copies, status).await?;
            let (fs, epoch_text) = (Arc::clone(&deps.fs), key.epoch.clone());
            let file = blocking(move || {
                CursorFile::anchor(
                    fs,
                    &path,
                    CursorRecord {
                        epoch: epoch_text,
                        next_offset: position,
                    },
                )
            })
            .await??;
            Ok(Opened::File(file))
        }
    }
}

/// The position a cursor at `position` may use given the parent's high watermark `high`:
/// `position` itself, or `high` when `position` is past it. Past the end, the parent lost
/// records the cursor had already copied; records written again at those offsets are new and
/// must reach the child, so the cursor goes back to the parent's end. Logs and counts it.
fn rewind_to_parent_end(position: u64, high: u64, key: &CursorKey, status: &CursorStatus) -> u64 {
    if position <= high {
        return position;
    }
    note_parent_end_rewind(position, high, key, status);
    high
}

/// Logs and counts a rewind from `from` back to the parent's end `to`.
fn note_parent_end_rewind(from: u64, to: u64, key: &CursorKey, status: &CursorStatus) {
    tracing::warn!(parent = %key.parent, partition = key.partition, child = %key.child,
        from, to, lost = from.saturating_sub(to),
        "cursor is past the parent's end: the parent lost records it had copied; rewinding to the parent's end so records written again at those offsets reach the child");
    status.rewound_to_parent_end();
}

/// The position a cursor at `position` may use given what its child holds: `position` itself,
/// or the first offset the parent reused for a new record after losing the one the child
/// copied from it (records written again at lost offsets before the cursor started, so the
/// position is no longer past the parent's end). Logs and counts it like
/// [`rewind_to_parent_end`]: it is the same loss, found later.
async fn rewind_past_reused_offsets(
    deps: &CursorDeps,
    parent: &PartitionId,
    key: &CursorKey,
    position: u64,
    copies: provenance::TailCopies,
    status: &CursorStatus,
) -> Result<u64, CursorStepError> {
    let (store, id) = (Arc::clone(&deps.store), parent.clone());
    let reused =
        blocking(move || provenance::first_reused_offset(&store, &id, position, &copies)).await??;
    match reused {
        Some(target) if target < position => {
            tracing::warn!(parent = %key.parent, partition = key.partition, child = %key.child,
                from = position, to = target,
                "cursor is past the parent's end: the parent reused offsets of records it lost after the child copied them; rewinding so the records now at those offsets reach the child");
            status.rewound_to_parent_end();
            Ok(target)
        }
        _ => Ok(position),
    }
}

/// Sleeps `duration`, or returns false early if the cursor is told to stop.
async fn sleep_or_stop(duration: Duration, stop: &ShutdownSignal) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(duration) => true,
        _ = stop.wait() => false,
    }
}

/// Runs the cursor named by `key` until it is stopped or its link changes.
pub async fn run_cursor(
    deps: Arc<CursorDeps>,
    key: CursorKey,
    link: Arc<LinkRuntime>,
    status: Arc<CursorStatus>,
    stop: ShutdownSignal,
) -> CursorExit {
    let parent = PartitionId::new(key.parent.clone(), key.partition);
    let epoch = match epoch_bytes(&key.epoch) {
        Ok(epoch) => epoch,
        Err(e) => return CursorExit::LinkGone(LinkGone::BadEpoch(e)),
    };
    // Resolve the start, retrying (stalled) until it works or the cursor is stopped.
    let file = loop {
        match open_position(&deps, &key, &link.meta(), &status).await {
            Ok(Opened::File(file)) => break file,
            Ok(Opened::Deferred(why)) => return CursorExit::Deferred(why),
            Err(reason) => {
                status.stalled(format!("cannot open the cursor position: {reason}"));
                if !sleep_or_stop(RETRY_BACKOFF, &stop).await {
                    return CursorExit::Stopped;
                }
            }
        }
    };
    let start = file.next_offset();
    let file = Arc::new(Mutex::new(file));
    status.set_position(start, start);
    status.running();

    loop {
        if stop.is_triggered() {
            return CursorExit::Stopped;
        }
        let meta = link.meta();
        if meta.attach_epoch != key.epoch {
            return CursorExit::LinkGone(LinkGone::Reattached {
                parent: key.parent.clone(),
                child: key.child.clone(),
            });
        }
        let delay_ms = meta.delay_ms;
        let clock = Arc::clone(&deps.clock);
        let gate_fn = move || gate::max_committed_at(clock.now_ms(), delay_ms);
        let position = lock_file(&file).next_offset();
        let read = tokio::select! {
            read = read_slab(&deps.store, &parent, position, &gate_fn) => read,
            _ = stop.wait() => return CursorExit::Stopped,
        };
        let read = match read {
            Ok(read) => read,
            Err(StorageError::OffsetBeyondEnd { high_watermark, .. })
                if high_watermark < position =>
            {
                // The parent's log got shorter under the cursor (reopened after a crash or
                // repair): go back to its end rather than wait for offsets it will reuse.
                // Counted once it is durable: a failed write is retried on the next read.
                match blocking_advance(&file, high_watermark).await {
                    Ok(()) => {
                        note_parent_end_rewind(position, high_watermark, &key, &status);
                        status.set_position(high_watermark, high_watermark);
                        status.running();
                    }
                    Err(reason) => {
                        status.stalled(reason.to_string());
                        if !sleep_or_stop(RETRY_BACKOFF, &stop).await {
                            return CursorExit::Stopped;
                        }
                    }
                }
                continue;
            }
            Err(error) => {
                status.stalled(format!("reading {parent} at {position} failed: {error}"));
                if !sleep_or_stop(RETRY_BACKOFF, &stop).await {
                    return CursorExit::Stopped;
                }
                continue;
            }
        };
        match read {
            SlabRead::Idle { high_watermark } => {
                status.set_position(position, high_watermark);
                status.set_due_lag(0.0);
                status.running();
            }
            SlabRead::NotDue {
                committed_at_ms,
                high_watermark,
            } => {
                status.set_position(position, high_watermark);
                status.set_due_lag(0.0);
                status.waiting();
                let wait = gate::sleep_until_due(committed_at_ms, delay_ms, deps.clock.now_ms());
                // Wake at least a millisecond later so the gate has moved past the record.
                if !sleep_or_stop(wait.max(Duration::from_millis(1)), &stop).await {
                    return CursorExit::Stopped;
                }
            }
            SlabRead::BelowLogStart { log_start } => {
                let dropped = log_start.saturating_sub(position);
                tracing::warn!(%parent, child = %key.child, from = position, to = log_start, dropped,
                    "cursor fell behind the parent's retention; skipping aged-out records");
                match blocking_advance(&file, log_start).await {
                    Ok(()) => {
                        status.add_dropped(dropped);
                        status.set_position(log_start, log_start);
                        status.running();
                    }
                    Err(reason) => {
                        status.stalled(reason.to_string());
                        if !sleep_or_stop(RETRY_BACKOFF, &stop).await {
                            return CursorExit::Stopped;
                        }
                    }
                }
            }
            SlabRead::Records {
                records,
                high_watermark,
            } => {
                let Some(last) = records.last().map(|r| r.offset) else {
                    continue;
                };
                let oldest = records.first().map(|r| r.committed_at_ms);
                status.set_due_lag(gate::due_lag_seconds(oldest, delay_ms, deps.clock.now_ms()));
                let count = records.len() as u64;
                let job = SlabJob {
                    parent: key.parent.clone(),
                    partition: key.partition,
                    child: key.child.clone(),
                    epoch,
                    slab_start: position,
                    records,
                };
                let env = Env {
                    deps: &deps,
                    key: &key,
                };
                match deliver(job, &link.router, &deps.committer, &env, &status, &stop).await {
                    Delivery::Committed => {}
                    Delivery::Stopped => return CursorExit::Stopped,
                    Delivery::LinkGone(reason) => return CursorExit::LinkGone(reason),
                }
                // Every bucket is acknowledged: only now may the position pass the slab.
                loop {
                    match blocking_advance(&file, last + 1).await {
                        Ok(()) => break,
                        Err(reason) => {
                            status.stalled(reason.to_string());
                            if !sleep_or_stop(RETRY_BACKOFF, &stop).await {
                                return CursorExit::Stopped;
                            }
                        }
                    }
                }
                status.slab_committed(count);
                status.set_position(last + 1, high_watermark);
                status.set_due_lag(0.0);
                status.running();
            }
        }
    }
}

fn lock_file(file: &Mutex<CursorFile>) -> std::sync::MutexGuard<'_, CursorFile> {
    // A panic inside `advance` leaves the position it had; the file itself is consistent.
    file.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Advances the offset file on the blocking pool.
async fn blocking_advance(
    file: &Arc<Mutex<CursorFile>>,
    next_offset: u64,
) -> Result<(), CursorStepError> {
    let file = Arc::clone(file);
    tokio::task::spawn_blocking(move || lock_file(&file).advance(next_offset))
        .await
        .map_err(CursorStepError::OffsetFileTask)?
        .map_err(CursorStepError::Advance)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_failed_offset_file_advance_stalls_with_the_same_reason_text() {
        let error = CursorStepError::Advance(cursor_file::CursorError::Io {
            op: "fsync",
            path: PathBuf::from("/data/fanout-child.offset"),
            source: std::io::Error::other("disk gone"),
        });
        assert!(matches!(error, CursorStepError::Advance(_)));
        assert_eq!(
            error.to_string(),
            "advancing the offset file failed: fsync /data/fanout-child.offset: disk gone"
        );
    }

    #[test]
    fn a_bad_epoch_stalls_with_the_epochs_own_reason() {
        let error = CursorStepError::from(epoch_bytes("xyz").unwrap_err());
        assert!(matches!(error, CursorStepError::BadEpoch(BadEpoch(ref e)) if e == "xyz"));
        assert_eq!(
            error.to_string(),
            "attach epoch \"xyz\" is not 16 lowercase hex digits"
        );
    }
}
