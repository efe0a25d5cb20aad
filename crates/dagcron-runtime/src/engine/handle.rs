//! What the API and the coordinator ask of the engine: the commands, the
//! answers of work done beside the loop, and the handle that sends them.

use super::*;

/// A trigger's runs and who asked for them (also while it waits for its
/// job to be read from the store).
pub(crate) struct WaitingTrigger {
    pub(super) runs: Vec<Params>,
    pub(super) caller: Option<TraceParent>,
    pub(super) at: Option<Timestamp>,
    pub(super) by: TriggerBy,
    pub(super) reply: Reply<Vec<RunRecord>>,
    /// Its key was looked for in the store, and not found.
    pub(super) key_checked: bool,
}

/// What asks for a run: an operator (`manual`, the default) or a source
/// of events, with the key that makes its run once (see
/// [`dagcron_store::NewRun::key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriggerBy {
    /// The run's trigger kind.
    pub kind: Trigger,
    /// Its idempotency key within the job, if the event can come twice.
    pub key: Option<String>,
}

impl Default for TriggerBy {
    fn default() -> TriggerBy {
        TriggerBy {
            kind: Trigger::Manual,
            key: None,
        }
    }
}

/// What the engine's loop takes: a request (from the API, the coordinator
/// or a test) or a completion (the answer of work done beside the loop).
pub(crate) enum Command {
    Request(Request),
    Done(Completion),
}

impl From<Request> for Command {
    fn from(request: Request) -> Command {
        Command::Request(request)
    }
}

impl From<Completion> for Command {
    fn from(done: Completion) -> Command {
        Command::Done(done)
    }
}

/// What the API and the coordinator ask of the engine.
pub(crate) enum Request {
    Apply {
        jobs: Vec<Job>,
        origin: Origin,
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
    /// One run or many of one job, decided together (all or none), made
    /// now or planned for an instant (`ask.at`).
    Trigger {
        namespace: String,
        name: String,
        ask: WaitingTrigger,
    },
    Backfill {
        namespace: String,
        name: String,
        from: Timestamp,
        to: Timestamp,
        reply: Reply<Vec<RunId>>,
    },
    Cancel {
        run: RunId,
        reply: Reply<()>,
    },
    /// An operator acts on a task of a run that goes on.
    Intervene {
        run: RunId,
        task: String,
        action: Intervention,
        reply: Reply<Intervened>,
    },
    /// A new run of a finished run's job version and parameters.
    Rerun {
        run: RunId,
        failed_only: bool,
        reply: Reply<RunId>,
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
    /// Runs of this node's jobs running on other nodes (made before the
    /// job moved here, or by a trigger through another node), per job:
    /// they count against the job's overlap policy here.
    Elsewhere {
        running: HashMap<JobKey, u32>,
        reply: Reply<()>,
    },
    /// Runs taken over from a dead node; `alive` are the epochs of the
    /// nodes still alive (their attempts go on).
    Adopt {
        runs: Vec<RunRecord>,
        alive: HashSet<i64>,
        reply: Reply<()>,
    },
    /// Answered at once by the loop: it is alive and taking commands.
    Ping {
        reply: Reply<()>,
    },
    /// Answered once the timers due now are handled and what they wrote
    /// is committed (see [`EngineHandle::settle`]).
    Settle {
        reply: Reply<()>,
    },
    /// What is running and waiting now, for the metrics.
    Gauges {
        reply: Reply<crate::EngineGauges>,
    },
    /// Work shared across the cluster: claim attempts, learn the outcome of
    /// attempts others claimed, stop attempts withdrawn by their owners.
    Work {
        reply: Reply<()>,
    },
}

/// The answer of work done beside the loop, for the decision that waits on it.
pub(crate) enum Completion {
    /// A keyed trigger's key, looked for in the store beside the loop.
    KeyChecked {
        key: JobKey,
        ask: WaitingTrigger,
        found: Result<Option<RunId>, StorageError>,
    },
    /// What the judgement of an SLA deadline needs, read beside the loop.
    SlaDue(Box<super::sla::SlaDue>),
    /// The fires of a backfill, listed beside the loop: those of the range
    /// not yet in the ledger.
    Backfilled {
        key: JobKey,
        job: Arc<Job>,
        fires: Result<Vec<Timestamp>, EngineError>,
        reply: Reply<Vec<RunId>>,
    },
    /// A job a call named was read beside the loop (see
    /// `Engine::unknown_job`): the call is taken again once it is installed.
    Learned {
        key: JobKey,
        stored: Result<Option<StoredJob>, StorageError>,
        call: Box<Command>,
    },
    /// The run to re-run and the spec of its version, read beside the loop.
    RerunRead {
        read: Box<Result<RerunRead, EngineError>>,
        failed_only: bool,
        reply: Reply<RunId>,
    },
    /// The store's answer to an apply, done beside the loop.
    Applied {
        jobs: Vec<Installable>,
        results: Result<Vec<ApplyResult>, StorageError>,
        reply: Reply<Vec<(String, ApplyResult)>>,
    },
    /// The store's answer to a delete, done beside the loop.
    Deleted {
        key: JobKey,
        result: Result<bool, StorageError>,
        reply: Reply<()>,
    },
    /// The store's answer to a pause or a resume, done beside the loop
    /// (with the job, for a resume: its rules say who hears that its
    /// breaker closed).
    Paused {
        key: JobKey,
        paused: bool,
        result: Result<(bool, Option<Arc<Job>>), StorageError>,
        reply: Reply<()>,
    },
    /// The whole job of a fire, read beside the loop ahead of the fire.
    Prepared {
        key: Arc<JobKey>,
        generation: u64,
        at: Timestamp,
        job: Result<Option<Arc<Job>>, StorageError>,
    },
    /// The store's answers for the shared work, asked beside the loop.
    Worked {
        news: Result<SharedNews, StorageError>,
        reply: Reply<()>,
    },
    /// The last fires of the jobs a node gained, read beside the loop.
    Owned {
        gained: Vec<(JobKey, u64)>,
        last: Result<Vec<Option<Timestamp>>, StorageError>,
        owned: usize,
        reply: Reply<usize>,
    },
    /// The jobs of runs taken over, read beside the loop.
    Adopted {
        runs: Vec<RunRecord>,
        jobs: Result<JobsAt, StorageError>,
        alive: HashSet<i64>,
        reply: Reply<()>,
    },
    /// The job of missed fires to catch up, read beside the loop.
    CaughtUp(Box<CaughtUp>),
    /// The whole job a trigger needs, read beside the loop.
    /// (One read for every trigger of the job that waits for it.)
    Loaded {
        key: JobKey,
        job: Result<Option<Arc<Job>>, StorageError>,
    },
}

/// Jobs as runs of them have them: by job and version.
pub(crate) type JobsAt = HashMap<(JobKey, i64), Option<Arc<Job>>>;

/// A finished run to re-run, and its job as it was at the run's version.
pub(crate) struct RerunRead {
    pub(super) record: RunRecord,
    pub(super) job: Arc<Job>,
}

/// Missed fires of a job, and its job read beside the loop to run them.
pub(crate) struct CaughtUp {
    pub(super) key: JobKey,
    pub(super) generation: u64,
    pub(super) since: Timestamp,
    pub(super) grace: Duration,
    pub(super) missed: Missed,
    pub(super) job: Result<Option<Arc<Job>>, StorageError>,
}

/// What the store answered for a round of shared work.
#[derive(Default)]
pub(crate) struct SharedNews {
    /// The pool's room held for the claims.
    pub(super) room: usize,
    /// Attempts claimed, with the job of each (read for other nodes' runs).
    pub(super) claims: Vec<(ClaimedAttempt, Option<Arc<Job>>)>,
    /// News of this node's attempts that other nodes claimed.
    pub(super) progress: Vec<RemoteAttempt>,
    /// Attempts this node runs for others that their owners withdrew.
    pub(super) withdrawn: HashSet<AttemptKey>,
}

/// A handle to a running engine, for the API.
#[derive(Clone)]
pub struct EngineHandle {
    pub(super) tx: mpsc::Sender<Command>,
    pub(super) live: LiveLogs,
    pub(super) fenced: CancellationToken,
    pub(super) write_health: WriteHealth,
    pub(super) nats: tokio::sync::watch::Receiver<jobs::NatsTriggers>,
}

/// The output of attempts running in this process, by (run, task, attempt).
pub(crate) type LiveLogs =
    Arc<std::sync::Mutex<HashMap<(RunId, String, u32), dagcron_exec::LiveLog>>>;

impl EngineHandle {
    /// The jobs started by messages, by job, changing as jobs are applied
    /// and deleted (the consumer of the messages watches it).
    pub fn nats_triggers(
        &self,
    ) -> tokio::sync::watch::Receiver<
        Arc<std::collections::BTreeMap<JobKey, dagcron_core::message::NatsTrigger>>,
    > {
        self.nats.clone()
    }

    /// Why the engine's commits fail now, if they do (a disk full): the
    /// server is then degraded, reading but starting nothing.
    pub fn write_problem(&self) -> Option<String> {
        self.write_health.problem()
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Request(make(tx)))
            .await
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Creates or updates jobs (already validated); answers after commit.
    pub async fn apply(&self, jobs: Vec<Job>) -> Result<Vec<(String, ApplyResult)>, EngineError> {
        self.apply_as(jobs, Origin::default()).await
    }

    /// [`EngineHandle::apply`], recording who applies the jobs and, for a
    /// rollback, the version they take again with each new version.
    pub async fn apply_as(
        &self,
        jobs: Vec<Job>,
        origin: Origin,
    ) -> Result<Vec<(String, ApplyResult)>, EngineError> {
        self.ask(|reply| Request::Apply {
            jobs,
            origin,
            reply,
        })
        .await
    }

    /// Deletes a job; its history stays.
    pub async fn delete(&self, namespace: &str, name: &str) -> Result<(), EngineError> {
        self.ask(|reply| Request::Delete {
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
        self.ask(|reply| Request::Pause {
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
        self.trigger_traced(namespace, name, params, None, None)
            .await
    }

    /// [`EngineHandle::trigger`] by a caller that sent its trace context
    /// (the run's trace is a child of the caller's span), now or `at` an
    /// instant: a run planned for an instant is recorded `planned` and
    /// made at its instant (late, by the job's misfire policy, if the
    /// server was down then); it can be cancelled until then.
    pub async fn trigger_traced(
        &self,
        namespace: &str,
        name: &str,
        params: std::collections::BTreeMap<String, String>,
        caller: Option<TraceParent>,
        at: Option<Timestamp>,
    ) -> Result<RunId, EngineError> {
        let runs = self
            .trigger_runs(namespace, name, vec![params], caller, at)
            .await?;
        runs.first()
            .map(|r| r.id)
            .ok_or_else(|| EngineError::Invalid("a trigger needs a run".into()))
    }

    /// Many runs of one job in one decision, each with its parameters (over
    /// the job's defaults), now or `at` an instant: admitted together or
    /// refused together (the job's overlap policy, its `max_pending_runs`,
    /// the server's ready backlog), and all committed in one batch before
    /// the answer. Each run is answered as the engine committed it: its
    /// state and its tasks' states, without attempts (read the run for
    /// those).
    pub async fn trigger_runs(
        &self,
        namespace: &str,
        name: &str,
        runs: Vec<Params>,
        caller: Option<TraceParent>,
        at: Option<Timestamp>,
    ) -> Result<Vec<RunRecord>, EngineError> {
        self.ask(|reply| Request::Trigger {
            namespace: namespace.into(),
            name: name.into(),
            ask: WaitingTrigger {
                runs,
                caller,
                at,
                by: TriggerBy::default(),
                reply,
                key_checked: false,
            },
        })
        .await
    }

    /// One run of a job for an event (`by`): made with its kind, and once
    /// per key; `Ok(None)` when the job has a run of that key already.
    pub async fn trigger_by(
        &self,
        namespace: &str,
        name: &str,
        params: Params,
        by: TriggerBy,
    ) -> Result<Option<RunId>, EngineError> {
        let made = self
            .ask(|reply| Request::Trigger {
                namespace: namespace.into(),
                name: name.into(),
                ask: WaitingTrigger {
                    runs: vec![params],
                    caller: None,
                    at: None,
                    by,
                    reply,
                    key_checked: false,
                },
            })
            .await;
        match made {
            Ok(runs) => Ok(runs.first().map(|r| r.id)),
            Err(EngineError::Duplicate(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a run for every fire in `[from, to)` not already in the ledger.
    pub async fn backfill(
        &self,
        namespace: &str,
        name: &str,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<RunId>, EngineError> {
        self.ask(|reply| Request::Backfill {
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

    /// Every attempt's live log on this node.
    pub fn live_logs(&self) -> Vec<((RunId, String, u32), dagcron_exec::LiveLog)> {
        self.live
            .lock()
            .expect("live logs lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Tells a cluster node's engine which jobs it owns; returns how many.
    pub async fn set_ownership(&self, owns: Ownership) -> Result<usize, EngineError> {
        self.ask(|reply| Request::Own { owns, reply }).await
    }

    /// Takes in jobs changed and deleted through other nodes; returns how
    /// many jobs this node now owns.
    pub async fn sync_jobs(
        &self,
        changed: Vec<StoredJob>,
        deleted: Vec<(String, String)>,
    ) -> Result<usize, EngineError> {
        self.ask(|reply| Request::Sync {
            changed,
            deleted,
            reply,
        })
        .await
    }

    /// Tells the engine which of its jobs have runs running on other
    /// nodes, and how many (see [`Request::Elsewhere`]).
    pub async fn running_elsewhere(
        &self,
        running: HashMap<JobKey, u32>,
    ) -> Result<(), EngineError> {
        self.ask(|reply| Request::Elsewhere { running, reply })
            .await
    }

    /// Hands the engine runs it now owns (after their node died); `alive`
    /// are the epochs of the nodes alive now.
    pub async fn adopt(
        &self,
        runs: Vec<RunRecord>,
        alive: HashSet<i64>,
    ) -> Result<(), EngineError> {
        self.ask(|reply| Request::Adopt { runs, alive, reply })
            .await
    }

    /// Does the cluster's shared work: claims attempts other nodes handed
    /// over (as many as the pool has room for), takes in the outcomes of
    /// this node's attempts that others ran, and stops the attempts it runs
    /// for others that their owners withdrew.
    pub async fn share_work(&self) -> Result<(), EngineError> {
        self.ask(|reply| Request::Work { reply }).await
    }

    /// Resolves once a cluster node's lease has ended and every attempt it
    /// ran has been killed and seen gone (or a bounded wait for them ran
    /// out): the process must stop, whatever its engine loop is doing.
    pub async fn fenced(&self) {
        self.fenced.cancelled().await;
    }

    /// Answers once the engine's loop has taken the call: whether it is
    /// alive and taking commands (for readiness).
    pub async fn ping(&self) -> Result<(), EngineError> {
        self.ask(|reply| Request::Ping { reply }).await
    }

    /// Handles every timer due at the clock's instant now and answers once
    /// what they wrote is committed: the barrier of a test that moves a
    /// manual clock and then checks that nothing happened. (Work a timer
    /// sends beside the loop, such as reading a job ahead of its fire,
    /// may still come back after it.)
    pub async fn settle(&self) -> Result<(), EngineError> {
        self.ask(|reply| Request::Settle { reply }).await
    }

    /// What is running and waiting now (runs by namespace and state, the
    /// ready queues, the pool), for the metrics.
    pub async fn gauges(&self) -> Result<crate::EngineGauges, EngineError> {
        self.ask(|reply| Request::Gauges { reply }).await
    }

    /// A new run of a finished run: the same job version and parameters,
    /// linked to it, triggered `rerun`. Every task runs again, or with
    /// `failed_only` those that did not end well and the tasks downstream
    /// of them, the others keeping their outcome (see
    /// [`dagcron_core::rerun`]). Refused while the run goes on, for a run
    /// of a deleted job or of a version no longer stored, and as a trigger
    /// is by the version's concurrency policy.
    pub async fn rerun(&self, run: RunId, failed_only: bool) -> Result<RunId, EngineError> {
        self.ask(|reply| Request::Rerun {
            run,
            failed_only,
            reply,
        })
        .await
    }

    /// An operator acts on task `task` of run `run` (see
    /// [`Intervention`]): done here if this node runs it, asked of the node
    /// that does through the store otherwise. Refused (`Conflict`) when the
    /// run is not going on or the task is not in a state the action
    /// applies to; `NotFound` for no such run or task.
    pub async fn intervene(
        &self,
        run: RunId,
        task: &str,
        action: Intervention,
    ) -> Result<Intervened, EngineError> {
        self.ask(|reply| Request::Intervene {
            run,
            task: task.into(),
            action,
            reply,
        })
        .await
    }

    /// Cancels a run: running attempts are stopped, pending tasks cancelled.
    /// A run of another cluster node is cancelled by that node.
    pub async fn cancel(&self, run: RunId) -> Result<(), EngineError> {
        self.ask(|reply| Request::Cancel { run, reply }).await
    }
}
