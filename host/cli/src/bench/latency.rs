//! `narad bench latency`: how long a record takes from its produce being acknowledged to its
//! copy being fetchable in a child, at steady produce rates.
//!
//! For each rate, in the in-process rig of `bench fanout` ([`super::rig`]: the real store,
//! the default chain built by the production router factory, the production child committer,
//! one real `run_cursor` per parent partition), a parent and a child of the same partition
//! count are created and the child attached at offset 0; the cursors start before anything is
//! produced. Then, for `seconds`:
//!
//! - **The producer** wakes every millisecond and produces the records due by then (the rate
//!   times the time since its start, less what it produced) as one request through
//!   [`Producer::produce`], the path `POST /v1/topics/{t}/records` takes (placement, one
//!   append + `fdatasync` + verify per partition, concurrently). One request is in flight at a
//!   time, so a request that takes longer than a tick carries the records due meanwhile.
//!   When it returns, every record of it is stamped with that moment: its ack time.
//! - **A reader per child partition** long-polls the store (`Store::wait_for_data`, the
//!   fetch's long-poll) and reads what arrived, stamping each record with the moment its read
//!   returned, and takes its parent partition and offset from its provenance.
//!
//! Records are keyless (100-byte values by default): produce places them round-robin and the
//! default chain's `keyless-index` keeps their partition index in the child. After the
//! produce, the bench waits until the child holds every record, then checks that each
//! produced record arrived exactly once (the bench fails otherwise) and reports the
//! percentiles of fetch time minus ack time. A record can be fetchable before its produce
//! call returns (the cursor sees it once it is durable, the producer only after every
//! partition of its request is): such a record counts as 0 ms and is counted apart.
//!
//! Goal (issue 11): p99 at most 50 ms. It is compared in the report, never asserted.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_storage::{NewRecord, PartitionId, ReadOptions, Store};
use serde::Serialize;

use super::disk::{self, SyncCosts};
use super::progress::Progress;
use super::rig::{Rig, RunningCursor, stop_all};
use super::sys::{self, FileSystemInfo};
use super::timed_router::RouteTiming;
use super::workdir::WorkDir;
use super::{BenchError, blocking, per_second};
use narad_host::fanout::status::CursorState;
use narad_host::produce::{ProduceRecord, Producer};
use narad_host::shutdown::{self, ShutdownSignal};

/// Default produce rates, records per second (issue 11).
pub const DEFAULT_RATES: [u64; 2] = [10_000, 100_000];
/// Default seconds of produce per rate.
pub const DEFAULT_SECONDS: u64 = 10;
/// Default partitions of the parent and of the child.
pub const DEFAULT_PARTITIONS: u32 = 4;
/// Default value bytes per record.
pub const DEFAULT_VALUE_BYTES: usize = 100;
/// Goal: p99 of produce-acknowledged to copy-fetchable, milliseconds (issue 11).
pub const GOAL_P99_MS: f64 = 50.0;

/// How often the producer wakes to produce what is due.
const PRODUCE_TICK: Duration = Duration::from_millis(1);
/// Longest long-poll of a reader: how soon it sees that the bench is over.
const READ_WAIT: Duration = Duration::from_millis(100);
/// Records per read of a reader.
const READ_MAX_RECORDS: usize = 65_536;
/// After the produce, the copy must make progress at least this often, or the bench fails.
const NO_PROGRESS_LIMIT: Duration = Duration::from_secs(60);
/// Longest wait for the cursors to start before anything is produced.
const START_LIMIT: Duration = Duration::from_secs(60);
/// How often the bench looks at the cursors and the readers.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Ack time of an offset the producer never acknowledged.
const NOT_ACKED: u64 = u64::MAX;

/// What to run.
#[derive(Clone, Debug)]
pub struct LatencyOptions {
    /// Produce rates to measure, records per second, one after the other.
    pub rates: Vec<u64>,
    /// Seconds of produce per rate.
    pub seconds: u64,
    /// Partitions of the parent and of the child.
    pub partitions: u32,
    /// Value bytes per record (keyless records).
    pub value_bytes: usize,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
}

impl Default for LatencyOptions {
    fn default() -> LatencyOptions {
        LatencyOptions {
            rates: DEFAULT_RATES.to_vec(),
            seconds: DEFAULT_SECONDS,
            partitions: DEFAULT_PARTITIONS,
            value_bytes: DEFAULT_VALUE_BYTES,
            dir: None,
            progress: false,
        }
    }
}

/// What one rate measured.
#[derive(Clone, Debug, Serialize)]
pub struct RateFigures {
    /// The rate asked for, records per second.
    pub target_records_per_s: u64,
    /// Records produced (and found in the child, each exactly once).
    pub records: u64,
    /// Records over the time from the start of the produce to its last acknowledgement.
    pub achieved_records_per_s: f64,
    /// Seconds from the start of the produce to its last acknowledgement.
    pub produce_seconds: f64,
    /// Produce requests made.
    pub produce_requests: u64,
    /// Produce request time (call to acknowledgement), median, milliseconds.
    pub produce_p50_ms: f64,
    /// Produce request time, 99th percentile, milliseconds.
    pub produce_p99_ms: f64,
    /// Acknowledged to fetchable in the child, median, milliseconds (nearest rank).
    pub p50_ms: f64,
    /// Acknowledged to fetchable, 99th percentile, milliseconds (nearest rank).
    pub p99_ms: f64,
    /// Acknowledged to fetchable, the longest, milliseconds.
    pub max_ms: f64,
    /// Acknowledged to fetchable, mean, milliseconds.
    pub mean_ms: f64,
    /// Records the reader fetched before their produce request returned (counted as 0 ms).
    pub fetched_before_ack: u64,
    /// Whether `p99_ms` is at most the goal.
    pub p99_goal_met: bool,
    /// Process CPU seconds per wall second while this rate ran (cores busy).
    pub cpu_cores_used: f64,
    /// Load average (1, 5, 15 min) when this rate started.
    pub load_before: Option<[f64; 3]>,
    /// Load average when it ended.
    pub load_after: Option<[f64; 3]>,
}

/// What `narad bench latency` measured.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyReport {
    /// Always `"latency"`.
    pub bench: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it was on.
    pub file_system: Option<FileSystemInfo>,
    /// Partitions of the parent and of the child.
    pub partitions: u32,
    /// Value bytes per record (keyless records).
    pub value_bytes: usize,
    /// Seconds of produce per rate.
    pub seconds: u64,
    /// This disk's own sync costs, measured first.
    pub disk: SyncCosts,
    /// One entry per rate, in the order run.
    pub rates: Vec<RateFigures>,
    /// The p99 goal, milliseconds.
    pub goal_p99_ms: f64,
    /// Load average before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after the run.
    pub load_after: Option<[f64; 3]>,
}

/// The value at quantile `q` (0 < q <= 1) of `sorted` (ascending) by nearest rank: the
/// smallest value with at least `q` of all values at or below it. `None` when empty.
pub fn nearest_rank(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

/// One record as a reader found it.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    parent_partition: u32,
    parent_offset: u64,
    /// When its read returned, nanoseconds since the rate's clock started.
    at: u64,
}

/// Nanoseconds from `epoch` to now.
fn since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Runs the latency bench.
pub async fn run_latency(options: LatencyOptions) -> Result<LatencyReport, BenchError> {
    if options.rates.is_empty() || options.rates.contains(&0) {
        return Err(BenchError::Options(
            "give at least one rate, each above 0 records/s".into(),
        ));
    }
    if options.partitions == 0 || options.seconds == 0 {
        return Err(BenchError::Options(
            "the parent needs a partition, and the produce at least a second".into(),
        ));
    }
    let load_before = sys::load_average();
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench latency in {} on {}",
        work.path().display(),
        work.describe_file_system()
    ));
    let disk = disk::measure_and_report(&work, &mut progress).await?;
    let rig = Arc::new(
        Rig::open(
            &work.path().join("data"),
            narad_host::fanout::FanoutTiming::default(),
        )
        .await?,
    );
    let mut rates = Vec::new();
    for (i, &rate) in options.rates.iter().enumerate() {
        let figures = run_rate(&rig, i, rate, &options, &mut progress).await?;
        progress.step(&format!(
            "{rate} records/s: {} records, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            figures.records, figures.p50_ms, figures.p99_ms, figures.max_ms
        ));
        rates.push(figures);
    }
    blocking({
        let store = Arc::clone(&rig.store);
        move || store.close()
    })
    .await?
    .map_err(BenchError::storage("closing the store"))?;
    Ok(LatencyReport {
        bench: "latency",
        dir: work.path_buf(),
        file_system: work.file_system.clone(),
        partitions: options.partitions,
        value_bytes: options.value_bytes,
        seconds: options.seconds,
        disk,
        rates,
        goal_p99_ms: GOAL_P99_MS,
        load_before,
        load_after: sys::load_average(),
    })
}

/// One rate: its own parent and child (`parent-{index}`, `child-{index}`) in `rig`.
async fn run_rate(
    rig: &Arc<Rig>,
    index: usize,
    rate: u64,
    options: &LatencyOptions,
    progress: &mut Progress,
) -> Result<RateFigures, BenchError> {
    let load_before = sys::load_average();
    let (parent, child) = (format!("parent-{index}"), format!("child-{index}"));
    let partitions = options.partitions;
    rig.create_topic(&parent, partitions).await?;
    rig.create_topic(&child, partitions).await?;
    let link = rig
        .attach_default(&parent, &child, 0, vec![0; partitions as usize])
        .await?;
    let link = rig
        .link_runtime(link, Arc::new(RouteTiming::default()))
        .await?;
    let (cursor_trigger, cursor_signal) = shutdown::channel();
    let cursors: Vec<RunningCursor> = (0..partitions)
        .map(|p| rig.spawn_cursor(&link, p, cursor_signal.clone()))
        .collect();
    let (reader_trigger, reader_signal) = shutdown::channel();
    let found = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let readers: Vec<_> = (0..partitions)
        .map(|p| {
            let (store, id) = (Arc::clone(&rig.store), PartitionId::new(child.clone(), p));
            let (stop, found) = (reader_signal.clone(), Arc::clone(&found));
            tokio::spawn(read_child(store, id, epoch, stop, found))
        })
        .collect();
    let cpu_before = sys::cpu_time();
    let started = Instant::now();
    let measured = async {
        wait_until_started(&cursors).await?;
        let produced = produce(rig, &parent, rate, epoch, options, progress).await?;
        wait_for_arrivals(&cursors, &found, produced.records, progress).await?;
        Ok::<_, BenchError>(produced)
    }
    .await;
    let wall = started.elapsed();
    let cpu_used = match (cpu_before, sys::cpu_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    reader_trigger.trigger();
    let mut arrivals = Vec::new();
    let mut reader_error = None;
    for (p, reader) in readers.into_iter().enumerate() {
        match reader.await {
            Ok(Ok(found)) => arrivals.extend(found),
            Ok(Err(error)) => {
                reader_error.get_or_insert(error);
            }
            Err(source) => {
                reader_error.get_or_insert(BenchError::CursorTask {
                    cursor: format!("the reader of {child}/p{p:05}"),
                    source,
                });
            }
        }
    }
    let stopped = stop_all(&cursor_trigger, cursors).await;
    // The measurement's own failure is the one that matters, then a reader's, then a cursor's.
    let produced = measured?;
    if let Some(error) = reader_error {
        return Err(error);
    }
    stopped?;

    let mut latencies = check_arrivals(&child, &produced.acks, &arrivals)?;
    let fetched_before_ack = latencies.iter().filter(|l| l.is_none()).count() as u64;
    let mut sorted: Vec<u64> = latencies.drain(..).map(Option::unwrap_or_default).collect();
    sorted.sort_unstable();
    let mut requests = produced.request_nanos.clone();
    requests.sort_unstable();
    let mean = per_second(
        sorted.iter().map(|&n| n as f64).sum::<f64>(),
        sorted.len() as f64,
    );
    let p99_ms = ms(nearest_rank(&sorted, 0.99).unwrap_or_default());
    Ok(RateFigures {
        target_records_per_s: rate,
        records: produced.records,
        achieved_records_per_s: per_second(produced.records as f64, produced.seconds),
        produce_seconds: produced.seconds,
        produce_requests: requests.len() as u64,
        produce_p50_ms: ms(nearest_rank(&requests, 0.5).unwrap_or_default()),
        produce_p99_ms: ms(nearest_rank(&requests, 0.99).unwrap_or_default()),
        p50_ms: ms(nearest_rank(&sorted, 0.5).unwrap_or_default()),
        p99_ms,
        max_ms: ms(sorted.last().copied().unwrap_or_default()),
        mean_ms: mean / 1e6,
        fetched_before_ack,
        p99_goal_met: p99_ms <= GOAL_P99_MS,
        cpu_cores_used: per_second(cpu_used.as_secs_f64(), wall.as_secs_f64()),
        load_before,
        load_after: sys::load_average(),
    })
}

/// What the producer did.
struct Produced {
    /// Records produced.
    records: u64,
    /// From the first request to the last acknowledgement.
    seconds: f64,
    /// Per parent partition, per offset: the ack time, nanoseconds since the rate's clock
    /// started ([`NOT_ACKED`] for an offset no request returned).
    acks: Vec<Vec<u64>>,
    /// Each request's time from call to acknowledgement, nanoseconds.
    request_nanos: Vec<u64>,
}

/// Produces `rate` records per second for `options.seconds` into `parent`, paced by the wall
/// clock, one request in flight.
async fn produce(
    rig: &Rig,
    parent: &str,
    rate: u64,
    epoch: Instant,
    options: &LatencyOptions,
    progress: &mut Progress,
) -> Result<Produced, BenchError> {
    let producer = Producer::new(Arc::clone(&rig.store));
    let value = Bytes::from(
        (0..options.value_bytes)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let total = rate.saturating_mul(options.seconds);
    let mut acks: Vec<Vec<u64>> = vec![Vec::new(); options.partitions as usize];
    let mut request_nanos = Vec::new();
    let mut ticker = tokio::time::interval(PRODUCE_TICK);
    // A late tick is not made up with a burst of ticks: the next one takes what is due.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    let mut produced = 0u64;
    while produced < total {
        ticker.tick().await;
        let due = ((rate as f64 * start.elapsed().as_secs_f64()) as u64).min(total);
        if due <= produced {
            continue;
        }
        let records: Vec<ProduceRecord> = (produced..due)
            .map(|_| ProduceRecord {
                partition: None,
                record: NewRecord {
                    key: None,
                    headers: Vec::new(),
                    value: Some(value.clone()),
                },
            })
            .collect();
        let called = Instant::now();
        let placed = producer
            .produce(parent, options.partitions, records)
            .await
            .map_err(|source| BenchError::Produce {
                context: format!("producing to {parent}"),
                source: Box::new(source),
            })?;
        let ack = since(epoch);
        request_nanos.push(u64::try_from(called.elapsed().as_nanos()).unwrap_or(u64::MAX));
        for place in placed {
            let Some(slots) = acks.get_mut(place.partition as usize) else {
                continue;
            };
            let offset = usize::try_from(place.offset).unwrap_or(usize::MAX);
            if slots.len() <= offset {
                slots.resize(offset.saturating_add(1), NOT_ACKED);
            }
            if let Some(slot) = slots.get_mut(offset) {
                *slot = ack;
            }
        }
        produced = due;
        progress.update(|| format!("{rate} records/s: produced {produced}/{total}"));
    }
    Ok(Produced {
        records: produced,
        seconds: start.elapsed().as_secs_f64(),
        acks,
        request_nanos,
    })
}

/// Waits until every cursor has started (reports a position) and none is stalled.
async fn wait_until_started(cursors: &[RunningCursor]) -> Result<(), BenchError> {
    let start = Instant::now();
    loop {
        let mut ready = true;
        for cursor in cursors {
            let report = cursor.status.report();
            if cursor.task.is_finished() {
                return Err(BenchError::Cursor {
                    cursor: cursor.name(),
                    reason: format!("it ended before the produce ({:?})", report.last_error),
                });
            }
            ready &= report.next_offset.is_some() && report.state == CursorState::Running;
        }
        if ready {
            return Ok(());
        }
        if start.elapsed() > START_LIMIT {
            return Err(BenchError::Cursor {
                cursor: cursors.first().map(RunningCursor::name).unwrap_or_default(),
                reason: format!("not started after {} s", START_LIMIT.as_secs()),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until the readers found `total` records; fails when nothing arrives for
/// [`NO_PROGRESS_LIMIT`] or a cursor ends.
async fn wait_for_arrivals(
    cursors: &[RunningCursor],
    found: &AtomicU64,
    total: u64,
    progress: &mut Progress,
) -> Result<(), BenchError> {
    let (mut last, mut last_progress) = (0u64, Instant::now());
    loop {
        let now = found.load(Ordering::Relaxed);
        if now >= total {
            progress.finish();
            return Ok(());
        }
        if let Some(ended) = cursors.iter().find(|c| c.task.is_finished()) {
            return Err(BenchError::Cursor {
                cursor: ended.name(),
                reason: format!(
                    "it ended with {now} of {total} records in the child ({:?})",
                    ended.status.report().last_error
                ),
            });
        }
        if now > last {
            (last, last_progress) = (now, Instant::now());
        } else if last_progress.elapsed() > NO_PROGRESS_LIMIT {
            return Err(BenchError::Cursor {
                cursor: cursors.first().map(RunningCursor::name).unwrap_or_default(),
                reason: format!(
                    "the child holds {now} of {total} records and got nothing for {} s",
                    NO_PROGRESS_LIMIT.as_secs()
                ),
            });
        }
        progress.update(|| format!("waiting for the copy: {now}/{total} records in the child"));
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Reads child partition `id` from offset 0 as records arrive, until `stop`; returns every
/// record found with the moment its read returned, and adds to `found` as it goes.
async fn read_child(
    store: Arc<Store>,
    id: PartitionId,
    epoch: Instant,
    stop: ShutdownSignal,
    found: Arc<AtomicU64>,
) -> Result<Vec<Arrival>, BenchError> {
    let mut arrivals = Vec::new();
    let mut next = 0u64;
    while !stop.is_triggered() {
        let woke = tokio::select! {
            woke = store.wait_for_data(&id, next, READ_WAIT) => {
                woke.map_err(BenchError::storage(format!("waiting on {id}")))?
            }
            () = stop.wait() => false,
        };
        if !woke {
            continue;
        }
        let read = {
            let (store, read_id) = (Arc::clone(&store), id.clone());
            blocking(move || {
                store.read(
                    &read_id,
                    &ReadOptions {
                        offset: next,
                        max_records: READ_MAX_RECORDS,
                        max_bytes: usize::MAX,
                        max_committed_at_ms: None,
                    },
                )
            })
            .await?
            .map_err(BenchError::storage(format!("reading {id}")))?
        };
        let at = since(epoch);
        for record in &read.records {
            let Some(origin) = &record.origin else {
                return Err(BenchError::Incomplete {
                    child: id.topic.clone(),
                    reason: format!("{id} offset {} has no provenance", record.offset),
                });
            };
            arrivals.push(Arrival {
                parent_partition: origin.parent_partition,
                parent_offset: origin.parent_offset,
                at,
            });
        }
        found.fetch_add(read.records.len() as u64, Ordering::Relaxed);
        next = read.next_offset;
    }
    Ok(arrivals)
}

/// Checks that `arrivals` hold every acknowledged record of `acks` exactly once and nothing
/// else; returns each one's latency in nanoseconds, `None` for one fetched before its ack.
fn check_arrivals(
    child: &str,
    acks: &[Vec<u64>],
    arrivals: &[Arrival],
) -> Result<Vec<Option<u64>>, BenchError> {
    let incomplete = |reason: String| BenchError::Incomplete {
        child: child.to_owned(),
        reason,
    };
    let mut seen: Vec<Vec<bool>> = acks.iter().map(|a| vec![false; a.len()]).collect();
    let mut latencies = Vec::with_capacity(arrivals.len());
    for a in arrivals {
        let (p, o) = (a.parent_partition as usize, a.parent_offset);
        let ack = acks
            .get(p)
            .and_then(|slots| slots.get(usize::try_from(o).ok()?))
            .copied()
            .filter(|&ack| ack != NOT_ACKED)
            .ok_or_else(|| {
                incomplete(format!(
                    "it holds parent p{p} offset {o}, which no produce acknowledged"
                ))
            })?;
        let slot = seen
            .get_mut(p)
            .and_then(|s| s.get_mut(usize::try_from(o).ok()?))
            .ok_or_else(|| incomplete(format!("parent p{p} offset {o} is out of range")))?;
        if *slot {
            return Err(incomplete(format!(
                "parent p{p} offset {o} arrived more than once"
            )));
        }
        *slot = true;
        latencies.push(a.at.checked_sub(ack));
    }
    for (p, (seen, acks)) in seen.iter().zip(acks).enumerate() {
        if let Some(missing) = seen
            .iter()
            .zip(acks)
            .position(|(&seen, &ack)| !seen && ack != NOT_ACKED)
        {
            return Err(incomplete(format!(
                "parent p{p} offset {missing} was acknowledged but never arrived"
            )));
        }
    }
    Ok(latencies)
}

impl LatencyReport {
    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        let fs = self
            .file_system
            .as_ref()
            .map_or("unknown file system".to_owned(), |f| {
                format!("{} ({})", f.fs_type, f.source)
            });
        let mut out = format!(
            "latency: produce acknowledged -> copy fetchable in the child, {} partitions -> {}, keyless {}-byte values, default chain, {} s per rate, on {fs}\n\
             disk       256-byte in-place fdatasync {:.2} ms, 512 KiB append + fdatasync {:.2} ms\n",
            self.partitions,
            self.partitions,
            self.value_bytes,
            self.seconds,
            self.disk.in_place_256b_ms,
            self.disk.append_512kib_ms,
        );
        for r in &self.rates {
            out.push_str(&format!(
                "{:>9} records/s: achieved {:.0}/s, {} records in {} requests (request p50 {:.1} ms, p99 {:.1} ms)\n\
                 {:>9}            latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, mean {:.1} ms; {} fetched before their ack; p99 goal <= {:.0} ms: {}\n\
                 {:>9}            CPU {:.2} cores, load {} -> {}\n",
                r.target_records_per_s,
                r.achieved_records_per_s,
                r.records,
                r.produce_requests,
                r.produce_p50_ms,
                r.produce_p99_ms,
                "",
                r.p50_ms,
                r.p99_ms,
                r.max_ms,
                r.mean_ms,
                r.fetched_before_ack,
                self.goal_p99_ms,
                if r.p99_goal_met { "met" } else { "NOT met" },
                "",
                r.cpu_cores_used,
                sys::load_text(r.load_before),
                sys::load_text(r.load_after),
            ));
        }
        out.push_str(&format!(
            "checked: every produced record arrived in the child exactly once\n\
             load average before {} / after {}",
            sys::load_text(self.load_before),
            sys::load_text(self.load_after)
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_rank_percentile_is_a_value_of_the_sample_at_or_above_the_share() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&sorted, 0.5), Some(50));
        assert_eq!(nearest_rank(&sorted, 0.99), Some(99));
        assert_eq!(nearest_rank(&sorted, 1.0), Some(100));
        assert_eq!(nearest_rank(&[7], 0.99), Some(7));
        // Of 10 values, p99 is the largest: 9 values are only 90%.
        let ten: Vec<u64> = (1..=10).collect();
        assert_eq!(nearest_rank(&ten, 0.99), Some(10));
        assert_eq!(nearest_rank(&ten, 0.5), Some(5));
        assert_eq!(nearest_rank(&[], 0.5), None);
    }

    fn arrival(parent_partition: u32, parent_offset: u64, at: u64) -> Arrival {
        Arrival {
            parent_partition,
            parent_offset,
            at,
        }
    }

    #[test]
    fn arrivals_give_fetch_time_minus_ack_time_and_none_when_fetched_before_the_ack() {
        let acks = vec![vec![100, 100], vec![250]];
        let got = check_arrivals(
            "c",
            &acks,
            &[arrival(0, 1, 130), arrival(1, 0, 200), arrival(0, 0, 400)],
        )
        .unwrap();
        assert_eq!(got, [Some(30), None, Some(300)]);
    }

    #[test]
    fn a_record_arriving_twice_fails_the_check() {
        let acks = vec![vec![100, 100]];
        let err = check_arrivals(
            "c",
            &acks,
            &[arrival(0, 0, 130), arrival(0, 1, 130), arrival(0, 0, 140)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("more than once"), "{err}");
    }

    #[test]
    fn a_record_that_never_arrived_fails_the_check() {
        let acks = vec![vec![100, 100]];
        let err = check_arrivals("c", &acks, &[arrival(0, 0, 130)]).unwrap_err();
        assert!(
            err.to_string()
                .contains("offset 1 was acknowledged but never arrived"),
            "{err}"
        );
    }

    #[test]
    fn a_record_no_produce_acknowledged_fails_the_check() {
        let acks = vec![vec![100, NOT_ACKED]];
        let err =
            check_arrivals("c", &acks, &[arrival(0, 0, 130), arrival(0, 1, 130)]).unwrap_err();
        assert!(err.to_string().contains("no produce acknowledged"), "{err}");
    }
}

#[cfg(test)]
mod run_tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_latency_bench_finds_every_produced_record_once_and_reports_each_rate() {
        let dir = tempfile::tempdir().unwrap();
        let report = run_latency(LatencyOptions {
            rates: vec![2_000, 500],
            seconds: 1,
            partitions: 2,
            value_bytes: 20,
            dir: Some(dir.path().to_path_buf()),
            progress: false,
        })
        .await
        .unwrap();
        let records: Vec<u64> = report.rates.iter().map(|r| r.records).collect();
        assert_eq!(records, [2_000, 500]);
        for rate in &report.rates {
            assert!(
                rate.p50_ms <= rate.p99_ms && rate.p99_ms <= rate.max_ms,
                "{rate:?}"
            );
            assert!(rate.produce_requests > 0);
        }
        assert!(report.to_text().contains("p99 goal <= 50 ms"));
        // The bench directory is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
