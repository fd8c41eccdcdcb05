//! Segment files: naming, listing, a sequential frame scanner, and the sparse in-memory index.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::fs::{File, FileSystem};
use crate::log::format::{self, FrameError, FrameHeader, HEADER_LEN};
use crate::log::read_buffers::{ReadBuffers, SMALLEST_LENT_BYTES};

/// Segment file suffix.
pub const SEGMENT_SUFFIX: &str = ".log";
/// Digits in a segment name: enough for any u64 base offset, zero-padded so names sort in
/// offset order.
pub const SEGMENT_NAME_DIGITS: usize = 20;
/// One index entry per this many bytes of log (the first frame of a segment always gets one):
/// a read scans at most about this much before reaching its offset. 4 KiB, the granularity
/// Kafka's offset index uses by default.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;
/// Size of each read a recovery scan issues: 1 MiB amortises syscalls over many small frames
/// when a whole segment is read.
pub const SCAN_CHUNK_BYTES: usize = 1024 * 1024;
/// Size of each read a record read issues: 64 KiB, so a read of a few records near the index
/// entry does not pull in a megabyte it will not use (a larger frame is read whole).
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The file name of the segment starting at `base`.
pub fn segment_name(base: u64) -> String {
    format!(
        "{base:0width$}{SEGMENT_SUFFIX}",
        width = SEGMENT_NAME_DIGITS
    )
}

/// Parses a segment file name back to its base offset.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A segment file found in a partition directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFile {
    /// Base offset from the name.
    pub base: u64,
    /// Full path.
    pub path: PathBuf,
    /// Size in bytes.
    pub len: u64,
}

/// Lists a partition directory's segment files in offset order (other files are ignored).
pub fn list(fs: &dyn FileSystem, dir: &Path) -> io::Result<Vec<SegmentFile>> {
    let mut out = Vec::new();
    for entry in fs.read_dir(dir)? {
        if entry.is_dir {
            continue;
        }
        if let Some(base) = parse_segment_name(&entry.name) {
            let path = dir.join(&entry.name);
            let len = fs.metadata(&path)?.len;
            out.push(SegmentFile { base, path, len });
        }
    }
    out.sort_by_key(|s| s.base);
    Ok(out)
}

/// The sparse offset index of one segment: (first offset of a frame, byte position), ascending.
#[derive(Clone, Debug, Default)]
pub struct SparseIndex {
    entries: Vec<(u64, u64)>,
    last_pos: Option<u64>,
}

impl SparseIndex {
    /// Notes a frame; records it if it is the first or [`INDEX_INTERVAL_BYTES`] past the last
    /// indexed one.
    pub fn note(&mut self, base_offset: u64, pos: u64) {
        let due = match self.last_pos {
            None => true,
            Some(last) => pos >= last + INDEX_INTERVAL_BYTES,
        };
        if due {
            self.entries.push((base_offset, pos));
            self.last_pos = Some(pos);
        }
    }

    /// Byte position of the last indexed frame starting at or before byte `pos` (0 if none):
    /// a frame boundary a scan covering `pos` onwards may start at.
    pub fn frame_at_or_before_pos(&self, pos: u64) -> u64 {
        let i = self.entries.partition_point(|&(_, p)| p <= pos);
        if i == 0 { 0 } else { self.entries[i - 1].1 }
    }

    /// Byte position of the last indexed frame starting at or before `offset` (0 if none).
    pub fn lookup(&self, offset: u64) -> u64 {
        let i = self.entries.partition_point(|&(o, _)| o <= offset);
        if i == 0 { 0 } else { self.entries[i - 1].1 }
    }

    /// The last entry, (first offset of a frame, its byte position): where a check of the
    /// segment's tail can start scanning.
    pub fn last_entry(&self) -> Option<(u64, u64)> {
        self.entries.last().copied()
    }

    /// Number of entries (for tests and stats).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One step of a scan.
#[derive(Debug)]
pub enum Scan {
    /// A frame whose header parsed and whose CRC matched.
    Frame {
        /// Byte position of the frame.
        pos: u64,
        /// Its header.
        header: FrameHeader,
        /// The whole frame.
        bytes: Bytes,
    },
    /// A frame whose body was not read, as the caller asked ([`FrameAction::Skip`]); the
    /// scanner moved past it.
    Skipped {
        /// Its header.
        header: FrameHeader,
    },
    /// A frame the caller stopped at ([`FrameAction::Stop`]); the scanner stays before it.
    Stopped {
        /// Its header.
        header: FrameHeader,
    },
    /// The scan reached its end exactly on a frame boundary.
    End,
    /// The bytes at `pos` are not a valid frame.
    Bad {
        /// Byte position of the bad frame.
        pos: u64,
        /// What is wrong.
        error: FrameError,
    },
}

/// What [`Scanner::next_frame_with`] does with a frame once it has seen the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameAction {
    /// Read the body and check its CRC.
    Read,
    /// Move past it without reading the body (a reader seeking past older records).
    Skip,
    /// Stay before it without reading the body (a gated read at a record not yet due).
    Stop,
}

/// Reads frames one after another from `[pos, end)` of a file, in large chunks.
pub struct Scanner<'a> {
    file: &'a dyn File,
    pos: u64,
    end: u64,
    buf: Bytes,
    buf_pos: u64,
    chunk: usize,
    /// Where large reads take their buffers from (`None`: a new one each time).
    buffers: Option<Arc<ReadBuffers>>,
}

impl<'a> Scanner<'a> {
    /// A scanner over `[pos, end)` of `file`, reading [`SCAN_CHUNK_BYTES`] at a time.
    pub fn new(file: &'a dyn File, pos: u64, end: u64) -> Self {
        Self::with_chunk(file, pos, end, SCAN_CHUNK_BYTES)
    }

    /// A scanner over `[pos, end)` of `file`, reading at least `chunk` bytes at a time.
    pub fn with_chunk(file: &'a dyn File, pos: u64, end: u64, chunk: usize) -> Self {
        Scanner {
            file,
            pos,
            end,
            buf: Bytes::new(),
            buf_pos: pos,
            chunk,
            buffers: None,
        }
    }

    /// The same scanner, reading frames of [`SMALLEST_LENT_BYTES`] or more into buffers lent
    /// from `buffers`.
    pub(crate) fn with_buffers(mut self, buffers: Arc<ReadBuffers>) -> Self {
        self.buffers = Some(buffers);
        self
    }

    /// Current position (start of the next frame).
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Moves to `pos` (a frame boundary at or before the end), keeping what is buffered: a
    /// reader that took a frame from elsewhere (its memo of verified frames) goes on after it.
    pub fn seek(&mut self, pos: u64) {
        self.pos = pos.min(self.end);
    }

    /// Makes `[pos, pos+need)` available in the buffer; returns false if the range is past `end`.
    fn fill(&mut self, need: usize) -> io::Result<bool> {
        let have_from = self.pos.saturating_sub(self.buf_pos);
        if self.pos >= self.buf_pos && have_from + need as u64 <= self.buf.len() as u64 {
            return Ok(true);
        }
        if self.pos + need as u64 > self.end {
            return Ok(false);
        }
        let want = need.max(self.chunk).min((self.end - self.pos) as usize);
        let (file, pos) = (self.file, self.pos);
        self.buf = match &self.buffers {
            Some(buffers) if want >= SMALLEST_LENT_BYTES => {
                buffers.read(want, |b| file.read_exact_at(b, pos))?
            }
            _ => {
                let mut b = BytesMut::zeroed(want);
                file.read_exact_at(&mut b, pos)?;
                b.freeze()
            }
        };
        self.buf_pos = self.pos;
        Ok(true)
    }

    fn slice(&self, len: usize) -> Bytes {
        let from = (self.pos - self.buf_pos) as usize;
        self.buf.slice(from..from + len)
    }

    /// The next frame, the end, or the first bad frame (after which the scanner stays put).
    pub fn next_frame(&mut self) -> io::Result<Scan> {
        self.next_frame_with(|_| FrameAction::Read)
    }

    /// Like [`Scanner::next_frame`], but `action` sees each header first and may skip the
    /// frame or stop before it without its body being read: only the header's own fields are
    /// trusted then (the CRC is not checked for a body that is not read).
    pub fn next_frame_with(
        &mut self,
        action: impl FnOnce(&FrameHeader) -> FrameAction,
    ) -> io::Result<Scan> {
        if self.pos == self.end {
            return Ok(Scan::End);
        }
        let available = self.end - self.pos;
        let head_len = HEADER_LEN.min(available as usize);
        if !self.fill(head_len)? {
            return Ok(Scan::End);
        }
        let head = self.slice(head_len);
        let header = match format::parse_header(&head) {
            Ok(h) => h,
            Err(error) => {
                return Ok(Scan::Bad {
                    pos: self.pos,
                    error,
                });
            }
        };
        let len = header.frame_len as usize;
        if len as u64 > available {
            return Ok(Scan::Bad {
                pos: self.pos,
                error: FrameError::Short {
                    needed: len as u64,
                    available,
                },
            });
        }
        match action(&header) {
            FrameAction::Read => {}
            FrameAction::Skip => {
                self.pos += len as u64;
                return Ok(Scan::Skipped { header });
            }
            FrameAction::Stop => return Ok(Scan::Stopped { header }),
        }
        self.fill(len)?;
        let bytes = self.slice(len);
        if let Err(error) = format::check_crc(&header, &bytes) {
            return Ok(Scan::Bad {
                pos: self.pos,
                error,
            });
        }
        let pos = self.pos;
        self.pos += len as u64;
        Ok(Scan::Frame { pos, header, bytes })
    }
}

/// Looks for a CRC-valid frame starting anywhere in `(from, end)` whose base offset is at least
/// `min_offset`: the test that tells a torn tail (nothing valid after it) from damage in the
/// middle of the log. Returns its position.
pub fn find_valid_frame_after(
    file: &dyn File,
    from: u64,
    end: u64,
    min_offset: u64,
) -> io::Result<Option<u64>> {
    if end <= from + 1 {
        return Ok(None);
    }
    let len = usize::try_from(end - from)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "tail too large to search"))?;
    let mut tail = vec![0u8; len];
    file.read_exact_at(&mut tail, from)?;
    let magic = format::MAGIC;
    let mut i = 1;
    while i + HEADER_LEN <= tail.len() {
        if tail[i..i + 4] == magic
            && let Ok(h) = format::parse_header(&tail[i..])
        {
            let flen = h.frame_len as usize;
            if i + flen <= tail.len()
                && h.base_offset >= min_offset
                && format::check_crc(&h, &tail[i..i + flen]).is_ok()
            {
                return Ok(Some(from + i as u64));
            }
        }
        i += 1;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_are_twenty_digits_and_parse_back() {
        assert_eq!(segment_name(0), "00000000000000000000.log");
        assert_eq!(segment_name(u64::MAX), "18446744073709551615.log");
        assert_eq!(parse_segment_name("00000000000000000042.log"), Some(42));
        assert_eq!(parse_segment_name("42.log"), None);
        assert_eq!(parse_segment_name("00000000000000000042.tmp"), None);
        assert_eq!(parse_segment_name("high-watermark"), None);
    }

    #[test]
    fn the_sparse_index_finds_the_nearest_earlier_entry() {
        let mut idx = SparseIndex::default();
        idx.note(0, 0);
        idx.note(5, 100); // too close, skipped
        idx.note(10, 5000);
        idx.note(20, 9500);
        assert_eq!(idx.len(), 3);
        assert_eq!(idx.lookup(0), 0);
        assert_eq!(idx.lookup(9), 0);
        assert_eq!(idx.lookup(10), 5000);
        assert_eq!(idx.lookup(19), 5000);
        assert_eq!(idx.lookup(1000), 9500);
    }
}
