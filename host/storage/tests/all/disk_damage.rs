//! Damage found at open that is not a crash: a removed oldest segment is never passed off as
//! retention, a hole names the missing offsets, an interrupted retention step is finished, and
//! a torn tail cut by recovery is kept aside and counted instead of vanishing.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use narad_storage::fault::{CrashMode, FaultFs};
use narad_storage::fs::{FileSystem, OpenMode, RealFs};
use narad_storage::log::segment;
use narad_storage::log::start::{self, LOG_START_FILE_NAME, Recorded};
use narad_storage::log::torn::TORN_DIR_NAME;
use narad_storage::{Damage, LogConfig, ManualClock, PartitionState, StorageError, Store};

const HOUR_MS: i64 = 3_600_000;
/// Data directory inside the in-memory file system.
const DATA: &str = "/data";

fn fault_fs() -> FaultFs {
    let fs = FaultFs::new();
    fs.create_dir_all(Path::new(DATA)).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    fs
}

fn partition_dir(data: &Path) -> PathBuf {
    data.join("topics/t/p00000")
}

fn segments(data: &Path) -> Vec<segment::SegmentFile> {
    segment::list(&RealFs, &partition_dir(data)).unwrap()
}

/// Writes `n` single-record batches of ~150 bytes with 100-byte segments, so every record has
/// its own segment file (segment `i` holds offset `i`).
fn write_log(data: &Path, n: usize, clean: bool) {
    let store = real_store(data, Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, small_segments(100)).unwrap();
    for i in 0..n {
        store
            .append(&id, batch(&[&format!("rec-{i}-{}", "v".repeat(100))]))
            .unwrap();
    }
    if clean {
        store.close().unwrap();
    }
}

fn reopen(data: &Path) -> Store {
    // The store of `write_log` left without a close (a crash stand-in) lets go of the data-dir
    // lock when its last background reference drops, which can be a moment after the drop.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let store = loop {
        match Store::open(
            data,
            opts(Arc::new(RealFs), Arc::new(ManualClock::new(T0_MS))),
        ) {
            Err(StorageError::DataDirLocked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    store
        .create_partition(&pid("t", 0), small_segments(100))
        .unwrap();
    store
}

fn quarantine_reason(store: &Store) -> Damage {
    match store.read(&pid("t", 0), &read_from(0)) {
        Err(StorageError::Quarantined { reason, .. }) => *reason,
        other => panic!("expected Quarantined, got {other:?}"),
    }
}

#[test]
fn a_removed_oldest_segment_quarantines_naming_the_missing_offsets_instead_of_moving_the_log_start()
{
    for clean in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), 5, clean);
        std::fs::remove_file(&segments(dir.path())[0].path).unwrap();

        let store = reopen(dir.path());
        // Offsets 0 to 0 are missing: the oldest file left is segment 1.
        assert_eq!(
            quarantine_reason(&store),
            Damage::HeadMissing {
                dir: partition_dir(dir.path()),
                oldest_base: 1,
                log_start: 0,
            },
            "clean {clean}"
        );
        let stats = store.peek(&pid("t", 0)).unwrap();
        assert!(matches!(stats.state, PartitionState::Quarantined { .. }));
        assert_eq!(stats.log_start_offset, 0, "the log start did not move");
        assert!(matches!(
            store.append(&pid("t", 0), batch(&["x"])),
            Err(StorageError::Quarantined { .. })
        ));
    }
}

#[test]
fn peek_reports_a_closed_log_missing_its_head_as_quarantined_without_opening_it() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 4, true);
    std::fs::remove_file(&segments(dir.path())[0].path).unwrap();
    let store = reopen(dir.path());
    let stats = store.peek(&pid("t", 0)).unwrap();
    match &stats.state {
        PartitionState::Quarantined { reason } => assert_eq!(
            *reason,
            Damage::HeadMissing {
                dir: partition_dir(dir.path()),
                oldest_base: 1,
                log_start: 0,
            }
        ),
        other => panic!(
            "expected quarantined, got {other:?} (log start {})",
            stats.log_start_offset
        ),
    }
    assert_eq!(stats.log_start_offset, 0);
}

#[test]
fn every_segment_removed_while_records_were_recorded_quarantines() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 3, true);
    let p = partition_dir(dir.path());
    // Move the log start by a real retention step, then lose every segment and the
    // high-watermark file: only the log-start file is left to tell.
    start::write(&RealFs, &p, 1).unwrap();
    for s in segments(dir.path()) {
        std::fs::remove_file(&s.path).unwrap();
    }
    std::fs::remove_file(p.join("high-watermark")).unwrap();
    let store = reopen(dir.path());
    assert_eq!(
        quarantine_reason(&store),
        Damage::EverySegmentMissing {
            dir: p,
            log_start: 1,
        }
    );
}

#[test]
fn a_recorded_partition_whose_directory_is_gone_is_quarantined_not_made_again_empty() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 3, true);
    let p = partition_dir(dir.path());
    std::fs::remove_dir_all(&p).unwrap();

    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.register_partition(&id, small_segments(100)).unwrap();
    let missing = Damage::DirectoryMissing { dir: p.clone() };
    assert_eq!(quarantine_reason(&store), missing);
    assert!(matches!(
        store.append(&id, batch(&["new"])),
        Err(StorageError::Quarantined { .. })
    ));
    let stats = store.peek(&id).unwrap();
    assert_eq!(
        stats.state,
        PartitionState::Quarantined {
            reason: missing.clone()
        }
    );
    // Registering it again (as a create of its topic's later partitions does) changes nothing.
    store.create_partition(&id, small_segments(100)).unwrap();
    assert_eq!(quarantine_reason(&store), missing);
    assert!(!p.exists(), "the store made the missing directory again");
    drop(store);

    // The operator accepts the loss: an empty directory starts again at offset 0.
    std::fs::create_dir_all(&p).unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    store.register_partition(&id, small_segments(100)).unwrap();
    assert_eq!(store.append(&id, batch(&["new"])).unwrap().base_offset, 0);
    assert_eq!(values(&read_all(&store, &id, 0)), ["new"]);
}

#[test]
fn a_hole_between_segments_names_the_missing_offsets() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 5, true);
    let segs = segments(dir.path());
    std::fs::remove_file(&segs[2].path).unwrap();
    std::fs::remove_file(&segs[3].path).unwrap();
    let store = reopen(dir.path());
    // Offsets 2 to 3 are missing: segment 4 follows segment 1, which ends at offset 2.
    assert_eq!(
        quarantine_reason(&store),
        Damage::SegmentOutOfSequence {
            segment: segs[4].path.clone(),
            base: 4,
            expected: 2,
        }
    );
}

#[test]
fn closed_log_retention_refuses_a_log_missing_its_head_and_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let id = pid("t", 0);
    let config = LogConfig {
        segment_bytes: 100,
        retention_ms: Some(HOUR_MS as u64),
        retention_bytes: None,
    };
    {
        let store = real_store(dir.path(), clock.clone());
        store.create_partition(&id, config.clone()).unwrap();
        for i in 0..4 {
            store
                .append(&id, batch(&[&format!("r{i}-{}", "v".repeat(120))]))
                .unwrap();
        }
        store.close().unwrap();
    }
    std::fs::remove_file(&segments(dir.path())[0].path).unwrap();
    clock.advance(10 * HOUR_MS);
    let store = real_store(dir.path(), clock.clone());
    store.create_partition(&id, config).unwrap();
    let result = store.enforce_retention();
    assert!(
        matches!(result, Err(StorageError::Quarantined { .. })),
        "{result:?}"
    );
    assert_eq!(segments(dir.path()).len(), 3, "nothing was deleted");
    assert!(matches!(
        store.peek(&id).unwrap().state,
        PartitionState::Quarantined { .. }
    ));
}

#[test]
fn a_retention_step_interrupted_after_recording_its_new_start_is_finished_on_open() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 5, true);
    // A retention step recorded start 2 and crashed before deleting segments 0 and 1.
    start::write(&RealFs, &partition_dir(dir.path()), 2).unwrap();
    let store = reopen(dir.path());
    assert_eq!(store.peek(&pid("t", 0)).unwrap().log_start_offset, 2);
    match store.read(&pid("t", 0), &read_from(0)) {
        Err(StorageError::OffsetBelowLogStart { log_start: 2, .. }) => {}
        other => panic!("expected OffsetBelowLogStart at 2, got {other:?}"),
    }
    let bases: Vec<u64> = segments(dir.path()).iter().map(|s| s.base).collect();
    assert_eq!(bases, [2, 3, 4], "the step was finished");
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 2)).len(),
        3,
        "records from the recorded start on are all there"
    );
}

#[test]
fn a_partition_without_a_log_start_file_is_accepted_once_and_checked_from_then_on() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 4, true);
    let p = partition_dir(dir.path());
    // As an older version left it: no log-start file; its retention had deleted segment 0.
    std::fs::remove_file(p.join(LOG_START_FILE_NAME)).unwrap();
    std::fs::remove_file(&segments(dir.path())[0].path).unwrap();
    {
        let store = reopen(dir.path());
        let r = store.read(&pid("t", 0), &read_from(1)).unwrap();
        assert_eq!(r.log_start_offset, 1);
        store.close().unwrap();
    }
    assert_eq!(start::read(&RealFs, &p).unwrap(), Recorded::Start(1));
    // From now on the head is checked.
    std::fs::remove_file(&segments(dir.path())[0].path).unwrap();
    let store = reopen(dir.path());
    assert_eq!(
        quarantine_reason(&store),
        Damage::HeadMissing {
            dir: p,
            oldest_base: 2,
            log_start: 1,
        }
    );
}

#[test]
fn a_crash_anywhere_in_a_retention_step_never_quarantines_and_never_loses_a_retained_record() {
    let config = LogConfig {
        segment_bytes: 100,
        retention_ms: None,
        retention_bytes: Some(200),
    };
    let id = pid("t", 0);
    let setup = |fs: &FaultFs| -> Store {
        let store = Store::open(
            Path::new(DATA),
            opts(Arc::new(fs.clone()), Arc::new(ManualClock::new(T0_MS))),
        )
        .unwrap();
        store.create_partition(&id, config.clone()).unwrap();
        store
    };
    let ops = {
        let fs = fault_fs();
        let store = setup(&fs);
        for i in 0..6 {
            store
                .append(&id, batch(&[&format!("r{i}-{}", "v".repeat(120))]))
                .unwrap();
        }
        let before = fs.op_count();
        let report = store.enforce_retention().unwrap();
        assert!(report.segments_deleted >= 3, "{report:?}");
        fs.op_count() - before
    };
    for n in 1..=ops {
        for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
            let fs = fault_fs();
            let store = setup(&fs);
            for i in 0..6 {
                store
                    .append(&id, batch(&[&format!("r{i}-{}", "v".repeat(120))]))
                    .unwrap();
            }
            fs.crash_at(n);
            let _ = store.enforce_retention();
            assert!(fs.is_crashed(), "op {n} of {ops} was reached");
            drop(store);
            fs.crash(mode);
            let store = setup(&fs);
            let stats = store.peek(&id).unwrap();
            assert!(
                !matches!(stats.state, PartitionState::Quarantined { .. }),
                "crash at op {n}, {mode:?}: {:?}",
                stats.state
            );
            let got = values(&read_all(&store, &id, stats.log_start_offset));
            let want: Vec<String> = (stats.log_start_offset..6)
                .map(|i| format!("r{i}-{}", "v".repeat(120)))
                .collect();
            assert_eq!(got, want, "crash at op {n}, {mode:?}");
        }
    }
}

/// Cuts `cut` bytes off the end of the last segment; returns what is left of it.
fn cut_tail(data: &Path, cut: u64) -> Vec<u8> {
    let last = segments(data).pop().unwrap();
    let bytes = std::fs::read(&last.path).unwrap();
    let keep = bytes.len() - cut as usize;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last.path)
        .unwrap()
        .set_len(keep as u64)
        .unwrap();
    bytes[..keep].to_vec()
}

#[test]
fn a_torn_tail_cut_without_a_high_watermark_file_is_kept_aside_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    {
        let store = real_store(data, Arc::new(ManualClock::new(T0_MS)));
        store
            .create_partition(&pid("t", 0), small_segments(1 << 20))
            .unwrap();
        for i in 0..5 {
            store
                .append(
                    &pid("t", 0),
                    batch(&[&format!("rec-{i}-{}", "v".repeat(150))]),
                )
                .unwrap();
        }
        store.close().unwrap();
    }
    let p = partition_dir(data);
    // Recovery cannot know offset 4 was acknowledged: its witness is gone.
    std::fs::remove_file(p.join("high-watermark")).unwrap();
    let left = cut_tail(data, 100);

    let store = real_store(data, Arc::new(ManualClock::new(T0_MS + 5)));
    store
        .create_partition(&pid("t", 0), small_segments(1 << 20))
        .unwrap();
    assert_eq!(read_all(&store, &pid("t", 0), 0).len(), 4);
    let report = store
        .peek(&pid("t", 0))
        .unwrap()
        .recovered_cut
        .expect("the cut is reported");
    assert_eq!(
        (
            report.cuts,
            report.records,
            report.records_exact,
            report.from_offset
        ),
        (1, 1, true, 4)
    );
    assert_eq!(report.at_ms, T0_MS + 5);
    let kept_len = std::fs::metadata(&report.kept_at).unwrap().len();
    assert_eq!(report.bytes, kept_len);
    let kept = std::fs::read(&report.kept_at).unwrap();
    assert!(kept.len() > 100, "the whole torn frame was cut");
    assert!(
        left.ends_with(&kept),
        "the kept bytes are the bytes recovery cut"
    );
    assert_eq!(
        std::fs::metadata(segments(data).pop().unwrap().path)
            .unwrap()
            .len(),
        (left.len() - kept.len()) as u64
    );
    assert!(report.kept_at.starts_with(p.join(TORN_DIR_NAME)));

    // The report survives a restart (the log closed, described from its directory) ...
    store.append(&pid("t", 0), batch(&["after"])).unwrap();
    store.close().unwrap();
    drop(store);
    let store = reopen(data);
    let again = store.peek(&pid("t", 0)).unwrap();
    assert_eq!(again.state, PartitionState::Closed);
    assert_eq!(again.recovered_cut, Some(report));
    // ... and is cleared when the operator removes the kept-aside files.
    std::fs::remove_dir_all(p.join(TORN_DIR_NAME)).unwrap();
    assert_eq!(store.peek(&pid("t", 0)).unwrap().recovered_cut, None);
}

/// An in-memory store whose partition has three records, a clean close, no high-watermark
/// file and its last 50 bytes cut off; returns it and the segment's length after the cut.
fn torn_without_hwm() -> (FaultFs, u64) {
    let fs = fault_fs();
    {
        let store = open_t0_on(&fs).unwrap();
        for i in 0..3 {
            store
                .append(
                    &pid("t", 0),
                    batch(&[&format!("rec-{i}-{}", "v".repeat(150))]),
                )
                .unwrap();
        }
        store.close().unwrap();
    }
    let p = fault_partition();
    fs.remove_file(&p.join("high-watermark")).unwrap();
    let seg = p.join(segment::segment_name(0));
    let f = fs.open(&seg, OpenMode::ReadWrite).unwrap();
    let len = f.len().unwrap();
    f.set_len(len - 50).unwrap();
    f.sync_data().unwrap();
    drop(f);
    fs.sync_dir(&p).unwrap();
    (fs, len - 50)
}

fn fault_partition() -> PathBuf {
    Path::new(DATA).join("topics/t/p00000")
}

#[test]
fn the_cut_bytes_are_kept_aside_before_the_segment_is_truncated() {
    let id = pid("t", 0);
    let p = fault_partition();
    let seg = p.join(segment::segment_name(0));
    let ops = {
        let (fs, _) = torn_without_hwm();
        let before = fs.op_count();
        let store = open_t0_on(&fs).unwrap();
        store.read(&id, &read_from(0)).unwrap();
        fs.op_count() - before
    };
    assert!(ops > 5, "the recovering open does real I/O ({ops} ops)");
    // Crash at every step of the recovering open: whenever the segment is found cut, the
    // kept-aside copy of what was cut is there too.
    let mut cut_seen = false;
    for n in 1..=ops {
        let (fs, torn_len) = torn_without_hwm();
        fs.crash_at(n);
        if let Ok(store) = open_t0_on(&fs) {
            let _ = store.read(&id, &read_from(0));
        }
        fs.crash(CrashMode::DropAll);
        let seg_len = fs.metadata(&seg).unwrap().len;
        if seg_len < torn_len {
            cut_seen = true;
            let report = narad_storage::log::torn::summary(&fs, &p)
                .unwrap()
                .unwrap_or_else(|| panic!("crash at op {n}: cut without a kept-aside copy"));
            assert_eq!(report.bytes, torn_len - seg_len, "crash at op {n}");
            assert_eq!(fs.metadata(&report.kept_at).unwrap().len, report.bytes);
        }
    }
    assert!(cut_seen, "some crash point came after the cut");
}
