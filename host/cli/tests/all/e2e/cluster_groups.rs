//! Kafka consumer groups on a three-node cluster on a real etcd: the group's coordinator is the
//! owner of its partition of the offsets topic, members bootstrapped on the other nodes find it
//! there, and its committed offsets outlive `kill -9` of that node.

use std::net::TcpStream;

use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use super::cluster::Cluster;
use super::kafka::exchange;
use super::kafka_groups::{
    Library, Member, admin_offsets_on, expected, finish_pair, next_offsets, produce, values,
    wait_for, wait_for_split,
};

/// The index (in `kafka`) of the node FindCoordinator names for `group`, asked of `kafka[0]`.
fn coordinator_of(kafka: &[String], group: &'static str) -> usize {
    let mut found = None;
    wait_for("the group's coordinator", || {
        let Ok(mut stream) = TcpStream::connect(&kafka[0]) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(30)));
        let mut find = FindCoordinatorRequest::default();
        find.key = StrBytes::from_static_str(group);
        let answer: FindCoordinatorResponse = exchange(&mut stream, 10, 1, &find);
        if answer.error_code != 0 {
            return false;
        }
        let addr = format!("{}:{}", answer.host.as_str(), answer.port);
        found = kafka.iter().position(|k| *k == addr);
        assert!(found.is_some(), "{addr} is none of the nodes {kafka:?}");
        true
    });
    found.unwrap_or_default()
}

#[test]
fn members_on_other_nodes_share_a_group_whose_offsets_outlive_kill_9_of_its_coordinator() {
    let (mut cluster, kafka) =
        Cluster::start_with_kafka("groups", &["--group-initial-rebalance-delay-ms", "500"]);
    cluster.create("orders", 4, serde_json::json!(["n1", "n2", "n3", "n1"]));
    let coordinator = coordinator_of(&kafka, "billing");
    let others: Vec<usize> = (0..3).filter(|&i| i != coordinator).collect();

    // Two members, each bootstrapped on a node that is not the coordinator.
    let a = Member::start_on(
        &kafka[others[0]],
        "orders",
        "billing",
        3,
        Library::KafkaPython,
    );
    let b = Member::start_on(
        &kafka[others[1]],
        "orders",
        "billing",
        3,
        Library::Librdkafka("range"),
    );
    wait_for_split(&[&a, &b], 4);
    produce(&cluster.url(others[0]), "orders", 0..200);
    let both = finish_pair(a, b);
    assert_eq!(values(&both), expected(0..200), "every record exactly once");
    let (groups, mut committed) = admin_offsets_on(&kafka[others[1]], "billing");
    assert!(groups.contains(&"billing".to_owned()), "listed: {groups:?}");
    committed.retain(|_, offset| *offset > 0);
    assert_eq!(committed, next_offsets("orders", &both));

    // An operator asks any node: the listing gathers the coordinators' groups, and the
    // description comes from the coordinator, with the lag of partitions on all three nodes.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let between = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    std::thread::sleep(std::time::Duration::from_millis(50));
    produce(&cluster.url(others[0]), "orders", 200..210);
    let asked = cluster.url(others[1]);
    let listed = crate::e2e::harness::narad_cli(&asked, &["group", "--json", "list"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("group list JSON");
    let coordinator_id = format!("n{}", coordinator + 1);
    assert!(
        listed["groups"].as_array().is_some_and(|g| g
            .iter()
            .any(|g| g["group"] == "billing" && g["node"] == coordinator_id.as_str())),
        "{listed}"
    );
    let (status, info) = crate::e2e::harness::send_json(
        &crate::e2e::harness::http_client(),
        reqwest::Method::GET,
        &format!("{asked}/v1/groups/billing"),
        None,
    )
    .expect("describe");
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["node"], coordinator_id.as_str(), "{info}");
    assert_eq!(info["total_lag"], 10, "{info}");
    // On /metrics only the coordinator exports the group, with the lag of all partitions.
    for node in 0..3 {
        let metrics = crate::e2e::harness::http_client()
            .get(format!("{}/metrics", cluster.url(node)))
            .send()
            .and_then(|r| r.text())
            .expect("scrape /metrics");
        let lag: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("narad_kafka_group_lag_messages{group=\"billing\""))
            .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
            .sum();
        let expected = if node == coordinator { 10.0 } else { 0.0 };
        assert_eq!(lag, expected, "node n{}: {metrics}", node + 1);
    }

    // A reset asked of a node that is not the coordinator goes to it, and reads each
    // partition's records where they live: without --execute the plan, then to the moment
    // before the last produce, which is where the members' commits stand.
    let plan = crate::e2e::harness::narad_cli(
        &asked,
        &[
            "group",
            "--json",
            "reset-offsets",
            "billing",
            "--to",
            "earliest",
        ],
    );
    let plan: serde_json::Value = serde_json::from_str(&plan).expect("reset plan JSON");
    assert_eq!(plan["executed"], false, "{plan}");
    assert_eq!(plan["node"], coordinator_id.as_str(), "{plan}");
    assert_eq!(plan["offsets"].as_array().map(Vec::len), Some(4), "{plan}");
    let (status, done) = crate::e2e::harness::send_json(
        &crate::e2e::harness::http_client(),
        reqwest::Method::POST,
        &format!("{asked}/v1/groups/billing/reset-offsets"),
        Some(&serde_json::json!({"to": {"timestamp_ms": between}, "execute": true})),
    )
    .expect("reset");
    assert_eq!(status, 200, "{done}");
    let to: std::collections::BTreeMap<String, i64> = done["offsets"]
        .as_array()
        .expect("offsets")
        .iter()
        .filter(|o| o["to"].as_i64() > Some(0))
        .map(|o| {
            (
                format!("{}/{}", o["topic"].as_str().unwrap_or(""), o["partition"]),
                o["to"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(to, next_offsets("orders", &both), "{done}");

    // The coordinator dies and comes back: the group's offsets are on its disk, durable.
    cluster.nodes[coordinator].restart();
    cluster.wait_for_nodes(3);
    // Everything the node made itself (its cluster/ directory among them) is owner-only, so
    // its restart has nothing to tighten and no warning to give.
    let log = cluster.nodes[coordinator].log();
    assert!(!log.contains("readable by group or others"), "{log}");
    produce(&cluster.url(others[0]), "orders", 210..230);
    let c = Member::start_on(
        &kafka[others[1]],
        "orders",
        "billing",
        3,
        Library::KafkaPython,
    );
    assert_eq!(values(&c.finish()), expected(200..230));
}
