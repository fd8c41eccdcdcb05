//! A bearer token required on every request that changes something (any method but GET, HEAD
//! and OPTIONS): the cluster's peer secret on the routes between nodes. A missing or wrong
//! token is a 401 with the usual JSON error body. (The public API's callers, the API token's
//! holder and users, are told apart by [`super::principal`].)
//!
//! The token itself, and its constant-time comparison, is [`crate::auth::AuthToken`]: the
//! config loads it and this middleware checks it, so neither has to import the other.

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
