//! Runs: trigger (one or a batch, now or planned), backfill, list, read,
//! cancel, the fire ledger and an attempt's log.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use dagcron_store::RunId;
use dagcron_store::prelude::*;
use jiff::Timestamp;
use serde::Deserialize;

use crate::auth::{AuditNamespace, Principal};
use crate::routes::*;
use crate::wire::{
    BackfillAnswer, BackfillBody, Errors, FireAnswer, FirePage, LogLines, Problem, RunAnswer,
    RunPage, TriggerBatchAnswer, TriggerBatchBody, TriggerBody,
};
use crate::{ApiError, AppState};
use dagcron_core::authz::Need;

pub(crate) async fn run_json<S: Store>(st: &AppState<S>, id: RunId) -> Result<RunAnswer, ApiError> {
    let run = st
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {id}")))?;
    Ok(RunAnswer::from(&run))
}

/// Starts a run now, with parameters over the job's defaults (an empty
/// body: none), or records one to be made `at` an instant: it is `planned`
/// until then (listed among the job's upcoming fires, cancellable), made
/// exactly once at its instant, and, if the server was down then, when it
/// is back by the job's misfire policy. With a W3C `traceparent` header,
/// the run's trace is a child of the caller's span (a malformed one is
/// ignored, as the W3C says).
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/trigger", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"),
        ("traceparent" = Option<String>, Header, description = "The caller's W3C trace context"),
        ("tracestate" = Option<String>, Header, description = "The caller's W3C trace state")),
    request_body(content = Option<TriggerBody>, content_type = "application/json"),
    responses((status = 201, body = RunAnswer), Errors))]
pub(crate) async fn trigger<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    let body: TriggerBody = if body.iter().all(u8::is_ascii_whitespace) {
        TriggerBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "expected {{\"params\": {{...}}, \"at\": RFC 3339 (optional)}}: {e}"
            ))
        })?
    };
    let params = vec![body.params];
    let mut runs = make_runs(&st, &ns, &name, &headers, params, body.at, |_| {
        "params".into()
    })
    .await?;
    Ok((StatusCode::CREATED, Json(runs.remove(0))))
}

/// Starts many runs of a job now in one call (1 to 1000, each with its
/// parameters over the job's defaults), or records them to be made `at`
/// an instant. They are decided together and committed together before
/// the answer, which lists them in the order asked: if any one is invalid
/// or would pass a limit (the namespace's quotas, counting each run as a
/// trigger; the job's `max_pending_runs` or overlap policy; the server's
/// ready backlog; read-only mode), none is made and the answer says why.
/// Each run is answered as committed, without attempts.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/trigger-batch", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"),
        ("traceparent" = Option<String>, Header, description = "The caller's W3C trace context"),
        ("tracestate" = Option<String>, Header, description = "The caller's W3C trace state")),
    request_body(content = TriggerBatchBody, content_type = "application/json"),
    responses((status = 201, body = TriggerBatchAnswer), Errors))]
pub(crate) async fn trigger_batch<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    let body: TriggerBatchBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"runs\": [{{\"params\": {{...}}}}, ...], \"at\": RFC 3339 (optional)}}: {e}"
        ))
    })?;
    let max = dagcron_runtime::MAX_TRIGGER_RUNS;
    if body.runs.is_empty() || body.runs.len() > max {
        return Err(ApiError::bad_request(format!(
            "`runs` holds 1 to {max} runs, not {}",
            body.runs.len()
        )));
    }
    let params = body.runs.into_iter().map(|r| r.params).collect();
    let path = |i| format!("runs[{i}].params");
    let runs = make_runs(&st, &ns, &name, &headers, params, body.at, path).await?;
    Ok((StatusCode::CREATED, Json(TriggerBatchAnswer { runs })))
}

/// The runs of a trigger, checked (`at`, every run's parameters, then
/// read-only mode and quotas: `path` names the `i`th in a problem) before the engine
/// makes them all or none; answered as the engine committed them.
pub(crate) async fn make_runs<S: Store>(
    st: &AppState<S>,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    params: Vec<std::collections::BTreeMap<String, String>>,
    at: Option<Timestamp>,
    path: impl Fn(usize) -> String,
) -> Result<Vec<RunAnswer>, ApiError> {
    if let Some(at) = at {
        check_planned_instant(at, Timestamp::now())?;
    }
    let problems: Vec<_> = params
        .iter()
        .enumerate()
        .flat_map(|(i, p)| dagcron_core::model::check_params(p, &path(i)))
        .collect();
    if !problems.is_empty() {
        let mut err = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_params",
            format!(
                "{} problem(s) with the parameters: {}",
                problems.len(),
                dagcron_core::ValidationErrors(problems.clone())
            ),
        );
        err.details = Some(problems.iter().map(Problem::from).collect());
        return Err(err);
    }
    crate::handlers::quotas::check_trigger(st, ns, params.len() as u32).await?;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let caller = header("traceparent")
        .and_then(|p| dagcron_runtime::trace::TraceParent::parse(p, header("tracestate")));
    let runs = st.engine.trigger_runs(ns, name, params, caller, at).await?;
    Ok(runs.iter().map(RunAnswer::from).collect())
}

/// How far ahead a run may be planned.
pub(crate) const MAX_PLAN_AHEAD: jiff::SignedDuration =
    jiff::SignedDuration::from_hours(10 * 366 * 24);

/// A trigger's `at` must be ahead of `now`, and not absurdly far.
pub(crate) fn check_planned_instant(at: Timestamp, now: Timestamp) -> Result<(), ApiError> {
    if at <= now {
        return Err(ApiError::bad_request(format!(
            "`at` ({at}) has passed (it is {now}); leave `at` out to run now"
        )));
    }
    if at.duration_since(now) > MAX_PLAN_AHEAD {
        return Err(ApiError::bad_request(format!(
            "`at` ({at}) is more than ten years ahead"
        )));
    }
    Ok(())
}

/// Creates a run for every fire of `[from, to)` not in the ledger yet.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/jobs/{name}/backfill", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    request_body(content = BackfillBody, content_type = "application/json"),
    responses((status = 201, body = BackfillAnswer), Errors))]
pub(crate) async fn backfill<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    who.allow(Need::Operate, Some(&ns), no_job(&ns, &name))?;
    crate::handlers::quotas::check_trigger(&st, &ns, 1).await?;
    let body: BackfillBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"from\": RFC 3339, \"to\": RFC 3339}}: {e}"
        ))
    })?;
    let runs = st.engine.backfill(&ns, &name, body.from, body.to).await?;
    Ok((StatusCode::CREATED, Json(BackfillAnswer { runs })))
}

/// A job's runs, newest first.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}/runs", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"), PageQuery),
    responses((status = 200, body = RunPage), Errors))]
pub(crate) async fn list_runs<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Result<Json<RunPage>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    let page = st
        .store
        .list_runs(&ns, &name, limit(q.limit)?, q.cursor.as_deref())
        .await?;
    Ok(Json(RunPage {
        items: page.items.iter().map(RunAnswer::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// Which runs the runs browser lists.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct BrowseQuery {
    /// Only this namespace's runs (a namespace-scoped token reads its own
    /// namespace, and another one's looks empty; an instance-wide token
    /// reads every namespace without it).
    namespace: Option<String>,
    /// Only the runs of jobs of this name.
    job: Option<String>,
    /// Only runs in these states, comma-separated (`failed,cancelled`).
    state: Option<String>,
    /// Only runs made by this trigger (`schedule`, `catchup`, `manual`,
    /// `backfill`, `rerun`, `webhook`, `after` or `message`).
    trigger: Option<String>,
    /// Only runs whose fire instant is at or after this (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    since: Option<Timestamp>,
    /// Only runs whose fire instant is before this (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    until: Option<Timestamp>,
    /// At most this many runs (1 to 1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Where the previous page ended (its `next_cursor`).
    cursor: Option<String>,
}

/// Runs across jobs, newest first, filtered: the runs browser. The
/// namespace and the job are looked up by index; the other filters are
/// checked on at most 10,000 runs a page: a page may hold fewer runs than
/// asked, with a `next_cursor` to look further back.
#[utoipa::path(get, path = "/api/v1/runs", tag = "runs",
    params(BrowseQuery),
    responses((status = 200, body = RunPage), Errors))]
pub(crate) async fn browse_runs<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Query(q): Query<BrowseQuery>,
) -> Result<Json<RunPage>, ApiError> {
    let limit = limit(q.limit)?;
    let filter = dagcron_store::RunFilter {
        namespace: q.namespace.or_else(|| who.grant.namespace.clone()),
        job: q.job.filter(|j| !j.is_empty()),
        states: dagcron_store::RunFilter::parse_states(q.state.as_deref().unwrap_or(""))
            .map_err(ApiError::bad_request)?,
        trigger: dagcron_store::RunFilter::parse_trigger(q.trigger.as_deref().unwrap_or(""))
            .map_err(ApiError::bad_request)?,
        since: q.since,
        until: q.until,
        ended_since: None,
    };
    if let (Some(since), Some(until)) = (filter.since, filter.until) {
        if since >= until {
            return Err(ApiError::bad_request(format!(
                "since ({since}) must be before until ({until})"
            )));
        }
    }
    match &filter.namespace {
        Some(ns) => {
            if !who.lists(Need::Read, ns)? {
                return Ok(Json(RunPage {
                    items: vec![],
                    next_cursor: None,
                }));
            }
        }
        None => who.allow(Need::Read, None, || ApiError::not_found("no such path"))?,
    }
    let page = st
        .store
        .browse_runs(&filter, limit, q.cursor.as_deref())
        .await?;
    Ok(Json(RunPage {
        items: page.items.iter().map(RunAnswer::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// A range of the fire ledger.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct FiresQuery {
    /// From this instant (RFC 3339), included.
    #[param(value_type = Option<String>, format = DateTime)]
    from: Option<Timestamp>,
    /// Up to this instant, excluded.
    #[param(value_type = Option<String>, format = DateTime)]
    to: Option<Timestamp>,
    /// At most this many fires (1 to 10000, default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u32>,
}

/// A job's fire ledger: every expected fire and what happened to it.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/jobs/{name}/fires", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job"), FiresQuery),
    responses((status = 200, body = FirePage), Errors))]
pub(crate) async fn list_fires<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<FiresQuery>,
) -> Result<Json<FirePage>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_job(&ns, &name))?;
    let limit = match q.limit {
        None => 1000,
        Some(n) if (1..=10_000).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit {n} is out of range: 1 to 10000"
            )));
        }
    };
    let fires = st
        .store
        .list_fires(
            &ns,
            &name,
            q.from.unwrap_or(Timestamp::UNIX_EPOCH),
            q.to.unwrap_or(Timestamp::MAX),
            limit,
        )
        .await?;
    Ok(Json(FirePage {
        items: fires.iter().map(FireAnswer::from).collect(),
    }))
}

/// A run, its tasks and their attempts.
#[utoipa::path(get, path = "/api/v1/runs/{id}", tag = "runs",
    params(("id" = i64, Path, description = "Run id")),
    responses((status = 200, body = RunAnswer), Errors))]
pub(crate) async fn get_run<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<RunId>,
) -> Result<Json<RunAnswer>, ApiError> {
    let run = run_json(&st, id).await?;
    who.allow(Need::Read, Some(&run.namespace), no_run(id))?;
    Ok(Json(run))
}

/// Cancels a run: its running attempts are stopped, the rest cancelled.
#[utoipa::path(post, path = "/api/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = i64, Path, description = "Run id")),
    responses((status = 200, body = RunAnswer), Errors))]
pub(crate) async fn cancel<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<RunId>,
) -> Result<(Extension<AuditNamespace>, Json<RunAnswer>), ApiError> {
    let run = run_json(&st, id).await?;
    who.allow(Need::Operate, Some(&run.namespace), no_run(id))?;
    st.engine.cancel(id).await?;
    Ok((
        Extension(AuditNamespace(run.namespace)),
        Json(run_json(&st, id).await?),
    ))
}

/// How to read a log.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogQuery {
    /// Stream the output of a running attempt until it ends.
    #[serde(default)]
    follow: bool,
    /// Answer as a file to save (`Content-Disposition: attachment`).
    #[serde(default)]
    download: bool,
    /// Answer line by line in JSON, each line with when and from which
    /// stream it was written (known once the attempt has ended).
    #[serde(default)]
    lines: bool,
}

/// The header that makes an attempt's log a file to save, named after it.
pub fn log_attachment(run: RunId, task: &str, n: u32) -> String {
    let safe: String = task
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("attachment; filename=\"run-{run}-{safe}-{n}.log\"")
}

/// The header that says whether a log is whole or still growing.
pub(crate) const LOG_HEADER: &str = "x-dagcron-log";

/// An attempt's output. Without `follow`, what there is now: while the
/// attempt runs, its output so far (header `X-Dagcron-Log: partial`), once
/// it has ended, all of it (`complete`). With `?follow=true`, the body
/// streams the output of a running attempt as it comes and ends when the
/// attempt does.
#[utoipa::path(get, path = "/api/v1/runs/{id}/tasks/{task}/attempts/{n}/log", tag = "runs",
    params(("id" = i64, Path, description = "Run id"), ("task" = String, Path, description = "Task id"),
        ("n" = u32, Path, description = "Attempt number, from 1"), LogQuery),
    responses((status = 200, description = "The output, stdout and stderr interleaved (with `lines=true`, line by line in JSON)",
        content((String = "text/plain"), (LogLines = "application/json")),
        headers(("X-Dagcron-Log" = String, description = "`partial` while the attempt runs (more may come; the output of an attempt running on another node of a cluster is as that node last published it, every second), `complete` once it has ended"))), Errors))]
pub(crate) async fn get_log<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((id, task, n)): Path<(RunId, String, u32)>,
    Query(q): Query<LogQuery>,
) -> Result<axum::response::Response, ApiError> {
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    let missing = || ApiError::not_found(format!("no attempt {n} of task {task} in run {id}"));
    let Some(run) = st.store.get_run(id).await? else {
        return Err(missing());
    };
    who.allow(Need::Read, Some(&run.namespace), missing)?;
    if !q.follow {
        let output = st
            .attempt_output(&run, &task, n)
            .await?
            .ok_or_else(missing)?;
        let whole = if output.running {
            "partial"
        } else {
            "complete"
        };
        if q.lines {
            let marks = if output.running {
                vec![]
            } else {
                st.store.read_log_lines(id, &task, n).await?
            };
            let answer = LogLines::of(&output.bytes, &marks, !output.running);
            return Ok(([(LOG_HEADER, whole)], Json(answer)).into_response());
        }
        let mut resp = (text, [(LOG_HEADER, whole)], output.bytes).into_response();
        if q.download {
            if let Ok(v) = log_attachment(id, &task, n).parse() {
                resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
            }
        }
        return Ok(resp);
    }
    if st.store.read_log(id, &task, n).await?.is_none() {
        return Err(missing());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(16);
    tokio::spawn(follow(st, id, task, n, tx));
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok((text, body).into_response())
}

/// Feeds a follower until the attempt has ended (or the follower left).
pub(crate) async fn follow<S: Store>(
    st: AppState<S>,
    id: RunId,
    task: String,
    n: u32,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::convert::Infallible>>,
) {
    let mut offset = 0;
    loop {
        if let Some(live) = st.engine.live_log(id, &task, n) {
            loop {
                let (bytes, done) = live.read_from(offset);
                if !bytes.is_empty() {
                    offset += bytes.len();
                    if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                        return;
                    }
                }
                if done {
                    return;
                }
                live.wait(std::time::Duration::from_millis(500)).await;
                if tx.is_closed() {
                    return;
                }
            }
        }
        // Not running here (not started yet, on an agent or another node,
        // or just finished): the stored record decides.
        let ended = match st.store.get_run(id).await {
            Ok(Some(run)) => run
                .tasks
                .iter()
                .find(|t| t.id == task)
                .and_then(|t| t.attempts.iter().find(|a| a.number == n))
                .is_none_or(|a| a.state.is_terminal()),
            _ => true,
        };
        if ended {
            if let Ok(Some(log)) = st.store.read_log(id, &task, n).await {
                if log.len() > offset {
                    let _ = tx.send(Ok(Bytes::from(log[offset..].to_vec()))).await;
                }
            }
            return;
        }
        // Running on another node: what it last published (its last
        // bytes, `skipped` before them).
        if let Ok(Some((skipped, tail))) = st.store.read_live_log(id, &task, n).await {
            let skipped = usize::try_from(skipped).unwrap_or(usize::MAX);
            let mut more = Vec::new();
            if offset < skipped {
                more.extend_from_slice(
                    crate::state::skipped_note((skipped - offset) as u64).as_bytes(),
                );
                offset = skipped;
            }
            if skipped + tail.len() > offset {
                more.extend_from_slice(&tail[offset - skipped..]);
                offset = skipped + tail.len();
            }
            if !more.is_empty() && tx.send(Ok(Bytes::from(more))).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if tx.is_closed() {
            return;
        }
    }
}
