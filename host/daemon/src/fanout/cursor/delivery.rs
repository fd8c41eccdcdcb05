//! Delivery of routed slabs (steps 2 to 4) and the advance past them (step 5): commits, the
//! records of failed buckets kept for the next try, back-offs, and the offset file's moves.

use std::sync::Arc;

use narad_storage::StoredRecord;

use super::{AheadSlab, Cursor, CursorExit, Delivered};
use crate::fanout::advance::{Durability, OffsetFile};
use crate::fanout::bucket::SlabOrigin;
use crate::fanout::commit::{Acknowledged, commit, commit_slabs};
use crate::fanout::committer::ChildCommitError;

/// One slab on its way to the child: the records not yet acknowledged, and how its tries
/// went.
pub(super) struct Delivery {
    /// The slab's records not known to be committed (all of them at first).
    pub(super) pending: Arc<Vec<StoredRecord>>,
    /// Whether `pending` holds copies (made when a try failed) rather than slices of the
    /// parent's read buffers.
    pub(super) copied: bool,
    /// Past the slab's last record as read (its records already held by the child, or
    /// committed, may be gone from `pending`).
    pub(super) end: u64,
    pub(super) origin: SlabOrigin,
    /// The routing attempt number the next try hands the plugins.
    pub(super) attempt: u32,
    /// Failed tries of this slab at a remote target, for the doubling back-off.
    pub(super) remote_failures: u32,
    /// Whether the link's shadow has been offered the slab.
    pub(super) offered: bool,
}

impl Delivery {
    pub(super) fn new(records: Vec<StoredRecord>, origin: SlabOrigin) -> Delivery {
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

/// Keeps (copies of) just the records of `delivery` that `failed` names, for the next try:
/// copied off the parent's read buffers the first time, shared after that.
fn keep_failed(delivery: &mut Delivery, failed: &crate::fanout::commit::Failed) {
    delivery.pending = Arc::new(failed.retained(&delivery.pending, delivery.copied));
    delivery.copied = true;
    delivery.attempt = delivery.attempt.saturating_add(1);
}

impl Cursor {
    /// (5) Advance: moves the offset file past a delivered slab (retrying until it can). With
    /// [`Durability::Now`] the position on file is durable on return, also when there is no
    /// slab to move past (an earlier coalesced move is synced).
    pub(super) async fn save(
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
    pub(super) async fn deliver_together(
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
    pub(super) async fn settle(
        &self,
        delivery: &mut Delivery,
        answer: Option<Result<Acknowledged, crate::fanout::commit::Failed>>,
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
    pub(super) async fn finish(&self, delivery: &mut Delivery) -> Result<Acknowledged, CursorExit> {
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

    /// Some buckets of a slab were not acknowledged: keeps (copies of) just their records
    /// for the next try ([`keep_failed`]), then [`Cursor::after_failure`].
    pub(super) async fn commit_failed(
        &self,
        delivery: &mut Delivery,
        failed: crate::fanout::commit::Failed,
    ) -> Result<(), CursorExit> {
        keep_failed(delivery, &failed);
        self.after_failure(delivery, failed).await
    }

    /// After a failed try whose records are kept: reports the stall and backs off (longer and
    /// longer for a remote target that keeps failing). Buckets held back only behind an
    /// earlier slab's failure go again at once: that slab has been delivered by then.
    pub(super) async fn after_failure(
        &self,
        delivery: &mut Delivery,
        failed: crate::fanout::commit::Failed,
    ) -> Result<(), CursorExit> {
        use crate::fanout::commit::CommitFailure;
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
}
