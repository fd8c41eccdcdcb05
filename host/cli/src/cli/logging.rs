//! Log output: `tracing` events to stderr, filtered by `RUST_LOG` (default: `info` for the
//! daemon, `warn` for client commands so their stdout stays clean), as text for people or one
//! JSON object per line for log shippers (`--log-format json`). Text is coloured only when
//! stderr is a terminal (and `NO_COLOR` is unset): a file or a pipe gets plain text.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// Installs the global subscriber. `default_level` applies when `RUST_LOG` is unset or
/// invalid.
pub fn init(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
