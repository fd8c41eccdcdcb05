//! Running a chain locally on given records, for `narad plugin test` (no daemon).
//!
//! The records are routed in slabs of at most [`TRIAL_SLAB_RECORDS`] through one chain, as a
//! cursor would, so round-robin continues across slabs exactly as in production.

use narad_abi::{RouteContext, SlabRecord};

use crate::chain::{Chain, PoisonRecord};
use crate::error::PluginError;

/// Records per slab in a trial: 4,096, the engine's slab bound.
pub const TRIAL_SLAB_RECORDS: usize = 4096;

/// What a trial run decided.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrialReport {
    /// The child partition of each record, in input order.
    pub decisions: Vec<u32>,
    /// Records per child partition (`child_partition_count` entries).
    pub distribution: Vec<u64>,
}

/// A trial run failed: the plugin error, and the first record the chain cannot route when it
/// could be isolated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
#[non_exhaustive]
pub struct TrialError {
    /// The error of the failing slab.
    pub error: Box<PluginError>,
    /// The record the chain cannot route (found by bisecting the failing slab).
    pub poison: Option<Box<PoisonRecord>>,
}

/// Routes `records` through `chain` under `ctx` in slabs of [`TRIAL_SLAB_RECORDS`] and returns
/// each record's decision and the distribution per child partition.
pub fn run_trial<R: SlabRecord>(
    chain: &mut Chain,
    ctx: &RouteContext,
    records: &[R],
) -> Result<TrialReport, TrialError> {
    let mut decisions = Vec::with_capacity(records.len());
    for slab in records.chunks(TRIAL_SLAB_RECORDS) {
        match chain.route(ctx, slab) {
            Ok(d) => decisions.extend_from_slice(&d),
            Err(error) => {
                // A config error is about no record: there is none to search for.
                let poison = if error.failure.is_bad_config() {
                    None
                } else {
                    chain.bisect(ctx, slab)
                };
                let poison = poison.map(|mut p| {
                    p.index += decisions.len();
                    Box::new(p)
                });
                return Err(TrialError {
                    error: Box::new(error),
                    poison,
                });
            }
        }
    }
    // The chain checked every decision against the partition count, so each has a slot.
    let mut distribution = vec![0u64; ctx.child_partition_count as usize];
    for &d in &decisions {
        if let Some(count) = distribution.get_mut(d as usize) {
            *count += 1;
        }
    }
    Ok(TrialReport {
        decisions,
        distribution,
    })
}
