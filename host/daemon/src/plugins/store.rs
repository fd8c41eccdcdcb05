//! The content-addressed store of plugin modules on disk.
//!
//! Layout: `{data_dir}/plugins/sha256/{hex}.wasm`, where `hex` is the lower-case sha256 of the
//! file's bytes. A file's name is its checksum: [`ContentStore::get`] re-hashes what it reads
//! and refuses a file whose bytes no longer match its name, so a damaged module is never run.
//!
//! Every byte goes through the storage crate's file-system seam ([`FileSystem`]), so the
//! tests below crash a write at every operation with `narad_storage::fault::FaultFs` (feature
//! `test-support`), as the log's and the metastore's are. The rules they check:
//!
//! - **A module is whole or absent.** A write is the storage crate's one durable replace
//!   ([`narad_storage::fs::replace_file`]): `{hex}.wasm.tmp`, synced, renamed over the final
//!   name, directory synced. After a crash the final name holds nothing or the whole module;
//!   leftover temporary files are removed by [`ContentStore::open`].
//! - **A module set aside is never lost.** [`ContentStore::set_aside`] moves a module out of
//!   the store; at every point of a crash it is under its old name, its new one, or both, whole.
//!
//! Every function here blocks (file I/O); the registry calls them from the blocking pool.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use narad_runtime::Digest;
use narad_storage::fs::{FileSystem, OpenMode, RealFs};

use super::error::RegistryError;

/// Extension of a stored module.
const WASM_EXT: &str = "wasm";
/// Suffix of a module being written (never read as a module).
const TEMP_SUFFIX: &str = narad_storage::fs::REPLACE_TEMP_SUFFIX;

/// The directory of stored modules, on a file system.
#[derive(Debug, Clone)]
pub(crate) struct ContentStore {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
}

impl ContentStore {
    /// Opens (creating) `{plugins_dir}/sha256/` on the real file system and removes temporary
    /// files a crash left there.
    pub(crate) fn open(plugins_dir: &Path) -> Result<ContentStore, RegistryError> {
        ContentStore::open_on(Arc::new(RealFs), plugins_dir)
    }

    /// [`ContentStore::open`] on the file system `fs` (the real one, or a fault-injecting one
    /// in tests); `plugins_dir` is a path on `fs`.
    pub(crate) fn open_on(
        fs: Arc<dyn FileSystem>,
        plugins_dir: &Path,
    ) -> Result<ContentStore, RegistryError> {
        let dir = plugins_dir.join("sha256");
        // Owner-only whatever the umask (the seam creates every directory 0700), like every
        // data-directory entry.
        fs.create_dir_all(&dir)
            .map_err(|source| io(format!("creating {}", dir.display()), source))?;
        // Make the directories' own entries durable, so a module renamed into place is never
        // lost with a directory a crash forgot.
        sync_dirs(fs.as_ref(), &dir, 3)?;
        let store = ContentStore { fs, dir };
        for name in store.names()? {
            if name.ends_with(TEMP_SUFFIX) {
                let path = store.dir.join(&name);
                tracing::warn!(path = %path.display(), "removing an unfinished plugin write left by a crash");
                store
                    .fs
                    .remove_file(&path)
                    .map_err(|source| io(format!("removing {}", path.display()), source))?;
            }
        }
        Ok(store)
    }

    /// The directory holding the modules.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the module with `digest` is (or would be) stored.
    pub(crate) fn path_for(&self, digest: &Digest) -> PathBuf {
        self.dir.join(file_name(digest))
    }

    /// Whether a file is stored under `digest` (its bytes are not checked: [`ContentStore::get`]
    /// does that).
    pub(crate) fn contains(&self, digest: &Digest) -> Result<bool, RegistryError> {
        let path = self.path_for(digest);
        self.fs
            .exists(&path)
            .map_err(|source| io(format!("looking for {}", path.display()), source))
    }

    /// Stores `bytes` under their digest, durably. Storing bytes that are already there
    /// rewrites nothing.
    pub(crate) fn put(&self, bytes: &[u8]) -> Result<Digest, RegistryError> {
        let digest = Digest::of(bytes);
        let path = self.path_for(&digest);
        if let Ok(existing) = read_all(self.fs.as_ref(), &path)
            && Digest::of(&existing) == digest
        {
            return Ok(digest);
        }
        let name = file_name(&digest);
        // `{hex}.wasm.tmp`, renamed over the final name, directory synced: the storage
        // crate's one durable replace.
        narad_storage::fs::replace_file(self.fs.as_ref(), &self.dir, &name, bytes).map_err(
            |source| {
                // Best effort: `open` removes what is left after a crash anyway.
                let _ = self
                    .fs
                    .remove_file(&narad_storage::fs::replace_temp_path(&self.dir, &name));
                io(format!("writing {}", path.display()), source)
            },
        )?;
        Ok(digest)
    }

    /// The bytes stored under `digest`: `Ok(None)` when there is no such file, an error when
    /// the file's bytes do not hash to its name (damaged on disk).
    pub(crate) fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, RegistryError> {
        let path = self.path_for(digest);
        let bytes = match read_all(self.fs.as_ref(), &path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io(format!("reading {}", path.display()), source)),
        };
        let found = Digest::of(&bytes);
        if found != *digest {
            return Err(RegistryError::Corrupt {
                path,
                found: found.to_hex(),
            });
        }
        Ok(Some(bytes))
    }

    /// Deletes the module with `digest`; a missing file is not an error.
    pub(crate) fn remove(&self, digest: &Digest) -> Result<(), RegistryError> {
        let path = self.path_for(digest);
        match self.fs.remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(source) => Err(io(format!("removing {}", path.display()), source)),
        }
    }

    /// Moves the module with `digest` out of the store into `aside/{hex}.wasm` (creating
    /// `aside` and up to two missing parents, each made durable in its parent first) and
    /// returns its new path. The new name is made durable before the old one is removed, so a
    /// crash at any point leaves the module whole under one name or both, never under none.
    ///
    /// Why not one `rename`: a rename between two directories is durable only once both are
    /// synced, and until then a crash may keep the removal from one and lose the entry in the
    /// other (the fault model allows it, as a file system without a journal does). So the
    /// module gets a second name (a hard link, or a durable copy where the file system has no
    /// links), that directory is synced, and only then is the store's name removed.
    pub(crate) fn set_aside(
        &self,
        digest: &Digest,
        aside: &Path,
    ) -> Result<PathBuf, RegistryError> {
        let from = self.path_for(digest);
        let to = aside.join(file_name(digest));
        let context = || format!("moving {} to {}", from.display(), to.display());
        let fs = self.fs.as_ref();
        fs.create_dir_all(aside)
            .map_err(|source| io(context(), source))?;
        // `set-aside/plugins` may be new, and `set-aside` too: their entries must survive a
        // crash before the only durable name of the module lives in them.
        sync_dirs(fs, aside, 3)?;
        // A name left by an interrupted earlier move names the same bytes (or a damaged copy
        // of them): the store's file replaces it.
        match fs.remove_file(&to) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(source) => return Err(io(context(), source)),
        }
        let linked = match fs.hard_link(&from, &to) {
            Err(e) if e.kind() == ErrorKind::Unsupported => read_all(fs, &from).and_then(|bytes| {
                narad_storage::fs::replace_file(fs, aside, &file_name(digest), &bytes)
            }),
            other => other,
        };
        linked
            .and_then(|()| fs.sync_dir(aside))
            .and_then(|()| fs.remove_file(&from))
            .and_then(|()| fs.sync_dir(&self.dir))
            .map_err(|source| io(context(), source))?;
        Ok(to)
    }

    /// The digests of every stored module (files named `{64 hex}.wasm`; anything else is
    /// ignored).
    pub(crate) fn digests(&self) -> Result<Vec<Digest>, RegistryError> {
        let mut out = Vec::new();
        for name in self.names()? {
            let Some(stem) = name.strip_suffix(".wasm") else {
                continue;
            };
            if let Some(digest) = Digest::from_hex(stem)
                && digest.to_hex() == stem
            {
                out.push(digest);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The names of the files in the store's directory.
    fn names(&self) -> Result<Vec<String>, RegistryError> {
        let entries = self
            .fs
            .read_dir(&self.dir)
            .map_err(|source| io(format!("listing {}", self.dir.display()), source))?;
        Ok(entries
            .into_iter()
            .filter(|e| !e.is_dir)
            .map(|e| e.name)
            .collect())
    }
}

/// `{hex}.wasm`.
fn file_name(digest: &Digest) -> String {
    format!("{}.{WASM_EXT}", digest.to_hex())
}

/// `fsync`s `dir` and up to `levels - 1` of its ancestors, so entries just created in each
/// (a new directory included) survive a crash.
fn sync_dirs(fs: &dyn FileSystem, dir: &Path, levels: usize) -> Result<(), RegistryError> {
    for d in dir.ancestors().take(levels) {
        fs.sync_dir(d)
            .map_err(|source| io(format!("syncing {}", d.display()), source))?;
    }
    Ok(())
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

fn io(context: String, source: std::io::Error) -> RegistryError {
    RegistryError::Io { context, source }
}

#[cfg(test)]
mod tests {
    use narad_storage::fault::{CrashMode, FaultFs};

    use super::*;

    #[test]
    fn stored_bytes_come_back_under_their_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let digest = store.put(b"\0asm module bytes").unwrap();
        assert_eq!(digest, Digest::of(b"\0asm module bytes"));
        assert_eq!(
            store.get(&digest).unwrap().as_deref(),
            Some(&b"\0asm module bytes"[..])
        );
        assert_eq!(store.digests().unwrap(), vec![digest]);
        assert!(store.contains(&digest).unwrap());
        assert_eq!(store.get(&Digest::of(b"other")).unwrap(), None);
        assert!(!store.contains(&Digest::of(b"other")).unwrap());
    }

    #[test]
    fn a_file_whose_bytes_no_longer_match_its_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let digest = store.put(b"original").unwrap();
        std::fs::write(store.path_for(&digest), b"tampered").unwrap();
        assert!(matches!(
            store.get(&digest),
            Err(RegistryError::Corrupt { .. })
        ));
    }

    #[test]
    fn open_removes_unfinished_writes_and_remove_deletes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let digest = store.put(b"kept").unwrap();
        let temp = store.dir().join(format!("{}.wasm.tmp", "ab".repeat(32)));
        std::fs::write(&temp, b"half").unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        assert!(!temp.exists());
        assert_eq!(store.digests().unwrap(), vec![digest]);
        store.remove(&digest).unwrap();
        store.remove(&digest).unwrap();
        assert!(store.digests().unwrap().is_empty());
    }

    /// Where the crash tests keep the data directory on the in-memory file system.
    const DATA: &str = "/data";

    /// Every way a power loss may treat what was not synced (see `FaultFs`).
    const CRASH_MODES: [CrashMode; 6] = CrashMode::SAMPLE;

    fn fresh_fs() -> FaultFs {
        let fs = FaultFs::new();
        fs.create_dir_all(Path::new(DATA)).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        fs
    }

    fn plugins_dir() -> PathBuf {
        Path::new(DATA).join("plugins")
    }

    #[test]
    fn a_crash_at_any_operation_of_storing_modules_leaves_each_whole_or_absent() {
        // Three modules, one larger than a page, stored one after the other.
        let modules: Vec<Vec<u8>> = vec![
            b"\0asm first module".to_vec(),
            (0..10_000u32).map(|i| (i % 251) as u8).collect(),
            b"\0asm third module".to_vec(),
        ];
        let mut crash_point = 1;
        'points: loop {
            for mode in CRASH_MODES {
                let fs = fresh_fs();
                let store = ContentStore::open_on(Arc::new(fs.clone()), &plugins_dir()).unwrap();
                fs.crash_at(crash_point);
                let mut in_progress = None;
                for (i, module) in modules.iter().enumerate() {
                    if let Err(e) = store.put(module) {
                        assert!(fs.is_crashed(), "put {i} failed without a crash: {e}");
                        assert!(matches!(e, RegistryError::Io { .. }), "{e:?}");
                        in_progress = Some(i);
                        break;
                    }
                }
                let Some(i) = in_progress else {
                    // Every put ran before the crash point: every operation was covered.
                    break 'points;
                };
                drop(store);
                fs.crash(mode);

                let context = format!("crash at operation {crash_point} ({mode:?}), put {i}");
                let reopened = ContentStore::open_on(Arc::new(fs.clone()), &plugins_dir())
                    .unwrap_or_else(|e| panic!("{context}: reopening failed: {e}"));
                let mut present = Vec::new();
                for (j, module) in modules.iter().enumerate() {
                    let digest = Digest::of(module);
                    // A partial file would be `Err(Corrupt)` here: never served, but a failure.
                    let got = reopened
                        .get(&digest)
                        .unwrap_or_else(|e| panic!("{context}: module {j}: {e}"));
                    match got {
                        Some(bytes) => {
                            assert_eq!(bytes, *module, "{context}: module {j}");
                            assert!(j <= i, "{context}: module {j} was never stored");
                            present.push(digest);
                        }
                        None => assert!(j >= i, "{context}: stored module {j} was lost"),
                    }
                }
                present.sort();
                assert_eq!(reopened.digests().unwrap(), present, "{context}");
                assert!(
                    reopened
                        .names()
                        .unwrap()
                        .iter()
                        .all(|n| !n.ends_with(TEMP_SUFFIX)),
                    "{context}: a temporary file survived the reopen"
                );
                // And the store takes the interrupted module again.
                let digest = reopened
                    .put(&modules[i])
                    .unwrap_or_else(|e| panic!("{context}: storing again: {e}"));
                assert_eq!(
                    reopened.get(&digest).unwrap().as_deref(),
                    Some(&modules[i][..])
                );
            }
            crash_point += 1;
        }
        assert!(
            crash_point > 10,
            "the sequence has more operations than {crash_point}"
        );
    }

    #[test]
    fn a_crash_at_any_operation_of_setting_a_module_aside_keeps_it_under_one_name_at_least() {
        let module = b"\0asm the only copy of an uploaded plugin".to_vec();
        let digest = Digest::of(&module);
        let aside = Path::new(DATA).join("set-aside/plugins");
        let mut crash_point = 1;
        'points: loop {
            for mode in CRASH_MODES {
                let fs = fresh_fs();
                let store = ContentStore::open_on(Arc::new(fs.clone()), &plugins_dir()).unwrap();
                store.put(&module).unwrap();
                fs.crash_at(crash_point);
                let moved = match store.set_aside(&digest, &aside) {
                    Ok(to) => {
                        if !fs.is_crashed() {
                            // The whole move ran before the crash point.
                            break 'points;
                        }
                        Some(to)
                    }
                    Err(e) => {
                        assert!(fs.is_crashed(), "set_aside failed without a crash: {e}");
                        None
                    }
                };
                drop(store);
                fs.crash(mode);

                let context = format!("crash at operation {crash_point} ({mode:?})");
                let reopened = ContentStore::open_on(Arc::new(fs.clone()), &plugins_dir())
                    .unwrap_or_else(|e| panic!("{context}: reopening failed: {e}"));
                let in_store = reopened
                    .get(&digest)
                    .unwrap_or_else(|e| panic!("{context}: {e}"));
                let set_aside_copy = fs.contents(&aside.join(file_name(&digest))).ok();
                if let Some(bytes) = &in_store {
                    assert_eq!(*bytes, module, "{context}");
                }
                if let Some(bytes) = &set_aside_copy {
                    assert_eq!(*bytes, module, "{context}");
                }
                assert!(
                    in_store.is_some() || set_aside_copy.is_some(),
                    "{context}: the module is under neither name"
                );
                if moved.is_some() {
                    assert!(
                        set_aside_copy.is_some(),
                        "{context}: a finished move was lost"
                    );
                }
            }
            crash_point += 1;
        }
        assert!(
            crash_point > 3,
            "the move has more operations than {crash_point}"
        );
    }
}
