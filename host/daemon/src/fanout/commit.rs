//! Step 4 of a slab, commit: every bucket appended to its child partition, durably.
//!
//! The buckets' child frames are encoded once, together, straight from the parent records'
//! bytes (one piece of blocking work). Up to [`COMMITS_IN_FLIGHT`] child partitions are then
//! committed at once, by that many async lanes each taking the next child partition as it
//! finishes one, through the [`ChildCommitter`] (on one node: the produce path, append,
//! `fdatasync`, verify, on the blocking pool; to another node: an async call that holds no
//! thread) with quick tries [`FanoutTiming::quick_retry_pauses`] apart. A quick retry sends
//! the same frame again (the store reseals it); nothing is cloned or encoded again.
//! [`commit`] hands out [`Acknowledged`], the only thing [`super::advance`] moves the offset
//! file past a slab with, only when every bucket it was given is acknowledged. Otherwise it
//! says which records failed ([`Failed`]): the cursor keeps copies of just those
//! ([`Failed::retained`]), backs off ([`FanoutTiming::retry_backoff`]) and sends only them
//! through route, bucket and commit again, after checking its epoch and under the child's
//! current partition count. Buckets that succeeded are never sent again.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use narad_storage::{Header, PartitionId, StoredRecord};

use super::bucket::Bucket;
use super::committer::{ChildBatch, ChildCommitError, ChildCommitter, InOrderFailure};
use super::{COMMITS_IN_FLIGHT, FanoutTiming};
use crate::blocking::BlockingError;

/// Proof that every bucket of a commit was acknowledged by its child partition. Only
/// [`commit`] makes one; advancing the offset file past a slab takes one.
#[derive(Debug)]
#[must_use = "an acknowledged slab is advanced past"]
pub(crate) struct Acknowledged(());

/// Why committing one bucket of a slab to the child failed; the cursor retries the bucket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum CommitFailure {
    /// The commit to the child partition failed all its quick tries. The text names the
    /// child partition, and for a child stored on another node the owner node the bucket
    /// waits for ("waiting for the owner of child partition child/p00001 (node n2): ...").
    #[error("{}", commit_text(.target, .error))]
    Commit {
        /// The child partition.
        target: PartitionId,
        /// The last try's error.
        error: ChildCommitError,
    },
    /// The task committing buckets panicked or was cancelled; which records it held is
    /// lost with it, so the whole slab is retried.
    #[error("commit task failed: {0}")]
    Task(#[from] BlockingError),
    /// Not sent: an earlier slab's bucket for the same child partition, committed together
    /// with this one, failed, and these records must land after those.
    #[error("commit to {target} waits for an earlier slab's records to land first")]
    Behind {
        /// The child partition.
        target: PartitionId,
    },
}

/// The stall text of a failed bucket: the error alone when it names the child partition
/// itself, else prefixed with it.
fn commit_text(target: &PartitionId, error: &ChildCommitError) -> String {
    match error.names_partition() {
        true => error.to_string(),
        false => format!("commit to {target} failed: {error}"),
    }
}

/// The buckets that were not acknowledged.
#[derive(Debug)]
pub(crate) struct Failed {
    /// Indices (into the slab given to bucketing) of the records not known to be committed,
    /// sorted, each once.
    pub indices: Vec<usize>,
    /// Why, one entry per failed bucket (or failed task).
    pub errors: Vec<CommitFailure>,
}

impl Failed {
    /// The stall reason operators see: every failure, `; `-separated.
    pub(crate) fn reason(&self) -> String {
        self.errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The failed records of `records` (the slab given to bucketing), in slab order, copied
    /// off the parent's read buffers so a long outage does not pin them (a read buffer holds
    /// a whole stored frame, up to many times a slab). Records that are such copies already
    /// (`copied`: an earlier try kept them) are shared, not copied again.
    pub(crate) fn retained(&self, records: &[StoredRecord], copied: bool) -> Vec<StoredRecord> {
        let kept = self.indices.iter().filter_map(|&i| records.get(i));
        if copied {
            return kept.cloned().collect();
        }
        kept.map(|record| StoredRecord {
            offset: record.offset,
            committed_at_ms: record.committed_at_ms,
            key: record.key.as_deref().map(Bytes::copy_from_slice),
            headers: record
                .headers
                .iter()
                .map(|h| Header {
                    name: h.name.clone(),
                    value: Bytes::copy_from_slice(&h.value),
                })
                .collect(),
            value: record.value.as_deref().map(Bytes::copy_from_slice),
            origin: None,
        })
        .collect()
    }
}

/// The buckets of consecutive slabs for one child partition, in slab order: committed in
/// that order, each only once those before it are.
struct TargetWork {
    target: PartitionId,
    /// `(slab, bucket)`: the position of the bucket's slab among the slabs committed together.
    parts: Vec<(usize, Arc<Bucket>)>,
}

/// What one lane did with one child partition's buckets: how many, from the first, are
/// acknowledged, and why the next one is not.
struct Outcome {
    work: TargetWork,
    durable: usize,
    error: Option<ChildCommitError>,
}

/// One child partition's buckets with their frames: `batches[i]` is `work.parts[i]`'s, and
/// `unencodable` says why the bucket after the last frame could not be encoded, if one could
/// not (those before it are still committed).
struct Encoded {
    work: TargetWork,
    batches: Vec<ChildBatch>,
    unencodable: Option<ChildCommitError>,
}

/// Commits `buckets` (one slab's) to their child partitions, [`COMMITS_IN_FLIGHT`] at a time,
/// each with quick tries. `Ok` once every one is acknowledged; otherwise which records failed.
pub(crate) async fn commit(
    buckets: Vec<Bucket>,
    committer: &Arc<dyn ChildCommitter>,
    timing: &FanoutTiming,
) -> Result<Acknowledged, Failed> {
    let mut answers = commit_slabs(vec![buckets], committer, timing).await;
    answers.pop().unwrap_or(Ok(Acknowledged(())))
}

/// Commits the buckets of consecutive slabs (`slabs[0]` first), with one commit per child
/// partition carrying the buckets of every slab for it, in slab order ([`ChildCommitter::
/// commit_in_order`]: on one node, one `fdatasync` for them all), [`COMMITS_IN_FLIGHT`]
/// child partitions at a time, each with quick tries. Answers each slab as [`commit`]
/// does. A slab's bucket is never committed unless the earlier slabs' buckets for the same
/// child partition are: one held back for that reason fails as [`CommitFailure::Behind`].
///
/// The frames are encoded in one piece of blocking work (CPU, one thread per commit); the
/// lanes are async tasks, so a lane waiting on another node holds no thread.
pub(crate) async fn commit_slabs(
    slabs: Vec<Vec<Bucket>>,
    committer: &Arc<dyn ChildCommitter>,
    timing: &FanoutTiming,
) -> Vec<Result<Acknowledged, Failed>> {
    let records: Vec<usize> = slabs
        .iter()
        .map(|buckets| buckets.iter().map(|b| b.indices.len()).sum())
        .collect();
    let whole_slabs_failed = |error: BlockingError| -> Vec<Result<Acknowledged, Failed>> {
        // The fate of the buckets is lost with the task: retry every slab whole (duplicates
        // are allowed; gaps are not).
        records
            .iter()
            .map(|&count| {
                Err(Failed {
                    indices: (0..count).collect(),
                    errors: vec![CommitFailure::Task(error.clone())],
                })
            })
            .collect()
    };
    let encoded = match crate::blocking::run(move || encode_by_target(slabs)).await {
        Ok(encoded) => encoded,
        Err(error) => return whole_slabs_failed(error),
    };
    let lanes = encoded.len().min(COMMITS_IN_FLIGHT);
    let queue = Arc::new(Mutex::new(encoded.into_iter()));
    let pauses = timing.quick_retry_pauses;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..lanes {
        let (queue, committer) = (Arc::clone(&queue), Arc::clone(committer));
        tasks.spawn(async move {
            let mut done = Vec::new();
            loop {
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                let Some(Encoded {
                    work,
                    batches,
                    unencodable,
                }) = next
                else {
                    return done;
                };
                let (durable, error) =
                    match commit_with_quick_retries(&committer, &work.target, batches, &pauses)
                        .await
                    {
                        Ok(durable) => (durable, unencodable),
                        Err(failure) => (failure.durable, Some(failure.error)),
                    };
                done.push(Outcome {
                    work,
                    durable,
                    error,
                });
            }
        });
    }
    let mut failed: Vec<Failed> = records
        .iter()
        .map(|_| Failed {
            indices: Vec::new(),
            errors: Vec::new(),
        })
        .collect();
    let mut lost = None;
    while let Some(lane) = tasks.join_next().await {
        match lane {
            Ok(done) => {
                for outcome in done {
                    let Some(error) = outcome.error else {
                        continue;
                    };
                    let target = outcome.work.target;
                    let mut not_done = outcome.work.parts.into_iter().skip(outcome.durable);
                    if let Some((slab, bucket)) = not_done.next() {
                        failed[slab].errors.push(CommitFailure::Commit {
                            target: target.clone(),
                            error,
                        });
                        failed[slab].indices.extend(&bucket.indices);
                    }
                    for (slab, bucket) in not_done {
                        failed[slab].errors.push(CommitFailure::Behind {
                            target: target.clone(),
                        });
                        failed[slab].indices.extend(&bucket.indices);
                    }
                }
            }
            // A lane that panicked: which buckets it had done is lost with it.
            Err(error) => lost = Some(BlockingError::from(error)),
        }
    }
    if let Some(error) = lost {
        return whole_slabs_failed(error);
    }
    failed
        .into_iter()
        .map(|mut failed| {
            if failed.errors.is_empty() {
                return Ok(Acknowledged(()));
            }
            failed.indices.sort_unstable();
            failed.indices.dedup();
            Err(failed)
        })
        .collect()
}

/// One unit of work per child partition, in partition order, its buckets in slab order, each
/// encoded (from the parent records' bytes) up to the first that cannot be.
fn encode_by_target(slabs: Vec<Vec<Bucket>>) -> Vec<Encoded> {
    let mut by_target: std::collections::BTreeMap<u32, TargetWork> = Default::default();
    for (slab, buckets) in slabs.into_iter().enumerate() {
        for bucket in buckets {
            by_target
                .entry(bucket.target.partition)
                .or_insert_with(|| TargetWork {
                    target: bucket.target.clone(),
                    parts: Vec::new(),
                })
                .parts
                .push((slab, Arc::new(bucket)));
        }
    }
    by_target
        .into_values()
        .map(|work| {
            let mut batches = Vec::with_capacity(work.parts.len());
            let mut unencodable = None;
            for (_, bucket) in &work.parts {
                match bucket.encode() {
                    Ok(frame) => batches.push(ChildBatch::from_bucket(frame, Arc::clone(bucket))),
                    Err(e) => {
                        unencodable = Some(ChildCommitError::from(e));
                        break;
                    }
                }
            }
            Encoded {
                work,
                batches,
                unencodable,
            }
        })
        .collect()
}

/// Commits one child partition's frames in order, trying again after each of `pauses` from
/// the first frame not yet acknowledged; how many are acknowledged. A failed try hands the
/// frames back as they were, so the next try sends the same frames.
async fn commit_with_quick_retries(
    committer: &Arc<dyn ChildCommitter>,
    partition: &PartitionId,
    mut batches: Vec<ChildBatch>,
    pauses: &[std::time::Duration],
) -> Result<usize, InOrderFailure> {
    let (mut tries, mut durable) = (0, 0);
    let total = batches.len();
    loop {
        let sent = batches.len();
        let answer = Arc::clone(committer)
            .commit_in_order(partition.clone(), batches)
            .await;
        let failure = match answer.result {
            Ok(()) => return Ok(total),
            Err(failure) => failure,
        };
        durable += failure.durable;
        batches = answer.batches;
        let failed = |error| Err(InOrderFailure { durable, error });
        // Frames lost with a task that panicked cannot be sent again from here.
        if batches.len() != sent {
            return failed(failure.error);
        }
        batches.drain(..failure.durable.min(sent));
        match failure.error {
            // A refusal only the target's operator can lift is not tried again at once, nor is
            // a target that asked to be left alone for a while.
            error @ ChildCommitError::Remote {
                permanent: true, ..
            } => return failed(error),
            error @ ChildCommitError::Remote {
                retry_after: Some(_),
                ..
            } => return failed(error),
            error => {
                let Some(pause) = pauses.get(tries) else {
                    return failed(error);
                };
                tracing::debug!(%partition, %error, "child commit failed, trying again");
                tries += 1;
                tokio::time::sleep(*pause).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use narad_storage::{Appended, EncodedBatch, StorageError};

    use super::*;
    use crate::fanout::bucket::{SlabOrigin, bucket};
    use crate::fanout::committer::BlockingCommitter;

    #[test]
    fn a_failed_bucket_commit_names_the_child_partition_in_its_stall_text() {
        let failure = CommitFailure::Commit {
            target: PartitionId::new("child", 1),
            error: StorageError::EmptyBatch.into(),
        };
        assert!(
            matches!(&failure, CommitFailure::Commit { target, .. } if *target == PartitionId::new("child", 1))
        );
        assert_eq!(
            failure.to_string(),
            "commit to child/p00001 failed: a batch needs at least one record"
        );
    }

    /// Fails every commit to the partitions listed in `down`, counting every try.
    struct Refusing {
        down: Vec<u32>,
        tries: Mutex<Vec<u32>>,
    }

    impl BlockingCommitter for Refusing {
        fn append(
            &self,
            partition: &PartitionId,
            batch: &mut EncodedBatch,
        ) -> Result<Appended, ChildCommitError> {
            self.tries.lock().unwrap().push(partition.partition);
            if self.down.contains(&partition.partition) {
                return Err(StorageError::EmptyBatch.into());
            }
            Ok(Appended {
                base_offset: 0,
                count: batch.record_count(),
                committed_at_ms: 0,
            })
        }
    }

    fn slab() -> Arc<Vec<StoredRecord>> {
        Arc::new(
            (10..16)
                .map(|offset| StoredRecord {
                    offset,
                    committed_at_ms: 0,
                    key: None,
                    headers: Vec::new(),
                    value: Some(Bytes::from(format!("v{offset}"))),
                    origin: None,
                })
                .collect(),
        )
    }

    const ORIGIN: SlabOrigin = SlabOrigin {
        epoch: [1; 8],
        parent_partition: 0,
        slab_start: 10,
    };

    #[tokio::test]
    async fn only_the_records_of_a_bucket_that_failed_its_quick_tries_are_retained() {
        let refusing = Arc::new(Refusing {
            down: vec![1],
            tries: Mutex::new(Vec::new()),
        });
        let committer: Arc<dyn ChildCommitter> = Arc::clone(&refusing) as _;
        let timing = FanoutTiming {
            quick_retry_pauses: [Duration::from_millis(1); 2],
            ..FanoutTiming::default()
        };
        let records = slab();
        let buckets = bucket(&records, &[0, 1, 2, 1, 0, 1], "child", 3, ORIGIN).unwrap();
        let failed = commit(buckets, &committer, &timing).await.unwrap_err();
        assert_eq!(failed.indices, [1, 3, 5]);
        assert!(matches!(
            failed.errors.as_slice(),
            [CommitFailure::Commit { target, .. }] if *target == PartitionId::new("child", 1)
        ));
        let kept = failed.retained(&records, false);
        let offsets: Vec<u64> = kept.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [11, 13, 15]);
        // The first time, copies off the parent's buffers; after that, the copies are shared.
        let value = |r: &StoredRecord| r.value.as_ref().map(|v| v.as_ptr());
        assert_ne!(value(&kept[0]), value(&records[1]));
        let again = Failed {
            indices: vec![0, 2],
            errors: Vec::new(),
        }
        .retained(&kept, true);
        assert_eq!(value(&again[0]), value(&kept[0]));
        assert_eq!(again[1].offset, 15);
        // Three tries of the failing bucket (the first and one after each pause), one of each
        // healthy bucket.
        let mut tries = refusing.tries.lock().unwrap().clone();
        tries.sort_unstable();
        assert_eq!(tries, [0, 1, 1, 1, 2]);

        let healthy = bucket(&records, &[0, 2, 2, 0, 0, 2], "child", 3, ORIGIN).unwrap();
        assert!(commit(healthy, &committer, &timing).await.is_ok());
    }

    /// Panics on every commit to partition 2.
    struct Panicking;

    impl BlockingCommitter for Panicking {
        fn append(
            &self,
            partition: &PartitionId,
            batch: &mut EncodedBatch,
        ) -> Result<Appended, ChildCommitError> {
            assert!(partition.partition != 2, "child disk on fire");
            Ok(Appended {
                base_offset: 0,
                count: batch.record_count(),
                committed_at_ms: 0,
            })
        }
    }

    #[tokio::test]
    async fn a_panicking_commit_is_reported_with_its_message_and_its_bucket_is_retained() {
        let committer: Arc<dyn ChildCommitter> = Arc::new(Panicking);
        let records = slab();
        let buckets = bucket(&records, &[0, 1, 2, 1, 2, 1], "child", 3, ORIGIN).unwrap();
        let failed = commit(buckets, &committer, &FanoutTiming::default())
            .await
            .unwrap_err();
        // The buckets of partitions 0 and 1 were acknowledged; only partition 2's records
        // (whose commit may or may not have landed) go round again.
        assert_eq!(failed.indices, [2, 4]);
        assert!(matches!(
            failed.errors.as_slice(),
            [CommitFailure::Commit { error: ChildCommitError::Task(BlockingError::Panicked(message)), .. }]
                if message == "child disk on fire"
        ));
        assert_eq!(
            failed.reason(),
            "commit to child/p00002 failed: blocking task panicked: child disk on fire"
        );
    }
}
