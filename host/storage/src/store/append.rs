//! Appends: one batch, encoded batches, batches in order across partitions, and the append
//! counters.

use std::sync::atomic::Ordering;

use crate::error::{Result, StorageError};
use crate::log::{self, LogError};
use crate::name::PartitionId;
use crate::record::{AppendBatch, Appended, EncodedBatch};

use super::{AppendStats, InOrderError, Store};

impl Store {
    /// Appends a batch: encode, then under the partition's produce lock write, `fdatasync` and
    /// read back; returns only once the batch is durable. The commit time is stamped just
    /// before the produce lock and raised under it to the partition's newest commit time, so
    /// it never decreases. Opens the log if closed. An empty batch is refused.
    pub fn append(&self, id: &PartitionId, batch: AppendBatch) -> Result<Appended> {
        let mut encoded = EncodedBatch::encode(&batch.records, batch.origin.as_ref())?;
        self.append_encoded(id, &mut encoded)
    }

    /// Appends, segment syncs and waiting appends of every partition since the store opened:
    /// how much appends arriving together share their `fdatasync`s.
    pub fn append_stats(&self) -> AppendStats {
        let c = &self.append_counters;
        AppendStats {
            appends: c.appends.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
        }
    }

    /// From now on (`on`), appends write only frames that builds from before null values and
    /// producer stamps read: a null value is written empty and a producer stamp is left out.
    /// For a cluster in a rolling upgrade, where a partition written here may move to a node
    /// still on the older build (docs/operator-guide.md, upgrades).
    pub fn write_original_frames(&self, on: bool) {
        self.original_frames.store(on, Ordering::Relaxed);
    }

    /// `batch` in the original frame layout when [`Store::write_original_frames`] is on.
    pub(super) fn in_original_layout(&self, batch: &mut EncodedBatch) -> Result<()> {
        if self.original_frames.load(Ordering::Relaxed) {
            batch.to_original_layout()?;
        }
        Ok(())
    }

    /// Appends a batch encoded by [`EncodedBatch::encode`], as [`Store::append`] does. On an
    /// error the batch is unchanged and may be appended again (a fan-out cursor's quick
    /// retries do), without encoding its records again.
    pub fn append_encoded(&self, id: &PartitionId, batch: &mut EncodedBatch) -> Result<Appended> {
        self.in_original_layout(batch)?;
        let p = self.partition(id)?;
        self.stamp(&p);
        let config = p.config();
        loop {
            let log = self.open_log(&p)?;
            match log.append(
                &mut batch.frame,
                batch.body_crc,
                batch.count,
                self.clock.as_ref(),
                &config,
                |hw| p.publish_hw(hw),
            ) {
                Ok(a) => return Ok(a),
                // Closed for idleness between lookup and lock: open again and retry.
                Err(LogError::Closed) => {
                    let slot = log::read(&p.slot);
                    if let Some(e) = p.broken_error(&slot) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(self.log_error(&p, e)),
            }
        }
    }

    /// Appends `batches` (each encoded by [`EncodedBatch::encode`]) in this order, as
    /// [`Store::append_encoded`] does each, but together: they share one `fdatasync` and one
    /// read-back (two when a segment roll falls between them). A batch is never durable
    /// unless every one before it is, so a later batch cannot land ahead of an earlier one
    /// that failed. `Ok` with one [`Appended`] per batch once all are durable; otherwise how
    /// many from the first are, and the error that stopped the rest (which are unchanged and
    /// may be appended again).
    pub fn append_encoded_in_order(
        &self,
        id: &PartitionId,
        batches: &mut [EncodedBatch],
    ) -> std::result::Result<Vec<Appended>, InOrderError> {
        let failed = |appended: Vec<Appended>, error: StorageError| InOrderError {
            durable: appended.len(),
            appended,
            error,
        };
        for batch in batches.iter_mut() {
            self.in_original_layout(batch)
                .map_err(|e| failed(Vec::new(), e))?;
        }
        let p = self.partition(id).map_err(|e| failed(Vec::new(), e))?;
        self.stamp(&p);
        let config = p.config();
        let mut appended = Vec::with_capacity(batches.len());
        while appended.len() < batches.len() {
            let log = match self.open_log(&p) {
                Ok(log) => log,
                Err(e) => return Err(failed(appended, e)),
            };
            let mut frames: Vec<log::writer::FrameToAppend<'_>> = batches[appended.len()..]
                .iter_mut()
                .map(|b| log::writer::FrameToAppend {
                    frame: &mut b.frame,
                    body_crc: b.body_crc,
                    count: b.count,
                })
                .collect();
            let answers = log.append_in_order(&mut frames, self.clock.as_ref(), &config, |hw| {
                p.publish_hw(hw)
            });
            for answer in answers {
                match answer {
                    Ok(a) => appended.push(a),
                    // Closed for idleness between lookup and lock (nothing of this call was
                    // written then): open again and go on from the first not appended.
                    Err(LogError::Closed) => {
                        let slot = log::read(&p.slot);
                        if let Some(e) = p.broken_error(&slot) {
                            drop(slot);
                            return Err(failed(appended, e));
                        }
                        break;
                    }
                    Err(e) => {
                        let e = self.log_error(&p, e);
                        return Err(failed(appended, e));
                    }
                }
            }
        }
        Ok(appended)
    }
}
