//! The Kafka listener's series: connections, requests per API, and why connections closed.

use std::sync::atomic::AtomicI64;

use kafka_protocol::messages::ApiKey;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a Kafka connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// The client closed it (or the socket failed): normal.
    ClientClosed,
    /// Idle for `IDLE_TIMEOUT`: normal for clients that went quiet.
    IdleTimeout,
    /// A request's bytes stopped arriving within `TRANSFER_TIMEOUT`.
    ReadTimeout,
    /// A response was not taken within `TRANSFER_TIMEOUT`.
    WriteTimeout,
    /// A frame whose size or content could not be a request.
    BadFrame,
    /// A frame larger than `max-request-bytes`.
    Oversized,
    /// An API or version not offered by ApiVersions.
    Unsupported,
    /// The daemon is shutting down.
    Shutdown,
    /// The TLS handshake failed or did not end within `TRANSFER_TIMEOUT`.
    TlsHandshake,
    /// A request other than ApiVersions and SASL's before the connection authenticated.
    Unauthenticated,
    /// SASL authentication failed (or its messages came out of order).
    AuthenticationFailed,
}

impl CloseReason {
    /// Every reason, for the series that start at 0.
    pub(crate) const ALL: [CloseReason; 11] = [
        CloseReason::ClientClosed,
        CloseReason::IdleTimeout,
        CloseReason::ReadTimeout,
        CloseReason::WriteTimeout,
        CloseReason::BadFrame,
        CloseReason::Oversized,
        CloseReason::Unsupported,
        CloseReason::Shutdown,
        CloseReason::TlsHandshake,
        CloseReason::Unauthenticated,
        CloseReason::AuthenticationFailed,
    ];

    /// The `reason` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CloseReason::ClientClosed => "client",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::ReadTimeout => "read_timeout",
            CloseReason::WriteTimeout => "write_timeout",
            CloseReason::BadFrame => "bad_frame",
            CloseReason::Oversized => "oversized",
            CloseReason::Unsupported => "unsupported",
            CloseReason::Shutdown => "shutdown",
            CloseReason::TlsHandshake => "tls_handshake",
            CloseReason::Unauthenticated => "unauthenticated",
            CloseReason::AuthenticationFailed => "authentication_failed",
        }
    }
}

/// Labels of the per-API request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ApiLabels {
    /// The API's name, e.g. `Produce`.
    pub api: &'static str,
}

/// Labels of the per-topic record counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TopicLabels {
    /// Topic name.
    pub topic: String,
}

/// Labels of the close counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloseLabels {
    /// A [`CloseReason`] label.
    pub reason: &'static str,
}

/// Labels of the SASL authentication counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SaslLabels {
    /// `SCRAM-SHA-256`, `SCRAM-SHA-512`, `PLAIN`, or `none` (out of order).
    pub mechanism: &'static str,
    /// `ok` or `failed`.
    pub outcome: &'static str,
}

/// Labels of the ACL refusal counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DeniedLabels {
    /// `topic`, `group` or `cluster`.
    pub resource: &'static str,
    /// The operation refused.
    pub operation: &'static str,
}

/// The listener's series.
#[derive(Debug, Default)]
pub(crate) struct KafkaMetrics {
    /// `narad_kafka_connections`: Kafka connections open now.
    pub connections: Gauge<i64, AtomicI64>,
    /// `narad_kafka_connections_refused_total`: connections closed at accept, at the cap.
    pub refused: Counter,
    /// `narad_kafka_connections_closed_total{reason}`: connections ended, by reason.
    pub(crate) closed_by: Family<CloseLabels, Counter>,
    /// `narad_kafka_requests_total{api}`: requests handled, per API.
    pub requests: Family<ApiLabels, Counter>,
    /// `narad_kafka_unsupported_requests_total`: requests for an API or version not offered.
    pub(crate) unsupported: Counter,
    /// `narad_kafka_produce_records_total{topic}`: records committed by Kafka produces
    /// (counted once durable; duplicates answered from the idempotence cache are not).
    pub(crate) produce_records: Family<TopicLabels, Counter>,
    /// `narad_kafka_fetch_records_total{topic}`: records returned by Kafka fetches.
    pub(crate) fetch_records: Family<TopicLabels, Counter>,
    /// `narad_kafka_sasl_authentications_total{mechanism,outcome}`: SASL authentications
    /// that ended, by mechanism and outcome.
    pub(crate) sasl: Family<SaslLabels, Counter>,
    /// `narad_kafka_acl_denied_total{resource,operation}`: checks the ACLs refused.
    pub(crate) acl_denied: Family<DeniedLabels, Counter>,
}

impl KafkaMetrics {
    /// Registers every series in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "narad_kafka_connections",
            "Kafka protocol connections open now",
            self.connections.clone(),
        );
        registry.register(
            "narad_kafka_connections_refused",
            "Kafka connections closed at accept because the connection cap was reached",
            self.refused.clone(),
        );
        for reason in CloseReason::ALL {
            drop(self.closed_by.get_or_create(&CloseLabels {
                reason: reason.as_str(),
            }));
        }
        registry.register(
            "narad_kafka_connections_closed",
            "Kafka connections that ended, by reason",
            self.closed_by.clone(),
        );
        registry.register(
            "narad_kafka_requests",
            "Kafka requests handled, per API",
            self.requests.clone(),
        );
        registry.register(
            "narad_kafka_produce_records",
            "Records committed by Kafka produce requests (counted once durable)",
            self.produce_records.clone(),
        );
        registry.register(
            "narad_kafka_fetch_records",
            "Records returned by Kafka fetch requests",
            self.fetch_records.clone(),
        );
        registry.register(
            "narad_kafka_sasl_authentications",
            "Kafka SASL authentications that ended, by mechanism and outcome (ok, failed)",
            self.sasl.clone(),
        );
        registry.register(
            "narad_kafka_acl_denied",
            "Kafka requests (or the topics and groups in them) the ACLs refused, by resource and operation",
            self.acl_denied.clone(),
        );
        registry.register(
            "narad_kafka_unsupported_requests",
            "Kafka requests for an API or version ApiVersions does not offer",
            self.unsupported.clone(),
        );
    }

    /// Counts records committed to `topic` by a produce.
    pub(crate) fn produced(&self, topic: &str, records: u64) {
        self.produce_records
            .get_or_create(&TopicLabels {
                topic: topic.to_owned(),
            })
            .inc_by(records);
    }

    /// Counts records of `topic` returned by a fetch.
    pub(crate) fn fetched(&self, topic: &str, records: u64) {
        if records > 0 {
            self.fetch_records
                .get_or_create(&TopicLabels {
                    topic: topic.to_owned(),
                })
                .inc_by(records);
        }
    }

    /// Counts a SASL authentication's end.
    pub(crate) fn authenticated(&self, mechanism: &'static str, outcome: &'static str) {
        self.sasl
            .get_or_create(&SaslLabels { mechanism, outcome })
            .inc();
    }

    /// Counts a check the ACLs refused.
    pub(crate) fn denied(&self, resource: &'static str, operation: &'static str) {
        self.acl_denied
            .get_or_create(&DeniedLabels {
                resource,
                operation,
            })
            .inc();
    }

    /// Counts a connection's end.
    pub(crate) fn closed(&self, reason: CloseReason) {
        self.closed_by
            .get_or_create(&CloseLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts a handled request.
    pub(crate) fn request(&self, api: ApiKey) {
        let api = match api {
            ApiKey::Produce => "Produce",
            ApiKey::Fetch => "Fetch",
            ApiKey::ListOffsets => "ListOffsets",
            ApiKey::Metadata => "Metadata",
            ApiKey::ApiVersions => "ApiVersions",
            ApiKey::InitProducerId => "InitProducerId",
            ApiKey::CreateTopics => "CreateTopics",
            ApiKey::DeleteTopics => "DeleteTopics",
            ApiKey::CreatePartitions => "CreatePartitions",
            ApiKey::DescribeConfigs => "DescribeConfigs",
            ApiKey::DescribeCluster => "DescribeCluster",
            ApiKey::SaslHandshake => "SaslHandshake",
            ApiKey::SaslAuthenticate => "SaslAuthenticate",
            _ => "other",
        };
        self.requests.get_or_create(&ApiLabels { api }).inc();
    }
}
