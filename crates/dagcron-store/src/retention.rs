//! What the pruner reads of the history and asks a backend to delete (see
//! [`crate::HistoryStore::history_jobs`] and its siblings); which rows go is
//! decided by `dagcron_core::retention`.

use dagcron_core::retention::{FireFacts, JobFacts, RunFacts};
use jiff::Timestamp;

use crate::rows::ts as instant;
use crate::{Result, RunId, StorageError};

/// A job with history: it exists, or it was deleted and its versions are
/// still stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryJob {
    /// Tenant.
    pub namespace: String,
    /// Job name.
    pub name: String,
    /// When it was deleted, and its newest ledger row.
    pub facts: JobFacts,
}

/// One batch of pruning, committed in one transaction. Each row is checked
/// again as it is deleted (a run still ended and re-run by none, a ledger
/// row still without its run and not its job's newest, a job still
/// deleted), so that a batch decided on facts that changed since, or
/// applied twice by two nodes, deletes nothing it should not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prune {
    /// Runs to delete, with their tasks, attempts (and logs) and the
    /// ledger row of their fire.
    pub runs: Vec<RunId>,
    /// Ledger rows to delete: (namespace, job, scheduled instant).
    pub fires: Vec<(String, String, Timestamp)>,
    /// Deleted jobs to forget: their versions, tombstone and ledger rows.
    pub forget: Vec<(String, String)>,
}

impl Prune {
    /// Nothing to delete.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.fires.is_empty() && self.forget.is_empty()
    }
}

/// What a batch of pruning deleted (or, in a dry run, would delete).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Runs, with their tasks.
    pub runs: u64,
    /// Attempts, with their logs.
    pub attempts: u64,
    /// Rows of the fire ledger.
    pub fires: u64,
    /// Deleted jobs forgotten (versions and tombstone).
    pub jobs: u64,
}

impl Pruned {
    /// Adds `other` to these counts.
    pub fn add(&mut self, other: Pruned) {
        self.runs += other.runs;
        self.attempts += other.attempts;
        self.fires += other.fires;
        self.jobs += other.jobs;
    }
}

/// A row of [`crate::HistoryStore::history_jobs`] as both backends select it:
/// namespace, name, deletion instant, the newest fire's instant and run
/// (instants in microseconds).
pub type HistoryRow = (String, String, Option<i64>, Option<i64>, Option<i64>);

/// A row of [`crate::HistoryStore::run_history`]: id, state, created, finished,
/// re-run by another, attempts, named by its fire's ledger row.
pub type RunRow = (i64, String, i64, Option<i64>, bool, i64, bool);

/// A row of [`crate::HistoryStore::fire_history`]: the instant, its run stored.
pub type FireRow = (i64, bool);

/// Reads a [`HistoryRow`].
pub fn history_job((namespace, name, deleted, fire, run): HistoryRow) -> Result<HistoryJob> {
    Ok(HistoryJob {
        namespace,
        name,
        facts: JobFacts {
            deleted_at: deleted.map(instant).transpose()?,
            newest_fire: fire.map(instant).transpose()?.map(|at| (at, run)),
        },
    })
}

/// Reads a [`RunRow`].
pub fn run_facts(
    (id, state, created, finished, rerun, attempts, fired): RunRow,
) -> Result<RunFacts> {
    Ok(RunFacts {
        id,
        state: state.parse().map_err(StorageError::Corrupt)?,
        created_at: instant(created)?,
        finished_at: finished.map(instant).transpose()?,
        rerun,
        attempts: attempts as u64,
        fired,
    })
}

/// Reads a [`FireRow`].
pub fn fire_facts((at, run_stored): FireRow) -> Result<FireFacts> {
    Ok(FireFacts {
        scheduled_at: instant(at)?,
        run_stored,
    })
}
