//! Planned partition moves over HTTP (cluster mode; the steps are in [`crate::operations::moves`]):
//! - `POST /v1/topics/{t}/partitions/{p}/move` on any node: `{"to": "n3"}` moves the partition
//!   to node n3 (without `to`: where a move that stopped part way was going, else the least
//!   loaded live node other than its owner) and answers once the new owner serves it; `{"cancel": true}` cancels a move under way.
//! - `POST /v1/topics/{t}/partitions/{p}/recreate` on any node: `{"on": "n3", "accept_loss":
//!   true}` re-creates a dead node's partition, empty, on n3 ([`crate::operations::recreate`]).
//! - `POST /internal/v1/topics/{t}/partitions/{p}/recreate-here`: the node called re-creates
//!   the partition on itself.
//! - `POST /internal/v1/topics/{t}/partitions/{p}/move-in`: the node called runs the move to
//!   itself (what the public route asks of the target).
//! - `POST /internal/v1/topics/{t}/partitions/{p}/handoff`: the owner stops the partition's
//!   cursors, seals it and describes its files.
//! - `POST /internal/v1/topics/{t}/partitions/{p}/files`: a chunk of one of those files.
//!
//! The internal routes take the peer secret when the cluster has a token.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use narad_storage::PartitionId;
use narad_storage::transfer::Manifest;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::topics::require_topic;
use super::types::{MoveCancelled, MoveRequest, RecreateRequest};
use crate::cluster::PeerError;
use crate::operations::moves::{ChunkRequest, HandoffRequest, MoveError, MoveReport, Mover};
use crate::operations::recreate::{
    RecreateError, RecreateHereRequest, RecreateReport, Recreator, recreate_here_path,
};

impl From<MoveError> for ApiError {
    fn from(err: MoveError) -> ApiError {
        match err {
            MoveError::Metastore(e) => e.into(),
            MoveError::Storage(e) => e.into(),
            MoveError::UnknownPartition { .. } => ApiError::not_found(err.to_string()),
            MoveError::AlreadyOwner { .. }
            | MoveError::AlreadyMoving { .. }
            | MoveError::NotMoving { .. } => ApiError::new(StatusCode::CONFLICT, err.to_string()),
            MoveError::CursorsRunning { .. } | MoveError::NodeDown { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
            MoveError::Peer(PeerError { status, .. }) => ApiError::new(
                status
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .filter(|s| !s.is_success())
                    .unwrap_or(StatusCode::BAD_GATEWAY),
                err.to_string(),
            ),
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
        }
    }
}

impl From<RecreateError> for ApiError {
    fn from(err: RecreateError) -> ApiError {
        match err {
            RecreateError::Metastore(e) => e.into(),
            RecreateError::Storage(e) => e.into(),
            RecreateError::UnknownPartition { .. } => ApiError::not_found(err.to_string()),
            RecreateError::OwnerAlive { .. } | RecreateError::AlreadyOwner { .. } => {
                ApiError::new(StatusCode::CONFLICT, err.to_string())
            }
            RecreateError::ChildUnknown { .. } | RecreateError::Membership(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
        }
    }
}

fn recreator(state: &AppState) -> Result<&Recreator, ApiError> {
    state.recreator.as_deref().ok_or_else(|| {
        ApiError::bad_request(
            "re-creating a partition applies in cluster mode (narad serve --etcd ...); a \
             single node owns every partition",
        )
    })
}

fn mover(state: &AppState) -> Result<&Mover, ApiError> {
    state.mover.as_deref().ok_or_else(|| {
        ApiError::bad_request(
            "partition moves apply in cluster mode (narad serve --etcd ...); a single node \
             owns every partition",
        )
    })
}

/// The partition, checked against the topic's partition count.
async fn partition(state: &AppState, topic: &str, partition: u32) -> Result<PartitionId, ApiError> {
    let meta = require_topic(state, topic).await?;
    if partition >= meta.partitions {
        return Err(ApiError::not_found(format!(
            "topic {topic} has {} partitions; there is no partition {partition}",
            meta.partitions
        )));
    }
    Ok(PartitionId::new(meta.name, partition))
}

/// `POST /v1/topics/{t}/partitions/{p}/move`.
pub(crate) async fn move_partition(
    State(state): State<AppState>,
    ApiPath((topic, index)): ApiPath<(String, u32)>,
    ApiJson(request): ApiJson<MoveRequest>,
) -> Result<Response, ApiError> {
    let mover = mover(&state)?;
    let id = partition(&state, &topic, index).await?;
    if request.cancel {
        if request.to.is_some() {
            return Err(ApiError::bad_request(
                "give either `to` or `cancel`, not both",
            ));
        }
        let owner = mover.cancel(&id).await?;
        return Ok(Json(MoveCancelled {
            topic: id.topic,
            partition: id.partition,
            owner: owner.node,
            generation: owner.generation,
        })
        .into_response());
    }
    let snapshot = state.metastore.snapshot().await?;
    let record = snapshot
        .topics
        .get(&id.topic)
        .and_then(|t| t.owners.get(id.partition as usize))
        .cloned();
    let current = record.as_ref().map(|o| o.node.clone()).unwrap_or_default();
    let resuming = record.and_then(|o| o.moving_to);
    let named = request.to.is_some();
    let to = match (request.to, resuming) {
        (Some(to), _) => to,
        // A move that stopped part way resumes to where it was going.
        (None, Some(to)) => to,
        (None, None) => mover.pick_target(&snapshot, &id, &current).ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("no live node other than {current} to move {id} to"),
            )
        })?,
    };
    let cluster = state.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "a mover without cluster mode",
        )
    })?;
    if !cluster.peers.is_live(&to) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("node {to} is not alive; `narad node list` shows the live nodes"),
        ));
    }
    // A target the operator named is taken as named, even beside the same partition of a
    // linked topic; the answer says where (a chosen target never is).
    let shares_node_with = match named {
        true => crate::cluster::placement::linked_on_node(&snapshot, &id.topic, id.partition, &to),
        false => Vec::new(),
    };
    let mut report = if to == cluster.node_id() {
        run_move_in(&state, id).await?
    } else {
        mover.ask_move_in(&to, &id).await?
    };
    if !shares_node_with.is_empty() {
        tracing::warn!(topic = %report.topic, partition = report.partition, node = %to,
            linked = ?shares_node_with,
            "moved a partition onto the node of the same partition of a linked topic: a copy and its original share a disk");
    }
    report.shares_node_with = shares_node_with;
    Ok(Json(report).into_response())
}

/// Runs the move to this node in its own task: a client that goes away does not stop a move
/// half way (it would still be safe, but the partition would stay sealed until asked again).
async fn run_move_in(state: &AppState, id: PartitionId) -> Result<MoveReport, ApiError> {
    let task = {
        let state = state.clone();
        tokio::spawn(async move {
            let mover = mover(&state)?;
            let report = mover.move_in(&id.topic, id.partition).await?;
            // Serve it now rather than at the next metadata pass.
            if let Err(e) = state.topics.sync_owned().await {
                tracing::warn!(error = %e, "registering a moved-in partition waits for the next pass");
            }
            Ok::<_, ApiError>(report)
        })
    };
    task.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the move task did not finish: {e}"),
        )
    })?
}

/// `POST /v1/topics/{t}/partitions/{p}/recreate`.
pub(crate) async fn recreate(
    State(state): State<AppState>,
    ApiPath((topic, index)): ApiPath<(String, u32)>,
    ApiJson(request): ApiJson<RecreateRequest>,
) -> Result<Json<RecreateReport>, ApiError> {
    if state.recreator.is_none() {
        return recreate_lost_here(&state, &topic, index, &request).await;
    }
    let id = partition(&state, &topic, index).await?;
    if !request.accept_loss {
        return Err(ApiError::bad_request(
            "re-creating a partition loses every record only its dead owner held; say so with \
             \"accept_loss\": true (`--accept-loss`), or bring the node back, or, if it is alive, \
             use `narad partition move`",
        ));
    }
    let cluster = state.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "a recreator without cluster mode",
        )
    })?;
    let on = match request.on {
        Some(on) => on,
        None => {
            let snapshot = state.metastore.snapshot().await?;
            let owner = snapshot
                .topics
                .get(&id.topic)
                .and_then(|t| t.owners.get(id.partition as usize))
                .map(|o| o.node.clone())
                .unwrap_or_default();
            let live: Vec<String> = cluster
                .peers
                .placeable()
                .into_iter()
                .filter(|n| *n != owner)
                .collect();
            crate::operations::moves::least_loaded_away(&snapshot, &live, &id).ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("no live node to re-create {id} on"),
                )
            })?
        }
    };
    if !cluster.peers.is_live(&on) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("node {on} is not alive; `narad node list` shows the live nodes"),
        ));
    }
    let here = RecreateHereRequest {
        start_offset: request.start_offset,
        accept_loss: true,
    };
    if on == cluster.node_id() {
        return Ok(Json(run_recreate_here(&state, id, here).await?));
    }
    let answer = cluster
        .post_peer(&on, &recreate_here_path(&id), &here, RECREATE_TIMEOUT)
        .await
        .map_err(peer_error)?;
    if !answer.status().is_success() {
        return Err(peer_error(PeerError::refused(&on, answer).await));
    }
    let report = answer.json::<RecreateReport>().await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("node {on} answered a re-creation that does not decode: {e}"),
        )
    })?;
    Ok(Json(report))
}

/// A single node's re-creation: only of a partition whose directory is gone
/// ([`crate::operations::lost_partition`]).
async fn recreate_lost_here(
    state: &AppState,
    topic: &str,
    index: u32,
    request: &RecreateRequest,
) -> Result<Json<RecreateReport>, ApiError> {
    use crate::operations::lost_partition::{RecreateLostError, recreate_lost};
    if request.on.is_some() {
        return Err(ApiError::bad_request(
            "\"on\" names a node in cluster mode; a single node re-creates the partition on \
             itself",
        ));
    }
    if !request.accept_loss {
        return Err(ApiError::bad_request(
            "re-creating a partition whose directory is gone accepts the loss of every record \
             it held; say so with \"accept_loss\": true (`--accept-loss`), or restore the \
             directory from a backup and restart",
        ));
    }
    let node = state.ownership.local_node().to_string();
    recreate_lost(
        &state.store,
        &state.metastore,
        state.topics.segment_bytes(),
        &node,
        topic,
        index,
        request.start_offset,
    )
    .await
    .map(Json)
    .map_err(|e| match e {
        RecreateLostError::Unknown { .. } => ApiError::not_found(e.to_string()),
        RecreateLostError::NotLost { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        RecreateLostError::Metastore(e) => e.into(),
        RecreateLostError::Storage(e) => e.into(),
        other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
    })
}

/// Longest wait for the target of a re-creation to answer: it asks every child partition of
/// every link from the partition.
const RECREATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

fn peer_error(e: PeerError) -> ApiError {
    let status = e
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .filter(|s| !s.is_success())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    ApiError::new(status, e.to_string())
}

/// Runs the re-creation in its own task (a client that goes away does not stop it half way)
/// and registers the new partition at once.
async fn run_recreate_here(
    state: &AppState,
    id: PartitionId,
    request: RecreateHereRequest,
) -> Result<RecreateReport, ApiError> {
    let task = {
        let state = state.clone();
        tokio::spawn(async move {
            let recreator = recreator(&state)?;
            let report = recreator
                .recreate_here(&id.topic, id.partition, request.start_offset)
                .await?;
            if let Err(e) = state.topics.sync_owned().await {
                tracing::warn!(error = %e, "registering a re-created partition waits for the next pass");
            }
            Ok::<_, ApiError>(report)
        })
    };
    task.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the re-creation task did not finish: {e}"),
        )
    })?
}

/// `POST /internal/v1/topics/{t}/partitions/{p}/recreate-here`.
pub(crate) async fn recreate_here(
    State(state): State<AppState>,
    ApiPath((topic, index)): ApiPath<(String, u32)>,
    ApiJson(request): ApiJson<RecreateHereRequest>,
) -> Result<Json<RecreateReport>, ApiError> {
    if !request.accept_loss {
        return Err(ApiError::bad_request(
            "re-creating a partition loses what only its dead owner held: the request must say \
             \"accept_loss\": true",
        ));
    }
    recreator(&state)?;
    let id = partition(&state, &topic, index).await?;
    Ok(Json(run_recreate_here(&state, id, request).await?))
}

/// `POST /internal/v1/topics/{t}/partitions/{p}/move-in`.
pub(crate) async fn move_in(
    State(state): State<AppState>,
    ApiPath((topic, index)): ApiPath<(String, u32)>,
) -> Result<Json<MoveReport>, ApiError> {
    mover(&state)?;
    let id = partition(&state, &topic, index).await?;
    Ok(Json(run_move_in(&state, id).await?))
}

/// `POST /internal/v1/topics/{t}/partitions/{p}/handoff`.
pub(crate) async fn handoff(
    State(state): State<AppState>,
    ApiPath((topic, index)): ApiPath<(String, u32)>,
    ApiJson(request): ApiJson<HandoffRequest>,
) -> Result<Json<Manifest>, ApiError> {
    let mover = mover(&state)?;
    Ok(Json(mover.hand_off(&topic, index, &request).await?))
}

/// `POST /internal/v1/topics/{t}/partitions/{p}/files`.
pub(crate) async fn chunk(
    State(state): State<AppState>,
    ApiPath((topic, index)): ApiPath<(String, u32)>,
    ApiJson(request): ApiJson<ChunkRequest>,
) -> Result<Response, ApiError> {
    let mover = mover(&state)?;
    let bytes = mover.chunk(&topic, index, request).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
