//! Intent records: the evidence a topic change leaves in the topic's own directory while it is
//! under way, so that start-up can finish or undo an interrupted change from what this daemon
//! wrote, never from the absence of something.
//!
//! A create, a partition growth and a delete each touch two places (the partition directories
//! and the metastore) that no single write can change together. Before the first of its
//! steps, the change writes `topics/{topic}/INTENT`; after the last, it removes it:
//!
//! ```text
//! create  INTENT {"op":"create","partitions":N}  -> partition dirs -> metastore -> remove INTENT
//! grow    INTENT {"op":"grow","from":A,"to":B}   -> dirs A..B      -> metastore -> remove INTENT
//! delete  INTENT {"op":"delete"}                 -> metastore      -> move the topic dir to trash
//! ```
//!
//! The file is written like every durable file of the daemon (temp file, `fsync`, `rename`,
//! directory `fsync`), so it is either absent or whole. Its name is not a partition directory
//! name (`p` and five digits), so the store never mistakes it for a partition. What start-up
//! does with it is decided in [`super::startup`].

use std::io::ErrorKind;
use std::path::Path;

use narad_storage::fs::{FileSystem, replace_file};
use serde::{Deserialize, Serialize};

use crate::durable;

/// File name of the intent record inside `topics/{topic}/`.
pub(crate) const INTENT_FILE_NAME: &str = "INTENT";

/// A topic change in progress. Persisted as JSON: do not rename variants or fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum Intent {
    /// A create of a topic with this many partitions.
    Create {
        /// Partition count being created.
        partitions: u32,
    },
    /// A growth of the partition count from `from` to `to`.
    Grow {
        /// Count before the growth.
        from: u32,
        /// Count asked for.
        to: u32,
    },
    /// A delete of the whole topic.
    Delete,
}

/// What the topic directory says about a change in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IntentState {
    /// No change was in progress.
    None,
    /// This change was in progress.
    Found(Intent),
    /// An intent file exists but does not parse (written by something else, or damaged): it
    /// is no evidence of anything, so the directory is treated as unaccounted for.
    Unreadable(String),
}

/// [`write_on`] on the real file system, for callers that do not pass one.
pub(crate) fn write(topic_dir: &Path, intent: Intent) -> std::io::Result<()> {
    write_on(&*durable::real(), topic_dir, intent)
}

/// Durably records `intent` in `topic_dir` on `fs`, creating the directory (owner-only) if
/// needed and making its entry durable in `topics/`. When this returns `Ok`, a crash leaves
/// `intent`; when it fails or the process dies during it, the record is the one before
/// (or none) or `intent`, whole: never a torn file.
pub(crate) fn write_on(
    fs: &dyn FileSystem,
    topic_dir: &Path,
    intent: Intent,
) -> std::io::Result<()> {
    if !fs.exists(topic_dir)? {
        fs.create_dir_all(topic_dir)?;
        if let Some(parent) = topic_dir.parent() {
            fs.sync_dir(parent)?;
        }
    }
    let bytes = serde_json::to_vec(&intent).map_err(std::io::Error::other)?;
    replace_file(fs, topic_dir, INTENT_FILE_NAME, &bytes)
}

/// Reads the intent record of `topic_dir` on `fs` (a missing directory or file is no change
/// in progress).
pub(crate) fn read_on(fs: &dyn FileSystem, topic_dir: &Path) -> std::io::Result<IntentState> {
    match durable::read_whole(fs, &topic_dir.join(INTENT_FILE_NAME)) {
        Ok(bytes) => Ok(match serde_json::from_slice(&bytes) {
            Ok(intent) => IntentState::Found(intent),
            Err(e) => IntentState::Unreadable(e.to_string()),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(IntentState::None),
        Err(e) => Err(e),
    }
}

/// [`clear_on`] on the real file system, for callers that do not pass one.
pub(crate) fn clear(topic_dir: &Path) -> std::io::Result<()> {
    clear_on(&*durable::real(), topic_dir)
}

/// Removes the intent record of `topic_dir` on `fs` durably (a missing one is not an error):
/// when this returns `Ok`, a crash does not bring the record back.
pub(crate) fn clear_on(fs: &dyn FileSystem, topic_dir: &Path) -> std::io::Result<()> {
    match fs.remove_file(&topic_dir.join(INTENT_FILE_NAME)) {
        Ok(()) => fs.sync_dir(topic_dir),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use narad_storage::fault::FaultFs;
    use narad_storage::fs::RealFs;

    use super::*;

    #[test]
    fn an_intent_survives_a_round_trip_and_clearing_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let topic = dir.path().join("orders");
        assert_eq!(read_on(&RealFs, &topic).unwrap(), IntentState::None);
        write(&topic, Intent::Grow { from: 2, to: 5 }).unwrap();
        assert_eq!(
            read_on(&RealFs, &topic).unwrap(),
            IntentState::Found(Intent::Grow { from: 2, to: 5 })
        );
        let text = fs::read_to_string(topic.join(INTENT_FILE_NAME)).unwrap();
        assert_eq!(text, r#"{"op":"grow","from":2,"to":5}"#);
        clear(&topic).unwrap();
        assert_eq!(read_on(&RealFs, &topic).unwrap(), IntentState::None);
        clear(&topic).unwrap();
    }

    #[test]
    fn a_damaged_intent_is_no_evidence() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(INTENT_FILE_NAME), b"{\"op\":\"del").unwrap();
        assert!(matches!(
            read_on(&RealFs, dir.path()).unwrap(),
            IntentState::Unreadable(_)
        ));
    }

    /// A run of one topic's changes: a create's record and its clearing, a growth's record
    /// replaced by a delete's (an existing record overwritten, where a write in place would
    /// tear), and the delete's clearing. `None` clears.
    const RUN: [Option<Intent>; 5] = [
        Some(Intent::Create { partitions: 2 }),
        None,
        Some(Intent::Grow { from: 2, to: 5 }),
        Some(Intent::Delete),
        None,
    ];

    fn run_step(fs: &FaultFs, topic: &Path, step: Option<Intent>) -> std::io::Result<()> {
        match step {
            Some(intent) => write_on(fs, topic, intent),
            None => clear_on(fs, topic),
        }
    }

    fn state_after(step: Option<Intent>) -> IntentState {
        step.map_or(IntentState::None, IntentState::Found)
    }

    /// A data directory whose `topics/` is durable, and no topic in it.
    fn fresh(data: &Path) -> FaultFs {
        let fs = FaultFs::new();
        fs.create_dir_all(&data.join(narad_storage::store::TOPICS_DIR_NAME))
            .unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        fs.sync_dir(data).unwrap();
        fs
    }

    #[test]
    fn a_crash_at_any_step_leaves_the_record_before_or_after_that_step_whole() {
        let data = Path::new("/data");
        let topic = data
            .join(narad_storage::store::TOPICS_DIR_NAME)
            .join("orders");
        let mut expected = vec![IntentState::None];
        expected.extend(RUN.iter().map(|&step| state_after(step)));
        let next = Intent::Grow { from: 5, to: 7 };
        let run = crate::durable::crash_loop::RecordRun {
            dir: &topic,
            file_name: INTENT_FILE_NAME,
            steps: &RUN,
            expected: &expected,
            again: (Some(next), IntentState::Found(next)),
        };
        crate::durable::crash_loop::crash_at_every_operation(
            &run,
            || fresh(data),
            |fs, &step| run_step(fs, &topic, step),
            |fs| read_on(fs, &topic),
        );
    }
}
