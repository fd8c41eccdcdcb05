//! I/O failures and crashes through the fault file system: an fsync error never passes for
//! success, a failed append leaves the log usable, and a crash at any operation keeps every
//! acknowledged record, exactly once and in order.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use narad_storage::fault::{CrashMode, Fault, FaultFs, FaultOp};
use narad_storage::fs::FileSystem;
use narad_storage::log::segment;
use narad_storage::{Failure, ManualClock, PartitionState, StorageError, Store};

const DATA: &str = "/data";
/// Linux `EIO`, what `Fault::Eio` fails an operation with.
const EIO: i32 = 5;

fn fault_fs() -> FaultFs {
    let fs = FaultFs::new();
    fs.create_dir_all(Path::new(DATA)).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    fs
}

fn open(fs: &FaultFs) -> narad_storage::Result<Store> {
    Store::open(
        Path::new(DATA),
        opts(Arc::new(fs.clone()), Arc::new(ManualClock::new(T0_MS))),
    )
}

fn open_partition(fs: &FaultFs) -> Store {
    let store = open(fs).unwrap();
    store
        .create_partition(&pid("t", 0), small_segments(300))
        .unwrap();
    store
}

fn append_values(store: &Store, vals: &[&str]) -> narad_storage::Result<u64> {
    store
        .append(&pid("t", 0), batch(vals))
        .map(|a| a.base_offset)
}

#[test]
fn an_fsync_error_fails_the_append_and_later_appends_succeed_after_truncating_back() {
    let fs = fault_fs();
    let store = open_partition(&fs);
    for v in ["a", "b", "c"] {
        append_values(&store, &[v]).unwrap();
    }
    fs.inject(FaultOp::SyncData, 1, Fault::Eio);
    match append_values(&store, &["lost"]) {
        Err(StorageError::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(5)),
        other => panic!("expected an I/O error, got {other:?}"),
    }
    // The failed batch is invisible, the acknowledged ones are intact.
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b", "c"]);
    assert_eq!(append_values(&store, &["d"]).unwrap(), 3);
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["a", "b", "c", "d"]
    );

    // After a power loss the disk holds exactly what was acknowledged: had the log retried
    // the fsync on the old handle, the forgotten pages would surface here as a hole.
    drop(store);
    fs.crash(CrashMode::KeepAll);
    let store = open_partition(&fs);
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["a", "b", "c", "d"]
    );
}

#[test]
fn a_short_write_is_completed_and_the_append_succeeds() {
    let fs = fault_fs();
    let store = open_partition(&fs);
    append_values(&store, &["a"]).unwrap();
    fs.inject(FaultOp::Write, 1, Fault::ShortWrite);
    assert_eq!(append_values(&store, &["b", "c"]).unwrap(), 1);
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b", "c"]);
}

#[test]
fn a_full_disk_fails_the_append_without_damaging_the_log() {
    let fs = fault_fs();
    let store = open_partition(&fs);
    append_values(&store, &["a"]).unwrap();
    // Half the frame lands, then the disk is full.
    fs.inject(FaultOp::Write, 1, Fault::ShortWrite);
    fs.inject(FaultOp::Write, 2, Fault::Enospc);
    match append_values(&store, &["big"]) {
        Err(StorageError::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::StorageFull)
        }
        other => panic!("expected ENOSPC, got {other:?}"),
    }
    assert_eq!(append_values(&store, &["b"]).unwrap(), 1);
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_partition(&fs);
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b"]);
}

#[test]
fn enospc_on_fsync_is_handled_like_any_fsync_error() {
    let fs = fault_fs();
    let store = open_partition(&fs);
    append_values(&store, &["a"]).unwrap();
    fs.inject(FaultOp::SyncData, 1, Fault::Enospc);
    assert!(append_values(&store, &["x"]).is_err());
    assert_eq!(append_values(&store, &["b"]).unwrap(), 1);
    drop(store);
    fs.crash(CrashMode::KeepAll);
    let store = open_partition(&fs);
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b"]);
}

/// Fails partition t/0 of a store that reopens a failed partition on its first use
/// `reopen_after` later: "a" is acknowledged, then the append of "x" fails, and so does
/// truncating back.
fn fail_partition(fs: &FaultFs, reopen_after: Duration) -> Store {
    let store = Store::open(
        Path::new(DATA),
        narad_storage::StoreOptions {
            failed_reopen_after: reopen_after,
            ..opts(Arc::new(fs.clone()), Arc::new(ManualClock::new(T0_MS)))
        },
    )
    .unwrap();
    store
        .create_partition(&pid("t", 0), small_segments(300))
        .unwrap();
    append_values(&store, &["a"]).unwrap();
    // The append's fsync fails, and so does the fsync after truncating back.
    fs.inject(FaultOp::SyncData, 1, Fault::Eio);
    fs.inject(FaultOp::SyncData, 2, Fault::Eio);
    let reason = match append_values(&store, &["x"]) {
        Err(StorageError::Failed { reason, .. }) => *reason,
        other => panic!("expected Failed, got {other:?}"),
    };
    match &reason {
        Failure::UndoFailed {
            segment,
            durable_len,
            append_error,
            recovery_error,
        } => {
            assert_eq!(
                segment,
                &Path::new(DATA)
                    .join("topics/t/p00000")
                    .join(segment::segment_name(0))
            );
            assert!(*durable_len > 0, "the frame of \"a\" is durable");
            assert_eq!(append_error.get().raw_os_error(), Some(EIO));
            assert_eq!(recovery_error.get().raw_os_error(), Some(EIO));
        }
        other => panic!("expected a failed undo, got {other:?}"),
    }
    assert_eq!(
        store.peek(&pid("t", 0)).unwrap().state,
        PartitionState::Failed { reason }
    );
    store
}

#[test]
fn a_partition_whose_truncate_back_also_fails_stops_and_recovers_on_restart() {
    let fs = fault_fs();
    let store = fail_partition(&fs, Duration::from_secs(3600));
    // Within its wait, it stays failed.
    assert!(matches!(
        append_values(&store, &["y"]),
        Err(StorageError::Failed { .. })
    ));
    drop(store);
    fs.crash(CrashMode::KeepAll);
    let store = open_partition(&fs);
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a"]);
    assert_eq!(append_values(&store, &["b"]).unwrap(), 1);
}

#[test]
fn a_failed_partition_is_reopened_on_its_next_use_once_its_wait_is_over() {
    let fs = fault_fs();
    let store = fail_partition(&fs, Duration::ZERO);
    // The wait is zero: the next read runs recovery in place of a restart.
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a"]);
    assert!(!matches!(
        store.peek(&pid("t", 0)).unwrap().state,
        PartitionState::Failed { .. }
    ));
    // The failed batch's offset is reused; nothing acknowledged is lost or doubled.
    assert_eq!(append_values(&store, &["b"]).unwrap(), 1);
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b"]);
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_partition(&fs);
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b"]);
}

#[test]
fn a_partition_that_fails_again_on_reopen_stays_unusable_and_loses_nothing() {
    let fs = fault_fs();
    let store = fail_partition(&fs, Duration::ZERO);
    // The disk is still failing when the reopen runs recovery.
    fs.inject(FaultOp::SyncData, 1, Fault::Eio);
    let failed_again = store.read(&pid("t", 0), &read_from(0));
    assert!(
        matches!(&failed_again, Err(StorageError::Io { source, .. }) if source.raw_os_error() == Some(5)),
        "{failed_again:?}"
    );
    // Once the disk is back, the next use reopens and serves what was acknowledged.
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a"]);
    assert_eq!(append_values(&store, &["b"]).unwrap(), 1);
}

#[tokio::test]
async fn a_long_poll_on_a_failed_partition_reopens_it_once_its_wait_is_over() {
    let fs = fault_fs();
    let store = fail_partition(&fs, Duration::ZERO);
    // Offset 0 exists ("a"): the reopened partition answers at once instead of an error.
    let ready = store
        .wait_for_data(&pid("t", 0), 0, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(ready);
}

#[test]
fn a_failed_directory_sync_at_segment_roll_fails_the_append_and_the_next_one_rolls() {
    let fs = fault_fs();
    let store = open_partition(&fs);
    let big = "v".repeat(200);
    append_values(&store, &[&big]).unwrap();
    fs.inject(FaultOp::SyncDir, 1, Fault::Eio);
    assert!(append_values(&store, &[&big]).is_err());
    assert_eq!(append_values(&store, &[&big]).unwrap(), 1);
    assert_eq!(store.peek(&pid("t", 0)).unwrap().segment_count, 2);
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_partition(&fs);
    assert_eq!(read_all(&store, &pid("t", 0), 0).len(), 2);
}

/// The workload of the crash sweep: two sessions (the first closed cleanly), small segments so
/// it rolls, batches of one to three records. Returns the acknowledged values in order and
/// the batch that was in flight when the crash hit, if any.
fn workload(fs: &FaultFs) -> (Vec<String>, Option<Vec<String>>) {
    let mut acked = Vec::new();
    let batches: Vec<Vec<String>> = (0..8)
        .map(|b| {
            (0..(b % 3 + 1))
                .map(|r| format!("b{b}r{r}-{}", "x".repeat(40 + b * 10)))
                .collect()
        })
        .collect();
    let mut next = 0;
    for session in 0..2 {
        let Ok(store) = open(fs) else {
            return (acked, None);
        };
        if store
            .create_partition(&pid("t", 0), small_segments(300))
            .is_err()
        {
            return (acked, None);
        }
        let end = if session == 0 { 4 } else { batches.len() };
        while next < end {
            let refs: Vec<&str> = batches[next].iter().map(String::as_str).collect();
            match append_values(&store, &refs) {
                Ok(_) => acked.extend(batches[next].iter().cloned()),
                Err(_) => return (acked, Some(batches[next].clone())),
            }
            next += 1;
        }
        if store.close().is_err() {
            return (acked, None);
        }
    }
    (acked, None)
}

#[test]
fn a_crash_at_any_operation_keeps_every_acknowledged_record_exactly_once_in_order() {
    let total_ops = {
        let fs = fault_fs();
        let setup_ops = fs.op_count();
        let (acked, _) = workload(&fs);
        assert_eq!(acked.len(), 15, "the dry run acknowledges everything");
        fs.op_count() - setup_ops
    };
    assert!(
        total_ops > 30,
        "the workload does real I/O ({total_ops} ops)"
    );
    let mut crashes = 0;
    for n in 1..=total_ops {
        for (k, mode) in [
            CrashMode::KeepAll,
            CrashMode::DropAll,
            CrashMode::Tear(n * 7919 + 1),
            CrashMode::Tear(n * 104_729 + 2),
        ]
        .into_iter()
        .enumerate()
        {
            let fs = fault_fs();
            fs.crash_at(n);
            let (acked, in_flight) = workload(&fs);
            assert!(fs.is_crashed(), "op {n} of {total_ops} was reached");
            crashes += 1;
            fs.crash(mode);

            let store = open(&fs).unwrap_or_else(|e| panic!("reopen after crash at {n}: {e}"));
            store
                .create_partition(&pid("t", 0), small_segments(300))
                .unwrap();
            let got = match store.read(&pid("t", 0), &read_from(0)) {
                Ok(_) => values(&read_all(&store, &pid("t", 0), 0)),
                Err(e) => panic!("crash at op {n}, mode {k}: {e}"),
            };
            assert!(
                got.len() >= acked.len() && got[..acked.len()] == acked[..],
                "crash at op {n}, mode {mode:?}: acknowledged {acked:?}, found {got:?}"
            );
            let extra = &got[acked.len()..];
            assert!(
                extra.is_empty() || Some(extra.to_vec()) == in_flight,
                "crash at op {n}, mode {mode:?}: only the in-flight batch may appear, whole; found {extra:?}"
            );
            let next = append_values(&store, &["after"]).unwrap();
            assert_eq!(next as usize, got.len());
            assert_eq!(values(&read_all(&store, &pid("t", 0), next)), ["after"]);
        }
    }
    assert_eq!(crashes, total_ops * 4);
}

#[test]
fn a_crash_while_deleting_a_topic_leaves_it_whole_or_gone() {
    let setup = |fs: &FaultFs| {
        let store = open(fs).unwrap();
        for p in 0..2 {
            store
                .create_partition(&pid("doomed", p), small_segments(300))
                .unwrap();
            store.append(&pid("doomed", p), batch(&["a", "b"])).unwrap();
        }
        store
    };
    let delete_ops = {
        let fs = fault_fs();
        let store = setup(&fs);
        let before = fs.op_count();
        store.delete_topic("doomed").unwrap();
        fs.op_count() - before
    };
    assert!(delete_ops >= 3, "rename, directory syncs and removal");
    for n in 1..=delete_ops {
        for mode in [CrashMode::KeepAll, CrashMode::DropAll, CrashMode::Tear(n)] {
            let fs = fault_fs();
            let store = setup(&fs);
            fs.crash_at(n);
            assert!(store.delete_topic("doomed").is_err());
            drop(store);
            fs.crash(mode);

            let store = open(&fs).unwrap();
            let topic_dir = Path::new(DATA).join("topics/doomed");
            if fs.exists(&topic_dir).unwrap() {
                for p in 0..2 {
                    store
                        .create_partition(&pid("doomed", p), small_segments(300))
                        .unwrap();
                    assert_eq!(
                        values(&read_all(&store, &pid("doomed", p), 0)),
                        ["a", "b"],
                        "crash at delete op {n}, {mode:?}: a topic still in place is whole"
                    );
                }
            }
            assert!(
                fs.read_dir(&Path::new(DATA).join("trash"))
                    .unwrap()
                    .is_empty(),
                "the trash is emptied at start-up"
            );
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Append { partition: u32, records: usize },
    IdleClose,
    Restart { clean: bool },
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0u32..2, 1usize..4).prop_map(|(partition, records)| Step::Append { partition, records }),
        1 => Just(Step::IdleClose),
        1 => any::<bool>().prop_map(|clean| Step::Restart { clean }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]

    /// Random workloads over two partitions with idle closes and restarts, crashed at a random
    /// operation with a random crash mode: every acknowledged record survives, in order, once.
    #[test]
    fn random_workloads_crashed_anywhere_keep_every_acknowledged_record(
        steps in proptest::collection::vec(step(), 1..25),
        crash_at in 1u64..150,
        mode in 0u8..3,
        seed in proptest::prelude::any::<u64>(),
    ) {
        let fs = fault_fs();
        let clock = Arc::new(ManualClock::new(T0_MS));
        let open_store = |fs: &FaultFs| -> narad_storage::Result<Store> {
            let store = Store::open(Path::new(DATA), opts(Arc::new(fs.clone()), clock.clone()))?;
            for p in 0..2 {
                store.create_partition(&pid("t", p), small_segments(250))?;
            }
            Ok(store)
        };
        let mut acked: [Vec<String>; 2] = [Vec::new(), Vec::new()];
        let mut in_flight: [Option<Vec<String>>; 2] = [None, None];
        fs.crash_at(crash_at);
        let mut counter = 0;
        'run: {
            let Ok(mut store) = open_store(&fs) else { break 'run };
            for s in &steps {
                match s {
                    Step::Append { partition, records } => {
                        let vals: Vec<String> = (0..*records).map(|_| { counter += 1; format!("v{counter}-{}", "x".repeat(counter % 60)) }).collect();
                        let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
                        let p = *partition as usize;
                        match store.append(&pid("t", *partition), batch(&refs)) {
                            Ok(_) => acked[p].extend(vals),
                            Err(_) => { in_flight[p] = Some(vals); break 'run; }
                        }
                    }
                    Step::IdleClose => {
                        clock.advance(120_000);
                        store.close_idle();
                        if fs.is_crashed() { break 'run; }
                    }
                    Step::Restart { clean } => {
                        if *clean && store.close().is_err() { break 'run; }
                        drop(store);
                        let Ok(s) = open_store(&fs) else { break 'run };
                        store = s;
                    }
                }
            }
        }
        fs.crash(match mode {
            0 => CrashMode::KeepAll,
            1 => CrashMode::DropAll,
            _ => CrashMode::Tear(seed),
        });
        let store = open_store(&fs).unwrap();
        for p in 0..2u32 {
            let got = values(&read_all(&store, &pid("t", p), 0));
            let want = &acked[p as usize];
            proptest::prop_assert!(got.len() >= want.len() && got[..want.len()] == want[..],
                "partition {}: acknowledged {:?}, found {:?}", p, want, got);
            let extra = &got[want.len()..];
            proptest::prop_assert!(extra.is_empty() || Some(extra.to_vec()) == in_flight[p as usize],
                "partition {}: unexpected extra records {:?}", p, extra);
            store.append(&pid("t", p), batch(&["after"])).unwrap();
        }
    }
}

/// A store over `fs` whose failed partitions reopen on their next use, with partition t/0.
fn reopening_store(fs: &FaultFs) -> Store {
    let store = Store::open(
        Path::new(DATA),
        narad_storage::StoreOptions {
            failed_reopen_after: Duration::ZERO,
            ..opts(Arc::new(fs.clone()), Arc::new(ManualClock::new(T0_MS)))
        },
    )
    .unwrap();
    store
        .create_partition(&pid("t", 0), small_segments(300))
        .unwrap();
    store
}

#[test]
fn a_reopened_partition_reads_its_tail_from_the_device_not_from_a_cache_holding_a_lost_write() {
    let fs = fault_fs();
    let store = reopening_store(&fs);
    append_values(&store, &["a"]).unwrap();
    // The fdatasync of "x" fails (the disk forgets the write; the page cache keeps it), and
    // truncating it back fails too (operations: write 1, sync 2, truncate 3): the partition
    // fails with the lost frame still readable from the cache.
    fs.inject(FaultOp::SyncData, 1, Fault::Eio);
    fs.inject(FaultOp::Any, 3, Fault::Eio);
    assert!(matches!(
        append_values(&store, &["x"]),
        Err(StorageError::Failed { .. })
    ));
    // The reopen must see what the device holds: "x" was never acknowledged and is not there.
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a"]);
    assert_eq!(append_values(&store, &["b"]).unwrap(), 1);
    drop(store);
    fs.crash(CrashMode::KeepAll);
    let store = open_partition(&fs);
    // Had the reopen trusted the cache, the boundary would lie past "x", and the zeros the
    // device holds there would quarantine the partition, losing the acknowledged "b".
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b"]);
}

#[test]
fn an_fdatasync_that_reports_success_for_bytes_the_device_lost_acknowledges_nothing() {
    let fs = fault_fs();
    let store = open_partition(&fs);
    append_values(&store, &["a"]).unwrap();
    fs.inject(FaultOp::SyncData, 1, Fault::LostWrite);
    match append_values(&store, &["x"]) {
        Err(StorageError::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidData)
        }
        other => panic!("expected the read-back from the device to fail, got {other:?}"),
    }
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a"]);
    assert_eq!(append_values(&store, &["b"]).unwrap(), 1);
    drop(store);
    fs.crash(CrashMode::KeepAll);
    let store = open_partition(&fs);
    assert_eq!(values(&read_all(&store, &pid("t", 0), 0)), ["a", "b"]);
}

/// splitmix64, so each seed of the sweep below is one reproducible run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

#[test]
fn seeded_io_faults_with_reopens_and_a_crash_keep_every_acknowledged_record() {
    const SEEDS: u64 = 300;
    const APPENDS: usize = 40;
    let ops = [
        FaultOp::Write,
        FaultOp::SyncData,
        FaultOp::SyncDir,
        FaultOp::Any,
    ];
    let faults = [
        Fault::Eio,
        Fault::Enospc,
        Fault::ShortWrite,
        Fault::LostWrite,
    ];
    let mut failures_seen = 0;
    for seed in 0..SEEDS {
        let mut rng = Rng(seed);
        let fs = fault_fs();
        let store = reopening_store(&fs);
        // The first append opens the log (writing its log-start file) before any fault: this
        // sweep is about appends, failures and reopens.
        let mut acked = vec![format!("s{seed}-first")];
        append_values(&store, &[&acked[0]]).unwrap();
        let mut failed: HashSet<String> = HashSet::new();
        for i in 0..APPENDS {
            if rng.below(3) == 0 {
                let op = ops[rng.below(4) as usize];
                let fault = faults[rng.below(4) as usize];
                fs.inject(op, rng.below(4) + 1, fault);
            }
            let vals: Vec<String> = (0..=rng.below(2))
                .map(|r| format!("s{seed}a{i}r{r}-{}", "x".repeat(rng.below(80) as usize)))
                .collect();
            let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
            match append_values(&store, &refs) {
                Ok(_) => acked.extend(vals),
                Err(StorageError::Quarantined { reason, .. }) => {
                    panic!("seed {seed}, append {i}: quarantined: {reason}")
                }
                Err(_) => {
                    failures_seen += 1;
                    failed.extend(vals);
                }
            }
        }
        fs.clear_faults();
        let check = |store: &Store, when: &str| {
            if let Err(e) = store.read(&pid("t", 0), &read_from(0)) {
                panic!("seed {seed}, {when}: reading fails: {e}");
            }
            let got = values(&read_all(store, &pid("t", 0), 0));
            let kept: Vec<&String> = got.iter().filter(|v| !failed.contains(*v)).collect();
            let want: Vec<&String> = acked.iter().collect();
            assert_eq!(kept, want, "seed {seed}, {when}: acknowledged records");
            let distinct: HashSet<&String> = got.iter().collect();
            assert_eq!(
                distinct.len(),
                got.len(),
                "seed {seed}, {when}: a record twice"
            );
        };
        check(&store, "before the crash");
        drop(store);
        fs.crash(match seed % 3 {
            0 => CrashMode::KeepAll,
            1 => CrashMode::DropAll,
            _ => CrashMode::Tear(seed),
        });
        let store = open_partition(&fs);
        check(&store, "after the crash");
        assert!(
            !matches!(
                store.peek(&pid("t", 0)).unwrap().state,
                PartitionState::Quarantined { .. }
            ),
            "seed {seed}: quarantined after the crash"
        );
    }
    assert!(
        failures_seen > SEEDS,
        "the faults fired ({failures_seen} failed appends)"
    );
}

#[test]
fn a_batch_after_a_failed_segment_roll_goes_to_the_new_segment_even_if_it_would_fit_the_old_one() {
    let fs = fault_fs();
    let store = open_partition(&fs);
    let (medium, big) = ("m".repeat(100), "b".repeat(200));
    append_values(&store, &[&medium]).unwrap();
    // The roll for the big batch creates segment 1, but its directory sync fails.
    fs.inject(FaultOp::SyncDir, 1, Fault::Eio);
    assert!(append_values(&store, &[&big]).is_err());
    // A small batch would fit the old segment; it must go to segment 1 all the same, or that
    // file (whose entry a later directory sync makes durable) would claim offset 1 while the
    // old segment holds it, and the next open would quarantine the partition.
    assert_eq!(append_values(&store, &["s"]).unwrap(), 1);
    assert_eq!(append_values(&store, &[&big]).unwrap(), 2);
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_partition(&fs);
    let read = store
        .read(&pid("t", 0), &read_from(0))
        .map(|r| values(&r.records));
    assert_eq!(
        read.map_err(|e| e.to_string()),
        Ok(vec![medium.clone(), "s".into(), big.clone()])
    );
}
