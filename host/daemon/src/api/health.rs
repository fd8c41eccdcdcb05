//! `GET /healthz`: answers while the daemon serves.

use axum::Json;

use super::types::Health;

/// Liveness: 200 `{"status":"ok"}`.
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}
