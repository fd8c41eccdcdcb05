//! A validated plugin: compiled module, manifest, content digest.
//!
//! [`Plugin::load`] is the only way to get one, and it refuses anything the ABI does not allow,
//! in this order, each with its own [`LoadError`] variant:
//!
//! 1. the bytes are a core Wasm module (magic and version), and its shape is within the
//!    module limits ([`crate::precheck`]: function count and sizes, locals, segments), checked
//!    before anything is compiled;
//! 2. it imports nothing but `narad.log(i32, i32, i32)` (no WASI, no clock, no randomness),
//!    and exports `memory` and the five ABI functions with their exact signatures, also
//!    checked before the compile (`interface`);
//! 3. it compiles (wasmtime validates it), from the `.wasm` or from our own compiled cache;
//! 4. exactly one `narad.manifest` section, valid JSON, a valid name, `abi` 1;
//! 5. `narad_abi_version()` returns 1;
//! 6. it routes the built-in test slab under production limits without trapping, overrunning,
//!    breaking the protocol or answering out of range (with its manifest's `probe_config`, or
//!    an empty config, to which a bad-config answer is accepted: see [`crate::testslab`]).
//!
//! A `Plugin` is cheap to clone, `Send + Sync`, and instantiated per link by
//! [`crate::Instance`].

use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use wasmtime::{InstancePre, Module};

use narad_abi::{ABI_VERSION, MANIFEST_SECTION, Manifest, Needs};

use crate::cache::CacheOutcome;
use crate::engine::Runtime;
use crate::error::LoadError;
use crate::instance::{HostState, Instance};
use crate::testslab::DeployProbe;
use crate::{precheck, testslab};

/// A sha256 content digest of a plugin's `.wasm` bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The sha256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex characters; `None` otherwise.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).ok()?;
        Some(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A plugin that passed every deploy check.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    runtime: Runtime,
    digest: Digest,
    manifest: Manifest,
    needs: Needs,
    size_bytes: usize,
    cache: CacheOutcome,
    pre: InstancePre<HostState>,
    /// What the deploy check learnt; set once, right after the check ran.
    probe: std::sync::OnceLock<DeployProbe>,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name())
            .field("digest", &self.inner.digest)
            .finish()
    }
}

impl Plugin {
    /// Validates `bytes` as a routing plugin for `runtime` and compiles it (or loads our own
    /// compiled copy from the cache). See the module doc for the checks, in order.
    ///
    /// The shape check runs on every load, also of a module stored long ago (whose compiled
    /// code may still be cached), so a module over today's limits never runs. Concurrent loads
    /// of the same bytes share one load; compiles wait for one of the runtime's permits (see
    /// [`crate::DEFAULT_COMPILE_CONCURRENCY`]). Blocking: call it from a blocking pool.
    pub fn load(runtime: &Runtime, bytes: &[u8]) -> Result<Plugin, LoadError> {
        check_header(bytes)?;
        precheck::check(&runtime.inner.limits, bytes)?;
        // Imports and exports before the compile: a module that can never load costs no
        // compile (seconds at the limits) to find out.
        crate::interface::check(bytes)?;
        let digest = Digest::of(bytes);
        runtime
            .inner
            .gate
            .single_flight(digest, || Plugin::compile_and_check(runtime, digest, bytes))
    }

    /// Reads what a module says about itself without compiling it: the header, the shape
    /// check under `runtime`'s limits and the manifest (checks 1 and 4 of the module doc, and
    /// the limits). For listings: a module that passes may still fail the other checks
    /// (imports and exports, the compile, the test slab).
    pub fn inspect(runtime: &Runtime, bytes: &[u8]) -> Result<Manifest, LoadError> {
        check_header(bytes)?;
        precheck::check(&runtime.inner.limits, bytes)?;
        read_manifest(bytes)
    }

    /// Checks 3 to 6 of the module doc, for the one load of `digest` in flight.
    fn compile_and_check(
        runtime: &Runtime,
        digest: Digest,
        bytes: &[u8],
    ) -> Result<Plugin, LoadError> {
        let engine = &runtime.inner.engine;
        let gate = &runtime.inner.gate;
        let (module, cache) = match &runtime.inner.cache {
            Some(cache) => cache.load_or_compile(engine, gate, &digest, bytes),
            None => gate
                .compile(|| Module::from_binary(engine, bytes))
                .map(|m| (m, CacheOutcome::Compiled)),
        }
        .map_err(|e| LoadError::Compile {
            message: format!("{e:#}"),
        })?;
        let manifest = read_manifest(bytes)?;
        let needs = manifest.needs;
        let pre =
            runtime
                .inner
                .linker
                .instantiate_pre(&module)
                .map_err(|e| LoadError::Compile {
                    message: format!("{e:#}"),
                })?;
        let plugin = Plugin {
            inner: Arc::new(PluginInner {
                runtime: runtime.clone(),
                digest,
                manifest,
                needs,
                size_bytes: bytes.len(),
                cache,
                pre,
                probe: std::sync::OnceLock::new(),
            }),
        };
        let mut instance = Instance::new(plugin.clone());
        let version = instance.abi_version().map_err(LoadError::Check)?;
        if version != ABI_VERSION as i32 {
            return Err(LoadError::AbiVersion {
                found: version,
                expected: ABI_VERSION as i32,
            });
        }
        let probe = testslab::run(&mut instance).map_err(LoadError::TestSlab)?;
        // Fresh: nobody else holds this plugin yet, so the cell is empty.
        let _ = plugin.inner.probe.set(probe);
        Ok(plugin)
    }

    /// The manifest name (`key-hash`, ...).
    pub fn name(&self) -> &str {
        &self.inner.manifest.name
    }

    /// The parsed manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// What the plugin asked to see (keys always; headers, values on request).
    pub fn needs(&self) -> Needs {
        self.inner.needs
    }

    /// The sha256 of the `.wasm` bytes.
    pub fn digest(&self) -> Digest {
        self.inner.digest
    }

    /// Size of the `.wasm` bytes.
    pub fn size_bytes(&self) -> usize {
        self.inner.size_bytes
    }

    /// Whether the compiled code came from the on-disk cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.inner.cache
    }

    /// What the deploy check learnt of the plugin: it routed the test slab, or it answered
    /// bad config to the empty config (see [`crate::testslab`]).
    pub fn deploy_probe(&self) -> DeployProbe {
        self.inner
            .probe
            .get()
            .cloned()
            .unwrap_or(DeployProbe::Routed)
    }

    /// The runtime this plugin was compiled for.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    pub(crate) fn instance_pre(&self) -> &InstancePre<HostState> {
        &self.inner.pre
    }
}

/// The Wasm magic and the core-module binary version.
const WASM_MAGIC: [u8; 4] = *b"\0asm";
const CORE_MODULE_VERSION: u32 = 1;

fn check_header(bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.len() < 8 || bytes[..4] != WASM_MAGIC {
        return Err(LoadError::NotWasm);
    }
    let version = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if version != CORE_MODULE_VERSION {
        return Err(LoadError::NotCoreModule { version });
    }
    Ok(())
}

/// Finds and parses the one `narad.manifest` custom section.
fn read_manifest(bytes: &[u8]) -> Result<Manifest, LoadError> {
    let mut found: Vec<&[u8]> = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        // The shape check already walked these sections, so the parser does not fail here;
        // if it does, the module is malformed, as the compiler would say.
        let payload = payload.map_err(|e| LoadError::Compile {
            message: e.to_string(),
        })?;
        if let wasmparser::Payload::CustomSection(section) = payload
            && section.name() == MANIFEST_SECTION
        {
            found.push(section.data());
        }
    }
    let json = match found.as_slice() {
        [] => return Err(LoadError::ManifestMissing),
        [one] => *one,
        many => return Err(LoadError::ManifestDuplicate { count: many.len() }),
    };
    let manifest: Manifest =
        serde_json::from_slice(json).map_err(|e| LoadError::ManifestInvalid {
            message: e.to_string(),
        })?;
    manifest.validate().map_err(|error| {
        use narad_abi::ManifestError as E;
        match error {
            E::NameLength { .. } | E::NameCharacter { .. } => LoadError::ManifestName {
                name: manifest.name.clone(),
            },
            E::UnsupportedAbi { found } => LoadError::ManifestAbi {
                found,
                expected: ABI_VERSION,
            },
            other => LoadError::ManifestInvalid {
                message: other.to_string(),
            },
        }
    })?;
    Ok(manifest)
}
