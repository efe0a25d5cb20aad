//! The run state machine on its own: effect lists pinned by snapshots, and
//! random event sequences that never make an illegal transition and always
//! let every task end.

use super::*;
use crate::{JobFile, TriggerRule};
use proptest::prelude::*;

fn job(tasks: &str, extra: &str) -> Job {
    let yaml = format!(
        "namespace: ns\njobs:\n  - name: j\n    schedule: \"@daily\"\n{extra}    tasks:\n{tasks}"
    );
    let file: JobFile = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    file.validate().unwrap().remove(0)
}

/// a -> b, a -> c; b retried once after 10 s.
fn diamond() -> Job {
    job(
        "      - { id: a, noop: true }\n\
         \x20     - { id: b, depends_on: [a], shell: \"false\", retry: { max_attempts: 2, backoff: fixed, initial: 10s } }\n\
         \x20     - { id: c, depends_on: [a], noop: true }\n",
        "    deadline: 1h\n",
    )
}

fn t0() -> Timestamp {
    "2026-12-01T00:00:00Z".parse().unwrap()
}

/// Steps every event in order; renders the effects, one per line.
fn steps(job: &Job, run: &mut RunMachine, events: Vec<Event>) -> String {
    let mut text = String::new();
    for event in events {
        let mut out = Vec::new();
        let result = run.step(job, event.clone(), t0(), &mut || 0, &mut out);
        text.push_str(&format!("{event:?}\n"));
        for effect in out {
            text.push_str(&format!("  {}\n", render(job, &effect)));
        }
        if let Err(e) = result {
            text.push_str(&format!("  error: {e}\n"));
        }
    }
    text
}

fn render(job: &Job, effect: &Effect) -> String {
    // Instances are named by their slot: the job's tasks come first.
    let id = |task: &usize| match job.tasks.get(*task) {
        Some(t) => t.id.clone(),
        None => format!("#{task}"),
    };
    match effect {
        Effect::Expand { task, items } => format!("expand {} into {}", id(task), items.join(" ")),
        Effect::Note { task, note } => format!("note {}: {note}", id(task)),
        Effect::Run { from, to } => format!("run {from} -> {to}"),
        Effect::Closing { to } => format!("closing, to end {to}"),
        Effect::Task { task, from, to } => format!("task {} {from} -> {to}", id(task)),
        Effect::AttemptStarted {
            task,
            number,
            state,
        } => format!("attempt {}#{number} starts {state}", id(task)),
        Effect::AttemptEnded {
            task,
            number,
            from,
            to,
        } => format!("attempt {}#{number} {from} -> {to}", id(task)),
        Effect::Withdraw { task, number } => format!("withdraw {}#{number}", id(task)),
        Effect::Kill { task } => format!("kill {}", id(task)),
        Effect::Ready { task } => format!("queue {}", id(task)),
        Effect::ArmRetry { task, at } => format!("retry {} at {at}", id(task)),
        Effect::ArmDeadline { at } => format!("deadline at {at}"),
        Effect::Finished { state } => format!("finished {state}"),
    }
}

fn ended(task: usize, number: u32, end: End) -> Event {
    Event::AttemptEnded {
        task,
        number,
        end,
        recorded: false,
    }
}

#[test]
fn a_run_with_a_retry_from_begin_to_success() {
    let job = diamond();
    let mut run = RunMachine::new(3, RunState::Pending);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            Event::Dispatch {
                task: 0,
                shared: false,
            },
            ended(0, 1, End::Succeeded),
            Event::Dispatch {
                task: 1,
                shared: false,
            },
            Event::Dispatch {
                task: 2,
                shared: true,
            },
            ended(1, 1, End::Failed(Failure::Exit(Some(1)))),
            Event::Claimed {
                task: 2,
                number: 1,
                here: false,
            },
            Event::AttemptEnded {
                task: 2,
                number: 1,
                end: End::Succeeded,
                recorded: true,
            },
            Event::RetryDue { task: 1 },
            Event::Dispatch {
                task: 1,
                shared: false,
            },
            // A stale result of the first attempt changes nothing.
            ended(1, 1, End::Succeeded),
            ended(1, 2, End::Succeeded),
        ],
    );
    expect_test::expect![[r#"
        Begin
          run pending -> running
          deadline at 2026-12-01T01:00:00Z
          task a pending -> ready
          queue a
        Dispatch { task: 0, shared: false }
          task a ready -> dispatching
          task a dispatching -> running
          attempt a#1 starts running
        AttemptEnded { task: 0, number: 1, end: Succeeded, recorded: false }
          attempt a#1 running -> succeeded
          task a running -> succeeded
          task b pending -> ready
          queue b
          task c pending -> ready
          queue c
        Dispatch { task: 1, shared: false }
          task b ready -> dispatching
          task b dispatching -> running
          attempt b#1 starts running
        Dispatch { task: 2, shared: true }
          task c ready -> dispatching
          attempt c#1 starts dispatching
        AttemptEnded { task: 1, number: 1, end: Failed(Exit(Some(1))), recorded: false }
          attempt b#1 running -> failed
          task b running -> retrying
          retry b at 2026-12-01T00:00:10Z
        Claimed { task: 2, number: 1, here: false }
        AttemptEnded { task: 2, number: 1, end: Succeeded, recorded: true }
          task c running -> succeeded
        RetryDue { task: 1 }
          task b retrying -> ready
          queue b
        Dispatch { task: 1, shared: false }
          task b ready -> dispatching
          task b dispatching -> running
          attempt b#2 starts running
        AttemptEnded { task: 1, number: 1, end: Succeeded, recorded: false }
        AttemptEnded { task: 1, number: 2, end: Succeeded, recorded: false }
          attempt b#2 running -> succeeded
          task b running -> succeeded
          run running -> succeeded
          finished succeeded
    "#]]
    .assert_eq(&text);
}

#[test]
fn stopping_kills_what_runs_here_withdraws_what_is_shared_and_ends_once_all_have() {
    let job = job(
        "      - { id: a, noop: true }\n\
         \x20     - { id: b, noop: true }\n\
         \x20     - { id: c, noop: true }\n\
         \x20     - { id: d, depends_on: [a], noop: true }\n",
        "",
    );
    let mut run = RunMachine::new(4, RunState::Running);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            Event::Dispatch {
                task: 0,
                shared: false,
            },
            Event::Dispatch {
                task: 1,
                shared: true,
            },
            Event::Stop {
                final_state: RunState::Failed,
            },
            // Nothing starts or retries once the run is stopping.
            Event::Dispatch {
                task: 2,
                shared: false,
            },
            Event::Stop {
                final_state: RunState::Cancelled,
            },
            ended(0, 1, End::Cancelled),
        ],
    );
    expect_test::expect![[r#"
        Begin
          task a pending -> ready
          queue a
          task b pending -> ready
          queue b
          task c pending -> ready
          queue c
        Dispatch { task: 0, shared: false }
          task a ready -> dispatching
          task a dispatching -> running
          attempt a#1 starts running
        Dispatch { task: 1, shared: true }
          task b ready -> dispatching
          attempt b#1 starts dispatching
        Stop { final_state: Failed }
          closing, to end failed
          kill a
          withdraw b#1
          task c ready -> cancelled
          task d pending -> cancelled
        Dispatch { task: 2, shared: false }
        Stop { final_state: Cancelled }
          kill a
        AttemptEnded { task: 0, number: 1, end: Cancelled, recorded: false }
          attempt a#1 running -> cancelled
          task a running -> cancelled
          run running -> failed
          finished failed
    "#]]
    .assert_eq(&text);
    assert_eq!(run.state(), RunState::Failed);
}

#[test]
fn a_pending_run_stopped_is_cancelled_whatever_the_final_state_asked() {
    let job = diamond();
    let mut run = RunMachine::new(3, RunState::Pending);
    let text = steps(
        &job,
        &mut run,
        vec![Event::Stop {
            final_state: RunState::Failed,
        }],
    );
    expect_test::expect![[r#"
        Stop { final_state: Failed }
          run pending -> cancelled
          finished cancelled
    "#]]
    .assert_eq(&text);
}

#[test]
fn a_lost_attempt_is_retried_at_least_once_and_never_at_most_once() {
    for (delivery, expected) in [
        ("at_least_once", TaskState::Retrying),
        ("at_most_once", TaskState::Failed),
    ] {
        let job = job(
            "      - { id: a, shell: \"true\", retry: { max_attempts: 3 } }\n",
            &format!("    delivery: {delivery}\n"),
        );
        let mut run = RunMachine::new(1, RunState::Running);
        let mut out = Vec::new();
        let mut step = |run: &mut RunMachine, e| run.step(&job, e, t0(), &mut || 7, &mut out);
        step(&mut run, Event::Begin).unwrap();
        step(
            &mut run,
            Event::Dispatch {
                task: 0,
                shared: false,
            },
        )
        .unwrap();
        step(&mut run, ended(0, 1, End::Failed(Failure::Lost))).unwrap();
        assert_eq!(run.tasks()[0], expected, "{delivery}");
    }
}

#[test]
fn a_rebuilt_run_finishes_stopping_and_gives_up_its_lost_attempts() {
    let job = diamond();
    let running = |number| {
        Some(Attempt {
            number,
            state: AttemptState::Running,
            shared: false,
        })
    };
    let mut run = RunMachine::rebuilt(
        RunState::Running,
        Some(RunState::Cancelled),
        vec![
            StoredTask {
                state: TaskState::Succeeded,
                attempts: 1,
                current: None,
            },
            StoredTask {
                state: TaskState::Running,
                attempts: 1,
                current: running(1),
            },
            StoredTask {
                state: TaskState::Ready,
                attempts: 0,
                current: None,
            },
        ],
        vec![],
    );
    let text = steps(
        &job,
        &mut run,
        vec![
            ended(1, 1, End::Failed(Failure::Lost)),
            Event::Resume { started: t0() },
        ],
    );
    expect_test::expect![[r#"
        AttemptEnded { task: 1, number: 1, end: Failed(Lost), recorded: false }
          attempt b#1 running -> lost
          task b running -> failed
        Resume { started: 2026-12-01T00:00:00Z }
          task c ready -> cancelled
          run running -> cancelled
          finished cancelled
    "#]]
    .assert_eq(&text);
}

#[test]
fn a_change_outside_the_tables_is_an_error() {
    let job = diamond();
    // A stored row that says a task succeeded while its attempt runs.
    let mut run = RunMachine::rebuilt(
        RunState::Running,
        None,
        vec![
            StoredTask {
                state: TaskState::Succeeded,
                attempts: 1,
                current: Some(Attempt {
                    number: 1,
                    state: AttemptState::Running,
                    shared: false,
                }),
            },
            StoredTask {
                state: TaskState::Pending,
                attempts: 0,
                current: None,
            },
            StoredTask {
                state: TaskState::Pending,
                attempts: 0,
                current: None,
            },
        ],
        vec![],
    );
    let mut out = Vec::new();
    let err = run
        .step(&job, ended(0, 1, End::Succeeded), t0(), &mut || 0, &mut out)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "illegal task transition succeeded -> succeeded"
    );
}

#[test]
fn an_abandoned_attempt_is_lost_and_nothing_follows() {
    let job = diamond();
    let mut run = RunMachine::new(3, RunState::Running);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            Event::Dispatch {
                task: 0,
                shared: false,
            },
            Event::Abandoned { task: 0, number: 1 },
            ended(0, 1, End::Succeeded),
        ],
    );
    assert!(text.ends_with(
        "Abandoned { task: 0, number: 1 }\n  attempt a#1 running -> lost\nAttemptEnded { task: 0, number: 1, end: Succeeded, recorded: false }\n"
    ), "{text}");
    assert_eq!(run.tasks()[0], TaskState::Running, "left for the restart");
    // After the restart, the task is failed as lost and retried (or not).
    let mut rebuilt = RunMachine::rebuilt(
        RunState::Running,
        None,
        run.tasks()
            .iter()
            .map(|&state| StoredTask {
                state,
                attempts: 1,
                current: None,
            })
            .collect(),
        vec![],
    );
    let text = steps(&job, &mut rebuilt, vec![Event::Orphaned { task: 0 }]);
    expect_test::expect![[r#"
        Orphaned { task: 0 }
          task a running -> failed
          task b pending -> upstream_failed
          task c pending -> upstream_failed
          run running -> failed
          finished failed
    "#]]
    .assert_eq(&text);
}

/// a -> b -> c, and d on its own; b held once its two attempts fail.
fn held_chain() -> Job {
    job(
        "      - { id: a, noop: true }\n\
         \x20     - { id: b, depends_on: [a], shell: \"false\", on_exhausted: hold, retry: { max_attempts: 2, backoff: fixed, initial: 10s } }\n\
         \x20     - { id: c, depends_on: [b], noop: true }\n\
         \x20     - { id: d, shell: \"false\" }\n",
        "    deadline: 1h\n",
    )
}

fn dispatch(task: usize) -> Event {
    Event::Dispatch {
        task,
        shared: false,
    }
}

fn intervene(task: usize, action: Intervention) -> Event {
    Event::Intervene { task, action }
}

#[test]
fn a_held_task_waits_is_retried_past_its_attempts_and_marked_succeeded() {
    let job = held_chain();
    let mut run = RunMachine::new(4, RunState::Running);
    let fail = || End::Failed(Failure::Exit(Some(1)));
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            dispatch(0),
            dispatch(3),
            ended(0, 1, End::Succeeded),
            ended(3, 1, fail()),
            dispatch(1),
            ended(1, 1, fail()),
            Event::RetryDue { task: 1 },
            dispatch(1),
            ended(1, 2, fail()),
            // Held: the run waits; a retry by hand is attempt 3 of 2.
            intervene(1, Intervention::Retry),
            dispatch(1),
            ended(1, 3, fail()),
            intervene(1, Intervention::MarkSucceeded),
            dispatch(2),
            ended(2, 1, End::Succeeded),
        ],
    );
    expect_test::expect![[r#"
        Begin
          deadline at 2026-12-01T01:00:00Z
          task a pending -> ready
          queue a
          task d pending -> ready
          queue d
        Dispatch { task: 0, shared: false }
          task a ready -> dispatching
          task a dispatching -> running
          attempt a#1 starts running
        Dispatch { task: 3, shared: false }
          task d ready -> dispatching
          task d dispatching -> running
          attempt d#1 starts running
        AttemptEnded { task: 0, number: 1, end: Succeeded, recorded: false }
          attempt a#1 running -> succeeded
          task a running -> succeeded
          task b pending -> ready
          queue b
        AttemptEnded { task: 3, number: 1, end: Failed(Exit(Some(1))), recorded: false }
          attempt d#1 running -> failed
          task d running -> failed
        Dispatch { task: 1, shared: false }
          task b ready -> dispatching
          task b dispatching -> running
          attempt b#1 starts running
        AttemptEnded { task: 1, number: 1, end: Failed(Exit(Some(1))), recorded: false }
          attempt b#1 running -> failed
          task b running -> retrying
          retry b at 2026-12-01T00:00:10Z
        RetryDue { task: 1 }
          task b retrying -> ready
          queue b
        Dispatch { task: 1, shared: false }
          task b ready -> dispatching
          task b dispatching -> running
          attempt b#2 starts running
        AttemptEnded { task: 1, number: 2, end: Failed(Exit(Some(1))), recorded: false }
          attempt b#2 running -> failed
          task b running -> held
        Intervene { task: 1, action: Retry }
          task b held -> ready
          queue b
        Dispatch { task: 1, shared: false }
          task b ready -> dispatching
          task b dispatching -> running
          attempt b#3 starts running
        AttemptEnded { task: 1, number: 3, end: Failed(Exit(Some(1))), recorded: false }
          attempt b#3 running -> failed
          task b running -> held
        Intervene { task: 1, action: MarkSucceeded }
          task b held -> succeeded
          task c pending -> ready
          queue c
        Dispatch { task: 2, shared: false }
          task c ready -> dispatching
          task c dispatching -> running
          attempt c#1 starts running
        AttemptEnded { task: 2, number: 1, end: Succeeded, recorded: false }
          attempt c#1 running -> succeeded
          task c running -> succeeded
          run running -> failed
          finished failed
    "#]]
    .assert_eq(&text);
}

#[test]
fn a_failed_task_marked_while_its_run_goes_on_lets_its_downstream_run() {
    // a fails, b waits on c: the run goes on while c runs, and a is marked.
    let job = job(
        "      - { id: a, shell: \"false\" }\n\
         \x20     - { id: c, shell: \"true\" }\n\
         \x20     - { id: b, depends_on: [a, c], noop: true }\n\
         \x20     - { id: e, depends_on: [b], noop: true }\n",
        "",
    );
    let mut run = RunMachine::new(4, RunState::Running);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            dispatch(0),
            dispatch(1),
            ended(0, 1, End::Failed(Failure::Exit(Some(1)))),
            // Not held: nothing to retry or fail by hand.
            intervene(0, Intervention::Retry),
            intervene(0, Intervention::MarkSucceeded),
            ended(1, 1, End::Succeeded),
            dispatch(2),
            ended(2, 1, End::Succeeded),
            dispatch(3),
            ended(3, 1, End::Succeeded),
        ],
    );
    expect_test::expect![[r#"
        Begin
          task a pending -> ready
          queue a
          task c pending -> ready
          queue c
        Dispatch { task: 0, shared: false }
          task a ready -> dispatching
          task a dispatching -> running
          attempt a#1 starts running
        Dispatch { task: 1, shared: false }
          task c ready -> dispatching
          task c dispatching -> running
          attempt c#1 starts running
        AttemptEnded { task: 0, number: 1, end: Failed(Exit(Some(1))), recorded: false }
          attempt a#1 running -> failed
          task a running -> failed
          task b pending -> upstream_failed
          task e pending -> upstream_failed
        Intervene { task: 0, action: Retry }
        Intervene { task: 0, action: MarkSucceeded }
          task a failed -> succeeded
          task b upstream_failed -> pending
          task e upstream_failed -> pending
        AttemptEnded { task: 1, number: 1, end: Succeeded, recorded: false }
          attempt c#1 running -> succeeded
          task c running -> succeeded
          task b pending -> ready
          queue b
        Dispatch { task: 2, shared: false }
          task b ready -> dispatching
          task b dispatching -> running
          attempt b#1 starts running
        AttemptEnded { task: 2, number: 1, end: Succeeded, recorded: false }
          attempt b#1 running -> succeeded
          task b running -> succeeded
          task e pending -> ready
          queue e
        Dispatch { task: 3, shared: false }
          task e ready -> dispatching
          task e dispatching -> running
          attempt e#1 starts running
        AttemptEnded { task: 3, number: 1, end: Succeeded, recorded: false }
          attempt e#1 running -> succeeded
          task e running -> succeeded
          run running -> succeeded
          finished succeeded
    "#]]
    .assert_eq(&text);
    assert_eq!(
        run.may_intervene(0, Intervention::MarkSucceeded)
            .unwrap_err()
            .to_string(),
        "the run has ended succeeded: nothing of it can change; re-run it whole if it must run again (`runs rerun ID`)"
    );
}

#[test]
fn interventions_are_refused_outside_their_states_and_a_deadline_cancels_held_tasks() {
    let job = held_chain();
    let mut run = RunMachine::new(4, RunState::Running);
    let step = |run: &mut RunMachine, e| {
        let mut out = Vec::new();
        run.step(&job, e, t0(), &mut || 0, &mut out).unwrap();
        out
    };
    step(&mut run, Event::Begin);
    assert_eq!(
        run.may_intervene(0, Intervention::Fail)
            .unwrap_err()
            .to_string(),
        "the task is ready: only a held task can be given fail"
    );
    assert_eq!(
        run.may_intervene(2, Intervention::MarkSucceeded)
            .unwrap_err()
            .to_string(),
        "the task is pending: only a held, failed or upstream_failed task can be given mark_succeeded"
    );
    // A lost attempt at the last attempt: held too.
    let lost = End::Failed(Failure::Lost);
    for e in [
        dispatch(0),
        ended(0, 1, End::Succeeded),
        dispatch(1),
        ended(1, 1, lost.clone()),
        Event::RetryDue { task: 1 },
        dispatch(1),
        ended(1, 2, lost),
    ] {
        step(&mut run, e);
    }
    assert_eq!(run.tasks()[1], TaskState::Held);
    for action in Intervention::ALL {
        assert_eq!(run.may_intervene(1, *action), Ok(()), "{action:?}");
    }
    // The deadline: the held task is cancelled with the rest.
    let out = step(
        &mut run,
        Event::Stop {
            final_state: RunState::Failed,
        },
    );
    assert_eq!(
        run.may_intervene(1, Intervention::Retry),
        Err(Refused::Ended(RunState::Failed))
    );
    assert!(out.contains(&Effect::Task {
        task: 1,
        from: TaskState::Held,
        to: TaskState::Cancelled
    }));
    assert_eq!(run.tasks()[1], TaskState::Cancelled);
}

#[test]
fn a_task_holds_only_when_its_retries_are_exhausted_not_when_its_run_stops() {
    let job = held_chain();
    let mut run = RunMachine::new(4, RunState::Running);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            dispatch(0),
            ended(0, 1, End::Succeeded),
            dispatch(1),
            Event::Stop {
                final_state: RunState::Cancelled,
            },
            ended(1, 1, End::Failed(Failure::Exit(Some(1)))),
        ],
    );
    assert!(
        text.ends_with("attempt b#1 running -> failed\n  task b running -> failed\n  run running -> cancelled\n  finished cancelled\n"),
        "{text}"
    );
}

// ---- random event sequences ----

/// A job of up to six tasks, each depending on some earlier ones, with
/// random trigger rules, retries and delivery.
/// A task skipped by its condition, or by its exit code, counts for every
/// trigger rule downstream as a skipped task does; a condition reads the
/// run's parameters and its upstream tasks' outputs.
#[test]
fn a_condition_or_an_exit_code_skips_a_task_for_every_trigger_rule_downstream() {
    let mut table = String::new();
    for rule in TriggerRule::ALL {
        let mut ends = Vec::new();
        for how in ["when", "exit"] {
            let a = match how {
                "when" => {
                    "      - { id: a, shell: x, when: \"tasks.check.outputs.changed == 'true'\", depends_on: [check] }\n"
                }
                _ => "      - { id: a, shell: x, skip_on_exit_code: [99], depends_on: [check] }\n",
            };
            let tasks = format!(
                "      - {{ id: check, shell: x }}\n{a}      - {{ id: b, depends_on: [a], trigger_rule: {}, shell: x }}\n",
                rule.as_str()
            );
            let job = job(&tasks, "");
            let mut run = RunMachine::new(3, RunState::Running);
            let params = std::collections::BTreeMap::new();
            let outputs = [
                Some(std::sync::Arc::new(
                    [("changed".to_string(), "false".to_string())].into(),
                )),
                None,
                None,
            ];
            let data = RunData {
                params: &params,
                outputs: &outputs,
            };
            let mut out = Vec::new();
            let mut step = |run: &mut RunMachine, event| {
                run.step_with(&job, data, event, t0(), &mut || 0, &mut out)
                    .unwrap()
            };
            step(&mut run, Event::Begin);
            step(&mut run, dispatch(0));
            step(&mut run, ended(0, 1, End::Succeeded));
            if how == "exit" {
                step(&mut run, dispatch(1));
                step(&mut run, ended(1, 1, End::Skipped));
            }
            if run.tasks()[2] == TaskState::Ready {
                step(&mut run, dispatch(2));
                step(&mut run, ended(2, 1, End::Succeeded));
            }
            assert_eq!(run.tasks()[1], TaskState::Skipped, "{how}");
            ends.push((run.tasks()[2], run.state()));
        }
        assert_eq!(ends[0], ends[1], "{rule:?}: a skip is a skip");
        table.push_str(&format!(
            "{} -> b {}, run {}\n",
            rule.as_str(),
            ends[0].0,
            ends[0].1
        ));
    }
    expect_test::expect![[r#"
        all_success -> b skipped, run succeeded
        all_failed -> b skipped, run succeeded
        all_done -> b succeeded, run succeeded
        all_done_min_one_success -> b skipped, run succeeded
        all_skipped -> b succeeded, run succeeded
        one_failed -> b skipped, run succeeded
        one_success -> b skipped, run succeeded
        one_done -> b skipped, run succeeded
        none_failed -> b succeeded, run succeeded
        none_failed_min_one_success -> b skipped, run succeeded
        none_skipped -> b skipped, run succeeded
        always -> b succeeded, run succeeded
    "#]]
    .assert_eq(&table);
}

fn any_job() -> impl Strategy<Value = Job> {
    let rules = prop::sample::select(
        TriggerRule::ALL
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>(),
    );
    let task = (rules, 1..4u32, any::<u8>(), any::<bool>(), 0..3u8, 0..8u8);
    (
        prop::collection::vec(task, 1..7),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(tasks, at_most_once, deadline)| {
            let mut text = String::new();
            for (i, (rule, attempts, deps, hold, when, fan)) in tasks.iter().enumerate() {
                let deps: Vec<String> = (0..i)
                    .filter(|d| deps & (1 << d) != 0)
                    .map(|d| format!("t{d}"))
                    .collect();
                // With a condition that holds, one that does not, or none.
                let when = match when {
                    0 => "",
                    1 => ", when: \"params.go == 'yes'\"",
                    _ => ", when: \"params.go != 'yes'\"",
                };
                // Mapped over 0 to 3 items, some at most 1 or 2 at a
                // time, over a parameter's list, or over a missing one.
                let fan = match fan {
                    0 => ", for_each: []".to_string(),
                    1 | 2 => format!(", for_each: [a, b, c], max_parallel: {fan}"),
                    3 => ", for_each: [a]".to_string(),
                    4 => ", for_each: \"{{params.items}}\"".to_string(),
                    5 => ", for_each: \"{{params.none}}\"".to_string(),
                    _ => String::new(),
                };
                text.push_str(&format!(
                    "      - {{ id: t{i}, depends_on: [{}], trigger_rule: {rule}, shell: \"x\", skip_on_exit_code: [3], retry: {{ max_attempts: {attempts} }}, on_exhausted: {}{when}{fan} }}\n",
                    deps.join(", "),
                    if *hold { "hold" } else { "fail" }
                ));
            }
            let mut extra = String::new();
            if at_most_once {
                extra.push_str("    delivery: at_most_once\n");
            }
            if deadline {
                extra.push_str("    deadline: 1m\n");
            }
            job(&text, &extra)
        })
}

/// What the test does next, interpreted against the run as it is then
/// (the numbers pick a task, an attempt or an outcome).
#[derive(Clone, Debug)]
enum Act {
    Dispatch(u8, bool),
    End(u8, u8, bool),
    Claim(u8, bool),
    Retry(u8),
    Stop(bool),
    Stale(u8, u8),
    Intervene(u8, u8),
}

fn any_act() -> impl Strategy<Value = Act> {
    prop_oneof![
        4 => (any::<u8>(), any::<bool>()).prop_map(|(t, s)| Act::Dispatch(t, s)),
        4 => (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(t, e, r)| Act::End(t, e, r)),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(t, h)| Act::Claim(t, h)),
        2 => any::<u8>().prop_map(Act::Retry),
        1 => any::<bool>().prop_map(Act::Stop),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(t, n)| Act::Stale(t, n)),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(t, a)| Act::Intervene(t, a)),
    ]
}

fn end_of(pick: u8) -> End {
    match pick % 7 {
        0 | 1 => End::Succeeded,
        2 => End::Cancelled,
        3 => End::Failed(Failure::Exit(Some(1))),
        4 => End::Failed(Failure::Timeout),
        5 => End::Skipped,
        _ => End::Failed(Failure::Lost),
    }
}

/// The parameters the random runs have: `go` is `yes`.
fn go() -> std::collections::BTreeMap<String, String> {
    [
        ("go".to_string(), "yes".to_string()),
        ("items".to_string(), "[1, 2]".to_string()),
    ]
    .into()
}

/// Steps `event`, and checks its effects against a replay of the tasks'
/// states: each change starts where the previous one left the task.
fn step_checked(
    job: &Job,
    run: &mut RunMachine,
    shadow: &mut Vec<TaskState>,
    finished: &mut Option<RunState>,
    event: Event,
) -> Result<(), TestCaseError> {
    // A claim is recorded by the node that claims: the task runs there.
    if let Event::Claimed { task, .. }
    | Event::AttemptEnded {
        task,
        recorded: true,
        ..
    } = event
    {
        if shadow[task] == TaskState::Dispatching {
            shadow[task] = TaskState::Running;
        }
    }
    let mut out = Vec::new();
    let mut n = 0u64;
    let params = go();
    let data = RunData {
        params: &params,
        outputs: &[],
    };
    let result = run.step_with(
        job,
        data,
        event.clone(),
        t0(),
        &mut || {
            n += 1;
            n
        },
        &mut out,
    );
    prop_assert!(result.is_ok(), "{event:?}: {result:?}");
    for effect in &out {
        prop_assert!(
            finished.is_none(),
            "an effect after the run finished: {effect:?}"
        );
        match effect {
            Effect::Task { task, from, to } => {
                prop_assert_eq!(shadow[*task], *from);
                prop_assert!(from.to(*to).is_ok());
                shadow[*task] = *to;
            }
            Effect::Withdraw { task, .. } => shadow[*task] = TaskState::Cancelled,
            Effect::Finished { state } => *finished = Some(*state),
            Effect::Ready { task } => {
                let of = run.task_of(*task);
                prop_assert!(
                    data.runs(job, of),
                    "task {} started though its condition does not hold",
                    job.tasks[of].id
                );
                prop_assert!(
                    of != *task || job.tasks[of].for_each.is_none(),
                    "a mapped task runs nothing itself"
                );
            }
            Effect::Expand { task, items } => {
                prop_assert_eq!(shadow[*task], TaskState::Ready);
                prop_assert!(!items.is_empty());
                prop_assert_eq!(
                    run.instances(*task),
                    Some(shadow.len()..shadow.len() + items.len())
                );
                shadow.resize(shadow.len() + items.len(), TaskState::Pending);
            }
            _ => {}
        }
    }
    // Instances between ready and their end stay within `max_parallel`,
    // and a mapped task runs while any of its instances is unfinished.
    for (task, spec) in job.tasks.iter().enumerate() {
        let Some(slots) = run.instances(task) else {
            prop_assert!(spec.for_each.is_none() || run.tasks()[task] != TaskState::Running);
            continue;
        };
        let states = &run.tasks()[slots];
        let busy = states
            .iter()
            .filter(|s| !s.is_terminal() && **s != TaskState::Pending)
            .count();
        prop_assert!(busy <= spec.max_parallel.map_or(usize::MAX, |m| m as usize));
        if states.iter().any(|s| !s.is_terminal()) {
            prop_assert_eq!(run.tasks()[task], TaskState::Running);
        }
    }
    Ok(())
}

/// Tasks in `state`, by index.
fn in_state(run: &RunMachine, pred: impl Fn(usize, TaskState) -> bool) -> Vec<usize> {
    (0..run.tasks().len())
        .filter(|&i| pred(i, run.tasks()[i]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_events_never_break_the_tables_and_every_task_ends(
        job in any_job(),
        pending in any::<bool>(),
        planned in prop::option::of(any::<bool>()),
        acts in prop::collection::vec(any_act(), 0..60),
    ) {
        let declared = job.tasks.len();
        let start = match planned {
            Some(_) => RunState::Planned,
            None if pending => RunState::Pending,
            None => RunState::Running,
        };
        let mut run = RunMachine::new(declared, start);
        let mut shadow = vec![TaskState::Pending; declared];
        let mut finished = None;
        if let Some(skip) = planned {
            // A planned run's instant comes: declined, it ends untouched;
            // otherwise it waits for a slot like any pending run.
            step_checked(&job, &mut run, &mut shadow, &mut finished, Event::Due { skip })?;
            if skip {
                prop_assert_eq!(finished, Some(RunState::Skipped));
                prop_assert!(run.tasks().iter().all(|t| *t == TaskState::Pending));
                return Ok(());
            }
            prop_assert_eq!(run.state(), RunState::Pending);
        }
        step_checked(&job, &mut run, &mut shadow, &mut finished, Event::Begin)?;
        let pick = |v: &[usize], k: u8| (!v.is_empty()).then(|| v[k as usize % v.len()]);
        for act in acts {
            if finished.is_some() {
                break;
            }
            let n = run.tasks().len();
            let event = match act {
                Act::Dispatch(k, shared) => {
                    let Some(task) = pick(&in_state(&run, |_, s| s == TaskState::Ready), k) else { continue };
                    Event::Dispatch { task, shared }
                }
                Act::End(k, e, recorded) => {
                    let Some(task) = pick(&in_state(&run, |i, _| run.attempt(i).is_some()), k) else { continue };
                    let a = run.attempt(task).expect("attempt");
                    // A shared attempt's end is recorded by the node that ran
                    // it, unless that node died (the attempt is lost).
                    let end = end_of(e);
                    let lost = end == End::Failed(Failure::Lost) && !recorded;
                    Event::AttemptEnded { task, number: a.number, end, recorded: a.shared && !lost }
                }
                Act::Claim(k, here) => {
                    let Some(task) = pick(&in_state(&run, |i, _| run.attempt(i).is_some_and(|a| a.shared)), k) else { continue };
                    Event::Claimed { task, number: run.attempt(task).expect("attempt").number, here }
                }
                Act::Retry(k) => Event::RetryDue { task: k as usize % n },
                Act::Stop(failed) => Event::Stop { final_state: if failed { RunState::Failed } else { RunState::Cancelled } },
                Act::Stale(k, pick) => {
                    // The result of an attempt that is not the task's current one.
                    let task = k as usize % n;
                    let number = match run.attempt(task) {
                        Some(a) if pick % 2 == 0 && a.number > 1 => a.number - 1,
                        Some(a) => a.number + 1,
                        None => u32::from(pick % 3),
                    };
                    Event::AttemptEnded { task, number, end: End::Succeeded, recorded: false }
                }
                Act::Intervene(k, a) => {
                    // Any task, any action: those refused change nothing.
                    let task = k as usize % n;
                    let action = Intervention::ALL[a as usize % Intervention::ALL.len()];
                    let allowed = run.may_intervene(task, action).is_ok();
                    let before = run.tasks()[task];
                    let mut probe = run.clone();
                    let mut out = Vec::new();
                    let params = go();
                    let data = RunData { params: &params, outputs: &[] };
                    let stepped = probe.step_with(&job, data, Event::Intervene { task, action }, t0(), &mut || 0, &mut out);
                    prop_assert!(stepped.is_ok());
                    prop_assert_eq!(allowed, !out.is_empty(), "{:?} on {:?}", action, before);
                    if allowed {
                        prop_assert_eq!(probe.tasks()[task] != before, true);
                    }
                    Event::Intervene { task, action }
                }
            };
            step_checked(&job, &mut run, &mut shadow, &mut finished, event)?;
        }
        // Then the world behaves: every attempt ends, every retry comes due,
        // every ready task is dispatched; the run must finish.
        for _ in 0..200 {
            if finished.is_some() {
                break;
            }
            let mut events = Vec::new();
            for task in 0..run.tasks().len() {
                if let Some(a) = run.attempt(task) {
                    events.push(Event::AttemptEnded { task, number: a.number, end: End::Failed(Failure::Exit(Some(2))), recorded: a.shared });
                }
                match run.tasks()[task] {
                    TaskState::Ready => events.push(Event::Dispatch { task, shared: task % 2 == 0 }),
                    TaskState::Retrying => events.push(Event::RetryDue { task }),
                    // An operator settles every held task.
                    TaskState::Held => events.push(Event::Intervene { task, action: Intervention::ALL[1 + task % 3] }),
                    _ => {}
                }
            }
            prop_assert!(!events.is_empty(), "stuck: {:?}", run);
            for event in events {
                step_checked(&job, &mut run, &mut shadow, &mut finished, event)?;
            }
        }
        prop_assert!(finished.is_some(), "never finished: {:?}", run);
        prop_assert_eq!(Some(run.state()), finished);
        prop_assert!(run.tasks().iter().all(|t| t.is_terminal()), "{:?}", run.tasks());
        prop_assert_eq!(&shadow[..], run.tasks());
    }
}

/// a -> x (three items, two at a time, retried once) -> d.
fn fan_out() -> Job {
    job(
        "      - { id: a, noop: true }\n\
         \x20     - { id: x, depends_on: [a], shell: \"echo {{item}}\", for_each: [eu, us, 3], max_parallel: 2, retry: { max_attempts: 2, backoff: fixed, initial: 10s } }\n\
         \x20     - { id: d, depends_on: [x], noop: true }\n",
        "",
    )
}

#[test]
fn a_mapped_task_runs_its_instances_two_at_a_time_each_with_its_retries() {
    let job = fan_out();
    let mut run = RunMachine::new(3, RunState::Running);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            dispatch(0),
            ended(0, 1, End::Succeeded),
            dispatch(3),
            dispatch(4),
            ended(3, 1, End::Failed(Failure::Exit(Some(1)))),
            ended(4, 1, End::Succeeded),
            dispatch(5),
            Event::RetryDue { task: 3 },
            dispatch(3),
            ended(3, 2, End::Succeeded),
            ended(5, 1, End::Skipped),
        ],
    );
    expect_test::expect![[r#"
        Begin
          task a pending -> ready
          queue a
        Dispatch { task: 0, shared: false }
          task a ready -> dispatching
          task a dispatching -> running
          attempt a#1 starts running
        AttemptEnded { task: 0, number: 1, end: Succeeded, recorded: false }
          attempt a#1 running -> succeeded
          task a running -> succeeded
          task x pending -> ready
          expand x into "eu" "us" 3
          task x ready -> running
          task #3 pending -> ready
          queue #3
          task #4 pending -> ready
          queue #4
        Dispatch { task: 3, shared: false }
          task #3 ready -> dispatching
          task #3 dispatching -> running
          attempt #3#1 starts running
        Dispatch { task: 4, shared: false }
          task #4 ready -> dispatching
          task #4 dispatching -> running
          attempt #4#1 starts running
        AttemptEnded { task: 3, number: 1, end: Failed(Exit(Some(1))), recorded: false }
          attempt #3#1 running -> failed
          task #3 running -> retrying
          retry #3 at 2026-12-01T00:00:10Z
        AttemptEnded { task: 4, number: 1, end: Succeeded, recorded: false }
          attempt #4#1 running -> succeeded
          task #4 running -> succeeded
          task #5 pending -> ready
          queue #5
        Dispatch { task: 5, shared: false }
          task #5 ready -> dispatching
          task #5 dispatching -> running
          attempt #5#1 starts running
        RetryDue { task: 3 }
          task #3 retrying -> ready
          queue #3
        Dispatch { task: 3, shared: false }
          task #3 ready -> dispatching
          task #3 dispatching -> running
          attempt #3#2 starts running
        AttemptEnded { task: 3, number: 2, end: Succeeded, recorded: false }
          attempt #3#2 running -> succeeded
          task #3 running -> succeeded
        AttemptEnded { task: 5, number: 1, end: Skipped, recorded: false }
          attempt #5#1 running -> skipped
          task #5 running -> skipped
          task x running -> succeeded
          task d pending -> ready
          queue d
    "#]]
    .assert_eq(&text);
    assert_eq!(run.instances(1), Some(3..6));
    assert_eq!((run.task_of(4), run.task_of(2)), (1, 2));
    assert_eq!(run.instance_of(), [1, 1, 1]);
}

#[test]
fn a_mapped_task_fails_by_an_instance_and_is_decided_again_when_it_is_marked() {
    // x's second instance fails for good while `slow` keeps the run going;
    // its third is held, then marked.
    let job = job(
        "      - { id: slow, noop: true }\n\
         \x20     - { id: x, shell: \"echo {{item}}\", for_each: [1, 2, 3], retry: { max_attempts: 1 } }\n\
         \x20     - { id: d, depends_on: [x], noop: true }\n",
        "",
    );
    let mut run = RunMachine::new(3, RunState::Running);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            dispatch(0),
            dispatch(3),
            dispatch(4),
            dispatch(5),
            ended(3, 1, End::Succeeded),
            ended(4, 1, End::Failed(Failure::Exit(Some(1)))),
            ended(5, 1, End::Skipped),
            intervene(4, Intervention::MarkSucceeded),
            dispatch(2),
            ended(2, 1, End::Succeeded),
            ended(0, 1, End::Succeeded),
        ],
    );
    expect_test::expect![[r#"
        Begin
          task slow pending -> ready
          queue slow
          task x pending -> ready
          expand x into 1 2 3
          task x ready -> running
          task #3 pending -> ready
          queue #3
          task #4 pending -> ready
          queue #4
          task #5 pending -> ready
          queue #5
        Dispatch { task: 0, shared: false }
          task slow ready -> dispatching
          task slow dispatching -> running
          attempt slow#1 starts running
        Dispatch { task: 3, shared: false }
          task #3 ready -> dispatching
          task #3 dispatching -> running
          attempt #3#1 starts running
        Dispatch { task: 4, shared: false }
          task #4 ready -> dispatching
          task #4 dispatching -> running
          attempt #4#1 starts running
        Dispatch { task: 5, shared: false }
          task #5 ready -> dispatching
          task #5 dispatching -> running
          attempt #5#1 starts running
        AttemptEnded { task: 3, number: 1, end: Succeeded, recorded: false }
          attempt #3#1 running -> succeeded
          task #3 running -> succeeded
        AttemptEnded { task: 4, number: 1, end: Failed(Exit(Some(1))), recorded: false }
          attempt #4#1 running -> failed
          task #4 running -> failed
        AttemptEnded { task: 5, number: 1, end: Skipped, recorded: false }
          attempt #5#1 running -> skipped
          task #5 running -> skipped
          task x running -> failed
          task d pending -> upstream_failed
        Intervene { task: 4, action: MarkSucceeded }
          task #4 failed -> succeeded
          task x failed -> succeeded
          task d upstream_failed -> pending
          task d pending -> ready
          queue d
        Dispatch { task: 2, shared: false }
          task d ready -> dispatching
          task d dispatching -> running
          attempt d#1 starts running
        AttemptEnded { task: 2, number: 1, end: Succeeded, recorded: false }
          attempt d#1 running -> succeeded
          task d running -> succeeded
        AttemptEnded { task: 0, number: 1, end: Succeeded, recorded: false }
          attempt slow#1 running -> succeeded
          task slow running -> succeeded
          run running -> succeeded
          finished succeeded
    "#]]
    .assert_eq(&text);
}

#[test]
fn a_mapped_task_without_items_is_skipped_and_one_with_a_bad_list_fails() {
    let job = job(
        "      - { id: x, shell: \"echo {{item}}\", for_each: \"{{params.list}}\" }\n\
         \x20     - { id: d, depends_on: [x], trigger_rule: all_done, noop: true }\n",
        "",
    );
    let mut table = String::new();
    for list in [None, Some("[]"), Some("[1"), Some("{\"a\": 1}")] {
        let params: std::collections::BTreeMap<String, String> = list
            .map(|l| ("list".to_string(), l.to_string()))
            .into_iter()
            .collect();
        let data = RunData {
            params: &params,
            outputs: &[],
        };
        let mut run = RunMachine::new(2, RunState::Running);
        let mut out = Vec::new();
        run.step_with(&job, data, Event::Begin, t0(), &mut || 0, &mut out)
            .unwrap();
        table.push_str(&format!("{list:?}\n"));
        for effect in out {
            table.push_str(&format!("  {}\n", render(&job, &effect)));
        }
    }
    expect_test::expect![[r#"
        None
          task x pending -> ready
          note x: the run has no parameter `list` to take items from
          task x ready -> failed
          task d pending -> ready
          queue d
        Some("[]")
          task x pending -> ready
          note x: `for_each` gave no items: nothing to run
          task x ready -> skipped
          task d pending -> ready
          queue d
        Some("[1")
          task x pending -> ready
          note x: parameter `list`: `[1` is not a JSON array
          task x ready -> failed
          task d pending -> ready
          queue d
        Some("{\"a\": 1}")
          task x pending -> ready
          note x: parameter `list`: `{"a": 1}` is not a JSON array
          task x ready -> failed
          task d pending -> ready
          queue d
    "#]]
    .assert_eq(&table);
}

#[test]
fn a_re_run_keeps_the_expansion_and_runs_only_the_instances_it_did_not_carry() {
    let job = fan_out();
    use TaskState::*;
    let mut run = RunMachine::carrying(
        RunState::Running,
        vec![Succeeded, Pending, Pending, Succeeded, Pending, Succeeded],
        vec![1, 1, 1],
    );
    let text = steps(
        &job,
        &mut run,
        vec![Event::Begin, dispatch(4), ended(4, 1, End::Succeeded)],
    );
    expect_test::expect![[r#"
        Begin
          task x pending -> ready
          task x ready -> running
          task #4 pending -> ready
          queue #4
        Dispatch { task: 4, shared: false }
          task #4 ready -> dispatching
          task #4 dispatching -> running
          attempt #4#1 starts running
        AttemptEnded { task: 4, number: 1, end: Succeeded, recorded: false }
          attempt #4#1 running -> succeeded
          task #4 running -> succeeded
          task x running -> succeeded
          task d pending -> ready
          queue d
    "#]]
    .assert_eq(&text);
}

#[test]
fn stopping_a_run_cancels_the_instances_and_their_mapped_task_ends_with_them() {
    let job = fan_out();
    let mut run = RunMachine::new(3, RunState::Running);
    let text = steps(
        &job,
        &mut run,
        vec![
            Event::Begin,
            dispatch(0),
            ended(0, 1, End::Succeeded),
            dispatch(3),
            Event::Stop {
                final_state: RunState::Cancelled,
            },
            ended(3, 1, End::Cancelled),
        ],
    );
    expect_test::expect![[r#"
        Begin
          task a pending -> ready
          queue a
        Dispatch { task: 0, shared: false }
          task a ready -> dispatching
          task a dispatching -> running
          attempt a#1 starts running
        AttemptEnded { task: 0, number: 1, end: Succeeded, recorded: false }
          attempt a#1 running -> succeeded
          task a running -> succeeded
          task x pending -> ready
          expand x into "eu" "us" 3
          task x ready -> running
          task #3 pending -> ready
          queue #3
          task #4 pending -> ready
          queue #4
        Dispatch { task: 3, shared: false }
          task #3 ready -> dispatching
          task #3 dispatching -> running
          attempt #3#1 starts running
        Stop { final_state: Cancelled }
          closing, to end cancelled
          task d pending -> cancelled
          kill #3
          task #4 ready -> cancelled
          task #5 pending -> cancelled
        AttemptEnded { task: 3, number: 1, end: Cancelled, recorded: false }
          attempt #3#1 running -> cancelled
          task #3 running -> cancelled
          task x running -> cancelled
          run running -> cancelled
          finished cancelled
    "#]]
    .assert_eq(&text);
}

#[test]
fn a_re_run_that_carries_every_instance_ends_the_mapped_task_at_once() {
    let job = fan_out();
    use TaskState::*;
    let mut run = RunMachine::carrying(
        RunState::Running,
        vec![Succeeded, Pending, Pending, Succeeded, Skipped, Succeeded],
        vec![1, 1, 1],
    );
    let text = steps(&job, &mut run, vec![Event::Begin]);
    expect_test::expect![[r#"
        Begin
          task x pending -> ready
          task x ready -> running
          task x running -> succeeded
          task d pending -> ready
          queue d
    "#]]
    .assert_eq(&text);
}

/// The lists a mapped task hands downstream decide a `when` and feed
/// another fan-out in the step that ends it.
#[test]
fn gathered_outputs_decide_conditions_and_feed_a_fan_out_downstream() {
    let job = job(
        "      - { id: x, shell: \"x\", for_each: [1, 2] }\n\
         \x20     - { id: d, depends_on: [x], shell: \"x\", when: \"tasks.x.outputs.n == '[\\\"5\\\",\\\"6\\\"]'\" }\n\
         \x20     - { id: y, depends_on: [x], shell: \"x\", for_each: \"{{tasks.x.outputs.n}}\" }\n",
        "",
    );
    let mut run = RunMachine::new(3, RunState::Running);
    let five = |v: &str| Some(std::sync::Arc::new(Outputs::from([("n".into(), v.into())])));
    let mut outputs = vec![None, None, None, five("5"), five("6")];
    let mut text = String::new();
    for event in [
        Event::Begin,
        dispatch(3),
        dispatch(4),
        ended(3, 1, End::Succeeded),
        ended(4, 1, End::Succeeded),
    ] {
        outputs.resize(run.tasks().len().max(outputs.len()), None);
        let params = Default::default();
        let data = RunData {
            params: &params,
            outputs: &outputs,
        };
        let mut out = Vec::new();
        run.step_with(&job, data, event.clone(), t0(), &mut || 0, &mut out)
            .unwrap();
        text.push_str(&format!("{event:?}\n"));
        for effect in out {
            text.push_str(&format!("  {}\n", render(&job, &effect)));
        }
    }
    expect_test::expect![[r#"
        Begin
          task x pending -> ready
          expand x into 1 2
          task x ready -> running
          task #3 pending -> ready
          queue #3
          task #4 pending -> ready
          queue #4
        Dispatch { task: 3, shared: false }
          task #3 ready -> dispatching
          task #3 dispatching -> running
          attempt #3#1 starts running
        Dispatch { task: 4, shared: false }
          task #4 ready -> dispatching
          task #4 dispatching -> running
          attempt #4#1 starts running
        AttemptEnded { task: 3, number: 1, end: Succeeded, recorded: false }
          attempt #3#1 running -> succeeded
          task #3 running -> succeeded
        AttemptEnded { task: 4, number: 1, end: Succeeded, recorded: false }
          attempt #4#1 running -> succeeded
          task #4 running -> succeeded
          task x running -> succeeded
          task d pending -> ready
          queue d
          task y pending -> ready
          expand y into "5" "6"
          task y ready -> running
          task #5 pending -> ready
          queue #5
          task #6 pending -> ready
          queue #6
    "#]]
    .assert_eq(&text);
    assert_eq!(
        run.gathered_outputs(0).map(|o| o["n"].as_str()),
        Some(r#"["5","6"]"#)
    );
}
