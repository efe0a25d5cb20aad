//! `/runs`: the runs browser. Every run the viewer may read, newest first,
//! filtered by namespace, job, state, trigger and the days of their fire
//! instants, a page at a time (keyset on the run id); the first page
//! follows itself while runs on it are going on.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use dagcron_core::RunState;
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use dagcron_store::{RunFilter, RunRecord, Trigger};
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

use crate::{Chrome, Ui, error_page, format, render, viewer};

/// Runs on a page.
const PAGE: u32 = 50;

#[derive(Deserialize, Default)]
pub(crate) struct RunsQuery {
    #[serde(default)]
    ns: String,
    #[serde(default)]
    job: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    trigger: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    cursor: Option<String>,
}

pub(crate) struct RunRow {
    id: i64,
    ns: String,
    job: String,
    state: &'static str,
    trigger: &'static str,
    scheduled: String,
    took: String,
    late: String,
    tasks: Vec<(String, &'static str)>,
}

#[derive(Template)]
#[template(path = "runs.html")]
struct RunsPage {
    chrome: Chrome,
    namespaces: Vec<String>,
    scoped: bool,
    q: RunsQuery,
    states: Vec<&'static str>,
    triggers: Vec<&'static str>,
    rows: Vec<RunRow>,
    /// The query of this page without its cursor, for the pager.
    query: String,
    next: Option<String>,
    /// Whether the page follows itself (the first page, with runs going on).
    live: bool,
    /// Whether the filters were checked on a window of runs that ended
    /// before the page was full (older runs may match).
    windowed: bool,
    problem: Option<String>,
}

/// The instant a day starts at in `zone`, from a form's `YYYY-MM-DD`.
fn day_start(text: &str, zone: &TimeZone, field: &str) -> Result<Option<Timestamp>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let day: Date = text
        .trim()
        .parse()
        .map_err(|e| format!("{field}: {text:?} is not a day (YYYY-MM-DD): {e}"))?;
    day.to_zoned_datetime(zone.clone())
        .map(|z| Some(z.timestamp()))
        .map_err(|e| format!("{field}: {e}"))
}

/// The filter a form asks for, in the viewer's zone: `to` is the last day
/// included.
fn filter_of(q: &RunsQuery, zone: &TimeZone) -> Result<RunFilter, String> {
    let until = match day_start(&q.to, zone, "to")? {
        Some(t) => Some(
            t.to_zoned_datetime(zone.clone())
                .tomorrow()
                .and_then(|z| z.start_of_day())
                .map_err(|e| format!("to: {e}"))?
                .timestamp(),
        ),
        None => None,
    };
    let since = day_start(&q.from, zone, "from")?;
    if let (Some(s), Some(u)) = (since, until) {
        if s >= u {
            return Err("from: the first day is after the last one".into());
        }
    }
    Ok(RunFilter {
        namespace: Some(q.ns.trim().to_string()).filter(|n| !n.is_empty()),
        job: Some(q.job.trim().to_string()).filter(|j| !j.is_empty()),
        states: RunFilter::parse_states(&q.state)?,
        trigger: RunFilter::parse_trigger(&q.trigger)?,
        since,
        until,
        ended_since: None,
    })
}

/// A run's row: how long it took (so far) and how late it started after
/// its fire instant.
fn row(r: &RunRecord, now: Timestamp, zone: &TimeZone) -> RunRow {
    let took = match r.started_at {
        Some(s) => {
            let d = format::duration(r.finished_at.unwrap_or(now).duration_since(s));
            if r.finished_at.is_some() {
                d
            } else {
                format!("{d} so far")
            }
        }
        None => "—".into(),
    };
    let late = match (r.trigger, r.started_at) {
        (Trigger::Schedule | Trigger::Catchup, Some(s)) => {
            format::duration(s.duration_since(r.scheduled_at).max(SignedDuration::ZERO))
        }
        _ => "—".into(),
    };
    RunRow {
        id: r.id,
        ns: r.namespace.clone(),
        job: r.job.clone(),
        state: r.state.as_str(),
        trigger: r.trigger.as_str(),
        scheduled: format::time(r.scheduled_at, zone),
        took,
        late,
        tasks: r
            .tasks
            .iter()
            .map(|t| (t.id.clone(), t.state.as_str()))
            .collect(),
    }
}

/// `GET /runs`.
pub(crate) async fn page<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Query(mut q): Query<RunsQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let scoped = v.who.grant.namespace.is_some();
    let namespaces = match &v.who.grant.namespace {
        Some(ns) => {
            q.ns = ns.clone();
            vec![ns.clone()]
        }
        None => match super::jobs::namespaces(&*ui.st.store).await {
            Ok(n) => n,
            Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        },
    };
    let mut problem = None;
    let mut rows = Vec::new();
    let mut next = None;
    match filter_of(&q, &v.zone) {
        Err(e) => problem = Some(e),
        Ok(filter) => {
            let readable = match &filter.namespace {
                Some(ns) => v.who.lists(Need::Read, ns),
                None => v
                    .who
                    .allow(Need::Read, None, || dagcron_api::ApiError::not_found(""))
                    .map(|()| true),
            };
            match readable {
                Err(e) => return error_page(e.status, &e.message),
                Ok(false) => {}
                Ok(true) => {
                    let page = match ui
                        .st
                        .store
                        .browse_runs(&filter, PAGE, q.cursor.as_deref())
                        .await
                    {
                        Ok(p) => p,
                        Err(dagcron_store::StorageError::Invalid(m)) => {
                            return error_page(StatusCode::BAD_REQUEST, &m);
                        }
                        Err(e) => {
                            return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
                        }
                    };
                    let now = Timestamp::now();
                    rows = page.items.iter().map(|r| row(r, now, &v.zone)).collect();
                    next = page.next_cursor;
                }
            }
        }
    }
    // Planned runs may wait for days: they do not keep the page refreshing.
    let live = q.cursor.is_none()
        && rows
            .iter()
            .any(|r| ["pending", "running"].contains(&r.state));
    let windowed = rows.len() < PAGE as usize && next.is_some();
    let query = [
        ("ns", &q.ns),
        ("job", &q.job),
        ("state", &q.state),
        ("trigger", &q.trigger),
        ("from", &q.from),
        ("to", &q.to),
    ]
    .iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| format!("{k}={}", crate::path_part(v)))
    .collect::<Vec<_>>()
    .join("&");
    render(&RunsPage {
        chrome: v.chrome("Runs", "runs"),
        namespaces,
        scoped,
        q,
        states: RunState::ALL.iter().map(|s| s.as_str()).collect(),
        triggers: Trigger::ALL.iter().map(|t| t.as_str()).collect(),
        rows,
        query,
        next,
        live,
        windowed,
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(from: &str, to: &str) -> RunsQuery {
        RunsQuery {
            from: from.into(),
            to: to.into(),
            ..RunsQuery::default()
        }
    }

    #[test]
    fn days_are_read_in_the_viewers_zone_and_the_last_one_is_included() {
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        let f = filter_of(&q("2026-03-29", "2026-03-29"), &berlin).unwrap();
        // The day of the spring change is 23 hours long in Berlin.
        assert_eq!(f.since, Some("2026-03-28T23:00:00Z".parse().unwrap()));
        assert_eq!(f.until, Some("2026-03-29T22:00:00Z".parse().unwrap()));
        assert!(filter_of(&q("2026-03-30", "2026-03-29"), &berlin).is_err());
        assert!(
            filter_of(&q("yesterday", ""), &berlin)
                .unwrap_err()
                .starts_with("from:")
        );
        let bad_state = RunsQuery {
            state: "done".into(),
            ..RunsQuery::default()
        };
        assert!(filter_of(&bad_state, &berlin).unwrap_err().contains("done"));
        assert_eq!(
            filter_of(&q("", ""), &berlin).unwrap(),
            RunFilter::default()
        );
    }
}
