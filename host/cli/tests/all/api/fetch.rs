//! Fetch: offsets, limits, long-poll, and its errors.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::common::Daemon;

async fn filled(n: usize) -> Daemon {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let records: Vec<Value> = (0..n)
        .map(|i| json!({"value": format!("r{i}"), "partition": 0}))
        .collect();
    if !records.is_empty() {
        d.produce("orders", Value::Array(records)).await;
    }
    d
}

#[tokio::test]
async fn fetch_pages_through_a_partition_with_max_and_next_offset() {
    let d = filled(10).await;
    let (status, body) = d
        .get("/v1/topics/orders/partitions/0/records?offset=3&max=4")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let offsets: Vec<u64> = body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![3, 4, 5, 6]);
    assert_eq!(body["records"][0]["value"], "r3");
    assert_eq!(body["next_offset"], 7);
    assert_eq!(body["high_watermark"], 10);
    assert_eq!(body["log_start_offset"], 0);
}

#[tokio::test]
async fn omitted_offset_reads_from_the_log_start() {
    let d = filled(3).await;
    let (_, body) = d.get("/v1/topics/orders/partitions/0/records").await;
    assert_eq!(body["records"].as_array().unwrap().len(), 3);
    assert_eq!(body["records"][0]["offset"], 0);
}

#[tokio::test]
async fn fetch_at_the_end_is_empty_and_beyond_it_is_416() {
    let d = filled(3).await;
    let (status, body) = d
        .get("/v1/topics/orders/partitions/0/records?offset=3")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["records"].as_array().unwrap().is_empty());
    assert_eq!(body["next_offset"], 3);

    let (status, body) = d
        .get("/v1/topics/orders/partitions/0/records?offset=4")
        .await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
    assert_eq!(body["high_watermark"], 3);
    assert!(body["error"].as_str().unwrap().contains("beyond the end"));
}

#[tokio::test]
async fn bad_fetch_parameters_are_400_and_missing_partitions_404() {
    let d = filled(1).await;
    for path in [
        "/v1/topics/orders/partitions/x/records",
        "/v1/topics/orders/partitions/-1/records",
        "/v1/topics/orders/partitions/0/records?offset=abc",
        "/v1/topics/orders/partitions/0/records?max=0",
        "/v1/topics/orders/partitions/0/records?ofset=1",
    ] {
        let (status, body) = d.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
    }
    let (status, body) = d.get("/v1/topics/orders/partitions/2/records").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body["error"].as_str().unwrap().contains("has 2 partitions"));
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json_errors() {
    let d = Daemon::start().await;
    let (status, body) = d.get("/v2/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = d.post("/healthz", json!({})).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    let (status, body) = d.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
}

#[tokio::test]
async fn long_poll_wakes_when_a_record_is_committed() {
    let d = filled(0).await;
    let url = format!(
        "{}/v1/topics/orders/partitions/0/records?offset=0&wait_ms=30000",
        d.url
    );
    let waiter = tokio::spawn(async move {
        let resp = reqwest::get(url).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json::<Value>().await.unwrap()
    });
    // Give the request time to reach the wait; a record committed earlier is found by the
    // first read instead, so the assertion holds either way.
    tokio::time::sleep(Duration::from_millis(100)).await;
    d.produce("orders", json!([{"value": "late", "partition": 0}]))
        .await;
    let body = waiter.await.unwrap();
    assert_eq!(body["records"][0]["value"], "late");
    assert_eq!(body["next_offset"], 1);
}

#[tokio::test]
async fn long_poll_with_nothing_new_answers_empty() {
    let d = filled(1).await;
    let (status, body) = d
        .get("/v1/topics/orders/partitions/0/records?offset=1&wait_ms=50")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["records"].as_array().unwrap().is_empty());
    assert_eq!(body["next_offset"], 1);
}

#[tokio::test]
async fn shutdown_ends_a_long_poll_instead_of_waiting_it_out() {
    let d = Daemon::start_with(|c| c.limits.max_wait = Duration::from_secs(3600)).await;
    d.create_topic("orders", 1).await;
    let url = format!(
        "{}/v1/topics/orders/partitions/0/records?offset=0&wait_ms=3600000",
        d.url
    );
    let waiter = tokio::spawn(async move { reqwest::get(url).await.map(|r| r.status()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The poll may wait an hour; a graceful shutdown that waited for it would blow this
    // generous bound by far.
    tokio::time::timeout(Duration::from_secs(120), d.stop())
        .await
        .expect("shutdown waited for a long-poll");
    let status = tokio::time::timeout(Duration::from_secs(120), waiter)
        .await
        .expect("the long-poll was not answered after shutdown")
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn offset_below_the_log_start_is_416_after_retention() {
    let d = Daemon::start_trimming().await;
    d.create_trimmed_topic("orders").await;
    let log_start = d.produce_past_retention("orders").await;
    let (status, body) = d
        .get("/v1/topics/orders/partitions/0/records?offset=0")
        .await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
    assert_eq!(body["log_start_offset"], log_start);
    let (status, body) = d.get("/v1/topics/orders/partitions/0/records").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["records"][0]["offset"], log_start);
}
