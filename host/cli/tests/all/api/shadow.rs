//! Shadow routing over HTTP, with real Wasm plugins: a candidate chain routes a copy of a
//! link's slabs, its differences are counted exactly, nothing it decides is committed, and a
//! hostile candidate changes nothing about what the link delivers.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::api::common::Daemon;
use narad_runtime::testkit::WatRouter;

/// Bound on waiting for the reconciler and the cursors; generous for a busy machine.
const WAIT: Duration = Duration::from_secs(60);

/// A routing plugin in WAT whose `narad_route` body is `route` (locals: `$in`, `$len`, `$out`,
/// `$n`, `$i`; it returns 0 after the body). Every record it does not decide stays undecided.
fn wat_plugin(name: &str, route: &str) -> Vec<u8> {
    WatRouter::new(name)
        .description("a WAT shadow test plugin")
        .route(
            "(local $n i32) (local $i i32)",
            &format!("(local.set $n (i32.load offset=4 (local.get $in))) {route}"),
        )
        .wasm()
}

/// Sends every record to child partition 0.
fn all_to_zero() -> Vec<u8> {
    wat_plugin(
        "all-zero",
        r#"(block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))) (i32.const 0))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))"#,
    )
}

/// Runs `then` when the slab's first record was committed after the deploy check's made-up
/// records (which are from 2023): a plugin that passes its deploy and misbehaves on every
/// real slab.
fn on_live_records(name: &str, then: &str) -> Vec<u8> {
    wat_plugin(
        name,
        &format!(
            r#"(if (i64.gt_s
          (i64.load offset=8 (i32.add (local.get $in) (i32.load offset=16 (local.get $in))))
          (i64.const 1700000100000))
      (then {then}))"#
        ),
    )
}

async fn deploy(d: &Daemon, name: &str, wasm: Vec<u8>) {
    let (status, body) = d.post_raw(&format!("/v1/plugins?name={name}"), wasm).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

const SHADOW: &str = "/v1/topics/orders/children/copy/shadow";

/// Waits until this shadow (set at `set_at_ms`) runs on the daemon; returns its status.
async fn running(d: &Daemon, set_at_ms: &Value) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = d.get(SHADOW).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["running"] == true && body["shadow"]["set_at_ms"] == *set_at_ms {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "the shadow never started: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the shadow has seen or skipped `records` records; returns its report.
async fn accounted(d: &Daemon, records: u64) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = d.get(SHADOW).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let report = &body["report"];
        let done =
            report["records_seen"].as_u64().unwrap() + report["records_skipped"].as_u64().unwrap();
        assert!(
            done <= records,
            "the shadow counted more than was routed: {body}"
        );
        if done == records {
            return report.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the shadow did not account for {records} records: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where key-hash puts `key` among `partitions`: the placement the link commits.
fn key_hash(key: &str, partitions: u32) -> u32 {
    narad_abi::partition_for_key(key.as_bytes(), partitions).unwrap()
}

/// Every record of the 4-partition child, as (key, partition) with each key once, checked
/// to be where key-hash puts it: what the link delivers without any shadow.
async fn delivered_as_key_hash(d: &Daemon, expected: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut placed: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for p in 0..4 {
            for record in d.fetch_all("copy", p).await {
                let key = record["key"].as_str().unwrap().to_owned();
                placed.entry(key).or_default().push(p);
            }
        }
        let total: usize = placed.values().map(Vec::len).sum();
        if total >= expected {
            assert_eq!(total, expected, "records copied more than once");
            assert_eq!(placed.len(), expected);
            for (key, partitions) in &placed {
                assert_eq!(partitions, &[key_hash(key, 4)], "{key} placed elsewhere");
            }
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{total} of {expected} records copied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn keyed(keys: std::ops::Range<u32>) -> Value {
    Value::Array(
        keys.map(|i| json!({"key": format!("k{i}"), "value": "v"}))
            .collect(),
    )
}

async fn linked_daemon() -> Daemon {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/copy",
            json!({"partitions": 4, "router": ["key-hash"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_whose_candidate_differs_on_a_known_share_of_keys_reports_exactly_that_share() {
    let d = linked_daemon().await;
    deploy(&d, "all-zero", all_to_zero()).await;
    let (status, set) = d.put(SHADOW, json!({"router": ["all-zero"]})).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["router"][0]["name"], "all-zero");
    let status = running(&d, &set["set_at_ms"]).await;
    assert_eq!(status["current_router"][0]["name"], "key-hash");

    // One batch, one slab: the candidate sends every key to partition 0, so exactly the keys
    // key-hash places elsewhere are moved, per (real, candidate) pair.
    let count = 400;
    d.produce("orders", keyed(0..count)).await;
    let report = accounted(&d, u64::from(count)).await;
    let mut moved: BTreeMap<u32, u64> = BTreeMap::new();
    for i in 0..count {
        let p = key_hash(&format!("k{i}"), 4);
        if p != 0 {
            *moved.entry(p).or_default() += 1;
        }
    }
    let total_moved: u64 = moved.values().sum();
    assert!(total_moved > 0 && total_moved < u64::from(count));
    assert_eq!(report["slabs_skipped"], 0, "{report}");
    assert_eq!(report["records_seen"], count, "{report}");
    assert_eq!(report["records_moved"], total_moved, "{report}");
    assert_eq!(
        report["records_same"],
        u64::from(count) - total_moved,
        "{report}"
    );
    let pairs: BTreeMap<u32, u64> = report["moved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["to"], 0, "{report}");
            (
                p["from"].as_u64().unwrap() as u32,
                p["records"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(pairs, moved, "{report}");
    assert_eq!(report["records_undecided"], 0);
    assert_eq!(report["records_failed"], 0);
    assert_eq!(report["errors"], json!({}));
    // Both chains are Wasm: time and fuel per record are known for both, over the same slab.
    for chain in ["current", "candidate"] {
        assert_eq!(report[chain]["records"], count, "{report}");
        assert!(
            report[chain]["nanos_per_record"].as_f64().unwrap() > 0.0,
            "{report}"
        );
        assert!(
            report[chain]["fuel_per_record"].as_f64().unwrap() > 0.0,
            "{report}"
        );
    }
    // Nothing the candidate decided was committed.
    delivered_as_key_hash(&d, count as usize).await;

    // Cleared: gone from GET, a second DELETE is a 404; the link copies on.
    let (status, cleared) = d.delete(SHADOW).await;
    assert_eq!(status, StatusCode::OK, "{cleared}");
    assert_eq!(cleared["set_at_ms"], set["set_at_ms"]);
    let (status, body) = d.get(SHADOW).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("has no shadow"),
        "{body}"
    );
    let (status, _) = d.delete(SHADOW).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    d.stop().await;
}

#[tokio::test]
async fn setting_a_shadow_refuses_unknown_links_and_plugins_and_bad_chains_clearly() {
    let d = linked_daemon().await;
    let cases = [
        (
            "/v1/topics/orders/children/nope/shadow",
            json!({"router": ["key-hash"]}),
            StatusCode::NOT_FOUND,
            "not a child",
        ),
        (
            SHADOW,
            json!({"router": ["no-such-plugin"]}),
            StatusCode::NOT_FOUND,
            "no-such-plugin",
        ),
        (
            SHADOW,
            json!({"router": []}),
            StatusCode::BAD_REQUEST,
            "1 to 8 plugins; got 0",
        ),
        (
            SHADOW,
            json!({"router": vec!["key-hash"; 9]}),
            StatusCode::BAD_REQUEST,
            "got 9",
        ),
        (
            SHADOW,
            json!({"routers": ["key-hash"]}),
            StatusCode::BAD_REQUEST,
            "routers",
        ),
    ];
    for (path, body, want, says) in cases {
        let (status, answer) = d.put(path, body.clone()).await;
        assert_eq!(status, want, "{body} -> {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(says),
            "{body} -> {answer}"
        );
    }
    let (status, body) = d.get(SHADOW).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // A config given is the candidate's; none given, it takes the link's.
    let (status, set) = d
        .put(
            SHADOW,
            json!({"router": ["header-route", "key-hash"], "config": "header = region\nus = 1\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["config"], "header = region\nus = 1\n");
    let (_, links) = d.get("/v1/topics/orders/children").await;
    assert_eq!(links["children"][0]["router"][0]["name"], "key-hash");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_candidate_that_spins_or_traps_leaves_every_record_delivered_as_without_it() {
    let d = linked_daemon().await;
    deploy(
        &d,
        "spin-live",
        on_live_records("spin-live", "(loop $spin (br $spin))"),
    )
    .await;
    deploy(&d, "trap-live", on_live_records("trap-live", "unreachable")).await;

    // An endless loop: stopped by the runtime's fuel (or deadline) on every slab, counted,
    // never retried; the link delivers every record exactly where key-hash puts it.
    let (status, set) = d.put(SHADOW, json!({"router": ["spin-live"]})).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    running(&d, &set["set_at_ms"]).await;
    for batch in 0..3 {
        d.produce("orders", keyed(batch * 50..batch * 50 + 50))
            .await;
    }
    delivered_as_key_hash(&d, 150).await;
    let report = accounted(&d, 150).await;
    let seen = report["slabs_seen"].as_u64().unwrap();
    assert!(seen >= 1, "{report}");
    assert_eq!(report["slabs_failed"], seen, "{report}");
    assert_eq!(report["records_failed"], report["records_seen"], "{report}");
    let errors = report["errors"].as_object().unwrap();
    let stopped: u64 = errors.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(stopped, seen, "{report}");
    assert!(
        errors.keys().all(|k| k == "fuel" || k == "deadline"),
        "{report}"
    );
    assert_eq!(report["records_same"], 0);

    // A trap, set in its place (a fresh report): the same.
    let (status, set) = d.put(SHADOW, json!({"router": ["trap-live"]})).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let status = running(&d, &set["set_at_ms"]).await;
    assert_eq!(status["report"]["records_seen"], 0, "{status}");
    d.produce("orders", keyed(150..200)).await;
    delivered_as_key_hash(&d, 200).await;
    let report = accounted(&d, 50).await;
    let seen = report["slabs_seen"].as_u64().unwrap();
    assert!(seen >= 1, "{report}");
    assert_eq!(report["errors"], json!({"trap": seen}), "{report}");
    assert!(
        report["last_error"].as_str().unwrap().contains("trap"),
        "{report}"
    );

    // The link itself never failed a slab.
    let (_, list) = d.get("/v1/topics/orders/children").await;
    let cursor = &list["children"][0]["partitions"][0];
    assert_eq!(cursor["state"], "running", "{list}");
    assert!(cursor["last_error"].is_null(), "{list}");
    d.stop().await;
}

/// Runs the `narad` binary off the async runtime (the daemon it talks to runs on it).
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narad_child_shadow_sets_shows_the_report_as_a_table_and_clears() {
    let d = linked_daemon().await;
    let set = narad(
        &d.url,
        &[
            "child",
            "shadow",
            "set",
            "orders",
            "copy",
            "--router",
            "round-robin",
        ],
    )
    .await;
    assert!(set.status.success(), "{set:?}");
    let said = String::from_utf8(set.stdout).unwrap();
    assert!(
        said.contains("shadowing orders -> copy with round-robin"),
        "{said}"
    );
    let (_, status) = d.get(SHADOW).await;
    running(&d, &status["shadow"]["set_at_ms"]).await;
    d.produce("orders", keyed(0..40)).await;
    accounted(&d, 40).await;

    let shown = narad(&d.url, &["child", "shadow", "show", "orders", "copy"]).await;
    assert!(shown.status.success(), "{shown:?}");
    let table = String::from_utf8(shown.stdout).unwrap();
    assert!(
        table.contains("candidate round-robin against key-hash"),
        "{table}"
    );
    let seen = table
        .lines()
        .find(|l| l.starts_with("records seen"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(seen.split_whitespace().any(|w| w == "40"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("CHAIN")), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with("candidate ")),
        "{table}"
    );

    let cleared = narad(&d.url, &["child", "shadow", "clear", "orders", "copy"]).await;
    assert!(cleared.status.success(), "{cleared:?}");
    let gone = narad(&d.url, &["child", "shadow", "show", "orders", "copy"]).await;
    assert!(!gone.status.success(), "{gone:?}");
    let err = String::from_utf8(gone.stderr).unwrap();
    assert!(err.contains("has no shadow"), "{err}");
    d.stop().await;
}
