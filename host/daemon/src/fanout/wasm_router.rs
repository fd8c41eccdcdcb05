//! The production router: a link's chain of Wasm plugins (`narad_runtime::Chain`).

use std::sync::Arc;
use std::time::Duration;

use narad_runtime::{
    Chain, FailureKind, Plugin, PluginError, PluginStats, RouteContext, SlabRecord,
};
use narad_storage::StoredRecord;

use super::plugin_metrics::{PluginCallSample, RouteObserver};
use super::router::{RouteFailure, RouteInput, SlabRouter};
use crate::metastore::LinkMeta;
use crate::reconciler::RouterFactory;

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
        &self.0.value
    }
}

/// Routes slabs through one chain of plugin instances (one instance per plugin per link).
pub struct ChainRouter {
    chain: Chain,
    observer: Option<Arc<dyn RouteObserver>>,
    /// The chain's totals when last reported, per plugin, to report only the change.
    reported: Vec<PluginStats>,
}

impl ChainRouter {
    /// A router over `chain`.
    pub fn new(chain: Chain) -> ChainRouter {
        ChainRouter {
            chain,
            observer: None,
            reported: Vec::new(),
        }
    }

    /// The same router, telling `observer` what each slab's routing cost per plugin.
    pub fn with_observer(mut self, observer: Arc<dyn RouteObserver>) -> ChainRouter {
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
            if calls == 0 && failures.is_empty() {
                continue;
            }
            observer.observe(&PluginCallSample {
                plugin: stats.name.clone(),
                digest: stats.digest.to_hex(),
                calls,
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

fn failure(error: &PluginError, poison: Option<(u64, &PluginError)>) -> RouteFailure {
    let message = match poison {
        Some((offset, poison_error)) => {
            format!(
                "{error}; the first record it cannot route is parent offset {offset}: {poison_error}"
            )
        }
        None => error.to_string(),
    };
    RouteFailure {
        plugin: Some(format!("{}@{}", error.name, error.digest.to_hex())),
        kind: error.kind().as_str().to_string(),
        message,
    }
}

impl SlabRouter for ChainRouter {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        let ctx = RouteContext {
            parent_topic: input.parent_topic.clone(),
            parent_partition: input.parent_partition,
            parent_partition_count: input.parent_partition_count,
            child_topic: input.child_topic.clone(),
            child_partition_count: input.child_partition_count,
            attempt: input.attempt,
            config: input.config.clone(),
        };
        let views: Vec<ParentRecord<'_>> = records.iter().map(ParentRecord).collect();
        let routed = self.route_views(&ctx, &views, input.attempt);
        self.report();
        routed
    }
}

impl ChainRouter {
    fn route_views(
        &mut self,
        ctx: &RouteContext,
        views: &[ParentRecord<'_>],
        attempt: u32,
    ) -> Result<Vec<u32>, RouteFailure> {
        match self.chain.route(ctx, views) {
            Ok(decisions) => Ok(decisions),
            // First failure: report it as is. A slab that keeps failing is bisected so the
            // error names the record the chain cannot route.
            Err(error) if attempt == 0 => Err(failure(&error, None)),
            Err(error) => {
                let poison = self.chain.bisect(ctx, views);
                Err(failure(
                    &error,
                    poison.as_ref().map(|p| (p.parent_offset, &p.error)),
                ))
            }
        }
    }
}

/// Loads the plugin with a digest (hex) for a chain.
pub type PluginLoader = Arc<dyn Fn(&str) -> Result<Plugin, String> + Send + Sync>;

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
    pub fn with_observer(mut self, observer: Arc<dyn RouteObserver>) -> WasmRouterFactory {
        self.observer = Some(observer);
        self
    }
}

impl RouterFactory for WasmRouterFactory {
    fn build(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, String> {
        let plugins = link
            .router
            .iter()
            .map(|r| (self.load)(&r.digest).map_err(|e| format!("plugin {r}: {e}")))
            .collect::<Result<Vec<Plugin>, String>>()?;
        let chain = Chain::new(plugins).map_err(|e| e.to_string())?;
        let router = ChainRouter::new(chain);
        Ok(Box::new(match &self.observer {
            Some(observer) => router.with_observer(Arc::clone(observer)),
            None => router,
        }))
    }
}
