//! The notifications of a run's end, of a task held for an operator and
//! of a job's failure breaker: written in the batch that records the
//! change, so that a crash never loses one and a batch committed twice
//! never doubles one (the outbox keeps one row per key); the outbox is
//! woken once the batch is committed (see [`crate::outbox`]).

use dagcron_core::breaker::OpenBreaker;
use dagcron_core::notify::{self, NotifierSpec, NotifyEvent, Payload, PayloadRun, PayloadTask};
use dagcron_core::{Job, RunState};
use dagcron_store::{BreakerWrite, NewNotification, RunId, Store, Trigger, Write};
use jiff::Timestamp;

use super::{Action, Engine, JobKey};

impl<S: Store> Engine<S> {
    /// Puts in the batch the notifications the rules of run `id`'s job
    /// make of its end in `state`.
    pub(super) fn notify_run_end(&mut self, id: RunId, state: RunState, now: Timestamp) {
        let job = self.runs.table[&id].job.clone();
        let made = notify::on_run_end(&job.spec.notify, state);
        let notes = self.run_notifications(id, made, state, (None, None), now);
        self.notify(notes);
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
            id: run.task_id(task),
            attempt,
        };
        let notes = self.run_notifications(id, made, state, (Some(task), None), now);
        self.notify(notes);
    }

    /// Puts in the batch the notifications of a scheduled fire of `key` at
    /// `at` recorded with `outcome` (missed or skipped), made `run` if any.
    pub(super) fn notify_fire(
        &mut self,
        key: &JobKey,
        at: Timestamp,
        outcome: dagcron_core::FireOutcome,
        run: Option<(RunId, Trigger)>,
        now: Timestamp,
    ) {
        if outcome == dagcron_core::FireOutcome::Fired {
            return;
        }
        let Some(entry) = self.jobs.table.get(key) else {
            return;
        };
        let notes: Vec<NewNotification> = notify::on_fire(entry.fire_rules(), outcome)
            .into_iter()
            .map(|(notifier, event)| {
                let id = notify::fire_key(&key.0, &key.1, at, event, &notifier.name);
                let mut payload = Payload::of_job(id.clone(), event, now, key);
                payload.run = run.map(|(id, trigger)| PayloadRun {
                    id,
                    state: RunState::Running.as_str().into(),
                    trigger: trigger.as_str().into(),
                    scheduled_at: at,
                });
                payload.fire = Some(notify::PayloadFire {
                    scheduled_at: at,
                    outcome: outcome.as_str().into(),
                });
                note(key, run.map(|r| r.0), id, notifier, &payload, now)
            })
            .collect();
        self.notify(notes);
    }

    /// Run `id` failed: if its job has a failure breaker, the batch asks
    /// the store to open it (the store counts the job's runs, also those
    /// other nodes ended), with the notifications that says so.
    pub(super) fn trip_breaker(&mut self, id: RunId, now: Timestamp) {
        let run = &self.runs.table[&id];
        let Some(breaker) = run.job.spec.breaker else {
            return;
        };
        let (key, job) = (run.key.clone(), run.job.clone());
        let opened = OpenBreaker {
            opened_at: now,
            run: id,
            failures: breaker.after_failures,
        };
        let made = notify::on_breaker(&job.spec.notify, true);
        let notifications =
            self.run_notifications(id, made, RunState::Failed, (None, Some(opened)), now);
        self.breaker(BreakerWrite {
            namespace: key.0.clone(),
            job: key.1.clone(),
            open: Some((id, breaker.after_failures)),
            at: now,
            notifications,
        });
    }

    /// Job `key` was resumed: the batch asks the store to close its
    /// failure breaker, if it is open, with the notifications of `job`'s
    /// rules that say so.
    pub(super) fn close_breaker(&mut self, key: &JobKey, job: &Job, now: Timestamp) {
        let made = notify::on_breaker(&job.spec.notify, false);
        let notifications = made
            .into_iter()
            .map(|(notifier, event)| {
                let id = notify::breaker_key(&key.0, &key.1, None, now, &notifier.name);
                let payload = Payload::of_job(id.clone(), event, now, key);
                note(key, None, id, notifier, &payload, now)
            })
            .collect();
        self.breaker(BreakerWrite {
            namespace: key.0.clone(),
            job: key.1.clone(),
            open: None,
            at: now,
            notifications,
        });
    }

    fn breaker(&mut self, write: BreakerWrite) {
        let wake = !write.notifications.is_empty();
        self.batch.writes.push(Write::Breaker(write));
        if wake {
            self.wake_outbox();
        }
    }

    /// The notifications `made` of run `id` in `state` (about a task, or
    /// the breaker it opened, if any).
    fn run_notifications(
        &self,
        id: RunId,
        made: Vec<(&NotifierSpec, NotifyEvent)>,
        state: RunState,
        (task, breaker): (Option<PayloadTask>, Option<OpenBreaker>),
        now: Timestamp,
    ) -> Vec<NewNotification> {
        let run = &self.runs.table[&id];
        let key = &run.key;
        made.into_iter()
            .map(|(notifier, event)| {
                let on = task.as_ref().map(|t| (t.id.as_str(), t.attempt));
                let id_key = if event == NotifyEvent::BreakerOpened {
                    notify::breaker_key(&key.0, &key.1, Some(id), now, &notifier.name)
                } else {
                    notify::run_key(&key.0, &key.1, id, event, on, &notifier.name)
                };
                let mut payload = Payload::of_job(id_key.clone(), event, now, key);
                payload.run = Some(PayloadRun {
                    id,
                    state: state.as_str().into(),
                    trigger: run.trigger.as_str().into(),
                    scheduled_at: run.scheduled_at,
                });
                payload.task = task.clone();
                payload.breaker = breaker;
                note(key, Some(id), id_key, notifier, &payload, now)
            })
            .collect()
    }

    /// Puts `notes` in the batch.
    fn notify(&mut self, notes: Vec<NewNotification>) {
        if notes.is_empty() {
            return;
        }
        self.batch
            .writes
            .extend(notes.into_iter().map(Write::Notify));
        self.wake_outbox();
    }

    /// Wakes the outbox once the batch is committed.
    pub(super) fn wake_outbox(&mut self) {
        if let Some(outbox) = &self.config.outbox {
            let outbox = outbox.clone();
            self.batch
                .effects
                .push(Action::Then(Box::new(move || outbox.notify_one())));
        }
    }
}

/// The outbox's row of a notification to `notifier` about job `key` (and
/// run `run`), keyed `id`.
pub(super) fn note(
    key: &JobKey,
    run: Option<RunId>,
    id: String,
    notifier: &NotifierSpec,
    payload: &Payload,
    now: Timestamp,
) -> NewNotification {
    NewNotification {
        key: id,
        namespace: key.0.clone(),
        job: key.1.clone(),
        run,
        event: payload.event.as_str().into(),
        notifier: notifier.name.clone(),
        channel: serde_json::to_string(notifier).expect("notifiers serialize"),
        payload: serde_json::to_string(payload).expect("payloads serialize"),
        at: now,
    }
}
