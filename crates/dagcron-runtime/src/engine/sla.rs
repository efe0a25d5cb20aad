//! SLA alerts (see [`dagcron_core::sla`]): each scheduled fire of a job
//! with an `sla` arms a timer at its deadline; there, the fire's run is
//! judged (read beside the loop if it has ended), and a miss is recorded
//! in the ledger with its `sla_missed` notifications, once. After a
//! restart the fires of the last two days are judged again, which records
//! nothing twice.

use super::*;
use dagcron_core::notify::{self, Payload, PayloadRun, PayloadSla};

/// How far back start-up looks for fires whose SLA is to be judged.
const SLA_LOOKBACK: SignedDuration = SignedDuration::from_hours(48);

/// What a deadline's judgement needs, read beside the loop.
pub(crate) struct SlaDue {
    pub(super) key: JobKey,
    pub(super) scheduled: Timestamp,
    pub(super) deadline: Timestamp,
    pub(super) job: Option<Arc<Job>>,
    /// The fire's run: its id, state and end (none: no run).
    pub(super) run: Option<(RunId, RunState, Option<Timestamp>)>,
    pub(super) trigger: Option<Trigger>,
}

impl<S: Store> Engine<S> {
    /// A fire of `key` at `scheduled` was recorded, with run `run`: if its
    /// job has an SLA, its deadline is armed.
    pub(super) fn arm_sla(&mut self, key: &JobKey, scheduled: Timestamp, run: Option<RunId>) {
        let Some((key, entry)) = self.jobs.table.get_key_value(key) else {
            return;
        };
        let Some(job) = &entry.job else { return };
        let Some(deadline) = deadline_of(job, scheduled) else {
            return;
        };
        let key = key.clone();
        self.arm(
            deadline,
            Timer::Sla {
                key,
                scheduled,
                deadline,
                run,
            },
        );
    }

    /// The deadline of a fire came: its job and its run (if it has ended)
    /// are read beside the loop, and judged in [`Engine::sla_judged`].
    pub(super) fn sla_due(
        &mut self,
        key: Arc<JobKey>,
        scheduled: Timestamp,
        deadline: Timestamp,
        run: Option<RunId>,
    ) {
        // Still going: not succeeded by its deadline.
        let going = run.and_then(|id| {
            let r = self.runs.table.get(&id)?;
            Some((id, r.machine.state(), None, r.trigger))
        });
        let job = self.job_of(&key);
        let store = self.store.clone();
        self.beside(
            async move {
                let job = job.await.ok().flatten();
                let run = match (going, run) {
                    (Some(g), _) => Some(g),
                    (None, Some(id)) => store
                        .get_run(id)
                        .await
                        .ok()
                        .flatten()
                        .map(|r| (r.id, r.state, r.finished_at, r.trigger)),
                    (None, None) => None,
                };
                SlaDue {
                    key: (*key).clone(),
                    scheduled,
                    deadline,
                    job,
                    trigger: run.map(|r| r.3),
                    run: run.map(|(id, state, ended, _)| (id, state, ended)),
                }
            },
            |due| Completion::SlaDue(Box::new(due)),
        );
    }

    /// Judges a fire at its deadline: a miss goes in the batch, with its
    /// notifications (the ledger records it once).
    pub(super) fn sla_judged(&mut self, due: SlaDue, now: Timestamp) {
        let SlaDue {
            key,
            scheduled,
            deadline,
            job,
            run,
            trigger,
        } = due;
        let Some(job) = job else { return };
        if !dagcron_core::sla::missed(deadline, run.map(|(_, state, ended)| (state, ended))) {
            return;
        }
        tracing::warn!(namespace = %key.0, job = %key.1, "the run scheduled for {scheduled} had not succeeded by {deadline}: its SLA is missed");
        let notifications = notify::on_sla_missed(&job.spec.notify)
            .into_iter()
            .map(|(notifier, event)| {
                let id = notify::sla_key(&key.0, &key.1, scheduled, &notifier.name);
                let mut payload = Payload::of_job(id.clone(), event, now, &key);
                payload.run = run.map(|(id, state, _)| PayloadRun {
                    id,
                    state: state.as_str().into(),
                    trigger: trigger.unwrap_or(Trigger::Schedule).as_str().into(),
                    scheduled_at: scheduled,
                });
                payload.sla = Some(PayloadSla {
                    scheduled_at: scheduled,
                    deadline,
                });
                super::notify::note(&key, run.map(|r| r.0), id, notifier, &payload, now)
            })
            .collect::<Vec<_>>();
        let wake = !notifications.is_empty();
        self.batch.writes.push(Write::SlaMissed {
            namespace: key.0.clone(),
            job: key.1.clone(),
            scheduled_at: scheduled,
            at: now,
            notifications,
        });
        if let Some(m) = &self.config.metrics {
            m.sla_missed(&key);
        }
        if wake {
            self.wake_outbox();
        }
    }

    /// At start-up: the fires of the last two days of the jobs with an SLA
    /// are judged again at their deadlines (a miss already recorded is not
    /// recorded again).
    pub(super) async fn rearm_slas(
        &mut self,
        keys: Vec<Arc<JobKey>>,
        now: Timestamp,
    ) -> Result<(), StorageError> {
        let since = now.checked_sub(SLA_LOOKBACK).unwrap_or(Timestamp::MIN);
        for key in keys {
            let Some(job) = jobs::read_job(&*self.store, &key).await? else {
                continue;
            };
            let fires = self
                .store
                .list_fires(&key.0, &key.1, since, now, 10_000)
                .await?;
            for f in fires {
                if f.sla_missed_at.is_some() || f.outcome == FireOutcome::Suppressed {
                    continue;
                }
                if let Some(deadline) = deadline_of(&job, f.scheduled_at) {
                    self.arm(
                        deadline,
                        Timer::Sla {
                            key: key.clone(),
                            scheduled: f.scheduled_at,
                            deadline,
                            run: f.run_id,
                        },
                    );
                }
            }
        }
        Ok(())
    }
}

/// The SLA deadline of `job`'s fire at `scheduled`, if it has an SLA.
fn deadline_of(job: &Job, scheduled: Timestamp) -> Option<Timestamp> {
    let sla = job.spec.sla.as_ref()?;
    let tz = jiff::tz::TimeZone::get(&job.spec.timezone).ok()?;
    Some(sla.deadline(scheduled, &tz))
}
