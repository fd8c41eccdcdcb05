//! `narad demo`, the README's first command, run as a user would: it must finish on its own,
//! print a passing verdict as its last line, and exit 0.

use std::process::Command;

use crate::e2e::harness::narad_binary;

#[test]
fn demo_runs_every_child_to_a_passing_verdict_and_exits_zero() {
    let out = Command::new(narad_binary())
        .args(["demo", "--duration", "5s"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run narad demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "narad demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let verdict = stdout.lines().last().unwrap_or_default();
    assert!(
        verdict.starts_with("demo OK: "),
        "verdict: {verdict}\n{stdout}"
    );
    // 5 s at the default 2,000 records/s.
    assert!(
        verdict.contains("10000 records produced to orders"),
        "verdict: {verdict}"
    );
    assert!(verdict.contains("analytics, retry, by-region"), "{verdict}");
    // Piped, the demo prints plain progress lines, never terminal escapes.
    assert!(!stdout.contains('\x1b'), "{stdout}");
    // Its own temporary data dir is made owner-only, so the store has nothing to warn about.
    assert!(!stderr.contains("group or others"), "{stderr}");
}

#[test]
fn demo_refuses_a_data_dir_that_already_holds_its_topics_with_a_non_zero_exit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = || {
        Command::new(narad_binary())
            .args(["demo", "--duration", "1s", "--rate", "100", "--delay", "1s"])
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .expect("run narad demo")
    };
    let first = run();
    assert!(first.status.success(), "{first:?}");
    let second = run();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("already holds topic"), "{stderr}");
}

#[test]
fn ctrl_c_stops_producing_and_the_demo_still_checks_and_passes() {
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;

    let mut child = Command::new(narad_binary())
        .args([
            "demo",
            "--duration",
            "10m",
            "--rate",
            "500",
            "--delay",
            "1s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn narad demo");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    // Wait until records are flowing.
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .expect("the demo ended before producing")
            .expect("read stdout");
        let flowing = line.contains("producing to orders:") && !line.contains(": 0 records");
        seen.push(line);
        if flowing {
            break;
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    seen.extend(lines.map(|l| l.expect("read stdout")));
    let exit = child.wait().expect("wait for narad demo");
    let mut stderr = String::new();
    use std::io::Read as _;
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(exit.success(), "{exit:?}\n{}\n{stderr}", seen.join("\n"));
    assert!(stderr.contains("producing stops now"), "{stderr}");
    let verdict = seen.last().cloned().unwrap_or_default();
    assert!(verdict.starts_with("demo OK: "), "{}", seen.join("\n"));
}

#[test]
fn demo_json_prints_one_object_with_each_childs_check() {
    let out = Command::new(narad_binary())
        .args([
            "demo",
            "--duration",
            "1s",
            "--rate",
            "300",
            "--delay",
            "1s",
            "--json",
        ])
        .output()
        .expect("run narad demo --json");
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(report["ok"], true);
    assert_eq!(report["records"], 300);
    for child in ["analytics", "retry", "by-region"] {
        let check = &report["children"][child];
        assert_eq!(check["expected"], 300, "{child}: {check}");
        assert_eq!(check["missing"], 0, "{child}: {check}");
        assert_eq!(check["order_breaks"], 0, "{child}: {check}");
        assert_eq!(check["misplaced"], 0, "{child}: {check}");
    }
    assert_eq!(report["problems"], serde_json::json!([]));
}
