//! The handlers, one per route.

use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use dagcron_core::{Job, JobFile, JobSpec};
use dagcron_store::{RunId, Store, StoredJob};
use jiff::Timestamp;
use serde::Deserialize;

use crate::auth::{AuditNamespace, Principal};
use crate::wire::{
    ApplyAnswer, ApplyItem, BackfillAnswer, BackfillBody, ClusterAnswer, ErrorBody, Errors,
    FireAnswer, FirePage, HealthAnswer, JobAnswer, JobPage, NodeAnswer, NodeStatus, Problem,
    ReadyAnswer, ReadyCheck, RunAnswer, RunPage, TriggerBatchAnswer, TriggerBatchBody, TriggerBody,
    WorkerAnswer, WorkersAnswer,
};
use crate::{ApiError, AppState};
use dagcron_core::authz::Need;

/// The OpenAPI document of every route below.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "dagcron",
        description = "The REST API of dagcron, a distributed job scheduler. Every error answer is `{\"error\": {\"code\", \"message\", \"details\"}}`."
    ),
    paths(
        health, ready, crate::metrics::metrics, openapi, cluster, workers, apply, list_jobs, get_job, put_job, delete_job, pause,
        resume, trigger, trigger_batch, backfill, list_runs, list_fires, get_run, cancel, crate::reruns::rerun,
        crate::interventions::intervene, crate::interventions::list_held, get_log,
        crate::versions::list_versions, crate::versions::get_version, crate::versions::rollback,
        crate::tokens::create_token, crate::tokens::list_tokens, crate::tokens::revoke_token,
        crate::audit::list_audit, crate::schedules::hotspots, crate::secrets::put_secret, crate::secrets::list_secrets,
        crate::secrets::delete_secret, crate::secrets::list_keys, crate::secrets::rotate_key,
        crate::operations::get_read_only, crate::operations::put_read_only,
        crate::operations::pause_all, crate::operations::resume_all,
        crate::quotas::get_quotas, crate::quotas::put_quotas, crate::upcoming::upcoming,
        crate::policy::get_policy, crate::policy::put_policy, crate::policy::delete_policy,
        crate::policy::get_default_policy, crate::policy::put_default_policy,
        crate::retention::get_retention, crate::retention::put_retention, crate::retention::prune
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub(crate) struct ApiDoc;

/// Declares the bearer token every operation but the public ones needs.
struct BearerAuth;

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
            get(crate::operations::get_read_only::<S>).put(crate::operations::put_read_only::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/quotas",
            get(crate::quotas::get_quotas::<S>).put(crate::quotas::put_quotas::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/policy",
            get(crate::policy::get_policy::<S>)
                .put(crate::policy::put_policy::<S>)
                .delete(crate::policy::delete_policy::<S>),
        )
        .route(
            "/api/v1/admin/policy",
            get(crate::policy::get_default_policy::<S>).put(crate::policy::put_default_policy::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/retention",
            get(crate::retention::get_retention::<S>).put(crate::retention::put_retention::<S>),
        )
        .route("/api/v1/admin/prune", post(crate::retention::prune::<S>))
        .route(
            "/api/v1/namespaces/{ns}/pause",
            post(crate::operations::pause_all::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/resume",
            post(crate::operations::resume_all::<S>),
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
            get(crate::upcoming::upcoming::<S>),
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
            get(crate::versions::list_versions::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}",
            get(crate::versions::get_version::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}/rollback",
            post(crate::versions::rollback::<S>),
        )
        .route(
            "/api/v1/schedules/hotspots",
            get(crate::schedules::hotspots::<S>),
        )
        .route("/api/v1/runs/{id}", get(get_run::<S>))
        .route("/api/v1/runs/{id}/cancel", post(cancel::<S>))
        .route("/api/v1/runs/{id}/rerun", post(crate::reruns::rerun::<S>))
        .route(
            "/api/v1/runs/{id}/tasks/{task}/{action}",
            post(crate::interventions::intervene::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/held",
            get(crate::interventions::list_held::<S>),
        )
        .route(
            "/api/v1/runs/{id}/tasks/{task}/attempts/{n}/log",
            get(get_log::<S>),
        )
        .route(
            "/api/v1/tokens",
            post(crate::tokens::create_token::<S>).get(crate::tokens::list_tokens::<S>),
        )
        .route(
            "/api/v1/tokens/{id}",
            axum::routing::delete(crate::tokens::revoke_token::<S>),
        )
        .route("/api/v1/audit", get(crate::audit::list_audit::<S>))
        .route("/api/v1/secrets/keys", get(crate::secrets::list_keys::<S>))
        .route(
            "/api/v1/secrets/rotate-key",
            post(crate::secrets::rotate_key::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/secrets",
            get(crate::secrets::list_secrets::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/secrets/{name}",
            axum::routing::put(crate::secrets::put_secret::<S>)
                .delete(crate::secrets::delete_secret::<S>),
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

async fn unknown_path(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no such path: {}", uri.path()))
}

/// The OpenAPI 3.1 document of this API.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "The document", body = Object), Errors))]
async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(<ApiDoc as utoipa::OpenApi>::openapi())
}

/// How long a readiness check waits for the store or the engine.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Readiness: whether this node can do its work now (the store answers,
/// the engine's loop takes commands, and in a cluster its lease runs and
/// its clock is close to the database's), with the reason when it cannot.
#[utoipa::path(get, path = "/readyz", tag = "meta",
    responses((status = 200, description = "Ready", body = ReadyAnswer), (status = 503, description = "Not ready, with the reason", body = ReadyAnswer), Errors))]
async fn ready<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    let check = |name: &str, problem: Option<String>| ReadyCheck {
        name: name.into(),
        ok: problem.is_none(),
        problem,
    };
    let waited = format!("no answer within {} s", READY_WAIT.as_secs());
    let store = match tokio::time::timeout(READY_WAIT, state.store.get_run(0)).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(waited.clone()),
    };
    let engine = match tokio::time::timeout(READY_WAIT, state.engine.ping()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("the engine's loop gave {waited}")),
    };
    let mut checks = vec![
        check("store", store),
        check("engine", engine),
        check("writes", state.engine.write_problem()),
    ];
    if let Some(cluster) = &state.cluster {
        let node = cluster.local();
        let lease = (!node.lease_valid).then(|| "the lease is not renewed".to_string());
        let clock = (!node.clock_ok).then(|| {
            format!(
                "the clock differs from the database's by {} ms",
                node.clock_skew_us / 1000
            )
        });
        checks.push(check("lease", lease));
        checks.push(check("clock", clock));
    }
    let ready = checks.iter().all(|c| c.ok);
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(ReadyAnswer { ready, checks }))
}

/// Liveness and, in a cluster, this node's standing: a node whose clock is
/// too far from the database's, or whose lease lapsed, answers 503.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, body = HealthAnswer), (status = 503, description = "Degraded", body = HealthAnswer), Errors))]
async fn health<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    let Some(cluster) = &state.cluster else {
        let ok = HealthAnswer {
            status: "ok".into(),
            problem: None,
            node: None,
        };
        return (StatusCode::OK, Json(ok));
    };
    let node = cluster.local();
    let problem = if !node.clock_ok {
        Some(format!(
            "clock differs from the database's by {} ms: owning no jobs",
            node.clock_skew_us / 1000
        ))
    } else if !node.lease_valid {
        Some("lease not renewed: firing stopped".to_string())
    } else {
        node.problem.clone()
    };
    let code = if problem.is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let status = if problem.is_some() { "degraded" } else { "ok" };
    let answer = HealthAnswer {
        status: status.into(),
        problem,
        node: Some(NodeStatus::from(&node)),
    };
    (code, Json(answer))
}

/// The remote worker agents of this server: labels, capacity, running,
/// last heartbeat, clock offset, version.
#[utoipa::path(get, path = "/api/v1/workers", tag = "cluster",
    responses((status = 200, body = WorkersAnswer), Errors))]
async fn workers<S: Store>(
    State(state): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<WorkersAnswer>, ApiError> {
    who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
    let pool = state.workers.as_ref();
    let items = pool
        .map(|p| p.workers())
        .unwrap_or_default()
        .iter()
        .map(WorkerAnswer::from)
        .collect();
    // Results that came back after their attempt had been given up on (a
    // stale fencing token): refused, and counted here.
    let stale = pool.map_or(0, |p| p.stale_results());
    Ok(Json(WorkersAnswer {
        items,
        stale_results_refused: stale,
        foreign_reports_refused: pool.map_or(0, |p| p.foreign_reports()),
    }))
}

/// The nodes of the cluster, their leases, epochs, clock skew and jobs.
#[utoipa::path(get, path = "/api/v1/cluster", tag = "cluster",
    responses((status = 200, body = ClusterAnswer), Errors))]
async fn cluster<S: Store>(
    State(state): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<ClusterAnswer>, ApiError> {
    who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::not_found(
            "this server runs alone on its embedded database; start it with --database postgres://... to form a cluster",
        ));
    };
    let nodes = cluster.nodes().await?;
    Ok(Json(ClusterAnswer {
        this_node: NodeStatus::from(&cluster.local()),
        nodes: nodes.iter().map(NodeAnswer::from).collect(),
    }))
}

/// Parses a body as JSON (by content type) or YAML.
fn parse_body<T: for<'de> Deserialize<'de>>(
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
            .and_then(|text| serde_saphyr::from_str(text).map_err(|e| e.to_string()))
    };
    parsed.map_err(|message| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_job_file",
            format!("cannot read the job file: {message}"),
        )
    })
}

fn validate(file: &JobFile) -> Result<Vec<Job>, ApiError> {
    file.validate().map_err(|errors| {
        let mut err = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_job_file",
            format!("the job file has {} problem(s): {errors}", errors.0.len()),
        );
        err.details = Some(errors.0.iter().map(Problem::from).collect());
        err
    })
}

/// Applies a job file (YAML, or JSON with a JSON content type):
/// idempotent, every job created, updated or left unchanged.
#[utoipa::path(post, path = "/api/v1/apply", tag = "jobs",
    request_body(description = "A job file: `namespace` and `jobs`", content(
        (Object = "application/json"), (Object = "application/yaml"))),
    responses((status = 200, body = ApplyAnswer), Errors))]
async fn apply<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(Extension<AuditNamespace>, Json<ApplyAnswer>), ApiError> {
    let file: JobFile = parse_body(&headers, &body)?;
    let ns = file.namespace.clone();
    who.allow(Need::Develop, Some(&ns), || {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token may not apply jobs to namespace {ns}"),
        )
    })?;
    crate::operations::refuse_when_read_only(&st).await?;
    let jobs = validate(&file)?;
    crate::quotas::check_jobs(&st, &ns, &jobs).await?;
    crate::policy::check_jobs(&st, &ns, &jobs).await?;
    let origin = dagcron_store::Origin {
        by: Some(who.actor()),
        rollback_of: None,
    };
    let results = st.engine.apply_as(jobs, origin).await?;
    let jobs = results
        .into_iter()
        .map(|(job, r)| ApplyItem {
            job,
            result: r.into(),
        })
        .collect();
    Ok((
        Extension(AuditNamespace(file.namespace.clone())),
        Json(ApplyAnswer {
            namespace: file.namespace,
            jobs,
        }),
    ))
}

fn job_json(job: &StoredJob) -> JobAnswer {
    JobAnswer::of(job, Timestamp::now())
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

/// The jobs of a namespace, by name.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), PageQuery),
    responses((status = 200, body = JobPage), Errors))]
async fn list_jobs<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<JobPage>, ApiError> {
    let limit = limit(q.limit)?;
    if !who.lists(Need::Read, &ns)? {
        return Ok(Json(JobPage {
            items: vec![],
            next_cursor: None,
        }));
    }
    let page = st.store.list_jobs(&ns, limit, q.cursor.as_deref()).await?;
    Ok(Json(JobPage {
        items: page.items.iter().map(job_json).collect(),
        next_cursor: page.next_cursor,
    }))
}

pub(crate) async fn stored_job<S: Store>(
    st: &AppState<S>,
    ns: &str,
    name: &str,
) -> Result<StoredJob, ApiError> {
    st.store
        .get_job(ns, name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no job {ns}/{name}")))
}

/// One job.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    responses((status = 200, body = JobAnswer), Errors))]
async fn get_job<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<JobAnswer>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

/// Creates or updates one job from its declaration (the body names the
/// same job as the path).
#[utoipa::path(put, path = "/api/v1/namespaces/{ns}/jobs/{name}", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    request_body(description = "One job's declaration, as in a job file", content(
        (Object = "application/json"), (Object = "application/yaml"))),
    responses((status = 200, body = JobAnswer), Errors))]
async fn put_job<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<JobAnswer>, ApiError> {
    who.allow(Need::Develop, Some(&ns), no_job(&ns, &name))?;
    crate::operations::refuse_when_read_only(&st).await?;
    let spec: JobSpec = parse_body(&headers, &body)?;
    if spec.name != name {
        return Err(ApiError::bad_request(format!(
            "the body names job {:?} but the path names {name:?}",
            spec.name
        )));
    }
    let jobs = validate(&JobFile {
        namespace: ns.clone(),
        calendars: vec![],
        jobs: vec![spec],
    })?;
    crate::quotas::check_jobs(&st, &ns, &jobs).await?;
    crate::policy::check_jobs(&st, &ns, &jobs).await?;
    let origin = dagcron_store::Origin {
        by: Some(who.actor()),
        rollback_of: None,
    };
    st.engine.apply_as(jobs, origin).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

/// Deletes a job (its history stays); its runs are cancelled.
#[utoipa::path(delete, path = "/api/v1/namespaces/{ns}/jobs/{name}", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    responses((status = 204, description = "Deleted"), Errors))]
async fn delete_job<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    who.allow(Need::Develop, Some(&ns), no_job(&ns, &name))?;
    crate::operations::refuse_when_read_only(&st).await?;
    st.engine.delete(&ns, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pauses a job: it does not fire until resumed.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/pause", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    responses((status = 200, body = JobAnswer), Errors))]
async fn pause<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<JobAnswer>, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    st.engine.pause(&ns, &name, true).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

/// Resumes a job; fires due while it was paused follow its misfire policy.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/resume", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    responses((status = 200, body = JobAnswer), Errors))]
async fn resume<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<JobAnswer>, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    st.engine.pause(&ns, &name, false).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

pub(crate) async fn run_json<S: Store>(st: &AppState<S>, id: RunId) -> Result<RunAnswer, ApiError> {
    let run = st
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {id}")))?;
    Ok(RunAnswer::from(&run))
}

/// Starts a run now, with parameters over the job's defaults (an empty
/// body: none), or records one to be made `at` an instant: it is `planned`
/// until then (listed among the job's upcoming fires, cancellable), made
/// exactly once at its instant, and, if the server was down then, when it
/// is back by the job's misfire policy. With a W3C `traceparent` header,
/// the run's trace is a child of the caller's span (a malformed one is
/// ignored, as the W3C says).
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/trigger", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"),
        ("traceparent" = Option<String>, Header, description = "The caller's W3C trace context"),
        ("tracestate" = Option<String>, Header, description = "The caller's W3C trace state")),
    request_body(content = Option<TriggerBody>, content_type = "application/json"),
    responses((status = 201, body = RunAnswer), Errors))]
async fn trigger<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    let body: TriggerBody = if body.iter().all(u8::is_ascii_whitespace) {
        TriggerBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "expected {{\"params\": {{...}}, \"at\": RFC 3339 (optional)}}: {e}"
            ))
        })?
    };
    let params = vec![body.params];
    let mut runs = make_runs(&st, &ns, &name, &headers, params, body.at, |_| {
        "params".into()
    })
    .await?;
    Ok((StatusCode::CREATED, Json(runs.remove(0))))
}

/// Starts many runs of a job now in one call (1 to 1000, each with its
/// parameters over the job's defaults), or records them to be made `at`
/// an instant. They are decided together and committed together before
/// the answer, which lists them in the order asked: if any one is invalid
/// or would pass a limit (the namespace's quotas, counting each run as a
/// trigger; the job's `max_pending_runs` or overlap policy; the server's
/// ready backlog; read-only mode), none is made and the answer says why.
/// Each run is answered as committed, without attempts.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/trigger-batch", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"),
        ("traceparent" = Option<String>, Header, description = "The caller's W3C trace context"),
        ("tracestate" = Option<String>, Header, description = "The caller's W3C trace state")),
    request_body(content = TriggerBatchBody, content_type = "application/json"),
    responses((status = 201, body = TriggerBatchAnswer), Errors))]
async fn trigger_batch<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    let body: TriggerBatchBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"runs\": [{{\"params\": {{...}}}}, ...], \"at\": RFC 3339 (optional)}}: {e}"
        ))
    })?;
    let max = dagcron_runtime::MAX_TRIGGER_RUNS;
    if body.runs.is_empty() || body.runs.len() > max {
        return Err(ApiError::bad_request(format!(
            "`runs` holds 1 to {max} runs, not {}",
            body.runs.len()
        )));
    }
    let params = body.runs.into_iter().map(|r| r.params).collect();
    let path = |i| format!("runs[{i}].params");
    let runs = make_runs(&st, &ns, &name, &headers, params, body.at, path).await?;
    Ok((StatusCode::CREATED, Json(TriggerBatchAnswer { runs })))
}

/// The runs of a trigger, checked (`at`, every run's parameters, then
/// read-only mode and quotas: `path` names the `i`th in a problem) before the engine
/// makes them all or none; answered as the engine committed them.
async fn make_runs<S: Store>(
    st: &AppState<S>,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    params: Vec<std::collections::BTreeMap<String, String>>,
    at: Option<Timestamp>,
    path: impl Fn(usize) -> String,
) -> Result<Vec<RunAnswer>, ApiError> {
    if let Some(at) = at {
        check_planned_instant(at, Timestamp::now())?;
    }
    let problems: Vec<_> = params
        .iter()
        .enumerate()
        .flat_map(|(i, p)| dagcron_core::model::check_params(p, &path(i)))
        .collect();
    if !problems.is_empty() {
        let mut err = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_params",
            format!(
                "{} problem(s) with the parameters: {}",
                problems.len(),
                dagcron_core::ValidationErrors(problems.clone())
            ),
        );
        err.details = Some(problems.iter().map(Problem::from).collect());
        return Err(err);
    }
    crate::quotas::check_trigger(st, ns, params.len() as u32).await?;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let caller = header("traceparent")
        .and_then(|p| dagcron_runtime::trace::TraceParent::parse(p, header("tracestate")));
    let runs = st.engine.trigger_runs(ns, name, params, caller, at).await?;
    Ok(runs.iter().map(RunAnswer::from).collect())
}

/// How far ahead a run may be planned.
const MAX_PLAN_AHEAD: jiff::SignedDuration = jiff::SignedDuration::from_hours(10 * 366 * 24);

/// A trigger's `at` must be ahead of `now`, and not absurdly far.
fn check_planned_instant(at: Timestamp, now: Timestamp) -> Result<(), ApiError> {
    if at <= now {
        return Err(ApiError::bad_request(format!(
            "`at` ({at}) has passed (it is {now}); leave `at` out to run now"
        )));
    }
    if at.duration_since(now) > MAX_PLAN_AHEAD {
        return Err(ApiError::bad_request(format!(
            "`at` ({at}) is more than ten years ahead"
        )));
    }
    Ok(())
}

/// Creates a run for every fire of `[from, to)` not in the ledger yet.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/backfill", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    request_body(content = BackfillBody, content_type = "application/json"),
    responses((status = 201, body = BackfillAnswer), Errors))]
async fn backfill<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    crate::quotas::check_trigger(&st, &ns, 1).await?;
    let body: BackfillBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"from\": RFC 3339, \"to\": RFC 3339}}: {e}"
        ))
    })?;
    let runs = st.engine.backfill(&ns, &name, body.from, body.to).await?;
    Ok((StatusCode::CREATED, Json(BackfillAnswer { runs })))
}

/// A job's runs, newest first.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}/runs", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"), PageQuery),
    responses((status = 200, body = RunPage), Errors))]
async fn list_runs<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Result<Json<RunPage>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    let page = st
        .store
        .list_runs(&ns, &name, limit(q.limit)?, q.cursor.as_deref())
        .await?;
    Ok(Json(RunPage {
        items: page.items.iter().map(RunAnswer::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// A range of the fire ledger.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct FiresQuery {
    /// From this instant (RFC 3339), included.
    #[param(value_type = Option<String>, format = DateTime)]
    from: Option<Timestamp>,
    /// Up to this instant, excluded.
    #[param(value_type = Option<String>, format = DateTime)]
    to: Option<Timestamp>,
    /// At most this many fires (1 to 10000, default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u32>,
}

/// A job's fire ledger: every expected fire and what happened to it.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}/fires", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"), FiresQuery),
    responses((status = 200, body = FirePage), Errors))]
async fn list_fires<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<FiresQuery>,
) -> Result<Json<FirePage>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    let limit = match q.limit {
        None => 1000,
        Some(n) if (1..=10_000).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit {n} is out of range: 1 to 10000"
            )));
        }
    };
    let fires = st
        .store
        .list_fires(
            &ns,
            &name,
            q.from.unwrap_or(Timestamp::UNIX_EPOCH),
            q.to.unwrap_or(Timestamp::MAX),
            limit,
        )
        .await?;
    Ok(Json(FirePage {
        items: fires.iter().map(FireAnswer::from).collect(),
    }))
}

/// A run, its tasks and their attempts.
#[utoipa::path(get, path = "/api/v1/runs/{id}", tag = "runs",
    params(("id" = i64, Path, description = "Run id")),
    responses((status = 200, body = RunAnswer), Errors))]
async fn get_run<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<RunId>,
) -> Result<Json<RunAnswer>, ApiError> {
    let run = run_json(&st, id).await?;
    who.allow(Need::Read, Some(&run.namespace), no_run(id))?;
    Ok(Json(run))
}

/// Cancels a run: its running attempts are stopped, the rest cancelled.
#[utoipa::path(post, path = "/api/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = i64, Path, description = "Run id")),
    responses((status = 200, body = RunAnswer), Errors))]
async fn cancel<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<RunId>,
) -> Result<(Extension<AuditNamespace>, Json<RunAnswer>), ApiError> {
    let run = run_json(&st, id).await?;
    who.allow(Need::Operate, Some(&run.namespace), no_run(id))?;
    st.engine.cancel(id).await?;
    Ok((
        Extension(AuditNamespace(run.namespace)),
        Json(run_json(&st, id).await?),
    ))
}

/// How to read a log.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct LogQuery {
    /// Stream the output of a running attempt until it ends.
    #[serde(default)]
    follow: bool,
}

/// An attempt's output. With `?follow=true`, the body streams the output of
/// a running attempt as it comes and ends when the attempt does.
#[utoipa::path(get, path = "/api/v1/runs/{id}/tasks/{task}/attempts/{n}/log", tag = "runs",
    params(("id" = i64, Path, description = "Run id"), ("task" = String, Path, description = "Task id"),
        ("n" = u32, Path, description = "Attempt number, from 1"), LogQuery),
    responses((status = 200, description = "The output, stdout and stderr interleaved", body = String, content_type = "text/plain"), Errors))]
async fn get_log<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((id, task, n)): Path<(RunId, String, u32)>,
    Query(q): Query<LogQuery>,
) -> Result<axum::response::Response, ApiError> {
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    let missing = || ApiError::not_found(format!("no attempt {n} of task {task} in run {id}"));
    let Some(run) = st.store.get_run(id).await? else {
        return Err(missing());
    };
    who.allow(Need::Read, Some(&run.namespace), missing)?;
    let log =
        st.store.read_log(id, &task, n).await?.ok_or_else(|| {
            ApiError::not_found(format!("no attempt {n} of task {task} in run {id}"))
        })?;
    if !q.follow {
        return Ok((text, log).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(16);
    tokio::spawn(follow(st, id, task, n, tx));
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok((text, body).into_response())
}

/// Feeds a follower until the attempt has ended (or the follower left).
async fn follow<S: Store>(
    st: AppState<S>,
    id: RunId,
    task: String,
    n: u32,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::convert::Infallible>>,
) {
    let mut offset = 0;
    loop {
        if let Some(live) = st.engine.live_log(id, &task, n) {
            loop {
                let (bytes, done) = live.read_from(offset);
                if !bytes.is_empty() {
                    offset += bytes.len();
                    if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                        return;
                    }
                }
                if done {
                    return;
                }
                live.wait(std::time::Duration::from_millis(500)).await;
                if tx.is_closed() {
                    return;
                }
            }
        }
        // Not running here (not started yet, on an agent or another node,
        // or just finished): the stored record decides.
        let ended = match st.store.get_run(id).await {
            Ok(Some(run)) => run
                .tasks
                .iter()
                .find(|t| t.id == task)
                .and_then(|t| t.attempts.iter().find(|a| a.number == n))
                .is_none_or(|a| a.state.is_terminal()),
            _ => true,
        };
        if ended {
            if let Ok(Some(log)) = st.store.read_log(id, &task, n).await {
                if log.len() > offset {
                    let _ = tx.send(Ok(Bytes::from(log[offset..].to_vec()))).await;
                }
            }
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if tx.is_closed() {
            return;
        }
    }
}
