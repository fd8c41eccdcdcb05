//! The daemon's HTTP/1.1 server: an accept loop over hyper with a connection cap, a
//! header-read timeout, an idle keep-alive timeout and a shutdown that ends within a bound.
//!
//! Why not `axum::serve`: it has no connection cap and no timeouts, so slow-header clients and
//! idle sockets are held forever (and exhaust the descriptor limit), and its graceful shutdown
//! waits for every connection, so one client holding a socket open keeps the daemon from
//! exiting. Here:
//! - at most `max_connections` connections are served; one over the cap is accepted, answered
//!   a fixed `503` (with `Retry-After`) and closed at once, and counted;
//! - a request head must arrive within `header_read_timeout` of the connection's start or of
//!   the end of the previous answer (hyper's own timer), else the connection is closed;
//! - a connection with no request in progress and no byte moving for `idle_timeout` is closed.
//!   A long-poll in progress is a request in progress, so it is never idle;
//! - on shutdown the listener closes first, idle connections close at once, requests in
//!   progress finish (long-polls see the same shutdown signal and answer at once) and get
//!   `Connection: close`; after `shutdown_grace` the connections still open are dropped, so the
//!   server always returns.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::shutdown::ShutdownSignal;
use crate::tls::ServerTls;

/// How long the accept loop pauses after an accept error that is not about one connection
/// (out of descriptors, out of memory): 100 ms, long enough not to spin on a listener that
/// stays readable, short enough that service resumes quickly once descriptors free up.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// Least time between two warnings about accept errors, in seconds, so a descriptor shortage
/// does not flood the log with ten lines a second.
const ACCEPT_ERROR_LOG_EVERY_SECS: u64 = 10;

/// Seconds a client refused for the connection cap is asked to wait (`Retry-After`):
/// connections come and go within seconds (the idle timeout is 5 s by default).
pub(crate) const REFUSAL_RETRY_AFTER_SECS: u64 = 1;

/// The connection cap, timeouts and shutdown bound of [`serve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServeOptions {
    /// Most connections served at once; more are answered 503 and closed.
    pub(crate) max_connections: u32,
    /// Time to receive a complete request head.
    pub(crate) header_read_timeout: Duration,
    /// Time a connection may sit with no request in progress and no byte moving.
    pub idle_timeout: Duration,
    /// Longest wait for open connections after shutdown is asked for.
    pub(crate) shutdown_grace: Duration,
}

/// Why the daemon closed a connection on its own (label of
/// `narad_http_connections_closed_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloseLabels {
    /// `header_timeout`, `idle_timeout` or `shutdown` (dropped after the grace period).
    pub reason: &'static str,
}

/// Every `reason` of `narad_http_connections_closed_total`.
const CLOSE_REASONS: [&str; 3] = ["header_timeout", "idle_timeout", "shutdown"];

/// The server's own series.
#[derive(Debug, Default)]
pub(crate) struct HttpMetrics {
    /// `narad_http_connections`: connections being served now.
    pub open: Gauge,
    /// `narad_http_connections_refused_total`: connections answered 503 and closed because the
    /// cap was reached.
    pub refused: Counter,
    /// `narad_http_connections_closed_total{reason}`: connections the daemon closed itself.
    pub closed: Family<CloseLabels, Counter>,
}

impl HttpMetrics {
    /// Registers every series in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "narad_http_connections",
            "HTTP connections being served now",
            self.open.clone(),
        );
        registry.register(
            "narad_http_connections_refused",
            "HTTP connections answered 503 and closed because max-connections were open",
            self.refused.clone(),
        );
        // Every reason starts at 0, so the series exist (and rate() works) before the first
        // close of each kind.
        for reason in CLOSE_REASONS {
            drop(self.closed.get_or_create(&CloseLabels { reason }));
        }
        registry.register(
            "narad_http_connections_closed",
            "HTTP connections the daemon closed itself: slow request head, idle, or still open when the shutdown grace ran out",
            self.closed.clone(),
        );
    }

    fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&CloseLabels { reason }).inc();
    }
}

/// Serves `app` on `listener` until `shutdown` fires, then shuts down as the module doc says.
/// Returns once every connection is closed, at most `shutdown_grace` after the signal (plus
/// the time to abort the connection tasks).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    shutdown: ShutdownSignal,
    metrics: Arc<HttpMetrics>,
    tls: Option<Arc<ServerTls>>,
) {
    let slots = Arc::new(Semaphore::new(options.max_connections as usize));
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut last_accept_warning: Option<Instant> = None;
    tracing::info!(
        max_connections = options.max_connections,
        header_read_timeout_ms = options.header_read_timeout.as_millis() as u64,
        idle_timeout_ms = options.idle_timeout.as_millis() as u64,
        shutdown_grace_ms = options.shutdown_grace.as_millis() as u64,
        "HTTP server limits"
    );
    loop {
        // Reap finished connection tasks so the set does not grow with every connection ever.
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = shutdown.wait() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                let now = Instant::now();
                let due = last_accept_warning.is_none_or(|at| {
                    now.duration_since(at) >= Duration::from_secs(ACCEPT_ERROR_LOG_EVERY_SECS)
                });
                if due {
                    last_accept_warning = Some(now);
                    tracing::warn!(error = %e, "cannot accept HTTP connections (out of descriptors?); retrying");
                }
                tokio::select! {
                    () = shutdown.wait() => break,
                    () = tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)) => {}
                }
                continue;
            }
        };
        match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => {
                connections.spawn(connection(
                    stream,
                    app.clone(),
                    options.clone(),
                    drain_rx.clone(),
                    slot,
                    Arc::clone(&metrics),
                    tls.clone(),
                ));
            }
            Err(_) => {
                metrics.refused.inc();
                // A TLS client could not read a plain answer: it is closed without one.
                if tls.is_none() {
                    refuse(stream);
                }
            }
        }
    }
    // Stop accepting first: new clients get "connection refused" instead of a silent backlog.
    drop(listener);
    drain_tx.send_replace(true);
    let open = connections.len();
    let drained = tokio::time::timeout(options.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        let left = connections.len();
        tracing::warn!(
            connections = left,
            grace_ms = options.shutdown_grace.as_millis() as u64,
            "HTTP connections still open when the shutdown grace ran out; dropping them"
        );
        for _ in 0..left {
            metrics.closed("shutdown");
        }
        connections.shutdown().await;
    } else if open > 0 {
        tracing::debug!(
            connections = open,
            "HTTP connections finished after shutdown"
        );
    }
}

/// Accept errors that concern one connection (it went away before we took it), after which the
/// listener works on.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The whole answer to a connection over the cap.
static REFUSAL: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let body =
        "{\"error\":\"too many connections to this daemon (max-connections); retry shortly\"}";
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {REFUSAL_RETRY_AFTER_SECS}\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Answers a connection over the cap without waiting on it: whatever it sent already is read
/// and discarded (closing a socket with unread data would reset it and could lose the
/// answer), the fixed 503 goes into the empty send buffer in one non-blocking write, and the
/// socket closes when dropped.
fn refuse(stream: TcpStream) {
    let mut sink = [0u8; 4096];
    // At most 64 KiB, so a client that keeps sending cannot keep the accept loop here.
    for _ in 0..16 {
        match stream.try_read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    let _ = stream.try_write(&REFUSAL);
}

/// What the idle timer of one connection watches.
#[derive(Debug)]
struct Activity {
    /// When the connection was accepted; `last_io_ms` counts from here.
    start: Instant,
    /// Milliseconds after `start` of the last byte read or written, or request answered.
    last_io_ms: AtomicU64,
    /// Requests handed to the router whose answer is not ready yet.
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_io_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_io_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// When the connection becomes idle if nothing happens meanwhile.
    fn idle_at(&self, idle_timeout: Duration) -> Instant {
        self.start + Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed)) + idle_timeout
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }
}

/// Serves one connection until it ends, its idle timer fires, or the shutdown drain closes it.
/// Holds its cap `slot` until then. Over TLS, the handshake must end within the header-read
/// timeout, like the request head it precedes.
async fn connection(
    stream: TcpStream,
    app: Router,
    options: ServeOptions,
    drain: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
    metrics: Arc<HttpMetrics>,
    tls: Option<Arc<ServerTls>>,
) {
    metrics.open.inc();
    let _open = OpenGuard(&metrics);
    // Small JSON answers go out at once instead of waiting for Nagle's timer.
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let watched = Watched {
        inner: stream,
        activity: Arc::clone(&activity),
    };
    let Some(tls) = tls else {
        return serve_io(
            TokioIo::new(watched),
            app,
            options,
            drain,
            &metrics,
            activity,
            None,
        )
        .await;
    };
    let handshake =
        tokio::time::timeout(options.header_read_timeout, tls.acceptor().accept(watched)).await;
    match handshake {
        Ok(Ok(stream)) => {
            // The client's certificate (checked against --tls-client-ca by the handshake), for
            // the routes that ask whose it is.
            let certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| crate::tls::ClientCertificate(Arc::new(leaf.as_ref().to_vec())));
            serve_io(
                TokioIo::new(stream),
                app,
                options,
                drain,
                &metrics,
                activity,
                certificate,
            )
            .await;
        }
        Ok(Err(e)) => {
            tls.metrics().handshake_failed("http");
            tracing::debug!(error = %e, "HTTP TLS handshake failed");
        }
        Err(_) => {
            tls.metrics().handshake_failed("http");
            metrics.closed("header_timeout");
        }
    }
}

/// Serves HTTP on one accepted (and, over TLS, handshaken) connection; see [`connection`].
async fn serve_io<I>(
    io: I,
    app: Router,
    options: ServeOptions,
    mut drain: watch::Receiver<bool>,
    metrics: &HttpMetrics,
    activity: Arc<Activity>,
    certificate: Option<crate::tls::ClientCertificate>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = Tracked {
        inner: TowerToHyperService::new(app),
        activity: Arc::clone(&activity),
        certificate,
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut draining = false;
    let mut idle_check = activity.idle_at(options.idle_timeout);
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    if e.is_timeout() {
                        metrics.closed("header_timeout");
                    } else {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                }
                return;
            }
            // Err: the server is gone, which also means shutdown.
            _ = drain.wait_for(|stop| *stop), if !draining => {
                draining = true;
                // Idle connections close now; one with a request in progress finishes it and
                // answers with `Connection: close`.
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep_until(idle_check) => {
                let due = activity.idle_at(options.idle_timeout);
                if activity.busy() {
                    idle_check = Instant::now() + options.idle_timeout;
                } else if due > Instant::now() {
                    idle_check = due;
                } else {
                    metrics.closed("idle_timeout");
                    // Nothing is in progress, so dropping the connection loses no answer.
                    return;
                }
            }
        }
    }
}

struct OpenGuard<'a>(&'a HttpMetrics);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.dec();
    }
}

/// The socket, noting each byte that moves for the idle timer.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The router, counting each request from the moment its head is read until its answer is
/// ready, so the idle timer never fires under a request in progress (a long-poll, a slow
/// store write).
struct Tracked {
    inner: TowerToHyperService<Router>,
    activity: Arc<Activity>,
    /// The connection's client certificate, put in every request's extensions.
    certificate: Option<crate::tls::ClientCertificate>,
}

/// Counts one request in progress; its drop ends it and restarts the idle clock.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        if let Some(certificate) = &self.certificate {
            req.extensions_mut().insert(certificate.clone());
        }
        let in_flight = InFlight::enter(&self.activity);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await;
            drop(in_flight);
            response
        })
    }
}
