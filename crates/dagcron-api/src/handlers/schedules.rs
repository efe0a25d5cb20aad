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
use dagcron_store::StoredJob;
use dagcron_store::prelude::*;
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

/// How often [`keep_peak`] counts again.
pub const PEAK_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Registers the gauge `dagcron_schedule_peak_fires_per_second`, which
/// [`keep_peak`] keeps up to date.
pub fn register_peak(
    registry: &mut prometheus_client::registry::Registry,
) -> prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64> {
    let gauge = prometheus_client::metrics::gauge::Gauge::default();
    registry.register(
        "dagcron_schedule_peak_fires_per_second",
        "The largest number of fires due in one second over the next hour (counted every minute)",
        gauge.clone(),
    );
    gauge
}

/// Keeps `gauge` at the largest number of fires due in one second over
/// the next hour, counting every job anew every [`PEAK_EVERY`] (the jobs
/// are read a page at a time and counted on blocking threads). Runs until
/// its task is aborted.
pub async fn keep_peak<S: Store>(
    store: std::sync::Arc<S>,
    gauge: prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
) {
    loop {
        match peak_now(&*store).await {
            Ok(peak) => {
                gauge.set(f64::from(peak.per_second));
            }
            Err(e) => tracing::warn!("counting the fires of the next hour failed: {}", e.message),
        }
        tokio::time::sleep(PEAK_EVERY).await;
    }
}

/// The busiest second of the next hour, over every job not paused.
async fn peak_now<S: Store>(store: &S) -> Result<hotspots::Peak, ApiError> {
    let window = hotspots::Window::next_hour(Timestamp::now())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut tally = hotspots::Tally::new(window, Limits::default());
    let mut after: Option<(String, String)> = None;
    loop {
        let page = store.load_jobs(after.as_ref(), PAGE).await?;
        after = page.last().map(|j| (j.namespace.clone(), j.name.clone()));
        let more = page.len() == PAGE as usize;
        tally = tokio::task::spawn_blocking(move || {
            for stored in page.iter().filter(|j| !j.paused) {
                let Ok(job) = Job::from_canonical(&stored.namespace, &stored.spec) else {
                    continue;
                };
                if !job.schedules.is_empty() && tally.add(&job.timing()).is_none() {
                    break;
                }
            }
            tally
        })
        .await
        .map_err(internal)?;
        if tally.capped().is_some() || !more {
            return Ok(tally.peak());
        }
    }
}

fn internal(e: tokio::task::JoinError) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("the hot-spot report failed: {e}"),
    )
}
