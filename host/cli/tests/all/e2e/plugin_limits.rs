//! Compile bombs seen from outside: the real daemon refuses a module over the module limits
//! with a 400 naming the limit and its flag, without the memory a compile of it would take,
//! and the `--plugin-max-*` flags raise the limits.

use reqwest::Method;
use serde_json::Value;

use crate::e2e::harness::{Daemon, http_client, send_json};
use narad_runtime::testkit::WatRouter;

/// Most resident memory the daemon may reach while refusing the bomb. A compile of it took
/// 5.7 GB; the daemon itself (with the built-ins compiled) stays under 100 MiB; 1 GiB is far
/// from both.
const MAX_DAEMON_PEAK_RSS_KIB: u64 = 1024 * 1024;

/// Appends `value` as unsigned LEB128.
fn leb(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A 3 MB module of 999,000 empty functions, in the binary format.
fn million_empty_functions() -> Vec<u8> {
    let count = 999_000usize;
    let mut out = b"\0asm\x01\0\0\0".to_vec();
    out.extend_from_slice(&[1, 4, 1, 0x60, 0, 0]);
    let mut functions = Vec::new();
    leb(count as u64, &mut functions);
    functions.resize(functions.len() + count, 0);
    let mut code = Vec::new();
    leb(count as u64, &mut code);
    for _ in 0..count {
        code.extend_from_slice(&[2, 0, 0x0b]);
    }
    for (id, contents) in [(3u8, functions), (10u8, code)] {
        out.push(id);
        leb(contents.len() as u64, &mut out);
        out.extend(contents);
    }
    out
}

/// A valid router (it decides nothing, which the deploy check allows) with `extra` empty
/// functions beside the ABI's.
pub(crate) fn router_with_functions(extra: usize) -> Vec<u8> {
    WatRouter::new("wide")
        .description("a router with many functions")
        .extra_functions(extra)
        .wasm()
}

fn deploy(daemon: &Daemon, bytes: Vec<u8>) -> (u16, Value) {
    let response = http_client()
        .post(format!("{}/v1/plugins?name=wide", daemon.url()))
        .body(bytes)
        .send()
        .expect("deploy request");
    let status = response.status().as_u16();
    let body = response.json().expect("JSON answer");
    (status, body)
}

/// The daemon's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(daemon: &Daemon) -> u64 {
    let pid = daemon.pid().expect("daemon running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM line")
}

#[test]
fn a_compile_bomb_is_refused_without_the_memory_its_compile_would_take() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let daemon = Daemon::start(dir.path());
    let (status, body) = deploy(&daemon, million_empty_functions());
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["reason"], "module_limit", "{body}");
    assert_eq!(body["limit"], "functions", "{body}");
    assert_eq!(body["flag"], "--plugin-max-functions", "{body}");
    assert!(
        body["error"]
            .as_str()
            .expect("an error message")
            .contains("999000"),
        "{body}"
    );
    let peak = peak_rss_kib(&daemon);
    assert!(
        peak < MAX_DAEMON_PEAK_RSS_KIB,
        "the daemon reached {peak} KiB refusing the bomb"
    );
    let (status, _) = send_json(
        &http_client(),
        Method::GET,
        &format!("{}/healthz", daemon.url()),
        None,
    )
    .expect("health request");
    assert_eq!(status, 200);
}

#[test]
fn the_function_limit_flag_decides_whether_a_wide_router_deploys() {
    let wide = router_with_functions(200);
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut daemon = Daemon::start_with(dir.path(), &["--plugin-max-functions", "150"]);
    let (status, body) = deploy(&daemon, wide.clone());
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["limit"], "functions", "{body}");
    let message = body["error"].as_str().expect("an error message");
    assert!(
        message.contains("the most allowed is 150") && message.contains("--plugin-max-functions"),
        "{message}"
    );
    daemon.terminate(std::time::Duration::from_secs(10));
    drop(daemon);
    let daemon = Daemon::start_with(dir.path(), &["--plugin-max-functions", "250"]);
    let (status, body) = deploy(&daemon, wide);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["manifest_name"], "wide", "{body}");
}
