//! Authentication: API tokens, their keyed hashes, and the layer that turns
//! `Authorization: Bearer <token>` into the [`Principal`] every handler
//! checks with [`Principal::allow`].
//!
//! A token is 256 random bits, written `dgc_` and 43 characters of
//! URL-safe base64, shown once when it is made. The store keeps only
//! HMAC-SHA-256 of it under the server's key (a file of 32 random bytes),
//! so neither the store nor a listing of tokens holds anything that
//! authenticates.

use std::path::Path;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use dagcron_core::authz::{Decision, Grant, Need, Role};
use dagcron_store::TokenRecord;
use dagcron_store::prelude::*;
use hmac::{KeyInit, Mac};
use jiff::Timestamp;

use crate::{ApiError, AppState};

/// What every token starts with.
pub const TOKEN_PREFIX: &str = "dgc_";

/// The server's key for hashing tokens.
#[derive(Clone)]
pub struct Keyring([u8; 32]);

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(..)")
    }
}

/// Random bytes from the operating system.
fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes
}

impl Keyring {
    /// A key from 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Keyring {
        Keyring(bytes)
    }

    /// Reads the key file at `path` (32 bytes).
    pub fn load(path: &Path) -> std::io::Result<Keyring> {
        read_key(path).map(Keyring)
    }

    /// Reads the key file at `path`, or creates it (mode 0600) with a new
    /// random key if there is none. Returns the key and whether it is new.
    pub fn load_or_create(path: &Path) -> std::io::Result<(Keyring, bool)> {
        read_or_create_key(path).map(|(k, new)| (Keyring(k), new))
    }

    /// The keyed hash of a token's secret, as stored.
    pub fn hash(&self, secret: &str) -> Vec<u8> {
        let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC takes a key of any length");
        mac.update(secret.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

/// Reads a key file of 32 bytes.
pub(crate) fn read_key(path: &Path) -> std::io::Result<[u8; 32]> {
    let bytes = std::fs::read(path)?;
    bytes.as_slice().try_into().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} holds {} bytes; a key is 32",
                path.display(),
                bytes.len()
            ),
        )
    })
}

/// Reads a key file, or creates it (0600) with 32 random bytes if there is
/// none. Returns the key and whether it is new.
pub(crate) fn read_or_create_key(path: &Path) -> std::io::Result<([u8; 32], bool)> {
    match read_key(path) {
        Ok(k) => Ok((k, false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = random::<32>();
            write_private(path, &key)?;
            Ok((key, true))
        }
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to a new file only its owner can read (0600); an
/// existing file is an error, so that nothing is silently replaced.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// A new token: its record (to store with [`Keyring::hash`] of the secret)
/// and the secret, to show once.
pub fn new_token(
    name: &str,
    grant: &Grant,
    expires_at: Option<Timestamp>,
    created_by: Option<String>,
    now: Timestamp,
) -> (TokenRecord, String) {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let secret = format!("{TOKEN_PREFIX}{}", b64.encode(random::<32>()));
    let id: String = random::<6>().iter().map(|b| format!("{b:02x}")).collect();
    let record = TokenRecord {
        id: format!("tok_{id}"),
        name: name.to_string(),
        role: grant.role.as_str().to_string(),
        namespace: grant.namespace.clone(),
        created_at: now,
        expires_at,
        last_used_at: None,
        revoked_at: None,
        created_by,
        labels: None,
    };
    (record, secret)
}

/// The first token of an instance: an instance admin, made at bootstrap.
pub fn instance_admin_token(now: Timestamp) -> (TokenRecord, String) {
    let grant = Grant {
        role: Role::Admin,
        namespace: None,
    };
    new_token("admin (bootstrap)", &grant, None, None, now)
}

/// Who is calling: the token that authenticated the request.
#[derive(Clone, Debug)]
pub struct Principal {
    /// The token's id.
    pub token_id: String,
    /// The token's name.
    pub name: String,
    /// What it may do.
    pub grant: Grant,
}

impl Principal {
    /// Checks that the caller may do `need` on an object of `namespace`
    /// (none: of the instance). An object of another namespace than a
    /// scoped token's is answered with `hidden()`, the very answer a missing
    /// object gets, so that the token learns nothing of it.
    pub fn allow(
        &self,
        need: Need,
        namespace: Option<&str>,
        hidden: impl FnOnce() -> ApiError,
    ) -> Result<(), ApiError> {
        match self.grant.decide(need, namespace) {
            Decision::Allow => Ok(()),
            Decision::Hidden => Err(hidden()),
            Decision::Forbidden => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "token {} ({} {}) may not do this: it needs the {} role{}",
                    self.token_id,
                    self.grant.role,
                    match &self.grant.namespace {
                        Some(ns) => format!("in namespace {ns}"),
                        None => "over the instance".into(),
                    },
                    need.role(),
                    match namespace {
                        Some(ns) => format!(" in namespace {ns}"),
                        None => " over the whole instance".into(),
                    }
                ),
            )),
        }
    }
}

impl Principal {
    /// Who it is, as a version of a job records it.
    pub fn actor(&self) -> dagcron_store::Actor {
        dagcron_store::Actor {
            id: self.token_id.clone(),
            name: self.name.clone(),
        }
    }

    /// For a listing of `namespace`: `Ok(true)` to list it, `Ok(false)` to
    /// answer an empty list (another namespace than a scoped token's, so
    /// that it learns nothing of it), `403` for a role too weak.
    pub fn lists(&self, need: Need, namespace: &str) -> Result<bool, ApiError> {
        match self.grant.decide(need, Some(namespace)) {
            Decision::Hidden => Ok(false),
            _ => self
                .allow(need, Some(namespace), || ApiError::not_found(""))
                .map(|()| true),
        }
    }
}

/// Paths anyone may reach: liveness, the API's description, and the
/// webhooks (their deliveries are signed instead, and audited by their
/// handler).
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/api/v1/openapi.json")
        || path.starts_with("/api/v1/hooks/")
}

/// A token whose last use is older than this is noted as used again.
const TOUCH_EVERY: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

fn unauthenticated(message: &str) -> Response {
    let mut resp =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", message).into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    resp
}

/// The namespace a change concerned, for the audit log, set by a handler
/// whose path does not name it (an apply, a cancel of a run).
#[derive(Clone, Debug)]
pub(crate) struct AuditNamespace(pub(crate) String);

/// The namespace a path names (`/api/v1/namespaces/{ns}/...`), if any.
fn namespace_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    Some(rest.split('/').next()?.to_string()).filter(|ns| !ns.is_empty())
}

/// Records a call in the audit log; a failure to record is logged, and
/// does not change the answer.
pub(crate) async fn audit<S: Store>(
    st: &AppState<S>,
    who: Option<&Principal>,
    action: String,
    namespace: Option<String>,
    outcome: StatusCode,
    address: Option<String>,
) {
    let entry = dagcron_store::AuditEntry {
        seq: 0,
        at: Timestamp::now(),
        principal: who.map(|p| p.token_id.clone()),
        principal_name: who.map(|p| p.name.clone()),
        action,
        namespace,
        outcome: outcome.as_u16(),
        address,
        prev_hash: vec![],
        hash: vec![],
    };
    if let Err(e) = st.store.append_audit(entry).await {
        tracing::warn!("cannot record a call in the audit log: {e}");
    }
}

/// The authentication layer: every request but the public ones carries a
/// valid token, or is answered `401`. Every change (any method but `GET`)
/// and every refused call is recorded in the audit log.
pub(crate) async fn authenticate<S: Store>(
    State(st): State<AppState<S>>,
    req: Request,
    next: Next,
) -> Response {
    if is_public(req.uri().path()) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let action = format!("{} {}", req.method(), bounded(&path));
    let changes = !matches!(
        req.method(),
        &axum::http::Method::GET | &axum::http::Method::HEAD
    );
    let address = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.to_string());
    let (principal, resp) = authenticated(&st, req, next).await;
    let status = resp.status();
    if status == StatusCode::UNAUTHORIZED
        && let Some(retry) = st.quota.auth_failed(address.as_deref())
    {
        // Past its allowance of failures, a client gets a cheap answer
        // and no audit row.
        return too_many_failures(retry);
    }
    if changes || status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        // The namespace of the row is one the caller may name: a refused
        // caller does not write rows into another tenant's audit.
        let namespace = resp
            .extensions()
            .get::<AuditNamespace>()
            .map(|n| n.0.clone())
            .or_else(|| namespace_of(&path))
            .filter(|ns| {
                principal
                    .as_ref()
                    .is_some_and(|p| p.grant.namespace.as_ref().is_none_or(|own| own == ns))
            });
        audit(&st, principal.as_ref(), action, namespace, status, address).await;
    }
    resp
}

/// Records a refused sign-in of the web UI in the audit log, as a refused
/// API call is; counted against the address's allowance of failures like
/// one: `Some(seconds to wait)` when the address is past it (no row then).
pub async fn refused_signin<S: Store>(st: &AppState<S>, address: Option<String>) -> Option<u64> {
    if let Some(retry) = st.quota.auth_failed(address.as_deref()) {
        return Some(retry);
    }
    audit(
        st,
        None,
        "POST /signin".into(),
        None,
        StatusCode::UNAUTHORIZED,
        address,
    )
    .await;
    None
}

/// The longest path an audit row keeps, in bytes; a longer one is cut,
/// with a marker.
pub const MAX_AUDITED_PATH: usize = 512;

/// `path`, cut to [`MAX_AUDITED_PATH`] bytes (on a character boundary).
pub(crate) fn bounded(path: &str) -> String {
    if path.len() <= MAX_AUDITED_PATH {
        return path.to_string();
    }
    let mut end = MAX_AUDITED_PATH;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[{} more bytes]", &path[..end], path.len() - end)
}

/// The answer to a client past its allowance of failed authentications.
fn too_many_failures(retry: u64) -> Response {
    let mut resp = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("too many failed authentications from this address: try again in {retry} s"),
    )
    .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from(retry));
    resp
}

/// Checks the token, then answers: the principal (if the token was valid)
/// and the answer.
async fn authenticated<S: Store>(
    st: &AppState<S>,
    mut req: Request,
    next: Next,
) -> (Option<Principal>, Response) {
    let Some(secret) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
    else {
        return (
            None,
            unauthenticated(
                "this call needs a token: `Authorization: Bearer dgc_...` (the CLI reads --token, DAGCRON_TOKEN, or the admin.token file of a local server's data directory)",
            ),
        );
    };
    let principal = match principal_of(st, secret).await {
        Ok(p) => p,
        Err(TokenRefused::Unauthenticated(message)) => return (None, unauthenticated(&message)),
        Err(TokenRefused::Store(e)) => return (None, e.into_response()),
    };
    req.extensions_mut().insert(principal.clone());
    (Some(principal), next.run(req).await)
}

/// Why a token does not authenticate.
#[derive(Debug)]
pub enum TokenRefused {
    /// Not a token, unknown, revoked, expired: the message says which.
    Unauthenticated(String),
    /// The store could not be asked.
    Store(ApiError),
}

/// The principal a token's secret authenticates: the one check of a token
/// (its keyed hash known, not revoked, not expired, a known role), for the
/// API's bearer tokens and the web UI's sessions alike.
pub async fn principal_of<S: Store>(
    st: &AppState<S>,
    secret: &str,
) -> Result<Principal, TokenRefused> {
    if !secret.starts_with(TOKEN_PREFIX) || secret.len() > 128 {
        return Err(TokenRefused::Unauthenticated("not a dagcron token".into()));
    }
    let token = match st.store.find_token(&st.keyring.hash(secret)).await {
        Ok(Some(t)) => t,
        Ok(None) => return Err(TokenRefused::Unauthenticated("unknown token".into())),
        Err(e) => return Err(TokenRefused::Store(ApiError::from(e))),
    };
    let now = Timestamp::now();
    if token.revoked_at.is_some() {
        return Err(TokenRefused::Unauthenticated(format!(
            "token {} was revoked",
            token.id
        )));
    }
    if token.expires_at.is_some_and(|e| e <= now) {
        return Err(TokenRefused::Unauthenticated(format!(
            "token {} has expired",
            token.id
        )));
    }
    let Ok(role) = token.role.parse::<Role>() else {
        return Err(TokenRefused::Unauthenticated(format!(
            "token {} has an unknown role",
            token.id
        )));
    };
    if token
        .last_used_at
        .is_none_or(|t| now.duration_since(t) > TOUCH_EVERY)
    {
        // Best effort: a failure to note the use does not refuse the call.
        let _ = st.store.token_used(&token.id, now).await;
    }
    Ok(Principal {
        token_id: token.id,
        name: token.name,
        grant: Grant {
            role,
            namespace: token.namespace,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_prefixed_and_hashed_under_the_key() {
        let grant = Grant {
            role: Role::Viewer,
            namespace: None,
        };
        let now = Timestamp::UNIX_EPOCH;
        let (a, secret_a) = new_token("a", &grant, None, None, now);
        let (b, secret_b) = new_token("b", &grant, None, None, now);
        assert!(
            secret_a.starts_with("dgc_") && secret_a.len() == 4 + 43,
            "{secret_a}"
        );
        assert_ne!(secret_a, secret_b);
        assert_ne!(a.id, b.id);
        let one = Keyring::from_bytes([1; 32]);
        let two = Keyring::from_bytes([2; 32]);
        assert_eq!(one.hash(&secret_a), one.hash(&secret_a));
        assert_ne!(one.hash(&secret_a), two.hash(&secret_a));
        assert_eq!(one.hash(&secret_a).len(), 32);
    }

    #[test]
    fn key_files_are_private_and_never_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.key");
        let (first, created) = Keyring::load_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, created) = Keyring::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(first.hash("x"), again.hash("x"));
        assert!(write_private(&path, b"other").is_err());
        std::fs::write(&path, b"short").unwrap();
        assert!(Keyring::load(&path).is_err());
    }
}
