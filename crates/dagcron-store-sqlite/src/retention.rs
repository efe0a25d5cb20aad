//! The reads and the deletes of retention (see
//! [`dagcron_store::HistoryStore::history_jobs`] and its siblings).

use dagcron_store::prelude::*;
use dagcron_store::{Prune, Pruned, Result, run_ended};
use rusqlite::{OptionalExtension, Transaction, params};

use crate::SqliteStore;

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
    dagcron_store::shared_reads!(retention);

    async fn prune(&self, batch: &dagcron_store::Prune) -> Result<dagcron_store::Pruned> {
        if batch.is_empty() {
            return Ok(Default::default());
        }
        let batch = batch.clone();
        self.writer.transaction(move |tx| prune(tx, &batch)).await
    }
}
