//! The outbox's delivery, beside the engine: its own task, which claims
//! the notifications that are due (in a cluster, a notification is held by
//! one node at a time), sends each to its notifier, and records every
//! attempt and where it leaves the notification.
//!
//! A notification is written in the commit of the event it reports (see
//! `engine/notify.rs`), so a crash between the event and its delivery
//! loses nothing: after the restart it is claimed again and sent with the
//! same body and idempotency key. A crash between a delivery and its
//! record sends it again, which the key lets a receiver drop. A receiver
//! that fails or hangs only delays the notifications of its own batch: the
//! engine never waits for the outbox.
//!
//! Decisions are core's (`dagcron_core::notify`): whether a success is a
//! recovery, when a failed delivery is tried again and when it is given up.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::EnvValue;
use dagcron_core::notify::{self, NotifierSpec, Payload};
use dagcron_exec::notify::{Answer, Post, SIGNATURE_HEADER, send, signature};
use dagcron_store::prelude::*;
use dagcron_store::{DeliveryAttempt, DeliveryEnd, NotificationRecord};
use jiff::{SignedDuration, Timestamp};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::engine::{PolicySource, SecretSource};

/// How the outbox delivers.
#[derive(Clone, Debug)]
pub struct OutboxConfig {
    /// Who claims (a cluster node's name; any name alone).
    pub owner: String,
    /// How often the outbox looks for notifications due when nothing
    /// wakes it: the engine wakes it when it commits notifications, and
    /// its own retries when they come due, so only what another process
    /// wrote waits for this (another node's notifications, claims left
    /// by a crash). Looks that find nothing grow apart, from a second
    /// (or `poll`, if shorter) up to `poll`; a pass that finds some, or a
    /// wake, starts again from a second. A node alone may poll rarely; a
    /// cluster's nodes often.
    pub poll: Duration,
    /// How long a claim holds: past it, another node may take the
    /// notification (this one is presumed dead).
    pub claim: Duration,
    /// Notifications claimed, and sent side by side, at a time.
    pub batch: u32,
    /// How long a receiver has to answer.
    pub timeout: Duration,
    /// The SMTP relay of e-mail notifiers (none: they fail, saying so).
    pub smtp: Option<dagcron_exec::mail::Smtp>,
}

impl Default for OutboxConfig {
    fn default() -> OutboxConfig {
        OutboxConfig {
            owner: "local".into(),
            poll: Duration::from_secs(1),
            claim: Duration::from_secs(60),
            batch: 32,
            timeout: Duration::from_secs(10),
            smtp: None,
        }
    }
}

/// Deliveries counted by outcome, for Prometheus.
#[derive(Clone, Debug, Default)]
pub struct OutboxMetrics {
    deliveries: Family<Vec<(&'static str, &'static str)>, Counter>,
}

const OUTCOMES: [&str; 4] = ["delivered", "retried", "failed", "dropped"];

impl OutboxMetrics {
    /// Registers `dagcron_notifications_total`, every series at zero.
    pub fn register(&self, registry: &mut Registry) {
        for outcome in OUTCOMES {
            let _ = self.deliveries.get_or_create(&vec![("outcome", outcome)]);
        }
        registry.register(
            "dagcron_notifications",
            "Notifications handled by the outbox, by outcome: delivered, retried (an attempt failed and another is due), failed (given up), dropped (a success that was not a recovery)",
            self.deliveries.clone(),
        );
    }

    fn count(&self, end: &DeliveryEnd) {
        let outcome = match end {
            DeliveryEnd::Delivered => "delivered",
            DeliveryEnd::Retry(_) => "retried",
            DeliveryEnd::Failed => "failed",
            DeliveryEnd::Dropped { .. } => "dropped",
        };
        self.deliveries
            .get_or_create(&vec![("outcome", outcome)])
            .inc();
    }
}

/// The outbox's delivery task.
pub struct Outbox<S: Store> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    config: OutboxConfig,
    secrets: Option<SecretSource>,
    policies: Option<PolicySource>,
    metrics: OutboxMetrics,
    wake: Arc<Notify>,
    /// The instants of the retries this outbox decided that no pass has
    /// reached yet: it wakes at the first.
    retries: std::sync::Mutex<BTreeSet<Timestamp>>,
}

impl<S: Store> Outbox<S> {
    /// An outbox over `store`; `wake` is the engine's
    /// [`EngineConfig::outbox`](crate::EngineConfig::outbox).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        config: OutboxConfig,
        secrets: Option<SecretSource>,
        policies: Option<PolicySource>,
        metrics: OutboxMetrics,
        wake: Arc<Notify>,
    ) -> Outbox<S> {
        Outbox {
            store,
            clock,
            config,
            secrets,
            policies,
            metrics,
            wake,
            retries: std::sync::Mutex::default(),
        }
    }

    /// Delivers until `stop`: a pass whenever the engine commits
    /// notifications, when a retry it decided comes due, and besides at
    /// looks that grow apart up to `poll`. A pass cut short by `stop`
    /// leaves its notifications claimed until their claims end; any of
    /// them sent meanwhile is sent again then, with the same key.
    pub async fn run(self, stop: CancellationToken) {
        let first = self.config.poll.min(Duration::from_secs(1));
        let mut pause = first;
        loop {
            let passed = tokio::select! {
                () = stop.cancelled() => return,
                passed = self.pass() => passed,
            };
            let (full, found) = match passed {
                Ok(n) => (n == self.config.batch as usize, n > 0),
                Err(e) => {
                    tracing::warn!("the outbox could not be read, to be tried again: {e}");
                    (false, false)
                }
            };
            if full {
                continue;
            }
            if found {
                pause = first;
            }
            let retry = self.retries.lock().expect("retries lock").first().copied();
            let retry_due = async {
                match retry {
                    Some(at) => self.clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.wake.notified() => pause = first,
                () = retry_due => {}
                () = tokio::time::sleep(pause) => pause = (pause * 2).min(self.config.poll),
            }
        }
    }

    /// Claims the notifications due now and delivers them side by side;
    /// answers how many it claimed.
    pub async fn pass(&self) -> dagcron_store::Result<usize> {
        let now = self.clock.now();
        // Retries due by now are claimed by this pass; if it cannot claim,
        // they are looked at again a second later.
        let had_due = {
            let mut retries = self.retries.lock().expect("retries lock");
            let before = retries.len();
            retries.retain(|at| *at > now);
            retries.len() < before
        };
        let until = now
            .checked_add(SignedDuration::try_from(self.config.claim).unwrap_or(SignedDuration::MAX))
            .unwrap_or(Timestamp::MAX);
        let claimed = match self
            .store
            .claim_notifications(&self.config.owner, now, until, self.config.batch)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                if had_due {
                    let again = now.checked_add(SignedDuration::from_secs(1)).unwrap_or(now);
                    self.retries.lock().expect("retries lock").insert(again);
                }
                return Err(e);
            }
        };
        let n = claimed.len();
        let sends = claimed.into_iter().map(|note| self.deliver(note));
        for result in futures_util::future::join_all(sends).await {
            if let Err(e) = result {
                // Left claimed: another pass takes it once the claim ends.
                tracing::warn!("a notification's delivery could not be recorded: {e}");
            }
        }
        Ok(n)
    }

    /// Delivers one notification and records the attempt.
    async fn deliver(&self, note: NotificationRecord) -> dagcron_store::Result<()> {
        let made = &note.made;
        if made.event == notify::NotifyEvent::Recovered.as_str()
            && let Some(run) = made.run
        {
            let before = self
                .store
                .previous_run_end(&made.namespace, &made.job, run)
                .await?;
            if !notify::is_recovery(before) {
                let end = DeliveryEnd::Dropped {
                    why: "not a recovery: the job's run before it did not fail".into(),
                    at: self.clock.now(),
                };
                return self.record(&note, None, end).await;
            }
        }
        let answer = self.send(&note).await;
        let now = self.clock.now();
        let number = note.attempts + 1;
        let end = if answer.delivered() {
            DeliveryEnd::Delivered
        } else {
            match notify::after_failed_delivery(number, made.at, now, draw(&made.key, number)) {
                Some(at) => DeliveryEnd::Retry(at),
                None => DeliveryEnd::Failed,
            }
        };
        if let DeliveryEnd::Retry(at) = end {
            self.retries.lock().expect("retries lock").insert(at);
        }
        match (&end, &answer.error) {
            (DeliveryEnd::Retry(at), Some(e)) => {
                tracing::info!(key = %made.key, attempt = number, "notification not delivered, again at {at}: {e}");
            }
            (DeliveryEnd::Failed, Some(e)) => {
                tracing::warn!(key = %made.key, attempt = number, "notification given up: {e}");
            }
            _ => {}
        }
        let attempt = DeliveryAttempt {
            number,
            at: now,
            status: answer.status.map(i32::from),
            error: answer.error,
        };
        self.record(&note, Some(&attempt), end).await
    }

    async fn record(
        &self,
        note: &NotificationRecord,
        attempt: Option<&DeliveryAttempt>,
        end: DeliveryEnd,
    ) -> dagcron_store::Result<()> {
        let held = self
            .store
            .record_delivery(note.id, &self.config.owner, attempt, &end)
            .await?;
        if held {
            self.metrics.count(&end);
        } else {
            tracing::warn!(key = %note.made.key, "a notification's claim ended before its delivery was recorded; another node has it");
        }
        Ok(())
    }

    /// Sends a notification to its notifier; an error says why it could
    /// not be (an unreadable notifier, a missing secret, a refused address).
    async fn send(&self, note: &NotificationRecord) -> Answer {
        let failed = |error: String| Answer {
            status: None,
            error: Some(error),
        };
        let made = &note.made;
        let notifier: NotifierSpec = match serde_json::from_str(&made.channel) {
            Ok(n) => n,
            Err(e) => {
                return failed(format!(
                    "the notifier's stored definition is unreadable: {e}"
                ));
            }
        };
        let secrets = match self.secrets(&made.namespace, &notifier.secret_refs()).await {
            Ok(s) => s,
            Err(e) => return failed(e),
        };
        if let Some(email) = &notifier.email {
            let Some(smtp) = &self.config.smtp else {
                return failed(
                    "this server has no SMTP relay for e-mail (its --smtp-url is not set)".into(),
                );
            };
            let payload: Payload = match serde_json::from_str(&made.payload) {
                Ok(p) => p,
                Err(e) => {
                    return failed(format!("the notification's stored body is unreadable: {e}"));
                }
            };
            let summary = payload.summary();
            let subject = summary.strip_prefix("dagcron: ").unwrap_or(&summary);
            let pretty = serde_json::to_string_pretty(&payload).unwrap_or_default();
            let body =
                format!("{summary}\n\nThe notification, as a webhook receives it:\n\n{pretty}\n");
            return smtp
                .send(&email.to, &format!("[dagcron] {subject}"), body, &made.key)
                .await;
        }
        let value = |v: &EnvValue| match v {
            EnvValue::Plain(s) => s.clone(),
            EnvValue::Secret { secret } => secrets.get(secret).cloned().unwrap_or_default(),
        };
        let post = match (&notifier.webhook, &notifier.slack) {
            (Some(hook), _) => {
                let body = made.payload.clone().into_bytes();
                let mut headers = vec![
                    ("Idempotency-Key".to_string(), made.key.clone()),
                    ("X-Dagcron-Delivery".to_string(), made.key.clone()),
                    ("X-Dagcron-Event".to_string(), made.event.clone()),
                ];
                if let Some(key) = &hook.secret {
                    let key = secrets.get(&key.secret).cloned().unwrap_or_default();
                    headers.push((
                        SIGNATURE_HEADER.to_string(),
                        signature(key.as_bytes(), &body),
                    ));
                }
                Post {
                    url: value(&hook.url),
                    headers,
                    body,
                    timeout: self.config.timeout,
                }
            }
            (None, Some(slack)) => {
                let payload: Payload = match serde_json::from_str(&made.payload) {
                    Ok(p) => p,
                    Err(e) => {
                        return failed(format!(
                            "the notification's stored body is unreadable: {e}"
                        ));
                    }
                };
                Post {
                    url: value(&slack.url),
                    headers: vec![],
                    body: serde_json::json!({ "text": payload.summary() })
                        .to_string()
                        .into_bytes(),
                    timeout: self.config.timeout,
                }
            }
            (None, None) => return failed("the notifier has no channel".into()),
        };
        let policy = match &self.policies {
            Some(source) => match source.0.policy(&made.namespace).await {
                Ok(p) => Some(p),
                Err(e) => return failed(format!("the namespace's execution policy: {e}")),
            },
            None => None,
        };
        send(policy.as_ref(), post).await
    }

    async fn secrets(
        &self,
        namespace: &str,
        names: &BTreeSet<String>,
    ) -> Result<std::collections::BTreeMap<String, String>, String> {
        if names.is_empty() {
            return Ok(Default::default());
        }
        match &self.secrets {
            Some(source) => source.0.resolve(namespace, names).await,
            None => Err("the notifier refers to secrets, and this server has none".into()),
        }
    }
}

/// A number in `[0, 1)` drawn from a notification's key and attempt: the
/// jitter of its retries, the same if the outbox decides again.
fn draw(key: &str, attempt: u32) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain(attempt.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests;
