//! `keyless-index`: when the child has as many partitions as the parent, a keyless record
//! keeps its parent partition's index. Child partition p is placed away from the owner of
//! parent partition p, so the record's two copies sit on different nodes (as a key's hash
//! gives a keyed record), and the parent partition's keyless records stay in order. With
//! different counts it decides nothing, leaving keyless records to the next plugin.
//!
//! Layout: this file only (the router and its tests).
#![cfg_attr(not(test), no_std)]

extern crate alloc;

use narad_guest::{Decisions, RouteContext, RouteError, Slab};

#[narad_guest::router(
    name = "keyless-index",
    description = "keyless records keep their parent partition when the partition counts match",
    needs = [keys]
)]
fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
    if ctx.parent_partition_count != ctx.child_partition_count {
        return Ok(());
    }
    let index = ctx.parent_partition;
    if index >= ctx.child_partition_count {
        return Err(RouteError::plugin(alloc::format!(
            "parent partition {index} is outside the {} partitions of its topic",
            ctx.parent_partition_count
        )));
    }
    for record in slab.records() {
        if !record.has_key() {
            out.decide(&record, index);
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use narad_guest::testing::SlabBuilder;
    use narad_guest::{RouteError, UNDECIDED};

    use super::PLUGIN;

    #[test]
    fn keyless_records_keep_the_parent_index_when_counts_match() {
        let out = SlabBuilder::new()
            .parent("orders", 5, 8)
            .child("copy", 8)
            .keyless()
            .keyed("k")
            .keyed("")
            .keyless()
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [5, UNDECIDED, UNDECIDED, 5]);
    }

    #[test]
    fn nothing_is_decided_when_counts_differ() {
        let out = SlabBuilder::new()
            .parent("orders", 1, 4)
            .child("wide", 8)
            .keyless()
            .keyless()
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [UNDECIDED, UNDECIDED]);
    }

    #[test]
    fn an_inconsistent_context_is_a_plugin_error_not_an_out_of_range_answer() {
        let err = SlabBuilder::new()
            .parent("orders", 9, 4)
            .child("copy", 4)
            .keyless()
            .route(&PLUGIN)
            .unwrap_err();
        assert!(matches!(err, RouteError::Plugin(_)));
    }
}
