//! On-disk cache of compiled modules, so a restart does not recompile every plugin.
//!
//! File: `{dir}/{digest}-{fingerprint}.cwasm` where `digest` is the sha256 of the original
//! `.wasm` bytes (which were validated) and `fingerprint` identifies the engine (wasmtime
//! version, target, compilation settings). Content:
//!
//! ```text
//! 0   4   magic b"NRC1"
//! 4   32  sha256 of the serialized module that follows
//! 36  ..  Module::serialize output
//! ```
//!
//! Safety rule: precompiled code is only ever loaded from a file this process family wrote,
//! found by a name derived from the digest of bytes we compiled ourselves; uploads are always
//! compiled from `.wasm`. The checksum catches a torn or bit-flipped file, which wasmtime's own
//! header checks would not notice inside the machine code; such a file is recompiled and
//! overwritten, never a failure. Writes go to a temporary file renamed into place, so a crash
//! leaves either the old file or the new one.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use wasmtime::{Engine, Module};

use crate::gate::CompileGate;
use crate::plugin::Digest;

const MAGIC: &[u8; 4] = b"NRC1";
const HEADER_BYTES: usize = 4 + 32;

/// Where a module came from, for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheOutcome {
    /// Loaded from a cache file.
    Hit,
    /// Compiled (no cache, no file, or a stale/corrupt file) and written to the cache.
    Compiled,
}

/// The compiled-module cache of one engine.
#[derive(Debug)]
pub(crate) struct ModuleCache {
    dir: PathBuf,
    fingerprint: String,
}

impl ModuleCache {
    pub(crate) fn new(dir: PathBuf, engine: &Engine) -> std::io::Result<Self> {
        // Owner-only whatever the umask: the cache lives in the daemon's data directory.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        Ok(ModuleCache {
            dir,
            fingerprint: fingerprint(engine),
        })
    }

    /// The file a module with `digest` is cached in.
    pub(crate) fn path_for(&self, digest: &Digest) -> PathBuf {
        self.dir
            .join(format!("{}-{}.cwasm", digest.to_hex(), self.fingerprint))
    }

    /// Loads the compiled form of `wasm` (whose sha256 is `digest`) from the cache, or
    /// compiles it (under a permit of `gate`) and stores it. Only compilation errors are
    /// returned; cache I/O problems are logged and bypassed.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        gate: &CompileGate,
        digest: &Digest,
        wasm: &[u8],
    ) -> wasmtime::Result<(Module, CacheOutcome)> {
        let path = self.path_for(digest);
        match fs::read(&path) {
            Ok(file) => match deserialize_checked(engine, &file) {
                Some(module) => return Ok((module, CacheOutcome::Hit)),
                None => tracing::warn!(
                    path = %path.display(),
                    "compiled-module cache file is corrupt or stale; recompiling"
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                path = %path.display(),
                error = %e,
                "cannot read compiled-module cache file; recompiling"
            ),
        }
        let module = gate.compile(|| Module::from_binary(engine, wasm))?;
        if let Err(e) = self.store(&path, &module) {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                "cannot write compiled-module cache file"
            );
        }
        Ok((module, CacheOutcome::Compiled))
    }

    fn store(&self, path: &Path, module: &Module) -> std::io::Result<()> {
        let serialized = module.serialize().map_err(std::io::Error::other)?;
        let checksum = Sha256::digest(&serialized);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(MAGIC)?;
        file.write_all(&checksum)?;
        file.write_all(&serialized)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)
    }
}

/// Deserializes a cache file after checking its magic and checksum; `None` if anything is off.
fn deserialize_checked(engine: &Engine, file: &[u8]) -> Option<Module> {
    if file.len() < HEADER_BYTES || &file[..4] != MAGIC {
        return None;
    }
    let (header, body) = file.split_at(HEADER_BYTES);
    if Sha256::digest(body).as_slice() != &header[4..] {
        return None;
    }
    // SAFETY: `body` is exactly what `Module::serialize` produced in `store` (the sha256 over it
    // matches the one written beside it), in a file whose name is derived from the digest of
    // `.wasm` bytes this runtime compiled itself. wasmtime additionally checks that the
    // artifact was produced by a compatible engine and refuses it otherwise.
    unsafe { Module::deserialize(engine, body) }.ok()
}

/// A short, stable identifier of the engine's code-generation compatibility: the wasmtime
/// version, target and settings (wasmtime's `precompile_compatibility_hash`), hashed with
/// sha256 so the name does not depend on std's unstable `DefaultHasher`.
fn fingerprint(engine: &Engine) -> String {
    use std::hash::Hash;
    let mut hasher = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex::encode(&hasher.0.finalize()[..8])
}

/// Adapts sha256 to `std::hash::Hasher` so wasmtime's hash can feed it.
struct ShaHasher(Sha256);

impl std::hash::Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        // Never used: the fingerprint takes the full digest.
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}
