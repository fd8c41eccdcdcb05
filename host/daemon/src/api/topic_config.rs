//! `PATCH /v1/topics/{t}`: change a topic's retention, and whether producers may write to it
//! while it is a fan-out child.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Deserializer};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::types::TopicInfo;

/// `PATCH /v1/topics/{t}` body. A field left out keeps its value; `null` removes the limit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TopicChange {
    /// New age limit in ms (`null`: keep records forever).
    #[serde(default, deserialize_with = "present")]
    pub retention_ms: Option<Option<u64>>,
    /// New size limit per partition in bytes (`null`: no cap).
    #[serde(default, deserialize_with = "present")]
    pub retention_bytes: Option<Option<u64>>,
    /// Whether producers may write to the topic while it is a fan-out child.
    #[serde(default)]
    pub writable_as_child: Option<bool>,
}

/// Tells a field given as `null` (`Some(None)`) from a field left out (`None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `PATCH /v1/topics/{t}`: 200 with the topic's settings. Refused with 400 when a delay child
/// of the topic needs longer retention (its delay plus one hour).
pub(crate) async fn update(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(change): ApiJson<TopicChange>,
) -> Result<Json<TopicInfo>, ApiError> {
    let current = super::topics::require_topic(&state, &name).await?;
    let mut topic = current.clone();
    if change.retention_ms.is_some() || change.retention_bytes.is_some() {
        let retention_ms = change.retention_ms.unwrap_or(current.retention_ms);
        let retention_bytes = change.retention_bytes.unwrap_or(current.retention_bytes);
        topic = state
            .topics
            .set_retention(&name, retention_ms, retention_bytes)
            .await?;
        tracing::info!(topic = %name, retention_ms, retention_bytes, "retention changed");
    }
    if let Some(writable) = change.writable_as_child {
        topic = state
            .metastore
            .set_writable_as_child(&name, writable)
            .await?;
        tracing::info!(topic = %name, writable, "producers may write to it as a fan-out child: {writable}");
    }
    Ok(Json(topic.into()))
}

/// Refuses a produce to `topic` while it is a fan-out child that does not let producers
/// write to it (403): a child holds only what its cursors copied.
pub(crate) async fn require_writable(
    state: &AppState,
    topic: &crate::metastore::TopicMeta,
) -> Result<(), ApiError> {
    if crate::topics::is_internal(&topic.name) {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            format!(
                "topic {} is internal to narad: only the daemon writes to it",
                topic.name
            ),
        ));
    }
    if topic.writable_as_child {
        return Ok(());
    }
    let parents = state.metastore.parents_of(&topic.name).await?;
    match parents.first() {
        None => Ok(()),
        Some(parent) => Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            format!(
                "topic {} is a fan-out child of {parent}: it holds only what its cursors copy, \
                 and producers may not write to it; to allow them, PATCH /v1/topics/{} with \
                 {{\"writable_as_child\": true}}",
                topic.name, topic.name
            ),
        )
        .with("parents", parents.clone())),
    }
}
