//! Retention by age and by size, the log start offset, and reads below it.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use crate::common::*;
use narad_storage::{LogConfig, ManualClock, StorageError};

const HOUR_MS: i64 = 3_600_000;

fn config(retention_ms: Option<u64>, retention_bytes: Option<u64>) -> LogConfig {
    LogConfig {
        // Each test batch is well over 100 bytes, so every append starts a new segment.
        segment_bytes: 100,
        retention_ms,
        retention_bytes,
    }
}

#[test]
fn segments_older_than_the_retention_age_are_deleted_and_the_log_start_moves() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store
        .create_partition(&id, config(Some(2 * HOUR_MS as u64), None))
        .unwrap();
    let payload = "p".repeat(120);
    for _ in 0..5 {
        store.append(&id, batch(&[&payload])).unwrap();
        clock.advance(HOUR_MS);
    }
    // Segments hold offsets 0..5, committed at T0, T0+1h, ..., T0+4h; now is T0+5h.
    assert_eq!(store.peek(&id).unwrap().segment_count, 5);
    let report = store.enforce_retention().unwrap();
    // Older than 2h: committed at T0, T0+1h, T0+2h (ages 5h, 4h, 3h).
    assert_eq!(report.segments_deleted, 3);
    assert_eq!(report.advanced, vec![(id.clone(), 3)]);
    let s = store.peek(&id).unwrap();
    assert_eq!(
        (s.log_start_offset, s.high_watermark, s.segment_count),
        (3, Some(5), 2)
    );

    match store.read(&id, &read_from(1)) {
        Err(StorageError::OffsetBelowLogStart {
            requested: 1,
            log_start: 3,
            ..
        }) => {}
        other => panic!("expected OffsetBelowLogStart, got {other:?}"),
    }
    let r = store.read(&id, &read_from(3)).unwrap();
    assert_eq!(r.log_start_offset, 3);
    assert_eq!(r.records[0].offset, 3);

    // Nothing else is old enough yet; the active segment is never deleted, however old.
    assert_eq!(store.enforce_retention().unwrap().segments_deleted, 0);
    clock.advance(100 * HOUR_MS);
    assert_eq!(store.enforce_retention().unwrap().segments_deleted, 1);
    let s = store.peek(&id).unwrap();
    assert_eq!((s.log_start_offset, s.segment_count), (4, 1));
    assert_eq!(store.append(&id, batch(&["after"])).unwrap().base_offset, 5);
}

#[test]
fn the_oldest_segments_are_deleted_while_the_partition_is_over_its_size_cap() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store.create_partition(&id, config(None, None)).unwrap();
    let payload = "p".repeat(120);
    for _ in 0..6 {
        store.append(&id, batch(&[&payload])).unwrap();
    }
    let before = store.peek(&id).unwrap();
    let seg = before.size_bytes / 6;
    assert_eq!(before.size_bytes, seg * 6, "equal-sized segments");
    // Allow two and a half segments: the oldest go until at most that much remains.
    store
        .set_config(&id, config(None, Some(seg * 5 / 2)))
        .unwrap();
    let report = store.enforce_retention().unwrap();
    assert_eq!(report.segments_deleted, 4);
    assert_eq!(report.bytes_deleted, seg * 4);
    let s = store.peek(&id).unwrap();
    assert_eq!((s.log_start_offset, s.segment_count), (4, 2));
    assert!(matches!(
        store.read(&id, &read_from(0)),
        Err(StorageError::OffsetBelowLogStart { log_start: 4, .. })
    ));
    assert_eq!(read_all(&store, &id, 4).len(), 2);
}

#[test]
fn retention_trims_a_closed_log_without_opening_it_and_reopening_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store
        .create_partition(&id, config(Some(HOUR_MS as u64), None))
        .unwrap();
    let payload = "p".repeat(120);
    for _ in 0..4 {
        store.append(&id, batch(&[&payload])).unwrap();
        clock.advance(HOUR_MS);
    }
    clock.advance(2 * HOUR_MS);
    assert_eq!(store.close_idle(), 1);
    let report = store.enforce_retention().unwrap();
    assert_eq!(report.segments_deleted, 3);
    let s = store.peek(&id).unwrap();
    assert_eq!(
        s.state,
        narad_storage::PartitionState::Closed,
        "still closed"
    );
    assert_eq!((s.log_start_offset, s.high_watermark), (3, Some(4)));
    let r = store.read(&id, &read_from(3)).unwrap();
    assert_eq!(
        (r.log_start_offset, r.high_watermark, r.records.len()),
        (3, 4, 1)
    );
}
