//! The API's wire types: what requests carry and answers hold, described in
//! the OpenAPI document, and read back by the command line. Store records
//! are converted here; they are not answers themselves.
//!
//! One file per group of routes; every type is re-exported here, so that
//! callers name them `wire::RunAnswer` whatever file holds them.

mod audit;
mod cluster;
mod jobs;
mod notifications;
mod operations;
mod retention;
mod runs;
mod schedules;
mod secrets;
mod tokens;
mod versions;

use serde::{Deserialize, Serialize};
use utoipa::{IntoResponses, ToSchema};

pub use audit::{AuditAnswer, AuditCheckpoint, AuditPage};
pub use cluster::{
    ClusterAnswer, HealthAnswer, NodeAnswer, NodeStatus, ReadyAnswer, ReadyCheck, WorkerAnswer,
    WorkersAnswer, WriteCounts,
};
pub use jobs::{
    ApplyAnswer, ApplyItem, ApplyOutcome, BackfillAnswer, BackfillBody, JobAnswer, JobPage,
    TriggerBatchAnswer, TriggerBatchBody, TriggerBatchItem, TriggerBody, UpcomingAnswer,
    UpcomingFire,
};
pub use notifications::{DeliveryAnswer, HookAnswer, NotificationAnswer, NotificationPage};
pub use operations::{BulkPauseAnswer, Policy, Quotas, ReadOnlyAnswer, ReadOnlyBody, ShellPlace};
pub use retention::{PruneAnswer, PruneBody, PrunedAnswer, RetentionAnswer, RetentionBody};
pub use runs::{
    AttemptAnswer, FireAnswer, FirePage, HeldPage, HeldTask, LogLine, LogLines, RerunBody,
    RunAnswer, RunPage, TaskAnswer,
};
pub use schedules::{HotJobAnswer, HotspotAnswer, HotspotReport};
pub use secrets::{KeyUse, KeysAnswer, SecretAnswer, SecretBody, SecretList};
pub use tokens::{CreatedToken, NewTokenBody, TokenAnswer, TokenList};
pub use versions::{
    ApplierAnswer, RollbackAnswer, RulesAnswer, RulesChangeAnswer, VersionAnswer, VersionPage,
};

/// Every error answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// An error: a stable code for programs, a message for people, and
/// structured details (for invalid input, one entry per problem).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, such as `not_found`, `invalid_job_file`, `invalid_params`.
    pub code: String,
    /// A sentence.
    pub message: String,
    /// `null`, or one entry per problem of invalid input.
    #[serde(default)]
    #[schema(required = true)]
    pub details: Option<Vec<Problem>>,
}

/// One problem of a job file or of a trigger's parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// Where, such as `jobs[0].tasks[2].depends_on[0]`.
    pub path: String,
    /// What is wrong and what would be accepted.
    pub message: String,
    /// For a cron expression: the byte span of the error in it, `[start, end]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<u64>>)]
    pub span: Option<(usize, usize)>,
}

impl From<&dagcron_core::ValidationError> for Problem {
    fn from(e: &dagcron_core::ValidationError) -> Problem {
        Problem {
            path: e.path.clone(),
            message: e.message.clone(),
            span: e.span,
        }
    }
}

/// The errors any operation may answer with.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum Errors {
    /// A path, query or body that does not parse or breaks a rule.
    #[response(status = 400)]
    BadRequest(#[to_schema] ErrorBody),
    /// No valid token: missing, unknown, expired or revoked.
    #[response(status = 401)]
    Unauthenticated(#[to_schema] ErrorBody),
    /// The token's role does not allow this.
    #[response(status = 403)]
    Forbidden(#[to_schema] ErrorBody),
    /// No such job, run, attempt or path (or one of another namespace than
    /// the token's).
    #[response(status = 404)]
    NotFound(#[to_schema] ErrorBody),
    /// The method is not one this path takes.
    #[response(status = 405)]
    MethodNotAllowed(#[to_schema] ErrorBody),
    /// The request conflicts with the current state.
    #[response(status = 409)]
    Conflict(#[to_schema] ErrorBody),
    /// The body is larger than the server's `max_body_bytes`.
    #[response(status = 413)]
    TooLarge(#[to_schema] ErrorBody),
    /// Too much work waits (the ready backlog, or a job's pending runs),
    /// a quota is reached, or the caller's address failed to authenticate
    /// too often: try again after `Retry-After` seconds.
    #[response(status = 429)]
    TooMany(#[to_schema] ErrorBody),
    /// The store is unavailable or the server is shutting down.
    #[response(status = 503)]
    Unavailable(#[to_schema] ErrorBody),
}
