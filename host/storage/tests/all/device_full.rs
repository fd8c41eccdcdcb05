//! The store on a real device that runs out of space under ext4 (see [`DiskFullFs`]). On
//! Linux 6.18 the write that crosses into the missing space gets a successful `fdatasync`
//! while the device holds zeros for part of it, and the file system's extent map shows the
//! range as written: only reading the bytes back from the device can tell. The store must
//! refuse that append, and after a remount every append it acknowledged must read back as it
//! was written.
//!
//! Needs root, as [`DiskFullFs`] says.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use narad_storage::fs::RealFs;
use narad_storage::{AppendBatch, ManualClock, NewRecord, Store};

use crate::common::full_device::DiskFullFs;
use crate::common::*;

/// Bytes of each record's value: one record per append, about 64 KiB a frame, the size at
/// which the false `fdatasync` showed in every run of a probe on this kernel.
const VALUE_BYTES: usize = 64 * 1024 - 512;
/// Appends tried before giving up on filling the device (the tmpfs holds about 20 MiB).
const MAX_APPENDS: usize = 2_000;
/// Failed appends after which the fill stops: well past the first one.
const FAILURES_TO_SEE: usize = 20;

/// The value of the `n`th append: a byte pattern of its own, so a misplaced or zeroed range
/// cannot match another append's value.
fn value(n: usize) -> Bytes {
    let mut v = vec![0u8; VALUE_BYTES];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (n.wrapping_mul(31).wrapping_add(i / 7) % 251) as u8 + 1;
    }
    Bytes::from(v)
}

fn one_record(n: usize) -> AppendBatch {
    AppendBatch {
        records: vec![NewRecord {
            key: None,
            headers: Vec::new(),
            value: Some(value(n)),
        }],
        origin: None,
    }
}

#[test]
fn an_append_the_device_did_not_keep_is_refused_and_every_acknowledged_one_survives_a_remount() {
    let mut disk = DiskFullFs::new();
    let dir = disk.data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let id = pid("t", 0);
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = Store::open(&dir, opts(Arc::new(RealFs), Arc::clone(&clock))).unwrap();
    store
        .create_partition(&id, small_segments(128 << 20))
        .unwrap();

    // Offset -> append number, for every acknowledged append.
    let mut acknowledged = BTreeMap::new();
    let mut errors = Vec::new();
    for n in 0..MAX_APPENDS {
        match store.append(&id, one_record(n)) {
            Ok(a) => {
                acknowledged.insert(a.base_offset, n);
            }
            Err(e) => errors.push(format!("append {n}: {e}")),
        }
        if errors.len() >= FAILURES_TO_SEE {
            break;
        }
    }
    assert!(
        errors.len() >= FAILURES_TO_SEE,
        "the device never ran out of space ({} appends acknowledged)",
        acknowledged.len()
    );
    let refused = errors
        .iter()
        .find(|e| e.contains("read back from the device"))
        .cloned();
    eprintln!(
        "device_full: {} appends acknowledged; the first refused: {}",
        acknowledged.len(),
        errors[0]
    );

    drop(store);
    disk.unmount_ext4();
    disk.grow_tmpfs();
    let fsck = disk.repair_ext4();
    eprintln!(
        "device_full: e2fsck after the unmount:\n{}",
        fsck.trim_end()
    );
    disk.mount_ext4();

    // As the daemon does at start for every partition its metadata names.
    let store = Store::open(&dir, opts(Arc::new(RealFs), clock)).unwrap();
    store
        .create_partition(&id, small_segments(128 << 20))
        .unwrap();
    let mut read = BTreeMap::new();
    let mut next = 0;
    loop {
        let r = store
            .read(&id, &read_from(next))
            .unwrap_or_else(|e| panic!("reading t/0 from offset {next} after the remount: {e}"));
        if r.records.is_empty() {
            break;
        }
        next = r.next_offset;
        for rec in r.records {
            read.insert(rec.offset, rec.value);
        }
    }
    let lost: Vec<u64> = acknowledged
        .iter()
        .filter(|(offset, n)| read.get(offset) != Some(&Some(value(**n))))
        .map(|(offset, _)| *offset)
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged appends are missing or changed after the remount, at offsets {:?}",
        lost.len(),
        acknowledged.len(),
        &lost[..lost.len().min(10)]
    );
    drop(store);
    // Checked last, so that a store without the read-back fails above, on the loss itself.
    assert!(
        refused.is_some(),
        "no append was refused for bytes the device did not keep, so this run did not exercise \
         the read-back (errors: {:#?})",
        &errors[..errors.len().min(5)]
    );
}
