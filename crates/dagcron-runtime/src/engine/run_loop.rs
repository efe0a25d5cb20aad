//! The engine's loop: start-up, the select over timers, attempts, commands
//! and commits, the pipelined commit (decide into the next batch while one
//! commits; act only once a batch is committed), and the bounded drain.

use super::*;

/// The engine's lifecycle part: the loop's channels and its stop signals.
pub(super) struct Life {
    pub(super) finished_tx: mpsc::UnboundedSender<Finished>,
    pub(super) finished_rx: mpsc::UnboundedReceiver<Finished>,
    pub(super) commands: Option<mpsc::Receiver<Command>>,
    /// For work done beside the loop to report back as a command.
    pub(super) commands_back: mpsc::WeakSender<Command>,
    /// Set once shutdown kills the attempts still running: their ends are
    /// recorded as lost, and nothing follows from them.
    pub(super) killing: bool,
    /// The parent of every attempt's cancellation token: cancelled, it
    /// stops every attempt this engine runs, whatever the loop is doing.
    pub(super) kill_switch: CancellationToken,
    /// Cancelled when the loop is asked to stop: a commit waiting for room
    /// gives up then.
    pub(super) stopping: CancellationToken,
    /// The attempt tasks of the pool: waited for once they are killed.
    pub(super) attempts: tokio_util::task::TaskTracker,
    /// Cancelled when `run` returns (stops the lease watchdog).
    pub(super) done: CancellationToken,
}

impl<S: Store> Engine<S> {
    /// Loads jobs and unfinished runs from the store, records missed fires,
    /// and returns the engine and a handle to it. Call [`Engine::run`] next.
    pub async fn start(
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<(Engine<S>, EngineHandle), StorageError> {
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::channel(1024);
        let now = clock.now();
        let mut engine = Engine {
            store: store.clone(),
            clock,
            config,
            jobs: jobs::Jobs::default(),
            runs: runs::Runs::after(store.max_run_id().await?),
            dispatch: dispatch::Dispatch::default(),
            cluster: shared::Cluster::default(),
            timers: timers::Timers::at(now),
            batch: commits::Batch::default(),
            life: Life {
                finished_tx,
                finished_rx,
                commands: Some(rx),
                commands_back: tx.downgrade(),
                killing: false,
                kill_switch: CancellationToken::new(),
                // Until the loop runs, a commit that finds no room gives up at
                // once: a server that starts on a full disk stops and says why.
                stopping: {
                    let stopping = CancellationToken::new();
                    stopping.cancel();
                    stopping
                },
                attempts: tokio_util::task::TaskTracker::new(),
                done: CancellationToken::new(),
            },
            rng: Rng((now.as_nanosecond() as u64) | 1),
        };
        engine.recover(now).await?;
        let live = engine.dispatch.live.clone();
        let fenced = CancellationToken::new();
        if let Some(node) = &engine.config.node {
            tokio::spawn(lease_watchdog(
                node.lease.clone(),
                engine.clock.clone(),
                engine.life.kill_switch.clone(),
                engine.life.attempts.clone(),
                engine.life.done.clone(),
                fenced.clone(),
            ));
        }
        let handle = EngineHandle {
            nats: engine.jobs.nats.0.subscribe(),
            tx,
            live,
            fenced,
            write_health: engine.config.write_health.clone(),
        };
        Ok((engine, handle))
    }

    /// Runs the engine until `shutdown` is cancelled, then waits up to
    /// `drain` for running attempts. Attempts still running after that are
    /// recovered as lost on the next start.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
        drain: Duration,
    ) -> Result<(), StorageError> {
        let _done = self.life.done.clone().drop_guard();
        let result = self.run_loop(shutdown, drain).await;
        if let Err(e) = &result {
            // Fenced or the store is gone: nothing this engine started may go
            // on running, since another node may take its runs over. Kill
            // the attempts and wait (briefly) until they are gone.
            tracing::error!(
                "the engine stops: {e}; killing {} running attempts",
                self.dispatch.started
            );
            self.cancel_all();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while self.dispatch.started > 0 {
                match tokio::time::timeout_at(deadline, self.life.finished_rx.recv()).await {
                    Ok(Some(_)) => self.dispatch.started -= 1,
                    _ => break,
                }
            }
        }
        result
    }

    pub(super) async fn run_loop(
        &mut self,
        shutdown: CancellationToken,
        drain: Duration,
    ) -> Result<(), StorageError> {
        let mut commands = self.life.commands.take().expect("run is called once");
        self.life.stopping = shutdown.clone();
        self.dispatch();
        self.flush().await?;
        // Commits are pipelined: while batches are being committed, the
        // loop keeps deciding (timers stay on time) into the next batch; a
        // batch's effects are carried out only when its commit is done, in
        // the order the batches were made (see `commits`).
        let mut commits = commits::Commits::new(self.store.write_lanes());
        loop {
            let next = self.timers.queue.next_at();
            let warm = self.warm_up_at(next);
            let sleep = match warm.or(next) {
                Some(at) => self.clock.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            let mut committed = None;
            // A cluster node wakes when its lease would end, to stop in time
            // if it was not renewed, and at once if it is revoked.
            let (lease_end, revoked) = match &self.config.node {
                Some(node) => (
                    self.clock.sleep_until(node.lease.end()),
                    node.lease.0.revoked.clone(),
                ),
                None => (
                    Box::pin(std::future::pending())
                        as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
                    CancellationToken::new(),
                ),
            };
            tokio::select! {
                biased;
                () = revoked.cancelled() => self.check_lease()?,
                () = shutdown.cancelled() => break,
                done = commits.next(), if !commits.is_empty() => committed = Some(done),
                Some(done) = self.life.finished_rx.recv() => {
                    self.on_finished(done);
                    while let Ok(done) = self.life.finished_rx.try_recv() {
                        self.on_finished(done);
                    }
                }
                Some(cmd) = commands.recv(), if self.jobs.installing.is_none() => {
                    self.on_command(cmd);
                    while self.jobs.installing.is_none() {
                        let Ok(cmd) = commands.try_recv() else { break };
                        self.on_command(cmd);
                    }
                }
                () = sleep => match warm.and(next) {
                    Some(at) => self.warm_up(at),
                    None => self.on_timers(),
                },
                // After the timers due, before the next command.
                () = std::future::ready(()), if self.jobs.installing.is_some() => {
                    let now = self.clock.now();
                    self.install_some(now);
                }
                () = lease_end => self.check_lease()?,
            }
            if let Some((writes, results, effects)) = committed {
                let results = results?;
                self.check_lease()?;
                self.committed(&writes, &results, effects);
                if commits.is_empty() && self.batch.writes.is_empty() {
                    // No write of a dropped run is left anywhere.
                    self.runs.dropped.clear();
                }
            }
            self.dispatch();
            if !(self.batch.writes.is_empty() && self.batch.effects.is_empty())
                && let Some(keys) = commits.may_send(&self.batch.writes)
            {
                self.check_lease()?;
                let writes = Arc::new(std::mem::take(&mut self.batch.writes));
                let effects = std::mem::take(&mut self.batch.effects);
                commits.send(self.commit(writes), effects, keys);
            }
        }
        while !commits.is_empty() {
            let (writes, results, effects) = commits.next().await;
            self.committed(&writes, &results?, effects);
        }
        // Graceful shutdown: no new fires or attempts; let running attempts finish.
        let deadline = tokio::time::Instant::now() + drain;
        while self.dispatch.in_flight() > 0 {
            match tokio::time::timeout_at(deadline, self.life.finished_rx.recv()).await {
                Ok(Some(done)) => {
                    self.on_finished(done);
                    self.dispatch.ready = ReadyQueues::default();
                    self.flush().await?;
                }
                _ => break,
            }
        }
        if self.dispatch.in_flight() > 0 {
            // Nothing may outlive the server: a task left running would run
            // again beside its retry after the restart. Kill every attempt,
            // wait for it to be gone, and record it as lost (the delivery
            // policy decides after the restart).
            tracing::warn!(
                "{} attempts still running at the end of the shutdown grace; killing them",
                self.dispatch.in_flight()
            );
            self.life.killing = true;
            self.cancel_all();
            let deadline =
                tokio::time::Instant::now() + dagcron_exec::PIPE_GRACE + Duration::from_secs(3);
            while self.dispatch.in_flight() > 0 {
                match tokio::time::timeout_at(deadline, self.life.finished_rx.recv()).await {
                    Ok(Some(done)) => self.on_finished(done),
                    _ => break,
                }
            }
            self.flush().await?;
            if self.dispatch.in_flight() > 0 {
                tracing::error!(
                    "{} attempts did not report after being killed; they will be recovered as lost",
                    self.dispatch.in_flight()
                );
            }
        }
        Ok(())
    }

    /// Tells every attempt this engine runs (for itself or for other nodes) to stop.
    pub(super) fn cancel_all(&self) {
        for run in self.runs.table.values() {
            for token in run.tokens.iter().flatten() {
                token.cancel();
            }
        }
        for foreign in self.cluster.foreign.values() {
            foreign.token.cancel();
        }
    }

    /// Refuses to go on once this node's lease has ended.
    pub(super) fn check_lease(&self) -> Result<(), StorageError> {
        if self.lease_valid() {
            Ok(())
        } else {
            Err(StorageError::Fenced(
                "this node's lease ended before it could renew it".into(),
            ))
        }
    }

    /// Commits the batch, then carries out its effects.
    pub(super) async fn flush(&mut self) -> Result<(), StorageError> {
        self.check_lease()?;
        let writes = Arc::new(std::mem::take(&mut self.batch.writes));
        let results = commit_with_retries(
            &*self.store,
            &writes,
            self.config.metrics.as_deref(),
            &self.config.write_health,
            &self.life.stopping,
        )
        .await?;
        self.check_lease()?;
        let effects = std::mem::take(&mut self.batch.effects);
        self.committed(&writes, &results, effects);
        Ok(())
    }

    /// Commits a batch on a task of its own, so that the loop goes on
    /// deciding while the store encodes and sends it.
    fn commit(&self, writes: Arc<Vec<Write>>) -> Commit {
        let store = self.store.clone();
        let metrics = self.config.metrics.clone();
        let health = self.config.write_health.clone();
        let stopping = self.life.stopping.clone();
        let batch = writes.clone();
        let task = tokio::spawn(async move {
            commit_with_retries(&*store, &batch, metrics.as_deref(), &health, &stopping).await
        });
        Box::pin(async move {
            let results = match task.await {
                Ok(results) => results,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(StorageError::Unavailable(format!(
                    "the commit was stopped: {e}"
                ))),
            };
            (writes, results)
        })
    }

    /// A batch is committed: report refusals, then carry out its effects.
    pub(super) fn committed(
        &mut self,
        writes: &[Write],
        results: &[WriteResult],
        effects: Vec<Action>,
    ) {
        let now = self.clock.now();
        for (w, r) in writes.iter().zip(results) {
            match (w, r) {
                (Write::Breaker(b), WriteResult::Done) => {
                    let key = (b.namespace.clone(), b.job.clone());
                    if let Some(entry) = self.jobs.table.get_mut(&key) {
                        entry.breaker_open = b.open.is_some();
                    }
                    match b.opened() {
                        Some(open) => {
                            tracing::warn!(namespace = %b.namespace, job = %b.job, "{}", open.reason())
                        }
                        None => {
                            tracing::info!(namespace = %b.namespace, job = %b.job, "the failure breaker closed")
                        }
                    }
                }
                (_, WriteResult::Done) => {}
                // Not yet as many failures in a row, or no change; an SLA
                // miss judged again (after a restart) is recorded once.
                (Write::Breaker(_) | Write::SlaMissed { .. }, refusal) => {
                    tracing::debug!("{}", refusal.reason())
                }
                // A fire already in the ledger (after a crash between commit
                // and arming, or made by another node first in a takeover)
                // or refused as early: its run was never stored, and must
                // not hold a place of its job.
                (
                    Write::Fire {
                        namespace,
                        job,
                        scheduled_at,
                        run,
                        ..
                    },
                    refusal,
                ) => {
                    if let Some(run) = run {
                        self.forget_run(run.id, now);
                        // Its other writes, in this batch or the next one,
                        // are refused too: that is no bug.
                        if self.runs.dropped.len() < MAX_DROPPED {
                            self.runs.dropped.insert(run.id);
                        }
                    }
                    if let WriteResult::Early(why) = refusal {
                        tracing::warn!("{why}; made again a little later");
                        if let Some(m) = &self.config.metrics {
                            m.early_fire_refused();
                        }
                        self.refire(namespace, job, *scheduled_at, now);
                    } else {
                        tracing::info!("{}", refusal.reason());
                    }
                }
                // A run whose job has a run of its key already: never
                // stored, it holds no place of its job.
                (Write::Run(run), refusal) if run.key.is_some() => {
                    self.forget_run(run.id, now);
                    if self.runs.dropped.len() < MAX_DROPPED {
                        self.runs.dropped.insert(run.id);
                    }
                    tracing::info!("{}", refusal.reason());
                }
                (w, refusal) if w.run_id().is_some_and(|id| self.runs.dropped.contains(&id)) => {
                    tracing::debug!(
                        "write of a run whose fire was refused: {}",
                        refusal.reason()
                    );
                }
                // Anything else is a bug.
                (_, refusal) => tracing::error!("refused state change: {}", refusal.reason()),
            }
        }
        for effect in effects {
            match effect {
                Action::Spawn {
                    run,
                    task,
                    number,
                    write,
                    lane,
                } => {
                    let known = self.runs.table.contains_key(&run);
                    if known && results.get(write) == Some(&WriteResult::Done) {
                        self.spawn(run, task, number);
                    } else {
                        if known {
                            // Only a second engine acting on the same run
                            // could cause this; fencing is meant to make it
                            // impossible. (A run dropped because its fire was
                            // refused has nothing to start.)
                            tracing::error!(
                                run,
                                task,
                                number,
                                "attempt not recorded; not starting it"
                            );
                        }
                        *self.dispatch.lane(lane) -= 1;
                    }
                }
                Action::Kill(token) => token.cancel(),
                Action::Then(f) => f(),
                Action::IfDone { write, then } => {
                    then(results.get(write) == Some(&WriteResult::Done))
                }
            }
        }
    }

    /// Answers a caller once the current batch is committed.
    pub(super) fn reply_after_commit<T: Send + 'static>(
        &mut self,
        reply: Reply<T>,
        result: Result<T, EngineError>,
    ) {
        self.after_commit(move || {
            let _ = reply.send(result);
        });
    }

    /// Does `then` once the batch being decided is committed.
    pub(super) fn after_commit(&mut self, then: impl FnOnce() + Send + 'static) {
        self.batch.effects.push(Action::Then(Box::new(then)));
    }

    /// Whether this engine may still fire and write.
    pub(super) fn lease_valid(&self) -> bool {
        self.config
            .node
            .as_ref()
            .is_none_or(|n| n.lease.is_valid_at(self.clock.now()))
    }
}
