//! Settings of the instance and the audit log.

use dagcron_store::Result;
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::SqliteStore;

impl SettingStore for SqliteStore {
    dagcron_store::shared_reads!(settings);

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
