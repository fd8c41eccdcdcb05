//! `narad bench metadata`: what the metadata costs as it grows, on one node.
//!
//! Two questions, each answered in the run that prints it:
//!
//! - **Does creating a topic cost more when there are many?** Topics are created one by one
//!   in the embedded file metastore (the default), or with `--etcd` in cluster mode's etcd
//!   metastore as a node uses it (with its watched copy), each change durable on return; the
//!   time of each is kept, and the first hundred (and the first thousand, by median) are
//!   compared with the last.
//! - **What does a reconciler tick cost with many topics and no links?** A reconciler over
//!   those topics (one node owns every partition; a directory per partition, as the daemon
//!   would have) runs three kinds of tick: one where no metadata version moved (skipped), a
//!   full pass after a version moved (it reads a snapshot and compares every link with the
//!   running cursors), and an orphan-sweep tick (a full pass that also lists every partition
//!   directory for offset files no link explains). Each is timed over several rounds; the
//!   median is reported.
//!
//! Nothing here is a timed test: the figures are printed, never asserted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::progress::Progress;
use super::sys::{self, FileSystemInfo};
use super::workdir::WorkDir;
use super::{BenchError, blocking};
use narad_host::fanout::CursorDeps;
use narad_host::fanout::metrics::FanoutMetrics;
use narad_host::fanout::route::{RouterBuildError, RouterFactory, SlabRouter};
use narad_host::fanout::status::FanoutView;
use narad_host::metastore::cache::CacheTiming;
use narad_host::metastore::etcd::connect_client;
use narad_host::metastore::{
    EtcdMetastore, FileMetastore, LinkMeta, Metastore, PartitionOwner, TopicMeta,
};
use narad_host::ownership::SingleNode;
use narad_host::reconciler::Reconciler;
use narad_host::reconciler::schedule::ORPHAN_SWEEP_EVERY_TICKS;

/// Topics created by default (the figure).
pub const DEFAULT_TOPICS: u32 = 5_000;

/// Partitions per topic by default (the figure).
pub const DEFAULT_PARTITIONS: u32 = 12;

/// Timed rounds of each kind of tick.
const TICK_ROUNDS: usize = 9;

/// Creations averaged at each end of the run.
const ENDS: usize = 100;

/// Creations whose median is compared at each end of the run (fewer in a short run: half).
const MEDIAN_ENDS: usize = 1_000;

/// What to run.
#[derive(Clone, Debug)]
pub struct MetadataOptions {
    /// Topics to create.
    pub topics: u32,
    /// Partitions per topic.
    pub partitions: u32,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// etcd endpoints: measure cluster mode's etcd metastore instead of the file one.
    pub etcd: Option<Vec<String>>,
    /// Show progress on a terminal.
    pub progress: bool,
}

/// What the metadata bench measured.
#[derive(Clone, Debug, Serialize)]
pub struct MetadataReport {
    /// Always `"metadata"`.
    pub bench: &'static str,
    /// `"file"` or `"etcd"`.
    pub metastore: &'static str,
    /// The etcd endpoints, with `--etcd`.
    pub etcd: Option<String>,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it was on.
    pub file_system: Option<FileSystemInfo>,
    /// Topics created.
    pub topics: u32,
    /// Partitions per topic.
    pub partitions: u32,
    /// Mean time of the first [`ENDS`] creations, microseconds.
    pub create_first_us: f64,
    /// Mean time of the last [`ENDS`] creations, microseconds.
    pub create_last_us: f64,
    /// `create_last_us / create_first_us`: 1.0 means no growth.
    pub create_growth: f64,
    /// Creations in each end's median (`create_first_median_us`, `create_last_median_us`).
    pub median_ends: usize,
    /// Median of the first `median_ends` creations, microseconds.
    pub create_first_median_us: f64,
    /// Median of the last `median_ends` creations, microseconds.
    pub create_last_median_us: f64,
    /// `create_last_median_us / create_first_median_us`.
    pub create_median_growth: f64,
    /// Median creation over the whole run, microseconds.
    pub create_p50_us: f64,
    /// 99th-percentile creation over the whole run, microseconds (the journal's compactions,
    /// which rewrite the snapshot, are among the slowest).
    pub create_p99_us: f64,
    /// Slowest creation, microseconds.
    pub create_max_us: f64,
    /// Every creation, seconds.
    pub create_total_seconds: f64,
    /// Size of the metastore at the end, bytes: its files (snapshot, backup, journals), or
    /// with `--etcd` the keys and values under the bench's prefix.
    pub metastore_bytes: u64,
    /// With `--etcd`: a new node's watched copy at this size (read and decode time, memory).
    pub restart: Option<RestartRead>,
    /// Median tick when no version moved, microseconds.
    pub tick_skipped_us: f64,
    /// Median full-pass tick after a version moved, microseconds.
    pub tick_full_pass_us: f64,
    /// Median orphan-sweep tick, microseconds.
    pub tick_sweep_us: f64,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after the run.
    pub load_after: Option<[f64; 3]>,
}

/// A factory for a bench with no links: asked for nothing, it builds nothing.
struct NoLinks;

impl RouterFactory for NoLinks {
    fn build(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
        let _ = link;
        Err(RouterBuildError::Chain(narad_runtime::ChainError::Length {
            len: 0,
            max: narad_runtime::MAX_CHAIN_LEN,
        }))
    }
}

fn topic(name: String, partitions: u32) -> TopicMeta {
    TopicMeta {
        writable_as_child: false,
        name,
        partitions,
        retention_ms: None,
        retention_bytes: None,
        created_at_ms: 0,
        owners: Vec::new(),
    }
}

fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples
        .get(samples.len() / 2)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

fn mean_us(samples: &[Duration]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e6 / samples.len() as f64
}

/// Runs the metadata bench.
pub async fn run_metadata(options: MetadataOptions) -> Result<MetadataReport, BenchError> {
    if options.topics == 0 || options.partitions == 0 {
        return Err(BenchError::Options(
            "topics and partitions must be at least 1".into(),
        ));
    }
    let load_before = sys::load_average();
    let work = WorkDir::create(options.dir.as_deref())?;
    let data = work.path().to_path_buf();
    let etcd = match &options.etcd {
        Some(endpoints) => Some(EtcdRun::start(endpoints).await?),
        None => None,
    };
    let metastore: Arc<dyn Metastore> = match &etcd {
        Some(run) => Arc::clone(&run.metastore) as Arc<dyn Metastore>,
        None => {
            let data = data.clone();
            Arc::new(
                blocking(move || FileMetastore::open(&data))
                    .await?
                    .map_err(BenchError::metastore("opening the metastore"))?,
            )
        }
    };
    let measured = measure(&options, &data, &metastore, etcd.as_ref()).await;
    if let Some(run) = etcd {
        run.finish().await?;
    }
    let mut report = measured?;
    report.dir = work.path_buf();
    report.file_system = work.file_system.clone();
    report.load_before = load_before;
    report.load_after = sys::load_average();
    Ok(report)
}

/// The etcd side of a run with `--etcd`: a metastore with its watched copy under a prefix of
/// the run's own, removed at the end.
struct EtcdRun {
    endpoints: Vec<String>,
    prefix: String,
    metastore: Arc<EtcdMetastore>,
    client: etcd_client::Client,
    stop: narad_host::shutdown::ShutdownTrigger,
}

impl EtcdRun {
    async fn start(endpoints: &[String]) -> Result<EtcdRun, BenchError> {
        let unavailable = |e: String| BenchError::EtcdUnavailable {
            endpoints: endpoints.join(","),
            reason: e,
        };
        let client = connect_client(endpoints)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let prefix = narad_host::cluster::prefix(&super::cluster::unique_cluster_name());
        let (stop, signal) = narad_host::shutdown::channel();
        let metastore = EtcdMetastore::with_cache(
            client.clone(),
            prefix.clone(),
            CacheTiming::default(),
            signal,
        )
        .await
        .map_err(|e| unavailable(e.to_string()))?;
        Ok(EtcdRun {
            endpoints: endpoints.to_vec(),
            prefix,
            metastore: Arc::new(metastore),
            client,
            stop,
        })
    }

    /// Bytes of the keys and values under the run's prefix.
    async fn bytes(&self) -> Result<u64, BenchError> {
        let response = narad_host::metastore::etcd_range::read_prefix(
            &self.client,
            &self.prefix,
            false,
            false,
        )
        .await
        .map_err(|e| BenchError::EtcdUnavailable {
            endpoints: self.endpoints.join(","),
            reason: e.to_string(),
        })?;
        Ok(response
            .kvs
            .iter()
            .map(|kv| (kv.key().len() + kv.value().len()) as u64)
            .sum())
    }

    /// What a node starting at this size does before it can serve: a new watched copy read
    /// from etcd and decoded. Its time, and the memory the copy holds (raw and decoded).
    async fn restart_read(&self) -> Result<RestartRead, BenchError> {
        let unavailable = |e: String| BenchError::EtcdUnavailable {
            endpoints: self.endpoints.join(","),
            reason: e,
        };
        let (stop, signal) = narad_host::shutdown::channel();
        let before = sys::allocated_bytes();
        let started = Instant::now();
        let copy = EtcdMetastore::with_cache(
            self.client.clone(),
            self.prefix.clone(),
            CacheTiming::default(),
            signal,
        )
        .await
        .map_err(|e| unavailable(e.to_string()))?;
        // The first read decodes the copy.
        copy.versions()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let took = started.elapsed();
        let held = sys::allocated_bytes().saturating_sub(before);
        stop.trigger();
        drop(copy);
        Ok(RestartRead {
            millis: took.as_secs_f64() * 1e3,
            copy_bytes: held,
        })
    }

    async fn finish(self) -> Result<(), BenchError> {
        self.stop.trigger();
        super::cluster::remove_keys(&self.endpoints, &self.prefix).await
    }
}

/// A node's start at the run's size, with `--etcd`.
#[derive(Clone, Debug, Serialize)]
pub struct RestartRead {
    /// Milliseconds from connecting a new watched copy to its first decoded read.
    pub millis: f64,
    /// Bytes the allocator holds for the copy (its etcd values and the decoded metadata).
    pub copy_bytes: u64,
}

/// Creates the topics and times the reconciler's ticks.
async fn measure(
    options: &MetadataOptions,
    data: &std::path::Path,
    metastore: &Arc<dyn Metastore>,
    etcd: Option<&EtcdRun>,
) -> Result<MetadataReport, BenchError> {
    // Creations, one durable change each.
    let mut progress = Progress::new(options.progress);
    let mut creations = Vec::with_capacity(options.topics as usize);
    let started = Instant::now();
    for i in 0..options.topics {
        let mut meta = topic(format!("t{i:05}"), options.partitions);
        if etcd.is_some() {
            // As cluster mode records a topic: each partition with its owner, spread over
            // three nodes.
            meta.owners = (0..options.partitions)
                .map(|p| PartitionOwner::first(format!("n{}", (i + p) % 3 + 1)))
                .collect();
        }
        let at = Instant::now();
        metastore
            .create_topic(meta)
            .await
            .map_err(BenchError::metastore(format!("creating topic {i}")))?;
        creations.push(at.elapsed());
        progress.update(|| format!("creating topics: {} of {}", i + 1, options.topics));
    }
    let create_total_seconds = started.elapsed().as_secs_f64();
    progress.finish();
    let ends = ENDS.min(creations.len());
    let create_first_us = mean_us(&creations[..ends]);
    let create_last_us = mean_us(&creations[creations.len() - ends..]);
    let median_ends = MEDIAN_ENDS.min(creations.len() / 2).max(1);
    let create_first_median_us = median_us(creations[..median_ends].to_vec());
    let create_last_median_us = median_us(creations[creations.len() - median_ends..].to_vec());
    let metastore_bytes = match etcd {
        Some(run) => run.bytes().await?,
        None => dir_bytes(data),
    };
    let restart = match etcd {
        Some(run) => Some(run.restart_read().await?),
        None => None,
    };
    let mut sorted = creations.clone();
    sorted.sort_unstable();
    let quantile_us = |q: f64| {
        sorted
            .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    let (create_p50_us, create_p99_us, create_max_us) =
        (quantile_us(0.5), quantile_us(0.99), quantile_us(1.0));

    // The partition directories a node owning every partition has (no files in them).
    let store = {
        let (data, topics, partitions) = (data.to_path_buf(), options.topics, options.partitions);
        blocking(move || -> Result<narad_storage::Store, BenchError> {
            let store = narad_storage::Store::open(&data, narad_storage::StoreOptions::default())
                .map_err(BenchError::storage("opening the store"))?;
            for t in 0..topics {
                for p in 0..partitions {
                    let dir = data
                        .join(narad_storage::store::TOPICS_DIR_NAME)
                        .join(format!("t{t:05}"))
                        .join(narad_storage::PartitionId::new(format!("t{t:05}"), p).dir_name());
                    std::fs::create_dir_all(&dir)
                        .map_err(BenchError::io(format!("creating {}", dir.display())))?;
                }
            }
            Ok(store)
        })
        .await??
    };
    let store = Arc::new(store);
    let deps = Arc::new(CursorDeps {
        store: Arc::clone(&store),
        fs: Arc::new(narad_storage::fs::RealFs),
        committer: Arc::new(narad_host::produce::Producer::new(Arc::clone(&store))),
        metastore: Arc::clone(metastore),
        clock: Arc::new(narad_storage::SystemClock),
        timing: narad_host::fanout::FanoutTiming::default(),
        remote_tails: None,
        node: None,
        leave_out_held: true,
    });
    let mut reconciler = Reconciler::new(
        deps,
        Arc::new(SingleNode::default()),
        Arc::new(NoLinks),
        Arc::new(FanoutMetrics::default()),
        Arc::new(FanoutView::default()),
    );

    // The first tick always runs a full pass (and warms the caches).
    reconciler.tick().await;
    let (mut skipped, mut full, mut sweep) = (Vec::new(), Vec::new(), Vec::new());
    let mut ticks: u64 = 1;
    let mut retention = 1u64;
    while sweep.len() < TICK_ROUNDS {
        let next = ticks + 1;
        let kind = if next.is_multiple_of(ORPHAN_SWEEP_EVERY_TICKS) {
            Tick::Sweep
        } else if next.is_multiple_of(2) && full.len() < TICK_ROUNDS {
            Tick::Full
        } else {
            Tick::Skipped
        };
        if kind == Tick::Full {
            // A version moves: a retention change of one topic.
            retention += 1;
            metastore
                .set_retention("t00000", Some(3_600_000 + retention), None)
                .await
                .map_err(BenchError::metastore("changing a retention"))?;
        }
        let at = Instant::now();
        reconciler.tick().await;
        let took = at.elapsed();
        ticks = next;
        match kind {
            Tick::Sweep => sweep.push(took),
            Tick::Full => full.push(took),
            Tick::Skipped => skipped.push(took),
        }
    }

    Ok(MetadataReport {
        bench: "metadata",
        metastore: if etcd.is_some() { "etcd" } else { "file" },
        etcd: etcd.map(|run| run.endpoints.join(",")),
        dir: PathBuf::new(),
        file_system: None,
        topics: options.topics,
        partitions: options.partitions,
        create_first_us,
        create_last_us,
        create_growth: if create_first_us > 0.0 {
            create_last_us / create_first_us
        } else {
            0.0
        },
        median_ends,
        create_first_median_us,
        create_last_median_us,
        create_median_growth: if create_first_median_us > 0.0 {
            create_last_median_us / create_first_median_us
        } else {
            0.0
        },
        create_total_seconds,
        metastore_bytes,
        create_p50_us,
        create_p99_us,
        create_max_us,
        restart,
        tick_skipped_us: median_us(skipped),
        tick_full_pass_us: median_us(full),
        tick_sweep_us: median_us(sweep),
        load_before: None,
        load_after: None,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tick {
    Skipped,
    Full,
    Sweep,
}

/// Bytes of the regular files directly in `dir` (the metastore's files).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

impl MetadataReport {
    /// The report as text.
    pub fn to_text(&self) -> String {
        let load = sys::load_text;
        let fs = sys::file_system_text(self.file_system.as_ref());
        let on = match &self.etcd {
            Some(endpoints) => format!("etcd metastore at {endpoints} (with a watched copy)"),
            None => format!("file metastore on {fs}"),
        };
        format!(
            "narad bench metadata: {} topics x {} partitions, {on}\n\
             topic creation (one durable change each): first {ENDS} {:.0} us each, last {ENDS} \
             {:.0} us each ({:.2}x); median of the first {} {:.0} us, of the last {:.0} us \
             ({:.2}x); over all: p50 {:.0} us, p99 {:.0} us, max {:.0} us; {:.1} s in all; \
             metastore {} bytes at the end\n\
             {}reconciler tick, median of {TICK_ROUNDS}: nothing moved {:.1} us; full pass after a \
             change {:.1} us; orphan sweep (every {ORPHAN_SWEEP_EVERY_TICKS}th tick) {:.1} us\n\
             load before {}, after {}\n",
            self.topics,
            self.partitions,
            self.create_first_us,
            self.create_last_us,
            self.create_growth,
            self.median_ends,
            self.create_first_median_us,
            self.create_last_median_us,
            self.create_median_growth,
            self.create_p50_us,
            self.create_p99_us,
            self.create_max_us,
            self.create_total_seconds,
            self.metastore_bytes,
            self.restart.as_ref().map_or_else(String::new, |r| format!(
                "a starting node's watched copy: read and decoded in {:.0} ms, holding {:.1} MiB\n",
                r.millis,
                r.copy_bytes as f64 / (1024.0 * 1024.0)
            )),
            self.tick_skipped_us,
            self.tick_full_pass_us,
            self.tick_sweep_us,
            load(self.load_before),
            load(self.load_after),
        )
    }
}
