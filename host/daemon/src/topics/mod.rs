//! Topic administration: create, delete and grow topics, keeping the metastore (the source of
//! truth) and the partition directories of the store in step.
//!
//! Layout:
//! - this file: [`TopicService`], the one place that changes topics;
//! - [`intent`]: the intent record a change leaves in the topic directory while under way;
//! - [`startup`]: start-up accounting of `topics/` against the metastore;
//! - [`owned`]: cluster mode's registration of the partitions this node owns;
//! - [`set_aside`]: the area where directories nobody can account for are kept, intact;
//! - [`rebuild`]: `narad admin rebuild-metastore`, the topic list rebuilt from disk.
//!
//! Every change writes its intent record first and removes it last, so a crash at any point
//! leaves evidence start-up acts on ([`startup`]): a create or growth the metastore never
//! recorded is undone only while its directories hold no record, a recorded delete is finished,
//! and anything without such evidence is set aside, never deleted.
//!
//! Admin operations run one at a time (an async mutex), so two concurrent creates of one name
//! cannot both pass the existence check.

pub(crate) mod intent;
pub(crate) mod owned;
pub mod rebuild;
pub mod set_aside;
pub(crate) mod startup;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use narad_storage::{LogConfig, PartitionId, Store, validate_topic_name};

use crate::metastore::{LinkMeta, Metastore, MetastoreError, TopicMeta};
use crate::produce::Producer;
use intent::Intent;

pub(crate) use crate::config::MAX_PARTITIONS;

/// Errors from topic administration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    /// The request is invalid: the message says what to fix.
    #[error("{0}")]
    Invalid(String),
    /// The metastore refused or failed (unknown topic, duplicate, shrink, I/O).
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// The store failed to create or remove partition directories.
    #[error(transparent)]
    Storage(#[from] narad_storage::StorageError),
    /// A blocking task was cancelled or panicked.
    #[error("topic task failed: {0}")]
    Task(#[from] crate::blocking::BlockingError),
    /// Writing or clearing an intent record failed (nothing was changed).
    #[error("{context}: {source}")]
    Intent {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The set-aside area refused or failed.
    #[error(transparent)]
    SetAside(#[from] set_aside::SetAsideError),
    /// An adopt that cannot be carried out as asked.
    #[error("{0}")]
    Conflict(String),
    /// Cluster mode cannot do it now (no live node to place partitions on); retry.
    #[error("{0}")]
    Unavailable(String),
}

/// What a caller asks for when creating a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    /// Name: 1..=249 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
    pub name: String,
    /// Partition count, `1..=MAX_PARTITIONS`.
    pub partitions: u32,
    /// Age limit in milliseconds (`None`: keep forever). Must be positive.
    pub retention_ms: Option<u64>,
    /// Size limit per partition in bytes (`None`: no cap). Must be positive.
    pub retention_bytes: Option<u64>,
    /// Cluster mode: the node of each partition, by index (`None`: spread over the live
    /// nodes). Refused on a single node.
    pub placement: Option<Vec<String>>,
}

/// Creates, deletes and grows topics.
pub struct TopicService {
    store: Arc<Store>,
    metastore: Arc<dyn Metastore>,
    producer: Arc<Producer>,
    segment_bytes: u64,
    admin: tokio::sync::Mutex<()>,
    /// Cluster mode: partitions are placed on live nodes and made by their owners.
    cluster: Option<Arc<crate::cluster::ClusterContext>>,
    /// Serialises registering owned partitions with setting aside topics the metadata no
    /// longer names, so a topic registered on a fresh copy is never set aside on an older one.
    registration: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for TopicService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicService").finish_non_exhaustive()
    }
}

/// Checks a topic name, with a message that says what to fix.
pub(crate) fn check_name(name: &str) -> Result<(), TopicError> {
    validate_topic_name(name)
        .map_err(|e| TopicError::Invalid(format!("invalid topic name {name:?}: {e}")))
}

/// Checks a partition count against `1..=MAX_PARTITIONS`.
pub(crate) fn check_partition_count(count: u32) -> Result<(), TopicError> {
    if count == 0 || count > MAX_PARTITIONS {
        return Err(TopicError::Invalid(format!(
            "partition count {count} is out of range: use 1 to {MAX_PARTITIONS}"
        )));
    }
    Ok(())
}

/// Names starting with this are the daemon's own topics (the consumer group offsets):
/// clients cannot create, delete or produce to them, nor link them.
pub(crate) const INTERNAL_PREFIX: &str = "__narad";

/// Whether `name` is one of the daemon's own topics ([`INTERNAL_PREFIX`]).
pub(crate) fn is_internal(name: &str) -> bool {
    name.starts_with(INTERNAL_PREFIX)
}

/// Refuses a client's change to one of the daemon's own topics.
pub(crate) fn check_not_internal(name: &str) -> Result<(), TopicError> {
    match is_internal(name) {
        true => Err(TopicError::Invalid(format!(
            "topic {name:?} is internal to narad (names starting with {INTERNAL_PREFIX:?} are \
             reserved): clients cannot create, delete, produce to or link it"
        ))),
        false => Ok(()),
    }
}

/// Checks a create request and turns it into the topic to record.
fn check_new_topic(spec: &NewTopic) -> Result<TopicMeta, TopicError> {
    check_name(&spec.name)?;
    check_partition_count(spec.partitions)?;
    if spec.retention_ms == Some(0) {
        return Err(TopicError::Invalid(
            "retention_ms must be positive; omit it to keep records forever".to_owned(),
        ));
    }
    if spec.retention_bytes == Some(0) {
        return Err(TopicError::Invalid(
            "retention_bytes must be positive; omit it for no size cap".to_owned(),
        ));
    }
    Ok(TopicMeta {
        writable_as_child: false,
        name: spec.name.clone(),
        partitions: spec.partitions,
        retention_ms: spec.retention_ms,
        retention_bytes: spec.retention_bytes,
        created_at_ms: now_ms(),
        owners: Vec::new(),
    })
}

/// The partition count of a topic directory: its partition directories must be `p00000` up to
/// some `pN` without a gap.
pub(crate) fn contiguous_partitions(topic_dir: &std::path::Path) -> Result<u32, String> {
    let mut indexes = Vec::new();
    let entries = std::fs::read_dir(topic_dir)
        .map_err(|e| format!("cannot list {}: {e}", topic_dir.display()))?;
    for entry in entries.flatten() {
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(startup::parse_partition_dir)
            .filter(|_| is_dir)
        {
            indexes.push(p);
        }
    }
    indexes.sort_unstable();
    if indexes.is_empty() {
        return Err(format!(
            "{} holds no partition directory",
            topic_dir.display()
        ));
    }
    for (expected, &found) in indexes.iter().enumerate() {
        if u32::try_from(expected).ok() != Some(found) {
            return Err(format!(
                "{} has partition directories {indexes:?}: p{expected:05} is missing, so the \
                 partition count is unknown; add an empty p{expected:05} directory if that \
                 partition is truly lost",
                topic_dir.display()
            ));
        }
    }
    u32::try_from(indexes.len()).map_err(|_| "too many partitions".to_owned())
}

/// The log configuration of `topic`'s partitions.
pub(crate) fn log_config(topic: &TopicMeta, segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        retention_ms: topic.retention_ms,
        retention_bytes: topic.retention_bytes,
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl TopicService {
    /// The segment size new partition logs get (`--segment-bytes`).
    pub(crate) fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// A service over the given store and metastore; `segment_bytes` is the roll size given
    /// to every partition.
    pub fn new(
        store: Arc<Store>,
        metastore: Arc<dyn Metastore>,
        producer: Arc<Producer>,
        segment_bytes: u64,
    ) -> TopicService {
        TopicService {
            store,
            metastore,
            producer,
            segment_bytes,
            admin: tokio::sync::Mutex::new(()),
            cluster: None,
            registration: tokio::sync::Mutex::new(()),
        }
    }

    /// The same service in cluster mode: new partitions are placed on the live nodes of
    /// `cluster` and recorded with their owners; each owner makes its own directories
    /// ([`owned::register_owned`]).
    pub(crate) fn with_cluster(
        mut self,
        cluster: Arc<crate::cluster::ClusterContext>,
    ) -> TopicService {
        self.cluster = Some(cluster);
        self
    }

    /// Cluster mode: registers partition `p` of `topic` with the store if the metadata says this
    /// node owns it and it is not registered yet (a request can arrive before the watched
    /// copy's change is applied by [`owned::register_owned`]). No-op on one node.
    pub(crate) async fn ensure_owned(&self, topic: &TopicMeta, p: u32) -> Result<(), TopicError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let owned = topic
            .owners
            .get(p as usize)
            .is_some_and(|o| o.node == cluster.node_id());
        let id = PartitionId::new(topic.name.clone(), p);
        if !owned || self.store.has_partition(&id) {
            return Ok(());
        }
        let _registration = self.registration.lock().await;
        let store = Arc::clone(&self.store);
        let config = log_config(topic, self.segment_bytes);
        crate::blocking::run(move || store.create_partition(&id, config)).await??;
        Ok(())
    }

    /// Cluster mode: brings the store in line with the newest metadata copy: sets aside the
    /// topics it no longer names ([`owned::set_aside_unnamed`]) and registers the partitions
    /// this node owns ([`owned::register_owned`]). Returns the topics set aside and how many
    /// partitions were new. No-op on one node.
    pub(crate) async fn sync_owned(&self) -> Result<(Vec<String>, usize), TopicError> {
        let Some(cluster) = &self.cluster else {
            return Ok((Vec::new(), 0));
        };
        let _registration = self.registration.lock().await;
        // Read under the lock: newer than any copy a registration before it used.
        let snapshot = match cluster.metastore.cached_snapshot() {
            Some(snapshot) => snapshot?,
            None => return Ok((Vec::new(), 0)),
        };
        let (store, node, segment_bytes) = (
            Arc::clone(&self.store),
            cluster.node_id().to_owned(),
            self.segment_bytes,
        );
        let (moved, new, plan, disowned) = {
            let node = node.clone();
            crate::blocking::run(move || {
                let moved = owned::set_aside_unnamed(&store, &snapshot, now_ms())?;
                let new = owned::register_owned(&store, &snapshot, &node, segment_bytes)?;
                let sealed = store.sealed_partitions();
                // Marked for a move: no write from now on, hand-off or not.
                for id in
                    owned::plan_marked(&store.registered_partitions(), &sealed, &snapshot, &node)
                {
                    if let Err(e) = store.seal(&id) {
                        tracing::warn!(partition = %id, error = %e,
                            "a partition marked for a move could not be sealed");
                    }
                }
                let plan = owned::plan_sealed(&sealed, &snapshot, &node);
                let disowned =
                    owned::plan_disowned(&store.registered_partitions(), &sealed, &snapshot, &node);
                Ok::<_, TopicError>((moved, new, plan, disowned))
            })
            .await??
        };
        self.settle_sealed(plan, &node).await;
        if !disowned.is_empty() {
            self.set_aside_disowned(disowned, &node).await;
        }
        Ok((moved, new))
    }

    /// Unregisters and sets aside the partitions re-created on another node while this one
    /// was cut off, once a linearizable read agrees they are another node's (a copy of the
    /// metadata that is merely behind never takes a partition away).
    async fn set_aside_disowned(&self, disowned: Vec<PartitionId>, node: &str) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let confirmed = match cluster.metastore.confirm().await {
            Ok(confirmed) => confirmed,
            Err(e) => {
                tracing::warn!(error = %e, "partitions owned elsewhere stay registered until the metadata can be confirmed");
                return;
            }
        };
        let store = Arc::clone(&self.store);
        let node = node.to_owned();
        let done = crate::blocking::run(move || {
            let again =
                owned::plan_disowned(&disowned, &store.sealed_partitions(), &confirmed, &node);
            for id in again {
                store.forget_partition(&id);
                let dir = store
                    .data_dir()
                    .join(narad_storage::store::TOPICS_DIR_NAME)
                    .join(&id.topic)
                    .join(id.dir_name());
                let owner = confirmed
                    .topics
                    .get(&id.topic)
                    .and_then(|t| t.owners.get(id.partition as usize))
                    .map(|o| o.node.clone())
                    .unwrap_or_default();
                let reason = format!(
                    "this node's copy of a partition the cluster re-created on node {owner} while \
                     this node was unreachable; kept untouched (its records are the ones counted \
                     lost): adopt or purge it with `narad admin set-aside`"
                );
                match set_aside::set_aside(
                    store.data_dir(),
                    &dir,
                    &id.topic,
                    Some(id.partition),
                    &reason,
                    now_ms(),
                ) {
                    Ok(_) => tracing::warn!(partition = %id, owner = %owner,
                        "set aside this node's copy of a partition re-created on another node"),
                    Err(e) => tracing::warn!(partition = %id, error = %e,
                        "could not set aside the copy of a partition re-created on another node"),
                }
            }
        })
        .await;
        if let Err(e) = done {
            tracing::warn!(error = %e, "setting aside partitions owned elsewhere did not finish");
        }
    }

    /// Unseals partitions whose move was cancelled, and deletes this node's copy of those
    /// that moved away, only after a linearizable read shows the new owner (a copy of the
    /// metadata that is merely behind never deletes anything).
    async fn settle_sealed(&self, plan: owned::SealedPlan, node: &str) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let store = Arc::clone(&self.store);
        let mut release = plan.release;
        if !release.is_empty() {
            match cluster.metastore.confirm().await {
                Ok(confirmed) => {
                    let again = owned::plan_sealed(&release, &confirmed, node);
                    release = again.release;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a moved partition's old copy stays until the metadata can be confirmed");
                    release.clear();
                }
            }
        }
        let unseal = plan.unseal;
        let done = crate::blocking::run(move || {
            for id in &unseal {
                if let Err(e) = store.unseal(id) {
                    tracing::warn!(partition = %id, error = %e, "could not unseal a partition");
                }
            }
            for id in &release {
                match store.remove_partition(id) {
                    Ok(()) => tracing::info!(partition = %id,
                        "removed this node's copy of a partition that moved to another node"),
                    Err(e) => tracing::warn!(partition = %id, error = %e,
                        "could not remove the old copy of a moved partition"),
                }
            }
        })
        .await;
        if let Err(e) = done {
            tracing::warn!(error = %e, "settling sealed partitions did not finish");
        }
    }

    /// The owners of partitions `first..first + count` of `topic`, in cluster mode; empty on
    /// one node (where a pinned placement is refused).
    fn place(
        &self,
        topic: &str,
        first: u32,
        count: u32,
        pinned: Option<&[String]>,
        away_from: &[&[crate::metastore::PartitionOwner]],
    ) -> Result<Vec<crate::metastore::PartitionOwner>, TopicError> {
        let Some(cluster) = &self.cluster else {
            if pinned.is_some() {
                return Err(TopicError::Invalid(
                    "placement only applies in cluster mode (narad serve --etcd ...)".to_owned(),
                ));
            }
            return Ok(Vec::new());
        };
        let live: Vec<String> = cluster.peers.live().into_iter().map(|n| n.id).collect();
        let cordoned = cluster.peers.cordoned();
        crate::cluster::placement::place(crate::cluster::placement::Request {
            topic,
            first,
            count,
            live: &live,
            cordoned: &cordoned,
            pinned,
            away_from,
        })
        .map_err(|e| match e {
            crate::cluster::placement::PlacementError::NoLiveNodes
            | crate::cluster::placement::PlacementError::AllCordoned { .. } => {
                TopicError::Unavailable(e.to_string())
            }
            other => TopicError::Invalid(other.to_string()),
        })
    }

    /// Validates and creates a topic with its partition directories. Names reserved for the
    /// daemon's own topics are refused ([`INTERNAL_PREFIX`]).
    pub async fn create(&self, spec: NewTopic) -> Result<TopicMeta, TopicError> {
        check_not_internal(&spec.name)?;
        self.create_internal(spec).await
    }

    /// [`TopicService::create`] without the reserved-name check: for the daemon's own topics.
    pub(crate) async fn create_internal(&self, spec: NewTopic) -> Result<TopicMeta, TopicError> {
        let mut meta = check_new_topic(&spec)?;
        meta.owners = self.place(
            &meta.name,
            0,
            meta.partitions,
            spec.placement.as_deref(),
            &[],
        )?;
        let _admin = self.admin.lock().await;
        if self.cluster.is_some() {
            // The metadata names the owners; each makes its own directories when it sees it.
            return Ok(self.metastore.create_topic(meta).await?);
        }
        self.prepare_create(&meta).await?;
        let created = self.metastore.create_topic(meta).await?;
        self.clear_intent(&created.name).await?;
        Ok(created)
    }

    /// Creates the child topic of an attach and records it together with its link in one
    /// metastore write, so a crash leaves either both or neither. When the write is refused
    /// (a link rule), the child's new directories are removed again.
    pub(crate) async fn create_with_link(
        &self,
        spec: NewTopic,
        link: LinkMeta,
    ) -> Result<(TopicMeta, LinkMeta), TopicError> {
        check_not_internal(&spec.name)?;
        check_not_internal(&link.parent)?;
        let mut meta = check_new_topic(&spec)?;
        if self.cluster.is_some() {
            // A child with its parent's count is placed partition by partition away from the
            // parent's owners, so a keyless copy never shares a disk with its original.
            let parent = self.metastore.topic(&link.parent).await?;
            let away: Vec<&[crate::metastore::PartitionOwner]> = parent
                .as_ref()
                .filter(|p| p.partitions == meta.partitions)
                .map(|p| p.owners.as_slice())
                .into_iter()
                .collect();
            meta.owners = self.place(
                &meta.name,
                0,
                meta.partitions,
                spec.placement.as_deref(),
                &away,
            )?;
            let _admin = self.admin.lock().await;
            let link = self
                .metastore
                .attach_link_with_new_child(meta.clone(), link)
                .await?;
            return Ok((meta, link));
        }
        if spec.placement.is_some() {
            self.place(
                &meta.name,
                0,
                meta.partitions,
                spec.placement.as_deref(),
                &[],
            )?;
        }
        let _admin = self.admin.lock().await;
        self.prepare_create(&meta).await?;
        match self
            .metastore
            .attach_link_with_new_child(meta.clone(), link)
            .await
        {
            Ok(link) => {
                self.clear_intent(&meta.name).await?;
                Ok((meta, link))
            }
            Err(refused) => {
                // Nothing was recorded and nothing can have been produced: the directories
                // are this call's own, empty ones.
                self.remove_topic_dirs(&meta.name).await?;
                Err(refused.into())
            }
        }
    }

    /// Deletes a topic: the intent first, then the metastore, then its files. Its links go
    /// with it when `remove_links`; else a topic in any link is refused
    /// ([`MetastoreError::TopicHasLinks`]), in the same metastore step as the delete.
    pub async fn delete(&self, name: &str, remove_links: bool) -> Result<TopicMeta, TopicError> {
        check_not_internal(name)?;
        let _admin = self.admin.lock().await;
        if self.metastore.topic(name).await?.is_none() {
            return Err(MetastoreError::UnknownTopic {
                name: name.to_owned(),
            }
            .into());
        }
        self.write_intent(name, Intent::Delete).await?;
        let meta = match self.metastore.delete_topic(name, remove_links).await {
            Ok(meta) => meta,
            Err(e) => {
                // Not recorded: the topic stays, and so must its directory's standing.
                self.clear_intent(name).await?;
                return Err(e.into());
            }
        };
        self.producer.forget_topic(name);
        // In cluster mode this removes this node's partitions of the topic; other owners keep
        // theirs on disk until they are told (not yet: see docs/cluster.md).
        self.remove_topic_dirs(name).await?;
        Ok(meta)
    }

    /// Raises a topic's partition count to `count` (grow only; the same count is a no-op).
    pub async fn grow(&self, name: &str, count: u32) -> Result<TopicMeta, TopicError> {
        // The offsets topic's partition count places every group: it never changes.
        check_not_internal(name)?;
        check_partition_count(count)?;
        let _admin = self.admin.lock().await;
        let Some(current) = self.metastore.topic(name).await? else {
            return Err(MetastoreError::UnknownTopic {
                name: name.to_owned(),
            }
            .into());
        };
        if count < current.partitions {
            return Err(MetastoreError::CannotShrink {
                name: name.to_owned(),
                current: current.partitions,
                requested: count,
            }
            .into());
        }
        if count == current.partitions {
            return Ok(current);
        }
        if self.cluster.is_some() {
            // New partitions go away from the same partitions of the topics linked to this
            // one with the new count (a parent grown to match its child, or the reverse).
            let snapshot = self.metastore.snapshot().await?;
            let away = crate::cluster::placement::linked_owners(&snapshot, name, count);
            let owners = self.place(
                name,
                current.partitions,
                count - current.partitions,
                None,
                &away,
            )?;
            let grown = self
                .metastore
                .apply(crate::metastore::Change::GrowPartitions {
                    name: name.to_owned(),
                    count,
                    owners,
                })
                .await?
                .into_topic()?;
            return Ok(grown);
        }
        let grown = TopicMeta {
            partitions: count,
            ..current.clone()
        };
        self.write_intent(
            name,
            Intent::Grow {
                from: current.partitions,
                to: count,
            },
        )
        .await?;
        self.create_dirs(&grown, current.partitions).await?;
        let grown = self.metastore.grow_partitions(name, count).await?;
        self.clear_intent(name).await?;
        Ok(grown)
    }

    /// Brings a set-aside entry back: a whole topic the metastore does not know becomes a
    /// topic again (partition count from its partition directories, no retention limits, which
    /// the operator sets again), and a partition directory whose index is its topic's current
    /// count becomes that topic's next partition. Returns the topic as now recorded.
    pub async fn adopt(&self, id: &str) -> Result<TopicMeta, TopicError> {
        let _admin = self.admin.lock().await;
        let data_dir = self.store.data_dir().to_path_buf();
        let entry = set_aside::get(&data_dir, id)?;
        let topic_dir = self.topic_dir(&entry.topic);
        check_name(&entry.topic)?;
        let existing = self.metastore.topic(&entry.topic).await?;
        match (entry.partition, existing) {
            (None, Some(_)) => Err(TopicError::Conflict(format!(
                "topic {:?} exists again; delete or rename it before adopting {id}",
                entry.topic
            ))),
            (None, None) => {
                if topic_dir.exists() {
                    return Err(TopicError::Conflict(format!(
                        "{} exists; move it away before adopting {id}",
                        topic_dir.display()
                    )));
                }
                let partitions = contiguous_partitions(&set_aside::dir(&data_dir).join(id))
                    .map_err(TopicError::Conflict)?;
                check_partition_count(partitions)?;
                let entry_id = id.to_owned();
                let (data, dest) = (data_dir.clone(), topic_dir.clone());
                crate::blocking::run(move || set_aside::take_back(&data, &entry_id, &dest))
                    .await??;
                let meta = TopicMeta {
                    writable_as_child: false,
                    name: entry.topic.clone(),
                    partitions,
                    retention_ms: None,
                    retention_bytes: None,
                    created_at_ms: now_ms(),
                    owners: Vec::new(),
                };
                // The directories exist; registering them is idempotent.
                self.create_dirs(&meta, 0).await?;
                Ok(self.metastore.create_topic(meta).await?)
            }
            (Some(p), None) => Err(TopicError::Conflict(format!(
                "{id} is partition {p} of topic {:?}, which does not exist; create the topic with                  {p} partitions first, then adopt it as partition {p}",
                entry.topic
            ))),
            (Some(p), Some(current)) if p != current.partitions => {
                Err(TopicError::Conflict(format!(
                    "{id} is partition {p} of {:?}, which has {} partitions: only partition {}                      can be adopted now (partition counts only grow, one after another)",
                    entry.topic, current.partitions, current.partitions
                )))
            }
            (Some(p), Some(current)) => {
                let dest = topic_dir.join(PartitionId::new(entry.topic.clone(), p).dir_name());
                let entry_id = id.to_owned();
                let data = data_dir.clone();
                self.write_intent(
                    &entry.topic,
                    Intent::Grow {
                        from: current.partitions,
                        to: p + 1,
                    },
                )
                .await?;
                crate::blocking::run(move || set_aside::take_back(&data, &entry_id, &dest))
                    .await??;
                let grown = TopicMeta {
                    partitions: p + 1,
                    ..current
                };
                self.create_dirs(&grown, p).await?;
                let grown = self.metastore.grow_partitions(&entry.topic, p + 1).await?;
                self.clear_intent(&entry.topic).await?;
                Ok(grown)
            }
        }
    }

    /// Removes a set-aside entry and its records for good.
    pub async fn purge_set_aside(&self, id: &str) -> Result<set_aside::SetAsideEntry, TopicError> {
        let _admin = self.admin.lock().await;
        let data_dir = self.store.data_dir().to_path_buf();
        let id = id.to_owned();
        Ok(crate::blocking::run(move || set_aside::purge(&data_dir, &id)).await??)
    }

    /// The first steps of a create, under the admin lock: the name must be free; then the
    /// intent record and the partition directories. The metastore write comes next.
    async fn prepare_create(&self, meta: &TopicMeta) -> Result<(), TopicError> {
        if self.metastore.topic(&meta.name).await?.is_some() {
            return Err(MetastoreError::TopicExists {
                name: meta.name.clone(),
            }
            .into());
        }
        self.write_intent(
            &meta.name,
            Intent::Create {
                partitions: meta.partitions,
            },
        )
        .await?;
        self.create_dirs(meta, 0).await
    }

    fn topic_dir(&self, topic: &str) -> PathBuf {
        self.store
            .data_dir()
            .join(narad_storage::store::TOPICS_DIR_NAME)
            .join(topic)
    }

    async fn write_intent(&self, topic: &str, intent: Intent) -> Result<(), TopicError> {
        let dir = self.topic_dir(topic);
        crate::blocking::run(move || {
            intent::write(&dir, intent).map_err(|source| TopicError::Intent {
                context: format!("writing the intent record of {}", dir.display()),
                source,
            })
        })
        .await?
    }

    async fn clear_intent(&self, topic: &str) -> Result<(), TopicError> {
        let dir = self.topic_dir(topic);
        crate::blocking::run(move || {
            intent::clear(&dir).map_err(|source| TopicError::Intent {
                context: format!("clearing the intent record of {}", dir.display()),
                source,
            })
        })
        .await?
    }

    async fn remove_topic_dirs(&self, topic: &str) -> Result<(), TopicError> {
        let store = Arc::clone(&self.store);
        let topic = topic.to_owned();
        crate::blocking::run(move || store.delete_topic(&topic)).await??;
        Ok(())
    }

    /// Changes a topic's retention: in the metastore first (which refuses a retention shorter
    /// than a delay child of the topic needs), then in every partition's log settings.
    /// `None` keeps records forever / without a size cap.
    pub async fn set_retention(
        &self,
        name: &str,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    ) -> Result<TopicMeta, TopicError> {
        if retention_ms == Some(0) || retention_bytes == Some(0) {
            return Err(TopicError::Invalid(
                "retention_ms and retention_bytes must be positive; null removes the limit"
                    .to_owned(),
            ));
        }
        let _admin = self.admin.lock().await;
        let topic = self
            .metastore
            .set_retention(name, retention_ms, retention_bytes)
            .await?;
        let store = Arc::clone(&self.store);
        let config = log_config(&topic, self.segment_bytes);
        let (name, partitions) = (topic.name.clone(), topic.partitions);
        crate::blocking::run(move || {
            for p in 0..partitions {
                let id = PartitionId::new(name.clone(), p);
                // In cluster mode only this node's partitions are here; the others' owners
                // take the new settings from the metadata.
                if store.has_partition(&id) {
                    store.set_config(&id, config.clone())?;
                }
            }
            Ok::<(), narad_storage::StorageError>(())
        })
        .await??;
        Ok(topic)
    }

    /// Registers partitions `from..topic.partitions` with the store (idempotent).
    async fn create_dirs(&self, topic: &TopicMeta, from: u32) -> Result<(), TopicError> {
        let store = Arc::clone(&self.store);
        let config = log_config(topic, self.segment_bytes);
        let name = topic.name.clone();
        let to = topic.partitions;
        crate::blocking::run(move || {
            for p in from..to {
                store.create_partition(&PartitionId::new(name.clone(), p), config.clone())?;
            }
            Ok::<(), narad_storage::StorageError>(())
        })
        .await??;
        Ok(())
    }
}
