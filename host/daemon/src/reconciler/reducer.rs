//! The pure half of the reconciler: turns (desired cursors, running cursors) into actions.
//!
//! Keeping this free of I/O lets its behaviour be pinned by table tests: every start and stop
//! the daemon performs comes from here.

use std::collections::{BTreeMap, BTreeSet};

use crate::fanout::CursorKey;

/// One action the reconciler must carry out, in the order returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Stop a running cursor that is no longer desired (detach, topic delete, ownership
    /// moved, or an epoch that changed).
    Stop(CursorKey),
    /// Start a cursor that is desired and not running.
    Start(CursorKey),
}

/// Compares the desired cursors (links x partitions this node owns) with the running ones.
///
/// Stops come before starts so that a re-attach never has the old and the new epoch's cursor
/// writing the same offset file at once.
pub(crate) fn reconcile(
    desired: &BTreeSet<CursorKey>,
    running: &BTreeSet<CursorKey>,
) -> Vec<Action> {
    let stops = running.difference(desired).cloned().map(Action::Stop);
    let starts = desired.difference(running).cloned().map(Action::Start);
    stops.chain(starts).collect()
}

/// Offset files (per parent partition: child names) that no link explains any more.
///
/// `links` maps a parent topic to its current children; `files` lists, per parent partition
/// directory, the child names that have an offset file there. A file is an orphan when its
/// parent has no link to that child.
pub(crate) fn orphan_cursor_files(
    links: &BTreeMap<String, BTreeSet<String>>,
    files: &BTreeMap<(String, u32), BTreeSet<String>>,
) -> Vec<(String, u32, String)> {
    let mut orphans = Vec::new();
    for ((parent, partition), children) in files {
        let linked = links.get(parent);
        for child in children {
            if !linked.is_some_and(|set| set.contains(child)) {
                orphans.push((parent.clone(), *partition, child.clone()));
            }
        }
    }
    orphans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parent: &str, partition: u32, child: &str, epoch: &str) -> CursorKey {
        CursorKey {
            parent: parent.into(),
            partition,
            child: child.into(),
            epoch: epoch.into(),
        }
    }

    #[test]
    fn nothing_to_do_when_desired_equals_running() {
        let set: BTreeSet<_> = [key("orders", 0, "a", "e1"), key("orders", 1, "a", "e1")].into();
        assert!(reconcile(&set, &set).is_empty());
    }

    #[test]
    fn attach_starts_one_cursor_per_owned_partition() {
        let desired: BTreeSet<_> = (0..3).map(|p| key("orders", p, "a", "e1")).collect();
        let actions = reconcile(&desired, &BTreeSet::new());
        let expected: Vec<_> = (0..3)
            .map(|p| Action::Start(key("orders", p, "a", "e1")))
            .collect();
        assert_eq!(actions, expected);
    }

    #[test]
    fn detach_stops_every_cursor_of_the_link() {
        let running: BTreeSet<_> = (0..2).map(|p| key("orders", p, "a", "e1")).collect();
        let actions = reconcile(&BTreeSet::new(), &running);
        let expected: Vec<_> = (0..2)
            .map(|p| Action::Stop(key("orders", p, "a", "e1")))
            .collect();
        assert_eq!(actions, expected);
    }

    #[test]
    fn reattach_stops_the_old_epoch_before_starting_the_new_one() {
        let running: BTreeSet<_> = [key("orders", 0, "a", "old")].into();
        let desired: BTreeSet<_> = [key("orders", 0, "a", "new")].into();
        assert_eq!(
            reconcile(&desired, &running),
            vec![
                Action::Stop(key("orders", 0, "a", "old")),
                Action::Start(key("orders", 0, "a", "new")),
            ]
        );
    }

    #[test]
    fn a_grown_parent_starts_only_the_new_partitions() {
        let running: BTreeSet<_> = (0..2).map(|p| key("orders", p, "a", "e1")).collect();
        let desired: BTreeSet<_> = (0..4).map(|p| key("orders", p, "a", "e1")).collect();
        assert_eq!(
            reconcile(&desired, &running),
            vec![
                Action::Start(key("orders", 2, "a", "e1")),
                Action::Start(key("orders", 3, "a", "e1")),
            ]
        );
    }

    #[test]
    fn orphan_files_are_those_without_a_link() {
        let links: BTreeMap<String, BTreeSet<String>> =
            [("orders".to_string(), ["a".to_string()].into())].into();
        let files: BTreeMap<(String, u32), BTreeSet<String>> = [
            (
                ("orders".to_string(), 0),
                ["a".to_string(), "gone".to_string()].into(),
            ),
            (("deleted".to_string(), 1), ["x".to_string()].into()),
        ]
        .into();
        assert_eq!(
            orphan_cursor_files(&links, &files),
            vec![
                ("deleted".to_string(), 1, "x".to_string()),
                ("orders".to_string(), 0, "gone".to_string()),
            ]
        );
    }
}
