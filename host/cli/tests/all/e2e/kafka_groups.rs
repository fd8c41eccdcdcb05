//! Kafka consumer groups with the real kafka-python client against the real binary: members
//! of one group split a topic's partitions and read every record once, committed offsets
//! survive `kill -9` of the daemon, and a member killed without leaving is replaced after
//! its session timeout with nothing lost.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::harness::{http_client, sample, scrape, send_json};
use super::kafka::{KafkaDaemon, create_topic, exchange, run, script, start_with};

/// Bound on waiting for a group to settle or records to be read; generous for a busy machine.
const WAIT: Duration = Duration::from_secs(60);

/// A kafka-python group member running in the background, its JSON lines collected.
pub(super) struct Member {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

/// Which client library a member runs.
#[derive(Clone, Copy)]
pub(super) enum Library {
    KafkaPython,
    /// confluent-kafka (librdkafka) with this `partition.assignment.strategy`.
    Librdkafka(&'static str),
}

impl Member {
    /// A kafka-python member.
    fn start(kafka: &KafkaDaemon, topic: &str, group: &str, idle_secs: u32) -> Member {
        Member::start_on(
            &kafka.kafka.to_string(),
            topic,
            group,
            idle_secs,
            Library::KafkaPython,
        )
    }

    fn start_with(
        kafka: &KafkaDaemon,
        topic: &str,
        group: &str,
        idle_secs: u32,
        library: Library,
    ) -> Member {
        Member::start_on(&kafka.kafka.to_string(), topic, group, idle_secs, library)
    }

    /// A member bootstrapped on `bootstrap` (`host:port`).
    pub(super) fn start_on(
        bootstrap: &str,
        topic: &str,
        group: &str,
        idle_secs: u32,
        library: Library,
    ) -> Member {
        let idle = idle_secs.to_string();
        let mut args = vec![bootstrap, topic, group, idle.as_str()];
        match library {
            Library::KafkaPython => args.insert(0, "consume"),
            Library::Librdkafka(strategy) => {
                args.insert(0, "consume-librdkafka");
                args.push(strategy);
            }
        }
        let mut child = Command::new("python3")
            .arg(script("python_group.py"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 could not start; scripts/test-all installs the Kafka clients");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str(&line) {
                    sink.lock().expect("lines").push(value);
                }
            }
        });
        Member { child, lines }
    }

    /// Its latest assignment.
    pub(super) fn assigned(&self) -> Option<Vec<u64>> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .rev()
            .find_map(|l| l.get("assigned"))
            .map(|a| {
                a.as_array()
                    .expect("array")
                    .iter()
                    .map(|p| p.as_u64().expect("partition"))
                    .collect()
            })
    }

    /// Every record it read: (partition, offset, value).
    pub(super) fn records(&self) -> Vec<(u64, u64, String)> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter_map(|l| {
                Some((
                    l.get("p")?.as_u64()?,
                    l.get("o")?.as_u64()?,
                    l.get("v")?.as_str()?.to_owned(),
                ))
            })
            .collect()
    }

    /// Waits for it to exit on its own (idle), then kills it if it did not.
    pub(super) fn finish(mut self) -> Vec<(u64, u64, String)> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if self.child.try_wait().expect("wait").is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The reader thread drains what is left once the pipe closes.
        std::thread::sleep(Duration::from_millis(100));
        self.records()
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `members` hold disjoint assignments that together cover `partitions`.
pub(super) fn wait_for_split(members: &[&Member], partitions: u64) {
    wait_for("the group to assign every partition once", || {
        let assigned: Vec<Vec<u64>> = members.iter().filter_map(|m| m.assigned()).collect();
        if assigned.len() != members.len() || assigned.iter().any(Vec::is_empty) {
            return false;
        }
        let all: Vec<u64> = assigned.concat();
        let distinct: BTreeSet<u64> = all.iter().copied().collect();
        all.len() as u64 == partitions && distinct.len() as u64 == partitions
    });
}

/// Waits for both members to finish; each must have read, no partition may have been read by
/// both. Returns what they read together.
pub(super) fn finish_pair(a: Member, b: Member) -> Vec<(u64, u64, String)> {
    let (read_a, read_b) = (a.finish(), b.finish());
    assert!(
        !read_a.is_empty() && !read_b.is_empty(),
        "both members read"
    );
    let parts_a: BTreeSet<u64> = read_a.iter().map(|r| r.0).collect();
    let parts_b: BTreeSet<u64> = read_b.iter().map(|r| r.0).collect();
    assert!(
        parts_a.is_disjoint(&parts_b),
        "a partition read by both members"
    );
    read_a.into_iter().chain(read_b).collect()
}

pub(super) fn produce(base: &str, topic: &str, values: std::ops::Range<u32>) {
    let records: Vec<Value> = values
        .map(|i| json!({"key": format!("k{}", i % 13), "value": format!("v{i}")}))
        .collect();
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/topics/{topic}/records"),
        Some(&json!({ "records": records })),
    )
    .expect("produce");
    assert!((200..300).contains(&status), "produce: {status} {body}");
}

pub(super) fn values(records: &[(u64, u64, String)]) -> Vec<String> {
    let mut values: Vec<String> = records.iter().map(|(_, _, v)| v.clone()).collect();
    values.sort();
    values
}

pub(super) fn expected(range: std::ops::Range<u32>) -> Vec<String> {
    let mut values: Vec<String> = range.map(|i| format!("v{i}")).collect();
    values.sort();
    values
}

/// The admin client's view: groups listed and `group`'s committed offsets.
fn admin_offsets(kafka: &KafkaDaemon, group: &str) -> (Vec<String>, BTreeMap<String, i64>) {
    admin_offsets_on(&kafka.kafka.to_string(), group)
}

/// [`admin_offsets`] from an admin client bootstrapped on `bootstrap`.
pub(super) fn admin_offsets_on(
    bootstrap: &str,
    group: &str,
) -> (Vec<String>, BTreeMap<String, i64>) {
    let mut command = Command::new("python3");
    command
        .arg(script("python_group.py"))
        .args(["offsets", bootstrap, group]);
    let out = run(command, b"", "python3 python_group.py offsets");
    let answer: Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let groups = answer["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g.as_str().expect("name").to_owned())
        .collect();
    let offsets = answer["offsets"]
        .as_object()
        .expect("offsets")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_i64().expect("offset")))
        .collect();
    (groups, offsets)
}

fn start_daemon(dir: &std::path::Path) -> KafkaDaemon {
    start_with(dir, &["--group-initial-rebalance-delay-ms", "500"])
}

#[test]
fn two_members_split_the_partitions_read_every_record_once_and_a_new_member_resumes_after_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut kafka = start_daemon(dir.path());
    create_topic(&kafka.daemon.url(), "orders", 4);

    let a = Member::start(&kafka, "orders", "billing", 3);
    let b = Member::start(&kafka, "orders", "billing", 3);
    wait_for_split(&[&a, &b], 4);
    produce(&kafka.daemon.url(), "orders", 0..200);
    let both = finish_pair(a, b);
    assert_eq!(values(&both), expected(0..200), "every record exactly once");

    // What the group committed is what was read: each partition's next offset.
    let (groups, mut committed) = admin_offsets(&kafka, "billing");
    assert!(groups.contains(&"billing".to_owned()), "listed: {groups:?}");
    // A member commits its position on every partition it holds, 0 on one that got nothing.
    committed.retain(|_, offset| *offset > 0);
    assert_eq!(committed, next_offsets("orders", &both));

    // The offsets topic is the daemon's own: clients cannot write to it, delete it or make
    // one like it.
    let base = kafka.daemon.url();
    let client = http_client();
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics/__narad_groups/records"),
        Some(&json!({"records": [{"value": "forged"}]})),
    )
    .expect("produce");
    assert_eq!(status, 403, "{body}");
    let (status, body) = send_json(
        &client,
        Method::DELETE,
        &format!("{base}/v1/topics/__narad_groups"),
        None,
    )
    .expect("delete");
    assert_eq!(status, 400, "{body}");
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(&json!({"name": "__narad_mine", "partitions": 1})),
    )
    .expect("create");
    assert_eq!(status, 400, "{body}");

    // The committed offsets are durable: after kill -9 a new member reads only what came
    // after them.
    kafka.daemon.restart();
    produce(&kafka.daemon.url(), "orders", 200..230);
    let c = Member::start(&kafka, "orders", "billing", 3);
    let read_c = c.finish();
    assert_eq!(values(&read_c), expected(200..230));
}

#[test]
fn a_member_killed_without_leaving_is_replaced_after_its_session_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start_daemon(dir.path());
    create_topic(&kafka.daemon.url(), "orders", 4);

    let mut a = Member::start(&kafka, "orders", "billing", 30);
    let b = Member::start(&kafka, "orders", "billing", 15);
    wait_for_split(&[&a, &b], 4);
    produce(&kafka.daemon.url(), "orders", 0..100);
    wait_for("both members to read", || {
        a.records().len() + b.records().len() >= 100
    });
    let read_a = a.records();
    a.kill9();
    // Written while the dead member still holds its partitions: its session (6 s) must run
    // out before the survivor takes them over and reads these.
    produce(&kafka.daemon.url(), "orders", 100..160);
    wait_for("the survivor to take every partition", || {
        b.assigned().is_some_and(|p| p.len() == 4)
    });
    let read_b = b.finish();
    let mut all = values(&read_a);
    all.extend(values(&read_b));
    all.sort();
    all.dedup();
    assert_eq!(all, expected(0..160), "a record was lost");
}

/// Each partition's next offset after `records`, as `topic/partition`.
pub(super) fn next_offsets(topic: &str, records: &[(u64, u64, String)]) -> BTreeMap<String, i64> {
    let mut next: BTreeMap<String, i64> = BTreeMap::new();
    for (p, o, _) in records {
        let e = next.entry(format!("{topic}/{p}")).or_default();
        *e = (*e).max(*o as i64 + 1);
    }
    next
}

#[test]
fn librdkafka_and_kafka_python_share_a_group_cooperative_members_split_and_kcat_g_reads_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start_daemon(dir.path());
    create_topic(&kafka.daemon.url(), "orders", 4);

    // One member of each library in one group: they agree on a common assignor (range) and
    // split the partitions.
    let a = Member::start(&kafka, "orders", "billing", 3);
    let b = Member::start_with(&kafka, "orders", "billing", 3, Library::Librdkafka("range"));
    wait_for_split(&[&a, &b], 4);
    produce(&kafka.daemon.url(), "orders", 0..200);
    let both = finish_pair(a, b);
    assert_eq!(values(&both), expected(0..200), "every record exactly once");
    let (_, mut committed) = admin_offsets(&kafka, "billing");
    committed.retain(|_, offset| *offset > 0);
    assert_eq!(committed, next_offsets("orders", &both));

    // librdkafka's incremental (cooperative-sticky) rebalancing, a second group on the same
    // topic: it reads everything again, once.
    let c = Member::start_with(
        &kafka,
        "orders",
        "search",
        3,
        Library::Librdkafka("cooperative-sticky"),
    );
    let d = Member::start_with(
        &kafka,
        "orders",
        "search",
        3,
        Library::Librdkafka("cooperative-sticky"),
    );
    wait_for_split(&[&c, &d], 4);
    let both = finish_pair(c, d);
    assert_eq!(values(&both), expected(0..200), "every record exactly once");

    // kcat's balanced consumer reads the topic to its end and commits where it stopped.
    let mut kcat = Command::new("kcat");
    kcat.args([
        "-b",
        &kafka.kafka.to_string(),
        "-G",
        "audit",
        "-o",
        "beginning",
        "-e",
        "-f",
        "%p %o %s\n",
        "orders",
    ]);
    let out = run(kcat, b"", "kcat -G");
    let read: Vec<(u64, u64, String)> = out
        .lines()
        .map(|line| {
            let mut parts = line.splitn(3, ' ');
            let mut field = || parts.next().expect("kcat line: partition offset value");
            (
                field().parse().expect("partition"),
                field().parse().expect("offset"),
                field().to_owned(),
            )
        })
        .collect();
    assert_eq!(values(&read), expected(0..200));
    let (groups, committed) = admin_offsets(&kafka, "audit");
    assert!(groups.contains(&"audit".to_owned()), "listed: {groups:?}");
    assert_eq!(committed, next_offsets("orders", &read));
}

/// A member that joined, was assigned, and then fell silent (a paused or partitioned process)
/// is removed when the group rebalances without it; when it comes back its commit must be
/// refused, or it would overwrite what its successor committed.
#[test]
fn a_zombie_members_commit_after_the_group_moved_on_is_refused() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{
        FindCoordinatorRequest, FindCoordinatorResponse, GroupId, JoinGroupRequest,
        JoinGroupResponse, OffsetCommitRequest, OffsetCommitResponse, SyncGroupRequest,
        SyncGroupResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    const UNKNOWN_MEMBER_ID: i16 = 25;
    const ILLEGAL_GENERATION: i16 = 22;

    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start_daemon(dir.path());
    create_topic(&kafka.daemon.url(), "orders", 4);
    let group = GroupId(StrBytes::from_static_str("billing"));
    let mut zombie = std::net::TcpStream::connect(kafka.kafka).expect("connect");
    zombie.set_read_timeout(Some(WAIT)).expect("read timeout");

    // The zombie's life: find the coordinator, join (a 2 s rebalance timeout, so the group
    // does not wait long for it later), lead generation 1 and take every partition.
    wait_for("the coordinator", || {
        let mut find = FindCoordinatorRequest::default();
        find.key = StrBytes::from_static_str("billing");
        let found: FindCoordinatorResponse = exchange(&mut zombie, 10, 1, &find);
        found.error_code == 0
    });
    // ConsumerProtocolSubscription v0: version, topics ["orders"], no user data.
    let mut subscription = vec![0, 0, 0, 0, 0, 1, 0, 6];
    subscription.extend_from_slice(b"orders");
    subscription.extend_from_slice(&[0xff; 4]);
    let mut protocol = JoinGroupRequestProtocol::default();
    protocol.name = StrBytes::from_static_str("range");
    protocol.metadata = bytes::Bytes::from(subscription);
    let mut join = JoinGroupRequest::default();
    join.group_id = group.clone();
    join.session_timeout_ms = 30_000;
    join.rebalance_timeout_ms = 2_000;
    join.protocol_type = StrBytes::from_static_str("consumer");
    join.protocols = vec![protocol];
    let joined: JoinGroupResponse = exchange(&mut zombie, 11, 2, &join);
    assert_eq!(joined.error_code, 0, "join");
    assert_eq!(joined.leader, joined.member_id, "alone, it leads");
    let mut assignment = SyncGroupRequestAssignment::default();
    assignment.member_id = joined.member_id.clone();
    let mut sync = SyncGroupRequest::default();
    sync.group_id = group.clone();
    sync.generation_id = joined.generation_id;
    sync.member_id = joined.member_id.clone();
    sync.assignments = vec![assignment];
    let synced: SyncGroupResponse = exchange(&mut zombie, 14, 1, &sync);
    assert_eq!(synced.error_code, 0, "sync");

    // A real consumer joins; the silent zombie does not join again and is dropped, and the
    // consumer is given every partition.
    let successor = Member::start(&kafka, "orders", "billing", 3);
    wait_for("the successor to hold every partition", || {
        successor.assigned().is_some_and(|p| p.len() == 4)
    });
    produce(&kafka.daemon.url(), "orders", 0..50);
    wait_for("the successor to read", || successor.records().len() >= 50);

    // The zombie wakes up and commits for its old generation.
    let mut partition = OffsetCommitRequestPartition::default();
    partition.partition_index = 0;
    partition.committed_offset = 999;
    let mut topic = OffsetCommitRequestTopic::default();
    topic.name = TopicName(StrBytes::from_static_str("orders"));
    topic.partitions = vec![partition];
    let mut commit = OffsetCommitRequest::default();
    commit.group_id = group;
    commit.generation_id_or_member_epoch = joined.generation_id;
    commit.member_id = joined.member_id.clone();
    commit.retention_time_ms = -1;
    commit.topics = vec![topic];
    let answer: OffsetCommitResponse = exchange(&mut zombie, 8, 2, &commit);
    let refused = answer.topics[0].partitions[0].error_code;
    assert!(
        refused == UNKNOWN_MEMBER_ID || refused == ILLEGAL_GENERATION,
        "the zombie's commit was answered {refused}"
    );

    let read = successor.finish();
    assert_eq!(values(&read), expected(0..50));
    let (_, mut committed) = admin_offsets(&kafka, "billing");
    committed.retain(|_, offset| *offset > 0);
    assert_eq!(
        committed,
        next_offsets("orders", &read),
        "what the successor committed stands"
    );
}

/// `GET /v1/groups/{group}`.
fn group_info(base: &str, group: &str) -> Value {
    let (status, body) = send_json(
        &http_client(),
        Method::GET,
        &format!("{base}/v1/groups/{group}"),
        None,
    )
    .expect("describe group");
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn an_operator_sees_each_groups_members_offsets_and_lag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = start_daemon(dir.path());
    let base = kafka.daemon.url();
    create_topic(&base, "orders", 2);
    let listed = crate::e2e::harness::narad_cli(&base, &["group", "list"]);
    assert!(listed.contains("no consumer groups"), "{listed}");

    produce(&base, "orders", 0..50);
    let member = Member::start(&kafka, "orders", "billing", 3);
    wait_for("the member to read every record", || {
        member.records().len() >= 50
    });
    // While it is a member: listed with both partitions, and nothing left to read once its
    // commits are in.
    let mut info = Value::Null;
    wait_for("its commits to cover the topic", || {
        info = group_info(&base, "billing");
        info["total_lag"] == 0 && info["offsets"].as_array().is_some_and(|o| o.len() == 2)
    });
    assert_eq!(info["state"], "Stable", "{info}");
    let metrics = scrape(&base);
    assert_eq!(
        sample(&metrics, "narad_kafka_group_members{group=\"billing\"}"),
        Some(1.0),
        "{metrics}"
    );
    let members = info["members"].as_array().expect("members");
    assert_eq!(members.len(), 1, "{info}");
    assert_eq!(
        members[0]["assigned"],
        json!(["orders/0", "orders/1"]),
        "{info}"
    );
    let read = member.finish();

    // Gone, with 30 records produced since its last commit: they are the lag.
    produce(&base, "orders", 50..80);
    let info = group_info(&base, "billing");
    assert_eq!(info["state"], "Empty", "{info}");
    assert_eq!(info["total_lag"], 30, "{info}");
    let committed: BTreeMap<String, i64> = info["offsets"]
        .as_array()
        .expect("offsets")
        .iter()
        .map(|o| {
            (
                format!("{}/{}", o["topic"].as_str().unwrap_or(""), o["partition"]),
                o["committed"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(committed, next_offsets("orders", &read));
    let lags: u64 = info["offsets"]
        .as_array()
        .expect("offsets")
        .iter()
        .map(|o| {
            let (end, at) = (o["high_watermark"].as_u64(), o["committed"].as_u64());
            assert_eq!(o["lag"].as_u64(), end.zip(at).map(|(e, c)| e - c), "{o}");
            o["lag"].as_u64().unwrap_or(0)
        })
        .sum();
    assert_eq!(lags, 30);
    // The same lag on /metrics, per partition, and no member.
    let metrics = scrape(&base);
    for o in info["offsets"].as_array().expect("offsets") {
        let series = format!(
            "narad_kafka_group_lag_messages{{group=\"billing\",topic=\"orders\",partition=\"{}\"}}",
            o["partition"]
        );
        assert_eq!(
            sample(&metrics, &series),
            o["lag"].as_f64(),
            "{series} in {metrics}"
        );
    }
    assert_eq!(
        sample(&metrics, "narad_kafka_group_members{group=\"billing\"}"),
        Some(0.0),
        "{metrics}"
    );

    let described = crate::e2e::harness::narad_cli(&base, &["group", "describe", "billing"]);
    assert!(described.contains("group billing: Empty"), "{described}");
    assert!(described.contains("total lag 30"), "{described}");
    let listed = crate::e2e::harness::narad_cli(&base, &["group", "list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains("billing") && l.contains("Empty")),
        "{listed}"
    );
    let unknown = group_info(&base, "nobody");
    assert_eq!(unknown["state"], "Dead", "{unknown}");
    assert_eq!(unknown["offsets"], json!([]), "{unknown}");
}

/// The committed offsets of `group` by `topic/partition`, from `GET /v1/groups/{group}`.
fn committed_of(base: &str, group: &str) -> BTreeMap<String, i64> {
    group_info(base, group)["offsets"]
        .as_array()
        .expect("offsets")
        .iter()
        .map(|o| {
            (
                format!("{}/{}", o["topic"].as_str().unwrap_or(""), o["partition"]),
                o["committed"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A daemon in `dir` with topic `orders` (2 partitions) of 50 records, which group `billing`
/// read and committed to the end before its only member left; with its URL and what it read.
fn a_group_that_read_fifty(
    dir: &std::path::Path,
) -> (KafkaDaemon, String, Vec<(u64, u64, String)>) {
    let kafka = start_daemon(dir);
    let base = kafka.daemon.url();
    create_topic(&base, "orders", 2);
    produce(&base, "orders", 0..50);
    let member = Member::start(&kafka, "orders", "billing", 3);
    wait_for("the member to read every record", || {
        member.records().len() >= 50
    });
    wait_for("its commits to cover the topic", || {
        group_info(&base, "billing")["total_lag"] == 0
    });
    let read = member.finish();
    (kafka, base, read)
}

#[test]
fn an_operator_resets_an_empty_groups_offsets_and_its_next_member_reads_from_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (kafka, base, read) = a_group_that_read_fifty(dir.path());
    let first_commits = next_offsets("orders", &read);
    // A moment between the two produces, on this machine's clock (the daemon's too).
    std::thread::sleep(Duration::from_millis(50));
    let between = now_ms();
    std::thread::sleep(Duration::from_millis(50));
    produce(&base, "orders", 50..80);

    let reset = |args: &[&str]| {
        crate::e2e::harness::narad_cli(
            &base,
            &[&["group", "reset-offsets", "billing"], args].concat(),
        )
    };
    // Without --execute: the plan, and nothing changes.
    let plan = reset(&["--to", "earliest"]);
    assert!(plan.contains("nothing changed yet"), "{plan}");
    assert_eq!(committed_of(&base, "billing"), first_commits);

    let done = reset(&["--to", "earliest", "--execute"]);
    assert!(done.contains("group billing: 2 offsets reset"), "{done}");
    let zero: BTreeMap<String, i64> = [("orders/0".to_owned(), 0), ("orders/1".to_owned(), 0)]
        .into_iter()
        .collect();
    assert_eq!(committed_of(&base, "billing"), zero);
    assert_eq!(group_info(&base, "billing")["total_lag"], 80);

    // To a moment: each partition's first record committed after it, i.e. where the first
    // member's commits stood.
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/groups/billing/reset-offsets"),
        Some(&json!({"to": {"timestamp_ms": between}, "execute": true})),
    )
    .expect("reset to a time");
    assert_eq!(status, 200, "{body}");
    assert_eq!(committed_of(&base, "billing"), first_commits, "{body}");
    // A time after every record is each partition's end; an offset is kept within the range.
    reset(&["--to", "2100-01-01T00:00:00Z", "--execute"]);
    assert_eq!(group_info(&base, "billing")["total_lag"], 0);
    reset(&["--to", "1000000", "--topic", "orders", "--execute"]);
    assert_eq!(group_info(&base, "billing")["total_lag"], 0);

    // Back to the start: the group's next member reads every record again.
    reset(&["--to", "earliest", "--execute"]);
    let member = Member::start(&kafka, "orders", "billing", 5);
    wait_for("the new member to read every record from the start", || {
        member.records().len() >= 80
    });
    // While it is a member the group is not reset: its commits would replace the reset.
    let (status, body) = send_json(
        &http_client(),
        Method::POST,
        &format!("{base}/v1/groups/billing/reset-offsets"),
        Some(&json!({"to": "latest", "execute": true})),
    )
    .expect("reset a live group");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("stop its consumers first")),
        "{body}"
    );
    let read = member.finish();
    assert_eq!(values(&read), expected(0..80));
}

#[test]
fn a_child_attached_at_a_groups_committed_offsets_gets_exactly_what_the_group_has_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_kafka, base, read) = a_group_that_read_fifty(dir.path());
    assert_eq!(values(&read), expected(0..50));
    produce(&base, "orders", 50..80);

    // A group with no offsets on the parent is no start point.
    let (status, body) = send_json(
        &http_client(),
        Method::PUT,
        &format!("{base}/v1/topics/orders/children/nowhere"),
        Some(&json!({"partitions": 2, "start": {"group": "nobody"}})),
    )
    .expect("attach at an unknown group");
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("no committed offsets")),
        "{body}"
    );

    crate::e2e::harness::narad_cli(
        &base,
        &[
            "child",
            "attach",
            "orders",
            "unread",
            "--partitions",
            "2",
            "--start",
            "group:billing",
        ],
    );
    produce(&base, "orders", 80..90);
    let mut copied = Vec::new();
    wait_for(
        "the child to hold what the group had not read, and what came after",
        || {
            copied = (0..2)
                .flat_map(|p| crate::e2e::harness::fetch_all(&http_client(), &base, "unread", p))
                .filter_map(|r| r["value"].as_str().map(str::to_owned))
                .collect();
            copied.len() >= 40
        },
    );
    copied.sort();
    assert_eq!(copied, expected(50..90));
}
