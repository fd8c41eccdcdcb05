//! The receiving end of a child commit, on the node that owns the child partition.
//!
//! For each request, in this order:
//! 1. **Fence**: the partition must be this node's at exactly the generation the sender saw;
//!    otherwise nothing is appended and the answer is [`CommitResponse::NotOwner`], so a sender
//!    with a stale view (the partition moved) refreshes it instead of writing to an old copy.
//!    The sender must also still own the parent partition: a commit names the generation at
//!    which its sender owns it, and one below what this node's metadata shows (or below a
//!    re-creation's fence, [`CommitReceiver::highest_origin`]) comes from a node that was
//!    counted dead and replaced; it is refused, so the children never get a copy of a log the
//!    re-created partition gives other records' offsets to.
//! 2. **Dedupe**: records whose origin the partition already holds ([`OriginWindow`]) are
//!    dropped. The window is built from the partition's tail the first time the partition is
//!    committed to after a start, so a slab repeated across a crash of either node is absorbed.
//! 3. **Append** the rest with the same append + `fdatasync` + verify as any produce, then, and
//!    only then, remember their origins.
//!
//! Commits to one partition are serialised (a per-partition lock held across 2 and 3): a retry
//! that overtakes its own still-running original must see the original's records.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use narad_storage::{
    AppendBatch, BatchOrigin, EncodedBatch, NewRecord, PartitionId, StorageError, Store,
    StoredRecord,
};

use super::commit_wire::{CommitRequest, CommitResponse, FrameCommits};
use super::dedupe::{
    OriginWindow, WINDOW_ORIGINS, for_each_tail_record, same_content, stored_at, without_held,
};
use crate::metastore::PartitionOwner;

/// Who owns a partition, with its generation, as this node's metadata says.
pub(crate) type OwnerLookup = dyn Fn(&PartitionId) -> Option<PartitionOwner> + Send + Sync;

/// What this node's metadata says of the parent partition a commit's records come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParentSeen {
    /// No link into the child topic has the commit's attach epoch (detached, or not known
    /// here yet).
    UnknownLink,
    /// The link's parent partition, with its owner if the metadata names one.
    Partition {
        /// The parent partition.
        parent: PartitionId,
        /// Its owner.
        owner: Option<PartitionOwner>,
    },
}

/// The parent partition of records committed to `child` under `epoch` from parent partition
/// `parent_partition`, as this node's metadata says.
pub(crate) type ParentLookup = dyn Fn(&str, [u8; 8], u32) -> ParentSeen + Send + Sync;

/// How long a re-creation's fence on a parent partition's old generations outlives a copy of
/// the metadata that does not show the re-creation: long enough for any commit in flight when
/// it was set, short enough that a re-creation that failed (the old owner came back first)
/// does not stall that owner's cursors for good.
const PARENT_FENCE_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// The lowest parent generation commits from one parent partition under one attach epoch may
/// name, set by a re-creation before it reads what the child holds.
#[derive(Debug, Clone, Copy)]
struct ParentFence {
    min_generation: u64,
    set_at: std::time::Instant,
}

/// What [`CommitReceiver::commit_in_order`] does with one request once it is deduplicated.
enum Plan {
    /// Every record is already held: nothing to append.
    Held { deduplicated: u32 },
    /// Appended as batch `at` of the commit's append.
    Append { at: usize, deduplicated: u32 },
    /// What is left of it cannot be encoded (the reason); those after it wait.
    Refused(String),
    /// Not appended: a request before it could not be.
    Behind,
}

/// A partition's window, with the ownership generation it was built for.
type GenerationWindow = (u64, OriginWindow);

/// Applies child commits addressed to this node.
pub(crate) struct CommitReceiver {
    node: String,
    store: Arc<Store>,
    owners: Arc<OwnerLookup>,
    windows: Mutex<HashMap<PartitionId, Arc<Mutex<Option<GenerationWindow>>>>>,
    window_capacity: usize,
    fence: Option<Arc<dyn crate::ownership::WriteFence>>,
    reused: prometheus_client::metrics::counter::Counter,
    parents: Option<Arc<ParentLookup>>,
    parent_fences: Mutex<HashMap<([u8; 8], u32), ParentFence>>,
}

impl CommitReceiver {
    /// A receiver for node `node`, appending to `store`, fencing with `owners`.
    pub(crate) fn new(node: String, store: Arc<Store>, owners: Arc<OwnerLookup>) -> CommitReceiver {
        CommitReceiver {
            node,
            store,
            owners,
            windows: Mutex::new(HashMap::new()),
            window_capacity: WINDOW_ORIGINS,
            fence: None,
            reused: prometheus_client::metrics::counter::Counter::default(),
            parents: None,
            parent_fences: Mutex::new(HashMap::new()),
        }
    }

    /// This receiver, checking with `parents` that the sender of a commit naming a parent
    /// generation still owns the parent partition at it (module doc).
    pub(crate) fn with_parents(mut self, parents: Arc<ParentLookup>) -> CommitReceiver {
        self.parents = Some(parents);
        self
    }

    /// This receiver, counting on `counter` the records it appends under a held origin with
    /// other content (`narad_cluster_commit_reused_origin_records_total`).
    pub(crate) fn counting_reused_on(
        mut self,
        counter: prometheus_client::metrics::counter::Counter,
    ) -> CommitReceiver {
        self.reused = counter;
        self
    }

    /// This receiver, refusing every commit while `fence` says why not (the node lost etcd),
    /// and acknowledging none `fence` does not confirm once it is durable.
    pub(crate) fn with_fence(
        mut self,
        fence: Arc<dyn crate::ownership::WriteFence>,
    ) -> CommitReceiver {
        self.fence = Some(fence);
        self
    }

    /// Applies one commit (blocking: call it on the blocking pool).
    pub(crate) fn commit(&self, request: CommitRequest) -> CommitResponse {
        let mut answers = self.commit_in_order(vec![request]);
        answers.pop().unwrap_or_else(|| CommitResponse::Failed {
            reason: "the commit got no answer".to_owned(),
        })
    }

    /// Applies commits to one child partition (the buckets of consecutive slabs) in this
    /// order, answering each: fenced and deduplicated as [`CommitReceiver::commit`] does each,
    /// and what is left of them appended together ([`Store::append_encoded_in_order`]: one
    /// `fdatasync`), none appended unless those before it are. Requests for several
    /// partitions or generations are all refused. Blocking.
    pub(crate) fn commit_in_order(&self, requests: Vec<CommitRequest>) -> Vec<CommitResponse> {
        let Some(first) = requests.first() else {
            return Vec::new();
        };
        let (topic, partition, generation) =
            (first.topic.clone(), first.partition, first.generation);
        if requests
            .iter()
            .any(|r| r.topic != topic || r.partition != partition || r.generation != generation)
        {
            let reason = "the commits of one call must be for one partition at one generation";
            return vec![
                CommitResponse::Failed {
                    reason: reason.to_owned()
                };
                requests.len()
            ];
        }
        let incoming = requests.into_iter().map(Incoming::from).collect();
        self.commit_incoming(PartitionId::new(topic, partition), generation, incoming)
    }

    /// Applies the frames of one frames call as [`CommitReceiver::commit_in_order`] applies
    /// commits; a frame none of whose records the partition holds is appended as it came,
    /// without decoding a record. Blocking.
    pub(crate) fn commit_frames(&self, call: FrameCommits) -> Vec<CommitResponse> {
        let parent_generation = call.parent_generation;
        let incoming = call
            .frames
            .into_iter()
            .map(|(frame, origin)| Incoming::frame(frame, origin, parent_generation))
            .collect();
        self.commit_incoming(
            PartitionId::new(call.topic, call.partition),
            call.generation,
            incoming,
        )
    }

    /// Applies `incoming` (the buckets of consecutive slabs) to `id`, which the senders saw
    /// at `generation`: fenced, deduplicated and appended together, one answer each, as
    /// [`CommitReceiver::commit_in_order`] does. Blocking.
    pub(crate) fn commit_incoming(
        &self,
        id: PartitionId,
        generation: u64,
        incoming: Vec<Incoming>,
    ) -> Vec<CommitResponse> {
        if incoming.is_empty() {
            return Vec::new();
        }
        let refuse_all = |answer: CommitResponse| vec![answer; incoming.len()];
        let term = match self.fence.as_ref().map(|fence| fence.admit()).transpose() {
            Ok(term) => term,
            Err(fenced) => {
                return refuse_all(CommitResponse::Failed {
                    reason: fenced.to_string(),
                });
            }
        };
        let owner = (self.owners)(&id);
        match &owner {
            Some(o) if o.node == self.node && o.generation == generation => {
                if let Some(to) = &o.moving_to {
                    // The partition is sealed, or about to be: the sender waits and retries,
                    // and after the move sends to the new owner.
                    return refuse_all(CommitResponse::Failed {
                        reason: format!("child partition {id} is being moved to node {to}"),
                    });
                }
            }
            _ => {
                return refuse_all(CommitResponse::NotOwner {
                    owner: owner.as_ref().map(|o| o.node.clone()),
                    generation: owner.map(|o| o.generation),
                });
            }
        }
        let slot = {
            let mut windows = self
                .windows
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            Arc::clone(windows.entry(id.clone()).or_default())
        };
        let mut window = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Checked under the partition's lock: a re-creation's fence set while this waited for
        // it is seen here (`highest_origin`).
        if let Some(reason) = incoming
            .iter()
            .find_map(|c| self.stale_parent(&id.topic, c))
        {
            return refuse_all(CommitResponse::Failed { reason });
        }
        // A window belongs to one generation: a partition that moved away and came back holds
        // records appended elsewhere meanwhile, so its window is built again from its tail.
        if window.as_ref().map(|(generation, _)| *generation) != Some(generation) {
            match self.rebuild(&id) {
                Ok(rebuilt) => *window = Some((generation, rebuilt)),
                Err(e) => return refuse_all(failed(&e)),
            }
        }
        let Some((_, window)) = window.as_mut() else {
            return refuse_all(CommitResponse::Failed {
                reason: "dedupe window missing".to_owned(),
            });
        };
        let answers = self.append_in_order(&id, window, incoming);
        // Durable now; acknowledged only if the node kept its lease and the partition
        // throughout (a node stopped mid-commit past its lease may have been replaced).
        let confirmed = match (&self.fence, term) {
            (Some(fence), Some(term)) => fence.confirm(term, &id).map_err(|e| e.to_string()),
            _ => Ok(()),
        }
        .and_then(|()| match (self.owners)(&id) {
            Some(o) if o.node == self.node && o.generation == generation => Ok(()),
            _ => Err(format!(
                "child partition {id} changed owner while a commit to it was in progress: not \
                 acknowledged (it may or may not be stored); retry"
            )),
        });
        match confirmed {
            Ok(()) => answers,
            Err(reason) => answers
                .into_iter()
                .map(|answer| match answer {
                    CommitResponse::Committed { .. } => CommitResponse::Failed {
                        reason: reason.clone(),
                    },
                    other => other,
                })
                .collect(),
        }
    }

    /// Why `request` must not be appended because its sender no longer owns the parent
    /// partition at the generation it names (module doc), or because no link into the topic
    /// has its epoch, or the link's parent has no such partition; `None` when it may be. A
    /// request that names no parent generation (a sender from before it was sent) is checked
    /// only for its link and parent partition.
    fn stale_parent(&self, topic: &str, commit: &Incoming) -> Option<String> {
        let (epoch, parent_partition) = (commit.origin.epoch, commit.origin.parent_partition);
        let key = (epoch, parent_partition);
        let seen = self
            .parents
            .as_ref()
            .map(|parents| parents(topic, epoch, parent_partition));
        // Whoever sends: the records must come from a link into this topic with that epoch,
        // from a partition its parent has.
        let cached = match &seen {
            Some(ParentSeen::UnknownLink) => {
                return Some(format!(
                    "no link into {} has attach epoch {} in node {}'s metadata (detached, or not \
                     known here yet): nothing appended",
                    topic,
                    hex::encode(epoch),
                    self.node
                ));
            }
            Some(ParentSeen::Partition {
                parent,
                owner: None,
            }) => {
                return Some(format!(
                    "parent partition {parent} of the link into {} is not in node {}'s \
                     metadata: nothing appended",
                    topic, self.node
                ));
            }
            Some(ParentSeen::Partition {
                owner: Some(owner), ..
            }) => Some(owner.generation),
            None => None,
        };
        let claimed = commit.parent_generation?;
        let mut fences = self
            .parent_fences
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fenced_below = match fences.get(&key) {
            // The metadata shows the re-creation now (it checks from here on), or the
            // re-creation did not happen in time: the fence has done its work.
            Some(fence)
                if cached.is_some_and(|g| g >= fence.min_generation)
                    || fence.set_at.elapsed() > PARENT_FENCE_TTL =>
            {
                fences.remove(&key);
                None
            }
            Some(fence) => Some(fence.min_generation),
            None => None,
        };
        let least = cached.max(fenced_below)?;
        (claimed < least).then(|| {
            let parent = match &seen {
                Some(ParentSeen::Partition { parent, .. }) => parent.to_string(),
                _ => format!("partition {}", parent_partition),
            };
            format!(
                "the sender owned parent {parent} at generation {claimed}, but it is at \
                 generation {least} now (re-created or moved while the sender was counted \
                 dead): a stale sender's copies are refused"
            )
        })
    }

    /// Deduplicates `incoming` against `window` and appends what is left of it together, in
    /// order, remembering the origins of what became durable.
    fn append_in_order(
        &self,
        id: &PartitionId,
        window: &mut OriginWindow,
        incoming: Vec<Incoming>,
    ) -> Vec<CommitResponse> {
        let held: Vec<Vec<Option<u64>>> = incoming
            .iter()
            .map(|c| window.held_offsets(&c.origin))
            .collect();
        // What the partition stores under the held origins, to tell a repeat from a record
        // under a reused offset; read only when some origin is held, which is rare.
        let stored = match self.stored_at(id, held.iter().flatten().flatten().copied()) {
            Ok(stored) => stored,
            Err(e) => return vec![failed(&e); incoming.len()],
        };
        let mut plans = Vec::with_capacity(incoming.len());
        let mut batches = Vec::new();
        let mut origins = Vec::new();
        let mut blocked = false;
        let mut reused = 0;
        for (commit, held) in incoming.into_iter().zip(&held) {
            let (kept, deduplicated) = unheld(commit, held, &stored, &mut reused);
            let deduplicated = u32::try_from(deduplicated).unwrap_or(u32::MAX);
            let plan = match kept {
                None => Plan::Held { deduplicated },
                Some(_) if blocked => Plan::Behind,
                Some(Ok((encoded, origin))) => {
                    batches.push(encoded);
                    origins.push(origin);
                    Plan::Append {
                        at: batches.len() - 1,
                        deduplicated,
                    }
                }
                Some(Err(reason)) => {
                    blocked = true;
                    Plan::Refused(reason)
                }
            };
            plans.push(plan);
        }
        let (appended, failure) = match self.store.append_encoded_in_order(id, &mut batches) {
            Ok(appended) => (appended, None),
            Err(e) => (e.appended, Some(e.error.to_string())),
        };
        for (origin, done) in origins.iter().zip(&appended) {
            if let Some(origin) = origin {
                window.remember_batch(origin, done.base_offset);
            }
        }
        if reused > 0 {
            self.reused.inc_by(reused as u64);
            tracing::warn!(partition = %id, records = reused,
                "records arrived under the origin (attach epoch, parent partition, parent offset) \
                 of records this partition holds, with other content: their parent partition \
                 gave those offsets to new records (its log was lost and started again, or an \
                 old copy was restored). They were appended, not dropped as repeats; consumers \
                 of the parent partition may have met the same offsets twice");
        }
        let behind = || CommitResponse::Failed {
            reason: "not appended: an earlier batch of the same commit failed".to_owned(),
        };
        plans
            .into_iter()
            .map(|plan| match plan {
                Plan::Held { deduplicated } => match self.store.high_watermark(id) {
                    Ok(end) => CommitResponse::Committed {
                        base_offset: end,
                        appended: 0,
                        deduplicated,
                        committed_at_ms: 0,
                    },
                    Err(e) => failed(&e),
                },
                Plan::Append { at, deduplicated } => match appended.get(at) {
                    Some(a) => CommitResponse::Committed {
                        base_offset: a.base_offset,
                        appended: a.count,
                        deduplicated,
                        committed_at_ms: a.committed_at_ms,
                    },
                    None if at == appended.len() => failure
                        .clone()
                        .map_or_else(behind, |reason| CommitResponse::Failed { reason }),
                    None => behind(),
                },
                Plan::Refused(reason) => CommitResponse::Failed { reason },
                Plan::Behind => behind(),
            })
            .collect()
    }

    /// Forgets the windows of partitions this node no longer owns (moved away, re-created
    /// elsewhere, deleted), so their memory (up to about half a MiB each) goes with them; a window
    /// is rebuilt from the tail if the partition comes back. Returns how many were dropped.
    pub(crate) fn forget_unowned(&self) -> usize {
        let mut windows = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = windows.len();
        windows.retain(|id, _| (self.owners)(id).is_some_and(|o| o.node == self.node));
        before - windows.len()
    }

    /// The highest parent offset of `parent_partition` under `epoch` that child partition `id`
    /// remembers (its dedupe window, built from its tail if no commit built it yet): a parent
    /// partition re-created empty must start above it, or its new records would be dropped
    /// as copies of the old ones. Only the owner answers. Blocking.
    ///
    /// With `fence_below`, commits from that parent partition under that epoch naming a lower
    /// parent generation are refused from now on (until this node's metadata shows the
    /// partition at that generation or later, or [`PARENT_FENCE_TTL`] passes): a re-creation
    /// sets it before it reads, so nothing its old owner sends can land above the answer.
    pub(crate) fn highest_origin(
        &self,
        id: &PartitionId,
        epoch: [u8; 8],
        parent_partition: u32,
        fence_below: Option<u64>,
    ) -> Result<Option<u64>, HighestOriginError> {
        let owner = (self.owners)(id);
        let generation = match &owner {
            Some(o) if o.node == self.node => o.generation,
            _ => {
                return Err(HighestOriginError::NotOwner {
                    partition: id.clone(),
                    owner: owner.map(|o| o.node),
                });
            }
        };
        let slot = {
            let mut windows = self
                .windows
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            Arc::clone(windows.entry(id.clone()).or_default())
        };
        if let Some(min_generation) = fence_below {
            self.parent_fences
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(
                    (epoch, parent_partition),
                    ParentFence {
                        min_generation,
                        set_at: std::time::Instant::now(),
                    },
                );
        }
        // Taken after the fence is set: a commit still appending holds it, so what it
        // appends is in the answer, and every later one sees the fence.
        let mut window = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if window.as_ref().map(|(g, _)| *g) != Some(generation) {
            *window = Some((generation, self.rebuild(id)?));
        }
        Ok(window
            .as_ref()
            .and_then(|(_, w)| w.highest_offset(epoch, parent_partition)))
    }

    /// The records `id` stores at `offsets` ([`stored_at`]).
    fn stored_at(
        &self,
        id: &PartitionId,
        offsets: impl Iterator<Item = u64>,
    ) -> Result<HashMap<u64, StoredRecord>, StorageError> {
        stored_at(&self.store, id, offsets)
    }

    /// The window of `id`, from its last [`WINDOW_ORIGINS`] records.
    fn rebuild(&self, id: &PartitionId) -> Result<OriginWindow, StorageError> {
        let mut origins = Vec::new();
        for_each_tail_record(&self.store, id, self.window_capacity, |r| {
            if let Some(origin) = r.origin {
                origins.push((origin, r.offset));
            }
        })?;
        Ok(OriginWindow::rebuild(
            self.window_capacity,
            origins.iter().map(|(origin, at)| (origin, *at)),
        ))
    }
}

/// Why [`CommitReceiver::highest_origin`] has no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum HighestOriginError {
    /// This node does not own the partition (by its metadata copy).
    #[error("this node does not own {partition} (its owner: {})", owner.as_deref().unwrap_or("none"))]
    NotOwner {
        /// The partition asked about.
        partition: PartitionId,
        /// Its owner by this node's metadata copy.
        owner: Option<String>,
    },
    /// Reading the partition's tail failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// One commit as the receiver applies it, however it crossed the wire.
pub(crate) struct Incoming {
    /// The generation at which the sender owns the records' parent partition, when it says.
    parent_generation: Option<u64>,
    /// The records' provenance.
    origin: BatchOrigin,
    /// The records.
    content: Content,
}

/// The records of an [`Incoming`] commit.
enum Content {
    /// Records decoded from the record wire format.
    Records(Vec<NewRecord>),
    /// The frame the sender encoded, checked on arrival: appended as it came when the
    /// partition holds none of its records.
    Frame(EncodedBatch),
}

impl Incoming {
    /// A commit of `frame` (encoded by this node, or checked on arrival) with its `origin`,
    /// from a sender owning the parent partition at `parent_generation`, if it says.
    pub(crate) fn frame(
        frame: EncodedBatch,
        origin: BatchOrigin,
        parent_generation: Option<u64>,
    ) -> Incoming {
        Incoming {
            parent_generation,
            origin,
            content: Content::Frame(frame),
        }
    }
}

impl From<CommitRequest> for Incoming {
    fn from(request: CommitRequest) -> Incoming {
        let parent_generation = request.parent_generation;
        let (records, origin) = request.into_parts();
        Incoming {
            parent_generation,
            origin,
            content: Content::Records(records),
        }
    }
}

/// A frame to append, with the origin its window remembers once it is durable.
type ToAppend = (EncodedBatch, Option<BatchOrigin>);

/// What is left of `commit` once the records `held` names (the child offsets its origins are
/// stored at, one per record) are dropped as repeats of what `stored` holds there, encoded
/// for the append with its origin; `None` when nothing is left. Records under a held origin
/// with other content are kept and counted in `reused`. The count is of records dropped.
fn unheld(
    commit: Incoming,
    held: &[Option<u64>],
    stored: &HashMap<u64, StoredRecord>,
    reused: &mut usize,
) -> (Option<Result<ToAppend, String>>, usize) {
    let Incoming {
        origin, content, ..
    } = commit;
    let records = match content {
        Content::Frame(frame) if held.iter().all(Option::is_none) => {
            return (Some(Ok((frame, Some(origin)))), 0);
        }
        Content::Frame(frame) => match frame.decode() {
            Ok(batch) => batch.records,
            // Checked whole on arrival: not reached.
            Err(e) => return (Some(Err(format!("the frame does not decode: {e}"))), 0),
        },
        Content::Records(records) => records,
    };
    let keep: Vec<bool> = records
        .iter()
        .zip(held)
        .map(|(record, at)| match at.and_then(|at| stored.get(&at)) {
            // Not held, or no longer stored (retention): append it.
            None => true,
            Some(old) if same_content(record, old) => false,
            Some(_) => {
                *reused += 1;
                true
            }
        })
        .collect();
    let batch = AppendBatch {
        records,
        origin: Some(origin),
    };
    let (kept, deduplicated) = without_held(batch, &keep);
    let kept = kept.map(|kept| {
        EncodedBatch::encode(&kept.records, kept.origin.as_ref())
            .map(|encoded| (encoded, kept.origin))
            .map_err(|e| e.to_string())
    });
    (kept, deduplicated)
}

fn failed(e: &StorageError) -> CommitResponse {
    CommitResponse::Failed {
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use narad_storage::{
        AppendBatch, BatchOrigin, LogConfig, NewRecord, ReadOptions, StoreOptions,
    };

    use super::*;

    fn request(generation: u64, offsets: &[u64]) -> CommitRequest {
        let batch = AppendBatch {
            records: offsets
                .iter()
                .map(|o| NewRecord {
                    value: Some(Bytes::from(format!("r{o}"))),
                    ..NewRecord::default()
                })
                .collect(),
            origin: Some(BatchOrigin {
                epoch: [1; 8],
                parent_partition: 0,
                slab_start: offsets[0],
                parent_offsets: offsets.to_vec(),
            }),
        };
        CommitRequest::from_batch("audit", 0, generation, batch).unwrap()
    }

    fn receiver(store: &Arc<Store>, node: &str, generation: u64) -> CommitReceiver {
        let owners: Arc<OwnerLookup> = Arc::new(move |_id: &PartitionId| {
            Some(PartitionOwner {
                node: "n1".to_owned(),
                generation,
                moving_to: None,
            })
        });
        CommitReceiver::new(node.to_owned(), Arc::clone(store), owners)
    }

    fn open(dir: &std::path::Path) -> Arc<Store> {
        let store = Store::open(dir, StoreOptions::default()).unwrap();
        store
            .create_partition(
                &PartitionId::new("audit".to_owned(), 0),
                LogConfig::default(),
            )
            .unwrap();
        Arc::new(store)
    }

    fn stored_values(store: &Store) -> Vec<String> {
        let read = store
            .read(
                &PartitionId::new("audit".to_owned(), 0),
                &ReadOptions {
                    offset: 0,
                    max_records: 1_000,
                    max_bytes: 1 << 20,
                    max_committed_at_ms: None,
                },
            )
            .unwrap();
        read.records
            .iter()
            .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
            .collect()
    }

    #[test]
    fn commits_in_order_share_one_append_and_each_is_answered_and_deduplicated() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let rx = receiver(&store, "n1", 3);
        let syncs = store.append_stats().syncs;
        let answers = rx.commit_in_order(vec![request(3, &[0, 1]), request(3, &[2, 3])]);
        assert!(
            matches!(
                answers.as_slice(),
                [
                    CommitResponse::Committed {
                        base_offset: 0,
                        appended: 2,
                        deduplicated: 0,
                        ..
                    },
                    CommitResponse::Committed {
                        base_offset: 2,
                        appended: 2,
                        deduplicated: 0,
                        ..
                    },
                ]
            ),
            "{answers:?}"
        );
        assert_eq!(
            store.append_stats().syncs - syncs,
            1,
            "one fdatasync for both"
        );
        // Repeated (a retry after a lost answer), and overlapping a new one: only the new
        // records are appended.
        let answers = rx.commit_in_order(vec![request(3, &[2, 3]), request(3, &[3, 4])]);
        assert!(
            matches!(
                answers.as_slice(),
                [
                    CommitResponse::Committed {
                        appended: 0,
                        deduplicated: 2,
                        ..
                    },
                    CommitResponse::Committed {
                        base_offset: 4,
                        appended: 1,
                        deduplicated: 1,
                        ..
                    },
                ]
            ),
            "{answers:?}"
        );
        assert_eq!(stored_values(&store), ["r0", "r1", "r2", "r3", "r4"]);
    }

    #[test]
    fn a_record_under_a_held_origin_with_other_content_is_appended_and_a_restart_knows_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let rx = receiver(&store, "n1", 3);
        rx.commit(request(3, &[0, 1]));
        // The parent reused offsets 0 and 1 for new records.
        let mut reused = request(3, &[0, 1]);
        for (i, record) in reused.records.iter_mut().enumerate() {
            record.value = format!("new{i}").into_bytes().into();
        }
        let answer = rx.commit(reused.clone());
        assert!(
            matches!(
                answer,
                CommitResponse::Committed {
                    appended: 2,
                    deduplicated: 0,
                    ..
                }
            ),
            "{answer:?}"
        );
        // A window rebuilt from the tail (a restart) holds the newest record under each
        // origin: a repeat of the new records is absorbed.
        let restarted = receiver(&store, "n1", 3);
        let answer = restarted.commit(reused);
        assert!(
            matches!(
                answer,
                CommitResponse::Committed {
                    appended: 0,
                    deduplicated: 2,
                    ..
                }
            ),
            "{answer:?}"
        );
        assert_eq!(stored_values(&store), ["r0", "r1", "new0", "new1"]);
    }

    #[test]
    fn a_commit_in_order_that_cannot_append_one_batch_appends_none_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let rx = receiver(&store, "n1", 3);
        // A record above the frame limit: its batch cannot be appended.
        let mut huge = request(3, &[2]);
        huge.records[0].value = vec![0; narad_storage::log::format::MAX_FRAME_BYTES + 1].into();
        let answers = rx.commit_in_order(vec![request(3, &[0, 1]), huge, request(3, &[3])]);
        assert!(
            matches!(
                answers.as_slice(),
                [
                    CommitResponse::Committed { appended: 2, .. },
                    CommitResponse::Failed { .. },
                    CommitResponse::Failed { .. },
                ]
            ),
            "{answers:?}"
        );
        assert_eq!(
            stored_values(&store),
            ["r0", "r1"],
            "nothing after the refused batch"
        );
        // The refused records were not remembered: sent again, they are appended.
        assert!(matches!(
            rx.commit_in_order(vec![request(3, &[2]), request(3, &[3])])
                .as_slice(),
            [
                CommitResponse::Committed { appended: 1, .. },
                CommitResponse::Committed { appended: 1, .. },
            ]
        ));
        assert_eq!(stored_values(&store), ["r0", "r1", "r2", "r3"]);
    }

    #[test]
    fn commits_in_order_for_a_partition_this_node_does_not_own_or_mixing_partitions_append_nothing()
    {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let not_mine = receiver(&store, "n2", 3);
        let answers = not_mine.commit_in_order(vec![request(3, &[0]), request(3, &[1])]);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, CommitResponse::NotOwner { .. })),
            "{answers:?}"
        );
        assert!(stored_values(&store).is_empty());
        // One call mixing generations (or partitions) is refused whole.
        let mine = receiver(&store, "n1", 3);
        let answers = mine.commit_in_order(vec![request(3, &[0]), request(4, &[1])]);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, CommitResponse::Failed { .. })),
            "{answers:?}"
        );
        assert!(stored_values(&store).is_empty());
    }

    #[test]
    fn the_windows_of_partitions_owned_elsewhere_are_forgotten_and_rebuilt_if_they_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let owner = Arc::new(std::sync::Mutex::new("n1".to_owned()));
        let lookup = Arc::clone(&owner);
        let owners: Arc<OwnerLookup> = Arc::new(move |_id: &PartitionId| {
            Some(PartitionOwner {
                node: lookup.lock().unwrap().clone(),
                generation: 3,
                moving_to: None,
            })
        });
        let rx = CommitReceiver::new("n1".to_owned(), Arc::clone(&store), owners);
        assert!(matches!(
            rx.commit(request(3, &[0, 1])),
            CommitResponse::Committed { appended: 2, .. }
        ));
        assert_eq!(rx.forget_unowned(), 0, "still ours");
        *owner.lock().unwrap() = "n2".to_owned();
        assert_eq!(rx.forget_unowned(), 1);
        // Back here: the window is rebuilt from the tail, so the repeat is still absorbed.
        *owner.lock().unwrap() = "n1".to_owned();
        assert!(matches!(
            rx.commit(request(3, &[0, 1])),
            CommitResponse::Committed {
                appended: 0,
                deduplicated: 2,
                ..
            }
        ));
    }

    #[test]
    fn a_retried_commit_is_absorbed_and_counted_and_a_partial_retry_appends_only_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let rx = receiver(&store, "n1", 3);
        assert!(matches!(
            rx.commit(request(3, &[0, 1, 2])),
            CommitResponse::Committed {
                appended: 3,
                deduplicated: 0,
                ..
            }
        ));
        assert!(matches!(
            rx.commit(request(3, &[0, 1, 2])),
            CommitResponse::Committed {
                appended: 0,
                deduplicated: 3,
                base_offset: 3,
                ..
            }
        ));
        assert!(matches!(
            rx.commit(request(3, &[2, 3])),
            CommitResponse::Committed {
                appended: 1,
                deduplicated: 1,
                base_offset: 3,
                ..
            }
        ));
        assert_eq!(stored_values(&store), ["r0", "r1", "r2", "r3"]);
    }

    #[test]
    fn after_a_restart_the_window_is_rebuilt_from_the_tail_and_the_repeated_slab_is_absorbed() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path());
            receiver(&store, "n1", 1).commit(request(1, &[10, 11, 12]));
        }
        let store = open(dir.path());
        let rx = receiver(&store, "n1", 1);
        assert!(matches!(
            rx.commit(request(1, &[10, 11, 12, 13])),
            CommitResponse::Committed {
                appended: 1,
                deduplicated: 3,
                ..
            }
        ));
        assert_eq!(stored_values(&store), ["r10", "r11", "r12", "r13"]);
    }

    #[test]
    fn a_commit_for_another_owner_or_an_old_generation_appends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let not_mine = receiver(&store, "n2", 3);
        assert_eq!(
            not_mine.commit(request(3, &[0])),
            CommitResponse::NotOwner {
                owner: Some("n1".into()),
                generation: Some(3)
            }
        );
        let mine = receiver(&store, "n1", 3);
        assert!(matches!(
            mine.commit(request(2, &[0])),
            CommitResponse::NotOwner {
                generation: Some(3),
                ..
            }
        ));
        assert!(stored_values(&store).is_empty());
    }

    /// A receiver whose metadata gives parent partition `orders/0` (the link into `audit`
    /// with epoch `[1; 8]`) to node `n2` at `parent_generation`.
    fn receiver_with_parent(store: &Arc<Store>, parent_generation: u64) -> CommitReceiver {
        receiver(store, "n1", 3).with_parents(Arc::new(move |child: &str, epoch, partition| {
            if child != "audit" || epoch != [1; 8] {
                return ParentSeen::UnknownLink;
            }
            ParentSeen::Partition {
                parent: PartitionId::new("orders", partition),
                owner: Some(PartitionOwner {
                    node: "n2".to_owned(),
                    generation: parent_generation,
                    moving_to: None,
                }),
            }
        }))
    }

    fn from_parent_at(generation: u64, offsets: &[u64]) -> CommitRequest {
        let mut request = request(3, offsets);
        request.parent_generation = Some(generation);
        request
    }

    #[test]
    fn a_commit_from_a_parent_owner_at_an_older_generation_is_refused_and_nothing_appended() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let rx = receiver_with_parent(&store, 5);
        // The sender of a re-created (or moved) partition's old generation: refused.
        let refused = rx.commit(from_parent_at(4, &[0, 1]));
        assert!(
            matches!(&refused, CommitResponse::Failed { reason } if reason.contains("generation 5")),
            "{refused:?}"
        );
        assert!(stored_values(&store).is_empty());
        // The current owner, and one this copy of the metadata has not caught up with yet.
        for (generation, offsets) in [(5, [0, 1]), (6, [2, 3])] {
            let answer = rx.commit(from_parent_at(generation, &offsets));
            assert!(
                matches!(answer, CommitResponse::Committed { appended: 2, .. }),
                "{answer:?}"
            );
        }
        // A sender from before parent generations were sent is not checked.
        let answer = rx.commit(request(3, &[4]));
        assert!(
            matches!(answer, CommitResponse::Committed { appended: 1, .. }),
            "{answer:?}"
        );
        // A link this node does not know (detached): nothing appended.
        let mut unknown = from_parent_at(5, &[5]);
        unknown.epoch = [9; 8];
        let answer = rx.commit(unknown);
        assert!(
            matches!(answer, CommitResponse::Failed { .. }),
            "{answer:?}"
        );
        // Naming no generation does not get a forged origin past the link check.
        let mut forged = request(3, &[6]);
        forged.epoch = [9; 8];
        let answer = rx.commit(forged);
        assert!(
            matches!(&answer, CommitResponse::Failed { reason } if reason.contains("no link")),
            "{answer:?}"
        );
        assert_eq!(stored_values(&store), ["r0", "r1", "r2", "r3", "r4"]);
    }

    #[test]
    fn a_re_creations_fence_refuses_the_old_owner_before_the_metadata_shows_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        // The metadata here still shows the old owner at generation 5.
        let rx = receiver_with_parent(&store, 5);
        let answer = rx.commit(from_parent_at(5, &[0, 1]));
        assert!(
            matches!(answer, CommitResponse::Committed { .. }),
            "{answer:?}"
        );
        // A re-creation asks what the child holds, fencing generations below 6.
        let id = PartitionId::new("audit", 0);
        assert_eq!(rx.highest_origin(&id, [1; 8], 0, Some(6)).unwrap(), Some(1));
        // The old owner's next commit would land above the answer: refused.
        let refused = rx.commit(from_parent_at(5, &[2, 3]));
        assert!(
            matches!(refused, CommitResponse::Failed { .. }),
            "{refused:?}"
        );
        // The new owner's commits go in.
        let answer = rx.commit(from_parent_at(6, &[2, 3]));
        assert!(
            matches!(answer, CommitResponse::Committed { appended: 2, .. }),
            "{answer:?}"
        );
        // Asking without a fence (an older re-creating node) fences nothing.
        let rx = receiver_with_parent(&store, 5);
        assert_eq!(rx.highest_origin(&id, [1; 8], 0, None).unwrap(), Some(3));
        let answer = rx.commit(from_parent_at(5, &[4]));
        assert!(
            matches!(answer, CommitResponse::Committed { appended: 1, .. }),
            "{answer:?}"
        );
    }

    #[test]
    fn a_commit_made_durable_after_the_node_lost_its_lease_is_not_acknowledged() {
        use crate::ownership::{FenceError, WriteFence, WriteTerm};
        use std::sync::atomic::{AtomicI64, Ordering};

        /// A fence whose lease changes when the test says (the node was stopped past its
        /// lease while the append ran, and joined again).
        struct Lease(AtomicI64);
        impl WriteFence for Lease {
            fn admit(&self) -> Result<WriteTerm, FenceError> {
                Ok(WriteTerm(self.0.load(Ordering::SeqCst)))
            }
            fn confirm(&self, term: WriteTerm, partition: &PartitionId) -> Result<(), FenceError> {
                if term.0 == self.0.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(FenceError::LeaseLost {
                        node: crate::ownership::NodeId("n1".to_owned()),
                        partition: partition.clone(),
                    })
                }
            }
        }

        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let lease = Arc::new(Lease(AtomicI64::new(1)));
        let rx = receiver(&store, "n1", 3).with_fence(Arc::clone(&lease) as Arc<dyn WriteFence>);
        let answer = rx.commit(request(3, &[0]));
        assert!(
            matches!(answer, CommitResponse::Committed { .. }),
            "{answer:?}"
        );
        // The store's append stands in for the pause: the lease turns over under it.
        let turned = Arc::new(Lease(AtomicI64::new(1)));
        struct TurnsOver(Arc<Lease>);
        impl WriteFence for TurnsOver {
            fn admit(&self) -> Result<WriteTerm, FenceError> {
                let term = self.0.admit();
                self.0.0.fetch_add(1, Ordering::SeqCst);
                term
            }
            fn confirm(&self, term: WriteTerm, partition: &PartitionId) -> Result<(), FenceError> {
                self.0.confirm(term, partition)
            }
        }
        let rx = receiver(&store, "n1", 3).with_fence(Arc::new(TurnsOver(turned)));
        let answer = rx.commit(request(3, &[1]));
        assert!(
            matches!(&answer, CommitResponse::Failed { reason } if reason.contains("lost its lease")),
            "{answer:?}"
        );
    }
}
