//! API errors as JSON with a stable code.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dagcron_runtime::EngineError;
use dagcron_store::StorageError;
use serde_json::{Value, json};

/// An error answer: status, stable code, message, details.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code, such as `invalid_job_file`.
    pub code: &'static str,
    /// For people.
    pub message: String,
    /// Structured details (for validation errors, one entry per problem).
    pub details: Value,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            details: Value::Null,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message, "details": self.details } });
        (self.status, Json(body)).into_response()
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> ApiError {
        match e {
            StorageError::Invalid(m) => ApiError::bad_request(m),
            other => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                other.to_string(),
            ),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::NotFound(m) => ApiError::not_found(m),
            EngineError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            EngineError::Invalid(m) => ApiError::bad_request(m),
            EngineError::Storage(s) => s.into(),
            EngineError::Stopped => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down",
            ),
        }
    }
}
