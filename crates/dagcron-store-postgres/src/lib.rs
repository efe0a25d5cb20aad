//! The shared storage backend: PostgreSQL.
//!
//! Every node of a cluster uses the same database. Write batches run in one
//! transaction each; once a node has registered (see [`Coordination`]),
//! every batch first checks the node's row under a share lock and is refused
//! with [`StorageError::Fenced`] when the node's lease has ended or its epoch
//! was replaced. Unique keys (the fire ledger's (job, scheduled instant),
//! attempt numbers) and compare-and-set updates refuse anything doubled.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dagcron_core::{AttemptState, FireOutcome, RunState};
use dagcron_store::{
    ApplyResult, AttemptKey, AuditEntry, ClaimedAttempt, FireRecord, JobUpsert, JobVersion, NewRun,
    Page, RemoteAttempt, Result, RunId, RunRecord, SecretRecord, StorageError, Store, StoredJob,
    TokenRecord, VersionRecord, Write, WriteResult,
};
use jiff::Timestamp;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};

mod audit;
mod batch;
mod cluster;
mod retention;
mod rows;
pub use cluster::MAX_NODES;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The channel of change announcements between nodes.
const CHANNEL: &str = "dagcron";

/// The registration that fences this handle's writes.
#[derive(Clone, Debug)]
struct Fence {
    id: String,
    epoch: i64,
}

/// A PostgreSQL-backed [`Store`], and the [`Coordination`] of a cluster.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
    stats: Arc<Counters>,
    fence: Arc<RwLock<Option<Fence>>>,
    listener: Arc<tokio::sync::Mutex<Option<PgListener>>>,
    audit: Arc<audit::AuditQueue>,
}

/// Counts of the write path since the store was opened.
#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    writes: AtomicU64,
    statements: AtomicU64,
}

fn unavailable(e: sqlx::Error) -> StorageError {
    // 53100: disk_full.
    if matches!(&e, sqlx::Error::Database(d) if d.code().as_deref() == Some("53100")) {
        return StorageError::Full(e.to_string());
    }
    StorageError::Unavailable(e.to_string())
}

/// How long a session may sit in an open transaction waiting for its
/// node; beyond it the database ends the session and its locks go.
/// Far above any wait of a live node between the statements of a batch.
const IDLE_IN_TRANSACTION: &str = "10s";

/// Deadlocks and serialization failures: the batch can simply run again.
fn is_transient(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("40P01" | "40001")))
}

pub(crate) use dagcron_store::rows::{self as read, labels_json, opt_ts, parse, ts};
use dagcron_store::rows::{SECRET_COLUMNS, TOKEN_COLUMNS, VERSION_COLUMNS};

dagcron_store::cells!(PgRow);

/// A run's columns, then its tasks (see [`rows::Row`]).
const RUN_COLUMNS: &str = concat!(dagcron_store::run_columns!(), ", tasks");
/// A job's columns, as [`dagcron_store::rows::job`] reads them.
pub(crate) const JOB_COLUMNS: &str = "namespace, name, version, spec, paused, updated_at, rules";

impl PgStore {
    /// Connects to `url` with a pool of up to `max_connections` and migrates
    /// the schema (concurrent nodes take turns on a lock).
    pub async fn connect(url: &str, max_connections: u32) -> Result<PgStore> {
        let options = sqlx::postgres::PgConnectOptions::from_str(url)
            .map_err(|e| StorageError::Unavailable(format!("connecting to PostgreSQL: {e}")))?
            // Every statement is planned for its parameters and the tables
            // as they are now. A cached generic plan is made after a few
            // runs, when the tables may still be nearly empty (a new
            // database), and kept until the next ANALYZE: its sequential
            // scans of runs, tasks and attempts then cost more with every
            // row added.
            .options([
                ("plan_cache_mode", "force_custom_plan"),
                // A node cut off in the middle of a transaction holds its
                // locks (on its runs, on its row that a reap waits for)
                // until the database notices: at most this long.
                ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|e| StorageError::Unavailable(format!("connecting to PostgreSQL: {e}")))?;
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StorageError::Unavailable(format!("migrating the database: {e}")))?;
        Ok(PgStore {
            pool,
            stats: Arc::new(Counters::default()),
            fence: Arc::new(RwLock::new(None)),
            listener: Arc::new(tokio::sync::Mutex::new(None)),
            audit: Arc::default(),
        })
    }

    fn fence(&self) -> Option<Fence> {
        self.fence.read().expect("fence lock").clone()
    }

    fn epoch(&self) -> Option<i64> {
        self.fence().map(|f| f.epoch)
    }

    /// Refuses the transaction unless this handle's registration is current.
    /// Checks this node's lease at the start of a write transaction, and
    /// keeps its row locked until commit (`FOR KEY SHARE`): the node's own
    /// heartbeats go through, while a reap or a new registration of the
    /// node (which lock the row `FOR UPDATE`) wait until the batch has
    /// landed, and then refuse the next.
    async fn check_fence(&self, conn: &mut PgConnection) -> Result<()> {
        let Some(fence) = self.fence() else {
            return Ok(());
        };
        let ok: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM nodes WHERE id = $1 AND epoch = $2 AND state IN ('alive', 'draining') AND lease_until > now() FOR KEY SHARE",
        )
        .bind(&fence.id)
        .bind(fence.epoch)
        .fetch_optional(&mut *conn)
        .await
        .map_err(unavailable)?;
        match ok {
            Some(_) => Ok(()),
            None => Err(StorageError::Fenced(format!(
                "node {} (epoch {}) has no current lease",
                fence.id, fence.epoch
            ))),
        }
    }

    /// Bumps the jobs revision and stamps the jobs changed (or deleted:
    /// tombstones) with it. The revision row stays locked until commit, so
    /// changes commit in revision order.
    async fn job_changes(
        conn: &mut PgConnection,
        changed: &[(&str, &str)],
        deleted: &[(&str, &str)],
    ) -> std::result::Result<(), sqlx::Error> {
        let revision: i64 = sqlx::query_scalar(
            "UPDATE revisions SET value = value + 1 WHERE name = 'jobs' RETURNING value",
        )
        .fetch_one(&mut *conn)
        .await?;
        for (keys, tombstone) in [(changed, false), (deleted, true)] {
            if keys.is_empty() {
                continue;
            }
            let (namespaces, names): (Vec<&str>, Vec<&str>) = keys.iter().copied().unzip();
            let sql = if tombstone {
                "INSERT INTO deleted_jobs (namespace, name, revision)
                 SELECT ns, n, $3 FROM unnest($1::text[], $2::text[]) AS k(ns, n)
                 ON CONFLICT (namespace, name) DO UPDATE SET revision = EXCLUDED.revision, deleted_at = EXCLUDED.deleted_at"
            } else {
                "WITH k AS (SELECT * FROM unnest($1::text[], $2::text[]) AS k(ns, n)),
                 gone AS (DELETE FROM deleted_jobs d USING k WHERE d.namespace = k.ns AND d.name = k.n)
                 UPDATE jobs j SET revision = $3 FROM k WHERE j.namespace = k.ns AND j.name = k.n"
            };
            sqlx::query(sql)
                .bind(&namespaces)
                .bind(&names)
                .bind(revision)
                .execute(&mut *conn)
                .await?;
        }
        notify(conn, "jobs").await
    }

    /// Runs selected by `sql` (which returns [`RUN_COLUMNS`]) with its
    /// binds, with their tasks and attempts (kept in the run's row).
    async fn load_runs<'a, T>(&self, sql: String, binds: T) -> Result<Vec<RunRecord>>
    where
        T: FnOnce(
            sqlx::query::Query<'a, sqlx::Postgres, sqlx::postgres::PgArguments>,
        ) -> sqlx::query::Query<'a, sqlx::Postgres, sqlx::postgres::PgArguments>,
    {
        let rows = binds(sqlx::query(sqlx::AssertSqlSafe(sql)))
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                let tasks = rows::parse_tasks(row.get(0), row.get(14))?
                    .into_iter()
                    .map(rows::Task::record)
                    .collect::<Result<_>>()?;
                read::run(&Cells(row), tasks)
            })
            .collect()
    }

    /// Begins a transaction, fenced by this node's registration if asked.
    async fn begin(&self, fenced: bool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        if fenced {
            self.check_fence(&mut tx).await?;
        }
        Ok(tx)
    }
}

/// Runs `$body` (an async block using `$conn: &mut PgConnection`) in a
/// transaction, again when the database asks for a retry (a deadlock or a
/// serialization failure).
macro_rules! transaction {
    ($store:expr, fenced = $fenced:expr, |$conn:ident| $body:expr) => {{
        let mut tries = 0u32;
        loop {
            let mut tx = $store.begin($fenced).await?;
            let result: std::result::Result<_, sqlx::Error> = async {
                let $conn: &mut sqlx::postgres::PgConnection = &mut tx;
                $body
            }
            .await;
            let result = match result {
                Ok(v) => tx.commit().await.map(|()| v),
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => break Ok(v),
                Err(e) if $crate::is_transient(&e) && tries < 8 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << tries.min(5))).await;
                }
                Err(e) => break Err($crate::unavailable(e)),
            }
        }
    }};
}
pub(crate) use transaction;

async fn notify(conn: &mut PgConnection, what: &str) -> std::result::Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(what)
        .execute(&mut *conn)
        .await
        .map(|_| ())
}

/// Inserts runs with their tasks (their rows in `rows`, as the batch's
/// writes left them), one statement whatever their number.
async fn insert_runs(
    conn: &mut PgConnection,
    runs: &[&NewRun],
    rows: &BTreeMap<RunId, rows::Row>,
    epoch: Option<i64>,
    sent: &mut u64,
) -> std::result::Result<(), sqlx::Error> {
    let params: Vec<String> = runs
        .iter()
        .map(|r| serde_json::to_string(&r.params).expect("params serialize"))
        .collect();
    let rows: Vec<&rows::Row> = runs.iter().map(|r| &rows[&r.id]).collect();
    *sent += 1;
    sqlx::query(
        "INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at, owner_epoch, trace, rerun_of, closing, tasks)
         SELECT id, n, j, v, t, s, st, p, c, sa, fa, $12, tr, ro, cl, tk
         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::bigint[], $13::text[], $14::bigint[], $15::text[], $16::text[])
            AS x(id, n, j, v, t, s, st, p, c, sa, fa, tr, ro, cl, tk)",
    )
    .bind(runs.iter().map(|r| r.id).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.namespace.as_str()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.job.as_str()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.job_version).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.trigger.as_str()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.scheduled_at.as_microsecond()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
    .bind(&params)
    .bind(runs.iter().map(|r| r.created_at.as_microsecond()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.started_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.finished_at).collect::<Vec<_>>())
    .bind(epoch)
    .bind(runs.iter().map(|r| r.trace.as_deref()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.rerun_of).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.closing.map(RunState::as_str)).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.tasks_json()).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// What a node running a claimed attempt needs of its run: id, namespace,
/// job, instant, parameters, the caller's trace, job version.
type ClaimedRun = (RunId, String, String, i64, String, Option<String>, i64);

/// Claims up to `limit` attempts waiting in the cluster's queue: for the
/// node's own pool (`labels` none: attempts that need no agent), or for one
/// of its agents (attempts whose labels the agent's contain). The queue's
/// rows are taken first (rows another node is taking are skipped), then the
/// attempts are marked running on this node in their runs' rows.
async fn claim_some(
    conn: &mut PgConnection,
    labels: Option<&str>,
    limit: i64,
    epoch: i64,
    at: Timestamp,
    sent: &mut u64,
) -> std::result::Result<Vec<ClaimedAttempt>, sqlx::Error> {
    *sent += 1;
    let taken: Vec<(RunId, String, i32)> = sqlx::query_as(
        "WITH c AS (
            SELECT run_id, task_id, number FROM shared_attempts
            WHERE node_epoch IS NULL
              AND (CASE WHEN $4::jsonb IS NULL THEN run_on IS NULL ELSE run_on <@ $4::jsonb END)
            ORDER BY queued_at LIMIT $1 FOR UPDATE SKIP LOCKED
         )
         UPDATE shared_attempts s SET node_epoch = $2
         FROM c WHERE s.run_id = c.run_id AND s.task_id = c.task_id AND s.number = c.number
         RETURNING s.run_id, s.task_id, s.number",
    )
    .bind(limit)
    .bind(epoch)
    .bind(at.as_microsecond())
    .bind(labels)
    .fetch_all(&mut *conn)
    .await?;
    if taken.is_empty() {
        return Ok(vec![]);
    }
    let mut ids: Vec<RunId> = taken.iter().map(|t| t.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let at_us = at.as_microsecond();
    let mut pending = ids;
    let mut claimed: BTreeSet<(RunId, &str, i32)> = BTreeSet::new();
    for _ in 0..16 {
        if pending.is_empty() {
            break;
        }
        *sent += 2;
        let mut rows = rows::load(conn, &pending).await?;
        claimed.retain(|k| !rows.contains_key(&k.0));
        for (run, task, number) in &taken {
            if let Some(row) = rows.get_mut(run) {
                if rows::claim(row, task, *number as u32, epoch, at_us) {
                    claimed.insert((*run, task.as_str(), *number));
                }
            }
        }
        pending = rows::save(conn, &rows, sent).await?;
    }
    if !pending.is_empty() {
        return Err(sqlx::Error::Protocol(format!(
            "runs {pending:?} kept changing under the claim"
        )));
    }
    let ids: Vec<RunId> = claimed.iter().map(|k| k.0).collect();
    *sent += 1;
    let runs: Vec<ClaimedRun> = sqlx::query_as(
        "SELECT id, namespace, job, scheduled_at, params, trace, job_version FROM runs WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    let runs: BTreeMap<RunId, _> = runs.into_iter().map(|r| (r.0, r)).collect();
    let corrupt = |e: StorageError| sqlx::Error::Decode(Box::new(e));
    let mut out = Vec::with_capacity(claimed.len());
    for (run, task, number) in claimed {
        let (_, namespace, job, scheduled_at, params, trace, job_version) = &runs[&run];
        out.push(ClaimedAttempt {
            run,
            namespace: namespace.clone(),
            job: job.clone(),
            task: task.to_string(),
            number: number as u32,
            scheduled_at: ts(*scheduled_at).map_err(corrupt)?,
            params: serde_json::from_str(params)
                .map_err(|e| corrupt(StorageError::Corrupt(format!("run {run} params: {e}"))))?,
            trace: trace.clone(),
            job_version: *job_version,
        });
    }
    Ok(out)
}

impl Store for PgStore {
    async fn apply_jobs(&self, jobs: &[JobUpsert], at: Timestamp) -> Result<Vec<ApplyResult>> {
        let at = at.as_microsecond();
        transaction!(self, fenced = false, |conn| {
            let mut out = Vec::with_capacity(jobs.len());
            for j in jobs {
                // Concurrent applies of one job (from several nodes) take turns.
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))")
                    .bind(&j.namespace)
                    .bind(&j.name)
                    .execute(&mut *conn)
                    .await?;
                let current: Option<(i64, String, bool, Option<String>)> = sqlx::query_as(
                    "SELECT version, spec, paused, rules FROM jobs WHERE namespace = $1 AND name = $2",
                )
                .bind(&j.namespace)
                .bind(&j.name)
                .fetch_optional(&mut *conn)
                .await?;
                let rules = j.rules_json();
                let result = match current {
                    Some((v, spec, _, stored)) if !j.changes(&spec, stored.as_deref()) => {
                        ApplyResult::Unchanged(v)
                    }
                    Some((v, spec, paused, _)) => {
                        let paused = j.paused_over(Some((paused, &spec)));
                        sqlx::query("UPDATE jobs SET version = $1, spec = $2, updated_at = $3, paused = $4, rules = $5 WHERE namespace = $6 AND name = $7")
                                .bind(v + 1).bind(&j.spec).bind(at).bind(paused).bind(&rules).bind(&j.namespace).bind(&j.name)
                                .execute(&mut *conn).await?;
                        ApplyResult::Updated(v + 1)
                    }
                    None => {
                        // A re-created job continues its version history.
                        let last: Option<i64> = sqlx::query_scalar(
                                "SELECT MAX(version) FROM job_versions WHERE namespace = $1 AND name = $2",
                            )
                            .bind(&j.namespace)
                            .bind(&j.name)
                            .fetch_one(&mut *conn)
                            .await?;
                        let v = last.unwrap_or(0) + 1;
                        sqlx::query("INSERT INTO jobs (namespace, name, version, spec, paused, updated_at, rules) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                                .bind(&j.namespace).bind(&j.name).bind(v).bind(&j.spec).bind(j.paused_over(None)).bind(at).bind(&rules)
                                .execute(&mut *conn).await?;
                        ApplyResult::Created(v)
                    }
                };
                if let ApplyResult::Created(v) | ApplyResult::Updated(v) = result {
                    let by = j.origin.by.as_ref();
                    sqlx::query(
                        "INSERT INTO job_versions (namespace, name, version, spec, created_at, applied_by, applied_by_name, rollback_of, rules)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                         ON CONFLICT (namespace, name, version) DO UPDATE SET spec = EXCLUDED.spec, created_at = EXCLUDED.created_at,
                            applied_by = EXCLUDED.applied_by, applied_by_name = EXCLUDED.applied_by_name,
                            rollback_of = EXCLUDED.rollback_of, rules = EXCLUDED.rules",
                    )
                    .bind(&j.namespace)
                    .bind(&j.name)
                    .bind(v)
                    .bind(&j.spec)
                    .bind(at)
                    .bind(by.map(|a| a.id.as_str()))
                    .bind(by.map(|a| a.name.as_str()))
                    .bind(j.origin.rollback_of)
                    .bind(&rules)
                    .execute(&mut *conn)
                    .await?;
                }
                out.push(result);
            }
            let changed: Vec<(&str, &str)> = jobs
                .iter()
                .zip(&out)
                .filter(|(_, r)| !matches!(r, ApplyResult::Unchanged(_)))
                .map(|(j, _)| (j.namespace.as_str(), j.name.as_str()))
                .collect();
            if !changed.is_empty() {
                PgStore::job_changes(conn, &changed, &[]).await?;
            }
            Ok(out)
        })
    }

    async fn load_jobs(
        &self,
        after: Option<&(String, String)>,
        limit: u32,
    ) -> Result<Vec<StoredJob>> {
        let (ns, name) = after.cloned().unwrap_or_default();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            // A row value in the primary key's own order, so that each page
            // is a range of the key.
            "SELECT {JOB_COLUMNS} FROM jobs WHERE (namespace, name) > ($1, $2) \
             ORDER BY namespace, name LIMIT $3"
        )))
        .bind(&ns)
        .bind(&name)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::job(&Cells(r))).collect()
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<StoredJob>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = $1 AND name = $2"
        )))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
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
            "SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = $1 AND name COLLATE \"C\" > $2 ORDER BY name COLLATE \"C\" LIMIT $3"
        )))
        .bind(namespace)
        .bind(&after)
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.pool)
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
        transaction!(self, fenced = false, |conn| {
            let n = sqlx::query("DELETE FROM jobs WHERE namespace = $1 AND name = $2")
                .bind(namespace)
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if n == 1 {
                PgStore::job_changes(conn, &[], &[(namespace, name)]).await?;
            }
            Ok(n == 1)
        })
    }

    async fn set_paused(&self, namespace: &str, name: &str, paused: bool) -> Result<bool> {
        transaction!(self, fenced = false, |conn| {
            let n = sqlx::query("UPDATE jobs SET paused = $1 WHERE namespace = $2 AND name = $3")
                .bind(paused)
                .bind(namespace)
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if n == 1 {
                PgStore::job_changes(conn, &[(namespace, name)], &[]).await?;
            }
            Ok(n == 1)
        })
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
            "SELECT {VERSION_COLUMNS} FROM job_versions WHERE namespace = $1 AND name = $2 AND version < $3 ORDER BY version DESC LIMIT $4"
        )))
        .bind(namespace)
        .bind(name)
        .bind(before)
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.pool)
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
            "SELECT {VERSION_COLUMNS}, spec FROM job_versions WHERE namespace = $1 AND name = $2 AND version = $3"
        )))
        .bind(namespace)
        .bind(name)
        .bind(version)
        .fetch_optional(&self.pool)
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
        let namespaces: Vec<&str> = versions.iter().map(|v| v.0.as_str()).collect();
        let names: Vec<&str> = versions.iter().map(|v| v.1.as_str()).collect();
        let numbers: Vec<i64> = versions.iter().map(|v| v.2).collect();
        let rules: Vec<String> = versions.iter().map(|v| v.3.to_json()).collect();
        transaction!(self, fenced = false, |conn| {
            for table in ["job_versions", "jobs"] {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE {table} t SET rules = k.r
                     FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS k(ns, n, v, r)
                     WHERE t.namespace = k.ns AND t.name = k.n AND t.version = k.v AND t.rules IS NULL"
                )))
                .bind(&namespaces)
                .bind(&names)
                .bind(&numbers)
                .bind(&rules)
                .execute(&mut *conn)
                .await?;
            }
            Ok(())
        })
    }

    /// Two batches at once, each in a transaction on a connection of its
    /// own: while one waits for its commit to reach the disk or for the
    /// network, the database works on the other (a batch is applied by one
    /// backend, on one core).
    fn write_lanes(&self) -> usize {
        2
    }

    async fn write(&self, batch: &[Write]) -> Result<Vec<WriteResult>> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let epoch = self.epoch();
        let mut sent = 0;
        let results = transaction!(self, fenced = true, |conn| {
            // BEGIN, the fence check and COMMIT.
            sent += 3;
            let (out, notices) = batch::apply(conn, batch, epoch, &mut sent).await?;
            // Nodes with free capacity come and claim the attempts handed
            // to the cluster; owners take over the ends of attempts run
            // for them.
            for (told, channel) in [(notices.work, "work"), (notices.attempts, "attempts")] {
                if told {
                    sent += 1;
                    notify(conn, channel).await?;
                }
            }
            Ok(out)
        })?;
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .writes
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.stats.statements.fetch_add(sent, Ordering::Relaxed);
        Ok(results)
    }

    async fn last_fires(&self) -> Result<Vec<(String, String, Timestamp)>> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT namespace, job, MAX(scheduled_at) FROM fires GROUP BY namespace, job ORDER BY namespace, job",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.into_iter()
            .map(|(n, j, t)| Ok((n, j, ts(t)?)))
            .collect()
    }

    async fn last_fires_of(&self, jobs: &[(String, String)]) -> Result<Vec<Option<Timestamp>>> {
        let (namespaces, names): (Vec<&str>, Vec<&str>) =
            jobs.iter().map(|(n, j)| (n.as_str(), j.as_str())).unzip();
        let rows: Vec<Option<i64>> = sqlx::query_scalar(
            "SELECT (SELECT MAX(scheduled_at) FROM fires f WHERE f.namespace = k.ns AND f.job = k.job)
             FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(ns, job, i) ORDER BY k.i",
        )
        .bind(&namespaces)
        .bind(&names)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.into_iter().map(opt_ts).collect()
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
            "SELECT scheduled_at, outcome, run_id, calendar FROM fires WHERE namespace = $1 AND job = $2 AND scheduled_at >= $3 AND scheduled_at < $4 ORDER BY scheduled_at LIMIT $5",
        )
        .bind(namespace)
        .bind(job)
        .bind(from.as_microsecond())
        .bind(to.as_microsecond())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
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
        let epoch = self.epoch();
        self.load_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE state IN {} AND owner_epoch IS NOT DISTINCT FROM $1 ORDER BY id", dagcron_store::run_unfinished!()),
            move |q| q.bind(epoch),
        )
        .await
    }

    async fn count_unfinished_runs(&self, namespace: &str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE namespace = $1 AND state IN ('pending', 'running')",
        )
        .bind(namespace)
        .fetch_one(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(n as u64)
    }

    async fn get_run(&self, id: RunId) -> Result<Option<RunRecord>> {
        Ok(self
            .load_runs(
                format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"),
                move |q| q.bind(id),
            )
            .await?
            .pop())
    }

    async fn held_runs(&self, namespace: &str, limit: u32) -> Result<Vec<RunRecord>> {
        let namespace = namespace.to_string();
        self.load_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE namespace = $1 AND state IN ('pending', 'running') AND tasks::jsonb @> '[{{\"state\": \"held\"}}]' ORDER BY id LIMIT $2"),
            move |q| q.bind(namespace).bind(i64::from(limit)),
        )
        .await
    }

    async fn list_runs(
        &self,
        namespace: &str,
        job: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RunRecord>> {
        let before = dagcron_store::runs_before(cursor)?;
        let (namespace, job) = (namespace.to_string(), job.to_string());
        let items = self
            .load_runs(
                format!("SELECT {RUN_COLUMNS} FROM runs WHERE namespace = $1 AND job = $2 AND id < $3 ORDER BY id DESC LIMIT $4"),
                move |q| q.bind(namespace).bind(job).bind(before).bind(i64::from(limit) + 1),
            )
            .await?;
        Ok(Page::from_overfetch(
            items,
            limit,
            dagcron_store::run_cursor,
        ))
    }

    async fn planned_runs(&self, namespace: &str, job: &str, limit: u32) -> Result<Vec<RunRecord>> {
        let (namespace, job) = (namespace.to_string(), job.to_string());
        self.load_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE namespace = $1 AND job = $2 AND state = 'planned' ORDER BY scheduled_at, id LIMIT $3"),
            move |q| q.bind(namespace).bind(job).bind(i64::from(limit)),
        )
        .await
    }

    async fn create_token(&self, token: &TokenRecord, hash: &[u8]) -> Result<()> {
        sqlx::query("INSERT INTO tokens (id, name, role, namespace, hash, created_at, expires_at, created_by, labels) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(&token.id)
            .bind(&token.name)
            .bind(&token.role)
            .bind(&token.namespace)
            .bind(hash)
            .bind(token.created_at.as_microsecond())
            .bind(token.expires_at.map(|e| e.as_microsecond()))
            .bind(&token.created_by)
            .bind(
                token
                    .labels
                    .as_ref()
                    .map(|l| serde_json::to_string(l).expect("labels serialize")),
            )
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn find_token(&self, hash: &[u8]) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = $1"
        )))
        .bind(hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::token(&Cells(&r))).transpose()
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::token(&Cells(r))).collect()
    }

    async fn revoke_token(&self, id: &str, at: Timestamp) -> Result<bool> {
        let n =
            sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                .bind(at.as_microsecond())
                .bind(id)
                .execute(&self.pool)
                .await
                .map_err(unavailable)?
                .rows_affected();
        Ok(n == 1)
    }

    async fn token_used(&self, id: &str, at: Timestamp) -> Result<()> {
        sqlx::query("UPDATE tokens SET last_used_at = $1 WHERE id = $2")
            .bind(at.as_microsecond())
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn put_secret(&self, s: &SecretRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO secrets (namespace, name, version, key_id, nonce, ciphertext, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (namespace, name) DO UPDATE SET version = excluded.version, key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
        )
        .bind(&s.namespace)
        .bind(&s.name)
        .bind(s.version)
        .bind(&s.key_id)
        .bind(&s.nonce)
        .bind(&s.ciphertext)
        .bind(s.updated_at.as_microsecond())
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<SecretRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = $1 AND name = $2"
        )))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::secret(&Cells(&r))).transpose()
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = $1 ORDER BY name"
        )))
        .bind(namespace)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn list_all_secrets(&self) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets ORDER BY namespace, name"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn get_setting(&self, key: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)
    }

    async fn get_settings(&self, keys: [&str; 2]) -> Result<[Option<String>; 2]> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT key, value FROM settings WHERE key IN ($1, $2)")
                .bind(keys[0])
                .bind(keys[1])
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
        let of = |key: &str| rows.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        Ok([of(keys[0]), of(keys[1])])
    }

    async fn set_setting(&self, key: &str, value: Option<&str>, at: Timestamp) -> Result<()> {
        let query = match value {
            Some(value) => sqlx::query(
                "INSERT INTO settings (key, value, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            )
            .bind(key)
            .bind(value)
            .bind(at.as_microsecond()),
            None => sqlx::query("DELETE FROM settings WHERE key = $1").bind(key),
        };
        query.execute(&self.pool).await.map_err(unavailable)?;
        Ok(())
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        let before = before.as_microsecond();
        transaction!(self, fenced = false, |conn| {
            // The chain's lock: no append comes between the cut and its checkpoint.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('dagcron audit', 0))")
                .execute(&mut *conn)
                .await?;
            let cut: Option<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT seq, hash FROM audit WHERE seq = (SELECT max(seq) FROM audit
                   WHERE at < $1 AND seq < (SELECT max(seq) FROM audit))",
            )
            .bind(before)
            .fetch_optional(&mut *conn)
            .await?;
            let Some((seq, hash)) = cut else {
                return Ok(0);
            };
            let gone = sqlx::query("DELETE FROM audit WHERE seq <= $1")
                .bind(seq)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            sqlx::query(
                "INSERT INTO settings (key, value, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            )
            .bind(dagcron_store::AUDIT_CHECKPOINT)
            .bind(dagcron_store::checkpoint_text(seq, &hash))
            .bind(before)
            .execute(&mut *conn)
            .await?;
            Ok(gone)
        })
    }

    async fn count_secrets(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM secrets")
            .fetch_one(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(n as u64)
    }

    async fn delete_secret(&self, namespace: &str, name: &str) -> Result<bool> {
        let n = sqlx::query("DELETE FROM secrets WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?
            .rows_affected();
        Ok(n == 1)
    }

    async fn append_audit(&self, entry: AuditEntry) -> Result<()> {
        self.append_audit_grouped(entry).await
    }

    async fn list_audit(
        &self,
        after: i64,
        limit: u32,
        namespace: Option<&str>,
    ) -> Result<Vec<AuditEntry>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM audit
             WHERE seq > $1 AND ($2::text IS NULL OR namespace = $2) ORDER BY seq LIMIT $3",
            dagcron_store::rows::AUDIT_COLUMNS
        )))
        .bind(after)
        .bind(namespace)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::audit(&Cells(r))).collect()
    }

    async fn max_run_id(&self) -> Result<RunId> {
        let id: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM runs")
            .fetch_one(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(id.unwrap_or(0))
    }

    async fn request_cancel(&self, run: RunId) -> Result<bool> {
        transaction!(self, fenced = false, |conn| {
            let n = sqlx::query(concat!(
                "UPDATE runs SET cancel_requested = TRUE WHERE id = $1 AND state IN ",
                dagcron_store::run_unfinished!()
            ))
            .bind(run)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if n == 1 {
                notify(conn, "cancel").await?;
            }
            Ok(n == 1)
        })
    }

    async fn request_intervention(&self, run: RunId, task: &str, action: &str) -> Result<bool> {
        let (task, action) = (task.to_string(), action.to_string());
        transaction!(self, fenced = false, |conn| {
            let n = sqlx::query(
                    "INSERT INTO intervention_requests (run_id, task_id, action)
                     SELECT id, $2, $3 FROM runs WHERE id = $1 AND state IN ('pending', 'running') AND owner_epoch IS NOT NULL",
                )
                .bind(run)
                .bind(&task)
                .bind(&action)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if n == 1 {
                notify(conn, "cancel").await?;
            }
            Ok(n == 1)
        })
    }

    async fn claim_attempts(
        &self,
        limit: usize,
        agents: &[(BTreeMap<String, String>, usize)],
        at: Timestamp,
    ) -> Result<Vec<ClaimedAttempt>> {
        let Some(epoch) = self.epoch() else {
            return Ok(vec![]);
        };
        // For the node's own pool: attempts that need no agent; for each
        // agent with room: attempts whose labels it has.
        let mut wanted: Vec<(Option<String>, i64)> = Vec::new();
        if limit > 0 {
            wanted.push((None, i64::try_from(limit).unwrap_or(i64::MAX)));
        }
        for (labels, free) in agents.iter().filter(|(_, free)| *free > 0) {
            wanted.push((
                Some(labels_json(labels)),
                i64::try_from(*free).unwrap_or(i64::MAX),
            ));
        }
        if wanted.is_empty() {
            return Ok(vec![]);
        }
        let mut sent = 0;
        transaction!(self, fenced = true, |conn| {
            let mut claimed = Vec::new();
            for (labels, limit) in &wanted {
                claimed.extend(
                    claim_some(&mut *conn, labels.as_deref(), *limit, epoch, at, &mut sent).await?,
                );
            }
            Ok::<_, sqlx::Error>(claimed)
        })
    }

    async fn remote_attempts(&self) -> Result<Vec<RemoteAttempt>> {
        let Some(epoch) = self.epoch() else {
            return Ok(vec![]);
        };
        // A node counts as gone once it is marked dead, not merely when its
        // lease ends: marking waits for its in-flight batches.
        let rows: Vec<(RunId, String, i32, bool, String)> = sqlx::query_as(
            "SELECT s.run_id, s.task_id, s.number,
                    EXISTS (SELECT 1 FROM nodes n WHERE n.epoch = s.node_epoch AND n.state IN ('alive', 'draining')),
                    r.tasks
             FROM runs r JOIN shared_attempts s ON s.run_id = r.id
             WHERE r.owner_epoch = $1 AND r.state = 'running'
               AND s.node_epoch > 0 AND s.node_epoch <> $1",
        )
        .bind(epoch)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        let mut out = Vec::new();
        for (run, task, number, executor_alive, tasks) in rows {
            let number = number as u32;
            let tasks = rows::parse_tasks(run, &tasks)?;
            let attempt = rows::find_attempt(&tasks, &task, number)
                .filter(|a| a.state != AttemptState::Dispatching);
            if let Some(a) = attempt {
                out.push(RemoteAttempt {
                    state: a.state,
                    exit_code: a.exit_code,
                    error: a.error.clone(),
                    run,
                    task,
                    number,
                    executor_alive,
                });
            }
        }
        Ok(out)
    }

    async fn withdrawn_attempts(&self, attempts: &[AttemptKey]) -> Result<Vec<AttemptKey>> {
        if attempts.is_empty() {
            return Ok(vec![]);
        }
        let mut ids: Vec<RunId> = attempts.iter().map(|a| a.0).collect();
        ids.sort_unstable();
        ids.dedup();
        let rows: Vec<(RunId, String)> =
            sqlx::query_as("SELECT id, tasks FROM runs WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
        let mut tasks = BTreeMap::new();
        for (run, json) in rows {
            tasks.insert(run, rows::parse_tasks(run, &json)?);
        }
        Ok(attempts
            .iter()
            .filter(|(run, task, number)| {
                tasks
                    .get(run)
                    .and_then(|ts| rows::find_attempt(ts, task, *number))
                    .is_some_and(|a| a.state != AttemptState::Running)
            })
            .cloned()
            .collect())
    }

    async fn history_jobs(
        &self,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<dagcron_store::HistoryJob>> {
        self.history_jobs_(namespace, after, limit).await
    }

    async fn run_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: RunId,
        limit: u32,
    ) -> Result<Vec<dagcron_core::retention::RunFacts>> {
        self.run_history_(namespace, job, keep, after, limit).await
    }

    async fn fire_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: Option<Timestamp>,
        limit: u32,
    ) -> Result<Vec<dagcron_core::retention::FireFacts>> {
        self.fire_history_(namespace, job, keep, after, limit).await
    }

    async fn prune(&self, batch: &dagcron_store::Prune) -> Result<dagcron_store::Pruned> {
        self.prune_(batch).await
    }

    async fn read_log(&self, run: RunId, task: &str, number: u32) -> Result<Option<Vec<u8>>> {
        let row: Option<(String, Option<Vec<u8>>)> = sqlx::query_as(
            "SELECT r.tasks, l.log FROM runs r
             LEFT JOIN attempt_logs l ON l.run_id = r.id AND l.task_id = $2 AND l.number = $3
             WHERE r.id = $1",
        )
        .bind(run)
        .bind(task)
        .bind(number as i32)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        let Some((tasks, log)) = row else {
            return Ok(None);
        };
        let exists = rows::find_attempt(&rows::parse_tasks(run, &tasks)?, task, number).is_some();
        Ok(exists.then(|| log.unwrap_or_default()))
    }
}
