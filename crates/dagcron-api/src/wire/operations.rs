//! Operating the instance: the read-only mode, and pausing or resuming a
//! namespace's jobs at once.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Whether the instance is read-only, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReadOnlyAnswer {
    /// While on, schedules keep firing and runs go on; applies, edits,
    /// manual triggers and backfills are refused (`503`, code `read_only`).
    pub read_only: bool,
    /// Why, as the operator who turned it on said.
    pub reason: Option<String>,
    /// Since when.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub since: Option<Timestamp>,
    /// Who turned it on (a token's name).
    pub by: Option<String>,
}

/// Turns the read-only mode on or off.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadOnlyBody {
    /// On or off.
    pub read_only: bool,
    /// Why (shown to everyone refused; at most 500 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// What pausing or resuming every job of a namespace changed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BulkPauseAnswer {
    /// Jobs paused (or resumed) now.
    pub changed: u64,
    /// Jobs that were already so.
    pub unchanged: u64,
}
