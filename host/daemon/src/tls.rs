//! TLS on the daemon's listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`): the server
//! side of rustls over ring, TLS 1.2 and 1.3.
//!
//! The files are read at start (a bad file stops the start with its path and the reason) and
//! again whenever one of them changes (checked every [`RELOAD_CHECK_EVERY`]) or the daemon gets
//! SIGHUP: new connections get the new certificate, open ones keep theirs. A reload that fails
//! (a half-written file, a key that does not match) keeps the previous certificate, logs why
//! and counts it (`narad_tls_reloads_total{outcome="failed"}`), so a rotation done in two steps
//! never takes the listeners down.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::shutdown::ShutdownSignal;

/// How often the certificate files are checked for a change.
pub const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(5);

/// The files a TLS listener is configured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// PEM private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM certificates of the CAs whose client certificates are accepted; `None`: clients
    /// are not asked for one. When set, a client without a certificate signed by one of them
    /// cannot connect.
    pub client_ca: Option<PathBuf>,
}

/// Why a certificate, key or CA file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read the {what} file {path}: {source}")]
    Read {
        /// `certificate`, `private key` or `client CA`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file holds no PEM block of the kind needed, or a damaged one.
    #[error("the {what} file {path} holds no usable PEM {expected}: {reason}")]
    Pem {
        /// `certificate`, `private key` or `client CA`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What was looked for.
        expected: &'static str,
        /// What the parser said.
        reason: String,
    },
    /// rustls refused the certificate and key together (the key does not match the
    /// certificate, an unsupported key type) or the client CAs.
    #[error("{context}: {source}")]
    Refused {
        /// Which files.
        context: String,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The CA certificates cannot verify anything.
    #[error("the CA file {path} cannot be used: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// `outcome` label of `narad_tls_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    outcome: &'static str,
}

/// `listener` label of `narad_tls_handshake_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

/// The TLS series.
#[derive(Debug, Default)]
pub struct TlsMetrics {
    reloads: Family<ReloadLabels, Counter>,
    handshake_failures: Family<ListenerLabels, Counter>,
}

impl TlsMetrics {
    /// Registers every series in `registry`, at 0 before the first event of each kind.
    pub fn register(&self, registry: &mut Registry) {
        for outcome in ["ok", "failed"] {
            drop(self.reloads.get_or_create(&ReloadLabels { outcome }));
        }
        for listener in ["http", "kafka"] {
            drop(
                self.handshake_failures
                    .get_or_create(&ListenerLabels { listener }),
            );
        }
        registry.register(
            "narad_tls_reloads",
            "Reloads of the TLS certificate files after a change or SIGHUP, by outcome (a failed one keeps the previous certificate)",
            self.reloads.clone(),
        );
        registry.register(
            "narad_tls_handshake_failures",
            "TLS handshakes that failed or did not finish in time, by listener",
            self.handshake_failures.clone(),
        );
    }

    /// Counts one failed handshake on `listener` (`http` or `kafka`).
    pub fn handshake_failed(&self, listener: &'static str) {
        self.handshake_failures
            .get_or_create(&ListenerLabels { listener })
            .inc();
    }
}

/// What identifies a file's content without reading it: a change of any part is a change.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

/// One listener's TLS: the configuration new connections get, replaced on reload.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    current: RwLock<Arc<ServerConfig>>,
    stamps: RwLock<Vec<Stamp>>,
    metrics: Arc<TlsMetrics>,
}

impl ServerTls {
    /// Reads `files` and builds the configuration, offering the `alpn` protocols (e.g.
    /// `http/1.1`; empty for none). Fails with the file and the reason.
    pub fn open(
        files: TlsFiles,
        alpn: &[&[u8]],
        metrics: Arc<TlsMetrics>,
    ) -> Result<Arc<ServerTls>, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let stamps = file_stamps(&files);
        let config = build(&files, &alpn)?;
        Ok(Arc::new(ServerTls {
            files,
            alpn,
            current: RwLock::new(config),
            stamps: RwLock::new(stamps),
            metrics,
        }))
    }

    /// The acceptor for a new connection, with the newest configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(
            &self.current.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }

    /// The series this listener counts in.
    pub fn metrics(&self) -> &TlsMetrics {
        &self.metrics
    }

    /// Reads the files again and, when they build, serves with them from now on. Without
    /// `force`, does nothing unless a file changed since the last read. Returns whether the
    /// configuration was replaced.
    pub fn reload(&self, force: bool) -> Result<bool, TlsError> {
        let stamps = file_stamps(&self.files);
        if !force && *self.stamps.read().unwrap_or_else(PoisonError::into_inner) == stamps {
            return Ok(false);
        }
        // Noted before the build: a file that stays broken is reported once, not every check.
        *self.stamps.write().unwrap_or_else(PoisonError::into_inner) = stamps;
        let outcome = build(&self.files, &self.alpn);
        let label = if outcome.is_ok() { "ok" } else { "failed" };
        self.metrics
            .reloads
            .get_or_create(&ReloadLabels { outcome: label })
            .inc();
        let config = outcome?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = config;
        Ok(true)
    }

    /// Reloads on a file change (checked every [`RELOAD_CHECK_EVERY`]) and on SIGHUP, until
    /// `shutdown`. `name` says which listener in the log.
    pub fn spawn_reloader(self: &Arc<Self>, name: &'static str, shutdown: ShutdownSignal) {
        let tls = Arc::clone(self);
        tokio::spawn(async move {
            let mut hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut tick = tokio::time::interval(RELOAD_CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let force = tokio::select! {
                    () = shutdown.wait() => return,
                    _ = tick.tick() => false,
                    Some(()) = async {
                        match hangup.as_mut() {
                            Some(signal) => signal.recv().await,
                            None => std::future::pending().await,
                        }
                    } => true,
                };
                let files = tls.files.clone();
                let reloader = Arc::clone(&tls);
                let reloaded = crate::blocking::run(move || reloader.reload(force)).await;
                match reloaded {
                    Ok(Ok(true)) => tracing::info!(
                        listener = name,
                        cert = %files.cert.display(),
                        "TLS certificate reloaded: new connections use it"
                    ),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::error!(
                        listener = name,
                        error = %e,
                        "TLS certificate reload failed; still serving the previous one"
                    ),
                    Err(e) => {
                        tracing::error!(listener = name, error = %e, "TLS reload did not run")
                    }
                }
            }
        });
    }
}

fn file_stamps(files: &TlsFiles) -> Vec<Stamp> {
    let mut stamps = vec![stamp(&files.cert), stamp(&files.key)];
    if let Some(ca) = &files.client_ca {
        stamps.push(stamp(ca));
    }
    stamps
}

/// Reads the whole of `path`, for the error its kind of file gets.
fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The PEM certificates in `path`: at least one.
fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(what, path)?;
    let pem_error = |reason: String| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        expected: "CERTIFICATE block",
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_error("none found".into()));
    }
    Ok(certs)
}

/// The configuration `files` describe.
fn build(files: &TlsFiles, alpn: &[Vec<u8>]) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates("certificate", &files.cert)?;
    let key_bytes = read("private key", &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| TlsError::Pem {
        what: "private key",
        path: files.key.clone(),
        expected: "PRIVATE KEY block (PKCS#8, PKCS#1 or SEC1)",
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Refused {
            context: "the TLS protocol versions".into(),
            source,
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in certificates("client CA", path)? {
                roots.add(ca).map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Refused {
            context: match source {
                rustls::Error::InconsistentKeys(_) => format!(
                    "the private key {} is not the key of the certificate {} (the file's first \
                     certificate must be the server's own)",
                    files.key.display(),
                    files.cert.display()
                ),
                _ => format!(
                    "the certificate {} and the private key {} cannot be used together",
                    files.cert.display(),
                    files.key.display()
                ),
            },
            source,
        })?;
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
}

/// The CA certificates in the PEM file `path`, for an HTTP client that must trust them beside
/// the system's (calls to other nodes with `--peer-tls-ca`).
pub fn client_roots(path: &Path) -> Result<Vec<reqwest::Certificate>, TlsError> {
    certificates("peer CA", path)?
        .into_iter()
        .map(|der| {
            reqwest::Certificate::from_der(&der).map_err(|e| TlsError::ClientCa {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// The leaf certificate (DER) a TLS client presented on the connection a request came on,
/// in the request's extensions.
#[derive(Clone, Debug)]
pub struct ClientCertificate(pub std::sync::Arc<Vec<u8>>);

/// The header naming the node a call between nodes comes from; with mutual TLS the caller's
/// certificate must be valid for that name.
pub const NODE_HEADER: &str = "x-narad-node";

/// How this node calls its peers: the CAs it trusts beside the system's (`--peer-tls-ca`),
/// the certificate it presents (`--peer-tls-cert`, mutual TLS) and its node id, named in
/// [`NODE_HEADER`] on every call.
#[derive(Clone, Default)]
pub struct PeerTls {
    /// CA certificates trusted beside the system's.
    pub roots: Vec<reqwest::Certificate>,
    /// The client certificate and key presented to peers.
    pub identity: Option<reqwest::Identity>,
    /// This node's id, for [`NODE_HEADER`].
    pub node: Option<reqwest::header::HeaderValue>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("roots", &self.roots.len())
            .field("identity", &self.identity.is_some())
            .field("node", &self.node)
            .finish()
    }
}

/// The client identity in `cert` and `key` (PEM), for calls to peers (`--peer-tls-cert`).
pub fn client_identity(cert: &Path, key: &Path) -> Result<reqwest::Identity, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| TlsError::ClientCa {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    };
    let mut pem = read(cert)?;
    pem.push(b'\n');
    pem.extend(read(key)?);
    reqwest::Identity::from_pem(&pem).map_err(|e| TlsError::ClientCa {
        path: cert.to_path_buf(),
        reason: format!("not a certificate and key for mutual TLS: {e}"),
    })
}

/// Whether the leaf certificate `der` (already checked against the client CA by the TLS
/// handshake) is valid for `name`, a node id taken as a DNS name.
pub fn certificate_names(der: &[u8], name: &str) -> bool {
    let Ok(server_name) = rustls_pki_types::ServerName::try_from(name) else {
        return false;
    };
    let der = rustls_pki_types::CertificateDer::from(der);
    webpki::EndEntityCert::try_from(&der)
        .and_then(|cert| cert.verify_is_valid_for_subject_name(&server_name))
        .is_ok()
}

/// `builder` trusting `roots` too.
pub fn trusting(
    mut builder: reqwest::ClientBuilder,
    roots: &[reqwest::Certificate],
) -> reqwest::ClientBuilder {
    for root in roots {
        builder = builder.add_root_certificate(root.clone());
    }
    builder
}

/// `error` and its causes joined with ": ", each said once: an HTTP client's top-level error
/// ("error sending request for url ...") hides the cause an operator needs, such as a peer's
/// certificate that is not trusted ("invalid peer certificate: UnknownIssuer").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] io::Error);

    #[test]
    fn the_chain_names_each_cause_once() {
        let error = Outer(io::Error::other("invalid peer certificate: UnknownIssuer"));
        assert_eq!(
            error_chain(&error),
            "outer: invalid peer certificate: UnknownIssuer"
        );
    }
}
