//! Topic endpoints: create, list, describe, delete, grow.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use narad_storage::{PartitionId, PartitionState, Store};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::types::{
    CreateTopicRequest, DeleteTopicQuery, DeletedTopic, GrowPartitionsRequest, LinkEnds,
    PartitionInfo, RecoveredCutInfo, TopicDescription, TopicInfo, TopicList,
};
use crate::metastore::{MetastoreError, TopicMeta};
use crate::topics::NewTopic;

impl From<TopicMeta> for TopicInfo {
    fn from(t: TopicMeta) -> TopicInfo {
        TopicInfo {
            name: t.name,
            partitions: t.partitions,
            retention_ms: t.retention_ms,
            retention_bytes: t.retention_bytes,
            created_at: t.created_at_ms,
        }
    }
}

/// `POST /v1/topics`: 201 with the topic.
pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CreateTopicRequest>,
) -> Result<(StatusCode, Json<TopicInfo>), ApiError> {
    let topic = state
        .topics
        .create(NewTopic {
            name: req.name,
            partitions: req.partitions,
            retention_ms: req.retention_ms,
            retention_bytes: req.retention_bytes,
        })
        .await?;
    tracing::info!(topic = %topic.name, partitions = topic.partitions, "topic created");
    Ok((StatusCode::CREATED, Json(topic.into())))
}

/// `GET /v1/topics`: every topic, sorted by name.
pub async fn list(State(state): State<AppState>) -> Result<Json<TopicList>, ApiError> {
    let snapshot = state.metastore.snapshot().await?;
    Ok(Json(TopicList {
        topics: snapshot.topics.into_values().map(TopicInfo::from).collect(),
    }))
}

/// Looks a topic up, answering 404 with the name when it does not exist.
pub(super) async fn require_topic(state: &AppState, name: &str) -> Result<TopicMeta, ApiError> {
    state.metastore.topic(name).await?.ok_or_else(|| {
        ApiError::from(MetastoreError::UnknownTopic {
            name: name.to_owned(),
        })
    })
}

/// `GET /v1/topics/{t}`: settings and per-partition state, without opening any closed log.
pub async fn describe(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<TopicDescription>, ApiError> {
    let topic = require_topic(&state, &name).await?;
    let store: Arc<Store> = Arc::clone(&state.store);
    let count = topic.partitions;
    let topic_name = topic.name.clone();
    let partition_stats = crate::blocking::run(move || {
        (0..count)
            .map(|p| {
                let stats = store.peek(&PartitionId::new(topic_name.clone(), p))?;
                let (state, reason) = match stats.state {
                    PartitionState::Open => ("open", None),
                    PartitionState::Closed => ("closed", None),
                    PartitionState::Quarantined { reason } => {
                        ("quarantined", Some(reason.to_string()))
                    }
                    PartitionState::Failed { reason } => ("failed", Some(reason.to_string())),
                };
                Ok(PartitionInfo {
                    partition: p,
                    log_start_offset: stats.log_start_offset,
                    high_watermark: stats.high_watermark,
                    size_bytes: stats.size_bytes,
                    segments: stats.segment_count,
                    state: state.to_owned(),
                    reason,
                    recovered_cut: stats.recovered_cut.map(|c| RecoveredCutInfo {
                        cuts: c.cuts,
                        records: c.records,
                        records_exact: c.records_exact,
                        bytes: c.bytes,
                        from_offset: c.from_offset,
                        at_ms: c.at_ms,
                        kept_at: c.kept_at.display().to_string(),
                    }),
                })
            })
            .collect::<Result<Vec<_>, narad_storage::StorageError>>()
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(Json(TopicDescription {
        topic: topic.into(),
        partition_stats,
    }))
}

/// `DELETE /v1/topics/{t}?force=`: the deleted topic's settings and the links removed with it.
/// A topic that has children or is a child is deleted only with `force=true`: deleting it
/// removes those links too, which an operator must not learn about afterwards.
pub async fn delete(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<DeleteTopicQuery>,
) -> Result<Json<DeletedTopic>, ApiError> {
    require_topic(&state, &name).await?;
    // Read before the delete, which drops every link naming the topic. A link attached between
    // this read and the delete is removed without being listed; attaches and deletes are rare
    // operator actions, and the metastore stays consistent either way.
    let links: Vec<LinkEnds> = state
        .metastore
        .snapshot()
        .await?
        .links
        .into_keys()
        .filter(|(parent, child)| *parent == name || *child == name)
        .map(|(parent, child)| LinkEnds { parent, child })
        .collect();
    if !links.is_empty() && !query.force {
        let names: Vec<String> = links
            .iter()
            .map(|l| format!("{} -> {}", l.parent, l.child))
            .collect();
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "topic {name:?} has fan-out links ({}); deleting it removes them: repeat with \
                 force=true (narad topic delete --force), or detach them first",
                names.join(", ")
            ),
        )
        .with("links", serde_json::to_value(&links).unwrap_or_default()));
    }
    let topic = state.topics.delete(&name).await?;
    state.api_metrics.forget_topic(&topic.name);
    tracing::info!(topic = %topic.name, removed_links = links.len(), "topic deleted");
    Ok(Json(DeletedTopic {
        topic: topic.into(),
        removed_links: links,
    }))
}

/// `POST /v1/topics/{t}/partitions`: grow to `count` partitions.
pub async fn grow(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<GrowPartitionsRequest>,
) -> Result<Json<TopicInfo>, ApiError> {
    let topic = state.topics.grow(&name, req.count).await?;
    tracing::info!(topic = %topic.name, partitions = topic.partitions, "topic grown");
    Ok(Json(topic.into()))
}
