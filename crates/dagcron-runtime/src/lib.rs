//! dagcron's runtime: the engine that turns schedules into durable runs and
//! runs their tasks, the clock it depends on, and the coordinator that makes
//! it one node of a cluster.

pub mod clock;
pub mod cluster;
pub mod engine;
pub mod metrics;
pub mod prune;
pub mod trace;

pub use clock::{Clock, ManualClock, SkewedClock, SystemClock};
pub use cluster::{ClusterConfig, ClusterHandle, Coordinator, LocalStatus};
pub use engine::{
    CatchUpPace, Engine, EngineConfig, EngineError, EngineEvent, EngineHandle, Intervened, Lease,
    MAX_TRIGGER_RUNS, NodeIdentity, Observer, OutputReserve, Ownership, Policies, PolicyLookup,
    PolicySource, Remote, RemoteTask, RemoteWorkers, Report, Resolved, SecretSource, Secrets,
    WriteHealth,
};
pub use metrics::{EngineGauges, EngineMetrics};
pub use prune::{PruneConfig, PruneMetrics, PruneReport, Pruner};
