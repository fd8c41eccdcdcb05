//! DescribeConfigs and DescribeCluster: what admin tools read before they change anything
//! (`kafka-configs.sh --describe`, `AdminClient.describe_configs`/`describe_cluster`, UIs).
//!
//! A topic's configs are the settings narad has for it, under Kafka's names: `retention.ms`
//! and `retention.bytes` (`-1`: kept forever; the source says whether the topic sets them or
//! takes the default), `cleanup.policy` (`delete`: narad does not compact) and
//! `min.insync.replicas` (`1`: one copy per partition), the last two read-only. A broker's are
//! the defaults a topic created through this listener gets. Nothing else is invented: a config
//! narad has no notion of is not listed. DescribeCluster lists the brokers Metadata lists.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{
    DescribeClusterRequest, DescribeClusterResponse, DescribeConfigsRequest,
    DescribeConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::metadata::brokers;
use super::{Advertised, CLUSTER_ID, KafkaDeps, admin};
use crate::metastore::TopicMeta;

/// Kafka error codes these APIs answer with.
mod code {
    pub(super) const NONE: i16 = 0;
    pub(super) const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub(super) const INVALID_REQUEST: i16 = 42;
    pub(super) const KAFKA_STORAGE_ERROR: i16 = 56;
    pub(super) const UNSUPPORTED_ENDPOINT_TYPE: i16 = 119;
}

/// Kafka's resource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

/// Kafka's config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;

/// Kafka's config types (DescribeConfigs v3 and later).
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;
const TYPE_BOOLEAN: i8 = 1;

/// Most resources one DescribeConfigs answers; the rest get INVALID_REQUEST. Reading is
/// cheap, but each answer is larger than its request, and a frame can name many.
pub(crate) const MAX_RESOURCES_PER_REQUEST: usize = 1_000;

/// Kafka's "authorized operations were not asked for".
const OPERATIONS_NOT_ASKED: i32 = i32::MIN;

/// Kafka's ACL operation codes, as bits of `cluster_authorized_operations`.
const OP_CREATE: i32 = 5;
const OP_DESCRIBE: i32 = 8;
const OP_DESCRIBE_CONFIGS: i32 = 10;
const OP_IDEMPOTENT_WRITE: i32 = 12;

/// DescribeCluster's endpoint type for brokers (the only one a broker serves).
const ENDPOINT_BROKERS: i8 = 1;

/// One config as narad states it.
struct Config {
    name: &'static str,
    value: String,
    from_topic: bool,
    read_only: bool,
    kind: i8,
    doc: &'static str,
}

fn retention(value: Option<u64>) -> (String, bool) {
    value.map_or(("-1".to_owned(), false), |v| (v.to_string(), true))
}

/// A topic's configs.
fn topic_configs(meta: &TopicMeta) -> Vec<Config> {
    let (retention_ms, ms_set) = retention(meta.retention_ms);
    let (retention_bytes, bytes_set) = retention(meta.retention_bytes);
    vec![
        Config {
            name: "cleanup.policy",
            value: "delete".to_owned(),
            from_topic: false,
            read_only: true,
            kind: TYPE_LIST,
            doc: "Old records are deleted by retention; narad does not compact.",
        },
        Config {
            name: "min.insync.replicas",
            value: "1".to_owned(),
            from_topic: false,
            read_only: true,
            kind: TYPE_INT,
            doc: "Each partition has one durable copy, on its owner's disk.",
        },
        Config {
            name: "retention.bytes",
            value: retention_bytes,
            from_topic: bytes_set,
            read_only: false,
            kind: TYPE_LONG,
            doc: "Most bytes a partition keeps before its oldest segments go; -1 keeps all.",
        },
        Config {
            name: "retention.ms",
            value: retention_ms,
            from_topic: ms_set,
            read_only: false,
            kind: TYPE_LONG,
            doc: "Longest a record is kept; -1 keeps records forever.",
        },
    ]
}

/// The defaults a topic created through this listener gets.
fn broker_configs(deps: &KafkaDeps) -> Vec<Config> {
    let auto_creates = admin::auto_creates(deps);
    vec![
        Config {
            name: "auto.create.topics.enable",
            value: auto_creates.to_string(),
            from_topic: false,
            read_only: true,
            kind: TYPE_BOOLEAN,
            doc: if auto_creates {
                "A Metadata request that allows it creates the unknown topics it names \
                 (--kafka-auto-create-partitions)."
            } else {
                "No request but CreateTopics creates a topic (--kafka-auto-create-partitions)."
            },
        },
        Config {
            name: "default.replication.factor",
            value: "1".to_owned(),
            from_topic: false,
            read_only: true,
            kind: TYPE_INT,
            doc: "Each partition has one durable copy, on its owner's disk.",
        },
        Config {
            name: "log.retention.bytes",
            value: "-1".to_owned(),
            from_topic: false,
            read_only: true,
            kind: TYPE_LONG,
            doc: "A topic created without retention.bytes keeps every byte.",
        },
        Config {
            name: "log.retention.ms",
            value: "-1".to_owned(),
            from_topic: false,
            read_only: true,
            kind: TYPE_LONG,
            doc: "A topic created without retention.ms keeps records forever.",
        },
        Config {
            name: "num.partitions",
            value: admin::default_partitions(deps).to_string(),
            from_topic: false,
            read_only: true,
            kind: TYPE_INT,
            doc: "Partitions of a topic created without a count, or auto-created.",
        },
    ]
}

/// `configs` as the answer lists them: only `keys` when named, with synonyms and
/// documentation when asked (at `version`).
fn listed(
    configs: Vec<Config>,
    keys: Option<&[StrBytes]>,
    synonyms: bool,
    documentation: bool,
    version: i16,
) -> Vec<DescribeConfigsResourceResult> {
    configs
        .into_iter()
        .filter(|c| keys.is_none_or(|keys| keys.iter().any(|k| k.as_str() == c.name)))
        .map(|c| {
            let source = if c.from_topic {
                SOURCE_TOPIC
            } else {
                SOURCE_DEFAULT
            };
            let mut out = DescribeConfigsResourceResult::default();
            out.name = StrBytes::from_static_str(c.name);
            out.value = Some(StrBytes::from_string(c.value.clone()));
            out.read_only = c.read_only;
            out.config_source = source;
            out.is_sensitive = false;
            if synonyms {
                let mut synonym = DescribeConfigsSynonym::default();
                synonym.name = StrBytes::from_static_str(c.name);
                synonym.value = Some(StrBytes::from_string(c.value));
                synonym.source = source;
                out.synonyms = vec![synonym];
            }
            if version >= 3 {
                out.config_type = c.kind;
                if documentation {
                    out.documentation = Some(StrBytes::from_static_str(c.doc));
                }
            }
            out
        })
        .collect()
}

/// Answers a DescribeConfigs request.
pub(crate) async fn describe_configs(
    deps: &KafkaDeps,
    advertised: &Advertised,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let mut response = DescribeConfigsResponse::default();
    let snapshot = deps.metastore.snapshot().await;
    let this_broker = brokers(deps, advertised).this.0.to_string();
    for (i, resource) in request.resources.into_iter().enumerate() {
        let mut result = DescribeConfigsResult::default();
        result.resource_type = resource.resource_type;
        result.resource_name = resource.resource_name.clone();
        let keys = resource.configuration_keys.as_deref();
        let refuse = |result: &mut DescribeConfigsResult, code: i16, message: String| {
            result.error_code = code;
            result.error_message = Some(StrBytes::from_string(message));
        };
        let name = resource.resource_name.as_str();
        if i >= MAX_RESOURCES_PER_REQUEST {
            refuse(
                &mut result,
                code::INVALID_REQUEST,
                format!(
                    "a request describes at most {MAX_RESOURCES_PER_REQUEST} resources; ask for \
                     the others in another request"
                ),
            );
        } else {
            match (resource.resource_type, &snapshot) {
                (RESOURCE_TOPIC, Ok(snapshot)) => match snapshot.topics.get(name) {
                    Some(meta) => {
                        result.error_code = code::NONE;
                        result.configs = listed(
                            topic_configs(meta),
                            keys,
                            request.include_synonyms,
                            request.include_documentation,
                            version,
                        );
                    }
                    None => refuse(
                        &mut result,
                        code::UNKNOWN_TOPIC_OR_PARTITION,
                        format!("topic {name} does not exist"),
                    ),
                },
                (RESOURCE_TOPIC, Err(e)) => refuse(
                    &mut result,
                    code::KAFKA_STORAGE_ERROR,
                    format!("the topic metadata cannot be read now: {e}"),
                ),
                (RESOURCE_BROKER, _) if name.is_empty() || name == this_broker => {
                    result.error_code = code::NONE;
                    result.configs = listed(
                        broker_configs(deps),
                        keys,
                        request.include_synonyms,
                        request.include_documentation,
                        version,
                    );
                }
                (RESOURCE_BROKER, _) => refuse(
                    &mut result,
                    code::INVALID_REQUEST,
                    format!("this is broker {this_broker}; ask broker {name} for its own configs"),
                ),
                (other, _) => refuse(
                    &mut result,
                    code::INVALID_REQUEST,
                    format!(
                        "resource type {other} has no configs here: narad describes topics (2) \
                         and brokers (4)"
                    ),
                ),
            }
        }
        response.results.push(result);
    }
    response
}

/// Answers a DescribeCluster request: the brokers Metadata lists, this one as the
/// controller (metadata changes go through whichever node is asked).
pub(crate) fn describe_cluster(
    deps: &KafkaDeps,
    advertised: &Advertised,
    request: &DescribeClusterRequest,
    version: i16,
) -> DescribeClusterResponse {
    let mut response = DescribeClusterResponse::default();
    response.cluster_id = StrBytes::from_static_str(CLUSTER_ID);
    response.endpoint_type = if version >= 1 {
        request.endpoint_type
    } else {
        ENDPOINT_BROKERS
    };
    if version >= 1 && request.endpoint_type != ENDPOINT_BROKERS {
        response.error_code = code::UNSUPPORTED_ENDPOINT_TYPE;
        response.error_message = Some(StrBytes::from_static_str(
            "a broker lists brokers (endpoint type 1); narad has no separate controllers",
        ));
        return response;
    }
    let listed = brokers(deps, advertised);
    response.controller_id = listed.this;
    response.brokers = listed
        .all
        .into_iter()
        .map(|(id, host, port)| {
            let mut broker = DescribeClusterBroker::default();
            broker.broker_id = id;
            broker.host = StrBytes::from_string(host);
            broker.port = port;
            broker
        })
        .collect();
    response.cluster_authorized_operations = if request.include_cluster_authorized_operations {
        let mut allowed = [OP_DESCRIBE, OP_DESCRIBE_CONFIGS, OP_IDEMPOTENT_WRITE]
            .iter()
            .fold(0, |bits, op| bits | (1 << op));
        if deps
            .admin
            .as_ref()
            .is_some_and(|a| a.access == admin::AdminAccess::Open)
        {
            allowed |= 1 << OP_CREATE;
        }
        allowed
    } else {
        OPERATIONS_NOT_ASKED
    };
    response
}
