//! The transport between narad processes: one client for every call a node makes to its peers
//! (child commits, attach points and tail scans, forwarded produces and fetches, a move's
//! steps, plugin module fetches), and the one way to call another narad cluster (a remote
//! child's target).
//!
//! - [`PeerClient`] is built once per node from its [`PeerTls`] ([`PeerClient::new`]) and
//!   shared: one connection pool per peer, the cluster's CAs and this node's certificate,
//!   never a proxy, and a connect timeout that fails fast on a dead address. Every call names
//!   its own longest wait, so none can hang.
//! - [`remote::client`] is the client for another cluster: that cluster's CA beside the
//!   system's, and the environment's proxy variables honoured (another cluster may be reached
//!   through one).
//! - [`produce`] sends a produce to another narad, peer or remote, with the one downgrade for
//!   a narad from before null values.
//!
//! The routes peers call are all in `api/mod.rs` (`api::peer_routes`, and the internal reads in
//! `api::router`).

pub mod produce;
pub(crate) mod remote;

use std::time::Duration;

use crate::tls::PeerTls;

/// Longest wait for a connection to another node: loopback and LAN connects take well under a
/// millisecond, so a second means the peer is not there.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest wait for a whole call to another node that is not a long-poll or a bulk transfer.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle pooled connections to peers are dropped after this: below a daemon's default idle
/// timeout (5 s), so a call seldom goes out on a connection the peer is just closing, which
/// fails it ("connection closed before message completed"; seen once in 2,000 attaches at
/// scale, where the pool's default kept idle connections for 90 s).
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// The client a node calls its peers with. Cheap to clone (one pool shared by the clones).
#[derive(Clone)]
pub struct PeerClient {
    http: reqwest::Client,
    /// The cluster's peer secret, presented as `Authorization: Bearer` on every call
    /// ([`PeerClient::with_secret`]); absent on a forwarder, which passes on its client's own.
    secret: Option<std::sync::Arc<str>>,
}

impl std::fmt::Debug for PeerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerClient")
            .field("secret", &self.secret.is_some())
            .finish_non_exhaustive()
    }
}

/// Why the peer client could not be built (the TLS settings were refused by the client).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client for calls to other nodes: {0}")]
pub struct PeerClientError(#[from] reqwest::Error);

impl PeerClient {
    /// The client calling peers as `tls` says: trusting its CAs beside the system's,
    /// presenting its certificate (mutual TLS) and naming this node in `tls::NODE_HEADER`,
    /// connecting within [`CONNECT_TIMEOUT`], dropping idle connections after
    /// [`POOL_IDLE_TIMEOUT`], and going straight to the peer's advertised address, never
    /// through a proxy the environment names (`HTTP_PROXY` and the like are for traffic
    /// leaving the cluster; a proxy would see the peer credentials, or fail every call).
    ///
    /// Connections belong to the runtime that made them: code calling peers from a runtime
    /// of its own builds a client there.
    pub fn new(tls: &PeerTls) -> Result<PeerClient, PeerClientError> {
        let mut builder = crate::tls::trusting(reqwest::Client::builder(), &tls.roots)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .no_proxy();
        if let Some(identity) = &tls.identity {
            builder = builder.identity(identity.clone());
        }
        if let Some(node) = &tls.node {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(crate::tls::NODE_HEADER, node.clone());
            builder = builder.default_headers(headers);
        }
        Ok(PeerClient {
            http: builder.build()?,
            secret: None,
        })
    }

    /// The same client, presenting `secret` (the cluster's peer secret) on every call.
    pub fn with_secret(mut self, secret: &str) -> PeerClient {
        self.secret = Some(secret.into());
        self
    }

    /// The same client (the same pool), presenting no peer secret.
    pub(crate) fn without_secret(mut self) -> PeerClient {
        self.secret = None;
        self
    }

    /// A `method` call to `url`, answered within `timeout` or failed, with the peer secret
    /// when this client has one.
    pub(crate) fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let call = self.http.request(method, url).timeout(timeout);
        match &self.secret {
            Some(secret) => call.bearer_auth(secret),
            None => call,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that records the headers of the one request it gets and answers 200.
    async fn header_catcher() -> (
        String,
        tokio::sync::oneshot::Receiver<axum::http::HeaderMap>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = std::sync::Arc::new(std::sync::Mutex::new(Some(tx)));
        let app = axum::Router::new().route(
            "/x",
            axum::routing::get(move |headers: axum::http::HeaderMap| async move {
                if let Some(tx) = tx.lock().unwrap().take() {
                    let _ = tx.send(headers);
                }
                "ok"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, rx)
    }

    #[tokio::test]
    async fn a_call_names_the_node_and_presents_the_secret_only_when_the_client_has_one() {
        let tls = PeerTls {
            node: Some(reqwest::header::HeaderValue::from_static("n7")),
            ..PeerTls::default()
        };
        let plain = PeerClient::new(&tls).unwrap();
        for (client, bearer) in [
            (plain.clone(), None),
            (plain.with_secret("s3cret"), Some("Bearer s3cret")),
        ] {
            let (url, headers) = header_catcher().await;
            let answer = client
                .call(reqwest::Method::GET, &format!("{url}/x"), CALL_TIMEOUT)
                .send()
                .await
                .unwrap();
            assert!(answer.status().is_success());
            let headers = headers.await.unwrap();
            assert_eq!(headers[crate::tls::NODE_HEADER], "n7");
            assert_eq!(
                headers
                    .get(axum::http::header::AUTHORIZATION)
                    .map(|v| v.to_str().unwrap()),
                bearer
            );
        }
    }

    #[tokio::test]
    async fn a_call_gives_up_after_its_own_timeout() {
        // Accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/x", listener.local_addr().unwrap());
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let client = PeerClient::new(&PeerTls::default()).unwrap();
        let error = client
            .call(reqwest::Method::GET, &url, Duration::from_millis(200))
            .send()
            .await
            .unwrap_err();
        assert!(error.is_timeout(), "{error:?}");
    }
}
