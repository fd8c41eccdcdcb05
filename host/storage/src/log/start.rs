//! The durable log-start file: one fixed 32-byte record per partition naming the oldest offset
//! the log is meant to hold. Only two things write it: the first open of a new partition
//! (start 0) and a retention step, which records the new start *before* it deletes any
//! segment file. Opening a log, closed-log retention and `peek` compare it with the oldest
//! segment file, so a missing head of the log is reported as damage instead of being passed
//! off as retention.
//!
//! ```text
//!  0  magic "NRDS"                 4 bytes
//!  4  crc32c                       u32 LE, Castagnoli, over bytes 8..32
//!  8  version                      u16 LE (1)
//! 10  reserved                     u16 LE (0)
//! 12  log start offset             u64 LE
//! 20  reserved                     12 zero bytes
//! ```
//!
//! The file is replaced, never rewritten in place: the new record goes to `log-start.tmp`,
//! which is `fdatasync`ed and renamed over `log-start`, and the directory is synced. A crash
//! therefore leaves the old record or the new one, never a torn one, so a record that fails its
//! check is damage, not a crash. Do not reorder fields: this layout is persisted.

use std::path::Path;

use crate::damage::Damage;
use crate::fs::{FileSystem, OpenMode};
use crate::log::segment::SegmentFile;

/// File name inside the partition directory.
pub const LOG_START_FILE_NAME: &str = "log-start";
/// Name of the replacement written before the rename (what [`crate::fs::replace_file`] uses);
/// a leftover one is overwritten.
pub const LOG_START_TMP_NAME: &str = "log-start.tmp";
/// Size of the record in bytes: the fields of the module table, rounded up to 32.
pub const LOG_START_LEN: usize = 32;
const MAGIC: [u8; 4] = *b"NRDS";
const VERSION: u16 = 1;

/// Encodes the record for `start`.
pub fn encode(start: u64) -> [u8; LOG_START_LEN] {
    let mut b = [0u8; LOG_START_LEN];
    b[0..4].copy_from_slice(&MAGIC);
    b[8..10].copy_from_slice(&VERSION.to_le_bytes());
    b[12..20].copy_from_slice(&start.to_le_bytes());
    let crc = crc32c::crc32c(&b[8..]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a record: `None` if it is short, has the wrong magic or version, or fails its CRC.
pub fn decode(b: &[u8]) -> Option<u64> {
    if b.len() != LOG_START_LEN || b[0..4] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    if crc32c::crc32c(&b[8..]) != crc || u16::from_le_bytes([b[8], b[9]]) != VERSION {
        return None;
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[12..20]);
    Some(u64::from_le_bytes(a))
}

/// What the log-start file of a partition says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// No file: a partition never opened by this version (new, or made by an older one).
    Missing,
    /// A file that fails its check (wrong size, magic, version or CRC).
    Bad,
    /// The recorded log start offset.
    Start(u64),
}

/// Reads the partition's log-start file.
pub fn read(fs: &dyn FileSystem, dir: &Path) -> std::io::Result<Recorded> {
    let path = dir.join(LOG_START_FILE_NAME);
    let file = match fs.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Recorded::Missing),
        Err(e) => return Err(e),
    };
    if file.len()? != LOG_START_LEN as u64 {
        return Ok(Recorded::Bad);
    }
    let mut buf = [0u8; LOG_START_LEN];
    file.read_exact_at(&mut buf, 0)?;
    Ok(decode(&buf).map_or(Recorded::Bad, Recorded::Start))
}

/// Records `start` durably: writes and syncs `log-start.tmp`, renames it over `log-start`,
/// syncs the directory. When this returns `Ok` a crash can no longer bring back the old value.
pub fn write(fs: &dyn FileSystem, dir: &Path, start: u64) -> std::io::Result<()> {
    crate::fs::replace_file(fs, dir, LOG_START_FILE_NAME, &encode(start))
}

/// How the oldest segment files of a partition compare with its recorded log start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// The oldest segment starts at the recorded start (or there are no segments and the
    /// recorded start is 0: a new partition).
    Agrees,
    /// The first `below` segments lie wholly below the recorded start, and a segment starts
    /// exactly there: a retention step recorded the new start and was interrupted before it
    /// deleted them all. Deleting them finishes it.
    Interrupted {
        /// The recorded start.
        start: u64,
        /// How many of the oldest segments to delete.
        below: usize,
    },
    /// No log-start file: nothing to check the head against (a new partition, or one an
    /// older version made).
    Unrecorded,
    /// The head of the log is missing or cannot be checked: quarantine with this reason.
    Damaged(Damage),
}

/// Compares the segment files of `dir` (in offset order) with what the log-start file says.
pub(crate) fn check_head(dir: &Path, files: &[SegmentFile], recorded: Recorded) -> Head {
    let dir = dir.to_path_buf();
    let log_start = match recorded {
        Recorded::Missing => return Head::Unrecorded,
        Recorded::Bad => return Head::Damaged(Damage::LogStartUnreadable { dir }),
        Recorded::Start(s) => s,
    };
    let Some(first) = files.first() else {
        return if log_start == 0 {
            Head::Agrees
        } else {
            Head::Damaged(Damage::EverySegmentMissing { dir, log_start })
        };
    };
    if first.base == log_start {
        return Head::Agrees;
    }
    if first.base > log_start {
        return Head::Damaged(Damage::HeadMissing {
            dir,
            oldest_base: first.base,
            log_start,
        });
    }
    match files.iter().position(|f| f.base == log_start) {
        Some(below) => Head::Interrupted {
            start: log_start,
            below,
        },
        None => Head::Damaged(Damage::LogStartSegmentMissing { dir, log_start }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::segment::segment_name;

    #[test]
    fn a_record_round_trips_and_a_flipped_byte_is_rejected() {
        let b = encode(4242);
        assert_eq!(decode(&b), Some(4242));
        for i in 0..LOG_START_LEN {
            let mut bad = b;
            bad[i] ^= 0x04;
            assert_eq!(decode(&bad), None, "byte {i}");
        }
    }

    fn seg(base: u64) -> SegmentFile {
        SegmentFile {
            base,
            path: Path::new("/p").join(segment_name(base)),
            len: 10,
        }
    }

    #[test]
    fn the_head_is_judged_against_the_recorded_start() {
        let d = Path::new("/p");
        let files = [seg(0), seg(10), seg(20)];
        assert_eq!(check_head(d, &files, Recorded::Start(0)), Head::Agrees);
        assert_eq!(check_head(d, &files, Recorded::Missing), Head::Unrecorded);
        assert_eq!(
            check_head(d, &files, Recorded::Start(20)),
            Head::Interrupted {
                start: 20,
                below: 2
            }
        );
        let dir = d.to_path_buf();
        assert_eq!(
            check_head(d, &files[1..], Recorded::Start(0)),
            Head::Damaged(Damage::HeadMissing {
                dir: dir.clone(),
                oldest_base: 10,
                log_start: 0
            })
        );
        assert_eq!(
            check_head(d, &files, Recorded::Start(15)),
            Head::Damaged(Damage::LogStartSegmentMissing {
                dir: dir.clone(),
                log_start: 15
            })
        );
        assert_eq!(
            check_head(d, &[], Recorded::Start(5)),
            Head::Damaged(Damage::EverySegmentMissing {
                dir: dir.clone(),
                log_start: 5
            })
        );
        assert_eq!(check_head(d, &[], Recorded::Start(0)), Head::Agrees);
        assert_eq!(
            check_head(d, &files, Recorded::Bad),
            Head::Damaged(Damage::LogStartUnreadable { dir })
        );
    }
}
