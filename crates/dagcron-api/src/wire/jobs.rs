//! Jobs: a stored job with its next fire, applying a file, triggering and
//! backfilling.

use std::collections::BTreeMap;

use dagcron_core::Job;
use dagcron_store::{ApplyResult, StoredJob};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::RulesChangeAnswer;

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
    /// The next scheduled fire that no exclusion calendar suppresses (none:
    /// paused, its failure breaker open, unscheduled, past its end, or
    /// every fire suppressed).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_fire: Option<Timestamp>,
    /// The declaration as applied (the job file's fields).
    #[schema(value_type = Value)]
    pub spec: Value,
    /// Set when its version was applied under other scheduling rules than
    /// this server's (cron semantics, or a zone's rules in the time zone
    /// database): its fires may come at other instants than they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_changed: Option<RulesChangeAnswer>,
    /// Its failure breaker, while open: its scheduled fires make no run
    /// (recorded `skipped_breaker`) until the job is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerAnswer>,
}

/// An open failure breaker.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BreakerAnswer {
    /// When it opened.
    #[schema(value_type = String, format = DateTime)]
    pub opened_at: Timestamp,
    /// The failed run that opened it.
    pub run: i64,
    /// The consecutive failed runs it opened after.
    pub failures: u32,
    /// Why the job does not fire, in words.
    pub reason: String,
}

impl JobAnswer {
    /// The answer for a stored job, its next fire computed at `now`.
    pub fn of(job: &StoredJob, now: Timestamp) -> JobAnswer {
        let parsed = Job::from_canonical(&job.namespace, &job.spec).ok();
        let next_fire = match &parsed {
            Some(j) if !job.paused && job.breaker.is_none() => j.next_unsuppressed_after(now),
            _ => None,
        };
        let rules_changed = parsed.zip(job.rules.as_ref()).and_then(|(j, stored)| {
            let rules = j.rules();
            let change = stored.changes(&rules)?;
            Some(RulesChangeAnswer::of(&change, stored, &rules))
        });
        JobAnswer {
            namespace: job.namespace.clone(),
            name: job.name.clone(),
            version: job.version,
            paused: job.paused,
            updated_at: job.updated_at,
            next_fire,
            spec: serde_json::from_str(&job.spec).unwrap_or(Value::Null),
            rules_changed,
            breaker: job.breaker.map(|b| BreakerAnswer {
                opened_at: b.opened_at,
                run: b.run,
                failures: b.failures,
                reason: b.reason(),
            }),
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

impl From<ApplyResult> for ApplyOutcome {
    fn from(r: ApplyResult) -> ApplyOutcome {
        let (result, version) = match r {
            ApplyResult::Created(v) => ("created", v),
            ApplyResult::Updated(v) => ("updated", v),
            ApplyResult::Unchanged(v) => ("unchanged", v),
        };
        ApplyOutcome {
            result: result.into(),
            version,
        }
    }
}

/// A manual trigger.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    /// Parameters over the job's defaults.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Make the run at this instant (RFC 3339, in the future) instead of
    /// now: it is recorded `planned` until then, and can be cancelled.
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<Timestamp>,
}

/// Many runs of one job in one call.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerBatchBody {
    /// The runs, 1 to 1000, each with its parameters.
    pub runs: Vec<TriggerBatchItem>,
    /// Make every run at this instant (RFC 3339, in the future) instead of
    /// now: they are recorded `planned` until then, and can be cancelled.
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<Timestamp>,
}

/// One run of a batch.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerBatchItem {
    /// Parameters over the job's defaults.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

/// The runs a batch made, in the order asked, as committed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TriggerBatchAnswer {
    /// The runs.
    pub runs: Vec<crate::wire::RunAnswer>,
}

/// When a job runs next: its scheduled fires and its planned runs.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpcomingAnswer {
    /// Soonest first.
    pub items: Vec<UpcomingFire>,
}

/// One upcoming fire of a job.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpcomingFire {
    /// When.
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    /// `schedule` (a fire of the job's schedules) or `planned` (a run
    /// planned for this instant by a trigger with `at`).
    pub kind: String,
    /// The planned run.
    pub run_id: Option<i64>,
    /// The exclusion calendar that suppresses this scheduled fire.
    pub suppressed_by: Option<String>,
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
