//! `narad bench fanout --idle-delay-cursors N`: what N delay cursors cost while nothing they
//! hold is due.
//!
//! A parent is filled with a backlog, then children with a one-hour delay are attached at
//! offset 0, so every cursor starts in front of records that will not be due for an hour.
//! Once every cursor reports it is waiting, the bench reads the process's CPU time over a
//! window: an idle delay cursor sleeps until its first record is due (at most 30 s at a
//! time) and reads one record when it wakes, so the cost must not depend on the backlog.
//! Afterwards the children must still be empty (nothing was copied early).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::progress::Progress;
use super::rig::{Backlog, Rig, RunningCursor, stop_all, wait_for_state};
use super::sys::{self, FileSystemInfo};
use super::timed_router::RouteTiming;
use super::workdir::WorkDir;
use super::{BenchError, blocking, per_second};
use narad_host::fanout::status::CursorState;
use narad_host::shutdown;

/// Delay of the idle children: one hour, far longer than the bench, so nothing comes due.
pub const IDLE_DELAY_MS: u64 = 60 * 60 * 1000;

/// Most children per parent used by this bench (the limit is 108 per parent); the cursor count
/// is children x parent partitions.
const IDLE_CHILDREN_MAX: u32 = 100;

/// Partitions of each idle child: like the fan-out bench's children.
const IDLE_CHILD_PARTITIONS: u32 = 4;

/// Default measurement window: two full 30 s sleeps of every cursor.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// Longest wait for every cursor to settle into waiting.
const SETTLE_LIMIT: Duration = Duration::from_secs(600);

/// How often the bench looks at the cursors while they settle.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What to run.
#[derive(Clone, Debug)]
pub struct IdleOptions {
    /// Delay cursors to start (rounded up to children x partitions).
    pub cursors: u32,
    /// Backlog records in the parent, spread over its partitions.
    pub records: u64,
    /// Key bytes per record.
    pub key_bytes: usize,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// How long to measure once settled.
    pub window: Duration,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
}

/// What the idle bench measured.
#[derive(Clone, Debug, Serialize)]
pub struct IdleReport {
    /// Always `"fanout-idle-delay"`.
    pub bench: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it was on.
    pub file_system: Option<FileSystemInfo>,
    /// Delay cursors running.
    pub cursors: u64,
    /// Parent partitions.
    pub parent_partitions: u32,
    /// Delay children (each with [`IDLE_CHILD_PARTITIONS`] partitions).
    pub children: u32,
    /// The children's delay, milliseconds.
    pub delay_ms: u64,
    /// Backlog records in the parent.
    pub backlog_records: u64,
    /// Backlog records per parent partition (what each cursor has in front of it).
    pub backlog_per_partition: u64,
    /// Seconds from starting the cursors until all were waiting.
    pub settle_seconds: f64,
    /// Length of the measurement window, seconds.
    pub window_seconds: f64,
    /// Process CPU seconds used in the window.
    pub cpu_seconds: f64,
    /// CPU seconds per wall second (cores busy) in the window.
    pub cpu_cores_used: f64,
    /// CPU microseconds per cursor per second in the window.
    pub cpu_us_per_cursor_per_s: f64,
    /// Bytes read from files in the window (page cache included), per cursor per minute.
    pub read_bytes_per_cursor_per_minute: f64,
    /// `fdatasync`s in the window (nothing to commit: should be 0).
    pub fsyncs: u64,
    /// Resident memory after settling, bytes.
    pub rss_bytes: Option<u64>,
    /// Peak resident memory of the run, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Cursors still waiting at the end of the window.
    pub waiting_at_end: u64,
    /// Records found in the children afterwards (nothing was due: must be 0).
    pub copied_early: u64,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after the run.
    pub load_after: Option<[f64; 3]>,
}

/// Runs the idle delay cursors bench.
pub async fn run_idle(options: IdleOptions) -> Result<IdleReport, BenchError> {
    if options.cursors == 0 {
        return Err(BenchError::Options("no cursors to start".into()));
    }
    let load_before = sys::load_average();
    let children = options.cursors.min(IDLE_CHILDREN_MAX);
    let partitions = options.cursors.div_ceil(children);
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench idle delay cursors in {} on {}: {children} children x {partitions} parent partitions",
        work.path().display(),
        work.describe_file_system()
    ));
    let parent = "idle-parent";
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

    let timing = Arc::new(RouteTiming::default());
    let mut links = Vec::new();
    for c in 0..children {
        let child = format!("idle-child-{c:03}");
        rig.create_topic(&child, IDLE_CHILD_PARTITIONS).await?;
        let link = rig
            .attach_default(parent, &child, IDLE_DELAY_MS, vec![0; partitions as usize])
            .await?;
        links.push(rig.link_runtime(link, Arc::clone(&timing)).await?);
        progress.update(|| format!("attached {}/{children} delay children", c + 1));
    }
    progress.finish();

    let (trigger, signal) = shutdown::channel();
    let start = Instant::now();
    let mut cursors: Vec<RunningCursor> = Vec::new();
    for link in &links {
        for p in 0..partitions {
            cursors.push(rig.spawn_cursor(link, p, signal.clone()));
        }
    }
    let settled = wait_for_state(
        &cursors,
        CursorState::Waiting,
        "waiting",
        (SETTLE_LIMIT, POLL_INTERVAL),
        &mut progress,
    )
    .await;
    if let Err(error) = settled {
        let _ = stop_all(&trigger, cursors).await;
        return Err(error);
    }
    let settle_seconds = start.elapsed().as_secs_f64();
    progress.step(&format!(
        "{} delay cursors waiting after {settle_seconds:.1} s; measuring for {} s",
        cursors.len(),
        options.window.as_secs()
    ));

    let rss_bytes = sys::rss_bytes();
    let io_before = rig.fs.counts();
    let cpu_before = sys::cpu_time();
    let window_start = Instant::now();
    tokio::time::sleep(options.window).await;
    let window_seconds = window_start.elapsed().as_secs_f64();
    let cpu_seconds = match (cpu_before, sys::cpu_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64(),
        _ => 0.0,
    };
    let io = rig.fs.counts().since(&io_before);
    let waiting_at_end = cursors
        .iter()
        .filter(|c| c.status.report().state == CursorState::Waiting)
        .count() as u64;
    let count = cursors.len() as u64;
    stop_all(&trigger, cursors).await?;

    let mut copied_early = 0u64;
    for c in 0..children {
        let child = format!("idle-child-{c:03}");
        copied_early += rig
            .high_watermarks(&child, IDLE_CHILD_PARTITIONS)
            .await?
            .iter()
            .sum::<u64>();
    }
    if copied_early > 0 {
        return Err(BenchError::Incomplete {
            child: "idle-child-*".into(),
            reason: format!("{copied_early} records were copied before they were due"),
        });
    }
    blocking({
        let store = Arc::clone(&rig.store);
        move || store.close()
    })
    .await?
    .map_err(BenchError::storage("closing the store"))?;

    Ok(IdleReport {
        bench: "fanout-idle-delay",
        dir: work.path_buf(),
        file_system: work.file_system.clone(),
        cursors: count,
        parent_partitions: partitions,
        children,
        delay_ms: IDLE_DELAY_MS,
        backlog_records: options.records,
        backlog_per_partition: options.records / u64::from(partitions),
        settle_seconds,
        window_seconds,
        cpu_seconds,
        cpu_cores_used: per_second(cpu_seconds, window_seconds),
        cpu_us_per_cursor_per_s: per_second(cpu_seconds * 1e6, window_seconds * count as f64),
        read_bytes_per_cursor_per_minute: per_second(
            io.bytes_read as f64 * 60.0,
            window_seconds * count as f64,
        ),
        fsyncs: io.file_syncs,
        rss_bytes,
        peak_rss_bytes: sys::peak_rss_bytes(),
        waiting_at_end,
        copied_early,
        load_before,
        load_after: sys::load_average(),
    })
}

impl IdleReport {
    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        let load = sys::load_text;
        let mib = |b: Option<u64>| {
            b.map_or("?".to_owned(), |b| {
                format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
            })
        };
        format!(
            "idle delay cursors: {} cursors ({} children x {} parent partitions), delay {} s, backlog {} records ({} per partition)\n\
             settled (all waiting) in {:.1} s; window {:.1} s\n\
             CPU {:.3} s in the window = {:.4} cores = {:.2} us per cursor per second\n\
             reads {:.0} bytes per cursor per minute, {} fdatasyncs; {} of {} still waiting; {} records copied early\n\
             memory {} after settling, peak {}\n\
             load average before {} / after {}",
            self.cursors,
            self.children,
            self.parent_partitions,
            self.delay_ms / 1000,
            self.backlog_records,
            self.backlog_per_partition,
            self.settle_seconds,
            self.window_seconds,
            self.cpu_seconds,
            self.cpu_cores_used,
            self.cpu_us_per_cursor_per_s,
            self.read_bytes_per_cursor_per_minute,
            self.fsyncs,
            self.waiting_at_end,
            self.cursors,
            self.copied_early,
            mib(self.rss_bytes),
            mib(self.peak_rss_bytes),
            load(self.load_before),
            load(self.load_after),
        )
    }
}
