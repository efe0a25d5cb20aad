//! Liveness, the nodes of a cluster and the remote worker agents.

use std::collections::BTreeMap;

use dagcron_agents::WorkerInfo;
use dagcron_runtime::cluster::LocalStatus;
use dagcron_store::cluster::{NodeRecord, WriteStatistics};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Liveness, and in a cluster this node's standing.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HealthAnswer {
    /// `ok` or `degraded`.
    pub status: String,
    /// Why it is degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// This node (in a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeStatus>,
}

/// Whether this node can do its work now, check by check.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReadyAnswer {
    /// Every check passed.
    pub ready: bool,
    /// The checks: the store, the engine's loop, and in a cluster the lease
    /// and the clock.
    pub checks: Vec<ReadyCheck>,
}

/// One readiness check.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReadyCheck {
    /// `store`, `engine`, `lease` or `clock`.
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A cluster node as it knows itself.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeStatus {
    /// The node's name.
    pub node_id: String,
    /// Its fencing epoch.
    pub epoch: i64,
    /// `alive`, `draining`, `left` or `dead`.
    pub state: String,
    /// Whether it owns a share of the jobs now.
    pub owns_jobs: bool,
    /// Jobs it owns.
    pub owned_jobs: u64,
    /// Live nodes on the ring.
    pub ring_size: u64,
    /// Its clock minus the database's, in microseconds.
    pub clock_skew_us: i64,
    /// Whether the skew is within bounds (if not, it owns no jobs).
    pub clock_ok: bool,
    /// Whether its lease runs now, by its own clock.
    pub lease_valid: bool,
    /// What is wrong, if anything.
    pub problem: Option<String>,
    /// The cost of its writes to the database so far.
    pub writes: WriteCounts,
}

/// What a node's writes to the database have cost so far.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WriteCounts {
    /// Batches committed.
    pub batches: u64,
    /// Writes in them.
    pub writes: u64,
    /// Statements sent for them (transaction control included).
    pub statements: u64,
}

impl From<WriteStatistics> for WriteCounts {
    fn from(w: WriteStatistics) -> WriteCounts {
        WriteCounts {
            batches: w.batches,
            writes: w.writes,
            statements: w.statements,
        }
    }
}

impl From<&LocalStatus> for NodeStatus {
    fn from(s: &LocalStatus) -> NodeStatus {
        NodeStatus {
            node_id: s.node_id.clone(),
            epoch: s.epoch,
            state: s.state.as_str().into(),
            owns_jobs: s.owns_jobs,
            owned_jobs: s.owned_jobs as u64,
            ring_size: s.ring_size as u64,
            clock_skew_us: s.clock_skew_us,
            clock_ok: s.clock_ok,
            lease_valid: s.lease_valid,
            problem: s.problem.clone(),
            writes: s.writes.into(),
        }
    }
}

/// A node as the database has it registered.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeAnswer {
    /// Its name, stable across restarts.
    pub id: String,
    /// The fencing epoch of its current registration.
    pub epoch: i64,
    /// Its slot in run ids.
    pub slot: u8,
    /// `alive`, `draining`, `left` or `dead`.
    pub state: String,
    /// Whether it may own jobs (not while its clock is too far off).
    pub eligible: bool,
    /// Its API address.
    pub address: String,
    /// Its version.
    pub version: String,
    /// Registration (database clock).
    #[schema(value_type = String, format = DateTime)]
    pub started_at: Timestamp,
    /// Last heartbeat (database clock).
    #[schema(value_type = String, format = DateTime)]
    pub heartbeat_at: Timestamp,
    /// End of its lease (database clock).
    #[schema(value_type = String, format = DateTime)]
    pub lease_until: Timestamp,
    /// Whether the lease runs now (database clock).
    pub lease_valid: bool,
    /// Its clock minus the database's, in microseconds, as last measured.
    pub clock_skew_us: i64,
    /// Jobs it owns, as last reported.
    pub owned_jobs: i64,
}

impl From<&NodeRecord> for NodeAnswer {
    fn from(n: &NodeRecord) -> NodeAnswer {
        NodeAnswer {
            id: n.id.clone(),
            epoch: n.epoch,
            slot: n.slot,
            state: n.state.as_str().into(),
            eligible: n.eligible,
            address: n.address.clone(),
            version: n.version.clone(),
            started_at: n.started_at,
            heartbeat_at: n.heartbeat_at,
            lease_until: n.lease_until,
            lease_valid: n.lease_valid,
            clock_skew_us: n.clock_skew_us,
            owned_jobs: n.owned_jobs,
        }
    }
}

/// The nodes of the cluster.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterAnswer {
    /// This node: id, epoch, lease, clock skew, ring, owned jobs.
    pub this_node: NodeStatus,
    /// Every node the database knows.
    pub nodes: Vec<NodeAnswer>,
}

/// A remote worker agent.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerAnswer {
    /// Its name.
    pub id: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Attempts it runs at once.
    pub capacity: u32,
    /// Attempts it runs now.
    pub running: u32,
    /// Whether its stream is open.
    pub connected: bool,
    /// Shutting down.
    pub draining: bool,
    /// Its last heartbeat.
    #[schema(value_type = String, format = DateTime)]
    pub last_heartbeat: Timestamp,
    /// Its clock minus the server's, in microseconds (its own estimate).
    pub clock_offset_us: i64,
    /// Its load average.
    pub load: f64,
    /// Its software version.
    pub version: String,
    /// When it connected.
    #[schema(value_type = String, format = DateTime)]
    pub connected_at: Timestamp,
}

impl From<&WorkerInfo> for WorkerAnswer {
    fn from(w: &WorkerInfo) -> WorkerAnswer {
        WorkerAnswer {
            id: w.id.clone(),
            labels: w.labels.clone(),
            capacity: w.capacity,
            running: w.running,
            connected: w.connected,
            draining: w.draining,
            last_heartbeat: w.last_heartbeat,
            clock_offset_us: w.clock_offset_us,
            load: w.load,
            version: w.version.clone(),
            connected_at: w.connected_at,
        }
    }
}

/// The remote worker agents of this server.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkersAnswer {
    /// Every agent, by name.
    pub items: Vec<WorkerAnswer>,
    /// Results refused because their fencing token was stale.
    pub stale_results_refused: u64,
    /// Messages refused because they came from another agent than the one
    /// the attempt was given to (forged results, for one).
    pub foreign_reports_refused: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use dagcron_store::cluster::NodeState;
    use serde_json::json;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn a_node_answers_as_it_knows_itself() {
        let local = LocalStatus {
            node_id: "n0".into(),
            epoch: 7,
            state: NodeState::Draining,
            owns_jobs: false,
            owned_jobs: 3,
            ring_size: 2,
            clock_skew_us: -1500,
            clock_ok: true,
            lease_valid: true,
            problem: None,
            writes: WriteStatistics {
                batches: 1,
                writes: 2,
                statements: 3,
            },
        };
        // The runtime's own serialization is the shape the API always had.
        assert_eq!(
            serde_json::to_value(NodeStatus::from(&local)).unwrap(),
            serde_json::to_value(&local).unwrap()
        );
    }

    #[test]
    fn registered_nodes_and_agents_keep_their_fields() {
        let node = NodeRecord {
            id: "n1".into(),
            epoch: 4,
            slot: 1,
            state: NodeState::Alive,
            eligible: true,
            address: "127.0.0.1:7700".into(),
            version: "0.1.0".into(),
            started_at: at(1),
            heartbeat_at: at(2),
            lease_until: at(3),
            lease_valid: true,
            clock_skew_us: 12,
            owned_jobs: 5,
        };
        assert_eq!(
            serde_json::to_value(NodeAnswer::from(&node)).unwrap(),
            json!({
                "id": "n1", "epoch": 4, "slot": 1, "state": "alive", "eligible": true,
                "address": "127.0.0.1:7700", "version": "0.1.0",
                "started_at": "1970-01-01T00:00:01Z", "heartbeat_at": "1970-01-01T00:00:02Z",
                "lease_until": "1970-01-01T00:00:03Z", "lease_valid": true,
                "clock_skew_us": 12, "owned_jobs": 5
            })
        );
        let worker = WorkerInfo {
            id: "edge".into(),
            labels: [("site".to_string(), "edge".to_string())].into(),
            capacity: 4,
            running: 1,
            connected: true,
            draining: false,
            last_heartbeat: at(10),
            clock_offset_us: -3,
            load: 0.5,
            version: "0.1.0".into(),
            connected_at: at(9),
        };
        assert_eq!(
            serde_json::to_value(WorkerAnswer::from(&worker)).unwrap(),
            json!({
                "id": "edge", "labels": { "site": "edge" }, "capacity": 4, "running": 1,
                "connected": true, "draining": false, "last_heartbeat": "1970-01-01T00:00:10Z",
                "clock_offset_us": -3, "load": 0.5, "version": "0.1.0",
                "connected_at": "1970-01-01T00:00:09Z"
            })
        );
    }
}
