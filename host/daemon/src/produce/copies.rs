//! The receiving side of a remote child: a record produced with a `narad-origin` header (the
//! origin a remote child's copy names: source, attach epoch, parent partition, parent offset)
//! that its partition already holds, with the same key, headers and value, is not stored
//! again; its offset is answered as the stored copy's. So a slab a remote child's cursor sends
//! again (after a crash of the source, or an answer lost on the way back) lands once.
//!
//! The same rule as a child partition's window of origins ([`crate::cluster::dedupe`]): an exact
//! set of the most recent origin headers per partition ([`WINDOW_COPIES`]), filled from the
//! partition's tail the first time a copy comes after a start and updated only once an append
//! is durable, never "highest offset seen". A held header with other content (a producer
//! reusing the header, or a parent that gave the offset to a new record) is stored. A copy whose
//! origin left the window is stored again: a duplicate, never a loss. Records without the header
//! (every ordinary produce) take the plain append and pay nothing for this.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use narad_storage::{AppendBatch, NewRecord, PartitionId, StorageError, Store};

use crate::cluster::dedupe::{for_each_tail_record, same_content, stored_at};

/// The header a remote child's copy names its origin in.
pub(crate) const ORIGIN_HEADER: &str = "narad-origin";

/// Origin headers remembered per partition: as many as a child partition's window of origins.
pub(crate) const WINDOW_COPIES: usize = crate::cluster::dedupe::WINDOW_ORIGINS;

/// The origin header of `record`, if it has one.
fn origin_of(record: &NewRecord) -> Option<&[u8]> {
    record
        .headers
        .iter()
        .find(|h| h.name == ORIGIN_HEADER)
        .map(|h| h.value.as_ref())
}

/// A header value's key in a window. Two values with one key are told apart by the content
/// check, which compares the headers too: a collision costs a read, never a record.
fn key_of(value: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The recent origin headers of one partition, each with the offset of the copy stored under
/// it.
#[derive(Debug, Default)]
struct Window {
    held: HashMap<u64, u64>,
    arrival: VecDeque<u64>,
}

impl Window {
    fn remember(&mut self, key: u64, offset: u64, capacity: usize) {
        if self.held.insert(key, offset).is_none() {
            self.arrival.push_back(key);
        }
        while self.arrival.len() > capacity {
            if let Some(old) = self.arrival.pop_front() {
                self.held.remove(&old);
            }
        }
    }
}

/// The windows of this node's partitions that received copies since the start.
#[derive(Debug)]
pub(crate) struct CopyWindows {
    capacity: usize,
    windows: Mutex<HashMap<PartitionId, Arc<Mutex<Option<Window>>>>>,
}

impl Default for CopyWindows {
    fn default() -> CopyWindows {
        CopyWindows::with_capacity(WINDOW_COPIES)
    }
}

impl CopyWindows {
    /// Windows of at most `capacity` origin headers each.
    pub(crate) fn with_capacity(capacity: usize) -> CopyWindows {
        CopyWindows {
            capacity,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets the windows of `topic` (deleted, or its partitions gone from this node).
    pub(crate) fn forget_topic(&self, topic: &str) {
        self.windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|id, _| id.topic != topic);
    }

    /// Appends `records` to `id` (blocking), leaving out the copies it already holds; returns
    /// the offset of every record, in order: where it was stored, or where its copy is.
    pub(crate) fn append(
        &self,
        store: &Store,
        id: &PartitionId,
        records: Vec<NewRecord>,
    ) -> Result<Vec<u64>, StorageError> {
        if !records.iter().any(|r| origin_of(r).is_some()) {
            let count = records.len() as u64;
            let appended = store.append(
                id,
                AppendBatch {
                    records,
                    origin: None,
                },
            )?;
            return Ok((appended.base_offset..appended.base_offset + count).collect());
        }
        let slot = Arc::clone(
            self.windows
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(id.clone())
                .or_default(),
        );
        // Held across the check and the append: a retry overtaking its own original must see it.
        let mut window = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if window.is_none() {
            *window = Some(self.rebuild(store, id)?);
        }
        let window = window.get_or_insert_with(Window::default);
        let keys: Vec<Option<u64>> = records.iter().map(|r| origin_of(r).map(key_of)).collect();
        let held_at: Vec<Option<u64>> = keys
            .iter()
            .map(|k| k.and_then(|k| window.held.get(&k).copied()))
            .collect();
        let stored = stored_at(store, id, held_at.iter().flatten().copied())?;
        // Each record: `Ok(offset)` of its stored copy, or `Err(index)` in what is appended.
        let mut kept = Vec::with_capacity(records.len());
        let mut placed: Vec<Result<u64, usize>> = Vec::with_capacity(records.len());
        let mut kept_keys = Vec::new();
        for ((record, key), at) in records.into_iter().zip(keys).zip(held_at) {
            match at.and_then(|at| stored.get(&at).map(|old| (at, old))) {
                Some((at, old)) if same_content(&record, old) => placed.push(Ok(at)),
                _ => {
                    placed.push(Err(kept.len()));
                    kept_keys.push(key);
                    kept.push(record);
                }
            }
        }
        let base = match kept.is_empty() {
            true => 0,
            false => {
                let appended = store.append(
                    id,
                    AppendBatch {
                        records: kept,
                        origin: None,
                    },
                )?;
                for (i, key) in kept_keys.iter().enumerate() {
                    if let Some(key) = key {
                        window.remember(*key, appended.base_offset + i as u64, self.capacity);
                    }
                }
                appended.base_offset
            }
        };
        let dropped = placed.iter().filter(|p| p.is_ok()).count();
        if dropped > 0 {
            tracing::info!(partition = %id, records = dropped,
                "copies a remote child sent again are already stored here: not stored twice");
        }
        Ok(placed
            .into_iter()
            .map(|p| p.unwrap_or_else(|i| base + i as u64))
            .collect())
    }

    /// The window of `id`, from the origin headers of its last records.
    fn rebuild(&self, store: &Store, id: &PartitionId) -> Result<Window, StorageError> {
        let mut window = Window::default();
        for_each_tail_record(store, id, self.capacity, |record| {
            if let Some(h) = record.headers.iter().find(|h| h.name == ORIGIN_HEADER) {
                window.remember(key_of(&h.value), record.offset, self.capacity);
            }
        })?;
        Ok(window)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use narad_storage::{Header, LogConfig, StoreOptions};

    use super::*;

    fn copy(origin: &str, value: &str) -> NewRecord {
        NewRecord {
            key: Some(Bytes::from_static(b"k")),
            headers: vec![Header {
                name: ORIGIN_HEADER.into(),
                value: Bytes::from(origin.to_owned()),
            }],
            value: Some(Bytes::from(value.to_owned())),
        }
    }

    fn plain(value: &str) -> NewRecord {
        NewRecord {
            key: None,
            headers: Vec::new(),
            value: Some(Bytes::from(value.to_owned())),
        }
    }

    #[test]
    fn a_copy_held_with_the_same_content_is_answered_where_it_is_and_anything_else_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let id = PartitionId::new("copies", 0);
        let open = || {
            let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
            if !store.has_partition(&id) {
                store.create_partition(&id, LogConfig::default()).unwrap();
            }
            store
        };
        let store = open();
        let windows = CopyWindows::default();
        let first = windows
            .append(
                &store,
                &id,
                vec![copy("s/e/0/1", "a"), copy("s/e/0/2", "b")],
            )
            .unwrap();
        assert_eq!(first, [0, 1]);
        // Sent again with one new copy, a plain record, and a held origin with other content.
        let again = windows
            .append(
                &store,
                &id,
                vec![
                    copy("s/e/0/1", "a"),
                    copy("s/e/0/2", "b"),
                    plain("p"),
                    copy("s/e/0/1", "other"),
                    copy("s/e/0/3", "c"),
                ],
            )
            .unwrap();
        assert_eq!(again, [0, 1, 2, 3, 4]);
        assert_eq!(store.high_watermark(&id).unwrap(), 5);
        // A plain record is stored every time: only copies are known again.
        assert_eq!(windows.append(&store, &id, vec![plain("p")]).unwrap(), [5]);
        drop(store);

        // After a restart the window is filled from the tail: the repeat is still known.
        let store = open();
        let windows = CopyWindows::default();
        let after = windows
            .append(
                &store,
                &id,
                vec![copy("s/e/0/3", "c"), copy("s/e/0/4", "d")],
            )
            .unwrap();
        assert_eq!(after, [4, 6]);
        assert_eq!(store.high_watermark(&id).unwrap(), 7);
    }

    #[test]
    fn a_copy_whose_origin_left_the_window_is_stored_again_never_dropped_unsure() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let id = PartitionId::new("copies", 0);
        store.create_partition(&id, LogConfig::default()).unwrap();
        let windows = CopyWindows::with_capacity(2);
        windows
            .append(
                &store,
                &id,
                vec![copy("o/1", "a"), copy("o/2", "b"), copy("o/3", "c")],
            )
            .unwrap();
        let again = windows.append(&store, &id, vec![copy("o/1", "a")]).unwrap();
        assert_eq!(again, [3], "forgotten, so stored again");
    }
}
