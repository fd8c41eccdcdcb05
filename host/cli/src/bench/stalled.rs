//! `narad bench fanout --stalled-cursors N`: the memory N cursors hold while their child
//! partition's owner is dead.
//!
//! A parent of N partitions is filled with a backlog (several slabs per partition), a child is
//! attached at offset 0, and one cursor per parent partition starts with a committer that
//! refuses every commit as a dead owner does (at once, naming the node). Once every cursor
//! reports it is stalled, and a few seconds more for any read ahead to land, the bench reads
//! the process's resident memory: what the stalled cursors hold (their slabs, what they read
//! ahead, the buffers those pin) is the difference from before they started.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_host::fanout::CursorDeps;
use narad_host::fanout::committer::{
    BlockingCommitter, ChildCommitError, ChildCommitter, InOrderFailure,
};
use narad_host::fanout::status::CursorState;
use narad_host::metastore::Metastore;
use narad_host::shutdown;
use narad_storage::{Appended, Clock, EncodedBatch, PartitionId, SystemClock};
use serde::Serialize;

use super::progress::Progress;
use super::rig::{Backlog, Rig, RunningCursor, stop_all, wait_for_state};
use super::sys::{self, FileSystemInfo};
use super::timed_router::RouteTiming;
use super::workdir::WorkDir;
use super::{BenchError, blocking};

/// Partitions of the child: the buckets of one slab go to all of them.
const CHILD_PARTITIONS: u32 = 4;

/// Longest wait for every cursor to stall.
const SETTLE_LIMIT: Duration = Duration::from_secs(600);

/// How long the bench waits after the last cursor stalled before it reads the memory: reads
/// ahead made during the first failed commit have landed by then.
const AFTER_STALL: Duration = Duration::from_secs(5);

/// How often the bench looks at the cursors while they stall.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The node every commit waits for.
const DEAD_NODE: &str = "dead-owner";

/// What to run.
#[derive(Clone, Debug)]
pub struct StalledOptions {
    /// Cursors (parent partitions) to start.
    pub cursors: u32,
    /// Backlog records in the parent, spread over its partitions.
    pub records: u64,
    /// Key bytes per record.
    pub key_bytes: usize,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
}

/// What the stalled-cursors bench measured.
#[derive(Clone, Debug, Serialize)]
pub struct StalledReport {
    /// Always `"fanout-stalled"`.
    pub bench: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it was on.
    pub file_system: Option<FileSystemInfo>,
    /// Stalled cursors.
    pub cursors: u64,
    /// Backlog records in the parent.
    pub backlog_records: u64,
    /// Backlog bytes (keys and values) per parent partition: what each cursor has in front of
    /// it.
    pub backlog_bytes_per_partition: u64,
    /// Seconds from starting the cursors until all were stalled.
    pub settle_seconds: f64,
    /// Resident memory before the cursors started, bytes.
    pub rss_before_bytes: Option<u64>,
    /// Resident memory with every cursor stalled, bytes.
    pub rss_stalled_bytes: Option<u64>,
    /// What the stalled cursors hold, per cursor, bytes.
    pub held_bytes_per_cursor: Option<u64>,
    /// Peak resident memory of the run, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after the run.
    pub load_after: Option<[f64; 3]>,
}

/// Refuses every commit as a child partition's dead owner does: at once, naming the node.
struct DeadOwner;

impl BlockingCommitter for DeadOwner {
    fn append(
        &self,
        partition: &PartitionId,
        _batch: &mut EncodedBatch,
    ) -> Result<Appended, ChildCommitError> {
        Err(ChildCommitError::OwnerDown {
            partition: partition.clone(),
            node: DEAD_NODE.to_owned(),
        })
    }

    fn append_in_order(
        &self,
        partition: &PartitionId,
        _batches: &mut [EncodedBatch],
    ) -> Result<(), InOrderFailure> {
        Err(InOrderFailure {
            durable: 0,
            error: ChildCommitError::OwnerDown {
                partition: partition.clone(),
                node: DEAD_NODE.to_owned(),
            },
        })
    }
}

/// Runs the stalled cursors bench.
pub async fn run_stalled(options: StalledOptions) -> Result<StalledReport, BenchError> {
    if options.cursors == 0 {
        return Err(BenchError::Options("no cursors to start".into()));
    }
    let load_before = sys::load_average();
    let partitions = options.cursors;
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench stalled cursors in {} on {}: {partitions} parent partitions, their child's owner dead",
        work.path().display(),
        work.describe_file_system()
    ));
    let parent = "stalled-parent";
    let rig = Rig::with_filled_parent(
        &work.path().join("data"),
        &Backlog {
            parent,
            partitions,
            records: options.records,
            key_bytes: options.key_bytes,
            value_bytes: options.value_bytes,
        },
        options.progress,
    )
    .await?;
    progress.step(&format!("parent filled: {} records", options.records));
    let child = "stalled-child";
    rig.create_topic(child, CHILD_PARTITIONS).await?;
    let link = rig
        .attach_default(parent, child, 0, vec![0; partitions as usize])
        .await?;
    let link = rig
        .link_runtime(link, Arc::new(RouteTiming::default()))
        .await?;
    let deps = Arc::new(CursorDeps {
        store: Arc::clone(&rig.store),
        fs: Arc::new(rig.fs.clone()),
        committer: Arc::new(DeadOwner) as Arc<dyn ChildCommitter>,
        metastore: Arc::clone(&rig.metastore) as Arc<dyn Metastore>,
        clock: Arc::new(SystemClock) as Arc<dyn Clock>,
        timing: narad_host::fanout::FanoutTiming::default(),
        remote_tails: None,
        node: None,
        leave_out_held: true,
    });

    let rss_before_bytes = sys::rss_bytes();
    let (trigger, signal) = shutdown::channel();
    let start = Instant::now();
    let cursors: Vec<RunningCursor> = (0..partitions)
        .map(|p| rig.spawn_cursor_on(&deps, &link, p, signal.clone()))
        .collect();
    if let Err(error) = wait_for_state(
        &cursors,
        CursorState::Stalled,
        "stalled",
        (SETTLE_LIMIT, POLL_INTERVAL),
        &mut progress,
    )
    .await
    {
        let _ = stop_all(&trigger, cursors).await;
        return Err(error);
    }
    let settle_seconds = start.elapsed().as_secs_f64();
    progress.step(&format!(
        "{} cursors stalled after {settle_seconds:.1} s; reading memory in {} s",
        cursors.len(),
        AFTER_STALL.as_secs()
    ));
    tokio::time::sleep(AFTER_STALL).await;
    let rss_stalled_bytes = sys::rss_bytes();
    let count = cursors.len() as u64;
    stop_all(&trigger, cursors).await?;
    blocking({
        let store = Arc::clone(&rig.store);
        move || store.close()
    })
    .await?
    .map_err(BenchError::storage("closing the store"))?;

    let record_bytes = (options.key_bytes + options.value_bytes) as u64;
    Ok(StalledReport {
        bench: "fanout-stalled",
        dir: work.path_buf(),
        file_system: work.file_system.clone(),
        cursors: count,
        backlog_records: options.records,
        backlog_bytes_per_partition: options.records / u64::from(partitions) * record_bytes,
        settle_seconds,
        rss_before_bytes,
        rss_stalled_bytes,
        held_bytes_per_cursor: match (rss_before_bytes, rss_stalled_bytes) {
            (Some(before), Some(stalled)) => Some(stalled.saturating_sub(before) / count.max(1)),
            _ => None,
        },
        peak_rss_bytes: sys::peak_rss_bytes(),
        load_before,
        load_after: sys::load_average(),
    })
}

impl StalledReport {
    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        let mib = |b: Option<u64>| {
            b.map_or("?".to_owned(), |b| {
                format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
            })
        };
        format!(
            "stalled cursors: {} cursors on a dead child owner, backlog {} records ({} per partition)\n\
             all stalled after {:.1} s\n\
             memory {} before the cursors, {} stalled: {} held per cursor; peak {}\n\
             load average before {} / after {}",
            self.cursors,
            self.backlog_records,
            mib(Some(self.backlog_bytes_per_partition)),
            self.settle_seconds,
            mib(self.rss_before_bytes),
            mib(self.rss_stalled_bytes),
            mib(self.held_bytes_per_cursor),
            mib(self.peak_rss_bytes),
            sys::load_text(self.load_before),
            sys::load_text(self.load_after),
        )
    }
}
