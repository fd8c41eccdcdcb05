//! `narad bench requests`: what one Kafka Produce request costs the daemon, apart from the
//! records it carries.
//!
//! One real `narad serve` (a child process of this executable, embedded metastore, its Kafka
//! listener on a free loopback port) takes the same records two ways, in alternating rounds
//! of one run:
//!
//! - **small**: one record per Produce request, as an idempotent producer paced well below
//!   its batch size sends them;
//! - **large**: `--large-records` records per request, as kcat or a busy producer does.
//!
//! Each connection keeps one request in flight and writes to its own partition, so every
//! request is one append + `fdatasync` + verify. The daemon's CPU is read from
//! `/proc/<pid>/stat` before and after each variant, user space and kernel apart: the kernel
//! share is mostly the sync and the read-back a commit needs; the user-space share per small
//! request is the fixed cost this bench exists to watch (goal: under
//! [`USER_MS_PER_REQUEST_GOAL`] ms). Every answer is checked, and at the end the topic must
//! hold exactly the records sent.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable as _, Encodable as _, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use narad_host::api::types::{CreateTopicRequest, TopicDescription, TopicInfo};
use serde::Serialize;

use super::daemon::{Node, ProcessCpu, call, free_port, http_client, json_body, process_cpu};
use super::progress::Progress;
use super::sys::{self, FileSystemInfo};
use super::workdir::WorkDir;
use super::{BenchError, per_second};

/// User-space CPU of the daemon per small Produce request that the issue asks for, in ms.
pub const USER_MS_PER_REQUEST_GOAL: f64 = 0.05;

/// Default records per variant and round.
pub const DEFAULT_RECORDS: u64 = 40_000;
/// Default records per large request.
pub const DEFAULT_LARGE_RECORDS: u32 = 100;
/// Default value bytes per record.
pub const DEFAULT_VALUE_BYTES: usize = 100;
/// Default connections, each with one request in flight and its own partition.
pub const DEFAULT_CONNECTIONS: u32 = 4;
/// Default rounds.
pub const DEFAULT_ROUNDS: u32 = 2;

/// The topic the bench writes.
const TOPIC: &str = "bench-requests";
/// Produce version sent: 7, the last before flexible versions, which every client speaks.
const PRODUCE_VERSION: i16 = 7;
/// Longest wait for one answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest answer the bench reads (a Produce answer is a few dozen bytes).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What to run.
#[derive(Clone, Debug)]
pub struct RequestsOptions {
    /// Records per variant and round.
    pub records: u64,
    /// Records per large request.
    pub large_records: u32,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// Connections (and partitions), each with one request in flight.
    pub connections: u32,
    /// Rounds; each runs both variants, in swapped order every other round.
    pub rounds: u32,
    /// The `narad` executable whose `serve` is measured (default: this one), to compare two
    /// builds with the same client.
    pub serve_binary: Option<PathBuf>,
    /// Where to create the bench directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Show progress on a terminal.
    pub progress: bool,
}

impl Default for RequestsOptions {
    fn default() -> RequestsOptions {
        RequestsOptions {
            records: DEFAULT_RECORDS,
            large_records: DEFAULT_LARGE_RECORDS,
            value_bytes: DEFAULT_VALUE_BYTES,
            connections: DEFAULT_CONNECTIONS,
            rounds: DEFAULT_ROUNDS,
            serve_binary: None,
            dir: None,
            progress: false,
        }
    }
}

/// One variant's figures over every round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VariantFigures {
    /// Records per request.
    pub records_per_request: u32,
    /// Requests sent (over every round).
    pub requests: u64,
    /// Records sent.
    pub records: u64,
    /// Wall time, in seconds.
    pub seconds: f64,
    /// Requests answered per second.
    pub requests_per_s: f64,
    /// Records acknowledged per second.
    pub records_per_s: f64,
    /// The daemon's user-space CPU, in seconds.
    pub user_seconds: f64,
    /// The daemon's kernel CPU, in seconds.
    pub system_seconds: f64,
    /// User-space CPU per request, in ms.
    pub user_ms_per_request: f64,
    /// Kernel CPU per request, in ms.
    pub system_ms_per_request: f64,
    /// User-space CPU per record, in microseconds.
    pub user_us_per_record: f64,
    /// Kernel CPU per record, in microseconds.
    pub system_us_per_record: f64,
}

impl VariantFigures {
    fn add(&mut self, requests: u64, records: u64, wall: Duration, cpu: ProcessCpu) {
        self.requests += requests;
        self.records += records;
        self.seconds += wall.as_secs_f64();
        self.user_seconds += cpu.user.as_secs_f64();
        self.system_seconds += cpu.system.as_secs_f64();
        let per = |total: f64, count: u64, unit: f64| {
            if count == 0 {
                0.0
            } else {
                total * unit / count as f64
            }
        };
        self.requests_per_s = per_second(self.requests as f64, self.seconds);
        self.records_per_s = per_second(self.records as f64, self.seconds);
        self.user_ms_per_request = per(self.user_seconds, self.requests, 1e3);
        self.system_ms_per_request = per(self.system_seconds, self.requests, 1e3);
        self.user_us_per_record = per(self.user_seconds, self.records, 1e6);
        self.system_us_per_record = per(self.system_seconds, self.records, 1e6);
    }
}

/// What `narad bench requests` measured.
#[derive(Clone, Debug, Serialize)]
pub struct RequestsReport {
    /// `"requests"`.
    pub bench: &'static str,
    /// The bench directory (removed afterwards).
    pub dir: PathBuf,
    /// The file system it ran on.
    pub file_system: Option<FileSystemInfo>,
    /// Cores this machine offers.
    pub cores: usize,
    /// Records per variant and round.
    pub records: u64,
    /// Value bytes per record.
    pub value_bytes: usize,
    /// Connections (and partitions).
    pub connections: u32,
    /// Rounds.
    pub rounds: u32,
    /// The `narad` executable measured, when not the bench's own.
    pub serve_binary: Option<PathBuf>,
    /// One record per request.
    pub small: VariantFigures,
    /// `large_records` per request.
    pub large: VariantFigures,
    /// Daemon CPU (user + kernel) per record, small over large: what the fixed cost of a
    /// request multiplies a record's cost by.
    pub cpu_per_record_ratio: f64,
    /// User-space CPU per record, small over large.
    pub user_per_record_ratio: f64,
    /// [`USER_MS_PER_REQUEST_GOAL`].
    pub goal_user_ms_per_request: f64,
    /// Load average (1, 5, 15 min) before the run.
    pub load_before: Option<[f64; 3]>,
    /// Load average after it.
    pub load_after: Option<[f64; 3]>,
}

/// Runs the bench.
pub async fn run_requests(options: RequestsOptions) -> Result<RequestsReport, BenchError> {
    let RequestsOptions {
        records,
        large_records,
        value_bytes,
        connections,
        rounds,
        ..
    } = options;
    if records == 0 || large_records == 0 || connections == 0 || rounds == 0 {
        return Err(BenchError::Options(
            "records, large records, connections and rounds must all be at least 1".into(),
        ));
    }
    if records % u64::from(connections) != 0
        || (records / u64::from(connections)) % u64::from(large_records) != 0
    {
        return Err(BenchError::Options(format!(
            "--records ({records}) must split evenly into {connections} connections of whole \
             large requests of {large_records} records"
        )));
    }
    let load_before = sys::load_average();
    let work = WorkDir::create(options.dir.as_deref())?;
    let mut progress = Progress::new(options.progress);
    progress.step(&format!(
        "bench requests in {} on {}",
        work.path().display(),
        work.describe_file_system()
    ));
    let http = http_client()?;
    let kafka: SocketAddr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let data_dir = work.path().join("node");
    let listen = ["--kafka-listen".to_owned(), kafka.to_string()];
    let mut node = match &options.serve_binary {
        Some(binary) => Node::start_binary(&http, binary, "requests", &data_dir, &listen).await?,
        None => Node::start(&http, "requests", &data_dir, &listen).await?,
    };
    let pid = node
        .pid()
        .ok_or_else(|| node.failed("no process id".into()))?;
    let created: TopicInfo = call(
        &http,
        reqwest::Method::POST,
        &format!("{}/v1/topics", node.url),
        Some(json_body(&CreateTopicRequest {
            name: TOPIC.to_owned(),
            partitions: connections,
            retention_ms: None,
            retention_bytes: None,
            placement: None,
        })?),
    )
    .await?;
    debug_assert_eq!(created.partitions, connections);

    let mut small = VariantFigures {
        records_per_request: 1,
        ..VariantFigures::default()
    };
    let mut large = VariantFigures {
        records_per_request: large_records,
        ..VariantFigures::default()
    };
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [1, large_records]
        } else {
            [large_records, 1]
        };
        for per_request in order {
            progress.update(|| {
                format!(
                    "round {}/{rounds}: {records} records, {per_request} per request",
                    round + 1
                )
            });
            let before = process_cpu(pid).ok_or_else(|| node.failed("no /proc stat".into()))?;
            let started = Instant::now();
            let requests = send_all(kafka, connections, records, per_request, value_bytes)
                .await
                .map_err(|e| match e {
                    BenchError::Kafka { context, reason } => {
                        node.failed(format!("{context}: {reason}"))
                    }
                    other => other,
                })?;
            let wall = started.elapsed();
            let after = process_cpu(pid).ok_or_else(|| node.failed("no /proc stat".into()))?;
            let figures = if per_request == 1 {
                &mut small
            } else {
                &mut large
            };
            figures.add(requests, records, wall, after.since(before));
        }
    }
    progress.finish();

    let description: TopicDescription = call(
        &http,
        reqwest::Method::GET,
        &format!("{}/v1/topics/{TOPIC}", node.url),
        None,
    )
    .await?;
    let held: u64 = description
        .partition_stats
        .iter()
        .map(|p| p.high_watermark.unwrap_or(0))
        .sum();
    let sent = small.records + large.records;
    if held != sent {
        return Err(node.failed(format!(
            "the topic holds {held} records after {sent} were acknowledged"
        )));
    }
    node.stop().await;

    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Ok(RequestsReport {
        bench: "requests",
        dir: work.path_buf(),
        file_system: sys::file_system_of(work.path()),
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        records,
        value_bytes,
        connections,
        rounds,
        serve_binary: options.serve_binary.clone(),
        cpu_per_record_ratio: ratio(
            small.user_us_per_record + small.system_us_per_record,
            large.user_us_per_record + large.system_us_per_record,
        ),
        user_per_record_ratio: ratio(small.user_us_per_record, large.user_us_per_record),
        small,
        large,
        goal_user_ms_per_request: USER_MS_PER_REQUEST_GOAL,
        load_before,
        load_after: sys::load_average(),
    })
}

/// Sends `records` records over `connections` connections in requests of `per_request`,
/// each connection to its own partition with one request in flight; returns the number of
/// requests, every one acknowledged without error.
async fn send_all(
    kafka: SocketAddr,
    connections: u32,
    records: u64,
    per_request: u32,
    value_bytes: usize,
) -> Result<u64, BenchError> {
    let per_connection = records / u64::from(connections);
    let requests_each = per_connection / u64::from(per_request);
    let mut workers = Vec::new();
    for partition in 0..connections {
        let frame = produce_frame(partition, per_request, value_bytes)?;
        workers.push(tokio::task::spawn_blocking(move || {
            send_on_one_connection(kafka, partition, &frame, requests_each)
        }));
    }
    for worker in workers {
        worker.await.map_err(|e| BenchError::WorkerPanicked {
            message: e.to_string(),
        })??;
    }
    Ok(requests_each * u64::from(connections))
}

/// One connection's requests, one at a time; each answer must be an acknowledgement.
fn send_on_one_connection(
    kafka: SocketAddr,
    partition: u32,
    frame: &[u8],
    requests: u64,
) -> Result<(), BenchError> {
    let failed = |reason: String| BenchError::Kafka {
        context: format!("producing to partition {partition} of {TOPIC} at {kafka}"),
        reason,
    };
    let mut stream = TcpStream::connect(kafka).map_err(|e| failed(format!("connect: {e}")))?;
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .and_then(|()| stream.set_nodelay(true))
        .map_err(|e| failed(format!("socket options: {e}")))?;
    let mut answer = Vec::new();
    for _ in 0..requests {
        stream
            .write_all(frame)
            .map_err(|e| failed(format!("send: {e}")))?;
        let mut size = [0u8; 4];
        stream
            .read_exact(&mut size)
            .map_err(|e| failed(format!("answer size: {e}")))?;
        let size = u32::from_be_bytes(size) as usize;
        if size > MAX_ANSWER_BYTES {
            return Err(failed(format!("an answer of {size} bytes")));
        }
        answer.resize(size, 0);
        stream
            .read_exact(&mut answer)
            .map_err(|e| failed(format!("answer: {e}")))?;
        check_answer(Bytes::copy_from_slice(&answer)).map_err(failed)?;
    }
    Ok(())
}

/// The answer acknowledges the request's one partition.
fn check_answer(mut answer: Bytes) -> Result<(), String> {
    ResponseHeader::decode(
        &mut answer,
        ApiKey::Produce.response_header_version(PRODUCE_VERSION),
    )
    .map_err(|e| format!("answer header: {e}"))?;
    let response = ProduceResponse::decode(&mut answer, PRODUCE_VERSION)
        .map_err(|e| format!("answer: {e}"))?;
    let codes: Vec<i16> = response
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code))
        .collect();
    if codes != [0] {
        return Err(format!("error codes {codes:?} (0 is success)"));
    }
    Ok(())
}

/// A whole Produce request (size prefix included) of one batch of `count` keyless records
/// of `value_bytes` bytes each to `partition`, `acks = -1`.
fn produce_frame(partition: u32, count: u32, value_bytes: usize) -> Result<Vec<u8>, BenchError> {
    let failed = |reason: String| BenchError::Kafka {
        context: "encoding a Produce request".into(),
        reason,
    };
    let value = Bytes::from(vec![b'v'; value_bytes]);
    let records: Vec<Record> = (0..count)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i64::from(i),
            // One batch: offset minus sequence stays the same.
            sequence: i32::try_from(i).unwrap_or(i32::MAX),
            timestamp: 0,
            key: None,
            value: Some(value.clone()),
            headers: Default::default(),
        })
        .collect();
    let mut batch = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| failed(e.to_string()))?;
    let mut data = PartitionProduceData::default();
    data.index = i32::try_from(partition).map_err(|e| failed(e.to_string()))?;
    data.records = Some(batch.freeze());
    let mut topic = TopicProduceData::default();
    topic.name = TopicName(StrBytes::from_static_str(TOPIC));
    topic.partition_data = vec![data];
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 30_000;
    request.topic_data = vec![topic];
    let mut header = RequestHeader::default();
    header.request_api_key = ApiKey::Produce as i16;
    header.request_api_version = PRODUCE_VERSION;
    header.correlation_id = 1;
    header.client_id = Some(StrBytes::from_static_str("narad-bench"));
    let mut body = BytesMut::new();
    header
        .encode(
            &mut body,
            ApiKey::Produce.request_header_version(PRODUCE_VERSION),
        )
        .map_err(|e| failed(e.to_string()))?;
    request
        .encode(&mut body, PRODUCE_VERSION)
        .map_err(|e| failed(e.to_string()))?;
    let size = u32::try_from(body.len()).map_err(|e| failed(e.to_string()))?;
    let mut frame = size.to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    Ok(frame)
}

impl RequestsReport {
    /// The report as text.
    pub fn to_text(&self) -> String {
        let load = sys::load_text;
        let fs = sys::file_system_text(self.file_system.as_ref());
        let variant = |name: &str, v: &VariantFigures| {
            format!(
                "{name} ({} per request): {} requests in {:.2} s, {:.0} requests/s, {:.0} \
                 records/s; daemon CPU per request {:.3} ms user + {:.3} ms kernel, per \
                 record {:.2} us user + {:.2} us kernel\n",
                v.records_per_request,
                v.requests,
                v.seconds,
                v.requests_per_s,
                v.records_per_s,
                v.user_ms_per_request,
                v.system_ms_per_request,
                v.user_us_per_record,
                v.system_us_per_record,
            )
        };
        format!(
            "narad bench requests{}: {} rounds on {fs}, {} cores; {} records of {} bytes per \
             variant and round over {} connections\n{}{}small over large, CPU per record: \
             {:.1}x (user space {:.1}x); user CPU per small request {:.3} ms (goal < {:.2} \
             ms)\nload before {}, after {}\n",
            self.serve_binary
                .as_ref()
                .map_or_else(String::new, |b| format!(" (serve of {})", b.display())),
            self.rounds,
            self.cores,
            self.records,
            self.value_bytes,
            self.connections,
            variant("small", &self.small),
            variant("large", &self.large),
            self.cpu_per_record_ratio,
            self.user_per_record_ratio,
            self.small.user_ms_per_request,
            self.goal_user_ms_per_request,
            load(self.load_before),
            load(self.load_after),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_one_produce_request_of_the_asked_records_to_the_asked_partition() {
        let frame = produce_frame(3, 5, 7).unwrap();
        let size = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(size, frame.len() - 4);
        let mut body = Bytes::copy_from_slice(&frame[4..]);
        let header = RequestHeader::decode(
            &mut body,
            ApiKey::Produce.request_header_version(PRODUCE_VERSION),
        )
        .unwrap();
        assert_eq!(header.request_api_version, PRODUCE_VERSION);
        let request = ProduceRequest::decode(&mut body, PRODUCE_VERSION).unwrap();
        let data = &request.topic_data[0].partition_data[0];
        assert_eq!(data.index, 3);
        let mut records = data.records.clone().unwrap();
        let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut records).unwrap();
        assert_eq!(sets.len(), 1, "one batch");
        assert_eq!(sets[0].records.len(), 5);
        assert!(
            sets[0]
                .records
                .iter()
                .all(|r| r.value.as_ref().unwrap().len() == 7)
        );
    }

    #[test]
    fn figures_add_up_over_rounds_per_request_and_per_record() {
        let mut figures = VariantFigures::default();
        let cpu = ProcessCpu {
            user: Duration::from_millis(100),
            system: Duration::from_millis(300),
        };
        figures.add(1_000, 2_000, Duration::from_secs(1), cpu);
        figures.add(1_000, 2_000, Duration::from_secs(1), cpu);
        assert_eq!(figures.requests, 2_000);
        assert!((figures.user_ms_per_request - 0.1).abs() < 1e-9);
        assert!((figures.system_ms_per_request - 0.3).abs() < 1e-9);
        assert!((figures.user_us_per_record - 50.0).abs() < 1e-9);
        assert!((figures.requests_per_s - 1_000.0).abs() < 1e-9);
    }
}
