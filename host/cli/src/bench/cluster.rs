//! `narad bench cluster`: cross-node fan-out against the single-node figure measured in the
//! same run, and the cost of the linearizable metadata read (`confirm()`) each anchor needs.
//!
//! Unlike the other benches this one runs real daemons: `narad serve` child processes of this
//! executable, each on its own data directory under the bench directory, on free loopback
//! ports. Two phases with the same records and shapes, one after the other:
//!
//! 1. **single**: one `narad serve` with its embedded metastore;
//! 2. **cluster**: three nodes `n1`..`n3` on the etcd given with `--etcd` (the bench does not
//!    start one), under a cluster name of their own (`bench-<pid>-<ms>`). Parent partition `p`
//!    is placed on node `p mod 3` and child partition `p` on the next node, so every bucket
//!    crosses to another node (`POST /internal/v1/commit`).
//!
//! In each phase the parent and two children are created and attached (the attach point is
//! the parent's end, so the attaches come first), the bench waits for every cursor to have
//! started, and then produces the records over HTTP: keyless records with an explicit
//! partition, in large batches, by several concurrent producers, each batch sent to the node
//! that owns its partition (as a Kafka client would), so the produce is not forwarded. The
//! default chain routes a keyless record to the child partition of its parent partition's
//! index. Two copies are timed:
//!
//! - **beside the produce**: the first child has the default chain; the clock runs from the
//!   first produce until it holds every record. On one node this copy keeps pace with an
//!   HTTP produce, so its figure is the produce's, not what the copy could do.
//! - **a backlog**: the second child is attached with a chain that leaves every record
//!   undecided (`header-route` on a header no record has, no fallback), so its cursors stall
//!   on their first slab and retry each second, copying nothing and skipping nothing. Once
//!   the first child is done, its chain is swapped to the default one (`PATCH`); it then
//!   copies the whole parent from disk with nothing else running. Its rate is taken per
//!   partition while every cursor copies (they are released up to about a second apart).
//!
//! Both children are then read back and must hold each parent record exactly once (by
//! provenance).
//!
//! Afterwards, with the three nodes still up, the bench times `confirm()` on the cluster's
//! metadata with the daemon's own `EtcdMetastore`, interleaved with a serializable read and a
//! read of a watched copy, and removes the cluster's keys from etcd at the end. Daemons are
//! stopped (SIGTERM, then SIGKILL) when their phase ends and killed when the bench fails or is
//! dropped; their directories go with the bench directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;

use super::daemon::{Node, ProcessCpu, START_TIMEOUT, call, http_client, json_body, process_cpu};
use super::progress::Progress;
use super::sys::{self, FileSystemInfo};
use super::workdir::WorkDir;
use super::{BenchError, per_second};
use narad_host::api::children::{AttachRequest, ChildList, DEFAULT_ROUTER, LinkInfo, RouterChange};
use narad_host::api::types::{
    CreateTopicRequest, FetchResponse, ProduceRecordJson, ProduceRequest, TopicDescription,
    TopicInfo,
};
use narad_host::fanout::SLAB_MAX_RECORDS;
use narad_host::metastore::Metastore as _;
use narad_host::metastore::cache::CacheTiming;
use narad_host::metastore::etcd::{EtcdMetastore, connect_client};

/// Default records produced in each phase: enough, in a release build, for the backlog copy
/// across nodes to outlast the second or so between its cursors' releases.
pub const DEFAULT_RECORDS: u64 = 4_000_000;
/// Default partitions of the parent and of the child.
pub const DEFAULT_PARTITIONS: u32 = 4;
/// Default value bytes per record.
pub const DEFAULT_VALUE_BYTES: usize = 100;
/// Default records per produce request.
pub const DEFAULT_BATCH_RECORDS: u32 = 2_000;
/// Default produce requests in flight at once.
pub const DEFAULT_PRODUCERS: u32 = 8;
/// Default `confirm()` calls timed (and as many of each read it is compared with).
pub const DEFAULT_CONFIRM_READS: u32 = 200;
/// The nodes of the cluster phase.
pub const NODE_IDS: [&str; 3] = ["n1", "n2", "n3"];
/// Most records in one produce request: the daemon's default `--max-batch-records`.
pub const MAX_BATCH_RECORDS: u32 = 10_000;
/// Largest record: the daemon's default `--max-record-bytes`.
const MAX_RECORD_BYTES: usize = 1 << 20;
/// Most bytes of one produce request body: the daemon's default `--max-request-bytes`.
const MAX_REQUEST_BYTES: u64 = 64 << 20;
/// JSON bytes one record adds to a produce body beside its value (`{"value":"",
/// "partition":1023},`), rounded up.
const RECORD_JSON_OVERHEAD: u64 = 40;

/// Interval between two looks at the child's records (a phase's times are known to within
/// it, plus one describe call).
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Interval between two looks at the backlog copy: shorter, as that copy is the fastest
/// figure and is measured per partition.
const BACKLOG_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// A copy that makes no progress for this long has failed (a stalled cursor, a dead node).
const NO_PROGRESS_LIMIT: Duration = Duration::from_secs(120);
/// Longest wait for one etcd read.
const ETCD_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Reads of each kind made before timing (connections, the watched copy's first read).
const CONFIRM_WARM_UP: u32 = 10;
/// Records per fetch when reading the child back.
const FETCH_MAX: u32 = 10_000;
/// Share of the machine's cores above which the report calls them saturated.
const SATURATED_CORES_SHARE: f64 = 0.85;

/// What `narad bench cluster` runs.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// etcd endpoints, comma-separated, as `narad serve --etcd` takes them.
    pub etcd: String,
    /// Records produced in each phase.
    pub records: u64,
    /// Partitions of the parent and of each child.
    pub partitions: u32,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// Records per produce request.
    pub batch_records: u32,
    /// Produce requests in flight at once.
    pub producers: u32,
    /// `confirm()` calls timed.
    pub confirm_reads: u32,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
}

impl ClusterOptions {
    /// The options with every default and `etcd` as the endpoint.
    pub fn new(etcd: impl Into<String>) -> ClusterOptions {
        ClusterOptions {
            etcd: etcd.into(),
            records: DEFAULT_RECORDS,
            partitions: DEFAULT_PARTITIONS,
            value_bytes: DEFAULT_VALUE_BYTES,
            batch_records: DEFAULT_BATCH_RECORDS,
            producers: DEFAULT_PRODUCERS,
            confirm_reads: DEFAULT_CONFIRM_READS,
            dir: None,
            progress: false,
        }
    }

    /// The etcd endpoints, one per comma-separated entry.
    pub fn endpoints(&self) -> Vec<String> {
        self.etcd
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Checks that the options can run: what is wrong, else `Ok`.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |why: String| Err(BenchError::Options(why));
        if self.endpoints().is_empty() {
            return bad("--etcd names no endpoint".into());
        }
        if self.records == 0 {
            return bad("--records must be at least 1".into());
        }
        if !(1..=1024).contains(&self.partitions) {
            return bad(format!(
                "--partitions must be 1 to 1024, not {}",
                self.partitions
            ));
        }
        if !(1..=MAX_BATCH_RECORDS).contains(&self.batch_records) {
            return bad(format!(
                "--batch-records must be 1 to {MAX_BATCH_RECORDS} (the daemon's limit), not {}",
                self.batch_records
            ));
        }
        let body = u64::from(self.batch_records) * (self.value_bytes as u64 + RECORD_JSON_OVERHEAD);
        if body > MAX_REQUEST_BYTES {
            return bad(format!(
                "a batch of {} records of {} bytes is about {body} bytes of JSON, over the \
                 daemon's {MAX_REQUEST_BYTES}-byte request limit: lower --batch-records",
                self.batch_records, self.value_bytes
            ));
        }
        if self.value_bytes > MAX_RECORD_BYTES {
            return bad(format!(
                "--value-bytes {} is over the daemon's {MAX_RECORD_BYTES}-byte record limit",
                self.value_bytes
            ));
        }
        if self.producers == 0 {
            return bad("--producers must be at least 1".into());
        }
        if self.confirm_reads == 0 {
            return bad("--confirm-reads must be at least 1".into());
        }
        Ok(())
    }
}

/// Where the parent's and the child's partitions go: parent partition `p` on `nodes[p mod n]`,
/// child partition `p` on the next node, so no child partition shares a node with the parent
/// partition of its index (the one the default chain sends it from). Fails with fewer than
/// two nodes.
pub fn placements(
    partitions: u32,
    nodes: &[&str],
) -> Result<(Vec<String>, Vec<String>), BenchError> {
    if nodes.len() < 2 {
        return Err(BenchError::Options(format!(
            "a cross-node placement needs at least two nodes, not {}",
            nodes.len()
        )));
    }
    let n = nodes.len();
    let node = |i: usize| nodes[i % n].to_owned();
    let parent = (0..partitions as usize).map(node).collect();
    let child = (0..partitions as usize).map(|p| node(p + 1)).collect();
    Ok((parent, child))
}

/// Latency figures of one kind of read, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Latency {
    /// Reads timed.
    pub reads: usize,
    /// Median (nearest rank).
    pub p50_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Slowest.
    pub max_us: f64,
}

impl Latency {
    /// The figures of `samples` (any order); all zero for none.
    pub fn of(samples: &[Duration]) -> Latency {
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        Latency {
            reads: us.len(),
            p50_us: nearest_rank(&us, 0.50),
            p99_us: nearest_rank(&us, 0.99),
            mean_us: per_second(us.iter().sum(), us.len() as f64),
            max_us: us.last().copied().unwrap_or(0.0),
        }
    }
}

/// The `q` quantile of sorted `values` by nearest rank (the smallest value with at least
/// `q` of the values at or below it); 0 for none.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What reading the cluster's metadata costs.
#[derive(Clone, Debug, Serialize)]
pub struct ConfirmFigures {
    /// `confirm()`: a linearizable range read of the metadata (through the etcd leader's read
    /// index), decoded. A cursor makes one per anchor, before it trusts its attach epoch.
    pub linearizable: Latency,
    /// `snapshot()` of a metastore without a watched copy: a serializable range read (the
    /// etcd member answers from its own state), decoded.
    pub serializable: Latency,
    /// `snapshot()` of a metastore with a watched copy (as every node runs): no etcd call.
    pub cached: Latency,
    /// Cursors anchored in the cluster phase (one per parent partition and child): one
    /// `confirm()` each.
    pub anchors: u32,
    /// Topics in the metadata read.
    pub metadata_topics: usize,
    /// Links in the metadata read.
    pub metadata_links: usize,
}

/// One phase's figures.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseFigures {
    /// Nodes that ran it.
    pub nodes: usize,
    /// Owner of each parent partition (cluster phase; empty on a single node).
    pub parent_owners: Vec<String>,
    /// Owner of each child partition (cluster phase; empty on a single node).
    pub child_owners: Vec<String>,
    /// Seconds from the first produce request until the last was answered.
    pub produce_seconds: f64,
    /// Records produced per second over that time.
    pub produce_records_per_s: f64,
    /// Seconds from the first produce request until the child held every record.
    pub copy_seconds: f64,
    /// Records copied per second over that time.
    pub copy_records_per_s: f64,
    /// Records the child held at the first look after the last produce was answered.
    pub held_at_produce_end: u64,
    /// Seconds from that look until the child held every record.
    pub drain_seconds: f64,
    /// Records copied per second in that time (the produce no longer running beside the
    /// copy); `None` when the copy kept pace ([`PhaseFigures::copy_bound_by_produce`]).
    pub drain_records_per_s: Option<f64>,
    /// Whether the copy kept pace with the produce: at most one slab per partition behind at
    /// its end. Then the copy figure is the produce's, and the copy could go faster.
    pub copy_bound_by_produce: bool,
    /// Slabs the cursors committed (`narad_fanout_slabs_total`, all nodes).
    pub slabs: u64,
    /// Records per slab.
    pub records_per_slab: f64,
    /// Child bucket commits that failed and were tried again (all nodes).
    pub commit_retries: u64,
    /// Records a child partition's owner dropped as already held (all nodes).
    pub deduplicated_records: u64,
    /// CPU seconds of the daemons, first produce to caught up (`/proc/<pid>/stat`).
    pub daemon_cpu_seconds: Option<f64>,
    /// CPU seconds of this process (producers, polling) over the same time.
    pub bench_cpu_seconds: Option<f64>,
    /// Both over the copy time: cores busy.
    pub cores_busy: Option<f64>,
    /// The second child's copy of the same records, released once they were all produced.
    pub backlog: BacklogFigures,
    /// Records found in the child by provenance (each parent record once).
    pub child_records: u64,
    /// Seconds the read-back took.
    pub verify_seconds: f64,
}

/// The copy of a backlog: a second child, attached before the produce with a chain that
/// leaves every record undecided (its cursors stall and retry each second, copying nothing),
/// swapped to the default chain once every record is produced, so it copies the whole parent
/// from disk with no produce beside it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BacklogFigures {
    /// Seconds from the router swap's answer until the child was first seen holding records
    /// (the reconciler's tick and the cursors' retry pause, each up to 1 s).
    pub release_seconds: f64,
    /// Seconds between the first cursor's first records and the last cursor's.
    pub release_spread_seconds: f64,
    /// Records it held at that first look.
    pub held_at_first_look: u64,
    /// Seconds from that first look until it held every record.
    pub seconds: f64,
    /// Records copied per second over that time. The cursors are released up to about a
    /// second apart, so with a short copy this understates what they do together.
    pub records_per_s: f64,
    /// Seconds during which every cursor was copying (from the look at which each partition
    /// held records to the first look at which one was complete).
    pub all_running_seconds: f64,
    /// Records copied per second in that window: what the cursors do together; `None` when
    /// the window held fewer than two looks.
    pub all_running_records_per_s: Option<f64>,
    /// Cores busy (the daemons and this process) over that time.
    pub cores_busy: Option<f64>,
    /// CPU microseconds the daemons spent per record copied over that time (nothing else
    /// runs then: the produce is over and the first child caught up).
    pub daemon_cpu_us_per_record: Option<f64>,
    /// Slabs its cursors committed.
    pub slabs: u64,
    /// Its bucket commits that failed and were tried again.
    pub commit_retries: u64,
}

impl BacklogFigures {
    /// The figure to compare: the rate while every cursor copied, else over the whole copy.
    pub fn rate(&self) -> f64 {
        self.all_running_records_per_s.unwrap_or(self.records_per_s)
    }
}

/// The cluster phase's figures over the single node's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ratios {
    /// Copy rates, first produce to caught up.
    pub copy: f64,
    /// Drain rates, when both phases had a lag left at the end of the produce.
    pub drain: Option<f64>,
    /// Produce rates.
    pub produce: f64,
    /// Backlog copy rates ([`BacklogFigures::rate`]): the copies alone.
    pub backlog: f64,
    /// Daemon CPU per record of the backlog copies: what a record copied across nodes costs
    /// against one copied on one node (`None` when the CPU could not be read).
    pub backlog_cpu_per_record: Option<f64>,
}

impl Ratios {
    /// `cluster` over `single`, figure by figure (0 where the single figure is 0).
    pub fn of(single: &PhaseFigures, cluster: &PhaseFigures) -> Ratios {
        Ratios {
            copy: per_second(cluster.copy_records_per_s, single.copy_records_per_s),
            drain: match (single.drain_records_per_s, cluster.drain_records_per_s) {
                (Some(s), Some(c)) => Some(per_second(c, s)),
                _ => None,
            },
            produce: per_second(cluster.produce_records_per_s, single.produce_records_per_s),
            backlog: per_second(cluster.backlog.records_per_s, single.backlog.records_per_s),
            backlog_cpu_per_record: match (
                single.backlog.daemon_cpu_us_per_record,
                cluster.backlog.daemon_cpu_us_per_record,
            ) {
                (Some(s), Some(c)) => Some(per_second(c, s)),
                _ => None,
            },
        }
    }
}

/// What `narad bench cluster` measured.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterReport {
    /// Always `"cluster"`.
    pub bench: &'static str,
    /// `debug` or `release`: the build of this binary and of the daemons it started.
    pub build: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it was on, shared by every daemon.
    pub file_system: Option<FileSystemInfo>,
    /// Cores this process may use (`available_parallelism`), shared by every daemon.
    pub cpus: Option<usize>,
    /// The etcd endpoints.
    pub etcd: String,
    /// The cluster name (etcd key prefix `/narad/{name}/`).
    pub cluster_name: String,
    /// Records produced in each phase.
    pub records: u64,
    /// Partitions of the parent and of the child.
    pub partitions: u32,
    /// Value bytes per record (keyless records).
    pub value_bytes: usize,
    /// Records per produce request.
    pub batch_records: u32,
    /// Produce requests in flight at once.
    pub producers: u32,
    /// One `narad serve`, embedded metastore.
    pub single: PhaseFigures,
    /// Three nodes on etcd, every bucket to another node.
    pub cluster: PhaseFigures,
    /// Cluster over single.
    pub ratios: Ratios,
    /// What a metadata read costs.
    pub confirm: ConfirmFigures,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after it.
    pub load_after: Option<[f64; 3]>,
}

/// CPU time of every node together, when all could be read.
fn nodes_cpu_time(nodes: &[Node]) -> Option<Duration> {
    nodes
        .iter()
        .map(|n| n.pid().and_then(process_cpu).map(ProcessCpu::total))
        .sum()
}

/// A counter summed over every series of metric `name` in Prometheus text whose `child`
/// label is `child`.
fn metric_sum(text: &str, name: &str, child: &str) -> u64 {
    let label = format!("child=\"{child}\"");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
            let labels = labels.trim_end_matches('}');
            let ours = metric == name && labels.split(',').any(|l| l == label);
            ours.then(|| value.parse::<f64>().ok())?
        })
        .map(|v| v as u64)
        .sum()
}

/// A produce request body: `count` keyless records of `value` to `partition`.
fn produce_body(partition: u32, count: u32, value: &str) -> Result<Bytes, BenchError> {
    let record = ProduceRecordJson {
        value: Some(Some(value.to_owned())),
        partition: Some(partition),
        ..ProduceRecordJson::default()
    };
    json_body(&ProduceRequest {
        records: vec![record; count as usize],
    })
}

/// Batch `i` of a phase: its partition and record count, for `records` in batches of
/// `batch` over `partitions` partitions round-robin; `None` past the last batch.
fn batch(i: u64, records: u64, batch: u32, partitions: u32) -> Option<(u32, u32)> {
    let first = i.checked_mul(u64::from(batch))?;
    if first >= records {
        return None;
    }
    let count = (records - first).min(u64::from(batch)) as u32;
    Some(((i % u64::from(partitions)) as u32, count))
}

/// Whether a copy `behind` records behind the produce at its end kept pace with it: at most
/// one slab per partition (the slab each cursor had in hand).
fn kept_pace(behind: u64, partitions: u32) -> bool {
    behind <= u64::from(partitions) * SLAB_MAX_RECORDS as u64
}

/// One phase: which nodes, where the partitions go.
struct PhaseSpec<'a> {
    name: &'static str,
    nodes: &'a [Node],
    /// (parent, child) owners by partition; `None` on a single node.
    placement: Option<(Vec<String>, Vec<String>)>,
}

impl PhaseSpec<'_> {
    /// The URL of the node owning `partition` per `owners` (the first node on a single node).
    fn owner_url(&self, owners: &[String], partition: u32) -> String {
        owners
            .get(partition as usize)
            .and_then(|id| self.nodes.iter().find(|n| &n.id == id))
            .unwrap_or(&self.nodes[0])
            .url
            .clone()
    }

    /// An error naming the phase's first node, with its log.
    fn failed(&self, reason: String) -> BenchError {
        self.nodes[0].failed(reason)
    }
}

const PARENT: &str = "bench-parent";
/// The child attached with the default chain before the produce: it copies beside it.
const CHILD: &str = "bench-child";
/// The child attached with a chain that holds every record (see [`HOLD_CONFIG`]), released
/// once the produce is over: it copies a backlog.
const HELD: &str = "bench-backlog";

/// Records the child holds now (the sum of its partitions' high watermarks; a partition whose
/// figure is not known yet counts 0), and each partition's.
async fn child_held(
    http: &reqwest::Client,
    base: &str,
    topic: &str,
) -> Result<(u64, Vec<u64>), BenchError> {
    let description: TopicDescription = call(
        http,
        reqwest::Method::GET,
        &format!("{base}/v1/topics/{topic}"),
        None,
    )
    .await?;
    let each: Vec<u64> = description
        .partition_stats
        .iter()
        .map(|p| p.high_watermark.unwrap_or(0))
        .collect();
    Ok((each.iter().sum(), each))
}

/// What the children listing says is wrong with the cursors (for an error).
async fn cursor_trouble(http: &reqwest::Client, base: &str) -> String {
    match call::<ChildList>(
        http,
        reqwest::Method::GET,
        &format!("{base}/v1/topics/{PARENT}/children"),
        None,
    )
    .await
    {
        Ok(list) => list
            .children
            .iter()
            .flat_map(|c| c.partitions.iter())
            .map(|p| {
                format!(
                    "p{} {:?} next {:?}{}",
                    p.partition,
                    p.state,
                    p.next_offset,
                    p.last_error
                        .as_ref()
                        .map_or(String::new(), |e| format!(": {e}"))
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("the children listing failed: {e}"),
    }
}

/// The CPU time of the nodes and of this process at one moment.
struct CpuSample {
    daemons: Option<Duration>,
    bench: Option<Duration>,
}

impl CpuSample {
    fn now(nodes: &[Node]) -> CpuSample {
        CpuSample {
            daemons: nodes_cpu_time(nodes),
            bench: sys::cpu_time(),
        }
    }

    /// CPU seconds of the daemons and of this process since `self`, and both together over
    /// `seconds` of wall time (cores busy).
    fn since(&self, nodes: &[Node], seconds: f64) -> (Option<f64>, Option<f64>, Option<f64>) {
        let after = CpuSample::now(nodes);
        let used = |before: Option<Duration>, after: Option<Duration>| {
            Some(after?.saturating_sub(before?).as_secs_f64())
        };
        let daemons = used(self.daemons, after.daemons);
        let bench = used(self.bench, after.bench);
        let cores = match (daemons, bench) {
            (Some(d), Some(b)) => Some(per_second(d + b, seconds)),
            _ => None,
        };
        (daemons, bench, cores)
    }
}

/// The held child's config: `header-route` on a header no record carries, and no fallback,
/// so every record stays undecided, every slab fails to route and the cursors wait (retrying
/// each second, never skipping a record) until the chain is swapped.
const HOLD_CONFIG: &str = "header = narad-bench-hold\nrelease = 0\n";

/// Creates `name` with the phase's partition count and `placement`; returns its owners.
async fn create_topic(
    http: &reqwest::Client,
    spec: &PhaseSpec<'_>,
    name: &str,
    partitions: u32,
    placement: Option<Vec<String>>,
) -> Result<Vec<String>, BenchError> {
    let base = &spec.nodes[0].url;
    let created: TopicInfo = call(
        http,
        reqwest::Method::POST,
        &format!("{base}/v1/topics"),
        Some(json_body(&CreateTopicRequest {
            name: name.to_owned(),
            partitions,
            retention_ms: None,
            retention_bytes: None,
            placement: placement.clone(),
        })?),
    )
    .await?;
    if let Some(wanted) = &placement
        && &created.owners != wanted
    {
        return Err(spec.failed(format!(
            "{name} was placed on {:?}, not on {wanted:?}",
            created.owners
        )));
    }
    Ok(created.owners)
}

/// Attaches `child` to the parent with `request`.
async fn attach(
    http: &reqwest::Client,
    spec: &PhaseSpec<'_>,
    child: &str,
    request: &AttachRequest,
) -> Result<LinkInfo, BenchError> {
    call(
        http,
        reqwest::Method::PUT,
        &format!("{}/v1/topics/{PARENT}/children/{child}", spec.nodes[0].url),
        Some(json_body(request)?),
    )
    .await
}

/// Runs one phase on running nodes.
async fn run_phase(
    http: &reqwest::Client,
    spec: &PhaseSpec<'_>,
    options: &ClusterOptions,
    progress: &mut Progress,
) -> Result<PhaseFigures, BenchError> {
    let base = spec.nodes[0].url.clone();
    let records = options.records;
    let (parent_placement, child_placement) = match &spec.placement {
        Some((parent, child)) => (Some(parent.clone()), Some(child.clone())),
        None => (None, None),
    };
    let parent_owners =
        create_topic(http, spec, PARENT, options.partitions, parent_placement).await?;
    let child_owners = create_topic(
        http,
        spec,
        CHILD,
        options.partitions,
        child_placement.clone(),
    )
    .await?;
    let held_owners = create_topic(http, spec, HELD, options.partitions, child_placement).await?;
    // Attach before producing: the attach point is the parent's end.
    let link = attach(http, spec, CHILD, &AttachRequest::default()).await?;
    let held_link = attach(
        http,
        spec,
        HELD,
        &AttachRequest {
            router: Some(vec!["header-route".to_owned()]),
            config: Some(serde_json::Value::String(HOLD_CONFIG.to_owned())),
            ..AttachRequest::default()
        },
    )
    .await?;
    for child in [CHILD, HELD] {
        wait_for_cursors(http, spec, child, options.partitions).await?;
    }
    progress.step(&format!(
        "{}: parent and two children of {} partitions attached, their cursors running",
        spec.name, options.partitions
    ));

    // The produce, and the wait for the copy beside it.
    let value: String = (0..options.value_bytes)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let full_bodies: Vec<Bytes> = (0..options.partitions)
        .map(|p| produce_body(p, options.batch_records, &value))
        .collect::<Result<_, _>>()?;
    let urls: Vec<String> = (0..options.partitions)
        .map(|p| {
            format!(
                "{}/v1/topics/{PARENT}/records",
                spec.owner_url(&parent_owners, p)
            )
        })
        .collect();
    let shared = Arc::new(ProduceShared {
        next_batch: AtomicU64::new(0),
        acknowledged: AtomicU64::new(0),
        full_bodies,
        urls,
        value,
        records,
        batch_records: options.batch_records,
        partitions: options.partitions,
    });
    let cpu = CpuSample::now(spec.nodes);
    let start = Instant::now();
    let mut producers = tokio::task::JoinSet::new();
    for _ in 0..options.producers {
        let (http, shared) = (http.clone(), Arc::clone(&shared));
        producers.spawn(async move { produce(&http, &shared, start).await });
    }
    let mut running = options.producers;
    let mut produce_end = Duration::ZERO;
    let mut at_produce_end: Option<(Duration, u64)> = None;
    let mut watch = Stall::new();
    let caught_up = loop {
        while let Some(joined) = producers.try_join_next() {
            let finished = joined.map_err(|e| BenchError::Http {
                context: "a producer task".into(),
                reason: e.to_string(),
            })??;
            produce_end = produce_end.max(finished);
            running -= 1;
        }
        let (held, _) = child_held(http, &base, CHILD).await?;
        let now = start.elapsed();
        check_not_over(CHILD, held, records)?;
        if running == 0 && at_produce_end.is_none() {
            at_produce_end = Some((now, held));
        }
        if running == 0 && held == records {
            break now;
        }
        let acknowledged = shared.acknowledged.load(Ordering::Relaxed);
        watch
            .check(http, spec, (held, acknowledged), || {
                format!("{acknowledged} of {records} records produced, {CHILD} holds {held}")
            })
            .await?;
        progress.update(|| {
            format!(
                "{}: produced {acknowledged}/{records}, child holds {held}, {:.0} copies/s",
                spec.name,
                per_second(held as f64, now.as_secs_f64())
            )
        });
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    let copy_seconds = caught_up.as_secs_f64();
    let (daemon_cpu_seconds, bench_cpu_seconds, cores_busy) = cpu.since(spec.nodes, copy_seconds);
    progress.finish();
    let (end_look, held_at_produce_end) = at_produce_end.unwrap_or((caught_up, records));
    let drain_seconds = caught_up.saturating_sub(end_look).as_secs_f64();
    let drained = records - held_at_produce_end;
    progress.step(&format!(
        "{}: {records} records copied beside the produce in {copy_seconds:.2} s",
        spec.name
    ));

    let backlog = copy_backlog(http, spec, records, progress).await?;
    progress.step(&format!(
        "{}: a backlog of {records} records copied in {:.2} s",
        spec.name, backlog.seconds
    ));

    let verify_start = Instant::now();
    let child_records = verify(http, spec, CHILD, &child_owners, &link, records).await?;
    verify(http, spec, HELD, &held_owners, &held_link, records).await?;
    let verify_seconds = verify_start.elapsed().as_secs_f64();
    let metrics = scrape(http, spec.nodes).await?;
    let slabs = metric_sum(&metrics, "narad_fanout_slabs_total", CHILD);
    Ok(PhaseFigures {
        nodes: spec.nodes.len(),
        parent_owners,
        child_owners,
        produce_seconds: produce_end.as_secs_f64(),
        produce_records_per_s: per_second(records as f64, produce_end.as_secs_f64()),
        copy_seconds,
        copy_records_per_s: per_second(records as f64, copy_seconds),
        held_at_produce_end,
        drain_seconds,
        // Within a slab per partition of the end, the "drain" is the slab in flight: no rate.
        drain_records_per_s: (!kept_pace(drained, options.partitions) && drain_seconds > 0.0)
            .then(|| per_second(drained as f64, drain_seconds)),
        copy_bound_by_produce: kept_pace(drained, options.partitions),
        slabs,
        records_per_slab: per_second(records as f64, slabs as f64),
        commit_retries: metric_sum(&metrics, "narad_fanout_commit_retries_total", CHILD),
        deduplicated_records: metric_sum(
            &metrics,
            "narad_fanout_commit_deduplicated_records_total",
            CHILD,
        ),
        daemon_cpu_seconds,
        bench_cpu_seconds,
        cores_busy,
        backlog: BacklogFigures {
            slabs: metric_sum(&metrics, "narad_fanout_slabs_total", HELD),
            commit_retries: metric_sum(&metrics, "narad_fanout_commit_retries_total", HELD),
            ..backlog
        },
        child_records,
        verify_seconds,
    })
}

/// Fails when `topic` holds more records than were produced (a copy twice).
fn check_not_over(topic: &str, held: u64, records: u64) -> Result<(), BenchError> {
    if held > records {
        return Err(BenchError::Incomplete {
            child: topic.into(),
            reason: format!("it holds {held} records, more than the {records} produced"),
        });
    }
    Ok(())
}

/// Notices a copy that stopped moving.
struct Stall {
    seen: (u64, u64),
    since: Instant,
}

impl Stall {
    fn new() -> Stall {
        Stall {
            seen: (u64::MAX, u64::MAX),
            since: Instant::now(),
        }
    }

    /// Fails when `seen` stayed the same for [`NO_PROGRESS_LIMIT`], saying `what` and what
    /// the cursors report.
    async fn check(
        &mut self,
        http: &reqwest::Client,
        spec: &PhaseSpec<'_>,
        seen: (u64, u64),
        what: impl FnOnce() -> String,
    ) -> Result<(), BenchError> {
        if seen != self.seen {
            self.seen = seen;
            self.since = Instant::now();
            return Ok(());
        }
        if self.since.elapsed() <= NO_PROGRESS_LIMIT {
            return Ok(());
        }
        let trouble = cursor_trouble(http, &spec.nodes[0].url).await;
        Err(spec.failed(format!(
            "no progress for {} s: {}; cursors: {trouble}",
            NO_PROGRESS_LIMIT.as_secs(),
            what()
        )))
    }
}

/// The held child's copy: checks it holds nothing, swaps in the default chain, and times the
/// copy of the whole parent, now a backlog on disk, with nothing else running.
async fn copy_backlog(
    http: &reqwest::Client,
    spec: &PhaseSpec<'_>,
    records: u64,
    progress: &mut Progress,
) -> Result<BacklogFigures, BenchError> {
    let base = &spec.nodes[0].url;
    // Keyless records keep their partition's index: child partition p copies parent p.
    let (_, targets) = child_held(http, base, PARENT).await?;
    let targets = targets.as_slice();
    let (held, _) = child_held(http, base, HELD).await?;
    if held != 0 {
        return Err(BenchError::Incomplete {
            child: HELD.into(),
            reason: format!("it copied {held} records before its release: the hold did not hold"),
        });
    }
    let released: LinkInfo = call(
        http,
        reqwest::Method::PATCH,
        &format!("{base}/v1/topics/{PARENT}/children/{HELD}"),
        Some(json_body(&RouterChange {
            router: DEFAULT_ROUTER.iter().map(|s| (*s).to_owned()).collect(),
            config: Some(serde_json::Value::String(String::new())),
            ..RouterChange::default()
        })?),
    )
    .await?;
    if released.router.len() != DEFAULT_ROUTER.len() {
        return Err(spec.failed(format!(
            "the router swap answered a chain of {} plugins",
            released.router.len()
        )));
    }
    let start = Instant::now();
    let mut first: Option<(Duration, u64, CpuSample)> = None;
    let mut looks: Vec<(Duration, Vec<u64>)> = Vec::new();
    let mut watch = Stall::new();
    let done = loop {
        let (held, each) = child_held(http, base, HELD).await?;
        let now = start.elapsed();
        check_not_over(HELD, held, records)?;
        if held > 0 && first.is_none() {
            first = Some((now, held, CpuSample::now(spec.nodes)));
        }
        looks.push((now, each));
        if held == records {
            break now;
        }
        watch
            .check(http, spec, (held, 0), || {
                format!("{HELD} holds {held} of {records} records after its release")
            })
            .await?;
        progress.update(|| format!("{}: backlog copy, {held}/{records}", spec.name));
        tokio::time::sleep(BACKLOG_POLL_INTERVAL).await;
    };
    progress.finish();
    let (first_at, first_held, cpu) = first.unwrap_or((done, records, CpuSample::now(spec.nodes)));
    let seconds = done.saturating_sub(first_at).as_secs_f64();
    let (daemon_cpu, _, cores_busy) = cpu.since(spec.nodes, seconds);
    let all_running = all_running_rate(&looks, targets);
    let copied = records - first_held;
    Ok(BacklogFigures {
        release_seconds: first_at.as_secs_f64(),
        release_spread_seconds: release_spread(&looks),
        held_at_first_look: first_held,
        seconds,
        records_per_s: per_second((records - first_held) as f64, seconds),
        all_running_seconds: all_running.map_or(0.0, |a| a.1),
        all_running_records_per_s: all_running.map(|a| a.0),
        cores_busy,
        daemon_cpu_us_per_record: daemon_cpu
            .filter(|_| copied > 0)
            .map(|cpu| cpu * 1e6 / copied as f64),
        slabs: 0,
        commit_retries: 0,
    })
}

/// The partitions that have records to copy: those whose `targets` entry is not 0.
fn copying(targets: &[u64]) -> impl Iterator<Item = usize> + '_ {
    targets
        .iter()
        .enumerate()
        .filter(|(_, t)| **t > 0)
        .map(|(p, _)| p)
}

/// The copy rate while every cursor with records to copy was copying, from `looks` at the
/// child (time, records of each partition) and each partition's `targets`: from the first
/// look at which each of those partitions held records to the first at which one held all
/// of its own. Returns the rate and the window's seconds; `None` when no two looks fall in
/// that window (the cursors were released too far apart, or the copy was too short).
fn all_running_rate(looks: &[(Duration, Vec<u64>)], targets: &[u64]) -> Option<(f64, f64)> {
    let held = |each: &[u64], p: usize| each.get(p).copied().unwrap_or(0);
    let from = looks
        .iter()
        .position(|(_, each)| copying(targets).all(|p| held(each, p) > 0))?;
    let to = looks
        .iter()
        .position(|(_, each)| copying(targets).any(|p| held(each, p) >= targets[p]))?;
    if to <= from {
        return None;
    }
    let ((t0, a), (t1, b)) = (&looks[from], &looks[to]);
    let copied = b.iter().sum::<u64>().saturating_sub(a.iter().sum::<u64>());
    let seconds = t1.saturating_sub(*t0).as_secs_f64();
    Some((per_second(copied as f64, seconds), seconds))
}

/// Seconds between the first look at which some partition held records and the first at
/// which every partition that ever did held some: how far apart the cursors started.
fn release_spread(looks: &[(Duration, Vec<u64>)]) -> f64 {
    let Some((_, last)) = looks.last() else {
        return 0.0;
    };
    let started = |(_, each): &&(Duration, Vec<u64>)| each.iter().any(|&n| n > 0);
    let all_started = |(_, each): &&(Duration, Vec<u64>)| {
        each.iter().zip(last).all(|(&n, &end)| end == 0 || n > 0)
    };
    match (looks.iter().find(started), looks.iter().find(all_started)) {
        (Some((a, _)), Some((b, _))) => b.saturating_sub(*a).as_secs_f64(),
        _ => 0.0,
    }
}

/// `/metrics` of every node, one after the other.
async fn scrape(http: &reqwest::Client, nodes: &[Node]) -> Result<String, BenchError> {
    let mut all = String::new();
    for node in nodes {
        let text = http
            .get(format!("{}/metrics", node.url))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| node.failed(format!("reading /metrics: {e}")))?
            .text()
            .await
            .map_err(|e| node.failed(format!("reading /metrics: {e}")))?;
        all.push_str(&text);
        all.push('\n');
    }
    Ok(all)
}

/// Waits until the children listing shows a started cursor for every parent partition.
async fn wait_for_cursors(
    http: &reqwest::Client,
    spec: &PhaseSpec<'_>,
    child: &str,
    partitions: u32,
) -> Result<(), BenchError> {
    let base = &spec.nodes[0].url;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let list: ChildList = call(
            http,
            reqwest::Method::GET,
            &format!("{base}/v1/topics/{PARENT}/children"),
            None,
        )
        .await?;
        let started = list
            .children
            .iter()
            .find(|c| c.name == child)
            .map_or(0, |c| {
                c.partitions
                    .iter()
                    .filter(|p| p.next_offset.is_some())
                    .count()
            });
        if started == partitions as usize {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(spec.failed(format!(
                "{started} of {partitions} cursors of {child} started within {} s: {}",
                START_TIMEOUT.as_secs(),
                cursor_trouble(http, base).await
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// What the producers share.
struct ProduceShared {
    next_batch: AtomicU64,
    acknowledged: AtomicU64,
    /// A full batch's body, by partition.
    full_bodies: Vec<Bytes>,
    /// The produce URL of each partition's owner.
    urls: Vec<String>,
    value: String,
    records: u64,
    batch_records: u32,
    partitions: u32,
}

/// One producer: takes the next batch until there is none; returns when it finished,
/// measured from `start`.
async fn produce(
    http: &reqwest::Client,
    shared: &ProduceShared,
    start: Instant,
) -> Result<Duration, BenchError> {
    loop {
        let i = shared.next_batch.fetch_add(1, Ordering::Relaxed);
        let Some((partition, count)) =
            batch(i, shared.records, shared.batch_records, shared.partitions)
        else {
            return Ok(start.elapsed());
        };
        let body = if count == shared.batch_records {
            shared.full_bodies[partition as usize].clone()
        } else {
            produce_body(partition, count, &shared.value)?
        };
        let answer: serde_json::Value = call(
            http,
            reqwest::Method::POST,
            &shared.urls[partition as usize],
            Some(body),
        )
        .await?;
        let offsets = answer["offsets"].as_array().map_or(0, Vec::len);
        if offsets != count as usize {
            return Err(BenchError::Http {
                context: format!("POST {}", shared.urls[partition as usize]),
                reason: format!("{offsets} offsets answered for {count} records"),
            });
        }
        shared
            .acknowledged
            .fetch_add(u64::from(count), Ordering::Relaxed);
    }
}

/// Reads the child back from each partition's owner: every parent record must be there
/// exactly once (by its provenance: this link's epoch, the parent partition of the child
/// partition's index, an offset below the parent's end). Returns the records found.
async fn verify(
    http: &reqwest::Client,
    spec: &PhaseSpec<'_>,
    child: &str,
    child_owners: &[String],
    link: &LinkInfo,
    records: u64,
) -> Result<u64, BenchError> {
    let incomplete = |reason: String| BenchError::Incomplete {
        child: child.into(),
        reason,
    };
    let (parent_total, parent_high) = child_held(http, &spec.nodes[0].url, PARENT).await?;
    if parent_total != records {
        return Err(BenchError::Incomplete {
            child: PARENT.into(),
            reason: format!("the parent holds {parent_total} records, not the {records} produced"),
        });
    }
    let mut found = 0u64;
    for (p, &high) in parent_high.iter().enumerate() {
        let p = p as u32;
        let base = spec.owner_url(child_owners, p);
        let mut seen = vec![false; high as usize];
        let mut offset = 0u64;
        loop {
            let read: FetchResponse = call(
                http,
                reqwest::Method::GET,
                &format!(
                    "{base}/v1/topics/{child}/partitions/{p}/records?offset={offset}&max={FETCH_MAX}"
                ),
                None,
            )
            .await?;
            for record in &read.records {
                let Some(origin) = &record.origin else {
                    return Err(incomplete(format!(
                        "p{p} offset {} has no provenance",
                        record.offset
                    )));
                };
                if origin.epoch != link.attach_epoch || origin.partition != p {
                    return Err(incomplete(format!(
                        "p{p} offset {} came from epoch {} parent partition {}, not from this \
                         link's epoch {} and parent partition {p}",
                        record.offset, origin.epoch, origin.partition, link.attach_epoch
                    )));
                }
                let slot = seen.get_mut(origin.offset as usize).ok_or_else(|| {
                    incomplete(format!(
                        "p{p} offset {} names parent offset {}, past the parent's end {high}",
                        record.offset, origin.offset
                    ))
                })?;
                if std::mem::replace(slot, true) {
                    return Err(incomplete(format!(
                        "p{p} holds parent offset {} twice (a duplicate in a run without \
                         failures)",
                        origin.offset
                    )));
                }
                found += 1;
            }
            if read.records.is_empty() || read.next_offset >= read.high_watermark {
                break;
            }
            offset = read.next_offset;
        }
        if let Some(missing) = seen.iter().position(|s| !s) {
            return Err(incomplete(format!(
                "parent p{p} offset {missing} is missing from child partition {p}"
            )));
        }
    }
    Ok(found)
}

/// Times `confirm()` against the two cheaper reads, interleaved read by read so a busy
/// moment weighs on all three.
async fn measure_reads(
    endpoints: &[String],
    prefix: &str,
    reads: u32,
    anchors: u32,
) -> Result<ConfirmFigures, BenchError> {
    let etcd = |context: &str, e: String| BenchError::EtcdUnavailable {
        endpoints: endpoints.join(","),
        reason: format!("{context}: {e}"),
    };
    let client = connect_client(endpoints)
        .await
        .map_err(|e| etcd("connecting", e.to_string()))?;
    let plain = EtcdMetastore::with_client(client.clone(), prefix.to_owned());
    let (stop, signal) = narad_host::shutdown::channel();
    let cached = tokio::time::timeout(
        ETCD_CALL_TIMEOUT,
        EtcdMetastore::with_cache(client, prefix.to_owned(), CacheTiming::default(), signal),
    )
    .await
    .map_err(|_| etcd("starting a watched copy", "timed out".into()))?
    .map_err(|e| etcd("starting a watched copy", e.to_string()))?;
    let mut samples: [Vec<Duration>; 3] = Default::default();
    let mut metadata = (0, 0);
    for round in 0..CONFIRM_WARM_UP + reads {
        for (kind, samples) in samples.iter_mut().enumerate() {
            let started = Instant::now();
            let read = match kind {
                0 => plain.confirm(),
                1 => plain.snapshot(),
                _ => cached.snapshot(),
            };
            let snapshot = tokio::time::timeout(ETCD_CALL_TIMEOUT, read)
                .await
                .map_err(|_| etcd("reading the metadata", "timed out".into()))?
                .map_err(|e| etcd("reading the metadata", e.to_string()))?;
            let took = started.elapsed();
            if round >= CONFIRM_WARM_UP {
                samples.push(took);
            }
            metadata = (snapshot.topics.len(), snapshot.links.len());
        }
    }
    stop.trigger();
    Ok(ConfirmFigures {
        linearizable: Latency::of(&samples[0]),
        serializable: Latency::of(&samples[1]),
        cached: Latency::of(&samples[2]),
        anchors,
        metadata_topics: metadata.0,
        metadata_links: metadata.1,
    })
}

/// Checks that etcd answers a linearizable read under `prefix`, before any daemon starts.
async fn check_etcd(endpoints: &[String], prefix: &str) -> Result<(), BenchError> {
    let unavailable = |reason: String| BenchError::EtcdUnavailable {
        endpoints: endpoints.join(","),
        reason,
    };
    let check = async {
        let client = connect_client(endpoints)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        EtcdMetastore::with_client(client, prefix.to_owned())
            .confirm()
            .await
            .map_err(|e| unavailable(e.to_string()))
    };
    tokio::time::timeout(ETCD_CALL_TIMEOUT, check)
        .await
        .map_err(|_| {
            unavailable(format!(
                "no answer within {} s",
                ETCD_CALL_TIMEOUT.as_secs()
            ))
        })??;
    Ok(())
}

/// Removes every key under `prefix` (the cluster phase's metadata, ownership and node keys).
pub(super) async fn remove_keys(endpoints: &[String], prefix: &str) -> Result<(), BenchError> {
    let unavailable = |reason: String| BenchError::EtcdUnavailable {
        endpoints: endpoints.join(","),
        reason: format!("removing the keys under {prefix}: {reason}"),
    };
    let remove = async {
        let client = connect_client(endpoints)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        client
            .kv_client()
            .delete(
                prefix,
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| unavailable(e.to_string()))
    };
    tokio::time::timeout(ETCD_CALL_TIMEOUT, remove)
        .await
        .map_err(|_| unavailable("timed out".into()))??;
    Ok(())
}

/// A cluster name no other run uses: `bench-<pid>-<unix ms>`.
pub(super) fn unique_cluster_name() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("bench-{}-{millis}", std::process::id())
}

/// Waits until every node lists `count` live nodes.
async fn wait_for_nodes(
    http: &reqwest::Client,
    nodes: &[Node],
    count: usize,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + START_TIMEOUT;
    for node in nodes {
        loop {
            let list: narad_host::api::types::NodeList = call(
                http,
                reqwest::Method::GET,
                &format!("{}/v1/nodes", node.url),
                None,
            )
            .await?;
            if list.nodes.len() == count {
                break;
            }
            if Instant::now() > deadline {
                return Err(node.failed(format!(
                    "lists {} live nodes, not {count}, after {} s",
                    list.nodes.len(),
                    START_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
    Ok(())
}

/// Stops every node and removes its data directory.
async fn stop_nodes(nodes: &mut [Node], dirs: &[PathBuf]) -> Result<(), BenchError> {
    for node in nodes.iter_mut() {
        node.stop().await;
    }
    for dir in dirs {
        std::fs::remove_dir_all(dir)
            .map_err(BenchError::io(format!("removing {}", dir.display())))?;
    }
    Ok(())
}

/// Runs the cluster bench.
pub async fn run_cluster(options: ClusterOptions) -> Result<ClusterReport, BenchError> {
    options.validate()?;
    let endpoints = options.endpoints();
    let cluster_name = unique_cluster_name();
    let prefix = narad_host::cluster::prefix(&cluster_name);
    check_etcd(&endpoints, &prefix).await?;
    let load_before = sys::load_average();
    // Declared before the nodes, so it is dropped after them: a daemon is dead before its
    // directory is removed.
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench cluster in {} on {}, etcd {}",
        work.path().display(),
        work.describe_file_system(),
        options.etcd
    ));
    let http = http_client()?;

    // Phase 1: one node.
    let single_dir = work.path().join("single");
    let mut single_nodes = vec![Node::start(&http, "single", &single_dir, &[]).await?];
    let single = run_phase(
        &http,
        &PhaseSpec {
            name: "single node",
            nodes: &single_nodes,
            placement: None,
        },
        &options,
        &mut progress,
    )
    .await?;
    stop_nodes(&mut single_nodes, &[single_dir]).await?;

    // Phase 2: three nodes on etcd. Whatever happens in it, the nodes are stopped and the
    // cluster's keys removed from etcd afterwards.
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    let outcome = async {
        for id in NODE_IDS {
            let dir = work.path().join(id);
            let extra: Vec<String> = [
                "--etcd",
                options.etcd.as_str(),
                "--cluster",
                cluster_name.as_str(),
                "--node-id",
                id,
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
            dirs.push(dir.clone());
            nodes.push(Node::start(&http, id, &dir, &extra).await?);
        }
        wait_for_nodes(&http, &nodes, NODE_IDS.len()).await?;
        progress.step(&format!(
            "cluster {cluster_name}: {} nodes up",
            NODE_IDS.len()
        ));
        let cluster = run_phase(
            &http,
            &PhaseSpec {
                name: "3 nodes",
                nodes: &nodes,
                placement: Some(placements(options.partitions, &NODE_IDS)?),
            },
            &options,
            &mut progress,
        )
        .await?;
        let confirm = measure_reads(
            &endpoints,
            &prefix,
            options.confirm_reads,
            // Two children, one cursor per parent partition each.
            2 * options.partitions,
        )
        .await?;
        progress.step(&format!(
            "confirm(): p50 {:.0} us over {} reads",
            confirm.linearizable.p50_us, confirm.linearizable.reads
        ));
        Ok::<_, BenchError>((cluster, confirm))
    }
    .await;
    // A node that never started has no directory to remove.
    dirs.retain(|d| d.exists());
    let stopped = stop_nodes(&mut nodes, &dirs).await;
    // The phase's own error matters more than these.
    let removed = remove_keys(&endpoints, &prefix).await;
    let (cluster, confirm) = outcome?;
    stopped?;
    removed?;

    let ratios = Ratios::of(&single, &cluster);
    Ok(ClusterReport {
        bench: "cluster",
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        dir: work.path_buf(),
        file_system: work.file_system.clone(),
        cpus: std::thread::available_parallelism().ok().map(usize::from),
        etcd: options.etcd.clone(),
        cluster_name,
        records: options.records,
        partitions: options.partitions,
        value_bytes: options.value_bytes,
        batch_records: options.batch_records,
        producers: options.producers,
        single,
        cluster,
        ratios,
        confirm,
        load_before,
        load_after: sys::load_average(),
    })
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or("?".to_owned(), |v| format!("{v:.digits$}"))
}

impl PhaseFigures {
    fn to_text(&self, records: u64) -> String {
        let drain = match self.drain_records_per_s {
            Some(rate) => format!(
                "{} records behind at produce end, drained at {rate:.0}/s in {:.2} s",
                records - self.held_at_produce_end,
                self.drain_seconds
            ),
            None => format!(
                "kept pace with the produce ({} records, at most a slab per partition, behind \
                 at its end)",
                records - self.held_at_produce_end
            ),
        };
        let b = &self.backlog;
        let all_running = match b.all_running_records_per_s {
            Some(rate) => format!(
                "{rate:.0} records/s with every cursor copying ({:.2} s), ",
                b.all_running_seconds
            ),
            None => "(no two looks with every cursor copying: raise --records) ".to_owned(),
        };
        format!(
            "produce {:>9.0} records/s ({:.2} s)\n  \
             copy    {:>9.0} records/s beside the produce, first produce to caught up ({:.2} s); \
             {drain}\n  \
             {} slabs ({:.0} records each), {} commit retries, {} deduplicated; CPU {} s in the \
             daemons + {} s here = {} cores busy\n  \
             backlog {all_running}{:.0} records/s from the first records to caught up ({:.2} \
             s): a second child released once all was produced, {:.2} s to start, cursors \
             {:.2} s apart; {} slabs, {} commit retries; {} cores busy, daemon CPU {} us per \
             record",
            self.produce_records_per_s,
            self.produce_seconds,
            self.copy_records_per_s,
            self.copy_seconds,
            self.slabs,
            self.records_per_slab,
            self.commit_retries,
            self.deduplicated_records,
            opt(self.daemon_cpu_seconds, 2),
            opt(self.bench_cpu_seconds, 2),
            opt(self.cores_busy, 2),
            b.records_per_s,
            b.seconds,
            b.release_seconds,
            b.release_spread_seconds,
            b.slabs,
            b.commit_retries,
            opt(b.cores_busy, 2),
            opt(b.daemon_cpu_us_per_record, 2),
        )
    }
}

impl ClusterReport {
    /// What bounds the cluster figure, from what was measured.
    pub fn bounds(&self) -> String {
        let fs = self
            .file_system
            .as_ref()
            .map_or("one file system".to_owned(), |f| {
                format!("one {} file system ({})", f.fs_type, f.source)
            });
        let cpus = self.cpus.map_or("?".to_owned(), |c| c.to_string());
        let load = self
            .load_before
            .map_or("?".to_owned(), |l| format!("{:.2}", l[0]));
        let cores = match (self.cluster.backlog.cores_busy, self.cpus) {
            (Some(busy), Some(cpus)) if busy >= SATURATED_CORES_SHARE * cpus as f64 => format!(
                "during the 3-node backlog copy the bench's processes kept the cores busy \
                 ({busy:.2} of {cpus}): it is bounded by CPU, shared by the three daemons"
            ),
            (Some(busy), Some(cpus)) => format!(
                "during the 3-node backlog copy the bench's processes used {busy:.2} of {cpus} \
                 cores: the rest of the time went into waiting (fdatasync, HTTP round trips, \
                 hand-offs) or for a core other processes held (1-minute load {load} at the \
                 start)"
            ),
            _ => "the cores' use could not be read".to_owned(),
        };
        let pace = match (
            self.single.copy_bound_by_produce,
            self.cluster.copy_bound_by_produce,
        ) {
            (true, true) => "beside the produce both copies kept pace with it (at most a slab \
                             per partition behind at its end), so that ratio compares the \
                             produce more than the copies; the backlog ratio compares the \
                             copies alone"
                .to_owned(),
            (true, false) => format!(
                "beside the produce the single node's copy kept pace with it, so it could copy \
                 faster than that figure and the true ratio is below {:.2}, while the 3-node \
                 copy fell {} records behind; the backlog ratio compares the copies alone",
                self.ratios.copy,
                self.records - self.cluster.held_at_produce_end
            ),
            (false, true) => "beside the produce the 3-node copy kept pace with it while the \
                              single node's fell behind: that ratio is a lower bound; the \
                              backlog ratio compares the copies alone"
                .to_owned(),
            (false, false) => "beside the produce both copies fell behind it; the backlog \
                               ratio compares the copies alone"
                .to_owned(),
        };
        format!(
            "bounds: the 3 nodes share this machine's {cpus} cores and {fs}; in the cluster \
             every bucket is an HTTP round trip to another node ({} slabs beside the produce, \
             {} for the backlog; POST /internal/v1/commit-frames with the frame each bucket \
             was encoded into, up to two consecutive slabs' a call, appended as it came and \
             fdatasynced there); {cores}; {pace}",
            self.cluster.slabs, self.cluster.backlog.slabs
        )
    }

    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        let c = &self.confirm;
        let drain = self.ratios.drain.map_or(
            "n/a (a phase had no backlog when its produce ended)".to_owned(),
            |d| format!("{d:.2}x"),
        );
        format!(
            "cluster: {} keyless records of {} bytes, {} per produce request, {} producers, \
             parent and children of {} partitions, default chain; {} build, {} cores, on {}\n\
             single node (embedded metastore)\n  {}\n\
             3 nodes (etcd {}, cluster {}): parent on {:?}, child on {:?}\n  {}\n\
             ratio 3 nodes / single: backlog copy {:.2}x, copy beside the produce {:.2}x, \
             drain {drain}, produce {:.2}x; daemon CPU per record of the backlog copy {}\n\
             {}\n\
             confirm() (linearizable read of the metadata, one per anchor; {} anchors in the \
             3-node phase): p50 {:.0} us, p99 {:.0} us, mean {:.0} us, max {:.0} us over {} reads\n\
             for comparison: serializable read p50 {:.0} us, p99 {:.0} us, mean {:.0} us; \
             watched copy p50 {:.1} us, p99 {:.1} us, mean {:.1} us (metadata of {} topics and {} link(s))\n\
             checked: both children hold each of the {} records exactly once (by provenance), \
             in both phases\n\
             load average before {} / after {}",
            self.records,
            self.value_bytes,
            self.batch_records,
            self.producers,
            self.partitions,
            self.build,
            self.cpus.map_or("?".to_owned(), |c| c.to_string()),
            self.file_system
                .as_ref()
                .map_or("an unknown file system".to_owned(), |f| format!(
                    "{} ({})",
                    f.fs_type, f.source
                )),
            self.single.to_text(self.records),
            self.etcd,
            self.cluster_name,
            self.cluster.parent_owners,
            self.cluster.child_owners,
            self.cluster.to_text(self.records),
            self.ratios.backlog,
            self.ratios.copy,
            self.ratios.produce,
            self.ratios
                .backlog_cpu_per_record
                .map_or("n/a".to_owned(), |r| format!("{r:.2}x")),
            self.bounds(),
            c.anchors,
            c.linearizable.p50_us,
            c.linearizable.p99_us,
            c.linearizable.mean_us,
            c.linearizable.max_us,
            c.linearizable.reads,
            c.serializable.p50_us,
            c.serializable.p99_us,
            c.serializable.mean_us,
            c.cached.p50_us,
            c.cached.p99_us,
            c.cached.mean_us,
            c.metadata_topics,
            c.metadata_links,
            self.records,
            sys::load_text(self.load_before),
            sys::load_text(self.load_after),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Partitions per owner in a placement.
    fn per_node(owners: &[String]) -> BTreeMap<&str, usize> {
        let mut count = BTreeMap::new();
        for owner in owners {
            *count.entry(owner.as_str()).or_default() += 1;
        }
        count
    }

    #[test]
    fn no_child_partition_shares_a_node_with_the_parent_partition_of_its_index() {
        for partitions in 1..=16 {
            let (parent, child) = placements(partitions, &NODE_IDS).unwrap();
            assert_eq!(parent.len(), partitions as usize);
            assert_eq!(child.len(), partitions as usize);
            for p in 0..partitions as usize {
                assert_ne!(parent[p], child[p], "partition {p} of {partitions}");
            }
        }
    }

    #[test]
    fn the_placement_spreads_both_topics_evenly_over_the_three_nodes() {
        let (parent, child) = placements(6, &NODE_IDS).unwrap();
        for owners in [&parent, &child] {
            assert_eq!(
                per_node(owners),
                BTreeMap::from([("n1", 2), ("n2", 2), ("n3", 2)])
            );
        }
        assert_eq!(parent, ["n1", "n2", "n3", "n1", "n2", "n3"]);
        assert_eq!(child, ["n2", "n3", "n1", "n2", "n3", "n1"]);
    }

    #[test]
    fn a_cross_node_placement_over_one_node_is_refused() {
        let err = placements(4, &["n1"]).unwrap_err();
        assert!(matches!(err, BenchError::Options(_)), "{err:?}");
    }

    #[test]
    fn batches_cover_every_record_once_round_robin_over_the_partitions() {
        let (records, size, partitions) = (10_500u64, 2_000u32, 4u32);
        let batches: Vec<(u32, u32)> = (0..)
            .map_while(|i| batch(i, records, size, partitions))
            .collect();
        assert_eq!(batches.len(), 6);
        assert_eq!(batches.iter().map(|b| u64::from(b.1)).sum::<u64>(), records);
        assert_eq!(batches[5], (1, 500));
        assert_eq!(
            batches.iter().map(|b| b.0).collect::<Vec<_>>(),
            [0, 1, 2, 3, 0, 1]
        );
        assert_eq!(batch(u64::MAX, records, size, partitions), None);
    }

    fn phase(copy: f64, drain: Option<f64>, produce: f64, backlog: f64) -> PhaseFigures {
        PhaseFigures {
            nodes: 1,
            parent_owners: Vec::new(),
            child_owners: Vec::new(),
            produce_seconds: 1.0,
            produce_records_per_s: produce,
            copy_seconds: 1.0,
            copy_records_per_s: copy,
            held_at_produce_end: 0,
            drain_seconds: 0.0,
            drain_records_per_s: drain,
            copy_bound_by_produce: drain.is_none(),
            slabs: 0,
            records_per_slab: 0.0,
            commit_retries: 0,
            deduplicated_records: 0,
            daemon_cpu_seconds: None,
            bench_cpu_seconds: None,
            cores_busy: None,
            backlog: BacklogFigures {
                release_seconds: 0.5,
                release_spread_seconds: 0.0,
                held_at_first_look: 0,
                seconds: 1.0,
                records_per_s: backlog / 2.0,
                all_running_seconds: 0.5,
                all_running_records_per_s: Some(backlog),
                cores_busy: None,
                daemon_cpu_us_per_record: Some(1_000_000.0 / backlog),
                slabs: 0,
                commit_retries: 0,
            },
            child_records: 0,
            verify_seconds: 0.0,
        }
    }

    #[test]
    fn the_ratios_are_the_cluster_figures_over_the_single_node_figures() {
        let single = phase(200_000.0, Some(400_000.0), 250_000.0, 800_000.0);
        let cluster = phase(50_000.0, Some(100_000.0), 125_000.0, 200_000.0);
        assert_eq!(
            Ratios::of(&single, &cluster),
            Ratios {
                copy: 0.25,
                drain: Some(0.25),
                produce: 0.5,
                backlog: 0.25,
                backlog_cpu_per_record: Some(4.0),
            }
        );
    }

    #[test]
    fn a_drain_ratio_is_given_only_when_both_phases_had_a_lag_to_drain() {
        let single = phase(200_000.0, None, 250_000.0, 800_000.0);
        let cluster = phase(50_000.0, Some(100_000.0), 125_000.0, 200_000.0);
        assert_eq!(Ratios::of(&single, &cluster).drain, None);
        // A zero single-node figure gives 0, not an infinity or a NaN in the JSON.
        let nothing = phase(0.0, None, 0.0, 0.0);
        assert_eq!(Ratios::of(&nothing, &cluster).copy, 0.0);
        assert_eq!(Ratios::of(&nothing, &cluster).backlog, 0.0);
    }

    #[test]
    fn a_copy_at_most_one_slab_per_partition_behind_at_produce_end_kept_pace() {
        assert!(kept_pace(0, 4));
        assert!(kept_pace(4 * SLAB_MAX_RECORDS as u64, 4));
        assert!(!kept_pace(4 * SLAB_MAX_RECORDS as u64 + 1, 4));
    }

    fn looks(rows: &[(u64, &[u64])]) -> Vec<(Duration, Vec<u64>)> {
        rows.iter()
            .map(|(ms, each)| (Duration::from_millis(*ms), each.to_vec()))
            .collect()
    }

    #[test]
    fn the_backlog_rate_is_taken_while_every_cursor_was_copying() {
        let looks = looks(&[
            (0, &[0, 0]),
            (100, &[50, 0]),
            (200, &[150, 20]),
            (700, &[650, 520]),
            (800, &[700, 620]),
            (900, &[700, 700]),
        ]);
        // From 200 ms (both copying) to 800 ms (partition 0 complete): 1,150 records in 0.6 s.
        let (rate, seconds) = all_running_rate(&looks, &[700, 700]).unwrap();
        assert!((seconds - 0.6).abs() < 1e-9, "{seconds}");
        assert!((rate - 1150.0 / 0.6).abs() < 1e-6, "{rate}");
        assert!((release_spread(&looks) - 0.1).abs() < 1e-9);
        // A partition with nothing to copy is not waited for.
        let one = all_running_rate(&looks, &[700, 0]).unwrap();
        assert!((one.1 - 0.7).abs() < 1e-9, "{one:?}");
    }

    #[test]
    fn no_backlog_rate_is_given_when_one_cursor_finished_before_another_started() {
        let looks = looks(&[(0, &[0, 0]), (100, &[700, 0]), (200, &[700, 700])]);
        assert_eq!(all_running_rate(&looks, &[700, 700]), None);
    }

    #[test]
    fn latency_percentiles_are_taken_by_nearest_rank() {
        let samples: Vec<Duration> = (1..=200).rev().map(Duration::from_micros).collect();
        let latency = Latency::of(&samples);
        assert_eq!(latency.reads, 200);
        assert_eq!(latency.p50_us, 100.0);
        assert_eq!(latency.p99_us, 198.0);
        assert_eq!(latency.max_us, 200.0);
        assert!((latency.mean_us - 100.5).abs() < 1e-9);
        assert_eq!(Latency::of(&[]).p99_us, 0.0);
    }

    #[test]
    fn counters_are_summed_over_every_series_of_the_metric_and_child_only() {
        let text = "# HELP narad_fanout_slabs Slabs.\n\
                    # TYPE narad_fanout_slabs counter\n\
                    narad_fanout_slabs_total{parent=\"a\",child=\"b\",partition=\"0\"} 12\n\
                    narad_fanout_slabs_total{parent=\"a\",child=\"b\",partition=\"1\"} 30\n\
                    narad_fanout_slabs_total{parent=\"a\",child=\"c\",partition=\"1\"} 5\n\
                    narad_fanout_slabs_total{parent=\"a\",child=\"bb\",partition=\"1\"} 7\n\
                    narad_fanout_slabs_totally_else{child=\"b\"} 99\n\
                    narad_fanout_commit_retries_total{child=\"b\"} 2\n";
        assert_eq!(metric_sum(text, "narad_fanout_slabs_total", "b"), 42);
        assert_eq!(metric_sum(text, "narad_fanout_slabs_total", "c"), 5);
        assert_eq!(
            metric_sum(text, "narad_fanout_commit_retries_total", "b"),
            2
        );
        assert_eq!(metric_sum(text, "narad_missing_total", "b"), 0);
    }

    #[test]
    fn options_the_daemon_would_refuse_are_refused_before_anything_starts() {
        let ok = ClusterOptions::new("http://127.0.0.1:2379");
        assert!(ok.validate().is_ok());
        for (what, options) in [
            ("no endpoint", ClusterOptions::new(" , ")),
            (
                "zero records",
                ClusterOptions {
                    records: 0,
                    ..ok.clone()
                },
            ),
            (
                "too many partitions",
                ClusterOptions {
                    partitions: 1025,
                    ..ok.clone()
                },
            ),
            (
                "a batch over the daemon's record limit",
                ClusterOptions {
                    batch_records: MAX_BATCH_RECORDS + 1,
                    ..ok.clone()
                },
            ),
            (
                "a batch over the request limit",
                ClusterOptions {
                    batch_records: 1_000,
                    value_bytes: 100_000,
                    ..ok.clone()
                },
            ),
            (
                "a record over the record limit",
                ClusterOptions {
                    batch_records: 1,
                    value_bytes: MAX_RECORD_BYTES + 1,
                    ..ok.clone()
                },
            ),
            (
                "no producer",
                ClusterOptions {
                    producers: 0,
                    ..ok.clone()
                },
            ),
        ] {
            assert!(
                matches!(options.validate(), Err(BenchError::Options(_))),
                "{what}"
            );
        }
        assert_eq!(
            ClusterOptions::new("http://a:2379, http://b:2379").endpoints(),
            ["http://a:2379", "http://b:2379"]
        );
    }

    #[test]
    fn cluster_names_are_valid_cluster_names() {
        let name = unique_cluster_name();
        assert!(name.len() <= 64, "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{name}"
        );
    }

    #[test]
    fn an_etcd_that_does_not_answer_is_reported_with_how_to_start_one() {
        let err = BenchError::EtcdUnavailable {
            endpoints: "http://127.0.0.1:1".into(),
            reason: "connection refused".into(),
        };
        let text = err.to_string();
        assert!(text.contains("http://127.0.0.1:1"), "{text}");
        assert!(text.contains("etcd --data-dir"), "{text}");
    }
}
