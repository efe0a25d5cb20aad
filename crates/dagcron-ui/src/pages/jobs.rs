//! `/jobs`: the jobs of a namespace: each
//! with its schedule in English, its next fire, whether it is paused, a
//! strip of its last runs and what became of its fires in the last 24
//! hours; searched, filtered and paginated on the server.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use dagcron_core::authz::Need;
use dagcron_core::{FireOutcome, Job};
use dagcron_store::StoredJob;
use dagcron_store::prelude::*;
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

use crate::{Chrome, Ui, error_page, format, render, viewer};

/// Rows of a page.
pub(crate) const PAGE: usize = 25;
/// Jobs read per store page while searching.
const SCAN_PAGE: u32 = 200;
/// At most this many jobs are read to fill one page of a search.
const SCAN_MAX: usize = 1000;
/// Runs in a job's strip.
pub(crate) const STRIP: u32 = 10;
/// At most this many namespaces are offered.
const NAMESPACES: usize = 50;
/// At most this many records of the fire ledger are read per job for the
/// last 24 hours (a job that fires more often is counted over its first
/// ones, and says so).
const FIRES_24H: u32 = 2000;

#[derive(Deserialize, Default)]
pub(crate) struct JobsQuery {
    ns: Option<String>,
    #[serde(default)]
    q: String,
    #[serde(default)]
    show: String,
    cursor: Option<String>,
}

pub(crate) struct Cell {
    pub(crate) id: i64,
    pub(crate) state: &'static str,
}

pub(crate) struct JobRow {
    name: String,
    schedule: String,
    expr: String,
    next_fire: String,
    paused: bool,
    strip: Vec<Cell>,
    strip_label: String,
    missed: usize,
    skipped: usize,
    suppressed: usize,
    seen: usize,
    more: bool,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    chrome: Chrome,
    ns: String,
    namespaces: Vec<String>,
    q: String,
    show: String,
    rows: Vec<JobRow>,
    cursor: Option<String>,
    next: Option<String>,
    scanned: usize,
    scanned_out: bool,
}

/// The schedules of a job in English, and as written.
pub(crate) fn schedule_text(job: Option<&Job>) -> (String, String) {
    let Some(job) = job else {
        return ("(cannot be read by this version)".into(), String::new());
    };
    if job.schedules.is_empty() {
        return ("only when triggered".into(), String::new());
    }
    let english: Vec<_> = job.schedules.iter().map(|s| s.explain()).collect();
    let written = match &job.spec.schedule {
        Some(s) => serde_json::to_value(s)
            .ok()
            .map(|v| match v {
                serde_json::Value::String(s) => s,
                serde_json::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(" | "),
                other => other.to_string(),
            })
            .unwrap_or_default(),
        None => String::new(),
    };
    (english.join("; and "), written)
}

/// `GET /jobs`.
pub(crate) async fn index<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Query(q): Query<JobsQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let store = &ui.st.store;
    let namespaces = match &v.who.grant.namespace {
        Some(ns) => vec![ns.clone()],
        None => match namespaces(&**store).await {
            Ok(n) => n,
            Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        },
    };
    let ns =
        q.ns.clone()
            .filter(|n| !n.is_empty())
            .or_else(|| namespaces.first().cloned())
            .unwrap_or_else(|| "default".into());
    // Another namespace than a scoped token's is shown empty, as the API
    // lists it; a role too weak is refused.
    let listed = match v.who.lists(Need::Read, &ns) {
        Ok(l) => l,
        Err(e) => return error_page(e.status, &e.message),
    };
    let show = match q.show.as_str() {
        "paused" | "active" => q.show.clone(),
        _ => "all".to_string(),
    };
    let needle = q.q.trim().to_lowercase();
    let mut picked: Vec<StoredJob> = Vec::new();
    let mut cursor = q.cursor.clone();
    let mut scanned = 0;
    let mut next = None;
    let mut scanned_out = false;
    // Without a filter every job read is shown: a page's worth is read.
    let scan_page = if needle.is_empty() && show == "all" {
        PAGE as u32
    } else {
        SCAN_PAGE
    };
    if listed {
        loop {
            let page = match store.list_jobs(&ns, scan_page, cursor.as_deref()).await {
                Ok(p) => p,
                Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
            };
            let mut full = false;
            for job in page.items {
                scanned += 1;
                let keep = (needle.is_empty() || job.name.to_lowercase().contains(&needle))
                    && match show.as_str() {
                        "paused" => job.paused,
                        "active" => !job.paused,
                        _ => true,
                    };
                cursor = Some(dagcron_store::job_cursor(&job));
                if keep {
                    picked.push(job);
                }
                if picked.len() == PAGE {
                    full = true;
                    break;
                }
            }
            if full {
                // More may follow the last job shown.
                next = cursor.clone();
                break;
            }
            match page.next_cursor {
                None => break,
                Some(c) if scanned >= SCAN_MAX => {
                    next = Some(c);
                    scanned_out = true;
                    break;
                }
                Some(c) => cursor = Some(c),
            }
        }
    }
    if next.is_some() && !scanned_out {
        // A full page: is anything after it? One cheap look.
        let after = next.as_deref();
        if let Ok(p) = store.list_jobs(&ns, 1, after).await {
            if p.items.is_empty() {
                next = None;
            }
        }
    }
    let now = Timestamp::now();
    let rows = match job_rows(&ui, &ns, picked, now, &v.zone).await {
        Ok(r) => r,
        Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    };
    render(&JobsPage {
        chrome: v.chrome(format!("Jobs in {ns}"), "jobs"),
        ns,
        namespaces,
        q: q.q,
        show,
        rows,
        cursor: q.cursor,
        next,
        scanned,
        scanned_out,
    })
}

/// The namespaces that have jobs, found by skipping from one to the next
/// (one indexed read each), at most [`NAMESPACES`].
pub(crate) async fn namespaces<S: Store>(store: &S) -> dagcron_store::Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    while out.len() < NAMESPACES {
        // Past every name of the last namespace found.
        let after = out.last().map(|ns| (ns.clone(), "\u{10FFFF}".to_string()));
        match store.load_jobs(after.as_ref(), 1).await?.pop() {
            Some(job) => out.push(job.namespace),
            None => break,
        }
    }
    Ok(out)
}

/// Each picked job's row: its last runs and its last day of fires, read
/// for all the jobs of the page at once.
async fn job_rows<S: Store>(
    ui: &Ui<S>,
    ns: &str,
    jobs: Vec<StoredJob>,
    now: Timestamp,
    zone: &jiff::tz::TimeZone,
) -> dagcron_store::Result<Vec<JobRow>> {
    let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
    let day = (now - SignedDuration::from_hours(24), now);
    let summaries = ui
        .st
        .store
        .job_summaries(ns, &names, STRIP, day, FIRES_24H)
        .await?;
    let mut rows = Vec::with_capacity(jobs.len());
    for (job, summary) in jobs.into_iter().zip(summaries) {
        let parsed = Job::from_canonical(&job.namespace, &job.spec).ok();
        let (schedule, expr) = schedule_text(parsed.as_ref());
        let next_fire = match &parsed {
            _ if job.paused => "paused".into(),
            _ if job.breaker.is_some() => "breaker open: resume to fire".into(),
            Some(j) => format::maybe_time(j.next_unsuppressed_after(now), zone),
            None => "—".into(),
        };
        let count = |pick: &[FireOutcome]| summary.fires_of(pick) as usize;
        let strip: Vec<Cell> = summary
            .runs
            .iter()
            .rev()
            .map(|(id, state)| Cell {
                id: *id,
                state: state.as_str(),
            })
            .collect();
        let strip_label = format!(
            "the last {} runs: {}",
            strip.len(),
            strip.iter().map(|c| c.state).collect::<Vec<_>>().join(", ")
        );
        rows.push(JobRow {
            name: job.name.clone(),
            schedule,
            expr,
            next_fire,
            paused: job.paused,
            strip,
            strip_label,
            missed: count(&[FireOutcome::MissedCaughtUp, FireOutcome::MissedSkipped]),
            skipped: count(&[
                FireOutcome::SkippedOverlap,
                FireOutcome::SkippedBacklog,
                FireOutcome::SkippedQuota,
                FireOutcome::SkippedBreaker,
            ]),
            suppressed: count(&[FireOutcome::Suppressed]),
            seen: summary.fires_read() as usize,
            more: summary.fires_read() == u64::from(FIRES_24H),
        });
    }
    Ok(rows)
}
