//! The long-poll wakes on appends and times out otherwise, without polling.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use narad_storage::{LogConfig, ManualClock, StorageError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reader_wakes_when_a_record_is_appended() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(real_store(dir.path(), Arc::new(ManualClock::new(T0_MS))));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a"])).unwrap();

    // Data already there: resolves at once.
    assert!(
        store
            .wait_for_data(&id, 0, Duration::from_secs(60))
            .await
            .unwrap()
    );

    let waiter = {
        let (store, id) = (store.clone(), id.clone());
        // A generous bound: the test passes as soon as the append lands, and only a missing
        // wake-up would make it run into the bound (and fail).
        tokio::spawn(async move { store.wait_for_data(&id, 1, Duration::from_secs(120)).await })
    };
    tokio::task::yield_now().await;
    let (store2, id2) = (store.clone(), id.clone());
    tokio::task::spawn_blocking(move || store2.append(&id2, batch(&["b"])).unwrap())
        .await
        .unwrap();
    assert!(waiter.await.unwrap().unwrap(), "woken by the append");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_reader_gets_false_when_nothing_arrives_before_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let store = real_store(dir.path(), Arc::new(ManualClock::new(T0_MS)));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a"])).unwrap();
    let started = tokio::time::Instant::now();
    assert!(
        !store
            .wait_for_data(&id, 1, Duration::from_secs(5))
            .await
            .unwrap()
    );
    // Paused time: exactly the timeout elapsed on the virtual clock.
    assert!(started.elapsed() >= Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_closed_log_with_a_clean_high_watermark_is_waited_on_without_opening_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a", "b"])).unwrap();
    clock.advance(120_000);
    assert_eq!(store.close_idle(), 1);
    assert!(
        store
            .wait_for_data(&id, 1, Duration::from_secs(1))
            .await
            .unwrap()
    );
    assert!(
        !store
            .wait_for_data(&id, 2, Duration::from_secs(1))
            .await
            .unwrap()
    );
    assert_eq!(
        store.peek(&id).unwrap().state,
        narad_storage::PartitionState::Closed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reader_is_told_when_its_topic_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(real_store(dir.path(), Arc::new(ManualClock::new(T0_MS))));
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    let waiter = {
        let (store, id) = (store.clone(), id.clone());
        tokio::spawn(async move { store.wait_for_data(&id, 0, Duration::from_secs(120)).await })
    };
    tokio::task::yield_now().await;
    let s2 = store.clone();
    tokio::task::spawn_blocking(move || s2.delete_topic("t").unwrap())
        .await
        .unwrap();
    assert!(matches!(
        waiter.await.unwrap(),
        Err(StorageError::UnknownPartition { .. })
    ));
}

/// A log reopened shorter than it was (its last record cut while it was closed): a reader
/// waiting past the new end waits for new records rather than waking at once, every time, on
/// the end the log had before the cut.
#[tokio::test(start_paused = true)]
async fn a_log_reopened_shorter_is_waited_on_at_its_new_end() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    store.append(&id, batch(&["a", "b", "c"])).unwrap();
    store.append(&id, batch(&["d"])).unwrap();
    clock.advance(600_000);
    assert_eq!(store.close_idle(), 1);
    // The last record's bytes and the high-watermark file are lost, as after a power loss.
    tear_the_last_record(&dir.path().join("topics/t/p00000"));
    assert_eq!(
        store.high_watermark(&id).unwrap(),
        3,
        "the reopen cut record 3"
    );

    let started = tokio::time::Instant::now();
    assert!(
        !store
            .wait_for_data(&id, 3, Duration::from_secs(5))
            .await
            .unwrap(),
        "nothing past offset 3 since the cut"
    );
    assert!(started.elapsed() >= Duration::from_secs(5));
    store.append(&id, batch(&["new"])).unwrap();
    assert!(
        store
            .wait_for_data(&id, 3, Duration::from_secs(5))
            .await
            .unwrap()
    );
}
