//! Retention: a namespace's policy, and what a pass of pruning deleted.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Sets a namespace's retention policy: both fields, or `{}` for the
/// instance's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetentionBody {
    /// How long history is kept, in seconds (at least 3600).
    #[serde(default)]
    #[schema(minimum = 3600, maximum = 3162240000u64)]
    pub max_age_seconds: Option<u64>,
    /// How many of each job's newest runs are kept, however old.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1000000)]
    pub keep_last: Option<u32>,
}

/// A namespace's retention policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RetentionAnswer {
    /// How long history is kept, in seconds: from a run's end, a fire's
    /// scheduled instant, a job's deletion.
    pub max_age_seconds: u64,
    /// How many of each job's newest runs (and ledger rows) are kept,
    /// however old.
    pub keep_last: u32,
    /// No policy is set: these are the instance's default.
    pub default: bool,
}

/// Prunes now, or only counts what would go.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneBody {
    /// Count only; delete nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// One namespace (none: every namespace).
    #[serde(default)]
    pub namespace: Option<String>,
}

/// What went (or, dry, would go) from one namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PrunedAnswer {
    /// The namespace.
    pub namespace: String,
    /// Runs, with their tasks.
    pub runs: u64,
    /// Attempts, with their logs.
    pub attempts: u64,
    /// Rows of the fire ledger.
    pub fires: u64,
    /// Deleted jobs forgotten (their versions and tombstone).
    pub jobs: u64,
}

/// What a pass of pruning deleted (or would delete), per namespace where
/// anything goes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PruneAnswer {
    /// Nothing was deleted: these are what would go.
    pub dry_run: bool,
    /// Per namespace, by name.
    pub namespaces: Vec<PrunedAnswer>,
}
