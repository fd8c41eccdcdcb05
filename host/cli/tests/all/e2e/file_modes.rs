//! Data-directory permissions: whatever the umask, every file the daemon creates is readable by
//! its owner only (0600) and every directory is 0700; entries an older version left wider are
//! tightened when the daemon starts.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::e2e::harness::{fetch_all, http_client, narad_binary, send_json};

/// How long a daemon may take to answer `/healthz`; generous for a busy CI machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Records produced, so there are segments, cursors and child records to look at.
const RECORDS: usize = 20;

/// `narad serve` started by `sh -c 'umask 000; exec narad serve ...'`; killed on drop.
struct UmaskZeroDaemon {
    child: Child,
    url: String,
}

impl UmaskZeroDaemon {
    fn start(data_dir: &Path) -> UmaskZeroDaemon {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::fs::File::create(data_dir.with_extension("log")).expect("daemon log");
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"umask 000 && exec "$0" serve --data-dir "$1" --listen "$2""#)
            .arg(narad_binary())
            .arg(data_dir)
            .arg(addr.to_string())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("spawn sh");
        let mut daemon = UmaskZeroDaemon {
            child,
            url: format!("http://{addr}"),
        };
        let client = http_client();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!(
                    "narad exited with {status}; log:\n{}",
                    std::fs::read_to_string(data_dir.with_extension("log")).unwrap_or_default()
                );
            }
            if let Ok(resp) = client.get(format!("{}/healthz", daemon.url)).send()
                && resp.status().is_success()
            {
                return daemon;
            }
            assert!(Instant::now() < deadline, "narad did not become healthy");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for UmaskZeroDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every entry below `dir` (and `dir` itself) with its permission bits.
fn walk(dir: &Path) -> Vec<(PathBuf, u32, bool)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        out.push((
            path.clone(),
            meta.permissions().mode() & 0o7777,
            meta.is_dir(),
        ));
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read_dir") {
                stack.push(entry.expect("entry").path());
            }
        }
    }
    out
}

fn assert_owner_only(dir: &Path, when: &str) {
    let entries = walk(dir);
    let wide: Vec<String> = entries
        .iter()
        .filter(|(_, mode, _)| mode & 0o077 != 0)
        .map(|(p, mode, _)| format!("{} {mode:o}", p.display()))
        .collect();
    assert!(
        wide.is_empty(),
        "{when}: {} of {} data-directory entries are open to group or others: {wide:#?}",
        wide.len(),
        entries.len()
    );
}

fn has_file(dir: &Path, pred: impl Fn(&str) -> bool) -> bool {
    walk(dir)
        .iter()
        .any(|(p, _, is_dir)| !is_dir && p.file_name().and_then(|n| n.to_str()).is_some_and(&pred))
}

#[test]
fn every_data_directory_entry_is_owner_only_under_umask_zero_and_older_wide_ones_are_tightened() {
    let root = tempfile::tempdir().expect("tempdir");
    let data_dir = root.path().join("data");
    let mut daemon = UmaskZeroDaemon::start(&data_dir);
    let client = http_client();
    let base = daemon.url.clone();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": "modes", "partitions": 2})),
    )
    .expect("create topic");
    assert!((200..300).contains(&status), "create: {status} {body}");
    let (status, body) = send_json(
        &client,
        Method::PUT,
        &format!("{base}/v1/topics/modes/children/modes-child"),
        Some(&json!({"partitions": 2, "router": ["key-hash", "round-robin"]})),
    )
    .expect("attach");
    assert!((200..300).contains(&status), "attach: {status} {body}");
    let records: Vec<_> = (0..RECORDS)
        .map(|i| json!({"key": format!("k{i}"), "value": format!("v{i}")}))
        .collect();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics/modes/records"),
        Some(&json!({"records": records})),
    )
    .expect("produce");
    assert!((200..300).contains(&status), "produce: {status} {body}");
    // Wait until the child has everything, so its cursors have been written.
    let deadline = Instant::now() + START_TIMEOUT;
    while (0..2)
        .map(|p| fetch_all(&client, &base, "modes-child", p).len())
        .sum::<usize>()
        < RECORDS
    {
        assert!(Instant::now() < deadline, "the child did not catch up");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.stop();

    for (what, found) in [
        (
            "metastore.json",
            has_file(&data_dir, |n| n == "metastore.json"),
        ),
        ("LOCK", has_file(&data_dir, |n| n == "LOCK")),
        ("a segment", has_file(&data_dir, |n| n.ends_with(".log"))),
        (
            "a high-watermark file",
            has_file(&data_dir, |n| n == "high-watermark"),
        ),
        (
            "a cursor file",
            has_file(&data_dir, |n| n.ends_with(".offset")),
        ),
        (
            "a stored plugin",
            has_file(&data_dir, |n| n.ends_with(".wasm")),
        ),
    ] {
        assert!(
            found,
            "the data directory holds no {what}: {:#?}",
            walk(&data_dir)
        );
    }
    assert_owner_only(&data_dir, "after a first run under umask 000");

    // What an older version left: files 0644, directories 0755.
    for (path, _, is_dir) in walk(&data_dir) {
        let mode = if is_dir { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let mut daemon = UmaskZeroDaemon::start(&data_dir);
    assert_eq!(
        fetch_all(&client, &daemon.url, "modes", 0).len()
            + fetch_all(&client, &daemon.url, "modes", 1).len(),
        RECORDS
    );
    daemon.stop();
    assert_owner_only(
        &data_dir,
        "after a start on a data directory with 0644/0755 entries",
    );
}

/// A log written to a file (or a pipe) is plain text: colour codes are for terminals only.
#[test]
fn a_daemon_logging_to_a_file_writes_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = crate::e2e::harness::Daemon::start(&dir.path().join("data"));
    let log = daemon.log();
    assert!(log.contains("narad serving"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a log file:\n{log}"
    );
}
