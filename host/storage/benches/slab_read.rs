//! CPU cost of a fan-out cursor's two storage steps, per record, for instruction counting
//! (`valgrind --tool=callgrind`) as well as wall time:
//!
//! - `read`: the parent holds frames of 16,384 records (what `narad bench fanout` writes per
//!   produce batch); a cursor reads them as 4,096-record slabs, one after another, to the end.
//! - `encode-old` / `encode-new`: a slab of 4,096 records read back becomes one child frame,
//!   the old way (rebuild every record as a `NewRecord`, clone the batch for the first try,
//!   encode) and the new way (encode straight from the stored records, nothing cloned).
//!
//! Run: `cargo bench -p narad-storage --bench slab_read -- <mode> <iterations>`. Under
//! callgrind, run the built bench binary twice with different iteration counts: the
//! difference divided by the extra records is the cost per record, setup excluded.
#![allow(missing_docs, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use narad_storage::{
    AppendBatch, BatchOrigin, Header, LogConfig, NewRecord, PartitionId, ReadOptions, Store,
    StoreOptions, StoredRecord,
};

/// Records per parent frame: `narad bench fanout`'s produce batch.
const FRAME_RECORDS: usize = 16_384;
/// Frames in the parent: more than the reader's memo keeps (4), so every frame is checked
/// once per pass, as on a long backlog.
const FRAMES: usize = 8;
/// Records per slab: the fan-out's `SLAB_MAX_RECORDS`.
const SLAB_RECORDS: usize = 4_096;
/// Value size: 100 bytes, `narad bench fanout`'s default record.
const VALUE_BYTES: usize = 100;

fn bench_dir() -> PathBuf {
    std::env::var_os("NARAD_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

fn parent(dir: &std::path::Path) -> (Store, PartitionId) {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    let id = PartitionId::new("parent", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    for f in 0..FRAMES {
        let records = (0..FRAME_RECORDS)
            .map(|i| NewRecord {
                key: Some(Bytes::from(format!(
                    "key-{}",
                    (f * FRAME_RECORDS + i) % 1000
                ))),
                headers: Vec::new(),
                value: Some(Bytes::from(vec![(i % 251) as u8; VALUE_BYTES])),
            })
            .collect();
        store
            .append(
                &id,
                AppendBatch {
                    records,
                    origin: None,
                },
            )
            .unwrap();
    }
    (store, id)
}

/// Reads the whole parent in slabs; returns the records read.
fn read_pass(store: &Store, id: &PartitionId) -> usize {
    let (mut next, mut total) = (0u64, 0usize);
    loop {
        let r = store
            .read(
                id,
                &ReadOptions {
                    offset: next,
                    max_records: SLAB_RECORDS,
                    max_bytes: 4 * 1024 * 1024,
                    max_committed_at_ms: None,
                },
            )
            .unwrap();
        if r.records.is_empty() {
            return total;
        }
        total += r.records.len();
        next = r.next_offset;
        std::hint::black_box(&r.records);
    }
}

fn origin(slab: &[StoredRecord]) -> BatchOrigin {
    BatchOrigin {
        epoch: [1; 8],
        parent_partition: 0,
        slab_start: slab[0].offset,
        parent_offsets: slab.iter().map(|r| r.offset).collect(),
    }
}

/// The old commit side: every record rebuilt, the batch cloned for the first try, encoded.
fn encode_old(slab: &[StoredRecord]) -> usize {
    let batch = AppendBatch {
        records: slab
            .iter()
            .map(|r| NewRecord {
                key: r.key.clone(),
                headers: r
                    .headers
                    .iter()
                    .map(|h| Header {
                        name: h.name.clone(),
                        value: h.value.clone(),
                    })
                    .collect(),
                value: r.value.clone(),
            })
            .collect(),
        origin: Some(origin(slab)),
    };
    let attempt = batch.clone();
    let mut frame = Vec::new();
    narad_storage::log::format::encode_batch(&attempt.records, attempt.origin.as_ref(), &mut frame)
        .unwrap();
    std::hint::black_box(&frame);
    frame.len()
}

// new-api-begin (the tree before EncodedBatch builds this bench without these lines)
fn encode_new(slab: &[StoredRecord]) -> usize {
    let refs: Vec<&StoredRecord> = slab.iter().collect();
    let batch = narad_storage::EncodedBatch::encode(&refs, Some(&origin(slab))).unwrap();
    std::hint::black_box(&batch);
    batch.frame_len()
}
// new-api-end

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mode = args.first().map_or("read", String::as_str).to_owned();
    let iterations: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let dir = tempfile::tempdir_in(bench_dir()).unwrap();
    let (store, id) = parent(dir.path());
    let start = Instant::now();
    let mut records = 0usize;
    match mode.as_str() {
        "read" => {
            for _ in 0..iterations {
                records += read_pass(&store, &id);
            }
        }
        "encode-old" | "encode-new" => {
            let slab = Arc::new(
                store
                    .read(
                        &id,
                        &ReadOptions {
                            offset: 0,
                            max_records: SLAB_RECORDS,
                            max_bytes: usize::MAX,
                            max_committed_at_ms: None,
                        },
                    )
                    .unwrap()
                    .records,
            );
            for _ in 0..iterations * FRAMES * FRAME_RECORDS / SLAB_RECORDS {
                // new-api-begin
                if mode == "encode-new" {
                    encode_new(&slab);
                    records += slab.len();
                    continue;
                }
                // new-api-end
                encode_old(&slab);
                records += slab.len();
            }
        }
        other => panic!("unknown mode {other}: read, encode-old or encode-new"),
    }
    let elapsed = start.elapsed();
    println!(
        "{mode}: {records} records in {:.1} ms, {:.1} ns/record",
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_nanos() as f64 / records.max(1) as f64
    );
}
