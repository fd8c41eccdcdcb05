//! Dead letters on the real binary: a plugin that traps on one key sets that record aside in
//! the link's dead-letter topic, whole and with headers naming why, while every other record
//! reaches the child in order; without a dead-letter topic the same record stalls the link.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, narad_cli, send_json};
use narad_runtime::testkit::WatRouter;

/// How long the copy may take. Generous for a busy CI machine: a healthy daemon needs one
/// retry back-off (a second) per poison record.
const WAIT: Duration = Duration::from_secs(90);

/// A router that traps on every record whose key starts with `X` and sends the others to
/// child partition 0.
fn trap_on_x() -> Vec<u8> {
    WatRouter::new("trap-x")
        .description("traps on keys starting with X")
        .route(
            "(local $n i32) (local $i i32) (local $table i32) (local $arena i32) (local $e i32)
             (local $klen i32)",
            r#"(local.set $n (i32.load offset=4 (local.get $in)))
    (local.set $table (i32.add (local.get $in) (i32.load offset=16 (local.get $in))))
    (local.set $arena (i32.add (local.get $in) (i32.load offset=20 (local.get $in))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $e (i32.add (local.get $table) (i32.mul (local.get $i) (i32.const 40))))
        (local.set $klen (i32.load offset=20 (local.get $e)))
        (if (i32.and (i32.ne (local.get $klen) (i32.const -1)) (i32.ne (local.get $klen) (i32.const 0)))
          (then (if (i32.eq (i32.const 88)
                  (i32.load8_u (i32.add (local.get $arena) (i32.load offset=16 (local.get $e)))))
            (then unreachable))))
        (i32.store (i32.add (local.get $out) (i32.mul (local.get $i) (i32.const 4))) (i32.const 0))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))"#,
        )
        .wasm()
}

/// Deploys [`trap_on_x`] as `trap-x` through `base`; returns its digest.
fn deploy_trap_on_x(client: &reqwest::blocking::Client, base: &str) -> String {
    let deployed = client
        .post(format!("{base}/v1/plugins?name=trap-x"))
        .body(trap_on_x())
        .send()
        .expect("deploy");
    assert!(
        deployed.status().is_success(),
        "deploy: {:?}",
        deployed.text()
    );
    deployed.json::<Value>().expect("deploy answer")["digest"]
        .as_str()
        .expect("digest")
        .to_owned()
}

fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

fn call(
    client: &reqwest::blocking::Client,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Value {
    let (status, answer) = send_json(client, method, url, body.as_ref()).expect(url);
    ok(status, &answer, url);
    answer
}

/// Produces `keys` to `orders` as one batch, each with the value `v-{key}`; the poison record
/// also carries a header of its own.
fn produce(client: &reqwest::blocking::Client, base: &str, keys: &[String]) {
    let records: Vec<Value> = keys
        .iter()
        .map(|k| {
            let mut record = json!({"key": k, "value": format!("v-{k}")});
            if k.starts_with('X') {
                record["headers"] = json!([{"name": "trace", "value": format!("t-{k}")}]);
            }
            record
        })
        .collect();
    call(
        client,
        Method::POST,
        &format!("{base}/v1/topics/orders/records"),
        Some(json!({"records": records})),
    );
}

/// Waits until `topic` partition 0 holds `n` records; returns them.
fn wait_for(client: &reqwest::blocking::Client, base: &str, topic: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let records = fetch_all(client, base, topic, 0);
        if records.len() >= n {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} holds {} of {n} records: {:?}",
            records.len(),
            call(
                client,
                Method::GET,
                &format!("{base}/v1/topics/orders/children"),
                None
            )
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn values(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["value"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn header(record: &Value, name: &str) -> Option<String> {
    record["headers"]
        .as_array()?
        .iter()
        .find(|h| h["name"] == name)
        .and_then(|h| h["value"].as_str().map(str::to_owned))
}

/// The listing entry of `orders -> copy`, parent partition 0.
fn cursor(client: &reqwest::blocking::Client, base: &str) -> Value {
    let listing = call(
        client,
        Method::GET,
        &format!("{base}/v1/topics/orders/children"),
        None,
    );
    listing["children"][0]["partitions"][0].clone()
}

#[test]
fn a_record_the_chain_cannot_route_goes_whole_to_the_dead_letter_topic_and_the_rest_to_the_child() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(dir.path());
    let client = http_client();
    let base = daemon.url();
    let digest = deploy_trap_on_x(&client, &base);
    for topic in ["orders", "copy", "orders-dlq"] {
        call(
            &client,
            Method::POST,
            &format!("{base}/v1/topics"),
            Some(json!({"name": topic, "partitions": 1})),
        );
    }
    // A dead-letter topic must exist, and be neither end of the link.
    let (status, refused) = send_json(
        &client,
        Method::PUT,
        &format!("{base}/v1/topics/orders/children/copy"),
        Some(&json!({"router": ["trap-x"], "dead_letter": "nope"})),
    )
    .expect("attach");
    assert_eq!(status, 400, "{refused}");
    assert!(refused.to_string().contains("does not exist"), "{refused}");
    let attached = narad_cli(
        &base,
        &[
            "child",
            "attach",
            "orders",
            "copy",
            "--router",
            "trap-x",
            "--dead-letter",
            "orders-dlq",
        ],
    );
    assert!(attached.contains("attached"), "{attached}");

    let keys: Vec<String> = (0..30)
        .map(|i| match i {
            10 => "X-ten".to_owned(),
            20 => "X-twenty".to_owned(),
            i => format!("k{i}"),
        })
        .collect();
    produce(&client, &base, &keys[..15]);
    produce(&client, &base, &keys[15..]);
    let copied = wait_for(&client, &base, "copy", 28);
    let letters = wait_for(&client, &base, "orders-dlq", 2);
    let wanted: Vec<String> = keys
        .iter()
        .filter(|k| !k.starts_with('X'))
        .map(|k| format!("v-{k}"))
        .collect();
    assert_eq!(
        values(&copied),
        wanted,
        "every other record, in order, once"
    );
    assert_eq!(values(&letters), ["v-X-ten", "v-X-twenty"]);
    for (letter, (offset, key)) in letters.iter().zip([(10, "X-ten"), (20, "X-twenty")]) {
        assert_eq!(letter["key"], key, "{letter}");
        assert_eq!(
            header(letter, "trace"),
            Some(format!("t-{key}")),
            "kept whole: {letter}"
        );
        for (name, want) in [
            ("narad.dlq.parent", "orders".to_owned()),
            ("narad.dlq.partition", "0".to_owned()),
            ("narad.dlq.offset", offset.to_string()),
            ("narad.dlq.child", "copy".to_owned()),
            ("narad.dlq.plugin", "trap-x".to_owned()),
            ("narad.dlq.digest", digest.clone()),
            ("narad.dlq.kind", "trap".to_owned()),
        ] {
            assert_eq!(
                header(letter, name).as_deref(),
                Some(want.as_str()),
                "{name}: {letter}"
            );
        }
        assert!(
            header(letter, "narad.dlq.error").is_some_and(|e| e.contains("trap")),
            "{letter}"
        );
    }
    let report = cursor(&client, &base);
    assert_eq!(report["dead_lettered"], 2, "{report}");
    assert_eq!(report["next_offset"], 30, "{report}");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("narad_fanout_dead_lettered_records_total{")
                && l.contains("child=\"copy\"")
                && l.ends_with(" 2")
        ),
        "counted on /metrics"
    );
    let listing = narad_cli(&base, &["child", "list", "orders"]);
    assert!(
        listing.contains("DEAD_LETTER") && listing.contains("orders-dlq"),
        "{listing}"
    );

    // Without a dead-letter topic the same kind of record stalls the link, skipping nothing;
    // naming one again lets it go on.
    let changed = narad_cli(
        &base,
        &["child", "set", "orders", "copy", "--dead-letter", ""],
    );
    assert!(changed.contains("stalls the cursor"), "{changed}");
    produce(&client, &base, &["X-late".to_owned(), "k-after".to_owned()]);
    let deadline = Instant::now() + WAIT;
    loop {
        let report = cursor(&client, &base);
        if report["state"] == "stalled"
            && report["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("parent offset 30"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never stalled on the poison: {report}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fetch_all(&client, &base, "copy", 0).len(), 28);
    narad_cli(
        &base,
        &[
            "child",
            "set",
            "orders",
            "copy",
            "--dead-letter",
            "orders-dlq",
        ],
    );
    let copied = wait_for(&client, &base, "copy", 29);
    assert_eq!(
        values(&copied).last().map(String::as_str),
        Some("v-k-after")
    );
    let letters = wait_for(&client, &base, "orders-dlq", 3);
    assert_eq!(values(&letters)[2], "v-X-late");
    assert_eq!(
        fetch_all(&client, &base, "copy", 0).len(),
        29,
        "nothing twice"
    );
}

#[test]
fn in_a_cluster_a_letter_goes_to_the_dead_letter_partition_on_another_node() {
    let cluster = crate::e2e::cluster::Cluster::start("dead-letter");
    let client = http_client();
    let base = cluster.url(0);
    deploy_trap_on_x(&client, &base);
    // The parent's one partition on n1 (its cursor there), the child on n2, the dead-letter
    // topic on n3: the letter is a commit to another node, fenced and deduplicated there.
    cluster.create("orders", 1, json!(["n1"]));
    cluster.create("copy", 1, json!(["n2"]));
    cluster.create("orders-dlq", 1, json!(["n3"]));
    cluster.attach(
        "orders",
        "copy",
        json!({"router": ["trap-x"], "dead_letter": "orders-dlq"}),
    );
    let keys: Vec<String> = (0..12)
        .map(|i| match i {
            5 => "X-five".to_owned(),
            i => format!("k{i}"),
        })
        .collect();
    produce(&client, &base, &keys);
    let copied = wait_for(&client, &base, "copy", 11);
    let letters = wait_for(&client, &base, "orders-dlq", 1);
    let wanted: Vec<String> = keys
        .iter()
        .filter(|k| !k.starts_with('X'))
        .map(|k| format!("v-{k}"))
        .collect();
    assert_eq!(values(&copied), wanted);
    assert_eq!(values(&letters), ["v-X-five"]);
    assert_eq!(
        header(&letters[0], "narad.dlq.offset").as_deref(),
        Some("5")
    );
}
