//! The children API: attach rules and their errors, the attach point, router changes,
//! detach, and retention changes that a delay child depends on.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::common::{Daemon, TRIMMED_RECORDS, trimmed_value};

const HOUR_MS: u64 = 3_600_000;

async fn create(d: &Daemon, name: &str, partitions: u32, retention_ms: Option<u64>) {
    let (status, body) = d
        .post(
            "/v1/topics",
            json!({"name": name, "partitions": partitions, "retention_ms": retention_ms}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn attach_creates_the_child_and_records_the_parents_high_watermarks() {
    let d = Daemon::start().await;
    d.create_topic("orders", 3).await;
    d.produce("orders", json!([{"value": "a", "partition": 0}, {"value": "b", "partition": 0}, {"value": "c", "partition": 2}]))
        .await;
    let (status, body) = d
        .put("/v1/topics/orders/children/copy", json!({"partitions": 2}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["attach_offsets"], json!([2, 0, 1]));
    assert_eq!(body["attach_epoch"].as_str().map(str::len), Some(16));
    let names: Vec<&str> = body["router"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["key-hash", "keyless-index", "round-robin"]);
    let (status, child) = d.get("/v1/topics/copy").await;
    assert_eq!(status, StatusCode::OK, "{child}");
    assert_eq!(child["partitions"], 2);
    // Attaching again is a conflict; a fresh epoch needs a detach first.
    let (status, body) = d.put("/v1/topics/orders/children/copy", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test]
async fn attach_refuses_what_breaks_the_link_rules_and_leaves_nothing_behind() {
    let d = Daemon::start().await;
    create(&d, "short", 1, Some(HOUR_MS)).await;
    d.create_topic("a", 1).await;
    d.create_topic("b", 1).await;
    let cases: Vec<(&str, Value, StatusCode)> = vec![
        (
            "/v1/topics/a/children/a",
            json!({}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/topics/a/children/nope",
            json!({}),
            StatusCode::NOT_FOUND,
        ),
        (
            "/v1/topics/missing/children/b",
            json!({}),
            StatusCode::NOT_FOUND,
        ),
        (
            "/v1/topics/a/children/made",
            json!({"partitions": 1, "delay_ms": 365 * 24 * HOUR_MS + 1}),
            StatusCode::BAD_REQUEST,
        ),
        // The parent keeps records for an hour: a 1 ms delay needs an hour and a millisecond.
        (
            "/v1/topics/short/children/made",
            json!({"partitions": 1, "delay_ms": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/topics/a/children/made",
            json!({"partitions": 1, "router": []}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/topics/a/children/made",
            json!({"partitions": 1, "router": ["no-such-plugin"]}),
            StatusCode::NOT_FOUND,
        ),
        (
            "/v1/topics/a/children/made",
            json!({"partitions": 1, "router": vec!["round-robin"; 9]}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/topics/a/children/b",
            json!({"partitions": 7}),
            StatusCode::CONFLICT,
        ),
        (
            "/v1/topics/a/children/made",
            json!({"partitions": 1, "surprise": true}),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (path, body, want) in cases {
        let (status, answer) = d.put(path, body.clone()).await;
        assert_eq!(status, want, "{path} {body}: {answer}");
    }
    // No link was recorded and the child topics a failed attach created are gone again.
    for parent in ["a", "short"] {
        let (_, list) = d.get(&format!("/v1/topics/{parent}/children")).await;
        assert_eq!(list["children"], json!([]), "{parent}");
    }
    let (status, _) = d.get("/v1/topics/made").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A cycle: a -> b, then b -> a.
    let (status, body) = d.put("/v1/topics/a/children/b", json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = d.put("/v1/topics/b/children/a", json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("cycle"), "{body}");
}

#[tokio::test]
async fn a_parent_takes_at_most_108_children() {
    let d = Daemon::start().await;
    d.create_topic("p", 1).await;
    for i in 0..108 {
        let (status, body) = d
            .put(
                &format!("/v1/topics/p/children/c{i}"),
                json!({"partitions": 1}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "child {i}: {body}");
    }
    let (status, body) = d
        .put("/v1/topics/p/children/one-more", json!({"partitions": 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test]
async fn a_delay_childs_parent_cannot_drop_its_retention_below_delay_plus_an_hour() {
    let d = Daemon::start().await;
    create(&d, "jobs", 1, Some(3 * HOUR_MS)).await;
    let (status, body) = d
        .put(
            "/v1/topics/jobs/children/later",
            json!({"partitions": 1, "delay_ms": HOUR_MS}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = d
        .patch("/v1/topics/jobs", json!({"retention_ms": 2 * HOUR_MS - 1}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (_, topic) = d.get("/v1/topics/jobs").await;
    assert_eq!(
        topic["retention_ms"],
        3 * HOUR_MS,
        "a refused change changes nothing"
    );
    let (status, body) = d
        .patch("/v1/topics/jobs", json!({"retention_ms": 2 * HOUR_MS}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = d
        .patch("/v1/topics/jobs", json!({"retention_ms": null}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["retention_ms"], Value::Null);
}

#[tokio::test]
async fn a_router_change_keeps_the_epoch_and_a_detach_stops_the_copy() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    let (_, attached) = d
        .put("/v1/topics/orders/children/copy", json!({"partitions": 2}))
        .await;
    let (status, changed) = d
        .patch(
            "/v1/topics/orders/children/copy",
            json!({"router": ["header-route", "round-robin"], "config": "header = region\nus = 1\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["attach_epoch"], attached["attach_epoch"]);
    assert_eq!(changed["router"][0]["name"], "header-route");
    // The new chain routes the next slab: a `us` record lands in partition 1.
    d.produce(
        "orders",
        json!([{"value": "x", "headers": {"region": "us"}}]),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.fetch_all("copy", 1).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the record was not copied by the new chain"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = d.delete("/v1/topics/orders/children/copy").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, list) = d.get("/v1/topics/orders/children").await;
    assert_eq!(list["children"], json!([]));
    let (status, _) = d.delete("/v1/topics/orders/children/copy").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The child topic stays.
    let (status, _) = d.get("/v1/topics/copy").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn an_attach_from_earliest_copies_the_parents_retained_history_and_drops_nothing() {
    let d = Daemon::start_trimming().await;
    d.create_trimmed_topic("orders").await;
    let log_start = d.produce_past_retention("orders").await;

    let (status, body) = d
        .put(
            "/v1/topics/orders/children/late",
            json!({"partitions": 1, "start": "yesterday"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/history",
            json!({"partitions": 1, "start": "earliest"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["attach_offsets"], json!([log_start]));
    // The default still starts at the end.
    let (status, body) = d
        .put("/v1/topics/orders/children/fresh", json!({"partitions": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["attach_offsets"], json!([TRIMMED_RECORDS]));

    let wanted: Vec<String> = (log_start..TRIMMED_RECORDS).map(trimmed_value).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held: Vec<String> = d
            .fetch_all("history", 0)
            .await
            .iter()
            .map(|r| r["value"].as_str().unwrap().to_owned())
            .collect();
        if held == wanted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "history holds {held:?}, not the parent's retained records"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, list) = d.get("/v1/topics/orders/children").await;
    let history = list["children"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "history"))
        .cloned()
        .unwrap();
    assert_eq!(history["partitions"][0]["dropped_messages"], 0, "{history}");
    assert!(d.fetch_all("fresh", 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_remote_child_behind_retention_counts_what_it_missed_and_sends_the_rest() {
    let target = Daemon::start().await;
    target.create_topic("copy", 1).await;
    let d = Daemon::start_trimming().await;
    d.create_trimmed_topic("orders").await;
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/away",
            json!({"remote": {"url": target.url, "topic": "copy"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["attach_offsets"], json!([0]));
    let (status, body) = d
        .post("/v1/topics/orders/children/away/pause", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let log_start = d.produce_past_retention("orders").await;
    assert!(
        target.fetch_all("copy", 0).await.is_empty(),
        "a paused link sent records"
    );

    let (status, body) = d
        .post("/v1/topics/orders/children/away/resume", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let wanted: Vec<String> = (log_start..TRIMMED_RECORDS).map(trimmed_value).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held: Vec<String> = target
            .fetch_all("copy", 0)
            .await
            .iter()
            .map(|r| r["value"].as_str().unwrap().to_owned())
            .collect();
        let (_, list) = d.get("/v1/topics/orders/children").await;
        let away = &list["children"][0]["partitions"][0];
        if held == wanted && away["dropped_messages"] == log_start {
            assert_eq!(away["remote_state"], "running", "{away}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the target holds {} records, the link lists {away}",
            held.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
