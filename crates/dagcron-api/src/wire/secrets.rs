//! Secrets: a value to set, and metadata (never a value) in answers.

use dagcron_store::SecretRecord;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A secret's value, to set.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretBody {
    /// The value (at most 64 KiB, UTF-8).
    pub value: String,
}

/// A secret's metadata: never its value.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SecretAnswer {
    /// Tenant.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Increments with every new value.
    pub version: i64,
    /// Which master key encrypted it.
    pub key_id: String,
    /// When its value was last set.
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl From<&SecretRecord> for SecretAnswer {
    fn from(s: &SecretRecord) -> SecretAnswer {
        SecretAnswer {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            version: s.version,
            key_id: s.key_id.clone(),
            updated_at: s.updated_at,
        }
    }
}

/// A namespace's secrets.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SecretList {
    /// By name.
    pub items: Vec<SecretAnswer>,
}

/// The master keys and how many secrets each encrypts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeysAnswer {
    /// The key that encrypts.
    pub current: String,
    /// Every key this server holds, with the secrets it encrypts.
    pub keys: Vec<KeyUse>,
}

/// One master key's use.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyUse {
    /// Its id.
    pub key_id: String,
    /// Secrets encrypted with it.
    pub secrets: u64,
}
