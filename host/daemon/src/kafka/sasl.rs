//! SASL on the Kafka listener (`--kafka-sasl required`): SaslHandshake (v1) names a
//! mechanism, then SaslAuthenticate carries its messages, SCRAM-SHA-256 and SCRAM-SHA-512 in
//! two rounds, PLAIN in one. Until a connection has authenticated it may send only those and
//! ApiVersions, in frames of at most [`UNAUTHENTICATED_MAX_FRAME`] bytes; anything else
//! closes it, as a Kafka broker does.
//!
//! A failed authentication is answered after [`FAILED_AUTH_DELAY`] (Kafka's
//! `connection.failed.authentication.delay.ms`) and closes the connection, so one connection
//! guesses at most ten passwords a second and the connection cap bounds them all. PLAIN's
//! password check (a PBKDF2 run) happens on the blocking pool, [`PLAIN_CHECKS`] at a time, and
//! an unknown user's costs the same as a known one's. Every outcome is counted
//! (`narad_kafka_sasl_authentications_total{mechanism,outcome}`) and every refusal written to
//! the audit log (target `narad::audit`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Semaphore;

use super::{KafkaDeps, Response};
use crate::scram::{self, ClientFirst, Mechanism, ScramCredential, ScramError, ServerExchange};

/// Largest request frame a connection may send before it has authenticated: ApiVersions and
/// SASL messages are a few hundred bytes.
pub(crate) const UNAUTHENTICATED_MAX_FRAME: usize = 16 * 1024;

/// How long a failed authentication waits before it is answered.
pub(crate) const FAILED_AUTH_DELAY: Duration = Duration::from_millis(100);

/// PLAIN password checks run at once (each a PBKDF2 run of the user's iterations).
pub(crate) const PLAIN_CHECKS: usize = 2;

const PLAIN: &str = "PLAIN";

/// The listener's SASL settings and shared state.
#[derive(Debug)]
pub(crate) struct Sasl {
    /// Whether PLAIN is offered (over TLS, or allowed without it).
    plain: bool,
    /// Makes up stable salts for unknown users.
    secret: [u8; 32],
    /// What an unknown user's PLAIN password is checked against, so that it costs what a
    /// known user's does.
    decoy: Option<ScramCredential>,
    /// PLAIN checks in progress.
    checks: Semaphore,
}

impl Sasl {
    /// SASL with PLAIN offered or not.
    pub(crate) fn new(plain: bool) -> Sasl {
        let mut secret = [0u8; 32];
        scram::fill_random(&mut secret);
        let mut decoy_password = [0u8; 16];
        scram::fill_random(&mut decoy_password);
        Sasl {
            plain,
            secret,
            decoy: ScramCredential::new(
                Mechanism::Sha256,
                &decoy_password,
                scram::DEFAULT_ITERATIONS,
            )
            .ok(),
            checks: Semaphore::new(PLAIN_CHECKS),
        }
    }

    /// The mechanisms offered, in the order SaslHandshake lists them.
    fn mechanisms(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Mechanism::ALL.iter().map(|m| m.name()).collect();
        if self.plain {
            names.push(PLAIN);
        }
        names
    }
}

/// Where one connection stands.
#[derive(Debug, Default)]
pub(crate) enum Session {
    /// No SASL on this listener: every request is served.
    #[default]
    Open,
    /// SASL required; no mechanism chosen yet.
    Start,
    /// SaslHandshake chose PLAIN.
    Plain,
    /// SaslHandshake chose this SCRAM mechanism; its first message is next.
    Scram(Mechanism),
    /// A SCRAM exchange waiting for the client's final message.
    ScramFinal(Box<ServerExchange>),
    /// Authenticated as this user.
    Authenticated(String),
    /// Authentication failed or went out of order: the answer is sent, then the connection
    /// closes.
    Failed,
}

impl Session {
    /// The session a new connection starts in.
    pub(crate) fn new(sasl: Option<&Sasl>) -> Session {
        match sasl {
            Some(_) => Session::Start,
            None => Session::Open,
        }
    }

    /// Whether requests other than ApiVersions and SASL's are served.
    pub(crate) fn may_serve(&self) -> bool {
        matches!(self, Session::Open | Session::Authenticated(_))
    }

    /// The largest frame this connection may send now.
    pub(crate) fn max_frame(&self, configured: usize) -> usize {
        if self.may_serve() {
            configured
        } else {
            configured.min(UNAUTHENTICATED_MAX_FRAME)
        }
    }

    /// Who the connection's requests come from: the user it authenticated as, else
    /// [`crate::acl::ANONYMOUS`].
    pub(crate) fn principal(&self) -> crate::acl::Principal {
        match self {
            Session::Authenticated(user) => crate::acl::Principal::user(user),
            _ => crate::acl::Principal::anonymous(),
        }
    }

    /// The user the connection authenticated as, if it did.
    pub(crate) fn user(&self) -> Option<&str> {
        match self {
            Session::Authenticated(user) => Some(user),
            _ => None,
        }
    }

    /// Whether the connection closes once the last answer is sent.
    pub(crate) fn failed(&self) -> bool {
        matches!(self, Session::Failed)
    }
}

/// Whether `api` is one of SASL's.
pub(crate) fn is_sasl_api(api: ApiKey) -> bool {
    matches!(api, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate)
}

/// Answers a SaslHandshake.
pub(crate) fn handshake(
    sasl: &Sasl,
    session: &mut Session,
    peer: SocketAddr,
    version: i16,
    request: &SaslHandshakeRequest,
) -> Response {
    let mut response = SaslHandshakeResponse::default();
    response.mechanisms = sasl
        .mechanisms()
        .into_iter()
        .map(StrBytes::from_static_str)
        .collect();
    if !matches!(session, Session::Start) {
        // A second handshake (re-authentication, KIP-368) is not offered.
        response.error_code = ResponseError::IllegalSaslState.code();
        audit(
            peer,
            None,
            &request.mechanism,
            "refused",
            "handshake out of order",
        );
        *session = Session::Failed;
        return Response::SaslHandshake(response);
    }
    if version == 0 {
        // Version 0 sends the mechanism's messages without Kafka framing, which this listener
        // does not read; every client that offers SaslAuthenticate uses 1.
        response.error_code = ResponseError::UnsupportedVersion.code();
        audit(
            peer,
            None,
            &request.mechanism,
            "refused",
            "SaslHandshake v0 (unframed SASL)",
        );
        *session = Session::Failed;
        return Response::SaslHandshake(response);
    }
    let asked = request.mechanism.as_str();
    match (Mechanism::from_name(asked), asked) {
        (Some(mechanism), _) => *session = Session::Scram(mechanism),
        (None, PLAIN) if sasl.plain => *session = Session::Plain,
        _ => {
            response.error_code = ResponseError::UnsupportedSaslMechanism.code();
            audit(peer, None, asked, "refused", "mechanism not offered");
            *session = Session::Failed;
        }
    }
    Response::SaslHandshake(response)
}

/// What a SaslAuthenticate step came to, before its answer is built.
enum Step {
    /// Send these bytes; more steps follow (SCRAM's first round).
    Continue(Vec<u8>),
    /// Authenticated as the user; send these bytes.
    Done { user: String, last: Vec<u8> },
    /// Refused.
    Refused {
        user: Option<String>,
        error: ResponseError,
        message: String,
    },
}

/// Answers a SaslAuthenticate.
pub(crate) async fn authenticate(
    deps: &Arc<KafkaDeps>,
    sasl: &Sasl,
    session: &mut Session,
    peer: SocketAddr,
    request: SaslAuthenticateRequest,
) -> Response {
    let state = std::mem::replace(session, Session::Failed);
    let mechanism_name = match &state {
        Session::Plain => PLAIN,
        Session::Scram(m) => m.name(),
        Session::ScramFinal(exchange) => exchange.mechanism().name(),
        _ => "none",
    };
    let step = match state {
        Session::Plain => plain(deps, sasl, &request.auth_bytes).await,
        Session::Scram(mechanism) => {
            scram_first(deps, sasl, mechanism, &request.auth_bytes, session).await
        }
        Session::ScramFinal(exchange) => scram_final(*exchange, &request.auth_bytes),
        _ => Step::Refused {
            user: None,
            error: ResponseError::IllegalSaslState,
            message: "SaslAuthenticate before a SaslHandshake chose a mechanism".to_owned(),
        },
    };
    let mut response = SaslAuthenticateResponse::default();
    match step {
        Step::Continue(bytes) => {
            response.auth_bytes = Bytes::from(bytes);
        }
        Step::Done { user, last } => {
            deps.metrics.authenticated(mechanism_name, "ok");
            tracing::info!(target: "narad::audit", %peer, user, mechanism = mechanism_name, outcome = "authenticated", "kafka client authenticated");
            response.auth_bytes = Bytes::from(last);
            *session = Session::Authenticated(user);
        }
        Step::Refused {
            user,
            error,
            message,
        } => {
            deps.metrics.authenticated(mechanism_name, "failed");
            audit(peer, user.as_deref(), mechanism_name, "refused", &message);
            tokio::time::sleep(FAILED_AUTH_DELAY).await;
            response.error_code = error.code();
            response.error_message = Some(StrBytes::from_string(message));
            *session = Session::Failed;
        }
    }
    Response::SaslAuthenticate(response)
}

fn audit(peer: SocketAddr, user: Option<&str>, mechanism: &str, outcome: &str, reason: &str) {
    tracing::info!(
        target: "narad::audit",
        %peer,
        user = user.unwrap_or("-"),
        mechanism,
        outcome,
        reason,
        "kafka authentication refused"
    );
}

fn invalid(user: Option<String>, mechanism: &str) -> Step {
    Step::Refused {
        user,
        error: ResponseError::SaslAuthenticationFailed,
        message: format!(
            "authentication failed: invalid credentials for SASL mechanism {mechanism}"
        ),
    }
}

fn malformed(e: &ScramError, mechanism: &str) -> Step {
    Step::Refused {
        user: None,
        error: ResponseError::SaslAuthenticationFailed,
        message: format!("authentication failed ({mechanism}): {e}"),
    }
}

/// PLAIN: `authzid NUL user NUL password`, checked against the user's SCRAM credential.
async fn plain(deps: &Arc<KafkaDeps>, sasl: &Sasl, message: &[u8]) -> Step {
    let mut parts = message.splitn(3, |&b| b == 0);
    let (Some(authzid), Some(user), Some(password)) = (parts.next(), parts.next(), parts.next())
    else {
        return malformed(
            &ScramError::Malformed("expected authzid NUL user NUL password"),
            PLAIN,
        );
    };
    let (Ok(authzid), Ok(user)) = (std::str::from_utf8(authzid), std::str::from_utf8(user)) else {
        return malformed(&ScramError::Malformed("the user name is not UTF-8"), PLAIN);
    };
    if message.len() > scram::MAX_MESSAGE_BYTES || user.is_empty() {
        return malformed(
            &ScramError::Malformed("expected authzid NUL user NUL password"),
            PLAIN,
        );
    }
    let user = user.to_owned();
    if !authzid.is_empty() && authzid != user {
        return invalid(Some(user), PLAIN);
    }
    let credential = match deps.metastore.user(&user).await {
        Ok(found) => found.and_then(|u| {
            u.credential(Mechanism::Sha256)
                .or_else(|| u.credential(Mechanism::Sha512))
                .cloned()
        }),
        Err(e) => {
            return Step::Refused {
                user: Some(user),
                error: ResponseError::SaslAuthenticationFailed,
                message: format!("authentication could not be checked: {e}"),
            };
        }
    };
    let known = credential.is_some();
    let Some(checked) = credential.or_else(|| sasl.decoy.clone()) else {
        return invalid(Some(user), PLAIN);
    };
    let Ok(_permit) = sasl.checks.acquire().await else {
        return invalid(Some(user), PLAIN);
    };
    let password = password.to_vec();
    let matched = crate::blocking::run(move || checked.verify_password(&password))
        .await
        .unwrap_or(false);
    if matched && known {
        Step::Done {
            user,
            last: Vec::new(),
        }
    } else {
        invalid(Some(user), PLAIN)
    }
}

/// SCRAM's first round: the client names the user and its nonce; the answer is the salt.
async fn scram_first(
    deps: &Arc<KafkaDeps>,
    sasl: &Sasl,
    mechanism: Mechanism,
    message: &[u8],
    session: &mut Session,
) -> Step {
    let first = match ClientFirst::parse(message) {
        Ok(first) => first,
        Err(ScramError::InvalidCredentials) => return invalid(None, mechanism.name()),
        Err(e) => return malformed(&e, mechanism.name()),
    };
    let credential = match deps.metastore.user(&first.user).await {
        Ok(found) => found.and_then(|u| u.credential(mechanism).cloned()),
        Err(e) => {
            return Step::Refused {
                user: Some(first.user),
                error: ResponseError::SaslAuthenticationFailed,
                message: format!("authentication could not be checked: {e}"),
            };
        }
    };
    let (exchange, server_first) =
        ServerExchange::start(mechanism, first, credential, &sasl.secret);
    *session = Session::ScramFinal(Box::new(exchange));
    Step::Continue(server_first)
}

/// SCRAM's second round: the proof; the answer is the server's signature.
fn scram_final(exchange: ServerExchange, message: &[u8]) -> Step {
    let mechanism = exchange.mechanism().name();
    let user = exchange.user().to_owned();
    match exchange.finish(message) {
        Ok(done) => Step::Done {
            user: done.user,
            last: done.server_final,
        },
        Err(ScramError::InvalidCredentials) => invalid(Some(user), mechanism),
        Err(e) => {
            let Step::Refused { error, message, .. } = malformed(&e, mechanism) else {
                return invalid(Some(user), mechanism);
            };
            Step::Refused {
                user: Some(user),
                error,
                message,
            }
        }
    }
}
