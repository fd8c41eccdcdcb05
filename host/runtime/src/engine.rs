//! The wasmtime engine every plugin of a node runs on.
//!
//! One [`Runtime`] per daemon: Cranelift, fuel metering, epoch interruption with one ticker
//! thread, a stack limit, the `narad.log` linker, the compiled-module cache, and the compile
//! gate (single flight per digest, [`DEFAULT_COMPILE_CONCURRENCY`] compiles at once). Cloning a
//! runtime is cheap (an `Arc`); the ticker stops when the last clone, plugin and instance
//! are gone.
//!
//! Determinism: plugins get no clock, no randomness and no WASI (the linker offers only
//! `narad.log`); relaxed SIMD is off and NaNs are canonicalized, so a slab routes the same way
//! on every node and every replay.

use std::path::PathBuf;
use std::sync::Arc;

use wasmtime::{Config, Engine, Linker, OptLevel};

use crate::cache::ModuleCache;
use crate::error::EngineError;
use crate::gate::CompileGate;
use crate::instance::HostState;
use crate::limits::Limits;
use crate::ticker::{EpochTicker, deadline_ticks};

/// Default most compiles a runtime runs at once: 1. A compile runs on one thread (wasmtime is
/// built without its `parallel-compilation` feature), so one compile at a time keeps at most
/// one core busy compiling and leaves the others (one, on the 2-core nodes this targets) to
/// routing and I/O. Compiles are rare: a deploy, or a first load with an empty cache. A load
/// waiting for the permit waits at most the compile time of the modules ahead of it, which
/// the module limits bound (see [`crate::limits::ModuleLimits`]).
pub const DEFAULT_COMPILE_CONCURRENCY: usize = 1;

/// How to build a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Limits of every instance and call (defaults: 100 ms deadline, 64 MiB memory), and of
    /// the modules it compiles.
    pub limits: Limits,
    /// Directory of the compiled-module cache (e.g. `{data_dir}/plugins/cache`); `None`
    /// compiles every module in memory (tests, `narad plugin test`).
    pub cache_dir: Option<PathBuf>,
    /// Most compiles at once (default [`DEFAULT_COMPILE_CONCURRENCY`]; 0 counts as 1).
    pub compile_concurrency: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            limits: Limits::default(),
            cache_dir: None,
            compile_concurrency: DEFAULT_COMPILE_CONCURRENCY,
        }
    }
}

impl RuntimeConfig {
    /// The defaults with a compiled-module cache in `dir`.
    pub fn with_cache_dir(dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            cache_dir: Some(dir.into()),
            ..RuntimeConfig::default()
        }
    }

    /// These settings with `limits`.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
}

/// The plugin runtime: a configured wasmtime engine and what goes with it.
///
/// `Send + Sync + Clone`: the daemon keeps one and hands clones to its routing workers.
#[derive(Clone, Debug)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

#[derive(Debug)]
pub(crate) struct RuntimeInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) limits: Limits,
    pub(crate) deadline_ticks: u64,
    pub(crate) cache: Option<ModuleCache>,
    /// Single flight per digest and the compile permits.
    pub(crate) gate: CompileGate,
    // Last field: dropped after the rest; stops the epoch thread.
    _ticker: EpochTicker,
}

impl Runtime {
    /// Builds the engine, starts its epoch ticker and opens (creates) the cache directory.
    pub fn new(config: RuntimeConfig) -> Result<Self, EngineError> {
        let limits = config.limits;
        if limits.deadline.is_zero() {
            return Err(EngineError::InvalidLimit(
                "the call deadline must be above zero",
            ));
        }
        if limits.memory_bytes == 0 {
            return Err(EngineError::InvalidLimit(
                "the memory limit must be above zero",
            ));
        }
        if limits.max_wasm_stack_bytes == 0 {
            return Err(EngineError::InvalidLimit(
                "the stack limit must be above zero",
            ));
        }
        let mut wasm = Config::new();
        wasm.strategy(wasmtime::Strategy::Cranelift)
            .cranelift_opt_level(OptLevel::Speed)
            .consume_fuel(true)
            .epoch_interruption(true)
            .max_wasm_stack(limits.max_wasm_stack_bytes)
            // Determinism across nodes and replays.
            .wasm_relaxed_simd(false)
            .cranelift_nan_canonicalization(true)
            // Compile cost is bounded before compiling (`precheck`) and by the compile
            // permits; wasmtime is built without `parallel-compilation`, so one compile uses
            // one thread.
            // One memory per plugin; nothing needs more.
            .wasm_multi_memory(false)
            .wasm_memory64(false);
        let engine = Engine::new(&wasm).map_err(|e| EngineError::Config {
            message: format!("{e:#}"),
        })?;
        let mut linker = Linker::new(&engine);
        crate::hostlog::add_to_linker(&mut linker).map_err(|e| EngineError::Config {
            message: format!("{e:#}"),
        })?;
        let cache = match config.cache_dir {
            Some(dir) => Some(
                ModuleCache::new(dir.clone(), &engine)
                    .map_err(|source| EngineError::CacheDir { path: dir, source })?,
            ),
            None => None,
        };
        let ticker = EpochTicker::start(&engine).map_err(EngineError::Ticker)?;
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                deadline_ticks: deadline_ticks(limits.deadline),
                engine,
                linker,
                limits,
                cache,
                gate: CompileGate::new(config.compile_concurrency),
                _ticker: ticker,
            }),
        })
    }

    /// The limits every instance and call runs under.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// How many modules this runtime has compiled since it was built (loads served from the
    /// compiled-module cache, or by waiting for a load of the same digest, do not count).
    pub fn compiles(&self) -> u64 {
        self.inner.gate.compiles()
    }
}
