//! Exact memory of which parent records a child partition already holds, so a repeated child
//! commit (a retry after a lost answer, a slab repeated after a crash) is not stored twice.
//!
//! The rule: a record is dropped only if its origin (attach epoch, parent partition, parent
//! offset) is **in the window**, an exact set of the origins most recently appended to this
//! child partition, and the record stored under it has the same content (below). Never by "highest offset seen": a retried bucket re-routed under a new
//! partition count can legitimately arrive below a higher offset from the same parent
//! partition, and dropping it would lose it. A record whose origin has left the window is
//! appended again: a duplicate, which the at-least-once contract allows; a loss is never
//! possible.
//!
//! The window holds the last [`WINDOW_ORIGINS`] origins in arrival order, across all parents
//! and epochs feeding the partition. It is filled from the partition's tail when the partition
//! is opened (see [`OriginWindow::rebuild`]) and updated only after an append is durable, so
//! it never claims a record the log does not hold.
//!
//! **Same origin, other content.** Each origin is held with the child offset of the record
//! stored under it. When a record comes under a held origin, the caller reads that stored
//! record and compares key, headers and value ([`same_content`]): equal, it is a repeat and is
//! dropped; different, its parent partition gave the offset to a new record (its log was lost
//! and started again, or an old copy was restored), and it is kept, counted as reused, and
//! held from then on at its new child offset. Dropping it, as a window of origins alone
//! would, loses an acknowledged record without a trace. The comparison costs a read only when
//! an origin is held, which is rare (a retry, a slab repeated after a crash); the common
//! commit pays nothing for it.

use std::collections::{HashMap, VecDeque};

use narad_storage::{
    AppendBatch, BatchOrigin, NewRecord, PartitionId, ReadOptions, RecordOrigin, StorageError,
    Store, StoredRecord,
};

/// Origins remembered per child partition: 16 full slabs (4,096 records each), enough for
/// every cursor feeding the partition to repeat its last slab, at about 8 bytes each (the
/// parent offset; a run of a batch's records shares its epoch, parent partition and first
/// child offset): ~0.5 MiB per partition at the cap, reached only by partitions that see that
/// much traffic.
pub(crate) const WINDOW_ORIGINS: usize = 16 * 4_096;

/// Whether `new` has the content of `stored`: the same key (absent differs from empty), the
/// same headers in the same order, the same value.
pub(crate) fn same_content(new: &NewRecord, stored: &StoredRecord) -> bool {
    new.key == stored.key && new.value == stored.value && new.headers == stored.headers
}

/// The recent origins of one child partition, each with the child offset of the record
/// stored under it.
///
/// Held as runs, one per appended batch: a batch's records share an attach epoch and a parent
/// partition and sit at consecutive child offsets, so a run is those two, its first child
/// offset and the parent offsets in order. A commit's lookup then visits only the runs of its
/// own epoch and parent partition whose offsets overlap its own, which in the common case
/// (a cursor going forward) is none; remembering a batch is one copy of its parent offsets.
/// A hash entry per record cost a hash and a cache miss per record on every commit.
#[derive(Debug)]
pub(crate) struct OriginWindow {
    capacity: usize,
    /// Runs in arrival order, oldest first.
    runs: VecDeque<Run>,
    /// Origins the runs hold (each run's live part).
    held: usize,
}

/// The origins of one appended batch (or of consecutive stored records of one epoch and
/// parent partition, when rebuilt from the tail).
#[derive(Debug)]
struct Run {
    epoch: [u8; 8],
    parent_partition: u32,
    /// Parent offsets, record by record; those before `live` have left the window.
    parent_offsets: Vec<u64>,
    /// Child offset of `parent_offsets[0]`; the others follow one by one.
    child_base: u64,
    /// Index of the oldest origin still in the window.
    live: usize,
    /// Lowest and highest of `parent_offsets` (of all of them: a bound, not exact, once the
    /// run is partly evicted).
    lowest: u64,
    highest: u64,
    /// Whether `parent_offsets` ascend (a slab's bucket does), so a lookup can bisect.
    ascending: bool,
}

impl Run {
    fn new(epoch: [u8; 8], parent_partition: u32, child_base: u64) -> Run {
        Run {
            epoch,
            parent_partition,
            parent_offsets: Vec::new(),
            child_base,
            live: 0,
            lowest: u64::MAX,
            highest: 0,
            ascending: true,
        }
    }

    fn push(&mut self, parent_offset: u64) {
        if self
            .parent_offsets
            .last()
            .is_some_and(|&last| last >= parent_offset)
        {
            self.ascending = false;
        }
        self.lowest = self.lowest.min(parent_offset);
        self.highest = self.highest.max(parent_offset);
        self.parent_offsets.push(parent_offset);
    }

    fn is_of(&self, epoch: [u8; 8], parent_partition: u32) -> bool {
        self.epoch == epoch && self.parent_partition == parent_partition
    }

    /// The next child offset after the run.
    fn child_end(&self) -> u64 {
        self.child_base + self.parent_offsets.len() as u64
    }

    /// How many origins of the run are in the window.
    fn len(&self) -> usize {
        self.parent_offsets.len() - self.live
    }

    /// Fills in `held`, for each of `parent_offsets` not found yet, the child offset of the
    /// newest record of the run stored under it, if the window still holds it.
    fn find(&self, parent_offsets: &[u64], held: &mut [Option<u64>]) {
        let live = &self.parent_offsets[self.live..];
        let child_offset = |at: usize| self.child_base + (self.live + at) as u64;
        let in_range = |o: u64| self.lowest <= o && o <= self.highest;
        if self.ascending {
            for (at, &o) in held.iter_mut().zip(parent_offsets) {
                if at.is_none() && in_range(o) {
                    *at = live.binary_search(&o).ok().map(child_offset);
                }
            }
        } else {
            // Rare (a tail holding a repeat); an index of the run, the newest record winning.
            let index: HashMap<u64, usize> =
                live.iter().enumerate().map(|(at, &o)| (o, at)).collect();
            for (at, o) in held.iter_mut().zip(parent_offsets) {
                if at.is_none() {
                    *at = index.get(o).copied().map(child_offset);
                }
            }
        }
    }
}

impl Default for OriginWindow {
    fn default() -> OriginWindow {
        OriginWindow::with_capacity(WINDOW_ORIGINS)
    }
}

impl OriginWindow {
    /// An empty window remembering at most `capacity` origins.
    pub(crate) fn with_capacity(capacity: usize) -> OriginWindow {
        OriginWindow {
            capacity: capacity.max(1),
            runs: VecDeque::new(),
            held: 0,
        }
    }

    /// A window filled from stored records, oldest first (the partition's tail on open): each
    /// origin with the child offset of the record stored under it.
    pub(crate) fn rebuild<'a>(
        capacity: usize,
        stored: impl IntoIterator<Item = (&'a RecordOrigin, u64)>,
    ) -> OriginWindow {
        let mut window = OriginWindow::with_capacity(capacity);
        for (origin, child_offset) in stored {
            let extends = window.runs.back().is_some_and(|run| {
                run.is_of(origin.epoch, origin.parent_partition) && run.child_end() == child_offset
            });
            if !extends {
                window.runs.push_back(Run::new(
                    origin.epoch,
                    origin.parent_partition,
                    child_offset,
                ));
            }
            if let Some(run) = window.runs.back_mut() {
                run.push(origin.parent_offset);
            }
            window.held += 1;
            window.evict();
        }
        window
    }

    /// How many origins the window holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held
    }

    /// The highest parent offset of `parent_partition` under `epoch` the window holds: every
    /// offset a new record of that parent partition could be dropped for is at or below it.
    pub(crate) fn highest_offset(&self, epoch: [u8; 8], parent_partition: u32) -> Option<u64> {
        self.runs
            .iter()
            .filter(|run| run.is_of(epoch, parent_partition))
            .filter_map(|run| run.parent_offsets[run.live..].iter().max())
            .max()
            .copied()
    }

    /// Per record of a child batch, the child offset of the record the window holds under its
    /// origin, if it holds one: those are repeats if their content is the same
    /// ([`same_content`]), records under reused offsets otherwise.
    pub(crate) fn held_offsets(&self, origin: &BatchOrigin) -> Vec<Option<u64>> {
        let mut held = vec![None; origin.parent_offsets.len()];
        let (Some(&lowest), Some(&highest)) = (
            origin.parent_offsets.iter().min(),
            origin.parent_offsets.iter().max(),
        ) else {
            return held;
        };
        // Newest first: an origin held twice (a reused offset) answers with its newest record.
        let overlapping = self.runs.iter().rev().filter(|run| {
            run.is_of(origin.epoch, origin.parent_partition)
                && run.lowest <= highest
                && lowest <= run.highest
        });
        for run in overlapping {
            run.find(&origin.parent_offsets, &mut held);
        }
        held
    }

    /// Records the origins of a batch that is now durable in the partition, its records at
    /// child offsets `base_offset`, `base_offset + 1`, ...
    pub(crate) fn remember_batch(&mut self, origin: &BatchOrigin, base_offset: u64) {
        if origin.parent_offsets.is_empty() {
            return;
        }
        let mut run = Run::new(origin.epoch, origin.parent_partition, base_offset);
        run.parent_offsets
            .reserve_exact(origin.parent_offsets.len());
        for &parent_offset in &origin.parent_offsets {
            run.push(parent_offset);
        }
        self.held += run.len();
        self.runs.push_back(run);
        self.evict();
    }

    /// Drops the oldest origins until the window is within its capacity.
    fn evict(&mut self) {
        while self.held > self.capacity {
            let Some(oldest) = self.runs.front_mut() else {
                return;
            };
            let over = self.held - self.capacity;
            if oldest.len() <= over {
                self.held -= oldest.len();
                self.runs.pop_front();
            } else {
                oldest.live += over;
                self.held -= over;
            }
        }
    }
}

/// The batch without the records `keep` marks `false` (their parent offsets go with them), and
/// how many were dropped. `None` when nothing is left to append.
pub(crate) fn without_held(batch: AppendBatch, keep: &[bool]) -> (Option<AppendBatch>, usize) {
    let Some(origin) = batch.origin else {
        return (Some(batch), 0);
    };
    let mut records = Vec::with_capacity(batch.records.len());
    let mut parent_offsets = Vec::with_capacity(origin.parent_offsets.len());
    let mut dropped = 0;
    for ((record, offset), &kept) in batch
        .records
        .into_iter()
        .zip(origin.parent_offsets.iter().copied())
        .zip(keep.iter().chain(std::iter::repeat(&true)))
    {
        if kept {
            records.push(record);
            parent_offsets.push(offset);
        } else {
            dropped += 1;
        }
    }
    if records.is_empty() {
        return (None, dropped);
    }
    let batch = AppendBatch {
        records,
        origin: Some(BatchOrigin {
            parent_offsets,
            ..origin
        }),
    };
    (Some(batch), dropped)
}

/// Calls `each` with every record among the last `count` of `id`, oldest first (from the log
/// start when fewer are stored), read a few MiB at a time: how a window is filled again from
/// a partition's tail.
pub(crate) fn for_each_tail_record(
    store: &Store,
    id: &PartitionId,
    count: usize,
    mut each: impl FnMut(StoredRecord),
) -> Result<(), StorageError> {
    let end = store.high_watermark(id)?;
    let mut offset = end.saturating_sub(count as u64);
    loop {
        let read = match store.read(
            id,
            &ReadOptions {
                offset,
                max_records: count,
                max_bytes: STORED_AT_READ_BYTES,
                max_committed_at_ms: None,
            },
        ) {
            Ok(read) => read,
            // Aged out below the start: begin at the oldest record still stored.
            Err(StorageError::OffsetBelowLogStart { log_start, .. }) if log_start > offset => {
                offset = log_start;
                continue;
            }
            Err(e) => return Err(e),
        };
        read.records.into_iter().for_each(&mut each);
        if read.next_offset >= read.high_watermark || read.next_offset == offset {
            return Ok(());
        }
        offset = read.next_offset;
    }
}

/// Bytes read per step by [`stored_at`] and [`for_each_tail_record`].
const STORED_AT_READ_BYTES: usize = 4 * 1024 * 1024;

/// The records `id` stores at `offsets` (those still stored: an offset below the log start
/// is left out), read in as few passes as their spread allows.
pub(crate) fn stored_at(
    store: &Store,
    id: &PartitionId,
    offsets: impl Iterator<Item = u64>,
) -> Result<HashMap<u64, StoredRecord>, StorageError> {
    let wanted: std::collections::BTreeSet<u64> = offsets.collect();
    let mut found = HashMap::with_capacity(wanted.len());
    let (Some(&first), Some(&last)) = (wanted.first(), wanted.last()) else {
        return Ok(found);
    };
    let mut offset = first;
    while offset <= last {
        let read = match store.read(
            id,
            &ReadOptions {
                offset,
                max_records: usize::try_from(last - offset + 1).unwrap_or(usize::MAX),
                max_bytes: STORED_AT_READ_BYTES,
                max_committed_at_ms: None,
            },
        ) {
            Ok(read) => read,
            Err(StorageError::OffsetBelowLogStart { log_start, .. }) if log_start > offset => {
                offset = log_start;
                continue;
            }
            Err(e) => return Err(e),
        };
        let next = read.next_offset;
        found.extend(
            read.records
                .into_iter()
                .filter(|r| wanted.contains(&r.offset))
                .map(|r| (r.offset, r)),
        );
        if next <= offset || next >= read.high_watermark {
            break;
        }
        // Skip the gap to the next offset wanted.
        offset = wanted.range(next..).next().copied().unwrap_or(last + 1);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use bytes::Bytes;
    use narad_storage::{Header, NewRecord};
    use proptest::prelude::*;

    use super::*;

    /// A batch whose record at parent offset `o` has the value `tag` then `o`.
    fn tagged(epoch: u8, parent_partition: u32, offsets: &[u64], tag: &str) -> AppendBatch {
        AppendBatch {
            records: offsets
                .iter()
                .map(|o| NewRecord {
                    value: Some(Bytes::from(format!("{tag}{o}"))),
                    ..NewRecord::default()
                })
                .collect(),
            origin: Some(BatchOrigin {
                epoch: [epoch; 8],
                parent_partition,
                slab_start: offsets.first().copied().unwrap_or(0),
                parent_offsets: offsets.to_vec(),
            }),
        }
    }

    fn batch(epoch: u8, parent_partition: u32, offsets: &[u64]) -> AppendBatch {
        tagged(epoch, parent_partition, offsets, "")
    }

    /// A child partition: its log (record `i` at child offset `i`) and its window.
    struct Child {
        log: Vec<StoredRecord>,
        window: OriginWindow,
    }

    impl Child {
        fn with_capacity(capacity: usize) -> Child {
            Child {
                log: Vec::new(),
                window: OriginWindow::with_capacity(capacity),
            }
        }

        /// Commits `b` as the receiver does: each record under a held origin is compared with
        /// the stored one. Returns the parent offsets appended and how many were reused.
        fn commit(&mut self, b: AppendBatch) -> (Vec<u64>, usize) {
            let origin = b.origin.clone().unwrap();
            let held = self.window.held_offsets(&origin);
            let mut reused = 0;
            let keep: Vec<bool> = b
                .records
                .iter()
                .zip(&held)
                .map(|(r, h)| match h.and_then(|o| self.log.get(o as usize)) {
                    None => true,
                    Some(stored) if same_content(r, stored) => false,
                    Some(_) => {
                        reused += 1;
                        true
                    }
                })
                .collect();
            let (kept, _) = without_held(b, &keep);
            let Some(kept) = kept else {
                return (Vec::new(), reused);
            };
            let base = self.log.len() as u64;
            let kept_origin = kept.origin.clone().unwrap();
            for (i, r) in kept.records.into_iter().enumerate() {
                self.log.push(StoredRecord {
                    offset: base + i as u64,
                    committed_at_ms: 0,
                    key: r.key,
                    headers: r.headers,
                    value: r.value,
                    origin: None,
                });
            }
            self.window.remember_batch(&kept_origin, base);
            (kept_origin.parent_offsets, reused)
        }

        fn appended(&mut self, b: AppendBatch) -> Vec<u64> {
            self.commit(b).0
        }
    }

    #[test]
    fn the_highest_offset_held_is_per_epoch_and_parent_partition_and_forgets_what_left() {
        let mut window = OriginWindow::with_capacity(4);
        window.remember_batch(batch(1, 0, &[5, 9, 7]).origin.as_ref().unwrap(), 0);
        window.remember_batch(batch(2, 0, &[40]).origin.as_ref().unwrap(), 3);
        assert_eq!(window.highest_offset([1; 8], 0), Some(9));
        assert_eq!(window.highest_offset([2; 8], 0), Some(40));
        assert_eq!(window.highest_offset([1; 8], 1), None);
        // 5 and 9 leave the window; 7 stays.
        window.remember_batch(batch(3, 0, &[1, 2]).origin.as_ref().unwrap(), 4);
        assert_eq!(window.highest_offset([1; 8], 0), Some(7));
    }

    #[test]
    fn a_repeated_batch_is_absorbed_and_a_partial_repeat_keeps_only_the_new_records() {
        let mut child = Child::with_capacity(WINDOW_ORIGINS);
        assert_eq!(child.appended(batch(1, 0, &[10, 12, 14])), [10, 12, 14]);
        assert!(child.appended(batch(1, 0, &[10, 12, 14])).is_empty());
        assert_eq!(child.appended(batch(1, 0, &[14, 16])), [16]);
    }

    #[test]
    fn a_record_with_a_held_origin_but_other_content_is_kept_as_reused_not_dropped() {
        let mut child = Child::with_capacity(WINDOW_ORIGINS);
        child.appended(batch(1, 0, &[0, 1, 2]));
        // The parent lost its log and wrote new records at 0 and 1; 2 is the old record.
        assert_eq!(child.commit(tagged(1, 0, &[0, 1], "new-")), (vec![0, 1], 2));
        assert_eq!(child.commit(batch(1, 0, &[2])), (vec![], 0));
        // The window now holds the new records: their repeat is absorbed.
        assert_eq!(child.commit(tagged(1, 0, &[0, 1], "new-")), (vec![], 0));
        assert_eq!(
            child
                .window
                .held_offsets(&batch(1, 0, &[0]).origin.unwrap()),
            [Some(3)]
        );
    }

    #[test]
    fn content_is_the_key_the_headers_and_the_value() {
        let stored = StoredRecord {
            offset: 0,
            committed_at_ms: 5,
            key: Some(Bytes::from_static(b"k")),
            headers: vec![Header {
                name: "h".to_owned(),
                value: Bytes::from_static(b"v"),
            }],
            value: Some(Bytes::from_static(b"value")),
            origin: None,
        };
        let same = NewRecord {
            key: stored.key.clone(),
            headers: stored.headers.clone(),
            value: stored.value.clone(),
        };
        assert!(same_content(&same, &stored));
        for other in [
            NewRecord {
                key: None,
                ..same.clone()
            },
            NewRecord {
                key: Some(Bytes::new()),
                ..same.clone()
            },
            NewRecord {
                headers: Vec::new(),
                ..same.clone()
            },
            NewRecord {
                value: Some(Bytes::from_static(b"valuf")),
                ..same.clone()
            },
        ] {
            assert!(!same_content(&other, &stored), "{other:?}");
        }
    }

    #[test]
    fn a_lower_offset_never_seen_is_kept_even_after_higher_ones_arrived() {
        let mut child = Child::with_capacity(WINDOW_ORIGINS);
        child.appended(batch(1, 0, &[100, 101, 102]));
        // A re-routed retry of an older bucket: below the highest offset, but never held.
        assert_eq!(child.appended(batch(1, 0, &[50, 51])), [50, 51]);
    }

    #[test]
    fn the_same_offset_from_another_epoch_or_parent_partition_is_a_different_record() {
        let mut child = Child::with_capacity(WINDOW_ORIGINS);
        child.appended(batch(1, 0, &[7]));
        assert_eq!(child.appended(batch(2, 0, &[7])), [7]);
        assert_eq!(child.appended(batch(1, 3, &[7])), [7]);
    }

    #[test]
    fn a_window_rebuilt_from_the_stored_tail_absorbs_the_slab_a_crash_repeats() {
        let mut child = Child::with_capacity(WINDOW_ORIGINS);
        child.log = [5u64, 6, 7]
            .iter()
            .map(|&o| StoredRecord {
                offset: o - 5,
                committed_at_ms: 0,
                key: None,
                headers: Vec::new(),
                value: Some(Bytes::from(o.to_string())),
                origin: Some(RecordOrigin {
                    epoch: [9; 8],
                    parent_partition: 2,
                    parent_offset: o,
                    slab_start: 5,
                }),
            })
            .collect();
        child.window = OriginWindow::rebuild(
            WINDOW_ORIGINS,
            child
                .log
                .iter()
                .filter_map(|r| r.origin.as_ref().map(|o| (o, r.offset))),
        );
        assert_eq!(child.appended(batch(9, 2, &[5, 6, 7, 8])), [8]);
    }

    #[test]
    fn produce_batches_without_origin_pass_untouched() {
        let plain = AppendBatch {
            records: vec![NewRecord::default()],
            origin: None,
        };
        let (kept, dropped) = without_held(plain.clone(), &[]);
        assert_eq!((kept, dropped), (Some(plain), 0));
    }

    proptest! {
        /// Against a model that remembers everything: a record is dropped only if the model
        /// holds that very record (origin and content), never a loss; and the window never
        /// grows past its capacity.
        #[test]
        fn the_window_never_drops_a_record_it_was_not_sure_it_holds(
            batches in proptest::collection::vec(
                (0u8..2, 0u32..3, proptest::collection::vec(0u64..64, 1..12), 0u8..2),
                1..60,
            ),
            capacity in 1usize..40,
        ) {
            let mut child = Child::with_capacity(capacity);
            let mut appended: HashSet<(u8, u32, u64, u8)> = HashSet::new();
            for (epoch, pp, offsets, version) in batches {
                let tag = format!("v{version}-");
                let (kept, _) = child.commit(tagged(epoch, pp, &offsets, &tag));
                for o in &offsets {
                    if !kept.contains(o) {
                        prop_assert!(
                            appended.contains(&(epoch, pp, *o, version)),
                            "dropped {o} (version {version}), never appended"
                        );
                    }
                }
                for o in kept {
                    appended.insert((epoch, pp, o, version));
                }
                prop_assert!(child.window.len() <= capacity);
            }
        }

        /// Against a model that keeps every origin in a list: the window answers, for each
        /// record, the child offset of the newest of the last `capacity` origins that matches,
        /// and nothing else; batches rebuilt from a tail answer the same.
        #[test]
        fn the_window_answers_exactly_what_its_last_origins_hold(
            batches in proptest::collection::vec(
                (0u8..2, 0u32..2, proptest::collection::vec(0u64..48, 1..10)),
                1..40,
            ),
            probes in proptest::collection::vec(
                (0u8..2, 0u32..2, proptest::collection::vec(0u64..48, 1..10)),
                1..8,
            ),
            capacity in 1usize..60,
        ) {
            let mut window = OriginWindow::with_capacity(capacity);
            let mut model: Vec<((u8, u32, u64), u64)> = Vec::new();
            let mut stored: Vec<(RecordOrigin, u64)> = Vec::new();
            for (epoch, pp, offsets) in &batches {
                let base = model.len() as u64;
                window.remember_batch(batch(*epoch, *pp, offsets).origin.as_ref().unwrap(), base);
                for (child, &o) in (base..).zip(offsets) {
                    model.push(((*epoch, *pp, o), child));
                    let origin = RecordOrigin {
                        epoch: [*epoch; 8],
                        parent_partition: *pp,
                        parent_offset: o,
                        slab_start: 0,
                    };
                    stored.push((origin, child));
                }
            }
            let rebuilt =
                OriginWindow::rebuild(capacity, stored.iter().map(|(o, child)| (o, *child)));
            let last = &model[model.len().saturating_sub(capacity)..];
            for (epoch, pp, offsets) in probes {
                let expected: Vec<Option<u64>> = offsets
                    .iter()
                    .map(|&o| {
                        last.iter()
                            .rev()
                            .find(|(origin, _)| *origin == (epoch, pp, o))
                            .map(|&(_, child)| child)
                    })
                    .collect();
                let probe = batch(epoch, pp, &offsets).origin.unwrap();
                prop_assert_eq!(&window.held_offsets(&probe), &expected);
                prop_assert_eq!(&rebuilt.held_offsets(&probe), &expected);
                let highest = last
                    .iter()
                    .filter(|((e, p, _), _)| (*e, *p) == (epoch, pp))
                    .map(|((_, _, o), _)| *o)
                    .max();
                prop_assert_eq!(window.highest_offset([epoch; 8], pp), highest);
            }
            prop_assert_eq!(window.len(), last.len());
        }
    }
}
