//! `GET /api/v1/namespaces/{ns}/notifications`: the outbox of a namespace,
//! newest first, and one notification with its delivery attempts.

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use serde::Deserialize;

use crate::auth::Principal;
use crate::routes::no_namespace;
use crate::wire::{DeliveryAnswer, Errors, NotificationAnswer, NotificationPage};
use crate::{ApiError, AppState};

/// Which notifications.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct NotificationQuery {
    /// Only those given up (`true`).
    failed: Option<bool>,
    /// Those older than this id (the `next` of the page before).
    #[param(minimum = 1)]
    before: Option<i64>,
    /// At most this many (1 to 500, default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// A namespace's notifications, newest first: where each went, where it
/// stands, its attempts and its last error.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/notifications", tag = "notifications",
    params(("ns" = String, Path, description = "Namespace"), NotificationQuery),
    responses((status = 200, body = NotificationPage), Errors))]
pub(crate) async fn list_notifications<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(ns): Path<String>,
    Query(q): Query<NotificationQuery>,
) -> Result<Json<NotificationPage>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_namespace(&ns))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range: 1 to 500"
        )));
    }
    if q.before.is_some_and(|b| b < 1) {
        return Err(ApiError::bad_request("before must be at least 1"));
    }
    let rows = st
        .store
        .list_notifications(&ns, q.failed.unwrap_or(false), q.before, limit)
        .await?;
    let next = (rows.len() == limit as usize)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    Ok(Json(NotificationPage {
        items: rows.iter().map(NotificationAnswer::from).collect(),
        next,
    }))
}

/// One notification of a namespace, with each of its delivery attempts.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/notifications/{id}", tag = "notifications",
    params(("ns" = String, Path, description = "Namespace"), ("id" = i64, Path, description = "Notification")),
    responses((status = 200, body = NotificationAnswer), Errors))]
pub(crate) async fn get_notification<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path((ns, id)): Path<(String, i64)>,
) -> Result<Json<NotificationAnswer>, ApiError> {
    who.allow(Need::Read, Some(&ns), no_namespace(&ns))?;
    let missing = || ApiError::not_found(format!("no notification {id} in namespace {ns}"));
    if id < 1 || id == i64::MAX {
        return Err(missing());
    }
    // The page that starts just after it holds it, if it is this namespace's.
    let found = st
        .store
        .list_notifications(&ns, false, Some(id + 1), 1)
        .await?
        .into_iter()
        .find(|n| n.id == id)
        .ok_or_else(missing)?;
    let mut answer = NotificationAnswer::from(&found);
    answer.deliveries = Some(
        st.store
            .delivery_attempts(id)
            .await?
            .iter()
            .map(DeliveryAnswer::from)
            .collect(),
    );
    Ok(Json(answer))
}
