//! Start-up and shutdown of the daemon: open the store and the metastore, register every
//! partition, serve the API, run the background loops, and close everything cleanly.
//!
//! [`run_server`] returns as soon as the listener is bound (with its address, so tests can bind
//! port 0); [`RunningServer::wait`] resolves after a shutdown once in-flight requests finished
//! (or the shutdown grace ran out and their connections were dropped, see `http_server`), the
//! background loops stopped and the store closed (its high-watermark files written).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use narad_storage::{PartitionId, StorageError, Store, StoreOptions};
use tokio::task::JoinHandle;

use crate::api::metrics::ApiMetrics;
use crate::api::{self, AppInner, AppState};
use crate::cluster::ClusterContext;
use crate::cluster::membership::{Membership, MembershipError, NodeRecord};
use crate::config::{ClusterConfig, Config};
use crate::fanout::CursorDeps;
use crate::fanout::committer::ChildCommitter;
use crate::fanout::metrics::FanoutMetrics;
use crate::fanout::plugin_metrics::{PluginMetrics, RouteObserver};
use crate::fanout::route::wasm::WasmRouterFactory;
use crate::fanout::status::FanoutView;
use crate::metastore::{FileMetastore, Metastore, MetastoreError};
use crate::ownership::PartitionOwnership;
use crate::ownership::SingleNode;
use crate::plugins::{PluginRegistry, RegistryError};
use crate::produce::Producer;
use crate::reconciler::Reconciler;
use crate::shutdown::ShutdownSignal;
use crate::topics::{TopicService, log_config, startup};

/// Errors starting or running the daemon. A variant wrapping another error names it as its
/// source and does not repeat it in its own message: print the chain (`{:#}` with anyhow).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The store refused to open (another daemon holds the data dir, or I/O failed).
    #[error(transparent)]
    Store(#[from] StorageError),
    /// The metastore file is corrupt, missing beside its backup, too new, or unreadable.
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// The topic directories on disk cannot be accounted for (a lost metastore) or could not
    /// be set aside.
    #[error(transparent)]
    Startup(#[from] startup::StartupError),
    /// The plugin registry could not open (content store, runtime, built-ins).
    #[error("cannot open the plugin registry")]
    Plugins(#[from] RegistryError),
    /// The TLS certificate, key or client CA file cannot be used.
    #[error("cannot serve TLS")]
    Tls(#[from] crate::tls::TlsError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why (in use, permission, ...).
        source: std::io::Error,
    },
    /// The node could not join its cluster (etcd unreachable, or another live process holds
    /// this node id).
    #[error("cannot join the cluster")]
    Membership(#[from] MembershipError),
    /// The data dir is not the one this node id serves from (a replaced or unmounted disk, a
    /// wrong --data-dir, another node's directory), or that could not be checked.
    #[error("cannot start on this data dir")]
    Identity(#[source] Box<crate::cluster::identity::IdentityError>),
    /// etcd refused a read the node needs at start.
    #[error("{context}")]
    Etcd {
        /// What was being read.
        context: String,
        /// The client's error.
        source: etcd_client::Error,
    },
    /// The cluster's peer secret could not be read or made.
    #[error(transparent)]
    PeerSecret(#[from] crate::cluster::peer_secret::PeerSecretError),
    /// The watched copy of the metadata did not reach etcd's latest metadata write within a
    /// lease TTL of joining.
    #[error(
        "the watched copy of the metadata did not catch up with etcd within a lease TTL after joining"
    )]
    MetadataBehind,
    /// The HTTP client for calls between nodes could not be built (TLS set-up).
    #[error("cannot build the client for calls between nodes: {0}")]
    Http(String),
    /// Another live node's id maps to the same Kafka broker id as this node's.
    #[error(
        "node ids {mine:?} and {theirs:?} (alive) map to the same Kafka broker id {broker_id}, \
         so Kafka clients could not tell the two apart; start this node with another --node-id"
    )]
    BrokerIdTaken {
        /// This node's id.
        mine: String,
        /// The live node with the same broker id.
        theirs: String,
        /// The broker id both map to.
        broker_id: i32,
    },
    /// The daemon's own task (the one [`RunningServer::wait`] waits for) panicked or was
    /// cancelled.
    #[error("daemon task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// Blocking work of the daemon (opening the data directory, closing the store) panicked or
    /// was cancelled.
    #[error("daemon task failed")]
    Blocking(#[from] crate::blocking::BlockingError),
}

/// What start-up opened: the store, the metadata, who owns what, and cluster mode's parts.
type Opened = (
    Arc<Store>,
    Arc<dyn Metastore>,
    Arc<dyn PartitionOwnership>,
    Option<Arc<ClusterContext>>,
);

/// A daemon that is serving.
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// The address the API listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits until the daemon has shut down (after its shutdown signal fired) and the store is
    /// closed.
    pub async fn wait(self) -> Result<(), ServerError> {
        self.task.await.map_err(ServerError::Task)?
    }
}

/// Opens the data dir and starts serving. Returns once the listener is bound.
pub async fn run_server(
    config: Config,
    shutdown: ShutdownSignal,
) -> Result<RunningServer, ServerError> {
    let data_dir = config.data_dir.clone();
    // Owner-only whatever the umask (missing parents too); the store tightens an existing one.
    let created = {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&data_dir)
    };
    created.map_err(|source| ServerError::DataDir {
        path: data_dir.clone(),
        source,
    })?;

    // TLS files read before anything starts, so a bad one stops the start with its reason.
    let tls_metrics = Arc::new(crate::tls::TlsMetrics::default());
    let (http_tls, kafka_tls) = match &config.tls {
        Some(files) => {
            let open = |alpn: &[&[u8]]| {
                crate::tls::ServerTls::open(files.clone(), alpn, Arc::clone(&tls_metrics))
            };
            let http = open(&[b"http/1.1"])?;
            http.spawn_reloader("http", shutdown.clone());
            let kafka = config.kafka_listen.map(|_| open(&[])).transpose()?;
            if let Some(kafka) = &kafka {
                kafka.spawn_reloader("kafka", shutdown.clone());
            }
            (Some(http), kafka)
        }
        None => (None, None),
    };

    // Bound first: in cluster mode the node advertises the address it got (port 0 in tests).
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: config.listen,
        source,
    })?;

    // Bound now, like the HTTP listener, so a taken port stops the start.
    let kafka_listener = match config.kafka_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind { addr, source })?,
        ),
        None => None,
    };
    let kafka_addr = kafka_listener.as_ref().and_then(|l| l.local_addr().ok());
    let (store, metastore, ownership, cluster): Opened = match &config.cluster {
        None => {
            let data_dir = data_dir.clone();
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
            (
                Arc::new(store),
                Arc::new(metastore),
                Arc::new(SingleNode::default()),
                None,
            )
        }
        Some(cluster) => {
            let (store, context) =
                start_cluster(cluster, &config, local_addr, kafka_addr, &shutdown).await?;
            (
                store,
                Arc::clone(&context.metastore) as Arc<dyn Metastore>,
                Arc::clone(&context.ownership) as Arc<dyn PartitionOwnership>,
                Some(context),
            )
        }
    };
    store.write_original_frames(config.original_frames);
    // Descriptors: connections of each listener and open logs each get their share.
    let listeners: u64 = if config.kafka_listen.is_some() { 2 } else { 1 };
    let max_open_logs = crate::fdlimit::default_max_open_logs(crate::fdlimit::current());
    store.limit_open_logs(max_open_logs);
    tracing::info!(
        max_open_logs,
        "partition logs open at once at most (the least recently used close first)"
    );
    let producer = Arc::new(match &cluster {
        // Fenced (etcd silent for nearly a lease TTL): no produce takes a write here.
        Some(context) => Producer::new(Arc::clone(&store)).with_fence(context.fence()),
        None => Producer::new(Arc::clone(&store)),
    });
    let plugins = Arc::new({
        let registry = PluginRegistry::open(
            &data_dir,
            Arc::clone(&metastore),
            config.plugin_limits.clone(),
        )
        .await?;
        match &cluster {
            // Uploaded to one node, fetched by digest by the others when a link needs it.
            Some(context) => {
                let context = Arc::clone(context);
                registry.with_fetcher(Arc::new(move |digest: &str| {
                    crate::cluster::modules::fetch_module_blocking(&context, digest)
                }))
            }
            None => registry,
        }
    });
    let topics = TopicService::new(
        Arc::clone(&store),
        Arc::clone(&metastore),
        Arc::clone(&producer),
        config.segment_bytes,
    );
    let topics = Arc::new(match &cluster {
        Some(context) => topics.with_cluster(Arc::clone(context)),
        None => topics,
    });
    let topics_for_sync = Arc::clone(&topics);

    let fanout_metrics = Arc::new(FanoutMetrics::default());
    let plugin_metrics = Arc::new(PluginMetrics::default());
    let api_metrics = Arc::new(ApiMetrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    fanout_metrics.register(&mut registry);
    plugin_metrics.register(&mut registry);
    api_metrics.register(&mut registry);
    let http_metrics = Arc::new(crate::http_server::HttpMetrics::default());
    http_metrics.register(&mut registry);
    tls_metrics.register(&mut registry);
    let cluster_metrics = Arc::new(crate::cluster::metrics::ClusterMetrics::default());
    cluster_metrics.register(&mut registry);
    if let Some(context) = &cluster {
        tokio::spawn(Arc::clone(&cluster_metrics).run(Arc::clone(context), shutdown.clone()));
    }
    let fanout_view = Arc::new(FanoutView::default());
    // Cluster mode: this node's receiver of child commits, shared by the commits other nodes
    // send and this node's own cursors, so each partition has one dedupe window and lock.
    let receiver = cluster.as_ref().map(|context| {
        let ownership = Arc::clone(&context.ownership);
        let owners: Arc<crate::cluster::receiver::OwnerLookup> =
            Arc::new(move |id: &PartitionId| ownership.owner_at(id));
        Arc::new(
            crate::cluster::receiver::CommitReceiver::new(
                context.node_id().to_owned(),
                Arc::clone(&store),
                owners,
            )
            .with_fence(context.fence())
            .with_parents(context.parents())
            .counting_reused_on(cluster_metrics.reused_origin_records.clone()),
        )
    });
    let reconciler = {
        let deps = Arc::new(CursorDeps {
            store: Arc::clone(&store),
            fs: Arc::new(narad_storage::fs::RealFs),
            committer: match (&cluster, &receiver) {
                (Some(context), Some(receiver)) => {
                    let ownership = Arc::clone(&context.ownership);
                    let peers = Arc::clone(&context.peers);
                    Arc::new(
                        crate::fanout::remote_commit::ClusterCommitter::new(
                            context.node_id().to_owned(),
                            Arc::clone(&producer),
                            Arc::new(move |id: &PartitionId| ownership.owner_at(id)),
                            Arc::new(move |node: &str| peers.advertise_of(node)),
                            crate::cluster::commit_rpc::CommitClient::trusting(&context.peer_tls)
                                .map_err(|e| ServerError::Http(e.to_string()))?
                                .with_bearer(context.peer_bearer.clone()),
                            Arc::clone(&fanout_metrics),
                        )
                        .with_local_receiver(Arc::clone(receiver))
                        .with_fence(context.fence())
                        .with_parents(context.parents()),
                    )
                }
                _ => Arc::clone(&producer) as Arc<dyn ChildCommitter>,
            },
            metastore: Arc::clone(&metastore),
            clock: Arc::new(narad_storage::SystemClock),
            timing: crate::fanout::FanoutTiming::default(),
            remote_tails: cluster.as_ref().map(|context| {
                Arc::new(api::internal::HttpTails::new(Arc::clone(context)))
                    as Arc<dyn crate::fanout::position::RemoteTails>
            }),
            node: cluster.as_ref().map(|context| context.node_id().to_owned()),
            leave_out_held: true,
        });
        let registry_for_loader = Arc::clone(&plugins);
        let routers = Arc::new(
            WasmRouterFactory::new(Arc::new(move |digest: &str| {
                registry_for_loader.load(digest).map_err(Into::into)
            }))
            .with_observer(Arc::clone(&plugin_metrics) as Arc<dyn RouteObserver>),
        );
        let reconciler = Reconciler::new(
            deps,
            Arc::clone(&ownership),
            routers,
            Arc::clone(&fanout_metrics),
            Arc::clone(&fanout_view),
        );
        tokio::spawn(reconciler.run(shutdown.clone()))
    };

    // Registered with or without the listener, so a scrape shows the same families whatever
    // the config (zeros when the listener is off).
    let kafka_metrics = Arc::new(crate::kafka::metrics::KafkaMetrics::default());
    kafka_metrics.register(&mut registry);
    // The consumer groups come with the Kafka listener; the HTTP API lists them too.
    let groups = kafka_listener.as_ref().map(|_| {
        let coordinator = Arc::new(crate::groups::Coordinator::new(
            Arc::clone(&store),
            Arc::clone(&producer),
            Arc::clone(&metastore),
            Arc::clone(&ownership),
            Arc::clone(&topics),
            config.groups,
        ));
        coordinator.spawn(shutdown.clone());
        coordinator
    });
    let kafka = kafka_listener.map(|listener| {
        let metrics = kafka_metrics;
        let mut deps = crate::kafka::KafkaDeps::new(
            config.limits.clone(),
            Arc::clone(&store),
            Arc::clone(&metastore),
            Arc::clone(&producer),
            Arc::clone(&ownership),
            shutdown.clone(),
            metrics,
        )
        .with_admin(
            Arc::clone(&topics),
            match config.auth_token {
                Some(_) => crate::kafka::admin::AdminAccess::TokenRequired,
                None => crate::kafka::admin::AdminAccess::Open,
            },
            config.kafka_auto_create,
        )
        .with_cluster(cluster.clone())
        .advertising(config.kafka_advertise.clone())
        .with_sasl(
            config
                .kafka_sasl
                .map(|sasl| crate::kafka::sasl::Sasl::new(sasl.plain)),
        );
        if let Some(coordinator) = &groups {
            deps = deps.with_groups(Arc::clone(coordinator));
        }
        let deps = Arc::new(deps);
        let options = crate::kafka::connection::ListenOptions {
            max_connections: config.http.max_connections.unwrap_or_else(|| {
                crate::fdlimit::default_max_connections(crate::fdlimit::current(), listeners)
            }),
            shutdown_grace: config.http.shutdown_grace,
        };
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(
                %addr,
                tls = kafka_tls.is_some(),
                sasl = config.kafka_sasl.is_some(),
                "kafka listener serving"
            );
            if config.kafka_sasl.is_some() && kafka_tls.is_none() {
                tracing::warn!(
                    "kafka listener: SASL without TLS; passwords stay secret with SCRAM, but \
                     records and the session cross the network in clear (give --tls-cert)"
                );
            }
        }
        tokio::spawn(crate::kafka::connection::serve(
            listener, deps, options, kafka_tls,
        ))
    });

    let mover = cluster.as_ref().map(|context| {
        let view = Arc::clone(&fanout_view);
        let data_dir = store.data_dir().to_path_buf();
        Arc::new(crate::cluster::moves::Mover::new(
            Arc::clone(context),
            Arc::clone(&store),
            crate::cluster::moves::MoveHooks {
                cursors_running: Arc::new(move |id: &PartitionId| {
                    view.running_on(&id.topic, id.partition)
                }),
                set_aside: Arc::new(move |dir: &std::path::Path, id: &PartitionId| {
                    crate::topics::set_aside::set_aside(
                        &data_dir,
                        dir,
                        &id.topic,
                        Some(id.partition),
                        "found where a moved-in copy was to go (left by an earlier move to this \
                         node that did not finish?); kept untouched: adopt or purge it with \
                         `narad admin set-aside`",
                        crate::topics::now_ms(),
                    )
                    .map(|_| ())
                    .map_err(|e| e.to_string())
                }),
            },
        ))
    });
    let recreator = match (&cluster, &receiver) {
        (Some(context), Some(receiver)) => {
            let data_dir = store.data_dir().to_path_buf();
            Some(Arc::new(crate::cluster::recreate::Recreator::new(
                Arc::clone(context),
                Arc::clone(&store),
                Arc::clone(receiver),
                Arc::new(move |dir: &std::path::Path, id: &PartitionId| {
                    crate::topics::set_aside::set_aside(
                        &data_dir,
                        dir,
                        &id.topic,
                        Some(id.partition),
                        "found where a re-created partition was to go; kept untouched: adopt or \
                         purge it with `narad admin set-aside`",
                        crate::topics::now_ms(),
                    )
                    .map(|_| ())
                    .map_err(|e| e.to_string())
                }),
            )))
        }
        _ => None,
    };
    let state = AppState::new(AppInner {
        groups,
        mover,
        recreator,
        limits: config.limits.clone(),
        store: Arc::clone(&store),
        metastore,
        topics,
        producer,
        ownership,
        shutdown: shutdown.clone(),
        plugins,
        fanout: fanout_view,
        metrics: Arc::new(registry),
        api_metrics,
        cluster: cluster.clone(),
        forward: match &cluster {
            Some(context) => Some(Arc::new(
                api::forward::Forwarder::trusting(
                    context.node_id(),
                    &config.limits,
                    &context.peer_tls,
                )
                .map_err(|e| ServerError::Http(e.to_string()))?
                .with_revision({
                    let metastore = Arc::clone(&context.metastore);
                    Arc::new(move || metastore.cache_revision())
                })
                .with_liveness({
                    let context = Arc::clone(context);
                    Arc::new(move |node: &str| context.peers.is_live(node))
                }),
            )),
            None => None,
        },
    });
    let peer_routes = api::peer_router(state.clone());
    let mut app = match config.auth_token.clone() {
        Some(token) => {
            let peer = cluster
                .as_ref()
                .and_then(|context| crate::auth::AuthToken::new(&context.peer_bearer));
            let guard = api::principal::Guard::new(
                token,
                peer,
                peer_liveness(&config, cluster.as_ref()),
                Arc::clone(&state.metastore),
                config.auth_reads,
                config.tls.is_some(),
                state.api_metrics.denied.clone(),
            );
            api::principal::guard(api::router(state), guard)
        }
        None => api::router(state),
    };
    if let (Some(receiver), Some(context)) = (&receiver, &cluster) {
        // Nodes present the cluster's peer secret, which no client holds, token or not.
        let internal = internal_router(Arc::clone(receiver)).merge(peer_routes);
        let secret = crate::auth::AuthToken::new(&context.peer_bearer)
            .ok_or_else(|| ServerError::Http("the cluster's peer secret is empty".to_owned()))?;
        let mut internal = api::auth::protect(internal, secret);
        if let Some(is_live) = peer_liveness(&config, Some(context)) {
            internal = api::auth::require_node_identity(internal, is_live);
        }
        app = app.merge(internal);
    }
    let owned_sync = cluster.as_ref().map(|context| {
        tokio::spawn(sync_owned(
            Arc::clone(context),
            Arc::clone(&topics_for_sync),
            receiver.clone(),
            shutdown.clone(),
        ))
    });

    let retention = spawn_loop(
        "retention",
        config.retention_check_interval,
        shutdown.clone(),
        Arc::clone(&store),
        |store| match store.enforce_retention() {
            Ok(report) => tracing::debug!(?report, "retention pass"),
            Err(e) => tracing::warn!(error = %e, "retention pass failed"),
        },
    );
    // Check for idle logs a few times per idle period so a log closes close to its deadline.
    let idle_tick = (config.idle_close_after / 4).max(Duration::from_secs(1));
    let idle = spawn_loop(
        "idle-close",
        idle_tick,
        shutdown.clone(),
        Arc::clone(&store),
        |store| {
            let closed = store.close_idle();
            if closed > 0 {
                tracing::debug!(closed, "closed idle partition logs");
            }
        },
    );

    let derived_cap =
        || crate::fdlimit::default_max_connections(crate::fdlimit::current(), listeners);
    let http_options = crate::http_server::ServeOptions {
        max_connections: config.http.max_connections.unwrap_or_else(derived_cap),
        header_read_timeout: config.http.header_read_timeout,
        idle_timeout: config.http.idle_timeout,
        shutdown_grace: config.http.shutdown_grace,
    };
    tracing::info!(
        addr = %local_addr,
        tls = http_tls.is_some(),
        data_dir = %data_dir.display(),
        "narad serving"
    );
    let task = tokio::spawn(async move {
        // Returns at most the shutdown grace after the signal, whatever clients do.
        crate::http_server::serve(
            listener,
            app,
            http_options,
            shutdown,
            http_metrics,
            http_tls,
        )
        .await;
        // The loops see the same signal; wait for them before closing the store under them.
        // Cursors stop before the store closes under them; a cursor cut short repeats its
        // slab on the next start.
        if let Some(kafka) = kafka {
            let _ = kafka.await;
        }
        let _ = reconciler.await;
        let _ = retention.await;
        let _ = idle.await;
        if let Some(sync) = owned_sync {
            let _ = sync.await;
        }
        if let Some(context) = &cluster {
            // Peers see this node gone now rather than a lease TTL from now.
            if let Err(e) = context.membership.leave().await {
                tracing::warn!(error = %e, "could not leave the cluster; the lease will expire");
            }
        }
        let closed = crate::blocking::run(move || store.close()).await?;
        closed?;
        tracing::info!("narad stopped; store closed cleanly");
        Ok(())
    });
    Ok(RunningServer { local_addr, task })
}

/// Joins the cluster: opens the store (taking the data-dir lock first), the metadata in etcd
/// with this node's watched copy, registers the node under its lease (refused when another
/// live process holds the id), watches the live nodes, and registers the partitions the
/// metadata says this node owns. Directories for anything else are left on disk and reported.
async fn start_cluster(
    cluster: &ClusterConfig,
    config: &Config,
    local_addr: SocketAddr,
    kafka_addr: Option<SocketAddr>,
    shutdown: &ShutdownSignal,
) -> Result<(Arc<Store>, Arc<ClusterContext>), ServerError> {
    let store = {
        let data_dir = config.data_dir.clone();
        let options = StoreOptions {
            idle_close_after: config.idle_close_after,
            failed_reopen_after: config.failed_reopen_after,
            ..StoreOptions::default()
        };
        Arc::new(crate::blocking::run(move || Store::open(&data_dir, options)).await??)
    };
    let client =
        crate::metastore::etcd::connect_secured(&cluster.etcd, &cluster.etcd_security).await?;
    let prefix = crate::cluster::prefix(&cluster.name);
    let peer_bearer = crate::cluster::peer_secret::load_or_create(&client, &prefix).await?;
    let metastore = Arc::new(
        crate::metastore::EtcdMetastore::with_cache(
            client.clone(),
            prefix.clone(),
            crate::metastore::cache::CacheTiming::default(),
            shutdown.clone(),
        )
        .await?,
    );
    // Before joining: a node must not be seen alive, let alone given partitions, on a data
    // dir that is not its own.
    {
        let snapshot = metastore.cached_snapshot().ok_or_else(|| {
            MetastoreError::Task("the cluster metastore has no watched copy".to_owned())
        })??;
        let owned = owned_by(&snapshot, &cluster.node_id);
        crate::cluster::identity::establish(
            &client,
            &prefix,
            &cluster.node_id,
            &config.data_dir,
            cluster.new_data_dir,
            &owned,
        )
        .await?;
    }
    let advertise = cluster.advertise.clone().unwrap_or_else(|| {
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{local_addr}")
    });
    // Kafka clients reach this node at --kafka-advertise, or at the advertised host and the
    // Kafka listener's port.
    let kafka = kafka_addr.map(|addr| match &config.kafka_advertise {
        Some((host, port)) => format!("{host}:{port}"),
        None => format!("{}:{}", url_host(&advertise), addr.port()),
    });
    let record = NodeRecord {
        id: cluster.node_id.clone(),
        advertise,
        joined_at_ms: crate::topics::now_ms(),
        kafka,
    };
    let membership = Arc::new(
        Membership::join(
            client.clone(),
            prefix.clone(),
            record,
            cluster.lease_ttl,
            &config.data_dir,
        )
        .await?,
    );
    // The metadata was read before the key existed: a partition re-created elsewhere in
    // between (allowed only while this node had no key) must be known before anything is
    // served as this node's.
    if !membership.catch_up(&metastore).await? {
        return Err(ServerError::MetadataBehind);
    }
    spawn_lease_keeper(
        Arc::clone(&membership),
        Arc::clone(&metastore),
        cluster.etcd.clone(),
        cluster.etcd_security.clone(),
        shutdown.clone(),
    )?;
    let peers = Arc::new(
        crate::cluster::peers::PeerDirectory::start(
            client,
            &prefix,
            crate::metastore::cache::CacheTiming::default(),
            shutdown.clone(),
        )
        .await
        .map_err(|source| ServerError::Etcd {
            context: format!("reading the live nodes under {prefix}nodes/"),
            source,
        })?,
    );
    // Kafka names brokers by a 31-bit id derived from the node id: two live nodes must not
    // share one (about 1 in 4 x 10^8 for a pair, checked rather than hoped for).
    let live = peers.live();
    if let Some(other) =
        crate::kafka::broker_id_clash(&cluster.node_id, live.iter().map(|n| n.id.as_str()))
    {
        let (other, broker_id) = (other.to_owned(), crate::kafka::broker_id(other));
        if let Err(e) = membership.leave().await {
            tracing::warn!(error = %e, "could not leave the cluster after refusing to start");
        }
        return Err(ServerError::BrokerIdTaken {
            mine: cluster.node_id.clone(),
            theirs: other,
            broker_id,
        });
    }
    let ownership = Arc::new(crate::cluster::ownership::ClusterOwnership::new(
        crate::ownership::NodeId(cluster.node_id.clone()),
        Arc::clone(&metastore),
    ));
    let peer_tls = Arc::new(crate::tls::PeerTls {
        roots: match &cluster.peer_tls_ca {
            Some(path) => crate::tls::client_roots(path)?,
            None => Vec::new(),
        },
        identity: match &cluster.peer_identity {
            Some((cert, key)) => Some(crate::tls::client_identity(cert, key)?),
            None => None,
        },
        node: Some(
            reqwest::header::HeaderValue::from_str(&cluster.node_id)
                .map_err(|e| ServerError::Http(format!("node id as a header: {e}")))?,
        ),
    });
    let http =
        crate::cluster::peer_client(&peer_tls).map_err(|e| ServerError::Http(e.to_string()))?;
    let context = Arc::new(ClusterContext {
        peer_tls,
        prefix,
        membership,
        metastore,
        ownership,
        peers,
        http,
        peer_bearer,
    });
    let snapshot = current_snapshot(&context)?;
    let registered = {
        let (store, context, snapshot) = (Arc::clone(&store), Arc::clone(&context), snapshot);
        let segment_bytes = config.segment_bytes;
        crate::blocking::run(move || {
            let registered = crate::topics::owned::register_owned(
                &store,
                &snapshot,
                context.node_id(),
                segment_bytes,
            )?;
            let unaccounted =
                crate::topics::owned::unaccounted(store.data_dir(), &snapshot, context.node_id());
            Ok::<_, StorageError>((registered, unaccounted))
        })
        .await??
    };
    match registered.1 {
        Ok(dirs) if dirs.is_empty() => {}
        Ok(dirs) => tracing::warn!(
            count = dirs.len(),
            first = %dirs[0],
            "partition directories this node does not own are left on disk untouched"
        ),
        Err(e) => tracing::warn!(error = %e, "could not scan topics/ for unowned directories"),
    }
    tracing::info!(
        node = %context.node_id(),
        cluster = %cluster.name,
        owned_registered = registered.0,
        "joined the cluster"
    );
    Ok((store, context))
}

/// Renews the node's lease on a thread and runtime of its own, with an etcd client of its
/// own: no work on the daemon's async workers (a decode, a burst of requests) can delay a
/// renewal until the node fences itself and its peers count it dead. The thread ends with
/// `shutdown`.
fn spawn_lease_keeper(
    membership: Arc<Membership>,
    metastore: Arc<crate::metastore::EtcdMetastore>,
    endpoints: Vec<String>,
    security: crate::config::EtcdSecurity,
    shutdown: ShutdownSignal,
) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("narad-lease")
        .build()
        .map_err(|e| ServerError::Http(format!("cannot build the lease runtime: {e}")))?;
    std::thread::Builder::new()
        .name("narad-lease".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let client =
                    match crate::metastore::etcd::connect_secured(&endpoints, &security).await {
                        Ok(client) => Some(client),
                        Err(e) => {
                            tracing::warn!(error = %e, "no etcd client of the lease thread's own; \
                            renewing through the daemon's");
                            None
                        }
                    };
                membership
                    .keep_alive(shutdown, Some(metastore), client)
                    .await;
            });
        })
        .map_err(|e| ServerError::Http(format!("cannot start the lease thread: {e}")))?;
    Ok(())
}

impl From<crate::cluster::identity::IdentityError> for ServerError {
    fn from(e: crate::cluster::identity::IdentityError) -> ServerError {
        ServerError::Identity(Box::new(e))
    }
}

/// The partitions `snapshot` gives to `node`.
fn owned_by(snapshot: &crate::metastore::Snapshot, node: &str) -> Vec<PartitionId> {
    snapshot
        .topics
        .values()
        .flat_map(|t| {
            t.owners
                .iter()
                .enumerate()
                .filter(|(_, o)| o.node == node)
                .filter_map(|(p, _)| u32::try_from(p).ok())
                .map(|p| PartitionId::new(t.name.clone(), p))
        })
        .collect()
}

/// The host of `url` (`http://HOST:PORT/...`), without brackets for an IPv6 address.
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    }
}

/// The metadata as this node's watched copy has it.
fn current_snapshot(
    context: &ClusterContext,
) -> Result<Arc<crate::metastore::Snapshot>, MetastoreError> {
    match context.metastore.cached_snapshot() {
        Some(snapshot) => snapshot,
        None => Err(MetastoreError::Task(
            "the cluster metastore has no watched copy".to_owned(),
        )),
    }
}

/// Keeps the store in line with the watched metadata whenever it changes, until `shutdown`:
/// newly owned partitions registered, topics the metadata no longer names set aside, the
/// dedupe windows of partitions owned elsewhere dropped.
async fn sync_owned(
    context: Arc<ClusterContext>,
    topics: Arc<TopicService>,
    receiver: Option<Arc<crate::cluster::receiver::CommitReceiver>>,
    shutdown: ShutdownSignal,
) {
    let mut ticker = tokio::time::interval(OWNED_SYNC_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Arc<crate::metastore::Snapshot>> = None;
    loop {
        tokio::select! {
            () = shutdown.wait() => break,
            _ = ticker.tick() => {}
        }
        let snapshot = match current_snapshot(&context) {
            Ok(snapshot) => snapshot,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the metadata copy to register owned partitions");
                continue;
            }
        };
        if last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &snapshot)) {
            continue;
        }
        match topics.sync_owned().await {
            Ok((moved, new)) => {
                if !moved.is_empty() {
                    tracing::warn!(
                        topics = ?moved,
                        "topics gone from the cluster metadata were set aside; see `narad admin set-aside list`"
                    );
                }
                if new > 0 {
                    tracing::info!(new, "registered newly owned partitions");
                }
                if let Some(receiver) = &receiver {
                    let forgotten = receiver.forget_unowned();
                    if forgotten > 0 {
                        tracing::debug!(
                            forgotten,
                            "dropped the dedupe windows of partitions owned elsewhere"
                        );
                    }
                }
                last = Some(snapshot);
            }
            Err(e) => tracing::warn!(error = %e, "syncing owned partitions failed; retrying"),
        }
    }
}

/// How often the owned-partition registration looks for a new metadata copy: a partition
/// created on another node is registered here within this (plus the watch's round trip).
const OWNED_SYNC_EVERY: Duration = Duration::from_millis(100);

/// The routes only nodes call: the child commit, with its own body limit (a whole slab; the
/// in-order commit, a few slabs).
/// With mutual TLS between nodes (`--tls-client-ca` in cluster mode), whether a node is live,
/// for the check that a call between nodes comes from the node its certificate names.
fn peer_liveness(
    config: &Config,
    cluster: Option<&Arc<ClusterContext>>,
) -> Option<api::auth::IsLive> {
    let proves = config
        .cluster
        .as_ref()
        .is_some_and(|cluster| cluster.peers_prove_identity);
    let context = Arc::clone(cluster.filter(|_| proves)?);
    Some(Arc::new(move |node: &str| context.peers.is_live(node)))
}

fn internal_router(receiver: Arc<crate::cluster::receiver::CommitReceiver>) -> axum::Router {
    use crate::cluster::commit_rpc::{
        COMMIT_IN_ORDER_PATH, COMMIT_PATH, commit_in_order_route, commit_route, in_order_body_limit,
    };
    use crate::cluster::commit_wire::MAX_COMMIT_REQUEST_BYTES;
    axum::Router::new()
        .route(COMMIT_PATH, axum::routing::post(commit_route))
        .route(
            COMMIT_IN_ORDER_PATH,
            axum::routing::post(commit_in_order_route).layer(in_order_body_limit()),
        )
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/highest-origin",
            axum::routing::post(crate::cluster::recreate::highest_origin_route),
        )
        .layer(axum::extract::DefaultBodyLimit::max(
            MAX_COMMIT_REQUEST_BYTES,
        ))
        .with_state(receiver)
}

/// Opens the store (taking the data-dir lock first, so a second daemon stops before reading
/// anything) and the metastore, accounts for every directory of `topics/` (finishing or
/// undoing interrupted changes from their intent records, setting aside what nothing explains,
/// refusing a lost metastore: [`crate::topics::startup`]), then registers every partition the
/// metastore names (quarantining one whose directory is gone).
fn open_data_dir(
    data_dir: &std::path::Path,
    idle_close_after: Duration,
    failed_reopen_after: Duration,
    segment_bytes: u64,
) -> Result<(Store, FileMetastore), ServerError> {
    let store = Store::open(
        data_dir,
        StoreOptions {
            idle_close_after,
            failed_reopen_after,
            ..StoreOptions::default()
        },
    )?;
    let metastore = FileMetastore::open(data_dir)?;
    let snapshot = metastore.snapshot_now();
    let report = startup::reconcile(
        &store,
        &snapshot.topics,
        metastore.started_empty(),
        crate::topics::now_ms(),
    )?;
    if !report.set_aside.is_empty() {
        tracing::warn!(
            entries = report.set_aside.len(),
            "directories were set aside at start; see `narad admin set-aside list`"
        );
    }
    for topic in snapshot.topics.values() {
        let config = log_config(topic, segment_bytes);
        for p in 0..topic.partitions {
            // Recorded, so its directory was made: one that is gone is quarantined, not
            // made again empty (its offsets would go to new records).
            store.register_partition(&PartitionId::new(topic.name.clone(), p), config.clone())?;
        }
    }
    Ok((store, metastore))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use narad_storage::{AppendBatch, BatchOrigin, LogConfig, NewRecord, PartitionId, Store};

    use super::internal_router;
    use crate::cluster::commit_rpc::{COMMIT_PATH, CommitClient};
    use crate::cluster::commit_wire::{CommitRequest, CommitResponse, MAX_COMMIT_REQUEST_BYTES};
    use crate::cluster::receiver::{CommitReceiver, OwnerLookup};
    use crate::metastore::PartitionOwner;

    /// A commit of one record of `value_bytes` bytes at parent offset `offset`.
    fn commit_of(offset: u64, value_bytes: usize) -> CommitRequest {
        let batch = AppendBatch {
            records: vec![NewRecord {
                value: Some(Bytes::from(vec![7u8; value_bytes])),
                ..NewRecord::default()
            }],
            origin: Some(BatchOrigin {
                epoch: [1; 8],
                parent_partition: 0,
                slab_start: offset,
                parent_offsets: vec![offset],
            }),
        };
        CommitRequest::from_batch("child", 0, 1, &batch).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_in_order_commit_takes_two_slabs_of_bytes_and_the_single_commit_still_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), Default::default()).unwrap());
        let id = PartitionId::new("child", 0);
        store.create_partition(&id, LogConfig::default()).unwrap();
        let owners: Arc<OwnerLookup> =
            Arc::new(|_: &PartitionId| Some(PartitionOwner::first("n1")));
        let receiver = Arc::new(CommitReceiver::new(
            "n1".to_owned(),
            Arc::clone(&store),
            owners,
        ));
        let app = internal_router(receiver);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });

        // Two commits of 3 MiB each: more than one commit's limit, within the call's.
        let big = 3 * 1024 * 1024;
        let requests = [commit_of(0, big), commit_of(1, big)];
        let answers = CommitClient::new()
            .unwrap()
            .commit_in_order(&url, &requests)
            .await
            .unwrap();
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, CommitResponse::Committed { appended: 1, .. })),
            "{answers:?}"
        );
        assert_eq!(store.high_watermark(&id).unwrap(), 2);

        // The single commit keeps its own limit.
        let status = reqwest::Client::new()
            .post(format!("{url}{COMMIT_PATH}"))
            .body(vec![0u8; MAX_COMMIT_REQUEST_BYTES + 1])
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, reqwest::StatusCode::PAYLOAD_TOO_LARGE);
        server.abort();
    }
}
