//! Cluster mode: a produce or fetch that reaches a node which does not own the partition is
//! forwarded one hop to the owner, so a client that knows any one node's address works.
//!
//! - **Produce.** The receiving node places every record as usual, then groups the records by
//!   the owner of their partition ([`plan`]). Before anything is written it checks that every
//!   remote owner is alive (in the peer directory); if one is not, the answer is `503` with
//!   `Retry-After` naming the owner and partition, and nothing of the request is committed.
//!   Each remote owner then gets one `POST /v1/topics/{t}/records` holding its records with
//!   their explicit `partition` (so it does not place them again) and their exact bytes
//!   ([`encode_records`]); the groups go out concurrently. Only when every remote group has
//!   committed does this node commit its own records: a remote owner that turns out to be
//!   unreachable (a killed node keeps its lease for up to a TTL) then leaves nothing
//!   committed. The answers are merged into one answer in request order ([`merge`]). Across
//!   partitions a produce is still not atomic: when a later part fails, the error lists the
//!   partitions whose records were committed (`committed_partitions`) and those whose outcome
//!   is unknown (`uncertain_partitions`).
//! - **Fetch.** The `GET` (path and query string, so `wait_ms` included) goes to the owner and
//!   its answer (status, body, `Content-Type`, `Retry-After`) comes back as it is, buffered up
//!   to a cap derived from the fetch limits.
//! - **One hop.** A forwarded request carries [`FORWARDED_HEADER`] (the sender's node id); a
//!   node that gets one for a partition it does not own answers `421` and never forwards it
//!   again, so two nodes whose views of ownership disagree cannot bounce a request forever.
//! - The client's `Authorization` header goes along unchanged: the owner checks the token.
//!
//! Every forwarded call is counted in `narad_forwarded_requests_total{request, outcome}`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use narad_storage::PartitionId;

use super::AppState;
use super::error::ApiError;
use super::metrics::{FORWARD_OUTCOMES, FORWARD_REQUESTS};
use super::records::not_owned;
use super::types::{
    HeaderJson, HeadersJson, OffsetJson, ProduceRecordJson, ProduceRequest, ProduceResponse, Text,
};
use crate::config::Limits;
use crate::peer::produce::{NaradCallError, ProduceSender, read_capped, sent_error};
use crate::produce::{ProduceError, ProduceRecord};

/// The header that marks a forwarded request; its value is the forwarding node's id. A node
/// never forwards a request that carries it.
pub(crate) const FORWARDED_HEADER: HeaderName = HeaderName::from_static("x-narad-forwarded");

/// Time a forwarded request may take beyond the longest long-poll (`max-wait-ms`): the owner's
/// append and `fdatasync`, or the transfer of a full fetch answer.
pub(crate) const ANSWER_SLACK: Duration = Duration::from_secs(10);

/// `Retry-After` (seconds) when the owner of a partition is not reachable: an owner that
/// restarts is back within seconds, and a client retrying sooner only gets the same answer.
pub(crate) const OWNER_DOWN_RETRY_AFTER_SECS: u64 = 1;

/// Why a [`Forwarder`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwarderError {
    /// The node id cannot be an HTTP header value.
    #[error(
        "node id {node:?} cannot be sent in the x-narad-forwarded header: use visible ASCII only"
    )]
    NodeId {
        /// The id given.
        node: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client that forwards requests to owners: {0}")]
    Client(#[from] crate::peer::PeerClientError),
}

/// Why a forwarded call has no usable answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HopError {
    /// The call got no answer to read: the owner was not reached (nothing was sent), gave
    /// no whole answer (what it did is unknown), answered more than the cap, or the request
    /// could not be encoded ([`crate::peer::CONNECT_TIMEOUT`] bounds the connect).
    #[error(transparent)]
    Call(#[from] NaradCallError),
    /// The owner lost its lease while the request was in flight: it acknowledges nothing
    /// more, but may have written the records before it stopped.
    #[error("{url} lost its lease (node {node} is no longer alive) before it answered")]
    OwnerLost {
        /// The URL called.
        url: String,
        /// The owner's id.
        node: String,
    },
    /// The owner answered with an error status (its own decision, passed on).
    #[error("{url} answered {status}: {message}")]
    Refused {
        /// The URL called.
        url: String,
        /// The owner's status.
        status: StatusCode,
        /// The owner's `error` message (or the start of its body).
        message: String,
        /// The owner's `Retry-After`, passed on to the client.
        retry_after: Option<HeaderValue>,
    },
    /// The owner answered success with a body that is not the expected answer.
    #[error("the answer of {url} is not a produce answer: {detail}")]
    BadAnswer {
        /// The URL called.
        url: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The task that made the call panicked or was cancelled.
    #[error("the forwarding task failed: {0}")]
    Task(String),
}

impl HopError {
    /// The `outcome` label of `narad_forwarded_requests_total`: `owner_down` when nothing
    /// reached the owner, `ok` when the owner answered (whatever its status), else `error`.
    pub fn outcome(&self) -> &'static str {
        match self {
            HopError::Call(NaradCallError::NotReached { .. }) => OUTCOME_OWNER_DOWN,
            HopError::Refused { .. } => OUTCOME_OK,
            _ => OUTCOME_ERROR,
        }
    }

    /// Whether the owner may have acted on the request (so its records may be committed).
    fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            HopError::Call(NaradCallError::NoAnswer { .. })
                | HopError::OwnerLost { .. }
                | HopError::Call(NaradCallError::AnswerTooLarge { .. })
                | HopError::BadAnswer { .. }
                | HopError::Task(_)
        )
    }
}

// The label values, from the list the metrics pre-create.
const OUTCOME_OK: &str = FORWARD_OUTCOMES[0];
const OUTCOME_OWNER_DOWN: &str = FORWARD_OUTCOMES[1];
const OUTCOME_ERROR: &str = FORWARD_OUTCOMES[2];
const REQUEST_PRODUCE: &str = FORWARD_REQUESTS[0];
const REQUEST_FETCH: &str = FORWARD_REQUESTS[1];

/// An owner's answer to a forwarded fetch, passed back to the client as it is.
#[derive(Debug, Clone)]
pub struct OwnerAnswer {
    /// The owner's status.
    pub status: StatusCode,
    /// The owner's `Content-Type`.
    pub content_type: Option<HeaderValue>,
    /// The owner's `Retry-After`.
    pub(crate) retry_after: Option<HeaderValue>,
    /// The owner's body (at most the fetch-answer cap).
    pub body: Bytes,
}

impl IntoResponse for OwnerAnswer {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body).into_response();
        let headers = response.headers_mut();
        if let Some(v) = self.content_type {
            headers.insert(CONTENT_TYPE, v);
        }
        if let Some(v) = self.retry_after {
            headers.insert(RETRY_AFTER, v);
        }
        response
    }
}

/// Sends forwarded requests to partition owners. One per process (its HTTP client keeps a
/// connection pool per owner); cheap to share behind an `Arc`.
pub struct Forwarder {
    /// The peers' client, without the peer secret: a forwarded call carries the client's own
    /// `Authorization`, so the owner decides as this node would.
    http: crate::peer::PeerClient,
    /// Longest wait for a forwarded call: `max-wait-ms` + [`ANSWER_SLACK`], so a long-poll
    /// goes through the hop.
    timeout: Duration,
    /// This node's id, as sent in [`FORWARDED_HEADER`].
    marker: HeaderValue,
    max_fetch_answer_bytes: usize,
    /// This node's metadata revision now, sent along so the owner first catches up with what
    /// this node knows (a topic it just created); see `internal::REVISION_HEADER`.
    revision: Option<std::sync::Arc<dyn Fn() -> i64 + Send + Sync>>,
    /// Sends forwarded produces (with the downgrade for an owner from before null values).
    produce: ProduceSender,
    /// Whether a node is alive (holds its lease): a produce to an owner that loses it is
    /// answered then, not when the request times out.
    alive: Option<Liveness>,
}

/// Whether node `id` is alive (holds its lease).
pub(crate) type Liveness = std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How often a forwarded produce looks whether its owner is still alive.
const OWNER_CHECK_EVERY: Duration = Duration::from_millis(100);

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("node", &self.marker)
            .field("max_fetch_answer_bytes", &self.max_fetch_answer_bytes)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// A forwarder for node `node_id` under `limits` (which every node of the cluster is
    /// expected to share): connections time out after [`crate::peer::CONNECT_TIMEOUT`], whole requests
    /// after `limits.max_wait` + [`ANSWER_SLACK`] (so a long-poll goes through the hop), and a
    /// fetch answer is buffered up to [`fetch_answer_cap`]`(limits)` bytes.
    pub fn new(node_id: &str, limits: &Limits) -> Result<Forwarder, ForwarderError> {
        let client = crate::peer::PeerClient::new(&crate::tls::PeerTls::default())?;
        Forwarder::over(node_id, limits, client)
    }

    /// [`Forwarder::new`], calling owners through the node's peer `client` (the cluster's
    /// peer CAs beside the system's, this node's certificate); the peer secret, if the client
    /// has one, is never sent on a forwarded call.
    pub fn over(
        node_id: &str,
        limits: &Limits,
        client: crate::peer::PeerClient,
    ) -> Result<Forwarder, ForwarderError> {
        let marker = HeaderValue::from_str(node_id).map_err(|_| ForwarderError::NodeId {
            node: node_id.to_owned(),
        })?;
        Ok(Forwarder {
            http: client.without_secret(),
            timeout: limits.max_wait.saturating_add(ANSWER_SLACK),
            marker,
            max_fetch_answer_bytes: fetch_answer_cap(limits),
            revision: None,
            produce: ProduceSender::new("partition owner"),
            alive: None,
        })
    }

    /// The same forwarder, giving up on a produce as soon as `alive(owner)` is false: an
    /// owner whose lease is gone acknowledges nothing more (it is fenced), so waiting for its
    /// answer until the request times out (40 s by default) only holds the client.
    pub(crate) fn with_liveness(mut self, alive: Liveness) -> Forwarder {
        self.alive = Some(alive);
        self
    }

    /// Runs `call` to `owner` (at `url`) until it ends or the owner is no longer alive,
    /// whichever comes first.
    async fn while_alive<T>(
        &self,
        owner: &str,
        url: &str,
        call: impl std::future::Future<Output = Result<T, HopError>>,
    ) -> Result<T, HopError> {
        let Some(alive) = self.alive.clone() else {
            return call.await;
        };
        let lost = async {
            let mut every = tokio::time::interval(OWNER_CHECK_EVERY);
            loop {
                every.tick().await;
                if !alive(owner) {
                    return;
                }
            }
        };
        tokio::select! {
            answer = call => answer,
            () = lost => Err(HopError::OwnerLost {
                url: url.to_owned(),
                node: owner.to_owned(),
            }),
        }
    }

    /// The same forwarder, sending `revision()` with every call.
    pub(crate) fn with_revision(
        mut self,
        revision: std::sync::Arc<dyn Fn() -> i64 + Send + Sync>,
    ) -> Forwarder {
        self.revision = Some(revision);
        self
    }

    /// The revision header's value, when this forwarder sends one.
    fn revision_value(&self) -> Option<HeaderValue> {
        self.revision.as_ref().map(|r| HeaderValue::from(r()))
    }

    /// Most bytes of a fetch answer this forwarder buffers.
    pub fn max_fetch_answer_bytes(&self) -> usize {
        self.max_fetch_answer_bytes
    }

    /// Sends `request` (records with explicit partitions) to the owner at `base_url` as
    /// `POST {base_url}/v1/topics/{topic}/records`, marked as forwarded, with
    /// `authorization` if the client sent one. Returns the owner's answer when it is a
    /// success; an error status is [`HopError::Refused`]. An owner from before null values
    /// refuses `"value": null`; the request then goes once more with those values empty, as
    /// that owner stores them (in a cluster being upgraded), and the forwarder logs it once.
    pub async fn produce(
        &self,
        base_url: &str,
        topic: &str,
        request: &ProduceRequest,
        authorization: Option<&HeaderValue>,
    ) -> Result<ProduceResponse, HopError> {
        let url = format!(
            "{}/v1/topics/{topic}/records",
            base_url.trim_end_matches('/')
        );
        let answer = self
            .produce
            .send(&url, request, || {
                self.call(reqwest::Method::POST, &url, authorization)
            })
            .await?;
        if !answer.status.is_success() {
            return Err(HopError::Refused {
                message: answer.error_message(),
                url,
                status: answer.status,
                retry_after: answer.retry_after,
            });
        }
        serde_json::from_slice(&answer.body).map_err(|e| HopError::BadAnswer {
            url,
            detail: e.to_string(),
        })
    }

    /// A forwarded `method` call to `url`: marked as forwarded, with this node's revision and
    /// the client's `authorization` if it sent one.
    fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        authorization: Option<&HeaderValue>,
    ) -> reqwest::RequestBuilder {
        let mut call = self
            .http
            .call(method, url, self.timeout)
            .header(FORWARDED_HEADER, self.marker.clone());
        if let Some(revision) = self.revision_value() {
            call = call.header(super::internal::REVISION_HEADER, revision);
        }
        if let Some(auth) = authorization {
            call = call.header(AUTHORIZATION, auth.clone());
        }
        call
    }

    /// Sends `GET {base_url}{path_and_query}` to the owner, marked as forwarded, with
    /// `authorization` if the client sent one, and returns its answer whatever its status.
    pub async fn fetch(
        &self,
        base_url: &str,
        path_and_query: &str,
        authorization: Option<&HeaderValue>,
    ) -> Result<OwnerAnswer, HopError> {
        let url = format!("{}{path_and_query}", base_url.trim_end_matches('/'));
        let response = self
            .call(reqwest::Method::GET, &url, authorization)
            .send()
            .await
            .map_err(|e| sent_error(&url, e))?;
        let status = response.status();
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        let retry_after = response.headers().get(RETRY_AFTER).cloned();
        let body = read_capped(&url, response, self.max_fetch_answer_bytes).await?;
        Ok(OwnerAnswer {
            status,
            content_type,
            retry_after,
            body,
        })
    }
}

/// Most bytes of a fetch answer a forwarder buffers under `limits`. The owner stops a fetch
/// at `max-fetch-bytes` of record bytes (one record always, up to `max-record-bytes`); JSON
/// shows a byte as at most 6 (`\u0001`), and a record's fixed fields (offset, time, origin)
/// take under 256 bytes. Above this, the answer cannot come from a healthy owner with the same
/// limits, and the forwarder answers 502 rather than hold more.
pub(crate) fn fetch_answer_cap(limits: &Limits) -> usize {
    let record_bytes = limits
        .max_fetch_bytes
        .saturating_add(limits.max_record_bytes)
        .saturating_mul(6);
    let fixed = u64::from(limits.max_fetch_records).saturating_mul(256);
    let total = record_bytes.saturating_add(fixed).saturating_add(1 << 20);
    usize::try_from(total).unwrap_or(usize::MAX)
}

/// Where the records of one partition go, as [`plan`] is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// This node owns the partition.
    Local,
    /// Node `node`, alive at `url`, owns it and the request may be forwarded there.
    Remote {
        /// The owner's id.
        node: String,
        /// Its advertised URL.
        url: String,
    },
    /// No node owns it, or another node does and this request may not be forwarded (a
    /// single node, or a request that was already forwarded once): `421`.
    NotOwned,
    /// Node `node` owns it but is not alive: `503`.
    OwnerDown {
        /// The owner's id.
        node: String,
    },
}

/// A produce request's records split by owner. Indices are positions in the request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The records this node commits, in request order.
    pub local: Vec<usize>,
    /// One group per remote owner, by node id.
    pub remote: Vec<RemoteGroup>,
}

/// The records of a produce request one remote owner commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemoteGroup {
    /// The owner's id.
    pub node: String,
    /// Its advertised URL.
    pub url: String,
    /// Positions in the request of its records, in request order.
    pub indices: Vec<usize>,
    /// The partitions those records go to, ascending.
    pub partitions: Vec<u32>,
}

/// Why [`plan`] refused a request: the first unroutable partition, by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlanRefusal {
    /// [`Route::NotOwned`].
    NotOwned {
        /// The partition.
        partition: u32,
    },
    /// [`Route::OwnerDown`].
    OwnerDown {
        /// The partition.
        partition: u32,
        /// Its owner.
        node: String,
    },
}

/// Splits records placed on `placement` (one partition per record, in request order) by the
/// route of each partition (`route` is asked once per distinct partition). Refuses the whole
/// request when any partition cannot be served, so nothing is committed.
pub(crate) fn plan(
    placement: &[u32],
    mut route: impl FnMut(u32) -> Route,
) -> Result<Plan, PlanRefusal> {
    let partitions: BTreeSet<u32> = placement.iter().copied().collect();
    // None: this node; Some(i): the i-th remote group.
    let mut target: BTreeMap<u32, Option<usize>> = BTreeMap::new();
    let mut remote: Vec<RemoteGroup> = Vec::new();
    let mut group_of_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in partitions {
        match route(p) {
            Route::Local => {
                target.insert(p, None);
            }
            Route::Remote { node, url } => {
                let g = *group_of_node.entry(node.clone()).or_insert_with(|| {
                    remote.push(RemoteGroup {
                        node,
                        url,
                        indices: Vec::new(),
                        partitions: Vec::new(),
                    });
                    remote.len() - 1
                });
                remote[g].partitions.push(p);
                target.insert(p, Some(g));
            }
            Route::NotOwned => return Err(PlanRefusal::NotOwned { partition: p }),
            Route::OwnerDown { node } => {
                return Err(PlanRefusal::OwnerDown { partition: p, node });
            }
        }
    }
    let mut local = Vec::new();
    for (i, p) in placement.iter().enumerate() {
        match target.get(p) {
            Some(Some(g)) => remote[*g].indices.push(i),
            _ => local.push(i),
        }
    }
    // Groups by node id, so the same request always contacts owners in the same order.
    remote.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(Plan { local, remote })
}

/// The body forwarded for the records at `indices`: each with its explicit partition (which
/// the caller has set) and its exact bytes, as text when they are UTF-8 and base64 otherwise;
/// headers in the list form, which keeps their stored order and repeated names.
pub(crate) fn encode_records(records: &[ProduceRecord], indices: &[usize]) -> ProduceRequest {
    ProduceRequest {
        records: indices
            .iter()
            .filter_map(|&i| records.get(i))
            .map(encode_record)
            .collect(),
    }
}

fn encode_record(r: &ProduceRecord) -> ProduceRecordJson {
    let (key, key_b64) = match r.record.key.as_deref().map(Text::of) {
        None => (None, None),
        Some(Text::Utf8(s)) => (Some(s), None),
        Some(Text::Base64(s)) => (None, Some(s)),
    };
    let (value, value_b64) = match r.record.value.as_deref().map(Text::of) {
        None => (Some(None), None),
        Some(Text::Utf8(s)) => (Some(Some(s)), None),
        Some(Text::Base64(s)) => (None, Some(s)),
    };
    let headers = (!r.record.headers.is_empty()).then(|| {
        HeadersJson::List(
            r.record
                .headers
                .iter()
                .map(|h| match Text::of(&h.value) {
                    Text::Utf8(s) => HeaderJson {
                        name: h.name.clone(),
                        value: Some(s),
                        value_b64: None,
                    },
                    Text::Base64(s) => HeaderJson {
                        name: h.name.clone(),
                        value: None,
                        value_b64: Some(s),
                    },
                })
                .collect(),
        )
    });
    ProduceRecordJson {
        key,
        key_b64,
        value,
        value_b64,
        headers,
        partition: r.partition,
    }
}

/// Checks an owner's answer for the records at `indices`: one offset per record, each on the
/// record's partition in `placement`.
pub(crate) fn check_answer(
    indices: &[usize],
    placement: &[u32],
    offsets: &[OffsetJson],
) -> Result<(), String> {
    if offsets.len() != indices.len() {
        return Err(format!(
            "{} offsets for {} records",
            offsets.len(),
            indices.len()
        ));
    }
    for (k, (&i, o)) in indices.iter().zip(offsets).enumerate() {
        let expected = placement.get(i).copied();
        if expected != Some(o.partition) {
            return Err(format!(
                "offset {k} is on partition {}, its record was sent to partition {}",
                o.partition,
                expected.map_or_else(|| "none".to_owned(), |p| p.to_string())
            ));
        }
    }
    Ok(())
}

/// Merges the offsets of each part (positions in the request, their offsets in the same
/// order) into one list in request order; every one of the `total` records must get exactly
/// one offset.
pub(crate) fn merge(
    total: usize,
    parts: Vec<(Vec<usize>, Vec<OffsetJson>)>,
) -> Result<Vec<OffsetJson>, String> {
    let mut merged: Vec<Option<OffsetJson>> = vec![None; total];
    for (indices, offsets) in parts {
        if indices.len() != offsets.len() {
            return Err(format!(
                "a part has {} offsets for {} records",
                offsets.len(),
                indices.len()
            ));
        }
        for (i, o) in indices.into_iter().zip(offsets) {
            match merged.get_mut(i) {
                Some(slot @ None) => *slot = Some(o),
                Some(Some(_)) => return Err(format!("record {i} got two offsets")),
                None => return Err(format!("record {i} is past the request's {total}")),
            }
        }
    }
    merged
        .into_iter()
        .enumerate()
        .map(|(i, o)| o.ok_or_else(|| format!("record {i} got no offset")))
        .collect()
}

/// What a failed produce tells about the rest of the request: which partitions' records were
/// committed and which may have been.
fn committed_summary(committed: &[u32], uncertain: &[u32]) -> String {
    let mut text = String::new();
    if committed.is_empty() && uncertain.is_empty() {
        text.push_str("; nothing of this request was committed");
    }
    if !committed.is_empty() {
        text.push_str(&format!(
            "; the records of this request for partitions {committed:?} were committed"
        ));
    }
    if !uncertain.is_empty() {
        text.push_str(&format!(
            "; whether those for partitions {uncertain:?} were committed is unknown (retrying \
             may store them twice)"
        ));
    }
    text
}

/// `error` as a response with `Retry-After`.
fn with_retry_after(error: ApiError, retry_after: Option<HeaderValue>) -> Response {
    let mut response = error.into_response();
    if let Some(v) = retry_after {
        response.headers_mut().insert(RETRY_AFTER, v);
    }
    response
}

/// The `503` for a partition whose owner `node` is not reachable; `summary` ends the message.
fn owner_down(id: &PartitionId, node: &str, why: Option<&str>, summary: &str) -> ApiError {
    let why = why.map(|w| format!(" ({w})")).unwrap_or_default();
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "partition {id} is served by node {node}, which is not reachable{why}; retry{summary}"
        ),
    )
    .with("owner", node)
    .with("partition", id.partition)
}

/// The answer to a produce whose remote `group` failed with `err`; `committed` and
/// `uncertain` are the partitions of the whole request whose records were, and may have been,
/// committed, and `placement` the partition of each record of the request (so a client knows
/// exactly which records were stored).
fn produce_failure(
    topic: &str,
    group: &RemoteGroup,
    err: &HopError,
    committed: &[u32],
    uncertain: &[u32],
    placement: &[u32],
) -> Response {
    let summary = committed_summary(committed, uncertain);
    let node = &group.node;
    let parts = &group.partitions;
    let (error, retry_after) = match err {
        HopError::Call(NaradCallError::NotReached { cause, .. }) => {
            let first = parts.first().copied().unwrap_or_default();
            let why = crate::tls::error_chain(cause);
            (
                owner_down(&PartitionId::new(topic, first), node, Some(&why), &summary),
                Some(HeaderValue::from(OWNER_DOWN_RETRY_AFTER_SECS)),
            )
        }
        HopError::Refused {
            status,
            message,
            retry_after,
            ..
        } => (
            ApiError::new(
                *status,
                format!(
                    "node {node}, which serves partitions {parts:?} of {topic}, refused their \
                     records: {message}{summary}"
                ),
            )
            .with("owner", node.as_str()),
            retry_after.clone(),
        ),
        HopError::OwnerLost { .. } => (
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "node {node}, which serves partitions {parts:?} of {topic}, lost its lease \
                     before it answered; it may have written these records, so retry with the \
                     same producer if duplicates matter{summary}"
                ),
            )
            .with("owner", node.as_str()),
            Some(HeaderValue::from(OWNER_DOWN_RETRY_AFTER_SECS)),
        ),
        HopError::Call(NaradCallError::Encode(_)) => (
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("forwarding to node {node} failed: {err}{summary}"),
            ),
            None,
        ),
        _ => (
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!(
                    "node {node}, which serves partitions {parts:?} of {topic}, gave no usable \
                     answer ({err}){summary}"
                ),
            )
            .with("owner", node.as_str()),
            None,
        ),
    };
    let mut error = error
        .with("committed_partitions", committed.to_vec())
        .with("record_partitions", placement.to_vec());
    if !uncertain.is_empty() {
        error = error.with("uncertain_partitions", uncertain.to_vec());
    }
    with_retry_after(error, retry_after)
}

/// The answer when any remote group of `plan` failed (`results` in the order of
/// `plan.remote`): the first failure, with the partitions the other groups committed or may
/// have committed. `None` when every group committed.
pub(crate) fn remote_failure(
    topic: &str,
    plan: &Plan,
    results: &[Result<Vec<OffsetJson>, HopError>],
    placement: &[u32],
) -> Option<Response> {
    let mut committed = Vec::new();
    let mut uncertain = Vec::new();
    let mut first_failure = None;
    for (group, result) in plan.remote.iter().zip(results) {
        match result {
            Ok(_) => committed.extend_from_slice(&group.partitions),
            Err(e) => {
                if e.outcome_unknown() {
                    uncertain.extend_from_slice(&group.partitions);
                }
                first_failure.get_or_insert((group, e));
            }
        }
    }
    let (group, err) = first_failure?;
    committed.sort_unstable();
    uncertain.sort_unstable();
    Some(produce_failure(
        topic, group, err, &committed, &uncertain, placement,
    ))
}

/// The answer when this node's own part failed after every remote part committed (on
/// `remote_committed`); `placement` is the partition of each record of the request.
pub(crate) fn local_failure(
    err: ProduceError,
    remote_committed: &[u32],
    placement: &[u32],
) -> Response {
    let mut committed = match &err {
        ProduceError::Append {
            committed_partitions,
            ..
        } => committed_partitions.clone(),
        _ => Vec::new(),
    };
    let local = ApiError::from(err).with("record_partitions", placement.to_vec());
    if remote_committed.is_empty() {
        return local
            .with("committed_partitions", committed)
            .into_response();
    }
    committed.extend_from_slice(remote_committed);
    committed.sort_unstable();
    committed.dedup();
    ApiError::new(
        local.status(),
        format!(
            "{}; the records of this request for partitions {remote_committed:?} were committed \
             on their owners",
            local.message()
        ),
    )
    .with("committed_partitions", committed)
    .with("record_partitions", placement.to_vec())
    .into_response()
}

/// Sends each remote group's records to its owner, all at once, and returns each group's
/// offsets (checked against `placement`) in the order of `groups`. The calls run as tasks, so
/// a client that goes away does not cut a forwarded produce in the middle.
pub(crate) async fn send_groups(
    forwarder: &Arc<Forwarder>,
    topic: &str,
    records: &[ProduceRecord],
    placement: &[u32],
    groups: &[RemoteGroup],
    authorization: Option<HeaderValue>,
) -> Vec<Result<Vec<OffsetJson>, HopError>> {
    let calls: Vec<_> = groups
        .iter()
        .map(|group| {
            let body = encode_records(records, &group.indices);
            let forwarder = Arc::clone(forwarder);
            let url = group.url.clone();
            let node = group.node.clone();
            let topic = topic.to_owned();
            let authorization = authorization.clone();
            tokio::spawn(async move {
                let call = forwarder.produce(&url, &topic, &body, authorization.as_ref());
                forwarder.while_alive(&node, &url, call).await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(groups.len());
    for (group, call) in groups.iter().zip(calls) {
        let result = match call.await {
            Ok(result) => result,
            Err(e) => Err(HopError::Task(e.to_string())),
        };
        results.push(result.and_then(|answer| {
            check_answer(&group.indices, placement, &answer.offsets).map_err(|detail| {
                HopError::BadAnswer {
                    url: group.url.clone(),
                    detail,
                }
            })?;
            Ok(answer.offsets)
        }));
    }
    results
}

/// A produce whose records go to other nodes too, ready to run ([`split_produce`]).
#[derive(Debug)]
pub(crate) struct Split {
    forwarder: Arc<Forwarder>,
    plan: Plan,
}

/// What [`split_produce`] decided for a produce.
#[derive(Debug)]
pub(crate) enum ProduceRoute {
    /// Every partition is this node's: the produce runs locally, as on a single node.
    Local,
    /// Some records go to other owners: run the [`Split`].
    Forward(Split),
    /// The answer to send now, with nothing committed.
    Refused(Response),
}

/// Decides where the records placed on `placement` go. Refused, with nothing committed:
/// `421` for a partition no node owns, or another node owns while this request may not be
/// forwarded (single node, or already forwarded once); `503` when a partition's owner is not
/// alive.
pub(crate) fn split_produce(
    state: &AppState,
    headers: &HeaderMap,
    topic: &str,
    placement: &[u32],
) -> ProduceRoute {
    let hop = match (&state.forward, &state.cluster) {
        (Some(forwarder), Some(cluster)) if !headers.contains_key(FORWARDED_HEADER) => {
            Some((forwarder, cluster))
        }
        _ => None,
    };
    let local = state.ownership.local_node();
    let planned = plan(placement, |p| {
        match state.ownership.owner(&PartitionId::new(topic, p)) {
            None => Route::NotOwned,
            Some(owner) if &owner == local => Route::Local,
            Some(owner) => match hop {
                None => Route::NotOwned,
                Some((_, cluster)) => match cluster.peers.advertise_of(&owner.0) {
                    Some(url) => Route::Remote { node: owner.0, url },
                    None => Route::OwnerDown { node: owner.0 },
                },
            },
        }
    });
    match planned {
        Err(PlanRefusal::NotOwned { partition }) => ProduceRoute::Refused(
            not_owned(state, &PartitionId::new(topic, partition)).into_response(),
        ),
        Err(PlanRefusal::OwnerDown { partition, node }) => {
            state
                .api_metrics
                .forwarded(REQUEST_PRODUCE, OUTCOME_OWNER_DOWN);
            let error = owner_down(
                &PartitionId::new(topic, partition),
                &node,
                None,
                &committed_summary(&[], &[]),
            )
            .with("committed_partitions", Vec::<u32>::new())
            .with("record_partitions", placement.to_vec());
            ProduceRoute::Refused(with_retry_after(
                error,
                Some(HeaderValue::from(OWNER_DOWN_RETRY_AFTER_SECS)),
            ))
        }
        Ok(plan) => match hop {
            Some((forwarder, _)) if !plan.remote.is_empty() => ProduceRoute::Forward(Split {
                forwarder: Arc::clone(forwarder),
                plan,
            }),
            _ => ProduceRoute::Local,
        },
    }
}

impl Split {
    /// Commits `records` (placed on `placement`, each with its explicit partition set): the
    /// remote groups first, concurrently; then, only if every one committed, this node's
    /// records. Answers one produce answer in request order, or the first failure with the
    /// partitions committed so far.
    pub(crate) async fn run(
        self,
        state: &AppState,
        headers: &HeaderMap,
        topic: &str,
        partitions: u32,
        records: Vec<ProduceRecord>,
        placement: &[u32],
    ) -> Response {
        let Split { forwarder, plan } = self;
        let authorization = headers.get(AUTHORIZATION).cloned();
        let results = send_groups(
            &forwarder,
            topic,
            &records,
            placement,
            &plan.remote,
            authorization,
        )
        .await;
        for result in &results {
            let outcome = match result {
                Ok(_) => OUTCOME_OK,
                Err(e) => e.outcome(),
            };
            state.api_metrics.forwarded(REQUEST_PRODUCE, outcome);
        }
        if let Some(failure) = remote_failure(topic, &plan, &results, placement) {
            return failure;
        }
        let mut remote_committed: Vec<u32> = plan
            .remote
            .iter()
            .flat_map(|g| g.partitions.iter().copied())
            .collect();
        remote_committed.sort_unstable();
        let mut parts: Vec<(Vec<usize>, Vec<OffsetJson>)> = plan
            .remote
            .iter()
            .zip(results)
            .filter_map(|(g, r)| r.ok().map(|offsets| (g.indices.clone(), offsets)))
            .collect();
        if !plan.local.is_empty() {
            let mut slots: Vec<Option<ProduceRecord>> = records.into_iter().map(Some).collect();
            let local: Vec<ProduceRecord> = plan
                .local
                .iter()
                .filter_map(|&i| slots.get_mut(i).and_then(Option::take))
                .collect();
            let bytes: u64 = local.iter().map(|r| r.record.payload_bytes() as u64).sum();
            match state.producer.produce(topic, partitions, local).await {
                Ok(placed) => {
                    state
                        .api_metrics
                        .produced(topic, placed.len() as u64, bytes);
                    let offsets = placed
                        .into_iter()
                        .map(|p| OffsetJson {
                            partition: p.partition,
                            offset: p.offset,
                        })
                        .collect();
                    parts.push((plan.local.clone(), offsets));
                }
                Err(e) => return local_failure(e, &remote_committed, placement),
            }
        }
        match merge(placement.len(), parts) {
            Ok(offsets) => Json(ProduceResponse { offsets }).into_response(),
            // Cannot happen with a plan from `plan` and checked answers; said plainly if it
            // does, since every part did commit.
            Err(detail) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "every record of this request was committed, but the answers do not merge: \
                     {detail}"
                ),
            )
            .into_response(),
        }
    }
}

/// A fetch of `id`, which this node does not own: forwarded to its owner when this node may
/// forward (cluster mode, and the request was not forwarded already), else `421`. The owner's
/// answer comes back as it is; `503` with `Retry-After` when the owner is not reachable,
/// `502` when it gave no usable answer, `503` when this node shuts down meanwhile.
pub(crate) async fn fetch(
    state: &AppState,
    headers: &HeaderMap,
    uri: &Uri,
    id: &PartitionId,
) -> Response {
    let (Some(forwarder), Some(cluster)) = (&state.forward, &state.cluster) else {
        return not_owned(state, id).into_response();
    };
    let owner = match state.ownership.owner(id) {
        Some(owner) if !headers.contains_key(FORWARDED_HEADER) => owner,
        _ => return not_owned(state, id).into_response(),
    };
    let down = || {
        with_retry_after(
            owner_down(id, &owner.0, None, ""),
            Some(HeaderValue::from(OWNER_DOWN_RETRY_AFTER_SECS)),
        )
    };
    let Some(url) = cluster.peers.advertise_of(&owner.0) else {
        state
            .api_metrics
            .forwarded(REQUEST_FETCH, OUTCOME_OWNER_DOWN);
        return down();
    };
    let path_and_query = uri
        .path_and_query()
        .map_or_else(|| uri.path(), |pq| pq.as_str());
    let answer = tokio::select! {
        answer = forwarder.fetch(&url, path_and_query, headers.get(AUTHORIZATION)) => answer,
        // A forwarded long-poll must not hold this node's shutdown for up to max-wait-ms.
        () = state.shutdown.wait() => {
            return with_retry_after(
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "this node is shutting down; retry, on another node if need be",
                ),
                Some(HeaderValue::from(OWNER_DOWN_RETRY_AFTER_SECS)),
            );
        }
    };
    let outcome = match &answer {
        Ok(_) => OUTCOME_OK,
        Err(e) => e.outcome(),
    };
    state.api_metrics.forwarded(REQUEST_FETCH, outcome);
    match answer {
        Ok(answer) => answer.into_response(),
        Err(HopError::Call(NaradCallError::NotReached { .. })) => down(),
        Err(e) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "node {owner}, which serves partition {id}, gave no usable answer to the \
                 forwarded fetch ({e}); retry"
            ),
        )
        .with("owner", owner.0.as_str())
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Instant;

    use axum::extract::{Path, RawQuery, State};
    use bytes::Bytes;
    use narad_storage::{Header, NewRecord};

    use super::*;
    use crate::api::records::decode_batch;

    /// Bound on any one await in these tests, far above what they take.
    const LIMIT: Duration = Duration::from_secs(20);

    /// One request a fake owner received.
    #[derive(Debug, Clone)]
    struct Received {
        headers: HeaderMap,
        path: String,
        query: Option<String>,
        body: Bytes,
    }

    #[derive(Clone, Default)]
    struct FakeOwner {
        received: Arc<Mutex<Vec<Received>>>,
        /// Next offset per partition.
        next: Arc<Mutex<BTreeMap<u32, u64>>>,
    }

    /// Answers like the produce API (real decoding, offsets counted per partition), except
    /// that partition 7 is "owned elsewhere" (421).
    async fn fake_produce(
        State(owner): State<FakeOwner>,
        Path(topic): Path<String>,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        owner.received.lock().unwrap().push(Received {
            headers,
            path: format!("/v1/topics/{topic}/records"),
            query: None,
            body: body.clone(),
        });
        let request: ProduceRequest = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
        };
        let records = match decode_batch(request, 8, &topic, &Limits::default()) {
            Ok(r) => r,
            Err(e) => return e.into_response(),
        };
        let mut next = owner.next.lock().unwrap();
        let mut offsets = Vec::new();
        for r in records {
            let Some(p) = r.partition else {
                return ApiError::bad_request("a forwarded record has no partition")
                    .into_response();
            };
            if p == 7 {
                return ApiError::new(
                    StatusCode::MISDIRECTED_REQUEST,
                    format!("partition {topic}/p00007 is served by node n9, not by this node"),
                )
                .into_response();
            }
            let slot = next.entry(p).or_insert(0);
            offsets.push(OffsetJson {
                partition: p,
                offset: *slot,
            });
            *slot += 1;
        }
        Json(ProduceResponse { offsets }).into_response()
    }

    /// Waits `wait_ms` (a long-poll that finds nothing), then answers 416 with a JSON body.
    async fn fake_fetch(
        State(owner): State<FakeOwner>,
        Path((topic, partition)): Path<(String, u32)>,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
    ) -> Response {
        owner.received.lock().unwrap().push(Received {
            headers,
            path: format!("/v1/topics/{topic}/partitions/{partition}/records"),
            query: query.clone(),
            body: Bytes::new(),
        });
        let wait_ms = query
            .as_deref()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("wait_ms=")))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        ApiError::new(StatusCode::RANGE_NOT_SATISFIABLE, "beyond the end")
            .with("high_watermark", 3)
            .into_response()
    }

    /// An answer larger than any cap these tests set.
    async fn huge() -> Vec<u8> {
        vec![b'x'; 3 << 20]
    }

    /// A real HTTP server on loopback playing a partition owner.
    async fn fake_owner() -> (String, FakeOwner) {
        let owner = FakeOwner::default();
        let app = axum::Router::new()
            .route(
                "/v1/topics/{topic}/records",
                axum::routing::post(fake_produce),
            )
            .route(
                "/v1/topics/{topic}/partitions/{partition}/records",
                axum::routing::get(fake_fetch),
            )
            .route("/huge", axum::routing::get(huge))
            .with_state(owner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (url, owner)
    }

    /// A partition owner answering as a narad from before null values: 400 with its refusal
    /// for a request holding `"value": null`, else one offset per record. Keeps every body.
    async fn old_owner() -> (String, Arc<Mutex<Vec<ProduceRequest>>>) {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&bodies);
        let app = axum::Router::new().route(
            "/v1/topics/{topic}/records",
            axum::routing::post(move |body: Bytes| {
                let kept = Arc::clone(&kept);
                async move {
                    let request: ProduceRequest = serde_json::from_slice(&body).unwrap();
                    let null = request.records.iter().any(|r| r.value == Some(None));
                    let count = request.records.len();
                    kept.lock().unwrap().push(request);
                    if null {
                        return ApiError::bad_request(format!(
                            "records[0]: {}",
                            crate::peer::produce::NULL_VALUE_REFUSED_BEFORE
                        ))
                        .into_response();
                    }
                    let offsets = (0..count as u64)
                        .map(|offset| OffsetJson {
                            partition: 1,
                            offset,
                        })
                        .collect();
                    Json(ProduceResponse { offsets }).into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (url, bodies)
    }

    #[tokio::test]
    async fn a_null_value_reaches_an_owner_from_before_null_values_as_an_empty_one() {
        let (url, bodies) = old_owner().await;
        let request = ProduceRequest {
            records: vec![
                ProduceRecordJson {
                    value: Some(None),
                    partition: Some(1),
                    ..ProduceRecordJson::default()
                },
                ProduceRecordJson {
                    value: Some(Some("v".into())),
                    partition: Some(1),
                    ..ProduceRecordJson::default()
                },
            ],
        };
        let answer = forwarder()
            .produce(&url, "orders", &request, None)
            .await
            .unwrap();
        assert_eq!(answer.offsets.len(), 2);
        let bodies = bodies.lock().unwrap();
        assert_eq!(bodies.len(), 2, "refused once, then taken");
        assert_eq!(bodies[0].records[0].value, Some(None));
        assert_eq!(bodies[1].records[0].value, Some(Some(String::new())));
        assert_eq!(bodies[1].records[1].value, Some(Some("v".into())));
    }

    /// An owner that keeps the `Authorization` header of every produce it gets (`None` when
    /// there is none) and places every record.
    async fn authorization_keeper() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&seen);
        let app = axum::Router::new().route(
            "/v1/topics/{topic}/records",
            axum::routing::post(move |headers: HeaderMap| {
                let kept = Arc::clone(&kept);
                async move {
                    let all: Vec<_> = headers.get_all(AUTHORIZATION).iter().collect();
                    assert!(all.len() <= 1, "more than one Authorization: {all:?}");
                    kept.lock()
                        .unwrap()
                        .push(all.first().map(|v| v.to_str().unwrap().to_owned()));
                    Json(ProduceResponse {
                        offsets: vec![OffsetJson {
                            partition: 0,
                            offset: 0,
                        }],
                    })
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (url, seen)
    }

    #[tokio::test]
    async fn a_forwarded_produce_carries_the_clients_authorization_never_the_peer_secret() {
        // The node's peer client presents the peer secret on its own calls; a forwarder made
        // from it must not, or a client without a token would act with the nodes' rights.
        let client = crate::peer::PeerClient::new(&crate::tls::PeerTls::default())
            .unwrap()
            .with_secret("peer-secret");
        let forwarder = Forwarder::over("n1", &Limits::default(), client).unwrap();
        let (url, seen) = authorization_keeper().await;
        let request = ProduceRequest {
            records: vec![ProduceRecordJson {
                value: Some(Some("v".into())),
                partition: Some(0),
                ..ProduceRecordJson::default()
            }],
        };
        forwarder
            .produce(&url, "orders", &request, None)
            .await
            .unwrap();
        let token = HeaderValue::from_static("Bearer client-token");
        forwarder
            .produce(&url, "orders", &request, Some(&token))
            .await
            .unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec![None, Some("Bearer client-token".to_owned())]
        );
    }

    #[tokio::test]
    async fn any_other_refusal_is_not_sent_again() {
        let (url, bodies) = old_owner().await;
        // No null value: the owner takes it; a 400 for another reason is returned as it is.
        let request = ProduceRequest {
            records: vec![ProduceRecordJson {
                value: Some(Some("v".into())),
                partition: Some(1),
                ..ProduceRecordJson::default()
            }],
        };
        forwarder()
            .produce(&url, "orders", &request, None)
            .await
            .unwrap();
        let (fake, owner) = fake_owner().await;
        let bad = ProduceRequest {
            records: vec![ProduceRecordJson {
                value: Some(None),
                ..ProduceRecordJson::default()
            }],
        };
        let err = forwarder()
            .produce(&fake, "orders", &bad, None)
            .await
            .unwrap_err();
        assert!(matches!(err, HopError::Refused { .. }), "{err}");
        assert_eq!(owner.received.lock().unwrap().len(), 1);
        assert_eq!(bodies.lock().unwrap().len(), 1);
    }

    /// An address nothing listens on.
    fn dead_url() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("http://127.0.0.1:{port}")
    }

    fn forwarder() -> Arc<Forwarder> {
        Arc::new(Forwarder::new("n1", &Limits::default()).unwrap())
    }

    fn record(
        partition: u32,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> ProduceRecord {
        ProduceRecord {
            partition: Some(partition),
            record: NewRecord {
                key: key.map(Bytes::copy_from_slice),
                headers: headers
                    .iter()
                    .map(|(n, v)| Header {
                        name: (*n).to_owned(),
                        value: Bytes::copy_from_slice(v),
                    })
                    .collect(),
                value: Some(Bytes::copy_from_slice(value)),
            },
        }
    }

    /// Records whose bytes are easy to get wrong in JSON: binary, empty, control characters,
    /// repeated and unsorted header names.
    fn tricky_records() -> Vec<ProduceRecord> {
        vec![
            record(0, Some(b"k0"), b"text value", &[]),
            record(
                1,
                Some(&[0xff, 0x00, 0x80]),
                &[0xc3, 0x28],
                &[("z", b"1"), ("a", &[0xfe]), ("z", b"")],
            ),
            record(2, Some(b""), b"", &[]),
            record(1, None, b"\x01\x02 \"quoted\" \\ \n", &[("trace", b"\x00")]),
            record(3, None, "caf\u{e9} \u{1F600}".as_bytes(), &[]),
        ]
    }

    fn placement_of(records: &[ProduceRecord]) -> Vec<u32> {
        records.iter().map(|r| r.partition.unwrap()).collect()
    }

    async fn body_json(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn records_are_grouped_by_owner_in_request_order_and_local_ones_stay_here() {
        let placement = [0, 1, 2, 1, 3, 0, 2];
        let plan = plan(&placement, |p| match p {
            0 => Route::Local,
            1 | 3 => Route::Remote {
                node: "n2".into(),
                url: "http://b".into(),
            },
            _ => Route::Remote {
                node: "n1b".into(),
                url: "http://a".into(),
            },
        })
        .unwrap();
        assert_eq!(plan.local, vec![0, 5]);
        assert_eq!(
            plan.remote.len(),
            2,
            "one group per owner, not per partition"
        );
        assert_eq!(plan.remote[0].node, "n1b");
        assert_eq!(plan.remote[0].indices, vec![2, 6]);
        assert_eq!(plan.remote[0].partitions, vec![2]);
        assert_eq!(plan.remote[1].node, "n2");
        assert_eq!(plan.remote[1].indices, vec![1, 3, 4]);
        assert_eq!(plan.remote[1].partitions, vec![1, 3]);
    }

    #[test]
    fn a_request_with_only_local_partitions_has_nothing_to_forward() {
        let plan = plan(&[3, 1, 3], |_| Route::Local).unwrap();
        assert_eq!(plan.local, vec![0, 1, 2]);
        assert!(plan.remote.is_empty());
    }

    #[test]
    fn one_down_or_unowned_partition_refuses_the_whole_request_and_each_partition_is_asked_once() {
        let mut asked = Vec::new();
        let refused = plan(&[0, 2, 0, 1, 2], |p| {
            asked.push(p);
            match p {
                2 => Route::OwnerDown { node: "n3".into() },
                _ => Route::Local,
            }
        });
        assert_eq!(
            refused,
            Err(PlanRefusal::OwnerDown {
                partition: 2,
                node: "n3".into()
            })
        );
        assert_eq!(asked, vec![0, 1, 2]);
        assert_eq!(
            plan(&[4], |_| Route::NotOwned),
            Err(PlanRefusal::NotOwned { partition: 4 })
        );
    }

    #[test]
    fn merged_offsets_follow_the_request_order_across_owners() {
        let o = |partition, offset| OffsetJson { partition, offset };
        let merged = merge(
            4,
            vec![
                (vec![1, 3], vec![o(1, 10), o(1, 11)]),
                (vec![0, 2], vec![o(0, 5), o(2, 7)]),
            ],
        )
        .unwrap();
        assert_eq!(merged, vec![o(0, 5), o(1, 10), o(2, 7), o(1, 11)]);
    }

    #[test]
    fn a_merge_with_a_missing_doubled_or_miscounted_offset_is_an_error() {
        let o = |partition, offset| OffsetJson { partition, offset };
        assert!(merge(2, vec![(vec![0], vec![o(0, 1)])]).is_err());
        assert!(merge(1, vec![(vec![0], vec![o(0, 1)]), (vec![0], vec![o(0, 2)])]).is_err());
        assert!(merge(1, vec![(vec![0], vec![])]).is_err());
        assert!(merge(1, vec![(vec![5], vec![o(0, 1)])]).is_err());
    }

    #[test]
    fn an_owner_answer_on_another_partition_or_of_the_wrong_length_is_rejected() {
        let o = |partition, offset| OffsetJson { partition, offset };
        let placement = [0, 1, 1];
        assert!(check_answer(&[1, 2], &placement, &[o(1, 0), o(1, 1)]).is_ok());
        assert!(check_answer(&[1, 2], &placement, &[o(1, 0), o(0, 1)]).is_err());
        assert!(check_answer(&[1, 2], &placement, &[o(1, 0)]).is_err());
    }

    #[test]
    fn forwarded_records_decode_on_the_owner_to_the_same_bytes_and_partitions() {
        let records = tricky_records();
        let body = encode_records(&records, &[0, 1, 2, 3, 4]);
        assert!(body.records.iter().all(|r| r.partition.is_some()));
        let wire = serde_json::to_vec(&body).unwrap();
        let back = decode_batch(
            serde_json::from_slice(&wire).unwrap(),
            8,
            "orders",
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(back, records);
    }

    #[tokio::test]
    async fn a_local_failure_after_the_owners_committed_names_every_committed_partition() {
        let err = ProduceError::Append {
            partition: PartitionId::new("orders", 2),
            source: narad_storage::StorageError::EmptyBatch,
            committed_partitions: vec![0],
        };
        let body = body_json(local_failure(err, &[3, 1], &[])).await;
        assert_eq!(body["committed_partitions"], serde_json::json!([0, 1, 3]));
        let message = body["error"].as_str().unwrap();
        assert!(
            message.contains("partitions [3, 1] were committed on their owners"),
            "{message}"
        );
    }

    #[test]
    fn the_fetch_answer_cap_holds_a_full_fetch_in_its_largest_json_form() {
        let limits = Limits::default();
        let cap = fetch_answer_cap(&limits) as u64;
        assert!(cap >= 6 * (limits.max_fetch_bytes + limits.max_record_bytes));
        assert!(cap >= u64::from(limits.max_fetch_records) * 256);
    }

    #[test]
    fn a_node_id_that_cannot_be_a_header_value_is_refused() {
        assert!(matches!(
            Forwarder::new("n1\nx", &Limits::default()),
            Err(ForwarderError::NodeId { .. })
        ));
    }

    #[tokio::test]
    async fn a_forwarded_produce_carries_explicit_partitions_exact_bytes_the_marker_and_the_token()
    {
        let (url, owner) = fake_owner().await;
        let records = tricky_records();
        let placement = placement_of(&records);
        // Partitions 1 and 3 are the fake owner's; 0 and 2 stay here.
        let plan = plan(&placement, |p| {
            if p % 2 == 1 {
                Route::Remote {
                    node: "n2".into(),
                    url: url.clone(),
                }
            } else {
                Route::Local
            }
        })
        .unwrap();
        let token = HeaderValue::from_static("Bearer s3cret");
        let results = tokio::time::timeout(
            LIMIT,
            send_groups(
                &forwarder(),
                "orders",
                &records,
                &placement,
                &plan.remote,
                Some(token),
            ),
        )
        .await
        .unwrap();
        assert!(remote_failure("orders", &plan, &results, &[]).is_none());

        let received = owner.received.lock().unwrap().clone();
        assert_eq!(received.len(), 1, "one request per owner");
        let got = &received[0];
        assert_eq!(got.path, "/v1/topics/orders/records");
        assert_eq!(got.headers[FORWARDED_HEADER], "n1");
        assert_eq!(got.headers[AUTHORIZATION], "Bearer s3cret");
        let sent: ProduceRequest = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(
            sent.records.iter().map(|r| r.partition).collect::<Vec<_>>(),
            vec![Some(1), Some(1), Some(3)]
        );
        let decoded = decode_batch(sent, 8, "orders", &Limits::default()).unwrap();
        let expected: Vec<ProduceRecord> = [1, 3, 4].iter().map(|&i| records[i].clone()).collect();
        assert_eq!(
            decoded, expected,
            "the owner stores exactly the client's bytes"
        );

        // Merged with this node's part, the answer is in request order.
        let o = |partition, offset| OffsetJson { partition, offset };
        let mut parts = vec![(plan.local.clone(), vec![o(0, 40), o(2, 9)])];
        parts.push((
            plan.remote[0].indices.clone(),
            results.into_iter().next().unwrap().unwrap(),
        ));
        assert_eq!(
            merge(placement.len(), parts).unwrap(),
            vec![o(0, 40), o(1, 0), o(2, 9), o(1, 1), o(3, 0)]
        );
    }

    #[tokio::test]
    async fn an_owner_that_is_not_listening_answers_503_with_retry_after_naming_it_and_what_was_committed()
     {
        let (url, _owner) = fake_owner().await;
        let dead = dead_url();
        let records = vec![record(1, None, b"a", &[]), record(3, None, b"b", &[])];
        let placement = placement_of(&records);
        let plan = plan(&placement, |p| Route::Remote {
            node: if p == 1 { "n2".into() } else { "n3".into() },
            url: if p == 1 { url.clone() } else { dead.clone() },
        })
        .unwrap();
        let started = Instant::now();
        let results = tokio::time::timeout(
            LIMIT,
            send_groups(
                &forwarder(),
                "orders",
                &records,
                &placement,
                &plan.remote,
                None,
            ),
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() < crate::peer::CONNECT_TIMEOUT * 3,
            "fails fast, not after a long timeout"
        );
        assert_eq!(results[1].as_ref().unwrap_err().outcome(), "owner_down");
        let response = remote_failure("orders", &plan, &results, &[]).unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        let body = body_json(response).await;
        let message = body["error"].as_str().unwrap();
        // The connection error's cause is said (here: the refused connection).
        assert!(
            message.starts_with(
                "partition orders/p00003 is served by node n3, which is not reachable ("
            ) && message.contains("); retry"),
            "{message}"
        );
        assert!(
            message.contains("partitions [1] were committed"),
            "{message}"
        );
        assert_eq!(body["owner"], "n3");
        assert_eq!(body["partition"], 3);
        assert_eq!(body["committed_partitions"], serde_json::json!([1]));
    }

    #[tokio::test]
    async fn an_owner_refusal_comes_back_with_its_status_and_message_and_nothing_committed() {
        let (url, _owner) = fake_owner().await;
        let records = vec![record(7, None, b"a", &[])];
        let placement = placement_of(&records);
        let plan = plan(&placement, |_| Route::Remote {
            node: "n2".into(),
            url: url.clone(),
        })
        .unwrap();
        let results = tokio::time::timeout(
            LIMIT,
            send_groups(
                &forwarder(),
                "orders",
                &records,
                &placement,
                &plan.remote,
                None,
            ),
        )
        .await
        .unwrap();
        let response = remote_failure("orders", &plan, &results, &[]).unwrap();
        assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);
        let body = body_json(response).await;
        let message = body["error"].as_str().unwrap();
        assert!(message.contains("served by node n9"), "{message}");
        assert!(
            message.ends_with("nothing of this request was committed"),
            "{message}"
        );
        assert_eq!(body["committed_partitions"], serde_json::json!([]));
    }

    #[tokio::test]
    async fn a_forwarded_fetch_keeps_its_query_waits_out_the_long_poll_and_returns_the_owners_answer()
     {
        let (url, owner) = fake_owner().await;
        let started = Instant::now();
        let answer = tokio::time::timeout(
            LIMIT,
            forwarder().fetch(
                &url,
                "/v1/topics/orders/partitions/3/records?offset=3&max=10&wait_ms=300",
                Some(&HeaderValue::from_static("Bearer s3cret")),
            ),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(answer.status, StatusCode::RANGE_NOT_SATISFIABLE);
        let response = answer.into_response();
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let body = body_json(response).await;
        assert_eq!(body["high_watermark"], 3);
        let received = owner.received.lock().unwrap().clone();
        assert_eq!(received[0].path, "/v1/topics/orders/partitions/3/records");
        assert_eq!(
            received[0].query.as_deref(),
            Some("offset=3&max=10&wait_ms=300")
        );
        assert_eq!(received[0].headers[FORWARDED_HEADER], "n1");
        assert_eq!(received[0].headers[AUTHORIZATION], "Bearer s3cret");
    }

    #[tokio::test]
    async fn a_fetch_answer_over_the_cap_is_refused_rather_than_buffered() {
        let (url, _owner) = fake_owner().await;
        let limits = Limits {
            max_fetch_bytes: 1,
            max_record_bytes: 1,
            max_fetch_records: 1,
            ..Limits::default()
        };
        let small = Forwarder::new("n1", &limits).unwrap();
        assert!(small.max_fetch_answer_bytes() < 3 << 20);
        let answer = tokio::time::timeout(LIMIT, small.fetch(&url, "/huge", None))
            .await
            .unwrap();
        assert!(
            matches!(
                answer,
                Err(HopError::Call(NaradCallError::AnswerTooLarge { .. }))
            ),
            "{answer:?}"
        );
    }

    #[tokio::test]
    async fn a_fetch_to_a_dead_owner_is_not_reached_within_the_connect_timeout() {
        let started = Instant::now();
        let answer = tokio::time::timeout(
            LIMIT,
            forwarder().fetch(&dead_url(), "/v1/topics/t/partitions/0/records", None),
        )
        .await
        .unwrap();
        assert!(
            matches!(
                answer,
                Err(HopError::Call(NaradCallError::NotReached { .. }))
            ),
            "{answer:?}"
        );
        assert!(started.elapsed() < crate::peer::CONNECT_TIMEOUT * 3);
    }
}
