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
//!
//! **Same origin, other content.** Each origin is held with a [`Fingerprint`] of the record's
//! content. A record whose origin is held with another fingerprint is not a repeat: its parent
//! partition gave the offset to a new record (its log was lost and started again, or an old
//! copy was restored). It is kept, counted as reused, and its fingerprint replaces the old one.
//! Dropping it, as a window of origins alone would, loses an acknowledged record without a
//! trace.

use std::collections::{HashMap, VecDeque};

use narad_storage::{AppendBatch, BatchOrigin, Header, NewRecord, RecordOrigin, StoredRecord};

/// Origins remembered per child partition: 16 full slabs (4,096 records each), enough for
/// every cursor feeding the partition to repeat its last slab, at about 56 bytes each (origin,
/// fingerprint and table overhead): ~3.7 MiB per partition at the cap, reached only by
/// partitions that see that much traffic.
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

/// What a record held under an origin looked like: equal for a repeat of the record, and
/// different, but for a rare collision, for another record given the same origin. Computed
/// from the start of the key, the header names, the start of each header value and both ends
/// of the value, with every length, so its cost does not grow with the record (see
/// [`fingerprint`]).
pub(crate) type Fingerprint = u64;

/// Bytes taken from each end of a value, and from the start of a key or a header value.
const SAMPLED_BYTES: usize = 32;

/// The [`Fingerprint`] of a record's content. Not a checksum and never stored: it is computed
/// by the process that compares it, from at most a few hundred bytes per record, so it costs a
/// few nanoseconds whatever the record's size.
pub(crate) fn fingerprint(key: Option<&[u8]>, headers: &[Header], value: &[u8]) -> Fingerprint {
    let mut h = match key {
        // Absent and empty keys differ.
        None => mix(0, 0),
        Some(k) => absorb(mix(0, 1 + k.len() as u64), head(k)),
    };
    for header in headers {
        h = absorb(mix(h, header.name.len() as u64), header.name.as_bytes());
        h = absorb(mix(h, header.value.len() as u64), head(&header.value));
    }
    // Two chains with no data dependence between them, so the processor runs them side by
    // side: this is most of the work, and it halves its latency.
    let head_chain = absorb(mix(h, value.len() as u64), head(value));
    let tail_chain = absorb(
        mix(headers.len() as u64, 0x7A11),
        &value[value.len().saturating_sub(SAMPLED_BYTES)..],
    );
    mix(head_chain, tail_chain)
}

/// One step of the fingerprint: a bijection of `h` for a given word, so two inputs that
/// differ in one word always give different results.
fn mix(h: u64, word: u64) -> u64 {
    (h ^ word)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(29)
}

/// `bytes` folded into `h`, eight at a time (the last word padded and tagged with its length).
fn absorb(mut h: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        h = mix(h, u64::from_le_bytes(w));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = mix(h, u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
    }
    h
}

/// The first [`SAMPLED_BYTES`] of `bytes`.
fn head(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len().min(SAMPLED_BYTES)]
}

/// [`fingerprint`] of a record about to be appended.
pub(crate) fn new_record_fingerprint(r: &NewRecord) -> Fingerprint {
    fingerprint(r.key.as_deref(), &r.headers, &r.value)
}

/// [`fingerprint`] of a stored record.
pub(crate) fn stored_fingerprint(r: &StoredRecord) -> Fingerprint {
    fingerprint(r.key.as_deref(), &r.headers, &r.value)
}

/// What [`OriginWindow::keep_mask`] found in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sorted {
    /// Per record, whether to append it (`false`: a repeat of a record held).
    pub keep: Vec<bool>,
    /// Records kept although their origin is held, because their content differs: their
    /// parent partition reused the offsets.
    pub reused: usize,
}

/// The recent origins of one child partition, with what the record held under each looked
/// like.
#[derive(Debug)]
pub(crate) struct OriginWindow {
    capacity: usize,
    held: HashMap<Origin, Fingerprint>,
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
            held: HashMap::new(),
            arrival: VecDeque::new(),
        }
    }

    /// A window filled from stored records, oldest first (the partition's tail on open): each
    /// origin with the fingerprint of the record stored under it.
    pub(crate) fn rebuild<'a>(
        capacity: usize,
        stored: impl IntoIterator<Item = (&'a RecordOrigin, Fingerprint)>,
    ) -> OriginWindow {
        let mut window = OriginWindow::with_capacity(capacity);
        for (origin, print) in stored {
            window.remember(Origin::from(origin), print);
        }
        window
    }

    /// How many origins the window holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.arrival.len()
    }

    /// The fingerprint of the record held under `origin`, if the window holds it.
    fn held(&self, origin: &Origin) -> Option<Fingerprint> {
        self.held.get(origin).copied()
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

    /// Which records of a child batch to keep (`prints`: their fingerprints, in record order):
    /// not those the window holds with the same fingerprint.
    pub(crate) fn keep_mask(&self, origin: &BatchOrigin, prints: &[Fingerprint]) -> Sorted {
        let mut reused = 0;
        let keep = origin
            .parent_offsets
            .iter()
            .zip(prints)
            .map(|(&parent_offset, print)| {
                let held = self.held(&Origin {
                    epoch: origin.epoch,
                    parent_partition: origin.parent_partition,
                    parent_offset,
                });
                match held {
                    None => true,
                    Some(h) if h == *print => false,
                    Some(_) => {
                        reused += 1;
                        true
                    }
                }
            })
            .collect();
        Sorted { keep, reused }
    }

    /// Records the origins of a batch that is now durable in the partition, with the
    /// fingerprints of its records (in record order).
    pub(crate) fn remember_batch(&mut self, origin: &BatchOrigin, prints: &[Fingerprint]) {
        for (&parent_offset, &print) in origin.parent_offsets.iter().zip(prints) {
            self.remember(
                Origin {
                    epoch: origin.epoch,
                    parent_partition: origin.parent_partition,
                    parent_offset,
                },
                print,
            );
        }
    }

    fn remember(&mut self, origin: Origin, print: Fingerprint) {
        if self.held.insert(origin, print).is_some() {
            // Already held (a duplicate that got in before the window knew it, or a reused
            // offset): one entry, with the newest record's fingerprint.
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
    use std::collections::HashSet;

    use bytes::Bytes;
    use narad_storage::NewRecord;
    use proptest::prelude::*;

    use super::*;

    /// A batch whose record at parent offset `o` has the value `o` (or `tag` then `o`).
    fn tagged(epoch: u8, parent_partition: u32, offsets: &[u64], tag: &str) -> AppendBatch {
        AppendBatch {
            records: offsets
                .iter()
                .map(|o| NewRecord {
                    value: Bytes::from(format!("{tag}{o}")),
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

    fn prints(b: &AppendBatch) -> Vec<Fingerprint> {
        b.records.iter().map(new_record_fingerprint).collect()
    }

    fn remember(window: &mut OriginWindow, b: &AppendBatch) {
        window.remember_batch(b.origin.as_ref().unwrap(), &prints(b));
    }

    #[test]
    fn the_highest_offset_held_is_per_epoch_and_parent_partition_and_forgets_what_left() {
        let mut window = OriginWindow::with_capacity(4);
        remember(&mut window, &batch(1, 0, &[5, 9, 7]));
        remember(&mut window, &batch(2, 0, &[40]));
        assert_eq!(window.highest_offset([1; 8], 0), Some(9));
        assert_eq!(window.highest_offset([2; 8], 0), Some(40));
        assert_eq!(window.highest_offset([1; 8], 1), None);
        // 5 and 9 leave the window; 7 stays.
        remember(&mut window, &batch(3, 0, &[1, 2]));
        assert_eq!(window.highest_offset([1; 8], 0), Some(7));
    }

    /// Appends what the window lets through; returns what was appended and how many were
    /// kept as reused.
    fn commit_counting(window: &mut OriginWindow, b: AppendBatch) -> (Vec<u64>, usize) {
        let sorted = window.keep_mask(b.origin.as_ref().unwrap(), &prints(&b));
        let (kept, _) = without_held(b, &sorted.keep);
        match kept {
            Some(kept) => {
                remember(window, &kept);
                (kept.origin.unwrap().parent_offsets, sorted.reused)
            }
            None => (Vec::new(), sorted.reused),
        }
    }

    fn commit(window: &mut OriginWindow, b: AppendBatch) -> Vec<u64> {
        commit_counting(window, b).0
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
    fn a_record_with_a_held_origin_but_other_content_is_kept_as_reused_not_dropped() {
        let mut window = OriginWindow::default();
        commit(&mut window, batch(1, 0, &[0, 1, 2]));
        // The parent lost its log and wrote new records at 0 and 1; 2 is the old record.
        let (appended, reused) = commit_counting(&mut window, tagged(1, 0, &[0, 1], "new-"));
        assert_eq!((appended, reused), (vec![0, 1], 2));
        assert_eq!(commit_counting(&mut window, batch(1, 0, &[2])), (vec![], 0));
        // The window now holds the new records: their repeat is absorbed.
        assert_eq!(
            commit_counting(&mut window, tagged(1, 0, &[0, 1], "new-")),
            (vec![], 0)
        );
    }

    #[test]
    fn fingerprints_tell_keys_headers_lengths_and_both_ends_of_the_value_apart() {
        let value = vec![b'x'; 1_000];
        let base = fingerprint(Some(b"k"), &[], &value);
        assert_eq!(base, fingerprint(Some(b"k"), &[], &value.clone()));
        let mut last = value.clone();
        last[999] = b'y';
        let mut first = value.clone();
        first[0] = b'y';
        let header = Header {
            name: "h".to_owned(),
            value: Bytes::from_static(b"v"),
        };
        for other in [
            fingerprint(None, &[], &value),
            fingerprint(Some(b""), &[], &value),
            fingerprint(Some(b"j"), &[], &value),
            fingerprint(Some(b"k"), &[header], &value),
            fingerprint(Some(b"k"), &[], &value[..999]),
            fingerprint(Some(b"k"), &[], &first),
            fingerprint(Some(b"k"), &[], &last),
        ] {
            assert_ne!(other, base);
        }
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
        let stored: Vec<StoredRecord> = [5u64, 6, 7]
            .iter()
            .map(|&o| StoredRecord {
                offset: o - 5,
                committed_at_ms: 0,
                key: None,
                headers: Vec::new(),
                value: Bytes::from(o.to_string()),
                origin: Some(RecordOrigin {
                    epoch: [9; 8],
                    parent_partition: 2,
                    parent_offset: o,
                    slab_start: 5,
                }),
            })
            .collect();
        let mut window = OriginWindow::rebuild(
            WINDOW_ORIGINS,
            stored
                .iter()
                .filter_map(|r| r.origin.as_ref().map(|o| (o, stored_fingerprint(r)))),
        );
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
        /// model holds that very record under its origin (never a loss), and keeps every
        /// record the model does not hold.
        #[test]
        fn the_window_never_drops_a_record_it_was_not_sure_it_holds(
            batches in proptest::collection::vec(
                (0u8..2, 0u32..3, proptest::collection::vec(0u64..64, 1..12), 0u8..2),
                1..60,
            ),
            capacity in 1usize..40,
        ) {
            let mut window = OriginWindow::with_capacity(capacity);
            let mut appended: HashSet<(u8, u32, u64, u8)> = HashSet::new();
            for (epoch, pp, offsets, version) in batches {
                let tag = format!("v{version}-");
                let b = tagged(epoch, pp, &offsets, &tag);
                let sorted = window.keep_mask(b.origin.as_ref().unwrap(), &prints(&b));
                for (o, kept) in offsets.iter().zip(&sorted.keep) {
                    if !kept {
                        prop_assert!(
                            appended.contains(&(epoch, pp, *o, version)),
                            "dropped {o} (version {version}), never appended"
                        );
                    }
                }
                for o in commit(&mut window, tagged(epoch, pp, &offsets, &tag)) {
                    appended.insert((epoch, pp, o, version));
                }
                prop_assert!(window.len() <= capacity);
            }
        }
    }
}
