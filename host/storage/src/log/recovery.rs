//! Opening a log: every segment is scanned and checked, the sparse index rebuilt, and the tail
//! judged against the durable boundary in the high-watermark file.
//!
//! Rules (`docs/storage.md` explains them for operators):
//! - A bad frame in the last segment, at or past the durable boundary, with no valid frame
//!   after it, is a torn tail from a crash: it is cut off (truncate + `fdatasync`).
//! - A bad frame below the boundary, in any segment but the last, or followed by a valid
//!   frame, is corruption: the log is not opened, and the partition is quarantined.
//! - Offsets must run on without gaps, and the log must reach at least the next offset the
//!   high-watermark file recorded: acknowledged records are never cut silently.
//! - The oldest segment must start at the offset the log-start file records (`start`): only a
//!   retention step moves the log start, and it records the new start before deleting. Older
//!   segments still present are the rest of an interrupted retention step and are deleted; a
//!   head that starts later is missing, and the partition is quarantined. A partition without
//!   the file (made by an older version) gets one recording its oldest segment, with a warning.
//! - A torn tail is copied into `torn/` with a note (`torn`) before it is cut, and counted.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use crate::clock::Clock;
use crate::damage::Damage;
use crate::fs::{File, FileSystem, OpenMode};
use crate::log::hwm::{self, HWM_FILE_NAME, HwmRecord};
use crate::log::segment::{self, Scan, Scanner, SparseIndex};
use crate::log::start::{self, Head, Recorded};
use crate::log::{Log, LogError, SegView, View, Writer, retention, torn, writer};

/// Why a log could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Corruption: quarantine the partition with this reason.
    Corrupt(Damage),
    /// An I/O error; nothing was decided, opening may be retried.
    Io(LogError),
}

fn io(ctx: impl Into<String>) -> impl FnOnce(std::io::Error) -> OpenError {
    let ctx = ctx.into();
    move |e| OpenError::Io(LogError::io(ctx, e))
}

/// Creates an empty segment file and makes its directory entry durable before returning, so
/// nothing can refer to a segment a crash could lose.
pub(crate) fn create_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    base: u64,
) -> std::io::Result<Box<dyn File>> {
    let path = dir.join(segment::segment_name(base));
    let file = fs.open(&path, OpenMode::CreateReadWrite)?;
    if !file.is_empty()? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{} already exists with data; refusing to reuse it as a new segment",
                path.display()
            ),
        ));
    }
    fs.sync_dir(dir)?;
    Ok(file)
}

/// Opens the high-watermark file for in-place rewrites, making a new file's entry durable.
pub(crate) fn open_hwm_file(fs: &dyn FileSystem, dir: &Path) -> std::io::Result<Box<dyn File>> {
    let path = dir.join(HWM_FILE_NAME);
    let existed = fs.exists(&path)?;
    let file = fs.open(&path, OpenMode::CreateReadWrite)?;
    if !existed {
        fs.sync_dir(dir)?;
    }
    Ok(file)
}

/// Opens (and recovers) the log in `dir`; `clock` dates a torn-tail cut.
pub(crate) fn open(
    fs: Arc<dyn FileSystem>,
    dir: &Path,
    clock: &dyn Clock,
) -> Result<Log, OpenError> {
    let mut files = segment::list(fs.as_ref(), dir)
        .map_err(io(format!("listing segments in {}", dir.display())))?;
    let hwm = hwm::read(fs.as_ref(), dir).map_err(io(format!(
        "reading the high-watermark file in {}",
        dir.display()
    )))?;
    let recorded = start::read(fs.as_ref(), dir).map_err(io(format!(
        "reading the log-start file in {}",
        dir.display()
    )))?;

    // The head of the log: only a retention step the log recorded may have moved it.
    let mut record_legacy_start = None;
    match start::check_head(dir, &files, recorded) {
        Head::Agrees => {}
        Head::Damaged(reason) => return Err(OpenError::Corrupt(reason)),
        Head::Interrupted { start, below } => {
            tracing::warn!(dir = %dir.display(), log_start = start, segments = below,
                "finishing a retention step a crash interrupted: deleting the segments below the recorded log start");
            let paths: Vec<_> = files.drain(..below).map(|f| f.path).collect();
            retention::remove_files(fs.as_ref(), dir, &paths).map_err(OpenError::Io)?;
        }
        Head::Unrecorded => {
            if let Some(first) = files.first() {
                record_legacy_start = Some(first.base);
            }
        }
    }

    if files.is_empty() {
        if let Some(h) = hwm
            && h.next_offset > 0
        {
            return Err(OpenError::Corrupt(Damage::NoSegmentsButDurable {
                dir: dir.to_path_buf(),
                durable_next_offset: h.next_offset,
            }));
        }
        // A new partition: its log start is recorded before its first segment exists, so a
        // segment file is never found without the record that vouches for the head.
        if recorded == Recorded::Missing {
            start::write(fs.as_ref(), dir, 0).map_err(io(format!(
                "writing the log-start file in {}",
                dir.display()
            )))?;
        }
        create_segment(fs.as_ref(), dir, 0).map_err(io(format!(
            "creating the first segment in {}",
            dir.display()
        )))?;
        files = segment::list(fs.as_ref(), dir)
            .map_err(io(format!("listing segments in {}", dir.display())))?;
    }
    let first = files[0].base;
    let boundary_known = matches!(hwm, Some(h) if h.segment_base >= first);

    // The durable boundary: (segment base, bytes of it known durable). Without a usable
    // high-watermark file nothing is known below the tail, so only the tail rules apply.
    let boundary = match hwm {
        None => (first, 0),
        Some(h) if h.segment_base < first => (first, 0),
        Some(h) => {
            if !files.iter().any(|f| f.base == h.segment_base) {
                return Err(OpenError::Corrupt(Damage::DurableSegmentMissing {
                    dir: dir.to_path_buf(),
                    segment_base: h.segment_base,
                }));
            }
            (h.segment_base, h.segment_pos)
        }
    };

    let n = files.len();
    let mut expected = first;
    let mut newest = i64::MIN;
    let mut views = Vec::with_capacity(n);
    for (i, f) in files.iter().enumerate() {
        let is_last = i + 1 == n;
        let name = f.path.display().to_string();
        if f.base != expected {
            return Err(OpenError::Corrupt(Damage::SegmentOutOfSequence {
                segment: f.path.clone(),
                base: f.base,
                expected,
            }));
        }
        let mode = if is_last {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        };
        let file = fs
            .open(&f.path, mode)
            .map_err(io(format!("opening {name}")))?;
        // Issue 4 (durable tail, see `writer`): unless a clean close recorded exactly this
        // length, the last segment is read as the device holds it, not as the page cache does.
        if is_last
            && !hwm.is_some_and(|h| h.clean && h.segment_base == f.base && h.segment_pos == f.len)
        {
            writer::read_tail_from_device(fs.as_ref(), dir, file.as_ref())
                .map_err(io(format!("reading {name} from the device")))?;
        }
        let mut len = file
            .len()
            .map_err(io(format!("reading the size of {name}")))?;
        if f.base == boundary.0 && len < boundary.1 {
            return Err(OpenError::Corrupt(Damage::SegmentShorterThanDurable {
                segment: f.path.clone(),
                len,
                durable_len: boundary.1,
            }));
        }
        let mut index = SparseIndex::default();
        let mut seg_newest = None;
        let mut scanner = Scanner::new(file.as_ref(), 0, len);
        loop {
            match scanner
                .next_frame()
                .map_err(io(format!("reading {name}")))?
            {
                // `next_frame` reads every frame; it never skips or stops on its own.
                Scan::End | Scan::Stopped { .. } => break,
                Scan::Skipped { .. } => continue,
                Scan::Frame { pos, header, .. } => {
                    if header.base_offset != expected {
                        return Err(OpenError::Corrupt(Damage::FrameOutOfSequence {
                            segment: f.path.clone(),
                            position: pos,
                            base_offset: header.base_offset,
                            expected,
                        }));
                    }
                    index.note(header.base_offset, pos);
                    expected = header.next_offset();
                    newest = newest.max(header.committed_at_ms);
                    seg_newest = Some(seg_newest.map_or(header.committed_at_ms, |t: i64| {
                        t.max(header.committed_at_ms)
                    }));
                }
                Scan::Bad { pos, error } => {
                    let below_boundary =
                        f.base < boundary.0 || (f.base == boundary.0 && pos < boundary.1);
                    if below_boundary {
                        return Err(OpenError::Corrupt(Damage::BadFrameBelowBoundary {
                            segment: f.path.clone(),
                            position: pos,
                            error,
                        }));
                    }
                    if !is_last {
                        return Err(OpenError::Corrupt(Damage::BadFrameInCompleteSegment {
                            segment: f.path.clone(),
                            position: pos,
                            error,
                        }));
                    }
                    if let Some(valid) =
                        segment::find_valid_frame_after(file.as_ref(), pos, len, expected)
                            .map_err(io(format!("reading {name}")))?
                    {
                        return Err(OpenError::Corrupt(Damage::BadFrameBeforeValidFrame {
                            segment: f.path.clone(),
                            position: pos,
                            error,
                            valid_at: valid,
                        }));
                    }
                    // The cut bytes are copied aside (durably) before they are cut: without a
                    // high-watermark file covering them, recovery cannot tell an acknowledged
                    // record from a torn write, so the operator must be able to see and
                    // inspect what went.
                    let cut_len = usize::try_from(len - pos).map_err(|_| {
                        OpenError::Io(LogError::io(
                            format!("keeping aside the torn tail of {name}"),
                            std::io::Error::other("tail too large to copy"),
                        ))
                    })?;
                    let mut tail = vec![0u8; cut_len];
                    file.read_exact_at(&mut tail, pos)
                        .map_err(io(format!("reading the torn tail of {name}")))?;
                    let (records, records_exact) = torn::count_records(&tail, expected);
                    let cut = torn::Cut {
                        segment_base: f.base,
                        position: pos,
                        bytes: len - pos,
                        from_offset: expected,
                        records,
                        records_exact,
                        boundary_known,
                        at_ms: clock.now_ms(),
                    };
                    let kept = torn::keep_aside(fs.as_ref(), dir, &cut, &tail).map_err(io(
                        format!("keeping aside the torn tail of {name} before cutting it"),
                    ))?;
                    tracing::warn!(
                        segment = %name,
                        position = pos,
                        cut_bytes = len - pos,
                        cut_records = records,
                        cut_records_exact = records_exact,
                        from_offset = expected,
                        last_cut_offset = (records > 0).then(|| expected + records - 1),
                        durable_boundary_known = boundary_known,
                        kept_at = %kept.display(),
                        %error,
                        "truncating a torn tail left by a crash; its records are no longer readable \
                         and later records reuse their offsets (they may have been acknowledged \
                         when no high-watermark file covered them); the cut bytes are kept aside"
                    );
                    file.set_len(pos)
                        .and_then(|()| file.sync_data())
                        .map_err(io(format!("truncating the torn tail of {name}")))?;
                    len = pos;
                    break;
                }
            }
        }
        views.push(SegView {
            base: f.base,
            path: f.path.clone(),
            file: Arc::from(file),
            len,
            next_offset: expected,
            newest_committed_at_ms: seg_newest,
            index,
        });
    }

    if let Some(h) = hwm
        && h.segment_base >= first
        && expected < h.next_offset
    {
        return Err(OpenError::Corrupt(Damage::LogShorterThanDurable {
            dir: dir.to_path_buf(),
            end_offset: expected,
            durable_next_offset: h.next_offset,
        }));
    }
    if let Some(h) = hwm {
        newest = newest.max(h.newest_committed_at_ms);
    }

    if let Some(first) = record_legacy_start {
        if first > 0 {
            tracing::warn!(dir = %dir.display(), log_start = first,
                "this partition has no log-start file (made by an older version, or the file was removed): \
                 accepting its oldest segment as the log start; a missing head of the log cannot be \
                 detected this once");
        }
        start::write(fs.as_ref(), dir, first).map_err(io(format!(
            "writing the log-start file in {}",
            dir.display()
        )))?;
    }
    let recovered_cut = match torn::summary(fs.as_ref(), dir) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "could not read the kept-aside torn tails");
            None
        }
    };

    // Record the recovered end as the new durable boundary, flagged "open" (not clean), so a
    // crash from here on is recognised by peek and by the next open.
    let last = views.last().ok_or_else(|| {
        OpenError::Corrupt(Damage::NoSegmentsAfterRecovery {
            dir: dir.to_path_buf(),
        })
    })?;
    let rec = HwmRecord {
        segment_base: last.base,
        segment_pos: last.len,
        next_offset: expected,
        newest_committed_at_ms: newest,
        clean: false,
    };
    let hwm_file = open_hwm_file(fs.as_ref(), dir).map_err(io(format!(
        "opening the high-watermark file in {}",
        dir.display()
    )))?;
    hwm::write(hwm_file.as_ref(), &rec).map_err(io(format!(
        "writing the high-watermark file in {}",
        dir.display()
    )))?;

    let writer = Writer {
        active: last.file.clone(),
        active_base: last.base,
        active_len: last.len,
        next_offset: expected,
        newest_committed_at_ms: newest,
        hwm_file: Some(hwm_file),
        last_hwm_write_ms: clock.now_ms(),
        closed: false,
        failed: None,
        roll_due: false,
    };
    Ok(Log {
        dir: dir.to_path_buf(),
        fs,
        writer: Mutex::new(writer),
        view: RwLock::new(View {
            segments: views,
            next_offset: expected,
        }),
        recovered_cut,
        frames: Default::default(),
        queue: Default::default(),
        counters: Default::default(),
        verify_buffers: Default::default(),
        read_buffers: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::fs::RealFs;
    use crate::log::format;
    use crate::record::{LogConfig, NewRecord};

    #[test]
    fn the_sparse_index_is_rebuilt_on_open_with_an_entry_every_few_kilobytes() {
        let dir = tempfile::tempdir().unwrap();
        let fs: Arc<dyn FileSystem> = Arc::new(RealFs);
        let clock = ManualClock::new(0);
        let config = LogConfig::default();
        let log = open(fs.clone(), dir.path(), &clock).unwrap();
        for i in 0..200u32 {
            let rec = NewRecord {
                value: Some(vec![i as u8; 500].into()),
                ..NewRecord::default()
            };
            let mut frame = Vec::new();
            let body = format::encode_batch(&[rec], None, &mut frame).unwrap();
            log.append(&mut frame, body, 1, &clock, &config, |_| {})
                .unwrap();
        }
        let live = crate::log::read(&log.view).segments[0].index.clone();
        log.close().unwrap();
        drop(log);
        let reopened = open(fs, dir.path(), &clock).unwrap();
        let view = crate::log::read(&reopened.view);
        let rebuilt = &view.segments[0].index;
        // ~100 KiB of frames, one entry per 4 KiB.
        assert!(rebuilt.len() >= 20, "{} entries", rebuilt.len());
        assert_eq!(rebuilt.len(), live.len());
        for offset in [0u64, 17, 100, 199] {
            assert_eq!(rebuilt.lookup(offset), live.lookup(offset));
            assert!(rebuilt.lookup(offset) <= view.segments[0].len);
        }
        assert!(
            rebuilt.lookup(199) > 0,
            "a read near the end starts past the segment start"
        );
    }
}
