//! A link's router: a chain of 1 to 8 plugin instances.
//!
//! Each plugin in turn is handed only the records still undecided (encoded straight into its
//! memory), answers a `u32` per record or [`UNDECIDED`], and the chain checks every answer:
//! an index at or above the child partition count fails the slab naming the plugin that gave
//! it; a record still undecided after the last plugin fails the slab naming the last plugin.
//!
//! The caller owns one `Chain` per link (per child topic and parent partition on this node),
//! so plugin state such as the round-robin counter belongs to that link. `Chain` is `Send`:
//! the daemon runs `route` on a blocking pool, off its I/O threads.
//!
//! The plugin blamed for a failure has its store discarded, so it starts afresh on the next
//! slab. Failures are counted per plugin and kind in [`PluginStats`]; [`Chain::bisect`] finds the
//! first record of a failing slab that the chain cannot route.

use std::time::{Duration, Instant};

use narad_abi::{RouteContext, SlabEncoder, SlabRecord, UNDECIDED};

use crate::error::{ChainError, Failure, FailureKind, PluginError};
use crate::instance::Instance;
use crate::plugin::{Digest, Plugin};

/// Most plugins in one chain: 8, from the design (a chain of one to eight plugins).
pub const MAX_CHAIN_LEN: usize = 8;

/// Counters of one plugin of a chain, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginStats {
    /// The plugin's manifest name.
    pub name: String,
    /// The plugin's digest.
    pub digest: Digest,
    /// `narad_route` calls made to route slabs (slabs handed to this plugin); the calls of
    /// the poison-record search are in `search_calls`, not here.
    pub calls: u64,
    /// `narad_route` calls made by [`Chain::bisect`], the poison-record search. Their
    /// failures are not counted in [`PluginStats::failures`]: they repeat the one failure
    /// that started the search.
    pub search_calls: u64,
    /// Records handed in, over all calls.
    pub records_in: u64,
    /// Records this plugin decided.
    pub records_decided: u64,
    /// Times the plugin was instantiated (1 + rebuilds after failures).
    pub instantiations: u64,
    /// `narad.log` lines emitted.
    pub log_lines_emitted: u64,
    /// `narad.log` lines dropped by the rate limit.
    pub log_lines_dropped: u64,
    /// Fuel spent by successful calls (a deterministic measure of the plugin's work).
    pub fuel_consumed: u64,
    /// The successful call that came closest to its fuel budget, as (fuel spent, budget);
    /// `(0, 0)` before the first successful call.
    pub peak_fuel_use: (u64, u64),
    /// Wall-clock time spent in this plugin's calls (encoding its input included), failed
    /// calls too; divided by `calls` it is the mean call duration.
    pub busy: Duration,
    failures: [u64; FailureKind::ALL.len()],
}

impl PluginStats {
    /// Failures of `kind` blamed on this plugin.
    pub fn failures(&self, kind: FailureKind) -> u64 {
        self.failures[kind.index()]
    }

    /// Every kind with its count (zeros included), for exporting as labelled metrics.
    pub fn failures_by_kind(&self) -> impl Iterator<Item = (FailureKind, u64)> + '_ {
        FailureKind::ALL
            .iter()
            .map(|&k| (k, self.failures[k.index()]))
    }
}

struct Member {
    instance: Instance,
    busy: Duration,
    calls: u64,
    search_calls: u64,
    records_in: u64,
    records_decided: u64,
    failures: [u64; FailureKind::ALL.len()],
}

/// The first record of a slab that the chain cannot route, found by [`Chain::bisect`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoisonRecord {
    /// Index of the record in the slab handed to `bisect`.
    pub index: usize,
    /// Its parent offset.
    pub parent_offset: u64,
    /// The error routing it gives (alone, or as the last record of the shortest failing
    /// prefix when it only fails in company).
    pub error: PluginError,
    /// Whether routing it alone fails too: the record itself is what the chain cannot
    /// route, not the company it is in (a slab too slow as a whole, a plugin whose state
    /// breaks after so many records).
    pub alone: bool,
}

/// A chain of plugin instances for one link.
pub struct Chain {
    members: Vec<Member>,
    /// Indices (into the slab) of the records still undecided; reused across slabs.
    pending: Vec<u32>,
    /// Decision slots of one plugin call; reused across slabs.
    answers: Vec<u32>,
    /// True while [`Chain::bisect`] runs: its calls and failures are counted apart.
    searching: bool,
    /// Routings of the chain the last [`Chain::bisect`] made (each with its own attempt).
    last_search_routings: u32,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.members.iter().map(|m| m.instance.plugin().name()))
            .finish()
    }
}

impl Chain {
    /// A chain of fresh instances of `plugins`, in order.
    pub fn new(plugins: impl IntoIterator<Item = Plugin>) -> Result<Chain, ChainError> {
        let members: Vec<Member> = plugins
            .into_iter()
            .map(|plugin| Member {
                instance: Instance::new(plugin),
                busy: Duration::ZERO,
                calls: 0,
                search_calls: 0,
                records_in: 0,
                records_decided: 0,
                failures: [0; FailureKind::ALL.len()],
            })
            .collect();
        if members.is_empty() || members.len() > MAX_CHAIN_LEN {
            return Err(ChainError::Length {
                len: members.len(),
                max: MAX_CHAIN_LEN,
            });
        }
        Ok(Chain {
            members,
            pending: Vec::new(),
            answers: Vec::new(),
            searching: false,
            last_search_routings: 0,
        })
    }

    /// The plugins of the chain, in order.
    pub fn plugins(&self) -> impl Iterator<Item = &Plugin> + '_ {
        self.members.iter().map(|m| m.instance.plugin())
    }

    /// Counters per plugin, in chain order.
    pub fn stats(&self) -> Vec<PluginStats> {
        self.members
            .iter()
            .map(|m| {
                let counters = m.instance.counters();
                PluginStats {
                    name: m.instance.plugin().name().to_owned(),
                    digest: m.instance.plugin().digest(),
                    calls: m.calls,
                    search_calls: m.search_calls,
                    records_in: m.records_in,
                    records_decided: m.records_decided,
                    instantiations: counters.instantiations,
                    log_lines_emitted: counters.log_lines_emitted,
                    log_lines_dropped: counters.log_lines_dropped,
                    fuel_consumed: counters.fuel_consumed,
                    peak_fuel_use: counters.peak_fuel_use,
                    busy: m.busy,
                    failures: m.failures,
                }
            })
            .collect()
    }

    /// Routes a slab: returns one child partition index per record, each below
    /// `ctx.child_partition_count`, or the error of the plugin that failed.
    pub fn route<R: SlabRecord>(
        &mut self,
        ctx: &RouteContext,
        records: &[R],
    ) -> Result<Vec<u32>, PluginError> {
        let mut decisions = vec![UNDECIDED; records.len()];
        self.route_into(ctx, records, &mut decisions)?;
        Ok(decisions)
    }

    /// [`Chain::route`] into a caller-owned slice (`decisions.len() == records.len()`),
    /// which is overwritten.
    pub fn route_into<R: SlabRecord>(
        &mut self,
        ctx: &RouteContext,
        records: &[R],
        decisions: &mut [u32],
    ) -> Result<(), PluginError> {
        let last = self.members.len() - 1;
        if decisions.len() != records.len() {
            return Err(self.blame(
                last,
                Failure::Host {
                    message: "decision slots do not match the record count".into(),
                },
            ));
        }
        self.pending.clear();
        if records.is_empty() {
            return Ok(());
        }
        let partition_count = ctx.child_partition_count;
        // The first plugin sees every record, and its answers are copied from guest memory
        // straight into `decisions`: no pending list to follow and no second copy. Then two
        // branch-free passes (the usual case, a slab the first plugin decides entirely, needs
        // nothing else): is any answer out of range, and how many are undecided.
        self.timed_call(0, ctx, records, decisions)
            .map_err(|failure| self.blame(0, failure))?;
        // One pass, in u32 lanes so it vectorises: is any answer out of range (`v + 1 > count`,
        // wrapping, is `v >= count` for every answer but UNDECIDED, whose successor is 0), and
        // how many are undecided (a slab holds fewer than 2^32 records).
        let (out_of_range, undecided) =
            decisions
                .iter()
                .fold((0u32, 0u32), |(out_of_range, undecided), &v| {
                    (
                        out_of_range | u32::from(v.wrapping_add(1) > partition_count),
                        undecided + u32::from(v == UNDECIDED),
                    )
                });
        if out_of_range != 0
            && let Some(index) = decisions
                .iter()
                .position(|&v| v != UNDECIDED && v >= partition_count)
        {
            let failure = Failure::OutOfRange {
                value: decisions[index],
                record_offset: records[index].parent_offset(),
                partition_count,
            };
            return Err(self.blame(0, failure));
        }
        let undecided = undecided as usize;
        self.members[0].records_decided += (records.len() - undecided) as u64;
        if undecided > 0 {
            collect_undecided(decisions, undecided, &mut self.pending);
        }
        for position in 1..self.members.len() {
            if self.pending.is_empty() {
                break;
            }
            self.answers.clear();
            self.answers.resize(self.pending.len(), UNDECIDED);
            let mut answers = std::mem::take(&mut self.answers);
            let called = self.timed_call(position, ctx, records, &mut answers);
            self.answers = answers;
            if let Err(failure) = called {
                return Err(self.blame(position, failure));
            }
            // Apply the answers; keep the still-undecided indices in order. Both slices have
            // one slot per pending record, so only the decision store is bounds-checked.
            let n = self.pending.len();
            let (pending, answers) = (&mut self.pending[..n], &self.answers[..n]);
            let mut kept = 0;
            let mut out_of_range = None;
            for k in 0..n {
                let (index, value) = (pending[k], answers[k]);
                if value == UNDECIDED {
                    pending[kept] = index;
                    kept += 1;
                } else if value < partition_count {
                    decisions[index as usize] = value;
                } else {
                    out_of_range = Some(Failure::OutOfRange {
                        value,
                        record_offset: records[index as usize].parent_offset(),
                        partition_count,
                    });
                    break;
                }
            }
            if let Some(failure) = out_of_range {
                return Err(self.blame(position, failure));
            }
            self.members[position].records_decided += (self.pending.len() - kept) as u64;
            self.pending.truncate(kept);
        }
        if let Some(&first) = self.pending.first() {
            let failure = Failure::Undecided {
                record_offset: records[first as usize].parent_offset(),
            };
            return Err(self.blame(last, failure));
        }
        Ok(())
    }

    /// [`Chain::call_member`], its wall-clock time added to the member's `busy`.
    fn timed_call<R: SlabRecord>(
        &mut self,
        position: usize,
        ctx: &RouteContext,
        records: &[R],
        answers: &mut [u32],
    ) -> Result<(), Failure> {
        let started = Instant::now();
        let called = self.call_member(position, ctx, records, answers);
        self.members[position].busy += started.elapsed();
        called
    }

    /// Calls plugin `position` on its records (every record for the first plugin, the
    /// pending ones for the others), leaving one answer per record in `answers`.
    fn call_member<R: SlabRecord>(
        &mut self,
        position: usize,
        ctx: &RouteContext,
        records: &[R],
        answers: &mut [u32],
    ) -> Result<(), Failure> {
        let member = &mut self.members[position];
        let handed = if position == 0 {
            records.len()
        } else {
            self.pending.len()
        };
        if self.searching {
            member.search_calls += 1;
        } else {
            member.calls += 1;
            member.records_in += handed as u64;
        }
        let encoder = SlabEncoder::new(ctx.as_ref(), member.instance.plugin().needs())
            .map_err(|e| host(e.to_string()))?;
        if position == 0 {
            // The records are encoded straight from the slab, without going through indices.
            encode_and_call(&mut member.instance, &encoder, || records.iter(), answers)
        } else {
            let pending = &self.pending;
            let selected = || pending.iter().map(|&i| &records[i as usize]);
            encode_and_call(&mut member.instance, &encoder, selected, answers)
        }
    }

    fn blame(&mut self, position: usize, failure: Failure) -> PluginError {
        let member = &mut self.members[position];
        if !self.searching {
            member.failures[failure.kind().index()] += 1;
        }
        // Whatever went wrong, the plugin's state is suspect: start it afresh next time.
        member.instance.reset();
        let plugin = member.instance.plugin();
        tracing::debug!(
            plugin = plugin.name(),
            position,
            kind = %failure.kind(),
            "routing plugin failed: {failure}"
        );
        PluginError {
            position,
            name: plugin.name().to_owned(),
            version: plugin.manifest().version.clone(),
            digest: plugin.digest(),
            failure: Box::new(failure),
        }
    }

    /// Finds the first record of `records` that the chain cannot route: `None` if the whole
    /// slab routes, or if it fails for its config (`ROUTE_ERR_BAD_CONFIG`, see
    /// [`Failure::is_bad_config`]), which no record can be blamed for. For use when a slab
    /// keeps failing, so the error can name the record.
    ///
    /// Binary search on the shortest failing prefix (about `log2(n) + 2` routings of the
    /// chain, each at most one slab). Each routing is a call with its own attempt number:
    /// `ctx.attempt + 1`, `+ 2`, ... ([`Chain::last_search_routings`] says how many were
    /// used, so the caller's next retry can count on from there). The search's calls are
    /// counted in [`PluginStats::search_calls`], and its failures not at all (they repeat the
    /// failure that started it). Plugin state (such as the round-robin counter) moves on as
    /// for any routing call, which does not matter for a slab that is going to be retried.
    pub fn bisect<R: SlabRecord>(
        &mut self,
        ctx: &RouteContext,
        records: &[R],
    ) -> Option<PoisonRecord> {
        self.searching = true;
        self.last_search_routings = 0;
        let found = self.search(ctx, records);
        self.searching = false;
        found
    }

    /// How many routings of the chain the last [`Chain::bisect`] made (0 before any).
    pub fn last_search_routings(&self) -> u32 {
        self.last_search_routings
    }

    /// One routing of the search, with the next attempt number.
    fn search_route<R: SlabRecord>(
        &mut self,
        ctx: &RouteContext,
        records: &[R],
    ) -> Result<Vec<u32>, PluginError> {
        self.last_search_routings += 1;
        let mut probe = ctx.clone();
        probe.attempt = ctx.attempt.saturating_add(self.last_search_routings);
        self.route(&probe, records)
    }

    fn search<R: SlabRecord>(&mut self, ctx: &RouteContext, records: &[R]) -> Option<PoisonRecord> {
        let mut failing = match self.search_route(ctx, records) {
            Ok(_) => return None,
            Err(error) if error.failure.is_bad_config() => return None,
            Err(error) => error,
        };
        // Invariant: records[..passing] routes, records[..failing_len] does not.
        let (mut passing, mut failing_len) = (0usize, records.len());
        while failing_len - passing > 1 {
            let mid = passing + (failing_len - passing) / 2;
            match self.search_route(ctx, &records[..mid]) {
                Ok(_) => passing = mid,
                Err(error) => {
                    failing_len = mid;
                    failing = error;
                }
            }
        }
        let index = failing_len - 1;
        let (error, alone) = match self.search_route(ctx, &records[index..=index]) {
            Err(error) => (error, true),
            Ok(_) => (failing, false),
        };
        Some(PoisonRecord {
            index,
            parent_offset: records[index].parent_offset(),
            error,
            alone,
        })
    }
}

/// Encodes the records `selected` yields straight into `instance`'s memory, calls it, and
/// leaves one answer per record in `answers` (which must have one slot per record).
fn encode_and_call<I>(
    instance: &mut Instance,
    encoder: &SlabEncoder,
    selected: impl Fn() -> I,
    answers: &mut [u32],
) -> Result<(), Failure>
where
    I: Iterator,
    I::Item: SlabRecord,
{
    let layout = encoder
        .layout(selected())
        .map_err(|e| host(e.to_string()))?;
    instance.route_with(
        layout.record_count(),
        layout.total_len(),
        |dst| {
            encoder
                .write(&layout, selected(), dst)
                .map(|_| ())
                .map_err(|e| host(e.to_string()))
        },
        answers,
    )
}

/// Sets `pending` to the indices of the `undecided` slots of `decisions` that are
/// [`UNDECIDED`], in order. A bit mask per 16 slots (a branch-free, vectorised pass), then one
/// step per set bit: a branch per slot mispredicts on slabs that mix keyed and keyless records.
fn collect_undecided(decisions: &[u32], undecided: usize, pending: &mut Vec<u32>) {
    const LANES: usize = 16;
    pending.clear();
    pending.reserve(undecided);
    let mut push_set_bits = |base: usize, mut mask: u32| {
        while mask != 0 {
            // A slab holds fewer than 2^32 records, so the index fits in u32.
            pending.push((base + mask.trailing_zeros() as usize) as u32);
            mask &= mask - 1;
        }
    };
    let (chunks, rest) = decisions.as_chunks::<LANES>();
    for (c, chunk) in chunks.iter().enumerate() {
        let mut mask = 0u16;
        for (j, &v) in chunk.iter().enumerate() {
            mask |= u16::from(v == UNDECIDED) << j;
        }
        push_set_bits(c * LANES, u32::from(mask));
    }
    let mut mask = 0u32;
    for (j, &v) in rest.iter().enumerate() {
        mask |= u32::from(v == UNDECIDED) << j;
    }
    push_set_bits(chunks.len() * LANES, mask);
}

fn host(message: String) -> Failure {
    Failure::Host { message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn the_undecided_indices_are_collected_in_order_across_mask_boundaries() {
        for len in [0usize, 1, 15, 16, 17, 33, 63, 64, 65, 130, 4096] {
            let decisions: Vec<u32> = (0..len)
                .map(|i| {
                    // Every mask's last slot, and others.
                    if i % 7 == 0 || i % 16 == 15 {
                        UNDECIDED
                    } else {
                        1
                    }
                })
                .collect();
            let want: Vec<u32> = (0..len as u32)
                .filter(|&i| decisions[i as usize] == UNDECIDED)
                .collect();
            let mut pending = vec![99];
            collect_undecided(&decisions, want.len(), &mut pending);
            assert_eq!(pending, want, "{len} slots");
        }
    }

    #[test]
    fn chain_can_move_to_a_blocking_pool() {
        assert_send::<Chain>();
        assert_send::<Plugin>();
    }
}
