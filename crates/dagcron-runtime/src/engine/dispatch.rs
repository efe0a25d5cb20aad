//! What starts attempts: the tasks ready to start, by lane, and the room
//! each lane has (the pool's slots, those held for claims from the
//! cluster, the remote agents' and the no-op tasks' counts).

use std::collections::VecDeque;

use dagcron_core::Job;
use dagcron_store::RunId;

use super::LiveLogs;
use super::shares;

/// The engine's dispatch part (see the module documentation).
#[derive(Default)]
pub(super) struct Dispatch {
    /// Tasks ready to start.
    pub(super) ready: ReadyQueues,
    /// Attempts in this process's pool (at most `pool_size`).
    pub(super) running: usize,
    /// Room of the pool held for attempts being claimed from the cluster.
    pub(super) claiming: usize,
    /// Attempts handed to remote agents (their capacity bounds them).
    pub(super) remote_running: usize,
    /// Attempts of no-op tasks under way (see [`Lane`]).
    pub(super) free_running: usize,
    /// Attempt tasks started and not yet reported (`running` also counts
    /// the ones decided but not yet committed).
    pub(super) started: usize,
    /// Output of the attempts running here, for followers.
    pub(super) live: LiveLogs,
}

impl Dispatch {
    /// The count of attempts under way in `lane`.
    pub(super) fn lane(&mut self, lane: Lane) -> &mut usize {
        match lane {
            Lane::Pool => &mut self.running,
            Lane::Agents => &mut self.remote_running,
            Lane::Free => &mut self.free_running,
        }
    }

    /// Attempts under way, whatever they count against.
    pub(super) fn in_flight(&self) -> usize {
        self.running + self.remote_running + self.free_running
    }

    /// Where the next ready local task goes, for a pool of `pool` slots,
    /// with other nodes (`peers`) or not, and `shared` attempts already
    /// handed to the cluster (see [`placement`]).
    pub(super) fn placement(&self, pool: usize, peers: bool, shared: usize) -> Placement {
        placement(self.running, self.claiming, pool, peers, shared)
    }
}

/// What an attempt counts against while it runs: this process's pool, the
/// remote agents' capacity, or nothing: a no-op task runs nothing, so its
/// attempt (recorded, started and ended like any) takes no slot of the
/// pool (as a DAG's empty join or placeholder task should not wait for,
/// or hold, room that real work needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lane {
    Pool,
    Agents,
    Free,
}

impl Lane {
    pub(super) fn of(task: &dagcron_core::Task) -> Lane {
        if task.run_on.is_some() {
            Lane::Agents
        } else if task.executor == dagcron_core::Executor::Noop {
            Lane::Free
        } else {
            Lane::Pool
        }
    }
}

/// Tasks ready to start: for this process's pool, for remote agents
/// (which the pool's size does not bound), and no-op tasks (which take no
/// slot, so never wait behind the pool's queue).
#[derive(Default)]
pub(super) struct ReadyQueues {
    /// Taken in turn across namespaces: a namespace with a backlog cannot
    /// keep another's next task out of the pool.
    pub(super) local: shares::Shares<(RunId, usize)>,
    pub(super) remote: VecDeque<(RunId, usize)>,
    pub(super) free: VecDeque<(RunId, usize)>,
}

impl ReadyQueues {
    /// Queues slot `slot` of run `run`, which runs task `spec` of `job`,
    /// ready at `ready_us`.
    pub(super) fn push(&mut self, job: &Job, spec: usize, run: RunId, slot: usize, ready_us: i64) {
        let task = &job.tasks[spec];
        match Lane::of(task) {
            Lane::Pool => {
                self.local
                    .push_back(&job.namespace, task.priority, ready_us, (run, slot))
            }
            Lane::Agents => self.remote.push_back((run, slot)),
            Lane::Free => self.free.push_back((run, slot)),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.local.len() + self.remote.len() + self.free.len()
    }
}

/// Where a ready local task goes now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// Started here: the pool has room.
    Here,
    /// Handed to the cluster, for another node with room.
    Cluster,
    /// Left ready until this node has room again.
    Wait,
}

/// Where a ready local task goes, for a node running `running` attempts
/// of a pool of `pool`, holding `claiming` slots for claims it has asked
/// the cluster for, with other nodes (`peers`) or not, and `shared` of its
/// attempts already handed to the cluster. Only a pool full of attempts
/// running hands work over: slots held for claims in flight come back as
/// soon as the claims are answered (most find nothing), and a task ready
/// meanwhile waits for them instead of going to another node while this
/// one has room.
pub(super) fn placement(
    running: usize,
    claiming: usize,
    pool: usize,
    peers: bool,
    shared: usize,
) -> Placement {
    if running + claiming < pool {
        Placement::Here
    } else if running >= pool && peers && shared < pool {
        Placement::Cluster
    } else {
        Placement::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_with_room_starts_its_task_here() {
        assert_eq!(placement(0, 0, 4, true, 0), Placement::Here);
        assert_eq!(placement(3, 0, 4, true, 0), Placement::Here);
        assert_eq!(placement(1, 2, 4, true, 0), Placement::Here);
    }

    /// Regression: a node asking the cluster for claims held all of its
    /// room meanwhile, and handed the tasks that became ready then to
    /// another node, though it ran nothing.
    #[test]
    fn regression_room_held_for_claims_in_flight_is_waited_for() {
        assert_eq!(placement(0, 4, 4, true, 0), Placement::Wait);
        assert_eq!(placement(3, 1, 4, true, 0), Placement::Wait);
    }

    #[test]
    fn a_pool_full_of_attempts_hands_work_to_its_peers_within_a_bound() {
        assert_eq!(placement(4, 0, 4, true, 0), Placement::Cluster);
        assert_eq!(placement(4, 0, 4, true, 3), Placement::Cluster);
        assert_eq!(placement(4, 0, 4, true, 4), Placement::Wait);
        assert_eq!(placement(4, 0, 4, false, 0), Placement::Wait);
    }

    /// A job of one task per lane: a shell task for the pool, one for
    /// an agent, and a no-op one.
    fn three_lanes() -> Job {
        let file: dagcron_core::JobFile = serde_saphyr::from_str(
            "namespace: t\njobs:\n  - name: j\n    tasks:\n      - { id: pool, shell: 'true' }\n      - { id: agent, shell: 'true', run_on: { labels: { os: linux } } }\n      - { id: none, noop: true }\n",
        )
        .unwrap();
        file.validate().unwrap().remove(0)
    }

    #[test]
    fn each_task_waits_in_its_lane_and_counts_against_it() {
        let job = three_lanes();
        let lanes: Vec<Lane> = job.tasks.iter().map(Lane::of).collect();
        assert_eq!(lanes, [Lane::Pool, Lane::Agents, Lane::Free]);
        let mut dispatch = Dispatch::default();
        for task in 0..3 {
            dispatch.ready.push(&job, task, 7, task, 0);
        }
        assert_eq!(dispatch.ready.len(), 3);
        assert_eq!(dispatch.ready.remote.pop_front(), Some((7, 1)));
        assert_eq!(dispatch.ready.free.pop_front(), Some((7, 2)));
        assert_eq!(dispatch.ready.local.pop_front(|_| 1), Some((7, 0)));
        assert_eq!(dispatch.ready.len(), 0);
        for lane in lanes {
            *dispatch.lane(lane) += 1;
        }
        assert_eq!(
            (
                dispatch.running,
                dispatch.remote_running,
                dispatch.free_running
            ),
            (1, 1, 1)
        );
        assert_eq!(dispatch.in_flight(), 3);
    }

    /// Only the pool's attempts and its held claims decide where a local
    /// task goes: agents' and no-op attempts take none of its slots.
    #[test]
    fn only_the_pool_and_its_claims_fill_the_pool() {
        let mut dispatch = Dispatch::default();
        *dispatch.lane(Lane::Agents) += 10;
        *dispatch.lane(Lane::Free) += 10;
        assert_eq!(dispatch.placement(2, true, 0), Placement::Here);
        *dispatch.lane(Lane::Pool) += 1;
        dispatch.claiming = 1;
        assert_eq!(dispatch.placement(2, true, 0), Placement::Wait);
        dispatch.claiming = 0;
        *dispatch.lane(Lane::Pool) += 1;
        assert_eq!(dispatch.placement(2, true, 0), Placement::Cluster);
        assert_eq!(dispatch.placement(2, false, 0), Placement::Wait);
    }
}
