//! The reads and the deletes of retention (see
//! [`dagcron_store::HistoryStore::history_jobs`] and its siblings). Two nodes
//! pruning at once is harmless: each row is checked again as it is
//! deleted, and a row another node deleted first is simply not counted.

use dagcron_core::retention::{FireFacts, RunFacts};
use dagcron_store::retention::{FireRow, HistoryRow, RunRow, fire_facts, history_job, run_facts};
use dagcron_store::{HistoryJob, Prune, Pruned, Result, RunId, run_ended};
use jiff::Timestamp;

use crate::{PgStore, transaction, unavailable};
use dagcron_store::prelude::*;

impl PgStore {
    pub(crate) async fn history_jobs_(
        &self,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<HistoryJob>> {
        let (after_ns, after_name) = after.unwrap_or(("", ""));
        let rows: Vec<HistoryRow> = sqlx::query_as(
            "SELECT v.namespace, v.name,
                CASE WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.namespace = v.namespace AND j.name = v.name) THEN NULL
                     ELSE (SELECT d.deleted_at FROM deleted_jobs d WHERE d.namespace = v.namespace AND d.name = v.name) END,
                f.scheduled_at, f.run_id
             FROM (SELECT DISTINCT namespace, name FROM job_versions
                   WHERE (namespace, name) > ($1, $2) AND ($3::text IS NULL OR namespace = $3)
                   ORDER BY namespace, name LIMIT $4) v
             LEFT JOIN LATERAL (SELECT scheduled_at, run_id FROM fires f
                   WHERE f.namespace = v.namespace AND f.job = v.name
                   ORDER BY f.scheduled_at DESC LIMIT 1) f ON TRUE
             ORDER BY v.namespace, v.name",
        )
        .bind(after_ns)
        .bind(after_name)
        .bind(namespace)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.into_iter().map(history_job).collect()
    }

    pub(crate) async fn run_history_(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: RunId,
        limit: u32,
    ) -> Result<Vec<RunFacts>> {
        let rows: Vec<RunRow> = sqlx::query_as(
            "SELECT r.id, r.state, r.created_at, r.finished_at,
                EXISTS (SELECT 1 FROM runs x WHERE x.rerun_of = r.id),
                (SELECT count(*) FROM jsonb_array_elements(r.tasks::jsonb) t, jsonb_array_elements(COALESCE(t->'attempts', '[]'::jsonb))),
                EXISTS (SELECT 1 FROM fires f WHERE f.namespace = r.namespace AND f.job = r.job AND f.scheduled_at = r.scheduled_at AND f.run_id = r.id)
             FROM runs r
             WHERE r.namespace = $1 AND r.job = $2 AND r.id > $3
               AND r.id <= (SELECT id FROM runs WHERE namespace = $1 AND job = $2 ORDER BY id DESC LIMIT 1 OFFSET $4)
             ORDER BY r.id LIMIT $5",
        )
        .bind(namespace)
        .bind(job)
        .bind(after)
        .bind(i64::from(keep))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.into_iter().map(run_facts).collect()
    }

    pub(crate) async fn fire_history_(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: Option<Timestamp>,
        limit: u32,
    ) -> Result<Vec<FireFacts>> {
        let rows: Vec<FireRow> = sqlx::query_as(
            "SELECT f.scheduled_at,
                f.run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs r WHERE r.id = f.run_id)
             FROM fires f
             WHERE f.namespace = $1 AND f.job = $2 AND f.scheduled_at > $3
               AND f.scheduled_at <= (SELECT scheduled_at FROM fires WHERE namespace = $1 AND job = $2 ORDER BY scheduled_at DESC LIMIT 1 OFFSET $4)
             ORDER BY f.scheduled_at LIMIT $5",
        )
        .bind(namespace)
        .bind(job)
        .bind(after.map_or(i64::MIN, Timestamp::as_microsecond))
        .bind(i64::from(keep))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.into_iter().map(fire_facts).collect()
    }

    pub(crate) async fn prune_(&self, batch: &Prune) -> Result<Pruned> {
        if batch.is_empty() {
            return Ok(Pruned::default());
        }
        let (f_ns, f_job, f_at): (Vec<&str>, Vec<&str>, Vec<i64>) = batch
            .fires
            .iter()
            .map(|(ns, job, at)| (ns.as_str(), job.as_str(), at.as_microsecond()))
            .collect();
        transaction!(self, fenced = false, |conn| {
            let mut out = Pruned::default();
            let gone: Vec<(i64, String, String, i64, i64)> = sqlx::query_as(concat!(
                "DELETE FROM runs r WHERE r.id = ANY($1) AND r.state IN ",
                run_ended!(),
                " AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.rerun_of = r.id)
                 RETURNING r.id, r.namespace, r.job, r.scheduled_at,
                    (SELECT count(*) FROM jsonb_array_elements(r.tasks::jsonb) t, jsonb_array_elements(COALESCE(t->'attempts', '[]'::jsonb)))"
            ))
            .bind(&batch.runs)
            .fetch_all(&mut *conn)
            .await?;
            if !gone.is_empty() {
                out.runs = gone.len() as u64;
                out.attempts = gone.iter().map(|g| g.4 as u64).sum();
                let (ids, ns, job, at): (Vec<i64>, Vec<String>, Vec<String>, Vec<i64>) = gone
                    .into_iter()
                    .map(|(i, n, j, a, _)| (i, n, j, a))
                    .collect();
                for table in ["attempt_logs", "shared_attempts"] {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DELETE FROM {table} WHERE run_id = ANY($1)"
                    )))
                    .bind(&ids)
                    .execute(&mut *conn)
                    .await?;
                }
                out.fires = sqlx::query(
                    "DELETE FROM fires f USING unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS g(ns, job, at, id)
                     WHERE f.namespace = g.ns AND f.job = g.job AND f.scheduled_at = g.at AND f.run_id = g.id",
                )
                .bind(&ns)
                .bind(&job)
                .bind(&at)
                .bind(&ids)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            }
            if !f_ns.is_empty() {
                out.fires += sqlx::query(
                    "DELETE FROM fires f USING unnest($1::text[], $2::text[], $3::bigint[]) AS g(ns, job, at)
                     WHERE f.namespace = g.ns AND f.job = g.job AND f.scheduled_at = g.at
                       AND (f.run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = f.run_id))
                       AND f.scheduled_at < (SELECT max(m.scheduled_at) FROM fires m WHERE m.namespace = g.ns AND m.job = g.job)",
                )
                .bind(&f_ns)
                .bind(&f_job)
                .bind(&f_at)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            }
            for (ns, job) in &batch.forget {
                let gone = sqlx::query(
                    "DELETE FROM deleted_jobs WHERE namespace = $1 AND name = $2
                       AND NOT EXISTS (SELECT 1 FROM jobs WHERE namespace = $1 AND name = $2)
                       AND NOT EXISTS (SELECT 1 FROM runs WHERE namespace = $1 AND job = $2)",
                )
                .bind(ns)
                .bind(job)
                .execute(&mut *conn)
                .await?
                .rows_affected();
                if gone == 0 {
                    continue;
                }
                out.jobs += 1;
                sqlx::query("DELETE FROM job_versions WHERE namespace = $1 AND name = $2")
                    .bind(ns)
                    .bind(job)
                    .execute(&mut *conn)
                    .await?;
                out.fires += sqlx::query("DELETE FROM fires WHERE namespace = $1 AND job = $2")
                    .bind(ns)
                    .bind(job)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
            }
            Ok(out)
        })
    }
}

impl HistoryStore for PgStore {
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
}
