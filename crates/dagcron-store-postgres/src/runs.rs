//! The fire ledger, runs, their tasks and attempts, and captured output.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use dagcron_core::AttemptState;
use dagcron_store::prelude::*;
use dagcron_store::rows::{labels_json, opt_ts};
use dagcron_store::{
    AttemptKey, ClaimedAttempt, LiveLogWrite, Page, RemoteAttempt, Result, RunFilter, RunId,
    RunRecord, Write, WriteResult,
};
use jiff::Timestamp;

use crate::transaction;

/// A published live log not refreshed for this long is deleted: its node
/// died, or its attempt wrote nothing for that long (it is published again
/// at its next output).
const LIVE_LOG_KEPT_US: i64 = 6 * 3600 * 1_000_000;
use crate::{PgStore, RUN_COLUMNS, batch, claim_some, notify, rows, unavailable};

impl RunStore for PgStore {
    dagcron_store::shared_reads!(runs);

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

    /// Two batches at once, each in a transaction on a connection of its
    /// own: while one waits for its commit to reach the disk or for the
    /// network, the database works on the other (a batch is applied by one
    /// backend, on one core).
    fn write_lanes(&self) -> usize {
        2
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

    async fn active_runs(&self) -> Result<Vec<RunRecord>> {
        let epoch = self.epoch();
        self.load_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE state IN {} AND owner_epoch IS NOT DISTINCT FROM $1 ORDER BY id", dagcron_store::run_unfinished!()),
            move |q| q.bind(epoch),
        )
        .await
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

    async fn browse_runs(
        &self,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RunRecord>> {
        let plan = dagcron_store::sql::browse_runs(RUN_COLUMNS, filter, limit, cursor)?;
        let args = plan.args.clone();
        let items = self
            .load_runs(plan.sql.clone(), move |q| crate::bind_args(q, args))
            .await?;
        dagcron_store::sql::browse_page(self, &plan, items, limit).await
    }

    async fn unfinished_runs(
        &self,
        namespace: &str,
        planned: bool,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        let namespace = namespace.to_string();
        self.load_runs(
            dagcron_store::sql::unfinished_runs_sql(RUN_COLUMNS, planned),
            move |q| q.bind(namespace).bind(i64::from(limit)),
        )
        .await
    }

    async fn planned_runs(&self, namespace: &str, job: &str, limit: u32) -> Result<Vec<RunRecord>> {
        let (namespace, job) = (namespace.to_string(), job.to_string());
        self.load_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE namespace = $1 AND job = $2 AND state = 'planned' ORDER BY scheduled_at, id LIMIT $3"),
            move |q| q.bind(namespace).bind(job).bind(i64::from(limit)),
        )
        .await
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
                    outputs: a.outputs.clone(),
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

    async fn put_live_logs(&self, logs: Vec<LiveLogWrite>) -> Result<()> {
        if logs.is_empty() {
            return Ok(());
        }
        let now = Timestamp::now().as_microsecond();
        transaction!(self, fenced = false, |conn| {
            for l in &logs {
                match &l.log {
                    Some(bytes) => {
                        sqlx::query(
                            "INSERT INTO live_logs (run_id, task_id, number, log, updated_at, skipped) VALUES ($1, $2, $3, $4, $5, $6)
                             ON CONFLICT (run_id, task_id, number) DO UPDATE SET log = EXCLUDED.log, updated_at = EXCLUDED.updated_at, skipped = EXCLUDED.skipped",
                        )
                        .bind(l.run)
                        .bind(&l.task)
                        .bind(l.number as i32)
                        .bind(bytes)
                        .bind(now)
                        .bind(i64::try_from(l.skipped).unwrap_or(i64::MAX))
                        .execute(&mut *conn)
                        .await?;
                    }
                    None => {
                        sqlx::query(
                            "DELETE FROM live_logs WHERE run_id = $1 AND task_id = $2 AND number = $3",
                        )
                        .bind(l.run)
                        .bind(&l.task)
                        .bind(l.number as i32)
                        .execute(&mut *conn)
                        .await?;
                    }
                }
            }
            // What a node that died left behind.
            sqlx::query("DELETE FROM live_logs WHERE updated_at < $1")
                .bind(now - LIVE_LOG_KEPT_US)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
    }

    async fn read_log_lines(&self, run: RunId, task: &str, number: u32) -> Result<Vec<u8>> {
        let lines: Option<Option<Vec<u8>>> = sqlx::query_scalar(
            "SELECT lines FROM attempt_logs WHERE run_id = $1 AND task_id = $2 AND number = $3",
        )
        .bind(run)
        .bind(task)
        .bind(number as i32)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(lines.flatten().unwrap_or_default())
    }

    async fn read_live_log(
        &self,
        run: RunId,
        task: &str,
        number: u32,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        let row: Option<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT skipped, log FROM live_logs WHERE run_id = $1 AND task_id = $2 AND number = $3",
        )
        .bind(run)
        .bind(task)
        .bind(number as i32)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(row.map(|(skipped, log)| (skipped.max(0) as u64, log)))
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
