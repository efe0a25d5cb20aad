//! What the pruner reads of the history and asks a backend to delete (see
//! [`crate::HistoryStore::history_jobs`] and its siblings); which rows go is
//! decided by `dagcron_core::retention`.

use dagcron_core::retention::JobFacts;
use jiff::Timestamp;

use crate::RunId;

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
