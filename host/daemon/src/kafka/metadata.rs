//! Metadata: on one node the broker is this node (id [`NODE_ID`], at the address the client
//! reached the listener on), and it leads every partition it owns. In cluster mode the brokers
//! are the live nodes that run a Kafka listener (ids from [`broker_id`], addresses from their
//! node records), and each partition's leader is its owner when that node is one of them.
//! Topics come from the metastore. An unknown topic is UNKNOWN_TOPIC_OR_PARTITION, unless
//! the daemon auto-creates topics (`--kafka-auto-create-partitions N`, off by default), the
//! request allows it (`allow_auto_topic_creation`) and this listener may change topics: then
//! it is created as CreateTopics would create it, with N partitions, and answered as created
//! (at most [`super::admin::MAX_TOPICS_PER_REQUEST`] per request; the rest stay unknown until
//! the client asks again). A topic named several times is answered once.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use narad_storage::PartitionId;

use super::{Advertised, CLUSTER_ID, KafkaDeps, NODE_ID, broker_id};
use crate::metastore::TopicMeta;

/// Metadata v2 is where answers carry the cluster id.
const FIRST_CLUSTER_ID_VERSION: i16 = 2;
/// Metadata v7 is where partitions carry their leader epoch.
const FIRST_LEADER_EPOCH_VERSION: i16 = 7;

/// Answers a Metadata request.
pub(crate) async fn handle(
    deps: &Arc<KafkaDeps>,
    advertised: &Advertised,
    request: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let mut response = MetadataResponse::default();
    let brokers = brokers(deps, advertised);
    response.controller_id = brokers.this;
    response.brokers = brokers
        .all
        .iter()
        .map(|(id, host, port)| {
            let mut broker = MetadataResponseBroker::default();
            broker.node_id = *id;
            broker.host = StrBytes::from_string(host.clone());
            broker.port = *port;
            broker
        })
        .collect();
    if version >= FIRST_CLUSTER_ID_VERSION {
        response.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
    }

    let snapshot = match deps.metastore.snapshot().await {
        Ok(snapshot) => snapshot,
        Err(e) => {
            tracing::warn!(error = %e, "kafka metadata: metastore unavailable");
            // Every topic asked for gets the error; a request for all topics gets none.
            response.topics = request
                .topics
                .unwrap_or_default()
                .into_iter()
                .map(|t| {
                    let mut topic = MetadataResponseTopic::default();
                    topic.name = t.name;
                    topic.error_code = ResponseError::UnknownServerError.code();
                    topic
                })
                .collect();
            return response;
        }
    };
    response.topics = match request.topics {
        // Null: every topic.
        None => snapshot
            .topics
            .values()
            .map(|meta| describe(deps, &brokers, meta, version))
            .collect(),
        // Each topic once, however often the request names it: an answer is bounded by what
        // exists, not by how the request repeats it.
        Some(wanted) => {
            // Unknown topics are created when the client allows it and the daemon is set to
            // (`--kafka-auto-create-partitions`), at most a request's worth of topics at once.
            let auto = request.allow_auto_topic_creation && super::admin::auto_creates(deps);
            let mut created = 0;
            let mut topics = Vec::new();
            for t in dedup_by_name(wanted) {
                let answer = match t.name {
                    Some(name) => match snapshot.topics.get(name.0.as_str()) {
                        Some(meta) => describe(deps, &brokers, meta, version),
                        None if auto && created < super::admin::MAX_TOPICS_PER_REQUEST => {
                            created += 1;
                            match super::admin::auto_create(deps, name.0.as_str()).await {
                                Ok(meta) => describe(deps, &brokers, &meta, version),
                                Err((error_code, message)) => {
                                    tracing::info!(topic = %name.0, error_code, %message, "kafka: topic not auto-created");
                                    let mut topic = MetadataResponseTopic::default();
                                    topic.name = Some(name);
                                    topic.error_code = error_code;
                                    topic
                                }
                            }
                        }
                        None => {
                            let mut topic = MetadataResponseTopic::default();
                            topic.name = Some(name);
                            topic.error_code = ResponseError::UnknownTopicOrPartition.code();
                            topic
                        }
                    },
                    // Asked by id only: narad topics have no ids.
                    None => {
                        let mut topic = MetadataResponseTopic::default();
                        topic.topic_id = t.topic_id;
                        topic.error_code = ResponseError::UnknownTopicId.code();
                        topic
                    }
                };
                topics.push(answer);
            }
            topics
        }
    };
    response
}

/// `wanted` with every topic named again after its first mention left out (topics asked by
/// id only are kept as they come: each is answered with an error and no partitions).
fn dedup_by_name(wanted: Vec<MetadataRequestTopic>) -> Vec<MetadataRequestTopic> {
    let mut seen = std::collections::HashSet::new();
    wanted
        .into_iter()
        .filter(|t| {
            t.name
                .as_ref()
                .is_none_or(|name| seen.insert(name.0.clone()))
        })
        .collect()
}

/// The brokers a Metadata answer names.
pub(super) struct Brokers {
    /// This node's broker id.
    pub(super) this: BrokerId,
    /// Every broker: id, host, port.
    pub(super) all: Vec<(BrokerId, String, i32)>,
}

pub(super) fn brokers(deps: &KafkaDeps, advertised: &Advertised) -> Brokers {
    let Some(cluster) = &deps.cluster else {
        return Brokers {
            this: BrokerId(NODE_ID),
            all: vec![(BrokerId(NODE_ID), advertised.host.clone(), advertised.port)],
        };
    };
    let this = BrokerId(broker_id(cluster.node_id()));
    let mut all: Vec<(BrokerId, String, i32)> = cluster
        .peers
        .live()
        .into_iter()
        .filter_map(|node| {
            let (host, port) = node.kafka.as_deref()?.rsplit_once(':')?;
            let port: i32 = port.parse().ok()?;
            Some((BrokerId(broker_id(&node.id)), host.to_owned(), port))
        })
        .collect();
    if !all.iter().any(|(id, _, _)| *id == this) {
        // This node answers, so it is a broker even before its record shows in the copy.
        all.push((this, advertised.host.clone(), advertised.port));
    }
    Brokers { this, all }
}

/// The broker id, host and port of `node` as Metadata names it (`None`: not a live node with
/// a Kafka listener).
pub(crate) fn broker_address(
    deps: &KafkaDeps,
    advertised: &Advertised,
    node: &str,
) -> Option<(BrokerId, String, i32)> {
    let brokers = brokers(deps, advertised);
    let id = match &deps.cluster {
        None => BrokerId(NODE_ID),
        Some(_) => BrokerId(broker_id(node)),
    };
    brokers.all.into_iter().find(|(b, _, _)| *b == id)
}

/// The broker that leads partition `p` of `meta`: its owner when that is a listed broker.
fn leader(deps: &KafkaDeps, brokers: &Brokers, meta: &TopicMeta, p: u32) -> Option<BrokerId> {
    match &deps.cluster {
        None => deps
            .ownership
            .is_local(&PartitionId::new(meta.name.clone(), p))
            .then_some(BrokerId(NODE_ID)),
        Some(_) => {
            let owner = meta.owners.get(p as usize)?;
            let id = BrokerId(broker_id(&owner.node));
            brokers.all.iter().any(|(b, _, _)| *b == id).then_some(id)
        }
    }
}

/// One topic with its partitions and their leaders.
fn describe(
    deps: &KafkaDeps,
    brokers: &Brokers,
    meta: &TopicMeta,
    version: i16,
) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    topic.name = Some(TopicName(StrBytes::from_string(meta.name.clone())));
    topic.partitions = (0..meta.partitions)
        .map(|p| {
            let mut partition = MetadataResponsePartition::default();
            partition.partition_index = i32::try_from(p).unwrap_or(i32::MAX);
            if let Some(id) = leader(deps, brokers, meta, p) {
                partition.leader_id = id;
                if version >= FIRST_LEADER_EPOCH_VERSION {
                    partition.leader_epoch = 0;
                }
                partition.replica_nodes = vec![id];
                partition.isr_nodes = vec![id];
            } else {
                partition.error_code = ResponseError::LeaderNotAvailable.code();
                partition.leader_id = BrokerId(-1);
            }
            partition
        })
        .collect();
    topic
}
