//! The plugin registry: the routing plugins this node can run, by name and content digest.
//!
//! Layout:
//! - this file: [`PluginRegistry`] (deploy, list through the metastore, resolve, load, remove);
//! - [`store`]: the content-addressed module files on disk;
//! - [`spec`]: the name rule and how `name` / `name@digest` resolve to one version;
//! - [`error`]: the typed errors, [`RegistryError`].
//!
//! On disk, under the data dir:
//!
//! ```text
//! plugins/sha256/{hex}.wasm     every deployed module (and the built-ins), named by its sha256
//! cache/{hex}-{engine}.cwasm    compiled code, owned by narad-runtime (so a restart does not
//!                               recompile)
//! ```
//!
//! The metastore holds the versions ([`PluginVersion`]: name, digest, manifest version and
//! description, upload time), oldest first; the files hold the bytes. A version is recorded only
//! after its file is durable, so every recorded digest has its bytes; a file no version names
//! (a crash between the two steps, or a metastore restored from an older backup) is moved to
//! `set-aside/plugins/` at the next start, never deleted: it may be the only copy of an
//! uploaded plugin.
//!
//! Names: an upload is recorded under the name it was deployed as (`?name=`), which may differ
//! from the name in the module's manifest; the manifest name is what error messages of a
//! running chain show. The built-ins (`key-hash`, `keyless-index`, `round-robin`,
//! `header-route`) are registered at every start, cannot be removed, and no upload may take
//! their names. Deploying bytes already recorded under the same name changes nothing (the
//! version keeps its place; pin an older version with `name@digest` to go back to it).
//!
//! Concurrency: deploys and removals of this node run one at a time (so a removal never deletes
//! a file a concurrent deploy of the same bytes is about to record); validation, which is CPU
//! work bounded by the runtime's limits, runs on the blocking pool before that lock is taken.
//! Compiles go through the runtime's gate: loads of one digest share one compile, and
//! compiles run one at a time (`narad_runtime::DEFAULT_COMPILE_CONCURRENCY`).
//!
//! Listing ([`PluginRegistry::describe`]) never compiles: it reads the manifest from the stored
//! bytes (after the header and module-limit checks, which need no compile), because a listing
//! is an unauthenticated read and the compiled cache may be empty (deleting `cache/` is safe;
//! every wasmtime upgrade empties it).

pub(crate) mod error;
pub(crate) mod spec;
pub(crate) mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use narad_abi::Manifest;
use narad_runtime::{Digest, Limits, Plugin, Runtime, RuntimeConfig};

use crate::metastore::{Metastore, MetastoreError, PluginRef, PluginVersion, Snapshot};
pub use error::{RegistryError, SpecProblem, limit_flag};
pub use spec::{MIN_DIGEST_PREFIX_HEX, validate_name};
use store::ContentStore;

/// Upload time recorded for the built-ins (they were never uploaded).
const BUILTIN_UPLOADED_AT_MS: i64 = 0;

/// A built-in plugin: its name, module bytes and digest.
#[derive(Debug, Clone, Copy)]
struct Builtin {
    name: &'static str,
    bytes: &'static [u8],
    digest: Digest,
}

/// The routing plugins of this node. `Send + Sync`; shared as `Arc<PluginRegistry>`.
pub struct PluginRegistry {
    runtime: Runtime,
    metastore: Arc<dyn Metastore>,
    store: ContentStore,
    cache_dir: PathBuf,
    builtins: Vec<Builtin>,
    /// Validated plugins by digest (hex): deployed or loaded since start.
    loaded: RwLock<HashMap<String, Plugin>>,
    /// Manifests of stored modules read for listings, by digest (hex); the bytes behind a
    /// digest never change, so neither does its manifest.
    manifests: RwLock<HashMap<String, Manifest>>,
    /// Why the last load of a digest (hex) failed, for listings; cleared by a load that works.
    failures: RwLock<HashMap<String, String>>,
    /// Serializes deploys and removals (see the module doc).
    writes: tokio::sync::Mutex<()>,
    /// Cluster mode: asks other nodes for a module this node does not hold.
    fetcher: Option<Arc<ModuleFetcher>>,
}

/// Fetches the module bytes with a digest (hex) from wherever else they are held (in cluster
/// mode, the other nodes): `Ok(None)` when nobody has them. Blocking: called from a load, on
/// the blocking pool. The bytes are checked against the digest before anything uses them.
pub(crate) type ModuleFetcher = dyn Fn(&str) -> Result<Option<Vec<u8>>, String> + Send + Sync;

impl std::fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRegistry")
            .field("store", &self.store.dir())
            .field("builtins", &self.builtin_names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl PluginRegistry {
    /// Opens `{data_dir}/plugins/` (content-addressed: `{data_dir}/plugins/sha256/{hex}.wasm`,
    /// written atomically), creates the runtime with its compiled-module cache in
    /// `{data_dir}/cache/`, validates the built-ins and registers them in the metastore (a no-op
    /// when they are already there), and deletes stored files no version names.
    pub async fn open(
        data_dir: &Path,
        metastore: Arc<dyn Metastore>,
        limits: Limits,
    ) -> Result<PluginRegistry, RegistryError> {
        let plugins_dir = data_dir.join("plugins");
        let cache_dir = data_dir.join("cache");
        let (runtime, store, builtins) = {
            let cache_dir = cache_dir.clone();
            crate::blocking::run(move || -> Result<_, RegistryError> {
                let store = ContentStore::open(&plugins_dir)?;
                let runtime =
                    Runtime::new(RuntimeConfig::with_cache_dir(cache_dir).limits(limits))?;
                let mut builtins = Vec::new();
                for &(name, bytes) in narad_builtin_plugins::all() {
                    // A built-in that fails the checks is a build defect: refuse to start.
                    let plugin = Plugin::load(&runtime, bytes).map_err(|source| {
                        RegistryError::StoredRefused {
                            digest: format!("{} (built-in {name})", Digest::of(bytes).to_hex()),
                            source,
                        }
                    })?;
                    // Stored like any upload, so a link pinned to this digest still loads
                    // after an upgrade ships a different build of the built-in.
                    store.put(bytes)?;
                    builtins.push((
                        Builtin {
                            name,
                            bytes,
                            digest: plugin.digest(),
                        },
                        plugin,
                    ));
                }
                Ok((runtime, store, builtins))
            })
            .await??
        };
        let mut loaded = HashMap::new();
        for (builtin, plugin) in &builtins {
            let manifest = plugin.manifest();
            metastore
                .add_plugin(PluginVersion {
                    name: builtin.name.to_owned(),
                    digest: builtin.digest.to_hex(),
                    size_bytes: builtin.bytes.len() as u64,
                    version: manifest.version.clone(),
                    description: manifest.description.clone(),
                    uploaded_at_ms: BUILTIN_UPLOADED_AT_MS,
                })
                .await?;
            loaded.insert(builtin.digest.to_hex(), plugin.clone());
        }
        let registry = PluginRegistry {
            runtime,
            metastore,
            store,
            cache_dir,
            builtins: builtins.into_iter().map(|(b, _)| b).collect(),
            loaded: RwLock::new(loaded),
            manifests: RwLock::new(HashMap::new()),
            failures: RwLock::new(HashMap::new()),
            writes: tokio::sync::Mutex::new(()),
            fetcher: None,
        };
        registry.delete_unreferenced_files().await?;
        Ok(registry)
    }

    /// This registry, fetching a recorded module it does not hold with `fetcher` (cluster mode:
    /// a plugin is uploaded to one node, and the others fetch it by digest when a link needs
    /// it).
    pub(crate) fn with_fetcher(mut self, fetcher: Arc<ModuleFetcher>) -> PluginRegistry {
        self.fetcher = Some(fetcher);
        self
    }

    /// The stored bytes of the module with this digest (hex), if this node holds them (for
    /// another node fetching it). Blocking.
    pub(crate) fn module_bytes(&self, digest: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let parsed = parse_digest(digest)?;
        if let Some(builtin) = self.builtins.iter().find(|b| b.digest == parsed) {
            return Ok(Some(builtin.bytes.to_vec()));
        }
        self.store.get(&parsed)
    }

    /// The runtime every plugin of this node runs on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The names of the built-in plugins.
    pub(crate) fn builtin_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.builtins.iter().map(|b| b.name)
    }

    /// Whether `name` is a built-in's name.
    pub(crate) fn is_builtin(&self, name: &str) -> bool {
        self.builtins.iter().any(|b| b.name == name)
    }

    /// Resolves a chain entry against `snapshot.plugins`: `name` gives the newest version of
    /// that name, `name@digest` exactly that version (the full 64-hex sha256, or a unique
    /// prefix of at least [`MIN_DIGEST_PREFIX_HEX`] hex digits). An unknown name or digest is
    /// a typed error that lists what exists.
    pub fn resolve(&self, snapshot: &Snapshot, spec: &str) -> Result<PluginRef, RegistryError> {
        spec::resolve(&snapshot.plugins, spec)
    }

    /// The validated, compiled plugin with this digest (hex): from memory, else the built-ins,
    /// else the content store (checked against its digest and validated again, module limits
    /// included: a module stored by an older version that is over today's limits fails here
    /// with [`RegistryError::StoredRefused`] and stays stored). Concurrent loads of one digest
    /// share one compile (the runtime's single flight). Blocking (it may read a file and
    /// compile): call it from the blocking pool.
    pub fn load(&self, digest: &str) -> Result<Plugin, RegistryError> {
        let parsed = parse_digest(digest)?;
        let hex = parsed.to_hex();
        if let Some(plugin) = self.read_loaded().get(&hex) {
            return Ok(plugin.clone());
        }
        let loaded = self.stored_bytes(&parsed).and_then(|bytes| {
            Plugin::load(&self.runtime, &bytes).map_err(|source| RegistryError::StoredRefused {
                digest: hex.clone(),
                source,
            })
        });
        match loaded {
            Ok(plugin) => {
                self.write_loaded().insert(hex.clone(), plugin.clone());
                write(&self.failures).remove(&hex);
                Ok(plugin)
            }
            Err(error) => {
                write(&self.failures).insert(hex, error.to_string());
                Err(error)
            }
        }
    }

    /// What a listing shows of the version with this digest (hex), **without compiling**: the
    /// manifest of the loaded plugin, or read from the stored bytes' custom section after the
    /// header and module-limit checks; and why it does not load, when that is known (a check
    /// that needs no compile failed, or the last load on this node failed). Blocking (it may
    /// read a file): call it from the blocking pool.
    pub fn describe(&self, digest: &str) -> Description {
        if let Some(plugin) = self.read_loaded().get(digest) {
            return Description {
                manifest: Some(plugin.manifest().clone()),
                load_error: None,
            };
        }
        let load_error = read(&self.failures).get(digest).cloned();
        if let Some(manifest) = read(&self.manifests).get(digest) {
            return Description {
                manifest: Some(manifest.clone()),
                load_error,
            };
        }
        let inspected = parse_digest(digest).and_then(|parsed| {
            let bytes = self.stored_bytes(&parsed)?;
            Plugin::inspect(&self.runtime, &bytes).map_err(|source| RegistryError::StoredRefused {
                digest: parsed.to_hex(),
                source,
            })
        });
        match inspected {
            Ok(manifest) => {
                write(&self.manifests).insert(digest.to_owned(), manifest.clone());
                Description {
                    manifest: Some(manifest),
                    load_error,
                }
            }
            Err(error) => Description {
                manifest: None,
                load_error: Some(error.to_string()),
            },
        }
    }

    /// The module bytes of `digest`: a built-in's, or the content store's (hash-checked).
    fn stored_bytes(&self, digest: &Digest) -> Result<Vec<u8>, RegistryError> {
        if let Some(builtin) = self.builtins.iter().find(|b| b.digest == *digest) {
            return Ok(builtin.bytes.to_vec());
        }
        if let Some(bytes) = self.store.get(digest)? {
            return Ok(bytes);
        }
        let hex = digest.to_hex();
        let not_stored = || RegistryError::NotStored {
            digest: digest.to_hex(),
        };
        let Some(fetcher) = &self.fetcher else {
            return Err(not_stored());
        };
        let bytes = match fetcher(&hex) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Err(not_stored()),
            Err(reason) => {
                return Err(RegistryError::Fetch {
                    digest: hex,
                    reason,
                });
            }
        };
        // What a peer sent is used only if it is exactly the module the digest names.
        let found = Digest::of(&bytes);
        if found != *digest {
            return Err(RegistryError::Fetch {
                digest: hex,
                reason: format!("the bytes sent hash to {}", found.to_hex()),
            });
        }
        self.store.put(&bytes)?;
        tracing::info!(digest = %hex, bytes = bytes.len(), "fetched a plugin module from another node");
        Ok(bytes)
    }

    /// Validates `bytes` (every deploy check, under the runtime's limits, on the blocking pool),
    /// stores them durably and records the version under `name` (which may differ from the
    /// manifest's name). Deploying bytes already recorded under `name` returns that version
    /// unchanged.
    pub async fn deploy(&self, name: &str, bytes: Vec<u8>) -> Result<PluginVersion, RegistryError> {
        validate_name(name)?;
        self.deploy_named(Some(name), bytes).await
    }

    /// [`PluginRegistry::deploy`] under the name in the module's manifest.
    pub(crate) async fn deploy_under_manifest_name(
        &self,
        bytes: Vec<u8>,
    ) -> Result<PluginVersion, RegistryError> {
        self.deploy_named(None, bytes).await
    }

    async fn deploy_named(
        &self,
        name: Option<&str>,
        bytes: Vec<u8>,
    ) -> Result<PluginVersion, RegistryError> {
        if bytes.is_empty() {
            return Err(RegistryError::Empty);
        }
        // Settle a built-in's name before spending a compile on the upload.
        if let Some(name) = name {
            let digest = Digest::of(&bytes);
            if self.check_builtin_name(name, &digest)? {
                return self.recorded(name, &digest.to_hex()).await;
            }
        }
        let runtime = self.runtime.clone();
        let store = self.store.clone();
        let cache_dir = self.cache_dir.clone();
        let (plugin, bytes) = crate::blocking::run(move || match Plugin::load(&runtime, &bytes) {
            Ok(plugin) => Ok((plugin, bytes)),
            Err(error) => {
                // A module refused after it compiled left code in the cache: drop it (stored
                // bytes passed the checks, so a refused digest is never stored).
                let digest = Digest::of(&bytes);
                if !store.contains(&digest).unwrap_or(false) {
                    remove_compiled(&cache_dir, &digest);
                }
                Err(RegistryError::Refused(error))
            }
        })
        .await??;
        let name = name.unwrap_or(plugin.name()).to_owned();
        if self.check_builtin_name(&name, &plugin.digest())? {
            // The built-in's own bytes under its own name: already recorded at start-up.
            return self.recorded(&name, &plugin.digest().to_hex()).await;
        }
        let digest = plugin.digest().to_hex();
        let _writing = self.writes.lock().await;
        let store = self.store.clone();
        crate::blocking::run(move || store.put(&bytes)).await??;
        let manifest = plugin.manifest();
        let recorded = self
            .metastore
            .add_plugin(PluginVersion {
                name,
                digest: digest.clone(),
                size_bytes: plugin.size_bytes() as u64,
                version: manifest.version.clone(),
                description: manifest.description.clone(),
                uploaded_at_ms: now_ms(),
            })
            .await?;
        self.write_loaded().insert(digest, plugin);
        tracing::info!(
            plugin = %recorded.name,
            digest = %recorded.digest,
            version = %recorded.version,
            "plugin deployed"
        );
        Ok(recorded)
    }

    /// Removes every version of `name`: refused while a link's chain names it (the metastore's
    /// [`MetastoreError::PluginInUse`]) and for a built-in ([`RegistryError::Builtin`]). Deletes
    /// the stored files (and compiled code) no remaining version references.
    pub async fn remove(&self, name: &str) -> Result<Vec<PluginVersion>, RegistryError> {
        validate_name(name)?;
        if self.is_builtin(name) {
            return Err(RegistryError::Builtin {
                name: name.to_owned(),
            });
        }
        let _writing = self.writes.lock().await;
        let removed = match self.metastore.remove_plugin(name).await {
            Ok(removed) => removed,
            Err(MetastoreError::UnknownPlugin { name }) => {
                let snapshot = self.metastore.snapshot().await?;
                let mut known: Vec<String> = snapshot.plugins.into_iter().map(|v| v.name).collect();
                known.sort();
                known.dedup();
                return Err(RegistryError::UnknownPlugin { name, known });
            }
            Err(other) => return Err(other.into()),
        };
        let snapshot = self.metastore.snapshot().await?;
        let mut unreferenced: Vec<Digest> = removed
            .iter()
            .filter(|v| !snapshot.plugins.iter().any(|kept| kept.digest == v.digest))
            .filter_map(|v| Digest::from_hex(&v.digest))
            .collect();
        unreferenced.sort();
        unreferenced.dedup();
        for digest in &unreferenced {
            let hex = digest.to_hex();
            self.write_loaded().remove(&hex);
            write(&self.manifests).remove(&hex);
            write(&self.failures).remove(&hex);
        }
        let store = self.store.clone();
        let cache_dir = self.cache_dir.clone();
        crate::blocking::run(move || -> Result<(), RegistryError> {
            for digest in &unreferenced {
                store.remove(digest)?;
                remove_compiled(&cache_dir, digest);
            }
            Ok(())
        })
        .await??;
        tracing::info!(plugin = name, versions = removed.len(), "plugin removed");
        Ok(removed)
    }

    /// For a built-in's `name`: `Ok(true)` when `digest` is that built-in's own module (nothing
    /// to deploy), [`RegistryError::Builtin`] otherwise. `Ok(false)` for any other name.
    fn check_builtin_name(&self, name: &str, digest: &Digest) -> Result<bool, RegistryError> {
        match self.builtins.iter().find(|b| b.name == name) {
            Some(builtin) if builtin.digest == *digest => Ok(true),
            Some(_) => Err(RegistryError::Builtin {
                name: name.to_owned(),
            }),
            None => Ok(false),
        }
    }

    /// The recorded version `name@digest` (which must exist).
    async fn recorded(&self, name: &str, digest: &str) -> Result<PluginVersion, RegistryError> {
        let snapshot = self.metastore.snapshot().await?;
        snapshot
            .plugins
            .into_iter()
            .find(|v| v.name == name && v.digest == digest)
            .ok_or_else(|| RegistryError::NotStored {
                digest: digest.to_owned(),
            })
    }

    /// Moves stored modules that no recorded version names (left by a crash between storing a
    /// module and recording its version, or named only by a newer metastore than the one
    /// restored) to `set-aside/plugins/`, where an operator can deploy them again.
    async fn delete_unreferenced_files(&self) -> Result<(), RegistryError> {
        let snapshot = self.metastore.snapshot().await?;
        let store = self.store.clone();
        let cache_dir = self.cache_dir.clone();
        crate::blocking::run(move || -> Result<(), RegistryError> {
            let Some(data_dir) = cache_dir.parent() else {
                return Ok(());
            };
            let aside = crate::topics::set_aside::plugins_dir(data_dir);
            for digest in store.digests()? {
                let hex = digest.to_hex();
                if snapshot.plugins.iter().any(|v| v.digest == hex) {
                    continue;
                }
                let to = store.set_aside(&digest, &aside)?;
                tracing::warn!(digest = %hex, path = %to.display(),
                    "set aside a stored plugin module no version names (an interrupted deploy, or a metastore restored from an older backup); deploy it again by name if you need it");
                remove_compiled(&cache_dir, &digest);
            }
            Ok(())
        })
        .await?
    }

    fn read_loaded(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Plugin>> {
        // A panic while holding the lock cannot leave the map half-changed (insert/remove are
        // single calls), so a poisoned lock is still usable.
        self.loaded.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_loaded(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Plugin>> {
        self.loaded.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a listing shows of one version (see [`PluginRegistry::describe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The module's manifest, when it could be read.
    pub manifest: Option<Manifest>,
    /// Why the module does not load, when known.
    pub load_error: Option<String>,
}

/// `text` as a digest, or [`RegistryError::InvalidSpec`].
fn parse_digest(text: &str) -> Result<Digest, RegistryError> {
    Digest::from_hex(text).ok_or_else(|| RegistryError::InvalidSpec {
        spec: text.to_owned(),
        reason: SpecProblem::NotADigest,
    })
}

// A panic while holding one of the registry's map locks cannot leave the map half-changed
// (insert/remove are single calls), so a poisoned lock is still usable.
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// Deletes the runtime's compiled-code files of `digest` (`{hex}-{engine}.cwasm`, the naming
/// narad-runtime's cache documents). Failures are logged: stale compiled code is never loaded
/// for bytes that are not stored, it only takes space.
fn remove_compiled(cache_dir: &Path, digest: &Digest) {
    let prefix = format!("{}-", digest.to_hex());
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix)
            && name.ends_with(".cwasm")
            && let Err(e) = std::fs::remove_file(entry.path())
        {
            tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove compiled plugin code");
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
