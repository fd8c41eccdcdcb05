//! A device that runs out of space under a file system that believes it has room: ext4 without a
//! journal on a loop device whose backing file lives on a small tmpfs. Shared by the storage
//! crate's tests and the daemon's end-to-end test (included there by path), so both exercise
//! the same device.
//!
//! Needs root (mount, losetup, e2fsck); it fails, loudly, without it. The mounts and the loop
//! device are removed by [`DiskFullFs`]'s drop whatever happens.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Size of the tmpfs holding the loop device's backing file: small enough to fill in seconds.
pub const TMPFS_SIZE: &str = "24m";
/// Size the tmpfs is grown to before the second mount, so the check runs with room to spare.
pub const TMPFS_GROWN_SIZE: &str = "96m";
/// Apparent size of the sparse backing file: far larger than the tmpfs, so ext4 sees free
/// space the device cannot provide.
pub const IMAGE_SIZE: &str = "256M";
/// Bytes of a filler file on the tmpfs, removed later to give the device room again.
pub const FILLER_BYTES: usize = 4 * 1024 * 1024;

/// Runs `program`, returning its trimmed standard output or an error naming it.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program} could not start: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(format!(
            "{program} {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// [`run`], panicking on failure.
pub fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Unmounts `path`, retrying for a moment while it is busy, then lazily as a last resort.
pub fn unmount(path: &Path) -> Result<(), String> {
    let p = path.to_string_lossy().to_string();
    let mut last = String::new();
    for _ in 0..50 {
        match run("umount", &[&p]) {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    run("umount", &["-l", &p])
        .map(|_| ())
        .map_err(|e| format!("{last}; {e}"))
}

/// The tmpfs, the backing file, the loop device and the ext4 mount; all undone on drop.
pub struct DiskFullFs {
    /// Holds the mount points; removed (by its own drop) after `drop` below unmounted them.
    _root: tempfile::TempDir,
    tmpfs: PathBuf,
    image: PathBuf,
    filler: PathBuf,
    mnt: PathBuf,
    tmpfs_mounted: bool,
    device: Option<String>,
    ext4_mounted: bool,
}

impl DiskFullFs {
    /// Mounts the tmpfs, fills part of it, makes and mounts the file system. Panics, saying
    /// why, without root.
    pub fn new() -> DiskFullFs {
        let uid = must("id", &["-u"]);
        assert_eq!(
            uid, "0",
            "this test needs root: it mounts a tmpfs, attaches a loop device and mounts ext4 on it \
             (CI runs it as root); run it with sudo"
        );
        let root = tempfile::tempdir().expect("tempdir");
        let mut fs = DiskFullFs {
            tmpfs: root.path().join("backing"),
            image: root.path().join("backing/disk.img"),
            filler: root.path().join("backing/filler"),
            mnt: root.path().join("mnt"),
            _root: root,
            tmpfs_mounted: false,
            device: None,
            ext4_mounted: false,
        };
        std::fs::create_dir(&fs.tmpfs).expect("mkdir backing");
        std::fs::create_dir(&fs.mnt).expect("mkdir mnt");
        must(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={TMPFS_SIZE}"),
                "tmpfs",
                &fs.tmpfs.to_string_lossy(),
            ],
        );
        fs.tmpfs_mounted = true;
        std::fs::write(&fs.filler, vec![0x5a; FILLER_BYTES]).expect("write filler");
        let image = fs.image.to_string_lossy().to_string();
        must("truncate", &["-s", IMAGE_SIZE, &image]);
        must("mkfs.ext4", &["-q", "-F", "-O", "^has_journal", &image]);
        fs.mount_ext4();
        fs
    }

    /// Attaches the image to a loop device and mounts it (errors continue: a failed metadata
    /// write does not turn the file system read-only under the code being tested).
    pub fn mount_ext4(&mut self) {
        let image = self.image.to_string_lossy().to_string();
        let device = must("losetup", &["--find", "--show", &image]);
        self.device = Some(device.clone());
        must(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "errors=continue",
                &device,
                &self.mnt.to_string_lossy(),
            ],
        );
        self.ext4_mounted = true;
    }

    /// Unmounts the file system and detaches the loop device.
    pub fn unmount_ext4(&mut self) {
        if self.ext4_mounted {
            unmount(&self.mnt).unwrap_or_else(|e| panic!("{e}"));
            self.ext4_mounted = false;
        }
        if let Some(device) = self.device.take() {
            must("losetup", &["-d", &device]);
        }
    }

    /// Gives the device room again: removes the filler file from the tmpfs.
    pub fn free_space(&self) {
        std::fs::remove_file(&self.filler).expect("remove filler");
    }

    /// Checks and repairs the unmounted file system, as an operator does after the device
    /// refused writes under it: metadata writes the loop device refused leave ext4 (without a
    /// journal) with blocks in use marked free, and a mount without the repair can refuse
    /// later allocations with "Structure needs cleaning". Returns what `e2fsck` printed;
    /// panics if it could not repair.
    pub fn repair_ext4(&self) -> String {
        assert!(!self.ext4_mounted, "e2fsck on a mounted file system");
        let image = self.image.to_string_lossy().to_string();
        let output = Command::new("e2fsck")
            .args(["-f", "-y", &image])
            .output()
            .unwrap_or_else(|e| panic!("e2fsck could not start: {e}"));
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // 0: clean; 1: errors corrected. Anything else: the repair did not finish.
        assert!(
            matches!(output.status.code(), Some(0) | Some(1)),
            "e2fsck could not repair the file system ({}):\n{printed}",
            output.status
        );
        printed
    }

    /// Grows the tmpfs under the image, so the device has room to spare again.
    pub fn grow_tmpfs(&self) {
        must(
            "mount",
            &[
                "-o",
                &format!("remount,size={TMPFS_GROWN_SIZE}"),
                &self.tmpfs.to_string_lossy(),
            ],
        );
    }

    /// A directory on the ext4 file system (not created).
    pub fn data_dir(&self) -> PathBuf {
        self.mnt.join("data")
    }
}

impl Drop for DiskFullFs {
    fn drop(&mut self) {
        // Best effort, in order, each step tried even if an earlier one failed; a leftover is
        // reported on stderr rather than hidden.
        if self.ext4_mounted
            && let Err(e) = unmount(&self.mnt)
        {
            eprintln!("full device cleanup: {e}");
        }
        if let Some(device) = self.device.take()
            && let Err(e) = run("losetup", &["-d", &device])
        {
            eprintln!("full device cleanup: {e}");
        }
        if self.tmpfs_mounted
            && let Err(e) = unmount(&self.tmpfs)
        {
            eprintln!("full device cleanup: {e}");
        }
    }
}
