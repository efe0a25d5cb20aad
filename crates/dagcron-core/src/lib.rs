//! dagcron's domain core: the job model and its validation, DAG planning, the
//! run/task/attempt state machines, retry with backoff and jitter, the
//! overlap and misfire policies, which tasks a re-run runs again, the
//! rules fires are computed with, and the hot-spot report of schedules that
//! fire together.
//!
//! **No I/O, no clock, no randomness of its own:** time and random numbers
//! are arguments, so a test can replay any instant and pin every delay.

pub mod authz;
pub mod calendar;
pub mod dag;
pub mod duration;
pub mod exec_policy;
pub mod fires;
pub mod hotspots;
pub mod job;
pub mod model;
pub mod policy;
pub mod quota;
pub mod rerun;
pub mod retention;
pub mod retry;
pub mod ring;
pub mod rules;
pub mod run;
pub mod state;
pub mod timings;
pub mod wasm;

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
