//! The REST API under `/api/v1`, as an axum [`Router`] value: tests call it
//! without a socket, the binary serves it.
//!
//! Reads go to the store; changes go to the engine, which answers after
//! they are committed. Errors are JSON: `{"error": {"code", "message", "details"}}`.

pub mod audit;
pub mod auth;
mod error;
mod health;
mod interventions;
mod jobs;
mod metrics;
mod operations;
pub mod policy;
pub mod quotas;
mod reruns;
mod retention;
mod routes;
mod runs;
pub mod schedules;
pub mod secrets;
pub mod tokens;
mod upcoming;
mod versions;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use dagcron_runtime::{ClusterHandle, EngineHandle};
use dagcron_store::prelude::*;

pub use error::ApiError;
pub use metrics::metrics_router;

/// What the handlers share.
pub struct AppState<S: Store> {
    /// Where history is read from.
    pub store: Arc<S>,
    /// Where changes are sent.
    pub engine: EngineHandle,
    /// The cluster this node belongs to, if any.
    pub cluster: Option<ClusterHandle>,
    /// The remote worker agents connected to this server.
    pub workers: Option<dagcron_agents::AgentPool>,
    /// The largest request body accepted, in bytes (larger: `413`).
    pub max_body_bytes: usize,
    /// The key token secrets are hashed under.
    pub keyring: Arc<auth::Keyring>,
    /// The key secrets are encrypted under (none: no secrets here).
    pub master_key: Option<Arc<secrets::KeySet>>,
    /// The series kept between scrapes of `/metrics` (the engine's
    /// counters); the gauges of the moment are added at each scrape.
    pub metrics: Option<Arc<prometheus_client::registry::Registry>>,
    /// The trigger buckets of the namespaces' quotas, and their refusals.
    pub quota: Arc<quotas::QuotaState>,
    /// What retention deleted (`dagcron_pruned_total`), shared with the
    /// pruner beside the engine.
    pub pruned: dagcron_runtime::PruneMetrics,
}

/// The default of [`AppState::max_body_bytes`]: 2 MiB, room for a job file
/// of a few thousand jobs.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 << 20;

impl<S: Store> Clone for AppState<S> {
    fn clone(&self) -> Self {
        AppState {
            store: self.store.clone(),
            engine: self.engine.clone(),
            cluster: self.cluster.clone(),
            workers: self.workers.clone(),
            max_body_bytes: self.max_body_bytes,
            keyring: self.keyring.clone(),
            master_key: self.master_key.clone(),
            metrics: self.metrics.clone(),
            quota: self.quota.clone(),
            pruned: self.pruned.clone(),
        }
    }
}

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
