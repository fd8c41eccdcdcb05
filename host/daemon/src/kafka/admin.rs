//! Kafka admin: CreateTopics, DeleteTopics and CreatePartitions, so an application that
//! manages its topics itself (Kafka Streams, Spring's `KafkaAdmin`, `kafka-topics.sh`, an
//! admin client) runs unchanged.
//!
//! DeleteTopics deletes as `DELETE /v1/topics/{t}` without `force`: a topic in a fan-out link
//! is refused (POLICY_VIOLATION, naming the links). CreatePartitions grows as `PATCH
//! /v1/topics/{t}` does; Kafka's rule that the count must rise is kept (INVALID_PARTITIONS).
//!
//! A topic is created exactly as `POST /v1/topics` creates it: the same name and partition
//! checks, the same placement in cluster mode. What a request asks that narad has no notion of
//! is answered with Kafka's error for it, never ignored: a replication factor other than 1 (or
//! -1, the broker's default), replica assignments, or a config other than `retention.ms`,
//! `retention.bytes`, `cleanup.policy=delete` and `min.insync.replicas=1`. While the daemon
//! requires its API token for changes (`--auth-token-file`), the Kafka listener changes topics
//! only for SASL users held to ACLs (`--kafka-sasl required` and at least one rule, which the
//! request passed in [`super::authorize`]); otherwise each topic gets
//! TOPIC_AUTHORIZATION_FAILED.

use std::collections::HashSet;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicResult, CreateTopicsResponse,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, DeleteTopicsRequest,
    DeleteTopicsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::KafkaDeps;
use crate::metastore::MetastoreError;
use crate::topics::{MAX_PARTITIONS, NewTopic, TopicError};

/// Kafka error codes this API answers with.
mod code {
    pub(super) const NONE: i16 = 0;
    pub(super) const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub(super) const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub(super) const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub(super) const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub(super) const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub(super) const INVALID_PARTITIONS: i16 = 37;
    pub(super) const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub(super) const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    pub(super) const INVALID_CONFIG: i16 = 40;
    pub(super) const INVALID_REQUEST: i16 = 42;
    pub(super) const POLICY_VIOLATION: i16 = 44;
    pub(super) const UNKNOWN_TOPIC_ID: i16 = 100;
}

/// Most topics one admin request changes: each is a metadata write and directories on disk,
/// so a single request naming thousands (its frame allows that many) would hold the node's
/// topic administration for all of them. The rest are refused (INVALID_REQUEST), unchanged.
pub(crate) const MAX_TOPICS_PER_REQUEST: usize = 100;

/// The refusal of a topic past [`MAX_TOPICS_PER_REQUEST`] in its request.
fn too_many() -> Refusal {
    (
        code::INVALID_REQUEST,
        format!(
            "a request changes at most {MAX_TOPICS_PER_REQUEST} topics; send the others in \
             another request"
        ),
    )
}

/// Partitions of a topic created without a count (`num_partitions: -1`) when auto-creation is
/// off: Kafka's default `num.partitions`.
const DEFAULT_PARTITIONS: u32 = 1;

/// Kafka's `num.partitions`: what a topic created without a count gets, through CreateTopics
/// or auto-created, the auto-create count when that is on.
pub(super) fn default_partitions(deps: &KafkaDeps) -> u32 {
    deps.admin
        .as_ref()
        .and_then(|a| a.auto_create)
        .unwrap_or(DEFAULT_PARTITIONS)
}

/// Whether this listener may change topics: while the HTTP API requires a token for changes,
/// only for authenticated clients held to ACLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdminAccess {
    /// Topic changes are allowed.
    Open,
    /// The daemon requires its API token for changes: refused here unless SASL and ACLs govern
    /// the listener.
    TokenRequired,
}

/// What CreateTopics creates topics with.
pub(crate) struct KafkaAdmin {
    /// Creates topics, as the HTTP API does.
    pub(crate) topics: std::sync::Arc<crate::topics::TopicService>,
    /// Whether this listener may change topics.
    pub(crate) access: AdminAccess,
    /// Partitions of a topic created because a Metadata request named it
    /// (`--kafka-auto-create-partitions`); `None`: Metadata creates nothing.
    pub(crate) auto_create: Option<u32>,
}

/// A topic's refusal: Kafka's error code and the reason.
type Refusal = (i16, String);

/// Handles CreateTopics at `version`: every topic answered, in request order.
pub(crate) async fn create_topics(
    deps: &KafkaDeps,
    req: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut names = HashSet::new();
    let repeated: HashSet<String> = req
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .filter(|name| !names.insert(name.clone()))
        .collect();
    let mut response = CreateTopicsResponse::default();
    for (i, topic) in req.topics.into_iter().enumerate() {
        let name = topic.name.0.to_string();
        let outcome = if i >= MAX_TOPICS_PER_REQUEST {
            Err(too_many())
        } else if repeated.contains(&name) {
            Err((
                code::INVALID_REQUEST,
                format!("topic {name:?} is named more than once in the request"),
            ))
        } else {
            create_one(deps, &topic, req.validate_only).await
        };
        let mut result = CreatableTopicResult::default();
        result.name = topic.name;
        match outcome {
            Ok(partitions) => {
                result.error_code = code::NONE;
                if version >= 5 {
                    result.num_partitions = i32::try_from(partitions).unwrap_or(i32::MAX);
                    result.replication_factor = 1;
                }
            }
            Err((error_code, message)) => {
                tracing::info!(topic = %name, error_code, %message, "kafka: CreateTopics refused");
                result.error_code = error_code;
                result.error_message = Some(StrBytes::from_string(message));
                result.num_partitions = -1;
                result.replication_factor = -1;
            }
        }
        response.topics.push(result);
    }
    response
}

/// The admin of this listener, or why it changes no topic.
fn allowed(deps: &KafkaDeps) -> Result<&KafkaAdmin, Refusal> {
    let Some(admin) = &deps.admin else {
        return Err((
            code::TOPIC_AUTHORIZATION_FAILED,
            "this listener changes no topics: use the HTTP API".to_owned(),
        ));
    };
    match admin.access {
        AdminAccess::Open => Ok(admin),
        // Authenticated clients held to ACLs: the request passed them before it got here.
        AdminAccess::TokenRequired if acl_governed(deps) => Ok(admin),
        AdminAccess::TokenRequired => Err((
            code::TOPIC_AUTHORIZATION_FAILED,
            "this daemon requires its API token for changes: change topics through the HTTP \
             API or the narad CLI, or let SASL users do it with ACLs (--kafka-sasl required \
             and narad acl add ... --operation create)"
                .to_owned(),
        )),
    }
}

/// Whether Kafka clients authenticate and ACLs hold them (what lets them change topics on a
/// daemon that requires its token).
fn acl_governed(deps: &KafkaDeps) -> bool {
    deps.sasl.is_some() && deps.acls.last_enforced()
}

/// Whether Metadata creates the unknown topics it is asked for: auto-creation is on and this
/// listener may change topics.
pub(crate) fn auto_creates(deps: &KafkaDeps) -> bool {
    deps.admin.as_ref().is_some_and(|a| {
        a.auto_create.is_some() && (a.access == AdminAccess::Open || acl_governed(deps))
    })
}

/// Creates topic `name`, unknown to a Metadata request that allows auto-creation, with the
/// auto-create partition count and no retention, as `POST /v1/topics` would; or finds it
/// created meanwhile (by another client's Metadata). Its metadata, or why not.
pub(crate) async fn auto_create(
    deps: &KafkaDeps,
    name: &str,
) -> Result<crate::metastore::TopicMeta, Refusal> {
    let admin = allowed(deps)?;
    let Some(partitions) = admin.auto_create else {
        return Err((
            code::UNKNOWN_TOPIC_OR_PARTITION,
            "auto-creation is off (--kafka-auto-create-partitions 0)".to_owned(),
        ));
    };
    narad_storage::validate_topic_name(name)
        .map_err(|e| (code::INVALID_TOPIC_EXCEPTION, e.to_string()))?;
    let created = admin
        .topics
        .create(NewTopic {
            name: name.to_owned(),
            partitions,
            retention_ms: None,
            retention_bytes: None,
            placement: None,
        })
        .await;
    match created {
        Ok(meta) => {
            tracing::info!(topic = %meta.name, partitions = meta.partitions, "topic auto-created for a Kafka client's Metadata request");
            Ok(meta)
        }
        Err(TopicError::Metastore(MetastoreError::TopicExists { .. })) => {
            match deps.metastore.topic(name).await {
                Ok(Some(meta)) => Ok(meta),
                Ok(None) => Err((
                    code::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("topic {name:?} was created and deleted again"),
                )),
                Err(e) => Err((code::UNKNOWN_SERVER_ERROR, e.to_string())),
            }
        }
        Err(e) => Err(refusal(e)),
    }
}

/// Handles DeleteTopics: each topic named (by name; a topic id, which narad topics do not
/// have, is UNKNOWN_TOPIC_ID), answered in request order.
pub(crate) async fn delete_topics(
    deps: &KafkaDeps,
    req: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    // Up to v5 the names come as a list; from v6 as topic states (a name or an id).
    let named: Vec<Option<TopicName>> = match req.topics.is_empty() {
        true => req.topic_names.into_iter().map(Some).collect(),
        false => req.topics.into_iter().map(|t| t.name).collect(),
    };
    let mut response = DeleteTopicsResponse::default();
    for (i, name) in named.into_iter().enumerate() {
        let mut result = DeletableTopicResult::default();
        let outcome = match &name {
            _ if i >= MAX_TOPICS_PER_REQUEST => Err(too_many()),
            None => Err((
                code::UNKNOWN_TOPIC_ID,
                "narad topics have no ids: name the topic".to_owned(),
            )),
            Some(name) => delete_one(deps, &name.0).await,
        };
        if let Err((error_code, message)) = outcome {
            tracing::info!(topic = name.as_ref().map(|n| &*n.0), error_code, %message, "kafka: DeleteTopics refused");
            result.error_code = error_code;
            result.error_message = Some(StrBytes::from_string(message));
        }
        result.name = name;
        response.responses.push(result);
    }
    response
}

async fn delete_one(deps: &KafkaDeps, name: &str) -> Result<(), Refusal> {
    let admin = allowed(deps)?;
    let deleted = admin.topics.delete(name, false).await.map_err(refusal)?;
    tracing::info!(topic = %deleted.name, "topic deleted through the Kafka listener");
    Ok(())
}

/// Handles CreatePartitions: each topic grown to its `count`, answered in request order.
pub(crate) async fn create_partitions(
    deps: &KafkaDeps,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut response = CreatePartitionsResponse::default();
    for (i, topic) in req.topics.into_iter().enumerate() {
        let mut result = CreatePartitionsTopicResult::default();
        let name = topic.name.0.to_string();
        let outcome = match topic.assignments {
            _ if i >= MAX_TOPICS_PER_REQUEST => Err(too_many()),
            Some(_) => Err((
                code::INVALID_REPLICA_ASSIGNMENT,
                "replica assignments are not taken: narad places partitions itself".to_owned(),
            )),
            None => grow_one(deps, &name, topic.count, req.validate_only).await,
        };
        if let Err((error_code, message)) = outcome {
            tracing::info!(topic = %name, error_code, %message, "kafka: CreatePartitions refused");
            result.error_code = error_code;
            result.error_message = Some(StrBytes::from_string(message));
        }
        result.name = topic.name;
        response.results.push(result);
    }
    response
}

async fn grow_one(
    deps: &KafkaDeps,
    name: &str,
    count: i32,
    validate_only: bool,
) -> Result<(), Refusal> {
    let admin = allowed(deps)?;
    let current = match deps.metastore.topic(name).await {
        Ok(Some(topic)) => topic.partitions,
        Ok(None) => {
            return Err((
                code::UNKNOWN_TOPIC_OR_PARTITION,
                format!("topic {name:?} does not exist"),
            ));
        }
        Err(e) => return Err((code::UNKNOWN_SERVER_ERROR, e.to_string())),
    };
    let count = match u32::try_from(count) {
        Ok(count) if count > current && count <= MAX_PARTITIONS => count,
        _ => {
            return Err((
                code::INVALID_PARTITIONS,
                format!(
                    "topic {name:?} has {current} partitions: the new count must be more, and \
                     at most {MAX_PARTITIONS}; got {count}"
                ),
            ));
        }
    };
    if validate_only {
        return Ok(());
    }
    let grown = admin.topics.grow(name, count).await.map_err(refusal)?;
    tracing::info!(topic = %grown.name, partitions = grown.partitions, "topic grown through the Kafka listener");
    Ok(())
}

/// Checks and (unless `validate_only`) creates one topic; its partition count.
async fn create_one(
    deps: &KafkaDeps,
    topic: &CreatableTopic,
    validate_only: bool,
) -> Result<u32, Refusal> {
    let name = topic.name.0.to_string();
    let admin = allowed(deps)?;
    narad_storage::validate_topic_name(&name)
        .map_err(|e| (code::INVALID_TOPIC_EXCEPTION, e.to_string()))?;
    let partitions = match topic.num_partitions {
        -1 => default_partitions(deps),
        n if n >= 1 && n as u64 <= u64::from(MAX_PARTITIONS) => n as u32,
        n => {
            return Err((
                code::INVALID_PARTITIONS,
                format!(
                    "num_partitions must be 1 to {MAX_PARTITIONS} (or -1 for num.partitions, {}); \
                     got {n}",
                    default_partitions(deps)
                ),
            ));
        }
    };
    if !matches!(topic.replication_factor, -1 | 1) {
        return Err((
            code::INVALID_REPLICATION_FACTOR,
            format!(
                "narad keeps one copy of each partition (a cluster moves it, it does not \
                 replicate it): replication_factor must be 1 or -1; got {}",
                topic.replication_factor
            ),
        ));
    }
    if !topic.assignments.is_empty() {
        return Err((
            code::INVALID_REPLICA_ASSIGNMENT,
            "replica assignments are not taken: narad places partitions itself (or as \
             POST /v1/topics's \"placement\" says)"
                .to_owned(),
        ));
    }
    let (retention_ms, retention_bytes) = configs(topic)?;
    if validate_only {
        return match deps.metastore.topic(&name).await {
            Ok(Some(_)) => Err((
                code::TOPIC_ALREADY_EXISTS,
                format!("topic {name:?} already exists"),
            )),
            Ok(None) => Ok(partitions),
            Err(e) => Err((code::UNKNOWN_SERVER_ERROR, e.to_string())),
        };
    }
    let created = admin
        .topics
        .create(NewTopic {
            name: name.clone(),
            partitions,
            retention_ms,
            retention_bytes,
            placement: None,
        })
        .await
        .map_err(refusal)?;
    tracing::info!(topic = %created.name, partitions = created.partitions, "topic created through the Kafka listener");
    Ok(created.partitions)
}

/// The retention a topic's configs ask for: `retention.ms` and `retention.bytes` (-1: no
/// limit); `cleanup.policy=delete` and `min.insync.replicas=1` are what narad does anyway.
fn configs(topic: &CreatableTopic) -> Result<(Option<u64>, Option<u64>), Refusal> {
    let (mut ms, mut bytes) = (None, None);
    for config in &topic.configs {
        let key = config.name.as_str();
        let value = config.value.as_ref().map(|v| v.as_str()).unwrap_or("");
        let limit = || -> Result<Option<u64>, Refusal> {
            match value.parse::<i64>() {
                Ok(-1) => Ok(None),
                Ok(n) if n > 0 => Ok(Some(n as u64)),
                _ => Err((
                    code::INVALID_CONFIG,
                    format!("{key} must be a positive number or -1; got {value:?}"),
                )),
            }
        };
        match key {
            "retention.ms" => ms = limit()?,
            "retention.bytes" => bytes = limit()?,
            "cleanup.policy" if value == "delete" => {}
            "min.insync.replicas" if value == "1" => {}
            "cleanup.policy" => {
                return Err((
                    code::INVALID_CONFIG,
                    format!(
                        "cleanup.policy={value}: narad does not compact; records leave by \
                         retention only (cleanup.policy=delete)"
                    ),
                ));
            }
            other => {
                return Err((
                    code::INVALID_CONFIG,
                    format!(
                        "config {other}={value} is not one narad has: a topic takes \
                         retention.ms and retention.bytes (and cleanup.policy=delete, \
                         min.insync.replicas=1)"
                    ),
                ));
            }
        }
    }
    Ok((ms, bytes))
}

/// Kafka's error for a create the topic service refused.
fn refusal(error: TopicError) -> Refusal {
    let code = match &error {
        TopicError::Metastore(MetastoreError::TopicExists { .. }) => code::TOPIC_ALREADY_EXISTS,
        TopicError::Metastore(MetastoreError::UnknownTopic { .. }) => {
            code::UNKNOWN_TOPIC_OR_PARTITION
        }
        TopicError::Metastore(MetastoreError::TopicHasLinks { .. }) => code::POLICY_VIOLATION,
        TopicError::Metastore(MetastoreError::CannotShrink { .. }) => code::INVALID_PARTITIONS,
        TopicError::Metastore(MetastoreError::LinkRule(_)) | TopicError::Invalid(_) => {
            code::INVALID_TOPIC_EXCEPTION
        }
        _ => code::UNKNOWN_SERVER_ERROR,
    };
    (code, error.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
    use narad_storage::{Store, StoreOptions};

    use super::*;
    use crate::metastore::{FileMetastore, Metastore};
    use crate::ownership::{PartitionOwnership, SingleNode};
    use crate::produce::Producer;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_request_naming_ten_thousand_topics_changes_at_most_the_first_hundred() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
        let metastore: Arc<dyn Metastore> = Arc::new(FileMetastore::open(dir.path()).unwrap());
        let producer = Arc::new(Producer::new(Arc::clone(&store)));
        let ownership: Arc<dyn PartitionOwnership> = Arc::new(SingleNode::default());
        let topics = Arc::new(crate::topics::TopicService::new(
            Arc::clone(&store),
            Arc::clone(&metastore),
            producer.clone(),
            1 << 20,
        ));
        let (_trigger, shutdown) = crate::shutdown::channel();
        let deps = KafkaDeps::new(
            crate::config::Limits::default(),
            store,
            Arc::clone(&metastore),
            producer,
            ownership,
            shutdown,
            Arc::new(super::super::metrics::KafkaMetrics::default()),
        )
        .with_admin(topics, AdminAccess::Open, None);
        let mut req = CreateTopicsRequest::default();
        req.topics = (0..10_000)
            .map(|i| {
                let mut topic = CreatableTopic::default();
                topic.name = TopicName(StrBytes::from_string(format!("t{i}")));
                topic.num_partitions = 1;
                topic.replication_factor = -1;
                topic
            })
            .collect();
        let answer = create_topics(&deps, req, 5).await;
        assert_eq!(answer.topics.len(), 10_000, "every topic answered");
        let created = answer.topics.iter().filter(|t| t.error_code == 0).count();
        assert_eq!(created, MAX_TOPICS_PER_REQUEST);
        assert!(
            answer.topics[MAX_TOPICS_PER_REQUEST..]
                .iter()
                .all(|t| t.error_code == code::INVALID_REQUEST)
        );
        let snapshot = metastore.snapshot().await.unwrap();
        assert_eq!(snapshot.topics.len(), MAX_TOPICS_PER_REQUEST);
    }

    fn topic(configs: &[(&'static str, Option<&'static str>)]) -> CreatableTopic {
        let mut topic = CreatableTopic::default();
        topic.configs = configs
            .iter()
            .map(|&(name, value)| {
                let mut config = CreatableTopicConfig::default();
                config.name = StrBytes::from_static_str(name);
                config.value = value.map(StrBytes::from_static_str);
                config
            })
            .collect();
        topic
    }

    #[test]
    fn retention_configs_are_taken_and_what_narad_cannot_do_is_refused_by_name() {
        assert_eq!(
            configs(&topic(&[
                ("retention.ms", Some("60000")),
                ("retention.bytes", Some("-1")),
                ("cleanup.policy", Some("delete")),
                ("min.insync.replicas", Some("1")),
            ])),
            Ok((Some(60_000), None))
        );
        for (name, value, says) in [
            ("cleanup.policy", "compact", "does not compact"),
            ("retention.ms", "0", "positive number or -1"),
            ("retention.bytes", "many", "positive number or -1"),
            ("segment.bytes", "1024", "segment.bytes=1024"),
            ("min.insync.replicas", "2", "min.insync.replicas=2"),
        ] {
            let refused = configs(&topic(&[(name, Some(value))])).unwrap_err();
            assert_eq!(refused.0, code::INVALID_CONFIG, "{name}={value}");
            assert!(refused.1.contains(says), "{name}={value}: {}", refused.1);
        }
    }
}
