//! `GET /metrics`: every series in the Prometheus (OpenMetrics) text format, and the series the
//! API itself keeps: records and bytes produced and fetched per topic, and per-partition
//! storage figures read at scrape time.
//!
//! The storage gauges are filled at each scrape from `Store::peek`, which never opens a
//! closed log, so a scrape costs a few file-system metadata reads per partition and never
//! holds a log open. A partition whose high watermark is unknown without opening its log has
//! no `narad_partition_high_watermark` sample until the log is next opened. The recovered-cut
//! gauges come from the notes recovery keeps in a partition's `torn/` directory, so they
//! survive restarts and fall to 0 when the operator removes the kept-aside files: gauges, not
//! counters, for that reason.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use narad_storage::{PartitionId, PartitionState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::AppState;
use super::error::ApiError;

/// The content type of the OpenMetrics text format, which Prometheus scrapes natively.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of the per-topic traffic series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TopicLabels {
    /// Topic name.
    pub topic: String,
}

/// Labels of the per-partition storage series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PartitionLabels {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: u32,
}

/// Labels of `narad_kafka_group_members`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GroupLabels {
    /// Consumer group id.
    pub group: String,
}

/// Labels of `narad_kafka_group_lag_messages`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GroupPartitionLabels {
    /// Consumer group id.
    pub group: String,
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: u32,
}

/// Most `narad_kafka_group_lag_messages` series one scrape fills: beyond it the scrape would
/// cost more than the metric is worth (`narad group describe` still shows every partition).
pub(crate) const MAX_GROUP_LAG_SERIES: usize = 10_000;

/// Labels of `narad_forwarded_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ForwardLabels {
    /// `produce` or `fetch`.
    pub request: &'static str,
    /// `ok` (the owner answered, whatever its status), `owner_down` (the owner is not alive or
    /// refused the connection: nothing was sent) or `error` (no usable answer).
    pub outcome: &'static str,
}

/// Every `request` of `narad_forwarded_requests_total`.
pub(crate) const FORWARD_REQUESTS: [&str; 2] = ["produce", "fetch"];

/// Every `outcome` of `narad_forwarded_requests_total`.
pub(crate) const FORWARD_OUTCOMES: [&str; 3] = ["ok", "owner_down", "error"];

/// The API's own series.
#[derive(Debug, Default)]
pub(crate) struct ApiMetrics {
    /// `narad_produce_records_total`: records committed by produce requests.
    pub(crate) produce_records: Family<TopicLabels, Counter>,
    /// `narad_produce_bytes_total`: key + value + header bytes of those records.
    pub(crate) produce_bytes: Family<TopicLabels, Counter>,
    /// `narad_fetch_records_total`: records returned by fetch requests.
    pub(crate) fetch_records: Family<TopicLabels, Counter>,
    /// `narad_fetch_bytes_total`: key + value + header bytes of those records.
    pub(crate) fetch_bytes: Family<TopicLabels, Counter>,
    /// `narad_partition_size_bytes`: bytes of segment files.
    pub size_bytes: Family<PartitionLabels, Gauge<u64, AtomicU64>>,
    /// `narad_partition_segments`: segment files.
    pub segments: Family<PartitionLabels, Gauge<u64, AtomicU64>>,
    /// `narad_partition_log_start_offset`: oldest offset stored.
    pub log_start_offset: Family<PartitionLabels, Gauge<u64, AtomicU64>>,
    /// `narad_partition_high_watermark`: next offset to be written, when known.
    pub high_watermark: Family<PartitionLabels, Gauge<u64, AtomicU64>>,
    /// `narad_partition_unavailable`: 1 for a quarantined or failed partition.
    pub unavailable: Family<PartitionLabels, Gauge<u64, AtomicU64>>,
    /// `narad_partition_recovered_cut_records`: records in the torn tails recovery cut off and
    /// kept aside (a lower bound when some cut bytes had no readable header).
    pub(crate) recovered_cut_records: Family<PartitionLabels, Gauge<u64, AtomicU64>>,
    /// `narad_partition_recovered_cut_bytes`: bytes of those torn tails.
    pub(crate) recovered_cut_bytes: Family<PartitionLabels, Gauge<u64, AtomicU64>>,
    /// `narad_http_buffered_request_bytes`: request-body bytes counted against the budget now.
    pub(crate) buffered_request_bytes: Gauge<u64, AtomicU64>,
    /// `narad_http_body_budget_refusals_total`: requests answered 503 because the body budget
    /// was full.
    pub(crate) body_budget_refusals: Counter,
    /// `narad_http_buffered_peer_request_bytes`: bytes of other nodes' calls counted against
    /// the peers' budget now.
    pub(crate) buffered_peer_request_bytes: Gauge<u64, AtomicU64>,
    /// `narad_http_peer_body_budget_refusals_total`: other nodes' calls answered 503 because
    /// the peers' budget was full.
    pub(crate) peer_body_budget_refusals: Counter,
    /// `narad_http_requests_denied_total{reason}`: requests refused for who sent them
    /// (`unauthenticated`: 401, `forbidden`: 403 by the ACLs).
    pub(crate) denied: Family<super::principal::DeniedLabels, Counter>,
    /// `narad_forwarded_requests_total{request, outcome}`: calls to partition owners made for
    /// requests this node does not own (cluster mode; one per owner a produce reaches).
    pub forwarded: Family<ForwardLabels, Counter>,
    /// `narad_set_aside_entries`: directories in the set-aside area (read at scrape time).
    pub(crate) set_aside_entries: Gauge<u64, AtomicU64>,
    /// `narad_log_appends_total`: appends to partition logs (produce and child commits),
    /// brought up to the store's count at scrape time.
    pub(crate) log_appends: Counter,
    /// `narad_log_append_syncs_total`: the segment `fdatasync`s those appends took; fewer
    /// than the appends when appends to one partition arrived together (a group commit).
    pub(crate) log_append_syncs: Counter,
    /// `narad_kafka_group_members`: members of each group this node coordinates (read at
    /// scrape time).
    pub(crate) group_members: Family<GroupLabels, Gauge<u64, AtomicU64>>,
    /// `narad_kafka_group_lag_messages`: records between a group's committed offset and its
    /// partition's end, for the groups this node coordinates (read at scrape time).
    pub(crate) group_lag: Family<GroupPartitionLabels, Gauge<u64, AtomicU64>>,
    /// Serializes scrape-time refreshes so two scrapes never interleave clear and fill.
    refresh: tokio::sync::Mutex<()>,
}

impl ApiMetrics {
    /// Registers every series in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "narad_produce_records",
            "Records committed by produce requests (durable when counted)",
            self.produce_records.clone(),
        );
        registry.register(
            "narad_produce_bytes",
            "Key, value and header bytes of the records committed by produce requests",
            self.produce_bytes.clone(),
        );
        registry.register(
            "narad_fetch_records",
            "Records returned by fetch requests",
            self.fetch_records.clone(),
        );
        registry.register(
            "narad_fetch_bytes",
            "Key, value and header bytes of the records returned by fetch requests",
            self.fetch_bytes.clone(),
        );
        registry.register(
            "narad_partition_size_bytes",
            "Bytes of a partition's segment files on disk (read at scrape time)",
            self.size_bytes.clone(),
        );
        registry.register(
            "narad_partition_segments",
            "Segment files of a partition (read at scrape time)",
            self.segments.clone(),
        );
        registry.register(
            "narad_partition_log_start_offset",
            "Oldest offset a partition still stores (raised by retention)",
            self.log_start_offset.clone(),
        );
        registry.register(
            "narad_partition_high_watermark",
            "Next offset a partition will write; absent while unknown without opening a closed log",
            self.high_watermark.clone(),
        );
        registry.register(
            "narad_set_aside_entries",
            "Topic or partition directories start-up could not account for and moved, intact, to set-aside/ (see GET /v1/admin/set-aside)",
            self.set_aside_entries.clone(),
        );
        registry.register(
            "narad_log_appends",
            "Appends to partition logs (produce requests and child commits), each durable or failed as a whole",
            self.log_appends.clone(),
        );
        registry.register(
            "narad_log_append_syncs",
            "Segment fdatasyncs the appends took: appends arriving together at one partition share one (group commit)",
            self.log_append_syncs.clone(),
        );
        registry.register(
            "narad_partition_unavailable",
            "1 when a partition is quarantined (corruption found) or failed, else 0",
            self.unavailable.clone(),
        );
        registry.register(
            "narad_partition_recovered_cut_records",
            "Records recovery cut off a partition's torn tail and kept aside in torn/ (possibly acknowledged; 0 once the operator removes the kept-aside files)",
            self.recovered_cut_records.clone(),
        );
        registry.register(
            "narad_partition_recovered_cut_bytes",
            "Bytes recovery cut off a partition's torn tail and kept aside in torn/",
            self.recovered_cut_bytes.clone(),
        );
        registry.register(
            "narad_http_buffered_request_bytes",
            "Request-body bytes held against max-buffered-request-bytes now",
            self.buffered_request_bytes.clone(),
        );
        // Every reason from 0, so a rate over them exists before the first refusal.
        for reason in super::principal::DENIED_REASONS {
            drop(
                self.denied
                    .get_or_create(&super::principal::DeniedLabels { reason }),
            );
        }
        registry.register(
            "narad_http_requests_denied",
            "HTTP requests refused for who sent them: unauthenticated (401) or forbidden by the ACLs (403)",
            self.denied.clone(),
        );
        registry.register(
            "narad_http_body_budget_refusals",
            "Requests answered 503 with Retry-After because max-buffered-request-bytes were held",
            self.body_budget_refusals.clone(),
        );
        registry.register(
            "narad_http_buffered_peer_request_bytes",
            "Bytes of other nodes' calls held against max-buffered-peer-request-bytes now",
            self.buffered_peer_request_bytes.clone(),
        );
        registry.register(
            "narad_http_peer_body_budget_refusals",
            "Other nodes' calls answered 503 with Retry-After because \
             max-buffered-peer-request-bytes were held",
            self.peer_body_budget_refusals.clone(),
        );
        registry.register(
            "narad_kafka_group_members",
            "Members of each consumer group this node coordinates (read at scrape time)",
            self.group_members.clone(),
        );
        registry.register(
            "narad_kafka_group_lag_messages",
            "Records between a consumer group's committed offset and its partition's end, for the groups this node coordinates (read at scrape time; absent while the end cannot be read)",
            self.group_lag.clone(),
        );
        // Every pair starts at 0, so the series exist (and rate() works) before the first
        // forward, and a single node shows that it forwards nothing.
        for request in FORWARD_REQUESTS {
            for outcome in FORWARD_OUTCOMES {
                drop(
                    self.forwarded
                        .get_or_create(&ForwardLabels { request, outcome }),
                );
            }
        }
        registry.register(
            "narad_forwarded_requests",
            "Calls to partition owners for produce and fetch requests this node does not own (cluster mode), by outcome",
            self.forwarded.clone(),
        );
    }

    /// Counts one call forwarded to a partition owner for a `request` (`produce`, `fetch`)
    /// that ended with `outcome` (`ok`, `owner_down`, `error`).
    pub(crate) fn forwarded(&self, request: &'static str, outcome: &'static str) {
        self.forwarded
            .get_or_create(&ForwardLabels { request, outcome })
            .inc();
    }

    /// Counts `records` records of `bytes` bytes committed to `topic` by a produce.
    pub(crate) fn produced(&self, topic: &str, records: u64, bytes: u64) {
        let labels = TopicLabels {
            topic: topic.to_owned(),
        };
        self.produce_records.get_or_create(&labels).inc_by(records);
        self.produce_bytes.get_or_create(&labels).inc_by(bytes);
    }

    /// Counts `records` records of `bytes` bytes returned from `topic` by a fetch.
    pub(crate) fn fetched(&self, topic: &str, records: u64, bytes: u64) {
        if records == 0 {
            return;
        }
        let labels = TopicLabels {
            topic: topic.to_owned(),
        };
        self.fetch_records.get_or_create(&labels).inc_by(records);
        self.fetch_bytes.get_or_create(&labels).inc_by(bytes);
    }

    /// Forgets a deleted topic's traffic series.
    pub(crate) fn forget_topic(&self, topic: &str) {
        let labels = TopicLabels {
            topic: topic.to_owned(),
        };
        self.produce_records.remove(&labels);
        self.produce_bytes.remove(&labels);
        self.fetch_records.remove(&labels);
        self.fetch_bytes.remove(&labels);
    }

    /// Refills the storage gauges from the store for the partitions the metastore names. The
    /// returned guard keeps other scrapes from clearing the gauges until this one is encoded.
    async fn refresh_storage(
        &self,
        state: &AppState,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, ApiError> {
        let one_at_a_time = self.refresh.lock().await;
        let snapshot = state.metastore.snapshot().await?;
        let ids: Vec<PartitionId> = snapshot
            .topics
            .values()
            .flat_map(|t| (0..t.partitions).map(|p| PartitionId::new(t.name.clone(), p)))
            .collect();
        let store = Arc::clone(&state.store);
        let appends = state.store.append_stats();
        for (counter, total) in [
            (&self.log_appends, appends.appends),
            (&self.log_append_syncs, appends.syncs),
        ] {
            // The store's totals only grow; the counters follow them.
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        let (stats, set_aside) = crate::blocking::run(move || {
            let stats = ids
                .into_iter()
                .filter_map(|id| store.peek(&id).ok().map(|s| (id, s)))
                .collect::<Vec<_>>();
            let set_aside = crate::topics::set_aside::list(store.data_dir()).map(|e| e.len());
            (stats, set_aside)
        })
        .await
        .map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading partition stats failed: {e}"),
            )
        })?;
        match set_aside {
            Ok(n) => {
                self.set_aside_entries
                    .set(u64::try_from(n).unwrap_or(u64::MAX));
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the set-aside area for metrics"),
        };
        // Deleted topics must not linger: start from nothing each scrape.
        for family in [
            &self.size_bytes,
            &self.segments,
            &self.log_start_offset,
            &self.high_watermark,
            &self.unavailable,
            &self.recovered_cut_records,
            &self.recovered_cut_bytes,
        ] {
            family.clear();
        }
        for (id, s) in stats {
            let labels = PartitionLabels {
                topic: id.topic.clone(),
                partition: id.partition,
            };
            self.size_bytes.get_or_create(&labels).set(s.size_bytes);
            self.segments
                .get_or_create(&labels)
                .set(u64::from(s.segment_count));
            self.log_start_offset
                .get_or_create(&labels)
                .set(s.log_start_offset);
            if let Some(high) = s.high_watermark {
                self.high_watermark.get_or_create(&labels).set(high);
            }
            let down = matches!(
                s.state,
                PartitionState::Quarantined { .. } | PartitionState::Failed { .. }
            );
            self.unavailable.get_or_create(&labels).set(u64::from(down));
            let (cut_records, cut_bytes) = s
                .recovered_cut
                .as_ref()
                .map_or((0, 0), |c| (c.records, c.bytes));
            self.recovered_cut_records
                .get_or_create(&labels)
                .set(cut_records);
            self.recovered_cut_bytes
                .get_or_create(&labels)
                .set(cut_bytes);
        }
        Ok(one_at_a_time)
    }

    /// Refills the group gauges from the groups this node coordinates: in cluster mode every
    /// node exports its own, so no group is counted twice. Each topic's ends are gathered once
    /// per scrape; a topic whose ends cannot be read now has no lag series.
    async fn refresh_groups(&self, state: &AppState) -> Result<(), ApiError> {
        self.group_members.clear();
        self.group_lag.clear();
        let Some(coordinator) = &state.groups else {
            return Ok(());
        };
        let groups = match coordinator.list().await {
            Ok(groups) => groups,
            Err(e) => {
                tracing::debug!(error = %e, "consumer groups not listed for metrics");
                return Ok(());
            }
        };
        let mut bounds = super::groups::BoundsByTopic::new();
        let mut series = 0usize;
        for listed in groups {
            let group = listed.group;
            let (Ok(described), Ok(committed)) = (
                coordinator.describe(&group).await,
                coordinator.fetch(&group, None).await,
            ) else {
                continue;
            };
            self.group_members
                .get_or_create(&GroupLabels {
                    group: group.clone(),
                })
                .set(u64::try_from(described.members.len()).unwrap_or(u64::MAX));
            if series + committed.len() > MAX_GROUP_LAG_SERIES {
                tracing::debug!(
                    group,
                    "group lag series over the cap: left out of this scrape"
                );
                continue;
            }
            for offset in super::groups::with_lag(state, committed, &mut bounds).await? {
                if let Some(lag) = offset.lag {
                    series += 1;
                    self.group_lag
                        .get_or_create(&GroupPartitionLabels {
                            group: group.clone(),
                            topic: offset.topic,
                            partition: offset.partition,
                        })
                        .set(lag);
                }
            }
        }
        Ok(())
    }
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let refreshed = state.api_metrics.refresh_storage(&state).await?;
    state.api_metrics.refresh_groups(&state).await?;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &state.metrics).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}"),
        )
    })?;
    drop(refreshed);
    Ok(([(CONTENT_TYPE, OPENMETRICS)], text))
}
