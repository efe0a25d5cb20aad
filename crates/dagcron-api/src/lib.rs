//! The REST API under `/api/v1`, as an axum [`Router`] value: tests call it
//! without a socket, the binary serves it.
//!
//! Reads go to the store; changes go to the engine, which answers after
//! they are committed. Errors are JSON: `{"error": {"code", "message", "details"}}`.
//!
//! # How it works
//!
//! The REST API as an axum `Router` value (tests call it with `oneshot`). Reads
//! go to the store, changes to the engine. The handlers are in `handlers/`, a file per
//! resource, and share `state.rs` (the `AppState`); `routes.rs` is the
//! router, the OpenAPI document and the look-ups handlers share;
//! `handlers/jobs.rs`, `runs.rs` and `health.rs` serve jobs, runs (triggers,
//! backfills, the fire ledger, logs) and liveness, readiness, the cluster
//! and the agents. `auth.rs` turns a bearer token into
//! a `Principal` (the token's keyed hash is looked up in the store) and every
//! handler asks it `allow(need, namespace)`, decided by the pure
//! `dagcron_core::authz` (roles per namespace or over the instance; another
//! namespace's objects answer as absent), and records every change and
//! every refused call in the hash-chained audit log; `tokens.rs` serves
//! `/api/v1/tokens`, `audit.rs` `/api/v1/audit`, `schedules.rs` the
//! hot-spot report (counted on blocking threads while the jobs are read a
//! page at a time) and the peak-per-second gauge kept beside everything,
//! `operations.rs` the read-only mode (a setting in the store, read at each
//! change, so every node obeys it) and pausing a namespace, `retention.rs`
//! the retention per namespace (a setting read by every node's pruner) and
//! pruning on demand, `policy.rs` the execution policy per namespace (a
//! setting, checked at apply; `StoredPolicies` is the engine's source of
//! policies when an attempt starts, read again after 2 s), `quotas.rs` the quotas per namespace (a setting too,
//! decided by `dagcron_core::quota`; the trigger rate a token bucket per server; a trigger, a re-run or a
//! backfill reads the read-only mode and the namespace's quotas in one
//! statement, `SettingStore::get_settings`),
//! `metrics.rs` `/metrics` (the kept registry, then the gauges of the moment
//! read from the engine, the cluster view and the agent pool into a registry
//! of each scrape; OpenMetrics or the classic text by `Accept`),
//! `versions.rs` a job's versions and rollbacks (applied through the
//! engine), `reruns.rs` re-runs, `interventions.rs` an operator's action on a task
//! and the held tasks of a namespace, `secrets.rs` the secrets
//! (AES-256-GCM under the master key, bound to namespace, name and version;
//! it is also the engine's `Secrets` source); `wire/` holds the request and
//! answer types (a file per group of routes), from which the OpenAPI document
//! is generated and which the command line reads back. Store records are not
//! answers: the handlers convert them into these types.
//!
//! **Architecture Invariant:** no route is unclassified (a test calls every
//! route with every role), and no answer holds a token's or a secret's value. Every error answer is JSON with a
//! stable code: a response layer rewrites axum's own rejections (`404`, `405`,
//! `413`, path and query errors) into that shape. `/readyz` asks the store and
//! the engine's loop (`EngineHandle::ping`) with a 2 s bound, reads whether
//! the engine's commits go through (`writes`), and in a cluster reads the
//! lease and the clock. `with_grpc` puts the API and
//! the agents' gRPC service on one port, choosing by content type, so that an
//! unknown REST path is a JSON `404`.

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
pub use handlers::runs::log_attachment;
pub use handlers::{audit, policy, quotas, schedules, secrets, tokens};
pub use metrics::metrics_router;
pub use state::{AppState, AttemptOutput, DEFAULT_MAX_BODY_BYTES};

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
