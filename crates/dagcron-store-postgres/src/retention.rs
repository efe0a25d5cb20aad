//! The reads and the deletes of retention (see
//! [`dagcron_store::HistoryStore::history_jobs`] and its siblings). Two nodes
//! pruning at once is harmless: each row is checked again as it is
//! deleted, and a row another node deleted first is simply not counted.

use dagcron_store::prelude::*;
use dagcron_store::{Prune, Pruned, Result, run_ended};

use crate::{PgStore, transaction};

impl PgStore {
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
    dagcron_store::shared_reads!(retention);

    async fn prune(&self, batch: &dagcron_store::Prune) -> Result<dagcron_store::Pruned> {
        self.prune_(batch).await
    }
}
