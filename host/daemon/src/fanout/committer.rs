//! The child-commit seam: how a cursor appends a bucket to a child partition.
//!
//! On one node every child partition is local and a commit is exactly a produce: the same
//! `Store::append` (append, `fdatasync`, verify). Across nodes an implementation sends the
//! bucket to the child partition's owner; a dead owner stalls that bucket, it never reroutes.

use narad_storage::{Appended, EncodedBatch, PartitionId, StorageError};

use crate::produce::Producer;

/// Commits a batch to a child partition, durably, or says why not. Blocking.
pub trait ChildCommitter: Send + Sync + 'static {
    /// Appends `batch` (encoded once, from the parent records' bytes) to `partition` and
    /// returns once it is durable and verified. On an error `batch` is left as it was, so the
    /// caller's quick retries send the same frame again without encoding or copying it.
    fn commit(
        &self,
        partition: &PartitionId,
        batch: &mut EncodedBatch,
    ) -> Result<Appended, StorageError>;
}

/// On one node a child commit is a produce commit: the same `Store::append` (append,
/// `fdatasync`, verify) that [`Producer::commit`] runs.
impl ChildCommitter for Producer {
    fn commit(
        &self,
        partition: &PartitionId,
        batch: &mut EncodedBatch,
    ) -> Result<Appended, StorageError> {
        self.store().append_encoded(partition, batch)
    }
}
