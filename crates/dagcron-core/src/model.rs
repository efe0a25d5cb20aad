//! The job model, as users declare it in job files (YAML or JSON), and its
//! validation into a [`Job`] ready to schedule.
//!
//! Applying the same file twice must change nothing, so every type here has
//! a canonical serialized form (`serde_json` of the spec) to compare.

use std::collections::BTreeMap;
use std::fmt;

use dagcron_cron::{DstGap, DstOverlap, Options, Schedule, Timetable, seed_from_key};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::calendar::{Calendar, CalendarSpec, MAX_CALENDAR_ENTRIES};
use crate::dag::Dag;
use crate::duration::Dur;
use crate::notify::{MAX_NOTIFIERS, NotifierSpec, NotifyRule};
use crate::retry::{Backoff, Jitter, RetryOn, RetryPolicy};
pub use crate::wasm::{ByteSize, DirGrant, Grants, WasmSpec};

mod validate;
use validate::validate_job;

/// A job file: one namespace and its jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// The tenant the jobs belong to.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Exclusion calendars the jobs may list in `exclude`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calendars: Vec<CalendarSpec>,
    /// Where notifications may go: the jobs' rules name them in `to`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifiers: Vec<NotifierSpec>,
    /// The notification rules of every job of the file that has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<NotifyRule>,
    /// The jobs.
    pub jobs: Vec<JobSpec>,
}

/// One entry of a job's `exclude`: a calendar of the file by name, or (the
/// canonical form a job is stored in, once validation has resolved the
/// names) the calendar itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Exclude {
    /// `exclude: [holidays]`.
    Name(String),
    /// The calendar's definition.
    Calendar(CalendarSpec),
}

fn default_namespace() -> String {
    "default".into()
}

/// One schedule or several.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Schedules {
    /// `schedule: "0 3 * * *"`.
    One(String),
    /// `schedule: ["0 3 * * *", "0 15 * * *"]`.
    Many(Vec<String>),
}

impl Schedules {
    /// The expressions.
    pub fn as_slice(&self) -> &[String] {
        match self {
            Schedules::One(s) => std::slice::from_ref(s),
            Schedules::Many(v) => v,
        }
    }
}

/// What happens when a fire comes while runs are active.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Concurrency {
    /// Start another run (up to `max_active_runs`; beyond, queue it).
    #[default]
    Allow,
    /// Skip the fire while a run is active, recording why.
    Forbid,
    /// Cancel the active runs and start the new one.
    Replace,
    /// Queue the run until a slot frees.
    Queue,
    /// Temporal's `BufferOne`: one run at a time, and at most one more
    /// waiting behind it; a fire while one waits is skipped, recording why.
    BufferOne,
}

/// What happens to fires missed during downtime or a pause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Misfire {
    /// Record them as missed and run none.
    Skip,
    /// Run the most recent one, record the others as missed.
    #[default]
    RunOnce,
    /// Run all of them, up to `max_catchup` (the most recent ones).
    RunAll,
}

/// What happens to an attempt whose worker vanished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Retry it as a new attempt (per the retry policy).
    #[default]
    AtLeastOnce,
    /// Mark it `lost` and never run it again.
    AtMostOnce,
}

/// What happens to a task whose last attempt failed and that its retry
/// policy retries no more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// It fails (and its run goes on without it, by the trigger rules).
    #[default]
    Fail,
    /// It is `held`: its run waits until an operator retries it, marks it
    /// succeeded or skipped, or fails it.
    Hold,
}

/// When a task may start, given its upstream tasks' outcomes: Airflow's
/// rules, with Airflow's semantics (see [`crate::dag::decide`] for what each
/// does when it can no longer be met). "Failed" counts `failed` and
/// `upstream_failed` upstream tasks alike unless a rule says otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerRule {
    /// Every upstream task succeeded (a skipped upstream skips this task).
    #[default]
    AllSuccess,
    /// Every upstream task failed.
    AllFailed,
    /// Every upstream task finished, whatever its outcome.
    AllDone,
    /// Every upstream task finished, none was skipped, and at least one
    /// succeeded.
    AllDoneMinOneSuccess,
    /// Every upstream task was skipped.
    AllSkipped,
    /// At least one upstream task failed (for failure handlers); does not
    /// wait for the others.
    OneFailed,
    /// At least one upstream task succeeded; does not wait for the others.
    OneSuccess,
    /// At least one upstream task succeeded or failed (`upstream_failed`
    /// does not count); does not wait for the others.
    OneDone,
    /// No upstream task failed: each succeeded or was skipped.
    NoneFailed,
    /// No upstream task failed, and at least one succeeded.
    NoneFailedMinOneSuccess,
    /// Every upstream task finished and none was skipped.
    NoneSkipped,
    /// Starts without waiting for upstream tasks.
    Always,
}

impl TriggerRule {
    /// Every rule.
    pub const ALL: [TriggerRule; 12] = [
        TriggerRule::AllSuccess,
        TriggerRule::AllFailed,
        TriggerRule::AllDone,
        TriggerRule::AllDoneMinOneSuccess,
        TriggerRule::AllSkipped,
        TriggerRule::OneFailed,
        TriggerRule::OneSuccess,
        TriggerRule::OneDone,
        TriggerRule::NoneFailed,
        TriggerRule::NoneFailedMinOneSuccess,
        TriggerRule::NoneSkipped,
        TriggerRule::Always,
    ];

    /// The name written in job files.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerRule::AllSuccess => "all_success",
            TriggerRule::AllFailed => "all_failed",
            TriggerRule::AllDone => "all_done",
            TriggerRule::AllDoneMinOneSuccess => "all_done_min_one_success",
            TriggerRule::AllSkipped => "all_skipped",
            TriggerRule::OneFailed => "one_failed",
            TriggerRule::OneSuccess => "one_success",
            TriggerRule::OneDone => "one_done",
            TriggerRule::NoneFailed => "none_failed",
            TriggerRule::NoneFailedMinOneSuccess => "none_failed_min_one_success",
            TriggerRule::NoneSkipped => "none_skipped",
            TriggerRule::Always => "always",
        }
    }
}

/// The daylight-saving gap policy, as written in job files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GapPolicy {
    /// Fire once after the gap.
    Shift,
    /// Do not fire.
    Skip,
}

/// The daylight-saving overlap policy, as written in job files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// First occurrence.
    First,
    /// Second occurrence.
    Last,
    /// Both occurrences.
    Both,
}

/// The job-level retry policy (every field has a default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySpec {
    /// Attempts in total, including the first (1 = no retry).
    pub max_attempts: u32,
    /// `fixed` or `exponential`.
    pub backoff: Backoff,
    /// The first delay.
    pub initial: Dur,
    /// The growth factor of exponential backoff.
    pub factor: f64,
    /// The cap on any delay.
    pub max: Dur,
    /// Randomization of each delay.
    pub jitter: Jitter,
    /// Which failures are retried.
    pub retry_on: RetryOn,
}

impl Default for RetrySpec {
    fn default() -> RetrySpec {
        RetrySpec {
            max_attempts: 1,
            backoff: Backoff::Exponential,
            initial: Dur::from_secs(1),
            factor: 2.0,
            max: Dur::from_secs(300),
            jitter: Jitter::None,
            retry_on: RetryOn::default(),
        }
    }
}

/// A task's override of the job's retry policy: only what it sets changes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RetryOverride {
    pub max_attempts: Option<u32>,
    pub backoff: Option<Backoff>,
    pub initial: Option<Dur>,
    pub factor: Option<f64>,
    pub max: Option<Dur>,
    pub jitter: Option<Jitter>,
    pub retry_on: Option<RetryOn>,
}

/// A shell task: a string for `/bin/sh -c`, or a command with details.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ShellSpec {
    /// `shell: "./extract.sh --region {{params.region}}"`.
    Script(String),
    /// `shell: { command: ./load.sh, args: [...], env: {...}, cwd: /srv }`.
    Command(ShellCommand),
}

/// The detailed form of a shell task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellCommand {
    /// The program, or a script for `/bin/sh -c` when `args` is empty.
    pub command: String,
    /// Arguments; when present, `command` is executed directly.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables: a value, or `{ secret: NAME }` for a
    /// secret of the job's namespace.
    #[serde(default)]
    pub env: BTreeMap<String, EnvValue>,
    /// Working directory.
    pub cwd: Option<String>,
}

/// The value of an environment variable of a shell task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// Written out (`{{params.x}}` and `{{secrets.x}}` are substituted).
    Plain(String),
    /// A stored secret of the job's namespace, by name.
    Secret {
        /// The secret's name.
        secret: String,
    },
}

impl From<&str> for EnvValue {
    fn from(s: &str) -> EnvValue {
        EnvValue::Plain(s.to_string())
    }
}

impl From<String> for EnvValue {
    fn from(s: String) -> EnvValue {
        EnvValue::Plain(s)
    }
}

/// The names of the secrets `{{secrets.NAME}}` placeholders in `text` refer to.
pub fn secret_placeholders(text: &str) -> impl Iterator<Item = &str> {
    text.split("{{").skip(1).filter_map(|rest| {
        let inside = rest.split("}}").next()?.trim();
        inside.strip_prefix("secrets.")
    })
}

impl Executor {
    /// The secrets this executor refers to, by name.
    pub fn secret_refs(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let mut texts: Vec<&str> = Vec::new();
        match self {
            Executor::Shell(c) => {
                for v in c.env.values() {
                    match v {
                        EnvValue::Plain(t) => texts.push(t),
                        EnvValue::Secret { secret } => {
                            out.insert(secret.clone());
                        }
                    }
                }
            }
            Executor::Http(h) => {
                texts.push(&h.url);
                texts.extend(h.headers.values().map(String::as_str));
                texts.extend(h.body.as_deref());
            }
            Executor::Wasm(w) => crate::wasm::secret_refs(w, &mut out),
            Executor::Noop => {}
        }
        for t in texts {
            out.extend(secret_placeholders(t).map(str::to_string));
        }
        out
    }
}

/// An HTTP task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    /// `GET`, `POST`, ...
    #[serde(default = "default_method")]
    pub method: String,
    /// The URL (`http://` or `https://`).
    pub url: String,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Request body.
    pub body: Option<String>,
    /// Statuses that count as success (default: any 2xx).
    #[serde(default)]
    pub expect: Vec<u16>,
    /// Outputs taken from the JSON answer, each by a path (`$.id`,
    /// `$.items[0].name`; see [`crate::outputs`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
}

fn default_method() -> String {
    "GET".into()
}

/// One node of a job's DAG.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Unique within the job.
    pub id: String,
    /// Upstream tasks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// When the task may start.
    #[serde(default)]
    pub trigger_rule: TriggerRule,
    /// Time limit of one attempt.
    pub timeout: Option<Dur>,
    /// Overrides of the job's retry policy.
    pub retry: Option<RetryOverride>,
    /// What happens once its retries are exhausted (default: the job's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exhausted: Option<OnExhausted>,
    /// Run a shell command.
    pub shell: Option<ShellSpec>,
    /// Call an HTTP endpoint.
    pub http: Option<HttpSpec>,
    /// Run a WebAssembly module in a sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasm: Option<WasmSpec>,
    /// Do nothing and succeed: a placeholder that gives a DAG its shape.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub noop: bool,
    /// Run on a remote worker agent whose labels match, instead of in the
    /// server's own pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_on: Option<RunOn>,
    /// Whether it runs once its trigger rule lets it start (false: it is
    /// `skipped`); see [`crate::condition`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Exit codes of a shell task that mean "nothing to do": the task is
    /// `skipped` (not failed, not retried), as Airflow's BashOperator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_on_exit_code: Vec<i32>,
    /// Which ready attempt starts first when slots are short (the job's
    /// when not given); see [`crate::priority`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Run once per item of a list found when the task may start (see
    /// [`crate::fan_out`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<crate::fan_out::ForEach>,
    /// With `for_each`: the most instances that run at once (none: as
    /// many as there are slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
}

/// Which remote worker agents may run a task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOn {
    /// Labels the agent must have, with these values (none: any agent).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A job as declared.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Unique within the namespace.
    pub name: String,
    /// Cron expressions; none for a job that runs only when triggered.
    pub schedule: Option<Schedules>,
    /// IANA zone of the schedules.
    #[serde(default = "default_tz")]
    pub timezone: String,
    /// Spring-forward policy override.
    pub dst_gap: Option<GapPolicy>,
    /// Fall-back policy override.
    pub dst_overlap: Option<OverlapPolicy>,
    /// The instant (RFC 3339, whole seconds) the job's `@every` schedules
    /// count their periods from, instead of the Unix epoch: it sets their
    /// phase (fires fall on the anchor plus whole periods, before it as
    /// after it). Written as text and checked by validation, so that a
    /// malformed one is reported with its path; a valid one is kept in
    /// UTC (`2026-01-01T00:00:00Z`), so two spellings of one instant are
    /// the same job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
    /// Overlap policy.
    #[serde(default)]
    pub concurrency: Concurrency,
    /// Runs active at once; by default 16 under `allow`, 1 otherwise (see
    /// [`JobSpec::max_active`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_runs: Option<u32>,
    /// Runs that may wait for a slot (see [`JobSpec::max_pending`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_runs: Option<u32>,
    /// Missed-fire policy.
    #[serde(default)]
    pub misfire: Misfire,
    /// The most missed fires caught up under `run_all`.
    #[serde(default = "default_catchup")]
    pub max_catchup: u32,
    /// Time limit of a whole run.
    pub deadline: Option<Dur>,
    /// Make each scheduled run this long before its instant and send its
    /// first tasks ahead, to start at the instant itself (timed
    /// instructions; a remote agent corrects the instant by its measured
    /// clock offset). Nothing of such a run starts before its instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_ahead: Option<Dur>,
    /// Delay each scheduled fire by a stable amount in `[0, jitter)`,
    /// derived from the job and the instant and kept below the gap to the
    /// next fire, to spread load (not the retry policy's jitter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Dur>,
    /// Calendars whose instants the job does not fire at (the fires are
    /// recorded as `suppressed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<Exclude>,
    /// Default parameters, overridable per trigger.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Default retry policy of the tasks.
    #[serde(default)]
    pub retry: RetrySpec,
    /// What happens to a task once its retries are exhausted, for the
    /// tasks that do not say (default: `fail`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exhausted: Option<OnExhausted>,
    /// What happens to attempts whose worker vanished.
    #[serde(default)]
    pub delivery: Delivery,
    /// A paused job does not fire.
    #[serde(default)]
    pub paused: bool,
    /// No fire before this instant.
    pub start_date: Option<Timestamp>,
    /// No fire after this instant.
    pub end_date: Option<Timestamp>,
    /// Who hears about its runs (see [`crate::notify`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<NotifyRule>,
    /// Stop firing after this many consecutive failed runs (see
    /// [`crate::breaker`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<crate::breaker::BreakerSpec>,
    /// Runs started by signed deliveries to `POST /api/v1/hooks/{ns}/{job}`
    /// (see [`crate::hook`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<crate::hook::WebhookTrigger>,
    /// Runs started by the end of another job's runs (see
    /// [`crate::after`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<crate::after::AfterTrigger>,
    /// Runs started by messages of a NATS JetStream stream (see
    /// [`crate::message`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<crate::message::NatsTrigger>,
    /// When its scheduled runs should have succeeded (see [`crate::sla`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla: Option<crate::sla::SlaSpec>,
    /// Which of its ready attempts start first when slots are short
    /// (see [`crate::priority`]); a task may name its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The DAG.
    pub tasks: Vec<TaskSpec>,
}

pub(crate) fn default_tz() -> String {
    "UTC".into()
}
pub(crate) fn default_catchup() -> u32 {
    10
}

/// Active runs at once under `concurrency: allow` when the job does not say.
pub const DEFAULT_MAX_ACTIVE_RUNS: u32 = 16;

impl JobSpec {
    /// Runs active at once: under `allow` and `queue`, `max_active_runs`
    /// if set, otherwise [`DEFAULT_MAX_ACTIVE_RUNS`] under `allow` and 1
    /// under `queue`; always 1 under `forbid`, `replace` and `buffer_one`,
    /// which are about one run at a time.
    pub fn max_active(&self) -> u32 {
        match self.concurrency {
            Concurrency::Allow => self.max_active_runs.unwrap_or(DEFAULT_MAX_ACTIVE_RUNS),
            Concurrency::Queue => self.max_active_runs.unwrap_or(1),
            Concurrency::Forbid | Concurrency::Replace | Concurrency::BufferOne => 1,
        }
    }

    /// Runs that may wait for a slot at once: `max_pending_runs` if set,
    /// otherwise [`DEFAULT_MAX_PENDING_RUNS`]. A fire beyond it makes no
    /// run (`skipped_backlog` in the ledger), a manual trigger is refused.
    pub fn max_pending(&self) -> u32 {
        self.max_pending_runs.unwrap_or(DEFAULT_MAX_PENDING_RUNS)
    }
}

/// Runs of one job that may wait for a slot unless it says otherwise.
pub const DEFAULT_MAX_PENDING_RUNS: u32 = 100;

/// The most schedules one job may have: each fire searches all of them, so
/// a job with thousands would slow every fire, backfill and catch-up.
pub const MAX_SCHEDULES_PER_JOB: usize = 64;

/// The most tasks one job may have.
pub const MAX_TASKS_PER_JOB: usize = 1000;

/// The most parameters of a run (the job's defaults and a trigger's).
pub const MAX_PARAMS: usize = 64;

/// The longest parameter name, in bytes.
pub const MAX_PARAM_NAME: usize = 64;

/// The largest parameter value, in bytes.
pub const MAX_PARAM_VALUE: usize = 16 * 1024;

/// Checks run parameters (a job's defaults or a trigger's): names are
/// letters, digits and `_`, not starting with a digit (each becomes the
/// environment variable `DAGCRON_PARAM_<NAME>`), values have no NUL byte
/// (no environment can hold one) and both are bounded in size. Each problem
/// is reported with `at.<name>` as its path.
pub fn check_params(params: &BTreeMap<String, String>, at: &str) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    let mut err = |path: String, message: String| {
        errors.push(ValidationError {
            path,
            message,
            span: None,
        })
    };
    if params.len() > MAX_PARAMS {
        err(
            at.to_string(),
            format!(
                "{} parameters; at most {MAX_PARAMS} are accepted",
                params.len()
            ),
        );
    }
    for (name, value) in params {
        let path = format!("{at}.{}", name.escape_debug());
        let valid = name.len() <= MAX_PARAM_NAME
            && name.bytes().next().is_some_and(|b| !b.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            err(
                path.clone(),
                format!(
                    "invalid parameter name {name:?}: use 1 to {MAX_PARAM_NAME} letters, digits and `_`, not starting with a digit"
                ),
            );
        }
        if value.len() > MAX_PARAM_VALUE {
            err(
                path.clone(),
                format!(
                    "the value is {} bytes; at most {MAX_PARAM_VALUE} are accepted",
                    value.len()
                ),
            );
        }
        if value.contains('\0') {
            err(
                path,
                "the value holds a NUL byte, which no environment variable can".into(),
            );
        }
    }
    errors
}

/// What a task runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Executor {
    /// A shell command.
    Shell(ShellCommand),
    /// An HTTP request.
    Http(HttpSpec),
    /// A WebAssembly module in a sandbox.
    Wasm(WasmSpec),
    /// Nothing: succeeds at once.
    Noop,
}

impl Executor {
    /// Its kind: `shell`, `http`, `wasm` or `noop`.
    pub fn kind(&self) -> &'static str {
        match self {
            Executor::Shell(_) => "shell",
            Executor::Http(_) => "http",
            Executor::Wasm(_) => "wasm",
            Executor::Noop => "noop",
        }
    }
}

/// A validated task.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// Unique within the job.
    pub id: String,
    /// When it may start.
    pub trigger_rule: TriggerRule,
    /// Time limit of one attempt.
    pub timeout: Option<Dur>,
    /// The effective retry policy (job default merged with the override).
    pub retry: RetryPolicy,
    /// What happens once its retries are exhausted (the task's, or the job's).
    pub on_exhausted: OnExhausted,
    /// What it runs.
    pub executor: Executor,
    /// Where: a remote agent matching these labels, or (none) the server's pool.
    pub run_on: Option<RunOn>,
    /// Whether it runs once it may start (none: always).
    pub when: Option<crate::condition::Condition>,
    /// Exit codes that skip it (a shell task's).
    pub skip_on_exit_code: Vec<i32>,
    /// Which ready attempt starts first when slots are short, from
    /// [`crate::priority::MIN`] to [`crate::priority::MAX`].
    pub priority: i32,
    /// The tasks whose outputs it gets, by index: its upstream tasks and
    /// the tasks its text and condition refer to.
    pub reads: Vec<usize>,
    /// Where its items come from, if it runs once per item.
    pub for_each: Option<crate::fan_out::Source>,
    /// The most of its instances that run at once (none: no bound).
    pub max_parallel: Option<u32>,
}

/// A validated job, ready to schedule.
#[derive(Clone, Debug)]
pub struct Job {
    /// Its namespace.
    pub namespace: String,
    /// The declaration, as applied.
    pub spec: JobSpec,
    /// Compiled schedules, in the job's zone.
    pub schedules: Vec<Schedule>,
    /// The tasks, in declaration order.
    pub tasks: Vec<Task>,
    /// The dependency graph over `tasks` indices.
    pub dag: Dag,
    /// The calendars of `exclude`, compiled.
    pub calendars: Vec<Calendar>,
}

impl Job {
    /// `namespace/name`, the job's identity (also the seed of `H`).
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.spec.name)
    }

    /// The canonical form of the declaration: equal when applying changes nothing.
    pub fn canonical(&self) -> String {
        serde_json::to_string(&self.spec).expect("job specs serialize")
    }

    /// The first fire of any of the job's schedules strictly after `t`, within
    /// its start and end dates.
    pub fn next_fire_after(&self, t: Timestamp) -> Option<Timestamp> {
        next_fire(
            self.schedules.iter().map(|s| s.timetable()),
            self.spec.start_date,
            self.spec.end_date,
            t,
        )
    }

    /// What the scheduler needs to know when the job fires, and to decide
    /// what to do when it does not, without the rest of the job.
    pub fn timing(&self) -> Timing {
        self.timing_of(
            self.schedules
                .iter()
                .map(|s| s.timetable().clone())
                .collect(),
        )
    }

    /// [`Job::timing`] with its timetables shared, through `cache`, with
    /// the other jobs of the same schedules (the same expressions, zone,
    /// anchor and daylight-saving policies, and no `H`).
    pub fn timing_shared(&self, cache: &mut crate::timings::TimetableCache) -> Timing {
        let timetables = cache.share(self);
        self.timing_of(timetables)
    }

    fn timing_of(&self, timetables: std::sync::Arc<[Timetable]>) -> Timing {
        Timing::new(
            &self.namespace,
            &self.spec.name,
            timetables,
            TimingFields {
                start_date: self.spec.start_date,
                end_date: self.spec.end_date,
                misfire: self.spec.misfire,
                max_catchup: self.spec.max_catchup,
                send_ahead: self.spec.send_ahead,
                jitter: self.spec.jitter,
            },
            self.calendars.clone().into(),
        )
    }

    /// The name of the first of the job's calendars that excludes `t`.
    pub fn excluded_by(&self, t: Timestamp) -> Option<&str> {
        excluded_by(&self.calendars, t)
    }

    /// The first fire strictly after `t` that no calendar of the job
    /// suppresses, searching at most [`MAX_SUPPRESSED_SEARCH`] fires.
    pub fn next_unsuppressed_after(&self, t: Timestamp) -> Option<Timestamp> {
        let mut t = t;
        for _ in 0..MAX_SUPPRESSED_SEARCH {
            let next = self.next_fire_after(t)?;
            if self.excluded_by(next).is_none() {
                return Some(next);
            }
            t = next;
        }
        None
    }

    /// The next `limit` fires strictly after `t`, each with the name of
    /// the exclusion calendar that suppresses it, if one does (a preview:
    /// it shows what the calendars take away).
    pub fn upcoming_after(&self, t: Timestamp, limit: usize) -> Vec<(Timestamp, Option<&str>)> {
        let mut out = Vec::with_capacity(limit.min(1000));
        let mut t = t;
        while out.len() < limit {
            let Some(next) = self.next_fire_after(t) else {
                break;
            };
            out.push((next, self.excluded_by(next)));
            t = next;
        }
        out
    }
}

/// How many suppressed fires in a row a preview skips before it gives up
/// (a calendar may exclude every fire of a job).
pub const MAX_SUPPRESSED_SEARCH: usize = 10_000;

fn excluded_by(calendars: &[Calendar], t: Timestamp) -> Option<&str> {
    calendars.iter().find(|c| c.excludes(t)).map(|c| &*c.name)
}

/// A job's schedules in compiled form with its dates and misfire policy:
/// what a scheduler keeps in memory for every job, a few hundred bytes,
/// while the whole [`Job`] stays in the store until a fire needs it.
#[derive(Clone, Debug)]
pub struct Timing {
    /// One per schedule (none for a job that runs only when triggered);
    /// jobs of the same schedules may share them.
    pub timetables: std::sync::Arc<[Timetable]>,
    /// No fire before this instant.
    pub start_date: Option<Timestamp>,
    /// No fire after this instant.
    pub end_date: Option<Timestamp>,
    /// Missed-fire policy.
    pub misfire: Misfire,
    /// The most missed fires caught up under `run_all`.
    pub max_catchup: u32,
    /// How long before its instant a run is made (zero: at the instant).
    pub send_ahead: jiff::SignedDuration,
    /// The bound of the schedule jitter (zero: none).
    pub jitter: jiff::SignedDuration,
    /// The job's identity hashed, from which each fire's jitter is derived.
    pub jitter_seed: u64,
    /// The calendars that suppress fires (usually none).
    pub exclusions: Box<[Calendar]>,
}

/// The fields of a spec a [`Timing`] copies.
pub(crate) struct TimingFields {
    pub(crate) start_date: Option<Timestamp>,
    pub(crate) end_date: Option<Timestamp>,
    pub(crate) misfire: Misfire,
    pub(crate) max_catchup: u32,
    pub(crate) send_ahead: Option<Dur>,
    pub(crate) jitter: Option<Dur>,
}

impl Timing {
    /// The timing of job `namespace/name` (one rule for a validated job
    /// and for one read back from its stored form).
    pub(crate) fn new(
        namespace: &str,
        name: &str,
        timetables: std::sync::Arc<[Timetable]>,
        fields: TimingFields,
        exclusions: Box<[Calendar]>,
    ) -> Timing {
        let signed = |d: Option<Dur>| {
            d.map_or(jiff::SignedDuration::ZERO, |d| {
                jiff::SignedDuration::try_from(d.0).unwrap_or(jiff::SignedDuration::ZERO)
            })
        };
        Timing {
            timetables,
            start_date: fields.start_date,
            end_date: fields.end_date,
            misfire: fields.misfire,
            max_catchup: fields.max_catchup,
            send_ahead: signed(fields.send_ahead),
            jitter: signed(fields.jitter),
            jitter_seed: seed_from_key(&format!("{namespace}/{name}")),
            exclusions,
        }
    }

    /// The same as [`Job::next_fire_after`].
    pub fn next_fire_after(&self, t: Timestamp) -> Option<Timestamp> {
        next_fire(self.timetables.iter(), self.start_date, self.end_date, t)
    }

    /// The name of the first calendar that suppresses a fire at `t`.
    pub fn excluded_by(&self, t: Timestamp) -> Option<&str> {
        excluded_by(&self.exclusions, t)
    }

    /// The fires in `[from, to)`, by the same rule as the scheduler's (start
    /// and end dates included); `None` if there are more than `limit`.
    pub fn fires_in(&self, from: Timestamp, to: Timestamp, limit: usize) -> Option<Vec<Timestamp>> {
        let mut out = Vec::new();
        let mut t = from
            .checked_sub(jiff::SignedDuration::from_nanos(1))
            .unwrap_or(from);
        while let Some(next) = self.next_fire_after(t).filter(|n| *n < to) {
            if out.len() == limit {
                return None;
            }
            out.push(next);
            t = next;
        }
        Some(out)
    }
}

fn next_fire<'a>(
    timetables: impl Iterator<Item = &'a Timetable>,
    start_date: Option<Timestamp>,
    end_date: Option<Timestamp>,
    t: Timestamp,
) -> Option<Timestamp> {
    let from = match start_date {
        Some(start) if start > t => start
            .checked_sub(jiff::SignedDuration::from_nanos(1))
            .unwrap_or(start),
        _ => t,
    };
    let next = timetables.filter_map(|s| s.next_after(from)).min()?;
    match end_date {
        Some(end) if next > end => None,
        _ => Some(next),
    }
}

/// A problem in a job file, with the path of the offending field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ValidationError {
    /// Such as `jobs[0].tasks[2].depends_on[0]`.
    pub path: String,
    /// What is wrong and what would be accepted.
    pub message: String,
    /// For cron errors: the byte span in the expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span: Option<(usize, usize)>,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// All the problems of a job file (validation reports every one, not the first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}

/// Whether a name is acceptable for a namespace, job or task: lowercase
/// letters, digits, `-`, `_` and `.`, starting with a letter or digit, at most 63 bytes.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.')
        })
}

const NAME_RULE: &str =
    "use 1-63 lowercase letters, digits, '-', '_' or '.', starting with a letter or digit";

impl Job {
    /// Rebuilds a validated job from its canonical form (see [`Job::canonical`]).
    pub fn from_canonical(namespace: &str, canonical: &str) -> Result<Job, String> {
        let spec: JobSpec = serde_json::from_str(canonical).map_err(|e| e.to_string())?;
        let file = JobFile {
            namespace: namespace.to_string(),
            calendars: vec![],
            notifiers: vec![],
            notify: vec![],
            jobs: vec![spec],
        };
        file.validate()
            .map_err(|e| e.to_string())?
            .pop()
            .ok_or_else(|| "no job".to_string())
    }
}

impl JobFile {
    /// Validates every job; reports every problem found.
    pub fn validate(&self) -> Result<Vec<Job>, ValidationErrors> {
        let mut errors = Vec::new();
        let mut err = |path: String, message: String| {
            errors.push(ValidationError {
                path,
                message,
                span: None,
            })
        };
        if !valid_name(&self.namespace) {
            err(
                "namespace".into(),
                format!("invalid namespace {:?}: {NAME_RULE}", self.namespace),
            );
        }
        let mut seen = BTreeMap::new();
        for (i, job) in self.jobs.iter().enumerate() {
            if let Some(first) = seen.insert(job.name.clone(), i) {
                err(
                    format!("jobs[{i}].name"),
                    format!("job {:?} is declared twice (also jobs[{first}])", job.name),
                );
            }
        }
        // The file's calendars: each checked once, at its own path; a job
        // gets the valid ones it names.
        let mut calendars: BTreeMap<&str, Option<&CalendarSpec>> = BTreeMap::new();
        for (c, cal) in self.calendars.iter().enumerate() {
            let at = format!("calendars[{c}]");
            let valid = match Calendar::compile(cal, &at) {
                Ok(_) => true,
                Err(mut e) => {
                    errors.append(&mut e);
                    false
                }
            };
            if calendars.insert(&cal.name, valid.then_some(cal)).is_some() {
                errors.push(ValidationError {
                    path: format!("{at}.name"),
                    message: format!("calendar {:?} is declared twice", cal.name),
                    span: None,
                });
            }
        }
        // The file's notifiers, the same way.
        let mut notifiers: BTreeMap<&str, Option<&NotifierSpec>> = BTreeMap::new();
        if self.notifiers.len() > MAX_NOTIFIERS {
            errors.push(ValidationError {
                path: "notifiers".into(),
                message: format!(
                    "{} notifiers; at most {MAX_NOTIFIERS} are accepted",
                    self.notifiers.len()
                ),
                span: None,
            });
        }
        for (n, notifier) in self.notifiers.iter().enumerate() {
            let at = format!("notifiers[{n}]");
            let mut problems = notifier.check(&at);
            let valid = problems.is_empty();
            errors.append(&mut problems);
            if notifiers
                .insert(&notifier.name, valid.then_some(notifier))
                .is_some()
            {
                errors.push(ValidationError {
                    path: format!("{at}.name"),
                    message: format!("notifier {:?} is declared twice", notifier.name),
                    span: None,
                });
            }
        }
        let default_notify = match crate::notify::resolve(&self.notify, &notifiers, "notify") {
            Ok(rules) => rules,
            Err(mut e) => {
                errors.append(&mut e);
                vec![]
            }
        };
        let mut jobs = Vec::with_capacity(self.jobs.len());
        // Expressions compiled once per file: thousands of jobs share a
        // few schedules.
        let mut compiled = Compiled::default();
        for (i, spec) in self.jobs.iter().enumerate() {
            let mut spec = spec.clone();
            let mut exclude = Vec::new();
            for (k, e) in spec.exclude.iter().enumerate() {
                match e {
                    Exclude::Name(name) => match calendars.get(name.as_str()) {
                        Some(Some(cal)) => exclude.push(Exclude::Calendar((*cal).clone())),
                        // In error at its own path.
                        Some(None) => {}
                        None => errors.push(ValidationError {
                            path: format!("jobs[{i}].exclude[{k}]"),
                            message: unknown_name("calendar", "calendars", name, calendars.keys()),
                            span: None,
                        }),
                    },
                    Exclude::Calendar(_) => exclude.push(e.clone()),
                }
            }
            spec.exclude = exclude;
            spec.notify = if spec.notify.is_empty() {
                default_notify.clone()
            } else {
                match crate::notify::resolve(&spec.notify, &notifiers, &format!("jobs[{i}].notify"))
                {
                    Ok(rules) => rules,
                    Err(mut e) => {
                        errors.append(&mut e);
                        vec![]
                    }
                }
            };
            match validate_job(&self.namespace, spec, &format!("jobs[{i}]"), &mut compiled) {
                Ok(job) => jobs.push(job),
                Err(mut e) => errors.append(&mut e),
            }
        }
        // Jobs of the file that start after one another in a circle.
        let edges: std::collections::BTreeMap<String, String> = self
            .jobs
            .iter()
            .filter_map(|j| Some((j.name.clone(), j.after.as_ref()?.job.clone())))
            .collect();
        if let Some(path) = crate::after::cycle(&edges, &Default::default()) {
            let i = self
                .jobs
                .iter()
                .position(|j| j.name == path[0])
                .unwrap_or(0);
            errors.push(ValidationError {
                path: format!("jobs[{i}].after.job"),
                message: format!(
                    "jobs that start after one another in a circle would run forever: {}",
                    path.join(" → ")
                ),
                span: None,
            });
        }
        if errors.is_empty() {
            Ok(jobs)
        } else {
            Err(ValidationErrors(errors))
        }
    }
}

/// Why `name` names nothing: what the file declares under `section`
/// instead, or where to declare it.
pub(crate) fn unknown_name<'a>(
    kind: &str,
    section: &str,
    name: &str,
    declared: impl ExactSizeIterator<Item = &'a &'a str>,
) -> String {
    let hint = if declared.len() == 0 {
        format!("declare it under `{section}` beside the jobs")
    } else {
        let names: Vec<String> = declared.map(|n| format!("{n:?}")).collect();
        format!("the file declares {}", names.join(", "))
    };
    format!("unknown {kind} {name:?}: {hint}")
}

/// Reads an anchor: an RFC 3339 instant with its offset, on a whole second
/// (`@every` fires on whole seconds).
pub(crate) fn check_anchor(text: &str) -> Result<Timestamp, String> {
    let t: Timestamp = text.parse().map_err(|e: jiff::Error| {
        format!(
            "invalid anchor {text:?}: use an RFC 3339 instant with its offset, such as \"2026-01-01T00:00:00Z\" ({e})"
        )
    })?;
    if t.subsec_nanosecond() != 0 {
        return Err(format!(
            "the anchor {text:?} has a fraction of a second; `@every` fires on whole seconds, so use a whole second such as {:?}",
            Timestamp::from_second(t.as_second()).map_or_else(|_| String::new(), |w| w.to_string())
        ));
    }
    Ok(t)
}

/// The longest schedule `jitter`: a fire delayed further is a different
/// schedule.
const MAX_JITTER: std::time::Duration = std::time::Duration::from_secs(86_400);

/// The longest `send_ahead`: a run made earlier than this is more likely
/// to outlive a change of its job than to gain precision.
const MAX_SEND_AHEAD: std::time::Duration = std::time::Duration::from_secs(3600);

/// The options a job's schedules are compiled with.
pub(crate) fn schedule_options(
    namespace: &str,
    name: &str,
    time_zone: TimeZone,
    anchor: Option<Timestamp>,
    dst_gap: Option<GapPolicy>,
    dst_overlap: Option<OverlapPolicy>,
) -> Options {
    Options {
        time_zone,
        hash_seed: seed_from_key(&format!("{namespace}/{name}")),
        anchor,
        dst_gap: dst_gap.map(|g| match g {
            GapPolicy::Shift => DstGap::Shift,
            GapPolicy::Skip => DstGap::Skip,
        }),
        dst_overlap: dst_overlap.map(|o| match o {
            OverlapPolicy::First => DstOverlap::First,
            OverlapPolicy::Last => DstOverlap::Last,
            OverlapPolicy::Both => DstOverlap::Both,
        }),
    }
}

/// The schedules a file's validation compiled, by expression and what
/// else their compilation depends on (none with `H`, which depends on the
/// job), so that jobs of the same schedule compile it once.
#[derive(Default)]
struct Compiled {
    schedules: std::collections::HashMap<String, Schedule>,
    key: String,
}

/// Most distinct schedules a file's validation keeps.
const MAX_COMPILED: usize = 16_384;

impl Compiled {
    fn parse(
        &mut self,
        expr: &str,
        timezone: &str,
        options: &Options,
    ) -> Result<Schedule, dagcron_cron::ParseError> {
        // Cron's `H` depends on the job; a recurrence rule's letters do not.
        if !dagcron_cron::is_recurrence_rule(expr)
            && expr.bytes().any(|b| b.eq_ignore_ascii_case(&b'h'))
        {
            return Schedule::parse_with(expr, options);
        }
        use std::fmt::Write as _;
        self.key.clear();
        let _ = write!(
            self.key,
            "{}:{timezone};{:?};{:?};{:?};{expr}",
            timezone.len(),
            options.anchor,
            options.dst_gap,
            options.dst_overlap
        );
        if let Some(s) = self.schedules.get(self.key.as_str()) {
            return Ok(s.clone());
        }
        let s = Schedule::parse_with(expr, options)?;
        if self.schedules.len() < MAX_COMPILED {
            self.schedules.insert(self.key.clone(), s.clone());
        }
        Ok(s)
    }
}

impl Serialize for Jitter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Jitter::None => s.serialize_str("none"),
            Jitter::Full => s.serialize_str("full"),
            Jitter::Equal => s.serialize_str("equal"),
            Jitter::Percent(p) => s.collect_str(&format_args!("{p}%")),
        }
    }
}

impl<'de> Deserialize<'de> for Jitter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Jitter, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "none" => Ok(Jitter::None),
            "full" => Ok(Jitter::Full),
            "equal" => Ok(Jitter::Equal),
            p => p
                .strip_suffix('%')
                .and_then(|n| n.parse::<u8>().ok())
                .filter(|n| (1..=100).contains(n))
                .map(Jitter::Percent)
                .ok_or_else(|| serde::de::Error::custom(format!("invalid jitter {text:?}: use none, full, equal or a percentage such as \"20%\" (1-100)"))),
        }
    }
}
