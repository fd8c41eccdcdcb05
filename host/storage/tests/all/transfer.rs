//! A planned move's storage half: seal, describe, copy in chunks, install, and the refusals.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use crate::common::*;
use narad_storage::transfer::MAX_CHUNK_BYTES;
use narad_storage::{LogConfig, ManualClock, PartitionState, StorageError, Store};

/// Copies sealed `id` from `from` into `to` the way a move does: manifest, chunks, install.
fn copy(from: &Store, to: &Store, id: &narad_storage::PartitionId, chunk: u64) {
    let manifest = from.manifest(id).unwrap();
    let staging = to.stage(id).unwrap();
    for entry in &manifest.files {
        let mut file = staging.create(&entry.name).unwrap();
        loop {
            let bytes = from
                .read_sealed_file(id, &entry.name, file.len(), chunk)
                .unwrap();
            if bytes.is_empty() {
                break;
            }
            file.write(&bytes).unwrap();
        }
        file.finish(entry).unwrap();
    }
    staging.install().unwrap();
}

#[test]
fn a_sealed_partition_copied_in_chunks_opens_elsewhere_with_every_record_and_its_end() {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = real_store(a_dir.path(), clock.clone());
    let b = real_store(b_dir.path(), clock.clone());
    let id = pid("orders", 2);
    let config = LogConfig {
        segment_bytes: 4096,
        ..LogConfig::default()
    };
    a.create_partition(&id, config.clone()).unwrap();
    let words: Vec<String> = (0..300).map(|i| format!("record-{i:04}")).collect();
    for chunk in words.chunks(7) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        a.append(&id, batch(&refs)).unwrap();
    }
    a.seal(&id).unwrap();
    a.seal(&id).unwrap(); // idempotent
    let manifest = a.manifest(&id).unwrap();
    assert_eq!(manifest.high_watermark, 300);
    assert!(
        manifest
            .files
            .iter()
            .filter(|f| f.name.ends_with(".log"))
            .count()
            > 1,
        "several segments: {:?}",
        manifest.files
    );
    // Chunks far smaller than a segment, so every file takes several.
    copy(&a, &b, &id, 1000);
    b.create_partition(&id, config).unwrap();
    assert_eq!(b.high_watermark(&id).unwrap(), 300);
    let read = b.read(&id, &read_from(0)).unwrap();
    let mut got = values(&read.records);
    let mut next = read.next_offset;
    while next < 300 {
        let more = b.read(&id, &read_from(next)).unwrap();
        got.extend(values(&more.records));
        next = more.next_offset;
    }
    assert_eq!(got, words);
    // The copy appends after the moved records.
    assert_eq!(b.append(&id, batch(&["after"])).unwrap().base_offset, 300);
}

#[test]
fn a_sealed_partition_refuses_appends_but_serves_reads_until_unsealed() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a"])).unwrap();
    store.seal(&id).unwrap();
    assert!(store.is_sealed(&id));
    assert_eq!(store.sealed_partitions(), vec![id.clone()]);
    assert!(matches!(
        store.append(&id, batch(&["lost?"])),
        Err(StorageError::Sealed { .. })
    ));
    // Reads go on while the files are copied.
    assert_eq!(
        values(&store.read(&id, &read_from(0)).unwrap().records),
        ["a"]
    );
    let stats = store.peek(&id).unwrap();
    assert_eq!(stats.state, PartitionState::Sealed);
    assert_eq!(stats.high_watermark, Some(1));
    store.unseal(&id).unwrap();
    assert!(!store.is_sealed(&id));
    assert_eq!(store.append(&id, batch(&["b"])).unwrap().base_offset, 1);
    // Not sealed: its files are not served.
    assert!(matches!(
        store.manifest(&id),
        Err(StorageError::NoSuchFile { .. })
    ));
}

#[test]
fn a_file_reads_whole_when_small_and_names_outside_the_partition_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a"])).unwrap();
    store.seal(&id).unwrap();
    let hwm = store
        .read_sealed_file(&id, "high-watermark", 0, u64::MAX)
        .unwrap();
    assert_eq!(hwm.len(), 64);
    for bad in ["../../LOCK", "/etc/passwd", "missing.log"] {
        assert!(
            matches!(
                store.read_sealed_file(&id, bad, 0, 10),
                Err(StorageError::NoSuchFile { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn a_corrupted_chunk_is_caught_before_install_and_an_occupied_target_is_refused() {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = real_store(a_dir.path(), clock.clone());
    let b = real_store(b_dir.path(), clock.clone());
    let id = pid("t", 1);
    a.create_partition(&id, LogConfig::default()).unwrap();
    a.append(&id, batch(&["a", "b"])).unwrap();
    a.seal(&id).unwrap();
    let manifest = a.manifest(&id).unwrap();
    let segment = manifest
        .files
        .iter()
        .find(|f| f.name.ends_with(".log"))
        .unwrap();
    let staging = b.stage(&id).unwrap();
    let mut file = staging.create(&segment.name).unwrap();
    let mut bytes = a
        .read_sealed_file(&id, &segment.name, 0, MAX_CHUNK_BYTES)
        .unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    file.write(&bytes).unwrap();
    assert!(matches!(
        file.finish(segment),
        Err(StorageError::CopyMismatch { .. })
    ));
    staging.abandon();
    // A directory already where the copy would go is not overwritten.
    b.create_partition(&id, LogConfig::default()).unwrap();
    let staging = b.stage(&id).unwrap();
    assert!(matches!(
        staging.install(),
        Err(StorageError::InstallTargetExists { .. })
    ));
}

#[test]
fn removing_a_moved_away_partition_unregisters_it_and_deletes_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a"])).unwrap();
    store.seal(&id).unwrap();
    store.remove_partition(&id).unwrap();
    assert!(!store.has_partition(&id));
    assert!(!dir.path().join("topics/t").join(id.dir_name()).exists());
    store.remove_partition(&id).unwrap(); // unknown: fine
}

#[test]
fn an_empty_log_laid_out_at_an_offset_opens_there_appends_there_and_keeps_it_across_a_restart() {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let dir = tempfile::tempdir().unwrap();
    let id = pid("orders", 1);
    {
        let store = real_store(dir.path(), clock.clone());
        let staging = store.stage(&id).unwrap();
        staging.write_empty_log(1_000).unwrap();
        staging.install().unwrap();
        store.create_partition(&id, LogConfig::default()).unwrap();
        assert_eq!(store.high_watermark(&id).unwrap(), 1_000);
        assert_eq!(store.peek(&id).unwrap().log_start_offset, 1_000);
        // Offsets the old log used are not handed out again, nor read as records.
        assert!(matches!(
            store.read(&id, &read_from(0)),
            Err(StorageError::OffsetBelowLogStart {
                log_start: 1_000,
                ..
            })
        ));
        assert_eq!(
            store.append(&id, batch(&["a", "b"])).unwrap().base_offset,
            1_000
        );
        store.close().unwrap();
    }
    let store = real_store(dir.path(), clock);
    store.create_partition(&id, LogConfig::default()).unwrap();
    assert_eq!(store.high_watermark(&id).unwrap(), 1_002);
    let read = store.read(&id, &read_from(1_000)).unwrap();
    assert_eq!(values(&read.records), ["a", "b"]);
    assert_eq!(store.append(&id, batch(&["c"])).unwrap().base_offset, 1_002);
}
