//! The JSON shapes of the HTTP API, shared by the server handlers and the CLI client. Most
//! need nothing of the daemon and live in the lowest layer, [`crate::protocol::api`]
//! (re-exported here, so peers' transports can use them too); the few here show the daemon's
//! own records (set-aside entries, plugin references, shadow reports).

use serde::{Deserialize, Serialize};

pub use crate::protocol::api::*;

/// `GET /v1/admin/set-aside` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAsideList {
    /// Every set-aside entry, oldest first.
    pub entries: Vec<crate::topics::set_aside::SetAsideEntry>,
}

/// The answer to setting or clearing a shadow: the shadow as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowInfo {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
    /// The candidate chain, pinned to digests.
    pub router: Vec<crate::metastore::PluginRef>,
    /// The candidate's config.
    pub config: String,
    /// When it was set, ms since the Unix epoch.
    pub set_at_ms: i64,
}

/// `GET /v1/topics/{parent}/children/{child}/shadow` answer: the shadow and its report, summed
/// over the nodes that run the link's cursors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowStatus {
    /// The shadow as recorded.
    pub shadow: ShadowInfo,
    /// The link's own chain, the one the candidate is compared with.
    pub current_router: Vec<crate::metastore::PluginRef>,
    /// True when the shadow runs on at least one node that runs cursors of the link (on one
    /// node: this one). False for up to a second after it is set, until the reconcilers' next
    /// pass.
    pub running: bool,
    /// Cluster mode: the nodes whose reports are summed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Cluster mode: owners of parent partitions whose report could not be read, so the sum
    /// leaves their slabs out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes_unreachable: Vec<String>,
    /// The comparison so far.
    pub report: crate::fanout::shadow::ShadowReport,
}
