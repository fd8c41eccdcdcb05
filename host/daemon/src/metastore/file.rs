//! The embedded metastore: one JSON file, `{data_dir}/metastore.json`, replaced atomically.
//!
//! File layout (valid JSON, so an operator can read it):
//!
//! ```text
//! {"crc32c":"xxxxxxxx","state":<state JSON>}\n
//! ```
//!
//! `crc32c` is the CRC-32C (Castagnoli) of the exact bytes of `<state JSON>`, as 8 lowercase hex
//! digits. The prefix up to `"state":` has a fixed length, so the reader slices the state bytes
//! out without parsing them first and checks the CRC on exactly what was written.
//!
//! Write path (one writer at a time, under a mutex), the storage crate's durable replace
//! ([`narad_storage::fs::replace_file_with`]) with the backup step added:
//! 1. write the new file to `metastore.json.tmp` and `fsync` it;
//! 2. hard-link the current `metastore.json` as `metastore.json.prev` (the previous good state,
//!    kept for recovery; copied if the file system has no hard links);
//! 3. `rename` the temp file over `metastore.json` (atomic: a crash leaves the old or the new
//!    file, each complete);
//! 4. `fsync` the directory so the rename and the backup link survive a power cut.
//!
//! Only then does the in-memory state change and the write return. Start-up ignores (and
//! removes) a leftover temp file, which is by construction an unfinished write; a
//! `metastore.json` that fails its checks stops start-up with an error naming the file and the
//! backup to restore.
//!
//! Every file operation goes through the storage crate's [`FileSystem`] seam ([`RealFs`] from
//! [`FileMetastore::open`]), so the tests crash this write path at every step with
//! [`narad_storage::fault::FaultFs`], as the log's is.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use narad_storage::fs::{FileSystem, OpenMode, RealFs};

use serde::{Deserialize, Serialize};

use super::transition::{self, Change, Outcome};
use super::{
    BoxFuture, LinkMeta, LinkTopics, Metastore, MetastoreError, PluginVersion, Result, Snapshot,
    TopicMeta, Versions,
};

/// File name of the metastore inside the data dir.
pub(crate) const FILE_NAME: &str = "metastore.json";
/// File name of the previous good version, kept for recovery.
pub(crate) const BACKUP_FILE_NAME: &str = "metastore.json.prev";
/// File name of an in-progress write.
pub(crate) const TEMP_FILE_NAME: &str = "metastore.json.tmp";
/// Highest state format this binary reads and the one it writes.
pub(crate) const FORMAT_VERSION: u32 = 1;

const PREFIX_START: &[u8] = b"{\"crc32c\":\"";
const PREFIX_END: &[u8] = b"\",\"state\":";
const SUFFIX: &[u8] = b"}\n";
const CRC_HEX_LEN: usize = 8;

/// What the file's `state` holds. Do not rename or remove fields: older files must still parse.
/// New domains (links, plugins) are added with `#[serde(default)]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    format: u32,
    versions: Versions,
    topics: BTreeMap<String, TopicMeta>,
    /// Links, sorted by (parent, child). A list because JSON maps need string keys.
    #[serde(default)]
    links: Vec<LinkMeta>,
    /// Uploaded plugin versions, oldest first.
    #[serde(default)]
    plugins: Vec<PluginVersion>,
}

impl State {
    fn into_snapshot(self) -> Snapshot {
        Snapshot {
            versions: self.versions,
            topics: self.topics,
            links: self
                .links
                .into_iter()
                .map(|l| ((l.parent.clone(), l.child.clone()), l))
                .collect(),
            plugins: self.plugins,
        }
    }

    fn from_snapshot(snapshot: &Snapshot) -> State {
        State {
            format: FORMAT_VERSION,
            versions: snapshot.versions,
            topics: snapshot.topics.clone(),
            // The map is ordered by (parent, child): the list stays sorted.
            links: snapshot.links.values().cloned().collect(),
            plugins: snapshot.plugins.clone(),
        }
    }
}

/// The embedded, single-node [`Metastore`]: one checksummed JSON file replaced atomically.
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
    /// Held across a whole write (compute, persist, swap) so writes apply one at a time and
    /// readers never see a state that is not yet durable.
    writer: Mutex<()>,
    /// No metastore file (and no backup) existed when this one was opened.
    started_empty: bool,
}

impl FileMetastore {
    /// Opens the metastore in `dir` (which must exist), creating an empty one when the
    /// directory has none. Fails when the file is corrupt, missing while its backup exists, or
    /// of a newer format.
    pub fn open(dir: &Path) -> Result<FileMetastore> {
        FileMetastore::open_on(Arc::new(RealFs), dir)
    }

    /// [`FileMetastore::open`] on the file system `fs` (the real one, or a fault-injecting one
    /// in tests); `dir` is a path on `fs`.
    pub(crate) fn open_on(fs: Arc<dyn FileSystem>, dir: &Path) -> Result<FileMetastore> {
        let path = dir.join(FILE_NAME);
        let backup = dir.join(BACKUP_FILE_NAME);
        let temp = dir.join(TEMP_FILE_NAME);
        match fs.remove_file(&temp) {
            Ok(()) => tracing::warn!(
                path = %temp.display(),
                "removed an unfinished metastore write left by a crash; the committed state is unaffected"
            ),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(source) => {
                return Err(MetastoreError::Io {
                    context: format!("removing leftover {}", temp.display()),
                    source,
                });
            }
        }
        let mut started_empty = false;
        let state = match read_all(fs.as_ref(), &path) {
            Ok(bytes) => match decode(&path, &bytes) {
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
            },
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if fs.exists(&backup).map_err(|source| MetastoreError::Io {
                    context: format!("looking for {}", backup.display()),
                    source,
                })? {
                    return Err(MetastoreError::Missing { path, backup });
                }
                started_empty = true;
                State {
                    format: FORMAT_VERSION,
                    ..State::default()
                }
            }
            Err(source) => {
                return Err(MetastoreError::Io {
                    context: format!("reading {}", path.display()),
                    source,
                });
            }
        };
        Ok(FileMetastore {
            inner: Arc::new(Inner {
                fs,
                dir: dir.to_path_buf(),
                state: Mutex::new(state.into_snapshot()),
                writer: Mutex::new(()),
                started_empty,
            }),
        })
    }

    /// True when the data dir had no metastore file (and no backup) at open: a new data dir,
    /// or one whose metastore was lost. Start-up tells the two apart by what `topics/` holds.
    pub(crate) fn started_empty(&self) -> bool {
        self.inner.started_empty
    }

    /// Path of the metastore file.
    pub fn path(&self) -> PathBuf {
        self.inner.dir.join(FILE_NAME)
    }

    /// The committed state, synchronously (start-up wiring uses it before the runtime serves).
    pub(crate) fn snapshot_now(&self) -> Snapshot {
        self.inner.lock().clone()
    }

    /// Applies `change` ([`super::transition::apply`]) to a copy of the state and, when it
    /// changed anything, persists the copy and makes it current. Blocking (fsyncs): runs on
    /// the blocking pool.
    fn update(&self, change: Change) -> BoxFuture<'_, Result<Outcome>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            crate::blocking::run(move || inner.update(change))
                .await
                .map_err(|e| MetastoreError::Task(e.to_string()))?
        })
    }
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
        let _writer = self
            .writer
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut next = self.lock().clone();
        let (outcome, changed) = transition::apply(&mut next, change)?;
        if changed {
            self.persist(&State::from_snapshot(&next))?;
            *self.lock() = next;
        }
        Ok(outcome)
    }

    fn persist(&self, state: &State) -> Result<()> {
        let bytes = encode(state)?;
        let path = self.dir.join(FILE_NAME);
        let backup = self.dir.join(BACKUP_FILE_NAME);
        // Owner-only whatever the umask (the seam creates files 0600): link configs may hold
        // plugin secrets. The backup is a hard link or a copy made through the seam, so it has
        // the same mode.
        narad_storage::fs::replace_file_with(self.fs.as_ref(), &self.dir, FILE_NAME, &bytes, || {
            self.keep_backup(&path, &backup)
        })
        .map_err(|source| MetastoreError::Io {
            context: format!(
                "replacing {} (via {TEMP_FILE_NAME}, keeping the previous state as {BACKUP_FILE_NAME})",
                path.display()
            ),
            source,
        })
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

fn encode(state: &State) -> Result<Vec<u8>> {
    let body = serde_json::to_vec(state).map_err(|e| MetastoreError::Io {
        context: "encoding the metastore state".to_owned(),
        source: std::io::Error::other(e),
    })?;
    let crc = format!("{:08x}", crc32c::crc32c(&body));
    let mut out =
        Vec::with_capacity(PREFIX_START.len() + CRC_HEX_LEN + PREFIX_END.len() + body.len() + 2);
    out.extend_from_slice(PREFIX_START);
    out.extend_from_slice(crc.as_bytes());
    out.extend_from_slice(PREFIX_END);
    out.extend_from_slice(&body);
    out.extend_from_slice(SUFFIX);
    Ok(out)
}

fn decode(path: &Path, bytes: &[u8]) -> Result<State> {
    let corrupt = |reason: String| MetastoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
        backup: None,
    };
    let head_len = PREFIX_START.len() + CRC_HEX_LEN + PREFIX_END.len();
    if bytes.len() < head_len + SUFFIX.len() {
        return Err(corrupt(format!(
            "only {} bytes, shorter than any complete file",
            bytes.len()
        )));
    }
    let (head, rest) = bytes.split_at(head_len);
    if !head.starts_with(PREFIX_START) || !head.ends_with(PREFIX_END) {
        return Err(corrupt(
            "header is not {\"crc32c\":\"........\",\"state\":".to_owned(),
        ));
    }
    let Some(body) = rest.strip_suffix(SUFFIX) else {
        return Err(corrupt(
            "does not end with }\\n: the file is truncated or has trailing bytes".to_owned(),
        ));
    };
    let hex = &head[PREFIX_START.len()..PREFIX_START.len() + CRC_HEX_LEN];
    let stored = std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| corrupt("crc32c is not 8 hex digits".to_owned()))?;
    let actual = crc32c::crc32c(body);
    if stored != actual {
        return Err(corrupt(format!(
            "checksum mismatch: file says {stored:08x}, contents hash to {actual:08x}"
        )));
    }
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
            3 => store.delete_topic("audit").await.map(drop),
            _ => store.create_topic(topic("billing", 3)).await.map(drop),
        }
    }

    const CRASH_TEST_WRITES: usize = 5;

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
        let reference = FileMetastore::open_on(Arc::new(fresh()), dir).unwrap();
        let mut expected = vec![reference.snapshot_now()];
        for i in 0..CRASH_TEST_WRITES {
            crash_test_write(&reference, i).await.unwrap();
            expected.push(reference.snapshot_now());
        }

        let modes = [
            CrashMode::DropAll,
            CrashMode::KeepAll,
            CrashMode::Tear(1),
            CrashMode::Tear(2),
            CrashMode::Tear(3),
            CrashMode::Tear(4),
        ];
        let mut crash_point = 1;
        'points: loop {
            for mode in modes {
                let fs = fresh();
                let store = FileMetastore::open_on(Arc::new(fs.clone()), dir).unwrap();
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
                let reopened = FileMetastore::open_on(Arc::new(fs.clone()), dir)
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
                let again = FileMetastore::open_on(Arc::new(fs.clone()), dir).unwrap();
                assert!(
                    again.snapshot_now().topics.contains_key("after-the-crash"),
                    "{context}"
                );
            }
            crash_point += 1;
        }
        assert!(
            crash_point > 10,
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
        store.delete_topic("audit").await.unwrap();
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
        let store = FileMetastore::open(dir.path()).unwrap();
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

        // Following the advice restores the state before the last write.
        fs::copy(dir.path().join(BACKUP_FILE_NAME), &path).unwrap();
        let restored = FileMetastore::open(dir.path()).unwrap().snapshot_now();
        assert!(restored.topics.contains_key("orders"));
        assert!(!restored.topics.contains_key("audit"));
    }

    #[test]
    fn truncated_file_is_corrupt_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let state = State {
            format: FORMAT_VERSION,
            versions: Versions {
                topics: 1,
                ..Versions::default()
            },
            topics: BTreeMap::from([("orders".to_owned(), topic("orders", 1))]),
            ..State::default()
        };
        let bytes = encode(&state).unwrap();
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
        let state = State {
            format: FORMAT_VERSION + 1,
            ..State::default()
        };
        fs::write(dir.path().join(FILE_NAME), encode(&state).unwrap()).unwrap();
        assert!(matches!(
            FileMetastore::open(dir.path()),
            Err(MetastoreError::UnsupportedFormat { .. })
        ));
    }

    #[test]
    fn file_is_plain_json() {
        let state = State {
            format: FORMAT_VERSION,
            versions: Versions::default(),
            topics: BTreeMap::from([("orders".to_owned(), topic("orders", 1))]),
            ..State::default()
        };
        let bytes = encode(&state).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["state"]["topics"]["orders"]["partitions"], 1);
    }
}
