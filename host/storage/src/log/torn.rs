//! Torn tails kept aside: before recovery cuts a torn tail off the last segment, it copies the
//! cut bytes into the partition's `torn/` directory with a short text note saying what was cut,
//! so the bytes are there to inspect and the operator can see that records were cut.
//!
//! Recovery cannot always tell a torn, never-acknowledged write from an acknowledged record:
//! without a high-watermark file covering it (the file is lazy, or was lost) both look the
//! same. The cut itself is the right repair for the first; the copy and the report are what
//! make the second visible instead of silent.
//!
//! For a cut at byte `P` of segment `B` (its 20-digit base offset) the directory holds
//! `B-P.bin`, the cut bytes exactly, and `B-P.note`, `key=value` lines:
//!
//! ```text
//! # narad: bytes cut from a torn log tail by recovery
//! version=1
//! segment=00000000000000000000.log
//! position=1234
//! bytes=100
//! from_offset=29
//! records=1
//! records_exact=true
//! boundary_known=false
//! at_ms=1767225600000
//! kept_at=00000000000000000000-1234.bin
//! ```
//!
//! Both are `fdatasync`ed and the directory synced before the segment is truncated; a crash in
//! between repeats the cut at the same position on the next open and rewrites the same two
//! files. `peek` and the describe endpoint report a summary of the notes present; removing
//! both files of a cut (or the whole `torn/` directory) once inspected clears it.

use std::path::{Path, PathBuf};

use crate::fs::{FileSystem, OpenMode};
use crate::log::format;
use crate::log::segment::SEGMENT_NAME_DIGITS;
use crate::record::RecoveredCut;

/// Directory inside the partition directory holding kept-aside torn tails.
pub const TORN_DIR_NAME: &str = "torn";
/// Suffix of a kept-aside copy of cut bytes.
pub const BYTES_SUFFIX: &str = ".bin";
/// Suffix of the note describing a cut.
pub const NOTE_SUFFIX: &str = ".note";
/// Largest note read back: a note is a dozen short lines; anything bigger is not ours.
const MAX_NOTE_BYTES: u64 = 4096;
/// The note format this build writes and reads.
const NOTE_VERSION: u64 = 1;

/// One cut, as recovery decides it and the note records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Base offset of the segment that was cut.
    pub(crate) segment_base: u64,
    /// Byte position the segment was cut back to.
    pub(crate) position: u64,
    /// Bytes cut.
    pub(crate) bytes: u64,
    /// Offset of the first record the cut removed (the next offset at the cut point).
    pub(crate) from_offset: u64,
    /// Records the frame headers in the cut bytes name.
    pub(crate) records: u64,
    /// True when those headers accounted for every cut byte.
    pub(crate) records_exact: bool,
    /// True when a high-watermark file gave a durable boundary (the cut was past it).
    pub(crate) boundary_known: bool,
    /// When the cut was made, ms since the epoch.
    pub(crate) at_ms: i64,
}

impl Cut {
    fn stem(&self) -> String {
        format!(
            "{:0width$}-{}",
            self.segment_base,
            self.position,
            width = SEGMENT_NAME_DIGITS
        )
    }

    fn note(&self, bin_name: &str) -> String {
        format!(
            "# narad: bytes cut from a torn log tail by recovery\n\
             version={NOTE_VERSION}\n\
             segment={}\n\
             position={}\n\
             bytes={}\n\
             from_offset={}\n\
             records={}\n\
             records_exact={}\n\
             boundary_known={}\n\
             at_ms={}\n\
             kept_at={bin_name}\n",
            crate::log::segment::segment_name(self.segment_base),
            self.position,
            self.bytes,
            self.from_offset,
            self.records,
            self.records_exact,
            self.boundary_known,
            self.at_ms,
        )
    }
}

/// Counts the records in cut bytes by walking the frame headers that parse and continue the
/// log's offsets from `from_offset`. Returns the count and whether the walk accounted for every
/// byte (a frame cut short still counts: its header names its records, although the CRC that
/// would confirm them is in the bytes that are missing).
pub(crate) fn count_records(tail: &[u8], from_offset: u64) -> (u64, bool) {
    let mut at = 0usize;
    let mut next = from_offset;
    let mut records = 0u64;
    while at < tail.len() {
        match format::parse_header(&tail[at..]) {
            Ok(h) if h.base_offset == next => {
                records += u64::from(h.record_count);
                next = h.next_offset();
                at = at.saturating_add(h.frame_len as usize);
            }
            _ => return (records, false),
        }
    }
    (records, true)
}

fn write_synced(fs: &dyn FileSystem, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let file = fs.open(path, OpenMode::CreateReadWrite)?;
    // A repeat of a cut a crash interrupted rewrites the same file from scratch.
    file.set_len(0)?;
    file.write_all_at(bytes, 0)?;
    file.sync_data()
}

/// Copies `tail` (the bytes about to be cut) and a note describing `cut` into `dir/torn/`,
/// durably. Returns the path of the copy. The caller truncates only after this succeeded.
pub(crate) fn keep_aside(
    fs: &dyn FileSystem,
    dir: &Path,
    cut: &Cut,
    tail: &[u8],
) -> std::io::Result<PathBuf> {
    let torn = dir.join(TORN_DIR_NAME);
    let existed = fs.exists(&torn)?;
    fs.create_dir_all(&torn)?;
    if !existed {
        fs.sync_dir(dir)?;
    }
    let stem = cut.stem();
    let bin_name = format!("{stem}{BYTES_SUFFIX}");
    let bin = torn.join(&bin_name);
    write_synced(fs, &bin, tail)?;
    write_synced(
        fs,
        &torn.join(format!("{stem}{NOTE_SUFFIX}")),
        cut.note(&bin_name).as_bytes(),
    )?;
    fs.sync_dir(&torn)?;
    Ok(bin)
}

/// The fields of a note that a summary needs.
struct NoteFields {
    bytes: u64,
    from_offset: u64,
    records: u64,
    records_exact: bool,
    at_ms: i64,
    kept_at: String,
}

fn parse_note(text: &str) -> Option<NoteFields> {
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
    };
    if get("version")?.parse::<u64>().ok()? != NOTE_VERSION {
        return None;
    }
    Some(NoteFields {
        bytes: get("bytes")?.parse().ok()?,
        from_offset: get("from_offset")?.parse().ok()?,
        records: get("records")?.parse().ok()?,
        records_exact: get("records_exact")?.parse().ok()?,
        at_ms: get("at_ms")?.parse().ok()?,
        kept_at: get("kept_at")?.to_owned(),
    })
}

fn read_note(fs: &dyn FileSystem, path: &Path) -> std::io::Result<Option<String>> {
    let file = fs.open(path, OpenMode::Read)?;
    let len = file.len()?;
    if len > MAX_NOTE_BYTES {
        return Ok(None);
    }
    let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
    file.read_exact_at(&mut buf, 0)?;
    Ok(String::from_utf8(buf).ok())
}

/// Sums up the notes in `dir/torn/`: `None` when there are none (no directory, or emptied by
/// the operator). A note that cannot be read as ours is skipped with a warning.
pub fn summary(fs: &dyn FileSystem, dir: &Path) -> std::io::Result<Option<RecoveredCut>> {
    let torn = dir.join(TORN_DIR_NAME);
    let entries = match fs.read_dir(&torn) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out: Option<RecoveredCut> = None;
    for entry in entries {
        if entry.is_dir || !entry.name.ends_with(NOTE_SUFFIX) {
            continue;
        }
        let path = torn.join(&entry.name);
        let Some(note) = read_note(fs, &path)?.as_deref().and_then(parse_note) else {
            tracing::warn!(path = %path.display(), "ignoring a torn-tail note that does not parse");
            continue;
        };
        let kept_at = torn.join(&note.kept_at);
        match &mut out {
            None => {
                out = Some(RecoveredCut {
                    cuts: 1,
                    records: note.records,
                    records_exact: note.records_exact,
                    bytes: note.bytes,
                    from_offset: note.from_offset,
                    at_ms: note.at_ms,
                    kept_at,
                });
            }
            Some(sum) => {
                sum.cuts = sum.cuts.saturating_add(1);
                sum.records = sum.records.saturating_add(note.records);
                sum.records_exact &= note.records_exact;
                sum.bytes = sum.bytes.saturating_add(note.bytes);
                // Entries come sorted by name, so on equal times the later name wins.
                if note.at_ms >= sum.at_ms {
                    sum.from_offset = note.from_offset;
                    sum.at_ms = note.at_ms;
                    sum.kept_at = kept_at;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::NewRecord;

    fn frame(base: u64, values: &[&str]) -> Vec<u8> {
        let recs: Vec<NewRecord> = values
            .iter()
            .map(|v| NewRecord {
                value: Some(v.as_bytes().to_vec().into()),
                ..NewRecord::default()
            })
            .collect();
        let mut out = Vec::new();
        let crc = format::encode_batch(&recs, None, &mut out).unwrap();
        format::seal(&mut out, crc, base, 0);
        out
    }

    #[test]
    fn records_are_counted_from_the_headers_of_the_cut_frames() {
        let mut tail = frame(29, &["a", "b"]);
        tail.extend(frame(31, &["c"]));
        assert_eq!(count_records(&tail, 29), (3, true));
        // The last frame cut short still names its record.
        assert_eq!(count_records(&tail[..tail.len() - 3], 29), (3, true));
        // A header cut short, or garbage: a lower bound.
        let first = frame(29, &["a", "b"]).len();
        assert_eq!(count_records(&tail[..first + 10], 29), (2, false));
        assert_eq!(count_records(&[0u8; 50], 29), (0, false));
        // Frames that do not continue the offsets are not counted.
        assert_eq!(count_records(&tail, 7), (0, false));
    }

    #[test]
    fn a_note_round_trips_through_its_text() {
        let cut = Cut {
            segment_base: 16,
            position: 900,
            bytes: 100,
            from_offset: 29,
            records: 1,
            records_exact: true,
            boundary_known: false,
            at_ms: 1_767_225_600_000,
        };
        let n = parse_note(&cut.note("x.bin")).unwrap();
        assert_eq!(
            (n.bytes, n.from_offset, n.records, n.records_exact, n.at_ms),
            (100, 29, 1, true, 1_767_225_600_000)
        );
        assert_eq!(n.kept_at, "x.bin");
        assert_eq!(cut.stem(), "00000000000000000016-900");
    }
}
