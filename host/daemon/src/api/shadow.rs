//! Shadow routing of a link (`/v1/topics/{parent}/children/{child}/shadow`): set a candidate
//! chain that routes a copy of the link's slabs beside its own chain, read how it compares,
//! clear it. Nothing the candidate decides is committed; `PATCH .../children/{child}` with its
//! `router` is how a candidate that compares well is made the link's chain.
//!
//! The shadow is link metadata (every node's reconciler starts it beside the cursors it
//! runs); its report lives on the nodes that run the link's cursors. On one node that is this
//! one; in cluster mode a `GET` asks the other owners of the parent's partitions for theirs
//! (`?local=true`, concurrently) and sums them.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::children::MAX_ROUTER_LEN;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::types::{ShadowInfo, ShadowRequest, ShadowStatus};
use crate::fanout::shadow::ShadowReport;
use crate::metastore::{LinkMeta, MetastoreError, PluginRef, ShadowSpec};

fn info(parent: &str, child: &str, spec: &ShadowSpec) -> ShadowInfo {
    ShadowInfo {
        parent: parent.to_owned(),
        child: child.to_owned(),
        router: spec.router.clone(),
        config: spec.config.clone(),
        set_at_ms: spec.set_at_ms,
    }
}

fn no_shadow(parent: &str, child: &str) -> ApiError {
    ApiError::not_found(format!(
        "{parent} -> {child} has no shadow; set one with PUT \
         /v1/topics/{parent}/children/{child}/shadow (narad child shadow set)"
    ))
}

fn unknown_link(parent: &str, child: &str) -> ApiError {
    ApiError::from(MetastoreError::UnknownLink {
        parent: parent.to_owned(),
        child: child.to_owned(),
    })
}

/// `PUT /v1/topics/{parent}/children/{child}/shadow`: records the candidate chain (pinned to
/// plugin versions, as an attach pins its chain) with a fresh report. Setting a shadow again,
/// even the same chain, starts its report afresh. 400 for a chain of no or too many plugins,
/// 404 for an unknown link or plugin.
pub(crate) async fn set(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<ShadowRequest>,
) -> Result<Json<ShadowInfo>, ApiError> {
    let snapshot = state.metastore.snapshot().await?;
    let Some(link) = snapshot.links.get(&(parent.clone(), child.clone())) else {
        return Err(unknown_link(&parent, &child));
    };
    if request.router.is_empty() || request.router.len() > MAX_ROUTER_LEN {
        return Err(ApiError::bad_request(format!(
            "a shadow's router is a chain of 1 to {MAX_ROUTER_LEN} plugins; got {}",
            request.router.len()
        )));
    }
    let router = request
        .router
        .iter()
        .map(|spec| state.plugins.resolve(&snapshot, spec))
        .collect::<Result<Vec<PluginRef>, _>>()?;
    let config = match request.config {
        None => link.config.clone(),
        Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text,
        Some(other) => other.to_string(),
    };
    let spec = ShadowSpec {
        router,
        config,
        set_at_ms: crate::topics::now_ms(),
    };
    let link = state
        .metastore
        .set_shadow(&parent, &child, Some(spec))
        .await?;
    let spec = link
        .shadow
        .as_ref()
        .ok_or_else(|| no_shadow(&parent, &child))?;
    tracing::info!(%parent, %child, router = ?spec.router, "shadow set");
    Ok(Json(info(&parent, &child, spec)))
}

/// `DELETE /v1/topics/{parent}/children/{child}/shadow`: stops the shadow and drops its report;
/// answers the shadow that was cleared. 404 when the link has none.
pub(crate) async fn clear(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
) -> Result<Json<ShadowInfo>, ApiError> {
    let view = state
        .metastore
        .link_view(&parent, &child)
        .await?
        .ok_or_else(|| unknown_link(&parent, &child))?;
    let Some(spec) = view.link.shadow else {
        return Err(no_shadow(&parent, &child));
    };
    state.metastore.set_shadow(&parent, &child, None).await?;
    tracing::info!(%parent, %child, "shadow cleared");
    Ok(Json(info(&parent, &child, &spec)))
}

/// `GET /v1/topics/{parent}/children/{child}/shadow` query string.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShadowQuery {
    /// Cluster mode: only this node's report (what nodes ask each other when they sum it).
    #[serde(default)]
    pub local: bool,
}

/// `GET /v1/topics/{parent}/children/{child}/shadow`: the shadow and its report. 404 when the
/// link has no shadow.
pub(crate) async fn show(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<ShadowQuery>,
) -> Result<Json<ShadowStatus>, ApiError> {
    let view = state
        .metastore
        .link_view(&parent, &child)
        .await?
        .ok_or_else(|| unknown_link(&parent, &child))?;
    let link = view.link;
    let Some(spec) = link.shadow.clone() else {
        return Err(no_shadow(&parent, &child));
    };
    let mut status = local_status(&state, &link, &spec);
    let Some(cluster) = &state.cluster else {
        return Ok(Json(status));
    };
    if query.local {
        return Ok(Json(status));
    }
    // Every node runs the shadow of every link, but only the owners of the parent's
    // partitions run cursors that feed it: this node counts only if it is one of them.
    let owner_here = view
        .parent
        .owners
        .iter()
        .any(|o| o.node == cluster.node_id());
    if status.running && owner_here {
        status.nodes = vec![cluster.node_id().to_owned()];
    } else {
        status.running = false;
    }
    let path = format!("/v1/topics/{parent}/children/{child}/shadow?local=true");
    let answers: Vec<(String, Result<ShadowStatus, crate::cluster::PeerError>)> =
        super::internal::ask_other_owners(cluster, &view.parent, &path).await;
    for (node, answer) in answers {
        match answer {
            // Another node that has not seen this shadow yet (or an older one) has nothing of
            // it to add.
            Ok(theirs) if theirs.shadow.set_at_ms == spec.set_at_ms => {
                if theirs.running {
                    status.running = true;
                    status.nodes.push(node);
                    status.report.merge(&theirs.report);
                }
            }
            Ok(_) => {}
            Err(reason) => {
                tracing::debug!(%node, %reason, "a node's shadow report could not be read");
                status.nodes_unreachable.push(node);
            }
        }
    }
    status.nodes.sort();
    Ok(Json(status))
}

/// The shadow's report on this node: zero counts while no shadow of this spec runs here.
fn local_status(state: &AppState, link: &LinkMeta, spec: &ShadowSpec) -> ShadowStatus {
    let running = state
        .fanout
        .shadows()
        .get(&link.parent, &link.child)
        .filter(|s| s.spec() == spec);
    ShadowStatus {
        shadow: info(&link.parent, &link.child, spec),
        current_router: link.router.clone(),
        running: running.is_some(),
        nodes: Vec::new(),
        nodes_unreachable: Vec::new(),
        report: running.map_or_else(ShadowReport::default, |s| s.report()),
    }
}
