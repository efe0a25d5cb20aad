//! The shared storage backend: PostgreSQL.
//!
//! Every node of a cluster uses the same database. Write batches run in one
//! transaction each; once a node has registered (see [`Coordination`]),
//! every batch first checks the node's row under a share lock and is refused
//! with [`StorageError::Fenced`] when the node's lease has ended or its epoch
//! was replaced. Unique keys (the fire ledger's (job, scheduled instant),
//! attempt numbers) and compare-and-set updates refuse anything doubled.
//!
//! # How it works
//!
//! The shared backend on PostgreSQL (sqlx): the same store traits,
//! plus `Coordination`. Each batch is one transaction, fenced by the writer's node
//! row once the node has registered; deadlocks and serialization failures are
//! retried. **A run is one row**: its tasks and their attempts are kept in it
//! (`runs.tasks`, JSON; `rows.rs`), their output apart (`attempt_logs`, a row
//! only for an attempt with output), so a run of one task is written twice
//! (inserted, then updated at its end) instead of six rows. `batch.rs` inserts
//! a batch's fires in one statement, reads the rows of the runs its other
//! writes change in one, applies the writes to them in order in memory (the
//! reference meaning of each write, `dagcron_store::run_row::apply`), and writes the new runs and the changed rows back in one
//! statement each. A row is written back only if its `rev` is still the one
//! read: a row another node changed meanwhile (it claimed one of the run's
//! attempts, or ended one it ran for the owner) is read again and its writes
//! applied again, since a run's writes depend on its own row alone. Rows are
//! written in order of id, so batches over the same runs do not deadlock.
//! The write path is property-tested against the in-memory store (same
//! results, same runs). Views named `tasks` and
//! `attempts` read the rows back as tables, for people and tests.
//! `audit.rs` groups the appends to the audit log that wait for the
//! chain's lock (one transaction per group; each caller returns once its
//! row is committed). Statements are planned for their parameters on every
//! run (`plan_cache_mode = force_custom_plan`): a generic plan cached while
//! a new database's tables were nearly empty scanned them whole as they
//! grew; and a batch's transaction turns hash and merge joins off
//! for itself, so that each statement looks its rows up by key instead of
//! hashing a table of history that is large next to the batch but not yet
//! large enough for the planner to probe it. Migrations in `migrations/`.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dagcron_core::RunState;
use dagcron_store::{ClaimedAttempt, NewRun, Result, RunId, RunRecord, StorageError};
use jiff::Timestamp;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};

mod audit;
mod auth;
mod batch;
mod cluster;
mod jobs;
mod outbox;
mod retention;
mod rows;
mod runs;
mod settings;
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

pub(crate) use dagcron_store::rows::{self as read, parse, ts};

dagcron_store::sql_reader!(
    PgStore,
    sqlx::Postgres,
    PgRow,
    pool,
    unavailable,
    dagcron_store::sql::Dialect {
        select_jobs: "SELECT j.namespace, j.name, j.version, j.spec, j.paused, j.updated_at, j.rules, j.breaker_opened_at, j.breaker_run, j.breaker_failures FROM jobs AS j",
        bytes_order: " COLLATE \"C\"",
        run_attempts: "(SELECT count(*) FROM jsonb_array_elements(r.tasks::jsonb) t, jsonb_array_elements(COALESCE(t->'attempts', '[]'::jsonb)))",
    }
);

/// A run's columns, then its tasks (see [`rows::Row`]).
const RUN_COLUMNS: &str = concat!(dagcron_store::run_columns!(), ", tasks");
/// A job's columns, as [`dagcron_store::rows::job`] reads them.
pub(crate) const JOB_COLUMNS: &str = "namespace, name, version, spec, paused, updated_at, rules, breaker_opened_at, breaker_run, breaker_failures";

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
type ClaimedRun = (
    RunId,
    String,
    String,
    i64,
    String,
    Option<String>,
    i64,
    String,
);

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
            ORDER BY rank LIMIT $1 FOR UPDATE SKIP LOCKED
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
        "SELECT id, namespace, job, scheduled_at, params, trace, job_version, tasks FROM runs WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    let runs: BTreeMap<RunId, _> = runs.into_iter().map(|r| (r.0, r)).collect();
    let corrupt = |e: StorageError| sqlx::Error::Decode(Box::new(e));
    let mut out = Vec::with_capacity(claimed.len());
    // Each run's tasks read once, however many of its attempts were claimed.
    let mut parsed: BTreeMap<RunId, Vec<dagcron_store::run_row::Task>> = BTreeMap::new();
    for (run, task, number) in claimed {
        let (_, namespace, job, scheduled_at, params, trace, job_version, tasks) = &runs[&run];
        let tasks = match parsed.entry(run) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(dagcron_store::run_row::parse_tasks(run, tasks).map_err(corrupt)?)
            }
        };
        let position = tasks
            .iter()
            .position(|t| t.id == task)
            .unwrap_or(usize::MAX);
        out.push(ClaimedAttempt {
            item: tasks.get(position).and_then(|t| t.item.clone()),
            position,
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
            outputs: dagcron_store::run_row::task_outputs(tasks),
        });
    }
    Ok(out)
}
