//! The read path: find the segment and the nearest indexed frame for an offset, then scan
//! frames forward, never past the durable length the writer has published.

use std::path::PathBuf;
use std::sync::Arc;

use crate::damage::Damage;
use crate::fs::File;
use crate::log::format;
use crate::log::segment::{FrameAction, READ_CHUNK_BYTES, Scan, Scanner};
use crate::log::{Log, LogError, read};
use crate::record::{NotDue, ReadOptions, ReadResult};

/// Where to continue reading: a snapshot of one segment taken under the view lock.
struct Position {
    file: Arc<dyn File>,
    path: PathBuf,
    start: u64,
    end: u64,
    seg_next: u64,
}

impl Log {
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
                    file: s.file.clone(),
                    path: s.path.clone(),
                    start: s.index.lookup(next),
                    end: s.len,
                    seg_next: s.next_offset,
                }
            };
            let mut scanner =
                Scanner::with_chunk(pos.file.as_ref(), pos.start, pos.end, READ_CHUNK_BYTES);
            loop {
                // Frames wholly before `next`, and a first frame not yet due, are judged by
                // their header alone: an idle delay cursor's wake-up reads a few dozen bytes,
                // not the frame it is waiting for.
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
                    .map_err(|e| LogError::io(format!("reading {}", pos.path.display()), e))?;
                let (header, frame) = match step {
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
                    Scan::Frame { header, bytes, .. } => (header, bytes),
                };
                if header.next_offset() <= next {
                    continue;
                }
                if let Some(gate) = opts.max_committed_at_ms
                    && header.committed_at_ms > gate
                {
                    not_due = Some(NotDue {
                        offset: next,
                        due_at_ms: header.committed_at_ms,
                    });
                    break 'segments;
                }
                let decoded = format::decode_batch(&header, &frame).map_err(|error| {
                    LogError::Corrupt(Damage::UndecodableFrame {
                        segment: pos.path.clone(),
                        base_offset: header.base_offset,
                        error,
                    })
                })?;
                let skip = usize::try_from(next.saturating_sub(header.base_offset)).unwrap_or(0);
                for d in decoded.into_iter().skip(skip) {
                    // Batches published after this read began stay for the next read, so the
                    // answer's high watermark covers everything it returns.
                    if d.record.offset >= hw {
                        break 'segments;
                    }
                    if !records.is_empty()
                        && (records.len() >= max_records
                            || bytes.saturating_add(d.encoded_len) > opts.max_bytes)
                    {
                        break 'segments;
                    }
                    bytes = bytes.saturating_add(d.encoded_len);
                    records.push(d.record);
                    next += 1;
                }
                if records.len() >= max_records {
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
