//! Metadata: the brokers are this node (id [`NODE_ID`], at the address the client reached the
//! listener on), and it leads every partition it owns. Topics come from the metastore; an
//! unknown topic is UNKNOWN_TOPIC_OR_PARTITION and is never created, whatever
//! `allow_auto_topic_creation` says.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use narad_storage::PartitionId;

use super::{Advertised, CLUSTER_ID, KafkaDeps, NODE_ID};
use crate::metastore::TopicMeta;

/// Metadata v2 is where answers carry the cluster id.
const FIRST_CLUSTER_ID_VERSION: i16 = 2;
/// Metadata v7 is where partitions carry their leader epoch.
const FIRST_LEADER_EPOCH_VERSION: i16 = 7;

/// Answers a Metadata request.
pub async fn handle(
    deps: &Arc<KafkaDeps>,
    advertised: &Advertised,
    request: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let mut response = MetadataResponse::default();
    let mut broker = MetadataResponseBroker::default();
    broker.node_id = BrokerId(NODE_ID);
    broker.host = StrBytes::from_string(advertised.host.clone());
    broker.port = advertised.port;
    response.brokers = vec![broker];
    if version >= FIRST_CLUSTER_ID_VERSION {
        response.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
    }
    response.controller_id = BrokerId(NODE_ID);

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
            .map(|meta| describe(deps, meta, version))
            .collect(),
        Some(wanted) => wanted
            .into_iter()
            .map(|t| match t.name {
                Some(name) => match snapshot.topics.get(name.0.as_str()) {
                    Some(meta) => describe(deps, meta, version),
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
            })
            .collect(),
    };
    response
}

/// One topic with its partitions, led by this node where it owns them.
fn describe(deps: &KafkaDeps, meta: &TopicMeta, version: i16) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    topic.name = Some(TopicName(StrBytes::from_string(meta.name.clone())));
    topic.partitions = (0..meta.partitions)
        .map(|p| {
            let mut partition = MetadataResponsePartition::default();
            partition.partition_index = i32::try_from(p).unwrap_or(i32::MAX);
            let local = deps
                .ownership
                .is_local(&PartitionId::new(meta.name.clone(), p));
            if local {
                partition.leader_id = BrokerId(NODE_ID);
                if version >= FIRST_LEADER_EPOCH_VERSION {
                    partition.leader_epoch = 0;
                }
                partition.replica_nodes = vec![BrokerId(NODE_ID)];
                partition.isr_nodes = vec![BrokerId(NODE_ID)];
            } else {
                partition.error_code = ResponseError::LeaderNotAvailable.code();
                partition.leader_id = BrokerId(-1);
            }
            partition
        })
        .collect();
    topic
}
