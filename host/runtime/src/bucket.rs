//! Turning a chain's decisions into per-partition buckets.
//!
//! A stable counting sort: one pass counts records per partition, a prefix sum gives each
//! partition its start, a second pass places record indices. Each bucket keeps slab order, so
//! records of one key (which share a partition) keep their order in the child.

/// Record indices of a slab grouped by child partition, each group in slab order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets {
    /// `starts[p]..starts[p + 1]` is partition `p`'s range in `indices`; `partition_count + 1`
    /// entries.
    starts: Vec<u32>,
    /// Record indices, grouped by partition.
    indices: Vec<u32>,
}

impl Buckets {
    /// The number of partitions (buckets, some possibly empty).
    pub fn partition_count(&self) -> u32 {
        (self.starts.len() - 1) as u32
    }

    /// Record indices (into the slab) routed to `partition`, in slab order; empty if none or
    /// if `partition` is out of range.
    pub fn partition(&self, partition: u32) -> &[u32] {
        let p = partition as usize;
        if p + 1 >= self.starts.len() {
            return &[];
        }
        &self.indices[self.starts[p] as usize..self.starts[p + 1] as usize]
    }

    /// Non-empty buckets as `(partition, record indices)`, in partition order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u32])> + '_ {
        (0..self.partition_count())
            .map(|p| (p, self.partition(p)))
            .filter(|(_, records)| !records.is_empty())
    }

    /// How many records each partition received (`partition_count` entries).
    pub fn counts(&self) -> Vec<u64> {
        self.starts
            .windows(2)
            .map(|w| u64::from(w[1] - w[0]))
            .collect()
    }
}

/// A decision that names no partition below the count (the chain checks this before, so this
/// means the caller skipped the chain's check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("record {index} is routed to partition {value}, but there are {partition_count}")]
#[non_exhaustive]
pub struct BucketError {
    /// Index of the record in the slab.
    pub index: usize,
    /// Its decision.
    pub value: u32,
    /// The partition count.
    pub partition_count: u32,
}

/// Groups record indices by `decisions[i]` (a child partition below `partition_count`),
/// keeping slab order within each partition.
pub fn bucket(decisions: &[u32], partition_count: u32) -> Result<Buckets, BucketError> {
    let mut starts = vec![0u32; partition_count as usize + 1];
    for (index, &value) in decisions.iter().enumerate() {
        if value >= partition_count {
            return Err(BucketError {
                index,
                value,
                partition_count,
            });
        }
        starts[value as usize + 1] += 1;
    }
    for p in 1..starts.len() {
        starts[p] += starts[p - 1];
    }
    let mut next = starts.clone();
    let mut indices = vec![0u32; decisions.len()];
    for (index, &value) in decisions.iter().enumerate() {
        let slot = &mut next[value as usize];
        indices[*slot as usize] = index as u32;
        *slot += 1;
    }
    Ok(Buckets { starts, indices })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_keep_slab_order_per_partition() {
        let buckets = bucket(&[2, 0, 2, 1, 0, 2], 4).unwrap();
        assert_eq!(buckets.partition(0), &[1, 4]);
        assert_eq!(buckets.partition(1), &[3]);
        assert_eq!(buckets.partition(2), &[0, 2, 5]);
        assert_eq!(buckets.partition(3), &[] as &[u32]);
        assert_eq!(buckets.counts(), vec![2, 1, 3, 0]);
        assert_eq!(
            buckets.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn out_of_range_decision_is_refused() {
        let err = bucket(&[0, 3], 3).unwrap_err();
        assert_eq!(err.index, 1);
        assert_eq!(err.value, 3);
    }

    #[test]
    fn empty_slab_gives_empty_buckets() {
        let buckets = bucket(&[], 3).unwrap();
        assert_eq!(buckets.counts(), vec![0, 0, 0]);
        assert_eq!(buckets.iter().count(), 0);
    }

    proptest! {
        #[test]
        fn every_record_lands_once_in_its_partition_in_slab_order(
            (count, decisions) in (1u32..64).prop_flat_map(|n| {
                (Just(n), proptest::collection::vec(0..n, 0..512))
            })
        ) {
            let buckets = bucket(&decisions, count).unwrap();
            let mut seen = vec![false; decisions.len()];
            let mut total = 0usize;
            for p in 0..count {
                let records = buckets.partition(p);
                // Stability: strictly increasing indices.
                prop_assert!(records.windows(2).all(|w| w[0] < w[1]));
                for &i in records {
                    prop_assert_eq!(decisions[i as usize], p);
                    prop_assert!(!seen[i as usize]);
                    seen[i as usize] = true;
                }
                total += records.len();
            }
            // Completeness.
            prop_assert_eq!(total, decisions.len());
            prop_assert!(seen.iter().all(|&s| s));
        }
    }
}
