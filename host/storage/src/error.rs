//! The crate's error type and `Result` alias.

use std::path::PathBuf;

use crate::damage::{Damage, Failure};
use crate::name::{NameError, PartitionId};

/// Result of a storage operation.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Everything a storage operation can fail with.
#[non_exhaustive]
#[derive(thiserror::Error, Debug)]
pub enum StorageError {
    /// `Store::open` found the data directory's `LOCK` file held by another process (or by
    /// another `Store` in this process): only one writer may use a data directory.
    #[error(
        "data directory lock {path} is held: another narad process is using this data directory \
         (stop it, or point this one at a different --data-dir)"
    )]
    DataDirLocked {
        /// The lock file that could not be taken.
        path: PathBuf,
    },
    /// The partition was never registered with `create_partition` on this store (or its topic
    /// was deleted).
    #[error("unknown partition {id}")]
    UnknownPartition {
        /// The partition asked for.
        id: PartitionId,
    },
    /// Recovery or a read found a damaged frame where acknowledged records live. The partition
    /// refuses reads and writes until an operator repairs it; other partitions keep working.
    #[error("partition {id} is quarantined: {reason}")]
    Quarantined {
        /// The quarantined partition.
        id: PartitionId,
        /// What was found, naming the file and byte position (boxed: it is large, and every
        /// `Result` of the crate carries this type).
        reason: Box<Damage>,
    },
    /// The partition stopped after a failed `fdatasync` whose damage could not be undone
    /// (truncating back to the last durable length failed as well). Its first use after
    /// `StoreOptions::failed_reopen_after` (or a restart) runs recovery and reopens it.
    #[error("partition {id} has failed and stopped: {reason}")]
    Failed {
        /// The failed partition.
        id: PartitionId,
        /// The I/O errors that stopped it (boxed, as `Quarantined`'s reason is).
        reason: Box<Failure>,
    },
    /// A read asked for an offset that retention has already deleted.
    #[error("offset {requested} of {id} is below the log start offset {log_start}")]
    OffsetBelowLogStart {
        /// The partition read.
        id: PartitionId,
        /// The offset asked for.
        requested: u64,
        /// The oldest offset still stored.
        log_start: u64,
    },
    /// A read asked for an offset past the next offset to be assigned.
    #[error("offset {requested} of {id} is beyond the high watermark {high_watermark}")]
    OffsetBeyondEnd {
        /// The partition read.
        id: PartitionId,
        /// The offset asked for.
        requested: u64,
        /// The next offset to be assigned.
        high_watermark: u64,
    },
    /// `append` was called with no records.
    #[error("a batch needs at least one record")]
    EmptyBatch,
    /// The encoded batch exceeds the hard frame limit of the log format.
    #[error("batch of {size} bytes exceeds the storage frame limit of {max} bytes")]
    RecordTooLarge {
        /// Encoded size of the batch frame in bytes.
        size: usize,
        /// The limit ([`crate::log::format::MAX_FRAME_BYTES`]).
        max: usize,
    },
    /// A topic name broke the naming rule.
    #[error("invalid topic name: {0}")]
    InvalidName(#[from] NameError),
    /// A partition index above [`crate::MAX_PARTITION_INDEX`].
    #[error("partition index {partition} is above the maximum {max}")]
    PartitionOutOfRange {
        /// The index asked for.
        partition: u32,
        /// The largest allowed index.
        max: u32,
    },
    /// A batch origin whose `parent_offsets` does not hold exactly one offset per record.
    #[error("batch origin has {offsets} parent offsets for {records} records")]
    OriginMismatch {
        /// Number of records in the batch.
        records: usize,
        /// Number of parent offsets given.
        offsets: usize,
    },
    /// The partition's log was closed (idle close, or its topic deleted) while an operation
    /// used it, and the operation could not be retried on a reopened log. Retrying the call
    /// reopens it.
    #[error("the log of {id} was closed while in use; retry")]
    LogClosed {
        /// The partition.
        id: PartitionId,
    },
    /// Opening the log did not give the partition's high watermark (a defect: an open log
    /// always knows it), so it cannot be reported.
    #[error("high watermark of {id} unknown after opening it")]
    HighWatermarkUnknown {
        /// The partition.
        id: PartitionId,
    },
    /// The partition is sealed for a move to another node ([`crate::Store::seal`]): it takes
    /// no appends (and no long-poll) here until the move ends (it is then served by its new
    /// owner) or is cancelled (and this store unseals it). Retry, after looking the owner up
    /// again.
    #[error("partition {id} is being moved to another node; retry once the move ends")]
    Sealed {
        /// The partition.
        id: PartitionId,
    },
    /// A move asked for a file of a partition that its files do not include, or by a name that
    /// is not a plain file name inside the partition's directory.
    #[error("partition {id} has no file {name:?} to move")]
    NoSuchFile {
        /// The partition.
        id: PartitionId,
        /// The name asked for.
        name: String,
    },
    /// A copied file does not match what its source described: the copy is refused.
    #[error("the copy of {name} does not match its source: {detail}")]
    CopyMismatch {
        /// The file, relative to the partition directory.
        name: String,
        /// What differs (length or CRC-32C).
        detail: String,
    },
    /// A partition's directory is already present where a moved copy was to be installed.
    #[error("{path} already exists; set it aside before installing a moved copy there")]
    InstallTargetExists {
        /// The directory in the way.
        path: PathBuf,
    },
    /// An I/O error, with what was being done (and, for the errors that call for it, what an
    /// operator should do: [`file_system_advice`]).
    #[error("{context}: {source}{}", advice_suffix(source))]
    Io {
        /// What the store was doing, naming the file.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl StorageError {
    /// Wraps an I/O error with a description of what was being done.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StorageError::Io {
            context: context.into(),
            source,
        }
    }
}

/// What an operator should do when the device did not keep bytes a successful `fdatasync`
/// reported durable (found by the read-back of an append).
pub(crate) const UNKEPT_WRITE_ADVICE: &str = "the device or the file system did not keep what \
     it reported durable, as when a thin or loop-backed volume runs out of room under the file \
     system: check dmesg, free room on the device, and at the next stop unmount and repair the \
     file system (e2fsck -f for ext4) before starting again; see docs/storage.md";

/// What an operator should do about an I/O error whose code says more than its text (the file
/// system found damage in its metadata, the device failed, the disk is full), or `None`.
pub fn file_system_advice(e: &std::io::Error) -> Option<&'static str> {
    use rustix::io::Errno;
    let code = e.raw_os_error()?;
    if code == Errno::UCLEAN.raw_os_error() {
        Some(
            "the file system found damage in its own metadata, often left by a device that \
             refused writes under it: stop narad, unmount, repair the file system (e2fsck -f \
             for ext4), mount and start again; see docs/storage.md",
        )
    } else if code == Errno::IO.raw_os_error() {
        Some(
            "the device or the file system failed: check dmesg; if the device refused writes, \
             repair the file system before going on (docs/storage.md)",
        )
    } else if code == Errno::NOSPC.raw_os_error() {
        Some("the file system is full: free space or grow it; nothing acknowledged was lost")
    } else {
        None
    }
}

/// `" (advice)"` for an error [`file_system_advice`] has advice for, else nothing.
pub(crate) fn advice_suffix(e: &std::io::Error) -> String {
    file_system_advice(e).map_or_else(String::new, |advice| format!(" ({advice})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_that_call_for_an_operator_say_what_to_do_and_others_do_not() {
        let unclean = std::io::Error::from_raw_os_error(rustix::io::Errno::UCLEAN.raw_os_error());
        let text = StorageError::io("appending to orders/p00000/0.log", unclean).to_string();
        assert!(
            text.starts_with("appending to orders/p00000/0.log: "),
            "{text}"
        );
        assert!(text.contains("e2fsck -f"), "{text}");
        let eio = std::io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error());
        assert!(file_system_advice(&eio).is_some_and(|a| a.contains("dmesg")));
        let full = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        assert!(file_system_advice(&full).is_some_and(|a| a.contains("full")));
        let other = std::io::Error::from_raw_os_error(rustix::io::Errno::ACCESS.raw_os_error());
        assert_eq!(file_system_advice(&other), None);
        assert_eq!(file_system_advice(&std::io::Error::other("no code")), None);
    }
}
