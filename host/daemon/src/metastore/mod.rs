//! The metastore: the cluster's metadata (topics now; links and plugins in later issues), behind
//! the [`Metastore`] trait so the embedded file ([`file::FileMetastore`]) and a shared store
//! (etcd, across nodes) are interchangeable.
//!
//! The rules (cannot shrink, unknown topic, link exists, self link and cycles, 108 children,
//! delay limits, retention floor, recorded plugin versions) are pure transitions in
//! [`transition`]: a [`Change`] applied to a [`Snapshot`]. A backend implements reads and
//! [`Metastore::apply`] ("apply the transition atomically": a lock and a file replace for the
//! embedded file, a compare-and-swap for a shared store); every typed write method is
//! `apply` with one change. `conformance` (tests) is the behaviour suite any backend runs.
//!
//! Every domain (topics, links, plugins) has its own version counter in [`Versions`]. A write
//! that changes a domain raises that domain's counter by one and leaves the others alone, so a
//! reconciler that remembers the versions of its last full pass can skip a tick when nothing it
//! cares about moved.
//!
//! Reads come in two strengths. [`Metastore::snapshot`] may be served from this node's copy (on
//! one node that copy is the truth). [`Metastore::confirm`] is linearizable: every write
//! acknowledged before the call began is in its answer. A cursor calls it before anchoring or
//! deleting a cursor file, to be sure its link's attach epoch is still the current one (on etcd,
//! a quorum read; in the embedded file, the in-memory state, which every write updates before it
//! returns).

pub mod acl_cache;
pub mod cache;
#[cfg(test)]
pub(crate) mod conformance;
pub mod etcd;
pub(crate) mod etcd_keys;
pub mod etcd_range;
pub(crate) mod file;
pub(crate) mod frame;
pub(crate) mod journal;
pub mod link;
#[cfg(any(test, feature = "test-support"))]
pub mod test_etcd;
pub(crate) mod transition;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub use etcd::EtcdMetastore;
pub use file::FileMetastore;
pub use link::{LinkMeta, LinkRuleError, PluginRef, PluginVersion, RemoteTarget, ShadowSpec};
pub use transition::{Change, Outcome, PolicyChange};

use crate::acl::AclRule;
use crate::scram::{Mechanism, ScramCredential};

/// A boxed, sendable future: the trait's methods return these so that `dyn Metastore` works
/// (native `async fn` in traits is not object safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Result alias for metastore operations.
pub type Result<T, E = MetastoreError> = std::result::Result<T, E>;

/// One topic as the metastore records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicMeta {
    /// Topic name (validated by `narad_storage::validate_topic_name` before it gets here).
    pub name: String,
    /// Number of partitions, `0..partitions`; only ever grows.
    pub partitions: u32,
    /// Records older than this (by commit time) may be deleted; `None` keeps them forever.
    pub retention_ms: Option<u64>,
    /// Each partition is trimmed to about this many bytes; `None` means no size cap.
    pub retention_bytes: Option<u64>,
    /// When the topic was created, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Who owns each partition (index = partition), in cluster mode: one entry per partition.
    /// Empty on a single node, where that node owns every partition (and the file format is
    /// what it was before cluster mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<PartitionOwner>,
    /// Whether producers may write to this topic while it is a fan-out child. Off by default:
    /// a child holds only what its cursors copied. No effect on a topic that is no child.
    /// Written only when on, so metadata without it reads as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable_as_child: bool,
}

/// The owner of one partition in cluster mode. Changed only as a whole, by a write that
/// compares what it read (a planned move raises `generation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionOwner {
    /// The node id that stores the partition and serves it.
    pub node: String,
    /// Raised by one each time ownership moves; a commit sent to a node names the generation
    /// it saw, and the node refuses one that does not match.
    pub generation: u64,
    /// Set while a planned move to this node is under way: the owner has stopped (or is
    /// stopping) the partition's cursors and refuses its writes until the move ends (the new
    /// node becomes the owner at `generation + 1`) or is cancelled (this is cleared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) moving_to: Option<String>,
}

impl std::fmt::Display for PartitionOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at generation {}", self.node, self.generation)?;
        if let Some(to) = &self.moving_to {
            write!(f, ", moving to {to}")?;
        }
        Ok(())
    }
}

impl PartitionOwner {
    /// The first owner of a partition: `node`, generation 1.
    pub fn first(node: impl Into<String>) -> PartitionOwner {
        PartitionOwner {
            node: node.into(),
            generation: 1,
            moving_to: None,
        }
    }
}

/// Per-domain version counters. Each starts at 0 and is raised by one by every write that
/// changes its domain, and by nothing else.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Versions {
    /// Topics: create, delete, partition growth, retention change.
    pub topics: u64,
    /// Links (fan-out children): attach, detach, router change.
    pub links: u64,
    /// Plugins: upload, removal.
    pub plugins: u64,
    /// Users: create, password change, delete. Written only once raised, so metadata without
    /// users reads as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub users: u64,
    /// ACLs: a rule added or removed. Written only once raised.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub acls: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The metadata domains, each with its own version counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Domain {
    /// Topics.
    Topics,
    /// Links.
    Links,
    /// Plugins.
    Plugins,
    /// Users.
    Users,
    /// ACLs.
    Acls,
}

impl Versions {
    /// The counter of `domain`.
    pub fn get(&self, domain: Domain) -> u64 {
        match domain {
            Domain::Topics => self.topics,
            Domain::Links => self.links,
            Domain::Plugins => self.plugins,
            Domain::Users => self.users,
            Domain::Acls => self.acls,
        }
    }

    /// Raises the counter of `domain` by one.
    pub(crate) fn bump(&mut self, domain: Domain) {
        match domain {
            Domain::Topics => self.topics += 1,
            Domain::Links => self.links += 1,
            Domain::Plugins => self.plugins += 1,
            Domain::Users => self.users += 1,
            Domain::Acls => self.acls += 1,
        }
    }
}

/// An ordered map of metadata items that shares its structure with its copies: a clone costs
/// a reference count, a change copies the path to the item it touched, and
/// [`imbl::OrdMap::diff`] between a copy and its original visits only what differs. A write
/// at 20,000 topics so pays for the topic it creates, not for the other 19,999.
pub type Items<K, V> = imbl::OrdMap<K, V>;

/// A consistent view of all the metadata at one moment. Cloning it is cheap: the maps share
/// their items with the original ([`Items`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The versions this view corresponds to.
    pub versions: Versions,
    /// Every topic, by name.
    pub topics: Items<String, TopicMeta>,
    /// Every link, by (parent, child).
    pub links: Items<(String, String), LinkMeta>,
    /// Every uploaded plugin version, oldest first.
    pub plugins: Vec<PluginVersion>,
    /// Every user, by name.
    pub users: Items<String, UserMeta>,
    /// Every ACL rule, sorted, each once.
    pub acls: Vec<AclRule>,
}

/// Longest user name, in bytes.
pub const MAX_USER_NAME_BYTES: usize = 128;

/// One user: a principal that authenticates with a password (Kafka SASL), stored as salted
/// SCRAM credentials only, never the password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserMeta {
    /// The name (see [`check_user_name`]).
    pub name: String,
    /// One credential per SCRAM mechanism, made from the same password.
    pub credentials: Vec<ScramCredential>,
    /// When the user was created, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// When the password was last set, in milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
}

impl UserMeta {
    /// The user's credential for `mechanism`, if they have one.
    pub fn credential(&self, mechanism: Mechanism) -> Option<&ScramCredential> {
        self.credentials.iter().find(|c| c.mechanism == mechanism)
    }
}

/// Checks a user name: 1 to [`MAX_USER_NAME_BYTES`] bytes of ASCII letters, digits and
/// `. _ - @`, so that it reads the same in a SASL message, a URL path and a log line; not
/// `ANONYMOUS`, the principal of clients that did not authenticate.
pub fn check_user_name(name: &str) -> std::result::Result<(), String> {
    if name.eq_ignore_ascii_case("ANONYMOUS") {
        return Err(
            "ANONYMOUS is the principal of clients that did not authenticate; pick another name"
                .to_owned(),
        );
    }
    if name.is_empty() || name.len() > MAX_USER_NAME_BYTES {
        return Err(format!(
            "a user name is 1 to {MAX_USER_NAME_BYTES} bytes, not {}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@')))
    {
        return Err(format!(
            "user name {name:?} holds {bad:?}; names use ASCII letters, digits and . _ - @"
        ));
    }
    Ok(())
}

/// Checks a user's credentials: at least one, each well formed, at most one per mechanism.
pub fn check_credentials(credentials: &[ScramCredential]) -> std::result::Result<(), String> {
    if credentials.is_empty() {
        return Err("a user needs at least one SCRAM credential".to_owned());
    }
    for (i, credential) in credentials.iter().enumerate() {
        credential.validate().map_err(|e| e.to_string())?;
        if credentials[..i]
            .iter()
            .any(|c| c.mechanism == credential.mechanism)
        {
            return Err(format!(
                "two {} credentials for one user",
                credential.mechanism
            ));
        }
    }
    Ok(())
}

/// One link with its parent and child topics: what a fan-out cursor reads before routing each
/// slab (the epoch to check, both partition counts, the router config).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkTopics {
    /// The link, as [`Snapshot::links`] holds it.
    pub link: LinkMeta,
    /// The link's parent topic.
    pub parent: TopicMeta,
    /// The link's child topic.
    pub child: TopicMeta,
}

/// What a cursor sees as a remote child's topic: it has no local one; its partitions are the
/// target's, as recorded at the attach.
fn remote_child_topic(name: &str, remote: &RemoteTarget, attached_at_ms: i64) -> TopicMeta {
    TopicMeta {
        writable_as_child: false,
        name: name.to_owned(),
        partitions: remote.partitions,
        retention_ms: None,
        retention_bytes: None,
        created_at_ms: attached_at_ms,
        owners: Vec::new(),
    }
}

impl Snapshot {
    /// Drops every topic no link names as its parent or child.
    pub(crate) fn keep_linked_topics(&mut self) {
        let named: BTreeSet<&str> = self
            .links
            .keys()
            .flat_map(|(parent, child)| [parent.as_str(), child.as_str()])
            .collect();
        self.topics = std::mem::take(&mut self.topics)
            .into_iter()
            .filter(|(name, _)| named.contains(name.as_str()))
            .collect();
    }

    /// A copy holding only the topics some link names (see [`Snapshot::keep_linked_topics`]),
    /// built without copying the others.
    pub(crate) fn linked_copy(&self) -> Snapshot {
        let mut topics = Items::new();
        for (parent, child) in self.links.keys() {
            for name in [parent, child] {
                if let Some(topic) = self.topics.get(name) {
                    topics.insert(name.clone(), topic.clone());
                }
            }
        }
        Snapshot {
            versions: self.versions,
            topics,
            links: self.links.clone(),
            plugins: self.plugins.clone(),
            users: self.users.clone(),
            acls: self.acls.clone(),
        }
    }
}

impl LinkTopics {
    /// Copies the link `parent -> child` and its two topics out of `snapshot`: three map
    /// lookups, whatever else it holds. `None` when the link or either topic is missing.
    pub(crate) fn find_in(snapshot: &Snapshot, parent: &str, child: &str) -> Option<LinkTopics> {
        let link = snapshot.links.get(&(parent.to_owned(), child.to_owned()))?;
        Some(LinkTopics {
            link: link.clone(),
            parent: snapshot.topics.get(parent)?.clone(),
            child: match &link.remote {
                Some(remote) => remote_child_topic(child, remote, link.attached_at_ms),
                None => snapshot.topics.get(child)?.clone(),
            },
        })
    }

    /// Takes the link `parent -> child` and its two topics out of `snapshot` (moved, not
    /// cloned): `None` when the link or either topic is missing.
    pub(crate) fn take_from(
        snapshot: &mut Snapshot,
        parent: &str,
        child: &str,
    ) -> Option<LinkTopics> {
        let link = snapshot
            .links
            .remove(&(parent.to_owned(), child.to_owned()))?;
        let parent = snapshot.topics.remove(parent)?;
        let child = match &link.remote {
            Some(remote) => remote_child_topic(child, remote, link.attached_at_ms),
            None => snapshot.topics.remove(child)?,
        };
        Some(LinkTopics {
            link,
            parent,
            child,
        })
    }
}

/// `parent -> child, ...` for messages.
fn link_list(links: &[(String, String)]) -> String {
    links
        .iter()
        .map(|(parent, child)| format!("{parent} -> {child}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Errors from metastore operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetastoreError {
    /// `create_topic` for a name that already exists.
    #[error("topic {name:?} already exists")]
    TopicExists {
        /// The name.
        name: String,
    },
    /// An operation named a topic that does not exist.
    #[error("topic {name:?} does not exist")]
    UnknownTopic {
        /// The name.
        name: String,
    },
    /// A delete that was not to remove links found the topic in some (as parent, child, or
    /// dead-letter topic).
    #[error(
        "topic {name:?} has fan-out links ({}); deleting it removes them (a link that only \
         sends its dead letters to it stays, without a dead-letter topic)",
        link_list(links)
    )]
    TopicHasLinks {
        /// The topic.
        name: String,
        /// Its links, as (parent, child), in order.
        links: Vec<(String, String)>,
    },
    /// A user create for a name that already exists.
    #[error("user {name:?} already exists (narad user password changes a password)")]
    UserExists {
        /// The name.
        name: String,
    },
    /// An operation named a user that does not exist.
    #[error("user {name:?} does not exist")]
    UnknownUser {
        /// The name.
        name: String,
    },
    /// A user name or credential that breaks the rules.
    #[error("{0}")]
    BadUser(String),
    /// An ACL rule that is not well formed.
    #[error("{0}")]
    BadAcl(String),
    /// A removal named a rule that does not exist.
    #[error("no such rule: {rule}")]
    UnknownAcl {
        /// The rule.
        rule: Box<AclRule>,
    },
    /// `grow_partitions` asked for fewer partitions than the topic has.
    #[error(
        "topic {name:?} has {current} partitions; the count can only grow, not shrink to {requested}"
    )]
    CannotShrink {
        /// The topic.
        name: String,
        /// Its current partition count.
        current: u32,
        /// The count asked for.
        requested: u32,
    },
    /// The metastore file failed its checksum or does not parse: it was damaged or half
    /// written by something other than this daemon's atomic replace. Start-up stops here.
    #[error(
        "metastore file {} is corrupt ({reason}); {}",
        path.display(),
        recovery_hint(path, backup.as_deref())
    )]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What check failed.
        reason: String,
        /// The previous good version, when one exists and passes its own checks.
        backup: Option<PathBuf>,
    },
    /// The metastore file is missing but its backup exists: someone removed it.
    #[error(
        "metastore file {} is missing but its backup {} exists; if the data dir is intact, \
         restore it with `cp {} {}` (the journals beside it replay every later change)",
        path.display(), backup.display(), backup.display(), path.display()
    )]
    Missing {
        /// The expected file.
        path: PathBuf,
        /// The backup found beside it.
        backup: PathBuf,
    },
    /// The metastore snapshot and its backup are missing but a journal of changes exists: the
    /// journal only makes sense on the snapshot it continues, so start-up stops.
    #[error(
        "metastore file {} is missing but the journal {} exists; the journal holds only the \
         changes after that file, so narad will not start from it alone: restore {} from a \
         backup of the data dir, or, to rebuild the topic list from the topic directories, move \
         every metastore.* file out of the data dir and run `narad admin rebuild-metastore`",
        path.display(), journal.display(), path.display()
    )]
    JournalWithoutSnapshot {
        /// The expected snapshot.
        path: PathBuf,
        /// The journal found beside it.
        journal: PathBuf,
    },
    /// The file was written by a newer format than this binary understands.
    #[error(
        "metastore file {} has format {found}, this binary understands up to {supported}; run a newer narad",
        path.display()
    )]
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
        /// Format number in the file.
        found: u32,
        /// Highest format this binary reads.
        supported: u32,
    },
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An attach for a (parent, child) pair that is already linked.
    #[error("{child:?} is already a child of {parent:?}; detach it first, or PATCH its router")]
    LinkExists {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
    },
    /// An operation named a link that does not exist.
    #[error("{child:?} is not a child of {parent:?}")]
    UnknownLink {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
    },
    /// The attach or retention change breaks a link rule.
    #[error(transparent)]
    LinkRule(#[from] LinkRuleError),
    /// A plugin still used by links cannot be removed.
    #[error("plugin {name:?} is used by {}; change their routers first", links.join(", "))]
    PluginInUse {
        /// The plugin.
        name: String,
        /// The links using it, as `parent -> child`.
        links: Vec<String>,
    },
    /// An operation named a plugin that was never uploaded.
    #[error("no plugin named {name:?} has been uploaded")]
    UnknownPlugin {
        /// The name.
        name: String,
    },
    /// A topic's owners do not match its partitions: in cluster mode every partition has one
    /// owner, on one node none has.
    #[error(
        "topic {topic:?} would have {partitions} partitions but {owners} owners; every \
         partition has one owner in cluster mode and none on a single node"
    )]
    Placement {
        /// The topic.
        topic: String,
        /// Its partition count after the change.
        partitions: u32,
        /// The owners it would have.
        owners: usize,
    },
    /// A change named a partition the topic does not have.
    #[error("topic {topic:?} has {partitions} partitions; there is no partition {partition}")]
    NoSuchPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// The topic's partition count.
        partitions: u32,
    },
    /// An ownership change found the partition's owner record other than the caller read it
    /// (another move, or a cancel, got there first): nothing was changed.
    #[error(
        "the owner of {topic}/{partition} changed under this request (expected {expected}, \
         found {found}); look again and retry"
    )]
    OwnerChanged {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The record the caller expected, described.
        expected: String,
        /// The record found, described.
        found: String,
    },
    /// A dead node's partition was to get a new owner, but the node is alive again (its key
    /// came back before the write): nothing changed.
    #[error(
        "node {node} is alive again: its partitions are not re-created while it lives (move \
         them with `narad partition move`, which loses nothing)"
    )]
    OwnerAlive {
        /// The node.
        node: String,
    },
    /// A background task running a blocking write was cancelled or panicked.
    #[error("metastore write task failed: {0}")]
    Task(String),
    /// A backend answered a change with an outcome of another kind than that change has (a
    /// topic change answered with a link, ...): a bug in the backend, not in the request.
    #[error("a metastore change answered {got:?}, not {wanted}")]
    OutcomeMismatch {
        /// What the call expects (`a topic`, `a link`, `a plugin version`, `plugin versions`).
        wanted: &'static str,
        /// The outcome that came back instead (boxed: it can hold a whole topic or link).
        got: Box<Outcome>,
    },
    /// The shared store (etcd) could not be reached or did not answer in time. Nothing was
    /// changed by the failed call, or, for a write whose answer was lost, the change is either
    /// fully recorded or not at all; retry.
    #[error("metastore unavailable: {context}: {source}")]
    Unavailable {
        /// What was being done.
        context: String,
        /// The client's error (boxed: it is large, and this error travels far).
        source: Box<etcd_client::Error>,
    },
    /// A write lost every compare-and-swap round to other nodes' writes; nothing was recorded.
    /// Retry.
    #[error("metastore write gave up after {rounds} rounds lost to concurrent writes; retry")]
    Contended {
        /// Rounds tried.
        rounds: u32,
    },
    /// A value in the shared store does not parse: written by something other than narad, or
    /// by an incompatible version. Nothing is read as empty and nothing is overwritten.
    #[error(
        "metastore key {key} holds a value that does not parse ({reason}); inspect it with etcdctl"
    )]
    BadRecord {
        /// The etcd key.
        key: String,
        /// The parse error.
        reason: String,
    },
    /// One metadata item (a topic with its partition owners, a link, a plugin version) would
    /// be larger than one etcd request takes.
    #[error(
        "the metadata item {key} would be {bytes} bytes, over the {limit}-byte limit of one etcd request"
    )]
    ItemTooLarge {
        /// The item's key (under `meta/`).
        key: String,
        /// Its encoded size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A write would change more keys, or more bytes, than one etcd transaction takes (for
    /// example deleting a topic that is the child of more than about 120 parents).
    #[error(
        "this change would write {operations} etcd keys ({bytes} bytes) in one transaction, over etcd's {max_operations} operations or {max_bytes} bytes; make it in smaller steps (detach some links first)"
    )]
    WriteTooLarge {
        /// Keys the write would change.
        operations: usize,
        /// Bytes of keys and values.
        bytes: usize,
        /// Most operations one transaction takes.
        max_operations: usize,
        /// Most bytes.
        max_bytes: usize,
    },
}

fn recovery_hint(path: &std::path::Path, backup: Option<&std::path::Path>) -> String {
    match backup {
        Some(b) => format!(
            "the previous snapshot is in {b}: inspect both, then restore it with `cp {b} {p}` \
             (the journals beside it replay every change made since, so none is lost)",
            b = b.display(),
            p = path.display()
        ),
        None => "no good backup exists beside it; restore the file from a backup of the data dir"
            .to_owned(),
    }
}

/// A topic of `partitions` partitions with no retention limits, for tests.
#[cfg(test)]
pub(crate) fn test_topic(name: &str, partitions: u32) -> TopicMeta {
    TopicMeta {
        writable_as_child: false,
        name: name.to_owned(),
        partitions,
        retention_ms: None,
        retention_bytes: None,
        created_at_ms: 1_700_000_000_000,
        owners: Vec::new(),
    }
}

/// Where the cluster's metadata lives. All methods are safe to call concurrently; writes are
/// applied one at a time and are durable when they return `Ok`.
pub trait Metastore: Send + Sync + 'static {
    /// The metadata as this node currently knows it (may lag on a multi-node store).
    fn snapshot(&self) -> BoxFuture<'_, Result<Snapshot>>;

    /// [`Metastore::snapshot`] with only the topics some link names (as parent or child):
    /// what the reconciler's full pass compares, at a cost that follows the links rather than
    /// every topic. Every link and plugin is in it.
    fn links_snapshot(&self) -> BoxFuture<'_, Result<Snapshot>> {
        Box::pin(async move {
            let mut snapshot = self.snapshot().await?;
            snapshot.keep_linked_topics();
            Ok(snapshot)
        })
    }

    /// A linearizable read: the answer reflects every write acknowledged before this call
    /// began, on any node. Use it to check that an epoch is still current before acting on it.
    fn confirm(&self) -> BoxFuture<'_, Result<Snapshot>>;

    /// The current version counters (cheap; what a reconciler polls each tick).
    fn versions(&self) -> BoxFuture<'_, Result<Versions>>;

    /// One topic, or `None` when it does not exist.
    fn topic<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<TopicMeta>>>;

    /// The link `parent -> child` with its two topics, as [`Metastore::snapshot`] would show
    /// them (the same strength: it may lag on a multi-node store), or `None` when the link or
    /// either topic is missing. Every cursor calls it before routing each slab, so a backend
    /// answers it at a cost that does not grow with the number of topics, links and plugins.
    /// This default takes a whole snapshot: a backend whose snapshot copies everything
    /// overrides it.
    fn link_view<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
    ) -> BoxFuture<'a, Result<Option<LinkTopics>>> {
        Box::pin(async move {
            let mut snapshot = self.snapshot().await?;
            Ok(LinkTopics::take_from(&mut snapshot, parent, child))
        })
    }

    /// The parents of the links into `child` (empty: it is no fan-out child), as
    /// [`Metastore::snapshot`] would show them. Every produce asks (children are written only
    /// by their cursors unless the topic allows it), so a backend whose snapshot copies
    /// everything overrides this default.
    fn parents_of<'a>(&'a self, child: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            let snapshot = self.snapshot().await?;
            Ok(parents_in(&snapshot, child))
        })
    }

    /// Applies one change atomically: its rules ([`transition`]) are checked against the
    /// current metadata and the change is recorded in the same step, durably when this
    /// returns `Ok`. A refused change records nothing. The methods below are this, typed.
    fn apply(&self, change: Change) -> BoxFuture<'_, Result<Outcome>>;

    /// Creates a topic. Fails with [`MetastoreError::TopicExists`] when the name is taken.
    fn create_topic(&self, topic: TopicMeta) -> BoxFuture<'_, Result<TopicMeta>> {
        typed(self.apply(Change::CreateTopic(topic)), Outcome::into_topic)
    }

    /// Deletes a topic, returning what it was; its links go with it when `remove_links`,
    /// else a topic in any link is refused ([`MetastoreError::TopicHasLinks`]), checked in
    /// the same step as the delete. Fails with [`MetastoreError::UnknownTopic`].
    fn delete_topic<'a>(
        &'a self,
        name: &'a str,
        remove_links: bool,
    ) -> BoxFuture<'a, Result<TopicMeta>> {
        let change = Change::DeleteTopic {
            name: name.to_owned(),
            remove_links,
        };
        typed(self.apply(change), Outcome::into_topic)
    }

    /// Raises a topic's partition count to `count`. Asking for the current count changes
    /// nothing (and moves no version); asking for fewer fails with
    /// [`MetastoreError::CannotShrink`].
    fn grow_partitions<'a>(
        &'a self,
        name: &'a str,
        count: u32,
    ) -> BoxFuture<'a, Result<TopicMeta>> {
        let change = Change::GrowPartitions {
            name: name.to_owned(),
            count,
            owners: Vec::new(),
        };
        typed(self.apply(change), Outcome::into_topic)
    }

    /// Changes a topic's retention. Fails with [`MetastoreError::LinkRule`] when a delay child
    /// of the topic would need longer retention.
    fn set_retention<'a>(
        &'a self,
        name: &'a str,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    ) -> BoxFuture<'a, Result<TopicMeta>> {
        let change = Change::SetRetention {
            name: name.to_owned(),
            retention_ms,
            retention_bytes,
        };
        typed(self.apply(change), Outcome::into_topic)
    }

    /// Lets producers write to `name` while it is a fan-out child (`writable`), or not.
    fn set_writable_as_child<'a>(
        &'a self,
        name: &'a str,
        writable: bool,
    ) -> BoxFuture<'a, Result<TopicMeta>> {
        let change = Change::SetWritableAsChild {
            name: name.to_owned(),
            writable,
        };
        typed(self.apply(change), Outcome::into_topic)
    }

    /// Records a new link. Both topics must exist; the link rules ([`link::check_attach`]) are
    /// checked in the same write. Fails with [`MetastoreError::LinkExists`] for a linked pair.
    fn attach_link(&self, link: LinkMeta) -> BoxFuture<'_, Result<LinkMeta>> {
        typed(self.apply(Change::AttachLink(link)), Outcome::into_link)
    }

    /// Records a new topic and a link whose child it is, in one write: the attach that creates
    /// its child. Fails as [`Metastore::create_topic`] and [`Metastore::attach_link`] would,
    /// and then records neither.
    fn attach_link_with_new_child(
        &self,
        child: TopicMeta,
        link: LinkMeta,
    ) -> BoxFuture<'_, Result<LinkMeta>> {
        typed(
            self.apply(Change::AttachLinkWithNewChild { child, link }),
            Outcome::into_link,
        )
    }

    /// Removes a link, returning what it was.
    fn detach_link<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
    ) -> BoxFuture<'a, Result<LinkMeta>> {
        let change = Change::DetachLink {
            parent: parent.to_owned(),
            child: child.to_owned(),
        };
        typed(self.apply(change), Outcome::into_link)
    }

    /// Replaces a link's router chain (and, when given, its config), keeping its epoch.
    fn set_link_router<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
        router: Vec<PluginRef>,
        config: Option<String>,
    ) -> BoxFuture<'a, Result<LinkMeta>> {
        let change = Change::SetLinkRouter {
            parent: parent.to_owned(),
            child: child.to_owned(),
            router,
            config,
        };
        typed(self.apply(change), Outcome::into_link)
    }

    /// Pauses (`paused`) or resumes the cursors of `partitions` (`None`: every partition) of
    /// the link `parent -> child`; returns the link as recorded now.
    fn set_paused<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
        partitions: Option<Vec<u32>>,
        paused: bool,
    ) -> BoxFuture<'a, Result<LinkMeta>> {
        let change = Change::SetPaused {
            parent: parent.to_owned(),
            child: child.to_owned(),
            partitions,
            paused,
        };
        typed(self.apply(change), Outcome::into_link)
    }

    /// Sets (`Some`) or clears (`None`) the shadow of the link `parent -> child`; returns the
    /// link as recorded now. Nothing else of the link changes.
    fn set_shadow<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
        shadow: Option<ShadowSpec>,
    ) -> BoxFuture<'a, Result<LinkMeta>> {
        let change = Change::SetShadow {
            parent: parent.to_owned(),
            child: child.to_owned(),
            shadow,
        };
        typed(self.apply(change), Outcome::into_link)
    }

    /// Changes what the cursors of the link `parent -> child` do on a gap or on a record
    /// they cannot route, and records accepted gaps ([`PolicyChange`]); returns the link as
    /// recorded now.
    fn set_link_policy<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
        change: PolicyChange,
    ) -> BoxFuture<'a, Result<LinkMeta>> {
        let change = Change::SetLinkPolicy {
            parent: parent.to_owned(),
            child: child.to_owned(),
            change,
        };
        typed(self.apply(change), Outcome::into_link)
    }

    /// Replaces the owner record of partition `partition` of `topic` with `owner`, if it is
    /// still `expected` (else [`MetastoreError::OwnerChanged`]): every step of a planned move.
    fn set_owner<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        expected: PartitionOwner,
        owner: PartitionOwner,
    ) -> BoxFuture<'a, Result<TopicMeta>> {
        let change = Change::SetOwner {
            topic: topic.to_owned(),
            partition,
            expected,
            owner,
        };
        typed(self.apply(change), Outcome::into_topic)
    }

    /// One user, or `None` when there is none of that name, as [`Metastore::snapshot`] would
    /// show it (on several nodes it may lag a change made through another node by the time
    /// the change takes to reach this one). Every SASL authentication asks it, so a backend
    /// answers without copying every topic.
    fn user<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<UserMeta>>> {
        Box::pin(async move { Ok(self.snapshot().await?.users.remove(name)) })
    }

    /// Records a new user. Fails with [`MetastoreError::UserExists`] when the name is taken.
    fn create_user(&self, user: UserMeta) -> BoxFuture<'_, Result<UserMeta>> {
        typed(self.apply(Change::CreateUser(user)), Outcome::into_user)
    }

    /// Replaces a user's credentials (a new password).
    fn set_user_credentials<'a>(
        &'a self,
        name: &'a str,
        credentials: Vec<ScramCredential>,
        updated_at_ms: i64,
    ) -> BoxFuture<'a, Result<UserMeta>> {
        let change = Change::SetUserCredentials {
            name: name.to_owned(),
            credentials,
            updated_at_ms,
        };
        typed(self.apply(change), Outcome::into_user)
    }

    /// Removes a user, returning them as they were.
    fn delete_user<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<UserMeta>> {
        let change = Change::DeleteUser {
            name: name.to_owned(),
        };
        typed(self.apply(change), Outcome::into_user)
    }

    /// Every ACL rule, as [`Metastore::snapshot`] would show them, without copying the rest.
    fn acls(&self) -> BoxFuture<'_, Result<Vec<AclRule>>> {
        Box::pin(async move { Ok(self.snapshot().await?.acls) })
    }

    /// Adds an ACL rule (one already there is a no-op).
    fn add_acl(&self, rule: AclRule) -> BoxFuture<'_, Result<AclRule>> {
        typed(self.apply(Change::AddAcl(rule)), Outcome::into_acl)
    }

    /// Removes an ACL rule. Fails with [`MetastoreError::UnknownAcl`] when it is not there.
    fn remove_acl(&self, rule: AclRule) -> BoxFuture<'_, Result<AclRule>> {
        typed(self.apply(Change::RemoveAcl(rule)), Outcome::into_acl)
    }

    /// Records an uploaded plugin version (the same name and digest twice is a no-op).
    fn add_plugin(&self, plugin: PluginVersion) -> BoxFuture<'_, Result<PluginVersion>> {
        typed(self.apply(Change::AddPlugin(plugin)), Outcome::into_plugin)
    }

    /// Removes every version of a plugin, returning them. Fails with
    /// [`MetastoreError::PluginInUse`] while a link's router names it.
    fn remove_plugin<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<PluginVersion>>> {
        let change = Change::RemovePlugin {
            name: name.to_owned(),
        };
        typed(self.apply(change), Outcome::into_plugins)
    }
}

/// The parents of the links into `child` in `snapshot`.
pub(crate) fn parents_in(snapshot: &Snapshot, child: &str) -> Vec<String> {
    snapshot
        .links
        .values()
        .filter(|l| l.child == child)
        .map(|l| l.parent.clone())
        .collect()
}

/// Maps the outcome of [`Metastore::apply`] to the typed answer of one change.
fn typed<'a, T: 'a>(
    applied: BoxFuture<'a, Result<Outcome>>,
    pick: fn(Outcome) -> Result<T>,
) -> BoxFuture<'a, Result<T>> {
    Box::pin(async move { pick(applied.await?) })
}
