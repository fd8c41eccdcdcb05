//! The child-commit call between nodes: `POST /internal/v1/commit` with a [`CommitRequest`]
//! body, answered with a [`CommitResponse`] body, both in the binary wire format; and
//! `POST /internal/v1/commit-in-order` with up to [`MAX_COMMITS_PER_CALL`] commits for one
//! child partition (the buckets of consecutive slabs), applied in order with one append and
//! answered with one answer each ([`CommitReceiver::commit_in_order`]); and
//! `POST /internal/v1/commit-frames`, the same commits carried as the storage frames the sender
//! encoded ([`CommitReceiver::commit_frames`]). A node that does not serve a newer call (an
//! older binary) answers 404, and the sender falls back to the one before it.
//!
//! The server side ([`commit_route`]) runs the [`CommitReceiver`] on the blocking pool (it
//! appends and syncs). The client side ([`CommitClient`]) fails fast: a refused connection or
//! a dead address is an error within [`crate::peer::CONNECT_TIMEOUT`], never a hang, so the sender's bucket
//! is held and retried by its cursor rather than blocking it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::commit_wire::{
    CommitRequest, CommitResponse, FramesReader, MAX_COMMIT_REQUEST_BYTES, MAX_COMMITS_PER_CALL,
    MAX_IN_ORDER_REQUEST_BYTES, PARENT_GENERATION_HEADER, WireError, decode_answers,
    decode_in_order, encode_answers, encode_in_order,
};
use super::receiver::CommitReceiver;

/// The route the receiver is mounted at.
pub(crate) const COMMIT_PATH: &str = "/internal/v1/commit";

/// The route of the in-order call.
pub(crate) const COMMIT_IN_ORDER_PATH: &str = "/internal/v1/commit-in-order";

/// The route of the frames call: up to [`MAX_COMMITS_PER_CALL`] commits for one child
/// partition, each as the frame the sender encoded ([`super::commit_wire::FramesCall`]),
/// applied and answered as the in-order call is. A node without it answers 404, and the sender
/// falls back to the in-order call.
pub(crate) const COMMIT_FRAMES_PATH: &str = "/internal/v1/commit-frames";

/// Content type of every body.
pub(crate) const COMMIT_CONTENT_TYPE: &str = "application/x-narad-commit";

/// Longest wait for a whole commit: 4 MiB over the network plus an append and `fdatasync` on
/// the owner's disk (tens of ms on a healthy one).
pub(crate) const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a commit call got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The owner could not be reached or did not answer in time.
    #[error("commit to {url} got no answer: {}", crate::tls::error_chain(.cause))]
    Unreachable {
        /// The owner's commit URL.
        url: String,
        /// The client's error, its causes said in the message (a certificate not trusted).
        cause: reqwest::Error,
    },
    /// The owner answered something that is not a commit answer.
    #[error("commit to {url} answered {status}: {detail}")]
    BadAnswer {
        /// The owner's commit URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The body's first bytes, or the decode error.
        detail: String,
    },
}

/// The axum handler of [`COMMIT_PATH`]; the state is this node's receiver.
pub(crate) async fn commit_route(
    State(receiver): State<Arc<CommitReceiver>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let parent_generation = match parent_generation(&headers) {
        Ok(generation) => generation,
        Err(answer) => return answer,
    };
    let request = match CommitRequest::decode(&body) {
        Ok(mut request) => {
            request.parent_generation = parent_generation;
            request
        }
        Err(e) => {
            let status = match e {
                WireError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                _ => StatusCode::BAD_REQUEST,
            };
            return (status, e.to_string()).into_response();
        }
    };
    let answer = crate::blocking::run(move || receiver.commit(request))
        .await
        .unwrap_or_else(|e| CommitResponse::Failed {
            reason: format!("commit task failed: {e}"),
        });
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(COMMIT_CONTENT_TYPE),
        )],
        answer.encode(),
    )
        .into_response()
}

/// The axum handler of [`COMMIT_IN_ORDER_PATH`]; the state is this node's receiver.
pub(crate) async fn commit_in_order_route(
    State(receiver): State<Arc<CommitReceiver>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let parent_generation = match parent_generation(&headers) {
        Ok(generation) => generation,
        Err(answer) => return answer,
    };
    let requests = match decode_in_order(&body) {
        Ok(mut requests) => {
            for request in &mut requests {
                request.parent_generation = parent_generation;
            }
            requests
        }
        Err(e) => {
            let status = match e {
                WireError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                _ => StatusCode::BAD_REQUEST,
            };
            return (status, e.to_string()).into_response();
        }
    };
    let count = requests.len();
    let answers = crate::blocking::run(move || receiver.commit_in_order(requests))
        .await
        .unwrap_or_else(|e| {
            vec![
                CommitResponse::Failed {
                    reason: format!("commit task failed: {e}"),
                };
                count
            ]
        });
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(COMMIT_CONTENT_TYPE),
        )],
        encode_answers(&answers),
    )
        .into_response()
}

/// The axum handler of [`COMMIT_FRAMES_PATH`]; the state is this node's receiver. The body is
/// read as it arrives, each frame into a buffer of its own length ([`FramesReader`]), and
/// refused as soon as it breaks a bound.
pub(crate) async fn commit_frames_route(
    State(receiver): State<Arc<CommitReceiver>>,
    body: axum::body::Body,
) -> Response {
    let refuse = |e: WireError| {
        let status = match e {
            WireError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        (status, e.to_string()).into_response()
    };
    let mut reader = FramesReader::default();
    let mut body = body;
    loop {
        let next = std::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await;
        let chunk = match next {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers carry nothing a commit needs.
                Err(_) => continue,
            },
            Some(Err(e)) => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("the frames call's body could not be read: {e}"),
                )
                    .into_response();
            }
        };
        if let Err(e) = reader.feed(&chunk) {
            return refuse(e);
        }
    }
    // Checking a frame reads every byte of it (its CRC, every record): blocking-pool work, as
    // the append after it is.
    let answers =
        crate::blocking::run(move || reader.finish().map(|call| receiver.commit_frames(call)))
            .await;
    let answers = match answers {
        Ok(Ok(answers)) => answers,
        Ok(Err(e)) => return refuse(e),
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("commit task failed: {e}"),
            )
                .into_response();
        }
    };
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(COMMIT_CONTENT_TYPE),
        )],
        encode_answers(&answers),
    )
        .into_response()
}

/// The parent generation a commit call names ([`PARENT_GENERATION_HEADER`]), if any; a 400
/// for one that is not a number.
#[allow(clippy::result_large_err)] // the error is the answer itself, returned at once
fn parent_generation(headers: &axum::http::HeaderMap) -> Result<Option<u64>, Response> {
    let Some(value) = headers.get(PARENT_GENERATION_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            (
                StatusCode::BAD_REQUEST,
                format!("{PARENT_GENERATION_HEADER} must be a generation number"),
            )
                .into_response()
        })
}

/// The body limit of [`COMMIT_IN_ORDER_PATH`], for mounting it.
pub(crate) fn in_order_body_limit() -> axum::extract::DefaultBodyLimit {
    axum::extract::DefaultBodyLimit::max(MAX_IN_ORDER_REQUEST_BYTES)
}

/// Sends child commits to other nodes.
#[derive(Clone)]
pub(crate) struct CommitClient {
    /// The node's peer client, presenting the peer secret.
    http: crate::peer::PeerClient,
}

impl CommitClient {
    /// A client trusting the system's CAs and presenting no secret (tests).
    #[cfg(test)]
    pub(crate) fn new() -> Result<CommitClient, crate::peer::PeerClientError> {
        crate::peer::PeerClient::new(&crate::tls::PeerTls::default()).map(CommitClient::over)
    }

    /// Commits through the node's peer client (its CAs, certificate, id and peer secret),
    /// each call answered within [`COMMIT_TIMEOUT`].
    pub(crate) fn over(http: crate::peer::PeerClient) -> CommitClient {
        CommitClient { http }
    }

    /// Sends `request` to the node advertising `base_url` (e.g. `http://10.0.0.5:7070`).
    pub(crate) async fn commit(
        &self,
        base_url: &str,
        request: &CommitRequest,
    ) -> Result<CommitResponse, CallError> {
        let body = request.encode();
        debug_assert!(body.len() <= MAX_COMMIT_REQUEST_BYTES);
        let answer = self
            .post(base_url, COMMIT_PATH, body, request.parent_generation)
            .await?;
        CommitResponse::decode(&answer.bytes).map_err(|e| answer.bad(e.to_string()))
    }

    /// Sends `requests` (1 to [`MAX_COMMITS_PER_CALL`], for one child partition) in one
    /// in-order call to the node advertising `base_url`: one answer each, in order. A node
    /// without the call answers [`CallError::BadAnswer`] with status 404.
    pub(crate) async fn commit_in_order(
        &self,
        base_url: &str,
        requests: &[CommitRequest],
    ) -> Result<Vec<CommitResponse>, CallError> {
        debug_assert!((1..=MAX_COMMITS_PER_CALL).contains(&requests.len()));
        let parent_generation = requests.first().and_then(|r| r.parent_generation);
        let answer = self
            .post(
                base_url,
                COMMIT_IN_ORDER_PATH,
                encode_in_order(requests),
                parent_generation,
            )
            .await?;
        let answers = decode_answers(&answer.bytes).map_err(|e| answer.bad(e.to_string()))?;
        if answers.len() != requests.len() {
            return Err(answer.bad(format!(
                "{} answers to {} commits",
                answers.len(),
                requests.len()
            )));
        }
        Ok(answers)
    }

    /// Sends `call` (1 to [`MAX_COMMITS_PER_CALL`] frames for one child partition, `body` its
    /// encoding by [`encode_frames`]) to the node advertising `base_url`: one answer per
    /// frame, in order. A node without the frames route answers [`CallError::BadAnswer`] with
    /// status 404.
    ///
    /// [`encode_frames`]: crate::cluster::commit_wire::encode_frames
    pub(crate) async fn commit_frames(
        &self,
        base_url: &str,
        frames: usize,
        body: Vec<u8>,
    ) -> Result<Vec<CommitResponse>, CallError> {
        debug_assert!((1..=MAX_COMMITS_PER_CALL).contains(&frames));
        let answer = self.post(base_url, COMMIT_FRAMES_PATH, body, None).await?;
        let answers = decode_answers(&answer.bytes).map_err(|e| answer.bad(e.to_string()))?;
        if answers.len() != frames {
            return Err(answer.bad(format!("{} answers to {frames} frames", answers.len())));
        }
        Ok(answers)
    }

    /// Posts `body` to `path` on the node advertising `base_url`, presenting the peer secret:
    /// the body of a successful answer, or why there is none.
    async fn post(
        &self,
        base_url: &str,
        path: &str,
        body: Vec<u8>,
        parent_generation: Option<u64>,
    ) -> Result<Answer, CallError> {
        let url = format!("{}{path}", base_url.trim_end_matches('/'));
        let unreachable = |source| CallError::Unreachable {
            url: url.clone(),
            cause: source,
        };
        let mut call = self
            .http
            .call(reqwest::Method::POST, &url, COMMIT_TIMEOUT)
            .header(header::CONTENT_TYPE, COMMIT_CONTENT_TYPE)
            .body(body);
        if let Some(generation) = parent_generation {
            call = call.header(PARENT_GENERATION_HEADER, generation);
        }
        let response = call.send().await.map_err(unreachable)?;
        let success = response.status().is_success();
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(unreachable)?;
        let answer = Answer { url, status, bytes };
        if !success {
            let detail =
                String::from_utf8_lossy(&answer.bytes[..answer.bytes.len().min(200)]).into_owned();
            return Err(answer.bad(detail));
        }
        Ok(answer)
    }
}

/// A node's answer to a call: where it came from, its status and its body.
struct Answer {
    url: String,
    status: u16,
    bytes: Bytes,
}

impl Answer {
    /// This answer as one that is not a commit answer, for `detail`.
    fn bad(&self, detail: String) -> CallError {
        CallError::BadAnswer {
            url: self.url.clone(),
            status: self.status,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use narad_storage::{
        AppendBatch, BatchOrigin, LogConfig, NewRecord, PartitionId, Store, StoreOptions,
    };

    use super::*;
    use crate::cluster::commit_wire::{FramesCall, WireFrame, encode_frames};
    use crate::cluster::receiver::OwnerLookup;
    use crate::metastore::PartitionOwner;

    struct Owner {
        url: String,
        store: Arc<Store>,
        _dir: tempfile::TempDir,
        _server: tokio::task::JoinHandle<()>,
    }

    /// A real HTTP server on loopback running the receiver of node n1 over a real store.
    async fn owner() -> Owner {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
        store
            .create_partition(
                &PartitionId::new("audit".to_owned(), 0),
                LogConfig::default(),
            )
            .unwrap();
        let owners: Arc<OwnerLookup> =
            Arc::new(|_: &PartitionId| Some(PartitionOwner::first("n1")));
        let receiver = Arc::new(CommitReceiver::new(
            "n1".to_owned(),
            Arc::clone(&store),
            owners,
        ));
        let app = axum::Router::new()
            .route(COMMIT_PATH, axum::routing::post(commit_route))
            .route(COMMIT_FRAMES_PATH, axum::routing::post(commit_frames_route))
            .with_state(receiver);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Owner {
            url,
            store,
            _dir: dir,
            _server: server,
        }
    }

    fn request(offsets: &[u64]) -> CommitRequest {
        let batch = AppendBatch {
            records: offsets
                .iter()
                .map(|o| NewRecord {
                    value: Some(format!("r{o}").into_bytes().into()),
                    ..NewRecord::default()
                })
                .collect(),
            origin: Some(BatchOrigin {
                epoch: [2; 8],
                parent_partition: 1,
                slab_start: offsets[0],
                parent_offsets: offsets.to_vec(),
            }),
        };
        CommitRequest::from_batch("audit", 0, 1, batch).unwrap()
    }

    #[tokio::test]
    async fn a_commit_crosses_http_and_its_retry_is_absorbed_by_the_owner() {
        let owner = owner().await;
        let client = CommitClient::new().unwrap();
        let first = client.commit(&owner.url, &request(&[5, 6])).await.unwrap();
        assert!(matches!(
            first,
            CommitResponse::Committed {
                base_offset: 0,
                appended: 2,
                deduplicated: 0,
                ..
            }
        ));
        // The sender lost the answer and retries: nothing is stored twice.
        let retry = client.commit(&owner.url, &request(&[5, 6])).await.unwrap();
        assert!(matches!(
            retry,
            CommitResponse::Committed {
                appended: 0,
                deduplicated: 2,
                ..
            }
        ));
        let id = PartitionId::new("audit".to_owned(), 0);
        assert_eq!(owner.store.high_watermark(&id).unwrap(), 2);
    }

    /// A frames call of one frame per entry of `offsets`, each changed by `change` after it
    /// was encoded (the CRC sent is the one computed before).
    fn frames_body(offsets: &[&[u64]], change: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
        let frames: Vec<(Vec<u8>, u32)> = offsets
            .iter()
            .map(|o| {
                let batch = request(o).into_batch();
                let encoded =
                    narad_storage::EncodedBatch::encode(&batch.records, batch.origin.as_ref())
                        .unwrap();
                let mut frame = encoded.frame().to_vec();
                change(&mut frame);
                (frame, encoded.body_crc())
            })
            .collect();
        encode_frames(&FramesCall {
            topic: "audit",
            partition: 0,
            generation: 1,
            parent_generation: None,
            frames: frames
                .iter()
                .map(|(frame, body_crc)| WireFrame {
                    body_crc: *body_crc,
                    frame,
                })
                .collect(),
        })
    }

    async fn post_frames(owner: &Owner, body: Vec<u8>) -> (u16, Bytes) {
        let response = reqwest::Client::new()
            .post(format!("{}{COMMIT_FRAMES_PATH}", owner.url))
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.bytes().await.unwrap())
    }

    #[tokio::test]
    async fn frames_cross_http_as_encoded_and_their_retry_is_absorbed() {
        let owner = owner().await;
        let client = CommitClient::new().unwrap();
        let body = frames_body(&[&[5, 6], &[7]], |_| ());
        let answers = client
            .commit_frames(&owner.url, 2, body.clone())
            .await
            .unwrap();
        assert!(matches!(
            answers[..],
            [
                CommitResponse::Committed {
                    base_offset: 0,
                    appended: 2,
                    ..
                },
                CommitResponse::Committed {
                    base_offset: 2,
                    appended: 1,
                    ..
                }
            ]
        ));
        let again = client.commit_frames(&owner.url, 2, body).await.unwrap();
        assert!(matches!(
            again[..],
            [
                CommitResponse::Committed {
                    appended: 0,
                    deduplicated: 2,
                    ..
                },
                CommitResponse::Committed {
                    appended: 0,
                    deduplicated: 1,
                    ..
                }
            ]
        ));
        let id = PartitionId::new("audit".to_owned(), 0);
        assert_eq!(owner.store.high_watermark(&id).unwrap(), 3);
    }

    #[tokio::test]
    async fn frames_changed_on_the_way_malformed_or_too_many_are_refused_and_store_nothing() {
        let owner = owner().await;
        let flipped = frames_body(&[&[5, 6]], |frame| {
            let last = frame.len() - 1;
            frame[last] ^= 1;
        });
        let (status, why) = post_frames(&owner, flipped).await;
        assert_eq!(status, 400);
        assert!(String::from_utf8_lossy(&why).contains("CRC"), "{why:?}");
        let cut = frames_body(&[&[5, 6]], |frame| frame.truncate(frame.len() - 3));
        assert_eq!(post_frames(&owner, cut).await.0, 400);
        let three = frames_body(&[&[5], &[6], &[7]], |_| ());
        assert_eq!(post_frames(&owner, three).await.0, 400);
        assert_eq!(post_frames(&owner, vec![0xff; 64]).await.0, 400);
        let id = PartitionId::new("audit".to_owned(), 0);
        assert_eq!(owner.store.high_watermark(&id).unwrap(), 0);
    }

    #[tokio::test]
    async fn garbage_is_refused_with_400_and_stores_nothing() {
        let owner = owner().await;
        let response = reqwest::Client::new()
            .post(format!("{}{COMMIT_PATH}", owner.url))
            .body(vec![0xff; 64])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400);
        let id = PartitionId::new("audit".to_owned(), 0);
        assert_eq!(owner.store.high_watermark(&id).unwrap(), 0);
    }

    #[tokio::test]
    async fn a_dead_owner_is_an_error_within_the_connect_timeout_not_a_hang() {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = CommitClient::new().unwrap();
        let started = Instant::now();
        let result = client
            .commit(&format!("http://127.0.0.1:{port}"), &request(&[1]))
            .await;
        assert!(
            matches!(result, Err(CallError::Unreachable { .. })),
            "{result:?}"
        );
        assert!(started.elapsed() < COMMIT_TIMEOUT);
    }
}
