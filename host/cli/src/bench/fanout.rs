//! `narad bench fanout`: a pre-filled parent copied into K children by the real cursors,
//! against a raw copy loop of the same records with no routing.
//!
//! The fan-out side is the daemon's own path: one `run_cursor` per (parent partition, child),
//! reading slabs, routing them through the default Wasm chain (`key-hash`, `keyless-index`,
//! `round-robin`, built by the production router factory from the plugin registry), committing
//! each bucket with the produce commit (append, `fdatasync`, verify), then advancing the
//! offset file. The raw side runs as many workers, each reading the same parent partition in
//! slabs of the same size and writing each slab, encoded exactly as a child batch would be,
//! to a plain file with `pwrite` + `fdatasync`: the same bytes, one sync per slab, no routing,
//! no buckets, no offset file. When the child has another partition count than the parent,
//! the raw loop is instead [`super::raw_buckets`]: each slab split into the buckets the default
//! chain's rules give, one plain file per (child, child partition) shared by the workers of
//! that child, one `pwrite` + `fdatasync` per bucket. The report names which raw loop ran
//! ([`FanoutReport::raw_loop`]). The raw loop runs once before and once after the fan-out and
//! the ratio is taken against both together, so a disk that is busier in one half of the run
//! (the machine is shared) weighs on both sides. So does the same loop with each write read
//! back from the device after its sync, as the store does before acknowledging an append
//! ([`FanoutReport::raw_read_back`]): the ratio to it is the engine's cost over the same disk
//! work, the read-back's device traffic included on both sides. Afterwards every child is read back: every
//! parent record must be in it once, on the partition the default chain's rules give. Before
//! all that, the disk's own sync costs are measured ([`super::disk`]).
//!
//! Routing share: the time inside the routers (a [`TimedRouter`] around each chain) over the
//! cursors' busy time (each cursor from its start until it had copied its last record), and
//! also over the process's CPU time.
//!
//! [`TimedRouter`]: super::timed_router::TimedRouter

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_storage::{BatchOrigin, Header, NewRecord, PartitionId, ReadOptions, Store};
use serde::Serialize;

use super::disk::{self, SyncCosts};
use super::fill::{FillSpec, fill_parent};
use super::progress::Progress;
use super::raw_append::{RawFile, ReadBack};
use super::raw_buckets::{default_chain_partition, raw_bucket_copy};
use super::rig::{Rig, RunningCursor, stop_all};
use super::sys::{self, FileSystemInfo};
use super::timed_router::RouteTiming;
use super::workdir::WorkDir;
use super::{BenchError, blocking, per_second};
use narad_host::fanout::status::CursorState;
use narad_host::fanout::{SLAB_MAX_BYTES, SLAB_MAX_RECORDS};
use narad_host::shutdown;

/// Default parent records (issue 4: a pre-filled parent of 1,000,000 records).
pub const DEFAULT_RECORDS: u64 = 1_000_000;
/// Default partitions of the parent and of each child (issue 4).
pub const DEFAULT_PARTITIONS: u32 = 4;
/// Default key bytes per record (issue 4).
pub const DEFAULT_KEY_BYTES: usize = 16;
/// Default value bytes per record (issue 4).
pub const DEFAULT_VALUE_BYTES: usize = 100;

/// Goal for one child, records per second (issue 4).
pub const GOAL_ONE_CHILD_RECORDS_PER_S: f64 = 3_000_000.0;
/// Goal of the speed issue (issue 11) for one child, 4 -> 4 partitions, records per second.
pub const GOAL_ONE_CHILD_RECORDS_PER_S_SPEED_ISSUE: f64 = 3_600_000.0;
/// Goal for 16 children, record copies per second in all (issue 4).
pub const GOAL_SIXTEEN_CHILDREN_COPIES_PER_S: f64 = 4_000_000.0;
/// Goal for the fan-out's throughput as a share of the raw loop's (issue 4).
pub const GOAL_RATIO: f64 = 0.8;
/// Goal of the speed issue (issue 11) for the fan-out as a share of the raw loop, also for a
/// child of another partition count than the parent's and for 16 children.
pub const GOAL_RATIO_SPEED_ISSUE: f64 = 0.9;
/// Goal for the share of slab time spent routing (issue 4: under 5%).
pub const GOAL_ROUTING_SHARE: f64 = 0.05;

/// [`FanoutReport::raw_loop`] of the slab loop: a slab is written whole, as one file per
/// (child, parent partition), one `fdatasync` each.
pub const RAW_LOOP_SLABS: &str = "slabs";
/// [`FanoutReport::raw_loop`] of the bucket loop ([`super::raw_buckets`]).
pub const RAW_LOOP_BUCKETS: &str = "buckets";

/// How often the bench looks at the cursors' progress.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// A fan-out that copies nothing for this long has failed (a stall the cursor keeps retrying,
/// such as a full disk); generous for a busy machine.
const NO_PROGRESS_LIMIT: Duration = Duration::from_secs(120);
/// Records per read when checking the children.
const VERIFY_READ_RECORDS: usize = 65_536;

/// What to run.
#[derive(Clone, Debug)]
pub struct FanoutOptions {
    /// Records in the parent.
    pub records: u64,
    /// Children attached to it.
    pub children: u32,
    /// Partitions of the parent.
    pub partitions: u32,
    /// Partitions of each child (another count than the parent's makes every slab several
    /// buckets, and the raw loop the bucket loop).
    pub child_partitions: u32,
    /// Key bytes per record (0: keyless records).
    pub key_bytes: usize,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
    /// Longest a cursor copying at full speed leaves its offset file unsynced (the daemon's
    /// default; zero syncs it past every slab, as the reference engine does).
    pub offset_sync_every: Duration,
    /// Most consecutive slabs a cursor commits together (the daemon's default; 1 commits
    /// each slab on its own, as the reference engine does).
    pub slabs_per_commit: usize,
}

impl Default for FanoutOptions {
    fn default() -> FanoutOptions {
        FanoutOptions {
            records: DEFAULT_RECORDS,
            children: 1,
            partitions: DEFAULT_PARTITIONS,
            child_partitions: DEFAULT_PARTITIONS,
            key_bytes: DEFAULT_KEY_BYTES,
            value_bytes: DEFAULT_VALUE_BYTES,
            dir: None,
            progress: false,
            offset_sync_every: narad_host::fanout::OFFSET_SYNC_EVERY,
            slabs_per_commit: narad_host::fanout::SLABS_PER_COMMIT,
        }
    }
}

/// Filling the parent.
#[derive(Clone, Debug, Serialize)]
pub struct FillFigures {
    /// Seconds it took.
    pub seconds: f64,
    /// Records per second.
    pub records_per_s: f64,
    /// Records per parent partition.
    pub per_partition: Vec<u64>,
}

/// The copy by the real cursors.
#[derive(Clone, Debug, Serialize)]
pub struct FanoutFigures {
    /// From starting the cursors until every child held every record.
    pub seconds: f64,
    /// Record copies per second, all children together.
    pub records_per_s: f64,
    /// Records per second of each child (its records over the time its last cursor took).
    pub records_per_s_per_child: Vec<f64>,
    /// The slowest child's records per second.
    pub records_per_s_per_child_min: f64,
    /// Record bytes (key + value) copied per second, all children.
    pub mb_per_s: f64,
    /// Bytes written to files per second (child frames, offset files), all children.
    pub written_mb_per_s: f64,
    /// Slabs committed.
    pub slabs: u64,
    /// Records per slab on average.
    pub records_per_slab: f64,
    /// Child bucket commits per slab.
    pub commits_per_slab: f64,
    /// `fdatasync`s on files per slab (child commits and offset-file advances).
    pub fsyncs_per_slab: f64,
    /// Directory `fsync`s in all (segment creation).
    pub dir_fsyncs: u64,
    /// Mean time of one file `fdatasync` during the copy, milliseconds.
    pub fsync_ms_mean: f64,
    /// Read-backs from the device (each append group's check after its `fdatasync`) per
    /// file `fdatasync`.
    pub device_reads_per_fsync: f64,
    /// Mean time of one read-back piece (up to 2 MiB), milliseconds.
    pub device_read_ms_mean: f64,
    /// Bytes read back from the device per second: with `written_mb_per_s`, what the device
    /// moves.
    pub device_read_mb_per_s: f64,
    /// Time inside child commits (append, `fdatasync`, verify) over the cursors' busy time.
    pub commit_share_of_slab_time: f64,
    /// Time in offset-file `fdatasync`s (advancing the cursors) over the cursors' busy time.
    pub advance_sync_share_of_slab_time: f64,
    /// Seconds inside the routers, all cursors.
    pub routing_seconds: f64,
    /// Routing time per slab, milliseconds.
    pub routing_ms_per_slab: f64,
    /// Routing time over the cursors' busy time.
    pub routing_share_of_slab_time: f64,
    /// Routing CPU time per slab, milliseconds: the routing threads' own CPU time, without
    /// the time they waited for a core (`None` where it cannot be read).
    pub routing_cpu_ms_per_slab: Option<f64>,
    /// Routing CPU time over the process's CPU time during the copy (routing wall time where
    /// the CPU time cannot be read).
    pub routing_share_of_cpu: f64,
    /// Process CPU seconds per wall second during the copy (cores busy).
    pub cpu_cores_used: f64,
    /// Process CPU time during the copy per record copy made (every child's copy counts),
    /// nanoseconds: what a copy costs whatever the disk's speed.
    pub cpu_ns_per_copy: f64,
    /// Resident memory when the cursors started, bytes.
    pub rss_before_bytes: Option<u64>,
    /// Peak resident memory during the copy, bytes (`VmHWM`, reset before the copy when the
    /// kernel allows; else the peak of the whole run).
    pub peak_rss_bytes: Option<u64>,
    /// Whether the peak was reset before the copy.
    pub peak_rss_reset: bool,
}

/// The raw loop (one run, or both runs together).
#[derive(Clone, Debug, Serialize)]
pub struct RawFigures {
    /// Seconds until every worker was done (both runs: their sum).
    pub seconds: f64,
    /// Record copies per second, all children together.
    pub records_per_s: f64,
    /// Records per second of each child.
    pub records_per_s_per_child: Vec<f64>,
    /// Record bytes (key + value) copied per second.
    pub mb_per_s: f64,
    /// Bytes written per second.
    pub written_mb_per_s: f64,
    /// Slabs read (the slab loop: written, one `fdatasync` each).
    pub slabs: u64,
    /// Buckets written, one `pwrite` + `fdatasync` each (the slab loop: one per slab).
    pub buckets: u64,
}

/// What the check of the children found.
#[derive(Clone, Debug, Serialize)]
pub struct Verified {
    /// Records found in each child.
    pub child_records: Vec<u64>,
    /// Records found more than once (0 in a run without crashes).
    pub duplicates: u64,
    /// Seconds the check took.
    pub seconds: f64,
}

/// The goals of issue 4, for comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Goals {
    /// Records per second for one child.
    pub one_child_records_per_s: f64,
    /// Records per second for one child, the speed issue's goal (issue 11).
    pub one_child_records_per_s_speed_issue: f64,
    /// Record copies per second with 16 children.
    pub sixteen_children_copies_per_s: f64,
    /// Fan-out over raw loop (issue 4).
    pub ratio: f64,
    /// Fan-out over raw loop, the speed issue's goal (issue 11).
    pub ratio_speed_issue: f64,
    /// Routing share of slab time, at most.
    pub routing_share: f64,
}

/// What `narad bench fanout` measured.
#[derive(Clone, Debug, Serialize)]
pub struct FanoutReport {
    /// Always `"fanout"`.
    pub bench: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it was on.
    pub file_system: Option<FileSystemInfo>,
    /// Records in the parent.
    pub records: u64,
    /// Children.
    pub children: u32,
    /// Partitions of the parent.
    pub partitions: u32,
    /// Partitions of each child.
    pub child_partitions: u32,
    /// Key bytes per record.
    pub key_bytes: usize,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// Longest a cursor left its offset file unsynced while copying, milliseconds (0: synced
    /// past every slab).
    pub offset_sync_every_ms: u64,
    /// Most consecutive slabs a cursor committed together.
    pub slabs_per_commit: usize,
    /// The parent's fill.
    pub fill: FillFigures,
    /// The real fan-out.
    pub fanout: FanoutFigures,
    /// Which raw loop ran: [`RAW_LOOP_SLABS`] (the same partition count on both sides: one
    /// file and one `fdatasync` per slab, no split) or [`RAW_LOOP_BUCKETS`] (another count:
    /// each slab split by the default chain's rules, one `fdatasync` per bucket, files shared
    /// per child partition).
    pub raw_loop: &'static str,
    /// The raw loop, its run before and its run after the fan-out together.
    pub raw: RawFigures,
    /// The raw loop's run before the fan-out, then its run after.
    pub raw_runs: Vec<RawFigures>,
    /// The same raw loop reading every append back from the device after its `fdatasync`,
    /// as the store does before it acknowledges one: its run before and its run after the
    /// fan-out together. What the disk allows under the durability rule the engine keeps.
    pub raw_read_back: RawFigures,
    /// Its run before the fan-out, then its run after.
    pub raw_read_back_runs: Vec<RawFigures>,
    /// This disk's own sync costs, measured before everything else.
    pub disk: SyncCosts,
    /// `fanout.records_per_s / raw.records_per_s`.
    pub ratio: f64,
    /// `fanout.records_per_s / raw_read_back.records_per_s`: the engine's own cost (routing,
    /// scheduling, offsets, buckets) over the same durable disk work.
    pub ratio_to_read_back_loop: f64,
    /// The check that every child holds every record.
    pub verified: Verified,
    /// The goals.
    pub goals: Goals,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after the run.
    pub load_after: Option<[f64; 3]>,
}

fn child_name(c: u32) -> String {
    format!("child-{c:03}")
}

/// Runs the fan-out bench.
pub async fn run_fanout(options: FanoutOptions) -> Result<FanoutReport, BenchError> {
    if options.partitions == 0 || options.child_partitions == 0 || options.children == 0 {
        return Err(BenchError::Options(
            "the parent and each child need at least one partition, and one child".into(),
        ));
    }
    if options.children as usize > narad_host::metastore::link::MAX_CHILDREN_PER_PARENT {
        return Err(BenchError::Options(format!(
            "a parent has at most {} children",
            narad_host::metastore::link::MAX_CHILDREN_PER_PARENT
        )));
    }
    let load_before = sys::load_average();
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench fanout in {} on {}",
        work.path().display(),
        work.describe_file_system()
    ));
    let disk = disk::measure_and_report(&work, &mut progress).await?;
    let timing = narad_host::fanout::FanoutTiming {
        offset_sync_every: options.offset_sync_every,
        slabs_per_commit: options.slabs_per_commit,
        no_progress_after: narad_host::fanout::NO_PROGRESS_AFTER,
        ..narad_host::fanout::FanoutTiming::default()
    };
    let rig = Arc::new(Rig::open(&work.path().join("data"), timing).await?);
    let parent = "parent";
    rig.create_topic(parent, options.partitions).await?;

    // Fill the parent.
    let spec = FillSpec {
        topic: parent.to_owned(),
        partitions: options.partitions,
        records: options.records,
        key_bytes: options.key_bytes,
        value_bytes: options.value_bytes,
    };
    let filled = {
        let (store, spec, want) = (Arc::clone(&rig.store), spec.clone(), options.progress);
        blocking(move || fill_parent(&store, &spec, &mut Progress::new(want))).await??
    };
    let fill = FillFigures {
        seconds: filled.elapsed.as_secs_f64(),
        records_per_s: per_second(options.records as f64, filled.elapsed.as_secs_f64()),
        per_partition: filled.per_partition.clone(),
    };
    progress.step(&format!(
        "parent filled: {} records in {:.1} s",
        options.records, fill.seconds
    ));
    let high = rig.high_watermarks(parent, options.partitions).await?;
    let (raw_before, read_back_before) = raw_loops(
        &rig,
        &work,
        "before",
        &high,
        &options,
        filled.payload_bytes,
        &mut progress,
    )
    .await?;

    // Children, links, routers.
    let timing = Arc::new(RouteTiming::default());
    let mut links = Vec::new();
    for c in 0..options.children {
        let child = child_name(c);
        rig.create_topic(&child, options.child_partitions).await?;
        let link = rig
            .attach_default(parent, &child, 0, vec![0; options.partitions as usize])
            .await?;
        links.push(rig.link_runtime(link, Arc::clone(&timing)).await?);
    }

    // The copy.
    let peak_rss_reset = sys::reset_peak_rss();
    let rss_before_bytes = sys::rss_bytes();
    let io_before = rig.fs.counts();
    let cpu_before = sys::cpu_time();
    let (trigger, signal) = shutdown::channel();
    let start = Instant::now();
    let mut cursors: Vec<RunningCursor> = Vec::new();
    for link in &links {
        for p in 0..options.partitions {
            cursors.push(rig.spawn_cursor(link, p, signal.clone()));
        }
    }
    let done_at = match wait_for_copy(&cursors, &high, start, &mut progress).await {
        Ok(done_at) => done_at,
        Err(error) => {
            // Stop what runs before reporting; the copy's failure is the error that matters.
            let _ = stop_all(&trigger, cursors).await;
            return Err(error);
        }
    };
    let elapsed = start.elapsed();
    let cpu_used = match (cpu_before, sys::cpu_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    let peak_rss_bytes = sys::peak_rss_bytes();
    let io = rig.fs.counts().since(&io_before);
    let slabs: u64 = cursors.iter().map(|c| rig.slabs_committed(&c.key)).sum();
    let commits = rig.committer.commits();
    let commit_time = rig.committer.time();
    stop_all(&trigger, cursors).await?;
    progress.step(&format!("fan-out done in {:.2} s", elapsed.as_secs_f64()));

    let per_child_records: u64 = high.iter().sum();
    let per_child_seconds: Vec<f64> = (0..options.children as usize)
        .map(|c| {
            let part = &done_at[c * options.partitions as usize..][..options.partitions as usize];
            part.iter()
                .copied()
                .fold(Duration::ZERO, Duration::max)
                .as_secs_f64()
        })
        .collect();
    let records_per_s_per_child: Vec<f64> = per_child_seconds
        .iter()
        .map(|s| per_second(per_child_records as f64, *s))
        .collect();
    let busy: Duration = done_at.iter().sum();
    let copies = per_child_records * u64::from(options.children);
    let payload = filled.payload_bytes * u64::from(options.children);
    let seconds = elapsed.as_secs_f64();
    let fanout = FanoutFigures {
        seconds,
        records_per_s: per_second(copies as f64, seconds),
        records_per_s_per_child_min: records_per_s_per_child
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min),
        records_per_s_per_child,
        mb_per_s: per_second(payload as f64 / 1e6, seconds),
        written_mb_per_s: per_second(io.bytes_written as f64 / 1e6, seconds),
        slabs,
        records_per_slab: per_second(copies as f64, slabs as f64),
        commits_per_slab: per_second(commits as f64, slabs as f64),
        fsyncs_per_slab: per_second(io.file_syncs as f64, slabs as f64),
        dir_fsyncs: io.dir_syncs,
        fsync_ms_mean: per_second(io.file_sync_nanos as f64 / 1e6, io.file_syncs as f64),
        device_reads_per_fsync: per_second(io.device_reads as f64, io.file_syncs as f64),
        device_read_ms_mean: per_second(io.device_read_nanos as f64 / 1e6, io.device_reads as f64),
        device_read_mb_per_s: per_second(io.device_bytes_read as f64 / 1e6, seconds),
        commit_share_of_slab_time: per_second(commit_time.as_secs_f64(), busy.as_secs_f64()),
        advance_sync_share_of_slab_time: per_second(
            io.offset_sync_nanos as f64 / 1e9,
            busy.as_secs_f64(),
        ),
        routing_seconds: timing.time().as_secs_f64(),
        routing_ms_per_slab: per_second(timing.time().as_secs_f64() * 1e3, timing.slabs() as f64),
        routing_share_of_slab_time: per_second(timing.time().as_secs_f64(), busy.as_secs_f64()),
        routing_cpu_ms_per_slab: timing
            .cpu_time()
            .map(|cpu| per_second(cpu.as_secs_f64() * 1e3, timing.slabs() as f64)),
        routing_share_of_cpu: per_second(
            timing.cpu_time().unwrap_or(timing.time()).as_secs_f64(),
            cpu_used.as_secs_f64(),
        ),
        cpu_cores_used: per_second(cpu_used.as_secs_f64(), seconds),
        cpu_ns_per_copy: per_second(cpu_used.as_secs_f64() * 1e9, copies as f64),
        rss_before_bytes,
        peak_rss_bytes,
        peak_rss_reset,
    };

    // Every child must hold every record.
    let verified = {
        let (store, high, opts) = (Arc::clone(&rig.store), high.clone(), options.clone());
        blocking(move || verify_children(&store, &high, &opts)).await??
    };
    progress.step(&format!(
        "children checked: each holds all {per_child_records} records ({:.1} s)",
        verified.seconds
    ));

    // The raw loops again, on the same parent and disk.
    let (raw_after, read_back_after) = raw_loops(
        &rig,
        &work,
        "after",
        &high,
        &options,
        filled.payload_bytes,
        &mut progress,
    )
    .await?;
    let raw = combine(
        &[&raw_before, &raw_after],
        &high,
        &options,
        filled.payload_bytes,
    );
    let raw_read_back = combine(
        &[&read_back_before, &read_back_after],
        &high,
        &options,
        filled.payload_bytes,
    );
    blocking({
        let store = Arc::clone(&rig.store);
        move || store.close()
    })
    .await?
    .map_err(BenchError::storage("closing the store"))?;

    let ratio = per_second(fanout.records_per_s, raw.records_per_s);
    let ratio_to_read_back_loop = per_second(fanout.records_per_s, raw_read_back.records_per_s);
    Ok(FanoutReport {
        bench: "fanout",
        dir: work.path_buf(),
        file_system: work.file_system.clone(),
        records: options.records,
        children: options.children,
        partitions: options.partitions,
        child_partitions: options.child_partitions,
        key_bytes: options.key_bytes,
        value_bytes: options.value_bytes,
        offset_sync_every_ms: u64::try_from(options.offset_sync_every.as_millis())
            .unwrap_or(u64::MAX),
        slabs_per_commit: options.slabs_per_commit,
        fill,
        raw_loop: raw_loop_of(&options),
        fanout,
        raw,
        raw_runs: vec![raw_before.0, raw_after.0],
        raw_read_back,
        raw_read_back_runs: vec![read_back_before.0, read_back_after.0],
        disk,
        ratio,
        ratio_to_read_back_loop,
        verified,
        goals: Goals {
            one_child_records_per_s: GOAL_ONE_CHILD_RECORDS_PER_S,
            one_child_records_per_s_speed_issue: GOAL_ONE_CHILD_RECORDS_PER_S_SPEED_ISSUE,
            sixteen_children_copies_per_s: GOAL_SIXTEEN_CHILDREN_COPIES_PER_S,
            ratio: GOAL_RATIO,
            ratio_speed_issue: GOAL_RATIO_SPEED_ISSUE,
            routing_share: GOAL_ROUTING_SHARE,
        },
        load_before,
        load_after: sys::load_average(),
    })
}

/// Waits until every cursor's position reached its parent partition's high watermark;
/// returns when each got there, measured from `start`.
pub(super) async fn wait_for_copy(
    cursors: &[RunningCursor],
    high: &[u64],
    start: Instant,
    progress: &mut Progress,
) -> Result<Vec<Duration>, BenchError> {
    let mut done_at: Vec<Option<Duration>> = vec![None; cursors.len()];
    let total: u64 = cursors.iter().map(|c| high[c.key.partition as usize]).sum();
    let mut last_copied = 0u64;
    let mut last_progress = Instant::now();
    loop {
        let mut copied = 0u64;
        for (i, cursor) in cursors.iter().enumerate() {
            let target = high[cursor.key.partition as usize];
            let report = cursor.status.report();
            let next = report.next_offset.unwrap_or(0).min(target);
            copied += next;
            if done_at[i].is_none() && next >= target {
                done_at[i] = Some(start.elapsed());
            }
            if cursor.task.is_finished() && done_at[i].is_none() {
                return Err(BenchError::Cursor {
                    cursor: cursor.name(),
                    reason: format!(
                        "it ended after copying {next} of {target} records ({:?})",
                        report.last_error
                    ),
                });
            }
        }
        if done_at.iter().all(Option::is_some) {
            progress.finish();
            return Ok(done_at.into_iter().map(Option::unwrap_or_default).collect());
        }
        if copied > last_copied {
            last_copied = copied;
            last_progress = Instant::now();
        } else if last_progress.elapsed() > NO_PROGRESS_LIMIT {
            let stalled = cursors
                .iter()
                .find(|c| c.status.report().state == CursorState::Stalled)
                .unwrap_or(&cursors[0]);
            return Err(BenchError::Cursor {
                cursor: stalled.name(),
                reason: format!(
                    "no progress for {} s: {}",
                    NO_PROGRESS_LIMIT.as_secs(),
                    stalled.status.report().last_error.unwrap_or_default()
                ),
            });
        }
        progress.update(|| {
            let secs = start.elapsed().as_secs_f64();
            format!(
                "fan-out: {copied}/{total} record copies, {:.0} records/s",
                per_second(copied as f64, secs)
            )
        });
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Reads every child back: each parent record must be there (by its provenance), on the
/// partition the default chain gives it ([`default_chain_partition`]): Kafka's hash of its key;
/// for a keyless record its parent partition when the counts match, else any (round-robin).
fn verify_children(
    store: &Store,
    high: &[u64],
    options: &FanoutOptions,
) -> Result<Verified, BenchError> {
    let start = Instant::now();
    let mut child_records = Vec::new();
    let mut duplicates = 0u64;
    for c in 0..options.children {
        let child = child_name(c);
        let incomplete = |reason: String| BenchError::Incomplete {
            child: child.clone(),
            reason,
        };
        let mut seen: Vec<Vec<bool>> = high.iter().map(|&h| vec![false; h as usize]).collect();
        let mut found = 0u64;
        for p in 0..options.child_partitions {
            let id = PartitionId::new(child.clone(), p);
            let mut offset = 0u64;
            loop {
                let read = store
                    .read(
                        &id,
                        &ReadOptions {
                            offset,
                            max_records: VERIFY_READ_RECORDS,
                            max_bytes: usize::MAX,
                            max_committed_at_ms: None,
                        },
                    )
                    .map_err(BenchError::storage(format!("reading {id}")))?;
                for record in &read.records {
                    let Some(origin) = &record.origin else {
                        return Err(incomplete(format!(
                            "{id} offset {} has no provenance",
                            record.offset
                        )));
                    };
                    // `None`: a keyless record round-robin placed; any partition is right.
                    let want = default_chain_partition(
                        record.key.as_deref(),
                        origin.parent_partition,
                        options.partitions,
                        options.child_partitions,
                    );
                    if want.is_some_and(|want| want != p) {
                        return Err(incomplete(format!(
                            "{id} offset {} (parent p{} offset {}) belongs on partition {want:?}",
                            record.offset, origin.parent_partition, origin.parent_offset
                        )));
                    }
                    let slot = seen
                        .get_mut(origin.parent_partition as usize)
                        .and_then(|s| s.get_mut(origin.parent_offset as usize))
                        .ok_or_else(|| {
                            incomplete(format!(
                                "{id} offset {} names parent p{} offset {}, which does not exist",
                                record.offset, origin.parent_partition, origin.parent_offset
                            ))
                        })?;
                    if *slot {
                        duplicates += 1;
                    } else {
                        *slot = true;
                        found += 1;
                    }
                }
                if read.records.is_empty() || read.next_offset >= read.high_watermark {
                    break;
                }
                offset = read.next_offset;
            }
        }
        for (p, seen) in seen.iter().enumerate() {
            if let Some(missing) = seen.iter().position(|s| !s) {
                return Err(incomplete(format!(
                    "parent p{p} offset {missing} is missing ({found} of {} records found)",
                    high.iter().sum::<u64>()
                )));
            }
        }
        child_records.push(found);
    }
    Ok(Verified {
        child_records,
        duplicates,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The raw loop: per (child, parent partition) a worker reads the parent in slabs and writes
/// each slab, encoded as a child batch, to its own plain file with `pwrite` + `fdatasync`.
fn raw_copy(
    store: &Store,
    dir: &std::path::Path,
    high: &[u64],
    options: &FanoutOptions,
    payload_per_child: u64,
    read_back: ReadBack,
) -> Result<RawRun, BenchError> {
    std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let start = Instant::now();
    let outcomes: Vec<Result<(u32, Duration, u64, u64), BenchError>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..options.children)
            .flat_map(|c| (0..options.partitions).map(move |p| (c, p)))
            .map(|(c, p)| {
                let path = dir.join(format!("{}-p{p:05}.bin", child_name(c)));
                let end = high[p as usize];
                s.spawn(move || {
                    raw_worker(store, &path, p, end, read_back)
                        .map(|(slabs, written)| (c, start.elapsed(), slabs, written))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|payload| Err(BenchError::worker_panicked(payload.as_ref())))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut child_done = vec![Duration::ZERO; options.children as usize];
    let (mut slabs, mut written) = (0u64, 0u64);
    for outcome in outcomes {
        let (c, done, s, w) = outcome?;
        child_done[c as usize] = child_done[c as usize].max(done);
        slabs += s;
        written += w;
    }
    let totals = RawTotals {
        seconds,
        child_seconds: child_done.iter().map(Duration::as_secs_f64).collect(),
        written,
        slabs,
        buckets: slabs,
    };
    Ok((
        raw_figures(&totals, 1, high, options, payload_per_child),
        totals,
    ))
}

/// One raw run: its figures and the totals they came from.
type RawRun = (RawFigures, RawTotals);

/// What a raw run measured, before dividing.
#[derive(Clone, Debug)]
struct RawTotals {
    seconds: f64,
    child_seconds: Vec<f64>,
    written: u64,
    slabs: u64,
    buckets: u64,
}

/// Figures of `runs` raw runs whose totals were added up in `t`.
fn raw_figures(
    t: &RawTotals,
    runs: u64,
    high: &[u64],
    options: &FanoutOptions,
    payload_per_child: u64,
) -> RawFigures {
    let per_child_records = high.iter().sum::<u64>() * runs;
    let copies = per_child_records * u64::from(options.children);
    RawFigures {
        seconds: t.seconds,
        records_per_s: per_second(copies as f64, t.seconds),
        records_per_s_per_child: t
            .child_seconds
            .iter()
            .map(|s| per_second(per_child_records as f64, *s))
            .collect(),
        mb_per_s: per_second(
            (payload_per_child * runs * u64::from(options.children)) as f64 / 1e6,
            t.seconds,
        ),
        written_mb_per_s: per_second(t.written as f64 / 1e6, t.seconds),
        slabs: t.slabs,
        buckets: t.buckets,
    }
}

/// The raw runs taken together: their copies over their summed time.
fn combine(
    runs: &[&RawRun],
    high: &[u64],
    options: &FanoutOptions,
    payload_per_child: u64,
) -> RawFigures {
    let mut sum = RawTotals {
        seconds: 0.0,
        child_seconds: vec![0.0; options.children as usize],
        written: 0,
        slabs: 0,
        buckets: 0,
    };
    for (_, t) in runs {
        sum.seconds += t.seconds;
        for (total, s) in sum.child_seconds.iter_mut().zip(&t.child_seconds) {
            *total += s;
        }
        sum.written += t.written;
        sum.slabs += t.slabs;
        sum.buckets += t.buckets;
    }
    raw_figures(&sum, runs.len() as u64, high, options, payload_per_child)
}

/// The raw loop `options` call for: the slab loop when both sides have the same partition
/// count (a slab is then one bucket, and the figures stay comparable with earlier runs), else
/// the bucket loop.
fn raw_loop_of(options: &FanoutOptions) -> &'static str {
    if options.child_partitions == options.partitions {
        RAW_LOOP_SLABS
    } else {
        RAW_LOOP_BUCKETS
    }
}

/// Runs the raw loop into `{work}/{name}/` and removes its files afterwards.
/// The raw loop, then the read-back loop, one run each `when` ("before" or "after" the
/// fan-out), each reported on `progress`.
async fn raw_loops(
    rig: &Rig,
    work: &WorkDir,
    when: &str,
    high: &[u64],
    options: &FanoutOptions,
    payload_per_child: u64,
    progress: &mut Progress,
) -> Result<(RawRun, RawRun), BenchError> {
    let raw = raw_run(
        rig,
        work,
        &format!("raw-{when}"),
        high,
        options,
        payload_per_child,
        ReadBack::No,
    )
    .await?;
    report_raw(progress, "raw loop", when, &raw);
    let read_back = raw_run(
        rig,
        work,
        &format!("raw-read-back-{when}"),
        high,
        options,
        payload_per_child,
        ReadBack::FromDevice,
    )
    .await?;
    report_raw(progress, "raw loop with read-back", when, &read_back);
    Ok((raw, read_back))
}

/// One progress line for a raw run.
fn report_raw(progress: &mut Progress, label: &str, when: &str, run: &RawRun) {
    progress.step(&format!(
        "{label} ({when}): {:.0} record copies/s in {:.2} s",
        run.0.records_per_s, run.0.seconds
    ));
}

/// One run of the raw loop (`read_back`: or of the read-back loop) into a fresh directory
/// `name` of the bench's work directory, removed afterwards.
async fn raw_run(
    rig: &Rig,
    work: &WorkDir,
    name: &str,
    high: &[u64],
    options: &FanoutOptions,
    payload_per_child: u64,
    read_back: ReadBack,
) -> Result<RawRun, BenchError> {
    let (store, dir, high, opts) = (
        Arc::clone(&rig.store),
        work.path().join(name),
        high.to_vec(),
        options.clone(),
    );
    blocking(move || {
        let run = if raw_loop_of(&opts) == RAW_LOOP_BUCKETS {
            raw_bucket_copy(
                &store,
                &dir,
                &high,
                opts.children,
                opts.child_partitions,
                read_back,
            )
            .map(|b| {
                let totals = RawTotals {
                    seconds: b.seconds,
                    child_seconds: b.child_seconds,
                    written: b.written,
                    slabs: b.slabs,
                    buckets: b.buckets,
                };
                (
                    raw_figures(&totals, 1, &high, &opts, payload_per_child),
                    totals,
                )
            })
        } else {
            raw_copy(&store, &dir, &high, &opts, payload_per_child, read_back)
        };
        let removed = std::fs::remove_dir_all(&dir);
        let run = run?;
        removed.map_err(BenchError::io(format!("removing {}", dir.display())))?;
        Ok(run)
    })
    .await?
}

/// Copies parent partition `partition` up to `end` into the file at `path`, reading each slab
/// back from the device when `read_back` says so; returns the slabs and bytes written.
fn raw_worker(
    store: &Store,
    path: &std::path::Path,
    partition: u32,
    end: u64,
    read_back: ReadBack,
) -> Result<(u64, u64), BenchError> {
    let mut file = RawFile::create(path, read_back)?;
    let id = PartitionId::new("parent", partition);
    let epoch = [0x5A; 8];
    let (mut offset, mut slabs) = (0u64, 0u64);
    let mut frame = Vec::new();
    while offset < end {
        let read = store
            .read(
                &id,
                &ReadOptions {
                    offset,
                    max_records: SLAB_MAX_RECORDS,
                    max_bytes: SLAB_MAX_BYTES,
                    max_committed_at_ms: None,
                },
            )
            .map_err(BenchError::storage(format!("reading {id}")))?;
        if read.records.is_empty() {
            break;
        }
        let origin = BatchOrigin {
            epoch,
            parent_partition: partition,
            slab_start: offset,
            parent_offsets: read.records.iter().map(|r| r.offset).collect(),
        };
        let records: Vec<NewRecord> = read
            .records
            .iter()
            .map(|r| NewRecord {
                key: r.key.clone(),
                headers: r
                    .headers
                    .iter()
                    .map(|h| Header {
                        name: h.name.clone(),
                        value: h.value.clone(),
                    })
                    .collect(),
                value: r.value.clone(),
            })
            .collect();
        frame.clear();
        narad_storage::log::format::encode_batch(&records, Some(&origin), &mut frame)
            .map_err(BenchError::storage("encoding a slab"))?;
        file.append(&frame)?;
        slabs += 1;
        offset = read.next_offset;
    }
    Ok((slabs, file.len()))
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("?".to_owned(), |b| {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    })
}

impl FanoutReport {
    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        let f = &self.fanout;
        let r = &self.raw;
        let fs = self
            .file_system
            .as_ref()
            .map_or("unknown file system".to_owned(), |f| {
                format!("{} ({})", f.fs_type, f.source)
            });
        let per_child = if self.children == 1 {
            String::new()
        } else {
            format!(
                "\nper child: slowest {:.0} records/s (raw loop slowest {:.0})",
                f.records_per_s_per_child_min,
                r.records_per_s_per_child
                    .iter()
                    .copied()
                    .fold(f64::INFINITY, f64::min)
            )
        };
        let shares = [
            f.commit_share_of_slab_time,
            f.advance_sync_share_of_slab_time,
            f.routing_share_of_slab_time,
        ];
        let slab_time = format!(
            "child commits {:.1}%, offset-file fdatasyncs {:.1}%, routing {:.1}%",
            shares[0] * 100.0,
            shares[1] * 100.0,
            shares[2] * 100.0
        );
        let rest = 1.0 - shares.iter().sum::<f64>();
        let slab_time = if rest >= 0.0 {
            format!(
                "{slab_time}, the rest (reads, scheduling) {:.1}%",
                rest * 100.0
            )
        } else {
            // Several buckets of a slab commit at once; their times add up past the slab's.
            format!("{slab_time} (commit time summed over the buckets committed at once)")
        };
        let raw_loop = if self.raw_loop == RAW_LOOP_BUCKETS {
            format!(
                "bucket loop: slabs split by the default chain's rules, {:.2} buckets per slab, one pwrite + fdatasync each",
                per_second(r.buckets as f64, r.slabs as f64)
            )
        } else {
            "slab loop: one pwrite + fdatasync per slab, no split".to_owned()
        };
        let goal = if self.children == 1 {
            format!(
                "goal one child >= {:.0} records/s: {}; speed issue >= {:.0}: {}",
                self.goals.one_child_records_per_s,
                met(f.records_per_s >= self.goals.one_child_records_per_s),
                self.goals.one_child_records_per_s_speed_issue,
                met(f.records_per_s >= self.goals.one_child_records_per_s_speed_issue)
            )
        } else if self.children == 16 {
            format!(
                "goal 16 children >= {:.0} copies/s in all: {}",
                self.goals.sixteen_children_copies_per_s,
                met(f.records_per_s >= self.goals.sixteen_children_copies_per_s)
            )
        } else {
            format!(
                "(the copy goals are for 1 child, {:.0} records/s, and 16 children, {:.0} copies/s)",
                self.goals.one_child_records_per_s, self.goals.sixteen_children_copies_per_s
            )
        };
        format!(
            "fanout: {} records ({}-byte keys, {}-byte values) from {} partitions into {} child(ren) of {} partitions, default chain, on {fs}\n\
             fill       {:>10.0} records/s ({:.1} s)\n\
             fan-out    {:>10.0} record copies/s in all, {:.1} MB/s of records ({:.1} MB/s written), {:.2} s{per_child}\n\
             raw loop   {:>10.0} record copies/s in all, {:.1} MB/s of records, {:.2} s (before the fan-out {:.0}/s, after {:.0}/s); {raw_loop}\n\
             + read-back{:>10.0} record copies/s in all, {:.2} s (before {:.0}/s, after {:.0}/s): the same loop reading each write back from the device, as the store does\n\
             disk       256-byte in-place fdatasync {:.2} ms, 512 KiB append + fdatasync {:.2} ms: one cursor's I/O ceiling {:.0} records/s\n\
             ratio fan-out/raw {:.2}x (goal >= {:.2}x: {}; speed issue >= {:.2}x: {}); {goal}\n\
             ratio fan-out/(raw + read-back) {:.2}x: the engine's own cost over the same durable disk work\n\
             slabs {} ({:.0} records each), {:.2} child commits and {:.2} fdatasyncs per slab (raw loop: {:.2}), {:.2} ms per fdatasync; offset files synced at most every {} ms; up to {} slabs per commit\n\
             read-back from the device {:.2} reads per fdatasync, {:.2} ms each, {:.1} MB/s\n\
             slab time: {slab_time}\n\
             routing {:.3} ms per slab ({} CPU) = {:.2}% of slab time (goal < {:.0}%: {}), {:.2}% of CPU; CPU {:.2} cores, {:.0} ns per copy\n\
             memory: {} at start of the copy, peak {}{}\n\
             checked: every child holds all {} records, {} duplicates\n\
             load average before {} / after {}",
            self.records,
            self.key_bytes,
            self.value_bytes,
            self.partitions,
            self.children,
            self.child_partitions,
            self.fill.records_per_s,
            self.fill.seconds,
            f.records_per_s,
            f.mb_per_s,
            f.written_mb_per_s,
            f.seconds,
            r.records_per_s,
            r.mb_per_s,
            r.seconds,
            self.raw_runs.first().map_or(0.0, |r| r.records_per_s),
            self.raw_runs.get(1).map_or(0.0, |r| r.records_per_s),
            self.raw_read_back.records_per_s,
            self.raw_read_back.seconds,
            self.raw_read_back_runs
                .first()
                .map_or(0.0, |r| r.records_per_s),
            self.raw_read_back_runs
                .get(1)
                .map_or(0.0, |r| r.records_per_s),
            self.disk.in_place_256b_ms,
            self.disk.append_512kib_ms,
            self.disk.one_cursor_ceiling_records_per_s,
            self.ratio,
            self.goals.ratio,
            met(self.ratio >= self.goals.ratio),
            self.goals.ratio_speed_issue,
            met(self.ratio >= self.goals.ratio_speed_issue),
            self.ratio_to_read_back_loop,
            f.slabs,
            f.records_per_slab,
            f.commits_per_slab,
            f.fsyncs_per_slab,
            per_second(r.buckets as f64, r.slabs as f64),
            f.fsync_ms_mean,
            self.offset_sync_every_ms,
            self.slabs_per_commit,
            f.device_reads_per_fsync,
            f.device_read_ms_mean,
            f.device_read_mb_per_s,
            f.routing_ms_per_slab,
            f.routing_cpu_ms_per_slab
                .map_or_else(|| "unknown".to_owned(), |ms| format!("{ms:.3} ms")),
            f.routing_share_of_slab_time * 100.0,
            self.goals.routing_share * 100.0,
            met(f.routing_share_of_slab_time < self.goals.routing_share),
            f.routing_share_of_cpu * 100.0,
            f.cpu_cores_used,
            f.cpu_ns_per_copy,
            mib(f.rss_before_bytes),
            mib(f.peak_rss_bytes),
            if f.peak_rss_reset { "" } else { " (whole run)" },
            self.records,
            self.verified.duplicates,
            sys::load_text(self.load_before),
            sys::load_text(self.load_after),
        )
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run_4_to_12(key_bytes: usize) -> FanoutReport {
        let dir = tempfile::tempdir().unwrap();
        run_fanout(FanoutOptions {
            records: 3_000,
            children: 2,
            partitions: 4,
            child_partitions: 12,
            key_bytes,
            value_bytes: 50,
            dir: Some(dir.path().to_path_buf()),
            progress: false,
            ..FanoutOptions::default()
        })
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_of_more_partitions_gets_every_keyed_record_and_the_raw_loop_writes_buckets() {
        let report = run_4_to_12(16).await;
        assert_eq!(report.verified.child_records, vec![3_000, 3_000]);
        assert_eq!(report.child_partitions, 12);
        assert_eq!(report.raw_loop, RAW_LOOP_BUCKETS);
        // Every slab of 16-byte keys spreads over the 12 child partitions.
        assert!(report.raw.buckets > report.raw.slabs, "{:?}", report.raw);
        assert!(report.fanout.commits_per_slab > 1.0, "{:?}", report.fanout);
        assert!(report.to_text().contains("bucket loop"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_of_more_partitions_gets_every_keyless_record_placed_round_robin() {
        let report = run_4_to_12(0).await;
        assert_eq!(report.verified.child_records, vec![3_000, 3_000]);
        assert_eq!(report.verified.duplicates, 0);
    }
}
