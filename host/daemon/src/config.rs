//! Daemon configuration: `narad serve` flags, their environment variables, and the TOML config
//! file, merged with the precedence flag > environment > file > built-in default.
//!
//! clap resolves "flag, else environment" itself (every flag names its `NARAD_*` variable); the
//! flags carry no clap default so that an unset flag falls through to the config file, and only
//! then to the defaults below.
//!
//! Each setting is written once, as one line of the `settings!` table: its doc, type, check
//! and default. The table generates the flag (`--name`, `NARAD_NAME`, help ending in the
//! default), the config-file key and the merge, so the three cannot disagree; only the mapping
//! into [`Config`]'s shape is written by hand, and a setting the mapping forgets is an unused
//! field (a warning, an error under clippy's `-D warnings`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default listen address: loopback only, so a fresh daemon is not reachable from the network.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7070";

/// Default cluster name (`--cluster`): keys live under `/narad/narad/`.
pub(crate) const DEFAULT_CLUSTER: &str = "narad";

/// Default lease time-to-live of a node's registration: 10 s (CLUSTER.md).
pub(crate) const DEFAULT_LEASE_TTL_MS: u64 = 10_000;
/// Default largest record accepted by produce, in bytes (key + value + header names and values).
/// 1 MiB, the default and Kafka's `max.message.bytes` order of magnitude.
pub(crate) const DEFAULT_MAX_RECORD_BYTES: u64 = 1024 * 1024;
/// Default largest HTTP request body, in bytes. 64 MiB leaves room for a batch of many records
/// (JSON and base64 inflate them) while bounding what one request can make the daemon buffer.
pub(crate) const DEFAULT_MAX_REQUEST_BYTES: u64 = 64 * 1024 * 1024;
/// Default largest plugin upload (`POST /v1/plugins`), in bytes: 16 MiB, the default.
/// Routers built with the SDK are tens of KiB; the cap bounds what one upload makes the daemon
/// buffer and compile.
pub(crate) const DEFAULT_MAX_PLUGIN_BYTES: u64 = 16 * 1024 * 1024;
/// Default wall-clock deadline of one plugin call, in milliseconds: 100 ms, the routing
/// runtime's backstop behind the fuel budget.
pub(crate) const DEFAULT_PLUGIN_DEADLINE_MS: u64 = 100;
/// Default linear-memory limit of one plugin instance, in bytes: 64 MiB.
pub(crate) const DEFAULT_PLUGIN_MEMORY_BYTES: u64 = 64 * 1024 * 1024;
/// Default fuel per record of a plugin call: the routing runtime's own
/// (`FuelBudget::DEFAULT`).
pub(crate) const DEFAULT_PLUGIN_FUEL_PER_RECORD: u64 =
    narad_runtime::FuelBudget::DEFAULT.per_record;
/// Default fuel per input byte of a plugin call: the routing runtime's own
/// (`FuelBudget::DEFAULT`).
pub(crate) const DEFAULT_PLUGIN_FUEL_PER_INPUT_BYTE: u64 =
    narad_runtime::FuelBudget::DEFAULT.per_input_byte;
/// Default most functions a plugin module may define: the routing runtime's own (10,000;
/// the built-ins define 82 to 127). Checked before compiling, like the five below.
pub(crate) const DEFAULT_PLUGIN_MAX_FUNCTIONS: u32 = narad_runtime::limits::DEFAULT_MAX_FUNCTIONS;
/// Default largest plugin function body, in bytes: the runtime's own (128 KiB).
pub(crate) const DEFAULT_PLUGIN_MAX_FUNCTION_BYTES: u32 =
    narad_runtime::limits::DEFAULT_MAX_FUNCTION_BODY_BYTES;
/// Default largest plugin code section, in bytes: the runtime's own (4 MiB).
pub(crate) const DEFAULT_PLUGIN_MAX_CODE_BYTES: u64 = narad_runtime::limits::DEFAULT_MAX_CODE_BYTES;
/// Default most locals one plugin function may declare: the runtime's own (2,000).
pub(crate) const DEFAULT_PLUGIN_MAX_LOCALS: u32 =
    narad_runtime::limits::DEFAULT_MAX_LOCALS_PER_FUNCTION;
/// Default most types, imports, exports, globals, data and element segments and element items
/// (each) of a plugin module: the runtime's own (10,000).
pub(crate) const DEFAULT_PLUGIN_MAX_MODULE_ITEMS: u32 =
    narad_runtime::limits::DEFAULT_MAX_MODULE_ITEMS;
/// Default most bytes of a plugin module's data segments: the runtime's own (8 MiB).
pub(crate) const DEFAULT_PLUGIN_MAX_DATA_BYTES: u64 = narad_runtime::limits::DEFAULT_MAX_DATA_BYTES;
/// Default most records in one produce request.
pub(crate) const DEFAULT_MAX_BATCH_RECORDS: u32 = 10_000;
/// Default most records one fetch returns (a request's `max` is capped to this).
pub(crate) const DEFAULT_MAX_FETCH_RECORDS: u32 = 10_000;
/// Default most record bytes one fetch gathers, in bytes: 4 MiB, the engine's slab byte cap.
pub(crate) const DEFAULT_MAX_FETCH_BYTES: u64 = 4 * 1024 * 1024;
/// Default longest long-poll a fetch may ask for with `wait_ms`, in milliseconds (30 s, the
/// engine's longest metadata-bound sleep; a longer ask is capped, not rejected).
pub(crate) const DEFAULT_MAX_WAIT_MS: u64 = 30_000;
/// Default interval between retention passes, in milliseconds (30 s).
pub(crate) const DEFAULT_RETENTION_CHECK_INTERVAL_MS: u64 = 30_000;
/// Default idle time after which a partition log is closed, in milliseconds (5 min, the
/// storage crate's default).
pub(crate) const DEFAULT_IDLE_CLOSE_AFTER_MS: u64 = 5 * 60 * 1000;
/// Default `--group-initial-rebalance-delay-ms`: 3 s, Kafka's.
pub(crate) const DEFAULT_GROUP_INITIAL_REBALANCE_DELAY_MS: u64 = 3_000;
/// Default `--group-offsets-retention-ms`: 7 days, Kafka's.
pub(crate) const DEFAULT_GROUP_OFFSETS_RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;
/// Default wait before a failed partition is reopened on its next use, in milliseconds (10 s,
/// the storage crate's `DEFAULT_FAILED_REOPEN_AFTER`).
pub(crate) const DEFAULT_FAILED_REOPEN_AFTER_MS: u64 = 10 * 1000;
/// Default segment size at which a log rolls to a new segment file, in bytes (128 MiB, the
/// storage crate's default).
pub(crate) const DEFAULT_SEGMENT_BYTES: u64 = 128 * 1024 * 1024;
/// Default most request-body bytes buffered across all requests at once, in bytes: 256 MiB,
/// four bodies of the default max-request-bytes (64 MiB), so a few large produces run side by
/// side while the daemon's memory stays bounded whatever the number of clients.
pub(crate) const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: u64 = 256 * 1024 * 1024;
/// Default of `max-buffered-peer-request-bytes`: the bodies of other nodes' calls held at once.
pub(crate) const DEFAULT_MAX_BUFFERED_PEER_REQUEST_BYTES: u64 = 256 * 1024 * 1024;
/// Least `max-buffered-peer-request-bytes`: two of the largest call a node sends (a frames
/// call of two slabs' buckets), so that one always fits once the other is answered. Written
/// out because the wire's constants sit above this layer; `cluster::commit_wire` fails to
/// build if they stop matching.
pub(crate) const MIN_BUFFERED_PEER_REQUEST_BYTES: u64 = 17_833_992;
/// Default time a client has to send a complete request head, in milliseconds: 10 s, far
/// above what any client on a working network needs, short enough that slow-header
/// (slowloris) connections do not pile up.
pub(crate) const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Default time a keep-alive connection may sit without a request in progress and without a
/// byte moving, in milliseconds: 5 s (Apache's `KeepAliveTimeout`); clients that come back
/// later open a new connection.
pub(crate) const DEFAULT_IDLE_TIMEOUT_MS: u64 = 5_000;
/// Default longest wait, after SIGTERM, for HTTP requests still in progress, in milliseconds:
/// 5 s. Long-polls end at once on shutdown, so only slow uploads and slow readers are cut;
/// far below systemd's 90 s stop timeout, which leaves room to close the store.
pub(crate) const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 5_000;

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
    AuthToken(#[from] crate::auth::TokenFileError),
    /// A limit or interval is zero or otherwise out of range.
    #[error("invalid {key}: {message}")]
    BadValue {
        /// The config key (kebab-case, as in the file).
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// Declares every `narad serve` setting once, and generates from that one table the clap flags
/// ([`ServeArgs`], each default written into its help), the config file's schema
/// ([`FileConfig`]) and their merge over the defaults (`Settings`).
///
/// A line reads `field: Type, "VALUE", Check[, default EXPR][, shown "TEXT"];` under the
/// setting's doc comment (one paragraph: it is also the flag's help). The flag `--field`, the
/// environment variable `NARAD_FIELD` and the file key `field` (both kebab-case) all come from
/// the field's name, so they cannot drift apart. `default EXPR` is used when the setting is
/// given nowhere, and the help shows it; without it the setting stays unset (`Option`) and
/// `shown "TEXT"` says in the help what unset means. `Check` (a [`Check`] type) validates the
/// value and turns it into what [`Config`] holds. Settings are checked in table order.
macro_rules! settings {
    (@resolved $ty:ty, $default:expr) => { $ty };
    (@resolved $ty:ty) => { Option<$ty> };
    (@value $given:expr, $default:expr) => { $given.unwrap_or_else(|| $default) };
    (@value $given:expr) => { $given };
    (@shown $value_name:literal, [$default:expr], []) => {
        Some(shown_value($value_name, &$default))
    };
    (@shown $value_name:literal, [], [$shown:literal]) => { Some(String::from($shown)) };
    (@shown $value_name:literal, [], []) => { None };
    ($(
        $(#[doc = $doc:literal])+
        $field:ident: $ty:ty, $value_name:literal, $check:ident
            $(, default $default:expr)? $(, shown $shown:literal)?;
    )+) => {
        /// Each setting's environment variable and file key, spelled at compile time from its
        /// field name.
        mod name {
            $(pub(super) mod $field {
                const FIELD: &str = stringify!($field);
                const KEY_BYTES: [u8; FIELD.len()] = $crate::config::kebab_case(FIELD);
                const ENV_BYTES: [u8; FIELD.len() + 6] = $crate::config::narad_env(FIELD);
                /// The config-file key.
                pub(crate) const KEY: &str = $crate::config::ascii(&KEY_BYTES);
                /// The environment variable.
                pub(crate) const ENV: &str = $crate::config::ascii(&ENV_BYTES);
            })+
        }

        /// `narad serve` flags. Each is also read from its environment variable, then from the
        /// config file (same name, kebab-case), then takes the default stated in its help.
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct ServeArgs {
            /// TOML config file with any of the keys below in kebab-case (e.g. `data-dir =
            /// "/var/lib/narad"`). Unknown keys are an error.
            #[arg(long, env = "NARAD_CONFIG", value_name = "FILE")]
            pub config: Option<PathBuf>,
            $(
                $(#[doc = $doc])+
                #[arg(
                    long,
                    env = name::$field::ENV,
                    value_name = $value_name,
                    help = help_text(
                        concat!($($doc),+),
                        settings!(@shown $value_name, [$($default)?], [$($shown)?]),
                    ),
                )]
                pub $field: Option<$ty>,
            )+
        }

        /// The config file's schema: the settings of [`ServeArgs`] but `config`, kebab-case,
        /// all optional.
        #[derive(Debug, Clone, Default, Deserialize)]
        #[serde(rename_all = "kebab-case", deny_unknown_fields)]
        pub(crate) struct FileConfig {
            $($(#[doc = $doc])+ pub $field: Option<$ty>,)+
            /// Log line format, `text` or `json`: the `--log-format` flag (a flag of every
            /// command, read before the daemon's settings), for a daemon started with this
            /// file and without the flag.
            pub log_format: Option<String>,
        }

        /// Every setting taken from the flag (or environment), else the file, else its
        /// default, and checked.
        struct Settings {
            $($field: <$check as Check<settings!(@resolved $ty $(, $default)?)>>::Out,)+
        }

        impl Settings {
            fn resolve(args: &ServeArgs, file: &FileConfig) -> Result<Settings, ConfigError> {
                Ok(Settings {$(
                    $field: <$check as Check<_>>::check(
                        name::$field::KEY,
                        settings!(
                            @value (args.$field.clone().or_else(|| file.$field.clone()))
                            $(, $default)?
                        ),
                    )?,
                )+})
            }
        }
    };
}

settings! {
    /// Directory holding the metastore and the partition logs (created if missing). Required.
    data_dir: PathBuf, "DIR", Required;
    /// Address the HTTP API listens on.
    listen: String, "ADDR", SocketAddress, default DEFAULT_LISTEN.to_owned();
    /// Address of the Kafka protocol listener (produce, fetch, metadata for Kafka clients;
    /// see docs/kafka.md), e.g. 127.0.0.1:9092.
    kafka_listen: String, "ADDR", OptionalSocketAddress, shown "off, no Kafka listener";
    /// The HOST:PORT Kafka clients are told to reach this node's Kafka listener at (Metadata
    /// names it as this broker): for clients that come through a forwarded port (a container
    /// port, an SSH tunnel, a Kubernetes service) and cannot reach the listen address.
    kafka_advertise: String, "HOST:PORT", OptionalHostPort, shown "the address a client connected to (one node); the --advertise host and the Kafka listener's port (cluster)";
    /// Create a topic a Kafka client asks Metadata for and that does not exist, with this
    /// many partitions, when the client allows it (Kafka's auto.create.topics.enable and
    /// num.partitions); 0 creates none. Never while the daemon requires its API token.
    kafka_auto_create_partitions: u32, "N", PartitionCount, default 0;
    /// Whether Kafka clients must authenticate before any other request: `off`, or
    /// `required`: SASL SCRAM-SHA-256 or SCRAM-SHA-512 as a user of `narad user`, and PLAIN
    /// when the listener has TLS (docs/security.md).
    kafka_sasl: String, "off|required", KafkaSasl, default "off".to_owned();
    /// `yes` offers SASL PLAIN on a Kafka listener without TLS too, where the password
    /// crosses the network in clear (a private network, a TLS-terminating proxy).
    kafka_sasl_plain_without_tls: String, "yes|no", YesNo, default "no".to_owned();
    /// etcd endpoints, comma-separated (e.g. http://10.0.0.1:2379,http://10.0.0.2:2379):
    /// turns cluster mode on, with the metadata in etcd (see docs/cluster.md).
    etcd: String, "URLS", EtcdEndpoints, shown "off, one node with the embedded metastore";
    /// Name of the cluster: the key prefix in etcd, so that several clusters can share one.
    /// 1 to 64 of `a-z 0-9 - _`.
    cluster: String, "NAME", ClusterName, default DEFAULT_CLUSTER.to_owned();
    /// This node's id in the cluster, stable across restarts; required with --etcd. 1 to 64
    /// of `a-z 0-9 - _`.
    node_id: String, "ID", OptionalName, shown "none, required with --etcd";
    /// The URL peers and clients reach this node's HTTP API at (cluster mode).
    advertise: String, "URL", OptionalUrl, shown "http:// (https:// with --tls-cert) and the listen address";
    /// PEM certificate(s) of the CA that signed etcd's certificate: needed with https://
    /// etcd endpoints.
    etcd_ca: PathBuf, "FILE", Any, shown "none; required with https:// endpoints";
    /// PEM client certificate this node presents to etcd (with --etcd-key), for an etcd
    /// started with --client-cert-auth.
    etcd_cert: PathBuf, "FILE", Any, shown "none";
    /// PEM private key of --etcd-cert.
    etcd_key: PathBuf, "FILE", Any, shown "none";
    /// etcd user this node authenticates as (etcd's own authentication, `etcdctl auth
    /// enable`); needs --etcd-password-file.
    etcd_user: String, "NAME", Any, shown "none";
    /// File holding the password of --etcd-user (one trailing newline is dropped).
    etcd_password_file: PathBuf, "FILE", Any, shown "none";
    /// Lease time-to-live of this node's registration in etcd, in milliseconds: a node that
    /// stops renewing is gone for its peers this long after its last renewal.
    lease_ttl_ms: u64, "MS", Positive, default DEFAULT_LEASE_TTL_MS;
    /// Take --data-dir as the new data dir of node ID (this node's --node-id), its old one
    /// being lost: allowed only while the metadata gives the node no partition. Without it a
    /// node refuses to start on a data dir other than the one it last ran on (docs/cluster.md).
    new_data_dir_for: String, "ID", OptionalName, shown "off";
    /// Largest record produce accepts, in bytes: key + value + header names and values.
    max_record_bytes: u64, "BYTES", Positive, default DEFAULT_MAX_RECORD_BYTES;
    /// Largest HTTP request body, in bytes.
    max_request_bytes: u64, "BYTES", Positive, default DEFAULT_MAX_REQUEST_BYTES;
    /// Largest plugin module `POST /v1/plugins` accepts, in bytes (its own limit, not
    /// max-request-bytes).
    max_plugin_bytes: u64, "BYTES", Positive, default DEFAULT_MAX_PLUGIN_BYTES;
    /// Most records in one produce request.
    max_batch_records: u32, "N", Positive, default DEFAULT_MAX_BATCH_RECORDS;
    /// Most records one fetch returns; a larger `max` is capped.
    max_fetch_records: u32, "N", Positive, default DEFAULT_MAX_FETCH_RECORDS;
    /// Most record bytes one fetch gathers (at least one record is always returned).
    max_fetch_bytes: u64, "BYTES", Positive, default DEFAULT_MAX_FETCH_BYTES;
    /// Longest long-poll a fetch may ask for with `wait_ms`; a longer ask is capped.
    max_wait_ms: u64, "MS", Any, default DEFAULT_MAX_WAIT_MS;
    /// Interval between retention passes, in milliseconds.
    retention_check_interval_ms: u64, "MS", Positive, default DEFAULT_RETENTION_CHECK_INTERVAL_MS;
    /// A partition log unused for this long is closed (and reopened on demand), in
    /// milliseconds.
    idle_close_after_ms: u64, "MS", Positive, default DEFAULT_IDLE_CLOSE_AFTER_MS;
    /// A partition that failed (its disk refused a write or a sync) is reopened, with the same
    /// recovery as a restart, on its first use this long after failing, in milliseconds.
    failed_reopen_after_ms: u64, "MS", Positive, default DEFAULT_FAILED_REOPEN_AFTER_MS;
    /// How long a consumer group with no members waits, when one joins, for more to join
    /// before it assigns partitions (Kafka's group.initial.rebalance.delay.ms).
    group_initial_rebalance_delay_ms: u64, "MS", Any, default DEFAULT_GROUP_INITIAL_REBALANCE_DELAY_MS;
    /// How long the committed offsets of a consumer group with no members are kept after its
    /// last commit (Kafka's offsets.retention.minutes), in milliseconds.
    group_offsets_retention_ms: u64, "MS", Positive, default DEFAULT_GROUP_OFFSETS_RETENTION_MS;
    /// Segment size at which a partition log rolls to a new file, in bytes.
    segment_bytes: u64, "BYTES", Positive, default DEFAULT_SEGMENT_BYTES;
    /// Segment frame layout written: 2 keeps null values (Kafka tombstones) and stamps
    /// idempotent Kafka batches with their producer (so a retry after a restart is not written
    /// twice); 1 writes only what builds before those read (null values empty, no stamps). Use
    /// 1 on upgraded nodes while a cluster still has nodes on such a build, since partitions
    /// move between nodes; then restart them with 2 (docs/operator-guide.md, upgrades).
    frame_format: u32, "1|2", FrameFormat, default 2;
    /// Wall-clock deadline of one routing-plugin call, in milliseconds: a backstop behind the
    /// per-slab fuel budget; a call over it fails the slab (the cursor stalls and retries).
    plugin_deadline_ms: u64, "MS", Positive, default DEFAULT_PLUGIN_DEADLINE_MS;
    /// Linear-memory limit of one routing-plugin instance, in bytes; growing past it traps.
    plugin_memory_bytes: u64, "BYTES", Positive, default DEFAULT_PLUGIN_MEMORY_BYTES;
    /// Fuel (about one unit per Wasm instruction) a plugin call gets per record handed in, on
    /// top of a fixed 5,000,000 per call. Raise it for plugins that do heavy work per record;
    /// the budget depends only on the slab, so a slab that runs out fails the same way on
    /// every retry.
    plugin_fuel_per_record: u64, "UNITS", Positive, default DEFAULT_PLUGIN_FUEL_PER_RECORD;
    /// Fuel a plugin call gets per byte of input (keys, and headers or values when the plugin
    /// asks for them): raise it for plugins that scan payloads. Zero is allowed: the fixed and
    /// per-record terms still bound a call.
    plugin_fuel_per_input_byte: u64, "UNITS", Any, default DEFAULT_PLUGIN_FUEL_PER_INPUT_BYTE;
    /// Most functions a plugin module may define. A module over this or any of the five
    /// limits below is refused before it is compiled (400, reason `module_limit`), at deploy
    /// and when a stored module is loaded.
    plugin_max_functions: u32, "N", Positive, default DEFAULT_PLUGIN_MAX_FUNCTIONS;
    /// Largest function body in a plugin module, in bytes.
    plugin_max_function_bytes: u32, "BYTES", Positive, default DEFAULT_PLUGIN_MAX_FUNCTION_BYTES;
    /// Largest code section of a plugin module, in bytes.
    plugin_max_code_bytes: u64, "BYTES", Positive, default DEFAULT_PLUGIN_MAX_CODE_BYTES;
    /// Most locals one plugin function may declare.
    plugin_max_locals: u32, "N", Positive, default DEFAULT_PLUGIN_MAX_LOCALS;
    /// Most types, imports, exports, globals, data segments, element segments and element
    /// items a plugin module may have, each counted on its own.
    plugin_max_module_items: u32, "N", Positive, default DEFAULT_PLUGIN_MAX_MODULE_ITEMS;
    /// Most bytes of a plugin module's data segments together.
    plugin_max_data_bytes: u64, "BYTES", Positive, default DEFAULT_PLUGIN_MAX_DATA_BYTES;
    /// File holding a bearer token; when set, every mutating request (POST, PUT, PATCH,
    /// DELETE) must send `Authorization: Bearer <token>` (401 otherwise). Reads stay open.
    auth_token_file: PathBuf, "FILE", TokenFile, shown "none, no token required";
    /// `yes`: reads of the HTTP API need an authenticated caller too (the token, or a user's
    /// credentials over TLS); `/metrics` and `/healthz` stay open. Needs --auth-token-file.
    auth_reads: String, "YES_NO", YesNo, default "no".to_owned();
    /// PEM certificate chain (own certificate first) to serve the HTTP API and the Kafka
    /// listener over TLS with; needs --tls-key. Reloaded when the file changes or on SIGHUP.
    tls_cert: PathBuf, "FILE", Any, shown "off, plain TCP";
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    tls_key: PathBuf, "FILE", Any, shown "none";
    /// Cluster mode: PEM certificates of the CAs to check other nodes' TLS certificates
    /// against, beside the system's (for nodes whose certificates a private CA signed).
    peer_tls_ca: PathBuf, "FILE", Any, shown "the system's CAs";
    /// Cluster mode: PEM certificate this node presents when it calls other nodes (mutual
    /// TLS), naming its node id as a DNS name (subjectAltName DNS:ID) beside its host; with
    /// --peer-tls-key. Needed for --tls-client-ca in cluster mode.
    peer_tls_cert: PathBuf, "FILE", Any, shown "none, no certificate presented to peers";
    /// PEM private key of --peer-tls-cert.
    peer_tls_key: PathBuf, "FILE", Any, shown "none";
    /// PEM certificates of the CAs whose client certificates the listeners accept: with it,
    /// every client must present one (mutual TLS). Needs --tls-cert.
    tls_client_ca: PathBuf, "FILE", Any, shown "none, no client certificate asked for";
    /// Most request-body bytes buffered across all requests at once; a request that does not
    /// fit now gets 503 with `Retry-After`, one larger than this alone gets 413.
    max_buffered_request_bytes: u64, "BYTES", Positive, default DEFAULT_MAX_BUFFERED_REQUEST_BYTES;
    /// Most bytes of other nodes' call bodies (child commits, a move's steps) buffered at once,
    /// apart from clients' (cluster mode); a call that does not fit now gets 503 and is sent
    /// again. At least 17 MiB (two of the largest call).
    max_buffered_peer_request_bytes: u64, "BYTES", Positive,
        default DEFAULT_MAX_BUFFERED_PEER_REQUEST_BYTES;
    /// Most HTTP connections open at once; a connection over it is answered 503 and closed.
    max_connections: u32, "N", PositiveIfSet,
        shown "derived from the descriptor limit: (limit - 1024) / 2, between 64 and 16384";
    /// Time a client has to send a complete request head, counted from the connection's
    /// start or the end of the previous answer; slower connections are closed.
    header_read_timeout_ms: u64, "MS", Positive, default DEFAULT_HEADER_READ_TIMEOUT_MS;
    /// A connection with no request in progress and no byte moving for this long is closed.
    idle_timeout_ms: u64, "MS", Positive, default DEFAULT_IDLE_TIMEOUT_MS;
    /// On SIGTERM/SIGINT, longest wait for requests in progress before their connections are
    /// dropped; then the store closes and the daemon exits.
    shutdown_grace_ms: u64, "MS", Positive, default DEFAULT_SHUTDOWN_GRACE_MS;
}

/// How a setting's value is validated and turned into what [`Config`] holds (the `Check`
/// column of the [`settings!`] table).
trait Check<T> {
    /// What the checked value becomes.
    type Out;
    /// Checks `value` of the setting `key` (kebab-case, for the error).
    fn check(key: &'static str, value: T) -> Result<Self::Out, ConfigError>;
}

/// Any value is accepted.
struct Any;
impl<T> Check<T> for Any {
    type Out = T;
    fn check(_key: &'static str, value: T) -> Result<T, ConfigError> {
        Ok(value)
    }
}

/// Comma-separated `http://` or `https://` URLs (not both), or unset: cluster mode is off.
struct EtcdEndpoints;
impl Check<Option<String>> for EtcdEndpoints {
    type Out = Option<Vec<String>>;
    fn check(key: &'static str, value: Option<String>) -> Result<Option<Vec<String>>, ConfigError> {
        let Some(value) = value else {
            return Ok(None);
        };
        let endpoints: Vec<String> = value
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        if endpoints.is_empty() {
            return Err(ConfigError::BadValue {
                key,
                message: "no endpoint given: expected URLs such as http://127.0.0.1:2379".into(),
            });
        }
        for endpoint in &endpoints {
            OptionalUrl::check(key, Some(endpoint.clone()))?;
        }
        let secure = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if secure != 0 && secure != endpoints.len() {
            return Err(ConfigError::BadValue {
                key,
                message: "mixes http:// and https:// endpoints: one etcd cluster is reached \
                          one way"
                    .into(),
            });
        }
        Ok(Some(endpoints))
    }
}

/// A cluster or node name: what the plugin names allow, so it is safe in an etcd key and a
/// metric label.
struct ClusterName;
impl Check<String> for ClusterName {
    type Out = String;
    fn check(key: &'static str, value: String) -> Result<String, ConfigError> {
        let ok = (1..=64).contains(&value.len())
            && value
                .chars()
                .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-' | '_'));
        if !ok {
            return Err(ConfigError::BadValue {
                key,
                message: format!("{value:?}: expected 1 to 64 of a-z 0-9 - _"),
            });
        }
        Ok(value)
    }
}

/// A name as [`ClusterName`] checks it, or unset.
struct OptionalName;
impl Check<Option<String>> for OptionalName {
    type Out = Option<String>;
    fn check(key: &'static str, value: Option<String>) -> Result<Option<String>, ConfigError> {
        value.map(|v| ClusterName::check(key, v)).transpose()
    }
}

/// An `http://` or `https://` URL with a host, or unset.
struct OptionalUrl;
impl Check<Option<String>> for OptionalUrl {
    type Out = Option<String>;
    fn check(key: &'static str, value: Option<String>) -> Result<Option<String>, ConfigError> {
        let Some(value) = value else {
            return Ok(None);
        };
        let rest = value
            .strip_prefix("http://")
            .or_else(|| value.strip_prefix("https://"));
        match rest {
            Some(host) if !host.is_empty() && !host.starts_with('/') => {
                Ok(Some(value.trim_end_matches('/').to_owned()))
            }
            _ => Err(ConfigError::BadValue {
                key,
                message: format!("{value:?}: expected a URL such as http://10.0.0.5:7070"),
            }),
        }
    }
}

/// A segment frame layout this build writes: 1 or 2.
struct FrameFormat;
impl Check<u32> for FrameFormat {
    type Out = u32;
    fn check(key: &'static str, value: u32) -> Result<u32, ConfigError> {
        if matches!(value, 1 | 2) {
            Ok(value)
        } else {
            Err(ConfigError::BadValue {
                key,
                message: format!("{value}: the frame formats are 1 (the original) and 2"),
            })
        }
    }
}

/// Zero is refused: a zero limit or interval is always a mistake.
/// Most partitions a topic may have: far below the five-digit directory limit, and enough for
/// any one-node deployment (Kafka clusters rarely exceed a few hundred per topic). Here, below
/// the topics, because a setting is checked against it too.
pub(crate) const MAX_PARTITIONS: u32 = 1024;

/// 0 (off) or a partition count a topic may have.
struct PartitionCount;
impl Check<u32> for PartitionCount {
    type Out = u32;
    fn check(key: &'static str, value: u32) -> Result<u32, ConfigError> {
        if value <= MAX_PARTITIONS {
            Ok(value)
        } else {
            Err(ConfigError::BadValue {
                key,
                message: format!("{value} partitions: a topic has at most {}", MAX_PARTITIONS),
            })
        }
    }
}

struct Positive;
impl<T: PartialEq + Default> Check<T> for Positive {
    type Out = T;
    fn check(key: &'static str, value: T) -> Result<T, ConfigError> {
        if value == T::default() {
            return Err(ConfigError::BadValue {
                key,
                message: "must be greater than 0".to_owned(),
            });
        }
        Ok(value)
    }
}

/// Unset is allowed (the daemon derives the value); a value given is refused if zero.
struct PositiveIfSet;
impl<T: PartialEq + Default> Check<Option<T>> for PositiveIfSet {
    type Out = Option<T>;
    fn check(key: &'static str, value: Option<T>) -> Result<Option<T>, ConfigError> {
        value.map(|v| Positive::check(key, v)).transpose()
    }
}

/// Must be given somewhere: only the data directory has no default.
struct Required;
impl<T> Check<Option<T>> for Required {
    type Out = T;
    fn check(_key: &'static str, value: Option<T>) -> Result<T, ConfigError> {
        value.ok_or(ConfigError::MissingDataDir)
    }
}

/// An `IP:PORT` to listen on.
struct SocketAddress;
impl Check<String> for SocketAddress {
    type Out = SocketAddr;
    fn check(_key: &'static str, value: String) -> Result<SocketAddr, ConfigError> {
        value.parse().map_err(|_| ConfigError::BadListen { value })
    }
}

/// `off` or `required`: whether Kafka clients must authenticate with SASL.
struct KafkaSasl;
impl Check<String> for KafkaSasl {
    type Out = bool;
    fn check(key: &'static str, value: String) -> Result<bool, ConfigError> {
        match value.as_str() {
            "off" => Ok(false),
            "required" => Ok(true),
            _ => Err(ConfigError::BadValue {
                key,
                message: format!("{value:?}: expected off or required"),
            }),
        }
    }
}

/// `yes` or `no`.
struct YesNo;
impl Check<String> for YesNo {
    type Out = bool;
    fn check(key: &'static str, value: String) -> Result<bool, ConfigError> {
        match value.as_str() {
            "yes" => Ok(true),
            "no" => Ok(false),
            _ => Err(ConfigError::BadValue {
                key,
                message: format!("{value:?}: expected yes or no"),
            }),
        }
    }
}

/// An `IP:PORT` to listen on, or unset: that listener is off.
struct OptionalSocketAddress;
impl Check<Option<String>> for OptionalSocketAddress {
    type Out = Option<SocketAddr>;
    fn check(key: &'static str, value: Option<String>) -> Result<Option<SocketAddr>, ConfigError> {
        value.map(|v| SocketAddress::check(key, v)).transpose()
    }
}

/// A `HOST:PORT` clients can reach (a name or an address; an IPv6 address in brackets), or
/// unset.
struct OptionalHostPort;
impl Check<Option<String>> for OptionalHostPort {
    type Out = Option<(String, u16)>;
    fn check(
        key: &'static str,
        value: Option<String>,
    ) -> Result<Option<(String, u16)>, ConfigError> {
        let Some(value) = value else {
            return Ok(None);
        };
        let bad = || ConfigError::BadValue {
            key,
            message: format!("{value:?}: expected HOST:PORT, such as kafka.example.com:9092"),
        };
        let (host, port) = value.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() || port == 0 || host.contains(['/', ' ']) {
            return Err(bad());
        }
        Ok(Some((host.to_owned(), port)))
    }
}

/// A bearer-token file, read now so that a bad file stops the daemon at start.
struct TokenFile;
impl Check<Option<PathBuf>> for TokenFile {
    type Out = Option<crate::auth::AuthToken>;
    fn check(
        _key: &'static str,
        value: Option<PathBuf>,
    ) -> Result<Option<crate::auth::AuthToken>, ConfigError> {
        Ok(value
            .map(|path| crate::auth::AuthToken::from_file(&path))
            .transpose()?)
    }
}

/// A flag's help: its doc comment, then the default the merge uses, from the same table line.
fn help_text(doc: &str, default: Option<String>) -> String {
    let doc = doc.trim();
    match default {
        Some(default) => format!("{doc} [default: {default}]"),
        // Without a default, end as clap ends a doc-comment help: without the full stop.
        None => doc.strip_suffix('.').unwrap_or(doc).to_owned(),
    }
}

/// A default as the help shows it: the value, and for a round number of bytes or minutes the
/// same in that unit, e.g. `1048576 (1 MiB)`.
fn shown_value(value_name: &str, value: &dyn std::fmt::Display) -> String {
    let text = value.to_string();
    let Ok(n) = text.parse::<u64>() else {
        return text;
    };
    let units: &[(u64, &str)] = match value_name {
        "BYTES" => &[(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")],
        "MS" => &[(60_000, "min")],
        _ => &[],
    };
    match units.iter().find(|(size, _)| n >= *size && n % size == 0) {
        Some((size, unit)) => format!("{text} ({} {unit})", n / size),
        None => text,
    }
}

/// `field` (a snake_case field name) in kebab-case, at compile time (the config-file key).
const fn kebab_case<const N: usize>(field: &str) -> [u8; N] {
    let field = field.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = if field[i] == b'_' { b'-' } else { field[i] };
        i += 1;
    }
    out
}

/// `NARAD_` and `field` in upper case, at compile time (the environment variable).
const fn narad_env<const N: usize>(field: &str) -> [u8; N] {
    const PREFIX: &[u8] = b"NARAD_";
    let field = field.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < PREFIX.len() {
            PREFIX[i]
        } else {
            field[i - PREFIX.len()].to_ascii_uppercase()
        };
        i += 1;
    }
    out
}

/// The bytes built by [`kebab_case`] or [`narad_env`] as text (they are ASCII).
const fn ascii(bytes: &'static [u8]) -> &'static str {
    match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(_) => panic!("a field name is ASCII"),
    }
}

impl FileConfig {
    /// Reads and parses a config file; a relative path in it is taken relative to the file's
    /// own directory ([`FileConfig::relative_to`]).
    pub(crate) fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        Ok(FileConfig::parse(path, &text)?.relative_to(dir))
    }

    /// The file's relative paths (data directory, token, certificates) joined to `dir`, the
    /// file's directory: `data-dir = "data"` in `/etc/narad/narad.toml` is `/etc/narad/data`
    /// whatever directory the daemon was started from, as someone reading the file expects.
    /// A path given as a flag or in the environment stays relative to the working directory.
    fn relative_to(mut self, dir: &Path) -> FileConfig {
        let paths = [
            &mut self.data_dir,
            &mut self.auth_token_file,
            &mut self.tls_cert,
            &mut self.tls_key,
            &mut self.peer_tls_ca,
            &mut self.tls_client_ca,
            &mut self.etcd_ca,
            &mut self.etcd_cert,
            &mut self.etcd_key,
            &mut self.etcd_password_file,
            &mut self.peer_tls_cert,
            &mut self.peer_tls_key,
        ];
        for path in paths.into_iter().flatten() {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
        self
    }

    /// Parses config-file text; `path` only names the file in errors.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::ParseFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }
}

/// The `log-format` a config file sets, if it sets one: read before the rest of the
/// configuration, since logging starts first.
pub fn file_log_format(path: &Path) -> Result<Option<String>, ConfigError> {
    Ok(FileConfig::load(path)?.log_format)
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
    pub(crate) max_fetch_records: u32,
    /// Most record bytes per fetch.
    pub(crate) max_fetch_bytes: u64,
    /// Longest long-poll.
    pub max_wait: Duration,
    /// Most request-body bytes buffered across all requests at once.
    pub(crate) max_buffered_request_bytes: u64,
    /// Most bytes of other nodes' call bodies buffered at once.
    pub(crate) max_buffered_peer_request_bytes: u64,
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
            max_buffered_peer_request_bytes: DEFAULT_MAX_BUFFERED_PEER_REQUEST_BYTES,
        }
    }
}

/// How the HTTP server treats connections (see `http_server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most connections open at once; `None`: derived from the descriptor limit at start.
    pub(crate) max_connections: Option<u32>,
    /// Time to receive a complete request head.
    pub(crate) header_read_timeout: Duration,
    /// Time a connection may sit with nothing in progress and no byte moving.
    pub idle_timeout: Duration,
    /// Longest wait for requests in progress at shutdown.
    pub(crate) shutdown_grace: Duration,
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

/// Settings of the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupsConfig {
    /// How long a rebalance of a group that had no members waits for more to join, so
    /// consumers started together share one generation (Kafka's
    /// `group.initial.rebalance.delay.ms`).
    pub initial_rebalance_delay: Duration,
    /// How long the offsets of a group with no members are kept after its last commit
    /// (Kafka's `offsets.retention.minutes`); also the retention of the offsets topic.
    pub offsets_retention: Duration,
}

impl Default for GroupsConfig {
    fn default() -> GroupsConfig {
        GroupsConfig {
            initial_rebalance_delay: Duration::from_millis(
                DEFAULT_GROUP_INITIAL_REBALANCE_DELAY_MS,
            ),
            offsets_retention: Duration::from_millis(DEFAULT_GROUP_OFFSETS_RETENTION_MS),
        }
    }
}

/// Cluster mode's settings (`--etcd` and the flags that go with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// etcd endpoints.
    pub etcd: Vec<String>,
    /// The cluster's name, its key prefix in etcd.
    pub name: String,
    /// This node's id.
    pub(crate) node_id: String,
    /// The URL peers and clients use; `None`: `http://` and the bound listen address.
    pub advertise: Option<String>,
    /// Lease time-to-live of the node's registration.
    pub(crate) lease_ttl: Duration,
    /// Take the data dir as the node's new one (`--new-data-dir-for` naming this node).
    pub(crate) new_data_dir: bool,
    /// CAs (PEM file) other nodes' certificates are checked against, beside the system's.
    pub(crate) peer_tls_ca: Option<PathBuf>,
    /// How this node checks etcd and authenticates to it.
    pub(crate) etcd_security: EtcdSecurity,
    /// The certificate and key this node presents to peers (`--peer-tls-cert`).
    pub(crate) peer_identity: Option<(PathBuf, PathBuf)>,
    /// Calls between nodes must come with a certificate naming the calling node
    /// (`--tls-client-ca` in cluster mode).
    pub(crate) peers_prove_identity: bool,
}

/// How a node checks etcd and authenticates to it (`--etcd-ca`, `--etcd-cert`/`--etcd-key`,
/// `--etcd-user`). Its `Debug` never shows the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    /// CA certificates (PEM file) etcd's certificate is checked against (https:// endpoints).
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM files) presented to etcd.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// etcd user name and password.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSecurity")
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .finish()
    }
}

/// Longest etcd password file read, in bytes.
const MAX_ETCD_PASSWORD_FILE_BYTES: u64 = 4_096;

impl EtcdSecurity {
    /// The settings checked against the endpoints (`https`: they are https://), the password
    /// read from its file.
    fn resolve(
        https: bool,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        user: Option<String>,
        password_file: Option<PathBuf>,
    ) -> Result<EtcdSecurity, ConfigError> {
        let bad = |key: &'static str, message: &str| ConfigError::BadValue {
            key,
            message: message.to_owned(),
        };
        if https && ca.is_none() {
            return Err(bad(
                "etcd-ca",
                "https:// etcd endpoints need --etcd-ca FILE, the CA that signed etcd's \
                 certificate",
            ));
        }
        if !https && (ca.is_some() || cert.is_some() || key.is_some()) {
            return Err(bad(
                "etcd",
                "--etcd-ca, --etcd-cert and --etcd-key are for https:// endpoints: give the \
                 etcd endpoints as https://",
            ));
        }
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => return Err(bad("etcd-key", "--etcd-cert needs --etcd-key FILE")),
            (None, Some(_)) => return Err(bad("etcd-cert", "--etcd-key needs --etcd-cert FILE")),
        };
        let user = match (user, password_file) {
            (Some(name), Some(file)) => Some((name, read_etcd_password(&file)?)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(bad(
                    "etcd-password-file",
                    "--etcd-user needs --etcd-password-file FILE",
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "etcd-user",
                    "--etcd-password-file needs --etcd-user NAME",
                ));
            }
        };
        Ok(EtcdSecurity { ca, identity, user })
    }
}

/// Reads an etcd password file: one trailing newline dropped, empty refused.
fn read_etcd_password(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let bad = |message: String| ConfigError::BadValue {
        key: "etcd-password-file",
        message,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(MAX_ETCD_PASSWORD_FILE_BYTES)
                .read_to_string(&mut text)
        })
        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(bad(format!("{}: the password is empty", path.display())));
    }
    Ok(text)
}

/// SASL on the Kafka listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KafkaSaslConfig {
    /// Whether PLAIN is offered beside SCRAM: over TLS, or when allowed without it.
    pub(crate) plain: bool,
}

/// The daemon's resolved configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Data directory (metastore file, partition logs, lock file).
    pub data_dir: PathBuf,
    /// HTTP listen address; port 0 picks a free port (tests).
    pub listen: SocketAddr,
    /// Kafka protocol listen address; `None`: no Kafka listener.
    pub(crate) kafka_listen: Option<SocketAddr>,
    /// Where Kafka clients are told this broker is (`--kafka-advertise`), as host and port.
    pub(crate) kafka_advertise: Option<(String, u16)>,
    /// Partitions of a topic the Kafka listener creates when a client's Metadata names it;
    /// `None`: it creates none (`--kafka-auto-create-partitions 0`).
    pub(crate) kafka_auto_create: Option<u32>,
    /// SASL on the Kafka listener (`--kafka-sasl required`); `None`: off.
    pub(crate) kafka_sasl: Option<KafkaSaslConfig>,
    /// API limits.
    pub limits: Limits,
    /// Interval between retention passes.
    pub retention_check_interval: Duration,
    /// Idle time after which a partition log is closed.
    pub idle_close_after: Duration,
    /// Wait before a failed partition is reopened on its next use.
    pub(crate) failed_reopen_after: Duration,
    /// Segment roll size in bytes.
    pub segment_bytes: u64,
    /// Write only the original frame layout (`--frame-format 1`).
    pub original_frames: bool,
    /// The bearer token mutating requests must carry; `None`: no token required.
    pub auth_token: Option<crate::auth::AuthToken>,
    /// Reads of the HTTP API need an authenticated caller (`--auth-reads yes`).
    pub(crate) auth_reads: bool,
    /// Limits of every routing-plugin call and instance.
    pub plugin_limits: narad_runtime::Limits,
    /// Connection cap and timeouts of the HTTP server.
    pub http: HttpLimits,
    /// Cluster mode; `None`: one node with the embedded metastore.
    pub cluster: Option<ClusterConfig>,
    /// The consumer group coordinator's settings.
    pub groups: GroupsConfig,
    /// TLS on the HTTP and Kafka listeners; `None`: plain TCP.
    pub tls: Option<crate::tls::TlsFiles>,
}

impl Config {
    /// A configuration with every default, for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            data_dir: data_dir.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            kafka_listen: None,
            kafka_advertise: None,
            kafka_auto_create: None,
            kafka_sasl: None,
            limits: Limits::default(),
            retention_check_interval: Duration::from_millis(DEFAULT_RETENTION_CHECK_INTERVAL_MS),
            idle_close_after: Duration::from_millis(DEFAULT_IDLE_CLOSE_AFTER_MS),
            failed_reopen_after: Duration::from_millis(DEFAULT_FAILED_REOPEN_AFTER_MS),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            original_frames: false,
            auth_token: None,
            auth_reads: false,
            plugin_limits: narad_runtime::Limits::default(),
            http: HttpLimits::default(),
            cluster: None,
            groups: GroupsConfig::default(),
            tls: None,
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
    pub(crate) fn merge(args: &ServeArgs, file: &FileConfig) -> Result<Config, ConfigError> {
        let s = Settings::resolve(args, file)?;
        if s.max_record_bytes > s.max_request_bytes {
            return Err(ConfigError::BadValue {
                key: "max-record-bytes",
                message: format!(
                    "{} is larger than max-request-bytes ({}): no request could carry such a record",
                    s.max_record_bytes, s.max_request_bytes
                ),
            });
        }
        if s.max_buffered_peer_request_bytes < MIN_BUFFERED_PEER_REQUEST_BYTES {
            return Err(ConfigError::BadValue {
                key: "max-buffered-peer-request-bytes",
                message: format!(
                    "{} is below {MIN_BUFFERED_PEER_REQUEST_BYTES}, two of the largest call one \
                     node sends another",
                    s.max_buffered_peer_request_bytes
                ),
            });
        }
        let ms = Duration::from_millis;
        let tls = match (s.tls_cert, s.tls_key) {
            (Some(cert), Some(key)) => Some(crate::tls::TlsFiles {
                cert,
                key,
                client_ca: s.tls_client_ca,
            }),
            (None, None) if s.tls_client_ca.is_none() => None,
            (None, None) => {
                return Err(ConfigError::BadValue {
                    key: "tls-client-ca",
                    message: "client certificates are asked for only over TLS: give \
                              --tls-cert and --tls-key too"
                        .into(),
                });
            }
            (Some(_), None) => {
                return Err(ConfigError::BadValue {
                    key: "tls-key",
                    message: "--tls-cert needs the private key of its certificate: give \
                              --tls-key FILE"
                        .into(),
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::BadValue {
                    key: "tls-cert",
                    message: "--tls-key needs the certificate it belongs to: give --tls-cert \
                              FILE"
                        .into(),
                });
            }
        };
        if s.auth_reads && s.auth_token_file.is_none() {
            return Err(ConfigError::BadValue {
                key: "auth-reads",
                message: "reads can need an authenticated caller only when changes do: give \
                          --auth-token-file too"
                    .into(),
            });
        }
        if s.peer_tls_ca.is_some() && s.etcd.is_none() {
            return Err(ConfigError::BadValue {
                key: "peer-tls-ca",
                message: "peers exist only in cluster mode: give --etcd too, or leave it out"
                    .into(),
            });
        }
        let peer_identity = match (s.peer_tls_cert, s.peer_tls_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::BadValue {
                    key: "peer-tls-key",
                    message: "--peer-tls-cert needs --peer-tls-key FILE".into(),
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::BadValue {
                    key: "peer-tls-cert",
                    message: "--peer-tls-key needs --peer-tls-cert FILE".into(),
                });
            }
        };
        if peer_identity.is_some() && s.etcd.is_none() {
            return Err(ConfigError::BadValue {
                key: "peer-tls-cert",
                message: "peers exist only in cluster mode: give --etcd too, or leave it out"
                    .into(),
            });
        }
        if s.etcd.is_some()
            && tls.as_ref().is_some_and(|t| t.client_ca.is_some())
            && peer_identity.is_none()
        {
            return Err(ConfigError::BadValue {
                key: "tls-client-ca",
                message: "in cluster mode the listener then asks the other nodes for a \
                          certificate too: give this node's with --peer-tls-cert and \
                          --peer-tls-key (naming its node id as a DNS name)"
                    .into(),
            });
        }
        let peers_prove_identity =
            s.etcd.is_some() && tls.as_ref().is_some_and(|t| t.client_ca.is_some());
        if peers_prove_identity
            && let Some(node) = &s.node_id
            && rustls_pki_types::ServerName::try_from(node.as_str()).is_err()
        {
            return Err(ConfigError::BadValue {
                key: "node-id",
                message: format!(
                    "{node:?} cannot be named in a certificate as a DNS name, which mutual TLS \
                     between nodes checks: use letters, digits and hyphens"
                ),
            });
        }
        if let Some(advertise) = &s.advertise {
            let https = advertise.starts_with("https://");
            if tls.is_some() && !https {
                return Err(ConfigError::BadValue {
                    key: "advertise",
                    message: format!(
                        "{advertise} is plain HTTP but this node serves TLS (--tls-cert): \
                         advertise https://HOST:{}",
                        s.listen.port()
                    ),
                });
            }
        }
        let etcd_flags = s.etcd_ca.is_some()
            || s.etcd_cert.is_some()
            || s.etcd_key.is_some()
            || s.etcd_user.is_some()
            || s.etcd_password_file.is_some();
        let cluster = match (s.etcd, s.node_id) {
            (None, None)
                if s.advertise.is_none() && s.new_data_dir_for.is_none() && !etcd_flags =>
            {
                None
            }
            (None, _) => {
                return Err(ConfigError::BadValue {
                    key: "etcd",
                    message: "node-id, advertise, new-data-dir-for and the etcd-* settings only \
                              mean something in cluster mode: give --etcd too, or leave them out"
                        .into(),
                });
            }
            (Some(_), None) => {
                return Err(ConfigError::BadValue {
                    key: "node-id",
                    message: "cluster mode (--etcd) needs this node's id, stable across \
                              restarts, e.g. --node-id n1"
                        .into(),
                });
            }
            (Some(etcd), Some(node_id)) => {
                if s.advertise.is_none() && s.listen.ip().is_unspecified() {
                    return Err(ConfigError::BadValue {
                        key: "advertise",
                        message: format!(
                            "listening on {} gives peers no address to reach this node: \
                             give --advertise http://HOST:{}",
                            s.listen,
                            s.listen.port()
                        ),
                    });
                }
                if let Some(named) = s.new_data_dir_for.as_ref().filter(|n| **n != node_id) {
                    return Err(ConfigError::BadValue {
                        key: "new-data-dir-for",
                        message: format!(
                            "names node {named:?} but this is node {node_id:?}: it must name \
                             the node whose new data dir this is"
                        ),
                    });
                }
                let etcd_security = EtcdSecurity::resolve(
                    etcd.iter().all(|e| e.starts_with("https://")),
                    s.etcd_ca,
                    s.etcd_cert,
                    s.etcd_key,
                    s.etcd_user,
                    s.etcd_password_file,
                )?;
                Some(ClusterConfig {
                    peer_tls_ca: s.peer_tls_ca,
                    peer_identity,
                    peers_prove_identity,
                    etcd_security,
                    etcd,
                    name: s.cluster,
                    new_data_dir: s.new_data_dir_for.is_some(),
                    node_id,
                    advertise: s.advertise,
                    lease_ttl: ms(s.lease_ttl_ms),
                })
            }
        };
        Ok(Config {
            data_dir: s.data_dir,
            listen: s.listen,
            kafka_listen: s.kafka_listen,
            kafka_advertise: s.kafka_advertise,
            kafka_auto_create: (s.kafka_auto_create_partitions > 0)
                .then_some(s.kafka_auto_create_partitions),
            kafka_sasl: s.kafka_sasl.then_some(KafkaSaslConfig {
                plain: tls.is_some() || s.kafka_sasl_plain_without_tls,
            }),
            limits: Limits {
                max_record_bytes: s.max_record_bytes,
                max_request_bytes: s.max_request_bytes,
                max_plugin_bytes: s.max_plugin_bytes,
                max_batch_records: s.max_batch_records,
                max_fetch_records: s.max_fetch_records,
                max_fetch_bytes: s.max_fetch_bytes,
                max_wait: ms(s.max_wait_ms),
                max_buffered_request_bytes: s.max_buffered_request_bytes,
                max_buffered_peer_request_bytes: s.max_buffered_peer_request_bytes,
            },
            retention_check_interval: ms(s.retention_check_interval_ms),
            groups: GroupsConfig {
                initial_rebalance_delay: ms(s.group_initial_rebalance_delay_ms),
                offsets_retention: ms(s.group_offsets_retention_ms),
            },
            tls,
            idle_close_after: ms(s.idle_close_after_ms),
            failed_reopen_after: ms(s.failed_reopen_after_ms),
            segment_bytes: s.segment_bytes,
            original_frames: s.frame_format == 1,
            auth_token: s.auth_token_file,
            auth_reads: s.auth_reads,
            plugin_limits: narad_runtime::Limits {
                deadline: ms(s.plugin_deadline_ms),
                memory_bytes: s.plugin_memory_bytes,
                fuel: narad_runtime::FuelBudget {
                    per_record: s.plugin_fuel_per_record,
                    per_input_byte: s.plugin_fuel_per_input_byte,
                    ..narad_runtime::FuelBudget::DEFAULT
                },
                module: narad_runtime::ModuleLimits {
                    max_functions: s.plugin_max_functions,
                    max_function_body_bytes: s.plugin_max_function_bytes,
                    max_code_bytes: s.plugin_max_code_bytes,
                    max_locals_per_function: s.plugin_max_locals,
                    max_items: s.plugin_max_module_items,
                    max_data_bytes: s.plugin_max_data_bytes,
                },
                ..narad_runtime::Limits::default()
            },
            http: HttpLimits {
                max_connections: s.max_connections,
                header_read_timeout: ms(s.header_read_timeout_ms),
                idle_timeout: ms(s.idle_timeout_ms),
                shutdown_grace: ms(s.shutdown_grace_ms),
            },
            cluster,
        })
    }
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
    fn relative_paths_in_a_file_are_taken_from_the_files_directory_and_flags_from_the_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("narad.toml");
        std::fs::write(
            &file,
            "data-dir = \"data\"\ntls-cert = \"certs/node.pem\"\ntls-key = \"/abs/key.pem\"\n",
        )
        .unwrap();
        let loaded = FileConfig::load(&file).unwrap();
        assert_eq!(loaded.data_dir, Some(dir.path().join("data")));
        assert_eq!(loaded.tls_cert, Some(dir.path().join("certs/node.pem")));
        assert_eq!(loaded.tls_key, Some(PathBuf::from("/abs/key.pem")));
        // A flag is the operator's own path, from where the daemon starts.
        let args = ServeArgs {
            config: Some(file),
            data_dir: Some("here".into()),
            ..ServeArgs::default()
        };
        assert_eq!(
            Config::resolve(&args).unwrap().data_dir,
            PathBuf::from("here")
        );
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
    fn etcd_endpoints_are_all_http_or_all_https_and_tls_settings_need_https() {
        let err = check_etcd("http://127.0.0.1:2379,https://etcd.example:2379").unwrap_err();
        assert!(
            err.to_string().contains("mixes http:// and https://"),
            "{err}"
        );
        assert!(check_etcd("https://a:2379,https://b:2379").is_ok());
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("pw");
        std::fs::write(&password, "s3cret\n").unwrap();
        let ca = || Some(PathBuf::from("/ca.pem"));
        let resolve =
            |https, ca, cert: Option<&str>, key: Option<&str>, user: Option<&str>, file| {
                EtcdSecurity::resolve(
                    https,
                    ca,
                    cert.map(PathBuf::from),
                    key.map(PathBuf::from),
                    user.map(str::to_owned),
                    file,
                )
            };
        let ok = resolve(
            true,
            ca(),
            Some("/c"),
            Some("/k"),
            Some("narad"),
            Some(password.clone()),
        )
        .unwrap();
        assert_eq!(ok.user, Some(("narad".to_owned(), "s3cret".to_owned())));
        assert!(!format!("{ok:?}").contains("s3cret"));
        for (result, says) in [
            (
                resolve(true, None, None, None, None, None),
                "need --etcd-ca",
            ),
            (
                resolve(false, ca(), None, None, None, None),
                "are for https://",
            ),
            (
                resolve(true, ca(), Some("/c"), None, None, None),
                "needs --etcd-key",
            ),
            (
                resolve(true, ca(), None, None, Some("u"), None),
                "needs --etcd-password-file",
            ),
            (
                resolve(false, None, None, None, None, Some(password.clone())),
                "needs --etcd-user",
            ),
        ] {
            let err = result.unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
        assert_eq!(
            check_etcd("http://a:2379, http://b:2379").unwrap(),
            Some(vec!["http://a:2379".to_owned(), "http://b:2379".to_owned()])
        );
    }

    fn check_etcd(value: &str) -> Result<Option<Vec<String>>, ConfigError> {
        EtcdEndpoints::check("etcd", Some(value.to_owned()))
    }

    #[test]
    fn etcd_turns_cluster_mode_on_and_needs_a_node_id() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            etcd: Some("http://127.0.0.1:2379, http://127.0.0.1:2380".into()),
            node_id: Some("n1".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(
            config.cluster,
            Some(ClusterConfig {
                etcd: vec![
                    "http://127.0.0.1:2379".into(),
                    "http://127.0.0.1:2380".into()
                ],
                name: DEFAULT_CLUSTER.into(),
                node_id: "n1".into(),
                advertise: None,
                lease_ttl: Duration::from_millis(DEFAULT_LEASE_TTL_MS),
                new_data_dir: false,
                peer_tls_ca: None,
                etcd_security: EtcdSecurity::default(),
                peer_identity: None,
                peers_prove_identity: false,
            })
        );
        let new_dir = ServeArgs {
            new_data_dir_for: Some("n1".into()),
            ..args.clone()
        };
        let config = Config::merge(&new_dir, &FileConfig::default()).unwrap();
        assert!(config.cluster.is_some_and(|c| c.new_data_dir));
        let without_id = ServeArgs {
            node_id: None,
            ..args.clone()
        };
        let err = Config::merge(&without_id, &FileConfig::default()).unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadValue { key: "node-id", .. }),
            "{err}"
        );
        let id_alone = ServeArgs {
            etcd: None,
            ..args.clone()
        };
        let err = Config::merge(&id_alone, &FileConfig::default()).unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadValue { key: "etcd", .. }),
            "{err}"
        );
    }

    #[test]
    fn cluster_settings_are_checked() {
        let base = ServeArgs {
            data_dir: Some("/d".into()),
            etcd: Some("http://127.0.0.1:2379".into()),
            node_id: Some("n1".into()),
            ..ServeArgs::default()
        };
        for (args, key) in [
            (
                ServeArgs {
                    etcd: Some("127.0.0.1:2379".into()),
                    ..base.clone()
                },
                "etcd",
            ),
            (
                ServeArgs {
                    node_id: Some("Node 1".into()),
                    ..base.clone()
                },
                "node-id",
            ),
            (
                ServeArgs {
                    cluster: Some(String::new()),
                    ..base.clone()
                },
                "cluster",
            ),
            (
                ServeArgs {
                    advertise: Some("10.0.0.5:7070".into()),
                    ..base.clone()
                },
                "advertise",
            ),
            (
                ServeArgs {
                    listen: Some("0.0.0.0:7070".into()),
                    ..base.clone()
                },
                "advertise",
            ),
            // It must name this very node: a setting left in a shared file does not apply to
            // every node that reads it.
            (
                ServeArgs {
                    new_data_dir_for: Some("n2".into()),
                    ..base.clone()
                },
                "new-data-dir-for",
            ),
            (
                ServeArgs {
                    etcd: None,
                    node_id: None,
                    new_data_dir_for: Some("n1".into()),
                    ..base.clone()
                },
                "etcd",
            ),
        ] {
            let err = Config::merge(&args, &FileConfig::default()).unwrap_err();
            assert!(
                matches!(&err, ConfigError::BadValue { key: k, .. } if *k == key),
                "{key}: {err}"
            );
        }
        let advertised = ServeArgs {
            listen: Some("0.0.0.0:7070".into()),
            advertise: Some("http://10.0.0.5:7070/".into()),
            ..base
        };
        let config = Config::merge(&advertised, &FileConfig::default()).unwrap();
        assert_eq!(
            config.cluster.unwrap().advertise.as_deref(),
            Some("http://10.0.0.5:7070")
        );
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
    fn the_frame_format_is_1_or_2_and_1_writes_the_original_layout() {
        let with = |format: u32| {
            Config::merge(
                &ServeArgs {
                    data_dir: Some("/d".into()),
                    frame_format: Some(format),
                    ..ServeArgs::default()
                },
                &FileConfig::default(),
            )
        };
        assert!(with(1).unwrap().original_frames);
        assert!(!with(2).unwrap().original_frames);
        let defaults = Config::merge(
            &ServeArgs {
                data_dir: Some("/d".into()),
                ..ServeArgs::default()
            },
            &FileConfig::default(),
        )
        .unwrap();
        assert!(!defaults.original_frames);
        assert!(matches!(
            with(3).unwrap_err(),
            ConfigError::BadValue {
                key: "frame-format",
                ..
            }
        ));
    }

    #[test]
    fn tls_files_come_as_a_pair_a_client_ca_needs_them_and_a_tls_cluster_node_advertises_https() {
        let refused = |args: ServeArgs, key: &str| {
            let args = ServeArgs {
                data_dir: Some("/d".into()),
                ..args
            };
            match Config::merge(&args, &FileConfig::default()) {
                Err(ConfigError::BadValue { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}: {other:?}"),
            }
        };
        refused(
            ServeArgs {
                tls_cert: Some("/c.pem".into()),
                ..ServeArgs::default()
            },
            "tls-key",
        );
        refused(
            ServeArgs {
                tls_key: Some("/k.pem".into()),
                ..ServeArgs::default()
            },
            "tls-cert",
        );
        refused(
            ServeArgs {
                tls_client_ca: Some("/ca.pem".into()),
                ..ServeArgs::default()
            },
            "tls-client-ca",
        );
        let cluster_tls = || ServeArgs {
            tls_cert: Some("/c.pem".into()),
            tls_key: Some("/k.pem".into()),
            etcd: Some("http://127.0.0.1:2379".into()),
            node_id: Some("n1".into()),
            ..ServeArgs::default()
        };
        refused(
            ServeArgs {
                advertise: Some("http://10.0.0.1:7070".into()),
                ..cluster_tls()
            },
            "advertise",
        );
        refused(
            ServeArgs {
                tls_client_ca: Some("/ca.pem".into()),
                ..cluster_tls()
            },
            "tls-client-ca",
        );
        refused(
            ServeArgs {
                peer_tls_ca: Some("/ca.pem".into()),
                ..ServeArgs::default()
            },
            "peer-tls-ca",
        );
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            peer_tls_ca: Some("/ca.pem".into()),
            ..cluster_tls()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(
            config.cluster.and_then(|c| c.peer_tls_ca),
            Some(PathBuf::from("/ca.pem"))
        );
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            tls_cert: Some("/c.pem".into()),
            tls_key: Some("/k.pem".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(
            config.tls,
            Some(crate::tls::TlsFiles {
                cert: "/c.pem".into(),
                key: "/k.pem".into(),
                client_ca: None
            })
        );
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
    fn the_peers_body_budget_defaults_and_is_refused_below_two_of_the_largest_call() {
        let args = ServeArgs {
            data_dir: Some("/d".into()),
            ..ServeArgs::default()
        };
        let config = Config::merge(&args, &FileConfig::default()).unwrap();
        assert_eq!(
            config.limits.max_buffered_peer_request_bytes,
            DEFAULT_MAX_BUFFERED_PEER_REQUEST_BYTES
        );
        let file = FileConfig::parse(
            Path::new("narad.toml"),
            &format!("max-buffered-peer-request-bytes = {MIN_BUFFERED_PEER_REQUEST_BYTES}\n"),
        )
        .unwrap();
        let config = Config::merge(&args, &file).unwrap();
        assert_eq!(
            config.limits.max_buffered_peer_request_bytes,
            MIN_BUFFERED_PEER_REQUEST_BYTES
        );
        let small = ServeArgs {
            max_buffered_peer_request_bytes: Some(MIN_BUFFERED_PEER_REQUEST_BYTES - 1),
            ..args
        };
        let err = Config::merge(&small, &FileConfig::default()).unwrap_err();
        assert!(
            err.to_string().contains("max-buffered-peer-request-bytes"),
            "{err}"
        );
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

    /// The `narad serve` flags as clap builds them (the same arguments `--help` lists).
    fn serve_command() -> clap::Command {
        <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"))
    }

    /// The keys the config file accepts, from serde's own list (an unknown key's error names
    /// them all), so the check reads the real schema, not the table that generates it.
    fn file_keys() -> Vec<String> {
        let Err(ConfigError::ParseFile { message, .. }) =
            FileConfig::parse(Path::new("narad.toml"), "not-a-key = 1\n")
        else {
            panic!("an unknown key must be refused");
        };
        let (_, expected) = message
            .split_once("expected one of")
            .unwrap_or_else(|| panic!("no key list in {message:?}"));
        let line = expected.lines().next().unwrap_or_default();
        line.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// `--flag` and the value its help shows as default (`1048576` of `1048576 (1 MiB)`), or
    /// `None` when the help shows no default.
    fn shown_defaults() -> Vec<(String, Option<String>)> {
        serve_command()
            .get_arguments()
            .map(|arg| {
                let long = arg.get_long().expect("every serve setting is a --flag");
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                let shown = help.split_once("[default: ").map(|(_, rest)| {
                    let shown = rest.split(']').next().unwrap_or(rest);
                    shown.split(" (").next().unwrap_or(shown).to_owned()
                });
                (long.to_owned(), shown)
            })
            .collect()
    }

    #[test]
    fn every_serve_flag_has_a_narad_env_var_and_a_file_key_of_its_name_and_every_key_a_flag() {
        let mut flags = Vec::new();
        for arg in serve_command().get_arguments() {
            let long = arg.get_long().expect("every serve setting is a --flag");
            let env = arg.get_env().and_then(|e| e.to_str());
            let expected = format!("NARAD_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                env,
                Some(expected.as_str()),
                "environment variable of --{long}"
            );
            // `--config` names the file itself, so the file has no key for it.
            if long != "config" {
                flags.push(long.to_owned());
            }
        }
        // `--log-format` is a flag of every command (logging starts before the daemon's
        // settings are read); the file may set it for `narad serve`.
        flags.push("log-format".to_owned());
        let mut keys = file_keys();
        flags.sort();
        keys.sort();
        assert_eq!(
            flags, keys,
            "flags of `narad serve` vs keys of the config file"
        );
    }

    #[test]
    fn the_default_each_flag_help_shows_is_what_resolve_uses_when_nothing_is_set() {
        let resolve = |extra: &[&str]| {
            let argv = ["serve", "--data-dir", "/d"]
                .into_iter()
                .chain(extra.iter().copied());
            let matches = serve_command()
                .try_get_matches_from(argv)
                .unwrap_or_else(|e| panic!("{extra:?}: {e}"));
            let args = <ServeArgs as clap::FromArgMatches>::from_arg_matches(&matches)
                .unwrap_or_else(|e| panic!("{extra:?}: {e}"));
            Config::resolve(&args).unwrap_or_else(|e| panic!("{extra:?}: {e}"))
        };
        let nothing = resolve(&[]);
        assert_eq!(nothing, Config::new("/d"));
        let mut described = Vec::new();
        for (long, shown) in shown_defaults() {
            let Some(shown) = shown else {
                // The file, and the one setting without which the daemon does not start.
                assert!(
                    matches!(long.as_str(), "config" | "data-dir"),
                    "--{long} shows no default"
                );
                continue;
            };
            if shown.starts_with(|c: char| c.is_ascii_digit()) {
                let flag = format!("--{long}");
                assert_eq!(
                    resolve(&[&flag, &shown]),
                    nothing,
                    "--{long}: the help says the default is {shown}, resolve uses another"
                );
            } else {
                described.push(long);
            }
        }
        // Defaults that are not a value: unset means no token, and a cap derived at start.
        assert_eq!(
            described,
            [
                "kafka-listen",
                "kafka-advertise",
                "kafka-sasl",
                "kafka-sasl-plain-without-tls",
                "etcd",
                "cluster",
                "node-id",
                "advertise",
                "etcd-ca",
                "etcd-cert",
                "etcd-key",
                "etcd-user",
                "etcd-password-file",
                "new-data-dir-for",
                "auth-token-file",
                "auth-reads",
                "tls-cert",
                "tls-key",
                "peer-tls-ca",
                "peer-tls-cert",
                "peer-tls-key",
                "tls-client-ca",
                "max-connections"
            ]
        );
        assert!(nothing.auth_token.is_none());
        assert_eq!(nothing.http.max_connections, None);
    }

    #[test]
    fn the_operator_guide_lists_every_flag_with_its_env_var_file_key_and_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operator-guide.md");
        let guide =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The configuration table's rows: | `--flag VALUE` | `NARAD_X` | `key` | default | ... |
        let rows: Vec<Vec<&str>> = guide
            .lines()
            .filter(|line| line.starts_with("| `--"))
            .map(|line| {
                line.split('|')
                    .map(|cell| cell.trim().trim_matches('`'))
                    .collect()
            })
            .collect();
        for (long, shown) in shown_defaults() {
            let flag = format!("--{long}");
            let row = rows
                .iter()
                .find(|row| row.get(1).and_then(|c| c.split(' ').next()) == Some(flag.as_str()))
                .unwrap_or_else(|| panic!("docs/operator-guide.md has no row for {flag}"));
            let env = format!("NARAD_{}", long.to_uppercase().replace('-', "_"));
            let key = if long == "config" { "-" } else { long.as_str() };
            assert_eq!(
                row.get(2),
                Some(&env.as_str()),
                "environment variable of {flag}"
            );
            assert_eq!(row.get(3), Some(&key), "config key of {flag}");
            if let Some(shown) = shown.filter(|s| s.starts_with(|c: char| c.is_ascii_digit())) {
                let documented = row.get(4).copied().unwrap_or_default();
                assert!(
                    documented.starts_with(&shown),
                    "{flag}: the guide says the default is {documented:?}, the help {shown}"
                );
            }
        }
    }
}
