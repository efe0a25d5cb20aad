//! Jobs and their versions.

use dagcron_store::prelude::*;
use dagcron_store::{ApplyResult, JobUpsert, Result, StoredJob, StoredTimingRow};
use jiff::Timestamp;

use crate::{SqliteStore, writer};

impl JobStore for SqliteStore {
    dagcron_store::shared_reads!(jobs);

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
                    tx.execute(
                        dagcron_store::outbox::DELETE_JOB_RUN_KEYS,
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
