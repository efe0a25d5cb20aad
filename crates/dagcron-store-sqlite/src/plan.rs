//! Planning a batch of writes for a backend that applies it grouped by
//! kind (one statement per kind over arrays): successive changes of one
//! row (`pending -> ready -> running`) merge into one compare-and-set from
//! the first state to the last, which succeeds or is refused as a whole.
//! Nothing here is SQL; a backend turns a [`Plan`] into statements.

use dagcron_core::{AttemptState, RunState, TaskState};
use smallvec::{SmallVec, smallvec};

use dagcron_store::{NewRun, RunId, Write};

/// The maps of a plan are keyed by rows the engine made, hashed with
/// foldhash (seeded per process): with SipHash, hashing the keys was a
/// fifth of planning, itself a tenth of the SQLite writer's time in a
/// burst of runs.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Merged changes of one row: the writes they came from, the first
/// expected state, the final state, and when each transition happened.
pub(crate) struct Chain<'a, S> {
    /// Positions of the merged writes in the batch. Held inline: a chain
    /// is a few changes of one row, and a batch has a chain for every row
    /// it changes (an allocation each was a third of planning).
    pub(crate) writes: SmallVec<[usize; 4]>,
    /// The state the first write expects.
    pub(crate) from: S,
    /// The state the last one leaves.
    pub(crate) to: S,
    /// For runs: when it entered `running`, and when it finished.
    pub(crate) started: Option<i64>,
    /// When it finished.
    pub(crate) finished: Option<i64>,
    /// For attempts: the last write's result fields.
    pub(crate) end: Option<&'a Write>,
}

/// Groups successive changes per row key; `None` if some change does not
/// start from the state the previous one left.
fn chains<'a, K, S>(
    items: impl Iterator<Item = (usize, K, S, S, Option<i64>, &'a Write)>,
    capacity: usize,
) -> Option<Vec<(K, Chain<'a, S>)>>
where
    K: std::hash::Hash + Eq + Clone,
    S: Copy + PartialEq + AsStateName,
{
    let mut order: Vec<(K, Chain<'a, S>)> = Vec::with_capacity(capacity);
    let mut index: HashMap<K, usize> =
        HashMap::with_capacity_and_hasher(capacity, Default::default());
    for (i, key, from, to, at, write) in items {
        match index.get(&key) {
            Some(&k) => {
                let chain = &mut order[k].1;
                if chain.to != from {
                    return None;
                }
                chain.writes.push(i);
                chain.to = to;
                chain.end = Some(write);
                note_times(chain, to, at);
            }
            None => {
                index.insert(key.clone(), order.len());
                let mut chain = Chain {
                    writes: smallvec![i],
                    from,
                    to,
                    started: None,
                    finished: None,
                    end: Some(write),
                };
                note_times(&mut chain, to, at);
                order.push((key, chain));
            }
        }
    }
    Some(order)
}

/// State names, and which of them start or end a run.
pub(crate) trait AsStateName: Sized {
    /// The stored name.
    fn name(self) -> &'static str;
    /// Whether entering it starts a run.
    fn starts(self) -> bool {
        false
    }
    /// Whether entering it ends a run.
    fn ends(self) -> bool {
        false
    }
}

impl AsStateName for RunState {
    fn name(self) -> &'static str {
        self.as_str()
    }
    fn starts(self) -> bool {
        self == RunState::Running
    }
    fn ends(self) -> bool {
        self.is_terminal()
    }
}

impl AsStateName for TaskState {
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl AsStateName for AttemptState {
    fn name(self) -> &'static str {
        self.as_str()
    }
}

fn note_times<S: AsStateName + Copy>(chain: &mut Chain<'_, S>, to: S, at: Option<i64>) {
    if to.starts() {
        chain.started = at;
    }
    if to.ends() {
        chain.finished = at;
    }
}

/// A batch, grouped: the merged changes of each run, task and attempt row,
/// in the order of their first write.
pub(crate) struct Plan<'a> {
    /// By run.
    pub(crate) runs: Vec<(RunId, Chain<'a, RunState>)>,
    /// By (run, task).
    pub(crate) tasks: Vec<((RunId, &'a str), Chain<'a, TaskState>)>,
    /// Where each task row's chain is in `tasks`.
    task_index: HashMap<(RunId, &'a str), usize>,
}

impl Plan<'_> {
    /// The state each task of `run` is inserted in, when write `at` of the
    /// batch inserts it: the state its chain of changes in the batch leaves
    /// it in, if the chain comes after the insert and starts from the state
    /// the insert would give it (then every change of the chain succeeds,
    /// applied by the insert; the chain's index in `tasks` comes with it,
    /// and `folded` is set for it); otherwise its start state.
    pub(crate) fn inserted_task_states(
        &self,
        run: &NewRun,
        at: usize,
        folded: &mut [bool],
    ) -> Vec<(TaskState, Option<usize>)> {
        run.tasks
            .iter()
            .map(|task| {
                let start = run.task_start(task);
                match self.task_index.get(&(run.id, task.as_str())) {
                    Some(&k)
                        if !folded[k]
                            && self.tasks[k].1.from == start
                            && self.tasks[k].1.writes[0] > at =>
                    {
                        folded[k] = true;
                        (self.tasks[k].1.to, Some(k))
                    }
                    _ => (start, None),
                }
            })
            .collect()
    }
}

/// How many writes of each kind a batch holds.
#[derive(Default)]
struct Counts {
    runs: usize,
    tasks: usize,
    ends: usize,
    fires: usize,
    starts: usize,
    withdrawals: usize,
}

/// Plans `batch`; `None` when it cannot be grouped (a change that does not
/// start where the previous change of its row left it, two ends of one
/// attempt, a fire or an attempt inserted twice, a run with a key): it must then be applied
/// one write at a time, with the same results.
pub(crate) fn plan(batch: &[Write]) -> Option<Plan<'_>> {
    // A run with a key may be refused, and a mapped task's expansion adds
    // tasks: one write at a time (they are rare).
    if batch.iter().any(|w| {
        matches!(w, Write::Run(run) if run.key.is_some())
            || matches!(w, Write::Expand { .. } | Write::Gathered { .. })
    }) {
        return None;
    }
    // Counted first, so that no map or list of the plan grows as it fills.
    let mut count = Counts::default();
    for w in batch {
        match w {
            Write::RunState { .. } => count.runs += 1,
            Write::TaskState { .. } => count.tasks += 1,
            Write::AttemptEnd { .. } => count.ends += 1,
            Write::Fire { .. } => count.fires += 1,
            Write::AttemptStart { .. } => count.starts += 1,
            Write::AttemptWithdraw { .. } => count.withdrawals += 1,
            Write::Run(_)
            | Write::Expand { .. }
            | Write::Gathered { .. }
            | Write::RunClosing { .. }
            | Write::Notify(_)
            | Write::Breaker(_)
            | Write::SlaMissed { .. } => {}
        }
    }
    let runs = chains(
        batch.iter().enumerate().filter_map(|(i, w)| match w {
            Write::RunState { run, from, to, at } => {
                Some((i, *run, *from, *to, Some(at.as_microsecond()), w))
            }
            _ => None,
        }),
        count.runs,
    )?;
    let tasks = chains(
        batch.iter().enumerate().filter_map(|(i, w)| match w {
            Write::TaskState {
                run,
                task,
                from,
                to,
            } => Some((i, (*run, task.as_str()), *from, *to, None, w)),
            _ => None,
        }),
        count.tasks,
    )?;
    let ends = chains(
        batch.iter().enumerate().filter_map(|(i, w)| match w {
            Write::AttemptEnd {
                run,
                task,
                number,
                from,
                to,
                ..
            } => Some((i, (*run, task.as_str(), *number), *from, *to, None, w)),
            _ => None,
        }),
        count.ends,
    )?;
    if ends.iter().any(|(_, c)| c.writes.len() > 1) {
        return None;
    }
    let mut fire_keys = HashSet::with_capacity_and_hasher(count.fires, Default::default());
    let mut start_keys = HashSet::with_capacity_and_hasher(count.starts, Default::default());
    for w in batch {
        let fresh = match w {
            Write::Fire {
                namespace,
                job,
                scheduled_at,
                ..
            } => fire_keys.insert((
                namespace.as_str(),
                job.as_str(),
                scheduled_at.as_microsecond(),
            )),
            Write::AttemptStart {
                run, task, number, ..
            } => start_keys.insert((*run, task.as_str(), *number)),
            _ => true,
        };
        if !fresh {
            return None;
        }
    }

    // A withdrawal is applied after the changes it is grouped with: none
    // may follow it on the same task.
    if count.withdrawals > 0 {
        let mut withdrawn = HashSet::default();
        for w in batch {
            match w {
                Write::AttemptWithdraw { run, task, .. } => {
                    withdrawn.insert((*run, task.as_str()));
                }
                Write::TaskState { run, task, .. }
                | Write::AttemptStart { run, task, .. }
                | Write::AttemptEnd { run, task, .. }
                    if withdrawn.contains(&(*run, task.as_str())) =>
                {
                    return None;
                }
                _ => {}
            }
        }
    }
    let task_index = tasks
        .iter()
        .enumerate()
        .map(|(k, (key, _))| (*key, k))
        .collect();
    Some(Plan {
        runs,
        tasks,
        task_index,
    })
}
