//! Execution policies per namespace (see [`dagcron_core::exec_policy`]):
//! set by an instance admin (a tenant may not widen its own), read by
//! anyone of the namespace, stored as settings of the instance so that
//! every node applies them. A namespace without a policy of its own has
//! the instance's default (`/api/v1/admin/policy`), itself the built-in
//! default until an instance admin sets it.
//!
//! A job file that a policy refuses is refused whole with `403` and the
//! code `policy_refused`, each problem naming the task and the rule. The
//! engine asks again when each attempt starts ([`StoredPolicies`]), so a
//! policy narrowed after a job was applied still holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use dagcron_core::Job;
use dagcron_core::authz::Need;
use dagcron_core::exec_policy::{ExecPolicy, ShellRule};
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::auth::Principal;
use crate::wire::{Errors, Policy, Problem, ShellPlace};
use crate::{ApiError, AppState};

fn key(namespace: &str) -> String {
    format!("policy/{namespace}")
}

/// The setting of the instance's default policy: the policy of every
/// namespace that has none of its own (none set: [`ExecPolicy::default`]).
const DEFAULT_KEY: &str = "policy";

/// The policy stored in the setting `text` of `whose`; none: `fallback`.
fn parse(whose: &str, text: Option<String>, fallback: ExecPolicy) -> Result<ExecPolicy, String> {
    match text {
        None => Ok(fallback),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| format!("the stored policy of {whose} does not read back: {e}")),
    }
}

/// The policy of `namespace`, read from `store`: its own, or the
/// instance's default, or the built-in default.
pub async fn policy_of<S: Store>(store: &S, namespace: &str) -> Result<ExecPolicy, String> {
    let [own, default] = store
        .get_settings([&key(namespace), DEFAULT_KEY])
        .await
        .map_err(|e| format!("reading the execution policy of {namespace}: {e}"))?;
    let default = parse("the instance", default, ExecPolicy::default())?;
    parse(namespace, own, default)
}

/// The instance's default policy, read from `store`.
async fn default_of<S: Store>(store: &S) -> Result<ExecPolicy, String> {
    let text = store
        .get_setting(DEFAULT_KEY)
        .await
        .map_err(|e| format!("reading the instance's default execution policy: {e}"))?;
    parse("the instance", text, ExecPolicy::default())
}

fn to_wire(p: ExecPolicy) -> Policy {
    Policy {
        shell: match p.shell {
            ShellRule::Server => ShellPlace::Server,
            ShellRule::Agents => ShellPlace::Agents,
            ShellRule::None => ShellPlace::None,
        },
        http: p.http,
        wasm: p.wasm,
        wasm_modules: p.wasm_modules,
        wasm_dirs: p.wasm_dirs,
        wasm_write_dirs: p.wasm_write_dirs,
        wasm_env: p.wasm_env,
        http_allow: p.http_allow,
        nats_streams: p.nats_streams,
        run_as: p.run_as,
        weight: p.weight,
    }
}

fn from_wire(p: Policy) -> ExecPolicy {
    ExecPolicy {
        shell: match p.shell {
            ShellPlace::Server => ShellRule::Server,
            ShellPlace::Agents => ShellRule::Agents,
            ShellPlace::None => ShellRule::None,
        },
        http: p.http,
        wasm: p.wasm,
        wasm_modules: p.wasm_modules,
        wasm_dirs: p.wasm_dirs,
        wasm_write_dirs: p.wasm_write_dirs,
        wasm_env: p.wasm_env,
        http_allow: p.http_allow,
        nats_streams: p.nats_streams,
        run_as: p.run_as,
        weight: p.weight,
    }
}

fn internal(message: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
}

/// A namespace's execution policy (the instance's default if none was set).
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/policy", tag = "admin",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = Policy), Errors))]
pub(crate) async fn get_policy<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
) -> Result<Json<Policy>, ApiError> {
    who.allow(Need::Read, Some(&ns), crate::routes::no_namespace(&ns))?;
    let policy = policy_of(&*st.store, &ns).await.map_err(internal)?;
    Ok(Json(to_wire(policy)))
}

/// The instance's default execution policy: the policy of every namespace
/// without one of its own.
#[utoipa::path(get, path = "/api/v1/admin/policy", tag = "admin",
    responses((status = 200, body = Policy), Errors))]
pub(crate) async fn get_default_policy<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<Policy>, ApiError> {
    who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
    let policy = default_of(&*st.store).await.map_err(internal)?;
    Ok(Json(to_wire(policy)))
}

/// Sets the instance's default execution policy, whole (an instance
/// admin's call): every namespace without a policy of its own has it.
#[utoipa::path(put, path = "/api/v1/admin/policy", tag = "admin",
    request_body(content = Policy, content_type = "application/json"),
    responses((status = 200, body = Policy), Errors))]
pub(crate) async fn put_default_policy<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    body: axum::body::Bytes,
) -> Result<Json<Policy>, ApiError> {
    who.allow(Need::Administer, None, || {
        ApiError::not_found("no such path")
    })?;
    let policy = valid(&body, "the instance")?;
    store_policy(&st, DEFAULT_KEY, &policy).await?;
    Ok(Json(to_wire(policy)))
}

/// A policy body, parsed and checked; `whose` names it in the errors.
fn valid(body: &[u8], whose: &str) -> Result<ExecPolicy, ApiError> {
    let wire: Policy = crate::handlers::operations::object(body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected a policy object (shell, http, wasm, wasm_modules, wasm_dirs, wasm_write_dirs, wasm_env, http_allow, nats_streams, run_as, weight): {e}"
        ))
    })?;
    let policy = from_wire(wire);
    let problems: Vec<Problem> = policy
        .validate()
        .into_iter()
        .map(|(path, message)| Problem {
            path,
            message,
            span: None,
        })
        .collect();
    if !problems.is_empty() {
        let mut err = ApiError::bad_request(format!("the policy for {whose} is not valid"));
        err.details = Some(problems);
        return Err(err);
    }
    Ok(policy)
}

/// Stores `policy` under the setting `key`.
async fn store_policy<S: Store>(
    st: &AppState<S>,
    key: &str,
    policy: &ExecPolicy,
) -> Result<(), ApiError> {
    let text = serde_json::to_string(policy).expect("a policy serializes");
    st.store
        .set_setting(key, Some(&text), Timestamp::now())
        .await?;
    Ok(())
}

/// Removes a namespace's own execution policy: the instance's default
/// applies to it again (an instance admin's call).
#[utoipa::path(delete, path = "/api/v1/namespaces/{ns}/policy", tag = "admin",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = Policy), Errors))]
pub(crate) async fn delete_policy<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
) -> Result<Json<Policy>, ApiError> {
    crate::handlers::quotas::may_set(&who, &ns)?;
    st.store
        .set_setting(&key(&ns), None, Timestamp::now())
        .await?;
    let policy = policy_of(&*st.store, &ns).await.map_err(internal)?;
    Ok(Json(to_wire(policy)))
}

/// Sets a namespace's execution policy, whole (an instance admin's call).
/// Jobs already applied are not changed: each attempt is checked again
/// when it starts, and one the new policy refuses fails with the rule.
#[utoipa::path(put, path = "/api/v1/namespaces/{ns}/policy", tag = "admin",
    params(("ns" = String, Path, description = "Namespace")),
    request_body(content = Policy, content_type = "application/json"),
    responses((status = 200, body = Policy), Errors))]
pub(crate) async fn put_policy<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Policy>, ApiError> {
    crate::handlers::quotas::may_set(&who, &ns)?;
    let policy = valid(&body, &ns)?;
    store_policy(&st, &key(&ns), &policy).await?;
    Ok(Json(to_wire(policy)))
}

/// Refuses a job file of `namespace` (its jobs, in order) with a task that
/// its execution policy does not allow: `403 policy_refused`, a problem
/// per broken rule.
pub(crate) async fn check_jobs<S: Store>(
    st: &AppState<S>,
    namespace: &str,
    jobs: &[Job],
) -> Result<(), ApiError> {
    let policy = policy_of(&*st.store, namespace).await.map_err(internal)?;
    let problems: Vec<Problem> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, job)| {
            let policy = &policy;
            job.tasks.iter().enumerate().flat_map(move |(t, task)| {
                policy.check(task).into_iter().map(move |r| Problem {
                    path: format!("jobs[{i}].tasks[{t}].{}", r.path),
                    message: format!("{} (policy rule {})", r.message, r.rule),
                    span: None,
                })
            })
        })
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    let mut err = ApiError::new(
        StatusCode::FORBIDDEN,
        "policy_refused",
        format!(
            "the execution policy of namespace {namespace} refuses {} task setting(s) of this file",
            problems.len()
        ),
    );
    err.details = Some(problems);
    Err(err)
}

/// How long a node keeps a policy it read before reading it again: a
/// changed policy reaches every attempt that starts this long after.
pub const POLICY_CACHE: Duration = Duration::from_secs(2);

/// The engine's source of policies: the store, with what was read kept for
/// [`POLICY_CACHE`] (an attempt start costs no read most of the time).
pub struct StoredPolicies<S> {
    store: Arc<S>,
    cache: Mutex<HashMap<String, (Arc<ExecPolicy>, Instant)>>,
}

impl<S> StoredPolicies<S> {
    /// Policies read from `store`.
    pub fn new(store: Arc<S>) -> StoredPolicies<S> {
        StoredPolicies {
            store,
            cache: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Store> dagcron_runtime::Policies for StoredPolicies<S> {
    fn weight(&self, namespace: &str) -> u32 {
        self.cache
            .lock()
            .expect("policy cache")
            .get(namespace)
            .map_or(1, |(p, _)| p.weight)
    }

    fn policy<'a>(&'a self, namespace: &'a str) -> dagcron_runtime::PolicyLookup<'a> {
        Box::pin(async move {
            let now = Instant::now();
            if let Some((policy, at)) = self.cache.lock().expect("policy cache").get(namespace)
                && now.duration_since(*at) < POLICY_CACHE
            {
                return Ok(policy.clone());
            }
            let policy = Arc::new(policy_of(&*self.store, namespace).await?);
            let mut cache = self.cache.lock().expect("policy cache");
            // Namespaces come and go: a cache that grew large starts over.
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(namespace.to_string(), (policy.clone(), now));
            Ok(policy)
        })
    }
}
