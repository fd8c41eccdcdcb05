//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

pub mod full_device;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_storage::fs::FileSystem;
use narad_storage::{
    AppendBatch, Header, LogConfig, ManualClock, NewRecord, PartitionId, ReadOptions, Store,
    StoreOptions, StoredRecord,
};

/// A fixed start time for test clocks: 2026-01-01T00:00:00Z.
pub const T0_MS: i64 = 1_767_225_600_000;

pub fn opts(fs: Arc<dyn FileSystem>, clock: Arc<ManualClock>) -> StoreOptions {
    StoreOptions {
        fs,
        clock,
        idle_close_after: Duration::from_secs(60),
        // Long enough that a failed partition stays failed for a whole test unless the test
        // asks otherwise.
        failed_reopen_after: Duration::from_secs(3600),
    }
}

/// The store at `/data` on `fs` with partition `t/0` (1 MiB segments), its clock at
/// [`T0_MS`]: what the fault tests reopen after each injected failure or crash.
pub fn open_t0_on(fs: &narad_storage::fault::FaultFs) -> narad_storage::Result<Store> {
    let store = Store::open(
        Path::new("/data"),
        opts(Arc::new(fs.clone()), Arc::new(ManualClock::new(T0_MS))),
    )?;
    store.create_partition(&pid("t", 0), small_segments(1 << 20))?;
    Ok(store)
}

pub fn real_store(dir: &Path, clock: Arc<ManualClock>) -> Store {
    Store::open(dir, opts(Arc::new(narad_storage::fs::RealFs), clock)).unwrap()
}

pub fn pid(topic: &str, partition: u32) -> PartitionId {
    PartitionId::new(topic, partition)
}

pub fn small_segments(bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes: bytes,
        ..LogConfig::default()
    }
}

pub fn rec(key: Option<&str>, value: &str) -> NewRecord {
    NewRecord {
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        headers: vec![Header {
            name: "h".into(),
            value: Bytes::from_static(b"x"),
        }],
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
    }
}

pub fn batch(values: &[&str]) -> AppendBatch {
    AppendBatch {
        records: values.iter().map(|v| rec(Some("k"), v)).collect(),
        origin: None,
    }
}

pub fn read_from(offset: u64) -> ReadOptions {
    ReadOptions {
        offset,
        max_records: usize::MAX,
        max_bytes: usize::MAX,
        max_committed_at_ms: None,
    }
}

/// Reads everything from `offset` to the high watermark.
pub fn read_all(store: &Store, id: &PartitionId, offset: u64) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    let mut next = offset;
    loop {
        let r = store.read(id, &read_from(next)).unwrap();
        if r.records.is_empty() {
            return out;
        }
        next = r.next_offset;
        out.extend(r.records);
    }
}

pub fn values(records: &[StoredRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.as_deref().unwrap_or_default().to_vec()).unwrap())
        .collect()
}

/// A closed log in `partition_dir` loses the last 3 bytes of its last segment and its
/// high-watermark file, as a power loss can leave it: the next open cuts the torn record.
pub fn tear_the_last_record(partition_dir: &Path) {
    std::fs::remove_file(partition_dir.join("high-watermark")).unwrap();
    let segment = std::fs::read_dir(partition_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    file.set_len(file.metadata().unwrap().len() - 3).unwrap();
}
