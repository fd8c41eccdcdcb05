//! Forced re-creation: a partition whose owner is dead is made again, empty, on another node,
//! accepting that the records only the dead node held are lost.
//!
//! This is the one step in cluster mode that gives up data, so it is never automatic: an
//! operator asks for it (`narad partition recreate T/P --on ID --accept-loss`) when the dead
//! node's disk is not coming back. Everything else stays as safe as before:
//!
//! - **Only a dead owner.** The owner must be absent from a linearizable read of the live
//!   nodes; a live one is moved with `narad partition move`, which loses nothing. A dead node
//!   fences itself before its lease runs out (no writes, no child commits), so by the time the
//!   lease is gone it sends nothing more.
//! - **No offset is reused where it could be mistaken for an old one.** Children drop a copy
//!   whose origin (attach epoch, parent partition, parent offset) they already hold. A new log
//!   that started at 0 would give its records the offsets of old ones still in those windows,
//!   and they would be dropped as duplicates: a silent loss. So the new log starts above every
//!   parent offset of this partition any child still remembers (each child partition's owner
//!   answers from its dedupe window; one that cannot answer stops the re-creation), or at the
//!   operator's `start_offset` if that is higher (pass the last high watermark seen, so
//!   consumers reading the partition directly never meet a reused offset either).
//! - **The loss is counted.** Each link from the partition gets an offset file at the first
//!   offset its child is not known to hold (one past the highest its windows remember; the
//!   attach point when they remember none). Its cursor starts there, finds those offsets
//!   below the new log's start, and counts them on `narad_fanout_child_dropped_messages`
//!   like any drop-behind: at most what the link lost (records it got whose origins left the
//!   windows are counted too). Records of the old log above every child's copies are lost
//!   uncounted: nothing alive knows how many there were. A partition that was itself a
//!   child loses what it held; the cursors feeding it go on from where they are.
//! - **Fenced like a move.** The new log is laid out in the staging area, installed, and only
//!   then does a compare-and-swap of the owner record make this node the owner, one generation
//!   up; a lost race removes the (empty) copy. If the dead node comes back, the metadata no
//!   longer names it, so it serves nothing of its old copy, which stays on its disk untouched
//!   (listed as unaccounted, or set aside if it was still registered).

use std::sync::Arc;

use narad_storage::cursor::gaps::{self, Gap, GapLedger, GapReason, gaps_file_name};
use narad_storage::cursor::{CursorRecord, cursor_file_name, format};
use narad_storage::{PartitionId, StorageError, Store};
use serde::{Deserialize, Serialize};

use crate::blocking::BlockingError;
use crate::cluster::receiver::{CommitReceiver, HighestOriginError};
use crate::cluster::{ClusterContext, PEER_CALL_TIMEOUT, PeerError};
use crate::metastore::link::epoch_bytes;
use crate::metastore::{LinkMeta, Metastore, MetastoreError, PartitionOwner, Snapshot};

/// Child partitions asked at once for the highest origin they hold.
const ASKED_AT_ONCE: usize = 16;

/// The internal route a child partition's owner answers [`HighestOriginRequest`] on.
pub(crate) fn highest_origin_path(child: &PartitionId) -> String {
    format!(
        "/internal/v1/topics/{}/partitions/{}/highest-origin",
        child.topic, child.partition
    )
}

/// The internal route that makes the node called re-create the partition on itself.
pub(crate) fn recreate_here_path(id: &PartitionId) -> String {
    format!(
        "/internal/v1/topics/{}/partitions/{}/recreate-here",
        id.topic, id.partition
    )
}

/// Asks a child partition's owner for the highest parent offset it holds from one parent
/// partition under one attach epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HighestOriginRequest {
    /// The link's attach epoch (16 hex digits).
    pub epoch: String,
    /// The parent partition.
    pub parent_partition: u32,
    /// The owner record's generation once re-created: commits from the parent partition's
    /// old owner (lower generations) are refused from this call on, so nothing it still
    /// sends can land above the answer. Absent from older senders.
    #[serde(default)]
    pub fence_below: Option<u64>,
}

/// The answer to a [`HighestOriginRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HighestOrigin {
    /// The highest parent offset held, if any record of that origin is remembered.
    pub highest: Option<u64>,
}

/// What the node asked to re-create a partition on itself is told.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecreateHereRequest {
    /// The lowest offset the new log may start at (it starts higher if a child remembers a
    /// higher one).
    #[serde(default)]
    pub start_offset: Option<u64>,
    /// The operator's acceptance of the loss, carried from the public request: the route
    /// refuses to re-create anything without it, whoever calls it.
    #[serde(default)]
    pub accept_loss: bool,
}

/// What one link from the re-created partition lost, as far as anything alive can tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkLoss {
    /// The child topic.
    pub child: String,
    /// The highest parent offset of the partition the child still remembers, if any.
    pub child_holds_up_to: Option<u64>,
    /// Where the link's cursor starts: offsets from here to the new log's start are counted
    /// as dropped.
    pub resume_offset: u64,
    /// Offsets counted as dropped for this link: at most what it lost.
    pub dropped_at_most: u64,
}

/// What a finished re-creation reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecreateReport {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The dead node that owned it.
    pub from: String,
    /// The node that owns it now.
    pub to: String,
    /// The owner record's generation now.
    pub generation: u64,
    /// The offset the new, empty log starts at.
    pub start_offset: u64,
    /// Per link from the partition, what it lost.
    pub links: Vec<LinkLoss>,
    /// Links into the partition (it was their child): what it held of them is lost, and
    /// their cursors go on from where they are.
    pub fed_by: Vec<String>,
}

/// Why a re-creation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RecreateError {
    /// The metadata could not be read or written, or the owner record changed under us.
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// Laying out or installing the new log failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Blocking file work did not finish.
    #[error(transparent)]
    Task(#[from] BlockingError),
    /// The live nodes could not be read from etcd.
    #[error("cannot read the live nodes from etcd: {0}")]
    Membership(String),
    /// The topic or partition does not exist, or has no owner record.
    #[error("partition {partition} does not exist or has no owner in the cluster metadata")]
    UnknownPartition {
        /// The partition.
        partition: PartitionId,
    },
    /// The owner is alive: nothing needs to be lost.
    #[error(
        "node {node}, the owner of {partition}, is alive: move the partition with `narad \
         partition move` instead, which loses nothing"
    )]
    OwnerAlive {
        /// The partition.
        partition: PartitionId,
        /// Its owner.
        node: String,
    },
    /// This node already owns the partition.
    #[error("node {node} already owns {partition}")]
    AlreadyOwner {
        /// The partition.
        partition: PartitionId,
        /// This node.
        node: String,
    },
    /// A child partition of a link from this partition could not say which offsets it holds,
    /// so no safe start offset is known.
    #[error(
        "cannot learn which offsets of {partition} child partition {child} holds (owner \
         {node}): {reason}; bring that node back or re-create that child partition first"
    )]
    ChildUnknown {
        /// The partition to re-create.
        partition: PartitionId,
        /// The child partition.
        child: PartitionId,
        /// Its owner.
        node: String,
        /// Why it did not answer.
        reason: String,
    },
    /// A link's offset file could not be encoded (its epoch is not plain text).
    #[error("cannot write the offset file for child {child}: {reason}")]
    OffsetFile {
        /// The child topic.
        child: String,
        /// Why.
        reason: String,
    },
    /// A directory for the partition is already here and could not be set aside.
    #[error(
        "a directory for {partition} is already on this node and could not be set aside: {reason}"
    )]
    Occupied {
        /// The partition.
        partition: PartitionId,
        /// Why it could not be set aside.
        reason: crate::topics::set_aside::SetAsideError,
    },
}

/// Runs this node's side of forced re-creations.
pub(crate) struct Recreator {
    cluster: Arc<ClusterContext>,
    store: Arc<Store>,
    receiver: Arc<CommitReceiver>,
}

impl Recreator {
    /// A recreator for this node: `receiver` answers for the child partitions this node owns.
    pub(crate) fn new(
        cluster: Arc<ClusterContext>,
        store: Arc<Store>,
        receiver: Arc<CommitReceiver>,
    ) -> Recreator {
        Recreator {
            cluster,
            store,
            receiver,
        }
    }

    fn me(&self) -> &str {
        self.cluster.node_id()
    }

    /// Re-creates partition `partition` of `topic`, empty, on this node (the rules in the
    /// module doc); `start_offset` is the lowest offset the new log may start at.
    pub(crate) async fn recreate_here(
        &self,
        topic: &str,
        partition: u32,
        start_offset: Option<u64>,
    ) -> Result<RecreateReport, RecreateError> {
        let id = PartitionId::new(topic.to_owned(), partition);
        let snapshot = self.cluster.metastore.confirm().await?;
        let owner = snapshot
            .topics
            .get(topic)
            .and_then(|t| t.owners.get(partition as usize).cloned())
            .ok_or_else(|| RecreateError::UnknownPartition {
                partition: id.clone(),
            })?;
        if owner.node == self.me() {
            return Err(RecreateError::AlreadyOwner {
                partition: id,
                node: owner.node,
            });
        }
        let live = self
            .cluster
            .membership
            .live_nodes()
            .await
            .map_err(|e| RecreateError::Membership(e.to_string()))?;
        if live.iter().any(|n| n.id == owner.node) {
            return Err(RecreateError::OwnerAlive {
                partition: id,
                node: owner.node,
            });
        }

        let links: Vec<&LinkMeta> = snapshot
            .links
            .values()
            .filter(|l| l.parent == topic)
            .collect();
        let mut held = Vec::with_capacity(links.len());
        for link in &links {
            held.push(
                self.highest_held(&snapshot, &id, link, owner.generation + 1)
                    .await?,
            );
        }
        let start = new_start(&held, start_offset);
        let losses = link_losses(links.iter().copied(), &held, partition, start);

        self.lay_out(&id, start, &links, &losses).await?;
        let new_owner = PartitionOwner {
            node: self.me().to_owned(),
            generation: owner.generation + 1,
            moving_to: None,
        };
        if let Err(e) = self
            .cluster
            .metastore
            .set_owner_of_dead_node(topic, partition, owner.clone(), new_owner.clone())
            .await
        {
            // Someone else changed the record first: the empty copy is not ours to serve.
            let (store, drop_id) = (Arc::clone(&self.store), id.clone());
            if let Err(e) = crate::blocking::run(move || store.remove_partition(&drop_id)).await {
                tracing::warn!(partition = %id, error = %e, "could not remove an unused re-created copy");
            }
            return Err(e.into());
        }
        let fed_by = feeding(&snapshot, topic);
        tracing::warn!(partition = %id, from = %owner.node, to = %self.me(),
            generation = new_owner.generation, start_offset = start,
            dropped_at_most = losses.iter().map(|l| l.dropped_at_most).sum::<u64>(),
            fed_by = ?fed_by,
            "partition re-created empty: the records only the dead node held are lost");
        Ok(RecreateReport {
            topic: topic.to_owned(),
            partition,
            from: owner.node,
            to: new_owner.node,
            generation: new_owner.generation,
            start_offset: start,
            links: losses,
            fed_by,
        })
    }

    /// The highest parent offset of `id` that any partition of `link`'s child remembers.
    async fn highest_held(
        &self,
        snapshot: &Snapshot,
        id: &PartitionId,
        link: &LinkMeta,
        fence_below: u64,
    ) -> Result<Option<u64>, RecreateError> {
        let Some(child) = snapshot.topics.get(&link.child) else {
            return Ok(None);
        };
        let epoch = epoch_bytes(&link.attach_epoch).map_err(|e| RecreateError::ChildUnknown {
            partition: id.clone(),
            child: PartitionId::new(link.child.clone(), 0),
            node: self.me().to_owned(),
            reason: e.to_string(),
        })?;
        let mut highest = None;
        let mut asks = tokio::task::JoinSet::new();
        for q in 0..child.partitions {
            if asks.len() >= ASKED_AT_ONCE
                && let Some(done) = asks.join_next().await
            {
                highest = highest.max(joined(done)?);
            }
            let child_id = PartitionId::new(link.child.clone(), q);
            let node = child
                .owners
                .get(q as usize)
                .map(|o| o.node.clone())
                .unwrap_or_default();
            let (cluster, receiver) = (Arc::clone(&self.cluster), Arc::clone(&self.receiver));
            let id = id.clone();
            let question = HighestOriginRequest {
                epoch: link.attach_epoch.clone(),
                parent_partition: id.partition,
                fence_below: Some(fence_below),
            };
            asks.spawn(async move {
                ask(&cluster, &receiver, &child_id, &node, epoch, question)
                    .await
                    .map_err(|reason| RecreateError::ChildUnknown {
                        partition: id,
                        child: child_id,
                        node,
                        reason,
                    })
            });
        }
        while let Some(done) = asks.join_next().await {
            highest = highest.max(joined(done)?);
        }
        Ok(highest)
    }

    /// Lays the empty log and the links' offset files out in the staging area and installs
    /// them in `topics/` (setting aside whatever directory was there).
    async fn lay_out(
        &self,
        id: &PartitionId,
        start: u64,
        links: &[&LinkMeta],
        losses: &[LinkLoss],
    ) -> Result<(), RecreateError> {
        let files = resume_files(
            links.iter().copied(),
            losses,
            start,
            Some(self.cluster.node_id()),
            narad_storage::Clock::now_ms(&narad_storage::SystemClock),
        )
        .map_err(|(child, reason)| RecreateError::OffsetFile { child, reason })?;
        let target = self
            .store
            .data_dir()
            .join(narad_storage::store::TOPICS_DIR_NAME)
            .join(&id.topic)
            .join(id.dir_name());
        if self.store.has_partition(id) {
            self.store.forget_partition(id);
        }
        if target.exists() {
            super::set_aside_partition(&self.store, &target, id, super::SET_ASIDE_BEFORE_RECREATE)
                .map_err(|reason| RecreateError::Occupied {
                    partition: id.clone(),
                    reason,
                })?;
        }
        let (store, stage_id) = (Arc::clone(&self.store), id.clone());
        crate::blocking::run(move || install_empty(&store, &stage_id, start, &files)).await??;
        Ok(())
    }
}

/// The parents of the links whose child is `topic`: what a re-created partition of it held of
/// them is lost, and their cursors go on from where they are.
pub(crate) fn feeding(snapshot: &Snapshot, topic: &str) -> Vec<String> {
    snapshot
        .links
        .values()
        .filter(|l| l.child == topic)
        .map(|l| l.parent.clone())
        .collect()
}

/// Where a re-created partition's new log starts: one past the highest parent offset any
/// link's child holds (`held`, per link), or at `start_offset` if that is higher.
pub(crate) fn new_start(held: &[Option<u64>], start_offset: Option<u64>) -> u64 {
    let floor = held.iter().flatten().map(|h| h + 1).max().unwrap_or(0);
    floor.max(start_offset.unwrap_or(0))
}

/// What each of `links` lost when `partition` starts again at `start`, given the highest
/// parent offset each link's child holds (`held`, in link order): its cursor resumes just past
/// that (at its attach point when the child holds none) and counts up to `start` as dropped.
pub(crate) fn link_losses<'a>(
    links: impl IntoIterator<Item = &'a LinkMeta>,
    held: &[Option<u64>],
    partition: u32,
    start: u64,
) -> Vec<LinkLoss> {
    links
        .into_iter()
        .zip(held)
        .map(|(link, &holds)| {
            let resume = match holds {
                Some(h) => h + 1,
                None => attach_point(link, partition).unwrap_or(start),
            }
            .min(start);
            LinkLoss {
                child: link.child.clone(),
                child_holds_up_to: holds,
                resume_offset: resume,
                dropped_at_most: start - resume,
            }
        })
        .collect()
}

/// A file to lay out beside a new log: its name and bytes.
pub(crate) type NamedFile = (String, Vec<u8>);

/// Each link's offset file at its loss's resume offset, and its gap ledger with the range
/// `[resume, start)` on record as `recreated` (by `node`, at `at_ms`), so the cursor that skips
/// those offsets counts them under the reason they were lost for; `Err` names the child whose
/// file could not be encoded, and why.
pub(crate) fn resume_files<'a>(
    links: impl IntoIterator<Item = &'a LinkMeta>,
    losses: &[LinkLoss],
    start: u64,
    node: Option<&str>,
    at_ms: i64,
) -> Result<Vec<NamedFile>, (String, String)> {
    let mut files = Vec::new();
    for (link, loss) in links.into_iter().zip(losses) {
        let record = CursorRecord {
            epoch: link.attach_epoch.clone(),
            next_offset: loss.resume_offset,
        };
        let (bytes, _) =
            format::encode(&record).map_err(|e| (link.child.clone(), e.to_string()))?;
        files.push((cursor_file_name(&link.child), bytes));
        let mut ledger = GapLedger::new(link.attach_epoch.clone());
        ledger.add(Gap {
            from: loss.resume_offset,
            to: start,
            reason: GapReason::Recreated,
            at_ms,
            node: node.map(str::to_owned),
        });
        if !ledger.gaps.is_empty() {
            files.push((gaps_file_name(&link.child), gaps::encode(&ledger)));
        }
    }
    Ok(files)
}

/// Lays an empty log starting at `start`, with `files` beside it, out in the staging area and
/// installs it as `id`'s directory (abandoning the staging copy if a write fails). Blocking.
pub(crate) fn install_empty(
    store: &Store,
    id: &PartitionId,
    start: u64,
    files: &[NamedFile],
) -> Result<(), StorageError> {
    let staging = store.stage(id)?;
    let laid_out = staging.write_empty_log(start).and_then(|()| {
        files
            .iter()
            .try_for_each(|(name, bytes)| staging.write_file(name, bytes))
    });
    match laid_out {
        Ok(()) => staging.install(),
        Err(e) => {
            staging.abandon();
            Err(e)
        }
    }
}

/// A finished ask; a task that panicked is an unknown answer, never "holds nothing".
fn joined(
    done: Result<Result<Option<u64>, RecreateError>, tokio::task::JoinError>,
) -> Result<Option<u64>, RecreateError> {
    done.map_err(|e| RecreateError::Task(BlockingError::from(e)))?
}

/// Asks the owner `node` of `child` (this node, through `receiver`, or another) the
/// `request` (`epoch` is its attach epoch, decoded): the highest offset of its parent
/// partition it remembers, fencing the old generations.
async fn ask(
    cluster: &ClusterContext,
    receiver: &Arc<CommitReceiver>,
    child: &PartitionId,
    node: &str,
    epoch: [u8; 8],
    request: HighestOriginRequest,
) -> Result<Option<u64>, String> {
    if node == cluster.node_id() {
        let (receiver, child) = (Arc::clone(receiver), child.clone());
        return crate::blocking::run(move || {
            receiver.highest_origin(&child, epoch, request.parent_partition, request.fence_below)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string());
    }
    let answer = cluster
        .post_peer(
            node,
            &highest_origin_path(child),
            &request,
            PEER_CALL_TIMEOUT,
        )
        .await
        .map_err(|e| e.reason)?;
    if !answer.status().is_success() {
        return Err(PeerError::refused(node, answer).await.reason);
    }
    answer
        .json::<HighestOrigin>()
        .await
        .map(|a| a.highest)
        .map_err(|e| format!("answered something that does not decode: {e}"))
}

/// Where `link`'s cursor on `partition` starts when nothing says how far it got: its attach
/// point (0 for a partition added after the attach); `None` for a link from before attach
/// points, which starts at the tail.
fn attach_point(link: &LinkMeta, partition: u32) -> Option<u64> {
    link.attach_offsets
        .as_ref()
        .map(|offsets| offsets.get(partition as usize).copied().unwrap_or(0))
}

/// `POST /internal/v1/topics/{t}/partitions/{p}/highest-origin`, served by the child
/// partition's owner from its dedupe window.
pub(crate) async fn highest_origin_route(
    axum::extract::State(receiver): axum::extract::State<Arc<CommitReceiver>>,
    axum::extract::Path((topic, partition)): axum::extract::Path<(String, u32)>,
    axum::Json(request): axum::Json<HighestOriginRequest>,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let Ok(epoch) = epoch_bytes(&request.epoch) else {
        return (
            StatusCode::BAD_REQUEST,
            "epoch must be 16 lowercase hex digits",
        )
            .into_response();
    };
    let id = PartitionId::new(topic, partition);
    let answer = crate::blocking::run(move || {
        receiver.highest_origin(&id, epoch, request.parent_partition, request.fence_below)
    })
    .await;
    match answer {
        Ok(Ok(highest)) => axum::Json(HighestOrigin { highest }).into_response(),
        Ok(Err(e @ HighestOriginError::NotOwner { .. })) => {
            (StatusCode::CONFLICT, e.to_string()).into_response()
        }
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
