//! Kafka consumer groups: the coordinator of the groups whose offsets partition this node
//! owns.
//!
//! - [`membership`]: one group's members, generations and rebalance rounds (pure);
//! - [`offsets`]: committed offsets as records of the internal topic [`offsets::TOPIC`].
//!
//! A group belongs to one partition of [`offsets::TOPIC`] ([`offsets::partition_of`]); the
//! owner of that partition is the group's coordinator, so in a cluster groups spread over the
//! nodes, a planned move takes a group's offsets along, and while the owner is down its groups
//! wait like any other partition of a dead owner. The topic is created on first use. A node
//! answers for a group only while it owns the group's partition (NOT_COORDINATOR otherwise,
//! and clients look the coordinator up again); it reads the partition's offsets the first
//! time it answers for one of its groups, and again whenever the partition came back to it.
//!
//! Membership lives in memory only: after a coordinator restart or a move, members learn
//! they are unknown at their next heartbeat and join again, while committed offsets, which
//! are durable before they are answered, carry the group across.

pub(crate) mod membership;
pub(crate) mod offsets;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use narad_storage::{AppendBatch, PartitionId, Store};

pub use crate::config::GroupsConfig;
use crate::metastore::{Metastore, MetastoreError};
use crate::ownership::{NodeId, PartitionOwnership};
use crate::produce::Producer;
use crate::topics::{NewTopic, TopicService};
use membership::{Group, code};
use offsets::{Committed, GroupOffsets, GroupRecord};

/// How often members' sessions and rebalance deadlines are checked.
const TICK: Duration = Duration::from_millis(100);
/// How often offsets are refreshed, expired and partitions no longer owned let go.
const MAINTENANCE: Duration = Duration::from_secs(60);
/// Most groups with members one node coordinates at once.
pub(crate) const MAX_GROUPS: usize = 10_000;
/// Most groups with committed offsets per partition of [`offsets::TOPIC`].
pub(crate) const MAX_GROUPS_PER_PARTITION: usize = 10_000;
/// Longest group id.
pub(crate) const MAX_GROUP_ID_BYTES: usize = 255;

/// Why a group request cannot be served here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum GroupError {
    /// Another node coordinates the group (or none does now).
    #[error("this node is not the group's coordinator")]
    NotCoordinator,
    /// The offsets partition is not ready here yet (being created or read).
    #[error("the group's offsets are being loaded")]
    Loading,
    /// The offsets topic or its partition could not be read or written.
    #[error("{0}")]
    Unavailable(String),
    /// The group id is empty or too long.
    #[error("invalid group id")]
    InvalidGroupId,
    /// As many groups as allowed are held.
    #[error("too many groups")]
    TooManyGroups,
}

impl GroupError {
    /// The Kafka error code clients act on.
    pub(crate) fn code(&self) -> i16 {
        match self {
            GroupError::NotCoordinator => code::NOT_COORDINATOR,
            GroupError::Loading => code::COORDINATOR_LOAD_IN_PROGRESS,
            GroupError::Unavailable(_) => code::COORDINATOR_NOT_AVAILABLE,
            GroupError::InvalidGroupId => code::INVALID_GROUP_ID,
            GroupError::TooManyGroups => code::GROUP_MAX_SIZE_REACHED,
        }
    }
}

/// One partition of the offsets topic as loaded here.
#[derive(Default)]
struct Slot {
    /// The store incarnation the offsets were read from: another one means the partition
    /// left and came back, and is read again.
    incarnation: Option<u64>,
    /// Every group's offsets (`None`: not read yet).
    offsets: Option<HashMap<String, GroupOffsets>>,
}

/// A group as ListGroups shows it.
#[derive(Clone, Debug)]
pub(crate) struct GroupListing {
    /// Group id.
    pub group: String,
    /// "consumer", or empty for a group that only has offsets.
    pub protocol_type: String,
    /// State name.
    pub state: &'static str,
}

/// A group as DescribeGroups shows it.
#[derive(Clone, Debug)]
pub(crate) struct GroupDescription {
    /// State name ("Dead" for a group this coordinator does not know).
    pub state: &'static str,
    /// Protocol type.
    pub protocol_type: String,
    /// Chosen assignor.
    pub protocol: String,
    /// Members.
    pub members: Vec<membership::MemberView>,
}

/// The coordinator of the groups whose offsets partition this node owns.
pub(crate) struct Coordinator {
    store: Arc<Store>,
    producer: Arc<Producer>,
    metastore: Arc<dyn Metastore>,
    ownership: Arc<dyn PartitionOwnership>,
    topics: Arc<TopicService>,
    config: GroupsConfig,
    /// Partition count of the offsets topic (0: not known yet).
    partitions: AtomicU32,
    groups: Mutex<HashMap<String, Group>>,
    slots: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<Slot>>>>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator").finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    crate::topics::now_ms()
}

impl Coordinator {
    /// A coordinator over the node's store, produce path and metadata.
    pub(crate) fn new(
        store: Arc<Store>,
        producer: Arc<Producer>,
        metastore: Arc<dyn Metastore>,
        ownership: Arc<dyn PartitionOwnership>,
        topics: Arc<TopicService>,
        config: GroupsConfig,
    ) -> Coordinator {
        Coordinator {
            store,
            producer,
            metastore,
            ownership,
            topics,
            config,
            partitions: AtomicU32::new(0),
            groups: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The partition count of the offsets topic, creating the topic on first use.
    async fn partitions(&self) -> Result<u32, GroupError> {
        let known = self.partitions.load(Ordering::Relaxed);
        if known > 0 {
            return Ok(known);
        }
        let unavailable = |e: &dyn std::fmt::Display| GroupError::Unavailable(e.to_string());
        let meta = match self.metastore.topic(offsets::TOPIC).await {
            Ok(Some(meta)) => meta,
            Ok(None) => {
                let spec = NewTopic {
                    name: offsets::TOPIC.to_owned(),
                    partitions: offsets::PARTITIONS,
                    retention_ms: Some(
                        u64::try_from(self.config.offsets_retention.as_millis())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    ),
                    retention_bytes: None,
                    placement: None,
                };
                match self.topics.create_internal(spec).await {
                    Ok(meta) => {
                        tracing::info!(
                            topic = offsets::TOPIC,
                            "created the consumer group offsets topic"
                        );
                        meta
                    }
                    Err(crate::topics::TopicError::Metastore(MetastoreError::TopicExists {
                        ..
                    })) => match self.metastore.topic(offsets::TOPIC).await {
                        Ok(Some(meta)) => meta,
                        Ok(None) => return Err(GroupError::Loading),
                        Err(e) => return Err(unavailable(&e)),
                    },
                    Err(e) => return Err(unavailable(&e)),
                }
            }
            Err(e) => return Err(unavailable(&e)),
        };
        self.partitions.store(meta.partitions, Ordering::Relaxed);
        Ok(meta.partitions)
    }

    /// The partition of the offsets topic that holds `group`.
    async fn partition_of(&self, group: &str) -> Result<PartitionId, GroupError> {
        if group.is_empty() || group.len() > MAX_GROUP_ID_BYTES {
            return Err(GroupError::InvalidGroupId);
        }
        let partitions = self.partitions().await?;
        Ok(PartitionId::new(
            offsets::TOPIC,
            offsets::partition_of(group, partitions),
        ))
    }

    /// The node that coordinates `group` now (`None`: no node owns its partition).
    pub(crate) async fn coordinator_of(&self, group: &str) -> Result<Option<NodeId>, GroupError> {
        let id = self.partition_of(group).await?;
        Ok(self.ownership.owner(&id))
    }

    /// `group`'s partition, if this node coordinates it now; lets go of what it held of a
    /// partition it no longer owns.
    async fn local(&self, group: &str) -> Result<PartitionId, GroupError> {
        let id = self.partition_of(group).await?;
        if !self.owned(&id) {
            self.unload(id.partition);
            return Err(GroupError::NotCoordinator);
        }
        if !self.store.has_partition(&id) {
            // Cluster mode: the owner makes the directories when it sees the topic.
            return Err(GroupError::Loading);
        }
        Ok(id)
    }

    fn owned(&self, id: &PartitionId) -> bool {
        self.ownership.is_local(id) && !self.ownership.is_moving(id)
    }

    /// The loaded offsets of `id`, read from the log if they are not (or the partition came
    /// back since).
    async fn slot(
        &self,
        id: &PartitionId,
    ) -> Result<tokio::sync::OwnedMutexGuard<Slot>, GroupError> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(slots.entry(id.partition).or_default())
        };
        let mut guard = slot.lock_owned().await;
        let incarnation = self.store.incarnation(id);
        if guard.offsets.is_none() || guard.incarnation != incarnation {
            let (store, read_id) = (Arc::clone(&self.store), id.clone());
            let started = Instant::now();
            let replayed = crate::blocking::run(move || offsets::replay(&store, &read_id))
                .await
                .map_err(|e| GroupError::Unavailable(e.to_string()))?
                .map_err(|e| GroupError::Unavailable(format!("reading {id}: {e}")))?;
            if replayed.unreadable > 0 {
                tracing::warn!(partition = %id, records = replayed.unreadable,
                    "offsets records of an unknown layout were left out (a newer build wrote them)");
            }
            tracing::info!(partition = %id, groups = replayed.groups.len(),
                elapsed_ms = started.elapsed().as_millis() as u64, "loaded consumer group offsets");
            guard.offsets = Some(replayed.groups);
            guard.incarnation = incarnation;
        }
        Ok(guard)
    }

    /// Forgets what is held of partition `p`: its offsets, and its groups' members (each
    /// waiting one is told to find the coordinator again).
    fn unload(&self, p: u32) {
        let had = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&p)
            .is_some();
        let partitions = self.partitions.load(Ordering::Relaxed);
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let gone: Vec<String> = groups
            .keys()
            .filter(|g| offsets::partition_of(g, partitions) == p)
            .cloned()
            .collect();
        if had || !gone.is_empty() {
            tracing::info!(
                partition = p,
                groups = gone.len(),
                "no longer coordinating the groups of an offsets partition"
            );
        }
        for group in gone {
            if let Some(group) = groups.remove(&group) {
                group.unload();
            }
        }
    }

    /// Runs `f` on `group`'s membership, creating an empty one when `create`; `None` when
    /// the group has none and `create` is false.
    fn with_group<R>(
        &self,
        group: &str,
        create: bool,
        f: impl FnOnce(&mut Group) -> R,
    ) -> Result<Option<R>, GroupError> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        if !groups.contains_key(group) {
            if !create {
                return Ok(None);
            }
            if groups.len() >= MAX_GROUPS {
                return Err(GroupError::TooManyGroups);
            }
            groups.insert(
                group.to_owned(),
                Group::new(self.config.initial_rebalance_delay),
            );
        }
        Ok(groups.get_mut(group).map(f))
    }

    /// JoinGroup.
    pub(crate) async fn join(
        &self,
        group: &str,
        args: membership::JoinArgs,
    ) -> Result<membership::Step<membership::JoinAnswer>, GroupError> {
        self.local(group).await?;
        let step = self.with_group(group, true, |g| g.join(args, Instant::now()))?;
        step.ok_or(GroupError::NotCoordinator)
    }

    /// SyncGroup.
    pub(crate) async fn sync(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, bytes::Bytes)>,
    ) -> Result<membership::Step<membership::SyncAnswer>, GroupError> {
        self.local(group).await?;
        let step = self.with_group(group, false, |g| {
            g.sync(member_id, generation, assignments, Instant::now())
        })?;
        Ok(step.unwrap_or_else(|| {
            membership::Step::Now(membership::SyncAnswer {
                error: code::UNKNOWN_MEMBER_ID,
                assignment: bytes::Bytes::new(),
                protocol_type: None,
                protocol: None,
            })
        }))
    }

    /// Heartbeat: the error code.
    pub(crate) async fn heartbeat(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
    ) -> Result<i16, GroupError> {
        self.local(group).await?;
        let answer = self.with_group(group, false, |g| {
            g.heartbeat(member_id, generation, Instant::now())
        })?;
        Ok(answer.unwrap_or(code::UNKNOWN_MEMBER_ID))
    }

    /// LeaveGroup of one member: the error code.
    pub(crate) async fn leave(&self, group: &str, member_id: &str) -> Result<i16, GroupError> {
        self.local(group).await?;
        let answer = self.with_group(group, false, |g| g.leave(member_id, Instant::now()))?;
        Ok(answer.unwrap_or(code::UNKNOWN_MEMBER_ID))
    }

    /// OffsetCommit: checks the member and generation, then commits `entries` durably (one
    /// record) before answering. `Ok(code)`: the code for every partition of the commit.
    pub(crate) async fn commit(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
        entries: Vec<Committed>,
    ) -> Result<i16, GroupError> {
        let id = self.local(group).await?;
        let check = self
            .with_group(group, false, |g| g.check_commit(member_id, generation))?
            .unwrap_or(match generation < 0 && member_id.is_empty() {
                true => Ok(()),
                false => Err(code::UNKNOWN_MEMBER_ID),
            });
        if let Err(code) = check {
            return Ok(code);
        }
        if entries.is_empty() {
            return Ok(code::NONE);
        }
        let mut slot = self.slot(&id).await?;
        self.write_offsets(&id, &mut slot, group, entries, "committing offsets")
            .await
    }

    /// Writes `entries` of `group` to its offsets partition `id` (one record, committed as a
    /// produce is) and then into the offsets `slot` holds; `what` names the act in an error.
    async fn write_offsets(
        &self,
        id: &PartitionId,
        slot: &mut Slot,
        group: &str,
        entries: Vec<Committed>,
        what: &str,
    ) -> Result<i16, GroupError> {
        let Some(held) = slot.offsets.as_mut() else {
            return Err(GroupError::Loading);
        };
        if !held.contains_key(group) && held.len() >= MAX_GROUPS_PER_PARTITION {
            return Err(GroupError::TooManyGroups);
        }
        self.append(id, group, &GroupRecord::Offsets(entries.clone()))
            .await
            .map_err(|e| GroupError::Unavailable(format!("{what}: {e}")))?;
        held.entry(group.to_owned()).or_default().apply(&entries);
        Ok(code::NONE)
    }

    /// An operator's reset of `group`'s offsets (`narad group reset-offsets`): refused with
    /// `NON_EMPTY_GROUP` while the group has members (they would commit over it, as
    /// `kafka-consumer-groups.sh` also refuses), else `entries` are committed durably, as a
    /// commit is, before this answers `NONE`.
    pub(crate) async fn reset(
        &self,
        group: &str,
        entries: Vec<Committed>,
    ) -> Result<i16, GroupError> {
        let id = self.local(group).await?;
        let mut slot = self.slot(&id).await?;
        // Checked with the slot held: a commit of a member that joins now waits for it.
        let members = self
            .with_group(group, false, |g| !g.is_empty())?
            .unwrap_or(false);
        if members {
            return Ok(code::NON_EMPTY_GROUP);
        }
        if entries.is_empty() {
            return Ok(code::NONE);
        }
        self.write_offsets(&id, &mut slot, group, entries, "resetting offsets")
            .await
    }

    /// OffsetFetch: the committed offsets of `group` (all, or those of `wanted`).
    pub(crate) async fn fetch(
        &self,
        group: &str,
        wanted: Option<&[(String, i32)]>,
    ) -> Result<Vec<Committed>, GroupError> {
        let id = self.local(group).await?;
        let slot = self.slot(&id).await?;
        let Some(held) = slot.offsets.as_ref().and_then(|o| o.get(group)) else {
            return Ok(Vec::new());
        };
        Ok(match wanted {
            None => held.entries.values().cloned().collect(),
            Some(wanted) => wanted
                .iter()
                .filter_map(|key| held.entries.get(key).cloned())
                .collect(),
        })
    }

    /// The groups this node coordinates: those with members and those with offsets.
    pub(crate) async fn list(&self) -> Result<Vec<GroupListing>, GroupError> {
        let partitions = self.partitions().await?;
        let mut listed: std::collections::BTreeMap<String, GroupListing> = Default::default();
        for p in 0..partitions {
            let id = PartitionId::new(offsets::TOPIC, p);
            if !self.owned(&id) || !self.store.has_partition(&id) {
                continue;
            }
            let slot = self.slot(&id).await?;
            for (group, held) in slot.offsets.iter().flatten() {
                if !held.entries.is_empty() {
                    listed.insert(
                        group.clone(),
                        GroupListing {
                            group: group.clone(),
                            protocol_type: "consumer".to_owned(),
                            state: membership::State::Empty.name(),
                        },
                    );
                }
            }
        }
        let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, group) in groups.iter() {
            if group.member_count() == 0 && listed.contains_key(name) {
                continue;
            }
            if group.member_count() == 0 && group.is_empty() {
                continue;
            }
            listed.insert(
                name.clone(),
                GroupListing {
                    group: name.clone(),
                    protocol_type: group.protocol_type().unwrap_or("consumer").to_owned(),
                    state: group.state().name(),
                },
            );
        }
        Ok(listed.into_values().collect())
    }

    /// DescribeGroups of one group.
    pub(crate) async fn describe(&self, group: &str) -> Result<GroupDescription, GroupError> {
        let id = self.local(group).await?;
        let described = self.with_group(group, false, |g| GroupDescription {
            state: g.state().name(),
            protocol_type: g.protocol_type().unwrap_or_default().to_owned(),
            protocol: g.protocol().unwrap_or_default().to_owned(),
            members: g.members(),
        })?;
        if let Some(described) = described {
            return Ok(described);
        }
        let slot = self.slot(&id).await?;
        let has_offsets = slot
            .offsets
            .as_ref()
            .is_some_and(|o| o.get(group).is_some_and(|g| !g.entries.is_empty()));
        Ok(GroupDescription {
            state: if has_offsets { "Empty" } else { "Dead" },
            protocol_type: if has_offsets {
                "consumer".to_owned()
            } else {
                String::new()
            },
            protocol: String::new(),
            members: Vec::new(),
        })
    }

    /// DeleteGroups of one group: its offsets are gone once this answers `NONE`.
    pub(crate) async fn delete(&self, group: &str) -> Result<i16, GroupError> {
        let id = self.local(group).await?;
        let members = self
            .with_group(group, false, |g| !g.is_empty())?
            .unwrap_or(false);
        if members {
            return Ok(code::NON_EMPTY_GROUP);
        }
        let mut slot = self.slot(&id).await?;
        let Some(held) = slot.offsets.as_mut() else {
            return Err(GroupError::Loading);
        };
        if !held.contains_key(group) {
            return Ok(code::GROUP_ID_NOT_FOUND);
        }
        self.append(&id, group, &GroupRecord::Deleted)
            .await
            .map_err(|e| GroupError::Unavailable(format!("deleting group offsets: {e}")))?;
        held.remove(group);
        self.groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(group);
        Ok(code::NONE)
    }

    /// Writes one record of `group` to its partition `id` of the offsets topic through the
    /// produce path; `Ok` once it is committed there.
    async fn append(
        &self,
        id: &PartitionId,
        group: &str,
        record: &GroupRecord,
    ) -> Result<(), String> {
        let record = record.to_record(group).map_err(|e| e.to_string())?;
        let batch = AppendBatch {
            records: vec![record],
            origin: None,
        };
        match self.producer.commit(id.clone(), batch).await {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("writing to {id}: {e}")),
        }
    }

    /// Checks sessions and rebalance deadlines every [`TICK`], and every [`MAINTENANCE`]
    /// refreshes and expires offsets, until `shutdown`.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        shutdown: crate::shutdown::ShutdownSignal,
    ) -> tokio::task::JoinHandle<()> {
        let coordinator = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(TICK);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut last_maintenance = Instant::now();
            loop {
                tokio::select! {
                    () = shutdown.wait() => break,
                    _ = ticker.tick() => {}
                }
                coordinator.tick(Instant::now());
                if last_maintenance.elapsed() >= MAINTENANCE {
                    last_maintenance = Instant::now();
                    coordinator.maintain().await;
                }
            }
            let groups = std::mem::take(
                &mut *coordinator
                    .groups
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            for (_, group) in groups {
                group.unload();
            }
        })
    }

    fn tick(&self, now: Instant) {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        for group in groups.values_mut() {
            group.tick(now);
        }
        groups.retain(|_, g| !(g.state() == membership::State::Empty && g.is_empty()));
    }

    /// Lets go of partitions no longer owned; writes again the offsets of groups with
    /// members that would otherwise age out of the topic; forgets the offsets of groups
    /// without members whose last commit is older than the retention.
    async fn maintain(&self) {
        let partitions = self.partitions.load(Ordering::Relaxed);
        let retention_ms =
            i64::try_from(self.config.offsets_retention.as_millis()).unwrap_or(i64::MAX);
        let loaded: Vec<u32> = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect();
        for p in loaded {
            let id = PartitionId::new(offsets::TOPIC, p);
            if !self.owned(&id) {
                self.unload(p);
                continue;
            }
            let Ok(mut slot) = self.slot(&id).await else {
                continue;
            };
            let Some(held) = slot.offsets.as_mut() else {
                continue;
            };
            let now = now_ms();
            let active: std::collections::HashSet<String> = {
                let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
                groups
                    .iter()
                    .filter(|(name, g)| {
                        g.member_count() > 0 && offsets::partition_of(name, partitions) == p
                    })
                    .map(|(name, _)| name.clone())
                    .collect()
            };
            held.retain(|group, offsets| {
                active.contains(group) || now.saturating_sub(offsets.last_write_ms) < retention_ms
            });
            let stale: Vec<String> = held
                .iter()
                .filter(|(group, offsets)| {
                    active.contains(*group)
                        && now.saturating_sub(offsets.last_write_ms) >= retention_ms / 2
                })
                .map(|(group, _)| group.clone())
                .collect();
            for group in stale {
                let Some(offsets) = held.get_mut(&group) else {
                    continue;
                };
                let entries: Vec<Committed> = offsets
                    .entries
                    .values()
                    .map(|c| Committed {
                        commit_ms: now,
                        ..c.clone()
                    })
                    .collect();
                let written = self
                    .append(&id, &group, &GroupRecord::Offsets(entries.clone()))
                    .await;
                match written {
                    Ok(_) => offsets.apply(&entries),
                    Err(e) => {
                        tracing::warn!(%group, partition = %id, error = %e, "could not write a group's offsets again; retrying at the next pass");
                    }
                }
            }
        }
    }
}
