//! `PATCH /v1/topics/{t}`: change a topic's retention.

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
    let retention_ms = change.retention_ms.unwrap_or(current.retention_ms);
    let retention_bytes = change.retention_bytes.unwrap_or(current.retention_bytes);
    let topic = state
        .topics
        .set_retention(&name, retention_ms, retention_bytes)
        .await?;
    tracing::info!(topic = %name, ?retention_ms, ?retention_bytes, "retention changed");
    Ok(Json(topic.into()))
}
