//! `GET /metrics`: every series in the Prometheus (OpenMetrics) text format.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use super::AppState;
use super::error::ApiError;

/// The content type of the OpenMetrics text format, which Prometheus scrapes natively.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &state.metrics).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}"),
        )
    })?;
    Ok(([(CONTENT_TYPE, OPENMETRICS)], text))
}
