//! The completions of work done beside the loop (store reads and writes,
//! listings, shared work): each carries on the decision that waited on it.

use super::commands::*;
use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn on_completion(&mut self, done: Completion) {
        let now = self.clock.now();
        match done {
            Completion::Applied {
                jobs,
                results,
                reply,
            } => {
                let results = match results {
                    Ok(results) => results,
                    Err(e) => {
                        let _ = reply.send(Err(EngineError::Storage(e)));
                        return;
                    }
                };
                // The apply is committed: answered now. Its jobs are
                // installed before any later command is taken, so that a
                // trigger or a delete sent after the answer finds them.
                let out = jobs.iter().zip(&results);
                let _ = reply.send(Ok(out.map(|(ready, r)| (ready.job.key(), *r)).collect()));
                self.jobs.installing = Some(Installing {
                    jobs: jobs
                        .into_iter()
                        .zip(results)
                        .collect::<Vec<_>>()
                        .into_iter(),
                    resumed: Vec::new(),
                    at: now,
                });
                self.install_some(now);
            }
            Completion::SlaDue(due) => self.sla_judged(*due, now),
            Completion::KeyChecked {
                key,
                mut ask,
                found,
            } => match found {
                Ok(None) => {
                    ask.key_checked = true;
                    self.on_request(Request::Trigger {
                        namespace: key.0,
                        name: key.1,
                        ask,
                    });
                }
                Ok(Some(_)) => {
                    let k = ask.by.key.unwrap_or_default();
                    let _ = ask.reply.send(Err(EngineError::Duplicate(k)));
                }
                Err(e) => {
                    let _ = ask.reply.send(Err(EngineError::Storage(e)));
                }
            },
            Completion::Deleted { key, result, reply } => {
                let result = job_found(result, &key);
                if result.is_ok() {
                    self.remove_job(&key, now);
                }
                self.reply_after_commit(reply, result);
            }
            Completion::Paused {
                key,
                paused,
                result,
                reply,
            } => {
                let job = result.as_ref().ok().and_then(|(_, job)| job.clone());
                let result = job_found(result.map(|(found, _)| found), &key);
                if result.is_ok() {
                    self.set_job_paused(&key, paused, now);
                    // A resume closes the breaker of a job that has one, or
                    // that this node knows open (the store knows if it is).
                    let open = self.jobs.table.get(&key).is_some_and(|e| e.breaker_open);
                    if let Some(job) = job.filter(|j| open || j.spec.breaker.is_some()) {
                        self.close_breaker(&key, &job, now);
                    }
                }
                self.reply_after_commit(reply, result);
            }
            Completion::Loaded { key, job } => {
                let waiting = self.jobs.loading.remove(&key).unwrap_or_default();
                match job {
                    Ok(Some(job)) if self.jobs.table.contains_key(&key) => {
                        if let Some(entry) = self.jobs.table.get_mut(&key) {
                            entry.job.get_or_insert_with(|| job.clone());
                        }
                        for w in waiting {
                            self.trigger(key.clone(), job.clone(), w, now);
                        }
                    }
                    Ok(_) => {
                        for w in waiting {
                            let _ = w.reply.send(Err(no_such_job(&key)));
                        }
                    }
                    Err(e) => {
                        for w in waiting {
                            let _ = w.reply.send(Err(EngineError::Storage(copy_of(&e))));
                        }
                    }
                }
            }
            Completion::CaughtUp(fires) => self.caught_up(*fires),
            Completion::Prepared {
                key,
                generation,
                at,
                job,
            } => self.prepared(key, generation, at, job, now),
            Completion::Backfilled {
                key,
                job,
                fires,
                reply,
            } => {
                let fires = match fires {
                    Ok(_) if !self.jobs.table.contains_key(&key) => Err(no_such_job(&key)),
                    other => other,
                };
                let instants = match fires {
                    Ok(instants) => instants,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                let mut ids = Vec::new();
                for at in instants {
                    let run = self.new_run(
                        &key,
                        &job,
                        Trigger::Backfill,
                        at,
                        job.spec.params.clone(),
                        FireDecision::Queue,
                        now,
                        None,
                        None,
                    );
                    let id = run.id;
                    // A fire recorded meanwhile is refused by the store, and
                    // its run is not created.
                    self.record_fire(&key, at, FireOutcome::Fired, Some(run));
                    self.jobs
                        .table
                        .get_mut(&key)
                        .expect("job")
                        .queued
                        .push_back(id);
                    ids.push(id);
                }
                self.start_queued(&key, now);
                self.let_go_if_idle(&key, now);
                self.reply_after_commit(reply, Ok(ids));
            }
            Completion::RerunRead {
                read,
                failed_only,
                reply,
            } => match *read {
                Ok(read) => self.rerun(read, failed_only, reply, now),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Completion::Learned { key, stored, call } => match stored {
                Err(e) => call.refuse(EngineError::Storage(e)),
                Ok(stored) => {
                    if let Some(stored) = stored {
                        self.sync_jobs(vec![stored], vec![], now);
                    }
                    if self.jobs.table.contains_key(&key) {
                        // Taken again, as if it had just come.
                        self.again(*call);
                    } else {
                        call.refuse(no_such_job(&key));
                    }
                }
            },
            Completion::Owned {
                gained,
                last,
                owned,
                reply,
            } => self.owned(gained, last, owned, reply, now),
            Completion::Adopted {
                runs,
                jobs,
                alive,
                reply,
            } => {
                let mut jobs = match jobs {
                    Ok(jobs) => jobs,
                    Err(e) => {
                        let _ = reply.send(Err(EngineError::Storage(e)));
                        return;
                    }
                };
                for record in runs {
                    if self.runs.table.contains_key(&record.id) {
                        continue;
                    }
                    tracing::info!(run = record.id, job = %format!("{}/{}", record.namespace, record.job), "taking over a run of a node that is gone");
                    let at = (
                        (record.namespace.clone(), record.job.clone()),
                        record.job_version,
                    );
                    let job = jobs.get_mut(&at).and_then(|j| j.clone());
                    self.rebuild_run(record, job, &alive, now);
                }
                self.reply_after_commit(reply, Ok(()));
            }
            Completion::Worked { news, reply } => self.worked(news, reply, now),
        }
    }
}
