//! `narad bench`: end-to-end measurements of the real code paths, each against a raw loop of
//! the same bytes run in the same process on the same disk.
//!
//! Layout:
//! - [`produce`]: 4 MiB batches through `Store::append` (append, `fdatasync`, verify) against
//!   a raw `write` + `fdatasync` loop of the same frames, interleaved batch by batch.
//! - [`fanout`]: a pre-filled parent copied into K children by the real cursors
//!   (`run_cursor`) through the default Wasm chain, against a raw read + append + `fdatasync`
//!   loop with no routing; then every child is checked to hold every record. With a child of
//!   another partition count, the raw loop is [`raw_buckets`]: the same bucket split and one
//!   `fdatasync` per bucket, without the engine.
//! - [`latency`]: produce acknowledged to copy fetchable in a child, at steady produce rates.
//! - [`idle`]: thousands of delay cursors whose backlog is not yet due, and the CPU they use.
//! - [`metadata`]: topic creation as the metadata grows, and the reconciler's tick over
//!   thousands of topics.
//! - [`cluster`]: real `narad serve` processes: fan-out across three nodes on etcd against one
//!   node in the same run, over HTTP, and the cost of `confirm()` (a linearizable read).
//! - [`requests`]: a real `narad serve`'s CPU per Kafka Produce request, one record per
//!   request against the same records in large requests, in the same run.
//! - [`rig`]: the shared set-up: store, metastore, plugin registry, topics, links, cursors.
//! - [`fill`]: writes the parent's records; [`workdir`]: where the files go;
//! - [`counting_fs`]: the real file system with sync and byte counters;
//! - [`disk`]: this disk's own sync costs (in-place and append `fdatasync`);
//! - [`timed_router`]: a router wrapper that times routing;
//! - [`sys`]: memory, CPU time, load and file-system type from `/proc`;
//! - [`size`]: byte sizes on the command line; [`progress`]: progress lines on a terminal.
//!
//! Every figure is measured in the run that prints it; none is a goal or an estimate. Speed
//! goals are compared in the report, never asserted in tests.

pub mod cluster;
pub mod counting_fs;
mod daemon;
pub mod disk;
pub mod fanout;
pub mod fill;
pub mod idle;
pub mod latency;
pub mod metadata;
pub mod once;
pub mod produce;
pub mod progress;
pub mod raw_append;
pub mod raw_buckets;
pub mod requests;
pub mod rig;
pub mod size;
pub mod stalled;
pub mod sys;
pub mod timed_router;
pub mod workdir;

use narad_storage::StorageError;

use narad_host::blocking::BlockingError;
use narad_host::metastore::MetastoreError;
use narad_host::plugins::RegistryError;

/// Why a bench could not run or its result does not hold.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A file or directory of the bench could not be created, written or read.
    #[error("{context}: {source}")]
    Io {
        /// What the bench was doing.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The store refused an operation.
    #[error("{context}: {source}")]
    Storage {
        /// What the bench was doing.
        context: String,
        /// The error.
        #[source]
        source: StorageError,
    },
    /// The metastore refused an operation (creating a topic, attaching a link).
    #[error("{context}: {source}")]
    Metastore {
        /// What the bench was doing.
        context: String,
        /// The error.
        #[source]
        source: MetastoreError,
    },
    /// A produce through the produce path failed.
    #[error("{context}: {source}")]
    Produce {
        /// What the bench was doing.
        context: String,
        /// The error (boxed: it is much larger than the other variants).
        #[source]
        source: Box<narad_host::produce::ProduceError>,
    },
    /// The plugin registry could not open or resolve the default chain.
    #[error("plugin registry: {0}")]
    Registry(#[from] RegistryError),
    /// The router chain of a link could not be built.
    #[error("building the router of {link}: {reason}")]
    Router {
        /// `parent -> child`.
        link: String,
        /// Why.
        reason: String,
    },
    /// A cursor stopped on its own before copying everything (its link went away, or its
    /// start was deferred), or stalled on an error.
    #[error("cursor {cursor} failed: {reason}")]
    Cursor {
        /// `parent/pNNNNN -> child`.
        cursor: String,
        /// What it reported.
        reason: String,
    },
    /// A child does not hold exactly the parent's records after the copy.
    #[error("child {child} does not hold the parent's records: {reason}")]
    Incomplete {
        /// The child topic.
        child: String,
        /// The first difference found.
        reason: String,
    },
    /// The options make no sense (zero partitions, a batch larger than the total, ...).
    #[error("invalid bench options: {0}")]
    Options(String),
    /// Work the bench put on the blocking pool panicked or was cancelled.
    #[error("bench work on the blocking pool failed: {0}")]
    Blocking(#[from] BlockingError),
    /// A worker thread of a raw loop panicked.
    #[error("a raw-loop worker thread panicked: {message}")]
    WorkerPanicked {
        /// The panic's message, when it was a string.
        message: String,
    },
    /// A `narad serve` the bench started did not start, or failed while the bench ran.
    #[error("node {node}: {reason}{log}")]
    Daemon {
        /// The node's id (`single` for the single-node phase).
        node: String,
        /// What went wrong.
        reason: String,
        /// The end of its log, or why it could not be read.
        log: String,
    },
    /// An HTTP call to a daemon the bench started failed or was refused.
    #[error("{context}: {reason}")]
    Http {
        /// The call (`POST http://127.0.0.1:41234/v1/topics`).
        context: String,
        /// The transport error, or the status and the daemon's message.
        reason: String,
    },
    /// A Kafka request to a daemon the bench started failed or was refused.
    #[error("{context}: {reason}")]
    Kafka {
        /// What the bench was doing.
        context: String,
        /// The transport error, or the error codes of the answer.
        reason: String,
    },
    /// The etcd given to `bench cluster` did not answer.
    #[error(
        "etcd at {endpoints} does not answer: {reason}. The bench does not start etcd; start one, \
         e.g. `etcd --data-dir /dev/shm/narad-bench-etcd --listen-client-urls \
         http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379`, and pass \
         --etcd http://127.0.0.1:2379"
    )]
    EtcdUnavailable {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// What failed.
        reason: String,
    },
    /// A cursor's task panicked or was cancelled instead of stopping when told to.
    #[error("the task of cursor {cursor} failed: {source}")]
    CursorTask {
        /// `parent/pNNNNN -> child`.
        cursor: String,
        /// How the task ended.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl BenchError {
    fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
        let context = context.into();
        move |source| BenchError::Io { context, source }
    }

    fn storage(context: impl Into<String>) -> impl FnOnce(StorageError) -> BenchError {
        let context = context.into();
        move |source| BenchError::Storage { context, source }
    }

    fn metastore(context: impl Into<String>) -> impl FnOnce(MetastoreError) -> BenchError {
        let context = context.into();
        move |source| BenchError::Metastore { context, source }
    }

    /// A raw-loop worker whose thread panicked with `payload` (from `JoinHandle::join`).
    fn worker_panicked(payload: &(dyn std::any::Any + Send)) -> BenchError {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        BenchError::WorkerPanicked { message }
    }
}

/// Runs `work` on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BenchError> {
    Ok(narad_host::blocking::run(work).await?)
}

/// `count` per second over `seconds`, 0 when no time passed.
fn per_second(count: f64, seconds: f64) -> f64 {
    if seconds > 0.0 { count / seconds } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boom() -> u8 {
        panic!("boom")
    }

    #[tokio::test]
    async fn a_panic_on_the_blocking_pool_is_a_blocking_error_keeping_its_message() {
        let err = blocking(boom).await.unwrap_err();
        assert!(
            matches!(&err, BenchError::Blocking(BlockingError::Panicked(m)) if m == "boom"),
            "{err:?}"
        );
    }

    #[test]
    fn a_raw_worker_that_panicked_is_reported_with_its_panic_message() {
        let payload = std::thread::spawn(|| panic!("disk gone {}", 7))
            .join()
            .unwrap_err();
        let err = BenchError::worker_panicked(payload.as_ref());
        assert!(
            matches!(&err, BenchError::WorkerPanicked { message } if message == "disk gone 7"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "a raw-loop worker thread panicked: disk gone 7"
        );
    }
}
