//! Step 3 of a slab, bucket: the router's decisions become one batch per child partition.
//!
//! The grouping is [`narad_runtime::bucket()`], a stable counting sort: each bucket keeps slab
//! order, so records of one key (which share a partition) keep their order in the child. It is
//! also where a decision naming no child partition is found (the router's answer is a
//! [`RouteFailure`] then, and the slab is routed again later). Each bucket's batch carries its
//! origin (attach epoch, parent partition, parent offset of every record, slab start), which
//! is what lets a cursor find where it got to from what its child holds
//! ([`super::position::provenance`]).

use std::sync::Arc;

use narad_storage::{BatchOrigin, EncodedBatch, PartitionId, StorageError, StoredRecord};

use super::route::{RouteFailure, RouteFailureKind};

/// Where a slab comes from, as every batch of it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlabOrigin {
    /// The link's attach epoch.
    pub epoch: [u8; 8],
    /// The parent partition the slab was read from.
    pub parent_partition: u32,
    /// Where a cursor that lost its offset file resumes: the first parent offset of the first
    /// slab of the commit this slab is part of (also on a retry of part of it).
    pub slab_start: u64,
}

/// The records of a slab routed to one child partition, ready to commit. It holds the slab
/// (shared, not copied) and the indices of its records: the child frame is encoded straight
/// from the parent records' bytes when the bucket is committed ([`Bucket::encode`]), with no
/// record rebuilt and no refcount touched per record.
#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    /// The child partition.
    pub target: PartitionId,
    /// Indices of its records in the slab handed to [`bucket`], in slab order.
    pub indices: Vec<usize>,
    /// The batch's origin: epoch, parent partition, slab start, and the parent offset of every
    /// record, in slab order.
    pub origin: BatchOrigin,
    slab: Arc<Vec<StoredRecord>>,
}

impl Bucket {
    /// The bucket's records, in slab order.
    pub(crate) fn records(&self) -> impl Iterator<Item = &StoredRecord> + '_ {
        self.indices.iter().filter_map(|&i| self.slab.get(i))
    }

    /// The child frame: the records encoded from their bytes, with the origin. Fails as an
    /// append of the same records would (a frame above the storage limit).
    pub(crate) fn encode(&self) -> Result<EncodedBatch, StorageError> {
        let records: Vec<&StoredRecord> = self.records().collect();
        EncodedBatch::encode(&records, Some(&self.origin))
    }
}

/// Groups `records` by `decisions` (one per record, already checked by
/// [`super::route::check_decisions`]) into the non-empty buckets of `child`'s
/// `child_partitions` partitions, in partition order. A decision at or past `child_partitions`
/// is a [`RouteFailureKind::OutOfRange`] routing failure naming the record's parent offset.
pub(crate) fn bucket(
    records: &Arc<Vec<StoredRecord>>,
    decisions: &[u32],
    child: &str,
    child_partitions: u32,
    origin: SlabOrigin,
) -> Result<Vec<Bucket>, RouteFailure> {
    let buckets = narad_runtime::bucket(decisions, child_partitions).map_err(|refused| {
        let offset = records.get(refused.index).map_or(0, |r| r.offset);
        RouteFailure {
            plugin: None,
            poison: None,
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
            Bucket {
                target: PartitionId::new(child, partition),
                origin: BatchOrigin {
                    epoch: origin.epoch,
                    parent_partition: origin.parent_partition,
                    parent_offsets: indices.iter().map(|&i| records[i].offset).collect(),
                    slab_start: origin.slab_start,
                },
                indices,
                slab: Arc::clone(records),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn records(offsets: std::ops::Range<u64>) -> Arc<Vec<StoredRecord>> {
        Arc::new(
            offsets
                .map(|offset| StoredRecord {
                    offset,
                    committed_at_ms: 0,
                    key: None,
                    headers: Vec::new(),
                    value: Some(Bytes::from(format!("v{offset}"))),
                    origin: None,
                })
                .collect(),
        )
    }

    const ORIGIN: SlabOrigin = SlabOrigin {
        epoch: [7; 8],
        parent_partition: 3,
        slab_start: 100,
    };

    #[test]
    fn a_bucket_sent_elsewhere_gives_the_records_and_origin_its_frame_decodes_to() {
        let mut slab: Vec<StoredRecord> = records(100..104).iter().cloned().collect();
        slab[1].key = Some(Bytes::from_static(b"k"));
        slab[1].headers = vec![narad_storage::Header {
            name: "h".into(),
            value: Bytes::from_static(b"1"),
        }];
        slab[2].value = None;
        slab[3].key = Some(Bytes::new());
        let slab = Arc::new(slab);
        for bucket in bucket(&slab, &[1, 1, 0, 1], "child", 2, ORIGIN).unwrap() {
            let frame = bucket.encode().unwrap();
            let decoded = frame.decode().unwrap();
            let batch = crate::fanout::committer::ChildBatch::from_bucket(frame, Arc::new(bucket));
            assert_eq!(batch.records().unwrap(), decoded);
        }
    }

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
        let values: Vec<&[u8]> = two.records().filter_map(|r| r.value.as_deref()).collect();
        assert_eq!(values, [b"v100".as_slice(), b"v102", b"v105"]);
        let origin = &two.origin;
        assert_eq!(origin.parent_offsets, [100, 102, 105]);
        assert_eq!(
            (origin.epoch, origin.parent_partition, origin.slab_start),
            ([7; 8], 3, 100)
        );
    }

    #[test]
    fn a_bucket_encodes_its_child_frame_from_the_parent_records_with_its_origin() {
        use narad_storage::log::format;
        let mut slab = (*records(100..104)).clone();
        slab[1].key = Some(Bytes::from_static(b"k1"));
        slab[1].headers = vec![narad_storage::Header {
            name: "h".into(),
            value: Bytes::from_static(b"x"),
        }];
        let slab = Arc::new(slab);
        let buckets = bucket(&slab, &[1, 0, 1, 0], "child", 2, ORIGIN).unwrap();
        let encoded = buckets[0].encode().unwrap();
        assert_eq!(encoded.record_count(), 2);
        let frame = Bytes::copy_from_slice(encoded.frame());
        let header = format::parse_header(&frame).unwrap();
        let got = format::decode_batch(&header, &frame).unwrap();
        for (d, want) in got.iter().zip([&slab[1], &slab[3]]) {
            assert_eq!(d.record.key, want.key);
            assert_eq!(d.record.headers, want.headers);
            assert_eq!(d.record.value, want.value);
            let origin = d.record.origin.as_ref().unwrap();
            assert_eq!(origin.parent_offset, want.offset);
            assert_eq!(
                (origin.epoch, origin.parent_partition, origin.slab_start),
                ([7; 8], 3, 100)
            );
        }
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
