//! The `narad` command line: `serve` runs the daemon; the other commands are a thin client
//! over the HTTP API (`--url` / `NARAD_URL`), with human tables by default and `--json` for
//! scripts. A server error prints the server's message and exits non-zero.
//!
//! - [`client`]: the HTTP client; [`table`]: text tables; [`duration`]: `10s`-style flags;
//!   [`human`]: plurals and RFC 3339 times for the tables;
//! - [`topic`], [`produce`], [`consume`], [`child`]: the client commands; [`demo`]: `narad demo`;
//! - [`completions`]: shell completion scripts; [`logging`]: `RUST_LOG` and `--log-format`;
//! - [`plugin`]: `narad plugin deploy|list|remove` and the local `narad plugin test`;
//! - [`serve`]: `narad serve`.
//! - [`bench`](mod@bench): `narad bench produce|fanout`, the end-to-end benchmarks.
//! - [`admin`]: `narad admin set-aside ...` and `narad admin rebuild-metastore`.

/// `println!` for a command's output that gives back the write's error instead of panicking:
/// with `?`, a reader that went away (`narad topic list | head -1`) ends the command quietly
/// ([`run`] treats a broken pipe as success), as it would end `cat`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}

/// `print!` for a command's output, like [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*)
    }};
}

pub mod acl;
pub mod admin;
pub mod bench;
pub mod child;
pub mod client;
pub mod completions;
pub mod consume;
pub mod demo;
pub mod duration;
pub mod group;
pub mod human;
pub mod logging;
pub mod node;
pub mod partition;
pub mod plugin;
pub mod produce;
pub mod serve;
pub mod shadow;
pub mod table;
pub mod topic;
pub mod user;

use clap::{Args, Parser, Subcommand};

use narad_host::config::ServeArgs;

/// Narad: a fan-out host. Run the daemon with `narad serve`, then manage topics and move
/// records with the other commands.
#[derive(Debug, Parser)]
#[command(
    name = "narad",
    version,
    after_help = "Run `narad serve --help` for the daemon's flags, their environment variables and defaults,\nand `narad <COMMAND> --help` for any other command."
)]
pub struct Cli {
    /// Log line format (logs go to stderr; `RUST_LOG` sets the level, e.g. `RUST_LOG=debug`);
    /// default: the `log-format` of `narad serve`'s config file, else text.
    #[arg(long, env = "NARAD_LOG_FORMAT", value_enum, global = true)]
    pub log_format: Option<logging::LogFormat>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the flags of `serve` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run the daemon: HTTP API, partition logs, metastore.
    Serve(ServeArgs),
    /// Create, list, describe, grow and delete topics.
    Topic(topic::TopicArgs),
    /// Produce records from stdin to a topic: one per line, the line is the value (`-K DELIM`
    /// for `key<DELIM>value`, `--json` for JSON records).
    Produce(produce::ProduceArgs),
    /// Print a topic's records, every partition by default: values one per line, `--format`
    /// for kcat-style output, `--json` for JSON records that `produce --json` takes back.
    Consume(consume::ConsumeArgs),
    /// The main job end to end: an in-process daemon, a parent with three children (default
    /// chain, delay, header-route), a steady stream of records, a live table, and a check of
    /// every child against the parent.
    Demo(demo::DemoArgs),
    /// Deploy, list and remove routing plugins; try a chain locally with `plugin test`.
    Plugin(plugin::PluginArgs),
    /// Attach, detach, list and re-route fan-out children of a topic.
    Child(child::ChildArgs),
    /// Repair: directories set aside at start (list, adopt, purge) and rebuilding a lost
    /// metastore from the data dir.
    Admin(admin::AdminArgs),
    /// List the live nodes of a cluster, or drain one (cluster mode: narad serve --etcd ...).
    Node(node::NodeArgs),
    /// List the Kafka consumer groups, or show one's members, offsets and lag.
    Group(group::GroupArgs),
    /// Move a partition to another node (cluster mode).
    Partition(partition::PartitionArgs),
    /// Create, list and delete the users Kafka clients authenticate as (SASL), and change
    /// their passwords.
    User(user::UserArgs),
    /// Add, list and remove the ACL rules Kafka clients are held to.
    Acl(acl::AclArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// Measure the log and the fan-out against raw write + fdatasync loops (runs in-process
    /// on a scratch directory; no daemon needed).
    Bench(bench::BenchArgs),
}

/// Where the daemon is and how to print answers; shared by the client commands.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Base URL of the daemon.
    #[arg(long, env = "NARAD_URL", default_value = client::DEFAULT_URL, global = true)]
    pub url: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Bearer token sent with every call (needed for changes when the daemon runs with
    /// --auth-token-file).
    #[arg(long, env = "NARAD_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Log in as this user (`narad user create`) instead of sending the token: the daemon
    /// (with --auth-token-file, over https://) holds the user to the ACLs. Needs
    /// --login-password-file.
    #[arg(long, env = "NARAD_LOGIN", global = true, value_name = "USER")]
    pub login: Option<String>,
    /// File holding the --login user's password (one trailing newline is dropped; `-`: stdin).
    #[arg(
        long,
        env = "NARAD_LOGIN_PASSWORD_FILE",
        global = true,
        value_name = "FILE"
    )]
    pub login_password_file: Option<std::path::PathBuf>,
    /// PEM certificate(s) of the CA that signed the daemon's TLS certificate, trusted beside
    /// the system's CAs (for an https:// URL and a private CA).
    #[arg(long, env = "NARAD_TLS_CA", global = true, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate (chain) to present, for a daemon started with
    /// --tls-client-ca; needs --tls-client-key.
    #[arg(
        long,
        env = "NARAD_TLS_CLIENT_CERT",
        global = true,
        value_name = "FILE",
        requires = "tls_client_key"
    )]
    pub tls_client_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-client-cert.
    #[arg(
        long,
        env = "NARAD_TLS_CLIENT_KEY",
        global = true,
        value_name = "FILE",
        requires = "tls_client_cert"
    )]
    pub tls_client_key: Option<std::path::PathBuf>,
}

impl ClientArgs {
    /// A client for the daemon at `--url`, sending `--token` when given and trusting the
    /// `--tls-ca` CA; fails when that file cannot be used.
    pub fn client(&self) -> Result<client::Client, client::ApiCallError> {
        let login = match (&self.login, &self.login_password_file) {
            (None, None) => None,
            (Some(_), _) if self.token.as_ref().is_some_and(|t| !t.is_empty()) => {
                return Err(client::ApiCallError::Login {
                    reason: "give --token or --login, not both".to_owned(),
                });
            }
            (Some(user), Some(file)) => Some((
                user.clone(),
                user::read_password(file).map_err(|e| client::ApiCallError::Login {
                    reason: format!("{e:#}"),
                })?,
            )),
            (Some(_), None) => {
                return Err(client::ApiCallError::Login {
                    reason: "--login needs --login-password-file FILE".to_owned(),
                });
            }
            (None, Some(_)) => {
                return Err(client::ApiCallError::Login {
                    reason: "--login-password-file needs --login USER".to_owned(),
                });
            }
        };
        client::Client::new(&self.url)
            .with_token(self.token.clone())
            .with_login(login)
            .with_tls(&client::TlsOptions {
                ca: self.tls_ca.clone(),
                identity: self
                    .tls_client_cert
                    .clone()
                    .zip(self.tls_client_key.clone()),
            })
    }
}

/// Runs a parsed command line.
///
/// A client command whose stdout was closed by its reader (`narad consume t | head`) stops
/// quietly with success, as `cat` would; a daemon that cannot be reached is reported in one
/// line, without the callers' context or the transport's chain of causes.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let serve = matches!(cli.command, Command::Serve(_));
    let result = run_command(cli).await;
    match result {
        Err(e) if !serve && is_broken_pipe(&e) => Ok(()),
        Err(e) if !serve => Err(unreachable_alone(e)),
        other => other,
    }
}

/// True when `e` comes from writing to a pipe whose reader has gone.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The "cannot reach narad" error on its own when `e` is one, else `e` unchanged.
fn unreachable_alone(e: anyhow::Error) -> anyhow::Error {
    let alone = e.chain().find_map(|cause| match cause.downcast_ref() {
        Some(unreachable @ client::ApiCallError::Unreachable { .. }) => {
            Some(anyhow::anyhow!("{unreachable}"))
        }
        _ => None,
    });
    alone.unwrap_or(e)
}

async fn run_command(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Topic(args) => topic::run(args).await,
        Command::Node(args) => node::run(args).await,
        Command::Group(args) => group::run(args).await,
        Command::Partition(args) => partition::run(args).await,
        Command::User(args) => user::run(args).await,
        Command::Acl(args) => acl::run(args).await,
        Command::Produce(args) => produce::run(args).await,
        Command::Consume(args) => consume::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Plugin(args) => plugin::run(args).await,
        Command::Child(args) => child::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Admin(args) => admin::run(args).await,
        Command::Completions(args) => completions::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn a_closed_pipe_is_found_under_any_context() {
        let e = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing records");
        assert!(is_broken_pipe(&e));
        assert!(!is_broken_pipe(&anyhow::anyhow!("broken pipe")));
    }

    #[test]
    fn an_unreachable_daemon_is_reported_without_the_callers_context() {
        let e: anyhow::Error = Err::<(), _>(client::ApiCallError::Unreachable {
            base: "http://127.0.0.1:9".into(),
        })
        .context("fetching t partition 0")
        .unwrap_err();
        assert_eq!(
            format!("{:#}", unreachable_alone(e)),
            "cannot reach narad at http://127.0.0.1:9: is `narad serve` running? (--url / NARAD_URL)"
        );
    }
}
