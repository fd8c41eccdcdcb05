//! The embedded metastore: a checksummed JSON snapshot, `{data_dir}/metastore.json`, and a
//! journal of the changes since it, `metastore.journal` ([`super::journal`]).
//!
//! Both files are [`super::frame`]s, so an operator can read them with any JSON tool. A change
//! appends one journal line and syncs it: what it costs follows the change, not the size of all
//! the metadata. Once the journal holds more bytes than the snapshot, the next change folds it
//! into a new snapshot (a compaction), so the work of rewriting the snapshot is spread over as
//! many bytes of changes as it writes.
//!
//! A compaction is the storage crate's durable replace
//! ([`narad_storage::fs::replace_file_with`]) with the backup step added:
//! 1. write the new snapshot to `metastore.json.tmp` and `fsync` it;
//! 2. hard-link the current `metastore.json` as `metastore.json.prev` (copied if the file system
//!    has no hard links);
//! 3. `rename` the temp file over `metastore.json` and `fsync` the directory;
//! 4. move the journal to `metastore.journal.prev` (or append it there, when the snapshot that
//!    just became the backup is older than the journal's first line), and `fsync` the directory.
//!
//! So `metastore.json.prev` followed by `metastore.journal.prev` and `metastore.journal` always
//! replays to the current state: restoring the backup over a damaged snapshot loses no change.
//! The first change in a new data dir writes an empty snapshot (and its backup) first, so a
//! journal never exists without a snapshot.
//!
//! Start-up ignores (and removes) a leftover temp file, which is by construction an unfinished
//! write; replays both journals on the snapshot (each line whose number is the next one; a gap
//! is corrupt); and sets aside a journal's tail that is not a whole valid line (an append a
//! crash interrupted) in `metastore.journal.torn.<seq>-<ms>` before cutting it off. A snapshot
//! that fails its checks stops start-up with an error naming the file and the backup to
//! restore.
//!
//! Every file operation goes through the storage crate's [`FileSystem`] seam ([`RealFs`] from
//! [`FileMetastore::open`]), so the tests crash these write paths at every step with
//! `narad_storage::fault::FaultFs` (feature `test-support`), as the log's are.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use narad_storage::fs::{File, FileSystem, OpenMode, RealFs};

use serde::{Deserialize, Serialize};

use super::journal::{self, Entry, Touched};
use super::transition::{self, Change, Outcome};
use super::{
    BoxFuture, LinkMeta, LinkTopics, Metastore, MetastoreError, PluginVersion, Result, Snapshot,
    TopicMeta, UserMeta, Versions, frame,
};

/// File name of the metastore snapshot inside the data dir.
pub(crate) const FILE_NAME: &str = "metastore.json";
/// File name of the snapshot before the last compaction, kept for recovery.
pub(crate) const BACKUP_FILE_NAME: &str = "metastore.json.prev";
/// File name of an in-progress snapshot write.
pub(crate) const TEMP_FILE_NAME: &str = "metastore.json.tmp";
/// Highest snapshot format this binary reads and the one it writes. Format 2 added the
/// journal: a format-1 binary would ignore it, so it must refuse a format-2 snapshot.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The journal is folded into a new snapshot once it is larger than the snapshot and than
/// this: small metadata is not rewritten on every few changes.
pub(crate) const COMPACT_MIN_BYTES: u64 = 64 * 1024;
/// The frame field of the snapshot.
const FIELD: &str = "state";

/// What the snapshot's `state` holds. Do not rename or remove fields: older files must still
/// parse. New fields are added with `#[serde(default)]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    format: u32,
    versions: Versions,
    /// The number of the last journaled change this snapshot contains (0 in format 1).
    #[serde(default)]
    journal_seq: u64,
    topics: BTreeMap<String, TopicMeta>,
    /// Links, sorted by (parent, child). A list because JSON maps need string keys.
    #[serde(default)]
    links: Vec<LinkMeta>,
    /// Uploaded plugin versions, oldest first.
    #[serde(default)]
    plugins: Vec<PluginVersion>,
    /// Users, by name.
    #[serde(default)]
    users: BTreeMap<String, UserMeta>,
    /// ACL rules, sorted.
    #[serde(default)]
    acls: Vec<crate::acl::AclRule>,
}

/// [`State`] as it is written, borrowing the committed state instead of copying it.
#[derive(Serialize)]
struct StateRef<'a> {
    format: u32,
    versions: Versions,
    journal_seq: u64,
    topics: &'a super::Items<String, TopicMeta>,
    links: Vec<&'a LinkMeta>,
    plugins: &'a [PluginVersion],
    #[serde(skip_serializing_if = "super::Items::is_empty")]
    users: &'a super::Items<String, UserMeta>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    acls: &'a [crate::acl::AclRule],
}

impl State {
    fn into_snapshot(self) -> Snapshot {
        Snapshot {
            versions: self.versions,
            topics: self.topics.into(),
            links: self
                .links
                .into_iter()
                .map(|l| ((l.parent.clone(), l.child.clone()), l))
                .collect(),
            plugins: self.plugins,
            users: self.users.into(),
            acls: self.acls,
        }
    }
}

/// The embedded, single-node [`Metastore`]: a checksummed JSON snapshot and a journal of the
/// changes since it.
#[derive(Debug, Clone)]
pub struct FileMetastore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Where every read and write of the files goes.
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    /// The committed state; locked only briefly (to read, or to swap in a durable new state),
    /// so readers on async threads never wait for an fsync.
    state: Mutex<Snapshot>,
    /// Held across a whole write (apply, persist, swap) so writes apply one at a time and
    /// readers never see a state that is not yet durable.
    writer: Mutex<Writer>,
    /// No metastore file (and no backup) existed when this one was opened.
    started_empty: bool,
    /// See [`COMPACT_MIN_BYTES`]; smaller in tests, to compact often.
    compact_min_bytes: u64,
}

/// The writer's side: a second copy of the state that each change is applied to first, and
/// what the files on disk hold.
struct Writer {
    /// Equal to the committed state between writes. A change is applied here, persisted, then
    /// swapped in (so the committed state is never copied whole), and replayed here from its
    /// journal entry to catch up.
    scratch: Snapshot,
    /// The number of the last committed change.
    seq: u64,
    /// The `journal_seq` of the snapshot on disk; `None` before the first one is written.
    snapshot_seq: Option<u64>,
    /// The snapshot's size in bytes.
    snapshot_bytes: u64,
    /// The snapshot must be rewritten before the next journal line: there is none yet, it is
    /// of an older format, or a write to the journal or a compaction failed.
    compact_first: bool,
    /// The journal, opened at the first append.
    journal: Option<Box<dyn File>>,
    /// Bytes of whole, committed lines in the journal: where the next line goes.
    journal_len: u64,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("seq", &self.seq)
            .field("snapshot_seq", &self.snapshot_seq)
            .field("journal_len", &self.journal_len)
            .finish_non_exhaustive()
    }
}

impl FileMetastore {
    /// Opens the metastore in `dir` (which must exist), creating an empty one when the
    /// directory has none. Fails when the snapshot or a journal is corrupt, when the snapshot
    /// is missing while its backup or a journal exists, or when it is of a newer format.
    pub fn open(dir: &Path) -> Result<FileMetastore> {
        FileMetastore::open_on(Arc::new(RealFs), dir)
    }

    /// [`FileMetastore::open`] on the file system `fs` (the real one, or a fault-injecting one
    /// in tests); `dir` is a path on `fs`.
    pub(crate) fn open_on(fs: Arc<dyn FileSystem>, dir: &Path) -> Result<FileMetastore> {
        FileMetastore::open_with(fs, dir, COMPACT_MIN_BYTES)
    }

    /// [`FileMetastore::open_on`] compacting once the journal is larger than the snapshot
    /// and than `compact_min_bytes`.
    fn open_with(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        compact_min_bytes: u64,
    ) -> Result<FileMetastore> {
        let path = dir.join(FILE_NAME);
        let backup = dir.join(BACKUP_FILE_NAME);
        let io = |context: String| move |source| MetastoreError::Io { context, source };
        // Each file written whole is written to `{name}.tmp` first: one left over is an
        // unfinished write, by construction not yet part of the committed state.
        for name in [FILE_NAME, BACKUP_FILE_NAME, journal::BACKUP_FILE_NAME] {
            let temp = narad_storage::fs::replace_temp_path(dir, name);
            match fs.remove_file(&temp) {
                Ok(()) => tracing::warn!(
                    path = %temp.display(),
                    "removed an unfinished metastore write left by a crash; the committed state is unaffected"
                ),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(io(format!("removing leftover {}", temp.display()))(source));
                }
            }
        }
        let journals = [
            dir.join(journal::BACKUP_FILE_NAME),
            dir.join(journal::FILE_NAME),
        ];
        let mut started_empty = false;
        let mut snapshot_bytes = 0;
        let state = match read_all(fs.as_ref(), &path) {
            Ok(bytes) => {
                snapshot_bytes = bytes.len() as u64;
                match decode(&path, &bytes) {
                    Ok(state) => state,
                    Err(MetastoreError::Corrupt { path, reason, .. }) => {
                        let good_backup = read_all(fs.as_ref(), &backup)
                            .ok()
                            .filter(|b| decode(&backup, b).is_ok())
                            .map(|_| backup.clone());
                        return Err(MetastoreError::Corrupt {
                            path,
                            reason,
                            backup: good_backup,
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let exists = |p: &Path| {
                    fs.exists(p)
                        .map_err(io(format!("looking for {}", p.display())))
                };
                if exists(&backup)? {
                    return Err(MetastoreError::Missing { path, backup });
                }
                for journal in &journals {
                    if exists(journal)? {
                        return Err(MetastoreError::JournalWithoutSnapshot {
                            path,
                            journal: journal.clone(),
                        });
                    }
                }
                started_empty = true;
                State {
                    format: FORMAT_VERSION,
                    ..State::default()
                }
            }
            Err(source) => return Err(io(format!("reading {}", path.display()))(source)),
        };
        let format_current = state.format == FORMAT_VERSION;
        let snapshot_seq = state.journal_seq;
        let mut committed = state.into_snapshot();
        let mut seq = snapshot_seq;
        let mut journal_len = 0;
        for (i, journal_path) in journals.iter().enumerate() {
            let current = i + 1 == journals.len();
            let parsed = match read_all(fs.as_ref(), journal_path) {
                Ok(bytes) => journal::parse(journal_path, &bytes)?,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(io(format!("reading {}", journal_path.display()))(source));
                }
            };
            for entry in &parsed.entries {
                if entry.seq <= seq {
                    // Already in the snapshot, or a copy left by an interrupted compaction.
                    continue;
                }
                if entry.seq != seq + 1 {
                    return Err(MetastoreError::Corrupt {
                        path: journal_path.clone(),
                        reason: format!(
                            "the journal goes on at change {} but the state read so far ends at \
                             change {seq}: changes in between are missing",
                            entry.seq
                        ),
                        backup: None,
                    });
                }
                entry.apply_to(&mut committed);
                seq = entry.seq;
            }
            if !parsed.tail.is_empty() {
                set_aside_tail(fs.as_ref(), dir, journal_path, &parsed, seq)?;
            }
            if current {
                journal_len = parsed.valid_len;
            }
        }
        Ok(FileMetastore {
            inner: Arc::new(Inner {
                fs,
                dir: dir.to_path_buf(),
                state: Mutex::new(committed.clone()),
                writer: Mutex::new(Writer {
                    scratch: committed,
                    seq,
                    snapshot_seq: (!started_empty).then_some(snapshot_seq),
                    snapshot_bytes,
                    compact_first: started_empty || !format_current,
                    journal: None,
                    journal_len,
                }),
                started_empty,
                compact_min_bytes,
            }),
        })
    }

    /// True when the data dir had no metastore file (and no backup) at open: a new data dir,
    /// or one whose metastore was lost. Start-up tells the two apart by what `topics/` holds.
    pub(crate) fn started_empty(&self) -> bool {
        self.inner.started_empty
    }

    /// Path of the metastore snapshot.
    pub fn path(&self) -> PathBuf {
        self.inner.dir.join(FILE_NAME)
    }

    /// The committed state, synchronously (start-up wiring uses it before the runtime serves).
    pub(crate) fn snapshot_now(&self) -> Snapshot {
        self.inner.lock().clone()
    }

    /// Applies `change` ([`super::transition::apply`]) and, when it changed anything, journals
    /// it and makes it current. Blocking (fsyncs): runs on the blocking pool.
    fn update(&self, change: Change) -> BoxFuture<'_, Result<Outcome>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            crate::blocking::run(move || inner.update(change))
                .await
                .map_err(|e| MetastoreError::Task(e.to_string()))?
        })
    }
}

/// Copies the bytes after the last valid line of the journal at `path` to a file of their
/// own, then cuts them off, so that the next append follows a whole line and nothing is
/// thrown away unseen.
fn set_aside_tail(
    fs: &dyn FileSystem,
    dir: &Path,
    path: &Path,
    parsed: &journal::Parsed,
    seq: u64,
) -> Result<()> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let kept = journal::torn_path(dir, seq, now_ms);
    let io = |context: String| move |source| MetastoreError::Io { context, source };
    let copy = fs
        .open(&kept, OpenMode::CreateNew)
        .map_err(io(format!("creating {}", kept.display())))?;
    copy.write_all_at(&parsed.tail, 0)
        .and_then(|()| copy.sync_data())
        .map_err(io(format!("writing {}", kept.display())))?;
    fs.sync_dir(dir)
        .map_err(io(format!("syncing {}", dir.display())))?;
    let file = fs
        .open(path, OpenMode::ReadWrite)
        .map_err(io(format!("opening {}", path.display())))?;
    file.set_len(parsed.valid_len)
        .and_then(|()| file.sync_data())
        .map_err(io(format!("cutting the tail off {}", path.display())))?;
    tracing::warn!(
        journal = %path.display(),
        bytes = parsed.tail.len(),
        kept = %kept.display(),
        "the metastore journal ended in a partial line (an append a crash interrupted, never \
         acknowledged); its bytes are set aside and the journal goes on after the last whole line"
    );
    Ok(())
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Snapshot> {
        // A panic while holding the lock happens before the swap, so the state is intact.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The link `parent -> child` and its two topics in the committed state, copied.
    fn link_view(&self, parent: &str, child: &str) -> Option<LinkTopics> {
        LinkTopics::find_in(&self.lock(), parent, child)
    }

    fn update(&self, change: Change) -> Result<Outcome> {
        let mut guard = self
            .writer
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let w = &mut *guard;
        if w.compact_first {
            self.compact(w)?;
        }
        let touched = Touched::of(&change, &w.scratch);
        let (outcome, changed) = match transition::apply_in_place(&mut w.scratch, change) {
            Ok(applied) => applied,
            Err(e) => {
                // A refused change may have been partly applied to the scratch copy.
                w.scratch = self.lock().clone();
                return Err(e);
            }
        };
        if !changed {
            debug_assert!(w.scratch == *self.lock(), "a no-op changed the state");
            return Ok(outcome);
        }
        let seq = w.seq + 1;
        let entry = Entry::record(seq, &touched, &w.scratch);
        if let Err(e) = entry.encode().and_then(|line| self.append(w, &line)) {
            w.scratch = self.lock().clone();
            // The line may be on disk in part, or whole but not durable: the next write
            // starts from a fresh snapshot instead of appending after it.
            w.compact_first = true;
            return Err(e);
        }
        w.seq = seq;
        std::mem::swap(&mut *self.lock(), &mut w.scratch);
        let missed_a_key = self.catch_up(w, &entry);
        debug_assert!(
            !missed_a_key && w.scratch == *self.lock(),
            "journal entry {seq} does not reproduce its change: {entry:?}"
        );
        if (missed_a_key || w.journal_len > w.snapshot_bytes.max(self.compact_min_bytes))
            && let Err(e) = self.compact(w)
        {
            // The change is durable in the journal; the next write tries again first.
            tracing::warn!(
                error = %e,
                "compacting the metastore journal failed; the next metadata change tries again"
            );
            w.compact_first = true;
        }
        Ok(outcome)
    }

    /// Brings the scratch copy (the state before the change just swapped out) up to the
    /// committed state by replaying `entry`, and checks it got there, at a cost that does not
    /// grow with the metadata: same versions, as many topics, links and plugins. An entry
    /// that missed a key the change added or removed would replay to another state after a
    /// restart; then the scratch copy is replaced by the committed state and `true` comes
    /// back, so the caller writes the full state as a snapshot at once and the change is not
    /// lost with the entry.
    fn catch_up(&self, w: &mut Writer, entry: &Entry) -> bool {
        entry.apply_to(&mut w.scratch);
        let live = self.lock();
        if same_counts(&w.scratch, &live) {
            return false;
        }
        tracing::error!(
            seq = entry.seq,
            "a metastore journal entry does not reproduce its change (a bug); writing a full snapshot now"
        );
        w.scratch = live.clone();
        true
    }

    /// Appends one journal line and syncs it.
    fn append(&self, w: &mut Writer, line: &[u8]) -> Result<()> {
        let path = self.dir.join(journal::FILE_NAME);
        let io = |source| MetastoreError::Io {
            context: format!("appending to {}", path.display()),
            source,
        };
        let file = match w.journal.take() {
            Some(file) => file,
            None => {
                let existed = self.fs.exists(&path).map_err(io)?;
                let file = self.fs.open(&path, OpenMode::CreateReadWrite).map_err(io)?;
                if !existed {
                    // The new name must survive a power cut before a line in it is
                    // acknowledged.
                    self.fs.sync_dir(&self.dir).map_err(io)?;
                }
                file
            }
        };
        // Positional: a line a failed append left behind is overwritten, never followed.
        let written = file
            .write_all_at(line, w.journal_len)
            .and_then(|()| file.sync_data());
        w.journal = Some(file);
        written.map_err(io)?;
        w.journal_len += line.len() as u64;
        Ok(())
    }

    /// Writes the committed state (the scratch copy, equal to it between writes) as the new
    /// snapshot, keeping the old one as the backup, and moves the journal behind the backup.
    fn compact(&self, w: &mut Writer) -> Result<()> {
        let bytes = encode(&w.scratch, w.seq)?;
        let path = self.dir.join(FILE_NAME);
        let backup = self.dir.join(BACKUP_FILE_NAME);
        let io = |context: String| move |source| MetastoreError::Io { context, source };
        // Owner-only whatever the umask (the seam creates files 0600): link configs may hold
        // plugin secrets. The backup is a hard link or a copy made through the seam, so it has
        // the same mode.
        narad_storage::fs::replace_file_with(self.fs.as_ref(), &self.dir, FILE_NAME, &bytes, || {
            self.keep_backup(&path, &backup)
        })
        .map_err(io(format!(
            "replacing {} (via {TEMP_FILE_NAME}, keeping the previous snapshot as {BACKUP_FILE_NAME})",
            path.display()
        )))?;
        // The snapshot that is the backup now, and the last change it holds.
        let backup_seq = match w.snapshot_seq {
            Some(seq) => seq,
            None => {
                // The first snapshot is its own backup, so one always exists beside it: a
                // copy of its own, not a link, so that damage to one file is not in both.
                narad_storage::fs::replace_file_with(
                    self.fs.as_ref(),
                    &self.dir,
                    BACKUP_FILE_NAME,
                    &bytes,
                    || Ok(()),
                )
                .map_err(io(format!("writing {}", backup.display())))?;
                w.seq
            }
        };
        w.snapshot_seq = Some(w.seq);
        w.snapshot_bytes = bytes.len() as u64;
        self.rotate_journal(w, backup_seq)?;
        w.compact_first = false;
        Ok(())
    }

    /// Makes `metastore.journal.prev` hold every change after `backup_seq` up to the new
    /// snapshot, and starts an empty journal.
    ///
    /// The older journal is written whole through the durable replace rather than renamed: a
    /// crash in a rename to a new name may, on some file systems, keep neither name, and the
    /// journal's lines must exist under one name or the other at every step. The journal is
    /// removed only once its lines are durable in the older one.
    fn rotate_journal(&self, w: &mut Writer, backup_seq: u64) -> Result<()> {
        let path = self.dir.join(journal::FILE_NAME);
        let io = |context: String| move |source| MetastoreError::Io { context, source };
        w.journal = None;
        let bytes = match read_all(self.fs.as_ref(), &path) {
            Ok(bytes) => bytes,
            // An earlier rotation removed it and failed after.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                w.journal_len = 0;
                return Ok(());
            }
            Err(source) => return Err(io(format!("reading {}", path.display()))(source)),
        };
        // Only whole committed lines move; bytes past them are a failed append's.
        let len = usize::try_from(w.journal_len)
            .unwrap_or(bytes.len())
            .min(bytes.len());
        let committed = &bytes[..len];
        let first_seq = journal::parse(&path, committed)?
            .entries
            .first()
            .map(|e| e.seq);
        if let Some(first) = first_seq {
            let prev = self.dir.join(journal::BACKUP_FILE_NAME);
            let mut older = Vec::new();
            if first > backup_seq + 1 {
                // The backup is older than this journal (start-up replayed the older journal
                // on a restored backup): the older journal keeps its lines, this one follows.
                match read_all(self.fs.as_ref(), &prev) {
                    Ok(old) => {
                        let keep = journal::parse(&prev, &old)?.valid_len;
                        older = old;
                        older.truncate(usize::try_from(keep).unwrap_or(older.len()));
                    }
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(io(format!("reading {}", prev.display()))(source));
                    }
                }
            }
            older.extend_from_slice(committed);
            narad_storage::fs::replace_file_with(
                self.fs.as_ref(),
                &self.dir,
                journal::BACKUP_FILE_NAME,
                &older,
                || Ok(()),
            )
            .map_err(io(format!("writing {}", prev.display())))?;
        }
        self.fs
            .remove_file(&path)
            .and_then(|()| self.fs.sync_dir(&self.dir))
            .map_err(io(format!("removing {}", path.display())))?;
        w.journal_len = 0;
        Ok(())
    }

    /// Makes `backup` name the current file's contents (the previous good state once the new
    /// file is renamed over it): a hard link, or a synced copy where the file system has none.
    fn keep_backup(&self, path: &Path, backup: &Path) -> std::io::Result<()> {
        let fs = self.fs.as_ref();
        if !fs.exists(path)? {
            return Ok(());
        }
        match fs.remove_file(backup) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if fs.hard_link(path, backup).is_err() {
            // No hard links here (some network or FUSE file systems): copy instead.
            let bytes = read_all(fs, path)?;
            let file = fs.open(backup, OpenMode::CreateReadWrite)?;
            file.set_len(0)?;
            file.write_all_at(&bytes, 0)?;
            file.sync_data()?;
        }
        Ok(())
    }
}

/// Whether `a` and `b` have the same versions and as many topics, links and plugins: what a
/// replayed journal entry must at least give, checked without comparing every value.
fn same_counts(a: &Snapshot, b: &Snapshot) -> bool {
    a.versions == b.versions
        && a.topics.len() == b.topics.len()
        && a.links.len() == b.links.len()
        && a.plugins.len() == b.plugins.len()
        && a.users.len() == b.users.len()
        && a.acls.len() == b.acls.len()
}

/// The whole contents of `path` on `fs`.
fn read_all(fs: &dyn FileSystem, path: &Path) -> std::io::Result<Vec<u8>> {
    let file = fs.open(path, OpenMode::Read)?;
    let len = usize::try_from(file.len()?).map_err(|_| {
        std::io::Error::new(ErrorKind::InvalidData, "file too large for this platform")
    })?;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

/// The snapshot file of `state`, holding the changes up to `journal_seq`.
fn encode(state: &Snapshot, journal_seq: u64) -> Result<Vec<u8>> {
    let body = serde_json::to_vec(&StateRef {
        format: FORMAT_VERSION,
        versions: state.versions,
        journal_seq,
        topics: &state.topics,
        // The map is ordered by (parent, child): the list stays sorted.
        links: state.links.values().collect(),
        plugins: &state.plugins,
        users: &state.users,
        acls: &state.acls,
    })
    .map_err(|e| MetastoreError::Io {
        context: "encoding the metastore state".to_owned(),
        source: std::io::Error::other(e),
    })?;
    Ok(frame::encode(FIELD, &body))
}

fn decode(path: &Path, bytes: &[u8]) -> Result<State> {
    let corrupt = |reason: String| MetastoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
        backup: None,
    };
    let body = frame::decode(FIELD, bytes).map_err(|e| corrupt(e.to_string()))?;
    // Read the format first so a newer file is reported as such, not as unknown fields.
    #[derive(Deserialize)]
    struct FormatOnly {
        format: u32,
    }
    let format: FormatOnly =
        serde_json::from_slice(body).map_err(|e| corrupt(format!("state does not parse: {e}")))?;
    if format.format > FORMAT_VERSION {
        return Err(MetastoreError::UnsupportedFormat {
            path: path.to_path_buf(),
            found: format.format,
            supported: FORMAT_VERSION,
        });
    }
    serde_json::from_slice(body).map_err(|e| corrupt(format!("state does not parse: {e}")))
}

impl Metastore for FileMetastore {
    fn snapshot(&self) -> BoxFuture<'_, Result<Snapshot>> {
        let snap = self.snapshot_now();
        Box::pin(async move { Ok(snap) })
    }

    fn links_snapshot(&self) -> BoxFuture<'_, Result<Snapshot>> {
        let snap = self.inner.lock().linked_copy();
        Box::pin(async move { Ok(snap) })
    }

    fn confirm(&self) -> BoxFuture<'_, Result<Snapshot>> {
        // One node, one writer: the in-memory state is swapped in, after the write is durable
        // and before the write returns, so it already reflects every acknowledged write.
        self.snapshot()
    }

    fn versions(&self) -> BoxFuture<'_, Result<Versions>> {
        let versions = self.inner.lock().versions;
        Box::pin(async move { Ok(versions) })
    }

    fn topic<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<TopicMeta>>> {
        let topic = self.inner.lock().topics.get(name).cloned();
        Box::pin(async move { Ok(topic) })
    }

    fn user<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<UserMeta>>> {
        let user = self.inner.lock().users.get(name).cloned();
        Box::pin(async move { Ok(user) })
    }

    fn acls(&self) -> BoxFuture<'_, Result<Vec<crate::acl::AclRule>>> {
        let acls = self.inner.lock().acls.clone();
        Box::pin(async move { Ok(acls) })
    }

    fn link_view<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
    ) -> BoxFuture<'a, Result<Option<LinkTopics>>> {
        // Three map lookups under the lock and a copy of what they find: what a cursor pays
        // per slab does not grow with the rest of the metadata (a snapshot copies all of it).
        let found = self.inner.link_view(parent, child);
        Box::pin(async move { Ok(found) })
    }

    fn parents_of<'a>(&'a self, child: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        // A scan of the links under the lock, no copy of the rest of the metadata.
        let parents = super::parents_in(&self.inner.lock(), child);
        Box::pin(async move { Ok(parents) })
    }

    fn apply(&self, change: Change) -> BoxFuture<'_, Result<Outcome>> {
        self.update(change)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn topic(name: &str, partitions: u32) -> TopicMeta {
        TopicMeta {
            writable_as_child: false,
            name: name.to_owned(),
            partitions,
            retention_ms: Some(3_600_000),
            retention_bytes: None,
            created_at_ms: 1_700_000_000_000,
            owners: Vec::new(),
        }
    }

    #[tokio::test]
    async fn the_file_backend_passes_the_metastore_conformance_suite_and_keeps_it_across_a_reopen()
    {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        crate::metastore::conformance::run(&store).await;
        let before = store.snapshot().await.unwrap();
        drop(store);
        let reopened = FileMetastore::open(dir.path()).unwrap();
        assert_eq!(reopened.snapshot().await.unwrap(), before);
    }

    /// The `i`-th write of the crash test's sequence; each one changes the state.
    async fn crash_test_write(store: &FileMetastore, i: usize) -> Result<()> {
        match i {
            0 => store.create_topic(topic("orders", 2)).await.map(drop),
            1 => store.create_topic(topic("audit", 1)).await.map(drop),
            2 => store.grow_partitions("orders", 4).await.map(drop),
            3 => store.delete_topic("audit", true).await.map(drop),
            4 => store.create_topic(topic("billing", 3)).await.map(drop),
            5 => store.grow_partitions("billing", 5).await.map(drop),
            6 => store.create_topic(topic("audit", 2)).await.map(drop),
            _ => store.delete_topic("orders", true).await.map(drop),
        }
    }

    const CRASH_TEST_WRITES: usize = 8;

    /// Opens the store compacting whenever the journal outgrows the snapshot, which for
    /// these small states is every second or third change: the crash test covers the
    /// compaction's steps as well as the appends.
    fn open_compacting(fs: &narad_storage::fault::FaultFs, dir: &Path) -> Result<FileMetastore> {
        FileMetastore::open_with(Arc::new(fs.clone()), dir, 0)
    }

    /// What restoring the backup over the snapshot (the recovery advice) gives, through a
    /// reopen; `None` when there is no backup.
    fn state_from_backup(
        fs: &narad_storage::fault::FaultFs,
        dir: &Path,
        context: &str,
    ) -> Option<Snapshot> {
        let backup = dir.join(BACKUP_FILE_NAME);
        if !fs.exists(&backup).unwrap() {
            return None;
        }
        let bytes = fs.contents(&backup).unwrap();
        let file = fs
            .open(&dir.join(FILE_NAME), OpenMode::CreateReadWrite)
            .unwrap();
        file.set_len(0).unwrap();
        file.write_all_at(&bytes, 0).unwrap();
        file.sync_data().unwrap();
        let listing = |name: &str| {
            fs.contents(&dir.join(name))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let store = open_compacting(fs, dir).unwrap_or_else(|e| {
            panic!(
                "{context}: reopening on the backup: {e}\nbackup: {}\njournal.prev: {}",
                listing(BACKUP_FILE_NAME),
                listing(journal::BACKUP_FILE_NAME)
            )
        });
        Some(store.snapshot_now())
    }

    #[tokio::test]
    async fn a_crash_at_any_step_of_a_write_reopens_to_the_state_before_or_after_that_write() {
        use narad_storage::fault::{CrashMode, FaultFs};

        let dir = Path::new("/data");
        let fresh = || {
            let fs = FaultFs::new();
            fs.create_dir_all(dir).unwrap();
            fs.sync_dir(Path::new("/")).unwrap();
            fs
        };
        // The states a run without faults goes through: expected[i] is the state before
        // write i, expected[i + 1] the state after it.
        let reference = open_compacting(&fresh(), dir).unwrap();
        let mut expected = vec![reference.snapshot_now()];
        for i in 0..CRASH_TEST_WRITES {
            crash_test_write(&reference, i).await.unwrap();
            expected.push(reference.snapshot_now());
        }

        let modes = CrashMode::SAMPLE;
        let mut crash_point = 1;
        'points: loop {
            for mode in modes {
                let fs = fresh();
                let store = open_compacting(&fs, dir).unwrap();
                fs.crash_at(crash_point);
                let mut in_progress = None;
                for i in 0..CRASH_TEST_WRITES {
                    if let Err(e) = crash_test_write(&store, i).await {
                        assert!(fs.is_crashed(), "write {i} failed without a crash: {e}");
                        assert!(matches!(e, MetastoreError::Io { .. }), "{e:?}");
                        in_progress = Some(i);
                        break;
                    }
                    assert_eq!(store.snapshot_now(), expected[i + 1]);
                }
                let Some(i) = in_progress else {
                    // The whole sequence ran before the crash point: every step was covered.
                    break 'points;
                };
                drop(store);
                fs.crash(mode);

                let context = format!("crash at operation {crash_point} ({mode:?}), write {i}");
                let reopened = open_compacting(&fs, dir)
                    .unwrap_or_else(|e| panic!("{context}: reopening failed: {e}"));
                let got = reopened.snapshot_now();
                assert!(
                    got == expected[i] || got == expected[i + 1],
                    "{context}: reopened to {got:?}"
                );
                // The backup, when there is one, is a whole earlier state too.
                let backup = dir.join(BACKUP_FILE_NAME);
                if fs.exists(&backup).unwrap() {
                    let bytes = fs.contents(&backup).unwrap();
                    let state = decode(&backup, &bytes)
                        .unwrap_or_else(|e| panic!("{context}: backup: {e}"))
                        .into_snapshot();
                    assert!(
                        expected[..=i].contains(&state),
                        "{context}: backup {state:?}"
                    );
                }
                // And the reopened store takes writes again.
                reopened
                    .create_topic(topic("after-the-crash", 1))
                    .await
                    .unwrap_or_else(|e| panic!("{context}: writing after the reopen: {e}"));
                drop(reopened);
                let again = open_compacting(&fs, dir).unwrap().snapshot_now();
                assert!(again.topics.contains_key("after-the-crash"), "{context}");
                // And restoring the backup, the advice for a damaged snapshot, loses nothing:
                // the journals replay every change made since it.
                if let Some(restored) = state_from_backup(&fs, dir, &context) {
                    assert_eq!(restored, again, "{context}: restored from the backup");
                }
            }
            crash_point += 1;
        }
        assert!(
            crash_point > 40,
            "the sequence has more steps than {crash_point}"
        );
    }

    #[tokio::test]
    async fn topics_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        store.create_topic(topic("orders", 4)).await.unwrap();
        store.create_topic(topic("audit", 1)).await.unwrap();
        store.grow_partitions("orders", 6).await.unwrap();
        store.delete_topic("audit", true).await.unwrap();
        let before = store.snapshot().await.unwrap();
        drop(store);

        let reopened = FileMetastore::open(dir.path()).unwrap();
        let after = reopened.snapshot().await.unwrap();
        assert_eq!(before, after);
        assert_eq!(after.topics["orders"].partitions, 6);
        assert!(!after.topics.contains_key("audit"));
        assert_eq!(after.versions.topics, 4);
    }

    #[tokio::test]
    async fn corrupt_file_is_reported_with_the_backup_to_restore() {
        let dir = tempfile::tempdir().unwrap();
        // Compacting at every change, so the snapshot holds both topics and the backup holds
        // only the first.
        let store = FileMetastore::open_with(Arc::new(RealFs), dir.path(), 0).unwrap();
        store.create_topic(topic("orders", 2)).await.unwrap();
        store.create_topic(topic("audit", 2)).await.unwrap();
        drop(store);

        let path = dir.path().join(FILE_NAME);
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() - 10;
        bytes[at] ^= 0x01;
        fs::write(&path, &bytes).unwrap();

        let err = FileMetastore::open(dir.path()).unwrap_err();
        let MetastoreError::Corrupt {
            path: bad, backup, ..
        } = &err
        else {
            panic!("expected Corrupt, got {err:?}");
        };
        assert_eq!(bad, &path);
        assert_eq!(
            backup.as_deref(),
            Some(dir.path().join(BACKUP_FILE_NAME).as_path())
        );
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");

        // Following the advice loses no change: the backup and the journals replay them all.
        fs::copy(dir.path().join(BACKUP_FILE_NAME), &path).unwrap();
        let restored = reopened(dir.path());
        assert!(restored.topics.contains_key("orders"));
        assert!(restored.topics.contains_key("audit"));
    }

    #[test]
    fn truncated_file_is_corrupt_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let state = Snapshot {
            versions: Versions {
                topics: 1,
                ..Versions::default()
            },
            topics: BTreeMap::from([("orders".to_owned(), topic("orders", 1))]).into(),
            ..Snapshot::default()
        };
        let bytes = encode(&state, 1).unwrap();
        for cut in [0, 5, bytes.len() / 2, bytes.len() - 1] {
            fs::write(dir.path().join(FILE_NAME), &bytes[..cut]).unwrap();
            assert!(
                matches!(
                    FileMetastore::open(dir.path()),
                    Err(MetastoreError::Corrupt { .. })
                ),
                "cut at {cut}"
            );
        }
    }

    #[tokio::test]
    async fn half_written_temp_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        store.create_topic(topic("orders", 2)).await.unwrap();
        let committed = store.snapshot_now();
        drop(store);

        fs::write(dir.path().join(TEMP_FILE_NAME), b"{\"crc32c\":\"0000").unwrap();
        let reopened = FileMetastore::open(dir.path()).unwrap();
        assert_eq!(reopened.snapshot_now(), committed);
        assert!(!dir.path().join(TEMP_FILE_NAME).exists());
    }

    #[tokio::test]
    async fn missing_file_with_a_backup_refuses_to_start_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        store.create_topic(topic("orders", 2)).await.unwrap();
        store.create_topic(topic("audit", 2)).await.unwrap();
        drop(store);
        fs::remove_file(dir.path().join(FILE_NAME)).unwrap();
        assert!(matches!(
            FileMetastore::open(dir.path()),
            Err(MetastoreError::Missing { .. })
        ));
    }

    #[test]
    fn newer_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let body = format!(
            r#"{{"format":{},"versions":{{"topics":0,"links":0,"plugins":0}},"topics":{{}}}}"#,
            FORMAT_VERSION + 1
        );
        fs::write(
            dir.path().join(FILE_NAME),
            frame::encode(FIELD, body.as_bytes()),
        )
        .unwrap();
        assert!(matches!(
            FileMetastore::open(dir.path()),
            Err(MetastoreError::UnsupportedFormat { .. })
        ));
    }

    #[test]
    fn file_is_plain_json() {
        let state = Snapshot {
            topics: BTreeMap::from([("orders".to_owned(), topic("orders", 1))]).into(),
            ..Snapshot::default()
        };
        let bytes = encode(&state, 0).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["state"]["topics"]["orders"]["partitions"], 1);
    }

    fn journal(dir: &Path) -> PathBuf {
        dir.join(journal::FILE_NAME)
    }

    /// The state a fresh open of the metastore in `dir` reads.
    fn reopened(dir: &Path) -> Snapshot {
        FileMetastore::open(dir).unwrap().snapshot_now()
    }

    #[tokio::test]
    async fn a_change_appends_one_journal_line_and_leaves_the_snapshot_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        for i in 0..50 {
            store
                .create_topic(topic(&format!("topic-{i:03}"), 12))
                .await
                .unwrap();
        }
        let snapshot = fs::read(dir.path().join(FILE_NAME)).unwrap();
        let lines = fs::read(journal(dir.path())).unwrap();

        store.create_topic(topic("one-more", 1)).await.unwrap();
        assert_eq!(
            fs::read(dir.path().join(FILE_NAME)).unwrap(),
            snapshot,
            "the snapshot is not rewritten for one change"
        );
        let after = fs::read(journal(dir.path())).unwrap();
        assert!(after.starts_with(&lines));
        let added = &after[lines.len()..];
        assert_eq!(added.iter().filter(|&&b| b == b'\n').count(), 1);
        let line: serde_json::Value = serde_json::from_slice(added).unwrap();
        assert_eq!(line["entry"]["topics"][0]["topic"]["name"], "one-more");
        assert!(
            added.len() < 400,
            "the line holds the change, not the state: {} bytes",
            added.len()
        );
        let before = store.snapshot_now();
        drop(store);
        assert_eq!(reopened(dir.path()), before);
    }

    #[tokio::test]
    async fn an_entry_that_misses_a_key_is_caught_and_the_committed_state_kept_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        store.create_topic(topic("orders", 1)).await.unwrap();
        let inner = &store.inner;
        let mut w = inner.writer.lock().unwrap();
        // The committed state after a create, and an entry for it that names no key (what a
        // `Touched` missing the topic would record).
        let mut after = inner.lock().clone();
        transition::apply(&mut after, Change::CreateTopic(topic("audit", 1))).unwrap();
        *inner.lock() = after.clone();
        let incomplete = Entry::record(w.seq + 1, &Touched::default(), &after);
        assert!(
            inner.catch_up(&mut w, &incomplete),
            "the missing topic is noticed"
        );
        assert_eq!(
            w.scratch, after,
            "the scratch copy is the committed state again"
        );
        // A complete entry passes.
        let mut next = after.clone();
        let change = Change::CreateTopic(topic("billing", 1));
        let touched = Touched::of(&change, &next);
        transition::apply(&mut next, change).unwrap();
        *inner.lock() = next.clone();
        let entry = Entry::record(w.seq + 2, &touched, &next);
        assert!(!inner.catch_up(&mut w, &entry));
        assert_eq!(w.scratch, next);
    }

    #[tokio::test]
    async fn a_journal_larger_than_the_snapshot_is_folded_into_a_new_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open_with(Arc::new(RealFs), dir.path(), 4096).unwrap();
        let mut compactions = 0;
        let mut last_snapshot = fs::read(dir.path().join(FILE_NAME)).ok();
        for i in 0..200 {
            store
                .create_topic(topic(&format!("topic-{i:03}"), 3))
                .await
                .unwrap();
            let now = fs::read(dir.path().join(FILE_NAME)).ok();
            if now != last_snapshot {
                compactions += 1;
                last_snapshot = now;
            }
            let journal_len = fs::metadata(journal(dir.path())).map_or(0, |m| m.len());
            let snapshot_len = last_snapshot.as_ref().map_or(0, Vec::len) as u64;
            assert!(
                journal_len <= snapshot_len.max(4096) + 400,
                "after change {i}: a journal of {journal_len} bytes beside a snapshot of \
                 {snapshot_len}"
            );
        }
        // The snapshot is rewritten ever more rarely as it grows (about doubling each time),
        // never on every change.
        assert!((3..20).contains(&compactions), "{compactions} compactions");
        let before = store.snapshot_now();
        drop(store);
        let got = reopened(dir.path());
        assert_eq!(got, before);
        assert_eq!(got.topics.len(), 200);
    }

    #[tokio::test]
    async fn a_journal_ending_in_a_partial_line_is_cut_and_its_bytes_are_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        store.create_topic(topic("orders", 2)).await.unwrap();
        store.create_topic(topic("audit", 1)).await.unwrap();
        let committed = store.snapshot_now();
        drop(store);
        let whole = fs::read(journal(dir.path())).unwrap();
        let torn = br#"{"crc32c":"0badf00d","entry":{"seq":3,"versi"#;
        let mut bytes = whole.clone();
        bytes.extend_from_slice(torn);
        fs::write(journal(dir.path()), &bytes).unwrap();

        let store = FileMetastore::open(dir.path()).unwrap();
        assert_eq!(store.snapshot_now(), committed);
        assert_eq!(
            fs::read(journal(dir.path())).unwrap(),
            whole,
            "cut after the last line"
        );
        let kept: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(journal::TORN_FILE_PREFIX))
            })
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(fs::read(&kept[0]).unwrap(), torn);

        // The next change follows the last whole line and survives a reopen.
        store.create_topic(topic("billing", 3)).await.unwrap();
        let after = store.snapshot_now();
        drop(store);
        assert_eq!(reopened(dir.path()), after);
    }

    #[tokio::test]
    async fn a_damaged_journal_line_before_a_valid_one_stops_start_up_naming_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        for name in ["orders", "audit", "billing"] {
            store.create_topic(topic(name, 1)).await.unwrap();
        }
        drop(store);
        let path = journal(dir.path());
        let mut bytes = fs::read(&path).unwrap();
        bytes[30] ^= 0x01;
        fs::write(&path, &bytes).unwrap();
        let err = FileMetastore::open(dir.path()).unwrap_err();
        assert!(
            matches!(&err, MetastoreError::Corrupt { path: p, .. } if *p == path),
            "{err:?}"
        );
        assert!(err.to_string().contains("metastore.journal"), "{err}");
    }

    #[tokio::test]
    async fn a_journal_with_a_change_missing_is_corrupt_not_replayed_past_the_gap() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        for name in ["orders", "audit", "billing"] {
            store.create_topic(topic(name, 1)).await.unwrap();
        }
        drop(store);
        let path = journal(dir.path());
        let bytes = fs::read(&path).unwrap();
        let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
        assert_eq!(lines.len(), 3);
        fs::write(&path, [lines[0], lines[2]].concat()).unwrap();
        let err = FileMetastore::open(dir.path()).unwrap_err();
        assert!(
            matches!(&err, MetastoreError::Corrupt { reason, .. } if reason.contains("missing")),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_journal_without_its_snapshot_refuses_to_start_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetastore::open(dir.path()).unwrap();
        store.create_topic(topic("orders", 1)).await.unwrap();
        drop(store);
        fs::remove_file(dir.path().join(FILE_NAME)).unwrap();
        fs::remove_file(dir.path().join(BACKUP_FILE_NAME)).unwrap();
        let err = FileMetastore::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, MetastoreError::JournalWithoutSnapshot { .. }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_format_1_file_opens_and_its_first_change_keeps_it_as_the_backup() {
        let dir = tempfile::tempdir().unwrap();
        // What the previous release wrote: no journal, no journal_seq.
        let body = br#"{"format":1,"versions":{"topics":1,"links":0,"plugins":0},"topics":{"orders":{"name":"orders","partitions":2,"retention_ms":null,"retention_bytes":null,"created_at_ms":5}},"links":[],"plugins":[]}"#;
        let old = frame::encode(FIELD, body);
        fs::write(dir.path().join(FILE_NAME), &old).unwrap();

        let store = FileMetastore::open(dir.path()).unwrap();
        assert_eq!(store.snapshot_now().topics["orders"].partitions, 2);
        store.create_topic(topic("audit", 1)).await.unwrap();
        assert_eq!(fs::read(dir.path().join(BACKUP_FILE_NAME)).unwrap(), old);
        let now: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join(FILE_NAME)).unwrap()).unwrap();
        assert_eq!(now["state"]["format"], FORMAT_VERSION);
        let after = store.snapshot_now();
        drop(store);
        assert_eq!(reopened(dir.path()), after);
        // The old file restored as the backup advises, the journal brings the change back.
        fs::copy(
            dir.path().join(BACKUP_FILE_NAME),
            dir.path().join(FILE_NAME),
        )
        .unwrap();
        assert_eq!(reopened(dir.path()), after);
    }

    #[tokio::test]
    async fn a_failed_journal_write_is_not_applied_and_the_next_change_starts_a_fresh_snapshot() {
        use narad_storage::fault::{CrashMode, Fault, FaultFs, FaultOp};

        let dir = Path::new("/data");
        for fault in [Fault::Eio, Fault::Enospc, Fault::LostWrite] {
            let fs = FaultFs::new();
            fs.create_dir_all(dir).unwrap();
            fs.sync_dir(Path::new("/")).unwrap();
            let store = FileMetastore::open_on(Arc::new(fs.clone()), dir).unwrap();
            store.create_topic(topic("orders", 1)).await.unwrap();
            let committed = store.snapshot_now();
            let op = match fault {
                Fault::Enospc => FaultOp::Write,
                _ => FaultOp::SyncData,
            };
            fs.inject(op, 1, fault);
            let failed = store.create_topic(topic("audit", 1)).await;
            if fault == Fault::LostWrite {
                // The disk acknowledged a sync it did not do: the change is acknowledged too.
                failed.unwrap();
            } else {
                assert!(
                    matches!(failed, Err(MetastoreError::Io { .. })),
                    "{fault:?}: {failed:?}"
                );
                assert_eq!(store.snapshot_now(), committed, "{fault:?}: not applied");
            }
            store.create_topic(topic("billing", 1)).await.unwrap();
            let after = store.snapshot_now();
            drop(store);
            fs.crash(CrashMode::DropAll);
            let reopened = FileMetastore::open_on(Arc::new(fs.clone()), dir);
            if fault == Fault::LostWrite {
                // The lost line sits between two durable ones: start-up reports the damage
                // instead of dropping the later change as if it were a torn tail.
                assert!(
                    matches!(&reopened, Err(MetastoreError::Corrupt { path, .. }) if path.ends_with(journal::FILE_NAME)),
                    "{reopened:?}"
                );
            } else {
                assert_eq!(reopened.unwrap().snapshot_now(), after, "{fault:?}");
            }
        }
    }
}
