//! The outbox of notifications.

use dagcron_store::outbox::delivered;
use dagcron_store::prelude::*;
use dagcron_store::{DeliveryAttempt, DeliveryEnd, NotificationRecord, Result};
use jiff::Timestamp;
use rusqlite::params;

use crate::SqliteStore;

impl OutboxStore for SqliteStore {
    dagcron_store::shared_reads!(outbox);

    async fn claim_notifications(
        &self,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
        limit: u32,
    ) -> Result<Vec<NotificationRecord>> {
        let owner = owner.to_string();
        let (now, until) = (now.as_microsecond(), until.as_microsecond());
        let ids: Vec<i64> = self
            .writer
            .transaction(move |tx| {
                let mut claim = tx.prepare_cached(
                    "UPDATE notifications SET claimed_by = ?1, claimed_until = ?2
                     WHERE id IN (SELECT id FROM notifications
                                  WHERE state = 'pending' AND next_at <= ?3
                                    AND (claimed_until IS NULL OR claimed_until < ?3)
                                  ORDER BY next_at, id LIMIT ?4)
                     RETURNING id",
                )?;
                let ids = claim
                    .query_map(params![owner, until, now, limit], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<i64>>>()?;
                Ok(ids)
            })
            .await?;
        dagcron_store::sql::notifications_by_id(self, &ids).await
    }

    async fn prune_run_keys(&self, before: Timestamp, limit: u32) -> Result<u64> {
        let before = before.as_microsecond();
        self.writer
            .transaction(move |tx| {
                let n = tx
                    .prepare_cached(dagcron_store::outbox::PRUNE_RUN_KEYS)?
                    .execute(params![before, limit])?;
                Ok(n as u64)
            })
            .await
    }

    async fn prune_notifications(&self, before: Timestamp, limit: u32) -> Result<u64> {
        let before = before.as_microsecond();
        self.writer
            .transaction(move |tx| {
                let ids = tx
                    .prepare_cached(dagcron_store::outbox::ENDED_BEFORE)?
                    .query_map(params![before, limit], |r| r.get::<_, i64>(0))?
                    .collect::<rusqlite::Result<Vec<i64>>>()?;
                for id in &ids {
                    tx.prepare_cached(
                        "DELETE FROM notification_deliveries WHERE notification_id = ?1",
                    )?
                    .execute(params![id])?;
                    tx.prepare_cached("DELETE FROM notifications WHERE id = ?1")?
                        .execute(params![id])?;
                }
                Ok(ids.len() as u64)
            })
            .await
    }

    async fn record_delivery(
        &self,
        id: i64,
        owner: &str,
        attempt: Option<&DeliveryAttempt>,
        end: &DeliveryEnd,
    ) -> Result<bool> {
        let d = delivered(attempt, end);
        let owner = owner.to_string();
        let attempt = attempt.cloned();
        self.writer
            .transaction(move |tx| {
                let n = tx
                    .prepare_cached(
                        "UPDATE notifications SET state = ?1, next_at = ?2, ended_at = ?3,
                             last_status = ?4, last_error = ?5, attempts = attempts + ?6,
                             claimed_by = NULL, claimed_until = NULL
                         WHERE id = ?7 AND claimed_by = ?8 AND state = 'pending'",
                    )?
                    .execute(params![
                        d.state.as_str(),
                        d.next_at.map(|t| t.as_microsecond()),
                        d.ended_at.map(|t| t.as_microsecond()),
                        d.status,
                        d.error,
                        d.attempts,
                        id,
                        owner
                    ])?;
                if n == 1
                    && let Some(a) = attempt
                {
                    tx.prepare_cached(
                        "INSERT INTO notification_deliveries (notification_id, number, at, status, error)
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?
                    .execute(params![id, a.number, a.at.as_microsecond(), a.status, a.error])?;
                }
                Ok(n == 1)
            })
            .await
    }
}
