//! The pruner: retention carried out beside the engine, never in its loop.
//!
//! A pass walks the jobs with history, a page at a time; for each job it
//! reads its runs but the newest it keeps, oldest first, a batch at a
//! time, asks `dagcron_core::retention` which go, and deletes them in one
//! small transaction (their tasks, attempts, logs and ledger rows with
//! them), pausing between batches so that the engine's commits never wait
//! long behind it; then the job's ledger rows, then, for a deleted job, its
//! versions and tombstone. The policy of each namespace is a setting of the
//! instance (`retention/<ns>`), or [`Retention::default`].
//!
//! Every node of a cluster prunes: each row is checked again as it is
//! deleted, so two nodes pruning at once delete each row once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::Retention;
use dagcron_core::retention::{JobFacts, RunFacts};
use dagcron_store::prelude::*;
use dagcron_store::{HistoryJob, Prune, Pruned, RunId, StorageError};
use jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Clock;

/// The setting that holds a namespace's policy (JSON of [`Retention`]).
pub fn setting_key(namespace: &str) -> String {
    format!("retention/{namespace}")
}

/// The policy of `namespace`: its setting, or the instance's default.
pub async fn policy_of<S: Store>(store: &S, namespace: &str) -> Result<Retention, StorageError> {
    match store.get_setting(&setting_key(namespace)).await? {
        None => Ok(Retention::default()),
        Some(text) => serde_json::from_str(&text).map_err(|e| {
            StorageError::Corrupt(format!(
                "the retention of {namespace} does not read back: {e}"
            ))
        }),
    }
}

/// How the pruner paces itself.
#[derive(Clone, Copy, Debug)]
pub struct PruneConfig {
    /// At most this many runs (or ledger rows) per transaction.
    pub batch: u32,
    /// The pause after each transaction, so that others get the database.
    pub pause: Duration,
    /// The time from start to the first pass (out of the way of the
    /// engine's recovery).
    pub first: Duration,
    /// The time between the end of a pass and the start of the next.
    pub interval: Duration,
    /// Audit rows older than this are pruned at each pass, the log's
    /// checkpoint kept so that the rest still verifies (none: kept forever).
    pub audit_max_age: Option<Duration>,
    /// Notifications that ended (delivered, given up or dropped) longer ago
    /// than this are pruned at each pass, with their delivery attempts.
    pub notification_max_age: Duration,
}

impl Default for PruneConfig {
    fn default() -> PruneConfig {
        PruneConfig {
            batch: 500,
            pause: Duration::from_millis(20),
            first: Duration::from_secs(60),
            interval: Duration::from_secs(600),
            audit_max_age: None,
            notification_max_age: Duration::from_secs(7 * 86_400),
        }
    }
}

/// `dagcron_pruned_total{what}`: runs, attempts, fires (ledger rows) and
/// jobs (deleted jobs forgotten).
#[derive(Clone, Debug, Default)]
pub struct PruneMetrics {
    pruned: Family<Vec<(&'static str, &'static str)>, Counter>,
}

const WHAT: [&str; 5] = ["runs", "attempts", "fires", "jobs", "notifications"];

impl PruneMetrics {
    /// Registers `dagcron_pruned_total`, every series at zero.
    pub fn register(&self, registry: &mut Registry) {
        for what in WHAT {
            let _ = self.pruned.get_or_create(&vec![("what", what)]);
        }
        registry.register(
            "dagcron_pruned",
            "Rows deleted by retention, by what they were",
            self.pruned.clone(),
        );
    }

    fn count(&self, p: Pruned) {
        for (what, n) in WHAT.into_iter().zip([p.runs, p.attempts, p.fires, p.jobs]) {
            if n > 0 {
                self.pruned.get_or_create(&vec![("what", what)]).inc_by(n);
            }
        }
    }
}

/// What a pass deleted (or, dry, would delete), per namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Counts per namespace, only those where something goes.
    pub namespaces: BTreeMap<String, Pruned>,
}

/// Jobs read at a time.
const JOB_PAGE: u32 = 500;

/// One job's walk of a pass: the job, its namespace's policy, the pass's
/// instant, whether it only counts, and when to stop.
#[derive(Clone, Copy)]
struct Walk<'a> {
    job: &'a HistoryJob,
    policy: &'a Retention,
    now: Timestamp,
    dry_run: bool,
    stop: &'a CancellationToken,
}

/// Carries out retention; see the module's documentation.
pub struct Pruner<S: Store> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    config: PruneConfig,
    metrics: PruneMetrics,
}

impl<S: Store> Pruner<S> {
    /// A pruner of `store`, judging ages by `clock`.
    pub fn new(
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        config: PruneConfig,
        metrics: PruneMetrics,
    ) -> Pruner<S> {
        Pruner {
            store,
            clock,
            config,
            metrics,
        }
    }

    /// Passes every `interval` (the first after `first`) until `stop`; a
    /// failed pass is logged and the next one tries again.
    pub async fn run(self, stop: CancellationToken) {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(self.config.first) => {}
        }
        loop {
            match self.pass(None, false, &stop).await {
                Ok(report) if !report.namespaces.is_empty() => {
                    tracing::info!(?report.namespaces, "pruned history");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("pruning failed, to be tried again: {e}"),
            }
            match self.prune_audit().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, "pruned the audit log"),
                Err(e) => tracing::warn!("pruning the audit log failed, to be tried again: {e}"),
            }
            match self.prune_notifications(&stop).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, "pruned the outbox"),
                Err(e) => tracing::warn!("pruning the outbox failed, to be tried again: {e}"),
            }
            match self.prune_run_keys(&stop).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, "pruned the keys of runs"),
                Err(e) => tracing::warn!("pruning the keys of runs failed, to be tried again: {e}"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.config.interval) => {}
            }
        }
    }

    /// Deletes the audit rows older than the retention of the audit log
    /// ([`PruneConfig::audit_max_age`]; none: nothing), keeping its
    /// checkpoint (see `AuditStore::prune_audit`); how many rows went.
    pub async fn prune_audit(&self) -> Result<u64, StorageError> {
        let Some(age) = self.config.audit_max_age else {
            return Ok(0);
        };
        let age = jiff::SignedDuration::try_from(age).unwrap_or(jiff::SignedDuration::MAX);
        let before = self.clock.now().checked_sub(age).unwrap_or(Timestamp::MIN);
        self.store.prune_audit(before).await
    }

    /// Deletes the notifications that ended longer ago than
    /// [`PruneConfig::notification_max_age`], a batch per transaction;
    /// how many went.
    pub async fn prune_notifications(&self, stop: &CancellationToken) -> Result<u64, StorageError> {
        let age = jiff::SignedDuration::try_from(self.config.notification_max_age)
            .unwrap_or(jiff::SignedDuration::MAX);
        let before = self.clock.now().checked_sub(age).unwrap_or(Timestamp::MIN);
        self.in_batches("notifications", stop, |limit| {
            self.store.prune_notifications(before, limit)
        })
        .await
    }

    /// Deletes the keys of runs made longer ago than
    /// [`dagcron_store::RUN_KEY_DAYS`], a batch per transaction; how many
    /// went.
    pub async fn prune_run_keys(&self, stop: &CancellationToken) -> Result<u64, StorageError> {
        let age = jiff::SignedDuration::from_hours(24 * dagcron_store::RUN_KEY_DAYS);
        let before = self.clock.now().checked_sub(age).unwrap_or(Timestamp::MIN);
        self.in_batches("run_keys", stop, |limit| {
            self.store.prune_run_keys(before, limit)
        })
        .await
    }

    /// Runs `prune` (which deletes up to its limit and says how many went)
    /// until it deletes less than a batch or `stop` is cancelled, and
    /// counts what went as `what`.
    async fn in_batches<F: Future<Output = Result<u64, StorageError>>>(
        &self,
        what: &'static str,
        stop: &CancellationToken,
        prune: impl Fn(u32) -> F,
    ) -> Result<u64, StorageError> {
        let mut total = 0;
        while !stop.is_cancelled() {
            let n = prune(self.config.batch).await?;
            total += n;
            if n < u64::from(self.config.batch) {
                break;
            }
            tokio::time::sleep(self.config.pause).await;
        }
        if total > 0 {
            self.metrics
                .pruned
                .get_or_create(&vec![("what", what)])
                .inc_by(total);
        }
        Ok(total)
    }

    /// [`Pruner::pass`] to its end (a call of the API).
    pub async fn pass_now(
        &self,
        namespace: Option<&str>,
        dry_run: bool,
    ) -> Result<PruneReport, StorageError> {
        self.pass(namespace, dry_run, &CancellationToken::new())
            .await
    }

    /// One pass over every job with history (of `namespace` if asked):
    /// deletes what the policies let go, or with `dry_run` only counts it.
    /// Stops early, with what it did so far, once `stop` is cancelled.
    pub async fn pass(
        &self,
        namespace: Option<&str>,
        dry_run: bool,
        stop: &CancellationToken,
    ) -> Result<PruneReport, StorageError> {
        let now = self.clock.now();
        let mut report = PruneReport::default();
        let mut policies: HashMap<String, Retention> = HashMap::new();
        let mut after: Option<(String, String)> = None;
        loop {
            let jobs = self
                .store
                .history_jobs(
                    namespace,
                    after.as_ref().map(|(n, j)| (n.as_str(), j.as_str())),
                    JOB_PAGE,
                )
                .await?;
            for job in &jobs {
                if stop.is_cancelled() {
                    return Ok(report);
                }
                let policy = match policies.get(&job.namespace) {
                    Some(p) => *p,
                    None => {
                        let p = policy_of(&*self.store, &job.namespace).await?;
                        policies.insert(job.namespace.clone(), p);
                        p
                    }
                };
                let walk = Walk {
                    job,
                    policy: &policy,
                    now,
                    dry_run,
                    stop,
                };
                let pruned = self.job(&walk).await?;
                if pruned != Pruned::default() {
                    report
                        .namespaces
                        .entry(job.namespace.clone())
                        .or_default()
                        .add(pruned);
                }
            }
            match jobs.last() {
                Some(last) if jobs.len() == JOB_PAGE as usize => {
                    after = Some((last.namespace.clone(), last.name.clone()));
                }
                _ => return Ok(report),
            }
        }
    }

    /// Deletes (or counts) one batch, then pauses.
    async fn apply(
        &self,
        batch: Prune,
        dry: Pruned,
        dry_run: bool,
    ) -> Result<Pruned, StorageError> {
        if dry_run || batch.is_empty() {
            return Ok(if dry_run { dry } else { Pruned::default() });
        }
        let done = self.store.prune(&batch).await?;
        self.metrics.count(done);
        tokio::time::sleep(self.config.pause).await;
        Ok(done)
    }

    async fn job(&self, w: &Walk<'_>) -> Result<Pruned, StorageError> {
        let Walk {
            job,
            policy,
            now,
            dry_run,
            stop,
        } = *w;
        let (ns, name, facts) = (&job.namespace, &job.name, &job.facts);
        let keep = policy.keep(facts);
        let batch = self.config.batch;
        let mut total = Pruned::default();
        let mut runs_left = false;
        // A deleted job's newest fire's run, which goes when the job does.
        let mut held: Option<RunFacts> = None;
        let mut after: RunId = RunId::MIN;
        while !stop.is_cancelled() {
            let runs = self.store.run_history(ns, name, keep, after, batch).await?;
            let Some(last) = runs.last() else { break };
            after = last.id;
            let ids = policy.runs_to_prune(now, facts, u64::from(keep), &runs);
            let held_now = policy.held_for_forget(now, facts, u64::from(keep), &runs);
            if let Some(id) = held_now {
                held = runs.iter().find(|r| r.id == id).copied();
            }
            runs_left |= ids.len() + usize::from(held_now.is_some()) < runs.len();
            let going = runs.iter().filter(|r| ids.contains(&r.id));
            let dry = Pruned {
                runs: ids.len() as u64,
                attempts: going.clone().map(|r| r.attempts).sum(),
                fires: going.filter(|r| r.fired).count() as u64,
                jobs: 0,
            };
            let more = policy.more_after(now, &runs) && runs.len() == batch as usize;
            let batch = Prune {
                runs: ids,
                ..Prune::default()
            };
            total.add(self.apply(batch, dry, dry_run).await?);
            if !more {
                break;
            }
        }
        total.add(self.fires(w).await?);
        if !stop.is_cancelled() && policy.forget(now, facts, runs_left) {
            let batch = Prune {
                runs: held.iter().map(|r| r.id).collect(),
                fires: vec![],
                forget: vec![(ns.clone(), name.clone())],
            };
            // What the ledger walk leaves of a deleted job is its newest
            // row (with its run, if it has one), which goes with the job.
            let dry = Pruned {
                runs: u64::from(held.is_some()),
                attempts: held.map_or(0, |r| r.attempts),
                fires: u64::from(facts.newest_fire.is_some()),
                jobs: 1,
            };
            total.add(self.apply(batch, dry, dry_run).await?);
        }
        Ok(total)
    }

    /// The job's ledger rows that no run holds.
    async fn fires(&self, w: &Walk<'_>) -> Result<Pruned, StorageError> {
        let Walk {
            job,
            policy,
            now,
            dry_run,
            stop,
        } = *w;
        let (ns, name, facts): (&str, &str, &JobFacts) = (&job.namespace, &job.name, &job.facts);
        let keep = policy.keep(facts);
        let cutoff = policy.cutoff(now);
        let mut total = Pruned::default();
        let mut after: Option<Timestamp> = None;
        while !stop.is_cancelled() {
            let fires = self
                .store
                .fire_history(ns, name, keep, after, self.config.batch)
                .await?;
            let Some(last) = fires.last() else { break };
            after = Some(last.scheduled_at);
            let more = last.scheduled_at < cutoff && fires.len() == self.config.batch as usize;
            let going = policy.fires_to_prune(now, facts, u64::from(keep), &fires);
            let dry = Pruned {
                fires: going.len() as u64,
                ..Pruned::default()
            };
            let batch = Prune {
                fires: going
                    .into_iter()
                    .map(|at| (ns.to_string(), name.to_string(), at))
                    .collect(),
                ..Prune::default()
            };
            total.add(self.apply(batch, dry, dry_run).await?);
            if !more {
                break;
            }
        }
        Ok(total)
    }
}
