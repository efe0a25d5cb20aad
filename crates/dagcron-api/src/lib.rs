//! The REST API under `/api/v1`, as an axum [`Router`] value: tests call it
//! without a socket, the binary serves it.
//!
//! Reads go to the store; changes go to the engine, which answers after
//! they are committed. Errors are JSON: `{"error": {"code", "message", "details"}}`.

pub mod auth;
mod error;
mod handlers;
mod metrics;
mod routes;
mod state;
pub mod wire;

use axum::Router;
use dagcron_store::prelude::*;

pub use error::ApiError;
pub use handlers::{audit, policy, quotas, schedules, secrets, tokens};
pub use metrics::metrics_router;
pub use state::{AppState, DEFAULT_MAX_BODY_BYTES};

/// The OpenAPI 3.1 document of the API (also served at `/api/v1/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    <routes::ApiDoc as utoipa::OpenApi>::openapi()
}

/// The API's routes. Every error answer, including those of axum itself
/// (an unknown path, a wrong method, a body too large, a path or query that
/// does not parse), is the JSON error shape.
pub fn router<S: Store>(state: AppState<S>) -> Router {
    routes::router(state)
}

/// The API and the agents' gRPC service on one port: a request whose
/// content type is gRPC goes to `grpc`, any other to `api` (so an unknown
/// REST path is a JSON `404`, not an empty gRPC answer).
pub fn with_grpc(api: Router, grpc: Router) -> Router {
    use tower::ServiceExt;
    Router::new().fallback_service(tower::service_fn(move |req: axum::extract::Request| {
        let is_grpc = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        let target = if is_grpc { grpc.clone() } else { api.clone() };
        target.oneshot(req)
    }))
}
