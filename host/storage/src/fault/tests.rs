use super::*;

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn setup() -> FaultFs {
    let fs = FaultFs::new();
    fs.create_dir_all(&p("/d")).unwrap();
    fs.sync_dir(&p("/")).unwrap();
    fs
}

#[test]
fn synced_writes_survive_a_crash_and_unsynced_ones_can_be_dropped() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    fs.sync_dir(&p("/d")).unwrap();
    f.write_all_at(b"hello", 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b" world", 5).unwrap();
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"hello world");
    fs.crash(CrashMode::DropAll);
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"hello");
    assert!(f.read_at(&mut [0; 4], 0).is_err(), "old handles die");
}

#[test]
fn a_hard_link_shares_the_bytes_and_is_lost_by_a_crash_until_its_directory_is_synced() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(&p("/d")).unwrap();
    fs.hard_link(&p("/d/a"), &p("/d/b")).unwrap();
    let e = fs.hard_link(&p("/d/a"), &p("/d/b")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    // Same inode: a write through one name is seen through the other.
    f.write_all_at(b"xyz", 0).unwrap();
    assert_eq!(fs.contents(&p("/d/b")).unwrap(), b"xyz");
    fs.crash(CrashMode::DropAll);
    assert!(!fs.exists(&p("/d/b")).unwrap());
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"abc");

    fs.hard_link(&p("/d/a"), &p("/d/b")).unwrap();
    fs.sync_dir(&p("/d")).unwrap();
    fs.crash(CrashMode::DropAll);
    assert_eq!(fs.contents(&p("/d/b")).unwrap(), b"abc");
}

#[test]
fn keep_all_keeps_unsynced_writes_and_entries() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    fs.crash(CrashMode::KeepAll);
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"abc");
}

#[test]
fn a_file_whose_directory_entry_was_not_synced_vanishes_on_drop() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    f.sync_data().unwrap();
    fs.crash(CrashMode::DropAll);
    assert!(!fs.exists(&p("/d/a")).unwrap());
}

#[test]
fn a_failed_fsync_forgets_the_pending_writes_though_they_stay_readable() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    fs.sync_dir(&p("/d")).unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    fs.inject(FaultOp::SyncData, 1, Fault::Eio);
    assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(EIO));
    // A later sync succeeds but cannot bring the lost pages back.
    f.sync_data().unwrap();
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"abc");
    fs.crash(CrashMode::KeepAll);
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"");
}

#[test]
fn forgotten_writes_stay_in_the_cache_until_it_is_dropped() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    fs.sync_dir(&p("/d")).unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b"def", 3).unwrap();
    fs.inject(FaultOp::SyncData, 1, Fault::LostWrite);
    f.sync_data().unwrap();
    f.write_all_at(b"g", 6).unwrap();
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"abcdefg");
    // The device: "def" never arrived (zeros), the dirty "g" is still to be written.
    let mut dev = [0u8; 7];
    f.read_exact_uncached_at(&mut dev, 0).unwrap();
    assert_eq!(&dev, b"abc\0\0\0g");
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"abcdefg");
    f.drop_cache().unwrap();
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"abc\0\0\0g");
    assert!(f.read_exact_uncached_at(&mut [0; 2], 6).is_err());
}

#[test]
fn a_short_write_stores_half_and_write_all_finishes_it() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    fs.inject(FaultOp::Write, 1, Fault::ShortWrite);
    assert_eq!(f.write_at(b"abcd", 0).unwrap(), 2);
    fs.inject(FaultOp::Write, 1, Fault::ShortWrite);
    f.write_all_at(b"wxyz", 0).unwrap();
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"wxyz");
}

#[test]
fn crash_at_fails_that_operation_and_all_later_ones() {
    let fs = setup();
    let f = fs.open(&p("/d/a"), OpenMode::CreateNew).unwrap();
    fs.crash_at(2);
    f.write_all_at(b"a", 0).unwrap();
    assert!(f.write_all_at(b"b", 1).is_err());
    assert!(fs.is_crashed());
    assert!(f.sync_data().is_err());
    // The write before the crash point may reach the disk; the failed one never does.
    fs.crash(CrashMode::KeepAll);
    assert_eq!(fs.contents(&p("/d/a")).unwrap(), b"a");
}

#[test]
fn renamed_directories_take_their_contents_along() {
    let fs = setup();
    fs.create_dir_all(&p("/d/x/y")).unwrap();
    let f = fs.open(&p("/d/x/y/f"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"1", 0).unwrap();
    fs.rename(&p("/d/x"), &p("/d/z")).unwrap();
    assert_eq!(fs.contents(&p("/d/z/y/f")).unwrap(), b"1");
    assert!(!fs.exists(&p("/d/x")).unwrap());
}

#[test]
fn the_lock_is_exclusive_until_dropped() {
    let fs = setup();
    let g = fs.try_lock_exclusive(&p("/d/LOCK")).unwrap();
    assert_eq!(
        fs.try_lock_exclusive(&p("/d/LOCK")).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    drop(g);
    fs.try_lock_exclusive(&p("/d/LOCK")).unwrap();
}
