//! Log output: `tracing` events to stderr, filtered by `RUST_LOG` (default: `info` for the
//! daemon, `warn` for client commands so their stdout stays clean), as text for people or one
//! JSON object per line for log shippers (`--log-format json`). Text is coloured only when
//! stderr is a terminal (and `NO_COLOR` is unset): a file or a pipe gets plain text.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// The log format `cli` asks for: its flag (or `NARAD_LOG_FORMAT`), else the `log-format`
/// of `narad serve`'s config file, else text. An error names the file and the value.
pub fn format_of(cli: &super::Cli) -> Result<LogFormat, String> {
    if let Some(format) = cli.log_format {
        return Ok(format);
    }
    let super::Command::Serve(args) = &cli.command else {
        return Ok(LogFormat::Text);
    };
    let Some(path) = &args.config else {
        return Ok(LogFormat::Text);
    };
    // A file that cannot be read is reported by the daemon's own start, with its reason.
    let Ok(Some(format)) = narad_host::config::file_log_format(path) else {
        return Ok(LogFormat::Text);
    };
    <LogFormat as clap::ValueEnum>::from_str(&format, true).map_err(|_| {
        format!(
            "{}: log-format = {format:?} is not a log format: use \"text\" or \"json\"",
            path.display()
        )
    })
}

/// Whether [`init`] installed JSON output.
static JSON: AtomicBool = AtomicBool::new(false);

/// Whether log lines are JSON objects (set by [`init`]).
pub fn is_json() -> bool {
    JSON.load(Ordering::Relaxed)
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
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
