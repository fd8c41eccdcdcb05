//! Which partitions the store knows: registration, incarnations, config, forgetting and
//! deleting topics.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use crate::damage::Damage;
use crate::error::{Result, StorageError};
use crate::log;
use crate::name::{MAX_PARTITION_INDEX, PartitionId, validate_topic_name};
use crate::record::LogConfig;

use super::{Partition, Signal, Slot, Store, TOPICS_DIR_NAME, TRASH_DIR_NAME, io, retire};

impl Store {
    /// Registers a partition and creates its directory durably (idempotent; an existing
    /// registration takes the new config).
    pub fn create_partition(&self, id: &PartitionId, config: LogConfig) -> Result<()> {
        self.register(id, config, true)
    }

    /// Registers a partition recorded earlier, whose directory must therefore exist (an
    /// existing registration takes the new config). A missing directory is never made again
    /// empty: the partition is registered quarantined ([`Damage::DirectoryMissing`]), refusing
    /// reads and appends, until an operator restores the directory or makes it to accept the
    /// loss, and the store is opened again.
    pub fn register_partition(&self, id: &PartitionId, config: LogConfig) -> Result<()> {
        self.register(id, config, false)
    }

    pub(super) fn register(
        &self,
        id: &PartitionId,
        config: LogConfig,
        make_missing: bool,
    ) -> Result<()> {
        validate_topic_name(&id.topic)?;
        if id.partition > MAX_PARTITION_INDEX {
            return Err(StorageError::PartitionOutOfRange {
                partition: id.partition,
                max: MAX_PARTITION_INDEX,
            });
        }
        let topic_dir = self.topic_dir(&id.topic);
        let dir = topic_dir.join(id.dir_name());
        if let Some(p) = log::read(&self.partitions).get(id)
            && matches!(
                &*log::read(&p.slot),
                Slot::Quarantined(Damage::DirectoryMissing { .. })
            )
        {
            // Registered as lost: only a new store (after the operator acted) looks again.
            *log::lock(&p.config) = config;
            return Ok(());
        }
        let exists = self
            .fs
            .exists(&dir)
            .map_err(io(format!("checking {}", dir.display())))?;
        let missing =
            (!exists && !make_missing).then(|| Damage::DirectoryMissing { dir: dir.clone() });
        if !exists && missing.is_none() {
            self.fs
                .create_dir_all(&dir)
                .map_err(io(format!("creating {}", dir.display())))?;
            // Each new directory entry must be durable in its parent.
            for d in [topic_dir.as_path(), &self.dir.join(TOPICS_DIR_NAME)] {
                self.fs
                    .sync_dir(d)
                    .map_err(io(format!("syncing {}", d.display())))?;
            }
        }
        let mut map = log::write(&self.partitions);
        match map.get(id) {
            Some(p) => *log::lock(&p.config) = config,
            None => {
                let (signal, _) = watch::channel(if missing.is_some() {
                    Signal::Broken
                } else {
                    Signal::Unknown
                });
                if let Some(damage) = &missing {
                    tracing::error!(partition = %id, reason = %damage, "partition quarantined");
                }
                map.insert(
                    id.clone(),
                    Arc::new(Partition {
                        id: id.clone(),
                        dir,
                        config: Mutex::new(config),
                        slot: RwLock::new(match missing {
                            Some(damage) => Slot::Quarantined(damage),
                            None => Slot::Closed,
                        }),
                        last_access_ms: AtomicI64::new(self.clock.now_ms()),
                        signal,
                        incarnation: self.registrations.fetch_add(1, Ordering::Relaxed),
                        closed_end: Mutex::new(None),
                        closed_end_checked_ms: AtomicI64::new(i64::MIN),
                    }),
                );
            }
        }
        Ok(())
    }

    /// A number that changes each time `id` is registered anew (after it was forgotten or
    /// removed, such as a partition that moved to another node and back), `None` while it is
    /// not registered. What a caller keeps about a partition's log (an idempotent producer's
    /// recent batches) is stale once this differs from when it was learned.
    pub fn incarnation(&self, id: &PartitionId) -> Option<u64> {
        log::read(&self.partitions).get(id).map(|p| p.incarnation)
    }

    /// Whether `id` is registered (by [`Store::create_partition`]) and not deleted.
    pub fn has_partition(&self, id: &PartitionId) -> bool {
        log::read(&self.partitions).contains_key(id)
    }

    /// Replaces a registered partition's config (retention, segment size).
    pub fn set_config(&self, id: &PartitionId, config: LogConfig) -> Result<()> {
        *log::lock(&self.partition(id)?.config) = config;
        Ok(())
    }

    /// The topics that have at least one registered partition, sorted.
    pub fn registered_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = log::read(&self.partitions)
            .keys()
            .map(|id| id.topic.clone())
            .collect();
        topics.sort();
        topics.dedup();
        topics
    }

    /// Every registered partition, sorted.
    pub fn registered_partitions(&self) -> Vec<PartitionId> {
        let mut ids: Vec<PartitionId> = log::read(&self.partitions).keys().cloned().collect();
        ids.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        ids
    }

    /// Unregisters partition `id`, closing its log, and leaves its directory on disk as it is
    /// (for the caller to set aside). Unknown partitions are not an error.
    pub fn forget_partition(&self, id: &PartitionId) {
        let victim = log::write(&self.partitions).remove(id);
        if let Some(p) = victim {
            retire(&p);
        }
    }

    /// Unregisters every partition of `topic`, closing its open logs, and leaves its directory
    /// on disk as it is (for the caller to set aside). Unknown topics are not an error.
    pub fn forget_topic(&self, topic: &str) {
        let victims: Vec<Arc<Partition>> = {
            let mut map = log::write(&self.partitions);
            let ids: Vec<PartitionId> = map.keys().filter(|k| k.topic == topic).cloned().collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        for p in victims {
            retire(&p);
        }
    }

    /// Unregisters every partition of `topic` and removes `topics/{topic}`: the directory is
    /// first renamed into the trash directory (durably), then removed, so a crash never leaves
    /// a half-deleted topic in place. Deleting a topic with no directory is not an error.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        validate_topic_name(topic)?;
        self.forget_topic(topic);
        let dir = self.topic_dir(topic);
        if !self
            .fs
            .exists(&dir)
            .map_err(io(format!("checking {}", dir.display())))?
        {
            return Ok(());
        }
        self.trash(&dir, topic, &self.dir.join(TOPICS_DIR_NAME))
    }

    /// Removes directory `dir` (whose parent is `parent`) through the trash: renamed there
    /// under `label` durably first, so a crash never leaves it half deleted in place (the
    /// trash is emptied at the next open), then removed.
    pub(super) fn trash(&self, dir: &Path, label: &str, parent: &Path) -> Result<()> {
        let n = self.trash_counter.fetch_add(1, Ordering::Relaxed);
        let trash = self
            .dir
            .join(TRASH_DIR_NAME)
            .join(format!("{label}.{}.{n}", self.clock.now_ms()));
        self.fs.rename(dir, &trash).map_err(io(format!(
            "moving {} to {}",
            dir.display(),
            trash.display()
        )))?;
        for d in [parent.to_path_buf(), self.dir.join(TRASH_DIR_NAME)] {
            self.fs
                .sync_dir(&d)
                .map_err(io(format!("syncing {}", d.display())))?;
        }
        self.fs
            .remove_dir_all(&trash)
            .map_err(io(format!("removing {}", trash.display())))
    }
}
