//! Settings of the instance and the audit log.

use dagcron_store::Result;
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::{SqliteStore, unavailable};

impl SettingStore for SqliteStore {
    async fn get_setting(&self, key: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.reader)
            .await
            .map_err(unavailable)
    }

    async fn get_settings(&self, keys: [&str; 2]) -> Result<[Option<String>; 2]> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT key, value FROM settings WHERE key IN (?1, ?2)")
                .bind(keys[0])
                .bind(keys[1])
                .fetch_all(&self.reader)
                .await
                .map_err(unavailable)?;
        let of = |key: &str| rows.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        Ok([of(keys[0]), of(keys[1])])
    }

    async fn set_setting(&self, key: &str, value: Option<&str>, at: Timestamp) -> Result<()> {
        let (key, value) = (key.to_string(), value.map(str::to_string));
        self.writer
            .transaction(move |tx| match value {
                Some(value) => tx.execute(
                    "INSERT INTO settings (key, value, updated_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    rusqlite::params![key, value, at.as_microsecond()],
                ),
                None => tx.execute("DELETE FROM settings WHERE key = ?1", rusqlite::params![key]),
            })
            .await?;
        Ok(())
    }
}
