//! What the benches read from the operating system: resident memory and its high-water mark,
//! the process's CPU time, the load average, and which file system a directory is on.
//!
//! Linux `/proc` only. Where a figure cannot be read it is `None`, never a made-up number.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// Clock ticks per second of the times in `/proc/self/stat`: the kernel's `USER_HZ`, fixed at
/// 100 by the `/proc` ABI on the architectures this runs on (x86-64, aarch64).
const PROC_TICKS_PER_SECOND: u64 = 100;

/// Bytes in one kibibyte: `/proc/self/status` reports memory in kB, meaning KiB.
const KIB_BYTES: u64 = 1024;

fn status_field_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line
        .trim_start_matches(field)
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * KIB_BYTES)
}

/// The process's peak resident set size so far (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    status_field_bytes("VmHWM")
}

/// Bytes the process's allocator has handed out and not had back (glibc's `mallinfo2`: small
/// blocks in use plus mmapped ones): what a structure built between two readings holds.
pub fn allocated_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

/// The process's resident set size now (`VmRSS`), in bytes.
pub fn rss_bytes() -> Option<u64> {
    status_field_bytes("VmRSS")
}

/// Resets the peak resident set size to the current one (writes `5` to
/// `/proc/self/clear_refs`), so a phase's peak is not the previous phase's. Returns whether it
/// worked.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// CPU time this process has used, user plus system, all threads (including exited ones), at
/// the 10 ms resolution of `/proc/self/stat`.
pub fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    let ticks = utime + stime;
    Some(Duration::from_millis(ticks * 1000 / PROC_TICKS_PER_SECOND))
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), as `uptime` prints them.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The file system a directory is on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileSystemInfo {
    /// Its type (`ext4`, `xfs`, `tmpfs`, `overlay`, ...).
    pub fs_type: String,
    /// The mounted device or source.
    pub source: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
}

/// Undoes the octal escapes (`\040` for a space) of `/proc/self/mountinfo` paths.
fn unescape_mount_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(code) = u8::from_str_radix(&path[i + 1..i + 4], 8)
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The file system `path` is on: the mount in `/proc/self/mountinfo` with the longest mount
/// point containing it.
pub fn file_system_of(path: &Path) -> Option<FileSystemInfo> {
    let path = path.canonicalize().ok()?;
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<FileSystemInfo> = None;
    for line in table.lines() {
        // `id parent major:minor root mount-point options [optional...] - type source super`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let mount_point = PathBuf::from(unescape_mount_path(mount_point));
        if !path.starts_with(&mount_point) {
            continue;
        }
        let mut right = right.split_whitespace();
        let (Some(fs_type), Some(source)) = (right.next(), right.next()) else {
            continue;
        };
        let longer = best
            .as_ref()
            .is_none_or(|b| mount_point.as_os_str().len() >= b.mount_point.as_os_str().len());
        if longer {
            best = Some(FileSystemInfo {
                fs_type: fs_type.to_owned(),
                source: source.to_owned(),
                mount_point,
            });
        }
    }
    best
}

/// A load average (1, 5, 15 min) as a report prints it, or `unknown`.
pub fn load_text(load: Option<[f64; 3]>) -> String {
    load.map_or_else(
        || "unknown".to_owned(),
        |l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]),
    )
}

/// A file system as a report prints it (`ext4 (/dev/vda)`), or `unknown`.
pub fn file_system_text(fs: Option<&FileSystemInfo>) -> String {
    fs.map_or_else(
        || "unknown".to_owned(),
        |f| format!("{} ({})", f.fs_type, f.source),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_with_escaped_spaces_are_unescaped() {
        assert_eq!(unescape_mount_path("/mnt/my\\040disk"), "/mnt/my disk");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
    }

    #[test]
    fn the_root_directory_is_on_some_file_system() {
        let fs = file_system_of(Path::new("/")).unwrap();
        assert_eq!(fs.mount_point, PathBuf::from("/"));
        assert!(!fs.fs_type.is_empty());
    }

    #[test]
    fn memory_and_cpu_figures_are_read_from_proc() {
        let rss = rss_bytes().unwrap();
        assert!(rss > 0);
        assert!(peak_rss_bytes().unwrap() > 0);
        // Burn a little CPU so the counter cannot stay at zero by accident of timing.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(cpu_time().unwrap() > Duration::ZERO);
        assert_eq!(load_average().map(|l| l.len()), Some(3));
    }
}
