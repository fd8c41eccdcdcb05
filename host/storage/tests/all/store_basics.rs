//! Appends, reads, limits, the delay gate, peek, idle close, the lock file, names, deletion.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use crate::common::*;
use bytes::Bytes;
use narad_storage::{
    AppendBatch, BatchOrigin, LogConfig, ManualClock, NewRecord, PartitionState, ReadOptions,
    RecordOrigin, StorageError, Store,
};

#[test]
fn appended_records_read_back_with_offsets_keys_headers_and_commit_times() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("orders", 3);
    store.create_partition(&id, LogConfig::default()).unwrap();

    let a = store.append(&id, batch(&["a", "b"])).unwrap();
    assert_eq!((a.base_offset, a.count, a.committed_at_ms), (0, 2, T0_MS));
    clock.advance(5);
    let mut b = batch(&["c"]);
    b.records[0].key = None;
    b.records.push(NewRecord {
        key: Some(Bytes::new()),
        headers: vec![],
        value: Some(Bytes::new()),
    });
    let a2 = store.append(&id, b).unwrap();
    assert_eq!((a2.base_offset, a2.count), (2, 2));

    let r = store.read(&id, &read_from(0)).unwrap();
    assert_eq!(r.high_watermark, 4);
    assert_eq!(r.next_offset, 4);
    assert_eq!(r.log_start_offset, 0);
    assert_eq!(r.not_due, None);
    let offsets: Vec<u64> = r.records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [0, 1, 2, 3]);
    assert_eq!(values(&r.records), ["a", "b", "c", ""]);
    assert_eq!(r.records[0].key.as_deref(), Some(&b"k"[..]));
    assert_eq!(r.records[2].key, None, "absent key stays absent");
    assert_eq!(
        r.records[3].key,
        Some(Bytes::new()),
        "empty key stays empty"
    );
    assert_eq!(r.records[0].headers[0].name, "h");
    assert_eq!(r.records[1].committed_at_ms, T0_MS);
    assert_eq!(r.records[2].committed_at_ms, T0_MS + 5);
}

#[test]
fn reads_respect_record_and_byte_limits_but_always_return_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    let big = "x".repeat(1000);
    store.append(&id, batch(&[&big, "s1", "s2", "s3"])).unwrap();

    let r = store
        .read(
            &id,
            &ReadOptions {
                max_bytes: 10,
                ..read_from(0)
            },
        )
        .unwrap();
    assert_eq!(
        r.records.len(),
        1,
        "one record even though it exceeds max_bytes"
    );
    assert_eq!(r.next_offset, 1);

    let r = store
        .read(
            &id,
            &ReadOptions {
                max_records: 2,
                ..read_from(1)
            },
        )
        .unwrap();
    assert_eq!(values(&r.records), ["s1", "s2"]);
    assert_eq!(r.next_offset, 3);

    let r = store.read(&id, &read_from(4)).unwrap();
    assert!(r.records.is_empty());
    assert_eq!(r.next_offset, 4);
    assert!(matches!(
        store.read(&id, &read_from(5)),
        Err(StorageError::OffsetBeyondEnd {
            requested: 5,
            high_watermark: 4,
            ..
        })
    ));
}

#[test]
fn the_delay_gate_stops_at_the_first_record_not_due_and_says_when_it_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["r1"])).unwrap();
    clock.advance(1000);
    store.append(&id, batch(&["r2"])).unwrap();
    clock.advance(1000);
    store.append(&id, batch(&["r3"])).unwrap();

    let gated = ReadOptions {
        max_committed_at_ms: Some(T0_MS + 500),
        ..read_from(0)
    };
    let r = store.read(&id, &gated).unwrap();
    assert_eq!(values(&r.records), ["r1"]);
    assert_eq!(r.next_offset, 1);
    let nd = r.not_due.unwrap();
    assert_eq!((nd.offset, nd.due_at_ms), (1, T0_MS + 1000));

    // A gate exactly at a commit time lets that record through.
    let r = store
        .read(
            &id,
            &ReadOptions {
                max_committed_at_ms: Some(T0_MS + 1000),
                ..read_from(1)
            },
        )
        .unwrap();
    assert_eq!(values(&r.records), ["r2"]);
    assert_eq!(r.not_due.unwrap().due_at_ms, T0_MS + 2000);
}

#[test]
fn many_small_batches_across_segments_read_back_from_any_offset() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, small_segments(20_000)).unwrap();
    let mut expected = Vec::new();
    for i in 0..400 {
        let v = format!("value-{i:04}-{}", "p".repeat(i % 50));
        store.append(&id, batch(&[&v])).unwrap();
        expected.push(v);
    }
    let stats = store.peek(&id).unwrap();
    assert!(stats.segment_count > 1, "segments rolled: {stats:?}");
    for start in [0u64, 1, 57, 199, 200, 398, 399] {
        let got = values(&read_all(&store, &id, start));
        assert_eq!(got, expected[start as usize..], "from {start}");
    }
}

#[test]
fn child_commit_origins_are_stored_per_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("child", 1);
    store.create_partition(&id, LogConfig::default()).unwrap();
    let mut b: AppendBatch = batch(&["a", "b", "c"]);
    b.origin = Some(BatchOrigin {
        epoch: *b"epoch-01",
        parent_partition: 4,
        slab_start: 100,
        parent_offsets: vec![100, 101, 205],
    });
    store.append(&id, b).unwrap();
    let got = read_all(&store, &id, 0);
    assert_eq!(
        got[2].origin,
        Some(RecordOrigin {
            epoch: *b"epoch-01",
            parent_partition: 4,
            parent_offset: 205,
            slab_start: 100,
        })
    );
}

#[test]
fn an_empty_batch_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    assert!(matches!(
        store.append(&id, AppendBatch::default()),
        Err(StorageError::EmptyBatch)
    ));
    assert_eq!(store.read(&id, &read_from(0)).unwrap().high_watermark, 0);
}

#[test]
fn unknown_partitions_and_bad_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    assert!(matches!(
        store.read(&pid("nope", 0), &read_from(0)),
        Err(StorageError::UnknownPartition { .. })
    ));
    assert!(matches!(
        store.create_partition(&pid("a/b", 0), LogConfig::default()),
        Err(StorageError::InvalidName(_))
    ));
    assert!(matches!(
        store.create_partition(&pid("ok", 100_000), LogConfig::default()),
        Err(StorageError::PartitionOutOfRange { .. })
    ));
}

#[test]
fn a_second_store_on_the_same_directory_is_refused_until_the_first_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let first = real_store(dir.path(), clock.clone());
    let err = Store::open(
        dir.path(),
        opts(Arc::new(narad_storage::fs::RealFs), clock.clone()),
    )
    .unwrap_err();
    match &err {
        StorageError::DataDirLocked { path } => assert_eq!(path, &dir.path().join("LOCK")),
        other => panic!("expected DataDirLocked, got {other:?}"),
    }
    assert!(err.to_string().contains("another narad process"));
    drop(first);
    real_store(dir.path(), clock);
}

#[test]
fn peek_never_opens_a_closed_log_and_never_stamps_last_access() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let id = pid("t", 0);
    {
        let store = real_store(dir.path(), clock.clone());
        store.create_partition(&id, LogConfig::default()).unwrap();
        store.append(&id, batch(&["a", "b", "c"])).unwrap();
        store.close().unwrap();
    }
    let store = real_store(dir.path(), clock.clone());
    store.create_partition(&id, LogConfig::default()).unwrap();
    let s = store.peek(&id).unwrap();
    assert_eq!(s.state, PartitionState::Closed, "peek left it closed");
    assert_eq!(s.high_watermark, Some(3), "exact after a clean close");
    assert_eq!(s.log_start_offset, 0);
    assert_eq!(s.segment_count, 1);
    assert!(s.size_bytes > 0);

    // Open it with a read, then peek repeatedly while the clock passes the idle limit: peeks
    // must not keep it warm.
    store.read(&id, &read_from(0)).unwrap();
    assert_eq!(store.peek(&id).unwrap().state, PartitionState::Open);
    for _ in 0..3 {
        clock.advance(30_000);
        store.peek(&id).unwrap();
    }
    assert_eq!(store.close_idle(), 1);
    assert_eq!(store.peek(&id).unwrap().state, PartitionState::Closed);
}

/// The reconciler asks for every cursor's parent every second: an open log answers from
/// memory, a closed one (or an unknown partition) answers nothing and stays closed.
#[test]
fn the_open_high_watermark_is_told_only_for_an_open_log_and_opens_none() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    assert_eq!(store.open_high_watermark(&id), None, "not registered");
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a", "b", "c"])).unwrap();
    assert_eq!(store.open_high_watermark(&id), Some(3));
    clock.advance(120_000);
    assert_eq!(store.close_idle(), 1);
    assert_eq!(store.open_high_watermark(&id), None, "closed");
    assert_eq!(
        store.peek(&id).unwrap().state,
        PartitionState::Closed,
        "still closed"
    );
    store.append(&id, batch(&["d"])).unwrap();
    assert_eq!(store.open_high_watermark(&id), Some(4));
}

/// An idle cursor asks for its parent's end every second: a log this store closed cleanly
/// answers from where it ended without being opened, unless its last segment changed since.
#[test]
fn the_known_high_watermark_of_a_cleanly_closed_log_is_told_without_opening_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    assert_eq!(store.known_high_watermark(&id), None, "not registered");
    store.create_partition(&id, LogConfig::default()).unwrap();
    assert_eq!(
        store.known_high_watermark(&id),
        None,
        "never opened by this store: only a read knows its end"
    );
    store.append(&id, batch(&["a", "b", "c"])).unwrap();
    assert_eq!(store.known_high_watermark(&id), Some(3), "open");
    clock.advance(120_000);
    assert_eq!(store.close_idle(), 1);
    assert_eq!(store.known_high_watermark(&id), Some(3), "closed cleanly");
    assert_eq!(
        store.peek(&id).unwrap().state,
        PartitionState::Closed,
        "still closed"
    );
    store.append(&id, batch(&["d"])).unwrap();
    clock.advance(120_000);
    assert_eq!(store.close_idle(), 1);
    assert_eq!(
        store.recent_high_watermark(&id),
        None,
        "closed, not checked since"
    );
    assert_eq!(
        store.known_high_watermark(&id),
        Some(4),
        "closed again, later"
    );
    // Checked by that `stat`: told without one for CLOSED_END_RECHECK, then checked again.
    assert_eq!(store.recent_high_watermark(&id), Some(4), "just checked");
    clock.advance(narad_storage::store::CLOSED_END_RECHECK.as_millis() as i64 - 1);
    assert_eq!(store.recent_high_watermark(&id), Some(4), "checked lately");
    clock.advance(1);
    assert_eq!(
        store.recent_high_watermark(&id),
        None,
        "time to check again"
    );
    assert_eq!(store.known_high_watermark(&id), Some(4), "checked again");

    // The last segment loses its last bytes while the log is closed, and its high-watermark
    // file is gone (as after a power loss): its end is unknown until a read opens the log,
    // which finds the record cut. Told without a `stat`, the old end stands only until the
    // next check is due; the check finds the change and the end is unknown from then on.
    tear_the_last_record(&dir.path().join("topics/t/p00000"));
    assert_eq!(
        store.recent_high_watermark(&id),
        Some(4),
        "a change behind the store's back is seen at the next check"
    );
    assert_eq!(store.known_high_watermark(&id), None, "its segment changed");
    assert_eq!(
        store.recent_high_watermark(&id),
        None,
        "not told after a failed check"
    );
    assert_eq!(
        store.high_watermark(&id).unwrap(),
        3,
        "a read finds the cut"
    );
    assert_eq!(store.known_high_watermark(&id), Some(3), "open again");

    // A store opened on the directory knows nothing of how its logs were closed.
    drop(store);
    let store = real_store(dir.path(), clock.clone());
    store.register_partition(&id, LogConfig::default()).unwrap();
    assert_eq!(store.known_high_watermark(&id), None, "a new store");
}

#[test]
fn an_idle_log_is_closed_and_reopens_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let (busy, idle) = (pid("t", 0), pid("t", 1));
    for id in [&busy, &idle] {
        store.create_partition(id, LogConfig::default()).unwrap();
        store.append(id, batch(&["x"])).unwrap();
    }
    clock.advance(45_000);
    store.read(&busy, &read_from(0)).unwrap();
    clock.advance(30_000);
    assert_eq!(store.close_idle(), 1, "only the idle one is closed");
    assert_eq!(store.peek(&idle).unwrap().state, PartitionState::Closed);
    assert_eq!(store.peek(&busy).unwrap().state, PartitionState::Open);
    assert_eq!(store.peek(&idle).unwrap().high_watermark, Some(1));

    let a = store.append(&idle, batch(&["y"])).unwrap();
    assert_eq!(a.base_offset, 1);
    assert_eq!(values(&read_all(&store, &idle, 0)), ["x", "y"]);
}

#[test]
fn opening_logs_past_the_limit_closes_the_least_recently_used_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let ids: Vec<_> = (0..40).map(|p| pid("t", p)).collect();
    {
        let store = real_store(dir.path(), clock.clone());
        for id in &ids {
            store.create_partition(id, LogConfig::default()).unwrap();
            store.append(id, batch(&["x"])).unwrap();
            clock.advance(1);
        }
        store.close().unwrap();
    }
    let store = real_store(dir.path(), clock.clone());
    for id in &ids {
        store.create_partition(id, LogConfig::default()).unwrap();
    }
    store.limit_open_logs(10);
    let open = |store: &narad_storage::Store| {
        ids.iter()
            .filter(|id| store.peek(id).unwrap().state == PartitionState::Open)
            .count()
    };
    // One request reading every partition, as a fetch naming them all would.
    for id in &ids {
        clock.advance(1);
        let read = store.read(id, &read_from(0)).unwrap();
        assert_eq!(read.records.len(), 1, "{id}");
        assert!(
            open(&store) <= 10,
            "{} logs open after reading {id}",
            open(&store)
        );
    }
    // The most recent stays open; an evicted one reopens on its next use with its records.
    assert_eq!(store.peek(&ids[39]).unwrap().state, PartitionState::Open);
    assert_eq!(store.peek(&ids[0]).unwrap().state, PartitionState::Closed);
    store.append(&ids[0], batch(&["y"])).unwrap();
    assert_eq!(store.read(&ids[0], &read_from(0)).unwrap().records.len(), 2);
    assert!(open(&store) <= 10);
}

#[test]
fn peek_reports_no_high_watermark_for_a_log_that_was_not_closed_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let id = pid("t", 0);
    {
        let store = real_store(dir.path(), clock.clone());
        store.create_partition(&id, LogConfig::default()).unwrap();
        store.append(&id, batch(&["a"])).unwrap();
        // Dropped without close: as after a crash.
    }
    let store = real_store(dir.path(), clock.clone());
    store.create_partition(&id, LogConfig::default()).unwrap();
    assert_eq!(store.peek(&id).unwrap().high_watermark, None);
    // Opening recovers it; closing makes the file exact again.
    assert_eq!(values(&read_all(&store, &id, 0)), ["a"]);
    store.close().unwrap();
    assert_eq!(store.peek(&id).unwrap().high_watermark, Some(1));
}

#[test]
fn records_survive_a_clean_close_and_offsets_continue_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let id = pid("t", 0);
    {
        let store = real_store(dir.path(), clock.clone());
        store.create_partition(&id, small_segments(200)).unwrap();
        for i in 0..10 {
            store.append(&id, batch(&[&format!("v{i}")])).unwrap();
        }
        store.close().unwrap();
    }
    clock.advance(-10_000);
    let store = real_store(dir.path(), clock.clone());
    store.create_partition(&id, small_segments(200)).unwrap();
    let a = store.append(&id, batch(&["v10"])).unwrap();
    assert_eq!(a.base_offset, 10);
    assert!(
        a.committed_at_ms >= T0_MS,
        "the commit-time floor is recovered from the log"
    );
    let got = values(&read_all(&store, &id, 0));
    assert_eq!(got.len(), 11);
    assert_eq!(got[10], "v10");
}

#[test]
fn deleting_a_topic_removes_its_partitions_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let (a, b, other) = (pid("gone", 0), pid("gone", 1), pid("kept", 0));
    for id in [&a, &b, &other] {
        store.create_partition(id, LogConfig::default()).unwrap();
        store.append(id, batch(&["x"])).unwrap();
    }
    store.delete_topic("gone").unwrap();
    assert!(matches!(
        store.read(&a, &read_from(0)),
        Err(StorageError::UnknownPartition { .. })
    ));
    assert!(!dir.path().join("topics/gone").exists());
    assert_eq!(
        std::fs::read_dir(dir.path().join("trash")).unwrap().count(),
        0
    );
    assert_eq!(values(&read_all(&store, &other, 0)), ["x"]);
    // A topic of the same name starts afresh.
    store.create_partition(&a, LogConfig::default()).unwrap();
    assert_eq!(store.append(&a, batch(&["y"])).unwrap().base_offset, 0);
}

#[test]
fn the_partition_directory_layout_matches_the_documentation() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("orders", 3);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["x"])).unwrap();
    let p = dir.path().join("topics/orders/p00003");
    assert!(p.join("00000000000000000000.log").is_file());
    assert_eq!(
        std::fs::metadata(p.join("high-watermark")).unwrap().len(),
        64
    );
    assert_eq!(std::fs::metadata(p.join("log-start")).unwrap().len(), 32);
    assert!(dir.path().join("LOCK").is_file());
}

#[test]
fn the_high_watermark_file_follows_appends_lazily_and_is_clean_only_after_close() {
    use narad_storage::fs::RealFs;
    use narad_storage::log::hwm;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a"])).unwrap();
    let pdir = dir.path().join("topics/t/p00000");
    // Lazy: within the update interval (one second on the store's clock) the boundary stays
    // where the open put it.
    clock.advance(999);
    store.append(&id, batch(&["b"])).unwrap();
    assert_eq!(hwm::read(&RealFs, &pdir).unwrap().unwrap().next_offset, 0);
    // Once the interval has passed on the store's clock, the next append moves the boundary
    // to its end.
    clock.advance(1);
    store.append(&id, batch(&["c", "d"])).unwrap();
    let h = hwm::read(&RealFs, &pdir).unwrap().unwrap();
    assert_eq!(h.next_offset, 4);
    assert!(!h.clean, "an open log's file is never marked clean");
    let seg_len = std::fs::metadata(pdir.join("00000000000000000000.log"))
        .unwrap()
        .len();
    assert_eq!(h.segment_pos, seg_len);
    // A clock stepped backwards does not hold the boundary back until it catches up.
    clock.advance(-3_600_000);
    store.append(&id, batch(&["e"])).unwrap();
    assert_eq!(hwm::read(&RealFs, &pdir).unwrap().unwrap().next_offset, 5);
    store.close().unwrap();
    let h = hwm::read(&RealFs, &pdir).unwrap().unwrap();
    assert!(h.clean);
    let seg_len = std::fs::metadata(pdir.join("00000000000000000000.log"))
        .unwrap()
        .len();
    assert_eq!((h.next_offset, h.segment_pos), (5, seg_len));
}

#[test]
fn concurrent_readers_only_ever_see_whole_acknowledged_batches_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(real_store(dir.path(), Arc::new(ManualClock::new(T0_MS))));
    let id = pid("t", 0);
    store.create_partition(&id, small_segments(2000)).unwrap();
    let writer = {
        let (store, id) = (store.clone(), id.clone());
        std::thread::spawn(move || {
            for i in 0..150 {
                let (a, b) = (format!("{i}-a"), format!("{i}-b"));
                store.append(&id, batch(&[&a, &b])).unwrap();
            }
        })
    };
    let mut reads = 0;
    loop {
        let done = writer.is_finished();
        let got = values(&read_all(&store, &id, 0));
        assert_eq!(got.len() % 2, 0, "a batch is visible whole or not at all");
        for (n, v) in got.iter().enumerate() {
            let expected = format!("{}-{}", n / 2, if n % 2 == 0 { "a" } else { "b" });
            assert_eq!(v, &expected);
        }
        reads += 1;
        if done {
            assert_eq!(got.len(), 300);
            break;
        }
    }
    writer.join().unwrap();
    assert!(reads >= 1);
}

#[test]
fn the_store_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Store>();
    shareable::<narad_storage::fault::FaultFs>();
}

#[test]
fn a_gated_read_stops_at_a_frame_not_due_by_its_header_without_reading_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("jobs", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["due"])).unwrap();
    let segment = dir
        .path()
        .join("topics/jobs/p00000/00000000000000000000.log");
    let first_frame_len = std::fs::metadata(&segment).unwrap().len();
    clock.advance(10_000);
    store.append(&id, batch(&["not-due-yet"])).unwrap();

    // Damage the last byte of the second frame's body, under the open log: only a read that
    // decodes that body can notice.
    let len = std::fs::metadata(&segment).unwrap().len();
    assert!(len > first_frame_len + 40);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[(len - 1) as usize] ^= 0xff;
    std::fs::write(&segment, &bytes).unwrap();

    let gated = ReadOptions {
        max_committed_at_ms: Some(T0_MS + 5_000),
        ..read_from(0)
    };
    let r = store.read(&id, &gated).unwrap();
    assert_eq!(values(&r.records), ["due"]);
    let not_due = r.not_due.unwrap();
    assert_eq!((not_due.offset, not_due.due_at_ms), (1, T0_MS + 10_000));
    // Waking at the record that is not due reads only its header.
    let r = store
        .read(&id, &ReadOptions { offset: 1, ..gated })
        .unwrap();
    assert!(r.records.is_empty());
    assert_eq!(r.not_due.map(|n| n.offset), Some(1));
    // An ungated read does decode the body, and reports the damage.
    assert!(store.read(&id, &read_from(1)).is_err());
}

#[test]
fn high_watermark_is_exact_even_for_a_log_closed_by_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let id = pid("orders", 0);
    {
        let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
        store.create_partition(&id, LogConfig::default()).unwrap();
        store.append(&id, batch(&["a", "b", "c"])).unwrap();
        assert_eq!(store.high_watermark(&id).unwrap(), 3);
        // Dropped without `close`: as after a crash, the high-watermark file is not clean.
    }
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    store.create_partition(&id, LogConfig::default()).unwrap();
    let peeked = store.peek(&id).unwrap();
    assert_eq!(peeked.state, PartitionState::Closed);
    assert_eq!(store.high_watermark(&id).unwrap(), 3);
}

#[test]
fn a_partition_registered_anew_has_a_new_incarnation_and_an_idempotent_one_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    assert_eq!(store.incarnation(&id), None);
    store.create_partition(&id, LogConfig::default()).unwrap();
    let first = store.incarnation(&id).unwrap();
    store.create_partition(&id, LogConfig::default()).unwrap();
    assert_eq!(
        store.incarnation(&id),
        Some(first),
        "registering again is idempotent"
    );
    store.forget_partition(&id);
    assert_eq!(store.incarnation(&id), None);
    store.create_partition(&id, LogConfig::default()).unwrap();
    assert_ne!(store.incarnation(&id), Some(first));
}
