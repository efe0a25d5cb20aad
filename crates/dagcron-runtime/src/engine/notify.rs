//! The notifications of a run's end: written in the batch that records
//! the end, so that a crash never loses one and a batch committed twice
//! never doubles one (the outbox keeps one row per key); the outbox is
//! woken once the batch is committed (see [`crate::outbox`]).

use dagcron_core::RunState;
use dagcron_core::notify::{self, Payload, PayloadRun};
use dagcron_store::{NewNotification, RunId, Store, Write};
use jiff::Timestamp;

use super::{Action, Engine};

impl<S: Store> Engine<S> {
    /// Puts in the batch the notifications the rules of run `id`'s job
    /// make of its end in `state`.
    pub(super) fn notify_run_end(&mut self, id: RunId, state: RunState, now: Timestamp) {
        let run = &self.runs.table[&id];
        let made = notify::on_run_end(&run.job.spec.notify, state);
        if made.is_empty() {
            return;
        }
        let (namespace, job) = (&run.key.0, &run.key.1);
        for (notifier, event) in made {
            let key = notify::run_key(namespace, job, id, event, &notifier.name);
            let payload = Payload {
                schema: notify::SCHEMA.into(),
                id: key.clone(),
                event,
                at: now,
                namespace: namespace.clone(),
                job: job.clone(),
                run: PayloadRun {
                    id,
                    state: state.as_str().into(),
                    trigger: run.trigger.as_str().into(),
                    scheduled_at: run.scheduled_at,
                },
            };
            self.batch.writes.push(Write::Notify(NewNotification {
                key,
                namespace: namespace.clone(),
                job: job.clone(),
                run: Some(id),
                event: event.as_str().into(),
                notifier: notifier.name.clone(),
                channel: serde_json::to_string(notifier).expect("notifiers serialize"),
                payload: serde_json::to_string(&payload).expect("payloads serialize"),
                at: now,
            }));
        }
        if let Some(outbox) = &self.config.outbox {
            let outbox = outbox.clone();
            self.batch
                .effects
                .push(Action::Then(Box::new(move || outbox.notify_one())));
        }
    }
}
