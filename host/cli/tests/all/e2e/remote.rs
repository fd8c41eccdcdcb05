//! Remote children end to end: a link whose child is a topic of another `narad serve`, fed
//! through that daemon's batch produce, under `kill -9` of the target and of the source.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, send_json};

/// Longest wait for records to arrive on the target.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);

/// Keys the producer cycles through.
const KEYS: u64 = 16;

fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

fn create(base: &str, name: &str, partitions: u32) {
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": name, "partitions": partitions})),
    )
    .expect("create");
    ok(status, &body, "create");
}

fn attach(base: &str, body: &Value) -> (u16, Value) {
    send_json(
        &http_client(),
        Method::PUT,
        &format!("{base}/v1/topics/orders/children/to-b"),
        Some(body),
    )
    .expect("attach")
}

/// Produces keyed records `v{n}` (key `k{n % 16}`) through `base` until `stop`, 20 per request
/// 20 ms apart; returns the values whose produce was acknowledged.
fn produce_until(base: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<u64>> {
    produce_batches(base, 0, 20, Duration::from_millis(20), stop)
}

/// [`produce_until`] numbering from `first`, `batch` records per request, `pause` apart.
fn produce_batches(
    base: String,
    first: u64,
    batch: u64,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let client = http_client();
        let (mut acknowledged, mut n) = (Vec::new(), first);
        while !stop.load(Ordering::Relaxed) {
            let values: Vec<u64> = (n..n + batch).collect();
            n += batch;
            let records: Vec<Value> = values
                .iter()
                .map(|i| json!({"key": format!("k{}", i % KEYS), "value": format!("v{i}")}))
                .collect();
            if let Ok((200, _)) = send_json(
                &client,
                Method::POST,
                &format!("{base}/v1/topics/orders/records"),
                Some(&json!({"records": records})),
            ) {
                acknowledged.extend(values);
            }
            std::thread::sleep(pause);
        }
        acknowledged
    })
}

/// Every record of the target topic: (partition, key, value number, origin header).
fn target_records(base: &str) -> Vec<(u32, String, u64, String)> {
    let client = http_client();
    let mut out = Vec::new();
    for p in 0..3 {
        for r in fetch_all(&client, base, "orders-copy", p) {
            let value = r["value"].as_str().expect("value");
            let n: u64 = value.trim_start_matches('v').parse().expect("v{n}");
            let origin = r["headers"]
                .as_array()
                .and_then(|h| h.iter().find(|h| h["name"] == "narad-origin"))
                .and_then(|h| h["value"].as_str())
                .unwrap_or("")
                .to_owned();
            out.push((p, r["key"].as_str().unwrap_or("").to_owned(), n, origin));
        }
    }
    out
}

fn listing(base: &str) -> Value {
    let (_, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{base}/v1/topics/orders/children"),
        None,
    )
    .expect("children");
    body["children"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "to-b").cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn a_remote_child_gets_every_record_in_key_order_through_crashes_of_its_target_and_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = Daemon::start(&dir.path().join("a"));
    let mut b = Daemon::start(&dir.path().join("b"));
    create(&a.url(), "orders", 2);
    create(&b.url(), "orders-copy", 3);

    // Refused, with nothing recorded: a target topic that does not exist, a target that
    // does not answer.
    let (status, body) = attach(
        &a.url(),
        &json!({"remote": {"url": b.url(), "topic": "nope"}}),
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = attach(
        &a.url(),
        &json!({"remote": {"url": "http://127.0.0.1:9", "topic": "orders-copy"}}),
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        listing(&a.url()),
        Value::Null,
        "a refused attach left a link"
    );

    let (status, link) = attach(
        &a.url(),
        &json!({"remote": {"url": b.url(), "topic": "orders-copy"}}),
    );
    ok(status, &link, "attach");
    assert_eq!(link["remote"]["partitions"], 3, "{link}");

    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce_until(a.url(), Arc::clone(&stop));
    std::thread::sleep(Duration::from_millis(800));

    // The target dies: the link waits on it and says so; the source keeps taking records.
    b.kill9();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let link = listing(&a.url());
        let errors: Vec<&str> = link["partitions"]
            .as_array()
            .map(|p| p.iter().filter_map(|p| p["last_error"].as_str()).collect())
            .unwrap_or_default();
        let retrying = link["partitions"].as_array().is_some_and(|p| {
            p.iter()
                .any(|p| p["remote_state"] == "retrying" && p["recovery_point"].is_u64())
        });
        if retrying
            && errors
                .iter()
                .any(|e| e.contains("retrying") && e.contains("orders-copy"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "no retrying state: {link}");
        std::thread::sleep(Duration::from_millis(100));
    }
    b.restart_same_port();
    std::thread::sleep(Duration::from_millis(500));
    // The source dies mid-stream too; its cursors resume from their offset files.
    a.restart_same_port();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let acknowledged = producer.join().expect("producer");
    assert!(
        acknowledged.len() > 100,
        "{} acknowledged",
        acknowledged.len()
    );

    // Every acknowledged record reaches the target, never a gap.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let records = loop {
        let records = target_records(&b.url());
        let held: HashSet<u64> = records.iter().map(|r| r.2).collect();
        let missing: Vec<&u64> = acknowledged.iter().filter(|n| !held.contains(n)).collect();
        if missing.is_empty() {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "the target misses {} of {} acknowledged records (first v{}); source log:\n{}",
            missing.len(),
            acknowledged.len(),
            missing[0],
            a.log()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };

    // Each once: the slabs the source repeats after its crash, and the requests whose answer
    // the target's death cut off, are not stored twice (the target knows a copy by its
    // `narad-origin` header and its content).
    let origins: HashSet<&String> = records.iter().map(|r| &r.3).collect();
    assert_eq!(
        origins.len(),
        records.len(),
        "the target holds {} records for {} origins",
        records.len(),
        origins.len()
    );

    // One partition per key, and per key the first copies in production order.
    let mut by_key: BTreeMap<String, (HashSet<u32>, Vec<u64>)> = BTreeMap::new();
    for (partition, key, n, origin) in &records {
        let parts: Vec<&str> = origin.split('/').collect();
        assert_eq!(parts.len(), 4, "origin header {origin:?}");
        assert!(parts[0].starts_with("node:"), "{origin}");
        let entry = by_key.entry(key.clone()).or_default();
        entry.0.insert(*partition);
        entry.1.push(*n);
    }
    assert_eq!(by_key.len() as u64, KEYS);
    for (key, (partitions, values)) in by_key {
        assert_eq!(partitions.len(), 1, "{key} on partitions {partitions:?}");
        let mut seen = HashSet::new();
        let firsts: Vec<u64> = values.into_iter().filter(|n| seen.insert(*n)).collect();
        assert!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "{key} out of order on the target: {firsts:?}"
        );
    }
    let link = listing(&a.url());
    assert_eq!(link["remote"]["topic"], "orders-copy", "{link}");
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while !listing(&a.url())["partitions"]
        .as_array()
        .is_some_and(|p| p.len() == 2 && p.iter().all(|p| p["remote_state"] == "running"))
    {
        assert!(Instant::now() < deadline, "{}", listing(&a.url()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, metrics) = send_json(
        &http_client(),
        Method::GET,
        &format!("{}/metrics", a.url()),
        None,
    )
    .expect("metrics");
    let sent: f64 = metrics
        .as_str()
        .unwrap_or("")
        .lines()
        .filter(|l| l.starts_with("narad_fanout_remote_sent_bytes_total{") && l.contains("to-b"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(sent > 0.0, "no bytes counted as sent:\n{metrics}");
}

#[test]
fn a_remote_child_whose_target_topic_is_gone_fails_without_skipping_and_resumes_once_it_is_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Daemon::start(&dir.path().join("a"));
    let b = Daemon::start(&dir.path().join("b"));
    create(&a.url(), "orders", 2);
    create(&b.url(), "orders-copy", 3);
    let (status, link) = attach(
        &a.url(),
        &json!({"remote": {"url": b.url(), "topic": "orders-copy"}}),
    );
    ok(status, &link, "attach");
    let produce = |from: u64, to: u64| {
        let records: Vec<Value> = (from..to)
            .map(|i| json!({"key": format!("k{}", i % KEYS), "value": format!("v{i}")}))
            .collect();
        let (status, body) = send_json(
            &http_client(),
            Method::POST,
            &format!("{}/v1/topics/orders/records", a.url()),
            Some(&json!({"records": records})),
        )
        .expect("produce");
        ok(status, &body, "produce");
    };
    let wait_for_target = |wanted: std::ops::Range<u64>| {
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            let held: HashSet<u64> = target_records(&b.url()).iter().map(|r| r.2).collect();
            if wanted.clone().all(|n| held.contains(&n)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the target misses some of {wanted:?}: {}",
                listing(&a.url())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    produce(0, 40);
    wait_for_target(0..40);

    // The target topic goes away: the link is `failed`, names the refusal, and stays put.
    let (status, body) = send_json(
        &http_client(),
        Method::DELETE,
        &format!("{}/v1/topics/orders-copy", b.url()),
        None,
    )
    .expect("delete");
    ok(status, &body, "delete the target topic");
    produce(40, 80);
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let failed = loop {
        let link = listing(&a.url());
        let failed: Vec<Value> = link["partitions"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter(|p| p["remote_state"] == "failed")
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if !failed.is_empty() {
            break failed;
        }
        assert!(Instant::now() < deadline, "never failed: {link}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for p in &failed {
        let error = p["last_error"].as_str().unwrap_or("");
        assert!(error.starts_with("failed:") && error.contains("404"), "{p}");
        // Nothing past the undelivered records: the recovery point holds below them.
        assert!(p["recovery_point"].as_u64().is_some(), "{p}");
        assert!(p["lag_messages"].as_u64().unwrap_or(0) > 0, "{p}");
    }

    // Back: the held records go through, none skipped.
    create(&b.url(), "orders-copy", 3);
    wait_for_target(40..80);
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while !listing(&a.url())["partitions"]
        .as_array()
        .is_some_and(|p| p.iter().all(|p| p["remote_state"] == "running"))
    {
        assert!(Instant::now() < deadline, "{}", listing(&a.url()));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_remote_child_stores_each_copy_once_through_repeated_kill_9_of_its_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = Daemon::start(&dir.path().join("a"));
    let b = Daemon::start(&dir.path().join("b"));
    create(&a.url(), "orders", 2);
    create(&b.url(), "orders-copy", 3);
    let (status, link) = attach(
        &a.url(),
        &json!({"remote": {"url": b.url(), "topic": "orders-copy"}}),
    );
    ok(status, &link, "attach");
    let mut acknowledged = Vec::new();
    for round in 0..20u64 {
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..2)
            .map(|w| {
                let first = (round * 2 + w) * 1_000_000;
                produce_batches(a.url(), first, 200, Duration::ZERO, Arc::clone(&stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150 + 40 * (round % 5)));
        // Mid-copy: the restarted cursors send again what their offset files do not cover.
        a.restart_same_port();
        stop.store(true, Ordering::Relaxed);
        for producer in producers {
            acknowledged.extend(producer.join().expect("producer"));
        }
    }
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let records = loop {
        let records = target_records(&b.url());
        let held: HashSet<u64> = records.iter().map(|r| r.2).collect();
        if acknowledged.iter().all(|n| held.contains(n)) {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "the target misses acknowledged records"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Let the cursors settle: a repeat would come after the last acknowledged record.
    std::thread::sleep(Duration::from_secs(1));
    let records = {
        let again = target_records(&b.url());
        if again.len() >= records.len() {
            again
        } else {
            records
        }
    };
    let origins: HashSet<&String> = records.iter().map(|r| &r.3).collect();
    assert!(
        acknowledged.len() > 200,
        "{} acknowledged",
        acknowledged.len()
    );
    assert_eq!(
        origins.len(),
        records.len(),
        "the target holds {} records for {} origins: duplicates",
        records.len(),
        origins.len()
    );
}

#[test]
fn a_remote_child_reaches_a_tls_target_signed_by_a_private_ca_given_with_its_ca_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (target, ca) = super::tls::tls_daemon(dir, "b", &[]);
    let source = Daemon::start(&dir.join("a"));
    let (a, b) = (source.url(), target.url());
    assert!(b.starts_with("https://"), "{b}");
    let tls = super::harness::tls_client(Some(&ca), None);
    let (status, body) = send_json(
        &tls,
        Method::POST,
        &format!("{b}/v1/topics"),
        Some(&json!({"name": "orders-copy", "partitions": 3})),
    )
    .expect("create the target topic");
    ok(status, &body, "create the target topic");
    create(&a, "orders", 2);

    // Without the CA file the target's certificate is not trusted: the attach says so and
    // creates nothing.
    let (status, body) = attach(&a, &json!({"remote": {"url": b, "topic": "orders-copy"}}));
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("certificate"),
        "the refusal does not name the certificate: {body}"
    );
    // With it, the copies arrive.
    let ca_file = ca.display().to_string();
    let (status, body) = attach(
        &a,
        &json!({"remote": {"url": b, "topic": "orders-copy", "ca_file": ca_file}}),
    );
    ok(status, &body, "attach with the CA file");
    assert_eq!(body["remote"]["ca_file"], ca_file, "{body}");
    let records: Vec<Value> = (0..20)
        .map(|i| json!({"key": format!("k{i}"), "value": format!("v{i}")}))
        .collect();
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{a}/v1/topics/orders/records"),
        Some(&json!({"records": records})),
    )
    .expect("produce");
    ok(status, &body, "produce");
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let copied: usize = (0..3)
            .map(|p| fetch_all(&tls, &b, "orders-copy", p).len())
            .sum();
        if copied == 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{copied} of 20 copies on the TLS target: {}",
            listing(&a)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
