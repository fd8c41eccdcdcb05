//! Planned partition moves: one partition's log and cursor files go to another node, which
//! then owns it at generation + 1. Nothing is lost and nothing is copied twice, because the
//! partition takes no writes and runs no cursors from the moment its files are described until
//! its new owner serves it.
//!
//! The new owner runs the move ([`Mover::move_in`]); every step is a compare-and-swap on the
//! partition's owner record, so two moves, or a move and a cancel, cannot both win:
//!
//! 1. **Mark**: `{old, g}` becomes `{old, g, moving_to: new}`. From then on the old owner's
//!    reconciler stops the partition's cursors, commits to it are refused (senders wait), and
//!    the old owner seals it as soon as its metadata copy shows the mark (at a restart, before
//!    serving anything), so it takes no write even if the new owner dies before step 2.
//! 2. **Hand off** (on the old owner, [`Mover::hand_off`]): wait until its cursors have
//!    stopped (each wrote its offset file after its last committed slab), seal the partition
//!    (the log is closed cleanly after any append in flight; reads and appends now get a
//!    retriable "being moved"), and describe every file with its length and CRC-32C.
//! 3. **Copy**: the new owner fetches each file in chunks of at most 4 MiB into a staging
//!    directory, checks length and CRC-32C, syncs, installs the directory in `topics/`, and
//!    opens the log to check that it ends where the old owner said.
//! 4. **Take over**: `{old, g, moving_to: new}` becomes `{new, g + 1}`. Cursors start here
//!    from the copied offset files with the same epoch; commits carry the new generation.
//! 5. **Release** (on the old owner, from its metadata loop): once a linearizable read shows
//!    the new owner, the sealed copy is deleted (`TopicService::settle_sealed` in `crate::topics`).
//!
//! A move that fails part way leaves the partition marked and sealed: nothing is lost, the
//! partition is unavailable until the same move is asked for again (it resumes from step 2)
//! or cancelled (`{old, g}` again; the old owner unseals it).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_storage::transfer::{MAX_CHUNK_BYTES, Manifest};
use narad_storage::{LogConfig, PartitionId, StorageError, Store};
use serde::{Deserialize, Serialize};

use crate::blocking::BlockingError;
use crate::cluster::{ClusterContext, PeerError};
use crate::metastore::{Metastore, MetastoreError, PartitionOwner};

/// Longest wait, on the old owner, for the partition's cursors to stop before a hand-off is
/// answered with "try again" ([`MoveError::CursorsRunning`]).
pub(crate) const CURSOR_STOP_WAIT: Duration = Duration::from_secs(10);

/// How many times the new owner asks for the hand-off while cursors are still stopping.
pub(crate) const HANDOFF_ATTEMPTS: u32 = 6;

/// Longest wait for a hand-off answer: it checksums every file of the partition.
pub(crate) const HANDOFF_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest wait for one chunk of a file.
pub(crate) const CHUNK_TIMEOUT: Duration = Duration::from_secs(60);

/// The internal route of a hand-off (`POST`, [`HandoffRequest`] -> [`Manifest`]).
pub(crate) fn handoff_path(id: &PartitionId) -> String {
    format!(
        "/internal/v1/topics/{}/partitions/{}/handoff",
        id.topic, id.partition
    )
}

/// The internal route of a chunk of a sealed file (`POST`, [`ChunkRequest`] -> bytes).
pub(crate) fn chunk_path(id: &PartitionId) -> String {
    format!(
        "/internal/v1/topics/{}/partitions/{}/files",
        id.topic, id.partition
    )
}

/// The internal route that makes the node called run a move of the partition to itself
/// (`POST`, no body -> [`MoveReport`]).
pub(crate) fn move_in_path(id: &PartitionId) -> String {
    format!(
        "/internal/v1/topics/{}/partitions/{}/move-in",
        id.topic, id.partition
    )
}

/// Asks the owner to hand the partition over to `to`, at the generation `to` marked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HandoffRequest {
    /// The node the partition moves to.
    pub to: String,
    /// The generation of the owner record it marked.
    pub generation: u64,
}

/// Asks for at most `max` bytes of file `name` of a sealed partition, from `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkRequest {
    /// The file, relative to the partition directory.
    pub name: String,
    /// Where to start.
    pub offset: u64,
    /// The most bytes wanted (capped at 4 MiB).
    pub max: u64,
}

/// What a finished move reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveReport {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The node that owned it.
    pub from: String,
    /// The node that owns it now.
    pub to: String,
    /// The owner record's generation now.
    pub generation: u64,
    /// Files copied.
    pub files: usize,
    /// Bytes copied.
    pub bytes: u64,
    /// The log's end, the same on both nodes.
    pub high_watermark: u64,
    /// How long the move took, from marking to taking over.
    pub elapsed_ms: u64,
    /// Linked topics (local parents and children with the same partition count) whose
    /// partition of this index is on the node named as the target: the copy and its
    /// original now share a disk. Empty when the target was chosen (it never is one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares_node_with: Vec<String>,
}

/// Why a move, or one of its steps, did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum MoveError {
    /// The metadata could not be read or written, or the owner record changed under the move.
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// Reading, sealing, copying or installing files failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Blocking file work did not finish.
    #[error(transparent)]
    Task(#[from] BlockingError),
    /// The topic or partition does not exist, or has no owner record.
    #[error("partition {partition} does not exist or has no owner in the cluster metadata")]
    UnknownPartition {
        /// The partition.
        partition: PartitionId,
    },
    /// The node asked to receive the partition already owns it.
    #[error("node {node} already owns {partition}")]
    AlreadyOwner {
        /// The partition.
        partition: PartitionId,
        /// Its owner.
        node: String,
    },
    /// Another move of the partition is under way.
    #[error(
        "{partition} is already being moved to node {to}; ask for that move again to resume it, \
         or cancel it first"
    )]
    AlreadyMoving {
        /// The partition.
        partition: PartitionId,
        /// Where it is going.
        to: String,
    },
    /// A hand-off was asked of a node the metadata does not show handing the partition to the
    /// caller.
    #[error("{partition} is not being moved from this node to {to} at generation {generation}")]
    NotMoving {
        /// The partition.
        partition: PartitionId,
        /// The caller.
        to: String,
        /// The generation the caller named.
        generation: u64,
    },
    /// The partition's cursors had not stopped in time; the hand-off can be asked again.
    #[error("{count} cursor(s) of {partition} are still stopping; the hand-off can be asked again")]
    CursorsRunning {
        /// The partition.
        partition: PartitionId,
        /// Cursors still running.
        count: usize,
    },
    /// A node the move needs is not alive.
    #[error("node {node} is not alive, and the move of {partition} needs it")]
    NodeDown {
        /// The partition.
        partition: PartitionId,
        /// The node.
        node: String,
    },
    /// A call to another node failed.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// The copy does not end where the old owner said: it was removed and the move stopped.
    #[error(
        "the copy of {partition} ends at offset {copied}, but the old owner's log ends at \
         {expected}; the copy was removed and the partition stays where it was (sealed until \
         the move is asked for again or cancelled)"
    )]
    EndMismatch {
        /// The partition.
        partition: PartitionId,
        /// The end the old owner described.
        expected: u64,
        /// The end of the copy.
        copied: u64,
    },
}

/// Runs this node's side of planned moves.
pub(crate) struct Mover {
    cluster: Arc<ClusterContext>,
    store: Arc<Store>,
    /// The cursors running on this node (a hand-off waits until those of the partition stop).
    view: Arc<crate::fanout::status::FanoutView>,
    in_flight: Mutex<HashSet<PartitionId>>,
}

/// Removes a partition from the in-flight set when a move ends, however it ends.
struct InFlight<'a> {
    set: &'a Mutex<HashSet<PartitionId>>,
    id: PartitionId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Mover {
    /// A mover for this node (its calls to other nodes carry the cluster's peer secret),
    /// reading which cursors run here from `view`.
    pub(crate) fn new(
        cluster: Arc<ClusterContext>,
        store: Arc<Store>,
        view: Arc<crate::fanout::status::FanoutView>,
    ) -> Mover {
        Mover {
            cluster,
            store,
            view,
            in_flight: Mutex::new(HashSet::new()),
        }
    }

    fn me(&self) -> &str {
        self.cluster.node_id()
    }

    /// The owner record of `id` from a linearizable read.
    async fn confirmed_owner(&self, id: &PartitionId) -> Result<PartitionOwner, MoveError> {
        let snapshot = self.cluster.metastore.confirm().await?;
        snapshot
            .topics
            .get(&id.topic)
            .and_then(|t| t.owners.get(id.partition as usize).cloned())
            .ok_or_else(|| MoveError::UnknownPartition {
                partition: id.clone(),
            })
    }

    /// Moves partition `partition` of `topic` to this node (the steps in the module doc);
    /// resumes a move to this node that stopped part way.
    pub(crate) async fn move_in(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<MoveReport, MoveError> {
        let id = PartitionId::new(topic.to_owned(), partition);
        if !lock(&self.in_flight).insert(id.clone()) {
            return Err(MoveError::AlreadyMoving {
                partition: id,
                to: self.me().to_owned(),
            });
        }
        let _in_flight = InFlight {
            set: &self.in_flight,
            id: id.clone(),
        };
        let started = Instant::now();
        let current = self.confirmed_owner(&id).await?;
        let marked = match &current.moving_to {
            Some(to) if to == self.me() => current.clone(),
            Some(to) => {
                return Err(MoveError::AlreadyMoving {
                    partition: id,
                    to: to.clone(),
                });
            }
            None if current.node == self.me() => {
                return Err(MoveError::AlreadyOwner {
                    partition: id,
                    node: current.node,
                });
            }
            None => {
                let marked = PartitionOwner {
                    moving_to: Some(self.me().to_owned()),
                    ..current.clone()
                };
                self.cluster
                    .metastore
                    .set_owner(topic, partition, current.clone(), marked.clone())
                    .await?;
                tracing::info!(partition = %id, from = %marked.node, to = %self.me(),
                    generation = marked.generation, "move started");
                marked
            }
        };
        let from = marked.node.clone();
        if !self.cluster.peers.is_live(&from) {
            return Err(MoveError::NodeDown {
                partition: id,
                node: from,
            });
        }
        let manifest = self.ask_handoff(&id, &from, marked.generation).await?;
        self.copy(&id, &from, &manifest).await?;
        let owner = PartitionOwner {
            node: self.me().to_owned(),
            generation: marked.generation + 1,
            moving_to: None,
        };
        if let Err(e) = self
            .cluster
            .metastore
            .set_owner(topic, partition, marked, owner.clone())
            .await
        {
            // Cancelled (or the metadata is out of reach) after the copy: the copy is not
            // this node's to serve, and the old owner still holds every file.
            self.drop_copy(&id).await;
            return Err(e.into());
        }
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(partition = %id, from = %from, to = %self.me(), generation = owner.generation,
            bytes = manifest.total_bytes(), elapsed_ms, "move finished");
        Ok(MoveReport {
            topic: topic.to_owned(),
            partition,
            from,
            to: owner.node,
            generation: owner.generation,
            files: manifest.files.len(),
            bytes: manifest.total_bytes(),
            high_watermark: manifest.high_watermark,
            elapsed_ms,
            shares_node_with: Vec::new(),
        })
    }

    async fn ask_handoff(
        &self,
        id: &PartitionId,
        from: &str,
        generation: u64,
    ) -> Result<Manifest, MoveError> {
        let request = HandoffRequest {
            to: self.me().to_owned(),
            generation,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let answer = self
                .cluster
                .post_peer(from, &handoff_path(id), &request, HANDOFF_TIMEOUT)
                .await?;
            match answer.status().as_u16() {
                200 => {
                    return answer.json().await.map_err(|e| {
                        MoveError::Peer(PeerError::new(
                            from,
                            Some(200),
                            format!("answered a hand-off that does not decode: {e}"),
                        ))
                    });
                }
                // Cursors still stopping: ask again.
                503 if attempt < HANDOFF_ATTEMPTS => {
                    tracing::info!(partition = %id, from, attempt, "hand-off not ready; asking again");
                }
                _ => return Err(PeerError::refused(from, answer).await.into()),
            }
        }
    }

    async fn copy(
        &self,
        id: &PartitionId,
        from: &str,
        manifest: &Manifest,
    ) -> Result<(), MoveError> {
        let target = self
            .store
            .data_dir()
            .join(narad_storage::store::TOPICS_DIR_NAME)
            .join(&id.topic)
            .join(id.dir_name());
        if self.store.has_partition(id) {
            // Registered here without being owned here: an earlier move to this node that
            // installed its copy but did not take over. That copy is set aside.
            self.store.forget_partition(id);
        }
        if target.exists() {
            super::set_aside_partition(&self.store, &target, id, super::SET_ASIDE_BEFORE_MOVE_IN)
                .map_err(|reason| {
                MoveError::Storage(StorageError::InstallTargetExists {
                    path: target.join(format!("(could not set it aside: {reason})")),
                })
            })?;
        }
        let store = Arc::clone(&self.store);
        let staging = {
            let id = id.clone();
            crate::blocking::run(move || store.stage(&id)).await??
        };
        if let Err(e) = self.fill(id, from, manifest, &staging).await {
            crate::blocking::run(move || staging.abandon()).await?;
            return Err(e);
        }
        crate::blocking::run(move || staging.install()).await??;
        // The copy must open, and end where the old owner's log ended.
        let store = Arc::clone(&self.store);
        let check = {
            let id = id.clone();
            crate::blocking::run(move || {
                store.create_partition(&id, LogConfig::default())?;
                store.high_watermark(&id)
            })
            .await?
        };
        match check {
            Ok(end) if end == manifest.high_watermark => Ok(()),
            Ok(copied) => {
                self.drop_copy(id).await;
                Err(MoveError::EndMismatch {
                    partition: id.clone(),
                    expected: manifest.high_watermark,
                    copied,
                })
            }
            Err(e) => {
                self.drop_copy(id).await;
                Err(e.into())
            }
        }
    }

    /// Fetches every file of `manifest` into the staging directory.
    async fn fill(
        &self,
        id: &PartitionId,
        from: &str,
        manifest: &Manifest,
        staging: &narad_storage::transfer::Staging,
    ) -> Result<(), MoveError> {
        for entry in &manifest.files {
            let (staging, name) = (staging.clone(), entry.name.clone());
            let file = crate::blocking::run(move || staging.create(&name)).await??;
            let mut file = Some(file);
            let mut offset = 0;
            while offset < entry.len {
                let request = ChunkRequest {
                    name: entry.name.clone(),
                    offset,
                    max: MAX_CHUNK_BYTES,
                };
                let answer = self
                    .cluster
                    .post_peer(from, &chunk_path(id), &request, CHUNK_TIMEOUT)
                    .await?;
                if !answer.status().is_success() {
                    return Err(PeerError::refused(from, answer).await.into());
                }
                let bytes = answer.bytes().await.map_err(|e| {
                    MoveError::Peer(PeerError::new(
                        from,
                        None,
                        format!("stopped sending {}: {e}", entry.name),
                    ))
                })?;
                if bytes.is_empty() {
                    break;
                }
                offset += bytes.len() as u64;
                let Some(mut writing) = file.take() else {
                    break;
                };
                writing = crate::blocking::run(move || {
                    writing.write(&bytes)?;
                    Ok::<_, StorageError>(writing)
                })
                .await??;
                file = Some(writing);
            }
            if let Some(written) = file {
                let expected = entry.clone();
                crate::blocking::run(move || written.finish(&expected)).await??;
            }
        }
        Ok(())
    }

    /// Removes this node's copy of a partition it does not own (the old owner has every file).
    async fn drop_copy(&self, id: &PartitionId) {
        let store = Arc::clone(&self.store);
        let id = id.clone();
        match crate::blocking::run(move || store.remove_partition(&id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not remove an unused partition copy"),
            Err(e) => tracing::warn!(error = %e, "could not remove an unused partition copy"),
        }
    }

    /// The old owner's side: checks that the metadata shows `request.to` receiving the
    /// partition from this node, waits for its cursors to stop, seals it and describes its
    /// files.
    pub(crate) async fn hand_off(
        &self,
        topic: &str,
        partition: u32,
        request: &HandoffRequest,
    ) -> Result<Manifest, MoveError> {
        let id = PartitionId::new(topic.to_owned(), partition);
        let owner = self.confirmed_owner(&id).await?;
        if owner.node != self.me()
            || owner.generation != request.generation
            || owner.moving_to.as_deref() != Some(request.to.as_str())
        {
            return Err(MoveError::NotMoving {
                partition: id,
                to: request.to.clone(),
                generation: request.generation,
            });
        }
        let deadline = Instant::now() + CURSOR_STOP_WAIT;
        loop {
            let count = self.view.running_on(&id.topic, id.partition);
            if count == 0 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(MoveError::CursorsRunning {
                    partition: id,
                    count,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let store = Arc::clone(&self.store);
        let manifest = crate::blocking::run(move || {
            store.seal(&id)?;
            store.manifest(&id)
        })
        .await??;
        Ok(manifest)
    }

    /// The old owner's side: a chunk of a file of a sealed partition.
    pub(crate) async fn chunk(
        &self,
        topic: &str,
        partition: u32,
        request: ChunkRequest,
    ) -> Result<Vec<u8>, MoveError> {
        let id = PartitionId::new(topic.to_owned(), partition);
        let store = Arc::clone(&self.store);
        Ok(crate::blocking::run(move || {
            store.read_sealed_file(&id, &request.name, request.offset, request.max)
        })
        .await??)
    }
}

/// Longest wait for a whole move asked of another node: copying a large partition takes a
/// while (the call goes on in the background on that node if this wait ends).
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(3600);

impl Mover {
    /// Asks node `to` to run the move of `id` to itself, and waits for its report.
    pub(crate) async fn ask_move_in(
        &self,
        to: &str,
        id: &PartitionId,
    ) -> Result<MoveReport, MoveError> {
        let answer = self
            .cluster
            .post_peer(to, &move_in_path(id), &serde_json::json!({}), MOVE_TIMEOUT)
            .await?;
        if !answer.status().is_success() {
            return Err(PeerError::refused(to, answer).await.into());
        }
        answer.json().await.map_err(|e| {
            MoveError::Peer(PeerError::new(
                to,
                Some(200),
                format!("answered a move report that does not decode: {e}"),
            ))
        })
    }

    /// Cancels the move of `id` under way: the owner record loses its `moving_to` (the old
    /// owner then unseals the partition, and the new node's copy, if any, is never used).
    /// Returns the record now.
    pub(crate) async fn cancel(&self, id: &PartitionId) -> Result<PartitionOwner, MoveError> {
        let current = self.confirmed_owner(id).await?;
        let Some(to) = &current.moving_to else {
            return Err(MoveError::NotMoving {
                partition: id.clone(),
                to: "any node".to_owned(),
                generation: current.generation,
            });
        };
        let owner = PartitionOwner {
            moving_to: None,
            ..current.clone()
        };
        tracing::info!(partition = %id, from = %current.node, to = %to, "move cancelled");
        self.cluster
            .metastore
            .set_owner(&id.topic, id.partition, current, owner.clone())
            .await?;
        Ok(owner)
    }

    /// The live, uncordoned node other than `exclude` that owns the fewest partitions (ties:
    /// the smaller id), and none of the same partition of a linked topic when such a node is
    /// left ([`crate::cluster::placement::linked_nodes`]): where a move of `partition` without
    /// a named target goes.
    pub(crate) fn pick_target(
        &self,
        snapshot: &crate::metastore::Snapshot,
        partition: &PartitionId,
        exclude: &str,
    ) -> Option<String> {
        let live: Vec<String> = self
            .cluster
            .peers
            .placeable()
            .into_iter()
            .filter(|id| id != exclude)
            .collect();
        least_loaded_away(snapshot, &live, partition)
    }
}

/// [`least_loaded`] of the `candidates` that own partition `partition` of no topic linked to
/// its topic, or of all of them when each does.
pub(crate) fn least_loaded_away(
    snapshot: &crate::metastore::Snapshot,
    candidates: &[String],
    partition: &PartitionId,
) -> Option<String> {
    let linked =
        crate::cluster::placement::linked_nodes(snapshot, &partition.topic, partition.partition);
    let away: Vec<String> = candidates
        .iter()
        .filter(|c| !linked.contains(c))
        .cloned()
        .collect();
    least_loaded(snapshot, &away).or_else(|| least_loaded(snapshot, candidates))
}

/// Of `candidates`, the node owning the fewest partitions in `snapshot` (ties: the smaller id).
pub(crate) fn least_loaded(
    snapshot: &crate::metastore::Snapshot,
    candidates: &[String],
) -> Option<String> {
    let mut load: std::collections::BTreeMap<&str, usize> =
        candidates.iter().map(|c| (c.as_str(), 0)).collect();
    for topic in snapshot.topics.values() {
        for owner in &topic.owners {
            if let Some(n) = load.get_mut(owner.node.as_str()) {
                *n += 1;
            }
        }
    }
    load.into_iter()
        .min_by_key(|(id, n)| (*n, *id))
        .map(|(id, _)| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::{Snapshot, TopicMeta};

    #[test]
    fn a_move_without_a_target_goes_to_the_least_loaded_live_node() {
        let mut snapshot = Snapshot::default();
        snapshot.topics.insert(
            "t".to_owned(),
            TopicMeta {
                writable_as_child: false,
                name: "t".to_owned(),
                partitions: 4,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: 0,
                owners: ["n1", "n2", "n2", "n3"]
                    .into_iter()
                    .map(PartitionOwner::first)
                    .collect(),
            },
        );
        let nodes = |ids: &[&str]| ids.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            least_loaded(&snapshot, &nodes(&["n2", "n3"])),
            Some("n3".to_owned())
        );
        // A node owning nothing wins; ties go to the smaller id.
        assert_eq!(
            least_loaded(&snapshot, &nodes(&["n2", "n4"])),
            Some("n4".to_owned())
        );
        assert_eq!(
            least_loaded(&snapshot, &nodes(&["n3", "n1"])),
            Some("n1".to_owned())
        );
        assert_eq!(least_loaded(&snapshot, &[]), None);
    }

    #[test]
    fn a_move_without_a_target_avoids_the_node_of_the_same_partition_of_a_linked_topic() {
        let mut snapshot = Snapshot::default();
        for (name, owners) in [("parent", ["n1", "n3"]), ("child", ["n2", "n2"])] {
            snapshot.topics.insert(
                name.to_owned(),
                TopicMeta {
                    writable_as_child: false,
                    name: name.to_owned(),
                    partitions: 2,
                    retention_ms: None,
                    retention_bytes: None,
                    created_at_ms: 0,
                    owners: owners.into_iter().map(PartitionOwner::first).collect(),
                },
            );
        }
        let link: crate::metastore::LinkMeta = serde_json::from_value(serde_json::json!({
            "parent": "parent", "child": "child", "attach_epoch": "0011223344556677",
            "attach_offsets": null, "delay_ms": 0, "router": [], "attached_at_ms": 0,
        }))
        .unwrap();
        snapshot
            .links
            .insert(("parent".to_owned(), "child".to_owned()), link);
        let nodes = |ids: &[&str]| ids.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        // child/0 leaves n2: n1 owns less, but parent/0 is there; n3 it is.
        let child0 = PartitionId::new("child", 0);
        assert_eq!(
            least_loaded(&snapshot, &nodes(&["n1", "n3"])),
            Some("n1".to_owned())
        );
        assert_eq!(
            least_loaded_away(&snapshot, &nodes(&["n1", "n3"]), &child0),
            Some("n3".to_owned())
        );
        // With only the parent's node left, it still goes somewhere.
        assert_eq!(
            least_loaded_away(&snapshot, &nodes(&["n1"]), &child0),
            Some("n1".to_owned())
        );
    }
}
