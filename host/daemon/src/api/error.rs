//! The API's error type: every failure becomes a status code and a JSON body
//! `{"error": "..."}` whose message says what to fix (plus a few machine-readable fields where
//! a client needs them, such as the log start offset after an out-of-range fetch).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use narad_storage::StorageError;
use serde_json::{Map, Value};

use crate::metastore::MetastoreError;
use crate::produce::ProduceError;
use crate::topics::TopicError;
use crate::topics::set_aside::SetAsideError;

/// An HTTP error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    extra: Map<String, Value>,
    retry_after_secs: Option<u64>,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            extra: Map::new(),
            retry_after_secs: None,
        }
    }

    /// Asks the client to retry after `secs` seconds (`Retry-After`): for a refusal that
    /// passes by itself (an owner that is away, a node that is fenced).
    pub(crate) fn retry_after(mut self, secs: u64) -> ApiError {
        self.retry_after_secs = Some(secs);
        self
    }

    /// 400: the request is malformed or asks for something invalid.
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404: the topic or partition does not exist.
    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 413: a record or the body is over its size limit.
    pub(crate) fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// Adds a machine-readable field beside `error`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn internal(message: String) -> ApiError {
        tracing::error!(error = %message, "request failed inside the daemon");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("error".to_owned(), Value::String(self.message));
        body.extend(self.extra);
        let mut response = (self.status, Json(Value::Object(body))).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        response
    }
}

impl From<StorageError> for ApiError {
    fn from(err: StorageError) -> ApiError {
        match &err {
            StorageError::UnknownPartition { id } => {
                ApiError::not_found(format!("partition {id} does not exist"))
            }
            StorageError::Quarantined { id, reason } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "partition {id} is quarantined ({reason}); other partitions keep working; \
                     an operator must repair or restore its files before it serves again"
                ),
            )
            .with("reason", reason.to_string()),
            StorageError::Failed { id, reason } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "partition {id} stopped after a disk error ({reason}); it reopens by itself on a use at least {} s later once the disk works again (or restart the daemon)",
                    narad_storage::DEFAULT_FAILED_REOPEN_AFTER.as_secs()
                ),
            )
            .with("reason", reason.to_string()),
            StorageError::OffsetBelowLogStart { id, requested, log_start } => ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!(
                    "offset {requested} of {id} is no longer stored (deleted by retention, or the partition was re-created); the oldest stored offset is {log_start}"
                ),
            )
            .with("log_start_offset", *log_start),
            StorageError::OffsetBeyondEnd { id, requested, high_watermark } => ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!(
                    "offset {requested} of {id} is beyond the end; the next offset to be written is {high_watermark}"
                ),
            )
            .with("high_watermark", *high_watermark),
            StorageError::Sealed { id } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "partition {id} is being moved to another node; retry in a moment (the \
                     request then goes to its new owner)"
                ),
            ),
            StorageError::EmptyBatch => ApiError::bad_request("a batch needs at least one record"),
            StorageError::RecordTooLarge { .. } => ApiError::too_large(err.to_string()),
            StorageError::InvalidName(e) => ApiError::bad_request(format!("invalid topic name: {e}")),
            StorageError::PartitionOutOfRange { .. } => ApiError::bad_request(err.to_string()),
            _ => ApiError::internal(err.to_string()),
        }
    }
}

impl From<MetastoreError> for ApiError {
    fn from(err: MetastoreError) -> ApiError {
        match &err {
            MetastoreError::TopicExists { .. }
            | MetastoreError::UserExists { .. }
            | MetastoreError::OwnerChanged { .. }
            | MetastoreError::OwnerAlive { .. } => {
                ApiError::new(StatusCode::CONFLICT, err.to_string())
            }
            MetastoreError::UnknownTopic { .. }
            | MetastoreError::UnknownUser { .. }
            | MetastoreError::UnknownAcl { .. } => ApiError::not_found(err.to_string()),
            MetastoreError::BadUser(_) | MetastoreError::BadAcl(_) => {
                ApiError::bad_request(err.to_string())
            }
            MetastoreError::CannotShrink { .. } => ApiError::bad_request(err.to_string()),
            MetastoreError::LinkExists { .. } | MetastoreError::PluginInUse { .. } => {
                ApiError::new(StatusCode::CONFLICT, err.to_string())
            }
            MetastoreError::NoSuchPartition { .. } => ApiError::bad_request(err.to_string()),
            MetastoreError::UnknownLink { .. } | MetastoreError::UnknownPlugin { .. } => {
                ApiError::not_found(err.to_string())
            }
            MetastoreError::LinkRule(crate::metastore::LinkRuleError::TooManyChildren {
                ..
            }) => ApiError::new(StatusCode::CONFLICT, err.to_string()),
            MetastoreError::LinkRule(_)
            | MetastoreError::ItemTooLarge { .. }
            | MetastoreError::WriteTooLarge { .. } => ApiError::bad_request(err.to_string()),
            MetastoreError::Unavailable { .. } | MetastoreError::Contended { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
            _ => ApiError::internal(err.to_string()),
        }
    }
}

impl From<TopicError> for ApiError {
    fn from(err: TopicError) -> ApiError {
        match err {
            TopicError::Invalid(message) => ApiError::bad_request(message),
            TopicError::Metastore(e) => e.into(),
            TopicError::Storage(e) => e.into(),
            TopicError::Task(e) => ApiError::internal(e.to_string()),
            TopicError::Conflict(message) => ApiError::new(StatusCode::CONFLICT, message),
            TopicError::Unavailable(message) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
            }
            TopicError::SetAside(SetAsideError::UnknownEntry { .. }) => {
                ApiError::not_found(err.to_string())
            }
            TopicError::SetAside(SetAsideError::InvalidId { .. }) => {
                ApiError::bad_request(err.to_string())
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<ProduceError> for ApiError {
    fn from(err: ProduceError) -> ApiError {
        match err {
            ProduceError::Unavailable(e) => e.into(),
            ProduceError::Append {
                source,
                committed_partitions,
                ..
            } => {
                let mut e = ApiError::from(source);
                if !committed_partitions.is_empty() {
                    e.message.push_str(&format!(
                        "; the records of this request for partitions {committed_partitions:?} \
                         were committed before the failure"
                    ));
                }
                e
            }
            ProduceError::Task(e) => ApiError::internal(e.to_string()),
            ProduceError::Fenced(reason) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason.to_string()).retry_after(1)
            }
        }
    }
}
