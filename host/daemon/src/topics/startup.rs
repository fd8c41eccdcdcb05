//! Start-up accounting of `topics/` against the metastore: every topic and partition
//! directory on disk is either named by the metastore, explained by an intent record this
//! daemon wrote ([`super::intent`]), or set aside ([`super::set_aside`]). Nothing is deleted
//! because something else is absent.
//!
//! The rules, per topic directory ([`plan`] is the pure half, table-tested below):
//!
//! | metastore | intent | what happens |
//! |---|---|---|
//! | knows it | none | nothing; partition dirs beyond its count are set aside |
//! | knows it | create / delete | the create finished / the delete was never recorded: the intent is cleared |
//! | knows it | grow to B | if the count reached B, cleared; else the empty dirs the growth made are removed (one holding records is set aside) |
//! | unknown | delete | the delete was recorded: it is finished (the directory goes to the trash) |
//! | unknown | create, no records | the create never reached the metastore: its empty directories are removed |
//! | unknown | none, and nothing in it but an unfinished intent write | a create's first step (its directory made, its intent not yet in place): removed |
//! | unknown | anything else | set aside, listed, counted; never deleted |
//!
//! A data directory whose metastore file is missing (with no backup beside it) while
//! `topics/` holds data the rules above would set aside refuses to start: that is a lost
//! metastore, not a set of strays, and `narad admin rebuild-metastore` rebuilds it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use narad_storage::Store;
use narad_storage::fs::FileSystem;
use narad_storage::store::TOPICS_DIR_NAME;

use super::intent::{self, Intent, IntentState};
use super::set_aside::{self, SetAsideEntry, SetAsideError};
use crate::metastore::TopicMeta;

/// One topic directory as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicDir {
    /// The topic name (the directory name).
    pub name: String,
    /// Its intent record.
    pub intent: IntentState,
    /// Its partition directories, by index, with the bytes of their segment files.
    pub partitions: BTreeMap<u32, u64>,
    /// It holds nothing at all but, at most, the temporary file of an intent write: what a
    /// create leaves when it stops between making the directory and putting its intent in
    /// place.
    pub bare: bool,
}

impl TopicDir {
    fn holds_records(&self) -> bool {
        self.partitions.values().any(|&bytes| bytes > 0)
    }
}

/// One step start-up takes for a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Remove the intent record: the change it describes is settled.
    ClearIntent {
        /// Topic.
        topic: String,
    },
    /// Finish a delete the metastore recorded: move the topic directory to the trash.
    FinishDelete {
        /// Topic.
        topic: String,
    },
    /// Undo a create that never reached the metastore: remove its (empty) directories.
    UndoCreate {
        /// Topic.
        topic: String,
    },
    /// Undo a growth that never reached the metastore: remove these (empty) partition dirs.
    UndoGrow {
        /// Topic.
        topic: String,
        /// The partition indexes.
        partitions: Vec<u32>,
    },
    /// Move a whole topic directory to the set-aside area.
    SetAsideTopic {
        /// Topic.
        topic: String,
        /// Why, for the operator.
        reason: String,
    },
    /// Move one partition directory to the set-aside area.
    SetAsidePartition {
        /// Topic.
        topic: String,
        /// Partition index.
        partition: u32,
        /// Why, for the operator.
        reason: String,
    },
}

/// What start-up did with `topics/`.
#[derive(Debug, Default, Clone)]
pub(crate) struct StartupReport {
    /// The entries set aside by this start.
    pub set_aside: Vec<SetAsideEntry>,
    /// Interrupted changes finished or undone, as `topic: what`.
    pub settled: Vec<String>,
}

/// Why start-up refused the data directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// Topic data is on disk but the metastore file (and its backup) is gone.
    #[error(
        "the data dir {} holds the records of {} topic(s) ({}) but no metastore.json and no \
         metastore.json.prev: narad will not start with an empty topic list over existing data. \
         Stop here and either restore metastore.json from a backup of the data dir, or rebuild \
         the topic list from what is on disk with `narad admin rebuild-metastore --data-dir {}` \
         (it takes partition counts from the partition directories and tells you what it cannot \
         recover: retention, children, plugin names)",
        data_dir.display(), topics.len(), topics.join(", "), data_dir.display()
    )]
    MetastoreMissing {
        /// The data directory.
        data_dir: PathBuf,
        /// The topics found on disk.
        topics: Vec<String>,
    },
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Moving a directory to the set-aside area failed.
    #[error(transparent)]
    SetAside(#[from] SetAsideError),
    /// The store failed to remove a directory.
    #[error(transparent)]
    Storage(#[from] narad_storage::StorageError),
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> StartupError {
    move |source| StartupError::Io { context, source }
}

/// The partition index of a partition directory name (`p` and five digits).
pub(crate) fn parse_partition_dir(name: &str) -> Option<u32> {
    let digits = name.strip_prefix('p')?;
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Scans `{data_dir}/topics/` on `fs`: every directory with a valid topic name, its intent
/// and its partition directories. Other entries are left alone (and logged).
pub(crate) fn scan(fs: &dyn FileSystem, data_dir: &Path) -> Result<Vec<TopicDir>, StartupError> {
    let topics_dir = data_dir.join(TOPICS_DIR_NAME);
    let entries = match fs.read_dir(&topics_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(format!("listing {}", topics_dir.display()))(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = topics_dir.join(&entry.name);
        if !entry.is_dir || narad_storage::validate_topic_name(&entry.name).is_err() {
            tracing::warn!(path = %path.display(), "ignoring an entry of topics/ that is not a topic directory");
            continue;
        }
        let name = entry.name;
        let intent = intent::read_on(fs, &path).map_err(io(format!(
            "reading the intent record of {}",
            path.display()
        )))?;
        let mut partitions = BTreeMap::new();
        let intent_temp = narad_storage::fs::replace_temp_path(&path, intent::INTENT_FILE_NAME);
        let listed = fs
            .read_dir(&path)
            .map_err(io(format!("listing {}", path.display())))?;
        // An entry the listing leaves out (a name that is not UTF-8) is something the daemon
        // did not make: the directory is not bare, so it is set aside, never removed.
        let mut bare = fs
            .entry_count(&path)
            .map_err(io(format!("listing {}", path.display())))?
            == listed.len();
        for part in listed {
            let part_path = path.join(&part.name);
            if part_path != intent_temp {
                bare = false;
            }
            let index = parse_partition_dir(&part.name).filter(|_| part.is_dir);
            if let Some(index) = index {
                let bytes = set_aside::partition_segment_bytes(fs, &part_path)
                    .map_err(io(format!("measuring {}", part_path.display())))?;
                partitions.insert(index, bytes);
            }
        }
        out.push(TopicDir {
            name,
            intent,
            partitions,
            bare,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The steps that account for `dirs` against the topics the metastore knows (see the table in
/// the module doc). Pure: decides, does nothing.
pub(crate) fn plan(
    dirs: &[TopicDir],
    known: &crate::metastore::Items<String, TopicMeta>,
) -> Vec<Action> {
    let mut actions = Vec::new();
    for dir in dirs {
        let topic = dir.name.clone();
        let Some(meta) = known.get(&dir.name) else {
            match &dir.intent {
                IntentState::Found(Intent::Delete) => actions.push(Action::FinishDelete { topic }),
                IntentState::Found(Intent::Create { .. }) if !dir.holds_records() => {
                    actions.push(Action::UndoCreate { topic });
                }
                IntentState::None if dir.bare => actions.push(Action::UndoCreate { topic }),
                IntentState::Found(Intent::Create { .. }) => actions.push(Action::SetAsideTopic {
                    topic,
                    reason: "an interrupted create, but its partitions hold records; the \
                             metastore does not know the topic"
                        .to_owned(),
                }),
                _ => actions.push(Action::SetAsideTopic {
                    topic,
                    reason: "the metastore does not know this topic, and no create or delete \
                             of it was in progress"
                        .to_owned(),
                }),
            }
            continue;
        };
        let count = meta.partitions;
        let extra: Vec<(u32, u64)> = dir
            .partitions
            .range(count..)
            .map(|(&p, &bytes)| (p, bytes))
            .collect();
        let mut undo = Vec::new();
        let explained = |p: u32| -> bool {
            matches!(dir.intent, IntentState::Found(Intent::Grow { to, .. }) if p < to)
        };
        for (p, bytes) in extra {
            if explained(p) && bytes == 0 {
                undo.push(p);
            } else {
                let reason = if explained(p) {
                    format!(
                        "a growth of the topic to more than {count} partitions was interrupted, \
                         but this partition holds records"
                    )
                } else {
                    format!(
                        "beyond the topic's {count} partitions, with no growth in progress to \
                         explain it"
                    )
                };
                actions.push(Action::SetAsidePartition {
                    topic: topic.clone(),
                    partition: p,
                    reason,
                });
            }
        }
        if !undo.is_empty() {
            actions.push(Action::UndoGrow {
                topic: topic.clone(),
                partitions: undo,
            });
        }
        if let IntentState::Found(_) = dir.intent {
            actions.push(Action::ClearIntent { topic });
        }
    }
    actions
}

/// Accounts for `topics/` at start-up: scans, plans, refuses a lost metastore
/// (`metastore_is_new`: no metastore file existed), and carries out the plan. Runs before any
/// partition is registered with the store. `fs` is the file system `store` was opened on:
/// intent records, set-aside entries and the trash are read and written through it.
pub(crate) fn reconcile(
    fs: &dyn FileSystem,
    store: &Store,
    known: &crate::metastore::Items<String, TopicMeta>,
    metastore_is_new: bool,
    now_ms: i64,
) -> Result<StartupReport, StartupError> {
    let data_dir = store.data_dir().to_path_buf();
    let dirs = scan(fs, &data_dir)?;
    let actions = plan(&dirs, known);
    if metastore_is_new {
        let orphans: Vec<String> = actions
            .iter()
            .filter_map(|a| match a {
                Action::SetAsideTopic { topic, .. } => Some(topic.clone()),
                _ => None,
            })
            .collect();
        if !orphans.is_empty() {
            return Err(StartupError::MetastoreMissing {
                data_dir,
                topics: orphans,
            });
        }
    }
    let topics_dir = data_dir.join(TOPICS_DIR_NAME);
    let mut report = StartupReport::default();
    for action in actions {
        match action {
            Action::ClearIntent { topic } => {
                let dir = topics_dir.join(&topic);
                intent::clear_on(fs, &dir).map_err(io(format!(
                    "clearing the intent record of {}",
                    dir.display()
                )))?;
                tracing::info!(%topic, "settled the intent record of an interrupted topic change");
                report
                    .settled
                    .push(format!("{topic}: intent record cleared"));
            }
            Action::FinishDelete { topic } => {
                tracing::warn!(%topic, "finishing the delete of a topic (interrupted by a crash; the metastore recorded it)");
                store.delete_topic(&topic)?;
                report.settled.push(format!("{topic}: delete finished"));
            }
            Action::UndoCreate { topic } => {
                tracing::warn!(%topic, "removing the empty directories of a create the metastore never recorded");
                store.delete_topic(&topic)?;
                report
                    .settled
                    .push(format!("{topic}: unrecorded create undone"));
            }
            Action::UndoGrow { topic, partitions } => {
                for p in &partitions {
                    let dir = topics_dir
                        .join(&topic)
                        .join(narad_storage::PartitionId::new(topic.clone(), *p).dir_name());
                    remove_via_trash(fs, &data_dir, &dir, &format!("{topic}.p{p:05}.{now_ms}"))?;
                }
                tracing::warn!(%topic, ?partitions, "removed the empty partition directories of a growth the metastore never recorded");
                report.settled.push(format!(
                    "{topic}: unrecorded growth undone ({partitions:?})"
                ));
            }
            Action::SetAsideTopic { topic, reason } => {
                let source = topics_dir.join(&topic);
                let entry =
                    set_aside::set_aside_on(fs, &data_dir, &source, &topic, None, &reason, now_ms)?;
                tracing::warn!(%topic, id = %entry.id, segment_bytes = entry.segment_bytes, %reason,
                    "set aside a topic directory the daemon cannot account for; nothing was deleted: \
                     `narad admin set-aside list` shows it, `adopt` brings it back, `purge` removes it");
                report.set_aside.push(entry);
            }
            Action::SetAsidePartition {
                topic,
                partition,
                reason,
            } => {
                let source = topics_dir
                    .join(&topic)
                    .join(narad_storage::PartitionId::new(topic.clone(), partition).dir_name());
                let entry = set_aside::set_aside_on(
                    fs,
                    &data_dir,
                    &source,
                    &topic,
                    Some(partition),
                    &reason,
                    now_ms,
                )?;
                tracing::warn!(%topic, partition, id = %entry.id, segment_bytes = entry.segment_bytes, %reason,
                    "set aside a partition directory the daemon cannot account for; nothing was deleted");
                report.set_aside.push(entry);
            }
        }
    }
    Ok(report)
}

/// Removes a directory this daemon made and can account for: renamed into the trash first (one
/// durable step out of `topics/`), then removed.
fn remove_via_trash(
    fs: &dyn FileSystem,
    data_dir: &Path,
    dir: &Path,
    name: &str,
) -> Result<(), StartupError> {
    let trash = data_dir
        .join(narad_storage::store::TRASH_DIR_NAME)
        .join(name);
    fs.rename(dir, &trash).map_err(io(format!(
        "moving {} to {}",
        dir.display(),
        trash.display()
    )))?;
    for d in [dir.parent(), trash.parent()].into_iter().flatten() {
        fs.sync_dir(d)
            .map_err(io(format!("syncing {}", d.display())))?;
    }
    fs.remove_dir_all(&trash)
        .map_err(io(format!("removing {}", trash.display())))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use narad_storage::fs::RealFs;

    use super::*;

    fn meta(name: &str, partitions: u32) -> TopicMeta {
        TopicMeta {
            writable_as_child: false,
            name: name.to_owned(),
            partitions,
            retention_ms: None,
            retention_bytes: None,
            created_at_ms: 0,
            owners: Vec::new(),
        }
    }

    fn dir(name: &str, intent: IntentState, partitions: &[(u32, u64)]) -> TopicDir {
        TopicDir {
            name: name.to_owned(),
            intent,
            partitions: partitions.iter().copied().collect(),
            bare: false,
        }
    }

    fn known(topics: &[(&str, u32)]) -> crate::metastore::Items<String, TopicMeta> {
        topics
            .iter()
            .map(|&(n, p)| (n.to_owned(), meta(n, p)))
            .collect()
    }

    fn kinds(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::ClearIntent { topic } => format!("clear {topic}"),
                Action::FinishDelete { topic } => format!("finish-delete {topic}"),
                Action::UndoCreate { topic } => format!("undo-create {topic}"),
                Action::UndoGrow { topic, partitions } => {
                    format!("undo-grow {topic} {partitions:?}")
                }
                Action::SetAsideTopic { topic, .. } => format!("set-aside {topic}"),
                Action::SetAsidePartition {
                    topic, partition, ..
                } => format!("set-aside {topic}/{partition}"),
            })
            .collect()
    }

    #[test]
    fn every_directory_is_accounted_for_by_the_metastore_an_intent_or_the_set_aside_area() {
        use IntentState::{Found, None as NoIntent, Unreadable};
        let cases: Vec<(TopicDir, Vec<&str>)> = vec![
            // Known topics.
            (dir("a", NoIntent, &[(0, 10), (1, 0)]), vec![]),
            (
                dir(
                    "b",
                    Found(Intent::Create { partitions: 2 }),
                    &[(0, 0), (1, 0)],
                ),
                vec!["clear b"],
            ),
            (
                dir("c", Found(Intent::Delete), &[(0, 5), (1, 0)]),
                vec!["clear c"],
            ),
            (
                dir(
                    "d",
                    Found(Intent::Grow { from: 2, to: 2 }),
                    &[(0, 5), (1, 0)],
                ),
                vec!["clear d"],
            ),
            (
                dir(
                    "e",
                    Found(Intent::Grow { from: 2, to: 4 }),
                    &[(0, 5), (1, 0), (2, 0), (3, 9)],
                ),
                vec!["set-aside e/3", "undo-grow e [2]", "clear e"],
            ),
            (
                dir("f", NoIntent, &[(0, 5), (1, 0), (2, 0)]),
                vec!["set-aside f/2"],
            ),
            // Unknown topics.
            (
                dir("g", Found(Intent::Delete), &[(0, 99)]),
                vec!["finish-delete g"],
            ),
            (
                dir("h", Found(Intent::Create { partitions: 1 }), &[(0, 0)]),
                vec!["undo-create h"],
            ),
            (
                dir("i", Found(Intent::Create { partitions: 1 }), &[(0, 3)]),
                vec!["set-aside i"],
            ),
            (dir("j", NoIntent, &[(0, 0)]), vec!["set-aside j"]),
            (dir("k", NoIntent, &[(0, 416)]), vec!["set-aside k"]),
            (
                dir("l", Found(Intent::Grow { from: 1, to: 2 }), &[(0, 4)]),
                vec!["set-aside l"],
            ),
            (
                dir("m", Unreadable("x".into()), &[(0, 4)]),
                vec!["set-aside m"],
            ),
            // A create stopped between making the directory and writing its intent.
            (
                TopicDir {
                    bare: true,
                    ..dir("n", NoIntent, &[])
                },
                vec!["undo-create n"],
            ),
            // An empty directory that is not bare (it holds some other file) is not ours.
            (dir("o", NoIntent, &[]), vec!["set-aside o"]),
        ];
        let known = known(&[("a", 2), ("b", 2), ("c", 2), ("d", 2), ("e", 2), ("f", 2)]);
        for (d, expected) in cases {
            let got = kinds(&plan(std::slice::from_ref(&d), &known));
            assert_eq!(got, expected, "for {d:?}");
        }
    }

    fn partition(data: &Path, topic: &str, p: u32, bytes: usize) {
        let dir = data
            .join(TOPICS_DIR_NAME)
            .join(topic)
            .join(format!("p{p:05}"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("00000000000000000000.log"), vec![1u8; bytes]).unwrap();
    }

    #[test]
    fn start_up_settles_what_its_intents_explain_and_sets_the_rest_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let store = Store::open(data, narad_storage::StoreOptions::default()).unwrap();
        let topics = data.join(TOPICS_DIR_NAME);
        partition(data, "gone", 0, 50);
        intent::write(&topics.join("gone"), Intent::Delete).unwrap();
        partition(data, "half", 0, 0);
        partition(data, "half", 1, 0);
        intent::write(&topics.join("half"), Intent::Create { partitions: 2 }).unwrap();
        partition(data, "grown", 0, 10);
        partition(data, "grown", 1, 0);
        partition(data, "grown", 2, 30);
        intent::write(&topics.join("grown"), Intent::Grow { from: 1, to: 3 }).unwrap();
        partition(data, "stray", 0, 70);

        let report = reconcile(&RealFs, &store, &known(&[("grown", 1)]), false, 5).unwrap();
        assert!(
            !topics.join("gone").exists(),
            "a recorded delete is finished"
        );
        assert!(
            !topics.join("half").exists(),
            "an unrecorded empty create is undone"
        );
        assert!(
            !topics.join("grown/p00001").exists(),
            "an unrecorded empty growth is undone"
        );
        assert!(topics.join("grown/p00000").exists());
        assert_eq!(
            intent::read_on(&RealFs, &topics.join("grown")).unwrap(),
            IntentState::None
        );
        assert!(!topics.join("stray").exists());
        let mut aside: Vec<(String, Option<u32>, u64)> = report
            .set_aside
            .iter()
            .map(|e| (e.topic.clone(), e.partition, e.segment_bytes))
            .collect();
        aside.sort();
        assert_eq!(
            aside,
            vec![("grown".into(), Some(2), 30), ("stray".into(), None, 70)]
        );
        assert_eq!(set_aside::list(data).unwrap().len(), 2);
    }

    #[test]
    fn topic_data_without_a_metastore_refuses_the_start_and_touches_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let store = Store::open(data, narad_storage::StoreOptions::default()).unwrap();
        partition(data, "orders", 0, 70);
        partition(data, "half", 0, 0);
        intent::write(
            &data.join(TOPICS_DIR_NAME).join("half"),
            Intent::Create { partitions: 1 },
        )
        .unwrap();
        match reconcile(&RealFs, &store, &crate::metastore::Items::new(), true, 5) {
            Err(StartupError::MetastoreMissing { topics, .. }) => {
                assert_eq!(topics, vec!["orders".to_owned()]);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(data.join(TOPICS_DIR_NAME).join("orders/p00000").exists());
        assert!(data.join(TOPICS_DIR_NAME).join("half/p00000").exists());
        assert!(set_aside::list(data).unwrap().is_empty());

        // A new data dir whose only content is an interrupted first create starts normally.
        fs::remove_dir_all(data.join(TOPICS_DIR_NAME).join("orders")).unwrap();
        reconcile(&RealFs, &store, &crate::metastore::Items::new(), true, 5).unwrap();
        assert!(!data.join(TOPICS_DIR_NAME).join("half").exists());
    }

    #[test]
    fn a_topic_directory_holding_only_a_file_whose_name_is_not_utf8_is_set_aside_not_removed() {
        use std::os::unix::ffi::OsStrExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let store = Store::open(data, narad_storage::StoreOptions::default()).unwrap();
        let dir = data.join(TOPICS_DIR_NAME).join("stray");
        fs::create_dir_all(&dir).unwrap();
        let foreign = dir.join(std::ffi::OsStr::from_bytes(b"kept-\xff"));
        fs::write(&foreign, b"someone's data").unwrap();

        let scanned = scan(&RealFs, data).unwrap();
        assert_eq!(scanned.len(), 1);
        assert!(!scanned[0].bare, "{:?}", scanned[0]);
        let report = reconcile(&RealFs, &store, &crate::metastore::Items::new(), false, 5).unwrap();
        assert!(!dir.exists(), "{report:?}");
        let entries = set_aside::list(data).unwrap();
        assert_eq!(entries.len(), 1, "{report:?}");
        assert_eq!(entries[0].topic, "stray");
        // The file is in the set-aside area, untouched.
        let kept: Vec<_> = walk(data)
            .into_iter()
            .filter(|p| p.file_name() == foreign.file_name())
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(fs::read(&kept[0]).unwrap(), b"someone's data");
    }

    /// Every file below `dir`.
    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
        out
    }

    #[test]
    fn partition_directory_names_are_p_and_five_digits() {
        assert_eq!(parse_partition_dir("p00000"), Some(0));
        assert_eq!(parse_partition_dir("p01024"), Some(1024));
        for bad in ["p0000", "p000000", "q00001", "p0000a", "INTENT", "p-0001"] {
            assert_eq!(parse_partition_dir(bad), None, "{bad}");
        }
    }
}
