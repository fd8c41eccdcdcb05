//! Topic endpoints and their errors.

use reqwest::StatusCode;
use serde_json::json;

use crate::api::common::Daemon;

#[tokio::test]
async fn created_topic_is_listed_and_described_per_partition() {
    let d = Daemon::start().await;
    let (status, body) = d
        .post(
            "/v1/topics",
            json!({"name": "orders", "partitions": 3, "retention_ms": 86_400_000}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body["name"], "orders");
    assert_eq!(body["partitions"], 3);
    assert_eq!(body["retention_ms"], 86_400_000);
    assert!(body["retention_bytes"].is_null());
    assert!(body["created_at"].as_i64().unwrap() > 0);

    let (status, list) = d.get("/v1/topics").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["topics"].as_array().unwrap().len(), 1);
    assert_eq!(list["topics"][0], body);

    let (status, desc) = d.get("/v1/topics/orders").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(desc["name"], "orders");
    let stats = desc["partition_stats"].as_array().unwrap();
    assert_eq!(stats.len(), 3);
    for (i, p) in stats.iter().enumerate() {
        assert_eq!(p["partition"], i);
        assert_eq!(p["log_start_offset"], 0);
        assert!(p["state"].is_string());
    }
}

#[tokio::test]
async fn describe_reports_offsets_and_size_after_produce() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    d.produce(
        "orders",
        json!([{"value": "a", "partition": 1}, {"value": "b", "partition": 1}]),
    )
    .await;
    let (_, desc) = d.get("/v1/topics/orders").await;
    let p1 = &desc["partition_stats"][1];
    assert_eq!(p1["high_watermark"], 2);
    assert!(p1["size_bytes"].as_u64().unwrap() > 0);
    assert_eq!(p1["state"], "open");
}

#[tokio::test]
async fn duplicate_topic_is_409_and_keeps_the_original() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let (status, body) = d
        .post("/v1/topics", json!({"name": "orders", "partitions": 5}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body["error"].as_str().unwrap().contains("already exists"));
    let (_, desc) = d.get("/v1/topics/orders").await;
    assert_eq!(desc["partitions"], 2);
}

#[tokio::test]
async fn invalid_topic_names_are_400_and_create_nothing() {
    let d = Daemon::start().await;
    let long = "a".repeat(250);
    for name in ["", "a/b", ".", "..", "sp ace", "ümlaut", long.as_str()] {
        let (status, body) = d
            .post("/v1/topics", json!({"name": name, "partitions": 1}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name:?}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("topic name"),
            "{body}"
        );
    }
    let ok = "a".repeat(249);
    d.create_topic(&ok, 1).await;
    d.create_topic("A-z_0.9", 1).await;
    let (_, list) = d.get("/v1/topics").await;
    assert_eq!(list["topics"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn partition_counts_outside_1_to_1024_are_400() {
    let d = Daemon::start().await;
    for partitions in [0, 1025] {
        let (status, body) = d
            .post("/v1/topics", json!({"name": "t", "partitions": partitions}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("1 to 1024"),
            "{body}"
        );
    }
    let (status, body) = d
        .post("/v1/topics", json!({"name": "t", "partitions": -1}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (_, list) = d.get("/v1/topics").await;
    assert!(list["topics"].as_array().unwrap().is_empty());
    d.create_topic("t", 1024).await;
}

#[tokio::test]
async fn zero_retention_and_unknown_fields_are_400() {
    let d = Daemon::start().await;
    for body in [
        json!({"name": "t", "partitions": 1, "retention_ms": 0}),
        json!({"name": "t", "partitions": 1, "retention_bytes": 0}),
        json!({"name": "t", "partitions": 1, "partitons": 2}),
        json!({"name": "t"}),
    ] {
        let (status, answer) = d.post("/v1/topics", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
    }
    let (_, list) = d.get("/v1/topics").await;
    assert!(list["topics"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn unknown_topic_is_404_on_every_endpoint() {
    let d = Daemon::start().await;
    let checks = [
        d.get("/v1/topics/nope").await,
        d.delete("/v1/topics/nope").await,
        d.post("/v1/topics/nope/partitions", json!({"count": 2}))
            .await,
        d.post(
            "/v1/topics/nope/records",
            json!({"records": [{"value": "x"}]}),
        )
        .await,
        d.get("/v1/topics/nope/partitions/0/records").await,
    ];
    for (status, body) in checks {
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(body["error"].as_str().unwrap().contains("nope"), "{body}");
    }
}

#[tokio::test]
async fn deleted_topic_is_gone_and_its_name_starts_empty_when_reused() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    d.produce("orders", json!([{"value": "old", "partition": 0}]))
        .await;
    let (status, body) = d.delete("/v1/topics/orders").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["name"], "orders");
    assert_eq!(d.get("/v1/topics/orders").await.0, StatusCode::NOT_FOUND);
    assert!(!d.dir.join("topics/orders").exists());

    d.create_topic("orders", 2).await;
    assert!(d.fetch_all("orders", 0).await.is_empty());
}

#[tokio::test]
async fn partitions_grow_and_new_partitions_take_records() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let (status, body) = d
        .post("/v1/topics/orders/partitions", json!({"count": 5}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["partitions"], 5);
    let offsets = d
        .produce("orders", json!([{"value": "x", "partition": 4}]))
        .await;
    assert_eq!(offsets, vec![(4, 0)]);
    let (_, desc) = d.get("/v1/topics/orders").await;
    assert_eq!(desc["partition_stats"].as_array().unwrap().len(), 5);

    // The same count is accepted and changes nothing.
    let (status, body) = d
        .post("/v1/topics/orders/partitions", json!({"count": 5}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn shrinking_or_overgrowing_partitions_is_400_and_changes_nothing() {
    let d = Daemon::start().await;
    d.create_topic("orders", 4).await;
    for count in [3, 0, 1025] {
        let (status, body) = d
            .post("/v1/topics/orders/partitions", json!({"count": count}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{count}: {body}");
    }
    let (_, desc) = d.get("/v1/topics/orders").await;
    assert_eq!(desc["partitions"], 4);
}

#[tokio::test]
async fn topics_and_records_survive_a_restart() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    d.post("/v1/topics/orders/partitions", json!({"count": 3}))
        .await;
    d.produce("orders", json!([{"value": "kept", "partition": 2}]))
        .await;
    let d = d.restart().await;
    let (_, desc) = d.get("/v1/topics/orders").await;
    assert_eq!(desc["partitions"], 3);
    // A clean shutdown wrote the high-watermark file: describe knows it without opening.
    assert_eq!(desc["partition_stats"][2]["high_watermark"], 1);
    assert_eq!(desc["partition_stats"][2]["state"], "closed");
    let records = d.fetch_all("orders", 2).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["value"], "kept");
}
