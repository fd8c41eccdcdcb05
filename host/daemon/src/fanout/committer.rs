//! The child-commit seam: how a cursor appends a bucket to a child partition.
//!
//! On one node every child partition is local and a commit is exactly a produce: the same
//! `Store::append` (append, `fdatasync`, verify). Across nodes an implementation sends the
//! bucket to the child partition's owner ([`super::remote_commit`]); a dead owner stalls that
//! bucket, it never reroutes. [`ChildCommitError`] says which, and for a remote child which
//! owner node the bucket waits for.
//!
//! A commit is asynchronous ([`ChildCommitter`]): one that waits on another node waits as an
//! async call and holds no thread, so an owner that hangs cannot use up the blocking pool the
//! node's appends and reads need. Work that does block (a local append and its `fdatasync`)
//! is a [`BlockingCommitter`], which runs on the blocking pool.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use narad_storage::log::format::FrameError;
use narad_storage::{
    AppendBatch, Appended, BatchOrigin, EncodedBatch, NewRecord, PartitionId, StorageError,
};

use super::bucket::Bucket;
use crate::blocking::BlockingError;
use crate::cluster::commit_rpc::CallError;
use crate::produce::Producer;

/// One bucket on its way to a child partition: its frame, encoded once for an append, and,
/// when it came from a slab, the bucket itself, so a committer that sends the records to
/// another node takes them from the slab (references to the parent's read buffers) instead
/// of decoding the frame back.
#[derive(Debug)]
pub struct ChildBatch {
    /// The frame an append writes (resealed, not encoded again, on each try).
    pub frame: EncodedBatch,
    bucket: Option<Arc<Bucket>>,
}

impl ChildBatch {
    /// A batch known only by its frame.
    pub fn from_frame(frame: EncodedBatch) -> ChildBatch {
        ChildBatch {
            frame,
            bucket: None,
        }
    }

    /// `bucket`, with `frame` encoded from it.
    pub(crate) fn from_bucket(frame: EncodedBatch, bucket: Arc<Bucket>) -> ChildBatch {
        ChildBatch {
            frame,
            bucket: Some(bucket),
        }
    }

    /// Runs `append` on the frames of `batches`, each handed back to its batch after.
    pub(crate) fn with_frames<T>(
        batches: Vec<ChildBatch>,
        append: impl FnOnce(&mut [EncodedBatch]) -> T,
    ) -> (Vec<ChildBatch>, T) {
        let (mut frames, buckets): (Vec<EncodedBatch>, Vec<_>) =
            batches.into_iter().map(|b| (b.frame, b.bucket)).unzip();
        let out = append(&mut frames);
        let batches = frames
            .into_iter()
            .zip(buckets)
            .map(|(frame, bucket)| ChildBatch { frame, bucket })
            .collect();
        (batches, out)
    }

    /// The provenance of the batch's records: the bucket's, or decoded from the frame for a
    /// batch known only by its frame. `None` for a batch without one.
    pub fn origin(&self) -> Option<BatchOrigin> {
        match &self.bucket {
            Some(bucket) => Some(bucket.origin.clone()),
            None => self.frame.decode().ok()?.origin,
        }
    }

    /// The attach epoch and parent partition of the batch's records, without copying its
    /// parent offsets when it came from a slab. `None` for a batch without provenance.
    pub fn source(&self) -> Option<([u8; 8], u32)> {
        match &self.bucket {
            Some(bucket) => Some((bucket.origin.epoch, bucket.origin.parent_partition)),
            None => self
                .frame
                .decode()
                .ok()?
                .origin
                .map(|o| (o.epoch, o.parent_partition)),
        }
    }

    /// The records and provenance of the batch: from the slab when it came from one (no
    /// byte is copied), else decoded from the frame.
    pub fn records(&self) -> Result<AppendBatch, FrameError> {
        let Some(bucket) = &self.bucket else {
            return self.frame.decode();
        };
        Ok(AppendBatch {
            records: bucket
                .records()
                .map(|r| NewRecord {
                    key: r.key.clone(),
                    headers: r.headers.clone(),
                    value: r.value.clone(),
                })
                .collect(),
            origin: Some(bucket.origin.clone()),
        })
    }
}

/// What [`ChildCommitter::commit_in_order`] did: the batches handed back (to be sent again
/// from [`InOrderFailure::durable`] on after a failure; empty if the task holding them
/// panicked) and the outcome.
#[derive(Debug)]
pub struct InOrderCommit {
    /// The batches given, as they were.
    pub batches: Vec<ChildBatch>,
    /// `Ok` once every batch is durable.
    pub result: Result<(), InOrderFailure>,
}

impl InOrderCommit {
    /// The task holding the batches returned nothing (`error`): they are lost with it, and
    /// none is known to be durable.
    pub fn task_failed(error: BlockingError) -> InOrderCommit {
        InOrderCommit {
            batches: Vec::new(),
            result: Err(InOrderFailure {
                durable: 0,
                error: ChildCommitError::Task(error),
            }),
        }
    }
}

/// The future of one [`ChildCommitter::commit_in_order`].
pub type CommitFuture = Pin<Box<dyn Future<Output = InOrderCommit> + Send + 'static>>;

/// Commits batches to a child partition, durably, or says why not.
pub trait ChildCommitter: Send + Sync + 'static {
    /// Commits `batches` (the buckets of consecutive slabs for one child partition, each
    /// encoded once from the parent records' bytes) to `partition` in this order, finishing
    /// once all are durable. A batch is never committed unless every one before it is, so the
    /// child never holds a later slab's records ahead of an earlier one's that failed.
    /// Waiting on the network holds no thread.
    fn commit_in_order(
        self: Arc<Self>,
        partition: PartitionId,
        batches: Vec<ChildBatch>,
    ) -> CommitFuture;
}

/// A committer whose work blocks (a local append and its `fdatasync`): every
/// [`BlockingCommitter`] is a [`ChildCommitter`] whose commits run on the blocking pool.
pub trait BlockingCommitter: Send + Sync + 'static {
    /// Appends `batch` to `partition` and returns once it is durable and verified. On an
    /// error `batch` is left as it was, so a retry sends the same frame again without
    /// encoding or copying it.
    fn append(
        &self,
        partition: &PartitionId,
        batch: &mut EncodedBatch,
    ) -> Result<Appended, ChildCommitError>;

    /// Appends `batches` to `partition` in this order, returning once all are durable; on an
    /// error the batches from [`InOrderFailure::durable`] on are left as they were.
    ///
    /// The default appends them one after another, stopping at the first failure; a
    /// committer that can make several durable together (a local store: one `fdatasync`)
    /// does.
    fn append_in_order(
        &self,
        partition: &PartitionId,
        batches: &mut [EncodedBatch],
    ) -> Result<(), InOrderFailure> {
        for (durable, batch) in batches.iter_mut().enumerate() {
            self.append(partition, batch)
                .map_err(|error| InOrderFailure { durable, error })?;
        }
        Ok(())
    }
}

impl<C: BlockingCommitter> ChildCommitter for C {
    fn commit_in_order(
        self: Arc<Self>,
        partition: PartitionId,
        batches: Vec<ChildBatch>,
    ) -> CommitFuture {
        Box::pin(async move {
            let ran = crate::blocking::run(move || {
                ChildBatch::with_frames(batches, |frames| self.append_in_order(&partition, frames))
            })
            .await;
            match ran {
                Ok((batches, result)) => InOrderCommit { batches, result },
                Err(error) => InOrderCommit::task_failed(error),
            }
        })
    }
}

/// Why [`ChildCommitter::commit_in_order`] did not commit every batch.
#[derive(Debug)]
pub struct InOrderFailure {
    /// How many batches, from the first, are committed.
    pub durable: usize,
    /// Why the next one is not.
    pub error: ChildCommitError,
}

/// Why a bucket is not (known to be) committed to its child partition. Every case is retried
/// by the cursor; the text is the stall reason the children listing shows, and each remote
/// case names the child partition and the owner node the bucket waits for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChildCommitError {
    /// The append to a child partition stored on this node failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The metadata names no owner for the child partition (yet): nothing was sent.
    #[error("waiting for an owner of child partition {partition}: the metadata names none")]
    OwnerUnknown {
        /// The child partition.
        partition: PartitionId,
    },
    /// A remote child's target did not take the bucket. `permanent` when retrying alone will
    /// not help (the target refused the token, the topic is gone, a record is refused): the
    /// cursor still waits and retries, slowly, and never skips; the listing says `failed`.
    #[error(
        "{} remote child partition {partition} at {target}: {reason}",
        if *.permanent { "failed: cannot send to" } else { "retrying: waiting for" }
    )]
    Remote {
        /// The child partition (the target's partition of the same index).
        partition: PartitionId,
        /// The target topic's URL.
        target: String,
        /// What the target said, or why it did not answer.
        reason: String,
        /// Whether only a change on the target (or of the link) can make it succeed.
        permanent: bool,
        /// How long the target asked to be left alone (`Retry-After` on a 429 or a 503).
        retry_after: Option<std::time::Duration>,
    },
    /// This node is fenced (it could not renew its lease with etcd for nearly a TTL): it
    /// sends no commit, so a node the cluster may already count as dead, whose parent
    /// partitions may be re-created elsewhere, writes nothing more into children.
    #[error("not committing to child partition {partition}: {reason}")]
    Fenced {
        /// The child partition.
        partition: PartitionId,
        /// Why this node is fenced.
        reason: Box<crate::ownership::FenceError>,
    },
    /// This node does not own the parent partition the bucket's records come from (its
    /// metadata gives it to another node, or at another generation, or knows no link with
    /// the bucket's attach epoch): a cursor left running on a partition that was moved or
    /// re-created away copies nothing more; the reconciler stops it.
    #[error("not committing to child partition {partition}: {reason}")]
    NotParentOwner {
        /// The child partition.
        partition: PartitionId,
        /// What the metadata says of the parent partition.
        reason: String,
    },
    /// The child partition's owner is not alive (its lease is gone): nothing was sent, so a
    /// dead owner costs no connect timeout per try.
    #[error("waiting for the owner of child partition {partition} (node {node}): it is not alive")]
    OwnerDown {
        /// The child partition.
        partition: PartitionId,
        /// Its owner, as this node's metadata says.
        node: String,
    },
    /// The node asked does not own the child partition at the generation this node saw (the
    /// partition moved, or one of the two views is behind): nothing was appended. The next
    /// try looks the owner up again.
    #[error(
        "waiting for the owner of child partition {partition}: node {node} does not own it at \
         generation {generation} (it sees {}); looking the owner up again",
        seen_owner(.owner, .owner_generation)
    )]
    NotOwner {
        /// The child partition.
        partition: PartitionId,
        /// The node asked.
        node: String,
        /// The generation sent.
        generation: u64,
        /// Who that node believes owns the partition, if anyone.
        owner: Option<String>,
        /// The generation that node knows, if any.
        owner_generation: Option<u64>,
    },
    /// The owner gave no answer (refused connection, timeout) or an answer that is not a
    /// commit answer: the bucket may or may not be stored there; the retry is deduplicated.
    #[error("waiting for the owner of child partition {partition} (node {node}): {source}")]
    Unreachable {
        /// The child partition.
        partition: PartitionId,
        /// The owner asked.
        node: String,
        /// What the call got.
        source: CallError,
    },
    /// The owner answered that its append failed (a storage error on its side).
    #[error(
        "waiting for the owner of child partition {partition} (node {node}): its append failed: \
         {reason}"
    )]
    Refused {
        /// The child partition.
        partition: PartitionId,
        /// The owner.
        node: String,
        /// The owner's reason.
        reason: String,
    },
    /// The owner's acknowledgement does not account for every record sent (stored plus
    /// already held): it is not taken as one, and the retry is deduplicated by the owner.
    #[error(
        "waiting for the owner of child partition {partition} (node {node}): it acknowledged \
         {appended} stored and {deduplicated} already held of {sent} records sent"
    )]
    Unaccounted {
        /// The child partition.
        partition: PartitionId,
        /// The owner.
        node: String,
        /// Records sent.
        sent: usize,
        /// Records it says it stored.
        appended: u32,
        /// Records it says it already held.
        deduplicated: u32,
    },
    /// The bucket's frame could not be decoded to be sent (a defect: a frame made by
    /// `EncodedBatch::encode` always decodes).
    #[error("the bucket for child partition {partition} cannot be sent: {source}")]
    Undecodable {
        /// The child partition.
        partition: PartitionId,
        /// The decoder's error.
        source: FrameError,
    },
    /// The bucket carries no provenance, which a child commit between nodes needs for the
    /// owner's dedupe (a defect: every bucket carries its origin).
    #[error("the bucket for child partition {partition} carries no provenance; it cannot be sent")]
    NoProvenance {
        /// The child partition.
        partition: PartitionId,
    },
    /// The owner already has as many commits from this node under way as one peer may
    /// (none answered within the commit timeout): an owner that hangs holds that many calls
    /// and no more. Nothing was sent.
    #[error(
        "waiting for the owner of child partition {partition} (node {node}): {in_flight} \
         commits to it are under way and none has been answered"
    )]
    PeerBusy {
        /// The child partition.
        partition: PartitionId,
        /// The owner.
        node: String,
        /// Commits under way to it.
        in_flight: usize,
    },
    /// The task appending the batches panicked or was cancelled: whether they are stored is
    /// not known, and they are sent again (a repeat is absorbed or allowed; a gap is not).
    #[error(transparent)]
    Task(#[from] BlockingError),
}

/// What the node asked believes about the owner, for [`ChildCommitError::NotOwner`]'s text.
fn seen_owner(owner: &Option<String>, generation: &Option<u64>) -> String {
    match (owner, generation) {
        (Some(node), Some(generation)) => format!("node {node} at generation {generation}"),
        (Some(node), None) => format!("node {node}"),
        (None, _) => "no owner".to_owned(),
    }
}

impl ChildCommitError {
    /// The node that owns (or was asked as the owner of) the child partition, when the bucket
    /// waits on another node; `None` for a local storage error or an unknown owner.
    pub fn owner_node(&self) -> Option<&str> {
        match self {
            ChildCommitError::OwnerDown { node, .. }
            | ChildCommitError::PeerBusy { node, .. }
            | ChildCommitError::NotOwner { node, .. }
            | ChildCommitError::Unreachable { node, .. }
            | ChildCommitError::Refused { node, .. }
            | ChildCommitError::Unaccounted { node, .. } => Some(node),
            _ => None,
        }
    }

    /// Whether the text already names the child partition (every case but a local storage
    /// error), so a stall reason does not name it twice.
    pub(crate) fn names_partition(&self) -> bool {
        !matches!(
            self,
            ChildCommitError::Storage(_) | ChildCommitError::Task(_)
        )
    }
}

/// On one node a child commit is a produce commit: the same `Store::append` (append,
/// `fdatasync`, verify) that [`Producer::commit`] runs.
impl BlockingCommitter for Producer {
    fn append(
        &self,
        partition: &PartitionId,
        batch: &mut EncodedBatch,
    ) -> Result<Appended, ChildCommitError> {
        Ok(self.store().append_encoded(partition, batch)?)
    }

    /// One append of all the batches: one `fdatasync` and one read-back.
    fn append_in_order(
        &self,
        partition: &PartitionId,
        batches: &mut [EncodedBatch],
    ) -> Result<(), InOrderFailure> {
        match self.store().append_encoded_in_order(partition, batches) {
            Ok(_) => Ok(()),
            Err(e) => Err(InOrderFailure {
                durable: e.durable,
                error: e.error.into(),
            }),
        }
    }
}
