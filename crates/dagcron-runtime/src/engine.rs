//! The engine: one task that owns the scheduling state.
//!
//! It keeps one timer heap over every schedule, retry and deadline (no task
//! or polling loop per job), turns due fires into runs, plans each run's DAG,
//! and hands ready tasks to a bounded pool of attempt tasks. Every decision
//! is first appended to a batch of [`Write`]s; the batch is committed in one
//! transaction, and only then are its effects carried out (attempts started,
//! callers answered). A crash between the two loses no decision: on start,
//! the engine recovers from the store (missed fires by the misfire policy,
//! attempts that were running as `lost`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::policy::{self, FireDecision, FireOutcome};
use dagcron_core::{
    AttemptState, Delivery, Failure, Job, RetryDecision, RunState, TaskState, Timing,
};
use dagcron_exec::{AttemptContext, Ending, Limits, Outcome};
use dagcron_store::{
    ApplyResult, AttemptKey, ClaimedAttempt, JobUpsert, NewRun, RemoteAttempt, RunId, RunRecord,
    StorageError, Store, StoredJob, Trigger, Write, WriteResult,
};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;

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
    /// Told about fires and attempts.
    pub observer: Option<Observer>,
    /// Set when this engine is one node of a cluster.
    pub node: Option<NodeIdentity>,
    /// Where tasks with `run_on` go.
    pub remote: Option<RemoteWorkers>,
    /// Where the values of the secrets tasks refer to come from.
    pub secrets: Option<SecretSource>,
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
    fn resolve<'a>(
        &'a self,
        namespace: &'a str,
        names: &'a std::collections::BTreeSet<String>,
    ) -> Resolved<'a>;
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
    Outcome {
        ending: Ending::Failed(Failure::Error(error.clone())),
        exit_code: None,
        error: Some(error),
        log: vec![],
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
    /// Called once, with the outcome.
    pub report: Box<dyn FnOnce(Outcome) + Send>,
}

/// Remote worker agents: they take attempts and report their outcomes.
pub trait Remote: Send + Sync + 'static {
    /// Hands over an attempt; its `report` is called exactly once.
    fn submit(&self, task: RemoteTask);

    /// Whether an agent connected here could run a task needing `labels`
    /// (in a cluster, other attempts go to the node that has one).
    fn serves(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        let _ = labels;
        true
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
}

/// Bits of a run id that hold the node's slot.
const SLOT_BITS: u32 = 5;

/// The end of a node's lease, shared between the code that renews it and
/// the engine that must stop before it ends.
#[derive(Clone, Debug)]
pub struct Lease(Arc<LeaseInner>);

#[derive(Debug)]
struct LeaseInner {
    /// Microseconds since the epoch, by the engine's clock.
    end: std::sync::atomic::AtomicI64,
    revoked: CancellationToken,
}

impl Default for Lease {
    fn default() -> Lease {
        Lease::new()
    }
}

impl Lease {
    /// A lease that has already ended.
    pub fn new() -> Lease {
        Lease(Arc::new(LeaseInner {
            end: std::sync::atomic::AtomicI64::new(i64::MIN),
            revoked: CancellationToken::new(),
        }))
    }

    /// Moves the end of the lease (never backwards, never after a revocation).
    pub fn extend_to(&self, end: Timestamp) {
        if !self.0.revoked.is_cancelled() {
            self.0
                .end
                .fetch_max(end.as_microsecond(), std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Ends the lease now, for good: the engine stops at once.
    pub fn revoke(&self) {
        self.0.revoked.cancel();
        self.0
            .end
            .store(i64::MIN, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the lease still runs at `now`.
    pub fn is_valid_at(&self, now: Timestamp) -> bool {
        !self.0.revoked.is_cancelled()
            && now.as_microsecond() < self.0.end.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The current end of the lease.
    fn end(&self) -> Timestamp {
        Timestamp::from_microsecond(self.0.end.load(std::sync::atomic::Ordering::SeqCst))
            .unwrap_or(Timestamp::MIN)
    }
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            pool_size: 64,
            misfire_grace: Duration::from_secs(60),
            max_output: 1 << 20,
            max_missed_per_job: 10_000,
            max_backfill: 10_000,
            observer: None,
            node: None,
            remote: None,
            secrets: None,
        }
    }
}

/// Why the engine refused a command.
#[derive(Debug)]
pub enum EngineError {
    /// No such job or run.
    NotFound(String),
    /// The request conflicts with the current state (for example, triggering
    /// a `forbid` job while it runs).
    Conflict(String),
    /// The request is invalid.
    Invalid(String),
    /// The store failed.
    Storage(StorageError),
    /// The engine has stopped.
    Stopped,
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotFound(m) | EngineError::Conflict(m) | EngineError::Invalid(m) => {
                f.write_str(m)
            }
            EngineError::Storage(e) => write!(f, "{e}"),
            EngineError::Stopped => f.write_str("the engine has stopped"),
        }
    }
}

impl std::error::Error for EngineError {}

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// What the API asks of the engine.
pub(crate) enum Command {
    Apply {
        jobs: Vec<Job>,
        reply: Reply<Vec<(String, ApplyResult)>>,
    },
    Delete {
        namespace: String,
        name: String,
        reply: Reply<()>,
    },
    Pause {
        namespace: String,
        name: String,
        paused: bool,
        reply: Reply<()>,
    },
    Trigger {
        namespace: String,
        name: String,
        params: std::collections::BTreeMap<String, String>,
        reply: Reply<RunId>,
    },
    Backfill {
        namespace: String,
        name: String,
        from: Timestamp,
        to: Timestamp,
        reply: Reply<Vec<RunId>>,
    },
    /// The fires of a backfill, listed beside the loop: those of the range
    /// not yet in the ledger.
    Backfilled {
        key: JobKey,
        job: Arc<Job>,
        fires: Result<Vec<Timestamp>, EngineError>,
        reply: Reply<Vec<RunId>>,
    },
    Cancel {
        run: RunId,
        reply: Reply<()>,
    },
    /// A cluster node's share of the jobs changed.
    Own {
        owns: Ownership,
        reply: Reply<usize>,
    },
    /// Jobs changed in the store (applied through another node).
    Sync {
        changed: Vec<StoredJob>,
        deleted: Vec<(String, String)>,
        reply: Reply<usize>,
    },
    /// Runs taken over from a dead node; `alive` are the epochs of the
    /// nodes still alive (their attempts go on).
    Adopt {
        runs: Vec<RunRecord>,
        alive: HashSet<i64>,
        reply: Reply<()>,
    },
    /// Work shared across the cluster: claim attempts, learn the outcome of
    /// attempts others claimed, stop attempts withdrawn by their owners.
    Work {
        reply: Reply<()>,
    },
}

/// Which jobs a cluster node owns: `owns(namespace, name)`.
pub type Ownership = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

type JobKey = (String, String);

/// A job whose next fire is this close keeps its whole definition in
/// memory; others keep only their [`Timing`] and are read from the store
/// [`PREPARE_AHEAD`] before they fire. A million hourly jobs cost a few
/// hundred bytes each this way, and a job firing every second is not read
/// every second.
const KEEP_JOB: SignedDuration = SignedDuration::from_secs(5);
/// Half a second: cron fires fall on whole seconds, so reading never
/// competes with the fires of the same instant.
const PREPARE_AHEAD: SignedDuration = SignedDuration::from_millis(500);

/// While the engine runs, a fire counts as missed (a suspended process, a
/// clock step) only if it is overdue by more than the misfire grace and at
/// least this: a grace of zero makes start-up strict, not every fire that
/// the loop handles a millisecond late a miss.
const RUNNING_GRACE_FLOOR: Duration = Duration::from_secs(2);

/// A timer in the heap, ordered by instant, then by arming order.
struct Armed {
    at: Timestamp,
    seq: u64,
    timer: Timer,
}

impl PartialEq for Armed {
    fn eq(&self, other: &Armed) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Armed {}

impl PartialOrd for Armed {
    fn partial_cmp(&self, other: &Armed) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Armed {
    fn cmp(&self, other: &Armed) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A batch being committed, and what it returns: the writes and their results.
type Commit = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = (Vec<Write>, Result<Vec<WriteResult>, StorageError>)>
            + Send,
    >,
>;

/// Commits a batch, retrying a few times if the database is unavailable.
async fn commit_with_retries<S: Store>(
    store: &S,
    writes: &[Write],
) -> Result<Vec<WriteResult>, StorageError> {
    if writes.is_empty() {
        return Ok(vec![]);
    }
    let mut tries = 0;
    loop {
        match store.write(writes).await {
            Ok(r) => return Ok(r),
            Err(e) if tries < 5 && !matches!(e, StorageError::Fenced(_)) => {
                tries += 1;
                tracing::warn!("commit failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(100 << tries)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Kills every attempt of a cluster node once its lease ends (by this
/// process's clock) or is revoked, then waits until their processes are
/// gone, and only then says the node is fenced. It runs beside the engine's
/// loop, so that a loop waiting on a database that no longer answers (a
/// network partition) cannot keep attempts running past the lease, while
/// another node retries them.
async fn lease_watchdog(
    lease: Lease,
    clock: Arc<dyn Clock>,
    kill: CancellationToken,
    attempts: tokio_util::task::TaskTracker,
    done: CancellationToken,
    fenced: CancellationToken,
) {
    loop {
        let end = lease.end();
        tokio::select! {
            () = done.cancelled() => return,
            () = lease.0.revoked.cancelled() => break,
            () = clock.sleep_until(end) => {
                if !lease.is_valid_at(clock.now()) {
                    break;
                }
            }
        }
    }
    tracing::error!("this node's lease ended: killing every attempt it runs");
    kill.cancel();
    attempts.close();
    let bound = dagcron_exec::PIPE_GRACE + Duration::from_secs(3);
    if tokio::time::timeout(bound, attempts.wait()).await.is_err() {
        tracing::error!("attempts did not end within {bound:?} of being killed");
    }
    fenced.cancel();
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

struct JobEntry {
    /// When it fires and what to do with missed fires: always in memory.
    timing: Timing,
    /// The whole job, kept only while a fire is near (see [`KEEP_JOB`]);
    /// otherwise it is read from the store when needed.
    job: Option<Arc<Job>>,
    version: i64,
    paused: bool,
    /// The `paused` of the file last applied (see [`policy::paused_after_apply`]).
    file_paused: bool,
    /// Bumped on every change, so that timers armed for an older version are ignored.
    generation: u64,
    /// The latest fire recorded in the ledger (where the next search starts).
    last_fire: Option<Timestamp>,
    /// Runs started and not finished.
    active: Vec<RunId>,
    /// Runs waiting for a slot.
    queued: VecDeque<RunId>,
    /// Whether this node arms its fires (always, outside a cluster).
    owned: bool,
    /// When its spec was last applied (where catch-up starts if it never fired).
    applied_at: Timestamp,
}

impl JobEntry {
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
            generation: 0,
            last_fire: None,
            active: vec![],
            queued: VecDeque::new(),
            owned,
            applied_at,
        })
    }
}

struct RunEntry {
    key: Arc<JobKey>,
    job: Arc<Job>,
    scheduled_at: Timestamp,
    params: std::collections::BTreeMap<String, String>,
    state: RunState,
    tasks: Vec<TaskState>,
    attempts: Vec<u32>,
    tokens: Vec<Option<CancellationToken>>,
    /// Set when the run is being stopped (cancel, replace, deadline): its final state.
    closing: Option<RunState>,
    /// For a run made ahead of its instant (`send_ahead`): nothing of it
    /// starts before this.
    start_at: Option<Timestamp>,
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
}

enum Effect {
    Spawn {
        run: RunId,
        task: usize,
        number: u32,
        /// The index of its `AttemptStart` in the batch.
        write: usize,
        /// For a remote agent.
        remote: bool,
    },
    Reply(Box<dyn FnOnce() + Send>),
}

/// The result of one attempt, sent back by the attempt task.
struct Finished {
    run: RunId,
    task: usize,
    number: u32,
    outcome: Outcome,
    at: Timestamp,
    /// Run by a remote agent (not in this process's pool).
    remote: bool,
}

/// Tasks ready to start: for this process's pool, and for remote agents
/// (which the pool's size does not bound).
#[derive(Default)]
struct ReadyQueues {
    local: VecDeque<(RunId, usize)>,
    remote: VecDeque<(RunId, usize)>,
}

impl ReadyQueues {
    fn push(&mut self, job: &Job, run: RunId, task: usize) {
        if job.tasks[task].run_on.is_some() {
            self.remote.push_back((run, task));
        } else {
            self.local.push_back((run, task));
        }
    }
}

fn attempt_state_of(ending: &Ending) -> AttemptState {
    match ending {
        Ending::Succeeded => AttemptState::Succeeded,
        Ending::Failed(Failure::Lost) => AttemptState::Lost,
        Ending::Failed(_) => AttemptState::Failed,
        Ending::TimedOut => AttemptState::TimedOut,
        Ending::Cancelled => AttemptState::Cancelled,
    }
}

/// A handle to a running engine, for the API.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    live: LiveLogs,
    fenced: CancellationToken,
}

/// The output of attempts running in this process, by (run, task, attempt).
type LiveLogs = Arc<std::sync::Mutex<HashMap<(RunId, String, u32), dagcron_exec::LiveLog>>>;

impl EngineHandle {
    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .await
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Creates or updates jobs (already validated); answers after commit.
    pub async fn apply(&self, jobs: Vec<Job>) -> Result<Vec<(String, ApplyResult)>, EngineError> {
        self.ask(|reply| Command::Apply { jobs, reply }).await
    }

    /// Deletes a job; its history stays.
    pub async fn delete(&self, namespace: &str, name: &str) -> Result<(), EngineError> {
        self.ask(|reply| Command::Delete {
            namespace: namespace.into(),
            name: name.into(),
            reply,
        })
        .await
    }

    /// Pauses (or resumes) a job.
    pub async fn pause(
        &self,
        namespace: &str,
        name: &str,
        paused: bool,
    ) -> Result<(), EngineError> {
        self.ask(|reply| Command::Pause {
            namespace: namespace.into(),
            name: name.into(),
            paused,
            reply,
        })
        .await
    }

    /// Starts a run now with these parameters (over the job's defaults).
    pub async fn trigger(
        &self,
        namespace: &str,
        name: &str,
        params: std::collections::BTreeMap<String, String>,
    ) -> Result<RunId, EngineError> {
        self.ask(|reply| Command::Trigger {
            namespace: namespace.into(),
            name: name.into(),
            params,
            reply,
        })
        .await
    }

    /// Creates a run for every fire in `[from, to)` not already in the ledger.
    pub async fn backfill(
        &self,
        namespace: &str,
        name: &str,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<RunId>, EngineError> {
        self.ask(|reply| Command::Backfill {
            namespace: namespace.into(),
            name: name.into(),
            from,
            to,
            reply,
        })
        .await
    }

    /// The output so far of an attempt running in this process, to follow it.
    pub fn live_log(&self, run: RunId, task: &str, number: u32) -> Option<dagcron_exec::LiveLog> {
        self.live
            .lock()
            .expect("live logs lock")
            .get(&(run, task.to_string(), number))
            .cloned()
    }

    /// Tells a cluster node's engine which jobs it owns; returns how many.
    pub async fn set_ownership(&self, owns: Ownership) -> Result<usize, EngineError> {
        self.ask(|reply| Command::Own { owns, reply }).await
    }

    /// Takes in jobs changed and deleted through other nodes; returns how
    /// many jobs this node now owns.
    pub async fn sync_jobs(
        &self,
        changed: Vec<StoredJob>,
        deleted: Vec<(String, String)>,
    ) -> Result<usize, EngineError> {
        self.ask(|reply| Command::Sync {
            changed,
            deleted,
            reply,
        })
        .await
    }

    /// Hands the engine runs it now owns (after their node died); `alive`
    /// are the epochs of the nodes alive now.
    pub async fn adopt(
        &self,
        runs: Vec<RunRecord>,
        alive: HashSet<i64>,
    ) -> Result<(), EngineError> {
        self.ask(|reply| Command::Adopt { runs, alive, reply })
            .await
    }

    /// Does the cluster's shared work: claims attempts other nodes handed
    /// over (as many as the pool has room for), takes in the outcomes of
    /// this node's attempts that others ran, and stops the attempts it runs
    /// for others that their owners withdrew.
    pub async fn share_work(&self) -> Result<(), EngineError> {
        self.ask(|reply| Command::Work { reply }).await
    }

    /// Resolves once a cluster node's lease has ended and every attempt it
    /// ran has been killed and seen gone (or a bounded wait for them ran
    /// out): the process must stop, whatever its engine loop is doing.
    pub async fn fenced(&self) {
        self.fenced.cancelled().await;
    }

    /// Cancels a run: running attempts are stopped, pending tasks cancelled.
    /// A run of another cluster node is cancelled by that node.
    pub async fn cancel(&self, run: RunId) -> Result<(), EngineError> {
        self.ask(|reply| Command::Cancel { run, reply }).await
    }
}

/// The engine's state; see the module documentation.
pub struct Engine<S: Store> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    /// Boxed: a map's table is sized in powers of two, so empty slots
    /// cost a pointer rather than a whole entry.
    jobs: HashMap<Arc<JobKey>, Box<JobEntry>>,
    runs: HashMap<RunId, RunEntry>,
    heap: BinaryHeap<Reverse<Armed>>,
    next_timer: u64,
    ready: ReadyQueues,
    /// Attempts in this process's pool (at most `pool_size`).
    running: usize,
    /// Attempts handed to remote agents (their capacity bounds them).
    remote_running: usize,
    /// Attempt tasks started and not yet reported (`running` also counts
    /// the ones decided but not yet committed).
    started: usize,
    last_run_id: RunId,
    rng: u64,
    writes: Vec<Write>,
    effects: Vec<Effect>,
    finished_tx: mpsc::UnboundedSender<Finished>,
    finished_rx: mpsc::UnboundedReceiver<Finished>,
    commands: Option<mpsc::Receiver<Command>>,
    /// For work done beside the loop to report back as a command.
    commands_back: mpsc::WeakSender<Command>,
    /// The latest time a timer wake-up saw, to notice a clock stepping back.
    last_wake: Timestamp,
    /// Set once shutdown kills the attempts still running: their ends are
    /// recorded as lost, and nothing follows from them.
    killing: bool,
    /// The parent of every attempt's cancellation token: cancelled, it
    /// stops every attempt this engine runs, whatever the loop is doing.
    kill_switch: CancellationToken,
    /// The attempt tasks of the pool: waited for once they are killed.
    attempts: tokio_util::task::TaskTracker,
    /// Cancelled when `run` returns (stops the lease watchdog).
    done: CancellationToken,
    /// A cluster node's share of the jobs (`None`: all jobs, or none yet in a cluster).
    ownership: Option<Ownership>,
    /// Attempts of this node's runs handed to the cluster when its pool was
    /// full, by (run, task): their number.
    shared: HashMap<(RunId, usize), u32>,
    /// Output of the attempts running here, for followers.
    live: LiveLogs,
    /// Attempts this node claimed and runs for other nodes, by (run, task).
    foreign: HashMap<(RunId, usize), Foreign>,
}

/// An attempt run for another node.
struct Foreign {
    task: String,
    number: u32,
    token: CancellationToken,
}

fn key_of(job: &Job) -> JobKey {
    (job.namespace.clone(), job.spec.name.clone())
}

impl<S: Store> Engine<S> {
    /// Loads jobs and unfinished runs from the store, records missed fires,
    /// and returns the engine and a handle to it. Call [`Engine::run`] next.
    pub async fn start(
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<(Engine<S>, EngineHandle), StorageError> {
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::channel(1024);
        let now = clock.now();
        let mut engine = Engine {
            store: store.clone(),
            clock,
            config,
            jobs: HashMap::new(),
            runs: HashMap::new(),
            heap: BinaryHeap::new(),
            next_timer: 0,
            ready: ReadyQueues::default(),
            running: 0,
            remote_running: 0,
            started: 0,
            last_run_id: store.max_run_id().await?,
            rng: (now.as_nanosecond() as u64) | 1,
            writes: Vec::new(),
            effects: Vec::new(),
            finished_tx,
            finished_rx,
            commands: Some(rx),
            commands_back: tx.downgrade(),
            last_wake: now,
            killing: false,
            kill_switch: CancellationToken::new(),
            attempts: tokio_util::task::TaskTracker::new(),
            done: CancellationToken::new(),
            ownership: None,
            shared: HashMap::new(),
            foreign: HashMap::new(),
            live: LiveLogs::default(),
        };
        engine.recover(now).await?;
        let live = engine.live.clone();
        let fenced = CancellationToken::new();
        if let Some(node) = &engine.config.node {
            tokio::spawn(lease_watchdog(
                node.lease.clone(),
                engine.clock.clone(),
                engine.kill_switch.clone(),
                engine.attempts.clone(),
                engine.done.clone(),
                fenced.clone(),
            ));
        }
        let handle = EngineHandle { tx, live, fenced };
        Ok((engine, handle))
    }

    fn run_id(&mut self) -> RunId {
        // Increasing, and roughly the creation time in microseconds; in a
        // cluster, the low bits are the node's slot.
        let now = self.clock.now().as_microsecond();
        match &self.config.node {
            None => self.last_run_id = (self.last_run_id + 1).max(now),
            Some(node) => {
                let counter = ((self.last_run_id >> SLOT_BITS) + 1).max(now);
                self.last_run_id = (counter << SLOT_BITS) | RunId::from(node.slot);
            }
        }
        self.last_run_id
    }

    /// Whether this node arms the fires of `key`.
    fn owns(&self, key: &JobKey) -> bool {
        match (&self.config.node, &self.ownership) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(owns)) => owns(&key.0, &key.1),
        }
    }

    /// Installs a new or changed spec, stored at `version`, and arms it
    /// (unless it is paused: a new job takes `paused`, a known one keeps
    /// its state).
    fn install_job(
        &mut self,
        job: Job,
        version: i64,
        applied_at: Timestamp,
        now: Timestamp,
        paused: bool,
    ) {
        let key = key_of(&job);
        let owned = self.owns(&key);
        let timing = job.timing();
        let file_paused = job.spec.paused;
        let job = Arc::new(job);
        let entry = self
            .jobs
            .entry(Arc::new(key.clone()))
            .or_insert_with(|| JobEntry::new(timing.clone(), version, paused, owned, applied_at));
        entry.file_paused = file_paused;
        entry.timing = timing;
        entry.job = Some(job);
        entry.version = version;
        entry.generation += 1;
        entry.owned = owned;
        entry.applied_at = applied_at;
        let from = entry.last_fire.map_or(now, |l| l.max(now));
        self.arm_next_fire(&key, from);
    }

    /// Forgets a deleted job and cancels its runs.
    fn remove_job(&mut self, key: &JobKey, now: Timestamp) {
        if let Some(entry) = self.jobs.remove(key) {
            for run in entry
                .queued
                .iter()
                .chain(&entry.active)
                .copied()
                .collect::<Vec<_>>()
            {
                self.stop_run(run, RunState::Cancelled, now);
            }
        }
    }

    /// Sets a job's paused state in memory; returns what it was. Its armed
    /// timers no longer stand.
    fn pause_in_memory(&mut self, key: &JobKey, paused: bool) -> Option<bool> {
        let entry = self.jobs.get_mut(key)?;
        let was = entry.paused;
        entry.paused = paused;
        entry.generation += 1;
        if paused {
            entry.job = None;
        }
        Some(was)
    }

    /// Pauses or resumes a job in memory (the store has it already).
    async fn set_job_paused(
        &mut self,
        key: &JobKey,
        paused: bool,
        now: Timestamp,
    ) -> Result<(), StorageError> {
        let Some(was) = self.pause_in_memory(key, paused) else {
            return Ok(());
        };
        let entry = &self.jobs[key];
        if was && !paused && entry.owned {
            // Fires that came due while paused follow the misfire policy:
            // from the last fire, or (a job that never fired) from when it
            // was applied, since none was due between then and the pause.
            let since = entry.last_fire.unwrap_or(entry.applied_at);
            self.catch_up(key, since, now, Duration::ZERO).await?;
        }
        Ok(())
    }

    /// A new share of the jobs: stop arming the jobs lost, and resume the
    /// jobs gained from their last fire in the ledger.
    async fn set_ownership(
        &mut self,
        owns: Ownership,
        now: Timestamp,
    ) -> Result<usize, StorageError> {
        let mut gained = Vec::new();
        let mut owned = 0;
        for (key, entry) in &mut self.jobs {
            let now_owned = owns(&key.0, &key.1);
            owned += usize::from(now_owned);
            if now_owned != entry.owned {
                entry.owned = now_owned;
                entry.generation += 1;
                if !now_owned {
                    entry.job = None;
                } else if !entry.paused {
                    gained.push((**key).clone());
                }
            }
        }
        self.ownership = Some(owns);
        if gained.is_empty() {
            return Ok(owned);
        }
        let last = self.store.last_fires_of(&gained).await?;
        for (key, last) in gained.into_iter().zip(last) {
            let Some(entry) = self.jobs.get_mut(&key) else {
                continue;
            };
            entry.last_fire = last;
            let since = last.unwrap_or(entry.applied_at);
            self.catch_up(&key, since, now, self.config.misfire_grace)
                .await?;
        }
        Ok(owned)
    }

    /// Takes in jobs changed and deleted through other nodes (a change
    /// already known is ignored); returns how many jobs this node owns.
    async fn sync_jobs(
        &mut self,
        changed: Vec<StoredJob>,
        deleted: Vec<(String, String)>,
        now: Timestamp,
    ) -> Result<usize, StorageError> {
        for key in deleted {
            self.remove_job(&key, now);
        }
        for s in changed {
            let key = (s.namespace.clone(), s.name.clone());
            let (version, paused) = match self.jobs.get(&key) {
                Some(e) => (Some(e.version), e.paused),
                None => (None, false),
            };
            if version != Some(s.version) {
                match Job::from_canonical(&s.namespace, &s.spec) {
                    Ok(job) => {
                        if version.is_none() {
                            // Installed paused if it is, so that it never arms.
                            self.install_job(job, s.version, s.updated_at, now, s.paused);
                            continue;
                        }
                        self.install_job(job, s.version, s.updated_at, now, paused);
                    }
                    Err(e) => {
                        tracing::error!(namespace = %s.namespace, job = %s.name, "stored job no longer validates, not scheduling it: {e}");
                        continue;
                    }
                }
            }
            if paused != s.paused {
                self.set_job_paused(&key, s.paused, now).await?;
            }
        }
        Ok(self.jobs.values().filter(|e| e.owned).count())
    }

    /// Whether this engine may still fire and write.
    fn lease_valid(&self) -> bool {
        self.config
            .node
            .as_ref()
            .is_none_or(|n| n.lease.is_valid_at(self.clock.now()))
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: enough for jitter, and no dependency.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn arm(&mut self, at: Timestamp, timer: Timer) {
        let seq = self.next_timer;
        self.next_timer += 1;
        self.heap.push(Reverse(Armed { at, seq, timer }));
    }

    /// Arms the next fire of `key` after `after`: directly if the job is in
    /// memory and the fire is near, otherwise a [`Timer::Prepare`] ahead of it
    /// (and the whole job is let go until then).
    fn arm_next_fire(&mut self, key: &JobKey, after: Timestamp) {
        let now = self.clock.now();
        let Some(key) = self.jobs.get_key_value(key).map(|(k, _)| k.clone()) else {
            return;
        };
        let entry = self.jobs.get_mut(&*key).expect("job");
        let next = (!entry.paused && entry.owned)
            .then(|| entry.timing.next_fire_after(after))
            .flatten();
        // A run is made `send_ahead` before its instant (usually at it).
        let fire_at = next.map(|at| at.checked_sub(entry.timing.send_ahead).unwrap_or(at));
        // A job in memory stays if its next fire is near; any other is read
        // ahead of its fire (at once if that is already due).
        let keep =
            entry.job.is_some() && fire_at.is_some_and(|t| t.duration_since(now) <= KEEP_JOB);
        if !keep {
            entry.job = None;
        }
        let (Some(at), Some(fire_at)) = (next, fire_at) else {
            return;
        };
        let generation = entry.generation;
        if keep {
            self.arm(
                fire_at,
                Timer::Fire {
                    key,
                    generation,
                    at,
                },
            );
        } else {
            let early = fire_at.checked_sub(PREPARE_AHEAD).unwrap_or(fire_at);
            self.arm(
                early,
                Timer::Prepare {
                    key,
                    generation,
                    at,
                },
            );
        }
    }

    /// The whole job of `key`: from memory if a fire is near, otherwise
    /// from the store (`None` if it is gone or no longer validates).
    ///
    /// The future does not borrow the engine (which is not `Sync`).
    fn job_of(
        &self,
        key: &JobKey,
    ) -> impl Future<Output = Result<Option<Arc<Job>>, StorageError>> + Send + 'static {
        let cached = self.jobs.get(key).and_then(|e| e.job.clone());
        let store = self.store.clone();
        let key = key.clone();
        async move {
            if let Some(job) = cached {
                return Ok(Some(job));
            }
            let Some(stored) = store.get_job(&key.0, &key.1).await? else {
                return Ok(None);
            };
            match Job::from_canonical(&stored.namespace, &stored.spec) {
                Ok(job) => Ok(Some(Arc::new(job))),
                Err(e) => {
                    tracing::error!(namespace = %key.0, job = %key.1, "stored job no longer validates: {e}");
                    Ok(None)
                }
            }
        }
    }

    async fn recover(&mut self, now: Timestamp) -> Result<(), StorageError> {
        // A cluster node owns nothing until its first ring.
        let owned = self.config.node.is_none();
        dagcron_store::load_all_jobs(&*self.store.clone(), |stored| {
            let job = match Job::from_canonical(&stored.namespace, &stored.spec) {
                Ok(job) => job,
                Err(e) => {
                    tracing::error!(namespace = %stored.namespace, job = %stored.name, "stored job no longer validates, not scheduling it: {e}");
                    return;
                }
            };
            let mut entry = JobEntry::new(
                job.timing(),
                stored.version,
                stored.paused,
                owned,
                stored.updated_at,
            );
            entry.file_paused = job.spec.paused;
            self.jobs.insert(Arc::new(key_of(&job)), entry);
        })
        .await?;
        // Where each job resumes: its last recorded fire. (A cluster node
        // learns it when it comes to own the job.)
        if self.config.node.is_none() {
            for (namespace, name, at) in self.store.last_fires().await? {
                if let Some(entry) = self.jobs.get_mut(&(namespace, name)) {
                    entry.last_fire = Some(at);
                }
            }
        }
        // Unfinished runs: rebuild them; attempts that were running are lost.
        let active = self.store.active_runs().await?;
        if self.config.node.is_none() && !active.is_empty() {
            // A process of such an attempt that outlived the server (it was
            // killed with SIGKILL) would run beside its retry: kill it first.
            let running: HashSet<(RunId, String, u32)> = active
                .iter()
                .flat_map(|r| {
                    r.tasks.iter().flat_map(move |t| {
                        t.attempts
                            .iter()
                            .filter(|a| !a.state.is_terminal())
                            .map(move |a| (r.id, t.id.clone(), a.number))
                    })
                })
                .collect();
            if !running.is_empty() {
                let killed = tokio::task::spawn_blocking(move || {
                    dagcron_exec::tree::kill_attempts(&running)
                })
                .await
                .unwrap_or(0);
                if killed > 0 {
                    tracing::warn!(
                        "killed {killed} processes of attempts left running by the previous server"
                    );
                }
            }
        }
        for record in active {
            self.recover_run(record, &HashSet::new(), now).await?;
        }
        // Missed fires, per job, by its misfire policy, from its last
        // recorded fire, or from when it was applied if it never fired.
        let armed: Vec<Arc<JobKey>> = self
            .jobs
            .iter()
            .filter(|(_, e)| !e.paused && e.owned)
            .map(|(k, _)| k.clone())
            .collect();
        for key in armed {
            let entry = &self.jobs[&key];
            let since = entry.last_fire.unwrap_or(entry.applied_at);
            self.catch_up(&key, since, now, self.config.misfire_grace)
                .await?;
        }
        self.flush().await?;
        Ok(())
    }

    /// Records the fires of `key` in `(since, now - grace]` by the misfire
    /// policy, and arms the next fire.
    async fn catch_up(
        &mut self,
        key: &JobKey,
        since: Timestamp,
        now: Timestamp,
        grace: Duration,
    ) -> Result<(), StorageError> {
        let timing = &self.jobs[key].timing;
        let grace = SignedDuration::try_from(grace).unwrap_or(SignedDuration::ZERO);
        let cutoff = now.checked_sub(grace).unwrap_or(now);
        let mut missed = Vec::new();
        let mut t = since;
        while let Some(next) = timing.next_fire_after(t) {
            if next > cutoff || missed.len() >= self.config.max_missed_per_job {
                break;
            }
            missed.push(next);
            t = next;
        }
        if missed.len() >= self.config.max_missed_per_job {
            tracing::warn!(job = %format!("{}/{}", key.0, key.1), "more than {} missed fires; recording the first ones only", self.config.max_missed_per_job);
        }
        let outcomes = policy::catch_up(&missed, timing.misfire, timing.max_catchup);
        let job = if outcomes
            .iter()
            .any(|(_, o)| *o == FireOutcome::MissedCaughtUp)
        {
            self.job_of(key).await?
        } else {
            None
        };
        for (at, outcome) in outcomes {
            match (outcome, &job) {
                (FireOutcome::MissedCaughtUp, Some(job)) => {
                    self.fire(key, job, at, Trigger::Catchup, FireOutcome::MissedCaughtUp)
                }
                // Deleted meanwhile (through another node).
                (FireOutcome::MissedCaughtUp, None) => {}
                (other, _) => self.writes.push(Write::Fire {
                    namespace: key.0.clone(),
                    job: key.1.clone(),
                    scheduled_at: at,
                    outcome: other,
                    run: None,
                }),
            }
        }
        if let Some(last) = missed.last() {
            self.jobs.get_mut(key).expect("job").last_fire = Some(*last);
        }
        self.arm_next_fire(key, t.max(since));
        Ok(())
    }

    /// Rebuilds an unfinished run. Its attempts left running are lost,
    /// except, in a cluster, the ones waiting to be claimed or running on a
    /// node in `alive`: those go on.
    async fn recover_run(
        &mut self,
        record: RunRecord,
        alive: &HashSet<i64>,
        now: Timestamp,
    ) -> Result<(), StorageError> {
        let key = (record.namespace.clone(), record.job.clone());
        let found = match self.jobs.get_key_value(&key) {
            Some((key, _)) => {
                let key = key.clone();
                self.job_of(&key).await?.map(|job| (key, job))
            }
            None => None,
        };
        let Some((key, job)) = found else {
            tracing::warn!(
                run = record.id,
                "run of a deleted job left unfinished; cancelling it"
            );
            self.writes.push(Write::RunState {
                run: record.id,
                from: record.state,
                to: RunState::Cancelled,
                at: now,
            });
            return Ok(());
        };
        let index: HashMap<&str, usize> = job
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.as_str(), i))
            .collect();
        let mut tasks = vec![TaskState::Pending; job.tasks.len()];
        let mut attempts = vec![0u32; job.tasks.len()];
        let mut lost = Vec::new();
        let mut tokens = vec![None; job.tasks.len()];
        for t in &record.tasks {
            let Some(&i) = index.get(t.id.as_str()) else {
                continue;
            };
            tasks[i] = t.state;
            attempts[i] = t.attempts.iter().map(|a| a.number).max().unwrap_or(0);
            let goes_on = t.attempts.iter().find(|a| {
                !a.state.is_terminal()
                    && match a.node_epoch {
                        None => a.state == AttemptState::Dispatching,
                        Some(e) => alive.contains(&e),
                    }
            });
            if let Some(a) = goes_on {
                if let Some(foreign) = self.foreign.remove(&(record.id, i)) {
                    // This node already runs it for the dead owner: it is its own now.
                    tokens[i] = Some(foreign.token);
                } else {
                    self.shared.insert((record.id, i), a.number);
                }
                continue;
            }
            for a in &t.attempts {
                if !a.state.is_terminal() {
                    self.writes.push(Write::AttemptEnd {
                        run: record.id,
                        task: t.id.clone(),
                        number: a.number,
                        from: a.state,
                        to: AttemptState::Lost,
                        at: now,
                        exit_code: None,
                        error: Some("the process running this attempt stopped".into()),
                        log: vec![],
                        start_error_us: None,
                    });
                }
            }
            if matches!(t.state, TaskState::Running | TaskState::Dispatching) {
                lost.push((i, t.state));
            }
        }
        let run = RunEntry {
            key: key.clone(),
            job: job.clone(),
            scheduled_at: record.scheduled_at,
            params: record.params,
            state: record.state,
            tasks,
            attempts,
            tokens,
            closing: record.closing,
            start_at: None,
        };
        let id = record.id;
        self.runs.insert(id, run);
        let entry = self.jobs.get_mut(&key).expect("job");
        match record.state {
            RunState::Pending => entry.queued.push_back(id),
            _ => entry.active.push(id),
        }
        if record.state != RunState::Running {
            return Ok(());
        }
        for (i, from) in lost {
            let number = self.runs[&id].attempts[i];
            self.attempt_failed(id, i, number, from, Failure::Lost, now);
        }
        if let Some(closing) = record.closing {
            // It was being stopped: finish stopping it.
            self.runs.get_mut(&id).expect("run").closing = None;
            self.stop_run(id, closing, now);
            return Ok(());
        }
        for i in 0..job.tasks.len() {
            match self.runs[&id].tasks[i] {
                TaskState::Ready => self.ready.push(&job, id, i),
                TaskState::Retrying => self.arm(now, Timer::Retry { run: id, task: i }),
                _ => {}
            }
        }
        if let Some(deadline) = job.spec.deadline {
            let at = record
                .scheduled_at
                .max(record.created_at)
                .checked_add(SignedDuration::try_from(deadline.0).unwrap_or(SignedDuration::MAX))
                .unwrap_or(Timestamp::MAX);
            self.arm(at, Timer::Deadline { run: id });
        }
        self.advance(id, now);
        Ok(())
    }

    /// Runs the engine until `shutdown` is cancelled, then waits up to
    /// `drain` for running attempts. Attempts still running after that are
    /// recovered as lost on the next start.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
        drain: Duration,
    ) -> Result<(), StorageError> {
        let _done = self.done.clone().drop_guard();
        let result = self.run_loop(shutdown, drain).await;
        if let Err(e) = &result {
            // Fenced or the store is gone: nothing this engine started may go
            // on running, since another node may take its runs over. Kill
            // the attempts and wait (briefly) until they are gone.
            tracing::error!(
                "the engine stops: {e}; killing {} running attempts",
                self.started
            );
            self.cancel_all();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while self.started > 0 {
                match tokio::time::timeout_at(deadline, self.finished_rx.recv()).await {
                    Ok(Some(_)) => self.started -= 1,
                    _ => break,
                }
            }
        }
        result
    }

    async fn run_loop(
        &mut self,
        shutdown: CancellationToken,
        drain: Duration,
    ) -> Result<(), StorageError> {
        let mut commands = self.commands.take().expect("run is called once");
        self.dispatch();
        self.flush().await?;
        // Commits are pipelined: while one batch is being committed, the
        // loop keeps deciding (timers stay on time) into the next batch; a
        // batch's effects are carried out only when its commit is done, and
        // the next batch is committed only after it.
        let mut commit: Option<Commit> = None;
        let mut commit_effects = Vec::new();
        loop {
            let next = self.heap.peek().map(|Reverse(a)| a.at);
            let sleep = match next {
                Some(at) => self.clock.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            let mut committed = None;
            // A cluster node wakes when its lease would end, to stop in time
            // if it was not renewed, and at once if it is revoked.
            let (lease_end, revoked) = match &self.config.node {
                Some(node) => (
                    self.clock.sleep_until(node.lease.end()),
                    node.lease.0.revoked.clone(),
                ),
                None => (
                    Box::pin(std::future::pending())
                        as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
                    CancellationToken::new(),
                ),
            };
            tokio::select! {
                biased;
                () = revoked.cancelled() => self.check_lease()?,
                () = shutdown.cancelled() => break,
                done = async { commit.as_mut().expect("guarded").await }, if commit.is_some() => committed = Some(done),
                Some(done) = self.finished_rx.recv() => {
                    self.on_finished(done);
                    while let Ok(done) = self.finished_rx.try_recv() {
                        self.on_finished(done);
                    }
                }
                Some(cmd) = commands.recv() => {
                    self.on_command(cmd).await;
                    while let Ok(cmd) = commands.try_recv() {
                        self.on_command(cmd).await;
                    }
                }
                () = sleep => self.on_timers().await,
                () = lease_end => self.check_lease()?,
            }
            if let Some((writes, results)) = committed {
                commit = None;
                let results = results?;
                self.check_lease()?;
                self.committed(&writes, &results, std::mem::take(&mut commit_effects));
            }
            self.dispatch();
            if commit.is_none() && !(self.writes.is_empty() && self.effects.is_empty()) {
                self.check_lease()?;
                let writes = std::mem::take(&mut self.writes);
                commit_effects = std::mem::take(&mut self.effects);
                let store = self.store.clone();
                commit = Some(Box::pin(async move {
                    let results = commit_with_retries(&*store, &writes).await;
                    (writes, results)
                }));
            }
        }
        if let Some(pending) = commit {
            let (writes, results) = pending.await;
            self.committed(&writes, &results?, commit_effects);
        }
        // Graceful shutdown: no new fires or attempts; let running attempts finish.
        let deadline = tokio::time::Instant::now() + drain;
        while self.running + self.remote_running > 0 {
            match tokio::time::timeout_at(deadline, self.finished_rx.recv()).await {
                Ok(Some(done)) => {
                    self.on_finished(done);
                    self.ready = ReadyQueues::default();
                    self.flush().await?;
                }
                _ => break,
            }
        }
        if self.running + self.remote_running > 0 {
            // Nothing may outlive the server: a task left running would run
            // again beside its retry after the restart. Kill every attempt,
            // wait for it to be gone, and record it as lost (the delivery
            // policy decides after the restart).
            tracing::warn!(
                "{} attempts still running at the end of the shutdown grace; killing them",
                self.running + self.remote_running
            );
            self.killing = true;
            self.cancel_all();
            let deadline =
                tokio::time::Instant::now() + dagcron_exec::PIPE_GRACE + Duration::from_secs(3);
            while self.running + self.remote_running > 0 {
                match tokio::time::timeout_at(deadline, self.finished_rx.recv()).await {
                    Ok(Some(done)) => self.on_finished(done),
                    _ => break,
                }
            }
            self.flush().await?;
            if self.running + self.remote_running > 0 {
                tracing::error!(
                    "{} attempts did not report after being killed; they will be recovered as lost",
                    self.running + self.remote_running
                );
            }
        }
        Ok(())
    }

    /// Tells every attempt this engine runs (for itself or for other nodes) to stop.
    fn cancel_all(&self) {
        for run in self.runs.values() {
            for token in run.tokens.iter().flatten() {
                token.cancel();
            }
        }
        for foreign in self.foreign.values() {
            foreign.token.cancel();
        }
    }

    /// Refuses to go on once this node's lease has ended.
    fn check_lease(&self) -> Result<(), StorageError> {
        if self.lease_valid() {
            Ok(())
        } else {
            Err(StorageError::Fenced(
                "this node's lease ended before it could renew it".into(),
            ))
        }
    }

    /// Commits the batch, then carries out its effects.
    async fn flush(&mut self) -> Result<(), StorageError> {
        self.check_lease()?;
        let writes = std::mem::take(&mut self.writes);
        let results = commit_with_retries(&*self.store, &writes).await?;
        self.check_lease()?;
        let effects = std::mem::take(&mut self.effects);
        self.committed(&writes, &results, effects);
        Ok(())
    }

    /// A batch is committed: report refusals, then carry out its effects.
    fn committed(&mut self, writes: &[Write], results: &[WriteResult], effects: Vec<Effect>) {
        for (w, r) in writes.iter().zip(results) {
            if let WriteResult::Conflict(why) = r {
                // A fire already in the ledger is expected after a crash
                // between commit and arming; anything else is a bug.
                if matches!(w, Write::Fire { .. }) {
                    tracing::info!("{why}");
                } else {
                    tracing::error!("refused state change: {why}");
                }
            }
        }
        for effect in effects {
            match effect {
                Effect::Spawn {
                    run,
                    task,
                    number,
                    write,
                    remote,
                } => {
                    if results.get(write) == Some(&WriteResult::Done) {
                        self.spawn(run, task, number);
                    } else {
                        // Only a second engine acting on the same run could
                        // cause this; fencing is meant to make it impossible.
                        tracing::error!(run, task, number, "attempt not recorded; not starting it");
                        *self.lane(remote) -= 1;
                    }
                }
                Effect::Reply(f) => f(),
            }
        }
    }

    /// Answers a caller once the current batch is committed.
    fn reply_after_commit<T: Send + 'static>(
        &mut self,
        reply: Reply<T>,
        result: Result<T, EngineError>,
    ) {
        self.effects.push(Effect::Reply(Box::new(move || {
            let _ = reply.send(result);
        })));
    }

    fn spawn(&mut self, run_id: RunId, task: usize, number: u32) {
        let Some(run) = self.runs.get(&run_id) else {
            return;
        };
        let ctx = AttemptContext {
            namespace: run.key.0.clone(),
            job: run.key.1.clone(),
            run_id,
            task_id: run.job.tasks[task].id.clone(),
            attempt: number,
            scheduled_at: run.scheduled_at,
            idempotency_key: AttemptContext::idempotency_key_for(
                &run.key.0,
                &run.key.1,
                run_id,
                &run.job.tasks[task].id,
            ),
            params: run.params.clone(),
            secrets: Default::default(),
        };
        let token = run.tokens[task]
            .clone()
            .unwrap_or_else(|| self.kill_switch.child_token());
        let job = run.job.clone();
        let start_at = run.start_at.filter(|at| *at > self.clock.now());
        self.launch(&job, task, ctx, token, start_at);
    }

    /// Runs attempt `ctx` of task `task` of `job` in the pool, or on a
    /// remote agent; its outcome comes back as a [`Finished`]. With
    /// `start_at`, it starts at that instant (a remote agent is sent it ahead).
    fn launch(
        &mut self,
        job: &Job,
        task: usize,
        ctx: AttemptContext,
        token: CancellationToken,
        start_at: Option<Timestamp>,
    ) {
        let spec = &job.tasks[task];
        let (run_id, number) = (ctx.run_id, ctx.attempt);
        self.started += 1;
        // Counted against the agents, not this process's pool (see `dispatch`).
        let remote = spec.run_on.is_some();
        if spec.executor == dagcron_core::Executor::Noop && start_at.is_none() {
            // Nothing to run: report at once, without a task.
            let outcome = Outcome {
                ending: Ending::Succeeded,
                exit_code: None,
                error: None,
                log: vec![],
                start_error_us: None,
            };
            let _ = self.finished_tx.send(Finished {
                run: run_id,
                task,
                number,
                outcome,
                at: self.clock.now(),
                remote,
            });
            return;
        }
        let executor = spec.executor.clone();
        let timeout = spec.timeout.map(|d| d.0);
        let tx = self.finished_tx.clone();
        let clock = self.clock.clone();
        let limits = Limits {
            max_output: self.config.max_output,
        };
        let live = dagcron_exec::LiveLog::new(limits.max_output);
        let key = (ctx.run_id, ctx.task_id.clone(), ctx.attempt);
        self.live
            .lock()
            .expect("live logs lock")
            .insert(key.clone(), live.clone());
        let lives = self.live.clone();
        // The outcome goes back to the engine; the live log is done.
        let finish = move |outcome| {
            lives.lock().expect("live logs lock").remove(&key);
            let _ = tx.send(Finished {
                run: run_id,
                task,
                number,
                outcome,
                at: clock.now(),
                remote,
            });
        };
        if let Some(run_on) = &spec.run_on {
            let followed = live.clone();
            let report = move |outcome| {
                followed.finish();
                finish(outcome);
            };
            let Some(remote) = self.config.remote.clone() else {
                report(failed("this server takes no remote agents".into()));
                return;
            };
            let mut task = RemoteTask {
                ctx,
                executor,
                timeout,
                start_at,
                labels: run_on.labels.clone(),
                max_output: limits.max_output,
                cancel: token,
                live: Some(live),
                report: Box::new(report),
            };
            if task.executor.secret_refs().is_empty() {
                remote.0.submit(task);
                return;
            }
            // The secrets are read beside the loop, then go with the assignment.
            let secrets = self.config.secrets.clone();
            tokio::spawn(async move {
                match resolve_secrets(secrets.as_ref(), &task.ctx.namespace, &task.executor).await {
                    Ok(values) => {
                        task.ctx.secrets = values;
                        remote.0.submit(task);
                    }
                    Err(error) => (task.report)(failed(error)),
                }
            });
            return;
        }
        let attempt_clock = self.clock.clone();
        let secrets = self.config.secrets.clone();
        let mut ctx = ctx;
        self.attempts.spawn(async move {
            // A panic in an executor must not leave the attempt running forever.
            let work = tokio::spawn(async move {
                match resolve_secrets(secrets.as_ref(), &ctx.namespace, &executor).await {
                    Ok(values) => ctx.secrets = values,
                    Err(error) => {
                        live.finish();
                        return failed(error);
                    }
                }
                let mut start_error_us = None;
                if let Some(at) = start_at {
                    attempt_clock.sleep_until(at).await;
                    let late = attempt_clock.now().duration_since(at).as_micros();
                    start_error_us = Some(i64::try_from(late).unwrap_or(i64::MAX));
                }
                let mut outcome =
                    dagcron_exec::run_live(&executor, &ctx, timeout, token, limits, Some(&live))
                        .await;
                outcome.start_error_us = start_error_us;
                outcome
            });
            let outcome = work.await.unwrap_or_else(|e| {
                let error = format!("the executor failed: {e}");
                Outcome {
                    ending: Ending::Failed(Failure::Error(error.clone())),
                    exit_code: None,
                    error: Some(error),
                    log: vec![],
                    start_error_us: None,
                }
            });
            finish(outcome);
        });
    }

    /// The whole job of `key`, for a command: not found unless this engine
    /// schedules it.
    ///
    /// The job stays in memory while its runs go on (see [`Engine::let_go_if_idle`]).
    async fn known_job(&mut self, key: &JobKey) -> Result<Arc<Job>, EngineError> {
        if !self.jobs.contains_key(key) && self.config.node.is_some() {
            // Applied through another node, and not announced here yet: once
            // an apply has returned, every node accepts calls about the job.
            let stored = self
                .store
                .get_job(&key.0, &key.1)
                .await
                .map_err(EngineError::Storage)?;
            if let Some(stored) = stored {
                let now = self.clock.now();
                self.sync_jobs(vec![stored], vec![], now)
                    .await
                    .map_err(EngineError::Storage)?;
            }
        }
        if !self.jobs.contains_key(key) {
            return Err(no_such_job(key));
        }
        let job = self
            .job_of(key)
            .await
            .map_err(EngineError::Storage)?
            .ok_or_else(|| no_such_job(key))?;
        if let Some(entry) = self.jobs.get_mut(key) {
            entry.job = Some(job.clone());
        }
        Ok(job)
    }

    /// Whether a fire timer armed at `generation` still stands.
    fn current(&self, key: &JobKey, generation: u64) -> bool {
        self.jobs
            .get(key)
            .is_some_and(|e| e.generation == generation && !e.paused)
    }

    async fn on_timers(&mut self) {
        let now = self.clock.now();
        if now.duration_since(self.last_wake) < SignedDuration::from_secs(-1) {
            tracing::warn!(
                "the clock stepped back by {:.1}s; no instant fires twice: fires wait until the clock is past the last one",
                self.last_wake.duration_since(now).as_secs_f64()
            );
        }
        self.last_wake = self.last_wake.max(now);
        loop {
            // Fires whose job must be read first: those prepared ahead, and
            // any due without its job in memory.
            let mut to_read = Vec::new();
            while self.heap.peek().is_some_and(|Reverse(a)| a.at <= now) {
                let Some(Reverse(Armed { timer, .. })) = self.heap.pop() else {
                    break;
                };
                match timer {
                    Timer::Prepare {
                        key,
                        generation,
                        at,
                    } => {
                        if self.current(&key, generation) {
                            to_read.push((key, generation, at));
                        }
                    }
                    Timer::Fire {
                        key,
                        generation,
                        at,
                    } => {
                        if !self.current(&key, generation) {
                            continue;
                        }
                        // Ordinary delays (a busy loop, a slow commit) never
                        // count: at least RUNNING_GRACE_FLOOR.
                        let grace = self.config.misfire_grace.max(RUNNING_GRACE_FLOOR);
                        if now.duration_since(at)
                            > SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX)
                        {
                            // The process was suspended or the wall clock
                            // stepped forward: as after downtime, the fires
                            // overdue by more than the grace follow the
                            // misfire policy instead of firing in a burst.
                            tracing::warn!(
                                job = %format!("{}/{}", key.0, key.1),
                                "fire of {at} is {:.1}s overdue (was the process suspended, or did the clock step forward?); handling the missed fires by the misfire policy",
                                now.duration_since(at).as_secs_f64()
                            );
                            let since = at.checked_sub(SignedDuration::from_nanos(1)).unwrap_or(at);
                            if let Err(e) = self.catch_up(&key, since, now, grace).await {
                                tracing::warn!(
                                    "cannot read the job of missed fires; trying again: {e}"
                                );
                                let again =
                                    now.checked_add(SignedDuration::from_secs(1)).unwrap_or(now);
                                self.arm(
                                    again,
                                    Timer::Fire {
                                        key,
                                        generation,
                                        at,
                                    },
                                );
                            }
                            continue;
                        }
                        let Some(job) = self.jobs[&*key].job.clone() else {
                            to_read.push((key, generation, at));
                            continue;
                        };
                        self.fire(&key, &job, at, Trigger::Schedule, FireOutcome::Fired);
                        self.jobs.get_mut(&*key).expect("job").last_fire = Some(at);
                        self.arm_next_fire(&key, at);
                    }
                    Timer::Retry { run, task } => {
                        if let Some(r) = self.runs.get_mut(&run) {
                            if r.tasks[task] == TaskState::Retrying && r.closing.is_none() {
                                r.tasks[task] = TaskState::Ready;
                                self.writes.push(Write::TaskState {
                                    run,
                                    task: r.job.tasks[task].id.clone(),
                                    from: TaskState::Retrying,
                                    to: TaskState::Ready,
                                });
                                self.ready.push(&r.job, run, task);
                            }
                        }
                    }
                    Timer::Deadline { run } => {
                        if self
                            .runs
                            .get(&run)
                            .is_some_and(|r| r.state == RunState::Running)
                        {
                            tracing::info!(run, "run deadline passed; stopping it");
                            self.stop_run(run, RunState::Failed, now);
                        }
                    }
                }
            }
            if to_read.is_empty() {
                return;
            }
            // Read after the due fires are handled, so that reading never delays them.
            for (key, generation, at) in to_read {
                let Some(entry) = self.jobs.get(&*key) else {
                    continue;
                };
                let fire_at = at.checked_sub(entry.timing.send_ahead).unwrap_or(at);
                let at_or_retry = match self.job_of(&key).await {
                    Ok(Some(job)) => {
                        if let Some(entry) = self.jobs.get_mut(&*key) {
                            entry.job = Some(job);
                        }
                        fire_at
                    }
                    // Deleted through another node: the next sync forgets it.
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(job = %format!("{}/{}", key.0, key.1), "cannot read the job of a fire; trying again: {e}");
                        fire_at.max(now.checked_add(SignedDuration::from_secs(1)).unwrap_or(now))
                    }
                };
                let fire = Timer::Fire {
                    key,
                    generation,
                    at,
                };
                self.arm(at_or_retry, fire);
            }
        }
    }

    /// A fire of `key` at `at`: applies the overlap policy and records it.
    fn fire(
        &mut self,
        key: &JobKey,
        job: &Arc<Job>,
        at: Timestamp,
        trigger: Trigger,
        outcome: FireOutcome,
    ) {
        let now = self.clock.now();
        if let Some(o) = &self.config.observer {
            (o.0)(EngineEvent::Fired {
                scheduled_at: at,
                at: now,
            });
        }
        let decision = policy::on_fire(
            job.spec.concurrency,
            job.spec.max_active(),
            self.jobs[key].active.len() as u32,
        );
        if decision == FireDecision::Skip {
            self.writes.push(Write::Fire {
                namespace: key.0.clone(),
                job: key.1.clone(),
                scheduled_at: at,
                outcome: FireOutcome::SkippedOverlap,
                run: None,
            });
            return;
        }
        let run = self.new_run(
            key,
            job,
            trigger,
            at,
            job.spec.params.clone(),
            decision,
            now,
        );
        let id = run.id;
        if at > now {
            // Made ahead of its instant (`send_ahead`).
            self.runs.get_mut(&id).expect("run").start_at = Some(at);
        }
        self.writes.push(Write::Fire {
            namespace: key.0.clone(),
            job: key.1.clone(),
            scheduled_at: at,
            outcome,
            run: Some(run),
        });
        self.after_new_run(key, id, decision, now);
    }

    #[allow(clippy::too_many_arguments)]
    fn new_run(
        &mut self,
        key: &JobKey,
        job: &Arc<Job>,
        trigger: Trigger,
        at: Timestamp,
        params: std::collections::BTreeMap<String, String>,
        decision: FireDecision,
        now: Timestamp,
    ) -> NewRun {
        let id = self.run_id();
        let (key, entry) = self.jobs.get_key_value(key).expect("job");
        let (key, version) = (key.clone(), entry.version);
        let state = if matches!(decision, FireDecision::Queue | FireDecision::Replace) {
            RunState::Pending
        } else {
            RunState::Running
        };
        self.runs.insert(
            id,
            RunEntry {
                key: key.clone(),
                job: job.clone(),
                scheduled_at: at,
                params: params.clone(),
                state,
                tasks: vec![TaskState::Pending; job.tasks.len()],
                attempts: vec![0; job.tasks.len()],
                tokens: vec![None; job.tasks.len()],
                closing: None,
                start_at: None,
            },
        );
        NewRun {
            id,
            namespace: key.0.clone(),
            job: key.1.clone(),
            job_version: version,
            trigger,
            scheduled_at: at,
            params,
            state,
            tasks: job.tasks.iter().map(|t| t.id.clone()).collect(),
            created_at: now,
        }
    }

    fn after_new_run(&mut self, key: &JobKey, id: RunId, decision: FireDecision, now: Timestamp) {
        match decision {
            FireDecision::Replace => {
                // The new run waits until the runs it replaces have ended
                // (their attempts killed and recorded), then starts.
                let entry = &self.jobs[key];
                let replaced: Vec<RunId> =
                    entry.queued.iter().chain(&entry.active).copied().collect();
                for run in replaced {
                    self.stop_run(run, RunState::Cancelled, now);
                }
                self.jobs.get_mut(key).expect("job").queued.push_back(id);
                self.start_queued(key, now);
            }
            FireDecision::Queue => {
                self.jobs.get_mut(key).expect("job").queued.push_back(id);
            }
            FireDecision::Start | FireDecision::Skip => self.begin(id, now),
        }
    }

    /// A run enters `running`: arm its deadline and plan its first tasks.
    fn begin(&mut self, id: RunId, now: Timestamp) {
        let run = self.runs.get_mut(&id).expect("run");
        run.state = RunState::Running;
        let key = run.key.clone();
        let deadline = run.job.spec.deadline;
        self.jobs.get_mut(&key).expect("job").active.push(id);
        if let Some(d) = deadline {
            let at = now
                .checked_add(SignedDuration::try_from(d.0).unwrap_or(SignedDuration::MAX))
                .unwrap_or(Timestamp::MAX);
            self.arm(at, Timer::Deadline { run: id });
        }
        self.advance(id, now);
    }

    /// Plans the DAG until nothing changes; finishes the run when it is done.
    fn advance(&mut self, id: RunId, now: Timestamp) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if run.state != RunState::Running {
            return;
        }
        let rules: Vec<_> = run.job.tasks.iter().map(|t| t.trigger_rule).collect();
        if run.closing.is_none() {
            loop {
                let changes = run.job.dag.plan(&rules, &run.tasks);
                if changes.is_empty() {
                    break;
                }
                for (i, to) in changes {
                    self.writes.push(Write::TaskState {
                        run: id,
                        task: run.job.tasks[i].id.clone(),
                        from: TaskState::Pending,
                        to,
                    });
                    run.tasks[i] = to;
                    if to == TaskState::Ready {
                        self.ready.push(&run.job, id, i);
                    }
                }
            }
        }
        let outcome = if run.closing.is_some() {
            run.tasks
                .iter()
                .all(|t| t.is_terminal())
                .then(|| run.closing.expect("closing"))
        } else {
            policy::run_outcome(&run.tasks)
        };
        if let Some(final_state) = outcome {
            run.state = final_state;
            self.writes.push(Write::RunState {
                run: id,
                from: RunState::Running,
                to: final_state,
                at: now,
            });
            let key = run.key.clone();
            self.runs.remove(&id);
            let entry = self.jobs.get_mut(&key);
            if let Some(entry) = entry {
                entry.active.retain(|r| *r != id);
                self.start_queued(&key, now);
            }
            self.let_go_if_idle(&key, now);
        }
    }

    /// Drops the whole job of `key` from memory once it has no run and no
    /// fire near (a job triggered by hand stays while its runs go on).
    fn let_go_if_idle(&mut self, key: &JobKey, now: Timestamp) {
        let Some(entry) = self.jobs.get_mut(key) else {
            return;
        };
        if entry.job.is_none() || !entry.active.is_empty() || !entry.queued.is_empty() {
            return;
        }
        let near = entry
            .timing
            .next_fire_after(now)
            .is_some_and(|at| at.duration_since(now) <= KEEP_JOB);
        if !near || entry.paused || !entry.owned {
            entry.job = None;
        }
    }

    fn start_queued(&mut self, key: &JobKey, now: Timestamp) {
        loop {
            let Some(entry) = self.jobs.get_mut(key) else {
                return;
            };
            let Some(&next) = entry.queued.front() else {
                return;
            };
            // The limit of the job's version the run was made with.
            if entry.active.len() as u32 >= self.runs[&next].job.spec.max_active() {
                return;
            }
            entry.queued.pop_front();
            self.writes.push(Write::RunState {
                run: next,
                from: RunState::Pending,
                to: RunState::Running,
                at: now,
            });
            self.begin(next, now);
        }
    }

    /// Stops a run: pending work is cancelled, running attempts are told to stop.
    fn stop_run(&mut self, id: RunId, final_state: RunState, now: Timestamp) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        match run.state {
            RunState::Pending => {
                self.writes.push(Write::RunState {
                    run: id,
                    from: RunState::Pending,
                    to: RunState::Cancelled,
                    at: now,
                });
                let key = run.key.clone();
                self.runs.remove(&id);
                if let Some(e) = self.jobs.get_mut(&key) {
                    e.queued.retain(|r| *r != id);
                }
                return;
            }
            RunState::Running => {}
            _ => return,
        }
        if run.closing.is_none() {
            // Durable before it is acknowledged: after a crash, the run's
            // lost attempts are not retried.
            self.writes.push(Write::RunClosing {
                run: id,
                to: final_state,
            });
        }
        run.closing = Some(final_state);
        for i in 0..run.tasks.len() {
            let from = run.tasks[i];
            match from {
                TaskState::Pending | TaskState::Ready | TaskState::Retrying => {
                    run.tasks[i] = TaskState::Cancelled;
                    self.writes.push(Write::TaskState {
                        run: id,
                        task: run.job.tasks[i].id.clone(),
                        from,
                        to: TaskState::Cancelled,
                    });
                }
                TaskState::Running | TaskState::Dispatching => {
                    if let Some(number) = self.shared.remove(&(id, i)) {
                        // Handed to the cluster: withdraw it, claimed or not
                        // (one of each pair of changes applies); the node
                        // running it sees that and stops it.
                        let task = run.job.tasks[i].id.clone();
                        for from in [AttemptState::Dispatching, AttemptState::Running] {
                            self.writes.push(Write::AttemptEnd {
                                run: id,
                                task: task.clone(),
                                number,
                                from,
                                to: AttemptState::Cancelled,
                                at: now,
                                exit_code: None,
                                error: Some("the run was stopped".into()),
                                log: vec![],
                                start_error_us: None,
                            });
                        }
                        for from in [TaskState::Dispatching, TaskState::Running] {
                            self.writes.push(Write::TaskState {
                                run: id,
                                task: task.clone(),
                                from,
                                to: TaskState::Cancelled,
                            });
                        }
                        run.tasks[i] = TaskState::Cancelled;
                    } else if let Some(t) = &run.tokens[i] {
                        t.cancel();
                    }
                }
                _ => {}
            }
        }
        self.advance(id, now);
    }

    /// The count of attempts running in this process's pool, or on agents.
    fn lane(&mut self, remote: bool) -> &mut usize {
        if remote {
            &mut self.remote_running
        } else {
            &mut self.running
        }
    }

    /// Starts ready tasks: every one for a remote agent (the agent pool
    /// queues them fairly until an agent has room), and local ones while
    /// the pool has room. A cluster node whose pool is full hands local
    /// tasks to the cluster (a bounded number), for any node with room.
    fn dispatch(&mut self) {
        while let Some((id, i)) = self.ready.remote.pop_front() {
            self.dispatch_task(id, i, true);
        }
        loop {
            let here = self.running < self.config.pool_size;
            let share =
                !here && self.config.node.is_some() && self.shared.len() < self.config.pool_size;
            if !here && !share {
                break;
            }
            let Some((id, i)) = self.ready.local.pop_front() else {
                break;
            };
            self.dispatch_task(id, i, here);
        }
    }

    /// Starts an attempt of ready task `i` of run `id`: here if `here`,
    /// otherwise by handing it to the cluster.
    fn dispatch_task(&mut self, id: RunId, i: usize, here: bool) {
        let now = self.clock.now();
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if run.tasks[i] != TaskState::Ready || run.closing.is_some() {
            return;
        }
        let number = run.attempts[i] + 1;
        let task = run.job.tasks[i].id.clone();
        run.attempts[i] = number;
        // An attempt of a run made ahead starts at the run's instant.
        let starts = run.start_at.filter(|t| *t > now).unwrap_or(now);
        // A task for a remote agent goes to the cluster when no agent here
        // could run it (an agent may be connected to any node); the node
        // that claims it must have an agent with its labels.
        let needs = run.job.tasks[i].run_on.as_ref().map(|r| &r.labels);
        let elsewhere = self.config.node.is_some()
            && match (needs, &self.config.remote) {
                (Some(labels), Some(remote)) => !remote.0.serves(labels),
                _ => false,
            };
        if !here || elsewhere {
            let run_on = needs.cloned();
            run.tasks[i] = TaskState::Dispatching;
            self.writes.push(Write::TaskState {
                run: id,
                task: task.clone(),
                from: TaskState::Ready,
                to: TaskState::Dispatching,
            });
            self.writes.push(Write::AttemptStart {
                run: id,
                task,
                number,
                state: AttemptState::Dispatching,
                at: now,
                run_on,
            });
            self.shared.insert((id, i), number);
            return;
        }
        let remote = needs.is_some();
        run.tasks[i] = TaskState::Running;
        run.tokens[i] = Some(self.kill_switch.child_token());
        self.writes.push(Write::TaskState {
            run: id,
            task: task.clone(),
            from: TaskState::Ready,
            to: TaskState::Dispatching,
        });
        self.writes.push(Write::TaskState {
            run: id,
            task: task.clone(),
            from: TaskState::Dispatching,
            to: TaskState::Running,
        });
        let write = self.writes.len();
        self.writes.push(Write::AttemptStart {
            run: id,
            task,
            number,
            state: AttemptState::Running,
            at: starts,
            run_on: None,
        });
        self.effects.push(Effect::Spawn {
            run: id,
            task: i,
            number,
            write,
            remote,
        });
        *self.lane(remote) += 1;
    }

    fn on_finished(&mut self, done: Finished) {
        *self.lane(done.remote) -= 1;
        self.started -= 1;
        if let Some(o) = &self.config.observer {
            (o.0)(EngineEvent::AttemptFinished);
        }
        let Finished {
            run: id,
            task: i,
            number,
            outcome,
            at,
            ..
        } = done;
        if let Some(foreign) = self.foreign.remove(&(id, i)) {
            // Run for another node: record the result; the run's owner
            // decides what follows. A stale result is refused by the store.
            self.writes.push(Write::AttemptEnd {
                run: id,
                task: foreign.task,
                number: foreign.number,
                from: AttemptState::Running,
                to: attempt_state_of(&outcome.ending),
                at,
                exit_code: outcome.exit_code,
                error: outcome.error,
                log: outcome.log,
                start_error_us: outcome.start_error_us,
            });
            return;
        }
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        run.tokens[i] = None;
        let task = run.job.tasks[i].id.clone();
        if self.killing {
            // Killed at shutdown: lost, and its task left for the recovery
            // after the restart (retried or failed by the delivery policy).
            self.writes.push(Write::AttemptEnd {
                run: id,
                task,
                number,
                from: AttemptState::Running,
                to: AttemptState::Lost,
                at,
                exit_code: None,
                error: Some("the server shut down before the attempt ended; it was killed".into()),
                log: outcome.log,
                start_error_us: outcome.start_error_us,
            });
            return;
        }
        let to = attempt_state_of(&outcome.ending);
        self.writes.push(Write::AttemptEnd {
            run: id,
            task: task.clone(),
            number,
            from: AttemptState::Running,
            to,
            at,
            exit_code: outcome.exit_code,
            error: outcome.error.clone(),
            log: outcome.log,
            start_error_us: outcome.start_error_us,
        });
        self.task_ended(id, i, number, outcome.ending, at);
    }

    /// Task `i`'s attempt `number` ended (its attempt row is written): move
    /// the task on by the outcome, then the run.
    fn task_ended(&mut self, id: RunId, i: usize, number: u32, ending: Ending, at: Timestamp) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let task = run.job.tasks[i].id.clone();
        match ending {
            Ending::Succeeded => {
                run.tasks[i] = TaskState::Succeeded;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from: TaskState::Running,
                    to: TaskState::Succeeded,
                });
            }
            Ending::Cancelled => {
                run.tasks[i] = TaskState::Cancelled;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from: TaskState::Running,
                    to: TaskState::Cancelled,
                });
            }
            Ending::Failed(failure) => {
                self.attempt_failed(id, i, number, TaskState::Running, failure, at)
            }
            Ending::TimedOut => {
                self.attempt_failed(id, i, number, TaskState::Running, Failure::Timeout, at)
            }
        }
        self.advance(id, at);
    }

    /// Retry or give up after attempt `number` of task `i` failed.
    fn attempt_failed(
        &mut self,
        id: RunId,
        i: usize,
        number: u32,
        from: TaskState,
        failure: Failure,
        now: Timestamp,
    ) {
        let rand = self.random();
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let spec = &run.job.tasks[i];
        let task = spec.id.clone();
        let decision = if failure == Failure::Lost && run.job.spec.delivery == Delivery::AtMostOnce
        {
            RetryDecision::GiveUp("at-most-once delivery")
        } else if run.closing.is_some() {
            RetryDecision::GiveUp("the run is stopping")
        } else {
            spec.retry.decide(number, &failure, rand)
        };
        match decision {
            RetryDecision::Retry(delay) => {
                run.tasks[i] = TaskState::Retrying;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from,
                    to: TaskState::Retrying,
                });
                let at = now
                    .checked_add(SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX))
                    .unwrap_or(Timestamp::MAX);
                self.arm(at, Timer::Retry { run: id, task: i });
            }
            RetryDecision::GiveUp(_) => {
                run.tasks[i] = TaskState::Failed;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from,
                    to: TaskState::Failed,
                });
            }
        }
    }

    async fn on_command(&mut self, cmd: Command) {
        let now = self.clock.now();
        match cmd {
            Command::Apply { jobs, reply } => {
                let upserts: Vec<JobUpsert> = jobs.iter().map(JobUpsert::of).collect();
                // Applying is committed on its own, before the engine changes its timers.
                match self.store.apply_jobs(&upserts, now).await {
                    Ok(results) => {
                        let mut out = Vec::new();
                        let mut resumed = Vec::new();
                        for (job, result) in jobs.into_iter().zip(results) {
                            out.push((job.key(), result));
                            if let ApplyResult::Created(v) | ApplyResult::Updated(v) = result {
                                // The store applied the same rule to its row.
                                let key = key_of(&job);
                                let before = self.jobs.get(&key).map(|e| (e.paused, e.file_paused));
                                let paused = policy::paused_after_apply(before, job.spec.paused);
                                match before {
                                    Some((true, _)) if !paused => {
                                        // Resumed by the file: as a resume through the API.
                                        self.install_job(job, v, now, now, true);
                                        resumed.push(key);
                                    }
                                    Some((false, _)) if paused => {
                                        self.install_job(job, v, now, now, false);
                                        self.pause_in_memory(&key, true);
                                    }
                                    _ => self.install_job(job, v, now, now, paused),
                                }
                            }
                        }
                        let mut result = Ok(out);
                        for key in resumed {
                            if let Err(e) = self.set_job_paused(&key, false, now).await {
                                result = Err(EngineError::Storage(e));
                            }
                        }
                        self.reply_after_commit(reply, result);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(EngineError::Storage(e)));
                    }
                }
            }
            Command::Delete {
                namespace,
                name,
                reply,
            } => {
                let result = match self.store.delete_job(&namespace, &name).await {
                    Ok(true) => {
                        self.remove_job(&(namespace.clone(), name.clone()), now);
                        Ok(())
                    }
                    Ok(false) => Err(no_such_job(&(namespace, name))),
                    Err(e) => Err(EngineError::Storage(e)),
                };
                self.reply_after_commit(reply, result);
            }
            Command::Pause {
                namespace,
                name,
                paused,
                reply,
            } => {
                let key = (namespace, name);
                let result = match self.store.set_paused(&key.0, &key.1, paused).await {
                    Ok(true) => self
                        .set_job_paused(&key, paused, now)
                        .await
                        .map_err(EngineError::Storage),
                    Ok(false) => Err(no_such_job(&key)),
                    Err(e) => Err(EngineError::Storage(e)),
                };
                self.reply_after_commit(reply, result);
            }
            Command::Trigger {
                namespace,
                name,
                params,
                reply,
            } => {
                let key = (namespace, name);
                let job = match self.known_job(&key).await {
                    Ok(job) => job,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                let decision = policy::on_fire(
                    job.spec.concurrency,
                    job.spec.max_active(),
                    self.jobs[&key].active.len() as u32,
                );
                if decision == FireDecision::Skip {
                    let _ = reply.send(Err(EngineError::Conflict(format!(
                        "{}/{} has a run active and its concurrency policy is forbid",
                        key.0, key.1
                    ))));
                    return;
                }
                let mut merged = job.spec.params.clone();
                merged.extend(params);
                let run = self.new_run(&key, &job, Trigger::Manual, now, merged, decision, now);
                let id = run.id;
                self.writes.push(Write::Run(run));
                self.after_new_run(&key, id, decision, now);
                self.reply_after_commit(reply, Ok(id));
            }
            Command::Backfill {
                namespace,
                name,
                from,
                to,
                reply,
            } => {
                let key = (namespace, name);
                if to <= from {
                    let _ = reply.send(Err(EngineError::Invalid(format!(
                        "`to` ({to}) must be after `from` ({from})"
                    ))));
                    return;
                }
                let job = match self.known_job(&key).await {
                    Ok(job) => job,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                let Some(back) = self.commands_back.upgrade() else {
                    return;
                };
                // Listing the fires of a long range over many schedules takes
                // a while: it is done beside the loop, so no fire waits for it.
                let store = self.store.clone();
                let max = self.config.max_backfill;
                tokio::spawn(async move {
                    let fires = backfill_fires(&*store, &key, &job, from, to, max).await;
                    let _ = back
                        .send(Command::Backfilled {
                            key,
                            job,
                            fires,
                            reply,
                        })
                        .await;
                });
            }
            Command::Backfilled {
                key,
                job,
                fires,
                reply,
            } => {
                let fires = match fires {
                    Ok(_) if !self.jobs.contains_key(&key) => Err(no_such_job(&key)),
                    other => other,
                };
                let instants = match fires {
                    Ok(instants) => instants,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                let mut ids = Vec::new();
                for at in instants {
                    let run = self.new_run(
                        &key,
                        &job,
                        Trigger::Backfill,
                        at,
                        job.spec.params.clone(),
                        FireDecision::Queue,
                        now,
                    );
                    let id = run.id;
                    // A fire recorded meanwhile is refused by the store, and
                    // its run is not created.
                    self.writes.push(Write::Fire {
                        namespace: key.0.clone(),
                        job: key.1.clone(),
                        scheduled_at: at,
                        outcome: FireOutcome::Fired,
                        run: Some(run),
                    });
                    self.jobs.get_mut(&key).expect("job").queued.push_back(id);
                    ids.push(id);
                }
                self.start_queued(&key, now);
                self.let_go_if_idle(&key, now);
                self.reply_after_commit(reply, Ok(ids));
            }
            Command::Cancel { run, reply } => {
                let result = if self.runs.contains_key(&run) {
                    self.stop_run(run, RunState::Cancelled, now);
                    Ok(())
                } else {
                    match self.store.get_run(run).await {
                        Ok(Some(r)) if !r.state.is_terminal() => {
                            match self.store.request_cancel(run).await {
                                Ok(true) => Ok(()),
                                Ok(false) => Err(EngineError::Conflict(format!(
                                    "run {run} is {} and no node runs it",
                                    r.state
                                ))),
                                Err(e) => Err(EngineError::Storage(e)),
                            }
                        }
                        Ok(Some(r)) => Err(EngineError::Conflict(format!(
                            "run {run} is already {}",
                            r.state
                        ))),
                        Ok(None) => Err(EngineError::NotFound(format!("no run {run}"))),
                        Err(e) => Err(EngineError::Storage(e)),
                    }
                };
                self.reply_after_commit(reply, result);
            }
            Command::Own { owns, reply } => {
                let result = self
                    .set_ownership(owns, now)
                    .await
                    .map_err(EngineError::Storage);
                self.reply_after_commit(reply, result);
            }
            Command::Sync {
                changed,
                deleted,
                reply,
            } => {
                let result = self
                    .sync_jobs(changed, deleted, now)
                    .await
                    .map_err(EngineError::Storage);
                self.reply_after_commit(reply, result);
            }
            Command::Adopt { runs, alive, reply } => {
                let mut result = Ok(());
                for record in runs {
                    if !self.runs.contains_key(&record.id) {
                        tracing::info!(run = record.id, job = %format!("{}/{}", record.namespace, record.job), "taking over a run of a node that is gone");
                        if let Err(e) = self.recover_run(record, &alive, now).await {
                            result = Err(EngineError::Storage(e));
                            break;
                        }
                    }
                }
                self.reply_after_commit(reply, result);
            }
            Command::Work { reply } => {
                let result = self.share_work(now).await.map_err(EngineError::Storage);
                self.reply_after_commit(reply, result);
            }
        }
    }

    /// See [`EngineHandle::share_work`].
    async fn share_work(&mut self, now: Timestamp) -> Result<(), StorageError> {
        if self.config.node.is_none() {
            return Ok(());
        }
        let room = self.config.pool_size.saturating_sub(self.running);
        let agents = match &self.config.remote {
            Some(remote) if room > 0 => remote.0.rooms(),
            _ => vec![],
        };
        if room > 0 && self.lease_valid() {
            for claim in self.store.claim_attempts(room, &agents, now).await? {
                let key = (claim.namespace.clone(), claim.job.clone());
                let job = match self.runs.get(&claim.run) {
                    Some(run) => Some(run.job.clone()),
                    None => self.job_of(&key).await?,
                };
                self.take_claim(claim, job, now);
            }
        }
        if !self.shared.is_empty() {
            for remote in self.store.remote_attempts().await? {
                self.remote_progress(remote, now);
            }
        }
        if !self.foreign.is_empty() {
            let keys: Vec<AttemptKey> = self
                .foreign
                .iter()
                .map(|((run, _), f)| (*run, f.task.clone(), f.number))
                .collect();
            let withdrawn: HashSet<AttemptKey> = self
                .store
                .withdrawn_attempts(&keys)
                .await?
                .into_iter()
                .collect();
            for ((run, _), f) in &self.foreign {
                if withdrawn.contains(&(*run, f.task.clone(), f.number)) {
                    tracing::info!(run, task = %f.task, number = f.number, "attempt withdrawn by its run's owner; stopping it");
                    f.token.cancel();
                }
            }
        }
        Ok(())
    }

    /// Starts an attempt claimed from the cluster: one of this node's own
    /// (its pool has room again), or one run for another node.
    fn take_claim(&mut self, claim: ClaimedAttempt, job: Option<Arc<Job>>, now: Timestamp) {
        let found = job.and_then(|job| {
            let i = job.tasks.iter().position(|t| t.id == claim.task)?;
            Some((job, i))
        });
        let Some((job, i)) = found else {
            self.writes.push(Write::AttemptEnd {
                run: claim.run,
                task: claim.task.clone(),
                number: claim.number,
                from: AttemptState::Running,
                to: AttemptState::Failed,
                at: now,
                exit_code: None,
                error: Some(format!(
                    "job {}/{} or its task {} no longer exists",
                    claim.namespace, claim.job, claim.task
                )),
                log: vec![],
                start_error_us: None,
            });
            return;
        };
        let token = self.kill_switch.child_token();
        *self.lane(job.tasks[i].run_on.is_some()) += 1;
        if let Some(run) = self.runs.get_mut(&claim.run) {
            // Handed over earlier, taken back now.
            self.shared.remove(&(claim.run, i));
            run.tasks[i] = TaskState::Running;
            run.tokens[i] = Some(token);
            self.spawn(claim.run, i, claim.number);
            return;
        }
        let scheduled_at = claim.scheduled_at;
        let ctx = AttemptContext {
            idempotency_key: AttemptContext::idempotency_key_for(
                &claim.namespace,
                &claim.job,
                claim.run,
                &claim.task,
            ),
            namespace: claim.namespace,
            job: claim.job,
            run_id: claim.run,
            task_id: claim.task.clone(),
            attempt: claim.number,
            scheduled_at: claim.scheduled_at,
            params: claim.params,
            secrets: Default::default(),
        };
        self.foreign.insert(
            (claim.run, i),
            Foreign {
                task: claim.task,
                number: claim.number,
                token: token.clone(),
            },
        );
        // An attempt of a run made ahead of its instant waits for it.
        let start_at = Some(scheduled_at).filter(|t| *t > now);
        self.launch(&job, i, ctx, token, start_at);
    }

    /// News of an attempt of this node's that another node claimed.
    fn remote_progress(&mut self, remote: RemoteAttempt, now: Timestamp) {
        let Some(run) = self.runs.get_mut(&remote.run) else {
            return;
        };
        let Some(i) = run.job.tasks.iter().position(|t| t.id == remote.task) else {
            return;
        };
        if self.shared.get(&(remote.run, i)) != Some(&remote.number) {
            return;
        }
        let id = remote.run;
        let ending = match remote.state {
            AttemptState::Dispatching => return,
            AttemptState::Running if remote.executor_alive => {
                run.tasks[i] = TaskState::Running;
                return;
            }
            AttemptState::Running => {
                // Its node died: the attempt is lost.
                self.writes.push(Write::AttemptEnd {
                    run: id,
                    task: remote.task.clone(),
                    number: remote.number,
                    from: AttemptState::Running,
                    to: AttemptState::Lost,
                    at: now,
                    exit_code: None,
                    error: Some("the node running this attempt stopped".into()),
                    log: vec![],
                    start_error_us: None,
                });
                None
            }
            AttemptState::Lost => None,
            AttemptState::Succeeded => Some(Ending::Succeeded),
            AttemptState::Cancelled => Some(Ending::Cancelled),
            AttemptState::TimedOut => Some(Ending::TimedOut),
            AttemptState::Failed => {
                let failure = match (&run.job.tasks[i].executor, remote.exit_code) {
                    (dagcron_core::Executor::Http(_), Some(code)) => {
                        Failure::HttpStatus(u16::try_from(code).unwrap_or(0))
                    }
                    (_, Some(code)) => Failure::Exit(Some(code)),
                    (_, None) => Failure::Error(remote.error.clone().unwrap_or_default()),
                };
                Some(Ending::Failed(failure))
            }
        };
        self.shared.remove(&(id, i));
        run.tasks[i] = TaskState::Running;
        match ending {
            Some(ending) => self.task_ended(id, i, remote.number, ending, now),
            None => {
                self.attempt_failed(id, i, remote.number, TaskState::Running, Failure::Lost, now);
                self.advance(id, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One backfill over a job with many schedules held the loop for 52 s,
    /// every other job firing that late. Handling the command now only
    /// starts the listing beside the loop: nothing is decided until the
    /// listed fires come back as a command of their own.
    #[tokio::test]
    async fn regression_a_backfill_does_not_hold_the_loop() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            dagcron_store_sqlite::SqliteStore::open(&dir.path().join("db"))
                .await
                .unwrap(),
        );
        let clock = Arc::new(crate::ManualClock::new(
            "2026-01-10T00:00:00Z".parse().unwrap(),
        ));
        let (mut engine, _handle) = Engine::start(store, clock, EngineConfig::default())
            .await
            .unwrap();
        let mut commands = engine.commands.take().unwrap();
        // 64 schedules: one per second of each minute, and 4 more at the same instants.
        let schedules: Vec<String> = (0..64)
            .map(|i| match i {
                0..60 => format!("'{i} * * * * *'"),
                _ => format!("'{} */2 * * * *'", i - 60),
            })
            .collect();
        let file: dagcron_core::JobFile = serde_saphyr::from_str(&format!(
            "namespace: t\njobs:\n  - {{ name: wide, schedule: [{}], concurrency: allow, tasks: [{{ id: a, noop: true }}] }}\n",
            schedules.join(", ")
        ))
        .unwrap();
        let (reply, applied) = oneshot::channel();
        engine
            .on_command(Command::Apply {
                jobs: file.validate().unwrap(),
                reply,
            })
            .await;
        engine.flush().await.unwrap();
        applied.await.unwrap().unwrap();
        let (reply, done) = oneshot::channel();
        engine
            .on_command(Command::Backfill {
                namespace: "t".into(),
                name: "wide".into(),
                from: "2026-01-09T21:30:00Z".parse().unwrap(),
                to: "2026-01-10T00:00:00Z".parse().unwrap(),
                reply,
            })
            .await;
        // The loop is free at once: no run decided, no write queued.
        assert!(engine.writes.is_empty() && engine.runs.is_empty());
        // The listing comes back as a command; handled, it makes the runs.
        let listed = tokio::time::timeout(Duration::from_secs(30), commands.recv())
            .await
            .expect("the listing comes back")
            .unwrap();
        assert!(matches!(listed, Command::Backfilled { .. }));
        engine.on_command(listed).await;
        engine.flush().await.unwrap();
        assert_eq!(done.await.unwrap().unwrap().len(), 9000);
    }
}
