//! The produce path: place records on partitions and commit them, one batch per partition.
//!
//! [`Producer::commit`] is the one way a batch reaches a partition log (append + `fdatasync` +
//! verify, on the blocking pool); produce uses it, and the fan-out cursors' child commits will
//! use the same function, so both get the same durability.
//!
//! Placement ([`Producer::place`]), in this order: an explicit partition is honoured; a keyed
//! record goes where Kafka's default partitioner puts it
//! ([`narad_abi::partition_for_key`]); a keyless record goes round-robin, per topic.

pub(crate) mod copies;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use narad_storage::{
    AppendBatch, Appended, EncodedBatch, NewRecord, PartitionId, PartitionState, ProducerStamp,
    ReadOptions, StorageError, Store,
};

use crate::blocking::BlockingError;

/// Errors from [`Producer::produce`] and [`Producer::commit`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProduceError {
    /// A target partition is quarantined or failed; checked before anything is written, so
    /// nothing of the request was committed.
    #[error("{0}")]
    Unavailable(StorageError),
    /// Appending to `partition` failed. Batches for the partitions in `committed_partitions`
    /// had already committed (a request spanning partitions is not atomic across them).
    #[error("append to {partition} failed: {source}")]
    Append {
        /// The partition whose append failed.
        partition: PartitionId,
        /// Why.
        source: StorageError,
        /// Partitions of the same request whose batch did commit.
        committed_partitions: Vec<u32>,
    },
    /// The blocking task running an append panicked or was cancelled.
    #[error("append task failed: {0}")]
    Task(#[from] BlockingError),
    /// Cluster mode: this node has lost touch with etcd for nearly its lease TTL (peers may
    /// soon count it dead), or joined again and has not yet read what changed meanwhile: it
    /// takes no writes (nothing was written), or it lost its lease while the write was in
    /// progress (the write is not acknowledged: it may or may not be stored; retry).
    #[error("{0}")]
    Fenced(crate::ownership::FenceError),
}

pub use crate::ownership::{WriteFence, WriteTerm};

/// Header names clients may not give a record (on the HTTP and the Kafka produce alike):
/// `narad.origin` is what the Kafka listener shows as a copy's origin, and a consumer that
/// drops repeats by it must never meet one a producer wrote.
pub(crate) const RESERVED_HEADER_PREFIX: &str = "narad.";

/// Whether a client may not give a record a header named `name`
/// ([`RESERVED_HEADER_PREFIX`], compared without regard to case).
pub(crate) fn is_reserved_header(name: &str) -> bool {
    name.len() >= RESERVED_HEADER_PREFIX.len()
        && name.as_bytes()[..RESERVED_HEADER_PREFIX.len()]
            .eq_ignore_ascii_case(RESERVED_HEADER_PREFIX.as_bytes())
}

/// One record of a produce request, already decoded and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRecord {
    /// An explicit target partition (validated against the partition count by the caller).
    pub partition: Option<u32>,
    /// The record.
    pub record: NewRecord,
}

/// Where one produced record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Partition index.
    pub partition: u32,
    /// Offset in that partition.
    pub offset: u64,
}

/// Places and commits records. Shared by every request (`Arc<Producer>`).
pub struct Producer {
    store: Arc<Store>,
    /// Remote children's copies already stored, per partition (see [`copies`]).
    copies: Arc<copies::CopyWindows>,
    /// Next round-robin position per topic, for keyless records.
    round_robin: Mutex<HashMap<String, u64>>,
    /// Cluster mode: refuses every write while the node is fenced.
    fence: Option<Arc<dyn WriteFence>>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("store", &self.store)
            .field("fenced", &self.fence.is_some())
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// A producer over `store`.
    pub fn new(store: Arc<Store>) -> Producer {
        Producer {
            store,
            copies: Arc::default(),
            round_robin: Mutex::new(HashMap::new()),
            fence: None,
        }
    }

    /// This producer, refusing every write while `fence` says why not
    /// ([`ProduceError::Fenced`]).
    pub(crate) fn with_fence(mut self, fence: Arc<dyn WriteFence>) -> Producer {
        self.fence = Some(fence);
        self
    }

    /// Before a write: the term it runs under (`None` on one node), or
    /// [`ProduceError::Fenced`].
    fn admit(&self) -> Result<Option<WriteTerm>, ProduceError> {
        self.fence
            .as_ref()
            .map(|fence| fence.admit().map_err(ProduceError::Fenced))
            .transpose()
    }

    /// After a durable write to `partition`, before it is acknowledged: whether the node kept
    /// its lease (and the partition) all along ([`WriteFence::confirm`]).
    fn confirm(
        &self,
        term: Option<WriteTerm>,
        partition: &PartitionId,
    ) -> Result<(), ProduceError> {
        match (&self.fence, term) {
            (Some(fence), Some(term)) => {
                fence.confirm(term, partition).map_err(ProduceError::Fenced)
            }
            _ => Ok(()),
        }
    }

    /// The store this producer writes to.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The partition of each record, in order: explicit, else keyed, else round-robin (the
    /// counter continues across requests). `partitions` must be at least 1.
    pub fn place(&self, topic: &str, partitions: u32, records: &[ProduceRecord]) -> Vec<u32> {
        let partitions = partitions.max(1);
        let keyless = records
            .iter()
            .filter(|r| r.partition.is_none() && r.record.key.is_none())
            .count() as u64;
        let mut next = if keyless > 0 {
            let mut counters = self
                .round_robin
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            let counter = counters.entry(topic.to_owned()).or_insert(0);
            let start = *counter;
            *counter = counter.wrapping_add(keyless);
            start
        } else {
            0
        };
        records
            .iter()
            .map(|r| match (r.partition, &r.record.key) {
                (Some(p), _) => p,
                (None, Some(key)) => key_partition(key, partitions),
                (None, None) => {
                    let p = (next % u64::from(partitions)) as u32;
                    next = next.wrapping_add(1);
                    p
                }
            })
            .collect()
    }

    /// Forgets per-topic state (the round-robin position) after a topic is deleted.
    pub(crate) fn forget_topic(&self, topic: &str) {
        self.round_robin
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .remove(topic);
        self.copies.forget_topic(topic);
    }

    /// Commits one batch to one partition: append + `fdatasync` + verify on the blocking
    /// pool. Returns once the batch is durable. The single commit path for produce and for
    /// child commits.
    pub async fn commit(
        &self,
        partition: PartitionId,
        batch: AppendBatch,
    ) -> Result<Appended, ProduceError> {
        self.commit_with(partition, move |store, id| store.append(id, batch))
            .await
    }

    /// Commits `records` of an idempotent Kafka producer to `partition`, as
    /// [`Producer::commit`] does, stamped with the producer (so its batches are known again
    /// after a restart).
    pub async fn commit_stamped(
        &self,
        partition: PartitionId,
        records: Vec<NewRecord>,
        stamp: ProducerStamp,
    ) -> Result<Appended, ProduceError> {
        self.commit_with(partition, move |store, id| {
            store.append_encoded(id, &mut EncodedBatch::encode_stamped(&records, stamp)?)
        })
        .await
    }

    /// Runs `append` (encode + append on the store) on the blocking pool, fenced.
    async fn commit_with(
        &self,
        partition: PartitionId,
        append: impl FnOnce(&Store, &PartitionId) -> narad_storage::Result<Appended> + Send + 'static,
    ) -> Result<Appended, ProduceError> {
        let term = self.admit()?;
        let store = Arc::clone(&self.store);
        let id = partition.clone();
        let appended = crate::blocking::run(move || append(&store, &id))
            .await?
            .map_err(|source| ProduceError::Append {
                partition: partition.clone(),
                source,
                committed_partitions: Vec::new(),
            })?;
        self.confirm(term, &partition)?;
        Ok(appended)
    }

    /// Places `records` on `topic` (with `partitions` partitions), groups them per partition
    /// keeping request order, checks that no target partition is quarantined or failed, then
    /// commits one batch per partition (concurrently). Returns where each record landed, in
    /// request order.
    pub async fn produce(
        &self,
        topic: &str,
        partitions: u32,
        records: Vec<ProduceRecord>,
    ) -> Result<Vec<Placed>, ProduceError> {
        let term = self.admit()?;
        let placement = self.place(topic, partitions, &records);
        let mut groups: BTreeMap<u32, Vec<NewRecord>> = BTreeMap::new();
        // Position of each record inside its partition's batch.
        let mut index_in_group = Vec::with_capacity(records.len());
        for (record, &p) in records.into_iter().zip(&placement) {
            let group = groups.entry(p).or_default();
            index_in_group.push(group.len() as u64);
            group.push(record.record);
        }

        {
            let store = Arc::clone(&self.store);
            let targets: Vec<PartitionId> =
                groups.keys().map(|&p| PartitionId::new(topic, p)).collect();
            crate::blocking::run(move || check_writable(&store, &targets)).await??;
        }

        let appends = groups.into_iter().map(|(p, group)| {
            let (store, copies) = (Arc::clone(&self.store), Arc::clone(&self.copies));
            let id = PartitionId::new(topic, p);
            // A remote child's copy already stored is not stored again ([`copies`]).
            move || {
                let result = copies.append(&store, &id, group);
                (id, result)
            }
        });
        // Every append runs to its end before anything is reported, a panicked one included.
        let mut bases: HashMap<u32, Vec<u64>> = HashMap::new();
        let mut failure: Option<(PartitionId, StorageError)> = None;
        for outcome in crate::blocking::run_all(appends).await {
            let (id, result) = outcome?;
            match result {
                Ok(offsets) => {
                    bases.insert(id.partition, offsets);
                }
                Err(source) => {
                    if failure.is_none() {
                        failure = Some((id, source));
                    } else {
                        tracing::warn!(partition = %id, error = %source, "append failed");
                    }
                }
            }
        }
        if let Some((partition, source)) = failure {
            let mut committed_partitions: Vec<u32> = bases.keys().copied().collect();
            committed_partitions.sort_unstable();
            return Err(ProduceError::Append {
                partition,
                source,
                committed_partitions,
            });
        }
        for &p in bases.keys() {
            self.confirm(term, &PartitionId::new(topic, p))?;
        }
        Ok(placement
            .iter()
            .zip(index_in_group)
            .map(|(&p, i)| Placed {
                partition: p,
                offset: bases
                    .get(&p)
                    .and_then(|offsets| offsets.get(i as usize))
                    .copied()
                    .unwrap_or_default(),
            })
            .collect())
    }
}

/// Fails with [`ProduceError::Unavailable`] when any target is quarantined or failed, so a
/// request that cannot be written whole writes nothing. A closed log is opened first (by a
/// one-record read), because recovery runs on open and is what finds damage; a failed one is
/// probed the same way, which reopens it when its wait is over.
fn check_writable(store: &Store, targets: &[PartitionId]) -> Result<(), ProduceError> {
    for id in targets {
        let stats = store.peek(id).map_err(ProduceError::Unavailable)?;
        match stats.state {
            PartitionState::Quarantined { reason } => {
                return Err(ProduceError::Unavailable(StorageError::Quarantined {
                    id: id.clone(),
                    reason: Box::new(reason),
                }));
            }
            PartitionState::Sealed => {
                return Err(ProduceError::Unavailable(StorageError::Sealed {
                    id: id.clone(),
                }));
            }
            // A failed partition is probed like a closed one: the read reopens it once its
            // wait is over, and reports it failed until then.
            PartitionState::Closed | PartitionState::Failed { .. } => {
                let probe = ReadOptions {
                    offset: stats.log_start_offset,
                    max_records: 1,
                    max_bytes: 1,
                    max_committed_at_ms: None,
                };
                match store.read(id, &probe) {
                    Ok(_) => {}
                    // Retention moved the start between peek and read: the log is open and fine.
                    Err(StorageError::OffsetBelowLogStart { .. }) => {}
                    Err(e) => return Err(ProduceError::Unavailable(e)),
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Kafka's default partitioner for a keyed record.
fn key_partition(key: &Bytes, partitions: u32) -> u32 {
    // `partitions` is at least 1 here, so the partitioner always answers.
    narad_abi::partition_for_key(key, partitions).unwrap_or(0)
}
