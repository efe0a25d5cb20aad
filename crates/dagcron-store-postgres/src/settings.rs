//! Settings of the instance and the audit log.

use dagcron_store::Result;
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::{PgStore, unavailable};

impl SettingStore for PgStore {
    async fn get_setting(&self, key: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)
    }

    async fn get_settings(&self, keys: [&str; 2]) -> Result<[Option<String>; 2]> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT key, value FROM settings WHERE key IN ($1, $2)")
                .bind(keys[0])
                .bind(keys[1])
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
        let of = |key: &str| rows.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        Ok([of(keys[0]), of(keys[1])])
    }

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
