//! The live nodes of the cluster and the addresses they advertise, from a watched copy of the
//! lease-held node keys (`{prefix}nodes/{id}`).
//!
//! A node key exists exactly while its node's lease does, so "in the directory" means "alive
//! as far as etcd knows": a node that died disappears when its lease runs out (at most one
//! TTL), one that left cleanly at once. Callers use it to find where to send a child commit
//! or a forwarded request, and to fail fast, without a connect timeout, when the owner is not
//! alive.

use std::collections::BTreeMap;

use etcd_client::Client;

use super::membership::NodeRecord;
use crate::metastore::cache::{CacheTiming, PrefixCache};
use crate::shutdown::ShutdownSignal;

/// The watched directory of live nodes.
pub struct PeerDirectory {
    cache: PrefixCache,
}

impl std::fmt::Debug for PeerDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerDirectory")
            .field("live", &self.live())
            .finish()
    }
}

impl PeerDirectory {
    /// Reads the node keys of the cluster under `prefix` (as [`super::prefix`] makes it) and
    /// keeps the copy current until `shutdown`. Fails when etcd cannot answer the first read.
    pub async fn start(
        client: Client,
        prefix: &str,
        timing: CacheTiming,
        shutdown: ShutdownSignal,
    ) -> Result<PeerDirectory, etcd_client::Error> {
        let cache = PrefixCache::start(client, format!("{prefix}nodes/"), timing, shutdown).await?;
        Ok(PeerDirectory { cache })
    }

    /// Every live node, by id. A key whose value does not parse is skipped (and logged): a
    /// node of another version must not make every other node unreachable.
    pub fn live(&self) -> Vec<NodeRecord> {
        parse(&self.cache.view().entries)
    }

    /// The address node `id` advertises, if it is alive.
    pub fn advertise_of(&self, id: &str) -> Option<String> {
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
    pub fn is_live(&self, id: &str) -> bool {
        self.cache.view().entries.contains_key(id)
    }

    /// Waits until the copy reflects etcd revision `revision` (say, this node's own join), for
    /// at most `limit`; returns whether it got there.
    pub async fn wait_for(&self, revision: i64, limit: std::time::Duration) -> bool {
        self.cache.wait_for(revision, limit).await
    }
}

fn parse(entries: &BTreeMap<String, Vec<u8>>) -> Vec<NodeRecord> {
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
