//! API tokens and encrypted secrets.

use dagcron_store::prelude::*;
use dagcron_store::{Result, SecretRecord, TokenRecord};
use jiff::Timestamp;

use crate::SqliteStore;

impl AuthStore for SqliteStore {
    dagcron_store::shared_reads!(auth);

    async fn create_token(&self, token: &TokenRecord, hash: &[u8]) -> Result<()> {
        let (t, hash) = (token.clone(), hash.to_vec());
        self.writer
            .transaction(move |tx| {
                tx.execute(
                    "INSERT INTO tokens (id, name, role, namespace, hash, created_at, expires_at, created_by, labels) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    rusqlite::params![
                        t.id,
                        t.name,
                        t.role,
                        t.namespace,
                        hash,
                        t.created_at.as_microsecond(),
                        t.expires_at.map(|e| e.as_microsecond()),
                        t.created_by,
                        t.labels.as_ref().map(|l| serde_json::to_string(l).expect("labels serialize"))
                    ],
                )
            })
            .await?;
        Ok(())
    }

    async fn revoke_token(&self, id: &str, at: Timestamp) -> Result<bool> {
        let id = id.to_string();
        let n = self
            .writer
            .transaction(move |tx| {
                tx.execute(
                    "UPDATE tokens SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
                    rusqlite::params![at.as_microsecond(), id],
                )
            })
            .await?;
        Ok(n == 1)
    }

    async fn token_used(&self, id: &str, at: Timestamp) -> Result<()> {
        let id = id.to_string();
        self.writer
            .transaction(move |tx| {
                tx.execute(
                    "UPDATE tokens SET last_used_at = ?1 WHERE id = ?2",
                    rusqlite::params![at.as_microsecond(), id],
                )
            })
            .await?;
        Ok(())
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        let s = secret.clone();
        self.writer
            .transaction(move |tx| {
                tx.execute(
                    "INSERT INTO secrets (namespace, name, version, key_id, nonce, ciphertext, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (namespace, name) DO UPDATE SET version = excluded.version, key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
                    rusqlite::params![s.namespace, s.name, s.version, s.key_id, s.nonce, s.ciphertext, s.updated_at.as_microsecond()],
                )
            })
            .await?;
        Ok(())
    }

    async fn delete_secret(&self, namespace: &str, name: &str) -> Result<bool> {
        let (ns, name) = (namespace.to_string(), name.to_string());
        let n = self
            .writer
            .transaction(move |tx| {
                tx.execute(
                    "DELETE FROM secrets WHERE namespace = ?1 AND name = ?2",
                    rusqlite::params![ns, name],
                )
            })
            .await?;
        Ok(n == 1)
    }
}
