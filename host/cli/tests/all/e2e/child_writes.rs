//! Who writes to a fan-out child: its cursors, and producers only where the topic allows it.
//! A child whose producers can write anything no longer holds only what its parent held.

use std::net::TcpStream;

use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use reqwest::Method;
use serde_json::{Value, json};

use super::kafka::{create_topic, exchange, start};
use crate::e2e::harness::{fetch_all, http_client, send_json};

/// Kafka's TOPIC_AUTHORIZATION_FAILED.
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;

/// Produce v3 of one plain record to partition 0 of `topic`: the partition's error code.
fn kafka_produce(stream: &mut TcpStream, topic: &str, value: &'static [u8]) -> i16 {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
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
        value: Some(bytes::Bytes::from_static(value)),
        headers: Default::default(),
    };
    let mut batch = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        &[record],
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
    response.responses[0].partition_responses[0].error_code
}

fn http_produce(base: &str, topic: &str, value: &str) -> (u16, Value) {
    send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/{topic}/records"),
        Some(&json!({"records": [{"value": value, "partition": 0}]})),
    )
    .expect("produce")
}

#[test]
fn a_child_takes_only_its_cursors_copies_unless_the_topic_lets_producers_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start(dir.path());
    let base = kafka.daemon.url();
    create_topic(&base, "orders", 1);
    create_topic(&base, "copy", 1);
    let (status, body) = send_json(
        &http_client(),
        Method::PUT,
        &format!("{base}/v1/topics/orders/children/copy"),
        Some(&json!({})),
    )
    .expect("attach");
    assert!((200..300).contains(&status), "{status} {body}");

    // Producers are refused on both paths, and told how to allow them.
    let (status, body) = http_produce(&base, "copy", "forged");
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("writable_as_child")),
        "{body}"
    );
    let mut stream = TcpStream::connect(kafka.kafka).expect("connect");
    assert_eq!(
        kafka_produce(&mut stream, "copy", b"forged"),
        TOPIC_AUTHORIZATION_FAILED
    );
    // The parent is a plain topic: written as ever, and copied.
    let (status, body) = http_produce(&base, "orders", "real");
    assert_eq!(status, 200, "{body}");
    assert_eq!(kafka_produce(&mut stream, "orders", b"real too"), 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let copies = loop {
        let copies = fetch_all(&http_client(), &base, "copy", 0);
        if copies.len() >= 2 || std::time::Instant::now() > deadline {
            break copies;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let values: Vec<&str> = copies.iter().filter_map(|r| r["value"].as_str()).collect();
    assert_eq!(values, ["real", "real too"], "only the cursor's copies");

    // Allowed by the operator: producers write to it too.
    let (status, body) = send_json(
        &http_client(),
        Method::PATCH,
        &format!("{base}/v1/topics/copy"),
        Some(&json!({"writable_as_child": true})),
    )
    .expect("patch");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["writable_as_child"], true, "{body}");
    let (status, body) = http_produce(&base, "copy", "allowed");
    assert_eq!(status, 200, "{body}");
    assert_eq!(kafka_produce(&mut stream, "copy", b"allowed too"), 0);
    // Still allowed after a restart: the setting is metadata.
    drop(stream);
    let mut kafka = kafka;
    kafka.daemon.restart_same_port();
    let (status, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{}/v1/topics/copy", kafka.daemon.url()),
        None,
    )
    .expect("describe");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["writable_as_child"], true, "{body}");
}
