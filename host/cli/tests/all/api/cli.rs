//! The `narad` binary's client commands against an in-process daemon.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::api::common::Daemon;

fn narad(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(args)
        .env("NARAD_URL", url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// Runs the binary off the async runtime (the daemon it talks to runs on that runtime).
async fn run(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let url = url.to_owned();
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        narad(&url, &args, stdin.as_deref())
    })
    .await
    .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_commands_print_tables_and_json() {
    let d = Daemon::start().await;
    let out = run(
        &d.url,
        &["topic", "create", "orders", "--partitions", "3"],
        None,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("created topic orders with 3 partitions"));

    let out = run(&d.url, &["topic", "list"], None).await;
    let text = stdout(&out);
    assert!(text.starts_with("NAME"), "{text}");
    assert!(text.contains("orders"), "{text}");

    let out = run(&d.url, &["topic", "list", "--json"], None).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["topics"][0]["partitions"], 3);

    let out = run(&d.url, &["topic", "describe", "orders", "--json"], None).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["partition_stats"].as_array().unwrap().len(), 3);

    let out = run(
        &d.url,
        &["topic", "grow", "orders", "--partitions", "4"],
        None,
    )
    .await;
    assert!(out.status.success(), "{out:?}");

    // Retention and child writes change through `topic set`; `none` lifts a limit.
    let out = run(
        &d.url,
        &[
            "topic",
            "set",
            "orders",
            "--retention-ms",
            "3600000",
            "--writable-as-child",
            "true",
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let (_, body) = d.get("/v1/topics/orders").await;
    assert_eq!(
        (&body["retention_ms"], &body["writable_as_child"]),
        (&serde_json::json!(3_600_000), &serde_json::json!(true)),
        "{body}"
    );
    let out = run(
        &d.url,
        &["topic", "set", "orders", "--retention-ms", "none"],
        None,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let (_, body) = d.get("/v1/topics/orders").await;
    assert!(body["retention_ms"].is_null(), "{body}");
    assert_eq!(body["writable_as_child"], true, "left as it was: {body}");
    let out = run(&d.url, &["topic", "set", "orders"], None).await;
    assert!(!out.status.success(), "nothing to change");
    let out = run(
        &d.url,
        &["topic", "set", "orders", "--retention-bytes", "lots"],
        None,
    )
    .await;
    assert!(!out.status.success(), "not a number");
    let out = run(&d.url, &["topic", "delete", "orders"], None).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        d.get("/v1/topics/orders").await.0,
        reqwest::StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_print_the_servers_message_and_exit_non_zero() {
    let d = Daemon::start().await;
    let out = run(&d.url, &["topic", "describe", "nope"], None).await;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("topic \"nope\" does not exist"), "{err}");
    assert!(err.contains("404"), "{err}");
    assert!(out.stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_reads_ndjson_in_batches_and_consume_prints_it_back() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    let input: String = (0..1203)
        .map(|i| format!("{{\"key\":\"k{}\",\"value\":\"v{i}\"}}\n", i % 3))
        .collect::<String>()
        + "\n";
    let out = run(&d.url, &["produce", "orders", "--json"], Some(&input)).await;
    assert!(out.status.success(), "{out:?}");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["records"], 1203);
    assert_eq!(summary["requests"], 3, "batches of 500");

    let out = run(
        &d.url,
        &["consume", "orders", "--partition", "0", "--json"],
        None,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1203);
    for (i, r) in lines.iter().enumerate() {
        assert_eq!(r["offset"], i);
        assert_eq!(r["value"], format!("v{i}"));
    }

    let out = run(
        &d.url,
        &[
            "consume", "orders", "-p", "0", "--offset", "1200", "--max", "2", "--json",
        ],
        None,
    )
    .await;
    let offsets: Vec<u64> = stdout(&out)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["offset"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(offsets, vec![1200, 1201]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_stops_at_a_bad_line_and_names_it() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    let out = run(
        &d.url,
        &["produce", "orders", "--json"],
        Some("{\"value\":\"a\"}\nnot json\n"),
    )
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 2"), "{err}");
    assert!(d.fetch_all("orders", 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_checks_its_records_and_prints_a_verdict() {
    let out = tokio::task::spawn_blocking(|| {
        Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(["demo", "--duration", "1s", "--rate", "200", "--delay", "1s"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let verdict = text.lines().last().unwrap_or_default();
    assert!(verdict.starts_with("demo OK: 200 records"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prefers_env_over_config_file_and_stops_cleanly_on_sigterm() {
    use std::io::BufRead as _;

    let temp = tempfile::tempdir().unwrap();
    let from_env = temp.path().join("from-env");
    let from_file = temp.path().join("from-file");
    let config = temp.path().join("narad.toml");
    std::fs::write(
        &config,
        format!(
            "data-dir = {:?}\nlisten = \"127.0.0.1:0\"\n",
            from_file.display().to_string()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("NARAD_DATA_DIR", &from_env)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut child = KillOnDrop(Some(child));
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "narad exited before listening"
            );
            if let Some(url) = line.trim().strip_prefix("narad listening on ") {
                return url.to_owned();
            }
        }
    })
    .await
    .unwrap();

    let out = run(&url, &["topic", "create", "orders"], None).await;
    assert!(out.status.success(), "{out:?}");
    assert!(from_env.join("metastore.json").exists());
    assert!(!from_file.exists());

    let mut child = child.0.take().unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}

/// Kills the daemon if a test fails before stopping it, so no server outlives its test.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
