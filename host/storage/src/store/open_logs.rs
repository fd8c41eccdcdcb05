//! Opening logs lazily (recovery runs then), the limit on logs open at once, and how a log
//! error changes a partition's slot.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::error::{Result, StorageError};
use crate::log::recovery::{self, OpenError};
use crate::log::{self, Log, LogError};
use crate::name::PartitionId;

use super::{Partition, Signal, Slot, Store};

impl Store {
    /// The open log of a partition, opening (and recovering) it if closed, or if it failed at
    /// least `failed_reopen_after` ago.
    pub(super) fn open_log(&self, p: &Partition) -> Result<Arc<Log>> {
        {
            let slot = log::read(&p.slot);
            if let Slot::Open(l) = &*slot {
                return Ok(l.clone());
            }
            if !self.may_reopen(&slot)
                && let Some(e) = p.broken_error(&slot)
            {
                return Err(e);
            }
        }
        let mut slot = log::write(&p.slot);
        if let Slot::Open(l) = &*slot {
            return Ok(l.clone());
        }
        let reopening = self.may_reopen(&slot);
        if reopening {
            // The same recovery a restart runs, for this partition alone: the log on disk is
            // scanned and cut back to its last intact frame. If the disk still fails, the
            // partition fails again (and waits again) or the open reports the I/O error.
            tracing::warn!(partition = %p.id, "reopening a failed partition");
            *slot = Slot::Closed;
        } else if let Some(e) = p.broken_error(&slot) {
            return Err(e);
        }
        // Whatever the open finds is the log's end from now on.
        *log::lock(&p.closed_end) = None;
        let opened = match recovery::open(self.fs.clone(), &p.dir, self.clock.as_ref()) {
            Ok(mut l) => {
                l.counters = Arc::clone(&self.append_counters);
                l.verify_buffers = Arc::clone(&self.verify_buffers);
                l.read_buffers = Arc::clone(&self.read_buffers);
                let l = Arc::new(l);
                *slot = Slot::Open(l.clone());
                let hw = l.high_watermark();
                if *p.signal.borrow() == Signal::Broken {
                    // A failed partition back in service (now, or after a reopen whose recovery
                    // hit an I/O error): waiters were told "broken" and may wait again.
                    p.signal.send_replace(Signal::Hw(hw));
                    tracing::info!(partition = %p.id, high_watermark = hw,
                        "failed partition reopened and serving");
                } else {
                    // The end the open found, also when it is below the one published before
                    // (a tail cut while the log was closed): waiters past it would otherwise
                    // wake at once, every time, for records that are not there.
                    p.signal.send_if_modified(|s| {
                        let stale = *s != Signal::Hw(hw);
                        if stale {
                            *s = Signal::Hw(hw);
                        }
                        stale
                    });
                }
                Ok(l)
            }
            Err(OpenError::Corrupt(reason)) => {
                tracing::error!(partition = %p.id, %reason, "partition quarantined");
                *slot = Slot::Quarantined(reason.clone());
                p.signal.send_replace(Signal::Broken);
                Err(StorageError::Quarantined {
                    id: p.id.clone(),
                    reason: Box::new(reason),
                })
            }
            Err(OpenError::Io(e)) => Err(self.log_error(p, e)),
        };
        drop(slot);
        if opened.is_ok() {
            self.keep_open_logs_within_limit(&p.id);
        }
        opened
    }

    /// Caps the logs open at once at `max` (each holds descriptors: its segment and
    /// high-watermark files). Opening one more closes the least recently used others, down to
    /// nine tenths of `max`, as idle closing would; they reopen on their next use. A request
    /// naming thousands of partitions then cannot take every descriptor the daemon has.
    pub fn limit_open_logs(&self, max: usize) {
        self.max_open_logs.store(max.max(1), Ordering::Relaxed);
    }

    /// After `opened` was opened: when the logs open could be over the limit, counts them and
    /// closes the least recently used (never `opened`) down to nine tenths of it.
    pub(super) fn keep_open_logs_within_limit(&self, opened: &PartitionId) {
        let max = self.max_open_logs.load(Ordering::Relaxed);
        if self.open_logs_bound.fetch_add(1, Ordering::Relaxed) < max {
            return;
        }
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        let mut open: Vec<(i64, Arc<Partition>)> = parts
            .into_iter()
            .filter(|p| &p.id != opened)
            .filter(|p| matches!(p.slot.try_read().as_deref(), Ok(Slot::Open(_))))
            .map(|p| (p.last_access_ms.load(Ordering::Relaxed), p))
            .collect();
        let target = (max / 10 * 9).max(1);
        // `opened` is open too.
        let counted = open.len() + 1;
        let excess = counted.saturating_sub(target);
        open.sort_by_key(|(at, _)| *at);
        let mut closed = 0;
        for (_, p) in open.into_iter().take(excess) {
            // A log busy right now is left open; the next pass finds it idle.
            let Ok(mut slot) = p.slot.try_write() else {
                continue;
            };
            if let Slot::Open(l) = &*slot {
                if let Err(e) = p.close_log(l) {
                    tracing::warn!(partition = %p.id, error = %e, "closing a log to stay within the open-log limit failed");
                }
                *slot = Slot::Closed;
                closed += 1;
            }
        }
        self.open_logs_bound
            .store(counted - closed, Ordering::Relaxed);
        if closed > 0 {
            tracing::debug!(
                closed,
                max,
                "closed the least recently used logs to stay within the open-log limit"
            );
        }
    }

    /// Whether `slot` is a failed partition whose wait before a reopen is over.
    pub(super) fn may_reopen(&self, slot: &Slot) -> bool {
        matches!(slot, Slot::Failed { since, .. } if since.elapsed() >= self.failed_reopen_after)
    }

    /// Turns a log error into the caller's error, moving the partition to `Quarantined` or
    /// `Failed` when the error demands it.
    pub(super) fn log_error(&self, p: &Partition, e: LogError) -> StorageError {
        match e {
            LogError::Io(e) => e,
            LogError::BelowStart {
                requested,
                log_start,
            } => StorageError::OffsetBelowLogStart {
                id: p.id.clone(),
                requested,
                log_start,
            },
            LogError::BeyondEnd {
                requested,
                high_watermark,
            } => StorageError::OffsetBeyondEnd {
                id: p.id.clone(),
                requested,
                high_watermark,
            },
            LogError::Closed => StorageError::LogClosed { id: p.id.clone() },
            LogError::Corrupt(reason) => {
                tracing::error!(partition = %p.id, %reason, "partition quarantined");
                let mut slot = log::write(&p.slot);
                if let Slot::Open(l) = &*slot {
                    l.abandon();
                }
                *slot = Slot::Quarantined(reason.clone());
                p.signal.send_replace(Signal::Broken);
                StorageError::Quarantined {
                    id: p.id.clone(),
                    reason: Box::new(reason),
                }
            }
            LogError::Failed(reason) => {
                let mut slot = log::write(&p.slot);
                if let Slot::Open(l) = &*slot {
                    // Nobody may append through it again; a reopen builds a new log.
                    l.abandon();
                }
                *slot = Slot::Failed {
                    reason: reason.clone(),
                    since: Instant::now(),
                };
                p.signal.send_replace(Signal::Broken);
                StorageError::Failed {
                    id: p.id.clone(),
                    reason: Box::new(reason),
                }
            }
        }
    }
}
