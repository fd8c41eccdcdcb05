//! The file system the daemon's own bookkeeping files live on (intent records, set-aside
//! descriptions, the node identity, the lease record), and reading one whole through it.
//!
//! Those files are written through a [`FileSystem`] the caller passes in, with the storage
//! crate's one durable replacement ([`narad_storage::fs::replace_file`]: a crash leaves the
//! old contents or the new, each whole) and [`FileSystem::sync_dir`], so tests can run them
//! on `narad_storage::fault::FaultFs` and crash them at every step. Production passes
//! [`real`], chosen where a data directory is opened.

use std::io;
use std::path::Path;
use std::sync::Arc;

use narad_storage::fs::{FileSystem, OpenMode, RealFs};

/// The operating system's file system: what every production caller passes for the
/// bookkeeping files, so their writes reach the disk the store's own files are on.
pub(crate) fn real() -> Arc<dyn FileSystem> {
    Arc::new(RealFs)
}

/// The whole contents of `path` on `fs`, as a reader sees them now. `NotFound` when the file
/// does not exist, so a caller can tell an absent record from an unreadable one.
pub(crate) fn read_whole(fs: &dyn FileSystem, path: &Path) -> io::Result<Vec<u8>> {
    let file = fs.open(path, OpenMode::Read)?;
    let len = usize::try_from(file.len()?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "file too large for this platform",
        )
    })?;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}
