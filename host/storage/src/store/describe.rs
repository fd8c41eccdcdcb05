//! What a partition holds, told without opening a closed log where its files say it exactly.

use crate::damage::Damage;
use crate::error::{Result, StorageError};
use crate::log::start::{self, Head};
use crate::log::{self, hwm, segment, torn};
use crate::name::PartitionId;
use crate::record::{PartitionState, PartitionStats, ReadOptions};

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Partition, Signal, Slot, Store, io};

/// How long a closed log's end, found unchanged by a `stat` of its last segment, is trusted
/// without another ([`Store::recent_high_watermark`]). Nothing of the store appends to a closed
/// log (an append opens it first), so only a change made behind the store's back (a repair, a
/// damaged disk) is seen this much later than at the next `stat`.
pub const CLOSED_END_RECHECK: Duration = Duration::from_secs(10);

impl Store {
    /// The partition's committed high watermark now: from [`Store::peek`] when that knows it
    /// (an open log, or a cleanly closed one), else by opening the log (a closed log whose
    /// high-watermark file does not cover its records, after a crash). A quarantined or failed
    /// partition is an error, as for a read (which reopens a failed one whose wait is over).
    pub fn high_watermark(&self, id: &PartitionId) -> Result<u64> {
        let stats = self.peek(id)?;
        match (stats.state, stats.high_watermark) {
            (PartitionState::Quarantined { reason }, _) => Err(StorageError::Quarantined {
                id: id.clone(),
                reason: Box::new(reason),
            }),
            // A failed partition has no known end: the read below reopens it if its wait is
            // over, or reports it failed.
            (_, Some(high)) => Ok(high),
            (_, None) => {
                let opts = ReadOptions {
                    offset: stats.log_start_offset,
                    max_records: 1,
                    max_bytes: 1,
                    max_committed_at_ms: None,
                };
                match self.read(id, &opts) {
                    Ok(read) => Ok(read.high_watermark),
                    // Retention moved the start between the peek and the read: opening the log
                    // made the peek exact.
                    Err(StorageError::OffsetBelowLogStart { .. }) => self
                        .peek(id)?
                        .high_watermark
                        .ok_or_else(|| StorageError::HighWatermarkUnknown { id: id.clone() }),
                    Err(other) => Err(other),
                }
            }
        }
    }

    /// Describes a partition without opening a closed log and without stamping last access.
    /// A closed log is described from its directory: exact when it was closed cleanly,
    /// `high_watermark: None` when its high-watermark file does not cover the record bytes.
    /// Its log start is the one the log-start file records, never merely the oldest segment
    /// file; a closed log whose oldest segments are missing is quarantined here, as opening
    /// it would. `recovered_cut` summarises the torn tails kept aside in its `torn/` directory.
    pub fn peek(&self, id: &PartitionId) -> Result<PartitionStats> {
        let p = self.partition(id)?;
        self.peek_partition(&p)
    }

    /// The high watermark of a partition whose log is open, from memory; `None` when it is
    /// not open (or not registered). No file is read: a caller asking for thousands of
    /// partitions every second (the reconciler's lag refresh) pays no I/O for closed logs,
    /// which nothing appends to until they are opened again.
    pub fn open_high_watermark(&self, id: &PartitionId) -> Option<u64> {
        let p = self.partition(id).ok()?;
        let slot = log::read(&p.slot);
        match &*slot {
            Slot::Open(l) => Some(l.high_watermark()),
            _ => None,
        }
    }

    /// The high watermark of a partition when it is known without opening or reading its log:
    /// an open log's, from memory ([`Store::open_high_watermark`]); a log this store closed
    /// cleanly, where it ended, provided its last segment still has the length it closed with
    /// (one `stat`). `None` otherwise: a log not closed by this store (a restart, a crash), one
    /// whose last segment changed while it was closed (a repair, a damaged disk: a read, which
    /// opens the log, finds its end), a broken or an unregistered partition. Nothing appends to
    /// a closed log, so an idle reader can wait on this end instead of reading to learn it,
    /// and thousands of idle readers keep no log open.
    pub fn known_high_watermark(&self, id: &PartitionId) -> Option<u64> {
        let p = self.partition(id).ok()?;
        // Held across the `stat`, so the log cannot be opened (or appended to) meanwhile.
        let slot = log::read(&p.slot);
        match &*slot {
            Slot::Open(l) => Some(l.stats().high_watermark),
            Slot::Closed => {
                let end = log::lock(&p.closed_end).clone()?;
                let holds = self
                    .fs
                    .metadata(&end.segment)
                    .is_ok_and(|now| now.len == end.segment_len && !now.is_dir);
                let checked = if holds { self.clock.now_ms() } else { i64::MIN };
                p.closed_end_checked_ms.store(checked, Ordering::Relaxed);
                holds.then_some(end.next_offset)
            }
            _ => None,
        }
    }

    /// The high watermark of a partition when it is known without any I/O: an open log's, or
    /// a cleanly closed log's whose last segment a `stat` ([`Store::known_high_watermark`])
    /// found unchanged within the last [`CLOSED_END_RECHECK`]. `None` when only that `stat`, or
    /// a read, can tell. For thousands of idle readers asking every second: a `stat` each,
    /// every second, on the blocking pool, cost more CPU than everything else they do.
    pub fn recent_high_watermark(&self, id: &PartitionId) -> Option<u64> {
        let p = self.partition(id).ok()?;
        let slot = log::read(&p.slot);
        match &*slot {
            Slot::Open(l) => Some(l.high_watermark()),
            Slot::Closed => {
                let checked = p.closed_end_checked_ms.load(Ordering::Relaxed);
                let recheck = i64::try_from(CLOSED_END_RECHECK.as_millis()).unwrap_or(i64::MAX);
                if checked == i64::MIN || self.clock.now_ms().saturating_sub(checked) >= recheck {
                    return None;
                }
                log::lock(&p.closed_end).as_ref().map(|end| end.next_offset)
            }
            _ => None,
        }
    }

    pub(super) fn peek_partition(&self, p: &Partition) -> Result<PartitionStats> {
        let slot = log::read(&p.slot);
        let state = match &*slot {
            Slot::Open(l) => {
                let s = l.stats();
                return Ok(PartitionStats {
                    log_start_offset: s.log_start,
                    high_watermark: Some(s.high_watermark),
                    size_bytes: s.size_bytes,
                    segment_count: s.segment_count,
                    state: PartitionState::Open,
                    recovered_cut: s.recovered_cut,
                });
            }
            Slot::Closed => PartitionState::Closed,
            Slot::Quarantined(r) => PartitionState::Quarantined { reason: r.clone() },
            Slot::Failed { reason, .. } => PartitionState::Failed {
                reason: reason.clone(),
            },
            Slot::Sealed(_) => PartitionState::Sealed,
            Slot::Deleted => return Err(StorageError::UnknownPartition { id: p.id.clone() }),
        };
        if let PartitionState::Quarantined {
            reason: Damage::DirectoryMissing { .. },
        } = &state
        {
            // Nothing to list: the reason says so.
            return Ok(PartitionStats {
                log_start_offset: 0,
                high_watermark: None,
                size_bytes: 0,
                segment_count: 0,
                state,
                recovered_cut: Default::default(),
            });
        }
        // Describing a closed log reads the directory listing and the 64-byte high-watermark
        // file; the slot's read lock keeps it from being opened meanwhile.
        let files = segment::list(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("listing {}", p.dir.display())))?;
        let h = hwm::read(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the high-watermark file of {}", p.id)))?;
        let recorded = start::read(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the log-start file of {}", p.id)))?;
        // The log start is what the log recorded, not whatever segment happens to be oldest:
        // a missing head is damage (the open would quarantine it, so peek does too), and
        // segments left below the recorded start by an interrupted step are already gone.
        let log_start_offset = match start::check_head(&p.dir, &files, recorded) {
            Head::Interrupted { start, .. } => start,
            Head::Damaged(reason) if matches!(state, PartitionState::Closed) => {
                drop(slot);
                self.quarantine_closed(p, reason);
                return self.peek_partition(p);
            }
            Head::Damaged(_) | Head::Agrees | Head::Unrecorded => match recorded {
                start::Recorded::Start(s) => s,
                _ => files.first().map_or(0, |f| f.base),
            },
        };
        let recovered_cut = torn::summary(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the kept-aside torn tails of {}", p.id)))?;
        let high_watermark = match (files.last(), h) {
            (None, None) => Some(0),
            (Some(last), Some(h))
                if h.clean && h.segment_base == last.base && h.segment_pos == last.len =>
            {
                Some(h.next_offset)
            }
            _ => None,
        };
        let healthy = matches!(state, PartitionState::Closed | PartitionState::Sealed);
        Ok(PartitionStats {
            log_start_offset,
            high_watermark: if healthy { high_watermark } else { None },
            size_bytes: files.iter().map(|f| f.len).sum(),
            segment_count: u32::try_from(files.len()).unwrap_or(u32::MAX),
            state,
            recovered_cut,
        })
    }

    /// Quarantines a closed partition whose directory shows damage (found by `peek` without
    /// opening the log); does nothing if the slot changed meanwhile.
    pub(super) fn quarantine_closed(&self, p: &Partition, reason: Damage) {
        let mut slot = log::write(&p.slot);
        if matches!(*slot, Slot::Closed) {
            tracing::error!(partition = %p.id, %reason, "partition quarantined");
            *slot = Slot::Quarantined(reason);
            p.signal.send_replace(Signal::Broken);
        }
    }
}
