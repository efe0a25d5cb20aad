//! The outbox's notifications and their delivery attempts.

use dagcron_store::{DeliveryAttempt, NotificationRecord};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One notification.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NotificationAnswer {
    /// Its number, increasing with creation.
    pub id: i64,
    /// Its idempotency key (the `Idempotency-Key` a receiver gets).
    pub key: String,
    /// The job it is about.
    pub job: String,
    /// The run it is about.
    pub run: Option<i64>,
    /// The event: `failed`, `succeeded`, `cancelled`, `recovered` or `held`.
    pub event: String,
    /// The notifier's name.
    pub notifier: String,
    /// The notifier's channel: `webhook` or `slack`.
    pub channel: String,
    /// `pending`, `delivered`, `failed` (given up) or `dropped` (a success
    /// that was not a recovery).
    pub state: String,
    /// Delivery attempts so far.
    pub attempts: u32,
    /// When it was made.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// Pending: when its next attempt is due.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_at: Option<Timestamp>,
    /// When it was delivered, given up or dropped.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ended_at: Option<Timestamp>,
    /// The last attempt's answer code.
    pub last_status: Option<i32>,
    /// The last attempt's error, or why it was dropped.
    pub last_error: Option<String>,
    /// Its attempts, first first (only when one notification is asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<Vec<DeliveryAnswer>>,
}

/// One delivery attempt.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeliveryAnswer {
    /// 1-based.
    pub number: u32,
    /// When it ended.
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    /// The receiver's answer code, if it answered.
    pub status: Option<i32>,
    /// What went wrong, if it did.
    pub error: Option<String>,
}

/// A page of notifications, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NotificationPage {
    /// The notifications.
    pub items: Vec<NotificationAnswer>,
    /// `before` for the next page, if there may be one.
    pub next: Option<i64>,
}

impl From<&NotificationRecord> for NotificationAnswer {
    fn from(n: &NotificationRecord) -> NotificationAnswer {
        let channel = serde_json::from_str::<serde_json::Value>(&n.made.channel)
            .ok()
            .and_then(|c| {
                ["webhook", "slack"]
                    .into_iter()
                    .find(|k| c.get(k).is_some())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        NotificationAnswer {
            id: n.id,
            key: n.made.key.clone(),
            job: n.made.job.clone(),
            run: n.made.run,
            event: n.made.event.clone(),
            notifier: n.made.notifier.clone(),
            channel,
            state: n.state.as_str().into(),
            attempts: n.attempts,
            created_at: n.made.at,
            next_at: n.next_at,
            ended_at: n.ended_at,
            last_status: n.last_status,
            last_error: n.last_error.clone(),
            deliveries: None,
        }
    }
}

impl From<&DeliveryAttempt> for DeliveryAnswer {
    fn from(a: &DeliveryAttempt) -> DeliveryAnswer {
        DeliveryAnswer {
            number: a.number,
            at: a.at,
            status: a.status,
            error: a.error.clone(),
        }
    }
}

/// What a webhook delivery did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HookAnswer {
    /// The run it made, or (a delivery that came before) the run it made then.
    pub run: i64,
    /// The delivery came before: no run was made now.
    pub duplicate: bool,
}
