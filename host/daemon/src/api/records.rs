//! Record endpoints: produce a batch, fetch from an offset (with an optional long-poll).
//!
//! Produce validates the whole request before anything is written: one bad record rejects the
//! batch and no partition changes.
//!
//! In cluster mode a partition another node owns is served through [`super::forward`]: produce
//! hands the request over once its records are placed, fetch once its partition is known.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use narad_storage::{Header, NewRecord, PartitionId, ReadOptions, ReadResult, StorageError};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::topics::require_topic;
use super::types::{
    FetchResponse, HeadersJson, OffsetJson, OriginJson, ProduceRecordJson, ProduceRequest,
    ProduceResponse, RecordJson,
};
use crate::config::Limits;
use crate::produce::ProduceRecord;

/// Records a fetch returns when the request gives no `max`.
pub(crate) const DEFAULT_FETCH_MAX_RECORDS: u32 = 500;

/// `POST /v1/topics/{t}/records`.
pub(crate) async fn produce(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiPath(topic_name): ApiPath<String>,
    ApiJson(req): ApiJson<ProduceRequest>,
) -> Result<Response, ApiError> {
    let topic = require_topic(&state, &topic_name).await?;
    super::topic_config::require_writable(&state, &topic).await?;
    let mut records = decode_batch(req, topic.partitions, &topic.name, &state.limits)?;
    // Place every record now so ownership is checked for each target partition.
    let placement = state
        .producer
        .place(&topic.name, topic.partitions, &records);
    for (record, &p) in records.iter_mut().zip(&placement) {
        record.partition = Some(p);
    }
    // Cluster mode: a partition this node owns but has not registered yet (the metadata copy
    // showed it a moment ago) is registered now, not refused.
    let targets: std::collections::BTreeSet<u32> = placement.iter().copied().collect();
    for &p in &targets {
        state.topics.ensure_owned(&topic, p).await?;
    }
    // Every owner is checked before anything is written: 421 for a partition this node may
    // not serve, 503 for one whose owner is down; records for other live owners are forwarded.
    match super::forward::split_produce(&state, &headers, &topic.name, &placement) {
        super::forward::ProduceRoute::Refused(refusal) => return Ok(refusal),
        super::forward::ProduceRoute::Forward(split) => {
            return Ok(split
                .run(
                    &state,
                    &headers,
                    &topic.name,
                    topic.partitions,
                    records,
                    &placement,
                )
                .await);
        }
        super::forward::ProduceRoute::Local => {}
    }
    let bytes: u64 = records
        .iter()
        .map(|r| r.record.payload_bytes() as u64)
        .sum();
    let placed = match state
        .producer
        .produce(&topic.name, topic.partitions, records)
        .await
    {
        Ok(placed) => placed,
        // Which partitions were committed, and where each record was placed: a client
        // retries exactly the records that were not stored.
        Err(e) => return Ok(super::forward::local_failure(e, &[], &placement)),
    };
    state
        .api_metrics
        .produced(&topic.name, placed.len() as u64, bytes);
    Ok(Json(ProduceResponse {
        offsets: placed
            .into_iter()
            .map(|p| OffsetJson {
                partition: p.partition,
                offset: p.offset,
            })
            .collect(),
    })
    .into_response())
}

/// The `421` for a partition this node does not serve (and may not forward to its owner).
pub(super) fn not_owned(state: &AppState, id: &PartitionId) -> ApiError {
    let owner = state
        .ownership
        .owner(id)
        .map_or_else(|| "no node".to_owned(), |n| format!("node {n}"));
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        format!("partition {id} is served by {owner}, not by this node"),
    )
}

/// Validates and decodes a whole produce request.
pub(crate) fn decode_batch(
    req: ProduceRequest,
    partitions: u32,
    topic: &str,
    limits: &Limits,
) -> Result<Vec<ProduceRecord>, ApiError> {
    if req.records.is_empty() {
        return Err(ApiError::bad_request(
            "\"records\" is empty: send at least one record",
        ));
    }
    if req.records.len() > limits.max_batch_records as usize {
        return Err(ApiError::too_large(format!(
            "{} records in one request; the limit is {} (max-batch-records): split the batch",
            req.records.len(),
            limits.max_batch_records
        )));
    }
    req.records
        .into_iter()
        .enumerate()
        .map(|(i, r)| decode_record(i, r, partitions, topic, limits))
        .collect()
}

fn decode_record(
    i: usize,
    r: ProduceRecordJson,
    partitions: u32,
    topic: &str,
    limits: &Limits,
) -> Result<ProduceRecord, ApiError> {
    let bad = |what: String| ApiError::bad_request(format!("records[{i}]: {what}"));
    let key = match (r.key, r.key_b64) {
        (Some(_), Some(_)) => return Err(bad("give \"key\" or \"key_b64\", not both".into())),
        (Some(k), None) => Some(Bytes::from(k)),
        (None, Some(b)) => Some(decode_b64(&b).map_err(|e| bad(format!("\"key_b64\" {e}")))?),
        (None, None) => None,
    };
    let value = match (r.value, r.value_b64) {
        (Some(_), Some(_)) => {
            return Err(bad("give \"value\" or \"value_b64\", not both".into()));
        }
        (Some(v), None) => v.map(Bytes::from),
        (None, Some(b)) => Some(decode_b64(&b).map_err(|e| bad(format!("\"value_b64\" {e}")))?),
        (None, None) => {
            return Err(bad(
                "\"value\" (text, or null for a null value) or \"value_b64\" (base64) is \
                 required"
                    .into(),
            ));
        }
    };
    let headers = match r.headers {
        None => Vec::new(),
        Some(HeadersJson::Map(map)) => map
            .into_iter()
            .map(|(name, value)| Header {
                name,
                value: Bytes::from(value),
            })
            .collect(),
        Some(HeadersJson::List(list)) => {
            list.into_iter()
                .enumerate()
                .map(|(j, h)| {
                    let value = match (h.value, h.value_b64) {
                        (Some(_), Some(_)) => {
                            return Err(bad(format!(
                                "headers[{j}]: give \"value\" or \"value_b64\", not both"
                            )));
                        }
                        (Some(v), None) => Bytes::from(v),
                        (None, Some(b)) => decode_b64(&b)
                            .map_err(|e| bad(format!("headers[{j}].value_b64 {e}")))?,
                        (None, None) => {
                            return Err(bad(format!(
                                "headers[{j}]: \"value\" or \"value_b64\" is required"
                            )));
                        }
                    };
                    Ok(Header {
                        name: h.name,
                        value,
                    })
                })
                .collect::<Result<_, _>>()?
        }
    };
    if let Some(reserved) = headers
        .iter()
        .find(|h| crate::produce::is_reserved_header(&h.name))
    {
        return Err(bad(format!(
            "header {:?} is reserved: names starting with {:?} are narad's own (a copy's origin), \
             never a producer's",
            reserved.name,
            crate::produce::RESERVED_HEADER_PREFIX
        )));
    }
    if let Some(p) = r.partition
        && p >= partitions
    {
        return Err(bad(format!(
            "partition {p} does not exist: topic {topic} has {partitions} partitions (0..={})",
            partitions - 1
        )));
    }
    let record = NewRecord {
        key,
        headers,
        value,
    };
    let size = record.payload_bytes();
    if size as u64 > limits.max_record_bytes {
        return Err(ApiError::too_large(format!(
            "records[{i}] is {size} bytes (key + value + headers); the limit is {} (max-record-bytes)",
            limits.max_record_bytes
        )));
    }
    Ok(ProduceRecord {
        partition: r.partition,
        record,
    })
}

fn decode_b64(text: &str) -> Result<Bytes, String> {
    B64.decode(text)
        .map(Bytes::from)
        .map_err(|e| format!("is not valid base64 (standard alphabet, padded): {e}"))
}

/// Query of a fetch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FetchQuery {
    /// First offset to return; absent means the log start.
    pub offset: Option<u64>,
    /// Most records to return (default 500, capped by max-fetch-records).
    pub max: Option<u32>,
    /// Long-poll: when nothing is at `offset` yet, wait up to this long for a commit.
    pub wait_ms: Option<u64>,
}

/// `GET /v1/topics/{t}/partitions/{p}/records?offset=&max=&wait_ms=`.
pub(crate) async fn fetch(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    ApiPath((topic_name, partition)): ApiPath<(String, u32)>,
    ApiQuery(query): ApiQuery<FetchQuery>,
) -> Result<Response, ApiError> {
    let topic = require_topic(&state, &topic_name).await?;
    if partition >= topic.partitions {
        return Err(ApiError::not_found(format!(
            "partition {partition} does not exist: topic {} has {} partitions (0..={})",
            topic.name,
            topic.partitions,
            topic.partitions - 1
        )));
    }
    let id = PartitionId::new(topic.name.clone(), partition);
    state.topics.ensure_owned(&topic, partition).await?;
    if !state.ownership.is_local(&id) {
        // Forwarded to the owner in cluster mode (421 on a single node, or when the request
        // was forwarded already).
        return Ok(super::forward::fetch(&state, &headers, &uri, &id).await);
    }
    let max = query.max.unwrap_or(DEFAULT_FETCH_MAX_RECORDS);
    if max == 0 {
        return Err(ApiError::bad_request("max must be at least 1"));
    }
    let max = max.min(state.limits.max_fetch_records) as usize;
    let max_bytes = usize::try_from(state.limits.max_fetch_bytes).unwrap_or(usize::MAX);
    let wait = Duration::from_millis(query.wait_ms.unwrap_or(0)).min(state.limits.max_wait);

    let offset = match query.offset {
        Some(o) => o,
        None => {
            let store = Arc::clone(&state.store);
            let peek_id = id.clone();
            blocking(move || store.peek(&peek_id))
                .await??
                .log_start_offset
        }
    };
    let mut result = read(&state, &id, offset, max, max_bytes, query.offset.is_none()).await?;
    if result.records.is_empty() && !wait.is_zero() && !state.shutdown.is_triggered() {
        let next = result.next_offset;
        let woke = tokio::select! {
            woke = state.store.wait_for_data(&id, next, wait) => woke?,
            () = state.shutdown.wait() => false,
        };
        if woke {
            result = read(&state, &id, next, max, max_bytes, false).await?;
        }
    }
    let bytes: usize = result
        .records
        .iter()
        .map(|r| {
            r.key.as_ref().map_or(0, |k| k.len())
                + r.value.as_ref().map_or(0, |v| v.len())
                + r.headers
                    .iter()
                    .map(|h| h.name.len() + h.value.len())
                    .sum::<usize>()
        })
        .sum();
    state
        .api_metrics
        .fetched(&topic.name, result.records.len() as u64, bytes as u64);
    Ok(Json(FetchResponse {
        records: result
            .records
            .into_iter()
            .map(|r| {
                let origin = r.origin.as_ref().map(OriginJson::from);
                RecordJson::from_parts(
                    r.offset,
                    r.key.as_deref(),
                    r.value.as_deref(),
                    r.headers.into_iter().map(|h| (h.name, h.value.to_vec())),
                    r.committed_at_ms,
                )
                .with_origin(origin)
            })
            .collect(),
        next_offset: result.next_offset,
        high_watermark: result.high_watermark,
        log_start_offset: result.log_start_offset,
    })
    .into_response())
}

/// Reads on the blocking pool. `from_start`: the offset was the log start a moment ago, so if
/// retention moved it meanwhile, read from the new start instead of failing.
async fn read(
    state: &AppState,
    id: &PartitionId,
    offset: u64,
    max_records: usize,
    max_bytes: usize,
    from_start: bool,
) -> Result<ReadResult, ApiError> {
    let opts = ReadOptions {
        offset,
        max_records,
        max_bytes,
        max_committed_at_ms: None,
    };
    let store = Arc::clone(&state.store);
    let read_id = id.clone();
    match blocking(move || store.read(&read_id, &opts)).await? {
        Err(StorageError::OffsetBelowLogStart { log_start, .. }) if from_start => {
            let store = Arc::clone(&state.store);
            let read_id = id.clone();
            let opts = ReadOptions {
                offset: log_start,
                max_records,
                max_bytes,
                max_committed_at_ms: None,
            };
            Ok(blocking(move || store.read(&read_id, &opts)).await??)
        }
        other => Ok(other?),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    crate::blocking::run(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("read task failed: {e}"),
        )
    })
}
