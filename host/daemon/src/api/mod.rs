//! The HTTP API (axum), one file per resource:
//! - [`topics`]: `POST/GET /v1/topics`, `GET/DELETE /v1/topics/{t}`,
//!   `POST /v1/topics/{t}/partitions`;
//! - [`topic_config`]: `PATCH /v1/topics/{t}` (retention);
//! - [`records`]: `POST /v1/topics/{t}/records`, `GET /v1/topics/{t}/partitions/{p}/records`;
//!   [`forward`]: the same, forwarded one hop to the partition's owner in cluster mode;
//! - [`plugins`]: `POST/GET /v1/plugins`, `DELETE /v1/plugins/{name}`;
//! - [`children`]: `PUT/PATCH/DELETE /v1/topics/{parent}/children/{child}`, `.../pause`,
//!   `.../resume`, `.../seek`,
//!   `GET /v1/topics/{parent}/children`;
//! - [`gaps`]: `GET /v1/topics/{parent}/children/{child}/gaps` (what a link's cursors moved
//!   past without copying);
//! - [`shadow`]: `PUT/GET/DELETE /v1/topics/{parent}/children/{child}/shadow` (a candidate
//!   chain routing a copy of the link's slabs, compared, never committed);
//! - [`moves`]: `POST /v1/topics/{t}/partitions/{p}/move` and `.../recreate`, and the internal
//!   routes of a move;
//! - [`metrics`]: `GET /metrics`;
//! - [`health`]: `GET /healthz`;
//! - [`admin`]: `GET /v1/admin/set-aside`, `POST /v1/admin/set-aside/{id}/adopt`,
//!   `DELETE /v1/admin/set-aside/{id}` (directories start-up could not account for);
//! - [`auth`]: the optional bearer token on every mutating request (`--auth-token-file`);
//! - [`types`]: the JSON shapes (shared with the CLI), [`error`]: the JSON error answer,
//!   [`extract`]: extractors that turn axum's rejections into that answer;
//! - [`body_budget`]: the bytes of request bodies buffered across all requests
//!   (`max-buffered-request-bytes`).

pub mod acls;
pub(crate) mod admin;
pub(crate) mod auth;
pub(crate) mod body_budget;
pub mod children;
pub mod error;
pub(crate) mod extract;
pub(crate) mod forward;
pub mod gaps;
pub mod groups;
pub(crate) mod health;
pub(crate) mod internal;
pub(crate) mod metrics;
pub(crate) mod moves;
pub(crate) mod nodes;
pub mod plugins;
pub(crate) mod principal;
pub(crate) mod records;
pub(crate) mod shadow;
pub(crate) mod topic_config;
pub(crate) mod topics;
pub mod types;
pub mod users;

use std::ops::Deref;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{delete, get, post, put};
use narad_storage::Store;

use crate::config::Limits;
use crate::metastore::Metastore;
use crate::ownership::PartitionOwnership;
use crate::plugins::PluginRegistry;
use crate::produce::Producer;
use crate::shutdown::ShutdownSignal;
use crate::topics::TopicService;
use error::ApiError;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<AppInner>);

/// The shared parts behind [`AppState`].
pub struct AppInner {
    /// Request and record limits.
    pub limits: Limits,
    /// The partition logs.
    pub store: Arc<Store>,
    /// Topic metadata.
    pub metastore: Arc<dyn Metastore>,
    /// Topic administration.
    pub topics: Arc<TopicService>,
    /// The produce / commit path.
    pub producer: Arc<Producer>,
    /// Which node serves which partition.
    pub ownership: Arc<dyn PartitionOwnership>,
    /// Ends long-polls early when the daemon shuts down.
    pub shutdown: ShutdownSignal,
    /// The routing plugins (registry, runtime, content store).
    pub plugins: Arc<PluginRegistry>,
    /// The cursors running on this node, for the children listing.
    pub fanout: Arc<crate::fanout::status::FanoutView>,
    /// Every metric series, for `GET /metrics`.
    pub metrics: Arc<prometheus_client::registry::Registry>,
    /// The API's own series (produce and fetch traffic, storage gauges), registered in
    /// `metrics`.
    pub(crate) api_metrics: Arc<metrics::ApiMetrics>,
    /// Cluster mode's membership, peers and ownership; `None` on a single node.
    pub cluster: Option<Arc<crate::cluster::ClusterContext>>,
    /// Forwards produce and fetch requests for partitions other nodes own (cluster mode);
    /// `None` on a single node, where such requests answer 421.
    pub forward: Option<Arc<forward::Forwarder>>,
    /// Runs this node's side of planned partition moves (cluster mode).
    pub(crate) mover: Option<Arc<crate::operations::moves::Mover>>,
    /// Runs this node's side of forced re-creations of a dead node's partitions (cluster
    /// mode).
    pub(crate) recreator: Option<Arc<crate::operations::recreate::Recreator>>,
    /// The Kafka listener's consumer groups (`None` without `--kafka-listen`).
    pub(crate) groups: Option<Arc<crate::groups::Coordinator>>,
}

impl AppState {
    /// Wraps the shared parts.
    pub fn new(inner: AppInner) -> AppState {
        AppState(Arc::new(inner))
    }
}

impl Deref for AppState {
    type Target = AppInner;
    fn deref(&self) -> &AppInner {
        &self.0
    }
}

/// The API router with its body limit and JSON fallbacks.
pub fn router(state: AppState) -> Router {
    let body_limit = usize::try_from(state.limits.max_request_bytes).unwrap_or(usize::MAX);
    let plugin_limit = usize::try_from(state.limits.max_plugin_bytes).unwrap_or(usize::MAX);
    let budget = Arc::new(body_budget::BodyBudget::new(
        "max-buffered-request-bytes",
        state.limits.max_buffered_request_bytes,
        state
            .limits
            .max_request_bytes
            .max(state.limits.max_plugin_bytes),
        state.api_metrics.buffered_request_bytes.clone(),
        state.api_metrics.body_budget_refusals.clone(),
    ));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/v1/topics", post(topics::create).get(topics::list))
        .route(
            "/v1/topics/{topic}",
            get(topics::describe)
                .delete(topics::delete)
                .patch(topic_config::update),
        )
        .route("/v1/topics/{topic}/partitions", post(topics::grow))
        .route("/v1/topics/{topic}/records", post(records::produce))
        .route(
            "/v1/topics/{topic}/partitions/{partition}/records",
            get(records::fetch),
        )
        // The upload has its own limit; this inner layer overrides the router-wide one.
        .route(
            "/v1/plugins",
            post(plugins::deploy)
                .layer(DefaultBodyLimit::max(plugin_limit))
                .get(plugins::list),
        )
        .route("/v1/plugins/{name}", delete(plugins::remove))
        .route("/v1/topics/{parent}/children", get(children::list))
        .route(
            "/v1/topics/{parent}/children/{child}",
            put(children::attach)
                .patch(children::set_router)
                .delete(children::detach),
        )
        .route(
            "/v1/topics/{parent}/children/{child}/pause",
            post(children::pause),
        )
        .route(
            "/v1/topics/{parent}/children/{child}/resume",
            post(children::resume),
        )
        .route(
            "/v1/topics/{parent}/children/{child}/seek",
            post(children::seek),
        )
        .route("/v1/topics/{parent}/children/{child}/gaps", get(gaps::list))
        .route(
            "/v1/topics/{parent}/children/{child}/shadow",
            put(shadow::set).get(shadow::show).delete(shadow::clear),
        )
        .route("/v1/admin/set-aside", get(admin::list))
        .route("/v1/admin/set-aside/{id}", delete(admin::purge))
        .route("/v1/admin/set-aside/{id}/adopt", post(admin::adopt))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/nodes", get(nodes::list))
        .route(
            "/v1/acls",
            get(acls::list).post(acls::add).delete(acls::remove),
        )
        .route("/v1/users", get(users::list).post(users::create))
        .route("/v1/users/{name}", delete(users::delete))
        .route("/v1/users/{name}/credentials", put(users::set_credentials))
        .route("/v1/groups", get(groups::list))
        .route("/v1/groups/{group}", get(groups::describe))
        .route(
            "/v1/groups/{group}/reset-offsets",
            post(groups::reset_offsets),
        )
        .route(
            "/v1/nodes/{id}/cordon",
            post(nodes::cordon).delete(nodes::uncordon),
        )
        .route(
            "/v1/topics/{topic}/partitions/{partition}/move",
            post(moves::move_partition),
        )
        .route(
            "/v1/topics/{topic}/partitions/{partition}/recreate",
            post(moves::recreate),
        )
        .route(
            "/internal/v1/topics/{topic}/high-watermarks",
            get(internal::high_watermarks),
        )
        .route(
            "/internal/v1/topics/{topic}/offsets-at",
            get(internal::offsets_at),
        )
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/tail",
            get(internal::tail),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            internal::wait_for_caller_revision,
        ))
        // Outermost, so every body is counted before any extractor reads it.
        .layer(axum::middleware::from_fn_with_state(
            budget,
            body_budget::limit_bodies,
        ))
        .with_state(state)
}

/// Every route only other nodes call (`/internal/v1/...` that change something: commits, a
/// move's and a re-creation's steps, module bytes, seeks, group offset resets); the server
/// mounts them under the peer secret. The internal reads (high watermarks, offsets by time,
/// tail scans) are in [`router`], readable with the operator's token as with the peer secret.
///
/// Their bodies count against a budget of their own (`max-buffered-peer-request-bytes`), apart
/// from clients': clients cannot crowd out child commits, and a node sending more than this
/// node holds at once is answered 503 and sends again.
pub(crate) fn peer_routes(
    state: AppState,
    receiver: std::sync::Arc<crate::cluster::receiver::CommitReceiver>,
) -> Router {
    let budget = Arc::new(body_budget::BodyBudget::new(
        "max-buffered-peer-request-bytes",
        state.limits.max_buffered_peer_request_bytes,
        crate::cluster::commit_wire::MAX_PEER_REQUEST_BYTES as u64,
        state.api_metrics.buffered_peer_request_bytes.clone(),
        state.api_metrics.peer_body_budget_refusals.clone(),
    ));
    commit_router(receiver)
        .merge(peer_router(state))
        .layer(axum::middleware::from_fn_with_state(
            budget,
            body_budget::limit_bodies,
        ))
}

/// The routes that take other nodes' child commits, and the re-creation's question about the
/// origins a child partition holds, on this node's commit receiver.
pub(crate) fn commit_router(
    receiver: std::sync::Arc<crate::cluster::receiver::CommitReceiver>,
) -> Router {
    use crate::cluster::commit_rpc::{
        COMMIT_FRAMES_PATH, COMMIT_IN_ORDER_PATH, COMMIT_PATH, commit_frames_route,
        commit_in_order_route, commit_route, in_order_body_limit,
    };
    use crate::cluster::commit_wire::MAX_COMMIT_REQUEST_BYTES;
    Router::new()
        .route(COMMIT_PATH, post(commit_route))
        .route(
            COMMIT_IN_ORDER_PATH,
            post(commit_in_order_route).layer(in_order_body_limit()),
        )
        // Read as a stream, so no body limit applies: the route's reader bounds what it
        // takes from the head it reads first (commit_wire::FramesReader).
        .route(COMMIT_FRAMES_PATH, post(commit_frames_route))
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/highest-origin",
            post(crate::operations::recreate::highest_origin_route),
        )
        .layer(DefaultBodyLimit::max(MAX_COMMIT_REQUEST_BYTES))
        .with_state(receiver)
}

/// The routes only other nodes call that act on this node's API state (a move's steps).
fn peer_router(state: AppState) -> Router {
    Router::new()
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/move-in",
            post(moves::move_in),
        )
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/recreate-here",
            post(moves::recreate_here),
        )
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/handoff",
            post(moves::handoff),
        )
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/files",
            post(moves::chunk),
        )
        .route(
            "/internal/v1/plugins/{digest}/bytes",
            post(plugins::module_bytes),
        )
        .route(
            "/internal/v1/topics/{parent}/children/{child}/seek",
            post(children::seek_local),
        )
        .route(
            "/internal/v1/groups/{group}/reset-offsets",
            post(groups::reset_offsets_local),
        )
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            internal::wait_for_caller_revision,
        ))
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!(
        "no endpoint at {}; see docs/http-api.md",
        uri.path()
    ))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} is not supported on {}; see docs/http-api.md",
            uri.path()
        ),
    )
}
