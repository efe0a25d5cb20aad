//! API tokens and encrypted secrets.

use dagcron_store::prelude::*;
use dagcron_store::{Result, SecretRecord, TokenRecord};
use jiff::Timestamp;

use crate::{PgStore, unavailable};

impl AuthStore for PgStore {
    dagcron_store::shared_reads!(auth);

    async fn create_token(&self, token: &TokenRecord, hash: &[u8]) -> Result<()> {
        sqlx::query("INSERT INTO tokens (id, name, role, namespace, hash, created_at, expires_at, created_by, labels) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(&token.id)
            .bind(&token.name)
            .bind(&token.role)
            .bind(&token.namespace)
            .bind(hash)
            .bind(token.created_at.as_microsecond())
            .bind(token.expires_at.map(|e| e.as_microsecond()))
            .bind(&token.created_by)
            .bind(
                token
                    .labels
                    .as_ref()
                    .map(|l| serde_json::to_string(l).expect("labels serialize")),
            )
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn revoke_token(&self, id: &str, at: Timestamp) -> Result<bool> {
        let n =
            sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                .bind(at.as_microsecond())
                .bind(id)
                .execute(&self.pool)
                .await
                .map_err(unavailable)?
                .rows_affected();
        Ok(n == 1)
    }

    async fn token_used(&self, id: &str, at: Timestamp) -> Result<()> {
        sqlx::query("UPDATE tokens SET last_used_at = $1 WHERE id = $2")
            .bind(at.as_microsecond())
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn put_secret(&self, s: &SecretRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO secrets (namespace, name, version, key_id, nonce, ciphertext, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (namespace, name) DO UPDATE SET version = excluded.version, key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
        )
        .bind(&s.namespace)
        .bind(&s.name)
        .bind(s.version)
        .bind(&s.key_id)
        .bind(&s.nonce)
        .bind(&s.ciphertext)
        .bind(s.updated_at.as_microsecond())
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn delete_secret(&self, namespace: &str, name: &str) -> Result<bool> {
        let n = sqlx::query("DELETE FROM secrets WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?
            .rows_affected();
        Ok(n == 1)
    }
}
