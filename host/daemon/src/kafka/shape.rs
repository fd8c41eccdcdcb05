//! A walk over a request body, before the `kafka-protocol` decoder sees it, that refuses
//! any array whose declared element count exceeds the bytes left in the frame.
//!
//! Why: the crate (0.18) sizes a `Vec` from an array's count before decoding one element,
//! so an 18-byte Metadata request claiming `i32::MAX` topics asks for ~150 GB and the
//! allocation failure aborts the daemon (upstream: kafka-protocol-rs pull requests 152, 161
//! and 200, open). Every element takes at least one byte on the wire, so a count above the
//! bytes left cannot be honest. The walk knows the array-bearing requests offered
//! (Metadata, Produce, Fetch, ListOffsets) at every offered version; ApiVersions and
//! InitProducerId have no arrays. Remove this when the crate bounds its own allocations.

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
        // No arrays (ApiVersions, InitProducerId), or not offered (refused before this).
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::produce_request;
    use kafka_protocol::messages::{
        FetchRequest, ListOffsetsRequest, MetadataRequest, ProduceRequest, TopicName,
    };
    use kafka_protocol::messages::{fetch_request, list_offsets_request, metadata_request};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;
    use crate::kafka::api_versions::OFFERED;

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
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
            _ => return None,
        }
        Some(out.to_vec())
    }

    #[test]
    fn every_offered_version_of_an_honest_request_passes_the_walk_whole() {
        let mut walked = 0;
        for &(api, min, max) in OFFERED {
            for version in min..=max {
                let Some(body) = encoded(api, version) else {
                    continue;
                };
                assert_eq!(check(api, version, &body), Ok(()), "{api:?} v{version}");
                // Cut anywhere inside, it is refused or passes, never panics.
                for cut in 0..body.len() {
                    let _ = check(api, version, &body[..cut]);
                }
                walked += 1;
            }
        }
        assert_eq!(
            walked,
            12 + 7 + 9 + 7,
            "Metadata, Produce, Fetch and ListOffsets versions"
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
}
