//! The file-system seam: every byte the log reads or writes goes through [`FileSystem`] and
//! [`File`], so tests can swap in [`crate::fault::FaultFs`] and fail or crash any operation.
//!
//! The surface is deliberately small: positional reads and writes (the log always knows where
//! it writes), `set_len` for truncating a torn tail, `sync_data` (`fdatasync`), and the
//! directory operations the store needs, including `sync_dir` so that a new or renamed entry
//! is durable before anything refers to it.

use std::fmt::Debug;
use std::fs::{self as stdfs, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

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

    /// Removes a directory and everything below it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Lists a directory, sorted by name.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;

    /// Creates a directory and any missing parents (idempotent).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Makes the directory's entries (creations, removals, renames) durable: `fsync` on the
    /// directory.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Takes an exclusive lock on `path` (created if missing) without waiting. An error of kind
    /// `WouldBlock` means someone else holds it.
    fn try_lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn LockGuard>>;

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
struct RealFile(stdfs::File);

impl File for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&self.0, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(&self.0, buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
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
        Ok(Box::new(RealFile(opts.open(path)?)))
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

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        stdfs::create_dir_all(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        stdfs::File::open(path)?.sync_all()
    }

    fn try_lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
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
