//! Which data dir a node id serves from: a random id written into the data dir
//! (`cluster/identity.json`) and into etcd (`data-dirs/{node id}`, not under the lease), checked
//! at every start before the node joins.
//!
//! Why: a node registers the partitions the metadata gives it, making the directory of any it
//! does not find (the metadata is written first, so a crash between the two is repaired that
//! way). Started on a directory that is not the one it wrote them in (a replaced disk, a disk
//! that did not mount so the daemon runs on the empty mount point, a mistyped `--data-dir`),
//! it would serve every partition it owns empty, from offset 0: consumers would see offsets
//! again that meant other records, and cursors whose offset files went with the old disk would
//! start from what the children hold, which can skip the new records (and before children
//! compared content, `super::dedupe`, they dropped them as copies of old ones: a silent loss
//! of acknowledged records). So a node whose data dir is not the one
//! recorded for its id refuses to start, naming both, before it makes any partition.
//!
//! The rules:
//! - **A data dir belongs to one node of one cluster.** A data dir whose identity names another
//!   cluster or node id is refused, whatever else is given.
//! - **The recorded data dir must be this one.** When etcd records a data dir for the id, the
//!   local identity must carry the same id.
//! - **A new data dir only for a node that owns nothing.** `--new-data-dir-for ID` takes the
//!   directory as the node's new one, and only while the metadata gives the node no partition
//!   (re-create them elsewhere first, accepting the loss: `narad node recreate`).
//! - **A lost identity file.** A directory without a (readable) identity that holds every
//!   partition the node owns is the node's own: etcd's id is written back into it. A damaged
//!   file is moved aside first, never deleted.
//! - **First start.** With nothing recorded anywhere (a new node, or one that ran a narad
//!   without this check), the directory is taken, unless the metadata gives the node
//!   partitions and not one of their directories is here: then it is not the directory the node
//!   ran on, and the start is refused as above.
//! - **Crash-safe order.** The local file is written (durably) before etcd is told; etcd is
//!   changed only by compare-and-swap, so of two processes racing for one id with different
//!   directories, one is recorded and the other refused.

use std::path::{Path, PathBuf};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use narad_storage::PartitionId;
use narad_storage::fs::FileSystem;
use serde::{Deserialize, Serialize};

/// Name of the identity file in `{data_dir}/cluster/`.
pub(crate) const IDENTITY_FILE: &str = "identity.json";

/// Partitions named in a refusal; the rest are counted.
const NAMED_IN_ERRORS: usize = 5;

/// What the data dir says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LocalIdentity {
    /// The cluster's key prefix in etcd.
    prefix: String,
    /// The node id the directory serves.
    node_id: String,
    /// 32 hex digits, random, made when the directory was first taken.
    data_dir_id: String,
    /// When it was made, in milliseconds since the Unix epoch.
    created_at_ms: i64,
}

/// What etcd records for a node id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordedDataDir {
    /// The data dir id the node last started on.
    data_dir_id: String,
    /// When that directory was first taken, in milliseconds since the Unix epoch.
    created_at_ms: i64,
}

/// Why a node may not start on its data dir, or why that could not be checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// etcd could not be reached or refused the request.
    #[error("etcd: {context}")]
    Etcd {
        /// What was being done.
        context: String,
        /// The client's error (boxed: it is large).
        source: Box<etcd_client::Error>,
    },
    /// The identity file could not be read or written, or does not parse.
    #[error("{}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The key recording the node's data dir holds something that does not parse.
    #[error("{key} holds a value that does not parse ({reason}); it is left as it is")]
    BadRecord {
        /// The key.
        key: String,
        /// The parse error.
        reason: String,
    },
    /// The data dir belongs to another node or cluster.
    #[error(
        "data dir {} belongs to node {other_node:?} of cluster prefix {other_prefix:?}, not to \
         node {node_id:?} of {prefix:?}: start that node on it, or give this node its own \
         data dir",
        data_dir.display()
    )]
    ForeignDataDir {
        /// The data dir.
        data_dir: PathBuf,
        /// This node's id.
        node_id: String,
        /// This node's cluster prefix.
        prefix: String,
        /// The node id the directory names.
        other_node: String,
        /// The prefix the directory names.
        other_prefix: String,
    },
    /// The data dir is not the one this node last ran on.
    #[error(
        "data dir {} is not the one node {node_id:?} last ran on ({found}; etcd records data \
         dir {recorded}). If the disk did not mount or --data-dir is wrong, fix that and start \
         again. {}",
        data_dir.display(),
        if owned.is_empty() {
            format!(
                "It owns no partition now: if this is its new disk, start it once with \
                 --new-data-dir-for {node_id}"
            )
        } else {
            format!(
                "Started here it would serve its partitions empty ({}). If the old data dir is \
                 gone for good, re-create them on other nodes (`narad node recreate {node_id} \
                 --accept-loss`), then start once with --new-data-dir-for {node_id}",
                named(owned)
            )
        }
    )]
    NotItsDataDir {
        /// The data dir.
        data_dir: PathBuf,
        /// This node's id.
        node_id: String,
        /// What the directory holds: no identity, or another data dir id.
        found: String,
        /// The data dir id etcd records, or what is known instead.
        recorded: String,
        /// The partitions the metadata gives the node.
        owned: Vec<PartitionId>,
    },
    /// Another live process runs as this node id (on another data dir).
    #[error(
        "node id {node_id:?} is held by a live process advertising {holder} (or by one stopped \
         less than a lease TTL ago), whose data dir is not this one; give this node its own \
         --node-id, or stop the other process first"
    )]
    NodeIdLive {
        /// This node's id.
        node_id: String,
        /// What the holder advertises.
        holder: String,
    },
    /// `--new-data-dir-for` while the node still owns partitions.
    #[error(
        "--new-data-dir-for {node_id}: the metadata still gives node {node_id:?} {owned}; a new \
         data dir would serve them empty. Re-create them on other nodes first (`narad node \
         recreate {node_id} --accept-loss`), or start on the old data dir"
    )]
    NewDataDirOwnsPartitions {
        /// This node's id.
        node_id: String,
        /// The partitions, named.
        owned: String,
    },
}

type Result<T, E = IdentityError> = std::result::Result<T, E>;

/// What the start does about the data dir, decided from what each side records.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    /// Both sides agree: start.
    Start,
    /// The directory's identity is recorded nowhere in etcd: record it there, then start.
    Record,
    /// Make a new identity, write it here and record it in etcd (replacing what etcd had when
    /// `replacing`), then start.
    Create { replacing: bool },
    /// The directory has no (readable) identity but holds every partition the node owns: it
    /// is the node's own directory that lost its identity file. Write etcd's id back here,
    /// then start.
    Adopt,
    /// Refuse to start.
    Refuse(Refusal),
}

/// Why [`plan`] refuses, before the error names the paths and partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    Foreign,
    NotItsDataDir,
    NewDataDirOwnsPartitions,
}

/// What the metadata gives the node, and how much of it the directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owned {
    partitions: usize,
    on_disk: usize,
}

/// The decision, on its own so every case is tested without etcd.
fn plan(
    local: Option<&LocalIdentity>,
    recorded: Option<&RecordedDataDir>,
    prefix: &str,
    node_id: &str,
    new_data_dir: bool,
    owned: Owned,
) -> Plan {
    if let Some(local) = local
        && (local.prefix != prefix || local.node_id != node_id)
    {
        return Plan::Refuse(Refusal::Foreign);
    }
    let agree = matches!((local, recorded), (Some(l), Some(r)) if l.data_dir_id == r.data_dir_id);
    if agree {
        return Plan::Start;
    }
    if new_data_dir {
        return if owned.partitions > 0 {
            Plan::Refuse(Refusal::NewDataDirOwnsPartitions)
        } else {
            Plan::Create {
                replacing: recorded.is_some(),
            }
        };
    }
    match (local, recorded) {
        (Some(_), None) => Plan::Record,
        (None, Some(_)) if owned.partitions > 0 && owned.on_disk == owned.partitions => Plan::Adopt,
        (None, None) if owned.partitions > 0 && owned.on_disk == 0 => {
            Plan::Refuse(Refusal::NotItsDataDir)
        }
        (None, None) => Plan::Create { replacing: false },
        _ => Plan::Refuse(Refusal::NotItsDataDir),
    }
}

/// Checks that `data_dir` is the one node `node_id` of the cluster under `prefix` serves from,
/// recording it on a first start (or, with `new_data_dir`, as the node's new one), before the
/// node joins. `owned` are the partitions the metadata gives the node. Returns the data dir id.
/// The identity file is read and written on `fs` (the file system the data dir is opened
/// on), and written durably before etcd is told.
pub(crate) async fn establish(
    fs: &dyn FileSystem,
    client: &Client,
    prefix: &str,
    node_id: &str,
    data_dir: &Path,
    new_data_dir: bool,
    owned: &[PartitionId],
) -> Result<String> {
    let dir = data_dir.join("cluster");
    let path = dir.join(IDENTITY_FILE);
    let local = read_local(fs, &path)?;
    let key = format!("{prefix}data-dirs/{node_id}");
    let mut kv = client.kv_client();
    let got = kv
        .get(key.clone(), None)
        .await
        .map_err(etcd("reading the data dir recorded for this node"))?;
    let (recorded, revision) = match got.kvs().first() {
        Some(kv) => (
            Some(
                serde_json::from_slice::<RecordedDataDir>(kv.value()).map_err(|e| {
                    IdentityError::BadRecord {
                        key: key.clone(),
                        reason: e.to_string(),
                    }
                })?,
            ),
            kv.mod_revision(),
        ),
        None => (None, 0),
    };
    let on_disk = owned
        .iter()
        .filter(|id| {
            fs.metadata(&partition_dir(data_dir, id))
                .is_ok_and(|m| m.is_dir)
        })
        .count();
    let counts = Owned {
        partitions: owned.len(),
        on_disk,
    };
    let chosen = plan(
        local.as_ref(),
        recorded.as_ref(),
        prefix,
        node_id,
        new_data_dir,
        counts,
    );
    let identity = match chosen {
        Plan::Start => return Ok(local.map(|l| l.data_dir_id).unwrap_or_default()),
        Plan::Refuse(why) => {
            // Most likely a second process for a live node id: say that, not "wrong disk".
            if why == Refusal::NotItsDataDir
                && let Some(holder) = live_holder(client, prefix, node_id).await?
            {
                return Err(IdentityError::NodeIdLive {
                    node_id: node_id.to_owned(),
                    holder,
                });
            }
            return Err(refusal(
                why,
                data_dir,
                node_id,
                prefix,
                local.as_ref(),
                recorded.as_ref(),
                owned,
            ));
        }
        Plan::Adopt => {
            let Some(recorded) = recorded else {
                return Err(IdentityError::File {
                    path,
                    reason: "no data dir recorded to adopt".to_owned(),
                });
            };
            let adopted = LocalIdentity {
                prefix: prefix.to_owned(),
                node_id: node_id.to_owned(),
                data_dir_id: recorded.data_dir_id,
                created_at_ms: recorded.created_at_ms,
            };
            write_local(fs, &dir, &path, &adopted)?;
            tracing::warn!(node = node_id, data_dir = %data_dir.display(),
                data_dir_id = %adopted.data_dir_id, partitions = owned.len(),
                "this data dir had no identity file but holds every partition the node owns: \
                 it is taken as the node's recorded data dir again");
            return Ok(adopted.data_dir_id);
        }
        Plan::Record => local.ok_or_else(|| IdentityError::File {
            path: path.clone(),
            reason: "the identity vanished while it was checked".to_owned(),
        })?,
        Plan::Create { replacing } => {
            let created = LocalIdentity {
                prefix: prefix.to_owned(),
                node_id: node_id.to_owned(),
                data_dir_id: hex::encode(rand::random::<[u8; 16]>()),
                created_at_ms: now_ms(),
            };
            write_local(fs, &dir, &path, &created)?;
            if replacing {
                tracing::warn!(
                    node = node_id,
                    data_dir = %data_dir.display(),
                    old = recorded.as_ref().map_or("", |r| r.data_dir_id.as_str()),
                    new = %created.data_dir_id,
                    "taking this data dir as the node's new one (--new-data-dir-for)"
                );
            }
            created
        }
    };
    let value = serde_json::to_vec(&RecordedDataDir {
        data_dir_id: identity.data_dir_id.clone(),
        created_at_ms: identity.created_at_ms,
    })
    .map_err(|e| IdentityError::BadRecord {
        key: key.clone(),
        reason: e.to_string(),
    })?;
    // Unchanged since it was read (absent: created 0), so a racing start is not overwritten.
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            revision,
        )])
        .and_then([TxnOp::put(key.clone(), value, None)]);
    let answer = kv
        .txn(txn)
        .await
        .map_err(etcd("recording this data dir for the node"))?;
    if !answer.succeeded() {
        return Err(IdentityError::NotItsDataDir {
            data_dir: data_dir.to_owned(),
            node_id: node_id.to_owned(),
            found: format!("it has data dir id {}", identity.data_dir_id),
            recorded: "recorded by another process for this node id while this one started; \
                       is another process running as this node?"
                .to_owned(),
            owned: owned.to_vec(),
        });
    }
    tracing::info!(node = node_id, data_dir_id = %identity.data_dir_id, "data dir recorded for this node");
    Ok(identity.data_dir_id)
}

/// What the live process holding `node_id` advertises, if one does.
async fn live_holder(client: &Client, prefix: &str, node_id: &str) -> Result<Option<String>> {
    let got = client
        .kv_client()
        .get(format!("{prefix}nodes/{node_id}"), None)
        .await
        .map_err(etcd("reading the live nodes"))?;
    Ok(got.kvs().first().map(|kv| {
        serde_json::from_slice::<super::NodeRecord>(kv.value())
            .map(|r| r.advertise)
            .unwrap_or_else(|_| "an unreadable record".to_owned())
    }))
}

/// The error for a refusal, naming what each side holds.
fn refusal(
    why: Refusal,
    data_dir: &Path,
    node_id: &str,
    prefix: &str,
    local: Option<&LocalIdentity>,
    recorded: Option<&RecordedDataDir>,
    owned: &[PartitionId],
) -> IdentityError {
    match why {
        Refusal::Foreign => {
            let (other_node, other_prefix) = local
                .map(|l| (l.node_id.clone(), l.prefix.clone()))
                .unwrap_or_default();
            IdentityError::ForeignDataDir {
                data_dir: data_dir.to_owned(),
                node_id: node_id.to_owned(),
                prefix: prefix.to_owned(),
                other_node,
                other_prefix,
            }
        }
        Refusal::NotItsDataDir => IdentityError::NotItsDataDir {
            data_dir: data_dir.to_owned(),
            node_id: node_id.to_owned(),
            found: match local {
                Some(l) => format!("it has data dir id {}", l.data_dir_id),
                None => "it has no identity file".to_owned(),
            },
            recorded: match recorded {
                Some(r) => format!("{} (taken at {} ms)", r.data_dir_id, r.created_at_ms),
                None => "none, but no directory of the node's partitions is here".to_owned(),
            },
            owned: owned.to_vec(),
        },
        Refusal::NewDataDirOwnsPartitions => IdentityError::NewDataDirOwnsPartitions {
            node_id: node_id.to_owned(),
            owned: named(owned),
        },
    }
}

/// "no partition", or the first few partitions and how many more.
fn named(owned: &[PartitionId]) -> String {
    if owned.is_empty() {
        return "no partition".to_owned();
    }
    let first: Vec<String> = owned
        .iter()
        .take(NAMED_IN_ERRORS)
        .map(|id| format!("{}/{}", id.topic, id.partition))
        .collect();
    let more = owned.len().saturating_sub(NAMED_IN_ERRORS);
    let plural = if owned.len() == 1 { "" } else { "s" };
    if more == 0 {
        format!("{} partition{plural}: {}", owned.len(), first.join(", "))
    } else {
        format!(
            "{} partition{plural}: {} and {more} more",
            owned.len(),
            first.join(", ")
        )
    }
}

/// Where `id`'s directory is in a data dir.
fn partition_dir(data_dir: &Path, id: &PartitionId) -> PathBuf {
    data_dir
        .join(narad_storage::store::TOPICS_DIR_NAME)
        .join(&id.topic)
        .join(id.dir_name())
}

/// The identity in `path` on `fs`, if there is one. One that does not parse is moved aside
/// (to `identity.json.damaged-{ms}`, never deleted) and counts as none: the rules then decide
/// whether this directory is the node's by what it holds.
fn read_local(fs: &dyn FileSystem, path: &Path) -> Result<Option<LocalIdentity>> {
    let failed = |e: std::io::Error| IdentityError::File {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let bytes = match crate::durable::read_whole(fs, path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed(e)),
    };
    match serde_json::from_slice(&bytes) {
        Ok(identity) => Ok(Some(identity)),
        Err(e) => {
            let aside = path.with_file_name(format!("{IDENTITY_FILE}.damaged-{}", now_ms()));
            fs.rename(path, &aside).map_err(failed)?;
            if let Some(dir) = path.parent() {
                fs.sync_dir(dir).map_err(failed)?;
            }
            tracing::warn!(path = %path.display(), kept_as = %aside.display(), error = %e,
                "this data dir's identity file does not parse; moved aside, and the directory \
                 is judged by what it holds");
            Ok(None)
        }
    }
}

/// Writes `identity` to `path` (the identity file in `dir`) on `fs`: when this returns `Ok`,
/// a crash leaves it; when it fails or the process dies during it, the file is the one before
/// (or none) or this one, whole.
fn write_local(
    fs: &dyn FileSystem,
    dir: &Path,
    path: &Path,
    identity: &LocalIdentity,
) -> Result<()> {
    let failed = |e: std::io::Error| IdentityError::File {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    // Owner-only, as everything in the data directory (a 0755 directory would be tightened,
    // with a warning, at every start).
    fs.create_dir_all(dir).map_err(failed)?;
    let bytes =
        serde_json::to_vec_pretty(identity).map_err(|e| failed(std::io::Error::other(e)))?;
    narad_storage::fs::replace_file(fs, dir, IDENTITY_FILE, &bytes).map_err(failed)?;
    // The `cluster/` entry itself must survive a crash too.
    fs.sync_dir(dir.parent().unwrap_or(dir)).map_err(failed)
}

/// Milliseconds since the Unix epoch (0 for a clock before it).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn etcd(context: &'static str) -> impl FnOnce(etcd_client::Error) -> IdentityError {
    move |source| IdentityError::Etcd {
        context: context.to_owned(),
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use narad_storage::fault::FaultFs;
    use narad_storage::fs::RealFs;

    use super::*;

    const PREFIX: &str = "/narad/demo/";

    fn local(id: &str) -> LocalIdentity {
        LocalIdentity {
            prefix: PREFIX.to_owned(),
            node_id: "n2".to_owned(),
            data_dir_id: id.to_owned(),
            created_at_ms: 1,
        }
    }

    fn recorded(id: &str) -> RecordedDataDir {
        RecordedDataDir {
            data_dir_id: id.to_owned(),
            created_at_ms: 1,
        }
    }

    const NOTHING: Owned = Owned {
        partitions: 0,
        on_disk: 0,
    };
    const ALL_HERE: Owned = Owned {
        partitions: 3,
        on_disk: 3,
    };
    const NONE_HERE: Owned = Owned {
        partitions: 3,
        on_disk: 0,
    };
    const SOME_HERE: Owned = Owned {
        partitions: 3,
        on_disk: 2,
    };

    fn decide(
        l: Option<&LocalIdentity>,
        r: Option<&RecordedDataDir>,
        new: bool,
        owned: Owned,
    ) -> Plan {
        plan(l, r, PREFIX, "n2", new, owned)
    }

    #[test]
    fn the_recorded_data_dir_starts_and_any_other_is_refused() {
        let a = local("a");
        assert_eq!(
            decide(Some(&a), Some(&recorded("a")), false, ALL_HERE),
            Plan::Start
        );
        // Its partitions' directories do not matter once both sides agree (a crash between a
        // topic's metadata and its directory is repaired by registering).
        assert_eq!(
            decide(Some(&a), Some(&recorded("a")), false, NONE_HERE),
            Plan::Start
        );
        // Its own directory that lost its identity file: every partition it owns is here.
        assert_eq!(
            decide(None, Some(&recorded("a")), false, ALL_HERE),
            Plan::Adopt
        );
        for owned in [NOTHING, NONE_HERE, SOME_HERE] {
            // A replaced or unmounted disk: no identity, and not every partition here.
            assert_eq!(
                decide(None, Some(&recorded("a")), false, owned),
                Plan::Refuse(Refusal::NotItsDataDir)
            );
        }
        for owned in [NOTHING, ALL_HERE, NONE_HERE] {
            // An old disk back after the node took a new one.
            assert_eq!(
                decide(Some(&a), Some(&recorded("b")), false, owned),
                Plan::Refuse(Refusal::NotItsDataDir)
            );
        }
    }

    #[test]
    fn a_data_dir_of_another_node_or_cluster_is_refused_even_as_a_new_one() {
        let mut other_node = local("a");
        other_node.node_id = "n1".to_owned();
        let mut other_cluster = local("a");
        other_cluster.prefix = "/narad/other/".to_owned();
        for l in [&other_node, &other_cluster] {
            for new in [false, true] {
                for r in [None, Some(recorded("a"))] {
                    assert_eq!(
                        decide(Some(l), r.as_ref(), new, NOTHING),
                        Plan::Refuse(Refusal::Foreign)
                    );
                }
            }
        }
    }

    #[test]
    fn a_new_data_dir_is_taken_only_by_a_node_that_owns_nothing() {
        assert_eq!(
            decide(None, Some(&recorded("a")), true, NOTHING),
            Plan::Create { replacing: true }
        );
        assert_eq!(
            decide(Some(&local("b")), Some(&recorded("a")), true, NOTHING),
            Plan::Create { replacing: true }
        );
        for owned in [ALL_HERE, NONE_HERE] {
            assert_eq!(
                decide(None, Some(&recorded("a")), true, owned),
                Plan::Refuse(Refusal::NewDataDirOwnsPartitions)
            );
        }
        // Asked for on the directory etcd already records: nothing to replace.
        assert_eq!(
            decide(Some(&local("a")), Some(&recorded("a")), true, ALL_HERE),
            Plan::Start
        );
    }

    #[test]
    fn a_first_start_takes_the_directory_unless_none_of_the_nodes_partitions_is_in_it() {
        assert_eq!(
            decide(None, None, false, NOTHING),
            Plan::Create { replacing: false }
        );
        // A node that ran before this check existed, on its own directory.
        assert_eq!(
            decide(None, None, false, ALL_HERE),
            Plan::Create { replacing: false }
        );
        assert_eq!(
            decide(
                None,
                None,
                false,
                Owned {
                    partitions: 3,
                    on_disk: 1
                }
            ),
            Plan::Create { replacing: false }
        );
        // ... or on an empty one: it cannot be the directory the node ran on.
        assert_eq!(
            decide(None, None, false, NONE_HERE),
            Plan::Refuse(Refusal::NotItsDataDir)
        );
        // Written here but never recorded (a crash between the two, or etcd's data lost).
        assert_eq!(
            decide(Some(&local("a")), None, false, NONE_HERE),
            Plan::Record
        );
    }

    #[test]
    fn a_refusal_says_what_to_do_for_a_node_that_owns_partitions_and_for_one_that_owns_none() {
        let refused = |owned: &[PartitionId]| {
            refusal(
                Refusal::NotItsDataDir,
                Path::new("/d"),
                "n2",
                PREFIX,
                None,
                Some(&recorded("a")),
                owned,
            )
            .to_string()
        };
        let owning = refused(&[PartitionId::new("orders", 0)]);
        for wanted in [
            "did not mount",
            "1 partition: orders/0",
            "narad node recreate n2 --accept-loss",
            "--new-data-dir-for n2",
        ] {
            assert!(owning.contains(wanted), "{wanted:?} missing from {owning}");
        }
        let idle = refused(&[]);
        assert!(idle.contains("owns no partition now"), "{idle}");
        assert!(idle.contains("--new-data-dir-for n2"), "{idle}");
        assert!(!idle.contains("node recreate"), "{idle}");
    }

    #[test]
    fn refusals_name_a_few_partitions_and_count_the_rest() {
        let ids: Vec<PartitionId> = (0..7).map(|p| PartitionId::new("orders", p)).collect();
        assert_eq!(named(&[]), "no partition");
        assert_eq!(named(&ids[..1]), "1 partition: orders/0");
        assert_eq!(named(&ids[..2]), "2 partitions: orders/0, orders/1");
        let text = named(&ids);
        assert!(
            text.starts_with("7 partitions: orders/0, orders/1"),
            "{text}"
        );
        assert!(text.ends_with("and 2 more"), "{text}");
    }

    #[test]
    fn the_local_identity_round_trips_and_a_damaged_one_is_kept_aside_and_counts_as_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cluster = dir.path().join("cluster");
        let path = cluster.join(IDENTITY_FILE);
        assert_eq!(read_local(&RealFs, &path).expect("absent"), None);
        write_local(&RealFs, &cluster, &path, &local("a")).expect("write");
        assert_eq!(read_local(&RealFs, &path).expect("read"), Some(local("a")));
        std::fs::write(&path, b"{\"prefix\": ").expect("damage");
        assert_eq!(read_local(&RealFs, &path).expect("damaged"), None);
        assert!(!path.exists());
        let kept: Vec<_> = std::fs::read_dir(&cluster)
            .expect("list")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        assert!(
            kept.iter().any(|n| n.starts_with("identity.json.damaged-")),
            "{kept:?}"
        );
    }

    /// The identity writes a node's life takes: the first start's (which makes `cluster/`),
    /// then a new data dir id written over it (`--new-data-dir-for` on a directory that had
    /// another identity), then the same id adopted back.
    fn identity_run() -> [LocalIdentity; 3] {
        [local("a"), local("b"), local("a")]
    }

    #[test]
    fn a_crash_at_any_step_of_an_identity_write_leaves_the_old_identity_or_the_new_whole() {
        let data = Path::new("/data");
        let cluster = data.join("cluster");
        let path = cluster.join(IDENTITY_FILE);
        let fresh = || {
            let fs = FaultFs::new();
            fs.create_dir_all(data).expect("data dir");
            fs.sync_dir(Path::new("/")).expect("sync /");
            fs
        };
        let mut expected = vec![None];
        expected.extend(identity_run().into_iter().map(Some));
        let run = crate::durable::crash_loop::RecordRun {
            dir: &cluster,
            file_name: IDENTITY_FILE,
            steps: &identity_run(),
            expected: &expected,
            again: (local("c"), Some(local("c"))),
        };
        // A torn identity is moved aside as damaged and read as none: the helper finds the
        // moved file in cluster/ and fails.
        crate::durable::crash_loop::crash_at_every_operation(
            &run,
            fresh,
            |fs, identity| write_local(fs, &cluster, &path, identity),
            |fs| read_local(fs, &path),
        );
    }
}
