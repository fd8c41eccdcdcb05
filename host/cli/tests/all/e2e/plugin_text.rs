//! Text a plugin controls (its log lines, its error message) reaches the daemon's log and the
//! children listing escaped and cut; and a cursor that recovers stops showing the old error.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, http_client, scrape, send_json};
use narad_runtime::testkit::{WatRouter, wat_string};

/// How long a cursor may take to stall on, or recover from, a plugin error. Generous for a
/// busy CI machine; a healthy daemon needs a second or two (one retry backoff).
const WAIT: Duration = Duration::from_secs(60);

/// What the hostile plugin logs on every call: a newline that would forge a second log line,
/// and a NUL.
const LOG_LINE: &[u8] = b"a\nforged line\0";

/// Bytes of the hostile plugin's error message: the ABI's largest, 4 KiB.
const ERROR_BYTES: usize = 4096;

/// Longest `last_error` the listing may show: the daemon's documented cap (2,048 bytes) plus its
/// cut marker (at most 40 bytes).
const MAX_SHOWN_ERROR_BYTES: usize = 2048 + 40;

/// The hostile plugin's error message: a forged line, a NUL, then filler up to 4 KiB.
fn error_message() -> Vec<u8> {
    let mut message = b"err\nforged error line\0".to_vec();
    message.resize(ERROR_BYTES, b'E');
    message
}

/// A plugin that passes the deploy check (it answers "bad config" to the empty config the check
/// uses, which the check allows), passes the attach check (to a non-empty config it answers a
/// plugin error, which only a record can cause as far as the daemon knows), and then fails
/// every slab, logging [`LOG_LINE`] and giving a 4 KiB error message.
fn hostile_plugin() -> Vec<u8> {
    WatRouter::new("hostile")
        .description("logs and fails with control characters")
        .imports(r#"(import "narad" "log" (func $log (param i32 i32 i32)))"#)
        .heap_base(8192)
        .items(&format!(
            r#"(data (i32.const 16) "{}") (data (i32.const 4096) "{}")"#,
            wat_string(LOG_LINE),
            wat_string(&error_message())
        ))
        .last_error(&format!(
            "(i64.or (i64.shl (i64.const 4096) (i64.const 32)) (i64.const {ERROR_BYTES}))"
        ))
        .route(
            "",
            &format!(
                "(call $log (i32.const 2) (i32.const 16) (i32.const {log_len}))
    {}
    (return (i32.const -1))",
                BAD_CONFIG_WHEN_EMPTY,
                log_len = LOG_LINE.len()
            ),
        )
        .wasm()
}

/// WAT that returns `ROUTE_ERR_BAD_CONFIG` to the empty config of the deploy check (which the
/// check allows) and goes on otherwise, so a plugin that fails every slab can be deployed and
/// attached (with a non-empty config). The context's last byte is the config's length varint
/// (0) when the config is empty.
const BAD_CONFIG_WHEN_EMPTY: &str = "(if (i32.eqz (i32.load8_u (i32.sub
        (i32.add (i32.add (local.get $in) (i32.load offset=8 (local.get $in)))
                 (i32.load offset=12 (local.get $in)))
        (i32.const 1))))
      (then (return (i32.const -3))))";

/// What an SDK plugin's panic handler logs before it traps.
const PANIC_LINE: &str = "plugin panicked: no tier for this customer at src/lib.rs:41:13";

/// A plugin (version 2.1.0) that does what the guest SDK does on a panic, on every record:
/// logs [`PANIC_LINE`] at error level, then executes `unreachable`.
fn panicking_plugin() -> Vec<u8> {
    WatRouter::new("tiers")
        .version("2.1.0")
        .imports(r#"(import "narad" "log" (func $log (param i32 i32 i32)))"#)
        .items(&format!(r#"(data (i32.const 16) "{PANIC_LINE}")"#))
        .route(
            "",
            &format!(
                "{BAD_CONFIG_WHEN_EMPTY}
    (call $log (i32.const 0) (i32.const 16) (i32.const {len}))
    unreachable",
                len = PANIC_LINE.len()
            ),
        )
        .wasm()
}

fn request(
    client: &reqwest::blocking::Client,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Value {
    let (status, answer) = send_json(client, method, url, body.as_ref()).expect(url);
    assert!((200..300).contains(&status), "{url}: {status} {answer}");
    answer
}

/// Deploys the hostile plugin, attaches `events -> copy` routed by it, and produces a record.
fn stall_a_link_on_the_hostile_plugin(client: &reqwest::blocking::Client, base: &str) {
    stall_a_link_on(client, base, "hostile", hostile_plugin(), "k");
}

/// Deploys `wasm` as `name`, attaches `events -> copy` routed by it (with a config, see
/// [`BAD_CONFIG_WHEN_EMPTY`]), and produces one record with `key`.
fn stall_a_link_on(
    client: &reqwest::blocking::Client,
    base: &str,
    name: &str,
    wasm: Vec<u8>,
    key: &str,
) {
    let response = client
        .post(format!("{base}/v1/plugins?name={name}"))
        .body(wasm)
        .send()
        .expect("deploy");
    let status = response.status();
    assert!(
        status.is_success(),
        "deploy: {status} {:?}",
        response.text()
    );
    request(
        client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(json!({"name": "events", "partitions": 1})),
    );
    request(
        client,
        Method::PUT,
        &format!("{base}/v1/topics/events/children/copy"),
        Some(json!({"partitions": 1, "router": [name], "config": "on"})),
    );
    request(
        client,
        Method::POST,
        &format!("{base}/v1/topics/events/records"),
        Some(json!({"records": [{"key": key, "value": "v"}]})),
    );
}

/// The listing entry of `events -> copy`, partition 0, once `done` holds for it.
fn wait_for_cursor(
    client: &reqwest::blocking::Client,
    base: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let listing = request(
            client,
            Method::GET,
            &format!("{base}/v1/topics/events/children"),
            None,
        );
        let report = listing["children"][0]["partitions"][0].clone();
        if done(&report) {
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {listing}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stalled_with_error(report: &Value) -> bool {
    report["state"] == "stalled" && report["last_error"].is_string()
}

#[test]
fn a_plugins_log_line_and_error_message_reach_the_log_and_the_listing_escaped_and_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(&dir.path().join("data"));
    let base = daemon.url();
    let client = http_client();
    stall_a_link_on_the_hostile_plugin(&client, &base);
    let report = wait_for_cursor(&client, &base, "the cursor to stall", stalled_with_error);

    let shown = report["last_error"].as_str().unwrap_or_default();
    assert!(
        !shown.chars().any(char::is_control),
        "a control character reached last_error: {shown:?}"
    );
    assert!(
        shown.contains(r"err\nforged error line\0EEE"),
        "the plugin's message is shown, escaped: {shown:?}"
    );
    assert!(
        shown.len() <= MAX_SHOWN_ERROR_BYTES && shown.contains("more bytes)"),
        "last_error is {} bytes, not cut with a marker: {shown:?}",
        shown.len()
    );

    let log = daemon.log();
    assert!(
        log.contains(r"a\nforged line\0"),
        "the plugin's log line is logged, escaped"
    );
    assert!(!log.contains('\0'), "a NUL reached the daemon log");
    let forged: Vec<&str> = log
        .lines()
        .filter(|line| line.starts_with("forged") || line.starts_with("EEEE"))
        .collect();
    assert!(
        forged.is_empty(),
        "plugin text forged log lines: {forged:?}"
    );
}

#[test]
fn with_json_logs_every_line_a_plugin_causes_is_one_valid_json_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start_with(&dir.path().join("data"), &["--log-format", "json"]);
    let base = daemon.url();
    let client = http_client();
    stall_a_link_on_the_hostile_plugin(&client, &base);
    wait_for_cursor(&client, &base, "the cursor to stall", stalled_with_error);

    let log = daemon.log();
    let mut plugin_lines = 0;
    for line in log.lines().filter(|line| line.starts_with('{')) {
        let entry: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
        if entry["target"] == "narad_plugin" {
            plugin_lines += 1;
            assert_eq!(entry["fields"]["message"], r"a\nforged line\0", "{line}");
        }
    }
    assert!(plugin_lines > 0, "no plugin log line in:\n{log}");
    assert!(
        !log.lines().any(|line| line.starts_with("forged")),
        "plugin text forged a log line"
    );
}

#[test]
fn a_cursor_that_recovers_shows_no_current_error_and_keeps_the_old_one_as_previous() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(&dir.path().join("data"));
    let base = daemon.url();
    let client = http_client();
    stall_a_link_on_the_hostile_plugin(&client, &base);
    let stalled = wait_for_cursor(&client, &base, "the cursor to stall", stalled_with_error);

    // Swap the router back to the default chain: the next routing attempt commits the slab.
    request(
        &client,
        Method::PATCH,
        &format!("{base}/v1/topics/events/children/copy"),
        Some(json!({"router": ["key-hash", "keyless-index", "round-robin"]})),
    );
    let recovered = wait_for_cursor(&client, &base, "the slab to commit", |r| {
        r["next_offset"] == 1
    });
    assert_eq!(recovered["state"], "running", "{recovered}");
    assert_eq!(
        recovered["last_error"],
        Value::Null,
        "the error outlived the trouble: {recovered}"
    );
    assert!(
        recovered["previous_error"]
            .as_str()
            .is_some_and(|e| e.contains(r"err\nforged error line")),
        "the error recovered from stays visible as previous_error: {recovered}, was {stalled}"
    );
    assert!(
        recovered["previous_error_at_ms"]
            .as_i64()
            .is_some_and(|at| at > 0),
        "{recovered}"
    );
}

#[test]
fn a_panicking_plugin_is_listed_in_one_line_with_its_panic_and_record_and_searched_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(&dir.path().join("data"));
    let base = daemon.url();
    let client = http_client();
    stall_a_link_on(&client, &base, "tiers", panicking_plugin(), "customer-7");
    // From the second try on, the error names the record the search found.
    let report = wait_for_cursor(&client, &base, "the search to name the record", |r| {
        stalled_with_error(r)
            && r["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("parent offset"))
    });
    let shown = report["last_error"].as_str().unwrap_or_default();
    // The issue's report: a wasm backtrace with escaped newlines, the error twice, no panic.
    for wanted in [
        "plugin tiers 2.1.0 (#0 of the chain, sha256:",
        r#"failed on parent offset 0 (key "customer-7"): trapped: "#,
        PANIC_LINE,
        "(wasm `unreachable` instruction executed)",
    ] {
        assert!(shown.contains(wanted), "{wanted:?} is not in {shown:?}");
    }
    for unwanted in ["wasm function", "backtrace", r"\n"] {
        assert!(!shown.contains(unwanted), "{unwanted:?} is in {shown:?}");
    }
    for once in ["plugin tiers", "trapped", "plugin panicked"] {
        assert_eq!(
            shown.matches(once).count(),
            1,
            "{once:?} said twice: {shown:?}"
        );
    }

    // Later tries of the same slab reuse what the search found: the search's calls stop.
    let counter = |name: &str| {
        let prefix = format!(r#"{name}{{plugin="tiers","#);
        scrape(&base)
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .filter_map(|line| line.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
            .sum::<f64>()
    };
    let searched = counter("narad_plugin_search_calls_total");
    let calls = counter("narad_plugin_calls_total");
    let deadline = Instant::now() + WAIT;
    while counter("narad_plugin_calls_total") < calls + 3.0 {
        assert!(Instant::now() < deadline, "the slab was not tried again");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(searched > 0.0, "no search was counted");
    assert_eq!(
        counter("narad_plugin_search_calls_total"),
        searched,
        "the search ran again on a retry of the same slab"
    );
}
