//! Runs: a fire's overlap decision, a run's DAG moving on as its tasks
//! end, retries, and stopping a run.

use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn run_id(&mut self) -> RunId {
        // Increasing, and roughly the creation time in microseconds; in a
        // cluster, the low bits are the node's slot.
        let now = self.clock.now().as_microsecond();
        match &self.config.node {
            None => self.last_run_id = (self.last_run_id + 1).max(now),
            Some(node) => {
                let counter = ((self.last_run_id >> SLOT_BITS) + 1).max(now);
                self.last_run_id = (counter << SLOT_BITS) | RunId::from(node.slot);
            }
        }
        self.last_run_id
    }

    pub(super) fn random(&mut self) -> u64 {
        // xorshift64*: enough for jitter, and no dependency.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A fire of `key` at `at`: applies the overlap policy and records it.
    pub(super) fn fire(
        &mut self,
        key: &JobKey,
        job: &Arc<Job>,
        at: Timestamp,
        trigger: Trigger,
        outcome: FireOutcome,
    ) {
        let now = self.clock.now();
        if let Some(o) = &self.config.observer {
            (o.0)(EngineEvent::Fired {
                scheduled_at: at,
                at: now,
            });
        }
        let decision = policy::on_fire(
            job.spec.concurrency,
            job.spec.max_active(),
            self.jobs[key].active.len() as u32,
        );
        if decision == FireDecision::Skip {
            self.writes.push(Write::Fire {
                namespace: key.0.clone(),
                job: key.1.clone(),
                scheduled_at: at,
                outcome: FireOutcome::SkippedOverlap,
                run: None,
            });
            return;
        }
        let run = self.new_run(
            key,
            job,
            trigger,
            at,
            job.spec.params.clone(),
            decision,
            now,
        );
        let id = run.id;
        if at > now {
            // Made ahead of its instant (`send_ahead`).
            self.runs.get_mut(&id).expect("run").start_at = Some(at);
        }
        self.writes.push(Write::Fire {
            namespace: key.0.clone(),
            job: key.1.clone(),
            scheduled_at: at,
            outcome,
            run: Some(run),
        });
        self.after_new_run(key, id, decision, now);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_run(
        &mut self,
        key: &JobKey,
        job: &Arc<Job>,
        trigger: Trigger,
        at: Timestamp,
        params: std::collections::BTreeMap<String, String>,
        decision: FireDecision,
        now: Timestamp,
    ) -> NewRun {
        let id = self.run_id();
        let (key, entry) = self.jobs.get_key_value(key).expect("job");
        let (key, version) = (key.clone(), entry.version);
        let state = if matches!(decision, FireDecision::Queue | FireDecision::Replace) {
            RunState::Pending
        } else {
            RunState::Running
        };
        self.runs.insert(
            id,
            RunEntry {
                key: key.clone(),
                job: job.clone(),
                scheduled_at: at,
                params: params.clone(),
                state,
                tasks: vec![TaskState::Pending; job.tasks.len()],
                attempts: vec![0; job.tasks.len()],
                tokens: vec![None; job.tasks.len()],
                closing: None,
                start_at: None,
            },
        );
        NewRun {
            id,
            namespace: key.0.clone(),
            job: key.1.clone(),
            job_version: version,
            trigger,
            scheduled_at: at,
            params,
            state,
            tasks: job.tasks.iter().map(|t| t.id.clone()).collect(),
            created_at: now,
        }
    }

    pub(super) fn after_new_run(
        &mut self,
        key: &JobKey,
        id: RunId,
        decision: FireDecision,
        now: Timestamp,
    ) {
        match decision {
            FireDecision::Replace => {
                // The new run waits until the runs it replaces have ended
                // (their attempts killed and recorded), then starts.
                let entry = &self.jobs[key];
                let replaced: Vec<RunId> =
                    entry.queued.iter().chain(&entry.active).copied().collect();
                for run in replaced {
                    self.stop_run(run, RunState::Cancelled, now);
                }
                self.jobs.get_mut(key).expect("job").queued.push_back(id);
                self.start_queued(key, now);
            }
            FireDecision::Queue => {
                self.jobs.get_mut(key).expect("job").queued.push_back(id);
            }
            FireDecision::Start | FireDecision::Skip => self.begin(id, now),
        }
    }

    /// A run enters `running`: arm its deadline and plan its first tasks.
    pub(super) fn begin(&mut self, id: RunId, now: Timestamp) {
        let run = self.runs.get_mut(&id).expect("run");
        run.state = RunState::Running;
        let key = run.key.clone();
        let deadline = run.job.spec.deadline;
        self.jobs.get_mut(&key).expect("job").active.push(id);
        if let Some(d) = deadline {
            let at = now
                .checked_add(SignedDuration::try_from(d.0).unwrap_or(SignedDuration::MAX))
                .unwrap_or(Timestamp::MAX);
            self.arm(at, Timer::Deadline { run: id });
        }
        self.advance(id, now);
    }

    /// Plans the DAG until nothing changes; finishes the run when it is done.
    pub(super) fn advance(&mut self, id: RunId, now: Timestamp) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if run.state != RunState::Running {
            return;
        }
        let rules: Vec<_> = run.job.tasks.iter().map(|t| t.trigger_rule).collect();
        if run.closing.is_none() {
            loop {
                let changes = run.job.dag.plan(&rules, &run.tasks);
                if changes.is_empty() {
                    break;
                }
                for (i, to) in changes {
                    self.writes.push(Write::TaskState {
                        run: id,
                        task: run.job.tasks[i].id.clone(),
                        from: TaskState::Pending,
                        to,
                    });
                    run.tasks[i] = to;
                    if to == TaskState::Ready {
                        self.ready.push(&run.job, id, i);
                    }
                }
            }
        }
        let outcome = if run.closing.is_some() {
            run.tasks
                .iter()
                .all(|t| t.is_terminal())
                .then(|| run.closing.expect("closing"))
        } else {
            policy::run_outcome(&run.tasks)
        };
        if let Some(final_state) = outcome {
            run.state = final_state;
            self.writes.push(Write::RunState {
                run: id,
                from: RunState::Running,
                to: final_state,
                at: now,
            });
            let key = run.key.clone();
            self.runs.remove(&id);
            let entry = self.jobs.get_mut(&key);
            if let Some(entry) = entry {
                entry.active.retain(|r| *r != id);
                self.start_queued(&key, now);
            }
            self.let_go_if_idle(&key, now);
        }
    }

    pub(super) fn start_queued(&mut self, key: &JobKey, now: Timestamp) {
        loop {
            let Some(entry) = self.jobs.get_mut(key) else {
                return;
            };
            let Some(&next) = entry.queued.front() else {
                return;
            };
            // The limit of the job's version the run was made with.
            if entry.active.len() as u32 >= self.runs[&next].job.spec.max_active() {
                return;
            }
            entry.queued.pop_front();
            self.writes.push(Write::RunState {
                run: next,
                from: RunState::Pending,
                to: RunState::Running,
                at: now,
            });
            self.begin(next, now);
        }
    }

    /// Stops a run: pending work is cancelled, running attempts are told to stop.
    pub(super) fn stop_run(&mut self, id: RunId, final_state: RunState, now: Timestamp) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        match run.state {
            RunState::Pending => {
                self.writes.push(Write::RunState {
                    run: id,
                    from: RunState::Pending,
                    to: RunState::Cancelled,
                    at: now,
                });
                let key = run.key.clone();
                self.runs.remove(&id);
                if let Some(e) = self.jobs.get_mut(&key) {
                    e.queued.retain(|r| *r != id);
                }
                return;
            }
            RunState::Running => {}
            _ => return,
        }
        if run.closing.is_none() {
            // Durable before it is acknowledged: after a crash, the run's
            // lost attempts are not retried.
            self.writes.push(Write::RunClosing {
                run: id,
                to: final_state,
            });
        }
        run.closing = Some(final_state);
        for i in 0..run.tasks.len() {
            let from = run.tasks[i];
            match from {
                TaskState::Pending | TaskState::Ready | TaskState::Retrying => {
                    run.tasks[i] = TaskState::Cancelled;
                    self.writes.push(Write::TaskState {
                        run: id,
                        task: run.job.tasks[i].id.clone(),
                        from,
                        to: TaskState::Cancelled,
                    });
                }
                TaskState::Running | TaskState::Dispatching => {
                    if let Some(number) = self.shared.remove(&(id, i)) {
                        // Handed to the cluster: withdraw it, claimed or not
                        // (one of each pair of changes applies); the node
                        // running it sees that and stops it.
                        let task = run.job.tasks[i].id.clone();
                        for from in [AttemptState::Dispatching, AttemptState::Running] {
                            self.writes.push(Write::AttemptEnd {
                                run: id,
                                task: task.clone(),
                                number,
                                from,
                                to: AttemptState::Cancelled,
                                at: now,
                                exit_code: None,
                                error: Some("the run was stopped".into()),
                                log: vec![],
                                start_error_us: None,
                            });
                        }
                        for from in [TaskState::Dispatching, TaskState::Running] {
                            self.writes.push(Write::TaskState {
                                run: id,
                                task: task.clone(),
                                from,
                                to: TaskState::Cancelled,
                            });
                        }
                        run.tasks[i] = TaskState::Cancelled;
                    } else if let Some(t) = &run.tokens[i] {
                        t.cancel();
                    }
                }
                _ => {}
            }
        }
        self.advance(id, now);
    }

    /// Task `i`'s attempt `number` ended (its attempt row is written): move
    /// the task on by the outcome, then the run.
    pub(super) fn task_ended(
        &mut self,
        id: RunId,
        i: usize,
        number: u32,
        ending: Ending,
        at: Timestamp,
    ) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let task = run.job.tasks[i].id.clone();
        match ending {
            Ending::Succeeded => {
                run.tasks[i] = TaskState::Succeeded;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from: TaskState::Running,
                    to: TaskState::Succeeded,
                });
            }
            Ending::Cancelled => {
                run.tasks[i] = TaskState::Cancelled;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from: TaskState::Running,
                    to: TaskState::Cancelled,
                });
            }
            Ending::Failed(failure) => {
                self.attempt_failed(id, i, number, TaskState::Running, failure, at)
            }
            Ending::TimedOut => {
                self.attempt_failed(id, i, number, TaskState::Running, Failure::Timeout, at)
            }
        }
        self.advance(id, at);
    }

    /// Retry or give up after attempt `number` of task `i` failed.
    pub(super) fn attempt_failed(
        &mut self,
        id: RunId,
        i: usize,
        number: u32,
        from: TaskState,
        failure: Failure,
        now: Timestamp,
    ) {
        let rand = self.random();
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let spec = &run.job.tasks[i];
        let task = spec.id.clone();
        let decision = if failure == Failure::Lost && run.job.spec.delivery == Delivery::AtMostOnce
        {
            RetryDecision::GiveUp("at-most-once delivery")
        } else if run.closing.is_some() {
            RetryDecision::GiveUp("the run is stopping")
        } else {
            spec.retry.decide(number, &failure, rand)
        };
        match decision {
            RetryDecision::Retry(delay) => {
                run.tasks[i] = TaskState::Retrying;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from,
                    to: TaskState::Retrying,
                });
                let at = now
                    .checked_add(SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX))
                    .unwrap_or(Timestamp::MAX);
                self.arm(at, Timer::Retry { run: id, task: i });
            }
            RetryDecision::GiveUp(_) => {
                run.tasks[i] = TaskState::Failed;
                self.writes.push(Write::TaskState {
                    run: id,
                    task,
                    from,
                    to: TaskState::Failed,
                });
            }
        }
    }
}
