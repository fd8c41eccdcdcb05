//! A node reaching etcd over TLS with a client certificate and as an etcd user (`--etcd-ca`,
//! `--etcd-cert`, `--etcd-key`, `--etcd-user`, `--etcd-password-file`), on a real etcd started
//! with `--client-cert-auth` and `auth enable`, with certificates the test makes.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use narad_host::config::EtcdSecurity;
use narad_host::metastore::etcd::connect_secured;
use narad_host::metastore::test_etcd::{EtcdTlsFiles, TestEtcd};
use reqwest::Method;
use serde_json::json;

use super::harness::{Daemon, fetch_all, http_client, narad_binary, send_json};
use super::tls::{make_ca, make_cert};

#[test]
fn a_node_works_through_an_etcd_that_requires_tls_client_certificates_and_a_user() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let ca = make_ca(dir, "ca");
    let (server_cert, server_key) = make_cert(dir, "ca", "etcd", false);
    let (client_cert, client_key) = make_cert(dir, "ca", "narad", true);
    let etcd = TestEtcd::start_tls(EtcdTlsFiles {
        cert: server_cert,
        key: server_key,
        client_ca: ca.clone(),
    });
    let endpoint = etcd.endpoint();
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    let certified = EtcdSecurity {
        ca: Some(ca.clone()),
        identity: Some((client_cert.clone(), client_key.clone())),
        user: None,
    };
    // etcd's own authentication: a root user, then auth on.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = connect_secured(std::slice::from_ref(&endpoint), &certified)
            .await
            .expect("connect with the client certificate");
        client
            .user_add("root", "root-pw", None)
            .await
            .expect("add root");
        client
            .user_grant_role("root", "root")
            .await
            .expect("grant root");
        client.auth_enable().await.expect("enable auth");
    });
    let password = dir.join("etcd.password");
    std::fs::write(&password, "root-pw\n").expect("password file");
    let args = |extra: &[String]| -> Vec<String> {
        let mut args: Vec<String> = [
            "--etcd",
            endpoint.as_str(),
            "--node-id",
            "n1",
            "--lease-ttl-ms",
            "3000",
            "--etcd-ca",
            &ca.display().to_string(),
            "--etcd-cert",
            &client_cert.display().to_string(),
            "--etcd-key",
            &client_key.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().cloned());
        args
    };

    // Without the user, etcd refuses the node (its certificate's name is no etcd user), and
    // the start stops saying so.
    let data = dir.join("refused");
    let mut refused = Command::new(narad_binary())
        .args([
            "serve",
            "--data-dir",
            &data.display().to_string(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(args(&[]))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start narad");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = refused.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = refused.kill();
            panic!("a node etcd refuses did not stop within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(!status.success(), "a node etcd refuses started: {stderr}");
    assert!(
        stderr.contains("etcd"),
        "the refusal does not name etcd: {stderr}"
    );

    // With the user, the node serves: topics and records go through etcd as usual.
    let user = [
        "--etcd-user".to_owned(),
        "root".to_owned(),
        "--etcd-password-file".to_owned(),
        password.display().to_string(),
    ];
    let node_args = args(&user);
    let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&dir.join("n1"), &node_args);
    let base = daemon.url();
    let http = http_client();
    super::kafka::create_topic(&base, "orders", 1);
    let (status, body) = send_json(
        &http,
        Method::POST,
        &format!("{base}/v1/topics/orders/records"),
        Some(&json!({"records": [{"value": "over tls"}]})),
    )
    .expect("produce");
    assert_eq!(status, 200, "{body}");
    assert_eq!(fetch_all(&http, &base, "orders", 0).len(), 1);
    // The topic is in etcd, read back as root.
    let keys = runtime.block_on(async {
        let security = EtcdSecurity {
            user: Some(("root".to_owned(), "root-pw".to_owned())),
            ..certified.clone()
        };
        let mut client = connect_secured(std::slice::from_ref(&endpoint), &security)
            .await
            .expect("connect as root");
        let found = client
            .get(
                "/narad/",
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            )
            .await
            .expect("read the keys");
        found
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect::<Vec<_>>()
    });
    assert!(
        keys.iter().any(|k| k.ends_with("meta/topic/orders")),
        "{keys:?}"
    );
}
