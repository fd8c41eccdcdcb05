//! Admin endpoints over the set-aside area (`crate::topics::set_aside`): list the directories
//! start-up could not account for, adopt one back as a topic or partition, or purge it.
//!
//! - `GET /v1/admin/set-aside`: every entry;
//! - `POST /v1/admin/set-aside/{id}/adopt`: back into `topics/`, recorded in the metastore;
//! - `DELETE /v1/admin/set-aside/{id}`: removed with its records, for good.

use axum::Json;
use axum::extract::State;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;
use super::types::{SetAsideList, TopicInfo};
use crate::topics::set_aside::{self, SetAsideEntry};

/// `GET /v1/admin/set-aside`: the entries, oldest first.
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<SetAsideList>, ApiError> {
    let data_dir = state.store.data_dir().to_path_buf();
    let entries = crate::blocking::run(move || set_aside::list(&data_dir))
        .await
        .map_err(crate::topics::TopicError::from)?
        .map_err(crate::topics::TopicError::from)?;
    Ok(Json(SetAsideList { entries }))
}

/// `POST /v1/admin/set-aside/{id}/adopt`: 200 with the topic as now recorded.
pub(crate) async fn adopt(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<TopicInfo>, ApiError> {
    let topic = state.topics.adopt(&id).await?;
    tracing::warn!(%id, topic = %topic.name, partitions = topic.partitions, "set-aside entry adopted");
    Ok(Json(topic.into()))
}

/// `DELETE /v1/admin/set-aside/{id}`: 200 with the entry that was removed.
pub(crate) async fn purge(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SetAsideEntry>, ApiError> {
    let entry = state.topics.purge_set_aside(&id).await?;
    tracing::warn!(%id, topic = %entry.topic, segment_bytes = entry.segment_bytes, "set-aside entry purged on request");
    Ok(Json(entry))
}
