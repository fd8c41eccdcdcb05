//! Cluster mode: the partitions this node serves are the ones the shared metadata says it
//! owns, and only those are registered with the local store.
//!
//! A topic is created by writing its metadata (with each partition's owner) to etcd; no node
//! makes directories for another. Each owner registers its own partitions when its watched
//! copy shows them ([`register_owned`], run at start and after every change of the copy), so
//! the metadata is always ahead of the disk: a crash between the two leaves a partition
//! recorded and not yet made, which the next pass makes. Nothing here deletes: a directory the
//! metadata no longer names is left where it is and reported ([`unaccounted`]).

use std::collections::BTreeSet;

use narad_storage::{PartitionId, StorageError, Store};

use super::log_config;
use crate::metastore::{PartitionOwner, Snapshot};

/// Registers with `store` every partition `node` owns in `snapshot` that it does not hold yet
/// (making its directory), and updates the retention of those it holds. Returns how many were
/// new.
pub(crate) fn register_owned(
    store: &Store,
    snapshot: &Snapshot,
    node: &str,
    segment_bytes: u64,
) -> Result<usize, StorageError> {
    let mut new = 0;
    for topic in snapshot.topics.values() {
        let config = log_config(topic, segment_bytes);
        for (p, owner) in topic.owners.iter().enumerate() {
            if owner.node != node {
                continue;
            }
            let Ok(p) = u32::try_from(p) else { break };
            let id = PartitionId::new(topic.name.clone(), p);
            if store.has_partition(&id) {
                // Registered already: only its settings may have changed. No `stat` of its
                // directory: this runs for every owned partition at every metadata change
                // (80,000 a node at 20,000 topics), and a registered partition whose directory
                // went missing is for its reads and appends to find, not to be made again.
                store.set_config(&id, config.clone())?;
                continue;
            }
            store.create_partition(&id, config.clone())?;
            new += 1;
            // Marked for a move (this node restarted part way through one): it must take no
            // write before the move ends or is cancelled, so it starts sealed.
            if owner.moving_to.is_some()
                && let Err(e) = store.seal(&id)
            {
                tracing::warn!(partition = %id, error = %e,
                    "a partition marked for a move could not be sealed");
            }
        }
    }
    Ok(new)
}

/// What to do with the partitions this node holds sealed for a move, given the metadata.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SealedPlan {
    /// Still owned here with no move marked (the move was cancelled): serve them again.
    pub(crate) unseal: Vec<PartitionId>,
    /// Owned by another node now (the move finished): delete this copy once a linearizable
    /// read agrees.
    pub release: Vec<PartitionId>,
}

/// Sorts `sealed` by what `snapshot` says of each (a partition still marked moving is left
/// as it is; one whose topic is gone is left to [`set_aside_unnamed`]).
pub(crate) fn plan_sealed(sealed: &[PartitionId], snapshot: &Snapshot, node: &str) -> SealedPlan {
    let mut plan = SealedPlan::default();
    for id in sealed {
        let Some(topic) = snapshot.topics.get(&id.topic) else {
            continue;
        };
        let Some(owner) = topic.owners.get(id.partition as usize) else {
            continue;
        };
        if owner.node != node {
            plan.release.push(id.clone());
        } else if owner.moving_to.is_none() {
            plan.unseal.push(id.clone());
        }
    }
    plan
}

/// The owner record `snapshot` has for partition `id`, if its topic has that partition.
fn owner_in<'s>(snapshot: &'s Snapshot, id: &PartitionId) -> Option<&'s PartitionOwner> {
    snapshot
        .topics
        .get(&id.topic)
        .and_then(|t| t.owners.get(id.partition as usize))
}

/// Of the partitions this node has registered and not sealed (`registered`, `sealed`), those
/// `snapshot` gives to this node marked for a move: they are sealed at once, so a partition
/// marked moving takes no write whether or not its new owner got as far as the hand-off (it
/// may have died right after marking it). A cancelled move unseals it ([`plan_sealed`]).
pub(crate) fn plan_marked(
    registered: &[PartitionId],
    sealed: &[PartitionId],
    snapshot: &Snapshot,
    node: &str,
) -> Vec<PartitionId> {
    unsealed_where(registered, sealed, snapshot, |o| {
        o.node == node && o.moving_to.is_some()
    })
}

/// Of the partitions this node has registered and not sealed (`registered`, `sealed`), those
/// `snapshot` gives to another node with no move to this one under way: re-created elsewhere
/// while this node was cut off (`narad partition recreate`). This node must serve nothing of
/// them; their directories are set aside, never deleted.
pub(crate) fn plan_disowned(
    registered: &[PartitionId],
    sealed: &[PartitionId],
    snapshot: &Snapshot,
    node: &str,
) -> Vec<PartitionId> {
    unsealed_where(registered, sealed, snapshot, |o| {
        o.node != node && o.moving_to.as_deref() != Some(node)
    })
}

/// The partitions of `registered` not in `sealed` whose owner record in `snapshot` is one
/// `keep` takes (a partition the snapshot does not name is left out).
fn unsealed_where(
    registered: &[PartitionId],
    sealed: &[PartitionId],
    snapshot: &Snapshot,
    keep: impl Fn(&PartitionOwner) -> bool,
) -> Vec<PartitionId> {
    registered
        .iter()
        .filter(|id| !sealed.contains(id))
        .filter(|id| owner_in(snapshot, id).is_some_and(&keep))
        .cloned()
        .collect()
}

/// Sets aside (never deletes) every topic this node has registered that `snapshot` no longer
/// names: deleted through another node, or gone from the metadata some other way. Its
/// partitions are unregistered first, so nothing reads or writes them; the directory then
/// moves, whole, to the set-aside area, so a topic created again under the name starts empty
/// instead of finding the old records. Returns the topics set aside.
pub(crate) fn set_aside_unnamed(
    store: &Store,
    snapshot: &Snapshot,
    now_ms: i64,
) -> Result<Vec<String>, super::set_aside::SetAsideError> {
    let mut moved = Vec::new();
    for topic in store.registered_topics() {
        if snapshot.topics.contains_key(&topic) {
            continue;
        }
        store.forget_topic(&topic);
        let dir = store
            .data_dir()
            .join(narad_storage::store::TOPICS_DIR_NAME)
            .join(&topic);
        if dir.exists() {
            super::set_aside::set_aside(
                store.data_dir(),
                &dir,
                &topic,
                None,
                "the cluster metadata no longer names this topic (deleted through another node?); \
                 kept here untouched: adopt or purge it with `narad admin set-aside`",
                now_ms,
            )?;
        }
        moved.push(topic);
    }
    Ok(moved)
}

/// The partitions `snapshot` gives to `node`.
pub(crate) fn owned_by<'a>(
    snapshot: &'a Snapshot,
    node: &'a str,
) -> impl Iterator<Item = PartitionId> + 'a {
    snapshot.topics.values().flat_map(move |t| {
        t.owners
            .iter()
            .enumerate()
            .filter(move |(_, o)| o.node == node)
            .filter_map(|(p, _)| u32::try_from(p).ok())
            .map(|p| PartitionId::new(t.name.clone(), p))
    })
}

/// Partition directories under `topics/` that `node` does not own in `snapshot`: topics the
/// metadata does not name, and partitions owned by another node. Their data stays on disk; an
/// operator decides (they may be what is left of a move, or of a metadata prefix that was lost).
pub(crate) fn unaccounted(
    data_dir: &std::path::Path,
    snapshot: &Snapshot,
    node: &str,
) -> std::io::Result<Vec<String>> {
    let owned: BTreeSet<(String, String)> = owned_by(snapshot, node)
        .map(|id| {
            let dir = id.dir_name();
            (id.topic, dir)
        })
        .collect();
    let topics_dir = data_dir.join(narad_storage::store::TOPICS_DIR_NAME);
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(&topics_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e),
    };
    for topic in entries {
        let topic = topic?;
        if !topic.file_type()?.is_dir() {
            continue;
        }
        let name = topic.file_name().to_string_lossy().into_owned();
        for partition in std::fs::read_dir(topic.path())? {
            let partition = partition?;
            if !partition.file_type()?.is_dir() {
                continue;
            }
            let dir = partition.file_name().to_string_lossy().into_owned();
            if !owned.contains(&(name.clone(), dir.clone())) {
                found.push(format!("{name}/{dir}"));
            }
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::{PartitionOwner, TopicMeta};

    fn snapshot(owners: Vec<PartitionOwner>) -> Snapshot {
        let mut snapshot = Snapshot::default();
        let topic = TopicMeta {
            writable_as_child: false,
            name: "orders".to_owned(),
            partitions: u32::try_from(owners.len()).unwrap(),
            retention_ms: None,
            retention_bytes: None,
            created_at_ms: 0,
            owners,
        };
        snapshot.topics.insert("orders".to_owned(), topic);
        snapshot
    }

    #[test]
    fn partitions_already_registered_are_not_made_again_when_the_metadata_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), narad_storage::StoreOptions::default()).unwrap();
        let snapshot = snapshot(vec![
            PartitionOwner::first("n1"),
            PartitionOwner::first("n2"),
        ]);
        assert_eq!(register_owned(&store, &snapshot, "n1", 1 << 20).unwrap(), 1);
        let p0 = dir.path().join("topics/orders/p00000");
        assert!(p0.is_dir());
        assert!(!dir.path().join("topics/orders/p00001").exists(), "n2's");

        // Its directory goes missing behind the store's back: the next pass (every change of
        // the metadata) registers nothing new and makes no empty directory in its place.
        std::fs::remove_dir_all(&p0).unwrap();
        assert_eq!(register_owned(&store, &snapshot, "n1", 1 << 20).unwrap(), 0);
        assert!(!p0.exists(), "made again, empty");
        assert!(store.has_partition(&PartitionId::new("orders", 0)));
    }

    #[test]
    fn only_unsealed_partitions_given_to_another_node_with_no_move_here_are_disowned() {
        let moving_here = PartitionOwner {
            moving_to: Some("n1".to_owned()),
            ..PartitionOwner::first("n2")
        };
        let snapshot = snapshot(vec![
            PartitionOwner::first("n1"),
            PartitionOwner::first("n2"),
            moving_here,
            PartitionOwner::first("n3"),
        ]);
        let ids: Vec<PartitionId> = (0..5).map(|p| PartitionId::new("orders", p)).collect();
        let sealed = vec![ids[3].clone()];
        // 0 is ours; 1 was re-created on n2; 2 is moving here; 3 is sealed for a finished
        // move (released elsewhere); 4 is not in the metadata (left to the topic pass).
        assert_eq!(
            plan_disowned(&ids, &sealed, &snapshot, "n1"),
            vec![ids[1].clone()]
        );
    }

    #[test]
    fn only_unsealed_partitions_of_this_node_marked_for_a_move_are_sealed_on_sight() {
        let marked = PartitionOwner {
            moving_to: Some("n2".to_owned()),
            ..PartitionOwner::first("n1")
        };
        let moving_here = PartitionOwner {
            moving_to: Some("n1".to_owned()),
            ..PartitionOwner::first("n2")
        };
        let snapshot = snapshot(vec![
            PartitionOwner::first("n1"),
            marked.clone(),
            marked,
            moving_here,
        ]);
        let ids: Vec<PartitionId> = (0..4).map(|p| PartitionId::new("orders", p)).collect();
        let sealed = vec![ids[2].clone()];
        // 0 is ours, not moving; 1 is ours and marked; 2 is marked and sealed already (the
        // hand-off came first); 3 is moving here from n2 (not ours to seal).
        assert_eq!(
            plan_marked(&ids, &sealed, &snapshot, "n1"),
            vec![ids[1].clone()]
        );
    }
}
