//! Users on the HTTP API (`--auth-token-file`): Basic credentials over TLS, held to the ACLs;
//! the anonymous caller; `--auth-reads`. Clients are curl with certificates the test makes.

use std::process::Command;

use super::harness::{Daemon, sample};
use super::tls::tls_daemon;

const TOKEN: &str = "http-users-token";

/// curl with `args`; returns the HTTP status and the body.
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args([
            "--silent",
            "--max-time",
            "20",
            "--write-out",
            "\n%{http_code}",
        ])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl could not start ({e}); scripts/test-all installs it"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_owned())
}

#[test]
fn a_user_over_tls_produces_and_reads_as_the_acls_allow_and_is_refused_the_rest() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("token");
    let (daemon, ca) = tls_daemon(
        dir,
        "data",
        &["--auth-token-file", &token_file.display().to_string()],
    );
    let base = daemon.url();
    let ca_arg = ca.display().to_string();
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let as_operator = |method: &str, path: &str, body: &str| {
        curl(&[
            "--cacert",
            &ca_arg,
            "-H",
            &bearer,
            "-X",
            method,
            "-d",
            body,
            &format!("{base}{path}"),
        ])
    };
    for user in [
        r#"{"name":"alice","password":"wonder"}"#,
        r#"{"name":"bob","password":"builder"}"#,
    ] {
        let (status, body) = as_operator("POST", "/v1/users", user);
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = as_operator("POST", "/v1/topics", r#"{"name":"orders","partitions":1}"#);
    assert_eq!(status, 201, "{body}");
    for operation in ["write", "read"] {
        let rule = format!(
            r#"{{"principal":"User:alice","resource":"topic","name":"orders","operation":"{operation}"}}"#
        );
        let (status, body) = as_operator("POST", "/v1/acls", &rule);
        assert_eq!(status, 201, "{body}");
    }
    let as_user = |user: &str, method: &str, path: &str, body: &str| {
        let mut args = vec!["--cacert", ca_arg.as_str(), "-u", user, "-X", method];
        if !body.is_empty() {
            args.extend(["-d", body]);
        }
        let url = format!("{base}{path}");
        args.push(&url);
        curl(&args)
    };
    let records = r#"{"records":[{"value":"one"},{"value":"two"}]}"#;

    // alice writes and reads orders, as her rules say; twice, the second from memory.
    for _ in 0..2 {
        let (status, body) = as_user("alice:wonder", "POST", "/v1/topics/orders/records", records);
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = as_user(
        "alice:wonder",
        "GET",
        "/v1/topics/orders/partitions/0/records",
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"one\"") || body.contains("b25l"), "{body}");
    // ...but may not manage users or ACLs, or change the cluster.
    let (status, body) = as_user("alice:wonder", "GET", "/v1/users", "");
    assert_eq!(status, 403, "{body}");
    let (status, body) = as_user(
        "alice:wonder",
        "POST",
        "/v1/topics",
        r#"{"name":"x","partitions":1}"#,
    );
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("User:alice may not create the cluster"),
        "{body}"
    );

    // bob has no rule: refused on orders, with the reason.
    let (status, body) = as_user("bob:builder", "POST", "/v1/topics/orders/records", records);
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("User:bob may not write topic \\\"orders\\\""),
        "{body}"
    );
    let (status, body) = as_user("bob:builder", "GET", "/v1/topics/orders", "");
    assert_eq!(status, 403, "{body}");

    // A wrong password, and the anonymous caller's change, are 401.
    let (status, body) = as_user("alice:wrong", "GET", "/v1/topics", "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("wrong user name or password"), "{body}");
    let (status, body) = curl(&[
        "--cacert",
        &ca_arg,
        "-X",
        "POST",
        "-d",
        records,
        &format!("{base}/v1/topics/orders/records"),
    ]);
    assert_eq!(status, 401, "{body}");
    let (status, _) = curl(&["--cacert", &ca_arg, &format!("{base}/v1/topics")]);
    assert_eq!(status, 200, "reads stay open without --auth-reads");

    // The CLI logs in as alice: her produce goes through, a topic creation is refused with the
    // rule it lacks, and --token with --login is a mistake it names.
    let password = dir.join("alice.password");
    std::fs::write(&password, "wonder\n").expect("password file");
    let login = [
        "--url",
        base.as_str(),
        "--tls-ca",
        ca_arg.as_str(),
        "--login",
        "alice",
        "--login-password-file",
        password.to_str().expect("utf-8 path"),
    ];
    let narad = |args: &[&str], stdin: &[u8]| {
        let mut child = Command::new(super::harness::narad_binary())
            .args(args)
            .env_remove("NARAD_URL")
            .env_remove("NARAD_TOKEN")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run narad");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), stdin).expect("stdin");
        let out = child.wait_with_output().expect("narad");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = narad(&[&["produce", "orders"][..], &login].concat(), b"three\n");
    assert!(ok, "{err}");
    let (ok, err) = narad(&[&["topic", "create", "other"][..], &login].concat(), b"");
    assert!(
        !ok && err.contains("User:alice may not create the cluster"),
        "{err}"
    );
    let (ok, err) = narad(
        &[&["topic", "list", "--token", TOKEN][..], &login].concat(),
        b"",
    );
    assert!(
        !ok && err.contains("give --token or --login, not both"),
        "{err}"
    );

    let metrics = curl(&["--cacert", &ca_arg, &format!("{base}/metrics")]).1;
    assert!(
        sample(
            &metrics,
            r#"narad_http_requests_denied_total{reason="forbidden"}"#
        )
        .unwrap_or(0.0)
            >= 4.0,
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            r#"narad_http_requests_denied_total{reason="unauthenticated"}"#
        )
        .unwrap_or(0.0)
            >= 2.0
    );
    assert!(
        daemon.log().contains("http request denied"),
        "no audit line"
    );
}

#[test]
fn without_tls_user_credentials_are_refused_and_auth_reads_closes_reads_to_the_anonymous() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("token");
    let daemon = Daemon::start_with(
        &dir.join("data"),
        &[
            "--auth-token-file",
            &token_file.display().to_string(),
            "--auth-reads",
            "yes",
        ],
    );
    let base = daemon.url();
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let (status, body) = curl(&[
        "-H",
        &bearer,
        "-X",
        "POST",
        "-d",
        r#"{"name":"alice","password":"wonder"}"#,
        &format!("{base}/v1/users"),
    ]);
    assert_eq!(status, 201, "{body}");
    let (status, body) = curl(&["-u", "alice:wonder", &format!("{base}/v1/topics")]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("only over TLS"), "{body}");
    let (status, body) = curl(&[&format!("{base}/v1/topics")]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("--auth-reads"), "{body}");
    let (status, _) = curl(&["-H", &bearer, &format!("{base}/v1/topics")]);
    assert_eq!(status, 200);
    for open in ["/metrics", "/healthz"] {
        let (status, _) = curl(&[&format!("{base}{open}")]);
        assert_eq!(status, 200, "{open} needs no credentials");
    }
}
