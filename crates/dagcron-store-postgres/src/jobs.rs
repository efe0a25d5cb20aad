//! Jobs and their versions.

use dagcron_store::prelude::*;
use dagcron_store::rows::{self as read};
use dagcron_store::{ApplyResult, JobUpsert, Result, StoredJob};
use jiff::Timestamp;

use crate::transaction;
use crate::{Cells, JOB_COLUMNS, PgStore, unavailable};

impl JobStore for PgStore {
    dagcron_store::shared_reads!(jobs);

    async fn apply_jobs(&self, jobs: &[JobUpsert], at: Timestamp) -> Result<Vec<ApplyResult>> {
        let at = at.as_microsecond();
        transaction!(self, fenced = false, |conn| {
            let mut out = Vec::with_capacity(jobs.len());
            for j in jobs {
                // Concurrent applies of one job (from several nodes) take turns.
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))")
                    .bind(&j.namespace)
                    .bind(&j.name)
                    .execute(&mut *conn)
                    .await?;
                let current: Option<(i64, String, bool, Option<String>)> = sqlx::query_as(
                    "SELECT version, spec, paused, rules FROM jobs WHERE namespace = $1 AND name = $2",
                )
                .bind(&j.namespace)
                .bind(&j.name)
                .fetch_optional(&mut *conn)
                .await?;
                let rules = j.rules_json();
                let result = match current {
                    Some((v, spec, _, stored)) if !j.changes(&spec, stored.as_deref()) => {
                        ApplyResult::Unchanged(v)
                    }
                    Some((v, spec, paused, _)) => {
                        let paused = j.paused_over(Some((paused, &spec)));
                        sqlx::query("UPDATE jobs SET version = $1, spec = $2, updated_at = $3, paused = $4, rules = $5 WHERE namespace = $6 AND name = $7")
                                .bind(v + 1).bind(&j.spec).bind(at).bind(paused).bind(&rules).bind(&j.namespace).bind(&j.name)
                                .execute(&mut *conn).await?;
                        ApplyResult::Updated(v + 1)
                    }
                    None => {
                        // A re-created job continues its version history.
                        let last: Option<i64> = sqlx::query_scalar(
                                "SELECT MAX(version) FROM job_versions WHERE namespace = $1 AND name = $2",
                            )
                            .bind(&j.namespace)
                            .bind(&j.name)
                            .fetch_one(&mut *conn)
                            .await?;
                        let v = last.unwrap_or(0) + 1;
                        sqlx::query("INSERT INTO jobs (namespace, name, version, spec, paused, updated_at, rules) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                                .bind(&j.namespace).bind(&j.name).bind(v).bind(&j.spec).bind(j.paused_over(None)).bind(at).bind(&rules)
                                .execute(&mut *conn).await?;
                        ApplyResult::Created(v)
                    }
                };
                if let ApplyResult::Created(v) | ApplyResult::Updated(v) = result {
                    let by = j.origin.by.as_ref();
                    sqlx::query(
                        "INSERT INTO job_versions (namespace, name, version, spec, created_at, applied_by, applied_by_name, rollback_of, rules)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                         ON CONFLICT (namespace, name, version) DO UPDATE SET spec = EXCLUDED.spec, created_at = EXCLUDED.created_at,
                            applied_by = EXCLUDED.applied_by, applied_by_name = EXCLUDED.applied_by_name,
                            rollback_of = EXCLUDED.rollback_of, rules = EXCLUDED.rules",
                    )
                    .bind(&j.namespace)
                    .bind(&j.name)
                    .bind(v)
                    .bind(&j.spec)
                    .bind(at)
                    .bind(by.map(|a| a.id.as_str()))
                    .bind(by.map(|a| a.name.as_str()))
                    .bind(j.origin.rollback_of)
                    .bind(&rules)
                    .execute(&mut *conn)
                    .await?;
                }
                out.push(result);
            }
            let changed: Vec<(&str, &str)> = jobs
                .iter()
                .zip(&out)
                .filter(|(_, r)| !matches!(r, ApplyResult::Unchanged(_)))
                .map(|(j, _)| (j.namespace.as_str(), j.name.as_str()))
                .collect();
            if !changed.is_empty() {
                PgStore::job_changes(conn, &changed, &[]).await?;
            }
            Ok(out)
        })
    }

    async fn load_jobs(
        &self,
        after: Option<&(String, String)>,
        limit: u32,
    ) -> Result<Vec<StoredJob>> {
        let (ns, name) = after.cloned().unwrap_or_default();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            // A row value in the primary key's own order, so that each page
            // is a range of the key.
            "SELECT {JOB_COLUMNS} FROM jobs WHERE (namespace, name) > ($1, $2) \
             ORDER BY namespace, name LIMIT $3"
        )))
        .bind(&ns)
        .bind(&name)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::job(&Cells(r))).collect()
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<bool> {
        transaction!(self, fenced = false, |conn| {
            let n = sqlx::query("DELETE FROM jobs WHERE namespace = $1 AND name = $2")
                .bind(namespace)
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if n == 1 {
                PgStore::job_changes(conn, &[], &[(namespace, name)]).await?;
                sqlx::query(dagcron_store::outbox::DELETE_JOB_RUN_KEYS)
                    .bind(namespace)
                    .bind(name)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(n == 1)
        })
    }

    async fn set_paused(&self, namespace: &str, name: &str, paused: bool) -> Result<bool> {
        transaction!(self, fenced = false, |conn| {
            let n = sqlx::query("UPDATE jobs SET paused = $1 WHERE namespace = $2 AND name = $3")
                .bind(paused)
                .bind(namespace)
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if n == 1 {
                PgStore::job_changes(conn, &[(namespace, name)], &[]).await?;
            }
            Ok(n == 1)
        })
    }

    async fn stamp_rules(
        &self,
        versions: &[(String, String, i64, dagcron_core::Rules)],
    ) -> Result<()> {
        if versions.is_empty() {
            return Ok(());
        }
        let namespaces: Vec<&str> = versions.iter().map(|v| v.0.as_str()).collect();
        let names: Vec<&str> = versions.iter().map(|v| v.1.as_str()).collect();
        let numbers: Vec<i64> = versions.iter().map(|v| v.2).collect();
        let rules: Vec<String> = versions.iter().map(|v| v.3.to_json()).collect();
        transaction!(self, fenced = false, |conn| {
            for table in ["job_versions", "jobs"] {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE {table} t SET rules = k.r
                     FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS k(ns, n, v, r)
                     WHERE t.namespace = k.ns AND t.name = k.n AND t.version = k.v AND t.rules IS NULL"
                )))
                .bind(&namespaces)
                .bind(&names)
                .bind(&numbers)
                .bind(&rules)
                .execute(&mut *conn)
                .await?;
            }
            Ok(())
        })
    }
}
