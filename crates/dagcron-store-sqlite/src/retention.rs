//! The reads and the deletes of retention (see
//! [`dagcron_store::HistoryStore::history_jobs`] and its siblings).

use dagcron_core::retention::{FireFacts, RunFacts};
use dagcron_store::retention::{FireRow, HistoryRow, RunRow, fire_facts, history_job, run_facts};
use dagcron_store::{HistoryJob, Prune, Pruned, Result, RunId, run_ended};
use jiff::Timestamp;
use rusqlite::{OptionalExtension, Transaction, params};
use sqlx::SqlitePool;

use crate::{SqliteStore, unavailable};
use dagcron_store::prelude::*;

/// Jobs with versions, the instant of their deletion and their newest fire.
pub(crate) async fn history_jobs(
    reader: &SqlitePool,
    namespace: Option<&str>,
    after: Option<(&str, &str)>,
    limit: u32,
) -> Result<Vec<HistoryJob>> {
    let (after_ns, after_name) = after.unwrap_or(("", ""));
    let rows: Vec<HistoryRow> = sqlx::query_as(
        "SELECT v.namespace, v.name,
            CASE WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.namespace = v.namespace AND j.name = v.name) THEN NULL
                 ELSE (SELECT d.deleted_at FROM deleted_jobs d WHERE d.namespace = v.namespace AND d.name = v.name) END,
            (SELECT f.scheduled_at FROM fires f WHERE f.namespace = v.namespace AND f.job = v.name ORDER BY f.scheduled_at DESC LIMIT 1),
            (SELECT f.run_id FROM fires f WHERE f.namespace = v.namespace AND f.job = v.name ORDER BY f.scheduled_at DESC LIMIT 1)
         FROM (SELECT DISTINCT namespace, name FROM job_versions
               WHERE (namespace, name) > (?1, ?2) AND (?3 IS NULL OR namespace = ?3)
               ORDER BY namespace, name LIMIT ?4) v
         ORDER BY v.namespace, v.name",
    )
    .bind(after_ns)
    .bind(after_name)
    .bind(namespace)
    .bind(i64::from(limit))
    .fetch_all(reader)
    .await
    .map_err(unavailable)?;
    rows.into_iter().map(history_job).collect()
}

/// A job's runs but its `keep` newest, oldest first.
pub(crate) async fn run_history(
    reader: &SqlitePool,
    namespace: &str,
    job: &str,
    keep: u32,
    after: RunId,
    limit: u32,
) -> Result<Vec<RunFacts>> {
    let rows: Vec<RunRow> = sqlx::query_as(
        "SELECT r.id, r.state, r.created_at, r.finished_at,
            EXISTS (SELECT 1 FROM runs x WHERE x.rerun_of = r.id),
            (SELECT count(*) FROM attempts a WHERE a.run_id = r.id),
            EXISTS (SELECT 1 FROM fires f WHERE f.namespace = r.namespace AND f.job = r.job AND f.scheduled_at = r.scheduled_at AND f.run_id = r.id)
         FROM runs r
         WHERE r.namespace = ?1 AND r.job = ?2 AND r.id > ?3
           AND r.id <= (SELECT id FROM runs WHERE namespace = ?1 AND job = ?2 ORDER BY id DESC LIMIT 1 OFFSET ?4)
         ORDER BY r.id LIMIT ?5",
    )
    .bind(namespace)
    .bind(job)
    .bind(after)
    .bind(i64::from(keep))
    .bind(i64::from(limit))
    .fetch_all(reader)
    .await
    .map_err(unavailable)?;
    rows.into_iter().map(run_facts).collect()
}

/// A job's ledger rows but its `keep` newest, oldest first.
pub(crate) async fn fire_history(
    reader: &SqlitePool,
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
         WHERE f.namespace = ?1 AND f.job = ?2 AND f.scheduled_at > ?3
           AND f.scheduled_at <= (SELECT scheduled_at FROM fires WHERE namespace = ?1 AND job = ?2 ORDER BY scheduled_at DESC LIMIT 1 OFFSET ?4)
         ORDER BY f.scheduled_at LIMIT ?5",
    )
    .bind(namespace)
    .bind(job)
    .bind(after.map_or(i64::MIN, Timestamp::as_microsecond))
    .bind(i64::from(keep))
    .bind(i64::from(limit))
    .fetch_all(reader)
    .await
    .map_err(unavailable)?;
    rows.into_iter().map(fire_facts).collect()
}

/// Deletes one batch, each row checked again (see [`Prune`]).
pub(crate) fn prune(tx: &Transaction<'_>, batch: &Prune) -> rusqlite::Result<Pruned> {
    let mut out = Pruned::default();
    // Every run is checked as the batch starts (as one statement would):
    // a run re-run by another run of the same batch stays this time.
    let mut gone = Vec::with_capacity(batch.runs.len());
    for id in &batch.runs {
        let row: Option<(String, String, i64)> = tx
            .prepare_cached(concat!(
                "SELECT namespace, job, scheduled_at FROM runs WHERE id = ?1 AND state IN ",
                run_ended!(),
                " AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.rerun_of = ?1)"
            ))?
            .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        if let Some(row) = row {
            gone.push((*id, row));
        }
    }
    for (id, (ns, job, at)) in gone {
        out.runs += tx
            .prepare_cached("DELETE FROM runs WHERE id = ?1")?
            .execute(params![id])? as u64;
        out.attempts += tx
            .prepare_cached("DELETE FROM attempts WHERE run_id = ?1")?
            .execute(params![id])? as u64;
        tx.prepare_cached("DELETE FROM tasks WHERE run_id = ?1")?
            .execute(params![id])?;
        out.fires += tx
            .prepare_cached(
                "DELETE FROM fires WHERE namespace = ?1 AND job = ?2 AND scheduled_at = ?3 AND run_id = ?4",
            )?
            .execute(params![ns, job, at, id])? as u64;
    }
    for (ns, job, at) in &batch.fires {
        out.fires += tx
            .prepare_cached(
                "DELETE FROM fires WHERE namespace = ?1 AND job = ?2 AND scheduled_at = ?3
                   AND (run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = fires.run_id))
                   AND scheduled_at < (SELECT MAX(scheduled_at) FROM fires WHERE namespace = ?1 AND job = ?2)",
            )?
            .execute(params![ns, job, at.as_microsecond()])? as u64;
    }
    for (ns, job) in &batch.forget {
        let gone = tx
            .prepare_cached(
                "DELETE FROM deleted_jobs WHERE namespace = ?1 AND name = ?2
                   AND NOT EXISTS (SELECT 1 FROM jobs WHERE namespace = ?1 AND name = ?2)
                   AND NOT EXISTS (SELECT 1 FROM runs WHERE namespace = ?1 AND job = ?2)",
            )?
            .execute(params![ns, job])?;
        if gone == 0 {
            continue;
        }
        out.jobs += 1;
        tx.prepare_cached("DELETE FROM job_versions WHERE namespace = ?1 AND name = ?2")?
            .execute(params![ns, job])?;
        out.fires += tx
            .prepare_cached("DELETE FROM fires WHERE namespace = ?1 AND job = ?2")?
            .execute(params![ns, job])? as u64;
    }
    Ok(out)
}

impl HistoryStore for SqliteStore {
    async fn history_jobs(
        &self,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<dagcron_store::HistoryJob>> {
        history_jobs(&self.reader, namespace, after, limit).await
    }

    async fn run_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: RunId,
        limit: u32,
    ) -> Result<Vec<dagcron_core::retention::RunFacts>> {
        run_history(&self.reader, namespace, job, keep, after, limit).await
    }

    async fn fire_history(
        &self,
        namespace: &str,
        job: &str,
        keep: u32,
        after: Option<Timestamp>,
        limit: u32,
    ) -> Result<Vec<dagcron_core::retention::FireFacts>> {
        fire_history(&self.reader, namespace, job, keep, after, limit).await
    }

    async fn prune(&self, batch: &dagcron_store::Prune) -> Result<dagcron_store::Pruned> {
        if batch.is_empty() {
            return Ok(Default::default());
        }
        let batch = batch.clone();
        self.writer.transaction(move |tx| prune(tx, &batch)).await
    }
}
