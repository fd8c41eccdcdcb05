//! Finding where a cursor got to from what its child holds.
//!
//! Every batch a cursor commits carries its origin: the attach epoch, the parent partition, the
//! parent offset of each record, and the first parent offset of the slab it came from. The
//! newest such batch in the child therefore names the newest slab that reached the child, in
//! whole or in part; every slab before it reached the child whole (a cursor reads a slab only
//! after the previous one is committed). Restarting at that slab's start repeats at most one
//! slab and skips nothing.

use std::sync::Arc;

use narad_storage::{PartitionId, ReadOptions, StorageError, Store};

use super::{SLAB_MAX_BYTES, SLAB_MAX_RECORDS};

/// What the child's tails say about one (epoch, parent partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildEvidence {
    /// First parent offset of the newest slab found in the child.
    pub newest_slab_start: u64,
    /// Highest parent offset found in the child.
    pub highest_parent_offset: u64,
}

/// What a scan of the child's tails found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildScan {
    /// The newest slab of this epoch and parent partition, if any is in the tails.
    pub evidence: Option<ChildEvidence>,
    /// The child has never held a record (every partition is empty from offset 0).
    pub empty: bool,
}

/// Scans the tail of every child partition (the last slab's worth of records each) for
/// records copied from `parent_partition` under `epoch`.
///
/// Blocking; reads the child logs.
pub fn scan_child_tails(
    store: &Arc<Store>,
    child: &str,
    child_partitions: u32,
    epoch: [u8; 8],
    parent_partition: u32,
) -> Result<ChildScan, StorageError> {
    let mut evidence: Option<ChildEvidence> = None;
    let mut empty = true;
    for partition in 0..child_partitions {
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
    Ok(ChildScan { evidence, empty })
}

/// Whether a cursor that resumed at `next_offset` is ahead of what its child holds, and where
/// to go back to:
/// - the child has records of this epoch and partition, but not the last record before
///   `next_offset`: back to the newest slab it has, if that is still in the parent
///   (`log_start`; going back to a slab that aged out would only count drop-behind twice);
/// - the child holds nothing at all (wiped): back to the cursor's start point `floor`, or the
///   parent's log start if that is later.
pub fn rewind_target(
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
