//! Reads, the producer scan of a partition's newest batches, and the long-poll for new records.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Result, StorageError};
use crate::log::{self, Log};
use crate::name::PartitionId;
use crate::record::{ReadOptions, ReadResult, StampedBatch};

use super::{Partition, Signal, Slot, Store};

impl Store {
    /// Reads records from `opts.offset` (see [`ReadOptions`]). Stamps last access; opens the
    /// log if closed. Below the log start: [`StorageError::OffsetBelowLogStart`]; past the high
    /// watermark: [`StorageError::OffsetBeyondEnd`]; at it: no records.
    pub fn read(&self, id: &PartitionId, opts: &ReadOptions) -> Result<ReadResult> {
        let p = self.partition(id)?;
        self.stamp(&p);
        let log = self.readable_log(&p)?;
        log.read(opts).map_err(|e| self.log_error(&p, e))
    }

    /// The log reads of `p` go to: the closed log a partition sealed for a move keeps serving
    /// reads from, else the open log (opened if closed).
    pub(super) fn readable_log(&self, p: &Partition) -> Result<Arc<Log>> {
        let sealed = match &*log::read(&p.slot) {
            Slot::Sealed(Some(l)) => Some(Arc::clone(l)),
            _ => None,
        };
        match sealed {
            Some(log) => Ok(log),
            None => self.open_log(p),
        }
    }

    /// The batches idempotent producers wrote ([`crate::EncodedBatch::encode_stamped`]) in
    /// about the last `max_bytes` of the partition, oldest first: what lets a restarted daemon
    /// know a producer's recent batches again. Opens the log if closed.
    pub fn producer_batches(&self, id: &PartitionId, max_bytes: u64) -> Result<Vec<StampedBatch>> {
        let p = self.partition(id)?;
        self.stamp(&p);
        let log = self.readable_log(&p)?;
        log.producer_batches(max_bytes)
            .map_err(|e| self.log_error(&p, e))
    }

    /// Resolves `Ok(true)` as soon as the high watermark is above `offset`, `Ok(false)` when
    /// `timeout` passes first. Woken by appends through a watch channel (no polling). Errors
    /// for unknown, deleted, quarantined or failed partitions (a failed one whose wait is over
    /// is reopened first). Stamps last access. A closed log
    /// is not opened if its high-watermark file gives the exact end; otherwise it is opened
    /// (blocking I/O, only after a crash).
    pub async fn wait_for_data(
        &self,
        id: &PartitionId,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool> {
        let p = self.partition(id)?;
        self.stamp(&p);
        let mut rx = p.signal.subscribe();
        let mut current = *rx.borrow_and_update();
        if current == Signal::Broken {
            // A failed partition whose wait is over is reopened here; any other broken
            // partition (or a failed one still waiting) returns its error.
            self.open_log(&p)?;
            current = *rx.borrow_and_update();
        }
        if current == Signal::Unknown {
            let hw = match self.peek_partition(&p)?.high_watermark {
                Some(hw) => hw,
                None => self.open_log(&p)?.high_watermark(),
            };
            p.publish_hw(hw);
        }
        let waited = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| matches!(s, Signal::Hw(hw) if *hw > offset) || *s == Signal::Broken),
        )
        .await;
        match waited {
            Err(_) => Ok(false),
            Ok(Err(_)) => Err(StorageError::UnknownPartition { id: id.clone() }),
            Ok(Ok(s)) if *s == Signal::Broken => {
                drop(s);
                let slot = log::read(&p.slot);
                Err(p
                    .broken_error(&slot)
                    .unwrap_or(StorageError::UnknownPartition { id: id.clone() }))
            }
            Ok(Ok(_)) => Ok(true),
        }
    }
}
