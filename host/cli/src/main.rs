//! `narad`: the fan-out host daemon and its command-line client.

use clap::Parser as _;
use narad_cli::cli::{Cli, Command};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The daemon logs at info; client commands only warn, so their stdout stays clean.
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    narad_cli::cli::logging::init(cli.log_format, default_level);
    match narad_cli::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", narad_cli::cli::human::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
