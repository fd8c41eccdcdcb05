//! The file-system seam: every byte the log reads or writes goes through [`FileSystem`] and
//! [`File`], so tests can swap in `fault::FaultFs` (feature `test-support`) and fail or crash
//! any operation.
//!
//! The surface is deliberately small: positional reads and writes (the log always knows where
//! it writes), `set_len` for truncating a torn tail, `sync_data` (`fdatasync`), the directory
//! operations the store needs, including `sync_dir` so that a new or renamed entry is durable
//! before anything refers to it, and two ways past the page cache: `read_exact_uncached_at`
//! (what the device holds) and `drop_cache`.
//!
//! Why the log reads past the page cache. After a failed writeback Linux marks the pages clean
//! and keeps them: reads of the cache still return the bytes that never reached the device, and
//! a descriptor opened after the error does not see it (errseq_t reports an error once per file
//! description that was open when it happened). Worse, ext4 can report a successful
//! `fdatasync` for data the device does not hold: when converting the written blocks'
//! unwritten extents fails (kernel: "failed to convert unwritten extents to written extents"),
//! the error is only logged, and after a remount the range reads as zeros. Seen on Linux 6.18,
//! ext4 without a journal, loop device whose backing store ran out of space: the last frame
//! synced before the device filled read back intact from the cache and as zeros from the device.
//! So an append is verified against the device, and a log reopened after a failure (or after a
//! crash) reads its tail from the device.
//!
//! Modes. Every file [`RealFs`] creates is [`FILE_MODE`] (0600) and every directory
//! [`DIR_MODE`] (0700), whatever the umask (which can only remove bits).
//! [`FileSystem::restrict_tree`], run on the whole data directory when a store opens, tightens
//! entries made by older versions (0644 files, 0755 directories), with one warning per process.
//!
//! Durable replacement. [`replace_file`] is the one way a small file (a cursor, the log-start
//! record, the metastore, a plugin module, the daemon's bookkeeping files) is replaced so that
//! a crash leaves the old contents or the new, each complete: the bytes go to `{name}.tmp`
//! (owner-only, truncated first), are synced, the temp file is renamed over `name`, and the
//! directory is synced. [`replace_file_with`] runs a step between the sync and the rename (the
//! metastore links its backup there).

use std::fmt::Debug;
use std::fs::{self as stdfs, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Mode of every file the store creates: read and write for the owner only, since segments
/// hold records and the data directory may hold secrets (plugin link configs).
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory the store creates: the owner only.
pub const DIR_MODE: u32 = 0o700;
/// Group and other permission bits: none may be set on anything in the data directory.
const GROUP_OTHER_BITS: u32 = 0o077;
/// Alignment of `O_DIRECT` reads: 4096 bytes, a multiple of every logical block size Linux
/// block devices use (512 or 4096), so any device accepts it.
const DIRECT_ALIGN_BYTES: u64 = 4096;
/// Rounding for `posix_fadvise(DONTNEED)` when `O_DIRECT` is not available: 64 KiB, a multiple
/// of every page size Linux uses (4 KiB to 64 KiB), because the kernel keeps partial pages.
const FADVISE_ROUND_BYTES: u64 = 64 * 1024;

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write, creating an empty file if it does not exist.
    CreateReadWrite,
    /// Read and write a new empty file; fails with `AlreadyExists` if the name is taken.
    CreateNew,
}

/// What `metadata` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Length in bytes (0 for directories).
    pub len: u64,
    /// True for a directory.
    pub is_dir: bool,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's file name (not the full path).
    pub name: String,
    /// True for a directory.
    pub is_dir: bool,
}

/// An open file. Positional I/O only, so a handle can be shared by readers and the writer.
pub trait File: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset` (pread); returns how many were read, 0 at end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes up to `buf.len()` bytes at `offset` (pwrite); may write fewer.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;

    /// Sets the file's length, truncating or extending with zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Flushes the file's data (and the metadata needed to read it back) to stable storage:
    /// `fdatasync`. After an error the handle must not be trusted again.
    fn sync_data(&self) -> io::Result<()>;

    /// Reads exactly `buf.len()` bytes at `offset` as the device holds them, not as the page
    /// cache does (`O_DIRECT`, or dropping the range's cached pages first); `UnexpectedEof` if
    /// the file is shorter. Call it after a successful `sync_data` of the range: it is how an
    /// append learns that its bytes really reached the device.
    fn read_exact_uncached_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// [`File::read_exact_uncached_at`] of `len` bytes at `offset`, into a buffer the caller
    /// keeps from one read to the next: returns the bytes read, a slice of `scratch`. A file
    /// read with `O_DIRECT` reads the device straight into an aligned window of `scratch`, so
    /// once `scratch` has grown to the largest read nothing is allocated, zeroed or copied;
    /// that is why it hands back a slice instead of filling one the caller chose.
    ///
    /// No default body: a wrapper around another `File` must pass this on to the file it
    /// wraps (a default built on `read_exact_uncached_at` would allocate, zero and copy a
    /// buffer per read, which is what the append path's read-back must not do). A file with
    /// no cheaper way can use [`read_into_prefix`].
    fn read_uncached_into<'s>(
        &self,
        scratch: &'s mut Vec<u8>,
        len: usize,
        offset: u64,
    ) -> io::Result<&'s [u8]>;

    /// Drops the file's clean cached pages, so that later reads come from the device: bytes
    /// whose writeback failed, still readable from the cache, are then seen as the device holds
    /// them (zeros, or older contents). Dirty pages are not dropped: `sync_data` first.
    fn drop_cache(&self) -> io::Result<()>;

    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// True when the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Reads exactly `buf.len()` bytes at `offset`; `UnexpectedEof` if the file is shorter.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file ended before the requested bytes",
                    ));
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at `offset`, continuing after short writes.
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the file accepted no bytes",
                    ));
                }
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at the current end of the file.
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let end = self.len()?;
        self.write_all_at(buf, end)
    }
}

/// A held exclusive lock; dropping it releases the lock.
pub trait LockGuard: Send + Sync + Debug {}

/// The file-system operations the store uses.
pub trait FileSystem: Send + Sync + Debug + 'static {
    /// Opens `path` in `mode`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn File>>;

    /// Length and kind of `path`; `NotFound` if it does not exist.
    fn metadata(&self, path: &Path) -> io::Result<Metadata>;

    /// Renames `from` to `to` (replacing a file at `to`). Durable only after `sync_dir` of both
    /// parents.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Makes `link` a second name of the file `original` (`link(2)`); `AlreadyExists` if
    /// `link` is taken. Durable only after `sync_dir` of `link`'s parent. File systems without
    /// hard links return an error of kind `Unsupported` (the default), and callers copy.
    fn hard_link(&self, original: &Path, link: &Path) -> io::Result<()> {
        let _ = (original, link);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this file system has no hard links",
        ))
    }

    /// Removes a directory and everything below it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Lists a directory, sorted by name. Entries whose names are not UTF-8 are left out (no
    /// file of ours has one); [`FileSystem::entry_count`] counts them.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;

    /// How many entries a directory holds, those [`FileSystem::read_dir`] leaves out
    /// included: what a caller deciding that a directory is empty (so it may be removed)
    /// must ask.
    fn entry_count(&self, path: &Path) -> io::Result<usize> {
        self.read_dir(path).map(|entries| entries.len())
    }

    /// Creates a directory and any missing parents (idempotent).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Makes the directory's entries (creations, removals, renames) durable: `fsync` on the
    /// directory.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Takes an exclusive lock on `path` (created if missing) without waiting. An error of kind
    /// `WouldBlock` means someone else holds it.
    fn try_lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn LockGuard>>;

    /// Removes group and other permission bits from `dir` and everything below it (symbolic
    /// links are neither followed nor changed); returns how many entries were tightened. For
    /// data directories made by older versions, which created files 0644 and directories
    /// 0755. File systems without permissions (the fault model) do nothing.
    fn restrict_tree(&self, dir: &Path) -> io::Result<u64> {
        let _ = dir;
        Ok(0)
    }

    /// True if `path` exists.
    fn exists(&self, path: &Path) -> io::Result<bool> {
        match self.metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

#[derive(Debug)]
struct RealFile {
    file: stdfs::File,
    /// A second description of the same file opened with `O_DIRECT` on first use (`None`
    /// when the file system refuses `O_DIRECT`, e.g. an older tmpfs: then the range's cached
    /// pages are dropped before a normal read).
    direct: OnceLock<Option<stdfs::File>>,
}

impl RealFile {
    fn new(file: stdfs::File) -> RealFile {
        RealFile {
            file,
            direct: OnceLock::new(),
        }
    }

    fn direct(&self) -> Option<&stdfs::File> {
        self.direct
            .get_or_init(|| {
                // Through /proc so the new description names this very inode even if the path
                // was renamed or replaced since.
                let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
                let flags = i32::try_from(rustix::fs::OFlags::DIRECT.bits()).unwrap_or(0);
                match OpenOptions::new().read(true).custom_flags(flags).open(&path) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        tracing::debug!(error = %e, "O_DIRECT unavailable; uncached reads drop cached pages instead");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// `O_DIRECT` read of the aligned span around `[offset, offset + buf.len())`.
    fn read_direct(&self, direct: &stdfs::File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut storage = Vec::new();
        let read = read_direct_into(direct, &mut storage, buf.len(), offset)?;
        buf.copy_from_slice(&storage[read]);
        Ok(())
    }

    fn fadvise_dontneed(&self, offset: u64, len: u64) -> io::Result<()> {
        let start = offset - offset % FADVISE_ROUND_BYTES;
        let end = (offset + len).next_multiple_of(FADVISE_ROUND_BYTES);
        rustix::fs::fadvise(
            &self.file,
            start,
            std::num::NonZeroU64::new(end - start),
            rustix::fs::Advice::DontNeed,
        )
        .map_err(io::Error::from)
    }
}

/// Runs `read` on the first `len` bytes of `scratch` (grown when shorter) and returns them:
/// [`File::read_uncached_into`] for a file that can only fill a buffer it is given.
pub fn read_into_prefix(
    scratch: &mut Vec<u8>,
    len: usize,
    read: impl FnOnce(&mut [u8]) -> io::Result<()>,
) -> io::Result<&[u8]> {
    if scratch.len() < len {
        scratch.resize(len, 0);
    }
    let buf = &mut scratch[..len];
    read(buf)?;
    Ok(buf)
}

/// Reads `len` bytes at `offset` from `direct` (opened with `O_DIRECT`) into an aligned window
/// of `storage`, grown when too small (never shrunk, so a reused one allocates nothing), and
/// returns where in `storage` they are. `UnexpectedEof` if the file is shorter.
fn read_direct_into(
    direct: &stdfs::File,
    storage: &mut Vec<u8>,
    len: usize,
    offset: u64,
) -> io::Result<std::ops::Range<usize>> {
    let start = offset - offset % DIRECT_ALIGN_BYTES;
    let end = (offset + len as u64).next_multiple_of(DIRECT_ALIGN_BYTES);
    let span = usize::try_from(end - start)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "read too large"))?;
    let align = DIRECT_ALIGN_BYTES as usize;
    // An aligned window inside a slightly larger vector: no unsafe allocation needed.
    if storage.len() < span + align {
        storage.resize(span + align, 0);
    }
    let shift = storage.as_ptr().align_offset(align);
    let window = &mut storage[shift..shift + span];
    let mut got = 0usize;
    while got < span {
        match direct.read_at(&mut window[got..], start + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // A short read that is not block-aligned means end of file: the next read would be
        // misaligned, and there is nothing after it anyway.
        if !got.is_multiple_of(align) {
            break;
        }
    }
    let from = (offset - start) as usize;
    if got < from + len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file ended before the requested bytes",
        ));
    }
    Ok(shift + from..shift + from + len)
}

impl File for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&self.file, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(&self.file, buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn read_exact_uncached_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(direct) = self.direct() {
            match self.read_direct(direct, buf, offset) {
                // EINVAL: this file or device wants another alignment; fall back below.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {}
                other => return other,
            }
        }
        self.fadvise_dontneed(offset, buf.len() as u64)?;
        self.read_exact_at(buf, offset)
    }

    fn read_uncached_into<'s>(
        &self,
        scratch: &'s mut Vec<u8>,
        len: usize,
        offset: u64,
    ) -> io::Result<&'s [u8]> {
        if len == 0 {
            return Ok(&[]);
        }
        if let Some(direct) = self.direct() {
            match read_direct_into(direct, scratch, len, offset) {
                Ok(read) => return Ok(&scratch[read]),
                // EINVAL: this file or device wants another alignment; fall back below.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {}
                Err(e) => return Err(e),
            }
        }
        read_into_prefix(scratch, len, |buf| {
            self.fadvise_dontneed(offset, len as u64)?;
            self.read_exact_at(buf, offset)
        })
    }

    fn drop_cache(&self) -> io::Result<()> {
        // Offset 0, no length: the whole file, however long.
        rustix::fs::fadvise(&self.file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(io::Error::from)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

/// Set once the first wide mode has been tightened, so only the first is logged as a warning.
static TIGHTENED_ONE: AtomicBool = AtomicBool::new(false);

fn note_tightened(path: &Path, old_mode: u32) {
    if TIGHTENED_ONE.swap(true, Ordering::Relaxed) {
        tracing::debug!(path = %path.display(), old_mode = format_args!("{old_mode:o}"),
            "tightened to owner-only");
    } else {
        tracing::warn!(path = %path.display(), old_mode = format_args!("{old_mode:o}"),
            "a data-directory entry was readable by group or others (made by an older version?); \
             tightened it to owner-only, as every other one found will be (without a message)");
    }
}

#[derive(Debug)]
struct RealLock {
    // Held open for the lock's lifetime: the flock is released when the descriptor closes.
    _file: stdfs::File,
}

impl LockGuard for RealLock {}

impl FileSystem for RealFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn File>> {
        let mut opts = OpenOptions::new();
        match mode {
            OpenMode::Read => opts.read(true),
            OpenMode::ReadWrite => opts.read(true).write(true),
            OpenMode::CreateReadWrite => opts.read(true).write(true).create(true),
            OpenMode::CreateNew => opts.read(true).write(true).create_new(true),
        };
        Ok(Box::new(RealFile::new(opts.mode(FILE_MODE).open(path)?)))
    }

    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        let m = stdfs::metadata(path)?;
        Ok(Metadata {
            len: if m.is_dir() { 0 } else { m.len() },
            is_dir: m.is_dir(),
        })
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        stdfs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        stdfs::remove_file(path)
    }

    fn hard_link(&self, original: &Path, link: &Path) -> io::Result<()> {
        stdfs::hard_link(original, link)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        stdfs::remove_dir_all(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for entry in stdfs::read_dir(path)? {
            let entry = entry?;
            // Names that are not UTF-8 are never ours; skip them rather than fail the listing.
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            out.push(DirEntry {
                name,
                is_dir: entry.file_type()?.is_dir(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn entry_count(&self, path: &Path) -> io::Result<usize> {
        let mut count = 0;
        for entry in stdfs::read_dir(path)? {
            entry?;
            count += 1;
        }
        Ok(count)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // Missing parents are made owner-only too; existing ones are left alone here (they
        // may be outside the data directory; `restrict_tree` tightens the data directory's).
        stdfs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        stdfs::File::open(path)?.sync_all()
    }

    fn restrict_tree(&self, dir: &Path) -> io::Result<u64> {
        let mut tightened = 0;
        let mut stack = vec![dir.to_path_buf()];
        while let Some(path) = stack.pop() {
            let meta = stdfs::symlink_metadata(&path)?;
            if meta.file_type().is_symlink() {
                continue;
            }
            let mode = meta.mode() & 0o7777;
            if mode & GROUP_OTHER_BITS != 0 {
                stdfs::set_permissions(
                    &path,
                    stdfs::Permissions::from_mode(mode & !GROUP_OTHER_BITS),
                )?;
                note_tightened(&path, mode);
                tightened += 1;
            }
            if meta.is_dir() {
                for entry in stdfs::read_dir(&path)? {
                    stack.push(entry?.path());
                }
            }
        }
        Ok(tightened)
    }

    fn try_lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(RealLock { _file: file })),
            Err(stdfs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the lock is held by another open file",
            )),
            Err(stdfs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// Suffix of the temporary file [`replace_file`] writes next to its target: `{name}.tmp`. A
/// leftover one is an unfinished replacement (its owner removes or overwrites it).
pub const REPLACE_TEMP_SUFFIX: &str = ".tmp";

/// Path of the temporary file [`replace_file`] uses for `dir/name`.
pub fn replace_temp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{REPLACE_TEMP_SUFFIX}"))
}

/// Replaces `dir/name` with `bytes` atomically and durably: when this returns `Ok`, a crash
/// leaves the new contents; when it fails or the process dies during it, the file holds the
/// old contents or the new, never a mix (a leftover `{name}.tmp` may remain). Steps: create or
/// truncate `{name}.tmp` (owner-only, [`FILE_MODE`]), write, `sync_data`, rename over `name`,
/// `sync_dir(dir)`. The error is the failing step's, unchanged (its kind and OS code kept).
pub fn replace_file(fs: &dyn FileSystem, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    replace_file_with(fs, dir, name, bytes, || Ok(()))
}

/// [`replace_file`] with `before_rename` run after the temp file is synced and before it is
/// renamed into place; its error stops the replacement (the old file stays). The directory
/// sync at the end also makes durable what `before_rename` did to `dir`'s entries.
pub fn replace_file_with(
    fs: &dyn FileSystem,
    dir: &Path,
    name: &str,
    bytes: &[u8],
    before_rename: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    let temp = replace_temp_path(dir, name);
    let file = fs.open(&temp, OpenMode::CreateReadWrite)?;
    // A leftover from an interrupted replacement may be longer or hold other bytes.
    file.set_len(0)?;
    file.write_all_at(bytes, 0)?;
    file.sync_data()?;
    drop(file);
    before_rename()?;
    fs.rename(&temp, &dir.join(name))?;
    fs.sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncached_reads_return_the_synced_bytes_at_any_offset_and_stop_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = RealFs.open(&path, OpenMode::CreateNew).unwrap();
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        file.write_all_at(&bytes, 0).unwrap();
        file.sync_data().unwrap();
        for (from, len) in [
            (0, 10_000),
            (1, 4095),
            (4095, 2),
            (4096, 4096),
            (9_999, 1),
            (777, 3),
        ] {
            let mut got = vec![0u8; len];
            file.read_exact_uncached_at(&mut got, from as u64).unwrap();
            assert_eq!(got, bytes[from..from + len], "{from}+{len}");
        }
        // The same reads into one reused buffer, larger reads after smaller ones and back:
        // what a read returns is exactly the bytes asked for, whatever the buffer held.
        let mut scratch = Vec::new();
        for (from, len) in [
            (1, 4095),
            (0, 10_000),
            (777, 3),
            (4095, 2),
            (9_999, 1),
            (0, 0),
        ] {
            let got = file
                .read_uncached_into(&mut scratch, len, from as u64)
                .unwrap();
            assert_eq!(
                got,
                &bytes[from..from + len],
                "{from}+{len} into a reused buffer"
            );
        }
        let e = file.read_uncached_into(&mut scratch, 2, 9_999).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let mut past = [0u8; 2];
        let e = file.read_exact_uncached_at(&mut past, 9_999).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        file.drop_cache().unwrap();
        let mut all = vec![0u8; 10_000];
        file.read_exact_at(&mut all, 0).unwrap();
        assert_eq!(all, bytes);
    }

    #[test]
    fn replace_file_swaps_in_the_new_bytes_owner_only_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        // A longer leftover temp file must not leak its tail into the new contents.
        RealFs
            .open(&replace_temp_path(dir.path(), "f"), OpenMode::CreateNew)
            .unwrap()
            .write_all_at(b"a much longer leftover", 0)
            .unwrap();
        replace_file(&RealFs, dir.path(), "f", b"first").unwrap();
        replace_file(&RealFs, dir.path(), "f", b"2nd").unwrap();
        assert_eq!(stdfs::read(&target).unwrap(), b"2nd");
        assert!(!replace_temp_path(dir.path(), "f").exists());
        let mode = stdfs::metadata(&target).unwrap().mode() & 0o777;
        assert_eq!(mode & !FILE_MODE, 0);
        RealFs.hard_link(&target, &dir.path().join("g")).unwrap();
        assert_eq!(stdfs::read(dir.path().join("g")).unwrap(), b"2nd");
    }

    #[test]
    fn new_entries_are_owner_only_and_restrict_tree_tightens_older_wide_ones() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        RealFs.create_dir_all(&sub).unwrap();
        drop(RealFs.open(&sub.join("f"), OpenMode::CreateNew).unwrap());
        drop(RealFs.try_lock_exclusive(&sub.join("LOCK")).unwrap());
        let mode = |p: &Path| stdfs::symlink_metadata(p).unwrap().mode() & 0o777;
        // The umask can only remove bits, so these hold under any umask.
        assert_eq!(mode(&dir.path().join("a")) & !DIR_MODE, 0);
        assert_eq!(mode(&sub) & !DIR_MODE, 0);
        assert_eq!(mode(&sub.join("f")) & !FILE_MODE, 0);
        assert_eq!(mode(&sub.join("LOCK")) & !FILE_MODE, 0);
        // What an older version left.
        stdfs::set_permissions(&sub, stdfs::Permissions::from_mode(0o755)).unwrap();
        stdfs::set_permissions(sub.join("f"), stdfs::Permissions::from_mode(0o644)).unwrap();
        let root = dir.path().join("a");
        assert_eq!(RealFs.restrict_tree(&root).unwrap(), 2);
        assert_eq!(mode(&sub), 0o700);
        assert_eq!(mode(&sub.join("f")), 0o600);
        assert_eq!(RealFs.restrict_tree(&root).unwrap(), 0);
    }
}
