//! How compiles are admitted: one load per digest at a time, a bounded number of compiles.
//!
//! Compiling is the one plugin operation whose cost no fuel or deadline bounds (the module
//! limits of [`crate::precheck`] bound each compile's size; this bounds how many run). Two
//! rules, both enforced here for every [`crate::Plugin::load`] of a runtime:
//!
//! - **single flight per digest**: concurrent loads of the same bytes wait for the first one
//!   and share its outcome (the [`crate::Plugin`] or the [`LoadError`]) instead of compiling
//!   the same module again side by side;
//! - **bounded concurrency**: at most [`crate::RuntimeConfig::compile_concurrency`] compiles
//!   run at once in the whole runtime; the others wait for a permit. Cache hits need no
//!   permit.
//!
//! Everything here blocks the calling thread (mutexes and a condition variable): callers run
//! loads on a blocking pool, never on an async worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::error::LoadError;
use crate::plugin::{Digest, Plugin};

/// The outcome a load leaves for the loads of the same digest that waited for it.
type Outcome = Result<Plugin, LoadError>;

/// One load in progress: its leader holds `slot` locked while loading.
#[derive(Default)]
struct Flight {
    slot: Mutex<Option<Outcome>>,
}

/// The admission state of one runtime.
pub(crate) struct CompileGate {
    /// Free compile permits.
    permits: Mutex<usize>,
    freed: Condvar,
    flights: Mutex<HashMap<Digest, Arc<Flight>>>,
    /// Compiles started since the runtime was built (cache hits not counted).
    compiles: AtomicU64,
}

impl std::fmt::Debug for CompileGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileGate")
            .field("compiles", &self.compiles.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl CompileGate {
    /// A gate letting `concurrency` (at least 1) compiles run at once.
    pub(crate) fn new(concurrency: usize) -> Self {
        CompileGate {
            permits: Mutex::new(concurrency.max(1)),
            freed: Condvar::new(),
            flights: Mutex::new(HashMap::new()),
            compiles: AtomicU64::new(0),
        }
    }

    /// Compiles started so far.
    pub(crate) fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::Relaxed)
    }

    /// Runs `load` for `digest` unless a load of the same digest is under way, in which case
    /// this waits for it and returns its outcome.
    pub(crate) fn single_flight(&self, digest: Digest, load: impl FnOnce() -> Outcome) -> Outcome {
        let flight = Arc::clone(
            self.flights
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(digest)
                .or_default(),
        );
        // A leader that panicked leaves the slot empty (and poisoned): the next one loads.
        let mut slot = flight.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(outcome) = slot.as_ref() {
            return outcome.clone();
        }
        let outcome = load();
        *slot = Some(outcome.clone());
        // Forget the flight once done, so a later load (after a removal, or a transient
        // failure) starts afresh; loads already waiting on it still see the outcome.
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        if flights
            .get(&digest)
            .is_some_and(|current| Arc::ptr_eq(current, &flight))
        {
            flights.remove(&digest);
        }
        outcome
    }

    /// Runs `compile` once a compile permit is free, counting it.
    pub(crate) fn compile<T>(&self, compile: impl FnOnce() -> T) -> T {
        let _permit = self.acquire();
        self.compiles.fetch_add(1, Ordering::Relaxed);
        compile()
    }

    fn acquire(&self) -> Permit<'_> {
        let mut free = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        Permit { gate: self }
    }
}

/// A held compile permit, given back on drop (also when the compile panics).
struct Permit<'a> {
    gate: &'a CompileGate,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self
            .gate
            .permits
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        self.gate.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn compiles_never_run_more_than_the_permits_at_once() {
        let gate = Arc::new(CompileGate::new(1));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..6)
            .map(|_| {
                let (gate, running, most) =
                    (Arc::clone(&gate), Arc::clone(&running), Arc::clone(&most));
                std::thread::spawn(move || {
                    gate.compile(|| {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(gate.compiles(), 6);
    }

    #[test]
    fn loads_of_one_digest_that_overlap_share_the_first_outcome() {
        let gate = Arc::new(CompileGate::new(1));
        let digest = Digest::of(b"one module");
        let loads = Arc::new(AtomicUsize::new(0));
        let (release, released) = std::sync::mpsc::channel::<()>();
        let leader = {
            let (gate, loads) = (Arc::clone(&gate), Arc::clone(&loads));
            std::thread::spawn(move || {
                gate.single_flight(digest, || {
                    loads.fetch_add(1, Ordering::SeqCst);
                    released.recv().unwrap();
                    Err(LoadError::NotWasm)
                })
            })
        };
        // Wait until the leader is inside its load, then start the followers.
        while loads.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let followers: Vec<_> = (0..4)
            .map(|_| {
                let (gate, loads) = (Arc::clone(&gate), Arc::clone(&loads));
                std::thread::spawn(move || {
                    gate.single_flight(digest, || {
                        loads.fetch_add(1, Ordering::SeqCst);
                        Err(LoadError::ManifestMissing)
                    })
                })
            })
            .collect();
        // Every follower holds the flight (the map's reference plus the leader's and theirs).
        let flight_refs = || {
            gate.flights
                .lock()
                .unwrap()
                .get(&digest)
                .map_or(0, Arc::strong_count)
        };
        while flight_refs() < 1 + 1 + followers.len() {
            std::thread::yield_now();
        }
        release.send(()).unwrap();
        assert!(matches!(leader.join().unwrap(), Err(LoadError::NotWasm)));
        for follower in followers {
            assert!(matches!(follower.join().unwrap(), Err(LoadError::NotWasm)));
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        assert!(gate.flights.lock().unwrap().is_empty());
    }
}
