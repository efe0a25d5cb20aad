//! Re-runs: which tasks of a finished run run again, and which keep the
//! outcome they had.
//!
//! A whole re-run starts every task over. A re-run of the failed tasks
//! starts over every task that did not end well (`failed`,
//! `upstream_failed`, `cancelled`, or anything not finished) and every task
//! downstream of one of those, whatever it ended as (a failure handler
//! that ran, a cleanup that ran anyway: their rules are decided again); the
//! others keep their `succeeded` or `skipped` outcome, carried over with no
//! attempt.

use std::fmt;

use crate::model::Job;
use crate::state::TaskState;

/// Why a re-run is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RerunError {
    /// Only the failed tasks were asked for, and none failed.
    NothingFailed,
}

impl fmt::Display for RerunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RerunError::NothingFailed => f.write_str(
                "no task of it failed, was cancelled or did not run: re-run it whole instead",
            ),
        }
    }
}

impl std::error::Error for RerunError {}

/// The states the tasks of a re-run of `job` start in, by index: `pending`
/// for those that run again, the carried outcome for the others. `before`
/// holds each task's state in the run re-run (`None`: the run has no such
/// task, so it runs).
pub fn start_states(
    job: &Job,
    before: &[Option<TaskState>],
    failed_only: bool,
) -> Result<Vec<TaskState>, RerunError> {
    let n = job.tasks.len();
    if !failed_only {
        return Ok(vec![TaskState::Pending; n]);
    }
    let kept = |i: usize| {
        matches!(
            before.get(i).copied().flatten(),
            Some(TaskState::Succeeded | TaskState::Skipped)
        )
    };
    let mut again = vec![false; n];
    let mut stack: Vec<usize> = (0..n).filter(|&i| !kept(i)).collect();
    if stack.is_empty() {
        return Err(RerunError::NothingFailed);
    }
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut again[i], true) {
            continue;
        }
        stack.extend(job.dag.downstream[i].iter().copied());
    }
    Ok((0..n)
        .map(|i| {
            if again[i] {
                TaskState::Pending
            } else {
                before[i].expect("kept tasks have a state")
            }
        })
        .collect())
}

/// Whether a re-run of the failed tasks (`failed_only`) that starts its
/// tasks in `starts` keeps the expansion mapped task `task` had in the run
/// re-run: the task runs again and none upstream of it does, so its list
/// is the same; its instances that succeeded or were skipped are then
/// carried over ([`instance_start`]) and only the others run again. A
/// whole re-run starts every task over.
pub fn keeps_expansion(job: &Job, starts: &[TaskState], task: usize, failed_only: bool) -> bool {
    failed_only
        && job.tasks[task].for_each.is_some()
        && starts[task] == TaskState::Pending
        && job.dag.upstream[task]
            .iter()
            .all(|&u| starts[u] != TaskState::Pending)
}

/// The state a kept instance starts in, by the state it ended in: its
/// outcome carried over if it succeeded or was skipped, else `pending`.
pub fn instance_start(before: TaskState) -> TaskState {
    match before {
        TaskState::Succeeded | TaskState::Skipped => before,
        _ => TaskState::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    fn job() -> Job {
        let file: crate::JobFile = serde_json::from_value(serde_json::json!({
            "namespace": "n",
            "jobs": [{
                "name": "etl",
                "tasks": [
                    { "id": "extract", "noop": true },
                    { "id": "other", "noop": true },
                    { "id": "transform", "depends_on": ["extract"], "noop": true },
                    { "id": "load", "depends_on": ["transform"], "noop": true },
                    { "id": "page", "depends_on": ["load"], "trigger_rule": "one_failed", "noop": true },
                    { "id": "report", "depends_on": ["other"], "trigger_rule": "all_done", "noop": true },
                ]
            }]
        }))
        .unwrap();
        file.validate().unwrap().pop().unwrap()
    }

    /// A mapped task keeps its instances in a re-run of the failed tasks
    /// when nothing upstream of it runs again; never in a whole re-run.
    #[test]
    fn a_fan_out_is_kept_only_when_its_list_cannot_have_changed() {
        let file: crate::JobFile = serde_json::from_value(serde_json::json!({
            "namespace": "n",
            "jobs": [{
                "name": "fan",
                "tasks": [
                    { "id": "list", "shell": "x" },
                    { "id": "x", "depends_on": ["list"], "for_each": "{{tasks.list.outputs.p}}", "shell": "x" },
                    { "id": "root", "for_each": [1, 2], "shell": "x" },
                ]
            }]
        }))
        .unwrap();
        let job = file.validate().unwrap().pop().unwrap();
        let keeps = |starts: &[TaskState], failed_only| {
            (0..3)
                .map(|t| keeps_expansion(&job, starts, t, failed_only))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keeps(&[Succeeded, Pending, Pending], true),
            [false, true, true]
        );
        assert_eq!(
            keeps(&[Pending, Pending, Pending], true),
            [false, false, true],
            "its list runs again"
        );
        assert_eq!(
            keeps(&[Pending, Pending, Pending], false),
            [false; 3],
            "a whole re-run"
        );
        assert_eq!(instance_start(Skipped), Skipped);
        assert_eq!(instance_start(UpstreamFailed), Pending);
    }

    #[test]
    fn the_failed_tasks_and_everything_downstream_run_again() {
        let job = job();
        let before = [
            Some(Succeeded),
            Some(Succeeded),
            Some(Failed),
            Some(UpstreamFailed),
            Some(Succeeded),
            Some(Skipped),
        ];
        assert_eq!(
            start_states(&job, &before, true).unwrap(),
            [Succeeded, Succeeded, Pending, Pending, Pending, Skipped],
            "the failure handler that ran is decided again; the rest is carried over"
        );
        assert_eq!(start_states(&job, &before, false).unwrap(), [Pending; 6]);
    }

    #[test]
    fn cancelled_and_missing_tasks_run_again_and_a_clean_run_has_nothing_to_rerun() {
        let job = job();
        let cancelled = [
            Some(Succeeded),
            Some(Cancelled),
            Some(Succeeded),
            Some(Succeeded),
            Some(Skipped),
            None,
        ];
        assert_eq!(
            start_states(&job, &cancelled, true).unwrap(),
            [Succeeded, Pending, Succeeded, Succeeded, Skipped, Pending]
        );
        let clean = [
            Some(Succeeded),
            Some(Succeeded),
            Some(Succeeded),
            Some(Succeeded),
            Some(Skipped),
            Some(Succeeded),
        ];
        assert_eq!(
            start_states(&job, &clean, true),
            Err(RerunError::NothingFailed)
        );
    }
}
