//! Typed errors of the runtime, one enum per concern.
//!
//! - [`EngineError`]: the runtime could not start (bad configuration, unusable cache dir).
//! - [`LoadError`]: a plugin was refused at deploy; each variant says exactly what is wrong so
//!   the HTTP API can answer a precise 400.
//! - [`Failure`]: what went wrong in one call of one plugin (trap, deadline, fuel, ...), and
//!   [`FailureKind`], its fieldless label for metrics.
//! - [`PluginError`]: a slab failed in a chain: which plugin (position, name, digest) and the
//!   [`Failure`].
//! - [`ChainError`]: a chain could not be assembled.
//!
//! Tests match on variants, never on messages.

use std::fmt;

use crate::plugin::Digest;

/// The runtime could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// wasmtime refused the engine configuration built from [`crate::RuntimeConfig`]
    /// (for example a stack limit it cannot honour).
    #[error("wasmtime rejected the engine configuration: {message}")]
    Config {
        /// wasmtime's explanation.
        message: String,
    },
    /// The compiled-module cache directory could not be created.
    #[error("cannot create the compiled-module cache directory {path}")]
    CacheDir {
        /// The directory that was asked for.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The epoch ticker thread could not be spawned.
    #[error("cannot spawn the epoch ticker thread")]
    Ticker(#[source] std::io::Error),
    /// A configured limit is out of its allowed range (zero deadline, zero memory, ...).
    #[error("invalid runtime limit: {0}")]
    InvalidLimit(&'static str),
}

/// Which of the [`crate::limits::ModuleLimits`] (or of the declared memory and table sizes) a
/// module broke; a stable snake_case name ([`ModuleLimit::as_str`]) for APIs and messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ModuleLimit {
    /// Defined functions ([`crate::limits::ModuleLimits::max_functions`]).
    Functions,
    /// Bytes of one function body ([`crate::limits::ModuleLimits::max_function_body_bytes`]).
    FunctionBodyBytes,
    /// Bytes of the code section ([`crate::limits::ModuleLimits::max_code_bytes`]).
    CodeBytes,
    /// Declared locals of one function
    /// ([`crate::limits::ModuleLimits::max_locals_per_function`]).
    LocalsPerFunction,
    /// Type section entries ([`crate::limits::ModuleLimits::max_items`]).
    Types,
    /// Imports ([`crate::limits::ModuleLimits::max_items`]).
    Imports,
    /// Exports ([`crate::limits::ModuleLimits::max_items`]).
    Exports,
    /// Defined globals ([`crate::limits::ModuleLimits::max_items`]).
    Globals,
    /// Data segments ([`crate::limits::ModuleLimits::max_items`]).
    DataSegments,
    /// Element segments ([`crate::limits::ModuleLimits::max_items`]).
    ElementSegments,
    /// Items of all element segments ([`crate::limits::ModuleLimits::max_items`]).
    ElementItems,
    /// Bytes of all data segments ([`crate::limits::ModuleLimits::max_data_bytes`]).
    DataBytes,
    /// Memories declared or imported ([`crate::limits::MAX_MEMORIES`]).
    Memories,
    /// Tables declared or imported ([`crate::limits::MAX_TABLES`]).
    Tables,
    /// A memory's declared minimum size against [`crate::Limits::memory_bytes`].
    MemoryMinimumBytes,
    /// A table's declared minimum size against [`crate::Limits::table_elements`].
    TableMinimumElements,
}

impl ModuleLimit {
    /// The stable snake_case name (`functions`, `function_body_bytes`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleLimit::Functions => "functions",
            ModuleLimit::FunctionBodyBytes => "function_body_bytes",
            ModuleLimit::CodeBytes => "code_bytes",
            ModuleLimit::LocalsPerFunction => "locals_per_function",
            ModuleLimit::Types => "types",
            ModuleLimit::Imports => "imports",
            ModuleLimit::Exports => "exports",
            ModuleLimit::Globals => "globals",
            ModuleLimit::DataSegments => "data_segments",
            ModuleLimit::ElementSegments => "element_segments",
            ModuleLimit::ElementItems => "element_items",
            ModuleLimit::DataBytes => "data_bytes",
            ModuleLimit::Memories => "memories",
            ModuleLimit::Tables => "tables",
            ModuleLimit::MemoryMinimumBytes => "memory_minimum_bytes",
            ModuleLimit::TableMinimumElements => "table_minimum_elements",
        }
    }

    /// What the counted value is, in words, for messages ("defined functions", ...).
    fn counted(self) -> &'static str {
        match self {
            ModuleLimit::Functions => "defined functions",
            ModuleLimit::FunctionBodyBytes => "bytes in one function body",
            ModuleLimit::CodeBytes => "bytes of code",
            ModuleLimit::LocalsPerFunction => "locals declared in one function",
            ModuleLimit::Types => "types",
            ModuleLimit::Imports => "imports",
            ModuleLimit::Exports => "exports",
            ModuleLimit::Globals => "globals",
            ModuleLimit::DataSegments => "data segments",
            ModuleLimit::ElementSegments => "element segments",
            ModuleLimit::ElementItems => "element segment items",
            ModuleLimit::DataBytes => "bytes of data segments",
            ModuleLimit::Memories => "memories",
            ModuleLimit::Tables => "tables",
            ModuleLimit::MemoryMinimumBytes => "bytes of declared minimum memory",
            ModuleLimit::TableMinimumElements => "elements of declared minimum table size",
        }
    }
}

impl fmt::Display for ModuleLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A trap's text: what the guest said last, then the trap's cause in parentheses.
fn trap_text(cause: &str, guest_said: Option<&str>) -> String {
    match guest_said {
        Some(said) => format!("{said} ({cause})"),
        None => cause.to_owned(),
    }
}

/// " (function N of the code section)" when a function is named, else nothing.
fn at_function(function: &Option<u32>) -> String {
    match function {
        Some(index) => format!(" (function {index} of the code section)"),
        None => String::new(),
    }
}

/// A plugin was refused at load (deploy) time. Every variant names what is wrong.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes do not start with the Wasm magic `\0asm`.
    #[error("not a WebAssembly module (missing the \\0asm magic)")]
    NotWasm,
    /// The bytes are a Wasm component or an unknown binary version, not a core module.
    #[error(
        "not a core WebAssembly module (binary version/layer {version:#010x}); components are not supported"
    )]
    NotCoreModule {
        /// The 4 bytes after the magic, little-endian.
        version: u32,
    },
    /// The module is over one of the shape limits checked before compiling (see
    /// [`crate::limits::ModuleLimits`]); nothing of it was compiled.
    #[error(
        "the module exceeds the {limit} limit: {found} {}{}, the most allowed is {max}",
        limit.counted(),
        at_function(function)
    )]
    ModuleLimit {
        /// Which limit.
        limit: ModuleLimit,
        /// The value found in the module.
        found: u64,
        /// The limit's value.
        max: u64,
        /// The function's index in the code section, for per-function limits.
        function: Option<u32>,
    },
    /// wasmtime could not validate or compile the module.
    #[error("the module does not compile: {message}")]
    Compile {
        /// wasmtime's explanation (validation error with its offset, or codegen failure).
        message: String,
    },
    /// The module imports something other than `narad.log` (WASI, a clock, randomness, ...).
    #[error("forbidden import {module}.{name}: plugins may import only narad.log")]
    ForbiddenImport {
        /// Import module name, e.g. `wasi_snapshot_preview1`.
        module: String,
        /// Import field name, e.g. `fd_write`.
        name: String,
    },
    /// `narad.log` is imported with a signature other than `(i32, i32, i32) -> ()`.
    #[error("import narad.log has the wrong type: expected {expected}, found {found}")]
    WrongImportType {
        /// The signature the ABI requires.
        expected: &'static str,
        /// What the module declares.
        found: String,
    },
    /// A required export is absent.
    #[error("missing export {name}")]
    MissingExport {
        /// The ABI symbol name.
        name: &'static str,
    },
    /// A required export exists with the wrong kind or signature.
    #[error("export {name} has the wrong type: expected {expected}, found {found}")]
    WrongExportType {
        /// The ABI symbol name.
        name: &'static str,
        /// The type the ABI requires.
        expected: &'static str,
        /// What the module exports.
        found: String,
    },
    /// `narad_abi_version()` returned something other than the version this host speaks.
    #[error("plugin speaks ABI version {found}, this host speaks {expected}")]
    AbiVersion {
        /// What the plugin returned.
        found: i32,
        /// What the host expects (1).
        expected: i32,
    },
    /// No `narad.manifest` custom section. The message says how to add one, because the
    /// usual cause is a tool that dropped it (wabt's `wat2wasm` ignores `@custom`).
    #[error(
        "the narad manifest custom section is missing: the module needs one custom section named \"narad.manifest\" holding the manifest JSON (wabt's wat2wasm drops `@custom` annotations; build WAT with `wasm-tools parse` or the `wat` crate, or see docs/abi.md#manifest)"
    )]
    ManifestMissing,
    /// More than one `narad.manifest` custom section.
    #[error("{count} narad.manifest custom sections; exactly one is required")]
    ManifestDuplicate {
        /// How many were found.
        count: usize,
    },
    /// The manifest is not the JSON object the ABI describes.
    #[error("the manifest is not valid: {message}")]
    ManifestInvalid {
        /// The parser's explanation.
        message: String,
    },
    /// The manifest's name is empty, too long, or has characters outside `[a-z0-9-_]`.
    #[error("invalid plugin name {name:?} in the manifest: 1 to 64 of [a-z0-9-_]")]
    ManifestName {
        /// The offending name.
        name: String,
    },
    /// The manifest declares an ABI version this host does not speak.
    #[error("the manifest declares ABI version {found}, this host speaks {expected}")]
    ManifestAbi {
        /// Declared version.
        found: u32,
        /// What the host expects (1).
        expected: u32,
    },
    /// The module was instantiated or called for the version check and failed.
    #[error("the module failed while being checked: {0}")]
    Check(Failure),
    /// The module failed on the built-in test slab, under the same limits as in production.
    #[error("the module failed on the built-in test slab: {0}")]
    TestSlab(Failure),
}

/// Fieldless label of a [`Failure`], for counting per plugin and kind and for metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailureKind {
    /// See [`Failure::Trap`].
    Trap,
    /// See [`Failure::Deadline`].
    Deadline,
    /// See [`Failure::FuelExhausted`].
    Fuel,
    /// See [`Failure::MemoryLimit`].
    MemoryLimit,
    /// See [`Failure::ErrorReturn`].
    ErrorReturn,
    /// See [`Failure::Protocol`].
    Protocol,
    /// See [`Failure::OutOfRange`].
    OutOfRange,
    /// See [`Failure::Undecided`].
    Undecided,
    /// See [`Failure::Host`].
    Host,
}

impl FailureKind {
    /// Every kind, in a fixed order (the index of [`FailureKind::index`]).
    pub const ALL: [FailureKind; 9] = [
        FailureKind::Trap,
        FailureKind::Deadline,
        FailureKind::Fuel,
        FailureKind::MemoryLimit,
        FailureKind::ErrorReturn,
        FailureKind::Protocol,
        FailureKind::OutOfRange,
        FailureKind::Undecided,
        FailureKind::Host,
    ];

    /// Position in [`FailureKind::ALL`], for array-backed counters.
    pub fn index(self) -> usize {
        self as usize
    }

    /// A stable snake_case label (metric label value).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Trap => "trap",
            FailureKind::Deadline => "deadline",
            FailureKind::Fuel => "fuel",
            FailureKind::MemoryLimit => "memory_limit",
            FailureKind::ErrorReturn => "error_return",
            FailureKind::Protocol => "protocol",
            FailureKind::OutOfRange => "out_of_range",
            FailureKind::Undecided => "undecided",
            FailureKind::Host => "host",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The negative return codes of `narad_route` that carry a meaning (ABI v1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// -1: a plugin-defined failure.
    Plugin,
    /// -2: the guest could not decode the input.
    BadInput,
    /// -3: the link's config bytes are invalid for this plugin.
    BadConfig,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorCode::Plugin => "plugin error",
            ErrorCode::BadInput => "bad input",
            ErrorCode::BadConfig => "bad config",
        })
    }
}

/// A breach of the ABI by the guest that is not a trap.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// `narad_route` returned a value that is neither 0 nor a defined error code (for
    /// example the record count, as if it were a length).
    ReturnCode(i32),
    /// `narad_alloc` returned 0 (it could not allocate the slab buffer).
    AllocFailed {
        /// Bytes asked for.
        size: u32,
    },
    /// `narad_alloc` returned a pointer that is not 8-aligned or whose range leaves memory.
    BadAllocation {
        /// The returned pointer.
        ptr: u32,
        /// Bytes asked for.
        size: u32,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::ReturnCode(rc) => write!(f, "narad_route returned {rc}, not 0 or -1..=-3"),
            Violation::AllocFailed { size } => write!(f, "narad_alloc({size}) returned 0"),
            Violation::BadAllocation { ptr, size } => write!(
                f,
                "narad_alloc({size}) returned {ptr:#x}: misaligned or outside memory"
            ),
        }
    }
}

/// What went wrong in one call of one plugin, or in the check of a chain's answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The guest trapped (unreachable, out-of-bounds access, stack overflow, ...). Shown as
    /// the guest's last error line, then the trap's cause in parentheses.
    #[error("trapped: {}", trap_text(message, guest_said.as_deref()))]
    Trap {
        /// wasmtime's trap code when it has one (`UnreachableCodeReached`, ...), as text.
        code: Option<String>,
        /// The trap's cause in one line (`wasm \`unreachable\` instruction executed`), without
        /// the Wasm backtrace (logged at debug level), escaped and cut by
        /// [`crate::text::sanitize`].
        message: String,
        /// The last error-level line the guest logged during the call, escaped and cut: an SDK
        /// plugin's panic handler logs `plugin panicked: <message> at <file:line>` just before
        /// it traps.
        guest_said: Option<String>,
    },
    /// The call ran past its wall-clock deadline (the epoch backstop).
    #[error("exceeded its deadline of {deadline_ms} ms")]
    Deadline {
        /// The configured deadline.
        deadline_ms: u64,
    },
    /// The call consumed its whole fuel budget (deterministic: fails the same on replay).
    #[error("ran out of fuel (budget {budget})")]
    FuelExhausted {
        /// The budget the call was given.
        budget: u64,
    },
    /// The guest tried to grow its memory (or a table) past the per-instance limit.
    #[error("hit the memory limit of {limit_bytes} bytes")]
    MemoryLimit {
        /// The configured limit.
        limit_bytes: u64,
    },
    /// `narad_route` returned one of the ABI's error codes. The guest's message is shown
    /// once after the code: a message that already starts with the code's words (the Rust
    /// SDK writes `bad config: ...`) is not prefixed a second time.
    #[error("returned {code}: {}", error_message(*code, message.as_deref()))]
    ErrorReturn {
        /// Which code.
        code: ErrorCode,
        /// The guest's message from `narad_last_error`: at most 4 KiB read, lossy UTF-8, then
        /// escaped and cut to [`crate::text::MAX_PLUGIN_TEXT_BYTES`] by
        /// [`crate::text::sanitize`], so it is safe in a log line or an API answer.
        message: Option<String>,
    },
    /// The guest broke the ABI without trapping.
    #[error("protocol violation: {0}")]
    Protocol(Violation),
    /// The guest decided a record with an index not below the child partition count.
    #[error(
        "decided record at offset {record_offset} to partition {value}, but the child has {partition_count}"
    )]
    OutOfRange {
        /// The index the guest wrote.
        value: u32,
        /// Parent offset of the record.
        record_offset: u64,
        /// Child partition count.
        partition_count: u32,
    },
    /// After the last plugin of the chain, a record was still undecided.
    #[error("left the record at offset {record_offset} undecided at the end of the chain")]
    Undecided {
        /// Parent offset of the first undecided record.
        record_offset: u64,
    },
    /// A host-side error unrelated to the guest's behaviour (wasmtime refused an operation).
    #[error("host error: {message}")]
    Host {
        /// The explanation.
        message: String,
    },
}

/// The guest's message of an error return without a leading repeat of the code's words.
fn error_message(code: ErrorCode, message: Option<&str>) -> &str {
    let Some(message) = message else {
        return "(no message)";
    };
    let label = code.to_string();
    message
        .strip_prefix(label.as_str())
        .and_then(|rest| rest.strip_prefix(':'))
        .map(str::trim_start)
        .filter(|rest| !rest.is_empty())
        .unwrap_or(message)
}

impl Failure {
    /// Whether the failure is about the link's config rather than about a record: a
    /// `ROUTE_ERR_BAD_CONFIG` return. No record of a slab can be blamed for it, so the
    /// poison-record search is skipped, and an attach whose probe gets it is refused.
    pub fn is_bad_config(&self) -> bool {
        matches!(
            self,
            Failure::ErrorReturn {
                code: ErrorCode::BadConfig,
                ..
            }
        )
    }

    /// The fieldless label of this failure.
    pub fn kind(&self) -> FailureKind {
        match self {
            Failure::Trap { .. } => FailureKind::Trap,
            Failure::Deadline { .. } => FailureKind::Deadline,
            Failure::FuelExhausted { .. } => FailureKind::Fuel,
            Failure::MemoryLimit { .. } => FailureKind::MemoryLimit,
            Failure::ErrorReturn { .. } => FailureKind::ErrorReturn,
            Failure::Protocol(_) => FailureKind::Protocol,
            Failure::OutOfRange { .. } => FailureKind::OutOfRange,
            Failure::Undecided { .. } => FailureKind::Undecided,
            Failure::Host { .. } => FailureKind::Host,
        }
    }
}

/// Hex digits of a digest shown in a [`PluginError`]'s message: 12, as in the metric labels
/// and enough to tell versions apart (the full digest is in the `digest` field); the whole 64
/// made a stalled link's error too wide for a table.
pub const SHORT_DIGEST_HEX: usize = 12;

/// A slab failed in a chain: the plugin that failed and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("plugin {} failed: {failure}", self.who())]
#[non_exhaustive]
pub struct PluginError {
    /// 0-based position of the plugin in the chain.
    pub position: usize,
    /// The plugin's manifest name.
    pub name: String,
    /// The plugin's manifest version (free-form; may be empty).
    pub version: String,
    /// The plugin's content digest.
    pub digest: Digest,
    /// What went wrong (boxed: a trap's texts would make every routing `Result` large).
    pub failure: Box<Failure>,
}

impl PluginError {
    /// The plugin, as messages name it: `name version (#position of the chain, sha256:prefix)`.
    pub fn who(&self) -> String {
        let version = if self.version.is_empty() {
            String::new()
        } else {
            format!(" {}", self.version)
        };
        format!(
            "{}{version} (#{} of the chain, sha256:{})",
            self.name,
            self.position,
            &self.digest.to_hex()[..SHORT_DIGEST_HEX]
        )
    }

    /// The fieldless label of the failure.
    pub fn kind(&self) -> FailureKind {
        self.failure.kind()
    }
}

/// A chain could not be assembled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// A chain holds 1 to [`crate::MAX_CHAIN_LEN`] plugins.
    #[error("a chain holds 1 to {max} plugins, got {len}")]
    Length {
        /// Plugins given.
        len: usize,
        /// The maximum.
        max: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_error_from_the_rust_sdk_says_bad_config_once() {
        let failure = Failure::ErrorReturn {
            code: ErrorCode::BadConfig,
            message: Some("bad config: partition 7 but c has 2 partitions".into()),
        };
        assert_eq!(
            failure.to_string(),
            "returned bad config: partition 7 but c has 2 partitions"
        );
        // A message of other words is kept whole, and no message is said so.
        let other = Failure::ErrorReturn {
            code: ErrorCode::Plugin,
            message: Some("bad config: not mine".into()),
        };
        assert_eq!(
            other.to_string(),
            "returned plugin error: bad config: not mine"
        );
        let none = Failure::ErrorReturn {
            code: ErrorCode::BadConfig,
            message: None,
        };
        assert_eq!(none.to_string(), "returned bad config: (no message)");
    }
}
