//! Finding records by time: the first offset committed at or after a moment, by binary search
//! over commit times (a partition's commit times never decrease, so its offsets are sorted by
//! them too). What Kafka's ListOffsets by timestamp and an operator's reset of a consumer
//! group to a moment both ask.

use crate::{PartitionId, ReadOptions, Result, StorageError, Store};

/// The commit time (Unix ms) of the record at `offset` of `id`, `None` when retention removed
/// it.
pub fn committed_at(store: &Store, id: &PartitionId, offset: u64) -> Result<Option<i64>> {
    let options = ReadOptions {
        offset,
        max_records: 1,
        max_bytes: 1,
        max_committed_at_ms: None,
    };
    match store.read(id, &options) {
        Ok(read) => Ok(read.records.first().map(|r| r.committed_at_ms)),
        Err(StorageError::OffsetBelowLogStart { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The first offset of `id` whose record was committed at or after `at_ms`, with that commit
/// time; `None` when every stored record is older. Records retention removes during the
/// search are passed over.
pub fn first_at_or_after(
    store: &Store,
    id: &PartitionId,
    at_ms: i64,
) -> Result<Option<(u64, i64)>> {
    let high = store.high_watermark(id)?;
    let start = store.peek(id)?.log_start_offset;
    let (mut lo, mut hi) = (start, high);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match committed_at(store, id, mid)? {
            Some(at) if at >= at_ms => hi = mid,
            // Older, or removed by retention meanwhile: search above it.
            _ => lo = mid + 1,
        }
    }
    if lo >= high {
        return Ok(None);
    }
    Ok(committed_at(store, id, lo)?.map(|at| (lo, at)))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{AppendBatch, LogConfig, ManualClock, NewRecord, StoreOptions};

    #[test]
    fn the_first_record_committed_at_or_after_a_moment_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let clock = std::sync::Arc::new(ManualClock::new(1_000));
        let store = Store::open(
            dir.path(),
            StoreOptions {
                clock: clock.clone(),
                ..StoreOptions::default()
            },
        )
        .unwrap();
        let id = PartitionId::new("t", 0);
        store.create_partition(&id, LogConfig::default()).unwrap();
        for at in [1_000, 2_000, 2_000, 3_000] {
            clock.set(at);
            let record = NewRecord {
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: Vec::new(),
            };
            store
                .append(
                    &id,
                    AppendBatch {
                        records: vec![record],
                        origin: None,
                    },
                )
                .unwrap();
        }
        assert_eq!(first_at_or_after(&store, &id, 0).unwrap(), Some((0, 1_000)));
        assert_eq!(
            first_at_or_after(&store, &id, 1_500).unwrap(),
            Some((1, 2_000))
        );
        assert_eq!(
            first_at_or_after(&store, &id, 2_000).unwrap(),
            Some((1, 2_000))
        );
        assert_eq!(
            first_at_or_after(&store, &id, 3_000).unwrap(),
            Some((3, 3_000))
        );
        assert_eq!(first_at_or_after(&store, &id, 3_001).unwrap(), None);
        assert_eq!(committed_at(&store, &id, 2).unwrap(), Some(2_000));
    }
}
