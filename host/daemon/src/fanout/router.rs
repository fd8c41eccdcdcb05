//! The seam between a cursor and its link's router chain.
//!
//! The cursor only needs "give every record of this slab a child partition"; the Wasm chain
//! (`narad_runtime`) is one implementation, and tests use native ones. One router instance
//! serves every cursor of a link on this node, so state such as the round-robin counter
//! belongs to the child topic, not to a parent partition.

use std::sync::{Arc, Mutex};

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
    /// A short machine-readable kind (`trap`, `deadline`, `out_of_range`, ...).
    pub kind: String,
    /// What happened, for operators.
    pub message: String,
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
            kind: "wrong_length".into(),
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
            kind: "out_of_range".into(),
            message: format!(
                "the router sent parent offset {} to partition {decision}, but the child has {partitions}",
                record.offset
            ),
        });
    }
    Ok(())
}
