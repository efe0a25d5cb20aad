//! [`Coordination`] on PostgreSQL: the `nodes` table, run hand-over, and
//! change announcements with `LISTEN`/`NOTIFY`.

use std::time::Duration;

use std::sync::atomic::Ordering;

use dagcron_store::cluster::{
    Coordination, Heartbeat, JobChanges, NodeRecord, NodeState, OrphanRun, Registration,
    WriteStatistics,
};
use dagcron_store::{Result, RunId, RunRecord, StorageError};
use jiff::Timestamp;
use sqlx::Row;
use sqlx::postgres::{PgListener, PgRow};

use crate::{
    CHANNEL, Cells, Fence, JOB_COLUMNS, PgStore, RUN_COLUMNS, notify, parse, read, transaction, ts,
    unavailable,
};

/// Run ids carry the slot of their node; this many nodes can be alive at once.
pub const MAX_NODES: u8 = 32;

const NODE_COLUMNS: &str = "id, epoch, slot, state, eligible, address, version, \
    (extract(epoch FROM started_at) * 1000000)::bigint, \
    (extract(epoch FROM heartbeat_at) * 1000000)::bigint, \
    (extract(epoch FROM lease_until) * 1000000)::bigint, \
    lease_until > now(), clock_skew_us, owned_jobs";

fn node_from_row(row: &PgRow) -> Result<NodeRecord> {
    Ok(NodeRecord {
        id: row.get(0),
        epoch: row.get(1),
        slot: row.get::<i16, _>(2) as u8,
        state: parse(row.get::<&str, _>(3))?,
        eligible: row.get(4),
        address: row.get(5),
        version: row.get(6),
        started_at: ts(row.get(7))?,
        heartbeat_at: ts(row.get(8))?,
        lease_until: ts(row.get(9))?,
        lease_valid: row.get(10),
        clock_skew_us: row.get(11),
        owned_jobs: row.get(12),
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl PgStore {
    fn registered(&self) -> Result<Fence> {
        self.fence()
            .ok_or_else(|| StorageError::Invalid("this node has not registered".into()))
    }
}

impl Coordination for PgStore {
    fn write_statistics(&self) -> WriteStatistics {
        WriteStatistics {
            batches: self.stats.batches.load(Ordering::Relaxed),
            writes: self.stats.writes.load(Ordering::Relaxed),
            statements: self.stats.statements.load(Ordering::Relaxed),
        }
    }

    async fn register(
        &self,
        id: &str,
        address: &str,
        version: &str,
        ttl: Duration,
    ) -> Result<Registration> {
        // One statement, so that nothing is held across round trips: the
        // lock that registrations take (never a heartbeat) lasts as long as
        // the function runs in the database, however slow this node's link.
        let row: (Option<i64>, Option<i16>) =
            sqlx::query_as("SELECT r_epoch, r_slot FROM dagcron_register($1, $2, $3, $4, $5)")
                .bind(id)
                .bind(address)
                .bind(version)
                .bind(millis(ttl))
                .bind(i32::from(MAX_NODES))
                .fetch_one(&self.pool)
                .await
                .map_err(unavailable)?;
        let (Some(epoch), Some(slot)) = row else {
            return Err(StorageError::Invalid(format!(
                "the cluster already has {MAX_NODES} live nodes, the most it can hold"
            )));
        };
        *self.fence.write().expect("fence lock") = Some(Fence {
            id: id.to_string(),
            epoch,
        });
        Ok(Registration {
            id: id.to_string(),
            epoch,
            slot: slot as u8,
        })
    }

    async fn heartbeat(&self, beat: Heartbeat, ttl: Duration) -> Result<bool> {
        let fence = self.registered()?;
        let n = sqlx::query(
            "UPDATE nodes SET heartbeat_at = now(), lease_until = now() + $3 * interval '1 millisecond',
                eligible = $4, clock_skew_us = $5, owned_jobs = $6
             WHERE id = $1 AND epoch = $2 AND state IN ('alive', 'draining') AND lease_until > now()",
        )
        .bind(&fence.id)
        .bind(fence.epoch)
        .bind(millis(ttl))
        .bind(beat.eligible)
        .bind(beat.clock_skew_us)
        .bind(beat.owned_jobs)
        .execute(&self.pool)
        .await
        .map_err(unavailable)?
        .rows_affected();
        Ok(n == 1)
    }

    async fn set_state(&self, state: NodeState) -> Result<()> {
        let fence = self.registered()?;
        let state = state.as_str();
        transaction!(self, fenced = false, |conn| {
            sqlx::query(
                    "UPDATE nodes SET state = $3,
                        lease_until = CASE WHEN $3 IN ('left', 'dead') THEN LEAST(lease_until, now()) ELSE lease_until END
                     WHERE id = $1 AND epoch = $2",
                )
                .bind(&fence.id)
                .bind(fence.epoch)
                .bind(state)
                .execute(&mut *conn)
                .await?;
            notify(conn, "nodes").await
        })
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {NODE_COLUMNS} FROM nodes ORDER BY id"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(node_from_row).collect()
    }

    async fn database_now(&self) -> Result<Timestamp> {
        let us: i64 =
            sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
                .fetch_one(&self.pool)
                .await
                .map_err(unavailable)?;
        ts(us)
    }

    async fn reap(&self) -> Result<Vec<NodeRecord>> {
        transaction!(self, fenced = false, |conn| {
                // Locking the rows `FOR UPDATE` waits for the key-share locks
                // of the dead node's in-flight batches: they land before, or
                // are refused after. (A heartbeat that renewed the lease
                // meanwhile takes the row out of the lease's end again.)
                let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE nodes SET state = 'dead'
                     WHERE id IN (SELECT id FROM nodes WHERE state IN ('alive', 'draining') AND lease_until <= now() FOR UPDATE)
                       AND state IN ('alive', 'draining') AND lease_until <= now()
                     RETURNING {NODE_COLUMNS}"
                )))
                .fetch_all(&mut *conn)
                .await?;
                if !rows.is_empty() {
                    notify(conn, "nodes").await?;
                }
                Ok(rows)
            })?
        .iter()
        .map(node_from_row)
        .collect()
    }

    async fn orphan_runs(&self) -> Result<Vec<OrphanRun>> {
        let rows: Vec<(RunId, String, String)> = sqlx::query_as(
            concat!("SELECT id, namespace, job FROM runs
             WHERE state IN ", dagcron_store::run_unfinished!(), "
               AND (owner_epoch IS NULL OR owner_epoch NOT IN (SELECT epoch FROM nodes WHERE state IN ('alive', 'draining')))
             ORDER BY id"),
        )
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|(id, namespace, job)| OrphanRun { id, namespace, job })
            .collect())
    }

    async fn running_elsewhere(&self) -> Result<Vec<(String, String, u32)>> {
        let fence = self.registered()?;
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT namespace, job, count(*) FROM runs
             WHERE state = 'running' AND owner_epoch IS DISTINCT FROM $1
             GROUP BY namespace, job",
        )
        .bind(fence.epoch)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|(namespace, job, n)| (namespace, job, u32::try_from(n).unwrap_or(u32::MAX)))
            .collect())
    }

    async fn adopt_runs(&self, ids: &[RunId]) -> Result<Vec<RunRecord>> {
        let fence = self.registered()?;
        let adopted: Vec<RunId> = transaction!(self, fenced = true, |conn| {
            sqlx::query_scalar(
                        concat!("UPDATE runs SET owner_epoch = $2
                         WHERE id = ANY($1) AND state IN ", dagcron_store::run_unfinished!(), "
                           AND (owner_epoch IS NULL OR owner_epoch NOT IN (SELECT epoch FROM nodes WHERE state IN ('alive', 'draining')))
                         RETURNING id"),
                    )
                    .bind(ids)
                    .bind(fence.epoch)
                    .fetch_all(&mut *conn)
                    .await
        })?;
        if adopted.is_empty() {
            return Ok(vec![]);
        }
        self.load_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ANY($1) ORDER BY id"),
            move |q| q.bind(adopted),
        )
        .await
    }

    async fn take_cancel_requests(&self) -> Result<Vec<RunId>> {
        let fence = self.registered()?;
        sqlx::query_scalar(TAKE_CANCEL_REQUESTS)
            .bind(fence.epoch)
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)
    }

    async fn take_intervention_requests(&self) -> Result<Vec<(RunId, String, String)>> {
        let fence = self.registered()?;
        // This node's requests, and those of runs that finished meanwhile
        // (whoever ran them), which nobody takes in any more.
        let mut taken: Vec<(i64, RunId, String, String, bool)> = sqlx::query_as(
            "DELETE FROM intervention_requests i USING runs r
             WHERE r.id = i.run_id AND (r.owner_epoch = $1 OR r.state NOT IN ('pending', 'running'))
             RETURNING i.id, i.run_id, i.task_id, i.action, r.owner_epoch = $1 AND r.state IN ('pending', 'running')",
        )
        .bind(fence.epoch)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        taken.sort_unstable_by_key(|t| t.0);
        Ok(taken
            .into_iter()
            .filter(|t| t.4)
            .map(|(_, run, task, action, _)| (run, task, action))
            .collect())
    }

    async fn jobs_revision(&self) -> Result<i64> {
        sqlx::query_scalar("SELECT value FROM revisions WHERE name = 'jobs'")
            .fetch_one(&self.pool)
            .await
            .map_err(unavailable)
    }

    async fn jobs_changed_since(&self, since: i64) -> Result<JobChanges> {
        // The revision first: changes up to it are committed (they commit
        // in revision order); later ones that show up are read again next
        // time, which changes nothing.
        let revision = self.jobs_revision().await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE revision > $1"
        )))
        .bind(since)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        let changed = rows
            .iter()
            .map(|r| read::job(&Cells(r)))
            .collect::<Result<Vec<_>>>()?;
        let deleted =
            sqlx::query_as("SELECT namespace, name FROM deleted_jobs WHERE revision > $1")
                .bind(since)
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
        Ok(JobChanges {
            revision,
            changed,
            deleted,
        })
    }

    async fn wait_for_change(&self, timeout: Duration) -> Result<Vec<String>> {
        let mut guard = self.listener.lock().await;
        if guard.is_none() {
            let mut listener = PgListener::connect_with(&self.pool)
                .await
                .map_err(unavailable)?;
            listener.listen(CHANNEL).await.map_err(unavailable)?;
            *guard = Some(listener);
        }
        let listener = guard.as_mut().expect("listening");
        match tokio::time::timeout(timeout, listener.recv()).await {
            Err(_) => Ok(vec![]),
            Ok(Ok(first)) => {
                // Several announcements may have queued: one wake-up covers them.
                let mut what = vec![first.payload().to_string()];
                while let Some(n) = listener.next_buffered() {
                    if !what.iter().any(|w| w == n.payload()) {
                        what.push(n.payload().to_string());
                    }
                }
                Ok(what)
            }
            Ok(Err(e)) => {
                *guard = None;
                Err(unavailable(e))
            }
        }
    }
}

/// Takes the cancel requests of a node's runs. Only an unfinished run is
/// ever asked to stop (`request_cancel`), and saying so lets the index of
/// unfinished runs by owner find them: without it, every poll read the
/// whole table of runs.
const TAKE_CANCEL_REQUESTS: &str = concat!(
    "UPDATE runs SET cancel_requested = FALSE WHERE cancel_requested AND owner_epoch = $1 AND state IN ",
    dagcron_store::run_unfinished!(),
    " RETURNING id"
);

#[cfg(test)]
mod tests {
    use sqlx::Connection;

    /// Regression: the poll of cancel requests scanned every run ever
    /// made; on a table of history it goes through the index of
    /// unfinished runs.
    #[tokio::test]
    async fn the_poll_of_cancel_requests_reads_only_unfinished_runs() {
        let db = dagcron_test_pg::TestDatabase::create("cancel_poll").await;
        let _migrated = crate::PgStore::connect(&db.url, 2).await.unwrap();
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(
            "INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, owner_epoch)
             SELECT g, 'n', 'j', 1, 'manual', 0, CASE WHEN g % 1000 = 0 THEN 'running' ELSE 'succeeded' END, '{}', 0, 1
             FROM generate_series(1, 20000) g;
             ANALYZE runs;",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        let explain = format!("EXPLAIN {}", super::TAKE_CANCEL_REQUESTS.replace("$1", "1"));
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains("runs_active"), "{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }
}
