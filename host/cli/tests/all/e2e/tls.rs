//! TLS on the listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`), with certificates
//! the tests make with the `openssl` command (`scripts/test-all` installs it) and the clients
//! users run: curl, the `narad` CLI, kcat and kafka-python; in cluster mode, three nodes on a
//! real etcd calling each other over TLS.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use narad_host::metastore::test_etcd::TestEtcd;
use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, narad_binary, sample, send_json, tls_client};

/// How long a changed certificate file may take to be served: the daemon checks every 5 s.
const RELOAD_WAIT: Duration = Duration::from_secs(30);

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("openssl could not start ({e}); scripts/test-all installs it"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`{name}.pem`, `{name}.key`) in `dir`.
pub(crate) fn make_ca(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
    dir.join(format!("{name}.pem"))
}

/// A certificate `{name}.pem` and key `{name}.key` for 127.0.0.1 and localhost, signed by
/// CA `ca`, for a server or (`client`) a client.
pub(crate) fn make_cert(dir: &Path, ca: &str, name: &str, client: bool) -> (PathBuf, PathBuf) {
    let usage = if client { "clientAuth" } else { "serverAuth" };
    signed_cert(
        dir,
        ca,
        name,
        &format!(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage={usage}\n"
        ),
    )
}

/// A new P-256 key `{name}.key` and its certificate `{name}.pem` with `extensions` (an
/// openssl extension file's text), signed by CA `ca`, valid two days.
fn signed_cert(dir: &Path, ca: &str, name: &str, extensions: &str) -> (PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    std::fs::write(dir.join(format!("{name}.ext")), extensions).expect("write extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
    (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    )
}

/// A daemon (data in `dir/{data}`) serving TLS with a certificate for 127.0.0.1 from a fresh
/// private CA made in `dir`, with `extra` arguments: the daemon and the CA's certificate.
pub(crate) fn tls_daemon(dir: &Path, data: &str, extra: &[&str]) -> (Daemon, PathBuf) {
    let ca = make_ca(dir, "ca");
    let (cert, key) = make_cert(dir, "ca", "server", false);
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let args: Vec<&str> = ["--tls-cert", cert.as_str(), "--tls-key", key.as_str()]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    (Daemon::start_tls(&dir.join(data), &ca, None, &args), ca)
}

/// A blocking client trusting `ca` (and presenting `identity`, cert and key, when given).
fn client_trusting(ca: &Path, identity: Option<(&Path, &Path)>) -> reqwest::blocking::Client {
    tls_client(Some(ca), identity)
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "20"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl could not start ({e}); scripts/test-all installs it"))
}

fn narad(args: &[&str]) -> Output {
    Command::new(narad_binary())
        .args(args)
        .env_remove("NARAD_URL")
        .output()
        .expect("run narad")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// Polls `done` every 200 ms until it holds or `RELOAD_WAIT` passes.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + RELOAD_WAIT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {RELOAD_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Writes `bytes` to `path` as a rotation tool does: a new file renamed over the old.
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[test]
fn over_tls_curl_the_cli_kcat_and_kafka_python_work_and_a_rotated_certificate_is_served_without_a_restart()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let ca1 = make_ca(dir, "ca1");
    let (cert1, key1) = make_cert(dir, "ca1", "server1", false);
    // The daemon reads its own copies, so the test can rotate them.
    let (cert, key) = (dir.join("tls.pem"), dir.join("tls.key"));
    std::fs::copy(&cert1, &cert).expect("copy cert");
    std::fs::copy(&key1, &key).expect("copy key");
    let kafka = free_addr();
    let kafka_text = kafka.to_string();
    let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
    let daemon = Daemon::start_tls(
        &dir.join("data"),
        &ca1,
        None,
        &[
            "--tls-cert",
            &cert_arg,
            "--tls-key",
            &key_arg,
            "--kafka-listen",
            &kafka_text,
        ],
    );
    let base = daemon.url();
    assert!(base.starts_with("https://"), "{base}");
    let ca1_arg = ca1.display().to_string();

    // curl: with the CA it talks to the API; without, it refuses the certificate.
    let out = curl(&["--cacert", &ca1_arg, &format!("{base}/healthz")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = curl(&[&format!("{base}/healthz")]);
    assert!(
        !out.status.success(),
        "a certificate from an unknown CA was taken"
    );

    // The CLI: --tls-ca; without it, or with http://, an error that says what to do.
    let out = narad(&[
        "topic",
        "create",
        "orders",
        "--partitions",
        "2",
        "--url",
        &base,
        "--tls-ca",
        &ca1_arg,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = narad(&["topic", "list", "--url", &base]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--tls-ca"),
        "{}",
        text(&out.stderr)
    );
    let plain = base.replace("https://", "http://");
    let out = narad(&["topic", "list", "--url", &plain]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("https://"),
        "{}",
        text(&out.stderr)
    );

    // kcat produces over TLS, kafka-python reads it back over TLS.
    let mut produce = Command::new("kcat");
    produce.args([
        "-b",
        &kafka_text,
        "-X",
        "security.protocol=ssl",
        "-X",
        &format!("ssl.ca.location={ca1_arg}"),
        "-P",
        "-t",
        "orders",
        "-p",
        "0",
    ]);
    super::kafka::run(produce, b"one\ntwo\nthree\n", "kcat -P over TLS");
    let script = format!(
        "import kafka\n\
         c = kafka.KafkaConsumer(bootstrap_servers='{kafka_text}', security_protocol='SSL', \
         ssl_cafile='{ca1_arg}', auto_offset_reset='earliest', consumer_timeout_ms=10000)\n\
         c.assign([kafka.TopicPartition('orders', 0)])\n\
         got = []\n\
         for m in c:\n    got.append(m.value.decode())\n    \
         if len(got) == 3: break\n\
         print(','.join(got))\n"
    );
    let mut consume = Command::new("python3");
    consume.args(["-c", &script]);
    let read = super::kafka::run(consume, b"", "kafka-python over TLS");
    assert_eq!(read.trim(), "one,two,three");

    // A plain client on the TLS Kafka listener gets no Kafka answer and takes nothing down.
    let mut raw = TcpStream::connect(kafka).expect("connect");
    raw.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    // An ApiVersions v0 request: size, key 18, version 0, correlation id 1, no client id.
    raw.write_all(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff])
        .expect("write");
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    // A Kafka answer starts with its size (first byte 0); TLS answers with an alert (0x15)
    // or closes.
    assert_ne!(
        answer.first(),
        Some(&0),
        "a plain client got a Kafka answer: {answer:?}"
    );
    let metrics = || {
        client_trusting(&ca1, None)
            .get(format!("{base}/metrics"))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default()
    };
    let handshakes = r#"narad_tls_handshake_failures_total{listener="kafka"}"#;
    wait_for("the plain Kafka client counted", || {
        sample(&metrics(), handshakes).unwrap_or(0.0) >= 1.0
    });

    // Rotation: a certificate from another CA, renamed over the files, is served without a
    // restart; clients trusting only the old CA are refused from then on.
    let ca2 = make_ca(dir, "ca2");
    let (cert2, key2) = make_cert(dir, "ca2", "server2", false);
    replace(&key, &std::fs::read(&key2).expect("key2"));
    replace(&cert, &std::fs::read(&cert2).expect("cert2"));
    let ca2_arg = ca2.display().to_string();
    wait_for("the rotated certificate served", || {
        curl(&["--cacert", &ca2_arg, &format!("{base}/healthz")])
            .status
            .success()
    });
    let out = curl(&["--cacert", &ca1_arg, &format!("{base}/healthz")]);
    assert!(!out.status.success(), "the old certificate is still served");
    let mut list = Command::new("kcat");
    list.args([
        "-b",
        &kafka_text,
        "-X",
        "security.protocol=ssl",
        "-X",
        &format!("ssl.ca.location={ca2_arg}"),
        "-L",
        "-t",
        "orders",
    ]);
    let listing = super::kafka::run(list, b"", "kcat -L after the rotation");
    assert!(listing.contains("orders"), "{listing}");

    // A broken file (a half-done rotation) keeps the certificate being served, and says so.
    let metrics2 = || {
        client_trusting(&ca2, None)
            .get(format!("{base}/metrics"))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default()
    };
    replace(&cert, b"-----BEGIN CERTIFICATE-----\nnot base64\n");
    wait_for("the failed reload counted", || {
        sample(&metrics2(), r#"narad_tls_reloads_total{outcome="failed"}"#).unwrap_or(0.0) >= 1.0
    });
    let out = curl(&["--cacert", &ca2_arg, &format!("{base}/healthz")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        daemon.log().contains("still serving the previous one"),
        "{}",
        daemon.log()
    );

    // SIGHUP asks for a reload (it would end a process that does not handle it).
    replace(&cert, &std::fs::read(&cert2).expect("cert2"));
    let pid = daemon.pid().expect("running").to_string();
    let hup = Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill -HUP");
    assert!(hup.success());
    wait_for("the reload after SIGHUP", || {
        sample(&metrics2(), r#"narad_tls_reloads_total{outcome="ok"}"#).unwrap_or(0.0) >= 3.0
    });
    let out = narad(&["topic", "list", "--url", &base, "--tls-ca", &ca2_arg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("orders"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn with_a_client_ca_only_clients_holding_a_certificate_it_signed_connect_and_bad_files_stop_the_start()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let ca = make_ca(dir, "ca");
    let (cert, key) = make_cert(dir, "ca", "server", false);
    let (client_cert, client_key) = make_cert(dir, "ca", "client", true);
    make_ca(dir, "other");
    let (stranger_cert, stranger_key) = make_cert(dir, "other", "stranger", true);
    let data = dir.join("data");
    let data_arg = data.display().to_string();
    let [cert_arg, key_arg, ca_arg] = [&cert, &key, &ca].map(|p| p.display().to_string());

    // Files that cannot serve stop the start, naming the files and why.
    let start = |args: &[&str]| {
        let listen = free_addr().to_string();
        let mut all = vec![
            "serve",
            "--data-dir",
            data_arg.as_str(),
            "--listen",
            listen.as_str(),
        ];
        all.extend_from_slice(args);
        let out = Command::new(narad_binary())
            .args(&all)
            .output()
            .expect("run narad serve");
        assert!(!out.status.success(), "started with {args:?}");
        text(&out.stderr)
    };
    let other_key_arg = stranger_key.display().to_string();
    let stderr = start(&["--tls-cert", &cert_arg, "--tls-key", &other_key_arg]);
    assert!(
        stderr.contains(&cert_arg) && stderr.contains(&other_key_arg),
        "{stderr}"
    );
    let stderr = start(&["--tls-cert", &cert_arg]);
    assert!(stderr.contains("--tls-key"), "{stderr}");
    let stderr = start(&["--tls-cert", &key_arg, "--tls-key", &key_arg]);
    assert!(
        stderr.contains("CERTIFICATE") && stderr.contains(&key_arg),
        "{stderr}"
    );

    let kafka = free_addr();
    let kafka_text = kafka.to_string();
    let daemon = Daemon::start_tls(
        &data,
        &ca,
        Some((&client_cert, &client_key)),
        &[
            "--tls-cert",
            &cert_arg,
            "--tls-key",
            &key_arg,
            "--tls-client-ca",
            &ca_arg,
            "--kafka-listen",
            &kafka_text,
        ],
    );
    let base = daemon.url();
    let healthz = format!("{base}/healthz");
    let [client_cert_arg, client_key_arg] =
        [&client_cert, &client_key].map(|p| p.display().to_string());

    // curl without a client certificate, or with one another CA signed, is refused.
    assert!(!curl(&["--cacert", &ca_arg, &healthz]).status.success());
    let out = curl(&[
        "--cacert",
        &ca_arg,
        "--cert",
        &stranger_cert.display().to_string(),
        "--key",
        &stranger_key.display().to_string(),
        &healthz,
    ]);
    assert!(
        !out.status.success(),
        "a client certificate of another CA was taken"
    );
    let out = curl(&[
        "--cacert",
        &ca_arg,
        "--cert",
        &client_cert_arg,
        "--key",
        &client_key_arg,
        &healthz,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // The CLI presents its certificate with --tls-client-cert/--tls-client-key.
    let out = narad(&[
        "topic",
        "create",
        "orders",
        "--url",
        &base,
        "--tls-ca",
        &ca_arg,
        "--tls-client-cert",
        &client_cert_arg,
        "--tls-client-key",
        &client_key_arg,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = narad(&["topic", "list", "--url", &base, "--tls-ca", &ca_arg]);
    assert!(
        !out.status.success(),
        "the CLI got in without a client certificate"
    );

    // kcat: the same on the Kafka listener.
    let kcat = |with_identity: bool| {
        let mut command = Command::new("kcat");
        command.args([
            "-b",
            &kafka_text,
            "-X",
            "security.protocol=ssl",
            "-X",
            &format!("ssl.ca.location={ca_arg}"),
            "-m",
            "10",
            "-L",
            "-t",
            "orders",
        ]);
        if with_identity {
            command.args([
                "-X",
                &format!("ssl.certificate.location={client_cert_arg}"),
                "-X",
                &format!("ssl.key.location={client_key_arg}"),
            ]);
        }
        command.output().expect("kcat")
    };
    let out = kcat(true);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("orders"),
        "{}",
        text(&out.stdout)
    );
    let out = kcat(false);
    assert!(
        !out.status.success() || !text(&out.stdout).contains("orders"),
        "kcat listed topics without a client certificate: {}",
        text(&out.stdout)
    );
}

/// Cluster nodes serving TLS on one real etcd, all with one certificate (for 127.0.0.1)
/// signed by a private CA made for the test.
struct TlsCluster {
    nodes: Vec<Daemon>,
    ca: PathBuf,
    client: reqwest::blocking::Client,
    _etcd: TestEtcd,
    _dir: tempfile::TempDir,
}

/// One node of a [`TlsCluster`]: its id, whether it is given the CA with `--peer-tls-ca`, and
/// its Kafka listen address when it runs one.
struct TlsNode<'a> {
    id: &'a str,
    peer_ca: bool,
    kafka: Option<&'a str>,
}

impl TlsCluster {
    fn start(nodes: &[TlsNode<'_>]) -> TlsCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = make_ca(dir.path(), "ca");
        let (cert, key) = make_cert(dir.path(), "ca", "node", false);
        let [ca_arg, cert_arg, key_arg] = [&ca, &cert, &key].map(|p| p.display().to_string());
        let etcd = TestEtcd::start();
        let endpoint = etcd.endpoint();
        let started = nodes
            .iter()
            .map(|node| {
                let mut args = vec![
                    "--etcd",
                    &endpoint,
                    "--cluster",
                    "tls",
                    "--node-id",
                    node.id,
                    "--tls-cert",
                    &cert_arg,
                    "--tls-key",
                    &key_arg,
                ];
                if node.peer_ca {
                    args.extend(["--peer-tls-ca", ca_arg.as_str()]);
                }
                if let Some(kafka) = node.kafka {
                    args.extend(["--kafka-listen", kafka]);
                }
                Daemon::start_tls(&dir.path().join(node.id), &ca, None, &args)
            })
            .collect();
        let cluster = TlsCluster {
            nodes: started,
            client: client_trusting(&ca, None),
            ca,
            _etcd: etcd,
            _dir: dir,
        };
        cluster.wait_for_nodes();
        cluster
    }

    /// Waits until every node lists every node, each advertising an https:// address.
    fn wait_for_nodes(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in &self.nodes {
            loop {
                let (status, body) =
                    self.call(Method::GET, format!("{}/v1/nodes", node.url()), None);
                assert_eq!(status, 200, "{body}");
                let advertised: Vec<&str> = body["nodes"]
                    .as_array()
                    .map(|n| n.iter().filter_map(|n| n["advertise"].as_str()).collect())
                    .unwrap_or_default();
                if advertised.len() == self.nodes.len() {
                    assert!(
                        advertised.iter().all(|a| a.starts_with("https://")),
                        "{body}"
                    );
                    break;
                }
                assert!(Instant::now() < deadline, "nodes never converged: {body}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn url(&self, node: usize) -> String {
        self.nodes[node].url()
    }

    fn call(&self, method: Method, url: String, body: Option<Value>) -> (u16, Value) {
        send_json(&self.client, method, &url, body.as_ref()).expect("call")
    }
}

#[test]
fn three_nodes_over_tls_forward_commit_and_list_across_nodes_and_kafka_clients_reach_every_owner() {
    let kafka: Vec<String> = (0..3).map(|_| free_addr().to_string()).collect();
    let cluster = TlsCluster::start(
        &["n1", "n2", "n3"]
            .iter()
            .zip(&kafka)
            .map(|(id, kafka)| TlsNode {
                id,
                peer_ca: true,
                kafka: Some(kafka),
            })
            .collect::<Vec<_>>(),
    );
    let ca_arg = cluster.ca.display().to_string();
    let client = &cluster.client;
    let url = |i: usize| cluster.url(i);
    let call = |method: Method, url: String, body: Option<Value>| cluster.call(method, url, body);

    // Through n1: topics on every node; the attach (a commit path between nodes) through the CLI.
    for (name, placement) in [
        ("orders", json!(["n1", "n2", "n3"])),
        ("copy", json!(["n2", "n3", "n1"])),
    ] {
        let (status, body) = call(
            Method::POST,
            format!("{}/v1/topics", url(0)),
            Some(json!({"name": name, "partitions": 3, "placement": placement})),
        );
        assert!((200..300).contains(&status), "{status} {body}");
    }
    let out = narad(&[
        "child",
        "attach",
        "orders",
        "copy",
        "--url",
        &url(0),
        "--tls-ca",
        &ca_arg,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Produced through n3 (forwarded to each partition's owner), copied by cursors on every
    // node into child partitions on other nodes: every record arrives once.
    let records: Vec<Value> = (0..9)
        .map(|i| json!({"partition": i % 3, "value": format!("r{i}")}))
        .collect();
    let (status, body) = call(
        Method::POST,
        format!("{}/v1/topics/orders/records", url(2)),
        Some(json!({"records": records})),
    );
    assert!((200..300).contains(&status), "{status} {body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut values: Vec<String> = (0..3)
            .flat_map(|p| fetch_all(client, &url(0), "copy", p))
            .filter_map(|r| r["value"].as_str().map(str::to_owned))
            .collect();
        values.sort();
        if values.len() >= 9 {
            let wanted: Vec<String> = {
                let mut w: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
                w.sort();
                w
            };
            assert_eq!(values, wanted);
            break;
        }
        assert!(Instant::now() < deadline, "copied {values:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The listing gathers every node's cursors over TLS.
    let out = narad(&[
        "child",
        "list",
        "orders",
        "--url",
        &url(1),
        "--tls-ca",
        &ca_arg,
    ]);
    let listing = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for node in ["n1", "n2", "n3"] {
        assert!(
            listing.lines().any(|l| l.starts_with("copy")
                && l.contains(&format!(" {node} "))
                && l.contains("running")),
            "{listing}"
        );
    }

    // kcat bootstrapped on n1's Kafka listener produces to a partition n3 owns, over TLS.
    let mut produce = Command::new("kcat");
    produce.args([
        "-b",
        &kafka[0],
        "-X",
        "security.protocol=ssl",
        "-X",
        &format!("ssl.ca.location={ca_arg}"),
        "-P",
        "-t",
        "orders",
        "-p",
        "2",
    ]);
    super::kafka::run(produce, b"by-kafka\n", "kcat -P to n3 over TLS");
    let stored = fetch_all(client, &url(0), "orders", 2);
    assert!(
        stored.iter().any(|r| r["value"] == "by-kafka"),
        "{stored:?}"
    );
}

#[test]
fn a_node_that_does_not_trust_its_peers_certificates_says_so_when_it_calls_them() {
    // n2 is missing --peer-tls-ca: the private CA that signed n1's certificate is unknown to it.
    let cluster = TlsCluster::start(&[
        TlsNode {
            id: "n1",
            peer_ca: true,
            kafka: None,
        },
        TlsNode {
            id: "n2",
            peer_ca: false,
            kafka: None,
        },
    ]);
    let (n1, n2, client) = (&cluster.nodes[0], &cluster.nodes[1], &cluster.client);
    let (status, body) = send_json(
        client,
        Method::POST,
        &format!("{}/v1/topics", n1.url()),
        Some(&json!({"name": "orders", "partitions": 1, "placement": ["n1"]})),
    )
    .expect("create");
    assert!((200..300).contains(&status), "{status} {body}");
    // A produce through n2 is forwarded to n1; the error names the certificate problem, not
    // only "error sending request".
    let (status, body) = send_json(
        client,
        Method::POST,
        &format!("{}/v1/topics/orders/records", n2.url()),
        Some(&json!({"records": [{"value": "x"}]})),
    )
    .expect("produce");
    assert!(status >= 500, "{status} {body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("certificate"), "{body}");
}

/// A certificate `{node}.pem`/`{node}.key` signed by CA `ca` for a cluster node: its host
/// (127.0.0.1, localhost) and its node id as DNS names, for serving and for calling peers.
fn make_node_cert(dir: &Path, ca: &str, node: &str) -> (PathBuf, PathBuf) {
    signed_cert(
        dir,
        ca,
        node,
        &format!(
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{node}\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
        ),
    )
}

#[test]
fn with_mutual_tls_nodes_prove_their_ids_and_a_certificate_of_the_ca_with_the_peer_secret_is_no_node()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let ca = make_ca(dir, "ca");
    let ca_arg = ca.display().to_string();
    let (operator_cert, operator_key) = make_cert(dir, "ca", "operator", true);
    let token = dir.join("token");
    std::fs::write(&token, "op-token\n").expect("write the token");
    let token_arg = token.display().to_string();
    let etcd = TestEtcd::start();
    let endpoint = etcd.endpoint();
    let nodes: Vec<Daemon> = ["n1", "n2", "n3"]
        .iter()
        .map(|node| {
            let (cert, key) = make_node_cert(dir, "ca", node);
            let (cert, key) = (cert.display().to_string(), key.display().to_string());
            let args = [
                "--etcd",
                &endpoint,
                "--cluster",
                "mtls",
                "--node-id",
                node,
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--peer-tls-ca",
                &ca_arg,
                "--peer-tls-cert",
                &cert,
                "--peer-tls-key",
                &key,
                "--tls-client-ca",
                &ca_arg,
                "--auth-token-file",
                &token_arg,
            ];
            Daemon::start_tls(
                &dir.join(node),
                &ca,
                Some((operator_cert.as_path(), operator_key.as_path())),
                &args,
            )
        })
        .collect();
    // The operator: a client certificate of the CA and the API token.
    let client = {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            "Bearer op-token".parse().expect("header"),
        );
        let mut both = std::fs::read(&operator_cert).expect("read the operator certificate");
        both.extend(std::fs::read(&operator_key).expect("read the operator key"));
        reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&ca).expect("read the CA"))
                    .expect("CA"),
            )
            .identity(reqwest::Identity::from_pem(&both).expect("identity"))
            .default_headers(headers)
            .build()
            .expect("client")
    };
    let url = |i: usize| nodes[i].url();
    wait_for("every node to see three", || {
        (0..3).all(|i| {
            send_json(&client, Method::GET, &format!("{}/v1/nodes", url(i)), None)
                .map(|(_, body)| body["nodes"].as_array().map_or(0, Vec::len) == 3)
                .unwrap_or(false)
        })
    });
    // Copies go from n1 to n3 and a produce through n2 is forwarded to n1: every call between
    // nodes carries the caller's certificate.
    for (name, placement) in [("orders", "n1"), ("copy", "n3")] {
        let (status, body) = send_json(
            &client,
            Method::POST,
            &format!("{}/v1/topics", url(0)),
            Some(&json!({"name": name, "partitions": 1, "placement": [placement]})),
        )
        .expect("create");
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = send_json(
        &client,
        Method::PUT,
        &format!("{}/v1/topics/orders/children/copy", url(0)),
        Some(&json!({})),
    )
    .expect("attach");
    assert!((200..300).contains(&status), "{body}");
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/topics/orders/records", url(1)),
        Some(&json!({"records": [{"value": "one"}, {"value": "two"}]})),
    )
    .expect("produce");
    assert_eq!(status, 200, "{body}");
    wait_for("both copies on n3", || {
        fetch_all(&client, &url(2), "copy", 0).len() == 2
    });
    // A node's reads of another's partitions pass as the operator's with the node's
    // certificate: with a rule in force, a describe through n1 still gathers n3's partition.
    let (status, body) = send_json(
        &client,
        Method::POST,
        &format!("{}/v1/acls", url(0)),
        Some(&json!({"principal": "User:someone", "resource": "topic", "name": "x", "operation": "read"})),
    )
    .expect("add a rule");
    assert!((200..300).contains(&status), "{body}");
    wait_for("n1 to gather n3's partition", || {
        send_json(
            &client,
            Method::GET,
            &format!("{}/v1/topics/copy", url(0)),
            None,
        )
        .map(|(_, body)| body["partition_stats"][0]["high_watermark"] == 2)
        .unwrap_or(false)
    });
    // The token holder, with a certificate of the CA, calls no route between nodes.
    let answer = client
        .post(format!("{}/internal/v1/commit", url(2)))
        .body(vec![0u8; 8])
        .send()
        .expect("call");
    assert_eq!(answer.status().as_u16(), 403, "{:?}", answer.text());

    // mallory holds a certificate the CA signed and the peer secret (read from etcd), and is
    // still no node: refused, naming why, and nothing is committed.
    let secret = crate::e2e::harness::peer_secret(&endpoint, "mtls");
    let (mallory_cert, mallory_key) = make_node_cert(dir, "ca", "mallory");
    let mallory = client_trusting(&ca, Some((mallory_cert.as_path(), mallory_key.as_path())));
    for (claimed, says) in [
        ("n1", "not node \\\"n1\\\"'s"),
        ("mallory", "not a live node"),
    ] {
        let answer = mallory
            .post(format!("{}/internal/v1/commit", url(2)))
            .bearer_auth(&secret)
            .header("x-narad-node", claimed)
            .body(vec![0u8; 8])
            .send()
            .expect("call");
        let status = answer.status().as_u16();
        let text = answer.text().unwrap_or_default();
        assert_eq!(status, 403, "claiming {claimed}: {text}");
        assert!(text.contains(says), "claiming {claimed}: {text}");
        // Nor is the secret the operator's token on the public routes without the proof.
        let answer = mallory
            .post(format!("{}/v1/topics", url(0)))
            .bearer_auth(&secret)
            .header("x-narad-node", claimed)
            .json(&json!({"name": "mallorys", "partitions": 1}))
            .send()
            .expect("call");
        assert_eq!(answer.status().as_u16(), 401, "claiming {claimed}");
    }
    assert_eq!(fetch_all(&client, &url(2), "copy", 0).len(), 2);
}
