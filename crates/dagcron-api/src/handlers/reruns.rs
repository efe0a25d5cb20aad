//! `POST /api/v1/runs/{id}/rerun`: a new run of a finished run's job
//! version and parameters, whole or from its failed tasks.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use dagcron_core::authz::Need;
use dagcron_store::RunId;
use dagcron_store::prelude::*;

use crate::auth::{AuditNamespace, Principal};
use crate::handlers::runs::run_json;
use crate::routes::no_run;
use crate::wire::{Errors, RerunBody, RunAnswer};
use crate::{ApiError, AppState};

/// Runs a finished run again: a new run of the same job version and
/// parameters (and instant), linked to it (`rerun_of`) and triggered
/// `rerun`. Every task runs again, or with `failed_only` only those that
/// did not end well and everything downstream of them, the others
/// carried over with their outcome. A run still going is refused (`409`),
/// and so is a run of a deleted job or of a version no longer stored.
#[utoipa::path(post, path = "/api/v1/runs/{id}/rerun", tag = "runs",
    params(("id" = i64, Path, description = "Run id")),
    request_body(content = Option<RerunBody>, content_type = "application/json"),
    responses((status = 201, description = "The new run", body = RunAnswer), Errors))]
pub(crate) async fn rerun<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<RunId>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let run = run_json(&st, id).await?;
    who.allow(Need::Operate, Some(&run.namespace), no_run(id))?;
    crate::handlers::quotas::check_trigger(&st, &run.namespace, 1).await?;
    let body: RerunBody = if body.iter().all(u8::is_ascii_whitespace) {
        RerunBody::default()
    } else {
        crate::handlers::operations::object(&body).map_err(|e| {
            ApiError::bad_request(format!("expected {{\"failed_only\": true or false}}: {e}"))
        })?
    };
    let new = st.engine.rerun(id, body.failed_only).await?;
    Ok((
        StatusCode::CREATED,
        Extension(AuditNamespace(run.namespace)),
        Json(run_json(&st, new).await?),
    ))
}
