//! Which local partitions the next orphan sweep lists: a bounded share of them, taking turns
//! round the ring of every partition in (topic name, partition) order.
//!
//! The turn is kept as the last partition a sweep visited, not as an index into a list: a topic
//! created or deleted between two sweeps shifts no other partition's turn, and a sweep never
//! builds the list of every partition (60,000 names cloned on a node with 5,000 topics of 12).

use std::ops::Bound;

/// The last (topic, partition) a sweep visited: the next one starts just after it.
pub(crate) type SweepMark = (String, u32);

/// What one sweep lists and where the next starts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SweepTurn {
    /// The local partitions to list, in ring order.
    pub(crate) local: Vec<SweepMark>,
    /// The mark for the next sweep (`None` when there is no partition at all).
    pub(crate) next: Option<SweepMark>,
}

/// A topic of the ring and the partition the walk takes it up from.
type TopicFrom<'a, T> = (&'a String, &'a T, u32);

/// Up to `max_local` partitions for which `is_local` holds, going round the ring of every
/// partition of `topics` (`partitions_of` gives a topic's count) from just after `after` (from
/// the first when `None`), visiting at most `max_visits` partitions and none twice.
pub(crate) fn next_sweep<T: Clone>(
    topics: &crate::metastore::Items<String, T>,
    partitions_of: impl Fn(&T) -> u32,
    after: Option<&SweepMark>,
    max_local: usize,
    max_visits: usize,
    is_local: impl Fn(&str, u32) -> bool,
) -> SweepTurn {
    // The rest of the ring after the mark, then its start up to the mark (wrapping round once).
    let (tail, head): (Vec<TopicFrom<'_, T>>, Vec<TopicFrom<'_, T>>) = match after {
        None => (topics.iter().map(|(n, t)| (n, t, 0)).collect(), Vec::new()),
        Some((name, partition)) => {
            let from = Bound::Included(name.as_str());
            let tail = (topics.range::<_, str>((from, Bound::Unbounded)))
                .map(|(n, t)| (n, t, if n == name { partition + 1 } else { 0 }))
                .collect();
            // Before the mark's topic only: its own first partitions close the round below.
            let head = (topics.range::<_, str>((Bound::Unbounded, Bound::Excluded(name.as_str()))))
                .map(|(n, t)| (n, t, 0))
                .collect();
            (tail, head)
        }
    };
    let mut ring = tail
        .into_iter()
        .chain(head)
        .flat_map(|(name, topic, first)| {
            (first..partitions_of(topic)).map(move |partition| (name, partition))
        });
    // The mark's own topic: its partitions up to the mark close the round.
    let closing = after.and_then(|(name, partition)| {
        topics
            .get(name)
            .map(|_| (0..=*partition).map(move |p| (name, p)))
    });
    let mut closing = closing.into_iter().flatten();
    let mut turn = SweepTurn {
        local: Vec::new(),
        next: after.cloned(),
    };
    for _ in 0..max_visits {
        if turn.local.len() >= max_local {
            break;
        }
        let Some((name, partition)) = ring.next().or_else(|| closing.next()) else {
            break;
        };
        if is_local(name, partition) {
            turn.local.push((name.clone(), partition));
        }
        turn.next = Some((name.clone(), partition));
    }
    if topics.is_empty() {
        turn.next = None;
    }
    turn
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(spec: &[(&str, u32)]) -> crate::metastore::Items<String, u32> {
        spec.iter().map(|(n, p)| (n.to_string(), *p)).collect()
    }

    fn sweep(
        t: &crate::metastore::Items<String, u32>,
        after: Option<&SweepMark>,
        max_local: usize,
        is_local: impl Fn(&str, u32) -> bool,
    ) -> SweepTurn {
        next_sweep(t, |p| *p, after, max_local, usize::MAX, is_local)
    }

    fn all_of(t: &crate::metastore::Items<String, u32>) -> Vec<SweepMark> {
        t.iter()
            .flat_map(|(n, p)| (0..*p).map(move |i| (n.clone(), i)))
            .collect()
    }

    #[test]
    fn successive_sweeps_visit_every_local_partition_once_per_round_in_order() {
        let t = topics(&[("a", 3), ("b", 1), ("c", 4)]);
        let local = |n: &str, p: u32| !(n == "c" && p == 2);
        let want: Vec<SweepMark> = all_of(&t)
            .into_iter()
            .filter(|(n, p)| local(n, *p))
            .collect();
        let mut seen = Vec::new();
        let mut mark = None;
        // Rounds of 7 local partitions over a ring of 8 (one not local), three times round.
        for _ in 0..3 * 8 {
            let turn = sweep(&t, mark.as_ref(), 1, local);
            seen.extend(turn.local);
            mark = turn.next;
            if seen.len() == 3 * want.len() {
                break;
            }
        }
        let rounds: Vec<Vec<SweepMark>> = seen.chunks(want.len()).map(<[_]>::to_vec).collect();
        assert_eq!(rounds, vec![want.clone(), want.clone(), want]);
    }

    #[test]
    fn a_sweep_lists_at_most_its_share_and_never_one_partition_twice() {
        let t = topics(&[("a", 3), ("b", 2)]);
        let turn = sweep(&t, Some(&("a".into(), 1)), 3, |_, _| true);
        assert_eq!(
            turn.local,
            vec![("a".into(), 2), ("b".into(), 0), ("b".into(), 1)]
        );
        assert_eq!(turn.next, Some(("b".into(), 1)));
        // A share larger than the ring: each partition once, from just after the mark round
        // to the mark itself.
        let turn = sweep(&t, Some(&("a".into(), 1)), 100, |_, _| true);
        assert_eq!(
            turn.local,
            vec![
                ("a".into(), 2),
                ("b".into(), 0),
                ("b".into(), 1),
                ("a".into(), 0),
                ("a".into(), 1),
            ]
        );
        assert_eq!(turn.next, Some(("a".into(), 1)));
    }

    #[test]
    fn topics_created_or_deleted_between_sweeps_move_no_other_turn() {
        // The mark's own topic was deleted: the sweep goes on with the next name.
        let t = topics(&[("a", 1), ("c", 2)]);
        let turn = sweep(&t, Some(&("b".into(), 5)), 2, |_, _| true);
        assert_eq!(turn.local, vec![("c".into(), 0), ("c".into(), 1)]);
        // A topic created before the mark waits for the wrap; one after it comes in its turn.
        let t = topics(&[("a", 1), ("b", 1), ("d", 1)]);
        let turn = sweep(&t, Some(&("c".into(), 0)), 3, |_, _| true);
        assert_eq!(
            turn.local,
            vec![("d".into(), 0), ("a".into(), 0), ("b".into(), 0)]
        );
    }

    #[test]
    fn the_visits_per_sweep_are_bounded_also_when_few_partitions_are_local() {
        let t = topics(&[("a", 100)]);
        let turn = next_sweep(&t, |p| *p, None, 10, 25, |_, p| p % 50 == 49);
        // 25 visited, none of them local; the next sweep starts after the 25th.
        assert!(turn.local.is_empty());
        assert_eq!(turn.next, Some(("a".into(), 24)));
        let turn = next_sweep(&t, |p| *p, turn.next.as_ref(), 10, 25, |_, p| p % 50 == 49);
        assert_eq!(turn.local, vec![("a".into(), 49)]);
        assert_eq!(
            sweep(&crate::metastore::Items::new(), None, 10, |_, _| true),
            SweepTurn {
                local: Vec::new(),
                next: None
            }
        );
    }
}
