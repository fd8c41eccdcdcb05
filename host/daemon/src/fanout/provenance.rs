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

/// Scans the tail of every child partition (the last slab's worth of records each) for
/// records copied from `parent_partition` under `epoch`. `None` when none is found.
///
/// Blocking; reads the child logs.
pub fn scan_child_tails(
    store: &Arc<Store>,
    child: &str,
    child_partitions: u32,
    epoch: [u8; 8],
    parent_partition: u32,
) -> Result<Option<ChildEvidence>, StorageError> {
    let mut evidence: Option<ChildEvidence> = None;
    for partition in 0..child_partitions {
        let id = PartitionId::new(child, partition);
        let stats = store.peek(&id)?;
        let high = match stats.high_watermark {
            Some(high) => high,
            // A closed log after a crash: read from its start offset to learn the watermark.
            None => {
                store
                    .read(
                        &id,
                        &ReadOptions {
                            offset: stats.log_start_offset,
                            max_records: 1,
                            max_bytes: 1,
                            max_committed_at_ms: None,
                        },
                    )?
                    .high_watermark
            }
        };
        let window = SLAB_MAX_RECORDS as u64;
        let mut offset = high.saturating_sub(window).max(stats.log_start_offset);
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
    Ok(evidence)
}

/// Whether a cursor that resumed at `next_offset` is ahead of what its child holds: the child
/// has records of this epoch and partition, but not the last record before `next_offset`, and
/// the slab to go back to is still in the parent (`log_start`); going back to a slab that aged
/// out would only count drop-behind twice.
pub fn rewind_target(
    next_offset: u64,
    evidence: Option<ChildEvidence>,
    log_start: u64,
) -> Option<u64> {
    let evidence = evidence?;
    let child_is_behind = evidence.highest_parent_offset.saturating_add(1) < next_offset;
    (child_is_behind
        && evidence.newest_slab_start >= log_start
        && evidence.newest_slab_start < next_offset)
        .then_some(evidence.newest_slab_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(slab_start: u64, highest: u64) -> Option<ChildEvidence> {
        Some(ChildEvidence {
            newest_slab_start: slab_start,
            highest_parent_offset: highest,
        })
    }

    #[test]
    fn a_child_holding_the_last_record_needs_no_rewind() {
        assert_eq!(rewind_target(100, evidence(90, 99), 0), None);
    }

    #[test]
    fn a_child_that_lost_records_rewinds_to_its_newest_slab() {
        assert_eq!(rewind_target(100, evidence(40, 55), 0), Some(40));
    }

    #[test]
    fn no_evidence_means_no_rewind() {
        assert_eq!(rewind_target(100, None, 0), None);
    }

    #[test]
    fn a_slab_that_aged_out_of_the_parent_is_not_gone_back_to() {
        // The cursor skipped to the log start by drop-behind; the child's newest slab is older.
        assert_eq!(rewind_target(5_000, evidence(900, 999), 5_000), None);
    }
}
