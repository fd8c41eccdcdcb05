//! Consumer groups over HTTP, for operators: which groups there are, and per group its members
//! and how far each committed offset is behind its partition's end (the lag).
//!
//! The groups are the Kafka listener's ([`crate::groups`]): without `--kafka-listen` there are
//! none, and these routes answer 404 saying so. In cluster mode a group lives on the node that
//! owns its offsets partition: the listing gathers every such node's groups, and a group's
//! description is asked of its coordinator.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use crate::groups::{Coordinator, GroupError};

/// One group of the listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSummary {
    /// Group id.
    pub group: String,
    /// `Stable`, `PreparingRebalance`, `CompletingRebalance` or `Empty` (offsets only).
    pub state: String,
    /// Cluster mode: the coordinator node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `GET /v1/groups` answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupList {
    /// Every group known, by id.
    pub groups: Vec<GroupSummary>,
    /// Cluster mode: nodes that did not answer (their groups are missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unanswered: Vec<String>,
}

/// A member of a described group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    /// Member id.
    pub member_id: String,
    /// The client's `client.id`.
    pub client_id: String,
    /// The client's address.
    pub client_host: String,
    /// The partitions its assignment names, `topic/partition`.
    pub assigned: Vec<String>,
}

/// One committed offset of a described group, with its lag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupOffset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The next offset the group reads.
    pub committed: i64,
    /// The partition's high watermark; `None` when its owner could not be asked.
    pub high_watermark: Option<u64>,
    /// Records between the committed offset and the end (0 when the commit is at or past it).
    pub lag: Option<u64>,
    /// When it was committed (the coordinator's clock, Unix ms).
    pub committed_at_ms: i64,
}

/// `GET /v1/groups/{group}` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupInfo {
    /// Group id.
    pub group: String,
    /// Its state (`Dead` for a group with neither members nor offsets).
    pub state: String,
    /// The chosen assignor (empty without members).
    pub protocol: String,
    /// Members.
    pub members: Vec<GroupMember>,
    /// Committed offsets with their lag, by topic and partition.
    pub offsets: Vec<GroupOffset>,
    /// The sum of the known lags.
    pub total_lag: u64,
    /// Cluster mode: the coordinator node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `?local=true`: only this node's groups (what nodes ask each other).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupQuery {
    /// Only this node.
    #[serde(default)]
    pub local: bool,
}

fn coordinator(state: &AppState) -> Result<&Arc<Coordinator>, ApiError> {
    state.groups.as_ref().ok_or_else(|| {
        ApiError::not_found(
            "this daemon has no consumer groups: they come with the Kafka listener (--kafka-listen)",
        )
    })
}

fn unavailable(error: GroupError) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string()).retry_after(1)
}

/// `GET /v1/groups`: every group, on every coordinator in cluster mode.
pub(crate) async fn list(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<GroupQuery>,
) -> Result<Json<GroupList>, ApiError> {
    let coordinator = coordinator(&state)?;
    let node = state.cluster.as_ref().map(|c| c.node_id().to_owned());
    let mut listing = GroupList {
        groups: coordinator
            .list()
            .await
            .map_err(unavailable)?
            .into_iter()
            .map(|g| GroupSummary {
                group: g.group,
                state: g.state.to_owned(),
                node: node.clone(),
            })
            .collect(),
        unanswered: Vec::new(),
    };
    if let (Some(cluster), false) = (&state.cluster, query.local)
        && let Some(topic) = state.metastore.topic(crate::groups::offsets::TOPIC).await?
    {
        let answers: Vec<(String, Result<GroupList, crate::cluster::PeerError>)> =
            super::internal::ask_other_owners(cluster, &topic, "/v1/groups?local=true").await;
        for (node, answer) in answers {
            match answer {
                Ok(theirs) => listing.groups.extend(theirs.groups),
                Err(_) => listing.unanswered.push(node),
            }
        }
    }
    listing.groups.sort_by(|a, b| a.group.cmp(&b.group));
    Ok(Json(listing))
}

/// `GET /v1/groups/{group}`: members, committed offsets and lag, from the group's coordinator.
pub(crate) async fn describe(
    State(state): State<AppState>,
    ApiPath(group): ApiPath<String>,
) -> Result<Json<GroupInfo>, ApiError> {
    let coordinator = coordinator(&state)?;
    if let Some(cluster) = &state.cluster {
        let owner = coordinator
            .coordinator_of(&group)
            .await
            .map_err(unavailable)?;
        match owner {
            Some(node) if node.0 != cluster.node_id() => {
                let path = format!("/v1/groups/{group}");
                return cluster
                    .get_peer(&node.0, &path)
                    .await
                    .map(Json)
                    .map_err(|reason| {
                        ApiError::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "the coordinator of group {group:?}, node {}, {reason}",
                                node.0
                            ),
                        )
                        .retry_after(1)
                    });
            }
            Some(_) => {}
            None => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("group {group:?} has no coordinator now (its offsets partition has no owner)"),
                )
                .retry_after(1));
            }
        }
    }
    let described = coordinator.describe(&group).await.map_err(unavailable)?;
    let committed = coordinator.fetch(&group, None).await.map_err(unavailable)?;
    let offsets = with_lag(&state, committed, &mut BTreeMap::new()).await?;
    Ok(Json(GroupInfo {
        total_lag: offsets.iter().filter_map(|o| o.lag).sum(),
        group,
        state: described.state.to_owned(),
        protocol: described.protocol,
        members: described
            .members
            .into_iter()
            .map(|m| GroupMember {
                assigned: assigned_partitions(&m.assignment),
                member_id: m.member_id,
                client_id: m.client_id,
                client_host: m.client_host,
            })
            .collect(),
        offsets,
        node: state.cluster.as_ref().map(|c| c.node_id().to_owned()),
    }))
}

/// Where `POST /v1/groups/{group}/reset-offsets` moves the offsets: `"earliest"`,
/// `"latest"`, `{"offset": N}` or `{"timestamp_ms": T}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetTo {
    /// Each partition's oldest stored record.
    Earliest,
    /// Each partition's end: the group reads only what comes next.
    Latest,
    /// This offset, in every partition (kept within each partition's stored range).
    Offset(u64),
    /// Each partition's first record committed at or after this moment (Unix ms), or its end.
    TimestampMs(i64),
}

/// `POST /v1/groups/{group}/reset-offsets` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetOffsets {
    /// Where to.
    pub to: ResetTo,
    /// The topics whose partitions are reset; empty: every topic the group has offsets for.
    #[serde(default)]
    pub topics: Vec<String>,
    /// Write the new offsets. Without it the answer is the plan and nothing changes, as
    /// `kafka-consumer-groups.sh --reset-offsets` without `--execute`.
    #[serde(default)]
    pub execute: bool,
}

/// One partition of a reset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetEntry {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The committed offset before (`None`: the group had none there).
    pub from: Option<i64>,
    /// The offset after.
    pub to: u64,
}

/// `POST /v1/groups/{group}/reset-offsets` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResetDone {
    /// Group id.
    pub group: String,
    /// Whether the offsets were written (`false`: the plan only).
    pub executed: bool,
    /// Every partition, by topic and partition.
    pub offsets: Vec<ResetEntry>,
    /// Cluster mode: the coordinator node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Most topics one reset names.
const MAX_RESET_TOPICS: usize = 100;

/// `POST /v1/groups/{group}/reset-offsets`: moves an empty group's committed offsets (or
/// shows where they would go), on the group's coordinator.
pub(crate) async fn reset_offsets(
    State(state): State<AppState>,
    ApiPath(group): ApiPath<String>,
    ApiJson(request): ApiJson<ResetOffsets>,
) -> Result<Json<ResetDone>, ApiError> {
    let coordinator = coordinator(&state)?;
    if let Some(cluster) = &state.cluster {
        let owner = coordinator
            .coordinator_of(&group)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| no_coordinator(&group))?;
        if owner.0 != cluster.node_id() {
            let path = format!("/internal/v1/groups/{group}/reset-offsets");
            let what = format!("the coordinator of group {group:?}");
            return super::internal::peer_post(cluster, &owner.0, &path, &request, &what)
                .await
                .map(Json);
        }
    }
    reset_here(&state, &group, request).await.map(Json)
}

/// `POST /internal/v1/groups/{group}/reset-offsets`: the reset on this node, the coordinator.
pub(crate) async fn reset_offsets_local(
    State(state): State<AppState>,
    ApiPath(group): ApiPath<String>,
    ApiJson(request): ApiJson<ResetOffsets>,
) -> Result<Json<ResetDone>, ApiError> {
    reset_here(&state, &group, request).await.map(Json)
}

fn no_coordinator(group: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("group {group:?} has no coordinator now (its offsets partition has no owner)"),
    )
    .retry_after(1)
}

async fn reset_here(
    state: &AppState,
    group: &str,
    request: ResetOffsets,
) -> Result<ResetDone, ApiError> {
    let coordinator = coordinator(state)?;
    let described = coordinator.describe(group).await.map_err(unavailable)?;
    if !described.members.is_empty() {
        return Err(has_members(group, described.members.len()));
    }
    let committed = coordinator.fetch(group, None).await.map_err(unavailable)?;
    let before: BTreeMap<(String, u32), i64> = committed
        .iter()
        .filter_map(|c| {
            Some((
                (c.topic.clone(), u32::try_from(c.partition).ok()?),
                c.offset,
            ))
        })
        .collect();
    let mut topics = request.topics.clone();
    if topics.is_empty() {
        topics = before.keys().map(|(t, _)| t.clone()).collect();
        topics.dedup();
        if topics.is_empty() {
            return Err(ApiError::bad_request(format!(
                "group {group:?} has no committed offsets: name the topics to reset (--topic)"
            )));
        }
    }
    topics.sort();
    topics.dedup();
    if topics.len() > MAX_RESET_TOPICS {
        return Err(ApiError::bad_request(format!(
            "a reset names at most {MAX_RESET_TOPICS} topics, not {}",
            topics.len()
        )));
    }
    let mut offsets = Vec::new();
    for topic in &topics {
        let meta = super::topics::require_topic(state, topic).await?;
        let gathered = |reason: String| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the partitions of {topic}: {reason}"),
            )
            .retry_after(1)
        };
        let bounds = super::internal::gather_bounds(state, topic, meta.partitions)
            .await
            .map_err(gathered)?;
        let at_time = match request.to {
            ResetTo::TimestampMs(ms) => Some(
                super::internal::gather_offsets_at(state, topic, meta.partitions, ms)
                    .await
                    .map_err(gathered)?,
            ),
            _ => None,
        };
        for (p, b) in bounds.iter().enumerate() {
            let partition = u32::try_from(p).unwrap_or(u32::MAX);
            let start = b.log_start.unwrap_or(0);
            let to = match request.to {
                ResetTo::Earliest => start,
                ResetTo::Latest => b.high_watermark,
                ResetTo::Offset(n) => n.clamp(start, b.high_watermark.max(start)),
                ResetTo::TimestampMs(_) => at_time
                    .as_ref()
                    .and_then(|found| found.get(p).copied().flatten())
                    .unwrap_or(b.high_watermark),
            };
            offsets.push(ResetEntry {
                topic: topic.clone(),
                partition,
                from: before.get(&(topic.clone(), partition)).copied(),
                to,
            });
        }
    }
    if request.execute {
        let now = crate::topics::now_ms();
        let entries = offsets
            .iter()
            .map(|o| crate::groups::offsets::Committed {
                topic: o.topic.clone(),
                partition: i32::try_from(o.partition).unwrap_or(i32::MAX),
                offset: i64::try_from(o.to).unwrap_or(i64::MAX),
                leader_epoch: -1,
                metadata: None,
                commit_ms: now,
            })
            .collect();
        let code = coordinator
            .reset(group, entries)
            .await
            .map_err(unavailable)?;
        if code == crate::groups::membership::code::NON_EMPTY_GROUP {
            return Err(has_members(group, 1));
        }
        tracing::info!(group, to = ?request.to, partitions = offsets.len(),
            "consumer group offsets reset by an operator");
    }
    Ok(ResetDone {
        group: group.to_owned(),
        executed: request.execute,
        offsets,
        node: state.cluster.as_ref().map(|c| c.node_id().to_owned()),
    })
}

fn has_members(group: &str, members: usize) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "group {group:?} has {} now: stop its consumers first (their commits would replace \
             the reset)",
            if members == 1 {
                "a member".to_owned()
            } else {
                format!("{members} members")
            }
        ),
    )
}

/// Each partition's bounds, gathered once per topic (`None`: they could not be read now).
pub(crate) type BoundsByTopic = BTreeMap<String, Option<Vec<super::internal::PartitionBounds>>>;

/// `committed` with each partition's end and the lag, by topic and partition; `bounds` keeps
/// each topic's partition bounds for the next call (one gathering per topic).
pub(crate) async fn with_lag(
    state: &AppState,
    committed: Vec<crate::groups::offsets::Committed>,
    bounds: &mut BoundsByTopic,
) -> Result<Vec<GroupOffset>, ApiError> {
    let mut offsets = Vec::with_capacity(committed.len());
    for c in committed {
        let Ok(partition) = u32::try_from(c.partition) else {
            continue;
        };
        if !bounds.contains_key(&c.topic) {
            let partitions = state
                .metastore
                .topic(&c.topic)
                .await?
                .map_or(0, |t| t.partitions);
            let gathered = super::internal::gather_bounds(state, &c.topic, partitions)
                .await
                .ok();
            bounds.insert(c.topic.clone(), gathered);
        }
        let high = bounds
            .get(&c.topic)
            .and_then(|b| b.as_ref())
            .and_then(|b| b.get(partition as usize))
            .map(|b| b.high_watermark);
        offsets.push(GroupOffset {
            lag: high.map(|h| h.saturating_sub(u64::try_from(c.offset).unwrap_or(0))),
            high_watermark: high,
            topic: c.topic,
            partition,
            committed: c.offset,
            committed_at_ms: c.commit_ms,
        });
    }
    offsets.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(offsets)
}

/// The offsets `group` has committed, asked of its coordinator (another node's in cluster
/// mode).
pub(crate) async fn committed_offsets(
    state: &AppState,
    group: &str,
) -> Result<Vec<GroupOffset>, ApiError> {
    let coordinator = coordinator(state)?;
    if let Some(cluster) = &state.cluster {
        let owner = coordinator
            .coordinator_of(group)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| no_coordinator(group))?;
        if owner.0 != cluster.node_id() {
            let info: GroupInfo = cluster
                .get_peer(&owner.0, &format!("/v1/groups/{group}"))
                .await
                .map_err(|reason| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("the coordinator of group {group:?}: {reason}"),
                    )
                    .retry_after(1)
                })?;
            return Ok(info.offsets);
        }
    }
    let committed = coordinator.fetch(group, None).await.map_err(unavailable)?;
    Ok(committed
        .into_iter()
        .filter_map(|c| {
            Some(GroupOffset {
                partition: u32::try_from(c.partition).ok()?,
                topic: c.topic,
                committed: c.offset,
                high_watermark: None,
                lag: None,
                committed_at_ms: c.commit_ms,
            })
        })
        .collect())
}

/// The `topic/partition`s a consumer-protocol assignment names (empty when it is not one).
fn assigned_partitions(assignment: &[u8]) -> Vec<String> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;
    let mut buf = bytes::Bytes::copy_from_slice(assignment);
    if buf.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    let Ok(decoded) = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)) else {
        return Vec::new();
    };
    let mut named: Vec<String> = decoded
        .assigned_partitions
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| format!("{}/{p}", t.topic.0))
        })
        .collect();
    named.sort();
    named
}
