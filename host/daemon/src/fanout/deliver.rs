//! Routing a slab and committing its buckets: everything between "read" and "advance".
//!
//! The slab is committed when this returns [`Delivery::Committed`]; until then the cursor's
//! offset file stays where it was, so a crash repeats the slab.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_storage::{
    AppendBatch, BatchOrigin, Header, NewRecord, PartitionId, StorageError, StoredRecord,
};
use tokio::task::JoinSet;

use super::committer::ChildCommitter;
use super::router::{RouteFailure, RouteFailureKind, RouteInput, SharedRouter, check_decisions};
use super::status::CursorStatus;
use super::{COMMITS_IN_FLIGHT, QUICK_RETRY_PAUSES, RETRY_BACKOFF};
use crate::metastore::link::BadEpoch;
use crate::metastore::{BoxFuture, MetastoreError};
use crate::shutdown::ShutdownSignal;

/// How a slab delivery ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Every record is durably committed to the child.
    Committed,
    /// The cursor was told to stop before the slab was committed.
    Stopped,
    /// The link changed under the cursor (detached, re-attached, child deleted).
    LinkGone(LinkGone),
}

/// Why a cursor's link is no longer the one it serves. The `Display` text is what the cursor's
/// exit says.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkGone {
    /// Before routing a slab, the metastore no longer had the cursor's epoch as the link's,
    /// or no longer had the link's parent or child topic: the link was detached, re-attached
    /// or a topic deleted.
    #[error("{parent} -> {child} was detached or re-attached")]
    DetachedOrReattached {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// The link's metadata, swapped in by the reconciler, carries another attach epoch than
    /// the cursor's.
    #[error("{parent} -> {child} was re-attached")]
    Reattached {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// The cursor's own epoch is not a valid epoch, so no link can be its.
    #[error(transparent)]
    BadEpoch(#[from] BadEpoch),
}

/// Why committing one bucket of a slab to the child failed; the cursor retries the bucket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitFailure {
    /// The append to the child partition failed all its quick tries.
    #[error("commit to {target} failed: {error}")]
    Commit {
        /// The child partition.
        target: PartitionId,
        /// The last try's error.
        error: StorageError,
    },
    /// The task committing a bucket panicked or was cancelled; which records it held is
    /// lost with it, so the whole slab is retried.
    #[error("commit task failed: {0}")]
    Task(tokio::task::JoinError),
}

/// The link's situation at the moment of a routing attempt.
#[derive(Clone, Debug)]
pub struct LinkView {
    /// Whether the cursor's epoch is still the link's epoch.
    pub current: bool,
    /// The child's current partition count.
    pub child_partitions: u32,
    /// The parent's current partition count.
    pub parent_partitions: u32,
    /// The link's plugin configuration bytes.
    pub config: Vec<u8>,
}

/// What delivery needs from its surroundings.
pub trait DeliveryEnv: Send + Sync {
    /// Looks the link up again (the epoch check done before every routing attempt). `Err` when
    /// the metastore cannot be read now (the delivery waits and retries).
    fn link_view(&self) -> BoxFuture<'_, Result<LinkView, MetastoreError>>;
}

/// One slab and where it goes.
pub struct SlabJob {
    /// Parent topic.
    pub parent: String,
    /// Parent partition.
    pub partition: u32,
    /// Child topic.
    pub child: String,
    /// The link's attach epoch, as stored in provenance.
    pub epoch: [u8; 8],
    /// First parent offset of the slab.
    pub slab_start: u64,
    /// The records, in offset order.
    pub records: Vec<StoredRecord>,
}

/// Sleeps `pause`, or returns false early if the cursor is told to stop.
async fn pause(pause: Duration, stop: &ShutdownSignal) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(pause) => true,
        _ = stop.wait() => false,
    }
}

fn to_new_record(record: &StoredRecord, copy: bool) -> NewRecord {
    // Held for a retry, records are copied off the parent's read buffers so a long outage
    // does not pin them.
    let own = |b: &Bytes| {
        if copy {
            Bytes::copy_from_slice(b)
        } else {
            b.clone()
        }
    };
    NewRecord {
        key: record.key.as_ref().map(own),
        headers: record
            .headers
            .iter()
            .map(|h| Header {
                name: h.name.clone(),
                value: own(&h.value),
            })
            .collect(),
        value: own(&record.value),
    }
}

fn detach(record: &StoredRecord) -> StoredRecord {
    let copied = to_new_record(record, true);
    StoredRecord {
        offset: record.offset,
        committed_at_ms: record.committed_at_ms,
        key: copied.key,
        headers: copied.headers,
        value: copied.value,
        origin: None,
    }
}

/// Commits one bucket with up to three quick tries (100 ms, then 200 ms apart).
fn commit_with_quick_retries(
    committer: &dyn ChildCommitter,
    partition: &PartitionId,
    batch: AppendBatch,
) -> Result<(), StorageError> {
    let mut tries = 0;
    loop {
        match committer.commit(partition, batch.clone()) {
            Ok(_) => return Ok(()),
            Err(error) => {
                let Some(pause) = QUICK_RETRY_PAUSES.get(tries) else {
                    return Err(error);
                };
                tracing::debug!(%partition, %error, "child commit failed, trying again");
                tries += 1;
                std::thread::sleep(*pause);
            }
        }
    }
}

async fn route(
    router: &SharedRouter,
    input: RouteInput,
    records: Vec<StoredRecord>,
) -> (Vec<StoredRecord>, Result<Vec<u32>, RouteFailure>) {
    let router = Arc::clone(router);
    // Plugins run on the blocking pool so a slow one cannot stall the I/O threads.
    let task = tokio::task::spawn_blocking(move || {
        let result = match router.lock() {
            Ok(mut guard) => guard.route(&input, &records),
            Err(_) => Err(RouteFailure {
                plugin: None,
                kind: RouteFailureKind::Poisoned,
                message: "the router panicked on an earlier slab".into(),
            }),
        };
        let result = result.and_then(|decisions| {
            check_decisions(&decisions, &records, input.child_partition_count).map(|()| decisions)
        });
        (records, result)
    });
    match task.await {
        Ok(outcome) => outcome,
        Err(join) => (
            Vec::new(),
            Err(RouteFailure {
                plugin: None,
                kind: RouteFailureKind::Panic,
                message: format!("routing task failed: {join}"),
            }),
        ),
    }
}

/// Routes `job` through `router` and commits every bucket to the child, retrying failed
/// buckets (only those, re-routed under the child's current partition count, after the epoch
/// check) until all are committed, the link goes away, or `stop` fires.
pub async fn deliver(
    job: SlabJob,
    router: &SharedRouter,
    committer: &Arc<dyn ChildCommitter>,
    env: &dyn DeliveryEnv,
    status: &CursorStatus,
    stop: &ShutdownSignal,
) -> Delivery {
    let mut pending = job.records;
    let mut attempt: u32 = 0;
    loop {
        if stop.is_triggered() {
            return Delivery::Stopped;
        }
        let view = match env.link_view().await {
            Ok(view) => view,
            Err(reason) => {
                status.stalled(format!("cannot read the link: {reason}"));
                if !pause(RETRY_BACKOFF, stop).await {
                    return Delivery::Stopped;
                }
                continue;
            }
        };
        if !view.current {
            return Delivery::LinkGone(LinkGone::DetachedOrReattached {
                parent: job.parent.clone(),
                child: job.child.clone(),
            });
        }
        let input = RouteInput {
            parent_topic: job.parent.clone(),
            parent_partition: job.partition,
            parent_partition_count: view.parent_partitions,
            child_topic: job.child.clone(),
            child_partition_count: view.child_partitions,
            attempt,
            config: view.config.clone(),
        };
        let (records, routed) = route(router, input, pending).await;
        pending = records;
        let decisions = match routed {
            Ok(decisions) => decisions,
            Err(failure) => {
                status.route_failed();
                status.stalled(format!("routing failed: {failure}"));
                tracing::warn!(parent = %job.parent, partition = job.partition, child = %job.child, %failure, "slab not routed; retrying");
                attempt = attempt.saturating_add(1);
                if !pause(RETRY_BACKOFF, stop).await {
                    return Delivery::Stopped;
                }
                continue;
            }
        };

        // Counting sort: one bucket per child partition, each in slab order.
        let mut buckets: Vec<Vec<usize>> = vec![Vec::new(); view.child_partitions as usize];
        for (index, decision) in decisions.iter().enumerate() {
            buckets[*decision as usize].push(index);
        }

        let mut in_flight = JoinSet::new();
        let mut failed_indices: Vec<usize> = Vec::new();
        let mut errors: Vec<CommitFailure> = Vec::new();
        let mut queued = buckets
            .into_iter()
            .enumerate()
            .filter(|(_, b)| !b.is_empty());
        loop {
            while in_flight.len() < COMMITS_IN_FLIGHT {
                let Some((partition, indices)) = queued.next() else {
                    break;
                };
                let batch = AppendBatch {
                    records: indices
                        .iter()
                        .map(|&i| to_new_record(&pending[i], false))
                        .collect(),
                    origin: Some(BatchOrigin {
                        epoch: job.epoch,
                        parent_partition: job.partition,
                        parent_offsets: indices.iter().map(|&i| pending[i].offset).collect(),
                        slab_start: job.slab_start,
                    }),
                };
                let committer = Arc::clone(committer);
                let target = PartitionId::new(job.child.clone(), partition as u32);
                in_flight.spawn_blocking(move || {
                    let outcome = commit_with_quick_retries(committer.as_ref(), &target, batch);
                    (target, indices, outcome)
                });
            }
            let Some(joined) = in_flight.join_next().await else {
                break;
            };
            match joined {
                Ok((_, _, Ok(()))) => {}
                Ok((target, indices, Err(error))) => {
                    errors.push(CommitFailure::Commit { target, error });
                    failed_indices.extend(indices);
                }
                Err(join) => {
                    // A panicking commit task: its records' fate is unknown, so retry them all
                    // (duplicates are allowed; gaps are not). Which records they were is lost
                    // with the task, so the whole slab is retried.
                    errors.push(CommitFailure::Task(join));
                    failed_indices = (0..pending.len()).collect();
                }
            }
        }
        if failed_indices.is_empty() {
            return Delivery::Committed;
        }
        failed_indices.sort_unstable();
        failed_indices.dedup();
        status.commit_retried(errors.len() as u64);
        let reason = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        status.stalled(reason.clone());
        tracing::warn!(parent = %job.parent, partition = job.partition, child = %job.child, failed = failed_indices.len(), %reason, "child commits failed; retrying those buckets");
        pending = failed_indices
            .iter()
            .map(|&i| detach(&pending[i]))
            .collect();
        attempt = attempt.saturating_add(1);
        if !pause(RETRY_BACKOFF, stop).await {
            return Delivery::Stopped;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_bucket_commit_names_the_child_partition_in_its_stall_text() {
        let failure = CommitFailure::Commit {
            target: PartitionId::new("child", 1),
            error: StorageError::EmptyBatch,
        };
        assert!(
            matches!(&failure, CommitFailure::Commit { target, .. } if *target == PartitionId::new("child", 1))
        );
        assert_eq!(
            failure.to_string(),
            "commit to child/p00001 failed: a batch needs at least one record"
        );
    }
}
