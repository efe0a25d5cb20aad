//! Runs, their tasks and attempts, and the fire ledger.

use std::collections::BTreeMap;

use dagcron_store::{AttemptRecord, FireRecord, RunRecord, TaskRecord};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
    /// `schedule`, `catchup`, `manual`, `backfill` or `rerun`.
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
    /// For a re-run: the run it re-runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<i64>,
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
    /// In a re-run of the failed tasks: its outcome was carried over from
    /// the run re-run (it did not run here, and has no attempt).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carried: bool,
    /// An instance of a mapped task (`for_each`; its id is `task[index]`):
    /// its item, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    /// A mapped task: why it has no instances, or failed by them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A task with no attempt of its own: a carried task's outputs, or a
    /// mapped task's, gathered from its instances (a JSON list per name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
}

/// One attempt of a task.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptAnswer {
    /// 1-based.
    pub number: u32,
    /// `dispatching`, `running`, `succeeded`, `skipped`, `failed`, `timed_out`, `lost` or `cancelled`.
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
    /// What the task handed downstream (`{{tasks.<task>.outputs.<name>}}`),
    /// secrets redacted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
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
            outputs: a.outputs.clone(),
        }
    }
}

impl From<&TaskRecord> for TaskAnswer {
    fn from(t: &TaskRecord) -> TaskAnswer {
        TaskAnswer {
            id: t.id.clone(),
            state: t.state.as_str().into(),
            attempts: t.attempts.iter().map(AttemptAnswer::from).collect(),
            carried: t.carried,
            item: t.item.clone(),
            note: t.note.clone(),
            outputs: t.carried_outputs.clone(),
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
            rerun_of: r.rerun_of,
            tasks: r.tasks.iter().map(TaskAnswer::from).collect(),
        }
    }
}

/// A task held after its last retry failed, waiting for an operator.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HeldTask {
    /// Its run.
    pub run: i64,
    /// The run's job.
    pub job: String,
    /// The task's id.
    pub task: String,
    /// Attempts it has had.
    pub attempts: u32,
    /// When its last attempt ended.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub held_since: Option<Timestamp>,
    /// What went wrong in its last attempt.
    pub error: Option<String>,
}

/// The held tasks of a namespace, oldest run first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HeldPage {
    /// The tasks.
    pub items: Vec<HeldTask>,
}

/// A re-run of a finished run.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerunBody {
    /// Run only the tasks that did not end well (failed, upstream_failed,
    /// cancelled) and everything downstream of them; the others keep their
    /// outcome. Default: every task runs again.
    #[serde(default)]
    pub failed_only: bool,
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
    /// `fired`, `skipped_overlap`, `skipped_backlog`, `skipped_quota`, `skipped_breaker`, `missed_caught_up`, `missed_skipped` or `suppressed`.
    pub outcome: String,
    /// For a `suppressed` fire: the exclusion calendar that suppressed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<String>,
    /// The run it created.
    pub run_id: Option<i64>,
    /// When its run was found not to have succeeded by the job's SLA
    /// (none: no SLA, not judged yet, or met).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub sla_missed_at: Option<Timestamp>,
}

impl From<&FireRecord> for FireAnswer {
    fn from(f: &FireRecord) -> FireAnswer {
        FireAnswer {
            scheduled_at: f.scheduled_at,
            outcome: f.outcome.as_str().into(),
            calendar: f.calendar.clone(),
            run_id: f.run_id,
            sla_missed_at: f.sla_missed_at,
        }
    }
}

/// Fires in a range, oldest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FirePage {
    /// The fires.
    pub items: Vec<FireAnswer>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use dagcron_core::{AttemptState, RunState, TaskState};
    use dagcron_store::Trigger;

    /// The command line reads answers back into these types and prints
    /// them: nothing may be lost on the way.
    #[test]
    fn a_run_reads_back_as_it_was_written() {
        let t = Timestamp::from_second(100).unwrap();
        let record = RunRecord {
            id: 33,
            namespace: "a".into(),
            job: "j".into(),
            job_version: 2,
            trigger: Trigger::Backfill,
            scheduled_at: t,
            state: RunState::Running,
            params: [("k".to_string(), "v".to_string())].into(),
            created_at: t,
            started_at: Some(t),
            finished_at: None,
            closing: Some(RunState::Cancelled),
            trace: None,
            rerun_of: Some(32),
            tasks: vec![TaskRecord {
                item: Default::default(),
                note: Default::default(),
                carried_outputs: Default::default(),
                id: "t".into(),
                state: TaskState::Running,
                attempts: vec![AttemptRecord {
                    outputs: [("rows".to_string(), "42".to_string())].into(),
                    number: 1,
                    state: AttemptState::Running,
                    started_at: t,
                    finished_at: None,
                    exit_code: None,
                    error: Some("boom".into()),
                    node_epoch: Some(3),
                    start_error_us: None,
                }],
                carried: false,
            }],
        };
        let written = serde_json::to_value(RunAnswer::from(&record)).unwrap();
        assert_eq!(written["closing"], "cancelled");
        assert_eq!(written["rerun_of"], 32);
        assert!(written["tasks"][0].get("carried").is_none());
        assert_eq!(written["tasks"][0]["attempts"][0]["node_epoch"], 3);
        assert_eq!(written["tasks"][0]["attempts"][0]["outputs"]["rows"], "42");
        assert!(
            written["tasks"][0]["attempts"][0]
                .get("start_error_us")
                .is_none()
        );
        let read: RunAnswer = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(serde_json::to_value(read).unwrap(), written);
    }
}

/// An attempt's log line by line, each with when and where it was written.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogLines {
    /// Whether the attempt has ended (else more may come).
    pub complete: bool,
    /// The lines, in order: the first 20,000.
    pub lines: Vec<LogLine>,
    /// Whether lines after those were left out (the whole text is the
    /// log's plain answer).
    pub truncated: bool,
}

/// A line of an attempt's output.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogLine {
    /// Its number, from 1.
    pub number: u32,
    /// When its first byte was read (none: not known, as for a running
    /// attempt, a log from before lines were marked, or an HTTP task).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<Timestamp>,
    /// `stdout` or `stderr` (none: not known).
    pub stream: Option<String>,
    /// Its text, without its newline (bytes that are not UTF-8 replaced).
    pub text: String,
}

impl LogLines {
    /// The lines of `output` with the marks of [`dagcron_core::log::encode`].
    pub fn of(output: &[u8], marks: &[u8], complete: bool) -> LogLines {
        let text = String::from_utf8_lossy(output);
        let marks = dagcron_core::log::decode(marks);
        let all = dagcron_core::log::lines(&text, &marks);
        LogLines {
            complete,
            truncated: all.len() > dagcron_core::log::MAX_MARKS,
            lines: all
                .into_iter()
                .take(dagcron_core::log::MAX_MARKS)
                .enumerate()
                .map(|(i, l)| LogLine {
                    number: i as u32 + 1,
                    at: l
                        .mark
                        .and_then(|m| Timestamp::from_microsecond(m.at_us).ok()),
                    stream: l.mark.map(|m| m.stream.as_str().to_string()),
                    text: l.text.to_string(),
                })
                .collect(),
        }
    }
}
