//! `GET /api/v1/schedules/hotspots`: the seconds of the coming window at
//! which the most jobs the caller may read fire together, computed by
//! `dagcron_core::hotspots` on blocking threads while the jobs are read a
//! page at a time.

use axum::Json;
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use dagcron_core::authz::Need;
use dagcron_core::hotspots::{self, HotspotJob, Hotspots, Limits};
use dagcron_core::{Dur, Job};
use dagcron_store::{Store, StoredJob};
use jiff::Timestamp;
use serde::Deserialize;

use crate::auth::Principal;
use crate::wire::{Errors, HotspotReport};
use crate::{ApiError, AppState};

/// Jobs read from the store at a time.
const PAGE: u32 = 1000;

/// What to count.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct HotspotQuery {
    /// How far ahead from now, such as `30m`, `1h` or `12h` (whole
    /// seconds, 1s to 1d; default 1h).
    window: Option<String>,
    /// At most this many hot seconds (1 to 100, default 10).
    #[param(minimum = 1, maximum = 100)]
    top: Option<u32>,
    /// Only the jobs of this namespace (a namespace-scoped token counts its
    /// own namespace, and another one's looks empty).
    namespace: Option<String>,
}

/// The hot-spot report: the seconds of the coming window at which the most
/// jobs fire together (same-frequency schedules such as `0 * * * *`), each
/// with its count, the first jobs behind it and a rewrite of their
/// expressions with `H` that spreads them; and the peak of fires due in one
/// second. Paused jobs do not fire and are not counted.
#[utoipa::path(get, path = "/api/v1/schedules/hotspots", tag = "schedules",
    params(HotspotQuery),
    responses((status = 200, body = HotspotReport), Errors))]
pub(crate) async fn hotspots<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Query(q): Query<HotspotQuery>,
) -> Result<Json<HotspotReport>, ApiError> {
    let window = q
        .window
        .as_deref()
        .map(|w| Dur::parse(w).map_err(|e| ApiError::bad_request(format!("window: {e}"))))
        .transpose()?;
    let query = hotspots::Query::new(Timestamp::now(), window, q.top.map(|t| t as usize))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut report = Hotspots::new(query, Limits::default());
    // Which jobs: a namespace asked for (another one than a scoped token's
    // looks empty), the token's own namespace, or every namespace.
    let scope = match q.namespace.or_else(|| who.grant.namespace.clone()) {
        Some(ns) => {
            if !who.lists(Need::Read, &ns)? {
                return Ok(Json(HotspotReport::from(&report.finish())));
            }
            Some(ns)
        }
        None => {
            who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
            None
        }
    };
    let mut cursor: Option<String> = None;
    let mut after: Option<(String, String)> = None;
    loop {
        let (page, more) = match &scope {
            Some(ns) => {
                let page = st.store.list_jobs(ns, PAGE, cursor.as_deref()).await?;
                cursor = page.next_cursor;
                let more = cursor.is_some();
                (page.items, more)
            }
            None => {
                let page = st.store.load_jobs(after.as_ref(), PAGE).await?;
                after = page.last().map(|j| (j.namespace.clone(), j.name.clone()));
                let more = page.len() == PAGE as usize;
                (page, more)
            }
        };
        let (back, counting) = tokio::task::spawn_blocking(move || {
            let counting = count(&mut report, page);
            (report, counting)
        })
        .await
        .map_err(internal)?;
        report = back;
        if !counting || !more {
            break;
        }
    }
    let report = tokio::task::spawn_blocking(move || report.finish())
        .await
        .map_err(internal)?;
    Ok(Json(HotspotReport::from(&report)))
}

/// Adds a page of stored jobs to the report; `false` once a limit was
/// reached. Paused jobs do not fire, and a stored job that no longer
/// validates fires nowhere either.
fn count(report: &mut Hotspots, page: Vec<StoredJob>) -> bool {
    for stored in page.iter().filter(|j| !j.paused) {
        let Ok(job) = Job::from_canonical(&stored.namespace, &stored.spec) else {
            continue;
        };
        if job.schedules.is_empty() {
            continue;
        }
        if !report.add(HotspotJob::of(&job)) {
            return false;
        }
    }
    true
}

fn internal(e: tokio::task::JoinError) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("the hot-spot report failed: {e}"),
    )
}
