//! The Kafka listener against requests no client sends: each is small, and each once made the
//! daemon spend far more than it was allowed (memory, disk, the budget of other clients). The
//! answer must be bounded by what the request is allowed, whatever it repeats or claims.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use reqwest::Method;
use serde_json::{Value, json};

use super::kafka::{create_topic, exchange, start, start_with};
use crate::e2e::harness::{http_client, send_json};

/// Kafka's INVALID_REQUEST, MESSAGE_TOO_LARGE.
const INVALID_REQUEST: i16 = 42;
const MESSAGE_TOO_LARGE: i16 = 10;

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

/// The high watermark of `topic`/`partition`, read over HTTP.
fn high_watermark(base: &str, topic: &str, partition: u32) -> u64 {
    let (status, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{base}/v1/topics/{topic}/partitions/{partition}/records?offset=0&max=1"),
        None,
    )
    .expect("fetch");
    assert_eq!(status, 200, "{body}");
    body["high_watermark"].as_u64().expect("high_watermark")
}

/// One v2 batch of `count` records whose values are `value_bytes` zeros.
fn batch(count: usize, value_bytes: usize, compression: Compression) -> bytes::Bytes {
    let records: Vec<Record> = (0..count)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder starts a new batch where offset - sequence changes.
            sequence: i as i32,
            timestamp: 0,
            key: None,
            value: Some(bytes::Bytes::from(vec![0u8; value_bytes])),
            headers: Default::default(),
        })
        .collect();
    let mut out = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .expect("batch");
    out.freeze()
}

/// Once, a Fetch naming one partition N times read it N times, and records with empty values
/// counted nothing against `max_bytes`: a 48 KB request took a daemon to 4.1 GB.
#[test]
fn a_fetch_naming_one_partition_many_times_reads_it_once_and_keeps_to_max_bytes() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, FetchResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start(dir.path());
    let base = kafka.daemon.url();
    create_topic(&base, "t", 1);
    for _ in 0..2 {
        let records: Vec<Value> = (0..1000).map(|_| json!({"value": ""})).collect();
        let (status, body) = send_json(
            &http_client(),
            Method::POST,
            &format!("{base}/v1/topics/t/records"),
            Some(&json!({"records": records})),
        )
        .expect("produce");
        assert_eq!(status, 200, "{body}");
    }
    let max_bytes = 16 * 1024;
    let mut partition = FetchPartition::default();
    partition.partition = 0;
    partition.fetch_offset = 0;
    partition.partition_max_bytes = 1024 * 1024;
    let mut topic = FetchTopic::default();
    topic.topic = topic_name("t");
    topic.partitions = vec![partition; 300];
    let mut request = FetchRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.max_wait_ms = 0;
    request.min_bytes = 0;
    request.max_bytes = max_bytes;
    request.topics = vec![topic];
    let mut stream = TcpStream::connect(kafka.kafka).expect("connect");
    let response: FetchResponse = exchange(&mut stream, 1, 4, &request);
    let partitions = &response.responses[0].partitions;
    assert_eq!(partitions.len(), 300, "one answer per entry asked");
    let sizes: Vec<usize> = partitions
        .iter()
        .map(|p| p.records.as_ref().map_or(0, bytes::Bytes::len))
        .collect();
    assert!(sizes[0] > 0, "the first entry is read");
    assert!(
        partitions[1..]
            .iter()
            .all(|p| p.error_code == INVALID_REQUEST),
        "every repeat is refused"
    );
    let total: usize = sizes.iter().sum();
    assert!(
        total <= max_bytes as usize,
        "the answer carries {total} record bytes for a max_bytes of {max_bytes} ({} entries \
         with records)",
        sizes.iter().filter(|&&s| s > 0).count()
    );
}

/// Once, each entry of a Produce decompressed on its own up to `max-request-bytes` and the
/// same partition could be named again and again: a 49 KB request used 1.9 GB and wrote 1 GB.
#[test]
fn a_produce_writes_each_partition_once_and_decompresses_to_max_request_bytes_at_most() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start_with(dir.path(), &["--max-request-bytes", "1048576"]);
    let base = kafka.daemon.url();
    create_topic(&base, "t", 3);
    // 12 records of 64 KiB zeros: 768 KiB once decompressed, a few KiB on the wire.
    let bomb = batch(12, 64 * 1024, Compression::Gzip);
    assert!(bomb.len() < 16 * 1024, "{} bytes compressed", bomb.len());
    let entry = |index: i32, records: bytes::Bytes| {
        let mut data = PartitionProduceData::default();
        data.index = index;
        data.records = Some(records);
        data
    };
    let mut data = TopicProduceData::default();
    data.name = topic_name("t");
    data.partition_data = vec![
        entry(0, bomb.clone()),
        entry(0, bomb.clone()),
        entry(1, bomb.clone()),
        entry(2, batch(1, 10, Compression::None)),
    ];
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 10_000;
    request.topic_data = vec![data];
    let mut stream = TcpStream::connect(kafka.kafka).expect("connect");
    let response: ProduceResponse = exchange(&mut stream, 0, 3, &request);
    let codes: Vec<i16> = response.responses[0]
        .partition_responses
        .iter()
        .map(|p| p.error_code)
        .collect();
    // The repeat is refused; the second bomb finds the request's 1 MiB of decompressed
    // records three quarters spent; an uncompressed batch costs nothing of it.
    assert_eq!(codes, [0, INVALID_REQUEST, MESSAGE_TOO_LARGE, 0]);
    assert_eq!(high_watermark(&base, "t", 0), 12);
    assert_eq!(high_watermark(&base, "t", 1), 0);
    assert_eq!(high_watermark(&base, "t", 2), 1);
}

/// Once, a Metadata naming one topic 5,000 times was answered 5,000 times (1.16 GB for a
/// 1,024-partition topic).
#[test]
fn a_metadata_request_naming_a_topic_many_times_is_answered_once() {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start(dir.path());
    create_topic(&kafka.daemon.url(), "t", 64);
    let mut topic = MetadataRequestTopic::default();
    topic.name = Some(topic_name("t"));
    let mut request = MetadataRequest::default();
    request.topics = Some(vec![topic; 2_000]);
    let mut stream = TcpStream::connect(kafka.kafka).expect("connect");
    let response: MetadataResponse = exchange(&mut stream, 3, 1, &request);
    assert_eq!(response.topics.len(), 1);
    assert_eq!(response.topics[0].partitions.len(), 64);
}

/// Once, a request's whole declared size was taken from `max-buffered-request-bytes` before
/// any of its body arrived: clients that send only a large size held the budget, and every
/// other client waited 30 s per request.
#[test]
fn clients_that_declare_large_requests_and_send_nothing_hold_back_no_other_client() {
    use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start_with(
        dir.path(),
        &[
            "--max-request-bytes",
            "1048576",
            "--max-buffered-request-bytes",
            "2097152",
        ],
    );
    let stalled: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut stream = TcpStream::connect(kafka.kafka).expect("connect");
            stream
                .write_all(&(1024 * 1024u32).to_be_bytes())
                .expect("size prefix");
            stream
        })
        .collect();
    // Let the listener read both prefixes before the honest client arrives.
    std::thread::sleep(Duration::from_millis(300));
    let mut honest = TcpStream::connect(kafka.kafka).expect("connect");
    honest
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let response: ApiVersionsResponse =
        exchange(&mut honest, 18, 0, &ApiVersionsRequest::default());
    assert_eq!(response.error_code, 0);
    drop(stalled);
}

/// Once, a producer could write a `narad.origin` header, and a consumer that drops repeats by
/// it (as kafka.md advises) dropped the genuine copy. Neither produce path takes one now.
#[test]
fn a_producer_cannot_write_a_header_that_states_a_copys_origin() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
    const INVALID_RECORD: i16 = 87;
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start(dir.path());
    let base = kafka.daemon.url();
    create_topic(&base, "t", 1);
    for name in ["narad.origin", "NARAD.Origin", "narad.anything"] {
        let (status, body) = send_json(
            &http_client(),
            Method::POST,
            &format!("{base}/v1/topics/t/records"),
            Some(&json!({"records": [{"value": "v", "headers": [{"name": name, "value": "x"}]}]})),
        )
        .expect("produce");
        assert_eq!(status, 400, "{name}: {body}");
    }
    let forged = {
        let mut headers = kafka_protocol::indexmap::IndexMap::new();
        headers.insert(
            StrBytes::from_static_str("narad.origin"),
            Some(bytes::Bytes::from_static(b"0011223344556677:0:5")),
        );
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: 0,
            timestamp: 0,
            key: None,
            value: Some(bytes::Bytes::from_static(b"forged")),
            headers,
        };
        let mut out = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut out,
            &[record],
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .expect("batch");
        out.freeze()
    };
    let mut partition = PartitionProduceData::default();
    partition.index = 0;
    partition.records = Some(forged);
    let mut data = TopicProduceData::default();
    data.name = topic_name("t");
    data.partition_data = vec![partition];
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 10_000;
    request.topic_data = vec![data];
    let mut stream = TcpStream::connect(kafka.kafka).expect("connect");
    let response: ProduceResponse = exchange(&mut stream, 0, 3, &request);
    assert_eq!(
        response.responses[0].partition_responses[0].error_code,
        INVALID_RECORD
    );
    // A header that only looks alike is a producer's to write.
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/t/records"),
        Some(
            &json!({"records": [{"value": "v", "headers": [{"name": "naradish", "value": "x"}]}]}),
        ),
    )
    .expect("produce");
    assert_eq!(status, 200, "{body}");
    assert_eq!(high_watermark(&base, "t", 0), 1);
}

/// Once, one Fetch naming every partition of a large topic opened every log (two descriptors
/// each) and ran the daemon out of descriptors: produce and describe of other partitions
/// answered 500 "Too many open files" until idle logs closed, minutes later.
#[test]
fn reading_a_thousand_partitions_at_once_leaves_descriptors_for_everyone_else() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, FetchResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let kafka_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let listen = kafka_addr.to_string();
    let daemon = crate::e2e::harness::Daemon::start_under(
        &dir.path().join("data"),
        &["prlimit", "--nofile=1536:1536"],
        &["--kafka-listen", &listen],
    );
    let base = daemon.url();
    create_topic(&base, "wide", 1000);
    create_topic(&base, "other", 1);
    // One record in every partition (keyless records go round-robin), so each log has files.
    let records: Vec<Value> = (0..1000)
        .map(|i| json!({"value": format!("v{i}")}))
        .collect();
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/wide/records"),
        Some(&json!({"records": records})),
    )
    .expect("produce");
    assert_eq!(status, 200, "{body}");
    let mut topic = FetchTopic::default();
    topic.topic = topic_name("wide");
    topic.partitions = (0..1000)
        .map(|p| {
            let mut partition = FetchPartition::default();
            partition.partition = p;
            partition.fetch_offset = 0;
            partition.partition_max_bytes = 1024;
            partition
        })
        .collect();
    let mut request = FetchRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.max_wait_ms = 0;
    request.min_bytes = 0;
    request.max_bytes = 1024 * 1024;
    request.topics = vec![topic];
    let mut stream = TcpStream::connect(kafka_addr).expect("connect");
    let response: FetchResponse = exchange(&mut stream, 1, 4, &request);
    let failed: Vec<i32> = response.responses[0]
        .partitions
        .iter()
        .filter(|p| p.error_code != 0)
        .map(|p| p.partition_index)
        .collect();
    assert!(
        failed.is_empty(),
        "partitions answered with an error: {failed:?}"
    );
    for (topic, partition) in [("other", 0), ("wide", 999), ("wide", 0)] {
        let (status, body) = send_json(
            &http_client(),
            Method::POST,
            &format!("{base}/v1/topics/{topic}/records"),
            Some(&json!({"records": [{"value": "after the wide fetch", "partition": partition}]})),
        )
        .expect("produce");
        assert_eq!(status, 200, "{topic}/{partition}: {body}");
    }
}

/// Once, an InitProducerId naming another producer's id and epoch took that id over and
/// dropped its sequence state, so the real producer's next retry was written twice.
#[test]
fn naming_another_producers_id_gets_a_new_id_and_leaves_its_retries_deduplicated() {
    use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start(dir.path());
    let base = kafka.daemon.url();
    create_topic(&base, "t", 1);
    let mut stream = TcpStream::connect(kafka.kafka).expect("connect");
    let real: InitProducerIdResponse =
        exchange(&mut stream, 22, 0, &InitProducerIdRequest::default());
    let producer = (real.producer_id.0, real.producer_epoch);
    assert_eq!(
        super::kafka::produce_batch(&mut stream, "t", producer, 0, &["a"]),
        (0, 0)
    );
    let mut takeover = InitProducerIdRequest::default();
    takeover.producer_id = ProducerId(producer.0);
    takeover.producer_epoch = producer.1;
    let mut other = TcpStream::connect(kafka.kafka).expect("connect");
    let answer: InitProducerIdResponse = exchange(&mut other, 22, 4, &takeover);
    assert_eq!(answer.error_code, 0);
    assert_ne!(
        answer.producer_id.0, producer.0,
        "another producer's id was handed out"
    );
    // The real producer's retry is still known: answered with its first offsets, not written.
    assert_eq!(
        super::kafka::produce_batch(&mut stream, "t", producer, 0, &["a"]),
        (0, 0)
    );
    assert_eq!(high_watermark(&base, "t", 0), 1);
}
