//! Reads that take part of a large frame (a fan-out cursor's 4,096-record slabs out of a
//! producer's 16,384-record frames): they return exactly the records asked for, a frame is
//! checked once while its log is open, and damage is still found after a reopen.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use bytes::Bytes;
use narad_storage::fs::{FileSystem, OpenMode, RealFs};
use narad_storage::log::segment;
use narad_storage::{
    AppendBatch, BatchOrigin, EncodedBatch, Header, ManualClock, NewRecord, ReadOptions,
    StorageError, Store,
};
use proptest::prelude::*;

/// Records in the big frame: what `narad bench fanout` writes per parent batch.
const FRAME_RECORDS: usize = 16_384;
/// Records per slab read: the fan-out's `SLAB_MAX_RECORDS`.
const SLAB_RECORDS: usize = 4_096;

fn record(i: usize) -> NewRecord {
    NewRecord {
        key: (!i.is_multiple_of(3)).then(|| Bytes::from(format!("key-{}", i % 97))),
        headers: if i.is_multiple_of(5) {
            vec![Header {
                name: "n".into(),
                value: Bytes::from(format!("h{i}")),
            }]
        } else {
            Vec::new()
        },
        value: Some(Bytes::from(format!("value-{i:06}-{}", "x".repeat(i % 40)))),
    }
}

/// A store holding one partition whose first frame is `n` records (then one small frame).
fn store_with_frame(data: &Path, n: usize) -> Store {
    let store = real_store(data, Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store
        .create_partition(&id, small_segments(1 << 30))
        .unwrap();
    store
        .append(
            &id,
            AppendBatch {
                records: (0..n).map(record).collect(),
                origin: None,
            },
        )
        .unwrap();
    store
        .append(
            &id,
            AppendBatch {
                records: vec![record(n)],
                origin: None,
            },
        )
        .unwrap();
    store
}

fn slab(offset: u64, records: usize) -> ReadOptions {
    ReadOptions {
        offset,
        max_records: records,
        max_bytes: 4 * 1024 * 1024,
        max_committed_at_ms: None,
    }
}

fn segment_path(data: &Path) -> PathBuf {
    segment::list(&RealFs, &data.join("topics/t/p00000"))
        .unwrap()
        .remove(0)
        .path
}

/// Flips one bit of the last record's value of the big frame (the frame's last bytes, before
/// the small frame after it), under the open store, as a failing disk or a stray writer would.
fn damage_the_big_frame_tail(data: &Path) {
    let path = segment_path(data);
    let bytes = std::fs::read(&path).unwrap();
    // The small frame after the big one holds one record; find where the big one ends.
    let big_len = u32::from_le_bytes(bytes[6..10].try_into().unwrap()) as u64;
    let f = RealFs.open(&path, OpenMode::ReadWrite).unwrap();
    let at = big_len - 3;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, at).unwrap();
}

fn assert_records(got: &[narad_storage::StoredRecord], from: usize) {
    for (k, r) in got.iter().enumerate() {
        let want = record(from + k);
        assert_eq!(r.offset, (from + k) as u64);
        assert_eq!(r.key, want.key, "key of {}", from + k);
        assert_eq!(r.headers, want.headers, "headers of {}", from + k);
        assert_eq!(r.value, want.value, "value of {}", from + k);
    }
}

#[test]
fn four_slab_reads_of_a_16384_record_frame_return_exactly_its_records_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_frame(dir.path(), FRAME_RECORDS);
    let id = pid("t", 0);
    let mut next = 0u64;
    for _ in 0..FRAME_RECORDS / SLAB_RECORDS {
        let r = store.read(&id, &slab(next, SLAB_RECORDS)).unwrap();
        assert_eq!(r.records.len(), SLAB_RECORDS);
        assert_records(&r.records, next as usize);
        assert_eq!(r.next_offset, next + SLAB_RECORDS as u64);
        next = r.next_offset;
    }
    // The next read starts in the small frame after it.
    let r = store.read(&id, &slab(next, SLAB_RECORDS)).unwrap();
    assert_records(&r.records, FRAME_RECORDS);
    assert_eq!(r.records.len(), 1);
}

#[test]
fn a_frame_checked_by_a_first_slab_read_is_not_read_again_by_the_next_slabs() {
    // Proof that the next slabs come from the frame the first one checked, not from the file:
    // bytes damaged under the open log after that check are not seen (before the memo, every
    // slab read the frame again and the second one quarantined the partition).
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_frame(dir.path(), FRAME_RECORDS);
    let id = pid("t", 0);
    let first = store.read(&id, &slab(0, SLAB_RECORDS)).unwrap();
    assert_records(&first.records, 0);
    damage_the_big_frame_tail(dir.path());
    let mut next = first.next_offset;
    while next < FRAME_RECORDS as u64 {
        let r = store.read(&id, &slab(next, SLAB_RECORDS)).unwrap();
        assert_records(&r.records, next as usize);
        next = r.next_offset;
    }
    assert_eq!(next, FRAME_RECORDS as u64);
}

#[test]
fn a_frame_damaged_after_a_verified_read_is_refused_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let id = pid("t", 0);
    {
        let store = store_with_frame(dir.path(), FRAME_RECORDS);
        store.read(&id, &slab(0, SLAB_RECORDS)).unwrap();
        damage_the_big_frame_tail(dir.path());
        store.close().unwrap();
    }
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    store
        .create_partition(&id, small_segments(1 << 30))
        .unwrap();
    // Found by the reopen's recovery or by the first read, never trusted from before.
    match store.read(&id, &slab(SLAB_RECORDS as u64, SLAB_RECORDS)) {
        Err(StorageError::Quarantined { reason, .. }) => {
            assert!(
                reason.to_string().contains("byte 0: CRC-32C mismatch"),
                "{reason}"
            )
        }
        other => panic!("expected the damaged frame to be refused, got {other:?}"),
    }
}

#[test]
fn a_damaged_frame_is_refused_by_its_first_read_even_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_frame(dir.path(), FRAME_RECORDS);
    let id = pid("t", 0);
    damage_the_big_frame_tail(dir.path());
    // A read of records before the damaged bytes still checks the whole frame.
    match store.read(&id, &slab(0, SLAB_RECORDS)) {
        Err(StorageError::Quarantined { .. }) => {}
        other => panic!("expected a quarantine, got {other:?}"),
    }
}

#[test]
fn a_slab_encoded_for_a_child_decodes_back_to_its_records_and_origins_before_and_after_an_append() {
    // What a cross-node child commit does: a cursor encodes a bucket straight from the slab it
    // read, and, when the child partition lives elsewhere, takes the records and their
    // provenance back out of that frame to send them.
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_frame(dir.path(), 600);
    let id = pid("t", 0);
    let read = store.read(&id, &slab(100, 300)).unwrap();
    // Every other record, as a bucket of a keyed split would hold them.
    let bucket: Vec<_> = read.records.iter().step_by(2).collect();
    let origin = BatchOrigin {
        epoch: [9; 8],
        parent_partition: 4,
        slab_start: 100,
        parent_offsets: bucket.iter().map(|r| r.offset).collect(),
    };
    let mut encoded = EncodedBatch::encode(&bucket, Some(&origin)).unwrap();
    let want = AppendBatch {
        records: bucket
            .iter()
            .map(|r| NewRecord {
                key: r.key.clone(),
                headers: r.headers.clone(),
                value: r.value.clone(),
            })
            .collect(),
        origin: Some(origin),
    };
    assert_eq!(encoded.decode().unwrap(), want);

    // Appending seals the frame (offset, commit time, CRC): it still decodes the same, so a
    // batch whose local append failed can be sent elsewhere unchanged.
    let child = pid("child", 0);
    store
        .create_partition(&child, small_segments(1 << 30))
        .unwrap();
    store.append_encoded(&child, &mut encoded).unwrap();
    assert_eq!(encoded.decode().unwrap(), want);

    // A produce batch has no provenance, and decodes without one.
    let plain = EncodedBatch::encode(&[record(1), record(2)], None).unwrap();
    assert_eq!(
        plain.decode().unwrap(),
        AppendBatch {
            records: vec![record(1), record(2)],
            origin: None,
        }
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any sequence of reads of any sizes (records and bytes) from any starting offset returns
    /// exactly the records stored there, the same as one read of everything would.
    #[test]
    fn reads_of_any_size_inside_a_frame_return_exactly_the_records_there(
        n in 2usize..600,
        start in any::<prop::sample::Index>(),
        sizes in prop::collection::vec((1usize..300, 1usize..20_000), 1..8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_frame(dir.path(), n);
        let id = pid("t", 0);
        let mut next = start.index(n) as u64;
        for (records, bytes) in sizes {
            let r = store.read(&id, &ReadOptions {
                offset: next,
                max_records: records,
                max_bytes: bytes,
                max_committed_at_ms: None,
            }).unwrap();
            prop_assert!(!r.records.is_empty());
            prop_assert!(r.records.len() <= records);
            assert_records(&r.records, next as usize);
            prop_assert_eq!(r.next_offset, next + r.records.len() as u64);
            next = r.next_offset;
            if next > n as u64 {
                // At the end: the frame and the one-record frame after it are read.
                break;
            }
        }
    }
}

/// `count` records of about 600 bytes each whose values all name `tag` and their index.
fn tagged_frame(tag: char, count: usize) -> AppendBatch {
    AppendBatch {
        records: (0..count)
            .map(|i| NewRecord {
                key: Some(Bytes::from(format!("{tag}{i}"))),
                headers: Vec::new(),
                value: Some(Bytes::from(format!(
                    "{tag}-{i:06}-{}",
                    tag.to_string().repeat(580)
                ))),
            })
            .collect(),
        origin: None,
    }
}

fn assert_tagged(records: &[narad_storage::StoredRecord], tag: char, count: usize) {
    assert_eq!(records.len(), count, "frame {tag}");
    for (i, r) in records.iter().enumerate() {
        let want = format!("{tag}-{i:06}-{}", tag.to_string().repeat(580));
        assert_eq!(
            r.value.as_deref(),
            Some(want.as_bytes()),
            "frame {tag}, record {i}"
        );
        assert_eq!(r.key.as_deref(), Some(format!("{tag}{i}").as_bytes()));
    }
}

#[test]
fn large_reads_into_reused_buffers_return_only_their_own_frames_bytes() {
    // Frames of 0.6 to 1 MB: each read of one is lent a buffer from the store's pool, given
    // back when its records are dropped (here on other threads) and read into again, by a
    // longer frame, then a shorter one. Every read must return its own frame's bytes, none of
    // an earlier read's.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(real_store(dir.path(), Arc::new(ManualClock::new(T0_MS))));
    let id = pid("t", 0);
    store
        .create_partition(&id, small_segments(1 << 30))
        .unwrap();
    let frames = [('a', 1_200), ('b', 1_700), ('c', 1_000)];
    let mut starts = Vec::new();
    for (tag, count) in frames {
        starts.push(
            store
                .append(&id, tagged_frame(tag, count))
                .unwrap()
                .base_offset,
        );
    }
    let read_frame = |k: usize| {
        let (tag, count) = frames[k];
        let got = store.read(&id, &slab(starts[k], count)).unwrap().records;
        assert_tagged(&got, tag, count);
        got
    };
    for _ in 0..3 {
        // Each frame read and dropped in turn, on another thread than the one that read it.
        for k in [0, 1, 2, 1, 0, 2] {
            let records = read_frame(k);
            std::thread::spawn(move || drop(records)).join().unwrap();
        }
        // Frames `a` and `b` in one read, into the buffer `b` was just read into (longer than
        // `a`): after `a` the read must go to the file for `b`, not take the rest of the
        // buffer, which still holds the earlier read's bytes.
        drop(read_frame(1));
        let (a, b) = (frames[0], frames[1]);
        let both = store
            .read(&id, &slab(starts[0], a.1 + b.1))
            .unwrap()
            .records;
        assert_tagged(&both[..a.1], a.0, a.1);
        assert_tagged(&both[a.1..], b.0, b.1);
        drop(both);
        // All three alive at once: three buffers lent together, none shared.
        let held: Vec<_> = (0..3).map(read_frame).collect();
        for (k, records) in held.iter().enumerate() {
            assert_tagged(records, frames[k].0, frames[k].1);
        }
    }
}
