//! When the reconciler runs a full pass, and when it sweeps orphan cursor files.
//!
//! A full pass compares every link against every running cursor; the engine reference makes it
//! skippable while no metadata domain moved, but never for longer than 30 s, and always after a
//! pass that failed or left work behind, or after a cursor exited.

use std::time::{Duration, Instant};

/// Longest time between two full passes, even when no version moved (engine reference:
/// reconcileForcedPassEvery = 30 s).
pub(crate) const FORCED_PASS_EVERY: Duration = Duration::from_secs(30);

/// Every how many ticks (skipped ticks included) the orphan cursor-file sweep runs (engine
/// reference: every 30th tick). A sweep tick always runs a full pass.
pub const ORPHAN_SWEEP_EVERY_TICKS: u64 = 30;

/// What one tick must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TickPlan {
    /// Run the full comparison of desired against running cursors.
    pub(crate) full_pass: bool,
    /// Also delete offset files that no link explains.
    pub(crate) sweep_orphans: bool,
}

/// The reconciler's memory between ticks.
#[derive(Debug)]
pub(crate) struct Schedule {
    last_versions: Option<Vec<u64>>,
    last_full_pass: Option<Instant>,
    must_run: bool,
    ticks: u64,
}

impl Default for Schedule {
    fn default() -> Self {
        Self::new()
    }
}

impl Schedule {
    /// A schedule whose first tick runs a full pass.
    pub(crate) fn new() -> Schedule {
        Schedule {
            last_versions: None,
            last_full_pass: None,
            must_run: true,
            ticks: 0,
        }
    }

    /// Plans the tick at `now`, given the metastore's domain versions.
    pub(crate) fn plan(&mut self, versions: &[u64], now: Instant) -> TickPlan {
        self.ticks += 1;
        let sweep_orphans = self.ticks.is_multiple_of(ORPHAN_SWEEP_EVERY_TICKS);
        let moved = self.last_versions.as_deref() != Some(versions);
        let stale = self
            .last_full_pass
            .is_none_or(|at| now.saturating_duration_since(at) >= FORCED_PASS_EVERY);
        let full_pass = self.must_run || moved || stale || sweep_orphans;
        TickPlan {
            full_pass,
            sweep_orphans,
        }
    }

    /// Records the outcome of a full pass that observed `versions`. `clean` is false when the
    /// pass failed or left work behind (a cursor still draining, ownership it could not read):
    /// the next tick then runs a full pass again.
    pub(crate) fn full_pass_done(&mut self, versions: &[u64], now: Instant, clean: bool) {
        self.last_versions = Some(versions.to_vec());
        self.last_full_pass = Some(now);
        self.must_run = !clean;
    }

    /// Forces a full pass on the next tick (a cursor exited).
    pub(crate) fn cursor_exited(&mut self) {
        self.must_run = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_tick_runs_a_full_pass() {
        let mut schedule = Schedule::new();
        assert!(schedule.plan(&[1, 1, 1], Instant::now()).full_pass);
    }

    #[test]
    fn unchanged_versions_skip_the_pass() {
        let mut schedule = Schedule::new();
        let start = Instant::now();
        schedule.plan(&[1, 2, 3], start);
        schedule.full_pass_done(&[1, 2, 3], start, true);
        let later = start + Duration::from_secs(1);
        assert!(!schedule.plan(&[1, 2, 3], later).full_pass);
    }

    #[test]
    fn a_moved_version_runs_the_pass() {
        let mut schedule = Schedule::new();
        let start = Instant::now();
        schedule.plan(&[1, 2, 3], start);
        schedule.full_pass_done(&[1, 2, 3], start, true);
        assert!(
            schedule
                .plan(&[1, 3, 3], start + Duration::from_secs(1))
                .full_pass
        );
    }

    #[test]
    fn a_pass_that_left_work_behind_is_repeated() {
        let mut schedule = Schedule::new();
        let start = Instant::now();
        schedule.plan(&[1], start);
        schedule.full_pass_done(&[1], start, false);
        assert!(
            schedule
                .plan(&[1], start + Duration::from_secs(1))
                .full_pass
        );
    }

    #[test]
    fn a_cursor_exit_forces_the_next_pass() {
        let mut schedule = Schedule::new();
        let start = Instant::now();
        schedule.plan(&[1], start);
        schedule.full_pass_done(&[1], start, true);
        schedule.cursor_exited();
        assert!(
            schedule
                .plan(&[1], start + Duration::from_secs(1))
                .full_pass
        );
    }

    #[test]
    fn a_full_pass_runs_at_least_every_30_seconds() {
        let mut schedule = Schedule::new();
        let start = Instant::now();
        schedule.plan(&[1], start);
        schedule.full_pass_done(&[1], start, true);
        assert!(
            !schedule
                .plan(&[1], start + Duration::from_secs(29))
                .full_pass
        );
        assert!(schedule.plan(&[1], start + FORCED_PASS_EVERY).full_pass);
    }

    #[test]
    fn every_thirtieth_tick_sweeps_orphans_with_a_full_pass() {
        let mut schedule = Schedule::new();
        let start = Instant::now();
        let mut sweeps = Vec::new();
        for tick in 1..=60u64 {
            let plan = schedule.plan(&[7], start);
            if plan.full_pass {
                schedule.full_pass_done(&[7], start, true);
            }
            if plan.sweep_orphans {
                assert!(plan.full_pass);
                sweeps.push(tick);
            }
        }
        assert_eq!(sweeps, vec![30, 60]);
    }
}
