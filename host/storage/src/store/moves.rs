//! A partition on its way to another node: sealing, the manifest and files a move copies,
//! staging and removal (see [`crate::transfer`]).

use std::sync::Arc;

use crate::error::{Result, StorageError};
use crate::log::{self, hwm};
use crate::name::{PartitionId, validate_topic_name};
use crate::transfer::{self, Manifest, Staging};

use super::{Partition, Signal, Slot, Store, io};

impl Store {
    /// Seals `id` for a move to another node: its log is closed cleanly (opened and recovered
    /// first if it was closed after a crash, so the high-watermark file is exact), an append in
    /// flight finishes first, and from then on appends get [`StorageError::Sealed`] and
    /// long-polls on it end, while reads go on from the closed log. Idempotent. A quarantined or failed
    /// partition cannot be sealed (it could not be copied faithfully): its error is returned.
    pub fn seal(&self, id: &PartitionId) -> Result<()> {
        let p = self.partition(id)?;
        if matches!(*log::read(&p.slot), Slot::Sealed(_)) {
            return Ok(());
        }
        // Recovery runs on open: a log left by a crash gets an exact end before it is closed.
        let opened = self.open_log(&p)?;
        let mut slot = log::write(&p.slot);
        let kept = match &*slot {
            Slot::Sealed(_) => return Ok(()),
            Slot::Open(l) => {
                l.close()?;
                Arc::clone(l)
            }
            // Closed for idleness in between: that close wrote the same clean end.
            Slot::Closed => opened,
            other => {
                return Err(p
                    .broken_error(other)
                    .unwrap_or(StorageError::LogClosed { id: id.clone() }));
            }
        };
        *slot = Slot::Sealed(Some(kept));
        p.signal.send_replace(Signal::Broken);
        tracing::info!(partition = %id, "partition sealed for a move");
        Ok(())
    }

    /// Ends a seal whose move was cancelled: the partition serves again (its log reopens on
    /// the next use). Not sealed: nothing to do.
    pub fn unseal(&self, id: &PartitionId) -> Result<()> {
        let p = self.partition(id)?;
        let mut slot = log::write(&p.slot);
        if matches!(*slot, Slot::Sealed(_)) {
            *slot = Slot::Closed;
            tracing::info!(partition = %id, "partition unsealed: its move was cancelled");
        }
        Ok(())
    }

    /// Whether `id` is registered and sealed.
    pub fn is_sealed(&self, id: &PartitionId) -> bool {
        self.partition(id)
            .map(|p| matches!(*log::read(&p.slot), Slot::Sealed(_)))
            .unwrap_or(false)
    }

    /// The registered partitions that are sealed.
    pub fn sealed_partitions(&self) -> Vec<PartitionId> {
        let parts: Vec<Arc<Partition>> = log::read(&self.partitions).values().cloned().collect();
        parts
            .into_iter()
            .filter(|p| matches!(*log::read(&p.slot), Slot::Sealed(_)))
            .map(|p| p.id.clone())
            .collect()
    }

    pub(super) fn sealed(&self, id: &PartitionId) -> Result<Arc<Partition>> {
        let p = self.partition(id)?;
        if !matches!(*log::read(&p.slot), Slot::Sealed(_)) {
            return Err(StorageError::NoSuchFile {
                id: id.clone(),
                name: "(the partition is not sealed for a move)".to_owned(),
            });
        }
        Ok(p)
    }

    /// Every file of sealed partition `id`, with its length and CRC-32C, and the log's end.
    pub fn manifest(&self, id: &PartitionId) -> Result<Manifest> {
        let p = self.sealed(id)?;
        let files = transfer::describe(self.fs.as_ref(), &p.dir)?;
        let end = hwm::read(self.fs.as_ref(), &p.dir)
            .map_err(io(format!("reading the high-watermark file of {id}")))?
            .filter(|h| h.clean)
            .ok_or_else(|| StorageError::HighWatermarkUnknown { id: id.clone() })?;
        Ok(Manifest {
            files,
            high_watermark: end.next_offset,
        })
    }

    /// At most `max` bytes (capped at [`transfer::MAX_CHUNK_BYTES`]) of file `name` of sealed
    /// partition `id`, from `offset`.
    pub fn read_sealed_file(
        &self,
        id: &PartitionId,
        name: &str,
        offset: u64,
        max: u64,
    ) -> Result<Vec<u8>> {
        let p = self.sealed(id)?;
        transfer::read_chunk(self.fs.as_ref(), id, &p.dir, name, offset, max)
    }

    /// Starts receiving partition `id` from another node ([`Staging`]); it must not be
    /// registered here.
    pub fn stage(&self, id: &PartitionId) -> Result<Staging> {
        validate_topic_name(&id.topic)?;
        let target = self.topic_dir(&id.topic).join(id.dir_name());
        Staging::begin(Arc::clone(&self.fs), &self.dir, id, target)
    }

    /// Unregisters partition `id` and removes its directory (through the trash, durably, as
    /// [`Store::delete_topic`] does): for the old copy of a partition whose move has ended.
    /// Unknown partitions are not an error.
    pub fn remove_partition(&self, id: &PartitionId) -> Result<()> {
        validate_topic_name(&id.topic)?;
        self.forget_partition(id);
        let dir = self.topic_dir(&id.topic).join(id.dir_name());
        if !self
            .fs
            .exists(&dir)
            .map_err(io(format!("checking {}", dir.display())))?
        {
            return Ok(());
        }
        let label = format!("{}.{}", id.topic, id.dir_name());
        self.trash(&dir, &label, &self.topic_dir(&id.topic))
    }
}
