//! Shadow routing: a candidate chain routes a copy of a link's slabs beside the real chain, and
//! what it would have done differently is counted. Nothing it decides is committed.
//!
//! The cursor routes a slab with the link's chain as always; once that routing succeeded (its
//! decisions all name a child partition) and the link has a shadow, it offers the slab, the
//! real decisions and what the real routing cost to the link's [`Shadow`] with a non-blocking
//! [`Shadow::offer`]: a queue of [`SHADOW_QUEUE_DEPTH`] slabs per link. A full queue (the
//! candidate is slower than the link) drops the offer and counts it as skipped; the cursor
//! never waits for the shadow, and never holds its router's lock while the candidate runs
//! (they are two chains, two locks). One task per shadow routes the queued slabs with the
//! candidate on the blocking pool, one at a time, under the runtime's own fuel and deadline
//! limits; a candidate that fails is counted by kind (the [`RouteFailureKind`] labels) and is
//! never retried, so a hostile candidate costs at most its deadline per slab it is handed.
//!
//! The report ([`ShadowReport`]) sums, over the slabs the candidate routed: records it places
//! like the real chain, records it would move (per (real, candidate) partition pair, at most
//! [`MAX_MOVED_PAIRS`] pairs kept, the rest summed apart), records it leaves undecided or
//! places out of range, its failures by kind, and the time and fuel per record of both chains
//! over those same slabs.
//!
//! [`RouteFailureKind`]: crate::fanout::route::RouteFailureKind

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use narad_storage::StoredRecord;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::route::{
    Mode, RouteCost, RouteFailure, RouteInput, RouterBuildError, SharedRouter, SlabRouter,
    route_measured,
};
use crate::metastore::link::ShadowSpec;

/// Slabs waiting for a shadow's candidate, per link; an offer beyond them is skipped. Each
/// holds its records (shared with the cursor while it commits them), so this bounds what a
/// shadow keeps alive: the slab being routed plus this many, at most 4 MiB each.
pub(crate) const SHADOW_QUEUE_DEPTH: usize = 2;

/// Most distinct (real partition, candidate partition) pairs a report lists; records moved
/// between further pairs are counted in [`ShadowReport::moved_other_records`], so a child with
/// many partitions cannot grow the report without bound.
pub(crate) const MAX_MOVED_PAIRS: usize = 256;

/// One slab offered to a shadow: what the real routing saw and decided.
#[derive(Clone, Debug)]
pub(crate) struct ShadowSlab {
    /// The real routing's input (the candidate gets its own config and attempt 0).
    pub input: RouteInput,
    /// The slab's records, shared with the cursor.
    pub records: Arc<Vec<StoredRecord>>,
    /// The real chain's decisions, one per record, each below the child's partition count.
    pub decisions: Vec<u32>,
    /// What the real routing cost.
    pub cost: RouteCost,
}

/// Records moved from one child partition (the real chain's) to another (the candidate's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedPair {
    /// The child partition the real chain chose.
    pub from: u32,
    /// The child partition the candidate would choose.
    pub to: u32,
    /// How many records.
    pub records: u64,
}

/// What one chain cost over the slabs the candidate routed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChainCost {
    /// Records routed (and timed).
    pub records: u64,
    /// Wall-clock time of the routing calls, in nanoseconds, failed calls included.
    pub nanos: u64,
    /// Records of the routings whose fuel is known (successful calls of a Wasm chain).
    pub fuel_records: u64,
    /// Fuel spent on those records.
    pub fuel: u64,
    /// `nanos / records`, when any record was routed.
    #[serde(default)]
    pub nanos_per_record: Option<f64>,
    /// `fuel / fuel_records`, when the fuel of any record is known.
    #[serde(default)]
    pub fuel_per_record: Option<f64>,
}

impl ChainCost {
    fn add(&mut self, records: u64, cost: &RouteCost) {
        self.records += records;
        self.nanos = self
            .nanos
            .saturating_add(u64::try_from(cost.elapsed.as_nanos()).unwrap_or(u64::MAX));
        if let Some(fuel) = cost.fuel {
            self.fuel_records += records;
            self.fuel = self.fuel.saturating_add(fuel);
        }
        self.averages();
    }

    fn merge(&mut self, other: &ChainCost) {
        self.records += other.records;
        self.nanos = self.nanos.saturating_add(other.nanos);
        self.fuel_records += other.fuel_records;
        self.fuel = self.fuel.saturating_add(other.fuel);
        self.averages();
    }

    fn averages(&mut self) {
        self.nanos_per_record = (self.records > 0).then(|| self.nanos as f64 / self.records as f64);
        self.fuel_per_record =
            (self.fuel_records > 0).then(|| self.fuel as f64 / self.fuel_records as f64);
    }
}

/// A shadow's comparison so far, on one node (or summed over nodes with
/// [`ShadowReport::merge`]). Every count is of the slabs the candidate routed, except the
/// skipped ones.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowReport {
    /// Slabs the candidate routed (or failed to).
    pub slabs_seen: u64,
    /// Their records.
    pub records_seen: u64,
    /// Slabs the link routed that the candidate did not see: its queue was full (it is slower
    /// than the link), or it could not be built.
    pub slabs_skipped: u64,
    /// Their records.
    pub records_skipped: u64,
    /// Records the candidate places on the same child partition as the real chain.
    pub records_same: u64,
    /// Records it places on another child partition (each counted in `moved` or
    /// `moved_other_records`).
    pub records_moved: u64,
    /// Moved records per (real, candidate) partition pair, most records first, at most
    /// [`MAX_MOVED_PAIRS`] pairs.
    pub moved: Vec<MovedPair>,
    /// Moved records between pairs beyond the listed ones.
    pub moved_other_records: u64,
    /// Records the candidate leaves undecided (the real chain would fail such a slab).
    pub records_undecided: u64,
    /// Records it places at or past the child's partition count. A Wasm chain stops at the
    /// first such answer and fails the slab: those slabs are counted as failures of kind
    /// `out_of_range` instead, their records in `records_failed`.
    pub records_out_of_range: u64,
    /// Slabs the candidate failed to route (it trapped, ran out of fuel or time, ...).
    pub slabs_failed: u64,
    /// Their records.
    pub records_failed: u64,
    /// Failed slabs by kind (`trap`, `fuel`, `deadline`, `error_return`, `panic`, ...).
    pub errors: BTreeMap<String, u64>,
    /// The last failure, as the runtime describes it.
    pub last_error: Option<String>,
    /// Why the candidate chain could not be built, while it cannot.
    pub build_error: Option<String>,
    /// The link's own chain over the slabs the candidate routed.
    pub current: ChainCost,
    /// The candidate over the same slabs.
    pub candidate: ChainCost,
}

impl ShadowReport {
    /// Adds `other` (another node's report of the same shadow) to this one: counts summed,
    /// partition pairs merged under the same [`MAX_MOVED_PAIRS`] cap, errors summed by kind.
    pub(crate) fn merge(&mut self, other: &ShadowReport) {
        self.slabs_seen += other.slabs_seen;
        self.records_seen += other.records_seen;
        self.slabs_skipped += other.slabs_skipped;
        self.records_skipped += other.records_skipped;
        self.records_same += other.records_same;
        self.records_moved += other.records_moved;
        self.records_undecided += other.records_undecided;
        self.records_out_of_range += other.records_out_of_range;
        self.slabs_failed += other.slabs_failed;
        self.records_failed += other.records_failed;
        for (kind, count) in &other.errors {
            *self.errors.entry(kind.clone()).or_default() += count;
        }
        if other.last_error.is_some() {
            self.last_error.clone_from(&other.last_error);
        }
        if self.build_error.is_none() {
            self.build_error.clone_from(&other.build_error);
        }
        self.current.merge(&other.current);
        self.candidate.merge(&other.candidate);
        let mut pairs: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for pair in self.moved.iter().chain(&other.moved) {
            *pairs.entry((pair.from, pair.to)).or_default() += pair.records;
        }
        self.moved_other_records += other.moved_other_records;
        let (kept, other_records) = top_pairs(pairs);
        self.moved = kept;
        self.moved_other_records += other_records;
    }
}

/// The pairs with most records first (ties by pair), at most [`MAX_MOVED_PAIRS`] of them, and
/// the records of the rest.
fn top_pairs(pairs: BTreeMap<(u32, u32), u64>) -> (Vec<MovedPair>, u64) {
    let mut all: Vec<MovedPair> = pairs
        .into_iter()
        .map(|((from, to), records)| MovedPair { from, to, records })
        .collect();
    all.sort_by(|a, b| {
        b.records
            .cmp(&a.records)
            .then((a.from, a.to).cmp(&(b.from, b.to)))
    });
    let rest = all
        .get(MAX_MOVED_PAIRS..)
        .map_or(0, |rest| rest.iter().map(|p| p.records).sum());
    all.truncate(MAX_MOVED_PAIRS);
    (all, rest)
}

/// The running counts behind a [`ShadowReport`].
#[derive(Debug, Default)]
struct Tally {
    report: ShadowReport,
    /// Moved records by pair while there is room for the pair; the report's `moved` is built
    /// from it.
    pairs: BTreeMap<(u32, u32), u64>,
}

impl Tally {
    fn skipped(&mut self, records: usize) {
        self.report.slabs_skipped += 1;
        self.report.records_skipped += records as u64;
    }

    /// Counts one slab the candidate routed: `candidate` is its answer to the slab whose real
    /// decisions are `real`, under `child_partitions`.
    fn routed(
        &mut self,
        slab: &ShadowSlab,
        candidate: Result<&[u32], &RouteFailure>,
        candidate_cost: &RouteCost,
    ) {
        let records = slab.decisions.len() as u64;
        let r = &mut self.report;
        r.slabs_seen += 1;
        r.records_seen += records;
        r.current.add(records, &slab.cost);
        r.candidate.add(records, candidate_cost);
        let decisions = match candidate {
            Ok(decisions) => decisions,
            Err(failure) => {
                r.slabs_failed += 1;
                r.records_failed += records;
                *r.errors
                    .entry(failure.kind.as_str().to_owned())
                    .or_default() += 1;
                r.last_error = Some(failure.to_string());
                return;
            }
        };
        let partitions = slab.input.child_partition_count;
        for (&real, &theirs) in slab.decisions.iter().zip(decisions) {
            if theirs == real {
                r.records_same += 1;
            } else if theirs == narad_runtime::UNDECIDED {
                r.records_undecided += 1;
            } else if theirs >= partitions {
                r.records_out_of_range += 1;
            } else {
                r.records_moved += 1;
                let pair = (real, theirs);
                if let Some(count) = self.pairs.get_mut(&pair) {
                    *count += 1;
                } else if self.pairs.len() < MAX_MOVED_PAIRS {
                    self.pairs.insert(pair, 1);
                } else {
                    r.moved_other_records += 1;
                }
            }
        }
    }

    fn report(&self) -> ShadowReport {
        let mut report = self.report.clone();
        let (moved, rest) = top_pairs(self.pairs.clone());
        report.moved = moved;
        report.moved_other_records += rest;
        report
    }
}

/// What a shadow and its worker share.
struct Inner {
    /// The candidate chain; `None` while it cannot be built.
    candidate: Mutex<Option<SharedRouter>>,
    tally: Mutex<Tally>,
    /// The candidate's config bytes.
    config: Vec<u8>,
}

impl Inner {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn candidate(&self) -> Option<SharedRouter> {
        self.candidate
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// One link's shadow on this node: its spec, its candidate chain, the queue the cursors offer
/// slabs to and the report. Dropping it ends its worker once the slab in hand is routed.
pub struct Shadow {
    spec: ShadowSpec,
    inner: Arc<Inner>,
    offers: mpsc::Sender<ShadowSlab>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow").field("spec", &self.spec).finish()
    }
}

impl Shadow {
    /// Starts the shadow `spec` with its candidate chain, or with why that chain could not be
    /// built (then every offer is skipped and the report says why, until
    /// [`Shadow::install`]). Spawns its worker, so it must be called inside a tokio runtime.
    pub fn start(
        spec: ShadowSpec,
        candidate: Result<Box<dyn SlabRouter>, RouterBuildError>,
    ) -> Arc<Shadow> {
        let (offers, queue) = mpsc::channel(SHADOW_QUEUE_DEPTH);
        let mut tally = Tally::default();
        let candidate = match candidate {
            Ok(router) => Some(Arc::new(Mutex::new(router))),
            Err(why) => {
                tally.report.build_error = Some(why.to_string());
                None
            }
        };
        let inner = Arc::new(Inner {
            candidate: Mutex::new(candidate),
            tally: Mutex::new(tally),
            config: spec.config.clone().into_bytes(),
        });
        tokio::spawn(work(Arc::clone(&inner), queue));
        Arc::new(Shadow {
            spec,
            inner,
            offers,
        })
    }

    /// The shadow this runs, as the metastore records it.
    pub fn spec(&self) -> &ShadowSpec {
        &self.spec
    }

    /// True while the candidate chain has not been built (the reconciler tries again).
    pub(crate) fn needs_build(&self) -> bool {
        self.inner.candidate().is_none()
    }

    /// Puts in the candidate chain that could not be built when the shadow started; the
    /// report keeps what it counted (the skipped slabs) and forgets the build error.
    pub(crate) fn install(&self, candidate: Box<dyn SlabRouter>) {
        *self
            .inner
            .candidate
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(Mutex::new(candidate)));
        self.inner.tally().report.build_error = None;
    }

    /// Records why the candidate chain still cannot be built.
    pub(crate) fn build_failed(&self, why: String) {
        self.inner.tally().report.build_error = Some(why);
    }

    /// Offers a routed slab to the candidate, without waiting: when the queue is full, or the
    /// candidate is not built, the slab is counted as skipped instead.
    pub(crate) fn offer(&self, slab: ShadowSlab) {
        if self.needs_build() {
            self.inner.tally().skipped(slab.records.len());
            return;
        }
        if let Err(refused) = self.offers.try_send(slab) {
            let slab = match refused {
                mpsc::error::TrySendError::Full(slab) | mpsc::error::TrySendError::Closed(slab) => {
                    slab
                }
            };
            self.inner.tally().skipped(slab.records.len());
        }
    }

    /// The report so far.
    pub fn report(&self) -> ShadowReport {
        self.inner.tally().report()
    }
}

/// The shadow's worker: routes each queued slab with the candidate, one at a time, until the
/// shadow is dropped.
async fn work(inner: Arc<Inner>, mut queue: mpsc::Receiver<ShadowSlab>) {
    while let Some(slab) = queue.recv().await {
        let Some(candidate) = inner.candidate() else {
            inner.tally().skipped(slab.records.len());
            continue;
        };
        let input = RouteInput {
            attempt: 0,
            config: inner.config.clone(),
            ..slab.input.clone()
        };
        let (answer, cost) = route_measured(
            &candidate,
            input,
            Arc::clone(&slab.records),
            Mode::Candidate,
        )
        .await;
        inner.tally().routed(&slab, answer.as_deref(), &cost);
    }
}

/// This node's shadows, by link: the reconciler puts each in when it starts it and takes it
/// out when the shadow or the link goes; the API reads the reports.
#[derive(Debug, Default)]
pub struct ShadowBoard {
    shadows: Mutex<BTreeMap<(String, String), Arc<Shadow>>>,
}

impl ShadowBoard {
    /// The shadow of `parent -> child` running here, if any.
    pub fn get(&self, parent: &str, child: &str) -> Option<Arc<Shadow>> {
        self.shadows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(parent.to_owned(), child.to_owned()))
            .cloned()
    }

    /// Lists `shadow` as the one of `parent -> child`, replacing any before it.
    pub fn insert(&self, parent: &str, child: &str, shadow: Arc<Shadow>) {
        self.shadows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((parent.to_owned(), child.to_owned()), shadow);
    }

    /// Stops listing the shadow of `parent -> child`.
    pub fn remove(&self, parent: &str, child: &str) {
        self.shadows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(parent.to_owned(), child.to_owned()));
    }

    /// The links with a shadow listed here.
    pub fn links(&self) -> Vec<(String, String)> {
        self.shadows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests;
