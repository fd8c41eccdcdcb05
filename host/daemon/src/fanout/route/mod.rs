//! Step 2 of a slab, route: the link's router chain gives every record a child partition.
//!
//! The cursor only needs "give every record of this slab a child partition"; the Wasm chain
//! ([`wasm`], over `narad_runtime`) is the daemon's implementation, and tests use native ones.
//! One router instance serves every cursor of a link on this node, so state such as the
//! round-robin counter belongs to the child topic, not to a parent partition. [`route`] runs
//! the router on the blocking pool (a slow plugin cannot stall the I/O threads) and checks it
//! answered once per record; [`super::bucket`] checks each answer names a child partition.
//! A failure is a [`RouteFailure`]: the slab is not committed, the cursor stalls and routes it
//! again later, never skipping a record. A router that panics is such a failure too: the
//! panic is caught inside the router's lock, so the lock is not poisoned and the next slab is
//! routed again (by the same chain, or by the one [`replace_router`] swapped in).

pub mod wasm;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};

use narad_runtime::{ChainError, FailureKind};
use narad_storage::StoredRecord;

use crate::blocking::BlockingError;
use crate::metastore::LinkMeta;
use crate::metastore::link::PluginRef;

/// What a router is told about the slab it routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteInput {
    /// Parent topic.
    pub parent_topic: String,
    /// Parent partition the slab was read from.
    pub parent_partition: u32,
    /// The parent's partition count (read once per pass, for slabs holding a keyless record).
    pub parent_partition_count: u32,
    /// Child topic.
    pub child_topic: String,
    /// The child's current partition count.
    pub child_partition_count: u32,
    /// 0 on a slab's first routing, raised by one on every retry.
    pub attempt: u32,
    /// The link's plugin configuration bytes.
    pub config: Vec<u8>,
}

/// A routing failure: the slab is not committed and the cursor stalls and retries; it never
/// skips a record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RouteFailure {
    /// The plugin that failed (`name@digest`), when one is to blame.
    pub plugin: Option<String>,
    /// What kind of failure it is; [`RouteFailureKind::as_str`] is its machine-readable label.
    pub kind: RouteFailureKind,
    /// What happened, for operators.
    pub message: String,
    /// The record a search of the failing slab found the chain cannot route, when one was
    /// searched for (from the second try of a slab on).
    pub poison: Option<Box<PoisonFound>>,
}

/// The record of a failing slab that the chain cannot route, as the poison search found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoisonFound {
    /// Its parent offset.
    pub offset: u64,
    /// The plugin that fails on it (`name`).
    pub plugin: String,
    /// That plugin's digest (sha256, hex).
    pub digest: String,
    /// The failure's kind label (`trap`, `fuel`, ...).
    pub kind: String,
    /// The failure, as operators read it.
    pub error: String,
    /// Whether it fails on its own too (else only in the company of the records before it,
    /// and it is not to be set aside).
    pub alone: bool,
}

/// The kind of a [`RouteFailure`]. Its label ([`RouteFailureKind::as_str`], also its
/// `Display`) is the short machine-readable kind operators and metrics see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RouteFailureKind {
    /// A plugin of the link's chain failed the call (trapped, ran past its deadline or fuel,
    /// returned an error, broke the ABI, ...): the runtime's kind, labelled as the runtime
    /// labels it (`trap`, `deadline`, ...).
    Plugin(FailureKind),
    /// The router returned a different number of decisions than the slab has records
    /// (`wrong_length`).
    WrongLength,
    /// The router sent a record to a partition at or past the child's partition count
    /// (`out_of_range`).
    OutOfRange,
    /// The router's lock was poisoned by a panic outside a routing call (a panic inside one
    /// is caught and is a [`RouteFailureKind::Panic`]); [`replace_router`] clears it
    /// (`poisoned`).
    Poisoned,
    /// The router panicked on this slab, or the routing task panicked or was cancelled
    /// (`panic`).
    Panic,
}

impl RouteFailureKind {
    /// The kind's label: `trap`, `deadline`, ... for a plugin failure, otherwise
    /// `wrong_length`, `out_of_range`, `poisoned` or `panic`.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteFailureKind::Plugin(kind) => kind.as_str(),
            RouteFailureKind::WrongLength => "wrong_length",
            RouteFailureKind::OutOfRange => "out_of_range",
            RouteFailureKind::Poisoned => "poisoned",
            RouteFailureKind::Panic => "panic",
        }
    }
}

impl std::fmt::Display for RouteFailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decides a child partition for each record of a slab.
pub trait SlabRouter: Send {
    /// Returns one child partition index below `input.child_partition_count` per record, in
    /// record order, or the reason it cannot.
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure>;

    /// Routes as a shadow's candidate ([`super::shadow`]): like [`SlabRouter::route`], except
    /// that a record the router leaves undecided is answered [`narad_runtime::UNDECIDED`]
    /// instead of failing the slab, so the comparison counts exactly those records. An answer
    /// at or past the child's partition count is returned as it is, for the same reason; a
    /// router that cannot do that fails the slab as [`SlabRouter::route`] does. By default
    /// it is [`SlabRouter::route`].
    fn route_candidate(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        self.route(input, records)
    }

    /// The fuel this router's plugins spent in successful calls so far, summed over its
    /// chain, or `None` for a router that burns no fuel (a native one). A running total: the
    /// difference over one routing is what that routing cost.
    fn fuel_spent(&self) -> Option<u64> {
        None
    }
}

/// What one routing cost, measured inside the router's lock (waiting for the lock is not in
/// it), for the shadow's comparison of chains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RouteCost {
    /// Wall-clock time of the router's call.
    pub elapsed: std::time::Duration,
    /// Fuel its plugins spent ([`SlabRouter::fuel_spent`] before and after); `None` when the
    /// router burns none, or the routing failed (failed calls do not report their fuel).
    pub fuel: Option<u64>,
}

/// A router shared by the cursors of one link; swapping the inside ([`replace_router`]) takes
/// effect at the next slab of every cursor.
pub(crate) type SharedRouter = Arc<Mutex<Box<dyn SlabRouter>>>;

/// Puts `router` in place of the chain `shared` holds, whether or not its lock is poisoned,
/// and clears the poison: a new chain owes nothing to a panic of the old one, so the link's
/// cursors route with it from their next slab instead of stalling until the link is attached
/// again. The old chain is dropped after the lock is released, so its drop cannot poison it.
pub(crate) fn replace_router(shared: &SharedRouter, router: Box<dyn SlabRouter>) {
    let mut guard = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let old = std::mem::replace(&mut *guard, router);
    drop(guard);
    shared.clear_poison();
    drop(old);
}

/// Builds the router chain of a link. The reconciler holds one and calls it whenever a link
/// appears or its router changes; [`wasm::WasmRouterFactory`] is the daemon's.
pub trait RouterFactory: Send + Sync + 'static {
    /// A fresh chain (fresh plugin instances) for `link`, or why it cannot be built.
    fn build(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError>;

    /// A fresh chain for a shadow's candidate: `link` carries the candidate's router and
    /// config. It must not report to the series of the link's real routing (a candidate's
    /// failures stall nothing, and must not look as if they did). By default it is
    /// [`RouterFactory::build`].
    fn build_candidate(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
        self.build(link)
    }
}

/// Why a plugin could not be loaded for a chain, as the loader reports it (the registry's own
/// error, kept whole as the source).
pub(crate) type PluginLoadError = Box<dyn std::error::Error + Send + Sync>;

/// Why a link's router chain could not be built; the reconciler logs it and tries again on its
/// next pass. The `Display` text is what the log says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouterBuildError {
    /// A plugin the link's router names could not be loaded (not in the registry, unreadable,
    /// or refused by the runtime's checks).
    #[error("plugin {plugin}: {source}")]
    PluginLoad {
        /// The plugin, as the link names it (`name@digest`).
        plugin: PluginRef,
        /// Why the loader could not load it.
        source: PluginLoadError,
    },
    /// The loaded plugins do not make a chain (none, or more than the runtime allows).
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// The task building the chain on the blocking pool did not return.
    #[error("building the router failed: {0}")]
    Task(#[from] BlockingError),
}

/// Routes `records` through `router` on the blocking pool and checks the answer has one
/// decision per record. The records are shared with the blocking thread, not moved to it, so
/// the caller still holds every one of them whatever the router does: a routing task that
/// panics or is cancelled is a failure of this slab, never a slab with fewer records.
pub async fn route(
    router: &SharedRouter,
    input: RouteInput,
    records: Arc<Vec<StoredRecord>>,
) -> Result<Vec<u32>, RouteFailure> {
    route_measured(router, input, records, Mode::Route).await.0
}

/// How [`route_measured`] calls the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// [`SlabRouter::route`], the link's own routing.
    Route,
    /// [`SlabRouter::route`], and the fuel it spent read too (the cursor of a link with a
    /// shadow, so the report compares both chains over the same slabs).
    RouteAndFuel,
    /// [`SlabRouter::route_candidate`] with its fuel: a shadow's candidate. Its answers are
    /// not checked against the child's partition count (the comparison counts them).
    Candidate,
}

/// [`route`], also returning what the routing cost ([`RouteCost`]; fuel only when `mode`
/// asks for it). The same guarantees: the records stay the caller's, a panic or a cancelled
/// task is a failure of this slab, and the decisions are one per record.
pub(crate) async fn route_measured(
    router: &SharedRouter,
    input: RouteInput,
    records: Arc<Vec<StoredRecord>>,
    mode: Mode,
) -> (Result<Vec<u32>, RouteFailure>, RouteCost) {
    let router = Arc::clone(router);
    let task = crate::blocking::run(move || {
        let mut cost = RouteCost::default();
        let decisions = match router.lock() {
            // Caught while the guard is held, so the unwinding never crosses the lock and
            // never poisons it. The router's own state may be half-updated by the panic; that
            // costs at most odd routing decisions for the retried slab, never a lost record.
            Ok(mut guard) => {
                let fuel_before = match mode {
                    Mode::Route => None,
                    Mode::RouteAndFuel | Mode::Candidate => guard.fuel_spent(),
                };
                let started = std::time::Instant::now();
                let routed = catch_unwind(AssertUnwindSafe(|| match mode {
                    Mode::Route | Mode::RouteAndFuel => guard.route(&input, &records),
                    Mode::Candidate => guard.route_candidate(&input, &records),
                }));
                cost.elapsed = started.elapsed();
                match routed {
                    Ok(decisions) => {
                        if decisions.is_ok()
                            && let (Some(before), Some(after)) = (fuel_before, guard.fuel_spent())
                        {
                            cost.fuel = Some(after.saturating_sub(before));
                        }
                        decisions
                    }
                    Err(payload) => Err(RouteFailure {
                        plugin: None,
                        poison: None,
                        kind: RouteFailureKind::Panic,
                        message: format!(
                            "the router panicked: {}",
                            panic_message(payload.as_ref())
                        ),
                    }),
                }
            }
            Err(_) => Err(RouteFailure {
                plugin: None,
                poison: None,
                kind: RouteFailureKind::Poisoned,
                message: "the router's lock was poisoned by an earlier panic".into(),
            }),
        };
        let checked = decisions.and_then(|d| check_decisions(&d, &records).map(|()| d));
        (checked, cost)
    });
    match task.await {
        Ok(routed) => routed,
        Err(error) => (
            Err(RouteFailure {
                plugin: None,
                poison: None,
                kind: RouteFailureKind::Panic,
                message: format!("routing task failed: {error}"),
            }),
            RouteCost::default(),
        ),
    }
}

/// The text of a panic's payload, when it was a string (as `panic!` with a message makes it).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Checks a router's answer has one decision per record. That each names a child partition
/// is checked where the decisions are counted ([`super::bucket::bucket`]).
pub(crate) fn check_decisions(
    decisions: &[u32],
    records: &[StoredRecord],
) -> Result<(), RouteFailure> {
    if decisions.len() != records.len() {
        return Err(RouteFailure {
            plugin: None,
            poison: None,
            kind: RouteFailureKind::WrongLength,
            message: format!(
                "the router returned {} decisions for {} records",
                decisions.len(),
                records.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn records(count: u64) -> Vec<StoredRecord> {
        (0..count)
            .map(|offset| StoredRecord {
                offset,
                committed_at_ms: 0,
                key: None,
                headers: Vec::new(),
                value: Some(Bytes::from_static(b"v")),
                origin: None,
            })
            .collect()
    }

    #[test]
    fn too_few_decisions_are_a_wrong_length_failure_naming_both_counts() {
        let failure = check_decisions(&[0], &records(2)).unwrap_err();
        assert_eq!(failure.kind, RouteFailureKind::WrongLength);
        assert_eq!(failure.plugin, None);
        assert_eq!(
            failure.to_string(),
            "the router returned 1 decisions for 2 records"
        );
    }

    /// Panics on its first call, then sends every record to partition 0.
    struct PanicsOnce {
        calls: u32,
    }

    impl SlabRouter for PanicsOnce {
        fn route(
            &mut self,
            _input: &RouteInput,
            records: &[StoredRecord],
        ) -> Result<Vec<u32>, RouteFailure> {
            self.calls += 1;
            if self.calls == 1 {
                panic!("first call");
            }
            Ok(vec![0; records.len()])
        }
    }

    fn input() -> RouteInput {
        RouteInput {
            parent_topic: "parent".into(),
            parent_partition: 0,
            parent_partition_count: 1,
            child_topic: "child".into(),
            child_partition_count: 1,
            attempt: 0,
            config: Vec::new(),
        }
    }

    fn shared(router: impl SlabRouter + 'static) -> SharedRouter {
        Arc::new(Mutex::new(Box::new(router)))
    }

    #[tokio::test]
    async fn a_router_panic_fails_only_its_slab_and_the_next_slab_is_routed() {
        let router = shared(PanicsOnce { calls: 0 });
        let records = Arc::new(records(3));
        let failure = route(&router, input(), Arc::clone(&records))
            .await
            .unwrap_err();
        assert_eq!(failure.kind, RouteFailureKind::Panic);
        assert_eq!(failure.to_string(), "the router panicked: first call");
        assert!(!router.is_poisoned());
        assert_eq!(route(&router, input(), records).await.unwrap(), [0, 0, 0]);
    }

    #[tokio::test]
    async fn replacing_the_router_of_a_poisoned_lock_clears_the_poison() {
        let router = shared(PanicsOnce { calls: 1 });
        let poisoner = Arc::clone(&router);
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.lock();
            panic!("poison the lock");
        })
        .join();
        assert!(router.is_poisoned());
        let records = Arc::new(records(2));
        let failure = route(&router, input(), Arc::clone(&records))
            .await
            .unwrap_err();
        assert_eq!(failure.kind, RouteFailureKind::Poisoned);

        replace_router(&router, Box::new(PanicsOnce { calls: 1 }));
        assert!(!router.is_poisoned());
        assert_eq!(route(&router, input(), records).await.unwrap(), [0, 0]);
    }

    #[test]
    fn failure_kinds_keep_the_labels_operators_and_metrics_see() {
        let labels = [
            (RouteFailureKind::Plugin(FailureKind::Trap), "trap"),
            (RouteFailureKind::Plugin(FailureKind::Deadline), "deadline"),
            (
                RouteFailureKind::Plugin(FailureKind::OutOfRange),
                "out_of_range",
            ),
            (RouteFailureKind::WrongLength, "wrong_length"),
            (RouteFailureKind::OutOfRange, "out_of_range"),
            (RouteFailureKind::Poisoned, "poisoned"),
            (RouteFailureKind::Panic, "panic"),
        ];
        for (kind, label) in labels {
            assert_eq!(kind.as_str(), label);
            assert_eq!(kind.to_string(), label);
        }
    }
}
