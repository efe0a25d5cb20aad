//! API tokens: what creating one asks, and a token's identity and
//! authority (its secret only in the answer that creates it).

use std::collections::BTreeMap;

use dagcron_store::TokenRecord;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A token to create.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTokenBody {
    /// What it is for (1 to 100 characters).
    pub name: String,
    /// `viewer`, `operator`, `developer` or `admin`: at most the creator's.
    pub role: String,
    /// The namespace it is limited to; none: the whole instance (only an
    /// instance admin may create such a token).
    #[serde(default)]
    pub namespace: Option<String>,
    /// How long it is valid, such as `30d` or `12h`; none: until revoked.
    #[serde(default)]
    pub expires_in: Option<String>,
    /// For an `agent` join token: the only labels an agent may claim with
    /// it; none: any.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// A token's identity and authority (never its secret).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenAnswer {
    /// Public id.
    pub id: String,
    /// What it is for.
    pub name: String,
    /// Its role.
    pub role: String,
    /// The namespace it is limited to; none: the whole instance.
    pub namespace: Option<String>,
    /// Created.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// Refused from then on.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub expires_at: Option<Timestamp>,
    /// Last accepted (to about a minute).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_used_at: Option<Timestamp>,
    /// Revoked.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<Timestamp>,
    /// The token that created it.
    pub created_by: Option<String>,
    /// For a join token: the labels an agent may claim with it.
    pub labels: Option<BTreeMap<String, String>>,
}

impl From<&TokenRecord> for TokenAnswer {
    fn from(t: &TokenRecord) -> TokenAnswer {
        TokenAnswer {
            id: t.id.clone(),
            name: t.name.clone(),
            role: t.role.clone(),
            namespace: t.namespace.clone(),
            created_at: t.created_at,
            expires_at: t.expires_at,
            last_used_at: t.last_used_at,
            revoked_at: t.revoked_at,
            created_by: t.created_by.clone(),
            labels: t.labels.clone(),
        }
    }
}

/// A new token: its secret, shown this once, and what it is.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// The secret: `Authorization: Bearer <token>`. Not shown again.
    pub token: String,
    /// The token's identity and authority.
    pub details: TokenAnswer,
}

/// Every token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    /// Oldest first, revoked ones included.
    pub items: Vec<TokenAnswer>,
}
