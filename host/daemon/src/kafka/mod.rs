//! The Kafka protocol listener (`--kafka-listen`): enough of the Kafka wire protocol that
//! Kafka clients (librdkafka and kcat, kafka-python, the Java client) produce to and fetch
//! from narad topics unchanged. docs/kafka.md says what works and what does not.
//!
//! Requests and responses are the `kafka-protocol` crate's message types; this module maps
//! them onto the daemon's own paths:
//! - [`connection`]: the accept loop and one connection: framing with a size cap, the
//!   connection cap, the in-flight byte budget, timeouts, one request at a time;
//! - [`api_versions`]: the APIs and versions advertised, exactly those handled here;
//! - [`metadata`]: this node as the one broker and the leader of every partition;
//! - [`produce`]: a record batch per partition, committed like an HTTP produce
//!   ([`crate::produce::Producer::commit`]: append + `fdatasync` + verify) whatever `acks`;
//! - [`fetch`]: reads with the long-poll mapped onto `max_wait_ms` / `min_bytes`;
//! - [`list_offsets`]: earliest, latest, max-timestamp and by-timestamp offsets;
//! - [`init_producer_id`] and [`idempotence`]: producer ids, and the last batches per producer
//!   and partition that make retries of idempotent producers harmless;
//! - [`records`]: the v2 record-batch format in and out; [`compression`]: the four codecs,
//!   bounded; [`shape`]: array counts checked before the crate's decoder allocates for them;
//!   [`metrics`]: the listener's series.
//!
//! Nothing here writes except through the produce path, so what a Kafka client produces is as
//! durable, and fans out the same way, as what the HTTP API produces.

pub(crate) mod admin;
pub(crate) mod api_versions;
pub(crate) mod authorize;
pub(crate) mod compression;
pub(crate) mod connection;
pub(crate) mod describe;
pub(crate) mod fetch;
pub(crate) mod groups;
pub(crate) mod idempotence;
pub(crate) mod init_producer_id;
pub(crate) mod list_offsets;
pub(crate) mod metadata;
pub(crate) mod metrics;
pub(crate) mod produce;
pub(crate) mod records;
pub(crate) mod sasl;
pub(crate) mod shape;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreatePartitionsRequest,
    CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteGroupsRequest,
    DeleteGroupsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    DescribeGroupsRequest, DescribeGroupsResponse, FetchRequest, FetchResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest, HeartbeatResponse,
    InitProducerIdRequest, InitProducerIdResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    ProduceRequest, ProduceResponse, SaslAuthenticateResponse, SaslHandshakeResponse,
    SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable};
use narad_storage::Store;

use crate::config::Limits;
use crate::metastore::Metastore;
use crate::ownership::PartitionOwnership;
use crate::produce::Producer;
use crate::shutdown::ShutdownSignal;

/// The broker id this node answers with in Metadata (one node: always 0).
pub(crate) const NODE_ID: i32 = 0;

/// The cluster id Metadata reports. Kafka clients only compare it between answers.
pub(crate) const CLUSTER_ID: &str = "narad";

/// Header under which a child record carries its provenance, `EPOCH:PARTITION:OFFSET` (the
/// attach epoch in 16 hex digits, the parent partition and the parent offset): the key a
/// consumer remembers to drop the duplicates at-least-once fan-out allows.
pub(crate) const ORIGIN_HEADER: &str = "narad.origin";

/// A connection with no request in flight and no byte arriving for this long is closed:
/// 10 min, Kafka's own broker default (`connections.max.idle.ms`); clients reconnect.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Time a client has to send the rest of a request once its size prefix arrived, and to
/// take a whole response: 30 s, Kafka clients' default `request.timeout.ms`, so a client
/// this slow has already given up on the request.
pub(crate) const TRANSFER_TIMEOUT: Duration = Duration::from_secs(30);

/// What the listener serves from and how it is bounded. Shared by every connection.
pub(crate) struct KafkaDeps {
    /// Request and record limits (the HTTP API's: `max-request-bytes` caps a Kafka request,
    /// `max-buffered-request-bytes` the bytes of all requests in flight).
    pub limits: Limits,
    /// The partition logs.
    pub store: Arc<Store>,
    /// Topics (never created from here).
    pub metastore: Arc<dyn Metastore>,
    /// The commit path shared with the HTTP produce.
    pub producer: Arc<Producer>,
    /// Which node serves which partition.
    pub ownership: Arc<dyn PartitionOwnership>,
    /// Ends long-polls and idle connections when the daemon shuts down.
    pub shutdown: ShutdownSignal,
    /// The listener's series.
    pub metrics: Arc<metrics::KafkaMetrics>,
    /// Sequence state of idempotent producers (memory only).
    pub(crate) idempotence: idempotence::Idempotence,
    /// Where new producer ids come from.
    pub(crate) producer_ids: init_producer_id::ProducerIds,
    /// Cluster mode: the live nodes are the brokers, partition owners their leaders.
    pub cluster: Option<Arc<crate::cluster::ClusterContext>>,
    /// The consumer group coordinator (`None`: the group APIs answer
    /// COORDINATOR_NOT_AVAILABLE).
    pub(crate) groups: Option<Arc<crate::groups::Coordinator>>,
    /// `max-buffered-request-bytes` as permits (one per byte): the bytes of requests in
    /// flight, and what their batches decompressed to, share it.
    pub(crate) buffered: Arc<tokio::sync::Semaphore>,
    /// Produce requests decoding their batches now ([`produce::DECODE_SLOTS`]).
    pub(crate) decode_slots: Arc<tokio::sync::Semaphore>,
    /// Where clients are told this broker is (`--kafka-advertise`); `None`: the address each
    /// client connected to.
    pub(crate) advertise: Option<Advertised>,
    /// Topic administration (CreateTopics); `None`: this listener creates no topic.
    pub(crate) admin: Option<admin::KafkaAdmin>,
    /// SASL (`--kafka-sasl required`); `None`: clients are not asked to authenticate.
    pub(crate) sasl: Option<sasl::Sasl>,
    /// The ACL rules in force.
    pub(crate) acls: crate::metastore::acl_cache::AclCache,
}

impl KafkaDeps {
    /// The listener's dependencies with fresh producer state.
    pub(crate) fn new(
        limits: Limits,
        store: Arc<Store>,
        metastore: Arc<dyn Metastore>,
        producer: Arc<Producer>,
        ownership: Arc<dyn PartitionOwnership>,
        shutdown: ShutdownSignal,
        metrics: Arc<metrics::KafkaMetrics>,
    ) -> KafkaDeps {
        KafkaDeps {
            admin: None,
            buffered: Arc::new(tokio::sync::Semaphore::new(buffered_capacity(&limits))),
            decode_slots: Arc::new(tokio::sync::Semaphore::new(produce::DECODE_SLOTS)),
            advertise: None,
            limits,
            store,
            producer,
            ownership,
            shutdown,
            metrics,
            idempotence: idempotence::Idempotence::new(idempotence::MAX_PRODUCER_PARTITIONS),
            producer_ids: init_producer_id::ProducerIds::from_clock(),
            cluster: None,
            groups: None,
            sasl: None,
            acls: crate::metastore::acl_cache::AclCache::new(Arc::clone(&metastore)),
            metastore,
        }
    }

    /// The same dependencies, requiring SASL authentication before any other request
    /// (`None`: not).
    pub(crate) fn with_sasl(mut self, sasl: Option<sasl::Sasl>) -> KafkaDeps {
        self.sasl = sasl;
        self
    }

    /// The same dependencies, creating topics through `topics` as `access` allows, and for
    /// Metadata requests that name unknown topics with `auto_create` partitions (`None`: not).
    pub(crate) fn with_admin(
        mut self,
        topics: Arc<crate::topics::TopicService>,
        access: admin::AdminAccess,
        auto_create: Option<u32>,
    ) -> KafkaDeps {
        self.admin = Some(admin::KafkaAdmin {
            topics,
            access,
            auto_create,
        });
        self
    }

    /// The same dependencies with the consumer group coordinator.
    pub(crate) fn with_groups(mut self, groups: Arc<crate::groups::Coordinator>) -> KafkaDeps {
        self.groups = Some(groups);
        self
    }

    /// The same dependencies, telling clients this broker is at `advertise` (`None`: the
    /// address each client connected to).
    pub(crate) fn advertising(mut self, advertise: Option<(String, u16)>) -> KafkaDeps {
        self.advertise = advertise.map(|(host, port)| Advertised {
            host,
            port: i32::from(port),
        });
        self
    }

    /// The same dependencies in cluster mode (`None`: one node).
    pub(crate) fn with_cluster(
        mut self,
        cluster: Option<Arc<crate::cluster::ClusterContext>>,
    ) -> KafkaDeps {
        self.cluster = cluster;
        self
    }
}

/// `max-buffered-request-bytes` as a count of permits (one per byte, within what a semaphore
/// holds).
pub(crate) fn buffered_capacity(limits: &Limits) -> usize {
    usize::try_from(limits.max_buffered_request_bytes)
        .unwrap_or(usize::MAX)
        .clamp(1, tokio::sync::Semaphore::MAX_PERMITS)
}

/// The Kafka broker id of cluster node `node`: the same on every node and across restarts
/// (Kafka ids are integers, narad's are names), non-negative as Kafka requires.
pub(crate) fn broker_id(node: &str) -> i32 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(node.as_bytes());
    let id = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) & 0x7fff_ffff;
    i32::try_from(id).unwrap_or(0)
}

/// The first of `others` (node ids other than `mine`) whose broker id is `mine`'s: a node
/// that would be indistinguishable from it to Kafka clients.
pub(crate) fn broker_id_clash<'a>(
    mine: &str,
    others: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let id = broker_id(mine);
    others
        .into_iter()
        .find(|other| *other != mine && broker_id(other) == id)
}

/// The address Metadata advertises: the one the client reached this listener on, so a
/// listener bound to `0.0.0.0` still names an address the client can use.
#[derive(Debug, Clone)]
pub(crate) struct Advertised {
    /// Host (an IP address as text, or the name `--kafka-advertise` gives).
    pub host: String,
    /// Port.
    pub port: i32,
}

/// A decoded request of an API this listener offers.
#[derive(Debug)]
pub(crate) enum Request {
    /// ApiVersions (decoded to check it is well formed; nothing in it changes the answer).
    ApiVersions,
    /// Metadata.
    Metadata(MetadataRequest),
    /// Produce.
    Produce(ProduceRequest),
    /// Fetch.
    Fetch(FetchRequest),
    /// ListOffsets.
    ListOffsets(ListOffsetsRequest),
    /// InitProducerId.
    InitProducerId(InitProducerIdRequest),
    /// FindCoordinator.
    FindCoordinator(FindCoordinatorRequest),
    /// JoinGroup.
    JoinGroup(JoinGroupRequest),
    /// SyncGroup.
    SyncGroup(SyncGroupRequest),
    /// Heartbeat.
    Heartbeat(HeartbeatRequest),
    /// LeaveGroup.
    LeaveGroup(LeaveGroupRequest),
    /// OffsetCommit.
    OffsetCommit(OffsetCommitRequest),
    /// OffsetFetch.
    OffsetFetch(OffsetFetchRequest),
    /// ListGroups.
    ListGroups(ListGroupsRequest),
    /// DescribeGroups.
    DescribeGroups(DescribeGroupsRequest),
    /// DeleteGroups.
    DeleteGroups(DeleteGroupsRequest),
    /// CreateTopics.
    CreateTopics(CreateTopicsRequest),
    /// DeleteTopics.
    DeleteTopics(DeleteTopicsRequest),
    /// CreatePartitions.
    CreatePartitions(CreatePartitionsRequest),
    /// DescribeConfigs.
    DescribeConfigs(DescribeConfigsRequest),
    /// DescribeCluster.
    DescribeCluster(DescribeClusterRequest),
}

impl Request {
    /// Decodes the body of `api_key` at `version`; an API not offered is an error.
    pub(crate) fn decode(
        api_key: ApiKey,
        version: i16,
        body: &mut Bytes,
    ) -> anyhow::Result<Request> {
        Ok(match api_key {
            ApiKey::ApiVersions => {
                ApiVersionsRequest::decode(body, version)?;
                Request::ApiVersions
            }
            ApiKey::Metadata => Request::Metadata(MetadataRequest::decode(body, version)?),
            ApiKey::Produce => Request::Produce(ProduceRequest::decode(body, version)?),
            ApiKey::Fetch => Request::Fetch(FetchRequest::decode(body, version)?),
            ApiKey::ListOffsets => Request::ListOffsets(ListOffsetsRequest::decode(body, version)?),
            ApiKey::InitProducerId => {
                Request::InitProducerId(InitProducerIdRequest::decode(body, version)?)
            }
            ApiKey::FindCoordinator => {
                Request::FindCoordinator(FindCoordinatorRequest::decode(body, version)?)
            }
            ApiKey::JoinGroup => Request::JoinGroup(JoinGroupRequest::decode(body, version)?),
            ApiKey::SyncGroup => Request::SyncGroup(SyncGroupRequest::decode(body, version)?),
            ApiKey::Heartbeat => Request::Heartbeat(HeartbeatRequest::decode(body, version)?),
            ApiKey::LeaveGroup => Request::LeaveGroup(LeaveGroupRequest::decode(body, version)?),
            ApiKey::OffsetCommit => {
                Request::OffsetCommit(OffsetCommitRequest::decode(body, version)?)
            }
            ApiKey::OffsetFetch => Request::OffsetFetch(OffsetFetchRequest::decode(body, version)?),
            ApiKey::ListGroups => Request::ListGroups(ListGroupsRequest::decode(body, version)?),
            ApiKey::DescribeGroups => {
                Request::DescribeGroups(DescribeGroupsRequest::decode(body, version)?)
            }
            ApiKey::DeleteGroups => {
                Request::DeleteGroups(DeleteGroupsRequest::decode(body, version)?)
            }
            ApiKey::CreateTopics => {
                Request::CreateTopics(CreateTopicsRequest::decode(body, version)?)
            }
            ApiKey::DeleteTopics => {
                Request::DeleteTopics(DeleteTopicsRequest::decode(body, version)?)
            }
            ApiKey::CreatePartitions => {
                Request::CreatePartitions(CreatePartitionsRequest::decode(body, version)?)
            }
            ApiKey::DescribeConfigs => {
                Request::DescribeConfigs(DescribeConfigsRequest::decode(body, version)?)
            }
            ApiKey::DescribeCluster => {
                Request::DescribeCluster(DescribeClusterRequest::decode(body, version)?)
            }
            other => anyhow::bail!("{other:?} is not offered"),
        })
    }
}

/// A response to encode at the request's version.
#[derive(Debug)]
pub(crate) enum Response {
    /// ApiVersions.
    ApiVersions(ApiVersionsResponse),
    /// Metadata.
    Metadata(MetadataResponse),
    /// Produce.
    Produce(ProduceResponse),
    /// Fetch.
    Fetch(FetchResponse),
    /// ListOffsets.
    ListOffsets(ListOffsetsResponse),
    /// InitProducerId.
    InitProducerId(InitProducerIdResponse),
    /// FindCoordinator.
    FindCoordinator(FindCoordinatorResponse),
    /// JoinGroup.
    JoinGroup(JoinGroupResponse),
    /// SyncGroup.
    SyncGroup(SyncGroupResponse),
    /// Heartbeat.
    Heartbeat(HeartbeatResponse),
    /// LeaveGroup.
    LeaveGroup(LeaveGroupResponse),
    /// OffsetCommit.
    OffsetCommit(OffsetCommitResponse),
    /// OffsetFetch.
    OffsetFetch(OffsetFetchResponse),
    /// ListGroups.
    ListGroups(ListGroupsResponse),
    /// DescribeGroups.
    DescribeGroups(DescribeGroupsResponse),
    /// DeleteGroups.
    DeleteGroups(DeleteGroupsResponse),
    /// CreateTopics.
    CreateTopics(CreateTopicsResponse),
    /// DeleteTopics.
    DeleteTopics(DeleteTopicsResponse),
    /// CreatePartitions.
    CreatePartitions(CreatePartitionsResponse),
    /// DescribeConfigs.
    DescribeConfigs(DescribeConfigsResponse),
    /// DescribeCluster.
    DescribeCluster(DescribeClusterResponse),
    /// SaslHandshake.
    SaslHandshake(SaslHandshakeResponse),
    /// SaslAuthenticate.
    SaslAuthenticate(SaslAuthenticateResponse),
}

impl Response {
    /// Appends the body at `version` to `out`.
    pub(crate) fn encode(&self, out: &mut BytesMut, version: i16) -> anyhow::Result<()> {
        match self {
            Response::ApiVersions(r) => r.encode(out, version),
            Response::Metadata(r) => r.encode(out, version),
            Response::Produce(r) => r.encode(out, version),
            Response::Fetch(r) => r.encode(out, version),
            Response::ListOffsets(r) => r.encode(out, version),
            Response::InitProducerId(r) => r.encode(out, version),
            Response::FindCoordinator(r) => r.encode(out, version),
            Response::JoinGroup(r) => r.encode(out, version),
            Response::SyncGroup(r) => r.encode(out, version),
            Response::Heartbeat(r) => r.encode(out, version),
            Response::LeaveGroup(r) => r.encode(out, version),
            Response::OffsetCommit(r) => r.encode(out, version),
            Response::OffsetFetch(r) => r.encode(out, version),
            Response::ListGroups(r) => r.encode(out, version),
            Response::DescribeGroups(r) => r.encode(out, version),
            Response::DeleteGroups(r) => r.encode(out, version),
            Response::CreateTopics(r) => r.encode(out, version),
            Response::DeleteTopics(r) => r.encode(out, version),
            Response::CreatePartitions(r) => r.encode(out, version),
            Response::DescribeConfigs(r) => r.encode(out, version),
            Response::DescribeCluster(r) => r.encode(out, version),
            Response::SaslHandshake(r) => r.encode(out, version),
            Response::SaslAuthenticate(r) => r.encode(out, version),
        }
    }
}

/// What a request comes to.
pub(crate) enum Outcome {
    /// Send this response (encoded at the request's version).
    Respond(Response),
    /// Send nothing: a produce with `acks = 0`, which the client does not wait for.
    Silent,
}

/// Handles one decoded request at `version` from `client`.
pub(crate) async fn handle(
    deps: &Arc<KafkaDeps>,
    advertised: &Advertised,
    client: &groups::Client,
    version: i16,
    request: Request,
) -> Outcome {
    if let Some(api) = request.group_api() {
        deps.metrics.request(api);
        return Outcome::Respond(match &deps.groups {
            Some(coordinator) => {
                handle_group(deps, coordinator, advertised, client, version, request).await
            }
            None => groups::unavailable(request, version),
        });
    }
    match request {
        Request::ApiVersions => {
            deps.metrics.request(ApiKey::ApiVersions);
            Outcome::Respond(Response::ApiVersions(api_versions::response(
                0,
                deps.sasl.is_some(),
            )))
        }
        Request::Metadata(req) => {
            deps.metrics.request(ApiKey::Metadata);
            Outcome::Respond(Response::Metadata(
                metadata::handle(deps, advertised, req, version).await,
            ))
        }
        Request::Produce(req) => {
            deps.metrics.request(ApiKey::Produce);
            match produce::handle(deps, req, version).await {
                Some(response) => Outcome::Respond(Response::Produce(response)),
                None => Outcome::Silent,
            }
        }
        Request::Fetch(req) => {
            deps.metrics.request(ApiKey::Fetch);
            Outcome::Respond(Response::Fetch(fetch::handle(deps, req, version).await))
        }
        Request::ListOffsets(req) => {
            deps.metrics.request(ApiKey::ListOffsets);
            Outcome::Respond(Response::ListOffsets(
                list_offsets::handle(deps, req, version).await,
            ))
        }
        Request::InitProducerId(req) => {
            deps.metrics.request(ApiKey::InitProducerId);
            Outcome::Respond(Response::InitProducerId(init_producer_id::handle(
                deps, req,
            )))
        }
        Request::CreateTopics(req) => {
            deps.metrics.request(ApiKey::CreateTopics);
            Outcome::Respond(Response::CreateTopics(
                admin::create_topics(deps, req, version).await,
            ))
        }
        Request::DeleteTopics(req) => {
            deps.metrics.request(ApiKey::DeleteTopics);
            Outcome::Respond(Response::DeleteTopics(
                admin::delete_topics(deps, req).await,
            ))
        }
        Request::CreatePartitions(req) => {
            deps.metrics.request(ApiKey::CreatePartitions);
            Outcome::Respond(Response::CreatePartitions(
                admin::create_partitions(deps, req).await,
            ))
        }
        Request::DescribeConfigs(req) => {
            deps.metrics.request(ApiKey::DescribeConfigs);
            Outcome::Respond(Response::DescribeConfigs(
                describe::describe_configs(deps, advertised, req, version).await,
            ))
        }
        Request::DescribeCluster(req) => {
            deps.metrics.request(ApiKey::DescribeCluster);
            Outcome::Respond(Response::DescribeCluster(describe::describe_cluster(
                deps, advertised, &req, version,
            )))
        }
        // Taken above.
        Request::FindCoordinator(_)
        | Request::JoinGroup(_)
        | Request::SyncGroup(_)
        | Request::Heartbeat(_)
        | Request::LeaveGroup(_)
        | Request::OffsetCommit(_)
        | Request::OffsetFetch(_)
        | Request::ListGroups(_)
        | Request::DescribeGroups(_)
        | Request::DeleteGroups(_) => Outcome::Silent,
    }
}

impl Request {
    /// The API of a consumer group request, `None` for the others.
    fn group_api(&self) -> Option<ApiKey> {
        Some(match self {
            Request::FindCoordinator(_) => ApiKey::FindCoordinator,
            Request::JoinGroup(_) => ApiKey::JoinGroup,
            Request::SyncGroup(_) => ApiKey::SyncGroup,
            Request::Heartbeat(_) => ApiKey::Heartbeat,
            Request::LeaveGroup(_) => ApiKey::LeaveGroup,
            Request::OffsetCommit(_) => ApiKey::OffsetCommit,
            Request::OffsetFetch(_) => ApiKey::OffsetFetch,
            Request::ListGroups(_) => ApiKey::ListGroups,
            Request::DescribeGroups(_) => ApiKey::DescribeGroups,
            Request::DeleteGroups(_) => ApiKey::DeleteGroups,
            _ => return None,
        })
    }
}

/// Handles a consumer group request ([`groups`]).
async fn handle_group(
    deps: &Arc<KafkaDeps>,
    coordinator: &crate::groups::Coordinator,
    advertised: &Advertised,
    client: &groups::Client,
    version: i16,
    request: Request,
) -> Response {
    match request {
        Request::FindCoordinator(req) => Response::FindCoordinator(
            groups::find_coordinator(deps, coordinator, advertised, req, version).await,
        ),
        Request::JoinGroup(req) => {
            Response::JoinGroup(groups::join_group(coordinator, client, req, version).await)
        }
        Request::SyncGroup(req) => Response::SyncGroup(groups::sync_group(coordinator, req).await),
        Request::Heartbeat(req) => Response::Heartbeat(groups::heartbeat(coordinator, req).await),
        Request::LeaveGroup(req) => {
            Response::LeaveGroup(groups::leave_group(coordinator, req, version).await)
        }
        Request::OffsetCommit(req) => {
            Response::OffsetCommit(groups::offset_commit(deps, coordinator, req).await)
        }
        Request::OffsetFetch(req) => {
            Response::OffsetFetch(groups::offset_fetch(coordinator, req, version).await)
        }
        Request::ListGroups(req) => {
            Response::ListGroups(groups::list_groups(coordinator, req).await)
        }
        Request::DescribeGroups(req) => {
            Response::DescribeGroups(groups::describe_groups(coordinator, req).await)
        }
        Request::DeleteGroups(req) => {
            Response::DeleteGroups(groups::delete_groups(coordinator, req).await)
        }
        other => groups::unavailable(other, version),
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::{TopicName, fetch_request, list_offsets_request};
    use kafka_protocol::messages::{metadata_request, produce_request};
    use kafka_protocol::protocol::StrBytes;
    use narad_storage::{AppendBatch, NewRecord, PartitionId, StoreOptions};

    use super::*;
    use crate::metastore::{FileMetastore, TopicMeta};
    use crate::ownership::SingleNode;

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    #[test]
    fn two_node_ids_with_one_broker_id_are_found_before_clients_meet_them() {
        // 31-bit ids: a clash turns up within about a hundred thousand names.
        let mut seen = std::collections::HashMap::new();
        let (a, b) = (0..1_000_000u32)
            .map(|i| format!("node-{i}"))
            .find_map(|id| {
                seen.insert(broker_id(&id), id.clone())
                    .map(|earlier| (earlier, id))
            })
            .expect("a clash among a million ids");
        assert_eq!(broker_id(&a), broker_id(&b));
        assert_eq!(broker_id_clash(&a, ["n1", b.as_str()]), Some(b.as_str()));
        assert_eq!(broker_id_clash(&a, ["n1", "n2", a.as_str()]), None);
        assert!(broker_id("n1") >= 0);
    }

    /// Every request kind with a topic, an unknown topic and a partition past the end.
    fn requests(version: i16, api: ApiKey) -> Request {
        use kafka_protocol::messages::{
            GroupId, join_group_request, leave_group_request, offset_commit_request,
            offset_fetch_request, sync_group_request,
        };
        let group = || GroupId(StrBytes::from_static_str("g"));
        match api {
            ApiKey::FindCoordinator => {
                // As a client sends it: one key before v4, a list from v4.
                let mut req = FindCoordinatorRequest::default();
                if version < 4 {
                    req.key = StrBytes::from_static_str("g");
                } else {
                    req.coordinator_keys = vec![StrBytes::from_static_str("g")];
                }
                Request::FindCoordinator(req)
            }
            ApiKey::JoinGroup => {
                let mut req = JoinGroupRequest::default();
                req.group_id = group();
                req.session_timeout_ms = 10_000;
                req.rebalance_timeout_ms = 10_000;
                req.protocol_type = StrBytes::from_static_str("consumer");
                let mut protocol = join_group_request::JoinGroupRequestProtocol::default();
                protocol.name = StrBytes::from_static_str("range");
                req.protocols = vec![protocol];
                // A first join of v4+ is answered at once (MEMBER_ID_REQUIRED); before v4
                // it would wait out the initial delay, so those ask as an unknown member.
                if version < 4 {
                    req.member_id = StrBytes::from_static_str("unknown");
                }
                Request::JoinGroup(req)
            }
            ApiKey::SyncGroup => {
                let mut req = SyncGroupRequest::default();
                req.group_id = group();
                req.member_id = StrBytes::from_static_str("m");
                let mut a = sync_group_request::SyncGroupRequestAssignment::default();
                a.member_id = StrBytes::from_static_str("m");
                req.assignments = vec![a];
                Request::SyncGroup(req)
            }
            ApiKey::Heartbeat => {
                let mut req = HeartbeatRequest::default();
                req.group_id = group();
                Request::Heartbeat(req)
            }
            ApiKey::LeaveGroup => {
                let mut req = LeaveGroupRequest::default();
                req.group_id = group();
                req.member_id = StrBytes::from_static_str("m");
                let mut m = leave_group_request::MemberIdentity::default();
                m.member_id = StrBytes::from_static_str("m");
                req.members = vec![m];
                Request::LeaveGroup(req)
            }
            ApiKey::OffsetCommit => {
                let mut req = OffsetCommitRequest::default();
                req.group_id = group();
                req.generation_id_or_member_epoch = -1;
                req.topics = ["t", "missing"]
                    .map(|n| {
                        let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
                        t.name = name(n);
                        t.partitions = [0, 5]
                            .map(|index| {
                                let mut p =
                                    offset_commit_request::OffsetCommitRequestPartition::default();
                                p.partition_index = index;
                                p.committed_offset = 1;
                                p
                            })
                            .to_vec();
                        t
                    })
                    .to_vec();
                Request::OffsetCommit(req)
            }
            ApiKey::OffsetFetch => {
                let mut req = OffsetFetchRequest::default();
                req.group_id = group();
                let mut t = offset_fetch_request::OffsetFetchRequestTopic::default();
                t.name = name("t");
                t.partition_indexes = vec![0, 1];
                req.topics = Some(vec![t]);
                let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
                g.group_id = group();
                req.groups = vec![g];
                Request::OffsetFetch(req)
            }
            ApiKey::ListGroups => Request::ListGroups(ListGroupsRequest::default()),
            ApiKey::DescribeGroups => {
                let mut req = DescribeGroupsRequest::default();
                req.groups = vec![group()];
                Request::DescribeGroups(req)
            }
            ApiKey::DeleteGroups => {
                let mut req = DeleteGroupsRequest::default();
                req.groups_names = vec![group()];
                Request::DeleteGroups(req)
            }
            ApiKey::CreateTopics => {
                let mut req = CreateTopicsRequest::default();
                let mut topic =
                    kafka_protocol::messages::create_topics_request::CreatableTopic::default();
                topic.name = name("created");
                topic.num_partitions = 2;
                topic.replication_factor = -1;
                let mut config =
                    kafka_protocol::messages::create_topics_request::CreatableTopicConfig::default(
                    );
                config.name = StrBytes::from_static_str("retention.ms");
                config.value = Some(StrBytes::from_static_str("60000"));
                topic.configs = vec![config];
                req.topics = vec![topic];
                Request::CreateTopics(req)
            }
            ApiKey::DeleteTopics => {
                let mut req = DeleteTopicsRequest::default();
                if version >= 6 {
                    let mut state =
                        kafka_protocol::messages::delete_topics_request::DeleteTopicState::default(
                        );
                    state.name = Some(name("missing"));
                    req.topics = vec![state];
                } else {
                    req.topic_names = vec![name("missing")];
                }
                Request::DeleteTopics(req)
            }
            ApiKey::CreatePartitions => {
                let mut req = CreatePartitionsRequest::default();
                let mut topic =
                    kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic::default();
                topic.name = name("t");
                topic.count = 1;
                req.topics = vec![topic];
                Request::CreatePartitions(req)
            }
            ApiKey::DescribeConfigs => {
                use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
                let mut req = DescribeConfigsRequest::default();
                req.resources = [(2, "t"), (2, "missing"), (4, ""), (4, "12345"), (8, "x")]
                    .map(|(kind, n)| {
                        let mut r = DescribeConfigsResource::default();
                        r.resource_type = kind;
                        r.resource_name = StrBytes::from_static_str(n);
                        r.configuration_keys = None;
                        r
                    })
                    .to_vec();
                req.include_synonyms = true;
                req.include_documentation = version >= 3;
                Request::DescribeConfigs(req)
            }
            ApiKey::DescribeCluster => {
                let mut req = DescribeClusterRequest::default();
                req.include_cluster_authorized_operations = true;
                if version >= 1 {
                    req.endpoint_type = 1;
                }
                Request::DescribeCluster(req)
            }
            ApiKey::ApiVersions => Request::ApiVersions,
            ApiKey::InitProducerId => Request::InitProducerId(InitProducerIdRequest::default()),
            ApiKey::Metadata => {
                let mut req = MetadataRequest::default();
                req.topics = Some(
                    ["t", "missing"]
                        .map(|n| {
                            let mut topic = metadata_request::MetadataRequestTopic::default();
                            topic.name = Some(name(n));
                            topic
                        })
                        .to_vec(),
                );
                Request::Metadata(req)
            }
            ApiKey::Produce => {
                let mut req = ProduceRequest::default();
                req.acks = -1;
                req.topic_data = ["t", "missing"]
                    .map(|n| {
                        let mut topic = produce_request::TopicProduceData::default();
                        topic.name = name(n);
                        topic.partition_data = [0, 5]
                            .map(|index| {
                                let mut data = produce_request::PartitionProduceData::default();
                                data.index = index;
                                // Not a batch: every partition answers with an error.
                                data.records = Some(Bytes::from_static(b"junk"));
                                data
                            })
                            .to_vec();
                        topic
                    })
                    .to_vec();
                Request::Produce(req)
            }
            ApiKey::Fetch => {
                let mut req = FetchRequest::default();
                req.max_wait_ms = 0;
                req.max_bytes = 1 << 20;
                req.topics = ["t", "missing"]
                    .map(|n| {
                        let mut topic = fetch_request::FetchTopic::default();
                        topic.topic = name(n);
                        topic.partitions = [(0, 0), (0, 99), (5, 0)]
                            .map(|(partition, offset)| {
                                let mut p = fetch_request::FetchPartition::default();
                                p.partition = partition;
                                p.fetch_offset = offset;
                                p.partition_max_bytes = 1 << 20;
                                p
                            })
                            .to_vec();
                        topic
                    })
                    .to_vec();
                let _ = version;
                Request::Fetch(req)
            }
            ApiKey::ListOffsets => {
                let mut req = ListOffsetsRequest::default();
                req.topics = ["t", "missing"]
                    .map(|n| {
                        let mut topic = list_offsets_request::ListOffsetsTopic::default();
                        topic.name = name(n);
                        topic.partitions = [(0, -1), (0, -2), (0, -3), (0, 0), (5, -1)]
                            .map(|(index, timestamp)| {
                                let mut p = list_offsets_request::ListOffsetsPartition::default();
                                p.partition_index = index;
                                p.timestamp = timestamp;
                                p
                            })
                            .to_vec();
                        topic
                    })
                    .to_vec();
                Request::ListOffsets(req)
            }
            other => panic!("{other:?} is not offered"),
        }
    }

    /// A listener's dependencies over `dir`, with topic `t` (one partition, one record).
    async fn test_deps(dir: &std::path::Path) -> Arc<KafkaDeps> {
        test_deps_over(dir, Arc::new(FileMetastore::open(dir).unwrap())).await
    }

    /// [`test_deps`] with `metastore`.
    async fn test_deps_over(
        dir: &std::path::Path,
        metastore: Arc<dyn Metastore>,
    ) -> Arc<KafkaDeps> {
        let store = Arc::new(Store::open(dir, StoreOptions::default()).unwrap());
        metastore
            // From JSON, so fields added to the metastore's topics later take their defaults.
            .create_topic(
                serde_json::from_value::<TopicMeta>(serde_json::json!({
                    "name": "t", "partitions": 1, "retention_ms": null,
                    "retention_bytes": null, "created_at_ms": 0,
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let id = PartitionId::new("t", 0);
        store.create_partition(&id, Default::default()).unwrap();
        store
            .append(
                &id,
                AppendBatch {
                    records: vec![NewRecord {
                        key: Some(Bytes::from_static(b"k")),
                        headers: Vec::new(),
                        value: Some(Bytes::from_static(b"v")),
                    }],
                    origin: None,
                },
            )
            .unwrap();
        // Dropped with the helper: a listener's shutdown, never triggered in these tests.
        let (trigger, shutdown) = crate::shutdown::channel();
        std::mem::forget(trigger);
        let producer = Arc::new(Producer::new(Arc::clone(&store)));
        let ownership: Arc<dyn PartitionOwnership> = Arc::new(SingleNode::default());
        let topics = Arc::new(crate::topics::TopicService::new(
            Arc::clone(&store),
            Arc::clone(&metastore),
            Arc::clone(&producer),
            1 << 20,
        ));
        let coordinator = Arc::new(crate::groups::Coordinator::new(
            Arc::clone(&store),
            Arc::clone(&producer),
            Arc::clone(&metastore),
            Arc::clone(&ownership),
            Arc::clone(&topics),
            crate::groups::GroupsConfig::default(),
        ));
        Arc::new(
            KafkaDeps::new(
                Limits::default(),
                Arc::clone(&store),
                metastore,
                producer,
                ownership,
                shutdown,
                Arc::new(metrics::KafkaMetrics::default()),
            )
            .with_admin(topics, admin::AdminAccess::Open, None)
            .with_groups(coordinator),
        )
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_answer_encodes_at_every_offered_version_errors_included() {
        let dir = tempfile::tempdir().unwrap();
        let deps = test_deps(dir.path()).await;
        let advertised = Advertised {
            host: "127.0.0.1".into(),
            port: 9092,
        };
        for &(api, min, max) in api_versions::OFFERED {
            for version in min..=max {
                let outcome = handle(
                    &deps,
                    &advertised,
                    &groups::Client::default(),
                    version,
                    requests(version, api),
                )
                .await;
                let Outcome::Respond(response) = outcome else {
                    panic!("{api:?} v{version} answered nothing");
                };
                let mut out = BytesMut::new();
                response
                    .encode(&mut out, version)
                    .unwrap_or_else(|e| panic!("{api:?} v{version}: {e}"));
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_acl_refusal_and_every_group_refusal_encodes_at_every_offered_version() {
        let dir = tempfile::tempdir().unwrap();
        let deps = test_deps(dir.path()).await;
        // A rule for someone else: the principal below may do nothing.
        deps.metastore
            .add_acl(crate::acl::AclRule {
                principal: "User:other".into(),
                resource: crate::acl::ResourceKind::Topic,
                pattern: crate::acl::PatternKind::Literal,
                name: "t".into(),
                operation: crate::acl::Operation::All,
            })
            .await
            .unwrap();
        let advertised = Advertised {
            host: "127.0.0.1".into(),
            port: 9092,
        };
        let nobody = crate::acl::Principal::user("nobody");
        for &(api, min, max) in api_versions::OFFERED {
            for version in min..=max {
                let outcome = authorize::handle(
                    &deps,
                    &advertised,
                    &groups::Client::default(),
                    &nobody,
                    version,
                    requests(version, api),
                )
                .await;
                let Outcome::Respond(response) = outcome else {
                    panic!("{api:?} v{version} answered nothing");
                };
                let mut out = BytesMut::new();
                response
                    .encode(&mut out, version)
                    .unwrap_or_else(|e| panic!("{api:?} v{version} refused: {e}"));
                if requests(version, api).group_api().is_some() {
                    for error in [30, 15] {
                        let mut out = BytesMut::new();
                        groups::refused(requests(version, api), error, version)
                            .encode(&mut out, version)
                            .unwrap_or_else(|e| panic!("{api:?} v{version} error {error}: {e}"));
                    }
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_describe_configs_naming_thousands_of_resources_answers_the_first_thousand() {
        use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
        let dir = tempfile::tempdir().unwrap();
        let deps = test_deps(dir.path()).await;
        let advertised = Advertised {
            host: "127.0.0.1".into(),
            port: 9092,
        };
        let mut request = DescribeConfigsRequest::default();
        request.resources = (0..5_000)
            .map(|_| {
                let mut r = DescribeConfigsResource::default();
                r.resource_type = 2;
                r.resource_name = StrBytes::from_static_str("t");
                // Every config (an empty list would ask for none).
                r.configuration_keys = None;
                r
            })
            .collect();
        let answer = describe::describe_configs(&deps, &advertised, request, 4).await;
        assert_eq!(answer.results.len(), 5_000);
        let answered = answer.results.iter().filter(|r| r.error_code == 0).count();
        assert_eq!(answered, describe::MAX_RESOURCES_PER_REQUEST);
        assert!(
            answer.results[1_000..]
                .iter()
                .all(|r| r.error_code == 42 && r.configs.is_empty())
        );
        assert_eq!(answer.results[0].configs.len(), 4);
    }

    /// A metastore that counts whole snapshots, and answers everything else from `inner`.
    struct CountingSnapshots {
        inner: FileMetastore,
        snapshots: std::sync::atomic::AtomicUsize,
    }

    impl Metastore for CountingSnapshots {
        fn snapshot(
            &self,
        ) -> crate::metastore::BoxFuture<'_, crate::metastore::Result<crate::metastore::Snapshot>>
        {
            self.snapshots
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.snapshot()
        }
        fn confirm(
            &self,
        ) -> crate::metastore::BoxFuture<'_, crate::metastore::Result<crate::metastore::Snapshot>>
        {
            self.inner.confirm()
        }
        fn versions(
            &self,
        ) -> crate::metastore::BoxFuture<'_, crate::metastore::Result<crate::metastore::Versions>>
        {
            self.inner.versions()
        }
        fn topic<'a>(
            &'a self,
            name: &'a str,
        ) -> crate::metastore::BoxFuture<'a, crate::metastore::Result<Option<TopicMeta>>> {
            self.inner.topic(name)
        }
        fn parents_of<'a>(
            &'a self,
            child: &'a str,
        ) -> crate::metastore::BoxFuture<'a, crate::metastore::Result<Vec<String>>> {
            self.inner.parents_of(child)
        }
        fn apply(
            &self,
            change: crate::metastore::Change,
        ) -> crate::metastore::BoxFuture<'_, crate::metastore::Result<crate::metastore::Outcome>>
        {
            self.inner.apply(change)
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn produce_fetch_and_list_offsets_look_topics_up_by_name_without_a_whole_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let counting = Arc::new(CountingSnapshots {
            inner: FileMetastore::open(dir.path()).unwrap(),
            snapshots: std::sync::atomic::AtomicUsize::new(0),
        });
        let deps = test_deps_over(dir.path(), Arc::clone(&counting) as Arc<dyn Metastore>).await;
        let advertised = Advertised {
            host: "127.0.0.1".into(),
            port: 9092,
        };
        // What clients send in a loop: produces, fetches, offset lookups.
        for (api, version) in [
            (ApiKey::Produce, 9),
            (ApiKey::Fetch, 12),
            (ApiKey::ListOffsets, 7),
        ] {
            let before = counting.snapshots.load(std::sync::atomic::Ordering::SeqCst);
            let outcome = handle(
                &deps,
                &advertised,
                &groups::Client::default(),
                version,
                requests(version, api),
            )
            .await;
            assert!(matches!(outcome, Outcome::Respond(_)), "{api:?}");
            assert_eq!(
                counting.snapshots.load(std::sync::atomic::Ordering::SeqCst),
                before,
                "{api:?} took a whole snapshot"
            );
        }
    }
}
