//! The engine: one task that owns the scheduling state.
//!
//! It keeps one timer queue over every schedule, retry and deadline (no task
//! or polling loop per job), turns due fires into runs, plans each run's DAG,
//! and hands ready tasks to a bounded pool of attempt tasks. Every decision
//! is first appended to a batch of [`Write`]s; the batch is committed in one
//! transaction, and only then are its effects carried out (attempts started,
//! callers answered). A crash between the two loses no decision: on start,
//! the engine recovers from the store (missed fires by the misfire policy,
//! attempts that were running as `lost`).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::fires::{self, Arming, Missed};
use dagcron_core::job::{self, JobPolicy, JobRuns};
use dagcron_core::policy::{self, FireDecision, FireOutcome};
use dagcron_core::run::{Effect, End, Event, Intervention, RunMachine};
use dagcron_core::{AttemptState, Failure, Job, RunState, TaskState, Timing};
use dagcron_exec::{AttemptContext, Ending, Limits, Outcome};
use dagcron_store::prelude::*;
use dagcron_store::{
    ApplyResult, AttemptKey, ClaimedAttempt, JobUpsert, NewRun, Origin, RemoteAttempt, RunId,
    RunRecord, StorageError, StoredJob, StoredTimingRow, Trigger, Write, WriteResult,
};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::trace::{RunTrace, TraceParent};

mod after;
mod attempts;
mod commands;
mod commits;
mod completions;
mod dispatch;
mod handle;
mod jobs;
mod lease;
mod notify;
mod recovery;
mod requests;
mod run_loop;
mod runs;
mod shared;
mod shares;
mod sla;
mod spans;
mod timers;

#[cfg(test)]
mod tests;

pub use attempts::OutputReserve;
use dispatch::{Lane, ReadyQueues};
pub(crate) use handle::{CaughtUp, Command, Completion, LiveLogs, Request, RerunRead, SharedNews};
pub use handle::{EngineHandle, TriggerBy};
pub use lease::Lease;
use lease::lease_watchdog;

/// Something that happened, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    /// A fire was turned into a run (or skipped) at `at`, for `scheduled_at`.
    Fired {
        /// The fire's instant.
        scheduled_at: Timestamp,
        /// When the engine handled it.
        at: Timestamp,
    },
    /// An attempt's outcome was committed.
    AttemptFinished,
}

/// Receives [`EngineEvent`]s; it must be quick (it runs on the engine's task).
#[derive(Clone)]
pub struct Observer(pub Arc<dyn Fn(EngineEvent) + Send + Sync>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// Settings of the engine; every one has a safe default.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Attempts running at once in the in-process pool.
    pub pool_size: usize,
    /// A fire found overdue by less than this at start-up still counts as on time.
    pub misfire_grace: Duration,
    /// Output kept per attempt.
    pub max_output: usize,
    /// At most this many missed fires are recorded per job at recovery.
    pub max_missed_per_job: usize,
    /// At most this many runs one backfill creates.
    pub max_backfill: usize,
    /// Past this many tasks ready and waiting for a worker, manual
    /// triggers and backfills are refused ([`EngineError::Busy`]).
    pub max_ready_backlog: usize,
    /// Told about fires and attempts.
    pub observer: Option<Observer>,
    /// Counts fires, runs, attempts and commits for Prometheus.
    pub metrics: Option<Arc<crate::EngineMetrics>>,
    /// Records a span per run and per attempt.
    pub tracing: Option<crate::trace::Tracing>,
    /// Set when this engine is one node of a cluster.
    pub node: Option<NodeIdentity>,
    /// Where tasks with `run_on` go.
    pub remote: Option<RemoteWorkers>,
    /// Where the values of the secrets tasks refer to come from.
    pub secrets: Option<SecretSource>,
    /// How many runs of missed fires caught up may begin per second on
    /// this node, and per job (none: as they come). After a long outage a
    /// server catches up at this pace rather than in one burst.
    pub catch_up_pace: Option<CatchUpPace>,
    /// The free space attempts' output may not take (none: no check).
    pub output_reserve: Option<attempts::OutputReserve>,
    /// Whether commits go through (see [`WriteHealth`]).
    pub write_health: WriteHealth,
    /// Where the execution policies of namespaces come from; none: every
    /// executor is allowed (an engine without tenants, as in tests).
    pub policies: Option<PolicySource>,
    /// Scheduled fires one namespace may make per second on this node;
    /// the rest are recorded `skipped_quota` (none: no limit).
    pub max_fires_per_namespace: Option<u32>,
    /// Woken once a batch that put notifications in the outbox is
    /// committed (see [`crate::outbox::Outbox`]).
    pub outbox: Option<Arc<tokio::sync::Notify>>,
}

/// What looking up a policy answers: the namespace's policy, or why not.
pub type PolicyLookup<'a> = std::pin::Pin<
    Box<
        dyn Future<Output = Result<Arc<dagcron_core::exec_policy::ExecPolicy>, String>> + Send + 'a,
    >,
>;

/// Gives the execution policy of a namespace when an attempt starts (never
/// in the engine's loop); an attempt its policy refuses fails with the
/// rule it breaks, and one that runs carries the policy to its executor.
pub trait Policies: Send + Sync + 'static {
    /// The policy of `namespace`.
    fn policy<'a>(&'a self, namespace: &'a str) -> PolicyLookup<'a>;
    /// The weight of `namespace` in the pool's turns, as last read (1 if
    /// its policy was not read yet); asked in the engine's loop, so it
    /// must answer at once.
    fn weight(&self, namespace: &str) -> u32 {
        let _ = namespace;
        1
    }
}

/// The engine's link to the execution policies.
#[derive(Clone)]
pub struct PolicySource(pub Arc<dyn Policies>);

impl std::fmt::Debug for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicySource")
    }
}

/// The policy of `task`'s namespace if it lets the task run, or why not.
async fn allowed(
    source: Option<&PolicySource>,
    namespace: &str,
    task: &dagcron_core::Task,
) -> Result<Option<Arc<dagcron_core::exec_policy::ExecPolicy>>, String> {
    let Some(source) = source else {
        return Ok(None);
    };
    let policy = source.0.policy(namespace).await?;
    let refusals = policy.check(task);
    if refusals.is_empty() {
        return Ok(Some(policy));
    }
    let reasons: Vec<String> = refusals
        .iter()
        .map(|r| format!("{} ({}: {})", r.message, r.rule, r.path))
        .collect();
    Err(format!(
        "the execution policy of namespace {namespace} refuses this task: {}",
        reasons.join("; ")
    ))
}

/// What resolving secrets answers: the values by name, or why not.
pub type Resolved<'a> = std::pin::Pin<
    Box<
        dyn Future<Output = Result<std::collections::BTreeMap<String, String>, String>> + Send + 'a,
    >,
>;

/// Resolves the secrets a task refers to, in the task's namespace, when an
/// attempt starts (never in the engine's loop).
pub trait Secrets: Send + Sync + 'static {
    /// The values of `names` in `namespace`; an error says which is missing
    /// or could not be read.
    fn resolve<'a>(&'a self, namespace: &'a str, names: &'a BTreeSet<String>) -> Resolved<'a>;
}

/// The engine's link to the stored secrets.
#[derive(Clone)]
pub struct SecretSource(pub Arc<dyn Secrets>);

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretSource")
    }
}

/// The values of the secrets `executor` refers to.
async fn resolve_secrets(
    source: Option<&SecretSource>,
    namespace: &str,
    executor: &dagcron_core::Executor,
) -> Result<dagcron_exec::SecretValues, String> {
    let names = executor.secret_refs();
    if names.is_empty() {
        return Ok(dagcron_exec::SecretValues::default());
    }
    let Some(source) = source else {
        return Err("the task refers to secrets, and this server has none".into());
    };
    source
        .0
        .resolve(namespace, &names)
        .await
        .map(dagcron_exec::SecretValues)
}

fn failed(error: String) -> Outcome {
    Outcome::not_started(error)
}

/// How an attempt of `task` that ended so counts for its run: a shell
/// task's exit code it lists in `skip_on_exit_code` skips it.
fn end_of(ending: Ending, skip_on_exit_code: &[i32]) -> End {
    match ending {
        Ending::Failed(Failure::Exit(Some(code))) if skip_on_exit_code.contains(&code) => {
            End::Skipped
        }
        Ending::Succeeded => End::Succeeded,
        Ending::Cancelled => End::Cancelled,
        Ending::TimedOut => End::Failed(Failure::Timeout),
        Ending::Failed(failure) => End::Failed(failure),
    }
}

/// `outcome` of an attempt of a run whose other tasks hold `others` bytes
/// of outputs: a success whose outputs would take the run past its bound
/// fails, saying why (see [`dagcron_core::outputs::within_run`]).
fn within_run(outcome: Outcome, others: usize) -> Outcome {
    match dagcron_core::outputs::within_run(&outcome.outputs, others) {
        Err(e) if outcome.ending == Ending::Succeeded => Outcome {
            ending: Ending::Failed(Failure::Error(e.to_string())),
            error: Some(e.to_string()),
            outputs: Default::default(),
            ..outcome
        },
        _ => outcome,
    }
}

/// The bytes of outputs the slots of `run` other than `task` hold (a
/// mapped task's are its instances', counted there).
fn outputs_held(run: &RunEntry, task: usize) -> usize {
    run.outputs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != task && run.job.tasks.get(*i).is_none_or(|t| t.for_each.is_none()))
        .filter_map(|(_, o)| o.as_deref())
        .map(dagcron_core::outputs::size)
        .sum()
}

/// The outputs of each of the `slots` slots of a run of `job`, as its
/// stored `tasks` have them: the job's tasks, then the instances of its
/// mapped tasks in the order they are stored.
fn stored_outputs(
    job: &Job,
    tasks: &[dagcron_store::TaskRecord],
    slots: usize,
) -> Vec<Option<Arc<dagcron_core::outputs::Outputs>>> {
    let of = |r: &dagcron_store::TaskRecord| r.outputs().cloned().map(Arc::new);
    let mut out: Vec<_> = job
        .tasks
        .iter()
        .map(|t| of(tasks.iter().find(|r| r.id == t.id)?))
        .collect();
    out.extend(
        tasks
            .iter()
            .filter(|r| r.item.is_some())
            .map(of)
            .take(slots - job.tasks.len()),
    );
    out.resize(slots, None);
    out
}

/// The outcome of an attempt lost with its process or node.
fn lost(error: &str) -> Outcome {
    Outcome {
        outputs: Default::default(),
        ending: Ending::Failed(Failure::Lost),
        exit_code: None,
        error: Some(error.into()),
        log: vec![],
        lines: Vec::new(),
        start_error_us: None,
    }
}

/// An attempt for a remote worker agent.
pub struct RemoteTask {
    /// Its identity, environment and parameters.
    pub ctx: AttemptContext,
    /// What to run.
    pub executor: dagcron_core::Executor,
    /// Time limit.
    pub timeout: Option<Duration>,
    /// Labels the agent must have.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Output kept.
    pub max_output: usize,
    /// Cancelled when the attempt must stop.
    pub cancel: CancellationToken,
    /// Where the agent's output goes while it runs, for followers.
    pub live: Option<dagcron_exec::LiveLog>,
    /// The instant to start at, sent ahead of it (a job's `send_ahead`);
    /// none: at once.
    pub start_at: Option<Timestamp>,
    /// Which waiting attempt an agent gets first (see `dagcron_core::priority`).
    pub priority: i32,
    /// When it became ready to start (microseconds since the Unix epoch).
    pub ready_us: i64,
    /// Called once, with the outcome.
    pub report: Report,
}

/// Takes a remote attempt's outcome, and the id of the agent that ran it
/// (none: no agent took it).
pub type Report = Box<dyn FnOnce(Outcome, Option<String>) + Send>;

/// Remote worker agents: they take attempts and report their outcomes.
pub trait Remote: Send + Sync + 'static {
    /// Hands over an attempt; its `report` is called exactly once.
    fn submit(&self, task: RemoteTask);

    /// Whether an agent connected here could run a task of `namespace`
    /// needing `labels` (in a cluster, other attempts go to the node that
    /// has one).
    fn serves(&self, namespace: &str, labels: &std::collections::BTreeMap<String, String>) -> bool {
        let _ = (namespace, labels);
        true
    }

    /// [`Remote::serves`] for an instance of a mapped task, which needs an
    /// agent that takes items.
    fn serves_instances(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        self.serves(namespace, labels)
    }

    /// The connected agents with room: their labels and free slots, for
    /// claiming attempts other nodes could not place.
    fn rooms(&self) -> Vec<(std::collections::BTreeMap<String, String>, usize)> {
        vec![]
    }
}

/// The engine's link to remote worker agents.
#[derive(Clone)]
pub struct RemoteWorkers(pub Arc<dyn Remote>);

impl std::fmt::Debug for RemoteWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteWorkers")
    }
}

/// What a cluster node's engine needs to know of its registration.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    /// The node's slot, the low bits of the run ids it creates, so that two
    /// nodes never create the same id.
    pub slot: u8,
    /// The node's lease as this process sees it: past its end, the engine
    /// stops firing and writing.
    pub lease: Lease,
    /// Whether another live node could claim attempts handed to the
    /// cluster (kept by the coordinator; true until it first knows). A node
    /// alone keeps the tasks its pool has no room for in its own queue:
    /// handed to the cluster, they would only come back to it, through
    /// the database.
    pub peers: Arc<std::sync::atomic::AtomicBool>,
    /// How far this node's clock is ahead of the database's, in
    /// microseconds, as its last heartbeat measured it (kept by the
    /// coordinator; negative: behind). A fire waits until its instant has
    /// come by the database's clock too: a node ahead never fires early.
    pub ahead_us: Arc<std::sync::atomic::AtomicI64>,
}

/// Bits of a run id that hold the node's slot.
const SLOT_BITS: u32 = 5;

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            pool_size: 64,
            misfire_grace: Duration::from_secs(60),
            max_output: 1 << 20,
            max_missed_per_job: 10_000,
            max_backfill: 10_000,
            max_ready_backlog: 10_000,
            observer: None,
            metrics: None,
            tracing: None,
            node: None,
            remote: None,
            secrets: None,
            policies: None,
            max_fires_per_namespace: None,
            outbox: None,
            write_health: WriteHealth::default(),
            output_reserve: None,
            catch_up_pace: Some(CatchUpPace::default()),
        }
    }
}

/// Why the engine refused a command.
#[derive(Debug)]
pub enum EngineError {
    /// No such job or run.
    NotFound(String),
    /// The request conflicts with the current state (for example, triggering
    /// a `forbid` job while it runs, or a `buffer_one` job while a run waits).
    Conflict(String),
    /// The request is invalid.
    Invalid(String),
    /// Too much work waits: try again later (a manual trigger or backfill
    /// past the ready backlog, or past a job's `max_pending_runs`).
    Busy(String),
    /// The job has a run of this trigger's key already (see
    /// [`TriggerBy::key`]): no run was made.
    Duplicate(String),
    /// The store failed.
    Storage(StorageError),
    /// The engine has stopped.
    Stopped,
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotFound(m)
            | EngineError::Conflict(m)
            | EngineError::Invalid(m)
            | EngineError::Busy(m) => f.write_str(m),
            EngineError::Duplicate(key) => write!(f, "a run of key {key:?} was made already"),
            EngineError::Storage(e) => write!(f, "{e}"),
            EngineError::Stopped => f.write_str("the engine has stopped"),
        }
    }
}

impl std::error::Error for EngineError {}

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// Where an intervention on a task was carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intervened {
    /// Here: it is committed.
    Done,
    /// Asked of the cluster node that runs the run, through the store; it
    /// takes it in at its next round (and refuses it, in its log, if the
    /// task changed meanwhile).
    Asked,
}

/// A run's parameters.
type Params = std::collections::BTreeMap<String, String>;

/// The most runs one trigger may ask for.
pub const MAX_TRIGGER_RUNS: usize = 1000;

/// Which jobs a cluster node owns: `owns(namespace, name)`.
pub type Ownership = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

type JobKey = (String, String);

/// While the engine runs, a fire counts as missed (a suspended process, a
/// clock step) only if it is overdue by more than the misfire grace and at
/// least this: a grace of zero makes start-up strict, not every fire that
/// the loop handles a millisecond late a miss.
const RUNNING_GRACE_FLOOR: Duration = Duration::from_secs(2);

/// A batch being committed, and what it returns: the writes and their results.
type Commit = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = (Arc<Vec<Write>>, Result<Vec<WriteResult>, StorageError>)>
            + Send,
    >,
>;

/// Commits a batch, retrying a few times if the database is unavailable.
async fn commit_with_retries<S: Store>(
    store: &S,
    writes: &Arc<Vec<Write>>,
    metrics: Option<&crate::EngineMetrics>,
    health: &WriteHealth,
    stopping: &CancellationToken,
) -> Result<Vec<WriteResult>, StorageError> {
    if writes.is_empty() {
        return Ok(vec![]);
    }
    let began = std::time::Instant::now();
    let mut tries = 0;
    let mut pause = Duration::from_millis(100);
    let mut said: Option<std::time::Instant> = None;
    // Whether this commit counts among those failing for lack of space.
    let mut failing = false;
    loop {
        let result = store.write_shared(writes.clone()).await;
        if failing && !matches!(result, Err(StorageError::Full(_)) if !stopping.is_cancelled()) {
            failing = false;
            if health.leave() {
                tracing::warn!("commits go through again: the server is back to normal");
                if let Some(m) = metrics {
                    m.set_degraded(false);
                }
            }
        }
        match result {
            Ok(r) => {
                if let Some(m) = metrics {
                    m.committed(began.elapsed().as_secs_f64(), writes.len());
                }
                return Ok(r);
            }
            // No room left: degraded, not dead. The batch waits and is
            // tried again until there is room (nothing it would start runs
            // meanwhile: attempts start after their commit), the loop goes
            // on deciding into the next one, and readiness says why.
            Err(StorageError::Full(why)) if !stopping.is_cancelled() => {
                health.enter(!failing, format!("commits fail for lack of space: {why}"));
                failing = true;
                if let Some(m) = metrics {
                    m.set_degraded(true);
                }
                if said.is_none_or(|at| at.elapsed() >= DEGRADED_LOG_EVERY) {
                    tracing::error!(
                        "commits fail for lack of space ({why}): nothing starts, and what was decided waits in memory until there is room"
                    );
                    said = Some(std::time::Instant::now());
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stopping.cancelled() => {}
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) if tries < 5 && e.is_transient() => {
                if let Some(m) = metrics {
                    m.commit_retried();
                }
                tries += 1;
                tracing::warn!("commit failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(100 << tries)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The pace of catch-up runs (see [`EngineConfig::catch_up_pace`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatchUpPace {
    /// Runs of missed fires that may begin per second on this node.
    pub per_server: u32,
    /// ...and per job.
    pub per_job: u32,
}

impl Default for CatchUpPace {
    fn default() -> CatchUpPace {
        CatchUpPace {
            per_server: 50,
            per_job: 5,
        }
    }
}

/// Runs of missed fires waiting for their turn to begin: they count
/// against their job's limits from the moment they are made, and begin
/// as the server's and their job's allowances (token buckets of one
/// second's worth) let them, oldest first.
#[derive(Default)]
struct Pace {
    server: Option<policy::FireBucket>,
    jobs: HashMap<Arc<JobKey>, policy::FireBucket>,
    waiting: VecDeque<RunId>,
    /// Whether a [`Timer::Paced`] is armed.
    armed: bool,
}

/// How often waiting catch-up runs are looked at.
const PACE_TICK: SignedDuration = SignedDuration::from_millis(100);

/// How often a server whose commits fail for lack of space says so.
const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(5);

/// Whether the store takes the engine's commits; shared with the API's
/// readiness check. Commits in flight side by side (two write lanes) each
/// count: the server is back to normal once none fails.
#[derive(Clone, Debug, Default)]
pub struct WriteHealth(Arc<std::sync::Mutex<(usize, Option<String>)>>);

impl WriteHealth {
    /// Why commits fail now (none: they do not).
    pub fn problem(&self) -> Option<String> {
        self.0.lock().expect("write health lock").1.clone()
    }

    /// A commit fails for `why` (`first`: it had not failed before).
    fn enter(&self, first: bool, why: String) {
        let mut health = self.0.lock().expect("write health lock");
        health.0 += usize::from(first);
        health.1 = Some(why);
    }

    /// A commit that failed does not any more; returns whether none fails now.
    fn leave(&self) -> bool {
        let mut health = self.0.lock().expect("write health lock");
        health.0 = health.0.saturating_sub(1);
        if health.0 == 0 {
            health.1 = None;
        }
        health.0 == 0
    }
}

/// The fires of `job` in `[from, to)` that the ledger does not have yet,
/// by the scheduler's own rule (start and end dates included).
async fn backfill_fires<S: Store>(
    store: &S,
    key: &JobKey,
    job: &Arc<Job>,
    from: Timestamp,
    to: Timestamp,
    max: usize,
) -> Result<Vec<Timestamp>, EngineError> {
    let timing = job.timing();
    let listed = tokio::task::spawn_blocking(move || timing.fires_in(from, to, max))
        .await
        .map_err(|e| EngineError::Invalid(format!("listing the fires failed: {e}")))?;
    let Some(instants) = listed else {
        return Err(EngineError::Invalid(format!(
            "the range holds more than {max} fires; backfill a shorter range"
        )));
    };
    let recorded: HashSet<Timestamp> = store
        .list_fires(&key.0, &key.1, from, to, max as u32 + 1)
        .await
        .map_err(EngineError::Storage)?
        .into_iter()
        .map(|f| f.scheduled_at)
        .collect();
    Ok(instants
        .into_iter()
        .filter(|at| !recorded.contains(at))
        .collect())
}

fn no_such_job(key: &JobKey) -> EngineError {
    EngineError::NotFound(format!("no job {}/{}", key.0, key.1))
}

/// At most this many dropped runs are remembered between two moments when
/// no batch is in flight: past it, their refused writes are logged as
/// errors, nothing worse.
const MAX_DROPPED: usize = 10_000;

struct JobEntry {
    /// When it fires and what to do with missed fires: always in memory.
    timing: Timing,
    /// The whole job, kept only while a fire is near (see [`fires::KEEP_JOB`]);
    /// otherwise it is read from the store when needed.
    job: Option<Arc<Job>>,
    version: i64,
    paused: bool,
    /// The `paused` of the file last applied (see [`policy::paused_after_apply`]).
    file_paused: bool,
    /// Its failure breaker is open: its scheduled fires make no run (see
    /// [`dagcron_core::breaker`]).
    breaker_open: bool,
    /// What of its events the engine needs while the job is not whole in
    /// memory (none, for most jobs).
    events: Option<Box<JobEvents>>,
    /// Bumped on every change, so that timers armed for an older version are ignored.
    generation: u64,
    /// The latest fire recorded in the ledger (where the next search starts).
    last_fire: Option<Timestamp>,
    /// Runs started and not finished (a set: a job may have thousands,
    /// and each run leaves it as it ends).
    active: BTreeSet<RunId>,
    /// Runs waiting for a slot.
    queued: VecDeque<RunId>,
    /// Runs made ahead by a trigger for an instant, waiting for it.
    planned: HashSet<RunId>,
    /// Whether this node arms its fires (always, outside a cluster).
    owned: bool,
    /// When its spec was last applied (where catch-up starts if it never fired).
    applied_at: Timestamp,
    /// Its metric series, once it has fired or armed a fire here.
    series: Option<Box<crate::metrics::JobSeries>>,
}

/// What the engine keeps of a job's events beside its timing.
#[derive(Default)]
struct JobEvents {
    /// The job whose runs' ends start it (see [`dagcron_core::after`]):
    /// such a job is kept whole in memory, to make its runs in the commit
    /// of the upstream run's end.
    after: Option<dagcron_core::after::AfterTrigger>,
    /// Its notification rules about fires (`missed`, `skipped`), for fires
    /// recorded while it is not whole in memory.
    fire_rules: Vec<dagcron_core::notify::NotifyRule>,
    /// The messages that start it (see [`EngineHandle::nats_triggers`]).
    nats: Option<dagcron_core::message::NatsTrigger>,
}

impl JobEntry {
    /// Its `after` trigger.
    fn after(&self) -> Option<&dagcron_core::after::AfterTrigger> {
        self.events.as_ref()?.after.as_ref()
    }

    /// Its notification rules about fires.
    fn fire_rules(&self) -> &[dagcron_core::notify::NotifyRule] {
        self.events.as_ref().map_or(&[], |e| &e.fire_rules)
    }

    fn new(
        timing: Timing,
        version: i64,
        paused: bool,
        owned: bool,
        applied_at: Timestamp,
    ) -> Box<JobEntry> {
        Box::new(JobEntry {
            timing,
            job: None,
            version,
            paused,
            file_paused: paused,
            breaker_open: false,
            events: None,
            generation: 0,
            last_fire: None,
            active: BTreeSet::new(),
            queued: VecDeque::new(),
            planned: HashSet::new(),
            owned,
            applied_at,
            series: None,
        })
    }
}

struct RunEntry {
    key: Arc<JobKey>,
    job: Arc<Job>,
    scheduled_at: Timestamp,
    /// What made it.
    trigger: Trigger,
    params: std::collections::BTreeMap<String, String>,
    /// The outputs of its tasks that succeeded with some (a re-run's
    /// carried tasks keep those of the run re-run), by task index.
    outputs: Vec<Option<Arc<dagcron_core::outputs::Outputs>>>,
    /// Its state, its tasks' and their attempts' (every decision about it).
    machine: RunMachine,
    /// The cancellation of each task's attempt running here.
    tokens: Vec<Option<CancellationToken>>,
    /// For a run made ahead of its instant (`send_ahead`): nothing of it
    /// starts before this.
    start_at: Option<Timestamp>,
    /// A run of a missed fire caught up: it begins at the pace of
    /// [`EngineConfig::catch_up_pace`].
    caught_up: bool,
    /// When it was created (a run rebuilt after a restart keeps it).
    created_at: Timestamp,
    /// When each task last became ready, and when its attempt here started.
    times: Vec<TaskTimes>,
    /// Its trace, when traces are recorded or its caller sent one.
    trace: Option<RunTrace>,
    /// Its idempotency key, if its trigger gave one.
    trigger_key: Option<String>,
    /// The item of each instance of its mapped tasks (JSON), by slot past
    /// the job's tasks (see [`RunMachine::instances`]).
    items: Vec<Arc<str>>,
}

/// The slots of a run: the job's tasks, then the instances of its mapped
/// tasks (`outputs`, `tokens` and `times` are by slot).
impl RunEntry {
    /// The job's task slot `slot` runs (an instance: its mapped task).
    fn spec(&self, slot: usize) -> &dagcron_core::Task {
        &self.job.tasks[self.machine.task_of(slot)]
    }

    /// The task id of slot `slot`: an instance's is `task[index]`.
    fn task_id(&self, slot: usize) -> String {
        match self.item(slot) {
            Some((index, _)) => dagcron_core::fan_out::instance_id(&self.spec(slot).id, index),
            None => self.job.tasks[slot].id.clone(),
        }
    }

    /// The slot of task id `id`, if the run has it.
    fn slot_of(&self, id: &str) -> Option<usize> {
        let position = |id: &str| self.job.tasks.iter().position(|t| t.id == id);
        match dagcron_core::fan_out::parse_instance(id) {
            Some((task, index)) => {
                let slots = self.machine.instances(position(task)?)?;
                let slot = slots.start.checked_add(index)?;
                slots.contains(&slot).then_some(slot)
            }
            None => position(id),
        }
    }

    /// For an instance: its index among its task's and its item (JSON).
    fn item(&self, slot: usize) -> Option<(usize, &str)> {
        let declared = self.job.tasks.len();
        let item = self.items.get(slot.checked_sub(declared)?)?;
        let slots = self.machine.instances(self.machine.task_of(slot))?;
        Some((slot - slots.start, item))
    }

    /// Makes room for the slots the machine has (a task just expanded).
    fn grow(&mut self) {
        let n = self.machine.tasks().len();
        self.outputs.resize(n, None);
        self.tokens.resize(n, None);
        self.times.resize(n, TaskTimes::default());
    }
}

/// When a task of a run last became ready, and when its current attempt
/// started here (for queue wait and traces).
#[derive(Clone, Debug, Default)]
struct TaskTimes {
    ready: Option<Timestamp>,
    started: Option<Timestamp>,
    /// The remote agent its attempt that ended ran on.
    agent: Option<String>,
    /// The number of its attempt that ended last.
    ended: Option<u32>,
}

enum Timer {
    /// Loads the job of a fire a little ahead of it, then arms the fire.
    Prepare {
        key: Arc<JobKey>,
        generation: u64,
        at: Timestamp,
    },
    Fire {
        key: Arc<JobKey>,
        generation: u64,
        at: Timestamp,
    },
    Retry {
        run: RunId,
        task: usize,
    },
    Deadline {
        run: RunId,
    },
    /// The instant of a planned run.
    Planned {
        run: RunId,
    },
    /// Runs of missed fires wait for their turn to begin (see [`Pace`]).
    Paced,
    /// A fire the store refused as early, made again (its next fire is
    /// armed already).
    Refire {
        key: Arc<JobKey>,
        generation: u64,
        at: Timestamp,
    },
    /// The SLA deadline of a fire (see [`sla`]).
    Sla {
        key: Arc<JobKey>,
        scheduled: Timestamp,
        deadline: Timestamp,
        run: Option<RunId>,
    },
    /// Catch up missed fires again (reading their job failed).
    CatchUp {
        key: Arc<JobKey>,
        generation: u64,
        since: Timestamp,
        grace: Duration,
    },
}

/// What to do once the batch deciding it is committed.
enum Action {
    Spawn {
        run: RunId,
        task: usize,
        number: u32,
        /// The index of its `AttemptStart` in the batch.
        write: usize,
        /// What it counts against.
        lane: Lane,
    },
    /// Kill a running attempt (through its token): its stop is recorded
    /// first, so that nothing is acted on that a failed commit would undo.
    Kill(CancellationToken),
    /// Anything else done once the batch is committed (answering a caller,
    /// letting go of a live log).
    Then(Box<dyn FnOnce() + Send>),
    /// Done once the batch is committed, told whether the write at this
    /// index in the batch was done (a run refused for its key was not).
    IfDone {
        write: usize,
        then: Box<dyn FnOnce(bool) + Send>,
    },
}

/// The result of one attempt, sent back by the attempt task.
struct Finished {
    run: RunId,
    task: usize,
    number: u32,
    outcome: Outcome,
    at: Timestamp,
    /// What it counted against.
    lane: Lane,
    /// The agent that ran it.
    agent: Option<String>,
    /// Its live log's key in [`LiveLogs`], removed once its end is committed.
    live: Option<(RunId, String, u32)>,
}

/// xorshift64*: enough for retry jitter, and no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The engine's state; see the module documentation. Each part is a
/// struct of its own, next to the code that uses it most.
pub struct Engine<S: Store> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    /// The jobs and what is decided per job or namespace ([`jobs::Jobs`]).
    jobs: jobs::Jobs,
    /// The runs under way here ([`runs::Runs`]).
    runs: runs::Runs,
    /// What starts attempts: the ready queues and the room of each lane
    /// ([`dispatch::Dispatch`]).
    dispatch: dispatch::Dispatch,
    /// This node's share of the cluster's work ([`shared::Cluster`]).
    cluster: shared::Cluster,
    /// Every schedule, retry and deadline ([`timers::Timers`]).
    timers: timers::Timers,
    /// What is decided and not yet committed ([`commits::Batch`]).
    batch: commits::Batch,
    /// The loop's channels and its stop signals ([`run_loop::Life`]).
    life: run_loop::Life,
    rng: Rng,
}

/// An attempt run for another node.
struct Foreign {
    key: Arc<JobKey>,
    executor: &'static str,
    /// Its run's trace, and when it started here.
    trace: Option<RunTrace>,
    scheduled_at: Timestamp,
    started: Timestamp,
    task: String,
    number: u32,
    /// Its task's exit codes that skip it.
    skip_on_exit_code: Vec<i32>,
    /// The bytes of outputs the run's other tasks held when it was claimed.
    outputs_held: usize,
    token: CancellationToken,
    /// Its run's owner withdrew it (the store has it cancelled already).
    withdrawn: bool,
}

fn key_of(job: &Job) -> JobKey {
    (job.namespace.clone(), job.spec.name.clone())
}

/// The shared timetables of `cache` (see [`Engine::timetables`]).
fn timetables(
    cache: &std::sync::Mutex<dagcron_core::timings::TimetableCache>,
) -> std::sync::MutexGuard<'_, dagcron_core::timings::TimetableCache> {
    // It holds nothing a panic could leave half-changed that matters:
    // sharing timetables is an optimization.
    cache.lock().unwrap_or_else(|e| e.into_inner())
}

/// A job made ready to install (see [`Engine::install`]): its key, and its
/// timing with timetables shared through the engine's cache. An apply makes
/// its jobs ready beside the loop while the store writes them.
pub(super) struct Installable {
    key: Arc<JobKey>,
    timing: Timing,
    job: Arc<Job>,
}

/// The jobs of an apply on their way into the job table (the apply is
/// committed and answered). A large file is installed a slice at a time,
/// so that the fires due meanwhile are not held up; no other command is
/// taken before it is all in (a delete of one of its jobs, say, comes
/// after it).
pub(super) struct Installing {
    jobs: std::vec::IntoIter<(Installable, ApplyResult)>,
    resumed: Vec<JobKey>,
    /// When its commit came back (the jobs' instant of application).
    at: Timestamp,
}

/// How many jobs of an apply are installed before the loop looks at its
/// timers again (well under a millisecond of work).
const INSTALL_SLICE: usize = 1_000;

impl Installable {
    fn of(job: Job, cache: &mut dagcron_core::timings::TimetableCache) -> Installable {
        Installable {
            key: Arc::new(key_of(&job)),
            timing: job.timing_shared(cache),
            job: Arc::new(job),
        }
    }
}
