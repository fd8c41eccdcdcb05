//! The plugin registry and its HTTP API and CLI: deploy (with every refusal a precise 400),
//! list, remove, resolve, load, restarts; `narad plugin test` with no daemon.
//!
//! Hostile modules are written in WAT here and compiled with the `wat` crate; the built-ins
//! come from `narad-builtin-plugins`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use narad_host::api::error::ApiError;
use narad_host::metastore::{
    FileMetastore, LinkMeta, Metastore, MetastoreError, PluginRef, TopicMeta,
};
use narad_host::plugins::{PluginRegistry, RegistryError};
use narad_runtime::{CacheOutcome, Digest, Failure, FuelBudget, Limits, LoadError};
use reqwest::StatusCode;
use serde_json::Value;

use crate::api::common::{Daemon, test_config};
use narad_runtime::testkit::WatRouter;

fn key_hash() -> Vec<u8> {
    narad_builtin_plugins::get("key-hash").unwrap().to_vec()
}

async fn deploy(d: &Daemon, name: Option<&str>, bytes: Vec<u8>) -> (StatusCode, Value) {
    let path = match name {
        Some(name) => format!("/v1/plugins?name={name}"),
        None => "/v1/plugins".to_owned(),
    };
    d.post_raw(&path, bytes).await
}

async fn listed(d: &Daemon) -> Vec<Value> {
    let (status, body) = d.get("/v1/plugins").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["plugins"].as_array().unwrap().clone()
}

fn stored_file(data_dir: &Path, digest: &str) -> std::path::PathBuf {
    data_dir
        .join("plugins/sha256")
        .join(format!("{digest}.wasm"))
}

#[tokio::test]
async fn a_built_in_module_deployed_under_a_new_name_is_listed_with_its_manifest() {
    let d = Daemon::start().await;
    let bytes = key_hash();
    let (status, body) = deploy(&d, Some("my-hash"), bytes.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["name"], "my-hash");
    assert_eq!(body["digest"], Digest::of(&bytes).to_hex());
    assert_eq!(body["size_bytes"], bytes.len() as u64);
    assert_eq!(body["needs"], serde_json::json!(["key_hash_only"]));
    assert_eq!(body["manifest_name"], "key-hash");
    assert!(!body["version"].as_str().unwrap().is_empty());
    assert_eq!(body["builtin"], false);
    assert!(stored_file(&d.dir, body["digest"].as_str().unwrap()).exists());

    let plugins = listed(&d).await;
    let mine = plugins.iter().find(|p| p["name"] == "my-hash").unwrap();
    assert_eq!(mine["digest"], body["digest"]);
    assert_eq!(mine["latest"], true);
    assert!(mine["uploaded_at"].as_i64().unwrap() > 0);
}

#[tokio::test]
async fn without_a_name_the_upload_takes_the_manifest_name() {
    let d = Daemon::start().await;
    let (status, body) = deploy(&d, None, WatRouter::new("wat-router").wasm()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["name"], "wat-router");
    assert_eq!(body["version"], "1.0.0");
    assert_eq!(body["description"], "a WAT test plugin");
}

/// Deploys `bytes` and expects a 400 with `reason` and a message containing `says`.
async fn assert_refused(d: &Daemon, bytes: Vec<u8>, reason: &str, says: &str) {
    let (status, body) = deploy(d, Some("hostile"), bytes).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(message.contains(says), "{message:?} should say {says:?}");
}

#[tokio::test]
async fn hostile_modules_are_refused_with_a_400_naming_the_problem() {
    let d = Daemon::start().await;
    assert_refused(
        &d,
        b"this is not a wasm module".to_vec(),
        "not_wasm",
        "not a WebAssembly module",
    )
    .await;
    let wasi = WatRouter::new("hostile").imports(r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))"#);
    assert_refused(
        &d,
        wasi.wasm(),
        "forbidden_import",
        "wasi_snapshot_preview1.fd_write",
    )
    .await;
    let no_route = WatRouter::new("hostile").omit_export("narad_route");
    assert_refused(
        &d,
        no_route.wasm(),
        "missing_export",
        "missing export narad_route",
    )
    .await;
    let abi_2 = WatRouter::new("hostile").abi_version(2);
    assert_refused(&d, abi_2.wasm(), "abi_version", "ABI version 2").await;
    let trap = WatRouter::new("hostile").route("", "unreachable");
    assert_refused(&d, trap.wasm(), "test_slab_trap", "trapped").await;
    // A tight loop burns its fuel budget (deterministic) long before the deadline.
    let spin = WatRouter::new("hostile").route("", "(loop $spin (br $spin))");
    assert_refused(&d, spin.wasm(), "test_slab_fuel", "ran out of fuel").await;
    // Nothing was recorded or stored, and the daemon still serves.
    assert!(!listed(&d).await.iter().any(|p| p["name"] == "hostile"));
    let stored = fs::read_dir(d.dir.join("plugins/sha256")).unwrap().count();
    assert_eq!(stored, narad_builtin_plugins::all().len());
    let (status, _) = d.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_plugin_stopped_by_the_deadline_is_refused_with_a_400_naming_it() {
    // With a fuel budget too large to bind, only the wall-clock deadline stops the loop.
    let dir = tempfile::tempdir().unwrap();
    let metastore: Arc<dyn Metastore> = Arc::new(FileMetastore::open(dir.path()).unwrap());
    let limits = Limits {
        deadline: Duration::from_millis(50),
        fuel: FuelBudget {
            base: u64::MAX / 4,
            per_record: 0,
            per_input_byte: 0,
        },
        ..Limits::default()
    };
    let registry = PluginRegistry::open(dir.path(), metastore, limits)
        .await
        .unwrap();
    let spin = WatRouter::new("spin").route("", "(loop $spin (br $spin))");
    let err = registry.deploy("spin", spin.wasm()).await.unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::Refused(LoadError::TestSlab(Failure::Deadline { deadline_ms: 50 }))
        ),
        "{err:?}"
    );
    let api = ApiError::from(err);
    assert_eq!(api.status(), StatusCode::BAD_REQUEST);
    assert!(
        api.message().contains("exceeded its deadline of 50 ms"),
        "{}",
        api.message()
    );
}

#[tokio::test]
async fn an_empty_upload_and_an_invalid_name_are_400s() {
    let d = Daemon::start().await;
    let (status, body) = deploy(&d, Some("fine"), Vec::new()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("empty"), "{body}");
    let (status, body) = deploy(&d, Some("Not_Lower"), key_hash()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("Not_Lower"),
        "{body}"
    );
    let long = "a".repeat(65);
    let (status, _) = deploy(&d, Some(&long), key_hash()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_upload_over_max_plugin_bytes_is_a_413_and_one_under_it_deploys() {
    let d = Daemon::start_with(|c| c.limits.max_plugin_bytes = 4096).await;
    let big = key_hash();
    assert!(big.len() > 4096);
    let (status, body) = deploy(&d, Some("too-big"), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("max-plugin-bytes"),
        "{body}"
    );
    let small = WatRouter::new("small").wasm();
    assert!(small.len() <= 4096);
    let (status, body) = deploy(&d, Some("small"), small).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The upload limit is the route's own: a smaller request limit does not apply to it.
    let d = Daemon::start_with(|c| c.limits.max_request_bytes = 4096).await;
    let (status, body) = deploy(&d, Some("big-is-fine"), key_hash()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn built_ins_are_listed_and_cannot_be_removed_or_replaced() {
    let d = Daemon::start().await;
    let plugins = listed(&d).await;
    for (name, bytes) in narad_builtin_plugins::all() {
        let p = plugins
            .iter()
            .find(|p| p["name"] == *name)
            .unwrap_or_else(|| panic!("{name} not listed"));
        assert_eq!(p["builtin"], true);
        assert_eq!(p["latest"], true);
        assert_eq!(p["digest"], Digest::of(bytes).to_hex());
        assert_eq!(p["manifest_name"], *name);
    }
    let (status, body) = d.delete("/v1/plugins/key-hash").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("built-in"),
        "{body}"
    );
    let (status, body) = deploy(&d, Some("key-hash"), WatRouter::new("key-hash").wasm()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // Its own bytes under its own name change nothing.
    let (status, body) = deploy(&d, Some("key-hash"), key_hash()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["builtin"], true);
    assert_eq!(listed(&d).await.len(), plugins.len());
}

#[tokio::test]
async fn removing_a_plugin_deletes_its_versions_and_files() {
    let d = Daemon::start().await;
    let (_, v1) = deploy(&d, Some("gone"), WatRouter::new("gone").wasm()).await;
    let second = WatRouter::new("gone").version("2.0.0");
    let (_, v2) = deploy(&d, Some("gone"), second.wasm()).await;
    // The same bytes under another name keep their file when "gone" is removed.
    let (_, shared) = deploy(&d, Some("kept"), WatRouter::new("gone").wasm()).await;
    assert_eq!(shared["digest"], v1["digest"]);

    let (status, body) = d.delete("/v1/plugins/gone").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let removed: Vec<&str> = body["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["digest"].as_str().unwrap())
        .collect();
    assert_eq!(
        removed,
        [
            v1["digest"].as_str().unwrap(),
            v2["digest"].as_str().unwrap()
        ]
    );
    assert!(stored_file(&d.dir, v1["digest"].as_str().unwrap()).exists());
    assert!(!stored_file(&d.dir, v2["digest"].as_str().unwrap()).exists());
    assert!(!listed(&d).await.iter().any(|p| p["name"] == "gone"));

    let (status, body) = d.delete("/v1/plugins/gone").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body["error"].as_str().unwrap().contains("kept"), "{body}");
}

fn link(router: Vec<PluginRef>) -> LinkMeta {
    LinkMeta {
        parent: "orders".into(),
        child: "audit".into(),
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

#[tokio::test]
async fn a_plugin_a_link_uses_cannot_be_removed_and_survives_restarts() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    d.create_topic("audit", 1).await;
    let (status, v) = deploy(&d, Some("mine"), key_hash()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let digest = v["digest"].as_str().unwrap().to_owned();
    let temp = d.stop().await.unwrap();

    // Attach a link naming it, straight through the metastore, while the daemon is down.
    let metastore = FileMetastore::open(temp.path()).unwrap();
    metastore
        .attach_link(link(vec![PluginRef {
            name: "mine".into(),
            digest: digest.clone(),
        }]))
        .await
        .unwrap();
    drop(metastore);

    let d = Daemon::start_config(test_config(temp.path()))
        .await
        .unwrap();
    let mine = listed(&d)
        .await
        .into_iter()
        .find(|p| p["name"] == "mine")
        .unwrap();
    assert_eq!(mine["digest"], digest.as_str());
    assert_eq!(
        mine["needs"],
        serde_json::json!(["key_hash_only"]),
        "{mine}"
    );
    let (status, body) = d.delete("/v1/plugins/mine").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["links"], serde_json::json!(["orders -> audit"]));
    assert!(stored_file(temp.path(), &digest).exists());
    d.stop().await;
}

async fn open_registry(dir: &Path) -> (Arc<dyn Metastore>, PluginRegistry) {
    let metastore: Arc<dyn Metastore> = Arc::new(FileMetastore::open(dir).unwrap());
    let registry = PluginRegistry::open(dir, Arc::clone(&metastore), Limits::default())
        .await
        .unwrap();
    (metastore, registry)
}

#[tokio::test]
async fn a_name_resolves_to_its_newest_version_and_a_digest_pins_one() {
    let dir = tempfile::tempdir().unwrap();
    let (metastore, registry) = open_registry(dir.path()).await;
    for name in ["orders", "audit"] {
        metastore
            .create_topic(TopicMeta {
                writable_as_child: false,
                name: name.into(),
                partitions: 1,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: 0,
                owners: Vec::new(),
            })
            .await
            .unwrap();
    }
    let v1 = registry
        .deploy("router", WatRouter::new("router").wasm())
        .await
        .unwrap();
    let snapshot = metastore.snapshot().await.unwrap();
    let pinned = registry.resolve(&snapshot, "router").unwrap();
    assert_eq!(pinned.digest, v1.digest);
    metastore
        .attach_link(link(vec![pinned.clone()]))
        .await
        .unwrap();

    let second = WatRouter::new("router").version("2.0.0");
    let v2 = registry.deploy("router", second.wasm()).await.unwrap();
    assert_ne!(v1.digest, v2.digest);
    let snapshot = metastore.snapshot().await.unwrap();
    assert_eq!(
        registry.resolve(&snapshot, "router").unwrap().digest,
        v2.digest
    );
    assert_eq!(
        registry
            .resolve(&snapshot, &format!("router@{}", v1.digest))
            .unwrap(),
        pinned
    );
    assert_eq!(
        registry
            .resolve(&snapshot, &format!("router@{}", &v1.digest[..12]))
            .unwrap()
            .digest,
        v1.digest
    );
    // The link resolved before the second upload still runs the first version.
    let link = &snapshot.links[&("orders".to_owned(), "audit".to_owned())];
    assert_eq!(link.router, vec![pinned]);
    let loaded = registry.load(&link.router[0].digest).unwrap();
    assert_eq!(loaded.digest().to_hex(), v1.digest);
    assert_eq!(loaded.manifest().version, "1.0.0");

    // Unknown names and digests say what exists.
    match registry.resolve(&snapshot, "nope") {
        Err(RegistryError::UnknownPlugin { known, .. }) => {
            assert!(known.contains(&"router".to_owned()) && known.contains(&"key-hash".to_owned()));
        }
        other => panic!("expected UnknownPlugin, got {other:?}"),
    }
    match registry.resolve(&snapshot, &format!("router@{}", "0".repeat(64))) {
        Err(RegistryError::UnknownDigest { versions, .. }) => {
            assert_eq!(versions, [v1.digest.clone(), v2.digest.clone()]);
        }
        other => panic!("expected UnknownDigest, got {other:?}"),
    }
    // In use: 409 through the API's mapping.
    let err = registry.remove("router").await.unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::Metastore(MetastoreError::PluginInUse { .. })
        ),
        "{err:?}"
    );
    assert_eq!(ApiError::from(err).status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn a_reopened_registry_loads_stored_plugins_from_the_compiled_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (_, registry) = open_registry(dir.path()).await;
    let version = registry
        .deploy("cached", WatRouter::new("cached").wasm())
        .await
        .unwrap();
    drop(registry);
    // A module stored by a deploy that crashed before recording its version.
    let orphan = WatRouter::new("orphan").wasm();
    let orphan_path = stored_file(dir.path(), &Digest::of(&orphan).to_hex());
    fs::write(&orphan_path, &orphan).unwrap();

    let (metastore, registry) = open_registry(dir.path()).await;
    assert!(
        !orphan_path.exists(),
        "an unrecorded module is removed at start"
    );
    let snapshot = metastore.snapshot().await.unwrap();
    let resolved = registry.resolve(&snapshot, "cached").unwrap();
    assert_eq!(resolved.digest, version.digest);
    let plugin = tokio::task::spawn_blocking(move || registry.load(&resolved.digest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(plugin.name(), "cached");
    assert_eq!(plugin.cache_outcome(), CacheOutcome::Hit);
}

#[tokio::test]
async fn a_stored_module_altered_on_disk_is_never_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let (_, registry) = open_registry(dir.path()).await;
    let version = registry
        .deploy("tampered", WatRouter::new("tampered").wasm())
        .await
        .unwrap();
    drop(registry);
    fs::write(
        stored_file(dir.path(), &version.digest),
        WatRouter::new("evil").wasm(),
    )
    .unwrap();
    let (_, registry) = open_registry(dir.path()).await;
    let err = registry.load(&version.digest).unwrap_err();
    assert!(matches!(err, RegistryError::Corrupt { .. }), "{err:?}");
    assert!(matches!(
        registry.load(&"ab".repeat(32)),
        Err(RegistryError::NotStored { .. })
    ));
}

// ---- compile bombs and compiles ----

/// A module of `count` empty functions, written in the binary format (a WAT text of a million
/// functions would take longer to parse than the check it tests).
fn empty_functions(count: usize) -> Vec<u8> {
    fn leb(mut value: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn section(id: u8, contents: Vec<u8>, out: &mut Vec<u8>) {
        out.push(id);
        leb(contents.len() as u64, out);
        out.extend(contents);
    }
    let mut out = b"\0asm\x01\0\0\0".to_vec();
    section(1, vec![1, 0x60, 0, 0], &mut out);
    let mut functions = Vec::new();
    leb(count as u64, &mut functions);
    functions.resize(functions.len() + count, 0);
    section(3, functions, &mut out);
    let mut code = Vec::new();
    leb(count as u64, &mut code);
    for _ in 0..count {
        code.extend_from_slice(&[2, 0, 0x0b]);
    }
    section(10, code, &mut out);
    out
}

/// The compiled-code files in `{data_dir}/cache/` of `digest`.
fn compiled_files(data_dir: &Path, digest: &str) -> usize {
    fs::read_dir(data_dir.join("cache"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(digest)
        })
        .count()
}

#[tokio::test]
async fn a_compile_bomb_is_refused_with_a_400_naming_the_limit_and_the_flag_that_raises_it() {
    let d = Daemon::start().await;
    let bomb = empty_functions(999_000);
    let digest = Digest::of(&bomb).to_hex();
    let (status, body) = deploy(&d, Some("bomb"), bomb).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["reason"], "module_limit", "{body}");
    assert_eq!(body["limit"], "functions", "{body}");
    assert_eq!(body["flag"], "--plugin-max-functions", "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("999000") && message.contains("10000"),
        "{message}"
    );
    assert!(message.contains("NARAD_PLUGIN_MAX_FUNCTIONS"), "{message}");
    // Nothing was stored or compiled.
    assert!(!stored_file(&d.dir, &digest).exists());
    assert_eq!(compiled_files(&d.dir, &digest), 0);
    assert!(!listed(&d).await.iter().any(|p| p["name"] == "bomb"));
}

#[tokio::test]
async fn raising_the_function_limit_lets_a_bigger_plugin_deploy() {
    let big = WatRouter::new("big").extra_functions(200);
    let d = Daemon::start_with(|config| config.plugin_limits.module.max_functions = 150).await;
    let (status, body) = deploy(&d, None, big.wasm()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["limit"], "functions", "{body}");
    d.stop().await;
    let d = Daemon::start_with(|config| config.plugin_limits.module.max_functions = 250).await;
    let (status, body) = deploy(&d, None, big.wasm()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_with_an_emptied_compiled_cache_compiles_nothing() {
    let d = Daemon::start().await;
    let mut digests = Vec::new();
    for name in ["listed-a", "listed-b"] {
        let (status, body) = deploy(&d, None, WatRouter::new(name).wasm()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        digests.push(body["digest"].as_str().unwrap().to_owned());
    }
    let dir = d.dir.clone();
    let _temp = d.stop().await;
    // Documented as safe, and what every wasmtime upgrade does.
    fs::remove_dir_all(dir.join("cache")).unwrap();
    let d = Daemon::start_config(test_config(&dir)).await.unwrap();
    let d = Arc::new(d);
    let lists: Vec<_> = (0..3)
        .map(|_| {
            let d = Arc::clone(&d);
            tokio::spawn(async move { listed(&d).await })
        })
        .collect();
    for list in lists {
        let plugins = list.await.unwrap();
        for (name, digest) in ["listed-a", "listed-b"].iter().zip(&digests) {
            let p = plugins.iter().find(|p| p["name"] == *name).unwrap();
            assert_eq!(&p["digest"], digest);
            // Read from the manifest, without compiling.
            assert_eq!(p["manifest_name"], *name);
            assert_eq!(p["needs"], serde_json::json!(["keys"]));
            assert!(p.get("load_error").is_none(), "{p}");
        }
    }
    for digest in &digests {
        assert_eq!(compiled_files(&dir, digest), 0, "listing compiled {digest}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_of_one_stored_module_compile_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_, registry) = open_registry(dir.path()).await;
    let version = registry
        .deploy("shared", WatRouter::new("shared").wasm())
        .await
        .unwrap();
    drop(registry);
    fs::remove_dir_all(dir.path().join("cache")).unwrap();
    let (_, registry) = open_registry(dir.path()).await;
    let registry = Arc::new(registry);
    // Opening compiled the built-ins (the cache was empty).
    let before = registry.runtime().compiles();
    let loads: Vec<_> = (0..8)
        .map(|_| {
            let (registry, digest) = (Arc::clone(&registry), version.digest.clone());
            tokio::task::spawn_blocking(move || registry.load(&digest).map(|p| p.digest()))
        })
        .collect();
    for load in loads {
        assert_eq!(load.await.unwrap().unwrap().to_hex(), version.digest);
    }
    assert_eq!(registry.runtime().compiles() - before, 1);
}

#[tokio::test]
async fn a_stored_module_over_todays_limits_fails_its_load_and_stays_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (_, registry) = open_registry(dir.path()).await;
    let big = WatRouter::new("stored-big").extra_functions(200);
    let version = registry.deploy("stored-big", big.wasm()).await.unwrap();
    drop(registry);
    // An upgrade (or an operator) lowered the limit below what the stored module has; the
    // built-ins (127 functions at most) still fit.
    let metastore: Arc<dyn Metastore> = Arc::new(FileMetastore::open(dir.path()).unwrap());
    let limits = Limits {
        module: narad_runtime::ModuleLimits {
            max_functions: 150,
            ..narad_runtime::ModuleLimits::DEFAULT
        },
        ..Limits::default()
    };
    let registry = PluginRegistry::open(dir.path(), metastore, limits)
        .await
        .unwrap();
    let err = registry.load(&version.digest).unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::StoredRefused {
                source: LoadError::ModuleLimit {
                    limit: narad_runtime::ModuleLimit::Functions,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("--plugin-max-functions"), "{err}");
    assert!(stored_file(dir.path(), &version.digest).exists());
    let described = registry.describe(&version.digest);
    assert!(
        described
            .load_error
            .as_deref()
            .is_some_and(|e| e.contains("functions limit")),
        "{described:?}"
    );
}

// ---- CLI ----

fn narad(args: &[&str], url: Option<&str>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command.args(args);
    if let Some(url) = url {
        command.env("NARAD_URL", url);
    }
    command.output().unwrap()
}

async fn narad_async(args: &[&str], url: &str) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        narad(&args, Some(&url))
    })
    .await
    .unwrap()
}

#[test]
fn plugin_test_routes_keys_like_kafka_with_no_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.ndjson");
    let keys = ["alice", "bob", "carol", "dave", "", "zed"];
    let mut text: String = keys
        .iter()
        .map(|k| format!("{{\"key\": \"{k}\", \"value\": \"v\"}}\n"))
        .collect();
    text.push_str("{\"key_b64\": \"AAEC/w==\", \"offset\": 100}\n");
    fs::write(&records, text).unwrap();
    let records = records.to_str().unwrap();

    let out = narad(
        &[
            "plugin",
            "test",
            "key-hash",
            "--records",
            records,
            "--child-partitions",
            "7",
            "--json",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let decided: Vec<u64> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["partition"].as_u64().unwrap())
        .collect();
    let mut expected: Vec<u64> = keys
        .iter()
        .map(|k| narad_abi::partition_for_key(k.as_bytes(), 7).unwrap() as u64)
        .collect();
    expected.push(narad_abi::partition_for_key(&[0, 1, 2, 0xff], 7).unwrap() as u64);
    assert_eq!(decided, expected);
    assert_eq!(v["records"][6]["offset"], 100);
    assert_eq!(v["records"][6]["key_b64"], "AAEC/w==");
    let mut distribution = vec![0u64; 7];
    for p in &expected {
        distribution[*p as usize] += 1;
    }
    assert_eq!(v["distribution"], serde_json::json!(distribution));
    // The plugin's work: every record handed in and decided, with its fuel per record inside
    // the allowance (the runtime's default).
    let work = &v["plugins"][0];
    assert_eq!(work["name"], "key-hash");
    assert_eq!(work["records_in"], 7);
    assert_eq!(work["records_decided"], 7);
    let per_record = work["fuel_per_record"].as_u64().unwrap();
    assert_eq!(v["fuel_allowance_per_record"], 2000);
    assert!(per_record > 0 && per_record < 2000, "{work}");
    assert!(work["fuel_consumed"].as_u64().unwrap() <= 7 * per_record);
    // One call of seven records: its budget is the documented formula, and it used a sliver.
    let budget = work["peak_call_budget"].as_u64().unwrap();
    assert!(budget > 5_000_000 + 7 * 2000, "{work}");
    assert_eq!(work["peak_call_fuel"], work["fuel_consumed"]);

    // The table names every partition with its count.
    let out = narad(
        &[
            "plugin",
            "test",
            "key-hash",
            "--records",
            records,
            "--child-partitions",
            "7",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("OFFSET"), "{table}");
    assert!(table.contains("PARTITION  RECORDS"), "{table}");
    let work = table.lines().find(|l| l.starts_with("key-hash")).unwrap();
    assert_eq!(
        work.split_whitespace().take(3).collect::<Vec<_>>(),
        ["key-hash", "7", "7"],
        "{table}"
    );
    assert!(table.contains("fuel allowance: 2000 per record"), "{table}");
    let alice = table.lines().find(|l| l.contains("\"alice\"")).unwrap();
    assert_eq!(
        alice.split_whitespace().collect::<Vec<_>>(),
        ["0", "\"alice\"", &expected[0].to_string()],
        "{table}"
    );
}

#[test]
fn plugin_test_runs_a_chain_of_files_and_built_ins_and_reports_failures() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.ndjson");
    fs::write(
        &records,
        "{\"key\": \"k1\"}\n{\"value\": \"no key\"}\n\n{\"value\": \"no key either\"}\n",
    )
    .unwrap();
    let records = records.to_str().unwrap();
    // A do-nothing plugin from a file, then the default chain: keyless records keep their
    // parent partition when the counts match.
    let passthrough = dir.path().join("passthrough.wasm");
    fs::write(&passthrough, WatRouter::new("passthrough").wasm()).unwrap();
    let out = narad(
        &[
            "plugin",
            "test",
            passthrough.to_str().unwrap(),
            "key-hash",
            "keyless-index",
            "round-robin",
            "--records",
            records,
            "--parent-partitions",
            "4",
            "--parent-partition",
            "2",
            "--json",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["chain"],
        serde_json::json!(["passthrough", "key-hash", "keyless-index", "round-robin"])
    );
    assert_eq!(
        v["records"][0]["partition"].as_u64().unwrap(),
        narad_abi::partition_for_key(b"k1", 4).unwrap() as u64
    );
    assert_eq!(v["records"][1]["partition"], 2);
    assert_eq!(v["records"][2]["partition"], 2);
    // Each plugin is handed only what is still undecided: key-hash all three, keyless-index the
    // two keyless records, round-robin nothing.
    let work: Vec<(String, u64, u64)> = v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["records_in"].as_u64().unwrap(),
                p["records_decided"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        work,
        [
            ("passthrough".to_owned(), 3, 0),
            ("key-hash".to_owned(), 3, 1),
            ("keyless-index".to_owned(), 2, 2),
            ("round-robin".to_owned(), 0, 0),
        ]
    );
    assert_eq!(v["plugins"][3]["fuel_per_record"], 0);

    // key-hash alone leaves keyless records undecided: an error naming the plugin and record.
    let out = narad(&["plugin", "test", "key-hash", "--records", records], None);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("key-hash"), "{err}");
    assert!(err.contains("undecided"), "{err}");
    assert!(err.contains("offset 1"), "{err}");

    // Neither a file nor a built-in.
    let out = narad(
        &["plugin", "test", "no-such-plugin", "--records", records],
        None,
    );
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("no-such-plugin") && err.contains("round-robin"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_deploy_list_and_remove_commands_talk_to_the_daemon() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cli.wasm");
    fs::write(&file, WatRouter::new("cli-router").wasm()).unwrap();
    let file = file.to_str().unwrap();

    let out = narad_async(&["plugin", "deploy", file], &d.url).await;
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("deployed cli-router version 1.0.0"), "{text}");

    let out = narad_async(
        &["plugin", "deploy", file, "--name", "renamed", "--json"],
        &d.url,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "renamed");

    let out = narad_async(&["plugin", "list"], &d.url).await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("NAME"), "{text}");
    assert!(
        text.contains("renamed") && text.contains("cli-router"),
        "{text}"
    );
    assert!(text.contains("builtin"), "{text}");

    let out = narad_async(&["plugin", "remove", "renamed"], &d.url).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .contains("removed plugin renamed (1 version)")
    );

    // Server errors are printed and exit non-zero.
    let out = narad_async(&["plugin", "remove", "round-robin"], &d.url).await;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("built-in") && err.contains("409"), "{err}");
    let bad = dir.path().join("bad.wasm");
    fs::write(&bad, b"garbage").unwrap();
    let out = narad_async(&["plugin", "deploy", bad.to_str().unwrap()], &d.url).await;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("not a WebAssembly module") && err.contains("400"),
        "{err}"
    );
}

#[tokio::test]
async fn an_attach_whose_config_the_plugin_can_never_accept_is_refused_with_its_message_once() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let router = serde_json::json!(["header-route", "key-hash", "round-robin"]);
    // `us = 7` for a 2-partition child: header-route answers bad config to every slab.
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/by-region",
            serde_json::json!({"partitions": 2, "router": router, "config": "header = region\nus = 7\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["reason"], "bad_config", "{body}");
    assert_eq!(body["plugin"], "header-route", "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("\"us\" maps to partition 7 but the child has 2"),
        "{message}"
    );
    assert_eq!(message.matches("bad config").count(), 1, "{message}");
    // Nothing was made: no link, and the attach did not create the child topic either.
    let (_, children) = d.get("/v1/topics/orders/children").await;
    assert_eq!(children["children"], serde_json::json!([]), "{children}");
    let (status, _) = d.get("/v1/topics/by-region").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A config it accepts attaches, and reads back.
    let good = "header = region\nus = 1\n";
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/by-region",
            serde_json::json!({"partitions": 2, "router": router, "config": good}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["config"], good, "{body}");
    let (_, children) = d.get("/v1/topics/orders/children").await;
    assert_eq!(children["children"][0]["config"], good, "{children}");
}

#[tokio::test]
async fn a_link_s_config_alone_can_be_changed_and_is_checked_like_an_attach() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/by-region",
            serde_json::json!({"partitions": 2, "router": ["header-route", "key-hash", "round-robin"],
                               "config": "header = region\nus = 1\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let pinned = body["router"].clone();

    // No router: the chain (pinned digests included) stays, the config changes.
    let (status, body) = d
        .patch(
            "/v1/topics/orders/children/by-region",
            serde_json::json!({"config": "header = region\nus = 0\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["router"], pinned, "{body}");
    let (_, children) = d.get("/v1/topics/orders/children").await;
    assert_eq!(
        children["children"][0]["config"], "header = region\nus = 0\n",
        "{children}"
    );

    // A config the plugin can never accept is refused, and the link keeps its config.
    let (status, body) = d
        .patch(
            "/v1/topics/orders/children/by-region",
            serde_json::json!({"config": "header = region\nus = 9\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["reason"], "bad_config", "{body}");
    let (_, children) = d.get("/v1/topics/orders/children").await;
    assert_eq!(
        children["children"][0]["config"],
        "header = region\nus = 0\n"
    );
    // Neither a router nor a config: nothing to do.
    let (status, _) = d
        .patch(
            "/v1/topics/orders/children/by-region",
            serde_json::json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_missing_manifest_and_an_unchecked_config_plugin_are_explained_at_deploy() {
    let d = Daemon::start().await;
    let (status, body) = deploy(
        &d,
        Some("anon"),
        strip_manifest(&WatRouter::new("anon").wasm()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["reason"], "manifest_missing", "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("the narad manifest custom section is missing"),
        "{message}"
    );
    assert!(message.contains("wasm-tools"), "{message}");

    // header-route answers bad config to the deploy check's empty config: accepted, and the
    // answer says its routing was not checked.
    let header_route = narad_builtin_plugins::get("header-route").unwrap().to_vec();
    let (status, body) = deploy(&d, Some("my-header-route"), header_route).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let note = body["deploy_check"].as_str().unwrap();
    assert!(note.contains("probe_config"), "{note}");
    // A plugin that routes the check has no such note.
    let (status, body) = deploy(&d, Some("my-key-hash"), key_hash()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("deploy_check").is_none(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_deploy_text_output_shows_the_deploy_check_caveat() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().unwrap();
    // header-route answers bad config to the check's empty config: its routing goes unchecked.
    let unchecked = dir.path().join("header-route.wasm");
    fs::write(
        &unchecked,
        narad_builtin_plugins::get("header-route").unwrap(),
    )
    .unwrap();
    let out = narad_async(
        &[
            "plugin",
            "deploy",
            unchecked.to_str().unwrap(),
            "--name",
            "my-header-route",
        ],
        &d.url,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("deployed my-header-route version"), "{text}");
    assert!(
        text.contains("deploy check: accepted without a routing check"),
        "{text}"
    );
    assert!(text.contains("probe_config"), "{text}");

    // A plugin whose routing was checked gets no such line.
    let checked = dir.path().join("key-hash.wasm");
    fs::write(&checked, key_hash()).unwrap();
    let out = narad_async(
        &[
            "plugin",
            "deploy",
            checked.to_str().unwrap(),
            "--name",
            "my-key-hash",
        ],
        &d.url,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("deployed my-key-hash version"), "{text}");
    assert!(!text.contains("deploy check"), "{text}");
}

/// `wasm` without its custom sections (what wabt's `wat2wasm` makes of a `@custom`).
fn strip_manifest(wasm: &[u8]) -> Vec<u8> {
    let mut out = wasm[..8].to_vec();
    let mut rest = &wasm[8..];
    while let Some((&id, tail)) = rest.split_first() {
        let (mut size, mut used, mut shift) = (0usize, 0usize, 0u32);
        loop {
            let byte = tail[used];
            used += 1;
            size |= usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        let end = used + size;
        if id != 0 {
            out.push(id);
            out.extend_from_slice(&tail[..end]);
        }
        rest = &tail[end..];
    }
    out
}

#[test]
fn serve_help_and_the_abi_say_the_same_about_the_memory_limit() {
    let help = narad(&["serve", "--help"], None);
    let help = String::from_utf8(help.stdout).unwrap();
    let line = help
        .lines()
        .skip_while(|l| !l.contains("--plugin-memory-bytes"))
        .nth(1)
        .unwrap();
    assert!(line.contains("growing past it traps"), "{line}");
    let abi =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/abi.md")).unwrap();
    let row = abi
        .lines()
        .find(|l| l.starts_with("| linear memory |"))
        .unwrap();
    assert!(row.contains("traps"), "{row}");
    assert!(!row.contains("returns -1)"), "{row}");
}

#[tokio::test]
async fn a_plugin_s_log_flood_is_cut_by_the_rate_limit_and_counted_on_metrics() {
    let d = Daemon::start().await;
    // 1,000 `narad.log` lines per call against a burst of 200: most are dropped, every call.
    let chatty = WatRouter::new("chatty")
        .imports(r#"(import "narad" "log" (func $log (param i32 i32 i32)))"#)
        .route(
            "",
            "(local $i i32)
    (loop $more
      (call $log (i32.const 3) (i32.const 0) (i32.const 4))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 1000))))",
        );
    let (status, body) = deploy(&d, None, chatty.wasm()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    d.create_topic("orders", 1).await;
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/copy",
            serde_json::json!({"partitions": 1, "router": ["chatty", "key-hash"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    d.produce("orders", serde_json::json!([{"key": "a", "value": "v"}]))
        .await;

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = reqwest::get(format!("{}/metrics", d.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let dropped: Option<f64> = text
            .lines()
            .find(|l| {
                l.starts_with("narad_plugin_log_lines_dropped_total{")
                    && l.contains("plugin=\"chatty\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok());
        if let Some(dropped) = dropped {
            assert!(dropped >= 700.0, "{dropped} lines dropped");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no dropped log lines counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
