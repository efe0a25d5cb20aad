//! A scheduler node of a cluster: registration, heartbeats, clock checks,
//! the ring of live nodes, and the hand-over of jobs and runs.
//!
//! The [`Coordinator`] runs beside the engine. On every tick (a heartbeat
//! interval, or sooner when another node announces a change) it renews the
//! node's lease, measures its clock against the database's, marks nodes
//! whose lease ended as dead, rebuilds the ring from the live nodes and tells
//! the engine which jobs it owns, brings the engine's jobs in line with the
//! store, adopts the unfinished runs of dead nodes whose jobs it now owns,
//! and passes on cancellations asked through other nodes.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagcron_core::Ring;
use dagcron_store::StorageError;
use dagcron_store::cluster::{
    Coordination, Heartbeat, NodeRecord, NodeState, Registration, WriteStatistics,
};
use jiff::SignedDuration;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::engine::{EngineHandle, Lease, NodeIdentity, Ownership};

/// Settings of a cluster node.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The node's name, stable across restarts.
    pub node_id: String,
    /// Its API address, shown to operators.
    pub address: String,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// Beyond this difference between its clock and the database's, a node
    /// owns no jobs.
    pub max_clock_skew: Duration,
    /// Points per node on the ring.
    pub vnodes: u32,
}

impl ClusterConfig {
    /// Defaults for node `node_id` at `address`: a 5 s lease, 500 ms of
    /// tolerated clock skew.
    pub fn new(node_id: impl Into<String>, address: impl Into<String>) -> ClusterConfig {
        ClusterConfig {
            node_id: node_id.into(),
            address: address.into(),
            lease_ttl: Duration::from_secs(5),
            max_clock_skew: Duration::from_millis(500),
            vnodes: dagcron_core::ring::DEFAULT_VNODES,
        }
    }

    /// Time between heartbeats: a fifth of the lease.
    pub fn heartbeat_every(&self) -> Duration {
        self.lease_ttl / 5
    }

    /// How long after sending a successful heartbeat this node trusts its
    /// lease: three quarters of it, so that it stops before the database
    /// lets another node take over.
    fn trusted(&self) -> SignedDuration {
        SignedDuration::try_from(self.lease_ttl * 3 / 4).unwrap_or(SignedDuration::ZERO)
    }
}

/// What this node knows of itself, for the health endpoint.
#[derive(Clone, Debug, Serialize)]
pub struct LocalStatus {
    /// The node's name.
    pub node_id: String,
    /// Its fencing epoch.
    pub epoch: i64,
    /// Its life state.
    pub state: NodeState,
    /// Whether it owns a share of the jobs now.
    pub owns_jobs: bool,
    /// Jobs it owns.
    pub owned_jobs: usize,
    /// Live nodes on the ring.
    pub ring_size: usize,
    /// Its clock minus the database's, in microseconds.
    pub clock_skew_us: i64,
    /// Whether the skew is within bounds.
    pub clock_ok: bool,
    /// Whether its lease runs now (by its own clock).
    pub lease_valid: bool,
    /// What is wrong, if anything.
    pub problem: Option<String>,
    /// The cost of its writes to the database so far.
    pub writes: WriteStatistics,
}

type NodesFuture = Pin<Box<dyn Future<Output = Result<Vec<NodeRecord>, StorageError>> + Send>>;

/// A view of the cluster for the API.
#[derive(Clone)]
pub struct ClusterHandle {
    status: Arc<Mutex<LocalStatus>>,
    clock: Arc<dyn Clock>,
    writes: Arc<dyn Fn() -> WriteStatistics + Send + Sync>,
    lease: Lease,
    nodes: Arc<dyn Fn() -> NodesFuture + Send + Sync>,
}

impl std::fmt::Debug for ClusterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterHandle")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl ClusterHandle {
    /// This node's status.
    pub fn local(&self) -> LocalStatus {
        let mut status = self.status.lock().expect("status lock").clone();
        status.lease_valid = self.lease.is_valid_at(self.clock.now());
        status.writes = (self.writes)();
        status
    }

    /// Every registered node.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, StorageError> {
        (self.nodes)().await
    }
}

/// Registers the node and returns what its engine needs.
///
/// A node whose round trip to the database is longer than its heartbeat
/// interval could not renew its lease in time: it would join, take jobs
/// from the others, be fenced and start over. It waits instead, trying
/// again with a growing pause (up to [`MAX_JOIN_PAUSE`]), and says why.
pub async fn register<S: Coordination>(
    store: &S,
    config: &ClusterConfig,
    clock: &dyn Clock,
) -> Result<(Registration, NodeIdentity), StorageError> {
    let mut pause = Duration::from_millis(500);
    loop {
        let round_trip = round_trip(store).await?;
        if round_trip <= config.heartbeat_every() {
            break;
        }
        tracing::warn!(
            round_trip_ms = round_trip.as_millis() as u64,
            heartbeat_every_ms = config.heartbeat_every().as_millis() as u64,
            "the database is too far away to keep a lease (its round trip is longer than the heartbeat interval): not joining yet, trying again in {pause:?}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_JOIN_PAUSE);
    }
    let sent = clock.now();
    let registration = store
        .register(
            &config.node_id,
            &config.address,
            env!("CARGO_PKG_VERSION"),
            config.lease_ttl,
        )
        .await?;
    let lease = Lease::new();
    lease.extend_to(sent.checked_add(config.trusted()).unwrap_or(sent));
    tracing::info!(
        node = %registration.id,
        epoch = registration.epoch,
        slot = registration.slot,
        "registered in the cluster"
    );
    let identity = NodeIdentity {
        slot: registration.slot,
        lease,
        peers: Arc::new(AtomicBool::new(true)),
        ahead_us: Arc::default(),
    };
    Ok((registration, identity))
}

/// The longest pause between two tries to join of a node too far from
/// the database (see [`register`]).
pub const MAX_JOIN_PAUSE: Duration = Duration::from_secs(30);

/// The middle of three round trips to the database.
async fn round_trip<S: Coordination>(store: &S) -> Result<Duration, StorageError> {
    let mut times = [Duration::ZERO; 3];
    for t in &mut times {
        let started = tokio::time::Instant::now();
        store.database_now().await?;
        *t = started.elapsed();
    }
    times.sort();
    Ok(times[1])
}

/// Keeps a node's membership and share of the work; see the module documentation.
pub struct Coordinator<S: Coordination> {
    store: S,
    engine: EngineHandle,
    config: ClusterConfig,
    clock: Arc<dyn Clock>,
    lease: Lease,
    /// See [`NodeIdentity::peers`].
    peers: Arc<AtomicBool>,
    /// See [`NodeIdentity::ahead_us`].
    ahead_us: Arc<AtomicI64>,
    status: Arc<Mutex<LocalStatus>>,
    members: Option<Vec<String>>,
    ring: Arc<Ring>,
    /// The runs of this node's jobs running elsewhere, as last told to the engine.
    elsewhere: HashMap<(String, String), u32>,
    /// The jobs revision the engine is up to date with.
    jobs_revision: i64,
    /// Jobs this node owns, as the engine last counted them (told in heartbeats).
    owned: Arc<AtomicUsize>,
    /// Whether it is draining (told in heartbeats: it is then not eligible).
    draining: Arc<AtomicBool>,
}

impl<S: Coordination> Coordinator<S> {
    /// A coordinator for a registered node whose engine is `engine`, and
    /// was started after the store's jobs revision was `jobs_revision` (the
    /// coordinator brings it changes made after that; with `None`, all jobs
    /// once).
    pub fn new(
        store: S,
        engine: EngineHandle,
        config: ClusterConfig,
        registration: &Registration,
        identity: &NodeIdentity,
        clock: Arc<dyn Clock>,
        jobs_revision: Option<i64>,
    ) -> Coordinator<S> {
        let status = LocalStatus {
            node_id: registration.id.clone(),
            epoch: registration.epoch,
            state: NodeState::Alive,
            owns_jobs: false,
            owned_jobs: 0,
            ring_size: 0,
            clock_skew_us: 0,
            clock_ok: true,
            lease_valid: true,
            problem: None,
            writes: WriteStatistics::default(),
        };
        Coordinator {
            store,
            engine,
            config,
            clock,
            lease: identity.lease.clone(),
            peers: identity.peers.clone(),
            ahead_us: identity.ahead_us.clone(),
            status: Arc::new(Mutex::new(status)),
            members: None,
            ring: Arc::new(Ring::default()),
            elsewhere: HashMap::new(),
            jobs_revision: jobs_revision.unwrap_or(-1),
            owned: Arc::default(),
            draining: Arc::default(),
        }
    }

    /// A view for the API.
    pub fn handle(&self) -> ClusterHandle {
        let store = self.store.clone();
        let stats = self.store.clone();
        ClusterHandle {
            status: self.status.clone(),
            clock: self.clock.clone(),
            writes: Arc::new(move || stats.write_statistics()),
            lease: self.lease.clone(),
            nodes: Arc::new(move || {
                let store = store.clone();
                Box::pin(async move { store.nodes().await })
            }),
        }
    }

    fn set_problem(&self, problem: Option<String>) {
        self.status.lock().expect("status lock").problem = problem;
    }

    /// Runs until `stopped`. When `shutdown` fires first, the node drains:
    /// it gives up its jobs at once (other nodes take them over) and keeps
    /// its lease while the engine finishes running attempts; at `stopped`
    /// it leaves, and any run still unfinished goes to the other nodes.
    /// Returns an error when the node has been fenced: its process must stop.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
        stopped: CancellationToken,
    ) -> Result<(), StorageError> {
        // Upkeep (lease, membership, jobs) runs every heartbeat and when
        // nodes or jobs change; shared work runs at every wake-up.
        let mut upkeep_due = true;
        let mut last_upkeep = tokio::time::Instant::now();
        // The lease is renewed on its own schedule, so that slow upkeep or
        // shared work (a database far away) never lets it lapse.
        let mut beats = tokio::spawn(heartbeats(
            self.store.clone(),
            self.config.clone(),
            self.clock.clone(),
            Beating {
                lease: self.lease.clone(),
                status: self.status.clone(),
                owned: self.owned.clone(),
                draining: self.draining.clone(),
                ahead_us: self.ahead_us.clone(),
            },
        ));
        loop {
            let draining = self.draining.load(Ordering::SeqCst);
            if shutdown.is_cancelled() && !draining {
                self.draining.store(true, Ordering::SeqCst);
                self.status.lock().expect("status lock").state = NodeState::Draining;
                self.store.set_state(NodeState::Draining).await?;
                tracing::info!("draining: jobs handed over to the other nodes");
            }
            if stopped.is_cancelled() {
                beats.abort();
                let _ = (&mut beats).await;
                self.store.set_state(NodeState::Left).await?;
                tracing::info!("left the cluster");
                return Ok(());
            }
            if upkeep_due || last_upkeep.elapsed() >= self.config.heartbeat_every() {
                last_upkeep = tokio::time::Instant::now();
                match self.tick().await {
                    Ok(()) => self.set_problem(None),
                    Err(StorageError::Fenced(m)) => {
                        self.lease.revoke();
                        return Err(StorageError::Fenced(m));
                    }
                    Err(e) => {
                        tracing::warn!("cluster upkeep failed: {e}");
                        self.set_problem(Some(e.to_string()));
                    }
                }
            }
            if !self.draining.load(Ordering::SeqCst) {
                match self.engine.share_work().await {
                    Err(crate::EngineError::Storage(StorageError::Fenced(m))) => {
                        self.lease.revoke();
                        return Err(StorageError::Fenced(m));
                    }
                    Err(e) => tracing::warn!("shared work failed: {e}"),
                    Ok(()) => {}
                }
            }
            let wait = self
                .config
                .heartbeat_every()
                .saturating_sub(last_upkeep.elapsed());
            let draining = self.draining.load(Ordering::SeqCst);
            upkeep_due = tokio::select! {
                () = shutdown.cancelled(), if !draining => true,
                ended = &mut beats => return heartbeats_ended(ended),
                () = stopped.cancelled() => true,
                woke = self.store.wait_for_change(wait) => match woke {
                    Ok(what) => what.is_empty() || what.iter().any(|w| matches!(w.as_str(), "jobs" | "nodes" | "cancel")),
                    Err(e) => {
                        // Notifications are a shortcut; polling goes on without them.
                        tracing::debug!("listening for changes failed: {e}");
                        tokio::time::sleep(wait).await;
                        true
                    }
                },
            };
        }
    }

    async fn tick(&mut self) -> Result<(), StorageError> {
        if !self.lease.is_valid_at(self.clock.now()) {
            // The heartbeats have not renewed it (yet): nothing to do meanwhile.
            return Ok(());
        }
        // Dead nodes, then the ring of live ones.
        for dead in self.store.reap().await? {
            tracing::warn!(node = %dead.id, epoch = dead.epoch, "node lease ended; taking over its share");
        }
        let nodes = self.store.nodes().await?;
        let alive: HashSet<i64> = nodes
            .iter()
            .filter(|n| matches!(n.state, NodeState::Alive | NodeState::Draining))
            .map(|n| n.epoch)
            .collect();
        let peers = nodes
            .iter()
            .any(|n| n.id != self.config.node_id && n.state == NodeState::Alive && n.lease_valid);
        self.peers.store(peers, Ordering::Relaxed);
        let mut members: Vec<String> = nodes
            .into_iter()
            .filter(|n| n.state == NodeState::Alive && n.lease_valid && n.eligible)
            .map(|n| n.id)
            .collect();
        members.sort();

        // Jobs changed through any node.
        if self.store.jobs_revision().await? != self.jobs_revision {
            let changes = self.store.jobs_changed_since(self.jobs_revision).await?;
            let owned = self
                .engine
                .sync_jobs(changes.changed, changes.deleted)
                .await
                .map_err(engine_error)?;
            self.owned.store(owned, Ordering::SeqCst);
            self.jobs_revision = changes.revision;
        }

        let ring_changed = self.members.as_ref() != Some(&members);
        if ring_changed {
            self.ring = Arc::new(Ring::new(members.iter().cloned(), self.config.vnodes));
        }
        // Runs of this node's jobs still running on other nodes (made before
        // a job moved here, or through another node) count against the
        // job's overlap policy here: told before the engine arms the fires
        // of the jobs it gains.
        let me = self.config.node_id.clone();
        let elsewhere: HashMap<(String, String), u32> = self
            .store
            .running_elsewhere()
            .await?
            .into_iter()
            .filter(|(namespace, job, _)| self.ring.owner(namespace, job) == Some(me.as_str()))
            .map(|(namespace, job, n)| ((namespace, job), n))
            .collect();
        if elsewhere != self.elsewhere {
            self.engine
                .running_elsewhere(elsewhere.clone())
                .await
                .map_err(engine_error)?;
            self.elsewhere = elsewhere;
        }

        if ring_changed {
            let ring = self.ring.clone();
            let me = me.clone();
            let owns: Ownership = Arc::new(move |ns, job| ring.owner(ns, job) == Some(me.as_str()));
            let owned = self
                .engine
                .set_ownership(owns)
                .await
                .map_err(engine_error)?;
            self.owned.store(owned, Ordering::SeqCst);
            tracing::info!(nodes = ?members, owned, "ring changed");
            self.members = Some(members);
        }
        let owned = self.owned.load(Ordering::SeqCst);
        {
            let mut s = self.status.lock().expect("status lock");
            s.owned_jobs = owned;
            s.owns_jobs = owned > 0;
            s.ring_size = self.ring.nodes().len();
        }

        // Runs of dead nodes whose jobs this node now owns.
        let me = me.as_str();
        let mine: Vec<i64> = self
            .store
            .orphan_runs()
            .await?
            .into_iter()
            .filter(|o| self.ring.owner(&o.namespace, &o.job) == Some(me))
            .map(|o| o.id)
            .collect();
        if !mine.is_empty() && !self.draining.load(Ordering::SeqCst) {
            let runs = self.store.adopt_runs(&mine).await?;
            if !runs.is_empty() {
                self.engine.adopt(runs, alive).await.map_err(engine_error)?;
            }
        }

        // Cancellations asked through other nodes.
        for run in self.store.take_cancel_requests().await? {
            if let Err(e) = self.engine.cancel(run).await {
                tracing::info!(run, "cancel requested through another node: {e}");
            }
        }
        // Interventions on tasks asked through other nodes.
        for (run, task, action) in self.store.take_intervention_requests().await? {
            let done = match action.parse() {
                Ok(action) => self.engine.intervene(run, &task, action).await.map(|_| ()),
                Err(e) => Err(crate::EngineError::Invalid(e)),
            };
            if let Err(e) = done {
                tracing::warn!(run, task = %task, "{action} asked through another node: {e}");
            }
        }
        Ok(())
    }
}

/// Renews the node's lease every heartbeat interval, with its clock
/// measured against the database's, until its lease is lost (the node is
/// fenced: the error says why) or the task is aborted.
async fn heartbeats<S: Coordination>(
    store: S,
    config: ClusterConfig,
    clock: Arc<dyn Clock>,
    node: Beating,
) -> Result<(), StorageError> {
    loop {
        let started = tokio::time::Instant::now();
        match beat(&store, &config, &*clock, &node).await {
            Ok(()) => {}
            Err(StorageError::Fenced(m)) => {
                node.lease.revoke();
                return Err(StorageError::Fenced(m));
            }
            Err(e) => {
                tracing::warn!("heartbeat failed: {e}");
                node.status.lock().expect("status lock").problem = Some(e.to_string());
            }
        }
        tokio::time::sleep_until(started + config.heartbeat_every()).await;
    }
}

/// What the heartbeats read and keep up to date, shared with the
/// coordinator and the engine.
struct Beating {
    lease: Lease,
    status: Arc<Mutex<LocalStatus>>,
    owned: Arc<AtomicUsize>,
    draining: Arc<AtomicBool>,
    /// See [`NodeIdentity::ahead_us`].
    ahead_us: Arc<AtomicI64>,
}

/// One heartbeat: the clock against the database's, then the lease.
async fn beat<S: Coordination>(
    store: &S,
    config: &ClusterConfig,
    clock: &dyn Clock,
    node: &Beating,
) -> Result<(), StorageError> {
    let Beating {
        lease,
        status,
        owned,
        draining,
        ahead_us,
    } = node;
    let before = clock.now();
    let db = store.database_now().await?;
    let after = clock.now();
    let middle_us = (before.as_microsecond() + after.as_microsecond()) / 2;
    let skew_us = middle_us - db.as_microsecond();
    let bound = i64::try_from(config.max_clock_skew.as_micros()).unwrap_or(i64::MAX);
    let clock_ok = skew_us.abs() <= bound;
    ahead_us.store(skew_us, Ordering::SeqCst);
    let was_ok = {
        let mut s = status.lock().expect("status lock");
        let was = s.clock_ok;
        s.clock_skew_us = skew_us;
        s.clock_ok = clock_ok;
        was
    };
    if clock_ok != was_ok {
        if clock_ok {
            tracing::info!(
                skew_us,
                "clock back within bounds of the database's; owning jobs again"
            );
        } else {
            tracing::error!(
                skew_us,
                bound_us = bound,
                "this node's clock differs from the database's by more than the bound: it owns no jobs until the clock is fixed"
            );
        }
    }
    let sent = clock.now();
    let beat = Heartbeat {
        eligible: clock_ok && !draining.load(Ordering::SeqCst),
        clock_skew_us: skew_us,
        owned_jobs: owned.load(Ordering::SeqCst) as i64,
    };
    if !store.heartbeat(beat, config.lease_ttl).await? {
        return Err(StorageError::Fenced(format!(
            "node {} lost its lease: it was paused or cut off from the database for longer than {:?}, or another process registered with the same node id",
            config.node_id, config.lease_ttl
        )));
    }
    lease.extend_to(sent.checked_add(config.trusted()).unwrap_or(sent));
    Ok(())
}

/// Why the node stops when its heartbeats have stopped.
fn heartbeats_ended(
    ended: Result<Result<(), StorageError>, tokio::task::JoinError>,
) -> Result<(), StorageError> {
    ended.unwrap_or_else(|e| {
        Err(StorageError::Unavailable(format!(
            "the heartbeat task failed: {e}"
        )))
    })
}

fn engine_error(e: crate::EngineError) -> StorageError {
    match e {
        crate::EngineError::Storage(e) => e,
        other => StorageError::Unavailable(format!("the engine: {other}")),
    }
}
