//! A [`Store`] in memory: everything in maps behind one lock, gone with the
//! process. It passes the conformance suite, so tests of the engine and of
//! the API need no file, and it is the reference the SQL backends' write
//! paths are checked against: each write means what [`run_row::apply`]
//! makes of it, one at a time.
//!
//! Not for production: nothing survives a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use dagcron_core::retention::{FireFacts, JobFacts, RunFacts};
use dagcron_core::{FireOutcome, RunState, TaskState};
use jiff::Timestamp;

use crate::prelude::*;
use crate::run_row::{self, Effects, Row};
use crate::{
    ApplyResult, AuditEntry, DeliveryAttempt, DeliveryEnd, FireRecord, HistoryJob, JobUpsert,
    JobVersion, NewRun, NotificationRecord, NotificationState, OpenBreaker, Origin, Page, Prune,
    Pruned, Result, RunId, RunRecord, SecretRecord, StorageError, StoredJob, TokenRecord,
    VersionRecord, Write, WriteResult,
};

/// A job and a namespace: (namespace, name).
type Key = (String, String);

/// A job's row (its spec is its current version's).
#[derive(Clone, Debug)]
struct Job {
    version: i64,
    paused: bool,
    updated_at: Timestamp,
    rules: Option<String>,
    /// Its failure breaker, while open.
    breaker: Option<OpenBreaker>,
    /// The breaker counts the runs after this one.
    breaker_from: RunId,
}

/// A version of a job.
#[derive(Clone, Debug)]
struct Version {
    spec: String,
    applied_at: Timestamp,
    origin: Origin,
    rules: Option<String>,
}

/// A row of the fire ledger.
#[derive(Clone, Debug)]
struct Fire {
    outcome: FireOutcome,
    calendar: Option<String>,
    run: Option<RunId>,
    sla_missed_at: Option<Timestamp>,
}

/// An ended attempt's output and the marks of its lines.
type StoredLog = (Vec<u8>, Vec<u8>);

/// A run: what it was made with, and its row.
#[derive(Clone, Debug)]
struct Run {
    made: NewRun,
    row: Row,
}

impl Run {
    fn record(&self) -> Result<RunRecord> {
        let m = &self.made;
        Ok(RunRecord {
            id: m.id,
            namespace: m.namespace.clone(),
            job: m.job.clone(),
            job_version: m.job_version,
            trigger: m.trigger,
            scheduled_at: m.scheduled_at,
            state: self.row.state,
            params: m.params.clone(),
            created_at: m.created_at,
            started_at: crate::rows::opt_ts(self.row.started_at)?,
            finished_at: crate::rows::opt_ts(self.row.finished_at)?,
            closing: self.row.closing,
            trace: m.trace.clone(),
            rerun_of: m.rerun_of,
            tasks: self
                .row
                .tasks
                .iter()
                .cloned()
                .map(run_row::Task::record)
                .collect::<Result<_>>()?,
        })
    }

    fn of(&self, namespace: &str, job: &str) -> bool {
        self.made.namespace == namespace && self.made.job == job
    }
}

#[derive(Debug, Default)]
struct Data {
    jobs: BTreeMap<Key, Job>,
    versions: BTreeMap<Key, BTreeMap<i64, Version>>,
    /// Deleted jobs whose history is kept, with when they went.
    deleted: BTreeMap<Key, Timestamp>,
    /// The fire ledger, by job and instant (microseconds).
    fires: BTreeMap<Key, BTreeMap<i64, Fire>>,
    runs: BTreeMap<RunId, Run>,
    /// Each ended attempt's output and the marks of its lines.
    logs: BTreeMap<(RunId, String, u32), StoredLog>,
    /// Tokens with the keyed hash of their secret.
    tokens: Vec<(TokenRecord, Vec<u8>)>,
    secrets: BTreeMap<Key, SecretRecord>,
    settings: BTreeMap<String, String>,
    audit: Vec<AuditEntry>,
    /// The outbox, by id.
    outbox: BTreeMap<i64, Outboxed>,
    /// Runs' idempotency keys: (namespace, job, key) to the run and when.
    run_keys: BTreeMap<(String, String, String), (RunId, Timestamp)>,
}

/// A notification in the outbox.
#[derive(Debug)]
struct Outboxed {
    record: NotificationRecord,
    claim: Option<(String, Timestamp)>,
    deliveries: Vec<DeliveryAttempt>,
}

/// The in-memory [`Store`].
#[derive(Debug, Default)]
pub struct MemoryStore {
    data: Mutex<Data>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn data(&self) -> MutexGuard<'_, Data> {
        // A panic while holding the lock leaves no half-applied batch
        // behind (a batch is checked before it changes anything).
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_string(), name.to_string())
}

/// The first `limit` items of `items`, and the cursor of the next page.
fn page<T>(items: impl Iterator<Item = T>, limit: u32, cursor: impl Fn(&T) -> String) -> Page<T> {
    let items: Vec<T> = items.take(limit as usize + 1).collect();
    Page::from_overfetch(items, limit, cursor)
}

impl Data {
    fn job(&self, k: &Key) -> Option<StoredJob> {
        let job = self.jobs.get(k)?;
        let spec = self.versions.get(k)?.get(&job.version)?.spec.clone();
        Some(StoredJob {
            namespace: k.0.clone(),
            name: k.1.clone(),
            version: job.version,
            spec,
            paused: job.paused,
            updated_at: job.updated_at,
            rules: crate::parse_rules(job.rules.as_deref()).ok().flatten(),
            breaker: job.breaker,
        })
    }

    fn version(&self, k: &Key, number: i64, v: &Version) -> Result<VersionRecord> {
        Ok(VersionRecord {
            namespace: k.0.clone(),
            name: k.1.clone(),
            version: number,
            applied_at: v.applied_at,
            origin: v.origin.clone(),
            rules: crate::parse_rules(v.rules.as_deref())?,
        })
    }

    fn apply_job(&mut self, j: &JobUpsert, at: Timestamp) -> ApplyResult {
        let k = key(&j.namespace, &j.name);
        let rules = j.rules_json();
        let result = match self.job(&k) {
            Some(current) => {
                let stored_rules = self.jobs[&k].rules.clone();
                if !j.changes(&current.spec, stored_rules.as_deref()) {
                    return ApplyResult::Unchanged(current.version);
                }
                let paused = j.paused_over(Some((current.paused, &current.spec)));
                let v = current.version + 1;
                let job = self.jobs.get_mut(&k).expect("current");
                job.version = v;
                job.paused = paused;
                job.updated_at = at;
                job.rules = rules.clone();
                ApplyResult::Updated(v)
            }
            None => {
                // A re-created job continues its version history.
                let last = self
                    .versions
                    .get(&k)
                    .and_then(|v| v.keys().next_back().copied());
                let v = last.unwrap_or(0) + 1;
                self.jobs.insert(
                    k.clone(),
                    Job {
                        version: v,
                        paused: j.paused_over(None),
                        updated_at: at,
                        rules: rules.clone(),
                        breaker: None,
                        breaker_from: 0,
                    },
                );
                self.deleted.remove(&k);
                ApplyResult::Created(v)
            }
        };
        let (ApplyResult::Created(v) | ApplyResult::Updated(v) | ApplyResult::Unchanged(v)) =
            result;
        self.versions.entry(k).or_default().insert(
            v,
            Version {
                spec: j.spec.clone(),
                applied_at: at,
                origin: j.origin.clone(),
                rules,
            },
        );
        result
    }

    /// Refuses a batch that would insert a run whose id is taken (a
    /// backend's primary key refuses it and the whole batch with it),
    /// before anything changes.
    fn check_inserts(&self, batch: &[Write]) -> Result<()> {
        let mut ids = BTreeSet::new();
        let mut fires = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for w in batch {
            let run = match w {
                Write::Run(run) => match &run.key {
                    Some(k) => {
                        let k = (run.namespace.clone(), run.job.clone(), k.clone());
                        (!self.run_keys.contains_key(&k) && keys.insert(k)).then_some(run)
                    }
                    None => Some(run),
                },
                Write::Fire {
                    namespace,
                    job,
                    scheduled_at,
                    run,
                    ..
                } => {
                    let at = scheduled_at.as_microsecond();
                    let recorded = self
                        .fires
                        .get(&key(namespace, job))
                        .is_some_and(|f| f.contains_key(&at));
                    if recorded || !fires.insert((namespace, job, at)) {
                        None
                    } else {
                        run.as_ref()
                    }
                }
                _ => None,
            };
            if let Some(run) = run
                && (self.runs.contains_key(&run.id) || !ids.insert(run.id))
            {
                return Err(StorageError::Invalid(format!("run {} exists", run.id)));
            }
        }
        Ok(())
    }

    /// Applies a change of a job's breaker (see [`Write::Breaker`]).
    fn breaker(&mut self, b: &crate::BreakerWrite) -> WriteResult {
        let k = key(&b.namespace, &b.job);
        let Some(job) = self.jobs.get(&k) else {
            return WriteResult::Conflict(format!("no job {}/{}", b.namespace, b.job));
        };
        match b.open {
            Some((_, after)) => {
                if job.breaker.is_some() {
                    return WriteResult::breaker_unchanged(&b.namespace, &b.job, "open");
                }
                let latest: Vec<RunState> = self
                    .runs
                    .range(job.breaker_from + 1..)
                    .rev()
                    .filter(|(_, r)| r.of(&b.namespace, &b.job))
                    .map(|(_, r)| r.row.state)
                    .filter(|s| dagcron_core::breaker::counts(*s))
                    .take(after as usize)
                    .collect();
                if !dagcron_core::breaker::opens(&latest, after) {
                    return WriteResult::breaker_unchanged(&b.namespace, &b.job, "closed");
                }
            }
            None if job.breaker.is_none() => {
                return WriteResult::breaker_unchanged(&b.namespace, &b.job, "closed");
            }
            None => {}
        }
        let from = self
            .runs
            .iter()
            .rev()
            .find(|(_, r)| r.of(&b.namespace, &b.job))
            .map_or(0, |(id, _)| *id);
        let job = self.jobs.get_mut(&k).expect("checked");
        job.breaker = b.opened();
        if b.open.is_none() {
            job.breaker_from = from;
        }
        for n in &b.notifications {
            self.write(&Write::Notify(n.clone()));
        }
        WriteResult::Done
    }

    fn insert_run(&mut self, run: &NewRun) {
        let mut row = Row::new(run);
        row.changed = false;
        self.runs.insert(
            run.id,
            Run {
                made: run.clone(),
                row,
            },
        );
    }

    fn write(&mut self, w: &Write) -> WriteResult {
        match w {
            Write::Fire {
                namespace,
                job,
                scheduled_at,
                outcome,
                calendar,
                run,
            } => {
                let ledger = self.fires.entry(key(namespace, job)).or_default();
                let at = scheduled_at.as_microsecond();
                if ledger.contains_key(&at) {
                    return WriteResult::fire_recorded(namespace, job, *scheduled_at);
                }
                ledger.insert(
                    at,
                    Fire {
                        outcome: *outcome,
                        calendar: calendar.clone(),
                        run: run.as_ref().map(|r| r.id),
                        sla_missed_at: None,
                    },
                );
                if let Some(run) = run {
                    self.insert_run(run);
                }
                WriteResult::Done
            }
            Write::Run(run) => {
                if let Some(k) = &run.key {
                    let k = (run.namespace.clone(), run.job.clone(), k.clone());
                    if self.run_keys.contains_key(&k) {
                        return WriteResult::run_key_taken(run);
                    }
                    self.run_keys.insert(k, (run.id, run.created_at));
                }
                self.insert_run(run);
                WriteResult::Done
            }
            // See `MemoryStore::write`.
            Write::Breaker(_) | Write::SlaMissed { .. } => WriteResult::Done,
            Write::Notify(n) => {
                if !self.outbox.values().any(|o| o.record.made.key == n.key) {
                    let id = self.outbox.keys().next_back().map_or(1, |k| k + 1);
                    let record = NotificationRecord {
                        id,
                        made: n.clone(),
                        state: NotificationState::Pending,
                        attempts: 0,
                        next_at: Some(n.at),
                        ended_at: None,
                        last_status: None,
                        last_error: None,
                    };
                    self.outbox.insert(
                        id,
                        Outboxed {
                            record,
                            claim: None,
                            deliveries: vec![],
                        },
                    );
                }
                WriteResult::Done
            }
            _ => {
                let id = run_row::run_of(w).expect("a write of a run");
                let mut effects = Effects::default();
                let row = self.runs.get_mut(&id).map(|r| &mut r.row);
                let result = run_row::apply(row, w, None, &mut effects);
                for (run, task, number, log, lines) in effects.logs {
                    self.logs.insert(
                        (run, task.to_string(), number),
                        (log.to_vec(), lines.to_vec()),
                    );
                }
                result
            }
        }
    }

    /// A job's fire ledger, by instant.
    fn fire_ledger(&self, namespace: &str, job: &str) -> Option<&BTreeMap<i64, Fire>> {
        self.fires.get(&key(namespace, job))
    }

    fn prune(&mut self, batch: &Prune) -> Pruned {
        let mut out = Pruned::default();
        // Every run is checked as the batch starts: a run re-run by another
        // run of the same batch stays this time.
        let gone: Vec<RunId> = batch
            .runs
            .iter()
            .copied()
            .filter(|id| {
                self.runs.get(id).is_some_and(|r| r.row.state.is_terminal())
                    && !self.runs.values().any(|x| x.made.rerun_of == Some(*id))
            })
            .collect();
        for id in gone {
            let Some(run) = self.runs.remove(&id) else {
                continue;
            };
            out.runs += 1;
            out.attempts += run
                .row
                .tasks
                .iter()
                .map(|t| t.attempts.len() as u64)
                .sum::<u64>();
            self.logs.retain(|(r, _, _), _| *r != id);
            let at = run.made.scheduled_at.as_microsecond();
            if let Some(ledger) = self.fires.get_mut(&key(&run.made.namespace, &run.made.job))
                && ledger.get(&at).is_some_and(|f| f.run == Some(id))
            {
                ledger.remove(&at);
                out.fires += 1;
            }
        }
        for (ns, job, at) in &batch.fires {
            let runs = &self.runs;
            let Some(ledger) = self.fires.get_mut(&key(ns, job)) else {
                continue;
            };
            let at = at.as_microsecond();
            let newest = ledger.keys().next_back().copied();
            let may_go = ledger
                .get(&at)
                .is_some_and(|f| f.run.is_none_or(|r| !runs.contains_key(&r)));
            if may_go && newest.is_some_and(|n| at < n) {
                ledger.remove(&at);
                out.fires += 1;
            }
        }
        for (ns, job) in &batch.forget {
            let k = key(ns, job);
            let has_runs = self.runs.values().any(|r| r.of(ns, job));
            if self.jobs.contains_key(&k) || has_runs || self.deleted.remove(&k).is_none() {
                continue;
            }
            out.jobs += 1;
            self.versions.remove(&k);
            out.fires += self.fires.remove(&k).map_or(0, |f| f.len() as u64);
        }
        out
    }
}

impl JobStore for MemoryStore {
    async fn apply_jobs(&self, jobs: &[JobUpsert], at: Timestamp) -> Result<Vec<ApplyResult>> {
        let mut data = self.data();
        Ok(jobs.iter().map(|j| data.apply_job(j, at)).collect())
    }

    async fn load_jobs(
        &self,
        after: Option<&(String, String)>,
        limit: u32,
    ) -> Result<Vec<StoredJob>> {
        let data = self.data();
        let after = after.cloned().unwrap_or_default();
        Ok(data
            .jobs
            .keys()
            .filter(|k| **k > after)
            .take(limit as usize)
            .filter_map(|k| data.job(k))
            .collect())
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<StoredJob>> {
        Ok(self.data().job(&key(namespace, name)))
    }

    async fn list_jobs(
        &self,
        namespace: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<StoredJob>> {
        let after = crate::jobs_after(cursor)?;
        let data = self.data();
        let jobs = data
            .jobs
            .keys()
            .filter(|(ns, name)| ns == namespace && *name > after)
            .filter_map(|k| data.job(k));
        Ok(page(jobs, limit, crate::job_cursor))
    }

    async fn attention_jobs(&self, namespace: &str, limit: u32) -> Result<Vec<StoredJob>> {
        let data = self.data();
        Ok(data
            .jobs
            .keys()
            .filter(|(ns, _)| ns == namespace)
            .filter_map(|k| data.job(k))
            .filter(|j| j.paused || j.breaker.is_some())
            .take(limit as usize)
            .collect())
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<bool> {
        let mut data = self.data();
        let k = key(namespace, name);
        if data.jobs.remove(&k).is_none() {
            return Ok(false);
        }
        data.run_keys
            .retain(|(ns, job, _), _| !(ns == namespace && job == name));
        data.deleted.insert(k, Timestamp::now());
        Ok(true)
    }

    async fn set_paused(&self, namespace: &str, name: &str, paused: bool) -> Result<bool> {
        let mut data = self.data();
        Ok(match data.jobs.get_mut(&key(namespace, name)) {
            Some(job) => {
                job.paused = paused;
                true
            }
            None => false,
        })
    }

    async fn list_job_versions(
        &self,
        namespace: &str,
        name: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<VersionRecord>> {
        let before = crate::versions_before(cursor)?;
        let data = self.data();
        let k = key(namespace, name);
        let versions = data
            .versions
            .get(&k)
            .into_iter()
            .flat_map(|v| v.range(..before).rev())
            .map(|(n, v)| data.version(&k, *n, v))
            .collect::<Result<Vec<_>>>()?;
        Ok(page(versions.into_iter(), limit, crate::version_cursor))
    }

    async fn get_job_version(
        &self,
        namespace: &str,
        name: &str,
        version: i64,
    ) -> Result<Option<JobVersion>> {
        let data = self.data();
        let k = key(namespace, name);
        let Some(v) = data.versions.get(&k).and_then(|v| v.get(&version)) else {
            return Ok(None);
        };
        Ok(Some(JobVersion {
            info: data.version(&k, version, v)?,
            spec: v.spec.clone(),
        }))
    }

    async fn stamp_rules(
        &self,
        versions: &[(String, String, i64, dagcron_core::Rules)],
    ) -> Result<()> {
        let mut data = self.data();
        for (ns, name, number, rules) in versions {
            let k = key(ns, name);
            if let Some(v) = data.versions.get_mut(&k).and_then(|v| v.get_mut(number)) {
                v.rules.get_or_insert_with(|| rules.to_json());
            }
            if let Some(job) = data.jobs.get_mut(&k).filter(|j| j.version == *number) {
                job.rules.get_or_insert_with(|| rules.to_json());
            }
        }
        Ok(())
    }
}

impl RunStore for MemoryStore {
    async fn write(&self, batch: &[Write]) -> Result<Vec<WriteResult>> {
        let mut data = self.data();
        data.check_inserts(batch)?;
        let mut results: Vec<WriteResult> = batch.iter().map(|w| data.write(w)).collect();
        // Breakers after the other writes, as documented.
        for (w, result) in batch.iter().zip(&mut results) {
            match w {
                Write::Breaker(b) => *result = data.breaker(b),
                Write::SlaMissed {
                    namespace,
                    job,
                    scheduled_at,
                    at,
                    notifications,
                } => {
                    let fire = data
                        .fires
                        .get_mut(&key(namespace, job))
                        .and_then(|l| l.get_mut(&scheduled_at.as_microsecond()))
                        .filter(|f| f.sla_missed_at.is_none());
                    *result = match fire {
                        Some(f) => {
                            f.sla_missed_at = Some(*at);
                            for n in notifications {
                                data.write(&Write::Notify(n.clone()));
                            }
                            WriteResult::Done
                        }
                        None => WriteResult::sla_recorded(namespace, job, *scheduled_at),
                    };
                }
                _ => {}
            }
        }
        Ok(results)
    }

    async fn last_fires(&self) -> Result<Vec<(String, String, Timestamp)>> {
        let data = self.data();
        data.fires
            .iter()
            .filter_map(|(k, f)| Some((k, *f.keys().next_back()?)))
            .map(|((ns, job), at)| Ok((ns.clone(), job.clone(), crate::rows::ts(at)?)))
            .collect()
    }

    async fn last_fires_of(&self, jobs: &[(String, String)]) -> Result<Vec<Option<Timestamp>>> {
        let data = self.data();
        jobs.iter()
            .map(|k| {
                let last = data
                    .fires
                    .get(k)
                    .and_then(|f| f.keys().next_back().copied());
                crate::rows::opt_ts(last)
            })
            .collect()
    }

    async fn problem_fires(
        &self,
        namespace: &str,
        since: Timestamp,
        limit: u32,
    ) -> Result<Vec<(String, FireRecord)>> {
        let data = self.data();
        let mut out = Vec::new();
        for ((ns, job), ledger) in &data.fires {
            if ns != namespace {
                continue;
            }
            for (at, f) in ledger.range(since.as_microsecond()..) {
                if !matches!(f.outcome, FireOutcome::Fired | FireOutcome::Suppressed) {
                    out.push((
                        job.clone(),
                        FireRecord {
                            scheduled_at: crate::rows::ts(*at)?,
                            outcome: f.outcome,
                            calendar: f.calendar.clone(),
                            run_id: f.run,
                            sla_missed_at: f.sla_missed_at,
                        },
                    ));
                }
            }
        }
        out.sort_by_key(|f| std::cmp::Reverse(f.1.scheduled_at));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn list_fires(
        &self,
        namespace: &str,
        job: &str,
        from: Timestamp,
        to: Timestamp,
        limit: u32,
    ) -> Result<Vec<FireRecord>> {
        let data = self.data();
        let Some(ledger) = data.fire_ledger(namespace, job) else {
            return Ok(vec![]);
        };
        if from >= to {
            return Ok(vec![]);
        }
        ledger
            .range(from.as_microsecond()..to.as_microsecond())
            .take(limit as usize)
            .map(|(at, f)| {
                Ok(FireRecord {
                    scheduled_at: crate::rows::ts(*at)?,
                    outcome: f.outcome,
                    calendar: f.calendar.clone(),
                    run_id: f.run,
                    sla_missed_at: f.sla_missed_at,
                })
            })
            .collect()
    }

    async fn active_runs(&self) -> Result<Vec<RunRecord>> {
        let data = self.data();
        data.runs
            .values()
            .filter(|r| !r.row.state.is_terminal())
            .map(Run::record)
            .collect()
    }

    async fn get_run(&self, id: RunId) -> Result<Option<RunRecord>> {
        self.data().runs.get(&id).map(Run::record).transpose()
    }

    async fn count_unfinished_runs(&self, namespace: &str) -> Result<u64> {
        let data = self.data();
        Ok(data
            .runs
            .values()
            .filter(|r| {
                r.made.namespace == namespace
                    && matches!(r.row.state, RunState::Pending | RunState::Running)
            })
            .count() as u64)
    }

    async fn held_runs(&self, namespace: &str, limit: u32) -> Result<Vec<RunRecord>> {
        let data = self.data();
        data.runs
            .values()
            .filter(|r| {
                r.made.namespace == namespace
                    && matches!(r.row.state, RunState::Pending | RunState::Running)
                    && r.row.tasks.iter().any(|t| t.state == TaskState::Held)
            })
            .take(limit as usize)
            .map(Run::record)
            .collect()
    }

    async fn list_runs(
        &self,
        namespace: &str,
        job: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RunRecord>> {
        let before = crate::runs_before(cursor)?;
        let data = self.data();
        let runs = data
            .runs
            .range(..before)
            .rev()
            .filter(|(_, r)| r.of(namespace, job))
            .take(limit as usize + 1)
            .map(|(_, r)| r.record())
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(runs, limit, crate::run_cursor))
    }

    async fn browse_runs(
        &self,
        filter: &crate::RunFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RunRecord>> {
        let before = crate::runs_before(cursor)?;
        let data = self.data();
        let indexed = |r: &Run| {
            filter
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == r.made.namespace)
                && filter.job.as_ref().is_none_or(|j| *j == r.made.job)
        };
        let scanned = filter.states.len()
            + usize::from(filter.trigger.is_some())
            + usize::from(filter.since.is_some())
            + usize::from(filter.until.is_some())
            + usize::from(filter.ended_since.is_some())
            > 0;
        let budget = if scanned {
            crate::BROWSE_SCAN as usize
        } else {
            usize::MAX
        };
        let mut runs = Vec::new();
        let mut looked = 0;
        let mut oldest = None;
        for (id, r) in data.runs.range(..before).rev().filter(|(_, r)| indexed(r)) {
            if looked == budget {
                break;
            }
            looked += 1;
            oldest = Some(*id);
            let run = r.record()?;
            if filter.matches(&run) {
                runs.push(run);
                if runs.len() > limit as usize {
                    return Ok(Page::from_overfetch(runs, limit, crate::run_cursor));
                }
            }
        }
        let next_cursor = (looked == budget)
            .then(|| oldest.map(|id| format!("run:{id}")))
            .flatten();
        Ok(Page {
            items: runs,
            next_cursor,
        })
    }

    async fn unfinished_runs(
        &self,
        namespace: &str,
        planned: bool,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        let data = self.data();
        let mut runs: Vec<&Run> = data
            .runs
            .values()
            .rev()
            .filter(|r| {
                r.made.namespace == namespace
                    && if planned {
                        r.row.state == RunState::Planned
                    } else {
                        matches!(r.row.state, RunState::Pending | RunState::Running)
                    }
            })
            .collect();
        if planned {
            runs.sort_by_key(|r| (r.made.scheduled_at, r.made.id));
        }
        runs.into_iter()
            .take(limit as usize)
            .map(Run::record)
            .collect()
    }

    async fn planned_runs(&self, namespace: &str, job: &str, limit: u32) -> Result<Vec<RunRecord>> {
        let data = self.data();
        let mut planned: Vec<&Run> = data
            .runs
            .values()
            .filter(|r| r.of(namespace, job) && r.row.state == RunState::Planned)
            .collect();
        planned.sort_by_key(|r| (r.made.scheduled_at, r.made.id));
        planned
            .into_iter()
            .take(limit as usize)
            .map(Run::record)
            .collect()
    }

    async fn max_run_id(&self) -> Result<RunId> {
        Ok(self.data().runs.keys().next_back().copied().unwrap_or(0))
    }

    async fn read_log(&self, run: RunId, task: &str, number: u32) -> Result<Option<Vec<u8>>> {
        let data = self.data();
        let exists = data
            .runs
            .get(&run)
            .is_some_and(|r| run_row::find_attempt(&r.row.tasks, task, number).is_some());
        Ok(exists.then(|| {
            data.logs
                .get(&(run, task.to_string(), number))
                .map(|l| l.0.clone())
                .unwrap_or_default()
        }))
    }

    async fn read_log_lines(&self, run: RunId, task: &str, number: u32) -> Result<Vec<u8>> {
        let data = self.data();
        Ok(data
            .logs
            .get(&(run, task.to_string(), number))
            .map(|l| l.1.clone())
            .unwrap_or_default())
    }
}

impl OutboxStore for MemoryStore {
    async fn claim_notifications(
        &self,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
        limit: u32,
    ) -> Result<Vec<NotificationRecord>> {
        let mut data = self.data();
        let mut due: Vec<&mut Outboxed> = data
            .outbox
            .values_mut()
            .filter(|o| {
                o.record.state == NotificationState::Pending
                    && o.record.next_at.is_some_and(|t| t <= now)
                    && o.claim.as_ref().is_none_or(|(_, t)| *t < now)
            })
            .collect();
        due.sort_by_key(|o| (o.record.next_at, o.record.id));
        Ok(due
            .into_iter()
            .take(limit as usize)
            .map(|o| {
                o.claim = Some((owner.to_string(), until));
                o.record.clone()
            })
            .collect())
    }

    async fn record_delivery(
        &self,
        id: i64,
        owner: &str,
        attempt: Option<&DeliveryAttempt>,
        end: &DeliveryEnd,
    ) -> Result<bool> {
        let mut data = self.data();
        let Some(o) = data.outbox.get_mut(&id) else {
            return Ok(false);
        };
        if o.record.state != NotificationState::Pending
            || o.claim.as_ref().is_none_or(|(who, _)| who != owner)
        {
            return Ok(false);
        }
        o.claim = None;
        if let Some(a) = attempt {
            o.deliveries.push(a.clone());
        }
        o.record = crate::outbox::after_delivery(&o.record, attempt, end);
        Ok(true)
    }

    async fn list_notifications(
        &self,
        namespace: &str,
        failed_only: bool,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<NotificationRecord>> {
        let data = self.data();
        Ok(data
            .outbox
            .range(..before.unwrap_or(i64::MAX))
            .rev()
            .map(|(_, o)| &o.record)
            .filter(|r| r.made.namespace == namespace)
            .filter(|r| !failed_only || r.state == NotificationState::Failed)
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn prune_notifications(&self, before: Timestamp, limit: u32) -> Result<u64> {
        let mut data = self.data();
        let gone: Vec<i64> = data
            .outbox
            .values()
            .filter(|o| o.record.ended_at.is_some_and(|t| t < before))
            .map(|o| o.record.id)
            .take(limit as usize)
            .collect();
        for id in &gone {
            data.outbox.remove(id);
        }
        Ok(gone.len() as u64)
    }

    async fn prune_run_keys(&self, before: Timestamp, limit: u32) -> Result<u64> {
        let mut data = self.data();
        let gone: Vec<_> = data
            .run_keys
            .iter()
            .filter(|(_, (_, at))| *at < before)
            .map(|(k, _)| k.clone())
            .take(limit as usize)
            .collect();
        for k in &gone {
            data.run_keys.remove(k);
        }
        Ok(gone.len() as u64)
    }

    async fn run_of_key(&self, namespace: &str, job: &str, key: &str) -> Result<Option<RunId>> {
        let k = (namespace.to_string(), job.to_string(), key.to_string());
        Ok(self.data().run_keys.get(&k).map(|(run, _)| *run))
    }

    async fn delivery_attempts(&self, id: i64) -> Result<Vec<DeliveryAttempt>> {
        Ok(self
            .data()
            .outbox
            .get(&id)
            .map(|o| o.deliveries.clone())
            .unwrap_or_default())
    }

    async fn previous_run_end(
        &self,
        namespace: &str,
        job: &str,
        run: RunId,
    ) -> Result<Option<RunState>> {
        let data = self.data();
        Ok(data
            .runs
            .range(..run)
            .rev()
            .filter(|(_, r)| r.of(namespace, job))
            .map(|(_, r)| r.row.state)
            .find(|s| matches!(s, RunState::Succeeded | RunState::Failed)))
    }
}

impl AuthStore for MemoryStore {
    async fn create_token(&self, token: &TokenRecord, hash: &[u8]) -> Result<()> {
        let mut data = self.data();
        if data
            .tokens
            .iter()
            .any(|(t, h)| t.id == token.id || h == hash)
        {
            return Err(StorageError::Invalid(format!("token {} exists", token.id)));
        }
        data.tokens.push((token.clone(), hash.to_vec()));
        Ok(())
    }

    async fn find_token(&self, hash: &[u8]) -> Result<Option<TokenRecord>> {
        let data = self.data();
        Ok(data
            .tokens
            .iter()
            .find(|(_, h)| h == hash)
            .map(|(t, _)| t.clone()))
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let mut tokens: Vec<TokenRecord> =
            self.data().tokens.iter().map(|(t, _)| t.clone()).collect();
        tokens.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(tokens)
    }

    async fn revoke_token(&self, id: &str, at: Timestamp) -> Result<bool> {
        let mut data = self.data();
        let token = data
            .tokens
            .iter_mut()
            .map(|(t, _)| t)
            .find(|t| t.id == id && t.revoked_at.is_none());
        Ok(token.map(|t| t.revoked_at = Some(at)).is_some())
    }

    async fn token_used(&self, id: &str, at: Timestamp) -> Result<()> {
        let mut data = self.data();
        if let Some((t, _)) = data.tokens.iter_mut().find(|(t, _)| t.id == id) {
            t.last_used_at = Some(at);
        }
        Ok(())
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.data()
            .secrets
            .insert(key(&secret.namespace, &secret.name), secret.clone());
        Ok(())
    }

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<SecretRecord>> {
        Ok(self.data().secrets.get(&key(namespace, name)).cloned())
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        let data = self.data();
        Ok(data
            .secrets
            .values()
            .filter(|s| s.namespace == namespace)
            .cloned()
            .collect())
    }

    async fn list_all_secrets(&self) -> Result<Vec<SecretRecord>> {
        Ok(self.data().secrets.values().cloned().collect())
    }

    async fn count_secrets(&self) -> Result<u64> {
        Ok(self.data().secrets.len() as u64)
    }

    async fn delete_secret(&self, namespace: &str, name: &str) -> Result<bool> {
        Ok(self.data().secrets.remove(&key(namespace, name)).is_some())
    }
}

impl SettingStore for MemoryStore {
    async fn get_setting(&self, key: &str) -> Result<Option<String>> {
        Ok(self.data().settings.get(key).cloned())
    }

    async fn get_settings(&self, keys: [&str; 2]) -> Result<[Option<String>; 2]> {
        let data = self.data();
        Ok(keys.map(|k| data.settings.get(k).cloned()))
    }

    async fn set_setting(&self, key: &str, value: Option<&str>, _at: Timestamp) -> Result<()> {
        let mut data = self.data();
        match value {
            Some(v) => data.settings.insert(key.to_string(), v.to_string()),
            None => data.settings.remove(key),
        };
        Ok(())
    }
}

impl AuditStore for MemoryStore {
    async fn append_audit(&self, mut entry: AuditEntry) -> Result<()> {
        let mut data = self.data();
        let prev = data.audit.last().map(|e| (e.seq, e.hash.clone()));
        entry.chain_after(prev);
        data.audit.push(entry);
        Ok(())
    }

    async fn list_audit(
        &self,
        after: i64,
        limit: u32,
        namespace: Option<&str>,
    ) -> Result<Vec<AuditEntry>> {
        let data = self.data();
        Ok(data
            .audit
            .iter()
            .filter(|e| {
                e.seq > after && namespace.is_none_or(|ns| e.namespace.as_deref() == Some(ns))
            })
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn list_audit_newest(
        &self,
        before: i64,
        limit: u32,
        namespace: Option<&str>,
    ) -> Result<Vec<AuditEntry>> {
        let data = self.data();
        Ok(data
            .audit
            .iter()
            .rev()
            .filter(|e| {
                e.seq < before && namespace.is_none_or(|ns| e.namespace.as_deref() == Some(ns))
            })
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        let mut data = self.data();
        // The newest row always stays: the next append chains after it.
        let keep_from = data.audit.len().saturating_sub(1);
        let Some(cut) = data.audit[..keep_from].iter().rposition(|e| e.at < before) else {
            return Ok(0);
        };
        let last = data.audit[cut].clone();
        data.audit.drain(..=cut);
        data.settings.insert(
            crate::AUDIT_CHECKPOINT.to_string(),
            crate::checkpoint_text(last.seq, &last.hash),
        );
        Ok(cut as u64 + 1)
    }
}

impl HistoryStore for MemoryStore {
    async fn history_jobs(
        &self,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<HistoryJob>> {
        let data = self.data();
        let after = after.map(|(ns, name)| key(ns, name)).unwrap_or_default();
        data.versions
            .keys()
            .filter(|k| **k > after && namespace.is_none_or(|ns| k.0 == ns))
            .take(limit as usize)
            .map(|k| {
                let newest = data
                    .fires
                    .get(k)
                    .and_then(|f| f.iter().next_back())
                    .map(|(at, f)| Ok::<_, StorageError>((crate::rows::ts(*at)?, f.run)))
                    .transpose()?;
                Ok(HistoryJob {
                    namespace: k.0.clone(),
                    name: k.1.clone(),
                    facts: JobFacts {
                        deleted_at: if data.jobs.contains_key(k) {
                            None
                        } else {
                            data.deleted.get(k).copied()
                        },
                        newest_fire: newest,
                    },
                })
            })
            .collect()
    }

    async fn run_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: RunId,
        limit: u32,
    ) -> Result<Vec<RunFacts>> {
        let data = self.data();
        let ids: Vec<RunId> = data
            .runs
            .values()
            .filter(|r| r.of(namespace, job))
            .map(|r| r.made.id)
            .collect();
        let old = ids.len().saturating_sub(keep as usize);
        let ledger = data.fire_ledger(namespace, job);
        Ok(ids[..old]
            .iter()
            .filter(|id| **id > after)
            .take(limit as usize)
            .map(|id| {
                let run = &data.runs[id];
                let at = run.made.scheduled_at.as_microsecond();
                RunFacts {
                    id: *id,
                    state: run.row.state,
                    created_at: run.made.created_at,
                    finished_at: crate::rows::opt_ts(run.row.finished_at).ok().flatten(),
                    rerun: data.runs.values().any(|x| x.made.rerun_of == Some(*id)),
                    attempts: run.row.tasks.iter().map(|t| t.attempts.len() as u64).sum(),
                    fired: ledger
                        .and_then(|l| l.get(&at))
                        .is_some_and(|f| f.run == Some(*id)),
                }
            })
            .collect())
    }

    async fn fire_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: Option<Timestamp>,
        limit: u32,
    ) -> Result<Vec<FireFacts>> {
        let data = self.data();
        let Some(ledger) = data.fire_ledger(namespace, job) else {
            return Ok(vec![]);
        };
        let old = ledger.len().saturating_sub(keep as usize);
        let after = after.map_or(i64::MIN, Timestamp::as_microsecond);
        ledger
            .iter()
            .take(old)
            .filter(|(at, _)| **at > after)
            .take(limit as usize)
            .map(|(at, f)| {
                Ok(FireFacts {
                    scheduled_at: crate::rows::ts(*at)?,
                    run_stored: f.run.is_some_and(|r| data.runs.contains_key(&r)),
                })
            })
            .collect()
    }

    async fn prune(&self, batch: &Prune) -> Result<Pruned> {
        Ok(self.data().prune(batch))
    }
}
