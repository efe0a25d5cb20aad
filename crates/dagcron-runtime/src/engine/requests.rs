//! The requests the engine takes from the API, the coordinator and tests:
//! each decided at once, or sent beside the loop and finished by its
//! completion (`completions.rs`).

use super::commands::*;
use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn on_request(&mut self, request: Request) {
        let now = self.clock.now();
        match request {
            Request::Apply {
                jobs,
                origin,
                reply,
            } => {
                if let Some((namespace, path)) = self.jobs.after_cycle(&jobs) {
                    let _ = reply.send(Err(EngineError::Invalid(format!(
                        "jobs of namespace {namespace} would start after one another in a circle, and run forever: {}",
                        path.join(" → ")
                    ))));
                    return;
                }
                // Applying is committed on its own, beside the loop, before
                // the engine changes its timers. The specs are serialized
                // for the store, and the jobs made ready to install while
                // the store writes them, on a blocking thread: tens of
                // milliseconds for a large file, which must not hold up a
                // thread the loop may need to fire on time.
                let store = self.store.clone();
                let cache = self.jobs.timetables.clone();
                self.beside(
                    async move {
                        let prepare = tokio::task::spawn_blocking(move || {
                            let upserts: Vec<JobUpsert> = jobs
                                .iter()
                                .map(|job| JobUpsert {
                                    origin: origin.clone(),
                                    ..JobUpsert::of(job)
                                })
                                .collect();
                            let write =
                                tokio::spawn(
                                    async move { store.apply_jobs_owned(upserts, now).await },
                                );
                            // The cache locked for one job at a time: the
                            // loop may need it meanwhile.
                            let ready: Vec<Installable> = jobs
                                .into_iter()
                                .map(|job| Installable::of(job, &mut timetables(&cache)))
                                .collect();
                            (ready, write)
                        });
                        let (ready, write) = match prepare.await {
                            Ok(prepared) => prepared,
                            Err(e) => std::panic::resume_unwind(e.into_panic()),
                        };
                        let results = write.await.unwrap_or_else(|e| {
                            Err(StorageError::Unavailable(format!("applying jobs: {e}")))
                        });
                        (ready, results)
                    },
                    |(jobs, results)| Completion::Applied {
                        jobs,
                        results,
                        reply,
                    },
                );
            }
            Request::Delete {
                namespace,
                name,
                reply,
            } => {
                let store = self.store.clone();
                let key = (namespace, name);
                let (ns, name) = key.clone();
                self.beside(
                    async move { store.delete_job(&ns, &name).await },
                    |result| Completion::Deleted { key, result, reply },
                );
            }
            Request::Pause {
                namespace,
                name,
                paused,
                reply,
            } => {
                let store = self.store.clone();
                let key = (namespace, name);
                let (ns, name) = key.clone();
                let job = (!paused).then(|| self.job_of(&key));
                self.beside(
                    async move {
                        let found = store.set_paused(&ns, &name, paused).await?;
                        let job = match job {
                            Some(read) if found => read.await?,
                            _ => None,
                        };
                        Ok((found, job))
                    },
                    move |result| Completion::Paused {
                        key,
                        paused,
                        result,
                        reply,
                    },
                );
            }
            Request::Trigger {
                namespace,
                name,
                ask,
            } => {
                let key = (namespace, name);
                // A key is looked for in the store first: a trigger that
                // came before decides nothing again (no run replaced, no
                // slot taken).
                if let Some(k) = ask.by.key.clone().filter(|_| !ask.key_checked) {
                    let store = self.store.clone();
                    let (ns, job) = key.clone();
                    self.beside(
                        async move { store.run_of_key(&ns, &job, &k).await },
                        move |found| Completion::KeyChecked { key, ask, found },
                    );
                    return;
                }
                match self.jobs.table.get(&key).map(|e| e.job.clone()) {
                    Some(Some(job)) => self.trigger(key, job, ask, now),
                    None => self.unknown_job(
                        key.clone(),
                        Request::Trigger {
                            namespace: key.0,
                            name: key.1,
                            ask,
                        },
                    ),
                    Some(None) => {
                        // Not in memory: read beside the loop, once for
                        // all the triggers that come meanwhile.
                        let waiting = ask;
                        if let Some(queue) = self.jobs.loading.get_mut(&key) {
                            queue.push(waiting);
                            return;
                        }
                        self.jobs.loading.insert(key.clone(), vec![waiting]);
                        let read = self.job_of(&key);
                        self.beside(read, move |job| Completion::Loaded { key, job });
                    }
                }
            }
            Request::Backfill {
                namespace,
                name,
                from,
                to,
                reply,
            } => {
                let key = (namespace, name);
                if to <= from {
                    let _ = reply.send(Err(EngineError::Invalid(format!(
                        "`to` ({to}) must be after `from` ({from})"
                    ))));
                    return;
                }
                if let Err(e) = self.backlog_allows(&key.0, 1) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if !self.jobs.table.contains_key(&key) {
                    self.unknown_job(
                        key.clone(),
                        Request::Backfill {
                            namespace: key.0,
                            name: key.1,
                            from,
                            to,
                            reply,
                        },
                    );
                    return;
                }
                let read = self.job_of(&key);
                let Some(back) = self.life.commands_back.upgrade() else {
                    return;
                };
                // Listing the fires of a long range over many schedules takes
                // a while: it is done beside the loop, so no fire waits for it.
                let store = self.store.clone();
                let max = self.config.max_backfill;
                tokio::spawn(async move {
                    let job = match read.await {
                        Ok(Some(job)) => job,
                        Ok(None) => {
                            let _ = reply.send(Err(no_such_job(&key)));
                            return;
                        }
                        Err(e) => {
                            let _ = reply.send(Err(EngineError::Storage(e)));
                            return;
                        }
                    };
                    let fires = backfill_fires(&*store, &key, &job, from, to, max).await;
                    let _ = back
                        .send(Command::Done(Completion::Backfilled {
                            key,
                            job,
                            fires,
                            reply,
                        }))
                        .await;
                });
            }
            Request::Cancel { run, reply } => {
                if self.runs.table.contains_key(&run) {
                    self.stop(run, RunState::Cancelled, now);
                    self.reply_after_commit(reply, Ok(()));
                    return;
                }
                // Not run here: asked of its node through the store, beside
                // the loop (nothing here changes, so the answer goes straight back).
                let store = self.store.clone();
                tokio::spawn(async move {
                    let _ = reply.send(request_cancel(&*store, run).await);
                });
            }
            Request::Intervene {
                run,
                task,
                action,
                reply,
            } => {
                let Some(entry) = self.runs.table.get(&run) else {
                    // Not run here: asked of its node through the store.
                    let store = self.store.clone();
                    tokio::spawn(async move {
                        let _ = reply.send(request_intervention(&*store, run, &task, action).await);
                    });
                    return;
                };
                let Some(index) = entry.slot_of(&task) else {
                    let _ = reply.send(Err(no_such_task(run, &task)));
                    return;
                };
                if let Err(e) = entry.machine.may_intervene(index, action) {
                    let _ = reply.send(Err(refused(run, &task, action, e)));
                    return;
                }
                let key = &entry.key;
                tracing::info!(namespace = %key.0, job = %key.1, run, task = %task, "{} by an operator", action.as_str());
                self.step(
                    run,
                    Event::Intervene {
                        task: index,
                        action,
                    },
                    now,
                    None,
                );
                self.reply_after_commit(reply, Ok(Intervened::Done));
            }
            Request::Rerun {
                run,
                failed_only,
                reply,
            } => {
                if self.runs.table.contains_key(&run) {
                    let _ = reply.send(Err(still_going(run)));
                    return;
                }
                // The run and its version's spec are read beside the loop.
                let store = self.store.clone();
                self.beside(async move { read_rerun(&*store, run).await }, move |read| {
                    Completion::RerunRead {
                        read: Box::new(read),
                        failed_only,
                        reply,
                    }
                });
            }
            Request::Own { owns, reply } => self.set_ownership(owns, reply),
            Request::Sync {
                changed,
                deleted,
                reply,
            } => {
                let owned = self.sync_jobs(changed, deleted, now);
                self.reply_after_commit(reply, Ok(owned));
            }
            Request::Elsewhere { running, reply } => {
                self.set_elsewhere(running, now);
                let _ = reply.send(Ok(()));
            }
            Request::Adopt { runs, alive, reply } => {
                // The jobs of the runs are read beside the loop, once each.
                let runs: Vec<RunRecord> = runs
                    .into_iter()
                    .filter(|r| !self.runs.table.contains_key(&r.id))
                    .collect();
                let mut reads = Vec::new();
                let mut seen = HashSet::new();
                for r in &runs {
                    let key = (r.namespace.clone(), r.job.clone());
                    let at = (key.clone(), r.job_version);
                    if self.jobs.table.contains_key(&key) && seen.insert(at.clone()) {
                        reads.push((at, self.job_at(&key, r.job_version)));
                    }
                }
                let read = async move {
                    let mut jobs = HashMap::new();
                    for (key, read) in reads {
                        jobs.insert(key, read.await?);
                    }
                    Ok(jobs)
                };
                self.beside(read, |jobs| Completion::Adopted {
                    runs,
                    jobs,
                    alive,
                    reply,
                });
            }
            Request::Ping { reply } => {
                let _ = reply.send(Ok(()));
            }
            Request::Settle { reply } => {
                self.on_timers();
                self.reply_after_commit(reply, Ok(()));
            }
            Request::Gauges { reply } => {
                let _ = reply.send(Ok(self.gauges(now)));
            }
            Request::Work { reply } => self.share_work(reply),
        }
    }
}
