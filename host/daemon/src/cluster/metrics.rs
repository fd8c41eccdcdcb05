//! Cluster health on `/metrics`: the node's lease, the live nodes it sees, and its watch of
//! the metadata. Registered on every daemon (zeros on a single node), so a dashboard and an
//! alert need not know the mode; fed once a second from the counters the parts keep.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ClusterContext;
use crate::shutdown::ShutdownSignal;

/// How often the series are brought up to date.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Every cluster series.
#[derive(Debug, Default)]
pub(crate) struct ClusterMetrics {
    /// `narad_cluster_live_nodes`.
    pub(crate) live_nodes: Gauge,
    /// `narad_cluster_fenced`.
    pub fenced: Gauge,
    /// `narad_cluster_lease_renewals_total`.
    pub(crate) lease_renewals: Counter,
    /// `narad_cluster_lease_renewal_failures_total`.
    pub(crate) lease_renewal_failures: Counter,
    /// `narad_cluster_watch_full_reads_total`.
    pub(crate) watch_full_reads: Counter,
    /// `narad_cluster_watch_resumes_total`.
    pub(crate) watch_resumes: Counter,
    /// `narad_cluster_watch_stalls_total`.
    pub(crate) watch_stalls: Counter,
    /// `narad_cluster_watch_compactions_total`.
    pub(crate) watch_compactions: Counter,
    /// `narad_cluster_commit_reused_origin_records_total`.
    pub(crate) reused_origin_records: Counter,
}

impl ClusterMetrics {
    /// Registers every series in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "narad_cluster_live_nodes",
            "Nodes of the cluster whose lease is alive, as this node's watched copy sees them (0 on a single node)",
            self.live_nodes.clone(),
        );
        registry.register(
            "narad_cluster_fenced",
            "1 while this node has not renewed its lease for 0.8 of its TTL: it refuses writes until it renews",
            self.fenced.clone(),
        );
        registry.register(
            "narad_cluster_lease_renewals",
            "Renewals of this node's lease that etcd confirmed",
            self.lease_renewals.clone(),
        );
        registry.register(
            "narad_cluster_lease_renewal_failures",
            "Renewals of this node's lease that failed or timed out (or a re-join after the lease was lost that failed)",
            self.lease_renewal_failures.clone(),
        );
        registry.register(
            "narad_cluster_watch_full_reads",
            "Full reads of the metadata by this node's watched copy: the first, and one after each compaction or failed resume",
            self.watch_full_reads.clone(),
        );
        registry.register(
            "narad_cluster_watch_resumes",
            "Watches of the metadata re-created from the last revision after they ended or failed",
            self.watch_resumes.clone(),
        );
        registry.register(
            "narad_cluster_watch_stalls",
            "Watches of the metadata dropped because they went silent (no event or progress answer)",
            self.watch_stalls.clone(),
        );
        registry.register(
            "narad_cluster_commit_reused_origin_records",
            "Records child commits brought to this node's partitions under the origin of a record they hold but with other content (the parent partition reused offsets: its log was lost or restored); appended, not dropped",
            self.reused_origin_records.clone(),
        );
        registry.register(
            "narad_cluster_watch_compactions",
            "Watches of the metadata that found their revision compacted away (the copy was read again)",
            self.watch_compactions.clone(),
        );
    }

    /// Brings the series up to date from `cluster` once a second until `shutdown`.
    pub(crate) async fn run(
        self: Arc<Self>,
        cluster: Arc<ClusterContext>,
        shutdown: ShutdownSignal,
    ) {
        let mut ticker = tokio::time::interval(REFRESH_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = Seen::default();
        loop {
            tokio::select! {
                () = shutdown.wait() => return,
                _ = ticker.tick() => {}
            }
            self.refresh(&cluster, &mut seen);
        }
    }

    fn refresh(&self, cluster: &ClusterContext, seen: &mut Seen) {
        self.live_nodes
            .set(i64::try_from(cluster.peers.live().len()).unwrap_or(i64::MAX));
        self.fenced.set(i64::from(cluster.membership.is_fenced()));
        advance(
            &self.lease_renewals,
            &mut seen.renewals,
            cluster.membership.renewals(),
        );
        advance(
            &self.lease_renewal_failures,
            &mut seen.renewal_failures,
            cluster.membership.renewal_failures(),
        );
        if let Some(health) = cluster.metastore.cache_health() {
            let read = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            advance(
                &self.watch_full_reads,
                &mut seen.full_reads,
                read(&health.full_reads),
            );
            advance(
                &self.watch_resumes,
                &mut seen.resumes,
                read(&health.resumes),
            );
            advance(&self.watch_stalls, &mut seen.stalls, read(&health.stalls));
            advance(
                &self.watch_compactions,
                &mut seen.compactions,
                read(&health.compactions),
            );
        }
    }
}

/// The source counters' values at the last refresh.
#[derive(Default)]
struct Seen {
    renewals: u64,
    renewal_failures: u64,
    full_reads: u64,
    resumes: u64,
    stalls: u64,
    compactions: u64,
}

/// Raises `counter` by what `now` grew since `last`.
fn advance(counter: &Counter, last: &mut u64, now: u64) {
    if now > *last {
        counter.inc_by(now - *last);
        *last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_follows_its_source_and_never_goes_back() {
        let counter = Counter::default();
        let mut last = 0;
        advance(&counter, &mut last, 3);
        advance(&counter, &mut last, 3);
        advance(&counter, &mut last, 5);
        // A source that restarted from zero (it never does) would not lower the counter.
        advance(&counter, &mut last, 1);
        assert_eq!(counter.get(), 5);
    }
}
