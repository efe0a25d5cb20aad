//! API tokens and encrypted secrets.

use dagcron_store::prelude::*;
use dagcron_store::rows::{self as read};
use dagcron_store::rows::{SECRET_COLUMNS, TOKEN_COLUMNS};
use dagcron_store::{Result, SecretRecord, TokenRecord};
use jiff::Timestamp;

use crate::{Cells, PgStore, unavailable};

impl AuthStore for PgStore {
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

    async fn find_token(&self, hash: &[u8]) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = $1"
        )))
        .bind(hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::token(&Cells(&r))).transpose()
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::token(&Cells(r))).collect()
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

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<SecretRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = $1 AND name = $2"
        )))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::secret(&Cells(&r))).transpose()
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = $1 ORDER BY name"
        )))
        .bind(namespace)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn list_all_secrets(&self) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets ORDER BY namespace, name"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn count_secrets(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM secrets")
            .fetch_one(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(n as u64)
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
