//! `narad bench once`: what the checks behind "each record once" cost when there is nothing
//! to leave out (the common path: no crash, no repeat), measured against the same work without
//! them in the same run.
//!
//! Two sides, each run in alternating rounds so both variants see the same disk and the same
//! neighbours (the machine is shared), the order swapped every round:
//!
//! - **cursor**: a pre-filled parent copied into a fresh child by the real cursors and the
//!   default chain, once with the daemon's cursors (which keep what the child already holds at
//!   their start and leave it out of the slabs they read again,
//!   [`narad_host::fanout::position::Held`]) and once with that check off
//!   ([`CursorDeps::leave_out_held`]). Each round copies into two new children.
//! - **target**: the receiving side of a remote child: batches of records produced through the
//!   daemon's [`Producer`], once carrying the `narad-origin` header a remote child's copy
//!   carries (each checked against the partition's window of copies, then remembered), once
//!   the very same bytes under another header name of the same length, which takes the plain
//!   append. The batches of the two alternate one by one.
//!
//! The ratios are the checked variant's throughput over the unchecked one's; the goal is at
//! least [`GOAL_RATIO`]. Every child and target partition is counted afterwards: each must hold
//! exactly what was sent. Nothing here is a timed test: the figures are printed, never asserted.
//!
//! [`CursorDeps::leave_out_held`]: narad_host::fanout::CursorDeps::leave_out_held

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_host::fanout::CursorDeps;
use narad_host::produce::{ProduceRecord, Producer};
use narad_host::shutdown;
use narad_storage::{Header, NewRecord};
use serde::Serialize;

use super::fanout::wait_for_copy;
use super::fill::{FillSpec, fill_parent};
use super::progress::Progress;
use super::rig::{Rig, RunningCursor, stop_all};
use super::sys::{self, FileSystemInfo};
use super::timed_router::RouteTiming;
use super::workdir::WorkDir;
use super::{BenchError, blocking, per_second};

/// Default parent records copied per variant and round.
pub const DEFAULT_RECORDS: u64 = 2_000_000;
/// Default partitions of the parent, each child and each target topic.
pub const DEFAULT_PARTITIONS: u32 = 4;
/// Default rounds (each runs both variants of both sides).
pub const DEFAULT_ROUNDS: u32 = 4;
/// Default records per variant and round on the target side.
pub const DEFAULT_TARGET_RECORDS: u64 = 400_000;
/// Records per produced batch on the target side: a remote child's request at most
/// (`MAX_RECORDS_PER_REQUEST` of the remote sender).
pub const TARGET_BATCH_RECORDS: usize = 1_000;
/// Key bytes per record.
const KEY_BYTES: usize = 16;
/// Value bytes per record.
const VALUE_BYTES: usize = 100;
/// The goal: the checked variant keeps at least this share of the unchecked one's throughput
/// (issue 32: "pays at most 5%").
pub const GOAL_RATIO: f64 = 0.95;

/// The header a remote child's copy names its origin in (checked by the target).
const ORIGIN_HEADER: &str = "narad-origin";
/// A header of the same length the target does not look at: the unchecked variant.
const PLAIN_HEADER: &str = "narad-unseen";

/// What to run.
#[derive(Clone, Debug)]
pub struct OnceOptions {
    /// Parent records copied per variant and round.
    pub records: u64,
    /// Partitions of every topic.
    pub partitions: u32,
    /// Rounds.
    pub rounds: u32,
    /// Records per variant and round on the target side.
    pub target_records: u64,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
}

impl Default for OnceOptions {
    fn default() -> OnceOptions {
        OnceOptions {
            records: DEFAULT_RECORDS,
            partitions: DEFAULT_PARTITIONS,
            rounds: DEFAULT_ROUNDS,
            target_records: DEFAULT_TARGET_RECORDS,
            dir: None,
            progress: false,
        }
    }
}

/// One side's figures: each variant's throughput over all rounds, and their ratio.
#[derive(Clone, Debug, Serialize)]
pub struct Compared {
    /// Records per second with the check, over every round.
    pub checked_records_per_s: f64,
    /// Records per second without it, over every round.
    pub unchecked_records_per_s: f64,
    /// `checked / unchecked`.
    pub ratio: f64,
    /// Seconds of each round with the check.
    pub checked_seconds: Vec<f64>,
    /// Seconds of each round without it.
    pub unchecked_seconds: Vec<f64>,
}

impl Compared {
    fn of(records_per_round: u64, checked: Vec<f64>, unchecked: Vec<f64>) -> Compared {
        let rate = |seconds: &[f64]| {
            per_second(
                (records_per_round * seconds.len() as u64) as f64,
                seconds.iter().sum(),
            )
        };
        let (checked_records_per_s, unchecked_records_per_s) = (rate(&checked), rate(&unchecked));
        Compared {
            checked_records_per_s,
            unchecked_records_per_s,
            ratio: per_second(checked_records_per_s, unchecked_records_per_s),
            checked_seconds: checked,
            unchecked_seconds: unchecked,
        }
    }
}

/// What `narad bench once` prints.
#[derive(Clone, Debug, Serialize)]
pub struct OnceReport {
    /// `"once"`.
    pub bench: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it ran on.
    pub file_system: Option<FileSystemInfo>,
    /// Parent records copied per variant and round.
    pub records: u64,
    /// Partitions of every topic.
    pub partitions: u32,
    /// Rounds.
    pub rounds: u32,
    /// Records per variant and round on the target side.
    pub target_records: u64,
    /// The cursors: with and without leaving out what the child already holds.
    pub cursor: Compared,
    /// A remote child's target: with and without the window of copies.
    pub target: Compared,
    /// [`GOAL_RATIO`].
    pub goal_ratio: f64,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after the run.
    pub load_after: Option<[f64; 3]>,
}

/// Runs the bench.
pub async fn run_once(options: OnceOptions) -> Result<OnceReport, BenchError> {
    if options.partitions == 0 || options.rounds == 0 || options.records == 0 {
        return Err(BenchError::Options(
            "every topic needs a partition, and the bench at least one round and one record".into(),
        ));
    }
    let load_before = sys::load_average();
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench once in {} on {}",
        work.path().display(),
        work.describe_file_system()
    ));
    let rig = Arc::new(
        Rig::open(
            &work.path().join("data"),
            narad_host::fanout::FanoutTiming::default(),
        )
        .await?,
    );
    let parent = "parent";
    rig.create_topic(parent, options.partitions).await?;
    let spec = FillSpec {
        topic: parent.to_owned(),
        partitions: options.partitions,
        records: options.records,
        key_bytes: KEY_BYTES,
        value_bytes: VALUE_BYTES,
    };
    let filled = {
        let (store, want) = (Arc::clone(&rig.store), options.progress);
        blocking(move || fill_parent(&store, &spec, &mut Progress::new(want))).await??
    };
    progress.step(&format!(
        "parent filled: {} records in {:.1} s",
        options.records,
        filled.elapsed.as_secs_f64()
    ));
    let high = rig.high_watermarks(parent, options.partitions).await?;

    let (mut checked, mut unchecked) = (Vec::new(), Vec::new());
    for round in 0..options.rounds {
        for check in order(round) {
            let deps = if check {
                &rig.deps
            } else {
                &rig.deps_without_held_check
            };
            let child = format!("child-{round}-{}", variant(check));
            let seconds = copy_once(&rig, deps, parent, &child, &options, &high).await?;
            progress.step(&format!(
                "round {round}: copy {} {:.2} s",
                variant(check),
                seconds
            ));
            if check { &mut checked } else { &mut unchecked }.push(seconds);
        }
    }
    let cursor = Compared::of(options.records, checked, unchecked);

    let target = target_side(&rig, &options, &mut progress).await?;
    blocking({
        let store = Arc::clone(&rig.store);
        move || store.close()
    })
    .await?
    .map_err(BenchError::storage("closing the store"))?;
    Ok(OnceReport {
        bench: "once",
        dir: work.path_buf(),
        file_system: work.file_system.clone(),
        records: options.records,
        partitions: options.partitions,
        rounds: options.rounds,
        target_records: options.target_records,
        cursor,
        target,
        goal_ratio: GOAL_RATIO,
        load_before,
        load_after: sys::load_average(),
    })
}

/// The variants in round `round`'s order: checked first in even rounds.
fn order(round: u32) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [true, false]
    } else {
        [false, true]
    }
}

fn variant(check: bool) -> &'static str {
    if check { "checked" } else { "unchecked" }
}

/// Copies the whole parent into a new child `child` with cursors on `deps`; returns the
/// seconds from their start until the last one copied its last record. The child must then
/// hold every record exactly once.
async fn copy_once(
    rig: &Arc<Rig>,
    deps: &Arc<CursorDeps>,
    parent: &str,
    child: &str,
    options: &OnceOptions,
    high: &[u64],
) -> Result<f64, BenchError> {
    rig.create_topic(child, options.partitions).await?;
    let link = rig
        .attach_default(parent, child, 0, vec![0; options.partitions as usize])
        .await?;
    let link = rig
        .link_runtime(link, Arc::new(RouteTiming::default()))
        .await?;
    let (trigger, signal) = shutdown::channel();
    let start = Instant::now();
    let cursors: Vec<RunningCursor> = (0..options.partitions)
        .map(|p| rig.spawn_cursor_on(deps, &link, p, signal.clone()))
        .collect();
    let done_at = match wait_for_copy(&cursors, high, start, &mut Progress::silent()).await {
        Ok(done_at) => done_at,
        Err(error) => {
            let _ = stop_all(&trigger, cursors).await;
            return Err(error);
        }
    };
    stop_all(&trigger, cursors).await?;
    let held = rig.high_watermarks(child, options.partitions).await?;
    let (sent, stored) = (high.iter().sum::<u64>(), held.iter().sum::<u64>());
    if stored != sent {
        return Err(BenchError::Incomplete {
            child: child.to_owned(),
            reason: format!("it holds {stored} records of the parent's {sent}"),
        });
    }
    Ok(done_at
        .into_iter()
        .fold(Duration::ZERO, Duration::max)
        .as_secs_f64())
}

/// The target side: batches with the origin header and batches with a header the target does
/// not look at, alternating, into two topics; returns both variants' figures.
async fn target_side(
    rig: &Arc<Rig>,
    options: &OnceOptions,
    progress: &mut Progress,
) -> Result<Compared, BenchError> {
    let producer = Producer::new(Arc::clone(&rig.store));
    let partitions = options.partitions;
    let (checked_topic, unchecked_topic) = ("target-checked", "target-unchecked");
    rig.create_topic(checked_topic, partitions).await?;
    rig.create_topic(unchecked_topic, partitions).await?;
    let value = Bytes::from(vec![0x5a; VALUE_BYTES]);
    let batches = options.target_records.div_ceil(TARGET_BATCH_RECORDS as u64);
    let (mut checked, mut unchecked) = (Vec::new(), Vec::new());
    let mut next = 0u64;
    for round in 0..options.rounds {
        let (mut with, mut without) = (Duration::ZERO, Duration::ZERO);
        for batch in 0..batches {
            for check in order(round.wrapping_add(batch as u32)) {
                let (topic, header) = if check {
                    (checked_topic, ORIGIN_HEADER)
                } else {
                    (unchecked_topic, PLAIN_HEADER)
                };
                let records = target_batch(header, next, &value);
                let partition = (batch % u64::from(partitions)) as u32;
                let records = records
                    .into_iter()
                    .map(|record| ProduceRecord {
                        partition: Some(partition),
                        record,
                    })
                    .collect();
                let start = Instant::now();
                producer
                    .produce(topic, partitions, records)
                    .await
                    .map_err(|e| BenchError::Incomplete {
                        child: topic.to_owned(),
                        reason: format!("a produce failed: {e}"),
                    })?;
                *if check { &mut with } else { &mut without } += start.elapsed();
            }
            next += TARGET_BATCH_RECORDS as u64;
        }
        progress.step(&format!(
            "round {round}: target checked {:.2} s, unchecked {:.2} s",
            with.as_secs_f64(),
            without.as_secs_f64()
        ));
        checked.push(with.as_secs_f64());
        unchecked.push(without.as_secs_f64());
    }
    let sent = batches * TARGET_BATCH_RECORDS as u64 * u64::from(options.rounds);
    for topic in [checked_topic, unchecked_topic] {
        let stored: u64 = rig.high_watermarks(topic, partitions).await?.iter().sum();
        if stored != sent {
            return Err(BenchError::Incomplete {
                child: topic.to_owned(),
                reason: format!("it holds {stored} records of the {sent} produced"),
            });
        }
    }
    Ok(Compared::of(
        batches * TARGET_BATCH_RECORDS as u64,
        checked,
        unchecked,
    ))
}

/// One batch of records `first..`, each with a distinct origin-shaped value under `header`
/// (`source/epoch/parent partition/parent offset`, as a remote child's copy names it).
fn target_batch(header: &str, first: u64, value: &Bytes) -> Vec<NewRecord> {
    (first..first + TARGET_BATCH_RECORDS as u64)
        .map(|n| NewRecord {
            key: Some(Bytes::from(format!("{n:016}"))),
            value: Some(value.clone()),
            headers: vec![Header {
                name: header.to_owned(),
                value: Bytes::from(format!("node:bench/00000000000000ab/0/{n}")),
            }],
        })
        .collect()
}

impl OnceReport {
    /// The report as text.
    pub fn to_text(&self) -> String {
        let load = sys::load_text;
        let fs = sys::file_system_text(self.file_system.as_ref());
        let side = |name: &str, c: &Compared| {
            format!(
                "{name}: {:.0} records/s checked, {:.0} unchecked: ratio {:.3} (goal >= {:.2}); \
                 seconds per round checked {:?}, unchecked {:?}\n",
                c.checked_records_per_s,
                c.unchecked_records_per_s,
                c.ratio,
                self.goal_ratio,
                c.checked_seconds,
                c.unchecked_seconds,
            )
        };
        format!(
            "narad bench once: {} rounds on {fs}; {} parent records x {} partitions per copy, \
             {} records per target variant and round\n{}{}load before {}, after {}\n",
            self.rounds,
            self.records,
            self.partitions,
            self.target_records,
            side(
                "cursor (leave out what the child holds at start)",
                &self.cursor
            ),
            side("target (window of a remote child's copies)", &self.target),
            load(self.load_before),
            load(self.load_after),
        )
    }
}
