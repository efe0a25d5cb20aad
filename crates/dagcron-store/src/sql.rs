//! The reads both SQL backends share, written once: the statements (in
//! `$1`, `$2`, ... placeholders, which SQLite takes as PostgreSQL does)
//! and how their rows become records. A backend only runs a statement
//! ([`Reader::rows`], made by [`sql_reader!`](crate::sql_reader)) and
//! names the few places where its schema differs ([`Dialect`]); what
//! differs more (how a run's tasks are stored, how writes are batched)
//! stays with the backend.

use std::future::Future;

#[doc(hidden)]
pub use jiff::Timestamp;

use dagcron_core::retention::{FireFacts, JobFacts, RunFacts};

use crate::HistoryJob;
use crate::rows::{
    self as read, AUDIT_COLUMNS, Cells, DELIVERY_COLUMNS, NOTIFICATION_COLUMNS, SECRET_COLUMNS,
    TOKEN_COLUMNS, VERSION_COLUMNS, opt_ts, ts,
};
use crate::{
    AuditEntry, DeliveryAttempt, FireRecord, JobVersion, NotificationRecord, Page, Result, RunId,
    SecretRecord, StorageError, StoredJob, TokenRecord, VersionRecord,
};

/// A value bound to a placeholder.
#[derive(Clone, Debug)]
pub enum Arg {
    /// Text.
    Text(String),
    /// Text or NULL.
    OptText(Option<String>),
    /// A 64-bit integer.
    Int(i64),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Text(s.to_string())
    }
}

impl From<Option<&str>> for Arg {
    fn from(s: Option<&str>) -> Arg {
        Arg::OptText(s.map(str::to_string))
    }
}

impl From<i64> for Arg {
    fn from(i: i64) -> Arg {
        Arg::Int(i)
    }
}

impl From<&[u8]> for Arg {
    fn from(b: &[u8]) -> Arg {
        Arg::Bytes(b.to_vec())
    }
}

/// One row read, by position.
pub type Row = Box<dyn Cells + Send>;

/// Where a backend's schema differs from the other's, for the shared reads.
pub struct Dialect {
    /// Selects each job's namespace, name, version, spec, paused,
    /// updated_at and rules from a table aliased `j` (up to, not
    /// including, a `WHERE`).
    pub select_jobs: &'static str,
    /// Put after a text column to order and compare it by bytes (as job
    /// cursors do), whatever the database's collation.
    pub bytes_order: &'static str,
    /// The number of attempts of the run aliased `r`.
    pub run_attempts: &'static str,
}

/// Runs the shared reads of a backend.
pub trait Reader: Send + Sync {
    /// Its schema's differences.
    const DIALECT: Dialect;

    /// The rows `sql` selects, with `args` bound to `$1`, `$2`, ... in order.
    fn rows(&self, sql: &str, args: Vec<Arg>) -> impl Future<Output = Result<Vec<Row>>> + Send;
}

/// Implements [`Reader`] for a backend's store, reading through its pool
/// `$pool` (a field), its driver's errors turned into [`StorageError`]s
/// by `$unavailable`, with its [`Dialect`]; also defines the backend's
/// `Cells` wrapper (see [`cells!`](crate::cells)).
#[macro_export]
macro_rules! sql_reader {
    ($store:ty, $db:ty, $row:ty, $pool:ident, $unavailable:path, $dialect:expr) => {
        $crate::cells!($row);

        impl dagcron_store::sql::Reader for $store {
            const DIALECT: dagcron_store::sql::Dialect = $dialect;

            async fn rows(
                &self,
                sql: &str,
                args: Vec<dagcron_store::sql::Arg>,
            ) -> dagcron_store::Result<Vec<dagcron_store::sql::Row>> {
                let query = bind_args(
                    sqlx::query::<$db>(sqlx::AssertSqlSafe(sql.to_string())),
                    args,
                );
                let rows = query.fetch_all(&self.$pool).await.map_err($unavailable)?;
                Ok(rows
                    .into_iter()
                    .map(|row| Box::new(Cells(row)) as dagcron_store::sql::Row)
                    .collect())
            }
        }

        /// `query` with `args` bound to its placeholders, in order.
        pub(crate) fn bind_args<'q>(
            mut query: sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments>,
            args: Vec<dagcron_store::sql::Arg>,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments> {
            use dagcron_store::sql::Arg;
            for arg in args {
                query = match arg {
                    Arg::Text(v) => query.bind(v),
                    Arg::OptText(v) => query.bind(v),
                    Arg::Int(v) => query.bind(v),
                    Arg::Bytes(v) => query.bind(v),
                };
            }
            query
        }
    };
}

/// The methods of a store trait that are shared reads, each calling its
/// function here: `shared_reads!(auth);` inside a backend's
/// `impl AuthStore`, and likewise `jobs`, `runs`, `settings`, `audit` and
/// `retention` (the `HistoryStore`).
#[macro_export]
macro_rules! shared_reads {
    (audit) => {
        async fn list_audit(
            &self,
            after: i64,
            limit: u32,
            namespace: Option<&str>,
        ) -> $crate::Result<Vec<$crate::AuditEntry>> {
            $crate::sql::list_audit(self, after, limit, namespace).await
        }

        async fn list_audit_newest(
            &self,
            before: i64,
            limit: u32,
            namespace: Option<&str>,
        ) -> $crate::Result<Vec<$crate::AuditEntry>> {
            $crate::sql::list_audit_newest(self, before, limit, namespace).await
        }
    };
    (runs) => {
        async fn job_summaries(
            &self,
            namespace: &str,
            jobs: &[String],
            strip: u32,
            range: ($crate::sql::Timestamp, $crate::sql::Timestamp),
            fires: u32,
        ) -> $crate::Result<Vec<$crate::JobSummary>> {
            $crate::sql::job_summaries(self, namespace, jobs, strip, range, fires).await
        }

        async fn last_fires(
            &self,
        ) -> $crate::Result<Vec<(String, String, $crate::sql::Timestamp)>> {
            $crate::sql::last_fires(self).await
        }

        async fn list_fires(
            &self,
            namespace: &str,
            job: &str,
            from: $crate::sql::Timestamp,
            to: $crate::sql::Timestamp,
            limit: u32,
        ) -> $crate::Result<Vec<$crate::FireRecord>> {
            $crate::sql::list_fires(self, namespace, job, from, to, limit).await
        }

        async fn problem_fires(
            &self,
            namespace: &str,
            since: $crate::sql::Timestamp,
            limit: u32,
        ) -> $crate::Result<Vec<(String, $crate::FireRecord)>> {
            $crate::sql::problem_fires(self, namespace, since, limit).await
        }

        async fn count_unfinished_runs(&self, namespace: &str) -> $crate::Result<u64> {
            $crate::sql::count_unfinished_runs(self, namespace).await
        }

        async fn max_run_id(&self) -> $crate::Result<$crate::RunId> {
            $crate::sql::max_run_id(self).await
        }
    };
    (auth) => {
        async fn find_token(&self, hash: &[u8]) -> $crate::Result<Option<$crate::TokenRecord>> {
            $crate::sql::find_token(self, hash).await
        }

        async fn get_secret(
            &self,
            namespace: &str,
            name: &str,
        ) -> $crate::Result<Option<$crate::SecretRecord>> {
            $crate::sql::get_secret(self, namespace, name).await
        }

        async fn list_tokens(&self) -> $crate::Result<Vec<$crate::TokenRecord>> {
            $crate::sql::list_tokens(self).await
        }

        async fn list_secrets(&self, namespace: &str) -> $crate::Result<Vec<$crate::SecretRecord>> {
            $crate::sql::list_secrets(self, Some(namespace)).await
        }

        async fn list_all_secrets(&self) -> $crate::Result<Vec<$crate::SecretRecord>> {
            $crate::sql::list_secrets(self, None).await
        }

        async fn count_secrets(&self) -> $crate::Result<u64> {
            $crate::sql::count_secrets(self).await
        }
    };
    (jobs) => {
        async fn get_job(
            &self,
            namespace: &str,
            name: &str,
        ) -> $crate::Result<Option<$crate::StoredJob>> {
            $crate::sql::get_job(self, namespace, name).await
        }

        async fn list_job_versions(
            &self,
            namespace: &str,
            name: &str,
            limit: u32,
            cursor: Option<&str>,
        ) -> $crate::Result<$crate::Page<$crate::VersionRecord>> {
            $crate::sql::list_job_versions(self, namespace, name, limit, cursor).await
        }

        async fn list_jobs(
            &self,
            namespace: &str,
            limit: u32,
            cursor: Option<&str>,
        ) -> $crate::Result<$crate::Page<$crate::StoredJob>> {
            $crate::sql::list_jobs(self, namespace, limit, cursor).await
        }

        async fn get_job_version(
            &self,
            namespace: &str,
            name: &str,
            version: i64,
        ) -> $crate::Result<Option<$crate::JobVersion>> {
            $crate::sql::get_job_version(self, namespace, name, version).await
        }

        async fn attention_jobs(
            &self,
            namespace: &str,
            limit: u32,
        ) -> $crate::Result<Vec<$crate::StoredJob>> {
            $crate::sql::attention_jobs(self, namespace, limit).await
        }
    };
    (outbox) => {
        async fn list_notifications(
            &self,
            namespace: &str,
            failed_only: bool,
            before: Option<i64>,
            limit: u32,
        ) -> $crate::Result<Vec<$crate::NotificationRecord>> {
            $crate::sql::list_notifications(self, namespace, failed_only, before, limit).await
        }

        async fn delivery_attempts(&self, id: i64) -> $crate::Result<Vec<$crate::DeliveryAttempt>> {
            $crate::sql::delivery_attempts(self, id).await
        }

        async fn previous_run_end(
            &self,
            namespace: &str,
            job: &str,
            run: $crate::RunId,
        ) -> $crate::Result<Option<dagcron_core::RunState>> {
            $crate::sql::previous_run_end(self, namespace, job, run).await
        }

        async fn run_of_key(
            &self,
            namespace: &str,
            job: &str,
            key: &str,
        ) -> $crate::Result<Option<$crate::RunId>> {
            $crate::sql::run_of_key(self, namespace, job, key).await
        }
    };
    (settings) => {
        async fn get_setting(&self, key: &str) -> $crate::Result<Option<String>> {
            $crate::sql::get_setting(self, key).await
        }

        async fn get_settings(&self, keys: [&str; 2]) -> $crate::Result<[Option<String>; 2]> {
            $crate::sql::get_settings(self, keys).await
        }
    };
    (retention) => {
        async fn history_jobs(
            &self,
            namespace: Option<&str>,
            after: Option<(&str, &str)>,
            limit: u32,
        ) -> $crate::Result<Vec<$crate::HistoryJob>> {
            $crate::sql::history_jobs(self, namespace, after, limit).await
        }

        async fn run_history(
            &self,
            namespace: &str,
            job: &str,
            keep: u32,
            after: $crate::RunId,
            limit: u32,
        ) -> $crate::Result<Vec<dagcron_core::retention::RunFacts>> {
            $crate::sql::run_history(self, namespace, job, keep, after, limit).await
        }

        async fn fire_history(
            &self,
            namespace: &str,
            job: &str,
            keep: u32,
            after: Option<$crate::sql::Timestamp>,
            limit: u32,
        ) -> $crate::Result<Vec<dagcron_core::retention::FireFacts>> {
            $crate::sql::fire_history(self, namespace, job, keep, after, limit).await
        }
    };
}

/// Every row `sql` selects, each read by `read`.
async fn all<T>(
    db: &impl Reader,
    sql: &str,
    args: Vec<Arg>,
    read: impl Fn(&Row) -> Result<T>,
) -> Result<Vec<T>> {
    db.rows(sql, args).await?.iter().map(read).collect()
}

/// The first row `sql` selects, if any, read by `read`.
async fn first<T>(
    db: &impl Reader,
    sql: &str,
    args: Vec<Arg>,
    read: impl Fn(&Row) -> Result<T>,
) -> Result<Option<T>> {
    db.rows(sql, args).await?.first().map(read).transpose()
}

/// A count `sql` selects.
async fn count(db: &impl Reader, sql: &str, args: Vec<Arg>) -> Result<u64> {
    let n = first(db, sql, args, |r| Ok(r.int(0))).await?;
    Ok(n.unwrap_or(0).max(0) as u64)
}

/// A namespace's notifications, newest first (see
/// [`OutboxStore::list_notifications`](crate::OutboxStore::list_notifications)).
pub async fn list_notifications(
    db: &impl Reader,
    namespace: &str,
    failed_only: bool,
    before: Option<i64>,
    limit: u32,
) -> Result<Vec<NotificationRecord>> {
    let sql = format!(
        "SELECT {NOTIFICATION_COLUMNS} FROM notifications
         WHERE namespace = $1 AND id < $2 AND ($3 = 0 OR state = 'failed')
         ORDER BY id DESC LIMIT $4"
    );
    let args = vec![
        namespace.into(),
        before.unwrap_or(i64::MAX).into(),
        i64::from(failed_only).into(),
        i64::from(limit).into(),
    ];
    all(db, &sql, args, read::notification).await
}

/// The notifications whose ids are `ids` (those that exist), by id.
pub async fn notifications_by_id(db: &impl Reader, ids: &[i64]) -> Result<Vec<NotificationRecord>> {
    if ids.is_empty() {
        return Ok(vec![]);
    }
    // Ids are integers: written into the statement, they need no binding.
    let list = ids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT {NOTIFICATION_COLUMNS} FROM notifications WHERE id IN ({list}) ORDER BY id"
    );
    all(db, &sql, vec![], read::notification).await
}

/// A notification's delivery attempts, first first.
pub async fn delivery_attempts(db: &impl Reader, id: i64) -> Result<Vec<DeliveryAttempt>> {
    let sql = format!(
        "SELECT {DELIVERY_COLUMNS} FROM notification_deliveries WHERE notification_id = $1 ORDER BY number"
    );
    all(db, &sql, vec![id.into()], read::delivery).await
}

/// How the job's last run before `run` that succeeded or failed ended.
pub async fn previous_run_end(
    db: &impl Reader,
    namespace: &str,
    job: &str,
    run: RunId,
) -> Result<Option<dagcron_core::RunState>> {
    let sql = "SELECT state FROM runs WHERE namespace = $1 AND job = $2 AND id < $3
               AND state IN ('succeeded', 'failed') ORDER BY id DESC LIMIT 1";
    first(
        db,
        sql,
        vec![namespace.into(), job.into(), run.into()],
        |r| read::parse(&r.text(0)),
    )
    .await
}

/// The run of job (`namespace`, `job`) made with key `key`.
pub async fn run_of_key(
    db: &impl Reader,
    namespace: &str,
    job: &str,
    key: &str,
) -> Result<Option<RunId>> {
    let sql = "SELECT run_id FROM run_keys WHERE namespace = $1 AND job = $2 AND key = $3";
    first(
        db,
        sql,
        vec![namespace.into(), job.into(), key.into()],
        |r| Ok(r.int(0)),
    )
    .await
}

/// The token whose hash is `hash`.
pub async fn find_token(db: &impl Reader, hash: &[u8]) -> Result<Option<TokenRecord>> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = $1");
    first(db, &sql, vec![hash.into()], read::token).await
}

/// Every token, oldest first.
pub async fn list_tokens(db: &impl Reader) -> Result<Vec<TokenRecord>> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id");
    all(db, &sql, vec![], read::token).await
}

/// A namespace's secret.
pub async fn get_secret(
    db: &impl Reader,
    namespace: &str,
    name: &str,
) -> Result<Option<SecretRecord>> {
    let sql = format!("SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = $1 AND name = $2");
    first(db, &sql, vec![namespace.into(), name.into()], |r| {
        read::secret(r)
    })
    .await
}

/// A namespace's secrets by name, or every namespace's (none).
pub async fn list_secrets(db: &impl Reader, namespace: Option<&str>) -> Result<Vec<SecretRecord>> {
    let sql = format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE CAST($1 AS TEXT) IS NULL OR namespace = $1 ORDER BY namespace, name"
    );
    all(db, &sql, vec![namespace.into()], read::secret).await
}

/// How many secrets are stored.
pub async fn count_secrets(db: &impl Reader) -> Result<u64> {
    count(db, "SELECT count(*) FROM secrets", vec![]).await
}

/// A job as stored now.
pub async fn get_job<D: Reader>(db: &D, namespace: &str, name: &str) -> Result<Option<StoredJob>> {
    let sql = format!(
        "{} WHERE j.namespace = $1 AND j.name = $2",
        D::DIALECT.select_jobs
    );
    first(db, &sql, vec![namespace.into(), name.into()], |r| {
        read::job(r)
    })
    .await
}

/// A namespace's paused jobs and jobs with an open breaker, by name.
pub async fn attention_jobs<D: Reader>(
    db: &D,
    namespace: &str,
    limit: u32,
) -> Result<Vec<StoredJob>> {
    let Dialect {
        select_jobs,
        bytes_order: c,
        ..
    } = D::DIALECT;
    let sql = format!(
        "{select_jobs} WHERE j.namespace = $1 AND (j.paused OR j.breaker_opened_at IS NOT NULL) ORDER BY j.name{c} LIMIT $2"
    );
    all(
        db,
        &sql,
        vec![namespace.into(), i64::from(limit).into()],
        read::job,
    )
    .await
}

/// A page of a namespace's jobs by name.
pub async fn list_jobs<D: Reader>(
    db: &D,
    namespace: &str,
    limit: u32,
    cursor: Option<&str>,
) -> Result<Page<StoredJob>> {
    let after = crate::jobs_after(cursor)?;
    let Dialect {
        select_jobs,
        bytes_order: c,
        ..
    } = D::DIALECT;
    let sql = format!(
        "{select_jobs} WHERE j.namespace = $1 AND j.name{c} > $2 ORDER BY j.name{c} LIMIT $3"
    );
    let args = vec![namespace.into(), after.as_str().into(), overfetch(limit)];
    let items = all(db, &sql, args, read::job).await?;
    Ok(Page::from_overfetch(items, limit, crate::job_cursor))
}

/// One more than a page, to know whether another follows.
fn overfetch(limit: u32) -> Arg {
    Arg::Int(i64::from(limit) + 1)
}

/// A page of a job's versions, newest first.
pub async fn list_job_versions(
    db: &impl Reader,
    namespace: &str,
    name: &str,
    limit: u32,
    cursor: Option<&str>,
) -> Result<Page<VersionRecord>> {
    let before = crate::versions_before(cursor)?;
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM job_versions WHERE namespace = $1 AND name = $2 AND version < $3 ORDER BY version DESC LIMIT $4"
    );
    let args = vec![
        namespace.into(),
        name.into(),
        before.into(),
        overfetch(limit),
    ];
    let items = all(db, &sql, args, read::version).await?;
    Ok(Page::from_overfetch(items, limit, crate::version_cursor))
}

/// One version of a job, with its spec.
pub async fn get_job_version(
    db: &impl Reader,
    namespace: &str,
    name: &str,
    version: i64,
) -> Result<Option<JobVersion>> {
    let sql = format!(
        "SELECT {VERSION_COLUMNS}, spec FROM job_versions WHERE namespace = $1 AND name = $2 AND version = $3"
    );
    let args = vec![namespace.into(), name.into(), version.into()];
    first(db, &sql, args, |r| {
        Ok(JobVersion {
            info: read::version(r)?,
            spec: r.text(8),
        })
    })
    .await
}

/// Each job's newest fire in the ledger.
pub async fn last_fires(db: &impl Reader) -> Result<Vec<(String, String, Timestamp)>> {
    let sql = "SELECT namespace, job, MAX(scheduled_at) FROM fires GROUP BY namespace, job ORDER BY namespace, job";
    all(db, sql, vec![], |r| {
        Ok((r.text(0), r.text(1), ts(r.int(2))?))
    })
    .await
}

/// A job's ledger rows in `[from, to)`, oldest first.
pub async fn list_fires(
    db: &impl Reader,
    namespace: &str,
    job: &str,
    from: Timestamp,
    to: Timestamp,
    limit: u32,
) -> Result<Vec<FireRecord>> {
    let sql = "SELECT scheduled_at, outcome, run_id, calendar, sla_missed_at FROM fires WHERE namespace = $1 AND job = $2 AND scheduled_at >= $3 AND scheduled_at < $4 ORDER BY scheduled_at LIMIT $5";
    let args = vec![
        namespace.into(),
        job.into(),
        from.as_microsecond().into(),
        to.as_microsecond().into(),
        i64::from(limit).into(),
    ];
    all(db, sql, args, |r| {
        let outcome = r.text(1);
        Ok(FireRecord {
            scheduled_at: ts(r.int(0))?,
            outcome: dagcron_core::FireOutcome::parse(&outcome)
                .ok_or_else(|| StorageError::Corrupt(format!("fire outcome {outcome:?}")))?,
            run_id: r.opt_int(2),
            calendar: r.opt_text(3),
            sla_missed_at: crate::rows::opt_ts(r.opt_int(4))?,
        })
    })
    .await
}

/// See [`RunStore::job_summaries`](crate::RunStore::job_summaries): two
/// statements for a page of jobs, a branch per job in each (each branch
/// an index range: the job's newest runs, its first fires from `from`).
pub async fn job_summaries(
    db: &impl Reader,
    namespace: &str,
    jobs: &[String],
    strip: u32,
    (from, to): (Timestamp, Timestamp),
    fires: u32,
) -> Result<Vec<crate::JobSummary>> {
    /// Jobs a statement: well under SQLite's 500 branches of a compound
    /// select and its 32,766 placeholders.
    const CHUNK: usize = 100;
    // Each name once; a name asked twice gets the same summary twice.
    let mut by_name: std::collections::BTreeMap<&str, crate::JobSummary> = jobs
        .iter()
        .map(|j| (j.as_str(), Default::default()))
        .collect();
    let names: Vec<&str> = by_name.keys().copied().collect();
    for chunk in names.chunks(CHUNK) {
        // Branch i, for the job at placeholder $(first + i).
        let union = |first: usize, branch: &dyn Fn(usize, String) -> String| {
            (0..chunk.len())
                .map(|i| branch(i, format!("${}", first + i)))
                .collect::<Vec<_>>()
                .join(" UNION ALL ")
        };
        // Limits are numbers of ours: written into the statements.
        let runs_sql = union(2, &|i, job| {
            format!(
                "SELECT * FROM (SELECT job, id, state FROM runs WHERE namespace = $1 AND job = {job} ORDER BY id DESC LIMIT {strip}) AS r{i}"
            )
        });
        let fires_sql = union(4, &|i, job| {
            format!(
                "SELECT job, outcome, count(*) FROM (SELECT job, outcome FROM fires WHERE namespace = $1 AND job = {job} AND scheduled_at >= $2 AND scheduled_at < $3 ORDER BY scheduled_at LIMIT {fires}) AS f{i} GROUP BY job, outcome"
            )
        });
        let args = || chunk.iter().map(|j| Arg::from(*j));
        fn of<'a>(
            by_name: &'a mut std::collections::BTreeMap<&str, crate::JobSummary>,
            job: &str,
        ) -> Result<&'a mut crate::JobSummary> {
            by_name
                .get_mut(job)
                .ok_or_else(|| StorageError::Corrupt(format!("a row of job {job:?}, not asked")))
        }
        let runs_args = std::iter::once(namespace.into()).chain(args()).collect();
        for row in db.rows(&runs_sql, runs_args).await? {
            let state = read::parse(&row.text(2))?;
            of(&mut by_name, &row.text(0))?
                .runs
                .push((row.int(1), state));
        }
        let fires_args = [
            namespace.into(),
            from.as_microsecond().into(),
            to.as_microsecond().into(),
        ]
        .into_iter()
        .chain(args())
        .collect();
        for row in db.rows(&fires_sql, fires_args).await? {
            let outcome = row.text(1);
            let outcome = dagcron_core::FireOutcome::parse(&outcome)
                .ok_or_else(|| StorageError::Corrupt(format!("fire outcome {outcome:?}")))?;
            let n = u64::try_from(row.int(2)).unwrap_or(0);
            of(&mut by_name, &row.text(0))?.count(outcome, n);
        }
    }
    // A compound select keeps no order across its branches.
    for summary in by_name.values_mut() {
        summary.runs.sort_by_key(|r| std::cmp::Reverse(r.0));
    }
    Ok(jobs.iter().map(|j| by_name[j.as_str()].clone()).collect())
}

/// The statement of [`RunStore::browse_runs`](crate::RunStore::browse_runs)
/// selecting `columns` (a backend's run columns), and its arguments: one
/// more row than `limit`, to tell whether a next page follows. The
/// namespace and the job are looked up by index; the other filters are
/// checked on the newest [`BROWSE_SCAN`](crate::BROWSE_SCAN) runs before
/// the cursor (`scanned`: whether there are such filters).
pub fn browse_runs(
    columns: &str,
    filter: &crate::RunFilter,
    limit: u32,
    cursor: Option<&str>,
) -> Result<BrowseSql> {
    let mut args = vec![Arg::Int(crate::runs_before(cursor)?)];
    let mut indexed = "id < $1".to_string();
    let and = |sql: &mut String, args: &mut Vec<Arg>, clause: &str, arg: Arg| {
        args.push(arg);
        sql.push_str(&format!(" AND {clause} ${}", args.len()));
    };
    if let Some(ns) = &filter.namespace {
        and(&mut indexed, &mut args, "namespace =", ns.as_str().into());
    }
    if let Some(job) = &filter.job {
        and(&mut indexed, &mut args, "job =", job.as_str().into());
    }
    // The other filters, numbered after the window's size (SQLite numbers
    // `$N` by their order in the text).
    let mut others: Vec<(String, Vec<Arg>)> = Vec::new();
    if let Some(trigger) = filter.trigger {
        others.push(("trigger = {}".into(), vec![trigger.as_str().into()]));
    }
    if let Some(since) = filter.since {
        others.push((
            "scheduled_at >= {}".into(),
            vec![since.as_microsecond().into()],
        ));
    }
    if let Some(until) = filter.until {
        others.push((
            "scheduled_at < {}".into(),
            vec![until.as_microsecond().into()],
        ));
    }
    if let Some(ended) = filter.ended_since {
        others.push((
            "finished_at >= {}".into(),
            vec![ended.as_microsecond().into()],
        ));
    }
    if !filter.states.is_empty() {
        others.push((
            "state IN ({})".into(),
            filter
                .states
                .iter()
                .map(|s| Arg::from(s.as_str()))
                .collect(),
        ));
    }
    let scanned = !others.is_empty();
    let sql = if scanned {
        args.push(Arg::Int(i64::from(crate::BROWSE_SCAN)));
        let scan = args.len();
        let mut checked = String::new();
        for (clause, values) in others {
            let first = args.len() + 1;
            let marks: Vec<String> = (first..first + values.len())
                .map(|i| format!("${i}"))
                .collect();
            checked.push_str(" AND ");
            checked.push_str(&clause.replace("{}", &marks.join(", ")));
            args.extend(values);
        }
        args.push(Arg::Int(i64::from(limit) + 1));
        format!(
            "SELECT {columns} FROM (SELECT * FROM runs WHERE {indexed} ORDER BY id DESC LIMIT ${scan}) AS r WHERE TRUE{checked} ORDER BY id DESC LIMIT ${}",
            args.len()
        )
    } else {
        args.push(Arg::Int(i64::from(limit) + 1));
        format!(
            "SELECT {columns} FROM runs WHERE {indexed} ORDER BY id DESC LIMIT ${}",
            args.len()
        )
    };
    let floor = scanned.then(|| {
        let n = 1 + usize::from(filter.namespace.is_some()) + usize::from(filter.job.is_some());
        let floor_args = args[..n].to_vec();
        let floor_sql = format!(
            "SELECT MIN(id), COUNT(*) FROM (SELECT id FROM runs WHERE {indexed} ORDER BY id DESC LIMIT {}) AS r",
            crate::BROWSE_SCAN
        );
        (floor_sql, floor_args)
    });
    Ok(BrowseSql { sql, args, floor })
}

/// A page of the runs browser as statements (see [`browse_runs`]).
pub struct BrowseSql {
    /// The runs of the page.
    pub sql: String,
    /// Its arguments.
    pub args: Vec<Arg>,
    /// When the filters were checked on a window of runs: the statement of
    /// the window's oldest run and size, to continue from it.
    pub floor: Option<(String, Vec<Arg>)>,
}

/// The page of [`browse_runs`]: `items` (up to `limit + 1` read), and, when
/// they do not fill it and the window of runs looked at was full, a cursor
/// from the window's oldest run.
pub async fn browse_page(
    db: &impl Reader,
    plan: &BrowseSql,
    items: Vec<crate::RunRecord>,
    limit: u32,
) -> Result<crate::Page<crate::RunRecord>> {
    if items.len() > limit as usize {
        return Ok(crate::Page::from_overfetch(items, limit, crate::run_cursor));
    }
    if let Some((sql, args)) = &plan.floor {
        let window = first(db, sql, args.clone(), |r| Ok((r.opt_int(0), r.int(1)))).await?;
        if let Some((Some(oldest), n)) = window {
            if n >= i64::from(crate::BROWSE_SCAN) {
                return Ok(crate::Page {
                    items,
                    next_cursor: Some(format!("run:{oldest}")),
                });
            }
        }
    }
    Ok(crate::Page {
        items,
        next_cursor: None,
    })
}

/// The unfinished runs of a namespace (see
/// [`RunStore::unfinished_runs`](crate::RunStore::unfinished_runs)): the
/// statement, whose predicate is the partial indexes' own.
pub fn unfinished_runs_sql(columns: &str, planned: bool) -> String {
    if planned {
        format!(
            "SELECT {columns} FROM runs WHERE namespace = $1 AND state = 'planned' ORDER BY scheduled_at, id LIMIT $2"
        )
    } else {
        format!(
            "SELECT {columns} FROM runs WHERE namespace = $1 AND state IN ('pending', 'running') ORDER BY id DESC LIMIT $2"
        )
    }
}

/// The fires of a namespace since an instant that made no run on time,
/// newest first; served by the partial index `fires_not_made`, whose
/// predicate this repeats.
pub async fn problem_fires(
    db: &impl Reader,
    namespace: &str,
    since: Timestamp,
    limit: u32,
) -> Result<Vec<(String, FireRecord)>> {
    let sql = "SELECT job, scheduled_at, outcome, run_id, calendar, sla_missed_at FROM fires WHERE namespace = $1 AND scheduled_at >= $2 AND outcome <> 'fired' AND outcome <> 'suppressed' ORDER BY scheduled_at DESC LIMIT $3";
    let args = vec![
        namespace.into(),
        since.as_microsecond().into(),
        i64::from(limit).into(),
    ];
    all(db, sql, args, |r| {
        let outcome = r.text(2);
        Ok((
            r.text(0),
            FireRecord {
                scheduled_at: ts(r.int(1))?,
                outcome: dagcron_core::FireOutcome::parse(&outcome)
                    .ok_or_else(|| StorageError::Corrupt(format!("fire outcome {outcome:?}")))?,
                run_id: r.opt_int(3),
                calendar: r.opt_text(4),
                sla_missed_at: crate::rows::opt_ts(r.opt_int(5))?,
            },
        ))
    })
    .await
}

/// How many runs of a namespace are pending or running.
pub async fn count_unfinished_runs(db: &impl Reader, namespace: &str) -> Result<u64> {
    let sql = "SELECT count(*) FROM runs WHERE namespace = $1 AND state IN ('pending', 'running')";
    count(db, sql, vec![namespace.into()]).await
}

/// The highest run id stored (0: none).
pub async fn max_run_id(db: &impl Reader) -> Result<RunId> {
    let id = first(db, "SELECT MAX(id) FROM runs", vec![], |r| Ok(r.opt_int(0))).await?;
    Ok(id.flatten().unwrap_or(0))
}

/// A setting's value.
pub async fn get_setting(db: &impl Reader, key: &str) -> Result<Option<String>> {
    first(
        db,
        "SELECT value FROM settings WHERE key = $1",
        vec![key.into()],
        |r| Ok(r.text(0)),
    )
    .await
}

/// Two settings' values, in one read.
pub async fn get_settings(db: &impl Reader, keys: [&str; 2]) -> Result<[Option<String>; 2]> {
    let sql = "SELECT key, value FROM settings WHERE key IN ($1, $2)";
    let rows = all(db, sql, vec![keys[0].into(), keys[1].into()], |r| {
        Ok((r.text(0), r.text(1)))
    })
    .await?;
    let of = |key: &str| rows.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    Ok([of(keys[0]), of(keys[1])])
}

/// Audit rows after `after`, of one namespace or all.
pub async fn list_audit(
    db: &impl Reader,
    after: i64,
    limit: u32,
    namespace: Option<&str>,
) -> Result<Vec<AuditEntry>> {
    let sql = format!(
        "SELECT {AUDIT_COLUMNS} FROM audit WHERE seq > $1 AND (CAST($2 AS TEXT) IS NULL OR namespace = $2) ORDER BY seq LIMIT $3"
    );
    let args = vec![after.into(), namespace.into(), i64::from(limit).into()];
    all(db, &sql, args, read::audit).await
}

/// Audit rows before position `before`, newest first, of one namespace if
/// asked.
pub async fn list_audit_newest(
    db: &impl Reader,
    before: i64,
    limit: u32,
    namespace: Option<&str>,
) -> Result<Vec<AuditEntry>> {
    let sql = format!(
        "SELECT {AUDIT_COLUMNS} FROM audit WHERE seq < $1 AND (CAST($2 AS TEXT) IS NULL OR namespace = $2) ORDER BY seq DESC LIMIT $3"
    );
    let args = vec![before.into(), namespace.into(), i64::from(limit).into()];
    all(db, &sql, args, read::audit).await
}

/// Jobs with versions, the instant of their deletion and their newest fire
/// (see [`crate::HistoryStore::history_jobs`]).
pub async fn history_jobs(
    db: &impl Reader,
    namespace: Option<&str>,
    after: Option<(&str, &str)>,
    limit: u32,
) -> Result<Vec<HistoryJob>> {
    let (after_ns, after_name) = after.unwrap_or(("", ""));
    let sql = "SELECT v.namespace, v.name,
            CASE WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.namespace = v.namespace AND j.name = v.name) THEN NULL
                 ELSE (SELECT d.deleted_at FROM deleted_jobs d WHERE d.namespace = v.namespace AND d.name = v.name) END,
            (SELECT f.scheduled_at FROM fires f WHERE f.namespace = v.namespace AND f.job = v.name ORDER BY f.scheduled_at DESC LIMIT 1),
            (SELECT f.run_id FROM fires f WHERE f.namespace = v.namespace AND f.job = v.name ORDER BY f.scheduled_at DESC LIMIT 1)
         FROM (SELECT DISTINCT namespace, name FROM job_versions
               WHERE (namespace, name) > ($1, $2) AND (CAST($3 AS TEXT) IS NULL OR namespace = $3)
               ORDER BY namespace, name LIMIT $4) v
         ORDER BY v.namespace, v.name";
    let args = vec![
        after_ns.into(),
        after_name.into(),
        namespace.into(),
        i64::from(limit).into(),
    ];
    all(db, sql, args, |r| {
        Ok(HistoryJob {
            namespace: r.text(0),
            name: r.text(1),
            facts: JobFacts {
                deleted_at: opt_ts(r.opt_int(2))?,
                newest_fire: opt_ts(r.opt_int(3))?.map(|at| (at, r.opt_int(4))),
            },
        })
    })
    .await
}

/// A job's runs but its `keep` newest, oldest first (see
/// [`crate::HistoryStore::run_history`]).
pub async fn run_history<D: Reader>(
    db: &D,
    namespace: &str,
    job: &str,
    keep: u32,
    after: RunId,
    limit: u32,
) -> Result<Vec<RunFacts>> {
    let sql = format!(
        "SELECT r.id, r.state, r.created_at, r.finished_at,
            EXISTS (SELECT 1 FROM runs x WHERE x.rerun_of = r.id),
            {},
            EXISTS (SELECT 1 FROM fires f WHERE f.namespace = r.namespace AND f.job = r.job AND f.scheduled_at = r.scheduled_at AND f.run_id = r.id)
         FROM runs r
         WHERE r.namespace = $1 AND r.job = $2 AND r.id > $3
           AND r.id <= (SELECT id FROM runs WHERE namespace = $1 AND job = $2 ORDER BY id DESC LIMIT 1 OFFSET $4)
         ORDER BY r.id LIMIT $5",
        D::DIALECT.run_attempts
    );
    let args = vec![
        namespace.into(),
        job.into(),
        after.into(),
        i64::from(keep).into(),
        i64::from(limit).into(),
    ];
    all(db, &sql, args, |r| {
        Ok(RunFacts {
            id: r.int(0),
            state: read::parse(&r.text(1))?,
            created_at: ts(r.int(2))?,
            finished_at: opt_ts(r.opt_int(3))?,
            rerun: r.flag(4),
            attempts: r.int(5).max(0) as u64,
            fired: r.flag(6),
        })
    })
    .await
}

/// A job's ledger rows but its `keep` newest, oldest first (see
/// [`crate::HistoryStore::fire_history`]).
pub async fn fire_history(
    db: &impl Reader,
    namespace: &str,
    job: &str,
    keep: u32,
    after: Option<Timestamp>,
    limit: u32,
) -> Result<Vec<FireFacts>> {
    let sql = "SELECT f.scheduled_at,
            f.run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs r WHERE r.id = f.run_id)
         FROM fires f
         WHERE f.namespace = $1 AND f.job = $2 AND f.scheduled_at > $3
           AND f.scheduled_at <= (SELECT scheduled_at FROM fires WHERE namespace = $1 AND job = $2 ORDER BY scheduled_at DESC LIMIT 1 OFFSET $4)
         ORDER BY f.scheduled_at LIMIT $5";
    let args = vec![
        namespace.into(),
        job.into(),
        after.map_or(i64::MIN, Timestamp::as_microsecond).into(),
        i64::from(keep).into(),
        i64::from(limit).into(),
    ];
    all(db, sql, args, |r| {
        Ok(FireFacts {
            scheduled_at: ts(r.int(0))?,
            run_stored: r.flag(1),
        })
    })
    .await
}
