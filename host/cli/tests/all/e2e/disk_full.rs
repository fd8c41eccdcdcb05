//! A real disk that runs out of space under the daemon: ext4 without a journal on a loop device
//! whose backing file lives on a small tmpfs, so the file system believes it has room while the
//! device underneath refuses writes. Produces fail, partitions fail and reopen, space comes
//! back; after a `kill -9`, an unmount, an `e2fsck` repair (the refused metadata writes leave
//! the file system inconsistent) and a mount, every acknowledged record is still there, no
//! partition is quarantined, and the child holds every acknowledged parent record.
//!
//! Needs root (mount, losetup, e2fsck); it fails, loudly, without it. The mounts and the loop
//! device are removed by a guard whatever happens.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, send_json};
use crate::full_device::DiskFullFs;

/// Records per produce request and bytes per record value.
const RECORDS_PER_PRODUCE: usize = 8;
const VALUE_BYTES: usize = 2000;
/// How long to keep producing after the first failed produce (failed partitions reopen every
/// 200 ms meanwhile), and after space is freed.
const PRODUCE_WHILE_FULL: Duration = Duration::from_secs(4);
const PRODUCE_AFTER_FREE: Duration = Duration::from_secs(3);
/// Longest time the child may take to catch up after the restart.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

/// What the producer learnt: acknowledged records by (partition, offset), and how produces
/// ended.
#[derive(Default)]
struct Ledger {
    acknowledged: BTreeMap<(u32, u64), String>,
    failed_produces: u64,
    /// Whether a failed produce's error said what to do about the device (the storage
    /// layer's advice for a full disk or a failing device).
    failure_advised: bool,
    seq: u64,
}

impl Ledger {
    /// One produce of [`RECORDS_PER_PRODUCE`] records; true if it was acknowledged.
    fn produce(&mut self, client: &reqwest::blocking::Client, base: &str) -> bool {
        let values: Vec<String> = (0..RECORDS_PER_PRODUCE)
            .map(|_| {
                self.seq += 1;
                let head = format!("v{:08}-", self.seq);
                let pad = "x".repeat(VALUE_BYTES - head.len());
                format!("{head}{pad}")
            })
            .collect();
        let records: Vec<Value> = values.iter().map(|v| json!({"value": v})).collect();
        let answer = send_json(
            client,
            Method::POST,
            &format!("{base}/v1/topics/parent/records"),
            Some(&json!({"records": records})),
        );
        match answer {
            Ok((status, body)) if (200..300).contains(&status) => {
                let offsets = body["offsets"].as_array().expect("offsets");
                assert_eq!(offsets.len(), values.len(), "{body}");
                for (entry, value) in offsets.iter().zip(values) {
                    let partition = entry["partition"].as_u64().expect("partition") as u32;
                    let offset = entry["offset"].as_u64().expect("offset");
                    let previous = self.acknowledged.insert((partition, offset), value);
                    assert!(
                        previous.is_none(),
                        "parent/{partition} offset {offset} acknowledged twice"
                    );
                }
                true
            }
            Ok((status, body)) if status >= 500 => {
                self.failed_produces += 1;
                let text = body.to_string();
                self.failure_advised |= text.contains("(the file system is full")
                    || text.contains("(the device or the file system failed")
                    || text.contains("(the device or the file system did not keep");
                false
            }
            Ok((status, body)) => panic!("produce rejected with {status}: {body}"),
            Err(e) => panic!("produce got no answer: {e}"),
        }
    }
}

fn partition_states(client: &reqwest::blocking::Client, base: &str, topic: &str) -> Vec<Value> {
    let (status, body) = send_json(
        client,
        Method::GET,
        &format!("{base}/v1/topics/{topic}"),
        None,
    )
    .expect("describe");
    ok(status, &body, "describe");
    body["partition_stats"]
        .as_array()
        .cloned()
        .expect("partition_stats")
}

fn wait_child_caught_up(client: &reqwest::blocking::Client, base: &str) {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    loop {
        let highs: BTreeMap<u64, u64> = partition_states(client, base, "parent")
            .iter()
            .map(|p| {
                (
                    p["partition"].as_u64().unwrap_or(0),
                    p["high_watermark"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        let (status, body) = send_json(
            client,
            Method::GET,
            &format!("{base}/v1/topics/parent/children"),
            None,
        )
        .expect("children");
        ok(status, &body, "children");
        let link = body["children"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "child").cloned())
            .unwrap_or(Value::Null);
        let cursors = link["partitions"].as_array().cloned().unwrap_or_default();
        let caught_up = cursors.len() == highs.len()
            && cursors.iter().all(|c| {
                let partition = c["partition"].as_u64().unwrap_or(u64::MAX);
                c["next_offset"].as_u64().is_some()
                    && c["next_offset"].as_u64() == highs.get(&partition).copied()
            });
        if caught_up {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the child did not catch up: {link}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn acknowledged_records_survive_a_device_that_ran_out_of_space_and_a_remount() {
    let mut disk = DiskFullFs::new();
    let data_dir = disk.data_dir();
    let args = [
        "--failed-reopen-after-ms",
        "200",
        "--segment-bytes",
        "1048576",
    ];
    let mut daemon = Daemon::start_with(&data_dir, &args);
    let client = http_client();
    let base = daemon.url();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": "parent", "partitions": 2})),
    )
    .expect("create parent");
    ok(status, &body, "create parent");
    let (status, body) = send_json(
        &client,
        Method::PUT,
        &format!("{base}/v1/topics/parent/children/child"),
        Some(&json!({"partitions": 2})),
    )
    .expect("attach child");
    ok(status, &body, "attach child");

    // Fill the device, then keep producing while partitions fail and reopen.
    let mut ledger = Ledger::default();
    let fill_deadline = Instant::now() + Duration::from_secs(120);
    let mut first_failure = None;
    loop {
        let acked = ledger.produce(&client, &base);
        if !acked && first_failure.is_none() {
            first_failure = Some(Instant::now());
        }
        if let Some(t) = first_failure {
            if t.elapsed() >= PRODUCE_WHILE_FULL {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            Instant::now() < fill_deadline,
            "the device never ran out of space ({} records acknowledged)",
            ledger.acknowledged.len()
        );
    }
    let acked_before_free = ledger.acknowledged.len();
    let failed_while_full = ledger.failed_produces;
    assert!(failed_while_full > 0, "no produce failed");
    assert!(
        ledger.failure_advised,
        "no failed produce said what to do about the full or failing device"
    );

    // Room again: produces are acknowledged again once the failed partitions reopen.
    disk.free_space();
    let free_deadline = Instant::now() + PRODUCE_AFTER_FREE;
    while Instant::now() < free_deadline {
        ledger.produce(&client, &base);
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "disk_full: {acked_before_free} records acknowledged before space was freed \
         ({failed_while_full} produces failed while full), {} after; {} failed in all",
        ledger.acknowledged.len() - acked_before_free,
        ledger.failed_produces
    );
    let log_before = daemon.log();
    let count = |what: &str| log_before.matches(what).count();
    eprintln!(
        "disk_full: {} appends truncated back, {} partition failures, {} reopens of a failed \
         partition",
        count("truncated back to the durable length"),
        count("partition log stopped"),
        count("failed partition reopened and serving")
    );
    if std::env::var_os("DISK_FULL_SHOW_LOG").is_some() {
        eprintln!("{}", tail(&log_before));
    }

    // Stop, unmount, detach, repair the file system as an operator must after its device
    // refused writes (the refused metadata writes leave ext4 without a journal with blocks in
    // use marked free in every run: mounted as it is, it may hand those blocks out again, or
    // refuse allocations with "Structure needs cleaning"), and bring the bytes back.
    daemon.kill9();
    drop(daemon);
    disk.unmount_ext4();
    disk.grow_tmpfs();
    let fsck = disk.repair_ext4();
    eprintln!("disk_full: e2fsck after the unmount:\n{}", fsck.trim_end());
    disk.mount_ext4();
    let daemon = Daemon::start_with(&data_dir, &args);
    let base = daemon.url();

    for topic in ["parent", "child"] {
        for p in partition_states(&client, &base, topic) {
            // Reading a partition opens it, so its state after the read is what recovery found.
            let partition = p["partition"].as_u64().expect("partition") as u32;
            let url =
                format!("{base}/v1/topics/{topic}/partitions/{partition}/records?offset=0&max=1");
            let (status, body) = send_json(&client, Method::GET, &url, None).expect("read");
            assert!(
                status == 200 || status == 416,
                "{topic}/{partition} after the remount: {status} {body}\n\
                 daemon log before the remount (tail):\n{}",
                tail(&log_before)
            );
        }
        for p in partition_states(&client, &base, topic) {
            let state = p["state"].as_str().unwrap_or("");
            assert!(
                state == "open" || state == "closed",
                "{topic}/{} is {state} after the remount: {p}",
                p["partition"]
            );
        }
    }

    let mut parent_values = HashSet::new();
    let mut lost = Vec::new();
    for partition in 0..2u32 {
        let records = fetch_all(&client, &base, "parent", partition);
        let by_offset: BTreeMap<u64, String> = records
            .iter()
            .map(|r| {
                (
                    r["offset"].as_u64().expect("offset"),
                    r["value"].as_str().expect("value").to_string(),
                )
            })
            .collect();
        for ((p, offset), value) in ledger
            .acknowledged
            .range((partition, 0)..(partition + 1, 0))
        {
            assert_eq!(*p, partition);
            if by_offset.get(offset) != Some(value) {
                lost.push(format!("parent/{partition}@{offset}"));
            }
        }
        parent_values.extend(by_offset.into_values());
    }
    assert!(
        lost.is_empty(),
        "{} acknowledged parent records are missing or changed after the remount, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );

    wait_child_caught_up(&client, &base);
    let mut child_values = HashSet::new();
    for partition in 0..2u32 {
        for r in fetch_all(&client, &base, "child", partition) {
            child_values.insert(r["value"].as_str().expect("value").to_string());
        }
    }
    let missing: Vec<&String> = ledger
        .acknowledged
        .values()
        .filter(|v| !child_values.contains(*v))
        .collect();
    assert!(
        missing.is_empty(),
        "the child lacks {} acknowledged parent records, e.g. {:?}",
        missing.len(),
        missing.iter().take(3).map(|v| &v[..9]).collect::<Vec<_>>()
    );
    for v in &child_values {
        assert!(
            parent_values.contains(v),
            "the child holds a record the parent does not"
        );
    }
    drop(daemon);
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
