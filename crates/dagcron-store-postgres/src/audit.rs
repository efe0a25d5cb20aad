//! Appends to the audit log, grouped: the chain takes one lock for the
//! whole cluster, so one transaction per call made every change of every
//! node wait in line for it (about 400 changes a second through the API).
//! Calls that come while a group is being committed wait, and go together
//! in the next group: one transaction, one turn of the lock, one insert.
//! Each call still returns only once its own row is committed.

use std::sync::{Arc, Mutex};

use dagcron_store::{AuditEntry, Result, StorageError};
use tokio::sync::oneshot;

use crate::{PgStore, transaction};
use dagcron_store::prelude::*;
use jiff::Timestamp;

/// The appends waiting for the next group, and the turn to commit one.
#[derive(Debug, Default)]
pub(crate) struct AuditQueue {
    waiting: Mutex<Vec<(AuditEntry, oneshot::Sender<Result<()>>)>>,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl PgStore {
    /// Appends `entry` with the others waiting; the group is committed by a
    /// task of its own, so a caller that goes away (its client hung up)
    /// does not take the others' rows with it.
    pub(crate) async fn append_audit_grouped(&self, entry: AuditEntry) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.audit
            .waiting
            .lock()
            .expect("audit queue lock")
            .push((entry, reply));
        let turn = self.audit.turn.clone().lock_owned().await;
        let group = std::mem::take(&mut *self.audit.waiting.lock().expect("audit queue lock"));
        if !group.is_empty() {
            let store = self.clone();
            tokio::spawn(async move {
                let _turn = turn;
                let (entries, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
                let result = store.append_audits(entries).await;
                for reply in replies {
                    let _ = reply.send(match &result {
                        Ok(()) => Ok(()),
                        Err(e) => Err(StorageError::Unavailable(format!(
                            "appending to the audit log: {e}"
                        ))),
                    });
                }
            });
        }
        answer.await.map_err(|_| {
            StorageError::Unavailable("the audit append stopped before it committed".into())
        })?
    }

    /// Appends `entries` in order, chained after the last row, in one
    /// transaction holding the chain's lock.
    async fn append_audits(&self, entries: Vec<AuditEntry>) -> Result<()> {
        transaction!(self, fenced = false, |conn| {
            // Appends from every node take turns: the chain cannot fork.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('dagcron audit', 0))")
                .execute(&mut *conn)
                .await?;
            let mut prev: Option<(i64, Vec<u8>)> =
                sqlx::query_as("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")
                    .fetch_optional(&mut *conn)
                    .await?;
            let mut rows = entries.clone();
            for row in &mut rows {
                row.chain_after(prev.take());
                prev = Some((row.seq, row.hash.clone()));
            }
            let column =
                |f: fn(&AuditEntry) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
            sqlx::query(
                "INSERT INTO audit (seq, at, principal, principal_name, action, namespace, outcome, address, prev_hash, hash)
                 SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::text[], $9::bytea[], $10::bytea[])",
            )
            .bind(rows.iter().map(|r| r.seq).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.at.as_microsecond()).collect::<Vec<_>>())
            .bind(column(|r| r.principal.clone()))
            .bind(column(|r| r.principal_name.clone()))
            .bind(rows.iter().map(|r| r.action.clone()).collect::<Vec<_>>())
            .bind(column(|r| r.namespace.clone()))
            .bind(rows.iter().map(|r| i32::from(r.outcome)).collect::<Vec<_>>())
            .bind(column(|r| r.address.clone()))
            .bind(rows.iter().map(|r| r.prev_hash.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.hash.clone()).collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
    }
}

impl AuditStore for PgStore {
    dagcron_store::shared_reads!(audit);

    async fn append_audit(&self, entry: AuditEntry) -> Result<()> {
        self.append_audit_grouped(entry).await
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        let before = before.as_microsecond();
        transaction!(self, fenced = false, |conn| {
            // The chain's lock: no append comes between the cut and its checkpoint.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('dagcron audit', 0))")
                .execute(&mut *conn)
                .await?;
            let cut: Option<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT seq, hash FROM audit WHERE seq = (SELECT max(seq) FROM audit
                   WHERE at < $1 AND seq < (SELECT max(seq) FROM audit))",
            )
            .bind(before)
            .fetch_optional(&mut *conn)
            .await?;
            let Some((seq, hash)) = cut else {
                return Ok(0);
            };
            let gone = sqlx::query("DELETE FROM audit WHERE seq <= $1")
                .bind(seq)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            sqlx::query(
                "INSERT INTO settings (key, value, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            )
            .bind(dagcron_store::AUDIT_CHECKPOINT)
            .bind(dagcron_store::checkpoint_text(seq, &hash))
            .bind(before)
            .execute(&mut *conn)
            .await?;
            Ok(gone)
        })
    }
}
