//! Runs started by messages of NATS JetStream (a job's `nats`, see
//! `dagcron_core::message`): one durable pull consumer per job, shared by
//! the nodes of a cluster. A message is acknowledged once its run is
//! committed (or once it is known to have made one before), so a crash
//! in between redelivers it and its key keeps it to one run.

use std::collections::HashMap;

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use dagcron_core::message::{self, NatsTrigger};
use dagcron_runtime::{EngineError, EngineHandle, TriggerBy};
use dagcron_store::Trigger;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

/// How long a message may go unacknowledged before NATS delivers it
/// again (the run is committed well within it).
const ACK_WAIT: Duration = Duration::from_secs(30);

/// How long to wait before trying again a stream or a connection that
/// failed, and before a message declined for now comes back.
const AGAIN: Duration = Duration::from_secs(5);

type JobKey = (String, String);

/// Consumes the messages of every job with a `nats` trigger from the
/// server at `url`, until `stop`.
pub(super) async fn run(url: String, engine: EngineHandle, stop: CancellationToken) {
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
        // Gone or changed: stop its consumer (a deleted job's is removed
        // from NATS too).
        consumers.retain(|key, (trigger, token)| {
            let keep = wanted.get(key) == Some(trigger);
            if !keep {
                token.cancel();
                if !wanted.contains_key(key) {
                    let js = js.clone();
                    let (stream, name) = (
                        trigger.stream.clone(),
                        message::consumer_name(&key.0, &key.1),
                    );
                    tokio::spawn(async move {
                        if let Ok(stream) = js.get_stream(&stream).await {
                            let _ = stream.delete_consumer(&name).await;
                        }
                    });
                }
            }
            keep
        });
        for (key, trigger) in wanted.iter() {
            if consumers.contains_key(key) {
                continue;
            }
            let token = stop.child_token();
            tokio::spawn(consume(
                js.clone(),
                key.clone(),
                trigger.clone(),
                engine.clone(),
                token.clone(),
            ));
            consumers.insert(key.clone(), (trigger.clone(), token));
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = watch.changed() => if changed.is_err() { return },
        }
    }
}

/// The consumer of job `key`, until `stop`; a stream that does not exist
/// (yet) or a connection lost is tried again.
async fn consume(
    js: jetstream::Context,
    key: JobKey,
    trigger: NatsTrigger,
    engine: EngineHandle,
    stop: CancellationToken,
) {
    let job = format!("{}/{}", key.0, key.1);
    loop {
        if let Err(e) = consume_once(&js, &key, &trigger, &engine, &stop).await {
            tracing::warn!(%job, stream = %trigger.stream, "consuming messages failed, trying again: {e}");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(AGAIN) => {}
        }
    }
}

async fn consume_once(
    js: &jetstream::Context,
    key: &JobKey,
    trigger: &NatsTrigger,
    engine: &EngineHandle,
    stop: &CancellationToken,
) -> Result<(), String> {
    let stream = js
        .get_stream(&trigger.stream)
        .await
        .map_err(|e| format!("the stream {}: {e}", trigger.stream))?;
    let name = message::consumer_name(&key.0, &key.1);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        filter_subject: trigger.subject.clone(),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        ..Default::default()
    };
    let mut consumer = stream
        .get_or_create_consumer::<pull::Config>(&name, config.clone())
        .await
        .map_err(|e| format!("its consumer {name}: {e}"))?;
    if consumer.cached_info().config.filter_subject != trigger.subject {
        // The job's subject changed: the consumer starts over on it.
        stream
            .delete_consumer(&name)
            .await
            .map_err(|e| format!("its consumer {name}: {e}"))?;
        consumer = stream
            .create_consumer(config)
            .await
            .map_err(|e| format!("its consumer {name}: {e}"))?;
    }
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
        let sequence = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        let id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_string());
        let by = TriggerBy {
            kind: Trigger::Message,
            key: Some(message::message_key(
                &trigger.stream,
                id.as_deref(),
                sequence,
            )),
        };
        let params = trigger.params_of(msg.subject.as_str(), &msg.payload);
        let ack = match engine.trigger_by(&key.0, &key.1, params, by).await {
            // Made now, or made by an earlier delivery.
            Ok(_) => AckKind::Ack,
            // Declined for now (its overlap policy, a backlog, the store):
            // it comes back.
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
