use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use bytes::Bytes;
use narad_storage::{BatchOrigin, StoredRecord};

use narad_storage::EncodedBatch;

use super::*;

/// A target that answers every produce with `status` (and, for a success, `placed`
/// offsets), and remembers the last body it got.
struct Target {
    url: String,
    status: Arc<AtomicU16>,
    placed: Arc<AtomicU16>,
    last_body: Arc<Mutex<String>>,
    _server: tokio::task::JoinHandle<()>,
}

async fn target() -> Target {
    let status = Arc::new(AtomicU16::new(200));
    let placed = Arc::new(AtomicU16::new(u16::MAX));
    let last_body = Arc::new(Mutex::new(String::new()));
    let (s, p, b) = (
        Arc::clone(&status),
        Arc::clone(&placed),
        Arc::clone(&last_body),
    );
    let app = axum::Router::new().route(
        "/v1/topics/{topic}/records",
        axum::routing::post(move |body: String| {
            let (s, p, b) = (Arc::clone(&s), Arc::clone(&p), Arc::clone(&b));
            async move {
                let sent = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["records"].as_array().map(Vec::len))
                    .unwrap_or(0);
                *b.lock().unwrap() = body;
                let code = s.load(Ordering::SeqCst);
                let n = match p.load(Ordering::SeqCst) {
                    u16::MAX => sent,
                    n => usize::from(n),
                };
                let offsets: Vec<serde_json::Value> = (0..n)
                    .map(|i| serde_json::json!({"partition": 0, "offset": i}))
                    .collect();
                (
                    axum::http::StatusCode::from_u16(code).unwrap(),
                    // Heeded only on what is retried (a 429 or a 5xx).
                    [(axum::http::header::RETRY_AFTER, "7")],
                    axum::Json(serde_json::json!({"offsets": offsets, "error": "refused here"})),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Target {
        url,
        status,
        placed,
        last_body,
        _server: server,
    }
}

/// A bucket of three keyed records with `values` (`None`: a null value).
fn bucket_with(values: [Option<&str>; 3]) -> EncodedBatch {
    let records: Vec<StoredRecord> = (0..3u64)
        .zip(values)
        .map(|(o, value)| StoredRecord {
            offset: o,
            committed_at_ms: 0,
            key: Some(Bytes::from(format!("k{o}"))),
            headers: Vec::new(),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            origin: None,
        })
        .collect();
    let origin = BatchOrigin {
        epoch: [0xab; 8],
        parent_partition: 1,
        slab_start: 40,
        parent_offsets: vec![40, 41, 42],
    };
    EncodedBatch::encode(&records, Some(&origin)).unwrap()
}

fn bucket() -> EncodedBatch {
    bucket_with([Some("v0"), Some("v1"), Some("v2")])
}

/// A sender to `target`'s topic `copy` (3 partitions), telling `hook` what it sent.
fn sender(target: &Target, hook: Box<SentHook>) -> Arc<RemoteSender> {
    let to = RemoteTarget {
        url: target.url.clone(),
        topic: "copy".into(),
        partitions: 3,
        token_file: None,
        ca_file: None,
        source: "node:n1".into(),
    };
    Arc::new(RemoteSender::new(to, "node:n1".into(), hook))
}

/// Commits `batch` as lane 2 through `sender`, as a cursor's commit lane does.
async fn commit_batch(
    sender: &Arc<RemoteSender>,
    batch: EncodedBatch,
) -> Result<(), ChildCommitError> {
    Arc::clone(sender)
        .commit_in_order(
            PartitionId::new("to-b", 2),
            vec![ChildBatch::from_frame(batch)],
        )
        .await
        .result
        .map_err(|failure| failure.error)
}

/// Commits [`bucket`] as lane 2 through `sender`.
async fn commit_with(sender: &Arc<RemoteSender>) -> Result<(), ChildCommitError> {
    commit_batch(sender, bucket()).await
}

async fn send(target: &Target) -> Result<(), ChildCommitError> {
    commit_with(&sender(target, Box::new(|_| {}))).await
}

/// [`bucket`] with the value of its middle record null.
fn bucket_with_a_null() -> EncodedBatch {
    bucket_with([Some("v0"), None, Some("v2")])
}

/// A target answering as a narad from before null values: 400 with its refusal for a
/// request holding `"value": null`, else every record placed. Keeps every body.
async fn old_target() -> (Target, Arc<Mutex<Vec<serde_json::Value>>>) {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&bodies);
    let app = axum::Router::new().route(
        "/v1/topics/{topic}/records",
        axum::routing::post(move |body: String| {
            let kept = Arc::clone(&kept);
            async move {
                let body: serde_json::Value = serde_json::from_str(&body).unwrap();
                let records = body["records"].as_array().cloned().unwrap_or_default();
                kept.lock().unwrap().push(body);
                let null = records
                    .iter()
                    .any(|r| r.get("value").is_some_and(serde_json::Value::is_null));
                if null {
                    return (
                        axum::http::StatusCode::BAD_REQUEST,
                        axum::Json(serde_json::json!({
                            "error": format!("records[1]: {}", crate::peer::produce::NULL_VALUE_REFUSED_BEFORE)
                        })),
                    );
                }
                let offsets: Vec<serde_json::Value> = (0..records.len())
                    .map(|i| serde_json::json!({"partition": 2, "offset": i}))
                    .collect();
                (
                    axum::http::StatusCode::OK,
                    axum::Json(serde_json::json!({ "offsets": offsets })),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let target = Target {
        url,
        status: Arc::new(AtomicU16::new(200)),
        placed: Arc::new(AtomicU16::new(u16::MAX)),
        last_body: Arc::new(Mutex::new(String::new())),
        _server: server,
    };
    (target, bodies)
}

async fn commit_null_bucket(sender: &Arc<RemoteSender>) -> Result<(), ChildCommitError> {
    commit_batch(sender, bucket_with_a_null()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_value_goes_as_null_and_as_empty_to_a_target_from_before_null_values() {
    let target = target().await;
    commit_null_bucket(&sender(&target, Box::new(|_| {})))
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_str(&target.last_body.lock().unwrap()).unwrap();
    let middle = &body["records"][1];
    assert!(
        middle["value"].is_null() && middle.get("value_b64").is_none(),
        "{body}"
    );
    assert_eq!(body["records"][0]["value_b64"], "djA=", "{body}");

    let (old, bodies) = old_target().await;
    commit_null_bucket(&sender(&old, Box::new(|_| {})))
        .await
        .unwrap();
    let bodies = bodies.lock().unwrap();
    assert_eq!(bodies.len(), 2, "refused once, then taken: {bodies:?}");
    // One downgrade for every produce to another narad (peer::produce): the value goes as
    // empty text.
    let middle = &bodies[1]["records"][1];
    assert!(middle.get("value_b64").is_none(), "{middle}");
    assert_eq!(middle["value"], "", "sent empty, as that target stores it");
    assert_eq!(bodies[1]["records"][2]["value_b64"], "djI=");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_is_acknowledged_only_for_every_record_and_refusals_are_told_apart() {
    let target = target().await;
    send(&target).await.unwrap();
    // Sent to the lane's partition, each with its origin.
    let body: serde_json::Value = serde_json::from_str(&target.last_body.lock().unwrap()).unwrap();
    let first = &body["records"][0];
    assert_eq!(first["partition"], 2, "{body}");
    let origin = first["headers"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["name"] == ORIGIN_HEADER))
        .and_then(|h| h["value"].as_str())
        .unwrap_or("");
    assert_eq!(origin, "node:n1/abababababababab/1/40");

    // An answer for fewer records than sent is not an acknowledgement.
    target.placed.store(2, Ordering::SeqCst);
    let err = send(&target).await.unwrap_err();
    assert!(
        matches!(
            err,
            ChildCommitError::Remote {
                permanent: false,
                ..
            }
        ),
        "{err}"
    );
    target.placed.store(u16::MAX, Ordering::SeqCst);

    for (status, permanent) in [
        (503, false),
        (429, false),
        (500, false),
        (404, true),
        (413, true),
        (400, true),
        (401, true),
    ] {
        target.status.store(status, Ordering::SeqCst);
        let err = send(&target).await.unwrap_err();
        match &err {
            ChildCommitError::Remote {
                permanent: p,
                reason,
                retry_after,
                ..
            } => {
                assert_eq!(*p, permanent, "{status}: {err}");
                assert!(reason.contains(&status.to_string()), "{err}");
                let asked = (!permanent).then_some(Duration::from_secs(7));
                assert_eq!(*retry_after, asked, "{status}: {err}");
            }
            other => panic!("{status}: {other}"),
        }
        let label = if permanent { "failed:" } else { "retrying:" };
        assert!(err.to_string().starts_with(label), "{err}");
    }
    // The hook hears the bytes of an acknowledged request and of nothing else.
    let heard = Arc::new(Mutex::new(Vec::new()));
    let hook = Arc::clone(&heard);
    let sender = sender(
        &target,
        Box::new(move |bytes| hook.lock().unwrap().push(bytes)),
    );
    for status in [200, 503] {
        target.status.store(status, Ordering::SeqCst);
        let _ = commit_with(&sender).await;
    }
    // Three records of a 2-byte key and a 2-byte value each.
    assert_eq!(*heard.lock().unwrap(), vec![Some(12), None]);

    // No answer at all is retried.
    let gone = Target {
        url: "http://127.0.0.1:9".into(),
        ..target
    };
    let err = send(&gone).await.unwrap_err();
    assert!(
        matches!(
            err,
            ChildCommitError::Remote {
                permanent: false,
                ..
            }
        ),
        "{err}"
    );
}
