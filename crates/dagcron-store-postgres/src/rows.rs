//! A run as one row.
//!
//! A run's tasks and their attempts live in the run's row (`runs.tasks`, as
//! JSON), so a run is written once when it starts and once when it ends,
//! whatever changes of its tasks and attempts lie between. A write batch
//! reads the rows it changes, applies its writes to them here (the same
//! compare-and-set meaning as a statement per write: a change whose
//! expected state is not the one found is refused and says what it found),
//! and writes each row back only if no one changed it since it was read
//! (its `rev`). A row someone changed meanwhile (another node claimed one
//! of its attempts, or ended one it ran for the run's owner) is read again
//! and its writes applied again: a run's writes depend on that run's row
//! alone.
//!
//! Captured output is kept apart (`attempt_logs`), and so is the queue of
//! attempts handed to the cluster (`shared_attempts`).

use std::collections::BTreeMap;

use dagcron_core::{AttemptState, RunState, TaskState};
use dagcron_store::{AttemptRecord, NewRun, RunId, StorageError, TaskRecord, Write, WriteResult};
use serde::{Deserialize, Serialize};
use sqlx::Row as _;
use sqlx::postgres::PgConnection;

/// A task as stored in its run's row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Task {
    pub id: String,
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carried: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
}

/// An attempt as stored in its run's row (its output apart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Attempt {
    pub number: u32,
    pub state: AttemptState,
    pub started_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The node that ran it; none while it waits in the cluster's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_epoch: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error_us: Option<i64>,
}

impl Task {
    pub(crate) fn record(self) -> Result<TaskRecord, StorageError> {
        Ok(TaskRecord {
            id: self.id,
            state: self.state,
            carried: self.carried,
            attempts: self
                .attempts
                .into_iter()
                .map(|a| {
                    Ok(AttemptRecord {
                        number: a.number,
                        state: a.state,
                        started_at: crate::ts(a.started_at)?,
                        finished_at: crate::opt_ts(a.finished_at)?,
                        exit_code: a.exit_code,
                        error: a.error,
                        node_epoch: a.node_epoch,
                        start_error_us: a.start_error_us,
                    })
                })
                .collect::<Result<_, StorageError>>()?,
        })
    }

    fn attempt_mut(&mut self, number: u32) -> Option<&mut Attempt> {
        self.attempts.iter_mut().find(|a| a.number == number)
    }
}

/// A run's tasks from their stored JSON.
pub(crate) fn parse_tasks(run: RunId, json: &str) -> Result<Vec<Task>, StorageError> {
    serde_json::from_str(json).map_err(|e| StorageError::Corrupt(format!("run {run} tasks: {e}")))
}

/// Attempt `number` of task `task` among a run's tasks.
pub(crate) fn find_attempt<'t>(tasks: &'t [Task], task: &str, number: u32) -> Option<&'t Attempt> {
    tasks
        .iter()
        .find(|t| t.id == task)
        .and_then(|t| t.attempts.iter().find(|a| a.number == number))
}

fn tasks_json(tasks: &[Task]) -> String {
    serde_json::to_string(tasks).expect("tasks serialize")
}

/// The part of a run's row that writes change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub id: RunId,
    /// The row's change count as read; none for a run this batch inserts.
    rev: Option<i64>,
    pub state: RunState,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub closing: Option<RunState>,
    pub tasks: Vec<Task>,
    changed: bool,
}

impl Row {
    /// A new run's row, as it is inserted.
    pub(crate) fn new(run: &NewRun) -> Row {
        let created = run.created_at.as_microsecond();
        Row {
            id: run.id,
            rev: None,
            state: run.state,
            started_at: (run.state == RunState::Running).then_some(created),
            finished_at: run.state.is_terminal().then_some(created),
            closing: None,
            tasks: run
                .tasks
                .iter()
                .map(|t| Task {
                    id: t.clone(),
                    state: run.task_start(t),
                    carried: run.carried.contains_key(t),
                    attempts: vec![],
                })
                .collect(),
            changed: true,
        }
    }

    fn task_mut(&mut self, task: &str) -> Option<&mut Task> {
        self.tasks.iter_mut().find(|t| t.id == task)
    }

    pub(crate) fn tasks_json(&self) -> String {
        tasks_json(&self.tasks)
    }
}

/// What a batch does besides its runs' rows, by run.
#[derive(Debug, Default)]
pub(crate) struct Effects<'a> {
    /// Output of ended attempts: run, task, number, output.
    pub logs: Vec<(RunId, &'a str, u32, &'a [u8])>,
    /// Attempts handed to the cluster: run, task, number, instant, labels.
    pub queued: Vec<(RunId, &'a str, u32, i64, Option<String>)>,
    /// Attempts that left the cluster's queue unclaimed (ended or withdrawn).
    pub unqueued: Vec<(RunId, &'a str, u32)>,
    /// An attempt run for another node's run ended: its owner is told.
    pub ended_for_others: Vec<RunId>,
}

impl<'a> Effects<'a> {
    /// Takes in what the writes of other runs did.
    pub(crate) fn absorb(&mut self, mut other: Effects<'a>) {
        self.logs.append(&mut other.logs);
        self.queued.append(&mut other.queued);
        self.unqueued.append(&mut other.unqueued);
        self.ended_for_others.append(&mut other.ended_for_others);
    }

    /// Forgets what the writes of `runs` did, to apply them again.
    /// `runs` is sorted.
    pub(crate) fn forget(&mut self, runs: &[RunId]) {
        let kept = |r: &RunId| runs.binary_search(r).is_err();
        self.logs.retain(|e| kept(&e.0));
        self.queued.retain(|e| kept(&e.0));
        self.unqueued.retain(|e| kept(&e.0));
        self.ended_for_others.retain(kept);
    }
}

/// The run a write changes (other than by inserting it).
pub(crate) fn run_of(w: &Write) -> Option<RunId> {
    match w {
        Write::Fire { .. } | Write::Run(_) => None,
        _ => w.run_id(),
    }
}

/// Applies `w` (any write but an insert of a run) to `row`, the row of its
/// run if it exists; `epoch` is the writing node's.
pub(crate) fn apply<'a>(
    row: Option<&mut Row>,
    w: &'a Write,
    epoch: Option<i64>,
    effects: &mut Effects<'a>,
) -> WriteResult {
    match (w, row) {
        (Write::Fire { .. } | Write::Run(_), _) => unreachable!("inserts are not applied to rows"),
        (Write::RunState { run, from, .. }, None) => WriteResult::run_conflict(*run, None, *from),
        (Write::RunClosing { run, .. }, None) => WriteResult::no_run(*run),
        (
            Write::TaskState {
                run, task, from, ..
            },
            None,
        ) => WriteResult::task_conflict(*run, task, None, *from),
        (
            Write::AttemptStart {
                run, task, number, ..
            },
            None,
        ) => no_task(*run, task, *number),
        // Always done: there is nothing left to stop.
        (Write::AttemptWithdraw { .. }, None) => WriteResult::Done,
        (
            Write::AttemptEnd {
                run,
                task,
                number,
                from,
                ..
            },
            None,
        ) => WriteResult::attempt_conflict(*run, task, number, from.as_str()),
        (Write::RunState { run, from, to, at }, Some(row)) => {
            if row.state != *from {
                return WriteResult::run_conflict(*run, Some(row.state.as_str()), *from);
            }
            let at = at.as_microsecond();
            row.state = *to;
            if *to == RunState::Running {
                row.started_at = Some(at);
            }
            if to.is_terminal() {
                row.finished_at = Some(at);
            }
            row.changed = true;
            WriteResult::Done
        }
        (Write::RunClosing { to, .. }, Some(row)) => {
            row.closing = Some(*to);
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::TaskState {
                run,
                task,
                from,
                to,
            },
            Some(row),
        ) => {
            let Some(t) = row.task_mut(task) else {
                return WriteResult::task_conflict(*run, task, None, *from);
            };
            if t.state != *from {
                return WriteResult::task_conflict(*run, task, Some(t.state.as_str()), *from);
            }
            t.state = *to;
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::AttemptStart {
                run,
                task,
                number,
                state,
                at,
                run_on,
            },
            Some(row),
        ) => {
            let Some(t) = row.task_mut(task) else {
                return no_task(*run, task, *number);
            };
            if t.attempt_mut(*number).is_some() {
                return WriteResult::attempt_exists(*run, task, number);
            }
            let shared = *state == AttemptState::Dispatching;
            let at = at.as_microsecond();
            t.attempts.push(Attempt {
                number: *number,
                state: *state,
                started_at: at,
                finished_at: None,
                exit_code: None,
                error: None,
                // An attempt handed to the cluster has no node until one claims it.
                node_epoch: epoch.filter(|_| !shared),
                start_error_us: None,
            });
            t.attempts.sort_by_key(|a| a.number);
            if shared {
                let labels = run_on.as_ref().map(crate::labels_json);
                effects.queued.push((*run, task, *number, at, labels));
            }
            row.changed = true;
            WriteResult::Done
        }
        (
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
                start_error_us,
                for_other_node,
            },
            Some(row),
        ) => {
            let Some(a) = row
                .task_mut(task)
                .and_then(|t| t.attempt_mut(*number))
                .filter(|a| a.state == *from)
            else {
                return WriteResult::attempt_conflict(*run, task, number, from.as_str());
            };
            if a.node_epoch.is_none() && a.state == AttemptState::Dispatching {
                effects.unqueued.push((*run, task, *number));
            }
            a.state = *to;
            a.finished_at = Some(at.as_microsecond());
            a.exit_code = *exit_code;
            a.error.clone_from(error);
            a.start_error_us = *start_error_us;
            if !log.is_empty() {
                effects.logs.push((*run, task, *number, log));
            }
            if *for_other_node {
                effects.ended_for_others.push(*run);
            }
            row.changed = true;
            WriteResult::Done
        }
        (
            Write::AttemptWithdraw {
                run,
                task,
                number,
                at,
            },
            Some(row),
        ) => {
            let Some(t) = row.task_mut(task) else {
                return WriteResult::Done;
            };
            let unfinished =
                |s: AttemptState| matches!(s, AttemptState::Dispatching | AttemptState::Running);
            let mut changed = false;
            if let Some(a) = t.attempt_mut(*number).filter(|a| unfinished(a.state)) {
                if a.node_epoch.is_none() && a.state == AttemptState::Dispatching {
                    effects.unqueued.push((*run, task, *number));
                }
                a.state = AttemptState::Cancelled;
                a.finished_at = Some(at.as_microsecond());
                a.error = Some(dagcron_store::WITHDRAWN.to_string());
                changed = true;
            }
            if matches!(t.state, TaskState::Dispatching | TaskState::Running) {
                t.state = TaskState::Cancelled;
                changed = true;
            }
            row.changed |= changed;
            WriteResult::Done
        }
    }
}

fn no_task(run: RunId, task: &str, number: u32) -> WriteResult {
    WriteResult::Conflict(format!(
        "attempt {number} of {run}/{task}: run {run} has no task {task}"
    ))
}

/// Claims a waiting attempt of `row` for node `epoch`: it runs there from
/// `at`. False if it no longer waits (withdrawn or ended meanwhile).
pub(crate) fn claim(row: &mut Row, task: &str, number: u32, epoch: i64, at: i64) -> bool {
    let Some(t) = row.task_mut(task) else {
        return false;
    };
    let Some(a) = t
        .attempt_mut(number)
        .filter(|a| a.state == AttemptState::Dispatching && a.node_epoch.is_none())
    else {
        return false;
    };
    a.state = AttemptState::Running;
    a.node_epoch = Some(epoch);
    a.started_at = at;
    if t.state == TaskState::Dispatching {
        t.state = TaskState::Running;
    }
    row.changed = true;
    true
}

/// The rows of runs `ids` that exist, as they are now.
pub(crate) async fn load(
    conn: &mut PgConnection,
    ids: &[RunId],
) -> Result<BTreeMap<RunId, Row>, sqlx::Error> {
    let mut out = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let rows = sqlx::query(
        "SELECT id, rev, state, started_at, finished_at, closing, tasks FROM runs WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    for r in rows {
        let id: RunId = r.get(0);
        let corrupt = |e: StorageError| sqlx::Error::Decode(Box::new(e));
        let state = crate::parse(r.get::<&str, _>(2)).map_err(corrupt)?;
        let closing = r
            .get::<Option<&str>, _>(5)
            .map(crate::parse)
            .transpose()
            .map_err(corrupt)?;
        out.insert(
            id,
            Row {
                id,
                rev: Some(r.get(1)),
                state,
                started_at: r.get(3),
                finished_at: r.get(4),
                closing,
                tasks: parse_tasks(id, r.get(6)).map_err(corrupt)?,
                changed: false,
            },
        );
    }
    Ok(out)
}

/// Writes back the changed rows of `rows` that were read (not inserted),
/// each only if no one changed it since; returns the ids of those someone
/// did. In order of id, so that batches over the same runs lock them in
/// the same order.
pub(crate) async fn save(
    conn: &mut PgConnection,
    rows: &BTreeMap<RunId, Row>,
    sent: &mut u64,
) -> Result<Vec<RunId>, sqlx::Error> {
    let changed: Vec<&Row> = rows
        .values()
        .filter(|r| r.changed && r.rev.is_some())
        .collect();
    if changed.is_empty() {
        return Ok(vec![]);
    }
    *sent += 1;
    let saved: Vec<RunId> = sqlx::query_scalar(
        "UPDATE runs r SET rev = r.rev + 1, state = v.st, started_at = v.sa, finished_at = v.fa, closing = v.cl, tasks = v.tk
         FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::text[])
            AS v(id, rev, st, sa, fa, cl, tk)
         WHERE r.id = v.id AND r.rev = v.rev RETURNING r.id",
    )
    .bind(changed.iter().map(|r| r.id).collect::<Vec<_>>())
    .bind(changed.iter().map(|r| r.rev).collect::<Vec<_>>())
    .bind(changed.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
    .bind(changed.iter().map(|r| r.started_at).collect::<Vec<_>>())
    .bind(changed.iter().map(|r| r.finished_at).collect::<Vec<_>>())
    .bind(
        changed
            .iter()
            .map(|r| r.closing.map(RunState::as_str))
            .collect::<Vec<_>>(),
    )
    .bind(changed.iter().map(|r| r.tasks_json()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let saved: std::collections::HashSet<RunId> = saved.into_iter().collect();
    Ok(changed
        .iter()
        .map(|r| r.id)
        .filter(|id| !saved.contains(id))
        .collect())
}

/// Puts attempts in the cluster's queue and takes the ones that left it
/// unclaimed out; before the runs' rows are written, so that a node
/// claiming from the queue (which takes the queue's rows first, then the
/// runs') never waits for this batch while holding what it waits for.
pub(crate) async fn queue(
    conn: &mut PgConnection,
    effects: &Effects<'_>,
    sent: &mut u64,
) -> Result<(), sqlx::Error> {
    if !effects.queued.is_empty() {
        *sent += 1;
        let q = &effects.queued;
        sqlx::query(
            "INSERT INTO shared_attempts (run_id, task_id, number, queued_at, run_on)
             SELECT r, t, n, a, o::jsonb FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bigint[], $5::text[]) AS v(r, t, n, a, o)
             ON CONFLICT DO NOTHING",
        )
        .bind(q.iter().map(|e| e.0).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.1).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.2 as i32).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.3).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.4.as_deref()).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    if !effects.unqueued.is_empty() {
        *sent += 1;
        let q = &effects.unqueued;
        // Node 0 (no node has that epoch): out of the queue, run nowhere.
        sqlx::query(
            "UPDATE shared_attempts s SET node_epoch = 0
             FROM unnest($1::bigint[], $2::text[], $3::int[]) AS v(r, t, n)
             WHERE s.run_id = v.r AND s.task_id = v.t AND s.number = v.n AND s.node_epoch IS NULL",
        )
        .bind(q.iter().map(|e| e.0).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.1).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.2 as i32).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Keeps the output of the attempts that ended.
pub(crate) async fn keep_logs(
    conn: &mut PgConnection,
    effects: &Effects<'_>,
    sent: &mut u64,
) -> Result<(), sqlx::Error> {
    if effects.logs.is_empty() {
        return Ok(());
    }
    *sent += 1;
    let l = &effects.logs;
    sqlx::query(
        "INSERT INTO attempt_logs (run_id, task_id, number, log)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bytea[])
         ON CONFLICT (run_id, task_id, number) DO UPDATE SET log = EXCLUDED.log",
    )
    .bind(l.iter().map(|e| e.0).collect::<Vec<_>>())
    .bind(l.iter().map(|e| e.1).collect::<Vec<_>>())
    .bind(l.iter().map(|e| e.2 as i32).collect::<Vec<_>>())
    .bind(l.iter().map(|e| e.3).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    fn run() -> Row {
        Row::new(&NewRun {
            id: 1,
            namespace: "ns".into(),
            job: "j".into(),
            job_version: 1,
            trigger: dagcron_store::Trigger::Manual,
            scheduled_at: Timestamp::from_second(1).unwrap(),
            params: BTreeMap::new(),
            state: RunState::Running,
            tasks: vec!["a".into(), "b".into()],
            created_at: Timestamp::from_second(1).unwrap(),
            trace: None,
            rerun_of: None,
            carried: BTreeMap::new(),
        })
    }

    fn start(task: &str, state: AttemptState) -> Write {
        Write::AttemptStart {
            run: 1,
            task: task.into(),
            number: 1,
            state,
            at: Timestamp::from_second(2).unwrap(),
            run_on: None,
        }
    }

    async fn execute(conn: &mut sqlx::PgConnection, sql: String) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(conn)
            .await
            .unwrap();
    }

    /// Migration 0020 on a database of the layout before it: each run's
    /// tasks and attempts move into its row, outputs and the cluster's
    /// queue into their tables, and the views read them as before.
    #[tokio::test]
    async fn the_migration_moves_tasks_and_attempts_into_their_runs() {
        use sqlx::Connection;
        let db = dagcron_test_pg::TestDatabase::create("one_row_migration").await;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let (before, this): (Vec<_>, Vec<_>) = files
            .into_iter()
            .partition(|f| f.file_name().unwrap().to_str().unwrap() < "0020");
        assert!(this[0].ends_with("0020_run_as_one_row.sql"), "{this:?}");
        for f in &before {
            execute(&mut conn, std::fs::read_to_string(f).unwrap()).await;
        }
        execute(
            &mut conn,
            "INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, owner_epoch)
             VALUES (1, 'n', 'j', 1, 'manual', 0, 'running', '{}', 0, 5), (2, 'n', 'j', 1, 'manual', 0, 'skipped', '{}', 0, 5);
             INSERT INTO tasks (run_id, task_id, position, state, carried) VALUES
                (1, 'a', 0, 'succeeded', FALSE), (1, 'b', 1, 'succeeded', TRUE),
                (1, 'c', 2, 'running', FALSE), (1, 'd', 3, 'dispatching', FALSE);
             INSERT INTO attempts (run_id, task_id, number, state, started_at, finished_at, exit_code, error, log, node_epoch, start_error_us, run_on) VALUES
                (1, 'a', 1, 'failed', 10, 20, 3, 'exit 3', 'oops', 5, 7, NULL),
                (1, 'a', 2, 'succeeded', 30, 40, 0, NULL, '', 5, NULL, NULL),
                (1, 'c', 1, 'running', 50, NULL, NULL, NULL, NULL, 6, NULL, NULL),
                (1, 'd', 1, 'dispatching', 60, NULL, NULL, NULL, NULL, NULL, NULL, '{\"gpu\": \"yes\"}');"
                .into(),
        )
        .await;
        execute(&mut conn, std::fs::read_to_string(&this[0]).unwrap()).await;

        let tasks: Vec<(i64, String)> = sqlx::query_as("SELECT id, tasks FROM runs ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(tasks[1], (2, "[]".to_string()), "a run with no task");
        let tasks = parse_tasks(1, &tasks[0].1).unwrap();
        let attempt = |number, state, started_at, finished_at, node_epoch| Attempt {
            number,
            state,
            started_at,
            finished_at,
            exit_code: None,
            error: None,
            node_epoch,
            start_error_us: None,
        };
        let task = |id: &str, state, carried, attempts| Task {
            id: id.into(),
            state,
            carried,
            attempts,
        };
        let failed = Attempt {
            exit_code: Some(3),
            error: Some("exit 3".into()),
            start_error_us: Some(7),
            ..attempt(1, AttemptState::Failed, 10, Some(20), Some(5))
        };
        let succeeded = Attempt {
            exit_code: Some(0),
            ..attempt(2, AttemptState::Succeeded, 30, Some(40), Some(5))
        };
        assert_eq!(
            tasks,
            [
                task("a", TaskState::Succeeded, false, vec![failed, succeeded]),
                task("b", TaskState::Succeeded, true, vec![]),
                task(
                    "c",
                    TaskState::Running,
                    false,
                    vec![attempt(1, AttemptState::Running, 50, None, Some(6))]
                ),
                task(
                    "d",
                    TaskState::Dispatching,
                    false,
                    vec![attempt(1, AttemptState::Dispatching, 60, None, None)]
                ),
            ]
        );
        let logs: Vec<(String, i32, Vec<u8>)> =
            sqlx::query_as("SELECT task_id, number, log FROM attempt_logs")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(logs, [("a".to_string(), 1, b"oops".to_vec())]);
        let shared: Vec<(String, Option<i64>, Option<String>)> = sqlx::query_as(
            "SELECT task_id, node_epoch, run_on::text FROM shared_attempts ORDER BY task_id",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            shared,
            [
                ("c".to_string(), Some(6), None),
                (
                    "d".to_string(),
                    None,
                    Some("{\"gpu\": \"yes\"}".to_string())
                )
            ]
        );
        let counts: (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM attempts),
                    (SELECT count(*) FROM attempts WHERE log = 'oops' AND state = 'failed' AND node_epoch = 5)",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(counts, (4, 4, 1), "the views read what the tables held");
    }

    #[test]
    fn tasks_round_trip_through_their_json() {
        let mut row = run();
        let mut effects = Effects::default();
        let w = start("a", AttemptState::Running);
        assert_eq!(
            apply(Some(&mut row), &w, Some(7), &mut effects),
            WriteResult::Done
        );
        let json = row.tasks_json();
        assert_eq!(parse_tasks(1, &json).unwrap(), row.tasks);
        assert!(
            !json.contains("null") && !json.contains("carried"),
            "absent fields are left out: {json}"
        );
        assert!(parse_tasks(1, "[{\"id\":\"a\",\"state\":\"bogus\"}]").is_err());
    }

    #[test]
    fn an_attempt_handed_to_the_cluster_is_queued_and_leaves_the_queue_once() {
        let mut row = run();
        let mut effects = Effects::default();
        let w = start("b", AttemptState::Dispatching);
        apply(Some(&mut row), &w, Some(7), &mut effects);
        assert_eq!(effects.queued.len(), 1);
        assert_eq!(row.tasks[1].attempts[0].node_epoch, None);
        let withdraw = Write::AttemptWithdraw {
            run: 1,
            task: "b".into(),
            number: 1,
            at: Timestamp::from_second(3).unwrap(),
        };
        apply(Some(&mut row), &withdraw, Some(7), &mut effects);
        apply(Some(&mut row), &withdraw, Some(7), &mut effects);
        assert_eq!(effects.unqueued, [(1, "b", 1)]);
        assert_eq!(row.tasks[1].attempts[0].state, AttemptState::Cancelled);
        assert!(
            !claim(&mut row, "b", 1, 9, 4),
            "a withdrawn attempt is not claimed"
        );
    }

    #[test]
    fn a_claimed_attempt_runs_on_the_claiming_node() {
        let mut row = run();
        let mut effects = Effects::default();
        row.tasks[1].state = TaskState::Dispatching;
        apply(
            Some(&mut row),
            &start("b", AttemptState::Dispatching),
            Some(7),
            &mut effects,
        );
        assert!(claim(&mut row, "b", 1, 9, 4_000_000));
        let (t, a) = (&row.tasks[1], &row.tasks[1].attempts[0]);
        assert_eq!(
            (t.state, a.state, a.node_epoch),
            (TaskState::Running, AttemptState::Running, Some(9))
        );
        assert!(!claim(&mut row, "b", 1, 9, 4_000_000), "claimed once");
    }

    #[test]
    fn refused_changes_say_what_they_found_and_change_nothing() {
        let mut row = run();
        let before = row.clone();
        let mut effects = Effects::default();
        let to = |from, to| Write::TaskState {
            run: 1,
            task: "a".into(),
            from,
            to,
        };
        let ready_to_running = to(TaskState::Ready, TaskState::Running);
        let r = apply(Some(&mut row), &ready_to_running, None, &mut effects);
        assert_eq!(
            r,
            WriteResult::Conflict("task a of run 1 is pending, not ready".into())
        );
        let end = Write::AttemptEnd {
            run: 1,
            task: "a".into(),
            number: 1,
            from: AttemptState::Running,
            to: AttemptState::Succeeded,
            at: Timestamp::from_second(3).unwrap(),
            exit_code: Some(0),
            error: None,
            log: b"out".to_vec(),
            start_error_us: None,
            for_other_node: false,
        };
        assert!(matches!(
            apply(Some(&mut row), &end, None, &mut effects),
            WriteResult::Conflict(_)
        ));
        assert!(matches!(
            apply(None, &end, None, &mut effects),
            WriteResult::Conflict(_)
        ));
        assert_eq!(row, before);
        assert!(effects.logs.is_empty());
    }
}
