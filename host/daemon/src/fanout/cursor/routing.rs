//! Steps 2 and 3 of a slab: the epoch check, routing through the link's chain (and its shadow),
//! bucketing, and setting aside a record the chain cannot route.

use std::sync::Arc;

use super::{Cursor, CursorExit, CursorKey, Delivery};
use crate::fanout::bucket::bucket;
use crate::fanout::dead_letter;
use crate::fanout::route::{Mode, RouteFailure, RouteInput, route_measured};
use crate::fanout::shadow::ShadowSlab;
use crate::metastore::{Metastore, MetastoreError};

/// The link as a routing attempt sees it.
pub(super) struct LinkView {
    pub(super) child_partitions: u32,
    pub(super) parent_partitions: u32,
    pub(super) config: Vec<u8>,
}

impl LinkView {
    pub(super) fn route_input(&self, key: &CursorKey, attempt: u32) -> RouteInput {
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
pub(super) async fn link_view(
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

impl Cursor {
    /// Steps 2 and 3 for what is left of a slab, once: check the epoch, route under the
    /// child's current partition count, bucket. `None` when that failed for now (the cursor
    /// has stalled for the back-off already): the caller tries again.
    pub(super) async fn route_slab(
        &self,
        delivery: &mut Delivery,
    ) -> Result<Option<Vec<crate::fanout::bucket::Bucket>>, CursorExit> {
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
    /// slab ([`crate::fanout::dead_letter`]).
    pub(super) async fn set_aside(
        &self,
        delivery: &mut Delivery,
        topic: &str,
        poison: &crate::fanout::route::PoisonFound,
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

    /// Routes and buckets what is left of `delivery` once, under `view`; the link's shadow is
    /// offered the slab at its first successful routing.
    pub(super) async fn route_under(
        &self,
        delivery: &mut Delivery,
        view: &LinkView,
    ) -> Result<Vec<crate::fanout::bucket::Bucket>, RouteFailure> {
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

    /// Counts and reports a slab the router could not route, then backs off.
    pub(super) async fn route_failed(&self, failure: &RouteFailure) -> Result<(), CursorExit> {
        self.status.route_failed();
        let reason = failure.to_string();
        if let Some(unlogged) = self.stall_log.admit(&reason, std::time::Instant::now()) {
            tracing::warn!(parent = %self.key.parent, partition = self.key.partition, child = %self.key.child,
                failure = %reason, unlogged_retries = unlogged,
                "slab not routed; retrying (logged again in a minute if this goes on)");
        }
        self.stall(format!("routing failed: {failure}")).await
    }
}
