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

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::durable::{replace_file, sync_dir};

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

/// Durably records `intent` in `topic_dir`, creating the directory (owner-only) if needed and
/// making its entry durable in `topics/`.
pub(crate) fn write(topic_dir: &Path, intent: Intent) -> std::io::Result<()> {
    if !topic_dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(topic_dir)?;
        if let Some(parent) = topic_dir.parent() {
            sync_dir(parent)?;
        }
    }
    let bytes = serde_json::to_vec(&intent).map_err(std::io::Error::other)?;
    replace_file(topic_dir, INTENT_FILE_NAME, &bytes)
}

/// Reads the intent record of `topic_dir`.
pub(crate) fn read(topic_dir: &Path) -> std::io::Result<IntentState> {
    match fs::read(topic_dir.join(INTENT_FILE_NAME)) {
        Ok(bytes) => Ok(match serde_json::from_slice(&bytes) {
            Ok(intent) => IntentState::Found(intent),
            Err(e) => IntentState::Unreadable(e.to_string()),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(IntentState::None),
        Err(e) => Err(e),
    }
}

/// Removes the intent record of `topic_dir` durably (a missing one is not an error).
pub(crate) fn clear(topic_dir: &Path) -> std::io::Result<()> {
    match fs::remove_file(topic_dir.join(INTENT_FILE_NAME)) {
        Ok(()) => sync_dir(topic_dir),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intent_survives_a_round_trip_and_clearing_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let topic = dir.path().join("orders");
        assert_eq!(read(&topic).unwrap(), IntentState::None);
        write(&topic, Intent::Grow { from: 2, to: 5 }).unwrap();
        assert_eq!(
            read(&topic).unwrap(),
            IntentState::Found(Intent::Grow { from: 2, to: 5 })
        );
        let text = fs::read_to_string(topic.join(INTENT_FILE_NAME)).unwrap();
        assert_eq!(text, r#"{"op":"grow","from":2,"to":5}"#);
        clear(&topic).unwrap();
        assert_eq!(read(&topic).unwrap(), IntentState::None);
        clear(&topic).unwrap();
    }

    #[test]
    fn a_damaged_intent_is_no_evidence() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(INTENT_FILE_NAME), b"{\"op\":\"del").unwrap();
        assert!(matches!(
            read(dir.path()).unwrap(),
            IntentState::Unreadable(_)
        ));
    }
}
