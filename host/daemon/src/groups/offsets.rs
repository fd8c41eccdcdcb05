//! Committed offsets as data: every OffsetCommit is one record in a partition of the
//! internal topic [`TOPIC`] (the group's partition, [`partition_of`]), committed through the
//! produce path (append, `fdatasync`, verify) before the commit is answered. What a group has
//! committed is rebuilt by reading its partition from the start ([`replay`]).
//!
//! Record: the key is the group id; the value is [`FORMAT`] then a postcard [`GroupRecord`].
//! The topic is windowed rather than compacted: its retention is the offsets retention, and
//! the coordinator writes the offsets of a group that still has members again before they
//! age out ([`crate::groups::Coordinator`]'s refresh), so what ages out is what an empty
//! group last committed, at least the retention after it emptied (Kafka's rule).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use narad_storage::{NewRecord, PartitionId, ReadOptions, StorageError, Store};
use serde::{Deserialize, Serialize};

/// The internal topic holding committed offsets. Clients cannot produce to it, attach
/// links to it or delete it.
pub(crate) const TOPIC: &str = "__narad_groups";

/// Partitions of [`TOPIC`] when the daemon creates it: groups spread over this many
/// coordinators in a cluster.
pub(crate) const PARTITIONS: u32 = 16;

/// First byte of every record value: the layout of what follows.
pub(crate) const FORMAT: u8 = 1;

/// Largest `metadata` string a commit may attach to one offset (Kafka's
/// `offset.metadata.max.bytes` default).
pub(crate) const MAX_METADATA_BYTES: usize = 4096;

/// Records read per step of a replay.
const REPLAY_RECORDS: usize = 4096;
/// Bytes read per step of a replay.
const REPLAY_BYTES: usize = 4 << 20;

/// The partition of [`TOPIC`] that holds `group`'s offsets, among `partitions`.
pub(crate) fn partition_of(group: &str, partitions: u32) -> u32 {
    crc32c::crc32c(group.as_bytes()) % partitions.max(1)
}

/// One committed offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Committed {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset the group will read.
    pub offset: i64,
    /// The leader epoch the client saw (-1: none).
    pub leader_epoch: i32,
    /// The client's metadata string.
    pub metadata: Option<String>,
    /// When it was committed (coordinator's clock, ms since the epoch).
    pub commit_ms: i64,
}

/// What one record of [`TOPIC`] says about its group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum GroupRecord {
    /// These offsets were committed (each replaces the group's earlier one for its partition).
    Offsets(Vec<Committed>),
    /// The group was deleted: every offset before this record is gone.
    Deleted,
}

impl GroupRecord {
    /// The record for `group`.
    pub(crate) fn to_record(&self, group: &str) -> Result<NewRecord, postcard::Error> {
        let mut value = vec![FORMAT];
        value.extend_from_slice(&postcard::to_allocvec(self)?);
        Ok(NewRecord {
            key: Some(Bytes::copy_from_slice(group.as_bytes())),
            headers: Vec::new(),
            value: Some(Bytes::from(value)),
        })
    }

    /// Reads a record's value; `None` for a layout this build does not know.
    fn from_value(value: &[u8]) -> Option<GroupRecord> {
        match value.split_first() {
            Some((&FORMAT, rest)) => postcard::from_bytes(rest).ok(),
            _ => None,
        }
    }
}

/// What one group has committed, by (topic, partition).
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupOffsets {
    /// The offsets.
    pub entries: BTreeMap<(String, i32), Committed>,
    /// When the group last wrote (a commit or a refresh), ms since the epoch.
    pub last_write_ms: i64,
}

impl GroupOffsets {
    /// Takes a record's offsets.
    pub(crate) fn apply(&mut self, committed: &[Committed]) {
        for entry in committed {
            self.last_write_ms = self.last_write_ms.max(entry.commit_ms);
            self.entries
                .insert((entry.topic.clone(), entry.partition), entry.clone());
        }
    }
}

/// What a replay of one partition found.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// Every group's offsets.
    pub groups: HashMap<String, GroupOffsets>,
    /// Records this build could not read (kept in the log, left out of the offsets).
    pub unreadable: u64,
}

/// Reads `id` from its first record to its end and rebuilds every group's offsets.
/// Blocking.
pub(crate) fn replay(store: &Store, id: &PartitionId) -> Result<Replayed, StorageError> {
    let mut replayed = Replayed::default();
    let high = store.high_watermark(id)?;
    let mut offset = store.peek(id)?.log_start_offset;
    while offset < high {
        let read = store.read(
            id,
            &ReadOptions {
                offset,
                max_records: REPLAY_RECORDS,
                max_bytes: REPLAY_BYTES,
                max_committed_at_ms: None,
            },
        )?;
        let Some(last) = read.records.last().map(|r| r.offset) else {
            break;
        };
        for record in &read.records {
            let group = record
                .key
                .as_deref()
                .and_then(|k| std::str::from_utf8(k).ok());
            let parsed = record.value.as_deref().and_then(GroupRecord::from_value);
            match (group, parsed) {
                (Some(group), Some(GroupRecord::Offsets(committed))) => replayed
                    .groups
                    .entry(group.to_owned())
                    .or_default()
                    .apply(&committed),
                (Some(group), Some(GroupRecord::Deleted)) => {
                    replayed.groups.remove(group);
                }
                _ => replayed.unreadable += 1,
            }
        }
        offset = last + 1;
    }
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(topic: &str, partition: i32, offset: i64, at: i64) -> Committed {
        Committed {
            topic: topic.to_owned(),
            partition,
            offset,
            leader_epoch: -1,
            metadata: Some("m".to_owned()),
            commit_ms: at,
        }
    }

    #[test]
    fn groups_spread_over_the_partitions_and_stay_put() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..200 {
            let group = format!("group-{i}");
            let p = partition_of(&group, PARTITIONS);
            assert!(p < PARTITIONS);
            assert_eq!(p, partition_of(&group, PARTITIONS));
            seen.insert(p);
        }
        assert_eq!(seen.len(), PARTITIONS as usize);
    }

    #[test]
    fn a_replay_keeps_the_last_commit_of_each_partition_and_forgets_deleted_groups() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), narad_storage::StoreOptions::default()).unwrap();
        let id = PartitionId::new(TOPIC, 0);
        store
            .create_partition(&id, narad_storage::LogConfig::default())
            .unwrap();
        let write = |group: &str, record: GroupRecord| {
            store
                .append(
                    &id,
                    narad_storage::AppendBatch {
                        records: vec![record.to_record(group).unwrap()],
                        origin: None,
                    },
                )
                .unwrap();
        };
        write(
            "a",
            GroupRecord::Offsets(vec![committed("t", 0, 5, 1), committed("t", 1, 7, 1)]),
        );
        write("b", GroupRecord::Offsets(vec![committed("t", 0, 9, 2)]));
        write("a", GroupRecord::Offsets(vec![committed("t", 0, 6, 3)]));
        write("b", GroupRecord::Deleted);
        write("b", GroupRecord::Offsets(vec![committed("u", 0, 1, 4)]));
        // A record of a later layout is kept in the log and counted, not guessed at.
        store
            .append(
                &id,
                narad_storage::AppendBatch {
                    records: vec![NewRecord {
                        key: Some(Bytes::from_static(b"a")),
                        headers: Vec::new(),
                        value: Some(Bytes::from_static(&[9, 1, 2])),
                    }],
                    origin: None,
                },
            )
            .unwrap();
        let replayed = replay(&store, &id).unwrap();
        let a = &replayed.groups["a"];
        assert_eq!(a.entries[&("t".to_owned(), 0)].offset, 6);
        assert_eq!(a.entries[&("t".to_owned(), 1)].offset, 7);
        assert_eq!(a.last_write_ms, 3);
        let b = &replayed.groups["b"];
        assert_eq!(b.entries.len(), 1, "what b had before its delete is gone");
        assert_eq!(b.entries[&("u".to_owned(), 0)].offset, 1);
        assert_eq!(replayed.unreadable, 1);
    }
}
