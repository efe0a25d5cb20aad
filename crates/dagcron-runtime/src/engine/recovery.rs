//! Recovery at start-up and when runs are adopted: missed fires by the
//! misfire policy, unfinished runs rebuilt, attempts that were running lost.

use super::*;
use dagcron_core::run::recovery::{self, FoundAttempt, FoundTask};

impl<S: Store> Engine<S> {
    pub(super) async fn recover(&mut self, now: Timestamp) -> Result<(), StorageError> {
        // A cluster node owns nothing until its first ring.
        let owned = self.config.node.is_none();
        let mut rules = RulesCheck::default();
        // Three stages at once: pages of jobs read from the store, parsed
        // into timings beside the loop (on a blocking thread), installed here.
        let (pages_tx, mut pages_rx) =
            mpsc::channel::<Result<Vec<StoredTimingRow>, StorageError>>(2);
        let store = self.store.clone();
        let reader = tokio::spawn(async move {
            let mut after = None;
            loop {
                let page = store.load_job_timings(after.as_ref(), JOB_PAGE).await;
                let last = match &page {
                    Ok(p) if p.len() == JOB_PAGE as usize => {
                        p.last().map(|j| (j.namespace.clone(), j.name.clone()))
                    }
                    _ => None,
                };
                if pages_tx.send(page).await.is_err() || last.is_none() {
                    return;
                }
                after = last;
            }
        });
        let (parsed_tx, mut parsed_rx) = mpsc::channel::<Result<Vec<LoadedJob>, StorageError>>(2);
        let mut cache = std::mem::take(&mut *timetables(&self.jobs.timetables));
        let parser = tokio::task::spawn_blocking(move || {
            while let Some(page) = pages_rx.blocking_recv() {
                let parsed = page.map(|page| {
                    page.into_iter()
                        .filter_map(|stored| LoadedJob::parse(stored, &mut cache))
                        .collect()
                });
                if parsed_tx.blocking_send(parsed).is_err() {
                    break;
                }
            }
            cache
        });
        // Where each job resumes: its last recorded fire (a cluster node
        // learns it when it comes to own the job), read while the first
        // pages are.
        // (On an error the start fails; the reader and the parser stop
        // once their channels close.)
        let mut last_fires: HashMap<JobKey, Timestamp> = if self.config.node.is_none() {
            let fires = self.store.last_fires().await?;
            fires
                .into_iter()
                .map(|(namespace, name, at)| ((namespace, name), at))
                .collect()
        } else {
            HashMap::new()
        };
        let grace = SignedDuration::try_from(self.config.misfire_grace).unwrap_or_default();
        // The jobs that missed fires: caught up once the unfinished runs are
        // rebuilt (the fires caught up count them). The others, nearly all,
        // are armed as they are installed.
        let mut missed_some = Vec::new();
        let mut started_after = Vec::new();
        let mut with_sla = Vec::new();
        let mut failed = None;
        while let Some(page) = parsed_rx.recv().await {
            let page = match page {
                Ok(page) => page,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            self.jobs.table.reserve(page.len());
            for loaded in page {
                rules.note(loaded.rules);
                let mut entry = JobEntry::new(
                    loaded.timing,
                    loaded.version,
                    loaded.paused,
                    owned,
                    loaded.updated_at,
                );
                entry.file_paused = loaded.file_paused;
                entry.breaker_open = loaded.breaker_open;
                let after = loaded.after;
                let fire_rules = loaded.fire_rules;
                let nats = loaded.nats;
                let sla = loaded.sla;
                entry.last_fire = last_fires.remove(&loaded.key);
                let key = Arc::new(loaded.key);
                let armed = !entry.paused && entry.owned;
                let resume = armed
                    .then(|| {
                        let since = entry.last_fire.unwrap_or(entry.applied_at);
                        let max = self.config.max_missed_per_job;
                        let missed = fires::missed(&entry.timing, since, now, grace, max);
                        missed.fires.is_empty().then_some(missed.resume_after)
                    })
                    .flatten();
                self.jobs.table.insert(key.clone(), entry);
                if after.is_some() {
                    started_after.push(key.clone());
                }
                self.jobs.set_events(&key, after, fire_rules, nats);
                if sla {
                    with_sla.push(key.clone());
                }
                match resume {
                    Some(after) => self.arm_next_fire_of(key, after),
                    None if armed => missed_some.push(key),
                    None => {}
                }
            }
        }
        drop(parsed_rx);
        *timetables(&self.jobs.timetables) = parser.await.unwrap_or_default();
        let _ = reader.await;
        if let Some(e) = failed {
            return Err(e);
        }
        rules.report(&*self.store).await;
        // The jobs started by other jobs' runs are kept whole, to make their
        // runs in the commits of those runs' ends.
        for key in started_after {
            let job = jobs::read_job(&*self.store, &key).await?;
            if let Some(entry) = self.jobs.table.get_mut(&*key) {
                entry.job = job;
            }
        }
        self.rearm_slas(with_sla, now).await?;
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
        for key in missed_some {
            let entry = &self.jobs.table[&key];
            let since = entry.last_fire.unwrap_or(entry.applied_at);
            self.catch_up(&key, since, now, self.config.misfire_grace)
                .await?;
        }
        self.flush().await?;
        Ok(())
    }

    /// The fires of `key` missed in `(since, now - grace]`, by the misfire policy.
    fn missed(&self, key: &JobKey, since: Timestamp, now: Timestamp, grace: Duration) -> Missed {
        let grace = SignedDuration::try_from(grace).unwrap_or(SignedDuration::ZERO);
        let max = self.config.max_missed_per_job;
        let missed = fires::missed(&self.jobs.table[key].timing, since, now, grace, max);
        if missed.truncated {
            tracing::warn!(job = %format!("{}/{}", key.0, key.1), "more than {max} missed fires; recording the first ones only");
        }
        missed
    }

    /// At start-up: records the fires of `key` missed in `(since, now -
    /// grace]` by the misfire policy, and arms the next fire.
    pub(super) async fn catch_up(
        &mut self,
        key: &JobKey,
        since: Timestamp,
        now: Timestamp,
        grace: Duration,
    ) -> Result<(), StorageError> {
        let missed = self.missed(key, since, now, grace);
        let job = if missed.runs_some() {
            self.job_of(key).await?
        } else {
            None
        };
        self.record_missed(key, missed, job);
        Ok(())
    }

    /// While the loop runs: as [`Engine::catch_up`], with the job read
    /// beside the loop when the fires caught up need it and it is not in
    /// memory (the fires are recorded when it comes back).
    pub(super) fn catch_up_beside(
        &mut self,
        key: &JobKey,
        since: Timestamp,
        now: Timestamp,
        grace: Duration,
    ) {
        let missed = self.missed(key, since, now, grace);
        let entry = &self.jobs.table[key];
        if !missed.runs_some() || entry.job.is_some() {
            let job = entry.job.clone();
            self.record_missed(key, missed, job);
            return;
        }
        let generation = entry.generation;
        let read = self.job_of(key);
        let key = key.clone();
        self.beside(read, move |job| {
            Completion::CaughtUp(Box::new(CaughtUp {
                key,
                generation,
                since,
                grace,
                missed,
                job,
            }))
        });
    }

    /// The job of missed fires came back (see [`Engine::catch_up_beside`]).
    pub(super) fn caught_up(&mut self, fires: CaughtUp) {
        let CaughtUp {
            key,
            generation,
            since,
            grace,
            missed,
            job,
        } = fires;
        if !self.current(&key, generation) {
            // Changed meanwhile: the change armed it again.
            return;
        }
        match job {
            Ok(job) => self.record_missed(&key, missed, job),
            Err(e) => {
                tracing::warn!(job = %format!("{}/{}", key.0, key.1), "cannot read the job of missed fires; trying again: {e}");
                let now = self.clock.now();
                let at = now.checked_add(SignedDuration::from_secs(1)).unwrap_or(now);
                let again = Timer::CatchUp {
                    key: Arc::new(key),
                    generation,
                    since,
                    grace,
                };
                self.arm(at, again);
            }
        }
    }

    /// Records missed fires (runs for those caught up, if the job still
    /// exists) and arms the next fire.
    fn record_missed(&mut self, key: &JobKey, missed: Missed, job: Option<Arc<Job>>) {
        let last = missed.fires.last().map(|(at, _)| *at);
        for (at, outcome) in missed.fires {
            match (outcome, &job) {
                (FireOutcome::MissedCaughtUp, Some(job)) => {
                    self.fire(key, job, at, Trigger::Catchup, FireOutcome::MissedCaughtUp)
                }
                // Deleted meanwhile (through another node).
                (FireOutcome::MissedCaughtUp, None) => {}
                (FireOutcome::Suppressed, _) => {
                    let calendar = self.jobs.table[key]
                        .timing
                        .excluded_by(at)
                        .unwrap_or_default()
                        .to_string();
                    self.record_suppressed(key, at, &calendar);
                }
                (other, _) => self.record_fire(key, at, other, None),
            }
        }
        if last.is_some() {
            self.jobs.table.get_mut(key).expect("job").last_fire = last;
        }
        self.arm_next_fire(key, missed.resume_after);
    }

    /// Rebuilds an unfinished run. Its attempts left running are lost,
    /// except, in a cluster, the ones waiting to be claimed or running on a
    /// node in `alive`: those go on.
    pub(super) async fn recover_run(
        &mut self,
        record: RunRecord,
        alive: &HashSet<i64>,
        now: Timestamp,
    ) -> Result<(), StorageError> {
        let key = (record.namespace.clone(), record.job.clone());
        let job = if self.jobs.table.contains_key(&key) {
            self.job_at(&key, record.job_version).await?
        } else {
            None
        };
        self.rebuild_run(record, job, alive, now);
        Ok(())
    }

    /// Rebuilds an unfinished run of `job` (`None`: the job is gone, and
    /// the run is cancelled); see [`Engine::recover_run`].
    pub(super) fn rebuild_run(
        &mut self,
        record: RunRecord,
        job: Option<Arc<Job>>,
        alive: &HashSet<i64>,
        now: Timestamp,
    ) {
        let key = (record.namespace.clone(), record.job.clone());
        let found = match (self.jobs.table.get_key_value(&key), job) {
            (Some((key, _)), Some(job)) => Some((key.clone(), job)),
            _ => None,
        };
        let Some((key, job)) = found else {
            tracing::warn!(
                run = record.id,
                "run of a deleted job left unfinished; cancelling it"
            );
            match recovery::orphaned_run(record.state) {
                Ok((from, to)) => self.batch.writes.push(Write::RunState {
                    run: record.id,
                    from,
                    to,
                    at: now,
                }),
                Err(e) => tracing::error!(run = record.id, "{e}"),
            }
            return;
        };
        let index: HashMap<&str, usize> = job
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.as_str(), i))
            .collect();
        // The instances of mapped tasks come after the job's tasks, in
        // the order they were stored: their slots.
        let mut instance_of = Vec::new();
        let mut items = Vec::new();
        let mut slot_of = |t: &dagcron_store::TaskRecord| {
            if let Some((task, _)) = dagcron_core::fan_out::parse_instance(&t.id) {
                let (&task, item) = (index.get(task)?, t.item.as_deref()?);
                instance_of.push(task);
                items.push(Arc::from(item));
                return Some(job.tasks.len() + instance_of.len() - 1);
            }
            index.get(t.id.as_str()).copied()
        };
        let slots: Vec<Option<usize>> = record.tasks.iter().map(&mut slot_of).collect();
        let found: Vec<FoundTask> = record
            .tasks
            .iter()
            .zip(slots)
            .map(|(t, slot)| FoundTask {
                index: slot,
                state: t.state,
                attempts: t
                    .attempts
                    .iter()
                    .map(|a| FoundAttempt {
                        number: a.number,
                        state: a.state,
                        node_epoch: a.node_epoch,
                    })
                    .collect(),
            })
            .collect();
        let started = record.scheduled_at.max(record.created_at);
        let slots = job.tasks.len() + instance_of.len();
        let mut plan =
            recovery::recover(record.state, slots, &found, |e| alive.contains(&e), started);
        let mut tokens = vec![None; slots];
        for &(i, number) in &plan.going_on {
            match self.cluster.foreign.remove(&(record.id, i)) {
                // This node already runs it for the dead owner: it is its own now.
                Some(foreign) => {
                    tokens[i] = Some(foreign.token);
                    if let Some(a) = plan.tasks[i].current.as_mut() {
                        a.shared = false;
                    }
                }
                None => {
                    self.cluster.shared.insert((record.id, i), number);
                }
            }
        }
        for &(k, number, from) in &plan.stray {
            self.batch.writes.push(Write::AttemptEnd {
                outputs: Default::default(),
                run: record.id,
                task: record.tasks[k].id.clone(),
                number,
                from,
                to: AttemptState::Lost,
                at: now,
                exit_code: None,
                error: Some(LOST_WITH_PROCESS.into()),
                log: vec![],
                lines: Vec::new(),
                start_error_us: None,
                for_other_node: false,
            });
        }
        let run = RunEntry {
            key: key.clone(),
            job: job.clone(),
            scheduled_at: record.scheduled_at,
            trigger: record.trigger,
            params: record.params,
            outputs: stored_outputs(&job, &record.tasks, slots),
            machine: RunMachine::rebuilt(record.state, record.closing, plan.tasks, instance_of),
            tokens,
            start_at: None,
            caught_up: false,
            created_at: record.created_at,
            times: vec![TaskTimes::default(); slots],
            items,
            trace: self.trace_of(
                record.id,
                &key,
                record
                    .trace
                    .as_deref()
                    .and_then(TraceParent::from_stored)
                    .as_ref(),
            ),
            // Not known again: a trigger of its key is found in the store.
            trigger_key: None,
        };
        let id = record.id;
        self.runs.table.insert(id, run);
        let entry = self.jobs.table.get_mut(&key).expect("job");
        match record.state {
            RunState::Planned => {
                // Made at its instant; one that passed while the server
                // was down comes due at once, by the misfire policy.
                entry.planned.insert(id);
                self.arm(record.scheduled_at, Timer::Planned { run: id });
                return;
            }
            RunState::Pending => entry.queued.push_back(id),
            _ => {
                entry.active.insert(id);
            }
        }
        for event in plan.events {
            let ended = matches!(event, Event::AttemptEnded { .. });
            self.step(id, event, now, ended.then(|| lost(LOST_WITH_PROCESS)));
        }
    }
}

const LOST_WITH_PROCESS: &str = "the process running this attempt stopped";

/// The jobs whose current version was applied under other rules than this
/// server's (a new cron semantics version, or new rules for one of their
/// zones in a new time zone database), and the versions stored before
/// versions recorded their rules, seen as the jobs are loaded at start.
#[derive(Default)]
struct RulesCheck {
    changed: Vec<(String, dagcron_core::RulesChange)>,
    unstamped: Vec<(String, String, i64, dagcron_core::Rules)>,
}

/// The most jobs a start-up warning names (it counts the rest).
const NAMED: usize = 50;

/// A page of jobs read at start-up holds at most this many.
const JOB_PAGE: u32 = 5_000;

/// What start-up keeps of a stored job.
struct LoadedJob {
    key: JobKey,
    timing: Timing,
    version: i64,
    paused: bool,
    file_paused: bool,
    breaker_open: bool,
    after: Option<dagcron_core::after::AfterTrigger>,
    fire_rules: Vec<dagcron_core::notify::NotifyRule>,
    nats: Option<dagcron_core::message::NatsTrigger>,
    sla: bool,
    updated_at: Timestamp,
    rules: RulesNote,
}

/// What the rules of a stored job's version say (see [`RulesCheck`]).
enum RulesNote {
    Same,
    Changed(String, dagcron_core::RulesChange),
    Unstamped(String, String, i64, dagcron_core::Rules),
}

impl LoadedJob {
    /// Its timing (only what the engine keeps of it is read, not the
    /// whole job); `None`, said in the log, if it no longer validates.
    fn parse(
        stored: StoredTimingRow,
        cache: &mut dagcron_core::timings::TimetableCache,
    ) -> Option<LoadedJob> {
        let timing = match cache.timing_from_canonical(&stored.namespace, &stored.timing) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(namespace = %stored.namespace, job = %stored.name, "stored job no longer validates, not scheduling it: {e}");
                return None;
            }
        };
        let rules = match &stored.rules {
            // The common case, without computing the job's rules.
            Some(r)
                if r.cron == dagcron_cron::SEMANTICS_VERSION
                    && r.tzdb == dagcron_cron::tzdb_version() =>
            {
                RulesNote::Same
            }
            // Rare: the rules of its timing, to compare.
            Some(r) => match r.changes(&timing.timing.rules()) {
                Some(change) => {
                    RulesNote::Changed(format!("{}/{}", stored.namespace, stored.name), change)
                }
                None => RulesNote::Same,
            },
            None => RulesNote::Unstamped(
                stored.namespace.clone(),
                stored.name.clone(),
                stored.version,
                timing.timing.rules(),
            ),
        };
        Some(LoadedJob {
            key: (stored.namespace, stored.name),
            timing: timing.timing,
            version: stored.version,
            paused: stored.paused,
            file_paused: timing.file_paused,
            breaker_open: stored.breaker.is_some(),
            after: timing.after,
            fire_rules: timing.fire_rules,
            nats: timing.nats,
            sla: timing.sla,
            updated_at: stored.updated_at,
            rules,
        })
    }
}

impl RulesCheck {
    fn note(&mut self, note: RulesNote) {
        match note {
            RulesNote::Same => {}
            RulesNote::Changed(key, change) => self.changed.push((key, change)),
            RulesNote::Unstamped(ns, name, version, rules) => {
                self.unstamped.push((ns, name, version, rules));
            }
        }
    }

    /// Says which jobs may fire at other instants than when they were
    /// applied, and records the rules of the versions that have none
    /// (those of this start: nothing tells what they were before).
    async fn report<S: Store>(self, store: &S) {
        if !self.changed.is_empty() {
            let n = self.changed.len();
            let mut named: Vec<String> = self
                .changed
                .iter()
                .take(NAMED)
                .map(|(job, change)| format!("{job} ({change})"))
                .collect();
            if n > NAMED {
                named.push(format!("and {} more", n - NAMED));
            }
            tracing::warn!(
                jobs = n,
                "{n} job(s) were applied under other scheduling rules than this server's and may fire at other instants than they did: {}; apply them again to accept the new rules (GET /api/v1/namespaces/NS/jobs/NAME shows `rules_changed`)",
                named.join(", ")
            );
        }
        for chunk in self.unstamped.chunks(1000) {
            if let Err(e) = store.stamp_rules(chunk).await {
                tracing::warn!("cannot record the rules of versions stored without them: {e}");
                return;
            }
        }
    }
}
