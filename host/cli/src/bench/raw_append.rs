//! The raw loops' durable append: `pwrite` at the file's end, `fdatasync`, and, when asked,
//! the read-back from the device the store makes after every sync of an append.
//!
//! The store acknowledges an append only once its bytes were read back from the device
//! (`O_DIRECT`), which moves every committed byte through the device twice. A raw loop that
//! only writes and syncs measures what the disk does without that check; the same loop with
//! [`ReadBack::FromDevice`] measures what the disk allows under the durability rule the
//! engine keeps, so the bench can tell the engine's own overhead from the check's device cost.

use std::path::{Path, PathBuf};

use narad_storage::fs::{File, FileSystem, OpenMode, RealFs};
use serde::Serialize;

use super::BenchError;

/// Whether a raw loop reads each append back from the device after its `fdatasync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadBack {
    /// Write and sync only.
    No,
    /// Write, sync, then read the bytes back from the device and compare them, as the store's
    /// append does.
    FromDevice,
}

/// An append-only plain file of a raw loop.
#[derive(Debug)]
pub struct RawFile {
    file: Box<dyn File>,
    path: PathBuf,
    end: u64,
    read_back: ReadBack,
    /// The read-back buffer, kept from one append to the next as the store keeps its own.
    scratch: Vec<u8>,
}

impl RawFile {
    /// Creates the file at `path` (it must not exist) on the real file system.
    pub fn create(path: &Path, read_back: ReadBack) -> Result<RawFile, BenchError> {
        let file = RealFs
            .open(path, OpenMode::CreateNew)
            .map_err(BenchError::io(format!("creating {}", path.display())))?;
        Ok(RawFile::on(file, path, read_back))
    }

    /// A raw file on `file`, already open and empty, named `path` in errors.
    pub fn on(file: Box<dyn File>, path: &Path, read_back: ReadBack) -> RawFile {
        RawFile {
            file,
            path: path.to_owned(),
            end: 0,
            read_back,
            scratch: Vec::new(),
        }
    }

    /// Appends `frame` durably: written at the end, synced, and with
    /// [`ReadBack::FromDevice`] read back from the device and compared; an error when any step
    /// fails or the device returns other bytes.
    pub fn append(&mut self, frame: &[u8]) -> Result<(), BenchError> {
        let context = || format!("writing {}", self.path.display());
        self.file
            .write_all_at(frame, self.end)
            .and_then(|()| self.file.sync_data())
            .map_err(BenchError::io(context()))?;
        if self.read_back == ReadBack::FromDevice {
            let read = self
                .file
                .read_uncached_into(&mut self.scratch, frame.len(), self.end)
                .map_err(BenchError::io(context()))?;
            if read != frame {
                return Err(BenchError::Io {
                    context: context(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the bytes read back from the device differ from the bytes written",
                    ),
                });
            }
        }
        self.end += frame.len() as u64;
        Ok(())
    }

    /// Bytes appended so far.
    pub fn len(&self) -> u64 {
        self.end
    }

    /// True before the first append.
    pub fn is_empty(&self) -> bool {
        self.end == 0
    }
}

#[cfg(test)]
mod tests {
    use narad_storage::fault::{Fault, FaultFs, FaultOp};

    use super::*;

    fn fault_file(fs: &FaultFs, path: &Path) -> Box<dyn File> {
        fs.create_dir_all(path.parent().unwrap()).unwrap();
        fs.open(path, OpenMode::CreateNew).unwrap()
    }

    #[test]
    fn appends_land_one_after_another_and_read_back_from_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.bin");
        let mut raw = RawFile::create(&path, ReadBack::FromDevice).unwrap();
        raw.append(b"first frame ").unwrap();
        raw.append(b"second").unwrap();
        assert_eq!(raw.len(), 18);
        assert_eq!(std::fs::read(&path).unwrap(), b"first frame second");
    }

    #[test]
    fn a_write_the_device_never_got_fails_the_append_only_when_read_back() {
        let path = Path::new("/raw/child.bin");
        for (read_back, fails) in [(ReadBack::FromDevice, true), (ReadBack::No, false)] {
            let fs = FaultFs::new();
            // The sync reports success, but the device does not hold the bytes.
            fs.inject(FaultOp::SyncData, 1, Fault::LostWrite);
            let mut raw = RawFile::on(fault_file(&fs, path), path, read_back);
            let outcome = raw.append(b"a frame the device lost");
            assert_eq!(outcome.is_err(), fails, "{read_back:?}: {outcome:?}");
        }
    }
}
