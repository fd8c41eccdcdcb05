//! One node's part of a start: the data directory, its store and its metastore file.

use std::time::Duration;

use narad_storage::{PartitionId, Store, StoreOptions};

use super::ServerError;
use crate::metastore::FileMetastore;
use crate::topics::{log_config, startup};

/// Opens the store (taking the data-dir lock first, so a second daemon stops before reading
/// anything) and the metastore, accounts for every directory of `topics/` (finishing or
/// undoing interrupted changes from their intent records, setting aside what nothing explains,
/// refusing a lost metastore: [`crate::topics::startup`]), then registers every partition the
/// metastore names (quarantining one whose directory is gone).
pub(super) fn open_data_dir(
    data_dir: &std::path::Path,
    idle_close_after: Duration,
    failed_reopen_after: Duration,
    segment_bytes: u64,
) -> Result<(Store, FileMetastore), ServerError> {
    // One file system for the store and the start-up accounting of its directories.
    let fs = crate::durable::real();
    let store = Store::open(
        data_dir,
        StoreOptions {
            fs: std::sync::Arc::clone(&fs),
            idle_close_after,
            failed_reopen_after,
            ..StoreOptions::default()
        },
    )?;
    let metastore = FileMetastore::open(data_dir)?;
    let snapshot = metastore.snapshot_now();
    let report = startup::reconcile(
        &*fs,
        &store,
        &snapshot.topics,
        metastore.started_empty(),
        crate::topics::now_ms(),
    )?;
    if !report.set_aside.is_empty() {
        tracing::warn!(
            entries = report.set_aside.len(),
            "directories were set aside at start; see `narad admin set-aside list`"
        );
    }
    for topic in snapshot.topics.values() {
        let config = log_config(topic, segment_bytes);
        for p in 0..topic.partitions {
            // Recorded, so its directory was made: one that is gone is quarantined, not
            // made again empty (its offsets would go to new records).
            store.register_partition(&PartitionId::new(topic.name.clone(), p), config.clone())?;
        }
    }
    Ok((store, metastore))
}
