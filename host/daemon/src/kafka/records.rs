//! Kafka's v2 record batches in and out.
//!
//! In: the `kafka-protocol` crate checks a produced batch's header and CRC
//! (`RecordBatchDecoder::decode_batch_info`); the records section is decompressed with a cap
//! ([`super::compression`]) and read here, so that every count taken from the wire is checked
//! against the bytes actually there before anything is allocated for it, and so that a record
//! keeps repeated header names (the crate's record type keeps one value per name).
//!
//! Out: fetched records become one uncompressed batch per commit time, marked
//! `LogAppendTime`: a client then reads each record's timestamp as its commit time (the
//! time the delay gate uses). A child record gets the [`ORIGIN_HEADER`] header last.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::records::RecordBatchDecoder;
use narad_storage::{Header, NewRecord, StoredRecord};

use super::ORIGIN_HEADER;
use super::compression::{self, Codec};

/// Bytes of a v2 batch header, up to and including the record count.
const BATCH_HEADER_BYTES: usize = 61;
/// Offset of the magic byte in a batch.
const MAGIC_AT: usize = 16;
/// Offset of the attributes, where the CRC-covered part starts.
const ATTRIBUTES_AT: usize = 21;
/// Offset of the last offset delta (the batch's record count less one).
const LAST_OFFSET_DELTA_AT: usize = 23;
/// Offset of the CRC.
const CRC_AT: usize = 17;
/// Attribute bits of a transactional batch and of a control batch.
const TRANSACTIONAL_BIT: i16 = 1 << 4;
/// See [`TRANSACTIONAL_BIT`].
const CONTROL_BIT: i16 = 1 << 5;
/// Attribute bit saying the timestamps are log-append times.
const LOG_APPEND_TIME_BIT: i16 = 1 << 3;

/// A produced batch, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducedBatch {
    /// The idempotent producer's id, -1 for a plain producer.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// Sequence of the first record, -1 for a plain producer.
    pub(crate) base_sequence: i32,
    /// The records, in batch order.
    pub records: Vec<NewRecord>,
    /// Bytes the records section decompressed to (0 for an uncompressed batch, whose records
    /// are slices of the request's own bytes).
    pub(crate) decompressed_bytes: usize,
}

/// Bounds a produced batch must keep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLimits {
    /// Most records (`max-batch-records`).
    pub max_records: usize,
    /// Largest record, key + value + headers (`max-record-bytes`).
    pub max_record_bytes: usize,
    /// Most bytes the records section may decompress to (what is left of the request's
    /// `max-request-bytes` of decompressed records).
    pub(crate) max_decompressed_bytes: usize,
}

/// Why a produced batch was refused, each with the Kafka error it answers.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum BatchError {
    /// Bytes that are not a well-formed batch (CORRUPT_MESSAGE).
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// A well-formed batch narad does not take (INVALID_RECORD).
    #[error("invalid record batch: {0}")]
    Invalid(String),
    /// A record format older than v2 (UNSUPPORTED_FOR_MESSAGE_FORMAT).
    #[error("record format v{0} is not supported; v2 (Kafka 0.11+) is")]
    OldFormat(i8),
    /// More records than `max-batch-records` (RECORD_LIST_TOO_LARGE).
    #[error("{count} records in one batch; the limit is {limit} (max-batch-records)")]
    TooManyRecords {
        /// Records in the batch.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A record over `max-record-bytes`, or records decompressing past the cap
    /// (MESSAGE_TOO_LARGE).
    #[error("{0}")]
    TooLarge(String),
}

impl BatchError {
    /// The Kafka error this answers with.
    pub(crate) fn error(&self) -> kafka_protocol::error::ResponseError {
        use kafka_protocol::error::ResponseError as E;
        match self {
            BatchError::Corrupt(_) => E::CorruptMessage,
            BatchError::Invalid(_) => E::InvalidRecord,
            BatchError::OldFormat(_) => E::UnsupportedForMessageFormat,
            BatchError::TooManyRecords { .. } => E::RecordListTooLarge,
            BatchError::TooLarge(_) => E::MessageTooLarge,
        }
    }
}

/// Whether decoding `data` costs no more than reading its bytes once: a batch whose
/// attributes name no compression (or too short to have attributes, refused at once). A
/// compressed batch may expand many times over, so only such batches leave the async workers.
pub(crate) fn decodes_in_place(data: &[u8]) -> bool {
    data.get(ATTRIBUTES_AT..ATTRIBUTES_AT + 2).is_none_or(|a| {
        matches!(
            Codec::from_attributes(i16::from_be_bytes([a[0], a[1]])),
            Some(Codec::None)
        )
    })
}

/// Decodes the one batch a produce carries for a partition (Produce 3+ allows exactly one).
pub(crate) fn decode_produced(
    data: Bytes,
    limits: &BatchLimits,
) -> Result<ProducedBatch, BatchError> {
    let corrupt = |what: &str| BatchError::Corrupt(what.to_owned());
    if data.len() < BATCH_HEADER_BYTES {
        return Err(corrupt("shorter than a batch header"));
    }
    let magic = data[MAGIC_AT] as i8;
    if magic != 2 {
        return Err(BatchError::OldFormat(magic));
    }
    let batch_length = i32::from_be_bytes([data[8], data[9], data[10], data[11]]);
    let total = usize::try_from(batch_length)
        .ok()
        .and_then(|n| n.checked_add(12))
        .ok_or_else(|| corrupt("negative batch length"))?;
    if total < BATCH_HEADER_BYTES || total > data.len() {
        return Err(corrupt("batch length does not match the bytes sent"));
    }
    if total != data.len() {
        return Err(BatchError::Invalid(
            "more than one record batch for a partition (Produce 3+ carries exactly one)".into(),
        ));
    }
    let infos = RecordBatchDecoder::decode_batch_info(&mut data.clone())
        .map_err(|e| BatchError::Corrupt(e.to_string()))?;
    let [info] = infos.as_slice() else {
        return Err(corrupt("not one record batch"));
    };
    let attributes = i16::from_be_bytes([data[ATTRIBUTES_AT], data[ATTRIBUTES_AT + 1]]);
    if attributes & (TRANSACTIONAL_BIT | CONTROL_BIT) != 0 {
        return Err(BatchError::Invalid(
            "transactional and control batches are not supported".into(),
        ));
    }
    let codec =
        Codec::from_attributes(attributes).ok_or_else(|| corrupt("unknown compression codec"))?;
    let count = usize::try_from(info.record_count).map_err(|_| corrupt("negative record count"))?;
    if count == 0 {
        return Err(BatchError::Invalid("a batch without records".into()));
    }
    if count > limits.max_records {
        return Err(BatchError::TooManyRecords {
            count,
            limit: limits.max_records,
        });
    }
    let section = data.slice(BATCH_HEADER_BYTES..total);
    let compressed = !matches!(codec, Codec::None);
    // The cap is on what decompression makes; uncompressed records are the request's bytes.
    let cap = if compressed {
        limits.max_decompressed_bytes
    } else {
        usize::MAX
    };
    let mut body = compression::decompress(codec, section, cap).map_err(|e| match e {
        compression::DecompressError::TooLarge { .. } => BatchError::TooLarge(e.to_string()),
        other => BatchError::Corrupt(other.to_string()),
    })?;
    let decompressed_bytes = if compressed { body.len() } else { 0 };
    // Every record takes at least one byte: more claimed than bytes left is a lie.
    if count > body.len() {
        return Err(corrupt("more records claimed than bytes present"));
    }
    // As Kafka checks: the batch's last offset delta names its last record.
    let last_offset_delta = i32::from_be_bytes([
        data[LAST_OFFSET_DELTA_AT],
        data[LAST_OFFSET_DELTA_AT + 1],
        data[LAST_OFFSET_DELTA_AT + 2],
        data[LAST_OFFSET_DELTA_AT + 3],
    ]);
    if i64::from(last_offset_delta) != i64::from(info.record_count) - 1 {
        return Err(BatchError::Invalid(format!(
            "last offset delta {last_offset_delta} does not match the batch's {count} records"
        )));
    }
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let (record, offset_delta) = decode_record(&mut body).map_err(|e| match e {
            RecordError::Corrupt(what) => BatchError::Corrupt(format!("record {i}: {what}")),
            RecordError::Invalid(what) => BatchError::Invalid(format!("record {i}: {what}")),
        })?;
        if usize::try_from(offset_delta).ok() != Some(i) {
            return Err(BatchError::Invalid(format!(
                "record {i} has offset delta {offset_delta}; a batch's records are numbered \
                 0, 1, 2, ... in order"
            )));
        }
        let size = record.payload_bytes();
        if size > limits.max_record_bytes {
            return Err(BatchError::TooLarge(format!(
                "record {i} is {size} bytes (key + value + headers); the limit is {} \
                 (max-record-bytes)",
                limits.max_record_bytes
            )));
        }
        records.push(record);
    }
    if !body.is_empty() {
        return Err(corrupt("bytes after the last record"));
    }
    Ok(ProducedBatch {
        producer_id: info.producer_id,
        producer_epoch: info.producer_epoch,
        base_sequence: info.base_sequence,
        records,
        decompressed_bytes,
    })
}

enum RecordError {
    Corrupt(String),
    Invalid(String),
}

/// A length or count from the wire: -1 is null, below that is corrupt, above the bytes left
/// is corrupt.
fn length(buf: &mut Bytes, what: &str) -> Result<Option<usize>, RecordError> {
    let n = get_varint(buf).ok_or_else(|| RecordError::Corrupt(format!("truncated {what}")))?;
    match n {
        -1 => Ok(None),
        n if n < -1 => Err(RecordError::Corrupt(format!("negative {what}"))),
        n => {
            let n = n as usize;
            if n > buf.len() {
                return Err(RecordError::Corrupt(format!("{what} past the end")));
            }
            Ok(Some(n))
        }
    }
}

/// One record and the offset delta it states.
fn decode_record(buf: &mut Bytes) -> Result<(NewRecord, i32), RecordError> {
    let corrupt = |what: &str| RecordError::Corrupt(what.to_owned());
    let len = length(buf, "record length")?.ok_or_else(|| corrupt("null record length"))?;
    let mut rec = buf.split_to(len);
    if rec.is_empty() {
        return Err(corrupt("empty record"));
    }
    let _attributes = rec.split_to(1);
    let _timestamp_delta = get_varlong(&mut rec).ok_or_else(|| corrupt("truncated timestamp"))?;
    let offset_delta = get_varint(&mut rec).ok_or_else(|| corrupt("truncated offset delta"))?;
    let key = length(&mut rec, "key length")?.map(|n| rec.split_to(n));
    // A null value (a tombstone) stays null.
    let value = length(&mut rec, "value length")?.map(|n| rec.split_to(n));
    let headers = length(&mut rec, "header count")?.unwrap_or(0);
    let mut out = Vec::with_capacity(headers);
    for _ in 0..headers {
        let name_len =
            length(&mut rec, "header name length")?.ok_or_else(|| corrupt("null header name"))?;
        let name = String::from_utf8(rec.split_to(name_len).to_vec())
            .map_err(|_| RecordError::Invalid("header name is not UTF-8".into()))?;
        if crate::produce::is_reserved_header(&name) {
            return Err(RecordError::Invalid(format!(
                "header {name:?} is reserved: names starting with {:?} are narad's own (a \
                 copy's origin), never a producer's",
                crate::produce::RESERVED_HEADER_PREFIX
            )));
        }
        // A null header value is stored as an empty one.
        let value =
            length(&mut rec, "header value length")?.map_or_else(Bytes::new, |n| rec.split_to(n));
        out.push(Header { name, value });
    }
    if !rec.is_empty() {
        return Err(corrupt("bytes after the record's headers"));
    }
    Ok((
        NewRecord {
            key,
            headers: out,
            value,
        },
        offset_delta,
    ))
}

/// Appends `records` (consecutive offsets of one partition) to `out` as v2 batches, one per
/// run of equal commit times.
pub(crate) fn encode_fetched(records: &[StoredRecord], out: &mut BytesMut) {
    let mut start = 0;
    while start < records.len() {
        let at = records[start].committed_at_ms;
        let end = records[start..]
            .iter()
            .position(|r| r.committed_at_ms != at)
            .map_or(records.len(), |n| start + n);
        encode_batch(&records[start..end], out);
        start = end;
    }
}

fn put_bytes(out: &mut BytesMut, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, i32::try_from(b.len()).unwrap_or(i32::MAX));
            out.put_slice(b);
        }
    }
}

/// A zigzag varint (the record format's signed integers), appended.
fn put_varint(out: &mut BytesMut, n: i32) {
    let mut z = ((n << 1) ^ (n >> 31)) as u32;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// A zigzag varlong taken from the front of `buf`; `None` when truncated or longer than
/// 10 bytes.
fn get_varlong(buf: &mut Bytes) -> Option<i64> {
    let mut z: u64 = 0;
    for i in 0..10 {
        let &byte = buf.get(i)?;
        z |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let _ = buf.split_to(i + 1);
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

/// A zigzag varint taken from the front of `buf`; `None` when truncated, longer than 5
/// bytes, or out of `i32`'s range.
fn get_varint(buf: &mut Bytes) -> Option<i32> {
    let mut z: u64 = 0;
    for i in 0..5 {
        let &byte = buf.get(i)?;
        z |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let z = u32::try_from(z).ok()?;
            let _ = buf.split_to(i + 1);
            return Some(((z >> 1) as i32) ^ -((z & 1) as i32));
        }
    }
    None
}

/// One batch of records sharing a commit time.
fn encode_batch(records: &[StoredRecord], out: &mut BytesMut) {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return;
    };
    let base_offset = first.offset;
    let timestamp = first.committed_at_ms;
    let start = out.len();
    out.put_i64(i64::try_from(base_offset).unwrap_or(i64::MAX));
    out.put_i32(0); // batch length, filled below
    out.put_i32(0); // partition leader epoch: always 0 (one leader, never changes)
    out.put_i8(2); // magic
    out.put_u32(0); // CRC, filled below
    out.put_i16(LOG_APPEND_TIME_BIT);
    out.put_i32(i32::try_from(last.offset - first.offset).unwrap_or(i32::MAX));
    out.put_i64(timestamp);
    out.put_i64(timestamp);
    out.put_i64(-1); // producer id
    out.put_i16(-1); // producer epoch
    out.put_i32(-1); // base sequence
    out.put_i32(i32::try_from(records.len()).unwrap_or(i32::MAX));
    let mut body = BytesMut::new();
    for record in records {
        body.clear();
        body.put_i8(0); // attributes
        body.put_u8(0); // timestamp delta (zigzag 0): one commit time per batch
        put_varint(
            &mut body,
            i32::try_from(record.offset - base_offset).unwrap_or(i32::MAX),
        );
        put_bytes(&mut body, record.key.as_deref());
        put_bytes(&mut body, record.value.as_deref());
        let origin = record.origin.as_ref().map(|o| {
            format!(
                "{}:{}:{}",
                hex::encode(o.epoch),
                o.parent_partition,
                o.parent_offset
            )
        });
        let count = record.headers.len() + usize::from(origin.is_some());
        put_varint(&mut body, i32::try_from(count).unwrap_or(i32::MAX));
        for header in &record.headers {
            put_bytes(&mut body, Some(header.name.as_bytes()));
            put_bytes(&mut body, Some(&header.value));
        }
        if let Some(origin) = &origin {
            put_bytes(&mut body, Some(ORIGIN_HEADER.as_bytes()));
            put_bytes(&mut body, Some(origin.as_bytes()));
        }
        put_varint(out, i32::try_from(body.len()).unwrap_or(i32::MAX));
        out.put_slice(&body);
    }
    let batch_length = i32::try_from(out.len() - start - 12).unwrap_or(i32::MAX);
    out[start + 8..start + 12].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + ATTRIBUTES_AT..]);
    out[start + CRC_AT..start + ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use kafka_protocol::records::{Compression, TimestampType};

    use super::*;

    const LIMITS: BatchLimits = BatchLimits {
        max_records: 100,
        max_record_bytes: 1 << 20,
        max_decompressed_bytes: 1 << 20,
    };

    fn stored(offset: u64, at: i64, key: &str, headers: &[(&str, &str)]) -> StoredRecord {
        StoredRecord {
            offset,
            committed_at_ms: at,
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: (*n).to_owned(),
                    value: Bytes::copy_from_slice(v.as_bytes()),
                })
                .collect(),
            value: Some(Bytes::from(format!("value-{offset}"))),
            origin: None,
        }
    }

    #[test]
    fn fetched_records_decode_with_the_crate_as_log_append_batches() {
        let records = vec![
            stored(7, 1000, "a", &[("h", "1")]),
            stored(8, 1000, "b", &[]),
            stored(9, 2000, "c", &[("x", "y")]),
        ];
        let mut out = BytesMut::new();
        encode_fetched(&records, &mut out);
        let sets = RecordBatchDecoder::decode_all(&mut out.freeze()).unwrap();
        assert_eq!(sets.len(), 2, "one batch per commit time");
        let decoded: Vec<_> = sets.iter().flat_map(|s| s.records.iter()).collect();
        assert_eq!(sets[0].compression, Compression::None);
        let offsets: Vec<i64> = decoded.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [7, 8, 9]);
        assert_eq!(decoded[2].timestamp, 2000);
        assert_eq!(decoded[0].key.as_deref(), Some(&b"a"[..]));
        assert_eq!(decoded[0].value.as_deref(), Some(&b"value-7"[..]));
        assert_eq!(decoded[0].timestamp_type, TimestampType::LogAppend);
        assert_eq!(decoded[0].headers.len(), 1);
    }

    #[test]
    fn a_fetched_batch_decodes_back_with_repeated_headers_kept_in_order() {
        // Our own encoder writes repeated header names, which the crate's record type cannot.
        let records = vec![stored(0, 5, "k", &[("n", "1"), ("n", "2")])];
        let mut out = BytesMut::new();
        encode_fetched(&records, &mut out);
        let batch = decode_produced(out.freeze(), &LIMITS).unwrap();
        assert_eq!(batch.records.len(), 1);
        let names: Vec<(&str, &[u8])> = batch.records[0]
            .headers
            .iter()
            .map(|h| (h.name.as_str(), &h.value[..]))
            .collect();
        assert_eq!(names, [("n", &b"1"[..]), ("n", &b"2"[..])]);
        assert_eq!(batch.producer_id, -1);
    }

    #[test]
    fn a_batch_whose_last_offset_delta_does_not_name_its_last_record_is_refused() {
        let records = vec![stored(0, 5, "k", &[]), stored(1, 5, "k", &[])];
        let mut out = BytesMut::new();
        encode_fetched(&records, &mut out);
        assert!(decode_produced(out.clone().freeze(), &LIMITS).is_ok());
        // Claim a last offset delta of 7 for two records, the CRC fixed to match.
        out[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4].copy_from_slice(&7i32.to_be_bytes());
        let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
        out[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
        let err = decode_produced(out.freeze(), &LIMITS).unwrap_err();
        assert!(matches!(err, BatchError::Invalid(_)), "{err}");
        assert_eq!(
            err.error(),
            kafka_protocol::error::ResponseError::InvalidRecord
        );
    }

    #[test]
    fn a_record_count_larger_than_the_bytes_is_refused_before_allocating() {
        let records = vec![stored(0, 5, "k", &[])];
        let mut out = BytesMut::new();
        encode_fetched(&records, &mut out);
        // Claim i32::MAX records, then fix the CRC so only the count is wrong.
        out[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
        out[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
        let limits = BatchLimits {
            max_records: usize::MAX,
            ..LIMITS
        };
        let err = decode_produced(out.freeze(), &limits).unwrap_err();
        assert!(matches!(err, BatchError::Corrupt(_)), "{err}");
    }

    #[test]
    fn only_uncompressed_batches_decode_in_place() {
        let mut out = BytesMut::new();
        encode_fetched(&[stored(0, 5, "k", &[])], &mut out);
        assert!(decodes_in_place(&out));
        // The codec bits of the attributes: gzip, snappy, lz4, zstd and the unknown ones.
        for codec in 1..=7u8 {
            let mut compressed = out.clone();
            compressed[ATTRIBUTES_AT + 1] |= codec;
            assert!(!decodes_in_place(&compressed), "codec {codec}");
        }
        // Too short to name a codec: refused at once by the decoder, wherever it runs.
        assert!(decodes_in_place(&out[..ATTRIBUTES_AT]));
    }

    #[test]
    fn a_flipped_byte_fails_the_crc() {
        let mut out = BytesMut::new();
        encode_fetched(&[stored(0, 5, "k", &[])], &mut out);
        let last = out.len() - 1;
        out[last] ^= 0xff;
        let err = decode_produced(out.freeze(), &LIMITS).unwrap_err();
        assert!(matches!(err, BatchError::Corrupt(_)), "{err}");
    }
}
