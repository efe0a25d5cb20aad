//! API tokens and encrypted secrets.

use dagcron_store::prelude::*;
use dagcron_store::rows::{self as read, SECRET_COLUMNS, TOKEN_COLUMNS};
use dagcron_store::{Result, SecretRecord, TokenRecord};
use jiff::Timestamp;

use crate::{Cells, SqliteStore, unavailable};

impl AuthStore for SqliteStore {
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

    async fn find_token(&self, hash: &[u8]) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?"
        )))
        .bind(hash)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::token(&Cells(&r))).transpose()
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id"
        )))
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::token(&Cells(r))).collect()
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

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<SecretRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = ? AND name = ?"
        )))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.reader)
        .await
        .map_err(unavailable)?;
        row.map(|r| read::secret(&Cells(&r))).transpose()
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = ? ORDER BY name"
        )))
        .bind(namespace)
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn list_all_secrets(&self) -> Result<Vec<SecretRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SECRET_COLUMNS} FROM secrets ORDER BY namespace, name"
        )))
        .fetch_all(&self.reader)
        .await
        .map_err(unavailable)?;
        rows.iter().map(|r| read::secret(&Cells(r))).collect()
    }

    async fn count_secrets(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM secrets")
            .fetch_one(&self.reader)
            .await
            .map_err(unavailable)?;
        Ok(n as u64)
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
