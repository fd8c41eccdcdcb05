//! The set-aside area: topic and partition directories the daemon found on disk but cannot
//! account for, moved out of `topics/` intact instead of being deleted.
//!
//! The daemon never deletes record data on its own inference. When start-up finds a topic
//! directory the metastore does not know (and no intent record of this daemon explains it),
//! or a partition directory beyond its topic's partition count, it moves the directory here:
//!
//! ```text
//! set-aside/{id}/        the directory exactly as it was (segments, cursor files, ...)
//! set-aside/{id}.json    what it was and why it was moved: topic, partition, reason, time,
//!                        segment bytes
//! ```
//!
//! `{id}` is `{topic}.{unix_ms}` for a topic and `{topic}.p{NNNNN}.{unix_ms}` for a partition.
//! The description is written (durably) before the directory moves, so every entry that has
//! moved is described. Nothing here is ever removed except by an operator: adopted back into
//! `topics/` (`narad admin set-aside adopt`), or purged on purpose
//! (`narad admin set-aside purge`). The entries are listed by `GET /v1/admin/set-aside` and
//! counted by the `narad_set_aside_entries` gauge.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use narad_storage::fs::FileSystem;
use serde::{Deserialize, Serialize};

use crate::durable;

/// Directory under the data directory that holds the set-aside entries.
pub(crate) const SET_ASIDE_DIR_NAME: &str = "set-aside";
/// Directory under the set-aside area for plugin modules no recorded version names (not an
/// entry: a set-aside topic's id always ends in `.{unix_ms}`).
pub(crate) const PLUGINS_SUBDIR: &str = "plugins";
const DESCRIPTION_SUFFIX: &str = ".json";

/// One set-aside directory, as its description file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAsideEntry {
    /// The entry's name under `set-aside/` (what adopt and purge take).
    pub id: String,
    /// The topic the directory belonged to.
    pub topic: String,
    /// The partition index, for a partition directory; `None` for a whole topic.
    pub partition: Option<u32>,
    /// Why it was set aside.
    pub reason: String,
    /// When it was set aside, in milliseconds since the Unix epoch.
    pub set_aside_at_ms: i64,
    /// Bytes of segment files (record data) in it when it was set aside.
    pub segment_bytes: u64,
}

/// Errors of the set-aside area.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetAsideError {
    /// No entry has this id.
    #[error("no set-aside entry named {id:?}; `narad admin set-aside list` shows them")]
    UnknownEntry {
        /// The id asked for.
        id: String,
    },
    /// The id is not a plain entry name.
    #[error("{id:?} is not a set-aside entry name")]
    InvalidId {
        /// The id asked for.
        id: String,
    },
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> SetAsideError {
    move |source| SetAsideError::Io { context, source }
}

/// The set-aside directory of `data_dir`.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(SET_ASIDE_DIR_NAME)
}

/// Where plugin modules no recorded version names are kept (`set-aside/plugins/`).
pub(crate) fn plugins_dir(data_dir: &Path) -> PathBuf {
    dir(data_dir).join(PLUGINS_SUBDIR)
}

/// Total size of the segment files (`*.log`) directly in `partition_dir` on `fs`: its record
/// data (0 for a directory that does not exist).
pub(crate) fn partition_segment_bytes(
    fs: &dyn FileSystem,
    partition_dir: &Path,
) -> std::io::Result<u64> {
    let mut total = 0;
    let entries = match fs.read_dir(partition_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let is_segment = narad_storage::log::segment::parse_segment_name(&entry.name).is_some();
        if is_segment {
            total += fs.metadata(&partition_dir.join(&entry.name))?.len;
        }
    }
    Ok(total)
}

/// Segment bytes of a topic directory (every partition directory in it) or of one partition.
fn segment_bytes(fs: &dyn FileSystem, path: &Path, partition: Option<u32>) -> std::io::Result<u64> {
    if partition.is_some() {
        return partition_segment_bytes(fs, path);
    }
    let mut total = 0;
    for entry in fs.read_dir(path)? {
        if entry.is_dir {
            total += partition_segment_bytes(fs, &path.join(&entry.name))?;
        }
    }
    Ok(total)
}

/// True when `path` on `fs` is a directory (false when it is absent or cannot be checked).
fn is_dir(fs: &dyn FileSystem, path: &Path) -> bool {
    fs.metadata(path).is_ok_and(|m| m.is_dir)
}

fn check_id(id: &str) -> Result<(), SetAsideError> {
    let plain = !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !plain || id.ends_with(DESCRIPTION_SUFFIX) {
        return Err(SetAsideError::InvalidId { id: id.to_owned() });
    }
    Ok(())
}

/// Moves `source` (a topic directory, or the directory of `partition` of `topic`) into the
/// set-aside area, describing it first. Returns the entry. `set_aside_on` on the real file
/// system, for callers that do not pass one.
pub fn set_aside(
    data_dir: &Path,
    source: &Path,
    topic: &str,
    partition: Option<u32>,
    reason: &str,
    now_ms: i64,
) -> Result<SetAsideEntry, SetAsideError> {
    let fs = durable::real();
    set_aside_on(&*fs, data_dir, source, topic, partition, reason, now_ms)
}

/// [`set_aside`] on `fs`: the description is durable before the directory moves, so every
/// entry that has moved is described; when this returns `Ok`, the move is durable too.
pub(crate) fn set_aside_on(
    fs: &dyn FileSystem,
    data_dir: &Path,
    source: &Path,
    topic: &str,
    partition: Option<u32>,
    reason: &str,
    now_ms: i64,
) -> Result<SetAsideEntry, SetAsideError> {
    let area = dir(data_dir);
    fs.create_dir_all(&area)
        .map_err(io(format!("creating {}", area.display())))?;
    let stem = match partition {
        Some(p) => format!("{topic}.p{p:05}.{now_ms}"),
        None => format!("{topic}.{now_ms}"),
    };
    let mut id = stem.clone();
    let mut n = 1;
    let taken = |id: &str| -> Result<bool, SetAsideError> {
        let described = area.join(format!("{id}{DESCRIPTION_SUFFIX}"));
        for path in [area.join(id), described] {
            if fs
                .exists(&path)
                .map_err(io(format!("checking {}", path.display())))?
            {
                return Ok(true);
            }
        }
        Ok(false)
    };
    while taken(&id)? {
        id = format!("{stem}-{n}");
        n += 1;
    }
    let entry = SetAsideEntry {
        id: id.clone(),
        topic: topic.to_owned(),
        partition,
        reason: reason.to_owned(),
        set_aside_at_ms: now_ms,
        segment_bytes: segment_bytes(fs, source, partition)
            .map_err(io(format!("measuring {}", source.display())))?,
    };
    write_description(fs, &area, &entry)?;
    let target = area.join(&id);
    fs.rename(source, &target).map_err(io(format!(
        "moving {} to {}",
        source.display(),
        target.display()
    )))?;
    for d in [Some(area.as_path()), source.parent()]
        .into_iter()
        .flatten()
    {
        fs.sync_dir(d)
            .map_err(io(format!("syncing {}", d.display())))?;
    }
    Ok(entry)
}

fn write_description(
    fs: &dyn FileSystem,
    area: &Path,
    entry: &SetAsideEntry,
) -> Result<(), SetAsideError> {
    let name = format!("{}{DESCRIPTION_SUFFIX}", entry.id);
    let bytes = serde_json::to_vec_pretty(entry).map_err(|e| SetAsideError::Io {
        context: "encoding a set-aside description".to_owned(),
        source: std::io::Error::other(e),
    })?;
    narad_storage::fs::replace_file(fs, area, &name, &bytes)
        .map_err(io(format!("writing {}", area.join(&name).display())))
}

/// Every entry of the set-aside area, oldest first. A directory without a readable
/// description is listed with the reason saying so (it is never hidden). `list_on` on the
/// real file system, for callers that do not pass one.
pub fn list(data_dir: &Path) -> Result<Vec<SetAsideEntry>, SetAsideError> {
    list_on(&*durable::real(), data_dir)
}

/// [`list`] on `fs`.
pub(crate) fn list_on(
    fs: &dyn FileSystem,
    data_dir: &Path,
) -> Result<Vec<SetAsideEntry>, SetAsideError> {
    let area = dir(data_dir);
    let entries = match fs.read_dir(&area) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(SetAsideError::Io {
                context: format!("listing {}", area.display()),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        if !entry.is_dir || entry.name == PLUGINS_SUBDIR {
            continue;
        }
        out.push(describe(fs, &area, &entry.name));
    }
    out.sort_by(|a, b| (a.set_aside_at_ms, &a.id).cmp(&(b.set_aside_at_ms, &b.id)));
    Ok(out)
}

fn describe(fs: &dyn FileSystem, area: &Path, id: &str) -> SetAsideEntry {
    let path = area.join(format!("{id}{DESCRIPTION_SUFFIX}"));
    match durable::read_whole(fs, &path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<SetAsideEntry>(&b).map_err(|e| e.to_string()))
    {
        Ok(mut entry) => {
            entry.id = id.to_owned();
            entry
        }
        Err(why) => SetAsideEntry {
            id: id.to_owned(),
            topic: id.to_owned(),
            partition: None,
            reason: format!("no readable description ({why})"),
            set_aside_at_ms: 0,
            segment_bytes: segment_bytes(fs, &area.join(id), None).unwrap_or(0),
        },
    }
}

/// The entry named `id`. `get_on` on the real file system, for callers that do not pass
/// one.
pub fn get(data_dir: &Path, id: &str) -> Result<SetAsideEntry, SetAsideError> {
    get_on(&*durable::real(), data_dir, id)
}

/// [`get`] on `fs`.
pub(crate) fn get_on(
    fs: &dyn FileSystem,
    data_dir: &Path,
    id: &str,
) -> Result<SetAsideEntry, SetAsideError> {
    check_id(id)?;
    let area = dir(data_dir);
    if !is_dir(fs, &area.join(id)) {
        return Err(SetAsideError::UnknownEntry { id: id.to_owned() });
    }
    Ok(describe(fs, &area, id))
}

/// Moves the entry `id` back to `destination` (which must not exist) and drops its
/// description. The caller records it in the metastore. [`take_back_on`] on the real file
/// system, for callers that do not pass one.
pub(crate) fn take_back(
    data_dir: &Path,
    id: &str,
    destination: &Path,
) -> Result<(), SetAsideError> {
    take_back_on(&*durable::real(), data_dir, id, destination)
}

/// [`take_back`] on `fs`: the move is durable before the description goes, so an entry is
/// never left in the area undescribed.
pub(crate) fn take_back_on(
    fs: &dyn FileSystem,
    data_dir: &Path,
    id: &str,
    destination: &Path,
) -> Result<(), SetAsideError> {
    check_id(id)?;
    let area = dir(data_dir);
    let source = area.join(id);
    if !is_dir(fs, &source) {
        return Err(SetAsideError::UnknownEntry { id: id.to_owned() });
    }
    if let Some(parent) = destination.parent() {
        fs.create_dir_all(parent)
            .map_err(io(format!("creating {}", parent.display())))?;
    }
    fs.rename(&source, destination).map_err(io(format!(
        "moving {} to {}",
        source.display(),
        destination.display()
    )))?;
    for d in [Some(area.as_path()), destination.parent()]
        .into_iter()
        .flatten()
    {
        fs.sync_dir(d)
            .map_err(io(format!("syncing {}", d.display())))?;
    }
    remove_description(fs, &area, id)
}

/// Deletes the entry `id` and its records for good (the operator's explicit choice).
/// `purge_on` on the real file system, for callers that do not pass one.
pub fn purge(data_dir: &Path, id: &str) -> Result<SetAsideEntry, SetAsideError> {
    purge_on(&*durable::real(), data_dir, id)
}

/// [`purge`] on `fs`: the entry leaves the listing durably (one rename into the trash)
/// before anything of it is removed.
pub(crate) fn purge_on(
    fs: &dyn FileSystem,
    data_dir: &Path,
    id: &str,
) -> Result<SetAsideEntry, SetAsideError> {
    let entry = get_on(fs, data_dir, id)?;
    let area = dir(data_dir);
    let path = area.join(id);
    // Out of the listing first (one rename), so a crash mid-removal never shows half an entry;
    // the trash is emptied at every start.
    let trash = data_dir
        .join(narad_storage::store::TRASH_DIR_NAME)
        .join(format!("purged.{id}"));
    fs.rename(&path, &trash).map_err(io(format!(
        "moving {} to {}",
        path.display(),
        trash.display()
    )))?;
    fs.sync_dir(&area)
        .map_err(io(format!("syncing {}", area.display())))?;
    remove_description(fs, &area, id)?;
    fs.remove_dir_all(&trash)
        .map_err(io(format!("removing {}", trash.display())))?;
    Ok(entry)
}

fn remove_description(fs: &dyn FileSystem, area: &Path, id: &str) -> Result<(), SetAsideError> {
    let path = area.join(format!("{id}{DESCRIPTION_SUFFIX}"));
    match fs.remove_file(&path) {
        Ok(()) => fs
            .sync_dir(area)
            .map_err(io(format!("syncing {}", area.display()))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SetAsideError::Io {
            context: format!("removing {}", path.display()),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn partition_with_segment(dir: &Path, bytes: usize) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("00000000000000000000.log"), vec![7u8; bytes]).unwrap();
        fs::write(dir.join("high-watermark"), [0u8; 64]).unwrap();
    }

    #[test]
    fn a_set_aside_topic_keeps_every_byte_and_is_listed_until_taken_back() {
        let data = tempfile::tempdir().unwrap();
        fs::create_dir_all(data.path().join("trash")).unwrap();
        let topic = data.path().join("topics").join("orders");
        partition_with_segment(&topic.join("p00000"), 100);
        partition_with_segment(&topic.join("p00001"), 23);
        let entry = set_aside(data.path(), &topic, "orders", None, "unknown", 42).unwrap();
        assert_eq!(entry.id, "orders.42");
        assert_eq!(entry.segment_bytes, 123);
        assert!(!topic.exists());
        let moved = dir(data.path()).join("orders.42/p00000/00000000000000000000.log");
        assert_eq!(fs::read(moved).unwrap(), vec![7u8; 100]);
        assert_eq!(list(data.path()).unwrap(), vec![entry.clone()]);

        take_back(data.path(), "orders.42", &topic).unwrap();
        assert!(topic.join("p00001/00000000000000000000.log").exists());
        assert!(list(data.path()).unwrap().is_empty());
    }

    #[test]
    fn two_entries_of_one_name_at_one_instant_get_distinct_ids_and_purge_removes_one() {
        let data = tempfile::tempdir().unwrap();
        fs::create_dir_all(data.path().join("trash")).unwrap();
        let part = data.path().join("topics/orders/p00003");
        partition_with_segment(&part, 5);
        let a = set_aside(data.path(), &part, "orders", Some(3), "extra", 7).unwrap();
        partition_with_segment(&part, 6);
        let b = set_aside(data.path(), &part, "orders", Some(3), "extra", 7).unwrap();
        assert_eq!(a.id, "orders.p00003.7");
        assert_eq!(b.id, "orders.p00003.7-1");
        assert_eq!(list(data.path()).unwrap().len(), 2);
        purge(data.path(), &a.id).unwrap();
        assert_eq!(list(data.path()).unwrap(), vec![b]);
        assert!(matches!(
            purge(data.path(), &a.id),
            Err(SetAsideError::UnknownEntry { .. })
        ));
        assert!(matches!(
            get(data.path(), "../topics"),
            Err(SetAsideError::InvalidId { .. })
        ));
    }
}
