//! Runs: a fire's overlap decision, a run's DAG moving on as its tasks
//! end, retries, and stopping a run.

use super::*;

/// The engine's runs part: the runs under way here and what is kept
/// beside them.
pub(super) struct Runs {
    pub(super) table: HashMap<RunId, RunEntry, foldhash::fast::RandomState>,
    /// Runs dropped because the ledger refused their fire, while writes of
    /// theirs may still be in a batch (see [`MAX_DROPPED`]).
    pub(super) dropped: HashSet<RunId>,
    /// The latest run id made (new ones follow it).
    pub(super) last_id: RunId,
    /// Runs of missed fires waiting to begin.
    pub(super) pace: Pace,
    /// The keys of the runs with one that are in memory here (see
    /// [`dagcron_store::NewRun::key`]): a trigger of the same key meanwhile
    /// is a duplicate before its admission can touch other runs.
    pub(super) keys: HashMap<(JobKey, String), RunId>,
}

impl Runs {
    /// No run yet; new ids follow `last_id`.
    pub(super) fn after(last_id: RunId) -> Runs {
        Runs {
            table: HashMap::default(),
            dropped: HashSet::new(),
            last_id,
            pace: Pace::default(),
            keys: HashMap::new(),
        }
    }

    /// The id of a new run made at `now` (microseconds), on the cluster
    /// node of `slot` (none: a server alone): greater than every id made
    /// before, and at least `now`, so roughly its creation time; in a
    /// cluster, its low bits are the node's slot, so that two nodes never
    /// make the same id.
    pub(super) fn next_id(&mut self, now: i64, slot: Option<u8>) -> RunId {
        self.last_id = match slot {
            None => (self.last_id + 1).max(now),
            Some(slot) => {
                let counter = ((self.last_id >> SLOT_BITS) + 1).max(now);
                (counter << SLOT_BITS) | RunId::from(slot)
            }
        };
        self.last_id
    }
}

impl<S: Store> Engine<S> {
    /// Gives run `made` (just made, not yet written) the key `key`.
    pub(super) fn key_run(&mut self, made: &mut NewRun, key: String) {
        let job = (made.namespace.clone(), made.job.clone());
        self.runs.keys.insert((job, key.clone()), made.id);
        if let Some(run) = self.runs.table.get_mut(&made.id) {
            run.trigger_key = Some(key.clone());
        }
        made.key = Some(key);
    }

    pub(super) fn run_id(&mut self) -> RunId {
        let now = self.clock.now().as_microsecond();
        let slot = self.config.node.as_ref().map(|n| n.slot);
        self.runs.next_id(now, slot)
    }

    /// A fire of `key` at `at`: applies the overlap policy and records it.
    pub(super) fn fire(
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
        let breaker_open = self.jobs.table.get(key).is_some_and(|e| e.breaker_open);
        let runs = self.job_runs(key);
        let quota = self.config.max_fires_per_namespace;
        // Counted by the instants fired: a second's fires handled late
        // still count against that second.
        let within_quota = || match quota {
            Some(rate) if trigger == Trigger::Schedule => self.jobs.take_fire(&key.0, rate, at),
            _ => true,
        };
        let decision = match job::on_fire(
            &JobPolicy::of(&job.spec),
            runs,
            breaker_open,
            within_quota,
        ) {
            job::Fire::Make(decision) => decision,
            job::Fire::Skip(skipped) => {
                if skipped == FireOutcome::SkippedBacklog {
                    tracing::warn!(namespace = %key.0, job = %key.1, "fire of {at} skipped: {} runs of the job wait already (max_pending_runs)", job.spec.max_pending());
                }
                self.record_fire(key, at, skipped, None);
                return;
            }
        };
        let run = self.new_run(
            key,
            job,
            trigger,
            at,
            job.spec.params.clone(),
            decision,
            now,
            None,
            None,
        );
        let id = run.id;
        if at > now {
            // Made ahead of its instant (`send_ahead`).
            self.runs.table.get_mut(&id).expect("run").start_at = Some(at);
        }
        self.record_fire(key, at, outcome, Some(run));
        self.after_new_run(key, id, decision, now);
    }

    /// The runs of `key` as the job machine counts them: those running
    /// (this node's, and those on other nodes) and those waiting here.
    pub(super) fn job_runs(&self, key: &JobKey) -> JobRuns {
        let entry = self.jobs.table.get(key);
        JobRuns {
            running: entry.map_or(0, |e| e.active.len() as u32) + self.running_elsewhere(key),
            waiting: entry.map_or(0, |e| e.queued.len() as u32),
        }
    }

    /// The runs of `key` running on other nodes (none, nearly always: no
    /// hashing then).
    fn running_elsewhere(&self, key: &JobKey) -> u32 {
        if self.cluster.elsewhere.is_empty() {
            return 0;
        }
        self.cluster.elsewhere.get(key).copied().unwrap_or(0)
    }

    /// The coordinator read the runs of this node's jobs running on other
    /// nodes: runs queued behind those that ended may start.
    pub(super) fn set_elsewhere(&mut self, running: HashMap<JobKey, u32>, now: Timestamp) {
        let before = std::mem::replace(&mut self.cluster.elsewhere, running);
        for (key, was) in before {
            if self.cluster.elsewhere.get(&key).copied().unwrap_or(0) < was {
                self.start_queued(&key, now);
            }
        }
    }

    /// The trace of run `id` of `key` (a child of `caller`'s, if it has
    /// one): when traces are recorded, or to pass the caller's on to tasks.
    pub(super) fn trace_of(
        &self,
        id: RunId,
        key: &JobKey,
        caller: Option<&TraceParent>,
    ) -> Option<RunTrace> {
        match &self.config.tracing {
            Some(t) => Some(RunTrace::of_run(id, &key.0, &key.1, caller, &t.sampler)),
            None if caller.is_some() => {
                let passing =
                    crate::trace::Sampler::ParentBased(Box::new(crate::trace::Sampler::AlwaysOff));
                Some(RunTrace::of_run(id, &key.0, &key.1, caller, &passing))
            }
            None => None,
        }
    }

    /// Records a fire of `key` at `at` in the ledger, with the run it made.
    pub(super) fn record_fire(
        &mut self,
        key: &JobKey,
        at: Timestamp,
        outcome: FireOutcome,
        run: Option<NewRun>,
    ) {
        self.arm_sla(key, at, run.as_ref().map(|r| r.id));
        let now = self.clock.now();
        self.notify_fire(
            key,
            at,
            outcome,
            run.as_ref().map(|r| (r.id, r.trigger)),
            now,
        );
        self.record_fire_of(key, at, outcome, None, run);
    }

    /// Records a fire of `key` at `at` suppressed by the job's exclusion
    /// calendar `calendar`: no run.
    pub(super) fn record_suppressed(&mut self, key: &JobKey, at: Timestamp, calendar: &str) {
        tracing::info!(
            job = %format!("{}/{}", key.0, key.1),
            calendar,
            "fire of {at} suppressed by a calendar"
        );
        self.record_fire_of(
            key,
            at,
            FireOutcome::Suppressed,
            Some(calendar.to_string()),
            None,
        );
    }

    fn record_fire_of(
        &mut self,
        key: &JobKey,
        at: Timestamp,
        outcome: FireOutcome,
        calendar: Option<String>,
        run: Option<NewRun>,
    ) {
        if let Some(m) = &self.config.metrics {
            // Lateness of the fires made on time, not of those caught up,
            // counted from the instant a jittered fire was due.
            let due = self
                .jobs
                .table
                .get(key)
                .map_or(at, |e| fires::jittered(&e.timing, at));
            let lateness = run
                .as_ref()
                .filter(|r| outcome == FireOutcome::Fired && r.trigger == Trigger::Schedule)
                .map(|r| r.created_at.duration_since(due).as_secs_f64());
            if let Some(series) = self.jobs.table.get(key).and_then(|e| e.series.as_deref()) {
                m.fire(series, outcome, lateness);
            } else if let Some((key, _)) = self.jobs.table.get_key_value(key) {
                // The job's first fire or arming here takes its series.
                let series = Box::new(m.job(key));
                m.fire(&series, outcome, lateness);
                let key = key.clone();
                self.jobs.table.get_mut(&*key).expect("job").series = Some(series);
            }
        }
        self.batch.writes.push(Write::Fire {
            namespace: key.0.clone(),
            job: key.1.clone(),
            scheduled_at: at,
            outcome,
            calendar,
            run,
        });
    }

    /// A new run of `job` (at the version the job is at, or a re-run's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_run(
        &mut self,
        key: &JobKey,
        job: &Arc<Job>,
        trigger: Trigger,
        at: Timestamp,
        params: std::collections::BTreeMap<String, String>,
        decision: FireDecision,
        now: Timestamp,
        caller: Option<TraceParent>,
        rerun: Option<Rerun>,
    ) -> NewRun {
        let id = self.run_id();
        let (key, entry) = self.jobs.table.get_key_value(key).expect("job");
        let key = key.clone();
        let version = rerun.as_ref().map_or(entry.version, |r| r.version);
        let trace = self.trace_of(id, &key, caller.as_ref());
        let state = if matches!(decision, FireDecision::Queue | FireDecision::Replace) {
            RunState::Pending
        } else {
            RunState::Running
        };
        let (starts, instance_of, items, outputs) = match rerun.as_ref() {
            Some(r) => (
                r.starts.clone(),
                r.instances.iter().map(|(task, _)| *task).collect(),
                r.instances.iter().map(|(_, item)| item.clone()).collect(),
                r.outputs.clone(),
            ),
            None => (
                vec![TaskState::Pending; job.tasks.len()],
                vec![],
                vec![],
                vec![None; job.tasks.len()],
            ),
        };
        let slots = starts.len();
        let entry = RunEntry {
            key: key.clone(),
            job: job.clone(),
            scheduled_at: at,
            trigger,
            params: params.clone(),
            outputs,
            machine: RunMachine::carrying(state, starts.clone(), instance_of),
            tokens: vec![None; slots],
            start_at: None,
            caught_up: trigger == Trigger::Catchup,
            created_at: now,
            times: vec![TaskTimes::default(); slots],
            trace,
            trigger_key: None,
            items,
        };
        let ids: Vec<String> = (0..slots).map(|slot| entry.task_id(slot)).collect();
        let new = NewRun {
            id,
            namespace: key.0.clone(),
            job: key.1.clone(),
            job_version: version,
            trigger,
            scheduled_at: at,
            params,
            state,
            created_at: now,
            trace: caller.map(|c| c.stored()),
            rerun_of: rerun.as_ref().map(|r| r.of),
            carried_outputs: ids
                .iter()
                .zip(&entry.outputs)
                .filter_map(|(t, o)| Some((t.clone(), (**o.as_ref()?).clone())))
                .collect(),
            carried: ids
                .iter()
                .zip(&starts)
                .filter(|(_, s)| **s != TaskState::Pending)
                .map(|(t, s)| (t.clone(), *s))
                .collect(),
            items: (job.tasks.len()..slots)
                .map(|slot| {
                    (
                        ids[slot].clone(),
                        entry.items[slot - job.tasks.len()].to_string(),
                    )
                })
                .collect(),
            tasks: ids,
            key: None,
        };
        self.runs.table.insert(id, entry);
        new
    }
}

/// What makes a new run a re-run.
pub(super) struct Rerun {
    /// The version of the job it runs (the run re-run's).
    pub(super) version: i64,
    /// The run re-run.
    pub(super) of: RunId,
    /// The state each slot starts in (see [`dagcron_core::rerun::start_states`]).
    pub(super) starts: Vec<TaskState>,
    /// The instances it keeps of the mapped tasks it runs again, by slot
    /// past the job's tasks: their task and item.
    pub(super) instances: Vec<(usize, Arc<str>)>,
    /// The outputs of the slots it carries over.
    pub(super) outputs: Vec<Option<Arc<dagcron_core::outputs::Outputs>>>,
}

impl<S: Store> Engine<S> {
    pub(super) fn after_new_run(
        &mut self,
        key: &JobKey,
        id: RunId,
        decision: FireDecision,
        now: Timestamp,
    ) {
        match decision {
            FireDecision::Replace => {
                // The new run waits until the runs it replaces have ended
                // (their attempts killed and recorded), then starts.
                let entry = &self.jobs.table[key];
                let replaced: Vec<RunId> =
                    entry.queued.iter().chain(&entry.active).copied().collect();
                for run in replaced {
                    self.stop(run, RunState::Cancelled, now);
                }
                self.jobs
                    .table
                    .get_mut(key)
                    .expect("job")
                    .queued
                    .push_back(id);
                self.start_queued(key, now);
            }
            FireDecision::Queue => {
                self.jobs
                    .table
                    .get_mut(key)
                    .expect("job")
                    .queued
                    .push_back(id);
            }
            FireDecision::Start | FireDecision::Skip | FireDecision::Backlog => self.begin(id, now),
        }
    }

    /// A run enters `running`: it counts against its job's limit, arms its
    /// deadline and plans its first tasks.
    pub(super) fn begin(&mut self, id: RunId, now: Timestamp) {
        let Some(run) = self.runs.table.get(&id) else {
            return;
        };
        let key = run.key.clone();
        self.jobs
            .table
            .get_mut(&*key)
            .expect("job")
            .active
            .insert(id);
        if run.caught_up && self.config.catch_up_pace.is_some() {
            // Its place is taken now; it begins in its turn.
            self.runs.pace.waiting.push_back(id);
            self.paced(now);
            return;
        }
        self.step(id, Event::Begin, now, None);
    }

    /// Begins the waiting catch-up runs the allowances let begin now,
    /// oldest first, and looks again a little later while some wait.
    pub(super) fn paced(&mut self, now: Timestamp) {
        let Some(pace) = self.config.catch_up_pace else {
            return;
        };
        let mut begin = vec![];
        let mut left = VecDeque::new();
        let server = self
            .runs
            .pace
            .server
            .get_or_insert_with(|| policy::FireBucket::full(pace.per_server, now));
        while let Some(id) = self.runs.pace.waiting.pop_front() {
            let Some(run) = self.runs.table.get(&id) else {
                continue;
            };
            if !server.ready(pace.per_server, now) {
                left.push_back(id);
                left.extend(self.runs.pace.waiting.drain(..));
                break;
            }
            let job = self
                .runs
                .pace
                .jobs
                .entry(run.key.clone())
                .or_insert_with(|| policy::FireBucket::full(pace.per_job, now));
            if job.take(pace.per_job, now) {
                server.take(pace.per_server, now);
                begin.push(id);
            } else {
                left.push_back(id);
            }
        }
        self.runs.pace.waiting = left;
        if self.runs.pace.waiting.is_empty() && self.runs.pace.jobs.len() > 10_000 {
            // Jobs come and go: a map this large starts over.
            self.runs.pace.jobs.clear();
        }
        if !self.runs.pace.waiting.is_empty() && !self.runs.pace.armed {
            self.runs.pace.armed = true;
            self.arm(now.checked_add(PACE_TICK).unwrap_or(now), Timer::Paced);
        }
        for id in begin {
            self.step(id, Event::Begin, now, None);
        }
    }

    /// Stops a run, to end in `final_state` once its attempts have ended.
    pub(super) fn stop(&mut self, id: RunId, final_state: RunState, now: Timestamp) {
        self.step(id, Event::Stop { final_state }, now, None);
    }

    pub(super) fn start_queued(&mut self, key: &JobKey, now: Timestamp) {
        loop {
            let Some(&next) = self.jobs.table.get(key).and_then(|e| e.queued.front()) else {
                return;
            };
            // The limit of the job's version the run was made with.
            if !job::may_start(
                self.runs.table[&next].job.spec.max_active(),
                self.job_runs(key),
            ) {
                return;
            }
            self.jobs
                .table
                .get_mut(key)
                .expect("job")
                .queued
                .pop_front();
            self.begin(next, now);
        }
    }

    /// Steps run `id` on `event` (see [`RunMachine::step`]) and carries out
    /// what it returns; `outcome` is the result of the attempt that ended,
    /// for its record.
    pub(super) fn step(
        &mut self,
        id: RunId,
        event: Event,
        now: Timestamp,
        mut outcome: Option<Outcome>,
    ) {
        let Some(run) = self.runs.table.get_mut(&id) else {
            return;
        };
        let job = run.job.clone();
        let mut effects = Vec::new();
        let rng = &mut self.rng;
        // The outputs of the task's current attempt that succeeded (a
        // stale attempt's are not taken).
        if let Some(o) = &outcome
            && let Event::AttemptEnded {
                task,
                number,
                end: End::Succeeded,
                ..
            } = &event
            && run
                .machine
                .attempt(*task)
                .is_some_and(|a| a.number == *number)
        {
            run.outputs[*task] = (!o.outputs.is_empty()).then(|| Arc::new(o.outputs.clone()));
        }
        let data = dagcron_core::run::RunData {
            params: &run.params,
            outputs: &run.outputs,
        };
        if let Err(e) =
            run.machine
                .step_with(&job, data, event, now, &mut || rng.next(), &mut effects)
        {
            // Only a bug (or a store edited by hand) gets here.
            tracing::error!(run = id, "{e}; the run keeps the state it had");
        }
        for effect in effects {
            self.carry_out(id, &job, effect, now, &mut outcome);
        }
    }

    fn carry_out(
        &mut self,
        id: RunId,
        job: &Arc<Job>,
        effect: Effect,
        now: Timestamp,
        outcome: &mut Option<Outcome>,
    ) {
        let name = |engine: &Self, task: usize| engine.runs.table[&id].task_id(task);
        match effect {
            Effect::Run { from, to } => self.batch.writes.push(Write::RunState {
                run: id,
                from,
                to,
                at: now,
            }),
            Effect::Closing { to } => self.batch.writes.push(Write::RunClosing { run: id, to }),
            Effect::Task { task, from, to } => {
                let task_id = name(self, task);
                self.batch.writes.push(Write::TaskState {
                    run: id,
                    task: task_id.clone(),
                    from,
                    to,
                });
                if to == TaskState::Held {
                    self.notify_held(id, task, now);
                }
                let run = self.runs.table.get_mut(&id).expect("run");
                if to == TaskState::Succeeded
                    && let Some(outputs) = run.machine.gathered_outputs(task).cloned()
                {
                    // A mapped task hands its instances' outputs downstream.
                    self.batch.writes.push(Write::Gathered {
                        run: id,
                        task: task_id,
                        note: None,
                        outputs: (*outputs).clone(),
                    });
                    run.outputs[task] = (!outputs.is_empty()).then_some(outputs);
                }
            }
            Effect::Expand { task, items } => {
                let run = self.runs.table.get_mut(&id).expect("run");
                run.items
                    .extend(items.iter().map(|i| Arc::from(i.as_str())));
                run.grow();
                let key = &run.key;
                tracing::info!(namespace = %key.0, job = %key.1, run = id, task = %job.tasks[task].id, "expanded into {} instances", items.len());
                self.batch.writes.push(Write::Expand {
                    run: id,
                    task: job.tasks[task].id.clone(),
                    items,
                });
            }
            Effect::Note { task, note } => {
                let key = &self.runs.table[&id].key;
                tracing::info!(namespace = %key.0, job = %key.1, run = id, task = %job.tasks[task].id, "{note}");
                self.batch.writes.push(Write::Gathered {
                    run: id,
                    task: job.tasks[task].id.clone(),
                    note: Some(note),
                    outputs: Default::default(),
                });
            }
            Effect::AttemptStarted {
                task,
                number,
                state,
            } => self.attempt_started(id, job, task, number, state, now),
            Effect::AttemptEnded {
                task,
                number,
                from,
                to,
            } => {
                let o = outcome
                    .take()
                    .unwrap_or_else(|| failed("the attempt ended without a report".into()));
                let run = &self.runs.table[&id];
                let task_id = run.task_id(task);
                let executor = run.spec(task).executor.kind();
                let (namespace, job_name) = (&run.key.0, &run.key.1);
                if to == AttemptState::Succeeded {
                    tracing::debug!(%namespace, job = %job_name, run = id, task = %task_id, attempt = number, "attempt succeeded");
                } else {
                    let why = o.error.as_deref().unwrap_or("");
                    tracing::warn!(%namespace, job = %job_name, run = id, task = %task_id, attempt = number, "attempt {}: {why}", to.as_str());
                }
                if let Some(m) = &self.config.metrics {
                    m.attempt_ended(&run.key, executor, to);
                }
                let run = self.runs.table.get_mut(&id).expect("run");
                let times = std::mem::take(&mut run.times[task]);
                run.times[task].ready = times.ready;
                run.times[task].ended = Some(number);
                if let (Some(tracing), Some(trace)) = (&self.config.tracing, &run.trace) {
                    let ended = crate::trace::AttemptEnded {
                        trace: trace.clone(),
                        key: run.key.clone(),
                        run: id,
                        scheduled_at: run.scheduled_at,
                        task: task_id.clone(),
                        executor,
                        number,
                        ready: times.ready,
                        start: times.started.unwrap_or(now),
                        end: now,
                        state: to,
                        error: o.error.clone(),
                        agent: times.agent,
                    };
                    spans::attempt(tracing, ended);
                }
                self.batch.writes.push(Write::AttemptEnd {
                    run: id,
                    task: task_id,
                    number,
                    from,
                    to,
                    at: now,
                    exit_code: o.exit_code,
                    error: o.error,
                    log: o.log,
                    lines: dagcron_core::log::encode(&o.lines),
                    start_error_us: o.start_error_us,
                    outputs: o.outputs,
                    for_other_node: false,
                });
            }
            Effect::Withdraw { task, number } => {
                // The node running it sees that and stops it.
                self.cluster.shared.remove(&(id, task));
                let task = name(self, task);
                self.batch.writes.push(Write::AttemptWithdraw {
                    run: id,
                    task,
                    number,
                    at: now,
                });
            }
            Effect::Kill { task } => {
                if let Some(token) = &self.runs.table[&id].tokens[task] {
                    self.batch.effects.push(Action::Kill(token.clone()));
                }
            }
            Effect::Ready { task } => {
                let run = self.runs.table.get_mut(&id).expect("run");
                run.times[task].ready = Some(now);
                let spec = run.machine.task_of(task);
                self.dispatch
                    .ready
                    .push(job, spec, id, task, now.as_microsecond());
            }
            Effect::ArmRetry { task, at } => {
                let key = &self.runs.table[&id].key;
                tracing::info!(namespace = %key.0, job = %key.1, run = id, task = %name(self, task), "retrying at {at}");
                if let Some(m) = &self.config.metrics {
                    m.retry(key);
                }
                self.arm(at, Timer::Retry { run: id, task });
            }
            Effect::ArmDeadline { at } => self.arm(at, Timer::Deadline { run: id }),
            Effect::Finished { state } => {
                let run = &self.runs.table[&id];
                let took = now.duration_since(run.created_at).as_secs_f64();
                let (namespace, job_name) = (&run.key.0, &run.key.1);
                if state == RunState::Succeeded {
                    tracing::debug!(%namespace, job = %job_name, run = id, "run succeeded in {took:.3}s");
                } else {
                    tracing::info!(%namespace, job = %job_name, run = id, "run {} after {took:.3}s", state.as_str());
                }
                if let Some(m) = &self.config.metrics {
                    let seconds = took;
                    m.run_finished(&run.key, state, seconds, now);
                }
                if let (Some(tracing), Some(trace)) = (&self.config.tracing, &run.trace) {
                    spans::run(tracing, trace, run, id, state, now);
                }
                self.notify_run_end(id, state, now);
                if state == RunState::Failed {
                    self.trip_breaker(id, now);
                }
                self.start_downstream(id, state, now);
                self.finished(id, now);
            }
        }
    }

    /// Run `id` was never stored (its fire was refused): it is dropped
    /// from memory, with anything it holds, as if it had never been made.
    pub(super) fn forget_run(&mut self, id: RunId, now: Timestamp) {
        let Some(run) = self.runs.table.get(&id) else {
            return;
        };
        for token in run.tokens.iter().flatten() {
            token.cancel();
        }
        self.cluster.shared.retain(|(run, _), _| *run != id);
        self.finished(id, now);
    }

    /// Run `id` is over: it leaves its job's slots (a queued run may start).
    fn finished(&mut self, id: RunId, now: Timestamp) {
        let Some(run) = self.runs.table.remove(&id) else {
            return;
        };
        if let Some(key) = run.trigger_key {
            self.runs.keys.remove(&((*run.key).clone(), key));
        }
        let key = run.key;
        if let Some(entry) = self.jobs.table.get_mut(&*key) {
            entry.planned.remove(&id);
            if entry.active.remove(&id) {
                self.start_queued(&key, now);
            } else {
                entry.queued.retain(|r| *r != id);
            }
        }
        self.let_go_if_idle(&key, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_grow_and_follow_the_clock_even_when_it_steps_back() {
        let mut runs = Runs::after(0);
        assert_eq!(runs.next_id(1_000, None), 1_000);
        assert_eq!(runs.next_id(1_000, None), 1_001);
        assert_eq!(runs.next_id(500, None), 1_002, "a clock stepped back");
        assert_eq!(runs.next_id(5_000, None), 5_000);
        let mut restarted = Runs::after(9_000);
        assert_eq!(
            restarted.next_id(5_000, None),
            9_001,
            "after the stored ids"
        );
    }

    /// Nodes make ids at once, from the same stored maximum: theirs
    /// never meet, and each keeps its slot in the low bits.
    #[test]
    fn two_nodes_never_make_the_same_id() {
        let mut ids = HashSet::new();
        for slot in [0u8, 1, 31] {
            let mut runs = Runs::after(12_345);
            let mut last = 0;
            for now in [0, 7, 7, 3, 1 << 20, 1 << 20] {
                let id = runs.next_id(now, Some(slot));
                assert!(id > last, "ids grow");
                assert_eq!(id & ((1 << SLOT_BITS) - 1), RunId::from(slot));
                assert!(ids.insert(id), "id {id} made twice");
                last = id;
            }
        }
    }
}
