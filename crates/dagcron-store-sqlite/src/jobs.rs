//! Jobs and their versions.

use dagcron_store::prelude::*;
use dagcron_store::rows::{self as read, VERSION_COLUMNS};
use dagcron_store::{
    ApplyResult, JobUpsert, JobVersion, Page, Result, StoredJob, StoredTimingRow, VersionRecord,
};
use jiff::Timestamp;
use sqlx::Row;

use crate::{Cells, SELECT_JOBS, SqliteStore, unavailable, writer};

impl JobStore for SqliteStore {
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
}
