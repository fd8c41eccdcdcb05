//! Produce: placement, answers, encodings, and batches rejected whole.

use narad_abi::partition_for_key;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::common::Daemon;

#[tokio::test]
async fn keyed_records_land_on_kafkas_partition_for_their_key() {
    let d = Daemon::start().await;
    d.create_topic("orders", 7).await;
    let keys: Vec<String> = (0..200).map(|i| format!("customer-{i}")).collect();
    let records: Vec<Value> = keys
        .iter()
        .map(|k| json!({"key": k, "value": "v"}))
        .collect();
    let offsets = d.produce("orders", Value::Array(records)).await;
    assert_eq!(offsets.len(), keys.len());
    for (key, (partition, _)) in keys.iter().zip(&offsets) {
        assert_eq!(
            Some(*partition),
            partition_for_key(key.as_bytes(), 7),
            "{key}"
        );
    }
    // Binary keys hash their bytes, not their base64 text.
    let offsets = d
        .produce("orders", json!([{"key_b64": "AAEC/w==", "value": "v"}]))
        .await;
    assert_eq!(
        Some(offsets[0].0),
        partition_for_key(&[0x00, 0x01, 0x02, 0xff], 7)
    );
}

#[tokio::test]
async fn keyless_records_round_robin_across_partitions_and_requests() {
    let d = Daemon::start().await;
    d.create_topic("orders", 4).await;
    let first = d
        .produce(
            "orders",
            json!([{"value": "a"}, {"value": "b"}, {"value": "c"}]),
        )
        .await;
    let second = d
        .produce("orders", json!([{"value": "d"}, {"value": "e"}]))
        .await;
    let partitions: Vec<u32> = first.iter().chain(&second).map(|(p, _)| *p).collect();
    let start = partitions[0];
    let expected: Vec<u32> = (0..5).map(|i| (start + i) % 4).collect();
    assert_eq!(partitions, expected);
}

#[tokio::test]
async fn explicit_partition_is_honoured_over_the_key() {
    let d = Daemon::start().await;
    d.create_topic("orders", 4).await;
    let key_partition = partition_for_key(b"k", 4).unwrap();
    let target = (key_partition + 1) % 4;
    let offsets = d
        .produce(
            "orders",
            json!([{"key": "k", "value": "v", "partition": target}, {"value": "w", "partition": target}]),
        )
        .await;
    assert_eq!(offsets, vec![(target, 0), (target, 1)]);
}

#[tokio::test]
async fn offsets_come_back_in_request_order_and_fetch_returns_the_same_records() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let offsets = d
        .produce(
            "orders",
            json!([
                {"value": "p0-a", "partition": 0},
                {"value": "p1-a", "partition": 1},
                {"value": "p0-b", "partition": 0, "key": ""},
                {"value_b64": "/wA=", "partition": 0, "key_b64": "gA==",
                 "headers": [{"name": "h", "value": "1"}, {"name": "h", "value_b64": "/w=="}]},
                {"value": "p0-d", "partition": 0, "headers": {"trace": "abc"}},
            ]),
        )
        .await;
    assert_eq!(offsets, vec![(0, 0), (1, 0), (0, 1), (0, 2), (0, 3)]);

    let p0 = d.fetch_all("orders", 0).await;
    assert_eq!(p0.len(), 4);
    assert_eq!(p0[0]["offset"], 0);
    assert!(p0[0]["key"].is_null(), "absent key answers null: {}", p0[0]);
    assert_eq!(p0[0]["value"], "p0-a");
    assert_eq!(p0[1]["key"], "", "an empty key is not an absent key");
    assert_eq!(p0[2]["key_b64"], "gA==");
    assert!(p0[2].get("key").is_none());
    assert_eq!(p0[2]["value_b64"], "/wA=");
    assert_eq!(
        p0[2]["headers"],
        json!([{"name": "h", "value": "1"}, {"name": "h", "value_b64": "/w=="}])
    );
    assert_eq!(p0[3]["headers"], json!([{"name": "trace", "value": "abc"}]));
    let times: Vec<i64> = p0
        .iter()
        .map(|r| r["committed_at"].as_i64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(times[0] > 0);
}

/// Sends `body` as a produce request, expects `status`, and checks no partition moved.
#[tokio::test]
async fn a_null_value_stays_apart_from_an_empty_one_and_is_copied_to_children_as_null() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    let (status, body) = d
        .put("/v1/topics/orders/children/copy", json!({"partitions": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    d.produce(
        "orders",
        json!([{"key": "k", "value": null}, {"key": "k", "value": ""}, {"key": "k", "value": "v"}]),
    )
    .await;
    let values = |records: &[Value]| {
        records
            .iter()
            .map(|r| r["value"].clone())
            .collect::<Vec<_>>()
    };
    let expected = [Value::Null, json!(""), json!("v")];
    assert_eq!(values(&d.fetch_all("orders", 0).await), expected);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let copied = d.fetch_all("copy", 0).await;
        if copied.len() >= expected.len() {
            assert_eq!(values(&copied), expected, "the child's copies");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child got {copied:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_daemon_writing_frame_format_1_stores_a_null_value_empty() {
    let d = Daemon::start_with(|c| c.original_frames = true).await;
    d.create_topic("orders", 1).await;
    d.produce("orders", json!([{"value": null}, {"value": "v"}]))
        .await;
    let values: Vec<Value> = d
        .fetch_all("orders", 0)
        .await
        .iter()
        .map(|r| r["value"].clone())
        .collect();
    assert_eq!(
        values,
        [json!(""), json!("v")],
        "what older builds can read"
    );
}

async fn rejected(d: &Daemon, body: Value, status: StatusCode, hint: &str) {
    let before = d.high_watermarks("orders").await;
    let (got, answer) = d.post("/v1/topics/orders/records", body.clone()).await;
    assert_eq!(got, status, "{body}: {answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains(hint),
        "{message:?} should mention {hint:?}"
    );
    assert_eq!(
        d.high_watermarks("orders").await,
        before,
        "{body} wrote records"
    );
}

#[tokio::test]
async fn a_batch_with_one_bad_record_is_rejected_whole() {
    let d = Daemon::start_with(|c| {
        c.limits.max_record_bytes = 100;
        c.limits.max_batch_records = 5;
    })
    .await;
    d.create_topic("orders", 3).await;
    let good = json!({"key": "k", "value": "fine"});
    let cases = [
        (
            json!({"value_b64": "not base64!"}),
            StatusCode::BAD_REQUEST,
            "records[2]: \"value_b64\" is not valid base64",
        ),
        (
            json!({"key_b64": "%%%", "value": "v"}),
            StatusCode::BAD_REQUEST,
            "\"key_b64\" is not valid base64",
        ),
        (
            json!({"key": "k"}),
            StatusCode::BAD_REQUEST,
            "or \"value_b64\" (base64) is required",
        ),
        (
            json!({"key": "k", "key_b64": "aw==", "value": "v"}),
            StatusCode::BAD_REQUEST,
            "not both",
        ),
        (
            json!({"value": "v", "value_b64": "dg=="}),
            StatusCode::BAD_REQUEST,
            "not both",
        ),
        (
            json!({"value": "v", "partition": 3}),
            StatusCode::BAD_REQUEST,
            "partition 3 does not exist",
        ),
        (
            json!({"value": "v", "headers": [{"name": "h"}]}),
            StatusCode::BAD_REQUEST,
            "headers[0]",
        ),
        (
            json!({"value": "v", "headers": [{"name": "h", "value_b64": "?"}]}),
            StatusCode::BAD_REQUEST,
            "headers[0].value_b64",
        ),
        (
            json!({"value": "x".repeat(101)}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "limit is 100",
        ),
        (
            json!({"key": "k".repeat(50), "value": "v".repeat(40), "headers": {"h": "x".repeat(10)}}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "101 bytes",
        ),
        (
            json!({"value": "v", "partiton": 1}),
            StatusCode::BAD_REQUEST,
            "invalid JSON body",
        ),
    ];
    for (bad, status, hint) in cases {
        rejected(
            &d,
            json!({"records": [good.clone(), good.clone(), bad]}),
            status,
            hint,
        )
        .await;
    }
}

#[tokio::test]
async fn malformed_empty_or_oversized_requests_are_rejected_and_write_nothing() {
    let d = Daemon::start_with(|c| {
        c.limits.max_batch_records = 3;
        c.limits.max_request_bytes = 4096;
        c.limits.max_record_bytes = 1024;
    })
    .await;
    d.create_topic("orders", 2).await;
    rejected(
        &d,
        json!({"records": []}),
        StatusCode::BAD_REQUEST,
        "at least one record",
    )
    .await;
    rejected(&d, json!({}), StatusCode::BAD_REQUEST, "invalid JSON body").await;
    rejected(
        &d,
        json!({"records": {"value": "v"}}),
        StatusCode::BAD_REQUEST,
        "invalid JSON body",
    )
    .await;
    let four: Vec<Value> = (0..4).map(|_| json!({"value": "v"})).collect();
    rejected(
        &d,
        json!({"records": four}),
        StatusCode::PAYLOAD_TOO_LARGE,
        "max-batch-records",
    )
    .await;

    let before = d.high_watermarks("orders").await;
    let (status, body) = d
        .post_raw(
            "/v1/topics/orders/records",
            "{\"records\": [{\"value\": \"v\"}",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("invalid JSON body")
    );
    let (status, body) = d
        .post_raw("/v1/topics/orders/records", "x".repeat(5000))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("max-request-bytes")
    );
    assert_eq!(d.high_watermarks("orders").await, before);

    // Without a content type (curl -d) a valid body is still accepted.
    let (status, body) = d
        .post_raw(
            "/v1/topics/orders/records",
            r#"{"records":[{"value":"v","partition":1}]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_each_get_every_record_once_in_key_order() {
    let d = std::sync::Arc::new(Daemon::start().await);
    d.create_topic("orders", 3).await;
    let mut tasks = Vec::new();
    for task in 0..4 {
        let d = std::sync::Arc::clone(&d);
        tasks.push(tokio::spawn(async move {
            for batch in 0..25 {
                let records: Vec<Value> = (0..10)
                    .map(|i| json!({"key": format!("producer-{task}"), "value": format!("{}", batch * 10 + i)}))
                    .collect();
                d.produce("orders", Value::Array(records)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut seen = std::collections::HashMap::<String, Vec<u64>>::new();
    for p in 0..3 {
        let records = d.fetch_all("orders", p).await;
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r["offset"], i, "offsets are contiguous");
            seen.entry(r["key"].as_str().unwrap().to_owned())
                .or_default()
                .push(r["value"].as_str().unwrap().parse().unwrap());
        }
    }
    assert_eq!(seen.len(), 4);
    for (key, values) in seen {
        assert_eq!(
            values,
            (0..250).collect::<Vec<u64>>(),
            "{key}: every record once, in order"
        );
    }
}
