//! The write path: append + `fdatasync` + verify under the produce lock, segment roll, the
//! lazy high-watermark update, failure handling and close.
//!
//! An `fdatasync` error is never retried on the same handle: Linux may already have dropped
//! the dirty pages and marked them clean, so a second sync could "succeed" without the data.
//! Instead the append fails, the active segment is reopened on a fresh handle, truncated back
//! to the last durable length and synced; if even that fails the log stops (`Failed`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::fs::{File, OpenMode};
use crate::log::hwm::{self, HwmRecord};
use crate::log::recovery::{create_segment, open_hwm_file};
use crate::log::segment::{self, SparseIndex};
use crate::log::{Log, LogError, SegView, Writer, lock, write};
use crate::record::{Appended, LogConfig};

/// How often the high-watermark file is rewritten while appends flow: at most once a second,
/// so its extra `fdatasync` costs at most one per second, and a crash leaves at most about a
/// second of log past the boundary to check with the torn-tail rules.
pub const HWM_UPDATE_INTERVAL: Duration = Duration::from_secs(1);

/// Size of each read-back piece when verifying an append: 256 KiB fits a typical L2 cache, so
/// the bytes copied in are still cached when they are compared.
const VERIFY_CHUNK_BYTES: usize = 256 * 1024;

fn write_synced_verified(
    file: &dyn File,
    frame: &[u8],
    pos: u64,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    file.write_all_at(frame, pos)?;
    file.sync_data()?;
    // Read back in pieces small enough to stay in the CPU cache between the copy and the
    // comparison, rather than through one buffer as large as the frame.
    scratch.resize(VERIFY_CHUNK_BYTES, 0);
    let mut done = 0;
    while done < frame.len() {
        let n = VERIFY_CHUNK_BYTES.min(frame.len() - done);
        file.read_exact_at(&mut scratch[..n], pos + done as u64)?;
        if scratch[..n] != frame[done..done + n] {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the bytes read back after fdatasync differ from the bytes written (at frame byte {done} or later)"
                ),
            ));
        }
        done += n;
    }
    Ok(())
}

impl Log {
    fn active_path(&self, w: &Writer) -> std::path::PathBuf {
        self.dir.join(segment::segment_name(w.active_base))
    }

    /// Appends one encoded frame (from `format::encode_batch`, with the body CRC it returned)
    /// holding `count` records. The
    /// commit time is read from `clock` just before the produce lock is taken and raised under
    /// it to the partition's newest commit time. Returns only once the frame is durable and
    /// read back intact.
    pub(crate) fn append(
        &self,
        frame: &mut [u8],
        body_crc: u32,
        count: u32,
        clock: &dyn Clock,
        config: &LogConfig,
        on_durable: impl FnOnce(u64),
    ) -> Result<Appended, LogError> {
        let stamp = clock.now_ms();
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        if w.closed {
            return Err(LogError::Closed);
        }
        if let Some(reason) = &w.failed {
            return Err(LogError::Failed(reason.clone()));
        }
        let committed_at_ms = stamp.max(w.newest_committed_at_ms);
        let len = frame.len() as u64;
        if w.active_len > 0 && w.active_len + len > config.segment_bytes {
            self.roll(w)?;
        }
        let base_offset = w.next_offset;
        crate::log::format::seal(frame, body_crc, base_offset, committed_at_ms);
        let pos = w.active_len;
        if let Err(e) = write_synced_verified(w.active.as_ref(), frame, pos, &mut w.scratch) {
            return Err(self.recover_after_failure(w, e));
        }
        w.active_len += len;
        w.next_offset += u64::from(count);
        w.newest_committed_at_ms = committed_at_ms;
        {
            let mut v = write(&self.view);
            if let Some(seg) = v.segments.last_mut() {
                seg.len = w.active_len;
                seg.next_offset = w.next_offset;
                seg.newest_committed_at_ms = Some(committed_at_ms);
                seg.index.note(base_offset, pos);
            }
            v.next_offset = w.next_offset;
        }
        on_durable(w.next_offset);
        if w.last_hwm_write.elapsed() >= HWM_UPDATE_INTERVAL {
            // The batch is already durable; a failure here only leaves the boundary older.
            if let Err(e) = self.write_hwm(w, false) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not update the high-watermark file");
            }
        }
        Ok(Appended {
            base_offset,
            count,
            committed_at_ms,
        })
    }

    /// Starts a new segment at the next offset. The directory is synced before the segment is
    /// used or named anywhere else.
    fn roll(&self, w: &mut Writer) -> Result<(), LogError> {
        let base = w.next_offset;
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

    /// After a failed write, sync or verify: reopen the active segment, truncate it back to
    /// its durable length and sync, on a fresh handle. Returns the error for the caller.
    fn recover_after_failure(&self, w: &mut Writer, err: std::io::Error) -> LogError {
        let path = self.active_path(w);
        let context = format!("appending to {}", path.display());
        let attempt = (|| -> std::io::Result<Arc<dyn File>> {
            let file = self.fs.open(&path, OpenMode::ReadWrite)?;
            file.set_len(w.active_len)?;
            file.sync_data()?;
            Ok(Arc::from(file))
        })();
        match attempt {
            Ok(file) => {
                tracing::warn!(segment = %path.display(), durable_len = w.active_len, error = %err,
                    "append failed; truncated back to the durable length on a fresh handle");
                w.active = file.clone();
                if let Some(seg) = write(&self.view).segments.last_mut() {
                    seg.file = file;
                }
                LogError::io(context, err)
            }
            Err(e2) => {
                let reason = format!(
                    "{context} failed ({err}), and truncating back to the durable length {} failed too ({e2})",
                    w.active_len
                );
                tracing::error!(segment = %path.display(), %reason, "partition log stopped");
                w.failed = Some(reason.clone());
                LogError::Failed(reason)
            }
        }
    }

    /// Rewrites the high-watermark file with the current durable end.
    fn write_hwm(&self, w: &mut Writer, clean: bool) -> std::io::Result<()> {
        w.last_hwm_write = Instant::now();
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
    pub(crate) fn close(&self) -> Result<(), LogError> {
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
            LogError::io(
                format!("writing the high-watermark file in {}", self.dir.display()),
                e,
            )
        })
    }

    /// Marks the log closed without touching its files (its directory is being deleted).
    pub(crate) fn abandon(&self) {
        lock(&self.writer).closed = true;
    }
}
