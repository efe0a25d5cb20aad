//! Secrets: encrypted at rest with AES-256-GCM under the master key, given
//! to the attempts that refer to them, never answered by the API.
//!
//! Each ciphertext is stored with the id of the key that made it and its
//! own random nonce; the namespace, the name and the version are bound to it
//! as associated data, so a ciphertext copied to another secret's row does
//! not decrypt.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::StatusCode;
use dagcron_core::authz::Need;
use dagcron_store::SecretRecord;
use dagcron_store::prelude::*;
use jiff::Timestamp;
use sha2::Digest;

use crate::auth::{Principal, write_private};
use crate::wire::{Errors, KeyUse, KeysAnswer, SecretAnswer, SecretBody, SecretList};
use crate::{ApiError, AppState};

/// The largest secret value, in bytes.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// The master key secrets are encrypted under.
pub struct MasterKey {
    id: String,
    key: [u8; 32],
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey({})", self.id)
    }
}

fn associated_data(namespace: &str, name: &str, version: i64) -> Vec<u8> {
    format!("dagcron secret\0{namespace}\0{name}\0{version}").into_bytes()
}

impl MasterKey {
    /// A key from 32 bytes; its id is derived from it.
    pub fn from_bytes(key: [u8; 32]) -> MasterKey {
        let digest = sha2::Sha256::digest(key);
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        MasterKey { id, key }
    }

    /// The key's id, stored with every ciphertext it makes.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Reads the key file at `path` (32 bytes).
    pub fn load(path: &Path) -> std::io::Result<MasterKey> {
        crate::auth::read_key(path).map(MasterKey::from_bytes)
    }

    /// Reads the key file, or creates it (0600) with a new random key.
    /// Returns the key and whether it is new.
    pub fn load_or_create(path: &Path) -> std::io::Result<(MasterKey, bool)> {
        crate::auth::read_or_create_key(path).map(|(k, new)| (MasterKey::from_bytes(k), new))
    }

    fn cipher(&self) -> aes_gcm::Aes256Gcm {
        aes_gcm::Aes256Gcm::new_from_slice(&self.key).expect("a 32-byte key")
    }

    /// Encrypts `value` as version `version` of `namespace/name`.
    pub fn seal(
        &self,
        namespace: &str,
        name: &str,
        version: i64,
        value: &str,
        now: Timestamp,
    ) -> SecretRecord {
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).expect("the operating system's random source");
        let aad = associated_data(namespace, name, version);
        let ciphertext = self
            .cipher()
            .encrypt(
                &aes_gcm::Nonce::from(nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: &aad,
                },
            )
            .expect("encryption does not fail");
        SecretRecord {
            namespace: namespace.into(),
            name: name.into(),
            version,
            key_id: self.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
            updated_at: now,
        }
    }

    /// Decrypts a stored secret; an error says why it cannot be.
    pub fn open(&self, s: &SecretRecord) -> Result<String, String> {
        if s.key_id != self.id {
            return Err(format!(
                "secret {} was encrypted with key {}, which this server does not have (its key is {})",
                s.name, s.key_id, self.id
            ));
        }
        let nonce: [u8; 12] = s
            .nonce
            .as_slice()
            .try_into()
            .map_err(|_| format!("secret {} has a malformed nonce", s.name))?;
        let aad = associated_data(&s.namespace, &s.name, s.version);
        let plain = self
            .cipher()
            .decrypt(
                &aes_gcm::Nonce::from(nonce),
                Payload {
                    msg: &s.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| {
                format!(
                    "secret {} does not decrypt: it was changed or moved",
                    s.name
                )
            })?;
        String::from_utf8(plain).map_err(|_| format!("secret {} is not UTF-8", s.name))
    }
}

/// Where an embedded server keeps its master keys: the current one, and
/// the older ones while secrets still use them.
#[derive(Clone, Debug)]
pub struct KeyFiles {
    /// The current key.
    pub current: std::path::PathBuf,
    /// A folder of older keys, one `<id>.key` each.
    pub old: std::path::PathBuf,
}

/// The master keys: the current one, which encrypts, and older ones kept
/// only to decrypt what they encrypted.
#[derive(Debug)]
pub struct KeySet {
    keys: std::sync::RwLock<(Arc<MasterKey>, Vec<Arc<MasterKey>>)>,
    /// Set for an embedded server, which may make a new key itself.
    files: Option<KeyFiles>,
}

impl KeySet {
    /// The current key and older ones; `files` where they live, if the
    /// server may rotate them itself.
    pub fn new(current: MasterKey, old: Vec<MasterKey>, files: Option<KeyFiles>) -> KeySet {
        KeySet {
            keys: std::sync::RwLock::new((
                Arc::new(current),
                old.into_iter().map(Arc::new).collect(),
            )),
            files,
        }
    }

    /// The current key (of a server with one key file: that one).
    pub fn one(key: MasterKey) -> KeySet {
        KeySet::new(key, vec![], None)
    }

    /// Reads an embedded server's keys: the current file and the folder of
    /// older ones.
    pub fn load_files(files: KeyFiles, current: MasterKey) -> std::io::Result<KeySet> {
        let mut old = Vec::new();
        if let Ok(dir) = std::fs::read_dir(&files.old) {
            for entry in dir.flatten() {
                if entry.path().extension().is_some_and(|e| e == "key") {
                    old.push(MasterKey::load(&entry.path())?);
                }
            }
        }
        Ok(KeySet::new(current, old, Some(files)))
    }

    /// The key that encrypts.
    pub fn current(&self) -> Arc<MasterKey> {
        self.keys.read().expect("keys lock").0.clone()
    }

    /// Decrypts a stored secret with the key it names.
    pub fn open(&self, s: &SecretRecord) -> Result<String, String> {
        let keys = self.keys.read().expect("keys lock");
        std::iter::once(&keys.0)
            .chain(&keys.1)
            .find(|k| k.id == s.key_id)
            .unwrap_or(&keys.0)
            .open(s)
    }

    /// Makes a new current key (an embedded server's files: the old current
    /// key moves to the folder of older keys); the old ones still decrypt.
    fn rotate(&self) -> Result<Arc<MasterKey>, String> {
        let files = self.files.as_ref().ok_or(
            "this server does not make keys itself: give every node the new key with --master-key-file and the old one with --old-master-key-file, then rotate again to re-encrypt",
        )?;
        let mut keys = self.keys.write().expect("keys lock");
        let old = keys.0.clone();
        let io = |e: std::io::Error| format!("writing the keys: {e}");
        std::fs::create_dir_all(&files.old).map_err(io)?;
        let kept = files.old.join(format!("{}.key", old.id));
        if !kept.exists() {
            write_private(&kept, &old.key).map_err(io)?;
        }
        let mut new = [0u8; 32];
        getrandom::fill(&mut new).expect("the operating system's random source");
        let fresh = files.current.with_extension("new");
        let _ = std::fs::remove_file(&fresh);
        write_private(&fresh, &new).map_err(io)?;
        std::fs::rename(&fresh, &files.current).map_err(io)?;
        let new = Arc::new(MasterKey::from_bytes(new));
        keys.1.push(old);
        keys.0 = new.clone();
        Ok(new)
    }

    /// Forgets (and, for an embedded server, deletes the files of) the older
    /// keys no stored secret uses any more.
    fn retire(&self, used: &BTreeSet<String>) {
        let mut keys = self.keys.write().expect("keys lock");
        keys.1.retain(|k| {
            let keep = used.contains(&k.id);
            if !keep {
                if let Some(files) = &self.files {
                    let _ = std::fs::remove_file(files.old.join(format!("{}.key", k.id)));
                }
            }
            keep
        });
    }

    /// The ids of the current key and of the older ones.
    pub fn ids(&self) -> (String, Vec<String>) {
        let keys = self.keys.read().expect("keys lock");
        (
            keys.0.id.clone(),
            keys.1.iter().map(|k| k.id.clone()).collect(),
        )
    }
}

/// Re-encrypts every secret not under the current key, then retires the
/// older keys nothing uses. Returns how many it re-encrypted.
pub async fn reencrypt<S: Store>(store: &S, keys: &KeySet) -> Result<usize, String> {
    let current = keys.current();
    let mut done = 0;
    for s in store.list_all_secrets().await.map_err(|e| e.to_string())? {
        if s.key_id == current.id {
            continue;
        }
        let value = keys.open(&s)?;
        let again = current.seal(&s.namespace, &s.name, s.version, &value, s.updated_at);
        store.put_secret(&again).await.map_err(|e| e.to_string())?;
        done += 1;
    }
    let used: BTreeSet<String> = store
        .list_all_secrets()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|s| s.key_id)
        .collect();
    keys.retire(&used);
    Ok(done)
}

/// The engine's source of secret values: the store, decrypted with the
/// master keys.
pub struct StoredSecrets<S> {
    /// Where they are.
    pub store: Arc<S>,
    /// The keys (none: this server has none, and no secret can be given).
    pub key: Option<Arc<KeySet>>,
}

impl<S: Store> dagcron_runtime::Secrets for StoredSecrets<S> {
    fn resolve<'a>(
        &'a self,
        namespace: &'a str,
        names: &'a BTreeSet<String>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<BTreeMap<String, String>, String>> + Send + 'a>>
    {
        Box::pin(async move {
            let key = self.key.as_ref().ok_or_else(|| {
                "the task refers to secrets, and this server has no master key (--master-key-file)"
                    .to_string()
            })?;
            let mut out = BTreeMap::new();
            for name in names {
                let stored = self
                    .store
                    .get_secret(namespace, name)
                    .await
                    .map_err(|e| format!("reading secret {name}: {e}"))?
                    .ok_or_else(|| format!("there is no secret {name} in namespace {namespace}"))?;
                out.insert(name.clone(), key.open(&stored)?);
            }
            Ok(out)
        })
    }
}

fn no_secret(ns: &str, name: &str) -> impl FnOnce() -> ApiError + use<> {
    let message = format!("no secret {ns}/{name}");
    move || ApiError::not_found(message)
}

fn key_of<S: Store>(st: &AppState<S>) -> Result<&Arc<KeySet>, ApiError> {
    st.master_key.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_master_key",
            "this server has no master key for secrets: start it with --master-key-file",
        )
    })
}

/// Sets a secret's value (a new version). The value is never answered.
#[utoipa::path(put, path = "/api/v1/namespaces/{ns}/secrets/{name}", tag = "secrets",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Secret")),
    request_body(content = SecretBody, content_type = "application/json"),
    responses((status = 200, body = SecretAnswer), Errors))]
pub(crate) async fn put_secret<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    body: Bytes,
) -> Result<Json<SecretAnswer>, ApiError> {
    who.allow(Need::Develop, Some(&ns), no_secret(&ns, &name))?;
    let key = key_of(&st)?;
    if !dagcron_core::model::valid_name(&ns) || !dagcron_core::model::valid_name(&name) {
        return Err(ApiError::bad_request(format!(
            "invalid secret name {ns}/{name}: 1-63 of a-z 0-9 - _ ."
        )));
    }
    let body: SecretBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("expected {{\"value\": \"...\"}}: {e}")))?;
    if body.value.len() > MAX_SECRET_BYTES {
        return Err(ApiError::bad_request(format!(
            "the value is {} bytes; at most {MAX_SECRET_BYTES} are accepted",
            body.value.len()
        )));
    }
    if body.value.contains('\0') {
        return Err(ApiError::bad_request("the value holds a NUL byte"));
    }
    let version = st
        .store
        .get_secret(&ns, &name)
        .await?
        .map_or(1, |s| s.version + 1);
    let record = key
        .current()
        .seal(&ns, &name, version, &body.value, Timestamp::now());
    st.store.put_secret(&record).await?;
    Ok(Json(SecretAnswer::from(&record)))
}

/// The secrets of a namespace: names and metadata, never values.
#[utoipa::path(get, path = "/api/v1/namespaces/{ns}/secrets", tag = "secrets",
    params(("ns" = String, Path, description = "Namespace")),
    responses((status = 200, body = SecretList), Errors))]
pub(crate) async fn list_secrets<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    UrlPath(ns): UrlPath<String>,
) -> Result<Json<SecretList>, ApiError> {
    if !who.lists(Need::Develop, &ns)? {
        return Ok(Json(SecretList { items: vec![] }));
    }
    let items = st
        .store
        .list_secrets(&ns)
        .await?
        .iter()
        .map(SecretAnswer::from)
        .collect();
    Ok(Json(SecretList { items }))
}

/// Deletes a secret; tasks that refer to it fail from then on.
#[utoipa::path(delete, path = "/api/v1/namespaces/{ns}/secrets/{name}", tag = "secrets",
    params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Secret")),
    responses((status = 204, description = "Deleted"), Errors))]
pub(crate) async fn delete_secret<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    who.allow(Need::Develop, Some(&ns), no_secret(&ns, &name))?;
    if st.store.delete_secret(&ns, &name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_secret(&ns, &name)())
    }
}

async fn keys_answer<S: Store>(st: &AppState<S>, keys: &KeySet) -> Result<KeysAnswer, ApiError> {
    let (current, old) = keys.ids();
    let stored = st.store.list_all_secrets().await?;
    let keys = std::iter::once(current.clone())
        .chain(old)
        .map(|id| KeyUse {
            secrets: stored.iter().filter(|s| s.key_id == id).count() as u64,
            key_id: id,
        })
        .collect();
    Ok(KeysAnswer { current, keys })
}

/// The master keys and their use (instance admin).
#[utoipa::path(get, path = "/api/v1/secrets/keys", tag = "secrets",
    responses((status = 200, body = KeysAnswer), Errors))]
pub(crate) async fn list_keys<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<KeysAnswer>, ApiError> {
    who.allow(Need::Administer, None, || {
        ApiError::not_found("no such path")
    })?;
    let keys = key_of(&st)?.clone();
    Ok(Json(keys_answer(&st, &keys).await?))
}

/// Rotates the master key (instance admin): an embedded server makes a new
/// key, keeping the old one to decrypt; then every secret is re-encrypted
/// under the current key in the background, and older keys no secret uses
/// any more are retired. A cluster's nodes are given the new key as
/// `--master-key-file` (the old as `--old-master-key-file`) first.
#[utoipa::path(post, path = "/api/v1/secrets/rotate-key", tag = "secrets",
    responses((status = 202, body = KeysAnswer), Errors))]
pub(crate) async fn rotate_key<S: Store>(
    State(st): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<(StatusCode, Json<KeysAnswer>), ApiError> {
    who.allow(Need::Administer, None, || {
        ApiError::not_found("no such path")
    })?;
    let keys = key_of(&st)?.clone();
    if keys.files.is_some() {
        keys.rotate()
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "key_rotation", e))?;
    }
    let answer = keys_answer(&st, &keys).await?;
    let store = st.store.clone();
    tokio::spawn(async move {
        match reencrypt(&*store, &keys).await {
            Ok(n) => tracing::info!("re-encrypted {n} secrets under the current master key"),
            Err(e) => tracing::error!("re-encrypting the secrets failed: {e}"),
        }
    });
    Ok((StatusCode::ACCEPTED, Json(answer)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_opens_only_as_itself_under_its_key() {
        let key = MasterKey::from_bytes([3; 32]);
        let now = Timestamp::UNIX_EPOCH;
        let s = key.seal("a", "db", 2, "hunter2", now);
        assert_eq!(key.open(&s).unwrap(), "hunter2");
        assert!(!s.ciphertext.windows(7).any(|w| w == b"hunter2"));
        // Moved to another name, namespace or version: refused.
        for moved in [
            SecretRecord {
                name: "other".into(),
                ..s.clone()
            },
            SecretRecord {
                namespace: "b".into(),
                ..s.clone()
            },
            SecretRecord {
                version: 3,
                ..s.clone()
            },
        ] {
            assert!(key.open(&moved).is_err());
        }
        let mut flipped = s.clone();
        flipped.ciphertext[0] ^= 1;
        assert!(key.open(&flipped).is_err());
        let other = MasterKey::from_bytes([4; 32]);
        assert!(other.open(&s).unwrap_err().contains("does not have"));
        // A fresh nonce every time.
        assert_ne!(key.seal("a", "db", 2, "hunter2", now).nonce, s.nonce);
    }
}
