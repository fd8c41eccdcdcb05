//! The child-commit seam: how a cursor appends a bucket to a child partition.
//!
//! On one node every child partition is local and a commit is exactly a produce: the same
//! `Store::append` (append, `fdatasync`, verify). Across nodes an implementation sends the
//! bucket to the child partition's owner; a dead owner stalls that bucket, it never reroutes.

use std::sync::Arc;

use narad_storage::{AppendBatch, Appended, PartitionId, StorageError, Store};

/// Commits a batch to a child partition, durably, or says why not. Blocking.
pub trait ChildCommitter: Send + Sync + 'static {
    /// Appends `batch` to `partition` and returns once it is durable and verified.
    fn commit(&self, partition: &PartitionId, batch: AppendBatch) -> Result<Appended, StorageError>;
}

/// Commits to partitions of this node's store, through the produce path.
#[derive(Debug, Clone)]
pub struct LocalCommitter {
    store: Arc<Store>,
}

impl LocalCommitter {
    /// A committer appending to `store`.
    pub fn new(store: Arc<Store>) -> LocalCommitter {
        LocalCommitter { store }
    }
}

impl ChildCommitter for LocalCommitter {
    fn commit(&self, partition: &PartitionId, batch: AppendBatch) -> Result<Appended, StorageError> {
        self.store.append(partition, batch)
    }
}
