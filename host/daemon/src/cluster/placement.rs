//! Where a new partition lives: the pure placement rule of cluster mode.
//!
//! - **Pinned**: the operator (or a test) names the node of each new partition; every named
//!   node must be live, so a typo does not create a partition nobody serves.
//! - **Spread**: otherwise partitions go round the live nodes that are not cordoned (being
//!   drained) in id order, starting at a node
//!   picked from the topic's name, so many small topics do not all start on the first node.
//! - **Away from the parent**: for a child with its parent's partition count, child partition
//!   `p` is placed on another node than parent partition `p` whenever there are two live nodes:
//!   a keyless copy (the parent's index kept) then never shares a disk with its original.
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
    /// The owners of the parent's partitions, for a child with the parent's partition count.
    pub(crate) away_from: Option<&'a [PartitionOwner]>,
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
            let mut slot = (start + p as usize) % n;
            let parent_node = request
                .away_from
                .and_then(|owners| owners.get(p as usize))
                .map(|o| o.node.as_str());
            if n > 1 && parent_node == Some(live[slot].as_str()) {
                slot = (slot + 1) % n;
            }
            PartitionOwner::first(live[slot].clone())
        })
        .collect();
    Ok(owners)
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
            away_from: None,
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
                        away_from: Some(&parent_owners),
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

    #[test]
    fn with_one_live_node_a_child_still_gets_placed_on_it() {
        let live = nodes(&["n1"]);
        let parent = place(request("p", 2, &live)).unwrap();
        let child = place(Request {
            away_from: Some(&parent),
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
