//! The real file system with counters: how many `fdatasync`s and bytes a phase cost.
//!
//! The benches run the store and the cursors' offset files on [`CountingFs`], which passes
//! every call to [`RealFs`] and counts syncs and bytes on the way, so "fsyncs per slab" is
//! counted, not estimated. Syncs of cursor offset files (`fanout-*` files) are also counted
//! apart, so the time a cursor spends advancing can be told from the time it spends
//! committing. Reads from the device itself (the read-back an append makes after its
//! `fdatasync`) are counted and timed apart from reads through the page cache.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use narad_storage::fs::{DirEntry, File, FileSystem, LockGuard, Metadata, OpenMode, RealFs};

/// The counters, shared by every file opened through one [`CountingFs`].
#[derive(Debug, Default)]
struct Counters {
    file_syncs: AtomicU64,
    file_sync_nanos: AtomicU64,
    offset_syncs: AtomicU64,
    offset_sync_nanos: AtomicU64,
    dir_syncs: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    device_reads: AtomicU64,
    device_read_nanos: AtomicU64,
    device_bytes_read: AtomicU64,
}

/// A reading of the counters; subtract two to get a phase's cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    /// `fdatasync` calls on files.
    pub file_syncs: u64,
    /// Time spent in them, nanoseconds (summed over threads).
    pub file_sync_nanos: u64,
    /// Of those, `fdatasync` calls on cursor offset files.
    pub offset_syncs: u64,
    /// Time spent in them, nanoseconds.
    pub offset_sync_nanos: u64,
    /// `fsync` calls on directories.
    pub dir_syncs: u64,
    /// Bytes written to files.
    pub bytes_written: u64,
    /// Bytes read from files.
    pub bytes_read: u64,
    /// Reads from the device, past the page cache (appends' read-backs), successful or not.
    pub device_reads: u64,
    /// Time spent in them, nanoseconds (summed over threads).
    pub device_read_nanos: u64,
    /// Bytes they read (also counted in `bytes_read`).
    pub device_bytes_read: u64,
}

impl IoCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &IoCounts) -> IoCounts {
        IoCounts {
            file_syncs: self.file_syncs.saturating_sub(earlier.file_syncs),
            file_sync_nanos: self.file_sync_nanos.saturating_sub(earlier.file_sync_nanos),
            offset_syncs: self.offset_syncs.saturating_sub(earlier.offset_syncs),
            offset_sync_nanos: self
                .offset_sync_nanos
                .saturating_sub(earlier.offset_sync_nanos),
            dir_syncs: self.dir_syncs.saturating_sub(earlier.dir_syncs),
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            device_reads: self.device_reads.saturating_sub(earlier.device_reads),
            device_read_nanos: self
                .device_read_nanos
                .saturating_sub(earlier.device_read_nanos),
            device_bytes_read: self
                .device_bytes_read
                .saturating_sub(earlier.device_bytes_read),
        }
    }

    /// File and directory syncs together.
    pub fn syncs(&self) -> u64 {
        self.file_syncs + self.dir_syncs
    }
}

/// [`RealFs`] counting syncs and bytes. Clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct CountingFs {
    counters: Arc<Counters>,
}

impl CountingFs {
    /// A fresh counting file system with zeroed counters.
    pub fn new() -> CountingFs {
        CountingFs::default()
    }

    /// The counters now.
    pub fn counts(&self) -> IoCounts {
        let c = &self.counters;
        IoCounts {
            file_syncs: c.file_syncs.load(Ordering::Relaxed),
            file_sync_nanos: c.file_sync_nanos.load(Ordering::Relaxed),
            offset_syncs: c.offset_syncs.load(Ordering::Relaxed),
            offset_sync_nanos: c.offset_sync_nanos.load(Ordering::Relaxed),
            dir_syncs: c.dir_syncs.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            device_reads: c.device_reads.load(Ordering::Relaxed),
            device_read_nanos: c.device_read_nanos.load(Ordering::Relaxed),
            device_bytes_read: c.device_bytes_read.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug)]
struct CountingFile {
    inner: Box<dyn File>,
    counters: Arc<Counters>,
    /// A cursor offset file (or its temporary twin).
    offset_file: bool,
}

impl CountingFile {
    /// Counts one device read begun at `start`, of `len` bytes when it succeeded.
    fn count_device_read<T>(&self, start: std::time::Instant, result: &io::Result<T>, len: usize) {
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let c = &self.counters;
        c.device_reads.fetch_add(1, Ordering::Relaxed);
        c.device_read_nanos.fetch_add(nanos, Ordering::Relaxed);
        if result.is_ok() {
            c.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
            c.device_bytes_read.fetch_add(len as u64, Ordering::Relaxed);
        }
    }
}

impl File for CountingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.inner.read_at(buf, offset)?;
        self.counters
            .bytes_read
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let n = self.inner.write_at(buf, offset)?;
        self.counters
            .bytes_written
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        // Counted whether or not it succeeds: the cost was paid either way.
        let start = std::time::Instant::now();
        let result = self.inner.sync_data();
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counters.file_syncs.fetch_add(1, Ordering::Relaxed);
        self.counters
            .file_sync_nanos
            .fetch_add(nanos, Ordering::Relaxed);
        if self.offset_file {
            self.counters.offset_syncs.fetch_add(1, Ordering::Relaxed);
            self.counters
                .offset_sync_nanos
                .fetch_add(nanos, Ordering::Relaxed);
        }
        result
    }

    fn read_exact_uncached_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = std::time::Instant::now();
        let result = self.inner.read_exact_uncached_at(buf, offset);
        self.count_device_read(start, &result, buf.len());
        result
    }

    fn read_uncached_into<'s>(
        &self,
        scratch: &'s mut Vec<u8>,
        len: usize,
        offset: u64,
    ) -> io::Result<&'s [u8]> {
        let start = std::time::Instant::now();
        let result = self.inner.read_uncached_into(scratch, len, offset);
        self.count_device_read(start, &result, len);
        result
    }

    fn drop_cache(&self) -> io::Result<()> {
        self.inner.drop_cache()
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl FileSystem for CountingFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn File>> {
        // Offset files are named `fanout-{child}.offset` (narad_storage::cursor).
        let offset_file = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("fanout-"));
        Ok(Box::new(CountingFile {
            inner: RealFs.open(path, mode)?,
            counters: Arc::clone(&self.counters),
            offset_file,
        }))
    }

    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        RealFs.metadata(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_dir_all(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        RealFs.read_dir(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir_all(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.counters.dir_syncs.fetch_add(1, Ordering::Relaxed);
        RealFs.sync_dir(path)
    }

    fn try_lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        RealFs.try_lock_exclusive(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        RealFs.exists(path)
    }

    fn restrict_tree(&self, dir: &Path) -> io::Result<u64> {
        RealFs.restrict_tree(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncs_and_bytes_through_the_real_file_system_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CountingFs::new();
        let before = fs.counts();
        let file = fs
            .open(&dir.path().join("f"), OpenMode::CreateReadWrite)
            .unwrap();
        file.write_all_at(b"hello", 0).unwrap();
        file.sync_data().unwrap();
        fs.sync_dir(dir.path()).unwrap();
        let mut buf = [0u8; 5];
        file.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello");
        // The read-back path, passed on to the real file (O_DIRECT where it can).
        let mut scratch = Vec::new();
        assert_eq!(
            file.read_uncached_into(&mut scratch, 5, 0).unwrap(),
            b"hello"
        );
        let spent = fs.counts().since(&before);
        assert!(spent.file_sync_nanos > 0);
        assert!(spent.device_read_nanos > 0);
        assert_eq!(
            spent,
            IoCounts {
                file_syncs: 1,
                file_sync_nanos: spent.file_sync_nanos,
                offset_syncs: 0,
                offset_sync_nanos: 0,
                dir_syncs: 1,
                bytes_written: 5,
                bytes_read: 10,
                device_reads: 1,
                device_read_nanos: spent.device_read_nanos,
                device_bytes_read: 5,
            }
        );
        assert_eq!(spent.syncs(), 2);
    }

    #[test]
    fn syncs_of_cursor_offset_files_are_counted_apart() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CountingFs::new();
        let offset = fs
            .open(
                &dir.path().join("fanout-child.offset"),
                OpenMode::CreateReadWrite,
            )
            .unwrap();
        let log = fs
            .open(
                &dir.path().join("00000000000000000000.log"),
                OpenMode::CreateReadWrite,
            )
            .unwrap();
        offset.sync_data().unwrap();
        log.sync_data().unwrap();
        log.sync_data().unwrap();
        let counts = fs.counts();
        assert_eq!((counts.file_syncs, counts.offset_syncs), (3, 1));
        assert!(counts.offset_sync_nanos <= counts.file_sync_nanos);
    }
}
