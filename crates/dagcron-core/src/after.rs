//! Runs started by another job's run ending: `after: { job: extract, on:
//! [succeeded] }` makes a run of this job each time a run of `extract` (in
//! the same namespace) ends in one of the states of `on`.
//!
//! The engine makes the run in the commit that records the upstream run's
//! end, keyed by that run, so that it is made once across crashes,
//! failover and a batch committed twice. Jobs that wait for each other in
//! a circle would make runs forever: a cycle is refused when a file is
//! validated and when a job is applied ([`cycle`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::ValidationError;
use crate::state::RunState;

/// A job's `after`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfterTrigger {
    /// The job of the same namespace whose runs' ends start this job.
    pub job: String,
    /// The end states that start a run (default: `[succeeded]`).
    #[serde(default = "default_on")]
    pub on: Vec<AfterState>,
    /// Whether the upstream run's parameters are passed on (over this
    /// job's defaults).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_params: bool,
}

/// An end state of a run an `after` trigger waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterState {
    /// The run succeeded.
    Succeeded,
    /// The run failed.
    Failed,
    /// The run was cancelled.
    Cancelled,
}

fn default_on() -> Vec<AfterState> {
    vec![AfterState::Succeeded]
}

impl AfterTrigger {
    /// Whether a run of the upstream job that ended in `state` starts one.
    pub fn starts_on(&self, state: RunState) -> bool {
        let wanted = match state {
            RunState::Succeeded => AfterState::Succeeded,
            RunState::Failed => AfterState::Failed,
            RunState::Cancelled => AfterState::Cancelled,
            _ => return false,
        };
        self.on.contains(&wanted)
    }

    /// Every problem of the trigger of job `name`, at `at`.
    pub fn check(&self, name: &str, at: &str) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        let mut err = |path: String, message: String| {
            errors.push(ValidationError {
                path,
                message,
                span: None,
            })
        };
        if !crate::model::valid_name(&self.job) {
            err(
                format!("{at}.job"),
                format!("invalid job name {:?}", self.job),
            );
        } else if self.job == name {
            err(
                format!("{at}.job"),
                "a job cannot start after its own runs: each run would start the next, forever"
                    .into(),
            );
        }
        if self.on.is_empty() {
            err(
                format!("{at}.on"),
                "name at least one end state: succeeded, failed or cancelled".into(),
            );
        }
        errors
    }

    /// The key of the run it makes after upstream run `run` ended: one
    /// run per upstream run.
    pub fn key(run: i64) -> String {
        format!("after:run-{run}")
    }
}

/// A cycle among jobs that start after one another, given each job's
/// upstream job (`downstream → upstream`), as the job names around it
/// (`a → b → a`), if there is one that passes through one of `through`
/// (the jobs just applied; all if empty).
pub fn cycle(edges: &BTreeMap<String, String>, through: &BTreeSet<String>) -> Option<Vec<String>> {
    let starts: Vec<&String> = if through.is_empty() {
        edges.keys().collect()
    } else {
        through.iter().collect()
    };
    for start in starts {
        let mut path = vec![start.clone()];
        let mut at = start;
        // Each job has one upstream: follow the chain until it ends, comes
        // back to the start, or loops elsewhere.
        while let Some(next) = edges.get(at) {
            if next == start {
                path.push(next.clone());
                return Some(path);
            }
            if path.contains(next) || path.len() > edges.len() {
                break;
            }
            path.push(next.clone());
            at = next;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn edges(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(d, u)| (d.to_string(), u.to_string()))
            .collect()
    }

    #[test]
    fn cycles_are_found_with_their_path() {
        let none = BTreeSet::new();
        assert_eq!(cycle(&edges(&[("b", "a"), ("c", "b")]), &none), None);
        assert_eq!(
            cycle(&edges(&[("b", "a"), ("a", "b")]), &none),
            Some(vec!["a".into(), "b".into(), "a".into()])
        );
        let ring = edges(&[("a", "c"), ("b", "a"), ("c", "b"), ("x", "a")]);
        let through = BTreeSet::from(["b".to_string()]);
        assert_eq!(
            cycle(&ring, &through),
            Some(vec!["b".into(), "a".into(), "c".into(), "b".into()])
        );
        // A chain that leads into a cycle elsewhere is no cycle of its own.
        let x = BTreeSet::from(["x".to_string()]);
        assert_eq!(cycle(&ring, &x), None);
    }

    #[test]
    fn a_trigger_starts_on_the_states_it_names() {
        let t: AfterTrigger = serde_json::from_str(r#"{"job": "up"}"#).unwrap();
        assert!(t.starts_on(RunState::Succeeded));
        assert!(!t.starts_on(RunState::Failed));
        assert!(!t.starts_on(RunState::Running));
        let t: AfterTrigger =
            serde_json::from_str(r#"{"job": "up", "on": ["failed", "cancelled"]}"#).unwrap();
        assert!(t.starts_on(RunState::Failed) && t.starts_on(RunState::Cancelled));
        assert!(!t.starts_on(RunState::Succeeded));
    }

    #[test]
    fn its_problems_are_reported_at_their_paths() {
        let t: AfterTrigger = serde_json::from_str(r#"{"job": "me", "on": []}"#).unwrap();
        let paths: Vec<String> = t
            .check("me", "jobs[0].after")
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(paths, ["jobs[0].after.job", "jobs[0].after.on"]);
        let err = serde_json::from_str::<AfterTrigger>(r#"{"job": "x", "on": ["done"]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("succeeded"), "{err}");
    }

    #[test]
    fn a_circle_in_a_file_is_refused_at_its_path() {
        let file: crate::JobFile = serde_json::from_value(serde_json::json!({
            "namespace": "n",
            "jobs": [
                { "name": "a", "after": { "job": "b" }, "tasks": [{ "id": "t", "noop": true }] },
                { "name": "b", "after": { "job": "a" }, "tasks": [{ "id": "t", "noop": true }] },
                { "name": "c", "after": { "job": "elsewhere" }, "tasks": [{ "id": "t", "noop": true }] }
            ]
        }))
        .unwrap();
        let err = file.validate().unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!(err.0[0].path, "jobs[0].after.job");
        assert!(err.0[0].message.contains("a → b → a"), "{err}");
    }

    proptest! {
        /// Whatever the edges, the search ends, and a cycle it reports is
        /// one: each step follows an edge and it ends where it began.
        #[test]
        fn any_graph_is_searched_to_an_end(pairs in proptest::collection::vec((0u8..8, 0u8..8), 0..16)) {
            let edges: BTreeMap<String, String> =
                pairs.iter().map(|(d, u)| (d.to_string(), u.to_string())).collect();
            if let Some(path) = cycle(&edges, &BTreeSet::new()) {
                prop_assert_eq!(path.first(), path.last());
                for w in path.windows(2) {
                    prop_assert_eq!(edges.get(&w[0]), Some(&w[1]));
                }
            }
        }
    }
}
