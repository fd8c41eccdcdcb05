//! Shadow routing in cluster mode: the link's cursors run on the owners of the parent's
//! partitions, each keeps its own shadow report, and a `GET` through any node sums them all.

use std::time::{Duration, Instant};

use narad_host::metastore::test_etcd::TestEtcd;
use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, http_client, send_json};

/// Longest wait for the cluster to converge (nodes seen, shadows started, slabs counted).
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

fn call(base: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    send_json(
        &http_client(),
        method,
        &format!("{base}{path}"),
        body.as_ref(),
    )
    .expect(path)
}

fn ok(answer: (u16, Value), what: &str) -> Value {
    assert!(
        (200..300).contains(&answer.0),
        "{what}: {} {}",
        answer.0,
        answer.1
    );
    answer.1
}

#[test]
fn a_shadow_report_asked_of_one_node_sums_the_reports_of_every_parent_partition_owner() {
    let etcd = TestEtcd::start();
    let endpoint = etcd.endpoint();
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes: Vec<Daemon> = ["n1", "n2"]
        .iter()
        .map(|id| {
            let args = [
                "--etcd",
                endpoint.as_str(),
                "--cluster",
                "shadow",
                "--node-id",
                id,
                "--lease-ttl-ms",
                "3000",
            ];
            Daemon::start_with(&dir.path().join(id), &args)
        })
        .collect();
    let (n1, n2) = (nodes[0].url(), nodes[1].url());
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for base in [&n1, &n2] {
        while ok(call(base, Method::GET, "/v1/nodes", None), "nodes")["nodes"]
            .as_array()
            .map(Vec::len)
            != Some(2)
        {
            assert!(Instant::now() < deadline, "the nodes never saw each other");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Parent partition 0 on n1, 1 on n2: each node runs one cursor of the link.
    for (name, placement) in [
        ("orders", json!(["n1", "n2"])),
        ("copy", json!(["n2", "n1"])),
    ] {
        let body = json!({"name": name, "partitions": 2, "placement": placement});
        ok(call(&n1, Method::POST, "/v1/topics", Some(body)), "create");
    }
    let attach = json!({"router": ["key-hash"]});
    ok(
        call(
            &n1,
            Method::PUT,
            "/v1/topics/orders/children/copy",
            Some(attach),
        ),
        "attach",
    );
    // The candidate sends every record (all carry region=us) to child partition 0.
    let shadow =
        json!({"router": ["header-route", "key-hash"], "config": "header = region\nus = 0\n"});
    let path = "/v1/topics/orders/children/copy/shadow";
    let set = ok(call(&n1, Method::PUT, path, Some(shadow)), "set the shadow");
    // Running on both owners: each node's own report says so.
    for base in [&n1, &n2] {
        loop {
            let local = ok(
                call(base, Method::GET, &format!("{path}?local=true"), None),
                "local report",
            );
            if local["running"] == true && local["shadow"]["set_at_ms"] == set["set_at_ms"] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the shadow never started: {local}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    let count = 100u32;
    let records: Vec<Value> = (0..count)
        .map(|i| {
            json!({"key": format!("k{i}"), "value": "v", "headers": {"region": "us"},
                   "partition": i % 2})
        })
        .collect();
    ok(
        call(
            &n1,
            Method::POST,
            "/v1/topics/orders/records",
            Some(json!({"records": records})),
        ),
        "produce",
    );
    let moved: u64 = (0..count)
        .filter(|i| narad_abi::partition_for_key(format!("k{i}").as_bytes(), 2) != Some(0))
        .count() as u64;
    // Asked of n2, which runs only partition 1's cursor: the sum covers both.
    let report = loop {
        let status = ok(call(&n2, Method::GET, path, None), "report");
        let r = &status["report"];
        let done =
            r["records_seen"].as_u64().unwrap_or(0) + r["records_skipped"].as_u64().unwrap_or(0);
        if done == u64::from(count) {
            assert_eq!(status["nodes"], json!(["n1", "n2"]), "{status}");
            assert!(status.get("nodes_unreachable").is_none(), "{status}");
            break status["report"].clone();
        }
        assert!(
            done < u64::from(count) && Instant::now() < deadline,
            "the summed report never covered {count} records: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(report["slabs_skipped"], 0, "{report}");
    assert_eq!(report["records_moved"], moved, "{report}");
    assert_eq!(report["records_same"], u64::from(count) - moved, "{report}");
    assert_eq!(
        report["moved"],
        json!([{"from": 1, "to": 0, "records": moved}]),
        "{report}"
    );
    drop(nodes);
}
