//! Produce: each partition's record batch is checked whole, then committed through
//! [`crate::produce::Producer::commit`], the commit path of the HTTP produce (append +
//! `fdatasync` + verify). That happens for every `acks` value: `acks = 0` and `1` are
//! answered (or, for 0, not answered) only once the batch is durable, like `acks = all`.
//!
//! The client chose the partition (Kafka's default partitioner is the murmur2 hash narad
//! places keyed records with), so a record lands where the HTTP produce would put it.
//! Partitions of one request commit concurrently; each partition's answer is its own.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::protocol::StrBytes;
use narad_storage::{AppendBatch, PartitionId, ProducerStamp, StorageError};
use tokio::task::JoinSet;

use super::KafkaDeps;
use super::idempotence::{CachedBatch, Verdict, last_sequence};
use super::records::{BatchLimits, ProducedBatch, decode_produced};

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
    let snapshot = deps.metastore.snapshot().await;
    let limits = BatchLimits {
        max_records: deps.limits.max_batch_records as usize,
        max_record_bytes: usize::try_from(deps.limits.max_record_bytes).unwrap_or(usize::MAX),
        max_decompressed_bytes: usize::try_from(deps.limits.max_request_bytes)
            .unwrap_or(usize::MAX),
    };

    let mut response = ProduceResponse::default();
    let mut tasks = JoinSet::new();
    for (t, topic_data) in request.topic_data.into_iter().enumerate() {
        let mut topic = TopicProduceResponse::default();
        topic.name = topic_data.name.clone();
        let name = topic_data.name.0.to_string();
        let meta = match &snapshot {
            Ok(snapshot) => snapshot.topics.get(&name).cloned(),
            Err(_) => None,
        };
        for (p, data) in topic_data.partition_data.into_iter().enumerate() {
            let mut answer = PartitionProduceResponse::default();
            answer.index = data.index;
            topic.partition_responses.push(answer);
            let refused = if let Some((error, message)) = refuse_all {
                Some((error, message.to_owned()))
            } else if let Err(e) = &snapshot {
                Some((ResponseError::UnknownServerError, format!("metastore: {e}")))
            } else {
                match (&meta, u32::try_from(data.index)) {
                    (Some(meta), Ok(index)) if index < meta.partitions => {
                        let id = PartitionId::new(name.clone(), index);
                        if deps.ownership.is_local(&id) {
                            let deps = Arc::clone(deps);
                            let records = data.records.unwrap_or_default();
                            tasks.spawn(async move {
                                let result = produce_partition(&deps, id, records, &limits).await;
                                (t, p, result)
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
    while let Some(joined) = tasks.join_next().await {
        let Ok((t, p, result)) = joined else {
            // A panicked task: its partition keeps the error set below.
            continue;
        };
        let Some(answer) = response
            .responses
            .get_mut(t)
            .and_then(|topic| topic.partition_responses.get_mut(p))
        else {
            continue;
        };
        match result {
            Ok(done) => {
                answer.base_offset = i64::try_from(done.base_offset).unwrap_or(i64::MAX);
                answer.log_append_time_ms = done.committed_at_ms;
            }
            Err((error, message)) => set_error(Some(answer), error, message, with_message),
        }
    }
    (acks != 0).then_some(response)
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
    records: Bytes,
    limits: &BatchLimits,
) -> Result<Done, (ResponseError, String)> {
    let batch = decode_produced(records, limits).map_err(|e| (e.error(), e.to_string()))?;
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
