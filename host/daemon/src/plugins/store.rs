//! The content-addressed store of plugin modules on disk.
//!
//! Layout: `{data_dir}/plugins/sha256/{hex}.wasm`, where `hex` is the lower-case sha256 of the
//! file's bytes. A file's name is its checksum: [`ContentStore::get`] re-hashes what it reads
//! and refuses a file whose bytes no longer match its name, so a damaged module is never run.
//!
//! A write goes to `{hex}.wasm.tmp` in the same directory, is fsynced, renamed over the final
//! name and the directory is fsynced, so after a crash the final name holds either nothing or
//! the whole module. Leftover temporary files are removed by [`ContentStore::open`].
//!
//! Every function here blocks (file I/O); the registry calls them from the blocking pool.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use narad_runtime::Digest;
use narad_storage::fs::RealFs;

use super::error::RegistryError;

/// Extension of a stored module.
const WASM_EXT: &str = "wasm";
/// Suffix of a module being written (never read as a module).
const TEMP_SUFFIX: &str = narad_storage::fs::REPLACE_TEMP_SUFFIX;

/// The directory of stored modules.
#[derive(Debug, Clone)]
pub struct ContentStore {
    dir: PathBuf,
}

impl ContentStore {
    /// Opens (creating) `{plugins_dir}/sha256/` and removes temporary files a crash left there.
    pub fn open(plugins_dir: &Path) -> Result<ContentStore, RegistryError> {
        let dir = plugins_dir.join("sha256");
        // Owner-only whatever the umask, like every data-directory entry.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| io(format!("creating {}", dir.display()), source))?;
        // Make the directories' own entries durable, so a module renamed into place is never
        // lost with a directory a crash forgot.
        for d in [
            Some(dir.as_path()),
            dir.parent(),
            dir.parent().and_then(Path::parent),
        ]
        .into_iter()
        .flatten()
        {
            fs::File::open(d)
                .and_then(|f| f.sync_all())
                .map_err(|source| io(format!("syncing {}", d.display()), source))?;
        }
        let store = ContentStore { dir };
        for entry in store.read_dir()? {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(TEMP_SUFFIX) {
                let path = entry.path();
                tracing::warn!(path = %path.display(), "removing an unfinished plugin write left by a crash");
                fs::remove_file(&path)
                    .map_err(|source| io(format!("removing {}", path.display()), source))?;
            }
        }
        Ok(store)
    }

    /// The directory holding the modules.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the module with `digest` is (or would be) stored.
    pub fn path_for(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.{WASM_EXT}", digest.to_hex()))
    }

    /// Stores `bytes` under their digest, durably. Storing bytes that are already there
    /// rewrites nothing.
    pub fn put(&self, bytes: &[u8]) -> Result<Digest, RegistryError> {
        let digest = Digest::of(bytes);
        let path = self.path_for(&digest);
        if let Ok(existing) = fs::read(&path)
            && Digest::of(&existing) == digest
        {
            return Ok(digest);
        }
        let name = format!("{}.{WASM_EXT}", digest.to_hex());
        // `{hex}.wasm.tmp`, renamed over the final name, directory synced: the storage
        // crate's one durable replace.
        narad_storage::fs::replace_file(&RealFs, &self.dir, &name, bytes).map_err(|source| {
            let _ = fs::remove_file(narad_storage::fs::replace_temp_path(&self.dir, &name));
            io(format!("writing {}", path.display()), source)
        })?;
        Ok(digest)
    }

    /// The bytes stored under `digest`: `Ok(None)` when there is no such file, an error when
    /// the file's bytes do not hash to its name (damaged on disk).
    pub fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, RegistryError> {
        let path = self.path_for(digest);
        let bytes = match fs::read(&path) {
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
    pub fn remove(&self, digest: &Digest) -> Result<(), RegistryError> {
        let path = self.path_for(digest);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(source) => Err(io(format!("removing {}", path.display()), source)),
        }
    }

    /// The digests of every stored module (files named `{64 hex}.wasm`; anything else is
    /// ignored).
    pub fn digests(&self) -> Result<Vec<Digest>, RegistryError> {
        let mut out = Vec::new();
        for entry in self.read_dir()? {
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".wasm")) else {
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

    fn read_dir(&self) -> Result<Vec<fs::DirEntry>, RegistryError> {
        let context = || format!("listing {}", self.dir.display());
        fs::read_dir(&self.dir)
            .map_err(|source| io(context(), source))?
            .map(|entry| entry.map_err(|source| io(context(), source)))
            .collect()
    }
}

fn io(context: String, source: std::io::Error) -> RegistryError {
    RegistryError::Io { context, source }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(store.get(&Digest::of(b"other")).unwrap(), None);
    }

    #[test]
    fn a_file_whose_bytes_no_longer_match_its_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let digest = store.put(b"original").unwrap();
        fs::write(store.path_for(&digest), b"tampered").unwrap();
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
        fs::write(&temp, b"half").unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        assert!(!temp.exists());
        assert_eq!(store.digests().unwrap(), vec![digest]);
        store.remove(&digest).unwrap();
        store.remove(&digest).unwrap();
        assert!(store.digests().unwrap().is_empty());
    }
}
