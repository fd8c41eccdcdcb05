//! ListOffsets: the earliest offset (timestamp -2), the latest (-1, the high watermark), the
//! record with the largest timestamp (-3, the last record: commit times never decrease), and
//! the first record committed at or after a timestamp, found by binary search over commit
//! times (a few one-record reads).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_request::ListOffsetsRequest;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use narad_storage::{PartitionId, StorageError, Store, time_search};

use super::KafkaDeps;

/// ListOffsets v4 is where answers carry the leader epoch.
const FIRST_LEADER_EPOCH_VERSION: i16 = 4;

/// The special timestamps of the request.
const LATEST: i64 = -1;
/// See [`LATEST`].
const EARLIEST: i64 = -2;
/// See [`LATEST`].
const MAX_TIMESTAMP: i64 = -3;

/// Answers a ListOffsets request.
pub(crate) async fn handle(
    deps: &Arc<KafkaDeps>,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let mut response = ListOffsetsResponse::default();
    for topic in request.topics {
        let mut answer = ListOffsetsTopicResponse::default();
        answer.name = topic.name.clone();
        let name = topic.name.0.to_string();
        let meta = deps.metastore.topic(&name).await.ok().flatten();
        for partition in topic.partitions {
            let mut out = ListOffsetsPartitionResponse::default();
            out.partition_index = partition.partition_index;
            let index = u32::try_from(partition.partition_index).ok();
            match (&meta, index) {
                (Some(meta), Some(index)) if index < meta.partitions => {
                    let id = PartitionId::new(name.clone(), index);
                    if !deps.ownership.is_local(&id) {
                        out.error_code = ResponseError::NotLeaderOrFollower.code();
                    } else {
                        let store = Arc::clone(&deps.store);
                        let timestamp = partition.timestamp;
                        let found =
                            crate::blocking::run(move || lookup(&store, &id, timestamp)).await;
                        match found {
                            Ok(Ok((offset, timestamp))) => {
                                out.offset = offset;
                                out.timestamp = timestamp;
                                if version >= FIRST_LEADER_EPOCH_VERSION {
                                    out.leader_epoch = 0;
                                }
                            }
                            Ok(Err(error)) => out.error_code = error.code(),
                            Err(_) => out.error_code = ResponseError::KafkaStorageError.code(),
                        }
                    }
                }
                _ => out.error_code = ResponseError::UnknownTopicOrPartition.code(),
            }
            answer.partitions.push(out);
        }
        response.topics.push(answer);
    }
    response
}

/// `(offset, timestamp)` for `timestamp`; `(-1, -1)` when no record is at or after it.
fn lookup(store: &Store, id: &PartitionId, timestamp: i64) -> Result<(i64, i64), ResponseError> {
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let storage = |e: StorageError| match e {
        StorageError::UnknownPartition { .. } => ResponseError::UnknownTopicOrPartition,
        _ => ResponseError::KafkaStorageError,
    };
    let high = store.high_watermark(id).map_err(storage)?;
    let start = store.peek(id).map_err(storage)?.log_start_offset;
    match timestamp {
        LATEST => Ok((as_i64(high), -1)),
        EARLIEST => Ok((as_i64(start), -1)),
        MAX_TIMESTAMP => {
            if high <= start {
                return Ok((-1, -1));
            }
            let at = time_search::committed_at(store, id, high - 1).map_err(storage)?;
            Ok((as_i64(high - 1), at.unwrap_or(-1)))
        }
        t if t < 0 => Err(ResponseError::InvalidRequest),
        t => Ok(time_search::first_at_or_after(store, id, t)
            .map_err(storage)?
            .map_or((-1, -1), |(offset, at)| (as_i64(offset), at))),
    }
}
