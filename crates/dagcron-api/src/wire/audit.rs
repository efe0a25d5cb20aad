//! The audit log's rows, with the hashes that chain them (in hex).

use dagcron_store::AuditEntry;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
    /// Where retention last cut the log: the first row kept follows this
    /// one (none: the log was never cut).
    #[serde(default)]
    pub checkpoint: Option<AuditCheckpoint>,
}

/// The position and hash of the last audit row that retention deleted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditCheckpoint {
    /// Its position.
    pub seq: i64,
    /// Its hash, in hex.
    pub hash: String,
}

impl AuditCheckpoint {
    /// From the store's `(position, hash)`.
    pub fn new((seq, hash): &(i64, Vec<u8>)) -> AuditCheckpoint {
        AuditCheckpoint {
            seq: *seq,
            hash: hex(hash),
        }
    }

    /// Back to `(position, hash)`; none if the hash is not hex.
    pub fn stored(&self) -> Option<(i64, Vec<u8>)> {
        Some((self.seq, unhex(&self.hash)?))
    }
}
