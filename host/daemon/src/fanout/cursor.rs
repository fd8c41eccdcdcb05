//! One fan-out cursor: the loop that takes a slab through its steps, until stopped.
//!
//! [`run_cursor`] opens the position ([`super::position`]), then loops: read a slab
//! ([`super::slab`]), and for its records check the epoch, route ([`super::route`]), bucket
//! ([`super::bucket`]) and commit ([`super::commit`]), sending the records of failed buckets
//! round again after the back-off, then advance ([`super::advance`]). Each step gets what it
//! needs as arguments and returns its result; none calls back into the loop. A step that
//! fails for now stalls the cursor (its reason in the status) for
//! [`FanoutTiming::retry_backoff`] and is tried again; the cursor never skips a record.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use narad_storage::cursor::gaps::GapReason;
use narad_storage::fs::FileSystem;
use narad_storage::{Clock, PartitionId, StorageError, Store, StoredRecord};

use super::advance::{Durability, OffsetFile};
use super::bucket::{SlabOrigin, bucket};
use super::commit::{Acknowledged, commit, commit_slabs};
use super::committer::{ChildCommitError, ChildCommitter};
use super::dead_letter;
use super::gap_book::GapBook;
use super::position::{self, Deferred, Opened};
use super::route::{Mode, RouteFailure, RouteInput, SharedRouter, route_measured};
use super::shadow::{Shadow, ShadowSlab};
use super::slab::{NoRecords, SlabError, SlabRead, read_slab};
use super::status::SeekError;
use super::status::{CursorStatus, HaltedGap};
use super::{FanoutTiming, gate};
use crate::metastore::link::{BadEpoch, LinkMeta, epoch_bytes};
use crate::metastore::{Metastore, MetastoreError};
use crate::shutdown::ShutdownSignal;

/// Identity of one fan-out cursor: a (parent partition, child) pair under one attach epoch.
///
/// The epoch is part of the identity so that a detach followed by a re-attach is a stop of the
/// old cursor and a start of a new one, never a silent resume of the old position. The
/// reconciler compares sets of these to decide which cursors to start and stop.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CursorKey {
    /// Parent topic name.
    pub parent: String,
    /// Parent partition index.
    pub partition: u32,
    /// Child topic name.
    pub child: String,
    /// Attach epoch of the link the cursor serves (16 lowercase hex digits).
    pub epoch: String,
}

/// The parts of the daemon a cursor uses.
pub struct CursorDeps {
    /// The local store: the parent partition and (on one node) the child partitions.
    pub store: Arc<Store>,
    /// The file system the store runs on, for the offset file.
    pub fs: Arc<dyn FileSystem>,
    /// Where child buckets are committed.
    pub committer: Arc<dyn ChildCommitter>,
    /// The metadata: topics, links, and the linearizable epoch check.
    pub metastore: Arc<dyn Metastore>,
    /// The clock the delay gate reads (this node's clock).
    pub clock: Arc<dyn Clock>,
    /// Every wait of the cursor (the reference constants by default).
    pub timing: FanoutTiming,
    /// Cluster mode: how the start-up scan of the child's tails reads the child partitions
    /// other nodes own. `None` on one node, where every child partition must be here (a
    /// missing one is an error).
    pub remote_tails: Option<Arc<dyn super::position::RemoteTails>>,
    /// Cluster mode: this node's id, written with every range on a cursor's gap ledger.
    pub node: Option<String>,
    /// Whether a starting cursor leaves out of the slabs it reads again the records its child
    /// already holds ([`super::position::Held`]). The daemon always sets it; only the
    /// baseline of `narad bench once` runs without, to measure what the check costs.
    pub leave_out_held: bool,
}

/// A link as the cursors of this node see it: its metadata, swapped when the link changes,
/// and its router chain, shared by its cursors.
pub struct LinkRuntime {
    meta: RwLock<Arc<LinkMeta>>,
    /// The router chain; replacing what it holds takes effect at every cursor's next slab.
    pub router: SharedRouter,
    /// The link's shadow on this node, if one is set: offered every slab once it is routed.
    shadow: RwLock<Option<Arc<Shadow>>>,
    /// Wakes the link's paused cursors when its metadata is replaced (a resume, say).
    changed: tokio::sync::Notify,
}

impl LinkRuntime {
    /// A link runtime for `meta` routing through `router`, with no shadow.
    pub fn new(meta: LinkMeta, router: SharedRouter) -> LinkRuntime {
        LinkRuntime {
            meta: RwLock::new(Arc::new(meta)),
            router,
            shadow: RwLock::new(None),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The link's shadow, if one runs.
    pub fn shadow(&self) -> Option<Arc<Shadow>> {
        match self.shadow.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the link's shadow (`None`: no shadow); cursors offer their next routed slab
    /// to the new one. The link's own chain is not touched.
    pub(crate) fn set_shadow(&self, shadow: Option<Arc<Shadow>>) {
        match self.shadow.write() {
            Ok(mut guard) => *guard = shadow,
            Err(poisoned) => *poisoned.into_inner() = shadow,
        }
    }

    /// The link's current metadata.
    pub fn meta(&self) -> Arc<LinkMeta> {
        match self.meta.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the link's metadata (router change, topic change, pause or resume) and wakes
    /// the cursors waiting on it.
    pub fn set_meta(&self, meta: LinkMeta) {
        match self.meta.write() {
            Ok(mut guard) => *guard = Arc::new(meta),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(meta),
        }
        self.changed.notify_waiters();
    }
}

/// Why a cursor stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum CursorExit {
    /// Told to stop (detach, shutdown, ownership moved).
    Stopped,
    /// Its epoch is no longer the link's; the reconciler starts the right cursor.
    LinkGone(LinkGone),
    /// Its start could not be confirmed against the metastore; retried on a later tick.
    Deferred(Deferred),
    /// Paused by an operator while stalled on a slab: the slab is dropped (nothing of it is
    /// on file) and the cursor waits paused, where it can be sought past the slab. Handled
    /// inside the cursor; [`run_cursor`] never returns it.
    PausedWhileStalled,
}

impl std::fmt::Display for CursorExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CursorExit::Stopped => f.write_str("stopped"),
            CursorExit::LinkGone(gone) => write!(f, "link gone: {gone}"),
            CursorExit::Deferred(why) => write!(f, "start deferred: {why}"),
            CursorExit::PausedWhileStalled => f.write_str("paused while stalled"),
        }
    }
}

/// Why a cursor's link is no longer the one it serves. The `Display` text is what the cursor's
/// exit says.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkGone {
    /// Before routing a slab, the metastore no longer had the cursor's epoch as the link's,
    /// or no longer had the link's parent or child topic: the link was detached, re-attached
    /// or a topic deleted.
    #[error("{parent} -> {child} was detached or re-attached")]
    DetachedOrReattached {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// The link's metadata, swapped in by the reconciler, carries another attach epoch than
    /// the cursor's.
    #[error("{parent} -> {child} was re-attached")]
    Reattached {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// The cursor's own epoch is not a valid epoch, so no link can be its.
    #[error(transparent)]
    BadEpoch(#[from] BadEpoch),
}

/// Runs the cursor named by `key` until it is stopped or its link changes.
pub async fn run_cursor(
    deps: Arc<CursorDeps>,
    key: CursorKey,
    link: Arc<LinkRuntime>,
    status: Arc<CursorStatus>,
    stop: ShutdownSignal,
) -> CursorExit {
    let parent = PartitionId::new(key.parent.clone(), key.partition);
    // A remote child's buckets go to the target's batch produce; a local one's to the
    // node's committer. Fixed for the cursor's life: a new target is a new attach.
    let committer = match link.meta().remote.clone() {
        Some(target) => {
            let source = target.source.clone();
            let counted = Arc::clone(&status);
            Arc::new(super::remote_child::RemoteSender::new(
                target,
                source,
                Box::new(move |bytes| counted.remote_sent(bytes)),
            )) as Arc<dyn ChildCommitter>
        }
        None => Arc::clone(&deps.committer),
    };
    let cursor = Cursor {
        deps,
        key,
        parent,
        link,
        status,
        stop,
        committer,
        held: std::sync::Mutex::new(position::Held::default()),
        stall_log: super::stall_log::StallLog::default(),
    };
    match cursor.run().await {
        Err(exit) => exit,
        Ok(never) => match never {},
    }
}

/// How often a paused cursor refreshes its lag (records keep arriving in the parent). A
/// resume (the reconciler swaps the link's metadata in) and a seek wake it at once, so this
/// only bounds how stale a paused cursor's lag is: one blocking read a second per paused
/// cursor, not ten.
const PAUSED_LAG_EVERY: Duration = Duration::from_secs(1);

/// A slab every bucket of which is acknowledged, whose position is not on file yet.
struct Delivered {
    /// The proof that every bucket is committed.
    acknowledged: Acknowledged,
    /// One past the slab's last record: the position to write.
    end: u64,
}

/// One running cursor: what every step is called with.
struct Cursor {
    deps: Arc<CursorDeps>,
    key: CursorKey,
    parent: PartitionId,
    link: Arc<LinkRuntime>,
    status: Arc<CursorStatus>,
    stop: ShutdownSignal,
    /// Where this cursor's buckets are committed.
    committer: Arc<dyn ChildCommitter>,
    /// What the child held at or past the start position: not committed again.
    held: std::sync::Mutex<position::Held>,
    /// When its stall was last logged ([`super::stall_log`]).
    stall_log: super::stall_log::StallLog,
}

impl Cursor {
    /// The loop. Every `?` is the cursor's exit: stopped, link gone, or start deferred.
    async fn run(&self) -> Result<Infallible, CursorExit> {
        let epoch = epoch_bytes(&self.key.epoch).map_err(|e| CursorExit::LinkGone(e.into()))?;
        // (0) Position: where the cursor starts, retried (stalled) until it can be opened.
        let offsets = loop {
            match position::open(&self.deps, &self.key, &self.link.meta(), &self.status).await {
                Ok(Opened::File { offsets, held }) if self.deps.leave_out_held => {
                    *self
                        .held
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = held;
                    break offsets;
                }
                Ok(Opened::File { offsets, .. }) => break offsets,
                Ok(Opened::Deferred(why)) => return Err(CursorExit::Deferred(why)),
                Err(e) => {
                    self.stall(format!("cannot open the cursor position: {e}"))
                        .await?
                }
            }
        };
        // The losses on record: counted from the start, and the book every new one goes in.
        let gaps = loop {
            match GapBook::open(&self.deps, &self.key, &self.status).await {
                Ok(gaps) => break gaps,
                Err(e) => self.stall(e.to_string()).await?,
            }
        };
        self.status
            .set_position(offsets.next_offset(), offsets.next_offset());
        self.status.running();
        let mut unsaved = None;
        let stopped = self.copy(&offsets, &gaps, epoch, &mut unsaved).await;
        // Told to stop (a move, a shutdown): the delivered slab not on file yet is written, and
        // the position synced, so the cursor that resumes from this file (here or on the node
        // the partition moves to) repeats nothing, even after a power loss.
        if let Err(CursorExit::Stopped) = &stopped {
            let saved = match unsaved {
                Some(slab) => {
                    offsets
                        .past_slab(&slab.acknowledged, slab.end, Durability::Now)
                        .await
                }
                None => offsets.flush().await,
            };
            if let Err(e) = saved {
                tracing::warn!(parent = %self.parent, child = %self.key.child, error = %e,
                    "the last delivered position was not made durable; what follows it may be copied again");
            }
        }
        stopped
    }

    /// Steps 1 to 5, pipelined: the slabs of one commit (up to [`FanoutTiming::slabs_per_commit`]
    /// consecutive slabs already read, their buckets for each child partition committed
    /// together) are delivered (routed, bucketed, committed) while the position past the
    /// slabs before them is written and the slabs after them are read, so the child's
    /// `fdatasync` and the offset file's overlap, and a backlog costs one child `fdatasync`
    /// per child partition per commit rather than per slab. Slabs that reach the parent's end
    /// have nothing after them to read: their position is written right after they are
    /// delivered. The offset file still moves only past slabs every bucket of which is
    /// acknowledged, in slab order: the position written in step N is the one past the
    /// slabs of commit N - 1, whose [`Acknowledged`] it holds. A cursor holds at most twice
    /// [`FanoutTiming::slabs_per_commit`] slabs (those delivering and those read ahead).
    async fn copy(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        epoch: [u8; 8],
        unsaved: &mut Option<Delivered>,
    ) -> Result<Infallible, CursorExit> {
        // Past every slab delivered so far (the file may still be one commit behind).
        let mut next = offsets.next_offset();
        let mut ahead: VecDeque<Ahead> = VecDeque::new();
        loop {
            let link = self.current_link()?;
            if link.paused.contains(&self.key.partition) {
                // Paused: the slabs committed last go on file, then nothing until resumed.
                self.save(offsets, unsaved.as_ref(), Durability::Now)
                    .await?;
                *unsaved = None;
                let resumed_at = self.while_paused(offsets, gaps, next).await?;
                if resumed_at != next {
                    // Sought elsewhere: what was read ahead is not the next slab any more.
                    ahead.clear();
                    next = resumed_at;
                }
                continue;
            }
            let delay_ms = link.delay_ms;
            let from = next;
            // (1) Read a slab (read ahead during the last delivery), or learn why there is none.
            let read = match ahead.pop_front() {
                Some(read) => read,
                None => self.without_held(Ahead::from_read(
                    self.read(from, delay_ms).await?,
                    self.origin(epoch, from),
                )),
            };
            let (first, mut high_watermark) = match read {
                Ahead::Slab {
                    slab,
                    high_watermark,
                } => (slab, high_watermark),
                Ahead::Nothing(why) => {
                    ahead.clear();
                    // Every other move of the file comes after the delivered slabs'.
                    self.save(offsets, unsaved.as_ref(), Durability::Now)
                        .await?;
                    *unsaved = None;
                    self.nothing_to_copy(offsets, gaps, from, delay_ms, why)
                        .await?;
                    next = offsets.next_offset();
                    continue;
                }
                Ahead::Failed(e) => {
                    ahead.clear();
                    self.save(offsets, unsaved.as_ref(), Durability::Now)
                        .await?;
                    *unsaved = None;
                    self.read_failed(offsets, from, e).await?;
                    next = offsets.next_offset();
                    continue;
                }
            };
            let records = &first.delivery.pending;
            // The slab's last offset, whatever of it was already held by the child.
            let mut last = first.delivery.end - 1;
            let oldest = records.first().map(|r| r.committed_at_ms);
            let now_ms = self.deps.clock.now_ms();
            self.status.committing(oldest, delay_ms, now_ms);
            let mut counts = vec![records.len()];
            let mut slabs = vec![first];
            // The slabs read ahead that follow this one join its commit, up to the limit.
            while slabs.len() < self.slabs_per_commit() && last + 1 < high_watermark {
                let (slab, high) = match ahead.pop_front() {
                    Some(Ahead::Slab {
                        slab,
                        high_watermark,
                    }) => (slab, high_watermark),
                    // No records there (or a failed read): handled as the next slab.
                    other => {
                        if let Some(other) = other {
                            ahead.push_front(other);
                        }
                        break;
                    }
                };
                let end = slab.delivery.end - 1;
                counts.push(slab.delivery.pending.len());
                slabs.push(slab);
                (last, high_watermark) = (end, high);
            }
            // (2) to (4) for these slabs, (5) for the ones before, and (1) to (3) for the
            // ones after: they are read and routed while these commit. At the parent's end
            // there is nothing to read ahead (a read would only wait for new records): the
            // position is written as soon as the slabs are delivered instead, so an idle
            // cursor's file is never a commit behind.
            let at_end = last + 1 >= high_watermark;
            let before = unsaved.take();
            // What is read ahead is dropped if these slabs stall (it is read again once they
            // are delivered): a stalled cursor pins no parent read buffer.
            let (commit_state, commit_seen) = tokio::sync::watch::channel(CommitState::Running);
            let (delivered, saved, read_ahead) = tokio::join!(
                async {
                    let stalled = || {
                        commit_state.send_replace(CommitState::Stalled);
                    };
                    let delivered = self.deliver_together(slabs, stalled).await;
                    commit_state.send_if_modified(|state| {
                        let running = *state == CommitState::Running;
                        if running {
                            *state = CommitState::Delivered;
                        }
                        running
                    });
                    delivered
                },
                self.save(offsets, before.as_ref(), Durability::Coalesced),
                async {
                    if at_end {
                        return Ok(VecDeque::new());
                    }
                    let reads = self.read_and_route_ahead(last + 1, delay_ms, epoch).await?;
                    let mut seen = commit_seen;
                    match seen.wait_for(|s| *s != CommitState::Running).await {
                        Ok(state) if *state == CommitState::Delivered => Ok(reads),
                        _ => Ok(VecDeque::new()),
                    }
                },
            );
            match delivered {
                // The position past these slabs covers the ones before, whatever its write
                // did.
                Ok(acknowledged) => {
                    *unsaved = Some(Delivered {
                        acknowledged,
                        end: last + 1,
                    })
                }
                // Paused while stalled: the slabs are dropped (their buckets that did land are
                // copied again on resume, as after a crash) and the loop waits paused at their
                // start, the position the slabs before them end at.
                Err(CursorExit::PausedWhileStalled) => {
                    if saved.is_err() {
                        *unsaved = before;
                    }
                    ahead.clear();
                    tracing::info!(parent = %self.key.parent, partition = self.key.partition,
                        child = %self.key.child, at = from,
                        "paused while stalled: the stalled slab is dropped and copied again from its start on resume");
                    continue;
                }
                Err(exit) => {
                    if saved.is_err() {
                        *unsaved = before;
                    }
                    return Err(exit);
                }
            }
            saved?;
            if at_end {
                self.save(offsets, unsaved.as_ref(), Durability::Now)
                    .await?;
                *unsaved = None;
            }
            for count in counts {
                self.status.slab_committed(count as u64);
            }
            self.healthy_at(last + 1, high_watermark);
            next = last + 1;
            ahead = read_ahead?;
        }
    }

    /// `read` without the records the child already held when the cursor started (a slab
    /// repeated after a crash; [`position::Held`]), counted as deduplicated.
    fn without_held(&self, mut read: Ahead) -> Ahead {
        let Ahead::Slab { slab, .. } = &mut read else {
            return read;
        };
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.is_empty() {
            return read;
        }
        let records = Arc::make_mut(&mut slab.delivery.pending);
        let dropped = held.drop_held(records);
        drop(held);
        if dropped > 0 {
            self.status.repeats_dropped(dropped as u64);
            tracing::info!(parent = %self.key.parent, partition = self.key.partition,
                child = %self.key.child, records = dropped, from = slab.delivery.origin.slab_start,
                "records of a slab repeated after a restart are already in the child: not committed again");
        }
        read
    }

    /// Most slabs committed together ([`FanoutTiming::slabs_per_commit`], at least 1).
    fn slabs_per_commit(&self) -> usize {
        self.deps.timing.slabs_per_commit.max(1)
    }

    /// Where a slab starting at `slab_start` comes from, for its child frames.
    fn origin(&self, epoch: [u8; 8], slab_start: u64) -> SlabOrigin {
        SlabOrigin {
            epoch,
            parent_partition: self.key.partition,
            slab_start,
        }
    }

    /// Reads up to [`FanoutTiming::slabs_per_commit`] slabs from `from`, one after another,
    /// stopping after one that brings no records or reaches the parent's end, and routes each
    /// slab of records ([`Cursor::route_ahead`]).
    async fn read_and_route_ahead(
        &self,
        mut from: u64,
        delay_ms: u64,
        epoch: [u8; 8],
    ) -> Result<VecDeque<Ahead>, CursorExit> {
        let up_to = self.slabs_per_commit();
        let mut reads = VecDeque::with_capacity(up_to);
        while reads.len() < up_to {
            let read = self.without_held(Ahead::from_read(
                self.read(from, delay_ms).await?,
                self.origin(epoch, from),
            ));
            let after = match &read {
                Ahead::Slab {
                    slab,
                    high_watermark,
                } => Some(slab.delivery.end).filter(|after| after < high_watermark),
                _ => None,
            };
            reads.push_back(read);
            match after {
                Some(after) => from = after,
                None => break,
            }
        }
        for read in &mut reads {
            if let Ahead::Slab { slab, .. } = read {
                slab.routed = self.route_ahead(&mut slab.delivery).await;
            }
        }
        Ok(reads)
    }

    /// Waits while the link has this cursor's partition paused, keeping its lag current
    /// (records keep arriving in the parent) and carrying out operators' seeks. Returns the
    /// position to go on from.
    async fn while_paused(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        mut next: u64,
    ) -> Result<u64, CursorExit> {
        tracing::info!(parent = %self.parent, child = %self.key.child, next_offset = next, "cursor paused");
        self.status.paused();
        loop {
            // Armed before the check, so a resume or a seek between the check and the wait
            // still wakes it.
            let resumed = self.link.changed.notified();
            let seek = self.status.seek_ordered();
            tokio::pin!(resumed, seek);
            resumed.as_mut().enable();
            seek.as_mut().enable();
            if !self.current_link()?.paused.contains(&self.key.partition) {
                break;
            }
            let store = Arc::clone(&self.deps.store);
            let parent = self.parent.clone();
            let bounds = crate::blocking::run(move || {
                let high = store.high_watermark(&parent)?;
                let start = store.peek(&parent)?.log_start_offset;
                Ok::<_, StorageError>((start, high))
            })
            .await;
            if let Ok(Ok((start, high))) = bounds {
                self.status.set_position(next, high);
                if let Some(order) = self.status.take_seek() {
                    let done = self
                        .seek(offsets, gaps, next, order.offset, start, high)
                        .await;
                    if let Ok(done) = &done {
                        next = done.to;
                        self.status.set_position(next, high);
                    }
                    let _ = order.reply.send(done);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(PAUSED_LAG_EVERY) => {}
                _ = resumed => {}
                _ = seek => {}
                _ = self.stop.wait() => return Err(CursorExit::Stopped),
            }
        }
        tracing::info!(parent = %self.parent, child = %self.key.child, next_offset = next, "cursor resumed");
        self.status.running();
        Ok(next)
    }

    /// An operator's seek of this paused cursor from `from` to `to`, within the parent's
    /// records `[start, high]`: written to the offset file before it is reported done.
    async fn seek(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        from: u64,
        to: u64,
        start: u64,
        high: u64,
    ) -> Result<super::status::SeekDone, SeekError> {
        if to < start || to > high {
            return Err(SeekError::OutOfRange {
                parent: self.parent.clone(),
                to,
                start,
                high,
            });
        }
        let skipped = to.saturating_sub(from);
        if skipped > 0 {
            // On record before the move: a crash in between leaves the range on record and
            // the position before it, and the skip is the operator's to order again.
            gaps.record(from, to, GapReason::Seek, &self.status).await?;
        }
        offsets.seek(to).await?;
        tracing::warn!(parent = %self.parent, child = %self.key.child, from, to, skipped,
            replayed = from.saturating_sub(to), "operator seek of a paused cursor: position moved on purpose");
        Ok(super::status::SeekDone {
            partition: self.key.partition,
            from,
            to,
            skipped,
        })
    }

    /// (5) Advance: moves the offset file past a delivered slab (retrying until it can). With
    /// [`Durability::Now`] the position on file is durable on return, also when there is no
    /// slab to move past (an earlier coalesced move is synced).
    async fn save(
        &self,
        offsets: &OffsetFile,
        slab: Option<&Delivered>,
        durability: Durability,
    ) -> Result<(), CursorExit> {
        loop {
            let saved = match (slab, durability) {
                (Some(slab), _) => {
                    offsets
                        .past_slab(&slab.acknowledged, slab.end, durability)
                        .await
                }
                (None, Durability::Now) => offsets.flush().await,
                (None, Durability::Coalesced) => return Ok(()),
            };
            match saved {
                Ok(()) => return Ok(()),
                Err(e) => self.stall(e.to_string()).await?,
            }
        }
    }

    /// Steps 2 to 4 for consecutive slabs (`slabs[0]` first) committed together: each is
    /// routed and bucketed on its own (unless it was routed ahead and that still holds), then
    /// their buckets go to each child partition in one commit, in slab order
    /// ([`commit_slabs`]). What is not acknowledged then goes round
    /// again slab by slab, in slab order ([`Cursor::finish`]); a slab whose routing
    /// failed, and every slab after it, are delivered that way too. Returns once every slab
    /// is acknowledged.
    async fn deliver_together(
        &self,
        mut slabs: Vec<AheadSlab>,
        on_stall: impl FnOnce(),
    ) -> Result<Acknowledged, CursorExit> {
        // Every batch of the commit names its first slab's start: a later slab's batch can
        // land on one child partition while an earlier slab's fails on another, so only
        // that start is safe to resume from when the offset file is lost.
        if let Some(start) = slabs.first().map(|s| s.delivery.origin.slab_start) {
            for slab in &mut slabs {
                slab.resume_at(start);
            }
        }
        let mut routed = Vec::with_capacity(slabs.len());
        let mut deliveries = Vec::with_capacity(slabs.len());
        // False once a slab could not be routed: it and the ones after it go one by one.
        let mut routing = true;
        for AheadSlab {
            mut delivery,
            routed: ahead,
        } in slabs
        {
            if routing {
                // Routed while the commit before ran: used if the link is still this
                // cursor's and the child still has the partition count it was routed under.
                let buckets = match ahead {
                    Some(ahead) if self.still_routes(&ahead).await? => Some(ahead.buckets),
                    _ => self.route_slab(&mut delivery).await?,
                };
                match buckets {
                    Some(buckets) => routed.push(buckets),
                    None => routing = false,
                }
            }
            deliveries.push(delivery);
        }
        let mut answers: Vec<_> = commit_slabs(routed, &self.committer, &self.deps.timing)
            .await
            .into_iter()
            .map(Some)
            .collect();
        // Before any slab waits for its retry: every failed slab keeps copies of just its
        // failed records, and every acknowledged one lets go of its records, so a stalled
        // commit pins none of the parent's read buffers (each may hold a whole stored frame).
        let mut failed_any = false;
        for (delivery, answer) in deliveries.iter_mut().zip(&answers) {
            match answer {
                Some(Ok(_)) => delivery.pending = Arc::new(Vec::new()),
                Some(Err(failed)) => {
                    keep_failed(delivery, failed);
                    failed_any = true;
                }
                None => {}
            }
        }
        if failed_any {
            on_stall();
        }
        answers.resize_with(deliveries.len(), || None);
        let mut answers = answers.into_iter();
        let (first, more) = deliveries.split_at_mut(1);
        let mut acknowledged = self.settle(&mut first[0], answers.next().flatten()).await?;
        for delivery in more {
            acknowledged = self.settle(delivery, answers.next().flatten()).await?;
        }
        Ok(acknowledged)
    }

    /// Takes one slab of [`Cursor::deliver_together`] from its commit's `answer` (`None`:
    /// not committed yet; a failure's records already kept by [`keep_failed`]) to
    /// acknowledged.
    async fn settle(
        &self,
        delivery: &mut Delivery,
        answer: Option<Result<Acknowledged, super::commit::Failed>>,
    ) -> Result<Acknowledged, CursorExit> {
        match answer {
            Some(Ok(acknowledged)) => Ok(acknowledged),
            Some(Err(failed)) => {
                self.after_failure(delivery, failed).await?;
                self.unless_paused()?;
                self.finish(delivery).await
            }
            None => self.finish(delivery).await,
        }
    }

    /// Steps 2 to 4 for the records of one slab: check the epoch, route under the child's
    /// current partition count, bucket, commit; the records of failed buckets (only those)
    /// go round again after the back-off, until every one is acknowledged.
    async fn finish(&self, delivery: &mut Delivery) -> Result<Acknowledged, CursorExit> {
        loop {
            let Some(buckets) = self.route_slab(delivery).await? else {
                self.unless_paused()?;
                continue;
            };
            match commit(buckets, &self.committer, &self.deps.timing).await {
                Ok(acknowledged) => return Ok(acknowledged),
                Err(failed) => {
                    self.commit_failed(delivery, failed).await?;
                    self.unless_paused()?;
                }
            }
        }
    }

    /// After a failed try of a slab: [`CursorExit::PausedWhileStalled`] if an operator has
    /// paused this cursor meanwhile. A healthy cursor finishes its slab before it pauses; a
    /// stalled one would never get there, and pausing it is how an operator gets past a
    /// slab that cannot be delivered (a seek while paused).
    fn unless_paused(&self) -> Result<(), CursorExit> {
        match self.current_link()?.paused.contains(&self.key.partition) {
            true => Err(CursorExit::PausedWhileStalled),
            false => Ok(()),
        }
    }

    /// Steps 2 and 3 for what is left of a slab, once: check the epoch, route under the
    /// child's current partition count, bucket. `None` when that failed for now (the cursor
    /// has stalled for the back-off already): the caller tries again.
    async fn route_slab(
        &self,
        delivery: &mut Delivery,
    ) -> Result<Option<Vec<super::bucket::Bucket>>, CursorExit> {
        self.check_stop()?;
        let view = match link_view(self.deps.metastore.as_ref(), &self.key).await {
            Ok(Some(view)) => view,
            Ok(None) => return Err(self.gone_detached()),
            Err(e) => {
                self.stall(format!("cannot read the link: {e}")).await?;
                return Ok(None);
            }
        };
        loop {
            if delivery.pending.is_empty() {
                // Every record left was set aside: nothing for the child.
                return Ok(Some(Vec::new()));
            }
            let failure = match self.route_under(delivery, &view).await {
                Ok(buckets) => return Ok(Some(buckets)),
                Err(failure) => failure,
            };
            delivery.attempt = delivery.attempt.saturating_add(1);
            let dead_letter = self.current_link()?.dead_letter.clone();
            match (dead_letter, failure.poison.as_ref().filter(|p| p.alone)) {
                (Some(topic), Some(poison)) => {
                    if let Err(reason) = self.set_aside(delivery, &topic, poison).await {
                        self.stall(format!("{failure}; setting it aside failed: {reason}"))
                            .await?;
                        return Ok(None);
                    }
                    // The rest of the slab is routed again at once.
                }
                _ => {
                    self.route_failed(&failure).await?;
                    return Ok(None);
                }
            }
        }
    }

    /// Commits the record `poison` names to the dead-letter `topic` and takes it out of the
    /// slab ([`super::dead_letter`]).
    async fn set_aside(
        &self,
        delivery: &mut Delivery,
        topic: &str,
        poison: &super::route::PoisonFound,
    ) -> Result<(), dead_letter::DeadLetterError> {
        let Some(index) = delivery
            .pending
            .iter()
            .position(|r| r.offset == poison.offset)
        else {
            return Err(dead_letter::DeadLetterError::NotInSlab {
                offset: poison.offset,
            });
        };
        let letter = dead_letter::letter(&delivery.pending[index], &self.key, poison);
        let target = dead_letter::commit_letter(
            &self.committer,
            self.deps.metastore.as_ref(),
            topic,
            letter,
            delivery.origin,
        )
        .await?;
        let mut rest = (*delivery.pending).clone();
        rest.remove(index);
        delivery.pending = Arc::new(rest);
        self.status.dead_lettered();
        self.status.route_failed();
        tracing::warn!(parent = %self.key.parent, partition = self.key.partition, child = %self.key.child,
            offset = poison.offset, plugin = %poison.plugin, kind = %poison.kind, error = %poison.error,
            dead_letter = %target, "a record the router chain cannot route was set aside in the dead-letter topic");
        Ok(())
    }

    /// Steps 2 and 3 for a slab read ahead, while the commit before it runs: as
    /// [`Cursor::route_slab`], but whatever goes wrong (the link gone or unreadable, the
    /// routing failed) leaves the slab to be routed again in its turn, which reports it.
    async fn route_ahead(&self, delivery: &mut Delivery) -> Option<RoutedAhead> {
        if self.stop.is_triggered() {
            return None;
        }
        let view = link_view(self.deps.metastore.as_ref(), &self.key)
            .await
            .ok()
            .flatten()?;
        match self.route_under(delivery, &view).await {
            Ok(buckets) => Some(RoutedAhead {
                buckets,
                child_partitions: view.child_partitions,
            }),
            Err(_) => {
                // A failed try all the same: the next one gets the next attempt number.
                delivery.attempt = delivery.attempt.saturating_add(1);
                None
            }
        }
    }

    /// Whether buckets routed ahead may still be committed: the link is still this cursor's
    /// (else the cursor exits, as [`Cursor::route_slab`] would) and its child has the
    /// partition count they were routed under. `false` also when the link cannot be read now:
    /// the slab is routed again in its turn, which stalls on that.
    async fn still_routes(&self, ahead: &RoutedAhead) -> Result<bool, CursorExit> {
        self.check_stop()?;
        match link_view(self.deps.metastore.as_ref(), &self.key).await {
            Ok(Some(view)) => Ok(view.child_partitions == ahead.child_partitions),
            Ok(None) => Err(self.gone_detached()),
            Err(_) => Ok(false),
        }
    }

    /// Routes and buckets what is left of `delivery` once, under `view`; the link's shadow is
    /// offered the slab at its first successful routing.
    async fn route_under(
        &self,
        delivery: &mut Delivery,
        view: &LinkView,
    ) -> Result<Vec<super::bucket::Bucket>, RouteFailure> {
        let input = view.route_input(&self.key, delivery.attempt);
        // The shadow sees the slab once, whole: at its first successful routing, not at the
        // re-routings of failed buckets.
        let shadow = if delivery.offered {
            None
        } else {
            self.link.shadow()
        };
        let (mode, shadow_input) = match &shadow {
            Some(_) => (Mode::RouteAndFuel, Some(input.clone())),
            None => (Mode::Route, None),
        };
        let pending = &delivery.pending;
        let (decisions, cost) =
            route_measured(&self.link.router, input, Arc::clone(pending), mode).await;
        let (child, partitions) = (&self.key.child, view.child_partitions);
        let decisions = decisions?;
        let buckets = bucket(pending, &decisions, child, partitions, delivery.origin)?;
        if let (Some(shadow), Some(input)) = (shadow, shadow_input) {
            // Never waits: a busy shadow counts the slab as skipped.
            shadow.offer(ShadowSlab {
                input,
                records: Arc::clone(pending),
                decisions,
                cost,
            });
            delivery.offered = true;
        }
        Ok(buckets)
    }

    /// Some buckets of a slab were not acknowledged: keeps (copies of) just their records
    /// for the next try ([`keep_failed`]), then [`Cursor::after_failure`].
    async fn commit_failed(
        &self,
        delivery: &mut Delivery,
        failed: super::commit::Failed,
    ) -> Result<(), CursorExit> {
        keep_failed(delivery, &failed);
        self.after_failure(delivery, failed).await
    }

    /// After a failed try whose records are kept: reports the stall and backs off (longer and
    /// longer for a remote target that keeps failing). Buckets held back only behind an
    /// earlier slab's failure go again at once: that slab has been delivered by then.
    async fn after_failure(
        &self,
        delivery: &mut Delivery,
        failed: super::commit::Failed,
    ) -> Result<(), CursorExit> {
        use super::commit::CommitFailure;
        let only_behind = failed
            .errors
            .iter()
            .all(|e| matches!(e, CommitFailure::Behind { .. }));
        if only_behind {
            return Ok(());
        }
        self.status.commit_retried(failed.errors.len() as u64);
        let remote = |permanent_only: bool| {
            failed.errors.iter().any(|e| match e {
                CommitFailure::Commit {
                    error: ChildCommitError::Remote { permanent, .. },
                    ..
                } => *permanent || !permanent_only,
                _ => false,
            })
        };
        let (refused, remote) = (remote(true), remote(false));
        // The longest wait a target asked for (`Retry-After`), if any did.
        let asked = failed
            .errors
            .iter()
            .filter_map(|e| match e {
                CommitFailure::Commit {
                    error: ChildCommitError::Remote { retry_after, .. },
                    ..
                } => *retry_after,
                _ => None,
            })
            .max();
        let reason = failed.reason();
        if let Some(unlogged) = self.stall_log.admit(&reason, std::time::Instant::now()) {
            tracing::warn!(parent = %self.key.parent, partition = self.key.partition, child = %self.key.child,
                failed = failed.indices.len(), %reason, unlogged_retries = unlogged,
                "child commits failed; retrying those buckets (logged again in a minute if this goes on)");
        }
        if refused {
            self.status.stalled_refused(reason);
        } else {
            self.status.stalled(reason);
        }
        // A remote target that is down or refusing is asked less and less often; a local
        // child partition keeps the reference's steady back-off.
        let backoff = match remote {
            true => {
                delivery.remote_failures = delivery.remote_failures.saturating_add(1);
                let backoff = self.deps.timing.remote_backoff(delivery.remote_failures);
                asked.map_or(backoff, |asked| backoff.max(asked))
            }
            false => self.deps.timing.retry_backoff,
        };
        self.pause(backoff).await
    }

    /// Reads the next slab at `from` through the delay gate, unless the cursor is stopped.
    async fn read(
        &self,
        from: u64,
        delay_ms: u64,
    ) -> Result<Result<SlabRead, SlabError>, CursorExit> {
        let clock = Arc::clone(&self.deps.clock);
        let gate = move || gate::max_committed_at(clock.now_ms(), delay_ms);
        let store = &self.deps.store;
        tokio::select! {
            read = read_slab(store, &self.parent, from, &gate, &self.deps.timing) => Ok(read),
            _ = self.stop.wait() => Err(CursorExit::Stopped),
        }
    }

    /// The link's metadata, if the cursor is still to run under it.
    fn current_link(&self) -> Result<Arc<LinkMeta>, CursorExit> {
        self.check_stop()?;
        let meta = self.link.meta();
        if meta.attach_epoch != self.key.epoch {
            return Err(CursorExit::LinkGone(LinkGone::Reattached {
                parent: self.key.parent.clone(),
                child: self.key.child.clone(),
            }));
        }
        Ok(meta)
    }

    fn check_stop(&self) -> Result<(), CursorExit> {
        match self.stop.is_triggered() {
            true => Err(CursorExit::Stopped),
            false => Ok(()),
        }
    }

    fn gone_detached(&self) -> CursorExit {
        CursorExit::LinkGone(LinkGone::DetachedOrReattached {
            parent: self.key.parent.clone(),
            child: self.key.child.clone(),
        })
    }

    /// The cursor is healthy at `next_offset` with the parent at `high_watermark`.
    fn healthy_at(&self, next_offset: u64, high_watermark: u64) {
        self.stall_log.reset();
        self.status.set_position(next_offset, high_watermark);
        self.status.set_due_lag(0.0);
        self.status.running();
    }

    /// A read that brought no records: idle at the parent's tail, a delay cursor's next
    /// record not due yet, or a position that aged out of the parent.
    async fn nothing_to_copy(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        from: u64,
        delay_ms: u64,
        why: NoRecords,
    ) -> Result<(), CursorExit> {
        match why {
            NoRecords::Idle { high_watermark } => {
                self.healthy_at(from, high_watermark);
                Ok(())
            }
            NoRecords::NotDue {
                committed_at_ms,
                high_watermark,
            } => {
                self.wait_until_due(from, high_watermark, committed_at_ms, delay_ms)
                    .await
            }
            NoRecords::BelowLogStart { log_start } => {
                self.skip_aged_out(offsets, gaps, from, log_start).await
            }
        }
    }

    /// A read that failed: past the parent's end means the parent lost records the cursor
    /// had copied (it goes back to the end); anything else stalls and reads again later.
    async fn read_failed(
        &self,
        offsets: &OffsetFile,
        from: u64,
        error: SlabError,
    ) -> Result<(), CursorExit> {
        match error {
            SlabError::Storage(StorageError::OffsetBeyondEnd { high_watermark, .. })
                if high_watermark < from =>
            {
                self.back_to_parent_end(offsets, from, high_watermark).await
            }
            error => {
                self.stall(format!("reading {} at {from} failed: {error}", self.parent))
                    .await
            }
        }
    }

    /// A delay cursor whose next record is not due: sleeps until it is (at most the timing's
    /// cap), then the loop reads again through the gate.
    async fn wait_until_due(
        &self,
        from: u64,
        high_watermark: u64,
        committed_at_ms: i64,
        delay_ms: u64,
    ) -> Result<(), CursorExit> {
        self.status.set_position(from, high_watermark);
        self.status.set_due_lag(0.0);
        self.status.waiting();
        let now_ms = self.deps.clock.now_ms();
        let cap = self.deps.timing.delay_max_sleep;
        let wait = gate::sleep_until_due(committed_at_ms, delay_ms, now_ms, cap);
        // Wake at least a millisecond later so the gate has moved past the record.
        self.pause(wait.max(Duration::from_millis(1))).await
    }

    /// The position aged out of the parent: skip to its log start, counting the records lost,
    /// unless the link halts on a gap the operator has not accepted.
    async fn skip_aged_out(
        &self,
        offsets: &OffsetFile,
        gaps: &GapBook,
        from: u64,
        log_start: u64,
    ) -> Result<(), CursorExit> {
        if !self.current_link()?.may_skip_gap(self.key.partition, from) {
            return self.halt_before_gap(from, log_start).await;
        }
        let dropped = log_start.saturating_sub(from);
        tracing::warn!(parent = %self.parent, child = %self.key.child, from, to = log_start, dropped,
            "the cursor's position is below the parent's log start (records aged out by \
             retention, or the partition was re-created after a loss); skipping them, counted \
             as dropped");
        // On record before the move (see `gap_book`): never a skip that is not on record.
        if let Err(e) = gaps
            .record(from, log_start, GapReason::Retention, &self.status)
            .await
        {
            return self.stall(e.to_string()).await;
        }
        match offsets.past_aged_out(log_start).await {
            Ok(()) => {
                self.status.set_position(log_start, log_start);
                self.status.running();
                Ok(())
            }
            Err(e) => self.stall(e.to_string()).await,
        }
    }

    /// `on_gap: halt`: stays before the records `[from, log_start)` that aged out, reporting
    /// them, until the link changes (an acceptance, a pause, a new policy) or a back-off
    /// passes; the loop then reads again, so records restored in the parent are copied and
    /// nothing is skipped without the operator's word.
    async fn halt_before_gap(&self, from: u64, log_start: u64) -> Result<(), CursorExit> {
        let gap = HaltedGap {
            from,
            to: log_start,
        };
        if self.status.report().halted_gap != Some(gap) {
            tracing::warn!(parent = %self.parent, child = %self.key.child, from, to = log_start,
                lost = log_start.saturating_sub(from),
                "halted: records the cursor has not copied aged out of the parent; the link \
                 halts on a gap, so nothing is skipped until an operator accepts it");
        }
        let changed = self.link.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        self.status.halted(
            gap,
            format!(
                "halted before parent offsets {from} to {log_start} ({} records): they aged out \
                 of {} before they were copied; accept the loss with `narad child resume {} {} \
                 --accept-gap`, or pause and seek",
                log_start.saturating_sub(from),
                self.parent,
                self.key.parent,
                self.key.child
            ),
        );
        tokio::select! {
            _ = tokio::time::sleep(self.deps.timing.retry_backoff) => Ok(()),
            _ = changed => Ok(()),
            _ = self.stop.wait() => Err(CursorExit::Stopped),
        }
    }

    /// The parent's log got shorter under the cursor (reopened after a crash or repair): go
    /// back to its end rather than wait for offsets it will reuse. Counted once it is
    /// durable: a failed write is retried on the next read.
    async fn back_to_parent_end(
        &self,
        offsets: &OffsetFile,
        from: u64,
        high: u64,
    ) -> Result<(), CursorExit> {
        match offsets.back_to_parent_end(high).await {
            Ok(()) => {
                position::note_parent_end_rewind(from, high, &self.key, &self.status);
                self.status.set_position(high, high);
                self.status.running();
                Ok(())
            }
            Err(e) => self.stall(e.to_string()).await,
        }
    }

    /// Counts and reports a slab the router could not route, then backs off.
    async fn route_failed(&self, failure: &RouteFailure) -> Result<(), CursorExit> {
        self.status.route_failed();
        let reason = failure.to_string();
        if let Some(unlogged) = self.stall_log.admit(&reason, std::time::Instant::now()) {
            tracing::warn!(parent = %self.key.parent, partition = self.key.partition, child = %self.key.child,
                failure = %reason, unlogged_retries = unlogged,
                "slab not routed; retrying (logged again in a minute if this goes on)");
        }
        self.stall(format!("routing failed: {failure}")).await
    }

    /// Reports `reason` as the cursor's stall and backs off before the step is tried again.
    async fn stall(&self, reason: String) -> Result<(), CursorExit> {
        self.status.stalled(reason);
        self.pause(self.deps.timing.retry_backoff).await
    }

    /// Sleeps `duration`, or exits early if the cursor is told to stop.
    async fn pause(&self, duration: Duration) -> Result<(), CursorExit> {
        tokio::select! {
            _ = tokio::time::sleep(duration) => Ok(()),
            _ = self.stop.wait() => Err(CursorExit::Stopped),
        }
    }
}

/// Keeps (copies of) just the records of `delivery` that `failed` names, for the next try:
/// copied off the parent's read buffers the first time, shared after that.
fn keep_failed(delivery: &mut Delivery, failed: &super::commit::Failed) {
    delivery.pending = Arc::new(failed.retained(&delivery.pending, delivery.copied));
    delivery.copied = true;
    delivery.attempt = delivery.attempt.saturating_add(1);
}

/// How the commit that a read ahead runs beside is going.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CommitState {
    /// Under way, no failure yet.
    Running,
    /// A try failed: the read ahead is dropped rather than held through the stall.
    Stalled,
    /// Delivered without a failure: the read ahead is used.
    Delivered,
}

/// A read made ahead of its turn (during the commit before it).
enum Ahead {
    /// A slab of records, routed ahead when that worked.
    Slab {
        slab: AheadSlab,
        /// The parent's high watermark when it was read.
        high_watermark: u64,
    },
    /// No records there (why), handled in its turn.
    Nothing(NoRecords),
    /// The read failed, handled in its turn.
    Failed(SlabError),
}

impl Ahead {
    /// The read of the slab that starts where `origin` says.
    fn from_read(read: Result<SlabRead, SlabError>, origin: SlabOrigin) -> Ahead {
        match read {
            Ok(SlabRead::Records {
                records,
                high_watermark,
            }) => Ahead::Slab {
                slab: AheadSlab {
                    delivery: Delivery::new(records, origin),
                    routed: None,
                },
                high_watermark,
            },
            Ok(SlabRead::Nothing(why)) => Ahead::Nothing(why),
            Err(e) => Ahead::Failed(e),
        }
    }
}

/// A slab to deliver, with its buckets when it was routed ahead.
struct AheadSlab {
    delivery: Delivery,
    routed: Option<RoutedAhead>,
}

impl AheadSlab {
    /// Names `start` as where a cursor that lost its offset file resumes, in the origin of
    /// every batch of this slab (those routed ahead included).
    fn resume_at(&mut self, start: u64) {
        self.delivery.origin.slab_start = start;
        for bucket in self.routed.iter_mut().flat_map(|r| r.buckets.iter_mut()) {
            bucket.origin.slab_start = start;
        }
    }
}

/// The buckets of a slab routed ahead, and the child's partition count they were routed
/// under.
struct RoutedAhead {
    buckets: Vec<super::bucket::Bucket>,
    child_partitions: u32,
}

/// One slab on its way to the child: the records not yet acknowledged, and how its tries
/// went.
struct Delivery {
    /// The slab's records not known to be committed (all of them at first).
    pending: Arc<Vec<StoredRecord>>,
    /// Whether `pending` holds copies (made when a try failed) rather than slices of the
    /// parent's read buffers.
    copied: bool,
    /// Past the slab's last record as read (its records already held by the child, or
    /// committed, may be gone from `pending`).
    end: u64,
    origin: SlabOrigin,
    /// The routing attempt number the next try hands the plugins.
    attempt: u32,
    /// Failed tries of this slab at a remote target, for the doubling back-off.
    remote_failures: u32,
    /// Whether the link's shadow has been offered the slab.
    offered: bool,
}

impl Delivery {
    fn new(records: Vec<StoredRecord>, origin: SlabOrigin) -> Delivery {
        let end = records
            .last()
            .map_or(origin.slab_start, |r| r.offset.saturating_add(1));
        Delivery {
            end,
            pending: Arc::new(records),
            copied: false,
            origin,
            attempt: 0,
            remote_failures: 0,
            offered: false,
        }
    }
}

/// The link as a routing attempt sees it.
struct LinkView {
    child_partitions: u32,
    parent_partitions: u32,
    config: Vec<u8>,
}

impl LinkView {
    fn route_input(&self, key: &CursorKey, attempt: u32) -> RouteInput {
        RouteInput {
            parent_topic: key.parent.clone(),
            parent_partition: key.partition,
            parent_partition_count: self.parent_partitions,
            child_topic: key.child.clone(),
            child_partition_count: self.child_partitions,
            attempt,
            config: self.config.clone(),
        }
    }
}

/// Reads the link's current state from the metastore: `None` when the cursor's epoch is no
/// longer the link's (or a topic is gone), else the partition counts and config to route with.
/// It reads the one link and its two topics ([`Metastore::link_view`]), not a snapshot of all
/// the metadata: this runs before every routing attempt of every cursor.
async fn link_view(
    metastore: &dyn Metastore,
    key: &CursorKey,
) -> Result<Option<LinkView>, MetastoreError> {
    let found = metastore.link_view(&key.parent, &key.child).await?;
    Ok(found
        .filter(|found| found.link.attach_epoch == key.epoch)
        .map(|found| LinkView {
            child_partitions: found.child.partitions,
            parent_partitions: found.parent.partitions,
            config: found.link.config.into_bytes(),
        }))
}
