//! A lost or rolled-back metastore never costs records: the daemon refuses to start over topic
//! data it cannot name, `narad admin rebuild-metastore` rebuilds the topic list from disk, and
//! directories the metastore does not know are set aside (kept intact, listed, adoptable), never
//! deleted. An attach that creates its child records topic and link in one write.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, narad_binary, send_json};
use crate::metastore_files;

fn create_topic(base: &str, name: &str, partitions: u32) {
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": name, "partitions": partitions})),
    )
    .expect("create topic");
    assert_eq!(status, 201, "{body}");
}

fn produce(base: &str, topic: &str, n: usize) {
    let records: Vec<Value> = (0..n)
        .map(|i| json!({"key": format!("k{}", i % 7), "value": format!("{topic}-{i}")}))
        .collect();
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/{topic}/records"),
        Some(&json!({"records": records})),
    )
    .expect("produce");
    assert_eq!(status, 200, "{body}");
}

/// Every record of every partition of `topic`, as (partition, offset, value).
fn all_records(base: &str, topic: &str, partitions: u32) -> Vec<(u32, u64, String)> {
    let client = http_client();
    let mut out = Vec::new();
    for p in 0..partitions {
        for r in fetch_all(&client, base, topic, p) {
            out.push((
                p,
                r["offset"].as_u64().expect("offset"),
                r["value"].as_str().expect("value").to_owned(),
            ));
        }
    }
    out
}

fn get(base: &str, path: &str) -> Value {
    let (status, body) =
        send_json(&http_client(), Method::GET, &format!("{base}{path}"), None).expect("get");
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

fn topic_names(base: &str) -> Vec<String> {
    get(base, "/v1/topics")["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_owned())
        .collect()
}

fn stop(daemon: &mut Daemon) {
    let status = daemon
        .terminate(Duration::from_secs(30))
        .expect("daemon stops on SIGTERM");
    assert!(status.success(), "daemon exit: {status}\n{}", daemon.log());
}

fn metric(base: &str, name: &str) -> Option<f64> {
    let text = http_client()
        .get(format!("{base}/metrics"))
        .send()
        .expect("scrape")
        .text()
        .expect("metrics text");
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Runs `narad serve` on `data_dir` expecting it to refuse; returns what it printed.
fn serve_expecting_refusal(data_dir: &Path) -> String {
    let mut child = Command::new(narad_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn narad serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let output = child.wait_with_output().expect("output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                !status.success(),
                "serve started over a lost metastore:\n{text}"
            );
            return text;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("narad serve neither refused nor exited over a lost metastore");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn segment_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("list").flatten() {
        let path = entry.path();
        if path.is_dir() {
            total += segment_bytes(&path);
        } else if path.extension().is_some_and(|e| e == "log") {
            total += entry.metadata().expect("metadata").len();
        }
    }
    total
}

/// Runs `narad admin rebuild-metastore` on `data`; returns what it printed, failing the test if
/// it did.
fn rebuild(data: &Path) -> String {
    let rebuilt = Command::new(narad_binary())
        .args(["admin", "rebuild-metastore", "--data-dir"])
        .arg(data)
        .output()
        .expect("run rebuild");
    let text = String::from_utf8_lossy(&rebuilt.stdout).into_owned();
    assert!(
        rebuilt.status.success(),
        "rebuild failed: {text}{}",
        String::from_utf8_lossy(&rebuilt.stderr)
    );
    text
}

#[test]
fn a_lost_metastore_refuses_to_start_and_a_rebuild_brings_every_record_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data);
    let base = daemon.url();
    create_topic(&base, "orders", 3);
    produce(&base, "orders", 40);
    let before = all_records(&base, "orders", 3);
    assert_eq!(before.len(), 40);
    stop(&mut daemon);

    // The snapshot, its backup and both journals.
    metastore_files::remove_all(&data);
    let bytes_before = segment_bytes(&data.join("topics/orders"));
    assert!(bytes_before > 0);

    let refusal = serve_expecting_refusal(&data);
    assert!(
        refusal.contains("narad admin rebuild-metastore") && refusal.contains("orders"),
        "the refusal names the topic and the command to run:\n{refusal}"
    );
    assert_eq!(
        segment_bytes(&data.join("topics/orders")),
        bytes_before,
        "the refused start touched no record"
    );

    let text = rebuild(&data);
    assert!(
        text.contains("orders") && text.contains("retention"),
        "{text}"
    );

    let daemon = Daemon::start(&data);
    let base = daemon.url();
    let topic = get(&base, "/v1/topics/orders");
    assert_eq!(topic["partitions"], 3, "{topic}");
    assert_eq!(all_records(&base, "orders", 3), before);
}

#[test]
fn a_rebuild_makes_a_missing_partition_in_between_empty_and_says_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data);
    let base = daemon.url();
    create_topic(&base, "orders", 3);
    produce(&base, "orders", 40);
    let kept: Vec<(u32, u64, String)> = all_records(&base, "orders", 3)
        .into_iter()
        .filter(|(p, _, _)| *p != 1)
        .collect();
    stop(&mut daemon);
    metastore_files::remove_all(&data);
    std::fs::remove_dir_all(data.join("topics/orders/p00001")).expect("lose partition 1");

    let text = rebuild(&data);
    assert!(
        text.contains("[1] had no directory"),
        "the rebuild names the partition it could not find:\n{text}"
    );

    // Recorded by the rebuild, partition 1 serves again from offset 0; the others kept theirs.
    let daemon = Daemon::start(&data);
    let base = daemon.url();
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/orders/records"),
        Some(&json!({"records": [{"value": "again", "partition": 1}]})),
    )
    .expect("produce");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["offsets"][0]["offset"], 0, "{body}");
    let now: Vec<(u32, u64, String)> = all_records(&base, "orders", 3)
        .into_iter()
        .filter(|(p, _, _)| *p != 1)
        .collect();
    assert_eq!(now, kept);
}

#[test]
fn restoring_an_older_metastore_backup_sets_the_newer_topic_aside_and_adopt_brings_it_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data);
    let base = daemon.url();
    create_topic(&base, "first", 1);
    stop(&mut daemon);
    let before_second = metastore_files::save(&data);
    let mut daemon = Daemon::start(&data);
    let base = daemon.url();
    create_topic(&base, "second", 2);
    produce(&base, "second", 16);
    let before = all_records(&base, "second", 2);
    stop(&mut daemon);

    // An operator's older backup of the metastore, which predates the create of "second".
    metastore_files::restore(&data, &before_second);
    let mut daemon = Daemon::start(&data);
    let base = daemon.url();
    assert_eq!(topic_names(&base), vec!["first".to_owned()]);
    let listed = get(&base, "/v1/admin/set-aside");
    let entries = listed["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["topic"], "second");
    assert!(entries[0]["segment_bytes"].as_u64().expect("bytes") > 0);
    let id = entries[0]["id"].as_str().expect("id").to_owned();
    assert!(
        segment_bytes(&data.join("set-aside").join(&id)) > 0,
        "the records are kept in set-aside/{id}"
    );
    assert_eq!(metric(&base, "narad_set_aside_entries"), Some(1.0));
    assert!(daemon.log().contains("set aside"), "{}", daemon.log());

    let cli = Command::new(narad_binary())
        .args(["admin", "set-aside", "list", "--url", &base])
        .output()
        .expect("run the CLI");
    assert!(
        String::from_utf8_lossy(&cli.stdout).contains(&id),
        "{}",
        String::from_utf8_lossy(&cli.stdout)
    );

    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/admin/set-aside/{id}/adopt"),
        None,
    )
    .expect("adopt");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["partitions"], 2);
    assert_eq!(all_records(&base, "second", 2), before);
    assert_eq!(metric(&base, "narad_set_aside_entries"), Some(0.0));

    // Adopted for good: a restart keeps it.
    stop(&mut daemon);
    let daemon = Daemon::start(&data);
    assert_eq!(all_records(&daemon.url(), "second", 2), before);
}

#[test]
fn a_partition_directory_beyond_the_count_is_set_aside_then_adopted_or_purged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data);
    let base = daemon.url();
    create_topic(&base, "orders", 2);
    produce(&base, "orders", 20);
    stop(&mut daemon);

    // Two strays: p00002 holding a copy of p00000's records, p00003 empty.
    let topic = data.join("topics/orders");
    std::fs::create_dir(topic.join("p00002")).expect("mkdir");
    for entry in std::fs::read_dir(topic.join("p00000"))
        .expect("list")
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "log") {
            std::fs::copy(entry.path(), topic.join("p00002").join(entry.file_name()))
                .expect("copy");
        }
    }
    std::fs::create_dir(topic.join("p00003")).expect("mkdir");

    let daemon = Daemon::start(&data);
    let base = daemon.url();
    assert!(!topic.join("p00002").exists() && !topic.join("p00003").exists());
    let listed = get(&base, "/v1/admin/set-aside");
    let entries = listed["entries"].as_array().expect("entries").clone();
    assert_eq!(entries.len(), 2, "{listed}");
    let id_of = |p: u64| {
        entries
            .iter()
            .find(|e| e["partition"] == p)
            .and_then(|e| e["id"].as_str())
            .expect("entry")
            .to_owned()
    };
    let (two, three) = (id_of(2), id_of(3));

    // p00003 cannot come before p00002.
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/admin/set-aside/{three}/adopt"),
        None,
    )
    .expect("adopt");
    assert_eq!(status, 409, "{body}");

    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/admin/set-aside/{two}/adopt"),
        None,
    )
    .expect("adopt");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["partitions"], 3);
    let p0 = fetch_all(&http_client(), &base, "orders", 0);
    let p2 = fetch_all(&http_client(), &base, "orders", 2);
    assert!(!p2.is_empty());
    assert_eq!(p2, p0, "the adopted partition serves the records it held");

    let (status, body) = send_json(
        &http_client(),
        Method::DELETE,
        &format!("{base}/v1/admin/set-aside/{three}"),
        None,
    )
    .expect("purge");
    assert_eq!(status, 200, "{body}");
    assert!(!data.join("set-aside").join(&three).exists());
    assert_eq!(
        get(&base, "/v1/admin/set-aside")["entries"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
}

#[test]
fn an_attach_that_creates_its_child_records_topic_and_link_in_one_write() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let daemon = Daemon::start(&data);
    let base = daemon.url();
    create_topic(&base, "orders", 2);
    let (status, body) = send_json(
        &http_client(),
        Method::PUT,
        &format!("{base}/v1/topics/orders/children/copy"),
        Some(&json!({"partitions": 3})),
    )
    .expect("attach");
    assert_eq!(status, 201, "{body}");

    // The journal's last entry is the attach: one durable write holds both the child topic
    // and its link. Two writes would have left, after a crash between them, the topic without
    // its link.
    let entries = metastore_files::journal_entries(&data);
    let last = entries.last().expect("the attach is journaled");
    assert_eq!(last["topics"][0]["name"], "copy", "{last}");
    assert_eq!(last["topics"][0]["topic"]["partitions"], 3, "{last}");
    assert_eq!(last["links"][0]["child"], "copy", "{last}");
    let before = &entries[entries.len() - 2];
    assert_eq!(before["topics"][0]["name"], "orders", "{before}");
    assert!(before["links"].is_null(), "{before}");

    // A refused attach that would have created its child leaves neither topic nor directory
    // (the delay is over the one-year limit, a rule the metastore write checks).
    let (status, body) = send_json(
        &http_client(),
        Method::PUT,
        &format!("{base}/v1/topics/orders/children/orders2"),
        Some(&json!({"partitions": 1, "delay_ms": 40_000_000_000u64})),
    )
    .expect("attach");
    assert_eq!(status, 400, "{body}");
    assert!(!topic_names(&base).contains(&"orders2".to_owned()));
    assert!(!data.join("topics/orders2").exists());
}
