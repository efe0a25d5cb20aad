//! `/notifications/{ns}`: a namespace's outbox, newest first: where each
//! notification went, where it stands, its attempts and its last error;
//! only those given up with `?failed=1`.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use dagcron_api::ApiError;
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use serde::Deserialize;

use crate::{Chrome, Ui, error_page, format, render, viewer};

/// Notifications a page shows.
const PAGE: u32 = 50;

#[derive(Deserialize, Default)]
pub(crate) struct NotificationsQuery {
    #[serde(default)]
    failed: Option<String>,
    before: Option<i64>,
}

struct Row {
    id: i64,
    at: String,
    job: String,
    run: Option<i64>,
    event: String,
    notifier: String,
    state: String,
    attempts: u32,
    next: String,
    error: String,
}

#[derive(Template)]
#[template(path = "notifications.html")]
struct NotificationsPage {
    chrome: Chrome,
    ns: String,
    failed: bool,
    rows: Vec<Row>,
    first: bool,
    next: Option<i64>,
}

/// How a notification's state shows, as a run state's class does.
fn class(state: &str) -> &'static str {
    match state {
        "delivered" => "succeeded",
        "failed" => "failed",
        "pending" => "running",
        _ => "skipped",
    }
}

/// `GET /notifications/{ns}`.
pub(crate) async fn page<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Path(ns): Path<String>,
    Query(q): Query<NotificationsQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let missing = || ApiError::not_found(format!("no namespace {ns}"));
    if let Err(e) = v.who.allow(Need::Read, Some(&ns), missing) {
        return error_page(e.status, &e.message);
    }
    let failed = q
        .failed
        .as_deref()
        .is_some_and(|f| !f.is_empty() && f != "0");
    let before = q.before.filter(|b| *b > 0);
    let found = match ui
        .st
        .store
        .list_notifications(&ns, failed, before, PAGE)
        .await
    {
        Ok(r) => r,
        Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    };
    let next = (found.len() == PAGE as usize)
        .then(|| found.last().map(|n| n.id))
        .flatten();
    let rows = found
        .iter()
        .map(|n| Row {
            id: n.id,
            at: format::time(n.made.at, &v.zone),
            job: n.made.job.clone(),
            run: n.made.run,
            event: n.made.event.clone(),
            notifier: n.made.notifier.clone(),
            state: n.state.as_str().into(),
            attempts: n.attempts,
            next: format::maybe_time(n.next_at, &v.zone),
            error: n.last_error.clone().unwrap_or_default(),
        })
        .collect();
    render(&NotificationsPage {
        chrome: v.chrome("Notifications", "jobs"),
        ns,
        failed,
        rows,
        first: before.is_none(),
        next,
    })
}
