//! SLA alerts (see [`dagcron_core::sla`]): each scheduled fire of a job
//! with an `sla` arms a timer at its deadline; there, the fire's run is
//! judged (read beside the loop if it has ended), and a miss is recorded
//! in the ledger with its `sla_missed` notifications, once. After a
//! restart the fires whose deadlines may not have been judged (as far back
//! as the job's SLA reaches) are judged again, which records nothing
//! twice.

use super::*;
use dagcron_core::notify::{self, Payload, PayloadRun, PayloadSla};

/// The most fires of one job start-up judges again (the newest).
const REJUDGED: u32 = 10_000;

/// When the judgement of a deadline could not read its run, it is tried
/// again this much later.
const AGAIN: SignedDuration = SignedDuration::from_secs(60);

/// What a deadline's judgement needs, read beside the loop.
pub(crate) struct SlaDue {
    pub(super) key: JobKey,
    pub(super) scheduled: Timestamp,
    pub(super) deadline: Timestamp,
    pub(super) job: Option<Arc<Job>>,
    /// The fire's run: its id, state and end (none: no run); an error:
    /// it could not be read (the store failed, or it is gone).
    pub(super) run: Result<Option<(RunId, RunState, Option<Timestamp>)>, ()>,
    pub(super) trigger: Option<Trigger>,
    /// The fire's run, as the ledger names it.
    pub(super) run_id: Option<RunId>,
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
                let found = match (going, run) {
                    (Some(g), _) => Ok(Some(g)),
                    (None, Some(id)) => match store.get_run(id).await {
                        Ok(Some(r)) => Ok(Some((r.id, r.state, r.finished_at, r.trigger))),
                        // Gone (retention), or unreadable: not judged now.
                        Ok(None) | Err(_) => Err(()),
                    },
                    (None, None) => Ok(None),
                };
                SlaDue {
                    key: (*key).clone(),
                    scheduled,
                    deadline,
                    job,
                    trigger: found.ok().flatten().map(|r| r.3),
                    run: found.map(|r| r.map(|(id, state, ended, _)| (id, state, ended))),
                    run_id: run,
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
            run_id,
        } = due;
        // Deleted, or no SLA any more.
        let Some(job) = job.filter(|j| j.spec.sla.is_some()) else {
            return;
        };
        let Ok(run) = run else {
            if run_id.is_some_and(|id| self.runs.dropped.contains(&id)) {
                return;
            }
            // Its run could not be read: judged again a little later (a
            // run gone to retention is never judged).
            if let Some(key) = self.jobs.table.get_key_value(&key).map(|(k, _)| k.clone()) {
                let at = now.checked_add(AGAIN).unwrap_or(now);
                self.arm(
                    at,
                    Timer::Sla {
                        key,
                        scheduled,
                        deadline,
                        run: run_id,
                    },
                );
            }
            return;
        };
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
        for key in keys {
            let Some(job) = jobs::read_job(&*self.store, &key).await? else {
                continue;
            };
            let Some(sla) = &job.spec.sla else { continue };
            // As far back as a deadline still ahead, or judged while the
            // server was down, may reach.
            let since = now.checked_sub(sla.reach()).unwrap_or(Timestamp::MIN);
            let fires = self.newest_fires_since(&key, since, now).await?;
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

impl<S: Store> Engine<S> {
    /// The newest [`REJUDGED`] fires of `key` in `[from, to)`, by halving
    /// the range from its end until it holds fewer.
    async fn newest_fires_since(
        &self,
        key: &JobKey,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<dagcron_store::FireRecord>, StorageError> {
        let mut start = from;
        loop {
            let fires = self
                .store
                .list_fires(&key.0, &key.1, start, to, REJUDGED)
                .await?;
            if fires.len() < REJUDGED as usize || start >= to {
                return Ok(fires);
            }
            let half = to.duration_since(start) / 2;
            start = to.checked_sub(half).unwrap_or(to);
        }
    }
}

/// The SLA deadline of `job`'s fire at `scheduled`, if it has an SLA.
fn deadline_of(job: &Job, scheduled: Timestamp) -> Option<Timestamp> {
    let sla = job.spec.sla.as_ref()?;
    let tz = jiff::tz::TimeZone::get(&job.spec.timezone).ok()?;
    Some(sla.deadline(scheduled, &tz))
}
