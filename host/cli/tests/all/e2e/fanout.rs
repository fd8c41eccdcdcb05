//! Fan-out end to end: attach points, delay, and `kill -9` during continuous fan-out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, narad_cli, send_json};

/// How long a child may take to catch up after producers stop. Generous for a busy CI machine;
/// a healthy daemon needs well under a second.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

fn create_topic(client: &reqwest::blocking::Client, base: &str, name: &str, partitions: u32) {
    let (status, body) = send_json(
        client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": name, "partitions": partitions})),
    )
    .expect("create topic");
    ok(status, &body, "create topic");
}

fn attach(
    client: &reqwest::blocking::Client,
    base: &str,
    parent: &str,
    child: &str,
    body: Value,
) -> Value {
    let (status, answer) = send_json(
        client,
        Method::PUT,
        &format!("{base}/v1/topics/{parent}/children/{child}"),
        Some(&body),
    )
    .expect("attach");
    ok(status, &answer, "attach");
    answer
}

fn produce(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    records: Vec<Value>,
) -> Value {
    let (status, body) = send_json(
        client,
        Method::POST,
        &format!("{base}/v1/topics/{topic}/records"),
        Some(&json!({"records": records})),
    )
    .expect("produce");
    ok(status, &body, "produce");
    body
}

/// Waits until every cursor of `parent -> child` reports no lag and, when given, the child
/// holds at least `min_records`.
fn wait_caught_up(client: &reqwest::blocking::Client, base: &str, parent: &str, child: &str) {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    let parent_high = |client: &reqwest::blocking::Client| -> BTreeMap<u64, u64> {
        let (_, body) = send_json(
            client,
            Method::GET,
            &format!("{base}/v1/topics/{parent}"),
            None,
        )
        .expect("describe");
        body["partition_stats"]
            .as_array()
            .expect("partition_stats")
            .iter()
            .map(|p| {
                (
                    p["partition"].as_u64().unwrap_or(0),
                    p["high_watermark"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    loop {
        let high = parent_high(client);
        let (status, body) = send_json(
            client,
            Method::GET,
            &format!("{base}/v1/topics/{parent}/children"),
            None,
        )
        .expect("children");
        ok(status, &body, "children");
        let link = body["children"]
            .as_array()
            .and_then(|children| children.iter().find(|c| c["name"] == child).cloned());
        if let Some(link) = link {
            let partitions = link["partitions"].as_array().cloned().unwrap_or_default();
            let caught_up = partitions.len() == high.len()
                && partitions.iter().all(|p| {
                    let partition = p["partition"].as_u64().unwrap_or(u64::MAX);
                    p["next_offset"].as_u64().is_some()
                        && p["next_offset"].as_u64() == high.get(&partition).copied()
                });
            if caught_up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{parent} -> {child} did not catch up: {link}"
            );
        } else {
            assert!(
                Instant::now() < deadline,
                "{parent} -> {child} is not listed: {body}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn values_of(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["value"].as_str().expect("utf-8 value").to_string())
        .collect()
}

#[test]
fn attach_copies_exactly_from_the_attach_point_and_new_partitions_from_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(&dir.path().join("data"));
    let base = daemon.url();
    let client = http_client();
    create_topic(&client, &base, "orders", 2);
    produce(
        &client,
        &base,
        "orders",
        (0..10)
            .map(|i| json!({"value": format!("before-{i}")}))
            .collect(),
    );

    let answer = attach(&client, &base, "orders", "copy", json!({"partitions": 2}));
    let attach_offsets: Vec<u64> = answer["attach_offsets"]
        .as_array()
        .expect("attach_offsets")
        .iter()
        .map(|v| v.as_u64().expect("offset"))
        .collect();
    assert_eq!(
        attach_offsets.iter().sum::<u64>(),
        10,
        "attach offsets are the high watermarks: {answer}"
    );
    assert_eq!(answer["attach_epoch"].as_str().map(str::len), Some(16));

    produce(
        &client,
        &base,
        "orders",
        (0..10)
            .map(|i| json!({"value": format!("after-{i}")}))
            .collect(),
    );
    // Grow the parent: the new partition's records are all copied.
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics/orders/partitions"),
        Some(&json!({"count": 3})),
    )
    .expect("grow");
    ok(status, &body, "grow");
    produce(
        &client,
        &base,
        "orders",
        vec![json!({"value": "new-partition", "partition": 2})],
    );
    wait_caught_up(&client, &base, "orders", "copy");

    let mut copied: Vec<String> = Vec::new();
    for partition in 0..2 {
        copied.extend(values_of(&fetch_all(&client, &base, "copy", partition)));
    }
    copied.sort();
    let mut expected: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    expected.push("new-partition".into());
    expected.sort();
    assert_eq!(
        copied, expected,
        "exactly the records from the attach point on"
    );
}

#[test]
fn a_delay_child_never_receives_a_record_before_it_is_due() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(&dir.path().join("data"));
    let base = daemon.url();
    let client = http_client();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": "jobs", "partitions": 1, "retention_ms": 7_200_000u64})),
    )
    .expect("create");
    ok(status, &body, "create jobs");
    const DELAY_MS: i64 = 1_500;
    attach(
        &client,
        &base,
        "jobs",
        "later",
        json!({"partitions": 1, "delay_ms": DELAY_MS}),
    );
    for i in 0..5 {
        produce(
            &client,
            &base,
            "jobs",
            vec![json!({"key": "k", "value": format!("job-{i}")})],
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_caught_up(&client, &base, "jobs", "later");
    let parent = fetch_all(&client, &base, "jobs", 0);
    let child = fetch_all(&client, &base, "later", 0);
    assert_eq!(values_of(&child), values_of(&parent));
    for (p, c) in parent.iter().zip(&child) {
        let parent_at = p["committed_at"].as_i64().expect("committed_at");
        let child_at = c["committed_at"].as_i64().expect("committed_at");
        assert!(
            child_at >= parent_at + DELAY_MS,
            "{} copied {} ms after its commit, before its {DELAY_MS} ms delay",
            c["value"],
            child_at - parent_at
        );
    }
}

/// Values are `w{writer}-r{round}-s{seq}`; keys `key-{n}` or none.
fn producer(base: String, writer: usize, round: usize, stop: Arc<AtomicBool>) {
    let client = http_client();
    let mut rng = crate::e2e::harness::seeded_rng("producer");
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let records: Vec<Value> = (0..rng.random_range(1..=20))
            .map(|_| {
                seq += 1;
                let value = format!("w{writer}-r{round}-s{seq}");
                let mut record = if rng.random_bool(0.2) {
                    json!({"value": value})
                } else {
                    json!({"key": format!("key-{}", rng.random_range(0..13)), "value": value})
                };
                if rng.random_bool(0.3) {
                    let region = ["us", "eu", "apac"][rng.random_range(0..3)];
                    record["headers"] = json!({"region": region});
                }
                record
            })
            .collect();
        match send_json(
            &client,
            Method::POST,
            &format!("{base}/v1/topics/orders/records"),
            Some(&json!({"records": records})),
        ) {
            Ok((status, _)) if (200..300).contains(&status) => {}
            _ => return,
        }
    }
}

/// `header-route` config of the custom-chain child.
const REGION_CONFIG: &str = "header = region\nus = 0\neu = 1\n* = 2\n";

/// Every parent record from the attach point is in `child` (and nothing else is), each in the
/// partition `place` says.
fn check_complete(
    client: &reqwest::blocking::Client,
    base: &str,
    child: &str,
    child_partitions: u32,
    parent_partitions: u32,
    attach_offsets: &[u64],
    place: impl Fn(&Value) -> Option<u32>,
) {
    let mut expected: HashMap<String, Value> = HashMap::new();
    for partition in 0..parent_partitions {
        for record in fetch_all(client, base, "orders", partition) {
            if record["offset"].as_u64().expect("offset") >= attach_offsets[partition as usize] {
                expected.insert(record["value"].as_str().expect("value").to_string(), record);
            }
        }
    }
    let mut seen = HashSet::new();
    let mut stored = 0usize;
    for partition in 0..child_partitions {
        for record in fetch_all(client, base, child, partition) {
            stored += 1;
            let value = record["value"].as_str().expect("value").to_string();
            let parent = expected
                .get(&value)
                .unwrap_or_else(|| panic!("{child} holds {value}, not expected"));
            let origin = &record["origin"];
            assert_eq!(
                origin["offset"], parent["offset"],
                "{child}: origin of {value}"
            );
            if let Some(want) = place(parent) {
                assert_eq!(want, partition, "{child}: {value} in partition {partition}");
            }
            seen.insert(value);
        }
    }
    assert_eq!(
        seen.len(),
        expected.len(),
        "{child}: {} of {} records",
        seen.len(),
        expected.len()
    );
    assert_eq!(
        stored,
        seen.len(),
        "{child}: each record once, no duplicates"
    );
}

#[test]
fn children_hold_every_parent_record_after_repeated_kill_9_in_key_order() {
    const ROUNDS: usize = 30;
    const PARENT_PARTITIONS: u32 = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start(&dir.path().join("data"));
    let client = http_client();
    create_topic(&client, &daemon.url(), "orders", PARENT_PARTITIONS);
    produce(
        &client,
        &daemon.url(),
        "orders",
        (0..8)
            .map(|i| json!({"key": "old", "value": format!("pre-{i}")}))
            .collect(),
    );
    // Different partition count: keyless records go round-robin. Same count: they keep their
    // parent partition index.
    let children = [("spread", 3u32), ("mirror", PARENT_PARTITIONS)];
    let mut attach_offsets: HashMap<&str, Vec<u64>> = HashMap::new();
    // A custom chain: a header decides first, the built-ins take the rest.
    let answer = attach(
        &client,
        &daemon.url(),
        "orders",
        "by-region",
        json!({
            "partitions": 3,
            "router": ["header-route", "key-hash", "round-robin"],
            "config": REGION_CONFIG,
        }),
    );
    attach_offsets.insert(
        "by-region",
        answer["attach_offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .filter_map(Value::as_u64)
            .collect(),
    );
    for (child, partitions) in children {
        let answer = attach(
            &client,
            &daemon.url(),
            "orders",
            child,
            json!({"partitions": partitions}),
        );
        attach_offsets.insert(
            child,
            answer["attach_offsets"]
                .as_array()
                .expect("offsets")
                .iter()
                .filter_map(Value::as_u64)
                .collect(),
        );
    }

    let mut rng = crate::e2e::harness::seeded_rng(
        "children_hold_every_parent_record_after_repeated_kill_9_in_key_order",
    );
    for round in 0..ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|writer| {
                let (base, stop) = (daemon.url(), Arc::clone(&stop));
                std::thread::spawn(move || producer(base, writer, round, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(50..500)));
        daemon.kill9();
        stop.store(true, Ordering::Relaxed);
        for writer in writers {
            writer.join().expect("producer panicked");
        }
        daemon.restart();
    }

    let base = daemon.url();
    for (child, child_partitions) in children {
        wait_caught_up(&client, &base, "orders", child);
        // Parent records at or after the attach point, per key in parent order.
        let mut expected: HashSet<String> = HashSet::new();
        let mut parent_order: HashMap<String, Vec<String>> = HashMap::new();
        let mut keyless_partition: HashMap<String, u32> = HashMap::new();
        for partition in 0..PARENT_PARTITIONS {
            let start = attach_offsets[child][partition as usize];
            for record in fetch_all(&client, &base, "orders", partition) {
                let offset = record["offset"].as_u64().expect("offset");
                let value = record["value"].as_str().expect("value").to_string();
                if offset < start {
                    continue;
                }
                expected.insert(value.clone());
                match record["key"].as_str() {
                    Some(key) => parent_order.entry(key.to_string()).or_default().push(value),
                    None => {
                        keyless_partition.insert(value, partition);
                    }
                }
            }
        }
        let mut seen: HashSet<String> = HashSet::new();
        let mut child_order: HashMap<String, Vec<String>> = HashMap::new();
        let mut stored = 0usize;
        for partition in 0..child_partitions {
            for record in fetch_all(&client, &base, child, partition) {
                stored += 1;
                let value = record["value"].as_str().expect("value").to_string();
                assert!(
                    expected.contains(&value),
                    "{child} holds {value}, which is before the attach point or unknown"
                );
                match record["key"].as_str() {
                    Some(key) => {
                        let want = narad_abi::partition_for_key(key.as_bytes(), child_partitions);
                        assert_eq!(
                            want,
                            Some(partition),
                            "{child}: key {key} in partition {partition}"
                        );
                        if seen.insert(value.clone()) {
                            child_order.entry(key.to_string()).or_default().push(value);
                        }
                    }
                    None => {
                        if child_partitions == PARENT_PARTITIONS {
                            assert_eq!(
                                keyless_partition.get(&value),
                                Some(&partition),
                                "{child}: keyless {value} left its parent index"
                            );
                        }
                        seen.insert(value);
                    }
                }
            }
        }
        let missing: Vec<&String> = expected.difference(&seen).take(5).collect();
        assert!(
            missing.is_empty(),
            "{child} is missing {} records, e.g. {missing:?}",
            expected.len() - seen.len()
        );
        // Each parent record once: the slabs a restarted cursor repeats are absorbed.
        assert_eq!(
            stored - seen.len(),
            0,
            "{child} holds {stored} records for {} parent records: duplicates",
            seen.len()
        );
        for (key, order) in &parent_order {
            assert_eq!(
                child_order.get(key),
                Some(order),
                "{child}: order of key {key}"
            );
        }
        assert!(
            expected.len() > 200,
            "the workload produced only {} records",
            expected.len()
        );
    }

    wait_caught_up(&client, &base, "orders", "by-region");
    check_complete(
        &client,
        &base,
        "by-region",
        3,
        PARENT_PARTITIONS,
        &attach_offsets["by-region"],
        |record| {
            let region = record["headers"]
                .as_array()
                .and_then(|headers| headers.iter().find(|h| h["name"] == "region"))
                .and_then(|h| h["value"].as_str().map(str::to_string));
            match (region.as_deref(), record["key"].as_str()) {
                (Some("us"), _) => Some(0),
                (Some("eu"), _) => Some(1),
                (Some(_), _) => Some(2),
                (None, Some(key)) => narad_abi::partition_for_key(key.as_bytes(), 3),
                (None, None) => None,
            }
        },
    );
}

/// Waits until every listed cursor of `parent -> child` reports `state`, with `lag` records of
/// lag each when given; returns the link's listing entry.
fn wait_for_state(
    client: &reqwest::blocking::Client,
    base: &str,
    parent: &str,
    child: &str,
    state: &str,
    lag: Option<u64>,
) -> Value {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    loop {
        let (_, body) = send_json(
            client,
            Method::GET,
            &format!("{base}/v1/topics/{parent}/children"),
            None,
        )
        .expect("children");
        let link = body["children"]
            .as_array()
            .and_then(|children| children.iter().find(|c| c["name"] == child).cloned())
            .unwrap_or(Value::Null);
        let partitions = link["partitions"].as_array().cloned().unwrap_or_default();
        let done = !partitions.is_empty()
            && partitions.iter().all(|p| {
                p["state"] == state && lag.is_none_or(|l| p["lag_messages"].as_u64() == Some(l))
            });
        if done {
            return link;
        }
        assert!(
            Instant::now() < deadline,
            "{parent} -> {child} never reached {state} (lag {lag:?}): {link}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_paused_child_stays_paused_across_a_restart_and_resumes_with_every_record_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start(dir.path());
    let client = http_client();
    let base = daemon.url();
    create_topic(&client, &base, "orders", 1);
    create_topic(&client, &base, "copy", 1);
    attach(&client, &base, "orders", "copy", json!({}));
    let batch = |from: u32, to: u32| -> Vec<Value> {
        (from..to)
            .map(|i| json!({"value": format!("v{i}")}))
            .collect()
    };
    produce(&client, &base, "orders", batch(0, 10));
    wait_caught_up(&client, &base, "orders", "copy");

    // A seek needs a paused cursor.
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics/orders/children/copy/seek"),
        Some(&json!({"partition": 0, "offset": 5})),
    )
    .expect("seek");
    assert_eq!(status, 409, "{body}");
    // A pause with no body pauses every partition.
    let answer = client
        .post(format!("{base}/v1/topics/orders/children/copy/pause"))
        .send()
        .expect("pause");
    assert_eq!(answer.status().as_u16(), 200);
    let link: Value = answer.json().expect("pause answer");
    assert_eq!(link["paused"], json!([0]), "{link}");
    wait_for_state(&client, &base, "orders", "copy", "paused", Some(0));
    produce(&client, &base, "orders", batch(10, 30));
    let listed = wait_for_state(&client, &base, "orders", "copy", "paused", Some(20));
    assert_eq!(listed["paused"], json!([0]), "{listed}");

    // The pause lives in the metadata: a restart (records still arriving) keeps it.
    daemon.restart();
    let base = daemon.url();
    produce(&client, &base, "orders", batch(30, 40));
    wait_for_state(&client, &base, "orders", "copy", "paused", Some(30));
    assert_eq!(values_of(&fetch_all(&client, &base, "copy", 0)).len(), 10);
    // The paused cursor, restarted, still takes a seek (here to where it stands).
    let (status, done) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics/orders/children/copy/seek"),
        Some(&json!({"partition": 0, "offset": 10})),
    )
    .expect("seek");
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        (done["from"].as_u64(), done["to"].as_u64()),
        (Some(10), Some(10)),
        "{done}"
    );

    // The CLI resumes it; every record arrives exactly once.
    let out = std::process::Command::new(crate::e2e::harness::narad_binary())
        .args(["child", "--url", &base, "resume", "orders", "copy"])
        .output()
        .expect("narad child resume");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("every cursor copies"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    wait_caught_up(&client, &base, "orders", "copy");
    let copied = values_of(&fetch_all(&client, &base, "copy", 0));
    let wanted: Vec<String> = (0..40).map(|i| format!("v{i}")).collect();
    assert_eq!(copied, wanted);
}

/// The oldest offset `topic`'s partition 0 still stores.
fn log_start(client: &reqwest::blocking::Client, base: &str, topic: &str) -> u64 {
    let (status, body) = send_json(
        client,
        Method::GET,
        &format!("{base}/v1/topics/{topic}"),
        None,
    )
    .expect("describe");
    ok(status, &body, "describe");
    body["partition_stats"][0]["log_start_offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("no log start: {body}"))
}

/// The ranges on the link's gap ledger, and the records it counts lost.
fn ledger(
    client: &reqwest::blocking::Client,
    base: &str,
    parent: &str,
    child: &str,
) -> (Value, Value) {
    let (status, body) = send_json(
        client,
        Method::GET,
        &format!("{base}/v1/topics/{parent}/children/{child}/gaps"),
        None,
    )
    .expect("gaps");
    ok(status, &body, "gaps");
    let ranges: Vec<Value> = body["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["gaps"].as_array().cloned().unwrap_or_default())
        .map(|g| json!({"from": g["from"], "to": g["to"], "reason": g["reason"]}))
        .collect();
    (Value::Array(ranges), body["lost"].clone())
}

#[test]
fn a_child_that_halts_on_a_gap_skips_nothing_until_an_operator_accepts_it_then_ledgers_it_exactly()
{
    let dir = tempfile::tempdir().expect("tempdir");
    // Small segments and quick retention passes, so retention overtakes a paused child.
    let mut daemon = Daemon::start_with(
        dir.path(),
        &[
            "--segment-bytes",
            "512",
            "--retention-check-interval-ms",
            "100",
        ],
    );
    let client = http_client();
    let base = daemon.url();
    create_topic(&client, &base, "orders", 1);
    create_topic(&client, &base, "copy", 1);
    let attached = narad_cli(
        &base,
        &["child", "attach", "orders", "copy", "--on-gap", "halt"],
    );
    assert!(attached.contains("attached"), "{attached}");
    let paused = narad_cli(&base, &["child", "pause", "orders", "copy"]);
    assert!(paused.contains("paused"), "{paused}");
    // Batches of ten: a segment rolls between batches, never inside one.
    for batch in 0..20 {
        let records: Vec<Value> = (batch * 10..batch * 10 + 10)
            .map(|i| json!({"value": format!("record-{i:04}")}))
            .collect();
        produce(&client, &base, "orders", records);
    }
    narad_cli(&base, &["topic", "set", "orders", "--retention-bytes", "1"]);
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    let lost = loop {
        let start = log_start(&client, &base, "orders");
        if start > 0 {
            // Let the pass finish: only the active segment stays.
            std::thread::sleep(Duration::from_millis(500));
            let settled = log_start(&client, &base, "orders");
            if settled == start {
                break start;
            }
            continue;
        }
        assert!(Instant::now() < deadline, "retention never ran");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(lost < 200, "the active segment stays: {lost}");

    // Resumed, the cursor halts before the records retention took: nothing skipped, nothing
    // on the ledger, nothing copied, also after a restart.
    narad_cli(&base, &["child", "resume", "orders", "copy"]);
    let link = wait_for_state(&client, &base, "orders", "copy", "halted", None);
    assert_eq!(link["on_gap"], "halt", "{link}");
    let cursor = &link["partitions"][0];
    assert_eq!(
        cursor["halted_gap"],
        json!({"from": 0, "to": lost}),
        "{link}"
    );
    assert_eq!(cursor["next_offset"], 0, "{link}");
    assert_eq!(cursor["dropped_messages"], 0, "{link}");
    assert!(
        cursor["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("--accept-gap")),
        "the listing says how to go on: {link}"
    );
    let listing = narad_cli(&base, &["child", "list", "orders"]);
    assert!(listing.contains("halted"), "{listing}");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("narad_fanout_cursor_state{")
                && l.contains("state=\"halted\"")
                && l.ends_with(" 1")),
        "the halted state is on /metrics"
    );
    daemon.restart();
    let base = daemon.url();
    wait_for_state(&client, &base, "orders", "copy", "halted", None);
    assert_eq!(
        ledger(&client, &base, "orders", "copy"),
        (json!([]), json!(0))
    );
    assert!(fetch_all(&client, &base, "copy", 0).is_empty());

    // The operator accepts: the cursor skips exactly what retention took, writes it on the
    // ledger, and copies the rest in order.
    let accepted = narad_cli(
        &base,
        &["child", "resume", "orders", "copy", "--accept-gap"],
    );
    assert!(
        accepted.contains(&format!(
            "accepted the loss of offsets 0 to {lost} ({lost} records"
        )),
        "{accepted}"
    );
    wait_caught_up(&client, &base, "orders", "copy");
    let copied = values_of(&fetch_all(&client, &base, "copy", 0));
    let wanted: Vec<String> = (lost..200).map(|i| format!("record-{i:04}")).collect();
    assert_eq!(copied, wanted);
    assert_eq!(
        ledger(&client, &base, "orders", "copy"),
        (
            json!([{"from": 0, "to": lost, "reason": "retention"}]),
            json!(lost)
        )
    );
    let again = narad_cli(
        &base,
        &["child", "resume", "orders", "copy", "--accept-gap"],
    );
    assert!(again.contains("no cursor was halted"), "{again}");
}
