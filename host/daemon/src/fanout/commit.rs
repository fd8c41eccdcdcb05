//! Step 4 of a slab, commit: every bucket appended to its child partition, durably.
//!
//! Up to [`COMMITS_IN_FLIGHT`] buckets are committed at once, each through the
//! [`ChildCommitter`] (on one node: the produce path, append, `fdatasync`, verify) with quick
//! tries [`FanoutTiming::quick_retry_pauses`] apart. [`commit`] hands out [`Acknowledged`],
//! the only thing [`super::advance`] moves the offset file past a slab with, only when every
//! bucket it was given is acknowledged. Otherwise it says which records failed ([`Failed`]):
//! the cursor keeps copies of just those ([`Failed::retained`]), backs off
//! ([`FanoutTiming::retry_backoff`]) and sends only them through route, bucket and commit
//! again, after checking its epoch and under the child's current partition count. Buckets
//! that succeeded are never sent again.

use std::sync::Arc;

use narad_storage::{AppendBatch, PartitionId, StorageError, StoredRecord};
use tokio::task::JoinSet;

use super::bucket::{Bucket, to_new_record};
use super::committer::ChildCommitter;
use super::{COMMITS_IN_FLIGHT, FanoutTiming};

/// Proof that every bucket of a commit was acknowledged by its child partition. Only
/// [`commit`] makes one; advancing the offset file past a slab takes one.
#[derive(Debug)]
#[must_use = "an acknowledged slab is advanced past"]
pub struct Acknowledged(());

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

/// The buckets that were not acknowledged.
#[derive(Debug)]
pub struct Failed {
    /// Indices (into the slab given to bucketing) of the records not known to be committed,
    /// sorted, each once.
    pub indices: Vec<usize>,
    /// Why, one entry per failed bucket (or failed task).
    pub errors: Vec<CommitFailure>,
}

impl Failed {
    /// The stall reason operators see: every failure, `; `-separated.
    pub fn reason(&self) -> String {
        self.errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The failed records of `records` (the slab given to bucketing), in slab order, copied
    /// off the parent's read buffers so a long outage does not pin them.
    pub fn retained(&self, records: &[StoredRecord]) -> Vec<StoredRecord> {
        self.indices
            .iter()
            .filter_map(|&i| records.get(i))
            .map(|record| {
                let copied = to_new_record(record, true);
                StoredRecord {
                    offset: record.offset,
                    committed_at_ms: record.committed_at_ms,
                    key: copied.key,
                    headers: copied.headers,
                    value: copied.value,
                    origin: None,
                }
            })
            .collect()
    }
}

/// Commits `buckets` to their child partitions, [`COMMITS_IN_FLIGHT`] at a time, each with
/// quick tries. `Ok` once every one is acknowledged; otherwise which records failed.
pub async fn commit(
    buckets: Vec<Bucket>,
    committer: &Arc<dyn ChildCommitter>,
    timing: &FanoutTiming,
) -> Result<Acknowledged, Failed> {
    let records: usize = buckets.iter().map(|b| b.indices.len()).sum();
    let mut queued = buckets.into_iter();
    let mut in_flight = JoinSet::new();
    let mut failed = Failed {
        indices: Vec::new(),
        errors: Vec::new(),
    };
    loop {
        while in_flight.len() < COMMITS_IN_FLIGHT {
            let Some(bucket) = queued.next() else {
                break;
            };
            let committer = Arc::clone(committer);
            let pauses = timing.quick_retry_pauses;
            in_flight.spawn_blocking(move || {
                let outcome = commit_with_quick_retries(
                    committer.as_ref(),
                    &bucket.target,
                    bucket.batch,
                    &pauses,
                );
                (bucket.target, bucket.indices, outcome)
            });
        }
        let Some(joined) = in_flight.join_next().await else {
            break;
        };
        match joined {
            Ok((_, _, Ok(()))) => {}
            Ok((target, indices, Err(error))) => {
                failed.errors.push(CommitFailure::Commit { target, error });
                failed.indices.extend(indices);
            }
            Err(join) => {
                // A panicking commit task: its records' fate is unknown, so retry them all
                // (duplicates are allowed; gaps are not). Which records they were is lost
                // with the task, so the whole slab is retried.
                failed.errors.push(CommitFailure::Task(join));
                failed.indices = (0..records).collect();
            }
        }
    }
    if failed.errors.is_empty() {
        return Ok(Acknowledged(()));
    }
    failed.indices.sort_unstable();
    failed.indices.dedup();
    Err(failed)
}

/// Commits one bucket, trying again after each of `pauses` (blocking: it runs on the blocking
/// pool, one thread per bucket in flight).
fn commit_with_quick_retries(
    committer: &dyn ChildCommitter,
    partition: &PartitionId,
    batch: AppendBatch,
    pauses: &[std::time::Duration],
) -> Result<(), StorageError> {
    let mut tries = 0;
    loop {
        match committer.commit(partition, batch.clone()) {
            Ok(_) => return Ok(()),
            Err(error) => {
                let Some(pause) = pauses.get(tries) else {
                    return Err(error);
                };
                tracing::debug!(%partition, %error, "child commit failed, trying again");
                tries += 1;
                std::thread::sleep(*pause);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use bytes::Bytes;
    use narad_storage::Appended;

    use super::*;
    use crate::fanout::bucket::{SlabOrigin, bucket};

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

    /// Fails every commit to the partitions listed in `down`, counting every try.
    struct Refusing {
        down: Vec<u32>,
        tries: Mutex<Vec<u32>>,
    }

    impl ChildCommitter for Refusing {
        fn commit(
            &self,
            partition: &PartitionId,
            batch: AppendBatch,
        ) -> Result<Appended, StorageError> {
            self.tries.lock().unwrap().push(partition.partition);
            if self.down.contains(&partition.partition) {
                return Err(StorageError::EmptyBatch);
            }
            Ok(Appended {
                base_offset: 0,
                count: batch.records.len() as u32,
                committed_at_ms: 0,
            })
        }
    }

    fn slab() -> Vec<StoredRecord> {
        (10..16)
            .map(|offset| StoredRecord {
                offset,
                committed_at_ms: 0,
                key: None,
                headers: Vec::new(),
                value: Bytes::from(format!("v{offset}")),
                origin: None,
            })
            .collect()
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
        let kept: Vec<u64> = failed.retained(&records).iter().map(|r| r.offset).collect();
        assert_eq!(kept, [11, 13, 15]);
        // Three tries of the failing bucket (the first and one after each pause), one of each
        // healthy bucket.
        let mut tries = refusing.tries.lock().unwrap().clone();
        tries.sort_unstable();
        assert_eq!(tries, [0, 1, 1, 1, 2]);

        let healthy = bucket(&records, &[0, 2, 2, 0, 0, 2], "child", 3, ORIGIN).unwrap();
        assert!(commit(healthy, &committer, &timing).await.is_ok());
    }
}
