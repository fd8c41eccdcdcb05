//! The consumer group APIs (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups) mapped onto
//! [`crate::groups::Coordinator`]. Everything about groups is decided there; this module
//! translates the Kafka messages, at every offered version, and checks what only the wire
//! knows (topics named in commits, metadata sizes).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::Coordinator as FoundCoordinator;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
    SyncGroupResponse, TopicName,
};
use kafka_protocol::messages::{
    delete_groups_response, describe_groups_response, join_group_response, leave_group_response,
    list_groups_response,
};
use kafka_protocol::protocol::StrBytes;

use super::{Advertised, KafkaDeps};
use crate::groups::membership::{JoinArgs, Step, code};
use crate::groups::offsets::{Committed, MAX_METADATA_BYTES};
use crate::groups::{Coordinator, GroupError};

/// Who sent a request: member ids start with the client id, DescribeGroups shows both.
#[derive(Clone, Debug, Default)]
pub(crate) struct Client {
    /// The request header's client id.
    pub id: String,
    /// The peer's address, as Kafka shows it (`/IP`).
    pub host: String,
}

/// OffsetCommit's answer for an offset whose metadata is too long.
const OFFSET_METADATA_TOO_LARGE: i16 = 12;
/// The answer for a topic or partition that does not exist.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
/// FindCoordinator for a transaction coordinator: narad has none.
const COORDINATOR_TYPE_GROUP: i8 = 0;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

fn group_error(e: &GroupError, group: &str) -> i16 {
    if matches!(e, GroupError::Unavailable(_)) {
        tracing::warn!(%group, error = %e, "kafka: consumer group request failed");
    }
    e.code()
}

/// FindCoordinator: the owner of each group's offsets partition.
pub(crate) async fn find_coordinator(
    deps: &Arc<KafkaDeps>,
    coordinator: &Coordinator,
    advertised: &Advertised,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let mut response = FindCoordinatorResponse::default();
    let keys: Vec<StrBytes> = match version >= 4 {
        true => request.coordinator_keys,
        false => vec![request.key],
    };
    for key in keys {
        let mut found = FoundCoordinator::default();
        found.key = key.clone();
        found.node_id = BrokerId(-1);
        found.host = text("");
        found.port = -1;
        if request.key_type != COORDINATOR_TYPE_GROUP {
            found.error_code = code::COORDINATOR_NOT_AVAILABLE;
            found.error_message = Some(text("narad has no transaction coordinator"));
        } else {
            match coordinator.coordinator_of(key.as_str()).await {
                Ok(Some(node)) => {
                    match super::metadata::broker_address(deps, advertised, &node.0) {
                        Some((id, host, port)) => {
                            found.node_id = id;
                            found.host = text(&host);
                            found.port = port;
                        }
                        None => found.error_code = code::COORDINATOR_NOT_AVAILABLE,
                    }
                }
                Ok(None) => found.error_code = code::COORDINATOR_NOT_AVAILABLE,
                Err(e) => found.error_code = group_error(&e, key.as_str()),
            }
        }
        response.coordinators.push(found);
    }
    if version < 4
        && let Some(only) = response.coordinators.pop()
    {
        response.error_code = only.error_code;
        response.error_message = only.error_message;
        response.node_id = only.node_id;
        response.host = only.host;
        response.port = only.port;
    }
    response
}

/// JoinGroup: answered when the group's rebalance round completes.
pub(crate) async fn join_group(
    coordinator: &Coordinator,
    client: &Client,
    request: JoinGroupRequest,
    version: i16,
) -> JoinGroupResponse {
    let group = request.group_id.0.to_string();
    let rebalance_ms = match version {
        0 => request.session_timeout_ms,
        _ => request.rebalance_timeout_ms,
    };
    let args = JoinArgs {
        member_id: request.member_id.to_string(),
        instance_id: request.group_instance_id.map(|i| i.to_string()),
        client_id: client.id.clone(),
        client_host: client.host.clone(),
        session_timeout: millis(request.session_timeout_ms),
        rebalance_timeout: millis(rebalance_ms),
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: version >= 4,
    };
    let member_id = args.member_id.clone();
    let mut response = JoinGroupResponse::default();
    response.generation_id = -1;
    response.member_id = text(&member_id);
    let answer = match coordinator.join(&group, args).await {
        Ok(Step::Now(answer)) => answer,
        Ok(Step::Later(waiting)) => match waiting.await {
            Ok(answer) => answer,
            Err(_) => {
                response.error_code = code::COORDINATOR_NOT_AVAILABLE;
                return response;
            }
        },
        Err(e) => {
            response.error_code = group_error(&e, &group);
            return response;
        }
    };
    response.error_code = answer.error;
    response.generation_id = answer.generation;
    response.protocol_type = answer.protocol_type.as_deref().map(text);
    response.protocol_name = answer.protocol.as_deref().map(text);
    if version < 7 && response.protocol_name.is_none() {
        // Not nullable before v7.
        response.protocol_name = Some(text(""));
    }
    response.leader = text(&answer.leader);
    response.member_id = text(&answer.member_id);
    response.members = answer
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            let mut member = join_group_response::JoinGroupResponseMember::default();
            member.member_id = text(&id);
            member.group_instance_id = instance.as_deref().map(text);
            member.metadata = metadata;
            member
        })
        .collect();
    response
}

fn millis(ms: i32) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// SyncGroup: the leader's assignments, relayed to every member.
pub(crate) async fn sync_group(
    coordinator: &Coordinator,
    request: SyncGroupRequest,
) -> SyncGroupResponse {
    let group = request.group_id.0.to_string();
    let mut response = SyncGroupResponse::default();
    let assignments: Vec<(String, Bytes)> = request
        .assignments
        .into_iter()
        .map(|a| (a.member_id.to_string(), a.assignment))
        .collect();
    let step = coordinator
        .sync(
            &group,
            request.member_id.as_str(),
            request.generation_id,
            assignments,
        )
        .await;
    let answer = match step {
        Ok(Step::Now(answer)) => answer,
        Ok(Step::Later(waiting)) => match waiting.await {
            Ok(answer) => answer,
            Err(_) => {
                response.error_code = code::COORDINATOR_NOT_AVAILABLE;
                return response;
            }
        },
        Err(e) => {
            response.error_code = group_error(&e, &group);
            return response;
        }
    };
    if answer.error == code::NONE {
        let named = |asked: &Option<StrBytes>, is: &Option<String>| {
            asked
                .as_ref()
                .is_none_or(|a| is.as_deref() == Some(a.as_str()))
        };
        if !named(&request.protocol_type, &answer.protocol_type)
            || !named(&request.protocol_name, &answer.protocol)
        {
            response.error_code = code::INCONSISTENT_GROUP_PROTOCOL;
            return response;
        }
    }
    response.error_code = answer.error;
    response.assignment = answer.assignment;
    response.protocol_type = answer.protocol_type.as_deref().map(text);
    response.protocol_name = answer.protocol.as_deref().map(text);
    response
}

/// Heartbeat.
pub(crate) async fn heartbeat(
    coordinator: &Coordinator,
    request: HeartbeatRequest,
) -> HeartbeatResponse {
    let group = request.group_id.0.to_string();
    let mut response = HeartbeatResponse::default();
    response.error_code = match coordinator
        .heartbeat(&group, request.member_id.as_str(), request.generation_id)
        .await
    {
        Ok(code) => code,
        Err(e) => group_error(&e, &group),
    };
    response
}

/// LeaveGroup: one member (before v3) or several.
pub(crate) async fn leave_group(
    coordinator: &Coordinator,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let group = request.group_id.0.to_string();
    let mut response = LeaveGroupResponse::default();
    if version < 3 {
        response.error_code = match coordinator.leave(&group, request.member_id.as_str()).await {
            Ok(code) => code,
            Err(e) => group_error(&e, &group),
        };
        return response;
    }
    for member in request.members {
        let mut answer = leave_group_response::MemberResponse::default();
        answer.member_id = member.member_id.clone();
        answer.group_instance_id = member.group_instance_id.clone();
        match coordinator.leave(&group, member.member_id.as_str()).await {
            Ok(code) => answer.error_code = code,
            Err(e) => {
                // The whole request fails as one when the coordinator is wrong.
                response.error_code = group_error(&e, &group);
                response.members.clear();
                return response;
            }
        }
        response.members.push(answer);
    }
    response
}

/// Partitions of one topic of an OffsetCommit, each with the error only it gets.
type PartitionRefusals = Vec<(i32, Option<i16>)>;

/// OffsetCommit: every offset of a known partition committed durably in one record before
/// the answer.
pub(crate) async fn offset_commit(
    deps: &Arc<KafkaDeps>,
    coordinator: &Coordinator,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group = request.group_id.0.to_string();
    let now = crate::topics::now_ms();
    let mut partition_counts: HashMap<String, Option<u32>> = HashMap::new();
    // Per topic, each partition with its own refusal (`None`: committed with the rest).
    let mut answers: Vec<(TopicName, PartitionRefusals)> = Vec::new();
    let mut entries = Vec::new();
    for topic in &request.topics {
        let name = topic.name.0.to_string();
        if !partition_counts.contains_key(&name) {
            let count = deps
                .metastore
                .topic(&name)
                .await
                .ok()
                .flatten()
                .map(|t| t.partitions);
            partition_counts.insert(name.clone(), count);
        }
        let count = partition_counts.get(&name).copied().flatten();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let known =
                count.is_some_and(|c| u32::try_from(p.partition_index).is_ok_and(|i| i < c));
            let refusal = if !known {
                Some(UNKNOWN_TOPIC_OR_PARTITION)
            } else if p
                .committed_metadata
                .as_ref()
                .is_some_and(|m| m.len() > MAX_METADATA_BYTES)
            {
                Some(OFFSET_METADATA_TOO_LARGE)
            } else {
                entries.push(Committed {
                    topic: name.clone(),
                    partition: p.partition_index,
                    offset: p.committed_offset,
                    leader_epoch: p.committed_leader_epoch,
                    metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    commit_ms: now,
                });
                None
            };
            partitions.push((p.partition_index, refusal));
        }
        answers.push((topic.name.clone(), partitions));
    }
    let outcome = match coordinator
        .commit(
            &group,
            request.member_id.as_str(),
            request.generation_id_or_member_epoch,
            entries,
        )
        .await
    {
        Ok(code) => code,
        Err(e) => group_error(&e, &group),
    };
    let mut response = OffsetCommitResponse::default();
    response.topics = answers
        .into_iter()
        .map(|(name, partitions)| {
            let mut topic = OffsetCommitResponseTopic::default();
            topic.name = name;
            topic.partitions = partitions
                .into_iter()
                .map(|(index, refusal)| {
                    let mut p = OffsetCommitResponsePartition::default();
                    p.partition_index = index;
                    p.error_code = refusal.unwrap_or(outcome);
                    p
                })
                .collect();
            topic
        })
        .collect();
    response
}

/// One group's committed offsets, for [`offset_fetch`]: `(topic, partitions)` with
/// `(partition, offset, leader epoch, metadata)`, or the group's error code.
type Fetched = Result<FetchedTopics, i16>;

/// Committed offsets by topic: `(topic, partitions)` with `(partition, offset, leader epoch,
/// metadata)`.
type FetchedTopics = Vec<(String, Vec<(i32, i64, i32, Option<String>)>)>;

async fn fetch_group(
    coordinator: &Coordinator,
    group: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
) -> Fetched {
    let wanted: Option<Vec<(String, i32)>> = topics.as_ref().map(|topics| {
        topics
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
            .collect()
    });
    let found = coordinator
        .fetch(group, wanted.as_deref())
        .await
        .map_err(|e| group_error(&e, group))?;
    let mut by_key: HashMap<(String, i32), Committed> = found
        .into_iter()
        .map(|c| ((c.topic.clone(), c.partition), c))
        .collect();
    let layout: Vec<(String, Vec<i32>)> = match topics {
        Some(topics) => topics,
        None => {
            let mut all: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
            for (topic, partition) in by_key.keys() {
                all.entry(topic.clone()).or_default().push(*partition);
            }
            all.into_iter()
                .map(|(t, mut ps)| {
                    ps.sort_unstable();
                    (t, ps)
                })
                .collect()
        }
    };
    Ok(layout
        .into_iter()
        .map(|(topic, partitions)| {
            let answered = partitions
                .into_iter()
                .map(|p| match by_key.remove(&(topic.clone(), p)) {
                    Some(c) => (p, c.offset, c.leader_epoch, c.metadata),
                    None => (p, -1, -1, Some(String::new())),
                })
                .collect();
            (topic, answered)
        })
        .collect())
}

/// OffsetFetch: committed offsets (-1 where none), one group (before v8) or several.
pub(crate) async fn offset_fetch(
    coordinator: &Coordinator,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let mut response = OffsetFetchResponse::default();
    if version < 8 {
        let topics = request.topics.map(|ts| {
            ts.into_iter()
                .map(|t| (t.name.0.to_string(), t.partition_indexes))
                .collect()
        });
        match fetch_group(coordinator, &request.group_id.0, topics).await {
            Ok(found) => {
                response.topics = shape_fetched(found, |name, partitions| {
                    let mut t = OffsetFetchResponseTopic::default();
                    t.name = name;
                    t.partitions = partitions
                        .into_iter()
                        .map(|(index, offset, epoch, metadata)| {
                            let mut p = OffsetFetchResponsePartition::default();
                            p.partition_index = index;
                            p.committed_offset = offset;
                            p.committed_leader_epoch = epoch;
                            p.metadata = metadata;
                            p
                        })
                        .collect();
                    t
                })
            }
            Err(code) => response.error_code = code,
        }
        return response;
    }
    for asked in request.groups {
        let topics = asked.topics.map(|ts| {
            ts.into_iter()
                .map(|t| (t.name.0.to_string(), t.partition_indexes))
                .collect()
        });
        let mut answer = OffsetFetchResponseGroup::default();
        match fetch_group(coordinator, &asked.group_id.0, topics).await {
            Ok(found) => {
                answer.topics = shape_fetched(found, |name, partitions| {
                    let mut t = OffsetFetchResponseTopics::default();
                    t.name = name;
                    t.partitions = partitions
                        .into_iter()
                        .map(|(index, offset, epoch, metadata)| {
                            let mut p = OffsetFetchResponsePartitions::default();
                            p.partition_index = index;
                            p.committed_offset = offset;
                            p.committed_leader_epoch = epoch;
                            p.metadata = metadata;
                            p
                        })
                        .collect();
                    t
                })
            }
            Err(code) => answer.error_code = code,
        }
        answer.group_id = asked.group_id;
        response.groups.push(answer);
    }
    response
}

/// A fetched partition as the wire wants it: `(partition, offset, leader epoch, metadata)`.
type FetchedPartition = (i32, i64, i32, Option<StrBytes>);

/// Turns [`fetch_group`]'s answer into the response's topics; `topic` builds one of the
/// version's topic types (before v8 and from v8 they differ only in name).
fn shape_fetched<T>(
    found: FetchedTopics,
    topic: impl Fn(TopicName, Vec<FetchedPartition>) -> T,
) -> Vec<T> {
    found
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, offset, epoch, metadata)| {
                    (index, offset, epoch, metadata.as_deref().map(text))
                })
                .collect();
            topic(TopicName(text(&name)), partitions)
        })
        .collect()
}

/// ListGroups: the groups this node coordinates.
pub(crate) async fn list_groups(
    coordinator: &Coordinator,
    request: ListGroupsRequest,
) -> ListGroupsResponse {
    let mut response = ListGroupsResponse::default();
    match coordinator.list().await {
        Ok(groups) => {
            response.groups = groups
                .into_iter()
                .filter(|g| {
                    request.states_filter.is_empty()
                        || request
                            .states_filter
                            .iter()
                            .any(|s| s.as_str().eq_ignore_ascii_case(g.state))
                })
                .map(|g| {
                    let mut listed = list_groups_response::ListedGroup::default();
                    listed.group_id = GroupId(text(&g.group));
                    listed.protocol_type = text(&g.protocol_type);
                    listed.group_state = text(g.state);
                    listed.group_type = text("classic");
                    listed
                })
                .collect();
        }
        Err(e) => response.error_code = group_error(&e, "*"),
    }
    response
}

/// DescribeGroups.
pub(crate) async fn describe_groups(
    coordinator: &Coordinator,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let mut response = DescribeGroupsResponse::default();
    for group_id in request.groups {
        let group = group_id.0.to_string();
        let mut described = describe_groups_response::DescribedGroup::default();
        described.group_id = group_id;
        // -2^31: authorized operations not computed (Kafka's "not requested" value).
        described.authorized_operations = i32::MIN;
        match coordinator.describe(&group).await {
            Ok(d) => {
                described.group_state = text(d.state);
                described.protocol_type = text(&d.protocol_type);
                described.protocol_data = text(&d.protocol);
                described.members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut member = describe_groups_response::DescribedGroupMember::default();
                        member.member_id = text(&m.member_id);
                        member.group_instance_id = m.instance_id.as_deref().map(text);
                        member.client_id = text(&m.client_id);
                        member.client_host = text(&m.client_host);
                        member.member_metadata = m.metadata;
                        member.member_assignment = m.assignment;
                        member
                    })
                    .collect();
            }
            Err(e) => described.error_code = group_error(&e, &group),
        }
        response.groups.push(described);
    }
    response
}

/// DeleteGroups: only groups without members; their offsets are gone when answered.
pub(crate) async fn delete_groups(
    coordinator: &Coordinator,
    request: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut response = DeleteGroupsResponse::default();
    for group_id in request.groups_names {
        let group = group_id.0.to_string();
        let mut result = delete_groups_response::DeletableGroupResult::default();
        result.group_id = group_id;
        result.error_code = match coordinator.delete(&group).await {
            Ok(code) => code,
            Err(e) => group_error(&e, &group),
        };
        response.results.push(result);
    }
    response
}

/// The answer to a group request when this listener has no coordinator: every group and
/// partition named gets COORDINATOR_NOT_AVAILABLE.
pub(crate) fn unavailable(request: super::Request, version: i16) -> super::Response {
    refused(request, code::COORDINATOR_NOT_AVAILABLE, version)
}

/// The answer to a group request (at `version`) that is not served: every group and
/// partition named gets `error`.
pub(crate) fn refused(request: super::Request, error: i16, version: i16) -> super::Response {
    use super::{Request, Response};
    match request {
        Request::FindCoordinator(req) => {
            let mut r = FindCoordinatorResponse::default();
            // Before v4 the one key's answer is at the top; from v4 each key has its own (and
            // the top-level fields do not exist there, so they must stay at their defaults).
            if req.coordinator_keys.is_empty() {
                r.error_code = error;
                r.node_id = BrokerId(-1);
                r.port = -1;
            }
            r.coordinators = req
                .coordinator_keys
                .into_iter()
                .map(|key| {
                    let mut c = FoundCoordinator::default();
                    c.key = key;
                    c.node_id = BrokerId(-1);
                    c.port = -1;
                    c.error_code = error;
                    c
                })
                .collect();
            Response::FindCoordinator(r)
        }
        Request::JoinGroup(req) => {
            let mut r = JoinGroupResponse::default();
            r.error_code = error;
            r.generation_id = -1;
            r.member_id = req.member_id;
            r.protocol_name = Some(text(""));
            Response::JoinGroup(r)
        }
        Request::SyncGroup(_) => {
            let mut r = SyncGroupResponse::default();
            r.error_code = error;
            Response::SyncGroup(r)
        }
        Request::Heartbeat(_) => {
            let mut r = HeartbeatResponse::default();
            r.error_code = error;
            Response::Heartbeat(r)
        }
        Request::LeaveGroup(_) => {
            let mut r = LeaveGroupResponse::default();
            r.error_code = error;
            Response::LeaveGroup(r)
        }
        Request::OffsetCommit(req) => {
            let mut r = OffsetCommitResponse::default();
            r.topics = req
                .topics
                .into_iter()
                .map(|t| {
                    let mut topic = OffsetCommitResponseTopic::default();
                    topic.name = t.name;
                    topic.partitions = t
                        .partitions
                        .into_iter()
                        .map(|p| {
                            let mut answer = OffsetCommitResponsePartition::default();
                            answer.partition_index = p.partition_index;
                            answer.error_code = error;
                            answer
                        })
                        .collect();
                    topic
                })
                .collect();
            Response::OffsetCommit(r)
        }
        Request::OffsetFetch(req) => {
            let mut r = OffsetFetchResponse::default();
            if version < 2 {
                // No top-level error before v2: each partition asked carries it.
                r.topics = req
                    .topics
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| {
                        let mut topic = OffsetFetchResponseTopic::default();
                        topic.name = t.name;
                        topic.partitions = t
                            .partition_indexes
                            .into_iter()
                            .map(|index| {
                                let mut p = OffsetFetchResponsePartition::default();
                                p.partition_index = index;
                                p.committed_offset = -1;
                                p.error_code = error;
                                p
                            })
                            .collect();
                        topic
                    })
                    .collect();
                return Response::OffsetFetch(r);
            }
            if version < 8 {
                r.error_code = error;
                return Response::OffsetFetch(r);
            }
            r.groups = req
                .groups
                .into_iter()
                .map(|g| {
                    let mut group = OffsetFetchResponseGroup::default();
                    group.group_id = g.group_id;
                    group.error_code = error;
                    group
                })
                .collect();
            Response::OffsetFetch(r)
        }
        Request::ListGroups(_) => {
            let mut r = ListGroupsResponse::default();
            r.error_code = error;
            Response::ListGroups(r)
        }
        Request::DescribeGroups(req) => {
            let mut r = DescribeGroupsResponse::default();
            r.groups = req
                .groups
                .into_iter()
                .map(|group_id| {
                    let mut g = describe_groups_response::DescribedGroup::default();
                    g.group_id = group_id;
                    g.error_code = error;
                    g
                })
                .collect();
            Response::DescribeGroups(r)
        }
        Request::DeleteGroups(req) => {
            let mut r = DeleteGroupsResponse::default();
            r.results = req
                .groups_names
                .into_iter()
                .map(|group_id| {
                    let mut g = delete_groups_response::DeletableGroupResult::default();
                    g.group_id = group_id;
                    g.error_code = error;
                    g
                })
                .collect();
            Response::DeleteGroups(r)
        }
        // Not a group request: nothing here answers it.
        Request::ApiVersions => Response::ApiVersions(super::api_versions::response(error, false)),
        other => {
            tracing::error!(request = ?std::mem::discriminant(&other), "kafka: not a group request");
            Response::ApiVersions(super::api_versions::response(error, false))
        }
    }
}
