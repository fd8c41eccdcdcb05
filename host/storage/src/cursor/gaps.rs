//! The gap ledger of one cursor: every range of parent offsets the cursor moved past without
//! copying it, with why, when and where, so a loss is on record after the process that saw it
//! is gone (a restart, a move to another node).
//!
//! One file per (parent partition, child), beside the offset file:
//! `topics/{parent}/p{00000}/fanout-{child}.gaps`, so it travels with the partition when the
//! partition moves. The whole file is one JSON object and a newline, replaced atomically on
//! every change (losses are rare events, so the rewrite costs nothing that matters):
//!
//! ```text
//! {"crc":"1c2d3e4f","epoch":"67953471cc57a32a","gaps":[{"from":0,"to":120,"reason":"retention","at_ms":1764770000000,"node":"n1"}],"older":{"lost":0,"skipped":0}}
//! ```
//!
//! `crc` is the CRC-32C of every byte after the first 17, as in the offset file, so damage is
//! told apart from a ledger. `epoch` is the attach epoch of the link the ledger belongs to: a
//! ledger of an earlier attachment is not this link's and is started afresh. A range already
//! on record is never counted twice: a cursor that crashes between writing the ledger and
//! moving its offset file records the same range again, and only what it adds is new. The
//! file keeps at most [`MAX_GAPS`] ranges; older ones are folded into `older`, whose totals
//! still count.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{CursorError, Result, io_err};
use crate::fs::FileSystem;

/// File-name suffix of gap ledgers (the prefix is the offset file's, `fanout-`).
const FILE_SUFFIX: &str = ".gaps";

/// Most ranges a ledger keeps one by one; beyond, the oldest are folded into the totals.
pub const MAX_GAPS: usize = 1_000;

/// Largest ledger file a reader accepts (well above [`MAX_GAPS`] ranges).
pub const MAX_GAPS_FILE_BYTES: usize = 1024 * 1024;

/// Length of the prefix the CRC does not cover: `{"crc":"` + 8 hex digits + `"`.
const CRC_PREFIX_BYTES: usize = 17;

/// The name of the gap ledger of `child`: `fanout-{child}.gaps`.
pub fn gaps_file_name(child: &str) -> String {
    format!("{}{child}{FILE_SUFFIX}", super::FILE_PREFIX)
}

/// Why a cursor moved past records without copying them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GapReason {
    /// The records aged out of the parent (retention) before the cursor copied them.
    Retention,
    /// The parent partition was lost and re-created empty above them (`--accept-loss`).
    Recreated,
    /// An operator's forward seek skipped them on purpose: on record, but not a loss.
    Seek,
}

impl std::fmt::Display for GapReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GapReason::Retention => "retention",
            GapReason::Recreated => "recreated",
            GapReason::Seek => "seek",
        })
    }
}

impl GapReason {
    /// Whether records skipped for this reason count as lost (dropped).
    pub fn is_loss(self) -> bool {
        !matches!(self, GapReason::Seek)
    }
}

/// One range of parent offsets `[from, to)` the cursor moved past without copying.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gap {
    /// First parent offset skipped.
    pub from: u64,
    /// One past the last parent offset skipped.
    pub to: u64,
    /// Why.
    pub reason: GapReason,
    /// When it was first recorded (Unix ms, the recording node's clock).
    pub at_ms: i64,
    /// Cluster mode: the node whose cursor recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Gap {
    /// Records in the range.
    pub fn len(&self) -> u64 {
        self.to.saturating_sub(self.from)
    }

    /// Whether the range holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Totals of the ranges folded out of the ledger to keep it within [`MAX_GAPS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OlderGaps {
    /// Records lost (every reason but a seek).
    pub lost: u64,
    /// Records skipped by seeks.
    pub skipped: u64,
}

/// Every range one link's cursor on one parent partition moved past without copying.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GapLedger {
    /// Attach epoch of the link the ranges belong to.
    pub epoch: String,
    /// The ranges, oldest first.
    pub gaps: Vec<Gap>,
    /// Ranges no longer kept one by one.
    #[serde(default)]
    pub older: OlderGaps,
}

impl GapLedger {
    /// An empty ledger for the link attached at `epoch`.
    pub fn new(epoch: impl Into<String>) -> GapLedger {
        GapLedger {
            epoch: epoch.into(),
            gaps: Vec::new(),
            older: OlderGaps::default(),
        }
    }

    /// Records lost: every range but seeks, folded ones included.
    pub fn lost(&self) -> u64 {
        self.older.lost + self.sum(GapReason::is_loss)
    }

    /// Records operators' seeks skipped, folded ones included.
    pub fn skipped_by_seek(&self) -> u64 {
        self.older.skipped + self.sum(|r| !r.is_loss())
    }

    fn sum(&self, which: impl Fn(GapReason) -> bool) -> u64 {
        self.gaps
            .iter()
            .filter(|g| which(g.reason))
            .map(Gap::len)
            .sum()
    }

    /// Records `gap`, less any part of it already on record; returns how many records that
    /// adds. A part that continues the newest range (same reason and node) extends it.
    pub fn add(&mut self, gap: Gap) -> u64 {
        let mut known: Vec<(u64, u64)> = self.gaps.iter().map(|g| (g.from, g.to)).collect();
        known.sort_unstable();
        let mut added = 0;
        let mut from = gap.from;
        for (start, end) in known {
            if from >= gap.to {
                break;
            }
            if end <= from {
                continue;
            }
            if start > from {
                added += self.append(Gap {
                    from,
                    to: start.min(gap.to),
                    ..gap.clone()
                });
            }
            from = from.max(end);
        }
        if from < gap.to {
            added += self.append(Gap { from, ..gap });
        }
        while self.gaps.len() > MAX_GAPS {
            let oldest = self.gaps.remove(0);
            match oldest.reason.is_loss() {
                true => self.older.lost += oldest.len(),
                false => self.older.skipped += oldest.len(),
            }
        }
        added
    }

    fn append(&mut self, gap: Gap) -> u64 {
        let added = gap.len();
        match self.gaps.last_mut() {
            Some(last)
                if last.to == gap.from && last.reason == gap.reason && last.node == gap.node =>
            {
                last.to = gap.to;
            }
            _ if added > 0 => self.gaps.push(gap),
            _ => {}
        }
        added
    }
}

/// What reading a ledger file found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GapsLoad {
    /// No file: nothing recorded.
    Missing,
    /// A valid ledger (of whatever epoch: the caller compares).
    Found(GapLedger),
    /// The file is not a valid ledger; the text says why.
    Damaged(String),
}

/// Encodes `ledger` as the file's bytes.
pub fn encode(ledger: &GapLedger) -> Vec<u8> {
    // A struct of strings, numbers and enums: serialising it cannot fail.
    let body = serde_json::to_vec(ledger).unwrap_or_default();
    let mut covered = Vec::with_capacity(body.len() + 1);
    // `{"epoch":...}` becomes `,"epoch":...}` after the CRC prefix.
    covered.push(b',');
    covered.extend_from_slice(body.get(1..).unwrap_or_default());
    covered.push(b'\n');
    let crc = crc32c::crc32c(&covered);
    let mut bytes = format!("{{\"crc\":\"{crc:08x}\"").into_bytes();
    bytes.extend_from_slice(&covered);
    bytes
}

/// Decodes a file's bytes.
pub fn decode(bytes: &[u8]) -> std::result::Result<GapLedger, String> {
    if bytes.len() > MAX_GAPS_FILE_BYTES {
        return Err(format!(
            "{} bytes is too long for a gap ledger",
            bytes.len()
        ));
    }
    let (Some(prefix), Some(covered)) =
        (bytes.get(..CRC_PREFIX_BYTES), bytes.get(CRC_PREFIX_BYTES..))
    else {
        return Err(format!(
            "{} bytes is too short for a gap ledger",
            bytes.len()
        ));
    };
    let stated = prefix
        .strip_prefix(b"{\"crc\":\"")
        .and_then(|rest| rest.strip_suffix(b"\""))
        .and_then(|hex| std::str::from_utf8(hex).ok())
        .filter(|hex| {
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .ok_or("the crc field is not 8 lowercase hex digits")?;
    let computed = crc32c::crc32c(covered);
    if stated != computed {
        return Err(format!(
            "CRC-32C mismatch: the ledger says {stated:08x}, its bytes give {computed:08x}"
        ));
    }
    let Some(body) = covered
        .strip_suffix(b"\n")
        .and_then(|b| b.strip_prefix(b","))
    else {
        return Err("the ledger is not a JSON object and a newline".into());
    };
    let mut json = Vec::with_capacity(body.len() + 1);
    json.push(b'{');
    json.extend_from_slice(body);
    serde_json::from_slice(&json).map_err(|e| format!("the ledger is not valid JSON: {e}"))
}

/// Reads the ledger at `path`.
pub fn load(fs: &dyn FileSystem, path: &Path) -> Result<GapsLoad> {
    let Some(bytes) = super::read_whole(fs, path, MAX_GAPS_FILE_BYTES)? else {
        return Ok(GapsLoad::Missing);
    };
    Ok(match decode(&bytes) {
        Ok(ledger) => GapsLoad::Found(ledger),
        Err(reason) => GapsLoad::Damaged(reason),
    })
}

/// Replaces the ledger at `path` with `ledger`, atomically and durably.
pub fn write(fs: &dyn FileSystem, path: &Path, ledger: &GapLedger) -> Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(CursorError::Io {
            op: "replace",
            path: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "no directory or file name"),
        });
    };
    crate::fs::replace_file(fs, dir, name, &encode(ledger)).map_err(io_err("replace", path))
}

/// Moves a damaged ledger out of the way, to `{name}.damaged-{at_ms}` beside it, keeping its
/// bytes for whoever looks into it; returns the new path.
pub fn set_aside(fs: &dyn FileSystem, path: &Path, at_ms: i64) -> Result<PathBuf> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".damaged-{at_ms}"));
    let aside = path.with_file_name(name);
    fs.rename(path, &aside).map_err(io_err("rename", path))?;
    if let Some(dir) = path.parent() {
        fs.sync_dir(dir).map_err(io_err("fsync directory", dir))?;
    }
    Ok(aside)
}

/// Deletes the ledger at `path` (missing is fine), durably: its link is gone.
pub fn remove(fs: &dyn FileSystem, path: &Path) -> Result<()> {
    super::remove(fs, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gap(from: u64, to: u64, reason: GapReason) -> Gap {
        Gap {
            from,
            to,
            reason,
            at_ms: 7,
            node: None,
        }
    }

    #[test]
    fn a_ledger_round_trips_and_damage_is_told_apart() {
        let mut ledger = GapLedger::new("67953471cc57a32a");
        ledger.add(gap(0, 120, GapReason::Retention));
        ledger.add(Gap {
            node: Some("n2".into()),
            ..gap(500, 510, GapReason::Seek)
        });
        let bytes = encode(&ledger);
        assert_eq!(&bytes[..8], b"{\"crc\":\"");
        assert_eq!(bytes.last(), Some(&b'\n'));
        assert_eq!(decode(&bytes), Ok(ledger));
        let mut flipped = bytes.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 0x01;
        assert!(decode(&flipped).unwrap_err().contains("CRC-32C mismatch"));
        assert!(decode(&bytes[..bytes.len() - 5]).is_err(), "torn");
        assert!(decode(b"{}").is_err());
    }

    #[test]
    fn a_range_already_on_record_is_not_counted_again_and_a_continuation_extends_it() {
        let mut ledger = GapLedger::new("e");
        assert_eq!(ledger.add(gap(100, 200, GapReason::Retention)), 100);
        // The same loss recorded again after a crash, reaching further: only the rest counts.
        assert_eq!(ledger.add(gap(100, 250, GapReason::Retention)), 50);
        assert_eq!(ledger.gaps, vec![gap(100, 250, GapReason::Retention)]);
        // A range around an old one: the parts on either side.
        assert_eq!(ledger.add(gap(50, 300, GapReason::Recreated)), 100);
        assert_eq!(ledger.lost(), 250);
        assert_eq!(ledger.add(gap(400, 410, GapReason::Seek)), 10);
        assert_eq!(ledger.add(gap(0, 10, GapReason::Seek)), 10);
        assert_eq!(ledger.lost(), 250);
        assert_eq!(ledger.skipped_by_seek(), 20);
        assert_eq!(ledger.add(gap(120, 130, GapReason::Retention)), 0);
        assert_eq!(ledger.add(gap(5, 5, GapReason::Retention)), 0);
    }

    #[test]
    fn the_oldest_ranges_fold_into_totals_that_still_count() {
        let mut ledger = GapLedger::new("e");
        for i in 0..(MAX_GAPS as u64 + 10) {
            let reason = if i % 2 == 0 {
                GapReason::Retention
            } else {
                GapReason::Seek
            };
            ledger.add(gap(i * 10, i * 10 + 3, reason));
        }
        assert_eq!(ledger.gaps.len(), MAX_GAPS);
        assert_eq!(
            ledger.older,
            OlderGaps {
                lost: 15,
                skipped: 15
            }
        );
        let total = (MAX_GAPS as u64 + 10) * 3;
        assert_eq!(ledger.lost() + ledger.skipped_by_seek(), total);
        assert!(encode(&ledger).len() < MAX_GAPS_FILE_BYTES);
    }
}
