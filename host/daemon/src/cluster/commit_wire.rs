//! The wire format of a child commit sent to the node that owns the child partition: a
//! compact binary encoding (postcard) of one bucket, with its provenance and the ownership
//! generation the sender saw.
//!
//! This is an internal format between narad nodes of one version, not a public API: the public
//! produce API cannot carry provenance (it would let any client forge it) and has no
//! generation to fence a stale sender with. The receiver checks the generation against its own
//! ownership before anything is appended, and a decoded request is bounded by the slab limits
//! whatever its bytes claim.
//!
//! Null values (Kafka tombstones) travel after the message, as the indexes of the records
//! whose value is null: a receiver that predates them reads the message and ignores the bytes
//! after it (storing those values empty, as it always did), and a message from a sender that
//! predates them has nothing after it. So nodes of both versions keep copying during a rolling
//! upgrade.

use bytes::Bytes;
use narad_storage::{AppendBatch, BatchOrigin, EncodedBatch, Header, NewRecord};
use serde::{Deserialize, Serialize};

/// Most records one commit carries: a bucket is at most a whole slab (engine reference:
/// fanout.max_batch_records = 4,096).
pub(crate) const MAX_COMMIT_RECORDS: usize = 4_096;

/// Largest encoded commit request: a slab's 4 MiB of record bytes plus framing (at most a few
/// dozen bytes of overhead per record at 4,096 records).
pub(crate) const MAX_COMMIT_REQUEST_BYTES: usize = 4 * 1024 * 1024 + 256 * 1024;

/// One bucket, addressed to the owner of `topic`/`partition`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CommitRequest {
    /// The child topic.
    pub topic: String,
    /// The child partition.
    pub partition: u32,
    /// The ownership generation the sender saw for that partition.
    pub generation: u64,
    /// The link's attach epoch.
    pub epoch: [u8; 8],
    /// The parent partition the records come from.
    pub parent_partition: u32,
    /// First parent offset of the slab.
    pub slab_start: u64,
    /// The records, each with its parent offset, in slab order.
    pub records: Vec<WireRecord>,
    /// Indexes (ascending) of the records whose value is null; their `value` is empty. Sent
    /// after the message (module doc), never inside it.
    #[serde(skip)]
    pub null_values: Vec<u32>,
    /// The generation at which the sender owns the parent partition, when it says
    /// ([`PARENT_GENERATION_HEADER`]); the receiver refuses a stale one.
    #[serde(skip)]
    pub parent_generation: Option<u64>,
}

/// The HTTP header a commit call names the sender's parent generation in
/// ([`CommitRequest::parent_generation`]; one per call: an in-order call's commits come from
/// one cursor). A header rather than a field, so that nodes of the version before it (which
/// ignore it) and after it keep copying during a rolling upgrade.
pub(crate) const PARENT_GENERATION_HEADER: &str = "x-narad-parent-generation";

/// One record of a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireRecord {
    /// Offset in the parent partition.
    pub parent_offset: u64,
    /// Key; `None` (absent) differs from an empty key.
    pub key: Option<WireBytes>,
    /// Headers in order, names may repeat.
    pub headers: Vec<(String, WireBytes)>,
    /// The value (empty for a null one: see [`CommitRequest::null_values`]).
    pub value: WireBytes,
}

/// Bytes of a record on the wire. Postcard writes a byte string and a sequence of `u8` the
/// same way (a varint length, then the bytes), so this is the encoding of the `Vec<u8>` it
/// replaced, byte for byte; but it is written and read as one copy instead of one call per
/// byte, and it shares the sender's buffers instead of copying each key and value out first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WireBytes(pub Bytes);

impl WireBytes {
    /// Whether there are no bytes.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for WireBytes {
    fn from(bytes: Vec<u8>) -> WireBytes {
        WireBytes(Bytes::from(bytes))
    }
}

impl Serialize for WireBytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for WireBytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<WireBytes, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = WireBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<WireBytes, E> {
                Ok(WireBytes(Bytes::copy_from_slice(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<WireBytes, E> {
                Ok(WireBytes::from(v))
            }
        }
        deserializer.deserialize_byte_buf(Visit)
    }
}

/// The owner's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum CommitResponse {
    /// Durable and verified (or, for `deduplicated` records, already held).
    Committed {
        /// Offset of the first record appended (the partition's end when all were held).
        base_offset: u64,
        /// Records appended.
        appended: u32,
        /// Records dropped because the partition already held them.
        deduplicated: u32,
        /// Commit time of the batch, ms since the epoch; 0 when every record was already held
        /// (nothing was committed).
        committed_at_ms: i64,
    },
    /// This node does not own the partition at that generation: the sender refreshes its view.
    NotOwner {
        /// Who this node believes owns it, if anyone.
        owner: Option<String>,
        /// The generation this node knows.
        generation: Option<u64>,
    },
    /// The commit was refused (a storage error); retry later.
    Failed {
        /// Why, for the sender's status and logs.
        reason: String,
    },
}

/// Why bytes are not a commit request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum WireError {
    /// More bytes than any commit may have.
    #[error("commit request of {bytes} bytes is over the {limit}-byte limit")]
    TooLarge {
        /// Bytes received.
        bytes: usize,
        /// The limit of the call.
        limit: usize,
    },
    /// The bytes do not decode.
    #[error("commit request does not decode: {0}")]
    Malformed(String),
    /// No records, or more than a slab.
    #[error("commit request carries {records} records; 1 to {MAX_COMMIT_RECORDS} are allowed")]
    RecordCount {
        /// Records carried.
        records: usize,
    },
}

impl CommitRequest {
    /// The request for one bucket, taking its records' bytes (shared, not copied). `batch`
    /// must carry its origin (a child commit always does).
    pub(crate) fn from_batch(
        topic: &str,
        partition: u32,
        generation: u64,
        batch: AppendBatch,
    ) -> Option<CommitRequest> {
        let origin = batch.origin?;
        let null_values = (0u32..)
            .zip(&batch.records)
            .filter(|(_, r)| r.value.is_none())
            .map(|(i, _)| i)
            .collect();
        let records = batch
            .records
            .into_iter()
            .zip(&origin.parent_offsets)
            .map(|(record, &parent_offset)| WireRecord {
                parent_offset,
                key: record.key.map(WireBytes),
                headers: record
                    .headers
                    .into_iter()
                    .map(|h| (h.name, WireBytes(h.value)))
                    .collect(),
                value: WireBytes(record.value.unwrap_or_default()),
            })
            .collect();
        Some(CommitRequest {
            topic: topic.to_owned(),
            partition,
            generation,
            epoch: origin.epoch,
            parent_partition: origin.parent_partition,
            slab_start: origin.slab_start,
            records,
            null_values,
            parent_generation: None,
        })
    }

    /// The batch to append on the receiving side.
    #[cfg(test)]
    pub(crate) fn into_batch(self) -> AppendBatch {
        let (records, origin) = self.into_parts();
        AppendBatch {
            records,
            origin: Some(origin),
        }
    }

    /// The records to append on the receiving side, and their provenance.
    pub(crate) fn into_parts(self) -> (Vec<NewRecord>, BatchOrigin) {
        let mut parent_offsets = Vec::with_capacity(self.records.len());
        let mut nulls = self.null_values.iter().peekable();
        let records = (0u32..)
            .zip(self.records)
            .map(|(i, r)| {
                parent_offsets.push(r.parent_offset);
                let null = nulls.next_if_eq(&&i).is_some();
                NewRecord {
                    key: r.key.map(|k| k.0),
                    headers: r
                        .headers
                        .into_iter()
                        .map(|(name, value)| Header {
                            name,
                            value: value.0,
                        })
                        .collect(),
                    value: (!null).then_some(r.value.0),
                }
            })
            .collect();
        let origin = BatchOrigin {
            epoch: self.epoch,
            parent_partition: self.parent_partition,
            slab_start: self.slab_start,
            parent_offsets,
        };
        (records, origin)
    }

    /// Bytes the encoding is expected to take: enough that it is written into one buffer,
    /// not one that doubles (and is copied) a dozen times on the way to a slab's size.
    fn expected_bytes(&self) -> usize {
        let per_record: usize = self
            .records
            .iter()
            .map(|r| {
                r.key.as_ref().map_or(0, |k| k.0.len())
                    + r.value.0.len()
                    + r.headers
                        .iter()
                        .map(|(name, value)| name.len() + value.0.len() + 10)
                        .sum::<usize>()
                    + 20
            })
            .sum();
        per_record + self.topic.len() + 64 + 5 * self.null_values.len()
    }

    /// Encodes the request, its null values after it.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // Encoding plain data into a Vec cannot fail.
        let mut out = postcard::to_extend(self, Vec::with_capacity(self.expected_bytes()))
            .unwrap_or_default();
        if !self.null_values.is_empty() {
            out.extend(postcard::to_allocvec(&self.null_values).unwrap_or_default());
        }
        out
    }

    /// Takes the null values sent after the message, checking they name distinct records in
    /// order, each with an empty value.
    fn set_null_values(&mut self, nulls: Vec<u32>) -> Result<(), WireError> {
        let mut previous = None;
        for &i in &nulls {
            let fits = previous.is_none_or(|p| i > p)
                && self
                    .records
                    .get(i as usize)
                    .is_some_and(|r| r.value.is_empty());
            if !fits {
                return Err(WireError::Malformed(format!(
                    "null value index {i} is out of order, past the records or on a non-empty value"
                )));
            }
            previous = Some(i);
        }
        self.null_values = nulls;
        Ok(())
    }

    /// Decodes a request, refusing anything over the size and record bounds.
    pub(crate) fn decode(bytes: &[u8]) -> Result<CommitRequest, WireError> {
        if bytes.len() > MAX_COMMIT_REQUEST_BYTES {
            return Err(WireError::TooLarge {
                bytes: bytes.len(),
                limit: MAX_COMMIT_REQUEST_BYTES,
            });
        }
        let (mut request, rest): (CommitRequest, &[u8]) =
            postcard::take_from_bytes(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
        if request.records.is_empty() || request.records.len() > MAX_COMMIT_RECORDS {
            return Err(WireError::RecordCount {
                records: request.records.len(),
            });
        }
        if !rest.is_empty() {
            let nulls: Vec<u32> =
                postcard::from_bytes(rest).map_err(|e| WireError::Malformed(e.to_string()))?;
            request.set_null_values(nulls)?;
        }
        Ok(request)
    }
}

/// Most commits one in-order call carries (the buckets of that many consecutive slabs for
/// one child partition); a sender with more makes several calls, one after another.
pub(crate) const MAX_COMMITS_PER_CALL: usize = 2;

/// Largest in-order call body: that many commits of the largest size.
pub(crate) const MAX_IN_ORDER_REQUEST_BYTES: usize =
    MAX_COMMITS_PER_CALL * MAX_COMMIT_REQUEST_BYTES;

/// Encodes commits for one in-order call (at most [`MAX_COMMITS_PER_CALL`]), the null values
/// of each after them all.
pub(crate) fn encode_in_order(requests: &[CommitRequest]) -> Vec<u8> {
    let expected = requests.iter().map(CommitRequest::expected_bytes).sum();
    let mut out = postcard::to_extend(requests, Vec::with_capacity(expected)).unwrap_or_default();
    if requests.iter().any(|r| !r.null_values.is_empty()) {
        let nulls: Vec<&Vec<u32>> = requests.iter().map(|r| &r.null_values).collect();
        out.extend(postcard::to_allocvec(&nulls).unwrap_or_default());
    }
    out
}

/// Decodes the commits of one in-order call, refusing an empty call, more than
/// [`MAX_COMMITS_PER_CALL`] commits, a body over [`MAX_IN_ORDER_REQUEST_BYTES`], and any
/// commit that [`CommitRequest::decode`] would refuse alone.
pub(crate) fn decode_in_order(bytes: &[u8]) -> Result<Vec<CommitRequest>, WireError> {
    if bytes.len() > MAX_IN_ORDER_REQUEST_BYTES {
        return Err(WireError::TooLarge {
            bytes: bytes.len(),
            limit: MAX_IN_ORDER_REQUEST_BYTES,
        });
    }
    let (mut requests, rest): (Vec<CommitRequest>, &[u8]) =
        postcard::take_from_bytes(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
    if requests.is_empty() || requests.len() > MAX_COMMITS_PER_CALL {
        return Err(WireError::Malformed(format!(
            "{} commits in one call (1 to {MAX_COMMITS_PER_CALL})",
            requests.len()
        )));
    }
    for request in &requests {
        if request.records.is_empty() || request.records.len() > MAX_COMMIT_RECORDS {
            return Err(WireError::RecordCount {
                records: request.records.len(),
            });
        }
    }
    if !rest.is_empty() {
        let nulls: Vec<Vec<u32>> =
            postcard::from_bytes(rest).map_err(|e| WireError::Malformed(e.to_string()))?;
        if nulls.len() != requests.len() {
            return Err(WireError::Malformed(format!(
                "null values for {} commits, {} sent",
                nulls.len(),
                requests.len()
            )));
        }
        for (request, nulls) in requests.iter_mut().zip(nulls) {
            request.set_null_values(nulls)?;
        }
    }
    Ok(requests)
}

/// One call of the frames route: the buckets of consecutive slabs for one child partition,
/// each as the frame the sender encoded for it (unsealed), so the owner appends the bytes it
/// got instead of decoding records and encoding them again. The frame carries the records,
/// null values and provenance itself.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FramesCall<'a> {
    /// The child topic.
    pub topic: &'a str,
    /// The child partition.
    pub partition: u32,
    /// The ownership generation the sender saw for that partition.
    pub generation: u64,
    /// The generation at which the sender owns the parent partition of every frame's records
    /// (one cursor sends a call), when it says.
    pub parent_generation: Option<u64>,
    /// The frames, in order (1 to [`MAX_COMMITS_PER_CALL`]).
    #[serde(borrow)]
    pub frames: Vec<WireFrame<'a>>,
}

/// One frame of a [`FramesCall`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireFrame<'a> {
    /// The CRC-32C of the frame's body, as the sender computed it while encoding.
    pub body_crc: u32,
    /// The frame, unsealed (`EncodedBatch::frame`).
    #[serde(with = "serde_bytes_borrowed")]
    pub frame: &'a [u8],
}

/// A byte string borrowed from the call's body (postcard writes a varint length and the
/// bytes), read and written as one slice.
mod serde_bytes_borrowed {
    pub(super) fn serialize<S: serde::Serializer>(
        bytes: &[u8],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<&'de [u8], D::Error> {
        <&'de [u8] as serde::Deserialize<'de>>::deserialize(deserializer)
    }
}

/// A checked [`FramesCall`], as the receiver applies it.
#[derive(Debug)]
pub(crate) struct FrameCommits {
    /// The child topic.
    pub topic: String,
    /// The child partition.
    pub partition: u32,
    /// The ownership generation the sender saw.
    pub generation: u64,
    /// The sender's parent generation, when it says.
    pub parent_generation: Option<u64>,
    /// Each frame, checked, with its provenance.
    pub frames: Vec<(EncodedBatch, BatchOrigin)>,
}

/// Encodes one frames call.
pub(crate) fn encode_frames(call: &FramesCall<'_>) -> Vec<u8> {
    let expected = 64
        + call.topic.len()
        + call
            .frames
            .iter()
            .map(|f| f.frame.len() + 10)
            .sum::<usize>();
    // Encoding plain data into a Vec cannot fail.
    postcard::to_extend(call, Vec::with_capacity(expected)).unwrap_or_default()
}

/// Decodes and checks a frames call: at most [`MAX_IN_ORDER_REQUEST_BYTES`], 1 to
/// [`MAX_COMMITS_PER_CALL`] frames, each one whole and unchanged (its body's CRC is the
/// sender's), with provenance (a child commit always has it) and 1 to [`MAX_COMMIT_RECORDS`]
/// records.
pub(crate) fn decode_frames(bytes: &[u8]) -> Result<FrameCommits, WireError> {
    if bytes.len() > MAX_IN_ORDER_REQUEST_BYTES {
        return Err(WireError::TooLarge {
            bytes: bytes.len(),
            limit: MAX_IN_ORDER_REQUEST_BYTES,
        });
    }
    let call: FramesCall<'_> =
        postcard::from_bytes(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
    if call.frames.is_empty() || call.frames.len() > MAX_COMMITS_PER_CALL {
        return Err(WireError::Malformed(format!(
            "{} frames in one call (1 to {MAX_COMMITS_PER_CALL})",
            call.frames.len()
        )));
    }
    let mut frames = Vec::with_capacity(call.frames.len());
    for (i, wire) in call.frames.iter().enumerate() {
        let (frame, origin) = EncodedBatch::from_unsealed(wire.frame.to_vec(), wire.body_crc)
            .map_err(|e| WireError::Malformed(format!("frame {i}: {e}")))?;
        let records = frame.record_count() as usize;
        if records > MAX_COMMIT_RECORDS {
            return Err(WireError::RecordCount { records });
        }
        let Some(origin) = origin else {
            return Err(WireError::Malformed(format!(
                "frame {i} has no provenance: it is not a child commit"
            )));
        };
        frames.push((frame, origin));
    }
    Ok(FrameCommits {
        topic: call.topic.to_owned(),
        partition: call.partition,
        generation: call.generation,
        parent_generation: call.parent_generation,
        frames,
    })
}

/// Encodes the answers of one in-order call, one per commit, in order.
pub(crate) fn encode_answers(answers: &[CommitResponse]) -> Vec<u8> {
    postcard::to_allocvec(answers).unwrap_or_default()
}

/// Decodes the answers of one in-order call.
pub(crate) fn decode_answers(bytes: &[u8]) -> Result<Vec<CommitResponse>, WireError> {
    postcard::from_bytes(bytes).map_err(|e| WireError::Malformed(e.to_string()))
}

impl CommitResponse {
    /// Encodes the answer.
    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).unwrap_or_default()
    }

    /// Decodes an answer.
    pub(crate) fn decode(bytes: &[u8]) -> Result<CommitResponse, WireError> {
        postcard::from_bytes(bytes).map_err(|e| WireError::Malformed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> AppendBatch {
        AppendBatch {
            records: vec![
                NewRecord {
                    key: Some(Bytes::from_static(b"k")),
                    headers: vec![
                        Header {
                            name: "h".into(),
                            value: Bytes::from_static(b"1"),
                        },
                        Header {
                            name: "h".into(),
                            value: Bytes::from_static(b"2"),
                        },
                    ],
                    value: Some(Bytes::from_static(b"v\x00\xff")),
                },
                NewRecord {
                    key: None,
                    headers: Vec::new(),
                    value: Some(Bytes::new()),
                },
                NewRecord {
                    key: Some(Bytes::new()),
                    headers: Vec::new(),
                    value: Some(Bytes::from_static(b"x")),
                },
            ],
            origin: Some(BatchOrigin {
                epoch: [7; 8],
                parent_partition: 3,
                slab_start: 40,
                parent_offsets: vec![40, 42, 47],
            }),
        }
    }

    #[test]
    fn a_bucket_crosses_the_wire_unchanged_keys_absent_or_empty_headers_repeated() {
        let request = CommitRequest::from_batch("audit", 2, 5, bucket()).unwrap();
        let decoded = CommitRequest::decode(&request.encode()).unwrap();
        assert_eq!(
            (
                decoded.topic.as_str(),
                decoded.partition,
                decoded.generation
            ),
            ("audit", 2, 5)
        );
        assert_eq!(decoded.into_batch(), bucket());
    }

    /// The request as the build before [`WireBytes`] declared it (bytes as `Vec<u8>`).
    #[derive(Serialize, Deserialize)]
    struct VecBytesRequest {
        topic: String,
        partition: u32,
        generation: u64,
        epoch: [u8; 8],
        parent_partition: u32,
        slab_start: u64,
        records: Vec<VecBytesRecord>,
    }

    #[derive(Serialize, Deserialize)]
    struct VecBytesRecord {
        parent_offset: u64,
        key: Option<Vec<u8>>,
        headers: Vec<(String, Vec<u8>)>,
        value: Vec<u8>,
    }

    #[test]
    fn nodes_with_byte_vectors_and_with_wire_bytes_read_each_others_commits() {
        let request = CommitRequest::from_batch("audit", 2, 5, bucket()).unwrap();
        let as_vectors = VecBytesRequest {
            topic: request.topic.clone(),
            partition: request.partition,
            generation: request.generation,
            epoch: request.epoch,
            parent_partition: request.parent_partition,
            slab_start: request.slab_start,
            records: request
                .records
                .iter()
                .map(|r| VecBytesRecord {
                    parent_offset: r.parent_offset,
                    key: r.key.as_ref().map(|k| k.0.to_vec()),
                    headers: r
                        .headers
                        .iter()
                        .map(|(n, v)| (n.clone(), v.0.to_vec()))
                        .collect(),
                    value: r.value.0.to_vec(),
                })
                .collect(),
        };
        let old = postcard::to_allocvec(&as_vectors).unwrap();
        assert_eq!(
            request.encode(),
            old,
            "the encoding changed: a rolling upgrade breaks"
        );
        let read_by_new = CommitRequest::decode(&old).unwrap();
        assert_eq!(read_by_new.into_batch(), bucket());
        let read_by_old: VecBytesRequest = postcard::from_bytes(&request.encode()).unwrap();
        assert_eq!(read_by_old.records[0].key.as_deref(), Some(&b"k"[..]));
    }

    #[test]
    fn a_batch_without_provenance_is_not_a_child_commit() {
        let plain = AppendBatch {
            records: vec![NewRecord::default()],
            origin: None,
        };
        assert_eq!(CommitRequest::from_batch("t", 0, 1, plain), None);
    }

    #[test]
    fn truncated_oversized_empty_and_over_a_slab_requests_are_refused() {
        let encoded = CommitRequest::from_batch("audit", 2, 5, bucket())
            .unwrap()
            .encode();
        for cut in [0, 1, encoded.len() / 2, encoded.len() - 1] {
            assert!(
                matches!(
                    CommitRequest::decode(&encoded[..cut]),
                    Err(WireError::Malformed(_))
                ),
                "cut at {cut}"
            );
        }
        let huge = vec![0u8; MAX_COMMIT_REQUEST_BYTES + 1];
        assert!(matches!(
            CommitRequest::decode(&huge),
            Err(WireError::TooLarge { .. })
        ));
        let mut empty = CommitRequest::from_batch("audit", 2, 5, bucket()).unwrap();
        empty.records.clear();
        assert!(matches!(
            CommitRequest::decode(&empty.encode()),
            Err(WireError::RecordCount { records: 0 })
        ));
        let mut over = CommitRequest::from_batch("audit", 2, 5, bucket()).unwrap();
        let one = over.records[1].clone();
        over.records = vec![one; MAX_COMMIT_RECORDS + 1];
        assert!(matches!(
            CommitRequest::decode(&over.encode()),
            Err(WireError::RecordCount { .. })
        ));
    }

    #[test]
    fn a_length_claiming_billions_of_records_is_refused_without_allocating_them() {
        // topic "t", partition 0, generation 1, epoch, parent partition 0, slab start 0, then a
        // varint record count of u32::MAX with nothing after it.
        let mut bytes = vec![1, b't', 0, 1];
        bytes.extend([0u8; 8]);
        bytes.extend([0, 0]);
        bytes.extend([0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(
            CommitRequest::decode(&bytes),
            Err(WireError::Malformed(_))
        ));
    }

    /// [`bucket`] with its second record's value (empty there) made null, and a fourth record
    /// with an empty value.
    fn bucket_with_a_null() -> AppendBatch {
        let mut batch = bucket();
        batch.records[1].value = None;
        batch.records.push(NewRecord {
            key: None,
            headers: Vec::new(),
            value: Some(Bytes::new()),
        });
        if let Some(origin) = &mut batch.origin {
            origin.parent_offsets.push(48);
        }
        batch
    }

    #[test]
    fn null_values_cross_the_wire_apart_from_empty_ones_alone_and_in_order() {
        let batch = bucket_with_a_null();
        let request = CommitRequest::from_batch("audit", 2, 5, batch.clone()).unwrap();
        assert_eq!(request.null_values, [1]);
        let decoded = CommitRequest::decode(&request.encode()).unwrap();
        assert_eq!(decoded.into_batch(), batch);
        let mut second = request.clone();
        second.slab_start = 99;
        second.null_values.clear();
        second.records[1].value = WireBytes::default();
        let both = decode_in_order(&encode_in_order(&[request.clone(), second.clone()])).unwrap();
        assert_eq!(both, [request.clone(), second]);
        assert_eq!(both[0].clone().into_batch(), batch);
    }

    #[test]
    fn a_node_of_the_version_before_null_values_reads_their_commits_and_is_read() {
        // The layout before: the same message, nothing after it.
        let request = CommitRequest::from_batch("audit", 2, 5, bucket_with_a_null()).unwrap();
        let encoded = request.encode();
        let old_reader: CommitRequest = postcard::from_bytes(&encoded).unwrap();
        assert!(old_reader.null_values.is_empty());
        assert_eq!(
            old_reader.records, request.records,
            "stored empty, as it always was"
        );
        let old_writer = postcard::to_allocvec(&request).unwrap();
        assert!(old_writer.len() < encoded.len());
        let read = CommitRequest::decode(&old_writer).unwrap();
        assert!(read.null_values.is_empty());
        let in_order: Vec<CommitRequest> =
            postcard::from_bytes(&encode_in_order(std::slice::from_ref(&request))).unwrap();
        assert_eq!(in_order[0].records, request.records);
    }

    #[test]
    fn null_value_indexes_past_the_records_out_of_order_or_on_a_value_are_refused() {
        let request = CommitRequest::from_batch("audit", 2, 5, bucket_with_a_null()).unwrap();
        for bad in [vec![9], vec![1, 1], vec![0]] {
            let mut encoded = postcard::to_allocvec(&request).unwrap();
            encoded.extend(postcard::to_allocvec(&bad).unwrap());
            assert!(
                matches!(
                    CommitRequest::decode(&encoded),
                    Err(WireError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        // Null values for two commits after a call carrying one.
        let mut encoded = postcard::to_allocvec(std::slice::from_ref(&request)).unwrap();
        encoded.extend(postcard::to_allocvec(&vec![vec![1u32]; 2]).unwrap());
        assert!(matches!(
            decode_in_order(&encoded),
            Err(WireError::Malformed(_))
        ));
    }

    #[test]
    fn commits_in_order_cross_the_wire_in_order_and_bad_calls_are_refused() {
        let first = CommitRequest::from_batch("audit", 2, 5, bucket()).unwrap();
        let mut second = first.clone();
        second.slab_start = 99;
        let decoded = decode_in_order(&encode_in_order(&[first.clone(), second.clone()])).unwrap();
        assert_eq!(decoded, [first.clone(), second]);
        // None, or more than one call may carry.
        assert!(matches!(
            decode_in_order(&encode_in_order(&[])),
            Err(WireError::Malformed(_))
        ));
        let too_many = vec![first.clone(); MAX_COMMITS_PER_CALL + 1];
        assert!(matches!(
            decode_in_order(&encode_in_order(&too_many)),
            Err(WireError::Malformed(_))
        ));
        // A commit the single call would refuse is refused here too.
        let mut empty = first.clone();
        empty.records.clear();
        assert!(matches!(
            decode_in_order(&encode_in_order(&[first.clone(), empty])),
            Err(WireError::RecordCount { records: 0 })
        ));
        let huge = vec![0u8; MAX_IN_ORDER_REQUEST_BYTES + 1];
        assert!(matches!(
            decode_in_order(&huge),
            Err(WireError::TooLarge {
                limit: MAX_IN_ORDER_REQUEST_BYTES,
                ..
            })
        ));
        let encoded = encode_in_order(&[first]);
        assert!(matches!(
            decode_in_order(&encoded[..encoded.len() - 1]),
            Err(WireError::Malformed(_))
        ));
        let answers = [
            CommitResponse::Failed { reason: "x".into() },
            CommitResponse::NotOwner {
                owner: None,
                generation: None,
            },
        ];
        assert_eq!(decode_answers(&encode_answers(&answers)).unwrap(), answers);
    }

    #[test]
    fn every_answer_round_trips() {
        for answer in [
            CommitResponse::Committed {
                base_offset: 9,
                appended: 2,
                deduplicated: 1,
                committed_at_ms: 1_700_000_000_000,
            },
            CommitResponse::NotOwner {
                owner: Some("n2".into()),
                generation: Some(4),
            },
            CommitResponse::NotOwner {
                owner: None,
                generation: None,
            },
            CommitResponse::Failed {
                reason: "disk full".into(),
            },
        ] {
            assert_eq!(CommitResponse::decode(&answer.encode()).unwrap(), answer);
        }
    }
}
