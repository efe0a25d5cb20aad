//! A job's upcoming fires: what its schedules will fire (with the fires
//! its exclusion calendars suppress marked) beside the runs planned for an
//! instant by a trigger with `at`.

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use dagcron_core::Job;
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use jiff::Timestamp;
use serde::Deserialize;

use crate::auth::Principal;
use crate::handlers::jobs::stored_job;
use crate::routes::no_job;
use crate::wire::{Errors, UpcomingAnswer, UpcomingFire};
use crate::{ApiError, AppState};

/// How many upcoming fires to list.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UpcomingQuery {
    /// At most this many of each kind (1 to 100, default 10).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
}

/// A job's next fires, soonest first: the next `limit` fires of its
/// schedules (none while it is paused; those an exclusion calendar
/// suppresses are listed with its name) and its next `limit` planned runs.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}/upcoming", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"), UpcomingQuery),
    responses((status = 200, body = UpcomingAnswer), Errors))]
pub(crate) async fn upcoming<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<UpcomingQuery>,
) -> Result<Json<UpcomingAnswer>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    let limit = match q.limit {
        None => 10,
        Some(n) if (1..=100).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and 100, not {n}"
            )));
        }
    };
    let stored = stored_job(&st, &ns, &name).await?;
    let mut items = Vec::new();
    // A stored job that no longer validates fires nothing (as its
    // `next_fire` says).
    let job = Job::from_canonical(&stored.namespace, &stored.spec).ok();
    if let Some(job) = job.filter(|_| !stored.paused) {
        items.extend(
            job.upcoming_after(Timestamp::now(), limit as usize)
                .into_iter()
                .map(|(at, calendar)| UpcomingFire {
                    at,
                    kind: "schedule".into(),
                    run_id: None,
                    suppressed_by: calendar.map(str::to_string),
                }),
        );
    }
    items.extend(
        st.store
            .planned_runs(&ns, &name, limit)
            .await?
            .into_iter()
            .map(|r| UpcomingFire {
                at: r.scheduled_at,
                kind: "planned".into(),
                run_id: Some(r.id),
                suppressed_by: None,
            }),
    );
    items.sort_by_key(|f| (f.at, f.run_id));
    Ok(Json(UpcomingAnswer { items }))
}
