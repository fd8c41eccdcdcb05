//! User endpoints: the principals Kafka clients authenticate as (SASL SCRAM or PLAIN).
//!
//! - `GET /v1/users`: names, mechanisms and times, never a credential;
//! - `POST /v1/users`: create (`{"name", "password"}` or `{"name", "credentials"}`);
//! - `PUT /v1/users/{name}/credentials`: a new password, same body without the name;
//! - `DELETE /v1/users/{name}`.
//!
//! A body gives either the password, which the daemon salts and hashes (on the blocking pool:
//! two PBKDF2 runs) and forgets, or the salted credentials themselves, which is what the CLI
//! sends, so the password never leaves the operator's machine. Every change is written to the
//! audit log (target `narad::audit`). Under `--auth-token-file` every user endpoint needs the
//! token, reads included: the list of who may log in is not public.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use crate::metastore::{UserMeta, check_credentials, check_user_name};
use crate::scram::{DEFAULT_ITERATIONS, Mechanism, ScramCredential};

/// Longest password the API takes, in bytes.
pub const MAX_PASSWORD_BYTES: usize = 1_024;

/// `POST /v1/users` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// The user's name: 1 to 128 of ASCII letters, digits and `. _ - @`.
    pub name: String,
    /// The password or the credentials made from it.
    #[serde(flatten)]
    pub secret: Secret,
}

/// What a user authenticates with, as a request gives it: exactly one of the two fields.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Secret {
    /// The password; the daemon makes a SCRAM-SHA-256 and a SCRAM-SHA-512 credential from it
    /// (4,096 iterations) and keeps only those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Salted credentials made elsewhere (the CLI), one per mechanism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Vec<ScramCredential>>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("credentials", &self.credentials)
            .finish()
    }
}

/// One user as the API shows it: no salt, no key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// The name.
    pub name: String,
    /// The SASL mechanisms the user can authenticate with (PLAIN checks the SCRAM-SHA-256
    /// credential, or SCRAM-SHA-512's when there is no SHA-256 one).
    pub mechanisms: Vec<String>,
    /// When the user was created, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// When the password was last set.
    pub updated_at_ms: i64,
}

/// `GET /v1/users` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserList {
    /// Every user, by name.
    pub users: Vec<UserInfo>,
}

fn info(user: &UserMeta) -> UserInfo {
    UserInfo {
        name: user.name.clone(),
        mechanisms: user
            .credentials
            .iter()
            .map(|c| c.mechanism.name().to_owned())
            .collect(),
        created_at_ms: user.created_at_ms,
        updated_at_ms: user.updated_at_ms,
    }
}

/// The credentials a request's secret stands for, checked.
async fn credentials(secret: Secret) -> Result<Vec<ScramCredential>, ApiError> {
    let credentials = match (secret.password, secret.credentials) {
        (Some(password), None) => {
            if password.len() > MAX_PASSWORD_BYTES {
                return Err(ApiError::bad_request(format!(
                    "the password is {} bytes; at most {MAX_PASSWORD_BYTES}",
                    password.len()
                )));
            }
            crate::blocking::run(move || {
                Mechanism::ALL
                    .iter()
                    .map(|&m| ScramCredential::new(m, password.as_bytes(), DEFAULT_ITERATIONS))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::bad_request(e.to_string()))?
        }
        (None, Some(credentials)) => credentials,
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `password` and `credentials`",
            ));
        }
    };
    check_credentials(&credentials).map_err(ApiError::bad_request)?;
    Ok(credentials)
}

/// `GET /v1/users`.
pub async fn list(State(state): State<AppState>) -> Result<Json<UserList>, ApiError> {
    let snapshot = state.metastore.snapshot().await?;
    Ok(Json(UserList {
        users: snapshot.users.values().map(info).collect(),
    }))
}

/// `POST /v1/users`.
pub async fn create(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateUser>,
) -> Result<(StatusCode, Json<UserInfo>), ApiError> {
    check_user_name(&body.name).map_err(ApiError::bad_request)?;
    let credentials = credentials(body.secret).await?;
    let now = crate::topics::now_ms();
    let user = UserMeta {
        name: body.name,
        credentials,
        created_at_ms: now,
        updated_at_ms: now,
    };
    let name = user.name.clone();
    let created = audited(
        "user_create",
        &name,
        state.metastore.create_user(user).await,
    )?;
    Ok((StatusCode::CREATED, Json(info(&created))))
}

/// `PUT /v1/users/{name}/credentials`.
pub async fn set_credentials(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(secret): ApiJson<Secret>,
) -> Result<Json<UserInfo>, ApiError> {
    let credentials = credentials(secret).await?;
    let changed = state
        .metastore
        .set_user_credentials(&name, credentials, crate::topics::now_ms())
        .await;
    Ok(Json(info(&audited("user_password", &name, changed)?)))
}

/// `DELETE /v1/users/{name}`.
pub async fn delete(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<UserInfo>, ApiError> {
    let removed = state.metastore.delete_user(&name).await;
    Ok(Json(info(&audited("user_delete", &name, removed)?)))
}

/// Writes one audit line for a change of `user` and passes the outcome on.
fn audited<T>(
    action: &'static str,
    user: &str,
    outcome: crate::metastore::Result<T>,
) -> Result<T, ApiError> {
    match &outcome {
        Ok(_) => {
            tracing::info!(target: "narad::audit", action, user, outcome = "done", "user changed")
        }
        Err(e) => tracing::info!(
            target: "narad::audit",
            action,
            user,
            outcome = "refused",
            reason = %e,
            "user change refused"
        ),
    }
    outcome.map_err(ApiError::from)
}
