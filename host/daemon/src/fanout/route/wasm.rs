//! The production router: a link's chain of Wasm plugins (`narad_runtime::Chain`).

use std::sync::Arc;
use std::time::Duration;

use narad_runtime::{
    Chain, FailureKind, Plugin, PluginError, PluginStats, PoisonRecord, RouteContext, SlabRecord,
};
use narad_storage::StoredRecord;

use super::{
    PluginLoadError, PoisonFound, RouteFailure, RouteFailureKind, RouteInput, RouterBuildError,
    RouterFactory, SlabRouter,
};
use crate::fanout::plugin_metrics::{PluginCallSample, RouteObserver};
use crate::metastore::LinkMeta;

/// A parent record as the plugin ABI sees it (keys always; headers and values when a plugin's
/// manifest asks for them).
struct ParentRecord<'a>(&'a StoredRecord);

impl SlabRecord for ParentRecord<'_> {
    fn parent_offset(&self) -> u64 {
        self.0.offset
    }
    fn committed_at_ms(&self) -> i64 {
        self.0.committed_at_ms
    }
    fn key(&self) -> Option<&[u8]> {
        self.0.key.as_deref()
    }
    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.0
            .headers
            .iter()
            .map(|h| (h.name.as_bytes(), h.value.as_ref()))
    }
    fn value(&self) -> &[u8] {
        // A null value reads as empty: the ABI has no null value (abi.md).
        self.0.value.as_deref().unwrap_or_default()
    }
}

/// Routes slabs through one chain of plugin instances (one instance per plugin per link).
pub struct ChainRouter {
    chain: Chain,
    observer: Option<Arc<dyn RouteObserver>>,
    /// The chain's totals when last reported, per plugin, to report only the change.
    reported: Vec<PluginStats>,
    /// Attempt numbers the poison-record searches of the current slab used, added to the
    /// cursor's attempt so that every call with one slab carries its own attempt.
    attempt_shift: u32,
    /// The last slab searched for its poison record, and what the search found: a slab that
    /// keeps failing is searched once, not on every retry.
    searched: Option<(SlabId, Option<PoisonRecord>)>,
}

impl ChainRouter {
    /// A router over `chain`.
    pub fn new(chain: Chain) -> ChainRouter {
        ChainRouter {
            chain,
            observer: None,
            reported: Vec::new(),
            attempt_shift: 0,
            searched: None,
        }
    }

    /// The same router, telling `observer` what each slab's routing cost per plugin.
    pub(crate) fn with_observer(mut self, observer: Arc<dyn RouteObserver>) -> ChainRouter {
        self.reported = self.chain.stats();
        self.observer = Some(observer);
        self
    }

    /// Hands the change in the chain's per-plugin totals since the last report to the
    /// observer.
    fn report(&mut self) {
        let Some(observer) = &self.observer else {
            return;
        };
        let now = self.chain.stats();
        for (i, stats) in now.iter().enumerate() {
            let before = self.reported.get(i);
            let calls = stats.calls.saturating_sub(before.map_or(0, |b| b.calls));
            let search_calls = stats
                .search_calls
                .saturating_sub(before.map_or(0, |b| b.search_calls));
            let log_lines_dropped = stats
                .log_lines_dropped
                .saturating_sub(before.map_or(0, |b| b.log_lines_dropped));
            let failures: Vec<(FailureKind, u64)> = stats
                .failures_by_kind()
                .map(|(kind, n)| {
                    (
                        kind,
                        n.saturating_sub(before.map_or(0, |b| b.failures(kind))),
                    )
                })
                .filter(|&(_, n)| n > 0)
                .collect();
            if calls == 0 && search_calls == 0 && log_lines_dropped == 0 && failures.is_empty() {
                continue;
            }
            observer.observe(&PluginCallSample {
                plugin: stats.name.clone(),
                digest: stats.digest.to_hex(),
                calls,
                search_calls,
                log_lines_dropped,
                records: stats
                    .records_in
                    .saturating_sub(before.map_or(0, |b| b.records_in)),
                busy: stats
                    .busy
                    .saturating_sub(before.map_or(Duration::ZERO, |b| b.busy)),
                failures,
            });
        }
        self.reported = now;
    }
}

/// A failed slab as one line for operators. With the record the search found: the plugin (name,
/// version, digest), the record's parent offset and key, and what routing that record gave
/// (the guest's own panic or error text), once; the whole slab's error is left out, since it
/// mostly repeats the record's with another fuel budget.
fn failure(
    error: &PluginError,
    poison: Option<&PoisonRecord>,
    records: &[ParentRecord<'_>],
) -> RouteFailure {
    let message = match poison {
        Some(poison) => {
            let key = records
                .get(poison.index)
                .map_or_else(String::new, |record| {
                    format!(" ({})", narad_runtime::text::describe_key(record.key()))
                });
            let company = if poison.alone {
                ""
            } else {
                "; it fails only after the records before it in the slab, not alone"
            };
            format!(
                "plugin {} failed on parent offset {}{key}: {}{company}",
                poison.error.who(),
                poison.parent_offset,
                poison.error.failure
            )
        }
        None => error.to_string(),
    };
    RouteFailure {
        plugin: Some(format!("{}@{}", error.name, error.digest.to_hex())),
        poison: poison.map(|p| {
            Box::new(PoisonFound {
                offset: p.parent_offset,
                plugin: p.error.name.clone(),
                digest: p.error.digest.to_hex(),
                kind: p.error.kind().to_string(),
                error: p.error.to_string(),
                alone: p.alone,
            })
        }),
        kind: RouteFailureKind::Plugin(error.kind()),
        message,
    }
}

impl SlabRouter for ChainRouter {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        // A new slab (attempt 0) starts the numbering afresh.
        if input.attempt == 0 {
            self.attempt_shift = 0;
        }
        let attempt = input.attempt.saturating_add(self.attempt_shift);
        let ctx = RouteContext {
            parent_topic: input.parent_topic.clone(),
            parent_partition: input.parent_partition,
            parent_partition_count: input.parent_partition_count,
            child_topic: input.child_topic.clone(),
            child_partition_count: input.child_partition_count,
            attempt,
            config: input.config.clone(),
        };
        let views: Vec<ParentRecord<'_>> = records.iter().map(ParentRecord).collect();
        let routed = self.route_views(&ctx, &views, input.attempt);
        self.report();
        routed
    }

    fn route_candidate(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        // Always a first attempt: a candidate's failing slab is counted, never searched for
        // its poison record (the search would cost calls the comparison does not need).
        let ctx = RouteContext {
            parent_topic: input.parent_topic.clone(),
            parent_partition: input.parent_partition,
            parent_partition_count: input.parent_partition_count,
            child_topic: input.child_topic.clone(),
            child_partition_count: input.child_partition_count,
            attempt: 0,
            config: input.config.clone(),
        };
        let views: Vec<ParentRecord<'_>> = records.iter().map(ParentRecord).collect();
        let mut decisions = vec![narad_runtime::UNDECIDED; views.len()];
        let routed = match self.chain.route_into(&ctx, &views, &mut decisions) {
            Ok(()) => Ok(decisions),
            // The chain fills every decision it made before it names the first record left
            // undecided, and leaves the others UNDECIDED: exactly what the comparison counts.
            Err(error) if error.kind() == FailureKind::Undecided => Ok(decisions),
            Err(error) => Err(failure(&error, None, &views)),
        };
        self.report();
        routed
    }

    fn fuel_spent(&self) -> Option<u64> {
        Some(self.chain.stats().iter().map(|s| s.fuel_consumed).sum())
    }
}

impl ChainRouter {
    fn route_views(
        &mut self,
        ctx: &RouteContext,
        views: &[ParentRecord<'_>],
        attempt: u32,
    ) -> Result<Vec<u32>, RouteFailure> {
        if attempt == 0 {
            self.searched = None;
        }
        match self.chain.route(ctx, views) {
            Ok(decisions) => Ok(decisions),
            // First failure: report it as is. A slab that keeps failing is searched once, so
            // the error names the record the chain cannot route.
            Err(error) if attempt == 0 => Err(failure(&error, None, views)),
            // A config error is about no record: searching would only repeat it and blame
            // whichever record came first.
            Err(error) if error.failure.is_bad_config() => Err(failure(&error, None, views)),
            Err(error) => {
                let slab = SlabId::of(views);
                let poison = match &self.searched {
                    // The same slab again: its record is known; searching again would cost
                    // calls (and log lines) to name it again.
                    Some((searched, poison)) if *searched == slab => poison.clone(),
                    _ => {
                        let poison = self.chain.bisect(ctx, views);
                        self.attempt_shift = self
                            .attempt_shift
                            .saturating_add(self.chain.last_search_routings());
                        self.searched = Some((slab, poison.clone()));
                        poison
                    }
                };
                Err(failure(&error, poison.as_ref(), views))
            }
        }
    }
}

/// Which slab a search was for: its first parent offset and its length (a cursor retries a
/// slab from the same offset; a slab read again longer is searched again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlabId {
    first_offset: Option<u64>,
    records: usize,
}

impl SlabId {
    fn of(views: &[ParentRecord<'_>]) -> SlabId {
        SlabId {
            first_offset: views.first().map(|r| r.0.offset),
            records: views.len(),
        }
    }
}

/// Loads the plugin with a digest (hex) for a chain.
pub(crate) type PluginLoader = Arc<dyn Fn(&str) -> Result<Plugin, PluginLoadError> + Send + Sync>;

/// Builds each link's chain from the digests its router names.
pub struct WasmRouterFactory {
    load: PluginLoader,
    observer: Option<Arc<dyn RouteObserver>>,
}

impl WasmRouterFactory {
    /// A factory loading plugins through `load`.
    pub fn new(load: PluginLoader) -> WasmRouterFactory {
        WasmRouterFactory {
            load,
            observer: None,
        }
    }

    /// The same factory; every chain it builds reports its per-plugin costs to `observer`.
    pub(crate) fn with_observer(mut self, observer: Arc<dyn RouteObserver>) -> WasmRouterFactory {
        self.observer = Some(observer);
        self
    }
}

impl RouterFactory for WasmRouterFactory {
    fn build(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
        let plugins = link
            .router
            .iter()
            .map(|r| {
                (self.load)(&r.digest).map_err(|source| RouterBuildError::PluginLoad {
                    plugin: r.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<Plugin>, RouterBuildError>>()?;
        let chain = Chain::new(plugins)?;
        let router = ChainRouter::new(chain);
        Ok(Box::new(match &self.observer {
            Some(observer) => router.with_observer(Arc::clone(observer)),
            None => router,
        }))
    }

    fn build_candidate(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
        // The same chain without the observer: a candidate's calls and failures are the
        // shadow report's, not the plugin series operators alert on.
        WasmRouterFactory::new(Arc::clone(&self.load)).build(link)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;
    use narad_runtime::{Runtime, RuntimeConfig};

    use super::*;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<PluginCallSample>>);

    impl RouteObserver for Recorder {
        fn observe(&self, sample: &PluginCallSample) {
            self.0.lock().unwrap().push(sample.clone());
        }
    }

    impl Recorder {
        fn take(&self) -> Vec<PluginCallSample> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    fn router(runtime: &Runtime, names: &[&str], recorder: &Arc<Recorder>) -> ChainRouter {
        let plugins = names
            .iter()
            .map(|name| Plugin::load(runtime, narad_builtin_plugins::get(name).unwrap()).unwrap());
        ChainRouter::new(Chain::new(plugins).unwrap())
            .with_observer(Arc::clone(recorder) as Arc<dyn RouteObserver>)
    }

    fn input() -> RouteInput {
        RouteInput {
            parent_topic: "p".into(),
            parent_partition: 0,
            parent_partition_count: 1,
            child_topic: "c".into(),
            child_partition_count: 4,
            attempt: 0,
            config: Vec::new(),
        }
    }

    fn record(offset: u64, key: Option<&'static str>) -> StoredRecord {
        StoredRecord {
            offset,
            committed_at_ms: 0,
            key: key.map(|k| Bytes::from_static(k.as_bytes())),
            headers: Vec::new(),
            value: Some(Bytes::from_static(b"v")),
            origin: None,
        }
    }

    fn link_naming(router: Vec<crate::metastore::link::PluginRef>) -> LinkMeta {
        LinkMeta {
            parent: "p".into(),
            child: "c".into(),
            attach_epoch: "0011223344556677".into(),
            attach_offsets: Some(vec![0]),
            delay_ms: 0,
            router,
            config: String::new(),
            attached_at_ms: 0,
            paused: Vec::new(),
            shadow: None,
            on_gap: Default::default(),
            accepted_gaps: Vec::new(),
            dead_letter: None,
            remote: None,
        }
    }

    #[test]
    fn a_plugin_the_registry_cannot_load_fails_the_build_naming_the_plugin() {
        let factory = WasmRouterFactory::new(Arc::new(|digest: &str| {
            Err(format!("no plugin with digest {digest}").into())
        }));
        let plugin = crate::metastore::link::PluginRef {
            name: "key-hash".into(),
            digest: "ab".repeat(32),
        };
        let Err(error) = factory.build(&link_naming(vec![plugin.clone()])) else {
            panic!("a chain was built without its plugin");
        };
        assert!(matches!(&error, RouterBuildError::PluginLoad { plugin: p, .. } if *p == plugin));
        let digest = "ab".repeat(32);
        assert_eq!(
            error.to_string(),
            format!("plugin key-hash@{digest}: no plugin with digest {digest}")
        );

        // No plugin at all is not a chain.
        let Err(error) = factory.build(&link_naming(Vec::new())) else {
            panic!("an empty chain was built");
        };
        assert!(matches!(
            error,
            RouterBuildError::Chain(narad_runtime::ChainError::Length { len: 0, .. })
        ));
    }

    #[test]
    fn each_slab_reports_only_its_own_calls_records_and_failures() {
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        let recorder = Arc::new(Recorder::default());
        let mut chain = router(&runtime, &["key-hash", "round-robin"], &recorder);
        let slab = [
            record(0, Some("a")),
            record(1, None),
            record(2, Some("b")),
            record(3, None),
            record(4, Some("c")),
        ];
        for _ in 0..2 {
            chain.route(&input(), &slab).unwrap();
            let samples = recorder.take();
            let by_name = |n: &str| samples.iter().find(|s| s.plugin == n).unwrap().clone();
            let (key_hash, round_robin) = (by_name("key-hash"), by_name("round-robin"));
            // Per slab, not running totals: the second slab reports the same figures.
            assert_eq!((key_hash.calls, key_hash.records), (1, 5));
            assert_eq!((round_robin.calls, round_robin.records), (1, 2));
            assert!(key_hash.failures.is_empty() && round_robin.failures.is_empty());
            assert_eq!(key_hash.digest.len(), 64);
        }

        // header-route without its config fails every slab: an error_return, reported once.
        let mut broken = router(&runtime, &["header-route"], &recorder);
        let failure = broken.route(&input(), &slab).unwrap_err();
        assert_eq!(
            failure.kind,
            RouteFailureKind::Plugin(FailureKind::ErrorReturn)
        );
        assert_eq!(failure.kind.as_str(), "error_return");
        let samples = recorder.take();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].failures, vec![(FailureKind::ErrorReturn, 1)]);
    }

    #[test]
    fn a_retried_config_error_is_not_searched_for_a_poison_record() {
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        let recorder = Arc::new(Recorder::default());
        let mut broken = router(&runtime, &["header-route"], &recorder);
        let slab: Vec<StoredRecord> = (0..64).map(|i| record(i, Some("k"))).collect();
        let retry = RouteInput {
            attempt: 3,
            ..input()
        };
        let failure = broken.route(&retry, &slab).unwrap_err();
        // One call, one error, no search, and no record blamed for the config.
        let samples = recorder.take();
        assert_eq!(samples.len(), 1);
        assert_eq!((samples[0].calls, samples[0].search_calls), (1, 0));
        assert_eq!(samples[0].failures, vec![(FailureKind::ErrorReturn, 1)]);
        assert!(
            !failure.message.contains("cannot route"),
            "{}",
            failure.message
        );
        assert_eq!(
            failure.message.matches("bad config").count(),
            1,
            "{}",
            failure.message
        );
    }
}
