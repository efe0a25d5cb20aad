//! `POST /api/v1/hooks/{ns}/{job}`: a run started by a signed webhook
//! delivery (see `dagcron_core::hook`). No API token: the HMAC-SHA-256
//! signature of the body under the job's secret is the credential. Every
//! delivery, taken or refused, is recorded in the audit log.

use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use dagcron_core::Job;
use dagcron_core::hook::{self, WebhookTrigger};
use dagcron_runtime::TriggerBy;
use dagcron_store::Trigger;
use dagcron_store::prelude::*;
use hmac::{KeyInit, Mac};

use crate::wire::{Errors, HookAnswer};
use crate::{ApiError, AppState};

/// The headers a signature is read from, in order: dagcron's, GitHub's.
const SIGNATURE_HEADERS: [&str; 2] = ["x-dagcron-signature-256", "x-hub-signature-256"];

/// The headers a delivery id is read from, in order.
const DELIVERY_HEADERS: [&str; 3] = ["x-dagcron-delivery", "x-github-delivery", "idempotency-key"];

/// Starts a run of a job for a signed delivery. The body is signed with
/// HMAC-SHA-256 under the job's `webhook.secret`, sent as
/// `X-Dagcron-Signature-256: sha256=<hex>` (or GitHub's
/// `X-Hub-Signature-256`); a delivery id (`X-Dagcron-Delivery`,
/// `X-GitHub-Delivery` or `Idempotency-Key`) makes its run once. The run's
/// parameters are read from the JSON body by the job's `webhook.params`.
#[utoipa::path(post, path = "/api/v1/hooks/{ns}/{name}", tag = "runs",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Job")),
    request_body(content = String, content_type = "application/json", description = "The delivery, as the sender signed it"),
    responses(
        (status = 202, body = HookAnswer, description = "A run was made"),
        (status = 200, body = HookAnswer, description = "The delivery came before: its run"),
        Errors),
    security(()))]
pub(crate) async fn deliver<S: Store>(
    State(st): State<AppState<S>>,
    Path((ns, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let address = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.to_string());
    let path = request.uri().path().to_string();
    let (parts, body) = request.into_parts();
    let mut webhook_exists = false;
    let answer = take(&st, &ns, &name, &parts.headers, body, &mut webhook_exists).await;
    let status = match &answer {
        Ok((status, _)) => *status,
        Err(e) => e.error.status,
    };
    // Refused senders are limited per address, as failed sign-ins are:
    // past the allowance, answered `429` with no audit row.
    if status == StatusCode::UNAUTHORIZED
        && let Some(retry) = st.quota.auth_failed(address.as_deref())
    {
        let mut resp = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many refused deliveries from this address; try again later",
        )
        .into_response();
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(retry),
        );
        return resp;
    }
    // In the namespace's audit log only if the job takes deliveries: an
    // unknown sender writes nothing into a namespace of its choosing.
    crate::auth::audit(
        &st,
        None,
        format!("POST {}", crate::auth::bounded(&path)),
        webhook_exists.then(|| ns.clone()),
        status,
        address,
    )
    .await;
    match answer {
        Ok((status, body)) => (status, Json(body)).into_response(),
        Err(e) => {
            let retry = e.retry_after;
            let mut resp = e.error.into_response();
            if let Some(seconds) = retry {
                resp.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(seconds),
                );
            }
            resp
        }
    }
}

/// A refusal, with when to come back for one past the job's allowance.
struct Refused {
    error: ApiError,
    retry_after: Option<u64>,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Refused {
        Refused {
            error,
            retry_after: None,
        }
    }
}

async fn take<S: Store>(
    st: &AppState<S>,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    body: Body,
    webhook_exists: &mut bool,
) -> Result<(StatusCode, HookAnswer), Refused> {
    // The same answer for a job that does not exist, one that takes no
    // deliveries and a wrong signature: a sender learns nothing of the
    // namespace.
    let stored = st.store.get_job(ns, name).await.map_err(ApiError::from)?;
    let job = stored
        .as_ref()
        .and_then(|s| Job::from_canonical(&s.namespace, &s.spec).ok())
        .ok_or_else(bad_signature)?;
    let hook = job.spec.webhook.clone().ok_or_else(bad_signature)?;
    *webhook_exists = true;
    let body = axum::body::to_bytes(body, hook::MAX_BODY)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("a delivery's body is at most {} bytes", hook::MAX_BODY),
            )
        })?;
    check_signature(st, ns, &hook, headers, &body).await?;
    // Counted once signed: a sender without the secret cannot use up the
    // job's allowance.
    if let Err(wait) = st.quota.hook_allowed(ns, name, hook.per_minute()) {
        return Err(Refused {
            error: ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "{ns}/{name} takes at most {} deliveries a minute; try again in {wait} s",
                    hook.per_minute()
                ),
            ),
            retry_after: Some(wait),
        });
    }
    let delivery = delivery_id(headers)?;
    let params = if hook.params.is_empty() {
        Default::default()
    } else {
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "the job maps parameters from the body, which is not JSON: {e}"
            ))
        })?;
        hook.params_of(&value).map_err(ApiError::bad_request)?
    };
    let key = delivery.map(|d| format!("webhook:{d}"));
    if let Some(key) = &key
        && let Some(run) = st
            .store
            .run_of_key(ns, name, key)
            .await
            .map_err(ApiError::from)?
    {
        return Ok((
            StatusCode::OK,
            HookAnswer {
                run,
                duplicate: true,
            },
        ));
    }
    let by = TriggerBy {
        kind: Trigger::Webhook,
        key: key.clone(),
    };
    match st
        .engine
        .trigger_by(ns, name, params, by)
        .await
        .map_err(ApiError::from)?
    {
        Some(run) => Ok((
            StatusCode::ACCEPTED,
            HookAnswer {
                run,
                duplicate: false,
            },
        )),
        // The same delivery at the same moment: the other one made it.
        None => {
            let key = key.unwrap_or_default();
            let run = st
                .store
                .run_of_key(ns, name, &key)
                .await
                .map_err(ApiError::from)?
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::CONFLICT,
                        "duplicate",
                        "the delivery was taken already",
                    )
                })?;
            Ok((
                StatusCode::OK,
                HookAnswer {
                    run,
                    duplicate: true,
                },
            ))
        }
    }
}

/// Checks the body's signature under the job's secret; every failure is
/// the same `401` to the sender (the server's log says which).
async fn check_signature<S: Store>(
    st: &AppState<S>,
    ns: &str,
    hook: &WebhookTrigger,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), ApiError> {
    let refused = bad_signature;
    let Some(sent) = SIGNATURE_HEADERS
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok())
    else {
        return Err(refused());
    };
    let Some(sent) = sent.strip_prefix("sha256=").and_then(|h| hex(h.trim())) else {
        return Err(refused());
    };
    let name = &hook.secret.secret;
    let secret = match (&st.master_key, st.store.get_secret(ns, name).await?) {
        (Some(keys), Some(stored)) => keys.open(&stored).map_err(|e| {
            tracing::warn!(namespace = %ns, secret = %name, "a webhook's secret cannot be read: {e}");
            refused()
        })?,
        _ => {
            tracing::warn!(namespace = %ns, secret = %name, "a delivery came for a webhook whose secret is not set");
            return Err(refused());
        }
    };
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes any key");
    mac.update(body);
    // Compared in constant time.
    mac.verify_slice(&sent).map_err(|_| refused())
}

/// The refusal of a delivery that is not signed for a webhook of its job
/// (a job that does not exist or takes no deliveries answers the same).
fn bad_signature() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "bad_signature",
        format!(
            "the delivery is not signed for a webhook of this job: send {} as sha256=<hex of the HMAC-SHA-256 of the body under the job's webhook secret>",
            SIGNATURE_HEADERS[0]
        ),
    )
}

/// The delivery id, if the sender gave one.
fn delivery_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = DELIVERY_HEADERS.iter().find_map(|h| headers.get(*h)) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(id) if hook::valid_delivery_id(id) => Ok(Some(id.to_string())),
        _ => Err(ApiError::bad_request(format!(
            "a delivery id is 1 to {} printable ASCII characters",
            hook::MAX_DELIVERY_ID
        ))),
    }
}

/// The bytes of lowercase or uppercase hex text.
fn hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || text.len() > 128 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
