//! The parts [`super::run_server`] puts together, one function each: what it needs goes in as
//! arguments, what it makes comes out; none starts anything the composition root does not
//! see.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use narad_storage::{PartitionId, Store};
use tokio::task::JoinHandle;

use super::{ServerError, open_data_dir};
use crate::api::metrics::ApiMetrics;
use crate::api::{self, AppState};
use crate::cluster::ClusterContext;
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::receiver::CommitReceiver;
use crate::config::Config;
use crate::fanout::CursorDeps;
use crate::fanout::committer::ChildCommitter;
use crate::fanout::metrics::FanoutMetrics;
use crate::fanout::plugin_metrics::{PluginMetrics, RouteObserver};
use crate::fanout::route::wasm::WasmRouterFactory;
use crate::fanout::status::FanoutView;
use crate::groups::Coordinator;
use crate::http_server::HttpMetrics;
use crate::kafka::metrics::KafkaMetrics;
use crate::metastore::Metastore;
use crate::ownership::{PartitionOwnership, SingleNode};
use crate::plugins::PluginRegistry;
use crate::produce::Producer;
use crate::reconciler::Reconciler;
use crate::shutdown::ShutdownSignal;
use crate::tls::{ServerTls, TlsMetrics};
use crate::topics::TopicService;

/// The TLS of each listener, when it serves TLS.
pub(super) struct ListenerTls {
    pub http: Option<Arc<ServerTls>>,
    pub kafka: Option<Arc<ServerTls>>,
}

/// The TLS of the HTTP listener and of the Kafka listener (when there is one), read now so a
/// bad file stops the start with its reason, and reloaded on SIGHUP and on file change.
pub(super) fn open_tls(
    config: &Config,
    metrics: &Arc<TlsMetrics>,
    shutdown: &ShutdownSignal,
) -> Result<ListenerTls, ServerError> {
    let Some(files) = &config.tls else {
        return Ok(ListenerTls {
            http: None,
            kafka: None,
        });
    };
    let open = |alpn: &[&[u8]]| ServerTls::open(files.clone(), alpn, Arc::clone(metrics));
    let http = open(&[b"http/1.1"])?;
    http.spawn_reloader("http", shutdown.clone());
    let kafka = config.kafka_listen.map(|_| open(&[])).transpose()?;
    if let Some(kafka) = &kafka {
        kafka.spawn_reloader("kafka", shutdown.clone());
    }
    Ok(ListenerTls {
        http: Some(http),
        kafka,
    })
}

/// A listener bound to `addr`, and the address it got (port 0 asks for a free one).
pub(super) async fn bind(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// What start-up opened: the store, the metadata, who owns what, and cluster mode's parts.
pub(super) struct Opened {
    pub store: Arc<Store>,
    pub metastore: Arc<dyn Metastore>,
    pub ownership: Arc<dyn PartitionOwnership>,
    pub cluster: Option<Arc<ClusterContext>>,
}

/// Opens the node's data: the data dir alone on one node, or joined to its cluster (which
/// advertises `local_addr` and `kafka_addr`).
pub(super) async fn open_node(
    config: &Config,
    local_addr: SocketAddr,
    kafka_addr: Option<SocketAddr>,
    shutdown: &ShutdownSignal,
) -> Result<Opened, ServerError> {
    if let Some(cluster) = &config.cluster {
        let (store, context) =
            super::start_cluster(cluster, config, local_addr, kafka_addr, shutdown).await?;
        return Ok(Opened {
            store,
            metastore: Arc::clone(&context.metastore) as Arc<dyn Metastore>,
            ownership: Arc::clone(&context.ownership) as Arc<dyn PartitionOwnership>,
            cluster: Some(context),
        });
    }
    let data_dir = config.data_dir.clone();
    let idle_close_after = config.idle_close_after;
    let failed_reopen_after = config.failed_reopen_after;
    let segment_bytes = config.segment_bytes;
    let (store, metastore) = crate::blocking::run(move || {
        open_data_dir(
            &data_dir,
            idle_close_after,
            failed_reopen_after,
            segment_bytes,
        )
    })
    .await??;
    Ok(Opened {
        store: Arc::new(store),
        metastore: Arc::new(metastore),
        ownership: Arc::new(SingleNode::default()),
        cluster: None,
    })
}

/// The produce path; fenced in cluster mode (etcd silent for nearly a lease TTL: no produce
/// takes a write here).
pub(super) fn producer(store: &Arc<Store>, cluster: Option<&Arc<ClusterContext>>) -> Producer {
    match cluster {
        Some(context) => Producer::new(Arc::clone(store)).with_fence(context.fence()),
        None => Producer::new(Arc::clone(store)),
    }
}

/// The plugin registry; in cluster mode a module uploaded to one node is fetched by digest by
/// the others when a link needs it.
pub(super) async fn plugins(
    config: &Config,
    metastore: &Arc<dyn Metastore>,
    cluster: Option<&Arc<ClusterContext>>,
) -> Result<PluginRegistry, ServerError> {
    let registry = PluginRegistry::open(
        &config.data_dir,
        Arc::clone(metastore),
        config.plugin_limits.clone(),
    )
    .await?;
    Ok(match cluster {
        Some(context) => {
            let context = Arc::clone(context);
            registry.with_fetcher(Arc::new(move |digest: &str| {
                crate::cluster::modules::fetch_module_blocking(&context, digest)
            }))
        }
        None => registry,
    })
}

/// Every metric family the daemon serves on `/metrics`, registered in one registry. The Kafka
/// families are there with or without the listener, so a scrape shows the same families
/// whatever the config (zeros when it is off).
pub(super) struct Metrics {
    pub fanout: Arc<FanoutMetrics>,
    pub plugin: Arc<PluginMetrics>,
    pub api: Arc<ApiMetrics>,
    pub http: Arc<HttpMetrics>,
    pub cluster: Arc<ClusterMetrics>,
    pub kafka: Arc<KafkaMetrics>,
    pub registry: prometheus_client::registry::Registry,
}

impl Metrics {
    /// Every family, `tls` among them.
    pub(super) fn register(tls: &TlsMetrics) -> Metrics {
        let mut registry = prometheus_client::registry::Registry::default();
        let fanout = Arc::new(FanoutMetrics::default());
        fanout.register(&mut registry);
        let plugin = Arc::new(PluginMetrics::default());
        plugin.register(&mut registry);
        let api = Arc::new(ApiMetrics::default());
        api.register(&mut registry);
        let http = Arc::new(HttpMetrics::default());
        http.register(&mut registry);
        tls.register(&mut registry);
        let cluster = Arc::new(ClusterMetrics::default());
        cluster.register(&mut registry);
        let kafka = Arc::new(KafkaMetrics::default());
        kafka.register(&mut registry);
        Metrics {
            fanout,
            plugin,
            api,
            http,
            cluster,
            kafka,
            registry,
        }
    }
}

/// Cluster mode: this node's receiver of child commits, shared by the commits other nodes
/// send and this node's own cursors, so each partition has one dedupe window and lock.
pub(super) fn commit_receiver(
    cluster: Option<&Arc<ClusterContext>>,
    store: &Arc<Store>,
    metrics: &ClusterMetrics,
) -> Option<Arc<CommitReceiver>> {
    let context = cluster?;
    let ownership = Arc::clone(&context.ownership);
    let owners: Arc<crate::cluster::receiver::OwnerLookup> =
        Arc::new(move |id: &PartitionId| ownership.owner_at(id));
    Some(Arc::new(
        CommitReceiver::new(context.node_id().to_owned(), Arc::clone(store), owners)
            .with_fence(context.fence())
            .with_parents(context.parents())
            .counting_reused_on(metrics.reused_origin_records.clone()),
    ))
}

/// How cursors commit buckets: to the child partition's owner in cluster mode (this node's
/// own through `receiver`), else the produce path.
pub(super) fn child_committer(
    cluster: Option<&Arc<ClusterContext>>,
    receiver: Option<&Arc<CommitReceiver>>,
    producer: &Arc<Producer>,
    metrics: &Arc<FanoutMetrics>,
) -> Result<Arc<dyn ChildCommitter>, ServerError> {
    let (Some(context), Some(receiver)) = (cluster, receiver) else {
        return Ok(Arc::clone(producer) as Arc<dyn ChildCommitter>);
    };
    let ownership = Arc::clone(&context.ownership);
    let peers = Arc::clone(&context.peers);
    let client = crate::cluster::commit_rpc::CommitClient::over(context.peer.clone());
    Ok(Arc::new(
        crate::fanout::remote_commit::ClusterCommitter::new(
            context.node_id().to_owned(),
            Arc::clone(producer),
            Arc::new(move |id: &PartitionId| ownership.owner_at(id)),
            Arc::new(move |node: &str| peers.advertise_of(node)),
            client,
            Arc::clone(metrics),
        )
        .with_local_receiver(Arc::clone(receiver))
        .with_fence(context.fence())
        .with_parents(context.parents()),
    ))
}

/// What the reconciler and its cursors run on.
pub(super) struct FanoutParts {
    pub store: Arc<Store>,
    pub metastore: Arc<dyn Metastore>,
    pub ownership: Arc<dyn PartitionOwnership>,
    pub committer: Arc<dyn ChildCommitter>,
    pub plugins: Arc<PluginRegistry>,
    pub view: Arc<FanoutView>,
}

/// Starts the reconciler, which runs a cursor for every link of every parent partition this
/// node owns, until `shutdown`.
pub(super) fn start_reconciler(
    parts: FanoutParts,
    cluster: Option<&Arc<ClusterContext>>,
    metrics: &Metrics,
    shutdown: &ShutdownSignal,
) -> JoinHandle<()> {
    let deps = Arc::new(CursorDeps {
        store: parts.store,
        fs: Arc::new(narad_storage::fs::RealFs),
        committer: parts.committer,
        metastore: parts.metastore,
        clock: Arc::new(narad_storage::SystemClock),
        timing: crate::fanout::FanoutTiming::default(),
        remote_tails: cluster.map(|context| {
            Arc::new(api::internal::HttpTails::new(Arc::clone(context)))
                as Arc<dyn crate::fanout::position::RemoteTails>
        }),
        node: cluster.map(|context| context.node_id().to_owned()),
        leave_out_held: true,
    });
    let plugins = parts.plugins;
    let routers = Arc::new(
        WasmRouterFactory::new(Arc::new(move |digest: &str| {
            plugins.load(digest).map_err(Into::into)
        }))
        .with_observer(Arc::clone(&metrics.plugin) as Arc<dyn RouteObserver>),
    );
    let reconciler = Reconciler::new(
        deps,
        parts.ownership,
        routers,
        Arc::clone(&metrics.fanout),
        parts.view,
    );
    tokio::spawn(reconciler.run(shutdown.clone()))
}

/// Starts the consumer groups' coordinator, which comes with the Kafka listener (the HTTP API
/// lists the groups too).
pub(super) fn start_groups(
    config: &Config,
    opened: &Opened,
    producer: &Arc<Producer>,
    topics: &Arc<TopicService>,
    shutdown: &ShutdownSignal,
) -> Arc<Coordinator> {
    let coordinator = Arc::new(Coordinator::new(
        Arc::clone(&opened.store),
        Arc::clone(producer),
        Arc::clone(&opened.metastore),
        Arc::clone(&opened.ownership),
        Arc::clone(topics),
        config.groups,
    ));
    coordinator.spawn(shutdown.clone());
    coordinator
}

/// Starts serving Kafka on `listener` until `shutdown`.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_kafka(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<ServerTls>>,
    config: &Config,
    opened: &Opened,
    producer: &Arc<Producer>,
    topics: &Arc<TopicService>,
    groups: Option<&Arc<Coordinator>>,
    metrics: &Metrics,
    shutdown: &ShutdownSignal,
) -> JoinHandle<()> {
    let mut deps = crate::kafka::KafkaDeps::new(
        config.limits.clone(),
        Arc::clone(&opened.store),
        Arc::clone(&opened.metastore),
        Arc::clone(producer),
        Arc::clone(&opened.ownership),
        shutdown.clone(),
        Arc::clone(&metrics.kafka),
    )
    .with_admin(
        Arc::clone(topics),
        match config.auth_token {
            Some(_) => crate::kafka::admin::AdminAccess::TokenRequired,
            None => crate::kafka::admin::AdminAccess::Open,
        },
        config.kafka_auto_create,
    )
    .with_cluster(opened.cluster.clone())
    .advertising(config.kafka_advertise.clone())
    .with_sasl(
        config
            .kafka_sasl
            .map(|sasl| crate::kafka::sasl::Sasl::new(sasl.plain)),
    );
    if let Some(coordinator) = groups {
        deps = deps.with_groups(Arc::clone(coordinator));
    }
    let options = crate::kafka::connection::ListenOptions {
        max_connections: max_connections(config),
        shutdown_grace: config.http.shutdown_grace,
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            %addr,
            tls = tls.is_some(),
            sasl = config.kafka_sasl.is_some(),
            "kafka listener serving"
        );
        if config.kafka_sasl.is_some() && tls.is_none() {
            tracing::warn!(
                "kafka listener: SASL without TLS; passwords stay secret with SCRAM, but \
                 records and the session cross the network in clear (give --tls-cert)"
            );
        }
    }
    tokio::spawn(crate::kafka::connection::serve(
        listener,
        Arc::new(deps),
        options,
        tls,
    ))
}

/// Connections each listener takes at once: the configured number, else a share of the
/// descriptors (each listener and the open logs get theirs).
pub(super) fn max_connections(config: &Config) -> u32 {
    let listeners: u64 = if config.kafka_listen.is_some() { 2 } else { 1 };
    config.http.max_connections.unwrap_or_else(|| {
        crate::fdlimit::default_max_connections(crate::fdlimit::current(), listeners)
    })
}

/// Cluster mode: what moves partitions in and out of this node.
pub(super) fn mover(
    cluster: Option<&Arc<ClusterContext>>,
    store: &Arc<Store>,
    view: &Arc<FanoutView>,
) -> Option<Arc<crate::operations::moves::Mover>> {
    Some(Arc::new(crate::operations::moves::Mover::new(
        Arc::clone(cluster?),
        Arc::clone(store),
        Arc::clone(view),
    )))
}

/// Cluster mode: what re-creates a dead node's partitions here.
pub(super) fn recreator(
    cluster: Option<&Arc<ClusterContext>>,
    store: &Arc<Store>,
    receiver: Option<&Arc<CommitReceiver>>,
) -> Option<Arc<crate::operations::recreate::Recreator>> {
    let (context, receiver) = (cluster?, receiver?);
    Some(Arc::new(crate::operations::recreate::Recreator::new(
        Arc::clone(context),
        Arc::clone(store),
        Arc::clone(receiver),
    )))
}

/// Cluster mode: what forwards a request for a partition this node does not own to its
/// owner.
pub(super) fn forwarder(
    cluster: Option<&Arc<ClusterContext>>,
    config: &Config,
) -> Result<Option<Arc<api::forward::Forwarder>>, ServerError> {
    let Some(context) = cluster else {
        return Ok(None);
    };
    let forwarder =
        api::forward::Forwarder::over(context.node_id(), &config.limits, context.peer.clone())
            .map_err(|e| ServerError::Http(e.to_string()))?
            .with_revision({
                let metastore = Arc::clone(&context.metastore);
                Arc::new(move || metastore.cache_revision())
            })
            .with_liveness({
                let context = Arc::clone(context);
                Arc::new(move |node: &str| context.peers.is_live(node))
            });
    Ok(Some(Arc::new(forwarder)))
}

/// The HTTP routes: the API (behind the token and the users' rules when a token is set) and,
/// in cluster mode, the routes only peers may call (the peer secret, and with mutual TLS the
/// caller's certificate naming a live node).
pub(super) fn http_app(
    state: AppState,
    config: &Config,
    cluster: Option<&Arc<ClusterContext>>,
    receiver: Option<&Arc<CommitReceiver>>,
) -> Result<axum::Router, ServerError> {
    let peer_state = state.clone();
    let mut app = match config.auth_token.clone() {
        Some(token) => {
            let peer =
                cluster.and_then(|context| crate::auth::AuthToken::new(&context.peer_bearer));
            let guard = api::principal::Guard::new(
                token,
                peer,
                super::peer_liveness(config, cluster),
                Arc::clone(&state.metastore),
                config.auth_reads,
                config.tls.is_some(),
                state.api_metrics.denied.clone(),
            );
            api::principal::guard(api::router(state), guard)
        }
        None => api::router(state),
    };
    if let (Some(receiver), Some(context)) = (receiver, cluster) {
        // Nodes present the cluster's peer secret, which no client holds, token or not.
        let internal = api::peer_routes(peer_state, Arc::clone(receiver));
        let secret = crate::auth::AuthToken::new(&context.peer_bearer)
            .ok_or_else(|| ServerError::Http("the cluster's peer secret is empty".to_owned()))?;
        let mut internal = api::auth::protect(internal, secret);
        if let Some(is_live) = super::peer_liveness(config, Some(context)) {
            internal = api::auth::require_node_identity(internal, is_live);
        }
        app = app.merge(internal);
    }
    Ok(app)
}

/// The loops that run beside the API until `shutdown`, waited for before the store closes.
pub(super) struct Background {
    pub kafka: Option<JoinHandle<()>>,
    pub reconciler: JoinHandle<()>,
    pub owned_sync: Option<JoinHandle<()>>,
    pub retention: JoinHandle<()>,
    pub idle_close: JoinHandle<()>,
}

impl Background {
    /// Waits for every loop to stop (they see the same shutdown signal).
    pub(super) async fn stopped(self) {
        if let Some(kafka) = self.kafka {
            let _ = kafka.await;
        }
        let _ = self.reconciler.await;
        let _ = self.retention.await;
        let _ = self.idle_close.await;
        if let Some(sync) = self.owned_sync {
            let _ = sync.await;
        }
    }
}

/// The store's upkeep: retention passes, and closing idle logs a few times per idle period so
/// a log closes close to its deadline. Returns (retention, idle close).
pub(super) fn spawn_upkeep(
    config: &Config,
    store: &Arc<Store>,
    shutdown: &ShutdownSignal,
) -> (JoinHandle<()>, JoinHandle<()>) {
    let retention = spawn_loop(
        "retention",
        config.retention_check_interval,
        shutdown.clone(),
        Arc::clone(store),
        |store| match store.enforce_retention() {
            Ok(report) => tracing::debug!(?report, "retention pass"),
            Err(e) => tracing::warn!(error = %e, "retention pass failed"),
        },
    );
    let idle_tick = (config.idle_close_after / 4).max(Duration::from_secs(1));
    let idle = spawn_loop(
        "idle-close",
        idle_tick,
        shutdown.clone(),
        Arc::clone(store),
        |store| {
            let closed = store.close_idle();
            if closed > 0 {
                tracing::debug!(closed, "closed idle partition logs");
            }
        },
    );
    (retention, idle)
}

/// Runs `work` on the blocking pool every `every` until `shutdown` fires.
fn spawn_loop(
    name: &'static str,
    every: Duration,
    shutdown: ShutdownSignal,
    store: Arc<Store>,
    work: fn(&Store),
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate; start one period in
        loop {
            tokio::select! {
                () = shutdown.wait() => break,
                _ = ticker.tick() => {
                    let store = Arc::clone(&store);
                    if let Err(e) = crate::blocking::run(move || work(&store)).await {
                        tracing::error!(task = name, error = %e, "background task panicked");
                    }
                }
            }
        }
        tracing::debug!(task = name, "background loop stopped");
    })
}
