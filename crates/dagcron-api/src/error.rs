//! API errors as JSON with a stable code.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dagcron_runtime::EngineError;
use dagcron_store::StorageError;

use crate::wire::{ErrorBody, ErrorDetail, Problem};

/// An error answer: status, stable code, message, details.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code, such as `invalid_job_file`.
    pub code: &'static str,
    /// For people.
    pub message: String,
    /// For invalid input: one entry per problem.
    pub details: Option<Vec<Problem>>,
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
            details: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// A `404` with this message (also what another namespace's object
    /// answers, so that a scoped token learns nothing of it).
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

/// Turns an error answer that is not already the JSON error shape (axum's
/// own rejections: plain-text `400`, `404`, `405`, `413`, `415`) into it,
/// with a stable code per status and axum's text as the message.
pub(crate) async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let allow = resp.headers().get(axum::http::header::ALLOW).cloned();
    let text = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let (code, fallback) = match status {
        StatusCode::NOT_FOUND => ("not_found", "no such path"),
        StatusCode::METHOD_NOT_ALLOWED => {
            ("method_not_allowed", "this path does not take this method")
        }
        StatusCode::PAYLOAD_TOO_LARGE => ("payload_too_large", "the request body is too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ("unsupported_media_type", "unsupported content type")
        }
        s if s.is_server_error() => ("internal", "internal error"),
        _ => ("bad_request", "bad request"),
    };
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!("{fallback}: the server's `max_body_bytes` setting bounds it")
        }
        _ if text.is_empty() => fallback.to_string(),
        _ => text,
    };
    let mut out = ApiError::new(status, code, message).into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(axum::http::header::ALLOW, allow);
    }
    out
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.into(),
                message: self.message,
                details: self.details,
            },
        };
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            // When to come back: the backlog drains at the pace of the pool.
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        resp
    }
}

/// The `Retry-After` of a `429`.
const RETRY_AFTER_SECONDS: &str = "5";

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
            EngineError::Busy(m) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", m),
            e @ EngineError::Duplicate(_) => {
                ApiError::new(StatusCode::CONFLICT, "duplicate", e.to_string())
            }
            EngineError::Storage(s) => s.into(),
            EngineError::Stopped => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down",
            ),
        }
    }
}
