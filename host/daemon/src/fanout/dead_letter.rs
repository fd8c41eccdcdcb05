//! Dead letters: a record the link's router chain cannot route, set aside whole in the link's
//! dead-letter topic so the rest of its slab reaches the child and the cursor moves on.
//!
//! Only a record the poison search names, and that fails on its own too, is set aside: a
//! slab that fails as a whole (too slow together, a plugin whose state breaks after so many
//! records) stalls as before, since no single record is to blame. The letter is committed
//! (durably, as a child commit is) before the record leaves the slab, and the offset file
//! moves past the slab only once the rest of it is committed, so a crash in between sets the
//! record aside again on the retry: a letter may repeat, a record is never lost. Each letter
//! keeps the record's key, value and headers, and adds `narad.dlq.*` headers naming where it
//! came from and why ([`letter`]); it carries the same origin a child copy would, so a
//! dead-letter partition on another node drops a retried commit it already holds.

use std::sync::Arc;

use bytes::Bytes;
use narad_storage::{BatchOrigin, EncodedBatch, Header, PartitionId, StoredRecord};

use super::CursorKey;
use super::bucket::SlabOrigin;
use super::committer::{ChildBatch, ChildCommitter};
use super::route::PoisonFound;
use crate::metastore::{Metastore, MetastoreError};

/// Why a record could not be set aside in the dead-letter topic; the cursor stalls with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum DeadLetterError {
    /// The topic the link names does not exist.
    #[error(
        "the dead-letter topic {topic} does not exist; create it or change the link's dead_letter"
    )]
    NoTopic {
        /// The topic.
        topic: String,
    },
    /// The metadata could not be read.
    #[error("cannot read the dead-letter topic {topic}: {source}")]
    ReadTopic {
        /// The topic.
        topic: String,
        /// Why.
        source: MetastoreError,
    },
    /// The letter could not be encoded.
    #[error("cannot encode the dead letter of parent offset {offset}: {source}")]
    Encode {
        /// The record's parent offset.
        offset: u64,
        /// Why.
        source: narad_storage::StorageError,
    },
    /// The commit failed.
    #[error("commit to the dead-letter partition {target} failed: {source}")]
    Commit {
        /// The partition.
        target: PartitionId,
        /// Why.
        source: super::committer::ChildCommitError,
    },
    /// The record the search named is not in the slab (it was delivered meanwhile).
    #[error("parent offset {offset} is not among the slab's records")]
    NotInSlab {
        /// The record's parent offset.
        offset: u64,
    },
}

/// Prefix of the headers a letter adds to the record's own.
pub(crate) const HEADER_PREFIX: &str = "narad.dlq.";

/// Longest error text a letter's `narad.dlq.error` header holds, in bytes (plus a cut
/// marker): part of it comes from a plugin.
const MAX_ERROR_HEADER_BYTES: usize = 1024;

/// The letter for `record`: its key, value and headers as they are, then
/// `narad.dlq.{parent,partition,offset,child,epoch,plugin,digest,kind,error}`.
pub(crate) fn letter(record: &StoredRecord, key: &CursorKey, poison: &PoisonFound) -> StoredRecord {
    let error = narad_runtime::text::sanitize(&poison.error, MAX_ERROR_HEADER_BYTES);
    let added = [
        ("parent", key.parent.clone()),
        ("partition", key.partition.to_string()),
        ("offset", record.offset.to_string()),
        ("child", key.child.clone()),
        ("epoch", key.epoch.clone()),
        ("plugin", poison.plugin.clone()),
        ("digest", poison.digest.clone()),
        ("kind", poison.kind.clone()),
        ("error", error),
    ];
    let mut headers = record.headers.clone();
    headers.extend(added.into_iter().map(|(name, value)| Header {
        name: format!("{HEADER_PREFIX}{name}"),
        value: Bytes::from(value),
    }));
    StoredRecord {
        offset: record.offset,
        committed_at_ms: record.committed_at_ms,
        key: record.key.clone(),
        headers,
        value: record.value.clone(),
        origin: None,
    }
}

/// Commits `letter` to `topic`, in the partition the parent partition's letters go to (parent
/// partition modulo the topic's count, so one parent partition's letters keep their order),
/// through the link's committer; returns once it is durable. The error is the cursor's stall
/// reason.
pub(crate) async fn commit_letter(
    committer: &Arc<dyn ChildCommitter>,
    metastore: &dyn Metastore,
    topic: &str,
    letter: StoredRecord,
    origin: SlabOrigin,
) -> Result<PartitionId, DeadLetterError> {
    let partitions = match metastore.topic(topic).await {
        Ok(Some(meta)) if meta.partitions > 0 => meta.partitions,
        Ok(_) => {
            return Err(DeadLetterError::NoTopic {
                topic: topic.to_owned(),
            });
        }
        Err(source) => {
            return Err(DeadLetterError::ReadTopic {
                topic: topic.to_owned(),
                source,
            });
        }
    };
    let target = PartitionId::new(topic, origin.parent_partition % partitions);
    let batch_origin = BatchOrigin {
        epoch: origin.epoch,
        parent_partition: origin.parent_partition,
        slab_start: origin.slab_start,
        parent_offsets: vec![letter.offset],
    };
    let batch = EncodedBatch::encode(&[&letter], Some(&batch_origin)).map_err(|source| {
        DeadLetterError::Encode {
            offset: letter.offset,
            source,
        }
    })?;
    let committed = Arc::clone(committer)
        .commit_in_order(target.clone(), vec![ChildBatch::from_frame(batch)])
        .await;
    match committed.result {
        Ok(()) => Ok(target),
        Err(failure) => Err(DeadLetterError::Commit {
            target,
            source: failure.error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_letter_keeps_the_record_whole_and_says_where_it_came_from_and_why() {
        let record = StoredRecord {
            offset: 42,
            committed_at_ms: 7,
            key: Some(Bytes::from_static(b"k")),
            headers: vec![Header {
                name: "trace".into(),
                value: Bytes::from_static(b"t1"),
            }],
            value: Some(Bytes::from_static(b"v")),
            origin: None,
        };
        let key = CursorKey {
            parent: "orders".into(),
            partition: 3,
            child: "by-region".into(),
            epoch: "0011223344556677".into(),
        };
        let poison = PoisonFound {
            offset: 42,
            plugin: "picky".into(),
            digest: "ab".repeat(32),
            kind: "trap".into(),
            error: format!("trapped \u{1b}[31m{}", "x".repeat(5000)),
            alone: true,
        };
        let letter = letter(&record, &key, &poison);
        assert_eq!(
            (letter.key, letter.value, letter.offset),
            (record.key, record.value, 42)
        );
        let header = |name: &str| {
            letter
                .headers
                .iter()
                .find(|h| h.name == name)
                .map(|h| String::from_utf8_lossy(&h.value).into_owned())
        };
        assert_eq!(
            header("trace").as_deref(),
            Some("t1"),
            "its own headers stay"
        );
        for (name, want) in [
            ("narad.dlq.parent", "orders"),
            ("narad.dlq.partition", "3"),
            ("narad.dlq.offset", "42"),
            ("narad.dlq.child", "by-region"),
            ("narad.dlq.epoch", "0011223344556677"),
            ("narad.dlq.plugin", "picky"),
            ("narad.dlq.kind", "trap"),
        ] {
            assert_eq!(header(name).as_deref(), Some(want), "{name}");
        }
        let error = header("narad.dlq.error").unwrap();
        assert!(error.starts_with("trapped "), "{error}");
        assert!(!error.contains('\u{1b}'), "plugin text is escaped: {error}");
        assert!(
            error.len() < MAX_ERROR_HEADER_BYTES + 64,
            "cut: {}",
            error.len()
        );
    }
}
