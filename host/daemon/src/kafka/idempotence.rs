//! Sequence state of idempotent producers, per producer id and partition.
//!
//! An idempotent producer numbers its batches per partition. For each (producer, partition)
//! this keeps the producer's epoch and its last [`CACHED_BATCHES`] batches with the offsets
//! they were given: a batch sent again (a retry after a lost answer) is answered with its
//! original offsets and not written twice; a batch that skips ahead gets
//! OUT_OF_ORDER_SEQUENCE_NUMBER.
//!
//! The table lives in memory, but every batch of an idempotent producer is stamped in its
//! frame with the producer id, epoch and first sequence. The first idempotent batch a partition
//! gets after a start has the table learn, from the last [`SEED_WINDOW_BYTES`] of that
//! partition's log, the recent batches of every producer found there ([`Idempotence::seed`]),
//! so a retry of a batch written before a restart (or before a move to this node) is still
//! answered with its original offsets. A producer whose batches are older than that, or whose
//! entry was forgotten (past [`MAX_PRODUCER_PARTITIONS`], least recently used first), has its
//! next batch on that partition taken as it comes (whatever its sequence); docs/kafka.md says
//! so.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use narad_storage::{PartitionId, StampedBatch, Store};

/// Batches remembered per producer and partition: 5, Kafka's own (a producer has at most
/// `max.in.flight.requests.per.connection` = 5 batches unanswered when idempotent).
pub(crate) const CACHED_BATCHES: usize = 5;

/// Most (producer, partition) entries kept: 65,536, a few tens of bytes each plus five
/// cached batches, so about 20 MiB at most.
pub(crate) const MAX_PRODUCER_PARTITIONS: usize = 65_536;

/// How much of a partition's log, from its end, is read for producers' recent batches on its
/// first idempotent batch after a start: 16 MiB, far more than the five batches a producer can
/// have unanswered (1 MiB each at most by default), even with other producers writing between
/// them, while a start never reads more than this per partition.
pub(crate) const SEED_WINDOW_BYTES: u64 = 16 * 1024 * 1024;

/// Partition logs read for producers' batches at once: a start with thousands of partitions
/// taking idempotent batches reads 4 windows at a time, not thousands.
pub(crate) const SEED_READS_AT_ONCE: usize = 4;

/// A batch as remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CachedBatch {
    /// Sequence of its first record.
    pub first_sequence: i32,
    /// Sequence of its last record.
    pub(crate) last_sequence: i32,
    /// Offset its first record was given.
    pub base_offset: u64,
    /// Its commit time, ms since the epoch.
    pub committed_at_ms: i64,
}

/// What to do with a batch of an idempotent producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Write it.
    Append,
    /// Already written: answer with the original batch.
    Duplicate(CachedBatch),
    /// Its first sequence is not the next one expected (OUT_OF_ORDER_SEQUENCE_NUMBER).
    OutOfOrder {
        /// The sequence expected.
        expected: i32,
    },
    /// An epoch older than the producer's current one (INVALID_PRODUCER_EPOCH).
    StaleEpoch {
        /// The producer's current epoch.
        current: i16,
    },
}

/// The state of one producer on one partition. Locked across check, commit and record, so
/// two copies of a batch on two connections cannot both be written.
#[derive(Debug, Default)]
pub(crate) struct ProducerPartition {
    epoch: Option<i16>,
    batches: VecDeque<CachedBatch>,
}

/// Sequence of the last record of a batch of `count` records starting at `first`: sequences
/// wrap from `i32::MAX` to 0, as Kafka's do.
pub(crate) fn last_sequence(first: i32, count: usize) -> i32 {
    let span = (count.saturating_sub(1) % (i32::MAX as usize + 1)) as i64;
    ((i64::from(first) + span) % (i64::from(i32::MAX) + 1)) as i32
}

fn next_sequence(last: i32) -> i32 {
    if last == i32::MAX { 0 } else { last + 1 }
}

impl ProducerPartition {
    /// Whether nothing is known of the producer here (no batch seen or learned).
    fn is_empty(&self) -> bool {
        self.epoch.is_none()
    }

    /// Judges a batch with `epoch`, starting at `first_sequence`, of `count` records.
    pub(crate) fn check(&self, epoch: i16, first_sequence: i32, count: usize) -> Verdict {
        let Some(current) = self.epoch else {
            // Nothing known (a new producer, or state lost to a restart): take it.
            return Verdict::Append;
        };
        if epoch < current {
            return Verdict::StaleEpoch { current };
        }
        if epoch > current {
            // A bumped epoch restarts the sequences at 0.
            return if first_sequence == 0 {
                Verdict::Append
            } else {
                Verdict::OutOfOrder { expected: 0 }
            };
        }
        let last = last_sequence(first_sequence, count);
        if let Some(batch) = self
            .batches
            .iter()
            .find(|b| b.first_sequence == first_sequence && b.last_sequence == last)
        {
            return Verdict::Duplicate(*batch);
        }
        let expected = self
            .batches
            .back()
            .map_or(0, |b| next_sequence(b.last_sequence));
        if first_sequence == expected {
            Verdict::Append
        } else {
            Verdict::OutOfOrder { expected }
        }
    }

    /// Remembers a batch just written (after [`ProducerPartition::check`] said
    /// [`Verdict::Append`]).
    pub(crate) fn record(&mut self, epoch: i16, batch: CachedBatch) {
        if self.epoch != Some(epoch) {
            self.batches.clear();
            self.epoch = Some(epoch);
        }
        if self.batches.len() == CACHED_BATCHES {
            self.batches.pop_front();
        }
        self.batches.push_back(batch);
    }
}

type Entry = Arc<tokio::sync::Mutex<ProducerPartition>>;

/// Every (producer id, partition) state, bounded.
#[derive(Debug)]
pub(crate) struct Idempotence {
    entries: Mutex<HashMap<(i64, PartitionId), (Entry, u64)>>,
    tick: AtomicU64,
    max_entries: usize,
    /// Partitions whose log was read for producers' batches, with the incarnation
    /// ([`narad_storage::Store::incarnation`]) of the log that was read.
    seeded: Mutex<HashMap<PartitionId, u64>>,
    /// Bounds the logs read for producers' batches at once ([`SEED_READS_AT_ONCE`]).
    seed_reads: tokio::sync::Semaphore,
}

impl Idempotence {
    /// An empty table keeping at most `max_entries`.
    pub(crate) fn new(max_entries: usize) -> Idempotence {
        Idempotence {
            entries: Mutex::new(HashMap::new()),
            tick: AtomicU64::new(0),
            max_entries: max_entries.max(1),
            seeded: Mutex::new(HashMap::new()),
            seed_reads: tokio::sync::Semaphore::new(SEED_READS_AT_ONCE),
        }
    }

    /// Reads `partition`'s log for producers' recent batches ([`Idempotence::seed`]) unless
    /// that log, as registered now, was read already: the first idempotent batch a partition
    /// gets after a start (or after it came back to this node) does it, so a retry of a batch
    /// written before is answered with its offsets, not written twice. `Err` says why the log
    /// could not be read.
    pub(crate) async fn learn_from_log(
        &self,
        store: &Arc<Store>,
        partition: &PartitionId,
    ) -> Result<(), String> {
        let Some(incarnation) = store.incarnation(partition) else {
            // Not registered here: the append that follows says so.
            return Ok(());
        };
        if !self.needs_seed(partition, incarnation) {
            return Ok(());
        }
        let Ok(_turn) = self.seed_reads.acquire().await else {
            return Ok(());
        };
        // Another batch may have read it while this one waited its turn.
        if !self.needs_seed(partition, incarnation) {
            return Ok(());
        }
        let (store, id) = (Arc::clone(store), partition.clone());
        let batches = crate::blocking::run(move || store.producer_batches(&id, SEED_WINDOW_BYTES))
            .await
            .map_err(|e| e.to_string())
            .and_then(|read| read.map_err(|e| e.to_string()))
            .map_err(|reason| {
                format!("reading the recent producer batches of {partition}: {reason}")
            })?;
        self.seed(partition, incarnation, &batches);
        Ok(())
    }

    /// Whether `partition`'s log, as registered now (`incarnation`), has not been read for
    /// producers' batches yet: never since start, or only an earlier registration of it (the
    /// partition moved away and back, and other nodes may have written to it meanwhile).
    fn needs_seed(&self, partition: &PartitionId, incarnation: u64) -> bool {
        self.seeded
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(partition)
            != Some(&incarnation)
    }

    /// Learns from `batches` (stamped batches of `partition` in its log of `incarnation`,
    /// oldest first) each producer's epoch and last [`CACHED_BATCHES`] batches of that epoch,
    /// for producers this table knows nothing of on `partition` yet (what it learned live is
    /// newer), and marks the partition read. What it knew of an earlier incarnation is
    /// forgotten first: that log may have grown elsewhere since.
    pub(crate) fn seed(&self, partition: &PartitionId, incarnation: u64, batches: &[StampedBatch]) {
        let earlier = self
            .seeded
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(partition)
            .is_some_and(|&seen| seen != incarnation);
        if earlier {
            self.entries
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .retain(|(_, p), _| p != partition);
        }
        let mut by_producer: HashMap<i64, Vec<&StampedBatch>> = HashMap::new();
        for batch in batches {
            by_producer
                .entry(batch.stamp.producer_id)
                .or_default()
                .push(batch);
        }
        for (producer_id, found) in by_producer {
            let Some(newest) = found.last() else { continue };
            let epoch = newest.stamp.epoch;
            let entry = self.entry(producer_id, partition);
            // Busy: a batch of this producer is being handled now, so its state is live.
            let Ok(mut state) = entry.try_lock() else {
                continue;
            };
            if !state.is_empty() {
                continue;
            }
            let same_epoch: Vec<_> = found.iter().filter(|b| b.stamp.epoch == epoch).collect();
            for batch in same_epoch.iter().rev().take(CACHED_BATCHES).rev() {
                state.record(
                    epoch,
                    CachedBatch {
                        first_sequence: batch.stamp.base_sequence,
                        last_sequence: last_sequence(
                            batch.stamp.base_sequence,
                            batch.record_count as usize,
                        ),
                        base_offset: batch.base_offset,
                        committed_at_ms: batch.committed_at_ms,
                    },
                );
            }
        }
        self.seeded
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .insert(partition.clone(), incarnation);
    }

    /// The state of `producer_id` on `partition`, created empty when unknown (forgetting the
    /// least recently used entry when full).
    pub(crate) fn entry(&self, producer_id: i64, partition: &PartitionId) -> Entry {
        let now = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let key = (producer_id, partition.clone());
        if let Some((entry, used)) = entries.get_mut(&key) {
            *used = now;
            return Arc::clone(entry);
        }
        if entries.len() >= self.max_entries {
            // Rare (only once the table is full), so a scan is cheaper than an ordered index.
            if let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                entries.remove(&oldest);
            }
        }
        let entry = Entry::default();
        entries.insert(key, (Arc::clone(&entry), now));
        entry
    }

    /// Entries held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: i32, count: usize, base: u64) -> CachedBatch {
        CachedBatch {
            first_sequence: first,
            last_sequence: last_sequence(first, count),
            base_offset: base,
            committed_at_ms: 1,
        }
    }

    fn stamped(producer_id: i64, epoch: i16, first: i32, count: u32, base: u64) -> StampedBatch {
        StampedBatch {
            stamp: narad_storage::ProducerStamp {
                producer_id,
                epoch,
                base_sequence: first,
            },
            base_offset: base,
            record_count: count,
            committed_at_ms: 9,
        }
    }

    #[tokio::test]
    async fn seeding_from_the_log_knows_each_producers_last_five_batches_of_its_epoch() {
        let table = Idempotence::new(100);
        let partition = PartitionId::new("t", 0);
        assert!(table.needs_seed(&partition, 0));
        // Producer 1: seven batches of two records; producer 2: one of epoch 1, then epoch 2.
        let mut batches: Vec<StampedBatch> = (0..7)
            .map(|i| stamped(1, 0, i * 2, 2, 100 + u64::from(i as u32) * 2))
            .collect();
        batches.push(stamped(2, 1, 0, 1, 200));
        batches.push(stamped(2, 2, 0, 3, 201));
        table.seed(&partition, 0, &batches);
        assert!(!table.needs_seed(&partition, 0));
        assert!(
            table.needs_seed(&partition, 1),
            "registered anew: read again"
        );

        let one = table.entry(1, &partition);
        let one = one.lock().await;
        // The last five (sequences 4 to 13) are repeats with their offsets; older ones are not
        // remembered, and the next sequence is 14.
        assert_eq!(
            one.check(0, 12, 2),
            Verdict::Duplicate(CachedBatch {
                first_sequence: 12,
                last_sequence: 13,
                base_offset: 112,
                committed_at_ms: 9,
            })
        );
        assert!(matches!(one.check(0, 4, 2), Verdict::Duplicate(_)));
        assert_eq!(one.check(0, 2, 2), Verdict::OutOfOrder { expected: 14 });
        assert_eq!(one.check(0, 14, 1), Verdict::Append);
        let two = table.entry(2, &partition);
        let two = two.lock().await;
        assert_eq!(two.check(1, 0, 1), Verdict::StaleEpoch { current: 2 });
        assert!(matches!(two.check(2, 0, 3), Verdict::Duplicate(_)));
    }

    #[tokio::test]
    async fn seeding_never_replaces_what_the_table_learned_live() {
        let table = Idempotence::new(100);
        let partition = PartitionId::new("t", 0);
        table
            .entry(1, &partition)
            .lock()
            .await
            .record(4, batch(0, 1, 500));
        table.seed(&partition, 0, &[stamped(1, 3, 0, 1, 7)]);
        let live = table.entry(1, &partition);
        assert_eq!(
            live.lock().await.check(4, 0, 1),
            Verdict::Duplicate(batch(0, 1, 500))
        );
        drop(live);

        // The partition moved away and back: its log is read again and what was known of the
        // earlier one is dropped, live or not.
        table.seed(&partition, 1, &[stamped(1, 5, 9, 1, 800)]);
        let again = table.entry(1, &partition);
        let again = again.lock().await;
        assert_eq!(again.check(4, 0, 1), Verdict::StaleEpoch { current: 5 });
        assert!(matches!(again.check(5, 9, 1), Verdict::Duplicate(_)));
    }

    #[test]
    fn a_retry_of_any_of_the_last_five_batches_is_a_duplicate_with_its_offsets() {
        let mut state = ProducerPartition::default();
        for i in 0..7 {
            assert_eq!(state.check(0, i * 2, 2), Verdict::Append);
            state.record(0, batch(i * 2, 2, u64::try_from(i).unwrap() * 2));
        }
        assert_eq!(state.check(0, 12, 2), Verdict::Duplicate(batch(12, 2, 12)));
        assert_eq!(state.check(0, 4, 2), Verdict::Duplicate(batch(4, 2, 4)));
        // Older than the cache: not a known duplicate, and not the next sequence either.
        assert_eq!(state.check(0, 2, 2), Verdict::OutOfOrder { expected: 14 });
        assert_eq!(state.check(0, 16, 1), Verdict::OutOfOrder { expected: 14 });
        assert_eq!(state.check(0, 14, 1), Verdict::Append);
    }

    #[test]
    fn epochs_fence_old_producers_and_restart_sequences() {
        let mut state = ProducerPartition::default();
        // Unknown state takes any sequence (after a restart).
        assert_eq!(state.check(3, 40, 1), Verdict::Append);
        state.record(3, batch(40, 1, 0));
        assert_eq!(state.check(2, 41, 1), Verdict::StaleEpoch { current: 3 });
        assert_eq!(state.check(4, 5, 1), Verdict::OutOfOrder { expected: 0 });
        assert_eq!(state.check(4, 0, 1), Verdict::Append);
    }

    #[test]
    fn sequences_wrap_past_i32_max() {
        assert_eq!(last_sequence(i32::MAX, 2), 0);
        let mut state = ProducerPartition::default();
        state.record(0, batch(i32::MAX - 1, 2, 0));
        assert_eq!(state.check(0, 0, 1), Verdict::Append);
    }

    #[test]
    fn the_table_forgets_the_least_recently_used_entry_when_full() {
        let table = Idempotence::new(2);
        let a = PartitionId::new("t", 0);
        let b = PartitionId::new("t", 1);
        let first = table.entry(1, &a);
        table.entry(2, &b);
        table.entry(1, &a); // used again
        table.entry(3, &b); // evicts (2, b)
        assert_eq!(table.len(), 2);
        assert!(Arc::ptr_eq(&first, &table.entry(1, &a)));
    }
}
