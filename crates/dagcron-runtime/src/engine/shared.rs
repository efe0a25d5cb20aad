//! Work shared across a cluster: attempts claimed from other nodes, the
//! outcome of this node's attempts others ran, and withdrawals.

use super::*;
use dagcron_core::run::recovery;
use jobs::read_version;

/// The engine's cluster part: this node's share of the cluster's work.
#[derive(Default)]
pub(super) struct Cluster {
    /// Which jobs this node owns (`None`: all jobs, or none yet in a cluster).
    pub(super) ownership: Option<Ownership>,
    /// Runs of this node's jobs running on other nodes, as the coordinator
    /// last read them (only jobs with some): they count against the job's
    /// overlap policy as this node's own runs do.
    pub(super) elsewhere: HashMap<JobKey, u32>,
    /// Attempts of this node's runs handed to the cluster when its pool was
    /// full, by (run, task): their number.
    pub(super) shared: HashMap<(RunId, usize), u32>,
    /// Attempts this node claimed and runs for other nodes, by (run, task).
    pub(super) foreign: HashMap<(RunId, usize), Foreign>,
}

impl<S: Store> Engine<S> {
    /// See [`EngineHandle::share_work`]: the store is asked beside the
    /// loop (the answers come back as [`Completion::Worked`]); the pool's room
    /// is held for the claims meanwhile.
    pub(super) fn share_work(&mut self, reply: Reply<()>) {
        if self.config.node.is_none() {
            let _ = reply.send(Ok(()));
            return;
        }
        let room = self
            .config
            .pool_size
            .saturating_sub(self.dispatch.running + self.dispatch.claiming);
        let room = if self.lease_valid() { room } else { 0 };
        let agents = match &self.config.remote {
            Some(remote) if room > 0 => remote.0.rooms(),
            _ => vec![],
        };
        self.dispatch.claiming += room;
        let asks_progress = !self.cluster.shared.is_empty();
        let foreign: Vec<AttemptKey> = self
            .cluster
            .foreign
            .iter()
            .map(|((run, _), f)| (*run, f.task.clone(), f.number))
            .collect();
        let store = self.store.clone();
        let now = self.clock.now();
        let work = async move {
            let mut news = SharedNews {
                room,
                ..SharedNews::default()
            };
            if room > 0 {
                let claims = store.claim_attempts(room, &agents, now).await?;
                // The jobs of the claims, read once each (a claim of this
                // node's own run, which is rare, uses its run's job instead).
                // The job as the claim's run has it: at the run's version.
                let mut jobs: HashMap<(JobKey, i64), Option<Arc<Job>>> = HashMap::new();
                for claim in claims {
                    let key = (claim.namespace.clone(), claim.job.clone());
                    let at = (key, claim.job_version);
                    let job = match jobs.get(&at) {
                        Some(job) => job.clone(),
                        None => {
                            let job = read_version(&*store, &at.0, at.1).await?;
                            jobs.insert(at, job.clone());
                            job
                        }
                    };
                    news.claims.push((claim, job));
                }
            }
            if asks_progress {
                news.progress = store.remote_attempts().await?;
            }
            if !foreign.is_empty() {
                news.withdrawn = store
                    .withdrawn_attempts(&foreign)
                    .await?
                    .into_iter()
                    .collect();
            }
            Ok(news)
        };
        self.beside(work, |news| Completion::Worked { news, reply });
    }

    /// The store's answers for the shared work (see [`Engine::share_work`]).
    pub(super) fn worked(
        &mut self,
        news: Result<SharedNews, StorageError>,
        reply: Reply<()>,
        now: Timestamp,
    ) {
        let news = match news {
            Ok(news) => news,
            Err(e) => {
                // Claims made before the failure stay claimed; the next
                // round of shared work finds them running nowhere (lost).
                self.dispatch.claiming = 0;
                let _ = reply.send(Err(EngineError::Storage(e)));
                return;
            }
        };
        self.dispatch.claiming = self.dispatch.claiming.saturating_sub(news.room);
        for (claim, job) in news.claims {
            let job = match self.runs.table.get(&claim.run) {
                Some(run) => Some(run.job.clone()),
                None => job,
            };
            self.take_claim(claim, job, now);
        }
        for remote in news.progress {
            self.remote_progress(remote, now);
        }
        for ((run, _), f) in &mut self.cluster.foreign {
            if news.withdrawn.contains(&(*run, f.task.clone(), f.number)) {
                tracing::info!(run, task = %f.task, number = f.number, "attempt withdrawn by its run's owner; stopping it");
                f.withdrawn = true;
                f.token.cancel();
            }
        }
        self.reply_after_commit(reply, Ok(()));
    }

    /// Starts an attempt claimed from the cluster: one of this node's own
    /// (its pool has room again), or one run for another node.
    pub(super) fn take_claim(
        &mut self,
        claim: ClaimedAttempt,
        job: Option<Arc<Job>>,
        now: Timestamp,
    ) {
        // Its slot is its place among the run's tasks; an instance runs its
        // mapped task, with its item.
        let found = job.and_then(|job| {
            let declared = match dagcron_core::fan_out::parse_instance(&claim.task) {
                Some((task, _)) if claim.item.is_some() && claim.position >= job.tasks.len() => {
                    task
                }
                Some(_) => return None,
                None => &claim.task,
            };
            let spec = job.tasks.iter().position(|t| t.id == declared)?;
            (spec == claim.position || declared != claim.task).then_some((job, spec))
        });
        let Some((job, spec)) = found else {
            // A claim is recorded running by the node that took it.
            let (from, to) = recovery::unplaceable_attempt(AttemptState::Running)
                .expect("a running attempt can fail");
            self.batch.writes.push(Write::AttemptEnd {
                outputs: Default::default(),
                run: claim.run,
                task: claim.task.clone(),
                number: claim.number,
                from,
                to,
                at: now,
                exit_code: None,
                error: Some(format!(
                    "job {}/{} or its task {} no longer exists",
                    claim.namespace, claim.job, claim.task
                )),
                log: vec![],
                lines: Vec::new(),
                start_error_us: None,
                for_other_node: !self.runs.table.contains_key(&claim.run),
            });
            return;
        };
        let own = self.runs.table.get(&claim.run);
        let i = own
            .and_then(|run| run.slot_of(&claim.task))
            .unwrap_or(claim.position);
        let token = self.life.kill_switch.child_token();
        *self.dispatch.lane(Lane::of(&job.tasks[spec])) += 1;
        if self.runs.table.contains_key(&claim.run) {
            // Handed over earlier, taken back now.
            self.cluster.shared.remove(&(claim.run, i));
            let claimed = Event::Claimed {
                task: i,
                number: claim.number,
                here: true,
            };
            self.step(claim.run, claimed, now, None);
            self.runs.table.get_mut(&claim.run).expect("run").tokens[i] = Some(token);
            self.spawn(claim.run, i, claim.number);
            return;
        }
        let scheduled_at = claim.scheduled_at;
        let key = Arc::new((claim.namespace.clone(), claim.job.clone()));
        let trace = self.trace_of(
            claim.run,
            &key,
            claim
                .trace
                .as_deref()
                .and_then(TraceParent::from_stored)
                .as_ref(),
        );
        let item = claim.item.as_ref().and_then(|item| {
            let (_, index) = dagcron_core::fan_out::parse_instance(&claim.task)?;
            Some((index, dagcron_core::fan_out::item_text(item)))
        });
        let ctx = AttemptContext {
            idempotency_key: AttemptContext::idempotency_key_for(
                &claim.namespace,
                &claim.job,
                claim.run,
                &claim.task,
            ),
            namespace: claim.namespace,
            job: claim.job,
            run_id: claim.run,
            task_id: claim.task.clone(),
            attempt: claim.number,
            scheduled_at: claim.scheduled_at,
            params: claim.params,
            outputs: attempts::upstream_outputs(&job, spec, |j| {
                claim.outputs.get(&job.tasks[j].id).cloned().map(Arc::new)
            }),
            item,
            secrets: Default::default(),
            trace: trace
                .as_ref()
                .and_then(|t| t.for_task(&claim.task, claim.number, self.config.tracing.is_some())),
            policy: None,
        };
        // A mapped task's outputs are its instances', counted there.
        let mapped = |id: &str| job.tasks.iter().any(|t| t.id == id && t.for_each.is_some());
        let outputs_held = claim
            .outputs
            .iter()
            .filter(|(task, _)| **task != claim.task && !mapped(task))
            .map(|(_, o)| dagcron_core::outputs::size(o))
            .sum();
        self.cluster.foreign.insert(
            (claim.run, i),
            Foreign {
                key,
                executor: job.tasks[spec].executor.kind(),
                trace,
                scheduled_at,
                started: now,
                task: claim.task,
                number: claim.number,
                skip_on_exit_code: job.tasks[spec].skip_on_exit_code.clone(),
                outputs_held,
                token: token.clone(),
                withdrawn: false,
            },
        );
        // An attempt of a run made ahead of its instant waits for it.
        let start_at = Some(scheduled_at).filter(|t| *t > now);
        self.launch(&job, spec, i, ctx, token, start_at);
    }

    /// News of an attempt of this node's that another node claimed.
    pub(super) fn remote_progress(&mut self, remote: RemoteAttempt, now: Timestamp) {
        let Some(run) = self.runs.table.get(&remote.run) else {
            return;
        };
        let Some(i) = run.slot_of(&remote.task) else {
            return;
        };
        if self.cluster.shared.get(&(remote.run, i)) != Some(&remote.number) {
            return;
        }
        let (id, number) = (remote.run, remote.number);
        let end = match remote.state {
            AttemptState::Dispatching => return,
            AttemptState::Running => {
                let claimed = Event::Claimed {
                    task: i,
                    number,
                    here: false,
                };
                if remote.executor_alive {
                    self.step(id, claimed, now, None);
                    return;
                }
                // Its node died: the attempt is lost.
                self.cluster.shared.remove(&(id, i));
                self.step(id, claimed, now, None);
                let lost_here = Event::AttemptEnded {
                    task: i,
                    number,
                    end: End::Failed(Failure::Lost),
                    recorded: false,
                };
                let outcome = lost("the node running this attempt stopped");
                self.step(id, lost_here, now, Some(outcome));
                return;
            }
            AttemptState::Lost => End::Failed(Failure::Lost),
            AttemptState::Succeeded => End::Succeeded,
            AttemptState::Skipped => End::Skipped,
            AttemptState::Cancelled => End::Cancelled,
            AttemptState::TimedOut => End::Failed(Failure::Timeout),
            AttemptState::Failed => End::Failed(match (&run.spec(i).executor, remote.exit_code) {
                (dagcron_core::Executor::Http(_), Some(code)) => {
                    Failure::HttpStatus(u16::try_from(code).unwrap_or(0))
                }
                (_, Some(code)) => Failure::Exit(Some(code)),
                (_, None) => Failure::Error(remote.error.clone().unwrap_or_default()),
            }),
        };
        self.cluster.shared.remove(&(id, i));
        if end == End::Succeeded {
            let run = self.runs.table.get_mut(&id).expect("run");
            run.outputs[i] = (!remote.outputs.is_empty()).then(|| Arc::new(remote.outputs));
        }
        let ended = Event::AttemptEnded {
            task: i,
            number,
            end,
            recorded: true,
        };
        self.step(id, ended, now, None);
    }
}
