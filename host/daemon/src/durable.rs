//! Durable small-file writes for the daemon's own bookkeeping files (intent records, set-aside
//! descriptions): a file is either absent, the old version or the new one, never half written.

use std::fs::File;
use std::path::Path;

use narad_storage::fs::RealFs;

/// Replaces `dir/name` with `bytes` atomically and durably, through the storage crate's one
/// primitive ([`narad_storage::fs::replace_file`]): written to `dir/name.tmp` (owner-only),
/// synced, renamed over the target, and the directory `fsync`ed.
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    narad_storage::fs::replace_file(&RealFs, dir, name, bytes)
}

/// `fsync` of a directory, so the entries created, renamed or removed in it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
