//! The `narad` client commands as a new user meets them, driven through the real binary:
//! plain lines into `produce`, every partition out of `consume` in the forms that produce back,
//! `--offset` and `--follow`, deleting linked topics, a missing daemon, closed pipes, and the
//! plugin and child commands' wording.

use std::io::{BufRead as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, narad_binary, send_json};

/// How long a `--follow` consumer may take to print a record produced while it waits.
/// Generous for a busy CI machine; a healthy run needs well under a second.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `narad ARGS` against `url` with `stdin` and returns what it did.
fn narad(url: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(narad_binary())
        .args(args)
        .env("NARAD_URL", url)
        .env_remove("NARAD_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn narad");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait for narad")
}

/// Like [`narad`], asserting success; returns stdout.
fn narad_ok(url: &str, args: &[&str], stdin: &[u8]) -> String {
    let out = narad(url, args, stdin);
    assert!(
        out.status.success(),
        "narad {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Lossy: a binary value prints as its raw bytes.
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A daemon in a fresh data directory (both removed when the returned values drop).
fn daemon() -> (tempfile::TempDir, Daemon) {
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon = Daemon::start(&dir.path().join("data"));
    (dir, daemon)
}

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

fn produce(base: &str, topic: &str, records: Value) {
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/{topic}/records"),
        Some(&json!({ "records": records })),
    )
    .expect("produce");
    assert_eq!(status, 200, "{body}");
}

/// `(key, value, headers)` of each stored record of a partition.
fn stored(base: &str, topic: &str, partition: u32) -> Vec<(Value, Value, Value)> {
    fetch_all(&http_client(), base, topic, partition)
        .into_iter()
        .map(|r| (r["key"].clone(), r["value"].clone(), r["headers"].clone()))
        .collect()
}

/// Kills a child process when a test ends early, so no consumer outlives its test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn plain_lines_on_stdin_are_produced_as_values_with_keys_and_headers() {
    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "t", 1);

    let out = narad_ok(&url, &["produce", "t"], b"hello\n\nworld\n");
    assert_eq!(out.trim(), "produced 2 records to t in 1 request (p0=2)");
    narad_ok(&url, &["produce", "t", "-K", ":"], b"k1:v:1\nno key here\n");
    narad_ok(
        &url,
        &[
            "produce", "t", "--key", "k2", "-H", "a=1", "--header", "b=x=y",
        ],
        b"with headers\n",
    );
    narad_ok(
        &url,
        &["produce", "t", "--json"],
        br#"{"key":"k3","value":"json"}"#,
    );

    let h = |pairs: &[(&str, &str)]| -> Value {
        pairs
            .iter()
            .map(|(n, v)| json!({"name": n, "value": v}))
            .collect()
    };
    assert_eq!(
        stored(&url, "t", 0),
        vec![
            (Value::Null, json!("hello"), h(&[])),
            (Value::Null, json!("world"), h(&[])),
            (json!("k1"), json!("v:1"), h(&[])),
            (Value::Null, json!("no key here"), h(&[])),
            (
                json!("k2"),
                json!("with headers"),
                h(&[("a", "1"), ("b", "x=y")])
            ),
            (json!("k3"), json!("json"), h(&[])),
        ]
    );
}

#[test]
fn produce_help_describes_every_input_format() {
    let help = narad_ok("http://127.0.0.1:9", &["produce", "--help"], b"");
    for needle in [
        "the line is the value",
        "-K DELIM",
        "--json",
        "--header",
        "--key",
    ] {
        assert!(
            help.contains(needle),
            "`produce --help` lacks {needle:?}:\n{help}"
        );
    }
}

#[test]
fn consume_reads_every_partition_and_takes_beginning_end_n_and_minus_n() {
    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "t", 3);
    let records: Vec<Value> = (0..3)
        .flat_map(|p| (0..4).map(move |i| json!({"value": format!("p{p}-{i}"), "partition": p})))
        .collect();
    produce(&url, "t", Value::Array(records));

    let lines = |args: &[&str]| -> Vec<String> {
        narad_ok(&url, args, b"")
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let all: Vec<String> = (0..3)
        .flat_map(|p| (0..4).map(move |i| format!("p{p}-{i}")))
        .collect();
    assert_eq!(lines(&["consume", "t"]), all, "every partition, values");
    assert_eq!(lines(&["consume", "t", "--offset", "beginning"]), all);
    assert_eq!(
        lines(&["consume", "t", "--offset", "-2"]),
        ["p0-2", "p0-3", "p1-2", "p1-3", "p2-2", "p2-3"],
        "the last 2 of each partition"
    );
    assert_eq!(
        lines(&["consume", "t", "--offset=-10", "-p", "1"]),
        ["p1-0", "p1-1", "p1-2", "p1-3"],
        "more than stored: from the log start"
    );
    assert!(lines(&["consume", "t", "--offset", "end"]).is_empty());
    assert_eq!(
        lines(&["consume", "t", "-p", "2,0", "--offset", "3"]),
        ["p2-3", "p0-3"]
    );
    assert_eq!(lines(&["consume", "t", "--max", "5"]).len(), 5);

    let out = narad(&url, &["consume", "t", "--offset", "soon"], b"");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("beginning, end, N or -N"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn consume_json_produces_back_into_another_topic_record_for_record() {
    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "a", 2);
    create_topic(&url, "b", 2);
    produce(
        &url,
        "a",
        json!([
            {"key": "alice", "value": "1", "headers": [{"name": "h", "value": "x"}, {"name": "h", "value": "y"}]},
            {"value": "keyless", "partition": 1},
            {"key_b64": "/wA=", "value_b64": "/wE=", "headers": [{"name": "bin", "value_b64": "/w=="}]},
            {"key": "", "value": ""},
        ]),
    );

    let json_out = narad_ok(&url, &["consume", "a", "--json"], b"");
    let plain_out = narad_ok(&url, &["consume", "a"], b"");
    assert_ne!(json_out, plain_out, "--json changes the output");
    for line in json_out.lines() {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        assert!(v["partition"].is_u64() && v["offset"].is_u64(), "{v}");
    }
    let summary = narad_ok(&url, &["produce", "b", "--json"], json_out.as_bytes());
    let summary: Value = serde_json::from_str(&summary).expect("JSON summary");
    assert_eq!(summary["records"], 4);

    // Byte for byte: keys, values and headers (binary ones too), in order, per partition.
    let bare = |topic: &str, p: u32| -> Vec<Value> {
        fetch_all(&http_client(), &url, topic, p)
            .into_iter()
            .map(|mut r| {
                if let Some(o) = r.as_object_mut() {
                    o.remove("committed_at");
                }
                r
            })
            .collect()
    };
    let mut binary = 0;
    for p in 0..2 {
        let copied = bare("b", p);
        assert_eq!(copied, bare("a", p), "partition {p}");
        binary += copied.iter().filter(|r| r["value_b64"] == "/wE=").count();
    }
    assert_eq!(binary, 1, "the binary record was copied as binary");
}

#[test]
fn consume_format_prints_kcat_tokens_and_round_trips_through_a_key_delimiter() {
    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "a", 1);
    create_topic(&url, "b", 1);
    produce(
        &url,
        "a",
        json!([
            {"key": "k1", "value": "v1", "headers": {"region": "eu"}},
            {"key": "k2", "value": "v2"},
        ]),
    );
    let out = narad_ok(
        &url,
        &["consume", "a", "--format", "%t %p:%o %k=%s [%h] %S\\n"],
        b"",
    );
    assert_eq!(out, "a 0:0 k1=v1 [region=eu] 2\na 0:1 k2=v2 [] 2\n");
    let stamp = narad_ok(
        &url,
        &["consume", "a", "--format", "%T\\n", "--max", "1"],
        b"",
    );
    let committed = fetch_all(&http_client(), &url, "a", 0)[0]["committed_at"].clone();
    assert_eq!(stamp.trim(), committed.to_string());

    let tsv = narad_ok(&url, &["consume", "a", "--format", "%k\\t%s\\n"], b"");
    assert_eq!(tsv, "k1\tv1\nk2\tv2\n");
    narad_ok(&url, &["produce", "b", "-K", "\\t"], tsv.as_bytes());
    let copied: Vec<(Value, Value)> = stored(&url, "b", 0)
        .into_iter()
        .map(|(k, v, _)| (k, v))
        .collect();
    assert_eq!(
        copied,
        [(json!("k1"), json!("v1")), (json!("k2"), json!("v2"))]
    );

    let out = narad(&url, &["consume", "a", "--format", "%x"], b"");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("%x"), "{}", stderr(&out));
}

#[test]
fn follow_from_the_end_prints_only_records_produced_after_it_started() {
    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "t", 2);
    produce(
        &url,
        "t",
        json!([{"value": "old", "partition": 0}, {"value": "old", "partition": 1}]),
    );
    let mut consumer = KillOnDrop(
        Command::new(narad_binary())
            .args(["consume", "t", "--offset", "end", "--follow", "--max", "1"])
            .env("NARAD_URL", &url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn consume --follow"),
    );
    let stdout = consumer.0.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line);
        }
    });
    // The consumer takes its start a moment after it is spawned: keep producing new records
    // until it prints one. Any "old" line would mean it started from the oldest record.
    let deadline = Instant::now() + FOLLOW_TIMEOUT;
    let first = loop {
        produce(&url, "t", json!([{"value": "new", "partition": 1}]));
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
            break line.expect("read consumer output");
        }
        assert!(
            Instant::now() < deadline,
            "the follower never printed a record"
        );
    };
    assert_eq!(first, "new");
    let status = consumer.0.wait().expect("wait for consume");
    assert!(status.success(), "{status:?}");
}

#[test]
fn deleting_a_linked_topic_needs_force_and_names_the_links_that_went() {
    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "orders", 2);
    narad_ok(
        &url,
        &["child", "attach", "orders", "audit", "-p", "2"],
        b"",
    );
    narad_ok(
        &url,
        &["child", "attach", "orders", "later", "-p", "1"],
        b"",
    );

    for topic in ["orders", "audit"] {
        let out = narad(&url, &["topic", "delete", topic], b"");
        assert!(!out.status.success(), "deleting {topic} without --force");
        let err = stderr(&out);
        assert!(err.contains("orders -> audit"), "{err}");
        assert!(err.contains("--force") && err.contains("HTTP 409"), "{err}");
    }
    let (status, body) = send_json(
        &http_client(),
        Method::DELETE,
        &format!("{url}/v1/topics/orders"),
        None,
    )
    .expect("delete");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["links"].as_array().map(Vec::len), Some(2), "{body}");
    assert_eq!(
        send_json(
            &http_client(),
            Method::GET,
            &format!("{url}/v1/topics/orders"),
            None
        )
        .expect("describe")
        .0,
        200,
        "a refused delete leaves the topic"
    );

    let out = narad_ok(&url, &["topic", "delete", "audit", "--force"], b"");
    assert_eq!(out, "deleted topic audit and its 1 link: orders -> audit\n");
    let out = narad_ok(
        &url,
        &["topic", "delete", "orders", "--force", "--json"],
        b"",
    );
    let v: Value = serde_json::from_str(&out).expect("JSON answer");
    assert_eq!(v["name"], "orders");
    assert_eq!(
        v["removed_links"],
        json!([{"parent": "orders", "child": "later"}])
    );
    // The child stays a topic of its own, now unlinked: it deletes without --force.
    assert_eq!(
        narad_ok(&url, &["topic", "delete", "later"], b""),
        "deleted topic later\n"
    );
}

#[test]
fn child_list_names_its_partition_column_as_the_parents() {
    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "orders", 1);
    narad_ok(
        &url,
        &["child", "attach", "orders", "audit", "-p", "3"],
        b"",
    );
    produce(&url, "orders", json!([{"value": "x"}]));
    let deadline = Instant::now() + FOLLOW_TIMEOUT;
    let table = loop {
        let table = narad_ok(&url, &["child", "list", "orders"], b"");
        if table.lines().any(|l| l.starts_with("audit  0")) {
            break table;
        }
        assert!(
            Instant::now() < deadline,
            "the cursor never reported:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let header = table
        .lines()
        .find(|l| l.contains("NEXT_OFFSET"))
        .expect("the partition table");
    assert!(
        header.starts_with("CHILD  PARENT_P  NEXT_OFFSET"),
        "{table}"
    );
}

#[test]
fn no_daemon_on_the_port_is_one_line_naming_the_url_and_the_fix() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [&["topic", "list"][..], &["consume", "t"], &["produce", "t"]] {
        let out = narad(&url, args, b"x\n");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "error: cannot reach narad at {url}: is `narad serve` running? (--url / NARAD_URL)\n"
            ),
            "{args:?}"
        );
    }
}

/// Runs `narad ARGS` with its stdout a pipe whose reader is already gone.
fn with_closed_stdout(url: &str, args: &[&str]) -> Output {
    let mut child = Command::new(narad_binary())
        .args(args)
        .env("NARAD_URL", url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn narad");
    drop(child.stdout.take());
    child.wait_with_output().expect("wait for narad")
}

#[test]
fn a_closed_pipe_ends_completions_consume_and_the_table_commands_quietly() {
    let out = with_closed_stdout("http://127.0.0.1:9", &["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");

    let (_dir, d) = daemon();
    let url = d.url();
    create_topic(&url, "t", 1);
    let records: Vec<Value> = (0..2000)
        .map(|i| json!({"value": format!("v{i}")}))
        .collect();
    produce(&url, "t", Value::Array(records));
    // The table and JSON commands too: a reader gone before the first line is no panic.
    for args in [
        &["consume", "t"][..],
        &["consume", "t", "--json"],
        &["topic", "list"],
        &["topic", "list", "--json"],
        &["topic", "describe", "t"],
        &["node", "list"],
    ] {
        let out = with_closed_stdout(&url, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

fn records_file(dir: &Path, lines: &[&str]) -> String {
    let path = dir.join("records.ndjson");
    std::fs::write(&path, lines.join("\n")).expect("write records");
    path.display().to_string()
}

#[test]
fn plugin_test_takes_the_chain_like_router_and_numbers_records_from_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let records = records_file(
        dir.path(),
        &[
            r#"{"key":"a","offset":10}"#,
            r#"{"key":"b"}"#,
            r#"{"value":"no key"}"#,
        ],
    );
    let url = "http://127.0.0.1:9";
    let decisions = |chain: &[&str]| -> Vec<Value> {
        let mut args = vec!["plugin", "test"];
        args.extend_from_slice(chain);
        args.extend(["--records", &records, "--child-partitions", "3", "--json"]);
        let out: Value = serde_json::from_str(&narad_ok(url, &args, b"")).expect("JSON");
        out["records"].as_array().cloned().expect("records")
    };
    let comma = decisions(&["key-hash,round-robin"]);
    assert_eq!(comma.len(), 3);
    assert_eq!(decisions(&["key-hash", "round-robin"]), comma);
    assert_eq!(decisions(&["--router", "key-hash,round-robin"]), comma);

    // key-hash alone leaves the keyless record (index 2, offset 12) undecided.
    let out = narad(
        url,
        &["plugin", "test", "key-hash", "--records", &records],
        b"",
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("index 2 of the input (0-based; parent offset 12, no key)"),
        "{err}"
    );
}

#[test]
fn node_recreate_on_a_single_node_daemon_says_there_is_no_cluster() {
    let (_dir, daemon) = daemon();
    let out = narad(
        &daemon.url(),
        &["node", "recreate", "n2", "--accept-loss"],
        b"",
    );
    assert!(!out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("single node"), "{}", stderr(&out));
}

#[test]
fn a_data_dir_that_cannot_be_made_is_said_once_with_its_cause_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A regular file where a directory of the data dir's path should be.
    let blocker = tmp.path().join("not-a-dir");
    std::fs::write(&blocker, b"x").expect("write");
    let out = Command::new(narad_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(blocker.join("data"))
        .output()
        .expect("run narad serve");
    assert!(!out.status.success());
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in:\n{err}"));
    assert!(line.contains("cannot create data directory"), "{line}");
    assert_eq!(
        line.matches("Not a directory").count(),
        1,
        "the cause is said once: {line}"
    );
}

#[test]
fn narad_group_on_a_daemon_without_the_kafka_listener_says_where_groups_come_from() {
    let (_dir, daemon) = daemon();
    let out = narad(&daemon.url(), &["group", "list"], b"");
    assert!(!out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("--kafka-listen"), "{}", stderr(&out));
    let out = narad(&daemon.url(), &["group", "describe", "billing"], b"");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--kafka-listen"), "{}", stderr(&out));
}

#[test]
fn on_a_terminal_narad_produce_replaces_its_progress_count_with_the_summary() {
    let (_dir, daemon) = daemon();
    let url = daemon.url();
    create_topic(&url, "t", 1);
    // `script` gives the command a terminal (stdin stays the pipe from printf).
    let command = format!(
        "printf 'a\\nb\\nc\\n' | {} produce t --url {url}",
        crate::e2e::harness::narad_binary().display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("run script");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown:?}");
    // The count is cleared and the summary written in its place, not on a line below it.
    assert!(
        shown.contains("\r\x1b[Kproduced 3 records to t"),
        "{shown:?}"
    );
}
