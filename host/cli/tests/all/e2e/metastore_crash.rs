//! `kill -9` during metadata changes: every acknowledged topic create and delete survives,
//! through the metastore journal's appends and its compactions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::Rng;
use reqwest::Method;
use serde_json::json;

use crate::e2e::harness::{Daemon, http_client, send_json};

/// Rounds at least, and at most (the journal must have been compacted by then).
const MIN_ROUNDS: usize = 6;
const MAX_ROUNDS: usize = 40;

/// What the client learnt in one round.
#[derive(Default)]
struct Ledger {
    /// Topics whose create was acknowledged and not deleted since.
    created: BTreeSet<String>,
    /// Topics whose delete was acknowledged.
    deleted: BTreeSet<String>,
    /// Topics a change of got no answer: either state is right.
    in_doubt: BTreeSet<String>,
}

/// Creates topics one by one (deleting every third one it created right after), until the
/// daemon stops answering.
fn change_until_stopped(base: String, round: usize, stop: Arc<AtomicBool>) -> Ledger {
    let client = http_client();
    let mut ledger = Ledger::default();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let name = format!("r{round}-t{i}");
        i += 1;
        let created = send_json(
            &client,
            Method::POST,
            &format!("{base}/v1/topics"),
            Some(&json!({"name": name, "partitions": 1})),
        );
        match created {
            Ok((status, _)) if (200..300).contains(&status) => {
                ledger.created.insert(name.clone());
            }
            Ok((status, body)) if status >= 500 => {
                ledger.in_doubt.insert(name);
                let _ = body;
                continue;
            }
            Ok((status, body)) => panic!("create {name} answered {status}: {body}"),
            Err(_) => {
                ledger.in_doubt.insert(name);
                break;
            }
        }
        if i % 3 == 0 {
            match send_json(
                &client,
                Method::DELETE,
                &format!("{base}/v1/topics/{name}"),
                None,
            ) {
                Ok((status, _)) if (200..300).contains(&status) => {
                    ledger.created.remove(&name);
                    ledger.deleted.insert(name);
                }
                Ok((status, body)) if status >= 500 => {
                    ledger.created.remove(&name);
                    ledger.in_doubt.insert(name);
                    let _ = body;
                }
                Ok((status, body)) => panic!("delete {name} answered {status}: {body}"),
                Err(_) => {
                    ledger.created.remove(&name);
                    ledger.in_doubt.insert(name);
                    break;
                }
            }
        }
    }
    ledger
}

fn topic_names(base: &str) -> BTreeSet<String> {
    let (status, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{base}/v1/topics"),
        None,
    )
    .expect("list topics");
    assert_eq!(status, 200, "{body}");
    body["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_owned())
        .collect()
}

#[test]
fn acknowledged_topic_creates_and_deletes_survive_repeated_kill_9_through_compactions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("data");
    let mut daemon = Daemon::start(&data_dir);
    let mut rng = crate::e2e::harness::seeded_rng(
        "acknowledged_topic_creates_and_deletes_survive_repeated_kill_9_through_compactions",
    );
    let mut created = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    let mut in_doubt = BTreeSet::new();
    let mut rounds = 0;
    // A compaction has happened once the older journal exists.
    while rounds < MIN_ROUNDS || !data_dir.join("metastore.journal.prev").exists() {
        assert!(
            rounds < MAX_ROUNDS,
            "no compaction in {rounds} rounds ({} topics)",
            created.len()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (base, stop) = (daemon.url(), Arc::clone(&stop));
            std::thread::spawn(move || change_until_stopped(base, rounds, stop))
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(100..700)));
        daemon.kill9();
        stop.store(true, Ordering::Relaxed);
        let ledger = worker.join().expect("client thread panicked");
        created.extend(ledger.created);
        deleted.extend(ledger.deleted);
        in_doubt.extend(ledger.in_doubt);
        daemon.restart();
        rounds += 1;

        let now = topic_names(&daemon.url());
        for name in &created {
            assert!(
                now.contains(name),
                "round {rounds}: the acknowledged create of {name} was lost"
            );
        }
        for name in &deleted {
            assert!(
                !now.contains(name),
                "round {rounds}: the acknowledged delete of {name} was undone"
            );
        }
        for name in &now {
            assert!(
                created.contains(name) || in_doubt.contains(name),
                "round {rounds}: {name} exists but was never acknowledged or sent"
            );
        }
    }
    assert!(
        created.len() > 100,
        "the workload acknowledged only {} creates",
        created.len()
    );
    // Nothing was set aside: every topic directory is accounted for by the metastore (an
    // in-doubt create is either recorded or undone from its intent record).
    let (status, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{}/v1/admin/set-aside", daemon.url()),
        None,
    )
    .expect("set-aside list");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["entries"].as_array().map(Vec::len), Some(0), "{body}");
}
