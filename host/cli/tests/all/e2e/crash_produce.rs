//! `kill -9` during produce: every acknowledged record survives, exactly once, in order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::Rng;
use reqwest::Method;
use serde_json::json;

use crate::e2e::harness::{Daemon, fetch_all, http_client, send_json};

const PARTITIONS: u32 = 3;
const CLIENTS: usize = 4;
const ROUNDS: usize = 22;

/// What one client learnt about the records it sent.
#[derive(Default)]
struct ClientLedger {
    /// (partition, offset) -> value, for every record whose produce was acknowledged.
    acknowledged: HashMap<(u32, u64), String>,
    /// Values sent in a request that got no answer: each may or may not be in the log.
    in_doubt: HashSet<String>,
}

fn produce_until_stopped(
    base: String,
    client_id: usize,
    round: usize,
    stop: Arc<AtomicBool>,
) -> ClientLedger {
    let client = http_client();
    let mut ledger = ClientLedger::default();
    let mut rng = crate::e2e::harness::seeded_rng("produce_until_stopped");
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let batch_len = rng.random_range(1..=16);
        let mut values = Vec::with_capacity(batch_len);
        let mut records = Vec::with_capacity(batch_len);
        for _ in 0..batch_len {
            let value = format!("c{client_id}-r{round}-s{seq}");
            seq += 1;
            let record = if rng.random_bool(0.25) {
                json!({"value": value})
            } else {
                json!({"key": format!("key-{}", rng.random_range(0..11)), "value": value})
            };
            values.push(value);
            records.push(record);
        }
        let url = format!("{base}/v1/topics/crash/records");
        match send_json(
            &client,
            Method::POST,
            &url,
            Some(&json!({"records": records})),
        ) {
            Ok((status, body)) if (200..300).contains(&status) => {
                let offsets = body["offsets"].as_array().expect("offsets array");
                assert_eq!(offsets.len(), values.len(), "one offset per record: {body}");
                for (entry, value) in offsets.iter().zip(values) {
                    let partition = entry["partition"].as_u64().expect("partition") as u32;
                    let offset = entry["offset"].as_u64().expect("offset");
                    ledger.acknowledged.insert((partition, offset), value);
                }
            }
            Ok((status, body)) if status >= 500 => {
                // The daemon may be going down; the outcome is unknown.
                ledger.in_doubt.extend(values);
                let _ = body;
            }
            Ok((status, body)) => panic!("produce rejected with {status}: {body}"),
            Err(_) => {
                ledger.in_doubt.extend(values);
                // Connection refused or reset: the daemon is gone until the next round.
                break;
            }
        }
    }
    ledger
}

#[test]
fn acknowledged_records_survive_repeated_kill_9_exactly_once_and_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("data");
    let mut daemon = Daemon::start(&data_dir);
    let client = http_client();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics", daemon.url()),
        Some(&json!({"name": "crash", "partitions": PARTITIONS})),
    )
    .expect("create topic");
    assert!(
        (200..300).contains(&status),
        "create topic: {status} {body}"
    );

    let mut acknowledged: HashMap<(u32, u64), String> = HashMap::new();
    let mut in_doubt: HashSet<String> = HashSet::new();
    let mut rng = crate::e2e::harness::seeded_rng(
        "acknowledged_records_survive_repeated_kill_9_exactly_once_and_in_order",
    );
    for round in 0..ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..CLIENTS)
            .map(|client_id| {
                let base = daemon.url();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || produce_until_stopped(base, client_id, round, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(40..400)));
        daemon.kill9();
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            let ledger = worker.join().expect("producer thread panicked");
            for (slot, value) in ledger.acknowledged {
                assert!(
                    acknowledged.insert(slot, value).is_none(),
                    "offset {slot:?} acknowledged twice"
                );
            }
            in_doubt.extend(ledger.in_doubt);
        }
        daemon.restart();
    }
    assert!(
        acknowledged.len() > 100,
        "the workload acknowledged only {} records",
        acknowledged.len()
    );

    let mut seen_values = HashSet::new();
    for partition in 0..PARTITIONS {
        let records = fetch_all(&client, &daemon.url(), "crash", partition);
        let mut last_seq_per_writer: HashMap<String, u64> = HashMap::new();
        for (index, record) in records.iter().enumerate() {
            let offset = record["offset"].as_u64().expect("offset");
            assert_eq!(
                offset, index as u64,
                "gap or reorder in partition {partition}"
            );
            let value = record["value"].as_str().expect("utf-8 value").to_string();
            assert!(
                seen_values.insert(value.clone()),
                "record {value} stored twice"
            );
            if let Some(expected) = acknowledged.get(&(partition, offset)) {
                assert_eq!(
                    &value, expected,
                    "partition {partition} offset {offset} holds another record"
                );
            } else {
                assert!(in_doubt.contains(&value), "record {value} was never sent");
            }
            // Per writer (client and round), sequence numbers only grow within a partition.
            let (writer, seq) = value.rsplit_once("-s").expect("value format");
            let seq: u64 = seq.parse().expect("sequence number");
            if let Some(previous) = last_seq_per_writer.insert(writer.to_string(), seq) {
                assert!(
                    previous < seq,
                    "{writer}: s{seq} stored after s{previous} in partition {partition}"
                );
            }
        }
    }
    for ((partition, offset), value) in &acknowledged {
        assert!(
            seen_values.contains(value),
            "acknowledged record {value} at {partition}/{offset} is missing"
        );
    }
}
