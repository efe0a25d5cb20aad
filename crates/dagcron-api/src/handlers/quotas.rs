//! Quotas per namespace: jobs, schedules per job, unfinished runs, and
//! manual triggers per second. Set by an instance admin (a tenant may not
//! lift its own limits), read by anyone of the namespace, stored as a
//! setting of the instance so that every node applies them.
//!
//! A job file past a quota is refused with `400` and the code
//! `quota_exceeded` (with the path of each problem); a trigger or backfill
//! past one with `429`, the same code and `Retry-After`. Each refusal is
//! counted in `dagcron_quota_refusals_total{namespace,quota}`.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use dagcron_core::Job;
use dagcron_core::authz::Need;
use dagcron_core::quota::{Bucket, Limits};
use dagcron_store::prelude::*;
use jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::auth::Principal;
use crate::wire::{Errors, Problem, Quotas};
use crate::{ApiError, AppState};

/// Jobs read from the store at a time when counting them.
const PAGE: u32 = 1000;

/// The largest quota.
const MAX_QUOTA: u32 = 1_000_000_000;

/// The most triggers per second a quota may allow.
const MAX_RATE: u32 = 10_000;

/// The per-server side of the quotas: the trigger buckets and the count of
/// refusals.
#[derive(Debug, Default)]
pub struct QuotaState {
    buckets: Mutex<HashMap<String, Bucket>>,
    refusals: Family<Vec<(&'static str, String)>, Counter>,
    /// Failed authentications per client address (see [`QuotaState::auth_failed`]).
    failures: Mutex<HashMap<String, Bucket>>,
    /// Calls answered `429` for too many failed authentications.
    rate_limited: Counter,
    /// Each job's allowance of webhook deliveries.
    hooks: Mutex<HashMap<(String, String), dagcron_core::hook::Allowance>>,
}

/// Failed authentications one client address may make at once...
const AUTH_BURST: u32 = 200;
/// ...and per second after that.
const AUTH_RATE: u32 = 20;

impl QuotaState {
    /// Registers `dagcron_quota_refusals_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "dagcron_quota_refusals",
            "Calls refused because they would pass a quota of their namespace",
            self.refusals.clone(),
        );
        registry.register(
            "dagcron_auth_rate_limited",
            "Calls answered 429 because their address failed to authenticate too often",
            self.rate_limited.clone(),
        );
    }

    /// Counts a failed authentication from `address` (none: unknown, one
    /// bucket for all such); `Some(seconds to wait)` when the address is
    /// past its allowance ([`AUTH_BURST`] at once, [`AUTH_RATE`] a second),
    /// and the call is then answered `429` without an audit row.
    pub fn auth_failed(&self, address: Option<&str>) -> Option<u64> {
        let ip = address
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            .map_or_else(|| "unknown".to_string(), |a| a.ip().to_string());
        let now = Instant::now();
        let mut failures = self.failures.lock().expect("auth limiter lock");
        if failures.len() > 100_000 {
            // Addresses come and go: a table this large starts over.
            failures.clear();
        }
        let bucket = failures.entry(ip).or_insert(Bucket::full(AUTH_BURST, now));
        if bucket.take(AUTH_RATE, AUTH_BURST, now, 1) {
            None
        } else {
            self.rate_limited.inc();
            Some(1)
        }
    }

    /// Takes a webhook delivery for job (`namespace`, `name`), which takes
    /// `per_minute`; `Err(seconds to wait)` past its allowance.
    pub fn hook_allowed(&self, namespace: &str, name: &str, per_minute: u32) -> Result<(), u64> {
        let now = jiff::Timestamp::now();
        let mut hooks = self.hooks.lock().expect("hook limiter lock");
        if hooks.len() > 100_000 {
            // Jobs come and go: a table this large starts over.
            hooks.clear();
        }
        let result = hooks
            .entry((namespace.to_string(), name.to_string()))
            .or_insert_with(|| dagcron_core::hook::Allowance::full(per_minute, now))
            .take(per_minute, now);
        if result.is_err() {
            self.refused(namespace, "webhook_deliveries");
        }
        result
    }

    fn refused(&self, namespace: &str, quota: &'static str) {
        self.refusals
            .get_or_create(&vec![
                ("namespace", namespace.to_string()),
                ("quota", quota.to_string()),
            ])
            .inc();
    }
}

/// The quotas as the decisions in core take them.
fn limits(q: &Quotas) -> Limits {
    Limits {
        max_jobs: q.max_jobs,
        max_schedules_per_job: q.max_schedules_per_job,
        max_active_runs: q.max_active_runs,
        max_triggers_per_second: q.max_triggers_per_second,
    }
}

fn key(namespace: &str) -> String {
    format!("quotas/{namespace}")
}

/// The quotas of `namespace` (none set: no limit).
async fn quotas_of<S: Store>(st: &AppState<S>, namespace: &str) -> Result<Quotas, ApiError> {
    parse(namespace, st.store.get_setting(&key(namespace)).await?)
}

/// The quotas of `namespace` as stored (`text`).
fn parse(namespace: &str, text: Option<String>) -> Result<Quotas, ApiError> {
    match text {
        None => Ok(Quotas::default()),
        Some(text) => serde_json::from_str(&text).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("the stored quotas of {namespace} do not read back: {e}"),
            )
        }),
    }
}

/// Refuses to set a namespace's quotas or retention unless `who` is an
/// instance admin (a tenant may not lift its own limits) and `ns` is a
/// namespace's name.
pub(crate) fn may_set(who: &Principal, ns: &str) -> Result<(), ApiError> {
    who.allow(Need::Administer, None, || {
        ApiError::not_found("no such path")
    })?;
    if !dagcron_core::model::valid_name(ns) {
        return Err(ApiError::bad_request(format!(
            "{ns:?} is not a namespace name"
        )));
    }
    Ok(())
}

/// A namespace's quotas (each one absent means no limit).
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/quotas", tag = "admin",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = Quotas), Errors))]
pub(crate) async fn get_quotas<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
) -> Result<Json<Quotas>, ApiError> {
    who.allow(Need::Read, Some(&ns), crate::routes::no_namespace(&ns))?;
    Ok(Json(quotas_of(&st, &ns).await?))
}

/// Sets a namespace's quotas, all at once (an instance admin's call).
#[utoipa::path(put, path = "/api/v1/namespaces/{ns}/quotas", tag = "admin",
    params(("ns" = String, Path, description = "Namespace")),
    request_body(content = Quotas, content_type = "application/json"),
    responses((status = 200, body = Quotas), Errors))]
pub(crate) async fn put_quotas<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Quotas>, ApiError> {
    may_set(&who, &ns)?;
    let quotas: Quotas = crate::handlers::operations::object(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"max_jobs\", \"max_schedules_per_job\", \"max_active_runs\", \"max_triggers_per_second\"}} (each a number or null): {e}"
        ))
    })?;
    let limits = [
        quotas.max_jobs,
        quotas.max_schedules_per_job,
        quotas.max_active_runs,
        quotas.max_triggers_per_second,
    ];
    if limits
        .iter()
        .flatten()
        .any(|q| !(1..=MAX_QUOTA).contains(q))
    {
        return Err(ApiError::bad_request(format!(
            "a quota is from 1 to {MAX_QUOTA} (null: no limit)"
        )));
    }
    if quotas.max_triggers_per_second.is_some_and(|r| r > MAX_RATE) {
        return Err(ApiError::bad_request(format!(
            "max_triggers_per_second is at most {MAX_RATE}"
        )));
    }
    let text = serde_json::to_string(&quotas).expect("quotas serialize");
    let value = (quotas != Quotas::default()).then_some(text.as_str());
    st.store
        .set_setting(&key(&ns), value, Timestamp::now())
        .await?;
    Ok(Json(quotas))
}

fn exceeded(problems: Vec<Problem>, message: String) -> ApiError {
    let mut err = ApiError::new(StatusCode::BAD_REQUEST, "quota_exceeded", message);
    err.details = Some(problems);
    err
}

/// Refuses jobs of `namespace` (the file's, in its order) that would pass
/// its quotas of jobs or of schedules per job.
pub(crate) async fn check_jobs<S: Store>(
    st: &AppState<S>,
    namespace: &str,
    jobs: &[Job],
) -> Result<(), ApiError> {
    let quotas = quotas_of(st, namespace).await?;
    let limits = limits(&quotas);
    let over = limits.too_many_schedules(jobs.iter().map(|j| j.schedules.len()));
    if let Some(max) = quotas.max_schedules_per_job
        && !over.is_empty()
    {
        let problems: Vec<Problem> = over
            .iter()
            .map(|o| Problem {
                path: format!("jobs[{}].schedule", o.index),
                message: format!(
                    "{} schedules, over the namespace's quota of {max} per job",
                    o.schedules
                ),
                span: None,
            })
            .collect();
        st.quota.refused(namespace, "max_schedules_per_job");
        return Err(exceeded(
            problems,
            format!("a job of {namespace} has more schedules than its quota allows"),
        ));
    }
    let Some(max) = quotas.max_jobs else {
        return Ok(());
    };
    // The names stored, read until they alone pass the quota.
    let mut stored = HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = st
            .store
            .list_jobs(namespace, PAGE, cursor.as_deref())
            .await?;
        stored.extend(page.items.into_iter().map(|j| j.name));
        cursor = page.next_cursor;
        if cursor.is_none() || stored.len() > max as usize {
            break;
        }
    }
    let new = jobs
        .iter()
        .filter(|j| !stored.contains(&j.spec.name))
        .count();
    if !limits.jobs_pass(stored.len(), new) {
        st.quota.refused(namespace, "max_jobs");
        return Err(exceeded(
            vec![Problem {
                path: "jobs".into(),
                message: format!(
                    "{new} new job(s) beside the {} stored, over the namespace's quota of {max}",
                    stored.len()
                ),
                span: None,
            }],
            format!("{namespace} would hold more jobs than its quota of {max}"),
        ));
    }
    Ok(())
}

/// Refuses a manual trigger of `runs` runs, a re-run or a backfill (one)
/// in `namespace` while the instance is read-only (`503`), or past the
/// namespace's quotas of triggers per second or of unfinished runs
/// (`429`; each run of a trigger counts as one trigger). Both settings
/// are read in one statement.
pub(crate) async fn check_trigger<S: Store>(
    st: &AppState<S>,
    namespace: &str,
    runs: u32,
) -> Result<(), ApiError> {
    let [read_only, quotas] = st
        .store
        .get_settings([crate::handlers::operations::READ_ONLY, &key(namespace)])
        .await?;
    crate::handlers::operations::refuse_if_read_only(read_only)?;
    let quotas = parse(namespace, quotas)?;
    let busy = |quota: &'static str, message: String| {
        st.quota.refused(namespace, quota);
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
    };
    // The rate is taken last: a trigger refused for its runs spends none.
    if let Some(max) = quotas.max_active_runs {
        let unfinished = st.store.count_unfinished_runs(namespace).await?;
        if !limits(&quotas).active_runs_pass(unfinished, runs) {
            return Err(busy(
                "max_active_runs",
                match runs {
                    1 => format!(
                        "{namespace} has {unfinished} unfinished runs, as many as its quota of {max} allows"
                    ),
                    n => format!(
                        "{namespace} has {unfinished} unfinished runs, and {n} more would pass its quota of {max}"
                    ),
                },
            ));
        }
    }
    if let Some(rate) = quotas.max_triggers_per_second {
        let now = Instant::now();
        let mut buckets = st.quota.buckets.lock().expect("quota lock");
        let bucket = buckets
            .entry(namespace.to_string())
            .or_insert(Bucket::full(rate, now));
        if !bucket.take(rate, rate, now, runs) {
            let more = if runs > rate {
                format!(
                    "; a trigger of {runs} runs can never pass it, send at most {rate} at a time"
                )
            } else {
                String::new()
            };
            return Err(busy(
                "max_triggers_per_second",
                format!("{namespace} is limited to {rate} trigger(s) per second{more}"),
            ));
        }
    }
    Ok(())
}
