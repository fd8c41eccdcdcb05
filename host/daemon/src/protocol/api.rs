//! The JSON shapes of the HTTP API that need nothing of the daemon: the server's handlers, the
//! transports between narad processes and the CLI client all read and write these.
//!
//! Keys, values and header values travel as UTF-8 strings (`key`, `value`) when they are valid
//! UTF-8, else base64 (`key_b64`, `value_b64`, standard alphabet with padding). A record without
//! a key answers `"key": null`; an empty key is `"key": ""`.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

/// `POST /v1/topics` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTopicRequest {
    /// Topic name: 1..=249 characters of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    pub name: String,
    /// Partition count, 1..=1024.
    pub partitions: u32,
    /// Age limit in milliseconds; absent keeps records forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    /// Size limit per partition in bytes; absent means no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
    /// Cluster mode: the node id of each partition, by index; absent spreads the partitions
    /// over the live nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Vec<String>>,
}

/// A topic's settings, as created, listed and described.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    /// Name.
    pub name: String,
    /// Partition count.
    pub partitions: u32,
    /// Age limit in milliseconds, or null.
    pub retention_ms: Option<u64>,
    /// Size limit per partition in bytes, or null.
    pub retention_bytes: Option<u64>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Cluster mode: the node that owns each partition, by index; absent on a single node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<String>,
    /// Whether producers may write to the topic while it is a fan-out child (`PATCH` it with
    /// `"writable_as_child": true`); a child is written only by its cursors otherwise.
    #[serde(default)]
    pub writable_as_child: bool,
}

/// `POST /v1/topics/{t}/partitions/{p}/move` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// The node to move the partition to; absent: the least loaded live node other than its
    /// owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Cancel the move under way instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
}

/// `POST /v1/topics/{t}/partitions/{p}/recreate` body: re-create a dead node's partition,
/// empty, on another node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecreateRequest {
    /// The node to re-create it on; absent: the least loaded live node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<String>,
    /// Must be `true`: the records only the dead node held are lost.
    #[serde(default)]
    pub accept_loss: bool,
    /// The lowest offset the new log may start at (say, the last high watermark seen, so
    /// consumers of the partition never meet a reused offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_offset: Option<u64>,
}

/// The answer to a cancelled move: who owns the partition now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveCancelled {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Its owner, which serves it again.
    pub owner: String,
    /// The owner record's generation (unchanged by a cancel).
    pub generation: u64,
}

/// `GET /v1/nodes` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeList {
    /// `single` (one node, embedded metastore) or `cluster`.
    pub mode: String,
    /// The id of the node that answered.
    pub this_node: String,
    /// Every live node, by id.
    pub nodes: Vec<NodeInfo>,
}

/// One live node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node id (`--node-id`).
    pub id: String,
    /// The URL peers and clients reach it at; absent on a single node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// When its process joined, milliseconds since the Unix epoch; absent on a single node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_at: Option<i64>,
    /// Cordoned (being drained): it gets no new partitions unless pinned there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned: bool,
}

/// The answer to a cordon or uncordon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cordon {
    /// The node.
    pub node: String,
    /// Whether it is cordoned now.
    pub cordoned: bool,
}

/// `GET /v1/topics` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicList {
    /// Every topic, sorted by name.
    pub topics: Vec<TopicInfo>,
}

/// One partition in a describe answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionInfo {
    /// Partition index.
    pub partition: u32,
    /// Oldest offset still stored.
    pub log_start_offset: u64,
    /// Next offset to be written; null when the log is closed and unknown without opening it
    /// (after a crash, until it is next opened).
    pub high_watermark: Option<u64>,
    /// Bytes on disk in segment files.
    pub size_bytes: u64,
    /// Number of segment files.
    pub segments: u32,
    /// `open`, `closed`, `quarantined` or `failed`.
    pub state: String,
    /// Why the partition is quarantined or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What recovery cut off this partition's torn tails and kept aside; absent when nothing is
    /// kept aside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_cut: Option<RecoveredCutInfo>,
    /// Cluster mode: the node that owns the partition (its figures come from there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// `GET /v1/topics/{t}` query string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescribeQuery {
    /// Cluster mode: only the partitions the answering node owns (what nodes ask each other
    /// when they gather a description).
    #[serde(default)]
    pub local: bool,
}

/// Torn tails recovery cut off a partition, while their kept-aside copies are in the
/// partition's `torn/` directory (removing them clears this).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveredCutInfo {
    /// Number of cuts kept aside.
    pub cuts: u32,
    /// Records in the cut bytes (they may have been acknowledged; they are no longer readable).
    pub records: u64,
    /// False when `records` is only a lower bound (some cut bytes had no readable frame header).
    pub records_exact: bool,
    /// Bytes cut.
    pub bytes: u64,
    /// First offset the latest cut removed; records written since reuse it.
    pub from_offset: u64,
    /// When the latest cut was made, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Path of the kept-aside copy of the latest cut's bytes.
    pub kept_at: String,
}

/// `GET /v1/topics/{t}` answer: the topic's settings and per-partition state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDescription {
    /// Settings.
    #[serde(flatten)]
    pub topic: TopicInfo,
    /// One entry per partition, by index.
    pub partition_stats: Vec<PartitionInfo>,
}

/// `DELETE /v1/topics/{t}` query string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteTopicQuery {
    /// Delete the topic even though it has children or is a child, removing those links.
    /// Without it such a delete is refused with 409.
    #[serde(default)]
    pub force: bool,
}

/// The two ends of a fan-out link.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LinkEnds {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
}

/// `DELETE /v1/topics/{t}` answer: the deleted topic's settings and the links removed with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedTopic {
    /// The deleted topic's settings.
    #[serde(flatten)]
    pub topic: TopicInfo,
    /// Links to its children and from its parents that the delete removed (empty unless the
    /// delete was forced), sorted by parent then child.
    #[serde(default)]
    pub removed_links: Vec<LinkEnds>,
}

/// `POST /v1/topics/{t}/partitions` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrowPartitionsRequest {
    /// The new partition count (at least the current one, at most 1024).
    pub count: u32,
}

/// A header in a produce request's list form, or in a fetch answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderJson {
    /// Header name.
    pub name: String,
    /// Value as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Value as base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
}

/// Headers of a produced record: an object of text values, or a list (which keeps order,
/// allows repeated names and base64 values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum HeadersJson {
    /// `{"name": "value", ...}`; stored sorted by name.
    Map(BTreeMap<String, String>),
    /// `[{"name": ..., "value": ... | "value_b64": ...}, ...]`.
    List(Vec<HeaderJson>),
}

impl<'de> Deserialize<'de> for HeadersJson {
    /// Accepts either form, with errors that say which form was meant and what is wrong
    /// (serde's untagged enums only say that nothing matched).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::Object(map) => map
                .into_iter()
                .map(|(name, value)| match value {
                    serde_json::Value::String(text) => Ok((name, text)),
                    other => Err(D::Error::custom(format!(
                        "header {name:?} has value {other}: the object form of \"headers\" takes \
                         text values; use the list form [{{\"name\": ..., \"value_b64\": ...}}] \
                         for binary values"
                    ))),
                })
                .collect::<Result<_, _>>()
                .map(HeadersJson::Map),
            list @ serde_json::Value::Array(_) => serde_json::from_value(list)
                .map(HeadersJson::List)
                .map_err(|e| D::Error::custom(format!("in the list form of \"headers\": {e}"))),
            other => Err(D::Error::custom(format!(
                "\"headers\" is {other}: use an object {{\"name\": \"value\"}} or a list \
                 [{{\"name\": ..., \"value\" | \"value_b64\": ...}}]"
            ))),
        }
    }
}

/// One record of a produce request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceRecordJson {
    /// Key as text; absent or null means no key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Key as base64 (instead of `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_b64: Option<String>,
    /// Value as text: absent when `value_b64` gives it, `Some(None)` for an explicit JSON
    /// `null` (a null value, Kafka's tombstone).
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Option<String>>,
    /// Value as base64 (instead of `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
    /// Headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<HeadersJson>,
    /// Explicit partition, overriding key hashing and round-robin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
}

/// A field that is present, as `Some`, even when it is `null` (`Some(None)`); with
/// `#[serde(default)]` an absent one is `None`.
pub fn present_or_null<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(deserializer).map(Some)
}

/// `POST /v1/topics/{t}/records` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceRequest {
    /// The records, committed in this order within each partition.
    pub records: Vec<ProduceRecordJson>,
}

/// Where one produced record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetJson {
    /// Partition index.
    pub partition: u32,
    /// Offset within it.
    pub offset: u64,
}

/// `POST /v1/topics/{t}/records` answer: one entry per record, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProduceResponse {
    /// Offsets in request order.
    pub offsets: Vec<OffsetJson>,
}

/// Bytes as the API shows them: text when UTF-8, else base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    /// Valid UTF-8.
    Utf8(String),
    /// Anything else, base64-encoded.
    Base64(String),
}

impl Text {
    /// Encodes `bytes`.
    pub fn of(bytes: &[u8]) -> Text {
        match std::str::from_utf8(bytes) {
            Ok(s) => Text::Utf8(s.to_owned()),
            Err(_) => Text::Base64(B64.encode(bytes)),
        }
    }
}

/// One record of a fetch answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RecordJson {
    /// Offset.
    pub offset: u64,
    /// Key as text; null when the record has no key (or when `key_b64` is set).
    #[serde(default)]
    pub key: Option<String>,
    /// Key as base64, present only for a key that is not UTF-8.
    #[serde(default)]
    pub key_b64: Option<String>,
    /// Value as text; null (with no `value_b64`) for a null value.
    #[serde(default)]
    pub value: Option<String>,
    /// Value as base64, for a value that is not UTF-8.
    #[serde(default)]
    pub value_b64: Option<String>,
    /// Headers in stored order.
    #[serde(default)]
    pub headers: Vec<HeaderJson>,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_at: i64,
    /// Where a fan-out cursor copied the record from; absent for produced records.
    #[serde(default)]
    pub origin: Option<OriginJson>,
}

/// Provenance of a record a fan-out cursor committed: consumers drop the duplicates
/// at-least-once delivery allows by remembering `(epoch, partition, offset)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginJson {
    /// The link's attach epoch, 16 hex digits.
    pub epoch: String,
    /// Parent partition.
    pub partition: u32,
    /// Offset in the parent partition.
    pub offset: u64,
    /// First parent offset of the slab the record was copied in.
    pub slab_start: u64,
}

impl From<&narad_storage::RecordOrigin> for OriginJson {
    fn from(origin: &narad_storage::RecordOrigin) -> OriginJson {
        OriginJson {
            epoch: hex::encode(origin.epoch),
            partition: origin.parent_partition,
            offset: origin.parent_offset,
            slab_start: origin.slab_start,
        }
    }
}

impl RecordJson {
    /// Builds the answer form of a stored record.
    pub fn from_parts(
        offset: u64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl IntoIterator<Item = (String, Vec<u8>)>,
        committed_at: i64,
    ) -> RecordJson {
        let (key, key_b64) = match key.map(Text::of) {
            None => (None, None),
            Some(Text::Utf8(s)) => (Some(s), None),
            Some(Text::Base64(s)) => (None, Some(s)),
        };
        let (value, value_b64) = match value.map(Text::of) {
            None => (None, None),
            Some(Text::Utf8(s)) => (Some(s), None),
            Some(Text::Base64(s)) => (None, Some(s)),
        };
        let headers = headers
            .into_iter()
            .map(|(name, v)| match Text::of(&v) {
                Text::Utf8(s) => HeaderJson {
                    name,
                    value: Some(s),
                    value_b64: None,
                },
                Text::Base64(s) => HeaderJson {
                    name,
                    value: None,
                    value_b64: Some(s),
                },
            })
            .collect();
        RecordJson {
            offset,
            key,
            key_b64,
            value,
            value_b64,
            headers,
            committed_at,
            origin: None,
        }
    }

    /// The same record with its fan-out provenance.
    pub(crate) fn with_origin(mut self, origin: Option<OriginJson>) -> RecordJson {
        self.origin = origin;
        self
    }

    /// The key's bytes, `None` when the record has none; `Err` for bad base64.
    pub fn key_bytes(&self) -> Result<Option<Vec<u8>>, base64::DecodeError> {
        match (&self.key, &self.key_b64) {
            (_, Some(b)) => B64.decode(b).map(Some),
            (Some(s), None) => Ok(Some(s.as_bytes().to_vec())),
            (None, None) => Ok(None),
        }
    }

    /// The value's bytes (none for a null value); `Err` for bad base64.
    pub fn value_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        match (&self.value, &self.value_b64) {
            (_, Some(b)) => B64.decode(b),
            (Some(s), None) => Ok(s.as_bytes().to_vec()),
            (None, None) => Ok(Vec::new()),
        }
    }
}

impl Serialize for RecordJson {
    /// Writes `key` (null when absent) unless the key is binary, in which case only `key_b64`;
    /// likewise `value` (null for a null value) or `value_b64`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("offset", &self.offset)?;
        match &self.key_b64 {
            Some(b) => map.serialize_entry("key_b64", b)?,
            None => map.serialize_entry("key", &self.key)?,
        }
        match (&self.value, &self.value_b64) {
            (_, Some(b)) => map.serialize_entry("value_b64", b)?,
            (v, None) => map.serialize_entry("value", v)?,
        }
        map.serialize_entry("headers", &self.headers)?;
        map.serialize_entry("committed_at", &self.committed_at)?;
        if let Some(origin) = &self.origin {
            map.serialize_entry("origin", origin)?;
        }
        map.end()
    }
}

/// `GET /v1/topics/{t}/partitions/{p}/records` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchResponse {
    /// Records from the requested offset, in offset order.
    pub records: Vec<RecordJson>,
    /// The offset to ask for next.
    pub next_offset: u64,
    /// The next offset to be written in this partition.
    pub high_watermark: u64,
    /// The oldest offset still stored.
    pub log_start_offset: u64,
}

/// Every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong and what to fix.
    pub error: String,
}

/// `GET /healthz` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always `"ok"` when the daemon answers.
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_key_and_value_are_base64_and_text_stays_text() {
        let r = RecordJson::from_parts(7, Some(&[0xff, 0x00]), Some(b"hello"), [], 1);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["key_b64"], "/wA=");
        assert!(v.get("key").is_none());
        assert_eq!(v["value"], "hello");
        let back: RecordJson = serde_json::from_value(v).unwrap();
        assert_eq!(back.key_bytes().unwrap(), Some(vec![0xff, 0x00]));
    }

    #[test]
    fn absent_key_is_null_and_empty_key_is_empty_text() {
        let none = serde_json::to_value(RecordJson::from_parts(0, None, Some(b""), [], 1)).unwrap();
        assert!(none["key"].is_null());
        let empty =
            serde_json::to_value(RecordJson::from_parts(0, Some(b""), Some(b""), [], 1)).unwrap();
        assert_eq!(empty["key"], "");
    }

    #[test]
    fn a_null_value_is_json_null_and_an_empty_one_empty_text_both_ways() {
        let null = serde_json::to_value(RecordJson::from_parts(0, None, None, [], 1)).unwrap();
        assert!(null["value"].is_null(), "{null}");
        let empty =
            serde_json::to_value(RecordJson::from_parts(0, None, Some(b""), [], 1)).unwrap();
        assert_eq!(empty["value"], "");

        let produced: ProduceRecordJson = serde_json::from_str(r#"{"value": null}"#).unwrap();
        assert_eq!(produced.value, Some(None));
        let produced: ProduceRecordJson = serde_json::from_str(r#"{"value": ""}"#).unwrap();
        assert_eq!(produced.value, Some(Some(String::new())));
        let produced: ProduceRecordJson = serde_json::from_str(r#"{"value_b64": "AA=="}"#).unwrap();
        assert_eq!(produced.value, None);
        let null = ProduceRecordJson {
            value: Some(None),
            ..ProduceRecordJson::default()
        };
        assert_eq!(serde_json::to_string(&null).unwrap(), r#"{"value":null}"#);
    }
}

/// `PUT /v1/topics/{parent}/children/{child}/shadow` body: the candidate chain to run beside
/// the link's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowRequest {
    /// The candidate chain: plugin names (`name`: newest version; `name@digest`: exactly that).
    pub router: Vec<String>,
    /// Configuration handed to every plugin of the candidate: a string as is, anything else as
    /// its JSON text; absent, the candidate gets the link's own config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}
