//! The embedded storage backend: one SQLite file in WAL mode.
//!
//! Writes go through a single connection, so batches are serialized in the
//! process and never fight over SQLite's write lock; reads use a small pool
//! and see committed data only.
//!
//! # How it works
//!
//! The embedded backend: one SQLite file in WAL mode. Every write goes to one
//! connection on a dedicated thread (`writer.rs`): a batch crosses threads once
//! (shared with the engine, not copied: `RunStore::write_shared`) and runs as
//! cached prepared statements in one `BEGIN IMMEDIATE` transaction, planned
//! by `plan.rs` in the batch's order: a
//! row's successive changes are one compare-and-set, and a new run's task
//! changes that follow its insert are applied by the insert (each task
//! inserted in the state they leave it in); a batch that cannot be planned
//! is applied one write at a time; both paths are property-tested against
//! the reference meaning of each write (the in-memory store). An apply reads the rows of its jobs in one query
//! per namespace. A job's spec is stored once, in its current version's row
//! of `job_versions` (reads of jobs join it); the `jobs` row keeps instead
//! its timing fields (`Job::timing_json`), which is all that start-up reads
//! of it (`JobStore::load_job_timings`), in key order (the table is `WITHOUT
//! ROWID`). Checkpoints of the log run on a thread of their own beside
//! the writer (`checkpoint.rs`, passive). A database the store creates
//! has pages of 16 KiB (`PAGE_SIZE`; one created before keeps its 4 KiB, as
//! the size cannot change in WAL mode): a third less of the writer's time
//! for the rows of a large apply. Reads use a small async pool
//! (sqlx); a run is read with its tasks and attempts in one transaction; the
//! pages of every job read at start-up go through a read-only rusqlite
//! connection on a blocking thread (`bulk.rs`). Migrations in `migrations/`.
//! A partial index states its predicate without an `IN` list of three or
//! more constants (SQLite would open a temporary table for it at every row
//! written: `runs_active` says `state = 'planned' OR ...`,
//! `run_unfinished_or!()`), and a query meant to use it states the same
//! predicate.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use dagcron_core::AttemptState;
use dagcron_store::{AttemptRecord, Result, RunId, RunRecord, StorageError, TaskRecord};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection};

mod audit;
mod auth;
mod bulk;
mod checkpoint;
mod jobs;
mod outbox;
mod plan;
mod retention;
mod runs;
mod settings;
mod writer;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The page size of a database this store creates.
pub const PAGE_SIZE: u32 = 16_384;

/// A SQLite-backed [`Store`].
#[derive(Clone, Debug)]
pub struct SqliteStore {
    writer: writer::Writer,
    reader: SqlitePool,
    grouped: bool,
    /// Reads every job at start-up (see [`bulk`]).
    bulk: std::sync::Arc<bulk::BulkReader>,
}

fn unavailable(e: sqlx::Error) -> StorageError {
    StorageError::Unavailable(e.to_string())
}

use dagcron_store::rows::{self as read, RUN_COLUMNS, opt_ts, parse, ts};

dagcron_store::sql_reader!(
    SqliteStore,
    sqlx::Sqlite,
    SqliteRow,
    reader,
    unavailable,
    dagcron_store::sql::Dialect {
        select_jobs: SELECT_JOBS,
        bytes_order: "",
        run_attempts: "(SELECT count(*) FROM attempts a WHERE a.run_id = r.id)",
    }
);

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub async fn open(path: &Path) -> Result<SqliteStore> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            // Pages of 16 KiB for a new database (an existing one keeps
            // its own: the size cannot change in WAL mode): a B-tree of
            // fewer, larger pages to split and to log, a third less of the
            // writer's time for a large apply (docs/benchmarks-history.md).
            .page_size(PAGE_SIZE)
            .journal_mode(SqliteJournalMode::Wal)
            // Durable at every checkpoint; WAL with NORMAL survives process
            // crashes (kill -9) without losing committed transactions.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(unavailable)?;
        MIGRATOR
            .run(&writer)
            .await
            .map_err(|e| StorageError::Unavailable(format!("migrating {}: {e}", path.display())))?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.read_only(true))
            .await
            .map_err(unavailable)?;
        writer.close().await;
        let writer = writer::Writer::open(path)?;
        let bulk = std::sync::Arc::new(bulk::BulkReader::new(path));
        Ok(SqliteStore {
            writer,
            reader,
            grouped: true,
            bulk,
        })
    }

    /// Whether a write batch is planned (the default: the changes of one
    /// row merged into one compare-and-set, a new run's tasks inserted in
    /// the state the batch's changes leave them in), or applied one write
    /// at a time: more statements, and kept as the reference the planned
    /// path is tested against.
    pub fn with_grouped_writes(mut self, grouped: bool) -> SqliteStore {
        self.grouped = grouped;
        self
    }

    async fn load_tasks(
        conn: &mut SqliteConnection,
        ids: &[RunId],
    ) -> Result<BTreeMap<RunId, Vec<TaskRecord>>> {
        let mut out: BTreeMap<RunId, Vec<TaskRecord>> = BTreeMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let list = ids
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        // The ids are integers we produced, so they are safe to inline.
        let tasks = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT run_id, task_id, state, carried, outputs, item, note FROM tasks WHERE run_id IN ({list}) ORDER BY run_id, position")))
            .fetch_all(&mut *conn)
            .await
            .map_err(unavailable)?;
        for row in tasks {
            out.entry(row.get(0)).or_default().push(TaskRecord {
                id: row.get(1),
                state: parse(row.get::<&str, _>(2))?,
                attempts: vec![],
                carried: row.get::<i64, _>(3) != 0,
                carried_outputs: outputs_json(row.get(4))?,
                item: row.get(5),
                note: row.get(6),
            });
        }
        let attempts = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT run_id, task_id, number, state, started_at, finished_at, exit_code, error, start_error_us, outputs FROM attempts WHERE run_id IN ({list}) ORDER BY run_id, task_id, number"
        )))
        .fetch_all(&mut *conn)
        .await
        .map_err(unavailable)?;
        for row in attempts {
            let run: RunId = row.get(0);
            let task: String = row.get(1);
            let record = AttemptRecord {
                number: row.get::<u32, _>(2),
                state: parse::<AttemptState>(row.get::<&str, _>(3))?,
                started_at: ts(row.get(4))?,
                finished_at: opt_ts(row.get(5))?,
                exit_code: row.get(6),
                error: row.get(7),
                node_epoch: None,
                start_error_us: row.get(8),
                outputs: outputs_json(row.get(9))?,
            };
            if let Some(t) = out
                .get_mut(&run)
                .and_then(|ts| ts.iter_mut().find(|t| t.id == task))
            {
                t.attempts.push(record);
            }
        }
        Ok(out)
    }

    /// Runs matching `query` (with its binds applied by `bind`), with their
    /// tasks and attempts, read in one transaction so that they are consistent.
    async fn load_runs<'q>(
        &self,
        query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<Vec<RunRecord>> {
        let mut tx = self.reader.begin().await.map_err(unavailable)?;
        let rows = query.fetch_all(&mut *tx).await.map_err(unavailable)?;
        let ids: Vec<RunId> = rows.iter().map(|r| r.get(0)).collect();
        let mut tasks = Self::load_tasks(&mut tx, &ids).await?;
        tx.commit().await.map_err(unavailable)?;
        rows.iter()
            .map(|row| read::run(&Cells(row), tasks.remove(&row.get(0)).unwrap_or_default()))
            .collect()
    }
}

/// The unfinished runs, read at start-up. Their predicate is stated as
/// the index `runs_active` states it, so that the index is used.
fn active_runs_sql() -> String {
    format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE {} ORDER BY id",
        dagcron_store::run_unfinished_or!()
    )
}

/// Jobs with their specs (the current version's: the spec is stored once,
/// in `job_versions`), as [`read::job`] reads them; the `WHERE` follows,
/// on the columns of `jobs`. `CROSS JOIN` keeps `jobs` the outer loop:
/// with the statistics of `ANALYZE`, SQLite otherwise chose to scan every
/// version and sort (a page of 25 jobs of 10,000 took 8 ms, not 0.3).
pub(crate) const SELECT_JOBS: &str = "SELECT j.namespace, j.name, j.version, v.spec, j.paused, j.updated_at, j.rules, j.breaker_opened_at, j.breaker_run, j.breaker_failures
     FROM jobs AS j CROSS JOIN job_versions AS v ON v.namespace = j.namespace AND v.name = j.name AND v.version = j.version";

impl SqliteStore {
    /// `read` through the bulk reader, on a blocking thread.
    async fn bulk_read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&bulk::BulkReader) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let bulk = self.bulk.clone();
        tokio::task::spawn_blocking(move || read(&bulk))
            .await
            .map_err(|e| StorageError::Unavailable(format!("reading jobs: {e}")))?
    }
}

/// Outputs as a column holds them (JSON; none: no outputs).
fn outputs_json(json: Option<&str>) -> Result<dagcron_core::outputs::Outputs> {
    json.map_or(Ok(Default::default()), |j| {
        serde_json::from_str(j).map_err(|e| StorageError::Corrupt(format!("outputs: {e}")))
    })
}

#[cfg(test)]
mod tests {
    /// The read of unfinished runs at start-up goes through their partial
    /// index, whose predicate it states the same way (a query that lists the
    /// states with `IN` would scan every run).
    #[tokio::test]
    async fn the_unfinished_runs_are_read_through_their_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        drop(super::SqliteStore::open(&path).await.unwrap());
        let conn = rusqlite::Connection::open(&path).unwrap();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", super::active_runs_sql()))
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .map(|row| row.unwrap())
            .collect();
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX runs_active")),
            "{plan:?}"
        );
    }

    /// A page of a namespace's jobs walks the jobs by their key and looks
    /// up each one's spec, with the statistics of `ANALYZE` on 10,000 jobs
    /// of one namespace too (SQLite then preferred scanning every version
    /// and sorting them, unless told the order).
    #[tokio::test]
    async fn a_page_of_jobs_reads_the_jobs_in_key_order_whatever_the_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        drop(super::SqliteStore::open(&path).await.unwrap());
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10000)
             INSERT INTO jobs (namespace, name, version, timing, updated_at)
               SELECT 'ns', printf('job-%05d', i), 1, '{}', 0 FROM n;
             INSERT INTO job_versions (namespace, name, version, spec, created_at)
               SELECT namespace, name, 1, '{}', 0 FROM jobs;
             ANALYZE;",
        )
        .unwrap();
        let sql = format!(
            "EXPLAIN QUERY PLAN {} WHERE j.namespace = ?1 AND j.name > ?2 ORDER BY j.name LIMIT ?3",
            super::SELECT_JOBS
        );
        let plan: Vec<String> = conn
            .prepare(&sql)
            .unwrap()
            .query_map(rusqlite::params!["ns", "", 26], |r| r.get::<_, String>(3))
            .unwrap()
            .map(|row| row.unwrap())
            .collect();
        assert!(
            plan[0].starts_with("SEARCH j USING PRIMARY KEY"),
            "{plan:?}"
        );
        assert!(
            !plan.iter().any(|step| step.contains("TEMP B-TREE")),
            "{plan:?}"
        );
    }
}
