//! The `narad` command line: `serve` runs the daemon; the other commands are a thin client
//! over the HTTP API (`--url` / `NARAD_URL`), with human tables by default and `--json` for
//! scripts. A server error prints the server's message and exits non-zero.
//!
//! - [`client`]: the HTTP client; [`table`]: text tables; [`duration`]: `10s`-style flags;
//! - [`topic`], [`produce`], [`consume`], [`child`]: the client commands; [`demo`]: `narad demo`;
//! - [`completions`]: shell completion scripts; [`logging`]: `RUST_LOG` and `--log-format`;
//! - [`plugin`]: `narad plugin deploy|list|remove` and the local `narad plugin test`;
//! - [`serve`]: `narad serve`.
//! - [`bench`]: `narad bench produce|fanout`, the end-to-end benchmarks.
//! - [`admin`]: `narad admin set-aside ...` and `narad admin rebuild-metastore`.

pub mod admin;
pub mod bench;
pub mod child;
pub mod client;
pub mod completions;
pub mod consume;
pub mod demo;
pub mod duration;
pub mod logging;
pub mod plugin;
pub mod produce;
pub mod serve;
pub mod table;
pub mod topic;

use clap::{Args, Parser, Subcommand};

use crate::config::ServeArgs;

/// Narad: a fan-out host. Run the daemon with `narad serve`, then manage topics and move
/// records with the other commands.
#[derive(Debug, Parser)]
#[command(
    name = "narad",
    version,
    after_help = "Run `narad serve --help` for the daemon's flags, their environment variables and defaults,\nand `narad <COMMAND> --help` for any other command."
)]
pub struct Cli {
    /// Log line format (logs go to stderr; `RUST_LOG` sets the level, e.g. `RUST_LOG=debug`).
    #[arg(long, env = "NARAD_LOG_FORMAT", value_enum, default_value_t = logging::LogFormat::Text, global = true)]
    pub log_format: logging::LogFormat,
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
    /// Produce NDJSON records from stdin to a topic.
    Produce(produce::ProduceArgs),
    /// Print a partition's records as NDJSON.
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
}

impl ClientArgs {
    /// A client for the daemon at `--url`, sending `--token` when given.
    pub fn client(&self) -> client::Client {
        client::Client::new(&self.url).with_token(self.token.clone())
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Topic(args) => topic::run(args).await,
        Command::Produce(args) => produce::run(args).await,
        Command::Consume(args) => consume::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Plugin(args) => plugin::run(args).await,
        Command::Child(args) => child::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Admin(args) => admin::run(args).await,
        Command::Completions(args) => {
            completions::run(&args);
            Ok(())
        }
    }
}
