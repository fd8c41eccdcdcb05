//! Produce: each partition's record batch is checked whole, then committed through
//! [`crate::produce::Producer::commit`], the commit path of the HTTP produce (append +
//! `fdatasync` + verify). That happens for every `acks` value: `acks = 0` and `1` are
//! answered (or, for 0, not answered) only once the batch is durable, like `acks = all`.
//!
//! The client chose the partition (Kafka's default partitioner is the murmur2 hash narad
//! places keyed records with), so a record lands where the HTTP produce would put it.
//! Partitions of one request commit concurrently; each partition's answer is its own.
//!
//! What one request can make the daemon spend is bounded by the request, not by what its
//! batches claim: a partition named twice is refused (`INVALID_REQUEST`), so nothing is
//! decoded or written twice; the batches of a request decompress, one after another, to at
//! most `max-request-bytes` together (past that, `MESSAGE_TOO_LARGE`); decoding runs on the
//! blocking pool, [`DECODE_SLOTS`] requests at a time, never on the async workers that serve
//! every other client (unless the request's batches are uncompressed and together at most
//! [`IN_PLACE_DECODE_BYTES`]: a walk over bytes already read, cheaper than the hand-off); and
//! the decompressed bytes are held against `max-buffered-request-bytes`, like the request's
//! own, until the request is answered.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::protocol::StrBytes;
use narad_storage::{AppendBatch, PartitionId, ProducerStamp, StorageError};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

use super::KafkaDeps;
use super::idempotence::{CachedBatch, Verdict, last_sequence};
use super::records::{BatchError, BatchLimits, ProducedBatch, decode_produced, decodes_in_place};

/// Answers a Produce request; `None` for `acks = 0`, which gets no answer.
pub(crate) async fn handle(
    deps: &Arc<KafkaDeps>,
    request: ProduceRequest,
    version: i16,
) -> Option<ProduceResponse> {
    let with_message = version >= FIRST_ERROR_MESSAGE_VERSION;
    let acks = request.acks;
    let refuse_all = if !matches!(acks, -1..=1) {
        Some((
            ResponseError::InvalidRequiredAcks,
            "acks must be -1, 0 or 1",
        ))
    } else if request
        .transactional_id
        .as_ref()
        .is_some_and(|id| !id.0.is_empty())
    {
        Some((
            ResponseError::InvalidRequest,
            "transactions are not supported",
        ))
    } else {
        None
    };
    let limits = BatchLimits {
        max_records: deps.limits.max_batch_records as usize,
        max_record_bytes: usize::try_from(deps.limits.max_record_bytes).unwrap_or(usize::MAX),
        max_decompressed_bytes: decompressed_cap(&deps.limits),
    };

    let mut response = ProduceResponse::default();
    let mut jobs = Vec::new();
    let mut named = HashSet::new();
    for (t, topic_data) in request.topic_data.into_iter().enumerate() {
        let mut topic = TopicProduceResponse::default();
        topic.name = topic_data.name.clone();
        let name = topic_data.name.0.to_string();
        // The topic and the links into it, looked up by name: a cost that does not grow with
        // the number of topics (a whole snapshot per request did).
        let looked_up = match deps.metastore.topic(&name).await {
            // A fan-out child holds only what its cursors copy, unless the topic lets
            // producers write to it.
            Ok(Some(meta)) if !meta.writable_as_child => deps
                .metastore
                .parents_of(&name)
                .await
                .map(|parents| (Some(meta), parents.into_iter().next())),
            Ok(meta) => Ok((meta, None)),
            Err(e) => Err(e),
        };
        let (meta, child_of, metastore_error) = match looked_up {
            Ok((meta, child_of)) => (meta, child_of, None),
            Err(e) => (None, None, Some(e)),
        };
        for (p, data) in topic_data.partition_data.into_iter().enumerate() {
            let mut answer = PartitionProduceResponse::default();
            answer.index = data.index;
            topic.partition_responses.push(answer);
            let refused = if let Some((error, message)) = refuse_all {
                Some((error, message.to_owned()))
            } else if !named.insert((name.clone(), data.index)) {
                Some((
                    ResponseError::InvalidRequest,
                    format!(
                        "partition {} of topic {name} is named more than once in one request",
                        data.index
                    ),
                ))
            } else if let Some(e) = &metastore_error {
                Some((ResponseError::UnknownServerError, format!("metastore: {e}")))
            } else if crate::topics::is_internal(&name) {
                Some((
                    ResponseError::TopicAuthorizationFailed,
                    format!("topic {name} is internal to narad: only the daemon writes to it"),
                ))
            } else if let Some(parent) = &child_of {
                Some((
                    ResponseError::TopicAuthorizationFailed,
                    format!(
                        "topic {name} is a fan-out child of {parent}: only its cursors write to \
                         it (PATCH /v1/topics/{name} with writable_as_child to allow producers)"
                    ),
                ))
            } else {
                match (&meta, u32::try_from(data.index)) {
                    (Some(meta), Ok(index)) if index < meta.partitions => {
                        let id = PartitionId::new(name.clone(), index);
                        if deps.ownership.is_local(&id) {
                            jobs.push(Job {
                                t,
                                p,
                                id,
                                records: data.records.unwrap_or_default(),
                            });
                            None
                        } else {
                            Some((
                                ResponseError::NotLeaderOrFollower,
                                format!("{id} is not served by this node"),
                            ))
                        }
                    }
                    _ => Some((
                        ResponseError::UnknownTopicOrPartition,
                        format!("no partition {} of topic {name}", data.index),
                    )),
                }
            };
            if let Some((error, message)) = refused {
                set_error(
                    topic.partition_responses.last_mut(),
                    error,
                    message,
                    with_message,
                );
            }
        }
        response.responses.push(topic);
    }

    let (decoded, _held) = decode_all(deps, jobs, limits).await;
    let mut batches = Vec::with_capacity(decoded.len());
    for (t, p, id, batch) in decoded {
        match batch {
            Ok(batch) => {
                // Until its commit reports, the batch counts as failed: a commit task that
                // panics must not leave the default answer (no error, offset 0) standing.
                if let Some(answer) = response
                    .responses
                    .get_mut(t)
                    .and_then(|topic| topic.partition_responses.get_mut(p))
                {
                    answer.error_code = ResponseError::UnknownServerError.code();
                    answer.base_offset = -1;
                }
                batches.push((t, p, id, batch));
            }
            Err((error, message)) => {
                let answer = response
                    .responses
                    .get_mut(t)
                    .and_then(|topic| topic.partition_responses.get_mut(p));
                set_error(answer, error, message, with_message);
            }
        }
    }
    let mut results = Vec::with_capacity(batches.len());
    if batches.len() == 1 {
        // The common request (one partition) commits in this task: a task of its own would
        // only add a spawn and a wake-up.
        if let Some((t, p, id, batch)) = batches.pop() {
            results.push((t, p, produce_partition(deps, id, batch).await));
        }
    } else {
        let mut tasks = JoinSet::new();
        for (t, p, id, batch) in batches {
            let deps = Arc::clone(deps);
            tasks.spawn(async move { (t, p, produce_partition(&deps, id, batch).await) });
        }
        while let Some(joined) = tasks.join_next().await {
            // A panicked task: its partition keeps the error set above.
            if let Ok(result) = joined {
                results.push(result);
            }
        }
    }
    for (t, p, result) in results {
        let Some(answer) = response
            .responses
            .get_mut(t)
            .and_then(|topic| topic.partition_responses.get_mut(p))
        else {
            continue;
        };
        match result {
            Ok(done) => {
                answer.error_code = 0;
                answer.error_message = None;
                answer.base_offset = i64::try_from(done.base_offset).unwrap_or(i64::MAX);
                answer.log_append_time_ms = done.committed_at_ms;
            }
            Err((error, message)) => set_error(Some(answer), error, message, with_message),
        }
    }
    (acks != 0).then_some(response)
}

/// Most bytes the batches of one request may decompress to together: `max-request-bytes`,
/// and never more than what `max-buffered-request-bytes` leaves beside the largest request
/// (both are held at once, so a request alone always fits).
pub(crate) fn decompressed_cap(limits: &crate::config::Limits) -> usize {
    let request = usize::try_from(limits.max_request_bytes).unwrap_or(usize::MAX);
    let budget = super::buffered_capacity(limits);
    request.min(budget.saturating_sub(request.min(budget)))
}

/// Requests whose batches decode (decompress) at once, each on the blocking pool: the bound
/// on decompression's CPU and transient memory, whatever the number of connections.
pub(crate) const DECODE_SLOTS: usize = 2;

/// One partition's batch of a request, to decode and commit.
struct Job {
    /// Index of its topic in the answer, and of the partition within it.
    t: usize,
    p: usize,
    id: PartitionId,
    records: Bytes,
}

/// Record bytes of a request up to which its uncompressed batches are decoded on the async
/// worker that read it rather than on the blocking pool (see [`decodes_in_place`]).
pub(crate) const IN_PLACE_DECODE_BYTES: usize = 64 * 1024;

/// A job's batch, decoded or refused.
type Decoded = (
    usize,
    usize,
    PartitionId,
    Result<ProducedBatch, (ResponseError, String)>,
);

/// Decodes each job's batch in turn; together they may decompress to at most
/// `limits.max_decompressed_bytes`.
fn decode_jobs(jobs: Vec<Job>, limits: BatchLimits) -> Vec<Decoded> {
    let mut left = limits.max_decompressed_bytes;
    jobs.into_iter()
        .map(|job| {
            let limits = BatchLimits {
                max_decompressed_bytes: left,
                ..limits
            };
            let batch = decode_produced(job.records, &limits).map_err(|e| {
                let message = match e {
                    BatchError::TooLarge(_) => format!(
                        "{e} (a request's batches may decompress to {} bytes together: \
                         max-request-bytes)",
                        limits.max_decompressed_bytes
                    ),
                    _ => e.to_string(),
                };
                (e.error(), message)
            });
            if let Ok(batch) = &batch {
                left = left.saturating_sub(batch.decompressed_bytes);
            }
            (job.t, job.p, job.id, batch)
        })
        .collect()
}

/// Decodes every job's batch, one after another on the blocking pool, holding a decode slot
/// (in place, without either, when they are small and uncompressed);
/// together they may decompress to at most `limits.max_decompressed_bytes`. Returns the
/// batches and the permits their decompressed bytes hold in the buffered-bytes budget (kept
/// until the request is answered).
async fn decode_all(
    deps: &KafkaDeps,
    jobs: Vec<Job>,
    limits: BatchLimits,
) -> (Vec<Decoded>, Option<OwnedSemaphorePermit>) {
    if jobs.is_empty() {
        return (Vec::new(), None);
    }
    let in_place = jobs.iter().map(|j| j.records.len()).sum::<usize>() <= IN_PLACE_DECODE_BYTES
        && jobs.iter().all(|j| decodes_in_place(&j.records));
    if in_place {
        // A few kilobytes of uncompressed records decode in microseconds: cheaper than the
        // two thread hand-offs of the blocking pool, which every small request paid. They
        // decompress to nothing, so they hold nothing more of the buffered-bytes budget.
        return (decode_jobs(jobs, limits), None);
    }
    let refuse_all = |jobs: Vec<Job>, error: ResponseError, message: String| {
        jobs.into_iter()
            .map(|job| (job.t, job.p, job.id, Err((error, message.clone()))))
            .collect()
    };
    let named: Vec<(usize, usize, PartitionId)> =
        jobs.iter().map(|j| (j.t, j.p, j.id.clone())).collect();
    let Ok(_slot) = Arc::clone(&deps.decode_slots).acquire_owned().await else {
        return (
            refuse_all(
                jobs,
                ResponseError::RequestTimedOut,
                "shutting down".to_owned(),
            ),
            None,
        );
    };
    let decoded = match crate::blocking::run(move || decode_jobs(jobs, limits)).await {
        Ok(decoded) => decoded,
        Err(e) => {
            tracing::error!(error = %e, "kafka produce: decode task failed");
            let message = format!("decoding failed inside the daemon: {e}");
            let failed = named
                .into_iter()
                .map(|(t, p, id)| {
                    (
                        t,
                        p,
                        id,
                        Err((ResponseError::UnknownServerError, message.clone())),
                    )
                })
                .collect();
            return (failed, None);
        }
    };
    let bytes: usize = decoded
        .iter()
        .filter_map(|(_, _, _, b)| b.as_ref().ok().map(|b| b.decompressed_bytes))
        .sum();
    if bytes == 0 {
        return (decoded, None);
    }
    // Held like the request's own bytes; the slot is kept while waiting, so at most
    // DECODE_SLOTS decoded requests wait for room.
    let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
    let held = tokio::time::timeout(
        super::TRANSFER_TIMEOUT,
        Arc::clone(&deps.buffered).acquire_many_owned(permits),
    )
    .await;
    match held {
        Ok(Ok(permit)) => (decoded, Some(permit)),
        _ => {
            let message = format!(
                "the {bytes} decompressed bytes of this request found no room in \
                 max-buffered-request-bytes in time; retry"
            );
            let refused = decoded
                .into_iter()
                .map(|(t, p, id, _)| {
                    (
                        t,
                        p,
                        id,
                        Err((ResponseError::RequestTimedOut, message.clone())),
                    )
                })
                .collect();
            (refused, None)
        }
    }
}

/// Produce v8 is where a partition's answer carries an error message.
const FIRST_ERROR_MESSAGE_VERSION: i16 = 8;

fn set_error(
    answer: Option<&mut PartitionProduceResponse>,
    error: ResponseError,
    message: String,
    with_message: bool,
) {
    tracing::debug!(error = ?error, %message, "kafka produce refused a partition's batch");
    if let Some(answer) = answer {
        answer.error_code = error.code();
        answer.base_offset = -1;
        if with_message {
            answer.error_message = Some(StrBytes::from_string(message));
        }
    }
}

/// Where a committed (or already committed) batch landed.
struct Done {
    base_offset: u64,
    committed_at_ms: i64,
}

async fn produce_partition(
    deps: &KafkaDeps,
    id: PartitionId,
    batch: ProducedBatch,
) -> Result<Done, (ResponseError, String)> {
    if batch.producer_id < 0 {
        return commit(deps, id, batch).await;
    }
    let ProducedBatch {
        producer_id,
        producer_epoch,
        base_sequence,
        ..
    } = batch;
    let count = batch.records.len();
    deps.idempotence
        .learn_from_log(&deps.store, &id)
        .await
        .map_err(|reason| (ResponseError::KafkaStorageError, reason))?;
    let entry = deps.idempotence.entry(producer_id, &id);
    let mut state = entry.lock().await;
    match state.check(producer_epoch, base_sequence, count) {
        Verdict::Append => {
            let done = commit(deps, id, batch).await?;
            state.record(
                producer_epoch,
                CachedBatch {
                    first_sequence: base_sequence,
                    last_sequence: last_sequence(base_sequence, count),
                    base_offset: done.base_offset,
                    committed_at_ms: done.committed_at_ms,
                },
            );
            Ok(done)
        }
        Verdict::Duplicate(original) => {
            tracing::debug!(partition = %id, producer_id, base_sequence, "kafka: duplicate batch answered with its original offsets");
            Ok(Done {
                base_offset: original.base_offset,
                committed_at_ms: original.committed_at_ms,
            })
        }
        Verdict::OutOfOrder { expected } => Err((
            ResponseError::OutOfOrderSequenceNumber,
            format!(
                "producer {producer_id} sent sequence {base_sequence} to {id}; expected {expected}"
            ),
        )),
        Verdict::StaleEpoch { current } => Err((
            ResponseError::InvalidProducerEpoch,
            format!("producer {producer_id} epoch {producer_epoch} is older than {current}"),
        )),
    }
}

async fn commit(
    deps: &KafkaDeps,
    id: PartitionId,
    batch: ProducedBatch,
) -> Result<Done, (ResponseError, String)> {
    let topic = id.topic.clone();
    let committed = if batch.producer_id >= 0 {
        let stamp = ProducerStamp {
            producer_id: batch.producer_id,
            epoch: batch.producer_epoch,
            base_sequence: batch.base_sequence,
        };
        deps.producer.commit_stamped(id, batch.records, stamp).await
    } else {
        deps.producer
            .commit(
                id,
                AppendBatch {
                    records: batch.records,
                    origin: None,
                },
            )
            .await
    };
    let appended = committed.map_err(|e| {
        // A partition being moved, or a node that lost etcd: the client looks the leader
        // up again and retries.
        let sealed = matches!(
            &e,
            crate::produce::ProduceError::Fenced(_)
                | crate::produce::ProduceError::Unavailable(StorageError::Sealed { .. })
                | crate::produce::ProduceError::Append {
                    source: StorageError::Sealed { .. },
                    ..
                }
        );
        let code = if sealed {
            ResponseError::NotLeaderOrFollower
        } else {
            ResponseError::KafkaStorageError
        };
        (code, e.to_string())
    })?;
    deps.metrics.produced(&topic, u64::from(appended.count));
    Ok(Done {
        base_offset: appended.base_offset,
        committed_at_ms: appended.committed_at_ms,
    })
}
