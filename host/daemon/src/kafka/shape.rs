//! A walk over a request body, before the `kafka-protocol` decoder sees it, that refuses
//! any array whose declared element count exceeds the bytes left in the frame.
//!
//! Why: the crate (0.18) sizes a `Vec` from an array's count before decoding one element,
//! so an 18-byte Metadata request claiming `i32::MAX` topics asks for ~150 GB and the
//! allocation failure aborts the daemon (upstream: kafka-protocol-rs pull requests 152, 161
//! and 200, open). Every element takes at least one byte on the wire, so a count above the
//! bytes left cannot be honest. The walk knows the array-bearing requests offered
//! (Metadata, Produce, Fetch, ListOffsets, FindCoordinator, JoinGroup, SyncGroup,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups,
//! CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs) at every
//! offered version, and Heartbeat, which has none, field by field; ApiVersions,
//! InitProducerId and DescribeCluster have no arrays. Remove this when the crate bounds its own allocations.

use kafka_protocol::messages::ApiKey;

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed request body: {0}")]
pub(crate) struct ShapeError(pub &'static str);

type Walk = Result<(), ShapeError>;

struct Reader<'a> {
    buf: &'a [u8],
    flexible: bool,
}

impl Reader<'_> {
    fn skip(&mut self, n: usize) -> Walk {
        if n > self.buf.len() {
            return Err(ShapeError("truncated"));
        }
        self.buf = &self.buf[n..];
        Ok(())
    }

    fn uvarint(&mut self) -> Result<u64, ShapeError> {
        let mut value = 0u64;
        for i in 0..10 {
            let &byte = self.buf.get(i).ok_or(ShapeError("truncated varint"))?;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        Err(ShapeError("varint too long"))
    }

    /// A length: compact (unsigned varint, 0 = null) when flexible, else `width` bytes
    /// signed (-1 = null). `None` for null.
    fn length(&mut self, width: usize) -> Result<Option<usize>, ShapeError> {
        if self.flexible {
            let n = self.uvarint()?;
            return Ok(match n {
                0 => None,
                n => Some(usize::try_from(n - 1).map_err(|_| ShapeError("length"))?),
            });
        }
        let n = match width {
            2 => {
                let b = self.buf.get(..2).ok_or(ShapeError("truncated length"))?;
                i64::from(i16::from_be_bytes([b[0], b[1]]))
            }
            _ => {
                let b = self.buf.get(..4).ok_or(ShapeError("truncated length"))?;
                i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            }
        };
        self.skip(width)?;
        match n {
            -1 => Ok(None),
            n if n < 0 => Err(ShapeError("negative length")),
            n => Ok(Some(usize::try_from(n).map_err(|_| ShapeError("length"))?)),
        }
    }

    /// A string (nullable or not: the walk does not care).
    fn string(&mut self) -> Walk {
        let n = self.length(2)?.unwrap_or(0);
        self.skip(n)
    }

    /// A bytes field (records).
    fn bytes(&mut self) -> Walk {
        let n = self.length(4)?.unwrap_or(0);
        self.skip(n)
    }

    /// An array: its count checked against the bytes left, then each element.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Walk) -> Walk {
        let Some(count) = self.length(4)? else {
            return Ok(());
        };
        if count > self.buf.len() {
            return Err(ShapeError("array count exceeds the bytes left"));
        }
        for _ in 0..count {
            element(self)?;
        }
        Ok(())
    }

    /// The fields end here. Bytes after the last field are ignored, as a Kafka broker ignores
    /// them: librdkafka sends three on a Metadata request for every topic, and refusing them
    /// closed the connection of every librdkafka client that listed topics. They are within
    /// the frame, whose size is already bounded, and no count in them is trusted.
    fn end(&self) -> Walk {
        #[cfg(test)]
        tests::LEFT_AT_END.with(|left| left.set(Some(self.buf.len())));
        if !self.buf.is_empty() {
            tracing::trace!(
                bytes = self.buf.len(),
                "kafka: ignoring bytes after a request's last field"
            );
        }
        Ok(())
    }

    /// Tagged fields, when flexible.
    fn tags(&mut self) -> Walk {
        if !self.flexible {
            return Ok(());
        }
        let count = usize::try_from(self.uvarint()?).map_err(|_| ShapeError("tag count"))?;
        if count > self.buf.len() {
            return Err(ShapeError("tag count exceeds the bytes left"));
        }
        for _ in 0..count {
            self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|_| ShapeError("tag size"))?;
            self.skip(size)?;
        }
        Ok(())
    }
}

/// Checks the body (after the request header) of `api` at `version`: every array count
/// within the bytes left, every field where the version puts it (bytes after the last are
/// ignored, as Kafka brokers ignore them).
pub(crate) fn check(api: ApiKey, version: i16, body: &[u8]) -> Walk {
    let v = version;
    match api {
        ApiKey::Metadata => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 9,
            };
            r.array(|r| {
                if v >= 10 {
                    r.skip(16)?; // topic id
                }
                r.string()?;
                r.tags()
            })?;
            if v >= 4 {
                r.skip(1)?; // allow auto topic creation
            }
            if (8..=10).contains(&v) {
                r.skip(1)?; // include cluster authorized operations
            }
            if v >= 8 {
                r.skip(1)?; // include topic authorized operations
            }
            r.tags()?;
            r.end()
        }
        ApiKey::Produce => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 9,
            };
            r.string()?; // transactional id
            r.skip(2 + 4)?; // acks, timeout
            r.array(|r| {
                r.string()?;
                r.array(|r| {
                    r.skip(4)?; // index
                    r.bytes()?;
                    r.tags()
                })?;
                r.tags()
            })?;
            r.tags()?;
            r.end()
        }
        ApiKey::Fetch => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 12,
            };
            r.skip(4 + 4 + 4)?; // replica id, max wait, min bytes
            r.skip(4 + 1)?; // max bytes (v3+), isolation level (v4+)
            if v >= 7 {
                r.skip(4 + 4)?; // session id, session epoch
            }
            r.array(|r| {
                r.string()?;
                r.array(|r| {
                    r.skip(4)?; // partition
                    if v >= 9 {
                        r.skip(4)?; // current leader epoch
                    }
                    r.skip(8)?; // fetch offset
                    if v >= 12 {
                        r.skip(4)?; // last fetched epoch
                    }
                    if v >= 5 {
                        r.skip(8)?; // log start offset
                    }
                    r.skip(4)?; // partition max bytes
                    r.tags()
                })?;
                r.tags()
            })?;
            if v >= 7 {
                r.array(|r| {
                    r.string()?;
                    r.array(|r| r.skip(4))?;
                    r.tags()
                })?;
            }
            if v >= 11 {
                r.string()?; // rack id
            }
            r.tags()?;
            r.end()
        }
        ApiKey::ListOffsets => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 6,
            };
            r.skip(4)?; // replica id
            if v >= 2 {
                r.skip(1)?; // isolation level
            }
            r.array(|r| {
                r.string()?;
                r.array(|r| {
                    r.skip(4)?; // partition index
                    if v >= 4 {
                        r.skip(4)?; // current leader epoch
                    }
                    r.skip(8)?; // timestamp
                    r.tags()
                })?;
                r.tags()
            })?;
            r.tags()?;
            r.end()
        }
        ApiKey::FindCoordinator => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 3,
            };
            if v <= 3 {
                r.string()?; // key
            }
            if v >= 1 {
                r.skip(1)?; // key type
            }
            if v >= 4 {
                r.array(Reader::string)?; // coordinator keys
            }
            r.tags()?;
            r.end()
        }
        ApiKey::JoinGroup => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 6,
            };
            r.string()?; // group id
            r.skip(4)?; // session timeout
            if v >= 1 {
                r.skip(4)?; // rebalance timeout
            }
            r.string()?; // member id
            if v >= 5 {
                r.string()?; // group instance id
            }
            r.string()?; // protocol type
            r.array(|r| {
                r.string()?; // name
                r.bytes()?; // metadata
                r.tags()
            })?;
            if v >= 8 {
                r.string()?; // reason
            }
            r.tags()?;
            r.end()
        }
        ApiKey::SyncGroup => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 4,
            };
            r.string()?; // group id
            r.skip(4)?; // generation id
            r.string()?; // member id
            if v >= 3 {
                r.string()?; // group instance id
            }
            if v >= 5 {
                r.string()?; // protocol type
                r.string()?; // protocol name
            }
            r.array(|r| {
                r.string()?; // member id
                r.bytes()?; // assignment
                r.tags()
            })?;
            r.tags()?;
            r.end()
        }
        ApiKey::Heartbeat => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 4,
            };
            r.string()?; // group id
            r.skip(4)?; // generation id
            r.string()?; // member id
            if v >= 3 {
                r.string()?; // group instance id
            }
            r.tags()?;
            r.end()
        }
        ApiKey::LeaveGroup => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 4,
            };
            r.string()?; // group id
            if v <= 2 {
                r.string()?; // member id
            } else {
                r.array(|r| {
                    r.string()?; // member id
                    r.string()?; // group instance id
                    if v >= 5 {
                        r.string()?; // reason
                    }
                    r.tags()
                })?;
            }
            r.tags()?;
            r.end()
        }
        ApiKey::OffsetCommit => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 8,
            };
            r.string()?; // group id
            r.skip(4)?; // generation id or member epoch
            r.string()?; // member id
            if v >= 7 {
                r.string()?; // group instance id
            }
            if v <= 4 {
                r.skip(8)?; // retention time
            }
            r.array(|r| {
                r.string()?; // name
                r.array(|r| {
                    r.skip(4 + 8)?; // partition index, committed offset
                    if v >= 6 {
                        r.skip(4)?; // committed leader epoch
                    }
                    r.string()?; // committed metadata
                    r.tags()
                })?;
                r.tags()
            })?;
            r.tags()?;
            r.end()
        }
        ApiKey::OffsetFetch => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 6,
            };
            // A topic, and its partition indexes.
            let topic = |r: &mut Reader| {
                r.string()?;
                r.array(|r| r.skip(4))?;
                r.tags()
            };
            if v <= 7 {
                r.string()?; // group id
                r.array(topic)?;
            } else {
                r.array(|r| {
                    r.string()?; // group id
                    r.array(topic)?;
                    r.tags()
                })?;
            }
            if v >= 7 {
                r.skip(1)?; // require stable
            }
            r.tags()?;
            r.end()
        }
        ApiKey::ListGroups => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 3,
            };
            if v >= 4 {
                r.array(Reader::string)?; // states filter
            }
            r.tags()?;
            r.end()
        }
        ApiKey::DescribeGroups => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 5,
            };
            r.array(Reader::string)?; // groups
            if v >= 3 {
                r.skip(1)?; // include authorized operations
            }
            r.tags()?;
            r.end()
        }
        ApiKey::DeleteGroups => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 2,
            };
            r.array(Reader::string)?; // group names
            r.tags()?;
            r.end()
        }
        ApiKey::CreateTopics => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 5,
            };
            r.array(|r| {
                r.string()?; // name
                r.skip(4 + 2)?; // num partitions, replication factor
                r.array(|r| {
                    r.skip(4)?; // partition index
                    r.array(|r| r.skip(4))?; // broker ids
                    r.tags()
                })?;
                r.array(|r| {
                    r.string()?; // name
                    r.string()?; // value (nullable)
                    r.tags()
                })?;
                r.tags()
            })?;
            r.skip(4)?; // timeout
            if v >= 1 {
                r.skip(1)?; // validate only
            }
            r.tags()?;
            r.end()
        }
        ApiKey::DeleteTopics => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 4,
            };
            if v >= 6 {
                r.array(|r| {
                    r.string()?; // name (nullable)
                    r.skip(16)?; // topic id
                    r.tags()
                })?;
            } else {
                r.array(Reader::string)?; // topic names
            }
            r.skip(4)?; // timeout
            r.tags()?;
            r.end()
        }
        ApiKey::CreatePartitions => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 2,
            };
            r.array(|r| {
                r.string()?; // name
                r.skip(4)?; // count
                r.array(|r| {
                    r.array(|r| r.skip(4))?; // broker ids
                    r.tags()
                })?; // assignments (nullable)
                r.tags()
            })?;
            r.skip(4 + 1)?; // timeout, validate only
            r.tags()?;
            r.end()
        }
        ApiKey::DescribeConfigs => {
            let mut r = Reader {
                buf: body,
                flexible: v >= 4,
            };
            r.array(|r| {
                r.skip(1)?; // resource type
                r.string()?; // resource name
                r.array(Reader::string)?; // configuration keys (nullable)
                r.tags()
            })?;
            r.skip(1)?; // include synonyms
            if v >= 3 {
                r.skip(1)?; // include documentation
            }
            r.tags()?;
            r.end()
        }
        // No arrays (ApiVersions, InitProducerId, DescribeCluster), or not offered (refused
        // before this).
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::{
        DeleteGroupsRequest, DescribeGroupsRequest, FetchRequest, FindCoordinatorRequest, GroupId,
        HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, ListGroupsRequest,
        ListOffsetsRequest, MetadataRequest, OffsetCommitRequest, OffsetFetchRequest,
        ProduceRequest, SyncGroupRequest, TopicName,
    };
    use kafka_protocol::messages::{
        fetch_request, join_group_request, leave_group_request, list_offsets_request,
        metadata_request, offset_commit_request, offset_fetch_request, produce_request,
        sync_group_request,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;
    use crate::kafka::api_versions::OFFERED;

    thread_local! {
        /// The bytes left after the last field, when a walk last reached its end.
        pub(super) static LEFT_AT_END: std::cell::Cell<Option<usize>> =
            const { std::cell::Cell::new(None) };
    }

    /// Every (api, version) offered.
    fn versions() -> Vec<(ApiKey, i16)> {
        OFFERED
            .iter()
            .flat_map(|&(api, min, max)| (min..=max).map(move |version| (api, version)))
            .collect()
    }

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    fn text(s: &'static str) -> StrBytes {
        StrBytes::from_static_str(s)
    }

    fn group(s: &'static str) -> GroupId {
        GroupId(text(s))
    }

    /// Requests with two of every array element, as the crate's client side encodes them.
    fn encoded(api: ApiKey, version: i16) -> Option<Vec<u8>> {
        let mut out = BytesMut::new();
        match api {
            ApiKey::Metadata => {
                let mut topic = metadata_request::MetadataRequestTopic::default();
                topic.name = Some(name("orders"));
                let mut req = MetadataRequest::default();
                req.topics = Some(vec![topic.clone(), topic]);
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::Produce => {
                let mut partition = produce_request::PartitionProduceData::default();
                partition.records = Some(Bytes::from_static(b"0123456789"));
                let mut topic = produce_request::TopicProduceData::default();
                topic.name = name("orders");
                topic.partition_data = vec![partition.clone(), partition];
                let mut req = ProduceRequest::default();
                req.topic_data = vec![topic.clone(), topic];
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::Fetch => {
                let mut topic = fetch_request::FetchTopic::default();
                topic.topic = name("orders");
                topic.partitions = vec![fetch_request::FetchPartition::default(); 2];
                let mut req = FetchRequest::default();
                req.topics = vec![topic.clone(), topic];
                if version >= 7 {
                    let mut forgotten = fetch_request::ForgottenTopic::default();
                    forgotten.topic = name("old");
                    forgotten.partitions = vec![1, 2, 3];
                    req.forgotten_topics_data = vec![forgotten];
                }
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::ListOffsets => {
                let mut topic = list_offsets_request::ListOffsetsTopic::default();
                topic.name = name("orders");
                topic.partitions = vec![list_offsets_request::ListOffsetsPartition::default(); 2];
                let mut req = ListOffsetsRequest::default();
                req.topics = vec![topic.clone(), topic];
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::FindCoordinator => {
                let mut req = FindCoordinatorRequest::default();
                if version <= 3 {
                    req.key = text("payments");
                } else {
                    req.coordinator_keys = vec![text("payments"), text("billing")];
                }
                if version >= 1 {
                    req.key_type = 1;
                }
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::JoinGroup => {
                let mut protocol = join_group_request::JoinGroupRequestProtocol::default();
                protocol.name = text("range");
                protocol.metadata = Bytes::from_static(b"\0\x01subscription");
                let mut req = JoinGroupRequest::default();
                req.group_id = group("payments");
                req.member_id = text("member-1");
                if version >= 5 {
                    req.group_instance_id = Some(text("instance-1"));
                }
                req.protocol_type = text("consumer");
                req.protocols = vec![protocol.clone(), protocol];
                req.reason = Some(text("rejoin"));
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::SyncGroup => {
                let mut assignment = sync_group_request::SyncGroupRequestAssignment::default();
                assignment.member_id = text("member-1");
                assignment.assignment = Bytes::from_static(b"\0\x01assignment");
                let mut req = SyncGroupRequest::default();
                req.group_id = group("payments");
                req.member_id = text("member-1");
                if version >= 3 {
                    req.group_instance_id = Some(text("instance-1"));
                }
                req.protocol_type = Some(text("consumer"));
                req.protocol_name = Some(text("range"));
                req.assignments = vec![assignment.clone(), assignment];
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::Heartbeat => {
                let mut req = HeartbeatRequest::default();
                req.group_id = group("payments");
                req.generation_id = 3;
                req.member_id = text("member-1");
                if version >= 3 {
                    req.group_instance_id = Some(text("instance-1"));
                }
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::LeaveGroup => {
                let mut req = LeaveGroupRequest::default();
                req.group_id = group("payments");
                if version <= 2 {
                    req.member_id = text("member-1");
                } else {
                    let mut member = leave_group_request::MemberIdentity::default();
                    member.member_id = text("member-1");
                    member.group_instance_id = Some(text("instance-1"));
                    member.reason = Some(text("shutdown"));
                    req.members = vec![member.clone(), member];
                }
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::OffsetCommit => {
                let mut partition = offset_commit_request::OffsetCommitRequestPartition::default();
                partition.committed_offset = 42;
                partition.committed_metadata = Some(text("meta"));
                let mut topic = offset_commit_request::OffsetCommitRequestTopic::default();
                topic.name = name("orders");
                topic.partitions = vec![partition.clone(), partition];
                let mut req = OffsetCommitRequest::default();
                req.group_id = group("payments");
                req.member_id = text("member-1");
                if version >= 7 {
                    req.group_instance_id = Some(text("instance-1"));
                }
                req.topics = vec![topic.clone(), topic];
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::OffsetFetch => {
                let mut req = OffsetFetchRequest::default();
                if version <= 7 {
                    let mut topic = offset_fetch_request::OffsetFetchRequestTopic::default();
                    topic.name = name("orders");
                    topic.partition_indexes = vec![0, 1];
                    req.group_id = group("payments");
                    req.topics = Some(vec![topic.clone(), topic]);
                } else {
                    let mut topic = offset_fetch_request::OffsetFetchRequestTopics::default();
                    topic.name = name("orders");
                    topic.partition_indexes = vec![0, 1];
                    let mut one = offset_fetch_request::OffsetFetchRequestGroup::default();
                    one.group_id = group("payments");
                    one.topics = Some(vec![topic.clone(), topic]);
                    req.groups = vec![one.clone(), one];
                }
                if version >= 7 {
                    req.require_stable = true;
                }
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::ListGroups => {
                let mut req = ListGroupsRequest::default();
                if version >= 4 {
                    req.states_filter = vec![text("Stable"), text("Empty")];
                }
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::DescribeGroups => {
                let mut req = DescribeGroupsRequest::default();
                req.groups = vec![group("payments"), group("billing")];
                if version >= 3 {
                    req.include_authorized_operations = true;
                }
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::DeleteGroups => {
                let mut req = DeleteGroupsRequest::default();
                req.groups_names = vec![group("payments"), group("billing")];
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::CreateTopics => {
                use kafka_protocol::messages::create_topics_request::{
                    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
                };
                let mut assignment = CreatableReplicaAssignment::default();
                assignment.partition_index = 0;
                assignment.broker_ids = vec![kafka_protocol::messages::BrokerId(1)];
                let mut config = CreatableTopicConfig::default();
                config.name = text("retention.ms");
                config.value = Some(text("60000"));
                let mut unset = CreatableTopicConfig::default();
                unset.name = text("retention.bytes");
                let mut topic = CreatableTopic::default();
                topic.name = name("orders");
                topic.num_partitions = 3;
                topic.replication_factor = 1;
                topic.assignments = vec![assignment];
                topic.configs = vec![config, unset];
                let mut req = kafka_protocol::messages::CreateTopicsRequest::default();
                req.topics = vec![topic.clone(), topic];
                req.timeout_ms = 30_000;
                req.validate_only = version >= 1;
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::DeleteTopics => {
                let mut req = kafka_protocol::messages::DeleteTopicsRequest::default();
                if version >= 6 {
                    let mut state =
                        kafka_protocol::messages::delete_topics_request::DeleteTopicState::default(
                        );
                    state.name = Some(name("orders"));
                    req.topics = vec![state.clone(), state];
                } else {
                    req.topic_names = vec![name("orders"), name("payments")];
                }
                req.timeout_ms = 30_000;
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::CreatePartitions => {
                use kafka_protocol::messages::create_partitions_request::{
                    CreatePartitionsAssignment, CreatePartitionsTopic,
                };
                let mut assignment = CreatePartitionsAssignment::default();
                assignment.broker_ids = vec![kafka_protocol::messages::BrokerId(1)];
                let mut topic = CreatePartitionsTopic::default();
                topic.name = name("orders");
                topic.count = 6;
                topic.assignments = Some(vec![assignment]);
                let mut plain = topic.clone();
                plain.assignments = None;
                let mut req = kafka_protocol::messages::CreatePartitionsRequest::default();
                req.topics = vec![topic, plain];
                req.timeout_ms = 30_000;
                req.validate_only = true;
                req.encode(&mut out, version).unwrap();
            }
            ApiKey::DescribeConfigs => {
                use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
                let mut keyed = DescribeConfigsResource::default();
                keyed.resource_type = 2;
                keyed.resource_name = text("orders");
                keyed.configuration_keys = Some(vec![text("retention.ms"), text("cleanup.policy")]);
                let mut all = keyed.clone();
                all.configuration_keys = None;
                let mut req = kafka_protocol::messages::DescribeConfigsRequest::default();
                req.resources = vec![keyed, all];
                req.include_synonyms = true;
                req.include_documentation = version >= 3;
                req.encode(&mut out, version).unwrap();
            }
            _ => return None,
        }
        Some(out.to_vec())
    }

    #[test]
    fn every_offered_version_of_an_honest_request_passes_the_walk_whole() {
        let mut walked = 0;
        for (api, version) in versions() {
            let Some(body) = encoded(api, version) else {
                continue;
            };
            LEFT_AT_END.with(|left| left.set(None));
            assert_eq!(check(api, version, &body), Ok(()), "{api:?} v{version}");
            // Every field walked, none left over.
            assert_eq!(
                LEFT_AT_END.with(std::cell::Cell::get),
                Some(0),
                "{api:?} v{version}"
            );
            // Cut anywhere inside, it is refused or passes, never panics.
            for cut in 0..body.len() {
                let _ = check(api, version, &body[..cut]);
            }
            walked += 1;
        }
        assert_eq!(
            walked,
            12 + 7 + 9 + 7 + 5 + 10 + 6 + 5 + 6 + 7 + 8 + 5 + 6 + 3 + 4 + 6 + 4 + 4,
            "Metadata, Produce, Fetch, ListOffsets, FindCoordinator, JoinGroup, SyncGroup, \
             Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, \
             DeleteGroups, CreateTopics, DeleteTopics, CreatePartitions and DescribeConfigs \
             versions"
        );
    }

    #[test]
    fn an_array_count_beyond_the_frame_is_refused_in_both_encodings() {
        let mut legacy = Vec::from(i32::MAX.to_be_bytes());
        legacy.extend_from_slice(&[0; 8]);
        assert!(check(ApiKey::Metadata, 1, &legacy).is_err());
        assert!(check(ApiKey::Metadata, 9, &[0xf0, 0xff, 0xff, 0xff, 0x07]).is_err());
        let mut produce = vec![0xff, 0xff, 0, 1, 0, 0, 0, 10];
        produce.extend_from_slice(&1_000_000i32.to_be_bytes());
        assert!(check(ApiKey::Produce, 3, &produce).is_err());
    }

    /// A string, legacy (i16 length) or compact (varint length + 1).
    fn string(flexible: bool, s: &str) -> Vec<u8> {
        let mut out = if flexible {
            vec![u8::try_from(s.len() + 1).unwrap()]
        } else {
            Vec::from(i16::try_from(s.len()).unwrap().to_be_bytes())
        };
        out.extend_from_slice(s.as_bytes());
        out
    }

    #[test]
    fn a_hostile_count_in_the_first_array_of_each_group_api_is_refused() {
        // The fields before the first array of each API at a version, Heartbeat having none
        // and FindCoordinator and ListGroups none before their flexible versions.
        let cases: Vec<(ApiKey, i16, Vec<u8>)> = vec![
            (ApiKey::FindCoordinator, 4, vec![0]),
            (
                ApiKey::JoinGroup,
                0,
                [
                    string(false, "g"),
                    vec![0; 4],
                    string(false, "m"),
                    string(false, "consumer"),
                ]
                .concat(),
            ),
            (
                ApiKey::JoinGroup,
                6,
                [
                    string(true, "g"),
                    vec![0; 8],
                    string(true, "m"),
                    vec![0], // null group instance id
                    string(true, "consumer"),
                ]
                .concat(),
            ),
            (
                ApiKey::SyncGroup,
                0,
                [string(false, "g"), vec![0; 4], string(false, "m")].concat(),
            ),
            (
                ApiKey::SyncGroup,
                5,
                [
                    string(true, "g"),
                    vec![0; 4],
                    string(true, "m"),
                    vec![0, 0, 0], // null group instance id, protocol type and name
                ]
                .concat(),
            ),
            (ApiKey::LeaveGroup, 3, string(false, "g")),
            (ApiKey::LeaveGroup, 4, string(true, "g")),
            (
                ApiKey::OffsetCommit,
                2,
                [
                    string(false, "g"),
                    vec![0; 4],
                    string(false, "m"),
                    vec![0; 8],
                ]
                .concat(),
            ),
            (
                ApiKey::OffsetCommit,
                8,
                [string(true, "g"), vec![0; 4], string(true, "m"), vec![0]].concat(),
            ),
            (ApiKey::OffsetFetch, 1, string(false, "g")),
            (ApiKey::OffsetFetch, 6, string(true, "g")),
            (ApiKey::OffsetFetch, 8, vec![]),
            (ApiKey::ListGroups, 4, vec![]),
            (ApiKey::DescribeGroups, 0, vec![]),
            (ApiKey::DescribeGroups, 5, vec![]),
            (ApiKey::DeleteGroups, 0, vec![]),
            (ApiKey::DeleteGroups, 2, vec![]),
            (ApiKey::CreateTopics, 2, vec![]),
            (ApiKey::CreateTopics, 5, vec![]),
            (ApiKey::DeleteTopics, 1, vec![]),
            (ApiKey::DeleteTopics, 4, vec![]),
            (ApiKey::DeleteTopics, 6, vec![]),
            (ApiKey::CreatePartitions, 0, vec![]),
            (ApiKey::CreatePartitions, 2, vec![]),
            // One topic, whose assignments array is the hostile one.
            (
                ApiKey::CreateTopics,
                4,
                [vec![0, 0, 0, 1], string(false, "t"), vec![0; 6]].concat(),
            ),
        ];
        let flexible = |api, v| match api {
            ApiKey::FindCoordinator | ApiKey::ListGroups => v >= 3,
            ApiKey::JoinGroup | ApiKey::OffsetFetch => v >= 6,
            ApiKey::OffsetCommit => v >= 8,
            ApiKey::DescribeGroups => v >= 5,
            ApiKey::DeleteGroups => v >= 2,
            ApiKey::CreateTopics => v >= 5,
            ApiKey::DeleteTopics => v >= 4,
            ApiKey::CreatePartitions => v >= 2,
            _ => v >= 4,
        };
        for (api, version, before) in cases {
            let (hostile, empty) = if flexible(api, version) {
                // 2^32 - 1, so a count of 2^32 - 2.
                (vec![0xff, 0xff, 0xff, 0xff, 0x0f], vec![1])
            } else {
                (Vec::from(i32::MAX.to_be_bytes()), vec![0; 4])
            };
            let after = [0u8; 16];
            let body = [before.clone(), hostile, after.to_vec()].concat();
            assert_eq!(
                check(api, version, &body),
                Err(ShapeError("array count exceeds the bytes left")),
                "{api:?} v{version}"
            );
            // The same fields with an empty array pass: the count above was where read.
            let body = [before, empty, after.to_vec()].concat();
            assert_eq!(check(api, version, &body), Ok(()), "{api:?} v{version}");
        }
    }
}
