//! Cluster mode: several narad nodes sharing one etcd (see `docs/cluster.md` and the design in
//! CLUSTER.md). This module holds what only exists with more than one node:
//! - [`commit_wire`]: the binary encoding of a child commit sent to the child partition's
//!   owner, with its provenance and the ownership generation the sender saw;
//! - [`commit_rpc`]: that commit over HTTP between nodes (`POST /internal/v1/commit`), the
//!   handler and a fail-fast client;
//! - [`dedupe`]: the exact window of origins a child partition holds, which absorbs a
//!   repeated child commit;
//! - [`fence`]: the write fence: no write taken, or acknowledged, by a node that may be
//!   counted dead;
//! - [`identity`]: which data dir a node id serves from, checked before it joins;
//! - [`membership`]: a node's lease-held key, one process per node id, self-fencing;
//! - [`metrics`]: lease, live-node and watch health on `/metrics`;
//! - [`modules`]: plugin modules fetched by digest from the node that holds them;
//! - [`moves`](crate::operations::moves): planned partition moves (mark, hand off, copy, take
//!   over at generation + 1);
//! - [`receiver`]: applies a child commit on the child partition's owner: fence on the
//!   generation, drop what the partition holds, append;
//! - [`ownership`]: who serves a partition, from each topic's owners in the watched metadata;
//! - [`peer_secret`]: the secret nodes present to each other's internal routes;
//! - [`peers`]: the live nodes and the addresses they advertise, watched;
//! - [`placement`]: which node a new partition goes to (pinned, spread, away from the
//!   parent's partition).
//!
//! The metadata itself lives in [`crate::metastore::etcd`], behind the same `Metastore` trait
//! and rules as the embedded file.

pub(crate) mod commit_rpc;
pub(crate) mod commit_wire;
pub(crate) mod dedupe;
pub(crate) mod fence;
pub mod identity;
pub(crate) mod membership;
pub(crate) mod metrics;
pub(crate) mod modules;
pub(crate) mod ownership;
pub(crate) mod peer_secret;
pub(crate) mod peers;
pub(crate) mod placement;
pub(crate) mod receiver;

pub use membership::{Membership, MembershipError, NodeRecord};

/// The key prefix of cluster `name` in etcd: every key narad writes for it lives under this,
/// so several clusters (and test runs) can share one etcd.
pub fn prefix(name: &str) -> String {
    format!("/narad/{name}/")
}

/// What a node in cluster mode shares with its API, cursors and background loops.
pub struct ClusterContext {
    /// The cluster's key prefix in etcd ([`prefix`]).
    pub prefix: String,
    /// This node's lease-held registration (its id and advertised address).
    pub(crate) membership: std::sync::Arc<Membership>,
    /// The metadata in etcd, with this node's watched copy.
    pub metastore: std::sync::Arc<crate::metastore::EtcdMetastore>,
    /// Who owns each partition, from the watched metadata.
    pub ownership: std::sync::Arc<ownership::ClusterOwnership>,
    /// The live nodes and their addresses, watched.
    pub(crate) peers: std::sync::Arc<peers::PeerDirectory>,
    /// The one client for calls to other nodes, presenting the peer secret
    /// ([`crate::peer::PeerClient`]); the commit client and the forwarder share its pool.
    pub(crate) peer: crate::peer::PeerClient,
    /// The secret other nodes' internal routes require ([`peer_secret`]).
    pub(crate) peer_bearer: String,
    /// How this node calls its peers (`--peer-tls-ca`, `--peer-tls-cert`, its id), for a
    /// client made in a runtime of its own (a module fetch).
    pub(crate) peer_tls: std::sync::Arc<crate::tls::PeerTls>,
}

/// A call between nodes carries the caller's metadata revision in this header; the callee
/// waits (at most `api::internal::REVISION_WAIT`) until its own watched copy has seen as
/// much, so a topic or owner the caller just wrote is known where the call lands.
pub const REVISION_HEADER: &str = "x-narad-revision";

/// Longest wait for a whole call to another node that is not a long-poll.
pub(crate) const PEER_CALL_TIMEOUT: std::time::Duration = crate::peer::CALL_TIMEOUT;

impl ClusterContext {
    /// The write fence of this node ([`fence::NodeFence`]).
    pub(crate) fn fence(&self) -> std::sync::Arc<dyn crate::ownership::WriteFence> {
        std::sync::Arc::new(fence::NodeFence::new(
            std::sync::Arc::clone(&self.membership),
            std::sync::Arc::clone(&self.ownership),
        ))
    }

    /// The parent partition of a commit's records, from the watched metadata
    /// ([`ownership::ClusterOwnership::parent_of`]).
    pub(crate) fn parents(&self) -> std::sync::Arc<receiver::ParentLookup> {
        let ownership = std::sync::Arc::clone(&self.ownership);
        std::sync::Arc::new(move |child: &str, epoch: [u8; 8], parent_partition: u32| {
            ownership.parent_of(child, epoch, parent_partition)
        })
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> &str {
        &self.membership.record().id
    }

    /// `POST {node's address}{path}` with a JSON body, this node's metadata revision and the
    /// peer secret: the one way nodes ask each other for a change (a move's steps, a seek). The
    /// answer comes back whatever its status; read a failed one with [`PeerError::refused`].
    pub(crate) async fn post_peer<B: serde::Serialize + ?Sized>(
        &self,
        node: &str,
        path: &str,
        body: &B,
        timeout: std::time::Duration,
    ) -> Result<reqwest::Response, PeerError> {
        self.call_peer(reqwest::Method::POST, node, path, timeout, |call| {
            call.json(body)
        })
        .await
    }

    /// `GET {node's address}{path}` with this node's metadata revision and the peer secret,
    /// decoded as JSON: the one way nodes read from each other (the public routes it reads are
    /// guarded on a daemon with a token, where nodes are the operator). Errors name the node
    /// (not alive, no answer, an error status, an answer that does not decode).
    pub(crate) async fn get_peer<T: serde::de::DeserializeOwned>(
        &self,
        node: &str,
        path: &str,
    ) -> Result<T, PeerError> {
        let answer = self
            .call_peer(
                reqwest::Method::GET,
                node,
                path,
                PEER_CALL_TIMEOUT,
                |call| call,
            )
            .await?;
        let status = answer.status();
        if !status.is_success() {
            return Err(PeerError::new(
                node,
                Some(status.as_u16()),
                format!("answered {status}"),
            ));
        }
        answer.json().await.map_err(|e| {
            PeerError::new(
                node,
                Some(status.as_u16()),
                format!("answered something else: {e}"),
            )
        })
    }

    /// A call to `node` at its advertised address, with this node's metadata revision and
    /// the peer secret, shaped by `with` (a body): its answer whatever the status.
    async fn call_peer(
        &self,
        method: reqwest::Method,
        node: &str,
        path: &str,
        timeout: std::time::Duration,
        with: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, PeerError> {
        let base = self
            .peers
            .advertise_of(node)
            .ok_or_else(|| PeerError::new(node, None, "is not alive"))?;
        let call = self
            .peer
            .call(method, &format!("{base}{path}"), timeout)
            .header(REVISION_HEADER, self.metastore.cache_revision());
        with(call).send().await.map_err(|e| {
            PeerError::new(
                node,
                None,
                format!("did not answer: {}", crate::tls::error_chain(&e)),
            )
        })
    }
}

/// A call to another node that did not give what was asked, naming the node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node} {reason}")]
pub struct PeerError {
    /// The node called.
    pub node: String,
    /// The HTTP status it answered, when it answered.
    pub status: Option<u16>,
    /// What went wrong, with the node's own message when it answered one.
    pub reason: String,
}

impl PeerError {
    /// A failed call to `node`.
    pub fn new(node: &str, status: Option<u16>, reason: impl Into<String>) -> PeerError {
        PeerError {
            node: node.to_owned(),
            status,
            reason: reason.into(),
        }
    }

    /// The error an answer with a failing status stands for, with the message of its JSON
    /// error body when it has one.
    pub(crate) async fn refused(node: &str, answer: reqwest::Response) -> PeerError {
        let status = answer.status().as_u16();
        let message = answer
            .json::<serde_json::Value>()
            .await
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| "no message".to_owned());
        PeerError::new(node, Some(status), format!("answered {status}: {message}"))
    }
}

impl std::fmt::Debug for ClusterContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterContext")
            .field("prefix", &self.prefix)
            .field("node", self.membership.record())
            .finish_non_exhaustive()
    }
}
