//! The values that cross the crate boundary: records in and out, read options and results,
//! per-partition configuration and statistics.

use bytes::Bytes;

/// Default segment size: 128 MiB, a common log-segment size that keeps the number of open
/// files per partition small while letting retention free space in useful steps.
pub const DEFAULT_SEGMENT_BYTES: u64 = 128 * 1024 * 1024;

/// One record header: a name and opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Header name (UTF-8).
    pub name: String,
    /// Header value.
    pub value: Bytes,
}

/// A record's payload size as limits and metrics count it: key, value, and every header's name
/// and value (framing excluded).
fn payload_bytes(key: Option<&Bytes>, value: Option<&Bytes>, headers: &[Header]) -> usize {
    key.map_or(0, Bytes::len)
        + value.map_or(0, Bytes::len)
        + headers
            .iter()
            .map(|h| h.name.len() + h.value.len())
            .sum::<usize>()
}

impl NewRecord {
    /// Payload bytes: key + value + header names and values (what record-size limits count).
    pub fn payload_bytes(&self) -> usize {
        payload_bytes(self.key.as_ref(), self.value.as_ref(), &self.headers)
    }
}

/// A record to append. `key: None` (absent) is stored differently from `Some(empty)`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NewRecord {
    /// Optional key.
    pub key: Option<Bytes>,
    /// Headers in order; names may repeat.
    pub headers: Vec<Header>,
    /// The value; `None` is null (a Kafka tombstone), stored differently from `Some(empty)`.
    pub value: Option<Bytes>,
}

/// Provenance of a child commit batch: the attach epoch and the parent partition and offset of
/// every record. Produce passes `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchOrigin {
    /// The link's attach epoch.
    pub epoch: [u8; 8],
    /// Index of the parent partition the records were copied from.
    pub parent_partition: u32,
    /// First parent offset of the first slab of the commit the batch belongs to (a cursor
    /// commits a few consecutive slabs together): a cursor that lost its offset file restarts
    /// there, repeating at most that commit.
    pub slab_start: u64,
    /// One parent offset per record, in record order.
    pub parent_offsets: Vec<u64>,
}

/// Who wrote a batch, as an idempotent Kafka producer numbers it: kept in the batch's frame so
/// a restarted daemon can still tell a producer's retry from a new batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerStamp {
    /// The producer id (from InitProducerId).
    pub producer_id: i64,
    /// The producer's epoch.
    pub epoch: i16,
    /// Sequence number of the batch's first record.
    pub base_sequence: i32,
}

/// A batch stamped with its producer, found in a partition's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StampedBatch {
    /// Its producer stamp.
    pub stamp: ProducerStamp,
    /// Offset of its first record.
    pub base_offset: u64,
    /// Its record count.
    pub record_count: u32,
    /// Its commit time, ms since the epoch.
    pub committed_at_ms: i64,
}

/// A batch of records appended and committed at once (one frame, one `fdatasync`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AppendBatch {
    /// The records, at least one.
    pub records: Vec<NewRecord>,
    /// Provenance for child commits.
    pub origin: Option<BatchOrigin>,
}

/// A batch encoded once into its frame, ready for [`crate::Store::append_encoded`]. A failed
/// append leaves it as it was, so a retry appends the same frame again (resealed with its new
/// offset and commit time), never encoding or copying the records again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedBatch {
    pub(crate) frame: Vec<u8>,
    pub(crate) body_crc: u32,
    pub(crate) count: u32,
}

impl EncodedBatch {
    /// Encodes `records` (at least one) with their provenance: records read from a partition
    /// ([`StoredRecord`], or references to them) encode straight from their bytes. Refuses an
    /// empty batch, an origin without one parent offset per record, and a frame above the
    /// frame limit, as [`crate::Store::append`] does.
    pub fn encode<R: crate::log::format::RecordParts>(
        records: &[R],
        origin: Option<&BatchOrigin>,
    ) -> crate::Result<EncodedBatch> {
        Self::encode_frame(records, origin, None)
    }

    /// Encodes `records` (at least one) written by an idempotent producer, stamped with it
    /// ([`crate::Store::producer_batches`] finds the stamp again); refused as
    /// [`EncodedBatch::encode`] refuses.
    pub fn encode_stamped<R: crate::log::format::RecordParts>(
        records: &[R],
        stamp: ProducerStamp,
    ) -> crate::Result<EncodedBatch> {
        Self::encode_frame(records, None, Some(&stamp))
    }

    fn encode_frame<R: crate::log::format::RecordParts>(
        records: &[R],
        origin: Option<&BatchOrigin>,
        stamp: Option<&ProducerStamp>,
    ) -> crate::Result<EncodedBatch> {
        let mut frame = Vec::new();
        let body_crc =
            crate::log::format::encode_stamped_batch(records, origin, stamp, &mut frame)?;
        // encode_batch checked the count fits in u32.
        let count = u32::try_from(records.len()).unwrap_or(u32::MAX);
        Ok(EncodedBatch {
            frame,
            body_crc,
            count,
        })
    }

    /// Rewrites the batch in the frame layout builds from before null values and producer
    /// stamps read (null values empty, no stamp), if it uses either; unchanged otherwise.
    pub fn to_original_layout(&mut self) -> crate::Result<()> {
        if !crate::log::format::uses_newer_flags(&self.frame) {
            return Ok(());
        }
        let mut decoded = self.decode().map_err(|e| {
            crate::StorageError::io(
                "rewriting a batch in the original frame layout",
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        for record in &mut decoded.records {
            record.value.get_or_insert_with(Bytes::new);
        }
        *self = EncodedBatch::encode(&decoded.records, decoded.origin.as_ref())?;
        Ok(())
    }

    /// Number of records in the batch.
    pub fn record_count(&self) -> u32 {
        self.count
    }

    /// Size of the encoded frame in bytes.
    pub fn frame_len(&self) -> usize {
        self.frame.len()
    }

    /// The records and provenance this batch was encoded from, decoded back out of its frame
    /// (keys, values and header values are slices of one copy of the frame): what a caller
    /// that encoded a batch for a local append uses to send it elsewhere instead, such as a
    /// child commit to the node owning the partition. `origin` keeps one parent offset per
    /// record. Fails only for a frame that does not decode, which an `EncodedBatch` made by
    /// [`EncodedBatch::encode`] never is.
    pub fn decode(&self) -> Result<AppendBatch, crate::log::format::FrameError> {
        crate::log::format::decode_unsealed(&Bytes::copy_from_slice(&self.frame))
    }

    /// The encoded frame (layout in `docs/storage.md`). Its offset, commit time and CRC are
    /// placeholders until an append seals them, so a receiver must not check the CRC.
    pub fn frame(&self) -> &[u8] {
        &self.frame
    }

    /// The CRC-32C of the frame's body (every byte after the header), which an append combines
    /// with the header's when it seals the frame; what a receiver of [`EncodedBatch::frame`]
    /// checks the bytes it got against ([`EncodedBatch::from_unsealed`]).
    pub fn body_crc(&self) -> u32 {
        self.body_crc
    }

    /// A frame another process encoded with [`EncodedBatch::encode`] and sent unsealed, with
    /// the `body_crc` it computed: checked as a read checks a stored frame (header, every
    /// record, nothing left over, the body's CRC against `body_crc`) without building any
    /// record, so that it can be appended as it came. A frame with a producer stamp is refused:
    /// [`EncodedBatch::encode`] never makes one, and a stamp would feed the idempotent-producer
    /// scan ([`crate::Store::producer_batches`]). Returns the batch and its origin, if it
    /// has one. A frame is never longer than [`crate::log::format::MAX_FRAME_BYTES`], so its
    /// record count bounds what the check allocates.
    pub fn from_unsealed(
        frame: Vec<u8>,
        body_crc: u32,
    ) -> Result<(EncodedBatch, Option<BatchOrigin>), crate::log::format::FrameError> {
        use crate::log::format::{
            FLAG_PRODUCER, FrameError, HEADER_LEN, index_frame, parse_header,
        };
        let header = parse_header(&frame)?;
        if header.flags & FLAG_PRODUCER != 0 {
            return Err(FrameError::BadHeader(
                "a producer stamp, which a frame sent unsealed (a child commit) never carries",
            ));
        }
        let computed = crc32c::crc32c(frame.get(HEADER_LEN..).unwrap_or_default());
        if computed != body_crc {
            return Err(FrameError::CrcMismatch {
                stored: body_crc,
                computed,
            });
        }
        let frame = Bytes::from(frame);
        let index = index_frame(&header, &frame)?;
        let origin = index.into_origin();
        Ok((
            EncodedBatch {
                // `Bytes` made from a `Vec` gives it back without a copy.
                frame: Vec::from(frame),
                body_crc,
                count: header.record_count,
            },
            origin,
        ))
    }
}

/// What a successful (durable, verified) append assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Offset of the first record; the others follow contiguously.
    pub base_offset: u64,
    /// Number of records appended.
    pub count: u32,
    /// The batch's commit time, ms since the epoch; never lower than any earlier commit time
    /// of the partition.
    pub committed_at_ms: i64,
}

/// Provenance of one stored record (from its batch's [`BatchOrigin`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordOrigin {
    /// The link's attach epoch.
    pub epoch: [u8; 8],
    /// Parent partition index.
    pub parent_partition: u32,
    /// Offset of the record in the parent partition.
    pub parent_offset: u64,
    /// First parent offset of the first slab of the commit the record was copied in.
    pub slab_start: u64,
}

/// A record as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    /// Offset in the partition.
    pub offset: u64,
    /// Commit time of its batch, ms since the epoch.
    pub committed_at_ms: i64,
    /// Optional key (absent differs from empty).
    pub key: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<Header>,
    /// The value; `None` is null (differs from empty).
    pub value: Option<Bytes>,
    /// Provenance, for records committed by a fan-out cursor.
    pub origin: Option<RecordOrigin>,
}

/// What to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// First offset wanted.
    pub offset: u64,
    /// Maximum number of records (at least one is returned when available).
    pub max_records: usize,
    /// Maximum total encoded record bytes (at least one record is returned even if it alone
    /// exceeds this, so a reader always progresses).
    pub max_bytes: usize,
    /// Delay gate: stop at the first record with `committed_at_ms` greater than this.
    pub max_committed_at_ms: Option<i64>,
}

/// Why a gated read stopped: the first record not due yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotDue {
    /// Offset of the first record not due.
    pub offset: u64,
    /// Its commit time: the gate must reach this for the record to be due.
    pub due_at_ms: i64,
}

/// The answer to a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadResult {
    /// Records in offset order.
    pub records: Vec<StoredRecord>,
    /// Offset after the last returned record (the requested offset if none).
    pub next_offset: u64,
    /// Next offset to be assigned: one past the last durable record.
    pub high_watermark: u64,
    /// Oldest offset still stored.
    pub log_start_offset: u64,
    /// Set when `max_committed_at_ms` stopped the read.
    pub not_due: Option<NotDue>,
}

/// Per-partition log settings (kept in memory; the daemon supplies them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Size at which the active segment is rolled (default [`DEFAULT_SEGMENT_BYTES`]).
    pub segment_bytes: u64,
    /// Delete segments whose newest record is older than this; `None` keeps them forever.
    pub retention_ms: Option<u64>,
    /// Delete the oldest segments while the partition is larger than this; `None` = no cap.
    pub retention_bytes: Option<u64>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            retention_ms: None,
            retention_bytes: None,
        }
    }
}

/// Whether a partition's log is open, and whether it is usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionState {
    /// Open: files held, index in memory.
    Open,
    /// Closed (idle or never opened since start); reopens on the next read or append.
    Closed,
    /// Damaged where acknowledged records live; reads and appends fail until repaired.
    Quarantined {
        /// What was found, naming the file and byte position.
        reason: crate::Damage,
    },
    /// Stopped after a write or sync error it could not undo; its first use after
    /// `StoreOptions::failed_reopen_after` (or a restart) runs recovery and reopens it.
    Failed {
        /// The errors that stopped it.
        reason: crate::Failure,
    },
    /// Sealed for a move to another node: closed, refusing appends here (reads go on) until
    /// the move ends or is cancelled.
    Sealed,
}

impl StoredRecord {
    /// Payload bytes, counted as [`NewRecord::payload_bytes`] counts them.
    pub fn payload_bytes(&self) -> usize {
        payload_bytes(self.key.as_ref(), self.value.as_ref(), &self.headers)
    }
}

/// A partition's figures as `Store::peek` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionStats {
    /// Oldest offset still stored.
    pub log_start_offset: u64,
    /// Next offset to be assigned. `None` when the log is closed and its high-watermark file
    /// holds no boundary over the record bytes (after a crash, until opened and closed again).
    pub high_watermark: Option<u64>,
    /// Total size of the segment files in bytes.
    pub size_bytes: u64,
    /// Number of segment files.
    pub segment_count: u32,
    /// Open, closed, quarantined or failed.
    pub state: PartitionState,
    /// What recovery cut off this partition's torn tails and kept aside in its `torn/`
    /// directory, while those files are there; `None` when nothing is kept aside.
    pub recovered_cut: Option<RecoveredCut>,
}

/// A summary of the torn tails recovery cut off a partition and kept aside (one note and one
/// copy of the bytes per cut in the partition's `torn/` directory). It survives restarts and
/// goes away when the operator removes those files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredCut {
    /// Number of cuts kept aside.
    pub cuts: u32,
    /// Records in the cut bytes, summed over the cuts: each cut counts the records its frame
    /// headers name. The records may have been acknowledged (when no high-watermark file
    /// covered them, recovery could not tell); they are no longer readable.
    pub records: u64,
    /// False when some cut held bytes no frame header accounted for: `records` is then only a
    /// lower bound.
    pub records_exact: bool,
    /// Bytes cut, summed over the cuts.
    pub bytes: u64,
    /// First offset the latest cut removed: the log went on from this offset, so records
    /// written after the cut reuse it.
    pub from_offset: u64,
    /// When the latest cut was made, ms since the epoch.
    pub at_ms: i64,
    /// The kept-aside copy of the latest cut's bytes.
    pub kept_at: std::path::PathBuf,
}

/// What `Store::enforce_retention` deleted.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RetentionReport {
    /// Segment files deleted.
    pub segments_deleted: u64,
    /// Bytes freed.
    pub bytes_deleted: u64,
    /// Partitions whose log start offset moved, with the new log start offset.
    pub advanced: Vec<(crate::PartitionId, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::format::{FrameError, HEADER_LEN};

    fn batch() -> (Vec<NewRecord>, BatchOrigin) {
        let records = vec![
            NewRecord {
                key: Some(Bytes::from_static(b"k")),
                headers: vec![Header {
                    name: "h".into(),
                    value: Bytes::from_static(b"1"),
                }],
                value: Some(Bytes::from_static(b"v\x00\xff")),
            },
            NewRecord {
                key: None,
                headers: Vec::new(),
                value: None,
            },
        ];
        let origin = BatchOrigin {
            epoch: [7; 8],
            parent_partition: 3,
            slab_start: 40,
            parent_offsets: vec![40, 47],
        };
        (records, origin)
    }

    #[test]
    fn a_frame_sent_unsealed_is_taken_back_as_it_was_encoded_with_its_origin() {
        let (records, origin) = batch();
        let sent = EncodedBatch::encode(&records, Some(&origin)).unwrap();
        let (got, got_origin) =
            EncodedBatch::from_unsealed(sent.frame().to_vec(), sent.body_crc()).unwrap();
        assert_eq!(got, sent);
        assert_eq!(got_origin.as_ref(), Some(&origin));
        assert_eq!(
            got.decode().unwrap(),
            AppendBatch {
                records,
                origin: Some(origin)
            }
        );
    }

    #[test]
    fn a_frame_changed_on_the_way_or_malformed_is_refused() {
        let (records, origin) = batch();
        let sent = EncodedBatch::encode(&records, Some(&origin)).unwrap();
        // A value byte flipped in flight: the body no longer has the sender's CRC.
        let mut flipped = sent.frame().to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x01;
        assert!(matches!(
            EncodedBatch::from_unsealed(flipped, sent.body_crc()),
            Err(FrameError::CrcMismatch { .. })
        ));
        // Cut short, or with a byte too many.
        let frame = sent.frame();
        let cut = frame[..frame.len() - 1].to_vec();
        let crc = crc32c::crc32c(&cut[HEADER_LEN..]);
        assert!(EncodedBatch::from_unsealed(cut, crc).is_err());
        let mut longer = frame.to_vec();
        longer.push(0);
        let crc = crc32c::crc32c(&longer[HEADER_LEN..]);
        assert!(EncodedBatch::from_unsealed(longer, crc).is_err());
        // A body that does not parse, sent with its own CRC: the record's key length now runs
        // past the frame.
        let mut garbled = frame.to_vec();
        // The first record follows the origin section (epoch 8, parent partition 4, slab
        // start 8, first parent offset 8, one varint delta): its attributes, then the key's
        // length.
        let key_len_at = HEADER_LEN + 8 + 4 + 8 + 8 + 1 + 1;
        assert_eq!(garbled[key_len_at], 1, "the key's length");
        garbled[key_len_at] = 0x7f;
        let crc = crc32c::crc32c(&garbled[HEADER_LEN..]);
        assert!(matches!(
            EncodedBatch::from_unsealed(garbled, crc),
            Err(FrameError::Malformed(_) | FrameError::Short { .. })
        ));
    }

    #[test]
    fn a_frame_sent_unsealed_with_a_producer_stamp_is_refused() {
        // A child commit never carries one; a stamp would feed the idempotent-producer scan.
        let (records, origin) = batch();
        let stamp = ProducerStamp {
            producer_id: 9,
            epoch: 1,
            base_sequence: 0,
        };
        let sent = EncodedBatch::encode_frame(&records, Some(&origin), Some(&stamp)).unwrap();
        assert!(matches!(
            EncodedBatch::from_unsealed(sent.frame().to_vec(), sent.body_crc()),
            Err(FrameError::BadHeader(why)) if why.contains("producer stamp")
        ));
        let sent = EncodedBatch::encode_stamped(&records, stamp).unwrap();
        assert!(EncodedBatch::from_unsealed(sent.frame().to_vec(), sent.body_crc()).is_err());
    }
}
