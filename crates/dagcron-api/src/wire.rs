//! The API's wire types: what requests carry and answers hold, described in
//! the OpenAPI document. Store records are converted here; they are not
//! answers themselves.

use std::collections::BTreeMap;

use dagcron_core::Job;
use dagcron_store::{AttemptRecord, FireRecord, RunRecord, StoredJob, TaskRecord};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoResponses, ToSchema};

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
    /// `null`, or a list of problems each with `path` and `message`.
    #[schema(value_type = Value)]
    pub details: Value,
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
    /// The store is unavailable or the server is shutting down.
    #[response(status = 503)]
    Unavailable(#[to_schema] ErrorBody),
}

/// A job as stored, with its next fire.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobAnswer {
    /// Tenant.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Increments with every change of the declaration.
    pub version: i64,
    /// A paused job does not fire.
    pub paused: bool,
    /// Last change.
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
    /// The next scheduled fire (none: paused, unscheduled or past its end).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_fire: Option<Timestamp>,
    /// The declaration as applied (the job file's fields).
    #[schema(value_type = Value)]
    pub spec: Value,
}

impl JobAnswer {
    /// The answer for a stored job, its next fire computed at `now`.
    pub fn of(job: &StoredJob, now: Timestamp) -> JobAnswer {
        let next_fire = match Job::from_canonical(&job.namespace, &job.spec) {
            Ok(j) if !job.paused => j.next_fire_after(now),
            _ => None,
        };
        JobAnswer {
            namespace: job.namespace.clone(),
            name: job.name.clone(),
            version: job.version,
            paused: job.paused,
            updated_at: job.updated_at,
            next_fire,
            spec: serde_json::from_str(&job.spec).unwrap_or(Value::Null),
        }
    }
}

/// A page of jobs.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    /// The jobs, by name.
    pub items: Vec<JobAnswer>,
    /// Pass as `cursor` for the next page; none on the last one.
    pub next_cursor: Option<String>,
}

/// What applying a job file did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApplyAnswer {
    /// The file's namespace.
    pub namespace: String,
    /// One entry per job of the file.
    pub jobs: Vec<ApplyItem>,
}

/// What applying did to one job.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApplyItem {
    /// `namespace/name`.
    pub job: String,
    /// The outcome.
    pub result: ApplyOutcome,
}

/// `created`, `updated` or `unchanged`, and the version the job is at.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApplyOutcome {
    /// `created`, `updated` or `unchanged`.
    pub result: String,
    /// The job's version now.
    pub version: i64,
}

impl From<dagcron_store::ApplyResult> for ApplyOutcome {
    fn from(r: dagcron_store::ApplyResult) -> ApplyOutcome {
        let (result, version) = match r {
            dagcron_store::ApplyResult::Created(v) => ("created", v),
            dagcron_store::ApplyResult::Updated(v) => ("updated", v),
            dagcron_store::ApplyResult::Unchanged(v) => ("unchanged", v),
        };
        ApplyOutcome {
            result: result.into(),
            version,
        }
    }
}

/// A run with its tasks and their attempts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunAnswer {
    /// Id.
    pub id: i64,
    /// Tenant.
    pub namespace: String,
    /// Job.
    pub job: String,
    /// The version of the job it runs.
    pub job_version: i64,
    /// `schedule`, `catchup`, `manual` or `backfill`.
    pub trigger: String,
    /// The fire instant (for a manual run, when it was triggered).
    #[schema(value_type = String, format = DateTime)]
    pub scheduled_at: Timestamp,
    /// `pending`, `running`, `succeeded`, `failed`, `cancelled` or `skipped`.
    pub state: String,
    /// Parameters.
    pub params: BTreeMap<String, String>,
    /// Created.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// Started.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub started_at: Option<Timestamp>,
    /// Finished.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<Timestamp>,
    /// Set once the run was asked to stop: the state it ends in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closing: Option<String>,
    /// Tasks in declaration order.
    pub tasks: Vec<TaskAnswer>,
}

/// A task of a run.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TaskAnswer {
    /// Task id.
    pub id: String,
    /// Its state in the run.
    pub state: String,
    /// Attempts, oldest first.
    pub attempts: Vec<AttemptAnswer>,
}

/// One attempt of a task.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptAnswer {
    /// 1-based.
    pub number: u32,
    /// `dispatching`, `running`, `succeeded`, `failed`, `timed_out`, `lost` or `cancelled`.
    pub state: String,
    /// Start.
    #[schema(value_type = String, format = DateTime)]
    pub started_at: Timestamp,
    /// End.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<Timestamp>,
    /// Exit code or HTTP status.
    pub exit_code: Option<i32>,
    /// What went wrong.
    pub error: Option<String>,
    /// The epoch of the cluster node that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_epoch: Option<i64>,
    /// For a timed attempt: how far from its instant it started, in µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error_us: Option<i64>,
}

impl From<&AttemptRecord> for AttemptAnswer {
    fn from(a: &AttemptRecord) -> AttemptAnswer {
        AttemptAnswer {
            number: a.number,
            state: a.state.as_str().into(),
            started_at: a.started_at,
            finished_at: a.finished_at,
            exit_code: a.exit_code,
            error: a.error.clone(),
            node_epoch: a.node_epoch,
            start_error_us: a.start_error_us,
        }
    }
}

impl From<&TaskRecord> for TaskAnswer {
    fn from(t: &TaskRecord) -> TaskAnswer {
        TaskAnswer {
            id: t.id.clone(),
            state: t.state.as_str().into(),
            attempts: t.attempts.iter().map(AttemptAnswer::from).collect(),
        }
    }
}

impl From<&RunRecord> for RunAnswer {
    fn from(r: &RunRecord) -> RunAnswer {
        RunAnswer {
            id: r.id,
            namespace: r.namespace.clone(),
            job: r.job.clone(),
            job_version: r.job_version,
            trigger: r.trigger.as_str().into(),
            scheduled_at: r.scheduled_at,
            state: r.state.as_str().into(),
            params: r.params.clone(),
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            closing: r.closing.map(|c| c.as_str().into()),
            tasks: r.tasks.iter().map(TaskAnswer::from).collect(),
        }
    }
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    /// The runs.
    pub items: Vec<RunAnswer>,
    /// Pass as `cursor` for the next page; none on the last one.
    pub next_cursor: Option<String>,
}

/// A row of the fire ledger.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FireAnswer {
    /// The scheduled instant.
    #[schema(value_type = String, format = DateTime)]
    pub scheduled_at: Timestamp,
    /// `fired`, `skipped_overlap`, `missed_caught_up`, `missed_skipped` or `suppressed`.
    pub outcome: String,
    /// The run it created.
    pub run_id: Option<i64>,
}

impl From<&FireRecord> for FireAnswer {
    fn from(f: &FireRecord) -> FireAnswer {
        FireAnswer {
            scheduled_at: f.scheduled_at,
            outcome: f.outcome.as_str().into(),
            run_id: f.run_id,
        }
    }
}

/// Fires in a range, oldest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FirePage {
    /// The fires.
    pub items: Vec<FireAnswer>,
}

/// A manual trigger.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    /// Parameters over the job's defaults.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

/// A backfill over `[from, to)`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillBody {
    /// Start, included.
    #[schema(value_type = String, format = DateTime)]
    pub from: Timestamp,
    /// End, excluded.
    #[schema(value_type = String, format = DateTime)]
    pub to: Timestamp,
}

/// The runs a backfill created.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BackfillAnswer {
    /// Their ids.
    pub runs: Vec<i64>,
}

/// Liveness, and in a cluster this node's standing.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HealthAnswer {
    /// `ok` or `degraded`.
    pub status: String,
    /// Why it is degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// This node (in a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub node: Option<Value>,
}

/// The remote worker agents of this server.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkersAnswer {
    /// Each agent: labels, capacity, running, last heartbeat, clock offset, version.
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<Value>,
    /// Results refused because their fencing token was stale.
    pub stale_results_refused: u64,
    /// Messages refused because they came from another agent than the one
    /// the attempt was given to (forged results, for one).
    pub foreign_reports_refused: u64,
}

/// The nodes of the cluster.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterAnswer {
    /// This node: id, epoch, lease, clock skew, ring, owned jobs.
    #[schema(value_type = Object)]
    pub this_node: Value,
    /// Every node the database knows.
    #[schema(value_type = Vec<Object>)]
    pub nodes: Vec<Value>,
}
