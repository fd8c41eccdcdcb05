//! Retention: deleting whole segments, oldest first, never the active (last) one.
//!
//! By age, a segment goes when its newest commit time is more than `retention_ms` before now.
//! By size, the oldest segments go while the partition is larger than `retention_bytes`.
//! Every step first records the new log start (the base of the oldest segment that stays) in
//! the log-start file, durably, and only then deletes the segment files below it and syncs the
//! directory. The log start therefore only moves by a step the log recorded: a crash in the
//! middle leaves segments below the recorded start, which the next open (or closed-log pass)
//! deletes; a head missing for any other reason is reported as damage, never as retention.

use std::path::Path;

use crate::fs::{FileSystem, OpenMode};
use crate::log::format::{self, HEADER_LEN};
use crate::log::segment::{self, SegmentFile};
use crate::log::start::{self, Head};
use crate::log::{Log, LogError, lock, read, write};
use crate::record::LogConfig;

/// What a retention pass over one partition did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Trimmed {
    pub(crate) segments: u64,
    pub(crate) bytes: u64,
    /// The new log start offset, when it moved.
    pub(crate) new_log_start: Option<u64>,
}

fn expired(newest_ms: Option<i64>, now_ms: i64, retention_ms: u64) -> bool {
    match newest_ms {
        // An empty segment that is not the active one holds nothing worth keeping.
        None => true,
        Some(t) => {
            let age = i128::from(now_ms) - i128::from(t);
            age > i128::from(retention_ms)
        }
    }
}

/// How many of the oldest segments to delete, given (size, newest commit time) per segment.
fn plan(segments: &[(u64, Option<i64>)], config: &LogConfig, now_ms: i64) -> usize {
    let deletable = segments.len().saturating_sub(1);
    let mut n = 0;
    if let Some(ms) = config.retention_ms {
        while n < deletable && expired(segments[n].1, now_ms, ms) {
            n += 1;
        }
    }
    if let Some(cap) = config.retention_bytes {
        let mut remaining: u64 = segments[n..].iter().map(|s| s.0).sum();
        while n < deletable && remaining > cap {
            remaining -= segments[n].0;
            n += 1;
        }
    }
    n
}

/// Deletes segment files (the recorded log start is already past them) and syncs `dir`.
pub(crate) fn remove_files(
    fs: &dyn FileSystem,
    dir: &Path,
    paths: &[std::path::PathBuf],
) -> Result<(), LogError> {
    for path in paths {
        fs.remove_file(path)
            .map_err(|e| LogError::io(format!("deleting {}", path.display()), e))?;
    }
    if !paths.is_empty() {
        fs.sync_dir(dir)
            .map_err(|e| LogError::io(format!("syncing {}", dir.display()), e))?;
    }
    Ok(())
}

impl Log {
    /// Applies retention to an open log.
    pub(crate) fn enforce_retention(
        &self,
        config: &LogConfig,
        now_ms: i64,
    ) -> Result<Trimmed, LogError> {
        // The produce lock keeps a roll from racing the choice of the active segment.
        let _w = lock(&self.writer);
        let sizes: Vec<(u64, Option<i64>)> = read(&self.view)
            .segments
            .iter()
            .map(|s| (s.len, s.newest_committed_at_ms))
            .collect();
        let n = plan(&sizes, config, now_ms);
        if n == 0 {
            return Ok(Trimmed::default());
        }
        // `plan` never takes the last (active) segment, so segment `n` exists and stays.
        let keep_from = read(&self.view).segments[n].base;
        record_start(self.fs.as_ref(), &self.dir, keep_from)?;
        // Readers holding a removed segment's handle can finish: the file stays readable
        // until they drop it.
        let (removed, new_start) = {
            let mut v = write(&self.view);
            let removed: Vec<_> = v.segments.drain(..n).collect();
            (removed, v.log_start())
        };
        let paths: Vec<_> = removed.iter().map(|s| s.path.clone()).collect();
        remove_files(self.fs.as_ref(), &self.dir, &paths)?;
        Ok(Trimmed {
            segments: removed.len() as u64,
            bytes: removed.iter().map(|s| s.len).sum(),
            new_log_start: Some(new_start),
        })
    }
}

/// Commit time of the first batch of a segment file, from its header alone.
fn first_commit_time(fs: &dyn FileSystem, seg: &SegmentFile) -> Option<i64> {
    let file = fs.open(&seg.path, OpenMode::Read).ok()?;
    let mut head = [0u8; HEADER_LEN];
    file.read_exact_at(&mut head, 0).ok()?;
    format::parse_header(&head).ok().map(|h| h.committed_at_ms)
}

fn record_start(fs: &dyn FileSystem, dir: &Path, start: u64) -> Result<(), LogError> {
    start::write(fs, dir, start).map_err(|e| {
        LogError::io(
            format!("recording log start {start} in {}", dir.display()),
            e,
        )
    })
}

/// Applies retention to a closed log from its directory, without opening it. A segment's age
/// is judged by the first commit time of the segment after it, which is never older than the
/// segment's own newest record (commit times do not decrease), so this never deletes early; a
/// segment whose successor cannot be read is kept.
///
/// The head is checked against the log-start file first, as an open would: segments below
/// the recorded start (an interrupted step) are deleted, a missing head is `Corrupt`. Holes
/// further up are found only when the log is opened; one lying wholly inside the range this
/// pass deletes disappears with it (its records were due for deletion).
pub(crate) fn enforce_closed(
    fs: &dyn FileSystem,
    dir: &Path,
    config: &LogConfig,
    now_ms: i64,
) -> Result<Trimmed, LogError> {
    let mut files = segment::list(fs, dir)
        .map_err(|e| LogError::io(format!("listing segments in {}", dir.display()), e))?;
    let recorded = start::read(fs, dir).map_err(|e| {
        LogError::io(
            format!("reading the log-start file in {}", dir.display()),
            e,
        )
    })?;
    let mut finished = Trimmed::default();
    match start::check_head(dir, &files, recorded) {
        Head::Agrees | Head::Unrecorded => {}
        Head::Damaged(reason) => return Err(LogError::Corrupt(reason)),
        Head::Interrupted { start, below } => {
            tracing::warn!(dir = %dir.display(), log_start = start, segments = below,
                "finishing a retention step a crash interrupted: deleting the segments below the recorded log start");
            let gone: Vec<SegmentFile> = files.drain(..below).collect();
            let paths: Vec<_> = gone.iter().map(|f| f.path.clone()).collect();
            remove_files(fs, dir, &paths)?;
            finished.segments = gone.len() as u64;
            finished.bytes = gone.iter().map(|f| f.len).sum();
        }
    }
    let sized: Vec<(u64, Option<i64>)> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let successor_first = files
                .get(i + 1)
                .and_then(|next| first_commit_time(fs, next));
            // No successor commit time: treat as brand new so it is never expired by age.
            (f.len, Some(successor_first.unwrap_or(i64::MAX)))
        })
        .collect();
    let n = plan(&sized, config, now_ms);
    if n == 0 {
        return Ok(finished);
    }
    // `plan` never takes the last segment, so segment `n` exists and stays.
    let keep_from = files[n].base;
    record_start(fs, dir, keep_from)?;
    let paths: Vec<_> = files[..n].iter().map(|f| f.path.clone()).collect();
    remove_files(fs, dir, &paths)?;
    Ok(Trimmed {
        segments: finished.segments + n as u64,
        bytes: finished.bytes + files[..n].iter().map(|f| f.len).sum::<u64>(),
        new_log_start: Some(keep_from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ms: Option<u64>, bytes: Option<u64>) -> LogConfig {
        LogConfig {
            segment_bytes: 1,
            retention_ms: ms,
            retention_bytes: bytes,
        }
    }

    #[test]
    fn the_active_segment_is_never_planned_for_deletion() {
        let segs = [(10, Some(0)), (10, Some(0))];
        assert_eq!(plan(&segs, &cfg(Some(1), Some(0)), 1_000_000), 1);
    }

    #[test]
    fn age_deletes_only_a_prefix_of_old_segments() {
        let segs = [
            (10, Some(100)),
            (10, Some(900)),
            (10, Some(150)),
            (10, Some(2000)),
        ];
        // now 1000, retention 500: first expired (age 900), second not (age 100): stop there.
        assert_eq!(plan(&segs, &cfg(Some(500), None), 1000), 1);
    }

    #[test]
    fn size_deletes_oldest_until_under_the_cap() {
        let segs = [
            (100, Some(0)),
            (100, Some(0)),
            (100, Some(0)),
            (50, Some(0)),
        ];
        assert_eq!(plan(&segs, &cfg(None, Some(160)), 0), 2);
        assert_eq!(plan(&segs, &cfg(None, Some(350)), 0), 0);
    }
}
