//! Plugin endpoints: deploy (`POST /v1/plugins?name=`, body: the `.wasm` bytes), list
//! (`GET /v1/plugins`) and remove (`DELETE /v1/plugins/{name}`), with their JSON shapes (shared
//! with the CLI).
//!
//! Deploy runs every check of the runtime (on the blocking pool) before anything is stored; a
//! refusal is a 400 whose `error` says what is wrong and whose `reason` names the check
//! (`not_wasm`, `module_limit`, `forbidden_import`, `missing_export`, `abi_version`,
//! `test_slab_trap`, `test_slab_deadline`, ...). A module over a module limit (too many
//! functions, a body or code section too large, ...) is refused before it is compiled, and
//! its 400 also carries `limit` (e.g. `functions`) and `flag` (the `narad serve` flag that
//! raises it). The upload has its own size limit (`max-plugin-bytes`, a 413).
//!
//! Listing never compiles: it reads each version's manifest from the stored bytes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use crate::metastore::PluginVersion;
use crate::plugins::{PluginRegistry, RegistryError};

/// `POST /v1/plugins` query string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployQuery {
    /// Name to record the upload under (1 to 64 of `a-z 0-9 - _`); absent: the manifest's name.
    /// It may differ from the manifest's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One plugin version, as deployed, listed and removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    /// The name it is recorded under.
    pub name: String,
    /// sha256 of the module, 64 lower-case hex digits.
    pub digest: String,
    /// The manifest's version string.
    pub version: String,
    /// The manifest's one-line description.
    pub description: String,
    /// Module size in bytes.
    pub size_bytes: u64,
    /// What the plugin sees of each record (`keys`, and `headers` / `values` when asked for);
    /// absent when the module could not be loaded (see `load_error`) or was just removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Vec<String>>,
    /// The name in the module's manifest (what a running chain's errors show); absent like
    /// `needs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_name: Option<String>,
    /// Upload time, milliseconds since the Unix epoch (0 for built-ins).
    pub uploaded_at: i64,
    /// Whether it is a built-in plugin (always present, cannot be removed).
    pub builtin: bool,
    /// Whether a bare `name` in a chain resolves to this version (the newest of its name).
    pub latest: bool,
    /// Why the stored module does not load, when it does not (listing only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_error: Option<String>,
    /// Deploy answer only, when the deploy check could not check the routing: the plugin
    /// declares no `probe_config` and answered bad config to the empty config, which is
    /// accepted (its routing is checked when a link attaches it with a real config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_check: Option<String>,
}

/// `GET /v1/plugins` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginList {
    /// Every version, sorted by name, oldest version first within a name.
    pub plugins: Vec<PluginInfo>,
}

/// `DELETE /v1/plugins/{name}` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedPlugin {
    /// The name removed.
    pub name: String,
    /// The versions removed, oldest first.
    pub removed: Vec<PluginInfo>,
}

/// `POST /v1/plugins?name=NAME`: validates and stores the module in the body; 200 with the
/// version (also when these exact bytes were already deployed under this name).
pub async fn deploy(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<DeployQuery>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PluginInfo>, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(format!(
                "the plugin module is over the daemon's upload limit of {} bytes (max-plugin-bytes)",
                state.limits.max_plugin_bytes
            ))
        } else {
            ApiError::new(rejection.status(), rejection.body_text())
        }
    })?;
    let registry = Arc::clone(&state.plugins);
    let version = match &query.name {
        Some(name) => registry.deploy(name, bytes.to_vec()).await?,
        None => registry.deploy_under_manifest_name(bytes.to_vec()).await?,
    };
    let snapshot = state.metastore.snapshot().await?;
    let digest = version.digest.clone();
    let mut described = describe(Arc::clone(&registry), vec![version], &snapshot.plugins).await?;
    let mut info = described.pop().ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "deployed version vanished",
        )
    })?;
    // Just deployed, so loaded: this reads memory, compiles nothing.
    let probe = crate::blocking::run(move || registry.load(&digest).map(|p| p.deploy_probe()))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if let Ok(narad_runtime::DeployProbe::NeedsConfig { message }) = probe {
        info.deploy_check = Some(format!(
            "accepted without a routing check: with an empty config the plugin answered bad config ({}); declare \"probe_config\" in the manifest to have deploys check the routing; attaching a link checks it with the link's config",
            message.as_deref().unwrap_or("no message")
        ));
    }
    Ok(Json(info))
}

/// `GET /v1/plugins`: every version, built-ins included.
pub async fn list(State(state): State<AppState>) -> Result<Json<PluginList>, ApiError> {
    let snapshot = state.metastore.snapshot().await?;
    let mut versions = snapshot.plugins.clone();
    // Stable: versions of one name stay oldest first.
    versions.sort_by(|a, b| a.name.cmp(&b.name));
    let plugins = describe(Arc::clone(&state.plugins), versions, &snapshot.plugins).await?;
    Ok(Json(PluginList { plugins }))
}

/// `DELETE /v1/plugins/{name}`: removes every version of the plugin.
pub async fn remove(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<RemovedPlugin>, ApiError> {
    let removed = state.plugins.remove(&name).await?;
    let removed = removed
        .into_iter()
        .map(|v| info(v, false, false, None))
        .collect();
    Ok(Json(RemovedPlugin { name, removed }))
}

/// Describes `versions` from their manifests, on the blocking pool. Nothing is compiled: a
/// listing is a read anyone may send, and compiling every stored module for it (after the
/// compiled cache was emptied) is what took a node to 14 GB. `all` is every recorded
/// version, oldest first, to tell which is the latest of its name.
async fn describe(
    registry: Arc<PluginRegistry>,
    versions: Vec<PluginVersion>,
    all: &[PluginVersion],
) -> Result<Vec<PluginInfo>, ApiError> {
    let latest: BTreeMap<&str, &str> = all
        .iter()
        .map(|v| (v.name.as_str(), v.digest.as_str()))
        .collect();
    let latest: Vec<bool> = versions
        .iter()
        .map(|v| latest.get(v.name.as_str()) == Some(&v.digest.as_str()))
        .collect();
    crate::blocking::run(move || {
        versions
            .into_iter()
            .zip(latest)
            .map(|(version, latest)| {
                let builtin = registry.is_builtin(&version.name);
                let description = registry.describe(&version.digest);
                let mut described = info(version, builtin, latest, description.load_error);
                if let Some(manifest) = description.manifest {
                    described.needs = Some(needs(manifest.needs));
                    described.manifest_name = Some(manifest.name);
                }
                described
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

fn info(v: PluginVersion, builtin: bool, latest: bool, load_error: Option<String>) -> PluginInfo {
    PluginInfo {
        name: v.name,
        digest: v.digest,
        version: v.version,
        description: v.description,
        size_bytes: v.size_bytes,
        needs: None,
        manifest_name: None,
        uploaded_at: v.uploaded_at_ms,
        builtin,
        latest,
        load_error,
        deploy_check: None,
    }
}

/// The manifest's `needs` as the ABI spells them.
fn needs(needs: narad_abi::Needs) -> Vec<String> {
    // What the plugin is given, as its manifest says it: `key_hash_only` alone (no record
    // table), else each of keys, headers, values and key hashes it gets.
    if !needs.table() {
        return vec!["key_hash_only".to_owned()];
    }
    [
        (needs.keys(), "keys"),
        (needs.headers(), "headers"),
        (needs.values(), "values"),
        (needs.key_hash(), "key_hash"),
    ]
    .into_iter()
    .filter(|(given, _)| *given)
    .map(|(_, name)| name.to_owned())
    .collect()
}

/// The machine-readable `reason` of a refused module: which check failed.
pub(crate) fn refusal_reason(error: &narad_runtime::LoadError) -> String {
    use narad_runtime::LoadError as E;
    match error {
        E::NotWasm => "not_wasm".to_owned(),
        E::NotCoreModule { .. } => "not_core_module".to_owned(),
        E::ModuleLimit { .. } => "module_limit".to_owned(),
        E::Compile { .. } => "compile".to_owned(),
        E::ForbiddenImport { .. } => "forbidden_import".to_owned(),
        E::WrongImportType { .. } => "wrong_import_type".to_owned(),
        E::MissingExport { .. } => "missing_export".to_owned(),
        E::WrongExportType { .. } => "wrong_export_type".to_owned(),
        E::AbiVersion { .. } => "abi_version".to_owned(),
        E::ManifestMissing => "manifest_missing".to_owned(),
        E::ManifestDuplicate { .. } => "manifest_duplicate".to_owned(),
        E::ManifestInvalid { .. } => "manifest_invalid".to_owned(),
        E::ManifestName { .. } => "manifest_name".to_owned(),
        E::ManifestAbi { .. } => "manifest_abi".to_owned(),
        E::Check(failure) => format!("check_{}", failure.kind()),
        E::TestSlab(failure) => format!("test_slab_{}", failure.kind()),
        _ => "refused".to_owned(),
    }
}

impl From<RegistryError> for ApiError {
    fn from(err: RegistryError) -> ApiError {
        use crate::metastore::MetastoreError;
        match err {
            RegistryError::InvalidName { .. }
            | RegistryError::InvalidSpec { .. }
            | RegistryError::AmbiguousDigest { .. }
            | RegistryError::Empty => ApiError::bad_request(err.to_string()),
            RegistryError::Refused(ref load) => {
                let reason = refusal_reason(load);
                let refused = ApiError::bad_request(err.to_string()).with("reason", reason);
                match load {
                    // Which limit, and the flag that raises it, for clients to show.
                    narad_runtime::LoadError::ModuleLimit { limit, .. } => {
                        let refused = refused.with("limit", limit.as_str());
                        match crate::plugins::limit_flag(*limit) {
                            Some(flag) => refused.with("flag", flag),
                            None => refused,
                        }
                    }
                    _ => refused,
                }
            }
            RegistryError::UnknownPlugin { .. } | RegistryError::UnknownDigest { .. } => {
                ApiError::not_found(err.to_string())
            }
            RegistryError::Builtin { .. } => ApiError::new(StatusCode::CONFLICT, err.to_string()),
            RegistryError::Metastore(MetastoreError::PluginInUse { ref links, .. }) => {
                let links = links.clone();
                ApiError::new(StatusCode::CONFLICT, err.to_string()).with("links", links)
            }
            RegistryError::Metastore(MetastoreError::UnknownPlugin { .. }) => {
                ApiError::not_found(err.to_string())
            }
            RegistryError::Metastore(e) => e.into(),
            other => {
                tracing::error!(error = %other, "plugin request failed inside the daemon");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
            }
        }
    }
}

/// `POST /internal/v1/plugins/{digest}/bytes`: the module's bytes, for another node that needs
/// it; 404 when this node does not hold it.
pub(crate) async fn module_bytes(
    State(state): State<AppState>,
    ApiPath(digest): ApiPath<String>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let plugins = Arc::clone(&state.plugins);
    let wanted = digest.clone();
    let bytes = crate::blocking::run(move || plugins.module_bytes(&wanted))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    match bytes {
        Some(bytes) => Ok((
            [(axum::http::header::CONTENT_TYPE, "application/wasm")],
            bytes,
        )
            .into_response()),
        None => Err(ApiError::not_found(format!(
            "this node holds no module with digest {digest}"
        ))),
    }
}
