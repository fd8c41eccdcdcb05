//! The read-ahead pipeline: while one commit runs, the next slabs are read and routed, and
//! handed to the loop in their turn (or dropped when that commit stalls).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::fanout::bucket::SlabOrigin;
use crate::fanout::gate;
use crate::fanout::slab::{NoRecords, SlabError, SlabRead, read_slab};

use super::routing::link_view;
use super::{Cursor, CursorExit, Delivery};

/// A read made ahead of its turn (during the commit before it).
pub(super) enum Ahead {
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
    pub(super) fn from_read(read: Result<SlabRead, SlabError>, origin: SlabOrigin) -> Ahead {
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
pub(super) struct AheadSlab {
    pub(super) delivery: Delivery,
    pub(super) routed: Option<RoutedAhead>,
}

impl AheadSlab {
    /// Names `start` as where a cursor that lost its offset file resumes, in the origin of
    /// every batch of this slab (those routed ahead included).
    pub(super) fn resume_at(&mut self, start: u64) {
        self.delivery.origin.slab_start = start;
        for bucket in self.routed.iter_mut().flat_map(|r| r.buckets.iter_mut()) {
            bucket.origin.slab_start = start;
        }
    }
}

/// The buckets of a slab routed ahead, and the child's partition count they were routed
/// under.
pub(super) struct RoutedAhead {
    pub(super) buckets: Vec<crate::fanout::bucket::Bucket>,
    pub(super) child_partitions: u32,
}

impl Cursor {
    /// `read` without the records the child already held when the cursor started (a slab
    /// repeated after a crash; [`position::Held`]), counted as deduplicated.
    ///
    /// [`position::Held`]: crate::fanout::position::Held
    pub(super) fn without_held(&self, mut read: Ahead) -> Ahead {
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

    /// Reads up to [`crate::fanout::FanoutTiming::slabs_per_commit`] slabs from `from`, one after another,
    /// stopping after one that brings no records or reaches the parent's end, and routes each
    /// slab of records ([`Cursor::route_ahead`]).
    pub(super) async fn read_and_route_ahead(
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

    /// Reads the next slab at `from` through the delay gate, unless the cursor is stopped.
    pub(super) async fn read(
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

    /// Steps 2 and 3 for a slab read ahead, while the commit before it runs: as
    /// [`Cursor::route_slab`], but whatever goes wrong (the link gone or unreadable, the
    /// routing failed) leaves the slab to be routed again in its turn, which reports it.
    pub(super) async fn route_ahead(&self, delivery: &mut Delivery) -> Option<RoutedAhead> {
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
    pub(super) async fn still_routes(&self, ahead: &RoutedAhead) -> Result<bool, CursorExit> {
        self.check_stop()?;
        match link_view(self.deps.metastore.as_ref(), &self.key).await {
            Ok(Some(view)) => Ok(view.child_partitions == ahead.child_partitions),
            Ok(None) => Err(self.gone_detached()),
            Err(_) => Ok(false),
        }
    }
}
