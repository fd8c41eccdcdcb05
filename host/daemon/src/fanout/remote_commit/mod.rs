//! The child committer of cluster mode: a bucket goes to the node that owns its child
//! partition.
//!
//! For each commit, in this order:
//! 1. **Owner**: the child partition's owner and generation, from this node's watched
//!    metadata. None known: [`ChildCommitError::OwnerUnknown`], nothing sent.
//! 2. **Local**: owned by this node, the bucket is appended here exactly as on one node
//!    ([`Producer`]'s commit: append, `fdatasync`, verify), from the frame already encoded.
//! 3. **Alive**: another node's bucket needs that node's advertised address, which exists only
//!    while its lease does. None: [`ChildCommitError::OwnerDown`] at once, with no connect
//!    attempt, so a dead owner costs no timeout per try and stalls only its own buckets.
//! 4. **Send**: the frames the cursor encoded for the buckets go as they are, with their
//!    body CRCs, naming the generation seen in 1, over `POST /internal/v1/commit-frames` (up
//!    to [`MAX_COMMITS_PER_CALL`] a call), as an async call that holds no thread, taking one
//!    of the [`COMMITS_IN_FLIGHT_PER_PEER`] places of calls to that node
//!    ([`super::peer_calls`]), so a node that hangs holds that many calls and nothing more.
//!    An owner on an older build answers 404: it is sent [`CommitRequest`]s instead (records
//!    and provenance taken from the slab) over `commit-in-order`, or one `commit` each, and is
//!    not offered frames again for [`FRAMES_RETRY_AFTER`].
//! 5. **Answer**: `Committed` is an acknowledgement of every record sent, stored now or
//!    already held (counted on `narad_fanout_commit_deduplicated_records_total`); `NotOwner`
//!    appends nothing and the next try reads the owner again; anything else is an error the
//!    cursor retries, and a retry of a commit that was in fact stored is absorbed by the
//!    owner's dedupe.
//!
//! A dead owner is waited for, never routed around: the stall text names the child partition
//! and the node ("waiting for the owner of child partition child/p00001 (node n2): ...").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_storage::{Appended, BatchOrigin, PartitionId};

use super::committer::{
    BlockingCommitter, ChildBatch, ChildCommitError, ChildCommitter, CommitFuture, InOrderCommit,
    InOrderFailure,
};
use super::metrics::{ChildLabels, FanoutMetrics};
use super::peer_calls::{COMMITS_IN_FLIGHT_PER_PEER, PeerCalls};
use crate::cluster::commit_rpc::{CallError, CommitClient};
use crate::cluster::commit_wire::{
    CommitRequest, CommitResponse, FramesCall, MAX_COMMITS_PER_CALL, WireFrame, encode_frames,
};
use crate::cluster::receiver::{CommitReceiver, Incoming, OwnerLookup, ParentLookup, ParentSeen};
use crate::metastore::PartitionOwner;
use crate::produce::Producer;

/// The address a live node advertises (e.g. `http://10.0.0.5:7070`), `None` when the node is
/// not alive; in production `cluster::peers::PeerDirectory::advertise_of`.
pub(crate) type AddressLookup = dyn Fn(&str) -> Option<String> + Send + Sync;

/// Commits each bucket on the node that owns its child partition: here through the produce
/// path (on the blocking pool), elsewhere over the internal commit call (async, bounded per
/// node).
pub(crate) struct ClusterCommitter {
    node: String,
    local: Arc<Producer>,
    owners: Arc<OwnerLookup>,
    addresses: Arc<AddressLookup>,
    client: CommitClient,
    calls: PeerCalls,
    metrics: Arc<FanoutMetrics>,
    /// This node's own receiver: with it, a local child commit is fenced and deduplicated
    /// exactly as one from another node (one window per partition, whoever sends).
    receiver: Option<Arc<CommitReceiver>>,
    /// Why this node sends nothing now (it lost etcd), if it does not.
    fence: Option<Arc<dyn crate::ownership::WriteFence>>,
    /// The owner of each bucket's parent partition: a bucket is sent only while this node
    /// owns it, and names the generation it owns it at.
    parents: Option<Arc<ParentLookup>>,
    /// The nodes that answered 404 to a frames call, and when ([`FRAMES_RETRY_AFTER`]).
    without_frames: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for ClusterCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCommitter")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl ClusterCommitter {
    /// The committer of node `node`: child partitions `owners` gives to `node` are appended
    /// through `local`; the others are sent with `client` to the address `addresses` gives
    /// for their owner. Repeats the owners absorbed, and the calls under way to each node,
    /// are counted in `metrics`.
    pub(crate) fn new(
        node: String,
        local: Arc<Producer>,
        owners: Arc<OwnerLookup>,
        addresses: Arc<AddressLookup>,
        client: CommitClient,
        metrics: Arc<FanoutMetrics>,
    ) -> ClusterCommitter {
        ClusterCommitter {
            node,
            local,
            owners,
            addresses,
            client,
            calls: PeerCalls::new(COMMITS_IN_FLIGHT_PER_PEER, Arc::clone(&metrics)),
            metrics,
            receiver: None,
            fence: None,
            parents: None,
            without_frames: Mutex::new(HashMap::new()),
        }
    }

    /// The same committer, applying local child commits through `receiver` (the one this
    /// node's `/internal/v1/commit` serves), so that a slab repeated after a crash is absorbed
    /// on the cursor's own node too, not only on remote owners.
    pub(crate) fn with_local_receiver(mut self, receiver: Arc<CommitReceiver>) -> ClusterCommitter {
        self.receiver = Some(receiver);
        self
    }

    /// The same committer, sending nothing while `fence` gives a reason (the node could not
    /// renew its lease): the buckets wait in memory and are retried, as for a dead owner.
    pub(crate) fn with_fence(
        mut self,
        fence: Arc<dyn crate::ownership::WriteFence>,
    ) -> ClusterCommitter {
        self.fence = Some(fence);
        self
    }

    /// The same committer, sending a bucket only while `parents` says this node owns the
    /// parent partition its records come from, and naming the generation it owns it at (the
    /// receiver refuses a stale one).
    pub(crate) fn with_parents(mut self, parents: Arc<ParentLookup>) -> ClusterCommitter {
        self.parents = Some(parents);
        self
    }

    /// The request for one bucket of `partition`, owned at `generation`, naming the parent
    /// generation this node owns the records' parent partition at.
    fn request(
        &self,
        partition: &PartitionId,
        batch: &ChildBatch,
        generation: u64,
    ) -> Result<CommitRequest, ChildCommitError> {
        let decoded = batch
            .records()
            .map_err(|source| ChildCommitError::Undecodable {
                partition: partition.clone(),
                source,
            })?;
        let mut request =
            CommitRequest::from_batch(&partition.topic, partition.partition, generation, decoded)
                .ok_or_else(|| ChildCommitError::NoProvenance {
                partition: partition.clone(),
            })?;
        request.parent_generation =
            self.parent_generation(partition, request.epoch, request.parent_partition)?;
        Ok(request)
    }

    /// The generation at which this node owns `parent_partition`, the parent partition of
    /// records copied into `partition` under attach epoch `epoch`;
    /// [`ChildCommitError::NotParentOwner`] when it does not (`None` without a lookup).
    fn parent_generation(
        &self,
        partition: &PartitionId,
        epoch: [u8; 8],
        parent_partition: u32,
    ) -> Result<Option<u64>, ChildCommitError> {
        let Some(parents) = &self.parents else {
            return Ok(None);
        };
        let refuse = |reason: String| ChildCommitError::NotParentOwner {
            partition: partition.clone(),
            reason,
        };
        match parents(&partition.topic, epoch, parent_partition) {
            ParentSeen::Partition {
                owner: Some(owner), ..
            } if owner.node == self.node => Ok(Some(owner.generation)),
            ParentSeen::Partition { parent, owner } => Err(refuse(format!(
                "parent partition {parent} is served by {}, not by this node {}",
                owner.map_or_else(|| "no node".to_owned(), |o| format!("node {}", o.node)),
                self.node
            ))),
            ParentSeen::UnknownLink => Err(refuse(format!(
                "no link into {} has attach epoch {} (detached)",
                partition.topic,
                hex::encode(epoch)
            ))),
        }
    }

    /// What an owner's `answer` to a commit of `sent` records means for the cursor.
    fn accept(
        &self,
        partition: &PartitionId,
        node: &str,
        generation: u64,
        sent: usize,
        answer: CommitResponse,
    ) -> Result<Appended, ChildCommitError> {
        match answer {
            CommitResponse::Committed {
                base_offset,
                appended,
                deduplicated,
                committed_at_ms,
            } => {
                // An acknowledgement must cover every record sent, stored now or held
                // already; one that does not is not taken as one (the retry is deduplicated).
                let covered = u64::from(appended) + u64::from(deduplicated);
                if covered != sent as u64 {
                    return Err(ChildCommitError::Unaccounted {
                        partition: partition.clone(),
                        node: node.to_owned(),
                        sent,
                        appended,
                        deduplicated,
                    });
                }
                if deduplicated > 0 {
                    self.metrics
                        .commit_deduplicated
                        .get_or_create(&ChildLabels {
                            child: partition.topic.clone(),
                        })
                        .inc_by(u64::from(deduplicated));
                }
                // What was stored now: `appended` records from `base_offset` (the partition's
                // end when every record was already held).
                Ok(Appended {
                    base_offset,
                    count: appended,
                    committed_at_ms,
                })
            }
            CommitResponse::NotOwner {
                owner,
                generation: owner_generation,
            } => Err(ChildCommitError::NotOwner {
                partition: partition.clone(),
                node: node.to_owned(),
                generation,
                owner,
                owner_generation,
            }),
            CommitResponse::Failed { reason } => Err(ChildCommitError::Refused {
                partition: partition.clone(),
                node: node.to_owned(),
                reason,
            }),
        }
    }
}

/// Where the buckets of one child partition go now.
enum Route {
    /// This node owns it.
    Here(PartitionOwner),
    /// Another node, alive at `base_url`, owns it.
    There {
        owner: PartitionOwner,
        base_url: String,
    },
}

impl ClusterCommitter {
    /// Where `partition`'s buckets go, read on every try (so a retry after `NotOwner` or a
    /// move sees the current owner); an error when they go nowhere now.
    fn route(&self, partition: &PartitionId) -> Result<Route, ChildCommitError> {
        if let Some(Err(reason)) = self.fence.as_ref().map(|fence| fence.admit()) {
            return Err(ChildCommitError::Fenced {
                partition: partition.clone(),
                reason: Box::new(reason),
            });
        }
        let Some(owner) = (self.owners)(partition) else {
            return Err(ChildCommitError::OwnerUnknown {
                partition: partition.clone(),
            });
        };
        if owner.node == self.node {
            return Ok(Route::Here(owner));
        }
        match (self.addresses)(&owner.node) {
            Some(base_url) => Ok(Route::There { owner, base_url }),
            None => Err(ChildCommitError::OwnerDown {
                partition: partition.clone(),
                node: owner.node,
            }),
        }
    }

    /// The requests for `batches`, up to the first that cannot be sent, and why that one
    /// cannot.
    fn requests(
        &self,
        partition: &PartitionId,
        batches: &[ChildBatch],
        generation: u64,
    ) -> (Vec<CommitRequest>, Option<ChildCommitError>) {
        let mut requests = Vec::with_capacity(batches.len());
        for batch in batches {
            match self.request(partition, batch, generation) {
                Ok(request) => requests.push(request),
                Err(error) => return (requests, Some(error)),
            }
        }
        (requests, None)
    }

    /// The provenance of `batch` and the generation at which this node owns its records'
    /// parent partition: what a commit of it to `partition` names; an error when it cannot be
    /// sent (no provenance, or the parent is no longer this node's).
    fn sendable(
        &self,
        partition: &PartitionId,
        batch: &ChildBatch,
    ) -> Result<(BatchOrigin, Option<u64>), ChildCommitError> {
        let origin = batch
            .origin()
            .ok_or_else(|| ChildCommitError::NoProvenance {
                partition: partition.clone(),
            })?;
        let parent_generation =
            self.parent_generation(partition, origin.epoch, origin.parent_partition)?;
        Ok((origin, parent_generation))
    }

    /// The generation at which this node owns the parent partition of `batch`'s records;
    /// an error when `batch` cannot be sent (no provenance, or the parent is not this node's).
    fn parent_generation_of(
        &self,
        partition: &PartitionId,
        batch: &ChildBatch,
    ) -> Result<Option<u64>, ChildCommitError> {
        let (epoch, parent_partition) =
            batch
                .source()
                .ok_or_else(|| ChildCommitError::NoProvenance {
                    partition: partition.clone(),
                })?;
        self.parent_generation(partition, epoch, parent_partition)
    }

    /// The frames calls for `batches` to `partition`, owned at `generation` (up to
    /// [`MAX_COMMITS_PER_CALL`] frames each, of one parent generation), up to the first batch
    /// that cannot be sent, and why that one cannot.
    fn frames_calls(
        &self,
        partition: &PartitionId,
        batches: &[ChildBatch],
        generation: u64,
    ) -> (Vec<FramesBody>, Option<ChildCommitError>) {
        let mut calls = Vec::new();
        let mut pending: Vec<&ChildBatch> = Vec::new();
        let mut pending_parent = None;
        let mut unsendable = None;
        for batch in batches {
            let parent_generation = match self.parent_generation_of(partition, batch) {
                Ok(parent_generation) => parent_generation,
                Err(error) => {
                    unsendable = Some(error);
                    break;
                }
            };
            if !pending.is_empty()
                && (pending.len() == MAX_COMMITS_PER_CALL || pending_parent != parent_generation)
            {
                calls.push(FramesBody::new(
                    partition,
                    generation,
                    pending_parent,
                    &pending,
                ));
                pending.clear();
            }
            pending_parent = parent_generation;
            pending.push(batch);
        }
        if !pending.is_empty() {
            calls.push(FramesBody::new(
                partition,
                generation,
                pending_parent,
                &pending,
            ));
        }
        (calls, unsendable)
    }

    /// Sends `calls` to `owner` at `base_url`, one after another, each holding one of the
    /// places of calls to that node.
    async fn send_frames(
        &self,
        partition: &PartitionId,
        owner: &PartitionOwner,
        base_url: &str,
        calls: Vec<FramesBody>,
    ) -> Result<(), FramesFailure> {
        let mut done = 0;
        for call in calls {
            let slot = self
                .calls
                .enter(&owner.node, partition)
                .await
                .map_err(|error| {
                    FramesFailure::Failed(InOrderFailure {
                        durable: done,
                        error,
                    })
                })?;
            let answered = self
                .client
                .commit_frames(base_url, call.records.len(), call.body)
                .await;
            drop(slot);
            match answered {
                Ok(answers) => {
                    self.accept_all(partition, owner, &call.records, answers, done)
                        .map_err(FramesFailure::Failed)?;
                }
                Err(CallError::BadAnswer { status: 404, .. }) => {
                    return Err(FramesFailure::NotServed { done });
                }
                Err(source) => {
                    return Err(FramesFailure::Failed(InOrderFailure {
                        durable: done,
                        error: ChildCommitError::Unreachable {
                            partition: partition.clone(),
                            node: owner.node.clone(),
                            source,
                        },
                    }));
                }
            }
            done += call.records.len();
        }
        Ok(())
    }

    /// Whether `node` is taken to serve the frames call: yes unless it answered 404 to one
    /// within [`FRAMES_RETRY_AFTER`] (an older binary, until it is upgraded).
    fn serves_frames(&self, node: &str) -> bool {
        let mut refused = lock(&self.without_frames);
        match refused.get(node) {
            Some(at) if at.elapsed() < FRAMES_RETRY_AFTER => false,
            Some(_) => {
                refused.remove(node);
                true
            }
            None => true,
        }
    }

    /// Takes `answers` (to requests of `sent` records each, the first `done` of a commit's
    /// being acknowledged already) from `owner`: `Ok` when each is an acknowledgement.
    fn accept_all(
        &self,
        partition: &PartitionId,
        owner: &PartitionOwner,
        sent: &[usize],
        answers: Vec<CommitResponse>,
        done: usize,
    ) -> Result<(), InOrderFailure> {
        for (i, answer) in answers.into_iter().enumerate() {
            let sent = sent.get(i).copied().unwrap_or(0);
            self.accept(partition, &owner.node, owner.generation, sent, answer)
                .map_err(|error| InOrderFailure {
                    durable: done + i,
                    error,
                })?;
        }
        Ok(())
    }

    /// Commits `batches` to `partition`, which this node owns at `owner`'s generation:
    /// through its own receiver (deduplicated as a commit from another node, then one append
    /// and one `fdatasync`), or straight to the store without one. Blocking.
    fn commit_here(
        &self,
        partition: &PartitionId,
        owner: &PartitionOwner,
        batches: Vec<ChildBatch>,
    ) -> (Vec<ChildBatch>, Result<(), InOrderFailure>) {
        let Some(receiver) = &self.receiver else {
            return ChildBatch::with_frames(batches, |frames| {
                self.local.append_in_order(partition, frames)
            });
        };
        let result = self.commit_through(receiver, partition, owner, &batches);
        (batches, result)
    }

    /// Commits `batches` through this node's own `receiver`, as a commit from another node:
    /// each batch's frame as it was encoded (a copy), not its records encoded again.
    fn commit_through(
        &self,
        receiver: &CommitReceiver,
        partition: &PartitionId,
        owner: &PartitionOwner,
        batches: &[ChildBatch],
    ) -> Result<(), InOrderFailure> {
        let mut incoming = Vec::with_capacity(batches.len());
        let mut unsendable = None;
        for batch in batches {
            match self.sendable(partition, batch) {
                Ok((origin, parent_generation)) => incoming.push(Incoming::frame(
                    batch.frame.clone(),
                    origin,
                    parent_generation,
                )),
                Err(error) => {
                    unsendable = Some(error);
                    break;
                }
            }
        }
        let sent: Vec<usize> = batches[..incoming.len()]
            .iter()
            .map(|b| b.frame.record_count() as usize)
            .collect();
        let answers = receiver.commit_incoming(partition.clone(), owner.generation, incoming);
        self.accept_all(partition, owner, &sent, answers, 0)?;
        match unsendable {
            Some(error) => Err(InOrderFailure {
                durable: sent.len(),
                error,
            }),
            None => Ok(()),
        }
    }

    /// Sends `requests` to `owner` at `base_url`, up to [`MAX_COMMITS_PER_CALL`] per in-order
    /// call (one round trip and one append there); an owner without that call (an older
    /// binary) takes them one call each. Each call holds one of the places of calls to that
    /// node.
    async fn send_in_order(
        &self,
        partition: &PartitionId,
        owner: &PartitionOwner,
        base_url: &str,
        requests: &[CommitRequest],
    ) -> Result<(), InOrderFailure> {
        let unreachable = |done: usize, source: CallError| InOrderFailure {
            durable: done,
            error: ChildCommitError::Unreachable {
                partition: partition.clone(),
                node: owner.node.clone(),
                source,
            },
        };
        let enter = |done: usize| async move {
            self.calls
                .enter(&owner.node, partition)
                .await
                .map_err(|error| InOrderFailure {
                    durable: done,
                    error,
                })
        };
        let mut done = 0;
        for chunk in requests.chunks(MAX_COMMITS_PER_CALL) {
            let call = enter(done).await?;
            let answered = self.client.commit_in_order(base_url, chunk).await;
            drop(call);
            match answered {
                Ok(answers) => {
                    self.accept_all(partition, owner, &records_in(chunk), answers, done)?;
                }
                Err(CallError::BadAnswer { status: 404, .. }) => {
                    for request in &requests[done..] {
                        let call = enter(done).await?;
                        let answer = self
                            .client
                            .commit(base_url, request)
                            .await
                            .map_err(|source| unreachable(done, source))?;
                        drop(call);
                        let sent = [request.records.len()];
                        self.accept_all(partition, owner, &sent, vec![answer], done)?;
                        done += 1;
                    }
                    return Ok(());
                }
                Err(source) => return Err(unreachable(done, source)),
            }
            done += chunk.len();
        }
        Ok(())
    }

    /// [`ChildCommitter::commit_in_order`] of an owned committer.
    async fn commit_owned(
        self: Arc<Self>,
        partition: PartitionId,
        batches: Vec<ChildBatch>,
    ) -> InOrderCommit {
        let failed = |batches, error| InOrderCommit {
            batches,
            result: Err(InOrderFailure { durable: 0, error }),
        };
        let route = match self.route(&partition) {
            Ok(route) => route,
            Err(error) => return failed(batches, error),
        };
        let (owner, base_url) = match route {
            Route::Here(owner) => {
                // A local append blocks: on the blocking pool.
                let here = Arc::clone(&self);
                return match crate::blocking::run(move || {
                    here.commit_here(&partition, &owner, batches)
                })
                .await
                {
                    Ok((batches, result)) => InOrderCommit { batches, result },
                    Err(error) => InOrderCommit::task_failed(error),
                };
            }
            Route::There { owner, base_url } => (owner, base_url),
        };
        let mut batches = batches;
        if self.serves_frames(&owner.node) {
            // Encoding the calls copies every frame: CPU, on the blocking pool. Only the
            // calls themselves run here, holding no thread.
            let here = Arc::clone(&self);
            let generation = owner.generation;
            let prepared = crate::blocking::run(move || {
                let (calls, unsendable) = here.frames_calls(&partition, &batches, generation);
                (batches, partition, calls, unsendable)
            })
            .await;
            let (back, at, calls, unsendable) = match prepared {
                Ok(prepared) => prepared,
                Err(error) => return InOrderCommit::task_failed(error),
            };
            batches = back;
            let sendable: usize = calls.iter().map(|c| c.records.len()).sum();
            let result = match self.send_frames(&at, &owner, &base_url, calls).await {
                Ok(()) => match unsendable {
                    Some(error) => Err(InOrderFailure {
                        durable: sendable,
                        error,
                    }),
                    None => Ok(()),
                },
                Err(FramesFailure::Failed(failure)) => Err(failure),
                Err(FramesFailure::NotServed { done: served }) => {
                    tracing::info!(node = %owner.node,
                        "the owner does not serve the frames call (an older build): sending \
                         records instead");
                    lock(&self.without_frames).insert(owner.node.clone(), Instant::now());
                    return self
                        .commit_as_records(at, owner, base_url, batches, served)
                        .await;
                }
            };
            return InOrderCommit { batches, result };
        }
        self.commit_as_records(partition, owner, base_url, batches, 0)
            .await
    }

    /// Sends `batches` from the `done`-th on to `owner` at `base_url` as records (the
    /// in-order call, or one call each), for an owner without the frames call.
    async fn commit_as_records(
        self: Arc<Self>,
        partition: PartitionId,
        owner: PartitionOwner,
        base_url: String,
        batches: Vec<ChildBatch>,
        done: usize,
    ) -> InOrderCommit {
        // Building the requests is CPU (each batch's records, from its slab or decoded from
        // its frame): on the blocking pool.
        let here = Arc::clone(&self);
        let generation = owner.generation;
        let prepared = crate::blocking::run(move || {
            let rest = batches.get(done..).unwrap_or_default();
            let (requests, unsendable) = here.requests(&partition, rest, generation);
            (batches, partition, requests, unsendable)
        })
        .await;
        let (batches, partition, requests, unsendable) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => return InOrderCommit::task_failed(error),
        };
        let mut result = self
            .send_in_order(&partition, &owner, &base_url, &requests)
            .await;
        if let (Ok(()), Some(error)) = (&result, unsendable) {
            result = Err(InOrderFailure {
                durable: requests.len(),
                error,
            });
        }
        let result = result.map_err(|failure| InOrderFailure {
            durable: failure.durable + done,
            error: failure.error,
        });
        InOrderCommit { batches, result }
    }
}

/// How long a node that answered 404 to a frames call is sent records instead before it is
/// tried again (it may have been upgraded since).
const FRAMES_RETRY_AFTER: Duration = Duration::from_secs(60);

/// One frames call, encoded, with the records each of its frames carries.
struct FramesBody {
    records: Vec<usize>,
    body: Vec<u8>,
}

impl FramesBody {
    /// The call carrying `batches` to `partition` (owned at `generation`), from a sender
    /// owning their parent partition at `parent_generation`.
    fn new(
        partition: &PartitionId,
        generation: u64,
        parent_generation: Option<u64>,
        batches: &[&ChildBatch],
    ) -> FramesBody {
        let call = FramesCall {
            topic: &partition.topic,
            partition: partition.partition,
            generation,
            parent_generation,
            frames: batches
                .iter()
                .map(|b| WireFrame {
                    body_crc: b.frame.body_crc(),
                    frame: b.frame.frame(),
                })
                .collect(),
        };
        FramesBody {
            records: batches
                .iter()
                .map(|b| b.frame.record_count() as usize)
                .collect(),
            body: encode_frames(&call),
        }
    }
}

/// Why frames calls stopped.
enum FramesFailure {
    /// The owner does not serve the call; the first `done` batches are durable.
    NotServed { done: usize },
    /// As for any commit.
    Failed(InOrderFailure),
}

/// `mutex`'s guard, also after a panic elsewhere (what it guards stays consistent).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How many records each of `requests` carries.
fn records_in(requests: &[CommitRequest]) -> Vec<usize> {
    requests.iter().map(|r| r.records.len()).collect()
}

/// The batches for one child partition go in as few commits as the owner takes: this node's
/// own receiver takes them all in one call, another node up to [`MAX_COMMITS_PER_CALL`] per
/// in-order call.
impl ChildCommitter for ClusterCommitter {
    fn commit_in_order(
        self: Arc<Self>,
        partition: PartitionId,
        batches: Vec<ChildBatch>,
    ) -> CommitFuture {
        Box::pin(self.commit_owned(partition, batches))
    }
}

#[cfg(test)]
mod tests;
