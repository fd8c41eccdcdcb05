//! `narad child ...` and `narad completions` against an in-process daemon: tables, `--json`,
//! the server's message and a non-zero exit on errors.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::api::common::Daemon;

/// Runs the binary off the async runtime (the daemon it talks to runs on that runtime).
async fn narad(url: &str, args: &[&str]) -> Output {
    let url = url.to_owned();
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(&args)
            .env("NARAD_URL", &url)
            .env_remove("NARAD_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {o:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn router_names(link: &Value) -> Vec<String> {
    link["router"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_list_set_router_and_detach_round_trip_with_json() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;

    let out = narad(
        &d.url,
        &[
            "child",
            "attach",
            "orders",
            "audit",
            "--partitions",
            "2",
            "--json",
        ],
    )
    .await;
    let link = json_out(&out);
    assert_eq!(link["name"], "audit");
    assert_eq!(link["parent"], "orders");
    assert_eq!(link["attach_epoch"].as_str().unwrap().len(), 16);
    assert_eq!(
        router_names(&link),
        ["key-hash", "keyless-index", "round-robin"]
    );

    let out = narad(
        &d.url,
        &[
            "child",
            "attach",
            "orders",
            "later",
            "-p",
            "1",
            "--delay",
            "2m",
            "--router",
            "round-robin",
            "--json",
        ],
    )
    .await;
    let delayed = json_out(&out);
    assert_eq!(delayed["delay_ms"], 120_000);
    assert_eq!(router_names(&delayed), ["round-robin"]);

    // Records produced after the attach reach the child; the listing shows the cursors.
    d.produce(
        "orders",
        json!([{"key": "a", "value": "1"}, {"value": "2"}]),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let audit = loop {
        let list = json_out(&narad(&d.url, &["child", "list", "orders", "--json"]).await);
        let audit = list["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "audit")
            .cloned()
            .unwrap();
        let partitions = audit["partitions"].as_array().unwrap();
        if partitions.len() == 2 && partitions.iter().all(|p| p["lag_messages"] == 0) {
            break audit;
        }
        assert!(Instant::now() < deadline, "audit never caught up: {audit}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(audit["lag_complete"].as_bool().unwrap());
    assert_eq!(audit["partitions"][0]["state"], "running");

    let out = narad(&d.url, &["child", "list", "orders"]).await;
    assert!(out.status.success(), "{out:?}");
    let table = text(&out.stdout);
    assert!(table.starts_with("CHILD"), "{table}");
    assert!(table.contains("later") && table.contains("2m"), "{table}");
    assert!(table.contains("NEXT_OFFSET"), "{table}");
    // The ROUTER column names each plugin's pinned version: a digest prefix `--router` takes,
    // and the version its manifest declares.
    for plugin in audit["router"].as_array().unwrap() {
        let (name, digest) = (
            plugin["name"].as_str().unwrap(),
            plugin["digest"].as_str().unwrap(),
        );
        let version = plugin["version"]
            .as_str()
            .unwrap_or_else(|| panic!("{audit}"));
        let shown = format!("{name}@{} ({version})", &digest[..12]);
        assert!(table.contains(&shown), "{shown} missing:\n{table}");
    }

    let out = narad(
        &d.url,
        &[
            "child",
            "set-router",
            "orders",
            "audit",
            "--router",
            "key-hash,round-robin",
            "--json",
        ],
    )
    .await;
    let changed = json_out(&out);
    assert_eq!(router_names(&changed), ["key-hash", "round-robin"]);
    assert_eq!(changed["attach_epoch"], link["attach_epoch"]);

    let out = narad(&d.url, &["child", "detach", "orders", "audit"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).starts_with("detached orders -> audit"));
    let list = json_out(&narad(&d.url, &["child", "list", "orders", "--json"]).await);
    let names: Vec<&str> = list["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["later"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_prints_the_servers_message_and_exits_non_zero() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;

    let out = narad(&d.url, &["child", "attach", "nowhere", "c", "-p", "1"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("nowhere") && err.contains("HTTP 404"), "{err}");
    assert!(out.stdout.is_empty());

    // The child topic must exist when no partition count is given.
    let out = narad(&d.url, &["child", "attach", "orders", "missing"]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("create it first"), "{out:?}");

    let out = narad(&d.url, &["child", "detach", "orders", "never-attached"]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("HTTP 404"), "{out:?}");

    let out = narad(
        &d.url,
        &[
            "child",
            "attach",
            "orders",
            "c",
            "-p",
            "1",
            "--router",
            "no-such-plugin",
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no-such-plugin"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_route_child_takes_its_config_from_the_command_line() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    let out = narad(
        &d.url,
        &[
            "child",
            "attach",
            "orders",
            "by-region",
            "-p",
            "2",
            "--router",
            "header-route,round-robin",
            "--config-text",
            "header = region\\nus = 0\\neu = 1",
        ],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    d.produce(
        "orders",
        json!([
            {"value": "a", "headers": {"region": "eu"}},
            {"value": "b", "headers": {"region": "us"}},
            {"value": "c", "headers": {"region": "eu"}},
        ]),
    )
    .await;
    // The two child partitions are committed as separate buckets: each is waited for (the
    // test used to read partition 0 as soon as partition 1 was complete, and once found it
    // still empty).
    let deadline = Instant::now() + Duration::from_secs(60);
    for (partition, wanted) in [(1, vec!["a", "c"]), (0, vec!["b"])] {
        loop {
            let held = d.fetch_all("by-region", partition).await;
            if held.len() >= wanted.len() {
                let values: Vec<&str> = held.iter().map(|r| r["value"].as_str().unwrap()).collect();
                assert_eq!(values, wanted, "partition {partition}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the records of partition {partition} never arrived"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_generated_for_each_shell() {
    for (shell, marker) in [
        ("bash", "_narad()"),
        ("zsh", "#compdef narad"),
        ("fish", "complete -c narad"),
    ] {
        let out = narad("http://127.0.0.1:9", &["completions", shell]).await;
        assert!(out.status.success(), "{out:?}");
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(
            script.contains("set-router"),
            "{shell} script lacks the child commands"
        );
    }
    let out = narad("http://127.0.0.1:9", &["completions", "tcsh"]).await;
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_writes_one_json_object_per_line() {
    let temp = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--data-dir")
        .arg(temp.path());
    let logs = log_lines_until_stopped(command).await;
    assert_every_line_is_json(&logs);
    // The listen line is one of them, with its URL as a field (it was plain text).
    assert!(
        logs.iter().any(|line| {
            serde_json::from_str::<Value>(line).is_ok_and(|e| {
                e["fields"]["url"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("http://127.0.0.1:"))
            })
        }),
        "no JSON listen line: {logs:?}"
    );
}

/// A config file sets the log format (a flag of every command, read before the daemon's
/// settings), and a relative `data-dir` in it is beside the file, not in the directory the
/// daemon was started from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_sets_the_log_format_and_its_relative_data_dir_is_beside_it() {
    let (etc, cwd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let file = etc.path().join("narad.toml");
    std::fs::write(&file, "data-dir = \"data\"\nlog-format = \"json\"\n").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .current_dir(cwd.path());
    assert_every_line_is_json(&log_lines_until_stopped(command).await);
    assert!(
        etc.path().join("data").is_dir(),
        "no data dir beside the file"
    );
    assert!(
        !cwd.path().join("data").exists(),
        "a data dir in the working directory"
    );

    // A value that is not a format is refused, naming the file.
    std::fs::write(&file, "data-dir = \"data\"\nlog-format = \"xml\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("narad.toml") && stderr.contains("\"xml\" is not a log format"),
        "{stderr}"
    );
}

/// Starts `command` (a `narad serve` writing logs to stderr), stops it with SIGTERM once it
/// listens, and returns its log lines (the listen line left out).
async fn log_lines_until_stopped(mut command: Command) -> Vec<String> {
    use std::io::BufRead as _;

    let mut child = KillOnDrop(
        command
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let pid = child.0.id().to_string();
    // Read stderr to its end on a thread (a daemon whose stderr is closed cannot log).
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let mut lines = Vec::new();
    let waited = tokio::task::spawn_blocking(move || {
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
            let listening = line.starts_with("narad listening on ")
                || serde_json::from_str::<Value>(&line).is_ok_and(|event| {
                    event["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("narad listening on "))
                });
            lines.push(line);
            if listening {
                return (lines, Some(rx));
            }
        }
        (lines, None)
    })
    .await
    .unwrap();
    let (mut lines, rx) = waited;
    let rx = rx.unwrap_or_else(|| panic!("narad never listened: {lines:?}"));
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Polled against a deadline: a daemon that ignored SIGTERM fails the test, not hangs it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "narad did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "{exit:?}");
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    lines
        .into_iter()
        .filter(|l| !l.starts_with("narad listening on "))
        .collect()
}

/// Every line is one JSON log event, and there are at least the start and stop lines.
fn assert_every_line_is_json(logs: &[String]) {
    assert!(logs.len() >= 2, "expected start and stop lines: {logs:?}");
    for line in logs {
        let event: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(
            event["level"].is_string() && event["fields"]["message"].is_string(),
            "{line}"
        );
        // Values a log shipper can use: no Rust debug text (`Some(20000)`, `Key { .. }`).
        for (name, value) in event["fields"].as_object().into_iter().flatten() {
            let text = value.as_str().unwrap_or_default();
            assert!(
                !text.starts_with("Some(") && text != "None" && !text.contains(" { "),
                "field {name} is debug text: {line}"
            );
        }
    }
}

/// A daemon process killed (and reaped) when dropped, so a failing test leaves none behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Errors mean it has already exited and been reaped: nothing is left to clean up.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
