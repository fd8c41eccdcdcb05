//! Step 1 of a slab, read: long-poll the parent, then fill or linger.
//!
//! A read either brings records (in offset order from the cursor's position) or says why
//! there are none: nothing new, the next record is not due (delay children), or the position
//! aged out of the parent. A position past the parent's end is the storage error
//! [`StorageError::OffsetBeyondEnd`], which the cursor answers by moving back
//! ([`super::advance`]).

use std::sync::Arc;

use narad_storage::{PartitionId, ReadOptions, ReadResult, StorageError, Store, StoredRecord};
use tokio::time::Instant;

use super::{FanoutTiming, SLAB_MAX_BYTES, SLAB_MAX_RECORDS};
use crate::blocking::BlockingError;

/// Why a slab read failed; the cursor stalls with this text and reads again later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SlabError {
    /// The parent partition could not be read (or waited on).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The read task on the blocking pool did not return.
    #[error("slab read task failed: {0}")]
    Task(#[from] BlockingError),
}

/// The outcome of one slab read.
#[derive(Debug)]
pub(crate) enum SlabRead {
    /// Records to copy, in offset order starting at the requested offset.
    Records {
        /// The records.
        records: Vec<StoredRecord>,
        /// The parent's high watermark as of the last read.
        high_watermark: u64,
    },
    /// No records to copy now, and why.
    Nothing(NoRecords),
}

/// Why a slab read brought no records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRecords {
    /// Nothing new arrived within the long-poll.
    Idle {
        /// The parent's high watermark.
        high_watermark: u64,
    },
    /// The record at the requested offset is not due yet (delay children only).
    NotDue {
        /// Its commit time: it is due once `now - delay` reaches this.
        committed_at_ms: i64,
        /// The parent's high watermark.
        high_watermark: u64,
    },
    /// The requested offset aged out of the parent: the oldest record left is at `log_start`.
    BelowLogStart {
        /// The parent's log start offset.
        log_start: u64,
    },
}

async fn read_blocking(
    store: &Arc<Store>,
    id: &PartitionId,
    opts: ReadOptions,
) -> Result<ReadResult, SlabError> {
    let (store, id) = (Arc::clone(store), id.clone());
    Ok(crate::blocking::run(move || store.read(&id, &opts)).await??)
}

/// The parent's end if the store knows it without a read ([`Store::known_high_watermark`]):
/// from memory for an open log and for a closed one checked in the last few seconds
/// ([`Store::recent_high_watermark`]), else on the blocking pool (a `stat`).
async fn known_high_watermark(store: &Arc<Store>, id: &PartitionId) -> Option<u64> {
    if let Some(high) = store.recent_high_watermark(id) {
        return Some(high);
    }
    let (store, id) = (Arc::clone(store), id.clone());
    crate::blocking::run(move || store.known_high_watermark(&id))
        .await
        .ok()
        .flatten()
}

/// Reads the next slab at `from`: long-polls up to `timing.slab_long_poll` for a first record,
/// then tops up to [`SLAB_MAX_RECORDS`] / [`SLAB_MAX_BYTES`] or until `timing.slab_linger`
/// passes. `gate` gives the delay gate (`now - delay`) at each read, `None` for a plain child.
pub(crate) async fn read_slab(
    store: &Arc<Store>,
    id: &PartitionId,
    from: u64,
    gate: &(dyn Fn() -> Option<i64> + Send + Sync),
    timing: &FanoutTiming,
) -> Result<SlabRead, SlabError> {
    let opts = |offset: u64, records: usize, bytes: usize| ReadOptions {
        offset,
        max_records: records,
        max_bytes: bytes,
        max_committed_at_ms: gate(),
    };
    // A caught-up cursor waits at once: a read first would find nothing, every second, for
    // every idle cursor, and would open its parent's log if it was closed (thousands of idle
    // cursors then evict each other's logs from the open-log limit, a write and a sync each).
    // The end is taken from memory for an open log, and for a log the store closed cleanly
    // from where it ended, after one `stat` of its last segment; a log whose end is not known
    // so (a segment changed while closed) is read, which opens it and finds its true end.
    if known_high_watermark(store, id).await == Some(from)
        && !store.wait_for_data(id, from, timing.slab_long_poll).await?
    {
        return Ok(SlabRead::Nothing(NoRecords::Idle {
            high_watermark: from,
        }));
    }
    // Check the position first: waiting on an offset that aged out would never wake.
    let first = match read_blocking(store, id, opts(from, SLAB_MAX_RECORDS, SLAB_MAX_BYTES)).await {
        Err(SlabError::Storage(StorageError::OffsetBelowLogStart { log_start, .. })) => {
            return Ok(SlabRead::Nothing(NoRecords::BelowLogStart { log_start }));
        }
        other => other?,
    };
    let first = if first.records.is_empty() && first.not_due.is_none() {
        if !store.wait_for_data(id, from, timing.slab_long_poll).await? {
            return Ok(SlabRead::Nothing(NoRecords::Idle {
                high_watermark: first.high_watermark,
            }));
        }
        match read_blocking(store, id, opts(from, SLAB_MAX_RECORDS, SLAB_MAX_BYTES)).await {
            Err(SlabError::Storage(StorageError::OffsetBelowLogStart { log_start, .. })) => {
                return Ok(SlabRead::Nothing(NoRecords::BelowLogStart { log_start }));
            }
            other => other?,
        }
    } else {
        first
    };
    if first.records.is_empty() {
        return Ok(SlabRead::Nothing(match first.not_due {
            Some(not_due) => NoRecords::NotDue {
                committed_at_ms: not_due.due_at_ms,
                high_watermark: first.high_watermark,
            },
            None => NoRecords::Idle {
                high_watermark: first.high_watermark,
            },
        }));
    }

    let mut high_watermark = first.high_watermark;
    // Only a slab short of records tops up, so only then are its bytes counted (a walk over
    // every record, which a full slab from a backlog does not need).
    let mut bytes: usize = match first.records.len() < SLAB_MAX_RECORDS {
        true => first.records.iter().map(StoredRecord::payload_bytes).sum(),
        false => 0,
    };
    let mut next = first.next_offset;
    let mut gated = first.not_due.is_some();
    let mut records = first.records;
    let linger_until = Instant::now() + timing.slab_linger;
    while !gated && records.len() < SLAB_MAX_RECORDS && bytes < SLAB_MAX_BYTES {
        let left = linger_until.saturating_duration_since(Instant::now());
        if left.is_zero() || !store.wait_for_data(id, next, left).await? {
            break;
        }
        let more = read_blocking(
            store,
            id,
            opts(
                next,
                SLAB_MAX_RECORDS - records.len(),
                SLAB_MAX_BYTES - bytes,
            ),
        )
        .await?;
        if more.records.is_empty() {
            break;
        }
        high_watermark = more.high_watermark;
        gated = more.not_due.is_some();
        next = more.next_offset;
        bytes += more
            .records
            .iter()
            .map(StoredRecord::payload_bytes)
            .sum::<usize>();
        records.extend(more.records);
    }
    Ok(SlabRead::Records {
        records,
        high_watermark,
    })
}
