//! The handlers, one per route.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use dagcron_core::{Job, JobFile, JobSpec};
use dagcron_store::{RunId, Store, StoredJob};
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ApiError, AppState};

pub(crate) fn router<S: Store>(state: AppState<S>) -> Router {
    let max_body = state.max_body_bytes;
    Router::new()
        .route("/healthz", get(health::<S>))
        .route("/api/v1/cluster", get(cluster::<S>))
        .route("/api/v1/workers", get(workers::<S>))
        .route("/api/v1/apply", post(apply::<S>))
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
        .route("/api/v1/runs/{id}", get(get_run::<S>))
        .route("/api/v1/runs/{id}/cancel", post(cancel::<S>))
        .route(
            "/api/v1/runs/{id}/tasks/{task}/attempts/{n}/log",
            get(get_log::<S>),
        )
        .fallback(unknown_path)
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::map_response(crate::error::json_errors))
}

async fn unknown_path(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no such path: {}", uri.path()))
}

/// Liveness and, in a cluster, this node's standing: a node whose clock is
/// too far from the database's, or whose lease lapsed, answers 503.
async fn health<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    let Some(cluster) = &state.cluster else {
        return (StatusCode::OK, Json(json!({ "status": "ok" })));
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
    (
        code,
        Json(json!({ "status": status, "problem": problem, "node": node })),
    )
}

/// The remote worker agents of this server: labels, capacity, running,
/// last heartbeat, clock offset, version.
async fn workers<S: Store>(State(state): State<AppState<S>>) -> Json<Value> {
    let pool = state.workers.as_ref();
    let items = pool.map(|p| p.workers()).unwrap_or_default();
    // Results that came back after their attempt had been given up on (a
    // stale fencing token): refused, and counted here.
    let stale = pool.map_or(0, |p| p.stale_results());
    Json(json!({ "items": items, "stale_results_refused": stale }))
}

/// The nodes of the cluster, their leases, epochs, clock skew and jobs.
async fn cluster<S: Store>(State(state): State<AppState<S>>) -> Result<Json<Value>, ApiError> {
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::not_found(
            "this server runs alone on its embedded database; start it with --database postgres://... to form a cluster",
        ));
    };
    let nodes = cluster.nodes().await?;
    Ok(Json(
        json!({ "this_node": cluster.local(), "nodes": nodes }),
    ))
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
        err.details = json!(errors.0);
        err
    })
}

async fn apply<S: Store>(
    State(st): State<AppState<S>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let file: JobFile = parse_body(&headers, &body)?;
    let jobs = validate(&file)?;
    let results = st.engine.apply(jobs).await?;
    let items: Vec<Value> = results
        .into_iter()
        .map(|(key, r)| json!({ "job": key, "result": r }))
        .collect();
    Ok(Json(json!({ "namespace": file.namespace, "jobs": items })))
}

fn job_json(job: &StoredJob) -> Value {
    let parsed = Job::from_canonical(&job.namespace, &job.spec);
    let next_fire = match (&parsed, job.paused) {
        (Ok(j), false) => j.next_fire_after(Timestamp::now()).map(|t| t.to_string()),
        _ => None,
    };
    json!({
        "namespace": job.namespace,
        "name": job.name,
        "version": job.version,
        "paused": job.paused,
        "updated_at": job.updated_at,
        "next_fire": next_fire,
        "spec": serde_json::from_str::<Value>(&job.spec).unwrap_or(Value::Null),
    })
}

#[derive(Deserialize)]
struct PageQuery {
    limit: Option<u32>,
    cursor: Option<String>,
}

fn limit(q: Option<u32>) -> Result<u32, ApiError> {
    match q {
        None => Ok(50),
        Some(n) if (1..=1000).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit {n} is out of range: 1 to 1000"
        ))),
    }
}

async fn list_jobs<S: Store>(
    State(st): State<AppState<S>>,
    Path(ns): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let page = st
        .store
        .list_jobs(&ns, limit(q.limit)?, q.cursor.as_deref())
        .await?;
    Ok(Json(
        json!({ "items": page.items.iter().map(job_json).collect::<Vec<_>>(), "next_cursor": page.next_cursor }),
    ))
}

async fn stored_job<S: Store>(
    st: &AppState<S>,
    ns: &str,
    name: &str,
) -> Result<StoredJob, ApiError> {
    st.store
        .get_job(ns, name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no job {ns}/{name}")))
}

async fn get_job<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

async fn put_job<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let spec: JobSpec = parse_body(&headers, &body)?;
    if spec.name != name {
        return Err(ApiError::bad_request(format!(
            "the body names job {:?} but the path names {name:?}",
            spec.name
        )));
    }
    let jobs = validate(&JobFile {
        namespace: ns.clone(),
        jobs: vec![spec],
    })?;
    st.engine.apply(jobs).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

async fn delete_job<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    st.engine.delete(&ns, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    st.engine.pause(&ns, &name, true).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

async fn resume<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    st.engine.pause(&ns, &name, false).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TriggerBody {
    #[serde(default)]
    params: BTreeMap<String, String>,
}

async fn run_json<S: Store>(st: &AppState<S>, id: RunId) -> Result<Value, ApiError> {
    let run = st
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {id}")))?;
    Ok(serde_json::to_value(run).expect("runs serialize"))
}

async fn trigger<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: TriggerBody = if body.iter().all(u8::is_ascii_whitespace) {
        TriggerBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("expected {{\"params\": {{...}}}}: {e}")))?
    };
    let problems = dagcron_core::model::check_params(&body.params, "params");
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
        err.details = json!(problems);
        return Err(err);
    }
    let id = st.engine.trigger(&ns, &name, body.params).await?;
    Ok((StatusCode::CREATED, Json(run_json(&st, id).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillBody {
    from: Timestamp,
    to: Timestamp,
}

async fn backfill<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: BackfillBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"from\": RFC 3339, \"to\": RFC 3339}}: {e}"
        ))
    })?;
    let runs = st.engine.backfill(&ns, &name, body.from, body.to).await?;
    Ok((StatusCode::CREATED, Json(json!({ "runs": runs }))))
}

async fn list_runs<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let page = st
        .store
        .list_runs(&ns, &name, limit(q.limit)?, q.cursor.as_deref())
        .await?;
    Ok(Json(
        json!({ "items": page.items, "next_cursor": page.next_cursor }),
    ))
}

#[derive(Deserialize)]
struct FiresQuery {
    from: Option<Timestamp>,
    to: Option<Timestamp>,
    limit: Option<u32>,
}

async fn list_fires<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<FiresQuery>,
) -> Result<Json<Value>, ApiError> {
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
    let items: Vec<Value> = fires.iter().map(|f| json!({ "scheduled_at": f.scheduled_at, "outcome": f.outcome.as_str(), "run_id": f.run_id })).collect();
    Ok(Json(json!({ "items": items })))
}

async fn get_run<S: Store>(
    State(st): State<AppState<S>>,
    Path(id): Path<RunId>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(run_json(&st, id).await?))
}

async fn cancel<S: Store>(
    State(st): State<AppState<S>>,
    Path(id): Path<RunId>,
) -> Result<Json<Value>, ApiError> {
    st.engine.cancel(id).await?;
    Ok(Json(run_json(&st, id).await?))
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    follow: bool,
}

/// An attempt's output. With `?follow=true`, the body streams the output of
/// a running attempt as it comes and ends when the attempt does.
async fn get_log<S: Store>(
    State(st): State<AppState<S>>,
    Path((id, task, n)): Path<(RunId, String, u32)>,
    Query(q): Query<LogQuery>,
) -> Result<axum::response::Response, ApiError> {
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
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
