//! Reading a slab from the parent: long-poll, then fill or linger.

use std::sync::Arc;
use std::time::Duration;

use narad_storage::{PartitionId, ReadOptions, ReadResult, StorageError, Store, StoredRecord};
use tokio::time::Instant;

use super::{SLAB_LINGER, SLAB_LONG_POLL, SLAB_MAX_BYTES, SLAB_MAX_RECORDS};

/// The outcome of one slab read.
#[derive(Debug)]
pub enum SlabRead {
    /// Records to copy, in offset order starting at the requested offset.
    Records {
        /// The records.
        records: Vec<StoredRecord>,
        /// The parent's high watermark as of the last read.
        high_watermark: u64,
    },
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
) -> Result<ReadResult, StorageError> {
    let store = Arc::clone(store);
    let id = id.clone();
    match tokio::task::spawn_blocking(move || store.read(&id, &opts)).await {
        Ok(result) => result,
        Err(join) => Err(StorageError::Io {
            context: format!("slab read task failed: {join}"),
            source: std::io::Error::other(join.to_string()),
        }),
    }
}

/// Reads the next slab at `from`: long-polls up to [`SLAB_LONG_POLL`] for a first record,
/// then tops up to [`SLAB_MAX_RECORDS`] / [`SLAB_MAX_BYTES`] or until [`SLAB_LINGER`] passes.
/// `gate` gives the delay gate (`now - delay`) at each read, `None` for a plain child.
pub async fn read_slab(
    store: &Arc<Store>,
    id: &PartitionId,
    from: u64,
    gate: &(dyn Fn() -> Option<i64> + Send + Sync),
) -> Result<SlabRead, StorageError> {
    read_slab_with(store, id, from, gate, SLAB_LONG_POLL).await
}

/// [`read_slab`] with an explicit long-poll (tests use a short one).
pub async fn read_slab_with(
    store: &Arc<Store>,
    id: &PartitionId,
    from: u64,
    gate: &(dyn Fn() -> Option<i64> + Send + Sync),
    long_poll: Duration,
) -> Result<SlabRead, StorageError> {
    let opts = |offset: u64, records: usize, bytes: usize| ReadOptions {
        offset,
        max_records: records,
        max_bytes: bytes,
        max_committed_at_ms: gate(),
    };
    // Check the position first: waiting on an offset that aged out would never wake.
    let first = match read_blocking(store, id, opts(from, SLAB_MAX_RECORDS, SLAB_MAX_BYTES)).await {
        Err(StorageError::OffsetBelowLogStart { log_start, .. }) => {
            return Ok(SlabRead::BelowLogStart { log_start });
        }
        other => other?,
    };
    let first = if first.records.is_empty() && first.not_due.is_none() {
        if !store.wait_for_data(id, from, long_poll).await? {
            return Ok(SlabRead::Idle {
                high_watermark: first.high_watermark,
            });
        }
        match read_blocking(store, id, opts(from, SLAB_MAX_RECORDS, SLAB_MAX_BYTES)).await {
            Err(StorageError::OffsetBelowLogStart { log_start, .. }) => {
                return Ok(SlabRead::BelowLogStart { log_start });
            }
            other => other?,
        }
    } else {
        first
    };
    if first.records.is_empty() {
        return Ok(match first.not_due {
            Some(not_due) => SlabRead::NotDue {
                committed_at_ms: not_due.due_at_ms,
                high_watermark: first.high_watermark,
            },
            None => SlabRead::Idle {
                high_watermark: first.high_watermark,
            },
        });
    }

    let mut high_watermark = first.high_watermark;
    let mut bytes: usize = first.records.iter().map(StoredRecord::payload_bytes).sum();
    let mut next = first.next_offset;
    let mut gated = first.not_due.is_some();
    let mut records = first.records;
    let linger_until = Instant::now() + SLAB_LINGER;
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
