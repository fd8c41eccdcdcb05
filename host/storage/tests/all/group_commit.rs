//! Group commit: appends to one partition that arrive while another append holds its produce
//! lock are written together by the next holder, with one `fdatasync`. Each gets its own
//! offsets in queue order; a failed sync acknowledges none of the group; a crash at any
//! operation of concurrent appenders keeps every acknowledged record exactly once, in each
//! appender's order.

use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use narad_storage::fault::{CrashMode, Fault, FaultFs, FaultOp};
use narad_storage::fs::FileSystem;
use narad_storage::{AppendStats, EncodedBatch, Store};

const DATA: &str = "/data";
/// Bound on every wait for another thread: only reached when the code under test hangs.
const HANG: Duration = Duration::from_secs(20);

fn fault_fs() -> FaultFs {
    let fs = FaultFs::new();
    fs.create_dir_all(Path::new(DATA)).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    fs
}

/// Appends `value` on a thread of its own.
fn append_on_thread(
    store: &Arc<Store>,
    value: &'static str,
) -> thread::JoinHandle<narad_storage::Result<u64>> {
    let store = Arc::clone(store);
    thread::spawn(move || {
        store
            .append(&pid("t", 0), batch(&[value]))
            .map(|a| a.base_offset)
    })
}

/// Waits until `n` appends are queued behind the produce lock.
fn wait_for_waiting(store: &Store, n: u64) {
    let until = Instant::now() + HANG;
    while store.append_stats().waiting < n {
        assert!(
            Instant::now() < until,
            "appends never queued: {:?}",
            store.append_stats()
        );
        thread::yield_now();
    }
}

/// Appends a first record, "open": its append opens the log, whose recovery syncs files of
/// its own, so that the next sync is an append's.
fn open_the_log(store: &Store) {
    store.append(&pid("t", 0), batch(&["open"])).unwrap();
}

/// A writes alone and is stopped in its sync, B and C queue behind it, and A is let go.
/// Returns the three threads.
fn line_up_behind_a_sync(
    fs: &FaultFs,
    store: &Arc<Store>,
) -> Vec<thread::JoinHandle<narad_storage::Result<u64>>> {
    let hold = fs.hold_next_sync();
    let a = append_on_thread(store, "a");
    assert!(hold.wait_until_held(HANG), "A never reached its sync");
    let b = append_on_thread(store, "b");
    wait_for_waiting(store, 1);
    let c = append_on_thread(store, "c");
    wait_for_waiting(store, 2);
    hold.release();
    vec![a, b, c]
}

#[test]
fn appends_queued_behind_a_sync_share_the_next_one_and_each_gets_its_own_offsets() {
    let fs = fault_fs();
    let store = Arc::new(open_t0_on(&fs).unwrap());
    open_the_log(&store);
    let threads = line_up_behind_a_sync(&fs, &store);
    // The "open" record's append synced alone.
    let before = AppendStats {
        appends: 1,
        syncs: 1,
        waiting: 0,
    };
    let offsets: Vec<u64> = threads
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    assert_eq!(
        offsets,
        [1, 2, 3],
        "queue order: A, then B and C as they queued"
    );
    let after = store.append_stats();
    assert_eq!(
        AppendStats {
            appends: after.appends - before.appends,
            syncs: after.syncs - before.syncs,
            waiting: after.waiting,
        },
        AppendStats {
            appends: 3,
            syncs: 2,
            waiting: 0
        },
        "A synced alone, B and C together"
    );
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["open", "a", "b", "c"]
    );

    // Durable as acknowledged: a power cut that keeps only synced state keeps all three.
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_t0_on(&fs).unwrap();
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["open", "a", "b", "c"]
    );
}

#[test]
fn a_failed_sync_of_a_group_acknowledges_none_of_it_and_the_log_goes_on() {
    let fs = fault_fs();
    let store = Arc::new(open_t0_on(&fs).unwrap());
    open_the_log(&store);
    // The first sync from here is A's, the second the group's.
    fs.inject(FaultOp::SyncData, 2, Fault::Eio);
    let answers: Vec<_> = line_up_behind_a_sync(&fs, &store)
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert_eq!(answers[0].as_ref().ok(), Some(&1), "{answers:?}");
    assert!(
        answers[1].is_err() && answers[2].is_err(),
        "both of the group fail with its sync: {answers:?}"
    );
    let next = store
        .append(&pid("t", 0), batch(&["d"]))
        .unwrap()
        .base_offset;
    assert_eq!(next, 2, "the group's offsets were never given out");
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["open", "a", "d"]
    );

    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_t0_on(&fs).unwrap();
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["open", "a", "d"]
    );
}

/// Three appenders, four one-record batches each, on one partition; returns what each had
/// acknowledged when the run ended (by a crash, or complete).
fn concurrent_workload(fs: &FaultFs) -> Vec<Vec<String>> {
    let Ok(store) = open_t0_on(fs) else {
        return vec![Vec::new(); 3];
    };
    let store = Arc::new(store);
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let store = Arc::clone(&store);
            thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..4 {
                    let value = format!("w{t}-{i}-{}", "x".repeat(30 + 10 * i));
                    match store.append(&pid("t", 0), batch(&[&value])) {
                        Ok(_) => acked.push(value),
                        Err(_) => break,
                    }
                }
                acked
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Runs `workload` on a fresh file system that crashes at its n-th operation, for n = 1, 2,
/// ... until a run completes (handing what it acknowledged to `finished`); after each crash
/// (in turn keeping all, dropping all, or tearing unsynced writes), `check` gets the crash's
/// description, what the run acknowledged and the values of `t/0` after a reopen. Returns how
/// many runs crashed.
fn crash_at_every_operation<A>(
    workload: impl Fn(&FaultFs) -> A,
    finished: impl Fn(&A),
    check: impl Fn(&str, &A, Vec<String>),
) -> u64 {
    let mut n = 1;
    loop {
        assert!(
            n < 2_000,
            "the workload never finished before the crash point"
        );
        let mode = match n % 3 {
            0 => CrashMode::KeepAll,
            1 => CrashMode::DropAll,
            _ => CrashMode::Tear(n * 7919 + 3),
        };
        let fs = fault_fs();
        fs.crash_at(n);
        let acked = workload(&fs);
        if !fs.is_crashed() {
            finished(&acked);
            return n - 1;
        }
        fs.crash(mode);
        let store = open_t0_on(&fs).unwrap_or_else(|e| panic!("reopen after a crash at {n}: {e}"));
        let got = values(&read_all(&store, &pid("t", 0), 0));
        check(&format!("crash at {n}, {mode:?}"), &acked, got);
        n += 1;
    }
}

#[test]
fn a_crash_at_any_operation_of_concurrent_appenders_keeps_every_acknowledged_record_once() {
    let crashed_runs = crash_at_every_operation(
        concurrent_workload,
        |acked| assert_eq!(acked.iter().map(Vec::len).sum::<usize>(), 12),
        |crash, acked, got| {
            let mut seen = std::collections::HashSet::new();
            for v in &got {
                assert!(seen.insert(v), "{crash}: {v} twice in {got:?}");
            }
            for (t, mine) in acked.iter().enumerate() {
                let found: Vec<&String> = got
                    .iter()
                    .filter(|v| v.starts_with(&format!("w{t}-")))
                    .collect();
                assert!(
                    found.len() >= mine.len()
                        && found[..mine.len()].iter().zip(mine).all(|(a, b)| *a == b),
                    "{crash}: writer {t} acknowledged {mine:?}, found {found:?}"
                );
            }
        },
    );
    assert!(crashed_runs > 20, "{crashed_runs} crash points");
}

/// One encoded one-record batch per value, as a fan-out cursor hands a child partition the
/// buckets of consecutive slabs.
fn encoded(values: &[&str]) -> Vec<EncodedBatch> {
    values
        .iter()
        .map(|v| EncodedBatch::encode(&batch(&[v]).records, None).unwrap())
        .collect()
}

#[test]
fn batches_appended_in_order_share_one_sync_and_keep_their_order() {
    let fs = fault_fs();
    let store = open_t0_on(&fs).unwrap();
    open_the_log(&store);
    let before = store.append_stats();
    let mut batches = encoded(&["a", "b", "c"]);
    let appended = store
        .append_encoded_in_order(&pid("t", 0), &mut batches)
        .unwrap();
    let offsets: Vec<u64> = appended.iter().map(|a| a.base_offset).collect();
    assert_eq!(offsets, [1, 2, 3]);
    let after = store.append_stats();
    assert_eq!(
        (after.appends - before.appends, after.syncs - before.syncs),
        (3, 1),
        "three batches, one fdatasync"
    );
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_t0_on(&fs).unwrap();
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["open", "a", "b", "c"],
        "all three were durable when acknowledged"
    );
}

#[test]
fn a_failed_sync_of_batches_in_order_acknowledges_none_and_they_can_be_sent_again() {
    let fs = fault_fs();
    let store = open_t0_on(&fs).unwrap();
    open_the_log(&store);
    fs.inject(FaultOp::SyncData, 1, Fault::Eio);
    let mut batches = encoded(&["a", "b"]);
    let failed = store
        .append_encoded_in_order(&pid("t", 0), &mut batches)
        .unwrap_err();
    assert_eq!(failed.durable, 0, "{failed}");
    // The same batches, unchanged by the failure, go again once the log recovered.
    let appended = store
        .append_encoded_in_order(&pid("t", 0), &mut batches)
        .unwrap();
    assert_eq!(
        appended.iter().map(|a| a.base_offset).collect::<Vec<_>>(),
        [1, 2]
    );
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_t0_on(&fs).unwrap();
    assert_eq!(
        values(&read_all(&store, &pid("t", 0), 0)),
        ["open", "a", "b"]
    );
}

#[test]
fn a_roll_between_batches_in_order_acknowledges_the_first_alone_when_the_second_fails() {
    let fs = fault_fs();
    let store = open_t0_on(&fs).unwrap();
    // Segments so small that every batch rolls to a segment of its own: two runs, two syncs.
    let id = pid("t", 1);
    store.create_partition(&id, small_segments(64)).unwrap();
    store.append(&id, batch(&["open"])).unwrap();
    // The roll syncs the directory (not a data sync); the first run's data sync passes, the
    // second's fails.
    fs.inject(FaultOp::SyncData, 2, Fault::Eio);
    let mut batches = encoded(&["a", "b", "c"]);
    let failed = store
        .append_encoded_in_order(&id, &mut batches)
        .unwrap_err();
    assert_eq!(failed.durable, 1, "{failed}");
    let mut rest = batches.split_off(1);
    let appended = store.append_encoded_in_order(&id, &mut rest).unwrap();
    assert_eq!(
        appended.iter().map(|a| a.base_offset).collect::<Vec<_>>(),
        [2, 3]
    );
    drop(store);
    fs.crash(CrashMode::DropAll);
    let store = open_t0_on(&fs).unwrap();
    store.create_partition(&id, small_segments(64)).unwrap();
    assert_eq!(values(&read_all(&store, &id, 0)), ["open", "a", "b", "c"]);
}

/// One appender sending two-batch groups in order, as a cursor does; returns what it had
/// acknowledged when the run ended (by a crash, or complete).
fn in_order_workload(fs: &FaultFs) -> Vec<String> {
    let Ok(store) = open_t0_on(fs) else {
        return Vec::new();
    };
    let mut acked = Vec::new();
    for i in 0..4 {
        let values = [format!("g{i}-a"), format!("g{i}-b-{}", "x".repeat(40 * i))];
        let mut batches = encoded(&[&values[0], &values[1]]);
        match store.append_encoded_in_order(&pid("t", 0), &mut batches) {
            Ok(_) => acked.extend(values),
            Err(e) => {
                acked.extend(values.into_iter().take(e.durable));
                break;
            }
        }
    }
    acked
}

#[test]
fn a_crash_at_any_operation_of_appends_in_order_keeps_every_acknowledged_batch_in_order() {
    let crashed_runs = crash_at_every_operation(
        in_order_workload,
        |acked| assert_eq!(acked.len(), 8),
        |crash, acked, got| {
            assert!(
                got.len() >= acked.len() && got[..acked.len()] == acked[..],
                "{crash}: acknowledged {acked:?}, found {got:?}"
            );
            // What survived past the acknowledged is a prefix of what was sent, in order: a
            // batch never outlives the one before it.
            for pair in got.windows(2) {
                let rank = |v: &str| (v[1..2].to_owned(), v.contains("-b"));
                assert!(rank(&pair[0]) < rank(&pair[1]), "{crash}: {got:?}");
            }
        },
    );
    assert!(crashed_runs > 10, "{crashed_runs} crash points");
}
