//! The write fence of a cluster node: what keeps a node that may be counted dead from taking,
//! and from acknowledging, writes.
//!
//! A write is admitted under the node's current lease (its term) and acknowledged only if,
//! once it is durable, the node still holds that lease, is not fenced and still serves the
//! partition. A node stopped (or cut off) mid-write past its lease comes back to find all
//! three checked: its partition may have been re-created elsewhere while it was counted
//! dead, and a write stored only in its old copy must not be answered as kept.

use std::sync::Arc;

use narad_storage::PartitionId;

use super::membership::Membership;
use super::ownership::ClusterOwnership;
use crate::ownership::{FenceError, PartitionOwnership, WriteFence, WriteTerm};

/// [`WriteFence`] of a node in cluster mode.
pub(crate) struct NodeFence {
    membership: Arc<Membership>,
    ownership: Arc<ClusterOwnership>,
}

impl NodeFence {
    /// The fence of the node `membership` registers, serving what `ownership` says.
    pub(crate) fn new(membership: Arc<Membership>, ownership: Arc<ClusterOwnership>) -> NodeFence {
        NodeFence {
            membership,
            ownership,
        }
    }
}

impl WriteFence for NodeFence {
    fn admit(&self) -> Result<WriteTerm, FenceError> {
        let term = WriteTerm(self.membership.lease_id());
        match self.membership.fence_reason() {
            Some(reason) => Err(FenceError::Fenced { reason }),
            None => Ok(term),
        }
    }

    fn confirm(&self, term: WriteTerm, partition: &PartitionId) -> Result<(), FenceError> {
        // The term is read before the fence: a lease lost after this read is caught by the
        // fence (the renewal that would have kept it never came, so the node is fenced).
        let now = WriteTerm(self.membership.lease_id());
        if let Some(reason) = self.membership.fence_reason() {
            return Err(FenceError::FencedDuringWrite { reason });
        }
        let me = self.ownership.local_node();
        if now != term {
            return Err(FenceError::LeaseLost {
                node: me.clone(),
                partition: partition.clone(),
            });
        }
        match self.ownership.owner(partition) {
            Some(owner) if &owner == me => Ok(()),
            owner => Err(FenceError::NotServed {
                node: me.clone(),
                partition: partition.clone(),
                owner,
            }),
        }
    }
}
