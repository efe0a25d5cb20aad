//! Runs started by messages of NATS JetStream (a job's `nats`, see
//! `dagcron_core::message`): one durable pull consumer per job and
//! subject, shared by the nodes of a cluster, of the streams its
//! namespace's execution policy lists (`nats_streams`). A message is
//! acknowledged once its run is committed (or once it is known to have
//! made one before), so a crash in between redelivers it and its key
//! keeps it to one run.

use std::collections::HashMap;

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use dagcron_core::message::{self, NatsTrigger};
use dagcron_runtime::{EngineError, EngineHandle, PolicySource, TriggerBy};
use dagcron_store::Trigger;
use futures_util::StreamExt;
use sha2::Digest;
use tokio_util::sync::CancellationToken;

/// How long a message may go unacknowledged before NATS delivers it
/// again (the run is committed well within it).
const ACK_WAIT: Duration = Duration::from_secs(30);

/// How long to wait before trying again a stream or a connection that
/// failed, and before a message declined for now comes back.
const AGAIN: Duration = Duration::from_secs(5);

type JobKey = (String, String);

/// The durable consumer of a job's trigger: a hash of its namespace, name
/// and subject, so that no two jobs (of any namespaces) share one, and a
/// changed subject is a new consumer (its old one deleted).
fn consumer_name(key: &JobKey, trigger: &NatsTrigger) -> String {
    let mut hash = sha2::Sha256::new();
    for part in [&key.0, &key.1, &trigger.subject] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("dagcron-{hex}")
}

/// Consumes the messages of every job with a `nats` trigger from the
/// server at `url`, until `stop`.
pub(super) async fn run(
    url: String,
    engine: EngineHandle,
    policies: PolicySource,
    stop: CancellationToken,
) {
    let client = loop {
        match async_nats::connect(&url).await {
            Ok(client) => break client,
            Err(e) => {
                tracing::warn!("cannot reach NATS at {url}, trying again: {e}");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(AGAIN) => {}
                }
            }
        }
    };
    let js = jetstream::new(client);
    let mut watch = engine.nats_triggers();
    let mut consumers: HashMap<JobKey, (NatsTrigger, CancellationToken)> = HashMap::new();
    loop {
        let wanted = watch.borrow_and_update().clone();
        // Gone or changed: stop its consumer, and remove it from NATS.
        consumers.retain(|key, (trigger, token)| {
            let keep = wanted.get(key) == Some(trigger);
            if !keep {
                token.cancel();
                let js = js.clone();
                let (stream, name) = (trigger.stream.clone(), consumer_name(key, trigger));
                tokio::spawn(async move {
                    if let Ok(stream) = js.get_stream(&stream).await {
                        let _ = stream.delete_consumer(&name).await;
                    }
                });
            }
            keep
        });
        for (key, trigger) in wanted.iter() {
            if consumers.contains_key(key) {
                continue;
            }
            let token = stop.child_token();
            let consumer = Consumer {
                js: js.clone(),
                key: key.clone(),
                trigger: trigger.clone(),
                engine: engine.clone(),
                policies: policies.clone(),
            };
            tokio::spawn(consumer.run(token.clone()));
            consumers.insert(key.clone(), (trigger.clone(), token));
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = watch.changed() => if changed.is_err() { return },
        }
    }
}

/// The consumer of one job's messages.
struct Consumer {
    js: jetstream::Context,
    key: JobKey,
    trigger: NatsTrigger,
    engine: EngineHandle,
    policies: PolicySource,
}

impl Consumer {
    /// Consumes until `stop`; a stream that does not exist (yet), one the
    /// namespace may not read, or a connection lost is tried again.
    async fn run(self, stop: CancellationToken) {
        let job = format!("{}/{}", self.key.0, self.key.1);
        loop {
            if let Err(e) = self.consume(&stop).await {
                tracing::warn!(%job, stream = %self.trigger.stream, "consuming messages failed, trying again: {e}");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(AGAIN) => {}
            }
        }
    }

    /// Whether the namespace's execution policy lets it read its stream
    /// (checked before consuming, and at each message: it may change).
    async fn allowed(&self) -> Result<(), String> {
        match self.policies.0.policy(&self.key.0).await {
            Ok(policy) if policy.may_consume(&self.trigger.stream) => Ok(()),
            Ok(_) => Err(format!(
                "the execution policy of namespace {} does not list the stream {} in its nats_streams",
                self.key.0, self.trigger.stream
            )),
            Err(e) => Err(format!("the namespace's execution policy: {e}")),
        }
    }

    async fn consume(&self, stop: &CancellationToken) -> Result<(), String> {
        self.allowed().await?;
        let (key, trigger) = (&self.key, &self.trigger);
        let mut stream = self
            .js
            .get_stream(&trigger.stream)
            .await
            .map_err(|e| format!("the stream {}: {e}", trigger.stream))?;
        let created = stream
            .info()
            .await
            .map(|i| (i.created.unix_timestamp_nanos() / 1000) as i64)
            .map_err(|e| format!("the stream {}: {e}", trigger.stream))?;
        let name = consumer_name(key, trigger);
        // A new consumer takes the messages published from now on, not the
        // stream's history.
        let config = pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: trigger.subject.clone(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            deliver_policy: jetstream::consumer::DeliverPolicy::New,
            ..Default::default()
        };
        let consumer = stream
            .get_or_create_consumer::<pull::Config>(&name, config)
            .await
            .map_err(|e| format!("its consumer {name}: {e}"))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| format!("its messages: {e}"))?;
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                next = messages.next() => next,
            };
            let msg = match next {
                None => return Err("the consumer's messages ended".into()),
                Some(Err(e)) => return Err(format!("a message: {e}")),
                Some(Ok(msg)) => msg,
            };
            if let Err(e) = self.allowed().await {
                let _ = msg.ack_with(AckKind::Nak(Some(AGAIN))).await;
                return Err(e);
            }
            let Ok(sequence) = msg.info().map(|i| i.stream_sequence) else {
                let _ = msg.ack_with(AckKind::Nak(Some(AGAIN))).await;
                continue;
            };
            let id = msg
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.as_str().to_string());
            let by = TriggerBy {
                kind: Trigger::Message,
                key: Some(message::message_key(
                    &trigger.stream,
                    created,
                    id.as_deref(),
                    sequence,
                )),
            };
            let params = trigger.params_of(msg.subject.as_str(), &msg.payload);
            let ack = match self.engine.trigger_by(&key.0, &key.1, params, by).await {
                // Made now, or made by an earlier delivery.
                Ok(_) => AckKind::Ack,
                // Declined for now (paused, its overlap policy, a backlog,
                // the store): it comes back.
                Err(EngineError::Busy(_) | EngineError::Conflict(_) | EngineError::Storage(_)) => {
                    AckKind::Nak(Some(AGAIN))
                }
                // Shutting down: NATS delivers it again after the wait.
                Err(EngineError::Stopped) => return Ok(()),
                Err(e) => {
                    tracing::warn!(job = %format!("{}/{}", key.0, key.1), "a message makes no run: {e}");
                    AckKind::Term
                }
            };
            if let Err(e) = msg.ack_with(ack).await {
                tracing::warn!(
                    "a message's acknowledgement was not sent (it comes again, and makes no second run): {e}"
                );
            }
        }
    }
}
