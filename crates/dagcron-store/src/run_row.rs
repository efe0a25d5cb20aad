//! A run as one row, and what each write means: the reference.
//!
//! A run's tasks and their attempts are held with the run, as one value
//! ([`Row`]). [`apply`] applies one [`Write`] to it with the meaning every
//! backend must give it: a change whose expected state is not the one
//! found is refused and says what it found. The in-memory store applies
//! writes with it alone; the PostgreSQL store keeps each run as such a row
//! (its tasks as JSON) and applies a batch's writes to the rows it read;
//! the SQLite store's statements are checked against it by property tests
//! (`batches`).
//!
//! Captured output and the queue of attempts handed to a cluster are kept
//! apart: [`apply`] reports them in [`Effects`].

use std::collections::BTreeMap;

use dagcron_core::{AttemptState, RunState, TaskState};
use serde::{Deserialize, Serialize};

use crate::rows::{opt_ts, ts};
use crate::{AttemptRecord, NewRun, RunId, StorageError, TaskRecord, Write, WriteResult};

/// A task as stored in its run's row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Task id.
    pub id: String,
    /// State.
    pub state: TaskState,
    /// Its outcome was carried over from the run re-run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carried: bool,
    /// See [`TaskRecord::carried_outputs`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub carried_outputs: dagcron_core::outputs::Outputs,
    /// Attempts, by number.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
    /// See [`TaskRecord::item`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    /// See [`TaskRecord::note`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// An attempt as stored in its run's row (its output apart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1-based.
    pub number: u32,
    /// State.
    pub state: AttemptState,
    /// Start, in microseconds.
    pub started_at: i64,
    /// End, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Exit code or HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The node that ran it; none while it waits in the cluster's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_epoch: Option<i64>,
    /// See [`AttemptRecord::start_error_us`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error_us: Option<i64>,
    /// See [`AttemptRecord::outputs`].
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub outputs: dagcron_core::outputs::Outputs,
}

impl Task {
    /// The task as the store's callers see it.
    pub fn record(self) -> Result<TaskRecord, StorageError> {
        Ok(TaskRecord {
            id: self.id,
            state: self.state,
            carried: self.carried,
            carried_outputs: self.carried_outputs,
            item: self.item,
            note: self.note,
            attempts: self
                .attempts
                .into_iter()
                .map(|a| {
                    Ok(AttemptRecord {
                        number: a.number,
                        state: a.state,
                        started_at: ts(a.started_at)?,
                        finished_at: opt_ts(a.finished_at)?,
                        exit_code: a.exit_code,
                        error: a.error,
                        node_epoch: a.node_epoch,
                        start_error_us: a.start_error_us,
                        outputs: a.outputs,
                    })
                })
                .collect::<Result<_, StorageError>>()?,
        })
    }

    fn attempt_mut(&mut self, number: u32) -> Option<&mut Attempt> {
        self.attempts.iter_mut().find(|a| a.number == number)
    }
}

/// The outputs of each task of a run that has some: those of its attempt
/// that succeeded.
pub fn task_outputs(tasks: &[Task]) -> BTreeMap<String, dagcron_core::outputs::Outputs> {
    tasks
        .iter()
        .filter_map(|t| {
            let outputs = t
                .attempts
                .iter()
                .rev()
                .find(|a| a.state == AttemptState::Succeeded)
                .map_or(&t.carried_outputs, |a| &a.outputs);
            (!outputs.is_empty()).then(|| (t.id.clone(), outputs.clone()))
        })
        .collect()
}

/// A run's tasks from their stored JSON.
pub fn parse_tasks(run: RunId, json: &str) -> Result<Vec<Task>, StorageError> {
    serde_json::from_str(json).map_err(|e| StorageError::Corrupt(format!("run {run} tasks: {e}")))
}

/// Attempt `number` of task `task` among a run's tasks.
pub fn find_attempt<'t>(tasks: &'t [Task], task: &str, number: u32) -> Option<&'t Attempt> {
    tasks
        .iter()
        .find(|t| t.id == task)
        .and_then(|t| t.attempts.iter().find(|a| a.number == number))
}

fn tasks_json(tasks: &[Task]) -> String {
    serde_json::to_string(tasks).expect("tasks serialize")
}

/// The part of a run's row that writes change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The run.
    pub id: RunId,
    /// The row's change count as read; none for a run this batch inserts.
    pub rev: Option<i64>,
    /// State.
    pub state: RunState,
    /// When it entered `running`, in microseconds.
    pub started_at: Option<i64>,
    /// When it finished, in microseconds.
    pub finished_at: Option<i64>,
    /// The state it ends in once asked to stop.
    pub closing: Option<RunState>,
    /// Tasks in declaration order.
    pub tasks: Vec<Task>,
    /// A write changed it since it was read.
    pub changed: bool,
}

impl Row {
    /// A new run's row, as it is inserted.
    pub fn new(run: &NewRun) -> Row {
        let created = run.created_at.as_microsecond();
        Row {
            id: run.id,
            rev: None,
            state: run.state,
            started_at: (run.state == RunState::Running).then_some(created),
            finished_at: run.state.is_terminal().then_some(created),
            closing: None,
            tasks: run
                .tasks
                .iter()
                .map(|t| Task {
                    id: t.clone(),
                    state: run.task_start(t),
                    carried: run.carried.contains_key(t),
                    carried_outputs: run.carried_outputs.get(t).cloned().unwrap_or_default(),
                    attempts: vec![],
                    item: run.items.get(t).cloned(),
                    note: None,
                })
                .collect(),
            changed: true,
        }
    }

    fn task_mut(&mut self, task: &str) -> Option<&mut Task> {
        self.tasks.iter_mut().find(|t| t.id == task)
    }

    /// Its tasks as stored (JSON).
    pub fn tasks_json(&self) -> String {
        tasks_json(&self.tasks)
    }
}

/// An ended attempt's output: run, task, number, output, the marks of its
/// lines.
pub type EndedLog<'a> = (RunId, &'a str, u32, &'a [u8], &'a [u8]);

/// What a batch does besides its runs' rows, by run.
#[derive(Debug, Default)]
pub struct Effects<'a> {
    /// Output of ended attempts: run, task, number, output, the marks of
    /// its lines.
    pub logs: Vec<EndedLog<'a>>,
    /// Attempts handed to the cluster.
    pub queued: Vec<Queued<'a>>,
    /// Attempts that left the cluster's queue unclaimed (ended or withdrawn).
    pub unqueued: Vec<(RunId, &'a str, u32)>,
    /// An attempt run for another node's run ended: its owner is told.
    pub ended_for_others: Vec<RunId>,
}

/// An attempt handed to the cluster: run, task, number, instant (µs),
/// priority, labels.
pub type Queued<'a> = (RunId, &'a str, u32, i64, i32, Option<String>);

impl<'a> Effects<'a> {
    /// Takes in what the writes of other runs did.
    pub fn absorb(&mut self, mut other: Effects<'a>) {
        self.logs.append(&mut other.logs);
        self.queued.append(&mut other.queued);
        self.unqueued.append(&mut other.unqueued);
        self.ended_for_others.append(&mut other.ended_for_others);
    }

    /// Forgets what the writes of `runs` did, to apply them again.
    /// `runs` is sorted.
    pub fn forget(&mut self, runs: &[RunId]) {
        let kept = |r: &RunId| runs.binary_search(r).is_err();
        self.logs.retain(|e| kept(&e.0));
        self.queued.retain(|e| kept(&e.0));
        self.unqueued.retain(|e| kept(&e.0));
        self.ended_for_others.retain(kept);
    }
}

/// The run a write changes (other than by inserting it).
pub fn run_of(w: &Write) -> Option<RunId> {
    match w {
        Write::Fire { .. }
        | Write::Run(_)
        | Write::Notify(_)
        | Write::Breaker(_)
        | Write::SlaMissed { .. } => None,
        _ => w.run_id(),
    }
}

/// Applies `w` (any write but an insert of a run) to `row`, the row of its
/// run if it exists; `epoch` is the writing node's.
pub fn apply<'a>(
    row: Option<&mut Row>,
    w: &'a Write,
    epoch: Option<i64>,
    effects: &mut Effects<'a>,
) -> WriteResult {
    match (w, row) {
        (
            Write::Fire { .. }
            | Write::Run(_)
            | Write::Notify(_)
            | Write::Breaker(_)
            | Write::SlaMissed { .. },
            _,
        ) => {
            unreachable!("inserts and breakers are not applied to rows")
        }
        (Write::RunState { run, from, .. }, None) => WriteResult::run_conflict(*run, None, *from),
        (Write::RunClosing { run, .. }, None) => WriteResult::no_run(*run),
        (
            Write::TaskState {
                run, task, from, ..
            },
            None,
        ) => WriteResult::task_conflict(*run, task, None, *from),
        (
            Write::AttemptStart {
                run, task, number, ..
            },
            None,
        ) => no_task(*run, task, *number),
        // Always done: there is nothing left to stop.
        (Write::AttemptWithdraw { .. }, None) => WriteResult::Done,
        (
            Write::AttemptEnd {
                run,
                task,
                number,
                from,
                ..
            },
            None,
        ) => WriteResult::attempt_conflict(*run, task, number, from.as_str()),
        (Write::Expand { run, task, .. }, None) => {
            WriteResult::task_conflict(*run, task, None, TaskState::Ready)
        }
        (Write::Gathered { .. }, None) => WriteResult::Done,
        (Write::Expand { run, task, items }, Some(row)) => {
            if !row.tasks.iter().any(|t| t.id == *task) {
                return WriteResult::task_conflict(*run, task, None, TaskState::Ready);
            }
            let first = dagcron_core::fan_out::instance_id(task, 0);
            if row.tasks.iter().any(|t| t.id == first) {
                return WriteResult::Conflict(format!("{run}/{task} is expanded already"));
            }
            row.tasks
                .extend(items.iter().enumerate().map(|(i, item)| Task {
                    id: dagcron_core::fan_out::instance_id(task, i),
                    state: TaskState::Pending,
                    carried: false,
                    carried_outputs: Default::default(),
                    attempts: vec![],
                    item: Some(item.clone()),
                    note: None,
                }));
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::Gathered {
                task,
                note,
                outputs,
                ..
            },
            Some(row),
        ) => {
            if let Some(t) = row.task_mut(task) {
                if note.is_some() {
                    t.note.clone_from(note);
                }
                t.carried_outputs.clone_from(outputs);
                row.changed = true;
            }
            WriteResult::Done
        }
        (Write::RunState { run, from, to, at }, Some(row)) => {
            if row.state != *from {
                return WriteResult::run_conflict(*run, Some(row.state.as_str()), *from);
            }
            let at = at.as_microsecond();
            row.state = *to;
            if *to == RunState::Running {
                row.started_at = Some(at);
            }
            if to.is_terminal() {
                row.finished_at = Some(at);
            }
            row.changed = true;
            WriteResult::Done
        }
        (Write::RunClosing { to, .. }, Some(row)) => {
            row.closing = Some(*to);
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::TaskState {
                run,
                task,
                from,
                to,
            },
            Some(row),
        ) => {
            let Some(t) = row.task_mut(task) else {
                return WriteResult::task_conflict(*run, task, None, *from);
            };
            if t.state != *from {
                return WriteResult::task_conflict(*run, task, Some(t.state.as_str()), *from);
            }
            t.state = *to;
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::AttemptStart {
                run,
                task,
                number,
                state,
                at,
                run_on,
                priority,
            },
            Some(row),
        ) => {
            let Some(t) = row.task_mut(task) else {
                return no_task(*run, task, *number);
            };
            if t.attempt_mut(*number).is_some() {
                return WriteResult::attempt_exists(*run, task, number);
            }
            let shared = *state == AttemptState::Dispatching;
            let at = at.as_microsecond();
            t.attempts.push(Attempt {
                number: *number,
                state: *state,
                started_at: at,
                finished_at: None,
                exit_code: None,
                error: None,
                // An attempt handed to the cluster has no node until one claims it.
                node_epoch: epoch.filter(|_| !shared),
                start_error_us: None,
                outputs: Default::default(),
            });
            t.attempts.sort_by_key(|a| a.number);
            if shared {
                let labels = run_on.as_ref().map(crate::rows::labels_json);
                effects
                    .queued
                    .push((*run, task, *number, at, *priority, labels));
            }
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::AttemptEnd {
                run,
                task,
                number,
                from,
                to,
                at,
                exit_code,
                error,
                log,
                lines,
                start_error_us,
                outputs,
                for_other_node,
            },
            Some(row),
        ) => {
            let Some(a) = row
                .task_mut(task)
                .and_then(|t| t.attempt_mut(*number))
                .filter(|a| a.state == *from)
            else {
                return WriteResult::attempt_conflict(*run, task, number, from.as_str());
            };
            if a.node_epoch.is_none() && a.state == AttemptState::Dispatching {
                effects.unqueued.push((*run, task, *number));
            }
            a.state = *to;
            a.finished_at = Some(at.as_microsecond());
            a.exit_code = *exit_code;
            a.error.clone_from(error);
            a.start_error_us = *start_error_us;
            a.outputs.clone_from(outputs);
            if !log.is_empty() {
                effects.logs.push((*run, task, *number, log, lines));
            }
            if *for_other_node {
                effects.ended_for_others.push(*run);
            }
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::AttemptWithdraw {
                run,
                task,
                number,
                at,
            },
            Some(row),
        ) => {
            let Some(t) = row.task_mut(task) else {
                return WriteResult::Done;
            };
            let unfinished =
                |s: AttemptState| matches!(s, AttemptState::Dispatching | AttemptState::Running);
            let mut changed = false;
            if let Some(a) = t.attempt_mut(*number).filter(|a| unfinished(a.state)) {
                if a.node_epoch.is_none() && a.state == AttemptState::Dispatching {
                    effects.unqueued.push((*run, task, *number));
                }
                a.state = AttemptState::Cancelled;
                a.finished_at = Some(at.as_microsecond());
                a.error = Some(crate::WITHDRAWN.to_string());
                changed = true;
            }
            if matches!(t.state, TaskState::Dispatching | TaskState::Running) {
                t.state = TaskState::Cancelled;
                changed = true;
            }
            row.changed |= changed;
            WriteResult::Done
        }
    }
}

fn no_task(run: RunId, task: &str, number: u32) -> WriteResult {
    WriteResult::Conflict(format!(
        "attempt {number} of {run}/{task}: run {run} has no task {task}"
    ))
}

/// Claims a waiting attempt of `row` for node `epoch`: it runs there from
/// `at`. False if it no longer waits (withdrawn or ended meanwhile).
pub fn claim(row: &mut Row, task: &str, number: u32, epoch: i64, at: i64) -> bool {
    let Some(t) = row.task_mut(task) else {
        return false;
    };
    let Some(a) = t
        .attempt_mut(number)
        .filter(|a| a.state == AttemptState::Dispatching && a.node_epoch.is_none())
    else {
        return false;
    };
    a.state = AttemptState::Running;
    a.node_epoch = Some(epoch);
    a.started_at = at;
    if t.state == TaskState::Dispatching {
        t.state = TaskState::Running;
    }
    row.changed = true;
    true
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use jiff::Timestamp;

    use super::*;

    fn run() -> Row {
        Row::new(&NewRun {
            items: Default::default(),
            carried_outputs: Default::default(),
            id: 1,
            namespace: "ns".into(),
            job: "j".into(),
            job_version: 1,
            trigger: crate::Trigger::Manual,
            scheduled_at: Timestamp::from_second(1).unwrap(),
            params: BTreeMap::new(),
            state: RunState::Running,
            tasks: vec!["a".into(), "b".into()],
            created_at: Timestamp::from_second(1).unwrap(),
            trace: None,
            rerun_of: None,
            carried: BTreeMap::new(),
            key: None,
        })
    }

    fn start(task: &str, state: AttemptState) -> Write {
        Write::AttemptStart {
            priority: Default::default(),
            run: 1,
            task: task.into(),
            number: 1,
            state,
            at: Timestamp::from_second(2).unwrap(),
            run_on: None,
        }
    }

    #[test]
    fn tasks_round_trip_through_their_json() {
        let mut row = run();
        let mut effects = Effects::default();
        let w = start("a", AttemptState::Running);
        assert_eq!(
            apply(Some(&mut row), &w, Some(7), &mut effects),
            WriteResult::Done
        );
        let json = row.tasks_json();
        assert_eq!(parse_tasks(1, &json).unwrap(), row.tasks);
        assert!(
            !json.contains("null") && !json.contains("carried"),
            "absent fields are left out: {json}"
        );
        assert!(parse_tasks(1, "[{\"id\":\"a\",\"state\":\"bogus\"}]").is_err());
    }

    #[test]
    fn an_attempt_handed_to_the_cluster_is_queued_and_leaves_the_queue_once() {
        let mut row = run();
        let mut effects = Effects::default();
        let w = start("b", AttemptState::Dispatching);
        apply(Some(&mut row), &w, Some(7), &mut effects);
        assert_eq!(effects.queued.len(), 1);
        assert_eq!(row.tasks[1].attempts[0].node_epoch, None);
        let withdraw = Write::AttemptWithdraw {
            run: 1,
            task: "b".into(),
            number: 1,
            at: Timestamp::from_second(3).unwrap(),
        };
        apply(Some(&mut row), &withdraw, Some(7), &mut effects);
        apply(Some(&mut row), &withdraw, Some(7), &mut effects);
        assert_eq!(effects.unqueued, [(1, "b", 1)]);
        assert_eq!(row.tasks[1].attempts[0].state, AttemptState::Cancelled);
        assert!(
            !claim(&mut row, "b", 1, 9, 4),
            "a withdrawn attempt is not claimed"
        );
    }

    #[test]
    fn a_claimed_attempt_runs_on_the_claiming_node() {
        let mut row = run();
        let mut effects = Effects::default();
        row.tasks[1].state = TaskState::Dispatching;
        apply(
            Some(&mut row),
            &start("b", AttemptState::Dispatching),
            Some(7),
            &mut effects,
        );
        assert!(claim(&mut row, "b", 1, 9, 4_000_000));
        let (t, a) = (&row.tasks[1], &row.tasks[1].attempts[0]);
        assert_eq!(
            (t.state, a.state, a.node_epoch),
            (TaskState::Running, AttemptState::Running, Some(9))
        );
        assert!(!claim(&mut row, "b", 1, 9, 4_000_000), "claimed once");
    }

    #[test]
    fn refused_changes_say_what_they_found_and_change_nothing() {
        let mut row = run();
        let before = row.clone();
        let mut effects = Effects::default();
        let to = |from, to| Write::TaskState {
            run: 1,
            task: "a".into(),
            from,
            to,
        };
        let ready_to_running = to(TaskState::Ready, TaskState::Running);
        let r = apply(Some(&mut row), &ready_to_running, None, &mut effects);
        assert_eq!(
            r,
            WriteResult::Conflict("task a of run 1 is pending, not ready".into())
        );
        let end = Write::AttemptEnd {
            outputs: Default::default(),
            run: 1,
            task: "a".into(),
            number: 1,
            from: AttemptState::Running,
            to: AttemptState::Succeeded,
            at: Timestamp::from_second(3).unwrap(),
            exit_code: Some(0),
            error: None,
            log: b"out".to_vec(),
            lines: Vec::new(),
            start_error_us: None,
            for_other_node: false,
        };
        assert!(matches!(
            apply(Some(&mut row), &end, None, &mut effects),
            WriteResult::Conflict(_)
        ));
        assert!(matches!(
            apply(None, &end, None, &mut effects),
            WriteResult::Conflict(_)
        ));
        assert_eq!(row, before);
        assert!(effects.logs.is_empty());
    }
}
