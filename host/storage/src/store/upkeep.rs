//! Upkeep of every partition: retention, closing idle logs, and closing the store.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::Result;
use crate::log::retention::{self, Trimmed};
use crate::log::{self, LogError};
use crate::record::RetentionReport;

use super::{Partition, Slot, Store};

impl Store {
    /// Deletes whole segments past retention in every registered partition (age judged by a
    /// segment's newest commit time; the active segment is never deleted), advancing the log
    /// start offset. Closed logs are trimmed from their directory without being opened.
    /// Quarantined and failed partitions are left alone. Returns what was deleted; the first
    /// error is returned after every partition has been tried.
    pub fn enforce_retention(&self) -> Result<RetentionReport> {
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let now = self.clock.now_ms();
        let mut report = RetentionReport::default();
        let mut first_error = None;
        for p in parts {
            let config = p.config();
            if config.retention_ms.is_none() && config.retention_bytes.is_none() {
                continue;
            }
            let outcome: std::result::Result<Trimmed, LogError> = {
                let slot = log::read(&p.slot);
                match &*slot {
                    Slot::Open(l) => l.enforce_retention(&config, now),
                    Slot::Closed => {
                        retention::enforce_closed(self.fs.as_ref(), &p.dir, &config, now)
                    }
                    _ => Ok(Trimmed::default()),
                }
            };
            match outcome {
                Ok(t) => {
                    report.segments_deleted += t.segments;
                    report.bytes_deleted += t.bytes;
                    if let Some(start) = t.new_log_start {
                        report.advanced.push((p.id.clone(), start));
                    }
                }
                Err(e) => {
                    let e = self.log_error(&p, e);
                    tracing::warn!(partition = %p.id, error = %e, "retention failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Closes logs not read or appended for longer than `idle_close_after` (writing their
    /// high-watermark files); they reopen on demand. Returns how many were closed.
    pub fn close_idle(&self) -> usize {
        let now = self.clock.now_ms();
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let mut closed = 0;
        for p in parts {
            let idle_for = now.saturating_sub(p.last_access_ms.load(Ordering::Relaxed));
            if idle_for <= self.idle_close_after_ms {
                continue;
            }
            let mut slot = log::write(&p.slot);
            if let Slot::Open(l) = &*slot {
                if let Err(e) = p.close_log(l) {
                    tracing::warn!(partition = %p.id, error = %e, "closing an idle log failed");
                }
                *slot = Slot::Closed;
                closed += 1;
            }
        }
        closed
    }

    /// Clean shutdown: closes every open log, writing each high-watermark file with the clean
    /// flag. Returns the first error after trying all of them.
    pub fn close(&self) -> Result<()> {
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let mut first_error = None;
        for p in parts {
            let mut slot = log::write(&p.slot);
            if let Slot::Open(l) = &*slot {
                if let Err(e) = p.close_log(l) {
                    first_error.get_or_insert(e);
                }
                *slot = Slot::Closed;
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
