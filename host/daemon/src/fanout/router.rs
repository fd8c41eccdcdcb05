//! The seam between a cursor and its link's router chain.
//!
//! The cursor only needs "give every record of this slab a child partition"; the Wasm chain
//! (`narad_runtime`) is one implementation, and tests use native ones. One router instance
//! serves every cursor of a link on this node, so state such as the round-robin counter
//! belongs to the child topic, not to a parent partition.

use std::sync::{Arc, Mutex};

use narad_runtime::FailureKind;
use narad_storage::StoredRecord;

use crate::metastore::LinkMeta;

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
    /// The router panicked on an earlier slab, leaving its lock poisoned (`poisoned`).
    Poisoned,
    /// The routing task panicked or was cancelled on this slab (`panic`).
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
}

/// A router shared by the cursors of one link; swapping the inside takes effect at the next
/// slab of every cursor.
pub type SharedRouter = Arc<Mutex<Box<dyn SlabRouter>>>;

/// Builds the router chain of a link. The reconciler holds one and calls it whenever a link
/// appears or its router changes; [`super::wasm_router::WasmRouterFactory`] is the daemon's.
pub trait RouterFactory: Send + Sync + 'static {
    /// A fresh chain (fresh plugin instances) for `link`, or why it cannot be built.
    fn build(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, String>;
}

/// Checks a router's answer: one decision per record, each below the partition count.
pub fn check_decisions(
    decisions: &[u32],
    records: &[StoredRecord],
    partitions: u32,
) -> Result<(), RouteFailure> {
    if decisions.len() != records.len() {
        return Err(RouteFailure {
            plugin: None,
            kind: RouteFailureKind::WrongLength,
            message: format!(
                "the router returned {} decisions for {} records",
                decisions.len(),
                records.len()
            ),
        });
    }
    if let Some((decision, record)) = decisions
        .iter()
        .zip(records)
        .find(|(d, _)| **d >= partitions)
    {
        return Err(RouteFailure {
            plugin: None,
            kind: RouteFailureKind::OutOfRange,
            message: format!(
                "the router sent parent offset {} to partition {decision}, but the child has {partitions}",
                record.offset
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
                value: Bytes::from_static(b"v"),
                origin: None,
            })
            .collect()
    }

    #[test]
    fn too_few_decisions_are_a_wrong_length_failure_naming_both_counts() {
        let failure = check_decisions(&[0], &records(2), 4).unwrap_err();
        assert_eq!(failure.kind, RouteFailureKind::WrongLength);
        assert_eq!(failure.plugin, None);
        assert_eq!(
            failure.to_string(),
            "the router returned 1 decisions for 2 records"
        );
    }

    #[test]
    fn a_decision_past_the_partition_count_is_an_out_of_range_failure() {
        let failure = check_decisions(&[0, 4], &records(2), 4).unwrap_err();
        assert_eq!(failure.kind, RouteFailureKind::OutOfRange);
        assert_eq!(
            failure.to_string(),
            "the router sent parent offset 1 to partition 4, but the child has 4"
        );
        assert_eq!(check_decisions(&[0, 3], &records(2), 4), Ok(()));
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
