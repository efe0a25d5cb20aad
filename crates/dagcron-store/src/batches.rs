//! Random write batches for the property tests of each backend's planned
//! write path against its one-write-at-a-time reference: the writes, the
//! rows they start from, what counts as outside the planned path's
//! contract, and a text snapshot of everything they can change.

use std::collections::{HashMap, HashSet};

use dagcron_core::{AttemptState, FireOutcome, RunState, TaskState};
use jiff::Timestamp;
use proptest::prelude::*;

use crate::conformance::new_run;
use crate::{Store, Write, WriteResult};

/// An instant `s` seconds after the epoch.
pub fn t(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

const TASKS: [TaskState; 6] = [
    TaskState::Pending,
    TaskState::Ready,
    TaskState::Dispatching,
    TaskState::Running,
    TaskState::Succeeded,
    TaskState::Cancelled,
];
const RUNS: [RunState; 4] = [
    RunState::Pending,
    RunState::Running,
    RunState::Succeeded,
    RunState::Cancelled,
];
const ATTEMPTS: [AttemptState; 5] = [
    AttemptState::Dispatching,
    AttemptState::Running,
    AttemptState::Succeeded,
    AttemptState::Failed,
    AttemptState::Lost,
];

/// Run 3 is made by a manual trigger, run 4 by a fire (`pending`), both in
/// the batches; runs 1 and 2 exist before.
fn made(run: i64) -> Write {
    if run == 3 {
        Write::Run(new_run(3, 300))
    } else {
        let mut four = new_run(4, 400);
        four.state = RunState::Pending;
        Write::Fire {
            namespace: "ns".into(),
            job: "j".into(),
            scheduled_at: t(400),
            outcome: FireOutcome::Fired,
            calendar: None,
            run: Some(four),
        }
    }
}

/// One write of the kinds the engine batches, on runs 1 to 4.
pub fn write() -> impl Strategy<Value = Write> {
    let run = 1..=4i64;
    let task = prop_oneof![Just("a".to_string()), Just("b".to_string())];
    prop_oneof![
        3 => (run.clone(), task.clone(), 0..6usize, 0..6usize).prop_map(|(run, task, f, to)| {
            Write::TaskState {
                run,
                task,
                from: TASKS[f],
                to: TASKS[to],
            }
        }),
        // The engine's own chain of a task: pending, ready, dispatching, running.
        2 => (run.clone(), task.clone(), 0..3usize).prop_map(|(run, task, f)| {
            Write::TaskState {
                run,
                task,
                from: TASKS[f],
                to: TASKS[f + 1],
            }
        }),
        1 => (3..=4i64).prop_map(made),
        1 => (run.clone(), 0..4usize).prop_map(|(run, to)| Write::RunClosing { run, to: RUNS[to] }),
        1 => (run.clone(), 0..4usize, 0..4usize, 0..100i64).prop_map(|(run, f, to, at)| {
            Write::RunState {
                run,
                from: RUNS[f],
                to: RUNS[to],
                at: t(at),
            }
        }),
        1 => (run.clone(), task.clone(), 1..=2u32, 0..2usize).prop_map(|(run, task, number, s)| {
            Write::AttemptStart {
                priority: Default::default(),
                run,
                task,
                number,
                state: ATTEMPTS[s],
                at: t(1),
                run_on: None,
            }
        }),
        1 => (run.clone(), task.clone(), 1..=2u32).prop_map(|(run, task, number)| {
            Write::AttemptWithdraw {
                run,
                task,
                number,
                at: t(3),
            }
        }),
        1 => (run.clone(), task.clone(), 0..3usize).prop_map(|(run, task, n)| Write::Expand {
            run,
            task,
            items: (0..n).map(|i| i.to_string()).collect(),
        }),
        1 => (run.clone(), task.clone(), any::<bool>()).prop_map(|(run, task, note)| Write::Gathered {
            run,
            task,
            note: note.then(|| "no items".to_string()),
            outputs: [("n".to_string(), "[\"1\"]".to_string())].into(),
        }),
        1 => (run, task, 1..=2u32, 0..2usize, 2..5usize, any::<bool>()).prop_map(
            |(run, task, number, f, to, failed)| Write::AttemptEnd {
                outputs: Default::default(),
                run,
                task,
                number,
                from: ATTEMPTS[f],
                to: ATTEMPTS[to],
                at: t(2),
                exit_code: failed.then_some(3),
                error: failed.then(|| "exit 3".to_string()),
                log: b"out".to_vec(),
                lines: Vec::new(), start_error_us: None,
                for_other_node: false,
            }
        ),
    ]
}

/// The rows a write changes or inserts.
fn rows(w: &Write) -> Vec<String> {
    match w {
        Write::TaskState { run, task, .. }
        | Write::AttemptWithdraw { run, task, .. }
        | Write::Gathered { run, task, .. } => {
            vec![format!("task {run}/{task}")]
        }
        Write::Expand { run, task, items } => {
            let mut rows = vec![format!("task {run}/{task}")];
            rows.extend(
                (0..items.len())
                    .map(|i| format!("task {run}/{}", dagcron_core::fan_out::instance_id(task, i))),
            );
            rows
        }
        Write::RunState { run, .. } => vec![format!("run {run}")],
        Write::RunClosing { run, .. } => vec![format!("closing {run}")],
        Write::AttemptStart {
            run, task, number, ..
        }
        | Write::AttemptEnd {
            run, task, number, ..
        } => vec![format!("attempt {run}/{task}/{number}")],
        Write::Run(run) | Write::Fire { run: Some(run), .. } => {
            let mut rows = vec![format!("run {}", run.id), format!("closing {}", run.id)];
            rows.extend(run.tasks.iter().map(|t| format!("task {}/{t}", run.id)));
            rows
        }
        Write::Fire { .. } => vec![],
        Write::Notify(n) => vec![format!("notification {}", n.key)],
        Write::Breaker(b) => vec![format!("breaker {}/{}", b.namespace, b.job)],
        Write::SlaMissed {
            namespace,
            job,
            scheduled_at,
            ..
        } => vec![format!("sla {namespace}/{job}/{scheduled_at}")],
    }
}

/// Batches whose meaning the planned path does not promise to keep: a
/// change of a row after a refused change of the same row, or a change
/// before the insert of its row (the engine produces neither).
pub fn outside_the_contract(batch: &[Write], reference: &[WriteResult]) -> bool {
    let mut refused: HashSet<String> = HashSet::new();
    let mut inserted_at: HashMap<String, usize> = HashMap::new();
    for (i, w) in batch.iter().enumerate() {
        if matches!(
            w,
            Write::AttemptStart { .. } | Write::Run(_) | Write::Fire { .. }
        ) {
            for row in rows(w) {
                inserted_at.entry(row).or_insert(i);
            }
        }
    }
    for (i, (w, r)) in batch.iter().zip(reference).enumerate() {
        let inserts = matches!(
            w,
            Write::AttemptStart { .. } | Write::Run(_) | Write::Fire { .. }
        );
        for row in rows(w) {
            if refused.contains(&row) {
                return true;
            }
            if !inserts && inserted_at.get(&row).is_some_and(|j| *j > i) {
                return true;
            }
        }
        if matches!(r, WriteResult::Conflict(_)) {
            refused.extend(rows(w));
        }
    }
    false
}

/// Whether `batch` starts an attempt of a task its run does not have (once
/// the batch is applied on `store`), or of a run the batch inserts later.
/// The engine writes neither; the embedded store keeps such an attempt
/// where no read sees it (until its run comes), and the PostgreSQL store,
/// which keeps attempts in their task, refuses it.
async fn starts_an_attempt_of_no_task(store: &impl Store, batch: &[Write]) -> bool {
    for (i, w) in batch.iter().enumerate() {
        if let Write::AttemptStart { run, task, .. } = w {
            let inserted_later = batch[i..].iter().any(
                |l| matches!(l, Write::Run(r) | Write::Fire { run: Some(r), .. } if r.id == *run),
            );
            let stored = store.get_run(*run).await.unwrap();
            if inserted_later || !stored.is_some_and(|r| r.tasks.iter().any(|t| t.id == *task)) {
                return true;
            }
        }
    }
    false
}

/// The rows the batches start from: runs 1 (task `a`) and 2 (tasks `a`
/// and `b`), each made by a fire.
pub fn seed() -> Vec<Write> {
    let mut two = new_run(2, 200);
    two.tasks = vec!["a".into(), "b".into()];
    vec![
        Write::Fire {
            namespace: "ns".into(),
            job: "j".into(),
            scheduled_at: t(100),
            outcome: FireOutcome::Fired,
            calendar: None,
            run: Some(new_run(1, 100)),
        },
        Write::Fire {
            namespace: "ns".into(),
            job: "j".into(),
            scheduled_at: t(200),
            outcome: FireOutcome::Fired,
            calendar: None,
            run: Some(two),
        },
    ]
}

/// Everything the writes can change, as text.
pub async fn snapshot(store: &impl Store) -> String {
    let mut out = String::new();
    for id in 1..=4 {
        let Some(run) = store.get_run(id).await.unwrap() else {
            out.push_str(&format!("{id} absent\n"));
            continue;
        };
        out.push_str(&format!(
            "{} {} {:?} {:?} {:?}\n",
            id, run.state, run.started_at, run.finished_at, run.closing
        ));
        for task in &run.tasks {
            out.push_str(&format!(
                "  {} {} {:?} {:?} {:?}\n",
                task.id, task.state, task.item, task.note, task.carried_outputs
            ));
            for a in &task.attempts {
                out.push_str(&format!(
                    "    {} {} {:?} {:?} {:?}\n",
                    a.number, a.state, a.finished_at, a.exit_code, a.error
                ));
            }
        }
    }
    out.push_str(&format!(
        "fires {:?}\n",
        store
            .list_fires("ns", "j", t(0), t(1000), 100)
            .await
            .unwrap()
            .len()
    ));
    out
}

/// Writes `batches` through the planned path and the reference path, one
/// batch after another, and checks that each batch means the same on
/// both: the same results and the same rows after it. It stops at the
/// first batch outside the planned path's contract.
pub async fn same_meaning(
    planned: &impl Store,
    reference: &impl Store,
    batches: &[Vec<Write>],
) -> Result<(), TestCaseError> {
    for batch in batches {
        let want = reference.write(batch).await;
        let got = planned.write(batch).await;
        let (want, got) = match (want, got) {
            (Ok(want), Ok(got)) => (want, got),
            (Err(_), Err(_)) => continue,
            (want, got) => {
                return Err(TestCaseError::fail(format!(
                    "{got:?} against {want:?} for {batch:?}"
                )));
            }
        };
        if outside_the_contract(batch, &want)
            || starts_an_attempt_of_no_task(reference, batch).await
        {
            return Ok(());
        }
        let kinds = |r: &[WriteResult]| {
            r.iter()
                .map(|x| matches!(x, WriteResult::Done))
                .collect::<Vec<_>>()
        };
        prop_assert_eq!(kinds(&got), kinds(&want), "batch {:?}", batch);
        prop_assert_eq!(
            snapshot(planned).await,
            snapshot(reference).await,
            "after {:?}",
            batch
        );
    }
    Ok(())
}
