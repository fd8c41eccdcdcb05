//! The Kafka listener's accept loop and connections.
//!
//! A Kafka request is a 4-byte big-endian size and that many bytes: header (API key, version,
//! correlation id, client id), then the body. Bounds, each closing only the connection that
//! crosses it:
//! - a frame larger than `max-request-bytes` (or smaller than a header) is refused before its
//!   body is read;
//! - the bytes of all requests in flight share `max-buffered-request-bytes`, taken as they
//!   arrive ([`FRAME_CHUNK_BYTES`] at a time), never on the strength of the size a frame
//!   declares: a client that sends a large size and then nothing holds one chunk, not the
//!   budget. A request waits (its connection unread, so TCP pushes back on the client) until
//!   its next chunk fits, and a frame not read whole within [`TRANSFER_TIMEOUT`] closes its
//!   connection, returning what it held;
//! - connections past the cap are closed at once;
//! - an idle connection is closed after [`IDLE_TIMEOUT`], a request or response that does not
//!   move within [`TRANSFER_TIMEOUT`] closes its connection.
//!
//! Requests of one connection are handled one at a time, in order, so responses go out in
//! request order as the protocol requires and one connection holds at most one request.
//!
//! On a listener that requires SASL ([`super::sasl`]) a connection authenticates first, in
//! small frames, and is closed by any other request before it has.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinSet;

use super::metrics::CloseReason;
use super::{
    Advertised, IDLE_TIMEOUT, KafkaDeps, Outcome, Request, Response, TRANSFER_TIMEOUT, api_versions,
};
use crate::tls::ServerTls;

/// Bytes of the smallest request header: API key, version, correlation id (2 + 2 + 4).
const MIN_FRAME_BYTES: usize = 8;

/// A request body is read, and its bytes taken from the buffered-bytes budget, this much at
/// a time.
pub(crate) const FRAME_CHUNK_BYTES: usize = 64 * 1024;

/// How the listener is bounded.
#[derive(Debug, Clone)]
pub(crate) struct ListenOptions {
    /// Most connections open at once.
    pub(crate) max_connections: u32,
    /// Longest wait for connections still busy at shutdown before they are dropped.
    pub(crate) shutdown_grace: Duration,
}

/// Serves Kafka clients on `listener` until the shutdown signal fires, then waits up to the
/// shutdown grace for requests in progress.
pub(crate) async fn serve(
    listener: TcpListener,
    deps: Arc<KafkaDeps>,
    options: ListenOptions,
    tls: Option<Arc<ServerTls>>,
) {
    let max_frame = usize::try_from(deps.limits.max_request_bytes).unwrap_or(usize::MAX);
    // One frame never needs more than the whole budget.
    let limits = FrameLimits {
        max_frame: max_frame.min(super::buffered_capacity(&deps.limits)),
    };
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = deps.shutdown.wait() => break,
            accepted = listener.accept() => accepted,
        };
        // Reap finished connections so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of descriptors or similar: wait a moment instead of spinning.
                tracing::warn!(error = %e, "kafka listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if connections.len() >= options.max_connections as usize {
            deps.metrics.refused.inc();
            tracing::warn!(%peer, cap = options.max_connections, "kafka connection refused: at the connection cap");
            drop(stream);
            continue;
        }
        let deps = Arc::clone(&deps);
        let tls = tls.clone();
        connections.spawn(async move {
            deps.metrics.connections.inc();
            let reason = match tls {
                None => serve_connection(stream, peer, &deps, limits).await,
                Some(tls) => serve_tls_connection(stream, peer, &deps, limits, &tls).await,
            };
            deps.metrics.connections.dec();
            deps.metrics.closed(reason);
            tracing::debug!(%peer, reason = reason.as_str(), "kafka connection closed");
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(options.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "kafka connections still busy after the shutdown grace; dropping them"
        );
        connections.shutdown().await;
    }
    tracing::debug!("kafka listener stopped");
}

#[derive(Debug, Clone, Copy)]
struct FrameLimits {
    /// Largest request frame, in bytes (size prefix excluded).
    max_frame: usize,
}

/// Serves one TLS connection: the handshake, within [`TRANSFER_TIMEOUT`], then the requests.
async fn serve_tls_connection(
    stream: TcpStream,
    peer: SocketAddr,
    deps: &Arc<KafkaDeps>,
    limits: FrameLimits,
    tls: &ServerTls,
) -> CloseReason {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr();
    match tokio::time::timeout(TRANSFER_TIMEOUT, tls.acceptor().accept(stream)).await {
        Ok(Ok(stream)) => serve_stream(stream, local, peer, deps, limits).await,
        Ok(Err(e)) => {
            tls.metrics().handshake_failed("kafka");
            tracing::debug!(%peer, error = %e, "kafka: TLS handshake failed");
            CloseReason::TlsHandshake
        }
        Err(_) => {
            tls.metrics().handshake_failed("kafka");
            CloseReason::TlsHandshake
        }
    }
}

/// Serves one plain connection until it closes; returns why it closed.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    deps: &Arc<KafkaDeps>,
    limits: FrameLimits,
) -> CloseReason {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr();
    serve_stream(stream, local, peer, deps, limits).await
}

/// Serves the requests of one connection (`local`: the address it reached) until it closes.
async fn serve_stream<S>(
    mut stream: S,
    local: std::io::Result<SocketAddr>,
    peer: SocketAddr,
    deps: &Arc<KafkaDeps>,
    limits: FrameLimits,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let advertised = match (&deps.advertise, local) {
        (Some(advertised), _) => advertised.clone(),
        (None, Ok(addr)) => Advertised {
            host: addr.ip().to_string(),
            port: i32::from(addr.port()),
        },
        (None, Err(_)) => return CloseReason::ClientClosed,
    };
    // Per connection, not per request: the peer's host as Kafka shows it, and one wait for
    // shutdown (each is an allocation, and a watch receiver, that small requests paid for).
    let mut client = super::groups::Client {
        id: String::new(),
        host: format!("/{}", peer.ip()),
    };
    let mut session = super::sasl::Session::new(deps.sasl.as_ref());
    let shutdown = deps.shutdown.wait();
    tokio::pin!(shutdown);
    let reason = loop {
        // Wait for the size prefix: idle time, ended by shutdown.
        let mut size = [0u8; 4];
        let first = tokio::select! {
            () = &mut shutdown => break CloseReason::Shutdown,
            read = tokio::time::timeout(IDLE_TIMEOUT, stream.read_exact(&mut size)) => read,
        };
        match first {
            Err(_) => break CloseReason::IdleTimeout,
            Ok(Err(_)) => break CloseReason::ClientClosed,
            Ok(Ok(_)) => {}
        }
        let declared = i32::from_be_bytes(size);
        let Ok(len) = usize::try_from(declared) else {
            tracing::info!(%peer, declared, "kafka: negative frame size; closing");
            break CloseReason::BadFrame;
        };
        if len < MIN_FRAME_BYTES {
            tracing::info!(%peer, len, "kafka: frame shorter than a request header; closing");
            break CloseReason::BadFrame;
        }
        let max_frame = session.max_frame(limits.max_frame);
        if len > max_frame {
            if max_frame < limits.max_frame {
                tracing::info!(
                    %peer,
                    len,
                    cap = max_frame,
                    "kafka: request larger than an unauthenticated connection may send; closing"
                );
            } else {
                tracing::info!(
                    %peer,
                    len,
                    cap = max_frame,
                    "kafka: request larger than max-request-bytes; closing"
                );
            }
            break CloseReason::Oversized;
        }
        let read = tokio::select! {
            () = &mut shutdown => break CloseReason::Shutdown,
            read = tokio::time::timeout(
                TRANSFER_TIMEOUT,
                read_frame(&mut stream, len, &deps.buffered),
            ) => read,
        };
        let (frame, _held) = match read {
            Err(_) => break CloseReason::ReadTimeout,
            Ok(Err(reason)) => break reason,
            Ok(Ok(read)) => read,
        };
        let frame = frame.freeze();
        let answer = match answer(deps, &advertised, peer, &mut client, &mut session, frame).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(reason) => break reason,
        };
        // The flush sends what TLS still holds (a no-op on plain TCP).
        let sent = async {
            stream.write_all(&answer).await?;
            stream.flush().await
        };
        match tokio::time::timeout(TRANSFER_TIMEOUT, sent).await {
            Err(_) => break CloseReason::WriteTimeout,
            Ok(Err(_)) => break CloseReason::ClientClosed,
            Ok(Ok(())) => {}
        }
        if session.failed() {
            break CloseReason::AuthenticationFailed;
        }
    };
    if let Some(user) = session.user() {
        tracing::debug!(%peer, user, reason = reason.as_str(), "kafka: authenticated connection closed");
    }
    reason
}

/// Reads a frame body of `len` bytes, taking each chunk's bytes from `budget` before it is
/// read; returns the body and what it holds of the budget.
async fn read_frame<'a, S: AsyncRead + Unpin>(
    stream: &mut S,
    len: usize,
    budget: &'a Semaphore,
) -> Result<(BytesMut, Option<SemaphorePermit<'a>>), CloseReason> {
    let mut frame = BytesMut::new();
    let mut held: Option<SemaphorePermit<'a>> = None;
    while frame.len() < len {
        let chunk = (len - frame.len()).min(FRAME_CHUNK_BYTES);
        // A chunk is far below the semaphore's u32 interface.
        let permits = u32::try_from(chunk).map_err(|_| CloseReason::Oversized)?;
        let permit = budget
            .acquire_many(permits)
            .await
            .map_err(|_| CloseReason::Shutdown)?;
        match &mut held {
            Some(held) => held.merge(permit),
            None => held = Some(permit),
        }
        let start = frame.len();
        frame.resize(start + chunk, 0);
        stream
            .read_exact(&mut frame[start..])
            .await
            .map_err(|_| CloseReason::ClientClosed)?;
    }
    Ok((frame, held))
}

/// Decodes one request frame, handles it and encodes the answer (size prefix included);
/// `client` takes the request's client id, `session` follows SASL. `Ok(None)`: nothing to
/// send; `Err`: close the connection.
async fn answer(
    deps: &Arc<KafkaDeps>,
    advertised: &Advertised,
    peer: SocketAddr,
    client: &mut super::groups::Client,
    session: &mut super::sasl::Session,
    frame: Bytes,
) -> Result<Option<Bytes>, CloseReason> {
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(api_key) = ApiKey::try_from(raw_key) else {
        tracing::info!(%peer, api_key = raw_key, "kafka: unknown API key; closing");
        return Err(CloseReason::Unsupported);
    };
    let sasl = deps.sasl.as_ref();
    if !api_versions::offered(api_key, version, sasl.is_some()) {
        if api_key == ApiKey::ApiVersions {
            // The protocol's answer to an ApiVersions the broker does not speak: version 0
            // with UNSUPPORTED_VERSION and the offered ranges; the client retries within them.
            deps.metrics.unsupported.inc();
            let response = Response::ApiVersions(api_versions::response(
                kafka_protocol::error::ResponseError::UnsupportedVersion.code(),
                sasl.is_some(),
            ));
            return encode(correlation_id, api_key, 0, &response).map(Some);
        }
        tracing::info!(
            %peer,
            api = ?api_key,
            version,
            "kafka: API or version not offered (see ApiVersions); closing, as Kafka brokers do"
        );
        deps.metrics.unsupported.inc();
        return Err(CloseReason::Unsupported);
    }
    if let Some(sasl) = sasl
        && super::sasl::is_sasl_api(api_key)
    {
        let response = sasl_answer(deps, sasl, session, peer, api_key, version, frame).await?;
        return encode(correlation_id, api_key, version, &response).map(Some);
    }
    if !session.may_serve() && api_key != ApiKey::ApiVersions {
        tracing::info!(
            %peer,
            api = ?api_key,
            "kafka: request before SASL authentication; closing (the listener requires \
             --kafka-sasl; the client needs security.protocol SASL_PLAINTEXT or SASL_SSL)"
        );
        return Err(CloseReason::Unauthenticated);
    }
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decode(api_key, version, frame)
    }));
    let (request, client_id) = match decoded {
        Ok(Ok(decoded)) => decoded,
        Ok(Err(e)) => {
            tracing::info!(%peer, api = ?api_key, version, error = %e, "kafka: malformed request; closing");
            return Err(CloseReason::BadFrame);
        }
        Err(_) => {
            tracing::warn!(%peer, api = ?api_key, version, "kafka: request decoder panicked; closing");
            return Err(CloseReason::BadFrame);
        }
    };
    client.id.clear();
    if let Some(id) = &client_id {
        client.id.push_str(id);
    }
    let principal = session.principal();
    match super::authorize::handle(deps, advertised, client, &principal, version, request).await {
        Outcome::Respond(response) => encode(correlation_id, api_key, version, &response).map(Some),
        Outcome::Silent => Ok(None),
    }
}

/// Decodes and answers a SASL request.
async fn sasl_answer(
    deps: &Arc<KafkaDeps>,
    sasl: &super::sasl::Sasl,
    session: &mut super::sasl::Session,
    peer: SocketAddr,
    api_key: ApiKey,
    version: i16,
    mut frame: Bytes,
) -> Result<Response, CloseReason> {
    let malformed = |e: anyhow::Error| {
        tracing::info!(%peer, api = ?api_key, version, error = %e, "kafka: malformed request; closing");
        CloseReason::BadFrame
    };
    RequestHeader::decode(&mut frame, api_key.request_header_version(version))
        .map_err(malformed)?;
    deps.metrics.request(api_key);
    if api_key == ApiKey::SaslHandshake {
        let request = SaslHandshakeRequest::decode(&mut frame, version).map_err(malformed)?;
        Ok(super::sasl::handshake(
            sasl, session, peer, version, &request,
        ))
    } else {
        let request = SaslAuthenticateRequest::decode(&mut frame, version).map_err(malformed)?;
        Ok(super::sasl::authenticate(deps, sasl, session, peer, request).await)
    }
}

/// The request header, then the body at `version`; with the header's client id.
fn decode(
    api_key: ApiKey,
    version: i16,
    mut frame: Bytes,
) -> anyhow::Result<(Request, Option<StrBytes>)> {
    let header = RequestHeader::decode(&mut frame, api_key.request_header_version(version))?;
    debug_assert_eq!(header.request_api_version, version);
    super::shape::check(api_key, version, &frame)?;
    Ok((
        Request::decode(api_key, version, &mut frame)?,
        header.client_id,
    ))
}

/// Size prefix, response header, body.
fn encode(
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    response: &Response,
) -> Result<Bytes, CloseReason> {
    let mut out = BytesMut::with_capacity(1024);
    out.extend_from_slice(&[0; 4]);
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    let encoded = header
        .encode(&mut out, api_key.response_header_version(version))
        .and_then(|()| response.encode(&mut out, version));
    if let Err(e) = encoded {
        tracing::error!(api = ?api_key, version, error = %e, "kafka: response could not be encoded; closing");
        return Err(CloseReason::BadFrame);
    }
    let Ok(len) = u32::try_from(out.len() - 4) else {
        return Err(CloseReason::BadFrame);
    };
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(out.freeze())
}
