//! `/api/v1/namespaces/{ns}/jobs/{name}/versions`: a job's versions, one
//! version's spec, and rollbacks (a new version equal to an older one,
//! applied through the engine like any apply, so every node of a cluster
//! takes it in).

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use dagcron_core::Job;
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use dagcron_store::{ApplyResult, Origin};

use crate::auth::Principal;
use crate::routes::{PageQuery, limit, no_job};
use crate::wire::{Errors, RollbackAnswer, VersionAnswer, VersionPage};
use crate::{ApiError, AppState};

/// A version number from a path: versions start at 1.
fn version_of(v: i64) -> Result<i64, ApiError> {
    if v < 1 {
        return Err(ApiError::bad_request(format!(
            "version {v} is out of range: versions start at 1"
        )));
    }
    Ok(v)
}

fn no_version(ns: &str, name: &str, v: i64) -> ApiError {
    ApiError::not_found(format!("no version {v} of job {ns}/{name}"))
}

/// The version a job is at now (none: deleted).
async fn current<S: Store>(
    st: &AppState<S>,
    ns: &str,
    name: &str,
) -> Result<Option<i64>, ApiError> {
    Ok(st.store.get_job(ns, name).await?.map(|j| j.version))
}

/// A job's versions, newest first: when and by whom each was applied,
/// whether it was a rollback, the rules its fires were computed with. A
/// deleted job's versions stay.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}/versions", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"), PageQuery),
    responses((status = 200, body = VersionPage), Errors))]
pub(crate) async fn list_versions<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Result<Json<VersionPage>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    let page = st
        .store
        .list_job_versions(&ns, &name, limit(q.limit)?, q.cursor.as_deref())
        .await?;
    if page.items.is_empty() && q.cursor.is_none() {
        return Err(no_job(&ns, &name)());
    }
    let now = current(&st, &ns, &name).await?;
    Ok(Json(VersionPage {
        items: page
            .items
            .iter()
            .map(|v| VersionAnswer::of(v, now))
            .collect(),
        next_cursor: page.next_cursor,
    }))
}

/// One version of a job, with its canonical spec.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"),
        ("version" = i64, Path, description = "Version, from 1", minimum = 1)),
    responses((status = 200, body = VersionAnswer), Errors))]
pub(crate) async fn get_version<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name, v)): Path<(String, String, i64)>,
) -> Result<Json<VersionAnswer>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    let v = version_of(v)?;
    let version = st
        .store
        .get_job_version(&ns, &name, v)
        .await?
        .ok_or_else(|| no_version(&ns, &name, v))?;
    let now = current(&st, &ns, &name).await?;
    Ok(Json(VersionAnswer::with_spec(&version, now)))
}

/// Rolls a job back to an older version: a new version equal to it,
/// recorded as a rollback of it (nothing changes if the job is equal to
/// it already; a deleted job is created again).
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}/rollback", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"),
        ("version" = i64, Path, description = "The version to roll back to, from 1", minimum = 1)),
    responses((status = 200, body = RollbackAnswer), Errors))]
pub(crate) async fn rollback<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name, v)): Path<(String, String, i64)>,
) -> Result<Json<RollbackAnswer>, ApiError> {
    who.allow(Need::Develop, Some(&ns), no_job(&ns, &name))?;
    crate::handlers::operations::refuse_when_read_only(&st).await?;
    let v = version_of(v)?;
    let version = st
        .store
        .get_job_version(&ns, &name, v)
        .await?
        .ok_or_else(|| no_version(&ns, &name, v))?;
    let job = Job::from_canonical(&ns, &version.spec).map_err(|e| {
        ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("version {v} of {ns}/{name} is not valid under this server's rules: {e}"),
        )
    })?;
    crate::handlers::quotas::check_jobs(&st, &ns, std::slice::from_ref(&job)).await?;
    crate::handlers::policy::check_jobs(&st, &ns, std::slice::from_ref(&job)).await?;
    let origin = Origin {
        by: Some(who.actor()),
        rollback_of: Some(v),
    };
    let results = st.engine.apply_as(vec![job], origin).await?;
    let (job, result) = results
        .into_iter()
        .next()
        .ok_or_else(|| no_version(&ns, &name, v))?;
    let (result, version) = match result {
        ApplyResult::Created(n) => ("created", n),
        ApplyResult::Updated(n) => ("updated", n),
        ApplyResult::Unchanged(n) => ("unchanged", n),
    };
    Ok(Json(RollbackAnswer {
        job,
        result: result.into(),
        version,
        rolled_back_to: v,
    }))
}
