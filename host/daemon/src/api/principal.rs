//! Who an HTTP request comes from, and whether the ACLs let them, on a daemon that requires its
//! API token (`--auth-token-file`; without one every caller is the operator, as before).
//!
//! - `Authorization: Bearer <token>`: the operator, who may do everything; so may another node
//!   of the cluster with the peer secret (its reads of this node's partitions).
//! - `Authorization: Basic <user:password>` (over TLS only): that user, checked against their
//!   SCRAM credential (a PBKDF2 run on the blocking pool, two at a time; a password once
//!   checked is remembered, as a hash, until the user's password changes).
//! - nothing: the anonymous user. It may read (unless `--auth-reads`), never change anything.
//!
//! What a user may do (401 for a caller not authenticated, 403 for one the rules refuse):
//!
//! | request | needs |
//! |---------|-------|
//! | `POST /v1/topics/{t}/records` | write on the topic |
//! | `GET /v1/topics/{t}/partitions/{p}/records` | read on the topic |
//! | other reads under `/v1/topics/{t}` | describe on the topic |
//! | `DELETE /v1/topics/{t}` | delete on the topic |
//! | `POST /v1/topics/{t}/partitions`, `PATCH /v1/topics/{t}` | alter on the topic |
//! | `POST /v1/topics` | create on the cluster |
//! | `/v1/users`, `/v1/acls` | the operator only |
//! | any other change | alter on the cluster |
//! | any other read | nothing beyond `--auth-reads` |
//!
//! With no ACL rule at all a user may do what the operator may, but `/v1/users` and `/v1/acls`.
//! `/metrics` and `/healthz` stay open. Refusals are counted
//! (`narad_http_requests_denied_total{reason}`) and written to the audit log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use tokio::sync::Semaphore;

use super::error::ApiError;
use crate::acl::{Operation, Principal, ResourceKind};
use crate::auth::AuthToken;
use crate::metastore::Metastore;
use crate::metastore::acl_cache::AclCache;
use crate::scram::Mechanism;

/// Password checks (PBKDF2 runs) at once.
const PASSWORD_CHECKS: usize = 2;
/// Passwords remembered as checked; past this the memory starts over.
const REMEMBERED: usize = 1_024;
/// How long a wrong password waits before its 401.
const FAILED_DELAY: Duration = Duration::from_millis(100);

/// What the guard decides with, shared by every request.
pub(crate) struct Guard {
    token: AuthToken,
    /// The cluster's peer secret: other nodes reading this one's partitions.
    peer: Option<AuthToken>,
    /// With mutual TLS between nodes: whether a node is live, for the certificate check of a
    /// caller presenting the peer secret.
    peer_is_live: Option<super::auth::IsLive>,
    /// What an unknown user's password is checked against, so that it costs what a known
    /// one's does and the answer's time does not tell which names exist.
    decoy: Option<crate::scram::ScramCredential>,
    metastore: Arc<dyn Metastore>,
    acls: AclCache,
    /// Reads need an authenticated caller (`--auth-reads`).
    auth_reads: bool,
    /// The listener has TLS: Basic credentials are taken.
    tls: bool,
    checks: Semaphore,
    /// SHA-256 of `user NUL password` -> the user's `updated_at_ms` when it was checked.
    checked: Mutex<HashMap<[u8; 32], i64>>,
    denied: prometheus_client::metrics::family::Family<
        DeniedLabels,
        prometheus_client::metrics::counter::Counter,
    >,
}

/// Every `reason` of `narad_http_requests_denied_total`.
pub(crate) const DENIED_REASONS: [&str; 3] = ["unauthenticated", "forbidden", "bad_request"];

/// Labels of `narad_http_requests_denied_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(crate) struct DeniedLabels {
    /// `unauthenticated` (401: no or wrong credentials), `forbidden` (403: the rules) or
    /// `bad_request` (400: a percent-encoded topic name).
    pub reason: &'static str,
}

impl Guard {
    /// A guard over `metastore`'s users and rules.
    pub(crate) fn new(
        token: AuthToken,
        peer: Option<AuthToken>,
        peer_is_live: Option<super::auth::IsLive>,
        metastore: Arc<dyn Metastore>,
        auth_reads: bool,
        tls: bool,
        denied: prometheus_client::metrics::family::Family<
            DeniedLabels,
            prometheus_client::metrics::counter::Counter,
        >,
    ) -> Guard {
        let mut decoy_password = [0u8; 16];
        crate::scram::fill_random(&mut decoy_password);
        Guard {
            token,
            peer,
            peer_is_live,
            decoy: crate::scram::ScramCredential::new(
                Mechanism::Sha256,
                &decoy_password,
                crate::scram::DEFAULT_ITERATIONS,
            )
            .ok(),
            acls: AclCache::new(Arc::clone(&metastore)),
            metastore,
            auth_reads,
            tls,
            checks: Semaphore::new(PASSWORD_CHECKS),
            checked: Mutex::new(HashMap::new()),
            denied,
        }
    }

    /// The caller, or why they are refused.
    async fn principal(
        &self,
        header: Option<HeaderValue>,
        node_proved: bool,
    ) -> Result<Principal, &'static str> {
        let Some(value) = header else {
            return Ok(Principal::anonymous());
        };
        let value = value
            .to_str()
            .map_err(|_| "the Authorization header is not text")?;
        let (scheme, credentials) = value.split_once(' ').unwrap_or((value, ""));
        if scheme.eq_ignore_ascii_case("bearer") {
            let given = credentials.trim();
            let peer = self.peer.as_ref().is_some_and(|peer| peer.matches(given));
            return if self.token.matches(given) || (peer && node_proved) {
                Ok(Principal::Operator)
            } else {
                Err("the bearer token is wrong; send the token of the daemon's --auth-token-file")
            };
        }
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(
                "send `Authorization: Bearer <token>` or, over TLS, Basic user credentials",
            );
        }
        if !self.tls {
            return Err("user credentials are taken only over TLS (narad serve --tls-cert)");
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or("the Basic credentials are not base64 of user:password")?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or("the Basic credentials are not base64 of user:password")?;
        if self.password_ok(user, password).await {
            Ok(Principal::user(user))
        } else {
            tokio::time::sleep(FAILED_DELAY).await;
            Err("wrong user name or password")
        }
    }

    /// Whether `password` is `user`'s, remembering a match until the password changes.
    async fn password_ok(&self, user: &str, password: &str) -> bool {
        let Ok(Some(found)) = self.metastore.user(user).await else {
            // The same work as a known user's, then no.
            if let (Some(decoy), Ok(_permit)) = (self.decoy.clone(), self.checks.acquire().await) {
                let password = password.as_bytes().to_vec();
                let _ = crate::blocking::run(move || decoy.verify_password(&password)).await;
            }
            return false;
        };
        let mut hasher = Sha256::new();
        hasher.update(user.as_bytes());
        hasher.update([0]);
        hasher.update(password.as_bytes());
        let key: [u8; 32] = hasher.finalize().into();
        let remembered = self
            .checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .copied();
        if remembered == Some(found.updated_at_ms) {
            return true;
        }
        let Some(credential) = found
            .credential(Mechanism::Sha256)
            .or_else(|| found.credential(Mechanism::Sha512))
            .cloned()
        else {
            return false;
        };
        let Ok(_permit) = self.checks.acquire().await else {
            return false;
        };
        let password = password.as_bytes().to_vec();
        let matched = crate::blocking::run(move || credential.verify_password(&password))
            .await
            .unwrap_or(false);
        if matched {
            let mut checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
            if checked.len() >= REMEMBERED {
                checked.clear();
            }
            checked.insert(key, found.updated_at_ms);
        }
        matched
    }

    /// Whether `principal` may send `method` to `path`: `Err` with the status and the reason.
    async fn allowed(
        &self,
        principal: &Principal,
        method: &Method,
        path: &str,
    ) -> Result<(), (StatusCode, String)> {
        if *principal == Principal::Operator || path == "/metrics" || path == "/healthz" {
            return Ok(());
        }
        let anonymous = *principal == Principal::anonymous();
        let reading = !super::auth::is_mutating(method);
        let unauthenticated = |what: &str| {
            Err((
                StatusCode::UNAUTHORIZED,
                format!(
                    "{what} needs an authenticated caller: `Authorization: Bearer <token>` (the \
                     CLI's --token) or, over TLS, a user's Basic credentials"
                ),
            ))
        };
        if operator_only(path) {
            return if anonymous {
                unauthenticated("this endpoint")
            } else {
                Err((
                    StatusCode::FORBIDDEN,
                    format!("{principal} may not use {path}: only the API token's holder may"),
                ))
            };
        }
        if anonymous && !reading {
            return unauthenticated("a change");
        }
        if anonymous && self.auth_reads {
            return unauthenticated("a read (the daemon runs with --auth-reads)");
        }
        let (kind, name, operation) = needs(method, path);
        if kind == ResourceKind::Topic && name.contains('%') {
            return Err((
                StatusCode::BAD_REQUEST,
                "topic names are not percent-encoded (they hold only A-Z a-z 0-9 . _ -)".to_owned(),
            ));
        }
        let Some(operation) = operation else {
            return Ok(());
        };
        let acls = self.acls.current().await;
        if acls.allows(principal, kind, name, operation) {
            return Ok(());
        }
        let resource = match kind {
            ResourceKind::Cluster => "the cluster".to_owned(),
            other => format!("{} {name:?}", other.name()),
        };
        Err((
            StatusCode::FORBIDDEN,
            format!("{principal} may not {operation} {resource} (narad acl list shows the rules)"),
        ))
    }

    fn refuse(
        &self,
        status: StatusCode,
        message: String,
        principal: &str,
        method: &Method,
        path: &str,
    ) -> Response {
        let reason = match status {
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::UNAUTHORIZED => "unauthenticated",
            _ => "bad_request",
        };
        self.denied.get_or_create(&DeniedLabels { reason }).inc();
        tracing::info!(
            target: "narad::audit",
            principal,
            %method,
            path,
            status = status.as_u16(),
            reason = %message,
            outcome = "denied",
            "http request denied"
        );
        let mut response = ApiError::new(status, message).into_response();
        if status == StatusCode::UNAUTHORIZED {
            // Basic is offered only where it is taken: over TLS.
            let schemes = if self.tls {
                "Bearer, Basic realm=\"narad\""
            } else {
                "Bearer"
            };
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static(schemes));
        }
        response
    }
}

/// The endpoints only the operator may use, reads included.
fn operator_only(path: &str) -> bool {
    ["/v1/users", "/v1/acls"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

/// What a user needs for `method` on `path`: the resource and the operation, `None` when a
/// read needs nothing beyond `--auth-reads`.
fn needs<'a>(method: &Method, path: &'a str) -> (ResourceKind, &'a str, Option<Operation>) {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let reading = !super::auth::is_mutating(method);
    match segments.as_slice() {
        ["v1", "topics"] if !reading => (ResourceKind::Cluster, "", Some(Operation::Create)),
        ["v1", "topics", topic, "records"] if *method == Method::POST => {
            (ResourceKind::Topic, topic, Some(Operation::Write))
        }
        ["v1", "topics", topic, "partitions", _, "records"] if reading => {
            (ResourceKind::Topic, topic, Some(Operation::Read))
        }
        ["v1", "topics", topic, ..] if reading => {
            (ResourceKind::Topic, topic, Some(Operation::Describe))
        }
        ["v1", "topics", topic] if *method == Method::DELETE => {
            (ResourceKind::Topic, topic, Some(Operation::Delete))
        }
        ["v1", "topics", topic] | ["v1", "topics", topic, "partitions"] => {
            (ResourceKind::Topic, topic, Some(Operation::Alter))
        }
        _ if reading => (ResourceKind::Cluster, "", None),
        _ => (ResourceKind::Cluster, "", Some(Operation::Alter)),
    }
}

/// `router` behind the guard.
pub(crate) fn guard(router: Router, guard: Guard) -> Router {
    router.layer(axum::middleware::from_fn_with_state(Arc::new(guard), check))
}

async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let header = request.headers().get(AUTHORIZATION).cloned();
    // With mutual TLS between nodes the peer secret counts only with the node's certificate.
    let node_proved = guard
        .peer_is_live
        .as_ref()
        .is_none_or(|is_live| super::auth::identity_refusal(&request, is_live.as_ref()).is_none());
    let principal = match guard.principal(header, node_proved).await {
        Ok(principal) => principal,
        Err(reason) => {
            return guard.refuse(
                StatusCode::UNAUTHORIZED,
                reason.to_owned(),
                "-",
                &method,
                &path,
            );
        }
    };
    match guard.allowed(&principal, &method, &path).await {
        Ok(()) => next.run(request).await,
        Err((status, message)) => {
            guard.refuse(status, message, &principal.to_string(), &method, &path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_needs_what_the_table_says() {
        let post = Method::POST;
        let get = Method::GET;
        let t = ResourceKind::Topic;
        let c = ResourceKind::Cluster;
        for (method, path, expected) in [
            (
                &post,
                "/v1/topics/orders/records",
                (t, "orders", Some(Operation::Write)),
            ),
            (
                &get,
                "/v1/topics/orders/partitions/0/records",
                (t, "orders", Some(Operation::Read)),
            ),
            (
                &get,
                "/v1/topics/orders",
                (t, "orders", Some(Operation::Describe)),
            ),
            (
                &get,
                "/v1/topics/orders/children",
                (t, "orders", Some(Operation::Describe)),
            ),
            (
                &Method::DELETE,
                "/v1/topics/orders",
                (t, "orders", Some(Operation::Delete)),
            ),
            (
                &post,
                "/v1/topics/orders/partitions",
                (t, "orders", Some(Operation::Alter)),
            ),
            (
                &Method::PATCH,
                "/v1/topics/orders",
                (t, "orders", Some(Operation::Alter)),
            ),
            (&post, "/v1/topics", (c, "", Some(Operation::Create))),
            (
                &post,
                "/v1/topics/orders/children",
                (c, "", Some(Operation::Alter)),
            ),
            (&post, "/v1/plugins", (c, "", Some(Operation::Alter))),
            (&get, "/v1/topics", (c, "", None)),
            (&get, "/v1/nodes", (c, "", None)),
        ] {
            assert_eq!(needs(method, path), expected, "{method} {path}");
        }
        assert!(operator_only("/v1/users") && operator_only("/v1/acls/x"));
        assert!(!operator_only("/v1/usersx"));
    }
}
