//! dagcron's domain core: the job model and its validation, DAG planning, the
//! run/task/attempt state machines, retry with backoff and jitter, the
//! overlap and misfire policies, which tasks a re-run runs again, the
//! rules fires are computed with, and the hot-spot report of schedules that
//! fire together.
//!
//! **No I/O, no clock, no randomness of its own:** time and random numbers
//! are arguments, so a test can replay any instant and pin every delay.
//!
//! # How it works
//!
//! The domain: `model.rs` (job files, and `model/validate.rs`: validation
//! into `Job` section by section, with every problem reported by field path),
//! `job.rs` (the job machine: what a scheduled fire, a trigger asking for
//! runs, a planned run's instant and a freed slot do, by the job's overlap
//! policy, backlog, fire quota and misfire policy, over its counts of runs
//! running and waiting; property-tested over random event sequences), `dag.rs` (cycles with their path, planning by Airflow's
//! trigger rules, one pure decision per task from its upstream tasks' states
//! counted: which pending tasks become ready, `upstream_failed` or `skipped`), `state.rs` (the
//! run, task and attempt transition tables; a run planned for an instant
//! starts `planned`; a task `held` by `on_exhausted: hold` is not
//! terminal), `run.rs` (the run state machine:
//! events in, effects out, an operator's `Intervention` on a task among the events, with
//! the pure decision whether it applies; its tests pin effect lists by snapshot and drive
//! random event sequences, checking that no change leaves the tables and that
//! every task of every run ends), `fires.rs` (missed fires by the misfire
//! policy, the plan for arming a job's next fire, the stable schedule jitter
//! of each fire, which jobs stay in memory), `calendar.rs` (exclusion
//! calendars, resolved into the jobs that list them at validation, so a job
//! carries its calendars in its stored form and its `Timing`; the decision
//! which calendar excludes an instant),
//! `outputs.rs` (what a task hands downstream: reading its file, the
//! limits, the references a task's text makes), `condition.rs` (the `when`
//! language: whether a task that may start runs), `retry.rs` (backoff, jitter, retryable failures), `policy.rs` (the fire
//! ledger's outcomes, catch-up, the fire quota's bucket, run outcome), `rerun.rs` (which tasks of a re-run start over
//! and which keep their outcome), `retention.rs` (a namespace's retention
//! policy and which runs, ledger rows and deleted jobs it lets go; never an
//! unfinished run, a run a re-run refers to, or a job's newest fire), `rules.rs` (the rules a job's fires are
//! computed with, and whether a stored version's differ for its zones),
//! `timings.rs` (a job's `Timing` read straight from its stored canonical
//! form, only the fields it is made from, at start-up; compiled timetables
//! shared by the jobs of the same schedules, never with `H`),
//! `exec_policy.rs` (a namespace's execution policy and the pure decisions
//! it makes: whether a task may run, whether an address is a destination an
//! http task may reach; property-tested),
//! `duration.rs`, `ring.rs` (consistent hashing with virtual nodes: which
//! node of a cluster owns a job), `hotspots.rs` (the seconds of a window at
//! which the most jobs fire together, a rewrite of their expressions with
//! `H`, and the peak of fires per second; bounded by limits on jobs and
//! searches) and `authz.rs` (roles, grants, and the one decision every route
//! asks for).
//!
//! **Architecture Invariant:** `dagcron-cron` and `dagcron-core` do no I/O,
//! never read the clock and have no randomness of their own. Everything that
//! decides about a run or a fire lives there.

pub mod after;
pub mod authz;
pub mod breaker;
pub mod calendar;
pub mod condition;
pub mod dag;
pub mod duration;
pub mod exec_policy;
pub mod fan_out;
pub mod fires;
pub mod hook;
pub mod hotspots;
pub mod job;
pub mod log;
pub mod message;
pub mod model;
pub mod notify;
pub mod outputs;
pub mod policy;
pub mod priority;
pub mod quota;
pub mod rerun;
pub mod retention;
pub mod retry;
pub mod ring;
pub mod rules;
pub mod run;
pub mod sla;
pub mod state;
pub mod timings;
pub mod wasm;
pub mod yaml;

pub use calendar::{Calendar, CalendarSpec};
pub use dag::Dag;
pub use duration::Dur;
pub use model::{
    Concurrency, Delivery, EnvValue, Exclude, Executor, Job, JobFile, JobSpec, Misfire,
    OnExhausted, Task, TaskSpec, Timing, TriggerRule, ValidationError, ValidationErrors,
};
pub use policy::{FireDecision, FireOutcome};
pub use retention::Retention;
pub use retry::{Failure, RetryDecision, RetryPolicy};
pub use ring::Ring;
pub use rules::{Rules, RulesChange};
pub use run::{Effect, End, Event, Intervention, RunMachine};
pub use state::{AttemptState, IllegalTransition, RunState, TaskState};
