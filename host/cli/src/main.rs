//! `narad`: the fan-out host daemon and its command-line client.

use clap::Parser as _;
use narad_cli::cli::{Cli, Command};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    return_large_frees_to_the_system();
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

/// Buffers of 8 MiB and more (a stored frame read whole, which a slab pins while it is
/// copied) go back to the system when freed. glibc's default raises its mmap threshold to the
/// size of each such buffer freed, after which they come from the heap and stay there: a node
/// whose cursors stalled on a dead child owner kept the memory of their first reads, 63 MiB
/// per cursor where they hold 7.5 (`narad bench fanout --stalled-cursors`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_large_frees_to_the_system() {
    const THRESHOLD: libc::c_int = 8 << 20;
    // SAFETY: mallopt sets one allocator parameter (under the allocator's own lock) and
    // touches no memory of ours.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
    }
}

/// Other allocators return large frees as they see fit.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_frees_to_the_system() {}
