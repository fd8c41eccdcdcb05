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

use narad_storage::StorageError;
use tokio::task::JoinHandle;

use crate::api::{AppInner, AppState};
use crate::cluster::membership::MembershipError;
use crate::config::Config;
use crate::fanout::status::FanoutView;
use crate::metastore::MetastoreError;
use crate::plugins::RegistryError;
use crate::shutdown::ShutdownSignal;
use crate::topics::{TopicService, startup};

mod cluster_start;
mod data_dir;
mod parts;

use cluster_start::{peer_liveness, start_cluster, sync_owned};
use data_dir::open_data_dir;

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
///
/// The composition root: each part is made by one function of `parts` from the parts before
/// it, in the order they depend on each other; what runs in the background is started here
/// and waited for, in [`Background::stopped`](parts::Background::stopped), before the store closes.
pub async fn run_server(
    config: Config,
    shutdown: ShutdownSignal,
) -> Result<RunningServer, ServerError> {
    create_data_dir(&config.data_dir)?;
    // TLS files read before anything starts, so a bad one stops the start with its reason.
    let tls_metrics = Arc::new(crate::tls::TlsMetrics::default());
    let parts::ListenerTls {
        http: http_tls,
        kafka: kafka_tls,
    } = parts::open_tls(&config, &tls_metrics, &shutdown)?;
    // Bound first: in cluster mode the node advertises the addresses it got (port 0 in tests),
    // and a taken port stops the start.
    let (listener, local_addr) = parts::bind(config.listen).await?;
    let kafka_listener = match config.kafka_listen {
        Some(addr) => Some(parts::bind(addr).await?),
        None => None,
    };
    let kafka_addr = kafka_listener.as_ref().map(|(_, addr)| *addr);
    let opened = parts::open_node(&config, local_addr, kafka_addr, &shutdown).await?;
    let (store, cluster) = (Arc::clone(&opened.store), opened.cluster.clone());
    store.write_original_frames(config.original_frames);
    let max_open_logs = crate::fdlimit::default_max_open_logs(crate::fdlimit::current());
    store.limit_open_logs(max_open_logs);
    tracing::info!(
        max_open_logs,
        "partition logs open at once at most (the least recently used close first)"
    );

    let producer = Arc::new(parts::producer(&store, cluster.as_ref()));
    let plugins = Arc::new(parts::plugins(&config, &opened.metastore, cluster.as_ref()).await?);
    let topics = TopicService::new(
        Arc::clone(&store),
        Arc::clone(&opened.metastore),
        Arc::clone(&producer),
        config.segment_bytes,
    );
    let topics = Arc::new(match &cluster {
        Some(context) => topics.with_cluster(Arc::clone(context)),
        None => topics,
    });
    let metrics = parts::Metrics::register(&tls_metrics);
    if let Some(context) = &cluster {
        tokio::spawn(Arc::clone(&metrics.cluster).run(Arc::clone(context), shutdown.clone()));
    }

    let fanout_view = Arc::new(FanoutView::default());
    let receiver = parts::commit_receiver(cluster.as_ref(), &store, &metrics.cluster);
    let committer = parts::child_committer(
        cluster.as_ref(),
        receiver.as_ref(),
        &producer,
        &metrics.fanout,
    )?;
    let fanout = parts::FanoutParts {
        store: Arc::clone(&store),
        metastore: Arc::clone(&opened.metastore),
        ownership: Arc::clone(&opened.ownership),
        committer,
        plugins: Arc::clone(&plugins),
        view: Arc::clone(&fanout_view),
    };
    let reconciler = parts::start_reconciler(fanout, cluster.as_ref(), &metrics, &shutdown);

    let groups = kafka_listener
        .as_ref()
        .map(|_| parts::start_groups(&config, &opened, &producer, &topics, &shutdown));
    let kafka = kafka_listener.map(|(listener, _)| {
        parts::start_kafka(
            listener,
            kafka_tls,
            &config,
            &opened,
            &producer,
            &topics,
            groups.as_ref(),
            &metrics,
            &shutdown,
        )
    });

    let state = AppState::new(AppInner {
        mover: parts::mover(cluster.as_ref(), &store, &fanout_view),
        recreator: parts::recreator(cluster.as_ref(), &store, receiver.as_ref()),
        forward: parts::forwarder(cluster.as_ref(), &config)?,
        groups,
        limits: config.limits.clone(),
        store: Arc::clone(&store),
        metastore: Arc::clone(&opened.metastore),
        topics: Arc::clone(&topics),
        producer,
        ownership: Arc::clone(&opened.ownership),
        shutdown: shutdown.clone(),
        plugins,
        fanout: fanout_view,
        metrics: Arc::new(metrics.registry),
        api_metrics: metrics.api,
        cluster: cluster.clone(),
    });
    let app = parts::http_app(state, &config, cluster.as_ref(), receiver.as_ref())?;

    let owned_sync = cluster.as_ref().map(|context| {
        tokio::spawn(sync_owned(
            Arc::clone(context),
            Arc::clone(&topics),
            receiver.clone(),
            shutdown.clone(),
        ))
    });
    let (retention, idle_close) = parts::spawn_upkeep(&config, &store, &shutdown);
    let background = parts::Background {
        kafka,
        reconciler,
        owned_sync,
        retention,
        idle_close,
    };

    let http_options = crate::http_server::ServeOptions {
        max_connections: parts::max_connections(&config),
        header_read_timeout: config.http.header_read_timeout,
        idle_timeout: config.http.idle_timeout,
        shutdown_grace: config.http.shutdown_grace,
    };
    tracing::info!(
        addr = %local_addr,
        tls = http_tls.is_some(),
        data_dir = %config.data_dir.display(),
        "narad serving"
    );
    let task = tokio::spawn(async move {
        // Returns at most the shutdown grace after the signal, whatever clients do.
        crate::http_server::serve(
            listener,
            app,
            http_options,
            shutdown,
            metrics.http,
            http_tls,
        )
        .await;
        // Cursors stop before the store closes under them; a cursor cut short repeats its
        // slab on the next start.
        background.stopped().await;
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

/// Creates the data directory, owner-only whatever the umask (missing parents too); the store
/// tightens an existing one.
fn create_data_dir(data_dir: &std::path::Path) -> Result<(), ServerError> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(|source| ServerError::DataDir {
            path: data_dir.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests;
