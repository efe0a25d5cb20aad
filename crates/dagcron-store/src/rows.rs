//! The row mappings both SQL backends share: the columns they select, in
//! order, and how a row of them becomes a record. A backend reads a row
//! through [`Cells`] (see [`cells!`](crate::cells)); the SQL that selects
//! it stays with the backend.

use std::collections::BTreeMap;
use std::str::FromStr;

use jiff::Timestamp;

use crate::{
    AuditEntry, DeliveryAttempt, NewNotification, NotificationRecord, NotificationState, Origin,
    Result, RunRecord, SecretRecord, StorageError, StoredJob, TaskRecord, TokenRecord, Trigger,
    VersionRecord,
};

/// The columns of one row, by position. Each backend reads them with its
/// own driver; a cell of the wrong type is a bug of the query that
/// selected it, so reading one panics, as `sqlx::Row::get` does.
pub trait Cells {
    /// Text.
    fn text(&self, i: usize) -> String;
    /// Text or NULL.
    fn opt_text(&self, i: usize) -> Option<String>;
    /// A 64-bit integer.
    fn int(&self, i: usize) -> i64;
    /// A 64-bit integer or NULL.
    fn opt_int(&self, i: usize) -> Option<i64>;
    /// A 32-bit integer.
    fn int32(&self, i: usize) -> i32;
    /// A boolean (an integer in SQLite).
    fn flag(&self, i: usize) -> bool;
    /// Bytes.
    fn bytes(&self, i: usize) -> Vec<u8>;
}

impl<C: Cells + ?Sized> Cells for Box<C> {
    fn text(&self, i: usize) -> String {
        (**self).text(i)
    }
    fn opt_text(&self, i: usize) -> Option<String> {
        (**self).opt_text(i)
    }
    fn int(&self, i: usize) -> i64 {
        (**self).int(i)
    }
    fn opt_int(&self, i: usize) -> Option<i64> {
        (**self).opt_int(i)
    }
    fn int32(&self, i: usize) -> i32 {
        (**self).int32(i)
    }
    fn flag(&self, i: usize) -> bool {
        (**self).flag(i)
    }
    fn bytes(&self, i: usize) -> Vec<u8> {
        (**self).bytes(i)
    }
}

/// Implements [`Cells`] for a driver's row type through a local wrapper
/// (`Cells(&row)`), in the backend crate that depends on the driver.
#[macro_export]
macro_rules! cells {
    ($row:ty) => {
        /// A row of the driver, read by position (see [`dagcron_store::rows::Cells`]).
        pub(crate) struct Cells<R>(pub(crate) R);

        impl<R: std::borrow::Borrow<$row>> dagcron_store::rows::Cells for Cells<R> {
            fn text(&self, i: usize) -> String {
                sqlx::Row::get(std::borrow::Borrow::<$row>::borrow(&self.0), i)
            }
            fn opt_text(&self, i: usize) -> Option<String> {
                sqlx::Row::get(std::borrow::Borrow::<$row>::borrow(&self.0), i)
            }
            fn int(&self, i: usize) -> i64 {
                sqlx::Row::get(std::borrow::Borrow::<$row>::borrow(&self.0), i)
            }
            fn opt_int(&self, i: usize) -> Option<i64> {
                sqlx::Row::get(std::borrow::Borrow::<$row>::borrow(&self.0), i)
            }
            fn int32(&self, i: usize) -> i32 {
                sqlx::Row::get(std::borrow::Borrow::<$row>::borrow(&self.0), i)
            }
            fn flag(&self, i: usize) -> bool {
                sqlx::Row::get(std::borrow::Borrow::<$row>::borrow(&self.0), i)
            }
            fn bytes(&self, i: usize) -> Vec<u8> {
                sqlx::Row::get(std::borrow::Borrow::<$row>::borrow(&self.0), i)
            }
        }
    };
}

/// An instant stored in microseconds.
pub fn ts(us: i64) -> Result<Timestamp> {
    Timestamp::from_microsecond(us).map_err(|e| StorageError::Corrupt(format!("instant {us}: {e}")))
}

/// An instant stored in microseconds, or none.
pub fn opt_ts(us: Option<i64>) -> Result<Option<Timestamp>> {
    us.map(ts).transpose()
}

/// A state or outcome stored by its name.
pub fn parse<T: FromStr<Err = String>>(s: &str) -> Result<T> {
    s.parse().map_err(StorageError::Corrupt)
}

/// Labels as a JSON object (an agent's, or what an attempt needs).
pub fn labels_json(labels: &BTreeMap<String, String>) -> String {
    serde_json::to_string(labels).expect("labels serialize")
}

/// What [`token`] reads.
pub const TOKEN_COLUMNS: &str = "id, name, role, namespace, created_at, expires_at, last_used_at, revoked_at, created_by, labels";

/// A token from [`TOKEN_COLUMNS`].
pub fn token(row: &impl Cells) -> Result<TokenRecord> {
    Ok(TokenRecord {
        id: row.text(0),
        name: row.text(1),
        role: row.text(2),
        namespace: row.opt_text(3),
        created_at: ts(row.int(4))?,
        expires_at: opt_ts(row.opt_int(5))?,
        last_used_at: opt_ts(row.opt_int(6))?,
        revoked_at: opt_ts(row.opt_int(7))?,
        created_by: row.opt_text(8),
        labels: row
            .opt_text(9)
            .map(|l| serde_json::from_str(&l))
            .transpose()
            .map_err(|e| StorageError::Corrupt(format!("token labels: {e}")))?,
    })
}

/// What [`secret`] reads.
pub const SECRET_COLUMNS: &str = "namespace, name, version, key_id, nonce, ciphertext, updated_at";

/// A secret from [`SECRET_COLUMNS`].
pub fn secret(row: &impl Cells) -> Result<SecretRecord> {
    Ok(SecretRecord {
        namespace: row.text(0),
        name: row.text(1),
        version: row.int(2),
        key_id: row.text(3),
        nonce: row.bytes(4),
        ciphertext: row.bytes(5),
        updated_at: ts(row.int(6))?,
    })
}

/// What [`notification`] reads.
pub const NOTIFICATION_COLUMNS: &str = "id, key, namespace, job, run_id, event, notifier, channel, payload, created_at, state, attempts, next_at, ended_at, last_status, last_error";

/// A notification from [`NOTIFICATION_COLUMNS`].
pub fn notification(row: &impl Cells) -> Result<NotificationRecord> {
    let state = row.text(10);
    Ok(NotificationRecord {
        id: row.int(0),
        made: NewNotification {
            key: row.text(1),
            namespace: row.text(2),
            job: row.text(3),
            run: row.opt_int(4),
            event: row.text(5),
            notifier: row.text(6),
            channel: row.text(7),
            payload: row.text(8),
            at: ts(row.int(9))?,
        },
        state: NotificationState::parse(&state)
            .ok_or_else(|| StorageError::Corrupt(format!("notification state {state:?}")))?,
        attempts: u32::try_from(row.int(11)).unwrap_or(0),
        next_at: opt_ts(row.opt_int(12))?,
        ended_at: opt_ts(row.opt_int(13))?,
        last_status: row.opt_int(14).map(|s| s as i32),
        last_error: row.opt_text(15),
    })
}

/// What [`delivery`] reads.
pub const DELIVERY_COLUMNS: &str = "number, at, status, error";

/// A delivery attempt from [`DELIVERY_COLUMNS`].
pub fn delivery(row: &impl Cells) -> Result<DeliveryAttempt> {
    Ok(DeliveryAttempt {
        number: u32::try_from(row.int(0)).unwrap_or(0),
        at: ts(row.int(1))?,
        status: row.opt_int(2).map(|s| s as i32),
        error: row.opt_text(3),
    })
}

/// A job from its namespace, name, version, spec, paused, updated_at,
/// rules and [`crate::breaker::COLUMNS`] (each backend selects them from
/// its own tables).
pub fn job(row: &impl Cells) -> Result<StoredJob> {
    Ok(StoredJob {
        namespace: row.text(0),
        name: row.text(1),
        version: row.int(2),
        spec: row.text(3),
        paused: row.flag(4),
        updated_at: ts(row.int(5))?,
        rules: crate::parse_rules(row.opt_text(6).as_deref())?,
        breaker: crate::breaker::open_breaker(row.opt_int(7), row.opt_int(8), row.opt_int(9))?,
    })
}

/// What [`version`] reads.
pub const VERSION_COLUMNS: &str =
    "namespace, name, version, created_at, applied_by, applied_by_name, rollback_of, rules";

/// A version from [`VERSION_COLUMNS`].
pub fn version(row: &impl Cells) -> Result<VersionRecord> {
    Ok(VersionRecord {
        namespace: row.text(0),
        name: row.text(1),
        version: row.int(2),
        applied_at: ts(row.int(3))?,
        origin: Origin {
            by: crate::actor_of(row.opt_text(4), row.opt_text(5)),
            rollback_of: row.opt_int(6),
        },
        rules: crate::parse_rules(row.opt_text(7).as_deref())?,
    })
}

/// What [`audit`] reads.
pub const AUDIT_COLUMNS: &str =
    "seq, at, principal, principal_name, action, namespace, outcome, address, prev_hash, hash";

/// An audit row from [`AUDIT_COLUMNS`].
pub fn audit(row: &impl Cells) -> Result<AuditEntry> {
    Ok(AuditEntry {
        seq: row.int(0),
        at: ts(row.int(1))?,
        principal: row.opt_text(2),
        principal_name: row.opt_text(3),
        action: row.text(4),
        namespace: row.opt_text(5),
        outcome: u16::try_from(row.int32(6)).unwrap_or(0),
        address: row.opt_text(7),
        prev_hash: row.bytes(8),
        hash: row.bytes(9),
    })
}

/// What [`run`] reads, as a literal for `concat!` (a backend may select
/// its tasks after them).
#[macro_export]
macro_rules! run_columns {
    () => {
        "id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at, closing, trace, rerun_of"
    };
}

/// What [`run`] reads.
pub const RUN_COLUMNS: &str = run_columns!();

/// A run from [`RUN_COLUMNS`], with its tasks.
pub fn run(row: &impl Cells, tasks: Vec<TaskRecord>) -> Result<RunRecord> {
    let id = row.int(0);
    Ok(RunRecord {
        id,
        namespace: row.text(1),
        job: row.text(2),
        job_version: row.int(3),
        trigger: Trigger::parse(&row.text(4))
            .ok_or_else(|| StorageError::Corrupt(format!("run {id}: unknown trigger")))?,
        scheduled_at: ts(row.int(5))?,
        state: parse(&row.text(6))?,
        params: serde_json::from_str(&row.text(7))
            .map_err(|e| StorageError::Corrupt(format!("run {id} params: {e}")))?,
        created_at: ts(row.int(8))?,
        started_at: opt_ts(row.opt_int(9))?,
        finished_at: opt_ts(row.opt_int(10))?,
        closing: row.opt_text(11).as_deref().map(parse).transpose()?,
        trace: row.opt_text(12),
        rerun_of: row.opt_int(13),
        tasks,
    })
}
