//! Jobs: apply a file, list, read, put, delete, pause and resume.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use dagcron_core::{Job, JobFile, JobSpec};
use dagcron_store::StoredJob;
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::auth::{AuditNamespace, Principal};
use crate::routes::*;
use crate::wire::{ApplyAnswer, ApplyItem, Errors, JobAnswer, JobPage, Problem};
use crate::{ApiError, AppState};
use dagcron_core::authz::Need;

pub(crate) fn validate(file: &JobFile) -> Result<Vec<Job>, ApiError> {
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
pub(crate) async fn apply<S: Store>(
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
    crate::handlers::operations::refuse_when_read_only(&st).await?;
    let jobs = validate(&file)?;
    crate::handlers::quotas::check_jobs(&st, &ns, &jobs).await?;
    crate::handlers::policy::check_jobs(&st, &ns, &jobs).await?;
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

pub(crate) fn job_json(job: &StoredJob) -> JobAnswer {
    JobAnswer::of(job, Timestamp::now())
}

/// The jobs of a namespace, by name.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), PageQuery),
    responses((status = 200, body = JobPage), Errors))]
pub(crate) async fn list_jobs<S: Store>(
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
pub(crate) async fn get_job<S: Store>(
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
pub(crate) async fn put_job<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<JobAnswer>, ApiError> {
    who.allow(Need::Develop, Some(&ns), no_job(&ns, &name))?;
    crate::handlers::operations::refuse_when_read_only(&st).await?;
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
        notifiers: vec![],
        notify: vec![],
        jobs: vec![spec],
    })?;
    crate::handlers::quotas::check_jobs(&st, &ns, &jobs).await?;
    crate::handlers::policy::check_jobs(&st, &ns, &jobs).await?;
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
pub(crate) async fn delete_job<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    who.allow(Need::Develop, Some(&ns), no_job(&ns, &name))?;
    crate::handlers::operations::refuse_when_read_only(&st).await?;
    st.engine.delete(&ns, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pauses a job: it does not fire until resumed.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/pause", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    responses((status = 200, body = JobAnswer), Errors))]
pub(crate) async fn pause<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<JobAnswer>, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    st.engine.pause(&ns, &name, true).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}

/// Resumes a job; fires due while it was paused follow its misfire policy.
/// It also closes the job's failure breaker, if it is open.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/resume", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    responses((status = 200, body = JobAnswer), Errors))]
pub(crate) async fn resume<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<JobAnswer>, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    st.engine.pause(&ns, &name, false).await?;
    Ok(Json(job_json(&stored_job(&st, &ns, &name).await?)))
}
