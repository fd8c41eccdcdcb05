//! Where a new partition lives: the pure placement rule of cluster mode.
//!
//! - **Pinned**: the operator (or a test) names the node of each new partition; every named
//!   node must be live, so a typo does not create a partition nobody serves.
//! - **Spread**: otherwise partitions go round the live nodes that are not cordoned (being
//!   drained) in id order, starting at a node
//!   picked from the topic's name, so many small topics do not all start on the first node.
//! - **Away from linked partitions**: partition `p` of a topic linked to others with its own
//!   partition count (its parents, its children) is placed on a node that owns partition `p`
//!   of none of them, whenever a live node is left: a keyless copy (the parent's index kept)
//!   then never shares a disk with its original. This holds when a child is created by its
//!   attach, when a linked topic grows ([`linked_owners`]), and for a move or a re-creation
//!   without a named node ([`linked_nodes`]).
//!
//! Ownership starts at generation 1; moves raise it.

use crate::metastore::PartitionOwner;

/// Why no placement could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum PlacementError {
    /// No node is live to take the partitions.
    #[error("no live node to place partitions on; is any `narad serve` of this cluster running?")]
    NoLiveNodes,
    /// Every live node is cordoned (being drained): a spread placement has nowhere to go.
    #[error(
        "every live node is cordoned ({}); uncordon one with `narad node uncordon ID`, or pin \
         the placement",
        cordoned.join(", ")
    )]
    AllCordoned {
        /// The cordoned live nodes.
        cordoned: Vec<String>,
    },
    /// A pinned placement names a node that is not live.
    #[error("placement names node {node:?}, which is not live (live: {})", live.join(", "))]
    UnknownNode {
        /// The node named.
        node: String,
        /// The live nodes.
        live: Vec<String>,
    },
    /// A pinned placement does not name one node per new partition.
    #[error("placement names {given} nodes for {wanted} new partitions; name one per partition")]
    WrongLength {
        /// Nodes named.
        given: usize,
        /// New partitions.
        wanted: u32,
    },
}

/// What to place: partitions `first..first + count` of `topic`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// The topic's name (seeds the spread).
    pub topic: &'a str,
    /// The first new partition's index (0 for a new topic).
    pub first: u32,
    /// How many new partitions.
    pub count: u32,
    /// The nodes that may take them.
    pub live: &'a [String],
    /// Nodes being drained: a pinned placement may name them, a spread one skips them.
    pub cordoned: &'a [String],
    /// The operator's choice, one node per new partition.
    pub pinned: Option<&'a [String]>,
    /// The owners of the partitions of each linked topic with the same partition count:
    /// partition `p` avoids every node that owns partition `p` of one of them.
    pub(crate) away_from: &'a [&'a [PartitionOwner]],
}

/// The owners of the new partitions, in order.
pub(crate) fn place(request: Request<'_>) -> Result<Vec<PartitionOwner>, PlacementError> {
    let mut live: Vec<&String> = request.live.iter().collect();
    live.sort();
    live.dedup();
    if let Some(pinned) = request.pinned {
        if pinned.len() != request.count as usize {
            return Err(PlacementError::WrongLength {
                given: pinned.len(),
                wanted: request.count,
            });
        }
        return pinned
            .iter()
            .map(|node| {
                if live.contains(&node) {
                    Ok(PartitionOwner::first(node.clone()))
                } else {
                    Err(PlacementError::UnknownNode {
                        node: node.clone(),
                        live: live.iter().map(|n| (*n).clone()).collect(),
                    })
                }
            })
            .collect();
    }
    if live.is_empty() {
        return Err(PlacementError::NoLiveNodes);
    }
    let before = live.clone();
    live.retain(|n| !request.cordoned.contains(n));
    if live.is_empty() {
        return Err(PlacementError::AllCordoned {
            cordoned: before.into_iter().cloned().collect(),
        });
    }
    let n = live.len();
    let start = seed(request.topic) % n;
    let owners = (request.first..request.first + request.count)
        .map(|p| {
            let slot = (start + p as usize) % n;
            let avoid: Vec<&str> = request
                .away_from
                .iter()
                .filter_map(|owners| owners.get(p as usize))
                .map(|o| o.node.as_str())
                .collect();
            // The next node round from the spread's choice that none of them uses; the
            // spread's own when every live node is one of them.
            let slot = (0..n)
                .map(|step| (slot + step) % n)
                .find(|&s| !avoid.contains(&live[s].as_str()))
                .unwrap_or(slot);
            PartitionOwner::first(live[slot].clone())
        })
        .collect();
    Ok(owners)
}

/// The owners of every topic linked to `topic` (its local parents and children) that has
/// `partitions` partitions, as [`Request::away_from`] takes them.
pub(crate) fn linked_owners<'s>(
    snapshot: &'s crate::metastore::Snapshot,
    topic: &str,
    partitions: u32,
) -> Vec<&'s [PartitionOwner]> {
    snapshot
        .links
        .iter()
        .filter(|(_, link)| link.remote.is_none())
        .filter_map(|((parent, child), _)| {
            if parent == topic {
                Some(child)
            } else if child == topic {
                Some(parent)
            } else {
                None
            }
        })
        .filter(|other| other.as_str() != topic)
        .filter_map(|other| snapshot.topics.get(other.as_str()))
        .filter(|other| other.partitions == partitions)
        .map(|other| other.owners.as_slice())
        .collect()
}

/// The topics linked to `topic` with its partition count whose partition `partition` is on
/// `node`: what a move or re-creation of `topic`'s partition `partition` onto a node the
/// operator named puts on one disk with its copy or original (the answer says so).
pub(crate) fn linked_on_node(
    snapshot: &crate::metastore::Snapshot,
    topic: &str,
    partition: u32,
    node: &str,
) -> Vec<String> {
    let Some(partitions) = snapshot.topics.get(topic).map(|t| t.partitions) else {
        return Vec::new();
    };
    let mut names: Vec<String> = snapshot
        .topics
        .values()
        .filter(|other| other.name != topic && other.partitions == partitions)
        .filter(|other| {
            snapshot.links.iter().any(|((parent, child), link)| {
                link.remote.is_none()
                    && ((parent == topic && *child == other.name)
                        || (child == topic && *parent == other.name))
            })
        })
        .filter(|other| {
            other
                .owners
                .get(partition as usize)
                .is_some_and(|o| o.node == node)
        })
        .map(|other| other.name.clone())
        .collect();
    names.sort();
    names
}

/// The nodes that own partition `partition` of a topic linked to `topic` with its partition
/// count: where a move or re-creation of `topic`'s partition `partition` should not go.
pub(crate) fn linked_nodes(
    snapshot: &crate::metastore::Snapshot,
    topic: &str,
    partition: u32,
) -> Vec<String> {
    let Some(partitions) = snapshot.topics.get(topic).map(|t| t.partitions) else {
        return Vec::new();
    };
    linked_owners(snapshot, topic, partitions)
        .into_iter()
        .filter_map(|owners| owners.get(partition as usize))
        .map(|o| o.node.clone())
        .collect()
}

/// FNV-1a of the name: stable across builds and platforms, so a placement is reproducible.
fn seed(name: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    usize::try_from(hash % (u32::MAX as u64)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    fn request<'a>(topic: &'a str, count: u32, live: &'a [String]) -> Request<'a> {
        Request {
            topic,
            first: 0,
            count,
            live,
            cordoned: &[],
            pinned: None,
            away_from: &[],
        }
    }

    fn on(owners: &[PartitionOwner]) -> Vec<&str> {
        owners.iter().map(|o| o.node.as_str()).collect()
    }

    #[test]
    fn partitions_spread_evenly_over_the_live_nodes() {
        let live = nodes(&["n3", "n1", "n2"]);
        let owners = place(request("orders", 6, &live)).unwrap();
        for node in ["n1", "n2", "n3"] {
            assert_eq!(on(&owners).iter().filter(|n| **n == node).count(), 2);
        }
        assert!(owners.iter().all(|o| o.generation == 1));
    }

    #[test]
    fn a_child_partition_never_shares_a_node_with_the_same_parent_partition() {
        let live = nodes(&["n1", "n2", "n3"]);
        for count in 1..=7 {
            for parent in ["orders", "a", "bb", "payments-eu"] {
                let parent_owners = place(request(parent, count, &live)).unwrap();
                for child in ["audit", "x", "orders-copy", "c9"] {
                    let child_owners = place(Request {
                        away_from: &[&parent_owners],
                        ..request(child, count, &live)
                    })
                    .unwrap();
                    for (p, (c, o)) in child_owners.iter().zip(&parent_owners).enumerate() {
                        assert_ne!(c.node, o.node, "{parent}->{child} partition {p}");
                    }
                }
            }
        }
    }

    fn topic(name: &str, owners: &[&str]) -> crate::metastore::TopicMeta {
        crate::metastore::TopicMeta {
            writable_as_child: false,
            name: name.to_owned(),
            partitions: u32::try_from(owners.len()).unwrap(),
            retention_ms: None,
            retention_bytes: None,
            created_at_ms: 0,
            owners: owners.iter().map(|n| PartitionOwner::first(*n)).collect(),
        }
    }

    fn linked(topics: &[crate::metastore::TopicMeta], links: &[(&str, &str)]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for t in topics {
            snapshot.topics.insert(t.name.clone(), t.clone());
        }
        for (parent, child) in links {
            let link: crate::metastore::LinkMeta = serde_json::from_value(serde_json::json!({
                "parent": parent, "child": child, "attach_epoch": "0011223344556677",
                "attach_offsets": null, "delay_ms": 0, "router": [], "attached_at_ms": 0,
            }))
            .unwrap();
            snapshot
                .links
                .insert(((*parent).to_owned(), (*child).to_owned()), link);
        }
        snapshot
    }

    use crate::metastore::Snapshot;

    #[test]
    fn a_grown_partition_avoids_the_same_partition_of_its_parent_and_of_its_child() {
        // mid is a child of top and a parent of low; all three grow from 2 to 3 partitions,
        // top and low first. mid's new partition 2 must avoid n1 (top's) and n2 (low's).
        let snapshot = linked(
            &[
                topic("top", &["n1", "n2", "n1"]),
                topic("mid", &["n2", "n3"]),
                topic("low", &["n3", "n1", "n2"]),
                topic("other", &["n3", "n3", "n3"]),
            ],
            &[("top", "mid"), ("mid", "low")],
        );
        let away = linked_owners(&snapshot, "mid", 3);
        assert_eq!(away.len(), 2, "top and low, not the unlinked topic");
        let live = nodes(&["n1", "n2", "n3"]);
        for name in ["mid", "m", "zz", "orders"] {
            let owners = place(Request {
                first: 2,
                count: 1,
                away_from: &away,
                ..request(name, 1, &live)
            })
            .unwrap();
            assert_eq!(on(&owners), ["n3"], "{name}");
        }
        // Linked topics with another partition count do not constrain it.
        assert!(linked_owners(&snapshot, "mid", 4).is_empty());
        // Once mid has grown, a move of low's or top's partition 1 avoids mid's partition 1.
        let mut grown = snapshot.clone();
        grown
            .topics
            .insert("mid".to_owned(), topic("mid", &["n2", "n3", "n3"]));
        assert_eq!(linked_nodes(&grown, "low", 1), ["n3"]);
        assert_eq!(linked_nodes(&grown, "top", 1), ["n3"]);
        assert_eq!(
            linked_nodes(&grown, "mid", 0),
            ["n3", "n1"],
            "low's, then top's"
        );
        assert_eq!(linked_nodes(&grown, "other", 0), Vec::<String>::new());
    }

    #[test]
    fn a_named_node_holding_the_same_partition_of_a_linked_topic_is_named() {
        let snapshot = linked(
            &[
                topic("mid", &["n1", "n2"]),
                topic("top", &["n2", "n2"]),
                topic("low", &["n3", "n2"]),
                topic("other", &["n2", "n2"]),
            ],
            &[("top", "mid"), ("mid", "low")],
        );
        // Partition 1 onto n2: both linked topics have theirs there; the unlinked one does not
        // count.
        assert_eq!(linked_on_node(&snapshot, "mid", 1, "n2"), ["low", "top"]);
        assert_eq!(linked_on_node(&snapshot, "mid", 0, "n2"), ["top"]);
        assert!(linked_on_node(&snapshot, "mid", 0, "n1").is_empty());
    }

    #[test]
    fn when_every_node_owns_a_linked_partition_the_spread_picks_as_without_links() {
        let live = nodes(&["n1", "n2"]);
        let a = place(request("a", 2, &live)).unwrap();
        let b: Vec<PartitionOwner> = a
            .iter()
            .map(|o| PartitionOwner::first(if o.node == "n1" { "n2" } else { "n1" }))
            .collect();
        let unconstrained = place(request("c", 2, &live)).unwrap();
        let constrained = place(Request {
            away_from: &[&a, &b],
            ..request("c", 2, &live)
        })
        .unwrap();
        assert_eq!(on(&constrained), on(&unconstrained));
    }

    #[test]
    fn with_one_live_node_a_child_still_gets_placed_on_it() {
        let live = nodes(&["n1"]);
        let parent = place(request("p", 2, &live)).unwrap();
        let child = place(Request {
            away_from: &[&parent],
            ..request("c", 2, &live)
        })
        .unwrap();
        assert_eq!(on(&child), ["n1", "n1"]);
    }

    #[test]
    fn a_pinned_placement_is_taken_as_given_and_must_name_live_nodes_one_per_partition() {
        let live = nodes(&["n1", "n2"]);
        let pinned = nodes(&["n2", "n2", "n1"]);
        let owners = place(Request {
            pinned: Some(&pinned),
            ..request("t", 3, &live)
        })
        .unwrap();
        assert_eq!(on(&owners), ["n2", "n2", "n1"]);
        let typo = nodes(&["n2", "m1", "n1"]);
        assert!(matches!(
            place(Request { pinned: Some(&typo), ..request("t", 3, &live) }),
            Err(PlacementError::UnknownNode { node, .. }) if node == "m1"
        ));
        assert!(matches!(
            place(Request {
                pinned: Some(&pinned),
                ..request("t", 2, &live)
            }),
            Err(PlacementError::WrongLength {
                given: 3,
                wanted: 2
            })
        ));
    }

    #[test]
    fn growing_places_only_the_new_partitions_continuing_the_round() {
        let live = nodes(&["n1", "n2", "n3"]);
        let all = place(request("t", 5, &live)).unwrap();
        let grown = place(Request {
            first: 3,
            count: 2,
            ..request("t", 0, &live)
        })
        .unwrap();
        assert_eq!(grown, all[3..]);
    }

    #[test]
    fn no_live_node_is_an_error_not_an_empty_placement() {
        assert_eq!(
            place(request("t", 1, &[])),
            Err(PlacementError::NoLiveNodes)
        );
    }

    #[test]
    fn a_spread_skips_cordoned_nodes_but_a_pin_may_name_them() {
        let live = nodes(&["n1", "n2", "n3"]);
        let cordoned = nodes(&["n2"]);
        let owners = place(Request {
            cordoned: &cordoned,
            ..request("orders", 6, &live)
        })
        .unwrap();
        assert!(!on(&owners).contains(&"n2"), "{owners:?}");
        assert!(on(&owners).contains(&"n1") && on(&owners).contains(&"n3"));
        let pinned = nodes(&["n2"]);
        let owners = place(Request {
            cordoned: &cordoned,
            pinned: Some(&pinned),
            ..request("orders", 1, &live)
        })
        .unwrap();
        assert_eq!(on(&owners), ["n2"]);
        let all = nodes(&["n1", "n2", "n3"]);
        let error = place(Request {
            cordoned: &all,
            ..request("orders", 1, &live)
        })
        .unwrap_err();
        assert!(
            matches!(error, PlacementError::AllCordoned { .. }),
            "{error}"
        );
    }
}
