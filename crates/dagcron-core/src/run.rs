//! The run state machine: a run, its tasks and their attempts step on
//! [`Event`]s and return the [`Effect`]s to carry out.
//!
//! Nothing here does anything: time and randomness are arguments, and the
//! caller records the effects (in order, in one transaction) before it acts
//! on them (starts or kills attempts, arms timers). Every change of state
//! goes through the transition tables of [`crate::state`]; a change that is
//! not in them is an [`IllegalTransition`] and changes nothing it has not
//! already returned.
//!
//! Events that no longer apply (a ready task already cancelled, the result
//! of an attempt that was replaced, a retry timer of a stopping run) are
//! ignored: they are the normal races of timers and attempts, not errors.

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use crate::model::{Delivery, Job, OnExhausted};
use crate::policy;
use crate::retry::{Failure, RetryDecision};
use crate::state::{AttemptState, IllegalTransition, RunState, TaskState};

/// How an attempt ended, as the run sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// Finished well.
    Succeeded,
    /// Finished with an exit code of its task's `skip_on_exit_code`: the
    /// task is skipped.
    Skipped,
    /// Stopped by a cancel (its run is stopping).
    Cancelled,
    /// Finished badly: the failure decides whether it is retried
    /// ([`Failure::Timeout`] records the attempt as timed out, [`Failure::Lost`]
    /// as lost).
    Failed(Failure),
}

impl End {
    /// The state the attempt ends in.
    pub fn attempt_state(&self) -> AttemptState {
        match self {
            End::Succeeded => AttemptState::Succeeded,
            End::Skipped => AttemptState::Skipped,
            End::Cancelled => AttemptState::Cancelled,
            End::Failed(Failure::Timeout) => AttemptState::TimedOut,
            End::Failed(Failure::Lost) => AttemptState::Lost,
            End::Failed(_) => AttemptState::Failed,
        }
    }
}

/// What an operator does to one task of a run that goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Intervention {
    /// A held task gets a new attempt now (counting past its retry
    /// policy's `max_attempts`; held again if it fails).
    Retry,
    /// A held, failed or `upstream_failed` task counts as succeeded: the
    /// tasks downstream that did not run because of it are decided again.
    MarkSucceeded,
    /// As [`Intervention::MarkSucceeded`], counting as skipped.
    MarkSkipped,
    /// A held task fails (and its run goes on by the trigger rules).
    Fail,
}

impl Intervention {
    /// Every intervention.
    pub const ALL: &'static [Intervention] = &[
        Intervention::Retry,
        Intervention::MarkSucceeded,
        Intervention::MarkSkipped,
        Intervention::Fail,
    ];

    /// Its name in the API, the command line and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Intervention::Retry => "retry",
            Intervention::MarkSucceeded => "mark_succeeded",
            Intervention::MarkSkipped => "mark_skipped",
            Intervention::Fail => "fail",
        }
    }

    /// Whether it applies to a task in `state` (of a run that goes on):
    /// any to a held task; marking also to a failed or `upstream_failed` one.
    pub fn applies_to(self, state: TaskState) -> Result<(), Refused> {
        let ok = match self {
            Intervention::Retry | Intervention::Fail => state == TaskState::Held,
            Intervention::MarkSucceeded | Intervention::MarkSkipped => matches!(
                state,
                TaskState::Held | TaskState::Failed | TaskState::UpstreamFailed
            ),
        };
        if ok {
            Ok(())
        } else {
            Err(Refused::TaskState { asked: self, state })
        }
    }

    /// The state it moves the task to.
    fn target(self) -> TaskState {
        match self {
            Intervention::Retry => TaskState::Ready,
            Intervention::MarkSucceeded => TaskState::Succeeded,
            Intervention::MarkSkipped => TaskState::Skipped,
            Intervention::Fail => TaskState::Failed,
        }
    }
}

impl std::str::FromStr for Intervention {
    type Err = String;
    fn from_str(s: &str) -> Result<Intervention, String> {
        Intervention::ALL
            .iter()
            .copied()
            .find(|i| i.as_str() == s)
            .ok_or_else(|| {
                format!("unknown action {s:?}: one of retry, mark_succeeded, mark_skipped, fail")
            })
    }
}

/// Why an intervention on a task is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The run waits for a slot: none of its tasks has started.
    NotStarted,
    /// The run is being stopped, to end in this state.
    Stopping(RunState),
    /// The run has ended, in this state.
    Ended(RunState),
    /// The task is not in a state this intervention applies to.
    TaskState {
        /// What was asked.
        asked: Intervention,
        /// The task's state.
        state: TaskState,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // A run that succeeded has nothing to re-run from its failed
            // tasks: only a whole re-run is of use then.
            Refused::Ended(RunState::Succeeded) => f.write_str(
                "the run has ended succeeded: nothing of it can change; re-run it whole if it must run again (`runs rerun ID`)",
            ),
            Refused::Ended(state) => write!(
                f,
                "the run has ended {state}: re-run it instead (`runs rerun ID --failed` runs its failed tasks again and keeps the others' outcomes)"
            ),
            Refused::NotStarted => f.write_str("the run has not started: it waits for a slot"),
            Refused::Stopping(state) => write!(f, "the run is stopping, to end {state}"),
            Refused::TaskState { asked, state } => {
                let which = match asked {
                    Intervention::Retry | Intervention::Fail => "held",
                    _ => "held, failed or upstream_failed",
                };
                write!(
                    f,
                    "the task is {state}: only a {which} task can be given {}",
                    asked.as_str()
                )
            }
        }
    }
}

impl std::error::Error for Refused {}

/// Whether a run in `state`, stopping to end in `closing` if it is, goes
/// on, so that its tasks can be acted on.
pub fn going_on(state: RunState, closing: Option<RunState>) -> Result<(), Refused> {
    match (state, closing) {
        (RunState::Pending, _) => Err(Refused::NotStarted),
        (state, _) if state.is_terminal() => Err(Refused::Ended(state)),
        (_, Some(closing)) => Err(Refused::Stopping(closing)),
        _ => Ok(()),
    }
}

/// What happens to a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The run enters `running` (from `planned` or `pending`, or made
    /// running): its
    /// deadline is armed and its first tasks planned.
    Begin,
    /// The instant of a `planned` run has come: it waits for a slot
    /// (`pending`), or a policy declines it (`skipped`: its misfire policy
    /// when the instant passed while the server was down, or its overlap
    /// policy).
    Due {
        /// Declined.
        skip: bool,
    },
    /// A rebuilt run (after a restart, or taken over from a dead node) goes
    /// on: ready tasks are queued again, retries armed at once, the
    /// deadline armed from `started`, then the DAG is planned.
    Resume {
        /// When the run started (its deadline counts from there).
        started: Timestamp,
    },
    /// Ready task `task` gets its next attempt: here (it runs at once), or
    /// `shared` with the cluster (it waits to be claimed by a node).
    Dispatch {
        /// The task's index.
        task: usize,
        /// Handed to the cluster instead of run here.
        shared: bool,
    },
    /// A node took the shared attempt `number` of `task` and runs it (the
    /// claiming node recorded that).
    Claimed {
        /// The task's index.
        task: usize,
        /// The attempt.
        number: u32,
        /// This node claimed it back: it runs here now.
        here: bool,
    },
    /// Attempt `number` of `task` ended.
    AttemptEnded {
        /// The task's index.
        task: usize,
        /// The attempt.
        number: u32,
        /// How.
        end: End,
        /// Its end is already recorded (by the node that ran it).
        recorded: bool,
    },
    /// The backoff of `task` is over.
    RetryDue {
        /// The task's index.
        task: usize,
    },
    /// Stop the run, to end in `final_state` (cancelled by a user or a
    /// `replace`, failed at its deadline): pending work is cancelled,
    /// attempts running here are killed, shared ones withdrawn; the run ends
    /// once every task has.
    Stop {
        /// The state the run ends in (a pending run is always cancelled).
        final_state: RunState,
    },
    /// `task` is under way but its attempt is over without its end having
    /// been taken in (it was killed at shutdown and recorded as lost): it
    /// fails as lost, retried or not by its retry and delivery policies.
    Orphaned {
        /// The task's index.
        task: usize,
    },
    /// An operator acts on `task` (see [`RunMachine::may_intervene`]; an
    /// intervention that does not apply changes nothing).
    Intervene {
        /// The task's index.
        task: usize,
        /// What is done.
        action: Intervention,
    },
    /// Attempt `number` of `task` was killed at shutdown: it is recorded as
    /// lost, and nothing follows from it (the next start decides by the
    /// delivery policy, through [`Event::Orphaned`]).
    Abandoned {
        /// The task's index.
        task: usize,
        /// The attempt.
        number: u32,
    },
}

/// What to carry out, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Record the run's change of state.
    Run {
        /// Before.
        from: RunState,
        /// After.
        to: RunState,
    },
    /// Record that the run is stopping and the state it will end in (before
    /// anything is stopped: after a crash, its lost attempts are not retried).
    Closing {
        /// The state it ends in.
        to: RunState,
    },
    /// Record a task's change of state.
    Task {
        /// The task's index.
        task: usize,
        /// Before.
        from: TaskState,
        /// After.
        to: TaskState,
    },
    /// Record a new attempt: `running` is to be started here once recorded,
    /// `dispatching` waits to be claimed by a node of the cluster.
    AttemptStarted {
        /// The task's index.
        task: usize,
        /// Its number (1-based).
        number: u32,
        /// Running (here) or dispatching (shared).
        state: AttemptState,
    },
    /// Record the end of an attempt (with its output, which the caller has).
    AttemptEnded {
        /// The task's index.
        task: usize,
        /// The attempt.
        number: u32,
        /// Before.
        from: AttemptState,
        /// After.
        to: AttemptState,
    },
    /// Withdraw a shared attempt, claimed or not, and cancel its task: a
    /// node running it sees that and stops it.
    Withdraw {
        /// The task's index.
        task: usize,
        /// The attempt.
        number: u32,
    },
    /// Tell the attempt of `task` running here to stop (its end follows as
    /// an [`Event::AttemptEnded`]).
    Kill {
        /// The task's index.
        task: usize,
    },
    /// Mapped task `task` expands into one instance per item (each item's
    /// JSON), the next slots of the run in order (see
    /// [`RunMachine::instances`]): record them, `pending`.
    Expand {
        /// The mapped task's index.
        task: usize,
        /// The items.
        items: Vec<String>,
    },
    /// Record why mapped task `task` has no instances (no items, or a list
    /// it could not take), or why its instances' outputs could not be
    /// handed downstream.
    Note {
        /// The mapped task's index.
        task: usize,
        /// What happened.
        note: String,
    },
    /// `task` may start: queue it for a worker.
    Ready {
        /// The task's index.
        task: usize,
    },
    /// Step [`Event::RetryDue`] for `task` at `at`.
    ArmRetry {
        /// The task's index.
        task: usize,
        /// When.
        at: Timestamp,
    },
    /// Step [`Event::Stop`] with `failed` at `at`.
    ArmDeadline {
        /// When.
        at: Timestamp,
    },
    /// The run is over, in `state` (its change is recorded above).
    Finished {
        /// The final state.
        state: RunState,
    },
}

/// The current (latest) attempt of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Its number (1-based).
    pub number: u32,
    /// Its state.
    pub state: AttemptState,
    /// Handed to the cluster (not run by this node).
    pub shared: bool,
}

/// A task of a rebuilt run, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTask {
    /// Its state.
    pub state: TaskState,
    /// The highest attempt number it has had.
    pub attempts: u32,
    /// Its attempt that goes on (not finished and still running somewhere,
    /// or waiting to be claimed), if any.
    pub current: Option<Attempt>,
}

/// What a run's `when` conditions read: its parameters and the outputs of
/// its tasks, by index (none for a task without any).
#[derive(Clone, Copy)]
pub struct RunData<'a> {
    /// The run's parameters.
    pub params: &'a std::collections::BTreeMap<String, String>,
    /// Each task's outputs, by slot (a mapped task's: its instances',
    /// gathered in lists).
    pub outputs: &'a [Option<std::sync::Arc<crate::outputs::Outputs>>],
}

static NO_PARAMS: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();

impl RunData<'static> {
    /// No parameters and no outputs.
    pub const NONE: RunData<'static> = RunData {
        params: &NO_PARAMS,
        outputs: &[],
    };
}

/// The outputs of a run's task by its index.
type Lookup<'l, 'o> = &'l dyn Fn(usize) -> Option<&'o Outputs>;

impl<'a> RunData<'a> {
    /// Whether task `task` of `job` runs once it may start: its `when`
    /// holds (or it has none).
    pub fn runs(&self, job: &Job, task: usize) -> bool {
        self.runs_over(job, task, &|i| self.outputs.get(i)?.as_deref())
    }

    /// [`RunData::runs`], the tasks' outputs read through `of`.
    fn runs_over<'o>(&self, job: &Job, task: usize, of: Lookup<'_, 'o>) -> bool {
        let Some(when) = &job.tasks[task].when else {
            return true;
        };
        let outputs = |id: &str| of(job.tasks.iter().position(|t| t.id == id)?);
        when.holds(&crate::condition::Facts {
            params: self.params,
            outputs: &outputs,
        })
    }

    /// The items mapped task `task` of `job` expands into, or why it has
    /// none to take; the tasks' outputs read through `of`.
    fn items(&self, job: &Job, task: usize, of: Lookup<'_, '_>) -> Result<Vec<String>, String> {
        let source = job.tasks[task].for_each.as_ref().expect("a mapped task");
        source.items(self.params, |r| {
            of(job.tasks.iter().position(|t| t.id == r.task)?)?
                .get(&r.key)
                .cloned()
        })
    }

    /// What the instances in `slots` hand downstream together.
    fn gathered(&self, slots: std::ops::Range<usize>) -> Result<Outputs, String> {
        crate::fan_out::gather(slots.map(|s| self.outputs.get(s).and_then(|o| o.as_deref())))
    }
}

use crate::outputs::Outputs;

/// One run: its state, its tasks' states and their current attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunMachine {
    state: RunState,
    /// By slot: the job's tasks, then the instances of its mapped tasks.
    tasks: Vec<TaskState>,
    attempts: Vec<u32>,
    current: Vec<Option<Attempt>>,
    closing: Option<RunState>,
    /// The job's task each instance is of, by slot past the job's tasks.
    instance_of: Vec<usize>,
    /// The slots of each job task's instances, once it is expanded.
    mapped: Vec<Option<std::ops::Range<usize>>>,
    /// What each mapped task that succeeded here hands downstream.
    gathered: Vec<Option<std::sync::Arc<Outputs>>>,
}

type Step = Result<(), IllegalTransition>;

impl RunMachine {
    /// A new run of a job with `tasks` tasks, `pending` (waiting for a slot)
    /// or `running`.
    pub fn new(tasks: usize, state: RunState) -> RunMachine {
        RunMachine::carrying(state, vec![TaskState::Pending; tasks], vec![])
    }

    /// A new run whose slots start in `tasks`: `pending`, or for a re-run
    /// the `succeeded` or `skipped` outcome a task keeps from the run it
    /// re-runs (see [`crate::rerun::start_states`]); `pending` or `running`.
    /// A re-run keeps the expansion of the mapped tasks it runs again: the
    /// slots past the job's tasks are their instances, of the job's task
    /// `instance_of` names for each, in order.
    pub fn carrying(state: RunState, tasks: Vec<TaskState>, instance_of: Vec<usize>) -> RunMachine {
        debug_assert!(tasks.iter().all(|t| matches!(
            t,
            TaskState::Pending | TaskState::Succeeded | TaskState::Skipped
        )));
        let tasks = tasks
            .into_iter()
            .map(|state| StoredTask {
                state,
                attempts: 0,
                current: None,
            })
            .collect();
        RunMachine::rebuilt(state, None, tasks, instance_of)
    }

    /// A run rebuilt from the store, its slots as [`RunMachine::carrying`]
    /// has them. Its tasks' attempts that do not go on must be ended by the
    /// caller first ([`Event::AttemptEnded`] of a [`Failure::Lost`] for the
    /// task's current attempt).
    pub fn rebuilt(
        state: RunState,
        closing: Option<RunState>,
        tasks: Vec<StoredTask>,
        instance_of: Vec<usize>,
    ) -> Self {
        let declared = tasks.len() - instance_of.len();
        let mut mapped: Vec<Option<std::ops::Range<usize>>> = vec![None; declared];
        for (k, &parent) in instance_of.iter().enumerate() {
            let slot = declared + k;
            let range = mapped[parent].get_or_insert(slot..slot);
            debug_assert_eq!(range.end, slot, "the instances of a task are together");
            range.end = slot + 1;
        }
        RunMachine {
            state,
            attempts: tasks.iter().map(|t| t.attempts).collect(),
            current: tasks.iter().map(|t| t.current).collect(),
            tasks: tasks.into_iter().map(|t| t.state).collect(),
            closing,
            instance_of,
            gathered: vec![None; mapped.len()],
            mapped,
        }
    }

    /// The job's task `slot` runs: itself, or the mapped task it is an
    /// instance of.
    pub fn task_of(&self, slot: usize) -> usize {
        let declared = self.mapped.len();
        if slot < declared {
            slot
        } else {
            self.instance_of[slot - declared]
        }
    }

    /// The slots of the instances of `task`, once it is expanded.
    pub fn instances(&self, task: usize) -> Option<std::ops::Range<usize>> {
        self.mapped.get(task).cloned().flatten()
    }

    /// The job's task each instance slot is of, in order.
    pub fn instance_of(&self) -> &[usize] {
        &self.instance_of
    }

    /// What mapped task `task` hands downstream, once it has succeeded
    /// here: its instances' outputs, gathered in lists.
    pub fn gathered_outputs(&self, task: usize) -> Option<&std::sync::Arc<Outputs>> {
        self.gathered.get(task)?.as_ref()
    }

    /// The outputs of the run's tasks by index: those `data` has, and the
    /// lists of the mapped tasks that succeeded in this step.
    fn lookup<'s>(&'s self, data: RunData<'s>) -> impl Fn(usize) -> Option<&'s Outputs> {
        move |i| match self.gathered.get(i) {
            Some(Some(g)) => Some(&**g),
            _ => data.outputs.get(i)?.as_deref(),
        }
    }

    /// The run's state.
    pub fn state(&self) -> RunState {
        self.state
    }

    /// Whether the run was asked to stop and has not ended yet.
    pub fn stopping(&self) -> bool {
        self.closing.is_some() && !self.state.is_terminal()
    }

    /// The state of every slot: the job's tasks, then the instances.
    pub fn tasks(&self) -> &[TaskState] {
        &self.tasks
    }

    /// The current attempt of `task`.
    pub fn attempt(&self, task: usize) -> Option<Attempt> {
        self.current[task]
    }

    /// Whether an operator may do `action` to `task` now: the run goes on
    /// (not stopping), and the task is held (any action) or, to be marked,
    /// failed or `upstream_failed`.
    pub fn may_intervene(&self, task: usize, action: Intervention) -> Result<(), Refused> {
        going_on(self.state, self.closing)?;
        action.applies_to(self.tasks[task])
    }

    /// Steps on `event` at `now` (`random` gives the jitter of a retry) and
    /// appends what to carry out to `out`, for a run with no parameters
    /// nor outputs (see [`RunMachine::step_with`]).
    pub fn step(
        &mut self,
        job: &Job,
        event: Event,
        now: Timestamp,
        random: &mut dyn FnMut() -> u64,
        out: &mut Vec<Effect>,
    ) -> Step {
        self.step_with(job, RunData::NONE, event, now, random, out)
    }

    /// [`RunMachine::step`] for a run with `data`: a task whose trigger
    /// rule lets it start and whose `when` does not hold is skipped.
    pub fn step_with(
        &mut self,
        job: &Job,
        data: RunData<'_>,
        event: Event,
        now: Timestamp,
        random: &mut dyn FnMut() -> u64,
        out: &mut Vec<Effect>,
    ) -> Step {
        if self.state.is_terminal() {
            return Ok(());
        }
        match event {
            Event::Begin => {
                if matches!(self.state, RunState::Planned | RunState::Pending) {
                    self.set_run(RunState::Running, out)?;
                } else if self.state != RunState::Running {
                    return Ok(());
                }
                self.arm_deadline(job, now, out);
                self.advance(job, data, out)
            }
            Event::Due { skip } => {
                if self.state != RunState::Planned {
                    return Ok(());
                }
                if skip {
                    self.set_run(RunState::Skipped, out)?;
                    out.push(Effect::Finished {
                        state: RunState::Skipped,
                    });
                    return Ok(());
                }
                self.set_run(RunState::Pending, out)
            }
            Event::Resume { started } => {
                if self.state != RunState::Running {
                    return Ok(());
                }
                if let Some(closing) = self.closing {
                    // It was being stopped: finish stopping it.
                    return self.stop(job, data, closing, out);
                }
                for (task, state) in self.tasks.iter().enumerate() {
                    match state {
                        TaskState::Ready => out.push(Effect::Ready { task }),
                        TaskState::Retrying => out.push(Effect::ArmRetry { task, at: now }),
                        _ => {}
                    }
                }
                self.arm_deadline(job, started, out);
                self.advance(job, data, out)
            }
            Event::Dispatch { task, shared } => {
                if self.tasks[task] != TaskState::Ready || self.closing.is_some() {
                    return Ok(());
                }
                let number = self.attempts[task] + 1;
                self.attempts[task] = number;
                self.set_task(task, TaskState::Dispatching, out)?;
                let state = if shared {
                    AttemptState::Dispatching
                } else {
                    self.set_task(task, TaskState::Running, out)?;
                    AttemptState::Running
                };
                self.current[task] = Some(Attempt {
                    number,
                    state,
                    shared,
                });
                out.push(Effect::AttemptStarted {
                    task,
                    number,
                    state,
                });
                Ok(())
            }
            Event::Claimed { task, number, here } => {
                let Some(attempt) = self.current_of(task, number) else {
                    return Ok(());
                };
                if attempt.state == AttemptState::Dispatching {
                    self.claimed(task)?;
                }
                if let Some(a) = &mut self.current[task] {
                    a.shared = !here;
                }
                Ok(())
            }
            Event::AttemptEnded {
                task,
                number,
                end,
                recorded,
            } => {
                let Some(attempt) = self.current_of(task, number) else {
                    return Ok(());
                };
                if recorded && attempt.state == AttemptState::Dispatching {
                    // Claimed and ended elsewhere before this node saw it run.
                    self.claimed(task)?;
                }
                let from = self.current[task].expect("current").state;
                let to = from.to(end.attempt_state())?;
                self.current[task] = None;
                if !recorded {
                    out.push(Effect::AttemptEnded {
                        task,
                        number,
                        from,
                        to,
                    });
                }
                if self.tasks[task] == TaskState::Dispatching {
                    // Lost before it ran (its node died while handing it over).
                    return self.failed(job, data, task, number, Failure::Lost, now, random, out);
                }
                match end {
                    End::Succeeded => self.set_task(task, TaskState::Succeeded, out)?,
                    End::Skipped => self.set_task(task, TaskState::Skipped, out)?,
                    End::Cancelled => self.set_task(task, TaskState::Cancelled, out)?,
                    End::Failed(failure) => {
                        return self.failed(job, data, task, number, failure, now, random, out);
                    }
                }
                self.advance(job, data, out)
            }
            Event::RetryDue { task } => {
                if self.tasks[task] != TaskState::Retrying || self.closing.is_some() {
                    return Ok(());
                }
                self.set_task(task, TaskState::Ready, out)?;
                out.push(Effect::Ready { task });
                Ok(())
            }
            Event::Stop { final_state } => self.stop(job, data, final_state, out),
            Event::Orphaned { task } => {
                let moving = matches!(
                    self.tasks[task],
                    TaskState::Running | TaskState::Dispatching
                );
                if !moving || self.current[task].is_some() || self.instances(task).is_some() {
                    return Ok(());
                }
                let number = self.attempts[task];
                self.failed(job, data, task, number, Failure::Lost, now, random, out)
            }
            Event::Intervene { task, action } => {
                if self.may_intervene(task, action).is_err() {
                    return Ok(());
                }
                self.set_task(task, action.target(), out)?;
                match action {
                    Intervention::Retry => out.push(Effect::Ready { task }),
                    Intervention::MarkSucceeded | Intervention::MarkSkipped => {
                        self.reopen_downstream(job, task, out)?;
                        self.regather(job, data, task, out)?;
                    }
                    Intervention::Fail => {}
                }
                self.advance(job, data, out)
            }
            Event::Abandoned { task, number } => {
                let Some(attempt) = self.current_of(task, number) else {
                    return Ok(());
                };
                let to = attempt.state.to(AttemptState::Lost)?;
                self.current[task] = None;
                out.push(Effect::AttemptEnded {
                    task,
                    number,
                    from: attempt.state,
                    to,
                });
                Ok(())
            }
        }
    }

    /// The current attempt of `task` if it is `number` and not over.
    fn current_of(&self, task: usize, number: u32) -> Option<Attempt> {
        self.current[task].filter(|a| a.number == number && !a.state.is_terminal())
    }

    /// A shared attempt of `task` now runs on the node that claimed it
    /// (which recorded the change of the task and the attempt).
    fn claimed(&mut self, task: usize) -> Step {
        self.tasks[task] = self.tasks[task].to(TaskState::Running)?;
        if let Some(a) = &mut self.current[task] {
            a.state = a.state.to(AttemptState::Running)?;
        }
        Ok(())
    }

    fn set_run(&mut self, to: RunState, out: &mut Vec<Effect>) -> Step {
        let from = self.state;
        self.state = from.to(to)?;
        out.push(Effect::Run { from, to });
        Ok(())
    }

    fn set_task(&mut self, task: usize, to: TaskState, out: &mut Vec<Effect>) -> Step {
        let from = self.tasks[task];
        self.tasks[task] = from.to(to)?;
        out.push(Effect::Task { task, from, to });
        Ok(())
    }

    fn arm_deadline(&self, job: &Job, from: Timestamp, out: &mut Vec<Effect>) {
        if let Some(d) = job.spec.deadline {
            out.push(Effect::ArmDeadline {
                at: later(from, d.0),
            });
        }
    }

    /// Retries attempt `number` of `task` or gives up, by its retry policy,
    /// the job's delivery and whether the run is stopping.
    #[allow(clippy::too_many_arguments)]
    fn failed(
        &mut self,
        job: &Job,
        data: RunData<'_>,
        task: usize,
        number: u32,
        failure: Failure,
        now: Timestamp,
        random: &mut dyn FnMut() -> u64,
        out: &mut Vec<Effect>,
    ) -> Step {
        let decision = if failure == Failure::Lost && job.spec.delivery == Delivery::AtMostOnce {
            RetryDecision::GiveUp("at-most-once delivery")
        } else if self.closing.is_some() {
            RetryDecision::GiveUp("the run is stopping")
        } else {
            job.tasks[self.task_of(task)]
                .retry
                .decide(number, &failure, random())
        };
        match decision {
            RetryDecision::Retry(delay) => {
                self.set_task(task, TaskState::Retrying, out)?;
                out.push(Effect::ArmRetry {
                    task,
                    at: later(now, delay),
                });
            }
            RetryDecision::GiveUp(_)
                if self.closing.is_none()
                    && job.tasks[self.task_of(task)].on_exhausted == OnExhausted::Hold =>
            {
                // Its run waits for an operator (its deadline still applies).
                self.set_task(task, TaskState::Held, out)?;
            }
            RetryDecision::GiveUp(_) => self.set_task(task, TaskState::Failed, out)?,
        }
        self.advance(job, data, out)
    }

    /// `task` was marked: the tasks downstream of it that did not run
    /// because of it (`upstream_failed`, through a chain of such tasks) go
    /// back to `pending`, for planning to decide them again.
    fn reopen_downstream(&mut self, job: &Job, task: usize, out: &mut Vec<Effect>) -> Step {
        let Some(downstream) = job.dag.downstream.get(task) else {
            return Ok(()); // an instance: its mapped task decides
        };
        let mut stack = downstream.clone();
        while let Some(next) = stack.pop() {
            if self.tasks[next] == TaskState::UpstreamFailed {
                self.set_task(next, TaskState::Pending, out)?;
                stack.extend(job.dag.downstream[next].iter().copied());
            }
        }
        Ok(())
    }

    fn stop(
        &mut self,
        job: &Job,
        data: RunData<'_>,
        final_state: RunState,
        out: &mut Vec<Effect>,
    ) -> Step {
        match self.state {
            RunState::Planned | RunState::Pending => {
                self.set_run(RunState::Cancelled, out)?;
                out.push(Effect::Finished {
                    state: RunState::Cancelled,
                });
                return Ok(());
            }
            RunState::Running => {}
            _ => return Ok(()),
        }
        if self.closing.is_none() {
            self.state.to(final_state)?;
            out.push(Effect::Closing { to: final_state });
            self.closing = Some(final_state);
        }
        for task in 0..self.tasks.len() {
            match self.tasks[task] {
                TaskState::Pending | TaskState::Ready | TaskState::Retrying | TaskState::Held => {
                    self.set_task(task, TaskState::Cancelled, out)?;
                }
                TaskState::Running | TaskState::Dispatching => match self.current[task] {
                    Some(a) if a.shared => {
                        a.state.to(AttemptState::Cancelled)?;
                        self.tasks[task] = self.tasks[task].to(TaskState::Cancelled)?;
                        self.current[task] = None;
                        out.push(Effect::Withdraw {
                            task,
                            number: a.number,
                        });
                    }
                    Some(_) => out.push(Effect::Kill { task }),
                    None => {}
                },
                _ => {}
            }
        }
        self.advance(job, data, out)
    }

    /// Plans the DAG until nothing changes; ends the run when it is done.
    fn advance(&mut self, job: &Job, data: RunData<'_>, out: &mut Vec<Effect>) -> Step {
        if self.state != RunState::Running {
            return Ok(());
        }
        self.settle(job, data, out)?;
        if self.closing.is_none() {
            let rules: Vec<_> = job.tasks.iter().map(|t| t.trigger_rule).collect();
            loop {
                let declared = self.mapped.len();
                let changes = job.dag.plan(&rules, &self.tasks[..declared]);
                if changes.is_empty() {
                    break;
                }
                for (task, to) in changes {
                    // A task its condition declines is skipped where it
                    // would have started.
                    let to = if to == TaskState::Ready
                        && !data.runs_over(job, task, &self.lookup(data))
                    {
                        TaskState::Skipped
                    } else {
                        to
                    };
                    self.set_task(task, to, out)?;
                    if to == TaskState::Ready {
                        if job.tasks[task].for_each.is_some() {
                            self.expand(job, data, task, out)?;
                        } else {
                            out.push(Effect::Ready { task });
                        }
                    }
                }
            }
        }
        let outcome = match self.closing {
            Some(closing) => self
                .tasks
                .iter()
                .all(|t| t.is_terminal())
                .then_some(closing),
            None => policy::run_outcome(&self.tasks[..self.mapped.len()]),
        };
        if let Some(state) = outcome {
            self.set_run(state, out)?;
            out.push(Effect::Finished { state });
        }
        Ok(())
    }

    /// Ready mapped task `task` starts its instances: expanded now into
    /// one per item (unless a re-run kept its expansion), `running` while
    /// they are; skipped with no items, failed with a list it cannot take.
    fn expand(&mut self, job: &Job, data: RunData<'_>, task: usize, out: &mut Vec<Effect>) -> Step {
        if self.instances(task).is_none() {
            let items = data.items(job, task, &self.lookup(data)).and_then(|items| {
                let total = self.instance_of.len() + items.len();
                if total > crate::fan_out::MAX_INSTANCES {
                    Err(format!(
                        "{} items would make {total} instances in the run; at most {} are taken",
                        items.len(),
                        crate::fan_out::MAX_INSTANCES
                    ))
                } else {
                    Ok(items)
                }
            });
            let items = match items {
                Ok(items) if items.is_empty() => {
                    let note = "`for_each` gave no items: nothing to run".to_string();
                    out.push(Effect::Note { task, note });
                    return self.set_task(task, TaskState::Skipped, out);
                }
                Ok(items) => items,
                Err(note) => {
                    out.push(Effect::Note { task, note });
                    return self.set_task(task, TaskState::Failed, out);
                }
            };
            let first = self.tasks.len();
            let slots = first..first + items.len();
            self.tasks.resize(slots.end, TaskState::Pending);
            self.attempts.resize(slots.end, 0);
            self.current.resize(slots.end, None);
            self.instance_of.resize(slots.end - self.mapped.len(), task);
            self.mapped[task] = Some(slots);
            out.push(Effect::Expand { task, items });
        }
        self.set_task(task, TaskState::Running, out)?;
        self.fill(job, task, out)?;
        // A re-run may have carried every instance over: it ends now.
        self.end_when_done(data, task, out)
    }

    /// Running mapped task `task` ends by its instances once all have.
    fn end_when_done(&mut self, data: RunData<'_>, task: usize, out: &mut Vec<Effect>) -> Step {
        let slots = self.instances(task).expect("a mapped task");
        if self.tasks[slots.clone()].iter().all(|t| t.is_terminal()) {
            let to = self.gathered(data, task, slots, out);
            self.set_task(task, to, out)?;
        }
        Ok(())
    }

    /// Readies the pending instances of mapped task `task` that its
    /// `max_parallel` lets start, in order (an instance counts from when it
    /// is ready until it ends, waiting for a retry or an operator included).
    fn fill(&mut self, job: &Job, task: usize, out: &mut Vec<Effect>) -> Step {
        let Some(slots) = self.instances(task) else {
            return Ok(());
        };
        let limit = job.tasks[task]
            .max_parallel
            .map_or(usize::MAX, |m| m as usize);
        let mut busy = self.tasks[slots.clone()]
            .iter()
            .filter(|t| {
                matches!(
                    t,
                    TaskState::Ready
                        | TaskState::Dispatching
                        | TaskState::Running
                        | TaskState::Retrying
                        | TaskState::Held
                )
            })
            .count();
        for slot in slots {
            if busy >= limit {
                break;
            }
            if self.tasks[slot] == TaskState::Pending {
                self.set_task(slot, TaskState::Ready, out)?;
                out.push(Effect::Ready { task: slot });
                busy += 1;
            }
        }
        Ok(())
    }

    /// The mapped tasks whose instances are running: more instances start
    /// as others end; once all have ended, the task ends by them.
    fn settle(&mut self, job: &Job, data: RunData<'_>, out: &mut Vec<Effect>) -> Step {
        for task in 0..self.mapped.len() {
            if self.instances(task).is_none() || self.tasks[task] != TaskState::Running {
                continue;
            }
            if self.closing.is_none() {
                self.fill(job, task, out)?;
            }
            self.end_when_done(data, task, out)?;
        }
        Ok(())
    }

    /// What mapped task `task` ends in, its instances in `slots` all
    /// ended: by their states, failed if their outputs cannot be handed
    /// downstream (kept, if they can, for [`RunMachine::gathered_outputs`]).
    fn gathered(
        &mut self,
        data: RunData<'_>,
        task: usize,
        slots: std::ops::Range<usize>,
        out: &mut Vec<Effect>,
    ) -> TaskState {
        let to = crate::fan_out::gathered_state(self.tasks[slots.clone()].iter().copied());
        if to != TaskState::Succeeded {
            return to;
        }
        match data.gathered(slots) {
            Ok(outputs) => {
                self.gathered[task] = Some(std::sync::Arc::new(outputs));
                to
            }
            Err(note) => {
                out.push(Effect::Note { task, note });
                TaskState::Failed
            }
        }
    }

    /// An instance was marked while its mapped task had failed by it: the
    /// mapped task is decided again, and what did not run downstream of it
    /// too.
    fn regather(
        &mut self,
        job: &Job,
        data: RunData<'_>,
        slot: usize,
        out: &mut Vec<Effect>,
    ) -> Step {
        let task = self.task_of(slot);
        if task == slot || self.tasks[task] != TaskState::Failed {
            return Ok(());
        }
        let slots = self.instances(task).expect("an instance's task is mapped");
        if !self.tasks[slots.clone()].iter().all(|t| t.is_terminal()) {
            return Ok(());
        }
        // Decided again only when the mark mended it: with an instance
        // still failed, or one cancelled, it stays failed.
        let to = self.gathered(data, task, slots, out);
        if matches!(to, TaskState::Succeeded | TaskState::Skipped) {
            self.set_task(task, to, out)?;
            self.reopen_downstream(job, task, out)?;
        }
        Ok(())
    }
}

/// `at` plus `d`, saturating.
fn later(at: Timestamp, d: std::time::Duration) -> Timestamp {
    at.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

pub mod recovery;

#[cfg(test)]
mod tests;
