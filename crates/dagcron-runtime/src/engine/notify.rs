//! The notifications of a run's end and of a task held for an operator:
//! written in the batch that records the change, so that a crash never
//! loses one and a batch committed twice never doubles one (the outbox
//! keeps one row per key); the outbox is woken once the batch is committed
//! (see [`crate::outbox`]).

use dagcron_core::RunState;
use dagcron_core::notify::{self, NotifierSpec, NotifyEvent, Payload, PayloadRun, PayloadTask};
use dagcron_store::{NewNotification, RunId, Store, Write};
use jiff::Timestamp;

use super::{Action, Engine};

impl<S: Store> Engine<S> {
    /// Puts in the batch the notifications the rules of run `id`'s job
    /// make of its end in `state`.
    pub(super) fn notify_run_end(&mut self, id: RunId, state: RunState, now: Timestamp) {
        let job = self.runs.table[&id].job.clone();
        let made = notify::on_run_end(&job.spec.notify, state);
        self.notify(id, made, state, None, now);
    }

    /// Puts in the batch the notifications of task `task` of run `id`
    /// held for an operator.
    pub(super) fn notify_held(&mut self, id: RunId, task: usize, now: Timestamp) {
        let run = &self.runs.table[&id];
        let job = run.job.clone();
        let made = notify::on_held(&job.spec.notify);
        let attempt = run.times[task].ended.unwrap_or(0);
        let state = run.machine.state();
        let task = PayloadTask {
            id: job.tasks[task].id.clone(),
            attempt,
        };
        self.notify(id, made, state, Some(task), now);
    }

    fn notify(
        &mut self,
        id: RunId,
        made: Vec<(&NotifierSpec, NotifyEvent)>,
        state: RunState,
        task: Option<PayloadTask>,
        now: Timestamp,
    ) {
        if made.is_empty() {
            return;
        }
        let run = &self.runs.table[&id];
        let (namespace, job) = (&run.key.0, &run.key.1);
        for (notifier, event) in made {
            let on = task.as_ref().map(|t| (t.id.as_str(), t.attempt));
            let key = notify::run_key(namespace, job, id, event, on, &notifier.name);
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
                task: task.clone(),
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
