//! `--auth-token-file`: every mutating call needs the bearer token (401 with a JSON error
//! otherwise); reads, `/metrics` and `/healthz` stay open; the CLI sends `--token`.

use std::process::Command;

use narad_host::auth::AuthToken;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::common::Daemon;

const TOKEN: &str = "correct-horse-battery-staple";

async fn guarded() -> Daemon {
    Daemon::start_with(|c| c.auth_token = AuthToken::new(TOKEN)).await
}

async fn call(
    d: &Daemon,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", d.url));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    (status, headers, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_calls_without_the_token_get_401_and_reads_stay_open() {
    use reqwest::Method;
    let d = guarded().await;
    let topic = json!({"name": "orders", "partitions": 1});
    let mutating = [
        (Method::POST, "/v1/topics", Some(topic.clone())),
        (
            Method::POST,
            "/v1/topics/orders/records",
            Some(json!({"records": [{"value": "x"}]})),
        ),
        (
            Method::POST,
            "/v1/topics/orders/partitions",
            Some(json!({"count": 2})),
        ),
        (
            Method::PUT,
            "/v1/topics/orders/children/c",
            Some(json!({"partitions": 1})),
        ),
        (
            Method::PATCH,
            "/v1/topics/orders/children/c",
            Some(json!({"router": ["round-robin"]})),
        ),
        (Method::DELETE, "/v1/topics/orders/children/c", None),
        (Method::DELETE, "/v1/topics/orders", None),
        (Method::POST, "/v1/plugins?name=x", None),
        (Method::DELETE, "/v1/plugins/x", None),
    ];
    for (method, path, body) in &mutating {
        for token in [None, Some("wrong-token")] {
            let (status, headers, text) = call(&d, method.clone(), path, token, body.clone()).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}: {text}"
            );
            let error: Value = serde_json::from_str(&text).unwrap();
            assert!(error["error"].as_str().unwrap().contains("token"), "{text}");
            assert_eq!(headers["www-authenticate"], "Bearer");
        }
    }
    // Nothing was created by the refused calls.
    let (status, _, text) = call(&d, Method::GET, "/v1/topics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["topics"],
        json!([])
    );

    let (status, _, text) = call(&d, Method::POST, "/v1/topics", Some(TOKEN), Some(topic)).await;
    assert_eq!(status, StatusCode::CREATED, "{text}");
    let (status, _, text) = call(
        &d,
        Method::POST,
        "/v1/topics/orders/records",
        Some(TOKEN),
        Some(json!({"records": [{"value": "x"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    for path in [
        "/v1/topics",
        "/v1/topics/orders",
        "/v1/topics/orders/partitions/0/records",
        "/v1/topics/orders/children",
        "/v1/plugins",
        "/metrics",
        "/healthz",
    ] {
        let (status, _, text) = call(&d, Method::GET, path, None, None).await;
        assert_eq!(status, StatusCode::OK, "GET {path} without a token: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sends_its_token_and_without_it_prints_the_401() {
    let d = guarded().await;
    let url = d.url.clone();
    let (without, with_env, with_flag) = tokio::task::spawn_blocking(move || {
        let narad = |args: &[&str], token: Option<&str>| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
            cmd.args(args)
                .env("NARAD_URL", &url)
                .env_remove("NARAD_TOKEN");
            if let Some(t) = token {
                cmd.env("NARAD_TOKEN", t);
            }
            cmd.output().unwrap()
        };
        (
            narad(&["topic", "create", "a"], None),
            narad(&["topic", "create", "b"], Some(TOKEN)),
            narad(&["topic", "create", "c", "--token", TOKEN], None),
        )
    })
    .await
    .unwrap();
    assert!(!without.status.success());
    let err = String::from_utf8_lossy(&without.stderr);
    assert!(err.contains("HTTP 401") && err.contains("Bearer"), "{err}");
    assert!(with_env.status.success(), "{with_env:?}");
    assert!(with_flag.status.success(), "{with_flag:?}");
    let (_, body) = d.get("/v1/topics").await;
    let names: Vec<&str> = body["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_commands_send_the_token_too() {
    let d = guarded().await;
    let url = d.url.clone();
    let module = std::env::temp_dir().join(format!("narad-auth-{}.wasm", std::process::id()));
    std::fs::write(&module, narad_builtin_plugins::KEY_HASH).unwrap();
    let path = module.to_str().unwrap().to_owned();
    let (without, with) = tokio::task::spawn_blocking(move || {
        let narad = |token: Option<&str>| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
            cmd.args(["plugin", "deploy", &path, "--name", "my-hash"])
                .env("NARAD_URL", &url)
                .env_remove("NARAD_TOKEN");
            if let Some(t) = token {
                cmd.env("NARAD_TOKEN", t);
            }
            cmd.output().unwrap()
        };
        (narad(None), narad(Some(TOKEN)))
    })
    .await
    .unwrap();
    let _ = std::fs::remove_file(&module);
    assert!(!without.status.success());
    assert!(
        String::from_utf8_lossy(&without.stderr).contains("401"),
        "{without:?}"
    );
    assert!(with.status.success(), "{with:?}");
    let (_, body) = d.get("/v1/plugins").await;
    assert!(body.to_string().contains("my-hash"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_file_no_token_is_needed() {
    let d = Daemon::start().await;
    d.create_topic("open", 1).await;
}
