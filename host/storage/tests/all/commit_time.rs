//! Commit times never decrease along a partition, whatever the clock does.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::common::*;
use narad_storage::{Clock, LogConfig, Store};

/// A clock that steps backwards by 7 ms on most reads and forwards by 10 ms on every third,
/// so concurrent producers see it jump around.
struct JumpyClock {
    reads: AtomicI64,
}

impl Clock for JumpyClock {
    fn now_ms(&self) -> i64 {
        let n = self.reads.fetch_add(1, Ordering::SeqCst);
        let forward = (n / 3) * 10;
        let back = (n - n / 3) * 7;
        T0_MS + forward - back
    }
}

#[test]
fn commit_times_never_decrease_under_concurrent_producers_and_a_clock_stepping_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(
            dir.path(),
            narad_storage::StoreOptions {
                clock: Arc::new(JumpyClock {
                    reads: AtomicI64::new(0),
                }),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let id = pid("t", 0);
    store.create_partition(&id, small_segments(4096)).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            let id = id.clone();
            std::thread::spawn(move || {
                let mut acks = Vec::new();
                for i in 0..40 {
                    acks.push(store.append(&id, batch(&[&format!("{t}-{i}")])).unwrap());
                }
                acks
            })
        })
        .collect();
    let mut acks: Vec<_> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    acks.sort_by_key(|a| a.base_offset);
    assert_eq!(acks.len(), 160);
    for w in acks.windows(2) {
        assert_eq!(w[1].base_offset, w[0].base_offset + 1, "offsets are dense");
        assert!(
            w[1].committed_at_ms >= w[0].committed_at_ms,
            "commit time went back at offset {}: {} then {}",
            w[1].base_offset,
            w[0].committed_at_ms,
            w[1].committed_at_ms
        );
    }
    // The clock did step back overall, so the floor was actually exercised.
    let first = acks[0].committed_at_ms;
    assert!(acks.iter().all(|a| a.committed_at_ms >= first));
    let records = read_all(&store, &id, 0);
    for w in records.windows(2) {
        assert!(w[1].committed_at_ms >= w[0].committed_at_ms);
    }
    for (r, a) in records.iter().zip(&acks) {
        assert_eq!(
            r.committed_at_ms, a.committed_at_ms,
            "stored as acknowledged"
        );
    }
}

#[test]
fn a_clock_step_back_between_appends_keeps_the_previous_commit_time() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(narad_storage::ManualClock::new(T0_MS));
    let store = real_store(dir.path(), clock.clone());
    let id = pid("t", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    assert_eq!(
        store.append(&id, batch(&["a"])).unwrap().committed_at_ms,
        T0_MS
    );
    clock.set(T0_MS - 60_000);
    assert_eq!(
        store.append(&id, batch(&["b"])).unwrap().committed_at_ms,
        T0_MS
    );
    clock.set(T0_MS + 5);
    assert_eq!(
        store.append(&id, batch(&["c"])).unwrap().committed_at_ms,
        T0_MS + 5
    );
}
