//! Routing-plugin series: calls, records, failures by kind and call duration, per plugin
//! version.
//!
//! The chain ([`narad_runtime::Chain`]) keeps running totals per plugin; the router
//! ([`super::route::wasm::ChainRouter`]) hands the change over each slab to a
//! [`RouteObserver`], and [`PluginMetrics`] turns it into Prometheus series. Labels are the
//! plugin's name and the first 12 hex digits of its digest, so two versions of a plugin are
//! told apart while the series count stays bounded by the plugins deployed, not the links.

use std::time::Duration;

use narad_runtime::FailureKind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Hex digits of the digest kept in the `digest` label.
pub(crate) const DIGEST_LABEL_HEX: usize = 12;

/// Upper bounds of the call-duration histogram, in seconds: 10 us to 1 s. A built-in router
/// takes tens of microseconds for a 4,096-record slab; the runtime's deadline stops a call
/// long before the last bucket.
pub(crate) const CALL_DURATION_BUCKETS_SECONDS: [f64; 12] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.1,
    1.0,
];

/// What changed for one plugin of a chain over one routing of a slab.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PluginCallSample {
    /// Manifest name.
    pub plugin: String,
    /// Digest, as hex.
    pub digest: String,
    /// Calls made to route the slab (1 for a plain routing); the poison-record search's are
    /// in `search_calls`.
    pub calls: u64,
    /// Calls made by the poison-record search of a slab that keeps failing.
    pub(crate) search_calls: u64,
    /// `narad.log` lines the rate limit (or a bad range) dropped.
    pub(crate) log_lines_dropped: u64,
    /// Records handed in.
    pub records: u64,
    /// Time spent in those calls.
    pub busy: Duration,
    /// Failures by kind.
    pub failures: Vec<(FailureKind, u64)>,
}

/// Receives what each slab's routing cost, per plugin.
pub(crate) trait RouteObserver: Send + Sync {
    /// Called after a slab was routed (or failed to), once per plugin that was called.
    fn observe(&self, sample: &PluginCallSample);
}

/// Labels of the per-plugin series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PluginLabels {
    /// Plugin name.
    pub plugin: String,
    /// First [`DIGEST_LABEL_HEX`] hex digits of its digest.
    pub digest: String,
}

/// Labels of the failure series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PluginErrorLabels {
    /// Plugin name.
    pub plugin: String,
    /// Short digest.
    pub digest: String,
    /// `trap`, `deadline`, `fuel`, `memory_limit`, `error_return`, `protocol`,
    /// `out_of_range`, `undecided` or `host`.
    pub kind: String,
}

fn histogram() -> Histogram {
    Histogram::new(CALL_DURATION_BUCKETS_SECONDS)
}

/// Every plugin series.
#[derive(Debug)]
pub(crate) struct PluginMetrics {
    /// `narad_plugin_calls_total`.
    pub calls: Family<PluginLabels, Counter>,
    /// `narad_plugin_records_total`.
    pub records: Family<PluginLabels, Counter>,
    /// `narad_plugin_errors_total`.
    pub errors: Family<PluginErrorLabels, Counter>,
    /// `narad_plugin_call_duration_seconds`.
    pub duration: Family<PluginLabels, Histogram, fn() -> Histogram>,
    /// `narad_plugin_search_calls_total`.
    pub(crate) search_calls: Family<PluginLabels, Counter>,
    /// `narad_plugin_log_lines_dropped_total`.
    pub(crate) log_lines_dropped: Family<PluginLabels, Counter>,
}

impl Default for PluginMetrics {
    fn default() -> PluginMetrics {
        PluginMetrics {
            calls: Family::default(),
            records: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(histogram),
            search_calls: Family::default(),
            log_lines_dropped: Family::default(),
        }
    }
}

impl PluginMetrics {
    /// Registers every series in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "narad_plugin_calls",
            "Calls into a routing plugin to route a slab (one per slab it was handed; the poison-record search is counted in narad_plugin_search_calls)",
            self.calls.clone(),
        );
        registry.register(
            "narad_plugin_records",
            "Records handed to a routing plugin (only the records earlier plugins of the chain left undecided)",
            self.records.clone(),
        );
        registry.register(
            "narad_plugin_errors",
            "Routing-plugin failures by kind (trap, deadline, fuel, memory_limit, error_return, protocol, out_of_range, undecided, host); each stalls its cursor",
            self.errors.clone(),
        );
        registry.register(
            "narad_plugin_call_duration_seconds",
            "Wall-clock duration of one routing-plugin call, input encoding included",
            self.duration.clone(),
        );
        registry.register(
            "narad_plugin_search_calls",
            "Calls into a routing plugin by the poison-record search of a slab that keeps failing (not counted as calls or errors)",
            self.search_calls.clone(),
        );
        registry.register(
            "narad_plugin_log_lines_dropped",
            "narad.log lines of a routing plugin dropped by the per-instance rate limit (or with a bad range)",
            self.log_lines_dropped.clone(),
        );
    }
}

impl RouteObserver for PluginMetrics {
    fn observe(&self, sample: &PluginCallSample) {
        let digest: String = sample.digest.chars().take(DIGEST_LABEL_HEX).collect();
        let labels = PluginLabels {
            plugin: sample.plugin.clone(),
            digest: digest.clone(),
        };
        if sample.calls > 0 {
            self.calls.get_or_create(&labels).inc_by(sample.calls);
            self.records.get_or_create(&labels).inc_by(sample.records);
            // Several calls in one sample (a bisection) are observed at their mean.
            let each = sample.busy.as_secs_f64() / sample.calls as f64;
            let histogram = self.duration.get_or_create(&labels);
            for _ in 0..sample.calls {
                histogram.observe(each);
            }
        }
        if sample.search_calls > 0 {
            self.search_calls
                .get_or_create(&labels)
                .inc_by(sample.search_calls);
        }
        if sample.log_lines_dropped > 0 {
            self.log_lines_dropped
                .get_or_create(&labels)
                .inc_by(sample.log_lines_dropped);
        }
        for &(kind, count) in &sample.failures {
            if count > 0 {
                self.errors
                    .get_or_create(&PluginErrorLabels {
                        plugin: sample.plugin.clone(),
                        digest: digest.clone(),
                        kind: kind.as_str().to_owned(),
                    })
                    .inc_by(count);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_counts_calls_records_errors_and_durations() {
        let metrics = PluginMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.observe(&PluginCallSample {
            plugin: "key-hash".into(),
            digest: "0123456789abcdef0123".into(),
            calls: 2,
            search_calls: 5,
            log_lines_dropped: 7,
            records: 10,
            busy: Duration::from_micros(40),
            failures: vec![(FailureKind::Trap, 1), (FailureKind::Fuel, 0)],
        });
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let labels = "digest=\"0123456789ab\",plugin=\"key-hash\"";
        let alt = "plugin=\"key-hash\",digest=\"0123456789ab\"";
        let has = |series: &str, value: &str| {
            text.lines().any(|l| {
                (l.starts_with(&format!("{series}{{{labels}"))
                    || l.starts_with(&format!("{series}{{{alt}")))
                    && l.ends_with(value)
            })
        };
        assert!(has("narad_plugin_calls_total", " 2"), "{text}");
        assert!(has("narad_plugin_records_total", " 10"), "{text}");
        assert!(
            has("narad_plugin_call_duration_seconds_count", " 2"),
            "{text}"
        );
        assert!(has("narad_plugin_search_calls_total", " 5"), "{text}");
        assert!(has("narad_plugin_log_lines_dropped_total", " 7"), "{text}");
        assert!(text.contains("kind=\"trap\""), "{text}");
        assert!(!text.contains("kind=\"fuel\""), "{text}");
    }
}
