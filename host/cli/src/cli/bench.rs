//! `narad bench produce|fanout|latency|cluster|metadata|once|requests`: the end-to-end
//! benchmarks (see [`crate::bench`]). `produce`, `fanout`, `latency`, `metadata` and `once` run
//! in this process, `cluster` and `requests` start `narad serve` processes; all
//! run on a fresh directory (removed afterwards) and print text, or one JSON object with
//! `--json`. Progress goes to stderr on a terminal only.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::bench::cluster::{self, ClusterOptions, run_cluster};
use crate::bench::fanout::{self, FanoutOptions, run_fanout};
use crate::bench::idle::{self, IdleOptions, run_idle};
use crate::bench::latency::{self, LatencyOptions, run_latency};
use crate::bench::metadata::{self, MetadataOptions, run_metadata};
use crate::bench::once::{self, OnceOptions, run_once};
use crate::bench::produce::{self, ProduceOptions, run_produce};
use crate::bench::requests::{self, RequestsOptions, run_requests};
use crate::bench::size::ByteSize;
use crate::bench::stalled::{StalledOptions, run_stalled};

/// `narad bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which bench.
    #[command(subcommand)]
    pub bench: BenchCommand,
}

/// The benches.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Append batches through the log (append + fdatasync + verify) and, interleaved, write +
    /// fdatasync the same bytes to a plain file; print both throughputs and their ratio.
    Produce(ProduceArgs),
    /// Fill a parent, copy it into K children with the real cursors and the default chain,
    /// and compare with a raw read + write + fdatasync loop; or, with --idle-delay-cursors,
    /// measure the CPU of delay cursors waiting in front of a backlog not yet due.
    Fanout(FanoutArgs),
    /// Produce at steady rates (paced by the wall clock) into a parent with one child attached
    /// and time each record from its produce's acknowledgement to its copy being fetchable in
    /// the child; print p50, p99 and max per rate against the goal (p99 <= 50 ms).
    Latency(LatencyArgs),
    /// Start one `narad serve`, then three on an etcd you run (`--etcd`); in each, attach two
    /// children, produce over HTTP and time one child's copy beside the produce and the
    /// other's copy of the whole backlog afterwards; print the 3-node figures against the
    /// single node's and the cost of a linearizable metadata read (`confirm()`, one per
    /// cursor anchor).
    Cluster(ClusterArgs),
    /// Create thousands of topics one by one in the file metastore, timing each, then time
    /// the reconciler's tick over them (skipped, full pass, orphan sweep).
    Metadata(MetadataArgs),
    /// Copy a parent into fresh children with and without the check that leaves out records
    /// a child already holds, and produce a remote child's copies with and without the
    /// target's window of copies, in alternating rounds; print both ratios (goal >= 0.95).
    Once(OnceArgs),
    /// Start one `narad serve` with a Kafka listener and produce the same records in Produce
    /// requests of one record and of many, in alternating rounds; print the daemon's CPU per
    /// request and per record, user space and kernel apart (goal: < 0.05 ms of user CPU per
    /// small request).
    Requests(RequestsArgs),
}

/// `narad bench requests`.
#[derive(Debug, Args)]
pub struct RequestsArgs {
    /// Records per variant and round.
    #[arg(long, default_value_t = requests::DEFAULT_RECORDS)]
    pub records: u64,
    /// Records per large request.
    #[arg(long, default_value_t = requests::DEFAULT_LARGE_RECORDS)]
    pub large_records: u32,
    /// Value bytes per record.
    #[arg(long, default_value_t = requests::DEFAULT_VALUE_BYTES)]
    pub value_bytes: usize,
    /// Connections, each with one request in flight and a partition of its own.
    #[arg(long, default_value_t = requests::DEFAULT_CONNECTIONS)]
    pub connections: u32,
    /// Rounds, each running both variants (their order swapped every round).
    #[arg(long, default_value_t = requests::DEFAULT_ROUNDS)]
    pub rounds: u32,
    /// The `narad` executable whose `serve` is measured (default: this one), to compare two
    /// builds with the same client.
    #[arg(long)]
    pub serve_binary: Option<PathBuf>,
    /// Directory to run in (a fresh subdirectory is created and removed); default: the
    /// current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `narad bench once`.
#[derive(Debug, Args)]
pub struct OnceArgs {
    /// Parent records copied per variant and round.
    #[arg(long, default_value_t = once::DEFAULT_RECORDS)]
    pub records: u64,
    /// Partitions of the parent, the children and the target topics.
    #[arg(long, default_value_t = once::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// Rounds, each running both variants of both sides (their order swapped every round).
    #[arg(long, default_value_t = once::DEFAULT_ROUNDS)]
    pub rounds: u32,
    /// Records produced per variant and round on the target side.
    #[arg(long, default_value_t = once::DEFAULT_TARGET_RECORDS)]
    pub target_records: u64,
    /// Directory to run in (a fresh subdirectory is created and removed); default: the
    /// current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `narad bench metadata`.
#[derive(Debug, Args)]
pub struct MetadataArgs {
    /// Topics to create.
    #[arg(long, default_value_t = metadata::DEFAULT_TOPICS)]
    pub topics: u32,
    /// Partitions per topic.
    #[arg(long, default_value_t = metadata::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// Directory to run in (a fresh subdirectory is created and removed); default: the
    /// current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Use the etcd metastore of cluster mode at these endpoints (comma-separated), as a
    /// node does (with its watched copy), instead of the embedded file metastore. The bench
    /// uses keys of its own under `/narad/bench-<pid>-<ms>/` and removes them at the end.
    #[arg(long, value_name = "URLS")]
    pub etcd: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `narad bench produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// Record bytes per batch (e.g. 4MiB).
    #[arg(long, default_value_t = ByteSize(produce::DEFAULT_BATCH_BYTES))]
    pub batch_bytes: ByteSize,
    /// Record bytes each side writes in all (e.g. 512MiB, 2GiB).
    #[arg(long, default_value_t = ByteSize(produce::DEFAULT_TOTAL_BYTES))]
    pub total_bytes: ByteSize,
    /// Value bytes per record.
    #[arg(long, default_value_t = produce::DEFAULT_VALUE_BYTES)]
    pub value_bytes: usize,
    /// Directory to run in (a fresh subdirectory is created and removed); default: the
    /// current directory, which is more often on a real disk than /tmp.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `narad bench fanout`.
#[derive(Debug, Args)]
pub struct FanoutArgs {
    /// Records in the parent (with --idle-delay-cursors: the backlog in front of them).
    #[arg(long, default_value_t = fanout::DEFAULT_RECORDS)]
    pub records: u64,
    /// Children to copy into.
    #[arg(long, default_value_t = 1)]
    pub children: u32,
    /// Partitions of the parent (and of each child, unless --child-partitions).
    #[arg(long, default_value_t = fanout::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// Partitions of each child (default: as many as the parent). Another count splits every
    /// slab into several buckets, and the raw loop then writes the same buckets.
    #[arg(long)]
    pub child_partitions: Option<u32>,
    /// Key bytes per record (0: keyless records).
    #[arg(long, default_value_t = fanout::DEFAULT_KEY_BYTES)]
    pub key_bytes: usize,
    /// Value bytes per record.
    #[arg(long, default_value_t = fanout::DEFAULT_VALUE_BYTES)]
    pub value_bytes: usize,
    /// Longest a cursor copying at full speed leaves its offset file unsynced, in
    /// milliseconds (default: the daemon's); 0 syncs it past every slab, as the reference
    /// engine does, to compare the two in one session.
    #[arg(long, default_value_t = OFFSET_SYNC_EVERY_MS)]
    pub offset_sync_every_ms: u64,
    /// Most consecutive slabs a cursor with a backlog commits together (default: the
    /// daemon's); 1 commits each slab on its own, as the reference engine does, to compare
    /// the two in one session.
    #[arg(long, default_value_t = narad_host::fanout::SLABS_PER_COMMIT)]
    pub slabs_per_commit: usize,
    /// Instead of copying: start this many delay cursors (one-hour delay) in front of the
    /// backlog and measure their CPU once they all wait.
    #[arg(long)]
    pub idle_delay_cursors: Option<u32>,
    /// Instead of copying: start this many cursors whose child partitions' owner is dead
    /// and measure the memory they hold once they all stall.
    #[arg(long, conflicts_with = "idle_delay_cursors")]
    pub stalled_cursors: Option<u32>,
    /// With --idle-delay-cursors: seconds to measure.
    #[arg(long, default_value_t = idle::DEFAULT_WINDOW.as_secs())]
    pub window_secs: u64,
    /// Directory to run in (a fresh subdirectory is created and removed); default: the
    /// current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `narad bench latency`.
#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// Produce rates, records per second, comma-separated; each runs on its own.
    #[arg(long, value_delimiter = ',', default_values_t = latency::DEFAULT_RATES)]
    pub rates: Vec<u64>,
    /// Seconds of produce per rate.
    #[arg(long, default_value_t = latency::DEFAULT_SECONDS)]
    pub seconds: u64,
    /// Partitions of the parent and of the child.
    #[arg(long, default_value_t = latency::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// Value bytes per record (keyless records).
    #[arg(long, default_value_t = latency::DEFAULT_VALUE_BYTES)]
    pub value_bytes: usize,
    /// Directory to run in (a fresh subdirectory is created and removed); default: the
    /// current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `narad bench cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// etcd endpoints, comma-separated (required: the bench does not start etcd; e.g. `etcd
    /// --data-dir /dev/shm/narad-bench-etcd --listen-client-urls http://127.0.0.1:2379
    /// --advertise-client-urls http://127.0.0.1:2379`). The bench uses keys of its own under
    /// `/narad/bench-<pid>-<ms>/` and removes them at the end.
    #[arg(long, value_name = "URLS")]
    pub etcd: String,
    /// Records produced in each phase (a debug build wants far fewer, e.g. 200000).
    #[arg(long, default_value_t = cluster::DEFAULT_RECORDS)]
    pub records: u64,
    /// Partitions of the parent and of the child.
    #[arg(long, default_value_t = cluster::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// Value bytes per record (keyless records).
    #[arg(long, default_value_t = cluster::DEFAULT_VALUE_BYTES)]
    pub value_bytes: usize,
    /// Records per produce request.
    #[arg(long, default_value_t = cluster::DEFAULT_BATCH_RECORDS)]
    pub batch_records: u32,
    /// Produce requests in flight at once.
    #[arg(long, default_value_t = cluster::DEFAULT_PRODUCERS)]
    pub producers: u32,
    /// confirm() calls timed (and as many serializable and cached reads beside them).
    #[arg(long, default_value_t = cluster::DEFAULT_CONFIRM_READS)]
    pub confirm_reads: u32,
    /// Directory to run in (a fresh subdirectory is created and removed); default: the
    /// current directory. Every daemon's data directory goes there.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn print<T: serde::Serialize>(
    json: bool,
    report: &T,
    text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if json {
        outln!(
            "{}",
            serde_json::to_string(report).context("encoding the report")?
        )?;
    } else {
        outln!("{}", text())?;
    }
    Ok(())
}

/// Exit status after an interrupt: 128 + SIGINT, as shells report it.
const INTERRUPTED_EXIT_CODE: i32 = 130;

/// The daemon's [`narad_host::fanout::OFFSET_SYNC_EVERY`] in milliseconds, the default of
/// `bench fanout --offset-sync-every-ms`.
const OFFSET_SYNC_EVERY_MS: u64 = narad_host::fanout::OFFSET_SYNC_EVERY.as_millis() as u64;

/// Runs `narad bench`. On SIGINT or SIGTERM the bench is dropped, which removes its directory
/// (a stopped fan-out bench can leave gigabytes behind otherwise), and the process exits.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let stopped_by = tokio::select! {
        result = run_bench(args) => return result,
        // A handler that cannot be installed disables this branch; the bench runs on.
        Ok(signal) = narad_host::shutdown::os_signal() => signal,
    };
    // The bench's future is gone, and with it its directory. Exit now rather than return: the
    // runtime would wait for blocking work still running (a fill or a raw copy), and the
    // handler just installed would swallow a second Ctrl-C.
    eprintln!("narad bench: stopped by {stopped_by}; its directory was removed");
    std::process::exit(INTERRUPTED_EXIT_CODE);
}

async fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    let progress = std::io::stderr().is_terminal();
    match args.bench {
        BenchCommand::Produce(a) => {
            let report = run_produce(ProduceOptions {
                batch_bytes: a.batch_bytes.0,
                total_bytes: a.total_bytes.0,
                value_bytes: a.value_bytes,
                dir: a.dir,
                progress,
            })
            .await
            .context("bench produce")?;
            print(a.json, &report, || report.to_text())
        }
        BenchCommand::Fanout(a) if a.stalled_cursors.is_some() => {
            let report = run_stalled(StalledOptions {
                cursors: a.stalled_cursors.unwrap_or(0),
                records: a.records,
                key_bytes: a.key_bytes,
                value_bytes: a.value_bytes,
                dir: a.dir,
                progress,
            })
            .await
            .context("bench fanout --stalled-cursors")?;
            print(a.json, &report, || report.to_text())
        }
        BenchCommand::Fanout(a) => match a.idle_delay_cursors {
            Some(cursors) => {
                let report = run_idle(IdleOptions {
                    cursors,
                    records: a.records,
                    key_bytes: a.key_bytes,
                    value_bytes: a.value_bytes,
                    window: Duration::from_secs(a.window_secs),
                    dir: a.dir,
                    progress,
                })
                .await
                .context("bench fanout --idle-delay-cursors")?;
                print(a.json, &report, || report.to_text())
            }
            None => {
                let report = run_fanout(FanoutOptions {
                    records: a.records,
                    children: a.children,
                    partitions: a.partitions,
                    child_partitions: a.child_partitions.unwrap_or(a.partitions),
                    key_bytes: a.key_bytes,
                    value_bytes: a.value_bytes,
                    dir: a.dir,
                    progress,
                    offset_sync_every: Duration::from_millis(a.offset_sync_every_ms),
                    slabs_per_commit: a.slabs_per_commit,
                })
                .await
                .context("bench fanout")?;
                print(a.json, &report, || report.to_text())
            }
        },
        BenchCommand::Latency(a) => {
            let report = run_latency(LatencyOptions {
                rates: a.rates,
                seconds: a.seconds,
                partitions: a.partitions,
                value_bytes: a.value_bytes,
                dir: a.dir,
                progress,
            })
            .await
            .context("bench latency")?;
            print(a.json, &report, || report.to_text())
        }
        BenchCommand::Cluster(a) => {
            let report = run_cluster(ClusterOptions {
                etcd: a.etcd,
                records: a.records,
                partitions: a.partitions,
                value_bytes: a.value_bytes,
                batch_records: a.batch_records,
                producers: a.producers,
                confirm_reads: a.confirm_reads,
                dir: a.dir,
                progress,
            })
            .await
            .context("bench cluster")?;
            print(a.json, &report, || report.to_text())
        }
        BenchCommand::Metadata(a) => {
            let report = run_metadata(MetadataOptions {
                topics: a.topics,
                partitions: a.partitions,
                dir: a.dir,
                etcd: a.etcd.map(|urls| {
                    urls.split(',')
                        .map(str::trim)
                        .filter(|u| !u.is_empty())
                        .map(str::to_owned)
                        .collect()
                }),
                progress,
            })
            .await
            .context("bench metadata")?;
            print(a.json, &report, || report.to_text())
        }
        BenchCommand::Once(a) => {
            let report = run_once(OnceOptions {
                records: a.records,
                partitions: a.partitions,
                rounds: a.rounds,
                target_records: a.target_records,
                dir: a.dir,
                progress,
            })
            .await
            .context("bench once")?;
            print(a.json, &report, || report.to_text())
        }
        BenchCommand::Requests(a) => {
            let report = run_requests(RequestsOptions {
                records: a.records,
                large_records: a.large_records,
                value_bytes: a.value_bytes,
                connections: a.connections,
                rounds: a.rounds,
                serve_binary: a.serve_binary,
                dir: a.dir,
                progress,
            })
            .await
            .context("bench requests")?;
            print(a.json, &report, || report.to_text())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        bench: BenchCommand,
    }

    #[test]
    fn bench_cluster_takes_its_flags_and_defaults_the_rest() {
        let cli = Cli::try_parse_from([
            "bench",
            "cluster",
            "--etcd",
            "http://127.0.0.1:2379",
            "--records",
            "5000",
            "--json",
        ])
        .unwrap();
        let BenchCommand::Cluster(a) = cli.bench else {
            panic!("not the cluster bench: {cli:?}");
        };
        assert_eq!(a.etcd, "http://127.0.0.1:2379");
        assert_eq!(a.records, 5000);
        assert_eq!(a.partitions, cluster::DEFAULT_PARTITIONS);
        assert_eq!(a.batch_records, cluster::DEFAULT_BATCH_RECORDS);
        assert!(a.json);
        assert_eq!(a.dir, None);
    }

    #[test]
    fn bench_latency_takes_a_comma_separated_list_of_rates_and_defaults_to_the_issues_two() {
        let cli =
            Cli::try_parse_from(["bench", "latency", "--rates", "500,2000", "--seconds", "3"])
                .unwrap();
        let BenchCommand::Latency(a) = cli.bench else {
            panic!("not the latency bench: {cli:?}");
        };
        assert_eq!(a.rates, [500, 2000]);
        assert_eq!(a.seconds, 3);
        assert_eq!(a.partitions, latency::DEFAULT_PARTITIONS);
        let cli = Cli::try_parse_from(["bench", "latency"]).unwrap();
        let BenchCommand::Latency(a) = cli.bench else {
            panic!("not the latency bench: {cli:?}");
        };
        assert_eq!(a.rates, latency::DEFAULT_RATES);
    }

    #[test]
    fn bench_fanout_child_partitions_default_to_none_meaning_the_parents_count() {
        let cli = Cli::try_parse_from(["bench", "fanout", "--child-partitions", "12"]).unwrap();
        let BenchCommand::Fanout(a) = cli.bench else {
            panic!("not the fanout bench: {cli:?}");
        };
        assert_eq!(a.child_partitions, Some(12));
        let cli = Cli::try_parse_from(["bench", "fanout"]).unwrap();
        let BenchCommand::Fanout(a) = cli.bench else {
            panic!("not the fanout bench: {cli:?}");
        };
        assert_eq!(a.child_partitions, None);
    }

    #[test]
    fn bench_cluster_without_an_etcd_is_refused_naming_the_flag() {
        let err = Cli::try_parse_from(["bench", "cluster"]).unwrap_err();
        assert!(err.to_string().contains("--etcd"), "{err}");
    }
}
