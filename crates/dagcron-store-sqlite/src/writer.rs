//! The write path: one SQLite connection on its own thread.
//!
//! A batch crosses threads once, then runs as cached prepared statements in
//! one `BEGIN IMMEDIATE` transaction. (Going through the async driver cost
//! a thread hand-off per statement, which dominated the time of a batch.)

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use crate::plan::{AsStateName, Plan, plan};
use dagcron_core::{FireOutcome, Rules, RunState, TaskState};
use dagcron_store::{
    ApplyResult, BreakerWrite, JobUpsert, NewRun, Result, RunId, StorageError, Write, WriteResult,
};
use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A handle to the writer thread; the thread ends when the last handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Job>,
}

fn failed(e: rusqlite::Error) -> StorageError {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
        return StorageError::Full(e.to_string());
    }
    StorageError::Unavailable(e.to_string())
}

impl Writer {
    pub(crate) fn open(path: &Path) -> Result<Writer> {
        let conn = Connection::open(path).map_err(failed)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(failed)?;
        conn.execute_batch(
            // A page cache of 64 MiB for the writer (the default is 2 MiB):
            // a large apply's pages stay in memory until its commit instead
            // of being spilled to the log in the middle of the transaction.
            // Checkpoints are made beside it (see `checkpoint`); its own,
            // at 64 MiB of log, only if that thread falls behind.
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA cache_size = -65536;",
        )
        .map_err(failed)?;
        let checkpointer = crate::checkpoint::Checkpointer::start(path);
        if checkpointer.is_some() {
            conn.execute_batch("PRAGMA wal_autocheckpoint = 16384;")
                .map_err(failed)?;
        }
        conn.set_prepared_statement_cache_capacity(64);
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("dagcron-sqlite-writer".into())
            .spawn(move || {
                let mut conn = conn;
                for job in rx {
                    job(&mut conn);
                    if let Some(c) = &checkpointer {
                        c.after_commit();
                    }
                }
            })
            .map_err(|e| StorageError::Unavailable(format!("starting the writer thread: {e}")))?;
        Ok(Writer { tx })
    }

    /// Runs `f` in one immediate transaction on the writer thread.
    pub(crate) async fn transaction<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = (|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let out = f(&tx)?;
                tx.commit()?;
                Ok(out)
            })();
            let _ = reply.send(result);
        });
        self.tx
            .send(job)
            .map_err(|_| StorageError::Unavailable("the writer thread has stopped".into()))?;
        rx.await
            .map_err(|_| StorageError::Unavailable("the writer thread has stopped".into()))?
            .map_err(failed)
    }
}

/// A stored job's row as an apply compares against it: as read, or as the
/// same batch left it (borrowed from the batch).
struct Current<'a> {
    version: i64,
    spec: Cow<'a, str>,
    paused: bool,
    rules: Option<Cow<'a, str>>,
}

/// A job by (namespace, name), borrowed from the batch.
type Key<'a> = (&'a str, &'a str);

/// The rows of a batch's jobs, and the last version of the jobs without
/// one.
type Prefetched<'a> = (HashMap<Key<'a>, Current<'a>>, HashMap<Key<'a>, i64>);

/// The rows of the batch's jobs, read a namespace at a time in one query
/// each, and the last version of the jobs that have no row (a re-created
/// job continues its history), instead of two statements per job.
fn prefetch<'a>(tx: &Transaction<'_>, jobs: &'a [JobUpsert]) -> rusqlite::Result<Prefetched<'a>> {
    let mut by_namespace: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for j in jobs {
        by_namespace
            .entry(&j.namespace)
            .or_default()
            .insert(&j.name);
    }
    let mut current = HashMap::new();
    let mut last = HashMap::new();
    for (ns, names) in by_namespace {
        let list = serde_json::to_string(&names).expect("names serialize");
        // The batch's own copy of a name read back.
        let ours = |name: String| names.get(name.as_str()).copied();
        let mut rows = tx.prepare_cached(
            // The names drive the loop (CROSS JOIN keeps that order): each
            // is one probe of the primary key, whatever the table's size.
            // The spec is the current version's.
            "SELECT j.name, j.version, v.spec, j.paused, j.rules FROM json_each(?2) AS n CROSS JOIN jobs AS j ON j.namespace = ?1 AND j.name = n.value
               CROSS JOIN job_versions AS v ON v.namespace = j.namespace AND v.name = j.name AND v.version = j.version",
        )?;
        let mut rows = rows.query(params![ns, list])?;
        while let Some(r) = rows.next()? {
            if let Some(name) = ours(r.get(0)?) {
                let rules: Option<String> = r.get(4)?;
                current.insert(
                    (ns, name),
                    Current {
                        version: r.get(1)?,
                        spec: Cow::Owned(r.get(2)?),
                        paused: r.get(3)?,
                        rules: rules.map(Cow::Owned),
                    },
                );
            }
        }
        let mut versions = tx.prepare_cached(
            "SELECT n.value, (SELECT MAX(v.version) FROM job_versions AS v WHERE v.namespace = ?1 AND v.name = n.value) AS last FROM json_each(?2) AS n WHERE last IS NOT NULL",
        )?;
        let mut rows = versions.query(params![ns, list])?;
        while let Some(r) = rows.next()? {
            if let Some(name) = ours(r.get(0)?) {
                last.insert((ns, name), r.get(1)?);
            }
        }
    }
    Ok((current, last))
}

pub(crate) fn apply_jobs(
    tx: &Transaction<'_>,
    jobs: &[JobUpsert],
    at: Timestamp,
) -> rusqlite::Result<Vec<ApplyResult>> {
    let at = at.as_microsecond();
    let (mut rows, last_versions) = prefetch(tx, jobs)?;
    let mut update = tx.prepare_cached("UPDATE jobs SET version = ?1, timing = ?2, updated_at = ?3, paused = ?4, rules = ?5 WHERE namespace = ?6 AND name = ?7")?;
    let mut insert = tx.prepare_cached("INSERT INTO jobs (namespace, name, version, timing, paused, updated_at, rules) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")?;
    let mut version = tx.prepare_cached("INSERT OR REPLACE INTO job_versions (namespace, name, version, spec, created_at, applied_by, applied_by_name, rollback_of, rules) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")?;
    let mut created: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut out = Vec::with_capacity(jobs.len());
    // Most jobs of a batch are applied under the same rules: written once.
    let mut rules_text: Option<(&Rules, String)> = None;
    for j in jobs {
        let key = (j.namespace.as_str(), j.name.as_str());
        let rules = j.rules.as_ref().map(|r| match &rules_text {
            Some((last, text)) if *last == r => text.clone(),
            _ => {
                let text = r.to_json();
                rules_text = Some((r, text.clone()));
                text
            }
        });
        let result = match rows.get(&key) {
            Some(c) if !j.changes(&c.spec, c.rules.as_deref()) => ApplyResult::Unchanged(c.version),
            Some(c) => {
                let v = c.version + 1;
                let paused = j.paused_over(Some((c.paused, &c.spec)));
                update.execute(params![v, j.timing, at, paused, rules, j.namespace, j.name])?;
                rows.insert(key, Current::of(j, v, paused, &rules));
                ApplyResult::Updated(v)
            }
            None => {
                // A re-created job continues its version history.
                let v = last_versions.get(&key).copied().unwrap_or(0) + 1;
                let paused = j.paused_over(None);
                insert.execute(params![j.namespace, j.name, v, j.timing, paused, at, rules])?;
                created.entry(&j.namespace).or_default().push(&j.name);
                rows.insert(key, Current::of(j, v, paused, &rules));
                ApplyResult::Created(v)
            }
        };
        if let ApplyResult::Created(v) | ApplyResult::Updated(v) = result {
            let by = j.origin.by.as_ref();
            version.execute(params![
                j.namespace,
                j.name,
                v,
                j.spec,
                at,
                by.map(|a| &a.id),
                by.map(|a| &a.name),
                j.origin.rollback_of,
                rules
            ])?;
        }
        out.push(result);
    }
    // A job applied again removes its tombstone.
    for (ns, names) in created {
        let names = serde_json::to_string(&names).expect("names serialize");
        tx.prepare_cached(
            "DELETE FROM deleted_jobs WHERE namespace = ?1 AND name IN (SELECT value FROM json_each(?2))",
        )?
        .execute(params![ns, names])?;
    }
    Ok(out)
}

impl<'a> Current<'a> {
    /// The row `j` leaves, for a later apply of the same job in the batch.
    fn of(j: &'a JobUpsert, version: i64, paused: bool, rules: &Option<String>) -> Current<'a> {
        Current {
            version,
            spec: Cow::Borrowed(&j.spec),
            paused,
            rules: rules.clone().map(Cow::Owned),
        }
    }
}

/// See [`dagcron_store::JobStore::stamp_rules`].
pub(crate) fn stamp_rules(
    tx: &Transaction<'_>,
    versions: &[(String, String, i64, String)],
) -> rusqlite::Result<()> {
    for (ns, name, version, rules) in versions {
        tx.prepare_cached(
            "UPDATE job_versions SET rules = ?1 WHERE namespace = ?2 AND name = ?3 AND version = ?4 AND rules IS NULL",
        )?
        .execute(params![rules, ns, name, version])?;
        tx.prepare_cached(
            "UPDATE jobs SET rules = ?1 WHERE namespace = ?2 AND name = ?3 AND version = ?4 AND rules IS NULL",
        )?
        .execute(params![rules, ns, name, version])?;
    }
    Ok(())
}

/// Inserts a run.
const INSERT_RUN: &str = "INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at, trace, rerun_of)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)";

/// A run's merged change of state: a compare-and-set from the chain's first
/// state to its last, with the instants it started and finished, if any.
const SET_RUN_STATE: &str = "UPDATE runs SET state = ?1, started_at = COALESCE(?2, started_at), finished_at = COALESCE(?3, finished_at)
     WHERE id = ?4 AND state = ?5";

fn insert_run(tx: &Transaction<'_>, run: &NewRun) -> rusqlite::Result<()> {
    let states: Vec<TaskState> = run.tasks.iter().map(|t| run.task_start(t)).collect();
    insert_run_as(tx, run, &states)
}

/// Inserts `run`, its tasks in `states` (by position).
fn insert_run_as(tx: &Transaction<'_>, run: &NewRun, states: &[TaskState]) -> rusqlite::Result<()> {
    let created = run.created_at.as_microsecond();
    let started = (run.state == RunState::Running).then_some(created);
    let finished = run.state.is_terminal().then_some(created);
    let params_json = serde_json::to_string(&run.params).expect("params serialize");
    tx.prepare_cached(INSERT_RUN)?.execute(params![
        run.id,
        run.namespace,
        run.job,
        run.job_version,
        run.trigger.as_str(),
        run.scheduled_at.as_microsecond(),
        run.state.as_str(),
        params_json,
        created,
        started,
        finished,
        run.trace,
        run.rerun_of
    ])?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO tasks (run_id, task_id, position, state, carried, outputs, item) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (position, (task, state)) in run.tasks.iter().zip(states).enumerate() {
        let outputs = run
            .carried_outputs
            .get(task)
            .map(|o| serde_json::to_string(o).expect("outputs serialize"));
        insert.execute(params![
            run.id,
            task,
            position as i64,
            state.as_str(),
            run.carried.contains_key(task),
            outputs,
            run.items.get(task)
        ])?;
    }
    Ok(())
}

/// Adds the instances of mapped task `task` of `run` (see [`Write::Expand`]).
fn expand(
    tx: &Transaction<'_>,
    run: RunId,
    task: &str,
    items: &[String],
) -> rusqlite::Result<WriteResult> {
    let next: Option<i64> = tx
        .prepare_cached(
            "SELECT (SELECT max(position) + 1 FROM tasks WHERE run_id = ?1) FROM tasks WHERE run_id = ?1 AND task_id = ?2",
        )?
        .query_row(params![run, task], |r| r.get(0))
        .optional()?;
    let Some(next) = next else {
        return Ok(WriteResult::task_conflict(
            run,
            task,
            None,
            TaskState::Ready,
        ));
    };
    let expanded = tx
        .prepare_cached("SELECT 1 FROM tasks WHERE run_id = ?1 AND task_id = ?2")?
        .exists(params![run, dagcron_core::fan_out::instance_id(task, 0)])?;
    if expanded {
        return Ok(WriteResult::Conflict(format!(
            "{run}/{task} is expanded already"
        )));
    }
    let mut insert = tx.prepare_cached(
        "INSERT INTO tasks (run_id, task_id, position, state, item) VALUES (?1, ?2, ?3, 'pending', ?4)",
    )?;
    for (i, item) in items.iter().enumerate() {
        let id = dagcron_core::fan_out::instance_id(task, i);
        insert.execute(params![run, id, next + i as i64, item])?;
    }
    Ok(WriteResult::Done)
}

/// Applies a batch. Planned ([`crate::plan`]) when it can be, in
/// the batch's order: successive changes of one row as one compare-and-set
/// from the first state to the last, applied where the first of them is,
/// and the changes of a new run's tasks that follow its insert in the
/// batch applied by the insert (each task inserted in the state they leave
/// it in). Otherwise (a batch the engine does not produce), or when
/// `grouped` is off, one write at a time, with the same results.
pub(crate) fn apply_batch(
    tx: &Transaction<'_>,
    batch: &[Write],
    grouped: bool,
) -> rusqlite::Result<Vec<WriteResult>> {
    let mut results = match grouped.then(|| plan(batch)).flatten() {
        Some(plan) => apply_planned(tx, batch, &plan)?,
        None => batch
            .iter()
            .map(|w| apply(tx, w))
            .collect::<rusqlite::Result<Vec<_>>>()?,
    };
    // Breakers and SLA misses last, over what the batch's other writes left.
    for (w, result) in batch.iter().zip(&mut results) {
        match w {
            Write::Breaker(b) => *result = breaker(tx, b)?,
            Write::SlaMissed {
                namespace,
                job,
                scheduled_at,
                at,
                notifications,
            } => {
                let n = tx
                    .prepare_cached(dagcron_store::breaker::SLA_MISSED)?
                    .execute(params![
                        at.as_microsecond(),
                        namespace,
                        job,
                        scheduled_at.as_microsecond()
                    ])?;
                *result = if n == 1 {
                    for note in notifications {
                        apply(tx, &Write::Notify(note.clone()))?;
                    }
                    WriteResult::Done
                } else {
                    WriteResult::sla_recorded(namespace, job, *scheduled_at)
                };
            }
            _ => {}
        }
    }
    Ok(results)
}

/// Applies a change of a job's failure breaker (see [`Write::Breaker`]).
fn breaker(tx: &Transaction<'_>, b: &BreakerWrite) -> rusqlite::Result<WriteResult> {
    use dagcron_store::breaker::{CLOSE, LATEST, OPEN, STATE};
    let state: Option<(bool, i64)> = tx
        .prepare_cached(STATE)?
        .query_row(params![b.namespace, b.job], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((open, from)) = state else {
        return Ok(WriteResult::Conflict(format!(
            "no job {}/{}",
            b.namespace, b.job
        )));
    };
    match b.open {
        Some(_) if open => {
            return Ok(WriteResult::breaker_unchanged(&b.namespace, &b.job, "open"));
        }
        Some((run, after)) => {
            let mut latest = Vec::new();
            let mut stmt = tx.prepare_cached(LATEST)?;
            let mut rows = stmt.query(params![b.namespace, b.job, from, after])?;
            while let Some(r) = rows.next()? {
                let state: String = r.get(0)?;
                latest.extend(state.parse::<RunState>().ok());
            }
            if !dagcron_core::breaker::opens(&latest, after) {
                return Ok(WriteResult::breaker_unchanged(
                    &b.namespace,
                    &b.job,
                    "closed",
                ));
            }
            tx.prepare_cached(OPEN)?.execute(params![
                b.at.as_microsecond(),
                run,
                after,
                b.namespace,
                b.job
            ])?;
        }
        None if !open => {
            return Ok(WriteResult::breaker_unchanged(
                &b.namespace,
                &b.job,
                "closed",
            ));
        }
        None => {
            tx.prepare_cached(CLOSE)?
                .execute(params![b.namespace, b.job])?;
        }
    }
    for n in &b.notifications {
        apply(tx, &Write::Notify(n.clone()))?;
    }
    Ok(WriteResult::Done)
}

fn apply_planned(
    tx: &Transaction<'_>,
    batch: &[Write],
    plan: &Plan<'_>,
) -> rusqlite::Result<Vec<WriteResult>> {
    let mut results: Vec<Option<WriteResult>> = vec![None; batch.len()];
    // The chain that starts at each write.
    let mut run_at = vec![None; batch.len()];
    for (k, (_, chain)) in plan.runs.iter().enumerate() {
        run_at[chain.writes[0]] = Some(k);
    }
    let mut task_at = vec![None; batch.len()];
    for (k, (_, chain)) in plan.tasks.iter().enumerate() {
        task_at[chain.writes[0]] = Some(k);
    }
    let mut folded = vec![false; plan.tasks.len()];
    let mut insert =
        |tx: &Transaction<'_>, run: &NewRun, i: usize, results: &mut [Option<WriteResult>]| {
            let states = plan.inserted_task_states(run, i, &mut folded);
            let task_states: Vec<TaskState> = states.iter().map(|(s, _)| *s).collect();
            insert_run_as(tx, run, &task_states)?;
            for k in states.into_iter().filter_map(|(_, k)| k) {
                for &j in &plan.tasks[k].1.writes {
                    results[j] = Some(WriteResult::Done);
                }
            }
            Ok::<(), rusqlite::Error>(())
        };
    for (i, w) in batch.iter().enumerate() {
        if results[i].is_some() {
            // Applied with the chain it belongs to, or by an insert.
            continue;
        }
        let result = match w {
            Write::Fire {
                namespace,
                job,
                scheduled_at,
                outcome,
                calendar,
                run: Some(run),
            } => {
                if !insert_fire(
                    tx,
                    namespace,
                    job,
                    *scheduled_at,
                    *outcome,
                    calendar.as_deref(),
                    Some(run.id),
                )? {
                    WriteResult::fire_recorded(namespace, job, *scheduled_at)
                } else {
                    insert(tx, run, i, &mut results)?;
                    WriteResult::Done
                }
            }
            Write::Run(run) => {
                insert(tx, run, i, &mut results)?;
                WriteResult::Done
            }
            Write::RunState { run, .. } => {
                let (_, chain) = &plan.runs[run_at[i].expect("a chain starts here")];
                let n = tx.prepare_cached(SET_RUN_STATE)?.execute(params![
                    chain.to.name(),
                    chain.started,
                    chain.finished,
                    run,
                    chain.from.name()
                ])?;
                let result = if n == 1 {
                    WriteResult::Done
                } else {
                    let found: Option<String> = tx
                        .prepare_cached("SELECT state FROM runs WHERE id = ?1")?
                        .query_row(params![run], |r| r.get(0))
                        .optional()?;
                    WriteResult::run_conflict(*run, found.as_deref(), chain.from)
                };
                for &j in &chain.writes {
                    results[j] = Some(result.clone());
                }
                continue;
            }
            Write::TaskState { run, task, .. } => {
                let (_, chain) = &plan.tasks[task_at[i].expect("a chain starts here")];
                let result = set_task(tx, *run, task, chain.from, chain.to)?;
                for &j in &chain.writes {
                    results[j] = Some(result.clone());
                }
                continue;
            }
            _ => apply(tx, w)?,
        };
        results[i] = Some(result);
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every write has a result"))
        .collect())
}

/// Records a fire in the ledger; `false` if it was recorded already.
fn insert_fire(
    tx: &Transaction<'_>,
    namespace: &str,
    job: &str,
    scheduled_at: Timestamp,
    outcome: FireOutcome,
    calendar: Option<&str>,
    run: Option<i64>,
) -> rusqlite::Result<bool> {
    let n = tx
        .prepare_cached("INSERT INTO fires (namespace, job, scheduled_at, outcome, run_id, calendar) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING")?
        .execute(params![namespace, job, scheduled_at.as_microsecond(), outcome.as_str(), run, calendar])?;
    Ok(n == 1)
}

/// Changes a task's state if it is still `from`.
fn set_task(
    tx: &Transaction<'_>,
    run: i64,
    task: &str,
    from: TaskState,
    to: TaskState,
) -> rusqlite::Result<WriteResult> {
    let n = tx
        .prepare_cached(
            "UPDATE tasks SET state = ?1 WHERE run_id = ?2 AND task_id = ?3 AND state = ?4",
        )?
        .execute(params![to.as_str(), run, task, from.as_str()])?;
    if n == 1 {
        return Ok(WriteResult::Done);
    }
    let found: Option<String> = tx
        .prepare_cached("SELECT state FROM tasks WHERE run_id = ?1 AND task_id = ?2")?
        .query_row(params![run, task], |r| r.get(0))
        .optional()?;
    Ok(WriteResult::task_conflict(
        run,
        task,
        found.as_deref(),
        from,
    ))
}

/// Applies one write; a refused compare-and-set says what it found.
pub(crate) fn apply(tx: &Transaction<'_>, w: &Write) -> rusqlite::Result<WriteResult> {
    match w {
        Write::Fire {
            namespace,
            job,
            scheduled_at,
            outcome,
            calendar,
            run,
        } => {
            if !insert_fire(
                tx,
                namespace,
                job,
                *scheduled_at,
                *outcome,
                calendar.as_deref(),
                run.as_ref().map(|r| r.id),
            )? {
                return Ok(WriteResult::fire_recorded(namespace, job, *scheduled_at));
            }
            if let Some(run) = run {
                insert_run(tx, run)?;
            }
            Ok(WriteResult::Done)
        }
        Write::Run(run) => {
            if let Some(key) = &run.key {
                let n = tx
                    .prepare_cached(dagcron_store::outbox::INSERT_RUN_KEY)?
                    .execute(params![
                        run.namespace,
                        run.job,
                        key,
                        run.id,
                        run.created_at.as_microsecond()
                    ])?;
                if n == 0 {
                    return Ok(WriteResult::run_key_taken(run));
                }
            }
            insert_run(tx, run)?;
            Ok(WriteResult::Done)
        }
        Write::RunClosing { run, to } => {
            let n = tx
                .prepare_cached("UPDATE runs SET closing = ?1 WHERE id = ?2")?
                .execute(params![to.as_str(), run])?;
            Ok(if n == 1 {
                WriteResult::Done
            } else {
                WriteResult::no_run(*run)
            })
        }
        Write::RunState { run, from, to, at } => {
            let n = tx
                .prepare_cached(concat!(
                    "UPDATE runs SET state = ?1,
                        started_at = CASE WHEN ?1 = 'running' THEN ?2 ELSE started_at END,
                        finished_at = CASE WHEN ?1 IN ",
                    dagcron_store::run_ended!(),
                    " THEN ?2 ELSE finished_at END
                     WHERE id = ?3 AND state = ?4"
                ))?
                .execute(params![
                    to.as_str(),
                    at.as_microsecond(),
                    run,
                    from.as_str()
                ])?;
            if n == 1 {
                return Ok(WriteResult::Done);
            }
            let found: Option<String> = tx
                .prepare_cached("SELECT state FROM runs WHERE id = ?1")?
                .query_row(params![run], |r| r.get(0))
                .optional()?;
            Ok(WriteResult::run_conflict(*run, found.as_deref(), *from))
        }
        Write::TaskState {
            run,
            task,
            from,
            to,
        } => set_task(tx, *run, task, *from, *to),
        Write::AttemptStart {
            run,
            task,
            number,
            state,
            at,
            ..
        } => {
            let n = tx
                .prepare_cached("INSERT INTO attempts (run_id, task_id, number, state, started_at) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING")?
                .execute(params![run, task, number, state.as_str(), at.as_microsecond()])?;
            Ok(if n == 1 {
                WriteResult::Done
            } else {
                WriteResult::attempt_exists(*run, task, number)
            })
        }
        Write::AttemptEnd {
            run,
            task,
            number,
            from,
            to,
            at,
            exit_code,
            error,
            log,
            lines,
            start_error_us,
            outputs,
            ..
        } => {
            let outputs = (!outputs.is_empty())
                .then(|| serde_json::to_string(outputs).expect("outputs serialize"));
            let n = tx
                .prepare_cached(
                    "UPDATE attempts SET state = ?1, finished_at = ?2, exit_code = ?3, error = ?4, log = ?5, start_error_us = ?10, log_lines = ?11, outputs = ?12
                     WHERE run_id = ?6 AND task_id = ?7 AND number = ?8 AND state = ?9",
                )?
                .execute(params![to.as_str(), at.as_microsecond(), exit_code, error, log, run, task, number, from.as_str(), start_error_us, (!lines.is_empty()).then_some(lines), outputs])?;
            Ok(if n == 1 {
                WriteResult::Done
            } else {
                WriteResult::attempt_conflict(*run, task, number, from.as_str())
            })
        }
        Write::AttemptWithdraw {
            run,
            task,
            number,
            at,
        } => {
            tx.prepare_cached(concat!(
                "UPDATE attempts SET state = 'cancelled', finished_at = ?1, error = ?2
                 WHERE run_id = ?3 AND task_id = ?4 AND number = ?5 AND state IN ",
                dagcron_store::attempt_unfinished!()
            ))?
            .execute(params![
                at.as_microsecond(),
                dagcron_store::WITHDRAWN,
                run,
                task,
                number
            ])?;
            tx.prepare_cached(concat!(
                "UPDATE tasks SET state = 'cancelled' WHERE run_id = ?1 AND task_id = ?2 AND state IN ",
                dagcron_store::attempt_unfinished!()
            ))?
            .execute(params![run, task])?;
            Ok(WriteResult::Done)
        }
        Write::Expand { run, task, items } => expand(tx, *run, task, items),
        Write::Gathered {
            run,
            task,
            note,
            outputs,
        } => {
            let outputs = (!outputs.is_empty())
                .then(|| serde_json::to_string(outputs).expect("outputs serialize"));
            tx.prepare_cached(
                "UPDATE tasks SET note = coalesce(?1, note), outputs = ?2 WHERE run_id = ?3 AND task_id = ?4",
            )?
            .execute(params![note, outputs, run, task])?;
            Ok(WriteResult::Done)
        }
        // Applied by `apply_batch`, after the batch's other writes.
        Write::Breaker(_) | Write::SlaMissed { .. } => Ok(WriteResult::Done),
        Write::Notify(n) => {
            tx.prepare_cached(
                "INSERT INTO notifications (key, namespace, job, run_id, event, notifier, channel, payload, created_at, next_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9) ON CONFLICT (key) DO NOTHING",
            )?
            .execute(params![
                n.key,
                n.namespace,
                n.job,
                n.run,
                n.event,
                n.notifier,
                n.channel,
                n.payload,
                n.at.as_microsecond()
            ])?;
            Ok(WriteResult::Done)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The opcodes of `sql` as SQLite compiles it on a migrated database.
    fn opcodes(conn: &Connection, sql: &str) -> Vec<String> {
        let mut explain = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        // Unbound parameters are NULL: compiling needs no values.
        let mut rows = explain.raw_query();
        let mut ops = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            ops.push(row.get(1).unwrap());
        }
        ops
    }

    /// Inserting a run and changing its state opened a temporary table at
    /// every execution, to evaluate the `IN` list of a partial index's
    /// predicate (four to six percent of the writer's time in a burst).
    /// With the predicates written as equalities, they open none.
    #[tokio::test]
    async fn writing_a_run_opens_no_temporary_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        drop(crate::SqliteStore::open(&path).await.unwrap());
        let conn = Connection::open(&path).unwrap();
        for sql in [INSERT_RUN, SET_RUN_STATE] {
            let ops = opcodes(&conn, sql);
            assert!(ops.iter().any(|op| op == "IdxInsert"), "{sql}: {ops:?}");
            assert!(
                !ops.iter().any(|op| op == "OpenEphemeral"),
                "{sql}: {ops:?}"
            );
        }
    }
}
