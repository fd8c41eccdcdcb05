//! `narad bench produce`: the log's append path against a raw `write` + `fdatasync` loop.
//!
//! Each round appends one batch through `Store::append` (frame, checksum, write, `fdatasync`,
//! read back and verify, segment rolls included) and writes the very same frame bytes to a
//! plain file in the same directory followed by `fdatasync`. The two sides alternate batch by
//! batch (and swap which goes first every round), so both see the same disk and the same
//! neighbours; the ratio is the log's throughput over the raw loop's (goal: at least 0.8).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_storage::{AppendBatch, LogConfig, NewRecord, PartitionId, Store, StoreOptions};
use serde::Serialize;

use super::progress::Progress;
use super::sys::{self, FileSystemInfo};
use super::workdir::WorkDir;
use super::{BenchError, blocking, per_second};

/// The log's throughput as a share of the raw loop's that the issue asks for.
pub const PRODUCE_GOAL_RATIO: f64 = 0.8;

/// Default batch size: 4 MiB, the engine reference's slab byte cap.
pub const DEFAULT_BATCH_BYTES: u64 = 4 << 20;

/// Default bytes written by each side: 512 MiB (128 batches of 4 MiB), enough for several
/// segment rolls at the default segment size without filling a small disk.
pub const DEFAULT_TOTAL_BYTES: u64 = 512 << 20;

/// Default value size of each record: 1 KiB, so a 4 MiB batch holds 4,096 records (the
/// engine's slab record cap).
pub const DEFAULT_VALUE_BYTES: usize = 1024;

/// What to run.
#[derive(Clone, Debug)]
pub struct ProduceOptions {
    /// Record bytes per batch (values; keys and framing come on top).
    pub batch_bytes: u64,
    /// Record bytes each side writes in all.
    pub total_bytes: u64,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
}

impl Default for ProduceOptions {
    fn default() -> ProduceOptions {
        ProduceOptions {
            batch_bytes: DEFAULT_BATCH_BYTES,
            total_bytes: DEFAULT_TOTAL_BYTES,
            value_bytes: DEFAULT_VALUE_BYTES,
            dir: None,
            progress: false,
        }
    }
}

/// One side's figures.
#[derive(Clone, Debug, Serialize)]
pub struct SideFigures {
    /// Frame bytes per second, in MB (10^6 bytes).
    pub mb_per_s: f64,
    /// Time spent on this side, in seconds.
    pub seconds: f64,
    /// Median time of one batch (write + `fdatasync`), in milliseconds.
    pub batch_ms_p50: f64,
    /// 99th percentile of that time, in milliseconds.
    pub batch_ms_p99: f64,
    /// Slowest batch, in milliseconds.
    pub batch_ms_max: f64,
}

/// What `narad bench produce` measured.
#[derive(Clone, Debug, Serialize)]
pub struct ProduceReport {
    /// Always `"produce"`.
    pub bench: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it was on.
    pub file_system: Option<FileSystemInfo>,
    /// Records per batch.
    pub records_per_batch: usize,
    /// Bytes of one encoded batch (what each side writes per batch).
    pub frame_bytes: u64,
    /// Batches each side wrote.
    pub batches: u64,
    /// The log: `Store::append`.
    pub log: SideFigures,
    /// The raw loop: `pwrite` + `fdatasync` of the same bytes.
    pub raw: SideFigures,
    /// `log.mb_per_s / raw.mb_per_s`.
    pub ratio: f64,
    /// The goal for `ratio`.
    pub goal_ratio: f64,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after the run.
    pub load_after: Option<[f64; 3]>,
}

fn figures(bytes: u64, mut times: Vec<Duration>) -> SideFigures {
    let total: Duration = times.iter().sum();
    times.sort_unstable();
    let pick = |q: f64| {
        if times.is_empty() {
            return 0.0;
        }
        let index = ((times.len() - 1) as f64 * q).round() as usize;
        times[index.min(times.len() - 1)].as_secs_f64() * 1e3
    };
    SideFigures {
        mb_per_s: per_second(bytes as f64 / 1e6, total.as_secs_f64()),
        seconds: total.as_secs_f64(),
        batch_ms_p50: pick(0.5),
        batch_ms_p99: pick(0.99),
        batch_ms_max: pick(1.0),
    }
}

/// A batch of `count` records of `value_bytes` bytes each, keyed `key-{i}`.
fn batch(count: usize, value_bytes: usize) -> AppendBatch {
    // One pool of pseudo-random bytes; each value is a slice of it (no per-record allocation,
    // and not trivially compressible by a file system that compresses).
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let pool: Vec<u8> = (0..value_bytes + 4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let pool = Bytes::from(pool);
    let records = (0..count)
        .map(|i| {
            let start = (i * 61) % 4096;
            NewRecord {
                key: Some(Bytes::from(format!("key-{i}"))),
                headers: Vec::new(),
                value: Some(pool.slice(start..start + value_bytes)),
            }
        })
        .collect();
    AppendBatch {
        records,
        origin: None,
    }
}

/// Runs the produce bench. Blocking work runs on the blocking pool.
pub async fn run_produce(options: ProduceOptions) -> Result<ProduceReport, BenchError> {
    blocking(move || run_produce_blocking(&options)).await?
}

fn run_produce_blocking(options: &ProduceOptions) -> Result<ProduceReport, BenchError> {
    if options.value_bytes == 0 || options.batch_bytes < options.value_bytes as u64 {
        return Err(BenchError::Options(format!(
            "a batch of {} bytes cannot hold one record of {} bytes",
            options.batch_bytes, options.value_bytes
        )));
    }
    if options.total_bytes < options.batch_bytes {
        return Err(BenchError::Options(format!(
            "total {} bytes is less than one batch of {} bytes",
            options.total_bytes, options.batch_bytes
        )));
    }
    let load_before = sys::load_average();
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench produce in {} on {}",
        work.path().display(),
        work.describe_file_system()
    ));

    let store = Store::open(&work.path().join("data"), StoreOptions::default())
        .map_err(BenchError::storage("opening the store"))?;
    let id = PartitionId::new("bench-produce", 0);
    store
        .create_partition(&id, LogConfig::default())
        .map_err(BenchError::storage("creating the partition"))?;

    let records_per_batch = usize::try_from(options.batch_bytes / options.value_bytes as u64)
        .map_err(|_| BenchError::Options("batch too large".into()))?;
    let template = batch(records_per_batch, options.value_bytes);
    let mut frame = Vec::new();
    narad_storage::log::format::encode_batch(&template.records, None, &mut frame)
        .map_err(BenchError::storage("encoding the batch"))?;
    let frame_bytes = frame.len() as u64;
    let batches = options.total_bytes / options.batch_bytes;

    let raw_path = work.path().join("raw.bin");
    let raw = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&raw_path)
        .map_err(BenchError::io(format!("creating {}", raw_path.display())))?;
    let mut raw_offset = 0u64;
    let (mut log_times, mut raw_times) = (Vec::new(), Vec::new());
    let log_round = |log_times: &mut Vec<Duration>| -> Result<(), BenchError> {
        let batch = template.clone();
        let start = Instant::now();
        store
            .append(&id, batch)
            .map_err(BenchError::storage("appending a batch to the log"))?;
        log_times.push(start.elapsed());
        Ok(())
    };
    for round in 0..batches {
        let mut raw_round = |raw_times: &mut Vec<Duration>| -> Result<(), BenchError> {
            let start = Instant::now();
            raw.write_all_at(&frame, raw_offset)
                .and_then(|()| raw.sync_data())
                .map_err(BenchError::io("raw write + fdatasync"))?;
            raw_times.push(start.elapsed());
            raw_offset += frame_bytes;
            Ok(())
        };
        // Alternate which side goes first, so neither always follows the other's flush.
        if round % 2 == 0 {
            log_round(&mut log_times)?;
            raw_round(&mut raw_times)?;
        } else {
            raw_round(&mut raw_times)?;
            log_round(&mut log_times)?;
        }
        progress.update(|| format!("batch {}/{batches}", round + 1));
    }
    progress.finish();
    store
        .close()
        .map_err(BenchError::storage("closing the store"))?;

    let total = batches * frame_bytes;
    let log = figures(total, log_times);
    let raw = figures(total, raw_times);
    let ratio = if raw.mb_per_s > 0.0 {
        log.mb_per_s / raw.mb_per_s
    } else {
        0.0
    };
    Ok(ProduceReport {
        bench: "produce",
        dir: work.path_buf(),
        file_system: work.file_system.clone(),
        records_per_batch,
        frame_bytes,
        batches,
        log,
        raw,
        ratio,
        goal_ratio: PRODUCE_GOAL_RATIO,
        load_before,
        load_after: sys::load_average(),
    })
}

impl ProduceReport {
    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        let fs = self
            .file_system
            .as_ref()
            .map_or("unknown file system".to_owned(), |f| {
                format!("{} ({})", f.fs_type, f.source)
            });
        let load = sys::load_text;
        format!(
            "produce: {} batches of {} records ({:.2} MB per batch) per side, interleaved, on {fs}\n\
             log (Store::append)       {:>8.1} MB/s   batch p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms\n\
             raw write + fdatasync     {:>8.1} MB/s   batch p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms\n\
             ratio log/raw             {:>8.2}x       (goal >= {:.2}x: {})\n\
             load average before {} / after {}",
            self.batches,
            self.records_per_batch,
            self.frame_bytes as f64 / 1e6,
            self.log.mb_per_s,
            self.log.batch_ms_p50,
            self.log.batch_ms_p99,
            self.log.batch_ms_max,
            self.raw.mb_per_s,
            self.raw.batch_ms_p50,
            self.raw.batch_ms_p99,
            self.raw.batch_ms_max,
            self.ratio,
            self.goal_ratio,
            if self.ratio >= self.goal_ratio {
                "met"
            } else {
                "NOT met"
            },
            load(self.load_before),
            load(self.load_after),
        )
    }
}
