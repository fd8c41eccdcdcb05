//! Durable small-file writes for the daemon's own bookkeeping files (intent records, set-aside
//! descriptions): a file is either absent, the old version or the new one, never half written.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Replaces `dir/name` with `bytes` atomically and durably: written to `dir/name.tmp`
/// (owner-only), `fsync`ed, renamed over the target, and the directory `fsync`ed.
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let temp = dir.join(format!("{name}.tmp"));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temp, dir.join(name))?;
    sync_dir(dir)
}

/// `fsync` of a directory, so the entries created, renamed or removed in it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
