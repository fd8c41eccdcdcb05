//! A produce to another narad (`POST {base}/v1/topics/{topic}/records`): a forwarded produce
//! to a partition's owner, and a remote child's copies to its target. Both read the answer the
//! same bounded way and both downgrade null values the same way for a narad from before them.

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};

use crate::protocol::api::{ErrorBody, ProduceRequest};

/// What a narad from before null values answers (with a 400) to a record with `"value": null`:
/// a sender that gets it sends those values empty, as that narad stores them.
pub(crate) const NULL_VALUE_REFUSED_BEFORE: &str =
    "\"value\" (text) or \"value_b64\" (base64) is required";

/// Bytes of a produce answer per record (`{"partition":4294967295,"offset":<20 digits>},` is
/// 54), and the room left for an error body: a longer answer cannot come from a narad.
const ANSWER_BYTES_PER_RECORD: usize = 64;
const ANSWER_SLACK_BYTES: usize = 64 * 1024;

/// Why a call to another narad (a produce, a forwarded fetch) has no answer to read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NaradCallError {
    /// Nothing reached the target: the connection was refused or not made in time.
    #[error("{url} is not reachable: {}", crate::tls::error_chain(.cause))]
    NotReached {
        /// The URL called.
        url: String,
        /// The client's error, its causes said in the message.
        cause: reqwest::Error,
    },
    /// The request may have reached the target, but no whole answer came back (timeout, lost
    /// connection): what the target did is unknown.
    #[error("{url} gave no answer: {}", crate::tls::error_chain(.cause))]
    NoAnswer {
        /// The URL called.
        url: String,
        /// The client's error, its causes said in the message.
        cause: reqwest::Error,
    },
    /// The answer is larger than a narad's answer to these records can be.
    #[error("the answer of {url} is larger than {limit} bytes")]
    AnswerTooLarge {
        /// The URL called.
        url: String,
        /// The cap.
        limit: usize,
    },
    /// The request body could not be encoded.
    #[error("cannot encode the produce request: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The target's answer, whatever its status.
#[derive(Debug, Clone)]
pub(crate) struct ProduceAnswer {
    /// The target's status.
    pub status: StatusCode,
    /// The target's `Retry-After`.
    pub retry_after: Option<HeaderValue>,
    /// The target's body, at most the cap for the records sent.
    pub body: Bytes,
}

impl ProduceAnswer {
    /// The `error` of an error body, or the start of a body that is not one.
    pub(crate) fn error_message(&self) -> String {
        error_message(&self.body)
    }

    /// Whether this is a narad from before null values refusing one.
    fn refuses_null_values(&self) -> bool {
        self.status == StatusCode::BAD_REQUEST
            && self.error_message().contains(NULL_VALUE_REFUSED_BEFORE)
    }
}

/// The `error` of an error body, or the start of a body that is not one.
pub(crate) fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => e.error,
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
    }
}

/// Sends produces to narad targets of one kind (partition owners, or one remote child's
/// target). A target from before null values refuses `"value": null`; the request then goes
/// once more with those values empty, as that target stores them (a cluster being upgraded,
/// an older remote cluster), and the sender logs it once.
#[derive(Debug)]
pub(crate) struct ProduceSender {
    /// What the targets are, for the log line ("partition owner", "remote target").
    targets: &'static str,
    /// Whether a target was found to predate null values (logged once).
    old_target_seen: AtomicBool,
}

impl ProduceSender {
    /// A sender to `targets` (named in its log line).
    pub(crate) fn new(targets: &'static str) -> ProduceSender {
        ProduceSender {
            targets,
            old_target_seen: AtomicBool::new(false),
        }
    }

    /// Sends `request` to `url` through `call` (which makes the request with the client,
    /// timeout and headers of the caller; the JSON body is set here) and reads the answer,
    /// capped at what a narad answers to these records. Downgrades null values once for a
    /// target that refuses them.
    pub(crate) async fn send(
        &self,
        url: &str,
        request: &ProduceRequest,
        call: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<ProduceAnswer, NaradCallError> {
        let answer = send_once(url, request, &call).await?;
        let has_null = request.records.iter().any(|r| r.value == Some(None));
        if !has_null || !answer.refuses_null_values() {
            return Ok(answer);
        }
        if !self.old_target_seen.swap(true, Ordering::Relaxed) {
            tracing::warn!(target = %url, "a {} refuses null values (a narad from before them): sending them as empty values, as it stores them", self.targets);
        }
        let mut emptied = request.clone();
        for record in &mut emptied.records {
            if record.value == Some(None) {
                record.value = Some(Some(String::new()));
            }
        }
        send_once(url, &emptied, &call).await
    }
}

async fn send_once(
    url: &str,
    request: &ProduceRequest,
    call: &impl Fn() -> reqwest::RequestBuilder,
) -> Result<ProduceAnswer, NaradCallError> {
    let body = serde_json::to_vec(request)?;
    let response = call()
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .body(body)
        .send()
        .await
        .map_err(|e| sent_error(url, e))?;
    let status = response.status();
    let retry_after = response.headers().get(RETRY_AFTER).cloned();
    let limit = request
        .records
        .len()
        .saturating_mul(ANSWER_BYTES_PER_RECORD)
        .saturating_add(ANSWER_SLACK_BYTES);
    let body = read_capped(url, response, limit).await?;
    Ok(ProduceAnswer {
        status,
        retry_after,
        body,
    })
}

/// The error of a call that failed before an answer: not reached when the connection was not
/// made, else no answer (the target may have acted).
pub(crate) fn sent_error(url: &str, cause: reqwest::Error) -> NaradCallError {
    let url = url.to_owned();
    if cause.is_connect() {
        NaradCallError::NotReached { url, cause }
    } else {
        NaradCallError::NoAnswer { url, cause }
    }
}

/// Reads a whole body, refusing one over `limit` bytes without holding more than that.
pub(crate) async fn read_capped(
    url: &str,
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Bytes, NaradCallError> {
    let too_large = || NaradCallError::AnswerTooLarge {
        url: url.to_owned(),
        limit,
    };
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|cause| NaradCallError::NoAnswer {
            url: url.to_owned(),
            cause,
        })?
    {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}
