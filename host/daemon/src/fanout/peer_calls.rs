//! The bound on child commits under way to one other node.
//!
//! A commit to another node is an async call, so a node that hangs holds no thread; this
//! bound keeps it from holding more than [`COMMITS_IN_FLIGHT_PER_PEER`] calls (their sockets
//! and request bodies) as well. A commit that finds them all taken waits at most
//! [`COMMIT_TIMEOUT`] (as long as a call may take) for one, then fails as
//! [`ChildCommitError::PeerBusy`] and is retried by its cursor like any other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use narad_storage::PartitionId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::committer::ChildCommitError;
use super::metrics::{FanoutMetrics, PeerLabels};
use crate::cluster::commit_rpc::COMMIT_TIMEOUT;

/// Child commits under way to one node at most, from this node. Every cursor's 16 lanes
/// share them: a healthy owner answers in milliseconds, so they are rarely all taken.
pub(crate) const COMMITS_IN_FLIGHT_PER_PEER: usize = 64;

/// One semaphore per other node, made on first use.
#[derive(Debug)]
pub(crate) struct PeerCalls {
    limit: usize,
    /// How long a commit waits for a place.
    wait: Duration,
    peers: Mutex<HashMap<String, Arc<Semaphore>>>,
    metrics: Arc<FanoutMetrics>,
}

/// A call's place among those to one node, given back when it ends (the gauge follows).
#[derive(Debug)]
pub(crate) struct PeerCall {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<FanoutMetrics>,
    labels: PeerLabels,
}

impl Drop for PeerCall {
    fn drop(&mut self) {
        self.metrics
            .peer_commits_in_flight
            .get_or_create(&self.labels)
            .dec();
    }
}

impl PeerCalls {
    /// At most `limit` calls to each node at once, counted on
    /// `narad_fanout_peer_commits_in_flight`; a commit waits up to [`COMMIT_TIMEOUT`] for a
    /// place.
    pub(crate) fn new(limit: usize, metrics: Arc<FanoutMetrics>) -> PeerCalls {
        PeerCalls::waiting(limit, COMMIT_TIMEOUT, metrics)
    }

    /// [`PeerCalls::new`], a commit waiting up to `wait` for a place.
    fn waiting(limit: usize, wait: Duration, metrics: Arc<FanoutMetrics>) -> PeerCalls {
        PeerCalls {
            limit: limit.max(1),
            wait,
            peers: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// A place for one commit of `partition` to `node`, waited for at most the commit
    /// timeout (the longest a call under way may take to end).
    pub(crate) async fn enter(
        &self,
        node: &str,
        partition: &PartitionId,
    ) -> Result<PeerCall, ChildCommitError> {
        let semaphore = Arc::clone(
            self.peers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(node.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.limit))),
        );
        let busy = || ChildCommitError::PeerBusy {
            partition: partition.clone(),
            node: node.to_owned(),
            in_flight: self.limit,
        };
        let permit = match tokio::time::timeout(self.wait, semaphore.acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            // Timed out, or closed (never: the semaphore is not closed).
            _ => return Err(busy()),
        };
        let labels = PeerLabels {
            node: node.to_owned(),
        };
        self.metrics
            .peer_commits_in_flight
            .get_or_create(&labels)
            .inc();
        Ok(PeerCall {
            _permit: permit,
            metrics: Arc::clone(&self.metrics),
            labels,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_node_holding_every_place_makes_the_next_commit_wait_then_fail_and_others_pass() {
        let metrics = Arc::new(FanoutMetrics::default());
        let wait = Duration::from_millis(200);
        let calls = PeerCalls::waiting(2, wait, Arc::clone(&metrics));
        let partition = PartitionId::new("child", 3);
        let held = [
            calls.enter("n3", &partition).await.unwrap(),
            calls.enter("n3", &partition).await.unwrap(),
        ];
        let in_flight = |node: &str| {
            metrics
                .peer_commits_in_flight
                .get_or_create(&PeerLabels {
                    node: node.to_owned(),
                })
                .get()
        };
        assert_eq!(in_flight("n3"), 2);
        // Another node's calls are not held up by n3's.
        let other = calls.enter("n2", &partition).await.unwrap();
        assert_eq!(in_flight("n2"), 1);
        drop(other);
        assert_eq!(in_flight("n2"), 0);

        let started = std::time::Instant::now();
        let error = calls.enter("n3", &partition).await.unwrap_err();
        assert!(started.elapsed() >= wait);
        assert!(
            matches!(&error, ChildCommitError::PeerBusy { node, in_flight: 2, .. } if node == "n3"),
            "{error:?}"
        );
        assert_eq!(error.owner_node(), Some("n3"));

        // One call ends: the next waiting one gets its place.
        let [first, _second] = held;
        let waiting = tokio::spawn(async move {
            let calls = calls;
            calls
                .enter("n3", &PartitionId::new("child", 3))
                .await
                .map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        assert!(waiting.await.unwrap().is_ok());
    }
}
