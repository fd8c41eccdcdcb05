//! `GET /v1/nodes`: the nodes of the cluster that are alive, with the addresses they advertise;
//! `POST` and `DELETE /v1/nodes/{id}/cordon`: stop and restart giving a node new partitions.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;
use super::types::{Cordon, NodeInfo, NodeList};

/// `GET /v1/nodes`: in cluster mode every node whose lease is alive, by id; on a single node
/// that node alone (`mode: "single"`).
pub(crate) async fn list(State(state): State<AppState>) -> Json<NodeList> {
    let Some(cluster) = &state.cluster else {
        return Json(NodeList {
            mode: "single".to_owned(),
            this_node: state.ownership.local_node().to_string(),
            nodes: vec![NodeInfo {
                id: state.ownership.local_node().to_string(),
                advertise: None,
                joined_at: None,
                cordoned: false,
            }],
        });
    };
    let cordoned = cluster.peers.cordoned();
    Json(NodeList {
        mode: "cluster".to_owned(),
        this_node: cluster.node_id().to_owned(),
        nodes: cluster
            .peers
            .live()
            .into_iter()
            .map(|n| NodeInfo {
                cordoned: cordoned.contains(&n.id),
                id: n.id,
                advertise: Some(n.advertise),
                joined_at: Some(n.joined_at_ms),
            })
            .collect(),
    })
}

/// `POST /v1/nodes/{id}/cordon`: node `id` gets no new partitions from a spread placement, a
/// move or a re-creation without a named target, until uncordoned. It keeps what it owns.
pub(crate) async fn cordon(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Cordon>, ApiError> {
    set_cordon(&state, id, true).await
}

/// `DELETE /v1/nodes/{id}/cordon`: node `id` may be given new partitions again.
pub(crate) async fn uncordon(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Cordon>, ApiError> {
    set_cordon(&state, id, false).await
}

async fn set_cordon(state: &AppState, id: String, on: bool) -> Result<Json<Cordon>, ApiError> {
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::bad_request(
            "cordons apply in cluster mode (narad serve --etcd ...); a single node takes every \
             partition",
        ));
    };
    if id.is_empty() || id.len() > 255 || id.contains('/') {
        return Err(ApiError::bad_request(format!("{id:?} is not a node id")));
    }
    let done = if on {
        if !cluster.peers.is_live(&id) {
            return Err(ApiError::not_found(format!(
                "node {id} is not alive; `narad node list` shows the live nodes"
            )));
        }
        cluster.peers.cordon(&id, crate::topics::now_ms()).await
    } else {
        cluster.peers.uncordon(&id).await
    };
    done.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot write the cordon of {id} to etcd: {e}"),
        )
    })?;
    tracing::info!(node = %id, cordoned = on, "node cordon changed");
    Ok(Json(Cordon {
        node: id,
        cordoned: on,
    }))
}
