//! Partition ownership in cluster mode: who serves a partition is what the shared metadata
//! says (each topic's `owners`), read from this node's watched copy.
//!
//! Answers are only as fresh as the copy: a partition that just moved may still be reported
//! at its old owner for a round trip. That is safe because the old owner refuses writes while a
//! move is fenced and a commit names the generation it saw; where staleness would not be safe
//! (anchoring, deleting a cursor file) callers use a linearizable `confirm` instead.
//!
//! A partition without an owner (a topic created before cluster mode, or a metadata copy that
//! cannot be read) has none: nobody serves it, and requests get an error naming that, rather
//! than this node guessing that it is the owner.

use std::sync::Arc;

use narad_storage::PartitionId;

use super::receiver::ParentSeen;
use crate::metastore::{EtcdMetastore, PartitionOwner};
use crate::ownership::{NodeId, PartitionOwnership};

/// Ownership read from the cluster's metadata.
pub struct ClusterOwnership {
    node: NodeId,
    metastore: Arc<EtcdMetastore>,
}

impl ClusterOwnership {
    /// Ownership as `node` sees it through `metastore` (which must have a watched copy:
    /// [`EtcdMetastore::with_cache`]).
    pub fn new(node: NodeId, metastore: Arc<EtcdMetastore>) -> ClusterOwnership {
        ClusterOwnership { node, metastore }
    }
}

impl ClusterOwnership {
    /// The owner of `partition` with its generation (what a commit receiver fences on).
    pub(crate) fn owner_at(&self, partition: &PartitionId) -> Option<PartitionOwner> {
        let snapshot = match self.metastore.cached_snapshot()? {
            Ok(snapshot) => snapshot,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read partition owners from the metadata copy");
                return None;
            }
        };
        let topic = snapshot.topics.get(&partition.topic)?;
        topic.owners.get(partition.partition as usize).cloned()
    }

    /// The parent partition of records copied into `child` under attach `epoch` from parent
    /// partition `parent_partition`, with its owner: what a commit's sender and receiver
    /// check that the sender still owns.
    pub(crate) fn parent_of(
        &self,
        child: &str,
        epoch: [u8; 8],
        parent_partition: u32,
    ) -> ParentSeen {
        let snapshot = match self.metastore.cached_snapshot() {
            Some(Ok(snapshot)) => snapshot,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot read links from the metadata copy");
                return ParentSeen::UnknownLink;
            }
            None => return ParentSeen::UnknownLink,
        };
        let epoch = hex::encode(epoch);
        let Some(link) = snapshot
            .links
            .values()
            // The link's child, or its dead-letter topic: a letter carries the origin a copy
            // would, and is fenced and deduplicated as a copy is.
            .find(|l| {
                (l.child == child || l.dead_letter.as_deref() == Some(child))
                    && l.attach_epoch == epoch
            })
        else {
            return ParentSeen::UnknownLink;
        };
        let owner = snapshot
            .topics
            .get(&link.parent)
            .and_then(|t| t.owners.get(parent_partition as usize).cloned());
        ParentSeen::Partition {
            parent: PartitionId::new(link.parent.clone(), parent_partition),
            owner,
        }
    }
}

impl PartitionOwnership for ClusterOwnership {
    fn local_node(&self) -> &NodeId {
        &self.node
    }

    fn owner(&self, partition: &PartitionId) -> Option<NodeId> {
        self.owner_at(partition).map(|owner| NodeId(owner.node))
    }

    fn is_moving(&self, partition: &PartitionId) -> bool {
        self.owner_at(partition)
            .is_some_and(|owner| owner.moving_to.is_some())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metastore::cache::CacheTiming;
    use crate::metastore::etcd::connect_client;
    use crate::metastore::test_etcd::TestEtcd;
    use crate::metastore::{Metastore, TopicMeta};

    async fn node_view(
        etcd: &TestEtcd,
        id: &str,
    ) -> (ClusterOwnership, crate::shutdown::ShutdownTrigger) {
        let (trigger, signal) = crate::shutdown::channel();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let metastore = EtcdMetastore::with_cache(
            client,
            "/narad-test/owners/".to_owned(),
            CacheTiming::default(),
            signal,
        )
        .await
        .unwrap();
        (
            ClusterOwnership::new(NodeId(id.to_owned()), Arc::new(metastore)),
            trigger,
        )
    }

    #[tokio::test]
    async fn each_node_sees_the_partitions_the_metadata_gives_it_and_no_others() {
        let etcd = TestEtcd::start();
        let (n1, _t1) = node_view(&etcd, "n1").await;
        let (n2, _t2) = node_view(&etcd, "n2").await;
        n1.metastore
            .create_topic(TopicMeta {
                writable_as_child: false,
                name: "orders".to_owned(),
                partitions: 3,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: 0,
                owners: ["n1", "n2", "n1"]
                    .into_iter()
                    .map(PartitionOwner::first)
                    .collect(),
            })
            .await
            .unwrap();
        let id = |p| PartitionId::new("orders".to_owned(), p);
        // n2 learns of the topic through its watch.
        tokio::time::timeout(Duration::from_secs(10), async {
            while n2.owner(&id(0)).is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the topic reaches the other node's copy");
        for (p, owner) in [(0, "n1"), (1, "n2"), (2, "n1")] {
            assert_eq!(n1.owner(&id(p)), Some(NodeId(owner.to_owned())));
            assert_eq!(n2.owner(&id(p)), Some(NodeId(owner.to_owned())));
            assert_eq!(n1.is_local(&id(p)), owner == "n1");
            assert_eq!(n2.is_local(&id(p)), owner == "n2");
        }
        // Past the partition count, or an unknown topic: nobody, not "this node".
        assert_eq!(n1.owner(&id(3)), None);
        assert!(!n1.is_local(&PartitionId::new("nope".to_owned(), 0)));
    }

    #[tokio::test]
    async fn a_topic_without_owners_is_served_by_no_node_in_cluster_mode() {
        let etcd = TestEtcd::start();
        let (n1, _t1) = node_view(&etcd, "n1").await;
        n1.metastore
            .create_topic(TopicMeta {
                writable_as_child: false,
                name: "legacy".to_owned(),
                partitions: 1,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: 0,
                owners: Vec::new(),
            })
            .await
            .unwrap();
        let id = PartitionId::new("legacy".to_owned(), 0);
        assert_eq!(n1.owner(&id), None);
        assert!(!n1.is_local(&id));
    }
}
