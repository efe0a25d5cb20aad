//! What becomes of an unfinished run found in the store at start-up, or
//! adopted from a dead node: which of its attempts go on (still running on
//! a live node, or waiting in the cluster's queue), which were lost with
//! the process that ran them and are the run's to decide about (retried or
//! failed by its delivery policy), which are merely recorded lost (an
//! older attempt left unfinished), and which tasks were left moving with no
//! attempt at all. The engine rebuilds the run's machine from
//! [`Recovery::tasks`], records [`Recovery::stray`] lost, and steps the
//! machine through [`Recovery::events`].

use super::{Attempt, End, Event, StoredTask};
use crate::retry::Failure;
use crate::state::IllegalTransition;
use crate::state::{AttemptState, RunState, TaskState};

/// A stored attempt, as recovery sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundAttempt {
    /// Its number.
    pub number: u32,
    /// Its state.
    pub state: AttemptState,
    /// The node that runs it (none: waiting in the cluster's queue, or a
    /// store used by one node).
    pub node_epoch: Option<i64>,
}

/// A stored task, as recovery sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundTask {
    /// Its place among the tasks of the job's version the run runs (none:
    /// that version has no such task; it is left alone).
    pub index: Option<usize>,
    /// Its state.
    pub state: TaskState,
    /// Its attempts.
    pub attempts: Vec<FoundAttempt>,
}

/// What recovery decided for one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The tasks to rebuild the run's machine from, by index. An attempt
    /// that goes on is its task's current attempt, marked shared (run by
    /// another node, or waiting for one); the engine unmarks one it runs
    /// itself.
    pub tasks: Vec<StoredTask>,
    /// The attempts that go on: task index and number.
    pub going_on: Vec<(usize, u32)>,
    /// Attempts to record lost and nothing more: the position of their
    /// task among the found tasks, their number and their state now.
    pub stray: Vec<(usize, u32, AttemptState)>,
    /// The events to step the rebuilt machine through, in order: the
    /// attempts lost here, the tasks left moving with no attempt, and the
    /// run resuming (its deadline counting from `started`).
    pub events: Vec<Event>,
}

/// Decides the recovery of a run in `state` whose job version has `tasks`
/// tasks, from its `found` tasks; `alive` says whether a node epoch is a
/// live node. `started` is when the run started (its deadline counts from
/// then).
pub fn recover(
    state: RunState,
    tasks: usize,
    found: &[FoundTask],
    alive: impl Fn(i64) -> bool,
    started: jiff::Timestamp,
) -> Recovery {
    let mut rebuilt = vec![
        StoredTask {
            state: TaskState::Pending,
            attempts: 0,
            current: None,
        };
        tasks
    ];
    let mut going_on = Vec::new();
    let mut stray = Vec::new();
    let mut lost_here = Vec::new();
    let mut orphans = Vec::new();
    let running = state == RunState::Running;
    for (k, t) in found.iter().enumerate() {
        let Some(i) = t.index.filter(|i| *i < tasks) else {
            continue;
        };
        let task = &mut rebuilt[i];
        task.state = t.state;
        task.attempts = t.attempts.iter().map(|a| a.number).max().unwrap_or(0);
        let goes_on = t.attempts.iter().find(|a| {
            !a.state.is_terminal()
                && match a.node_epoch {
                    None => a.state == AttemptState::Dispatching,
                    Some(e) => alive(e),
                }
        });
        if let Some(a) = goes_on {
            task.current = Some(Attempt {
                number: a.number,
                state: a.state,
                shared: true,
            });
            going_on.push((i, a.number));
            continue;
        }
        let moving = matches!(t.state, TaskState::Running | TaskState::Dispatching);
        if moving && running {
            orphans.push(i);
        }
        for a in t.attempts.iter().filter(|a| !a.state.is_terminal()) {
            if moving && running && a.number == task.attempts {
                // Its run decides what follows.
                task.current = Some(Attempt {
                    number: a.number,
                    state: a.state,
                    shared: false,
                });
                lost_here.push((i, a.number));
            } else if a.state.to(AttemptState::Lost).is_ok() {
                stray.push((k, a.number, a.state));
            }
        }
    }
    let mut events: Vec<Event> = lost_here
        .into_iter()
        .map(|(task, number)| Event::AttemptEnded {
            task,
            number,
            end: End::Failed(Failure::Lost),
            recorded: false,
        })
        .collect();
    // Those whose attempt is already recorded as over (killed at shutdown).
    events.extend(orphans.into_iter().map(|task| Event::Orphaned { task }));
    events.push(Event::Resume { started });
    Recovery {
        tasks: rebuilt,
        going_on,
        stray,
        events,
    }
}

/// An unfinished run whose job is gone (deleted while the server was down,
/// or on another node): nothing of it can run any more, so it ends
/// cancelled, its tasks and attempts left as recorded. Returns the run's
/// change of state, or why a run in `state` cannot be cancelled (it has
/// ended already).
pub fn orphaned_run(state: RunState) -> Result<(RunState, RunState), IllegalTransition> {
    Ok((state, state.to(RunState::Cancelled)?))
}

/// An attempt claimed from the cluster whose job or task is gone: it
/// cannot start, so it ends failed. Returns its change of state, or why
/// an attempt in `state` cannot fail (it has ended already).
pub fn unplaceable_attempt(
    state: AttemptState,
) -> Result<(AttemptState, AttemptState), IllegalTransition> {
    Ok((state, state.to(AttemptState::Failed)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(number: u32, state: AttemptState, node: Option<i64>) -> FoundAttempt {
        FoundAttempt {
            number,
            state,
            node_epoch: node,
        }
    }

    fn task(index: usize, state: TaskState, attempts: Vec<FoundAttempt>) -> FoundTask {
        FoundTask {
            index: Some(index),
            state,
            attempts,
        }
    }

    fn t0() -> jiff::Timestamp {
        jiff::Timestamp::UNIX_EPOCH
    }

    #[test]
    fn an_attempt_on_a_live_node_or_in_the_queue_goes_on() {
        let found = [
            task(
                0,
                TaskState::Running,
                vec![at(1, AttemptState::Running, Some(7))],
            ),
            task(
                1,
                TaskState::Dispatching,
                vec![at(1, AttemptState::Dispatching, None)],
            ),
        ];
        let r = recover(RunState::Running, 2, &found, |e| e == 7, t0());
        assert_eq!(r.going_on, [(0, 1), (1, 1)]);
        assert!(r.stray.is_empty());
        assert_eq!(r.events, [Event::Resume { started: t0() }]);
        assert!(r.tasks.iter().all(|t| t.current.is_some_and(|a| a.shared)));
    }

    #[test]
    fn the_last_attempt_lost_with_its_process_is_the_runs_to_decide() {
        let found = [task(
            0,
            TaskState::Running,
            vec![
                at(1, AttemptState::Running, None),
                at(2, AttemptState::Running, Some(3)),
            ],
        )];
        // Node 3 is dead; attempt 1 was left unfinished by an older crash.
        let r = recover(RunState::Running, 1, &found, |_| false, t0());
        assert!(r.going_on.is_empty());
        assert_eq!(r.stray, [(0, 1, AttemptState::Running)]);
        assert_eq!(
            r.events,
            [
                Event::AttemptEnded {
                    task: 0,
                    number: 2,
                    end: End::Failed(Failure::Lost),
                    recorded: false,
                },
                Event::Orphaned { task: 0 },
                Event::Resume { started: t0() },
            ]
        );
        assert_eq!(r.tasks[0].attempts, 2);
        assert_eq!(r.tasks[0].current.map(|a| a.shared), Some(false));
    }

    #[test]
    fn a_run_not_running_only_records_its_unfinished_attempts_lost() {
        let found = [task(
            0,
            TaskState::Running,
            vec![at(1, AttemptState::Running, None)],
        )];
        let r = recover(RunState::Pending, 1, &found, |_| true, t0());
        assert_eq!(r.stray, [(0, 1, AttemptState::Running)]);
        assert_eq!(r.events, [Event::Resume { started: t0() }]);
    }

    #[test]
    fn tasks_the_version_does_not_have_are_left_alone() {
        let found = [
            FoundTask {
                index: None,
                state: TaskState::Running,
                attempts: vec![at(1, AttemptState::Running, None)],
            },
            task(
                5,
                TaskState::Running,
                vec![at(1, AttemptState::Running, None)],
            ),
        ];
        let r = recover(RunState::Running, 1, &found, |_| true, t0());
        assert!(r.stray.is_empty() && r.going_on.is_empty());
        assert_eq!(r.events, [Event::Resume { started: t0() }]);
        assert_eq!(r.tasks[0].state, TaskState::Pending);
    }

    #[test]
    fn a_run_whose_job_is_gone_ends_cancelled_unless_it_has_ended() {
        for state in [RunState::Planned, RunState::Pending, RunState::Running] {
            assert_eq!(orphaned_run(state), Ok((state, RunState::Cancelled)));
        }
        for state in [RunState::Succeeded, RunState::Failed, RunState::Cancelled] {
            assert!(orphaned_run(state).is_err(), "{state:?} has ended");
        }
    }

    #[test]
    fn a_claim_whose_job_or_task_is_gone_fails_unless_it_has_ended() {
        for state in [AttemptState::Dispatching, AttemptState::Running] {
            assert_eq!(
                unplaceable_attempt(state),
                Ok((state, AttemptState::Failed))
            );
        }
        assert!(unplaceable_attempt(AttemptState::Succeeded).is_err());
    }
}
