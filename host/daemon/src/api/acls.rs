//! ACL endpoints: the allow rules the Kafka listener enforces (see [`crate::acl`]).
//!
//! - `GET /v1/acls`: every rule;
//! - `POST /v1/acls`: add a rule (the JSON of [`AclRule`]); adding one already there is a
//!   no-op answered the same way;
//! - `DELETE /v1/acls?principal=&resource=&pattern=&name=&operation=`: remove a rule.
//!
//! Under `--auth-token-file` every ACL endpoint needs the token, reads included. Every change
//! is written to the audit log (target `narad::audit`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery};
use crate::acl::AclRule;

/// `GET /v1/acls` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclList {
    /// Every rule, sorted. Empty: nothing is checked.
    pub acls: Vec<AclRule>,
}

/// `GET /v1/acls`.
pub async fn list(State(state): State<AppState>) -> Result<Json<AclList>, ApiError> {
    Ok(Json(AclList {
        acls: state.metastore.acls().await?,
    }))
}

/// `POST /v1/acls`.
pub async fn add(
    State(state): State<AppState>,
    ApiJson(rule): ApiJson<AclRule>,
) -> Result<(StatusCode, Json<AclRule>), ApiError> {
    rule.check().map_err(ApiError::bad_request)?;
    let added = audited(
        "acl_add",
        &rule,
        state.metastore.add_acl(rule.clone()).await,
    )?;
    Ok((StatusCode::CREATED, Json(added)))
}

/// `DELETE /v1/acls?...`.
pub async fn remove(
    State(state): State<AppState>,
    ApiQuery(rule): ApiQuery<AclRule>,
) -> Result<Json<AclRule>, ApiError> {
    let removed = state.metastore.remove_acl(rule.clone()).await;
    Ok(Json(audited("acl_remove", &rule, removed)?))
}

/// Writes one audit line for a change of `rule` and passes the outcome on.
fn audited<T>(
    action: &'static str,
    rule: &AclRule,
    outcome: crate::metastore::Result<T>,
) -> Result<T, ApiError> {
    match &outcome {
        Ok(_) => {
            tracing::info!(target: "narad::audit", action, %rule, outcome = "done", "ACL changed");
        }
        Err(e) => tracing::info!(
            target: "narad::audit",
            action,
            %rule,
            outcome = "refused",
            reason = %e,
            "ACL change refused"
        ),
    }
    outcome.map_err(ApiError::from)
}
