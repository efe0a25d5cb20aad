//! A job's versions: who applied each and when, whether it rolled back to
//! an older one, the rules its fires were computed with, and how those
//! differ from the server's.

use std::collections::BTreeMap;

use dagcron_core::{Rules, RulesChange};
use dagcron_store::{JobVersion, VersionRecord};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// One version of a job.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VersionAnswer {
    /// Tenant.
    pub namespace: String,
    /// Job.
    pub name: String,
    /// From 1, one more with every apply that changed the job.
    pub version: i64,
    /// Whether the job is at this version now.
    pub current: bool,
    /// When it was applied.
    #[schema(value_type = String, format = DateTime)]
    pub applied_at: Timestamp,
    /// The token that applied it (none: not applied through the API).
    pub applied_by: Option<ApplierAnswer>,
    /// For a rollback: the older version it takes the spec of.
    pub rollback_of: Option<i64>,
    /// The rules its fires were computed with (none: applied before
    /// versions recorded them).
    pub rules: Option<RulesAnswer>,
    /// The canonical spec of this version (in `GET .../versions/{version}`
    /// only; a listing leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub spec: Option<Value>,
}

impl VersionAnswer {
    /// A listed version (`current`: the job's version now, if it exists).
    pub fn of(v: &VersionRecord, current: Option<i64>) -> VersionAnswer {
        VersionAnswer {
            namespace: v.namespace.clone(),
            name: v.name.clone(),
            version: v.version,
            current: current == Some(v.version),
            applied_at: v.applied_at,
            applied_by: v.origin.by.as_ref().map(|a| ApplierAnswer {
                token_id: a.id.clone(),
                name: a.name.clone(),
            }),
            rollback_of: v.origin.rollback_of,
            rules: v.rules.as_ref().map(RulesAnswer::from),
            spec: None,
        }
    }

    /// A version with its spec.
    pub fn with_spec(v: &JobVersion, current: Option<i64>) -> VersionAnswer {
        VersionAnswer {
            spec: Some(serde_json::from_str(&v.spec).unwrap_or(Value::Null)),
            ..VersionAnswer::of(&v.info, current)
        }
    }
}

/// Who applied a version: an API token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApplierAnswer {
    /// The token's id.
    pub token_id: String,
    /// The token's name.
    pub name: String,
}

/// What the fires of a job are computed with.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RulesAnswer {
    /// The cron semantics version.
    pub cron_semantics: u32,
    /// The version of the IANA time zone database.
    pub tzdb: String,
    /// For each zone the job's schedules use: a digest of its rules.
    pub zones: BTreeMap<String, String>,
}

impl From<&Rules> for RulesAnswer {
    fn from(r: &Rules) -> RulesAnswer {
        RulesAnswer {
            cron_semantics: r.cron,
            tzdb: r.tzdb.clone(),
            zones: r.zones.clone(),
        }
    }
}

/// A job whose version was applied under other rules than this server's:
/// its fires may come at other instants than they did. Applying the job
/// again accepts the server's rules (a new version).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RulesChangeAnswer {
    /// What changed, in a sentence.
    pub message: String,
    /// The rules its version was applied under.
    pub stored: RulesAnswer,
    /// This server's rules for it.
    pub now: RulesAnswer,
    /// The zones whose rules changed.
    pub zones: Vec<String>,
}

impl RulesChangeAnswer {
    /// The answer for a version stored under `stored` whose job has `now`.
    pub fn of(change: &RulesChange, stored: &Rules, now: &Rules) -> RulesChangeAnswer {
        RulesChangeAnswer {
            message: format!(
                "applied under other scheduling rules than this server's: {change}; its fires may come at other instants than they did (apply it again to accept the new rules)"
            ),
            stored: stored.into(),
            now: now.into(),
            zones: change.zones.clone(),
        }
    }
}

/// A page of versions, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VersionPage {
    /// The versions.
    pub items: Vec<VersionAnswer>,
    /// Pass as `cursor` for the next page; none on the last one.
    pub next_cursor: Option<String>,
}

/// What a rollback did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RollbackAnswer {
    /// `namespace/name`.
    pub job: String,
    /// `updated` (a new version, equal to the one rolled back to),
    /// `created` (the job had been deleted) or `unchanged` (the job is
    /// already equal to it).
    pub result: String,
    /// The job's version now.
    pub version: i64,
    /// The version rolled back to.
    pub rolled_back_to: i64,
}
