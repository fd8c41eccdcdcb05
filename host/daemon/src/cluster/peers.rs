//! The live nodes of the cluster and the addresses they advertise, from a watched copy of the
//! lease-held node keys (`{prefix}nodes/{id}`).
//!
//! Beside them, the **cordons** (`{prefix}cordoned/{id}`, not lease-held): a node an operator is
//! draining gets no new partitions from a spread placement, nor from a move or a re-creation
//! that picks its own target, until it is uncordoned; what it owns it keeps serving.
//!
//! A node key exists exactly while its node's lease does, so "in the directory" means "alive
//! as far as etcd knows": a node that died disappears when its lease runs out (at most one
//! TTL), one that left cleanly at once. Callers use it to find where to send a child commit
//! or a forwarded request, and to fail fast, without a connect timeout, when the owner is not
//! alive.

use etcd_client::{Client, PutOptions};

use super::membership::NodeRecord;
use crate::metastore::cache::{CacheTiming, PrefixCache};
use crate::shutdown::ShutdownSignal;

/// The watched directory of live nodes.
pub(crate) struct PeerDirectory {
    cache: PrefixCache,
    cordons: PrefixCache,
    client: Client,
    prefix: String,
}

impl std::fmt::Debug for PeerDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerDirectory")
            .field("live", &self.live())
            .field("cordoned", &self.cordoned())
            .finish()
    }
}

impl PeerDirectory {
    /// Reads the node keys of the cluster under `prefix` (as [`super::prefix`] makes it) and
    /// keeps the copy current until `shutdown`. Fails when etcd cannot answer the first read.
    pub(crate) async fn start(
        client: Client,
        prefix: &str,
        timing: CacheTiming,
        shutdown: ShutdownSignal,
    ) -> Result<PeerDirectory, etcd_client::Error> {
        let cache = PrefixCache::start(
            client.clone(),
            format!("{prefix}nodes/"),
            timing,
            shutdown.clone(),
        )
        .await?;
        let cordons = PrefixCache::start(
            client.clone(),
            format!("{prefix}cordoned/"),
            timing,
            shutdown,
        )
        .await?;
        Ok(PeerDirectory {
            cache,
            cordons,
            client,
            prefix: prefix.to_owned(),
        })
    }

    /// The cordoned nodes, sorted (alive or not).
    pub(crate) fn cordoned(&self) -> Vec<String> {
        self.cordons.view().entries.keys().cloned().collect()
    }

    /// The live nodes that may be given new partitions: alive and not cordoned, sorted.
    pub(crate) fn placeable(&self) -> Vec<String> {
        let cordons = self.cordons.view();
        self.live()
            .into_iter()
            .map(|n| n.id)
            .filter(|id| !cordons.entries.contains_key(id))
            .collect()
    }

    /// Cordons node `id` (idempotent) and waits, briefly, until this node's copy shows it.
    pub(crate) async fn cordon(&self, id: &str, now_ms: i64) -> Result<(), etcd_client::Error> {
        let value = serde_json::json!({ "cordoned_at_ms": now_ms }).to_string();
        let put = self
            .client
            .kv_client()
            .put(
                format!("{}cordoned/{id}", self.prefix),
                value,
                None::<PutOptions>,
            )
            .await?;
        self.see(put.header().map(|h| h.revision())).await;
        Ok(())
    }

    /// Lifts the cordon of node `id` (idempotent) and waits, briefly, until this node's copy
    /// shows it.
    pub(crate) async fn uncordon(&self, id: &str) -> Result<(), etcd_client::Error> {
        let deleted = self
            .client
            .kv_client()
            .delete(format!("{}cordoned/{id}", self.prefix), None)
            .await?;
        self.see(deleted.header().map(|h| h.revision())).await;
        Ok(())
    }

    async fn see(&self, revision: Option<i64>) {
        if let Some(revision) = revision {
            self.cordons
                .wait_for(revision, std::time::Duration::from_secs(5))
                .await;
        }
    }

    /// Every live node, by id. A key whose value does not parse is skipped (and logged): a
    /// node of another version must not make every other node unreachable.
    pub(crate) fn live(&self) -> Vec<NodeRecord> {
        parse(&self.cache.view().entries)
    }

    /// The address node `id` advertises, if it is alive.
    pub(crate) fn advertise_of(&self, id: &str) -> Option<String> {
        let view = self.cache.view();
        let bytes = view.entries.get(id)?;
        match serde_json::from_slice::<NodeRecord>(bytes) {
            Ok(record) => Some(record.advertise),
            Err(e) => {
                tracing::warn!(node = id, error = %e, "a node key does not parse; skipping it");
                None
            }
        }
    }

    /// Whether node `id` is alive.
    pub(crate) fn is_live(&self, id: &str) -> bool {
        self.cache.view().entries.contains_key(id)
    }
}

fn parse(entries: &crate::metastore::Items<String, bytes::Bytes>) -> Vec<NodeRecord> {
    entries
        .iter()
        .filter_map(
            |(id, bytes)| match serde_json::from_slice::<NodeRecord>(bytes) {
                Ok(record) => Some(record),
                Err(e) => {
                    tracing::warn!(node = %id, error = %e, "a node key does not parse; skipping it");
                    None
                }
            },
        )
        .collect()
}
