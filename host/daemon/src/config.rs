//! Daemon configuration: `narad serve` flags, their environment variables, and the TOML config
//! file, merged with the precedence flag > environment > file > built-in default.
//!
//! clap resolves "flag, else environment" itself (every flag names its `NARAD_*` variable); the
//! flags carry no clap default so that an unset flag falls through to the config file, and only
//! then to the defaults below. The defaults are written into each flag's help text, so
//! `narad serve --help` documents them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default listen address: loopback only, so a fresh daemon is not reachable from the network.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// Default largest record accepted by produce, in bytes (key + value + header names and values).
/// 1 MiB, the default and Kafka's `max.message.bytes` order of magnitude.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1024 * 1024;
/// Default largest HTTP request body, in bytes. 64 MiB leaves room for a batch of many records
/// (JSON and base64 inflate them) while bounding what one request can make the daemon buffer.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 64 * 1024 * 1024;
/// Default largest plugin upload (`POST /v1/plugins`), in bytes: 16 MiB, the default.
/// Routers built with the SDK are tens of KiB; the cap bounds what one upload makes the daemon
/// buffer and compile.
pub const DEFAULT_MAX_PLUGIN_BYTES: u64 = 16 * 1024 * 1024;
/// Default wall-clock deadline of one plugin call, in milliseconds: 100 ms, the routing
/// runtime's backstop behind the fuel budget.
pub const DEFAULT_PLUGIN_DEADLINE_MS: u64 = 100;
/// Default linear-memory limit of one plugin instance, in bytes: 64 MiB.
pub const DEFAULT_PLUGIN_MEMORY_BYTES: u64 = 64 * 1024 * 1024;
/// Default fuel per record of a plugin call: the routing runtime's own
/// (`FuelBudget::DEFAULT`).
pub const DEFAULT_PLUGIN_FUEL_PER_RECORD: u64 = narad_runtime::FuelBudget::DEFAULT.per_record;
/// Default fuel per input byte of a plugin call: the routing runtime's own
/// (`FuelBudget::DEFAULT`).
pub const DEFAULT_PLUGIN_FUEL_PER_INPUT_BYTE: u64 =
    narad_runtime::FuelBudget::DEFAULT.per_input_byte;
/// Default most functions a plugin module may define: the routing runtime's own (10,000;
/// the built-ins define 82 to 127). Checked before compiling, like the five below.
pub const DEFAULT_PLUGIN_MAX_FUNCTIONS: u32 = narad_runtime::limits::DEFAULT_MAX_FUNCTIONS;
/// Default largest plugin function body, in bytes: the runtime's own (128 KiB).
pub const DEFAULT_PLUGIN_MAX_FUNCTION_BYTES: u32 =
    narad_runtime::limits::DEFAULT_MAX_FUNCTION_BODY_BYTES;
/// Default largest plugin code section, in bytes: the runtime's own (4 MiB).
pub const DEFAULT_PLUGIN_MAX_CODE_BYTES: u64 = narad_runtime::limits::DEFAULT_MAX_CODE_BYTES;
/// Default most locals one plugin function may declare: the runtime's own (2,000).
pub const DEFAULT_PLUGIN_MAX_LOCALS: u32 = narad_runtime::limits::DEFAULT_MAX_LOCALS_PER_FUNCTION;
/// Default most types, imports, exports, globals, data and element segments and element items
/// (each) of a plugin module: the runtime's own (10,000).
pub const DEFAULT_PLUGIN_MAX_MODULE_ITEMS: u32 = narad_runtime::limits::DEFAULT_MAX_MODULE_ITEMS;
/// Default most bytes of a plugin module's data segments: the runtime's own (8 MiB).
pub const DEFAULT_PLUGIN_MAX_DATA_BYTES: u64 = narad_runtime::limits::DEFAULT_MAX_DATA_BYTES;
/// Default most records in one produce request.
pub const DEFAULT_MAX_BATCH_RECORDS: u32 = 10_000;
/// Default most records one fetch returns (a request's `max` is capped to this).
pub const DEFAULT_MAX_FETCH_RECORDS: u32 = 10_000;
/// Default most record bytes one fetch gathers, in bytes: 4 MiB, the engine's slab byte cap.
pub const DEFAULT_MAX_FETCH_BYTES: u64 = 4 * 1024 * 1024;
/// Default longest long-poll a fetch may ask for with `wait_ms`, in milliseconds (30 s, the
/// engine's longest metadata-bound sleep; a longer ask is capped, not rejected).
pub const DEFAULT_MAX_WAIT_MS: u64 = 30_000;
/// Default interval between retention passes, in milliseconds (30 s).
pub const DEFAULT_RETENTION_CHECK_INTERVAL_MS: u64 = 30_000;
/// Default idle time after which a partition log is closed, in milliseconds (5 min, the
/// storage crate's default).
pub const DEFAULT_IDLE_CLOSE_AFTER_MS: u64 = 5 * 60 * 1000;
/// Default wait before a failed partition is reopened on its next use, in milliseconds (10 s,
/// the storage crate's `DEFAULT_FAILED_REOPEN_AFTER`).
pub const DEFAULT_FAILED_REOPEN_AFTER_MS: u64 = 10 * 1000;
/// Default segment size at which a log rolls to a new segment file, in bytes (128 MiB, the
/// storage crate's default).
pub const DEFAULT_SEGMENT_BYTES: u64 = 128 * 1024 * 1024;
/// Default most request-body bytes buffered across all requests at once, in bytes: 256 MiB,
/// four bodies of the default max-request-bytes (64 MiB), so a few large produces run side by
/// side while the daemon's memory stays bounded whatever the number of clients.
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: u64 = 256 * 1024 * 1024;
/// Default time a client has to send a complete request head, in milliseconds: 10 s, far
/// above what any client on a working network needs, short enough that slow-header
/// (slowloris) connections do not pile up.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Default time a keep-alive connection may sit without a request in progress and without a
/// byte moving, in milliseconds: 5 s (Apache's `KeepAliveTimeout`); clients that come back
/// later open a new connection.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 5_000;
/// Default longest wait, after SIGTERM, for HTTP requests still in progress, in milliseconds:
/// 5 s. Long-polls end at once on shutdown, so only slow uploads and slow readers are cut;
/// far below systemd's 90 s stop timeout, which leaves room to close the store.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 5_000;

/// Errors turning flags, environment and config file into a [`Config`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file named by `--config` could not be read.
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("invalid config file {path}: {message}")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// The TOML parser's description, with line and column.
        message: String,
    },
    /// No data directory was given anywhere.
    #[error(
        "no data directory: pass --data-dir DIR, set NARAD_DATA_DIR, or set data-dir in the config file"
    )]
    MissingDataDir,
    /// The listen address does not parse as `IP:PORT`.
    #[error("invalid listen address {value:?}: expected IP:PORT, e.g. 127.0.0.1:7070")]
    BadListen {
        /// The value given.
        value: String,
    },
    /// The file named by `--auth-token-file` cannot be read or holds no token.
    #[error("invalid auth-token-file: {0}")]
    AuthToken(#[from] crate::api::auth::TokenFileError),
    /// A limit or interval is zero or otherwise out of range.
    #[error("invalid {key}: {message}")]
    BadValue {
        /// The config key (kebab-case, as in the file).
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// `narad serve` flags. Each is also read from its environment variable, then from the config
/// file (same name, kebab-case), then takes the default stated in its help.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML config file with any of the keys below in kebab-case (e.g. `data-dir = "/var/lib/narad"`).
    /// Unknown keys are an error.
    #[arg(long, env = "NARAD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory holding the metastore and the partition logs (created if missing). Required.
    #[arg(long, env = "NARAD_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address the HTTP API listens on. [default: 127.0.0.1:7070]
    #[arg(long, env = "NARAD_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Largest record produce accepts, in bytes: key + value + header names and values.
    /// [default: 1048576 (1 MiB)]
    #[arg(long, env = "NARAD_MAX_RECORD_BYTES", value_name = "BYTES")]
    pub max_record_bytes: Option<u64>,
    /// Largest HTTP request body, in bytes. [default: 67108864 (64 MiB)]
    #[arg(long, env = "NARAD_MAX_REQUEST_BYTES", value_name = "BYTES")]
    pub max_request_bytes: Option<u64>,
    /// Largest plugin module `POST /v1/plugins` accepts, in bytes (its own limit, not
    /// max-request-bytes). [default: 16777216 (16 MiB)]
    #[arg(long, env = "NARAD_MAX_PLUGIN_BYTES", value_name = "BYTES")]
    pub max_plugin_bytes: Option<u64>,
    /// Most records in one produce request. [default: 10000]
    #[arg(long, env = "NARAD_MAX_BATCH_RECORDS", value_name = "N")]
    pub max_batch_records: Option<u32>,
    /// Most records one fetch returns; a larger `max` is capped. [default: 10000]
    #[arg(long, env = "NARAD_MAX_FETCH_RECORDS", value_name = "N")]
    pub max_fetch_records: Option<u32>,
    /// Most record bytes one fetch gathers (at least one record is always returned).
    /// [default: 4194304 (4 MiB)]
    #[arg(long, env = "NARAD_MAX_FETCH_BYTES", value_name = "BYTES")]
    pub max_fetch_bytes: Option<u64>,
    /// Longest long-poll a fetch may ask for with `wait_ms`; a longer ask is capped.
    /// [default: 30000]
    #[arg(long, env = "NARAD_MAX_WAIT_MS", value_name = "MS")]
    pub max_wait_ms: Option<u64>,
    /// Interval between retention passes, in milliseconds. [default: 30000]
    #[arg(long, env = "NARAD_RETENTION_CHECK_INTERVAL_MS", value_name = "MS")]
    pub retention_check_interval_ms: Option<u64>,
    /// A partition log unused for this long is closed (and reopened on demand), in
    /// milliseconds. [default: 300000 (5 min)]
    #[arg(long, env = "NARAD_IDLE_CLOSE_AFTER_MS", value_name = "MS")]
    pub idle_close_after_ms: Option<u64>,
    /// A partition that failed (its disk refused a write or a sync) is reopened, with the same
    /// recovery as a restart, on its first use this long after failing, in milliseconds.
    /// [default: 10000]
    #[arg(long, env = "NARAD_FAILED_REOPEN_AFTER_MS", value_name = "MS")]
    pub failed_reopen_after_ms: Option<u64>,
    /// Segment size at which a partition log rolls to a new file, in bytes.
    /// [default: 134217728 (128 MiB)]
    #[arg(long, env = "NARAD_SEGMENT_BYTES", value_name = "BYTES")]
    pub segment_bytes: Option<u64>,
    /// Wall-clock deadline of one routing-plugin call, in milliseconds: a backstop behind the
    /// per-slab fuel budget; a call over it fails the slab (the cursor stalls and retries).
    /// [default: 100]
    #[arg(long, env = "NARAD_PLUGIN_DEADLINE_MS", value_name = "MS")]
    pub plugin_deadline_ms: Option<u64>,
    /// Linear-memory limit of one routing-plugin instance, in bytes; growing past it traps.
    /// [default: 67108864 (64 MiB)]
    #[arg(long, env = "NARAD_PLUGIN_MEMORY_BYTES", value_name = "BYTES")]
    pub plugin_memory_bytes: Option<u64>,
    /// Fuel (about one unit per Wasm instruction) a plugin call gets per record handed in, on
    /// top of a fixed 5,000,000 per call. Raise it for plugins that do heavy work per record;
    /// the budget depends only on the slab, so a slab that runs out fails the same way on
    /// every retry. [default: 2000]
    #[arg(long, env = "NARAD_PLUGIN_FUEL_PER_RECORD", value_name = "UNITS")]
    pub plugin_fuel_per_record: Option<u64>,
    /// Fuel a plugin call gets per byte of input (keys, and headers or values when the plugin
    /// asks for them): raise it for plugins that scan payloads. [default: 20]
    #[arg(long, env = "NARAD_PLUGIN_FUEL_PER_INPUT_BYTE", value_name = "UNITS")]
    pub plugin_fuel_per_input_byte: Option<u64>,
    /// Most functions a plugin module may define. A module over this or any of the five
    /// limits below is refused before it is compiled (400, reason `module_limit`), at deploy
    /// and when a stored module is loaded. [default: 10000]
    #[arg(long, env = "NARAD_PLUGIN_MAX_FUNCTIONS", value_name = "N")]
    pub plugin_max_functions: Option<u32>,
    /// Largest function body in a plugin module, in bytes. [default: 131072 (128 KiB)]
    #[arg(long, env = "NARAD_PLUGIN_MAX_FUNCTION_BYTES", value_name = "BYTES")]
    pub plugin_max_function_bytes: Option<u32>,
    /// Largest code section of a plugin module, in bytes. [default: 4194304 (4 MiB)]
    #[arg(long, env = "NARAD_PLUGIN_MAX_CODE_BYTES", value_name = "BYTES")]
    pub plugin_max_code_bytes: Option<u64>,
    /// Most locals one plugin function may declare. [default: 2000]
    #[arg(long, env = "NARAD_PLUGIN_MAX_LOCALS", value_name = "N")]
    pub plugin_max_locals: Option<u32>,
    /// Most types, imports, exports, globals, data segments, element segments and element
    /// items a plugin module may have, each counted on its own. [default: 10000]
    #[arg(long, env = "NARAD_PLUGIN_MAX_MODULE_ITEMS", value_name = "N")]
    pub plugin_max_module_items: Option<u32>,
    /// Most bytes of a plugin module's data segments together. [default: 8388608 (8 MiB)]
    #[arg(long, env = "NARAD_PLUGIN_MAX_DATA_BYTES", value_name = "BYTES")]
    pub plugin_max_data_bytes: Option<u64>,
    /// File holding a bearer token; when set, every mutating request (POST, PUT, PATCH,
    /// DELETE) must send `Authorization: Bearer <token>` (401 otherwise). Reads stay open.
    /// [default: none, no token required]
    #[arg(long, env = "NARAD_AUTH_TOKEN_FILE", value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Most request-body bytes buffered across all requests at once; a request that does not
    /// fit now gets 503 with `Retry-After`, one larger than this alone gets 413.
    /// [default: 268435456 (256 MiB)]
    #[arg(long, env = "NARAD_MAX_BUFFERED_REQUEST_BYTES", value_name = "BYTES")]
    pub max_buffered_request_bytes: Option<u64>,
    /// Most HTTP connections open at once; a connection over it is answered 503 and closed.
    /// [default: derived from the descriptor limit: (limit - 1024) / 2, between 64 and 16384]
    #[arg(long, env = "NARAD_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<u32>,
    /// Time a client has to send a complete request head, counted from the connection's
    /// start or the end of the previous answer; slower connections are closed.
    /// [default: 10000]
    #[arg(long, env = "NARAD_HEADER_READ_TIMEOUT_MS", value_name = "MS")]
    pub header_read_timeout_ms: Option<u64>,
    /// A connection with no request in progress and no byte moving for this long is closed.
    /// [default: 5000]
    #[arg(long, env = "NARAD_IDLE_TIMEOUT_MS", value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// On SIGTERM/SIGINT, longest wait for requests in progress before their connections are
    /// dropped; then the store closes and the daemon exits. [default: 5000]
    #[arg(long, env = "NARAD_SHUTDOWN_GRACE_MS", value_name = "MS")]
    pub shutdown_grace_ms: Option<u64>,
}

/// The config file's schema: the same settings as [`ServeArgs`], kebab-case, all optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileConfig {
    /// See `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// See `--listen`.
    pub listen: Option<String>,
    /// See `--max-record-bytes`.
    pub max_record_bytes: Option<u64>,
    /// See `--max-request-bytes`.
    pub max_request_bytes: Option<u64>,
    /// See `--max-plugin-bytes`.
    pub max_plugin_bytes: Option<u64>,
    /// See `--max-batch-records`.
    pub max_batch_records: Option<u32>,
    /// See `--max-fetch-records`.
    pub max_fetch_records: Option<u32>,
    /// See `--max-fetch-bytes`.
    pub max_fetch_bytes: Option<u64>,
    /// See `--max-wait-ms`.
    pub max_wait_ms: Option<u64>,
    /// See `--retention-check-interval-ms`.
    pub retention_check_interval_ms: Option<u64>,
    /// See `--idle-close-after-ms`.
    pub idle_close_after_ms: Option<u64>,
    /// See `--failed-reopen-after-ms`.
    pub failed_reopen_after_ms: Option<u64>,
    /// See `--segment-bytes`.
    pub segment_bytes: Option<u64>,
    /// See `--plugin-deadline-ms`.
    pub plugin_deadline_ms: Option<u64>,
    /// See `--plugin-memory-bytes`.
    pub plugin_memory_bytes: Option<u64>,
    /// See `--plugin-fuel-per-record`.
    pub plugin_fuel_per_record: Option<u64>,
    /// See `--plugin-fuel-per-input-byte`.
    pub plugin_fuel_per_input_byte: Option<u64>,
    /// See `--plugin-max-functions`.
    pub plugin_max_functions: Option<u32>,
    /// See `--plugin-max-function-bytes`.
    pub plugin_max_function_bytes: Option<u32>,
    /// See `--plugin-max-code-bytes`.
    pub plugin_max_code_bytes: Option<u64>,
    /// See `--plugin-max-locals`.
    pub plugin_max_locals: Option<u32>,
    /// See `--plugin-max-module-items`.
    pub plugin_max_module_items: Option<u32>,
    /// See `--plugin-max-data-bytes`.
    pub plugin_max_data_bytes: Option<u64>,
    /// See `--auth-token-file`.
    pub auth_token_file: Option<PathBuf>,
    /// See `--max-buffered-request-bytes`.
    pub max_buffered_request_bytes: Option<u64>,
    /// See `--max-connections`.
    pub max_connections: Option<u32>,
    /// See `--header-read-timeout-ms`.
    pub header_read_timeout_ms: Option<u64>,
    /// See `--idle-timeout-ms`.
    pub idle_timeout_ms: Option<u64>,
    /// See `--shutdown-grace-ms`.
    pub shutdown_grace_ms: Option<u64>,
}

impl FileConfig {
    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        FileConfig::parse(path, &text)
    }

    /// Parses config-file text; `path` only names the file in errors.
    pub fn parse(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::ParseFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }
}

/// Request and record limits the API enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest record (key + value + header names and values), in bytes.
    pub max_record_bytes: u64,
    /// Largest request body, in bytes.
    pub max_request_bytes: u64,
    /// Largest plugin upload, in bytes.
    pub max_plugin_bytes: u64,
    /// Most records per produce request.
    pub max_batch_records: u32,
    /// Most records per fetch.
    pub max_fetch_records: u32,
    /// Most record bytes per fetch.
    pub max_fetch_bytes: u64,
    /// Longest long-poll.
    pub max_wait: Duration,
    /// Most request-body bytes buffered across all requests at once.
    pub max_buffered_request_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_plugin_bytes: DEFAULT_MAX_PLUGIN_BYTES,
            max_batch_records: DEFAULT_MAX_BATCH_RECORDS,
            max_fetch_records: DEFAULT_MAX_FETCH_RECORDS,
            max_fetch_bytes: DEFAULT_MAX_FETCH_BYTES,
            max_wait: Duration::from_millis(DEFAULT_MAX_WAIT_MS),
            max_buffered_request_bytes: DEFAULT_MAX_BUFFERED_REQUEST_BYTES,
        }
    }
}

/// How the HTTP server treats connections (see `http_server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most connections open at once; `None`: derived from the descriptor limit at start.
    pub max_connections: Option<u32>,
    /// Time to receive a complete request head.
    pub header_read_timeout: Duration,
    /// Time a connection may sit with nothing in progress and no byte moving.
    pub idle_timeout: Duration,
    /// Longest wait for requests in progress at shutdown.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            max_connections: None,
            header_read_timeout: Duration::from_millis(DEFAULT_HEADER_READ_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            shutdown_grace: Duration::from_millis(DEFAULT_SHUTDOWN_GRACE_MS),
        }
    }
}

/// The daemon's resolved configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Data directory (metastore file, partition logs, lock file).
    pub data_dir: PathBuf,
    /// HTTP listen address; port 0 picks a free port (tests).
    pub listen: SocketAddr,
    /// API limits.
    pub limits: Limits,
    /// Interval between retention passes.
    pub retention_check_interval: Duration,
    /// Idle time after which a partition log is closed.
    pub idle_close_after: Duration,
    /// Wait before a failed partition is reopened on its next use.
    pub failed_reopen_after: Duration,
    /// Segment roll size in bytes.
    pub segment_bytes: u64,
    /// The bearer token mutating requests must carry; `None`: no token required.
    pub auth_token: Option<crate::api::auth::AuthToken>,
    /// Limits of every routing-plugin call and instance.
    pub plugin_limits: narad_runtime::Limits,
    /// Connection cap and timeouts of the HTTP server.
    pub http: HttpLimits,
}

impl Config {
    /// A configuration with every default, for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            data_dir: data_dir.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            limits: Limits::default(),
            retention_check_interval: Duration::from_millis(DEFAULT_RETENTION_CHECK_INTERVAL_MS),
            idle_close_after: Duration::from_millis(DEFAULT_IDLE_CLOSE_AFTER_MS),
            failed_reopen_after: Duration::from_millis(DEFAULT_FAILED_REOPEN_AFTER_MS),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            auth_token: None,
            plugin_limits: narad_runtime::Limits::default(),
            http: HttpLimits::default(),
        }
    }

    /// Resolves flags/environment (already merged by clap in `args`) over the config file named
    /// by `args.config` (if any) over the defaults.
    pub fn resolve(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        Config::merge(args, &file)
    }

    /// Merges `args` over `file` over the defaults and validates the result.
    pub fn merge(args: &ServeArgs, file: &FileConfig) -> Result<Config, ConfigError> {
        let data_dir = args
            .data_dir
            .clone()
            .or_else(|| file.data_dir.clone())
            .ok_or(ConfigError::MissingDataDir)?;
        let listen_text = args
            .listen
            .clone()
            .or_else(|| file.listen.clone())
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen: SocketAddr = listen_text.parse().map_err(|_| ConfigError::BadListen {
            value: listen_text.clone(),
        })?;

        let limits = Limits {
            max_record_bytes: positive(
                "max-record-bytes",
                args.max_record_bytes.or(file.max_record_bytes),
                DEFAULT_MAX_RECORD_BYTES,
            )?,
            max_request_bytes: positive(
                "max-request-bytes",
                args.max_request_bytes.or(file.max_request_bytes),
                DEFAULT_MAX_REQUEST_BYTES,
            )?,
            max_plugin_bytes: positive(
                "max-plugin-bytes",
                args.max_plugin_bytes.or(file.max_plugin_bytes),
                DEFAULT_MAX_PLUGIN_BYTES,
            )?,
            max_batch_records: positive(
                "max-batch-records",
                args.max_batch_records.or(file.max_batch_records),
                DEFAULT_MAX_BATCH_RECORDS,
            )?,
            max_fetch_records: positive(
                "max-fetch-records",
                args.max_fetch_records.or(file.max_fetch_records),
                DEFAULT_MAX_FETCH_RECORDS,
            )?,
            max_fetch_bytes: positive(
                "max-fetch-bytes",
                args.max_fetch_bytes.or(file.max_fetch_bytes),
                DEFAULT_MAX_FETCH_BYTES,
            )?,
            max_wait: Duration::from_millis(
                args.max_wait_ms
                    .or(file.max_wait_ms)
                    .unwrap_or(DEFAULT_MAX_WAIT_MS),
            ),
            max_buffered_request_bytes: positive(
                "max-buffered-request-bytes",
                args.max_buffered_request_bytes
                    .or(file.max_buffered_request_bytes),
                DEFAULT_MAX_BUFFERED_REQUEST_BYTES,
            )?,
        };
        let http = HttpLimits {
            max_connections: args
                .max_connections
                .or(file.max_connections)
                .map(|n| positive("max-connections", Some(n), 1))
                .transpose()?,
            header_read_timeout: Duration::from_millis(positive(
                "header-read-timeout-ms",
                args.header_read_timeout_ms.or(file.header_read_timeout_ms),
                DEFAULT_HEADER_READ_TIMEOUT_MS,
            )?),
            idle_timeout: Duration::from_millis(positive(
                "idle-timeout-ms",
                args.idle_timeout_ms.or(file.idle_timeout_ms),
                DEFAULT_IDLE_TIMEOUT_MS,
            )?),
            shutdown_grace: Duration::from_millis(positive(
                "shutdown-grace-ms",
                args.shutdown_grace_ms.or(file.shutdown_grace_ms),
                DEFAULT_SHUTDOWN_GRACE_MS,
            )?),
        };
        if limits.max_record_bytes > limits.max_request_bytes {
            return Err(ConfigError::BadValue {
                key: "max-record-bytes",
                message: format!(
                    "{} is larger than max-request-bytes ({}): no request could carry such a record",
                    limits.max_record_bytes, limits.max_request_bytes
                ),
            });
        }
        let retention_check_interval = Duration::from_millis(positive(
            "retention-check-interval-ms",
            args.retention_check_interval_ms
                .or(file.retention_check_interval_ms),
            DEFAULT_RETENTION_CHECK_INTERVAL_MS,
        )?);
        let idle_close_after = Duration::from_millis(positive(
            "idle-close-after-ms",
            args.idle_close_after_ms.or(file.idle_close_after_ms),
            DEFAULT_IDLE_CLOSE_AFTER_MS,
        )?);
        let failed_reopen_after = Duration::from_millis(positive(
            "failed-reopen-after-ms",
            args.failed_reopen_after_ms.or(file.failed_reopen_after_ms),
            DEFAULT_FAILED_REOPEN_AFTER_MS,
        )?);
        let segment_bytes = positive(
            "segment-bytes",
            args.segment_bytes.or(file.segment_bytes),
            DEFAULT_SEGMENT_BYTES,
        )?;
        let auth_token = args
            .auth_token_file
            .as_ref()
            .or(file.auth_token_file.as_ref())
            .map(|path| crate::api::auth::AuthToken::from_file(path))
            .transpose()?;
        let plugin_limits = narad_runtime::Limits {
            deadline: Duration::from_millis(positive(
                "plugin-deadline-ms",
                args.plugin_deadline_ms.or(file.plugin_deadline_ms),
                DEFAULT_PLUGIN_DEADLINE_MS,
            )?),
            memory_bytes: positive(
                "plugin-memory-bytes",
                args.plugin_memory_bytes.or(file.plugin_memory_bytes),
                DEFAULT_PLUGIN_MEMORY_BYTES,
            )?,
            fuel: narad_runtime::FuelBudget {
                per_record: positive(
                    "plugin-fuel-per-record",
                    args.plugin_fuel_per_record.or(file.plugin_fuel_per_record),
                    DEFAULT_PLUGIN_FUEL_PER_RECORD,
                )?,
                per_input_byte: args
                    .plugin_fuel_per_input_byte
                    .or(file.plugin_fuel_per_input_byte)
                    .unwrap_or(DEFAULT_PLUGIN_FUEL_PER_INPUT_BYTE),
                ..narad_runtime::FuelBudget::DEFAULT
            },
            module: narad_runtime::ModuleLimits {
                max_functions: positive(
                    "plugin-max-functions",
                    args.plugin_max_functions.or(file.plugin_max_functions),
                    DEFAULT_PLUGIN_MAX_FUNCTIONS,
                )?,
                max_function_body_bytes: positive(
                    "plugin-max-function-bytes",
                    args.plugin_max_function_bytes
                        .or(file.plugin_max_function_bytes),
                    DEFAULT_PLUGIN_MAX_FUNCTION_BYTES,
                )?,
                max_code_bytes: positive(
                    "plugin-max-code-bytes",
                    args.plugin_max_code_bytes.or(file.plugin_max_code_bytes),
                    DEFAULT_PLUGIN_MAX_CODE_BYTES,
                )?,
                max_locals_per_function: positive(
                    "plugin-max-locals",
                    args.plugin_max_locals.or(file.plugin_max_locals),
                    DEFAULT_PLUGIN_MAX_LOCALS,
                )?,
                max_items: positive(
                    "plugin-max-module-items",
                    args.plugin_max_module_items
                        .or(file.plugin_max_module_items),
                    DEFAULT_PLUGIN_MAX_MODULE_ITEMS,
                )?,
                max_data_bytes: positive(
                    "plugin-max-data-bytes",
                    args.plugin_max_data_bytes.or(file.plugin_max_data_bytes),
                    DEFAULT_PLUGIN_MAX_DATA_BYTES,
                )?,
            },
            ..narad_runtime::Limits::default()
        };
        Ok(Config {
            data_dir,
            listen,
            limits,
            retention_check_interval,
            idle_close_after,
            failed_reopen_after,
            segment_bytes,
            auth_token,
            plugin_limits,
            http,
        })
    }
}

/// `value` or `default`, refusing zero (a zero limit or interval is always a mistake).
fn positive<T>(key: &'static str, value: Option<T>, default: T) -> Result<T, ConfigError>
where
    T: PartialEq + Default + std::fmt::Display,
{
    let v = value.unwrap_or(default);
    if v == T::default() {
        return Err(ConfigError::BadValue {
            key,
            message: "must be greater than 0".to_owned(),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_beats_file_and_file_beats_default() {
        let file = FileConfig::parse(
            Path::new("narad.toml"),
            "data-dir = \"/from/file\"\nlisten = \"127.0.0.1:9000\"\nmax-record-bytes = 2048\n",
        )
        .unwrap();
        let args = ServeArgs {
            listen: Some("127.0.0.1:9100".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &file).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/from/file"));
        assert_eq!(config.listen, "127.0.0.1:9100".parse().unwrap());
        assert_eq!(config.limits.max_record_bytes, 2048);
        assert_eq!(config.limits.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
    }

    #[test]
    fn listen_defaults_to_loopback_7070() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(config.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(config, Config::new("/d"));
    }

    #[test]
    fn unknown_config_file_key_is_an_error() {
        let err = FileConfig::parse(Path::new("narad.toml"), "data_dir = \"/x\"\n").unwrap_err();
        assert!(matches!(err, ConfigError::ParseFile { .. }));
    }

    #[test]
    fn missing_data_dir_is_an_error() {
        let err = Config::merge(&ServeArgs::default(), &FileConfig::default()).unwrap_err();
        assert!(matches!(err, ConfigError::MissingDataDir));
    }

    #[test]
    fn zero_limit_is_refused() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            max_batch_records: Some(0),
            ..ServeArgs::default()
        };
        let err = Config::merge(&args, &FileConfig::default()).unwrap_err();
        assert!(matches!(
            err,
            ConfigError::BadValue {
                key: "max-batch-records",
                ..
            }
        ));
    }

    #[test]
    fn plugin_limits_default_to_the_runtimes_and_flags_win_over_the_file() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        // The documented defaults are the runtime's own.
        assert_eq!(config.plugin_limits, narad_runtime::Limits::default());
        assert_eq!(
            config.plugin_limits.deadline,
            Duration::from_millis(DEFAULT_PLUGIN_DEADLINE_MS)
        );
        assert_eq!(
            config.plugin_limits.memory_bytes,
            DEFAULT_PLUGIN_MEMORY_BYTES
        );
        let file = FileConfig::parse(
            Path::new("narad.toml"),
            "plugin-deadline-ms = 250\nplugin-memory-bytes = 1048576\n",
        )
        .unwrap();
        let config = Config::merge(&args, &file).unwrap();
        assert_eq!(config.plugin_limits.deadline, Duration::from_millis(250));
        assert_eq!(config.plugin_limits.memory_bytes, 1_048_576);
        let flags = ServeArgs {
            plugin_deadline_ms: Some(20),
            ..args.clone()
        };
        let config = Config::merge(&flags, &file).unwrap();
        assert_eq!(config.plugin_limits.deadline, Duration::from_millis(20));
        let zero = ServeArgs {
            plugin_memory_bytes: Some(0),
            ..args
        };
        assert!(Config::merge(&zero, &FileConfig::default()).is_err());
    }

    #[test]
    fn plugin_module_limits_default_to_the_runtimes_and_come_from_flags_or_the_file() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(
            config.plugin_limits.module,
            narad_runtime::ModuleLimits::DEFAULT
        );
        let file = FileConfig::parse(
            Path::new("narad.toml"),
            "plugin-max-functions = 50000\nplugin-max-function-bytes = 1048576\n\
             plugin-max-code-bytes = 33554432\nplugin-max-locals = 9000\n\
             plugin-max-module-items = 20000\nplugin-max-data-bytes = 1024\n",
        )
        .unwrap();
        let module = Config::merge(&args, &file).unwrap().plugin_limits.module;
        assert_eq!(
            module,
            narad_runtime::ModuleLimits {
                max_functions: 50_000,
                max_function_body_bytes: 1_048_576,
                max_code_bytes: 33_554_432,
                max_locals_per_function: 9_000,
                max_items: 20_000,
                max_data_bytes: 1024,
            }
        );
        let flags = ServeArgs {
            plugin_max_functions: Some(70_000),
            ..args.clone()
        };
        let module = Config::merge(&flags, &file).unwrap().plugin_limits.module;
        assert_eq!(module.max_functions, 70_000);
        let zero = ServeArgs {
            plugin_max_code_bytes: Some(0),
            ..args
        };
        assert!(matches!(
            Config::merge(&zero, &FileConfig::default()),
            Err(ConfigError::BadValue {
                key: "plugin-max-code-bytes",
                ..
            })
        ));
    }

    #[test]
    fn plugin_fuel_terms_default_to_the_runtimes_and_come_from_flags_or_the_file() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(
            config.plugin_limits.fuel,
            narad_runtime::FuelBudget::DEFAULT
        );
        assert_eq!(
            config.plugin_limits.fuel.per_record,
            DEFAULT_PLUGIN_FUEL_PER_RECORD
        );
        let file = FileConfig::parse(
            Path::new("narad.toml"),
            "plugin-fuel-per-record = 50000\nplugin-fuel-per-input-byte = 0\n",
        )
        .unwrap();
        let config = Config::merge(&args, &file).unwrap();
        assert_eq!(config.plugin_limits.fuel.per_record, 50_000);
        // Zero per byte is allowed: the per-record and fixed terms still bound a call.
        assert_eq!(config.plugin_limits.fuel.per_input_byte, 0);
        assert_eq!(
            config.plugin_limits.fuel.base,
            narad_runtime::FuelBudget::DEFAULT.base
        );
        let flags = ServeArgs {
            plugin_fuel_per_record: Some(7),
            ..args.clone()
        };
        let config = Config::merge(&flags, &file).unwrap();
        assert_eq!(config.plugin_limits.fuel.per_record, 7);
        let zero = ServeArgs {
            plugin_fuel_per_record: Some(0),
            ..args
        };
        assert!(Config::merge(&zero, &FileConfig::default()).is_err());
    }

    #[test]
    fn max_plugin_bytes_defaults_to_16_mib_and_is_read_from_the_file() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(config.limits.max_plugin_bytes, 16 * 1024 * 1024);
        let file = FileConfig::parse(Path::new("narad.toml"), "max-plugin-bytes = 4096\n").unwrap();
        let config = Config::merge(&args, &file).unwrap();
        assert_eq!(config.limits.max_plugin_bytes, 4096);
    }

    #[test]
    fn auth_token_file_is_read_from_the_flag_or_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let token_path = dir.path().join("token");
        std::fs::write(&token_path, "t0ken\n").unwrap();
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        assert!(
            Config::merge(&args, &FileConfig::default())
                .unwrap()
                .auth_token
                .is_none()
        );
        let file = FileConfig::parse(
            Path::new("narad.toml"),
            &format!("auth-token-file = {:?}\n", token_path.display().to_string()),
        )
        .unwrap();
        let config = Config::merge(&args, &file).unwrap();
        assert!(config.auth_token.unwrap().matches("t0ken"));
        let missing = ServeArgs {
            auth_token_file: Some(dir.path().join("nope")),
            ..args
        };
        let err = Config::merge(&missing, &FileConfig::default()).unwrap_err();
        assert!(matches!(err, ConfigError::AuthToken(_)));
    }

    #[test]
    fn http_limits_and_the_body_budget_default_and_are_read_from_flags_or_the_file() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(config.http, HttpLimits::default());
        assert_eq!(config.http.max_connections, None);
        assert_eq!(
            config.limits.max_buffered_request_bytes,
            DEFAULT_MAX_BUFFERED_REQUEST_BYTES
        );
        let file = FileConfig::parse(
            Path::new("narad.toml"),
            "max-buffered-request-bytes = 8388608\nmax-connections = 50\n\
             header-read-timeout-ms = 1000\nidle-timeout-ms = 2000\nshutdown-grace-ms = 3000\n",
        )
        .unwrap();
        let config = Config::merge(&args, &file).unwrap();
        assert_eq!(config.limits.max_buffered_request_bytes, 8_388_608);
        assert_eq!(
            config.http,
            HttpLimits {
                max_connections: Some(50),
                header_read_timeout: Duration::from_millis(1000),
                idle_timeout: Duration::from_millis(2000),
                shutdown_grace: Duration::from_millis(3000),
            }
        );
        let flags = ServeArgs {
            max_connections: Some(7),
            ..args.clone()
        };
        assert_eq!(
            Config::merge(&flags, &file).unwrap().http.max_connections,
            Some(7)
        );
        for zero in [
            ServeArgs {
                max_connections: Some(0),
                ..args.clone()
            },
            ServeArgs {
                idle_timeout_ms: Some(0),
                ..args.clone()
            },
            ServeArgs {
                max_buffered_request_bytes: Some(0),
                ..args.clone()
            },
        ] {
            assert!(Config::merge(&zero, &FileConfig::default()).is_err());
        }
    }

    #[test]
    fn bad_listen_address_is_an_error() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            listen: Some("localhost".into()),
            ..ServeArgs::default()
        };
        let err = Config::merge(&args, &FileConfig::default()).unwrap_err();
        assert!(matches!(err, ConfigError::BadListen { .. }));
    }
}
