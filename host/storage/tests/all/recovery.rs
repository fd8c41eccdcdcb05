//! Recovery on open: torn tails are cut, damage where acknowledged records live quarantines the
//! partition, and acknowledged records are never lost or altered.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use narad_storage::fs::{FileSystem, OpenMode, RealFs};
use narad_storage::log::format::FrameError;
use narad_storage::log::hwm;
use narad_storage::log::segment::{self, Scan, Scanner};
use narad_storage::{Damage, ManualClock, PartitionState, StorageError, StoredRecord};
use proptest::prelude::*;

fn partition_dir(data: &Path) -> PathBuf {
    data.join("topics/t/p00000")
}

fn last_segment(data: &Path) -> PathBuf {
    segment::list(&RealFs, &partition_dir(data))
        .unwrap()
        .pop()
        .unwrap()
        .path
}

/// Writes `n` single-record batches, optionally closing cleanly.
fn write_log(data: &Path, segment_bytes: u64, n: usize, clean: bool) -> Vec<StoredRecord> {
    let store = real_store(data, Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store
        .create_partition(&id, small_segments(segment_bytes))
        .unwrap();
    for i in 0..n {
        store.append(&id, batch(&[&format!("rec-{i}")])).unwrap();
    }
    let all = read_all(&store, &id, 0);
    if clean {
        store.close().unwrap();
    }
    all
}

fn reopen(data: &Path) -> narad_storage::Store {
    let store = real_store(data, Arc::new(ManualClock::new(T0_MS)));
    store
        .create_partition(&pid("t", 0), small_segments(1 << 20))
        .unwrap();
    store
}

fn flip(path: &Path, pos: u64, mask: u8) {
    let f = RealFs.open(path, OpenMode::ReadWrite).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, pos).unwrap();
    b[0] ^= mask;
    f.write_all_at(&b, pos).unwrap();
}

fn expect_quarantined(store: &narad_storage::Store) -> Damage {
    let id = pid("t", 0);
    let reason = match store.read(&id, &read_from(0)) {
        Err(StorageError::Quarantined { reason, .. }) => *reason,
        other => panic!("expected Quarantined, got {other:?}"),
    };
    assert!(matches!(
        store.append(&id, batch(&["x"])),
        Err(StorageError::Quarantined { .. })
    ));
    assert!(matches!(
        store.peek(&id).unwrap().state,
        PartitionState::Quarantined { .. }
    ));
    reason
}

#[test]
fn torn_tail_is_truncated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let acked = write_log(dir.path(), 1 << 20, 5, false);
    // A crash in the middle of the next append leaves half a frame.
    let seg = last_segment(dir.path());
    let f = RealFs.open(&seg, OpenMode::ReadWrite).unwrap();
    let len = f.len().unwrap();
    let mut frame = vec![0u8; 40];
    f.read_exact_at(&mut frame, 0).unwrap();
    f.write_all_at(&frame, len).unwrap();

    let store = reopen(dir.path());
    assert_eq!(read_all(&store, &pid("t", 0), 0), acked);
    assert_eq!(
        std::fs::metadata(&seg).unwrap().len(),
        len,
        "cut back to the last frame"
    );
    assert_eq!(
        store
            .append(&pid("t", 0), batch(&["next"]))
            .unwrap()
            .base_offset,
        5
    );
}

#[test]
fn a_bad_frame_below_the_durable_boundary_quarantines_only_that_partition() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 1 << 20, 5, true);
    // Another healthy partition in the same store.
    {
        let store = reopen(dir.path());
        store
            .create_partition(&pid("other", 0), small_segments(1 << 20))
            .unwrap();
        store.append(&pid("other", 0), batch(&["fine"])).unwrap();
        store.close().unwrap();
    }
    let seg = last_segment(dir.path());
    let len = std::fs::metadata(&seg).unwrap().len();
    // Damage the last frame: past it there is nothing, but the clean close put the durable
    // boundary at the end of the file, so this is corruption, not a torn tail.
    flip(&seg, len - 2, 0x01);

    let store = reopen(dir.path());
    store
        .create_partition(&pid("other", 0), small_segments(1 << 20))
        .unwrap();
    match expect_quarantined(&store) {
        Damage::BadFrameBelowBoundary {
            segment,
            position,
            error: FrameError::CrcMismatch { stored, computed },
        } => {
            assert_eq!(segment, seg);
            assert!(
                position < len - 2,
                "the frame starts before the flipped byte"
            );
            assert_ne!(stored, computed);
        }
        other => panic!("expected a bad frame below the boundary, got {other:?}"),
    }
    assert_eq!(
        std::fs::metadata(&seg).unwrap().len(),
        len,
        "nothing was cut"
    );
    assert_eq!(values(&read_all(&store, &pid("other", 0), 0)), ["fine"]);
    store.append(&pid("other", 0), batch(&["still"])).unwrap();
}

#[test]
fn a_bad_frame_followed_by_a_valid_frame_quarantines_even_past_the_boundary() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 1 << 20, 5, false);
    let seg = last_segment(dir.path());
    let h = hwm::read(&RealFs, &partition_dir(dir.path()))
        .unwrap()
        .unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    // Damage the first frame past the boundary that has a frame after it.
    let f = RealFs.open(&seg, OpenMode::Read).unwrap();
    let mut sc = Scanner::new(f.as_ref(), 0, len);
    let mut starts = Vec::new();
    while let Scan::Frame { pos, .. } = sc.next_frame().unwrap() {
        starts.push(pos);
    }
    let victim = starts
        .iter()
        .copied()
        .filter(|&p| p >= h.segment_pos)
        .find(|&p| p != *starts.last().unwrap())
        .expect("boundary is at the start when the log was opened empty");
    flip(&seg, victim + 20, 0x80);
    let store = reopen(dir.path());
    match expect_quarantined(&store) {
        Damage::BadFrameBeforeValidFrame {
            segment,
            position,
            error: FrameError::CrcMismatch { .. },
            valid_at,
        } => {
            assert_eq!(segment, seg);
            assert_eq!(position, victim);
            assert!(valid_at > victim, "{valid_at}");
        }
        Damage::BadFrameBelowBoundary {
            segment, position, ..
        } => {
            assert_eq!((segment, position), (seg, victim));
        }
        other => panic!("expected a bad frame before a valid one, got {other:?}"),
    }
}

#[test]
fn a_segment_cut_short_below_the_boundary_quarantines() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 1 << 20, 5, true);
    let seg = last_segment(dir.path());
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let store = reopen(dir.path());
    assert_eq!(
        expect_quarantined(&store),
        Damage::SegmentShorterThanDurable {
            segment: seg,
            len: len - 10,
            durable_len: len,
        }
    );
}

#[test]
fn a_missing_middle_segment_quarantines() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 100, 5, true);
    let segs = segment::list(&RealFs, &partition_dir(dir.path())).unwrap();
    assert!(segs.len() >= 3);
    std::fs::remove_file(&segs[1].path).unwrap();
    let store = reopen(dir.path());
    assert_eq!(
        expect_quarantined(&store),
        Damage::SegmentOutOfSequence {
            segment: segs[2].path.clone(),
            base: segs[2].base,
            expected: segs[1].base,
        }
    );
}

/// Where each frame of the partition lives: (segment index, start, end, base offset).
fn frame_map(data: &Path) -> Vec<(usize, u64, u64, u64)> {
    let mut out = Vec::new();
    for (i, s) in segment::list(&RealFs, &partition_dir(data))
        .unwrap()
        .iter()
        .enumerate()
    {
        let f = RealFs.open(&s.path, OpenMode::Read).unwrap();
        let mut sc = Scanner::new(f.as_ref(), 0, s.len);
        loop {
            match sc.next_frame().unwrap() {
                Scan::Frame { pos, header, bytes } => {
                    out.push((i, pos, pos + bytes.len() as u64, header.base_offset))
                }
                Scan::End => break,
                Scan::Bad { pos, error } => panic!("undamaged log is bad at {pos}: {error}"),
                other => panic!("a plain scan only reads frames, got {other:?}"),
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Any single bit flip or truncation anywhere in a multi-batch, multi-segment log: past
    /// the durable boundary, damage to the last frame is cut as a torn tail and every record
    /// before it reads back unchanged; anywhere else the partition is quarantined and
    /// nothing is cut.
    #[test]
    fn damage_anywhere_is_cut_as_a_torn_tail_or_quarantined_and_never_alters_records(
        batches in proptest::collection::vec(1usize..4, 3..9),
        clean in any::<bool>(),
        at in any::<proptest::sample::Index>(),
        truncate in any::<bool>(),
        bit in 0u8..8,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let acked = {
            let store = real_store(data, Arc::new(ManualClock::new(T0_MS)));
            let id = pid("t", 0);
            store.create_partition(&id, small_segments(300)).unwrap();
            for (b, n) in batches.iter().enumerate() {
                let vals: Vec<String> = (0..*n).map(|r| format!("b{b}-r{r}-{}", "v".repeat(b * 7))).collect();
                let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
                store.append(&id, batch(&refs)).unwrap();
            }
            let all = read_all(&store, &id, 0);
            if clean {
                store.close().unwrap();
            }
            all
        };
        let segs = segment::list(&RealFs, &partition_dir(data)).unwrap();
        let frames = frame_map(data);
        let h = hwm::read(&RealFs, &partition_dir(data)).unwrap();
        let total: u64 = segs.iter().map(|s| s.len).sum();
        let mut g = at.index(total as usize) as u64;
        let mut si = 0;
        while g >= segs[si].len {
            g -= segs[si].len;
            si += 1;
        }
        let (seg, pos) = (&segs[si], g);
        if truncate {
            std::fs::OpenOptions::new().write(true).open(&seg.path).unwrap().set_len(pos).unwrap();
        } else {
            flip(&seg.path, pos, 1 << bit);
        }

        // What the rules say must happen.
        let boundary = match h {
            Some(h) if h.segment_base >= segs[0].base => (h.segment_base, h.segment_pos),
            _ => (segs[0].base, 0),
        };
        let frame = frames.iter().find(|f| f.0 == si && f.1 <= pos && pos < f.2).unwrap();
        let last_frame_of_seg = frames.iter().rfind(|f| f.0 == si).unwrap();
        let is_last_seg = si + 1 == segs.len();
        let below = seg.base < boundary.0 || (seg.base == boundary.0 && pos < boundary.1);
        let quarantine = !is_last_seg || below || (!truncate && frame != last_frame_of_seg);

        let store = reopen(data);
        let id = pid("t", 0);
        if quarantine {
            expect_quarantined(&store);
            let after = std::fs::metadata(&seg.path).unwrap().len();
            let expected_len = if truncate { pos } else { seg.len };
            prop_assert_eq!(after, expected_len, "a quarantined partition is not cut");
        } else {
            let got = read_all(&store, &id, 0);
            let keep: Vec<StoredRecord> = acked.iter().filter(|r| r.offset < frame.3).cloned().collect();
            prop_assert_eq!(&got, &keep);
            let next = store.append(&id, batch(&["after"])).unwrap();
            prop_assert_eq!(next.base_offset, frame.3);
        }
    }
}
