//! ApiVersions: the APIs and version ranges this listener handles, advertised exactly.
//!
//! Produce and Fetch stop at 9 and 12: from 13 on they name topics by id, which narad topics
//! do not have. Produce 3 and Fetch 4 are the floor because they are where the v2 record
//! format starts (librdkafka uses it only when they are offered). The consumer group APIs
//! stop where KIP-848's member epochs begin (OffsetCommit 9, OffsetFetch 9) and before
//! ListGroups' type filter (5) and DescribeGroups 6. CreateTopics runs from 2 (Kafka 4
//! dropped 0 and 1) to 5, before topic ids (7) and a version librdkafka and kafka-python do
//! not use (6); DeleteTopics 1 to 6 (a topic named by id is UNKNOWN_TOPIC_ID), and
//! CreatePartitions 0 to 3; DescribeConfigs 1 to 4 (the crate has no 0) and DescribeCluster
//! 0 to 2, both read-only. Other admin APIs (AlterConfigs among them) and
//! the transaction APIs are not offered: clients see that here and refuse those features
//! themselves, and a request for them anyway closes the connection, as a Kafka broker does.

use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};

/// Every API handled, with its lowest and highest version.
pub(crate) const OFFERED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 8),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::CreateTopics, 2, 5),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::DescribeCluster, 0, 2),
];

/// The SASL APIs, offered on a listener that requires authentication: SaslHandshake 0 and 1
/// (librdkafka takes a broker whose range lacks 0 for one without SASL; a handshake at 0,
/// which would send the mechanism's messages outside Kafka's framing, is refused), and
/// SaslAuthenticate 0 to 2.
pub(crate) const OFFERED_SASL: &[(ApiKey, i16, i16)] = &[
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// Every API this listener handles: [`OFFERED`], and [`OFFERED_SASL`] with `sasl`.
fn all(sasl: bool) -> impl Iterator<Item = &'static (ApiKey, i16, i16)> {
    let extra: &[(ApiKey, i16, i16)] = if sasl { OFFERED_SASL } else { &[] };
    OFFERED.iter().chain(extra)
}

/// Whether `version` of `api` is handled (`sasl`: on a listener that requires SASL).
pub(crate) fn offered(api: ApiKey, version: i16, sasl: bool) -> bool {
    all(sasl).any(|&(key, min, max)| key == api && (min..=max).contains(&version))
}

/// The ApiVersions answer with `error_code` (0, or UNSUPPORTED_VERSION for a request at a
/// version not offered, which the client then retries at one that is).
pub(crate) fn response(error_code: i16, sasl: bool) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = error_code;
    response.api_keys = all(sasl)
        .map(|&(key, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = key as i16;
            v.min_version = min;
            v.max_version = max;
            v
        })
        .collect();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_issue_s_versions_are_advertised() {
        let advertised: Vec<(i16, i16, i16)> = response(0, false)
            .api_keys
            .iter()
            .map(|v| (v.api_key, v.min_version, v.max_version))
            .collect();
        assert_eq!(
            advertised,
            [
                (0, 3, 9),
                (1, 4, 12),
                (2, 1, 7),
                (3, 1, 12),
                (18, 0, 3),
                (22, 0, 4),
                (10, 0, 4),
                (11, 0, 9),
                (14, 0, 5),
                (12, 0, 4),
                (13, 0, 5),
                (8, 2, 8),
                (9, 1, 8),
                (16, 0, 4),
                (15, 0, 5),
                (42, 0, 2),
                (19, 2, 5),
                (20, 1, 6),
                (37, 0, 3),
                (32, 1, 4),
                (60, 0, 2),
            ]
        );
        assert!(!offered(ApiKey::Produce, 13, false));
        assert!(!offered(ApiKey::OffsetCommit, 9, false));
        assert!(!offered(ApiKey::CreateTopics, 6, false));
        assert!(!offered(ApiKey::DescribeConfigs, 0, false));
        assert!(!offered(ApiKey::AlterConfigs, 0, false));
        assert!(offered(ApiKey::Fetch, 4, false));
        assert!(!offered(ApiKey::SaslHandshake, 1, false));
        assert!(offered(ApiKey::SaslHandshake, 1, true));
        assert!(offered(ApiKey::SaslAuthenticate, 2, true));
        let with_sasl = response(0, true).api_keys;
        assert_eq!(with_sasl.len(), OFFERED.len() + 2);
        assert_eq!(
            (
                with_sasl[OFFERED.len()].api_key,
                with_sasl[OFFERED.len()].min_version
            ),
            (17, 0)
        );
    }
}
