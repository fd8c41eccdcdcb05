//! The Kafka listener (`--kafka-listen`) driven by real Kafka clients: kafka-python with its
//! default (idempotent) producer and a consumer on assigned partitions, kcat producing keyed
//! records and consuming a fanned-out child, and raw sockets sending what no client should.
//!
//! The clients are the ones `scripts/test-all` installs (kcat from apt, kafka-python 3 from
//! pip); a test says so when one is missing.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, send_json};

/// How long a fan-out child may take to copy a few dozen records. Generous for a busy
/// machine; a healthy daemon needs milliseconds.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// A daemon with its Kafka listener on a free loopback port.
pub(super) struct KafkaDaemon {
    pub(super) daemon: Daemon,
    pub(super) kafka: SocketAddr,
}

pub(super) fn start(dir: &Path) -> KafkaDaemon {
    start_with(dir, &[])
}

/// [`start`] with `extra` daemon arguments.
pub(super) fn start_with(dir: &Path, extra: &[&str]) -> KafkaDaemon {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let kafka = SocketAddr::from(([127, 0, 0, 1], port));
    let listen = kafka.to_string();
    let mut args = vec!["--kafka-listen", listen.as_str()];
    args.extend_from_slice(extra);
    let daemon = Daemon::start_with(&dir.join("data"), &args);
    KafkaDaemon { daemon, kafka }
}

fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

pub(super) fn create_topic(base: &str, name: &str, partitions: u32) {
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": name, "partitions": partitions})),
    )
    .expect("create topic");
    ok(status, &body, "create topic");
}

pub(crate) fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/all/e2e/kafka")
        .join(name)
}

/// Runs a client to completion with a deadline, returning its stdout.
pub(crate) fn run(command: Command, stdin: &[u8], what: &str) -> String {
    let (status, stdout, stderr) = run_output(command, stdin, what);
    assert!(status.success(), "{what} failed: {status}\n{stderr}");
    stdout
}

/// Runs `command` with `stdin`, for at most 60 s, and returns how it ended, its stdout and
/// its stderr, whether it succeeded or not.
pub(crate) fn run_output(
    mut command: Command,
    stdin: &[u8],
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{what} could not start ({e}); scripts/test-all installs kcat and kafka-python")
        });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    // Drained while the child runs, so a large output cannot fill the pipe and stall it.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    (
        status,
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn hex_bytes(value: &Value) -> Vec<u8> {
    let text = value.as_str().expect("hex string");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// `narad_kafka_requests_total{api="..."}` from `/metrics`.
fn requests_counted(base: &str, api: &str) -> u64 {
    let text = http_client()
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    let prefix = format!("narad_kafka_requests_total{{api=\"{api}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

#[test]
fn kafka_python_produces_idempotently_and_reads_back_byte_for_byte_where_murmur2_puts_keys() {
    const PARTITIONS: u32 = 4;
    const RECORDS: usize = 60;
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path());
    let base = node.daemon.url();
    create_topic(&base, "orders", PARTITIONS);

    let mut command = Command::new("python3");
    command.arg(script("python_round_trip.py")).args([
        node.kafka.to_string(),
        "orders".into(),
        PARTITIONS.to_string(),
        RECORDS.to_string(),
    ]);
    let out = run(command, b"", "python3 python_round_trip.py");
    let report: Value = serde_json::from_str(&out).expect("the script's JSON");

    assert!(
        report["producer_id"].as_i64().unwrap_or(-1) >= 0,
        "the default producer is idempotent and got a producer id: {}",
        report["producer_id"]
    );
    assert!(requests_counted(&base, "InitProducerId") >= 1);

    let produced = report["produced"].as_array().expect("produced");
    let consumed = report["consumed"].as_array().expect("consumed");
    assert_eq!(produced.len(), RECORDS);
    let position = |r: &Value| (r["partition"].as_u64(), r["offset"].as_u64());
    let mut by_position: BTreeMap<_, &Value> = produced.iter().map(|r| (position(r), r)).collect();
    assert_eq!(by_position.len(), RECORDS, "every send got its own offset");
    for c in consumed {
        let p = by_position
            .remove(&position(c))
            .unwrap_or_else(|| panic!("consumed a record nobody produced: {c}"));
        assert_eq!(c["key"], p["key"], "key at {:?}", position(c));
        assert_eq!(c["value"], p["value"], "value at {:?}", position(c));
        assert_eq!(c["headers"], p["headers"], "headers at {:?}", position(c));
        assert_eq!(c["timestamp_type"], 1, "timestamps are log-append times");
    }
    assert!(by_position.is_empty(), "not consumed: {by_position:?}");

    // Placement: Kafka's murmur2 partition of the key; per key, production order.
    let mut per_key: BTreeMap<Vec<u8>, Vec<(u64, Value)>> = BTreeMap::new();
    for p in produced {
        let key = hex_bytes(&p["key"]);
        assert_eq!(
            p["partition"].as_u64().map(|n| n as u32),
            narad_abi::partition_for_key(&key, PARTITIONS),
            "partition of key {}",
            String::from_utf8_lossy(&key)
        );
        per_key
            .entry(key)
            .or_default()
            .push((p["offset"].as_u64().expect("offset"), p["value"].clone()));
    }
    for (key, sends) in &per_key {
        assert!(
            sends.windows(2).all(|w| w[0].0 < w[1].0),
            "key {} kept its order",
            String::from_utf8_lossy(key)
        );
    }

    // Tombstones stay null and empty values stay empty, for Kafka and HTTP readers alike.
    let nulls = consumed.iter().filter(|c| c["value"].is_null()).count();
    let empties = consumed.iter().filter(|c| c["value"] == "").count();
    assert_eq!(
        (nulls, empties),
        (RECORDS / 10, RECORDS / 10),
        "{consumed:?}"
    );

    // Stored exactly once each (no retry written twice), with the commit time the consumer saw.
    let client = http_client();
    let mut stored = 0;
    for partition in 0..PARTITIONS {
        for record in fetch_all(&client, &base, "orders", partition) {
            stored += 1;
            let offset = record["offset"].as_u64();
            let seen = consumed
                .iter()
                .find(|c| {
                    c["partition"].as_u64() == Some(u64::from(partition))
                        && c["offset"].as_u64() == offset
                })
                .expect("stored record was consumed");
            assert_eq!(seen["timestamp"], record["committed_at"]);
            assert_eq!(
                seen["value"].is_null(),
                record.get("value").is_some_and(Value::is_null),
                "{record} read over HTTP"
            );
        }
    }
    assert_eq!(stored, RECORDS);
}

/// Parses kcat's `%h` output (`name=value,name=value`) into pairs.
fn kcat_headers(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            let (name, value) = h.split_once('=').expect("name=value");
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

#[test]
fn kcat_produces_keyed_compressed_records_and_consumes_every_child_partition_with_origins() {
    const RECORDS: usize = 40;
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path());
    let base = node.daemon.url();
    let client = http_client();
    create_topic(&base, "events", 2);
    let (status, body) = send_json(
        &client,
        Method::PUT,
        &format!("{base}/v1/topics/events/children/copy"),
        Some(&json!({"partitions": 3})),
    )
    .expect("attach");
    ok(status, &body, "attach");

    let broker = node.kafka.to_string();
    // A quarter of the records under each codec: stored decompressed, read back alike.
    for (chunk, codec) in ["gzip", "snappy", "lz4", "zstd"].into_iter().enumerate() {
        let lines: String = (chunk * RECORDS / 4..(chunk + 1) * RECORDS / 4)
            .map(|i| format!("user-{}:event-{i}\n", i % 7))
            .collect();
        // librdkafka's own default partitioner hashes keys with CRC32; murmur2_random is the
        // Java client's (and narad's) placement.
        let mut produce = Command::new("kcat");
        produce.args([
            "-b",
            &broker,
            "-t",
            "events",
            "-P",
            "-K:",
            "-z",
            codec,
            "-X",
            "partitioner=murmur2_random",
        ]);
        run(produce, lines.as_bytes(), "kcat -P");
    }

    // kcat placed every key where murmur2 says.
    let mut parent_total = 0;
    for partition in 0..2 {
        for record in fetch_all(&client, &base, "events", partition) {
            parent_total += 1;
            let key = record["key"].as_str().expect("key");
            assert_eq!(
                narad_abi::partition_for_key(key.as_bytes(), 2),
                Some(partition),
                "{key}"
            );
        }
    }
    assert_eq!(parent_total, RECORDS);

    // Wait for the child to hold every record, then read it with kcat from the beginning.
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    let http_child: Vec<Vec<Value>> = loop {
        let parts: Vec<Vec<Value>> = (0..3)
            .map(|p| fetch_all(&client, &base, "copy", p))
            .collect();
        if parts.iter().map(Vec::len).sum::<usize>() >= RECORDS {
            break parts;
        }
        assert!(Instant::now() < deadline, "the child did not catch up");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut seen: Vec<(String, String)> = Vec::new();
    for (partition, http_records) in http_child.iter().enumerate() {
        let mut consume = Command::new("kcat");
        consume.args([
            "-b",
            &broker,
            "-t",
            "copy",
            "-p",
            &partition.to_string(),
            "-C",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%o\t%k\t%s\t%h\n",
        ]);
        let out = run(consume, b"", "kcat -C");
        let rows: Vec<&str> = out.lines().collect();
        assert_eq!(
            rows.len(),
            http_records.len(),
            "child partition {partition}"
        );
        for (row, record) in rows.iter().zip(http_records) {
            let fields: Vec<&str> = row.split('\t').collect();
            let [offset, key, value, headers] = fields[..] else {
                panic!("kcat row {row:?}");
            };
            assert_eq!(
                Some(offset.parse::<u64>().expect("offset")),
                record["offset"].as_u64()
            );
            assert_eq!(Some(key), record["key"].as_str());
            assert_eq!(Some(value), record["value"].as_str());
            let origin = &record["origin"];
            let expected = format!(
                "{}:{}:{}",
                origin["epoch"].as_str().expect("epoch"),
                origin["partition"],
                origin["offset"]
            );
            assert_eq!(
                kcat_headers(headers),
                [("narad.origin".to_owned(), expected)],
                "child partition {partition}, {row}"
            );
            seen.push((key.to_owned(), value.to_owned()));
        }
    }
    seen.sort();
    let mut expected: Vec<(String, String)> = (0..RECORDS)
        .map(|i| (format!("user-{}", i % 7), format!("event-{i}")))
        .collect();
    expected.sort();
    assert_eq!(seen, expected, "every record, once, through the child");
}

/// Sends `bytes` on a fresh connection and returns what came back, and whether the daemon
/// closed the connection (`false`: still open after a second without a byte).
pub(crate) fn send_raw(addr: SocketAddr, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    stream.write_all(bytes).expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

/// A request frame: size, API key, version, correlation id, null client id, body.
pub(crate) fn frame(api_key: i16, version: i16, body: &[u8]) -> Vec<u8> {
    let mut inner = Vec::new();
    inner.extend_from_slice(&api_key.to_be_bytes());
    inner.extend_from_slice(&version.to_be_bytes());
    inner.extend_from_slice(&7i32.to_be_bytes());
    inner.extend_from_slice(&(-1i16).to_be_bytes());
    inner.extend_from_slice(body);
    let mut out = (inner.len() as u32).to_be_bytes().to_vec();
    out.extend(inner);
    out
}

/// librdkafka (kcat, confluent-kafka) sends three bytes after the last field of a Metadata
/// request for every topic (`AdminClient.list_topics()`); a Kafka broker ignores them, and so
/// must narad, or every librdkafka client that lists topics loses its connection.
#[test]
fn a_metadata_request_with_bytes_after_its_last_field_is_answered_as_kafka_answers_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path());
    create_topic(&node.daemon.url(), "t", 1);
    // Metadata v4: every topic (null array), allow auto-creation false, then 3 stray bytes.
    let mut body = (-1i32).to_be_bytes().to_vec();
    body.push(0);
    body.extend_from_slice(&[0, 0, 0]);
    let (answer, closed) = send_raw(node.kafka, &frame(3, 4, &body));
    assert!(!closed, "the connection was closed");
    assert!(answer.len() > 8, "no answer: {answer:?}");
    let size = u32::from_be_bytes([answer[0], answer[1], answer[2], answer[3]]) as usize;
    assert_eq!(answer.len(), 4 + size, "one whole answer");
    assert_eq!(
        &answer[4..8],
        &7i32.to_be_bytes(),
        "the request's correlation id"
    );
    assert!(
        answer.windows(3).any(|w| w == [0, 1, b't']),
        "the answer names topic t"
    );
}

#[test]
fn malformed_oversized_and_unoffered_requests_close_their_connection_and_the_daemon_serves_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path());
    let base = node.daemon.url();
    create_topic(&base, "t", 1);

    let closed = |what: &str, bytes: &[u8]| {
        let got = send_raw(node.kafka, bytes);
        assert_eq!(got, (Vec::new(), true), "{what}: closed without an answer");
    };
    closed("a frame shorter than a header", &[0, 0, 0, 3, 0, 1, 2]);
    closed("a negative size", &(-5i32).to_be_bytes());
    // 2 GiB declared, far over max-request-bytes: refused before any body is read.
    closed("an oversized frame", &i32::MAX.to_be_bytes());
    closed("an unknown API key", &frame(999, 0, &[]));
    closed("Fetch 13 (topic ids, not offered)", &frame(1, 13, &[]));
    closed(
        "ElectLeaders (not offered: narad has no replicas to elect among)",
        &frame(43, 0, &[0, 0, 0, 0, 0, 0, 0, 0]),
    );
    closed(
        "FindCoordinator 5 (a version past the offered 0 to 4)",
        &frame(10, 5, &[0, 0]),
    );
    closed("a truncated Metadata body", &frame(3, 1, &[0, 0]));
    // Topic arrays claiming two billion entries, in both array encodings: refused before
    // the decoder allocates for them.
    closed(
        "a Metadata 1 topic count past the frame",
        &frame(3, 1, &i32::MAX.to_be_bytes()),
    );
    closed(
        "a Metadata 9 (compact) topic count past the frame",
        &frame(3, 9, &[0, 0xf0, 0xff, 0xff, 0xff, 0x07]),
    );
    let produce_body: Vec<u8> = [
        &(-1i16).to_be_bytes()[..], // transactional id: null
        &1i16.to_be_bytes(),        // acks
        &1000i32.to_be_bytes(),     // timeout
        &i32::MAX.to_be_bytes(),    // topic count
    ]
    .concat();
    closed(
        "a Produce 3 topic count past the frame",
        &frame(0, 3, &produce_body),
    );

    // ApiVersions at a version not offered gets the protocol's answer: v0, UNSUPPORTED_VERSION.
    let (answer, closed_after) = send_raw(node.kafka, &frame(18, 9, &[]));
    assert!(!closed_after, "the connection stays open for the retry");
    assert!(answer.len() >= 10, "an ApiVersions answer: {answer:?}");
    assert_eq!(&answer[4..8], &7i32.to_be_bytes(), "correlation id");
    assert_eq!(
        i16::from_be_bytes([answer[8], answer[9]]),
        35,
        "UNSUPPORTED_VERSION"
    );

    // A client that stops mid-request holds only its own connection: the daemon still serves
    // Kafka and HTTP clients meanwhile.
    let mut slow = TcpStream::connect(node.kafka).expect("connect");
    slow.write_all(&[0, 0, 1, 0, 0, 3]).expect("partial frame");
    let mut list = Command::new("kcat");
    list.args(["-b", &node.kafka.to_string(), "-L", "-t", "t"]);
    let listing = run(list, b"", "kcat -L");
    assert!(
        listing.contains("topic \"t\" with 1 partitions"),
        "{listing}"
    );
    let mut produce = Command::new("kcat");
    produce.args(["-b", &node.kafka.to_string(), "-t", "t", "-P", "-K:"]);
    run(produce, b"k:still serving\n", "kcat -P");
    let records = fetch_all(&http_client(), &base, "t", 0);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["value"], "still serving");
    drop(slow);
}

/// One request-response exchange with the crate's client-side codecs, on `stream`.
pub(super) fn exchange<Req, Resp>(
    stream: &mut TcpStream,
    api_key: i16,
    version: i16,
    request: &Req,
) -> Resp
where
    Req: kafka_protocol::protocol::Encodable,
    Resp: kafka_protocol::protocol::Decodable,
{
    use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    let key = ApiKey::try_from(api_key).expect("api key");
    let mut header = RequestHeader::default();
    header.request_api_key = api_key;
    header.request_api_version = version;
    header.correlation_id = 42;
    header.client_id = Some(StrBytes::from_static_str("narad-tests"));
    let mut body = bytes::BytesMut::new();
    header
        .encode(&mut body, key.request_header_version(version))
        .expect("header");
    request.encode(&mut body, version).expect("request");
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    stream.write_all(&out).expect("send");
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("answer size");
    let mut answer = vec![0u8; u32::from_be_bytes(size) as usize];
    stream.read_exact(&mut answer).expect("answer");
    let mut answer = bytes::Bytes::from(answer);
    let header = ResponseHeader::decode(&mut answer, key.response_header_version(version))
        .expect("response header");
    assert_eq!(header.correlation_id, 42);
    Resp::decode(&mut answer, version).expect("response")
}

/// Produce v3 of one batch to partition 0 of `topic`; returns (error code, base offset).
pub(super) fn produce_batch(
    stream: &mut TcpStream,
    topic: &str,
    producer: (i64, i16),
    first_sequence: i32,
    values: &[&str],
) -> (i16, i64) {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: producer.0,
            producer_epoch: producer.1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: first_sequence + i as i32,
            timestamp: 0,
            key: Some(bytes::Bytes::from_static(b"k")),
            value: Some(bytes::Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut batch = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("batch");
    let mut partition = PartitionProduceData::default();
    partition.index = 0;
    partition.records = Some(batch.freeze());
    let mut data = TopicProduceData::default();
    data.name = TopicName(StrBytes::from_string(topic.to_owned()));
    data.partition_data = vec![partition];
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 10_000;
    request.topic_data = vec![data];
    let response: ProduceResponse = exchange(stream, 0, 3, &request);
    let answer = &response.responses[0].partition_responses[0];
    (answer.error_code, answer.base_offset)
}

#[test]
fn an_idempotent_batch_sent_again_keeps_its_offsets_and_a_sequence_gap_is_refused() {
    use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path());
    let base = node.daemon.url();
    create_topic(&base, "ledger", 1);
    let mut stream = TcpStream::connect(node.kafka).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let init: InitProducerIdResponse =
        exchange(&mut stream, 22, 0, &InitProducerIdRequest::default());
    assert_eq!(init.error_code, 0);
    let producer = (init.producer_id.0, init.producer_epoch);
    assert!(producer.0 >= 0);

    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 0, &["a", "b", "c"]),
        (0, 0)
    );
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 3, &["d"]),
        (0, 3)
    );
    // A retry of an earlier batch: its first offsets, nothing written.
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 0, &["a", "b", "c"]),
        (0, 0)
    );
    // Sequence 4 is next; 6 skips ahead: OUT_OF_ORDER_SEQUENCE_NUMBER (45).
    let (error, _) = produce_batch(&mut stream, "ledger", producer, 6, &["x"]);
    assert_eq!(error, 45);
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 4, &["e"]),
        (0, 4)
    );

    let values: Vec<Value> = fetch_all(&http_client(), &base, "ledger", 0)
        .iter()
        .map(|r| r["value"].clone())
        .collect();
    assert_eq!(values, ["a", "b", "c", "d", "e"], "each batch stored once");
}

#[test]
fn an_idempotent_producers_retry_after_a_kill_9_and_restart_is_not_written_twice() {
    use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = start(dir.path());
    create_topic(&node.daemon.url(), "ledger", 1);
    let connect = |node: &KafkaDaemon| {
        let stream = TcpStream::connect(node.kafka).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        stream
    };
    let mut stream = connect(&node);
    let init: InitProducerIdResponse =
        exchange(&mut stream, 22, 0, &InitProducerIdRequest::default());
    let producer = (init.producer_id.0, init.producer_epoch);
    // Another producer's batches between them, as on a busy partition.
    let other: InitProducerIdResponse =
        exchange(&mut stream, 22, 0, &InitProducerIdRequest::default());
    let other = (other.producer_id.0, other.producer_epoch);
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 0, &["a", "b"]),
        (0, 0)
    );
    assert_eq!(
        produce_batch(&mut stream, "ledger", other, 0, &["x"]),
        (0, 2)
    );
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 2, &["c"]),
        (0, 3)
    );
    drop(stream);

    // The answer to the last batch is lost with the daemon; the producer sends it again.
    node.daemon.kill9();
    node.daemon.restart();
    let mut stream = connect(&node);
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 2, &["c"]),
        (0, 3),
        "the retry is answered with its offset, not written again"
    );
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 0, &["a", "b"]),
        (0, 0)
    );
    assert_eq!(
        produce_batch(&mut stream, "ledger", other, 0, &["x"]),
        (0, 2)
    );
    // Sequence 3 is next; 5 skips ahead.
    let (error, _) = produce_batch(&mut stream, "ledger", producer, 5, &["z"]);
    assert_eq!(error, 45, "OUT_OF_ORDER_SEQUENCE_NUMBER");
    assert_eq!(
        produce_batch(&mut stream, "ledger", producer, 3, &["d"]),
        (0, 4)
    );

    let values: Vec<Value> = fetch_all(&http_client(), &node.daemon.url(), "ledger", 0)
        .iter()
        .map(|r| r["value"].clone())
        .collect();
    assert_eq!(values, ["a", "b", "x", "c", "d"], "each batch stored once");
}

/// A client that reaches the listener through a forwarded port (a container port, an SSH
/// tunnel, a Kubernetes service) must be told the address it can reach, not the one the
/// daemon listens on.
#[test]
fn metadata_names_the_broker_at_the_advertised_kafka_address() {
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start_with(
        dir.path(),
        &["--kafka-advertise", "kafka.example.test:19092"],
    );
    let mut stream = TcpStream::connect(node.kafka).expect("connect");
    let response: MetadataResponse = exchange(&mut stream, 3, 4, &MetadataRequest::default());
    let brokers: Vec<(String, i32)> = response
        .brokers
        .iter()
        .map(|b| (b.host.to_string(), b.port))
        .collect();
    assert_eq!(brokers, [("kafka.example.test".to_owned(), 19092)]);
    // A value that is no HOST:PORT stops the start with a clear error.
    let output = Command::new(crate::e2e::harness::narad_binary())
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("other"))
        .args([
            "--kafka-listen",
            "127.0.0.1:0",
            "--kafka-advertise",
            "no-port",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("narad serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("kafka-advertise") && stderr.contains("HOST:PORT"),
        "{stderr}"
    );
}
