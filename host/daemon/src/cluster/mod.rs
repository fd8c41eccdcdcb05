//! Cluster mode: several narad nodes sharing one etcd (see `docs/cluster.md` and the design in
//! CLUSTER.md). This module holds what only exists with more than one node:
//! - [`commit_wire`]: the binary encoding of a child commit sent to the child partition's
//!   owner, with its provenance and the ownership generation the sender saw;
//! - [`commit_rpc`]: that commit over HTTP between nodes (`POST /internal/v1/commit`), the
//!   handler and a fail-fast client;
//! - [`dedupe`]: the exact window of origins a child partition holds, which absorbs a
//!   repeated child commit;
//! - [`membership`]: a node's lease-held key, one process per node id, self-fencing;
//! - [`receiver`]: applies a child commit on the child partition's owner: fence on the
//!   generation, drop what the partition holds, append;
//! - [`ownership`]: who serves a partition, from each topic's owners in the watched metadata;
//! - [`placement`]: which node a new partition goes to (pinned, spread, away from the
//!   parent's partition).
//!
//! The metadata itself lives in [`crate::metastore::etcd`], behind the same `Metastore` trait
//! and rules as the embedded file.

pub mod commit_rpc;
pub mod commit_wire;
pub mod dedupe;
pub mod membership;
pub mod ownership;
pub mod placement;
pub mod receiver;

pub use membership::{Membership, MembershipError, NodeRecord};

/// The key prefix of cluster `name` in etcd: every key narad writes for it lives under this,
/// so several clusters (and test runs) can share one etcd.
pub fn prefix(name: &str) -> String {
    format!("/narad/{name}/")
}
