//! Re-creating, on a single node, a partition whose directory is gone (quarantined with
//! [`Damage::DirectoryMissing`] at start): the operator's way to accept the loss without
//! giving its offsets to new records.
//!
//! The rules are the cluster's re-creation (`operations::recreate`) on one node:
//!
//! - **Only a lost partition.** Anything else (a partition that serves, or one quarantined for
//!   damage inside its files) is refused: those keep records an operator can still save.
//! - **No offset reused where a copy of the old one lives.** The new, empty log starts one past
//!   the highest parent offset of this partition any child holds (read from the child
//!   partitions' tails, as a cursor reads them), or at the operator's `start_offset` if higher
//!   (the last high watermark seen, so consumers of the partition never meet an offset again).
//! - **The loss is counted.** Each link from the partition gets an offset file at the first
//!   offset its child does not hold (its attach point when the child holds nothing, or when
//!   it is a remote child, whose copies cannot be read here), and a gap ledger with the range
//!   up to the new start on record as `recreated`. Its cursor finds the offsets below the new
//!   start and counts them as dropped, under that reason.
//!
//! The log and the offset files are laid out in the staging area and installed together, then
//! registered: the cursors that stalled on the lost partition resume by themselves.

use std::sync::Arc;

use narad_storage::{Damage, PartitionId, PartitionState, StorageError, Store};

use super::recreate::{
    RecreateReport, feeding, install_empty, link_losses, new_start, resume_files,
};
use crate::blocking::BlockingError;
use crate::fanout::position::provenance::scan_child_tails_with_copies;
use crate::metastore::link::epoch_bytes;
use crate::metastore::{LinkMeta, Metastore, MetastoreError};

/// Why a lost partition was not re-created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RecreateLostError {
    /// The topic or partition is not recorded.
    #[error("{partition} is not a recorded partition")]
    Unknown {
        /// The partition asked for.
        partition: PartitionId,
    },
    /// The partition's directory is not gone.
    #[error(
        "{partition} is {state}: only a partition whose directory is gone is re-created \
         (narad topic describe shows why a partition is quarantined; docs/storage.md says how \
         to repair one)"
    )]
    NotLost {
        /// The partition.
        partition: PartitionId,
        /// What it is instead.
        state: String,
    },
    /// Reading the metadata failed.
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// Reading a child or laying the new log out failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A link's attach epoch or an offset file could not be encoded.
    #[error("link to {child}: {reason}")]
    Link {
        /// The child topic.
        child: String,
        /// What went wrong.
        reason: String,
    },
    /// The blocking task failed.
    #[error(transparent)]
    Task(#[from] BlockingError),
}

/// Re-creates `topic`/`partition` (lost: its directory is gone) empty on this node, at or
/// above `start_offset`, with segments of `segment_bytes`, and reports what each link from it
/// lost.
pub(crate) async fn recreate_lost(
    store: &Arc<Store>,
    metastore: &Arc<dyn Metastore>,
    segment_bytes: u64,
    node: &str,
    topic: &str,
    partition: u32,
    start_offset: Option<u64>,
) -> Result<RecreateReport, RecreateLostError> {
    let id = PartitionId::new(topic.to_owned(), partition);
    let snapshot = metastore.snapshot().await?;
    let meta = snapshot
        .topics
        .get(topic)
        .filter(|t| partition < t.partitions)
        .ok_or_else(|| RecreateLostError::Unknown {
            partition: id.clone(),
        })?;
    let (peek_store, peek_id) = (Arc::clone(store), id.clone());
    let state = crate::blocking::run(move || peek_store.peek(&peek_id))
        .await??
        .state;
    if !matches!(
        &state,
        PartitionState::Quarantined {
            reason: Damage::DirectoryMissing { .. }
        }
    ) {
        return Err(RecreateLostError::NotLost {
            partition: id,
            state: describe(&state),
        });
    }

    let links: Vec<LinkMeta> = snapshot
        .links
        .values()
        .filter(|l| l.parent == topic)
        .cloned()
        .collect();
    let mut held = Vec::with_capacity(links.len());
    for link in &links {
        held.push(highest_held(store, &snapshot, link, partition).await?);
    }
    let start = new_start(&held, start_offset);
    let losses = link_losses(&links, &held, partition, start);
    let files = resume_files(
        &links,
        &losses,
        start,
        None,
        narad_storage::Clock::now_ms(&narad_storage::SystemClock),
    )
    .map_err(|(child, reason)| RecreateLostError::Link { child, reason })?;

    let config = crate::topics::log_config(meta, segment_bytes);
    let (lay_store, lay_id) = (Arc::clone(store), id.clone());
    crate::blocking::run(move || {
        install_empty(&lay_store, &lay_id, start, &files)?;
        // The quarantined registration goes; the new one finds the directory in place.
        lay_store.forget_partition(&lay_id);
        lay_store.create_partition(&lay_id, config)
    })
    .await??;

    let fed_by = feeding(&snapshot, topic);
    tracing::warn!(partition = %id, start_offset = start,
        dropped_at_most = losses.iter().map(|l| l.dropped_at_most).sum::<u64>(),
        fed_by = ?fed_by,
        "lost partition re-created empty: the records its directory held are gone");
    Ok(RecreateReport {
        topic: topic.to_owned(),
        partition,
        from: node.to_owned(),
        to: node.to_owned(),
        generation: 0,
        start_offset: start,
        links: losses,
        fed_by,
    })
}

/// The highest parent offset of `partition` that `link`'s child holds in its partitions'
/// tails (`None` for a remote child, or a child that holds none).
async fn highest_held(
    store: &Arc<Store>,
    snapshot: &crate::metastore::Snapshot,
    link: &LinkMeta,
    partition: u32,
) -> Result<Option<u64>, RecreateLostError> {
    if link.remote.is_some() {
        return Ok(None);
    }
    let Some(child) = snapshot.topics.get(&link.child) else {
        return Ok(None);
    };
    let epoch = epoch_bytes(&link.attach_epoch).map_err(|e| RecreateLostError::Link {
        child: link.child.clone(),
        reason: e.to_string(),
    })?;
    let (scan_store, name) = (Arc::clone(store), link.child.clone());
    let partitions: Vec<u32> = (0..child.partitions).collect();
    let (scan, _) = crate::blocking::run(move || {
        scan_child_tails_with_copies(&scan_store, &name, &partitions, epoch, partition)
    })
    .await??;
    Ok(scan.evidence.map(|e| e.highest_parent_offset))
}

fn describe(state: &PartitionState) -> String {
    match state {
        PartitionState::Open | PartitionState::Closed => "serving".to_owned(),
        PartitionState::Quarantined { reason } => format!("quarantined ({reason})"),
        PartitionState::Failed { reason } => format!("failed ({reason})"),
        PartitionState::Sealed => "sealed for a move".to_owned(),
    }
}
