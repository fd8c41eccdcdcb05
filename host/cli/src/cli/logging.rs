//! Log output: `tracing` events to stderr, filtered by `RUST_LOG` (default: `info` for the
//! daemon, `warn` for client commands so their stdout stays clean), as text for people or one
//! JSON object per line for log shippers (`--log-format json`).

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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
