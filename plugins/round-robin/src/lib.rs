//! `round-robin`: decides every record still undecided, cycling through the child's
//! partitions. The position lives in the plugin instance, which the host keeps one of per
//! link, so the cycle is per child topic and continues across slabs. A retry (attempt > 0)
//! is placed afresh: it simply continues the cycle, so a retried record may land in another
//! (perhaps healthy) partition. When the child's partition count changes, the cycle continues
//! from its position modulo the new count.
//!
//! Layout: this file only (the router, its state and its tests).
#![cfg_attr(not(test), no_std)]

use narad_guest::{Decisions, RouteContext, RouteError, Slab};

/// The next child partition to hand out; one per plugin instance (per link).
#[derive(Debug, Default)]
pub struct Cycle {
    next: u32,
}

#[narad_guest::router(
    name = "round-robin",
    description = "every record still undecided, round-robin per child topic",
    needs = [keys]
)]
fn route(
    cycle: &mut Cycle,
    ctx: &RouteContext,
    _slab: &Slab,
    out: &mut Decisions,
) -> Result<(), RouteError> {
    let partitions = ctx.child_partition_count;
    if partitions == 0 {
        return Err(RouteError::plugin("child topic has no partitions"));
    }
    let mut next = cycle.next % partitions;
    // Every record handed in is decided, whatever it holds: only the slots are walked, not the
    // record table (the slab is not read at all).
    for slot in out.slots_mut() {
        *slot = next;
        next += 1;
        if next == partitions {
            next = 0;
        }
    }
    cycle.next = next;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use narad_guest::testing::{Instance, SlabBuilder};

    use super::PLUGIN;

    fn slab(n: usize, child_partitions: u32) -> SlabBuilder {
        (0..n).fold(SlabBuilder::new().child("c", child_partitions), |s, _| {
            s.keyless()
        })
    }

    #[test]
    fn records_cycle_through_every_partition() {
        let out = slab(7, 3).route(&PLUGIN).unwrap();
        assert_eq!(out, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn the_cycle_continues_across_slabs_of_one_instance() {
        let mut link = Instance::new(&PLUGIN);
        assert_eq!(link.route(&slab(2, 3)).unwrap(), [0, 1]);
        assert_eq!(link.route(&slab(2, 3)).unwrap(), [2, 0]);
    }

    #[test]
    fn each_link_has_its_own_cycle() {
        let mut a = Instance::new(&PLUGIN);
        let mut b = Instance::new(&PLUGIN);
        assert_eq!(a.route(&slab(2, 4)).unwrap(), [0, 1]);
        assert_eq!(b.route(&slab(1, 4)).unwrap(), [0]);
        assert_eq!(a.route(&slab(1, 4)).unwrap(), [2]);
    }

    #[test]
    fn a_retry_continues_the_cycle_instead_of_repeating_it() {
        let mut link = Instance::new(&PLUGIN);
        assert_eq!(link.route(&slab(2, 4)).unwrap(), [0, 1]);
        assert_eq!(link.route(&slab(2, 4).attempt(1)).unwrap(), [2, 3]);
    }

    #[test]
    fn a_shrunk_child_keeps_every_answer_in_range() {
        let mut link = Instance::new(&PLUGIN);
        assert_eq!(link.route(&slab(3, 8)).unwrap(), [0, 1, 2]);
        assert_eq!(link.route(&slab(3, 2)).unwrap(), [1, 0, 1]);
    }

    #[test]
    fn keyed_records_handed_in_are_placed_too() {
        let out = SlabBuilder::new()
            .child("c", 2)
            .keyed("k")
            .keyless()
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [0, 1]);
    }
}
