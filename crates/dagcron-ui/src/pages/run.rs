//! A run's page: its Gantt timeline (waits, attempts, retries), its tasks
//! and attempts, an attempt's log (followed live through htmx while the
//! attempt runs), and cancel or re-run for an operator.

use std::collections::HashMap;

use askama::Template;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use dagcron_core::TaskState;
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use dagcron_store::{RunId, RunRecord};
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::json;

use crate::svg::{Bar, Row, gantt};
use crate::{Chrome, Ui, Viewer, call_api, error_page, format, from_htmx, render, viewer};

/// The most of a log a page shows: its end.
const LOG_TAIL: usize = 64 << 10;

/// The most instances of a mapped task a run's page lists.
const MAX_INSTANCES_SHOWN: usize = 200;

#[derive(Deserialize, Default)]
pub(crate) struct RunQuery {
    task: Option<String>,
    attempt: Option<u32>,
    /// Only the log's lines that contain this (case-insensitive).
    #[serde(default)]
    grep: String,
}

#[derive(Deserialize, Default)]
pub(crate) struct LogQuery {
    #[serde(default)]
    download: bool,
}

/// The lines of `text` that contain `needle` (case-insensitive), each
/// with its number from 1, at most `max`; and how many matched in all.
fn matching_lines(text: &str, needle: &str, max: usize) -> (Vec<(usize, String)>, usize) {
    let needle = needle.to_lowercase();
    let mut found = Vec::new();
    let mut count = 0;
    for (i, line) in text.lines().enumerate() {
        if line.to_lowercase().contains(&needle) {
            count += 1;
            if found.len() < max {
                found.push((i + 1, line.to_string()));
            }
        }
    }
    (found, count)
}

struct AttemptView {
    number: u32,
    state: &'static str,
    started: String,
    took: String,
    exit: String,
    error: String,
    /// What it handed downstream.
    outputs: Vec<(String, String)>,
    selected: bool,
}

struct TaskView {
    id: String,
    state: &'static str,
    carried: bool,
    attempts: Vec<AttemptView>,
    /// What an operator may do to it now: (action, button label).
    actions: &'static [(&'static str, &'static str)],
    /// An instance of a mapped task: its item (JSON).
    item: String,
    /// A mapped task: why it has no instances, or failed by them.
    note: String,
    /// A task with no attempt of its own: its outputs (a mapped task's,
    /// gathered from its instances).
    outputs: Vec<(String, String)>,
    /// A mapped task: its instances (grouped under it), and how many are
    /// in each state.
    instances: Vec<TaskView>,
    counts: String,
}

/// The interventions the API takes on a task in `state` of a run that
/// goes on (see `POST /api/v1/runs/{id}/tasks/{task}/{action}`).
fn task_actions(state: TaskState) -> &'static [(&'static str, &'static str)] {
    match state {
        TaskState::Held => &[
            ("retry", "Retry"),
            ("mark_succeeded", "Mark succeeded"),
            ("mark_skipped", "Mark skipped"),
            ("fail", "Fail"),
        ],
        TaskState::Failed | TaskState::UpstreamFailed => &[
            ("mark_succeeded", "Mark succeeded"),
            ("mark_skipped", "Mark skipped"),
        ],
        _ => &[],
    }
}

#[derive(Template)]
#[template(path = "run.html")]
struct RunPage {
    chrome: Chrome,
    id: RunId,
    ns: String,
    job: String,
    state: &'static str,
    trigger: &'static str,
    version: i64,
    scheduled: String,
    created: String,
    started: String,
    finished: String,
    rerun_of: Option<RunId>,
    params: String,
    operate: bool,
    ended: bool,
    /// The state a run that is stopping ends in (a cancel asked, say).
    closing: Option<&'static str>,
    gantt: String,
    tasks: Vec<TaskView>,
    log_of: Option<(String, u32)>,
    log: String,
    grep: String,
}

#[derive(Template)]
#[template(path = "log.html")]
struct LogPart<'a> {
    id: RunId,
    task: &'a str,
    n: u32,
    live: bool,
    text: String,
    truncated: bool,
    shown: usize,
    /// A search of the log: the words, the lines found (with their
    /// numbers) and how many matched in all.
    grep: &'a str,
    found: Vec<(usize, String)>,
    matched: usize,
    /// The lines shown with when and from which stream each came (an
    /// ended attempt whose lines were marked): time, stream, text.
    marked: Vec<(String, &'static str, String)>,
}

/// Lines a search shows at most.
const FOUND_MAX: usize = 500;

/// The run, if the viewer may read it (another namespace's run is absent).
async fn readable<S: Store>(ui: &Ui<S>, v: &Viewer, id: RunId) -> Result<RunRecord, Response> {
    let missing = || dagcron_api::ApiError::not_found(format!("no run {id}"));
    let run = match ui.st.store.get_run(id).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(error_page(StatusCode::NOT_FOUND, &missing().message)),
        Err(e) => return Err(error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
    };
    v.who
        .allow(Need::Read, Some(&run.namespace), missing)
        .map_err(|e| error_page(e.status, &e.message))?;
    Ok(run)
}

/// The Gantt rows of a run: per task, the wait before each attempt (from
/// the run's start, or the end of the attempt before: upstream, queue,
/// retry backoff) and the attempt itself.
fn timeline(run: &RunRecord, now: Timestamp) -> (Vec<Row>, Timestamp, Timestamp) {
    let start = run.started_at.unwrap_or(run.created_at);
    let end = run.finished_at.unwrap_or(now).max(start);
    let rows: Vec<Row> = run
        .tasks
        .iter()
        .map(|t| {
            let mut bars = Vec::new();
            let mut since = start;
            for a in &t.attempts {
                if a.started_at > since {
                    bars.push(Bar {
                        from: since,
                        to: a.started_at,
                        class: "wait".into(),
                        title: format!(
                            "{}: waited {} before attempt {}",
                            t.id,
                            format::duration(a.started_at.duration_since(since)),
                            a.number
                        ),
                        href: None,
                    });
                }
                let to = a.finished_at.unwrap_or(end).max(a.started_at);
                bars.push(Bar {
                    from: a.started_at,
                    to,
                    class: a.state.as_str().into(),
                    title: format!(
                        "{}: attempt {} {} for {}",
                        t.id,
                        a.number,
                        a.state,
                        format::duration(to.duration_since(a.started_at))
                    ),
                    href: Some(format!(
                        "/runs/{}?task={}&attempt={}#log",
                        run.id,
                        crate::path_part(&t.id),
                        a.number
                    )),
                });
                since = to;
            }
            Row {
                label: t.id.clone(),
                bars,
            }
        })
        .collect();
    // A mapped task's row holds its instances' attempts (a thousand
    // instances make one row, not a thousand).
    let mut grouped: Vec<Row> = Vec::new();
    for (t, row) in run.tasks.iter().zip(rows) {
        let of = dagcron_core::fan_out::parse_instance(&t.id)
            .filter(|_| t.item.is_some())
            .map(|(task, _)| task);
        match grouped.iter_mut().find(|g| Some(g.label.as_str()) == of) {
            // Its attempts only: each instance's wait counts from the run's start.
            Some(group) => group
                .bars
                .extend(row.bars.into_iter().filter(|b| b.class != "wait")),
            None => grouped.push(row),
        }
    }
    (grouped, start, end)
}

/// The log part of an attempt: its end, and the poll that follows it
/// while it runs.
/// The last lines of a log, at most `tail` bytes of them, each with the
/// time (in `zone`) and stream of its mark; empty when no line is marked.
fn marked_tail(
    bytes: &[u8],
    marks: &[u8],
    tail: usize,
    zone: &jiff::tz::TimeZone,
) -> Vec<(String, &'static str, String)> {
    let marks = dagcron_core::log::decode(marks);
    if marks.is_empty() {
        return vec![];
    }
    // The tail, from the start of a line; the marks renumbered from it.
    let mut from = bytes.len().saturating_sub(tail);
    if from > 0 {
        from = bytes[from..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |i| from + i + 1);
    }
    let before = bytes[..from].iter().filter(|b| **b == b'\n').count() as u32;
    let marks: Vec<dagcron_core::log::LineMark> = marks
        .into_iter()
        .filter(|m| m.line >= before)
        .map(|m| dagcron_core::log::LineMark {
            line: m.line - before,
            ..m
        })
        .collect();
    let text = String::from_utf8_lossy(&bytes[from..]);
    let lines = dagcron_core::log::lines(&text, &marks);
    let shown: Vec<(String, &'static str, String)> = lines
        .iter()
        .map(|l| match l.mark {
            Some(m) => (
                Timestamp::from_microsecond(m.at_us)
                    .map(|t| {
                        t.to_zoned_datetime(zone.clone())
                            .strftime("%H:%M:%S%.3f")
                            .to_string()
                    })
                    .unwrap_or_default(),
                match m.stream {
                    dagcron_core::log::Stream::Stdout => "out",
                    dagcron_core::log::Stream::Stderr => "err",
                },
                l.text.to_string(),
            ),
            None => (String::new(), "", l.text.to_string()),
        })
        .collect();
    shown
}

async fn log_part<S: Store>(
    ui: &Ui<S>,
    run: &RunRecord,
    task: &str,
    n: u32,
    grep: &str,
    zone: &jiff::tz::TimeZone,
) -> Result<String, Response> {
    let output = match ui.st.attempt_output(run, task, n).await {
        Ok(Some(output)) => output,
        Ok(None) => {
            return Err(error_page(
                StatusCode::NOT_FOUND,
                &format!("no attempt {n} of task {task} in run {}", run.id),
            ));
        }
        Err(e) => return Err(error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
    };
    let bytes = output.bytes;
    let from = bytes.len().saturating_sub(LOG_TAIL);
    let grep = grep.trim();
    let (found, matched) = if grep.is_empty() {
        (vec![], 0)
    } else {
        matching_lines(&String::from_utf8_lossy(&bytes), grep, FOUND_MAX)
    };
    let marks = if output.running || !grep.is_empty() {
        vec![]
    } else {
        match ui.st.store.read_log_lines(run.id, task, n).await {
            Ok(m) => m,
            Err(e) => return Err(error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
        }
    };
    let marked = marked_tail(&bytes, &marks, LOG_TAIL, zone);
    let part = LogPart {
        marked,
        id: run.id,
        task,
        n,
        // A search shows what there is now; it is not followed.
        live: output.running && grep.is_empty(),
        text: String::from_utf8_lossy(&bytes[from..]).into_owned(),
        truncated: from > 0,
        shown: bytes.len() - from,
        grep,
        found,
        matched,
    };
    part.render()
        .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))
}

/// `GET /runs/{id}`.
pub(crate) async fn page<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Path(id): Path<RunId>,
    Query(q): Query<RunQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let run = match readable(&ui, &v, id).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let now = Timestamp::now();
    let zone = &v.zone;
    // The attempt whose log is shown: the one asked for, else a running
    // one, else the last one that started.
    let chosen = match (&q.task, q.attempt) {
        (Some(t), n) => run.tasks.iter().find(|x| &x.id == t).and_then(|x| {
            let a = match n {
                Some(n) => x.attempts.iter().find(|a| a.number == n),
                None => x.attempts.last(),
            };
            a.map(|a| (x.id.clone(), a.number))
        }),
        _ => None,
    }
    .or_else(|| {
        let all = run
            .tasks
            .iter()
            .flat_map(|t| t.attempts.iter().map(move |a| (t, a)));
        all.clone()
            .find(|(_, a)| !a.state.is_terminal())
            .or_else(|| all.max_by_key(|(_, a)| a.started_at))
            .map(|(t, a)| (t.id.clone(), a.number))
    });
    let log = match &chosen {
        Some((t, n)) => match log_part(&ui, &run, t, *n, &q.grep, zone).await {
            Ok(html) => html,
            Err(resp) => return resp,
        },
        None => r#"<p class="muted">No attempt has started yet.</p>"#.to_string(),
    };
    let (rows, start, end) = timeline(&run, now);
    let may_intervene = v.may(Need::Operate, Some(&run.namespace))
        && run.state == dagcron_core::RunState::Running
        && run.closing.is_none();
    let view = |t: &dagcron_store::TaskRecord| TaskView {
        id: t.id.clone(),
        state: t.state.as_str(),
        carried: t.carried,
        actions: if may_intervene {
            task_actions(t.state)
        } else {
            &[]
        },
        item: t.item.clone().unwrap_or_default(),
        note: t.note.clone().unwrap_or_default(),
        outputs: t
            .carried_outputs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        instances: Vec::new(),
        counts: String::new(),
        attempts: t
            .attempts
            .iter()
            .map(|a| AttemptView {
                number: a.number,
                state: a.state.as_str(),
                started: format::time(a.started_at, zone),
                took: format::duration(a.finished_at.unwrap_or(now).duration_since(a.started_at)),
                exit: a.exit_code.map_or(String::new(), |c| c.to_string()),
                error: a.error.clone().unwrap_or_default(),
                outputs: a
                    .outputs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                selected: chosen.as_ref() == Some(&(t.id.clone(), a.number)),
            })
            .collect(),
    };
    // The instances of a mapped task are grouped under it.
    let mut tasks: Vec<TaskView> = run
        .tasks
        .iter()
        .filter(|t| t.item.is_none())
        .map(view)
        .collect();
    for t in run.tasks.iter().filter(|t| t.item.is_some()) {
        let of = dagcron_core::fan_out::parse_instance(&t.id).map(|(task, _)| task);
        if let Some(group) = tasks.iter_mut().find(|g| Some(g.id.as_str()) == of) {
            group.instances.push(view(t));
        }
    }
    for group in tasks.iter_mut().filter(|g| !g.instances.is_empty()) {
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for i in &group.instances {
            *counts.entry(i.state).or_default() += 1;
        }
        let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
        group.counts = format!("{} instances: {}", group.instances.len(), counts.join(", "));
        // A page shows the first of a large fan-out: those that did not
        // succeed first (the API lists every instance).
        if group.instances.len() > MAX_INSTANCES_SHOWN {
            group.instances.sort_by_key(|i| i.state == "succeeded");
            group.instances.truncate(MAX_INSTANCES_SHOWN);
            group.counts.push_str(&format!(
                " (the first {MAX_INSTANCES_SHOWN} shown, those that did not succeed first)"
            ));
        }
    }
    let params = run
        .params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    render(&RunPage {
        chrome: v.chrome(format!("Run {id}"), "jobs"),
        id,
        operate: v.may(Need::Operate, Some(&run.namespace)),
        ended: run.state.is_terminal(),
        closing: run
            .closing
            .filter(|_| !run.state.is_terminal())
            .map(|s| s.as_str()),
        state: run.state.as_str(),
        trigger: run.trigger.as_str(),
        version: run.job_version,
        scheduled: format::time(run.scheduled_at, zone),
        created: format::time(run.created_at, zone),
        started: format::maybe_time(run.started_at, zone),
        finished: format::maybe_time(run.finished_at, zone),
        rerun_of: run.rerun_of,
        params,
        gantt: gantt(&rows, start, end),
        tasks,
        log_of: chosen,
        log,
        grep: q.grep.trim().to_string(),
        ns: run.namespace,
        job: run.job,
    })
}

/// `GET /runs/{id}/tasks/{task}/attempts/{n}/log`: the log part for htmx;
/// a browser without it is sent to the run's page, which shows the log.
pub(crate) async fn log<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Path((id, task, n)): Path<(RunId, String, u32)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let run = match readable(&ui, &v, id).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if q.download {
        return match ui.st.attempt_output(&run, &task, n).await {
            Ok(Some(output)) => (
                [
                    (
                        header::CONTENT_TYPE,
                        "text/plain; charset=utf-8".to_string(),
                    ),
                    (
                        header::CONTENT_DISPOSITION,
                        dagcron_api::log_attachment(id, &task, n),
                    ),
                ],
                output.bytes,
            )
                .into_response(),
            Ok(None) => error_page(
                StatusCode::NOT_FOUND,
                &format!("no attempt {n} of task {task} in run {id}"),
            ),
            Err(e) => error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        };
    }
    if !from_htmx(&headers) {
        return Redirect::to(&format!(
            "/runs/{id}?task={}&attempt={n}#log",
            crate::path_part(&task)
        ))
        .into_response();
    }
    match log_part(&ui, &run, &task, n, "", &v.zone).await {
        Ok(html) => axum::response::Html(html).into_response(),
        Err(resp) => resp,
    }
}

/// `POST /runs/{id}/tasks/{task}/{action}`: an operator's intervention on
/// a task (retry, mark succeeded or skipped, fail), sent to the API's
/// route; back to the task on the run's page.
pub(crate) async fn act_on_task<S: Store>(
    State(ui): State<Ui<S>>,
    parts: Parts,
    Path((id, task, action)): Path<(RunId, String, String)>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let v = match crate::form_viewer(&ui, &parts.headers, &f).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let path = format!(
        "/api/v1/runs/{id}/tasks/{}/{}",
        crate::path_part(&task),
        crate::path_part(&action)
    );
    let connect = parts.extensions.get().cloned();
    match call_api(&ui, &v, &parts.headers, connect, &path, json!({})).await {
        Ok(_) => {
            Redirect::to(&format!("/runs/{id}#task-{}", crate::path_part(&task))).into_response()
        }
        Err((status, message)) => error_page(status, &message),
    }
}

/// `POST /runs/{id}/{action}`: cancel or re-run, sent to the API's route.
pub(crate) async fn act<S: Store>(
    State(ui): State<Ui<S>>,
    parts: Parts,
    Path((id, action)): Path<(RunId, String)>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let v = match crate::form_viewer(&ui, &parts.headers, &f).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let body = match action.as_str() {
        "cancel" => json!({}),
        "rerun" => json!({ "failed_only": f.get("failed_only").is_some_and(|x| x == "true") }),
        _ => return error_page(StatusCode::NOT_FOUND, &format!("no action {action}")),
    };
    let path = format!("/api/v1/runs/{id}/{action}");
    let connect = parts.extensions.get().cloned();
    match call_api(&ui, &v, &parts.headers, connect, &path, body).await {
        Ok(answer) => {
            let to = answer["id"]
                .as_i64()
                .filter(|_| action == "rerun")
                .unwrap_or(id);
            Redirect::to(&format!("/runs/{to}")).into_response()
        }
        Err((status, message)) => error_page(status, &message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_log_shows_each_line_with_its_time_and_stream() {
        use dagcron_core::log::{LineMark, Stream, encode};
        let at = |s: i64| {
            Timestamp::from_second(1_800_000_000 + s)
                .unwrap()
                .as_microsecond()
        };
        let marks = encode(&[
            LineMark {
                line: 0,
                at_us: at(0),
                stream: Stream::Stdout,
            },
            LineMark {
                line: 1,
                at_us: at(1),
                stream: Stream::Stderr,
            },
        ]);
        let zone = jiff::tz::TimeZone::UTC;
        let shown = marked_tail(b"hello\noops\nthird\n", &marks, 1000, &zone);
        assert_eq!(shown.len(), 3);
        assert_eq!(
            shown[1],
            ("08:00:01.000".to_string(), "err", "oops".to_string())
        );
        assert_eq!(shown[2].1, "", "a line with no mark");
        // The tail only: the last lines that fit.
        assert_eq!(
            marked_tail(b"hello\noops\nthird\n", &marks, 12, &zone).len(),
            2
        );
        assert!(marked_tail(b"hello\n", &[], 1000, &zone).is_empty());
    }

    #[test]
    fn a_search_finds_lines_by_their_words_whatever_the_case() {
        let text = "starting\nERROR: disk full\nretrying\nerror again\n";
        let (found, n) = matching_lines(text, "error", 1);
        assert_eq!(n, 2);
        assert_eq!(found, [(2, "ERROR: disk full".to_string())]);
        assert_eq!(matching_lines(text, "nothing", 10), (vec![], 0));
    }
}
