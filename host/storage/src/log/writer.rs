//! The write path: append + `fdatasync` + verify under the produce lock, segment roll, the
//! lazy high-watermark update, failure handling and close.
//!
//! An `fdatasync` error is never retried on the same handle: Linux may already have dropped
//! the dirty pages and marked them clean, so a second sync could "succeed" without the data.
//! Instead the append fails, the active segment is reopened on a fresh handle, truncated back
//! to the last durable length and synced, and the durable tail is read back from the device;
//! if any of that fails the log stops (`Failed`), and if the device lost acknowledged bytes the
//! partition is quarantined.
//!
//! What "durable" means here (the rule every acknowledgement follows): a batch is acknowledged
//! only after its own `fdatasync` succeeded on the descriptor that wrote it (open before the
//! bytes were written, so it sees any writeback error of them), and after its bytes were read
//! back from the device, not from the page cache ([`File::read_exact_uncached_at`]).
//!
//! Why each of these rules exists (the failed-`fdatasync` incident on ext4, what the fault
//! model showed, and what each part of the fix closes) is in `docs/storage.md`, "After a failed
//! fdatasync: what was found".

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::Clock;
use crate::damage::{Damage, DeviceLoss, Failure};
use crate::fs::{File, FileSystem, OpenMode};
use crate::log::hwm::{self, HwmRecord};
use crate::log::recovery::{create_segment, open_hwm_file};
use crate::log::segment::{self, Scan, Scanner, SparseIndex};
use crate::log::{Log, LogError, SegView, Stopped, Writer, lock, write};
use crate::record::{Appended, LogConfig};

/// How often the high-watermark file is rewritten while appends flow: at most once a second,
/// so its extra `fdatasync` costs at most one per second, and a crash leaves at most about a
/// second of log past the boundary to check with the torn-tail rules. Measured on the clock
/// the store is given (so tests move it with a `ManualClock` instead of sleeping).
pub const HWM_UPDATE_INTERVAL: Duration = Duration::from_secs(1);

/// Whether the high-watermark file is due for a rewrite at `now_ms`, last written at
/// `last_ms`. A wall clock stepped backwards makes it due at once: waiting for the clock to
/// come back past the old reading could leave the boundary unmoved for as long as the step.
fn hwm_due(last_ms: i64, now_ms: i64) -> bool {
    let interval_ms = i64::try_from(HWM_UPDATE_INTERVAL.as_millis()).unwrap_or(i64::MAX);
    now_ms < last_ms || now_ms.saturating_sub(last_ms) >= interval_ms
}

/// Largest read-back piece when verifying an append. Device reads of 1 to 2 MiB run at
/// 0.9 to 1.4 GB/s on the build machine's virtio disk against 0.65 to 0.8 GB/s for 256 KiB
/// (`dd iflag=direct`), so a group's frames come back in as few reads as this allows, split
/// evenly (two slabs' frames, about 1 MiB, in one read); a piece this size still stays in the
/// CPU's last-level cache between the copy and the comparison.
const VERIFY_CHUNK_BYTES: usize = 2 * 1024 * 1024;

/// Read-back buffers a store keeps between appends, shared by all its logs: a buffer per open
/// log would hold megabytes for each of hundreds of child partitions, most of them idle.
const VERIFY_BUFFERS_KEPT: usize = 4;

/// The exact end of a cleanly closed log ([`Log::clean_end`]): its last segment, that segment's
/// length and the next offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CleanEnd {
    /// The last (active) segment's path.
    pub(crate) segment: PathBuf,
    /// The bytes of that segment, all durable, when the log closed.
    pub(crate) segment_len: u64,
    /// The log's next offset: its high watermark.
    pub(crate) next_offset: u64,
}

/// The read-back buffers of a store's logs: an append takes one for its verify and gives it
/// back, so a store holds at most [`VERIFY_BUFFERS_KEPT`] of them (up to 2 MiB each) while idle,
/// and one per append verifying at the same moment while busy. A buffer is reused as it is
/// (never zeroed): the device read overwrites the bytes compared.
#[derive(Debug, Default)]
pub(crate) struct VerifyBuffers {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl VerifyBuffers {
    /// A buffer to read into, empty if none is kept (it grows on its first read).
    fn take(&self) -> Vec<u8> {
        lock(&self.free).pop().unwrap_or_default()
    }

    /// Returns `buffer` for the next append, or frees it when enough are kept.
    fn give(&self, buffer: Vec<u8>) {
        let mut free = lock(&self.free);
        if free.len() < VERIFY_BUFFERS_KEPT {
            free.push(buffer);
        }
    }
}

/// Syncs `file` and reads `frames`, written one after another from `pos`, back from the
/// device (a successful fdatasync does not prove the device holds the bytes, see the module
/// doc), in pieces small enough to stay in the CPU cache between the copy and the comparison,
/// rather than through one buffer as large as the frames.
fn sync_verified(
    file: &dyn File,
    frames: &[&[u8]],
    pos: u64,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    file.sync_data()?;
    let total: usize = frames.iter().map(|f| f.len()).sum();
    // Even pieces: 2.1 MiB is read as two of 1.05, not as 2 MiB and a small tail.
    let piece = total.div_ceil(total.div_ceil(VERIFY_CHUNK_BYTES).max(1));
    // Where the comparison is: frame `at_frame`, byte `in_frame` of it.
    let (mut at_frame, mut in_frame) = (0, 0);
    let mut done = 0;
    while done < total {
        let n = piece.min(total - done);
        let read = file.read_uncached_into(scratch, n, pos + done as u64)?;
        let mut k = 0;
        while k < n {
            let frame = frames[at_frame];
            let m = (frame.len() - in_frame).min(n - k);
            if read[k..k + m] != frame[in_frame..in_frame + m] {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "the bytes read back from the device after a successful fdatasync differ from the bytes written (at byte {} of the group's frame {at_frame} or later), so the append was not acknowledged ({})",
                        in_frame,
                        crate::error::UNKEPT_WRITE_ADVICE
                    ),
                ));
            }
            k += m;
            in_frame += m;
            if in_frame == frame.len() {
                at_frame += 1;
                in_frame = 0;
            }
        }
        done += n;
    }
    Ok(())
}

/// One frame for [`Log::append_in_order`]: an encoded frame (from `format::encode_batch`),
/// the body CRC that returned, and how many records it holds.
pub(crate) struct FrameToAppend<'a> {
    /// The frame; sealed on success, as it was (but for base offset and commit time) on an
    /// error.
    pub frame: &'a mut Vec<u8>,
    /// Its body CRC.
    pub body_crc: u32,
    /// Its record count.
    pub count: u32,
}

/// One append waiting for the produce lock, holding the frame it moved in.
#[derive(Debug)]
struct Queued {
    ticket: u64,
    frame: Vec<u8>,
    body_crc: u32,
    count: u32,
    /// The commit time read before the append queued.
    stamp: i64,
}

/// The appends of one log waiting for its produce lock, and the answers (with their frames)
/// of those a holder of the lock has written for them.
#[derive(Debug, Default)]
pub(crate) struct AppendQueue {
    next_ticket: u64,
    waiting: Vec<Queued>,
    done: std::collections::HashMap<u64, (Result<Appended, LogError>, Vec<u8>)>,
}

/// Prepares a log's last segment to be read as the device holds it, for recovery: the
/// directory is synced (a segment created just before a failure may have an entry that is not
/// yet durable, and the high-watermark file is about to name it), the file is synced (on this
/// new descriptor, which sees any error from now on) and its cached pages are dropped, so the
/// scan sees zeros, not the cache's copy, where a failed writeback left nothing on the device.
pub(crate) fn read_tail_from_device(
    fs: &dyn FileSystem,
    dir: &Path,
    file: &dyn File,
) -> std::io::Result<()> {
    fs.sync_dir(dir)?;
    file.sync_data()?;
    file.drop_cache()
}

/// How a device check of the durable tail went wrong.
enum TailCheck {
    /// Reading failed: nothing was learnt.
    Io(std::io::Error),
    /// The device does not hold what was acknowledged.
    Lost(DeviceLoss),
}

impl Log {
    fn active_path(&self, w: &Writer) -> std::path::PathBuf {
        self.dir.join(segment::segment_name(w.active_base))
    }

    /// Appends one encoded frame (from `format::encode_batch`, with the body CRC it returned)
    /// holding `count` records: [`Log::append_in_order`] with one frame.
    pub(crate) fn append(
        &self,
        frame: &mut Vec<u8>,
        body_crc: u32,
        count: u32,
        clock: &dyn Clock,
        config: &LogConfig,
        on_durable: impl FnOnce(u64),
    ) -> Result<Appended, LogError> {
        let mut frames = [FrameToAppend {
            frame,
            body_crc,
            count,
        }];
        let mut answers = self.append_in_order(&mut frames, clock, config, on_durable);
        answers.pop().unwrap_or_else(|| {
            Err(LogError::io(
                format!("appending to {}", self.dir.display()),
                std::io::Error::other("the append got no answer"),
            ))
        })
    }

    /// Appends `frames` one after another, in this order, and answers each (in the same
    /// order). The commit time is read from `clock` just before they queue for the produce
    /// lock and raised under it to the partition's newest commit time. Each answer comes only
    /// once its frame is durable and read back intact; every frame holds its bytes sealed
    /// (base offset and commit time filled in) on return, or unchanged but for those on an
    /// error.
    ///
    /// A frame is never acknowledged unless every frame before it in `frames` is: the
    /// answers are some successes, then errors only. The frames queue together and are
    /// written by the same holder of the lock, with one `fdatasync` and one read-back (two,
    /// when a segment roll falls between them).
    ///
    /// Group commit: appends that arrive while another holds the produce lock queue, and the
    /// next holder writes all of them, one after another in queue order, with one
    /// `fdatasync` and one read-back, answering each. An error of that sync is every one of
    /// the group's: none of them is acknowledged.
    pub(crate) fn append_in_order(
        &self,
        frames: &mut [FrameToAppend<'_>],
        clock: &dyn Clock,
        config: &LogConfig,
        on_durable: impl FnOnce(u64),
    ) -> Vec<Result<Appended, LogError>> {
        let stamp = clock.now_ms();
        // Queued under one lock, with consecutive tickets: whoever takes the queue next
        // takes all of them, in this order.
        let first_ticket = {
            let mut q = lock(&self.queue);
            let first = q.next_ticket;
            for f in frames.iter_mut() {
                let ticket = q.next_ticket;
                q.next_ticket += 1;
                q.waiting.push(Queued {
                    ticket,
                    frame: std::mem::take(f.frame),
                    body_crc: f.body_crc,
                    count: f.count,
                    stamp,
                });
            }
            self.counters
                .waiting
                .fetch_add(frames.len() as u64, Ordering::Relaxed);
            first
        };
        let tickets = first_ticket..first_ticket + frames.len() as u64;
        let mut guard = lock(&self.writer);
        loop {
            let mut group = {
                let mut q = lock(&self.queue);
                if tickets.clone().all(|t| q.done.contains_key(&t)) {
                    let mut answers = Vec::with_capacity(frames.len());
                    for (f, ticket) in frames.iter_mut().zip(tickets.clone()) {
                        if let Some((answer, bytes)) = q.done.remove(&ticket) {
                            *f.frame = bytes;
                            answers.push(answer);
                        }
                    }
                    drop(q);
                    drop(guard);
                    if let Some(Ok(a)) = answers.iter().rev().find(|a| a.is_ok()) {
                        on_durable(a.base_offset + u64::from(a.count));
                    }
                    return answers;
                }
                let group = std::mem::take(&mut q.waiting);
                self.counters
                    .waiting
                    .fetch_sub(group.len() as u64, Ordering::Relaxed);
                group
            };
            if group.is_empty() {
                // Only if a holder of the lock panicked after taking these appends from the
                // queue: their frames are gone with it, and nothing of them was acknowledged.
                return frames
                    .iter()
                    .map(|_| {
                        Err(LogError::io(
                            format!("appending to {}", self.dir.display()),
                            std::io::Error::other(
                                "the append was lost to a panic in another append",
                            ),
                        ))
                    })
                    .collect();
            }
            let answers = self.write_group(&mut guard, &mut group, clock, config);
            let mut q = lock(&self.queue);
            for (queued, answer) in group.into_iter().zip(answers) {
                q.done.insert(queued.ticket, (answer, queued.frame));
            }
        }
    }

    /// Writes `group` (under the produce lock, `w`): in runs that fit the active segment,
    /// rolling between runs, each run with one `fdatasync` and one read-back. Returns one
    /// answer per append, in order.
    fn write_group(
        &self,
        w: &mut Writer,
        group: &mut [Queued],
        clock: &dyn Clock,
        config: &LogConfig,
    ) -> Vec<Result<Appended, LogError>> {
        let mut answers: Vec<Result<Appended, LogError>> = Vec::with_capacity(group.len());
        if w.closed {
            answers.extend(group.iter().map(|_| Err(LogError::Closed)));
            return answers;
        }
        if let Some(stopped) = &w.failed {
            answers.extend(group.iter().map(|_| Err(stopped.error())));
            return answers;
        }
        self.counters
            .appends
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        let mut next = 0;
        while next < group.len() {
            if let Err(e) = self.write_run(w, group, &mut next, config, &mut answers) {
                // Every append not yet answered gets the error: none of them is durable.
                while answers.len() < group.len() {
                    answers.push(Err(e.for_another()));
                }
                if let Some(last) = answers.last_mut() {
                    *last = Err(e);
                }
                break;
            }
        }
        if answers.iter().any(Result::is_ok) {
            // Read again, under the lock: the stamps were read before it, so another
            // append's reading taken later may already be recorded, and comparing with it
            // would look like a step back.
            let now_ms = clock.now_ms();
            if hwm_due(w.last_hwm_write_ms, now_ms) {
                // Counted from the attempt, as before: a failing file is retried once an
                // interval.
                w.last_hwm_write_ms = now_ms;
                // The group is already durable; a failure here only leaves the boundary older.
                if let Err(e) = self.write_hwm(w, false) {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "could not update the high-watermark file");
                }
            }
        }
        answers
    }

    /// Writes the appends of `group` from `*next` that fit the active segment (rolling first
    /// when the first does not), syncs and verifies them, and answers them in `answers`.
    /// Always takes at least one append; an error means none of the run is durable.
    fn write_run(
        &self,
        w: &mut Writer,
        group: &mut [Queued],
        next: &mut usize,
        config: &LogConfig,
        answers: &mut Vec<Result<Appended, LogError>>,
    ) -> Result<(), LogError> {
        let first = *next;
        let first_len = group[first].frame.len() as u64;
        if w.roll_due || (w.active_len > 0 && w.active_len + first_len > config.segment_bytes) {
            self.roll(w)?;
        }
        let start = w.active_len;
        let (mut pos, mut offset, mut newest) = (start, w.next_offset, w.newest_committed_at_ms);
        let mut run = Vec::new();
        let mut end = first;
        while end < group.len() {
            let q = &mut group[end];
            let len = q.frame.len() as u64;
            if end > first && pos + len > config.segment_bytes {
                break;
            }
            let committed_at_ms = q.stamp.max(newest);
            crate::log::format::seal(&mut q.frame, q.body_crc, offset, committed_at_ms);
            if let Err(e) = w.active.write_all_at(&q.frame, pos) {
                return Err(self.recover_after_failure(w, e));
            }
            run.push((
                Appended {
                    base_offset: offset,
                    count: q.count,
                    committed_at_ms,
                },
                pos,
            ));
            pos += len;
            offset += u64::from(q.count);
            newest = committed_at_ms;
            end += 1;
        }
        let frames: Vec<&[u8]> = group[first..end].iter().map(|q| &q.frame[..]).collect();
        let mut scratch = self.verify_buffers.take();
        let synced = sync_verified(w.active.as_ref(), &frames, start, &mut scratch);
        self.verify_buffers.give(scratch);
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = synced {
            return Err(self.recover_after_failure(w, e));
        }
        w.active_len = pos;
        w.next_offset = offset;
        w.newest_committed_at_ms = newest;
        {
            let mut v = write(&self.view);
            if let Some(seg) = v.segments.last_mut() {
                seg.len = w.active_len;
                seg.next_offset = w.next_offset;
                seg.newest_committed_at_ms = Some(newest);
                for (appended, at) in &run {
                    seg.index.note(appended.base_offset, *at);
                }
            }
            v.next_offset = w.next_offset;
        }
        answers.extend(run.into_iter().map(|(a, _)| Ok(a)));
        *next = end;
        Ok(())
    }

    /// Starts a new segment at the next offset. The directory is synced before the segment is
    /// used or named anywhere else. After a failure the next append must roll again (the
    /// file may exist, empty, with an entry a crash can keep): a smaller batch that would fit
    /// the old segment must not go there, or this file's name would claim offsets the old
    /// segment holds, and the next open would find the two overlapping and quarantine the
    /// partition.
    fn roll(&self, w: &mut Writer) -> Result<(), LogError> {
        let base = w.next_offset;
        w.roll_due = true;
        let file: Arc<dyn File> = Arc::from(
            create_segment(self.fs.as_ref(), &self.dir, base).map_err(|e| {
                LogError::io(
                    format!(
                        "starting segment {} in {}",
                        segment::segment_name(base),
                        self.dir.display()
                    ),
                    e,
                )
            })?,
        );
        w.active = file.clone();
        w.active_base = base;
        w.active_len = 0;
        w.roll_due = false;
        write(&self.view).segments.push(SegView {
            base,
            path: self.dir.join(segment::segment_name(base)),
            file,
            len: 0,
            next_offset: base,
            newest_committed_at_ms: None,
            index: SparseIndex::default(),
        });
        Ok(())
    }

    /// Checks from the device (the caller dropped the cache) that the active segment's frames
    /// from its last index entry run, intact and without gaps, exactly to the durable length
    /// and the next offset: the bytes a failed writeback could have touched are the last page
    /// or so, and this covers at least the last frame and the last index interval.
    fn verify_durable_tail(&self, w: &Writer, file: &dyn File) -> Result<(), TailCheck> {
        let entry = crate::log::read(&self.view)
            .segments
            .last()
            .and_then(|s| s.index.last_entry());
        let Some((mut expected, from)) = entry else {
            // No frame in the segment: nothing acknowledged lives in it.
            return Ok(());
        };
        let mut scanner = Scanner::new(file, from, w.active_len);
        loop {
            match scanner.next_frame().map_err(TailCheck::Io)? {
                Scan::End => break,
                Scan::Frame { header, .. } if header.base_offset == expected => {
                    expected = header.next_offset();
                }
                Scan::Frame { pos, header, .. } => {
                    return Err(TailCheck::Lost(DeviceLoss::WrongFrame {
                        position: pos,
                        base_offset: header.base_offset,
                        expected,
                    }));
                }
                Scan::Bad { pos, error } => {
                    return Err(TailCheck::Lost(DeviceLoss::BadFrame {
                        position: pos,
                        error,
                    }));
                }
                Scan::Skipped { .. } | Scan::Stopped { .. } => {}
            }
        }
        if expected != w.next_offset {
            return Err(TailCheck::Lost(DeviceLoss::Short {
                device_end: expected,
                acknowledged: w.next_offset,
            }));
        }
        Ok(())
    }

    /// After a failed write, sync or verify: reopen the active segment, truncate it back to
    /// its durable length and sync, on a fresh handle, then check the durable tail from the
    /// device. Returns the error for the caller.
    fn recover_after_failure(&self, w: &mut Writer, err: std::io::Error) -> LogError {
        let path = self.active_path(w);
        let context = format!("appending to {}", path.display());
        let attempt = (|| -> std::io::Result<Arc<dyn File>> {
            let file = self.fs.open(&path, OpenMode::ReadWrite)?;
            file.set_len(w.active_len)?;
            file.sync_data()?;
            file.drop_cache()?;
            Ok(Arc::from(file))
        })();
        let attempt = attempt.map_err(TailCheck::Io).and_then(|file| {
            self.verify_durable_tail(w, file.as_ref())?;
            Ok(file)
        });
        match attempt {
            Err(TailCheck::Lost(loss)) => {
                let reason = Damage::LostOnDevice {
                    segment: path.clone(),
                    append_error: err.into(),
                    loss,
                };
                tracing::error!(segment = %path.display(), %reason, "acknowledged records lost on the device");
                w.failed = Some(Stopped::Damaged(reason.clone()));
                LogError::Corrupt(reason)
            }
            Ok(file) => {
                tracing::warn!(segment = %path.display(), durable_len = w.active_len, error = %err,
                    "append failed; truncated back to the durable length on a fresh handle");
                w.active = file.clone();
                if let Some(seg) = write(&self.view).segments.last_mut() {
                    seg.file = file;
                }
                LogError::io(context, err)
            }
            Err(TailCheck::Io(e2)) => {
                let reason = Failure::UndoFailed {
                    segment: path.clone(),
                    durable_len: w.active_len,
                    append_error: err.into(),
                    recovery_error: e2.into(),
                };
                tracing::error!(segment = %path.display(), %reason, "partition log stopped");
                w.failed = Some(Stopped::Failed(reason.clone()));
                LogError::Failed(reason)
            }
        }
    }

    /// Rewrites the high-watermark file with the current durable end.
    fn write_hwm(&self, w: &mut Writer, clean: bool) -> std::io::Result<()> {
        let rec = HwmRecord {
            segment_base: w.active_base,
            segment_pos: w.active_len,
            next_offset: w.next_offset,
            newest_committed_at_ms: w.newest_committed_at_ms,
            clean,
        };
        let file = match w.hwm_file.take() {
            Some(f) => f,
            None => open_hwm_file(self.fs.as_ref(), &self.dir)?,
        };
        hwm::write(file.as_ref(), &rec)?;
        // Kept only after success: a handle whose write or sync failed is never trusted again.
        w.hwm_file = Some(file);
        Ok(())
    }

    /// Closes the log: later appends get `Closed`; the high-watermark file is written with the
    /// clean flag so a closed log can be described exactly without opening it.
    pub(crate) fn close(&self) -> Result<(), crate::error::StorageError> {
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        if w.closed {
            return Ok(());
        }
        w.closed = true;
        if w.failed.is_some() {
            return Ok(());
        }
        self.write_hwm(w, true).map_err(|e| {
            crate::error::StorageError::io(
                format!("writing the high-watermark file in {}", self.dir.display()),
                e,
            )
        })
    }

    /// Where a log closed cleanly ends: `None` while it is open or when it failed. Nothing
    /// appends to a closed log, so this stays its end for as long as its files are untouched.
    pub(crate) fn clean_end(&self) -> Option<CleanEnd> {
        let w = lock(&self.writer);
        (w.closed && w.failed.is_none()).then(|| CleanEnd {
            segment: self.dir.join(segment::segment_name(w.active_base)),
            segment_len: w.active_len,
            next_offset: w.next_offset,
        })
    }

    /// Marks the log closed without touching its files (its directory is being deleted).
    pub(crate) fn abandon(&self) {
        lock(&self.writer).closed = true;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;
    use crate::fs::RealFs;

    /// Frames of a group larger than one read-back piece, with boundaries that fall inside
    /// pieces: `(frames, file)` with the frames written one after another from byte 0.
    fn written_group(dir: &Path) -> (Vec<Vec<u8>>, Box<dyn File>) {
        let sizes = [700_001usize, 3 * VERIFY_CHUNK_BYTES / 2, 13, 900_000];
        let frames: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 31 + i * 7) as u8).collect())
            .collect();
        let file = RealFs
            .open(&dir.join("segment"), OpenMode::CreateNew)
            .unwrap();
        let mut pos = 0u64;
        for frame in &frames {
            file.write_all_at(frame, pos).unwrap();
            pos += frame.len() as u64;
        }
        (frames, file)
    }

    #[test]
    fn a_group_read_back_in_several_pieces_passes_when_the_device_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let (frames, file) = written_group(dir.path());
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let mut scratch = Vec::new();
        sync_verified(file.as_ref(), &refs, 0, &mut scratch).unwrap();
    }

    #[test]
    fn one_byte_differing_anywhere_in_a_group_fails_its_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (frames, file) = written_group(dir.path());
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let total: usize = frames.iter().map(Vec::len).sum();
        // First and last bytes, both sides of each frame boundary, and a piece boundary.
        let mut at = vec![0, total - 1, VERIFY_CHUNK_BYTES, total / 2];
        let mut end = 0;
        for frame in &frames {
            end += frame.len();
            at.extend([end - 1, end.min(total - 1)]);
        }
        let mut scratch = Vec::new();
        for pos in at {
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, pos as u64).unwrap();
            file.write_all_at(&[byte[0] ^ 0x40], pos as u64).unwrap();
            let err = sync_verified(file.as_ref(), &refs, 0, &mut scratch).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "byte {pos}");
            file.write_all_at(&byte, pos as u64).unwrap();
        }
        sync_verified(file.as_ref(), &refs, 0, &mut scratch).unwrap();
    }
}
