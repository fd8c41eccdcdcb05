//! The fan-out cursor file on a fault-injecting file system: the fixed 256-byte record, its
//! CRC, in-place advances, torn writes, fsync failures and the older format.

// Tests may unwrap: a panic is how they fail.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use narad_storage::cursor::{self, CursorFile, CursorLoad, CursorRecord, RecordLayout};
use narad_storage::fault::{CrashMode, Fault, FaultFs, FaultOp};
use narad_storage::fs::{FileSystem, OpenMode};

const EPOCH: &str = "67953471cc57a32a";

fn setup() -> (FaultFs, Arc<dyn FileSystem>, PathBuf) {
    let fault = FaultFs::new();
    let fs: Arc<dyn FileSystem> = Arc::new(fault.clone());
    let dir = Path::new("/data/topics/orders/p00003");
    fs.create_dir_all(dir).unwrap();
    // Make the directory chain itself durable, so a simulated power loss keeps it.
    for ancestor in dir.ancestors() {
        fs.sync_dir(ancestor).unwrap();
    }
    (fault, fs, dir.join(cursor::cursor_file_name("analytics")))
}

fn record(next_offset: u64) -> CursorRecord {
    CursorRecord {
        epoch: EPOCH.into(),
        next_offset,
    }
}

fn found(fs: &dyn FileSystem, path: &Path) -> Option<(CursorRecord, RecordLayout)> {
    match cursor::load(fs, path).unwrap() {
        CursorLoad::Found { record, layout } => Some((record, layout)),
        _ => None,
    }
}

#[test]
fn first_anchor_writes_a_256_byte_record_that_survives_a_crash() {
    let (fault, fs, path) = setup();
    let file = CursorFile::anchor(Arc::clone(&fs), &path, record(98_332)).unwrap();
    assert_eq!(file.next_offset(), 98_332);
    fault.crash(CrashMode::DropAll);
    assert_eq!(fault.contents(&path).unwrap().len(), 256);
    assert_eq!(
        found(fs.as_ref(), &path),
        Some((record(98_332), RecordLayout::Fixed))
    );
}

#[test]
fn advance_rewrites_the_record_in_place_and_is_durable_on_return() {
    let (fault, fs, path) = setup();
    let mut file = CursorFile::anchor(Arc::clone(&fs), &path, record(0)).unwrap();
    for next in [10, 4_096, 1 << 40] {
        file.advance(next).unwrap();
    }
    fault.crash(CrashMode::DropAll);
    assert_eq!(
        found(fs.as_ref(), &path),
        Some((record(1 << 40), RecordLayout::Fixed))
    );
}

#[test]
fn a_crash_during_an_advance_leaves_the_old_or_the_new_position_or_a_detected_corruption() {
    for seed in 0..512u64 {
        let (fault, fs, path) = setup();
        let mut file = CursorFile::anchor(Arc::clone(&fs), &path, record(1_999)).unwrap();
        // Die right after the write reached the page cache, before fdatasync.
        fault.crash_at(2);
        let _ = file.advance(2_000);
        fault.crash(CrashMode::Tear(seed));
        match cursor::load(fs.as_ref(), &path).unwrap() {
            CursorLoad::Found { record: found, .. } => {
                assert!(
                    found == record(1_999) || found == record(2_000),
                    "seed {seed}: a torn record parsed as {found:?}"
                );
            }
            CursorLoad::Corrupt { .. } => {}
            CursorLoad::Missing => panic!("seed {seed}: the anchored file vanished"),
        }
    }
}

#[test]
fn an_fsync_error_is_not_retried_on_the_same_handle() {
    let (fault, fs, path) = setup();
    let mut file = CursorFile::anchor(Arc::clone(&fs), &path, record(5)).unwrap();
    fault.inject(FaultOp::SyncData, 1, Fault::Eio);
    assert!(file.advance(6).is_err());
    // The failed advance did not move the position in memory.
    assert_eq!(file.next_offset(), 5);
    // The next advance goes through a fresh file (atomic replace), and is durable.
    file.advance(7).unwrap();
    fault.crash(CrashMode::DropAll);
    assert_eq!(
        found(fs.as_ref(), &path),
        Some((record(7), RecordLayout::Fixed))
    );
}

#[test]
fn an_unsynced_advance_is_read_at_once_and_a_power_loss_leaves_the_last_synced_position() {
    let (fault, fs, path) = setup();
    let mut file = CursorFile::anchor(Arc::clone(&fs), &path, record(100)).unwrap();
    for next in [200, 300, 400] {
        file.advance_unsynced(next).unwrap();
        // A reader of the file (a restart after the process died, a move, the stats handler)
        // sees the written position.
        assert_eq!(
            found(fs.as_ref(), &path).map(|(r, _)| r),
            Some(record(next))
        );
    }
    assert_eq!((file.next_offset(), file.durable_offset()), (400, 100));
    fault.crash(CrashMode::DropAll);
    // The power loss kept the last synced position: behind what was written, never ahead.
    assert_eq!(
        found(fs.as_ref(), &path),
        Some((record(100), RecordLayout::Fixed))
    );
}

#[test]
fn a_sync_makes_every_unsynced_advance_before_it_durable_and_an_advance_does_too() {
    let (fault, fs, path) = setup();
    let mut file = CursorFile::anchor(Arc::clone(&fs), &path, record(0)).unwrap();
    file.advance_unsynced(10).unwrap();
    file.advance_unsynced(20).unwrap();
    file.sync().unwrap();
    assert_eq!(file.durable_offset(), 20);
    // Nothing written since: no second fdatasync.
    let ops = fault.op_count();
    file.sync().unwrap();
    assert_eq!(fault.op_count(), ops);
    fault.crash(CrashMode::DropAll);
    assert_eq!(found(fs.as_ref(), &path).map(|(r, _)| r), Some(record(20)));

    let mut file =
        CursorFile::resume(Arc::clone(&fs), &path, record(20), RecordLayout::Fixed).unwrap();
    file.advance_unsynced(30).unwrap();
    file.advance(40).unwrap();
    assert_eq!(file.durable_offset(), 40);
    fault.crash(CrashMode::DropAll);
    assert_eq!(found(fs.as_ref(), &path).map(|(r, _)| r), Some(record(40)));
}

#[test]
fn a_failed_sync_after_unsynced_advances_keeps_the_durable_position_and_the_next_sync_replaces_the_file()
 {
    let (fault, fs, path) = setup();
    let mut file = CursorFile::anchor(Arc::clone(&fs), &path, record(5)).unwrap();
    file.advance_unsynced(6).unwrap();
    fault.inject(FaultOp::SyncData, 1, Fault::Eio);
    assert!(file.sync().is_err());
    assert_eq!((file.next_offset(), file.durable_offset()), (6, 5));
    // The handle whose sync failed is not trusted again: the next sync writes a fresh file.
    file.sync().unwrap();
    assert_eq!(file.durable_offset(), 6);
    fault.crash(CrashMode::DropAll);
    assert_eq!(
        found(fs.as_ref(), &path),
        Some((record(6), RecordLayout::Fixed))
    );
}

#[test]
fn an_older_format_file_is_read_and_migrated_on_resume() {
    let (fault, fs, path) = setup();
    let legacy = format!("{{\"epoch\":\"{EPOCH}\",\"next_offset\":77}}\n");
    let handle = fs.open(&path, OpenMode::CreateReadWrite).unwrap();
    handle.write_all_at(legacy.as_bytes(), 0).unwrap();
    handle.sync_data().unwrap();
    drop(handle);
    fs.sync_dir(path.parent().unwrap()).unwrap();

    let (found_record, layout) = found(fs.as_ref(), &path).unwrap();
    assert_eq!(
        (found_record.clone(), layout),
        (record(77), RecordLayout::Legacy)
    );
    let mut file = CursorFile::resume(Arc::clone(&fs), &path, found_record, layout).unwrap();
    assert_eq!(
        fault.contents(&path).unwrap().len(),
        256,
        "migrated to the fixed format at once"
    );
    file.advance(78).unwrap();
    fault.crash(CrashMode::DropAll);
    assert_eq!(
        found(fs.as_ref(), &path),
        Some((record(78), RecordLayout::Fixed))
    );
}

#[test]
fn a_corrupt_record_is_reported_after_rereads_not_parsed() {
    let (_fault, fs, path) = setup();
    CursorFile::anchor(Arc::clone(&fs), &path, record(123)).unwrap();
    let handle = fs.open(&path, OpenMode::ReadWrite).unwrap();
    handle.write_all_at(b"9", 60).unwrap();
    assert!(matches!(
        cursor::load(fs.as_ref(), &path).unwrap(),
        CursorLoad::Corrupt { .. }
    ));
}

#[test]
fn a_missing_file_is_missing_and_removal_is_idempotent() {
    let (_fault, fs, path) = setup();
    assert_eq!(
        cursor::load(fs.as_ref(), &path).unwrap(),
        CursorLoad::Missing
    );
    CursorFile::anchor(Arc::clone(&fs), &path, record(1)).unwrap();
    cursor::remove(fs.as_ref(), &path).unwrap();
    cursor::remove(fs.as_ref(), &path).unwrap();
    assert_eq!(
        cursor::load(fs.as_ref(), &path).unwrap(),
        CursorLoad::Missing
    );
}

#[test]
fn an_epoch_too_long_to_pad_is_replaced_atomically_each_time() {
    let (fault, fs, path) = setup();
    let long = CursorRecord {
        epoch: "e".repeat(400),
        next_offset: 1,
    };
    let mut file = CursorFile::anchor(Arc::clone(&fs), &path, long.clone()).unwrap();
    file.advance(2).unwrap();
    fault.crash(CrashMode::DropAll);
    let (got, layout) = found(fs.as_ref(), &path).unwrap();
    assert_eq!(layout, RecordLayout::Long);
    assert_eq!(got.next_offset, 2);
    assert_eq!(got.epoch, long.epoch);
}

#[test]
fn cursor_children_are_listed_from_the_partition_directory() {
    let (_fault, fs, path) = setup();
    CursorFile::anchor(Arc::clone(&fs), &path, record(1)).unwrap();
    let other = path.with_file_name(cursor::cursor_file_name("retry"));
    CursorFile::anchor(Arc::clone(&fs), &other, record(1)).unwrap();
    let mut children = cursor::list_cursor_children(fs.as_ref(), path.parent().unwrap()).unwrap();
    children.sort();
    assert_eq!(children, vec!["analytics".to_string(), "retry".to_string()]);
}
