//! Cluster mode's part of a start: joining the cluster on etcd, keeping the lease, serving the
//! partitions the metadata gives this node, and the routes only peers may call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use narad_storage::{PartitionId, StorageError, Store, StoreOptions};

use super::ServerError;
use crate::api;
use crate::cluster::ClusterContext;
use crate::cluster::membership::{Membership, NodeRecord};
use crate::config::{ClusterConfig, Config};
use crate::metastore::MetastoreError;
use crate::shutdown::ShutdownSignal;
use crate::topics::TopicService;

/// Joins the cluster: opens the store (taking the data-dir lock first), the metadata in etcd
/// with this node's watched copy, registers the node under its lease (refused when another
/// live process holds the id), watches the live nodes, and registers the partitions the
/// metadata says this node owns. Directories for anything else are left on disk and reported.
pub(super) async fn start_cluster(
    cluster: &ClusterConfig,
    config: &Config,
    local_addr: SocketAddr,
    kafka_addr: Option<SocketAddr>,
    shutdown: &ShutdownSignal,
) -> Result<(Arc<Store>, Arc<ClusterContext>), ServerError> {
    // One file system for the store, the identity file and the lease file.
    let fs = crate::durable::real();
    let store = {
        let data_dir = config.data_dir.clone();
        let options = StoreOptions {
            fs: Arc::clone(&fs),
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
        let owned: Vec<PartitionId> =
            crate::topics::owned::owned_by(&snapshot, &cluster.node_id).collect();
        crate::cluster::identity::establish(
            &*fs,
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
            Arc::clone(&fs),
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
    let peer = crate::peer::PeerClient::new(&peer_tls)
        .map_err(|e| ServerError::Http(e.to_string()))?
        .with_secret(&peer_bearer);
    let context = Arc::new(ClusterContext {
        peer_tls,
        prefix,
        membership,
        metastore,
        ownership,
        peers,
        peer,
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
pub(super) async fn sync_owned(
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
pub(super) fn peer_liveness(
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
