//! The outbox of notifications. Nodes claim notifications with `SKIP
//! LOCKED`: two nodes claiming at once take different ones.

use dagcron_store::outbox::delivered;
use dagcron_store::prelude::*;
use dagcron_store::{DeliveryAttempt, DeliveryEnd, NotificationRecord, Result};
use jiff::Timestamp;

use crate::{PgStore, unavailable};

impl OutboxStore for PgStore {
    dagcron_store::shared_reads!(outbox);

    async fn claim_notifications(
        &self,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
        limit: u32,
    ) -> Result<Vec<NotificationRecord>> {
        let ids: Vec<i64> = sqlx::query_scalar(
            "UPDATE notifications SET claimed_by = $1, claimed_until = $2
             WHERE id IN (SELECT id FROM notifications
                          WHERE state = 'pending' AND next_at <= $3
                            AND (claimed_until IS NULL OR claimed_until < $3)
                          ORDER BY next_at, id LIMIT $4
                          FOR UPDATE SKIP LOCKED)
             RETURNING id",
        )
        .bind(owner)
        .bind(until.as_microsecond())
        .bind(now.as_microsecond())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        dagcron_store::sql::notifications_by_id(self, &ids).await
    }

    async fn prune_run_keys(&self, before: Timestamp, limit: u32) -> Result<u64> {
        let n = sqlx::query(dagcron_store::outbox::PRUNE_RUN_KEYS)
            .bind(before.as_microsecond())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(n.rows_affected())
    }

    async fn prune_notifications(&self, before: Timestamp, limit: u32) -> Result<u64> {
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let ids: Vec<i64> = sqlx::query_scalar(dagcron_store::outbox::ENDED_BEFORE)
            .bind(before.as_microsecond())
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(unavailable)?;
        sqlx::query("DELETE FROM notification_deliveries WHERE notification_id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        sqlx::query("DELETE FROM notifications WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(ids.len() as u64)
    }

    async fn record_delivery(
        &self,
        id: i64,
        owner: &str,
        attempt: Option<&DeliveryAttempt>,
        end: &DeliveryEnd,
    ) -> Result<bool> {
        let d = delivered(attempt, end);
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let n = sqlx::query(
            "UPDATE notifications SET state = $1, next_at = $2, ended_at = $3,
                 last_status = $4, last_error = $5, attempts = attempts + $6,
                 claimed_by = NULL, claimed_until = NULL
             WHERE id = $7 AND claimed_by = $8 AND state = 'pending'",
        )
        .bind(d.state.as_str())
        .bind(d.next_at.map(|t| t.as_microsecond()))
        .bind(d.ended_at.map(|t| t.as_microsecond()))
        .bind(d.status.map(i64::from))
        .bind(d.error)
        .bind(i64::from(d.attempts))
        .bind(id)
        .bind(owner)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?
        .rows_affected();
        if n == 1
            && let Some(a) = attempt
        {
            sqlx::query(
                "INSERT INTO notification_deliveries (notification_id, number, at, status, error)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(id)
            .bind(i64::from(a.number))
            .bind(a.at.as_microsecond())
            .bind(a.status.map(i64::from))
            .bind(&a.error)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(n == 1)
    }
}
