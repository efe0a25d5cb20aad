//! The fire ledger, runs, their tasks and attempts, and captured output.

use std::sync::Arc;

use dagcron_store::prelude::*;
use dagcron_store::rows::{RUN_COLUMNS, opt_ts};
use dagcron_store::{Page, Result, RunFilter, RunId, RunRecord, Write, WriteResult};
use jiff::Timestamp;

use crate::{SqliteStore, active_runs_sql, unavailable, writer};

impl RunStore for SqliteStore {
    dagcron_store::shared_reads!(runs);

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

    async fn active_runs(&self) -> Result<Vec<RunRecord>> {
        self.load_runs(sqlx::query(sqlx::AssertSqlSafe(active_runs_sql())))
            .await
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

    async fn browse_runs(
        &self,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RunRecord>> {
        let plan = dagcron_store::sql::browse_runs(RUN_COLUMNS, filter, limit, cursor)?;
        let query = crate::bind_args(
            sqlx::query(sqlx::AssertSqlSafe(plan.sql.clone())),
            plan.args.clone(),
        );
        let items = self.load_runs(query).await?;
        dagcron_store::sql::browse_page(self, &plan, items, limit).await
    }

    async fn unfinished_runs(
        &self,
        namespace: &str,
        planned: bool,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        let sql = dagcron_store::sql::unfinished_runs_sql(RUN_COLUMNS, planned);
        let query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(namespace.to_string())
            .bind(i64::from(limit));
        self.load_runs(query).await
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

    async fn read_log_lines(&self, run: RunId, task: &str, number: u32) -> Result<Vec<u8>> {
        let lines: Option<Option<Vec<u8>>> = sqlx::query_scalar(
            "SELECT log_lines FROM attempts WHERE run_id = ? AND task_id = ? AND number = ?",
        )
        .bind(run)
        .bind(task)
        .bind(number)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        Ok(lines.flatten().unwrap_or_default())
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
