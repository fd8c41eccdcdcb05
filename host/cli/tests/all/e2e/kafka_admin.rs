//! Kafka admin on the real binary: topics created (by kafka-python and by librdkafka), grown
//! and deleted through the Kafka admin APIs, as applications manage theirs.

use std::process::Command;

use reqwest::Method;
use serde_json::Value;

use crate::e2e::harness::{http_client, send_json};
use crate::e2e::kafka::{exchange, run, script, start, start_with};

/// `GET /v1/topics/{name}` through the HTTP API.
fn describe(base: &str, name: &str) -> (u16, Value) {
    send_json(
        &http_client(),
        Method::GET,
        &format!("{base}/v1/topics/{name}"),
        None,
    )
    .expect("describe")
}

/// A Metadata v9 request naming `names`, allowing auto-creation or not; each topic's error
/// code in the answer, by name.
fn metadata_codes(
    kafka: std::net::SocketAddr,
    names: &[&str],
    allow_auto_creation: bool,
) -> std::collections::BTreeMap<String, i16> {
    use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
    use kafka_protocol::messages::{MetadataResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut request = MetadataRequest::default();
    request.topics = Some(
        names
            .iter()
            .map(|name| {
                let mut topic = MetadataRequestTopic::default();
                topic.name = Some(TopicName(StrBytes::from_string((*name).to_owned())));
                topic
            })
            .collect(),
    );
    request.allow_auto_topic_creation = allow_auto_creation;
    let mut stream = std::net::TcpStream::connect(kafka).expect("connect");
    let response: MetadataResponse = exchange(&mut stream, 3, 9, &request);
    response
        .topics
        .into_iter()
        .map(|t| {
            (
                t.name.map(|n| n.0.to_string()).unwrap_or_default(),
                t.error_code,
            )
        })
        .collect()
}

fn admin(args: &[String]) -> Value {
    let mut command = Command::new("python3");
    command.arg(script("python_admin.py")).args(args);
    let out = run(command, b"", "python3 python_admin.py");
    serde_json::from_str(out.trim()).expect("the script's JSON")
}

#[test]
fn an_application_creates_its_topics_through_the_kafka_admin_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path());
    let base = node.daemon.url();
    let bootstrap = node.kafka.to_string();

    // kafka-python: created with its partitions and retention; the same again is refused
    // as existing.
    let outcome = admin(&[
        "create".into(),
        bootstrap.clone(),
        "events".into(),
        "3".into(),
        "3600000".into(),
    ]);
    assert_eq!(outcome["first"], "ok", "{outcome}");
    assert_eq!(outcome["again"], "TopicAlreadyExistsError", "{outcome}");
    let (status, topic) = describe(&base, "events");
    assert_eq!(status, 200, "{topic}");
    assert_eq!(topic["partitions"], 3, "{topic}");
    assert_eq!(topic["retention_ms"], 3_600_000, "{topic}");

    // librdkafka (confluent-kafka's AdminClient).
    let outcome = admin(&[
        "create-librdkafka".into(),
        bootstrap.clone(),
        "payments".into(),
        "2".into(),
    ]);
    assert_eq!(outcome["result"], "ok", "{outcome}");
    let (status, topic) = describe(&base, "payments");
    assert_eq!(status, 200, "{topic}");
    assert_eq!(topic["partitions"], 2, "{topic}");

    // Grown to 5; the same count again is refused, as Kafka refuses it.
    let outcome = admin(&[
        "grow".into(),
        bootstrap.clone(),
        "payments".into(),
        "5".into(),
    ]);
    assert_eq!(outcome["first"], "ok", "{outcome}");
    assert_eq!(outcome["again"], "InvalidPartitionsError", "{outcome}");
    assert_eq!(describe(&base, "payments").1["partitions"], 5);

    // Deleted; a topic in a fan-out link is not, and neither is an unknown one.
    let (status, body) = send_json(
        &http_client(),
        Method::PUT,
        &format!("{base}/v1/topics/events/children/events-copy"),
        Some(&serde_json::json!({"partitions": 1})),
    )
    .expect("attach");
    assert!((200..300).contains(&status), "{body}");
    let outcome = admin(&[
        "delete".into(),
        bootstrap,
        "payments".into(),
        "events".into(),
        "nothing-here".into(),
    ]);
    assert_eq!(outcome["payments"], "ok", "{outcome}");
    assert_eq!(outcome["events"], "PolicyViolationError", "{outcome}");
    assert_eq!(
        outcome["nothing-here"], "UnknownTopicOrPartitionError",
        "{outcome}"
    );
    assert_eq!(describe(&base, "payments").0, 404);
    assert_eq!(describe(&base, "events").0, 200);

    // Auto-creation is off by default: a Metadata request that allows it creates nothing.
    let codes = metadata_codes(node.kafka, &["not-created"], true);
    assert_eq!(
        codes["not-created"], UNKNOWN_TOPIC_OR_PARTITION,
        "{codes:?}"
    );
    assert_eq!(describe(&base, "not-created").0, 404);
}

/// Kafka's UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_TOPIC_EXCEPTION: i16 = 17;

#[test]
fn with_auto_creation_on_producers_create_their_topics_by_writing_to_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start_with(dir.path(), &["--kafka-auto-create-partitions", "3"]);
    let base = node.daemon.url();

    // Both clients produce to topics that do not exist; each is created with 3 partitions
    // and holds every record.
    let outcome = admin(&[
        "auto-produce".into(),
        node.kafka.to_string(),
        "orders".into(),
        "clicks".into(),
        "20".into(),
    ]);
    assert_eq!(outcome["python"], "ok", "{outcome}");
    assert_eq!(outcome["librdkafka"], "ok", "{outcome}");
    for name in ["orders", "clicks"] {
        let (status, topic) = describe(&base, name);
        assert_eq!(status, 200, "{name}: {topic}");
        assert_eq!(topic["partitions"], 3, "{topic}");
        let held: u64 = topic["partition_stats"]
            .as_array()
            .expect("partition_stats")
            .iter()
            .map(|p| p["high_watermark"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(held, 20, "{name}: {topic}");
    }

    // A request that does not allow it creates nothing; a name narad refuses is refused as
    // CreateTopics refuses it; the daemon's own topics are never created this way.
    let codes = metadata_codes(node.kafka, &["asked-only"], false);
    assert_eq!(codes["asked-only"], UNKNOWN_TOPIC_OR_PARTITION, "{codes:?}");
    assert_eq!(describe(&base, "asked-only").0, 404);
    let codes = metadata_codes(node.kafka, &["bad name!", "__narad_offsets_x"], true);
    assert_eq!(codes["bad name!"], INVALID_TOPIC_EXCEPTION, "{codes:?}");
    assert_ne!(codes["__narad_offsets_x"], 0, "{codes:?}");
    assert_eq!(describe(&base, "__narad_offsets_x").0, 404);
}

#[test]
fn while_the_daemon_requires_its_token_the_kafka_listener_creates_no_topic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token-for-the-test\n").expect("token file");
    let node = start_with(
        dir.path(),
        &[
            "--auth-token-file",
            token.to_str().expect("utf-8 path"),
            "--kafka-auto-create-partitions",
            "2",
        ],
    );
    let outcome = admin(&[
        "create-librdkafka".into(),
        node.kafka.to_string(),
        "events".into(),
        "1".into(),
    ]);
    let result = outcome["result"].as_str().unwrap_or_default();
    assert!(
        result.contains("TOPIC_AUTHORIZATION_FAILED") || result.contains("authoriz"),
        "{outcome}"
    );
    let (status, _) = describe(&node.daemon.url(), "events");
    assert_eq!(status, 404, "no topic was created");
    // Nor by naming it in Metadata, auto-creation on or not.
    let codes = metadata_codes(node.kafka, &["events"], true);
    assert_eq!(codes["events"], UNKNOWN_TOPIC_OR_PARTITION, "{codes:?}");
    assert_eq!(describe(&node.daemon.url(), "events").0, 404);
}

#[test]
fn admin_clients_read_topic_and_broker_configs_and_the_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path());
    let base = node.daemon.url();
    let bootstrap = node.kafka.to_string();
    // One topic with a retention of its own, one without.
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&serde_json::json!({"name": "orders", "partitions": 2, "retention_ms": 86_400_000})),
    )
    .expect("create orders");
    assert!((200..300).contains(&status), "{body}");
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&serde_json::json!({"name": "audit", "partitions": 1})),
    )
    .expect("create audit");
    assert!((200..300).contains(&status), "{body}");

    let seen = admin(&["describe".into(), bootstrap.clone(), "orders".into()]);
    assert_eq!(seen["topic"]["retention.ms"], "86400000", "{seen}");
    assert_eq!(seen["topic"]["retention.bytes"], "-1", "{seen}");
    assert_eq!(seen["topic"]["cleanup.policy"], "delete", "{seen}");
    assert_eq!(seen["topic"]["min.insync.replicas"], "1", "{seen}");
    // The topic's own retention is a topic config; the rest are defaults.
    assert_eq!(
        seen["sources"]["retention.ms"], "DYNAMIC_TOPIC_CONFIG",
        "{seen}"
    );
    assert_eq!(
        seen["sources"]["retention.bytes"], "DEFAULT_CONFIG",
        "{seen}"
    );
    assert_eq!(seen["broker"]["num.partitions"], "1", "{seen}");
    assert_eq!(
        seen["broker"]["auto.create.topics.enable"], "false",
        "{seen}"
    );
    assert_eq!(seen["missing"], serde_json::json!({}), "{seen}");
    let port = i64::from(node.kafka.port());
    let brokers = seen["cluster"]["brokers"].as_array().expect("brokers");
    assert_eq!(brokers.len(), 1, "{seen}");
    assert_eq!(brokers[0][2], port, "{seen}");
    assert_eq!(brokers[0][0], seen["cluster"]["controller_id"], "{seen}");
    assert!(
        seen["cluster"]["cluster_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{seen}"
    );

    let seen = admin(&["describe-librdkafka".into(), bootstrap, "audit".into()]);
    assert_eq!(seen["topic"]["retention.ms"], "-1", "{seen}");
    assert_eq!(seen["topic"]["cleanup.policy"], "delete", "{seen}");
    assert!(
        seen["missing"]
            .as_str()
            .is_some_and(|e| e.contains("does not exist")),
        "{seen}"
    );
    let nodes = seen["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 1, "{seen}");
    assert_eq!(nodes[0][2], port, "{seen}");
    assert_eq!(nodes[0][0], seen["controller"], "{seen}");
}
