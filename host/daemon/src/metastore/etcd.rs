//! The metastore on etcd, for cluster mode: every node of a cluster reads and writes the same
//! metadata, and the rules of [`super::transition`] hold across nodes because every write is a
//! compare-and-swap on what it read.
//!
//! Keys, under the cluster's prefix (`/narad/{cluster}/`, so several clusters can share one etcd):
//! `meta/versions` and one key per item, laid out in [`super::etcd_keys`]. A write touches the
//! keys of the items it changes, so its cost does not grow with the cluster; what still bounds
//! it is one transaction ([`etcd_keys::MAX_TXN_OPS`] keys, [`etcd_keys::MAX_TXN_BYTES`]), which
//! a write that would exceed is refused with [`MetastoreError::WriteTooLarge`] before etcd sees
//! it (deleting a topic with 108 children writes 110 keys).
//!
//! A write ([`EtcdMetastore::apply`]): read `meta/` in one linearizable range, apply the
//! change to that snapshot with the pure transition, then commit the changed keys in a
//! transaction that compares the `meta/versions` key's modification revision with the one read. Every write of every
//! domain rewrites that key, so any write that landed in between fails the compare and this one
//! starts again from a fresh read: two concurrent attaches can never together break a rule (say,
//! close a cycle, or pass 108 children). Writers on one node queue on a local lock first, so
//! contention (and retries) is only ever between nodes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use super::cache::{CacheHealth, CacheTiming, PrefixCache};
use super::etcd_keys::{self, Decoded, META, VERSIONS};
use super::transition;
use super::{
    BoxFuture, Change, LinkTopics, Metastore, MetastoreError, Outcome, PartitionOwner, Result,
    Snapshot, TopicMeta, Versions,
};
use crate::shutdown::ShutdownSignal;

/// How long one etcd request may take before it fails (a dead or partitioned etcd answers with
/// an error, not a hang). Metadata requests are small; 5 s covers an election.
pub(crate) const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long connecting to an etcd endpoint may take.
pub(crate) const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Most compare-and-swap rounds one write makes before giving up with
/// [`MetastoreError::Contended`]. Writers on one node queue locally, so only other nodes'
/// writes can make a round fail; each failed round means another write landed.
pub(crate) const MAX_WRITE_ROUNDS: u32 = 64;

/// How long a write waits for this node's watched copy to show it, so that a read right
/// after a write sees the write (past it, the read goes to etcd).
pub(crate) const READ_YOUR_WRITE_WAIT: Duration = Duration::from_secs(2);

/// The metastore of one cluster, on etcd. Cheap to share (`Arc`); every method is safe to call
/// concurrently from any number of nodes.
pub struct EtcdMetastore {
    client: Client,
    prefix: String,
    /// Serialises this node's writes, so rounds only fail on other nodes' writes.
    write_lock: Mutex<()>,
    /// This node's watched copy of `meta/`, when started with one: reads are served from it.
    cache: Option<PrefixCache>,
    /// The copy decoded at one revision (see [`EtcdMetastore::cached_snapshot`]).
    decoded: std::sync::Mutex<Option<Memo>>,
}

/// What a write starts from when it uses the watched copy.
struct WriteBase {
    snapshot: Arc<Snapshot>,
    plugin_keys: Vec<String>,
    /// The `meta/versions` value the copy was decoded with.
    versions: Vec<u8>,
}

/// The watched copy decoded at one revision, with the values it was decoded from.
struct Memo {
    revision: i64,
    /// The copy's values at `revision`: the next revision's are compared with these.
    entries: super::Items<String, Bytes>,
    snapshot: Arc<Snapshot>,
    /// The key of each of `snapshot.plugins`.
    plugin_keys: Vec<String>,
}

/// The keys whose values differ between two revisions of the copy, with the new value
/// (`None`: deleted), in key order. The newer map is the older one changed by the events in
/// between, so the keys they did not touch are shared and skipped, not compared.
fn changed_keys<'a>(
    old: &'a super::Items<String, Bytes>,
    new: &'a super::Items<String, Bytes>,
) -> Vec<(&'a str, Option<&'a Bytes>)> {
    old.diff(new)
        .map(|item| match item {
            imbl::ordmap::DiffItem::Add(key, value)
            | imbl::ordmap::DiffItem::Update {
                new: (key, value), ..
            } => (key.as_str(), Some(value)),
            imbl::ordmap::DiffItem::Remove(key, _) => (key.as_str(), None),
        })
        .collect()
}

/// The metadata keys as one range read them, with the revision to compare against.
struct Read {
    decoded: Decoded,
    /// Modification revision of `meta/versions`; 0 before the first write.
    versions_revision: i64,
}

impl EtcdMetastore {
    /// Connects to the etcd cluster at `endpoints` (e.g. `http://127.0.0.1:2379`) and uses the
    /// keys under `prefix` (which should end in `/`). Fails when no endpoint answers.
    pub async fn connect(endpoints: &[String], prefix: String) -> Result<EtcdMetastore> {
        let client = connect_client(endpoints).await?;
        Ok(EtcdMetastore::with_client(client, prefix))
    }

    /// A metastore on an already connected client (cluster mode shares one client between
    /// the metastore and node membership).
    pub fn with_client(client: Client, prefix: String) -> EtcdMetastore {
        EtcdMetastore {
            client,
            prefix,
            write_lock: Mutex::new(()),
            cache: None,
            decoded: std::sync::Mutex::new(None),
        }
    }

    /// A metastore whose reads ([`Metastore::snapshot`], `versions`, `topic`) come from a
    /// watched copy of the metadata ([`PrefixCache`]) kept until `shutdown`; `confirm` and
    /// writes still go to etcd. Metadata of an older build's layout is converted first
    /// ([`etcd_keys::convert`]). Fails when etcd cannot answer the first read.
    pub async fn with_cache(
        client: Client,
        prefix: String,
        timing: CacheTiming,
        shutdown: ShutdownSignal,
    ) -> Result<EtcdMetastore> {
        etcd_keys::convert(&client, &prefix).await?;
        let meta = format!("{prefix}{META}");
        let cache = PrefixCache::start(client.clone(), meta.clone(), timing, shutdown)
            .await
            .map_err(|source| MetastoreError::Unavailable {
                context: format!("reading {meta} from etcd"),
                source: Box::new(source),
            })?;
        let mut store = EtcdMetastore::with_client(client, prefix);
        store.cache = Some(cache);
        Ok(store)
    }

    /// The watched copy's counters, when this metastore has one.
    pub(crate) fn cache_health(&self) -> Option<&CacheHealth> {
        self.cache.as_ref().map(PrefixCache::health)
    }

    /// The watched copy, decoded: once per revision, then shared, so a caller on a hot path
    /// (ownership per request, a cursor's link view per slab) pays a refcount, not a decode.
    /// `None` without a watched copy. An undecodable copy is an error, never an empty snapshot.
    pub(crate) fn cached_snapshot(&self) -> Option<Result<Arc<Snapshot>>> {
        let cache = self.cache.as_ref()?;
        let view = cache.view();
        let mut memo = self
            .decoded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = memo.as_mut() {
            if known.revision == view.revision {
                return Some(Ok(Arc::clone(&known.snapshot)));
            }
            // Only the keys that changed since are decoded, into the copy in place when no
            // reader holds it: a change costs what it touched, not the whole metadata.
            match self.update(known, &view) {
                Ok(true) => return Some(Ok(Arc::clone(&known.snapshot))),
                Ok(false) => {}
                Err(e) => {
                    *memo = None;
                    return Some(Err(e));
                }
            }
        }
        let decoded = self.decoded_from(
            view.entries
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_ref())),
        );
        Some(decoded.map(|decoded| {
            let snapshot = Arc::new(decoded.snapshot);
            *memo = Some(Memo {
                revision: view.revision,
                entries: view.entries.clone(),
                snapshot: Arc::clone(&snapshot),
                plugin_keys: decoded.plugin_keys,
            });
            snapshot
        }))
    }

    /// Brings `known` to `view` by the keys whose values changed; `false` when one cannot be
    /// applied alone (then everything is decoded again).
    fn update(&self, known: &mut Memo, view: &super::cache::CacheView) -> Result<bool> {
        let changes = changed_keys(&known.entries, &view.entries);
        let snapshot = Arc::make_mut(&mut known.snapshot);
        for (name, value) in changes {
            let applied = etcd_keys::apply_change(
                snapshot,
                &mut known.plugin_keys,
                name,
                value.map(AsRef::as_ref),
                |name| self.key(name),
            )?;
            if !applied {
                return Ok(false);
            }
        }
        known.revision = view.revision;
        known.entries = view.entries.clone();
        Ok(true)
    }

    /// The metadata from the watched copy, or from a serializable read without one.
    async fn local_snapshot(&self) -> Result<Snapshot> {
        match self.cached_snapshot() {
            Some(snapshot) => Ok((*snapshot?).clone()),
            None => Ok(self.read(true).await?.decoded.snapshot),
        }
    }

    /// The revision of the metadata in the watched copy (0 without one): a node passes it
    /// along with a call to another node, which waits to have seen as much
    /// ([`Self::wait_for`]). It is the newest write to the metadata the copy holds, not etcd's
    /// revision at the copy's last read: that one also counts writes no peer's copy ever
    /// sees (node keys, leases), and a peer would wait for it in vain.
    pub(crate) fn cache_revision(&self) -> i64 {
        self.cache.as_ref().map_or(0, |c| c.view().data_revision)
    }

    /// The revision of the newest write to the metadata, read linearizably (through etcd's
    /// leader): once the watched copy reflects it ([`Self::wait_for`]), the copy holds every
    /// metadata write committed before this call began. Every metadata write rewrites
    /// `meta/versions`, so it is that key's modification revision: one key read, where a range
    /// over `meta/` sorted by revision made etcd load and sort every item (10 MB at 20,000
    /// topics) for each call. 0 before the first write.
    pub(crate) async fn linearizable_revision(&self) -> Result<i64> {
        let mut kv = self.client.kv_client();
        let versions = kv
            .get(self.key(VERSIONS), Some(GetOptions::new().with_keys_only()))
            .await
            .map_err(|source| MetastoreError::Unavailable {
                context: "reading the metadata's revision from etcd".to_owned(),
                source: Box::new(source),
            })?;
        Ok(versions
            .kvs()
            .first()
            .map_or(0, etcd_client::KeyValue::mod_revision))
    }

    /// Waits until the watched copy reflects `revision`, for at most `limit`; returns whether
    /// it got there (true at once without a watched copy, whose reads go to etcd).
    pub async fn wait_for(&self, revision: i64, limit: Duration) -> bool {
        match &self.cache {
            Some(cache) => cache.wait_for(revision, limit).await,
            None => true,
        }
    }

    /// Gives partition `partition` of `topic`, owned by the dead node `expected.node`, to
    /// `owner`, if its record is still `expected` and that node is still dead (no node key) at
    /// the moment of the write: a node that comes back first keeps its partition
    /// ([`MetastoreError::OwnerAlive`]), and one that comes back after finds the new owner in
    /// the metadata it reads when it re-joins.
    pub(crate) async fn set_owner_of_dead_node(
        &self,
        topic: &str,
        partition: u32,
        expected: PartitionOwner,
        owner: PartitionOwner,
    ) -> Result<TopicMeta> {
        let dead = expected.node.clone();
        let change = Change::SetOwner {
            topic: topic.to_owned(),
            partition,
            expected,
            owner,
        };
        self.apply_while_dead(change, Some(&dead))
            .await
            .and_then(Outcome::into_topic)
    }

    /// Applies `change` in compare-and-swap rounds; with `dead`, only while that node has no
    /// key.
    async fn apply_while_dead(&self, change: Change, dead: Option<&str>) -> Result<Outcome> {
        let _queued = self.write_lock.lock().await;
        for _ in 0..MAX_WRITE_ROUNDS {
            if let Some(outcome) = self.try_apply(&change, dead).await? {
                return Ok(outcome);
            }
        }
        Err(MetastoreError::Contended {
            rounds: MAX_WRITE_ROUNDS,
        })
    }

    /// The key prefix this metastore reads and writes under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, name: &str) -> String {
        format!("{}{META}{name}", self.prefix)
    }

    /// Decodes the metadata keys (named without the prefix). Metadata still in an older
    /// build's layout is an error, never read as empty: [`Self::with_cache`] converts it.
    fn decoded_from<'a>(
        &self,
        entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Decoded> {
        let decoded = etcd_keys::decode(entries, |name| self.key(name))?;
        if decoded.old_layout {
            return Err(MetastoreError::Task(format!(
                "the metadata under {}{META} is in the layout of an older narad; a node of this \
                 build converts it when it starts with every node stopped",
                self.prefix
            )));
        }
        Ok(decoded)
    }

    /// Reads the four keys in one range; linearizable unless `serializable` (then served by
    /// the etcd member this client talks to, which may lag the leader).
    async fn read(&self, serializable: bool) -> Result<Read> {
        let meta = format!("{}{META}", self.prefix);
        let response = super::etcd_range::read_prefix(&self.client, &meta, serializable, false)
            .await
            .map_err(|source| MetastoreError::Unavailable {
                context: format!("reading {}meta/ from etcd", self.prefix),
                source: Box::new(source),
            })?;
        let mut versions_revision = 0;
        let mut entries = Vec::new();
        for (name, entry) in etcd_keys::named(&response.kvs, &meta) {
            if name == VERSIONS {
                versions_revision = entry.mod_revision();
            }
            entries.push((name, entry.value()));
        }
        Ok(Read {
            decoded: self.decoded_from(entries)?,
            versions_revision,
        })
    }

    fn decode<T: DeserializeOwned>(&self, name: &str, value: &[u8]) -> Result<T> {
        serde_json::from_slice(value).map_err(|e| MetastoreError::BadRecord {
            key: self.key(name),
            reason: e.to_string(),
        })
    }

    /// One compare-and-swap round: `Ok(Some(outcome))` when it landed (or changed nothing),
    /// `Ok(None)` when another write landed first.
    async fn try_apply(&self, change: &Change, dead: Option<&str>) -> Result<Option<Outcome>> {
        // From the watched copy when it can: no read of every key per write. The compare on
        // the versions value it was decoded with (every write raises a counter, and they
        // never go down) makes a stale copy lose the round, never win it.
        if let Some(copy) = self.copy_for_write() {
            let copy = copy?;
            let mut next = (*copy.snapshot).clone();
            // A refusal or "nothing to do" read from a copy may be stale: those are decided
            // on the linearizable read below.
            if let Ok((outcome, true)) = transition::apply(&mut next, change.clone()) {
                let changes = etcd_keys::diff(&copy.snapshot, &copy.plugin_keys, &next)?;
                let versions = Compare::value(self.key(VERSIONS), CompareOp::Equal, copy.versions);
                // Let go of the copy before waiting on etcd: held across the wait, it would make
                // the next key-by-key update of the copy clone it whole.
                drop((copy.snapshot, next));
                return self.commit(changes, versions, dead, outcome).await;
            }
        }
        let read = self.read(false).await?;
        let mut next = read.decoded.snapshot.clone();
        let (outcome, changed) = transition::apply(&mut next, change.clone())?;
        if !changed {
            // The read was linearizable, so "nothing to do" is true as of now.
            return Ok(Some(outcome));
        }
        let changes = etcd_keys::diff(&read.decoded.snapshot, &read.decoded.plugin_keys, &next)?;
        let versions =
            Compare::mod_revision(self.key(VERSIONS), CompareOp::Equal, read.versions_revision);
        self.commit(changes, versions, dead, outcome).await
    }

    /// The watched copy as a write starts from: the decoded metadata, its plugin keys and the
    /// versions value it was decoded with. `None` without a copy or before the first write
    /// (no versions key to compare).
    fn copy_for_write(&self) -> Option<Result<WriteBase>> {
        // Brings the decoded copy up to the watched one.
        if let Err(e) = self.cached_snapshot()? {
            return Some(Err(e));
        }
        let memo = self
            .decoded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = memo.as_ref()?;
        // The memo may have moved on since `cached_snapshot`: take what it holds now, whole.
        let versions = known.entries.get(VERSIONS)?.to_vec();
        Some(Ok(WriteBase {
            snapshot: Arc::clone(&known.snapshot),
            plugin_keys: known.plugin_keys.clone(),
            versions,
        }))
    }

    /// Commits `changes` if `versions` (and, with `dead`, that node's absence) still holds.
    async fn commit(
        &self,
        changes: Vec<etcd_keys::KeyChange>,
        versions: Compare,
        dead: Option<&str>,
        outcome: Outcome,
    ) -> Result<Option<Outcome>> {
        etcd_keys::check_size(&changes)?;
        let puts: Vec<TxnOp> = changes
            .into_iter()
            .map(|(name, value)| match value {
                Some(value) => TxnOp::put(self.key(&name), value, None),
                None => TxnOp::delete(self.key(&name), None),
            })
            .collect();
        let mut compares = vec![versions];
        let mut otherwise = Vec::new();
        if let Some(node) = dead {
            let key = format!("{}nodes/{node}", self.prefix);
            compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
            otherwise.push(TxnOp::get(key, None));
        }
        let txn = Txn::new().when(compares).and_then(puts).or_else(otherwise);
        let mut kv = self.client.kv_client();
        let response = kv
            .txn(txn)
            .await
            .map_err(|source| MetastoreError::Unavailable {
                context: format!("writing {}meta/ to etcd", self.prefix),
                source: Box::new(source),
            })?;
        if !response.succeeded() {
            let alive = response.op_responses().into_iter().any(
                |op| matches!(op, etcd_client::TxnOpResponse::Get(get) if !get.kvs().is_empty()),
            );
            if let (true, Some(node)) = (alive, dead) {
                return Err(MetastoreError::OwnerAlive {
                    node: node.to_owned(),
                });
            }
            // Another write landed first: the next round starts from a copy that has it.
            if let Some(cache) = &self.cache {
                let revision = response.header().map_or(0, |h| h.revision());
                cache.wait_for(revision, READ_YOUR_WRITE_WAIT).await;
            }
            return Ok(None);
        }
        if let Some(cache) = &self.cache {
            let revision = response.header().map_or(0, |h| h.revision());
            if !cache.wait_for(revision, READ_YOUR_WRITE_WAIT).await {
                tracing::warn!(
                    revision,
                    "the watched metadata copy did not show this node's write in time"
                );
            }
        }
        Ok(Some(outcome))
    }
}

/// Connects an etcd client with this daemon's timeouts: a request to an etcd that is down
/// fails after [`ETCD_REQUEST_TIMEOUT`] instead of waiting forever.
pub async fn connect_client(endpoints: &[String]) -> Result<Client> {
    connect_secured(endpoints, &crate::config::EtcdSecurity::default()).await
}

/// [`connect_client`] checking etcd's certificate against `security.ca`, presenting its
/// client certificate and authenticating as its user, when given.
pub async fn connect_secured(
    endpoints: &[String],
    security: &crate::config::EtcdSecurity,
) -> Result<Client> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|source| MetastoreError::Io {
            context: format!("reading the etcd {what} {}", path.display()),
            source,
        })
    };
    let mut options = ConnectOptions::new()
        .with_connect_timeout(ETCD_CONNECT_TIMEOUT)
        .with_timeout(ETCD_REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3));
    if security.ca.is_some() || security.identity.is_some() {
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &security.ca {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca, "CA file")?));
        }
        if let Some((cert, key)) = &security.identity {
            tls = tls.identity(etcd_client::Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        options = options.with_tls(tls);
    }
    if let Some((user, password)) = &security.user {
        options = options.with_user(user.clone(), password.clone());
    }
    Client::connect(endpoints, Some(options))
        .await
        .map_err(|source| MetastoreError::Unavailable {
            context: format!("connecting to etcd at {}", endpoints.join(",")),
            source: Box::new(source),
        })
}

impl Metastore for EtcdMetastore {
    fn snapshot(&self) -> BoxFuture<'_, Result<Snapshot>> {
        Box::pin(self.local_snapshot())
    }

    fn links_snapshot(&self) -> BoxFuture<'_, Result<Snapshot>> {
        // With the watched copy: only the topics links name are copied, not every topic (the
        // reconciler's full pass asks after every metadata change).
        Box::pin(async move {
            match self.cached_snapshot() {
                Some(snapshot) => Ok(snapshot?.linked_copy()),
                None => Ok(self.read(true).await?.decoded.snapshot.linked_copy()),
            }
        })
    }

    fn confirm(&self) -> BoxFuture<'_, Result<Snapshot>> {
        Box::pin(async move {
            // With the watched copy: the revision of etcd's newest metadata write, read
            // linearizably (one key, no value), then the copy once it shows that revision. It
            // holds every write acknowledged before this call, as a full read would, without
            // reading and decoding every key: a node opening thousands of cursors at start
            // confirms once per cursor, and at 20,000 topics a full read is 10 MB.
            if self.cache.is_some() {
                let newest = self.linearizable_revision().await?;
                if self.wait_for(newest, READ_YOUR_WRITE_WAIT).await
                    && let Some(snapshot) = self.cached_snapshot()
                {
                    return Ok((*snapshot?).clone());
                }
            }
            // etcd's default range is linearizable: it goes through the leader's read index.
            Ok(self.read(false).await?.decoded.snapshot)
        })
    }

    fn versions(&self) -> BoxFuture<'_, Result<Versions>> {
        Box::pin(async move {
            // With the watched copy: the decoded copy's versions, not a clone of every topic
            // (the reconciler asks on every tick).
            if let Some(snapshot) = self.cached_snapshot() {
                return Ok(snapshot?.versions);
            }
            let mut kv = self.client.kv_client();
            let response = kv
                .get(
                    self.key(VERSIONS),
                    Some(GetOptions::new().with_serializable()),
                )
                .await
                .map_err(|source| MetastoreError::Unavailable {
                    context: format!("reading {} from etcd", self.key(VERSIONS)),
                    source: Box::new(source),
                })?;
            match response.kvs().first() {
                Some(entry) => self.decode(VERSIONS, entry.value()),
                None => Ok(Versions::default()),
            }
        })
    }

    fn link_view<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
    ) -> BoxFuture<'a, Result<Option<LinkTopics>>> {
        // With the watched copy: one refcount and three lookups, whatever the metadata's size.
        Box::pin(async move {
            let snapshot = match self.cached_snapshot() {
                Some(snapshot) => snapshot?,
                None => Arc::new(self.read(true).await?.decoded.snapshot),
            };
            Ok(LinkTopics::find_in(&snapshot, parent, child))
        })
    }

    fn topic<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<TopicMeta>>> {
        Box::pin(async move {
            // With the watched copy: a refcount and a lookup, not a copy of every topic.
            let Some(snapshot) = self.cached_snapshot() else {
                return Ok(self.read(true).await?.decoded.snapshot.topics.remove(name));
            };
            if let Some(topic) = snapshot?.topics.get(name) {
                return Ok(Some(topic.clone()));
            }
            // Not in this node's copy, which may lag a create made through another node a
            // moment ago: catch up with etcd's newest metadata write (one small linearizable
            // read) before answering that the topic does not exist.
            let newest = self.linearizable_revision().await?;
            self.wait_for(newest, READ_YOUR_WRITE_WAIT).await;
            match self.cached_snapshot() {
                Some(snapshot) => Ok(snapshot?.topics.get(name).cloned()),
                None => Ok(None),
            }
        })
    }

    fn acls(&self) -> BoxFuture<'_, Result<Vec<crate::acl::AclRule>>> {
        Box::pin(async move {
            match self.cached_snapshot() {
                Some(snapshot) => Ok(snapshot?.acls.clone()),
                None => Ok(self.read(true).await?.decoded.snapshot.acls),
            }
        })
    }

    fn user<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<super::UserMeta>>> {
        Box::pin(async move {
            // From the watched copy only, with no catch-up read on a miss: an unknown name is
            // what a password guesser sends, and each guess must not cost etcd a read.
            match self.cached_snapshot() {
                Some(snapshot) => Ok(snapshot?.users.get(name).cloned()),
                None => Ok(self.read(true).await?.decoded.snapshot.users.remove(name)),
            }
        })
    }

    fn parents_of<'a>(&'a self, child: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            match self.cached_snapshot() {
                Some(snapshot) => Ok(super::parents_in(&*snapshot?, child)),
                None => Ok(super::parents_in(
                    &self.read(true).await?.decoded.snapshot,
                    child,
                )),
            }
        })
    }

    fn apply(&self, change: Change) -> BoxFuture<'_, Result<Outcome>> {
        Box::pin(self.apply_while_dead(change, None))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::metastore::test_etcd::TestEtcd;
    use crate::metastore::{LinkMeta, LinkRuleError, PluginRef, PluginVersion};

    use crate::metastore::test_topic as topic;

    fn link(parent: &str, child: &str) -> LinkMeta {
        LinkMeta {
            parent: parent.to_owned(),
            child: child.to_owned(),
            attach_epoch: "0011223344556677".to_owned(),
            attach_offsets: Some(vec![0]),
            delay_ms: 0,
            router: Vec::<PluginRef>::new(),
            config: String::new(),
            attached_at_ms: 0,
            paused: Vec::new(),
            shadow: None,
            on_gap: Default::default(),
            accepted_gaps: Vec::new(),
            dead_letter: None,
            remote: None,
        }
    }

    /// A store with a watched copy under `/narad-test/{prefix}/`, as a node starting now has,
    /// and the trigger that stops the copy's watch.
    async fn watched_store(
        etcd: &TestEtcd,
        prefix: &str,
    ) -> (crate::shutdown::ShutdownTrigger, EtcdMetastore) {
        let (stop, signal) = crate::shutdown::channel();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let prefix = format!("/narad-test/{prefix}/");
        let watched = EtcdMetastore::with_cache(client, prefix, CacheTiming::default(), signal)
            .await
            .unwrap();
        (stop, watched)
    }

    /// [`watched_store`] and a direct store (another node) on the same prefix.
    async fn watched_and_direct(
        etcd: &TestEtcd,
        prefix: &str,
    ) -> (
        crate::shutdown::ShutdownTrigger,
        EtcdMetastore,
        EtcdMetastore,
    ) {
        let (stop, watched) = watched_store(etcd, prefix).await;
        let direct = EtcdMetastore::connect(&[etcd.endpoint()], format!("/narad-test/{prefix}/"))
            .await
            .unwrap();
        (stop, watched, direct)
    }

    /// A topic of `partitions` partitions, each owned by a node with a long id: about 50
    /// bytes of owners per partition.
    fn owned_topic(name: &str, partitions: u32) -> TopicMeta {
        let mut t = topic(name, partitions);
        t.owners = (0..partitions)
            .map(|_| PartitionOwner {
                node: "node-with-a-long-id-0001".into(),
                generation: 1,
                moving_to: None,
            })
            .collect();
        t
    }

    async fn store(etcd: &TestEtcd, prefix: &str) -> Arc<EtcdMetastore> {
        Arc::new(
            EtcdMetastore::connect(&[etcd.endpoint()], format!("/narad-test/{prefix}/"))
                .await
                .expect("connect to the test etcd"),
        )
    }

    #[tokio::test]
    async fn the_etcd_backend_passes_the_metastore_conformance_suite() {
        let etcd = TestEtcd::start();
        let store = store(&etcd, "conformance").await;
        crate::metastore::conformance::run(store.as_ref()).await;
        // A second client (another node) sees exactly what the first wrote.
        let other = EtcdMetastore::connect(&[etcd.endpoint()], store.prefix().to_owned())
            .await
            .unwrap();
        assert_eq!(
            other.confirm().await.unwrap(),
            store.confirm().await.unwrap()
        );
    }

    /// Eight nodes each attach one link x_i -> y_i, all at once, over a graph holding
    /// y_i -> x_j for every i != j. Each link alone is legal (nothing leads from y_i back to
    /// x_i), but any two close a cycle (x_i -> y_i -> x_j -> y_j -> x_i), so every racer's own
    /// read says "no cycle" and only the compare-and-swap can keep a second one out.
    #[tokio::test]
    async fn of_eight_attaches_racing_to_close_a_cycle_from_eight_nodes_exactly_one_wins() {
        eight_attaches_racing_to_close_a_cycle(false).await;
    }

    /// The same race between nodes that write from their watched copies (a compare on the
    /// versions value they decoded, not a fresh read).
    #[tokio::test]
    async fn of_eight_attaches_racing_from_watched_copies_exactly_one_wins() {
        eight_attaches_racing_to_close_a_cycle(true).await;
    }

    async fn eight_attaches_racing_to_close_a_cycle(watched: bool) {
        let etcd = TestEtcd::start();
        let setup = store(&etcd, "cycle-race").await;
        let x = |i: usize| format!("x{i}");
        let y = |i: usize| format!("y{i}");
        for i in 0..8 {
            setup.create_topic(topic(&x(i), 1)).await.unwrap();
            setup.create_topic(topic(&y(i), 1)).await.unwrap();
        }
        for i in 0..8 {
            for j in (0..8).filter(|&j| j != i) {
                setup.attach_link(link(&y(i), &x(j))).await.unwrap();
            }
        }
        let (stop, signal) = crate::shutdown::channel();
        let mut nodes = Vec::new();
        for _ in 0..8 {
            nodes.push(if watched {
                let client = connect_client(&[etcd.endpoint()]).await.unwrap();
                Arc::new(
                    EtcdMetastore::with_cache(
                        client,
                        "/narad-test/cycle-race/".to_owned(),
                        CacheTiming::default(),
                        signal.clone(),
                    )
                    .await
                    .unwrap(),
                )
            } else {
                store(&etcd, "cycle-race").await
            });
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let mut tasks = Vec::new();
        for (i, node) in nodes.into_iter().enumerate() {
            let barrier = barrier.clone();
            let link = link(&x(i), &y(i));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                node.attach_link(link).await
            }));
        }
        let mut won = 0;
        let mut refused_as_cycle = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(_) => won += 1,
                Err(MetastoreError::LinkRule(LinkRuleError::Cycle { .. })) => refused_as_cycle += 1,
                Err(other) => panic!("unexpected refusal: {other}"),
            }
        }
        assert_eq!((won, refused_as_cycle), (1, 7));
        let links = setup.confirm().await.unwrap().links;
        let racers_landed = (0..8)
            .filter(|&i| links.contains_key(&(x(i), y(i))))
            .count();
        assert_eq!(racers_landed, 1);
        stop.trigger();
    }

    #[tokio::test]
    async fn with_a_watched_copy_the_backend_passes_the_suite_and_sees_other_nodes_writes() {
        let etcd = TestEtcd::start();
        let (trigger, signal) = crate::shutdown::channel();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let prefix = "/narad-test/cached/".to_owned();
        let cached = EtcdMetastore::with_cache(
            client,
            prefix.clone(),
            CacheTiming::default(),
            signal.clone(),
        )
        .await
        .unwrap();
        // Every read of the suite right after a write comes from the copy: read-your-write.
        crate::metastore::conformance::run(&cached).await;
        let other = EtcdMetastore::connect(&[etcd.endpoint()], prefix)
            .await
            .unwrap();
        other
            .create_topic(topic("from-elsewhere", 3))
            .await
            .unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(t) = cached.topic("from-elsewhere").await.unwrap() {
                    return t;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("another node's write reaches the watched copy");
        assert_eq!(seen.partitions, 3);
        assert_eq!(
            cached.versions().await.unwrap(),
            other.confirm().await.unwrap().versions
        );
        // The copy, kept up to date key by key through every write of the suite (topics,
        // links and plugin versions put and deleted), is what a full read decodes.
        assert_eq!(
            *cached.cached_snapshot().unwrap().unwrap(),
            other.confirm().await.unwrap()
        );
        trigger.trigger();
    }

    /// `confirm()` from a watched copy is still linearizable: a write acknowledged through
    /// another node is in the answer at once, though the copy may not have heard of it yet.
    #[tokio::test]
    async fn a_confirmed_read_through_a_watched_copy_holds_every_write_acknowledged_before_it() {
        let etcd = TestEtcd::start();
        let (stop, watched, other) = watched_and_direct(&etcd, "confirm-watched").await;
        for i in 0..20 {
            let name = format!("t{i}");
            other.create_topic(topic(&name, 1)).await.unwrap();
            let confirmed = watched.confirm().await.unwrap();
            assert!(
                confirmed.topics.contains_key(&name),
                "{name}, created through another node, is not in a confirmed read"
            );
            assert_eq!(confirmed.topics.len(), i + 1);
        }
        let before = watched.confirm().await.unwrap().versions;
        other.delete_topic("t0", false).await.unwrap();
        let confirmed = watched.confirm().await.unwrap();
        assert!(!confirmed.topics.contains_key("t0"));
        assert!(confirmed.versions != before);
        stop.trigger();
    }

    /// A topic created through one node is found at once through another, whose watched
    /// copy may not have heard of it yet: a client creating through one node and producing
    /// through the next must not get a 404.
    #[tokio::test]
    async fn a_topic_created_through_another_node_is_found_before_the_copy_hears_of_it() {
        let etcd = TestEtcd::start();
        let (stop, watched, other) = watched_and_direct(&etcd, "lagging").await;
        for i in 0..20 {
            let name = format!("t{i}");
            other.create_topic(topic(&name, 1)).await.unwrap();
            assert!(
                watched.topic(&name).await.unwrap().is_some(),
                "{name} created through another node was not found"
            );
        }
        assert!(watched.topic("never-made").await.unwrap().is_none());
        stop.trigger();
    }

    #[tokio::test]
    async fn of_109_attaches_racing_from_three_nodes_108_land_and_one_is_refused() {
        let etcd = TestEtcd::start();
        let setup = store(&etcd, "fan-race").await;
        setup.create_topic(topic("parent", 1)).await.unwrap();
        for i in 0..109 {
            setup
                .create_topic(topic(&format!("c{i:03}"), 1))
                .await
                .unwrap();
        }
        let nodes = [
            store(&etcd, "fan-race").await,
            store(&etcd, "fan-race").await,
            store(&etcd, "fan-race").await,
        ];
        let mut tasks = Vec::new();
        for i in 0..109 {
            let node = nodes[i % 3].clone();
            tasks.push(tokio::spawn(async move {
                node.attach_link(link("parent", &format!("c{i:03}"))).await
            }));
        }
        let mut won = 0;
        let mut refused = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(_) => won += 1,
                Err(MetastoreError::LinkRule(LinkRuleError::TooManyChildren { .. })) => {
                    refused += 1
                }
                Err(other) => panic!("unexpected refusal: {other}"),
            }
        }
        assert_eq!((won, refused), (108, 1));
        let snapshot = setup.confirm().await.unwrap();
        assert_eq!(
            snapshot.links.keys().filter(|(p, _)| p == "parent").count(),
            108
        );
        // 1 + 109 creates, 108 attaches: each raised its domain once, racing or not.
        assert_eq!(snapshot.versions.topics, 110);
        assert_eq!(snapshot.versions.links, 108);
    }

    #[tokio::test]
    async fn a_value_that_does_not_parse_is_reported_with_its_key_not_read_as_empty() {
        let etcd = TestEtcd::start();
        let store = store(&etcd, "bad-record").await;
        store.create_topic(topic("orders", 2)).await.unwrap();
        let mut kv = store.client.kv_client();
        kv.put(store.key("topic/orders"), "{not json", None)
            .await
            .unwrap();
        match store.snapshot().await {
            Err(MetastoreError::BadRecord { key, .. }) => {
                assert_eq!(key, "/narad-test/bad-record/meta/topic/orders")
            }
            other => panic!("expected BadRecord, got {other:?}"),
        }
        // And a write refuses too, rather than overwriting what it could not read.
        assert!(matches!(
            store.create_topic(topic("audit", 1)).await,
            Err(MetastoreError::BadRecord { .. })
        ));
    }

    #[tokio::test]
    async fn clusters_with_different_prefixes_on_one_etcd_do_not_see_each_other() {
        let etcd = TestEtcd::start();
        let a = store(&etcd, "cluster-a").await;
        let b = store(&etcd, "cluster-b").await;
        a.create_topic(topic("orders", 2)).await.unwrap();
        assert!(b.snapshot().await.unwrap().topics.is_empty());
        b.create_topic(topic("orders", 5)).await.unwrap();
        assert_eq!(a.topic("orders").await.unwrap().unwrap().partitions, 2);
    }

    #[tokio::test]
    async fn a_stopped_etcd_gives_an_unavailable_error_within_the_request_timeout() {
        let etcd = TestEtcd::start();
        let store = store(&etcd, "down").await;
        store.create_topic(topic("orders", 1)).await.unwrap();
        drop(etcd);
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(
            ETCD_REQUEST_TIMEOUT * 3,
            store.create_topic(topic("audit", 1)),
        )
        .await
        .expect("a write to a dead etcd must fail, not hang");
        assert!(
            matches!(result, Err(MetastoreError::Unavailable { .. })),
            "{result:?}"
        );
        assert!(started.elapsed() < ETCD_REQUEST_TIMEOUT * 3);
    }

    fn plugin(name: &str, digest: &str) -> PluginVersion {
        PluginVersion {
            name: name.to_owned(),
            digest: digest.to_owned(),
            size_bytes: 10,
            version: "1.0.0".to_owned(),
            description: String::new(),
            uploaded_at_ms: 1,
        }
    }

    /// Metadata as builds before one key per item wrote it: versions and three arrays.
    async fn write_old_layout(etcd: &TestEtcd, prefix: &str) -> Snapshot {
        let mut expected = Snapshot::default();
        for name in ["orders", "audit", "a/b%c"] {
            let mut t = topic(name, 2);
            t.owners = vec![
                PartitionOwner {
                    node: "n1".into(),
                    generation: 3,
                    moving_to: None,
                },
                PartitionOwner {
                    node: "n2".into(),
                    generation: 1,
                    moving_to: None,
                },
            ];
            expected.topics.insert(name.to_owned(), t);
        }
        let l = link("orders", "audit");
        expected.links.insert(("orders".into(), "audit".into()), l);
        expected.plugins = vec![
            plugin("zeta", "01"),
            plugin("alpha", "02"),
            plugin("zeta", "03"),
        ];
        expected.versions = Versions {
            topics: 3,
            links: 1,
            plugins: 3,
            users: 0,
            acls: 0,
        };
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let mut kv = client.kv_client();
        let put = |name: &str| format!("{prefix}meta/{name}");
        let topics: Vec<&TopicMeta> = expected.topics.values().collect();
        let links: Vec<&LinkMeta> = expected.links.values().collect();
        for (name, value) in [
            ("versions", serde_json::to_vec(&expected.versions).unwrap()),
            ("topics", serde_json::to_vec(&topics).unwrap()),
            ("links", serde_json::to_vec(&links).unwrap()),
            ("plugins", serde_json::to_vec(&expected.plugins).unwrap()),
        ] {
            kv.put(put(name), value, None).await.unwrap();
        }
        expected
    }

    #[tokio::test]
    async fn metadata_of_the_old_layout_is_converted_at_start_and_fences_older_builds() {
        let etcd = TestEtcd::start();
        let prefix = "/narad-test/convert/";
        let expected = write_old_layout(&etcd, prefix).await;
        // Without converting, a read refuses rather than see an empty cluster.
        let plain = store(&etcd, "convert").await;
        assert!(matches!(
            plain.confirm().await,
            Err(MetastoreError::Task(message)) if message.contains("older narad")
        ));

        let (trigger, signal) = crate::shutdown::channel();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let cached =
            EtcdMetastore::with_cache(client, prefix.to_owned(), CacheTiming::default(), signal)
                .await
                .unwrap();
        assert_eq!(cached.snapshot().await.unwrap(), expected);
        assert_eq!(plain.confirm().await.unwrap(), expected);
        // Upload order survives.
        let names: Vec<(&str, &str)> = expected
            .plugins
            .iter()
            .map(|p| (p.name.as_str(), p.digest.as_str()))
            .collect();
        assert_eq!(names, [("zeta", "01"), ("alpha", "02"), ("zeta", "03")]);

        // One key per item; the old keys hold a value an older build cannot read as its list.
        let mut kv = plain.client.kv_client();
        for old in etcd_keys::OLD_DOMAINS {
            let value = kv.get(plain.key(old), None).await.unwrap();
            let value: serde_json::Value = serde_json::from_slice(value.kvs()[0].value()).unwrap();
            assert!(value.is_object(), "{old}: {value}");
        }
        let topic_keys = kv
            .get(
                plain.key("topic/"),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .unwrap();
        let keys: Vec<String> = topic_keys
            .kvs()
            .iter()
            .map(|kv| String::from_utf8(kv.key().to_vec()).unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "/narad-test/convert/meta/topic/a%2Fb%25c",
                "/narad-test/convert/meta/topic/audit",
                "/narad-test/convert/meta/topic/orders",
            ]
        );
        // Writes go on from there, key by key.
        plain.create_topic(topic("late", 1)).await.unwrap();
        plain.remove_plugin("zeta").await.unwrap();
        plain.add_plugin(plugin("zeta", "04")).await.unwrap();
        let after = plain.confirm().await.unwrap();
        let names: Vec<(&str, &str)> = after
            .plugins
            .iter()
            .map(|p| (p.name.as_str(), p.digest.as_str()))
            .collect();
        assert_eq!(names, [("alpha", "02"), ("zeta", "04")]);
        assert_eq!(after.topics.len(), 4);
        trigger.trigger();
    }

    #[tokio::test]
    async fn three_nodes_converting_together_convert_once_and_agree() {
        let etcd = TestEtcd::start();
        let prefix = "/narad-test/convert-race/";
        let expected = write_old_layout(&etcd, prefix).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(3));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let client = connect_client(&[etcd.endpoint()]).await.unwrap();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                etcd_keys::convert(&client, prefix).await
            }));
        }
        let mut converted = 0;
        for task in tasks {
            if task.await.unwrap().unwrap() {
                converted += 1;
            }
        }
        assert_eq!(converted, 1, "exactly one node converts");
        let plain = store(&etcd, "convert-race").await;
        assert_eq!(plain.confirm().await.unwrap(), expected);
    }

    #[tokio::test]
    async fn the_conversion_is_refused_while_a_node_of_the_cluster_is_alive() {
        let etcd = TestEtcd::start();
        let prefix = "/narad-test/convert-alive/";
        write_old_layout(&etcd, prefix).await;
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        client
            .kv_client()
            .put(format!("{prefix}nodes/n7"), "{}", None)
            .await
            .unwrap();
        match etcd_keys::convert(&client, prefix).await {
            Err(MetastoreError::Task(message)) => {
                assert!(
                    message.contains("n7") && message.contains("stop every node"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        // Nothing was converted.
        let old = client
            .kv_client()
            .get(format!("{prefix}meta/topics"), None)
            .await
            .unwrap();
        assert_eq!(old.kvs()[0].value().first(), Some(&b'['));
    }

    /// Past 4 MiB of metadata (about 8,000 topics of 12 partitions) one range answer no longer
    /// fits a gRPC message as etcd's client takes it: a starting node must still read it all.
    #[tokio::test]
    async fn metadata_past_one_grpc_message_is_read_whole_by_a_starting_node_and_a_write() {
        let etcd = TestEtcd::start();
        let store = store(&etcd, "past-4mib").await;
        // 16 topics of 6,000 owned partitions: about 300 KB each, 4.8 MB in all.
        for i in 0..16 {
            store
                .create_topic(owned_topic(&format!("big-{i}"), 6_000))
                .await
                .unwrap();
        }
        // A linearizable read of every key, as a write without a watched copy makes.
        assert_eq!(store.confirm().await.unwrap().topics.len(), 16);
        // A new watched copy, as a starting node reads it.
        let (stop, watched) = watched_store(&etcd, "past-4mib").await;
        assert_eq!(watched.snapshot().await.unwrap().topics.len(), 16);
        watched.create_topic(topic("small", 1)).await.unwrap();
        assert_eq!(watched.confirm().await.unwrap().topics.len(), 17);
        stop.trigger();
    }

    #[tokio::test]
    async fn topics_past_the_old_single_value_limit_fit_and_a_write_touches_only_its_keys() {
        let etcd = TestEtcd::start();
        let store = store(&etcd, "large").await;
        // Three topics of 6,000 owned partitions: about 840 KB of owners in all, where the old
        // layout refused past 480 KB for every topic together.
        for name in ["big-1", "big-2", "big-3"] {
            store.create_topic(owned_topic(name, 6_000)).await.unwrap();
        }
        let revision_of_big_1 = || async {
            let mut kv = store.client.kv_client();
            let got = kv.get(store.key("topic/big-1"), None).await.unwrap();
            got.kvs()[0].mod_revision()
        };
        let revision = revision_of_big_1().await;
        store.create_topic(topic("small", 1)).await.unwrap();
        assert_eq!(
            revision_of_big_1().await,
            revision,
            "an unrelated write rewrote big-1"
        );
        assert_eq!(store.confirm().await.unwrap().topics.len(), 4);
    }

    #[tokio::test]
    async fn a_parent_with_108_children_is_deleted_with_its_links_in_one_write() {
        let etcd = TestEtcd::start();
        let store = store(&etcd, "delete-108").await;
        store.create_topic(topic("parent", 1)).await.unwrap();
        for i in 0..108 {
            let child = format!("c{i:03}");
            store.create_topic(topic(&child, 1)).await.unwrap();
            store.attach_link(link("parent", &child)).await.unwrap();
        }
        store.delete_topic("parent", true).await.unwrap();
        let snapshot = store.confirm().await.unwrap();
        assert!(snapshot.links.is_empty());
        assert_eq!(snapshot.topics.len(), 108);
    }
}
