//! Degrading instead of collapsing: the read-only mode (stored in the
//! database, so that every node of a cluster obeys it), and pausing or
//! resuming every job of a namespace at once.
//!
//! While the instance is read-only, schedules keep firing and runs go on;
//! the calls that change what runs (applies, job edits and deletions,
//! manual triggers, backfills) are refused with `503` and code `read_only`.
//! Pausing, resuming and cancelling stay open: they are how an operator
//! calms things down.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::wire::{BulkPauseAnswer, Errors, ReadOnlyAnswer, ReadOnlyBody};
use crate::{ApiError, AppState};

/// The setting's key in the store.
pub(crate) const READ_ONLY: &str = "read_only";

/// The longest reason kept.
const MAX_REASON: usize = 500;

/// Jobs read from the store at a time.
const PAGE: u32 = 500;

/// The read-only mode as stored.
#[derive(Serialize, Deserialize)]
struct Stored {
    reason: String,
    since: Timestamp,
    by: String,
}

/// A JSON object read into `T` (serde would also read a struct from an
/// array of its fields, which the API does not accept).
pub(crate) fn object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if !value.is_object() {
        return Err("the body must be a JSON object".into());
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// The read-only mode now.
async fn read_only<S: Store>(st: &AppState<S>) -> Result<Option<Stored>, ApiError> {
    stored(st.store.get_setting(READ_ONLY).await?)
}

/// The read-only mode as stored (`None`: off).
fn stored(text: Option<String>) -> Result<Option<Stored>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the stored read-only setting does not read back: {e}"),
        )
    })
}

impl<S: Store> AppState<S> {
    /// While the instance is read-only, a sentence that says so, since
    /// when, by whom and why (none: changes go through).
    pub async fn read_only_notice(&self) -> Result<Option<String>, ApiError> {
        Ok(read_only(self).await?.map(|on| {
            format!(
                "This instance is read-only since {}, by {}: {}. Schedules keep firing; jobs cannot be changed or triggered.",
                on.since.strftime("%Y-%m-%d %H:%M:%S UTC"),
                on.by,
                on.reason
            )
        }))
    }
}

/// Refuses a change while the instance is read-only: `503 read_only`,
/// with the operator's reason.
pub(crate) async fn refuse_when_read_only<S: Store>(st: &AppState<S>) -> Result<(), ApiError> {
    refuse_if_read_only(st.store.get_setting(READ_ONLY).await?)
}

/// [`refuse_when_read_only`] with the setting read already (`text`, as
/// stored under [`READ_ONLY`]).
pub(crate) fn refuse_if_read_only(text: Option<String>) -> Result<(), ApiError> {
    match stored(text)? {
        None => Ok(()),
        Some(on) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "read_only",
            format!(
                "the instance is read-only (since {}, by {}): {}; schedules keep firing, but jobs cannot be changed or triggered until `dagcron admin read-only off`",
                on.since, on.by, on.reason
            ),
        )),
    }
}

fn answer(on: Option<Stored>) -> ReadOnlyAnswer {
    match on {
        None => ReadOnlyAnswer {
            read_only: false,
            reason: None,
            since: None,
            by: None,
        },
        Some(on) => ReadOnlyAnswer {
            read_only: true,
            reason: Some(on.reason),
            since: Some(on.since),
            by: Some(on.by),
        },
    }
}

/// Whether the instance is read-only, and why.
#[utoipa::path(get, path = "/api/v1/admin/read-only", tag = "admin",
    responses((status = 200, body = ReadOnlyAnswer), Errors))]
pub(crate) async fn get_read_only<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<ReadOnlyAnswer>, ApiError> {
    who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
    Ok(Json(answer(read_only(&st).await?)))
}

/// Turns the read-only mode on (with a reason) or off, for every node.
/// An instance admin's call.
#[utoipa::path(put, path = "/api/v1/admin/read-only", tag = "admin",
    request_body(content = ReadOnlyBody, content_type = "application/json"),
    responses((status = 200, body = ReadOnlyAnswer), Errors))]
pub(crate) async fn put_read_only<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    body: axum::body::Bytes,
) -> Result<Json<ReadOnlyAnswer>, ApiError> {
    who.allow(Need::Administer, None, || {
        ApiError::not_found("no such path")
    })?;
    let body: ReadOnlyBody = object(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"read_only\": true|false, \"reason\": \"...\"}}: {e}"
        ))
    })?;
    if !body.read_only {
        st.store
            .set_setting(READ_ONLY, None, Timestamp::now())
            .await?;
        return Ok(Json(answer(None)));
    }
    let reason = body.reason.unwrap_or_default().trim().to_string();
    if reason.chars().count() > MAX_REASON || reason.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "reason: at most {MAX_REASON} characters, none of them control characters"
        )));
    }
    let on = Stored {
        reason: if reason.is_empty() {
            "no reason given".into()
        } else {
            reason
        },
        since: Timestamp::now(),
        by: who.name.clone(),
    };
    let text = serde_json::to_string(&on).expect("the setting serializes");
    st.store
        .set_setting(READ_ONLY, Some(&text), on.since)
        .await?;
    Ok(Json(answer(Some(on))))
}

/// Pauses every job of a namespace (they do not fire until resumed).
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/pause", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = BulkPauseAnswer), Errors))]
pub(crate) async fn pause_all<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
) -> Result<Json<BulkPauseAnswer>, ApiError> {
    set_all_paused(&st, &who, &ns, true).await.map(Json)
}

/// Resumes every job of a namespace; each one's fires due while it was
/// paused follow its misfire policy.
#[utoipa::path(post, path = "/api/v1/namespaces/{ns}/resume", tag = "jobs",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = BulkPauseAnswer), Errors))]
pub(crate) async fn resume_all<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
) -> Result<Json<BulkPauseAnswer>, ApiError> {
    set_all_paused(&st, &who, &ns, false).await.map(Json)
}

/// Pauses or resumes the jobs of `ns` that are not so yet, a page at a
/// time, each through the engine (so that every node of a cluster follows).
async fn set_all_paused<S: Store>(
    st: &AppState<S>,
    who: &Principal,
    ns: &str,
    paused: bool,
) -> Result<BulkPauseAnswer, ApiError> {
    who.allow(Need::Operate, Some(ns), || {
        ApiError::not_found(format!("no namespace {ns}"))
    })?;
    let (mut changed, mut unchanged) = (0, 0);
    let mut cursor: Option<String> = None;
    loop {
        let page = st.store.list_jobs(ns, PAGE, cursor.as_deref()).await?;
        for job in &page.items {
            if job.paused == paused {
                unchanged += 1;
                continue;
            }
            match st.engine.pause(ns, &job.name, paused).await {
                Ok(()) => changed += 1,
                // Deleted meanwhile.
                Err(dagcron_runtime::EngineError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(BulkPauseAnswer { changed, unchanged });
        }
    }
}
