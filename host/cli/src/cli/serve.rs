//! `narad serve`: resolve the configuration, start the daemon, stop on SIGINT/SIGTERM.

use std::io::Write as _;

use anyhow::Context as _;

use narad_host::config::{Config, ServeArgs};
use narad_host::server::run_server;
use narad_host::shutdown;

/// Runs the daemon until SIGINT or SIGTERM, then shuts down gracefully.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::resolve(&args).context("invalid configuration")?;
    // Before anything opens files: connections, segments and cursor files share this limit,
    // and the default connection cap is derived from it.
    narad_host::fdlimit::raise_to_hard();
    // Installed before the start is announced: a SIGTERM sent as soon as the "listening"
    // line appears stops the daemon gracefully instead of ending it by the default action.
    let mut stop_signals =
        shutdown::StopSignals::install().context("cannot listen for SIGTERM and SIGINT")?;
    let (trigger, signal) = shutdown::channel();
    let server = run_server(config.clone(), signal).await.with_context(|| {
        format!(
            "cannot start narad on data dir {}",
            config.data_dir.display()
        )
    })?;
    let url = format!(
        "{}://{}",
        if config.tls.is_some() {
            "https"
        } else {
            "http"
        },
        server.local_addr()
    );
    // Written whatever RUST_LOG filters (scripts wait for it), as a log line of the format in
    // use: with JSON logs, a JSON object like the others, so a shipper reads every line.
    let line = if super::logging::is_json() {
        serde_json::json!({
            "timestamp": super::human::rfc3339_utc(now_ms()),
            "level": "INFO",
            "fields": {"message": format!("narad listening on {url}"), "url": url},
            "target": "narad",
        })
        .to_string()
    } else {
        format!("narad listening on {url}")
    };
    // Not eprintln!: a closed stderr (`narad serve 2>&1 | head`) must not stop the daemon.
    let _ = writeln!(std::io::stderr(), "{line}");
    tokio::spawn(async move {
        let name = stop_signals.next().await;
        tracing::info!(signal = name, "shutting down");
        trigger.trigger();
    });
    server.wait().await.context("narad stopped with an error")
}

/// Now, in ms since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
