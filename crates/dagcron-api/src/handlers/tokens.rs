//! `/api/v1/tokens`: creating, listing and revoking API tokens. A token's
//! secret is answered once, when it is created; nothing else ever shows it.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use dagcron_core::authz::{Grant, Need, Role};
use dagcron_store::TokenRecord;
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::auth::{Principal, new_token};
use crate::wire::{CreatedToken, Errors, NewTokenBody, TokenAnswer, TokenList};
use crate::{ApiError, AppState};

fn grant_of(t: &TokenRecord) -> Option<Grant> {
    Some(Grant {
        role: t.role.parse().ok()?,
        namespace: t.namespace.clone(),
    })
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
}

/// Creates a token with at most the caller's authority (an admin's, over
/// the new token's namespace).
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens",
    request_body(content = NewTokenBody, content_type = "application/json"),
    responses((status = 201, body = CreatedToken), Errors))]
pub(crate) async fn create_token<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: NewTokenBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"name\", \"role\", \"namespace\"?, \"expires_in\"?}}: {e}"
        ))
    })?;
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "a token's name is 1 to 100 characters, none of them control characters",
        ));
    }
    let role: Role = body.role.parse().map_err(ApiError::bad_request)?;
    if body.labels.is_some() && role != Role::Agent {
        return Err(ApiError::bad_request(
            "labels limit what an agent may claim: only a token with the agent role has them",
        ));
    }
    if let Some(ns) = &body.namespace {
        if !dagcron_core::model::valid_name(ns) {
            return Err(ApiError::bad_request(format!("invalid namespace {ns:?}")));
        }
    }
    let now = Timestamp::now();
    let expires_at = match &body.expires_in {
        None => None,
        Some(text) => {
            let d = dagcron_core::Dur::parse(text).map_err(ApiError::bad_request)?;
            let d = jiff::SignedDuration::try_from(d.0)
                .ok()
                .filter(|d| d.is_positive())
                .ok_or_else(|| ApiError::bad_request("expires_in must be positive"))?;
            Some(now.checked_add(d).map_err(|_| {
                ApiError::bad_request(format!("expires_in {text} is too far in the future"))
            })?)
        }
    };
    let grant = Grant {
        role,
        namespace: body.namespace.clone(),
    };
    if !who.grant.may_grant(&grant) {
        return Err(forbidden(format!(
            "token {} ({} {}) may not create a {} token {}: a token gets at most its creator's authority, and only an admin creates tokens",
            who.token_id,
            who.grant.role,
            who.grant
                .namespace
                .as_deref()
                .map_or("over the instance".to_string(), |n| format!(
                    "in namespace {n}"
                )),
            grant.role,
            grant
                .namespace
                .as_deref()
                .map_or("over the instance".to_string(), |n| format!(
                    "in namespace {n}"
                )),
        )));
    }
    let (mut record, secret) = new_token(name, &grant, expires_at, Some(who.token_id.clone()), now);
    record.labels = body.labels;
    st.store
        .create_token(&record, &st.keyring.hash(&secret))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token: secret,
            details: TokenAnswer::from(&record),
        }),
    ))
}

/// The tokens the caller administers: every token for an instance admin,
/// those of its namespace for a namespace admin.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens",
    responses((status = 200, body = TokenList), Errors))]
pub(crate) async fn list_tokens<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<TokenList>, ApiError> {
    let ns = who.grant.namespace.clone();
    who.allow(Need::Administer, ns.as_deref(), || {
        ApiError::not_found("no such path")
    })?;
    let items = st
        .store
        .list_tokens()
        .await?
        .iter()
        .filter(|t| grant_of(t).is_some_and(|g| who.grant.may_grant(&g)))
        .map(TokenAnswer::from)
        .collect();
    Ok(Json(TokenList { items }))
}

/// Revokes a token the caller administers; it is refused from then on.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens",
    params(("id" = String, Path, description = "Token id")),
    responses((status = 204, description = "Revoked"), Errors))]
pub(crate) async fn revoke_token<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if who.grant.role != Role::Admin {
        return Err(forbidden(format!(
            "token {} ({}) may not revoke tokens: only an admin does",
            who.token_id, who.grant.role
        )));
    }
    let missing = || ApiError::not_found(format!("no token {id}"));
    let token = st
        .store
        .list_tokens()
        .await?
        .into_iter()
        .find(|t| t.id == id && t.revoked_at.is_none())
        .ok_or_else(missing)?;
    let grant = grant_of(&token).ok_or_else(missing)?;
    if !who.grant.may_grant(&grant) {
        // A token of another namespace is not the caller's to know of.
        return Err(match (&who.grant.namespace, &grant.namespace) {
            (Some(mine), theirs) if Some(mine) != theirs.as_ref() => missing(),
            _ => forbidden(format!("token {} may not revoke {id}", who.token_id)),
        });
    }
    st.store.revoke_token(&id, Timestamp::now()).await?;
    Ok(StatusCode::NO_CONTENT)
}
