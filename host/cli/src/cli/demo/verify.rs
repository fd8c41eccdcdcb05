//! The demo's checks, as pure functions over fetched records: the parent holds every
//! acknowledged record where the produce answer said; each child holds every parent record
//! from its attach point on (duplicates allowed: delivery is at least once), keeps per-key
//! order, and puts each record where its router chain must.

use std::collections::{HashMap, HashSet};

use narad_host::api::types::RecordJson;

/// Prefix of every demo record's value; the rest is the record's sequence number, which
/// identifies a record in the parent and in every child.
pub const VALUE_PREFIX: &str = "order-";

/// Name of the header the `by-region` child routes by.
pub const REGION_HEADER: &str = "region";

/// One fetched record, reduced to what the checks need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Partition it was fetched from.
    pub partition: u32,
    /// Its offset there.
    pub offset: u64,
    /// The sequence number in its value, `None` when the value is not a demo record's.
    pub id: Option<u64>,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// The value of its first `region` header.
    pub region: Option<String>,
}

impl Record {
    /// Reduces a fetched record of `partition`.
    pub fn from_json(partition: u32, r: &RecordJson) -> Record {
        Record {
            partition,
            offset: r.offset,
            id: r
                .value
                .as_deref()
                .and_then(|v| v.strip_prefix(VALUE_PREFIX))
                .and_then(|n| n.parse().ok()),
            key: r.key_bytes().ok().flatten(),
            region: r
                .headers
                .iter()
                .find(|h| h.name == REGION_HEADER)
                .and_then(|h| h.value.clone()),
        }
    }
}

/// The `header-route` table of a child: header value to child partition, and the partition
/// for any other value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionMap {
    /// `(value, partition)` pairs.
    pub map: Vec<(String, u32)>,
    /// Partition of any other value (`* = N`).
    pub fallback: Option<u32>,
}

impl RegionMap {
    fn partition(&self, region: &str) -> Option<u32> {
        self.map
            .iter()
            .find(|(v, _)| v == region)
            .map(|(_, p)| *p)
            .or(self.fallback)
    }
}

/// Where a child's router chain must put records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expectation {
    /// The parent's partition count.
    pub parent_partitions: u32,
    /// The child's partition count.
    pub child_partitions: u32,
    /// The `header-route` table when the chain starts with it.
    pub regions: Option<RegionMap>,
}

impl Expectation {
    /// The one partition `r` may land in, or `None` when any is right (round-robin).
    pub fn partition_of(&self, r: &Record) -> Option<u32> {
        if let (Some(map), Some(region)) = (&self.regions, &r.region)
            && let Some(p) = map.partition(region)
        {
            return Some(p);
        }
        match &r.key {
            Some(key) => narad_abi::partition_for_key(key, self.child_partitions),
            // keyless-index: same partition count, same index.
            None if self.child_partitions == self.parent_partitions => Some(r.partition),
            None => None,
        }
    }
}

/// What the check of one child found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChildVerdict {
    /// Parent records the child must hold.
    pub expected: u64,
    /// Records in the child.
    pub copies: u64,
    /// Copies beyond the first of a record (allowed: at-least-once delivery).
    pub duplicates: u64,
    /// Parent records not in the child.
    pub missing: u64,
    /// Child records that are no parent record.
    pub unknown: u64,
    /// Copies in a partition other than the one their router must choose.
    pub misplaced: u64,
    /// First copies that came before an earlier record of the same key.
    pub order_breaks: u64,
    /// The first problem found, for the verdict line.
    pub first_problem: Option<String>,
}

impl ChildVerdict {
    /// No record missing, unknown, misplaced or out of order.
    pub fn ok(&self) -> bool {
        self.missing == 0 && self.unknown == 0 && self.misplaced == 0 && self.order_breaks == 0
    }

    fn problem(&mut self, text: impl FnOnce() -> String) {
        if self.first_problem.is_none() {
            self.first_problem = Some(text());
        }
    }
}

/// Checks `child` (every record of the child topic) against `parent` (the parent's records
/// from the attach point on).
pub fn check_child(parent: &[Record], child: &[Record], expect: &Expectation) -> ChildVerdict {
    let by_id: HashMap<u64, &Record> = parent
        .iter()
        .filter_map(|r| r.id.map(|id| (id, r)))
        .collect();
    let mut verdict = ChildVerdict {
        expected: by_id.len() as u64,
        copies: child.len() as u64,
        ..ChildVerdict::default()
    };
    let mut sorted: Vec<&Record> = child.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut seen: HashSet<u64> = HashSet::with_capacity(by_id.len());
    // (child partition, key, parent partition) -> parent offset of the latest first copy.
    let mut last: HashMap<(u32, &[u8], u32), u64> = HashMap::new();
    for copy in sorted {
        let Some(origin) = copy.id.and_then(|id| by_id.get(&id)) else {
            verdict.unknown += 1;
            verdict.problem(|| {
                format!(
                    "partition {} offset {} is no parent record",
                    copy.partition, copy.offset
                )
            });
            continue;
        };
        if let Some(want) = expect.partition_of(origin)
            && want != copy.partition
        {
            verdict.misplaced += 1;
            verdict.problem(|| {
                format!(
                    "parent p{} offset {} is in partition {}, its router must put it in {want}",
                    origin.partition, origin.offset, copy.partition
                )
            });
        }
        let id = copy.id.unwrap_or_default();
        if !seen.insert(id) {
            verdict.duplicates += 1;
            continue;
        }
        if let Some(key) = origin.key.as_deref() {
            let group = (copy.partition, key, origin.partition);
            match last.get(&group) {
                Some(&prev) if prev > origin.offset => {
                    verdict.order_breaks += 1;
                    verdict.problem(|| {
                        format!(
                            "key {:?}: parent p{} offset {} was copied after offset {prev}",
                            String::from_utf8_lossy(key),
                            origin.partition,
                            origin.offset
                        )
                    });
                }
                _ => {
                    last.insert(group, origin.offset);
                }
            }
        }
    }
    let mut missing: Vec<&&Record> = by_id
        .iter()
        .filter(|(id, _)| !seen.contains(id))
        .map(|(_, r)| r)
        .collect();
    verdict.missing = missing.len() as u64;
    missing.sort_by_key(|r| (r.partition, r.offset));
    if let Some(first) = missing.first() {
        verdict.problem(|| {
            format!(
                "{} parent records missing, the first at p{} offset {}",
                missing.len(),
                first.partition,
                first.offset
            )
        });
    }
    verdict
}

/// One acknowledged produce: the record's sequence number and where the answer put it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    /// Sequence number.
    pub id: u64,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
}

/// Checks that the parent holds every acknowledged record at its acknowledged place and keyed
/// records on Kafka's partition for their key. Returns the problems found (empty when none).
pub fn check_parent(acked: &[Acked], parent: &[Record], partitions: u32) -> Vec<String> {
    let at: HashMap<(u32, u64), &Record> = parent
        .iter()
        .map(|r| ((r.partition, r.offset), r))
        .collect();
    let mut problems = Vec::new();
    let mut missing = 0u64;
    for a in acked {
        match at.get(&(a.partition, a.offset)) {
            Some(r) if r.id == Some(a.id) => {}
            _ => {
                missing += 1;
                if missing == 1 {
                    problems.push(format!(
                        "acknowledged record {} is not at p{} offset {}",
                        a.id, a.partition, a.offset
                    ));
                }
            }
        }
    }
    if missing > 1 {
        problems.push(format!("{missing} acknowledged records not found in all"));
    }
    if let Some(r) = parent.iter().find(|r| {
        r.key
            .as_deref()
            .is_some_and(|k| narad_abi::partition_for_key(k, partitions) != Some(r.partition))
    }) {
        problems.push(format!(
            "keyed record at p{} offset {} is not on Kafka's partition for its key",
            r.partition, r.offset
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        partition: u32,
        offset: u64,
        id: u64,
        key: Option<&str>,
        region: Option<&str>,
    ) -> Record {
        Record {
            partition,
            offset,
            id: Some(id),
            key: key.map(|k| k.as_bytes().to_vec()),
            region: region.map(str::to_owned),
        }
    }

    fn keyed_parent(n: u64) -> Vec<Record> {
        (0..n)
            .map(|i| {
                let key = format!("k{}", i % 3);
                let p = narad_abi::partition_for_key(key.as_bytes(), 2).unwrap();
                rec(p, i, i, Some(&key), None)
            })
            .collect()
    }

    /// The child a correct default chain with `partitions` partitions would hold.
    fn copy_of(parent: &[Record], partitions: u32) -> Vec<Record> {
        let mut next = vec![0u64; partitions as usize];
        parent
            .iter()
            .map(|r| {
                let p =
                    narad_abi::partition_for_key(r.key.as_deref().unwrap(), partitions).unwrap();
                let offset = next[p as usize];
                next[p as usize] += 1;
                Record {
                    partition: p,
                    offset,
                    ..r.clone()
                }
            })
            .collect()
    }

    fn expect(child_partitions: u32) -> Expectation {
        Expectation {
            parent_partitions: 2,
            child_partitions,
            regions: None,
        }
    }

    #[test]
    fn a_faithful_copy_passes_and_duplicates_are_only_counted() {
        let parent = keyed_parent(30);
        let mut child = copy_of(&parent, 3);
        let verdict = check_child(&parent, &child, &expect(3));
        assert!(verdict.ok(), "{verdict:?}");
        assert_eq!(verdict.expected, 30);
        // A replayed record lands again at the end of its partition: a duplicate, no gap.
        let mut again = child[0].clone();
        again.offset = 1_000;
        child.push(again);
        let verdict = check_child(&parent, &child, &expect(3));
        assert!(verdict.ok(), "{verdict:?}");
        assert_eq!(verdict.duplicates, 1);
    }

    #[test]
    fn a_missing_record_fails_and_is_named() {
        let parent = keyed_parent(10);
        let mut child = copy_of(&parent, 3);
        child.remove(4);
        let verdict = check_child(&parent, &child, &expect(3));
        assert!(!verdict.ok());
        assert_eq!(verdict.missing, 1);
        assert!(verdict.first_problem.unwrap().contains("offset 4"));
    }

    #[test]
    fn two_records_of_a_key_swapped_break_the_order() {
        let parent = keyed_parent(12);
        let mut child = copy_of(&parent, 3);
        // Records 0 and 3 share key k0 and so a child partition; swap their places.
        let (a, b) = (child[0].offset, child[3].offset);
        child[0].offset = b;
        child[3].offset = a;
        let verdict = check_child(&parent, &child, &expect(3));
        assert_eq!(verdict.order_breaks, 1, "{verdict:?}");
        assert!(!verdict.ok());
    }

    #[test]
    fn a_keyed_record_off_its_kafka_partition_is_misplaced() {
        let parent = keyed_parent(6);
        let mut child = copy_of(&parent, 3);
        child[2].partition = (child[2].partition + 1) % 3;
        let verdict = check_child(&parent, &child, &expect(3));
        assert_eq!(verdict.misplaced, 1, "{verdict:?}");
    }

    #[test]
    fn a_record_the_parent_never_had_is_unknown() {
        let parent = keyed_parent(3);
        let mut child = copy_of(&parent, 3);
        child.push(rec(0, 99, 12_345, Some("k0"), None));
        let verdict = check_child(&parent, &child, &expect(3));
        assert_eq!(verdict.unknown, 1);
        assert!(!verdict.ok());
    }

    #[test]
    fn region_records_follow_the_map_and_others_the_chain() {
        let map = RegionMap {
            map: vec![("us".into(), 0), ("eu".into(), 1)],
            fallback: Some(2),
        };
        let e = Expectation {
            parent_partitions: 4,
            child_partitions: 3,
            regions: Some(map),
        };
        assert_eq!(
            e.partition_of(&rec(3, 0, 0, Some("x"), Some("us"))),
            Some(0)
        );
        assert_eq!(e.partition_of(&rec(3, 0, 0, None, Some("eu"))), Some(1));
        assert_eq!(e.partition_of(&rec(3, 0, 0, None, Some("apac"))), Some(2));
        assert_eq!(
            e.partition_of(&rec(3, 0, 0, Some("x"), None)),
            narad_abi::partition_for_key(b"x", 3)
        );
        assert_eq!(e.partition_of(&rec(3, 0, 0, None, None)), None);
    }

    #[test]
    fn keyless_records_keep_their_index_when_the_counts_match() {
        let e = Expectation {
            parent_partitions: 4,
            child_partitions: 4,
            regions: None,
        };
        assert_eq!(e.partition_of(&rec(3, 7, 0, None, None)), Some(3));
    }

    #[test]
    fn the_parent_must_hold_each_acknowledged_record_where_it_was_acknowledged() {
        let parent = keyed_parent(4);
        let acked: Vec<Acked> = parent
            .iter()
            .map(|r| Acked {
                id: r.id.unwrap(),
                partition: r.partition,
                offset: r.offset,
            })
            .collect();
        assert!(check_parent(&acked, &parent, 2).is_empty());
        let mut wrong = acked.clone();
        wrong[1].offset = 77;
        assert_eq!(check_parent(&wrong, &parent, 2).len(), 1);
    }
}
