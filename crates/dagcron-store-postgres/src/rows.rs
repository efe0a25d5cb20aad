//! A run as one row in PostgreSQL.
//!
//! A run's tasks and their attempts live in the run's row (`runs.tasks`, as
//! JSON: [`dagcron_store::run_row`]), so a run is written once when it
//! starts and once when it ends, whatever changes of its tasks and attempts
//! lie between. A write batch reads the rows it changes, applies its writes
//! to them ([`run_row::apply`], the reference meaning of each write), and
//! writes each row back only if no one changed it since it was read (its
//! `rev`). A row someone changed meanwhile (another node claimed one of its
//! attempts, or ended one it ran for the run's owner) is read again and its
//! writes applied again: a run's writes depend on that run's row alone.
//!
//! Captured output is kept apart (`attempt_logs`), and so is the queue of
//! attempts handed to the cluster (`shared_attempts`).

use std::collections::BTreeMap;

use dagcron_core::RunState;
pub(crate) use dagcron_store::run_row::{
    Effects, Row, Task, apply, claim, find_attempt, parse_tasks, run_of,
};
use dagcron_store::{RunId, StorageError};
use sqlx::Row as _;
use sqlx::postgres::PgConnection;

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
            "INSERT INTO shared_attempts (run_id, task_id, number, queued_at, priority, run_on)
             SELECT r, t, n, a, p, o::jsonb FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bigint[], $5::int[], $6::text[]) AS v(r, t, n, a, p, o)
             ON CONFLICT DO NOTHING",
        )
        .bind(q.iter().map(|e| e.0).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.1).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.2 as i32).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.3).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.4).collect::<Vec<_>>())
        .bind(q.iter().map(|e| e.5.as_deref()).collect::<Vec<_>>())
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
        "INSERT INTO attempt_logs (run_id, task_id, number, log, lines)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bytea[], $5::bytea[])
         ON CONFLICT (run_id, task_id, number) DO UPDATE SET log = EXCLUDED.log, lines = EXCLUDED.lines",
    )
    .bind(l.iter().map(|e| e.0).collect::<Vec<_>>())
    .bind(l.iter().map(|e| e.1).collect::<Vec<_>>())
    .bind(l.iter().map(|e| e.2 as i32).collect::<Vec<_>>())
    .bind(l.iter().map(|e| e.3).collect::<Vec<_>>())
    .bind(l.iter().map(|e| e.4).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use dagcron_core::{AttemptState, TaskState};
    use dagcron_store::run_row::Attempt;

    use super::*;

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
            outputs: Default::default(),
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
            item: Default::default(),
            note: Default::default(),
            carried_outputs: Default::default(),
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
}
