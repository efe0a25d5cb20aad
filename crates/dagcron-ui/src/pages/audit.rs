//! `/audit`: the audit log for admins, newest first, filtered by who, what
//! and whether it was refused (and by namespace, for an instance admin),
//! each row linked to the job or run it concerned.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use dagcron_api::ApiError;
use dagcron_core::authz::Need;
use dagcron_store::AuditEntry;
use dagcron_store::prelude::*;
use serde::Deserialize;

use crate::{Chrome, Ui, error_page, format, render, viewer};

/// Rows a page shows.
const PAGE: usize = 100;
/// Rows read per store page while filtering.
const SCAN_PAGE: u32 = 500;
/// At most this many rows are read to fill one page of a search.
const SCAN_MAX: usize = 5000;

#[derive(Deserialize, Default)]
pub(crate) struct AuditQuery {
    /// Rows before this position (default: the newest).
    before: Option<i64>,
    #[serde(default)]
    ns: String,
    #[serde(default)]
    who: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    refused: bool,
}

struct AuditRow {
    seq: i64,
    at: String,
    who: String,
    method: String,
    what: String,
    link: Option<String>,
    ns: String,
    outcome: u16,
    address: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Chrome,
    rows: Vec<AuditRow>,
    q: AuditQuery,
    /// Whether the viewer may pick a namespace (an instance admin).
    instance: bool,
    /// The query of this page without its position, for the pager.
    query: String,
    next: Option<i64>,
    scanned: usize,
    scanned_out: bool,
}

/// An audited call in words, and the page of what it concerned: `POST
/// /api/v1/namespaces/a/jobs/j/trigger` is "trigger of job a/j", linked to
/// the job's page.
fn describe(action: &str) -> (String, String, Option<String>) {
    let (method, path) = action.split_once(' ').unwrap_or(("", action));
    let parts: Vec<&str> = path
        .trim_start_matches("/api/v1/")
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    let (what, link) = match parts.as_slice() {
        ["namespaces", ns, "jobs", job, rest @ ..] => {
            let verb = match (method, rest) {
                ("PUT", []) => "change".to_string(),
                ("DELETE", []) => "deletion".to_string(),
                (_, []) => "read".to_string(),
                (_, more) => more.join(" "),
            };
            (
                format!("{verb} of job {ns}/{job}"),
                Some(format!("/jobs/{ns}/{job}")),
            )
        }
        ["runs", id, rest @ ..] => {
            let verb = if rest.is_empty() {
                "read".to_string()
            } else {
                rest.join(" ")
            };
            (format!("{verb} of run {id}"), Some(format!("/runs/{id}")))
        }
        ["apply"] => ("apply of a job file".to_string(), None),
        _ => (path.to_string(), None),
    };
    (method.to_string(), what, link)
}

fn keeps(q: &AuditQuery, e: &AuditEntry) -> bool {
    let who = e
        .principal_name
        .as_deref()
        .or(e.principal.as_deref())
        .unwrap_or("");
    (!q.refused || e.outcome >= 400)
        && (q.who.is_empty() || who.to_lowercase().contains(&q.who.trim().to_lowercase()))
        && (q.action.is_empty()
            || e.action
                .to_lowercase()
                .contains(&q.action.trim().to_lowercase()))
}

/// `GET /audit`: as `/api/v1/audit` decides, an instance admin reads it
/// all, a namespace's admin that namespace's rows.
pub(crate) async fn page<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Query(mut q): Query<AuditQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let instance = v.who.grant.namespace.is_none();
    if let Some(own) = &v.who.grant.namespace {
        q.ns = own.clone();
    }
    let ns = Some(q.ns.trim().to_string()).filter(|n| !n.is_empty());
    if let Err(e) = v.who.allow(Need::Administer, ns.as_deref(), || {
        ApiError::not_found("no such namespace")
    }) {
        return error_page(e.status, &e.message);
    }
    let mut before = q.before.unwrap_or(i64::MAX);
    let mut picked = Vec::new();
    let mut scanned = 0;
    let mut next = None;
    let mut scanned_out = false;
    'scan: loop {
        let rows = match ui
            .st
            .store
            .list_audit_newest(before, SCAN_PAGE, ns.as_deref())
            .await
        {
            Ok(r) => r,
            Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        };
        let ended = rows.len() < SCAN_PAGE as usize;
        for e in rows {
            scanned += 1;
            before = e.seq;
            if keeps(&q, &e) {
                picked.push(e);
                if picked.len() == PAGE {
                    next = Some(before);
                    break 'scan;
                }
            }
        }
        if ended {
            break;
        }
        if scanned >= SCAN_MAX {
            next = Some(before);
            scanned_out = true;
            break;
        }
    }
    let query = [("ns", &q.ns), ("who", &q.who), ("action", &q.action)]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", crate::path_part(v)))
        .chain(q.refused.then(|| "refused=true".to_string()))
        .collect::<Vec<_>>()
        .join("&");
    render(&AuditPage {
        chrome: v.chrome("Audit log", "audit"),
        rows: picked
            .iter()
            .map(|r| {
                let (method, what, link) = describe(&r.action);
                AuditRow {
                    seq: r.seq,
                    at: format::time(r.at, &v.zone),
                    who: r
                        .principal_name
                        .clone()
                        .or(r.principal.clone())
                        .unwrap_or_else(|| "no valid token".into()),
                    method,
                    what,
                    link,
                    ns: r.namespace.clone().unwrap_or_default(),
                    outcome: r.outcome,
                    address: r.address.clone().unwrap_or_default(),
                }
            })
            .collect(),
        q,
        instance,
        query,
        next,
        scanned,
        scanned_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audited_call_reads_as_words_linked_to_what_it_concerned() {
        let cases = [
            (
                "POST /api/v1/namespaces/a/jobs/j/trigger",
                "trigger of job a/j",
                Some("/jobs/a/j"),
            ),
            (
                "PUT /api/v1/namespaces/a/jobs/j",
                "change of job a/j",
                Some("/jobs/a/j"),
            ),
            (
                "POST /api/v1/runs/42/tasks/settle/retry",
                "tasks settle retry of run 42",
                Some("/runs/42"),
            ),
            ("POST /api/v1/apply", "apply of a job file", None),
            ("POST /api/v1/tokens", "/api/v1/tokens", None),
        ];
        for (action, what, link) in cases {
            let (_, w, l) = describe(action);
            assert_eq!((w.as_str(), l.as_deref()), (what, link), "{action}");
        }
    }
}
