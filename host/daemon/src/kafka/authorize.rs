//! ACLs on the Kafka listener: each request is checked against the rules in force before it is
//! handled, with the answers Kafka clients expect.
//!
//! | request | needs | refused with |
//! |---------|-------|--------------|
//! | Produce | write on each topic | TOPIC_AUTHORIZATION_FAILED on that topic's partitions |
//! | Fetch | read on each topic | the same |
//! | ListOffsets | describe on each topic | the same |
//! | Metadata | describe on each topic | a topic asked by name: the error; all topics: left out |
//! | Metadata auto-creation | create on the topic | not created |
//! | CreateTopics | create on each topic (or on the cluster) | the error on every topic |
//! | DeleteTopics | delete on each topic | the same |
//! | CreatePartitions | alter on each topic | the same |
//! | DescribeConfigs | describe on each topic | the same |
//! | InitProducerId | write on some topic, or alter on the cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | DescribeCluster | describe on the cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | group requests | read on the group (describe: FindCoordinator, DescribeGroups; delete: DeleteGroups) | GROUP_AUTHORIZATION_FAILED on every group named |
//! | ListGroups | describe on each group | left out |
//!
//! A principal is `User:NAME` after SASL, `User:ANONYMOUS` without it. With no rule at all,
//! nothing is checked. Every refusal is counted and written to the audit log.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    CreatePartitionsResponse, CreateTopicsResponse, DeleteTopicsResponse, DescribeClusterResponse,
    DescribeConfigsResponse, FetchResponse, InitProducerIdResponse, ListOffsetsResponse,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::{Advertised, KafkaDeps, Outcome, Request, Response, groups};
use crate::acl::{AclSet, Operation, Principal, ResourceKind};

/// DescribeConfigs' resource type of a topic.
const CONFIG_RESOURCE_TOPIC: i8 = 2;

/// Handles `request` from `principal` as the rules allow.
pub(crate) async fn handle(
    deps: &Arc<KafkaDeps>,
    advertised: &Advertised,
    client: &groups::Client,
    principal: &Principal,
    version: i16,
    request: Request,
) -> Outcome {
    let acls = deps.acls.current().await;
    if !acls.enforced() || *principal == Principal::Operator {
        return super::handle(deps, advertised, client, version, request).await;
    }
    let check = Check {
        acls: &acls,
        principal,
        deps,
        client,
    };
    match request {
        Request::Produce(mut req) => {
            let denied = check.split(&mut req.topic_data, |t| &t.name, Operation::Write);
            let outcome = if req.topic_data.is_empty() && !denied.is_empty() {
                Outcome::Respond(Response::Produce(ProduceResponse::default()))
            } else {
                super::handle(deps, advertised, client, version, Request::Produce(req)).await
            };
            match outcome {
                Outcome::Respond(Response::Produce(mut response)) => {
                    for topic in denied {
                        let mut t = TopicProduceResponse::default();
                        t.name = topic.name;
                        t.partition_responses = topic
                            .partition_data
                            .iter()
                            .map(|p| {
                                let mut r = PartitionProduceResponse::default();
                                r.index = p.index;
                                r.error_code = topic_denied();
                                r.base_offset = -1;
                                r.log_append_time_ms = -1;
                                r.log_start_offset = -1;
                                r
                            })
                            .collect();
                        response.responses.push(t);
                    }
                    Outcome::Respond(Response::Produce(response))
                }
                other => other,
            }
        }
        Request::Fetch(mut req) => {
            let denied = check.split(&mut req.topics, |t| &t.topic, Operation::Read);
            let mut response = if req.topics.is_empty() && !denied.is_empty() {
                FetchResponse::default()
            } else {
                match super::handle(deps, advertised, client, version, Request::Fetch(req)).await {
                    Outcome::Respond(Response::Fetch(response)) => response,
                    other => return other,
                }
            };
            for topic in denied {
                let mut t = FetchableTopicResponse::default();
                t.topic = topic.topic;
                t.topic_id = topic.topic_id;
                t.partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut r = PartitionData::default();
                        r.partition_index = p.partition;
                        r.error_code = topic_denied();
                        r.high_watermark = -1;
                        r.last_stable_offset = -1;
                        r.log_start_offset = -1;
                        r
                    })
                    .collect();
                response.responses.push(t);
            }
            Outcome::Respond(Response::Fetch(response))
        }
        Request::ListOffsets(mut req) => {
            let denied = check.split(&mut req.topics, |t| &t.name, Operation::Describe);
            let mut response = if req.topics.is_empty() && !denied.is_empty() {
                ListOffsetsResponse::default()
            } else {
                match super::handle(deps, advertised, client, version, Request::ListOffsets(req))
                    .await
                {
                    Outcome::Respond(Response::ListOffsets(response)) => response,
                    other => return other,
                }
            };
            for topic in denied {
                let mut t = ListOffsetsTopicResponse::default();
                t.name = topic.name;
                t.partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut r = ListOffsetsPartitionResponse::default();
                        r.partition_index = p.partition_index;
                        r.error_code = topic_denied();
                        r.offset = -1;
                        r.timestamp = -1;
                        r
                    })
                    .collect();
                response.topics.push(t);
            }
            Outcome::Respond(Response::ListOffsets(response))
        }
        Request::Metadata(mut req) => {
            let mut denied: Vec<TopicName> = Vec::new();
            if let Some(topics) = &mut req.topics {
                topics.retain(|t| match &t.name {
                    Some(name) if !check.topic(name, Operation::Describe) => {
                        denied.push(name.clone());
                        false
                    }
                    _ => true,
                });
                // Auto-creation needs create on every topic it could make.
                if topics.iter().any(|t| {
                    t.name
                        .as_ref()
                        .is_some_and(|n| !check.quiet_topic(n, Operation::Create))
                }) {
                    req.allow_auto_topic_creation = false;
                }
            }
            let asked_all = req.topics.is_none();
            let outcome =
                super::handle(deps, advertised, client, version, Request::Metadata(req)).await;
            let Outcome::Respond(Response::Metadata(mut response)) = outcome else {
                return outcome;
            };
            if asked_all {
                // Topics the principal may not see are left out, as Kafka leaves them out.
                response.topics.retain(|t| {
                    t.name
                        .as_ref()
                        .is_none_or(|n| check.quiet_topic(n, Operation::Describe))
                });
            }
            for name in denied {
                let mut t = MetadataResponseTopic::default();
                t.name = Some(name);
                t.error_code = topic_denied();
                response.topics.push(t);
            }
            Outcome::Respond(Response::Metadata(response))
        }
        Request::CreateTopics(req) => {
            let refused = req.topics.iter().any(|t| {
                !check.quiet_topic(&t.name, Operation::Create) && !check.cluster(Operation::Create)
            });
            if !refused {
                return super::handle(
                    deps,
                    advertised,
                    client,
                    version,
                    Request::CreateTopics(req),
                )
                .await;
            }
            let mut response = CreateTopicsResponse::default();
            for topic in req.topics {
                check.topic(&topic.name, Operation::Create);
                let mut r = CreatableTopicResult::default();
                r.name = topic.name;
                r.error_code = topic_denied();
                r.error_message = Some(denied_message(principal, Operation::Create));
                r.num_partitions = -1;
                r.replication_factor = -1;
                response.topics.push(r);
            }
            Outcome::Respond(Response::CreateTopics(response))
        }
        Request::DeleteTopics(req) => {
            let names: Vec<TopicName> = req
                .topic_names
                .iter()
                .cloned()
                .chain(req.topics.iter().filter_map(|t| t.name.clone()))
                .collect();
            if names
                .iter()
                .all(|n| check.quiet_topic(n, Operation::Delete))
            {
                return super::handle(
                    deps,
                    advertised,
                    client,
                    version,
                    Request::DeleteTopics(req),
                )
                .await;
            }
            let mut response = DeleteTopicsResponse::default();
            for name in names {
                check.topic(&name, Operation::Delete);
                let mut r = DeletableTopicResult::default();
                r.name = Some(name);
                r.error_code = topic_denied();
                r.error_message = Some(denied_message(principal, Operation::Delete));
                response.responses.push(r);
            }
            Outcome::Respond(Response::DeleteTopics(response))
        }
        Request::CreatePartitions(req) => {
            if req
                .topics
                .iter()
                .all(|t| check.quiet_topic(&t.name, Operation::Alter))
            {
                return super::handle(
                    deps,
                    advertised,
                    client,
                    version,
                    Request::CreatePartitions(req),
                )
                .await;
            }
            let mut response = CreatePartitionsResponse::default();
            for topic in req.topics {
                check.topic(&topic.name, Operation::Alter);
                let mut r = CreatePartitionsTopicResult::default();
                r.name = topic.name;
                r.error_code = topic_denied();
                r.error_message = Some(denied_message(principal, Operation::Alter));
                response.results.push(r);
            }
            Outcome::Respond(Response::CreatePartitions(response))
        }
        Request::DescribeConfigs(req) => {
            let allowed = req.resources.iter().all(|r| {
                r.resource_type != CONFIG_RESOURCE_TOPIC
                    || check.quiet_name(
                        ResourceKind::Topic,
                        r.resource_name.as_str(),
                        Operation::Describe,
                    )
            });
            if allowed {
                return super::handle(
                    deps,
                    advertised,
                    client,
                    version,
                    Request::DescribeConfigs(req),
                )
                .await;
            }
            let mut response = DescribeConfigsResponse::default();
            for resource in req.resources {
                check.name(
                    ResourceKind::Topic,
                    resource.resource_name.as_str(),
                    Operation::Describe,
                );
                let mut r = DescribeConfigsResult::default();
                r.error_code = topic_denied();
                r.error_message = Some(denied_message(principal, Operation::Describe));
                r.resource_type = resource.resource_type;
                r.resource_name = resource.resource_name;
                response.results.push(r);
            }
            Outcome::Respond(Response::DescribeConfigs(response))
        }
        Request::InitProducerId(req) => {
            if acls.allows_some_write(principal) {
                return super::handle(
                    deps,
                    advertised,
                    client,
                    version,
                    Request::InitProducerId(req),
                )
                .await;
            }
            check.refused(ResourceKind::Cluster, "", Operation::Write);
            let mut response = InitProducerIdResponse::default();
            response.error_code = ResponseError::ClusterAuthorizationFailed.code();
            response.producer_id = kafka_protocol::messages::ProducerId(-1);
            response.producer_epoch = -1;
            Outcome::Respond(Response::InitProducerId(response))
        }
        Request::DescribeCluster(req) => {
            if check.name(ResourceKind::Cluster, "", Operation::Describe) {
                return super::handle(
                    deps,
                    advertised,
                    client,
                    version,
                    Request::DescribeCluster(req),
                )
                .await;
            }
            let mut response = DescribeClusterResponse::default();
            response.error_code = ResponseError::ClusterAuthorizationFailed.code();
            response.error_message = Some(denied_message(principal, Operation::Describe));
            Outcome::Respond(Response::DescribeCluster(response))
        }
        Request::ListGroups(req) => {
            let outcome =
                super::handle(deps, advertised, client, version, Request::ListGroups(req)).await;
            match outcome {
                Outcome::Respond(Response::ListGroups(mut response)) => {
                    response.groups.retain(|g| {
                        check.quiet_name(
                            ResourceKind::Group,
                            g.group_id.as_str(),
                            Operation::Describe,
                        )
                    });
                    Outcome::Respond(Response::ListGroups(response))
                }
                other => other,
            }
        }
        request => {
            let (names, operation) = group_names(&request);
            if names
                .iter()
                .all(|g| check.name(ResourceKind::Group, g, operation))
            {
                super::handle(deps, advertised, client, version, request).await
            } else {
                Outcome::Respond(groups::refused(
                    request,
                    ResponseError::GroupAuthorizationFailed.code(),
                    version,
                ))
            }
        }
    }
}

/// The groups a group request names and what it does to them (none for other requests).
fn group_names(request: &Request) -> (Vec<String>, Operation) {
    let one = |g: &kafka_protocol::messages::GroupId| vec![g.as_str().to_owned()];
    match request {
        Request::FindCoordinator(req) => {
            let mut keys: Vec<String> = req
                .coordinator_keys
                .iter()
                .map(|k| k.as_str().to_owned())
                .collect();
            if keys.is_empty() {
                keys.push(req.key.as_str().to_owned());
            }
            // A transaction coordinator's key is no group; narad has none to find.
            if req.key_type != 0 {
                keys.clear();
            }
            (keys, Operation::Describe)
        }
        Request::JoinGroup(req) => (one(&req.group_id), Operation::Read),
        Request::SyncGroup(req) => (one(&req.group_id), Operation::Read),
        Request::Heartbeat(req) => (one(&req.group_id), Operation::Read),
        Request::LeaveGroup(req) => (one(&req.group_id), Operation::Read),
        Request::OffsetCommit(req) => (one(&req.group_id), Operation::Read),
        Request::OffsetFetch(req) => {
            let mut names: Vec<String> = req
                .groups
                .iter()
                .map(|g| g.group_id.as_str().to_owned())
                .collect();
            if names.is_empty() {
                names.push(req.group_id.as_str().to_owned());
            }
            (names, Operation::Read)
        }
        Request::DescribeGroups(req) => (
            req.groups.iter().map(|g| g.as_str().to_owned()).collect(),
            Operation::Describe,
        ),
        Request::DeleteGroups(req) => (
            req.groups_names
                .iter()
                .map(|g| g.as_str().to_owned())
                .collect(),
            Operation::Delete,
        ),
        _ => (Vec::new(), Operation::Describe),
    }
}

fn topic_denied() -> i16 {
    ResponseError::TopicAuthorizationFailed.code()
}

fn denied_message(principal: &Principal, operation: Operation) -> StrBytes {
    StrBytes::from_string(format!(
        "{principal} is not allowed to {operation} this resource (narad acl list shows the rules)"
    ))
}

/// One request's checks: the rules, who asks, and where refusals are counted.
struct Check<'a> {
    acls: &'a AclSet,
    principal: &'a Principal,
    deps: &'a Arc<KafkaDeps>,
    client: &'a groups::Client,
}

impl Check<'_> {
    /// Whether the principal may do `operation` to the named resource; a refusal is counted
    /// and written to the audit log.
    fn name(&self, kind: ResourceKind, name: &str, operation: Operation) -> bool {
        let allowed = self.quiet_name(kind, name, operation);
        if !allowed {
            self.refused(kind, name, operation);
        }
        allowed
    }

    /// [`Check::name`] without the count and the log: for what is filtered out of a listing.
    fn quiet_name(&self, kind: ResourceKind, name: &str, operation: Operation) -> bool {
        self.acls.allows(self.principal, kind, name, operation)
    }

    fn topic(&self, name: &TopicName, operation: Operation) -> bool {
        self.name(ResourceKind::Topic, name.as_str(), operation)
    }

    fn quiet_topic(&self, name: &TopicName, operation: Operation) -> bool {
        self.quiet_name(ResourceKind::Topic, name.as_str(), operation)
    }

    fn cluster(&self, operation: Operation) -> bool {
        self.quiet_name(ResourceKind::Cluster, "", operation)
    }

    fn refused(&self, kind: ResourceKind, name: &str, operation: Operation) {
        self.deps.metrics.denied(kind.name(), operation.name());
        tracing::info!(
            target: "narad::audit",
            principal = %self.principal,
            client = %self.client.host,
            resource = kind.name(),
            name,
            operation = operation.name(),
            outcome = "denied",
            "kafka request denied by the ACLs"
        );
    }

    /// Moves the topics the principal may not do `operation` to out of `topics`, returning
    /// them.
    fn split<T>(
        &self,
        topics: &mut Vec<T>,
        name: impl Fn(&T) -> &TopicName,
        operation: Operation,
    ) -> Vec<T> {
        let (allowed, denied): (Vec<T>, Vec<T>) = std::mem::take(topics)
            .into_iter()
            .partition(|t| self.topic(name(t), operation));
        *topics = allowed;
        denied
    }
}
