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

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use std::hash::BuildHasher as _;

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

/// An origin header split into its stream (everything before the last `/`: source, attach
/// epoch, parent partition) and the parent offset after it; `None` for a value of another
/// shape (a producer's own header).
fn split_origin(value: &[u8]) -> Option<(&[u8], u64)> {
    let slash = value.iter().rposition(|&b| b == b'/')?;
    let offset = std::str::from_utf8(&value[slash + 1..])
        .ok()?
        .parse()
        .ok()?;
    Some((&value[..slash], offset))
}

/// Most streams a window keeps in order; copies of further streams are remembered one by one.
/// A target partition hears from one stream per parent partition of every link copying into
/// it, so this only binds a producer inventing streams.
const MAX_STREAMS: usize = 4_096;

/// Hashes a key that is already the output of a window's keyed hash: as is.
#[derive(Debug, Default)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; anything else is folded in rather than lost.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// A map over keys from a window's keyed hash.
type ByKey<V> = HashMap<u64, V, std::hash::BuildHasherDefault<Prehashed>>;

/// Where a remembered copy sits, in arrival order.
#[derive(Debug)]
enum Slot {
    /// At the front of the stream of this key.
    Stream(u64),
    /// Among the scattered copies under this key, at this offset here.
    Scattered(u64, u64),
}

/// An origin header as a window files it, worked out once per record.
#[derive(Clone, Copy, Debug)]
enum Located {
    /// A stream's key and the parent offset.
    InStream(u64, u64),
    /// A header of another shape: the key of its whole value.
    Odd(u64),
}

/// The recent origin headers of one partition, each with the offset of the copy stored under
/// it. A remote child's cursor sends its parent partition's records in order, so most copies
/// extend their stream: each stream keeps its parent offsets ascending, and a new copy is
/// known to be new from its stream's last entry alone, without touching the rest (one map of
/// every header, as before, missed the cache twice a copy: `narad bench once` shows the cost).
/// A copy out of its stream's order (a parent that gave an offset to a new record, a header of
/// another shape, a stream past [`MAX_STREAMS`]) is kept scattered. Keys are hashed with this
/// window's own random keys, so nobody can aim collisions at it; a collision would only cost
/// the content check a read.
#[derive(Debug, Default)]
struct Window {
    keys: std::hash::RandomState,
    /// Per stream key: parent offsets ascending, each with the offset of its copy here.
    streams: ByKey<VecDeque<(u64, u64)>>,
    /// Copies out of their stream's order, by [`Window::scattered_key`] -> offset here.
    scattered: ByKey<u64>,
    arrival: VecDeque<Slot>,
}

impl Window {
    /// Where each record's origin header files, `None` for a record without one. Consecutive
    /// records of one stream (the common case) hash its name once.
    fn locate(&self, records: &[NewRecord]) -> Vec<Option<Located>> {
        let mut last: Option<(&[u8], u64)> = None;
        records
            .iter()
            .map(|record| {
                let origin = origin_of(record)?;
                Some(match split_origin(origin) {
                    Some((stream, offset)) => {
                        let key = match last {
                            Some((name, key)) if name == stream => key,
                            _ => {
                                let key = self.keys.hash_one(stream);
                                last = Some((stream, key));
                                key
                            }
                        };
                        Located::InStream(key, offset)
                    }
                    None => Located::Odd(self.keys.hash_one(origin)),
                })
            })
            .collect()
    }

    fn scattered_key(&self, at: Located) -> u64 {
        match at {
            Located::InStream(stream, offset) => self.keys.hash_one((stream, offset)),
            Located::Odd(key) => key,
        }
    }

    /// Where the copy filed at `at` is stored here, if remembered. A scattered copy comes first:
    /// it came after its stream had passed it, so it is the newer of two under one header.
    fn lookup(&self, at: Located) -> Option<u64> {
        if !self.scattered.is_empty()
            && let Some(&stored) = self.scattered.get(&self.scattered_key(at))
        {
            return Some(stored);
        }
        let Located::InStream(stream, offset) = at else {
            return None;
        };
        let copies = self.streams.get(&stream)?;
        // A copy past its stream's last is new: the common path reads nothing else.
        if copies.back().is_none_or(|&(last, _)| last < offset) {
            return None;
        }
        let i = copies.binary_search_by_key(&offset, |&(o, _)| o).ok()?;
        Some(copies[i].1)
    }

    fn remember(&mut self, at: Located, stored: u64, capacity: usize) {
        let in_order = match at {
            Located::InStream(key, offset) => {
                let room = self.streams.len() < MAX_STREAMS;
                match self.streams.get_mut(&key) {
                    Some(copies) if copies.back().is_none_or(|&(last, _)| last < offset) => {
                        copies.push_back((offset, stored));
                        true
                    }
                    Some(_) => false,
                    None if room => {
                        self.streams.insert(key, VecDeque::from([(offset, stored)]));
                        true
                    }
                    None => false,
                }
            }
            Located::Odd(_) => false,
        };
        let slot = match (in_order, at) {
            (true, Located::InStream(key, _)) => Slot::Stream(key),
            _ => {
                let key = self.scattered_key(at);
                self.scattered.insert(key, stored);
                Slot::Scattered(key, stored)
            }
        };
        // The oldest leave first, so the queue never grows past its capacity (a full queue
        // that doubled for one more entry would hold twice the memory).
        while self.arrival.len() >= capacity.max(1) {
            match self.arrival.pop_front() {
                Some(Slot::Stream(key)) => {
                    if let Some(copies) = self.streams.get_mut(&key) {
                        copies.pop_front();
                        if copies.is_empty() {
                            self.streams.remove(&key);
                        }
                    }
                }
                Some(Slot::Scattered(key, stored)) => {
                    // Only the newest copy under a key removes it.
                    if self.scattered.get(&key) == Some(&stored) {
                        self.scattered.remove(&key);
                    }
                }
                None => break,
            }
        }
        self.arrival.push_back(slot);
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
        let located = window.locate(&records);
        let held_at: Vec<Option<u64>> = located
            .iter()
            .map(|at| at.and_then(|at| window.lookup(at)))
            .collect();
        let stored = stored_at(store, id, held_at.iter().flatten().copied())?;
        // Each record: `Ok(offset)` of its stored copy, or `Err(index)` in what is appended.
        let mut kept = Vec::with_capacity(records.len());
        let mut kept_at = Vec::with_capacity(records.len());
        let mut placed: Vec<Result<u64, usize>> = Vec::with_capacity(records.len());
        for ((record, at), held) in records.into_iter().zip(located).zip(held_at) {
            match held.and_then(|held| stored.get(&held).map(|old| (held, old))) {
                Some((held, old)) if same_content(&record, old) => placed.push(Ok(held)),
                _ => {
                    placed.push(Err(kept.len()));
                    kept.push(record);
                    kept_at.push(at);
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
                // Remembered only once the batch is durable.
                for (i, at) in kept_at.into_iter().enumerate() {
                    if let Some(at) = at {
                        window.remember(at, appended.base_offset + i as u64, self.capacity);
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
                let at = match split_origin(&h.value) {
                    Some((stream, offset)) => {
                        Located::InStream(window.keys.hash_one(stream), offset)
                    }
                    None => Located::Odd(window.keys.hash_one(&h.value[..])),
                };
                window.remember(at, record.offset, self.capacity);
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
    fn copies_out_of_their_streams_order_and_odd_headers_are_known_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let id = PartitionId::new("copies", 0);
        store.create_partition(&id, LogConfig::default()).unwrap();
        let windows = CopyWindows::default();
        let first = windows
            .append(
                &store,
                &id,
                vec![
                    copy("s/e/0/5", "a"),
                    copy("s/e/0/9", "b"),
                    copy("s/e/0/7", "late"),
                    copy("no-offset-here", "c"),
                    copy("s/e/1/2", "d"),
                ],
            )
            .unwrap();
        assert_eq!(first, [0, 1, 2, 3, 4]);
        // The parent gave offset 5 to a new record: stored, and then its repeat is known.
        let reused = windows
            .append(&store, &id, vec![copy("s/e/0/5", "new")])
            .unwrap();
        assert_eq!(reused, [5]);
        let again = windows
            .append(
                &store,
                &id,
                vec![
                    copy("s/e/0/5", "new"),
                    copy("s/e/0/9", "b"),
                    copy("s/e/0/7", "late"),
                    copy("no-offset-here", "c"),
                    copy("s/e/1/2", "d"),
                    copy("s/e/0/8", "unseen"),
                ],
            )
            .unwrap();
        assert_eq!(again, [5, 1, 2, 3, 4, 6]);
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
