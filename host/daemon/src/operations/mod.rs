//! Operator actions that move or re-create a partition's data, each asked for by an operator
//! and carried out by the nodes involved:
//!
//! - [`moves`]: a planned move of a partition to another node (nothing lost, nothing copied
//!   twice);
//! - [`recreate`]: re-creating, empty, a partition whose owner is dead, accepting the loss and
//!   counting it;
//! - `lost_partition`: the same on one node, for a partition whose directory is gone.
//!
//! They sit above the reconciler and the cursors, so they ask the cursors' view how many
//! cursors of a partition run and set directories aside through `topics` directly.

pub(crate) mod lost_partition;
pub mod moves;
pub mod recreate;

/// Why a partition directory found where a moved-in copy is to go is set aside.
pub(crate) const SET_ASIDE_BEFORE_MOVE_IN: &str = "found where a moved-in copy was to go (left \
     by an earlier move to this node that did not finish?); kept untouched: adopt or purge it \
     with `narad admin set-aside`";

/// Why a partition directory found where a re-created partition is to go is set aside.
pub(crate) const SET_ASIDE_BEFORE_RECREATE: &str = "found where a re-created partition was to \
     go; kept untouched: adopt or purge it with `narad admin set-aside`";

/// Sets the partition directory `dir` of `id` aside, intact, under `reason`: what an
/// operation does with a directory it finds where its new copy is to go.
pub(crate) fn set_aside_partition(
    store: &narad_storage::Store,
    dir: &std::path::Path,
    id: &narad_storage::PartitionId,
    reason: &str,
) -> Result<(), crate::topics::set_aside::SetAsideError> {
    crate::topics::set_aside::set_aside(
        store.data_dir(),
        dir,
        &id.topic,
        Some(id.partition),
        reason,
        crate::topics::now_ms(),
    )
    .map(|_| ())
}
