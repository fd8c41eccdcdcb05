//! `narad`: the fan-out host daemon and its command-line client.

use clap::Parser as _;
use narad_cli::cli::{Cli, Command};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    narad_cli::allocator::tune();
    let cli = Cli::parse();
    // The daemon logs at info; client commands only warn, so their stdout stays clean.
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    let format = match narad_cli::cli::logging::format_of(&cli) {
        Ok(format) => format,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    narad_cli::cli::logging::init(format, default_level);
    match narad_cli::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", narad_cli::cli::human::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
