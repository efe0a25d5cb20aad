//! What a store shared by several scheduler nodes adds: membership with
//! leases and fencing epochs, and the hand-over of runs from dead nodes.
//!
//! A node registers and receives an epoch, unique for ever. Its lease is
//! renewed by heartbeats and judged by the database's clock. Every batch the
//! node writes is checked, in the same transaction, against its lease and
//! epoch, and refused with [`StorageError::Fenced`](crate::StorageError::Fenced)
//! when either is stale; a node's expiry is recorded by a row update that
//! waits for that node's in-flight batches, so that nothing it commits can
//! land after another node has taken over its runs.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use crate::{Result, RunId, RunRecord, Store};

/// Where a node is in its life. (Serializable only because the runtime's
/// `LocalStatus` is; the API answers its own types.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Owns a share of the jobs and runs work.
    Alive,
    /// Shutting down: owns no jobs, finishes what it runs.
    Draining,
    /// Left gracefully.
    Left,
    /// Its lease expired; its runs went to other nodes.
    Dead,
}

impl NodeState {
    /// Every state.
    pub const ALL: [NodeState; 4] = [
        NodeState::Alive,
        NodeState::Draining,
        NodeState::Left,
        NodeState::Dead,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Alive => "alive",
            NodeState::Draining => "draining",
            NodeState::Left => "left",
            NodeState::Dead => "dead",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeState {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<NodeState, String> {
        [
            NodeState::Alive,
            NodeState::Draining,
            NodeState::Left,
            NodeState::Dead,
        ]
        .into_iter()
        .find(|n| n.as_str() == s)
        .ok_or_else(|| format!("unknown node state {s:?}"))
    }
}

/// A node as registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    /// Its name, stable across restarts.
    pub id: String,
    /// The fencing epoch of its current registration.
    pub epoch: i64,
    /// Its slot in run ids (unique among live nodes).
    pub slot: u8,
    /// Life state.
    pub state: NodeState,
    /// Whether it may own jobs (false while its clock is too far off).
    pub eligible: bool,
    /// Its API address, for operators.
    pub address: String,
    /// Its version.
    pub version: String,
    /// Registration instant (database clock).
    pub started_at: Timestamp,
    /// Last heartbeat (database clock).
    pub heartbeat_at: Timestamp,
    /// End of its lease (database clock).
    pub lease_until: Timestamp,
    /// Whether the lease is still running now (database clock).
    pub lease_valid: bool,
    /// Its clock minus the database's, in microseconds, as last measured.
    pub clock_skew_us: i64,
    /// How many jobs it owns, as last reported.
    pub owned_jobs: i64,
}

/// The identity a registration gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The node's name.
    pub id: String,
    /// Its new fencing epoch.
    pub epoch: i64,
    /// Its slot in run ids.
    pub slot: u8,
}

/// Jobs changed since a revision; see [`Coordination::jobs_changed_since`].
#[derive(Clone, Debug, Default)]
pub struct JobChanges {
    /// The revision read before the changes: everything up to it is here.
    pub revision: i64,
    /// Jobs created, updated, paused or resumed.
    pub changed: Vec<crate::StoredJob>,
    /// Jobs deleted: (namespace, name).
    pub deleted: Vec<(String, String)>,
}

/// What a heartbeat reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// Whether the node may own jobs.
    pub eligible: bool,
    /// Its clock minus the database's, in microseconds.
    pub clock_skew_us: i64,
    /// Jobs it owns.
    pub owned_jobs: i64,
}

/// An unfinished run whose node is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanRun {
    /// The run.
    pub id: RunId,
    /// Its job's namespace.
    pub namespace: String,
    /// Its job.
    pub job: String,
}

/// What the write path has cost so far: how many write batches were
/// committed, how many writes they held, and how many statements (each one
/// round trip, transaction control included) they took. (Serializable only
/// because the runtime's `LocalStatus` is.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriteStatistics {
    /// Batches committed.
    pub batches: u64,
    /// Writes in them.
    pub writes: u64,
    /// Statements sent for them.
    pub statements: u64,
}

/// Membership, leases and hand-over, for stores shared by a cluster.
pub trait Coordination: Store + Clone {
    /// The cost of this handle's write path so far.
    fn write_statistics(&self) -> WriteStatistics;
    /// Registers (or re-registers) node `id` with a new epoch and a lease of
    /// `ttl`; from then on every batch this handle writes is fenced by it.
    fn register(
        &self,
        id: &str,
        address: &str,
        version: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Registration>> + Send;
    /// Renews the lease for `ttl`. `Ok(false)`: the lease had ended or the
    /// epoch is stale; the node is fenced for good.
    fn heartbeat(
        &self,
        beat: Heartbeat,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Moves this node to `draining` or `left`.
    fn set_state(&self, state: NodeState) -> impl Future<Output = Result<()>> + Send;
    /// Every node registered.
    fn nodes(&self) -> impl Future<Output = Result<Vec<NodeRecord>>> + Send;
    /// The database's clock now.
    fn database_now(&self) -> impl Future<Output = Result<Timestamp>> + Send;
    /// Marks the nodes whose lease ended as dead (waiting for their in-flight
    /// batches) and returns them.
    fn reap(&self) -> impl Future<Output = Result<Vec<NodeRecord>>> + Send;
    /// Unfinished runs whose owner is no longer alive or draining.
    fn orphan_runs(&self) -> impl Future<Output = Result<Vec<OrphanRun>>> + Send;
    /// Runs running on nodes other than this one (or on none: orphans not
    /// yet adopted), counted per job: (namespace, job, runs).
    fn running_elsewhere(&self) -> impl Future<Output = Result<Vec<(String, String, u32)>>> + Send;
    /// Takes these orphan runs over (those still orphaned) and returns them.
    fn adopt_runs(&self, ids: &[RunId]) -> impl Future<Output = Result<Vec<RunRecord>>> + Send;
    /// Runs of this node whose cancellation was asked, clearing the requests.
    fn take_cancel_requests(&self) -> impl Future<Output = Result<Vec<RunId>>> + Send;
    /// Interventions on tasks of this node's runs asked through other nodes
    /// (run, task, action's name), oldest first, clearing the requests
    /// (and those of runs that have finished meanwhile).
    fn take_intervention_requests(
        &self,
    ) -> impl Future<Output = Result<Vec<(RunId, String, String)>>> + Send;
    /// A number that grows whenever a job is applied, paused or deleted.
    fn jobs_revision(&self) -> impl Future<Output = Result<i64>> + Send;
    /// The jobs changed and deleted after revision `since` (all of them
    /// for a negative `since`), and the revision they bring a reader to.
    fn jobs_changed_since(&self, since: i64) -> impl Future<Output = Result<JobChanges>> + Send;
    /// Waits until a node announces a change or `timeout` passes; returns
    /// what was announced (`jobs`, `nodes`, `cancel`, `work`, `attempts`),
    /// nothing on a timeout.
    fn wait_for_change(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;
}
