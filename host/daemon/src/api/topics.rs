//! Topic endpoints: create, list, describe, delete, grow.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use narad_storage::{PartitionId, PartitionState, Store};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::types::{
    CreateTopicRequest, DeleteTopicQuery, DeletedTopic, DescribeQuery, GrowPartitionsRequest,
    LinkEnds, PartitionInfo, RecoveredCutInfo, TopicDescription, TopicInfo, TopicList,
};
use crate::metastore::transition::link_names_topic;
use crate::metastore::{MetastoreError, TopicMeta};
use crate::topics::{NewTopic, TopicError};

impl From<TopicMeta> for TopicInfo {
    fn from(t: TopicMeta) -> TopicInfo {
        TopicInfo {
            name: t.name,
            partitions: t.partitions,
            retention_ms: t.retention_ms,
            retention_bytes: t.retention_bytes,
            created_at: t.created_at_ms,
            owners: t.owners.into_iter().map(|o| o.node).collect(),
            writable_as_child: t.writable_as_child,
        }
    }
}

/// `POST /v1/topics`: 201 with the topic.
pub(crate) async fn create(
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
            placement: req.placement,
        })
        .await?;
    tracing::info!(topic = %topic.name, partitions = topic.partitions, "topic created");
    Ok((StatusCode::CREATED, Json(topic.into())))
}

/// `GET /v1/topics`: every topic, sorted by name.
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<TopicList>, ApiError> {
    let snapshot = state.metastore.snapshot().await?;
    Ok(Json(TopicList {
        topics: snapshot
            .topics
            .into_iter()
            .map(|(_, topic)| TopicInfo::from(topic))
            .collect(),
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

/// `GET /v1/topics/{t}`: settings and per-partition state, without opening any closed log. In
/// cluster mode each partition's figures come from its owner, asked concurrently; a partition
/// whose owner cannot answer is listed as `unavailable` with the reason.
pub(crate) async fn describe(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<DescribeQuery>,
) -> Result<Json<TopicDescription>, ApiError> {
    let topic = require_topic(&state, &name).await?;
    let owner_of = |p: u32| topic.owners.get(p as usize).map(|o| o.node.clone());
    let mut local = Vec::new();
    let mut remote: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for p in 0..topic.partitions {
        let id = PartitionId::new(topic.name.clone(), p);
        match (&state.cluster, owner_of(p)) {
            (None, _) => local.push(p),
            (Some(_), Some(_)) if state.ownership.is_local(&id) => {
                state.topics.ensure_owned(&topic, p).await?;
                local.push(p);
            }
            (Some(_), Some(owner)) if !query.local => remote.entry(owner).or_default().push(p),
            (Some(_), _) => {}
        }
    }
    let mut stats = local_stats(&state, &topic, local).await?;
    if let Some(cluster) = &state.cluster {
        for info in &mut stats {
            info.owner = owner_of(info.partition);
        }
        stats.extend(remote_stats(cluster, &topic.name, remote).await);
        stats.sort_by_key(|s| s.partition);
    }
    Ok(Json(TopicDescription {
        topic: topic.into(),
        partition_stats: stats,
    }))
}

/// The figures of `partitions` of `topic`, from this node's store.
async fn local_stats(
    state: &AppState,
    topic: &TopicMeta,
    partitions: Vec<u32>,
) -> Result<Vec<PartitionInfo>, ApiError> {
    let store: Arc<Store> = Arc::clone(&state.store);
    let topic_name = topic.name.clone();
    let partition_stats = crate::blocking::run(move || {
        partitions
            .into_iter()
            .map(|p| {
                let stats = store.peek(&PartitionId::new(topic_name.clone(), p))?;
                let (state, reason) = match stats.state {
                    PartitionState::Open => ("open", None),
                    PartitionState::Closed => ("closed", None),
                    PartitionState::Sealed => ("moving", None),
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
                    owner: None,
                })
            })
            .collect::<Result<Vec<_>, narad_storage::StorageError>>()
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(partition_stats)
}

/// The figures of the partitions other nodes own, asked of each owner concurrently. An owner
/// that cannot answer gets `unavailable` entries saying why, so one dead node does not hide
/// the rest of the topic.
async fn remote_stats(
    cluster: &Arc<crate::cluster::ClusterContext>,
    topic: &str,
    by_owner: BTreeMap<String, Vec<u32>>,
) -> Vec<PartitionInfo> {
    let calls: Vec<_> = by_owner
        .into_iter()
        .map(|(node, wanted)| {
            let (cluster, topic) = (Arc::clone(cluster), topic.to_owned());
            tokio::spawn(async move {
                let answer = owner_stats(&cluster, &topic, &node).await;
                wanted
                    .into_iter()
                    .map(|p| match &answer {
                        Ok(stats) => stats
                            .iter()
                            .find(|s| s.partition == p)
                            .cloned()
                            .map(|mut s| {
                                s.owner = Some(node.clone());
                                s
                            })
                            .unwrap_or_else(|| {
                                unavailable(p, &node, format!("node {node} does not serve it"))
                            }),
                        Err(reason) => unavailable(p, &node, reason.to_string()),
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut out = Vec::new();
    for call in calls {
        if let Ok(part) = call.await {
            out.extend(part);
        }
    }
    out
}

async fn owner_stats(
    cluster: &crate::cluster::ClusterContext,
    topic: &str,
    node: &str,
) -> Result<Vec<PartitionInfo>, crate::cluster::PeerError> {
    let description: TopicDescription = cluster
        .get_peer(node, &format!("/v1/topics/{topic}?local=true"))
        .await?;
    Ok(description.partition_stats)
}

fn unavailable(partition: u32, node: &str, reason: String) -> PartitionInfo {
    PartitionInfo {
        partition,
        log_start_offset: 0,
        high_watermark: None,
        size_bytes: 0,
        segments: 0,
        state: "unavailable".to_owned(),
        reason: Some(reason),
        recovered_cut: None,
        owner: Some(node.to_owned()),
    }
}

/// `DELETE /v1/topics/{t}?force=`: the deleted topic's settings and the links removed with it.
/// A topic that has children or is a child is deleted only with `force=true`: deleting it
/// removes those links too, which an operator must not learn about afterwards.
pub(crate) async fn delete(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<DeleteTopicQuery>,
) -> Result<Json<DeletedTopic>, ApiError> {
    require_topic(&state, &name).await?;
    // Without force, the metastore refuses the delete of a topic in any link in the same step
    // that would delete it, so a link attached a moment before is never removed unseen. With
    // force the links are read first, to report them; one attached between that read and the
    // delete goes too, unlisted (the operator asked for the topic's links to go).
    let links: Vec<LinkEnds> = match query.force {
        true => state
            .metastore
            .snapshot()
            .await?
            .links
            .into_iter()
            .filter(|(ends, link)| link_names_topic(ends, link, &name))
            .map(|((parent, child), _)| LinkEnds { parent, child })
            .collect(),
        false => Vec::new(),
    };
    let topic = match state.topics.delete(&name, query.force).await {
        Ok(topic) => topic,
        Err(TopicError::Metastore(MetastoreError::TopicHasLinks { name, links })) => {
            let ends: Vec<LinkEnds> = links
                .iter()
                .map(|(parent, child)| LinkEnds {
                    parent: parent.clone(),
                    child: child.clone(),
                })
                .collect();
            let refused = MetastoreError::TopicHasLinks { name, links };
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "{refused}: repeat with force=true (narad topic delete --force), or detach \
                     them first"
                ),
            )
            .with("links", serde_json::to_value(&ends).unwrap_or_default()));
        }
        Err(e) => return Err(e.into()),
    };
    state.api_metrics.forget_topic(&topic.name);
    tracing::info!(topic = %topic.name, removed_links = links.len(), "topic deleted");
    Ok(Json(DeletedTopic {
        topic: topic.into(),
        removed_links: links,
    }))
}

/// `POST /v1/topics/{t}/partitions`: grow to `count` partitions.
pub(crate) async fn grow(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<GrowPartitionsRequest>,
) -> Result<Json<TopicInfo>, ApiError> {
    let topic = state.topics.grow(&name, req.count).await?;
    tracing::info!(topic = %topic.name, partitions = topic.partitions, "topic grown");
    Ok(Json(topic.into()))
}
