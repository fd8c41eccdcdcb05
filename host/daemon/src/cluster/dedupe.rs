//! Exact memory of which parent records a child partition already holds, so a repeated child
//! commit (a retry after a lost answer, a slab repeated after a crash) is not stored twice.
//!
//! The rule: a record is dropped only if its origin (attach epoch, parent partition, parent
//! offset) is **in the window**, an exact set of the origins most recently appended to this
//! child partition. Never by "highest offset seen": a retried bucket re-routed under a new
//! partition count can legitimately arrive below a higher offset from the same parent
//! partition, and dropping it would lose it. A record whose origin has left the window is
//! appended again: a duplicate, which the at-least-once contract allows; a loss is never
//! possible.
//!
//! The window holds the last [`WINDOW_ORIGINS`] origins in arrival order, across all parents
//! and epochs feeding the partition. It is filled from the partition's tail when the partition
//! is opened (see [`OriginWindow::rebuild`]) and updated only after an append is durable, so
//! it never claims a record the log does not hold.

use std::collections::{HashSet, VecDeque};

use narad_storage::{AppendBatch, BatchOrigin, RecordOrigin};

/// Origins remembered per child partition: 16 full slabs (4,096 records each), enough for
/// every cursor feeding the partition to repeat its last slab, at about 40 bytes each
/// (~2.6 MiB per partition at the cap, reached only by partitions that see that much traffic).
pub(crate) const WINDOW_ORIGINS: usize = 16 * 4_096;

/// One record's origin, the unit of membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    /// The link's attach epoch.
    pub epoch: [u8; 8],
    /// The parent partition.
    pub parent_partition: u32,
    /// The record's offset in it.
    pub parent_offset: u64,
}

impl From<&RecordOrigin> for Origin {
    fn from(o: &RecordOrigin) -> Origin {
        Origin {
            epoch: o.epoch,
            parent_partition: o.parent_partition,
            parent_offset: o.parent_offset,
        }
    }
}

/// The recent origins of one child partition.
#[derive(Debug)]
pub(crate) struct OriginWindow {
    capacity: usize,
    held: HashSet<Origin>,
    arrival: VecDeque<Origin>,
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
            held: HashSet::new(),
            arrival: VecDeque::new(),
        }
    }

    /// A window filled from stored records, oldest first (the partition's tail on open).
    pub(crate) fn rebuild<'a>(
        capacity: usize,
        stored: impl IntoIterator<Item = &'a RecordOrigin>,
    ) -> OriginWindow {
        let mut window = OriginWindow::with_capacity(capacity);
        for origin in stored {
            window.remember(Origin::from(origin));
        }
        window
    }

    /// How many origins the window holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.arrival.len()
    }

    /// Whether `origin` is in the window.
    pub(crate) fn holds(&self, origin: &Origin) -> bool {
        self.held.contains(origin)
    }

    /// The highest parent offset of `parent_partition` under `epoch` the window holds: every
    /// offset a new record of that parent partition could be dropped for is at or below it.
    pub(crate) fn highest_offset(&self, epoch: [u8; 8], parent_partition: u32) -> Option<u64> {
        self.arrival
            .iter()
            .filter(|o| o.epoch == epoch && o.parent_partition == parent_partition)
            .map(|o| o.parent_offset)
            .max()
    }

    /// Which records of a child batch to keep: `false` for each one the window already holds.
    pub(crate) fn keep_mask(&self, origin: &BatchOrigin) -> Vec<bool> {
        origin
            .parent_offsets
            .iter()
            .map(|&parent_offset| {
                !self.holds(&Origin {
                    epoch: origin.epoch,
                    parent_partition: origin.parent_partition,
                    parent_offset,
                })
            })
            .collect()
    }

    /// Records the origins of a batch that is now durable in the partition.
    pub(crate) fn remember_batch(&mut self, origin: &BatchOrigin) {
        for &parent_offset in &origin.parent_offsets {
            self.remember(Origin {
                epoch: origin.epoch,
                parent_partition: origin.parent_partition,
                parent_offset,
            });
        }
    }

    fn remember(&mut self, origin: Origin) {
        if !self.held.insert(origin) {
            // Already held (a duplicate that got in before the window knew it): keep one entry.
            return;
        }
        self.arrival.push_back(origin);
        while self.arrival.len() > self.capacity {
            if let Some(oldest) = self.arrival.pop_front() {
                self.held.remove(&oldest);
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use narad_storage::NewRecord;
    use proptest::prelude::*;

    use super::*;

    fn batch(epoch: u8, parent_partition: u32, offsets: &[u64]) -> AppendBatch {
        AppendBatch {
            records: offsets
                .iter()
                .map(|o| NewRecord {
                    value: Bytes::from(o.to_string()),
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

    #[test]
    fn the_highest_offset_held_is_per_epoch_and_parent_partition_and_forgets_what_left() {
        let mut window = OriginWindow::with_capacity(4);
        window.remember_batch(batch(1, 0, &[5, 9, 7]).origin.as_ref().unwrap());
        window.remember_batch(batch(2, 0, &[40]).origin.as_ref().unwrap());
        assert_eq!(window.highest_offset([1; 8], 0), Some(9));
        assert_eq!(window.highest_offset([2; 8], 0), Some(40));
        assert_eq!(window.highest_offset([1; 8], 1), None);
        // 5 and 9 leave the window; 7 stays.
        window.remember_batch(batch(3, 0, &[1, 2]).origin.as_ref().unwrap());
        assert_eq!(window.highest_offset([1; 8], 0), Some(7));
    }

    /// Appends what the window lets through and returns what was appended.
    fn commit(window: &mut OriginWindow, b: AppendBatch) -> Vec<u64> {
        let keep = window.keep_mask(b.origin.as_ref().unwrap());
        let (kept, _) = without_held(b, &keep);
        match kept {
            Some(kept) => {
                window.remember_batch(kept.origin.as_ref().unwrap());
                kept.origin.unwrap().parent_offsets
            }
            None => Vec::new(),
        }
    }

    #[test]
    fn a_repeated_batch_is_absorbed_and_a_partial_repeat_keeps_only_the_new_records() {
        let mut window = OriginWindow::default();
        assert_eq!(
            commit(&mut window, batch(1, 0, &[10, 12, 14])),
            [10, 12, 14]
        );
        assert!(commit(&mut window, batch(1, 0, &[10, 12, 14])).is_empty());
        assert_eq!(commit(&mut window, batch(1, 0, &[14, 16])), [16]);
    }

    #[test]
    fn a_lower_offset_never_seen_is_kept_even_after_higher_ones_arrived() {
        let mut window = OriginWindow::default();
        commit(&mut window, batch(1, 0, &[100, 101, 102]));
        // A re-routed retry of an older bucket: below the highest offset, but never held.
        assert_eq!(commit(&mut window, batch(1, 0, &[50, 51])), [50, 51]);
    }

    #[test]
    fn the_same_offset_from_another_epoch_or_parent_partition_is_a_different_record() {
        let mut window = OriginWindow::default();
        commit(&mut window, batch(1, 0, &[7]));
        assert_eq!(commit(&mut window, batch(2, 0, &[7])), [7]);
        assert_eq!(commit(&mut window, batch(1, 3, &[7])), [7]);
    }

    #[test]
    fn a_window_rebuilt_from_the_stored_tail_absorbs_the_slab_a_crash_repeats() {
        let stored: Vec<RecordOrigin> = [5u64, 6, 7]
            .iter()
            .map(|&o| RecordOrigin {
                epoch: [9; 8],
                parent_partition: 2,
                parent_offset: o,
                slab_start: 5,
            })
            .collect();
        let mut window = OriginWindow::rebuild(WINDOW_ORIGINS, &stored);
        assert_eq!(commit(&mut window, batch(9, 2, &[5, 6, 7, 8])), [8]);
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
        /// Against a model that remembers everything: the window drops a record only if the
        /// model holds it (never a loss), and keeps every record the model does not hold.
        #[test]
        fn the_window_never_drops_a_record_it_was_not_sure_it_holds(
            batches in proptest::collection::vec(
                (0u8..2, 0u32..3, proptest::collection::vec(0u64..64, 1..12)),
                1..60,
            ),
            capacity in 1usize..40,
        ) {
            let mut window = OriginWindow::with_capacity(capacity);
            let mut appended: HashSet<(u8, u32, u64)> = HashSet::new();
            for (epoch, pp, offsets) in batches {
                let keep = window.keep_mask(batch(epoch, pp, &offsets).origin.as_ref().unwrap());
                for (o, kept) in offsets.iter().zip(&keep) {
                    if !kept {
                        prop_assert!(appended.contains(&(epoch, pp, *o)), "dropped {o}, never appended");
                    }
                }
                for o in commit(&mut window, batch(epoch, pp, &offsets)) {
                    appended.insert((epoch, pp, o));
                }
                prop_assert!(window.len() <= capacity);
            }
        }
    }
}
