//! The router: every route and its handler (in the file of its
//! resource), the OpenAPI document, and the look-ups the handlers share.

use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::{get, post};
use axum::{Json, Router};
use dagcron_store::RunId;
use dagcron_store::prelude::*;
use serde::Deserialize;

use crate::handlers::health::*;
use crate::handlers::jobs::*;
use crate::handlers::runs::*;
use crate::wire::{ErrorBody, Errors};
use crate::{ApiError, AppState};

/// The OpenAPI document of every route below.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "dagcron",
        description = "The REST API of dagcron, a distributed job scheduler. Every error answer is `{\"error\": {\"code\", \"message\", \"details\"}}`."
    ),
    paths(
        health, ready, crate::metrics::metrics, openapi, cluster, workers, apply, list_jobs, get_job, put_job, delete_job, pause,
        resume, trigger, trigger_batch, backfill, list_runs, browse_runs, list_fires, get_run, cancel, crate::handlers::reruns::rerun,
        crate::handlers::interventions::intervene, crate::handlers::interventions::list_held, get_log,
        crate::handlers::notifications::list_notifications, crate::handlers::notifications::get_notification,
        crate::handlers::hooks::deliver, crate::handlers::versions::list_versions, crate::handlers::versions::get_version, crate::handlers::versions::rollback,
        crate::handlers::tokens::create_token, crate::handlers::tokens::list_tokens, crate::handlers::tokens::revoke_token,
        crate::handlers::audit::list_audit, crate::handlers::schedules::hotspots, crate::handlers::secrets::put_secret, crate::handlers::secrets::list_secrets,
        crate::handlers::secrets::delete_secret, crate::handlers::secrets::list_keys, crate::handlers::secrets::rotate_key,
        crate::handlers::operations::get_read_only, crate::handlers::operations::put_read_only,
        crate::handlers::operations::pause_all, crate::handlers::operations::resume_all,
        crate::handlers::quotas::get_quotas, crate::handlers::quotas::put_quotas, crate::handlers::upcoming::upcoming,
        crate::handlers::policy::get_policy, crate::handlers::policy::put_policy, crate::handlers::policy::delete_policy,
        crate::handlers::policy::get_default_policy, crate::handlers::policy::put_default_policy,
        crate::handlers::retention::get_retention, crate::handlers::retention::put_retention, crate::handlers::retention::prune
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub(crate) struct ApiDoc;

/// Declares the bearer token every operation but the public ones needs.
pub(crate) struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            Http, HttpAuthScheme, SecurityRequirement, SecurityScheme,
        };
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        // Liveness and this document need no token.
        for path in ["/healthz", "/readyz", "/api/v1/openapi.json"] {
            if let Some(op) = openapi
                .paths
                .paths
                .get_mut(path)
                .and_then(|i| i.get.as_mut())
            {
                op.security = Some(vec![SecurityRequirement::default()]);
            }
        }
    }
}

pub(crate) fn no_job(ns: &str, name: &str) -> impl FnOnce() -> ApiError + use<> {
    let message = format!("no job {ns}/{name}");
    move || ApiError::not_found(message)
}

pub(crate) fn no_namespace(ns: &str) -> impl FnOnce() -> ApiError + use<> {
    let message = format!("no namespace {ns}");
    move || ApiError::not_found(message)
}

pub(crate) fn no_run(id: RunId) -> impl FnOnce() -> ApiError {
    move || ApiError::not_found(format!("no run {id}"))
}

pub(crate) fn router<S: Store>(state: AppState<S>) -> Router {
    let max_body = state.max_body_bytes;
    Router::new()
        .route("/healthz", get(health::<S>))
        .route("/readyz", get(ready::<S>))
        .route("/metrics", get(crate::metrics::metrics::<S>))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/cluster", get(cluster::<S>))
        .route("/api/v1/workers", get(workers::<S>))
        .route("/api/v1/apply", post(apply::<S>))
        .route(
            "/api/v1/admin/read-only",
            get(crate::handlers::operations::get_read_only::<S>)
                .put(crate::handlers::operations::put_read_only::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/quotas",
            get(crate::handlers::quotas::get_quotas::<S>)
                .put(crate::handlers::quotas::put_quotas::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/policy",
            get(crate::handlers::policy::get_policy::<S>)
                .put(crate::handlers::policy::put_policy::<S>)
                .delete(crate::handlers::policy::delete_policy::<S>),
        )
        .route(
            "/api/v1/admin/policy",
            get(crate::handlers::policy::get_default_policy::<S>)
                .put(crate::handlers::policy::put_default_policy::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/retention",
            get(crate::handlers::retention::get_retention::<S>)
                .put(crate::handlers::retention::put_retention::<S>),
        )
        .route(
            "/api/v1/admin/prune",
            post(crate::handlers::retention::prune::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/pause",
            post(crate::handlers::operations::pause_all::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/resume",
            post(crate::handlers::operations::resume_all::<S>),
        )
        .route("/api/v1/namespaces/{ns}/jobs", get(list_jobs::<S>))
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}",
            get(get_job::<S>).put(put_job::<S>).delete(delete_job::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/pause",
            post(pause::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/resume",
            post(resume::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/trigger",
            post(trigger::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/trigger-batch",
            post(trigger_batch::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/upcoming",
            get(crate::handlers::upcoming::upcoming::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/backfill",
            post(backfill::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/runs",
            get(list_runs::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/fires",
            get(list_fires::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/versions",
            get(crate::handlers::versions::list_versions::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}",
            get(crate::handlers::versions::get_version::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}/rollback",
            post(crate::handlers::versions::rollback::<S>),
        )
        .route(
            "/api/v1/schedules/hotspots",
            get(crate::handlers::schedules::hotspots::<S>),
        )
        .route("/api/v1/runs/{id}", get(get_run::<S>))
        .route("/api/v1/runs/{id}/cancel", post(cancel::<S>))
        .route(
            "/api/v1/runs/{id}/rerun",
            post(crate::handlers::reruns::rerun::<S>),
        )
        .route(
            "/api/v1/runs/{id}/tasks/{task}/{action}",
            post(crate::handlers::interventions::intervene::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/held",
            get(crate::handlers::interventions::list_held::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/notifications",
            get(crate::handlers::notifications::list_notifications::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/notifications/{id}",
            get(crate::handlers::notifications::get_notification::<S>),
        )
        .route(
            "/api/v1/hooks/{ns}/{name}",
            post(crate::handlers::hooks::deliver::<S>),
        )
        .route(
            "/api/v1/runs/{id}/tasks/{task}/attempts/{n}/log",
            get(get_log::<S>),
        )
        .route(
            "/api/v1/tokens",
            post(crate::handlers::tokens::create_token::<S>)
                .get(crate::handlers::tokens::list_tokens::<S>),
        )
        .route(
            "/api/v1/tokens/{id}",
            axum::routing::delete(crate::handlers::tokens::revoke_token::<S>),
        )
        .route("/api/v1/runs", get(browse_runs::<S>))
        .route(
            "/api/v1/audit",
            get(crate::handlers::audit::list_audit::<S>),
        )
        .route(
            "/api/v1/secrets/keys",
            get(crate::handlers::secrets::list_keys::<S>),
        )
        .route(
            "/api/v1/secrets/rotate-key",
            post(crate::handlers::secrets::rotate_key::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/secrets",
            get(crate::handlers::secrets::list_secrets::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/secrets/{name}",
            axum::routing::put(crate::handlers::secrets::put_secret::<S>)
                .delete(crate::handlers::secrets::delete_secret::<S>),
        )
        .fallback(unknown_path)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate::<S>,
        ))
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::map_response(crate::error::json_errors))
}

pub(crate) async fn unknown_path(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no such path: {}", uri.path()))
}

/// The OpenAPI 3.1 document of this API.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "The document", body = Object), Errors))]
pub(crate) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(<ApiDoc as utoipa::OpenApi>::openapi())
}

/// Parses a body as JSON (by content type) or YAML.
pub(crate) fn parse_body<T: for<'de> Deserialize<'de>>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    let parsed = if is_json {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    } else {
        std::str::from_utf8(body)
            .map_err(|e| format!("the body is not UTF-8: {e}"))
            .and_then(|text| {
                dagcron_core::yaml::from_str_all(text, "the job file").map_err(|all| all.join("\n"))
            })
    };
    parsed.map_err(|message| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_job_file",
            format!("cannot read the job file: {message}"),
        )
    })
}

/// A page of a listing.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// At most this many items (1 to 1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
    /// Where the previous page ended (its `next_cursor`).
    pub(crate) cursor: Option<String>,
}

pub(crate) fn limit(q: Option<u32>) -> Result<u32, ApiError> {
    match q {
        None => Ok(50),
        Some(n) if (1..=1000).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit {n} is out of range: 1 to 1000"
        ))),
    }
}
