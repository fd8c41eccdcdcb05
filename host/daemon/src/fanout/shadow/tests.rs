use std::sync::Condvar;
use std::time::Duration;

use bytes::Bytes;
use narad_runtime::FailureKind;

use super::*;
use crate::fanout::route::RouteFailureKind;

/// Bound on waiting for the worker; generous for a busy machine.
const WAIT: Duration = Duration::from_secs(60);

fn spec() -> ShadowSpec {
    ShadowSpec {
        router: Vec::new(),
        config: "candidate".into(),
        set_at_ms: 1,
    }
}

fn input(child_partition_count: u32) -> RouteInput {
    RouteInput {
        parent_topic: "p".into(),
        parent_partition: 0,
        parent_partition_count: 1,
        child_topic: "c".into(),
        child_partition_count,
        attempt: 0,
        config: b"real".to_vec(),
    }
}

fn records(keys: std::ops::Range<u64>) -> Arc<Vec<StoredRecord>> {
    Arc::new(
        keys.map(|offset| StoredRecord {
            offset,
            committed_at_ms: 0,
            key: Some(Bytes::from(offset.to_string())),
            headers: Vec::new(),
            value: Some(Bytes::from_static(b"v")),
            origin: None,
        })
        .collect(),
    )
}

/// The "real" chain of these tests: record at offset `o` goes to `o % partitions`.
fn real_decisions(records: &[StoredRecord], partitions: u32) -> Vec<u32> {
    records
        .iter()
        .map(|r| u32::try_from(r.offset % u64::from(partitions)).unwrap())
        .collect()
}

fn slab(records: Arc<Vec<StoredRecord>>, partitions: u32) -> ShadowSlab {
    ShadowSlab {
        input: input(partitions),
        decisions: real_decisions(&records, partitions),
        records,
        cost: RouteCost {
            elapsed: Duration::from_micros(4),
            fuel: None,
        },
    }
}

/// Agrees with the real chain except on every `every`-th offset, which it sends to the
/// next partition; checks it is handed the candidate's config and a first attempt.
struct DiffersEvery {
    every: u64,
}

impl SlabRouter for DiffersEvery {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        assert_eq!(input.config, b"candidate");
        assert_eq!(input.attempt, 0);
        let n = input.child_partition_count;
        Ok(real_decisions(records, n)
            .into_iter()
            .zip(records)
            .map(|(d, r)| match r.offset % self.every {
                0 => (d + 1) % n,
                _ => d,
            })
            .collect())
    }
}

async fn settled(shadow: &Shadow, slabs: u64) -> ShadowReport {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = shadow.report();
        if report.slabs_seen + report.slabs_skipped >= slabs {
            return report;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shadow did not count {slabs} slabs: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_candidate_that_differs_on_every_fourth_key_reports_exactly_that_share_by_pair() {
    let shadow = Shadow::start(spec(), Ok(Box::new(DiffersEvery { every: 4 })));
    // One slab at a time, so none is skipped: 3 slabs of 400 records, 4 partitions.
    for slab_index in 0..3u64 {
        let from = slab_index * 400;
        shadow.offer(slab(records(from..from + 400), 4));
        settled(&shadow, slab_index + 1).await;
    }
    let report = shadow.report();
    assert_eq!((report.slabs_seen, report.records_seen), (3, 1200));
    assert_eq!(report.slabs_skipped, 0);
    assert_eq!(report.records_moved, 300);
    assert_eq!(report.records_same, 900);
    // Offsets divisible by 4 are on partition 0 for the real chain, 1 for the candidate.
    assert_eq!(
        report.moved,
        [MovedPair {
            from: 0,
            to: 1,
            records: 300
        }]
    );
    assert_eq!(report.moved_other_records, 0);
    assert_eq!(
        (report.records_undecided, report.records_out_of_range),
        (0, 0)
    );
    assert!(report.errors.is_empty());
    assert_eq!(report.current.records, 1200);
    assert_eq!(report.current.nanos, 3 * 4_000);
    assert_eq!(report.current.nanos_per_record, Some(10.0));
    assert_eq!(report.candidate.records, 1200);
    assert_eq!(report.current.fuel_per_record, None);
}

/// Answers `UNDECIDED` for offsets ending in 1, an out-of-range partition for those ending
/// in 2, and otherwise what the real chain does.
struct Sloppy;

impl SlabRouter for Sloppy {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        let n = input.child_partition_count;
        Ok(records
            .iter()
            .map(|r| match r.offset % 10 {
                1 => narad_runtime::UNDECIDED,
                2 => n + 5,
                _ => u32::try_from(r.offset % u64::from(n)).unwrap(),
            })
            .collect())
    }
}

/// Fails every slab with a trap.
struct Traps;

impl SlabRouter for Traps {
    fn route(
        &mut self,
        _input: &RouteInput,
        _records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        Err(RouteFailure {
            plugin: Some("hostile@00".into()),
            poison: None,
            kind: RouteFailureKind::Plugin(FailureKind::Trap),
            message: "plugin hostile trapped".into(),
        })
    }
}

#[tokio::test]
async fn undecided_and_out_of_range_records_and_failed_slabs_are_counted_apart() {
    let shadow = Shadow::start(spec(), Ok(Box::new(Sloppy)));
    shadow.offer(slab(records(0..100), 3));
    let report = settled(&shadow, 1).await;
    assert_eq!(report.records_undecided, 10);
    assert_eq!(report.records_out_of_range, 10);
    assert_eq!(report.records_same, 80);
    assert_eq!(report.records_moved, 0);

    let shadow = Shadow::start(spec(), Ok(Box::new(Traps)));
    shadow.offer(slab(records(0..7), 3));
    let report = settled(&shadow, 1).await;
    assert_eq!((report.slabs_failed, report.records_failed), (1, 7));
    assert_eq!(report.errors, BTreeMap::from([("trap".to_owned(), 1)]));
    assert_eq!(report.last_error.as_deref(), Some("plugin hostile trapped"));
    assert_eq!(report.records_same + report.records_moved, 0);
}

/// Holds every routing until the test opens the gate.
struct Gated(Arc<(Mutex<bool>, Condvar)>);

impl SlabRouter for Gated {
    fn route(
        &mut self,
        _input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        let (open, changed) = &*self.0;
        let guard = open.lock().unwrap();
        let (_guard, _) = changed
            .wait_timeout_while(guard, WAIT, |open| !*open)
            .unwrap();
        Ok(vec![0; records.len()])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offers_beyond_the_queue_of_a_busy_candidate_are_skipped_and_counted_without_waiting() {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let shadow = Shadow::start(spec(), Ok(Box::new(Gated(Arc::clone(&gate)))));
    // The first slab is taken by the worker (and held at the gate); wait until it is, so
    // the queue's room is known.
    shadow.offer(slab(records(0..10), 2));
    let deadline = tokio::time::Instant::now() + WAIT;
    while shadow.offers.capacity() < SHADOW_QUEUE_DEPTH {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker took nothing"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Every offer returns at once, the candidate still held: the queue takes
    // SHADOW_QUEUE_DEPTH slabs, the rest are skipped.
    let offered = 5;
    for _ in 0..offered {
        shadow.offer(slab(records(0..10), 2));
    }
    let skipped = offered - SHADOW_QUEUE_DEPTH as u64;
    let report = shadow.report();
    assert_eq!(
        (report.slabs_skipped, report.records_skipped),
        (skipped, skipped * 10)
    );
    assert_eq!(report.slabs_seen, 0);
    {
        let (open, changed) = &*gate;
        *open.lock().unwrap() = true;
        changed.notify_all();
    }
    let report = settled(&shadow, 1 + offered).await;
    assert_eq!(report.slabs_seen, 1 + SHADOW_QUEUE_DEPTH as u64);
    assert_eq!(report.slabs_skipped, skipped);
}

#[tokio::test]
async fn a_candidate_that_cannot_be_built_skips_every_slab_and_says_why_until_installed() {
    let unbuildable = RouterBuildError::Chain(narad_runtime::ChainError::Length {
        len: 0,
        max: narad_runtime::MAX_CHAIN_LEN,
    });
    let why = unbuildable.to_string();
    let shadow = Shadow::start(spec(), Err(unbuildable));
    assert!(shadow.needs_build());
    shadow.offer(slab(records(0..3), 2));
    let report = shadow.report();
    assert_eq!((report.slabs_skipped, report.records_skipped), (1, 3));
    assert_eq!(report.build_error, Some(why));
    shadow.install(Box::new(DiffersEvery { every: 1 }));
    assert!(!shadow.needs_build());
    shadow.offer(slab(records(0..3), 2));
    let report = settled(&shadow, 2).await;
    assert_eq!(report.build_error, None);
    assert_eq!((report.slabs_seen, report.records_moved), (1, 3));
    assert_eq!(report.slabs_skipped, 1);
}

#[test]
fn partition_pairs_beyond_the_cap_are_summed_apart_and_reports_merge_under_the_same_cap() {
    let mut tally = Tally::default();
    let partitions = 1_000;
    // Record i: real partition i, candidate partition i + 1: one pair per record.
    let records = records(0..(MAX_MOVED_PAIRS as u64 + 10));
    let decisions: Vec<u32> = (0..records.len() as u32).collect();
    let theirs: Vec<u32> = decisions.iter().map(|d| d + 1).collect();
    let slab = ShadowSlab {
        input: input(partitions),
        records,
        decisions,
        cost: RouteCost::default(),
    };
    tally.routed(&slab, Ok(&theirs), &RouteCost::default());
    let report = tally.report();
    assert_eq!(report.moved.len(), MAX_MOVED_PAIRS);
    assert_eq!(report.moved_other_records, 10);
    assert_eq!(report.records_moved, MAX_MOVED_PAIRS as u64 + 10);

    let mut merged = report.clone();
    merged.merge(&report);
    assert_eq!(merged.moved.len(), MAX_MOVED_PAIRS);
    assert!(merged.moved.iter().all(|p| p.records == 2));
    assert_eq!(merged.records_moved, 2 * report.records_moved);
    let listed: u64 = merged.moved.iter().map(|p| p.records).sum();
    assert_eq!(listed + merged.moved_other_records, merged.records_moved);
}
