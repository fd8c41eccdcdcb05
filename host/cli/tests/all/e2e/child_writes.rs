//! Who writes to a fan-out child: its cursors, and producers only where the topic allows it.
//! A child whose producers can write anything no longer holds only what its parent held.

use std::net::TcpStream;

use reqwest::Method;
use serde_json::{Value, json};

use super::kafka::{create_topic, produce_batch, start};
use crate::e2e::harness::{fetch_all, http_client, send_json};

/// Kafka's TOPIC_AUTHORIZATION_FAILED.
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;

/// Produce v3 of one plain record to partition 0 of `topic`: the partition's error code.
fn kafka_produce(stream: &mut TcpStream, topic: &str, value: &str) -> i16 {
    produce_batch(stream, topic, (-1, -1), 0, &[value]).0
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
        kafka_produce(&mut stream, "copy", "forged"),
        TOPIC_AUTHORIZATION_FAILED
    );
    // The parent is a plain topic: written as ever, and copied.
    let (status, body) = http_produce(&base, "orders", "real");
    assert_eq!(status, 200, "{body}");
    assert_eq!(kafka_produce(&mut stream, "orders", "real too"), 0);
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
    assert_eq!(kafka_produce(&mut stream, "copy", "allowed too"), 0);
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
