//! The job table: installing, pausing and removing jobs, a cluster node's
//! share of them and the changes made through other nodes, and which jobs
//! keep their whole definition in memory.

use super::*;
use dagcron_core::after::AfterTrigger;
use dagcron_core::message::NatsTrigger;
use std::collections::BTreeMap;

/// The engine's jobs part: every job known here, and what is decided per
/// job or namespace beside it.
#[derive(Default)]
pub(super) struct Jobs {
    /// Boxed: a map's table is sized in powers of two, so empty slots
    /// cost a pointer rather than a whole entry.
    /// Hashed with foldhash (seeded per process): SipHash was a tenth of
    /// the time of reading a million jobs back at start-up.
    pub(super) table: HashMap<Arc<JobKey>, Box<JobEntry>, foldhash::fast::RandomState>,
    /// Each namespace's allowance of scheduled fires this second
    /// ([`EngineConfig::max_fires_per_namespace`]).
    pub(super) fire_quota: HashMap<String, policy::FireBucket>,
    /// Jobs being read for triggers, with the triggers waiting for each:
    /// one read per job, whatever the number of triggers.
    pub(super) loading: HashMap<JobKey, Vec<handle::WaitingTrigger>>,
    /// The jobs of an apply not yet installed: installed a slice at a
    /// time between timers, before any other command is taken.
    pub(super) installing: Option<Installing>,
    /// Compiled timetables shared by the jobs of the same schedules (also
    /// by the applies that make their jobs ready beside the loop).
    pub(super) timetables: Arc<std::sync::Mutex<dagcron_core::timings::TimetableCache>>,
    /// For each job, the jobs that start after its runs end (`after`).
    pub(super) downstream: HashMap<JobKey, BTreeSet<JobKey>>,
    /// The jobs started by messages, for whoever consumes them.
    pub(super) nats: NatsWatch,
}

/// The jobs started by messages, by job, as a value to watch.
pub(crate) type NatsTriggers = Arc<BTreeMap<JobKey, NatsTrigger>>;

/// The sending side of [`NatsTriggers`].
pub(super) struct NatsWatch(pub(super) tokio::sync::watch::Sender<NatsTriggers>);

impl Default for NatsWatch {
    fn default() -> NatsWatch {
        NatsWatch(tokio::sync::watch::Sender::new(Arc::default()))
    }
}

impl Jobs {
    /// Sets the `after` trigger and the rules about fires of job `key` (in
    /// the table), keeping the index of downstream jobs.
    pub(super) fn set_events(
        &mut self,
        key: &JobKey,
        after: Option<AfterTrigger>,
        fire_rules: Vec<dagcron_core::notify::NotifyRule>,
        nats: Option<NatsTrigger>,
    ) {
        let Some(entry) = self.table.get_mut(key) else {
            return;
        };
        let old = entry.events.take();
        let old_nats = old.as_ref().and_then(|e| e.nats.clone());
        if old_nats != nats {
            self.nats.0.send_modify(|map| {
                let map = Arc::make_mut(map);
                match &nats {
                    Some(t) => map.insert(key.clone(), t.clone()),
                    None => map.remove(key),
                };
            });
        }
        if let Some(old) = old.and_then(|e| e.after) {
            let upstream = (key.0.clone(), old.job);
            if let Some(set) = self.downstream.get_mut(&upstream) {
                set.remove(key);
                if set.is_empty() {
                    self.downstream.remove(&upstream);
                }
            }
        }
        if let Some(after) = &after {
            self.downstream
                .entry((key.0.clone(), after.job.clone()))
                .or_default()
                .insert(key.clone());
        }
        if after.is_some() || !fire_rules.is_empty() || nats.is_some() {
            entry.events = Some(Box::new(JobEvents {
                after,
                fire_rules,
                nats,
            }));
        }
    }

    /// A cycle of `after` triggers that `jobs` (about to be applied) would
    /// close with the jobs here, as its path.
    pub(super) fn after_cycle(&self, jobs: &[Job]) -> Option<(String, Vec<String>)> {
        let mut by_namespace: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
        for job in jobs {
            by_namespace.entry(&job.namespace).or_default().push(job);
        }
        for (namespace, applied) in by_namespace {
            let mut edges: BTreeMap<String, String> = self
                .table
                .iter()
                .filter(|(k, _)| k.0 == namespace)
                .filter_map(|(k, e)| Some((k.1.clone(), e.after()?.job.clone())))
                .collect();
            let mut through = BTreeSet::new();
            for job in applied {
                edges.remove(&job.spec.name);
                if let Some(after) = &job.spec.after {
                    edges.insert(job.spec.name.clone(), after.job.clone());
                }
                through.insert(job.spec.name.clone());
            }
            if let Some(path) = dagcron_core::after::cycle(&edges, &through) {
                return Some((namespace.to_string(), path));
            }
        }
        None
    }

    /// Whether `namespace` may make one more scheduled fire at `at`, at
    /// most `rate` a second (its allowance is taken if so). Counted by the
    /// instants fired: a second's fires handled late still count against
    /// that second.
    pub(super) fn take_fire(&mut self, namespace: &str, rate: u32, at: Timestamp) -> bool {
        if let Some(bucket) = self.fire_quota.get_mut(namespace) {
            return bucket.take(rate, at);
        }
        let mut bucket = policy::FireBucket::full(rate, at);
        let taken = bucket.take(rate, at);
        self.fire_quota.insert(namespace.to_string(), bucket);
        taken
    }
}

impl<S: Store> Engine<S> {
    /// Whether this node arms the fires of `key`.
    pub(super) fn owns(&self, key: &JobKey) -> bool {
        match (&self.config.node, &self.cluster.ownership) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(owns)) => owns(&key.0, &key.1),
        }
    }

    /// Installs a new or changed spec, stored at `version`, and arms it
    /// (unless it is paused: a new job takes `paused`, a known one keeps
    /// its state).
    pub(super) fn install_job(
        &mut self,
        job: Job,
        version: i64,
        applied_at: Timestamp,
        now: Timestamp,
        paused: bool,
    ) {
        let ready = Installable::of(job, &mut timetables(&self.jobs.timetables));
        self.install(ready, version, applied_at, now, paused);
    }

    /// Installs the next jobs of an apply (see [`Installing`]): at most
    /// [`INSTALL_SLICE`] of them.
    pub(super) fn install_some(&mut self, now: Timestamp) {
        let Some(mut apply) = self.jobs.installing.take() else {
            return;
        };
        for (ready, result) in apply.jobs.by_ref().take(INSTALL_SLICE) {
            let (ApplyResult::Created(v) | ApplyResult::Updated(v)) = result else {
                continue;
            };
            let key = ready.key.clone();
            let before = self.jobs.table.get(&*key);
            if before.is_some_and(|e| e.version >= v) {
                // A later apply of the same job came back first.
                continue;
            }
            // The store applied the same rule to its row.
            let before = before.map(|e| (e.paused, e.file_paused));
            let paused = policy::paused_after_apply(before, ready.job.spec.paused);
            // A known job keeps its state here; a change of it follows, as
            // through the API (a resume catches up).
            self.install(ready, v, apply.at, now, paused);
            match before {
                Some((true, _)) if !paused => apply.resumed.push((*key).clone()),
                Some((false, _)) if paused => {
                    self.pause_in_memory(&key, true);
                }
                _ => {}
            }
        }
        if apply.jobs.len() > 0 {
            self.jobs.installing = Some(apply);
            return;
        }
        for key in apply.resumed {
            self.set_job_paused(&key, false, now);
        }
    }

    /// [`Engine::install_job`] of a job made ready.
    pub(super) fn install(
        &mut self,
        ready: Installable,
        version: i64,
        applied_at: Timestamp,
        now: Timestamp,
        paused: bool,
    ) {
        let Installable { key, timing, job } = ready;
        let owned = self.owns(&key);
        let file_paused = job.spec.paused;
        let entry = match self.jobs.table.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let entry = e.into_mut();
                entry.timing = timing;
                entry
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(JobEntry::new(timing, version, paused, owned, applied_at))
            }
        };
        entry.file_paused = file_paused;
        let after = job.spec.after.clone();
        let fire_rules = dagcron_core::notify::fire_rules(&job.spec.notify);
        let nats = job.spec.nats.clone();
        entry.job = Some(job);
        entry.version = version;
        entry.generation += 1;
        entry.owned = owned;
        entry.applied_at = applied_at;
        let from = entry.last_fire.map_or(now, |l| l.max(now));
        self.jobs.set_events(&key, after, fire_rules, nats);
        // The table keeps the key it had (an `Arc` equal to this one).
        self.arm_next_fire(&key, from);
    }

    /// Forgets a deleted job and cancels its runs.
    pub(super) fn remove_job(&mut self, key: &JobKey, now: Timestamp) {
        self.jobs.set_events(key, None, vec![], None);
        if let Some((key, entry)) = self.jobs.table.remove_entry(key) {
            if let Some(m) = &self.config.metrics {
                m.forget(&key);
            }
            for run in entry
                .queued
                .iter()
                .chain(&entry.active)
                .chain(&entry.planned)
                .copied()
                .collect::<Vec<_>>()
            {
                self.stop(run, RunState::Cancelled, now);
            }
        }
    }

    /// Sets a job's paused state in memory; returns what it was. Its armed
    /// timers no longer stand if it changes.
    pub(super) fn pause_in_memory(&mut self, key: &JobKey, paused: bool) -> Option<bool> {
        let entry = self.jobs.table.get_mut(key)?;
        let was = entry.paused;
        if was == paused {
            // A resume of a job that runs (or a second pause) keeps its
            // timers: bumping the generation would disarm them for good.
            return Some(was);
        }
        entry.paused = paused;
        entry.generation += 1;
        if paused {
            entry.job = None;
            if let (Some(m), Some(series)) = (&self.config.metrics, entry.series.as_deref_mut()) {
                m.next_fire(series, None, None);
            }
        }
        Some(was)
    }

    /// Pauses or resumes a job in memory (the store has it already).
    pub(super) fn set_job_paused(&mut self, key: &JobKey, paused: bool, now: Timestamp) {
        let Some(was) = self.pause_in_memory(key, paused) else {
            return;
        };
        let entry = &self.jobs.table[key];
        if was && !paused && entry.owned {
            // Fires that came due while paused follow the misfire policy:
            // from the last fire, or (a job that never fired) from when it
            // was applied, since none was due between then and the pause.
            let since = entry.last_fire.unwrap_or(entry.applied_at);
            self.catch_up_beside(key, since, now, Duration::ZERO);
        }
    }

    /// A new share of the jobs: stop arming the jobs lost, and resume the
    /// jobs gained from their last fire in the ledger.
    pub(super) fn set_ownership(&mut self, owns: Ownership, reply: Reply<usize>) {
        let mut gained = Vec::new();
        let mut owned = 0;
        for (key, entry) in &mut self.jobs.table {
            let now_owned = owns(&key.0, &key.1);
            owned += usize::from(now_owned);
            if now_owned != entry.owned {
                entry.owned = now_owned;
                entry.generation += 1;
                if !now_owned {
                    // A job started by another's runs stays whole in
                    // memory on every node: any node may end such a run.
                    if entry.after().is_none() {
                        entry.job = None;
                    }
                    if let (Some(m), Some(series)) =
                        (&self.config.metrics, entry.series.as_deref_mut())
                    {
                        m.next_fire(series, None, None);
                    }
                } else if !entry.paused {
                    gained.push(((**key).clone(), entry.generation));
                }
            }
        }
        self.cluster.ownership = Some(owns);
        if gained.is_empty() {
            self.reply_after_commit(reply, Ok(owned));
            return;
        }
        // Where each job gained resumes: its last fire, read beside the loop.
        let store = self.store.clone();
        let keys: Vec<JobKey> = gained.iter().map(|(k, _)| k.clone()).collect();
        self.beside(
            async move { store.last_fires_of(&keys).await },
            move |last| Completion::Owned {
                gained,
                last,
                owned,
                reply,
            },
        );
    }

    /// The last fires of the jobs gained came back (see [`Engine::set_ownership`]).
    pub(super) fn owned(
        &mut self,
        gained: Vec<(JobKey, u64)>,
        last: Result<Vec<Option<Timestamp>>, StorageError>,
        owned: usize,
        reply: Reply<usize>,
        now: Timestamp,
    ) {
        let last = match last {
            Ok(last) => last,
            Err(e) => {
                // Not owned after all: the next ring gains them again.
                for (key, generation) in &gained {
                    if let Some(entry) = self.jobs.table.get_mut(key) {
                        if entry.generation == *generation {
                            entry.owned = false;
                            entry.generation += 1;
                        }
                    }
                }
                let _ = reply.send(Err(EngineError::Storage(e)));
                return;
            }
        };
        for ((key, generation), last) in gained.into_iter().zip(last) {
            if !self.current(&key, generation) {
                continue;
            }
            let entry = self.jobs.table.get_mut(&key).expect("current");
            entry.last_fire = last;
            let since = last.unwrap_or(entry.applied_at);
            self.catch_up_beside(&key, since, now, self.config.misfire_grace);
        }
        self.reply_after_commit(reply, Ok(owned));
    }

    /// Takes in jobs changed and deleted through other nodes (a change
    /// already known is ignored); returns how many jobs this node owns.
    pub(super) fn sync_jobs(
        &mut self,
        changed: Vec<StoredJob>,
        deleted: Vec<(String, String)>,
        now: Timestamp,
    ) -> usize {
        for key in deleted {
            self.remove_job(&key, now);
        }
        for s in changed {
            let key = (s.namespace.clone(), s.name.clone());
            let (version, paused) = match self.jobs.table.get(&key) {
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
                self.set_job_paused(&key, s.paused, now);
            }
            if let Some(entry) = self.jobs.table.get_mut(&key) {
                entry.breaker_open = s.breaker.is_some();
            }
        }
        self.jobs.table.values().filter(|e| e.owned).count()
    }

    /// Arms the next fire of `key` after `after`: directly if the job is in
    /// memory and the fire is near, otherwise a [`Timer::Prepare`] ahead of it
    /// (and the whole job is let go until then).
    pub(super) fn arm_next_fire(&mut self, key: &JobKey, after: Timestamp) {
        if let Some(key) = self.jobs.table.get_key_value(key).map(|(k, _)| k.clone()) {
            self.arm_next_fire_of(key, after);
        }
    }

    /// [`Engine::arm_next_fire`] of a job known to be in the table, `key`
    /// the table's own.
    pub(super) fn arm_next_fire_of(&mut self, key: Arc<JobKey>, after: Timestamp) {
        let now = self.clock.now();
        let entry = self.jobs.table.get_mut(&*key).expect("job");
        let plan = if entry.paused || !entry.owned {
            Arming::Nothing
        } else {
            fires::arm_next(&entry.timing, after, now, entry.job.is_some())
        };
        let generation = entry.generation;
        if let Some(m) = &self.config.metrics {
            let next = match plan {
                Arming::Nothing => None,
                Arming::Fire { at, .. } | Arming::Prepare { at, .. } => Some(at),
            };
            let period = next
                .zip(entry.last_fire)
                .filter(|(next, last)| last < next)
                .map(|(next, last)| next.duration_since(last).as_secs_f64());
            // A job without a next fire takes no place for its series.
            if next.is_some() || entry.series.is_some() {
                let series = entry.series.get_or_insert_with(|| Box::new(m.job(&key)));
                m.next_fire(series, next, period);
            }
        }
        // A job started by another's runs stays whole in memory.
        let keep = entry.after().is_some();
        match plan {
            Arming::Nothing if keep => {}
            Arming::Nothing => entry.job = None,
            Arming::Fire { at, handle_at } => self.arm(
                handle_at,
                Timer::Fire {
                    key,
                    generation,
                    at,
                },
            ),
            Arming::Prepare { at, read_at } => {
                if !keep {
                    entry.job = None;
                }
                self.arm(
                    read_at,
                    Timer::Prepare {
                        key,
                        generation,
                        at,
                    },
                );
            }
        }
    }

    /// The whole job of `key`: from memory if a fire is near, otherwise
    /// from the store (`None` if it is gone or no longer validates).
    ///
    /// The future does not borrow the engine (which is not `Sync`).
    pub(super) fn job_of(
        &self,
        key: &JobKey,
    ) -> impl Future<Output = Result<Option<Arc<Job>>, StorageError>> + Send + 'static {
        let cached = self.jobs.table.get(key).and_then(|e| e.job.clone());
        let store = self.store.clone();
        let key = key.clone();
        async move {
            match cached {
                Some(job) => Ok(Some(job)),
                None => read_job(&*store, &key).await,
            }
        }
    }

    /// Job `key` as a run of `version` runs it: the job itself while it
    /// is at that version, otherwise that version as stored (a run made
    /// before a change, a re-run of an older version).
    pub(super) fn job_at(
        &self,
        key: &JobKey,
        version: i64,
    ) -> impl Future<Output = Result<Option<Arc<Job>>, StorageError>> + Send + 'static {
        let current = self
            .jobs
            .table
            .get(key)
            .is_some_and(|e| e.version == version);
        let now = current.then(|| self.job_of(key));
        let store = self.store.clone();
        let key = key.clone();
        async move {
            match now {
                Some(read) => read.await,
                // A version no longer stored: the job as it is now.
                None => match read_version(&*store, &key, version).await? {
                    Some(job) => Ok(Some(job)),
                    None => read_job(&*store, &key).await,
                },
            }
        }
    }

    /// Drops the whole job of `key` from memory once it has no run and no
    /// fire near (a job triggered by hand stays while its runs go on).
    pub(super) fn let_go_if_idle(&mut self, key: &JobKey, now: Timestamp) {
        let Some(entry) = self.jobs.table.get_mut(key) else {
            return;
        };
        if entry.job.is_none()
            || entry.after().is_some()
            || !entry.active.is_empty()
            || !entry.queued.is_empty()
            || !entry.planned.is_empty()
        {
            return;
        }
        if !fires::keep_idle_job(&entry.timing, now, !entry.paused && entry.owned) {
            entry.job = None;
        }
    }
}

/// Job `key` as it was at `version` (what a run of that version runs),
/// from the store (`None` if the version is not stored or no longer
/// validates).
pub(super) async fn read_version<S: Store>(
    store: &S,
    key: &JobKey,
    version: i64,
) -> Result<Option<Arc<Job>>, StorageError> {
    let Some(stored) = store.get_job_version(&key.0, &key.1, version).await? else {
        return Ok(None);
    };
    match Job::from_canonical(&key.0, &stored.spec) {
        Ok(job) => Ok(Some(Arc::new(job))),
        Err(e) => {
            tracing::error!(namespace = %key.0, job = %key.1, version, "stored version no longer validates: {e}");
            Ok(None)
        }
    }
}

/// The whole job of `key` from the store (`None` if it is gone or no
/// longer validates).
pub(super) async fn read_job<S: Store>(
    store: &S,
    key: &JobKey,
) -> Result<Option<Arc<Job>>, StorageError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each namespace has its own allowance of fires a second.
    #[test]
    fn each_namespace_fires_at_most_its_rate_a_second() {
        let mut jobs = Jobs::default();
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let taken = |jobs: &mut Jobs, ns: &str, at: Timestamp| {
            (0..5).filter(|_| jobs.take_fire(ns, 3, at)).count()
        };
        assert_eq!(taken(&mut jobs, "a", t0), 3);
        assert_eq!(taken(&mut jobs, "b", t0), 3, "a's fires take none of b's");
        assert_eq!(taken(&mut jobs, "a", t0), 0);
        let next = t0 + SignedDuration::from_secs(1);
        assert_eq!(
            taken(&mut jobs, "a", next),
            3,
            "the next second's allowance"
        );
    }
}
