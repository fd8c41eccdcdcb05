//! Fan-out cursor files: the durable position of one (parent partition, child) cursor.
//!
//! One file per pair, beside the parent partition's log:
//! `topics/{parent}/p{00000}/fanout-{child}.offset`, holding the record described in
//! [`format`](mod@format). The rules it keeps:
//!
//! - **Advance in place.** Once a fixed-size record exists, moving the position is one write
//!   of 256 bytes at offset 0 and one `fdatasync`; the caller does it only after every child
//!   commit of the slab below the new position was acknowledged.
//! - **Or write now, sync later** ([`CursorFile::advance_unsynced`], then
//!   [`CursorFile::sync`]): the same write without the `fdatasync`, so that one sync can cover
//!   several positions. The written position is what readers of the file and a restart after
//!   the process dies see (the kernel holds the page); a power loss before the sync leaves the
//!   last synced position, which is behind, never ahead ([`CursorFile::durable_offset`]).
//! - **Replace atomically** (temp file, `fdatasync`, rename, directory fsync) for the first
//!   anchor, for migrating the older variable-length format, and for an epoch too long to pad.
//! - **Never trust a handle after a failed sync.** Linux may have dropped the dirty page, so the
//!   next write goes through the atomic path on a fresh file instead of retrying in place.
//! - **Read again before calling it corrupt.** A reader can catch the writer mid-write, so a
//!   record that fails its CRC is read a few more times before it is reported corrupt.
//!
//! Whether a found record may be resumed (same epoch) and where a missing or corrupt one
//! restarts (the attach point) is the cursor's decision, not this module's.

pub mod format;
pub mod gaps;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use format::{
    CURSOR_RECORD_BYTES, CursorRecord, Decoded, EncodeError, InvalidRecord, RecordLayout,
};

use crate::fs::{File, FileSystem, OpenMode};

/// File-name prefix and suffix of cursor files inside a parent partition directory.
const FILE_PREFIX: &str = "fanout-";
const FILE_SUFFIX: &str = ".offset";

/// How many times a record that fails its check is read again before it is called corrupt.
pub const CORRUPT_REREADS: u32 = 3;

/// Pause between two reads of a record that failed its check: long enough for a writer caught
/// mid-write to finish its 256-byte write.
pub const REREAD_PAUSE: Duration = Duration::from_millis(2);

/// Errors of cursor-file I/O.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CursorError {
    /// A file-system operation failed; the position on disk is whatever it was before.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The record could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// Result alias for cursor-file operations.
pub type Result<T, E = CursorError> = std::result::Result<T, E>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CursorError + 'a {
    move |source| CursorError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What a cursor finds on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CursorLoad {
    /// No file: the cursor starts at its attach point.
    Missing,
    /// A valid record.
    Found {
        /// The stored position.
        record: CursorRecord,
        /// How it was stored.
        layout: RecordLayout,
    },
    /// A file that still failed its check after [`CORRUPT_REREADS`] more reads.
    Corrupt {
        /// Why the bytes are not a valid record.
        reason: InvalidRecord,
    },
}

/// The name of the cursor file for `child`: `fanout-{child}.offset`.
pub fn cursor_file_name(child: &str) -> String {
    format!("{FILE_PREFIX}{child}{FILE_SUFFIX}")
}

/// Children that have a cursor file in `partition_dir` (for the orphan sweep).
pub fn list_cursor_children(fs: &dyn FileSystem, partition_dir: &Path) -> Result<Vec<String>> {
    let entries = match fs.read_dir(partition_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", partition_dir)(e)),
    };
    Ok(entries
        .into_iter()
        .filter(|entry| !entry.is_dir)
        .filter_map(|entry| {
            entry
                .name
                .strip_prefix(FILE_PREFIX)
                .and_then(|rest| rest.strip_suffix(FILE_SUFFIX))
                .map(str::to_string)
        })
        .collect())
}

/// The bytes of `path`, at most `max + 1` of them (so a longer file is seen as too long).
fn read_whole(fs: &dyn FileSystem, path: &Path, max: usize) -> Result<Option<Vec<u8>>> {
    let file = match fs.open(path, OpenMode::Read) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("open", path)(e)),
    };
    let len = file.len().map_err(io_err("stat", path))?;
    let len = usize::try_from(len)
        .unwrap_or(usize::MAX)
        .min(max.saturating_add(1));
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, 0)
        .map_err(io_err("read", path))?;
    Ok(Some(bytes))
}

/// Reads the cursor file at `path`, re-reading a record that fails its check
/// [`CORRUPT_REREADS`] times before reporting it corrupt.
pub fn load(fs: &dyn FileSystem, path: &Path) -> Result<CursorLoad> {
    let mut attempt = 0;
    loop {
        let Some(bytes) = read_whole(fs, path, format::MAX_CURSOR_FILE_BYTES)? else {
            return Ok(CursorLoad::Missing);
        };
        match format::decode(&bytes) {
            Decoded::Valid(record, layout) => return Ok(CursorLoad::Found { record, layout }),
            Decoded::Invalid(reason) if attempt >= CORRUPT_REREADS => {
                return Ok(CursorLoad::Corrupt { reason });
            }
            Decoded::Invalid(_) => {
                attempt += 1;
                std::thread::sleep(REREAD_PAUSE);
            }
        }
    }
}

/// Deletes the cursor file at `path` (missing is fine) and makes the removal durable.
pub fn remove(fs: &dyn FileSystem, path: &Path) -> Result<()> {
    match fs.remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("remove", path)(e)),
    }
    if let Some(dir) = path.parent() {
        fs.sync_dir(dir).map_err(io_err("fsync directory", dir))?;
    }
    Ok(())
}

/// An open cursor file positioned at a known record, ready to advance.
#[derive(Debug)]
pub struct CursorFile {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    record: CursorRecord,
    /// The position last made durable: `record.next_offset` unless an
    /// [`CursorFile::advance_unsynced`] is not synced yet.
    durable: u64,
    /// A handle for in-place writes; `None` when the next write must replace the file
    /// atomically (no fixed record yet, or the handle failed a sync and cannot be trusted).
    in_place: Option<Box<dyn File>>,
}

impl CursorFile {
    /// Writes `record` to `path` by atomic replacement (the first anchor). Durable on return.
    pub fn anchor(
        fs: Arc<dyn FileSystem>,
        path: &Path,
        record: CursorRecord,
    ) -> Result<CursorFile> {
        let mut cursor = CursorFile {
            fs,
            path: path.to_path_buf(),
            durable: record.next_offset,
            record,
            in_place: None,
        };
        cursor.replace_atomically()?;
        Ok(cursor)
    }

    /// Continues from a record [`load`] found at `path`. A record in the fixed layout is
    /// advanced in place from now on; one in the older or long layout is rewritten atomically
    /// at once, so that an older-format file is migrated before the cursor moves.
    pub fn resume(
        fs: Arc<dyn FileSystem>,
        path: &Path,
        record: CursorRecord,
        layout: RecordLayout,
    ) -> Result<CursorFile> {
        if layout != RecordLayout::Fixed {
            return CursorFile::anchor(fs, path, record);
        }
        let handle = fs
            .open(path, OpenMode::ReadWrite)
            .map_err(io_err("open", path))?;
        Ok(CursorFile {
            fs,
            path: path.to_path_buf(),
            durable: record.next_offset,
            record,
            in_place: Some(handle),
        })
    }

    /// The position on file: the first parent offset not yet committed to the child, as last
    /// written (durable once [`CursorFile::durable_offset`] has caught up with it).
    pub fn next_offset(&self) -> u64 {
        self.record.next_offset
    }

    /// The position a power loss now would leave in the file: the last one written with
    /// [`CursorFile::advance`] or made durable by [`CursorFile::sync`].
    pub fn durable_offset(&self) -> u64 {
        self.durable
    }

    /// The attach epoch this file belongs to.
    pub fn epoch(&self) -> &str {
        &self.record.epoch
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the durable position to `next_offset`: one write at offset 0 and one
    /// `fdatasync` when possible, an atomic replacement otherwise. On error the position in
    /// memory is unchanged and the handle is dropped, so the next call starts from a fresh file.
    pub fn advance(&mut self, next_offset: u64) -> Result<()> {
        self.move_to(next_offset, true)
    }

    /// Writes `next_offset` as the position without waiting for the device: readers of the
    /// file and a restart after the process dies see it at once, and the next
    /// [`CursorFile::sync`] or [`CursorFile::advance`] makes it durable. Until then a power
    /// loss leaves [`CursorFile::durable_offset`]. Without an in-place handle (no fixed record
    /// yet, or the last sync failed) this is [`CursorFile::advance`]: the file is replaced
    /// atomically, durably. On error the position in memory is unchanged and the handle is
    /// dropped, as for [`CursorFile::advance`].
    pub fn advance_unsynced(&mut self, next_offset: u64) -> Result<()> {
        self.move_to(next_offset, false)
    }

    /// Makes the position last written durable (one `fdatasync`); nothing to do when it is
    /// already. On error the durable position is unchanged and the handle is dropped, so the
    /// next write or sync replaces the file atomically instead of trusting it.
    pub fn sync(&mut self) -> Result<()> {
        if self.durable == self.record.next_offset {
            return Ok(());
        }
        let outcome = match self.in_place.as_ref() {
            Some(handle) => handle.sync_data().map_err(io_err("fdatasync", &self.path)),
            None => self.replace_atomically(),
        };
        match outcome {
            Ok(()) => self.durable = self.record.next_offset,
            Err(_) => self.in_place = None,
        }
        outcome
    }

    fn move_to(&mut self, next_offset: u64, sync: bool) -> Result<()> {
        let previous = self.record.next_offset;
        self.record.next_offset = next_offset;
        let (outcome, synced) = match self.in_place.as_ref() {
            Some(handle) => (self.write_in_place(handle.as_ref(), sync), sync),
            None => (self.replace_atomically(), true),
        };
        match &outcome {
            Ok(()) if synced => self.durable = next_offset,
            Ok(()) => {}
            Err(_) => {
                self.record.next_offset = previous;
                self.in_place = None;
            }
        }
        outcome
    }

    fn write_in_place(&self, handle: &dyn File, sync: bool) -> Result<()> {
        let (bytes, layout) = format::encode(&self.record)?;
        debug_assert_eq!(
            layout,
            RecordLayout::Fixed,
            "the epoch fitted when the file was written"
        );
        handle
            .write_all_at(&bytes, 0)
            .map_err(io_err("write", &self.path))?;
        if !sync {
            return Ok(());
        }
        handle.sync_data().map_err(io_err("fdatasync", &self.path))
    }

    fn replace_atomically(&mut self) -> Result<()> {
        let (bytes, layout) = format::encode(&self.record)?;
        let (Some(dir), Some(name)) = (
            self.path.parent(),
            self.path.file_name().and_then(|name| name.to_str()),
        ) else {
            return Err(CursorError::Io {
                op: "replace",
                path: self.path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "no directory or file name"),
            });
        };
        // The temp file is `{name}.tmp`: `fanout-cursor.{child}.offset.tmp`, as before.
        crate::fs::replace_file(self.fs.as_ref(), dir, name, &bytes)
            .map_err(io_err("replace", &self.path))?;
        self.in_place = if layout == RecordLayout::Fixed {
            Some(
                self.fs
                    .open(&self.path, OpenMode::ReadWrite)
                    .map_err(io_err("open", &self.path))?,
            )
        } else {
            None
        };
        Ok(())
    }
}
