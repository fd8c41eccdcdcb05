//! Step 3 of a slab, bucket: the router's decisions become one batch per child partition.
//!
//! The grouping is [`narad_runtime::bucket()`], a stable counting sort: each bucket keeps slab
//! order, so records of one key (which share a partition) keep their order in the child. It is
//! also where a decision naming no child partition is found (the router's answer is a
//! [`RouteFailure`] then, and the slab is routed again later). Each bucket's batch carries its
//! origin (attach epoch, parent partition, parent offset of every record, slab start), which
//! is what lets a cursor find where it got to from what its child holds
//! ([`super::position::provenance`]).

use bytes::Bytes;
use narad_storage::{AppendBatch, BatchOrigin, Header, NewRecord, PartitionId, StoredRecord};

use super::route::{RouteFailure, RouteFailureKind};

/// Where a slab comes from, as every batch of it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabOrigin {
    /// The link's attach epoch.
    pub epoch: [u8; 8],
    /// The parent partition the slab was read from.
    pub parent_partition: u32,
    /// First parent offset of the slab (of the whole slab, also on a retry of part of it).
    pub slab_start: u64,
}

/// The records of a slab routed to one child partition, ready to commit.
#[derive(Clone, Debug)]
pub struct Bucket {
    /// The child partition.
    pub target: PartitionId,
    /// Indices of its records in the slab handed to [`bucket`], in slab order.
    pub indices: Vec<usize>,
    /// The batch to append: the records, in slab order, with their origin.
    pub batch: AppendBatch,
}

/// Groups `records` by `decisions` (one per record, already checked by
/// [`super::route::check_decisions`]) into the non-empty buckets of `child`'s
/// `child_partitions` partitions, in partition order. A decision at or past `child_partitions`
/// is a [`RouteFailureKind::OutOfRange`] routing failure naming the record's parent offset.
pub fn bucket(
    records: &[StoredRecord],
    decisions: &[u32],
    child: &str,
    child_partitions: u32,
    origin: SlabOrigin,
) -> Result<Vec<Bucket>, RouteFailure> {
    let buckets = narad_runtime::bucket(decisions, child_partitions).map_err(|refused| {
        let offset = records.get(refused.index).map_or(0, |r| r.offset);
        RouteFailure {
            plugin: None,
            kind: RouteFailureKind::OutOfRange,
            message: format!(
                "the router sent parent offset {offset} to partition {}, but the child has {child_partitions}",
                refused.value
            ),
        }
    })?;
    Ok(buckets
        .iter()
        .map(|(partition, indices)| {
            let indices: Vec<usize> = indices.iter().map(|&i| i as usize).collect();
            let batch = AppendBatch {
                records: indices
                    .iter()
                    .map(|&i| to_new_record(&records[i], false))
                    .collect(),
                origin: Some(BatchOrigin {
                    epoch: origin.epoch,
                    parent_partition: origin.parent_partition,
                    parent_offsets: indices.iter().map(|&i| records[i].offset).collect(),
                    slab_start: origin.slab_start,
                }),
            };
            Bucket {
                target: PartitionId::new(child, partition),
                indices,
                batch,
            }
        })
        .collect())
}

/// The record to append for a parent record. With `copy`, its bytes are copied off the
/// parent's read buffers (records held for a retry must not pin them through a long outage);
/// without, they are shared.
pub fn to_new_record(record: &StoredRecord, copy: bool) -> NewRecord {
    let own = |b: &Bytes| {
        if copy {
            Bytes::copy_from_slice(b)
        } else {
            b.clone()
        }
    };
    NewRecord {
        key: record.key.as_ref().map(own),
        headers: record
            .headers
            .iter()
            .map(|h| Header {
                name: h.name.clone(),
                value: own(&h.value),
            })
            .collect(),
        value: own(&record.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(offsets: std::ops::Range<u64>) -> Vec<StoredRecord> {
        offsets
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
        epoch: [7; 8],
        parent_partition: 3,
        slab_start: 100,
    };

    #[test]
    fn a_slab_is_bucketed_by_child_partition_in_slab_order_with_its_origin() {
        let slab = records(100..106);
        let buckets = bucket(&slab, &[2, 0, 2, 1, 0, 2], "child", 4, ORIGIN).unwrap();
        // Non-empty buckets only, in partition order; partition 3 got nothing.
        let targets: Vec<u32> = buckets.iter().map(|b| b.target.partition).collect();
        assert_eq!(targets, [0, 1, 2]);
        let two = &buckets[2];
        assert_eq!(two.target, PartitionId::new("child", 2));
        assert_eq!(two.indices, [0, 2, 5]);
        let values: Vec<&[u8]> = two.batch.records.iter().map(|r| r.value.as_ref()).collect();
        assert_eq!(values, [b"v100".as_slice(), b"v102", b"v105"]);
        let origin = two.batch.origin.as_ref().unwrap();
        assert_eq!(origin.parent_offsets, [100, 102, 105]);
        assert_eq!(
            (origin.epoch, origin.parent_partition, origin.slab_start),
            ([7; 8], 3, 100)
        );
    }

    #[test]
    fn a_decision_past_the_partition_count_is_an_out_of_range_failure() {
        let failure = bucket(&records(0..2), &[0, 4], "child", 4, ORIGIN).unwrap_err();
        assert_eq!(failure.kind, RouteFailureKind::OutOfRange);
        assert_eq!(failure.plugin, None);
        assert_eq!(
            failure.to_string(),
            "the router sent parent offset 1 to partition 4, but the child has 4"
        );
        assert!(bucket(&records(0..2), &[0, 3], "child", 4, ORIGIN).is_ok());
    }
}
