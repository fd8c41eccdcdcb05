//! Node membership: a node is live while its key `nodes/{id}` exists under the cluster's
//! prefix, held by an etcd lease the node keeps renewing.
//!
//! The rules this module keeps:
//! - **One process per node id.** The node key is created only if absent, in one transaction,
//!   so a second process with the same id (another data dir, another host) is refused with
//!   [`MembershipError::NodeIdTaken`] while the first one's lease lives.
//! - **A restart does not wait out its own lease.** The lease id is written to the data dir
//!   (`cluster/lease.json`) when the node joins; the next start revokes that lease first (which
//!   deletes the old node key at once), so a node that was killed comes back in one round trip,
//!   not after the TTL. Only the lease this data dir recorded is revoked.
//! - **Self-fencing.** [`Membership::is_fenced`] turns true when no renewal has been confirmed
//!   for [`FENCE_FRACTION`] of the TTL etcd granted (not the one asked for: etcd counts whole
//!   seconds): by then etcd may be about to let the key go and peers to count the node dead,
//!   so the node stops taking writes before that can happen, not after.
//! - **Re-joining.** When etcd reports the lease gone (expired while etcd or the network was
//!   away, or the process was stopped), the node grants a new lease and creates its key again,
//!   under the same rule as at start: if another process took the id meanwhile, this one stays
//!   fenced and says so. While it was counted dead its partitions may have been given to other
//!   nodes, and its watched copy of the metadata does not know it yet: it stays fenced until
//!   that copy reflects a linearizable read made after the key was back
//!   ([`Membership::catch_up`]). A re-creation only takes a partition while its owner has no
//!   key, so what the read shows is every change made while this node was counted dead.
//! - **Terms.** Each lease is a term ([`Membership::lease_id`]). A write that began under one
//!   term and ends under another (or fenced) is not acknowledged: the node may have been
//!   counted dead in between ([`NodeFence`](crate::cluster::fence::NodeFence)).
//! - **Leaving.** [`Membership::leave`] revokes the lease: peers see the node gone at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use narad_storage::fs::FileSystem;
use serde::{Deserialize, Serialize};

use crate::metastore::{EtcdMetastore, MetastoreError};
use crate::shutdown::ShutdownSignal;

/// Renewals per TTL: at 3, two renewals in a row can be lost before the node fences itself.
pub(crate) const RENEWALS_PER_TTL: u32 = 3;

/// After a failed renewal, the next comes this many times sooner than a regular one.
const RETRY_DIVISOR: u32 = 5;

/// Shortest wait between renewal tries after a failure.
const MIN_RENEWAL_RETRY: Duration = Duration::from_millis(100);

/// Fraction of the TTL without a confirmed renewal after which the node fences itself (stops
/// taking writes): "nearly a TTL", leaving a fifth of it as margin for clock rate and the
/// renewal's own round trip.
pub(crate) const FENCE_FRACTION: f64 = 0.8;

/// Name of the file in `{data_dir}/cluster/` recording the lease this node last held.
pub(crate) const LEASE_FILE: &str = "lease.json";

/// What a node publishes about itself under `nodes/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRecord {
    /// The node id (`--node-id`), stable across restarts.
    pub id: String,
    /// The HTTP address peers and clients use (`--advertise`), e.g. `http://10.0.0.5:7070`.
    pub advertise: String,
    /// When this process joined, in milliseconds since the Unix epoch.
    pub(crate) joined_at_ms: i64,
    /// `host:port` of the node's Kafka listener, when it runs one (`--kafka-listen`): what
    /// Kafka Metadata names as this broker's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<String>,
}

/// The lease record kept in the data dir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseRecord {
    /// The cluster prefix the lease was granted for.
    prefix: String,
    /// The node id it held.
    node_id: String,
    /// The etcd lease id.
    lease_id: i64,
}

/// Errors of joining, renewing and listing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// etcd could not be reached or refused the request.
    #[error("etcd: {context}: {source}")]
    Etcd {
        /// What was being done.
        context: String,
        /// The client's error (boxed: it is large).
        source: Box<etcd_client::Error>,
    },
    /// Another live process holds this node id.
    #[error(
        "node id {node_id:?} is already held by a live process advertising {holder}; \
         give this node its own --node-id, or stop the other process first"
    )]
    NodeIdTaken {
        /// The id.
        node_id: String,
        /// What the holder advertises.
        holder: String,
    },
    /// The lease file in the data dir could not be read or written.
    #[error("{}: {source}", path.display())]
    LeaseFile {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A node key's value does not parse.
    #[error("node key {key} holds a value that does not parse ({reason})")]
    BadRecord {
        /// The key.
        key: String,
        /// The parse error.
        reason: String,
    },
}

type Result<T, E = MembershipError> = std::result::Result<T, E>;

fn etcd(context: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> MembershipError {
    let context = context.into();
    move |source| MembershipError::Etcd {
        context,
        source: Box::new(source),
    }
}

/// This node's membership: its lease, its renewals and whether it is fenced.
pub struct Membership {
    client: Client,
    prefix: String,
    record: NodeRecord,
    ttl: Duration,
    /// The TTL etcd granted the current lease, in ms (the fence and renewals are paced by it).
    granted_ttl_ms: AtomicU64,
    /// The file system the data dir is on: the lease file is read and written through it.
    fs: Arc<dyn FileSystem>,
    lease_dir: PathBuf,
    lease_id: AtomicI64,
    /// Set when the lease was found gone; cleared once the watched metadata is known to
    /// reflect everything written while the node was counted dead.
    catching_up: AtomicBool,
    /// When the last confirmed renewal (or the grant) was *sent*: etcd's expiry is at least a
    /// TTL after that.
    renewed_at: Mutex<Instant>,
    /// Renewals confirmed, for metrics.
    renewals: AtomicU64,
    /// Renewals that failed (no answer, error), for metrics.
    renewal_failures: AtomicU64,
}

impl Membership {
    /// Joins the cluster under `prefix` as `record.id`: revokes the lease this data dir
    /// recorded for the same cluster and id (a previous run of this node), grants a lease of
    /// `ttl` and creates the node key if no live process holds it. The caller then runs
    /// [`Membership::keep_alive`]. `data_dir` is a path on `fs`, where the lease file is kept.
    pub async fn join(
        client: Client,
        prefix: String,
        record: NodeRecord,
        ttl: Duration,
        fs: Arc<dyn FileSystem>,
        data_dir: &Path,
    ) -> Result<Membership> {
        let lease_dir = data_dir.join("cluster");
        let membership = Membership {
            client,
            prefix,
            record,
            ttl,
            granted_ttl_ms: AtomicU64::new(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            fs,
            lease_dir,
            lease_id: AtomicI64::new(0),
            catching_up: AtomicBool::new(false),
            renewed_at: Mutex::new(Instant::now()),
            renewals: AtomicU64::new(0),
            renewal_failures: AtomicU64::new(0),
        };
        membership.revoke_recorded_lease().await?;
        membership.register().await?;
        Ok(membership)
    }

    /// This node's record.
    pub fn record(&self) -> &NodeRecord {
        &self.record
    }

    /// The lease TTL asked for (`--lease-ttl-ms`).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The TTL etcd granted the current lease: whole seconds, at least the one asked for.
    pub(crate) fn granted_ttl(&self) -> Duration {
        Duration::from_millis(self.granted_ttl_ms.load(Ordering::Acquire))
    }

    /// The etcd lease currently holding the node key.
    pub(crate) fn lease_id(&self) -> i64 {
        self.lease_id.load(Ordering::Acquire)
    }

    /// Renewals confirmed since start.
    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// Renewals that failed since start.
    pub(crate) fn renewal_failures(&self) -> u64 {
        self.renewal_failures.load(Ordering::Relaxed)
    }

    fn node_key(&self, id: &str) -> String {
        format!("{}nodes/{id}", self.prefix)
    }

    /// True when no renewal has been confirmed for [`FENCE_FRACTION`] of the TTL: the node must
    /// not take writes (its peers may soon count it dead).
    pub(crate) fn is_fenced(&self) -> bool {
        self.lease_silent() || self.catching_up.load(Ordering::Acquire)
    }

    /// True when no renewal has been confirmed for [`FENCE_FRACTION`] of the granted TTL.
    fn lease_silent(&self) -> bool {
        let renewed_at = *self
            .renewed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        renewed_at.elapsed() >= self.granted_ttl().mul_f64(FENCE_FRACTION)
    }

    /// Why this node takes no writes now, when [`Membership::is_fenced`]; `None` otherwise.
    pub(crate) fn fence_reason(&self) -> Option<String> {
        if !self.lease_silent() {
            if self.catching_up.load(Ordering::Acquire) {
                return Some(format!(
                    "node {} lost its lease and joined again; it takes no writes until its copy \
                     of the metadata shows what changed while it was counted dead (its \
                     partitions may be served elsewhere now); retry",
                    self.record().id
                ));
            }
            return None;
        }
        let silent = self
            .renewed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed();
        Some(format!(
            "node {} has had no lease renewal confirmed by etcd for {} ms (its lease TTL is {} \
             ms): it takes no writes until etcd answers again, so that nothing is written here \
             while peers may count it dead; reads go on; retry",
            self.record().id,
            silent.as_millis(),
            self.granted_ttl().as_millis()
        ))
    }

    fn lease_path(&self) -> PathBuf {
        self.lease_dir.join(LEASE_FILE)
    }

    async fn revoke_recorded_lease(&self) -> Result<()> {
        let path = self.lease_path();
        let bytes = match crate::durable::read_whole(&*self.fs, &path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(MembershipError::LeaseFile { path, source }),
        };
        let Ok(recorded) = serde_json::from_slice::<LeaseRecord>(&bytes) else {
            tracing::warn!(path = %path.display(), "ignoring a lease file that does not parse");
            return Ok(());
        };
        if recorded.prefix != self.prefix || recorded.node_id != self.record.id {
            return Ok(());
        }
        let mut lease = self.client.lease_client();
        match lease.revoke(recorded.lease_id).await {
            Ok(_) => {
                tracing::info!(
                    lease = recorded.lease_id,
                    "revoked this node's previous lease"
                );
                Ok(())
            }
            // Already expired or revoked: nothing to undo.
            Err(e) if is_lease_not_found(&e) => Ok(()),
            Err(source) => Err(etcd("revoking this node's previous lease")(source)),
        }
    }

    /// Grants a lease and creates the node key with it, if absent.
    async fn register(&self) -> Result<()> {
        self.register_with(&self.client).await
    }

    /// [`Membership::register`] through `client`.
    async fn register_with(&self, client: &Client) -> Result<()> {
        let sent = Instant::now();
        // etcd counts whole seconds: round up, so the lease is never shorter than asked.
        let ttl_secs =
            i64::try_from(self.ttl.as_millis().div_ceil(1000).max(1)).unwrap_or(i64::MAX);
        let mut lease = client.lease_client();
        let granted = lease
            .grant(ttl_secs, None)
            .await
            .map_err(etcd("granting the node lease"))?;
        let lease_id = granted.id();
        let granted_ms = u64::try_from(granted.ttl().max(1)).unwrap_or(1) * 1000;
        let key = self.node_key(&self.record.id);
        let value = serde_json::to_vec(&self.record).map_err(|e| MembershipError::BadRecord {
            key: key.clone(),
            reason: e.to_string(),
        })?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease_id)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let mut kv = client.kv_client();
        let response = kv.txn(txn).await.map_err(etcd("creating the node key"))?;
        if !response.succeeded() {
            let _ = lease.revoke(lease_id).await;
            let holder = response
                .op_responses()
                .into_iter()
                .find_map(|op| match op {
                    etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(|kv| {
                        serde_json::from_slice::<NodeRecord>(kv.value())
                            .map(|r| r.advertise)
                            .unwrap_or_else(|_| "an unreadable record".to_owned())
                    }),
                    _ => None,
                })
                .unwrap_or_else(|| "an unknown address".to_owned());
            return Err(MembershipError::NodeIdTaken {
                node_id: self.record.id.clone(),
                holder,
            });
        }
        self.granted_ttl_ms.store(granted_ms, Ordering::Release);
        self.lease_id.store(lease_id, Ordering::Release);
        self.record_renewal(sent);
        self.write_lease_file(lease_id)
    }

    fn write_lease_file(&self, lease_id: i64) -> Result<()> {
        let record = LeaseRecord {
            prefix: self.prefix.clone(),
            node_id: self.record.id.clone(),
            lease_id,
        };
        let path = self.lease_path();
        let io = |source| MembershipError::LeaseFile {
            path: path.clone(),
            source,
        };
        self.fs.create_dir_all(&self.lease_dir).map_err(io)?;
        let bytes = serde_json::to_vec(&record).map_err(|e| io(std::io::Error::other(e)))?;
        narad_storage::fs::replace_file(&*self.fs, &self.lease_dir, LEASE_FILE, &bytes).map_err(io)
    }

    fn record_renewal(&self, sent: Instant) {
        let mut renewed_at = self
            .renewed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sent > *renewed_at {
            *renewed_at = sent;
        }
    }

    /// One renewal: `Ok(true)` when etcd confirmed it, `Ok(false)` when etcd says the lease is
    /// gone (expired or revoked) and the node must register again.
    async fn renew_once(&self, client: &Client) -> Result<bool> {
        let sent = Instant::now();
        let mut lease = client.lease_client();
        let (mut keeper, mut stream) = match lease.keep_alive(self.lease_id()).await {
            Err(e) if is_lease_not_found(&e) => return Ok(false),
            other => other.map_err(etcd("opening the lease keep-alive stream"))?,
        };
        keeper
            .keep_alive()
            .await
            .map_err(etcd("sending a lease renewal"))?;
        let answer = match stream.message().await {
            Err(e) if is_lease_not_found(&e) => return Ok(false),
            other => other.map_err(etcd("reading a lease renewal"))?,
        };
        match answer {
            Some(response) if response.ttl() > 0 => {
                self.record_renewal(sent);
                self.renewals.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Renews the lease [`RENEWALS_PER_TTL`] times per TTL until `shutdown`, registering
    /// again when etcd reports the lease gone. Never returns an error: failures are logged,
    /// counted and retried; [`Membership::is_fenced`] tells the rest of the node.
    ///
    /// With `metadata` (the node's watched copy), a node that had to join again stays fenced
    /// until [`Membership::catch_up`] succeeds, tried again on every tick until it does. With
    /// `client`, renewals and re-joins go through it (a client of the runtime this runs on:
    /// the daemon renews on a thread of its own, so no load on the data path delays a
    /// renewal); without, through the client the node joined with.
    pub(crate) async fn keep_alive(
        &self,
        shutdown: ShutdownSignal,
        metadata: Option<std::sync::Arc<EtcdMetastore>>,
        client: Option<Client>,
    ) {
        let client = client.unwrap_or_else(|| self.client.clone());
        let every = self.granted_ttl() / RENEWALS_PER_TTL;
        // After a failed renewal the next comes sooner, so a node whose etcd was away for a
        // moment takes writes again within a fraction of a second of its return, not a
        // renewal period later.
        let soon = (every / RETRY_DIVISOR).max(MIN_RENEWAL_RETRY);
        let mut failed_in_a_row = 0u32;
        loop {
            let wait = if failed_in_a_row > 0 { soon } else { every };
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let result = tokio::time::timeout(every, self.renew_once(&client)).await;
            let renewed = matches!(result, Ok(Ok(true)));
            if renewed && failed_in_a_row > 0 {
                tracing::info!(
                    failed = failed_in_a_row,
                    fenced = self.is_fenced(),
                    "lease renewed again after failed renewals"
                );
            }
            failed_in_a_row = if renewed {
                0
            } else {
                failed_in_a_row.saturating_add(1)
            };
            // The first failure of a run is a warning; the quick retries after it are not.
            let loud = failed_in_a_row == 1;
            match result {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    // Fenced from here until the metadata is read again: the re-join below
                    // would otherwise lift the fence on a copy that still names this node
                    // the owner of partitions given away while it was counted dead.
                    self.catching_up.store(true, Ordering::Release);
                    tracing::warn!(
                        node = %self.record.id,
                        "the node lease is gone (expired while etcd was unreachable, or the \
                         process was stopped); joining again"
                    );
                    if let Err(e) = self.register_with(&client).await {
                        self.renewal_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(error = %e, "could not join the cluster again; writes stay fenced");
                    }
                }
                Ok(Err(e)) => {
                    self.renewal_failures.fetch_add(1, Ordering::Relaxed);
                    if loud {
                        tracing::warn!(error = %e, fenced = self.is_fenced(),
                            "lease renewal failed; retrying every {} ms", soon.as_millis());
                    } else {
                        tracing::debug!(error = %e, fenced = self.is_fenced(), "lease renewal failed");
                    }
                }
                Err(_) => {
                    self.renewal_failures.fetch_add(1, Ordering::Relaxed);
                    if loud {
                        tracing::warn!(
                            fenced = self.is_fenced(),
                            "lease renewal timed out; retrying every {} ms",
                            soon.as_millis()
                        );
                    } else {
                        tracing::debug!(fenced = self.is_fenced(), "lease renewal timed out");
                    }
                }
            }
            if self.catching_up.load(Ordering::Acquire)
                && !self.lease_silent()
                && let Some(metadata) = &metadata
            {
                match self.catch_up(metadata).await {
                    Ok(true) => tracing::info!(
                        node = %self.record.id,
                        "joined again with a current copy of the metadata; taking writes"
                    ),
                    Ok(false) => tracing::warn!(
                        "the metadata copy has not caught up after the re-join; writes stay fenced"
                    ),
                    Err(e) => tracing::warn!(error = %e,
                        "could not read the metadata after the re-join; writes stay fenced"),
                }
            }
        }
    }

    /// Reads the metadata's revision linearizably and waits (at most a granted TTL) until
    /// `metadata`'s watched copy reflects it; then, and only then, a node that joined again
    /// takes writes. `Ok(false)`: the copy did not get there in time (still fenced).
    pub(crate) async fn catch_up(&self, metadata: &EtcdMetastore) -> Result<bool, MetastoreError> {
        let revision = metadata.linearizable_revision().await?;
        if !metadata.wait_for(revision, self.granted_ttl()).await {
            return Ok(false);
        }
        self.catching_up.store(false, Ordering::Release);
        Ok(true)
    }

    /// Leaves the cluster: revokes the lease, so peers see the node gone at once.
    pub async fn leave(&self) -> Result<()> {
        let mut lease = self.client.lease_client();
        lease
            .revoke(self.lease_id())
            .await
            .map_err(etcd("revoking the node lease"))?;
        Ok(())
    }

    /// Every live node, by id.
    pub(crate) async fn live_nodes(&self) -> Result<Vec<NodeRecord>> {
        live_nodes(&self.client, &self.prefix).await
    }
}

/// Whether etcd answered "no such lease" (expired or revoked).
fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    // The client reports it as a gRPC status on revoke and as a keep-alive error when the
    // keep-alive stream opens or answers.
    const NOT_FOUND: &str = "lease not found";
    match error {
        etcd_client::Error::GRpcStatus(status) => status.message().contains(NOT_FOUND),
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains(NOT_FOUND),
        _ => false,
    }
}

/// Every live node of the cluster under `prefix`, by id.
pub(crate) async fn live_nodes(client: &Client, prefix: &str) -> Result<Vec<NodeRecord>> {
    let mut kv = client.kv_client();
    let response = kv
        .get(
            format!("{prefix}nodes/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .map_err(etcd("listing the live nodes"))?;
    response
        .kvs()
        .iter()
        .map(|entry| {
            serde_json::from_slice(entry.value()).map_err(|e| MembershipError::BadRecord {
                key: String::from_utf8_lossy(entry.key()).into_owned(),
                reason: e.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::etcd::connect_client;
    use crate::metastore::test_etcd::TestEtcd;

    fn record(id: &str, port: u16) -> NodeRecord {
        NodeRecord {
            kafka: None,
            id: id.to_owned(),
            advertise: format!("http://127.0.0.1:{port}"),
            joined_at_ms: 0,
        }
    }

    async fn client(etcd: &TestEtcd) -> Client {
        connect_client(&[etcd.endpoint()]).await.unwrap()
    }

    const PREFIX: &str = "/narad-test/members/";

    /// A node joined under [`PREFIX`] with `record`, `ttl` and data dir `dir`.
    async fn joined(etcd: &TestEtcd, record: NodeRecord, ttl: Duration, dir: &Path) -> Membership {
        Membership::join(
            client(etcd).await,
            PREFIX.to_owned(),
            record,
            ttl,
            crate::durable::real(),
            dir,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_joined_node_is_listed_with_its_address_and_gone_once_it_leaves() {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let node = joined(
            &etcd,
            record("n1", 7001),
            Duration::from_secs(30),
            dir.path(),
        )
        .await;
        let listed = node.live_nodes().await.unwrap();
        assert_eq!(listed, vec![record("n1", 7001)]);
        assert!(!node.is_fenced());
        node.leave().await.unwrap();
        assert!(node.live_nodes().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_second_process_with_the_same_node_id_is_refused_while_the_first_lives() {
        let etcd = TestEtcd::start();
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let _first = joined(
            &etcd,
            record("n1", 7001),
            Duration::from_secs(30),
            dir_a.path(),
        )
        .await;
        let second = Membership::join(
            client(&etcd).await,
            PREFIX.to_owned(),
            record("n1", 7002),
            Duration::from_secs(30),
            crate::durable::real(),
            dir_b.path(),
        )
        .await;
        match second {
            Err(MembershipError::NodeIdTaken { node_id, holder }) => {
                assert_eq!(node_id, "n1");
                assert_eq!(holder, "http://127.0.0.1:7001");
            }
            Err(other) => panic!("expected NodeIdTaken, got {other}"),
            Ok(_) => panic!("two processes held one node id"),
        }
        // The refused process left nothing behind: the first still owns the key.
        let listed = live_nodes(&client(&etcd).await, PREFIX).await.unwrap();
        assert_eq!(listed, vec![record("n1", 7001)]);
    }

    /// A node killed without leaving (its lease still counting down a 60 s TTL) restarts on
    /// the same data dir and is back at once: it revokes the lease its data dir recorded.
    #[tokio::test]
    async fn a_restart_on_the_same_data_dir_does_not_wait_out_the_previous_lease() {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let crashed = joined(
            &etcd,
            record("n1", 7001),
            Duration::from_secs(60),
            dir.path(),
        )
        .await;
        let old_lease = crashed.lease_id();
        drop(crashed); // no leave(): as after kill -9
        let restarted = tokio::time::timeout(
            Duration::from_secs(10),
            Membership::join(
                client(&etcd).await,
                PREFIX.to_owned(),
                record("n1", 7009),
                Duration::from_secs(60),
                crate::durable::real(),
                dir.path(),
            ),
        )
        .await
        .expect("the restart must not wait for the old lease")
        .unwrap();
        assert_ne!(restarted.lease_id(), old_lease);
        assert_eq!(
            restarted.live_nodes().await.unwrap(),
            vec![record("n1", 7009)]
        );
    }

    #[tokio::test]
    async fn a_node_whose_lease_vanished_joins_again_on_its_next_renewal() {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let node = std::sync::Arc::new(
            joined(
                &etcd,
                record("n1", 7001),
                Duration::from_secs(3),
                dir.path(),
            )
            .await,
        );
        let (trigger, signal) = crate::shutdown::channel();
        let renewing = {
            let node = node.clone();
            tokio::spawn(async move { node.keep_alive(signal, None, None).await })
        };
        // Someone (or an expiry while etcd was away) ends the lease: the key goes with it.
        let mut lease = client(&etcd).await.lease_client();
        lease.revoke(node.lease_id()).await.unwrap();
        assert!(
            live_nodes(&client(&etcd).await, PREFIX)
                .await
                .unwrap()
                .is_empty()
        );
        let back = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if !live_nodes(&client(&etcd).await, PREFIX)
                    .await
                    .unwrap()
                    .is_empty()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        trigger.trigger();
        renewing.await.unwrap();
        back.expect("the node must register again after its lease vanished");
    }

    #[tokio::test]
    async fn a_node_that_cannot_renew_fences_itself_before_its_ttl_runs_out() {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(2);
        let node = std::sync::Arc::new(joined(&etcd, record("n1", 7001), ttl, dir.path()).await);
        let (trigger, signal) = crate::shutdown::channel();
        let renewing = {
            let node = node.clone();
            tokio::spawn(async move { node.keep_alive(signal, None, None).await })
        };
        // Renewals keep it unfenced past one TTL.
        tokio::time::sleep(ttl + ttl / 2).await;
        assert!(!node.is_fenced(), "a renewing node must not be fenced");
        assert!(node.renewals() >= 1);
        drop(etcd);
        // The last renewal was sent at most a third of a TTL ago, so the fence comes within
        // FENCE_FRACTION of a TTL from now: before etcd can let the key go.
        let fenced_at = tokio::time::timeout(ttl, async {
            while !node.is_fenced() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        trigger.trigger();
        renewing.await.unwrap();
        fenced_at.expect("a node that cannot renew must fence itself");
    }

    #[tokio::test]
    async fn a_ttl_etcd_cannot_grant_exactly_is_rounded_up_and_the_fence_follows_the_granted_one() {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let node = joined(
            &etcd,
            record("n1", 7001),
            Duration::from_millis(2900),
            dir.path(),
        )
        .await;
        assert_eq!(node.granted_ttl(), Duration::from_secs(3));
        let reason = {
            *node.renewed_at.lock().unwrap() -= Duration::from_millis(2450);
            node.fence_reason()
                .expect("fenced past 0.8 of the granted TTL")
        };
        assert!(reason.contains("TTL is 3000 ms"), "{reason}");
    }

    #[tokio::test]
    async fn a_node_that_joined_again_stays_fenced_until_its_metadata_copy_has_caught_up() {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let node = std::sync::Arc::new(
            joined(
                &etcd,
                record("n1", 7001),
                Duration::from_secs(3),
                dir.path(),
            )
            .await,
        );
        let (trigger, signal) = crate::shutdown::channel();
        let metadata = EtcdMetastore::with_cache(
            client(&etcd).await,
            PREFIX.to_owned(),
            crate::metastore::cache::CacheTiming::default(),
            signal.clone(),
        )
        .await
        .unwrap();
        // Renewing without a metadata copy to catch up with: a re-joined node stays fenced.
        let renewing = {
            let node = node.clone();
            tokio::spawn(async move { node.keep_alive(signal, None, None).await })
        };
        let old_lease = node.lease_id();
        let mut lease = client(&etcd).await.lease_client();
        lease.revoke(old_lease).await.unwrap();
        let rejoined = tokio::time::timeout(Duration::from_secs(10), async {
            while node.lease_id() == old_lease {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(rejoined.is_ok(), "the node must join again");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let reason = node
            .fence_reason()
            .expect("fenced until the metadata is read again");
        assert!(reason.contains("joined again"), "{reason}");
        assert!(node.catch_up(&metadata).await.unwrap());
        assert_eq!(node.fence_reason(), None);
        trigger.trigger();
        renewing.await.unwrap();
    }

    /// The daemon renews on a runtime of its own with a client of its own, so a node whose
    /// async workers are all busy (a burst of CPU work on them) still renews in time.
    #[test]
    fn renewals_on_a_runtime_of_their_own_go_on_while_the_daemons_workers_are_all_busy() {
        let etcd = TestEtcd::start();
        let daemon = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(3);
        let node = daemon.block_on(async {
            std::sync::Arc::new(joined(&etcd, record("n1", 7001), ttl, dir.path()).await)
        });
        let (trigger, signal) = crate::shutdown::channel();
        let keeper = {
            let (node, endpoint) = (node.clone(), etcd.endpoint());
            std::thread::spawn(move || {
                let own = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                own.block_on(async move {
                    let client = connect_client(&[endpoint]).await.unwrap();
                    node.keep_alive(signal, None, Some(client)).await;
                });
            })
        };
        // The daemon's only worker is taken for three TTLs.
        daemon.spawn(async { std::thread::sleep(Duration::from_secs(9)) });
        let mut fenced_at = None;
        let watched = std::time::Instant::now();
        while watched.elapsed() < Duration::from_secs(7) {
            if node.is_fenced() {
                fenced_at = Some(watched.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        trigger.trigger();
        keeper.join().unwrap();
        assert_eq!(
            fenced_at, None,
            "the node fenced itself while its workers were busy"
        );
        drop(daemon);
    }
}
