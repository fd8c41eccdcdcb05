//! Step 0 of a cursor, position: where it starts, resumes or rewinds to, before its first read.
//!
//! [`open`] decides, from the offset file, the child's tails and the parent's end:
//!
//! - An offset file of the cursor's epoch is resumed at its position, unless that position
//!   is past the parent's end (`rewind_to_parent_end`), ahead of what the child holds
//!   ([`provenance::rewind_target`]), or past offsets the parent reused for new records
//!   ([`provenance::first_reused_offset`]); each of those only moves the cursor back.
//! - Without one (none, a corrupt one, one of another attach), the newest slab of this epoch
//!   in the child's tails names where to resume (repeating at most that slab); without such
//!   evidence, the attach point ([`start`]). Writing that new file (anchoring) waits for the
//!   metastore, read linearizably, to confirm the epoch is still the link's; otherwise the
//!   start is [`Deferred`].
//!
//! In cluster mode the tails on other nodes are scanned by their owners, all at once, each
//! given [`REMOTE_TAIL_TIMEOUT`]. When some owner does not answer (down, or hung), a cursor
//! with an offset file still starts from it: the buckets of the live owners are copied, the
//! dead owner's wait in the commit, and the copies it already holds past the position are left
//! out by its own window of copies once it is back. The "child is behind" rewind is skipped
//! then (the newest slab may be on the partition that did not answer). Without an offset file
//! the cursor does not start until every tail has answered: the tails are then the only record
//! of how far the copy got.
//!
//! A cursor never waits past the parent's end. Its position can be beyond the parent's high
//! watermark when the parent lost records the cursor had already copied: a torn tail cut at
//! start-up with no high-watermark file to refuse the cut, for example. Waiting there would
//! skip every record the parent writes again at the reused offsets, so the cursor moves back
//! to the parent's end instead, at start (here) and whenever a read says the position is past
//! the end (the loop, through [`super::advance`]); it logs both offsets and counts the rewind
//! ([`note_parent_end_rewind`]). This only ever moves the cursor back toward records it has
//! not copied (duplicates in the child, never a gap), so it keeps the cursor's epoch and needs
//! no confirmation from the metastore. When records were already written again at the lost
//! offsets before the cursor starts, its position is not past the end any more; the content of
//! the copies in the child then shows the reuse (`rewind_past_reused_offsets`).

pub(crate) mod provenance;
pub(crate) mod start;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use narad_storage::cursor::{self as cursor_file, CursorFile, CursorLoad, CursorRecord};
use narad_storage::{PartitionId, StorageError, Store};

use super::advance::OffsetFile;
use super::status::CursorStatus;
use super::{CursorDeps, CursorKey};
use crate::blocking::BlockingError;
use crate::metastore::MetastoreError;
use crate::metastore::link::{BadEpoch, LinkMeta, epoch_bytes};
use start::{StartPoint, start_point};

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

/// Why resolving a cursor's start failed for now: the cursor reports it as its stall reason,
/// waits and tries again. The `Display` text is the stall reason operators see (after
/// "cannot open the cursor position: ").
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Reading the metastore (the child's partition count, the linearizable epoch check)
    /// failed.
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// The cursor's epoch is not 16 lowercase hex digits.
    #[error(transparent)]
    BadEpoch(#[from] BadEpoch),
    /// Storage failed: scanning the child's tails or reading the parent's end.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Loading or writing the offset file failed.
    #[error(transparent)]
    OffsetFile(#[from] cursor_file::CursorError),
    /// A task on the blocking pool did not return.
    #[error(transparent)]
    Task(#[from] BlockingError),
    /// Cluster mode: the tail of a child partition on another node could not be scanned (its
    /// owner is down or did not answer); the cursor does not start on a guess.
    #[error("cannot scan the tail of child partition {partition} on its owner: {reason}")]
    RemoteTail {
        /// `child/pNNNNN`.
        partition: String,
        /// Why.
        reason: TailScanError,
    },
}

/// Why the tail of a child partition on another node could not be scanned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TailScanError {
    /// The partition has no owner in the metadata this node holds.
    #[error("{partition} has no owner")]
    NoOwner {
        /// `child/pNNNNN`.
        partition: String,
    },
    /// The owner did not answer in time.
    #[error("no answer within {secs} s")]
    NoAnswer {
        /// The wait, in seconds.
        secs: u64,
    },
    /// The task that ran the scan failed in this daemon.
    #[error("its scan task failed inside this daemon")]
    TaskFailed,
    /// The call to the owner failed or was refused (the error names the node and the cause).
    #[error(transparent)]
    Peer(#[from] crate::cluster::PeerError),
}

/// Scans the tails of child partitions that live on other nodes (cluster mode), for
/// [`open`]: the same scan as [`provenance::scan_child_tails_with_copies`], run by the owner.
pub trait RemoteTails: Send + Sync {
    /// The scan of partition `partition` of `child` for records of `parent_partition` under
    /// `epoch`.
    fn scan<'a>(
        &'a self,
        child: &'a str,
        partition: u32,
        epoch: [u8; 8],
        parent_partition: u32,
    ) -> crate::metastore::BoxFuture<
        'a,
        Result<(provenance::ChildScan, provenance::TailCopies), TailScanError>,
    >;

    /// Waits for room for one more scan in flight, and holds it as long as the permit lives.
    /// Starting cursors scan every child partition on another node, so a burst of attaches
    /// would otherwise send thousands of calls at once and pile connections up on the owners
    /// until they refuse. `None`: no bound (the default).
    fn admit(&self) -> crate::metastore::BoxFuture<'_, Option<tokio::sync::OwnedSemaphorePermit>> {
        Box::pin(async { None })
    }
}

/// Where resolving a cursor's start ended.
pub enum Opened {
    /// The offset file, at the position the cursor starts from, and what the child already
    /// holds from there on.
    File {
        /// The offset file.
        offsets: OffsetFile,
        /// Copies the child's tails hold of parent records at or past the position (a slab
        /// repeated after a crash, possibly routed to other child partitions the second
        /// time): the cursor does not commit those records again ([`Held`]).
        held: Held,
    },
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
) -> Result<T, OpenError> {
    Ok(crate::blocking::run(f).await?)
}

/// Whether the metastore, read linearizably, still has `key`'s epoch as the link's epoch.
async fn epoch_confirmed(deps: &CursorDeps, key: &CursorKey) -> Result<bool, MetastoreError> {
    let snapshot = deps.metastore.confirm().await?;
    Ok(snapshot
        .links
        .get(&(key.parent.clone(), key.child.clone()))
        .is_some_and(|link| link.attach_epoch == key.epoch))
}

/// Resolves where the cursor named by `key` of `link` starts and opens its offset file there.
pub async fn open(
    deps: &Arc<CursorDeps>,
    key: &CursorKey,
    link: &LinkMeta,
    status: &CursorStatus,
) -> Result<Opened, OpenError> {
    let parent = PartitionId::new(key.parent.clone(), key.partition);
    let path = cursor_path(&deps.store, &parent, &key.child);
    let epoch = epoch_bytes(&key.epoch)?;
    // A remote child's partitions live in another narad: nothing here can be scanned, so
    // the offset file or the attach point decides (never "the child is empty": that would
    // rewind a remote child to its attach point at every start).
    let child_partitions = if link.remote.is_some() {
        0
    } else {
        deps.metastore
            .topic(&key.child)
            .await?
            .map_or(0, |t| t.partitions)
    };

    let (fs, load_path) = (Arc::clone(&deps.fs), path.clone());
    let loaded = blocking(move || cursor_file::load(fs.as_ref(), &load_path)).await??;
    let (store, child, partition) = (Arc::clone(&deps.store), key.child.clone(), key.partition);
    let remote_ok = deps.remote_tails.is_some();
    let (mut scanned, remote) = blocking(move || {
        // Cluster mode reads the tails this node holds here and asks the owners for the rest.
        let (here, elsewhere): (Vec<u32>, Vec<u32>) = (0..child_partitions)
            .partition(|&p| !remote_ok || store.has_partition(&PartitionId::new(child.clone(), p)));
        let scan =
            provenance::scan_child_tails_with_copies(&store, &child, &here, epoch, partition)?;
        Ok::<_, StorageError>((scan, elsewhere))
    })
    .await??;
    // Child partitions whose owner did not answer the tail scan, with why.
    let mut unscanned: Vec<(u32, TailScanError)> = Vec::new();
    if let Some(tails) = &deps.remote_tails {
        for (p, theirs) in scan_remote_tails(tails, &key.child, &remote, epoch, key.partition).await
        {
            match theirs {
                Ok(theirs) => provenance::merge(&mut scanned, theirs),
                Err(reason) => unscanned.push((p, reason)),
            }
        }
    }
    let refuse_unscanned = |unscanned: &[(u32, TailScanError)]| {
        unscanned.first().map(|(p, reason)| OpenError::RemoteTail {
            partition: PartitionId::new(key.child.clone(), *p).to_string(),
            reason: reason.clone(),
        })
    };
    if link.remote.is_some() {
        scanned.0.empty = false;
    }
    let (evidence, copies) = scanned;
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
            // The offset file says where to resume; the child owners that answered say what
            // they hold past it. A dead one does not hold up the others' buckets: its own wait
            // in their commit (a stall of this link, not a start that never comes), and what
            // it already holds is left out by its window of copies when it is back. Whether
            // the child is behind the file is judged only on every tail: the newest slab may
            // be on the partition that did not answer.
            if !unscanned.is_empty() {
                let partitions: Vec<u32> = unscanned.iter().map(|(p, _)| *p).collect();
                tracing::warn!(parent = %parent, child = %key.child, ?partitions,
                    reason = %unscanned[0].1,
                    "cursor starts from its offset file without the tails of child partitions whose owner did not answer");
            }
            if let Some(target) = unscanned
                .is_empty()
                .then(|| {
                    provenance::rewind_target(position, evidence, stats.log_start_offset, floor)
                })
                .flatten()
            {
                tracing::warn!(parent = %parent, child = %key.child, from = position, to = target,
                    "cursor is ahead of what its child holds; rewinding so nothing is missing");
                status.rewound();
                position = target;
            }
            let position =
                rewind_past_reused_offsets(deps, &parent, key, position, copies.clone(), status)
                    .await?;
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
            Ok(Opened::File {
                offsets: OffsetFile::new(file, deps.timing.offset_sync_every),
                held: Held::from_position(copies, position),
            })
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
            // Without an offset file the tails are the only record of how far the copy got:
            // every one is needed, or the cursor could start past what a dead owner holds.
            if let Some(refused) = refuse_unscanned(&unscanned) {
                return Err(refused);
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
                rewind_past_reused_offsets(deps, &parent, key, position, copies.clone(), status)
                    .await?;
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
            Ok(Opened::File {
                offsets: OffsetFile::new(file, deps.timing.offset_sync_every),
                held: Held::from_position(copies, position),
            })
        }
    }
}

/// Longest wait for one child partition's owner to scan its tail: a hung owner (its lease not
/// yet gone) counts as one that did not answer after this.
const REMOTE_TAIL_TIMEOUT: Duration = Duration::from_secs(10);

/// The tail scans of child partitions `partitions` of `child` on their owners, all at once
/// (a dead or hung owner costs one wait, not one per partition in turn) as far as
/// [`RemoteTails::admit`] lets them, each bounded by [`REMOTE_TAIL_TIMEOUT`] once admitted;
/// in the order given.
async fn scan_remote_tails(
    tails: &Arc<dyn RemoteTails>,
    child: &str,
    partitions: &[u32],
    epoch: [u8; 8],
    parent_partition: u32,
) -> Vec<(
    u32,
    Result<(provenance::ChildScan, provenance::TailCopies), TailScanError>,
)> {
    let mut scans = tokio::task::JoinSet::new();
    for (i, &p) in partitions.iter().enumerate() {
        let (tails, child) = (Arc::clone(tails), child.to_owned());
        scans.spawn(async move {
            // Waiting for room is not waiting for the owner: the timeout starts once sent.
            let _in_flight = tails.admit().await;
            let scan = tokio::time::timeout(
                REMOTE_TAIL_TIMEOUT,
                tails.scan(&child, p, epoch, parent_partition),
            )
            .await
            .unwrap_or(Err(TailScanError::NoAnswer {
                secs: REMOTE_TAIL_TIMEOUT.as_secs(),
            }));
            (i, p, scan)
        });
    }
    let mut done = Vec::with_capacity(partitions.len());
    while let Some(joined) = scans.join_next().await {
        match joined {
            Ok(scan) => done.push(scan),
            // A scan task that panicked: its partition is left out of `done` and is
            // reported below as not scanned.
            Err(e) => tracing::error!(child, error = %e, "a child tail scan task failed"),
        }
    }
    done.sort_unstable_by_key(|(i, _, _)| *i);
    let mut by_partition = done.into_iter().map(|(_, p, scan)| (p, scan)).peekable();
    partitions
        .iter()
        .map(|&p| match by_partition.next_if(|(q, _)| *q == p) {
            Some(found) => found,
            None => (p, Err(TailScanError::TaskFailed)),
        })
        .collect()
}

/// Copies of parent records, found in the child's tails when the cursor started, at or past
/// the position it started from: after a crash, the offset file may be a commit or two
/// behind the child, and those slabs are read again. A record whose copy the child holds with
/// the same content (key, headers, value) is not committed again, whichever child partition
/// it went to (a stateful router may place the repeat elsewhere, where no partition's window
/// of origins would see it). Bounded as the tail scan is: the copies among the last
/// [`provenance::MAX_TAIL_COPIES`] records of each child partition.
#[derive(Debug, Default)]
pub struct Held {
    copies: provenance::TailCopies,
}

impl Held {
    /// The copies of `copies` at or past `position`.
    fn from_position(mut copies: provenance::TailCopies, position: u64) -> Held {
        copies = copies.split_off(&position);
        Held { copies }
    }

    /// Whether nothing is held (the common case: a clean start).
    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }

    /// Takes out of `records` (a slab read from its first offset on) those the child already
    /// holds; returns how many. Forgets the copies below the slab: the cursor has passed
    /// them. A slab read again (after a pause or a failed read) is filtered the same way.
    pub(crate) fn drop_held(&mut self, records: &mut Vec<narad_storage::StoredRecord>) -> usize {
        let Some(first) = records.first().map(|r| r.offset) else {
            return 0;
        };
        self.copies = self.copies.split_off(&first);
        if self.copies.is_empty() {
            return 0;
        }
        let before = records.len();
        records.retain(|record| {
            self.copies
                .get(&record.offset)
                .is_none_or(|copies| !copies.contains(&provenance::fingerprint(record)))
        });
        before - records.len()
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
pub(crate) fn note_parent_end_rewind(from: u64, to: u64, key: &CursorKey, status: &CursorStatus) {
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
) -> Result<u64, OpenError> {
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

#[cfg(test)]
mod tests;
