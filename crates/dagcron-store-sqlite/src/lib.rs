//! The embedded storage backend: one SQLite file in WAL mode.
//!
//! Writes go through a single connection, so batches are serialized in the
//! process and never fight over SQLite's write lock; reads use a small pool
//! and see committed data only.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::{AttemptState, FireOutcome};
use dagcron_store::{
    ApplyResult, AttemptRecord, AuditEntry, FireRecord, JobUpsert, JobVersion, Page, Result, RunId,
    RunRecord, SecretRecord, StorageError, Store, StoredJob, StoredTimingRow, TaskRecord,
    TokenRecord, VersionRecord, Write, WriteResult,
};
use jiff::Timestamp;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection};

mod bulk;
mod checkpoint;
mod retention;
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

fn micros(t: Timestamp) -> i64 {
    t.as_microsecond()
}

use dagcron_store::rows::{
    self as read, RUN_COLUMNS, SECRET_COLUMNS, TOKEN_COLUMNS, VERSION_COLUMNS, opt_ts, parse, ts,
};

dagcron_store::cells!(SqliteRow);

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub async fn open(path: &Path) -> Result<SqliteStore> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            // Pages of 16 KiB for a new database (an existing one keeps
            // its own: the size cannot change in WAL mode): a B-tree of
            // fewer, larger pages to split and to log, a third less of the
            // writer's time for a large apply (BENCHMARKS.md).
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
        let tasks = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT run_id, task_id, state, carried FROM tasks WHERE run_id IN ({list}) ORDER BY run_id, position")))
            .fetch_all(&mut *conn)
            .await
            .map_err(unavailable)?;
        for row in tasks {
            out.entry(row.get(0)).or_default().push(TaskRecord {
                id: row.get(1),
                state: parse(row.get::<&str, _>(2))?,
                attempts: vec![],
                carried: row.get::<i64, _>(3) != 0,
            });
        }
        let attempts = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT run_id, task_id, number, state, started_at, finished_at, exit_code, error, start_error_us FROM attempts WHERE run_id IN ({list}) ORDER BY run_id, task_id, number"
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
/// in `job_versions`), as [`read::job`] reads them; the `WHERE` follows.
pub(crate) const SELECT_JOBS: &str = "SELECT j.namespace, j.name, j.version, v.spec, j.paused, j.updated_at, j.rules
     FROM jobs AS j JOIN job_versions AS v ON v.namespace = j.namespace AND v.name = j.name AND v.version = j.version";

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

impl Store for SqliteStore {
    async fn apply_jobs(&self, jobs: &[JobUpsert], at: Timestamp) -> Result<Vec<ApplyResult>> {
        self.apply_jobs_owned(jobs.to_vec(), at).await
    }

    async fn apply_jobs_owned(
        &self,
        jobs: Vec<JobUpsert>,
        at: Timestamp,
    ) -> Result<Vec<ApplyResult>> {
        self.writer
            .transaction(move |tx| writer::apply_jobs(tx, &jobs, at))
            .await
    }

    async fn load_jobs(
        &self,
        after: Option<&(String, String)>,
        limit: u32,
    ) -> Result<Vec<StoredJob>> {
        let after = after.cloned().unwrap_or_default();
        self.bulk_read(move |bulk| bulk.load_jobs(after, limit))
            .await
    }

    async fn load_job_timings(
        &self,
        after: Option<&(String, String)>,
        limit: u32,
    ) -> Result<Vec<StoredTimingRow>> {
        let after = after.cloned().unwrap_or_default();
        self.bulk_read(move |bulk| bulk.load_job_timings(after, limit))
            .await
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<StoredJob>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT_JOBS} WHERE j.namespace = ? AND j.name = ?"
        )))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        row.as_ref().map(|r| read::job(&Cells(r))).transpose()
    }

    async fn list_jobs(
        &self,
        namespace: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<StoredJob>> {
        let after = dagcron_store::jobs_after(cursor)?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT_JOBS} WHERE j.namespace = ? AND j.name > ? ORDER BY j.name LIMIT ?"
        )))
        .bind(namespace)
        .bind(&after)
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        let items = rows
            .iter()
            .map(|r| read::job(&Cells(r)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(
            items,
            limit,
            dagcron_store::job_cursor,
        ))
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<bool> {
        let (ns, name) = (namespace.to_string(), name.to_string());
        let n = self
            .writer
            .transaction(move |tx| {
                let n = tx.execute(
                    "DELETE FROM jobs WHERE namespace = ?1 AND name = ?2",
                    rusqlite::params![ns, name],
                )?;
                if n == 1 {
                    tx.execute(
                        "INSERT OR REPLACE INTO deleted_jobs (namespace, name) VALUES (?1, ?2)",
                        rusqlite::params![ns, name],
                    )?;
                }
                Ok(n)
            })
            .await?;
        Ok(n == 1)
    }

    async fn set_paused(&self, namespace: &str, name: &str, paused: bool) -> Result<bool> {
        let (ns, name) = (namespace.to_string(), name.to_string());
        let n = self
            .writer
            .transaction(move |tx| {
                tx.execute(
                    "UPDATE jobs SET paused = ?1 WHERE namespace = ?2 AND name = ?3",
                    rusqlite::params![paused, ns, name],
                )
            })
            .await?;
        Ok(n == 1)
    }

    async fn list_job_versions(
        &self,
        namespace: &str,
        name: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<VersionRecord>> {
        let before = dagcron_store::versions_before(cursor)?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM job_versions WHERE namespace = ? AND name = ? AND version < ? ORDER BY version DESC LIMIT ?"
        )))
        .bind(namespace)
        .bind(name)
        .bind(before)
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        let items = rows
            .iter()
            .map(|r| read::version(&Cells(r)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(
            items,
            limit,
            dagcron_store::version_cursor,
        ))
    }

    async fn get_job_version(
        &self,
        namespace: &str,
        name: &str,
        version: i64,
    ) -> Result<Option<JobVersion>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS}, spec FROM job_versions WHERE namespace = ? AND name = ? AND version = ?"
        )))
        .bind(namespace)
        .bind(name)
        .bind(version)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        row.map(|r| {
            Ok(JobVersion {
                info: read::version(&Cells(&r))?,
                spec: r.get(8),
            })
        })
        .transpose()
    }

    async fn stamp_rules(
        &self,
        versions: &[(String, String, i64, dagcron_core::Rules)],
    ) -> Result<()> {
        if versions.is_empty() {
            return Ok(());
        }
        let versions: Vec<(String, String, i64, String)> = versions
            .iter()
            .map(|(ns, name, v, rules)| (ns.clone(), name.clone(), *v, rules.to_json()))
            .collect();
        self.writer
            .transaction(move |tx| writer::stamp_rules(tx, &versions))
            .await
    }

    async fn write(&self, batch: &[Write]) -> Result<Vec<WriteResult>> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        self.write_shared(Arc::new(batch.to_vec())).await
    }

    async fn write_shared(&self, batch: Arc<Vec<Write>>) -> Result<Vec<WriteResult>> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let grouped = self.grouped;
        self.writer
            .transaction(move |tx| writer::apply_batch(tx, &batch, grouped))
            .await
    }

    async fn last_fires(&self) -> Result<Vec<(String, String, Timestamp)>> {
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT namespace, job, MAX(scheduled_at) FROM fires GROUP BY namespace, job ORDER BY namespace, job").fetch_all(&self.reader).await.map_err(unavailable)?;
        rows.into_iter()
            .map(|(n, j, t)| Ok((n, j, ts(t)?)))
            .collect()
    }

    async fn last_fires_of(&self, jobs: &[(String, String)]) -> Result<Vec<Option<Timestamp>>> {
        let mut conn = self.reader.acquire().await.map_err(unavailable)?;
        let mut out = Vec::with_capacity(jobs.len());
        for (namespace, job) in jobs {
            let last: Option<i64> = sqlx::query_scalar(
                "SELECT MAX(scheduled_at) FROM fires WHERE namespace = ? AND job = ?",
            )
            .bind(namespace)
            .bind(job)
            .fetch_one(&mut *conn)
            .await
            .map_err(unavailable)?;
            out.push(opt_ts(last)?);
        }
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
        let rows: Vec<(i64, String, Option<i64>, Option<String>)> = sqlx::query_as(
            "SELECT scheduled_at, outcome, run_id, calendar FROM fires WHERE namespace = ? AND job = ? AND scheduled_at >= ? AND scheduled_at < ? ORDER BY scheduled_at LIMIT ?",
        )
        .bind(namespace)
        .bind(job)
        .bind(micros(from))
        .bind(micros(to))
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.into_iter()
            .map(|(t, o, run_id, calendar)| {
                Ok(FireRecord {
                    scheduled_at: ts(t)?,
                    outcome: FireOutcome::parse(&o)
                        .ok_or_else(|| StorageError::Corrupt(format!("fire outcome {o:?}")))?,
                    calendar,
                    run_id,
                })
            })
            .collect()
    }

    async fn active_runs(&self) -> Result<Vec<RunRecord>> {
        self.load_runs(sqlx::query(sqlx::AssertSqlSafe(active_runs_sql())))
            .await
    }

    async fn count_unfinished_runs(&self, namespace: &str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE namespace = ? AND state IN ('pending', 'running')",
        )
        .bind(namespace)
        .fetch_one(&self.reader)
        .await
        .map_err(unavailable)?;
        Ok(n as u64)
    }

    async fn get_run(&self, id: RunId) -> Result<Option<RunRecord>> {
        let query = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"
        )))
        .bind(id);
        Ok(self.load_runs(query).await?.pop())
    }

    async fn held_runs(&self, namespace: &str, limit: u32) -> Result<Vec<RunRecord>> {
        let query = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE namespace = ? AND state IN ('pending', 'running') AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = runs.id AND t.state = 'held') ORDER BY id LIMIT ?"
        )))
        .bind(namespace.to_string())
        .bind(i64::from(limit));
        self.load_runs(query).await
    }

    async fn list_runs(
        &self,
        namespace: &str,
        job: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RunRecord>> {
        let before = dagcron_store::runs_before(cursor)?;
        let query = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE namespace = ? AND job = ? AND id < ? ORDER BY id DESC LIMIT ?"
        )))
        .bind(namespace.to_string())
        .bind(job.to_string())
        .bind(before)
        .bind(i64::from(limit) + 1);
        let items = self.load_runs(query).await?;
        Ok(Page::from_overfetch(
            items,
            limit,
            dagcron_store::run_cursor,
        ))
    }

    async fn planned_runs(&self, namespace: &str, job: &str, limit: u32) -> Result<Vec<RunRecord>> {
        let query = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE namespace = ? AND job = ? AND state = 'planned' ORDER BY scheduled_at, id LIMIT ?"
        )))
        .bind(namespace.to_string())
        .bind(job.to_string())
        .bind(i64::from(limit));
        self.load_runs(query).await
    }

    async fn create_token(&self, token: &TokenRecord, hash: &[u8]) -> Result<()> {
        let (t, hash) = (token.clone(), hash.to_vec());
        self.writer
            .transaction(move |tx| {
                tx.execute(
                    "INSERT INTO tokens (id, name, role, namespace, hash, created_at, expires_at, created_by, labels) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    rusqlite::params![
                        t.id,
                        t.name,
                        t.role,
                        t.namespace,
                        hash,
                        t.created_at.as_microsecond(),
                        t.expires_at.map(|e| e.as_microsecond()),
                        t.created_by,
                        t.labels.as_ref().map(|l| serde_json::to_string(l).expect("labels serialize"))
                    ],
                )
            })
            .await?;
        Ok(())
    }

    async fn find_token(&self, hash: &[u8]) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?"
        )))
        .bind(hash)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::token(&Cells(&r))).transpose()
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id"
        )))
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::token(&Cells(r))).collect()
    }

    async fn revoke_token(&self, id: &str, at: Timestamp) -> Result<bool> {
        let id = id.to_string();
        let n = self
            .writer
            .transaction(move |tx| {
                tx.execute(
                    "UPDATE tokens SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
                    rusqlite::params![at.as_microsecond(), id],
                )
            })
            .await?;
        Ok(n == 1)
    }

    async fn token_used(&self, id: &str, at: Timestamp) -> Result<()> {
        let id = id.to_string();
        self.writer
            .transaction(move |tx| {
                tx.execute(
                    "UPDATE tokens SET last_used_at = ?1 WHERE id = ?2",
                    rusqlite::params![at.as_microsecond(), id],
                )
            })
            .await?;
        Ok(())
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        let s = secret.clone();
        self.writer
            .transaction(move |tx| {
                tx.execute(
                    "INSERT INTO secrets (namespace, name, version, key_id, nonce, ciphertext, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (namespace, name) DO UPDATE SET version = excluded.version, key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
                    rusqlite::params![s.namespace, s.name, s.version, s.key_id, s.nonce, s.ciphertext, s.updated_at.as_microsecond()],
                )
            })
            .await?;
        Ok(())
    }

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<SecretRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = ? AND name = ?"
        )))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::secret(&Cells(&r))).transpose()
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = ? ORDER BY name"
        )))
        .bind(namespace)
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn list_all_secrets(&self) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets ORDER BY namespace, name"
        )))
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn get_setting(&self, key: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.reader)
            .await
            .map_err(unavailable)
    }

    async fn get_settings(&self, keys: [&str; 2]) -> Result<[Option<String>; 2]> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT key, value FROM settings WHERE key IN (?1, ?2)")
                .bind(keys[0])
                .bind(keys[1])
                .fetch_all(&self.reader)
                .await
                .map_err(unavailable)?;
        let of = |key: &str| rows.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        Ok([of(keys[0]), of(keys[1])])
    }

    async fn set_setting(&self, key: &str, value: Option<&str>, at: Timestamp) -> Result<()> {
        let (key, value) = (key.to_string(), value.map(str::to_string));
        self.writer
            .transaction(move |tx| match value {
                Some(value) => tx.execute(
                    "INSERT INTO settings (key, value, updated_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    rusqlite::params![key, value, at.as_microsecond()],
                ),
                None => tx.execute("DELETE FROM settings WHERE key = ?1", rusqlite::params![key]),
            })
            .await?;
        Ok(())
    }

    async fn count_secrets(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM secrets")
            .fetch_one(&self.reader)
            .await
            .map_err(unavailable)?;
        Ok(n as u64)
    }

    async fn delete_secret(&self, namespace: &str, name: &str) -> Result<bool> {
        let (ns, name) = (namespace.to_string(), name.to_string());
        let n = self
            .writer
            .transaction(move |tx| {
                tx.execute(
                    "DELETE FROM secrets WHERE namespace = ?1 AND name = ?2",
                    rusqlite::params![ns, name],
                )
            })
            .await?;
        Ok(n == 1)
    }

    async fn append_audit(&self, mut entry: AuditEntry) -> Result<()> {
        use rusqlite::OptionalExtension;
        // The writer thread serializes appends: the chain cannot fork.
        self.writer
            .transaction(move |tx| {
                let prev: Option<(i64, Vec<u8>)> = tx
                    .query_row(
                        "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                entry.chain_after(prev);
                tx.execute(
                    "INSERT INTO audit (seq, at, principal, principal_name, action, namespace, outcome, address, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    rusqlite::params![
                        entry.seq,
                        entry.at.as_microsecond(),
                        entry.principal,
                        entry.principal_name,
                        entry.action,
                        entry.namespace,
                        entry.outcome,
                        entry.address,
                        entry.prev_hash,
                        entry.hash
                    ],
                )
            })
            .await?;
        Ok(())
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        use rusqlite::OptionalExtension;
        let before = before.as_microsecond();
        // The writer thread serializes it with the appends.
        self.writer
            .transaction(move |tx| {
                let cut: Option<(i64, Vec<u8>)> = tx
                    .query_row(
                        "SELECT seq, hash FROM audit WHERE seq = (SELECT max(seq) FROM audit
                           WHERE at < ?1 AND seq < (SELECT max(seq) FROM audit))",
                        rusqlite::params![before],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                let Some((seq, hash)) = cut else {
                    return Ok(0);
                };
                let gone = tx.execute("DELETE FROM audit WHERE seq <= ?1", rusqlite::params![seq])?;
                tx.execute(
                    "INSERT INTO settings (key, value, updated_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    rusqlite::params![
                        dagcron_store::AUDIT_CHECKPOINT,
                        dagcron_store::checkpoint_text(seq, &hash),
                        before
                    ],
                )?;
                Ok(gone as u64)
            })
            .await
    }

    async fn list_audit(
        &self,
        after: i64,
        limit: u32,
        namespace: Option<&str>,
    ) -> Result<Vec<AuditEntry>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM audit
             WHERE seq > ? AND (? IS NULL OR namespace = ?) ORDER BY seq LIMIT ?",
            dagcron_store::rows::AUDIT_COLUMNS
        )))
        .bind(after)
        .bind(namespace)
        .bind(namespace)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::audit(&Cells(r))).collect()
    }

    async fn max_run_id(&self) -> Result<RunId> {
        let id: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM runs")
            .fetch_one(&self.reader)
            .await
            .map_err(unavailable)?;
        Ok(id.unwrap_or(0))
    }

    async fn history_jobs(
        &self,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<dagcron_store::HistoryJob>> {
        retention::history_jobs(&self.reader, namespace, after, limit).await
    }

    async fn run_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: RunId,
        limit: u32,
    ) -> Result<Vec<dagcron_core::retention::RunFacts>> {
        retention::run_history(&self.reader, namespace, job, keep, after, limit).await
    }

    async fn fire_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: Option<Timestamp>,
        limit: u32,
    ) -> Result<Vec<dagcron_core::retention::FireFacts>> {
        retention::fire_history(&self.reader, namespace, job, keep, after, limit).await
    }

    async fn prune(&self, batch: &dagcron_store::Prune) -> Result<dagcron_store::Pruned> {
        if batch.is_empty() {
            return Ok(Default::default());
        }
        let batch = batch.clone();
        self.writer
            .transaction(move |tx| retention::prune(tx, &batch))
            .await
    }

    async fn read_log(&self, run: RunId, task: &str, number: u32) -> Result<Option<Vec<u8>>> {
        let row: Option<(Option<Vec<u8>>,)> = sqlx::query_as(
            "SELECT log FROM attempts WHERE run_id = ? AND task_id = ? AND number = ?",
        )
        .bind(run)
        .bind(task)
        .bind(number)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        Ok(row.map(|(log,)| log.unwrap_or_default()))
    }
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
}
