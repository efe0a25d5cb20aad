//! `GET /api/v1/audit`: the audit log, a page at a time, with the hashes
//! that chain it (`dagcron audit verify` checks them).

use axum::Json;
use axum::extract::{Extension, Query, State};
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use serde::Deserialize;

use crate::auth::Principal;
use crate::wire::{AuditAnswer, AuditCheckpoint, AuditPage, Errors};
use crate::{ApiError, AppState};

/// Which rows.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// Rows after this position (default 0: from the first).
    #[param(minimum = 0)]
    after: Option<i64>,
    /// At most this many rows (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Only the rows of this namespace (a namespace admin sees only its own).
    namespace: Option<String>,
}

/// The audit log: every change and every refused call, oldest first. An
/// instance admin reads all of it; a namespace admin its namespace's rows.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit",
    params(AuditQuery),
    responses((status = 200, body = AuditPage), Errors))]
pub(crate) async fn list_audit<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Query(q): Query<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range: 1 to 1000"
        )));
    }
    let after = q.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::bad_request("after must not be negative"));
    }
    let namespace = q.namespace.or_else(|| who.grant.namespace.clone());
    who.allow(Need::Administer, namespace.as_deref(), || {
        ApiError::not_found("no such namespace")
    })?;
    let rows = st
        .store
        .list_audit(after, limit, namespace.as_deref())
        .await?;
    let next = (rows.len() == limit as usize)
        .then(|| rows.last().map(|r| r.seq))
        .flatten();
    let checkpoint = st.store.audit_checkpoint().await?;
    Ok(Json(AuditPage {
        items: rows.iter().map(AuditAnswer::from).collect(),
        next,
        checkpoint: checkpoint.as_ref().map(AuditCheckpoint::new),
    }))
}
