//! A job's page: its DAG colored by the latest run, its schedule with the
//! next fires (daylight-saving marks, calendar suppressions), the run grid,
//! the schedule-health timeline, its versions with their diff, and the
//! actions an operator may take (trigger, pause, resume, backfill).

use std::collections::{BTreeMap, HashMap};

use askama::Template;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use dagcron_core::Job;
use dagcron_core::authz::Need;
use dagcron_store::RunRecord;
use dagcron_store::prelude::*;
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;
use serde_json::json;

use crate::svg::{DagNode, dag};
use crate::{Chrome, Ui, call_api, error_page, format, health, render, viewer};

/// Runs in the grid.
pub(crate) const GRID_RUNS: u32 = 20;
/// Next fires shown per schedule.
const NEXT_FIRES: usize = 8;
/// At most this many expected fires in the health timeline; a busier
/// window is narrowed.
const HEALTH_FIRES: usize = 500;
/// Versions listed.
const VERSIONS: u32 = 10;
/// The windows of the health timeline.
const WINDOWS: [(&str, i64); 4] = [("1h", 1), ("6h", 6), ("24h", 24), ("7d", 168)];

#[derive(Deserialize, Default)]
pub(crate) struct JobQuery {
    window: Option<String>,
    diff: Option<i64>,
    notice: Option<String>,
}

struct FireLine {
    local: String,
    utc: String,
    dst: &'static str,
    suppressed: String,
    /// When the fire is made, with the job's jitter (empty: no jitter).
    jittered: String,
}

struct ScheduleView {
    expr: String,
    zone: String,
    english: String,
    fires: Vec<FireLine>,
}

struct RunHead {
    id: i64,
    state: &'static str,
    trigger: &'static str,
    /// When it was for, short (`12-04 13:45`), and whole for its title.
    day: String,
    when: String,
    took: String,
}

struct GridCell {
    run: i64,
    state: &'static str,
    attempt: u32,
    /// Its height in pixels: its share of the longest task in the grid.
    height: u32,
    title: String,
}

struct GridRow {
    task: String,
    /// A task the job no longer has (its runs of older versions had it).
    gone: bool,
    cells: Vec<GridCell>,
}

struct HealthLine {
    time: String,
    local: String,
    what: &'static str,
    reason: String,
    run: Option<i64>,
}

struct VersionView {
    version: i64,
    at: String,
    by: String,
}

struct DiffView {
    from: i64,
    to: i64,
    /// The unified diff's lines, each with its class (`add`, `del`, `hunk`).
    lines: Vec<(&'static str, String)>,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    chrome: Chrome,
    ns: String,
    name: String,
    version: i64,
    paused: bool,
    /// Why it does not fire, while its failure breaker is open.
    breaker: Option<String>,
    notice: Option<String>,
    operate: bool,
    latest: Option<i64>,
    dag: String,
    schedules: Vec<ScheduleView>,
    runs: Vec<RunHead>,
    grid: Vec<GridRow>,
    window: String,
    windows: Vec<String>,
    health: Vec<HealthLine>,
    health_counts: Vec<(&'static str, usize)>,
    health_label: String,
    health_note: String,
    health_open: bool,
    versions: Vec<VersionView>,
    diff: Option<DiffView>,
    /// Its notification rules, one line each: events, then notifiers.
    notify: Vec<(String, String)>,
    /// What starts its runs besides its schedule, in words.
    triggers: Vec<String>,
    /// Its definition as YAML (the canonical form of its current version).
    definition: String,
}

/// What starts a job's runs besides its schedule: another job's ends, a
/// webhook.
fn trigger_lines(ns: &str, job: &Job) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(after) = &job.spec.after {
        let on: Vec<&str> = after
            .on
            .iter()
            .map(|s| match s {
                dagcron_core::after::AfterState::Succeeded => "succeeded",
                dagcron_core::after::AfterState::Failed => "failed",
                dagcron_core::after::AfterState::Cancelled => "cancelled",
            })
            .collect();
        out.push(format!(
            "each run of {} that ends {}{}",
            after.job,
            on.join(" or "),
            if after.pass_params {
                ", with its parameters"
            } else {
                ""
            }
        ));
    }
    if let Some(nats) = &job.spec.nats {
        out.push(format!(
            "each message of {} in the NATS stream {}",
            nats.subject, nats.stream
        ));
    }
    if let Some(hook) = &job.spec.webhook {
        out.push(format!(
            "signed deliveries to POST /api/v1/hooks/{ns}/{} (secret {}, at most {} a minute)",
            job.spec.name,
            hook.secret.secret,
            hook.per_minute()
        ));
    }
    out
}

/// A job's notification rules for people: (`failed, recovered`,
/// `oncall (webhook), chat (slack)`).
fn notify_lines(rules: &[dagcron_core::notify::NotifyRule]) -> Vec<(String, String)> {
    rules
        .iter()
        .map(|r| {
            let on: Vec<&str> = r.on.iter().map(|e| e.as_str()).collect();
            let to: Vec<String> =
                r.to.iter()
                    .map(|t| match t {
                        dagcron_core::notify::NotifyTarget::Notifier(n) => {
                            format!("{} ({})", n.name, n.kind())
                        }
                        dagcron_core::notify::NotifyTarget::Name(n) => n.clone(),
                    })
                    .collect();
            (on.join(", "), to.join(", "))
        })
        .collect()
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
}

/// `GET /jobs/{ns}/{name}`.
pub(crate) async fn page<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<JobQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let missing = || dagcron_api::ApiError::not_found(format!("no job {ns}/{name}"));
    if let Err(e) = v.who.allow(Need::Read, Some(&ns), missing) {
        return error_page(e.status, &e.message);
    }
    let store = &ui.st.store;
    let stored = match store.get_job(&ns, &name).await {
        Ok(Some(j)) => j,
        Ok(None) => return error_page(StatusCode::NOT_FOUND, &format!("no job {ns}/{name}")),
        Err(e) => return unavailable(e),
    };
    let job = match Job::from_canonical(&ns, &stored.spec) {
        Ok(j) => j,
        Err(e) => return unavailable(format!("the stored job cannot be read: {e}")),
    };
    let now = Timestamp::now();
    let zone = &v.zone;
    let runs = match store.list_runs(&ns, &name, GRID_RUNS, None).await {
        Ok(p) => p.items,
        Err(e) => return unavailable(e),
    };
    let window = q
        .window
        .filter(|w| WINDOWS.iter().any(|(n, _)| n == w))
        .unwrap_or_else(|| "24h".into());
    let hours = WINDOWS
        .iter()
        .find(|(n, _)| *n == window)
        .map_or(24, |w| w.1);
    // Fires before the job existed were never expected.
    let created = match store.get_job_version(&ns, &name, 1).await {
        Ok(first) => first.map(|v| v.info.applied_at),
        Err(e) => return unavailable(e),
    };
    let (health, health_note) = match health_of(&ui, &job, &runs, hours, created, now, zone).await {
        Ok(h) => h,
        Err(e) => return unavailable(e),
    };
    let versions = match store.list_job_versions(&ns, &name, VERSIONS, None).await {
        Ok(p) => p.items,
        Err(e) => return unavailable(e),
    };
    let diff_to = q.diff.unwrap_or(stored.version);
    let diff = if diff_to > 1 {
        match diff_of(&*ui.st.store, &ns, &name, diff_to).await {
            Ok(d) => d,
            Err(e) => return unavailable(e),
        }
    } else {
        None
    };
    let latest = runs.first();
    let nodes: Vec<DagNode> = job
        .tasks
        .iter()
        .map(|t| {
            let task = latest.and_then(|r| r.tasks.iter().find(|x| x.id == t.id));
            DagNode {
                id: t.id.clone(),
                state: task.map(|x| x.state.as_str().to_string()),
                took: task
                    .and_then(|x| task_took(x, now))
                    .map_or(String::new(), format::duration),
                href: latest.map(|r| format!("/runs/{}?task={}", r.id, crate::path_part(&t.id))),
            }
        })
        .collect();
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for l in &health {
        *counts.entry(l.what).or_default() += 1;
    }
    let health_label = format!(
        "{} expected fires: {}",
        health.len(),
        counts
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let page = JobPage {
        chrome: v.chrome(format!("{ns}/{name}"), "jobs"),
        operate: v.may(Need::Operate, Some(&ns)),
        latest: latest.map(|r| r.id),
        dag: dag(&nodes, &job.dag.upstream, &job.dag.waves()),
        schedules: schedules(&job, now, zone),
        grid: grid(&job, &runs, now),
        runs: runs
            .iter()
            .map(|r| RunHead {
                id: r.id,
                state: r.state.as_str(),
                trigger: r.trigger.as_str(),
                day: r
                    .scheduled_at
                    .to_zoned_datetime(zone.clone())
                    .strftime("%m-%d %H:%M")
                    .to_string(),
                when: r
                    .scheduled_at
                    .to_zoned_datetime(zone.clone())
                    .strftime("%Y-%m-%d %H:%M:%S %Z")
                    .to_string(),
                took: r
                    .started_at
                    .map(|s| format::duration(r.finished_at.unwrap_or(now).duration_since(s)))
                    .unwrap_or_else(|| "not started".into()),
            })
            .collect(),
        windows: WINDOWS.iter().map(|w| w.0.to_string()).collect(),
        health_open: health.len() <= 50,
        health_counts: counts.into_iter().collect(),
        health_label,
        health_note,
        health,
        window,
        versions: versions
            .iter()
            .map(|ver| VersionView {
                version: ver.version,
                at: format::time(ver.applied_at, zone),
                by: match (&ver.origin.by, ver.origin.rollback_of) {
                    (Some(a), Some(r)) => format!("{} (rollback to {r})", a.name),
                    (Some(a), None) => a.name.clone(),
                    (None, Some(r)) => format!("rollback to {r}"),
                    (None, None) => "—".into(),
                },
            })
            .collect(),
        diff,
        notify: notify_lines(&job.spec.notify),
        triggers: trigger_lines(&ns, &job),
        definition: serde_json::from_str(&stored.spec)
            .map_err(|e| e.to_string())
            .and_then(|spec| dagcron_core::yaml::canonical_yaml(&spec))
            .unwrap_or_else(|e| format!("# the stored definition cannot be shown: {e}")),
        notice: q.notice,
        version: stored.version,
        paused: stored.paused,
        breaker: stored.breaker.map(|b| b.reason()),
        ns,
        name,
    };
    render(&page)
}

/// Each schedule's explanation and next fires, marked where daylight
/// saving moved them and where a calendar suppresses them.
fn schedules(job: &Job, now: Timestamp, zone: &jiff::tz::TimeZone) -> Vec<ScheduleView> {
    let (_, written) = super::jobs::schedule_text(Some(job));
    let timing = job.timing();
    let jitter = timing.jitter > SignedDuration::ZERO;
    let exprs: Vec<&str> = written.split(" | ").collect();
    job.schedules
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let tz = s.time_zone().clone();
            let fires = s
                .fires_after(now)
                .take(NEXT_FIRES)
                .map(|f| FireLine {
                    local: f
                        .at
                        .to_zoned_datetime(tz.clone())
                        .strftime("%a %Y-%m-%d %H:%M:%S %Z")
                        .to_string(),
                    utc: f.at.strftime("%Y-%m-%d %H:%M:%SZ").to_string(),
                    dst: f.dst.map_or("", |d| d.describe()),
                    suppressed: job.excluded_by(f.at).unwrap_or("").to_string(),
                    jittered: if jitter {
                        dagcron_core::fires::jittered(&timing, f.at)
                            .to_zoned_datetime(zone.clone())
                            .strftime("%H:%M:%S%.3f %Z")
                            .to_string()
                    } else {
                        String::new()
                    },
                })
                .collect();
            ScheduleView {
                expr: exprs
                    .get(i)
                    .map_or_else(|| s.normalized(), |e| e.to_string()),
                zone: tz.iana_name().unwrap_or("UTC").to_string(),
                english: s.explain(),
                fires,
            }
        })
        .collect()
}

/// How long a task took in a run: from its first attempt's start to its
/// last one's end (or now, while it runs).
fn task_took(task: &dagcron_store::TaskRecord, now: Timestamp) -> Option<SignedDuration> {
    let first = task.attempts.first()?;
    let last = task.attempts.last()?;
    Some(
        last.finished_at
            .unwrap_or(now)
            .duration_since(first.started_at),
    )
}

/// Tasks as rows, runs as columns (newest left); each cell the task's
/// state in that run, its last attempt (a mark when it was retried) and
/// how long it took (the cell's height). Tasks that older versions had
/// and the job no longer has keep their rows, after the current ones.
fn grid(job: &Job, runs: &[RunRecord], now: Timestamp) -> Vec<GridRow> {
    let mut tasks: Vec<(String, bool)> = job.tasks.iter().map(|t| (t.id.clone(), false)).collect();
    for r in runs {
        for t in &r.tasks {
            if !tasks.iter().any(|(id, _)| *id == t.id) {
                tasks.push((t.id.clone(), true));
            }
        }
    }
    let longest = runs
        .iter()
        .flat_map(|r| r.tasks.iter())
        .filter_map(|t| task_took(t, now))
        .max()
        .unwrap_or(SignedDuration::ZERO)
        .max(SignedDuration::from_millis(1));
    tasks
        .into_iter()
        .map(|(id, gone)| GridRow {
            cells: runs
                .iter()
                .map(|r| {
                    let task = r.tasks.iter().find(|x| x.id == id);
                    let took = task.and_then(|x| task_took(x, now));
                    let attempt = task.and_then(|x| x.attempts.last()).map_or(0, |a| a.number);
                    let state = task.map_or("", |x| x.state.as_str());
                    let share = took.map_or(0.0, |d| d.as_secs_f64() / longest.as_secs_f64());
                    GridCell {
                        run: r.id,
                        state,
                        attempt,
                        height: 4 + (share * 14.0).round() as u32,
                        title: format!(
                            "run {}, {id}: {state}{}{}",
                            r.id,
                            took.map_or(String::new(), |d| format!(", {}", format::duration(d))),
                            if attempt > 1 {
                                format!(", {attempt} attempts")
                            } else {
                                String::new()
                            }
                        ),
                    }
                })
                .collect(),
            task: id,
            gone,
        })
        .collect()
}

/// The health timeline of the last `hours` (narrowed while the schedule
/// expects more than [`HEALTH_FIRES`] fires), and a note if narrowed.
async fn health_of<S: Store>(
    ui: &Ui<S>,
    job: &Job,
    runs: &[RunRecord],
    hours: i64,
    created: Option<Timestamp>,
    now: Timestamp,
    zone: &jiff::tz::TimeZone,
) -> dagcron_store::Result<(Vec<HealthLine>, String)> {
    let timing = job.timing();
    let mut span = SignedDuration::from_hours(hours);
    let mut note = String::new();
    let since = |span: SignedDuration| (now - span).max(created.unwrap_or(Timestamp::MIN));
    let expected = loop {
        if let Some(e) = timing.fires_in(since(span), now, HEALTH_FIRES) {
            break e;
        }
        span /= 6;
        note = format!(
            "The schedule expects more than {HEALTH_FIRES} fires in that window: showing the last {}.",
            format::duration(span)
        );
        if span < SignedDuration::from_secs(60) {
            break timing
                .fires_in(since(span), now, HEALTH_FIRES)
                .unwrap_or_default();
        }
    };
    let ledger = ui
        .st
        .store
        .list_fires(
            &job.namespace,
            &job.spec.name,
            since(span),
            now,
            (HEALTH_FIRES * 2) as u32,
        )
        .await?;
    let created: HashMap<i64, Timestamp> = runs.iter().map(|r| (r.id, r.created_at)).collect();
    let lines = health::timeline(&expected, &ledger, &created, now)
        .into_iter()
        .map(|l| HealthLine {
            time: format::time(l.at, zone),
            local: l
                .at
                .to_zoned_datetime(zone.clone())
                .strftime("%Y-%m-%d %H:%M:%S")
                .to_string(),
            what: l.what,
            reason: l.reason,
            run: l.run,
        })
        .collect();
    Ok((lines, note))
}

/// The diff of version `to` against the one before it: the unified diff
/// of their YAML, as `dagcron jobs diff` prints it.
async fn diff_of<S: Store>(
    store: &S,
    ns: &str,
    name: &str,
    to: i64,
) -> dagcron_store::Result<Option<DiffView>> {
    let (Some(a), Some(b)) = (
        store.get_job_version(ns, name, to - 1).await?,
        store.get_job_version(ns, name, to).await?,
    ) else {
        return Ok(None);
    };
    let yaml = |s: &str| {
        serde_json::from_str(s)
            .map_err(|e| e.to_string())
            .and_then(|spec| dagcron_core::yaml::canonical_yaml(&spec))
            .unwrap_or_else(|_| s.to_string())
    };
    let text = dagcron_core::yaml::unified_diff(
        &format!("{ns}/{name} version {}", to - 1),
        &yaml(&a.spec),
        &format!("{ns}/{name} version {to}"),
        &yaml(&b.spec),
    );
    let lines = text
        .lines()
        .map(|l| {
            let class = if l.starts_with("+++") || l.starts_with("---") {
                "head"
            } else if l.starts_with('+') {
                "add"
            } else if l.starts_with('-') {
                "del"
            } else if l.starts_with("@@") {
                "hunk"
            } else {
                ""
            };
            (class, l.to_string())
        })
        .collect();
    Ok(Some(DiffView {
        from: to - 1,
        to,
        lines,
    }))
}

/// `POST /jobs/{ns}/{name}/{action}`: trigger, pause, resume or backfill,
/// sent to the API's own route with the session's token.
pub(crate) async fn act<S: Store>(
    State(ui): State<Ui<S>>,
    parts: Parts,
    Path((ns, name, action)): Path<(String, String, String)>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let v = match crate::form_viewer(&ui, &parts.headers, &f).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let at = |k: &str| {
        let text = f.get(k).map_or("", |s| s.trim());
        text.parse::<Timestamp>()
            .map_err(|e| format!("{k} {text:?} is not an RFC 3339 instant: {e}"))
    };
    let body = match action.as_str() {
        "pause" | "resume" => json!({}),
        "trigger" => match format::params(f.get("params").map_or("", String::as_str)) {
            // A planned run when an instant is given (the API checks it is ahead).
            Ok(p) if f.get("at").is_some_and(|s| !s.trim().is_empty()) => match at("at") {
                Ok(when) => json!({ "params": p, "at": when }),
                Err(m) => return error_page(StatusCode::BAD_REQUEST, &m),
            },
            Ok(p) => json!({ "params": p }),
            Err(m) => return error_page(StatusCode::BAD_REQUEST, &m),
        },
        "backfill" => match (at("from"), at("to")) {
            (Ok(from), Ok(to)) => json!({ "from": from, "to": to }),
            (Err(m), _) | (_, Err(m)) => return error_page(StatusCode::BAD_REQUEST, &m),
        },
        _ => return error_page(StatusCode::NOT_FOUND, &format!("no action {action}")),
    };
    let path = format!(
        "/api/v1/namespaces/{}/jobs/{}/{action}",
        crate::path_part(&ns),
        crate::path_part(&name)
    );
    let connect = parts.extensions.get().cloned();
    match call_api(&ui, &v, &parts.headers, connect, &path, body).await {
        Ok(answer) => {
            let page = format!(
                "/jobs/{}/{}",
                crate::path_part(&ns),
                crate::path_part(&name)
            );
            let to = match action.as_str() {
                "trigger" => match answer["id"].as_i64() {
                    Some(id) => format!("/runs/{id}"),
                    None => page,
                },
                "backfill" => {
                    let n = answer["runs"].as_array().map_or(0, Vec::len);
                    format!("{page}?notice=The+backfill+created+{n}+runs.")
                }
                _ => page,
            };
            Redirect::to(&to).into_response()
        }
        Err((status, message)) => error_page(status, &message),
    }
}
