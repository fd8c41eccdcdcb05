//! Routes nodes call on each other (under `/internal/v1/`), and the calls themselves.
//!
//! - `GET /internal/v1/topics/{t}/high-watermarks`: the committed end of every partition of
//!   `t` this node owns, read exactly (closed logs are opened if their end is not on record),
//!   and its log start. An attach in cluster mode gathers its attach point from every owner
//!   with it: a link is recorded only with every partition's figure, never a guess
//!   ([`gather_bounds`]).
//! - `GET /internal/v1/topics/{t}/partitions/{p}/tail`: the provenance scan of a child
//!   partition's tail, for a cursor on another node resolving where to start ([`HttpTails`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use super::topics::require_topic;
use crate::fanout::position::provenance::{self, ChildScan, TailCopies};
use crate::fanout::position::{RemoteTails, TailScanError};
use narad_storage::{PartitionId, Store};

pub(crate) use crate::cluster::REVISION_HEADER;

/// Longest wait for this node's metadata copy to catch up with a caller's revision.
pub(crate) const REVISION_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Middleware: holds a request that names a metadata revision until this node's copy has
/// seen it (or [`REVISION_WAIT`] passed: the request then runs on what this node knows).
pub(crate) async fn wait_for_caller_revision(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(cluster) = &state.cluster
        && let Some(revision) = request
            .headers()
            .get(REVISION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok())
        && !cluster.metastore.wait_for(revision, REVISION_WAIT).await
    {
        tracing::warn!(
            revision,
            "the metadata copy did not reach a caller's revision in time"
        );
    }
    next.run(request).await
}

/// `POST {node's address}{path}` with `body` under the peer secret, decoded as JSON: an
/// operator's action carried out on the node that holds what it acts on. The node's own
/// refusal keeps its status; no answer is 503. `what` names the action in the error.
pub(crate) async fn peer_post<B, T>(
    cluster: &crate::cluster::ClusterContext,
    node: &str,
    path: &str,
    body: &B,
    what: &str,
) -> Result<T, ApiError>
where
    B: Serialize + ?Sized,
    T: serde::de::DeserializeOwned,
{
    use crate::cluster::PeerError;
    let failed = |e: PeerError| {
        let status = e
            .status
            .and_then(|s| axum::http::StatusCode::from_u16(s).ok())
            .filter(|s| !s.is_success())
            .unwrap_or(axum::http::StatusCode::SERVICE_UNAVAILABLE);
        ApiError::new(status, format!("{what}: {e}"))
    };
    let answer = cluster
        .post_peer(node, path, body, crate::cluster::PEER_CALL_TIMEOUT)
        .await
        .map_err(failed)?;
    if !answer.status().is_success() {
        return Err(failed(PeerError::refused(node, answer).await));
    }
    answer.json().await.map_err(|e| {
        failed(PeerError::new(
            node,
            None,
            format!("answered something else: {e}"),
        ))
    })
}

/// Asks each node other than this one that owns a partition of `topic` for `path` (a
/// `?local=true` listing), concurrently; returns each node's answer. A call whose task failed
/// is left out, as a node that did not answer.
pub(crate) async fn ask_other_owners<T>(
    cluster: &std::sync::Arc<crate::cluster::ClusterContext>,
    topic: &crate::metastore::TopicMeta,
    path: &str,
) -> Vec<(String, Result<T, crate::cluster::PeerError>)>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    let mut nodes: Vec<String> = topic
        .owners
        .iter()
        .map(|o| o.node.clone())
        .filter(|n| n != cluster.node_id())
        .collect();
    nodes.sort();
    nodes.dedup();
    let calls: Vec<_> = nodes
        .into_iter()
        .map(|node| {
            let (cluster, path) = (std::sync::Arc::clone(cluster), path.to_owned());
            tokio::spawn(async move {
                let answer = cluster.get_peer(&node, &path).await;
                (node, answer)
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        if let Ok(answer) = call.await {
            answers.push(answer);
        }
    }
    answers
}

/// `GET /internal/v1/topics/{t}/high-watermarks` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HighWatermarks {
    /// The node that answered.
    pub node: String,
    /// Partition index -> committed high watermark, for the partitions that node owns.
    pub partitions: BTreeMap<u32, u64>,
    /// Partition index -> oldest offset still stored, for the same partitions (absent from a
    /// node of a version before it was reported).
    #[serde(default)]
    pub(crate) log_starts: BTreeMap<u32, u64>,
}

/// Where a partition's records begin and end, read at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionBounds {
    /// The oldest offset still stored; `None` when the owner did not report it (an older
    /// version).
    pub log_start: Option<u64>,
    /// The committed high watermark.
    pub high_watermark: u64,
}

/// Topic `topic` and the partitions of it this node owns, each made ready here (a partition
/// just placed on this node gets its directory).
async fn local_partitions(
    state: &AppState,
    topic: &str,
) -> Result<(crate::metastore::TopicMeta, Vec<u32>), ApiError> {
    let meta = require_topic(state, topic).await?;
    let mine: Vec<u32> = (0..meta.partitions)
        .filter(|&p| {
            state
                .ownership
                .is_local(&PartitionId::new(meta.name.clone(), p))
        })
        .collect();
    for &p in &mine {
        state.topics.ensure_owned(&meta, p).await?;
    }
    Ok((meta, mine))
}

/// `GET /internal/v1/topics/{t}/high-watermarks`: this node's partitions of `t`.
pub(crate) async fn high_watermarks(
    State(state): State<AppState>,
    ApiPath(topic): ApiPath<String>,
) -> Result<Json<HighWatermarks>, ApiError> {
    let (meta, mine) = local_partitions(&state, &topic).await?;
    let bounds = read_local(&state.store, &meta.name, mine)
        .await
        .map_err(|reason| ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, reason))?;
    Ok(Json(HighWatermarks {
        node: state.ownership.local_node().to_string(),
        partitions: bounds.iter().map(|(&p, b)| (p, b.high_watermark)).collect(),
        log_starts: bounds
            .iter()
            .filter_map(|(&p, b)| b.log_start.map(|s| (p, s)))
            .collect(),
    }))
}

async fn read_local(
    store: &Arc<Store>,
    topic: &str,
    partitions: Vec<u32>,
) -> Result<BTreeMap<u32, PartitionBounds>, String> {
    let store = Arc::clone(store);
    let topic = topic.to_owned();
    crate::blocking::run(move || {
        partitions
            .into_iter()
            .map(|p| {
                let id = PartitionId::new(topic.clone(), p);
                let failed = |e: narad_storage::StorageError| format!("partition {p}: {e}");
                // The end first: reading it opens a log whose end is not on record, which
                // makes the start exact too.
                let high_watermark = store.high_watermark(&id).map_err(failed)?;
                let log_start = store.peek(&id).map_err(failed)?.log_start_offset;
                Ok((
                    p,
                    PartitionBounds {
                        log_start: Some(log_start),
                        high_watermark,
                    },
                ))
            })
            .collect()
    })
    .await
    .map_err(|e| format!("reading high watermarks failed: {e}"))?
}

/// Where every partition of `topic` (`partitions` of them) begins and ends, read now from
/// whichever node owns each: this node's from its store, the others' from their owners,
/// concurrently. Fails, naming the node, when an owner is unknown, not alive or does not
/// answer with every partition it owns.
pub(crate) async fn gather_bounds(
    state: &AppState,
    topic: &str,
    partitions: u32,
) -> Result<Vec<PartitionBounds>, String> {
    let Some(cluster) = &state.cluster else {
        return read_local(&state.store, topic, (0..partitions).collect())
            .await
            .map(|m| m.into_values().collect());
    };
    let mut by_owner: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for p in 0..partitions {
        let id = PartitionId::new(topic.to_owned(), p);
        let owner = state
            .ownership
            .owner(&id)
            .ok_or_else(|| format!("partition {p} has no owner"))?;
        by_owner.entry(owner.0).or_default().push(p);
    }
    let local = cluster.node_id().to_owned();
    if let Some(meta) = state
        .metastore
        .topic(topic)
        .await
        .map_err(|e| e.to_string())?
    {
        for (p, owner) in meta.owners.iter().enumerate() {
            if owner.node == local {
                let p = u32::try_from(p).map_err(|e| e.to_string())?;
                state
                    .topics
                    .ensure_owned(&meta, p)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    let calls = by_owner.into_iter().map(|(node, wanted)| {
        let (state, cluster, topic, local) = (
            state.clone(),
            Arc::clone(cluster),
            topic.to_owned(),
            local.clone(),
        );
        async move {
            if node == local {
                return read_local(&state.store, &topic, wanted).await;
            }
            let answer: HighWatermarks = cluster
                .get_peer(
                    &node,
                    &format!("/internal/v1/topics/{topic}/high-watermarks"),
                )
                .await
                .map_err(|e| format!("{e} (it owns partitions {wanted:?})"))?;
            wanted
                .into_iter()
                .map(|p| {
                    let bounds = PartitionBounds {
                        log_start: answer.log_starts.get(&p).copied(),
                        high_watermark: *answer
                            .partitions
                            .get(&p)
                            .ok_or_else(|| format!("node {node} does not serve partition {p}"))?,
                    };
                    Ok((p, bounds))
                })
                .collect::<Result<BTreeMap<u32, PartitionBounds>, String>>()
        }
    });
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut all = BTreeMap::new();
    for handle in handles {
        let part = handle
            .await
            .map_err(|e| format!("gathering high watermarks failed: {e}"))?;
        all.extend(part?);
    }
    (0..partitions)
        .map(|p| {
            all.get(&p)
                .copied()
                .ok_or_else(|| format!("no answer for partition {p}"))
        })
        .collect()
}

/// `GET /internal/v1/topics/{t}/offsets-at` query string.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OffsetsAtQuery {
    /// The moment, Unix ms.
    pub ms: i64,
}

/// `GET /internal/v1/topics/{t}/offsets-at` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OffsetsAt {
    /// The node that answered.
    pub node: String,
    /// Partition index -> the first offset committed at or after the moment (`None`: every
    /// stored record is older), for the partitions that node owns.
    pub partitions: BTreeMap<u32, Option<u64>>,
}

/// `GET /internal/v1/topics/{t}/offsets-at?ms=T`: for this node's partitions of `t`, the first
/// offset committed at or after `T`.
pub(crate) async fn offsets_at(
    State(state): State<AppState>,
    ApiPath(topic): ApiPath<String>,
    ApiQuery(query): ApiQuery<OffsetsAtQuery>,
) -> Result<Json<OffsetsAt>, ApiError> {
    let (meta, mine) = local_partitions(&state, &topic).await?;
    let partitions = search_local(&state.store, &meta.name, mine, query.ms)
        .await
        .map_err(|reason| ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, reason))?;
    Ok(Json(OffsetsAt {
        node: state.ownership.local_node().to_string(),
        partitions,
    }))
}

async fn search_local(
    store: &Arc<Store>,
    topic: &str,
    partitions: Vec<u32>,
    ms: i64,
) -> Result<BTreeMap<u32, Option<u64>>, String> {
    let (store, topic) = (Arc::clone(store), topic.to_owned());
    crate::blocking::run(move || {
        partitions
            .into_iter()
            .map(|p| {
                let id = PartitionId::new(topic.clone(), p);
                narad_storage::time_search::first_at_or_after(&store, &id, ms)
                    .map(|found| (p, found.map(|(offset, _)| offset)))
                    .map_err(|e| format!("partition {p}: {e}"))
            })
            .collect()
    })
    .await
    .map_err(|e| format!("searching by time failed: {e}"))?
}

/// For every partition of `topic` (`partitions` of them), the first offset committed at or
/// after `ms` (`None`: every stored record is older), read from whichever node owns it.
pub(crate) async fn gather_offsets_at(
    state: &AppState,
    topic: &str,
    partitions: u32,
    ms: i64,
) -> Result<Vec<Option<u64>>, String> {
    let mut by_owner: BTreeMap<Option<String>, Vec<u32>> = BTreeMap::new();
    for p in 0..partitions {
        let owner = match &state.cluster {
            None => None,
            Some(cluster) => {
                let id = PartitionId::new(topic.to_owned(), p);
                let owner = state
                    .ownership
                    .owner(&id)
                    .ok_or_else(|| format!("partition {p} has no owner"))?;
                (owner.0 != cluster.node_id()).then_some(owner.0)
            }
        };
        by_owner.entry(owner).or_default().push(p);
    }
    let mut all = BTreeMap::new();
    for (owner, wanted) in by_owner {
        match (owner, &state.cluster) {
            (Some(node), Some(cluster)) => {
                let answer: OffsetsAt = cluster
                    .get_peer(
                        &node,
                        &format!("/internal/v1/topics/{topic}/offsets-at?ms={ms}"),
                    )
                    .await
                    .map_err(|e| format!("{e} (it owns partitions {wanted:?})"))?;
                for p in wanted {
                    let found = answer
                        .partitions
                        .get(&p)
                        .ok_or_else(|| format!("node {node} does not serve partition {p}"))?;
                    all.insert(p, *found);
                }
            }
            _ => all.extend(search_local(&state.store, topic, wanted, ms).await?),
        }
    }
    Ok((0..partitions)
        .map(|p| all.get(&p).copied().flatten())
        .collect())
}

/// `GET /internal/v1/topics/{t}/partitions/{p}/tail` query string.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TailQuery {
    /// The link's attach epoch, 16 hex digits.
    pub epoch: String,
    /// The parent partition whose copies are looked for.
    pub parent_partition: u32,
}

/// `GET /internal/v1/topics/{t}/partitions/{p}/tail` answer: what the scan of that child
/// partition's tail found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TailScan {
    /// The newest slab of the epoch and parent partition found, and whether the partition
    /// never held a record.
    pub scan: ChildScan,
    /// Fingerprints of the copies found, by parent offset.
    pub copies: TailCopies,
}

/// `GET /internal/v1/topics/{t}/partitions/{p}/tail?epoch=&parent_partition=`: the tail scan
/// a cursor on another node needs at start ([`crate::fanout::position`]), of a partition this
/// node owns (421 otherwise).
pub(crate) async fn tail(
    State(state): State<AppState>,
    ApiPath((topic, partition)): ApiPath<(String, u32)>,
    super::extract::ApiQuery(query): super::extract::ApiQuery<TailQuery>,
) -> Result<Json<TailScan>, ApiError> {
    let meta = require_topic(&state, &topic).await?;
    let id = PartitionId::new(meta.name.clone(), partition);
    if partition >= meta.partitions || !state.ownership.is_local(&id) {
        return Err(ApiError::new(
            axum::http::StatusCode::MISDIRECTED_REQUEST,
            format!("partition {id} is not served by this node"),
        ));
    }
    state.topics.ensure_owned(&meta, partition).await?;
    let epoch = crate::metastore::link::epoch_bytes(&query.epoch)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let store = Arc::clone(&state.store);
    let parent_partition = query.parent_partition;
    let (scan, copies) = crate::blocking::run(move || {
        provenance::scan_child_tails_with_copies(
            &store,
            &meta.name,
            &[partition],
            epoch,
            parent_partition,
        )
    })
    .await
    .map_err(|e| ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(Json(TailScan { scan, copies }))
}

/// Most tail scans one node has in flight to other nodes. Each starting cursor asks for the
/// tail of every child partition another node owns (a link of 12 by 12 partitions: 96 calls);
/// 57 attaches a second on three nodes sent thousands at once, the owners' connections piled
/// up to their cap, and attaches were refused. This many, at tens of milliseconds each, still
/// starts a thousand cursors a second; the rest wait their turn.
pub(crate) const TAIL_SCANS_IN_FLIGHT: usize = 64;

/// [`RemoteTails`] over HTTP: asks each child partition's owner for its tail scan, at most
/// [`TAIL_SCANS_IN_FLIGHT`] at once.
pub(crate) struct HttpTails {
    cluster: Arc<crate::cluster::ClusterContext>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl HttpTails {
    /// Tail scans through `cluster`'s peers and client.
    pub(crate) fn new(cluster: Arc<crate::cluster::ClusterContext>) -> HttpTails {
        HttpTails {
            cluster,
            in_flight: Arc::new(tokio::sync::Semaphore::new(TAIL_SCANS_IN_FLIGHT)),
        }
    }
}

impl RemoteTails for HttpTails {
    fn scan<'a>(
        &'a self,
        child: &'a str,
        partition: u32,
        epoch: [u8; 8],
        parent_partition: u32,
    ) -> crate::metastore::BoxFuture<'a, Result<(ChildScan, TailCopies), TailScanError>> {
        Box::pin(async move {
            let id = PartitionId::new(child.to_owned(), partition);
            let cluster = &self.cluster;
            let owner = cluster
                .ownership
                .owner_at(&id)
                .ok_or_else(|| TailScanError::NoOwner {
                    partition: id.to_string(),
                })?;
            let path = format!(
                "/internal/v1/topics/{child}/partitions/{partition}/tail?epoch={}&parent_partition={parent_partition}",
                hex::encode(epoch)
            );
            let scan: TailScan = cluster
                .get_peer(&owner.node, &path)
                .await
                .map_err(TailScanError::Peer)?;
            Ok((scan.scan, scan.copies))
        })
    }

    fn admit(&self) -> crate::metastore::BoxFuture<'_, Option<tokio::sync::OwnedSemaphorePermit>> {
        // Never closed, so `ok()` is always a permit.
        Box::pin(async move { Arc::clone(&self.in_flight).acquire_owned().await.ok() })
    }
}
