//! SASL on the Kafka listener (`--kafka-sasl required`) with the clients users run: kcat
//! (librdkafka) and kafka-python authenticating as users made with `narad user`, over TLS
//! with certificates the test makes, and on a plain listener; what an unauthenticated client
//! may and may not do, byte by byte.

use std::path::Path;
use std::process::Command;

use reqwest::Method;
use serde_json::json;

use super::harness::{Daemon, narad_binary, sample, send_json, tls_client};
use super::kafka::{frame, run, run_output, send_raw};
use super::tls::{free_addr, tls_daemon};

const TOKEN: &str = "sasl-test-token";

/// `narad` with `args`, returning whether it succeeded, stdout and stderr.
fn narad(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(narad_binary())
        .args(args)
        .env_remove("NARAD_URL")
        .env_remove("NARAD_TOKEN")
        .output()
        .expect("run narad");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kcat against `broker` with `settings` (`-X` pairs) and `args` after them.
fn kcat(broker: &str, settings: &[String], args: &[&str]) -> Command {
    let mut command = Command::new("kcat");
    command.args(["-b", broker]);
    for setting in settings {
        command.args(["-X", setting]);
    }
    command.args(args);
    command
}

/// librdkafka settings for SASL as `user` with `password` over `mechanism`, on TLS trusting
/// `ca` when given.
fn sasl_settings(mechanism: &str, user: &str, password: &str, ca: Option<&Path>) -> Vec<String> {
    let mut settings = vec![
        format!(
            "security.protocol={}",
            if ca.is_some() {
                "SASL_SSL"
            } else {
                "SASL_PLAINTEXT"
            }
        ),
        format!("sasl.mechanisms={mechanism}"),
        format!("sasl.username={user}"),
        format!("sasl.password={password}"),
    ];
    if let Some(ca) = ca {
        settings.push(format!("ssl.ca.location={}", ca.display()));
    }
    settings
}

/// A kafka-python script reading `count` values of `topic` partition 0 from the start as
/// `user`, printing them comma-separated.
fn kafka_python_read(
    broker: &str,
    mechanism: &str,
    user: &str,
    password: &str,
    ca: Option<&Path>,
    topic: &str,
    count: usize,
) -> Command {
    let security = match ca {
        Some(ca) => format!(
            "security_protocol='SASL_SSL', ssl_cafile='{}'",
            ca.display()
        ),
        None => "security_protocol='SASL_PLAINTEXT'".to_owned(),
    };
    let script = format!(
        "import kafka\n\
         c = kafka.KafkaConsumer(bootstrap_servers='{broker}', {security}, \
         sasl_mechanism='{mechanism}', sasl_plain_username='{user}', \
         sasl_plain_password='{password}', auto_offset_reset='earliest', \
         consumer_timeout_ms=10000)\n\
         c.assign([kafka.TopicPartition('{topic}', 0)])\n\
         got = []\n\
         for m in c:\n    got.append(m.value.decode())\n    \
         if len(got) == {count}: break\n\
         print(','.join(got))\n"
    );
    let mut command = Command::new("python3");
    command.args(["-c", &script]);
    command
}

/// Writes `password` to a file in `dir` named after `name` and returns its path as text.
fn password_file(dir: &Path, name: &str, password: &str) -> String {
    let path = dir.join(format!("{name}.password"));
    std::fs::write(&path, format!("{password}\n")).expect("write password file");
    path.display().to_string()
}

#[test]
fn over_tls_users_produce_and_consume_with_scram_and_plain_and_wrong_or_missing_credentials_are_refused()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("token");
    let kafka = free_addr().to_string();
    let (daemon, ca) = tls_daemon(
        dir,
        "data",
        &[
            "--kafka-listen",
            &kafka,
            "--kafka-sasl",
            "required",
            "--auth-token-file",
            &token_file.display().to_string(),
        ],
    );
    let base = daemon.url();
    let ca_arg = ca.display().to_string();
    let client = ["--url", &base, "--tls-ca", &ca_arg];
    let with_token = [&client[..], &["--token", TOKEN]].concat();

    // Users: created by the CLI (the password salted there), listed only with the token.
    let alice_pw = password_file(dir, "alice", "wonder land");
    let (ok, out, err) = narad(
        &[
            &["user", "create", "alice", "--password-file", &alice_pw][..],
            &with_token,
        ]
        .concat(),
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("user alice created (SCRAM-SHA-256, SCRAM-SHA-512)"),
        "{out}"
    );
    let (ok, _, err) = narad(&[&["user", "list"][..], &client].concat());
    assert!(!ok, "the user list was read without the token");
    assert!(err.contains("401") || err.contains("token"), "{err}");
    let (ok, out, err) = narad(&[&["user", "list"][..], &with_token].concat());
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("alice") && l.contains("SCRAM-SHA-256,SCRAM-SHA-512")),
        "{out}"
    );
    let (ok, _, err) = narad(
        &[
            &["user", "create", "alice", "--password-file", &alice_pw][..],
            &with_token,
        ]
        .concat(),
    );
    assert!(!ok && err.contains("already exists"), "{err}");
    // The metadata holds no password.
    let metastore = std::fs::read_to_string(dir.join("data/metastore.json")).unwrap_or_default()
        + &std::fs::read_to_string(dir.join("data/metastore.journal")).unwrap_or_default();
    assert!(
        !metastore.contains("wonder land"),
        "the password is in the metadata"
    );
    let (ok, _, err) = narad(
        &[
            &["topic", "create", "orders", "--partitions", "1"][..],
            &with_token,
        ]
        .concat(),
    );
    assert!(ok, "{err}");

    // kcat produces as alice with SCRAM-SHA-256; kafka-python reads back with SCRAM-SHA-512.
    let scram256 = sasl_settings("SCRAM-SHA-256", "alice", "wonder land", Some(&ca));
    run(
        kcat(&kafka, &scram256, &["-P", "-t", "orders", "-p", "0"]),
        b"one\ntwo\nthree\n",
        "kcat -P with SCRAM-SHA-256 over TLS",
    );
    let read = run(
        kafka_python_read(
            &kafka,
            "SCRAM-SHA-512",
            "alice",
            "wonder land",
            Some(&ca),
            "orders",
            3,
        ),
        b"",
        "kafka-python with SCRAM-SHA-512 over TLS",
    );
    assert_eq!(read.trim(), "one,two,three");
    // PLAIN is offered over TLS and checks the same credential.
    let plain = sasl_settings("PLAIN", "alice", "wonder land", Some(&ca));
    run(
        kcat(&kafka, &plain, &["-P", "-t", "orders", "-p", "0"]),
        b"four\n",
        "kcat -P with PLAIN over TLS",
    );

    // A wrong password, an unknown user and a client without SASL are refused.
    for (settings, what) in [
        (
            sasl_settings("SCRAM-SHA-256", "alice", "wrong", Some(&ca)),
            "a wrong SCRAM password",
        ),
        (
            sasl_settings("PLAIN", "alice", "wrong", Some(&ca)),
            "a wrong PLAIN password",
        ),
        (
            sasl_settings("SCRAM-SHA-256", "mallory", "x", Some(&ca)),
            "an unknown user",
        ),
        (
            vec![
                "security.protocol=ssl".to_owned(),
                format!("ssl.ca.location={ca_arg}"),
            ],
            "a client without SASL",
        ),
    ] {
        let (status, out, err) = run_output(kcat(&kafka, &settings, &["-L", "-m", "5"]), b"", what);
        assert!(!status.success(), "{what} listed the cluster: {out}");
        assert!(
            !out.contains("topic \"orders\""),
            "{what} saw the topics: {out}"
        );
        if what.contains("password") || what.contains("unknown") {
            assert!(
                err.contains("invalid credentials"),
                "{what}: the client was not told why: {err}"
            );
        }
    }

    // The new password takes over from the old one.
    let new_pw = password_file(dir, "alice-new", "looking glass");
    let (ok, out, err) = narad(
        &[
            &["user", "password", "alice", "--password-file", &new_pw][..],
            &with_token,
        ]
        .concat(),
    );
    assert!(ok && out.contains("has a new password"), "{out}{err}");
    let (status, _, _) = run_output(
        kcat(&kafka, &scram256, &["-L", "-m", "5"]),
        b"",
        "the old password",
    );
    assert!(!status.success(), "the old password still works");
    let renewed = sasl_settings("SCRAM-SHA-256", "alice", "looking glass", Some(&ca));
    let listing = run(
        kcat(&kafka, &renewed, &["-L", "-m", "10"]),
        b"",
        "kcat -L with the new password",
    );
    assert!(listing.contains("topic \"orders\""), "{listing}");

    // A deleted user is refused from then on.
    let (ok, out, err) = narad(&[&["user", "delete", "alice"][..], &with_token].concat());
    assert!(ok && out.contains("user alice deleted"), "{out}{err}");
    let (status, _, _) = run_output(
        kcat(&kafka, &renewed, &["-L", "-m", "5"]),
        b"",
        "a deleted user",
    );
    assert!(!status.success(), "a deleted user still authenticates");

    let metrics = tls_client(Some(&ca), None)
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    let count = |series: &str| sample(&metrics, series).unwrap_or(0.0);
    assert!(
        count(r#"narad_kafka_sasl_authentications_total{mechanism="SCRAM-SHA-256",outcome="ok"}"#)
            >= 2.0,
        "{metrics}"
    );
    assert!(
        count(r#"narad_kafka_sasl_authentications_total{mechanism="SCRAM-SHA-512",outcome="ok"}"#)
            >= 1.0
    );
    assert!(
        count(r#"narad_kafka_sasl_authentications_total{mechanism="PLAIN",outcome="ok"}"#) >= 1.0
    );
    assert!(
        count(
            r#"narad_kafka_sasl_authentications_total{mechanism="SCRAM-SHA-256",outcome="failed"}"#
        ) >= 3.0
    );
    assert!(count(r#"narad_kafka_connections_closed_total{reason="unauthenticated"}"#) >= 1.0);
    let log = daemon.log();
    assert!(
        log.contains("narad::audit")
            && log.contains("kafka authentication refused")
            && log.contains("mallory"),
        "refusals are not in the audit log"
    );
}

#[test]
fn on_a_plain_sasl_listener_nothing_but_authentication_is_served_first_and_plain_is_not_offered() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let kafka_addr = free_addr();
    let kafka = kafka_addr.to_string();
    let daemon = Daemon::start_with(
        &dir.join("data"),
        &["--kafka-listen", &kafka, "--kafka-sasl", "required"],
    );
    let base = daemon.url();
    let http = super::harness::http_client();
    // A user made through the API from a password (the daemon salts it and keeps no copy).
    let (status, body) = send_json(
        &http,
        Method::POST,
        &format!("{base}/v1/users"),
        Some(&json!({"name": "bob", "password": "builder"})),
    )
    .expect("create bob");
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["mechanisms"],
        json!(["SCRAM-SHA-256", "SCRAM-SHA-512"])
    );
    for (request, expected) in [
        (json!({"name": "bob", "password": "again"}), 409),
        (json!({"name": "has space", "password": "x"}), 400),
        (json!({"name": "carol"}), 400),
        (json!({"name": "carol", "password": "x".repeat(1025)}), 400),
    ] {
        let (status, body) = send_json(
            &http,
            Method::POST,
            &format!("{base}/v1/users"),
            Some(&request),
        )
        .expect("create");
        assert_eq!(status, expected, "{request}: {body}");
    }
    super::kafka::create_topic(&base, "jobs", 1);

    // Before authenticating: ApiVersions is answered and offers the SASL APIs.
    let (answer, closed) = send_raw(kafka_addr, &frame(18, 0, &[]));
    assert!(!closed, "ApiVersions closed an unauthenticated connection");
    let api_keys: Vec<i16> = answer[4 + 4 + 2 + 4..]
        .chunks(6)
        .map(|c| i16::from_be_bytes([c[0], c[1]]))
        .collect();
    assert!(
        api_keys.contains(&17) && api_keys.contains(&36),
        "{api_keys:?}"
    );
    // A Metadata request (v1, all topics) is not: the connection closes without an answer.
    let (answer, closed) = send_raw(kafka_addr, &frame(3, 1, &(-1i32).to_be_bytes()));
    assert!(
        closed && answer.is_empty(),
        "Metadata before SASL was answered: {answer:?}"
    );
    // Nor is a frame larger than an unauthenticated connection may send: closed at its size.
    let mut big = ((1u32 << 20) + 8).to_be_bytes().to_vec();
    big.extend_from_slice(&[0, 18, 0, 0, 0, 0, 0, 1]);
    let (answer, closed) = send_raw(kafka_addr, &big);
    assert!(
        closed && answer.is_empty(),
        "a 1 MiB frame before SASL was read: {answer:?}"
    );

    // SCRAM over the plain listener works; PLAIN is not offered without TLS.
    let scram = sasl_settings("SCRAM-SHA-512", "bob", "builder", None);
    run(
        kcat(&kafka, &scram, &["-P", "-t", "jobs", "-p", "0"]),
        b"a\nb\n",
        "kcat -P with SCRAM-SHA-512",
    );
    let read = run(
        kafka_python_read(&kafka, "SCRAM-SHA-256", "bob", "builder", None, "jobs", 2),
        b"",
        "kafka-python with SCRAM-SHA-256",
    );
    assert_eq!(read.trim(), "a,b");
    let plain = sasl_settings("PLAIN", "bob", "builder", None);
    let (status, out, err) = run_output(
        kcat(&kafka, &plain, &["-L", "-m", "5"]),
        b"",
        "PLAIN without TLS",
    );
    assert!(!status.success(), "PLAIN was taken without TLS: {out}");
    assert!(
        err.contains("PLAIN") && err.contains("SCRAM-SHA-256"),
        "the client was not told which mechanisms exist: {err}"
    );

    // The user list and a new password through the API (no token configured: open).
    let (status, body) =
        send_json(&http, Method::GET, &format!("{base}/v1/users"), None).expect("list");
    assert_eq!(status, 200);
    assert_eq!(body["users"][0]["name"], "bob");
    assert!(
        !body.to_string().contains("stored_key") && !body.to_string().contains("salt"),
        "{body}"
    );
    let (status, body) = send_json(
        &http,
        Method::PUT,
        &format!("{base}/v1/users/nobody/credentials"),
        Some(&json!({"password": "x"})),
    )
    .expect("set password");
    assert_eq!(status, 404, "{body}");
    let metrics = super::harness::scrape(&base);
    assert!(
        sample(
            &metrics,
            r#"narad_kafka_connections_closed_total{reason="unauthenticated"}"#
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            r#"narad_kafka_connections_closed_total{reason="oversized"}"#
        )
        .unwrap_or(0.0)
            >= 1.0
    );
}

/// kafka-python as `user` (SCRAM-SHA-256, no TLS) running `body` with `p` (a producer) and
/// `kafka` imported; prints what `body` prints.
fn kafka_python(broker: &str, user: &str, password: &str, body: &str) -> Command {
    let script = format!(
        "import kafka, kafka.errors\n\
         conf = dict(bootstrap_servers='{broker}', security_protocol='SASL_PLAINTEXT', \
         sasl_mechanism='SCRAM-SHA-256', sasl_plain_username='{user}', \
         sasl_plain_password='{password}')\n{body}\n"
    );
    let mut command = Command::new("python3");
    command.args(["-c", &script]);
    command
}

#[test]
fn a_user_allowed_to_read_but_not_write_a_topic_is_refused_on_produce_and_reads_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let kafka = free_addr().to_string();
    let daemon = Daemon::start_with(
        &dir.join("data"),
        &["--kafka-listen", &kafka, "--kafka-sasl", "required"],
    );
    let base = daemon.url();
    let http = super::harness::http_client();
    for (name, password) in [("alice", "reader"), ("bob", "writer"), ("carol", "nobody")] {
        let (status, body) = send_json(
            &http,
            Method::POST,
            &format!("{base}/v1/users"),
            Some(&json!({"name": name, "password": password})),
        )
        .expect("create user");
        assert_eq!(status, 201, "{body}");
    }
    super::kafka::create_topic(&base, "orders", 1);
    let url = ["--url", base.as_str()];
    for rule in [
        &[
            "--principal",
            "User:bob",
            "--topic",
            "orders",
            "--operation",
            "write",
        ][..],
        &[
            "--principal",
            "User:alice",
            "--topic",
            "orders",
            "--operation",
            "read",
        ],
        &[
            "--principal",
            "User:alice",
            "--group",
            "readers-",
            "--prefixed",
            "--operation",
            "read",
        ],
    ] {
        let (ok, out, err) = narad(&[&["acl", "add"][..], rule, &url].concat());
        assert!(ok && out.starts_with("added: "), "{out}{err}");
    }
    let (ok, out, err) = narad(&[&["acl", "list"][..], &url].concat());
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("User:alice") && l.contains("read") && l.contains("readers-*")),
        "{out}"
    );

    let as_alice =
        |body: &str, what: &str| run(kafka_python(&kafka, "alice", "reader", body), b"", what);

    // bob writes; alice may not.
    let bob = sasl_settings("SCRAM-SHA-256", "bob", "writer", None);
    run(
        kcat(&kafka, &bob, &["-P", "-t", "orders", "-p", "0"]),
        b"a\nb\nc\n",
        "bob produces",
    );
    let refused = as_alice(
        "p = kafka.KafkaProducer(**conf, retries=0)\n\
             try:\n    p.send('orders', b'x', partition=0).get(timeout=20)\n    print('stored')\n\
             except Exception as e:\n    print(type(e).__name__)",
        "alice produces",
    );
    assert_eq!(refused.trim(), "TopicAuthorizationFailedError");

    // alice reads in a group her rule covers, and not in another.
    let read = as_alice(
        "c = kafka.KafkaConsumer('orders', **conf, group_id='readers-1', \
             auto_offset_reset='earliest', consumer_timeout_ms=15000)\n\
             got = []\n\
             for m in c:\n    got.append(m.value.decode())\n    if len(got) == 3: break\n\
             print(','.join(got))",
        "alice reads in group readers-1",
    );
    assert_eq!(read.trim(), "a,b,c");
    let other_group = as_alice(
        "c = kafka.KafkaConsumer('orders', **conf, group_id='writers', \
             auto_offset_reset='earliest', consumer_timeout_ms=10000)\n\
             try:\n    c.poll(timeout_ms=10000)\n    print('joined')\n\
             except Exception as e:\n    print(type(e).__name__)",
        "alice joins group writers",
    );
    assert_eq!(other_group.trim(), "GroupAuthorizationFailedError");

    // carol, with no rule, does not even see the topic in a listing.
    let carol = sasl_settings("SCRAM-SHA-256", "carol", "nobody", None);
    let listing = run(
        kcat(&kafka, &carol, &["-L", "-m", "10"]),
        b"",
        "carol lists",
    );
    assert!(!listing.contains("orders"), "{listing}");
    let listing = run(kcat(&kafka, &bob, &["-L", "-m", "10"]), b"", "bob lists");
    assert!(listing.contains("topic \"orders\""), "{listing}");

    // The rule removed, alice can no longer read.
    let (ok, out, err) = narad(
        &[
            &[
                "acl",
                "remove",
                "--principal",
                "User:alice",
                "--topic",
                "orders",
                "--operation",
                "read",
            ][..],
            &url,
        ]
        .concat(),
    );
    assert!(ok && out.starts_with("removed: "), "{out}{err}");
    let (status, out, _) = run_output(
        kcat(
            &kafka,
            &sasl_settings("SCRAM-SHA-256", "alice", "reader", None),
            &[
                "-C",
                "-t",
                "orders",
                "-p",
                "0",
                "-o",
                "beginning",
                "-e",
                "-m",
                "10",
            ],
        ),
        b"",
        "alice reads after the removal",
    );
    assert!(
        !status.success() || out.trim().is_empty(),
        "alice still read: {out}"
    );

    let metrics = super::harness::scrape(&base);
    assert!(
        sample(
            &metrics,
            r#"narad_kafka_acl_denied_total{resource="topic",operation="write"}"#
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            r#"narad_kafka_acl_denied_total{resource="group",operation="describe"}"#
        )
        .unwrap_or(0.0)
            >= 1.0
    );
    let log = daemon.log();
    assert!(
        log.contains("kafka request denied by the ACLs") && log.contains("User:alice"),
        "refusals are not in the audit log"
    );
}

#[test]
fn with_the_api_token_required_sasl_users_change_topics_over_kafka_only_as_acls_allow() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("token");
    let kafka = free_addr().to_string();
    let daemon = Daemon::start_with(
        &dir.join("data"),
        &[
            "--kafka-listen",
            &kafka,
            "--kafka-sasl",
            "required",
            "--auth-token-file",
            &token_file.display().to_string(),
        ],
    );
    let base = daemon.url();
    let admin = ["--url", base.as_str(), "--token", TOKEN];
    let pw = password_file(dir, "dana", "admin pw");
    let (ok, _, err) = narad(
        &[
            &["user", "create", "dana", "--password-file", &pw][..],
            &admin,
        ]
        .concat(),
    );
    assert!(ok, "{err}");
    let create = "from kafka.admin import KafkaAdminClient, NewTopic\n\
                  a = KafkaAdminClient(**conf)\n\
                  for name in ['sales.eu', 'other']:\n    \
                  try:\n        a.create_topics([NewTopic(name, 1, 1)])\n        print(name, 'created')\n    \
                  except Exception as e:\n        print(name, type(e).__name__)";
    // No rule yet: the token guards changes, so the Kafka listener makes none.
    let before = run(
        kafka_python(&kafka, "dana", "admin pw", create),
        b"",
        "dana creates, no rules",
    );
    assert!(
        before.contains("sales.eu TopicAuthorizationFailedError")
            && before.contains("other TopicAuthorizationFailedError"),
        "{before}"
    );
    let rule = [
        "--principal",
        "User:dana",
        "--topic",
        "sales.",
        "--prefixed",
        "--operation",
        "create",
    ];
    let (ok, _, err) = narad(&[&["acl", "add"][..], &rule, &admin].concat());
    assert!(ok, "{err}");
    let after = run(
        kafka_python(&kafka, "dana", "admin pw", create),
        b"",
        "dana creates under a rule",
    );
    assert!(
        after.contains("sales.eu created") && after.contains("other TopicAuthorizationFailedError"),
        "{after}"
    );
    let (ok, out, err) = narad(&[&["topic", "list"][..], &admin].concat());
    assert!(ok, "{err}");
    assert!(out.contains("sales.eu") && !out.contains("other"), "{out}");
}
