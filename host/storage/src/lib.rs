//! Narad's embedded partition log.
//!
//! Every partition of every topic is a directory of segment files holding CRC-32C framed
//! batches, plus a durable high-watermark file and log-start file. An append returns only once its batch is
//! written, `fdatasync`ed and read back from the device (not the page cache: after a failed
//! writeback, or a "successful" `fdatasync` ext4 could not honour, the cache lies; the module
//! doc of `log::writer` records what was found and where). Opening a log recovers it: a torn
//! tail left by a crash is cut, damage below the durable boundary quarantines the partition;
//! unless the log was closed cleanly its last segment is read from the device. `docs/storage.md`
//! describes the files byte by byte and the rules for operators.
//!
//! Layout of the crate:
//! - [`store`]: [`Store`], the data directory and its lock, partition registry, lazy open,
//!   idle close, retention sweep, long-poll.
//! - [`mod@log`]: one partition's log: `format` (the batch frame), `hwm` (the high-watermark
//!   file), `start` (the log-start file), `segment` (names, scanner, sparse index), `torn`
//!   (torn tails kept aside), and the recovery, writer, reader and retention paths.
//! - [`cursor`]: fan-out cursor offset files (`fanout-{child}.offset`): the fixed 256-byte
//!   CRC-32C record, advanced in place, replaced atomically when it must be.
//! - [`fs`]: the file-system seam ([`fs::FileSystem`], [`fs::File`], [`fs::RealFs`]).
//! - `fault` (feature `test-support`, and this crate's tests): `FaultFs`, an in-memory file
//!   system that injects I/O errors and simulates power loss, for this crate's tests and the
//!   daemon's.
//! - [`transfer`]: a sealed partition's files described, served in chunks, and received into
//!   a staging directory, for a planned move to another node.
//! - [`record`]: the records, options and results that cross the API.
//! - [`name`]: [`PartitionId`] and the topic-name rule.
//! - [`clock`]: the injectable wall clock.
//! - [`mod@error`]: the error type, [`StorageError`].
//! - [`damage`]: why a partition is quarantined ([`Damage`]) or stopped ([`Failure`]).

// Tests may unwrap: a panic is how they fail.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod clock;
pub mod cursor;
pub mod damage;
pub mod error;
#[cfg(any(test, feature = "test-support"))]
pub mod fault;
pub mod fs;
pub mod log;
pub mod name;
pub mod record;
pub mod store;
pub mod time_search;
pub mod transfer;

pub use clock::{Clock, ManualClock, SystemClock};
pub use damage::{Damage, DeviceLoss, Failure, IoCause};
pub use error::{Result, StorageError};
pub use log::format::RecordParts;
pub use name::{
    MAX_PARTITION_INDEX, MAX_TOPIC_NAME_LEN, NameError, PartitionId, validate_topic_name,
};
pub use record::{
    AppendBatch, Appended, BatchOrigin, DEFAULT_SEGMENT_BYTES, EncodedBatch, Header, LogConfig,
    NewRecord, NotDue, PartitionState, PartitionStats, ProducerStamp, ReadOptions, ReadResult,
    RecordOrigin, RecoveredCut, RetentionReport, StampedBatch, StoredRecord,
};
pub use store::{
    AppendStats, DEFAULT_FAILED_REOPEN_AFTER, DEFAULT_IDLE_CLOSE_AFTER, InOrderError, Store,
    StoreOptions,
};
