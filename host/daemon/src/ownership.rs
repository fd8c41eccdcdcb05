//! Partition ownership: which node serves (produces to, fetches from, runs cursors for) each
//! partition.
//!
//! On one node this node owns everything ([`SingleNode`]). The trait is the seam where a
//! multi-node assignment (read from a shared metastore) plugs in later, so that callers already
//! ask "is this partition mine?" rather than assuming it.

use std::fmt;

use narad_storage::PartitionId;

/// A node's identity in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub String);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The lease a write began under ([`WriteFence::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTerm(pub i64);

/// Why a write is not taken, or not acknowledged ([`WriteFence`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The node takes no writes now; `reason` says why (etcd out of reach for nearly a lease
    /// TTL, or joined again and still reading what changed while it was away).
    #[error("{reason}")]
    Fenced {
        /// Why, in the membership's words.
        reason: String,
    },
    /// The node was fenced while the write ran: it is not acknowledged.
    #[error("{reason} (a write in progress was not acknowledged: it may or may not be stored)")]
    FencedDuringWrite {
        /// Why, in the membership's words.
        reason: String,
    },
    /// The node's lease changed while the write ran: it may have been counted dead and its
    /// partition given away meanwhile.
    #[error(
        "node {node} lost its lease while a write to {partition} was in progress (it may have \
         been counted dead meanwhile): the write is not acknowledged, it may or may not be \
         stored; retry"
    )]
    LeaseLost {
        /// This node.
        node: NodeId,
        /// The partition written.
        partition: PartitionId,
    },
    /// The metadata no longer gives the partition to this node.
    #[error(
        "partition {partition} is no longer served by node {node} (the metadata names {}): a \
         write in progress was not acknowledged, it may or may not be stored; retry",
        .owner.as_ref().map_or_else(|| "no owner".to_owned(), |o| format!("node {o}"))
    )]
    NotServed {
        /// This node.
        node: NodeId,
        /// The partition written.
        partition: PartitionId,
        /// Its owner in the metadata now, if any.
        owner: Option<NodeId>,
    },
}

/// Keeps a node the cluster may count as dead from taking writes, and from acknowledging one
/// it cannot be sure to keep. In cluster mode a node fences itself when etcd has not confirmed
/// a lease renewal for nearly a TTL, and after it joined again until it has read what changed
/// while it was away; a write that began under one lease and ended under another is not
/// acknowledged, since its partition may have been given to another node in between.
pub trait WriteFence: Send + Sync {
    /// Before a write: the term it runs under, or why this node takes no writes now.
    fn admit(&self) -> Result<WriteTerm, FenceError>;

    /// After the write is durable, before it is acknowledged: `Ok` when the node held the
    /// lease of `term` all along, is not fenced and still serves `partition`; otherwise why
    /// the write must not be acknowledged (it may or may not be stored).
    fn confirm(&self, term: WriteTerm, partition: &PartitionId) -> Result<(), FenceError>;
}

/// A fence that only says whether the node takes writes now (tests, and simple callers):
/// admitted writes are confirmed unless it is fenced by then.
impl<F: Fn() -> Option<String> + Send + Sync> WriteFence for F {
    fn admit(&self) -> Result<WriteTerm, FenceError> {
        self().map_or(Ok(WriteTerm(0)), |reason| {
            Err(FenceError::Fenced { reason })
        })
    }

    fn confirm(&self, _term: WriteTerm, _partition: &PartitionId) -> Result<(), FenceError> {
        self().map_or(Ok(()), |reason| Err(FenceError::Fenced { reason }))
    }
}

/// Answers who owns a partition.
pub trait PartitionOwnership: Send + Sync + 'static {
    /// This node's identity.
    fn local_node(&self) -> &NodeId;

    /// The node that owns `partition`, or `None` when no node is assigned (yet).
    fn owner(&self, partition: &PartitionId) -> Option<NodeId>;

    /// Whether this node owns `partition`.
    fn is_local(&self, partition: &PartitionId) -> bool {
        self.owner(partition).as_ref() == Some(self.local_node())
    }

    /// Whether a planned move of `partition` to another node is under way: its owner runs no
    /// cursors for it and takes no writes until the move ends. Never on one node.
    fn is_moving(&self, _partition: &PartitionId) -> bool {
        false
    }
}

/// Ownership on a single node: this node owns every partition.
#[derive(Debug, Clone)]
pub struct SingleNode {
    node: NodeId,
}

impl SingleNode {
    /// The name the single node goes by.
    pub(crate) const DEFAULT_NODE_ID: &'static str = "local";

    /// A single node named `node`.
    pub fn new(node: NodeId) -> SingleNode {
        SingleNode { node }
    }
}

impl Default for SingleNode {
    fn default() -> SingleNode {
        SingleNode::new(NodeId(SingleNode::DEFAULT_NODE_ID.to_owned()))
    }
}

impl PartitionOwnership for SingleNode {
    fn local_node(&self) -> &NodeId {
        &self.node
    }

    fn owner(&self, _partition: &PartitionId) -> Option<NodeId> {
        Some(self.node.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_node_owns_every_partition() {
        let node = SingleNode::default();
        for partition in [0, 7, 99_999] {
            let id = PartitionId {
                topic: "orders".to_owned(),
                partition,
            };
            assert!(node.is_local(&id));
            assert_eq!(node.owner(&id), Some(NodeId("local".to_owned())));
        }
    }
}
