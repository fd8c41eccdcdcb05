//! Batches stamped with an idempotent producer: the stamp is kept in the frame, found again by
//! `Store::producer_batches` after a restart, and read back like any other batch.

use std::sync::Arc;

use crate::common::*;
use narad_storage::{
    AppendBatch, EncodedBatch, ManualClock, NewRecord, ProducerStamp, StampedBatch,
};

fn stamp(producer_id: i64, base_sequence: i32) -> ProducerStamp {
    ProducerStamp {
        producer_id,
        epoch: 3,
        base_sequence,
    }
}

#[test]
fn stamped_batches_are_found_again_after_a_restart_oldest_first_and_read_as_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let id = pid("t", 0);
    {
        let store = real_store(dir.path(), Arc::clone(&clock));
        store.create_partition(&id, small_segments(4096)).unwrap();
        store.append(&id, batch(&["plain"])).unwrap();
        for (n, (producer, sequence)) in [(7, 0), (8, 0), (7, 2)].into_iter().enumerate() {
            let records = batch(&[&format!("a{n}"), &format!("b{n}")]).records;
            let mut encoded =
                EncodedBatch::encode_stamped(&records, stamp(producer, sequence)).unwrap();
            store.append_encoded(&id, &mut encoded).unwrap();
        }
        store.append(&id, batch(&["plain again"])).unwrap();
    }
    let store = real_store(dir.path(), clock);
    store.create_partition(&id, small_segments(4096)).unwrap();
    let found = store.producer_batches(&id, 1 << 20).unwrap();
    let brief: Vec<(i64, i32, u64, u32)> = found
        .iter()
        .map(|b: &StampedBatch| {
            (
                b.stamp.producer_id,
                b.stamp.base_sequence,
                b.base_offset,
                b.record_count,
            )
        })
        .collect();
    assert_eq!(brief, [(7, 0, 1, 2), (8, 0, 3, 2), (7, 2, 5, 2)]);
    assert!(found.iter().all(|b| b.stamp.epoch == 3));
    assert_eq!(
        values(&read_all(&store, &id, 0)),
        ["plain", "a0", "b0", "a1", "b1", "a2", "b2", "plain again"]
    );
    // A window of a few bytes still covers the last stamped frame's segment from a boundary.
    let recent = store.producer_batches(&id, 1).unwrap();
    assert_eq!(recent.last().map(|b| b.base_offset), Some(5));
}

#[test]
fn a_store_writing_the_original_layout_stores_null_values_empty_and_no_stamps() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, small_segments(4096)).unwrap();
    store.write_original_frames(true);
    let tombstone = NewRecord {
        key: Some(bytes::Bytes::from_static(b"k")),
        headers: Vec::new(),
        value: None,
    };
    let mut stamped =
        EncodedBatch::encode_stamped(std::slice::from_ref(&tombstone), stamp(7, 0)).unwrap();
    store.append_encoded(&id, &mut stamped).unwrap();
    store
        .append(
            &id,
            AppendBatch {
                records: vec![tombstone.clone()],
                origin: None,
            },
        )
        .unwrap();
    let read = read_all(&store, &id, 0);
    assert_eq!(read.len(), 2);
    assert!(read.iter().all(|r| r.value.as_deref() == Some(&b""[..])));
    assert!(store.producer_batches(&id, 1 << 20).unwrap().is_empty());

    // Back to the current layout: null stays null, the stamp is kept.
    store.write_original_frames(false);
    let mut stamped =
        EncodedBatch::encode_stamped(std::slice::from_ref(&tombstone), stamp(7, 1)).unwrap();
    store.append_encoded(&id, &mut stamped).unwrap();
    assert_eq!(read_all(&store, &id, 2)[0].value, None);
    assert_eq!(store.producer_batches(&id, 1 << 20).unwrap().len(), 1);
}
