//! The read path: find the segment and the nearest indexed frame for an offset, then scan
//! frames forward, never past the durable length the writer has published.
//!
//! A read decodes only the records it returns. A frame is checked (CRC, then its whole body,
//! [`format::index_frame`]) the first time a read of this log takes records from it; a read
//! that stops inside a frame leaves it in the log's [`FrameMemo`], so the next reads inside it
//! (a fan-out cursor takes a 16,384-record frame in four 4,096-record slabs) take it from memory
//! without reading or checking it again. The memo belongs to the open log: a reopen (restart,
//! reopen after a failure) starts with an empty one, so a frame damaged after it was checked
//! is found by the first read after the reopen, as before.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use crate::damage::Damage;
use crate::fs::File;
use crate::log::format::{self, FrameHeader, FrameIndex};
use crate::log::segment::{FrameAction, READ_CHUNK_BYTES, Scan, Scanner};
use crate::log::{Log, LogError, lock, read};
use crate::record::{NotDue, ReadOptions, ReadResult, StampedBatch};

/// Frames a log's memo keeps at most: 4, one per reader stopped inside a frame for a parent
/// partition copied to a few children at once (each cursor is one reader).
pub(crate) const FRAME_MEMO_SLOTS: usize = 4;
/// Bytes a log's memo keeps at most (frames plus their indexes): 8 MiB, four of the ~2 MiB
/// 16,384-record frames `narad bench fanout` writes, two 4 MiB slabs' worth. A larger frame is
/// not kept: each read inside it checks it again, as every read did before the memo.
pub(crate) const FRAME_MEMO_MAX_BYTES: usize = 8 * 1024 * 1024;

/// A frame a read of this log checked (CRC and body), with where its records start.
#[derive(Clone, Debug)]
struct VerifiedFrame {
    /// Base offset of its segment (with `pos`, which frame this is while the log is open).
    segment_base: u64,
    /// Byte position in the segment.
    pos: u64,
    header: FrameHeader,
    bytes: Bytes,
    index: Arc<FrameIndex>,
}

impl VerifiedFrame {
    fn cost(&self) -> usize {
        self.bytes.len() + self.index.heap_bytes()
    }
}

/// The frames of an open log that reads stopped inside, most recently used last. Frames below
/// the durable length never change while a log is open (only recovery, at open, cuts a log),
/// so what was checked once stays checked for the life of this memo.
#[derive(Debug, Default)]
pub(crate) struct FrameMemo {
    frames: VecDeque<VerifiedFrame>,
}

impl FrameMemo {
    fn get(&mut self, segment_base: u64, pos: u64) -> Option<VerifiedFrame> {
        let i = self
            .frames
            .iter()
            .position(|f| f.segment_base == segment_base && f.pos == pos)?;
        let f = self.frames.remove(i)?;
        self.frames.push_back(f.clone());
        Some(f)
    }

    fn keep(&mut self, frame: VerifiedFrame, log_start: u64) {
        if frame.cost() > FRAME_MEMO_MAX_BYTES {
            return;
        }
        self.frames.retain(|f| {
            !(f.segment_base == frame.segment_base && f.pos == frame.pos)
                && f.header.next_offset() > log_start
        });
        self.frames.push_back(frame);
        let mut total: usize = self.frames.iter().map(VerifiedFrame::cost).sum();
        while self.frames.len() > FRAME_MEMO_SLOTS || total > FRAME_MEMO_MAX_BYTES {
            match self.frames.pop_front() {
                Some(f) => total -= f.cost(),
                None => break,
            }
        }
    }
}

/// Where to continue reading: a snapshot of one segment taken under the view lock.
struct Position {
    base: u64,
    file: Arc<dyn File>,
    path: PathBuf,
    start: u64,
    end: u64,
    seg_next: u64,
}

impl Log {
    /// The batches stamped with a producer in the last `max_bytes` of the log (or a little
    /// more: the scan starts at a frame boundary), oldest first. Frames without a stamp are
    /// judged by their header alone; stamped ones are checked as a read checks them.
    pub(crate) fn producer_batches(&self, max_bytes: u64) -> Result<Vec<StampedBatch>, LogError> {
        let (spans, hw) = {
            let v = read(&self.view);
            let mut left = max_bytes;
            let mut spans = Vec::new();
            for s in v.segments.iter().rev() {
                let start = if s.len > left {
                    s.index.frame_at_or_before_pos(s.len - left)
                } else {
                    0
                };
                spans.push((s.file.clone(), s.path.clone(), start, s.len));
                if s.len >= left {
                    break;
                }
                left -= s.len;
            }
            spans.reverse();
            (spans, v.next_offset)
        };
        let mut out = Vec::new();
        for (file, path, start, end) in spans {
            let mut scanner = Scanner::with_chunk(file.as_ref(), start, end, READ_CHUNK_BYTES)
                .with_buffers(Arc::clone(&self.read_buffers));
            loop {
                let step = scanner
                    .next_frame_with(|h| {
                        if h.flags & format::FLAG_PRODUCER != 0 && h.base_offset < hw {
                            FrameAction::Read
                        } else {
                            FrameAction::Skip
                        }
                    })
                    .map_err(|e| LogError::io(format!("reading {}", path.display()), e))?;
                let (header, bytes) = match step {
                    Scan::Skipped { .. } => continue,
                    Scan::End | Scan::Stopped { .. } => break,
                    Scan::Bad { pos, error } => {
                        return Err(LogError::Corrupt(Damage::BadFrameOnRead {
                            segment: path,
                            position: pos,
                            error,
                        }));
                    }
                    Scan::Frame { header, bytes, .. } => (header, bytes),
                };
                let index = format::index_frame(&header, &bytes).map_err(|error| {
                    LogError::Corrupt(Damage::UndecodableFrame {
                        segment: path.clone(),
                        base_offset: header.base_offset,
                        error,
                    })
                })?;
                if let Some(stamp) = index.producer() {
                    out.push(StampedBatch {
                        stamp,
                        base_offset: header.base_offset,
                        record_count: header.record_count,
                        committed_at_ms: header.committed_at_ms,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Reads from `opts.offset`: up to `max_records` records or `max_bytes` encoded bytes
    /// (always at least one record when one is available), stopping at the first record not
    /// due under `max_committed_at_ms`.
    pub(crate) fn read(&self, opts: &ReadOptions) -> Result<ReadResult, LogError> {
        let (log_start, hw) = {
            let v = read(&self.view);
            (v.log_start(), v.next_offset)
        };
        if opts.offset < log_start {
            return Err(LogError::BelowStart {
                requested: opts.offset,
                log_start,
            });
        }
        if opts.offset > hw {
            return Err(LogError::BeyondEnd {
                requested: opts.offset,
                high_watermark: hw,
            });
        }
        let max_records = opts.max_records.max(1);
        let mut records = Vec::new();
        let mut bytes = 0usize;
        let mut next = opts.offset;
        let mut not_due = None;
        'segments: while next < hw {
            let pos = {
                let v = read(&self.view);
                let i = v.segments.partition_point(|s| s.base <= next);
                if i == 0 {
                    // Retention removed the segment while we were reading.
                    return Err(LogError::BelowStart {
                        requested: next,
                        log_start: v.log_start(),
                    });
                }
                let s = &v.segments[i - 1];
                Position {
                    base: s.base,
                    file: s.file.clone(),
                    path: s.path.clone(),
                    start: s.index.lookup(next),
                    end: s.len,
                    seg_next: s.next_offset,
                }
            };
            let mut scanner =
                Scanner::with_chunk(pos.file.as_ref(), pos.start, pos.end, READ_CHUNK_BYTES)
                    .with_buffers(Arc::clone(&self.read_buffers));
            loop {
                let at = scanner.pos();
                let remembered = lock(&self.frames).get(pos.base, at);
                let (frame, fresh) = match remembered {
                    Some(f) => {
                        // Checked by an earlier read of this open log: judged by its header
                        // as a scanned frame is, and taken from memory.
                        scanner.seek(at + u64::from(f.header.frame_len));
                        (f, false)
                    }
                    None => {
                        // Frames wholly before `next`, and a first frame not yet due, are
                        // judged by their header alone: an idle delay cursor's wake-up reads a
                        // few dozen bytes, not the frame it is waiting for.
                        let gate = opts.max_committed_at_ms;
                        let step = scanner
                            .next_frame_with(|h| {
                                if h.next_offset() <= next {
                                    FrameAction::Skip
                                } else if gate.is_some_and(|gate| h.committed_at_ms > gate) {
                                    FrameAction::Stop
                                } else {
                                    FrameAction::Read
                                }
                            })
                            .map_err(|e| {
                                LogError::io(format!("reading {}", pos.path.display()), e)
                            })?;
                        let (at, header, bytes) = match step {
                            Scan::Skipped { .. } => continue,
                            Scan::Stopped { header } => {
                                not_due = Some(NotDue {
                                    offset: next,
                                    due_at_ms: header.committed_at_ms,
                                });
                                break 'segments;
                            }
                            Scan::End => break,
                            Scan::Bad { pos: at, error } => {
                                return Err(LogError::Corrupt(Damage::BadFrameOnRead {
                                    segment: pos.path,
                                    position: at,
                                    error,
                                }));
                            }
                            Scan::Frame { pos, header, bytes } => (pos, header, bytes),
                        };
                        // The whole body is checked now, as a full decode would check it,
                        // even though only the records returned are decoded.
                        let index = format::index_frame(&header, &bytes).map_err(|error| {
                            LogError::Corrupt(Damage::UndecodableFrame {
                                segment: pos.path.clone(),
                                base_offset: header.base_offset,
                                error,
                            })
                        })?;
                        let frame = VerifiedFrame {
                            segment_base: pos.base,
                            pos: at,
                            header,
                            bytes,
                            index: Arc::new(index),
                        };
                        (frame, true)
                    }
                };
                let header = frame.header;
                if header.next_offset() <= next {
                    continue;
                }
                if let Some(gate) = opts.max_committed_at_ms
                    && header.committed_at_ms > gate
                {
                    if !fresh {
                        // Stay before it, as a scanned frame not due does.
                        scanner.seek(frame.pos);
                    }
                    not_due = Some(NotDue {
                        offset: next,
                        due_at_ms: header.committed_at_ms,
                    });
                    break 'segments;
                }
                let skip = usize::try_from(next.saturating_sub(header.base_offset)).unwrap_or(0);
                let mut full = false;
                for i in skip..frame.index.len() {
                    // Batches published after this read began stay for the next read, so the
                    // answer's high watermark covers everything it returns.
                    let encoded_len = frame.index.encoded_len(i);
                    if header.base_offset + i as u64 >= hw
                        || (!records.is_empty()
                            && (records.len() >= max_records
                                || bytes.saturating_add(encoded_len) > opts.max_bytes))
                    {
                        full = true;
                        break;
                    }
                    let d = frame
                        .index
                        .decode(&header, &frame.bytes, i)
                        .map_err(|error| {
                            LogError::Corrupt(Damage::UndecodableFrame {
                                segment: pos.path.clone(),
                                base_offset: header.base_offset,
                                error,
                            })
                        })?;
                    bytes = bytes.saturating_add(d.encoded_len);
                    records.push(d.record);
                    next += 1;
                }
                if records.len() >= max_records {
                    full = true;
                }
                if full {
                    // Stopped inside this frame: the next read starts here, so keep it.
                    if fresh && next < header.next_offset() {
                        lock(&self.frames).keep(frame, log_start);
                    }
                    break 'segments;
                }
            }
            if next < pos.seg_next {
                return Err(LogError::Corrupt(Damage::SegmentEndsEarly {
                    segment: pos.path,
                    offset: next,
                    segment_next_offset: pos.seg_next,
                }));
            }
        }
        Ok(ReadResult {
            records,
            next_offset: next,
            high_watermark: hw,
            log_start_offset: log_start,
            not_due,
        })
    }
}
