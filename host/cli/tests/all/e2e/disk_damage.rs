//! Damage to a partition's files between two runs, seen from outside: a removed oldest segment
//! is reported as lost offsets (quarantine), never as retention, a removed partition directory
//! quarantines the partition instead of starting it again at offset 0, and a torn tail cut without
//! its high-watermark file is shown in the describe, the metrics and the log, with the cut
//! bytes kept aside.

use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, http_client, send_json};

fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

fn create_topic(client: &reqwest::blocking::Client, base: &str, name: &str) {
    let (status, body) = send_json(
        client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": name, "partitions": 1})),
    )
    .expect("create topic");
    ok(status, &body, "create topic");
}

/// Produces one record per request; returns the offsets assigned.
fn produce(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    values: impl IntoIterator<Item = String>,
) -> Vec<u64> {
    values
        .into_iter()
        .map(|value| {
            let (status, body) = send_json(
                client,
                Method::POST,
                &format!("{base}/v1/topics/{topic}/records"),
                Some(&json!({"records": [{"value": value}]})),
            )
            .expect("produce");
            ok(status, &body, "produce");
            body["offsets"][0]["offset"].as_u64().expect("offset")
        })
        .collect()
}

fn describe_partition0(client: &reqwest::blocking::Client, base: &str, topic: &str) -> Value {
    let (status, body) = send_json(
        client,
        Method::GET,
        &format!("{base}/v1/topics/{topic}"),
        None,
    )
    .expect("describe");
    ok(status, &body, "describe");
    body["partition_stats"][0].clone()
}

/// The daemon's log without terminal colour codes, so fields read as `key=value`.
fn plain_log(daemon: &Daemon) -> String {
    let raw = daemon.log();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip the escape sequence up to and including its final letter.
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn partition_dir(data: &Path, topic: &str) -> PathBuf {
    data.join("topics").join(topic).join("p00000")
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list partition")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segs.sort();
    segs
}

#[test]
fn a_removed_oldest_segment_is_reported_as_lost_offsets_not_as_retention() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    // Small segments so the 16 records span several files, as a long-lived partition would.
    let mut daemon = Daemon::start_with(&data, &["--segment-bytes", "300"]);
    let client = http_client();
    create_topic(&client, &daemon.url(), "orders");
    let offsets = produce(
        &client,
        &daemon.url(),
        "orders",
        (0..16).map(|i| format!("order-{i:02}-{}", "x".repeat(40))),
    );
    assert_eq!(offsets, (0..16).collect::<Vec<u64>>());
    daemon.kill9();

    let dir = partition_dir(&data, "orders");
    let segs = segment_files(&dir);
    assert!(
        segs.len() >= 3,
        "the records span several segments: {segs:?}"
    );
    assert!(segs[0].ends_with("00000000000000000000.log"));
    let second_base: u64 = segs[1]
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .expect("segment name");
    std::fs::remove_file(&segs[0]).expect("remove the oldest segment");

    daemon.restart();
    let (status, body) = send_json(
        &client,
        Method::GET,
        &format!(
            "{}/v1/topics/orders/partitions/0/records?offset=0&max=100",
            daemon.url()
        ),
        None,
    )
    .expect("fetch");
    let missing = format!("offsets 0 to {} are missing", second_base - 1);
    assert_ne!(status, 416, "not passed off as retention: {body}");
    assert_eq!(status, 503, "{body}");
    assert!(body.to_string().contains(&missing), "{body}");

    let p0 = describe_partition0(&client, &daemon.url(), "orders");
    assert_eq!(p0["state"], "quarantined", "{p0}");
    assert_eq!(p0["log_start_offset"], 0, "{p0}");
    assert!(
        p0["reason"].as_str().unwrap_or("").contains(&missing),
        "{p0}"
    );
    let log = plain_log(&daemon);
    assert!(
        log.lines()
            .any(|l| l.contains("partition quarantined") && l.contains(&missing)),
        "the daemon log names the lost offsets:\n{log}"
    );
}

#[test]
fn a_partition_directory_removed_between_runs_is_quarantined_until_restored_or_made_empty() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start_with(&data, &[]);
    let client = http_client();
    create_topic(&client, &daemon.url(), "orders");
    create_topic(&client, &daemon.url(), "audit");
    let values: Vec<String> = (0..5).map(|i| format!("order-{i}")).collect();
    produce(&client, &daemon.url(), "orders", values.clone());
    produce(&client, &daemon.url(), "audit", ["kept".to_owned()]);
    daemon.kill9();

    let dir = partition_dir(&data, "orders");
    let backup = tmp.path().join("backup-p00000");
    std::fs::rename(&dir, &backup).expect("move the partition directory away");

    daemon.restart();
    let fetch = |daemon: &Daemon, topic: &str| {
        send_json(
            &client,
            Method::GET,
            &format!(
                "{}/v1/topics/{topic}/partitions/0/records?offset=0&max=100",
                daemon.url()
            ),
            None,
        )
        .expect("fetch")
    };
    let gone = "is missing, although the partition is recorded";
    let (status, body) = fetch(&daemon, "orders");
    assert_eq!(status, 503, "{body}");
    assert!(body.to_string().contains(gone), "{body}");
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics/orders/records", daemon.url()),
        Some(&json!({"records": [{"value": "after"}]})),
    )
    .expect("produce");
    assert_eq!(
        status, 503,
        "a produce must not reuse the lost offsets: {body}"
    );
    assert!(!dir.exists(), "the daemon made the directory again");
    let p0 = describe_partition0(&client, &daemon.url(), "orders");
    assert_eq!(p0["state"], "quarantined", "{p0}");
    assert!(p0["reason"].as_str().unwrap_or("").contains(gone), "{p0}");
    let (status, body) = fetch(&daemon, "audit");
    assert_eq!(status, 200, "the other topic keeps serving: {body}");
    let metrics = client
        .get(format!("{}/metrics", daemon.url()))
        .send()
        .and_then(|r| r.text())
        .expect("scrape /metrics");
    assert_eq!(
        sample(&metrics, "narad_partition_unavailable", "orders"),
        Some(1.0),
        "{metrics}"
    );
    let log = plain_log(&daemon);
    assert!(
        log.lines()
            .any(|l| l.contains("partition quarantined") && l.contains(gone)),
        "the daemon log says what is missing:\n{log}"
    );

    // Restored from the backup: every record is back.
    daemon.kill9();
    std::fs::rename(&backup, &dir).expect("restore the partition directory");
    daemon.restart();
    let (status, body) = fetch(&daemon, "orders");
    assert_eq!(status, 200, "{body}");
    let read: Vec<&str> = body["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["value"].as_str())
        .collect();
    assert_eq!(read, values);

    // Lost for good: the operator makes the directory empty, and the partition starts again.
    daemon.kill9();
    std::fs::remove_dir_all(&dir).expect("lose the partition directory");
    std::fs::create_dir(&dir).expect("accept the loss");
    daemon.restart();
    let offsets = produce(&client, &daemon.url(), "orders", ["again".to_owned()]);
    assert_eq!(offsets, [0]);
}

fn sample(metrics: &str, name: &str, topic: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !rest.starts_with('{') || !rest.contains(&format!("topic=\"{topic}\"")) {
            return None;
        }
        rest.rsplit(' ').next()?.parse().ok()
    })
}

#[test]
fn a_torn_tail_cut_without_its_high_watermark_file_is_shown_and_kept_aside() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data);
    let client = http_client();
    create_topic(&client, &daemon.url(), "events");
    // Each record's frame is well over 100 bytes, so cutting 100 bytes tears only the last.
    let offsets = produce(
        &client,
        &daemon.url(),
        "events",
        (0..30).map(|i| format!("event-{i:02}-{}", "y".repeat(200))),
    );
    assert_eq!(offsets.last(), Some(&29));
    daemon.kill9();

    let dir = partition_dir(&data, "events");
    // Without this file recovery cannot know offset 29 was acknowledged.
    std::fs::remove_file(dir.join("high-watermark")).expect("remove high-watermark");
    let last = segment_files(&dir).pop().expect("a segment");
    let before = std::fs::read(&last).expect("read segment");
    let left = &before[..before.len() - 100];
    std::fs::write(&last, left).expect("cut the last 100 bytes");

    daemon.restart();
    let again = produce(
        &client,
        &daemon.url(),
        "events",
        (0..3).map(|i| format!("late-{i}")),
    );
    assert_eq!(again, [29, 30, 31], "the cut offset is reused");

    let p0 = describe_partition0(&client, &daemon.url(), "events");
    let cut = &p0["recovered_cut"];
    assert_eq!(cut["records"], 1, "{p0}");
    assert_eq!(cut["records_exact"], true, "{p0}");
    assert_eq!(cut["from_offset"], 29, "{p0}");
    let kept_at = PathBuf::from(cut["kept_at"].as_str().expect("kept_at"));
    let kept = std::fs::read(&kept_at).expect("the kept-aside file exists");
    assert_eq!(cut["bytes"], kept.len() as u64, "{p0}");
    assert!(
        !kept.is_empty() && left.ends_with(&kept),
        "the kept-aside bytes are the bytes recovery cut"
    );
    assert!(
        kept_at.starts_with(dir.join("torn")),
        "{}",
        kept_at.display()
    );

    let metrics = client
        .get(format!("{}/metrics", daemon.url()))
        .send()
        .and_then(|r| r.text())
        .expect("scrape /metrics");
    assert_eq!(
        sample(&metrics, "narad_partition_recovered_cut_records", "events"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "narad_partition_recovered_cut_bytes", "events"),
        Some(kept.len() as f64)
    );
    let log = plain_log(&daemon);
    assert!(
        log.lines()
            .any(|l| l.contains("truncating a torn tail") && l.contains("from_offset=29")),
        "the daemon log names the cut offsets:\n{log}"
    );

    // Still shown after another restart, until the operator removes the kept-aside files.
    daemon.restart();
    let p0 = describe_partition0(&client, &daemon.url(), "events");
    assert_eq!(p0["recovered_cut"]["from_offset"], 29, "{p0}");
}

/// The children listing of `parent` (`GET /v1/topics/{parent}/children`).
fn children(client: &reqwest::blocking::Client, base: &str, parent: &str) -> Value {
    let (status, listing) = send_json(
        client,
        Method::GET,
        &format!("{base}/v1/topics/{parent}/children"),
        None,
    )
    .expect("children");
    ok(status, &listing, "children");
    listing
}

/// Waits until `topic`'s partition 0 holds `n` records (a child being copied into).
fn wait_for_records(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    n: usize,
) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let records = crate::e2e::harness::fetch_all(client, base, topic, 0);
        if records.len() >= n {
            return records;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{topic} holds {} of {n} records",
            records.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_lost_partition_is_re_created_above_its_childrens_copies_counting_what_the_link_lost() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start_with(&data, &[]);
    let client = http_client();
    create_topic(&client, &daemon.url(), "orders");
    create_topic(&client, &daemon.url(), "audit");
    let (status, body) = send_json(
        &client,
        Method::PUT,
        &format!("{}/v1/topics/orders/children/copy", daemon.url()),
        Some(&json!({"partitions": 1})),
    )
    .expect("attach");
    ok(status, &body, "attach");
    produce(
        &client,
        &daemon.url(),
        "orders",
        (0..5).map(|i| format!("old-{i}")),
    );
    wait_for_records(&client, &daemon.url(), "copy", 5);
    daemon.kill9();
    std::fs::remove_dir_all(partition_dir(&data, "orders")).expect("lose the partition");
    daemon.restart();

    // The cursor of the lost partition cannot read it; the children listing still has its row
    // (it used to leave out a partition whose log is not open), and says why once the cursor
    // has tried.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let listing = children(&client, &daemon.url(), "orders");
        let row = &listing["children"][0]["partitions"][0];
        assert_eq!(row["partition"], 0, "{listing}");
        if row["state"] == "stalled" {
            assert!(
                row["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("quarantined") && e.contains("recreate")),
                "{listing}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cursor never said why: {listing}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    let recreate = |topic: &str, request: Value| {
        send_json(
            &client,
            Method::POST,
            &format!("{}/v1/topics/{topic}/partitions/0/recreate", daemon.url()),
            Some(&request),
        )
        .expect("recreate")
    };
    let (status, body) = recreate("orders", json!({}));
    assert_eq!(status, 400, "the loss must be accepted: {body}");
    let (status, body) = recreate("orders", json!({"accept_loss": true, "on": "n2"}));
    assert_eq!(status, 400, "no other node to name: {body}");
    let (status, body) = recreate("audit", json!({"accept_loss": true}));
    assert_eq!(status, 409, "a serving partition is not re-created: {body}");

    // The child holds parent offsets 0 to 4; the operator last saw the end at 10.
    let (status, report) = recreate("orders", json!({"accept_loss": true, "start_offset": 10}));
    ok(status, &report, "recreate");
    assert_eq!(report["start_offset"], 10, "{report}");
    let link = &report["links"][0];
    assert_eq!(link["child"], "copy", "{report}");
    assert_eq!(link["child_holds_up_to"], 4, "{report}");
    assert_eq!(link["resume_offset"], 5, "{report}");
    assert_eq!(link["dropped_at_most"], 5, "{report}");
    let (status, body) = recreate("orders", json!({"accept_loss": true}));
    assert_eq!(status, 409, "done once: {body}");

    // New records take offsets from 10; the child gets them, once, after the old copies.
    let offsets = produce(&client, &daemon.url(), "orders", ["new-10".to_owned()]);
    assert_eq!(offsets, [10]);
    let copied = wait_for_records(&client, &daemon.url(), "copy", 6);
    let values: Vec<&str> = copied.iter().filter_map(|r| r["value"].as_str()).collect();
    assert_eq!(
        values,
        ["old-0", "old-1", "old-2", "old-3", "old-4", "new-10"]
    );
    let listing = children(&client, &daemon.url(), "orders");
    assert_eq!(
        listing["children"][0]["partitions"][0]["dropped_messages"], 5,
        "offsets 5 to 9 counted as dropped: {listing}"
    );
    let p0 = describe_partition0(&client, &daemon.url(), "orders");
    assert_eq!(p0["log_start_offset"], 10, "{p0}");

    // The loss is on the link's gap ledger, under the reason it happened for, and stays
    // counted after a restart (from the ledger, not the process that saw it).
    let recreated = json!([{"from": 5, "to": 10, "reason": "recreated"}]);
    let ledger = |daemon: &Daemon| {
        let (status, body) = send_json(
            &client,
            Method::GET,
            &format!("{}/v1/topics/orders/children/copy/gaps", daemon.url()),
            None,
        )
        .expect("gaps");
        ok(status, &body, "gaps");
        body
    };
    let ranges = |body: &Value| -> Value {
        body["partitions"][0]["gaps"]
            .as_array()
            .map(|gaps| {
                gaps.iter()
                    .map(|g| json!({"from": g["from"], "to": g["to"], "reason": g["reason"]}))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = ledger(&daemon);
    assert_eq!(ranges(&before), recreated, "{before}");
    assert_eq!(
        (before["lost"].as_u64(), before["complete"].as_bool()),
        (Some(5), Some(true))
    );
    // The answer lists at most the newest `ranges` per partition and counts the rest.
    let (status, none_listed) = send_json(
        &client,
        Method::GET,
        &format!(
            "{}/v1/topics/orders/children/copy/gaps?ranges=0",
            daemon.url()
        ),
        None,
    )
    .expect("gaps");
    ok(status, &none_listed, "gaps");
    let p0 = &none_listed["partitions"][0];
    assert_eq!(
        (
            p0["gaps"].as_array().map(Vec::len),
            &p0["unlisted"],
            &p0["lost"]
        ),
        (Some(0), &json!(1), &json!(5)),
        "{none_listed}"
    );
    daemon.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let after = ledger(&daemon);
        if after["complete"] == true {
            assert_eq!(ranges(&after), recreated, "{after}");
            assert_eq!(after["lost"], 5, "{after}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cursor did not start: {after}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let metrics = reqwest::blocking::get(format!("{}/metrics", daemon.url()))
        .and_then(|r| r.text())
        .expect("metrics");
    let dropped = metrics
        .lines()
        .find(|l| {
            l.starts_with("narad_fanout_child_dropped_messages{") && l.contains("child=\"copy\"")
        })
        .unwrap_or_default();
    assert!(dropped.ends_with(" 5"), "after a restart: {dropped:?}");
}
