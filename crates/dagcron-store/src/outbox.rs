//! What recording a delivery attempt means, once for every store: the
//! columns an attempt and its end set on a notification's row.

use jiff::Timestamp;

use crate::{DeliveryAttempt, DeliveryEnd, NotificationRecord, NotificationState};

/// The columns of a notification's row that a delivery attempt sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// Where it stands.
    pub state: NotificationState,
    /// Pending: its next attempt.
    pub next_at: Option<Timestamp>,
    /// Ended: when.
    pub ended_at: Option<Timestamp>,
    /// The attempt's answer code.
    pub status: Option<i32>,
    /// The attempt's error, or why it was dropped.
    pub error: Option<String>,
    /// 1 if an attempt was made, else 0: added to the attempts.
    pub attempts: u32,
}

/// The columns `attempt` (none when nothing was sent) and `end` set.
pub fn delivered(attempt: Option<&DeliveryAttempt>, end: &DeliveryEnd) -> Delivered {
    let at = attempt.map(|a| a.at);
    let (state, next_at, ended_at, error) = match end {
        DeliveryEnd::Delivered => (NotificationState::Delivered, None, at, None),
        DeliveryEnd::Retry(next) => (
            NotificationState::Pending,
            Some(*next),
            None,
            attempt.and_then(|a| a.error.clone()),
        ),
        DeliveryEnd::Failed => (
            NotificationState::Failed,
            None,
            at,
            attempt.and_then(|a| a.error.clone()),
        ),
        DeliveryEnd::Dropped { why, at } => (
            NotificationState::Dropped,
            None,
            Some(*at),
            Some(why.clone()),
        ),
    };
    Delivered {
        state,
        next_at,
        ended_at,
        status: attempt.and_then(|a| a.status),
        error,
        attempts: u32::from(attempt.is_some()),
    }
}

/// `record` once `attempt` and `end` are recorded (the in-memory store's
/// way; the SQL stores set [`delivered`]'s columns).
pub fn after_delivery(
    record: &NotificationRecord,
    attempt: Option<&DeliveryAttempt>,
    end: &DeliveryEnd,
) -> NotificationRecord {
    let d = delivered(attempt, end);
    NotificationRecord {
        state: d.state,
        attempts: record.attempts + d.attempts,
        next_at: d.next_at,
        ended_at: d.ended_at,
        last_status: d.status,
        last_error: d.error,
        ..record.clone()
    }
}

/// Selects the ids of up to `$2` notifications that ended before `$1` (for
/// pruning; both SQL stores run it).
pub const ENDED_BEFORE: &str = "SELECT id FROM notifications
     WHERE state IN ('delivered', 'failed', 'dropped') AND ended_at < $1
     ORDER BY id LIMIT $2";

/// Deletes up to `$2` run keys made before `$1` (both SQL stores run it).
pub const PRUNE_RUN_KEYS: &str = "DELETE FROM run_keys WHERE (namespace, job, key) IN
     (SELECT namespace, job, key FROM run_keys WHERE created_at < $1 LIMIT $2)";

/// Records the key of a run (`$1` namespace, `$2` job, `$3` key, `$4`
/// run, `$5` when); inserts nothing if the job has a run of that key.
pub const INSERT_RUN_KEY: &str = "INSERT INTO run_keys (namespace, job, key, run_id, created_at)
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";

/// Deletes the run keys of job (`$1`, `$2`), as it is deleted: a job made
/// again under its name starts with none.
pub const DELETE_JOB_RUN_KEYS: &str = "DELETE FROM run_keys WHERE namespace = $1 AND job = $2";
