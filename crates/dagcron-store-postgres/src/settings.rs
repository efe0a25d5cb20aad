//! Settings of the instance and the audit log.

use dagcron_store::Result;
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::{PgStore, unavailable};

impl SettingStore for PgStore {
    dagcron_store::shared_reads!(settings);

    async fn set_setting(&self, key: &str, value: Option<&str>, at: Timestamp) -> Result<()> {
        let query = match value {
            Some(value) => sqlx::query(
                "INSERT INTO settings (key, value, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            )
            .bind(key)
            .bind(value)
            .bind(at.as_microsecond()),
            None => sqlx::query("DELETE FROM settings WHERE key = $1").bind(key),
        };
        query.execute(&self.pool).await.map_err(unavailable)?;
        Ok(())
    }
}
