//! `GET /api/v1/audit`: the audit log, a page at a time, with the hashes
//! that chain it (`dagcron audit verify` checks them).

use axum::Json;
use axum::extract::{Extension, Query, State};
use dagcron_core::authz::Need;
use dagcron_store::{AuditEntry, Store};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::wire::Errors;
use crate::{ApiError, AppState};

/// One row of the audit log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditAnswer {
    /// Position in the log, from 1.
    pub seq: i64,
    /// When.
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    /// The token's id (none: the call had no valid token).
    pub principal: Option<String>,
    /// The token's name.
    pub principal_name: Option<String>,
    /// Method and path.
    pub action: String,
    /// The namespace the path names, if any.
    pub namespace: Option<String>,
    /// The answer's HTTP status.
    pub outcome: u16,
    /// Where the call came from.
    pub address: Option<String>,
    /// The hash of the row before, in hex.
    pub prev_hash: String,
    /// This row's hash, in hex.
    pub hash: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl From<&AuditEntry> for AuditAnswer {
    fn from(e: &AuditEntry) -> AuditAnswer {
        AuditAnswer {
            seq: e.seq,
            at: e.at,
            principal: e.principal.clone(),
            principal_name: e.principal_name.clone(),
            action: e.action.clone(),
            namespace: e.namespace.clone(),
            outcome: e.outcome,
            address: e.address.clone(),
            prev_hash: hex(&e.prev_hash),
            hash: hex(&e.hash),
        }
    }
}

impl AuditAnswer {
    /// The stored row this answer shows (to verify the chain); `None` if a
    /// hash is not hex.
    pub fn entry(&self) -> Option<AuditEntry> {
        Some(AuditEntry {
            seq: self.seq,
            at: self.at,
            principal: self.principal.clone(),
            principal_name: self.principal_name.clone(),
            action: self.action.clone(),
            namespace: self.namespace.clone(),
            outcome: self.outcome,
            address: self.address.clone(),
            prev_hash: unhex(&self.prev_hash)?,
            hash: unhex(&self.hash)?,
        })
    }
}

/// A page of the audit log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// Oldest first.
    pub items: Vec<AuditAnswer>,
    /// Pass as `after` for the next page; none on the last one.
    pub next: Option<i64>,
}

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
    Ok(Json(AuditPage {
        items: rows.iter().map(AuditAnswer::from).collect(),
        next,
    }))
}
