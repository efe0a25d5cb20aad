//! Retention: each namespace's policy (how long history is kept, and how
//! many runs of each job whatever their age), set by an instance admin
//! like the quotas and stored as a setting of the instance, so that the
//! pruner of every node reads it; and pruning on demand, or counting what
//! a pass would delete (`dry_run`). The pruning itself is the runtime's
//! (`dagcron_runtime::prune`), which also runs it beside the engine.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, Path, State};
use dagcron_core::Retention;
use dagcron_core::authz::Need;
use dagcron_core::retention::{MAX_AGE_SECONDS, MAX_KEEP_LAST, MIN_AGE_SECONDS};
use dagcron_runtime::prune::{policy_of, setting_key};
use dagcron_runtime::{PruneConfig, Pruner, SystemClock};
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::auth::Principal;
use crate::wire::{Errors, PruneAnswer, PruneBody, PrunedAnswer, RetentionAnswer, RetentionBody};
use crate::{ApiError, AppState};

async fn answer<S: Store>(st: &AppState<S>, ns: &str) -> Result<RetentionAnswer, ApiError> {
    let set = st.store.get_setting(&setting_key(ns)).await?.is_some();
    let policy = policy_of(&*st.store, ns).await?;
    Ok(RetentionAnswer {
        max_age_seconds: policy.max_age_seconds,
        keep_last: policy.keep_last,
        default: !set,
    })
}

/// A namespace's retention policy (the instance's default if none is set).
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/retention", tag = "admin",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = RetentionAnswer), Errors))]
pub(crate) async fn get_retention<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
) -> Result<Json<RetentionAnswer>, ApiError> {
    who.allow(Need::Read, Some(&ns), || {
        ApiError::not_found(format!("no namespace {ns}"))
    })?;
    Ok(Json(answer(&st, &ns).await?))
}

/// Sets a namespace's retention policy, or (`{}`) returns it to the
/// instance's default (an instance admin's call).
#[utoipa::path(put, path = "/api/v1/namespaces/{ns}/retention", tag = "admin",
    params(("ns" = String, Path, description = "Namespace")),
    request_body(content = RetentionBody, content_type = "application/json"),
    responses((status = 200, body = RetentionAnswer), Errors))]
pub(crate) async fn put_retention<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<RetentionAnswer>, ApiError> {
    crate::handlers::quotas::may_set(&who, &ns)?;
    let body: RetentionBody = crate::handlers::operations::object(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"max_age_seconds\", \"keep_last\"}} (both numbers), or {{}} for the default: {e}"
        ))
    })?;
    let value = match (body.max_age_seconds, body.keep_last) {
        (None, None) => None,
        (Some(max_age_seconds), Some(keep_last)) => {
            if !(MIN_AGE_SECONDS..=MAX_AGE_SECONDS).contains(&max_age_seconds) {
                return Err(ApiError::bad_request(format!(
                    "max_age_seconds is from {MIN_AGE_SECONDS} (an hour) to {MAX_AGE_SECONDS}"
                )));
            }
            if keep_last > MAX_KEEP_LAST {
                return Err(ApiError::bad_request(format!(
                    "keep_last is at most {MAX_KEEP_LAST}"
                )));
            }
            let policy = Retention {
                max_age_seconds,
                keep_last,
            };
            Some(serde_json::to_string(&policy).expect("a policy serializes"))
        }
        _ => {
            return Err(ApiError::bad_request(
                "give both max_age_seconds and keep_last, or neither for the default",
            ));
        }
    };
    st.store
        .set_setting(&setting_key(&ns), value.as_deref(), Timestamp::now())
        .await?;
    Ok(Json(answer(&st, &ns).await?))
}

/// Prunes every namespace (or one) by its policy now, in the pruner's
/// small batches, and answers what went; with `dry_run`, deletes nothing
/// and answers what would go (an instance admin's call).
#[utoipa::path(post, path = "/api/v1/admin/prune", tag = "admin",
    request_body(content = Option<PruneBody>, content_type = "application/json"),
    responses((status = 200, body = PruneAnswer), Errors))]
pub(crate) async fn prune<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    body: axum::body::Bytes,
) -> Result<Json<PruneAnswer>, ApiError> {
    who.allow(Need::Administer, None, || {
        ApiError::not_found("no such path")
    })?;
    let body: PruneBody = if body.iter().all(u8::is_ascii_whitespace) {
        PruneBody::default()
    } else {
        crate::handlers::operations::object(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "expected {{\"dry_run\": bool, \"namespace\": string}} (both optional): {e}"
            ))
        })?
    };
    if let Some(ns) = &body.namespace {
        if !dagcron_core::model::valid_name(ns) {
            return Err(ApiError::bad_request(format!(
                "{ns:?} is not a namespace name"
            )));
        }
    }
    let pruner = Pruner::new(
        st.store.clone(),
        Arc::new(SystemClock),
        PruneConfig::default(),
        st.pruned.clone(),
    );
    let report = pruner
        .pass_now(body.namespace.as_deref(), body.dry_run)
        .await?;
    Ok(Json(PruneAnswer {
        dry_run: body.dry_run,
        namespaces: report
            .namespaces
            .into_iter()
            .map(|(namespace, p)| PrunedAnswer {
                namespace,
                runs: p.runs,
                attempts: p.attempts,
                fires: p.fires,
                jobs: p.jobs,
            })
            .collect(),
    }))
}
