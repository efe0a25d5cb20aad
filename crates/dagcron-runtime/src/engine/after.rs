//! Runs started by the end of another job's run (`after`, see
//! [`dagcron_core::after`]): made in the batch that records the upstream
//! run's end, each keyed by that run, so that a batch committed twice, a
//! crash or a failover never makes two.

use super::*;
use dagcron_core::after::AfterTrigger;
use std::collections::BTreeMap;

impl<S: Store> Engine<S> {
    /// Whether job `key` starts, through `after` triggers, after itself.
    fn in_circle(&self, key: &JobKey) -> bool {
        let mut at = key.clone();
        // Each job has one upstream job at most: a walk up the chain.
        for _ in 0..self.jobs.table.len().min(100_000) {
            let Some(after) = self.jobs.table.get(&at).and_then(|e| e.after()) else {
                return false;
            };
            at = (at.0.clone(), after.job.clone());
            if at == *key {
                return true;
            }
        }
        false
    }

    /// Run `id` ended in `state`: each job of its namespace that starts
    /// after its job's runs end so gets a run, admitted as a trigger is
    /// (its overlap policy and backlog); a paused job gets none.
    pub(super) fn start_downstream(&mut self, id: RunId, state: RunState, now: Timestamp) {
        let run = &self.runs.table[&id];
        let Some(downstream) = self.jobs.downstream.get(&*run.key) else {
            return;
        };
        let upstream = run.key.clone();
        let upstream_params = run.params.clone();
        let downstream: Vec<JobKey> = downstream.iter().cloned().collect();
        for key in downstream {
            let Some(entry) = self.jobs.table.get(&key) else {
                continue;
            };
            let Some(after) = entry.after().filter(|a| a.starts_on(state)) else {
                continue;
            };
            let named = format!("{}/{}", key.0, key.1);
            if entry.paused || entry.breaker_open {
                tracing::info!(job = %named, "paused or its breaker open: no run after run {id} of {}", upstream.1);
                continue;
            }
            if self.in_circle(&key) {
                // Two applies at once (or through two nodes) can close a
                // circle that neither saw: it never runs.
                tracing::error!(job = %named, "starts after jobs that start after it, in a circle: no run after run {id} of {}; change one of their after triggers", upstream.1);
                continue;
            }
            let Some(job) = entry.job.clone() else {
                // Kept in memory from start-up, every apply and every
                // change of ownership; once resumed after a pause it is read
                // again: its run then comes through a trigger of the same
                // key, read beside the loop (one run still, but in a commit
                // of its own).
                let (reply, _) = tokio::sync::oneshot::channel();
                let mut params = BTreeMap::new();
                if after.pass_params {
                    params = upstream_params.clone();
                }
                self.on_request(Request::Trigger {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    ask: handle::WaitingTrigger {
                        runs: vec![params],
                        caller: None,
                        at: None,
                        by: TriggerBy {
                            kind: Trigger::After,
                            key: Some(AfterTrigger::key(id)),
                        },
                        reply,
                        key_checked: false,
                    },
                });
                continue;
            };
            let decision = match self.admit(&key, &job, 1) {
                Ok(decisions) => decisions[0],
                Err(e) => {
                    tracing::warn!(job = %named, "no run after run {id} of {}: {e}", upstream.1);
                    continue;
                }
            };
            let mut params = job.spec.params.clone();
            if after.pass_params {
                params.extend(upstream_params.clone());
            }
            let mut made = self.new_run(
                &key,
                &job,
                Trigger::After,
                now,
                params,
                decision,
                now,
                None,
                None,
            );
            self.key_run(&mut made, AfterTrigger::key(id));
            let made_id = made.id;
            self.batch.writes.push(Write::Run(made));
            self.after_new_run(&key, made_id, decision, now);
            tracing::info!(job = %named, run = made_id, "started after run {id} of {} ended {}", upstream.1, state.as_str());
        }
    }
}
