//! Fan-out children: attach, change the router or config, detach, list with per-partition
//! progress (and each link's config, so it can be read back).
//!
//! The attach check: an attach and a router or config change route the deploy check's test
//! records ([`narad_runtime::testslab::records`]) through the new chain with the link's real
//! context (its topics, the parent's and the child's partition counts, its config) before
//! anything is recorded, and refuse with a 400 (`reason: bad_config`) when a plugin answers
//! `ROUTE_ERR_BAD_CONFIG`: such a link would stall on its first record. Other outcomes of the
//! check do not refuse (the test records are not the link's records).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use narad_storage::{PartitionId, PartitionState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::topics::require_topic;
use crate::fanout::status::CursorReport;
use crate::metastore::link::{AcceptedGap, LinkMeta, OnGap, PluginRef, new_epoch};
use crate::metastore::{PolicyChange, Snapshot};
use crate::topics::NewTopic;

/// The chain a link gets when the attach names none: it reproduces the engine's routing rules
/// (Kafka key hash; keyless keeps the parent index when counts match; else round-robin).
pub const DEFAULT_ROUTER: [&str; 3] = ["key-hash", "keyless-index", "round-robin"];

/// Most plugins in one chain.
pub(crate) const MAX_ROUTER_LEN: usize = 8;

/// `PUT /v1/topics/{parent}/children/{child}` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    /// Create the child topic with this many partitions (else it must exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// Make it a delay child: records are copied once they are this old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The router chain: plugin names (`name`: newest version; `name@digest`: exactly that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<Vec<String>>,
    /// Configuration handed to every plugin: a string as is, anything else as its JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// Make it a remote child: the records go to a topic of another narad.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteAttach>,
    /// Where the cursors begin: at the attach point (the default), at the parent's oldest
    /// record, or at a consumer group's committed offsets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<AttachStart>,
    /// What a cursor does when records it has not copied aged out of the parent: `skip` (the
    /// default; the range goes on the gap ledger) or `halt` (it waits for an operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_gap: Option<OnGap>,
    /// A local topic that takes each record the router chain cannot route, so the rest of
    /// the slab goes on (default: none; such a record stalls the cursor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
}

/// Where a new link's cursors begin in each parent partition: `"attach"`, `"earliest"` or
/// `{"group": "billing"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachStart {
    /// At the parent's high watermark as the attach is processed: every record committed
    /// from then on, none from before.
    #[default]
    Attach,
    /// At the parent's oldest stored record: its whole retained history, then everything
    /// after. Records retention removes before a cursor reaches them count as dropped.
    Earliest,
    /// At the offsets this Kafka consumer group has committed on the parent (its consumer
    /// frontier): the child gets what the group has not read yet. A parent partition the
    /// group has no offset for starts at the attach point; a group with none on the parent
    /// is refused.
    Group(String),
}

/// Where a remote child's records go, as an attach names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteAttach {
    /// The other narad's base URL (`http://host:port`).
    pub url: String,
    /// The topic there; it must exist.
    pub topic: String,
    /// A file holding the bearer token the target wants, read by the sender (never stored
    /// in the metadata, never shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// A file of PEM CA certificates the target's TLS certificate is checked against, beside
    /// the system's (an `https://` target signed by a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// A remote child's target, as a link shows it (no token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteInfo {
    /// The other narad's base URL.
    pub url: String,
    /// The topic there.
    pub topic: String,
    /// Its partition count at the attach.
    pub partitions: u32,
    /// Whether a token file is named.
    pub token_file: bool,
    /// The CA file its certificate is checked against, when one is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// `PATCH /v1/topics/{parent}/children/{child}` body: a new chain, a new config, a new gap
/// policy, or several.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterChange {
    /// The new chain; absent (or empty), the link keeps its chain, pinned versions included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub router: Vec<String>,
    /// A new config, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// A new gap policy, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_gap: Option<OnGap>,
    /// A new dead-letter topic, when given; `""` removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
}

impl RouterChange {
    /// The policy part of the change (gap policy, dead-letter topic), `None` when it has
    /// none.
    fn policy(&self) -> Option<PolicyChange> {
        let change = PolicyChange {
            on_gap: self.on_gap,
            accept: Vec::new(),
            dead_letter: self
                .dead_letter
                .clone()
                .map(|topic| (!topic.is_empty()).then_some(topic)),
        };
        (change != PolicyChange::default()).then_some(change)
    }
}

/// A plugin of a chain in answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouterEntry {
    /// Plugin name.
    pub name: String,
    /// Its pinned sha256 digest.
    pub digest: String,
    /// The version its manifest declares (in the children listing; absent elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The answer to an attach or a router change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkInfo {
    /// The child topic.
    pub name: String,
    /// The parent topic.
    pub parent: String,
    /// The attach epoch.
    pub attach_epoch: String,
    /// Where each parent partition's cursor began (index = partition): the parent's high
    /// watermark when the link was attached, or its log start then for `start: earliest`.
    pub attach_offsets: Option<Vec<u64>>,
    /// The chain, pinned to digests.
    pub router: Vec<RouterEntry>,
    /// 0 for a plain child.
    pub delay_ms: u64,
    /// The config handed to every plugin of the chain (empty for none).
    #[serde(default)]
    pub config: String,
    /// Parent partitions whose cursors are paused.
    #[serde(default)]
    pub paused: Vec<u32>,
    /// For a remote child, where its records go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteInfo>,
    /// What a cursor does when records it has not copied aged out: `skip` or `halt`.
    #[serde(default)]
    pub on_gap: OnGap,
    /// Gaps an operator accepted, one per parent partition at most.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_gaps: Vec<AcceptedGap>,
    /// The topic that takes records the chain cannot route, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
    /// Cluster mode, at the attach of an existing child with the parent's partition count:
    /// the partitions `p` whose child partition is on the same node as parent partition `p`,
    /// so a keyless copy of them shares a disk with its original (`narad partition move` of
    /// the child partition separates them). Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares_node: Vec<u32>,
}

impl From<&LinkMeta> for LinkInfo {
    fn from(link: &LinkMeta) -> LinkInfo {
        LinkInfo {
            name: link.child.clone(),
            parent: link.parent.clone(),
            attach_epoch: link.attach_epoch.clone(),
            attach_offsets: link.attach_offsets.clone(),
            router: router_entries(&link.router),
            delay_ms: link.delay_ms,
            config: link.config.clone(),
            paused: link.paused.clone(),
            remote: link.remote.as_ref().map(|r| RemoteInfo {
                url: r.url.clone(),
                topic: r.topic.clone(),
                partitions: r.partitions,
                token_file: r.token_file.is_some(),
                ca_file: r.ca_file.clone(),
            }),
            on_gap: link.on_gap,
            accepted_gaps: link.accepted_gaps.clone(),
            dead_letter: link.dead_letter.clone(),
            shares_node: Vec::new(),
        }
    }
}

fn router_entries(router: &[PluginRef]) -> Vec<RouterEntry> {
    router
        .iter()
        .map(|p| RouterEntry {
            name: p.name.clone(),
            digest: p.digest.clone(),
            version: None,
        })
        .collect()
}

/// One parent partition of a child in the listing: its cursor's report, with the lag taken
/// against the parent's current high watermark.
pub type ChildPartition = CursorReport;

/// One child in the listing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildInfo {
    /// Child topic.
    pub name: String,
    /// 0 for a plain child.
    pub delay_ms: u64,
    /// The chain.
    pub router: Vec<RouterEntry>,
    /// The config handed to every plugin of the chain (empty for none).
    #[serde(default)]
    pub config: String,
    /// The attach epoch.
    pub attach_epoch: String,
    /// Parent partitions whose cursors are paused (each also reports `"state": "paused"`).
    #[serde(default)]
    pub paused: Vec<u32>,
    /// True when every parent partition is reported with an exact lag.
    pub lag_complete: bool,
    /// Per parent partition with a running cursor and a known high watermark. For a remote
    /// child each also has `remote_state` (`running`, `retrying`, `failed`) and
    /// `recovery_point` (where a restart resumes), and a stalled cursor's `last_error` says
    /// why.
    pub partitions: Vec<CursorReport>,
    /// For a remote child, where its records go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteInfo>,
    /// What a cursor does when records it has not copied aged out: `skip` or `halt` (a
    /// halted cursor reports `"state": "halted"` and the range in `halted_gap`).
    #[serde(default)]
    pub on_gap: OnGap,
    /// The topic that takes records the chain cannot route, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
}

/// `GET /v1/topics/{parent}/children` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildList {
    /// The parent's children, by name.
    pub children: Vec<ChildInfo>,
}

fn config_bytes(config: Option<Value>) -> String {
    match config {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text,
        Some(other) => other.to_string(),
    }
}

/// Resolves router names to pinned plugin references.
fn resolve_router(
    state: &AppState,
    snapshot: &Snapshot,
    names: &[String],
) -> Result<Vec<PluginRef>, ApiError> {
    if names.is_empty() || names.len() > MAX_ROUTER_LEN {
        return Err(ApiError::bad_request(format!(
            "a router is a chain of 1 to {MAX_ROUTER_LEN} plugins; got {}",
            names.len()
        )));
    }
    names
        .iter()
        .map(|spec| {
            state
                .plugins
                .resolve(snapshot, spec)
                .map_err(ApiError::from)
        })
        .collect()
}

/// The context of the attach check: what a cursor of the link will hand its chain.
struct LinkProbe<'a> {
    parent: &'a str,
    parent_partitions: u32,
    child: &'a str,
    child_partitions: u32,
}

impl LinkProbe<'_> {
    /// Routes the test records through a fresh chain of `router` with `config` and refuses
    /// (400, `reason: bad_config`, the plugin's own message) when a plugin answers bad
    /// config. A plugin that does not load is left to the link's status to report, as before
    /// the check existed: the check is about configs, not about stored modules.
    async fn check(
        &self,
        state: &AppState,
        router: &[PluginRef],
        config: &str,
        done: &str,
    ) -> Result<(), ApiError> {
        let registry = Arc::clone(&state.plugins);
        let digests: Vec<String> = router.iter().map(|p| p.digest.clone()).collect();
        let ctx = narad_runtime::RouteContext {
            parent_topic: self.parent.to_owned(),
            parent_partition: 0,
            parent_partition_count: self.parent_partitions,
            child_topic: self.child.to_owned(),
            child_partition_count: self.child_partitions,
            attempt: 0,
            config: config.as_bytes().to_vec(),
        };
        let refused = crate::blocking::run(move || {
            let plugins: Result<Vec<_>, _> = digests.iter().map(|d| registry.load(d)).collect();
            let mut chain = narad_runtime::Chain::new(plugins.ok()?).ok()?;
            narad_runtime::probe_link(&mut chain, &ctx).err()
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let Some(error) = refused else {
            return Ok(());
        };
        Err(ApiError::bad_request(format!(
            "plugin {} (#{} of the chain) {} for {} -> {} ({} partitions); the link was not {done}",
            error.name,
            error.position,
            error.failure,
            self.parent,
            self.child,
            self.child_partitions
        ))
        .with("reason", "bad_config")
        .with("plugin", error.name.clone()))
    }
}

/// `PUT /v1/topics/{parent}/children/{child}`: attaches a child with a fresh epoch and the
/// parent's current high watermarks as its attach point. 201 with the link.
pub async fn attach(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<LinkInfo>), ApiError> {
    // An empty body attaches with every default.
    let req: AttachRequest = if body.iter().all(u8::is_ascii_whitespace) {
        AttachRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    };
    crate::topics::check_not_internal(&parent)?;
    crate::topics::check_not_internal(&child)?;
    let parent_topic = require_topic(&state, &parent).await?;
    crate::topics::check_name(&child)?;
    if req.remote.is_some() {
        return attach_remote(&state, &parent_topic, &child, req).await;
    }
    let existing = state.metastore.topic(&child).await?;
    let child_partitions = existing
        .as_ref()
        .map(|t| t.partitions)
        .or(req.partitions)
        .unwrap_or(0);
    let new_child = match (existing, req.partitions) {
        (Some(existing), Some(partitions)) if existing.partitions != partitions => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "topic {child:?} exists with {} partitions, not {partitions}; omit \"partitions\" to attach it as it is",
                    existing.partitions
                ),
            ));
        }
        (Some(_), _) => None,
        (None, Some(partitions)) => Some(NewTopic {
            name: child.clone(),
            partitions,
            retention_ms: None,
            retention_bytes: None,
            placement: None,
        }),
        (None, None) => {
            return Err(ApiError::not_found(format!(
                "child topic {child:?} does not exist; create it first or pass \"partitions\" to create it with the attach"
            )));
        }
    };
    let link = new_link(
        &state,
        &parent_topic.name,
        parent_topic.partitions,
        &child,
        child_partitions,
        req,
    )
    .await?;
    // A child created by the attach is recorded in the same metastore write as its link, so
    // no crash can leave the topic without the link (or the link without the topic).
    let (link, shares_node) = match new_child {
        Some(spec) => (
            state.topics.create_with_link(spec, link).await?.1,
            Vec::new(),
        ),
        None => {
            let link = state.metastore.attach_link(link).await?;
            // An existing child keeps its placement: say where it breaks the away rule.
            let shares_node = match state.metastore.topic(&child).await? {
                Some(child_topic) if child_topic.partitions == parent_topic.partitions => {
                    child_topic
                        .owners
                        .iter()
                        .zip(&parent_topic.owners)
                        .enumerate()
                        .filter(|(_, (c, p))| c.node == p.node)
                        .filter_map(|(i, _)| u32::try_from(i).ok())
                        .collect()
                }
                _ => Vec::new(),
            };
            (link, shares_node)
        }
    };
    if !shares_node.is_empty() {
        tracing::warn!(%parent, %child, partitions = ?shares_node,
            "attached child partitions on the same node as the parent partition of their index: a keyless copy shares a disk with its original");
    }
    tracing::info!(%parent, %child, epoch = %link.attach_epoch, "child attached");
    let mut info = LinkInfo::from(&link);
    info.shares_node = shares_node;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Longest wait for the target of a remote child to describe its topic at the attach.
const REMOTE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The attach of a remote child: the target topic must exist and answer (its partition count
/// is recorded: the router places records among those partitions); anything else refuses
/// and records nothing.
async fn attach_remote(
    state: &AppState,
    parent: &crate::metastore::TopicMeta,
    child: &str,
    mut req: AttachRequest,
) -> Result<(StatusCode, Json<LinkInfo>), ApiError> {
    let Some(remote) = req.remote.take() else {
        return Err(ApiError::bad_request("no remote target given"));
    };
    if req.partitions.is_some() {
        return Err(ApiError::bad_request(
            "a remote child has the target topic's partitions; leave out \"partitions\"",
        ));
    }
    if state.metastore.topic(child).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("{child:?} is a local topic; give the remote child another name"),
        ));
    }
    let url = remote.url.trim_end_matches('/').to_owned();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ApiError::bad_request(format!(
            "remote url {url:?} must start with http:// or https://"
        )));
    }
    crate::topics::check_name(&remote.topic)?;
    let token = match &remote.token_file {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .map(|t| t.trim().to_owned())
                .map_err(|e| {
                    ApiError::bad_request(format!("cannot read the token file {file}: {e}"))
                })?,
        ),
        None => None,
    };
    let roots = match &remote.ca_file {
        Some(file) => crate::tls::client_roots(std::path::Path::new(file))
            .map_err(|e| ApiError::bad_request(format!("the remote CA file: {e}")))?,
        None => Vec::new(),
    };
    let client = crate::peer::remote::client(&roots, REMOTE_CHECK_TIMEOUT, REMOTE_CHECK_TIMEOUT)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let described = format!("{url}/v1/topics/{}", remote.topic);
    let mut call = client.get(&described);
    if let Some(token) = &token {
        call = call.bearer_auth(token);
    }
    let unavailable = |why: String| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "cannot check the remote child's target {described}: {why}; no link was created"
            ),
        )
    };
    let answer = call
        .send()
        .await
        .map_err(|e| unavailable(crate::tls::error_chain(&e)))?;
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    let partitions = match status.as_u16() {
        200 => body["partitions"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| unavailable("its answer names no partition count".to_owned()))?,
        404 => {
            return Err(ApiError::not_found(format!(
                "the remote child's target topic {} does not exist at {url}; create it there first",
                remote.topic
            )));
        }
        401 | 403 => {
            return Err(ApiError::bad_request(format!(
                "the remote child's target {described} refused the token ({status}); name the right --remote-token-file"
            )));
        }
        _ => return Err(unavailable(format!("it answered {status}: {body}"))),
    };
    let mut link = new_link(
        state,
        &parent.name,
        parent.partitions,
        child,
        partitions,
        req,
    )
    .await?;
    link.remote = Some(crate::metastore::RemoteTarget {
        url,
        topic: remote.topic,
        partitions,
        token_file: remote.token_file,
        ca_file: remote.ca_file,
        source: match &state.cluster {
            Some(cluster) => format!("cluster:{}", cluster.prefix.trim_matches('/')),
            None => format!("node:{}", state.ownership.local_node()),
        },
    });
    let link = state.metastore.attach_link(link).await?;
    tracing::info!(parent = %parent.name, %child, epoch = %link.attach_epoch,
        target = %described, "remote child attached");
    Ok((StatusCode::CREATED, Json(LinkInfo::from(&link))))
}

/// The link an attach records: its router resolved to pinned versions, a fresh epoch and the
/// parent's attach point, read now.
async fn new_link(
    state: &AppState,
    parent: &str,
    parent_partitions: u32,
    child: &str,
    child_partitions: u32,
    req: AttachRequest,
) -> Result<LinkMeta, ApiError> {
    let snapshot = state.metastore.snapshot().await?;
    let names: Vec<String> = req
        .router
        .unwrap_or_else(|| DEFAULT_ROUTER.iter().map(|s| s.to_string()).collect());
    let router = resolve_router(state, &snapshot, &names)?;
    let config = config_bytes(req.config);
    let probe = LinkProbe {
        parent,
        parent_partitions,
        child,
        child_partitions,
    };
    probe.check(state, &router, &config, "attached").await?;
    // The attach point: read while the attach is processed, before it is recorded, so every
    // record committed from now on is at or past it. No guessing: any failure refuses.
    let unreadable = |reason: String| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "cannot read the attach point of {parent} ({reason}); no link was created, try again"
            ),
        )
        .retry_after(1)
    };
    let bounds = super::internal::gather_bounds(state, parent, parent_partitions)
        .await
        .map_err(unreadable)?;
    let attach_offsets = match req.start.unwrap_or_default() {
        AttachStart::Attach => bounds.iter().map(|b| b.high_watermark).collect(),
        AttachStart::Group(group) => {
            let committed: BTreeMap<u32, u64> = super::groups::committed_offsets(state, &group)
                .await?
                .into_iter()
                .filter(|c| c.topic == parent)
                .filter_map(|c| Some((c.partition, u64::try_from(c.committed).ok()?)))
                .collect();
            if committed.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "consumer group {group:?} has no committed offsets on {parent}: nothing to \
                     start from (narad group describe {group})"
                )));
            }
            // Never past the end; below the log start the cursor finds the gap and records it.
            bounds
                .iter()
                .enumerate()
                .map(|(p, b)| {
                    let p = u32::try_from(p).unwrap_or(u32::MAX);
                    committed
                        .get(&p)
                        .map_or(b.high_watermark, |&c| c.min(b.high_watermark))
                })
                .collect()
        }
        AttachStart::Earliest => bounds
            .iter()
            .enumerate()
            .map(|(p, b)| {
                b.log_start.ok_or_else(|| {
                    unreadable(format!(
                        "the owner of partition {p} does not report its log start; upgrade it"
                    ))
                })
            })
            .collect::<Result<Vec<u64>, ApiError>>()?,
    };
    Ok(LinkMeta {
        parent: parent.to_owned(),
        child: child.to_owned(),
        attach_epoch: new_epoch(),
        attach_offsets: Some(attach_offsets),
        delay_ms: req.delay_ms.unwrap_or(0),
        router,
        config,
        attached_at_ms: crate::topics::now_ms(),
        paused: Vec::new(),
        shadow: None,
        on_gap: req.on_gap.unwrap_or_default(),
        accepted_gaps: Vec::new(),
        dead_letter: req.dead_letter.filter(|topic| !topic.is_empty()),
        remote: None,
    })
}

/// `PATCH /v1/topics/{parent}/children/{child}`: swaps the router chain, the config or both
/// (what is not given is kept), effective at each cursor's next slab, with no new epoch. The
/// new pair passes the attach check first (see the module doc).
pub(crate) async fn set_router(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    ApiJson(req): ApiJson<RouterChange>,
) -> Result<Json<LinkInfo>, ApiError> {
    let snapshot = state.metastore.snapshot().await?;
    let Some(current) = snapshot.links.get(&(parent.clone(), child.clone())) else {
        return Err(ApiError::not_found(format!(
            "{child:?} is not a child of {parent:?}"
        )));
    };
    let policy = req.policy();
    if req.router.is_empty() && req.config.is_none() {
        let Some(policy) = policy else {
            return Err(ApiError::bad_request(
                "nothing to change: give \"router\", \"config\", \"on_gap\", \"dead_letter\" \
                 or several",
            ));
        };
        return set_policy(&state, &parent, &child, policy).await;
    }
    let router = if req.router.is_empty() {
        current.router.clone()
    } else {
        resolve_router(&state, &snapshot, &req.router)?
    };
    let config = req.config.map(|c| config_bytes(Some(c)));
    let partitions = |topic: &str| snapshot.topics.get(topic).map_or(0, |t| t.partitions);
    let probe = LinkProbe {
        parent: &parent,
        parent_partitions: partitions(&parent),
        child: &child,
        child_partitions: partitions(&child),
    };
    let probed_config = config.as_deref().unwrap_or(&current.config);
    probe
        .check(&state, &router, probed_config, "changed")
        .await?;
    let link = state
        .metastore
        .set_link_router(&parent, &child, router, config)
        .await?;
    tracing::info!(%parent, %child, "router changed");
    match policy {
        Some(policy) => set_policy(&state, &parent, &child, policy).await,
        None => Ok(Json(LinkInfo::from(&link))),
    }
}

/// Records a link's new gap policy or dead-letter topic; its cursors follow them at their
/// next gap or unroutable record (a halted one goes on at once under `skip`).
async fn set_policy(
    state: &AppState,
    parent: &str,
    child: &str,
    policy: PolicyChange,
) -> Result<Json<LinkInfo>, ApiError> {
    let link = state
        .metastore
        .set_link_policy(parent, child, policy.clone())
        .await?;
    tracing::info!(%parent, %child, on_gap = ?link.on_gap, dead_letter = link.dead_letter.as_deref(),
        "link policy changed");
    Ok(Json(LinkInfo::from(&link)))
}

/// `DELETE /v1/topics/{parent}/children/{child}`: detaches; the child topic stays.
pub async fn detach(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
) -> Result<Json<LinkInfo>, ApiError> {
    let link = state.metastore.detach_link(&parent, &child).await?;
    tracing::info!(%parent, %child, epoch = %link.attach_epoch, "child detached");
    Ok(Json(LinkInfo::from(&link)))
}

/// `POST /v1/topics/{parent}/children/{child}/pause` and `/resume` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// The parent partitions; absent: every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<u32>>,
    /// Resume only: the halted cursors of these partitions skip the gap they halted before
    /// (it goes on the gap ledger as lost to retention).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accept_gap: bool,
}

/// The answer to a pause or a resume: the link as recorded now, and the gaps a resume with
/// `accept_gap` accepted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PauseInfo {
    /// The link.
    #[serde(flatten)]
    pub link: LinkInfo,
    /// The gaps accepted by this resume, each as its halted cursor reported it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps_accepted: Vec<AcceptedRange>,
}

/// A gap a resume accepted: the halted cursor of parent partition `partition` skips from its
/// position `from` to the parent's oldest record (`to` when it last looked; later if
/// retention removes more first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedRange {
    /// The parent partition.
    pub partition: u32,
    /// The cursor's position.
    pub from: u64,
    /// The parent's oldest record, as the cursor last saw it.
    pub to: u64,
}

/// `POST /v1/topics/{parent}/children/{child}/pause`: the cursors of the partitions finish the
/// slab they are committing, write their position and copy nothing more, across restarts,
/// until resumed. Their lag keeps counting in the listing.
pub async fn pause(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<PauseInfo>, ApiError> {
    set_paused(&state, &parent, &child, &body, true).await
}

/// `POST /v1/topics/{parent}/children/{child}/resume`: the cursors go on exactly from their
/// position on file. With `"accept_gap": true`, each cursor of the partitions that is halted
/// before a gap (as the cluster-wide listing shows it now) has that gap accepted first.
pub async fn resume(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<PauseInfo>, ApiError> {
    set_paused(&state, &parent, &child, &body, false).await
}

async fn set_paused(
    state: &AppState,
    parent: &str,
    child: &str,
    body: &[u8],
    paused: bool,
) -> Result<Json<PauseInfo>, ApiError> {
    // No body at all means every partition, so `curl -X POST .../pause` works.
    let request: PauseRequest = if body.iter().all(u8::is_ascii_whitespace) {
        PauseRequest::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    };
    let mut gaps_accepted = Vec::new();
    if request.accept_gap {
        if paused {
            return Err(ApiError::bad_request(
                "\"accept_gap\" goes with a resume, not a pause",
            ));
        }
        gaps_accepted =
            accept_halted_gaps(state, parent, child, request.partitions.as_deref()).await?;
    }
    let partitions = request.partitions;
    let link = state
        .metastore
        .set_paused(parent, child, partitions.clone(), paused)
        .await?;
    let what = if paused { "paused" } else { "resumed" };
    tracing::info!(%parent, %child, ?partitions, now_paused = ?link.paused, "fan-out cursors {what}");
    Ok(Json(PauseInfo {
        link: LinkInfo::from(&link),
        gaps_accepted,
    }))
}

/// Records as accepted the gap each halted cursor of `parent -> child` (of `partitions`, or
/// every one) reports now. Only a gap a cursor reports is accepted, at the exact position it
/// halted at: a cursor that halts later, elsewhere, halts again.
async fn accept_halted_gaps(
    state: &AppState,
    parent: &str,
    child: &str,
    partitions: Option<&[u32]>,
) -> Result<Vec<AcceptedRange>, ApiError> {
    let Json(listing) = list(
        State(state.clone()),
        ApiPath(parent.to_owned()),
        ApiQuery(ChildListQuery::default()),
    )
    .await?;
    let Some(link) = listing.children.iter().find(|c| c.name == child) else {
        return Err(ApiError::from(
            crate::metastore::MetastoreError::UnknownLink {
                parent: parent.to_owned(),
                child: child.to_owned(),
            },
        ));
    };
    let ranges: Vec<AcceptedRange> = link
        .partitions
        .iter()
        .filter(|r| partitions.is_none_or(|chosen| chosen.contains(&r.partition)))
        .filter_map(|r| {
            r.halted_gap.map(|gap| AcceptedRange {
                partition: r.partition,
                from: gap.from,
                to: gap.to,
            })
        })
        .collect();
    if ranges.is_empty() {
        return Ok(ranges);
    }
    let accept = ranges
        .iter()
        .map(|r| AcceptedGap {
            partition: r.partition,
            from: r.from,
        })
        .collect();
    state
        .metastore
        .set_link_policy(
            parent,
            child,
            PolicyChange {
                accept,
                ..PolicyChange::default()
            },
        )
        .await?;
    tracing::warn!(%parent, %child, ?ranges, "gaps accepted by an operator: the halted cursors skip what aged out");
    Ok(ranges)
}

/// `POST /v1/topics/{parent}/children/{child}/seek` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeekRequest {
    /// The parent partition (paused).
    pub partition: u32,
    /// The parent offset its cursor copies next.
    pub offset: u64,
}

/// Longest wait for a paused cursor to carry out a seek (it looks every 100 ms).
const SEEK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `POST /v1/topics/{parent}/children/{child}/seek`: moves a paused cursor to `offset`, on the
/// node that runs it. Back: the records from there are copied again (on purpose); forward: the
/// records in between are skipped (on purpose) and counted apart from drop-behind.
pub async fn seek(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<SeekRequest>,
) -> Result<Json<crate::fanout::status::SeekDone>, ApiError> {
    let view = state
        .metastore
        .link_view(&parent, &child)
        .await?
        .ok_or_else(|| {
            ApiError::from(crate::metastore::MetastoreError::UnknownLink {
                parent: parent.clone(),
                child: child.clone(),
            })
        })?;
    if request.partition >= view.parent.partitions {
        return Err(ApiError::bad_request(format!(
            "{parent} has {} partitions; there is no partition {}",
            view.parent.partitions, request.partition
        )));
    }
    if !view.link.paused.contains(&request.partition) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "the cursor of {parent} -> {child} on parent partition {} is not paused; pause it \
                 first (narad child pause {parent} {child} --partitions {})",
                request.partition, request.partition
            ),
        ));
    }
    let id = PartitionId::new(parent.clone(), request.partition);
    match &state.cluster {
        Some(cluster) if !state.ownership.is_local(&id) => {
            let owner = state.ownership.owner(&id).ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{id} has no owner in the cluster metadata"),
                )
            })?;
            let path = format!("/internal/v1/topics/{parent}/children/{child}/seek");
            super::internal::peer_post(cluster, &owner.0, &path, &request, "the seek")
                .await
                .map(Json)
        }
        _ => seek_here(&state, &parent, &child, &request).await.map(Json),
    }
}

/// `POST /internal/v1/topics/{parent}/children/{child}/seek`: the seek on this node's cursor.
pub(crate) async fn seek_local(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<SeekRequest>,
) -> Result<Json<crate::fanout::status::SeekDone>, ApiError> {
    seek_here(&state, &parent, &child, &request).await.map(Json)
}

async fn seek_here(
    state: &AppState,
    parent: &str,
    child: &str,
    request: &SeekRequest,
) -> Result<crate::fanout::status::SeekDone, ApiError> {
    let status = state
        .fanout
        .status(parent, child, request.partition)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "no cursor of {parent} -> {child} on parent partition {} runs on this node \
                     yet; retry in a moment",
                    request.partition
                ),
            )
        })?;
    let answer = status.order_seek(request.offset);
    match tokio::time::timeout(SEEK_WAIT, answer).await {
        Ok(Ok(Ok(done))) => Ok(done),
        Ok(Ok(Err(reason))) => Err(ApiError::new(StatusCode::CONFLICT, reason.to_string())),
        Ok(Err(_)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "another seek of the same cursor replaced this one, or the cursor stopped",
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the cursor did not take the seek within {} s; retry",
                SEEK_WAIT.as_secs()
            ),
        )),
    }
}

/// `GET /v1/topics/{parent}/children` query string.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildListQuery {
    /// Cluster mode: only the cursors of the answering node (what nodes ask each other when
    /// they gather the listing).
    #[serde(default)]
    pub local: bool,
}

/// `GET /v1/topics/{parent}/children`: every child with a row per parent partition. Never
/// opens a closed log: a partition whose high watermark is unknown has no lag and
/// `lag_complete` is false. A partition no cursor reports (it is starting, its parent partition
/// is quarantined, or the node that runs it did not answer) has a row of state `unknown` that
/// says why. In cluster mode the cursors of the parent partitions other nodes own are asked of
/// those nodes, concurrently, and each report names the node that runs it.
pub async fn list(
    State(state): State<AppState>,
    ApiPath(parent): ApiPath<String>,
    ApiQuery(query): ApiQuery<ChildListQuery>,
) -> Result<Json<ChildList>, ApiError> {
    let mut listing = local_list(&state, &parent).await?;
    let Some(cluster) = &state.cluster else {
        return Ok(Json(listing));
    };
    let topic = require_topic(&state, &parent).await?;
    let mut unanswered: BTreeMap<String, String> = BTreeMap::new();
    for child in &mut listing.children {
        for report in &mut child.partitions {
            report.node = Some(cluster.node_id().to_owned());
        }
    }
    if query.local {
        return Ok(Json(listing));
    }
    let path = format!("/v1/topics/{parent}/children?local=true");
    let answers: Vec<(String, Result<ChildList, crate::cluster::PeerError>)> =
        super::internal::ask_other_owners(cluster, &topic, &path).await;
    for (node, answer) in answers {
        match answer {
            Ok(remote) => {
                for theirs in remote.children {
                    if let Some(ours) = listing.children.iter_mut().find(|c| c.name == theirs.name)
                    {
                        ours.partitions
                            .extend(theirs.partitions.into_iter().map(|mut r| {
                                r.node = Some(node.clone());
                                r
                            }));
                    }
                }
            }
            Err(reason) => {
                tracing::debug!(%node, %reason, "a node's cursors could not be listed");
                unanswered.insert(node, reason.to_string());
            }
        }
    }
    for child in &mut listing.children {
        let owner_of = |p: u32| topic.owners.get(p as usize).map(|o| o.node.clone());
        add_unreported_rows(&mut child.partitions, 0..topic.partitions, |p| {
            let owner = owner_of(p);
            let reason = match owner.as_ref().and_then(|n| Some((n, unanswered.get(n)?))) {
                // The reason names the node ("node n3 did not answer: ...").
                Some((_, why)) => format!("no report: {why}"),
                None => NO_CURSOR_NOW.to_owned(),
            };
            (owner, reason)
        });
        child.lag_complete = lag_complete(&child.partitions, topic.partitions);
    }
    Ok(Json(listing))
}

/// Why a listing row has no report when nothing more precise is known.
const NO_CURSOR_NOW: &str = "no cursor reads this parent partition now: it is starting, or its \
                             owner lost its lease (see narad node list)";

/// Adds a row of state `unknown` for each partition of `partitions` that `rows` lacks, with
/// the node and reason `why` gives; leaves `rows` sorted by partition.
fn add_unreported_rows(
    rows: &mut Vec<CursorReport>,
    partitions: impl IntoIterator<Item = u32>,
    why: impl Fn(u32) -> (Option<String>, String),
) {
    let reported: std::collections::BTreeSet<u32> = rows.iter().map(|r| r.partition).collect();
    for p in partitions.into_iter().filter(|p| !reported.contains(p)) {
        let (node, reason) = why(p);
        rows.push(CursorReport::unknown(p, node, reason));
    }
    rows.sort_by_key(|r| r.partition);
}

/// Whether every one of `count` partitions has a row with a known lag.
fn lag_complete(rows: &[CursorReport], count: u32) -> bool {
    rows.len() == count as usize && rows.iter().all(|p| p.lag_messages.is_some())
}

/// The listing from this node's cursors and store.
async fn local_list(state: &AppState, parent: &str) -> Result<ChildList, ApiError> {
    let parent = parent.to_owned();
    let parent_topic = require_topic(state, &parent).await?;
    let snapshot = state.metastore.snapshot().await?;
    let store = Arc::clone(&state.store);
    let (name, count) = (parent_topic.name.clone(), parent_topic.partitions);
    // Per parent partition: its high watermark, and why no cursor can read it when it is
    // quarantined or failed.
    let peeks: Vec<(Option<u64>, Option<String>)> = crate::blocking::run(move || {
        (0..count)
            .map(|p| match store.peek(&PartitionId::new(name.clone(), p)) {
                Ok(stats) => {
                    let unreadable = match stats.state {
                        PartitionState::Quarantined { reason } => {
                            Some(format!("parent partition {p} is quarantined: {reason}"))
                        }
                        PartitionState::Failed { reason } => {
                            Some(format!("parent partition {p} failed: {reason}"))
                        }
                        _ => None,
                    };
                    (stats.high_watermark, unreadable)
                }
                Err(_) => (None, None),
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;

    let versions: BTreeMap<&str, &str> = snapshot
        .plugins
        .iter()
        .map(|v| (v.digest.as_str(), v.version.as_str()))
        .collect();
    let mut children = Vec::new();
    for link in snapshot.links.values().filter(|l| l.parent == parent) {
        let reports: Vec<CursorReport> = state.fanout.reports(&link.parent, &link.child);
        let mut partitions = Vec::new();
        for mut report in reports {
            let high = peeks.get(report.partition as usize).and_then(|(h, _)| *h);
            // Lag against the parent's high watermark now, not the cursor's last look at it;
            // unknown while the log is closed (it is not opened for a listing).
            report.lag_messages = match (report.next_offset, high) {
                (Some(next), Some(high)) => Some(high.saturating_sub(next)),
                _ => None,
            };
            if link.remote.is_some() {
                report.mark_remote();
            }
            partitions.push(report);
        }
        // Rows for the partitions this node answers for that no cursor reports; in cluster
        // mode, those of other nodes are added by whoever gathers the listing.
        let mine = (0..count).filter(|p| {
            state.cluster.is_none()
                || state
                    .ownership
                    .is_local(&PartitionId::new(parent_topic.name.clone(), *p))
        });
        add_unreported_rows(&mut partitions, mine, |p| {
            let reason = peeks.get(p as usize).and_then(|(_, why)| why.clone());
            (
                state.cluster.as_ref().map(|c| c.node_id().to_owned()),
                reason.unwrap_or_else(|| NO_CURSOR_NOW.to_owned()),
            )
        });
        let lag_complete = lag_complete(&partitions, count);
        children.push(ChildInfo {
            name: link.child.clone(),
            delay_ms: link.delay_ms,
            router: router_entries(&link.router)
                .into_iter()
                .map(|mut entry| {
                    entry.version = versions.get(entry.digest.as_str()).map(|v| (*v).to_owned());
                    entry
                })
                .collect(),
            config: link.config.clone(),
            attach_epoch: link.attach_epoch.clone(),
            paused: link.paused.clone(),
            lag_complete,
            partitions,
            remote: LinkInfo::from(link).remote,
            on_gap: link.on_gap,
            dead_letter: link.dead_letter.clone(),
        });
    }
    Ok(ChildList { children })
}
