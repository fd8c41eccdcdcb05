//! `GET /v1/nodes`: the nodes of the cluster that are alive, with the addresses they advertise.

use axum::Json;
use axum::extract::State;

use super::AppState;
use super::types::{NodeInfo, NodeList};

/// `GET /v1/nodes`: in cluster mode every node whose lease is alive, by id; on a single node
/// that node alone (`mode: "single"`).
pub async fn list(State(state): State<AppState>) -> Json<NodeList> {
    let Some(cluster) = &state.cluster else {
        return Json(NodeList {
            mode: "single".to_owned(),
            this_node: state.ownership.local_node().to_string(),
            nodes: vec![NodeInfo {
                id: state.ownership.local_node().to_string(),
                advertise: None,
                joined_at: None,
            }],
        });
    };
    Json(NodeList {
        mode: "cluster".to_owned(),
        this_node: cluster.node_id().to_owned(),
        nodes: cluster
            .peers
            .live()
            .into_iter()
            .map(|n| NodeInfo {
                id: n.id,
                advertise: Some(n.advertise),
                joined_at: Some(n.joined_at_ms),
            })
            .collect(),
    })
}
