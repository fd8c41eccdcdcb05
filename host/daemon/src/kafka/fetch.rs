//! Fetch: parents and children alike, from any offset between log start and high watermark.
//!
//! The long-poll is the HTTP fetch's: when the partitions asked for hold fewer than
//! `min_bytes` of new records, the request waits on the store's append signal
//! (`Store::wait_for_data`, no polling) for up to `max_wait_ms` (capped by `max-wait-ms`),
//! and ends at once on shutdown. Sizes: `partition_max_bytes` per partition and `max_bytes`
//! for the whole answer, both capped by `max-fetch-bytes`; as in Kafka, the first partition
//! with records returns at least one record whatever the limits. The answer is charged what
//! it encodes to (record and batch overhead included, so records with empty values cost what
//! they send), and a partition named twice in one request is read once: the repeat is
//! answered `INVALID_REQUEST` with no records. Reading and encoding run on the blocking pool.
//!
//! Incremental fetch sessions (KIP-227) are refused the way the protocol allows: a request
//! that asks for a new session gets a full answer with session id 0 ("no session"), one that
//! names a session gets FETCH_SESSION_ID_NOT_FOUND, so clients fall back to full fetches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashSet;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::fetch_response::{
    FetchResponse, FetchableTopicResponse, PartitionData,
};
use narad_storage::{PartitionId, ReadOptions, ReadResult, StorageError, Store, StoredRecord};
use tokio::task::JoinSet;

use super::KafkaDeps;
use super::records::encode_fetched;

/// Fetch v7 is where sessions start.
const FIRST_SESSION_VERSION: i16 = 7;

/// Fetch v5 is where partitions carry their log start offset.
const FIRST_LOG_START_VERSION: i16 = 5;

/// One partition asked for.
struct Wanted {
    /// Index of its topic in the answer, and of the partition within it.
    t: usize,
    p: usize,
    id: PartitionId,
    offset: u64,
    max_bytes: usize,
}

/// Most bytes one record adds to an answer beyond its payload: length, attributes,
/// timestamp and offset deltas, key and value lengths and the header count, each at its
/// longest varint.
const RECORD_OVERHEAD_BYTES: usize = 36;

/// Most bytes one header adds beyond its name and value (their two lengths).
const HEADER_OVERHEAD_BYTES: usize = 10;

/// Bytes of a record batch's header (the v2 format's fixed 61).
const BATCH_OVERHEAD_BYTES: usize = 61;

/// What reading one partition gave.
enum Read {
    /// Its records, encoded as the answer carries them.
    Records(ReadResult, Bytes),
    Failed {
        error: ResponseError,
        high_watermark: i64,
        log_start_offset: i64,
    },
}

/// Answers a Fetch request.
pub(crate) async fn handle(
    deps: &Arc<KafkaDeps>,
    request: FetchRequest,
    version: i16,
) -> FetchResponse {
    let mut response = FetchResponse::default();
    if version >= FIRST_SESSION_VERSION {
        if request.session_id != 0 {
            response.error_code = ResponseError::FetchSessionIdNotFound.code();
            return response;
        }
        if request.session_epoch > 0 {
            response.error_code = ResponseError::InvalidFetchSessionEpoch.code();
            return response;
        }
    }
    let fetch_cap = usize::try_from(deps.limits.max_fetch_bytes).unwrap_or(usize::MAX);
    let mut wanted = Vec::new();
    let mut named: HashSet<(String, i32)> = HashSet::new();
    for (t, topic) in request.topics.into_iter().enumerate() {
        let mut answer = FetchableTopicResponse::default();
        answer.topic = topic.topic.clone();
        answer.topic_id = topic.topic_id;
        let name = topic.topic.0.to_string();
        // By name: a cost that does not grow with the number of topics (as a whole snapshot
        // per fetch did, and every consumer fetches in a loop).
        let meta = deps.metastore.topic(&name).await.ok().flatten();
        let meta = meta.as_ref();
        for (p, partition) in topic.partitions.into_iter().enumerate() {
            let mut data = PartitionData::default();
            data.partition_index = partition.partition;
            // Empty, never null, for a partition that fails too: librdkafka cannot parse a null
            // record set (`invalid MessageSetSize -1`) and would never reset its position.
            data.records = Some(Bytes::new());
            let index = u32::try_from(partition.partition).ok();
            if !named.insert((name.clone(), partition.partition)) {
                // Read once per request, whatever the request repeats.
                data.error_code = ResponseError::InvalidRequest.code();
                answer.partitions.push(data);
                continue;
            }
            match (meta, index) {
                (Some(meta), Some(index)) if index < meta.partitions => {
                    let id = PartitionId::new(name.clone(), index);
                    if !deps.ownership.is_local(&id) {
                        data.error_code = ResponseError::NotLeaderOrFollower.code();
                    } else if let Ok(offset) = u64::try_from(partition.fetch_offset) {
                        wanted.push(Wanted {
                            t,
                            p,
                            id,
                            offset,
                            max_bytes: usize::try_from(partition.partition_max_bytes)
                                .unwrap_or(0)
                                .clamp(1, fetch_cap),
                        });
                    } else {
                        data.error_code = ResponseError::OffsetOutOfRange.code();
                    }
                }
                _ => data.error_code = ResponseError::UnknownTopicOrPartition.code(),
            }
            answer.partitions.push(data);
        }
        response.responses.push(answer);
    }

    let total_cap = usize::try_from(request.max_bytes)
        .unwrap_or(0)
        .clamp(1, fetch_cap);
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
    let wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0))
        .min(deps.limits.max_wait);
    let deadline = Instant::now() + wait;
    let max_records = deps.limits.max_fetch_records as usize;
    let reads = loop {
        let reads = read_all(&deps.store, &wanted, total_cap, max_records).await;
        // A record counts at least one byte, so records with empty payloads still satisfy
        // `min_bytes = 1`, as their encoded form would.
        let (records, bytes) = reads.iter().fold((0usize, 0usize), |(n, b), r| match r {
            Read::Records(result, encoded) => (n + result.records.len(), b + encoded.len()),
            Read::Failed { .. } => (n, b),
        });
        let failed = reads.iter().any(|r| matches!(r, Read::Failed { .. }));
        let now = Instant::now();
        if wanted.is_empty()
            || min_bytes == 0
            || (records > 0 && bytes >= min_bytes)
            || failed
            || now >= deadline
            || deps.shutdown.is_triggered()
        {
            break reads;
        }
        let positions: Vec<(PartitionId, u64)> = wanted
            .iter()
            .zip(&reads)
            .map(|(w, r)| match r {
                Read::Records(result, _) => (w.id.clone(), result.next_offset),
                Read::Failed { .. } => (w.id.clone(), w.offset),
            })
            .collect();
        wait_for_any(deps, positions, deadline - now).await;
    };

    for (w, read) in wanted.iter().zip(reads) {
        let Some(data) = response
            .responses
            .get_mut(w.t)
            .and_then(|t| t.partitions.get_mut(w.p))
        else {
            continue;
        };
        match read {
            Read::Records(result, encoded) => {
                let high = i64::try_from(result.high_watermark).unwrap_or(i64::MAX);
                data.high_watermark = high;
                data.last_stable_offset = high;
                if version >= FIRST_LOG_START_VERSION {
                    data.log_start_offset = i64::try_from(result.log_start_offset).unwrap_or(0);
                }
                deps.metrics
                    .fetched(&w.id.topic, result.records.len() as u64);
                data.records = Some(encoded);
            }
            Read::Failed {
                error,
                high_watermark,
                log_start_offset,
            } => {
                data.error_code = error.code();
                data.high_watermark = high_watermark;
                data.last_stable_offset = high_watermark;
                if version >= FIRST_LOG_START_VERSION {
                    data.log_start_offset = log_start_offset;
                }
            }
        }
    }
    response
}

/// Reads every wanted partition on the blocking pool, within the answer's byte budget.
async fn read_all(
    store: &Arc<Store>,
    wanted: &[Wanted],
    total_cap: usize,
    max_records: usize,
) -> Vec<Read> {
    let store = Arc::clone(store);
    let asks: Vec<(PartitionId, u64, usize)> = wanted
        .iter()
        .map(|w| (w.id.clone(), w.offset, w.max_bytes))
        .collect();
    let count = asks.len();
    let read = crate::blocking::run(move || {
        let mut left = total_cap;
        let mut first = true;
        asks.into_iter()
            .map(|(id, offset, max_bytes)| {
                if left == 0 && !first {
                    // The answer is full: this partition says where it is, without records.
                    return read_one(&store, &id, offset, 1, 0);
                }
                let allowed = max_bytes.min(left).max(1);
                let mut read = read_one(&store, &id, offset, max_records, allowed);
                if let Read::Records(result, encoded) = &mut read {
                    // What fits once encoded; the first partition with records keeps one.
                    let keep = fitting(&result.records, allowed).max(usize::from(first));
                    if keep < result.records.len() {
                        result.records.truncate(keep);
                        result.next_offset = result.records.last().map_or(offset, |r| r.offset + 1);
                    }
                    let mut out = BytesMut::new();
                    encode_fetched(&result.records, &mut out);
                    *encoded = out.freeze();
                    if !result.records.is_empty() {
                        first = false;
                        left = left.saturating_sub(encoded.len());
                    }
                }
                read
            })
            .collect::<Vec<Read>>()
    })
    .await;
    read.unwrap_or_else(|e| {
        tracing::error!(error = %e, "kafka fetch: read task failed");
        (0..count)
            .map(|_| Read::Failed {
                error: ResponseError::KafkaStorageError,
                high_watermark: -1,
                log_start_offset: -1,
            })
            .collect()
    })
}

/// How many of `records`, from the first, fit in `budget` bytes once encoded (an upper bound
/// on their encoded size: every record's longest overhead, and a batch header for each run of
/// equal commit times, as [`encode_fetched`] makes them).
fn fitting(records: &[StoredRecord], budget: usize) -> usize {
    let mut used = 0usize;
    let mut batch_at = None;
    for (i, record) in records.iter().enumerate() {
        let mut cost = record.payload_bytes()
            + RECORD_OVERHEAD_BYTES
            + record.headers.len() * HEADER_OVERHEAD_BYTES;
        if batch_at != Some(record.committed_at_ms) {
            batch_at = Some(record.committed_at_ms);
            cost += BATCH_OVERHEAD_BYTES;
        }
        used = used.saturating_add(cost);
        if used > budget {
            return i;
        }
    }
    records.len()
}

/// One partition from `offset`; `max_records` 0 reads nothing but the positions.
fn read_one(
    store: &Store,
    id: &PartitionId,
    offset: u64,
    max_records: usize,
    max_bytes: usize,
) -> Read {
    let positions = |store: &Store| match store.peek(id) {
        Ok(stats) => (
            stats
                .high_watermark
                .map_or(-1, |h| i64::try_from(h).unwrap_or(i64::MAX)),
            i64::try_from(stats.log_start_offset).unwrap_or(0),
        ),
        Err(_) => (-1, -1),
    };
    let options = ReadOptions {
        offset,
        max_records: max_records.max(1),
        max_bytes: max_bytes.max(1),
        max_committed_at_ms: None,
    };
    match store.read(id, &options) {
        Ok(mut result) => {
            if max_bytes == 0 {
                result.records.clear();
                result.next_offset = offset;
            }
            Read::Records(result, Bytes::new())
        }
        Err(e) => {
            let error = match &e {
                StorageError::OffsetBelowLogStart { .. } | StorageError::OffsetBeyondEnd { .. } => {
                    ResponseError::OffsetOutOfRange
                }
                StorageError::UnknownPartition { .. } => ResponseError::UnknownTopicOrPartition,
                // Being moved: the client looks the leader up again.
                StorageError::Sealed { .. } => ResponseError::NotLeaderOrFollower,
                _ => {
                    tracing::warn!(partition = %id, error = %e, "kafka fetch: read failed");
                    ResponseError::KafkaStorageError
                }
            };
            let (high_watermark, log_start_offset) = positions(store);
            Read::Failed {
                error,
                high_watermark,
                log_start_offset,
            }
        }
    }
}

/// Returns once any partition has a record at or past its position, `within` passed, or the
/// daemon is shutting down.
async fn wait_for_any(deps: &KafkaDeps, positions: Vec<(PartitionId, u64)>, within: Duration) {
    let mut waits = JoinSet::new();
    for (id, offset) in positions {
        let store = Arc::clone(&deps.store);
        waits.spawn(async move { store.wait_for_data(&id, offset, within).await });
    }
    let any = async {
        while let Some(done) = waits.join_next().await {
            if matches!(done, Ok(Ok(true)) | Ok(Err(_))) {
                return;
            }
        }
    };
    tokio::select! {
        () = any => {}
        () = deps.shutdown.wait() => {}
        () = tokio::time::sleep(within) => {}
    }
    // Dropping the set cancels the waits still pending.
}
