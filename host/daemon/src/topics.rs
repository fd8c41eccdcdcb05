//! Topic administration: create, delete and grow topics, keeping the metastore (the source of
//! truth) and the partition directories of the store in step.
//!
//! Ordering makes a crash at any point harmless:
//! - create and grow make the partition directories first and record the topic in the
//!   metastore last, so a topic the metastore names always has its directories; a crash in
//!   between leaves empty directories of a topic nobody knows, which start-up removes;
//! - delete removes the topic from the metastore first, then its directories; a crash in
//!   between leaves directories of an unknown topic, which start-up removes as well.
//!
//! Admin operations run one at a time (an async mutex), so two concurrent creates of one name
//! cannot both pass the existence check.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use narad_storage::{LogConfig, PartitionId, Store, validate_topic_name};

use crate::metastore::{Metastore, MetastoreError, TopicMeta};
use crate::produce::Producer;

/// Most partitions a topic may have: far below the five-digit directory limit, and enough for
/// any one-node deployment (Kafka clusters rarely exceed a few hundred per topic).
pub const MAX_PARTITIONS: u32 = 1024;

/// Errors from topic administration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    /// The request is invalid: the message says what to fix.
    #[error("{0}")]
    Invalid(String),
    /// The metastore refused or failed (unknown topic, duplicate, shrink, I/O).
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// The store failed to create or remove partition directories.
    #[error(transparent)]
    Storage(#[from] narad_storage::StorageError),
    /// A blocking task was cancelled or panicked.
    #[error("topic task failed: {0}")]
    Task(String),
}

/// What a caller asks for when creating a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    /// Name: 1..=249 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
    pub name: String,
    /// Partition count, `1..=MAX_PARTITIONS`.
    pub partitions: u32,
    /// Age limit in milliseconds (`None`: keep forever). Must be positive.
    pub retention_ms: Option<u64>,
    /// Size limit per partition in bytes (`None`: no cap). Must be positive.
    pub retention_bytes: Option<u64>,
}

/// Creates, deletes and grows topics.
pub struct TopicService {
    store: Arc<Store>,
    metastore: Arc<dyn Metastore>,
    producer: Arc<Producer>,
    segment_bytes: u64,
    admin: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for TopicService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicService").finish_non_exhaustive()
    }
}

/// Checks a topic name, with a message that says what to fix.
pub fn check_name(name: &str) -> Result<(), TopicError> {
    validate_topic_name(name)
        .map_err(|e| TopicError::Invalid(format!("invalid topic name {name:?}: {e}")))
}

/// Checks a partition count against `1..=MAX_PARTITIONS`.
pub fn check_partition_count(count: u32) -> Result<(), TopicError> {
    if count == 0 || count > MAX_PARTITIONS {
        return Err(TopicError::Invalid(format!(
            "partition count {count} is out of range: use 1 to {MAX_PARTITIONS}"
        )));
    }
    Ok(())
}

/// The log configuration of `topic`'s partitions.
pub fn log_config(topic: &TopicMeta, segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        retention_ms: topic.retention_ms,
        retention_bytes: topic.retention_bytes,
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl TopicService {
    /// A service over the given store and metastore; `segment_bytes` is the roll size given
    /// to every partition.
    pub fn new(
        store: Arc<Store>,
        metastore: Arc<dyn Metastore>,
        producer: Arc<Producer>,
        segment_bytes: u64,
    ) -> TopicService {
        TopicService {
            store,
            metastore,
            producer,
            segment_bytes,
            admin: tokio::sync::Mutex::new(()),
        }
    }

    /// Validates and creates a topic with its partition directories.
    pub async fn create(&self, spec: NewTopic) -> Result<TopicMeta, TopicError> {
        check_name(&spec.name)?;
        check_partition_count(spec.partitions)?;
        if spec.retention_ms == Some(0) {
            return Err(TopicError::Invalid(
                "retention_ms must be positive; omit it to keep records forever".to_owned(),
            ));
        }
        if spec.retention_bytes == Some(0) {
            return Err(TopicError::Invalid(
                "retention_bytes must be positive; omit it for no size cap".to_owned(),
            ));
        }
        let _admin = self.admin.lock().await;
        if self.metastore.topic(&spec.name).await?.is_some() {
            return Err(MetastoreError::TopicExists { name: spec.name }.into());
        }
        let meta = TopicMeta {
            name: spec.name,
            partitions: spec.partitions,
            retention_ms: spec.retention_ms,
            retention_bytes: spec.retention_bytes,
            created_at_ms: now_ms(),
        };
        self.create_dirs(&meta, 0).await?;
        Ok(self.metastore.create_topic(meta).await?)
    }

    /// Deletes a topic: from the metastore first, then its files.
    pub async fn delete(&self, name: &str) -> Result<TopicMeta, TopicError> {
        let _admin = self.admin.lock().await;
        let meta = self.metastore.delete_topic(name).await?;
        self.producer.forget_topic(name);
        let store = Arc::clone(&self.store);
        let topic = name.to_owned();
        tokio::task::spawn_blocking(move || store.delete_topic(&topic))
            .await
            .map_err(|e| TopicError::Task(e.to_string()))??;
        Ok(meta)
    }

    /// Raises a topic's partition count to `count` (grow only; the same count is a no-op).
    pub async fn grow(&self, name: &str, count: u32) -> Result<TopicMeta, TopicError> {
        check_partition_count(count)?;
        let _admin = self.admin.lock().await;
        let Some(current) = self.metastore.topic(name).await? else {
            return Err(MetastoreError::UnknownTopic {
                name: name.to_owned(),
            }
            .into());
        };
        if count < current.partitions {
            return Err(MetastoreError::CannotShrink {
                name: name.to_owned(),
                current: current.partitions,
                requested: count,
            }
            .into());
        }
        if count == current.partitions {
            return Ok(current);
        }
        let grown = TopicMeta {
            partitions: count,
            ..current.clone()
        };
        self.create_dirs(&grown, current.partitions).await?;
        Ok(self.metastore.grow_partitions(name, count).await?)
    }

    /// Changes a topic's retention: in the metastore first (which refuses a retention shorter
    /// than a delay child of the topic needs), then in every partition's log settings.
    /// `None` keeps records forever / without a size cap.
    pub async fn set_retention(
        &self,
        name: &str,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    ) -> Result<TopicMeta, TopicError> {
        if retention_ms == Some(0) || retention_bytes == Some(0) {
            return Err(TopicError::Invalid(
                "retention_ms and retention_bytes must be positive; null removes the limit"
                    .to_owned(),
            ));
        }
        let _admin = self.admin.lock().await;
        let topic = self
            .metastore
            .set_retention(name, retention_ms, retention_bytes)
            .await?;
        let store = Arc::clone(&self.store);
        let config = log_config(&topic, self.segment_bytes);
        let (name, partitions) = (topic.name.clone(), topic.partitions);
        tokio::task::spawn_blocking(move || {
            for p in 0..partitions {
                store.set_config(&PartitionId::new(name.clone(), p), config.clone())?;
            }
            Ok::<(), narad_storage::StorageError>(())
        })
        .await
        .map_err(|e| TopicError::Task(e.to_string()))??;
        Ok(topic)
    }

    /// Registers partitions `from..topic.partitions` with the store (idempotent).
    async fn create_dirs(&self, topic: &TopicMeta, from: u32) -> Result<(), TopicError> {
        let store = Arc::clone(&self.store);
        let config = log_config(topic, self.segment_bytes);
        let name = topic.name.clone();
        let to = topic.partitions;
        tokio::task::spawn_blocking(move || {
            for p in from..to {
                store.create_partition(&PartitionId::new(name.clone(), p), config.clone())?;
            }
            Ok::<(), narad_storage::StorageError>(())
        })
        .await
        .map_err(|e| TopicError::Task(e.to_string()))??;
        Ok(())
    }
}
