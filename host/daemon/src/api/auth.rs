//! A bearer token required on every request that changes something (any method but GET, HEAD
//! and OPTIONS): the cluster's peer secret on the routes between nodes. A missing or wrong
//! token is a 401 with the usual JSON error body. (The public API's callers, the API token's
//! holder and users, are told apart by [`super::principal`].)
//!
//! The token itself, and its constant-time comparison, is [`crate::auth::AuthToken`]: the
//! config loads it and this middleware checks it, so neither has to import the other.
//!
//! With mutual TLS between nodes the secret is not enough: [`require_node_identity`] also
//! asks for the certificate of the live node the call names, so a client holding a
//! certificate of the same CA and a leaked secret still cannot pose as a node.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::auth::AuthToken;

/// Whether `method` can change anything (and so needs the token).
pub(crate) fn is_mutating(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// `router` with the token required on every mutating request.
pub(crate) fn protect(router: Router, token: AuthToken) -> Router {
    router.layer(axum::middleware::from_fn_with_state(
        Arc::new(token),
        require_token,
    ))
}

/// The middleware behind [`protect`].
async fn require_token(
    State(token): State<Arc<AuthToken>>,
    request: Request,
    next: Next,
) -> Response {
    if !is_mutating(request.method()) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    let message = match presented {
        Some(given) if token.matches(given) => return next.run(request).await,
        Some(_) => "the bearer token is wrong; send the token of the daemon's --auth-token-file",
        None => {
            "this daemon requires `Authorization: Bearer <token>` on every change \
             (the CLI sends --token or NARAD_TOKEN); reads stay open"
        }
    };
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, message).into_response();
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Whether a node is live in the cluster, by id.
pub(crate) type IsLive = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// `router` answering only calls that name a live node in [`crate::tls::NODE_HEADER`] and
/// come with a client certificate valid for that node id (403 otherwise, naming why).
pub(crate) fn require_node_identity(router: Router, is_live: IsLive) -> Router {
    router.layer(axum::middleware::from_fn_with_state(is_live, node_identity))
}

/// The middleware behind [`require_node_identity`].
async fn node_identity(State(is_live): State<IsLive>, request: Request, next: Next) -> Response {
    match identity_refusal(&request, is_live.as_ref()) {
        None => next.run(request).await,
        Some(message) => ApiError::new(StatusCode::FORBIDDEN, message).into_response(),
    }
}

/// Why `request` is not a call from a live node proving its id with its certificate, or
/// `None` when it is.
pub(crate) fn identity_refusal(
    request: &Request,
    is_live: &(dyn Fn(&str) -> bool + Send + Sync),
) -> Option<String> {
    let Some(node) = request
        .headers()
        .get(crate::tls::NODE_HEADER)
        .and_then(|v| v.to_str().ok())
    else {
        return Some(format!(
            "calls between nodes name the calling node in {}; this one names none",
            crate::tls::NODE_HEADER
        ));
    };
    if !is_live(node) {
        return Some(format!("{node:?} is not a live node of this cluster"));
    }
    let Some(certificate) = request.extensions().get::<crate::tls::ClientCertificate>() else {
        return Some(format!(
            "the call names node {node:?} but came without a client certificate"
        ));
    };
    if !crate::tls::certificate_names(&certificate.0, node) {
        return Some(format!(
            "the client certificate is not node {node:?}'s: it does not name {node} as a DNS name"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_head_and_options_are_reads() {
        for m in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert!(!is_mutating(&m));
        }
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(is_mutating(&m));
        }
    }
}
