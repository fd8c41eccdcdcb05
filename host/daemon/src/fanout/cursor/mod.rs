//! One fan-out cursor: the loop that takes a slab through its steps, until stopped.
//!
//! [`run_cursor`] opens the position ([`super::position`]), then loops: read a slab
//! ([`super::slab`]), and for its records check the epoch, route ([`super::route`]), bucket
//! ([`super::bucket`]) and commit ([`super::commit`]), sending the records of failed buckets
//! round again after the back-off, then advance ([`super::advance`]). Each step gets what it
//! needs as arguments and returns its result; none calls back into the loop. A step that
//! fails for now stalls the cursor (its reason in the status) for
//! [`crate::fanout::FanoutTiming::retry_backoff`] and is tried again; the cursor never skips a record.
//!
//! This file holds the loop and how one commit's slabs are gathered and delivered beside the
//! next reads; the rest of a cursor's work is one file per part: `exit` (why a cursor stops),
//! `ahead` (slabs read and routed while a commit runs), `routing` (steps 2 and 3), `delivery`
//! (steps 4 and 5, retries and back-offs), `no_records` (a read that found nothing) and
//! `paused` (a paused cursor and operators' seeks).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use narad_storage::PartitionId;

use super::advance::{Durability, OffsetFile};
use super::bucket::SlabOrigin;
use super::commit::Acknowledged;
use super::committer::ChildCommitter;
use super::gap_book::GapBook;
use super::position::{self, Opened};
use super::status::CursorStatus;
use crate::metastore::link::{LinkMeta, epoch_bytes};
use crate::shutdown::ShutdownSignal;

mod ahead;
mod delivery;
mod exit;
mod no_records;
mod paused;
mod routing;

use super::{CursorDeps, CursorKey, LinkRuntime};
use ahead::{Ahead, AheadSlab};
use delivery::Delivery;
pub use exit::{CursorExit, LinkGone};

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

    /// Steps 1 to 5, pipelined: the slabs of one commit (up to [`crate::fanout::FanoutTiming::slabs_per_commit`]
    /// consecutive slabs already read, their buckets for each child partition committed
    /// together) are delivered (routed, bucketed, committed) while the position past the
    /// slabs before them is written and the slabs after them are read, so the child's
    /// `fdatasync` and the offset file's overlap, and a backlog costs one child `fdatasync`
    /// per child partition per commit rather than per slab. Slabs that reach the parent's end
    /// have nothing after them to read: their position is written right after they are
    /// delivered. The offset file still moves only past slabs every bucket of which is
    /// acknowledged, in slab order: the position written in step N is the one past the
    /// slabs of commit N - 1, whose [`Acknowledged`] it holds. A cursor holds at most twice
    /// [`crate::fanout::FanoutTiming::slabs_per_commit`] slabs (those delivering and those read ahead).
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
            let (first, high_watermark) = match read {
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
            let oldest = first.delivery.pending.first().map(|r| r.committed_at_ms);
            let now_ms = self.deps.clock.now_ms();
            self.status.committing(oldest, delay_ms, now_ms);
            let Gathered {
                slabs,
                counts,
                last,
                high_watermark,
            } = self.gather(first, &mut ahead, high_watermark);
            // (2) to (4) for these slabs, (5) for the ones before, and (1) to (3) for the
            // ones after. At the parent's end there is nothing to read ahead (a read would
            // only wait for new records): the position is written as soon as the slabs are
            // delivered instead, so an idle cursor's file is never a commit behind.
            let at_end = last + 1 >= high_watermark;
            let before = unsaved.take();
            let read_from = (!at_end).then_some(last + 1);
            let (delivered, saved, read_ahead) = self
                .commit_together(offsets, slabs, before.as_ref(), read_from, delay_ms, epoch)
                .await;
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

    /// The slabs of one commit: `first`, then those read ahead that follow it (taken off
    /// `ahead`), up to [`Cursor::slabs_per_commit`] and not past the parent's end.
    fn gather(
        &self,
        first: AheadSlab,
        ahead: &mut VecDeque<Ahead>,
        mut high_watermark: u64,
    ) -> Gathered {
        // The slab's last offset, whatever of it was already held by the child.
        let mut last = first.delivery.end - 1;
        let mut counts = vec![first.delivery.pending.len()];
        let mut slabs = vec![first];
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
        Gathered {
            slabs,
            counts,
            last,
            high_watermark,
        }
    }

    /// Delivers `slabs` while the position past the slabs delivered `before` them is written
    /// and, from `read_from` when given, the next slabs are read and routed. What is read
    /// ahead is dropped if these slabs stall (it is read again once they are delivered), so a
    /// stalled cursor pins no parent read buffer. Returns the delivery, the write and the
    /// slabs read ahead.
    async fn commit_together(
        &self,
        offsets: &OffsetFile,
        slabs: Vec<AheadSlab>,
        before: Option<&Delivered>,
        read_from: Option<u64>,
        delay_ms: u64,
        epoch: [u8; 8],
    ) -> (
        Result<Acknowledged, CursorExit>,
        Result<(), CursorExit>,
        Result<VecDeque<Ahead>, CursorExit>,
    ) {
        let (commit_state, commit_seen) = tokio::sync::watch::channel(CommitState::Running);
        tokio::join!(
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
            self.save(offsets, before, Durability::Coalesced),
            async {
                let Some(from) = read_from else {
                    return Ok(VecDeque::new());
                };
                let reads = self.read_and_route_ahead(from, delay_ms, epoch).await?;
                let mut seen = commit_seen;
                match seen.wait_for(|s| *s != CommitState::Running).await {
                    Ok(state) if *state == CommitState::Delivered => Ok(reads),
                    _ => Ok(VecDeque::new()),
                }
            },
        )
    }

    /// Most slabs committed together ([`crate::fanout::FanoutTiming::slabs_per_commit`], at least 1).
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

/// The slabs of one commit, from [`Cursor::gather`].
struct Gathered {
    slabs: Vec<AheadSlab>,
    /// Records of each slab, for the status.
    counts: Vec<usize>,
    /// The last slab's last offset.
    last: u64,
    /// The parent's high watermark when the last slab was read.
    high_watermark: u64,
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
