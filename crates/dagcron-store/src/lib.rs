//! The storage interface of dagcron.
//!
//! The engine decides; the store makes decisions durable. Writes arrive in
//! batches ([`Write`]) that a backend commits in one transaction, each
//! state change as a compare-and-set on the previous state, so that nothing
//! is acted on before it is committed and a stale change is refused. The
//! fire ledger's unique key (job, scheduled instant) is the final fence
//! against a doubled fire.
//!
//! Every backend passes the same [`conformance`] suite.
//!
//! # How it works
//!
//! Stores by concern: `JobStore` (jobs and their versions: who applied each,
//! rollbacks, the rules it was applied under; `JobUpsert::changes` decides
//! for every store what makes a new version), `RunStore` (the fire ledger,
//! runs, tasks, attempts and their output, written in batches of `Write`s,
//! each a compare-and-set on the previous state; the ledger's unique key
//! refuses a second record of a fire), `AuthStore` (API tokens by the keyed
//! hash of their secret, encrypted secrets), `SettingStore`, `AuditStore`
//! (the hash-chained audit log: `AuditEntry::chain_after` and `verify_audit`
//! are its one semantics; `prune_audit` cuts its oldest rows and keeps, in
//! the same transaction, the checkpoint the rest verifies from) and
//! `HistoryStore` (what retention reads and deletes, `retention.rs`: batches
//! of pruning check each row again, so that two nodes pruning at once
//! delete each row once). `Store` is all of them; code that needs one
//! concern may ask for its trait alone. `cluster.rs` adds `Coordination`,
//! the traits of a store shared by a cluster: registration with epochs and
//! leases, heartbeats, reaping dead nodes, adopting their runs, change
//! announcements.
//!
//! What a write means is written once, in `run_row.rs`: a run held as one
//! value with its tasks and attempts, and `apply`, which applies one write to
//! it (a change whose expected state is not the one found is refused and
//! says what it found). `memory.rs`, the in-memory store, applies writes with
//! it alone and passes the conformance suite; it is the reference the SQL
//! stores' write paths are property-tested against (`batches.rs`), and what
//! engine tests run on. `rows.rs` holds the row mappings both SQL stores
//! share (the columns they select and how a row becomes a record, read
//! through a driver's row by `Cells`); `sql.rs` the reads they make with the
//! same statement (in `$N` placeholders, which SQLite takes too), run by
//! each backend's `Reader` (`sql_reader!`), with a `Dialect` naming the
//! few places their schemas differ, and put in a backend's trait impls by
//! `shared_reads!`. Also named once here: the conflict
//! messages (`WriteResult::run_conflict` and its siblings), the SQL lists of
//! states (`run_ended!()` and its siblings, checked against the state
//! machines by a test) and which errors are worth retrying
//! (`StorageError::is_transient`).

#[cfg(feature = "strategies")]
pub mod batches;
pub mod breaker;
pub mod cluster;
pub mod conformance;
pub mod memory;
pub mod outbox;
pub mod retention;
pub mod rows;
pub mod run_row;
pub mod sql;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;

pub use dagcron_core::breaker::OpenBreaker;
use dagcron_core::{AttemptState, FireOutcome, Rules, RunState, TaskState};
use jiff::Timestamp;

pub use retention::{HistoryJob, Prune, Pruned};

/// A run's identity: unique, and increasing with creation time.
pub type RunId = i64;

/// What created a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// A fire on time.
    Schedule,
    /// A fire missed during downtime and run by the misfire policy.
    Catchup,
    /// A manual trigger.
    Manual,
    /// A backfill over a time range.
    Backfill,
    /// A re-run of a finished run (see [`NewRun::rerun_of`]).
    Rerun,
    /// A signed delivery to the job's webhook.
    Webhook,
    /// The end of a run of another job (the job's `after`).
    After,
    /// A message of a NATS JetStream stream (the job's `nats`).
    Message,
}

impl Trigger {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Catchup => "catchup",
            Trigger::Manual => "manual",
            Trigger::Backfill => "backfill",
            Trigger::Rerun => "rerun",
            Trigger::Webhook => "webhook",
            Trigger::After => "after",
            Trigger::Message => "message",
        }
    }

    /// Every trigger.
    pub const ALL: [Trigger; 8] = [
        Trigger::Schedule,
        Trigger::Catchup,
        Trigger::Manual,
        Trigger::Backfill,
        Trigger::Rerun,
        Trigger::Webhook,
        Trigger::After,
        Trigger::Message,
    ];

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Trigger> {
        Trigger::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// A job as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredJob {
    /// Tenant.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Increments with every change of the spec.
    pub version: i64,
    /// The canonical JSON of the job's spec.
    pub spec: String,
    /// Paused jobs do not fire.
    pub paused: bool,
    /// Last change.
    pub updated_at: Timestamp,
    /// The rules its current version was applied under (none: applied
    /// before versions recorded them, and not stamped since).
    pub rules: Option<Rules>,
    /// Its failure breaker, while open (see [`Write::Breaker`]).
    pub breaker: Option<OpenBreaker>,
}

/// What start-up reads of a stored job: its timing fields, not its whole
/// spec (see [`JobStore::load_job_timings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTimingRow {
    /// Tenant.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its current version.
    pub version: i64,
    /// JSON holding at least the fields its timing is made from (see
    /// [`dagcron_core::Job::timing_json`]): those alone, or its whole
    /// canonical spec.
    pub timing: String,
    /// Paused jobs do not fire.
    pub paused: bool,
    /// Last change.
    pub updated_at: Timestamp,
    /// The rules its current version was applied under (see [`StoredJob`]).
    pub rules: Option<Rules>,
    /// Its failure breaker, while open.
    pub breaker: Option<OpenBreaker>,
}

impl From<StoredJob> for StoredTimingRow {
    fn from(job: StoredJob) -> StoredTimingRow {
        StoredTimingRow {
            namespace: job.namespace,
            name: job.name,
            version: job.version,
            timing: job.spec,
            paused: job.paused,
            updated_at: job.updated_at,
            rules: job.rules,
            breaker: job.breaker,
        }
    }
}

/// Who applied a version of a job: the API token's id and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// The token's id, such as `tok_3f9a0c1d2e4b`.
    pub id: String,
    /// The token's name.
    pub name: String,
}

/// How a version of a job came to be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// Who applied it (none: not through the API, such as in a test).
    pub by: Option<Actor>,
    /// For a rollback: the older version whose spec it takes again.
    pub rollback_of: Option<i64>,
}

/// One version of a job, as recorded when it was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionRecord {
    /// Tenant.
    pub namespace: String,
    /// Job.
    pub name: String,
    /// From 1, one more with every apply that changes the job.
    pub version: i64,
    /// When it was applied.
    pub applied_at: Timestamp,
    /// Who applied it and whether it was a rollback.
    pub origin: Origin,
    /// The rules its fires were computed with (none: not recorded).
    pub rules: Option<Rules>,
}

/// A version with its spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobVersion {
    /// What was recorded of it.
    pub info: VersionRecord,
    /// The canonical JSON of the spec of that version.
    pub spec: String,
}

/// A job to create or update.
#[derive(Clone, Debug)]
pub struct JobUpsert {
    /// Tenant.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Canonical JSON of the spec; equal means unchanged.
    pub spec: String,
    /// Its timing fields as JSON ([`dagcron_core::Job::timing_json`]),
    /// which a store may keep for start-up beside the spec.
    pub timing: String,
    /// The file's `paused`.
    pub paused: bool,
    /// Who applies it, and whether it rolls back to an older version.
    pub origin: Origin,
    /// The rules its fires are computed with now (none: not known). A
    /// spec applied again under other rules than its version's, for one of
    /// its zones or the cron semantics, makes a new version.
    pub rules: Option<Rules>,
}

impl JobUpsert {
    /// The upsert of a validated job, in its canonical form.
    pub fn of(job: &dagcron_core::Job) -> JobUpsert {
        JobUpsert {
            namespace: job.namespace.clone(),
            name: job.spec.name.clone(),
            spec: job.canonical(),
            timing: job.timing_json(),
            paused: job.spec.paused,
            origin: Origin::default(),
            rules: Some(job.rules()),
        }
    }

    /// Whether applying this changes a stored job whose spec is `spec`,
    /// its version applied under `rules` (the stored form; none: not
    /// recorded, which counts as the same rules).
    pub fn changes(&self, spec: &str, rules: Option<&str>) -> bool {
        if spec != self.spec {
            return true;
        }
        match (rules, &self.rules) {
            (Some(stored), Some(now)) => {
                Rules::from_json(stored).map_or(true, |stored| stored.changes(now).is_some())
            }
            _ => false,
        }
    }

    /// The stored form of its rules.
    pub fn rules_json(&self) -> Option<String> {
        self.rules.as_ref().map(Rules::to_json)
    }

    /// Whether the job is paused once this upsert is applied over a stored
    /// job that is `paused` with canonical spec `spec`; `None`: a new job
    /// (see [`dagcron_core::policy::paused_after_apply`]).
    pub fn paused_over(&self, stored: Option<(bool, &str)>) -> bool {
        let before = stored.map(|(paused, spec)| {
            let file = serde_json::from_str::<serde_json::Value>(spec)
                .ok()
                .and_then(|v| v.get("paused")?.as_bool())
                .unwrap_or(false);
            (paused, file)
        });
        dagcron_core::policy::paused_after_apply(before, self.paused)
    }
}

/// What applying a job did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyResult {
    /// New job, at this version.
    Created(i64),
    /// Changed, now at this version.
    Updated(i64),
    /// Same spec as stored.
    Unchanged(i64),
}

/// A run to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRun {
    /// Its id (allocated by the engine).
    pub id: RunId,
    /// Tenant.
    pub namespace: String,
    /// Job name.
    pub job: String,
    /// The job version it runs.
    pub job_version: i64,
    /// Why it exists.
    pub trigger: Trigger,
    /// The fire instant (for manual runs, the trigger instant).
    pub scheduled_at: Timestamp,
    /// Parameters (job defaults merged with the trigger's).
    pub params: BTreeMap<String, String>,
    /// `pending` or `running`; `skipped` records a declined run.
    pub state: RunState,
    /// Task ids, all starting `pending`.
    pub tasks: Vec<String>,
    /// Creation instant.
    pub created_at: Timestamp,
    /// The W3C trace context of the caller that triggered it, if it sent
    /// one (its `traceparent`, then a newline and its `tracestate` if any):
    /// the run's trace joins the caller's.
    pub trace: Option<String>,
    /// For a re-run: the run it re-runs.
    pub rerun_of: Option<RunId>,
    /// For a re-run of the failed tasks: the tasks that keep their outcome
    /// from the run re-run (`succeeded` or `skipped`), with it; they start
    /// in that state, with no attempt, and are marked carried over.
    pub carried: BTreeMap<String, TaskState>,
    /// The outputs of the tasks carried over that had some in the run
    /// re-run: kept with the new run's tasks, for the tasks it runs again.
    pub carried_outputs: BTreeMap<String, dagcron_core::outputs::Outputs>,
    /// For a re-run that keeps the expansion of a mapped task (see
    /// [`Write::Expand`]): the item of each instance among `tasks`, by id.
    pub items: BTreeMap<String, String>,
    /// Its idempotency key within its job, for a run made by a trigger that
    /// can come twice (a webhook's delivery, a message, another run's
    /// end): a [`Write::Run`] whose job has a run of this key already is
    /// refused as a conflict, and nothing of it is stored. Keys are kept
    /// [`RUN_KEY_DAYS`] days.
    pub key: Option<String>,
}

/// How many days a run's idempotency key is kept (see [`NewRun::key`]).
pub const RUN_KEY_DAYS: i64 = 30;

impl NewRun {
    /// The state task `task` starts in.
    pub fn task_start(&self, task: &str) -> TaskState {
        if self.state.is_terminal() {
            TaskState::Skipped
        } else {
            self.carried
                .get(task)
                .copied()
                .unwrap_or(TaskState::Pending)
        }
    }
}

/// One change in a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Record an expected fire in the ledger, with the run it created, if any.
    /// Refused (as a conflict) if the ledger already has this fire.
    Fire {
        /// Tenant.
        namespace: String,
        /// Job.
        job: String,
        /// The scheduled instant.
        scheduled_at: Timestamp,
        /// What happened.
        outcome: FireOutcome,
        /// The exclusion calendar that suppressed it (`suppressed` only).
        calendar: Option<String>,
        /// The run it created.
        run: Option<NewRun>,
    },
    /// Create a run that no fire owns (manual trigger). Refused (as a
    /// conflict) if the run has a key its job has a run of already.
    Run(NewRun),
    /// Change a run's state if it is still `from`.
    RunState {
        /// The run.
        run: RunId,
        /// Expected current state.
        from: RunState,
        /// New state.
        to: RunState,
        /// When.
        at: Timestamp,
    },
    /// Mark a run as being stopped, with the state it will end in once its
    /// running attempts have ended (a cancel, a replace, a deadline): an
    /// acknowledged stop is durable, so that after a crash the run's lost
    /// attempts are not retried.
    RunClosing {
        /// The run.
        run: RunId,
        /// Its final state.
        to: RunState,
    },
    /// Change a task's state if it is still `from`.
    TaskState {
        /// The run.
        run: RunId,
        /// The task.
        task: String,
        /// Expected current state.
        from: TaskState,
        /// New state.
        to: TaskState,
    },
    /// Record a new attempt, `dispatching` or `running`.
    AttemptStart {
        /// The run.
        run: RunId,
        /// The task.
        task: String,
        /// 1-based.
        number: u32,
        /// Initial state.
        state: AttemptState,
        /// When.
        at: Timestamp,
        /// For an attempt handed to the cluster (`dispatching`) that needs a
        /// remote agent: the labels the agent must have.
        run_on: Option<BTreeMap<String, String>>,
        /// For an attempt handed to the cluster: its task's priority, which
        /// with `at` orders the cluster's queue (`dagcron_core::priority::rank`).
        priority: i32,
    },
    /// Change an attempt's state if it is still `from`, with its result.
    AttemptEnd {
        /// The run.
        run: RunId,
        /// The task.
        task: String,
        /// 1-based.
        number: u32,
        /// Expected current state.
        from: AttemptState,
        /// New state.
        to: AttemptState,
        /// When.
        at: Timestamp,
        /// Process exit code or HTTP status.
        exit_code: Option<i32>,
        /// What went wrong.
        error: Option<String>,
        /// Captured output (already capped by the executor).
        log: Vec<u8>,
        /// Where each line of `log` came from and when, as
        /// [`dagcron_core::log::encode`] writes it (empty: not known).
        lines: Vec<u8>,
        /// How far from its asked instant it started (see [`AttemptRecord::start_error_us`]).
        start_error_us: Option<i64>,
        /// What the task handed downstream (see [`dagcron_core::outputs`]).
        outputs: dagcron_core::outputs::Outputs,
        /// Run on this node for a run another node owns: in a cluster, that
        /// node is told once the end is committed.
        for_other_node: bool,
    },
    /// Withdraw an attempt handed to the cluster, whether a node claimed it
    /// or not: the attempt is cancelled if it has not ended, and its task is
    /// cancelled if it is still `dispatching` or `running` (a node running
    /// the attempt sees that and stops it). Always done: an attempt that
    /// ended first keeps its result.
    AttemptWithdraw {
        /// The run.
        run: RunId,
        /// The task.
        task: String,
        /// 1-based.
        number: u32,
        /// When.
        at: Timestamp,
    },
    /// Expand mapped task `task` (see [`dagcron_core::fan_out`]): its
    /// instances are added after the run's tasks, `task[0]`, `task[1]`,
    /// ..., `pending`, each with its item. Refused if it has instances
    /// already.
    Expand {
        /// The run.
        run: RunId,
        /// The mapped task.
        task: String,
        /// Each instance's item (its JSON).
        items: Vec<String>,
    },
    /// Record how mapped task `task` ended: why it has no instances or
    /// failed by them (`note`), and what its instances hand downstream
    /// together (`outputs`, kept as a carried task's). Always done.
    Gathered {
        /// The run.
        run: RunId,
        /// The mapped task.
        task: String,
        /// What happened, if anything is to be said.
        note: Option<String>,
        /// Its instances' outputs, gathered.
        outputs: dagcron_core::outputs::Outputs,
    },
    /// Put a notification in the outbox, in the commit of the event it
    /// reports. Always done: a notification whose key is there already
    /// (the batch committed twice) is left as it is.
    Notify(NewNotification),
    /// Open or close a job's failure breaker (see
    /// [`dagcron_core::breaker`]), after the batch's other writes: done
    /// only if it changes (a conflict otherwise, which is no error), and
    /// then its notifications go in the outbox. In a cluster, the nodes
    /// are told the job changed.
    Breaker(BreakerWrite),
    /// Record in the ledger that the fire of job (`namespace`, `job`) at
    /// `scheduled_at` missed its SLA ([`dagcron_core::sla`]), after the
    /// batch's other writes: done only the first time (a conflict
    /// otherwise, which is no error), and then its notifications go in
    /// the outbox.
    SlaMissed {
        /// Tenant.
        namespace: String,
        /// Job.
        job: String,
        /// The fire's instant.
        scheduled_at: Timestamp,
        /// When the miss was found.
        at: Timestamp,
        /// What goes in the outbox the first time.
        notifications: Vec<NewNotification>,
    },
}

/// A change of a job's failure breaker (see [`Write::Breaker`]).
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerWrite {
    /// Tenant.
    pub namespace: String,
    /// Job.
    pub job: String,
    /// Open it, after the job's run `run` failed, if the job's last
    /// `after_failures` runs that ended succeeded or failed since it last
    /// closed all failed (see [`dagcron_core::breaker::opens`]); none:
    /// close it, and count only the runs made after now from then on.
    pub open: Option<(RunId, u32)>,
    /// When.
    pub at: Timestamp,
    /// What goes in the outbox if it changes.
    pub notifications: Vec<NewNotification>,
}

impl BreakerWrite {
    /// What a job records of the breaker this opens, given the failures
    /// it opened after.
    pub fn opened(&self) -> Option<OpenBreaker> {
        self.open.map(|(run, failures)| OpenBreaker {
            opened_at: self.at,
            run,
            failures,
        })
    }
}

impl Write {
    /// The run this write changes or creates, if any.
    pub fn run_id(&self) -> Option<RunId> {
        match self {
            Write::Fire { run, .. } => run.as_ref().map(|r| r.id),
            Write::Run(run) => Some(run.id),
            Write::RunState { run, .. }
            | Write::RunClosing { run, .. }
            | Write::TaskState { run, .. }
            | Write::AttemptStart { run, .. }
            | Write::AttemptEnd { run, .. }
            | Write::AttemptWithdraw { run, .. }
            | Write::Expand { run, .. }
            | Write::Gathered { run, .. } => Some(*run),
            Write::Notify(_) | Write::Breaker(_) | Write::SlaMissed { .. } => None,
        }
    }
}

/// A notification to put in the outbox (see [`Write::Notify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewNotification {
    /// Its idempotency key: one row per key.
    pub key: String,
    /// The namespace of its job.
    pub namespace: String,
    /// Its job.
    pub job: String,
    /// The run it is about, if any.
    pub run: Option<RunId>,
    /// The event (`dagcron_core::notify::NotifyEvent`'s name).
    pub event: String,
    /// The notifier's name.
    pub notifier: String,
    /// The notifier's definition (JSON), as the job had it.
    pub channel: String,
    /// The body (JSON), the same at every delivery attempt.
    pub payload: String,
    /// When it was made; its first delivery is due then.
    pub at: Timestamp,
}

/// Where a notification stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotificationState {
    /// Waiting for its (next) delivery attempt.
    Pending,
    /// A receiver took it.
    Delivered,
    /// Given up: its attempts or its time ran out, or it cannot be sent.
    Failed,
    /// Not sent, by decision (a success that was not a recovery).
    Dropped,
}

impl NotificationState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationState::Pending => "pending",
            NotificationState::Delivered => "delivered",
            NotificationState::Failed => "failed",
            NotificationState::Dropped => "dropped",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<NotificationState> {
        [
            NotificationState::Pending,
            NotificationState::Delivered,
            NotificationState::Failed,
            NotificationState::Dropped,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }
}

/// A notification as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotificationRecord {
    /// Its number, increasing with creation.
    pub id: i64,
    /// What it was made as.
    pub made: NewNotification,
    /// Where it stands.
    pub state: NotificationState,
    /// Delivery attempts so far.
    pub attempts: u32,
    /// Pending: when its next attempt is due.
    pub next_at: Option<Timestamp>,
    /// When it was delivered, failed or dropped.
    pub ended_at: Option<Timestamp>,
    /// Its last attempt's answer code (an HTTP status).
    pub last_status: Option<i32>,
    /// Its last attempt's error, or why it was dropped.
    pub last_error: Option<String>,
}

/// One delivery attempt of a notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryAttempt {
    /// 1-based.
    pub number: u32,
    /// When it ended.
    pub at: Timestamp,
    /// The receiver's answer code, if it answered.
    pub status: Option<i32>,
    /// What went wrong, if it did.
    pub error: Option<String>,
}

/// What a delivery attempt leaves a notification in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryEnd {
    /// Delivered.
    Delivered,
    /// Tried again at this instant.
    Retry(Timestamp),
    /// Given up.
    Failed,
    /// Not sent, for this reason (nothing was attempted), decided then.
    Dropped {
        /// Why.
        why: String,
        /// When.
        at: Timestamp,
    },
}

/// What a withdrawn attempt records as its error.
pub const WITHDRAWN: &str = "the run was stopped";

/// SQL lists of states, each named once (a test checks them against the
/// state machines): `concat!("... WHERE state IN ", run_ended!())`.
#[macro_export]
macro_rules! run_ended {
    () => {
        "('succeeded', 'failed', 'cancelled', 'skipped')"
    };
}

/// See [`run_ended!`]: runs not finished.
#[macro_export]
macro_rules! run_unfinished {
    () => {
        "('planned', 'pending', 'running')"
    };
}

/// See [`run_ended!`]: runs not finished, as equalities joined by `OR`
/// (SQLite evaluates an `IN` list of three or more constants through a
/// temporary table; its index of unfinished runs has this predicate, and
/// a query must state it the same way to use the index).
#[macro_export]
macro_rules! run_unfinished_or {
    () => {
        "(state = 'planned' OR state = 'pending' OR state = 'running')"
    };
}

/// See [`run_ended!`]: attempts not finished (also the task states an
/// attempt is under way in).
#[macro_export]
macro_rules! attempt_unfinished {
    () => {
        "('dispatching', 'running')"
    };
}

/// The result of one [`Write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// Applied.
    Done,
    /// The previous state was not the expected one, or the fire was already
    /// recorded: nothing changed. Says what was found.
    Conflict(String),
    /// A fire made before its instant by the store's clock (a node whose
    /// clock is ahead): refused, nothing changed. Says by how much.
    Early(String),
}

/// An attempt as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// 1-based.
    pub number: u32,
    /// State.
    pub state: AttemptState,
    /// Start.
    pub started_at: Timestamp,
    /// End.
    pub finished_at: Option<Timestamp>,
    /// Exit code or HTTP status.
    pub exit_code: Option<i32>,
    /// Error.
    pub error: Option<String>,
    /// The epoch of the cluster node that ran it (none outside a cluster,
    /// or while it waits to be claimed).
    pub node_epoch: Option<i64>,
    /// For an attempt asked to start at an instant (a job's `send_ahead`):
    /// how far from it it started, in microseconds (positive: late).
    pub start_error_us: Option<i64>,
    /// What the task handed downstream (see [`dagcron_core::outputs`]).
    pub outputs: dagcron_core::outputs::Outputs,
}

/// An attempt handed to the cluster and claimed by this node to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedAttempt {
    /// The run.
    pub run: RunId,
    /// Its job's namespace.
    pub namespace: String,
    /// Its job.
    pub job: String,
    /// The task.
    pub task: String,
    /// 1-based.
    pub number: u32,
    /// The run's fire instant.
    pub scheduled_at: Timestamp,
    /// The run's parameters.
    pub params: BTreeMap<String, String>,
    /// The run's caller's trace context (see [`NewRun::trace`]).
    pub trace: Option<String>,
    /// The version of the job the run runs.
    pub job_version: i64,
    /// The outputs of the run's tasks that have some, by task id.
    pub outputs: BTreeMap<String, dagcron_core::outputs::Outputs>,
    /// An instance of a mapped task: its item (JSON).
    pub item: Option<String>,
    /// The task's place among the run's tasks (the job's tasks in order,
    /// then the instances of its mapped tasks).
    pub position: usize,
}

/// An attempt of one of this node's runs that another node claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteAttempt {
    /// The run.
    pub run: RunId,
    /// The task.
    pub task: String,
    /// 1-based.
    pub number: u32,
    /// Its state now.
    pub state: AttemptState,
    /// Exit code or HTTP status.
    pub exit_code: Option<i32>,
    /// What went wrong.
    pub error: Option<String>,
    /// Whether the node running it still holds its lease.
    pub executor_alive: bool,
    /// What it handed downstream.
    pub outputs: dagcron_core::outputs::Outputs,
}

/// An attempt's identity: run, task, number.
pub type AttemptKey = (RunId, String, u32);

/// A task of a run, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    /// Task id.
    pub id: String,
    /// State.
    pub state: TaskState,
    /// Attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// Its outcome was carried over from the run this one re-runs (it has
    /// no attempt here).
    pub carried: bool,
    /// A task carried over: the outputs it had in the run re-run; a
    /// mapped task: its instances' outputs, gathered.
    pub carried_outputs: dagcron_core::outputs::Outputs,
    /// An instance of a mapped task: its item (JSON).
    pub item: Option<String>,
    /// A mapped task: why it has no instances, or failed by them.
    pub note: Option<String>,
}

impl TaskRecord {
    /// Its outputs: those of its attempt that succeeded, or for a task
    /// carried over those it had in the run re-run; none if empty.
    pub fn outputs(&self) -> Option<&dagcron_core::outputs::Outputs> {
        let outputs = self
            .attempts
            .iter()
            .rev()
            .find(|a| a.state == AttemptState::Succeeded)
            .map_or(&self.carried_outputs, |a| &a.outputs);
        (!outputs.is_empty()).then_some(outputs)
    }
}

/// A run as stored, with its tasks and attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// Id.
    pub id: RunId,
    /// Tenant.
    pub namespace: String,
    /// Job.
    pub job: String,
    /// Job version.
    pub job_version: i64,
    /// Why it exists.
    pub trigger: Trigger,
    /// The fire instant.
    pub scheduled_at: Timestamp,
    /// State.
    pub state: RunState,
    /// Parameters.
    pub params: BTreeMap<String, String>,
    /// Created.
    pub created_at: Timestamp,
    /// Started.
    pub started_at: Option<Timestamp>,
    /// Finished.
    pub finished_at: Option<Timestamp>,
    /// Set once the run was asked to stop: the state it ends in.
    pub closing: Option<RunState>,
    /// The caller's trace context (see [`NewRun::trace`]).
    pub trace: Option<String>,
    /// For a re-run: the run it re-runs.
    pub rerun_of: Option<RunId>,
    /// Tasks in declaration order.
    pub tasks: Vec<TaskRecord>,
}

/// Which runs [`RunStore::browse_runs`] lists; every field set narrows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only this namespace's runs.
    pub namespace: Option<String>,
    /// Only the runs of jobs of this name.
    pub job: Option<String>,
    /// Only runs in one of these states (empty: any state).
    pub states: Vec<RunState>,
    /// Only runs made by this trigger.
    pub trigger: Option<Trigger>,
    /// Only runs whose fire instant is at or after this.
    pub since: Option<Timestamp>,
    /// Only runs whose fire instant is before this.
    pub until: Option<Timestamp>,
    /// Only runs that ended at or after this.
    pub ended_since: Option<Timestamp>,
}

/// At most this many runs are looked at for one page of the runs browser
/// when it filters on more than the namespace and the job (a page may then
/// hold fewer runs than asked, with a cursor to look further back).
pub const BROWSE_SCAN: u32 = 10_000;

impl RunFilter {
    /// The states of a comma-separated list of their names (empty: any), or
    /// what is wrong with it.
    pub fn parse_states(list: &str) -> std::result::Result<Vec<RunState>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse().map_err(|_| {
                    let names: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
                    format!("unknown run state {s:?}: one of {}", names.join(", "))
                })
            })
            .collect()
    }

    /// A trigger by its name (empty: any), or what is wrong with it.
    pub fn parse_trigger(name: &str) -> std::result::Result<Option<Trigger>, String> {
        match name.trim() {
            "" => Ok(None),
            t => Trigger::parse(t).map(Some).ok_or_else(|| {
                let names: Vec<&str> = Trigger::ALL.iter().map(|t| t.as_str()).collect();
                format!("unknown trigger {t:?}: one of {}", names.join(", "))
            }),
        }
    }

    /// Whether `run` passes the filter (what the SQL stores' `WHERE` says).
    pub fn matches(&self, run: &RunRecord) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|ns| *ns == run.namespace)
            && self.job.as_ref().is_none_or(|j| *j == run.job)
            && (self.states.is_empty() || self.states.contains(&run.state))
            && self.trigger.is_none_or(|t| t == run.trigger)
            && self.since.is_none_or(|t| run.scheduled_at >= t)
            && self.until.is_none_or(|t| run.scheduled_at < t)
            && self
                .ended_since
                .is_none_or(|t| run.finished_at.is_some_and(|f| f >= t))
    }
}

/// An attempt's output so far, published for the other nodes of a cluster
/// (see [`RunStore::put_live_logs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveLogWrite {
    /// The run.
    pub run: RunId,
    /// The task.
    pub task: String,
    /// The attempt's number.
    pub number: u32,
    /// Its output so far (its last bytes); none: the attempt has ended,
    /// its row goes.
    pub log: Option<Vec<u8>>,
    /// How many bytes of output came before `log` (not published).
    pub skipped: u64,
}

/// An API token as stored: its identity and authority, never its secret
/// (only a keyed hash of it, which [`AuthStore::find_token`] looks up).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    /// Public id, such as `tok_3f9a0c1d2e4b`.
    pub id: String,
    /// What it is for.
    pub name: String,
    /// `viewer`, `operator`, `developer` or `admin`.
    pub role: String,
    /// The namespace it is limited to; none: the whole instance.
    pub namespace: Option<String>,
    /// Created.
    pub created_at: Timestamp,
    /// Refused from then on.
    pub expires_at: Option<Timestamp>,
    /// Last accepted (updated at most about once a minute).
    pub last_used_at: Option<Timestamp>,
    /// Revoked: refused from then on.
    pub revoked_at: Option<Timestamp>,
    /// The id of the token that created it (none: the bootstrap).
    pub created_by: Option<String>,
    /// For an agent's join token: the labels the agent may claim (none: any).
    pub labels: Option<BTreeMap<String, String>>,
}

/// A secret as stored: encrypted, with what decrypting it needs (the key's
/// id and the nonce); never its value.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretRecord {
    /// Tenant.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Increments with every new value.
    pub version: i64,
    /// Which key encrypted it.
    pub key_id: String,
    /// The nonce it was encrypted with.
    pub nonce: Vec<u8>,
    /// The value, encrypted and authenticated.
    pub ciphertext: Vec<u8>,
    /// When its value was last set.
    pub updated_at: Timestamp,
}

impl fmt::Debug for SecretRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretRecord")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("version", &self.version)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// A job as the jobs list shows it (see [`RunStore::job_summaries`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSummary {
    /// Its last runs, newest first.
    pub runs: Vec<(RunId, RunState)>,
    /// How many of the fires read had each outcome met, in the order of
    /// the outcomes' names.
    pub fires: Vec<(FireOutcome, u64)>,
}

impl JobSummary {
    /// Adds `n` fires of `outcome`.
    pub fn count(&mut self, outcome: FireOutcome, n: u64) {
        match self
            .fires
            .binary_search_by(|(o, _)| o.as_str().cmp(outcome.as_str()))
        {
            Ok(i) => self.fires[i].1 += n,
            Err(i) => self.fires.insert(i, (outcome, n)),
        }
    }

    /// How many of the fires read had one of `outcomes`.
    pub fn fires_of(&self, outcomes: &[FireOutcome]) -> u64 {
        self.fires
            .iter()
            .filter(|(o, _)| outcomes.contains(o))
            .map(|(_, n)| n)
            .sum()
    }

    /// How many fires were read.
    pub fn fires_read(&self) -> u64 {
        self.fires.iter().map(|(_, n)| n).sum()
    }
}

/// A row of the fire ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FireRecord {
    /// The scheduled instant.
    pub scheduled_at: Timestamp,
    /// What happened.
    pub outcome: FireOutcome,
    /// The exclusion calendar that suppressed it (`suppressed` only).
    pub calendar: Option<String>,
    /// The run it created.
    pub run_id: Option<RunId>,
    /// When its run was found not to have succeeded by the job's SLA
    /// (see [`Write::SlaMissed`]).
    pub sla_missed_at: Option<Timestamp>,
}

/// A page of results and the cursor of the next one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    /// Items.
    pub items: Vec<T>,
    /// Pass back to get the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// A page from a query that fetched up to `limit + 1` items: an extra
    /// item means there is a next page, whose cursor `cursor_of` makes from
    /// the last item kept.
    pub fn from_overfetch(
        mut items: Vec<T>,
        limit: u32,
        cursor_of: impl Fn(&T) -> String,
    ) -> Page<T> {
        let next_cursor = (items.len() > limit as usize).then(|| {
            items.truncate(limit as usize);
            cursor_of(items.last().expect("limit is at least 1"))
        });
        Page { items, next_cursor }
    }
}

/// The cursor of the page of jobs after `job`.
pub fn job_cursor(job: &StoredJob) -> String {
    format!("job:{}", job.name)
}

/// Every job, read a page at a time and handed to `each` (so that a million
/// jobs are never in memory at once as stored specs).
pub async fn load_all_jobs<S: Store + ?Sized>(
    store: &S,
    mut each: impl FnMut(StoredJob),
) -> Result<()> {
    const PAGE: u32 = 5_000;
    let mut after = None;
    loop {
        let page = store.load_jobs(after.as_ref(), PAGE).await?;
        let full = page.len() as u32 == PAGE;
        after = page.last().map(|j| (j.namespace.clone(), j.name.clone()));
        page.into_iter().for_each(&mut each);
        if !full {
            return Ok(());
        }
    }
}

/// The job name a page of jobs starts after ("" for the first page).
pub fn jobs_after(cursor: Option<&str>) -> Result<String> {
    match cursor {
        None => Ok(String::new()),
        Some(c) => c
            .strip_prefix("job:")
            .map(str::to_string)
            .ok_or_else(|| StorageError::Invalid(format!("bad cursor {c:?}"))),
    }
}

/// The cursor of the page of runs after `run` (older ones).
pub fn run_cursor(run: &RunRecord) -> String {
    format!("run:{}", run.id)
}

/// The run id a page of runs starts before.
pub fn runs_before(cursor: Option<&str>) -> Result<RunId> {
    match cursor {
        None => Ok(RunId::MAX),
        Some(c) => c
            .strip_prefix("run:")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| StorageError::Invalid(format!("bad cursor {c:?}"))),
    }
}

/// The cursor of the page of versions after `v` (older ones).
pub fn version_cursor(v: &VersionRecord) -> String {
    format!("version:{}", v.version)
}

/// The version a page of versions starts before.
pub fn versions_before(cursor: Option<&str>) -> Result<i64> {
    match cursor {
        None => Ok(i64::MAX),
        Some(c) => c
            .strip_prefix("version:")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| StorageError::Invalid(format!("bad cursor {c:?}"))),
    }
}

/// Reads the stored form of a version's rules (none: not recorded).
pub fn parse_rules(text: Option<&str>) -> Result<Option<Rules>> {
    text.map(Rules::from_json)
        .transpose()
        .map_err(StorageError::Corrupt)
}

/// Who applied a version, from its stored (token id, token name).
pub fn actor_of(id: Option<String>, name: Option<String>) -> Option<Actor> {
    id.map(|id| Actor {
        id,
        name: name.unwrap_or_default(),
    })
}

impl WriteResult {
    /// A refused run change, saying what was found (`None`: no such run).
    pub fn run_conflict(run: RunId, found: Option<&str>, from: RunState) -> WriteResult {
        WriteResult::Conflict(match found {
            Some(s) => format!("run {run} is {s}, not {from}"),
            None => format!("run {run} does not exist"),
        })
    }

    /// A breaker write that changes nothing: the breaker of the job stays
    /// `state`.
    pub fn breaker_unchanged(namespace: &str, job: &str, state: &str) -> WriteResult {
        WriteResult::Conflict(format!(
            "the failure breaker of {namespace}/{job} stays {state}"
        ))
    }

    /// A run refused because its job has a run of its key already.
    pub fn run_key_taken(run: &NewRun) -> WriteResult {
        WriteResult::Conflict(format!(
            "{}/{} has a run of key {:?} already",
            run.namespace,
            run.job,
            run.key.as_deref().unwrap_or_default()
        ))
    }

    /// An SLA miss recorded already, or of a fire the ledger does not
    /// have.
    pub fn sla_recorded(namespace: &str, job: &str, at: Timestamp) -> WriteResult {
        WriteResult::Conflict(format!(
            "the SLA miss of {namespace}/{job} at {at} is recorded already, or the fire is not"
        ))
    }

    /// A fire refused because the ledger has it.
    pub fn fire_recorded(namespace: &str, job: &str, at: Timestamp) -> WriteResult {
        WriteResult::Conflict(format!(
            "fire {namespace}/{job} at {at} is already recorded"
        ))
    }

    /// Why it was refused (empty when it was not).
    pub fn reason(&self) -> &str {
        match self {
            WriteResult::Done => "",
            WriteResult::Conflict(why) | WriteResult::Early(why) => why,
        }
    }

    /// A fire refused because its instant, `at`, has not come by the
    /// store's clock, which reads `now`.
    pub fn fire_early(namespace: &str, job: &str, at: Timestamp, now: Timestamp) -> WriteResult {
        WriteResult::Early(format!(
            "fire {namespace}/{job} at {at} refused: made {:.3} s before its instant by the database's clock ({now})",
            at.duration_since(now).as_secs_f64()
        ))
    }

    /// An attempt refused because it exists.
    pub fn attempt_exists(run: RunId, task: &str, number: impl fmt::Display) -> WriteResult {
        WriteResult::Conflict(format!("attempt {number} of {run}/{task} already exists"))
    }

    /// An attempt's end refused because it is no longer in `from`.
    pub fn attempt_conflict(
        run: RunId,
        task: &str,
        number: impl fmt::Display,
        from: &str,
    ) -> WriteResult {
        WriteResult::Conflict(format!("attempt {number} of {run}/{task} is not {from}"))
    }

    /// A stop refused because the run does not exist.
    pub fn no_run(run: RunId) -> WriteResult {
        WriteResult::Conflict(format!("no run {run}"))
    }

    /// A refused task change, saying what was found (`None`: no such task).
    pub fn task_conflict(
        run: RunId,
        task: &str,
        found: Option<&str>,
        from: TaskState,
    ) -> WriteResult {
        WriteResult::Conflict(match found {
            Some(s) => format!("task {task} of run {run} is {s}, not {from}"),
            None => format!("run {run} has no task {task}"),
        })
    }
}

/// Why a storage operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum StorageError {
    /// The database could not be reached or answered an error; retrying may help.
    Unavailable(String),
    /// The stored data is not what this version understands.
    Corrupt(String),
    /// The caller passed something invalid (a bad cursor).
    Invalid(String),
    /// This node's lease has ended or its epoch is stale: the write was
    /// refused, and the node must stop acting on its state.
    Fenced(String),
    /// The disk (or the database's space) is full: nothing was written;
    /// retrying succeeds once there is room again.
    Full(String),
}

impl StorageError {
    /// Whether trying the same operation again may succeed (the database
    /// was unreachable or busy, or out of space); never for a fenced node
    /// or bad data.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::Unavailable(_) | StorageError::Full(_))
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Unavailable(m) => write!(f, "storage unavailable: {m}"),
            StorageError::Corrupt(m) => write!(f, "stored data is corrupt: {m}"),
            StorageError::Invalid(m) => write!(f, "invalid storage request: {m}"),
            StorageError::Fenced(m) => write!(f, "write refused, this node is fenced: {m}"),
            StorageError::Full(m) => write!(f, "no space left for the database: {m}"),
        }
    }
}

impl std::error::Error for StorageError {}

/// Result of storage operations.
pub type Result<T> = std::result::Result<T, StorageError>;

/// The outbox of notifications: written in batches ([`Write::Notify`]),
/// claimed by one node at a time for delivery, each attempt recorded.
pub trait OutboxStore: Send + Sync {
    /// Claims up to `limit` notifications due at `now` and not claimed by
    /// a node whose claim still holds, for `owner` until `until`, oldest
    /// due first. Two nodes never hold the same notification at once.
    fn claim_notifications(
        &self,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<NotificationRecord>>> + Send;

    /// Records an attempt (none for a [`DeliveryEnd::Dropped`]) and where it
    /// leaves notification `id`, if `owner` still holds it and it is still
    /// pending; false (nothing changed) otherwise.
    fn record_delivery(
        &self,
        id: i64,
        owner: &str,
        attempt: Option<&DeliveryAttempt>,
        end: &DeliveryEnd,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// A namespace's notifications, newest first, before `before` (an id),
    /// only the failed ones if `failed_only`.
    fn list_notifications(
        &self,
        namespace: &str,
        failed_only: bool,
        before: Option<i64>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<NotificationRecord>>> + Send;

    /// The delivery attempts of notification `id`, first first.
    fn delivery_attempts(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<Vec<DeliveryAttempt>>> + Send;

    /// Deletes up to `limit` notifications that ended (delivered, failed or
    /// dropped) before `before`, with their attempts; how many went.
    fn prune_notifications(
        &self,
        before: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes up to `limit` run keys (see [`NewRun::key`]) made before
    /// `before`; how many went.
    fn prune_run_keys(
        &self,
        before: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// The run of job (`namespace`, `job`) made with key `key`, while the
    /// key is kept (see [`NewRun::key`]).
    fn run_of_key(
        &self,
        namespace: &str,
        job: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<RunId>>> + Send;

    /// How the last run of a job created before `run` that succeeded or
    /// failed ended (none: there is none), for telling a recovery.
    fn previous_run_end(
        &self,
        namespace: &str,
        job: &str,
        run: RunId,
    ) -> impl Future<Output = Result<Option<RunState>>> + Send;
}

/// Durable state of jobs, fires, runs, tasks, attempts and logs: every
/// concern below, which each backend implements (and the conformance suite
/// checks). Code that needs the whole store asks for `Store`; a piece that
/// needs one concern may ask for that trait alone.
pub trait Store:
    JobStore + RunStore + AuthStore + AuditStore + HistoryStore + OutboxStore + Send + Sync + 'static
{
}

impl<T> Store for T where
    T: JobStore
        + RunStore
        + AuthStore
        + AuditStore
        + HistoryStore
        + OutboxStore
        + Send
        + Sync
        + 'static
{
}

/// Jobs and their versions.
pub trait JobStore: Send + Sync {
    /// Creates or updates jobs in one transaction; unchanged specs keep their version.
    fn apply_jobs(
        &self,
        jobs: &[JobUpsert],
        at: Timestamp,
    ) -> impl Future<Output = Result<Vec<ApplyResult>>> + Send;
    /// [`JobStore::apply_jobs`] of jobs the caller gives up: a backend that
    /// applies them on another thread takes them there without copying them.
    fn apply_jobs_owned(
        &self,
        jobs: Vec<JobUpsert>,
        at: Timestamp,
    ) -> impl Future<Output = Result<Vec<ApplyResult>>> + Send {
        async move { self.apply_jobs(&jobs, at).await }
    }
    /// Every job, `limit` at a time, in (namespace, name) order, from the
    /// first after `after` (at start-up: see [`load_all_jobs`]).
    fn load_jobs(
        &self,
        after: Option<&(String, String)>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<StoredJob>>> + Send;
    /// [`JobStore::load_jobs`] for start-up: what a job's timing is made
    /// from, in the same order and pages (a backend that stores the timing
    /// fields apart reads those instead of each whole spec).
    fn load_job_timings(
        &self,
        after: Option<&(String, String)>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<StoredTimingRow>>> + Send {
        async move {
            let jobs = self.load_jobs(after, limit).await?;
            Ok(jobs.into_iter().map(StoredTimingRow::from).collect())
        }
    }
    /// One job.
    fn get_job(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<StoredJob>>> + Send;
    /// Jobs of a namespace by name, paginated.
    fn list_jobs(
        &self,
        namespace: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> impl Future<Output = Result<Page<StoredJob>>> + Send;
    /// The jobs of a namespace that do not fire on their own: paused, or
    /// their failure breaker open; by name, at most `limit`.
    fn attention_jobs(
        &self,
        namespace: &str,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<StoredJob>>> + Send;
    /// Deletes a job (its history stays). Returns whether it existed.
    fn delete_job(&self, namespace: &str, name: &str) -> impl Future<Output = Result<bool>> + Send;
    /// Pauses or resumes. Returns whether the job exists.
    fn set_paused(
        &self,
        namespace: &str,
        name: &str,
        paused: bool,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// The versions of a job, newest first, paginated (a deleted job's
    /// stay, and a job created again continues them).
    fn list_job_versions(
        &self,
        namespace: &str,
        name: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> impl Future<Output = Result<Page<VersionRecord>>> + Send;
    /// One version of a job, with its spec.
    fn get_job_version(
        &self,
        namespace: &str,
        name: &str,
        version: i64,
    ) -> impl Future<Output = Result<Option<JobVersion>>> + Send;
    /// Records the rules of versions that have none (applied before
    /// versions recorded them): each (namespace, name, version, rules);
    /// a version that has rules keeps them.
    fn stamp_rules(
        &self,
        versions: &[(String, String, i64, Rules)],
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The fire ledger, runs, their tasks and attempts, and captured output: written in batches (see [`Write`]).
pub trait RunStore: Send + Sync {
    /// Applies a batch in one transaction; one result per write, in order.
    fn write(&self, batch: &[Write]) -> impl Future<Output = Result<Vec<WriteResult>>> + Send;

    /// How many batches [`RunStore::write`] may be given at once. The engine
    /// sends a batch beside the ones in flight only when it touches none
    /// of their runs and none of their jobs' fires, and carries out the
    /// batches' effects in the order it made them. One for a store with a
    /// single writer.
    fn write_lanes(&self) -> usize {
        1
    }

    /// [`RunStore::write`] of a shared batch: a backend that applies it on
    /// another thread takes it there without copying it.
    fn write_shared(
        &self,
        batch: std::sync::Arc<Vec<Write>>,
    ) -> impl Future<Output = Result<Vec<WriteResult>>> + Send {
        async move { self.write(&batch).await }
    }

    /// The latest recorded fire of every job (where recovery resumes from).
    fn last_fires(&self) -> impl Future<Output = Result<Vec<(String, String, Timestamp)>>> + Send;
    /// The latest recorded fire of each of these jobs (`None` if it never
    /// fired), in the order asked: where a new owner of a job resumes.
    fn last_fires_of(
        &self,
        jobs: &[(String, String)],
    ) -> impl Future<Output = Result<Vec<Option<Timestamp>>>> + Send;
    /// Fires of a job in `[from, to)`, oldest first, at most `limit`.
    fn list_fires(
        &self,
        namespace: &str,
        job: &str,
        from: Timestamp,
        to: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<FireRecord>>> + Send;
    /// The fires of a namespace's jobs since `since` that did not make a
    /// run on time (missed, or skipped by a policy; a fire suppressed by a
    /// calendar is as asked and not one of them), newest first, at most
    /// `limit`, each with its job.
    fn problem_fires(
        &self,
        namespace: &str,
        since: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<(String, FireRecord)>>> + Send;
    /// Runs that are not finished and belong to this node (at start-up). A
    /// store shared by a cluster returns the runs of this node's epoch only;
    /// runs of dead nodes are taken over through [`cluster::Coordination`].
    fn active_runs(&self) -> impl Future<Output = Result<Vec<RunRecord>>> + Send;
    /// One run.
    fn get_run(&self, id: RunId) -> impl Future<Output = Result<Option<RunRecord>>> + Send;
    /// How many runs of `namespace` are unfinished (`pending` or
    /// `running`), on every node: what its quota of active runs counts.
    fn count_unfinished_runs(&self, namespace: &str) -> impl Future<Output = Result<u64>> + Send;
    /// The unfinished runs of `namespace` with a task `held` (waiting for
    /// an operator), on every node, oldest first, at most `limit`.
    fn held_runs(
        &self,
        namespace: &str,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>>> + Send;
    /// Runs of a job, newest first, paginated.
    fn list_runs(
        &self,
        namespace: &str,
        job: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> impl Future<Output = Result<Page<RunRecord>>> + Send;
    /// What the jobs list shows of each of `jobs` of a namespace, in the
    /// order asked: the ids and states of its last `strip` runs, newest
    /// first, and the outcomes of its first `fires` fires in `[from, to)`,
    /// counted. A light read for a page of jobs: no run's tasks, no
    /// fire's other fields. The SQL stores answer a page in two
    /// statements; this default reads each job in full.
    fn job_summaries(
        &self,
        namespace: &str,
        jobs: &[String],
        strip: u32,
        (from, to): (Timestamp, Timestamp),
        fires: u32,
    ) -> impl Future<Output = Result<Vec<JobSummary>>> + Send {
        async move {
            let mut out = Vec::with_capacity(jobs.len());
            for job in jobs {
                let runs = self.list_runs(namespace, job, strip, None).await?;
                let ledger = self.list_fires(namespace, job, from, to, fires).await?;
                let mut summary = JobSummary {
                    runs: runs.items.iter().map(|r| (r.id, r.state)).collect(),
                    ..JobSummary::default()
                };
                for fire in ledger {
                    summary.count(fire.outcome, 1);
                }
                out.push(summary);
            }
            Ok(out)
        }
    }
    /// Runs across jobs, newest first (by id), filtered, paginated: the
    /// runs browser. Served by the index of runs by namespace and id and
    /// by that of runs by job; the other filters are checked on at most
    /// [`BROWSE_SCAN`] runs a page (fewer runs than `limit` and a cursor:
    /// the page looked that far back; more may match further).
    fn browse_runs(
        &self,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> impl Future<Output = Result<Page<RunRecord>>> + Send;
    /// The unfinished runs of a namespace: its `pending` and `running`
    /// runs newest first, or (`planned`) its `planned` runs soonest
    /// first; at most `limit`. Served by partial indexes of those states.
    fn unfinished_runs(
        &self,
        namespace: &str,
        planned: bool,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>>> + Send;
    /// The `planned` runs of a job (made ahead by a trigger for an
    /// instant), soonest first, at most `limit`.
    fn planned_runs(
        &self,
        namespace: &str,
        job: &str,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>>> + Send;

    /// Where each line of an ended attempt's output came from, as
    /// [`dagcron_core::log::encode`] wrote it (empty: not known).
    fn read_log_lines(
        &self,
        run: RunId,
        task: &str,
        number: u32,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send;
    /// Publishes the output so far of attempts running on this node (a
    /// `None` withdraws an attempt's), so that the other nodes of a cluster
    /// can show it while it runs. A store used by one node keeps none.
    fn put_live_logs(&self, logs: Vec<LiveLogWrite>) -> impl Future<Output = Result<()>> + Send {
        let _ = logs;
        async { Ok(()) }
    }
    /// The output of an attempt running on another node, as last
    /// published: how many bytes came before it, and its last bytes.
    fn read_live_log(
        &self,
        run: RunId,
        task: &str,
        number: u32,
    ) -> impl Future<Output = Result<Option<(u64, Vec<u8>)>>> + Send {
        let _ = (run, task, number);
        async { Ok(None) }
    }

    /// The largest run id ever stored (ids keep increasing across restarts).
    fn max_run_id(&self) -> impl Future<Output = Result<RunId>> + Send;
    /// Asks the node that runs `run` to cancel it; `false` if no other node
    /// can (a store used by one node, or the run has finished).
    fn request_cancel(&self, run: RunId) -> impl Future<Output = Result<bool>> + Send {
        let _ = run;
        async { Ok(false) }
    }
    /// Asks the node that runs `run` to do `action` (an intervention's
    /// name) to its task `task`; `false` if no other node can (a store
    /// used by one node, or the run has finished).
    fn request_intervention(
        &self,
        run: RunId,
        task: &str,
        action: &str,
    ) -> impl Future<Output = Result<bool>> + Send {
        let _ = (run, task, action);
        async { Ok(false) }
    }
    /// Claims up to `limit` attempts that other nodes handed to the cluster
    /// (`dispatching`, unclaimed): they become `running` on this node. A
    /// store used by one node has none.
    ///
    /// `limit` attempts for the node's own pool (attempts that need no
    /// agent), and for each of its agents with room (its labels, its free
    /// slots), attempts that need an agent with those labels.
    fn claim_attempts(
        &self,
        limit: usize,
        agents: &[(BTreeMap<String, String>, usize)],
        at: Timestamp,
    ) -> impl Future<Output = Result<Vec<ClaimedAttempt>>> + Send {
        let _ = (limit, agents, at);
        async { Ok(vec![]) }
    }
    /// Attempts of this node's unfinished runs that other nodes claimed.
    fn remote_attempts(&self) -> impl Future<Output = Result<Vec<RemoteAttempt>>> + Send {
        async { Ok(vec![]) }
    }
    /// Of these attempts this node runs for others, the ones that are no
    /// longer `running` in the store (cancelled or declared lost by their
    /// run's owner): their processes must stop.
    fn withdrawn_attempts(
        &self,
        attempts: &[AttemptKey],
    ) -> impl Future<Output = Result<Vec<AttemptKey>>> + Send {
        let _ = attempts;
        async { Ok(vec![]) }
    }
    /// An attempt's captured output.
    fn read_log(
        &self,
        run: RunId,
        task: &str,
        number: u32,
    ) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;
}

/// API tokens (by the keyed hash of their secret) and encrypted secrets.
pub trait AuthStore: Send + Sync {
    /// Stores a new API token with the keyed hash of its secret.
    fn create_token(
        &self,
        token: &TokenRecord,
        hash: &[u8],
    ) -> impl Future<Output = Result<()>> + Send;
    /// The token whose secret has this keyed hash.
    fn find_token(&self, hash: &[u8]) -> impl Future<Output = Result<Option<TokenRecord>>> + Send;
    /// Every token, oldest first (revoked ones included).
    fn list_tokens(&self) -> impl Future<Output = Result<Vec<TokenRecord>>> + Send;
    /// Revokes a token; `false` if there is no such token or it was revoked already.
    fn revoke_token(&self, id: &str, at: Timestamp) -> impl Future<Output = Result<bool>> + Send;
    /// Notes that a token was just used.
    fn token_used(&self, id: &str, at: Timestamp) -> impl Future<Output = Result<()>> + Send;

    /// Stores a secret's new encrypted value (replacing the old one).
    fn put_secret(&self, secret: &SecretRecord) -> impl Future<Output = Result<()>> + Send;
    /// One secret.
    fn get_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<SecretRecord>>> + Send;
    /// The secrets of a namespace, by name.
    fn list_secrets(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Result<Vec<SecretRecord>>> + Send;
    /// Every secret, in every namespace (to re-encrypt them under a new key).
    fn list_all_secrets(&self) -> impl Future<Output = Result<Vec<SecretRecord>>> + Send;
    /// How many secrets are stored, in every namespace.
    fn count_secrets(&self) -> impl Future<Output = Result<u64>> + Send;
    /// Deletes a secret; `false` if there was none.
    fn delete_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<bool>> + Send;
}

/// Settings of the instance, shared by every node of a cluster.
pub trait SettingStore: Send + Sync {
    /// A setting of the instance (such as the read-only mode), shared by
    /// every node of a cluster; `None` if it is not set.
    fn get_setting(&self, key: &str) -> impl Future<Output = Result<Option<String>>> + Send;
    /// Two settings in one read (what a change checks: the read-only mode
    /// and a namespace's quotas), each `None` if it is not set.
    fn get_settings(
        &self,
        keys: [&str; 2],
    ) -> impl Future<Output = Result<[Option<String>; 2]>> + Send;
    /// Sets a setting of the instance, or clears it (`None`).
    fn set_setting(
        &self,
        key: &str,
        value: Option<&str>,
        at: Timestamp,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The audit log, one hash chain (its checkpoint is a setting).
pub trait AuditStore: SettingStore {
    /// Appends a row to the audit log, chained after the last one (see
    /// [`AuditEntry::chain_after`]); appends take turns, so the chain has
    /// no fork.
    fn append_audit(&self, entry: AuditEntry) -> impl Future<Output = Result<()>> + Send;
    /// Audit rows after position `after`, oldest first, at most `limit`,
    /// of one namespace if asked.
    fn list_audit(
        &self,
        after: i64,
        limit: u32,
        namespace: Option<&str>,
    ) -> impl Future<Output = Result<Vec<AuditEntry>>> + Send;

    /// Audit rows before position `before`, newest first, at most `limit`,
    /// of one namespace if asked.
    fn list_audit_newest(
        &self,
        before: i64,
        limit: u32,
        namespace: Option<&str>,
    ) -> impl Future<Output = Result<Vec<AuditEntry>>> + Send;

    /// Deletes the audit rows written before `before`, always keeping the
    /// newest row (the next append chains after it), and keeps the position
    /// and hash of the last row deleted as the log's checkpoint
    /// ([`AUDIT_CHECKPOINT`]), in the same transaction: what is left still
    /// verifies from there. Returns how many rows went.
    fn prune_audit(&self, before: Timestamp) -> impl Future<Output = Result<u64>> + Send;
    /// Where the audit log was last cut: the position and hash of the last
    /// row pruned; none if it never was.
    fn audit_checkpoint(&self) -> impl Future<Output = Result<Option<(i64, Vec<u8>)>>> + Send {
        async {
            let text = self.get_setting(AUDIT_CHECKPOINT).await?;
            text.map(|t| {
                parse_checkpoint(&t).ok_or_else(|| {
                    StorageError::Corrupt(format!("the audit log's checkpoint {t:?} does not read"))
                })
            })
            .transpose()
        }
    }
}

/// What retention reads of the history, and its deletes (see [`retention`]).
pub trait HistoryStore: Send + Sync {
    /// Jobs with history (those that exist and those deleted whose
    /// versions are still stored), ordered by (namespace, name), after
    /// `after`, of one namespace if asked, at most `limit`.
    fn history_jobs(
        &self,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<HistoryJob>>> + Send;
    /// Runs of a job but its `keep` newest, with an id above `after`,
    /// oldest first, at most `limit`.
    fn run_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: RunId,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<dagcron_core::retention::RunFacts>>> + Send;
    /// Ledger rows of a job but its `keep` newest, scheduled after `after`,
    /// oldest first, at most `limit`.
    fn fire_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: Option<Timestamp>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<dagcron_core::retention::FireFacts>>> + Send;
    /// Deletes one batch of history in one transaction (see [`Prune`]).
    fn prune(&self, batch: &Prune) -> impl Future<Output = Result<Pruned>> + Send;
}

/// One row of the audit log: who did what, where, when, with what outcome.
/// Rows are chained: each holds the hash of the row before it, so that a
/// row changed or deleted afterwards is found by [`verify_audit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    /// Position in the log, from 1 (assigned when appended).
    pub seq: i64,
    /// When.
    pub at: Timestamp,
    /// The token's id (none: the call had no valid token).
    pub principal: Option<String>,
    /// The token's name.
    pub principal_name: Option<String>,
    /// What was asked, such as `POST /api/v1/namespaces/a/jobs/j/trigger`.
    pub action: String,
    /// The namespace it concerned, if any.
    pub namespace: Option<String>,
    /// The answer's HTTP status.
    pub outcome: u16,
    /// Where the call came from.
    pub address: Option<String>,
    /// The hash of the row before (32 zero bytes for the first).
    pub prev_hash: Vec<u8>,
    /// The hash of this row: SHA-256 over `prev_hash` and its fields.
    pub hash: Vec<u8>,
}

impl AuditEntry {
    /// The hash this row must have, given its fields and `prev_hash`.
    pub fn expected_hash(&self) -> Vec<u8> {
        use sha2::Digest;
        let opt = |v: &Option<String>| v.clone().unwrap_or_default();
        let text = format!(
            "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
            self.seq,
            self.at.as_microsecond(),
            opt(&self.principal),
            opt(&self.principal_name),
            self.action,
            opt(&self.namespace),
            self.outcome,
            opt(&self.address),
        );
        let mut h = sha2::Sha256::new();
        h.update(&self.prev_hash);
        h.update(text.as_bytes());
        h.finalize().to_vec()
    }

    /// Fills `seq`, `prev_hash` and `hash` as the row after `prev` (none:
    /// the first row).
    pub fn chain_after(&mut self, prev: Option<(i64, Vec<u8>)>) {
        let (seq, prev_hash) = prev.unwrap_or((0, vec![0; 32]));
        self.seq = seq + 1;
        self.prev_hash = prev_hash;
        self.hash = self.expected_hash();
    }
}

/// The setting that holds where the audit log was last cut (see
/// [`AuditStore::prune_audit`]), as written by [`checkpoint_text`].
pub const AUDIT_CHECKPOINT: &str = "audit/checkpoint";

/// A checkpoint as it is stored: the position, a space, the hash in hex.
pub fn checkpoint_text(seq: i64, hash: &[u8]) -> String {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{seq} {hex}")
}

/// Reads back [`checkpoint_text`].
pub fn parse_checkpoint(text: &str) -> Option<(i64, Vec<u8>)> {
    let (seq, hex) = text.split_once(' ')?;
    if hex.len() % 2 != 0 || !hex.is_ascii() {
        return None;
    }
    let hash = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((seq.parse().ok()?, hash))
}

/// Checks a whole audit log, oldest first: every row's hash matches its
/// fields, each names the hash of the row before, and no position is
/// missing; the first row follows `checkpoint` (where the log was last
/// cut: its last pruned row) or, without one, is the first row ever.
/// Returns the first broken row's position and what is wrong.
pub fn verify_audit(
    rows: &[AuditEntry],
    checkpoint: Option<&(i64, Vec<u8>)>,
) -> std::result::Result<(), (i64, String)> {
    let mut prev: Option<&AuditEntry> = None;
    for row in rows {
        let (want_seq, want_prev) = match (prev, checkpoint) {
            (None, None) => (1, vec![0; 32]),
            (None, Some((seq, hash))) => (seq + 1, hash.clone()),
            (Some(p), _) => (p.seq + 1, p.hash.clone()),
        };
        if row.seq != want_seq {
            return Err((
                want_seq,
                format!("row {want_seq} is missing (found {})", row.seq),
            ));
        }
        if row.prev_hash != want_prev {
            return Err((row.seq, "it does not follow the row before it".into()));
        }
        if row.hash != row.expected_hash() {
            return Err((
                row.seq,
                "its content was changed after it was written".into(),
            ));
        }
        prev = Some(row);
    }
    Ok(())
}

#[cfg(test)]
mod audit_tests {
    use super::*;

    fn log(n: usize) -> Vec<AuditEntry> {
        let mut rows: Vec<AuditEntry> = Vec::new();
        for i in 0..n {
            let mut e = AuditEntry {
                seq: 0,
                at: Timestamp::from_second(i as i64).unwrap(),
                principal: Some("tok_a".into()),
                principal_name: Some("ci".into()),
                action: format!("POST /api/v1/namespaces/a/jobs/j{i}/trigger"),
                namespace: Some("a".into()),
                outcome: 201,
                address: Some("127.0.0.1:5000".into()),
                prev_hash: vec![],
                hash: vec![],
            };
            e.chain_after(rows.last().map(|p| (p.seq, p.hash.clone())));
            rows.push(e);
        }
        rows
    }

    #[test]
    fn a_changed_deleted_or_reordered_row_is_found() {
        let rows = log(5);
        assert_eq!(verify_audit(&rows, None), Ok(()));
        let mut changed = rows.clone();
        changed[2].outcome = 200;
        assert_eq!(verify_audit(&changed, None).unwrap_err().0, 3);
        let mut deleted = rows.clone();
        deleted.remove(1);
        assert_eq!(verify_audit(&deleted, None).unwrap_err().0, 2);
        let mut rehashed = rows.clone();
        rehashed[2].outcome = 200;
        rehashed[2].hash = rehashed[2].expected_hash();
        assert_eq!(
            verify_audit(&rehashed, None).unwrap_err().0,
            4,
            "the next row no longer follows"
        );
        let mut swapped = rows.clone();
        swapped.swap(1, 2);
        assert!(verify_audit(&swapped, None).is_err());
        // Cut after row 2: the rest verifies from the checkpoint, and only
        // from it; a row deleted past the cut is found.
        let cut = (rows[1].seq, rows[1].hash.clone());
        assert_eq!(verify_audit(&rows[2..], Some(&cut)), Ok(()));
        assert_eq!(verify_audit(&rows[2..], None).unwrap_err().0, 1);
        assert_eq!(verify_audit(&rows[3..], Some(&cut)).unwrap_err().0, 3);
        let text = checkpoint_text(cut.0, &cut.1);
        assert_eq!(parse_checkpoint(&text), Some(cut));
        assert_eq!(parse_checkpoint("7 abc"), None);
        assert_eq!(parse_checkpoint("x 00"), None);
    }
}

#[cfg(test)]
mod state_lists {
    use dagcron_core::{AttemptState, RunState};

    fn list<S: Copy + std::fmt::Display>(all: &[S], pick: impl Fn(S) -> bool) -> String {
        let names: Vec<String> = all
            .iter()
            .filter(|s| pick(**s))
            .map(|s| format!("'{s}'"))
            .collect();
        format!("({})", names.join(", "))
    }

    #[test]
    fn the_sql_lists_of_states_are_the_state_machines_own() {
        assert_eq!(run_ended!(), list(RunState::ALL, |s| s.is_terminal()));
        assert_eq!(run_unfinished!(), list(RunState::ALL, |s| !s.is_terminal()));
        let unfinished: Vec<String> = RunState::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| format!("state = '{s}'"))
            .collect();
        assert_eq!(
            run_unfinished_or!(),
            format!("({})", unfinished.join(" OR "))
        );
        assert_eq!(
            attempt_unfinished!(),
            list(AttemptState::ALL, |s| !s.is_terminal())
        );
    }
}

/// The store's traits, for code that calls the store's methods on a
/// concrete backend: `use dagcron_store::prelude::*;`.
pub mod prelude {
    pub use crate::{
        AuditStore, AuthStore, HistoryStore, JobStore, OutboxStore, RunStore, SettingStore, Store,
    };
}
