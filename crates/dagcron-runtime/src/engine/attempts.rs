//! Attempts: ready tasks handed to this process's pool, to remote agents
//! or to the cluster, and their outcomes taken in.

use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn spawn(&mut self, run_id: RunId, slot: usize, number: u32) {
        let Some(run) = self.runs.table.get(&run_id) else {
            return;
        };
        let start_at = run.start_at.filter(|at| *at > self.clock.now());
        let spec = run.machine.task_of(slot);
        let task = &run.job.tasks[spec];
        if task.executor == dagcron_core::Executor::Noop && start_at.is_none() {
            // Nothing to run, so no context to make: reported at once.
            let lane = Lane::of(task);
            self.dispatch.started += 1;
            self.noop_done(run_id, slot, number, lane);
            return;
        }
        let task_id = run.task_id(slot);
        let ctx = AttemptContext {
            namespace: run.key.0.clone(),
            job: run.key.1.clone(),
            run_id,
            idempotency_key: AttemptContext::idempotency_key_for(
                &run.key.0, &run.key.1, run_id, &task_id,
            ),
            attempt: number,
            scheduled_at: run.scheduled_at,
            params: run.params.clone(),
            outputs: upstream_outputs(&run.job, spec, |j| run.outputs[j].clone()),
            secrets: Default::default(),
            trace: run
                .trace
                .as_ref()
                .and_then(|t| t.for_task(&task_id, number, self.config.tracing.is_some())),
            item: run
                .item(slot)
                .map(|(index, item)| (index, dagcron_core::fan_out::item_text(item))),
            task_id,
            policy: None,
        };
        let token = run.tokens[slot]
            .clone()
            .unwrap_or_else(|| self.life.kill_switch.child_token());
        let job = run.job.clone();
        self.launch(&job, spec, slot, ctx, token, start_at);
    }

    /// A no-op attempt has ended, having nothing to run.
    fn noop_done(&mut self, run: RunId, task: usize, number: u32, lane: Lane) {
        let outcome = Outcome {
            outputs: Default::default(),
            ending: Ending::Succeeded,
            exit_code: None,
            error: None,
            log: vec![],
            lines: Vec::new(),
            start_error_us: None,
        };
        let _ = self.life.finished_tx.send(Finished {
            run,
            task,
            number,
            outcome,
            at: self.clock.now(),
            lane,
            agent: None,
            live: None,
        });
    }

    /// Runs attempt `ctx` of task `spec` of `job` in the pool, or on a
    /// remote agent; its outcome comes back as a [`Finished`] of `slot`.
    /// With `start_at`, it starts at that instant (a remote agent is sent
    /// it ahead).
    pub(super) fn launch(
        &mut self,
        job: &Job,
        spec: usize,
        slot: usize,
        ctx: AttemptContext,
        token: CancellationToken,
        start_at: Option<Timestamp>,
    ) {
        let spec = &job.tasks[spec];
        let (run_id, number) = (ctx.run_id, ctx.attempt);
        self.dispatch.started += 1;
        let lane = Lane::of(spec);
        if spec.executor == dagcron_core::Executor::Noop && start_at.is_none() {
            // Nothing to run: report at once, without a task.
            self.noop_done(run_id, slot, number, lane);
            return;
        }
        let executor = spec.executor.clone();
        let timeout = spec.timeout.map(|d| d.0);
        let tx = self.life.finished_tx.clone();
        let clock = self.clock.clone();
        let limits = Limits {
            max_output: self.config.max_output,
        };
        let live = dagcron_exec::LiveLog::new(limits.max_output);
        let key = (ctx.run_id, ctx.task_id.clone(), ctx.attempt);
        self.dispatch
            .live
            .lock()
            .expect("live logs lock")
            .insert(key.clone(), live.clone());
        // The outcome goes back to the engine; the live log stays readable
        // until the end (and the stored log) is committed.
        let finish = move |outcome, agent| {
            let _ = tx.send(Finished {
                run: run_id,
                task: slot,
                number,
                outcome,
                at: clock.now(),
                lane,
                agent,
                live: Some(key),
            });
        };
        if let Some(run_on) = &spec.run_on {
            let followed = live.clone();
            let report = move |outcome, agent| {
                followed.finish();
                finish(outcome, agent);
            };
            let Some(remote) = self.config.remote.clone() else {
                report(failed("this server takes no remote agents".into()), None);
                return;
            };
            let mut task = RemoteTask {
                ctx,
                executor,
                timeout,
                start_at,
                labels: run_on.labels.clone(),
                max_output: limits.max_output,
                cancel: token,
                live: Some(live),
                priority: spec.priority,
                ready_us: self.clock.now().as_microsecond(),
                report: Box::new(report),
            };
            if task.executor.secret_refs().is_empty() && self.config.policies.is_none() {
                remote.0.submit(task);
                return;
            }
            // The policy and the secrets are read beside the loop, then the
            // assignment goes with the secrets.
            let secrets = self.config.secrets.clone();
            let policies = self.config.policies.clone();
            let spec = spec.clone();
            tokio::spawn(async move {
                if let Err(error) = allowed(policies.as_ref(), &task.ctx.namespace, &spec).await {
                    (task.report)(failed(error), None);
                    return;
                }
                match resolve_secrets(secrets.as_ref(), &task.ctx.namespace, &task.executor).await {
                    Ok(values) => {
                        task.ctx.secrets = values;
                        remote.0.submit(task);
                    }
                    Err(error) => (task.report)(failed(error), None),
                }
            });
            return;
        }
        let attempt_clock = self.clock.clone();
        let secrets = self.config.secrets.clone();
        let policies = self.config.policies.clone();
        let spec = spec.clone();
        let mut ctx = ctx;
        self.life.attempts.spawn(async move {
            // A panic in an executor must not leave the attempt running forever.
            let work = tokio::spawn(async move {
                match allowed(policies.as_ref(), &ctx.namespace, &spec).await {
                    Ok(policy) => ctx.policy = policy,
                    Err(error) => {
                        live.finish();
                        return failed(error);
                    }
                }
                match resolve_secrets(secrets.as_ref(), &ctx.namespace, &executor).await {
                    Ok(values) => ctx.secrets = values,
                    Err(error) => {
                        live.finish();
                        return failed(error);
                    }
                }
                let mut start_error_us = None;
                if let Some(at) = start_at {
                    attempt_clock.sleep_until(at).await;
                    let late = attempt_clock.now().duration_since(at).as_micros();
                    start_error_us = Some(i64::try_from(late).unwrap_or(i64::MAX));
                }
                let mut outcome =
                    dagcron_exec::run_live(&executor, &ctx, timeout, token, limits, Some(&live))
                        .await;
                outcome.start_error_us = start_error_us;
                outcome
            });
            let outcome = work
                .await
                .unwrap_or_else(|e| failed(format!("the executor failed: {e}")));
            finish(outcome, None);
        });
    }

    /// Starts ready tasks: every one for a remote agent (the agent pool
    /// queues them fairly until an agent has room), every no-op one (it
    /// takes no slot), and local ones while the pool has room. A cluster
    /// node whose pool is full hands local tasks to the cluster (a bounded
    /// number) for any other node with room, if there is another node.
    pub(super) fn dispatch(&mut self) {
        while let Some((id, i)) = self.dispatch.ready.remote.pop_front() {
            self.dispatch_task(id, i, true);
        }
        while let Some((id, i)) = self.dispatch.ready.free.pop_front() {
            self.dispatch_task(id, i, true);
        }
        let peers = self
            .config
            .node
            .as_ref()
            .is_some_and(|n| n.peers.load(std::sync::atomic::Ordering::Relaxed));
        loop {
            let here = match self.dispatch.placement(
                self.config.pool_size,
                peers,
                self.cluster.shared.len(),
            ) {
                dispatch::Placement::Here => true,
                dispatch::Placement::Cluster => false,
                dispatch::Placement::Wait => break,
            };
            let policies = &self.config.policies;
            let weight = |ns: &str| policies.as_ref().map_or(1, |p| p.0.weight(ns));
            let Some((id, i)) = self.dispatch.ready.local.pop_front(weight) else {
                break;
            };
            self.dispatch_task(id, i, here);
        }
    }

    /// Starts an attempt of ready task `i` of run `id`: here if `here`,
    /// otherwise by handing it to the cluster.
    pub(super) fn dispatch_task(&mut self, id: RunId, i: usize, here: bool) {
        let Some(run) = self.runs.table.get(&id) else {
            return;
        };
        // A task for a remote agent goes to the cluster when no agent here
        // could run it (an agent may be connected to any node); the node
        // that claims it must have an agent with its labels.
        let needs = run.spec(i).run_on.as_ref().map(|r| &r.labels);
        let instance = run.item(i).is_some();
        let elsewhere = self.config.node.is_some()
            && match (needs, &self.config.remote) {
                (Some(labels), Some(remote)) if instance => {
                    !remote.0.serves_instances(&run.key.0, labels)
                }
                (Some(labels), Some(remote)) => !remote.0.serves(&run.key.0, labels),
                _ => false,
            };
        let shared = !here || elsewhere;
        self.step(
            id,
            Event::Dispatch { task: i, shared },
            self.clock.now(),
            None,
        );
    }

    /// Attempt `number` of task `i` of run `id` is decided: handed to the
    /// cluster (`dispatching`), or started here once recorded (`running`).
    pub(super) fn attempt_started(
        &mut self,
        id: RunId,
        job: &Job,
        i: usize,
        number: u32,
        state: AttemptState,
        now: Timestamp,
    ) {
        let run = &self.runs.table[&id];
        let task = run.task_id(i);
        let spec = &job.tasks[run.machine.task_of(i)];
        let needs = spec.run_on.as_ref().map(|r| &r.labels);
        if state == AttemptState::Dispatching {
            self.batch.writes.push(Write::AttemptStart {
                run: id,
                task,
                number,
                state,
                at: now,
                run_on: needs.cloned(),
                priority: spec.priority,
            });
            self.cluster.shared.insert((id, i), number);
            return;
        }
        let run = self.runs.table.get_mut(&id).expect("run");
        run.tokens[i] = Some(self.life.kill_switch.child_token());
        // An attempt of a run made ahead starts at the run's instant.
        let starts = run.start_at.filter(|t| *t > now).unwrap_or(now);
        let times = &mut run.times[i];
        times.started = Some(starts);
        if let (Some(m), Some(ready)) = (&self.config.metrics, times.ready) {
            m.queue_wait(&run.key, starts.duration_since(ready).as_secs_f64());
        }
        let write = self.batch.writes.len();
        self.batch.writes.push(Write::AttemptStart {
            priority: spec.priority,
            run: id,
            task,
            number,
            state,
            at: starts,
            run_on: None,
        });
        let lane = Lane::of(spec);
        self.batch.effects.push(Action::Spawn {
            run: id,
            task: i,
            number,
            write,
            lane,
        });
        *self.dispatch.lane(lane) += 1;
    }

    pub(super) fn on_finished(&mut self, mut done: Finished) {
        if let Some(key) = done.live.take() {
            // A reader finds the output in the store once this batch is in.
            let lives = self.dispatch.live.clone();
            self.after_commit(move || {
                lives.lock().expect("live logs lock").remove(&key);
            });
        }
        *self.dispatch.lane(done.lane) -= 1;
        self.dispatch.started -= 1;
        if let Some(o) = &self.config.observer {
            (o.0)(EngineEvent::AttemptFinished);
        }
        let Finished {
            run: id,
            task: i,
            number,
            outcome,
            at,
            agent,
            ..
        } = done;
        let outcome = self.within_reserve(outcome);
        if let Some(foreign) = self.cluster.foreign.remove(&(id, i)) {
            if foreign.withdrawn {
                // Its end is recorded already (cancelled by the withdrawal).
                return;
            }
            // Run for another node: record the result; the run's owner
            // decides what follows. A stale result is refused by the store.
            let outcome = within_run(outcome, foreign.outputs_held);
            let to = end_of(outcome.ending.clone(), &foreign.skip_on_exit_code).attempt_state();
            if let Some(m) = &self.config.metrics {
                m.attempt_ended(&foreign.key, foreign.executor, to);
            }
            if let (Some(tracing), Some(trace)) = (&self.config.tracing, &foreign.trace) {
                let ended = crate::trace::AttemptEnded {
                    trace: trace.clone(),
                    key: foreign.key.clone(),
                    run: id,
                    scheduled_at: foreign.scheduled_at,
                    task: foreign.task.clone(),
                    executor: foreign.executor,
                    number: foreign.number,
                    ready: None,
                    start: foreign.started,
                    end: at,
                    state: to,
                    error: outcome.error.clone(),
                    agent,
                };
                spans::attempt(tracing, ended);
            }
            self.batch.writes.push(Write::AttemptEnd {
                run: id,
                task: foreign.task,
                number: foreign.number,
                from: AttemptState::Running,
                to,
                at,
                exit_code: outcome.exit_code,
                error: outcome.error,
                log: outcome.log,
                lines: dagcron_core::log::encode(&outcome.lines),
                start_error_us: outcome.start_error_us,
                outputs: outcome.outputs,
                for_other_node: true,
            });
            return;
        }
        let Some(run) = self.runs.table.get_mut(&id) else {
            return;
        };
        run.tokens[i] = None;
        run.times[i].agent = agent;
        if self.life.killing {
            // Killed at shutdown: lost, and its task left for the recovery
            // after the restart (retried or failed by the delivery policy).
            let outcome = Outcome {
                error: Some("the server shut down before the attempt ended; it was killed".into()),
                ..outcome
            };
            self.step(id, Event::Abandoned { task: i, number }, at, Some(outcome));
            return;
        }
        let outcome = within_run(outcome, outputs_held(run, i));
        let end = end_of(outcome.ending.clone(), &run.spec(i).skip_on_exit_code);
        let event = Event::AttemptEnded {
            task: i,
            number,
            end,
            recorded: false,
        };
        self.step(id, event, at, Some(outcome));
    }
}

impl<S: Store> Engine<S> {
    /// `outcome`, or, when its output would leave the disk of the data
    /// less free space than its reserve, `outcome` with a note in place of
    /// its output: output is dropped before it fills the disk.
    fn within_reserve(&self, mut outcome: Outcome) -> Outcome {
        let Some(reserve) = &self.config.output_reserve else {
            return outcome;
        };
        let size = outcome.log.len() as u64;
        if size == 0 || reserve.room_for(size) {
            return outcome;
        }
        tracing::warn!(
            "{size} bytes of an attempt's output dropped: the disk of {} has less than {} MiB free",
            reserve.dir.display(),
            reserve.bytes >> 20
        );
        if let Some(m) = &self.config.metrics {
            m.output_dropped(size);
        }
        outcome.log = format!(
            "[dagcron: {size} bytes of output dropped: the server's disk has less than {} MiB free]\n",
            reserve.bytes >> 20
        )
        .into_bytes();
        outcome.lines.clear();
        outcome
    }
}

/// The free space an attempt's output may never take: output that would
/// leave less than `bytes` free on the file system of `dir` is dropped.
#[derive(Clone, Debug)]
pub struct OutputReserve {
    /// A directory on the file system that holds the data.
    pub dir: std::path::PathBuf,
    /// The space kept free, in bytes.
    pub bytes: u64,
}

impl OutputReserve {
    /// Whether `size` more bytes leave the reserve free (yes when the
    /// free space cannot be read).
    fn room_for(&self, size: u64) -> bool {
        match nix::sys::statvfs::statvfs(&self.dir) {
            Ok(fs) => {
                let free = fs.blocks_available().saturating_mul(fs.fragment_size());
                free >= self.bytes.saturating_add(size)
            }
            Err(_) => true,
        }
    }
}

/// The outputs task `task` of `job` gets: those of the tasks it reads
/// (see [`dagcron_core::Task::reads`]) that have some, by task id.
pub(super) fn upstream_outputs(
    job: &Job,
    task: usize,
    of: impl Fn(usize) -> Option<Arc<dagcron_core::outputs::Outputs>>,
) -> std::collections::BTreeMap<String, Arc<dagcron_core::outputs::Outputs>> {
    job.tasks[task]
        .reads
        .iter()
        .filter_map(|&j| Some((job.tasks[j].id.clone(), of(j)?)))
        .collect()
}
