//! What every handler is given: the store, the engine, the cluster, the
//! agents, the keys and the per-server counters.

use std::sync::Arc;

use dagcron_runtime::{ClusterHandle, EngineHandle};
use dagcron_store::prelude::*;

use crate::auth;
use crate::handlers::{quotas, secrets};

/// What the handlers share.
pub struct AppState<S: Store> {
    /// Where history is read from.
    pub store: Arc<S>,
    /// Where changes are sent.
    pub engine: EngineHandle,
    /// The cluster this node belongs to, if any.
    pub cluster: Option<ClusterHandle>,
    /// The remote worker agents connected to this server.
    pub workers: Option<dagcron_agents::AgentPool>,
    /// The largest request body accepted, in bytes (larger: `413`).
    pub max_body_bytes: usize,
    /// The key token secrets are hashed under.
    pub keyring: Arc<auth::Keyring>,
    /// The key secrets are encrypted under (none: no secrets here).
    pub master_key: Option<Arc<secrets::KeySet>>,
    /// The series kept between scrapes of `/metrics` (the engine's
    /// counters); the gauges of the moment are added at each scrape.
    pub metrics: Option<Arc<prometheus_client::registry::Registry>>,
    /// The trigger buckets of the namespaces' quotas, and their refusals.
    pub quota: Arc<quotas::QuotaState>,
    /// What retention deleted (`dagcron_pruned_total`), shared with the
    /// pruner beside the engine.
    pub pruned: dagcron_runtime::PruneMetrics,
}

/// The default of [`AppState::max_body_bytes`]: 2 MiB, room for a job file
/// of a few thousand jobs.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 << 20;

impl<S: Store> Clone for AppState<S> {
    fn clone(&self) -> Self {
        AppState {
            store: self.store.clone(),
            engine: self.engine.clone(),
            cluster: self.cluster.clone(),
            workers: self.workers.clone(),
            max_body_bytes: self.max_body_bytes,
            keyring: self.keyring.clone(),
            master_key: self.master_key.clone(),
            metrics: self.metrics.clone(),
            quota: self.quota.clone(),
            pruned: self.pruned.clone(),
        }
    }
}

/// An attempt's output as far as it goes (see [`AppState::attempt_output`]).
#[derive(Debug)]
pub struct AttemptOutput {
    /// stdout and stderr interleaved, secrets redacted.
    pub bytes: Vec<u8>,
    /// The attempt has not ended: more may come.
    pub running: bool,
}

impl<S: Store> AppState<S> {
    /// The output of attempt `n` of `task` of `run` so far (none: no such
    /// attempt). While the attempt runs in this process, or on an agent
    /// connected to it, that is its live output; once it ends, or while it
    /// runs on another node of a cluster, what the store has (the whole
    /// output is stored as the attempt ends).
    pub async fn attempt_output(
        &self,
        run: &dagcron_store::RunRecord,
        task: &str,
        n: u32,
    ) -> Result<Option<AttemptOutput>, dagcron_store::StorageError> {
        let attempt = run
            .tasks
            .iter()
            .find(|t| t.id == task)
            .and_then(|t| t.attempts.iter().find(|a| a.number == n));
        let Some(attempt) = attempt else {
            return Ok(None);
        };
        if let Some(live) = self.engine.live_log(run.id, task, n) {
            let (bytes, done) = live.read_from(0);
            return Ok(Some(AttemptOutput {
                bytes,
                running: !done,
            }));
        }
        let running = !attempt.state.is_terminal();
        if running {
            // Running on another node of a cluster: its output as that node
            // last published it.
            if let Some((skipped, tail)) = self.store.read_live_log(run.id, task, n).await? {
                let mut bytes = Vec::with_capacity(tail.len() + 80);
                if skipped > 0 {
                    bytes.extend_from_slice(skipped_note(skipped).as_bytes());
                }
                bytes.extend_from_slice(&tail);
                return Ok(Some(AttemptOutput { bytes, running }));
            }
        }
        let bytes = self.store.read_log(run.id, task, n).await?;
        Ok(Some(AttemptOutput {
            bytes: bytes.unwrap_or_default(),
            running,
        }))
    }
}

/// The line shown before the output of an attempt running on another node
/// when its first bytes were not published.
pub(crate) fn skipped_note(skipped: u64) -> String {
    format!("[dagcron: {skipped} earlier bytes are shown once the attempt ends]\n")
}
