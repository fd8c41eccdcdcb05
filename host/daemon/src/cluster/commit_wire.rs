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
///
/// On the wire: the length of the head (`u32`, little-endian), the head ([`FramesHead`],
/// postcard), then each frame's bytes, one after another. The owner reads each frame straight
/// into a buffer of its own size ([`FramesReader`]): the bytes are copied once on the way in,
/// not gathered into one body and copied out again.
#[derive(Debug)]
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
    pub frames: Vec<WireFrame<'a>>,
}

/// One frame of a [`FramesCall`].
#[derive(Debug)]
pub(crate) struct WireFrame<'a> {
    /// The CRC-32C of the frame's body, as the sender computed it while encoding.
    pub body_crc: u32,
    /// The frame, unsealed (`EncodedBatch::frame`).
    pub frame: &'a [u8],
}

/// The head of a frames call: where the frames go, and each frame's length and body CRC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FramesHead {
    /// The child topic.
    pub topic: String,
    /// The child partition.
    pub partition: u32,
    /// The ownership generation the sender saw.
    pub generation: u64,
    /// The sender's parent generation, when it says.
    pub parent_generation: Option<u64>,
    /// Each frame's length in bytes and the CRC-32C of its body, in order.
    pub frames: Vec<(u32, u32)>,
}

/// Longest head a frames call may have: a topic name and two frames' lengths fit many times.
const MAX_FRAMES_HEAD_BYTES: usize = 4 * 1024;

/// The largest body of any call one node makes another: a frames call of the most frames
/// (its head's length, the head, the frames). Other peer calls are smaller.
pub(crate) const MAX_PEER_REQUEST_BYTES: usize =
    4 + MAX_FRAMES_HEAD_BYTES + MAX_IN_ORDER_REQUEST_BYTES;

// The least peers' budget a node accepts holds two of the largest call.
const _: () = assert!(
    2 * MAX_PEER_REQUEST_BYTES as u64 == crate::config::MIN_BUFFERED_PEER_REQUEST_BYTES,
    "config::MIN_BUFFERED_PEER_REQUEST_BYTES must be twice MAX_PEER_REQUEST_BYTES"
);

/// A checked frames call, as the receiver applies it.
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

/// Encodes one frames call (layout on [`FramesCall`]) into one buffer of its exact size.
pub(crate) fn encode_frames(call: &FramesCall<'_>) -> Vec<u8> {
    let head = FramesHead {
        topic: call.topic.to_owned(),
        partition: call.partition,
        generation: call.generation,
        parent_generation: call.parent_generation,
        // A frame is at most MAX_FRAME_BYTES (64 MiB), which fits.
        frames: call
            .frames
            .iter()
            .map(|f| (u32::try_from(f.frame.len()).unwrap_or(u32::MAX), f.body_crc))
            .collect(),
    };
    // Encoding plain data into a Vec cannot fail.
    let head = postcard::to_allocvec(&head).unwrap_or_default();
    let frames: usize = call.frames.iter().map(|f| f.frame.len()).sum();
    let mut out = Vec::with_capacity(4 + head.len() + frames);
    out.extend_from_slice(&u32::try_from(head.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&head);
    for frame in &call.frames {
        out.extend_from_slice(frame.frame);
    }
    out
}

/// Reads a frames call as its bytes arrive, in chunks of any size: the head first, then each
/// frame into a buffer of the length the head gives it. Refuses a head over
/// [`MAX_FRAMES_HEAD_BYTES`], other than 1 to [`MAX_COMMITS_PER_CALL`] frames, frames over
/// [`MAX_IN_ORDER_REQUEST_BYTES`] together, and a body shorter or longer than the head says,
/// before it allocates for them.
#[derive(Debug, Default)]
pub(crate) struct FramesReader {
    /// Bytes of the head's length and the head, until the head is read.
    start: Vec<u8>,
    head: Option<FramesHead>,
    /// The frames read so far, the last one possibly still filling.
    frames: Vec<Vec<u8>>,
}

impl FramesReader {
    /// Takes the next `chunk` of the body.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) -> Result<(), WireError> {
        if self.head.is_none() {
            chunk = self.read_head(chunk)?;
        }
        let Some(head) = &self.head else {
            return Ok(());
        };
        while !chunk.is_empty() {
            // Whether the frame read last still lacks bytes.
            let filling = match self.frames.len().checked_sub(1) {
                Some(last) => self
                    .frames
                    .get(last)
                    .zip(head.frames.get(last))
                    .is_some_and(|(frame, &(len, _))| frame.len() < len as usize),
                None => false,
            };
            if !filling {
                let Some(&(len, _)) = head.frames.get(self.frames.len()) else {
                    return Err(WireError::Malformed(
                        "bytes after the last frame the head names".to_owned(),
                    ));
                };
                // The head's lengths are bounded together (read_head): one buffer of the
                // frame's size, filled without a copy to grow it.
                self.frames.push(Vec::with_capacity(len as usize));
            }
            let at = self.frames.len() - 1;
            let (Some(frame), Some(&(len, _))) = (self.frames.last_mut(), head.frames.get(at))
            else {
                break;
            };
            let take = (len as usize - frame.len()).min(chunk.len());
            frame.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
        }
        Ok(())
    }

    /// Reads the head's length and the head from the start of `chunk`, returning what is left
    /// of it (empty while the head is still incomplete).
    fn read_head<'c>(&mut self, mut rest: &'c [u8]) -> Result<&'c [u8], WireError> {
        loop {
            let wanted = match self.start.get(..4) {
                Some(len) => {
                    let head_len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                    if head_len == 0 || head_len > MAX_FRAMES_HEAD_BYTES {
                        return Err(WireError::Malformed(format!(
                            "a frames call's head of {head_len} bytes (1 to \
                             {MAX_FRAMES_HEAD_BYTES})"
                        )));
                    }
                    4 + head_len
                }
                None => 4,
            };
            if wanted > 4 && self.start.len() == wanted {
                break;
            }
            if rest.is_empty() {
                return Ok(rest);
            }
            let take = (wanted - self.start.len()).min(rest.len());
            self.start.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        let head: FramesHead = postcard::from_bytes(&self.start[4..])
            .map_err(|e| WireError::Malformed(e.to_string()))?;
        if head.frames.is_empty() || head.frames.len() > MAX_COMMITS_PER_CALL {
            return Err(WireError::Malformed(format!(
                "{} frames in one call (1 to {MAX_COMMITS_PER_CALL})",
                head.frames.len()
            )));
        }
        let total: usize = head.frames.iter().map(|&(len, _)| len as usize).sum();
        if total > MAX_IN_ORDER_REQUEST_BYTES {
            return Err(WireError::TooLarge {
                bytes: total,
                limit: MAX_IN_ORDER_REQUEST_BYTES,
            });
        }
        if let Some(i) = head.frames.iter().position(|&(len, _)| len == 0) {
            return Err(WireError::Malformed(format!("frame {i} is empty")));
        }
        self.head = Some(head);
        Ok(rest)
    }

    /// The call, once the body has ended: every frame checked
    /// ([`EncodedBatch::from_unsealed`]: whole, its body the CRC the head gives, provenance
    /// present, 1 to [`MAX_COMMIT_RECORDS`] records). Reads every byte: blocking-pool work.
    pub(crate) fn finish(self) -> Result<FrameCommits, WireError> {
        let Some(head) = self.head else {
            return Err(WireError::Malformed(
                "the body ended inside the frames call's head".to_owned(),
            ));
        };
        let whole = self.frames.len() == head.frames.len()
            && self
                .frames
                .iter()
                .zip(&head.frames)
                .all(|(frame, &(len, _))| frame.len() == len as usize);
        if !whole {
            return Err(WireError::Malformed(
                "the body ended before the last frame the head names".to_owned(),
            ));
        }
        let mut frames = Vec::with_capacity(self.frames.len());
        for (i, (bytes, &(_, body_crc))) in self.frames.into_iter().zip(&head.frames).enumerate() {
            let (frame, origin) = EncodedBatch::from_unsealed(bytes, body_crc)
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
            topic: head.topic,
            partition: head.partition,
            generation: head.generation,
            parent_generation: head.parent_generation,
            frames,
        })
    }
}

/// Decodes and checks a whole frames call ([`FramesReader`]).
#[cfg(test)]
pub(crate) fn decode_frames(bytes: &[u8]) -> Result<FrameCommits, WireError> {
    let mut reader = FramesReader::default();
    reader.feed(bytes)?;
    reader.finish()
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

    /// A frames call carrying `frames` (each encoded from [`bucket`] with parent offsets
    /// from `first`), and its head.
    fn frames_call(firsts: &[u64]) -> Vec<u8> {
        let encoded: Vec<EncodedBatch> = firsts
            .iter()
            .map(|&first| {
                let mut batch = bucket();
                if let Some(origin) = batch.origin.as_mut() {
                    origin.parent_offsets = vec![first, first + 1, first + 2];
                    origin.slab_start = first;
                }
                EncodedBatch::encode(&batch.records, batch.origin.as_ref()).unwrap()
            })
            .collect();
        encode_frames(&FramesCall {
            topic: "audit",
            partition: 2,
            generation: 5,
            parent_generation: Some(9),
            frames: encoded
                .iter()
                .map(|e| WireFrame {
                    body_crc: e.body_crc(),
                    frame: e.frame(),
                })
                .collect(),
        })
    }

    #[test]
    fn a_frames_call_read_in_chunks_of_any_size_gives_the_frames_sent() {
        let body = frames_call(&[40, 50]);
        let whole = decode_frames(&body).unwrap();
        assert_eq!(
            (
                whole.topic.as_str(),
                whole.partition,
                whole.generation,
                whole.parent_generation
            ),
            ("audit", 2, 5, Some(9))
        );
        assert_eq!(whole.frames.len(), 2);
        assert_eq!(whole.frames[1].1.parent_offsets, [50, 51, 52]);
        assert_eq!(
            whole.frames[0].0.decode().unwrap().records,
            bucket().records
        );
        for size in 1..body.len() {
            let mut reader = FramesReader::default();
            for chunk in body.chunks(size) {
                reader.feed(chunk).unwrap();
            }
            let read = reader.finish().unwrap();
            let frames =
                |c: &FrameCommits| c.frames.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>();
            assert_eq!(frames(&read), frames(&whole), "chunks of {size}");
        }
    }

    #[test]
    fn frames_calls_that_break_a_bound_are_refused_before_their_frames_are_read() {
        let body = frames_call(&[40]);
        // Cut anywhere: the body ended early.
        for cut in [0, 2, 4, 10, body.len() - 1] {
            assert!(
                matches!(decode_frames(&body[..cut]), Err(WireError::Malformed(_))),
                "cut at {cut}"
            );
        }
        // A byte after the last frame.
        let mut longer = body.clone();
        longer.push(0);
        assert!(matches!(
            decode_frames(&longer),
            Err(WireError::Malformed(_))
        ));
        // Three frames, and a head naming none.
        assert!(matches!(
            decode_frames(&frames_call(&[1, 10, 20])),
            Err(WireError::Malformed(_))
        ));
        let head = |frames: Vec<(u32, u32)>| {
            let head = postcard::to_allocvec(&FramesHead {
                topic: "audit".to_owned(),
                partition: 2,
                generation: 5,
                parent_generation: None,
                frames,
            })
            .unwrap();
            let mut out = (head.len() as u32).to_le_bytes().to_vec();
            out.extend(head);
            out
        };
        assert!(matches!(
            FramesReader::default().feed(&head(Vec::new())),
            Err(WireError::Malformed(_))
        ));
        // Frames declared larger than a call may carry: refused from the head alone.
        assert!(matches!(
            FramesReader::default().feed(&head(vec![(u32::MAX, 0), (u32::MAX, 0)])),
            Err(WireError::TooLarge { .. })
        ));
        // A head longer than any head may be.
        let mut huge = ((MAX_FRAMES_HEAD_BYTES + 1) as u32).to_le_bytes().to_vec();
        huge.extend(vec![0u8; 16]);
        assert!(matches!(
            FramesReader::default().feed(&huge),
            Err(WireError::Malformed(_))
        ));
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
