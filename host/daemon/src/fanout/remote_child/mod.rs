//! The commit of a remote child: a bucket goes to a topic of another narad through its public
//! batch produce (`POST {url}/v1/topics/{topic}/records`).
//!
//! The cursor is the one every child has (placed, epoched, anchored and advanced the same
//! way); only this step differs. The router places each record among the target's
//! partitions, so a bucket is a **lane**: every record of one key is in one lane, and a lane
//! is sent in slab order, one request after another, each record naming its partition. Lanes
//! go concurrently (the cursor's commit lanes), and the cursor advances only when the target
//! has acknowledged every record of the slab, so per-key order holds on the target and a
//! failure repeats at most the slab: duplicates there, never a gap.
//!
//! Each copy carries its origin as a header, `narad-origin: {source}/{epoch}/{parent
//! partition}/{parent offset}`, so the target's consumers can drop the duplicates a repeated
//! slab leaves (the same origin seen twice with the same content is the same record; with
//! other content, the parent reused the offset, see `docs/fanout.md`).
//!
//! Failures, as the cursor sees them ([`ChildCommitError::Remote`]): no answer, a 5xx or a 429
//! is retried (no sooner than a `Retry-After` the target sends, up to 30 s); a 401 or 403 (after reading the token file again), a 404 (the target topic is
//! gone), a 400 or a 413 (a record the target refuses, too large for instance) are
//! **permanent**: the cursor stalls on them with the target's reason and retries slowly, so an
//! operator can fix the target, and it never skips a record.
//!
//! A null value (a Kafka tombstone) goes as `"value": null`. A target built before null values
//! refuses that with a 400 saying a value is required; the request is then sent once more with
//! those values empty, which is how that target would have stored them anyway, and the sender
//! logs it once, so an older target keeps receiving copies (`peer::produce`, shared with the
//! forwarded produce).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use narad_storage::PartitionId;

use super::committer::{
    ChildBatch, ChildCommitError, ChildCommitter, CommitFuture, InOrderCommit, InOrderFailure,
};
use crate::metastore::RemoteTarget;
use crate::peer::produce::ProduceSender;
use crate::protocol::api::{HeaderJson, HeadersJson, ProduceRecordJson, ProduceRequest};

/// The header every copy carries its origin in (a narad target leaves out a copy it holds).
pub(crate) use crate::produce::copies::ORIGIN_HEADER;

/// Most records per request to the target (its default limit is 10,000).
pub(crate) const MAX_RECORDS_PER_REQUEST: usize = 1_000;

/// Most key, value and header bytes per request, before base64 (its default request limit is
/// 64 MiB).
pub(crate) const MAX_BYTES_PER_REQUEST: usize = 4 * 1024 * 1024;

/// Longest wait for one request's answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait for a connection to the target.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Sends a remote child's buckets to its target, as async calls that hold no thread while
/// the target takes its time.
pub(crate) struct RemoteSender {
    target: RemoteTarget,
    /// Names where the copies come from in their origin header.
    source: String,
    /// The client for the target's cluster, or why it could not be built (every send then
    /// fails with it, permanently).
    client: Result<reqwest::Client, reqwest::Error>,
    /// The token read from the target's token file; read again after a 401 or 403.
    token: Mutex<Option<String>>,
    /// Told the bytes of each acknowledged request, or `None` for one that was not.
    on_sent: Box<SentHook>,
    /// Sends the produces (with the downgrade for a target from before null values).
    produce: ProduceSender,
}

/// What a [`RemoteSender`] tells about each request: the bytes the target acknowledged, or
/// `None` when it did not acknowledge it.
pub(crate) type SentHook = dyn Fn(Option<u64>) + Send + Sync;

impl std::fmt::Debug for RemoteSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSender")
            .field("url", &self.target.url)
            .field("topic", &self.target.topic)
            .finish_non_exhaustive()
    }
}

impl RemoteSender {
    /// A sender to `target`, naming `source` in each copy's origin header, telling `on_sent`
    /// about every request (the cursor's metrics).
    pub(crate) fn new(
        target: RemoteTarget,
        source: String,
        on_sent: Box<SentHook>,
    ) -> RemoteSender {
        // A CA file that cannot be read leaves the system's roots alone: the target's
        // certificate is then refused, and the commit error says so.
        let roots = match target.ca_file.as_deref() {
            Some(file) => {
                crate::tls::client_roots(std::path::Path::new(file)).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "remote child: its CA file cannot be used");
                    Vec::new()
                })
            }
            None => Vec::new(),
        };
        let client = crate::peer::remote::client(&roots, CONNECT_TIMEOUT, REQUEST_TIMEOUT);
        let token = read_token(target.token_file.as_deref()).ok().flatten();
        RemoteSender {
            target,
            source,
            client,
            token: Mutex::new(token),
            on_sent,
            produce: ProduceSender::new("remote target"),
        }
    }

    fn error(&self, partition: &PartitionId, reason: String, permanent: bool) -> ChildCommitError {
        ChildCommitError::Remote {
            partition: partition.clone(),
            target: format!("{}/v1/topics/{}", self.target.url, self.target.topic),
            reason,
            permanent,
            retry_after: None,
        }
    }

    /// The bucket's records in the target's format, in order.
    fn wire_records(
        &self,
        partition: &PartitionId,
        batch: &ChildBatch,
    ) -> Result<Vec<(ProduceRecordJson, usize)>, ChildCommitError> {
        let decoded = batch
            .records()
            .map_err(|source| ChildCommitError::Undecodable {
                partition: partition.clone(),
                source,
            })?;
        let origin = decoded
            .origin
            .as_ref()
            .ok_or_else(|| ChildCommitError::NoProvenance {
                partition: partition.clone(),
            })?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let epoch: String = origin.epoch.iter().map(|b| format!("{b:02x}")).collect();
        let mut out = Vec::with_capacity(decoded.records.len());
        for (record, parent_offset) in decoded.records.iter().zip(&origin.parent_offsets) {
            let mut headers: Vec<HeaderJson> = record
                .headers
                .iter()
                .map(|h| HeaderJson {
                    name: h.name.clone(),
                    value: None,
                    value_b64: Some(b64.encode(&h.value)),
                })
                .collect();
            headers.push(HeaderJson {
                name: ORIGIN_HEADER.to_owned(),
                value: Some(format!(
                    "{}/{epoch}/{}/{parent_offset}",
                    self.source, origin.parent_partition
                )),
                value_b64: None,
            });
            let size = record.key.as_ref().map_or(0, |k| k.len())
                + record.value.as_ref().map_or(0, |v| v.len())
                + record
                    .headers
                    .iter()
                    .map(|h| h.name.len() + h.value.len())
                    .sum::<usize>();
            out.push((
                ProduceRecordJson {
                    key_b64: record.key.as_ref().map(|k| b64.encode(k)),
                    // A null value goes as JSON `null`.
                    value: record.value.is_none().then_some(None),
                    value_b64: record.value.as_ref().map(|v| b64.encode(v)),
                    headers: Some(HeadersJson::List(headers)),
                    partition: Some(partition.partition),
                    ..ProduceRecordJson::default()
                },
                size,
            ));
        }
        Ok(out)
    }

    /// [`RemoteSender::send`], telling the hook what it came to.
    async fn send_counted(
        &self,
        partition: &PartitionId,
        request: &ProduceRequest,
        bytes: usize,
    ) -> Result<(), ChildCommitError> {
        let sent = self.send(partition, request).await;
        (self.on_sent)(sent.is_ok().then_some(bytes as u64));
        sent
    }

    /// Sends one request of records; `Ok` when the target acknowledged every one.
    async fn send(
        &self,
        partition: &PartitionId,
        request: &ProduceRequest,
    ) -> Result<(), ChildCommitError> {
        let client = self.client.as_ref().map_err(|why| {
            self.error(
                partition,
                format!(
                    "cannot build the HTTP client for the target: {}",
                    crate::tls::error_chain(why)
                ),
                true,
            )
        })?;
        let url = format!(
            "{}/v1/topics/{}/records",
            self.target.url, self.target.topic
        );
        for attempt in 0..2 {
            let token = self
                .token
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let answer = self
                .produce
                .send(&url, request, || {
                    let call = client.post(&url);
                    match &token {
                        Some(token) => call.bearer_auth(token),
                        None => call,
                    }
                })
                .await
                .map_err(|e| self.error(partition, format!("no answer: {e}"), false))?;
            let status = answer.status;
            let reason = || format!("{status}: {}", answer.error_message());
            match status.as_u16() {
                200..=299 => {
                    return self.check_acknowledged(partition, request.records.len(), &answer.body);
                }
                // The token may have been rotated: read the file once more before giving up.
                401 | 403 if attempt == 0 && self.target.token_file.is_some() => {
                    let fresh = read_token(self.target.token_file.as_deref())
                        .map_err(|e| self.error(partition, e.to_string(), true))?;
                    *self.token.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
                }
                429 | 500..=599 => {
                    let mut error = self.error(partition, reason(), false);
                    if let ChildCommitError::Remote { retry_after, .. } = &mut error {
                        *retry_after = answer.retry_after.as_ref().and_then(retry_after_secs);
                    }
                    return Err(error);
                }
                _ => return Err(self.error(partition, reason(), true)),
            }
        }
        Err(self.error(
            partition,
            "the target refused the token, read again from its file".to_owned(),
            true,
        ))
    }

    /// An answer counts as an acknowledgement only if it places every record sent.
    fn check_acknowledged(
        &self,
        partition: &PartitionId,
        sent: usize,
        body: &[u8],
    ) -> Result<(), ChildCommitError> {
        let placed = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["offsets"].as_array().map(Vec::len));
        match placed {
            Some(n) if n == sent => Ok(()),
            other => Err(self.error(
                partition,
                format!(
                    "the target answered for {} of {sent} records; not taken as an acknowledgement",
                    other.map_or_else(|| "none".to_owned(), |n| n.to_string())
                ),
                false,
            )),
        }
    }
}

impl RemoteSender {
    /// Sends the records of one batch (in the target's format) in order, one request after
    /// another, so the target stores them in slab order.
    async fn send_batch(
        &self,
        partition: &PartitionId,
        records: Vec<(ProduceRecordJson, usize)>,
    ) -> Result<(), ChildCommitError> {
        let mut chunk = ProduceRequest::default();
        let mut bytes = 0usize;
        for (record, size) in records {
            if !chunk.records.is_empty()
                && (chunk.records.len() >= MAX_RECORDS_PER_REQUEST
                    || bytes + size > MAX_BYTES_PER_REQUEST)
            {
                self.send_counted(partition, &chunk, bytes).await?;
                chunk.records.clear();
                bytes = 0;
            }
            bytes += size;
            chunk.records.push(record);
        }
        if !chunk.records.is_empty() {
            self.send_counted(partition, &chunk, bytes).await?;
        }
        Ok(())
    }

    /// [`ChildCommitter::commit_in_order`] of an owned sender: the batches are put in the
    /// target's format on the blocking pool (CPU), then sent one after another.
    async fn commit_owned(
        self: Arc<Self>,
        partition: PartitionId,
        batches: Vec<ChildBatch>,
    ) -> InOrderCommit {
        let me = Arc::clone(&self);
        let converted = crate::blocking::run(move || {
            let wire: Vec<_> = batches
                .iter()
                .map(|batch| me.wire_records(&partition, batch))
                .collect();
            (batches, partition, wire)
        })
        .await;
        let (batches, partition, wire) = match converted {
            Ok(converted) => converted,
            Err(error) => return InOrderCommit::task_failed(error),
        };
        for (durable, records) in wire.into_iter().enumerate() {
            let sent = match records {
                Ok(records) => self.send_batch(&partition, records).await,
                Err(error) => Err(error),
            };
            if let Err(error) = sent {
                return InOrderCommit {
                    batches,
                    result: Err(InOrderFailure { durable, error }),
                };
            }
        }
        InOrderCommit {
            batches,
            result: Ok(()),
        }
    }
}

impl ChildCommitter for RemoteSender {
    fn commit_in_order(
        self: Arc<Self>,
        partition: PartitionId,
        batches: Vec<ChildBatch>,
    ) -> CommitFuture {
        Box::pin(self.commit_owned(partition, batches))
    }
}

/// The wait a `Retry-After` header asks for, in its delta-seconds form (the HTTP-date form is
/// not used by narad and is ignored), at most [`crate::fanout::REMOTE_BACKOFF_MAX`].
fn retry_after_secs(value: &reqwest::header::HeaderValue) -> Option<Duration> {
    let seconds: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(crate::fanout::REMOTE_BACKOFF_MAX))
}

/// A remote child's token file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the token file {file}: {source}")]
struct TokenFileError {
    file: String,
    source: std::io::Error,
}

/// The token in `file` (trimmed), `None` without a file.
fn read_token(file: Option<&str>) -> Result<Option<String>, TokenFileError> {
    let Some(file) = file else {
        return Ok(None);
    };
    std::fs::read_to_string(file)
        .map(|t| Some(t.trim().to_owned()))
        .map_err(|source| TokenFileError {
            file: file.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests;
