//! Where a bench writes: a fresh directory, removed when the bench ends, on the disk the
//! caller names (default: the current directory's), never silently on a tmpfs `/tmp`.

use std::path::{Path, PathBuf};

use super::BenchError;
use super::sys::{FileSystemInfo, file_system_of};

/// A bench's directory and the file system it is on. Dropping it removes the directory.
#[derive(Debug)]
pub struct WorkDir {
    temp: tempfile::TempDir,
    /// The file system it is on, when `/proc/self/mountinfo` could tell.
    pub file_system: Option<FileSystemInfo>,
}

impl WorkDir {
    /// Creates `narad-bench-*` under `parent`, or under the current directory when `None`
    /// (the current directory is on a real disk far more often than `/tmp`).
    pub fn create(parent: Option<&Path>) -> Result<WorkDir, BenchError> {
        let parent = match parent {
            Some(p) => p.to_path_buf(),
            None => {
                std::env::current_dir().map_err(BenchError::io("finding the current directory"))?
            }
        };
        std::fs::create_dir_all(&parent)
            .map_err(BenchError::io(format!("creating {}", parent.display())))?;
        // Owner-only, as a data dir must be (else the store warns at its first open).
        let temp = tempfile::Builder::new()
            .prefix("narad-bench-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir_in(&parent)
            .map_err(BenchError::io(format!(
                "creating a bench directory in {}",
                parent.display()
            )))?;
        let file_system = file_system_of(temp.path());
        Ok(WorkDir { temp, file_system })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.temp.path()
    }

    /// The directory as an owned path (for reports).
    pub fn path_buf(&self) -> PathBuf {
        self.temp.path().to_path_buf()
    }

    /// `type (source)` of its file system, or `unknown`.
    pub fn describe_file_system(&self) -> String {
        match &self.file_system {
            Some(fs) => format!(
                "{} ({} on {})",
                fs.fs_type,
                fs.source,
                fs.mount_point.display()
            ),
            None => "unknown".to_owned(),
        }
    }
}
