//! A partition's files on their way to another store: what a planned move copies.
//!
//! The sending store seals the partition ([`crate::Store::seal`]: closed cleanly, no reads or
//! appends), describes its directory as a [`Manifest`] (every file with its length and CRC-32C)
//! and serves it in chunks of at most [`MAX_CHUNK_BYTES`]. The receiving store writes each file
//! into a staging directory ([`Staging`]), checks length and CRC-32C against the manifest, syncs
//! it, and only then renames the whole directory into `topics/` ([`Staging::install`]), so a
//! crash mid-copy never leaves a partial partition where a log is looked for. Nothing here
//! decides who owns the partition: the caller does, in the shared metadata, after the install.
//!
//! File names in a manifest are relative to the partition directory: a plain name (`*.log`,
//! `high-watermark`, `log-start`, `fanout-{child}.offset`) or one level below it (`torn/...`).
//! A name with any other shape is refused on both sides ([`check_name`]), so a peer cannot make
//! a store read or write outside the partition's directory.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StorageError};
use crate::fs::{File, FileSystem, OpenMode};
use crate::name::PartitionId;

/// Largest chunk of a file one request carries: bounds the memory a transfer holds.
pub const MAX_CHUNK_BYTES: u64 = 4 * 1024 * 1024;

/// Name of the data-directory subdirectory that holds moves being received.
pub const STAGING_DIR_NAME: &str = "moving";

/// Bytes read per step while checksumming a file.
const CHECKSUM_READ_BYTES: usize = 1024 * 1024;

/// One file of a sealed partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the partition directory (see the module doc).
    pub name: String,
    /// Length in bytes.
    pub len: u64,
    /// CRC-32C (Castagnoli) of the whole file.
    pub crc32c: u32,
}

/// Every file of a sealed partition, and the end of its log as its high-watermark file
/// records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The files, sorted by name.
    pub files: Vec<FileEntry>,
    /// The next offset to be written, from the cleanly closed log.
    pub high_watermark: u64,
}

impl Manifest {
    /// Total bytes of the files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }
}

/// Refuses a name that is not a plain file name in the partition directory or in one of its
/// subdirectories (no `..`, no absolute path, no more than two components).
pub fn check_name(id: &PartitionId, name: &str) -> Result<()> {
    let path = Path::new(name);
    let components: Vec<Component<'_>> = path.components().collect();
    let plain = !components.is_empty()
        && components.len() <= 2
        && components.iter().all(|c| matches!(c, Component::Normal(_)))
        && !name.contains('\\');
    if plain {
        Ok(())
    } else {
        Err(StorageError::NoSuchFile {
            id: id.clone(),
            name: name.to_owned(),
        })
    }
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StorageError {
    let context = context.into();
    move |e| StorageError::io(context, e)
}

/// Lists and checksums every file under `dir` (one level of subdirectories), sorted by name.
pub(crate) fn describe(fs: &dyn FileSystem, dir: &Path) -> Result<Vec<FileEntry>> {
    let mut files = Vec::new();
    for entry in fs
        .read_dir(dir)
        .map_err(io(format!("listing {}", dir.display())))?
    {
        if entry.is_dir {
            let sub = dir.join(&entry.name);
            for inner in fs
                .read_dir(&sub)
                .map_err(io(format!("listing {}", sub.display())))?
            {
                if !inner.is_dir {
                    let name = format!("{}/{}", entry.name, inner.name);
                    files.push(checksum(fs, &sub.join(&inner.name), name)?);
                }
            }
        } else {
            let name = entry.name.clone();
            files.push(checksum(fs, &dir.join(&entry.name), name)?);
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

fn checksum(fs: &dyn FileSystem, path: &Path, name: String) -> Result<FileEntry> {
    let file = fs
        .open(path, OpenMode::Read)
        .map_err(io(format!("opening {}", path.display())))?;
    let len = file
        .len()
        .map_err(io(format!("sizing {}", path.display())))?;
    let mut crc = 0u32;
    let mut buf = vec![0u8; CHECKSUM_READ_BYTES];
    let mut at = 0u64;
    while at < len {
        let step = usize::try_from((len - at).min(CHECKSUM_READ_BYTES as u64)).unwrap_or(0);
        file.read_exact_at(&mut buf[..step], at)
            .map_err(io(format!("reading {}", path.display())))?;
        crc = crc32c::crc32c_append(crc, &buf[..step]);
        at += step as u64;
    }
    Ok(FileEntry {
        name,
        len,
        crc32c: crc,
    })
}

/// Reads at most `max` (capped at [`MAX_CHUNK_BYTES`]) bytes of file `name` of the partition
/// in `dir`, from `offset`. Empty at or past the end.
pub(crate) fn read_chunk(
    fs: &dyn FileSystem,
    id: &PartitionId,
    dir: &Path,
    name: &str,
    offset: u64,
    max: u64,
) -> Result<Vec<u8>> {
    check_name(id, name)?;
    let path = dir.join(name);
    let file = match fs.open(&path, OpenMode::Read) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StorageError::NoSuchFile {
                id: id.clone(),
                name: name.to_owned(),
            });
        }
        Err(e) => return Err(StorageError::io(format!("opening {}", path.display()), e)),
    };
    let len = file
        .len()
        .map_err(io(format!("sizing {}", path.display())))?;
    let step = len.saturating_sub(offset).min(max.min(MAX_CHUNK_BYTES));
    let mut buf = vec![0u8; usize::try_from(step).unwrap_or(0)];
    file.read_exact_at(&mut buf, offset)
        .map_err(io(format!("reading {}", path.display())))?;
    Ok(buf)
}

/// A partition being received, in `{data_dir}/moving/{topic}.{pNNNNN}/`, invisible to the store
/// until [`Staging::install`]. Clones name the same directory.
#[derive(Debug, Clone)]
pub struct Staging {
    fs: Arc<dyn FileSystem>,
    id: PartitionId,
    dir: PathBuf,
    target: PathBuf,
}

impl Staging {
    /// Starts receiving `id`: an empty staging directory (what an earlier, unfinished receive
    /// of the same partition left there is only ever a partial copy of files that still exist
    /// at their source, and is removed).
    pub(crate) fn begin(
        fs: Arc<dyn FileSystem>,
        data_dir: &Path,
        id: &PartitionId,
        target: PathBuf,
    ) -> Result<Staging> {
        let root = data_dir.join(STAGING_DIR_NAME);
        let dir = root.join(format!("{}.{}", id.topic, id.dir_name()));
        if fs
            .exists(&dir)
            .map_err(io(format!("checking {}", dir.display())))?
        {
            fs.remove_dir_all(&dir)
                .map_err(io(format!("clearing {}", dir.display())))?;
        }
        fs.create_dir_all(&dir)
            .map_err(io(format!("creating {}", dir.display())))?;
        Ok(Staging {
            fs,
            id: id.clone(),
            dir,
            target,
        })
    }

    /// A new, empty file `name` of the partition being received.
    pub fn create(&self, name: &str) -> Result<StagedFile> {
        check_name(&self.id, name)?;
        let path = self.dir.join(name);
        if let Some(parent) = path.parent()
            && parent != self.dir
        {
            self.fs
                .create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        let file = self
            .fs
            .open(&path, OpenMode::CreateNew)
            .map_err(io(format!("creating {}", path.display())))?;
        Ok(StagedFile {
            name: name.to_owned(),
            path,
            file,
            len: 0,
            crc: 0,
        })
    }

    /// Moves the received directory to its place in `topics/`, durably. Refuses when a
    /// directory is already there ([`StorageError::InstallTargetExists`]): that is data this
    /// store cannot account for, and it is the caller's to set aside first.
    pub fn install(self) -> Result<()> {
        let fs = self.fs.as_ref();
        for sub in fs
            .read_dir(&self.dir)
            .map_err(io(format!("listing {}", self.dir.display())))?
        {
            if sub.is_dir {
                let d = self.dir.join(&sub.name);
                fs.sync_dir(&d)
                    .map_err(io(format!("syncing {}", d.display())))?;
            }
        }
        fs.sync_dir(&self.dir)
            .map_err(io(format!("syncing {}", self.dir.display())))?;
        if fs
            .exists(&self.target)
            .map_err(io(format!("checking {}", self.target.display())))?
        {
            return Err(StorageError::InstallTargetExists { path: self.target });
        }
        let Some(topic_dir) = self.target.parent() else {
            return Err(StorageError::InstallTargetExists { path: self.target });
        };
        fs.create_dir_all(topic_dir)
            .map_err(io(format!("creating {}", topic_dir.display())))?;
        fs.rename(&self.dir, &self.target).map_err(io(format!(
            "moving {} to {}",
            self.dir.display(),
            self.target.display()
        )))?;
        let mut dirs = vec![topic_dir.to_path_buf()];
        if let Some(topics) = topic_dir.parent() {
            dirs.push(topics.to_path_buf());
        }
        if let Some(staging_root) = self.dir.parent() {
            dirs.push(staging_root.to_path_buf());
        }
        for d in dirs {
            fs.sync_dir(&d)
                .map_err(io(format!("syncing {}", d.display())))?;
        }
        Ok(())
    }

    /// Writes file `name` with exactly `bytes`, synced: for files made here rather than
    /// received (a re-created partition's first segment, log start and offset files).
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let mut file = self.create(name)?;
        file.write(bytes)?;
        let entry = FileEntry {
            name: name.to_owned(),
            len: bytes.len() as u64,
            crc32c: crc32c::crc32c(bytes),
        };
        file.finish(&entry)
    }

    /// Lays out an empty log whose first record will get offset `start_offset`: an empty
    /// first segment named for it and the log-start record vouching for it, so the log opens
    /// with that start and high watermark (a partition re-created after its node was lost
    /// must not hand out offsets its old log used).
    pub fn write_empty_log(&self, start_offset: u64) -> Result<()> {
        self.write_file(&crate::log::segment::segment_name(start_offset), &[])?;
        self.write_file(
            crate::log::start::LOG_START_FILE_NAME,
            &crate::log::start::encode(start_offset),
        )
    }

    /// Removes what was received (a move that failed or was cancelled).
    pub fn abandon(self) {
        if let Err(e) = self.fs.remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e,
                "could not remove an abandoned partition copy");
        }
    }
}

/// One file being received: appended in order, then checked against its manifest entry.
#[derive(Debug)]
pub struct StagedFile {
    name: String,
    path: PathBuf,
    file: Box<dyn File>,
    len: u64,
    crc: u32,
}

impl StagedFile {
    /// Appends the next chunk.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        self.file
            .write_all_at(chunk, self.len)
            .map_err(io(format!("writing {}", self.path.display())))?;
        self.len += chunk.len() as u64;
        self.crc = crc32c::crc32c_append(self.crc, chunk);
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks the file against `expected` and syncs it; a mismatch is
    /// [`StorageError::CopyMismatch`].
    pub fn finish(self, expected: &FileEntry) -> Result<()> {
        if self.len != expected.len || self.crc != expected.crc32c {
            return Err(StorageError::CopyMismatch {
                name: self.name,
                detail: format!(
                    "{} bytes with CRC-32C {:08x}, the source has {} bytes with {:08x}",
                    self.len, self.crc, expected.len, expected.crc32c
                ),
            });
        }
        self.file
            .sync_data()
            .map_err(io(format!("syncing {}", self.path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_inside_the_partition_directory_pass() {
        let id = PartitionId::new("t".to_owned(), 0);
        for good in [
            "00000000000000000000.log",
            "high-watermark",
            "torn/0-12.bin",
        ] {
            assert!(check_name(&id, good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "../x",
            "/etc/passwd",
            "a/b/c",
            "torn/../../x",
            ".",
            "a\\b",
        ] {
            assert!(
                matches!(check_name(&id, bad), Err(StorageError::NoSuchFile { .. })),
                "{bad}"
            );
        }
    }
}
