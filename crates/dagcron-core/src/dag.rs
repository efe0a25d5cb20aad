//! The DAG of a job: validation (unknown or duplicate ids, cycles with their
//! path) and planning (which pending tasks become ready, and which can no
//! longer run).

use std::collections::HashMap;

use crate::model::{TaskSpec, TriggerRule};
use crate::state::TaskState;

/// Dependencies between a job's tasks, by index in declaration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dag {
    /// `upstream[i]`: the tasks `i` depends on.
    pub upstream: Vec<Vec<usize>>,
    /// `downstream[i]`: the tasks that depend on `i`.
    pub downstream: Vec<Vec<usize>>,
    /// A topological order.
    pub order: Vec<usize>,
}

/// A problem: (path relative to the job, message).
pub type DagError = (String, String);

impl Dag {
    /// Builds and checks the graph; reports every problem.
    pub fn build(tasks: &[TaskSpec]) -> Result<Dag, Vec<DagError>> {
        let mut errors = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, t) in tasks.iter().enumerate() {
            if let Some(first) = index.insert(&t.id, i) {
                errors.push((
                    format!("tasks[{i}].id"),
                    format!("duplicate task id {:?} (also tasks[{first}])", t.id),
                ));
                index.insert(&t.id, first);
            }
        }
        let mut upstream = vec![Vec::new(); tasks.len()];
        for (i, t) in tasks.iter().enumerate() {
            for (k, dep) in t.depends_on.iter().enumerate() {
                match index.get(dep.as_str()) {
                    Some(&j) if j == i => errors.push((
                        format!("tasks[{i}].depends_on[{k}]"),
                        format!("task {:?} depends on itself", t.id),
                    )),
                    Some(&j) if upstream[i].contains(&j) => errors.push((
                        format!("tasks[{i}].depends_on[{k}]"),
                        format!("{dep:?} is listed twice"),
                    )),
                    Some(&j) => upstream[i].push(j),
                    None => {
                        let known: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
                        errors.push((
                            format!("tasks[{i}].depends_on[{k}]"),
                            format!(
                                "unknown task {dep:?}; the job's tasks are: {}",
                                known.join(", ")
                            ),
                        ));
                    }
                }
            }
        }
        let mut downstream = vec![Vec::new(); tasks.len()];
        for (i, ups) in upstream.iter().enumerate() {
            for &j in ups {
                downstream[j].push(i);
            }
        }
        // Kahn's algorithm; what remains is on or behind a cycle.
        let mut indegree: Vec<usize> = upstream.iter().map(Vec::len).collect();
        let mut order: Vec<usize> = (0..tasks.len()).filter(|&i| indegree[i] == 0).collect();
        let mut head = 0;
        while head < order.len() {
            let i = order[head];
            head += 1;
            for &d in &downstream[i] {
                indegree[d] -= 1;
                if indegree[d] == 0 {
                    order.push(d);
                }
            }
        }
        if order.len() < tasks.len() && errors.is_empty() {
            let cycle = find_cycle(&upstream, &indegree);
            let names: Vec<&str> = cycle.iter().map(|&i| tasks[i].id.as_str()).collect();
            errors.push((
                format!("tasks[{}].depends_on", cycle[0]),
                format!("dependency cycle: {}", names.join(" -> ")),
            ));
        }
        if errors.is_empty() {
            Ok(Dag {
                upstream,
                downstream,
                order,
            })
        } else {
            Err(errors)
        }
    }

    /// Tasks grouped in waves: every task of a wave depends only on earlier waves.
    pub fn waves(&self) -> Vec<Vec<usize>> {
        let mut level = vec![0usize; self.upstream.len()];
        for &i in &self.order {
            level[i] = self.upstream[i]
                .iter()
                .map(|&u| level[u] + 1)
                .max()
                .unwrap_or(0);
        }
        let depth = level.iter().max().map_or(0, |m| m + 1);
        let mut waves = vec![Vec::new(); depth];
        for (i, l) in level.iter().enumerate() {
            waves[*l].push(i);
        }
        waves
    }

    /// Decides what pending tasks become: ready, upstream_failed or skipped.
    /// Returns (task index, new state) for every pending task whose fate is
    /// now known. Applying the changes and planning again is how a run
    /// advances; a task is never left pending once all its upstream tasks are
    /// finished.
    pub fn plan(&self, rules: &[TriggerRule], states: &[TaskState]) -> Vec<(usize, TaskState)> {
        let mut out = Vec::new();
        for i in 0..self.upstream.len() {
            if states[i] != TaskState::Pending {
                continue;
            }
            let ups = &self.upstream[i];
            let done = ups.iter().filter(|&&u| states[u].is_terminal()).count();
            let failed = ups
                .iter()
                .any(|&u| matches!(states[u], TaskState::Failed | TaskState::UpstreamFailed));
            let skipped = ups
                .iter()
                .any(|&u| matches!(states[u], TaskState::Skipped | TaskState::Cancelled));
            let all_done = done == ups.len();
            let next = match rules[i] {
                TriggerRule::Always => Some(TaskState::Ready),
                TriggerRule::AllDone => all_done.then_some(TaskState::Ready),
                TriggerRule::AllSuccess if failed => Some(TaskState::UpstreamFailed),
                TriggerRule::AllSuccess if skipped => Some(TaskState::Skipped),
                TriggerRule::AllSuccess => all_done.then_some(TaskState::Ready),
                TriggerRule::OneFailed if failed => Some(TaskState::Ready),
                TriggerRule::OneFailed => all_done.then_some(TaskState::Skipped),
            };
            if let Some(s) = next {
                out.push((i, s));
            }
        }
        out
    }
}

/// A cycle among the nodes Kahn's algorithm could not order.
fn find_cycle(upstream: &[Vec<usize>], indegree: &[usize]) -> Vec<usize> {
    let stuck = |i: usize| indegree[i] > 0;
    let start = (0..upstream.len())
        .find(|&i| stuck(i))
        .expect("a stuck node");
    // Walk upstream through stuck nodes until a node repeats.
    let mut path = vec![start];
    let mut seen = HashMap::from([(start, 0usize)]);
    let mut cur = start;
    loop {
        let next = *upstream[cur]
            .iter()
            .find(|&&u| stuck(u))
            .expect("a stuck node has a stuck upstream");
        if let Some(&pos) = seen.get(&next) {
            let mut cycle: Vec<usize> = path[pos..].to_vec();
            cycle.reverse(); // upstream first: a -> b means b depends on a
            // Start at the first declared task, so the message is stable.
            let first = (0..cycle.len())
                .min_by_key(|&k| cycle[k])
                .expect("non-empty");
            cycle.rotate_left(first);
            cycle.push(cycle[0]);
            return cycle;
        }
        seen.insert(next, path.len());
        path.push(next);
        cur = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tasks(spec: &[(&str, &[&str])]) -> Vec<TaskSpec> {
        spec.iter()
            .map(|(id, deps)| TaskSpec {
                id: id.to_string(),
                depends_on: deps.iter().map(|d| d.to_string()).collect(),
                trigger_rule: TriggerRule::AllSuccess,
                timeout: None,
                retry: None,
                shell: None,
                http: None,
                noop: false,
                run_on: None,
            })
            .collect()
    }

    #[test]
    fn cycles_are_reported_with_their_path() {
        let err = Dag::build(&tasks(&[
            ("a", &[]),
            ("b", &["a", "d"]),
            ("c", &["b"]),
            ("d", &["c"]),
        ]))
        .unwrap_err();
        assert_eq!(
            err,
            [(
                "tasks[1].depends_on".to_string(),
                "dependency cycle: b -> c -> d -> b".to_string()
            )]
        );
    }

    #[test]
    fn unknown_duplicate_and_self_dependencies() {
        let err = Dag::build(&tasks(&[
            ("a", &["a"]),
            ("a", &[]),
            ("c", &["x", "a", "a"]),
        ]))
        .unwrap_err();
        let msgs: Vec<String> = err.iter().map(|(p, m)| format!("{p}: {m}")).collect();
        assert_eq!(
            msgs,
            [
                "tasks[1].id: duplicate task id \"a\" (also tasks[0])",
                "tasks[0].depends_on[0]: task \"a\" depends on itself",
                "tasks[2].depends_on[0]: unknown task \"x\"; the job's tasks are: a, a, c",
                "tasks[2].depends_on[2]: \"a\" is listed twice",
            ]
        );
    }

    #[test]
    fn waves_group_parallel_tasks() {
        let dag = Dag::build(&tasks(&[
            ("load", &["t1", "t2"]),
            ("extract", &[]),
            ("t1", &["extract"]),
            ("t2", &["extract"]),
        ]))
        .unwrap();
        assert_eq!(dag.waves(), [vec![1], vec![2, 3], vec![0]]);
    }

    #[test]
    fn trigger_rules() {
        use TaskState::*;
        let dag = Dag::build(&tasks(&[
            ("a", &[]),
            ("b", &["a"]),
            ("c", &["a"]),
            ("d", &["a"]),
            ("e", &["a"]),
        ]))
        .unwrap();
        let rules = [
            TriggerRule::AllSuccess,
            TriggerRule::AllSuccess,
            TriggerRule::AllDone,
            TriggerRule::OneFailed,
            TriggerRule::Always,
        ];
        assert_eq!(dag.plan(&rules, &[Pending; 5]), [(0, Ready), (4, Ready)]);
        assert_eq!(
            dag.plan(&rules, &[Running, Pending, Pending, Pending, Running]),
            []
        );
        assert_eq!(
            dag.plan(&rules, &[Succeeded, Pending, Pending, Pending, Running]),
            [(1, Ready), (2, Ready), (3, Skipped)]
        );
        assert_eq!(
            dag.plan(&rules, &[Failed, Pending, Pending, Pending, Running]),
            [(1, UpstreamFailed), (2, Ready), (3, Ready)]
        );
        assert_eq!(
            dag.plan(&rules, &[Skipped, Pending, Pending, Pending, Running]),
            [(1, Skipped), (2, Ready), (3, Skipped)]
        );
    }

    /// Random DAGs (edges only from lower to higher index, so acyclic) with
    /// random outcomes: planning to a fixed point leaves no task pending, and
    /// no task becomes ready before its all_success upstream succeeded.
    fn random_dag() -> impl Strategy<Value = (Vec<TaskSpec>, Vec<TriggerRule>, Vec<bool>)> {
        (2usize..12).prop_flat_map(|n| {
            let edges = prop::collection::vec(prop::collection::vec(any::<bool>(), n), n);
            let rules = prop::collection::vec(
                prop_oneof![
                    Just(TriggerRule::AllSuccess),
                    Just(TriggerRule::AllDone),
                    Just(TriggerRule::OneFailed),
                    Just(TriggerRule::Always)
                ],
                n,
            );
            let outcomes = prop::collection::vec(any::<bool>(), n);
            (edges, rules, outcomes).prop_map(move |(edges, rules, outcomes)| {
                let specs = (0..n)
                    .map(|i| TaskSpec {
                        id: format!("t{i}"),
                        depends_on: (0..i)
                            .filter(|&j| edges[i][j])
                            .map(|j| format!("t{j}"))
                            .collect(),
                        trigger_rule: rules[i],
                        timeout: None,
                        retry: None,
                        shell: None,
                        http: None,
                        noop: false,
                        run_on: None,
                    })
                    .collect();
                (specs, rules, outcomes)
            })
        })
    }

    proptest! {
        #[test]
        fn planning_terminates_and_respects_dependencies((specs, rules, outcomes) in random_dag(), shuffle in any::<u64>()) {
            let dag = Dag::build(&specs).unwrap();
            let mut states = vec![TaskState::Pending; specs.len()];
            let mut rounds = 0;
            loop {
                rounds += 1;
                prop_assert!(rounds <= specs.len() * 2 + 2, "planning did not converge");
                let changes = dag.plan(&rules, &states);
                let ready: Vec<usize> = changes.iter().filter(|c| c.1 == TaskState::Ready).map(|c| c.0).collect();
                for (i, s) in &changes {
                    if *s == TaskState::Ready && rules[*i] == TriggerRule::AllSuccess {
                        prop_assert!(dag.upstream[*i].iter().all(|&u| states[u] == TaskState::Succeeded));
                    }
                    states[*i] = *s;
                }
                // Run the ready tasks in an arbitrary order; each succeeds or fails.
                let mut ready = ready;
                ready.sort_by_key(|i| (*i as u64).wrapping_mul(shuffle | 1) % 97);
                for i in &ready {
                    states[*i] = if outcomes[*i] { TaskState::Succeeded } else { TaskState::Failed };
                }
                if changes.is_empty() {
                    break;
                }
            }
            prop_assert!(states.iter().all(|s| s.is_terminal()), "left behind: {:?}", states);
        }
    }
}
