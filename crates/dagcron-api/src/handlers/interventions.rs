//! Manual intervention on the tasks of a run that goes on:
//! `POST /api/v1/runs/{id}/tasks/{task}/{action}` (retry, mark succeeded or
//! skipped, fail), and `GET /api/v1/namespaces/{ns}/held`, the tasks that
//! wait for an operator.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use dagcron_core::TaskState;
use dagcron_core::authz::Need;
use dagcron_core::run::Intervention;
use dagcron_runtime::Intervened;
use dagcron_store::RunId;
use dagcron_store::prelude::*;

use crate::auth::{AuditNamespace, Principal};
use crate::handlers::runs::run_json;
use crate::routes::{no_namespace, no_run};
use crate::wire::{Errors, HeldPage, HeldTask, RunAnswer};
use crate::{ApiError, AppState};

/// The most runs with held tasks one listing reads.
const HELD_RUNS: u32 = 1000;

/// Acts on a task of a run that goes on: `retry` a held task (a new
/// attempt now, counting past its `max_attempts`), `mark_succeeded` or
/// `mark_skipped` a held, failed or `upstream_failed` one (the tasks
/// downstream that did not run because of it are decided again), or
/// `fail` a held one. `200` with the run once done; `202` when another
/// node of the cluster runs the run and was asked to. A run that has
/// ended, is stopping or has not started, or a task the action does not
/// apply to, is refused (`409`). The audit log records who did it.
#[utoipa::path(post, path = "/api/v1/runs/{id}/tasks/{task}/{action}", tag = "runs",
    params(("id" = i64, Path, description = "Run id"), ("task" = String, Path, description = "Task id"),
        ("action" = String, Path, description = "`retry`, `mark_succeeded`, `mark_skipped` or `fail`")),
    responses((status = 200, description = "Done", body = RunAnswer),
        (status = 202, description = "Asked of the node that runs the run", body = RunAnswer), Errors))]
pub(crate) async fn intervene<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((id, task, action)): Path<(RunId, String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let run = run_json(&st, id).await?;
    who.allow(Need::Operate, Some(&run.namespace), no_run(id))?;
    let action: Intervention = action.parse().map_err(ApiError::not_found)?;
    let status = match st.engine.intervene(id, &task, action).await? {
        Intervened::Done => StatusCode::OK,
        Intervened::Asked => StatusCode::ACCEPTED,
    };
    Ok((
        status,
        Extension(AuditNamespace(run.namespace)),
        Json(run_json(&st, id).await?),
    ))
}

/// The tasks of `ns` held after their last retry failed
/// (`on_exhausted: hold`), waiting for an operator, on every node of the
/// cluster: oldest run first, from at most 1000 runs.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/held", tag = "runs",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = HeldPage), Errors))]
pub(crate) async fn list_held<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
) -> Result<Json<HeldPage>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_namespace(&ns))?;
    let runs = st.store.held_runs(&ns, HELD_RUNS).await?;
    let items = runs
        .iter()
        .flat_map(|r| {
            r.tasks
                .iter()
                .filter(|t| t.state == TaskState::Held)
                .map(move |t| {
                    let last = t.attempts.last();
                    HeldTask {
                        run: r.id,
                        job: r.job.clone(),
                        task: t.id.clone(),
                        attempts: last.map_or(0, |a| a.number),
                        held_since: last.and_then(|a| a.finished_at),
                        error: last.and_then(|a| a.error.clone()),
                    }
                })
        })
        .collect();
    Ok(Json(HeldPage { items }))
}
