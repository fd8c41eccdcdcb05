//! Finding where a cursor got to from what its child holds.
//!
//! Every batch a cursor commits carries its origin: the attach epoch, the parent partition, the
//! parent offset of each record, and the first parent offset of the first slab of the commit it
//! came in (a cursor commits up to [`crate::fanout::SLABS_PER_COMMIT`] consecutive slabs
//! together). The newest such batch in the child therefore names the newest commit that
//! reached the child, in whole or in part; every commit before it reached the child whole (a
//! cursor starts a commit only after the previous one is acknowledged by every child
//! partition). Within one commit a later slab's batch can land on one child partition while an
//! earlier slab's fails on another, which is why the batch names its commit's start and not
//! its own slab's. Restarting at that start repeats at most one commit and skips nothing.
//!
//! The copies also tell whether the parent still holds what was copied. A parent that lost its
//! tail (a torn tail cut after a crash, with no high-watermark file to refuse the cut) gives
//! the lost offsets to new records; if those are written before the cursor starts, the cursor's
//! position is no longer past the parent's end and only the content shows the reuse:
//! [`first_reused_offset`] compares the parent's records with the fingerprints of their copies.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use narad_storage::{PartitionId, ReadOptions, StorageError, Store, StoredRecord};

use crate::fanout::{SLAB_MAX_BYTES, SLAB_MAX_RECORDS};

/// What the child's tails say about one (epoch, parent partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChildEvidence {
    /// First parent offset of the newest slab found in the child.
    pub(crate) newest_slab_start: u64,
    /// Highest parent offset found in the child.
    pub highest_parent_offset: u64,
}

/// What a scan of the child's tails found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChildScan {
    /// The newest slab of this epoch and parent partition, if any is in the tails.
    pub evidence: Option<ChildEvidence>,
    /// The child has never held a record (every partition is empty from offset 0).
    pub empty: bool,
}

/// Fingerprints of the copies found in the child's tails, by parent offset. One offset can have
/// several copies: a slab repeated after a crash, or an offset the parent reused.
pub(crate) type TailCopies = BTreeMap<u64, Vec<u64>>;

/// Most parent offsets [`scan_child_tails_with_copies`] keeps fingerprints for (the highest
/// ones): one slab's worth, [`SLAB_MAX_RECORDS`], which bounds its memory whatever the child's
/// partition count.
pub(crate) const MAX_TAIL_COPIES: usize = SLAB_MAX_RECORDS;

/// A fingerprint of what a copy keeps of its original: key, headers and value. Compared only
/// within one process, so the standard hasher's fixed keys are enough.
pub(crate) fn fingerprint(record: &StoredRecord) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    record.key.as_deref().hash(&mut hasher);
    record.headers.len().hash(&mut hasher);
    for header in &record.headers {
        header.name.hash(&mut hasher);
        header.value.as_ref().hash(&mut hasher);
    }
    record.value.as_ref().hash(&mut hasher);
    hasher.finish()
}

/// Scans the tails of the child partitions `partitions` (the last slab's worth of records
/// each) for records copied from `parent_partition` under `epoch`, also giving the fingerprints
/// of the copies found, for the highest [`MAX_TAIL_COPIES`] parent offsets.
///
/// Blocking; reads the child logs.
pub(crate) fn scan_child_tails_with_copies(
    store: &Arc<Store>,
    child: &str,
    partitions: &[u32],
    epoch: [u8; 8],
    parent_partition: u32,
) -> Result<(ChildScan, TailCopies), StorageError> {
    let mut copies = TailCopies::new();
    let mut evidence: Option<ChildEvidence> = None;
    let mut empty = true;
    for &partition in partitions {
        let id = PartitionId::new(child, partition);
        let high = store.high_watermark(&id)?;
        let log_start = store.peek(&id)?.log_start_offset;
        empty &= high == 0;
        let window = SLAB_MAX_RECORDS as u64;
        let mut offset = high.saturating_sub(window).max(log_start);
        while offset < high {
            let read = store.read(
                &id,
                &ReadOptions {
                    offset,
                    max_records: SLAB_MAX_RECORDS,
                    max_bytes: SLAB_MAX_BYTES,
                    max_committed_at_ms: None,
                },
            )?;
            if read.records.is_empty() {
                break;
            }
            for record in &read.records {
                let Some(origin) = &record.origin else {
                    continue;
                };
                if origin.epoch != epoch || origin.parent_partition != parent_partition {
                    continue;
                }
                copies
                    .entry(origin.parent_offset)
                    .or_default()
                    .push(fingerprint(record));
                if copies.len() > MAX_TAIL_COPIES {
                    copies.pop_first();
                }
                let found = ChildEvidence {
                    newest_slab_start: origin.slab_start,
                    highest_parent_offset: origin.parent_offset,
                };
                evidence = Some(match evidence {
                    None => found,
                    Some(seen) => ChildEvidence {
                        newest_slab_start: seen.newest_slab_start.max(found.newest_slab_start),
                        highest_parent_offset: seen
                            .highest_parent_offset
                            .max(found.highest_parent_offset),
                    },
                });
            }
            offset = read.next_offset;
        }
    }
    Ok((ChildScan { evidence, empty }, copies))
}

/// Adds what a scan of other child partitions found (`other`, such as a remote owner's answer)
/// to `into`, as one scan of all of them would have: the newest evidence, "empty" only if
/// both are, and the copies of the highest [`MAX_TAIL_COPIES`] parent offsets.
pub(crate) fn merge(into: &mut (ChildScan, TailCopies), other: (ChildScan, TailCopies)) {
    let (scan, copies) = into;
    scan.empty &= other.0.empty;
    scan.evidence = match (scan.evidence, other.0.evidence) {
        (Some(a), Some(b)) => Some(ChildEvidence {
            newest_slab_start: a.newest_slab_start.max(b.newest_slab_start),
            highest_parent_offset: a.highest_parent_offset.max(b.highest_parent_offset),
        }),
        (a, b) => a.or(b),
    };
    for (offset, mut fingerprints) in other.1 {
        copies.entry(offset).or_default().append(&mut fingerprints);
    }
    while copies.len() > MAX_TAIL_COPIES {
        copies.pop_first();
    }
}

/// Whether the parent reused offsets below `next_offset` that the child holds copies of, and
/// the lowest such offset: the first parent record, among those with a copy in `copies`, that
/// matches none of its copies. Checks the last record before `next_offset` first (one read, the
/// common case); walks the copied range only when that one differs. `None` when it matches,
/// when the child holds no copy of it (nothing to compare), or when it left the parent's
/// retention.
///
/// Blocking; reads the parent log.
pub(crate) fn first_reused_offset(
    store: &Store,
    parent: &PartitionId,
    next_offset: u64,
    copies: &TailCopies,
) -> Result<Option<u64>, StorageError> {
    let Some(last) = next_offset.checked_sub(1) else {
        return Ok(None);
    };
    let differs = |record: &StoredRecord| {
        copies
            .get(&record.offset)
            .is_some_and(|seen| !seen.contains(&fingerprint(record)))
    };
    let read = |offset: u64, max_records: usize| {
        store.read(
            parent,
            &ReadOptions {
                offset,
                max_records,
                max_bytes: SLAB_MAX_BYTES,
                max_committed_at_ms: None,
            },
        )
    };
    if !copies.contains_key(&last) {
        return Ok(None);
    }
    let newest = match read(last, 1) {
        Ok(read) => read,
        Err(StorageError::OffsetBelowLogStart { .. } | StorageError::OffsetBeyondEnd { .. }) => {
            return Ok(None);
        }
        Err(other) => return Err(other),
    };
    match newest.records.first() {
        Some(record) if record.offset == last && differs(record) => {}
        _ => return Ok(None),
    }
    // The last copied record was replaced: find where the replacement began.
    let log_start = store.peek(parent)?.log_start_offset;
    let Some((&from, _)) = copies.range(log_start..next_offset).next() else {
        return Ok(Some(last));
    };
    let mut offset = from;
    while offset < next_offset {
        let batch = read(offset, SLAB_MAX_RECORDS)?;
        if batch.records.is_empty() {
            break;
        }
        if let Some(first) = batch
            .records
            .iter()
            .take_while(|r| r.offset < next_offset)
            .find(|r| differs(r))
        {
            return Ok(Some(first.offset));
        }
        offset = batch.next_offset;
    }
    Ok(Some(last))
}

/// Whether a cursor that resumed at `next_offset` is ahead of what its child holds, and where
/// to go back to:
/// - the child has records of this epoch and partition, but not the last record before
///   `next_offset`: back to the newest slab it has, if that is still in the parent
///   (`log_start`; going back to a slab that aged out would only count drop-behind twice);
/// - the child holds nothing at all (wiped): back to the cursor's start point `floor`, or the
///   parent's log start if that is later.
pub(crate) fn rewind_target(
    next_offset: u64,
    scan: ChildScan,
    log_start: u64,
    floor: Option<u64>,
) -> Option<u64> {
    let Some(evidence) = scan.evidence else {
        let target = floor?.max(log_start);
        return (scan.empty && target < next_offset).then_some(target);
    };
    let child_is_behind = evidence.highest_parent_offset.saturating_add(1) < next_offset;
    (child_is_behind
        && evidence.newest_slab_start >= log_start
        && evidence.newest_slab_start < next_offset)
        .then_some(evidence.newest_slab_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(slab_start: u64, highest: u64) -> ChildScan {
        ChildScan {
            evidence: Some(ChildEvidence {
                newest_slab_start: slab_start,
                highest_parent_offset: highest,
            }),
            empty: false,
        }
    }

    const NO_EVIDENCE: ChildScan = ChildScan {
        evidence: None,
        empty: false,
    };
    const WIPED: ChildScan = ChildScan {
        evidence: None,
        empty: true,
    };

    #[test]
    fn merged_scans_keep_the_newest_evidence_and_are_empty_only_if_both_are() {
        let mut ours = (
            ChildScan {
                evidence: Some(ChildEvidence {
                    newest_slab_start: 10,
                    highest_parent_offset: 14,
                }),
                empty: false,
            },
            TailCopies::from([(14, vec![1])]),
        );
        let theirs = (
            ChildScan {
                evidence: Some(ChildEvidence {
                    newest_slab_start: 20,
                    highest_parent_offset: 21,
                }),
                empty: false,
            },
            TailCopies::from([(14, vec![2]), (21, vec![3])]),
        );
        merge(&mut ours, theirs);
        assert_eq!(
            ours.0.evidence,
            Some(ChildEvidence {
                newest_slab_start: 20,
                highest_parent_offset: 21
            })
        );
        assert!(!ours.0.empty);
        assert_eq!(ours.1, TailCopies::from([(14, vec![1, 2]), (21, vec![3])]));
        // A remote partition that never held a record does not make a non-empty child empty,
        // and two empty ones stay empty.
        let mut empty = (
            ChildScan {
                evidence: None,
                empty: true,
            },
            TailCopies::new(),
        );
        merge(
            &mut empty,
            (
                ChildScan {
                    evidence: None,
                    empty: true,
                },
                TailCopies::new(),
            ),
        );
        assert!(empty.0.empty);
        merge(&mut empty, ours);
        assert!(!empty.0.empty);
    }

    #[test]
    fn a_child_holding_the_last_record_needs_no_rewind() {
        assert_eq!(rewind_target(100, evidence(90, 99), 0, Some(0)), None);
    }

    #[test]
    fn a_child_that_lost_records_rewinds_to_its_newest_slab() {
        assert_eq!(rewind_target(100, evidence(40, 55), 0, Some(0)), Some(40));
    }

    #[test]
    fn no_evidence_means_no_rewind() {
        assert_eq!(rewind_target(100, NO_EVIDENCE, 0, Some(0)), None);
    }

    #[test]
    fn a_wiped_child_rewinds_to_the_start_point_or_the_log_start() {
        assert_eq!(rewind_target(100, WIPED, 0, Some(10)), Some(10));
        assert_eq!(rewind_target(100, WIPED, 30, Some(10)), Some(30));
        // Nothing to rewind: at the start point already, or no start point known (live tail).
        assert_eq!(rewind_target(10, WIPED, 0, Some(10)), None);
        assert_eq!(rewind_target(100, WIPED, 0, None), None);
    }

    #[test]
    fn a_slab_that_aged_out_of_the_parent_is_not_gone_back_to() {
        // The cursor skipped to the log start by drop-behind; the child's newest slab is older.
        assert_eq!(
            rewind_target(5_000, evidence(900, 999), 5_000, Some(0)),
            None
        );
    }
}
