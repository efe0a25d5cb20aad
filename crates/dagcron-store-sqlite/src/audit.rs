//! The audit log, one hash chain.

use dagcron_store::prelude::*;
use dagcron_store::{AuditEntry, Result};
use jiff::Timestamp;

use crate::SqliteStore;

impl AuditStore for SqliteStore {
    dagcron_store::shared_reads!(audit);

    async fn append_audit(&self, mut entry: AuditEntry) -> Result<()> {
        use rusqlite::OptionalExtension;
        // The writer thread serializes appends: the chain cannot fork.
        self.writer
            .transaction(move |tx| {
                let prev: Option<(i64, Vec<u8>)> = tx
                    .query_row(
                        "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                entry.chain_after(prev);
                tx.execute(
                    "INSERT INTO audit (seq, at, principal, principal_name, action, namespace, outcome, address, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    rusqlite::params![
                        entry.seq,
                        entry.at.as_microsecond(),
                        entry.principal,
                        entry.principal_name,
                        entry.action,
                        entry.namespace,
                        entry.outcome,
                        entry.address,
                        entry.prev_hash,
                        entry.hash
                    ],
                )
            })
            .await?;
        Ok(())
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        use rusqlite::OptionalExtension;
        let before = before.as_microsecond();
        // The writer thread serializes it with the appends.
        self.writer
            .transaction(move |tx| {
                let cut: Option<(i64, Vec<u8>)> = tx
                    .query_row(
                        "SELECT seq, hash FROM audit WHERE seq = (SELECT max(seq) FROM audit
                           WHERE at < ?1 AND seq < (SELECT max(seq) FROM audit))",
                        rusqlite::params![before],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                let Some((seq, hash)) = cut else {
                    return Ok(0);
                };
                let gone = tx.execute("DELETE FROM audit WHERE seq <= ?1", rusqlite::params![seq])?;
                tx.execute(
                    "INSERT INTO settings (key, value, updated_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    rusqlite::params![
                        dagcron_store::AUDIT_CHECKPOINT,
                        dagcron_store::checkpoint_text(seq, &hash),
                        before
                    ],
                )?;
                Ok(gone as u64)
            })
            .await
    }
}
