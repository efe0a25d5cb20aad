//! What the requests and completions share: triggers and their job
//! machine's answer, plans, re-runs, a job a call names that is not known
//! yet, and work sent beside the loop.

use super::*;
use runs::Rerun;

impl<S: Store> Engine<S> {
    /// Takes a command: a request, or the completion of work done beside the loop.
    pub(super) fn on_command(&mut self, cmd: impl Into<Command>) {
        match cmd.into() {
            Command::Request(request) => self.on_request(request),
            Command::Done(done) => self.on_completion(done),
        }
    }

    /// Whether the ready backlog leaves room for `runs` more runs made by
    /// hand in `namespace`: past `max_ready_backlog` tasks waiting
    /// (counting each run as one), triggers and backfills are refused
    /// (scheduled fires go on), but for a namespace still under its share
    /// of the backlog (see [`dagcron_core::policy::backlog_admits`]).
    pub(super) fn backlog_allows(&self, namespace: &str, runs: usize) -> Result<(), EngineError> {
        let limit = self.config.max_ready_backlog;
        let waiting = self.dispatch.ready.len();
        if waiting + runs <= limit {
            return Ok(());
        }
        // Who holds the backlog: the pool's queue counts by namespace; the
        // agents' and the no-op lanes are looked through.
        let mut held: HashMap<&str, usize> = self.dispatch.ready.local.counts().collect();
        let ready = &self.dispatch.ready;
        for (run, _) in ready.remote.iter().chain(&ready.free) {
            if let Some(r) = self.runs.table.get(run) {
                *held.entry(r.key.0.as_str()).or_default() += 1;
            }
        }
        let own = held.get(namespace).copied().unwrap_or(0);
        let others = held.keys().filter(|ns| **ns != namespace).count();
        if dagcron_core::policy::backlog_admits(limit, waiting, own, others, runs) {
            return Ok(());
        }
        let more = match runs {
            1 => String::new(),
            n => format!(" and {n} more runs would pass"),
        };
        Err(EngineError::Busy(format!(
            "{waiting} tasks are ready and waiting for a worker ({own} of them {namespace}'s){more}, over this server's limit of {limit}; scheduled fires go on, manual triggers and backfills are refused until the backlog drains"
        )))
    }

    /// What is running and waiting now (see [`crate::EngineGauges`]).
    pub(super) fn gauges(&self, now: Timestamp) -> crate::EngineGauges {
        let mut runs: HashMap<(&str, &'static str), u64> = HashMap::new();
        let mut held: std::collections::BTreeMap<&str, u64> = Default::default();
        for run in self.runs.table.values() {
            let n = run
                .machine
                .tasks()
                .iter()
                .filter(|t| **t == TaskState::Held);
            match n.count() as u64 {
                0 => {}
                n => *held.entry(run.key.0.as_str()).or_default() += n,
            }
            let state = if run.machine.stopping() {
                "stopping"
            } else {
                run.machine.state().as_str()
            };
            *runs.entry((run.key.0.as_str(), state)).or_default() += 1;
        }
        let mut runs: Vec<(String, &'static str, u64)> = runs
            .into_iter()
            .map(|((ns, state), n)| (ns.to_string(), state, n))
            .collect();
        runs.sort();
        let next_timer_at = self.timers.queue.next_at();
        let overdue = next_timer_at.map_or(0.0, |at| now.duration_since(at).as_secs_f64().max(0.0));
        crate::EngineGauges {
            runs,
            held: held
                .into_iter()
                .map(|(ns, n)| (ns.to_string(), n))
                .collect(),
            ready_local: self.dispatch.ready.local.len() as u64,
            ready_remote: self.dispatch.ready.remote.len() as u64,
            pool_slots: self.config.pool_size as u64,
            pool_in_use: self.dispatch.running as u64,
            remote_running: self.dispatch.remote_running as u64,
            timers_overdue_seconds: overdue,
            next_timer_at,
        }
    }

    /// Makes `runs` of `job` now, or plans them `at` an instant: all of
    /// them, decided together, or none (see [`EngineHandle::trigger_runs`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn trigger(
        &mut self,
        key: JobKey,
        job: Arc<Job>,
        ask: handle::WaitingTrigger,
        now: Timestamp,
    ) {
        let handle::WaitingTrigger {
            runs,
            caller,
            at,
            by,
            reply,
            ..
        } = ask;
        if by.key.is_some() && (runs.len() != 1 || at.is_some()) {
            let _ = reply.send(Err(EngineError::Invalid(
                "a trigger with a key makes one run, now".into(),
            )));
            return;
        }
        if let Some(k) = &by.key
            && self.runs.keys.contains_key(&(key.clone(), k.clone()))
        {
            // Its run is in memory here still: nothing of it is decided again.
            let _ = reply.send(Err(EngineError::Duplicate(k.clone())));
            return;
        }
        // Events start no run of a job that is paused or whose breaker is
        // open (an operator's trigger does).
        if by.kind != Trigger::Manual
            && let Some(entry) = self.jobs.table.get(&key)
            && (entry.paused || entry.breaker_open)
        {
            let why = if entry.paused {
                "is paused"
            } else {
                "has its failure breaker open"
            };
            let _ = reply.send(Err(EngineError::Conflict(format!(
                "{}/{} {why}: a {} trigger makes no run of it until it is resumed",
                key.0,
                key.1,
                by.kind.as_str()
            ))));
            return;
        }
        if runs.is_empty() || runs.len() > MAX_TRIGGER_RUNS {
            let _ = reply.send(Err(EngineError::Invalid(format!(
                "a trigger makes 1 to {MAX_TRIGGER_RUNS} runs, not {}",
                runs.len()
            ))));
            return;
        }
        if let Some(at) = at.filter(|at| *at > now) {
            return self.plan(key, job, runs, caller, at, reply, now);
        }
        let decisions = match self.admit(&key, &job, runs.len()) {
            Ok(decisions) => decisions,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        // Where in the batch each new run is written.
        let mut made = Vec::with_capacity(runs.len());
        for (params, decision) in runs.into_iter().zip(decisions) {
            let mut merged = job.spec.params.clone();
            merged.extend(params);
            let mut run = self.new_run(
                &key,
                &job,
                by.kind,
                now,
                merged,
                decision,
                now,
                caller.clone(),
                None,
            );
            if let Some(k) = &by.key {
                self.key_run(&mut run, k.clone());
            }
            let id = run.id;
            made.push(self.batch.writes.len());
            self.batch.writes.push(Write::Run(run));
            self.after_new_run(&key, id, decision, now);
        }
        // Answered as committed: each run's state and its tasks' after its
        // decision, all written in this batch.
        let first = made[0];
        let answer: Vec<RunRecord> = made
            .into_iter()
            .filter_map(|i| match &self.batch.writes[i] {
                Write::Run(run) => Some(self.as_committed(run, now)),
                _ => None,
            })
            .collect();
        match by.key {
            // Refused if the job has a run of the key already.
            Some(key) => self.batch.effects.push(Action::IfDone {
                write: first,
                then: Box::new(move |done| {
                    let _ = reply.send(if done {
                        Ok(answer)
                    } else {
                        Err(EngineError::Duplicate(key))
                    });
                }),
            }),
            None => self.reply_after_commit(reply, Ok(answer)),
        }
    }

    /// A run just made, as the batch being written records it.
    fn as_committed(&self, run: &NewRun, now: Timestamp) -> RunRecord {
        let machine = self.runs.table.get(&run.id).map(|r| &r.machine);
        let state = machine.map_or(run.state, |m| m.state());
        RunRecord {
            id: run.id,
            namespace: run.namespace.clone(),
            job: run.job.clone(),
            job_version: run.job_version,
            trigger: run.trigger,
            scheduled_at: run.scheduled_at,
            state,
            params: run.params.clone(),
            created_at: run.created_at,
            started_at: (state == RunState::Running).then_some(now),
            finished_at: state.is_terminal().then_some(now),
            closing: None,
            trace: run.trace.clone(),
            rerun_of: run.rerun_of,
            tasks: run
                .tasks
                .iter()
                .enumerate()
                .map(|(i, id)| dagcron_store::TaskRecord {
                    item: Default::default(),
                    note: Default::default(),
                    carried_outputs: Default::default(),
                    id: id.clone(),
                    state: machine
                        .and_then(|m| m.tasks().get(i).copied())
                        .unwrap_or(TaskState::Pending),
                    attempts: Vec::new(),
                    carried: false,
                })
                .collect(),
        }
    }

    /// Records `runs` of `job` planned for `at`: `planned` until then, when
    /// [`Engine::planned_due`] makes them. A job has at most its
    /// `max_pending_runs` planned at once.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan(
        &mut self,
        key: JobKey,
        job: Arc<Job>,
        runs: Vec<Params>,
        caller: Option<TraceParent>,
        at: Timestamp,
        reply: Reply<Vec<RunRecord>>,
        now: Timestamp,
    ) {
        let planned = self.jobs.table[&key].planned.len();
        if planned + runs.len() > job.spec.max_pending() as usize {
            let _ = reply.send(Err(EngineError::Busy(format!(
                "{}/{} has {planned} runs planned already, and {} more would pass its max_pending_runs ({}); cancel some or wait until they are made",
                key.0,
                key.1,
                runs.len(),
                job.spec.max_pending()
            ))));
            return;
        }
        let mut answer = Vec::with_capacity(runs.len());
        for params in runs {
            let mut merged = job.spec.params.clone();
            merged.extend(params);
            let mut run = self.new_run(
                &key,
                &job,
                Trigger::Manual,
                at,
                merged,
                FireDecision::Queue,
                now,
                caller.clone(),
                None,
            );
            let id = run.id;
            run.state = RunState::Planned;
            self.runs.table.get_mut(&id).expect("run").machine =
                RunMachine::new(job.tasks.len(), RunState::Planned);
            answer.push(self.as_committed(&run, now));
            self.batch.writes.push(Write::Run(run));
            self.jobs
                .table
                .get_mut(&key)
                .expect("job")
                .planned
                .insert(id);
            self.arm(at, Timer::Planned { run: id });
        }
        self.reply_after_commit(reply, Ok(answer));
    }

    /// The instant of planned run `id` has come: made now by the job's
    /// overlap policy like a fire, or skipped, when the instant passed
    /// more than the misfire grace ago (the server was down) and the
    /// job's misfire policy is `skip`, or its overlap policy declines it.
    pub(super) fn planned_due(&mut self, id: RunId, now: Timestamp, grace: SignedDuration) {
        let Some(run) = self.runs.table.get(&id) else {
            return;
        };
        if run.machine.state() != RunState::Planned {
            return;
        }
        let (key, job, at) = (run.key.clone(), run.job.clone(), run.scheduled_at);
        self.jobs
            .table
            .get_mut(&*key)
            .expect("job of a run")
            .planned
            .remove(&id);
        let missed = now.duration_since(at) > grace;
        match job::on_planned_due(&JobPolicy::of(&job.spec), self.job_runs(&key), missed) {
            job::Fire::Make(decision) => {
                self.step(id, Event::Due { skip: false }, now, None);
                self.after_new_run(&key, id, decision, now);
            }
            job::Fire::Skip(why) => {
                tracing::warn!(namespace = %key.0, job = %key.1, run = id, "run planned for {at} skipped: {}", if why == FireOutcome::MissedSkipped { "its instant passed while the server was down, and the job's misfire policy is skip" } else { "the job's overlap policy declines it" });
                self.step(id, Event::Due { skip: true }, now, None);
            }
        }
    }

    /// What each of `runs` runs made by hand (a trigger, a re-run) of
    /// `job` does by its overlap policy, or why they are refused, all of
    /// them: the server's ready backlog has no room for them or the job
    /// would have more runs waiting than it may (`Busy`), its policy
    /// declines one while a run goes on (`Conflict`), or it would replace
    /// runs of the same trigger (`Invalid`).
    pub(super) fn admit(
        &self,
        key: &JobKey,
        job: &Job,
        runs: usize,
    ) -> Result<Vec<FireDecision>, EngineError> {
        self.backlog_allows(&key.0, runs)?;
        job::on_trigger(&JobPolicy::of(&job.spec), self.job_runs(key), runs).map_err(|refusal| {
            // A refusal because of runs of this same trigger says so.
            let ahead = |n: u32| match n {
                0 => String::new(),
                n => format!(" (counting the {n} run(s) of this trigger before it)"),
            };
            match refusal {
                job::Refusal::ReplaceMany => EngineError::Invalid(format!(
                    "{}/{}'s concurrency policy is replace: each run would cancel the one before it, so trigger one run at a time",
                    key.0, key.1
                )),
                job::Refusal::Backlog { waiting, ahead: n } => EngineError::Busy(format!(
                    "{}/{} has {waiting} runs waiting already{}, as many as its max_pending_runs allows; trigger again once some have started",
                    key.0, key.1, ahead(n)
                )),
                job::Refusal::Overlap { ahead: n } => EngineError::Conflict(match job.spec.concurrency {
                    dagcron_core::Concurrency::BufferOne => format!(
                        "{}/{} has a run active and one waiting behind it{}, and its concurrency policy buffer_one keeps at most one waiting; trigger again once the waiting run has started",
                        key.0, key.1, ahead(n)
                    ),
                    _ => format!(
                        "{}/{} has a run active{} and its concurrency policy is forbid",
                        key.0, key.1, ahead(n)
                    ),
                }),
            }
        })
    }

    /// Re-runs a finished run (see [`EngineHandle::rerun`]), its record and
    /// its version's job read beside the loop.
    pub(super) fn rerun(
        &mut self,
        read: RerunRead,
        failed_only: bool,
        reply: Reply<RunId>,
        now: Timestamp,
    ) {
        let RerunRead { record, job } = read;
        let key = (record.namespace.clone(), record.job.clone());
        if self.runs.table.contains_key(&record.id) || !record.state.is_terminal() {
            // Taken over meanwhile, or going on on another node.
            let _ = reply.send(Err(still_going(record.id)));
            return;
        }
        if !self.jobs.table.contains_key(&key) {
            // Applied through another node and not announced here yet, or deleted.
            self.unknown_job(
                key,
                Completion::RerunRead {
                    read: Box::new(Ok(RerunRead { record, job })),
                    failed_only,
                    reply,
                },
            );
            return;
        }
        let before: Vec<Option<TaskState>> = job
            .tasks
            .iter()
            .map(|t| record.tasks.iter().find(|r| r.id == t.id).map(|r| r.state))
            .collect();
        let mut starts = match dagcron_core::rerun::start_states(&job, &before, failed_only) {
            Ok(starts) => starts,
            Err(e) => {
                let _ = reply.send(Err(EngineError::Conflict(format!(
                    "run {} cannot re-run its failed tasks: {e}",
                    record.id
                ))));
                return;
            }
        };
        // Admitted as a trigger is, by its own version's policy.
        let decision = match self.admit(&key, &job, 1) {
            Ok(decisions) => decisions[0],
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        // The tasks carried over keep their outputs; the others make theirs.
        let mut outputs = stored_outputs(&job, &record.tasks, job.tasks.len());
        for (o, start) in outputs.iter_mut().zip(&starts) {
            if *start == TaskState::Pending {
                *o = None;
            }
        }
        // The mapped tasks it keeps the instances of, after the tasks.
        let mut instances = Vec::new();
        for (t, spec) in job.tasks.iter().enumerate() {
            if !dagcron_core::rerun::keeps_expansion(&job, &starts, t, failed_only) {
                continue;
            }
            let of_task = |r: &&dagcron_store::TaskRecord| {
                dagcron_core::fan_out::parse_instance(&r.id).is_some_and(|(p, _)| p == spec.id)
            };
            for r in record.tasks.iter().filter(of_task) {
                let Some(item) = &r.item else { continue };
                let start = dagcron_core::rerun::instance_start(r.state);
                instances.push((t, Arc::from(item.as_str())));
                starts.push(start);
                outputs.push(
                    r.outputs()
                        .filter(|_| start != TaskState::Pending)
                        .map(|o| Arc::new(o.clone())),
                );
            }
        }
        let rerun = Rerun {
            version: record.job_version,
            of: record.id,
            starts,
            instances,
            outputs,
        };
        let run = self.new_run(
            &key,
            &job,
            Trigger::Rerun,
            record.scheduled_at,
            record.params,
            decision,
            now,
            None,
            Some(rerun),
        );
        let id = run.id;
        tracing::info!(namespace = %key.0, job = %key.1, run = id, "re-running run {}{}", record.id, if failed_only { " from its failed tasks" } else { "" });
        self.batch.writes.push(Write::Run(run));
        self.after_new_run(&key, id, decision, now);
        self.reply_after_commit(reply, Ok(id));
    }

    /// Runs `work` beside the loop (a store read or a write committed on
    /// its own); its result comes back as the command `back` makes of it,
    /// so that no timer waits for the store.
    /// Takes `command` again, after the commands already waiting.
    pub(super) fn again(&self, command: Command) {
        let Some(tx) = self.life.commands_back.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let _ = tx.send(command).await;
        });
    }

    pub(super) fn beside<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
        back: impl FnOnce(T) -> Completion + Send + 'static,
    ) {
        let Some(tx) = self.life.commands_back.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let out = work.await;
            let _ = tx.send(Command::Done(back(out))).await;
        });
    }
}

impl<S: Store> Engine<S> {
    /// A call names job `key`, which this node does not know. In a cluster
    /// it may have been applied through another node and not announced
    /// here yet (once an apply has returned, every node takes calls about
    /// the job): it is read beside the loop, installed, and the call taken
    /// again (`Completion::Learned`). Otherwise there is no such job.
    pub(super) fn unknown_job(&self, key: JobKey, call: impl Into<Command>) {
        let call = call.into();
        if self.config.node.is_none() {
            call.refuse(no_such_job(&key));
            return;
        }
        let store = self.store.clone();
        let read = key.clone();
        self.beside(
            async move { store.get_job(&read.0, &read.1).await },
            move |stored| Completion::Learned {
                key,
                stored,
                call: Box::new(call),
            },
        );
    }
}

impl Command {
    /// Answers a call about a job (a trigger, a backfill, a re-run) with
    /// `e` (see [`Engine::unknown_job`]).
    pub(super) fn refuse(self, e: EngineError) {
        match self {
            Command::Request(Request::Trigger { ask, .. }) => {
                let _ = ask.reply.send(Err(e));
            }
            Command::Request(Request::Backfill { reply, .. }) => {
                let _ = reply.send(Err(e));
            }
            Command::Done(Completion::RerunRead { read, reply, .. }) => {
                let e = match (e, *read) {
                    (EngineError::NotFound(_), Ok(read)) => EngineError::Conflict(format!(
                        "run {} is a run of job {}/{}, which was deleted: it cannot run again (apply the job again first)",
                        read.record.id, read.record.namespace, read.record.job
                    )),
                    (e, _) => e,
                };
                let _ = reply.send(Err(e));
            }
            _ => tracing::error!("a call that names no job was refused: {e}"),
        }
    }
}

/// What a re-run answers for a run that has not ended.
pub(super) fn still_going(run: RunId) -> EngineError {
    EngineError::Conflict(format!(
        "run {run} has not finished: wait for it to end, or cancel it, before running it again"
    ))
}

/// The run to re-run and its job at the run's version, from the store.
pub(super) async fn read_rerun<S: Store>(store: &S, run: RunId) -> Result<RerunRead, EngineError> {
    let record = store
        .get_run(run)
        .await
        .map_err(EngineError::Storage)?
        .ok_or_else(|| EngineError::NotFound(format!("no run {run}")))?;
    if !record.state.is_terminal() {
        return Err(still_going(run));
    }
    let (ns, name, v) = (&record.namespace, &record.job, record.job_version);
    let version = store
        .get_job_version(ns, name, v)
        .await
        .map_err(EngineError::Storage)?
        .ok_or_else(|| {
            EngineError::Conflict(format!(
                "run {run} ran version {v} of {ns}/{name}, which is no longer stored: it cannot run again"
            ))
        })?;
    let job = Job::from_canonical(ns, &version.spec).map_err(|e| {
        EngineError::Conflict(format!(
            "run {run} ran version {v} of {ns}/{name}, which this server no longer accepts ({e}): it cannot run again"
        ))
    })?;
    Ok(RerunRead {
        record,
        job: Arc::new(job),
    })
}

/// Asks the node running `run` to cancel it, through the store.
pub(super) async fn request_cancel<S: Store>(store: &S, run: RunId) -> Result<(), EngineError> {
    let record = store
        .get_run(run)
        .await
        .map_err(EngineError::Storage)?
        .ok_or_else(|| EngineError::NotFound(format!("no run {run}")))?;
    if record.state.is_terminal() {
        return Err(EngineError::Conflict(format!(
            "run {run} is already {}",
            record.state
        )));
    }
    match store.request_cancel(run).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(EngineError::Conflict(format!(
            "run {run} is {} and no node runs it",
            record.state
        ))),
        Err(e) => Err(EngineError::Storage(e)),
    }
}

pub(super) fn no_such_task(run: RunId, task: &str) -> EngineError {
    EngineError::NotFound(format!("run {run} has no task {task:?}"))
}

pub(super) fn refused(
    run: RunId,
    task: &str,
    action: Intervention,
    why: dagcron_core::run::Refused,
) -> EngineError {
    EngineError::Conflict(format!(
        "cannot {} task {task} of run {run}: {why}",
        action.as_str()
    ))
}

/// Asks the node running `run` to do `action` to `task`, through the store,
/// once the stored run says it applies.
pub(super) async fn request_intervention<S: Store>(
    store: &S,
    run: RunId,
    task: &str,
    action: Intervention,
) -> Result<Intervened, EngineError> {
    let record = store
        .get_run(run)
        .await
        .map_err(EngineError::Storage)?
        .ok_or_else(|| EngineError::NotFound(format!("no run {run}")))?;
    let Some(stored) = record.tasks.iter().find(|t| t.id == task) else {
        return Err(no_such_task(run, task));
    };
    dagcron_core::run::going_on(record.state, record.closing)
        .and_then(|()| action.applies_to(stored.state))
        .map_err(|why| refused(run, task, action, why))?;
    match store.request_intervention(run, task, action.as_str()).await {
        Ok(true) => Ok(Intervened::Asked),
        Ok(false) => Err(EngineError::Conflict(format!(
            "run {run} is {} and no node runs it",
            record.state
        ))),
        Err(e) => Err(EngineError::Storage(e)),
    }
}

/// The store's answer to a change of a job: done, or no such job.
pub(super) fn job_found(
    result: Result<bool, StorageError>,
    key: &JobKey,
) -> Result<(), EngineError> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(no_such_job(key)),
        Err(e) => Err(EngineError::Storage(e)),
    }
}

/// The same storage error again, for each of the callers it answers.
pub(super) fn copy_of(e: &StorageError) -> StorageError {
    match e {
        StorageError::Corrupt(m) => StorageError::Corrupt(m.clone()),
        StorageError::Invalid(m) => StorageError::Invalid(m.clone()),
        StorageError::Fenced(m) => StorageError::Fenced(m.clone()),
        StorageError::Unavailable(m) => StorageError::Unavailable(m.clone()),
        StorageError::Full(m) => StorageError::Full(m.clone()),
        other => StorageError::Unavailable(other.to_string()),
    }
}
