//! Cluster mode end to end: three real `narad serve` processes on one real etcd (started by
//! the test on free loopback ports, data on a RAM disk), driven over HTTP.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use narad_host::metastore::test_etcd::TestEtcd;
use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, narad_binary, peer_secret, send_json};

/// Longest wait for the cluster to converge (nodes seen, records copied).
pub(super) const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Short leases, so a test never waits out the 10 s default.
const LEASE_TTL_MS: &str = "3000";

/// A real etcd and three nodes `n1`, `n2`, `n3` of one cluster.
pub(super) struct Cluster {
    pub(super) nodes: Vec<Daemon>,
    _etcd: TestEtcd,
    _dir: tempfile::TempDir,
}

/// The arguments of node `node`; with the short test lease unless `extra` names one.
fn cluster_args<'a>(
    etcd: &'a str,
    cluster: &'a str,
    node: &'a str,
    extra: &[String],
) -> Vec<&'a str> {
    let mut args = vec!["--etcd", etcd, "--cluster", cluster, "--node-id", node];
    if !extra.iter().any(|a| a == "--lease-ttl-ms") {
        args.extend(["--lease-ttl-ms", LEASE_TTL_MS]);
    }
    args
}

impl Cluster {
    pub(super) fn start(name: &str) -> Cluster {
        Cluster::start_with(name, &[])
    }

    /// [`Cluster::start`] with `extra` arguments for every node.
    pub(super) fn start_with(name: &str, extra: &[&str]) -> Cluster {
        Cluster::start_nodes(name, |_| extra.iter().map(|a| (*a).to_owned()).collect())
    }

    /// [`Cluster::start_with`], each node also serving Kafka on a free loopback port; returns
    /// the Kafka addresses too, by node.
    pub(super) fn start_with_kafka(name: &str, extra: &[&str]) -> (Cluster, Vec<String>) {
        let kafka: Vec<String> = (0..3)
            .map(|_| {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("free port")
                    .port();
                format!("127.0.0.1:{port}")
            })
            .collect();
        let cluster = Cluster::start_nodes(name, |node| {
            let mut args = vec!["--kafka-listen".to_owned(), kafka[node].clone()];
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            args
        });
        (cluster, kafka)
    }

    /// Three nodes on a new etcd, node `i` started with `args_of(i)` after the cluster
    /// arguments; returns once every node sees the three.
    fn start_nodes(name: &str, args_of: impl Fn(usize) -> Vec<String>) -> Cluster {
        Cluster::start_nodes_under(name, &[], args_of)
    }

    /// [`Cluster::start_nodes`], each `narad serve` run by `launcher` (a program that execs
    /// the command after it, such as `env NAME=value`).
    fn start_nodes_under(
        name: &str,
        launcher: &[&str],
        args_of: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        let etcd = TestEtcd::start();
        let endpoint = etcd.endpoint();
        let dir = tempfile::tempdir().expect("tempdir");
        let nodes = ["n1", "n2", "n3"]
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let extra = args_of(i);
                let mut args = cluster_args(&endpoint, name, id, &extra);
                args.extend(extra.iter().map(String::as_str));
                Daemon::start_under(&dir.path().join(id), launcher, &args)
            })
            .collect();
        let cluster = Cluster {
            nodes,
            _etcd: etcd,
            _dir: dir,
        };
        cluster.wait_for_nodes(3);
        cluster
    }

    /// What each node says about `parent`'s children, and the end of its log: for a failure
    /// message.
    pub(super) fn diagnostics(&self, parent: &str) -> String {
        let client = http_client();
        let mut text = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let children = send_json(
                &client,
                Method::GET,
                &format!("{}/v1/topics/{parent}/children", node.url()),
                None,
            )
            .map(|(_, body)| body.to_string())
            .unwrap_or_else(|e| e.to_string());
            let log = node.log();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            text.push_str(&format!(
                "--- n{}: children {children}\n{}\n",
                i + 1,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        text
    }

    pub(super) fn url(&self, node: usize) -> String {
        self.nodes[node].url()
    }

    /// Creates `name` through n1 with `partitions` partitions placed as `placement`.
    pub(super) fn create(&self, name: &str, partitions: u32, placement: Value) {
        let (status, body) = send_json(
            &http_client(),
            Method::POST,
            &format!("{}/v1/topics", self.url(0)),
            Some(&json!({"name": name, "partitions": partitions, "placement": placement})),
        )
        .expect("create");
        ok(status, &body, "create");
    }

    /// Attaches `child` to `parent` through n1 with the attach `body`; the answer.
    pub(super) fn attach(&self, parent: &str, child: &str, body: Value) -> Value {
        let (status, answer) = send_json(
            &http_client(),
            Method::PUT,
            &format!("{}/v1/topics/{parent}/children/{child}", self.url(0)),
            Some(&body),
        )
        .expect("attach");
        ok(status, &answer, "attach");
        answer
    }

    /// Produces `records` (the produce API's records) to `topic` through n1; the answer.
    pub(super) fn produce(&self, topic: &str, records: Value) -> Value {
        let (status, answer) = send_json(
            &http_client(),
            Method::POST,
            &format!("{}/v1/topics/{topic}/records", self.url(0)),
            Some(&json!({ "records": records })),
        )
        .expect("produce");
        ok(status, &answer, "produce");
        answer
    }

    /// Waits until every node lists `count` live nodes.
    pub(super) fn wait_for_nodes(&self, count: usize) {
        let client = http_client();
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        for node in &self.nodes {
            loop {
                let (status, body) = send_json(
                    &client,
                    Method::GET,
                    &format!("{}/v1/nodes", node.url()),
                    None,
                )
                .expect("nodes");
                assert_eq!(status, 200, "{body}");
                if body["nodes"].as_array().map(Vec::len) == Some(count) {
                    break;
                }
                assert!(Instant::now() < deadline, "nodes never converged: {body}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

pub(super) fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

/// Every record of every partition of `topic`, read through node `base`.
fn everything(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    partitions: u32,
) -> BTreeMap<u32, Vec<Value>> {
    (0..partitions)
        .map(|p| (p, fetch_all(client, base, topic, p)))
        .collect()
}

#[test]
fn records_produced_through_any_node_reach_a_child_on_other_nodes_once_in_key_order() {
    let cluster = Cluster::start("fanout-across");
    let client = http_client();

    // /v1/nodes on any node lists all three with their addresses.
    let (_, nodes) = send_json(
        &client,
        Method::GET,
        &format!("{}/v1/nodes", cluster.url(1)),
        None,
    )
    .expect("nodes");
    assert_eq!(nodes["mode"], "cluster", "{nodes}");
    assert_eq!(nodes["this_node"], "n2", "{nodes}");
    let ids: Vec<&str> = nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["n1", "n2", "n3"]);
    assert_eq!(nodes["nodes"][0]["advertise"], cluster.url(0).as_str());
    // And /metrics says how many it sees.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let text = client
            .get(format!("{}/metrics", cluster.url(1)))
            .send()
            .and_then(|r| r.text())
            .expect("metrics");
        if text.lines().any(|l| l == "narad_cluster_live_nodes 3") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "live nodes never reached 3:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A parent pinned one partition per node, created through n1.
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics", cluster.url(0)),
        Some(&json!({"name": "orders", "partitions": 3, "placement": ["n1", "n2", "n3"]})),
    )
    .expect("create");
    ok(status, &body, "create");
    assert_eq!(body["owners"], json!(["n1", "n2", "n3"]), "{body}");
    // A pinned node that is not alive is refused, naming it.
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics", cluster.url(0)),
        Some(&json!({"name": "typo", "partitions": 1, "placement": ["n9"]})),
    )
    .expect("create");
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("n9"),
        "{body}"
    );

    // A child with the parent's count, attached through n2: each child partition lands on
    // another node than its parent partition.
    let (status, link) = send_json(
        &client,
        Method::PUT,
        &format!("{}/v1/topics/orders/children/copy", cluster.url(1)),
        Some(&json!({"partitions": 3})),
    )
    .expect("attach");
    ok(status, &link, "attach");
    // Another node serves its watched copy of the metadata: the new child shows there
    // within a moment, not necessarily at once.
    let deadline = Instant::now() + Duration::from_secs(15);
    let copy = loop {
        let (status, copy) = send_json(
            &client,
            Method::GET,
            &format!("{}/v1/topics/copy", cluster.url(2)),
            None,
        )
        .expect("describe");
        if status == 200 || Instant::now() > deadline {
            break copy;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let child_owners: Vec<String> = copy["owners"]
        .as_array()
        .expect("owners")
        .iter()
        .map(|o| o.as_str().expect("owner").to_owned())
        .collect();
    assert_eq!(child_owners.len(), 3, "{copy}");
    for (p, owner) in child_owners.iter().enumerate() {
        assert_ne!(owner, ["n1", "n2", "n3"][p], "child partition {p}: {copy}");
    }

    // 600 keyed records, produced through n3 in batches: n3 forwards what it does not own.
    let keys = 40;
    let mut sent = 0;
    for batch in 0..6 {
        let records: Vec<Value> = (0..100)
            .map(|i| {
                let n = batch * 100 + i;
                json!({"key": format!("k{}", n % keys), "value": format!("v{n}")})
            })
            .collect();
        let (status, body) = send_json(
            &client,
            Method::POST,
            &format!("{}/v1/topics/orders/records", cluster.url(2)),
            Some(&json!({"records": records})),
        )
        .expect("produce");
        ok(status, &body, "produce");
        sent += 100;
    }

    // The parent, read through n1 (which forwards fetches of the others' partitions).
    let parent = everything(&client, &cluster.url(0), "orders", 3);
    let total: usize = parent.values().map(Vec::len).sum();
    assert_eq!(total, sent);
    let mut parent_partition_of_key = BTreeMap::new();
    for (p, records) in &parent {
        for r in records {
            parent_partition_of_key.insert(r["key"].as_str().expect("key").to_owned(), *p);
        }
    }

    // Every parent record reaches the child: once per (parent partition, offset), in the
    // parent partition's index (key-hash with equal counts), in per-key order.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let child = loop {
        let child = everything(&client, &cluster.url(0), "copy", 3);
        let held: usize = child.values().map(Vec::len).sum();
        if held >= sent {
            break child;
        }
        assert!(
            Instant::now() < deadline,
            "the child holds {held} of {sent}\n{}",
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut origins = HashSet::new();
    let mut last_value_of_key: BTreeMap<String, u64> = BTreeMap::new();
    for (p, records) in &child {
        for r in records {
            let key = r["key"].as_str().expect("key").to_owned();
            assert_eq!(parent_partition_of_key.get(&key), Some(p), "{r}");
            let origin = (
                r["origin"]["partition"].as_u64(),
                r["origin"]["offset"].as_u64(),
            );
            assert!(origin.0.is_some() && origin.1.is_some(), "no origin: {r}");
            assert!(origins.insert(origin), "a duplicate without a crash: {r}");
            let n: u64 = r["value"].as_str().expect("value")[1..].parse().expect("n");
            if let Some(&before) = last_value_of_key.get(&key) {
                assert!(n > before, "{key}: v{n} after v{before}");
            }
            last_value_of_key.insert(key, n);
        }
    }
    assert_eq!(origins.len(), sent);

    // The tail scan a restarted cursor asks of a child partition's owner finds this link's
    // newest slab of parent partition 0 there.
    let epoch = link["attach_epoch"].as_str().expect("epoch");
    let highest = parent[&0].last().expect("records")["offset"]
        .as_u64()
        .expect("offset");
    let owner = ["n1", "n2", "n3"]
        .iter()
        .position(|n| *n == child_owners[0])
        .expect("owner");
    let (status, tail) = send_json(
        &client,
        Method::GET,
        &format!(
            "{}/internal/v1/topics/copy/partitions/0/tail?epoch={epoch}&parent_partition=0",
            cluster.url(owner)
        ),
        None,
    )
    .expect("tail");
    ok(status, &tail, "tail scan");
    assert_eq!(
        tail["scan"]["evidence"]["highest_parent_offset"], highest,
        "{tail}"
    );

    // The children listing on any node gathers every parent partition's cursor, each naming
    // the node that runs it (the parent partition's owner).
    let (status, listing) = send_json(
        &client,
        Method::GET,
        &format!("{}/v1/topics/orders/children", cluster.url(2)),
        None,
    )
    .expect("children");
    ok(status, &listing, "children");
    let copy = &listing["children"][0];
    let nodes: Vec<&str> = copy["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["node"].as_str().expect("node"))
        .collect();
    assert_eq!(nodes, ["n1", "n2", "n3"], "{listing}");
}

#[test]
fn a_second_process_with_a_live_node_id_refuses_to_start() {
    let etcd = TestEtcd::start();
    let endpoint = etcd.endpoint();
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = Daemon::start_with(
        &dir.path().join("a"),
        &cluster_args(&endpoint, "one-id", "n1", &[]),
    );
    let (status, stderr) = run_to_exit(
        &dir.path().join("b"),
        &cluster_args(&endpoint, "one-id", "n1", &[]),
    );
    assert!(!status.success(), "the second process started");
    assert!(stderr.contains("n1"), "{stderr}");
    assert!(stderr.contains("live process"), "{stderr}");
}

/// The live nodes n1 lists.
pub(super) fn live_nodes(cluster: &Cluster) -> Vec<String> {
    let (status, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{}/v1/nodes", cluster.url(0)),
        None,
    )
    .expect("nodes");
    assert_eq!(status, 200, "{body}");
    body["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| n["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until n1 lists exactly `ids` as the live nodes.
fn wait_for_live(cluster: &Cluster, ids: &[&str]) {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let mut live = live_nodes(cluster);
        live.sort();
        if live == ids {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "live nodes {live:?}, waited for {ids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_node_refuses_a_data_dir_not_its_own_and_takes_a_new_one_only_once_it_owns_nothing() {
    let mut cluster = Cluster::start("data-dirs");
    let client = http_client();
    cluster.create("orders", 1, json!(["n2"]));
    cluster.create("copy", 1, json!(["n1"]));
    // A child on the same node as its parent: the parent can only be re-created after it.
    cluster.create("tally", 1, json!(["n2"]));
    cluster.attach("orders", "copy", json!({}));
    cluster.attach("orders", "tally", json!({}));
    let records: Vec<Value> = (0..50)
        .map(|i| json!({"key": "k", "value": format!("v{i}")}))
        .collect();
    cluster.produce("orders", json!(records));
    let values: Vec<String> = (0..50).map(|i| format!("v{i}")).collect();
    wait_for_values(&cluster, "copy", 1, &values);

    let endpoint = cluster._etcd.endpoint();
    let args = cluster_args(&endpoint, "data-dirs", "n2", &[]);
    let with = |extra: &[&'static str]| -> Vec<&str> {
        let mut all = args.clone();
        all.extend_from_slice(extra);
        all
    };
    let old_dir = cluster._dir.path().join("n2");
    // Where n2 lands when its disk did not mount: an empty directory.
    let empty = cluster._dir.path().join("n2-empty");
    cluster.nodes[1].kill9();
    wait_for_live(&cluster, &["n1", "n3"]);

    let (status, stderr) = run_to_exit(&empty, &args);
    assert!(!status.success(), "n2 started on an empty data dir");
    for wanted in [
        "is not the one node \"n2\" last ran on",
        "orders/0",
        "narad node recreate n2 --accept-loss",
        "--new-data-dir-for n2",
    ] {
        assert!(stderr.contains(wanted), "{wanted:?} missing from: {stderr}");
    }
    // Said once: the error chain does not repeat a cause inside its wrapper's message.
    assert_eq!(stderr.matches("last ran on").count(), 1, "{stderr}");
    assert!(
        !empty.join("topics").join("orders").exists(),
        "a partition directory was made on the wrong data dir"
    );
    // Nothing of n2 is served meanwhile: the partition is unavailable, not empty.
    let (status, body) = send_json(
        &client,
        Method::GET,
        &format!(
            "{}/v1/topics/orders/partitions/0/records?offset=0",
            cluster.url(0)
        ),
        None,
    )
    .expect("fetch");
    assert_eq!(status, 503, "{body}");

    // Taking the new directory is refused while n2 still owns a partition.
    let (status, stderr) = run_to_exit(&empty, &with(&["--new-data-dir-for", "n2"]));
    assert!(
        !status.success(),
        "n2 took a new data dir while owning orders/0"
    );
    assert!(stderr.contains("still gives node"), "{stderr}");
    assert!(stderr.contains("orders/0"), "{stderr}");

    // The operator gives up the old disk: every partition of n2 is re-created on the live
    // nodes (`tally/0` before `orders/0`, whose link needs it to say what it holds), then n2
    // takes the new directory, and starts on it again without the flag.
    let n1 = cluster.url(0);
    let node_recreate = |extra: &[&str]| {
        let output = Command::new(narad_binary())
            .args(["node", "recreate", "n2", "--url", &n1])
            .args(extra)
            .output()
            .expect("narad node recreate");
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (status, _, stderr) = node_recreate(&[]);
    assert!(!status.success(), "re-created without --accept-loss");
    assert!(stderr.contains("--accept-loss"), "{stderr}");
    let (status, stdout, stderr) = node_recreate(&["--accept-loss"]);
    assert!(status.success(), "{stdout}\n{stderr}");
    for wanted in [
        "re-created orders/0",
        "re-created tally/0",
        "--new-data-dir-for n2",
    ] {
        assert!(stdout.contains(wanted), "{wanted:?} missing from: {stdout}");
    }
    // `orders` comes first in name order, and waits for `tally`.
    assert!(
        stdout.find("re-created tally/0") < stdout.find("re-created orders/0"),
        "{stdout}"
    );
    cluster.nodes[1] = Daemon::start_with(&empty, &with(&["--new-data-dir-for", "n2"]));
    wait_for_live(&cluster, &["n1", "n2", "n3"]);
    // Alive, it has nothing to re-create.
    let (status, _, stderr) = node_recreate(&["--accept-loss"]);
    assert!(!status.success(), "re-created a live node's partitions");
    assert!(stderr.contains("is alive"), "{stderr}");
    cluster.nodes[1].restart();
    wait_for_live(&cluster, &["n1", "n2", "n3"]);
    cluster.nodes[1].kill9();
    wait_for_live(&cluster, &["n1", "n3"]);

    // The old disk, back after n2 took the new one, is refused: its partition lives elsewhere.
    let (status, stderr) = run_to_exit(&old_dir, &args);
    assert!(!status.success(), "n2 started on its old data dir");
    assert!(stderr.contains("is not the one node"), "{stderr}");
    // And a node's directory is never served under another node id.
    let (status, stderr) = run_to_exit(&old_dir, &cluster_args(&endpoint, "data-dirs", "n4", &[]));
    assert!(!status.success(), "n4 started on n2's data dir");
    assert!(stderr.contains("belongs to node \"n2\""), "{stderr}");
    assert!(
        old_dir.join("topics").join("orders").exists(),
        "the old data dir was changed"
    );
}

#[test]
fn a_parent_partition_that_lost_its_directory_has_its_new_records_copied_not_taken_for_repeats() {
    let mut cluster = Cluster::start("reused-offsets");
    let client = http_client();
    cluster.create("orders", 1, json!(["n2"]));
    cluster.create("copy", 1, json!(["n1"]));
    cluster.attach("orders", "copy", json!({}));
    let n1 = cluster.url(0);
    let produce = |values: &[String]| -> Vec<u64> {
        let records: Vec<Value> = values
            .iter()
            .map(|v| json!({"key": "k", "value": v}))
            .collect();
        let (status, body) = send_json(
            &client,
            Method::POST,
            &format!("{n1}/v1/topics/orders/records"),
            Some(&json!({"records": records})),
        )
        .expect("produce");
        ok(status, &body, "produce");
        body["offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .map(|o| o["offset"].as_u64().expect("offset"))
            .collect()
    };
    let old: Vec<String> = (0..50).map(|i| format!("old-{i}")).collect();
    produce(&old);
    wait_for_values(&cluster, "copy", 1, &old);

    // While n2 is down its partition's directory goes (removed by hand, or put in lost+found
    // by a file system repair); the rest of its data dir is intact, so it starts, and makes
    // the partition again, empty: the next records get offsets 0, 1, ... once more.
    cluster.nodes[1].kill9();
    // Gone for n1 first, so the wait below sees the restarted n2 (its new address), not the
    // killed one's key before its lease ends.
    wait_for_live(&cluster, &["n1", "n3"]);
    let partition_dir = cluster
        ._dir
        .path()
        .join("n2")
        .join("topics")
        .join("orders")
        .join("p00000");
    std::fs::remove_dir_all(&partition_dir).expect("remove the partition directory");
    cluster.nodes[1].restart();
    wait_for_live(&cluster, &["n1", "n2", "n3"]);
    let new: Vec<String> = (0..10).map(|i| format!("new-{i}")).collect();
    let offsets = produce(&new);
    assert_eq!(offsets.first(), Some(&0), "the offsets were not reused");

    // The child held copies under those origins, of other records: the new ones are copied
    // all the same, and the owner of the child says why in its log.
    let mut everything = old.clone();
    everything.extend(new);
    wait_for_values(&cluster, "copy", 1, &everything);
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while !cluster.nodes[0]
        .log()
        .contains("gave those offsets to new records")
    {
        assert!(Instant::now() < deadline, "{}", cluster.nodes[0].log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = client
        .get(format!("{}/metrics", cluster.url(0)))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    let reused: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("narad_cluster_commit_reused_origin_records_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no reused-origin counter in:\n{metrics}"));
    assert_eq!(reused, 10.0, "the ten new records, counted once each");

    // Its identity file lost too (but every partition it owns still there): n2 takes the
    // directory as its own again instead of refusing it.
    cluster.nodes[1].kill9();
    wait_for_live(&cluster, &["n1", "n3"]);
    let identity = cluster
        ._dir
        .path()
        .join("n2")
        .join("cluster")
        .join("identity.json");
    std::fs::write(&identity, b"{ damaged").expect("damage the identity file");
    cluster.nodes[1].restart();
    wait_for_live(&cluster, &["n1", "n2", "n3"]);
    assert!(
        cluster.nodes[1]
            .log()
            .contains("taken as the node's recorded data dir again"),
        "{}",
        cluster.nodes[1].log()
    );
}

/// Runs `narad serve` on `data_dir` with `args` and waits (at most 60 s, then kills it) for
/// it to exit; returns its exit status and what it wrote to stderr.
fn run_to_exit(data_dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let log = data_dir.with_extension("stderr");
    let mut child = Command::new(narad_binary())
        .args(["serve", "--data-dir"])
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("stderr file"))
        .spawn()
        .expect("spawn narad");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for narad") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("narad serve did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

/// A thread producing batches of 20 keyed records (16 keys) to `topic` through `base` until
/// [`Producer::finish`], counting the records acknowledged (200) as it goes, so a test waits for
/// traffic to have flowed rather than for a fixed time.
struct Producer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acknowledged: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Requests sent, answered or not.
    tried: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Producer {
    fn start(base: String, topic: &'static str) -> Producer {
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tried = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (halt, count, tries) = (
            std::sync::Arc::clone(&stop),
            std::sync::Arc::clone(&acknowledged),
            std::sync::Arc::clone(&tried),
        );
        let thread = std::thread::spawn(move || {
            let client = http_client();
            let mut acknowledged = Vec::new();
            let mut n = 0u64;
            while !halt.load(Relaxed) {
                let values: Vec<String> = (n..n + 20).map(|i| format!("v{i}")).collect();
                let records: Vec<Value> = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| json!({"key": format!("k{}", (n as usize + i) % 16), "value": v}))
                    .collect();
                n += 20;
                let answer = send_json(
                    &client,
                    Method::POST,
                    &format!("{base}/v1/topics/{topic}/records"),
                    Some(&json!({"records": records})),
                );
                if let Ok((200, _)) = answer {
                    acknowledged.extend(values);
                    count.store(acknowledged.len(), Relaxed);
                }
                tries.fetch_add(1, Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
            acknowledged
        });
        Producer {
            stop,
            acknowledged,
            tried,
            thread,
        }
    }

    /// Waits until `more` requests beyond those sent so far were sent and answered (or not):
    /// what "for a while" means to a test that keeps a node down as the producer goes on (each
    /// of its requests spans every partition, so none is acknowledged meanwhile).
    fn wait_for_tries(&self, more: usize, what: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        let target = self.tried.load(Relaxed) + more;
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        while self.tried.load(Relaxed) < target {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {target} requests sent",
                self.tried.load(Relaxed)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `more` records beyond those acknowledged so far are acknowledged.
    fn wait_for_more(&self, more: usize, what: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        let target = self.acknowledged.load(Relaxed) + more;
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        while self.acknowledged.load(Relaxed) < target {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {target} records acknowledged",
                self.acknowledged.load(Relaxed)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the thread; every record it had acknowledged.
    fn finish(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("producer")
    }
}

/// The values `topic` holds, read through `base`.
fn values_in(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    partitions: u32,
) -> HashSet<String> {
    everything(client, base, topic, partitions)
        .into_values()
        .flatten()
        .map(|r| r["value"].as_str().expect("value").to_owned())
        .collect()
}

/// Waits until `topic` holds every value of `wanted`.
fn wait_for_values(cluster: &Cluster, topic: &str, partitions: u32, wanted: &[String]) {
    let client = http_client();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let held = values_in(&client, &cluster.url(0), topic, partitions);
        let missing: Vec<&String> = wanted.iter().filter(|v| !held.contains(*v)).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} misses {} of {} acknowledged records (first: {})\n{}",
            missing.len(),
            wanted.len(),
            missing[0],
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every cursor of `parent` -> `child` reports its durable position at the
/// parent's end (`lag_messages` 0 on every partition, every node answering): with the parent
/// no longer written, no cursor has a slab left to copy or to repeat.
fn wait_until_caught_up(cluster: &Cluster, parent: &str, child: &str) {
    let client = http_client();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let (status, listing) = send_json(
            &client,
            Method::GET,
            &format!("{}/v1/topics/{parent}/children", cluster.url(0)),
            None,
        )
        .expect("children");
        let link = listing["children"]
            .as_array()
            .and_then(|c| c.iter().find(|l| l["name"] == child).cloned())
            .unwrap_or(Value::Null);
        let partitions = link["partitions"].as_array().cloned().unwrap_or_default();
        if status == 200
            && link["lag_complete"] == true
            && !partitions.is_empty()
            && partitions.iter().all(|p| p["lag_messages"] == 0)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{parent} -> {child} never caught up: {listing}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_dead_child_owner_stalls_only_its_link_and_nothing_is_missing_after_it_returns() {
    let mut cluster = Cluster::start("child-owner-dies");
    let client = http_client();
    let create = |name: &str, placement: Value| {
        cluster.create(name, 2, placement);
    };
    // The parent on n1 and n2; one child entirely on n3, another on n1 and n2.
    create("orders", json!(["n1", "n2"]));
    create("on-n3", json!(["n3", "n3"]));
    create("beside", json!(["n2", "n1"]));
    for child in ["on-n3", "beside"] {
        cluster.attach("orders", child, json!({}));
    }

    let producer = Producer::start(cluster.url(0), "orders");
    // Both cursors of orders/0 have started and know their position before n3 dies. (A
    // cursor with no offset file yet waits for every child owner to scan its tail before it
    // has a position.)
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for child in ["on-n3", "beside"] {
        while !listed_partition(&cluster.url(0), "orders", child)["next_offset"].is_u64() {
            assert!(
                Instant::now() < deadline,
                "{}",
                cluster.diagnostics("orders")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    producer.wait_for_more(100, "records before n3 dies");
    cluster.nodes[2].kill9();
    producer.wait_for_more(60, "records while n3 is down");

    // While n3 is down: the parent takes records and the other link keeps copying them.
    let before = values_in(&client, &cluster.url(0), "orders", 2);
    assert!(!before.is_empty());
    let so_far: Vec<String> = before.into_iter().collect();
    wait_for_values(&cluster, "beside", 2, &so_far);
    // The link to n3 waits on n3's buckets and says so (once its next commit has failed).
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let (_, children) = send_json(
            &client,
            Method::GET,
            &format!("{}/v1/topics/orders/children", cluster.url(0)),
            None,
        )
        .expect("children");
        let on_n3 = children["children"]
            .as_array()
            .and_then(|c| c.iter().find(|l| l["name"] == "on-n3").cloned())
            .expect("on-n3 listed");
        let error = on_n3["partitions"][0]["last_error"].as_str().unwrap_or("");
        if error.contains("n3") {
            break;
        }
        assert!(Instant::now() < deadline, "{on_n3}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its lag keeps rising on n1 (the owner of orders/0) while its cursor waits in a commit,
    // so a lag alert fires; it used to freeze where the stalled slab left it.
    let lag = || {
        let text = client
            .get(format!("{}/metrics", cluster.url(0)))
            .send()
            .and_then(|r| r.text())
            .expect("metrics");
        text.lines()
            .find(|l| {
                l.starts_with("narad_fanout_lag_messages{")
                    && l.contains("child=\"on-n3\"")
                    && l.contains("partition=\"0\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    // The series goes with a cursor that stops and comes back with it.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let first = loop {
        if let Some(lag) = lag() {
            break lag;
        }
        assert!(
            Instant::now() < deadline,
            "no lag series for the stalled cursor"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    while lag().is_none_or(|lag| lag <= first) {
        assert!(
            Instant::now() < deadline,
            "the lag of the stalled link stayed at {first} while records kept arriving"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    cluster.nodes[2].restart();
    producer.wait_for_more(40, "records after n3 is back");
    let acknowledged = producer.finish();
    assert!(
        acknowledged.len() > 100,
        "{} acknowledged",
        acknowledged.len()
    );
    wait_for_values(&cluster, "on-n3", 2, &acknowledged);
    wait_for_values(&cluster, "beside", 2, &acknowledged);
}

#[test]
fn a_parent_owner_restarted_while_a_child_owner_is_dead_copies_to_the_live_child_partitions() {
    let mut cluster = Cluster::start("restart-beside-dead");
    let client = http_client();
    // The parent on n1; the child split between n2 and n3.
    cluster.create("orders", 1, json!(["n1"]));
    cluster.create("split", 2, json!(["n2", "n3"]));
    cluster.attach("orders", "split", json!({}));
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while !listed_partition(&cluster.url(0), "orders", "split")["next_offset"].is_u64() {
        assert!(
            Instant::now() < deadline,
            "{}",
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Records copied to both halves while every node is up.
    let produce = |base: &str, tag: &str| -> Vec<String> {
        let values: Vec<String> = (0..64).map(|i| format!("{tag}-{i}")).collect();
        let records: Vec<Value> = values
            .iter()
            .enumerate()
            .map(|(i, v)| json!({"key": format!("k{i}"), "value": v}))
            .collect();
        // A node just restarted takes its partitions back once it holds its lease again.
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            let answer = send_json(
                &client,
                Method::POST,
                &format!("{base}/v1/topics/orders/records"),
                Some(&json!({"records": records})),
            );
            match answer {
                Ok((200, _)) => return values,
                other => assert!(Instant::now() < deadline, "produce: {other:?}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let before = produce(&cluster.url(0), "before");
    wait_for_values(&cluster, "split", 2, &before);

    // n3 dies, then the parent's owner restarts: its cursor starts with one child owner down.
    cluster.nodes[2].kill9();
    cluster.nodes[0].restart();
    let after = produce(&cluster.url(0), "after");
    // The half on n2 gets its records while n3 is still down. (The cursor used to wait at
    // its start for n3 to scan its half's tail, copying nothing anywhere.)
    let on_n2 = |client: &reqwest::blocking::Client| -> HashSet<String> {
        fetch_all(client, &cluster.url(1), "split", 0)
            .into_iter()
            .map(|r| r["value"].as_str().expect("value").to_owned())
            .collect()
    };
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while !on_n2(&client).iter().any(|v| v.starts_with("after-")) {
        assert!(
            Instant::now() < deadline,
            "nothing produced after the restart reached split/0 on n2 while n3 was down\n{}",
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // n3 back: every record in the child, each once.
    cluster.nodes[2].restart();
    let all: Vec<String> = before.iter().chain(&after).cloned().collect();
    wait_for_values(&cluster, "split", 2, &all);
    let everything_held: Vec<String> = everything(&client, &cluster.url(0), "split", 2)
        .into_values()
        .flatten()
        .map(|r| r["value"].as_str().expect("value").to_owned())
        .collect();
    assert_eq!(everything_held.len(), all.len(), "each record once");
}

#[test]
fn a_dead_parent_owner_fails_only_its_partitions_and_its_cursors_resume_after_restart() {
    let mut cluster = Cluster::start("parent-owner-dies");
    let client = http_client();
    for (name, placement) in [
        ("orders", json!(["n1", "n2", "n3"])),
        ("copy", json!(["n2", "n3", "n1"])),
    ] {
        cluster.create(name, 3, placement);
    }
    cluster.attach("orders", "copy", json!({}));

    let producer = Producer::start(cluster.url(0), "orders");
    producer.wait_for_more(100, "records before n3 dies");
    cluster.nodes[2].kill9();

    // n3 owned orders/2: a produce to it is refused with a retriable answer naming n3, and
    // nothing of such a request counts as acknowledged; partition 0 (n1) keeps serving.
    let to = |partition: u32| {
        send_json(
            &client,
            Method::POST,
            &format!("{}/v1/topics/orders/records", cluster.url(1)),
            Some(&json!({"records": [{"value": format!("direct-{partition}"), "partition": partition}]})),
        )
        .expect("produce")
    };
    let (status, body) = to(2);
    assert!(status == 503 || status == 502, "{status} {body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("n3"),
        "{body}"
    );
    let (status, body) = to(0);
    ok(status, &body, "produce to n1's partition while n3 is down");

    // The children listing keeps a row for n3's cursor and says why it has no report (it used
    // to leave the row out, with a footnote that some may be missing). The live nodes' cursors
    // may restart as n3's lease runs out, so their rows are waited for.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let out = Command::new(narad_binary())
            .args(["child", "list", "orders"])
            .env("NARAD_URL", cluster.url(1))
            .output()
            .expect("narad child list");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let row = |partition: &str| {
            text.lines()
                .find(|l| {
                    let cells: Vec<&str> = l.split_whitespace().collect();
                    cells.first() == Some(&"copy") && cells.get(1) == Some(&partition)
                })
                .unwrap_or_else(|| panic!("no row for parent partition {partition}:\n{text}"))
                .to_owned()
        };
        let dead = row("2");
        assert!(
            dead.contains("n3")
                && dead.contains("unknown")
                && (dead.contains("did not answer") || dead.contains("is not alive")),
            "{text}"
        );
        if ["0", "1"].iter().all(|live| !row(live).contains("unknown")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "live cursors not listed:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    producer.wait_for_tries(5, "produces tried while n3 is down");
    cluster.nodes[2].restart();
    producer.wait_for_more(40, "records after n3 is back");
    let mut acknowledged = producer.finish();
    acknowledged.push("direct-0".to_owned());
    assert!(
        acknowledged.len() > 50,
        "{} acknowledged",
        acknowledged.len()
    );
    // Every acknowledged record reaches the child, the ones of n3's partition included (its
    // cursor resumed from its offset file after the restart), and each once: the slabs the
    // killed owner's cursor repeats are not stored again.
    wait_for_values(&cluster, "copy", 3, &acknowledged);
    // A repeat would land after the last acknowledged record: wait until every cursor's
    // durable position is the parent's end, after which none repeats a slab.
    wait_until_caught_up(&cluster, "orders", "copy");
    let child = everything(&client, &cluster.url(0), "copy", 3);
    let stored: Vec<&str> = child
        .values()
        .flatten()
        .filter_map(|r| r["value"].as_str())
        .collect();
    let distinct: HashSet<&str> = stored.iter().copied().collect();
    assert_eq!(
        stored.len(),
        distinct.len(),
        "the child holds duplicates\n{}",
        cluster.diagnostics("orders")
    );
}

#[test]
fn other_nodes_call_bodies_are_held_to_a_budget_of_their_own() {
    // 18 MiB: two 8 MiB calls fit, a third does not (the least allowed is about 17 MiB).
    let cluster = Cluster::start_with(
        "peer-budget",
        &["--max-buffered-peer-request-bytes", "18874368"],
    );
    let secret = peer_secret(&cluster._etcd.endpoint(), "peer-budget");
    let addr = cluster.url(2).trim_start_matches("http://").to_owned();
    // A peer (it holds the secret) that declares 8 MiB commits and sends a few bytes of each.
    let hold_open = || {
        use std::io::Write as _;
        let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
        let head = format!(
            "POST /internal/v1/commit-in-order HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {secret}\r\nContent-Length: 8388608\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).expect("send the head");
        stream
            .write_all(&[0u8; 1024])
            .expect("send some of the body");
        stream
    };
    let held = [hold_open(), hold_open()];
    let client = http_client();
    let call = || {
        client
            .post(format!("{}/internal/v1/commit-in-order", cluster.url(2)))
            .bearer_auth(&secret)
            .body(vec![0u8; 8 * 1024 * 1024])
            .send()
            .expect("call")
    };
    // The third does not fit while the two are held: 503, sent again later, naming the setting.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let answer = call();
        if answer.status().as_u16() == 503 || Instant::now() > deadline {
            break answer;
        }
        // The held calls' heads may not have been read yet.
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(refused.status().as_u16(), 503);
    assert_eq!(
        refused.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let text = refused.text().expect("answer");
    assert!(text.contains("max-buffered-peer-request-bytes"), "{text}");
    // Clients are not held to the peers' budget: the public API still takes a large body.
    let produce = client
        .post(format!("{}/v1/topics/none/records", cluster.url(2)))
        .json(&json!({"records": [{"value": "x".repeat(4 * 1024 * 1024)}]}))
        .send()
        .expect("produce");
    assert_ne!(produce.status().as_u16(), 503, "{:?}", produce.text());
    // Once the held calls end, the budget is free again: the call is read (and refused as
    // garbage, 400).
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = call().status().as_u16();
        if status != 503 {
            assert_eq!(status, 400);
            break;
        }
        assert!(Instant::now() < deadline, "the budget was not given back");
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = client
        .get(format!("{}/metrics", cluster.url(2)))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("narad_http_peer_body_budget_refusals_total ") && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
}

#[test]
fn with_a_token_nodes_commit_to_each_other_and_nobody_else_can() {
    let secret_dir = tempfile::tempdir().expect("tempdir");
    let token_file = secret_dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("token file");
    let token_arg = token_file.to_str().expect("utf-8 path").to_owned();
    let cluster = Cluster::start_with("with-token", &["--auth-token-file", &token_arg]);
    let client = http_client();
    let call = |method: Method, url: String, body: Value| {
        let response = client
            .request(method, url)
            .bearer_auth("s3cret")
            .json(&body)
            .send()
            .expect("call");
        let status = response.status().as_u16();
        let body: Value = response.json().unwrap_or(Value::Null);
        (status, body)
    };
    for (name, placement) in [("orders", json!(["n1"])), ("copy", json!(["n3"]))] {
        let (status, body) = call(
            Method::POST,
            format!("{}/v1/topics", cluster.url(0)),
            json!({"name": name, "partitions": 1, "placement": placement}),
        );
        ok(status, &body, "create");
    }
    let (status, body) = call(
        Method::PUT,
        format!("{}/v1/topics/orders/children/copy", cluster.url(0)),
        json!({}),
    );
    ok(status, &body, "attach");
    // Produced through n2 (forwarded to n1 with the client's token), copied to n3 by n1's
    // cursor with the peer secret.
    let (status, body) = call(
        Method::POST,
        format!("{}/v1/topics/orders/records", cluster.url(1)),
        json!({"records": [{"key": "a", "value": "one"}, {"key": "b", "value": "two"}]}),
    );
    ok(status, &body, "produce");
    wait_for_values(&cluster, "copy", 1, &["one".to_owned(), "two".to_owned()]);

    // The internal routes refuse a caller without the peer secret. The client's own token is
    // not it, nor is the secret older builds derived from the token, which any token holder
    // could compute.
    let derived = {
        use sha2::Digest as _;
        let mut hasher = sha2::Sha256::new();
        hasher.update(b"narad-peer-v1:");
        hasher.update(sha2::Sha256::digest(b"s3cret"));
        hex::encode(hasher.finalize())
    };
    for route in [
        "/internal/v1/commit",
        "/internal/v1/commit-in-order",
        "/internal/v1/commit-frames",
        "/internal/v1/topics/orders/partitions/0/recreate-here",
        "/internal/v1/topics/orders/partitions/0/handoff",
        "/internal/v1/topics/orders/partitions/0/move-in",
        "/internal/v1/topics/orders/partitions/0/files",
        "/internal/v1/topics/copy/partitions/0/highest-origin",
        "/internal/v1/topics/orders/children/copy/seek",
    ] {
        for token in [None, Some("s3cret"), Some(derived.as_str())] {
            let mut request = client
                .post(format!("{}{route}", cluster.url(2)))
                .body(vec![0u8; 8]);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let status = request.send().expect("internal call").status().as_u16();
            assert_eq!(status, 401, "{route} with token {token:?}");
        }
    }

    // Reads one node makes of another's partitions carry the peer secret: with an ACL rule in
    // force (which holds the anonymous caller to the rules), a describe through n1 still
    // gathers n3's partition.
    let (status, body) = call(
        Method::POST,
        format!("{}/v1/acls", cluster.url(0)),
        json!({"principal": "User:someone", "resource": "topic", "name": "x", "operation": "read"}),
    );
    ok(status, &body, "add a rule");
    let (status, body) = call(
        Method::GET,
        format!("{}/v1/topics/copy", cluster.url(0)),
        Value::Null,
    );
    ok(status, &body, "describe copy through n1");
    let partition = &body["partition_stats"][0];
    assert_eq!(partition["owner"], "n3", "{body}");
    assert_eq!(
        partition["state"], "open",
        "n3's partition was not read: {body}"
    );
    assert_eq!(partition["high_watermark"], 2, "{body}");
}

#[test]
fn calls_between_nodes_go_straight_to_the_peer_whatever_proxy_the_environment_names() {
    // A proxy variable meant for a node's outbound traffic (or left in a service's
    // environment) must not carry calls between nodes: through a proxy they would fail, or
    // show the peer credentials to it. This one names a port nothing listens on.
    let dead = format!(
        "http://127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port()
    );
    let variables: Vec<String> = [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
    ]
    .iter()
    .map(|name| format!("{name}={dead}"))
    .collect();
    let mut launcher = vec!["env"];
    launcher.extend(variables.iter().map(String::as_str));
    let cluster = Cluster::start_nodes_under("behind-proxy", &launcher, |_| Vec::new());
    cluster.create("orders", 1, json!(["n1"]));
    cluster.create("copy", 1, json!(["n3"]));
    cluster.attach("orders", "copy", json!({}));
    // Produced through n2 (forwarded to n1), copied to n3 by n1's cursor (a commit between
    // nodes, after n1 reads n3's tail for the attach point).
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{}/v1/topics/orders/records", cluster.url(1)),
        Some(&json!({"records": [{"value": "one"}, {"value": "two"}]})),
    )
    .expect("produce");
    ok(status, &body, "produce through n2");
    wait_for_values(&cluster, "copy", 1, &["one".to_owned(), "two".to_owned()]);
    // A describe through n1 reads n3's partition from n3.
    let (status, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{}/v1/topics/copy", cluster.url(0)),
        None,
    )
    .expect("describe");
    ok(status, &body, "describe copy through n1");
    let partition = &body["partition_stats"][0];
    assert_eq!(
        (&partition["state"], &partition["high_watermark"]),
        (&json!("open"), &json!(2)),
        "n3's partition was not read from n3: {body}"
    );
}

#[test]
fn a_topic_deleted_through_one_node_is_set_aside_on_the_others_and_a_new_one_starts_empty() {
    let cluster = Cluster::start("delete-across");
    let client = http_client();
    let create = || {
        let (status, body) = send_json(
            &client,
            Method::POST,
            &format!("{}/v1/topics", cluster.url(0)),
            Some(&json!({"name": "orders", "partitions": 3, "placement": ["n1", "n2", "n3"]})),
        )
        .expect("create");
        ok(status, &body, "create");
    };
    create();
    let records: Vec<Value> = (0..3)
        .map(|p| json!({"value": format!("old-{p}"), "partition": p}))
        .collect();
    cluster.produce("orders", json!(records));

    let (status, body) = send_json(
        &client,
        Method::DELETE,
        &format!("{}/v1/topics/orders", cluster.url(0)),
        None,
    )
    .expect("delete");
    ok(status, &body, "delete");
    // n2 and n3 set their partitions aside (never delete them) once they see the deletion.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for node in 1..3 {
        loop {
            let (_, list) = send_json(
                &client,
                Method::GET,
                &format!("{}/v1/admin/set-aside", cluster.url(node)),
                None,
            )
            .expect("set-aside list");
            let found = list["entries"]
                .as_array()
                .is_some_and(|e| e.iter().any(|entry| entry["topic"] == "orders"));
            if found {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "n{} never set orders aside: {list}",
                node + 1
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The same name again: every partition starts empty, on every node.
    create();
    for (p, records) in everything(&client, &cluster.url(0), "orders", 3) {
        assert!(
            records.is_empty(),
            "partition {p} of the new topic holds {records:?}"
        );
    }
}

#[test]
fn a_kafka_client_bootstrapped_on_one_node_produces_to_every_owner_and_reads_back() {
    let (cluster, kafka) = Cluster::start_with_kafka("kafka-across", &[]);
    let client = http_client();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics", cluster.url(0)),
        Some(&json!({"name": "orders", "partitions": 3, "placement": ["n1", "n2", "n3"]})),
    )
    .expect("create");
    ok(status, &body, "create");

    // kafka-python, bootstrapped on n1 only, follows Metadata to each partition's owner.
    let mut command = Command::new("python3");
    command
        .arg(crate::e2e::kafka::script("python_round_trip.py"))
        .args([kafka[0].as_str(), "orders", "3", "60"]);
    let out = crate::e2e::kafka::run(command, b"", "python3 python_round_trip.py");
    let report: Value = serde_json::from_str(&out).expect("the script's JSON");
    let produced = report["produced"].as_array().expect("produced");
    let consumed = report["consumed"].as_array().expect("consumed");
    assert_eq!(produced.len(), 60);
    assert_eq!(consumed.len(), 60, "{report}");
    let partitions: HashSet<u64> = produced
        .iter()
        .filter_map(|r| r["partition"].as_u64())
        .collect();
    assert_eq!(
        partitions.len(),
        3,
        "keys spread over the three owners: {partitions:?}"
    );
    // Each partition's records are on its owner's disk, read back through any node.
    let stored: usize = everything(&client, &cluster.url(2), "orders", 3)
        .values()
        .map(Vec::len)
        .sum();
    assert_eq!(stored, 60);
}

#[test]
fn grown_and_moved_child_partitions_stay_off_their_parent_partitions_node() {
    let cluster = Cluster::start("away-rule");
    let client = http_client();
    let owners = |topic: &str| -> Vec<String> {
        let (status, body) = send_json(
            &client,
            Method::GET,
            &format!("{}/v1/topics/{topic}", cluster.url(0)),
            None,
        )
        .expect("describe");
        ok(status, &body, "describe");
        body["owners"]
            .as_array()
            .expect("owners")
            .iter()
            .map(|o| o.as_str().expect("owner").to_owned())
            .collect()
    };
    let grow = |topic: &str, partitions: u32| {
        let (status, body) = send_json(
            &client,
            Method::POST,
            &format!("{}/v1/topics/{topic}/partitions", cluster.url(0)),
            Some(&json!({"count": partitions})),
        )
        .expect("grow");
        ok(status, &body, "grow");
    };
    // A child whose name starts the spread where its parent's does: without the rule, every
    // new partition p of both would land on the same node.
    let fnv = |name: &str| {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (hash % u64::from(u32::MAX)) % 3
    };
    let child = (0..)
        .map(|i| format!("audit-{i}"))
        .find(|name| fnv(name) == fnv("orders"))
        .expect("a name");
    cluster.create("orders", 1, json!(["n1"]));
    cluster.create(&child, 1, json!(["n2"]));
    cluster.attach("orders", &child, json!({}));
    for count in 2..=4u32 {
        grow("orders", count);
        grow(&child, count);
        let (orders, copy) = (owners("orders"), owners(&child));
        let p = count as usize - 1;
        assert_ne!(copy[p], orders[p], "{child}/{p} beside orders/{p}");
    }
    // A move without a target avoids it too: dst/0 leaves n2; n1 owns the fewest
    // partitions, but src/0 is there, so n3 it is.
    cluster.create("src", 1, json!(["n1"]));
    cluster.create("dst", 1, json!(["n2"]));
    cluster.create("ballast", 3, json!(["n3", "n3", "n3"]));
    cluster.attach("src", "dst", json!({}));
    // An existing child on the parent's node keeps its placement, and the attach says so.
    cluster.create("twin", 1, json!(["n1"]));
    let body = cluster.attach("src", "twin", json!({}));
    assert_eq!(body["shares_node"], json!([0]), "{body}");
    // The owner makes the new partition when its copy of the metadata shows it.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let (status, body) = loop {
        let (status, body) = move_partition(&client, &cluster.url(0), "dst", 0, json!({}));
        if status != 404 || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    ok(status, &body, "move");
    assert_eq!(owners("dst"), ["n3"], "{body}");
    assert!(body.get("shares_node_with").is_none(), "{body}");
    // A target the operator names is taken, and the answer says what it now shares a node
    // with.
    let (status, body) = move_partition(&client, &cluster.url(0), "dst", 0, json!({"to": "n1"}));
    ok(status, &body, "named move");
    assert_eq!(owners("dst"), ["n1"], "{body}");
    assert_eq!(body["shares_node_with"], json!(["src"]), "{body}");
}

/// The lines `pipe` gives, gathered as they come by a thread of their own (joined when the
/// pipe closes).
fn collect_lines(
    pipe: impl std::io::Read + Send + 'static,
) -> (
    std::sync::Arc<std::sync::Mutex<String>>,
    std::thread::JoinHandle<()>,
) {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let gathered = std::sync::Arc::clone(&text);
    let reader = std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut text = gathered.lock().expect("collected text");
            text.push_str(&line);
            text.push('\n');
        }
    });
    (text, reader)
}

#[test]
fn narad_consume_prints_every_partition_it_can_read_and_names_those_whose_owner_is_down() {
    let mut cluster = Cluster::start("consume-dead-owner");
    // Partition 0 on the node that dies.
    cluster.create("orders", 3, json!(["n3", "n1", "n2"]));
    let records: Vec<Value> = (0..9)
        .map(|i| json!({"partition": i % 3, "value": format!("p{}-{i}", i % 3)}))
        .collect();
    cluster.produce("orders", json!(records));
    cluster.nodes[2].kill9();

    let out = Command::new(narad_binary())
        .args(["consume", "orders"])
        .env("NARAD_URL", cluster.url(0))
        .output()
        .expect("narad consume");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The records of n1's and n2's partitions are printed; partition 0 is named, with its
    // owner, and the command fails. (It used to stop at the first partition it could not
    // read, here the first one: nothing was printed.)
    let mut printed: Vec<&str> = stdout.lines().collect();
    printed.sort_unstable();
    assert_eq!(
        printed,
        ["p1-1", "p1-4", "p1-7", "p2-2", "p2-5", "p2-8"],
        "stderr: {stderr}"
    );
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 of 3 partitions of orders could not be read")
            && stderr.contains("partition 0:")
            && stderr.contains("n3"),
        "{stderr}"
    );

    // Following, the others are printed as they come and partition 0 is tried again: a
    // record produced a second later still arrives (it used to end at partition 0's error).
    let mut follower = Command::new(narad_binary())
        .args(["consume", "orders", "--follow", "--max", "7"])
        .env("NARAD_URL", cluster.url(0))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("narad consume --follow");
    // The late record goes once the follower has printed the six records there are and said
    // it tries partition 0 again: it can only arrive while following.
    let (stdout_text, stdout_reader) = collect_lines(follower.stdout.take().expect("stdout piped"));
    let (stderr_text, stderr_reader) = collect_lines(follower.stderr.take().expect("stderr piped"));
    let text =
        |of: &std::sync::Arc<std::sync::Mutex<String>>| of.lock().expect("collected text").clone();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while text(&stdout_text).lines().count() < 6
        || !(text(&stderr_text).contains("partition 0")
            && text(&stderr_text).contains("tried again"))
    {
        assert!(
            Instant::now() < deadline,
            "the follower did not print the six records and say it tries partition 0 \
             again:\n{}\n{}",
            text(&stdout_text),
            text(&stderr_text)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.produce("orders", json!([{"partition": 1, "value": "late"}]));
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while follower.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = follower.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = follower.wait().expect("follower status");
    stdout_reader.join().expect("stdout reader");
    stderr_reader.join().expect("stderr reader");
    let stderr = text(&stderr_text);
    assert!(status.success(), "{stderr}");
    let printed = text(&stdout_text);
    assert_eq!(printed.lines().count(), 7, "{printed}\n{stderr}");
    assert!(printed.lines().any(|l| l == "late"), "{printed}");
    assert!(
        stderr.contains("partition 0") && stderr.contains("tried again"),
        "{stderr}"
    );
}

#[test]
fn narad_produce_with_an_owner_down_stores_what_it_can_once_and_names_the_lines_it_could_not() {
    let mut cluster = Cluster::start("produce-dead-owner");
    let client = http_client();
    cluster.create("orders", 3, json!(["n1", "n2", "n3"]));
    cluster.nodes[2].kill9();

    let mut producer = Command::new(narad_binary())
        .args(["produce", "orders", "--retry-for", "3s"])
        .env("NARAD_URL", cluster.url(0))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("narad produce");
    let input: String = (1..=9).map(|i| format!("v{i}\n")).collect();
    std::io::Write::write_all(producer.stdin.as_mut().expect("stdin"), input.as_bytes())
        .expect("write stdin");
    drop(producer.stdin.take());
    let out = producer.wait_with_output().expect("narad produce output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");

    // The records of n1's and n2's partitions are stored, each once (those of n1 used to wait
    // on n3 in the same request and were never stored); the error names the others' lines.
    let mut stored: Vec<String> = (0..2)
        .flat_map(|p| fetch_all(&client, &cluster.url(0), "orders", p))
        .map(|r| r["value"].as_str().expect("value").to_owned())
        .collect();
    stored.sort();
    let unique: HashSet<&String> = stored.iter().collect();
    assert_eq!(unique.len(), stored.len(), "each once: {stored:?}");
    assert_eq!(stored.len(), 6, "{stored:?}\n{stderr}");
    let missing: Vec<String> = (1..=9)
        .filter(|i| !stored.contains(&format!("v{i}")))
        .map(|i| i.to_string())
        .collect();
    let named = format!(
        "6 of this batch of 9 records stored, 3 not (stdin lines {}): send those again",
        missing.join(", ")
    );
    assert!(stderr.contains(&named), "wanted {named:?} in {stderr}");
    assert!(stderr.contains("n3"), "{stderr}");
}

/// `POST /v1/topics/{topic}/partitions/{p}/move` through `base`.
fn move_partition(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    partition: u32,
    body: Value,
) -> (u16, Value) {
    send_json(
        client,
        Method::POST,
        &format!("{base}/v1/topics/{topic}/partitions/{partition}/move"),
        Some(&body),
    )
    .expect("move")
}

/// Every value of `topic`, with how many times each is stored.
pub(super) fn value_counts(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    partitions: u32,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in everything(client, base, topic, partitions)
        .into_values()
        .flatten()
    {
        let value = record["value"].as_str().expect("value").to_owned();
        *counts.entry(value).or_insert(0) += 1;
    }
    counts
}

/// Waits until `path` is gone (a moved partition's old copy is deleted after a confirmed
/// read, a moment after the move answers).
fn wait_until_gone(path: &Path, cluster: &Cluster) {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} is still there\n{}",
            path.display(),
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn planned_moves_under_live_links_lose_nothing_copy_nothing_twice_and_drain_a_node() {
    let cluster = Cluster::start("moves");
    let client = http_client();
    let root = cluster._dir.path().to_path_buf();
    for (name, placement) in [
        ("orders", json!(["n1", "n2"])),
        ("copy", json!(["n2", "n3"])),
    ] {
        cluster.create(name, 2, placement);
    }
    cluster.attach("orders", "copy", json!({}));
    // Nothing to cancel yet.
    let (status, body) = move_partition(
        &client,
        &cluster.url(0),
        "orders",
        0,
        json!({"cancel": true}),
    );
    assert_eq!(status, 409, "{body}");

    let producer = Producer::start(cluster.url(2), "orders");
    // Moves start once both cursors have copied something (so each has its offset file).
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let advanced = listed_partitions(&cluster.url(0), "orders", "copy")
            .iter()
            .filter(|p| p["next_offset"].as_u64().unwrap_or(0) > 0)
            .count();
        if advanced == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cursors never advanced\n{}",
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A parent partition, with its cursor file, from n1 to n3, asked through n2.
    let (status, report) =
        move_partition(&client, &cluster.url(1), "orders", 0, json!({"to": "n3"}));
    ok(status, &report, "move orders/0");
    assert_eq!(
        (
            report["from"].as_str(),
            report["to"].as_str(),
            report["generation"].as_u64()
        ),
        (Some("n1"), Some("n3"), Some(2)),
        "{report}"
    );
    assert!(report["bytes"].as_u64().unwrap_or(0) > 0, "{report}");
    let moved_in: Vec<String> = std::fs::read_dir(root.join("n3/topics/orders/p00000"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        moved_in.iter().any(|f| f == "fanout-copy.offset"),
        "the cursor file moved with the log: {moved_in:?}\n{}",
        cluster.diagnostics("orders")
    );
    wait_until_gone(&root.join("n1/topics/orders/p00000"), &cluster);
    // A child partition from n2 to n1, while cursors commit to it from n2 and n3.
    producer.wait_for_more(40, "records after the first move");
    let (status, report) = move_partition(&client, &cluster.url(0), "copy", 0, json!({"to": "n1"}));
    ok(status, &report, "move copy/0");
    assert_eq!(report["from"], "n2", "{report}");
    wait_until_gone(&root.join("n2/topics/copy/p00000"), &cluster);
    // A partition that already lives on the target is refused.
    let (status, body) = move_partition(&client, &cluster.url(0), "copy", 0, json!({"to": "n1"}));
    assert_eq!(status, 409, "{body}");

    // Drain n2 with the CLI while records still flow: after the move above it owns only
    // orders/1, which goes to the least loaded other node.
    producer.wait_for_more(40, "records after the second move");
    let out = Command::new(narad_binary())
        .args(["node", "--url", &cluster.url(0), "drain", "n2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("narad node drain");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "drain: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[1/1] moved orders/1 from n2"), "{stdout}");
    assert!(stdout.contains("node n2 is drained"), "{stdout}");
    producer.wait_for_more(40, "records after the drain");
    let acknowledged = producer.finish();
    assert!(
        acknowledged.len() > 100,
        "{} acknowledged",
        acknowledged.len()
    );

    let (_, described) = send_json(
        &client,
        Method::GET,
        &format!("{}/v1/topics", cluster.url(1)),
        None,
    )
    .expect("list");
    for topic in described["topics"].as_array().expect("topics") {
        let owners = topic["owners"].as_array().expect("owners");
        assert!(!owners.iter().any(|o| o == "n2"), "n2 still owns: {topic}");
    }
    // The drain cordoned n2: a topic spread over the live nodes skips it (a pin may still
    // name it), until it is uncordoned.
    let (_, nodes) = send_json(
        &client,
        Method::GET,
        &format!("{}/v1/nodes", cluster.url(2)),
        None,
    )
    .expect("nodes");
    let n2 = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["id"] == "n2").cloned())
        .unwrap_or(Value::Null);
    assert_eq!(n2["cordoned"], true, "{nodes}");
    let owners_of = |name: &str| -> Vec<String> {
        let (_, topic) = send_json(
            &client,
            Method::GET,
            &format!("{}/v1/topics/{name}", cluster.url(0)),
            None,
        )
        .expect("describe");
        topic["owners"]
            .as_array()
            .map(|o| {
                o.iter()
                    .filter_map(|o| o.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics", cluster.url(0)),
        Some(&json!({"name": "while-cordoned", "partitions": 6})),
    )
    .expect("create");
    ok(status, &body, "create while n2 is cordoned");
    let owners = owners_of("while-cordoned");
    assert_eq!(owners.len(), 6, "{owners:?}");
    assert!(!owners.iter().any(|o| o == "n2"), "{owners:?}");
    let (status, body) = send_json(
        &client,
        Method::DELETE,
        &format!("{}/v1/nodes/n2/cordon", cluster.url(1)),
        None,
    )
    .expect("uncordon");
    ok(status, &body, "uncordon");
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let (_, nodes) = send_json(
            &client,
            Method::GET,
            &format!("{}/v1/nodes", cluster.url(0)),
            None,
        )
        .expect("nodes");
        if nodes["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().all(|n| n["cordoned"].is_null()))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{nodes}");
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.create("after-uncordon", 6, json!(null));
    assert!(owners_of("after-uncordon").iter().any(|o| o == "n2"));
    // No gap, no duplicate: every acknowledged record is in the parent and in the child, and
    // no record is stored twice in either.
    wait_for_values(&cluster, "copy", 2, &acknowledged);
    for topic in ["orders", "copy"] {
        let counts = value_counts(&client, &cluster.url(1), topic, 2);
        for value in &acknowledged {
            assert!(counts.contains_key(value), "{topic} lacks {value}");
        }
        let twice: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "{topic} holds records twice: {twice:?}");
    }
}

/// Produces one record with `value` to `partition` of `topic` through `base`.
fn produce_one(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    partition: u32,
    value: &str,
) -> (u16, Value) {
    send_json(
        client,
        Method::POST,
        &format!("{base}/v1/topics/{topic}/records"),
        Some(&json!({"records": [{"value": value, "partition": partition}]})),
    )
    .expect("produce")
}

#[test]
fn etcd_away_shorter_than_a_lease_changes_nothing_and_longer_fences_writes_until_it_returns() {
    let mut cluster = Cluster::start("etcd-away");
    let client = http_client();
    for (name, placement) in [
        ("orders", json!(["n1", "n2", "n3"])),
        ("copy", json!(["n2", "n3", "n1"])),
    ] {
        cluster.create(name, 3, placement);
    }
    cluster.attach("orders", "copy", json!({}));
    let mut acknowledged = Vec::new();

    // Away for 0.6 s, well inside the 3 s lease: produce (local and forwarded) and the copy to
    // the child go on as if nothing happened.
    cluster._etcd.stop();
    let away = Instant::now();
    let mut n = 0;
    while away.elapsed() < Duration::from_millis(600) {
        let value = format!("short-{n}");
        let (status, body) = produce_one(&client, &cluster.url(0), "orders", n % 3, &value);
        ok(status, &body, "produce while etcd is briefly away");
        acknowledged.push(value);
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster._etcd.start_again();
    wait_for_values(&cluster, "copy", 3, &acknowledged);

    // Away for longer than the lease: each node fences itself (at 80% of the TTL) and refuses
    // writes with a retriable 503 that says why; reads go on.
    cluster._etcd.stop();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let mut probe = 0;
    let (status, body, refused) = loop {
        let value = format!("probe-{probe}");
        let (status, body) = produce_one(&client, &cluster.url(0), "orders", 0, &value);
        if status != 200 {
            break (status, body, value);
        }
        acknowledged.push(value);
        probe += 1;
        assert!(
            Instant::now() < deadline,
            "writes still taken with etcd away: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("etcd"),
        "{body}"
    );
    let read = fetch_all(&client, &cluster.url(0), "orders", 0);
    assert!(!read.is_empty(), "reads go on while fenced");
    let (_, metrics) = send_json(
        &client,
        Method::GET,
        &format!("{}/metrics", cluster.url(0)),
        None,
    )
    .expect("metrics");
    assert!(
        metrics
            .as_str()
            .unwrap_or("")
            .contains("narad_cluster_fenced 1"),
        "the fence shows on /metrics"
    );

    // etcd back: writes are taken again on every node and the link catches up.
    cluster._etcd.start_again();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for p in 0..3 {
        let value = format!("after-{p}");
        loop {
            let (status, body) =
                produce_one(&client, &cluster.url(p as usize), "orders", p, &value);
            if status == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "writes never came back: {status} {body}\n{}",
                cluster.diagnostics("orders")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        acknowledged.push(value);
    }
    wait_for_values(&cluster, "copy", 3, &acknowledged);
    let stored = value_counts(&client, &cluster.url(1), "orders", 3);
    assert!(!stored.contains_key(&refused), "a refused write was stored");
}

#[test]
fn a_plugin_uploaded_to_one_node_routes_on_every_node_that_runs_a_cursor_of_its_link() {
    let cluster = Cluster::start("plugin-fetch");
    let client = http_client();
    for (name, placement) in [
        ("orders", json!(["n2", "n3"])),
        ("copy", json!(["n3", "n1"])),
    ] {
        cluster.create(name, 2, placement);
    }
    // Uploaded to n1 only; the cursors run on n2 and n3, which must fetch it by digest.
    let module = crate::e2e::plugin_limits::router_with_functions(1);
    let answer = client
        .post(format!("{}/v1/plugins?name=custom", cluster.url(0)))
        .body(module)
        .send()
        .expect("deploy");
    let status = answer.status().as_u16();
    let body: Value = answer.json().expect("deploy answer");
    ok(status, &body, "deploy");
    let (status, body) = send_json(
        &client,
        Method::PUT,
        &format!("{}/v1/topics/orders/children/copy", cluster.url(0)),
        Some(&json!({"router": ["custom", "round-robin"]})),
    )
    .expect("attach");
    ok(status, &body, "attach");
    let values: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    let records: Vec<Value> = values
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"value": v, "partition": i % 2}))
        .collect();
    cluster.produce("orders", json!(records));
    wait_for_values(&cluster, "copy", 2, &values);
    for node in [1, 2] {
        assert!(
            cluster.nodes[node]
                .log()
                .contains("fetched a plugin module from another node"),
            "n{} ran the link without fetching the module?",
            node + 1
        );
    }
}

#[test]
fn a_pause_and_a_seek_asked_of_any_node_reach_the_cursor_on_its_parents_owner() {
    let cluster = Cluster::start("cursor-control");
    let client = http_client();
    cluster.create("orders", 1, json!(["n2"]));
    cluster.create("copy", 1, json!(["n3"]));
    cluster.attach("orders", "copy", json!({}));
    let records: Vec<Value> = (0..30).map(|i| json!({"value": format!("v{i}")})).collect();
    cluster.produce("orders", json!(records));
    let wanted: Vec<String> = (0..30).map(|i| format!("v{i}")).collect();
    wait_for_values(&cluster, "copy", 1, &wanted);

    // Asked of n1; the cursor runs on n2, the parent partition's owner.
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics/orders/children/copy/pause", cluster.url(0)),
        Some(&json!({})),
    )
    .expect("pause");
    ok(status, &body, "pause");
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let done = loop {
        let (status, done) = send_json(
            &client,
            Method::POST,
            &format!("{}/v1/topics/orders/children/copy/seek", cluster.url(0)),
            Some(&json!({"partition": 0, "offset": 20})),
        )
        .expect("seek");
        // 409 until n2's cursor has seen the pause.
        if status == 200 {
            break done;
        }
        assert!(
            status == 409 && Instant::now() < deadline,
            "{status} {done}\n{}",
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (done["from"].as_u64(), done["to"].as_u64()),
        (Some(30), Some(20)),
        "{done}"
    );
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics/orders/children/copy/resume", cluster.url(2)),
        None,
    )
    .expect("resume");
    ok(status, &body, "resume");
    // Seeking back sent v20..v29 again. In cluster mode the child's owner holds them (its
    // origin window), so it stores them once and counts them as deduplicated on the sender.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let (_, metrics) = send_json(
            &client,
            Method::GET,
            &format!("{}/metrics", cluster.url(1)),
            None,
        )
        .expect("metrics");
        let text = metrics.as_str().unwrap_or("").to_owned();
        let deduplicated = text
            .lines()
            .find(|l| {
                l.starts_with("narad_fanout_commit_deduplicated_records_total{")
                    && l.contains("child=\"copy\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if deduplicated >= 10.0 {
            assert_eq!(
                deduplicated, 10.0,
                "only the replayed records were sent again"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replay never reached the child's owner\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let counts = value_counts(&client, &cluster.url(1), "copy", 1);
    assert!(
        (0..30).all(|i| counts.get(&format!("v{i}")) == Some(&1)),
        "{counts:?}"
    );
}

/// `POST /v1/topics/{topic}/partitions/{partition}/recreate` through `base` with `body`.
pub(super) fn recreate(base: &str, topic: &str, partition: u32, body: Value) -> (u16, Value) {
    send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/{topic}/partitions/{partition}/recreate"),
        Some(&body),
    )
    .expect("recreate")
}

/// Re-creates `topic`/`partition` on node `on`, asked of `base`, retrying while the old
/// owner still counts as alive (409) until its lease is gone; the report.
pub(super) fn recreate_once_dead(base: &str, topic: &str, partition: u32, on: &str) -> Value {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let (status, body) = recreate(
            base,
            topic,
            partition,
            json!({"on": on, "accept_loss": true}),
        );
        if status == 200 {
            return body;
        }
        assert!(
            status == 409 && Instant::now() < deadline,
            "{status} {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The children listing's rows for `child` of `parent` (one per parent partition), read
/// through `base`; none while the link is not listed.
pub(super) fn listed_partitions(base: &str, parent: &str, child: &str) -> Vec<Value> {
    let (_, children) = send_json(
        &http_client(),
        Method::GET,
        &format!("{base}/v1/topics/{parent}/children"),
        None,
    )
    .expect("children");
    children["children"]
        .as_array()
        .and_then(|c| c.iter().find(|l| l["name"] == child))
        .and_then(|l| l["partitions"].as_array().cloned())
        .unwrap_or_default()
}

/// The children listing's row for `child` of `parent`, partition 0, read through `base`.
fn listed_partition(base: &str, parent: &str, child: &str) -> Value {
    listed_partitions(base, parent, child)
        .into_iter()
        .next()
        .unwrap_or(Value::Null)
}

#[test]
fn a_dead_nodes_partition_recreated_elsewhere_starts_above_every_copy_and_counts_what_links_lost() {
    let mut cluster = Cluster::start("recreate");
    let client = http_client();
    cluster.create("orders", 1, json!(["n3"]));
    cluster.create("copy", 2, json!(["n1", "n2"]));
    cluster.create("audit", 1, json!(["n2"]));
    let produce = |base: &str, from: usize, to: usize| {
        let records: Vec<Value> = (from..to)
            .map(|i| json!({"key": format!("k{}", i % 7), "value": format!("v{i}")}))
            .collect();
        let (status, body) = send_json(
            &client,
            Method::POST,
            &format!("{base}/v1/topics/orders/records"),
            Some(&json!({"records": records})),
        )
        .expect("produce");
        ok(status, &body, "produce");
    };
    let values =
        |from: usize, to: usize| -> Vec<String> { (from..to).map(|i| format!("v{i}")).collect() };
    cluster.attach("orders", "copy", json!({}));
    produce(&cluster.url(0), 0, 100);
    // `audit` is attached at offset 100 and paused before anything reaches it.
    cluster.attach("orders", "audit", json!({}));
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics/orders/children/audit/pause", cluster.url(0)),
        Some(&json!({})),
    )
    .expect("pause");
    ok(status, &body, "pause");
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while listed_partition(&cluster.url(0), "orders", "audit")["state"] != "paused" {
        assert!(
            Instant::now() < deadline,
            "{}",
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    produce(&cluster.url(0), 100, 200);
    wait_for_values(&cluster, "copy", 2, &values(0, 200));

    // Refused while the owner lives, and without the explicit acceptance.
    let (status, body) = recreate(
        &cluster.url(0),
        "orders",
        0,
        json!({"on": "n1", "accept_loss": true}),
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("partition move"),
        "{body}"
    );
    cluster.nodes[2].kill9();
    let (status, body) = recreate(&cluster.url(0), "orders", 0, json!({"on": "n1"}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("accept_loss"),
        "{body}"
    );

    // Once n3's lease is gone, asked of n2, done by n1.
    let report = recreate_once_dead(&cluster.url(1), "orders", 0, "n1");
    // Above every offset a child holds, so no new record is taken for a copy of an old one.
    assert_eq!(report["start_offset"], 200, "{report}");
    assert_eq!(
        (report["from"].as_str(), report["to"].as_str()),
        (Some("n3"), Some("n1")),
        "{report}"
    );
    let link = |child: &str| {
        report["links"]
            .as_array()
            .and_then(|l| l.iter().find(|l| l["child"] == child).cloned())
            .unwrap_or(Value::Null)
    };
    assert_eq!(link("copy")["child_holds_up_to"], 199, "{report}");
    assert_eq!(link("copy")["dropped_at_most"], 0, "{report}");
    assert_eq!(link("audit")["resume_offset"], 100, "{report}");
    assert_eq!(link("audit")["dropped_at_most"], 100, "{report}");

    // The partition serves again from n1, through any node, at offsets the old log never used.
    produce(&cluster.url(1), 200, 250);
    let offsets_from = |base: &str, offset: u64| {
        let (status, body) = send_json(
            &client,
            Method::GET,
            &format!("{base}/v1/topics/orders/partitions/0/records?offset={offset}&max=1000"),
            None,
        )
        .expect("fetch");
        (status, body)
    };
    let (status, body) = offsets_from(&cluster.url(0), 0);
    assert_eq!(status, 416, "{body}");
    assert_eq!(body["log_start_offset"], 200, "{body}");
    let (status, body) = offsets_from(&cluster.url(0), 200);
    ok(status, &body, "fetch");
    let offsets: Vec<u64> = body["records"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["offset"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(offsets, (200..250).collect::<Vec<u64>>());
    // Every new record reaches `copy`, none dropped for a copy of an old one, none twice.
    wait_for_values(&cluster, "copy", 2, &values(0, 250));
    let counts = value_counts(&client, &cluster.url(0), "copy", 2);
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");

    // `audit` resumes: the 100 records it never got are counted as dropped, the new ones
    // arrive.
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics/orders/children/audit/resume", cluster.url(0)),
        None,
    )
    .expect("resume");
    ok(status, &body, "resume");
    wait_for_values(&cluster, "audit", 1, &values(200, 250));
    let held = values_in(&client, &cluster.url(0), "audit", 1);
    assert_eq!(held.len(), 50, "{held:?}");
    let listed = listed_partition(&cluster.url(0), "orders", "audit");
    assert_eq!(listed["dropped_messages"], 100, "{listed}");
    assert_eq!(listed["node"], "n1", "{listed}");
    // On the link's gap ledger, asked of another node: the range, why, and where.
    let (status, gaps) = send_json(
        &client,
        Method::GET,
        &format!("{}/v1/topics/orders/children/audit/gaps", cluster.url(1)),
        None,
    )
    .expect("gaps");
    ok(status, &gaps, "gaps");
    let p0 = gaps["partitions"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["partition"] == 0))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (p0["lost"].as_u64(), p0["node"].as_str()),
        (Some(100), Some("n1")),
        "{gaps}"
    );
    let range = &p0["gaps"][0];
    assert_eq!(
        (range["reason"].as_str(), range["node"].as_str()),
        (Some("recreated"), Some("n1")),
        "{gaps}"
    );
    assert_eq!(
        range["to"].as_u64().unwrap_or(0) - range["from"].as_u64().unwrap_or(0),
        100,
        "{gaps}"
    );

    // n3 comes back: the metadata no longer names it, so it serves nothing of its old copy;
    // a produce through it lands on n1's log.
    cluster.nodes[2].restart();
    cluster.wait_for_nodes(3);
    let (status, body) = produce_one(&client, &cluster.url(2), "orders", 0, "after-return");
    ok(status, &body, "produce through the returned node");
    let (status, body) = offsets_from(&cluster.url(1), 250);
    ok(status, &body, "fetch");
    let last = body["records"][0].clone();
    assert_eq!(
        (last["offset"].as_u64(), last["value"].as_str()),
        (Some(250), Some("after-return")),
        "{body}"
    );
}

/// The remote child's copies on `target`'s `orders-copy` (3 partitions): (partition, key,
/// value, origin header).
fn remote_copies(base: &str) -> Vec<(u32, String, String, String)> {
    let client = http_client();
    let mut out = Vec::new();
    for (partition, records) in everything(&client, base, "orders-copy", 3) {
        for r in records {
            let origin = r["headers"]
                .as_array()
                .and_then(|h| h.iter().find(|h| h["name"] == "narad-origin"))
                .and_then(|h| h["value"].as_str())
                .unwrap_or("")
                .to_owned();
            out.push((
                partition,
                r["key"].as_str().unwrap_or("").to_owned(),
                r["value"].as_str().expect("value").to_owned(),
                origin,
            ));
        }
    }
    out
}

#[test]
fn a_remote_child_of_a_cluster_is_fed_by_every_parent_owner_from_the_oldest_record_through_crashes()
{
    let mut cluster = Cluster::start("remote-child");
    let client = http_client();
    let target_dir = tempfile::tempdir().expect("tempdir");
    let mut target = Daemon::start(&target_dir.path().join("target"));
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics", target.url()),
        Some(&json!({"name": "orders-copy", "partitions": 3})),
    )
    .expect("create on the target");
    ok(status, &body, "create on the target");
    cluster.create("orders", 3, json!(["n1", "n2", "n3"]));

    // History from before the attach, produced through n2 to every owner.
    let history: Vec<String> = (0..60).map(|i| format!("h{i}")).collect();
    let records: Vec<Value> = history
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"key": format!("k{}", i % 16), "value": v}))
        .collect();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics/orders/records", cluster.url(1)),
        Some(&json!({"records": records})),
    )
    .expect("produce history");
    ok(status, &body, "produce history");

    // Attached through n1 from the parent's oldest record: the start is read from each
    // partition's owner.
    let (status, link) = send_json(
        &client,
        Method::PUT,
        &format!("{}/v1/topics/orders/children/to-target", cluster.url(0)),
        Some(&json!({
            "remote": {"url": target.url(), "topic": "orders-copy"},
            "start": "earliest",
        })),
    )
    .expect("attach");
    ok(status, &link, "attach");
    assert_eq!(link["attach_offsets"], json!([0, 0, 0]), "{link}");
    assert_eq!(link["remote"]["partitions"], 3, "{link}");

    let producer = Producer::start(cluster.url(0), "orders");
    producer.wait_for_more(100, "records before a parent owner dies");
    // A parent owner dies mid-stream (its cursor resumes from its offset file), then the
    // target (every owner's cursor waits on it).
    cluster.nodes[2].kill9();
    producer.wait_for_tries(5, "produces tried while a parent owner is down");
    cluster.nodes[2].restart_same_port();
    target.kill9();
    producer.wait_for_more(50, "records while the target is down");
    target.restart_same_port();
    producer.wait_for_more(20, "records after the target is back");
    let mut wanted = producer.finish();
    assert!(wanted.len() > 100, "{} acknowledged", wanted.len());
    wanted.extend(history);

    // Every acknowledged record and the whole history reach the target.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let copies = loop {
        let copies = remote_copies(&target.url());
        let held: HashSet<&str> = copies.iter().map(|c| c.2.as_str()).collect();
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|v| !held.contains(v.as_str()))
            .collect();
        if missing.is_empty() {
            break copies;
        }
        assert!(
            Instant::now() < deadline,
            "the target misses {} of {} records (first {})\n{}",
            missing.len(),
            wanted.len(),
            missing[0],
            cluster.diagnostics("orders")
        );
        std::thread::sleep(Duration::from_millis(200));
    };

    // Each copy names the cluster it came from; each key is on one partition, its first
    // copies in production order (history first).
    let order = |v: &str| -> (u8, u64) {
        let (kind, n) = v.split_at(1);
        (u8::from(kind == "v"), n.parse().expect("h{n} or v{n}"))
    };
    // Per key: the partitions it was found on, and its values in the order they were found.
    type Placement = (HashSet<u32>, Vec<(u8, u64)>);
    let mut by_key: BTreeMap<String, Placement> = BTreeMap::new();
    for (partition, key, value, origin) in &copies {
        assert!(origin.starts_with("cluster:"), "origin header {origin:?}");
        let entry = by_key.entry(key.clone()).or_default();
        entry.0.insert(*partition);
        entry.1.push(order(value));
    }
    assert_eq!(by_key.len(), 16);
    for (key, (partitions, values)) in by_key {
        assert_eq!(partitions.len(), 1, "{key} on partitions {partitions:?}");
        let mut seen = HashSet::new();
        let firsts: Vec<(u8, u64)> = values.into_iter().filter(|v| seen.insert(*v)).collect();
        assert!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "{key} out of order on the target: {firsts:?}"
        );
    }

    // Listed the same from any node: every parent partition running, nothing dropped.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for node in 0..3 {
        loop {
            let (_, children) = send_json(
                &client,
                Method::GET,
                &format!("{}/v1/topics/orders/children", cluster.url(node)),
                None,
            )
            .expect("children");
            let partitions = children["children"]
                .as_array()
                .and_then(|c| c.iter().find(|l| l["name"] == "to-target").cloned())
                .map(|l| l["partitions"].clone())
                .unwrap_or(Value::Null);
            let all = partitions.as_array().cloned().unwrap_or_default();
            if all.len() == 3
                && all
                    .iter()
                    .all(|p| p["remote_state"] == "running" && p["dropped_messages"] == 0)
            {
                break;
            }
            assert!(Instant::now() < deadline, "n{}: {partitions}", node + 1);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
