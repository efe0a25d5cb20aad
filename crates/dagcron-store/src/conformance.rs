//! The conformance suite: behaviour every [`Store`] backend must show.
//!
//! A backend's tests call [`crate::conformance_tests!`] with an expression
//! that builds a fresh, empty store and a guard that cleans it up when
//! dropped (`(store, guard)`); each case becomes one test.

use std::collections::BTreeMap;

use dagcron_core::{AttemptState, FireOutcome, RunState, TaskState};
use jiff::Timestamp;

use dagcron_core::Rules;

use crate::{
    Actor, ApplyResult, BreakerWrite, DeliveryAttempt, DeliveryEnd, JobSummary, JobUpsert,
    NewNotification, NewRun, NotificationRecord, NotificationState, Origin, RunFilter, RunId,
    RunRecord, StorageError, Store, Trigger, Write, WriteResult,
};

/// Generates one `#[tokio::test]` per conformance case.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            apply_is_idempotent_and_versioned,
            versions_record_who_when_and_rollbacks,
            new_rules_make_a_new_version_and_old_versions_are_stamped,
            a_rerun_starts_with_the_outcomes_it_carries,
            a_mapped_task_expands_once_into_instances_after_the_tasks,
            held_runs_are_the_unfinished_runs_of_a_namespace_with_a_held_task,
            pause_delete_and_list_jobs,
            start_up_reads_each_jobs_timing,
            paused_in_a_file_and_through_the_api,
            tokens_are_found_by_their_hash_and_revoked,
            the_audit_log_is_one_chain,
            secrets_are_kept_per_namespace,
            settings_are_set_replaced_and_cleared,
            a_fire_is_recorded_once,
            concurrent_fires_create_one_run,
            state_changes_are_compare_and_set,
            a_stop_is_recorded_with_its_final_state,
            a_withdrawn_attempt_is_cancelled_claimed_or_not,
            changes_of_one_row_in_a_batch_apply_in_order,
            attempts_and_logs,
            runs_are_paginated_newest_first,
            a_job_summary_is_its_last_runs_and_its_fires_counted,
            the_runs_browser_filters_across_jobs_newest_first,
            the_overview_finds_paused_jobs_and_fires_that_made_no_run,
            fires_and_recovery_queries,
            a_suppressed_fire_keeps_its_calendar,
            planned_runs_wait_soonest_first_and_count_as_unfinished,
            retention_reads_the_history_and_prunes_only_what_may_go,
            a_deleted_job_is_forgotten_once_its_runs_are_gone,
            the_outbox_keeps_one_row_a_key_and_one_holder_at_a_time,
            a_recovery_is_told_by_the_last_run_that_succeeded_or_failed,
            a_breaker_opens_at_the_nth_failure_in_a_row_and_closes_once,
            a_run_key_makes_one_run_per_job_until_it_is_pruned,
            an_sla_miss_is_recorded_once_with_its_notifications,
        );
    };
    (@cases $make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (store, _guard) = $make.await;
                $crate::conformance::$case(&store).await;
            }
        )+
    };
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("valid")
}

fn job(ns: &str, name: &str, spec: &str) -> JobUpsert {
    JobUpsert {
        namespace: ns.into(),
        name: name.into(),
        spec: spec.into(),
        timing: spec.into(),
        paused: false,
        origin: Origin::default(),
        rules: Some(rules(1, "2026a", "aa")),
    }
}

/// Rules of cron semantics `cron`, database `tzdb`, Europe/Berlin's digest `berlin`.
fn rules(cron: u32, tzdb: &str, berlin: &str) -> Rules {
    Rules {
        cron,
        tzdb: tzdb.into(),
        zones: BTreeMap::from([("Europe/Berlin".to_string(), berlin.to_string())]),
    }
}

fn by(id: &str) -> Option<Actor> {
    Some(Actor {
        id: id.into(),
        name: format!("name of {id}"),
    })
}

/// A run of job `ns/j` with tasks a and b.
pub fn new_run(id: i64, scheduled: i64) -> NewRun {
    NewRun {
        items: Default::default(),
        carried_outputs: Default::default(),
        id,
        namespace: "ns".into(),
        job: "j".into(),
        job_version: 1,
        trigger: Trigger::Schedule,
        scheduled_at: t(scheduled),
        params: BTreeMap::from([("region".to_string(), "eu".to_string())]),
        state: RunState::Running,
        tasks: vec!["a".into(), "b".into()],
        created_at: t(scheduled),
        trace: None,
        rerun_of: None,
        carried: BTreeMap::new(),
        key: None,
    }
}

fn fire(scheduled: i64, run: Option<NewRun>) -> Write {
    let outcome = if run.is_some() {
        FireOutcome::Fired
    } else {
        FireOutcome::SkippedOverlap
    };
    Write::Fire {
        namespace: "ns".into(),
        job: "j".into(),
        scheduled_at: t(scheduled),
        outcome,
        calendar: None,
        run,
    }
}

/// A fire suppressed by an exclusion calendar is listed with the
/// calendar's name, alone or in a batch of fires (grouped by a backend that
/// groups), beside fires that have none.
pub async fn a_suppressed_fire_keeps_its_calendar<S: Store>(s: &S) {
    s.apply_jobs(&[job("ns", "j", "{}")], t(1)).await.unwrap();
    let suppressed = |at: i64, calendar: &str| Write::Fire {
        namespace: "ns".into(),
        job: "j".into(),
        scheduled_at: t(at),
        outcome: FireOutcome::Suppressed,
        calendar: Some(calendar.into()),
        run: None,
    };
    s.write(&[suppressed(100, "holidays")]).await.unwrap();
    s.write(&[
        fire(200, Some(new_run(1, 200))),
        suppressed(300, "maintenance"),
        fire(400, None),
    ])
    .await
    .unwrap();
    let fires = s.list_fires("ns", "j", t(0), t(1000), 10).await.unwrap();
    assert_eq!(
        fires
            .iter()
            .map(|f| (f.scheduled_at.as_second(), f.outcome, f.calendar.as_deref()))
            .collect::<Vec<_>>(),
        [
            (100, FireOutcome::Suppressed, Some("holidays")),
            (200, FireOutcome::Fired, None),
            (300, FireOutcome::Suppressed, Some("maintenance")),
            (400, FireOutcome::SkippedOverlap, None),
        ]
    );
}

/// Applying the same spec twice changes nothing; a new spec makes a new version.
pub async fn apply_is_idempotent_and_versioned<S: Store>(s: &S) {
    let r = s
        .apply_jobs(&[job("ns", "a", "{1}"), job("ns", "b", "{1}")], t(10))
        .await
        .unwrap();
    assert_eq!(r, [ApplyResult::Created(1), ApplyResult::Created(1)]);
    let r = s
        .apply_jobs(&[job("ns", "a", "{1}"), job("ns", "b", "{2}")], t(20))
        .await
        .unwrap();
    assert_eq!(r, [ApplyResult::Unchanged(1), ApplyResult::Updated(2)]);
    let b = s.get_job("ns", "b").await.unwrap().unwrap();
    assert_eq!(
        (b.version, b.spec.as_str(), b.updated_at),
        (2, "{2}", t(20))
    );
    assert_eq!(
        s.get_job("ns", "a").await.unwrap().unwrap().updated_at,
        t(10),
        "unchanged jobs keep their timestamp"
    );
    assert!(
        s.get_job("other", "a").await.unwrap().is_none(),
        "namespaces are separate"
    );
}

/// Every version records when and by whom it was applied, and whether it
/// rolled back to an older one; versions list newest first, page by page,
/// survive the job's deletion and continue when it is created again.
pub async fn versions_record_who_when_and_rollbacks<S: Store>(s: &S) {
    let as_of = |spec: &str, who: &str, rollback_of: Option<i64>| JobUpsert {
        origin: Origin {
            by: by(who),
            rollback_of,
        },
        ..job("ns", "j", spec)
    };
    s.apply_jobs(&[as_of("{1}", "tok_a", None)], t(10))
        .await
        .unwrap();
    s.apply_jobs(&[as_of("{1}", "tok_b", None)], t(15))
        .await
        .unwrap();
    s.apply_jobs(&[as_of("{2}", "tok_b", None)], t(20))
        .await
        .unwrap();
    let r = s
        .apply_jobs(&[as_of("{1}", "tok_c", Some(1))], t(30))
        .await
        .unwrap();
    assert_eq!(r, [ApplyResult::Updated(3)], "a rollback is a new version");
    s.apply_jobs(&[job("other", "j", "{9}")], t(30))
        .await
        .unwrap();

    let v3 = s.get_job_version("ns", "j", 3).await.unwrap().unwrap();
    assert_eq!(v3.spec, "{1}");
    assert_eq!(
        (v3.info.version, v3.info.applied_at, &v3.info.origin),
        (
            3,
            t(30),
            &Origin {
                by: by("tok_c"),
                rollback_of: Some(1)
            }
        )
    );
    assert_eq!(v3.info.rules, Some(rules(1, "2026a", "aa")));
    let v1 = s.get_job_version("ns", "j", 1).await.unwrap().unwrap();
    assert_eq!(
        (v1.spec.as_str(), v1.info.applied_at, v1.info.origin.by),
        ("{1}", t(10), by("tok_a")),
        "an unchanged apply records nothing"
    );
    assert_eq!(s.get_job_version("ns", "j", 4).await.unwrap(), None);
    assert_eq!(s.get_job_version("ns", "j", 0).await.unwrap(), None);
    assert_eq!(s.get_job_version("nope", "j", 1).await.unwrap(), None);

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = s
            .list_job_versions("ns", "j", 2, cursor.as_deref())
            .await
            .unwrap();
        seen.extend(page.items.iter().map(|v| v.version));
        assert!(
            page.items
                .iter()
                .all(|v| v.namespace == "ns" && v.name == "j")
        );
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, [3, 2, 1], "newest first");
    assert!(matches!(
        s.list_job_versions("ns", "j", 2, Some("job:x")).await,
        Err(StorageError::Invalid(_))
    ));

    // Deleted, the job keeps its versions; created again, it continues them.
    assert!(s.delete_job("ns", "j").await.unwrap());
    let kept = s.list_job_versions("ns", "j", 10, None).await.unwrap();
    assert_eq!(kept.items.len(), 3);
    let r = s
        .apply_jobs(&[as_of("{2}", "tok_a", None)], t(40))
        .await
        .unwrap();
    assert_eq!(r, [ApplyResult::Created(4)]);
    let newest = &s.list_job_versions("ns", "j", 1, None).await.unwrap().items[0];
    assert_eq!((newest.version, newest.origin.by.clone()), (4, by("tok_a")));
    assert!(
        s.list_job_versions("nope", "j", 10, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// A spec applied again under other rules for one of its zones (or other
/// cron semantics) is a new version recorded with them; a new database
/// that leaves its zones as they were is not. Versions stored without
/// rules are stamped once, and keep the rules they have.
pub async fn new_rules_make_a_new_version_and_old_versions_are_stamped<S: Store>(s: &S) {
    let under = |rules: Option<Rules>| JobUpsert {
        rules,
        ..job("ns", "j", "{1}")
    };
    s.apply_jobs(&[under(Some(rules(1, "2026a", "aa")))], t(1))
        .await
        .unwrap();
    let stored = |v: i64| async move {
        let job = s.get_job("ns", "j").await.unwrap().unwrap();
        let version = s.get_job_version("ns", "j", v).await.unwrap().unwrap();
        (job.version, job.rules, version.info.rules)
    };
    let same_zones = rules(1, "2026b", "aa");
    let r = s
        .apply_jobs(&[under(Some(same_zones))], t(2))
        .await
        .unwrap();
    assert_eq!(r, [ApplyResult::Unchanged(1)]);
    let berlin_moved = rules(1, "2026b", "bb");
    let r = s
        .apply_jobs(&[under(Some(berlin_moved.clone()))], t(3))
        .await
        .unwrap();
    assert_eq!(r, [ApplyResult::Updated(2)]);
    assert_eq!(
        stored(2).await,
        (2, Some(berlin_moved.clone()), Some(berlin_moved.clone()))
    );
    let r = s
        .apply_jobs(&[under(Some(rules(2, "2026b", "bb")))], t(4))
        .await
        .unwrap();
    assert_eq!(r, [ApplyResult::Updated(3)], "new cron semantics");

    // A version without rules (none known when applied).
    s.apply_jobs(
        &[JobUpsert {
            rules: None,
            ..job("ns", "old", "{1}")
        }],
        t(5),
    )
    .await
    .unwrap();
    let old = s.get_job("ns", "old").await.unwrap().unwrap();
    assert_eq!(old.rules, None);
    let r = s
        .apply_jobs(&[job("ns", "old", "{1}")], t(6))
        .await
        .unwrap();
    assert_eq!(
        r,
        [ApplyResult::Unchanged(1)],
        "unknown rules count as the same"
    );
    let stamp = rules(1, "2026c", "cc");
    s.stamp_rules(&[
        ("ns".into(), "old".into(), 1, stamp.clone()),
        ("ns".into(), "j".into(), 3, stamp.clone()),
        ("ns".into(), "missing".into(), 1, stamp.clone()),
    ])
    .await
    .unwrap();
    let old = s.get_job("ns", "old").await.unwrap().unwrap();
    assert_eq!(old.rules.as_ref(), Some(&stamp));
    let v = s.get_job_version("ns", "old", 1).await.unwrap().unwrap();
    assert_eq!(v.info.rules.as_ref(), Some(&stamp));
    assert_eq!(
        stored(3).await.2,
        Some(rules(2, "2026b", "bb")),
        "recorded rules stay"
    );
}

/// The runs with a held task are listed per namespace, oldest first,
/// unfinished only, up to the limit.
pub async fn held_runs_are_the_unfinished_runs_of_a_namespace_with_a_held_task<S: Store>(s: &S) {
    let held = |id: i64, namespace: &str| NewRun {
        namespace: namespace.into(),
        carried: BTreeMap::from([("b".to_string(), TaskState::Held)]),
        ..new_run(id, id)
    };
    s.write(&[
        Write::Run(held(3, "ns")),
        Write::Run(held(1, "ns")),
        Write::Run(new_run(2, 2)),
        Write::Run(held(4, "other")),
        Write::Run(held(5, "ns")),
        Write::RunState {
            run: 5,
            from: RunState::Running,
            to: RunState::Failed,
            at: t(6),
        },
    ])
    .await
    .unwrap();
    let ids = |runs: Vec<crate::RunRecord>| runs.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(s.held_runs("ns", 10).await.unwrap()), [1, 3]);
    assert_eq!(ids(s.held_runs("ns", 1).await.unwrap()), [1]);
    assert_eq!(ids(s.held_runs("other", 10).await.unwrap()), [4]);
    let r = s.held_runs("ns", 1).await.unwrap().remove(0);
    assert_eq!(
        (r.tasks[0].state, r.tasks[1].state),
        (TaskState::Pending, TaskState::Held)
    );
}

/// A re-run records the run it re-runs and starts its carried tasks in
/// their outcome, with no attempt; it moves on like any run.
pub async fn a_rerun_starts_with_the_outcomes_it_carries<S: Store>(s: &S) {
    s.write(&[fire(100, Some(new_run(1, 100)))]).await.unwrap();
    let rerun = NewRun {
        id: 2,
        trigger: Trigger::Rerun,
        created_at: t(500),
        rerun_of: Some(1),
        carried: BTreeMap::from([("a".to_string(), TaskState::Succeeded)]),
        carried_outputs: BTreeMap::from([(
            "a".to_string(),
            BTreeMap::from([("rows".to_string(), "42".to_string())]),
        )]),
        ..new_run(2, 100)
    };
    s.write(&[Write::Run(rerun)]).await.unwrap();
    let r = s.get_run(2).await.unwrap().unwrap();
    // The carried task keeps the outputs it had, for the tasks run again.
    assert_eq!(r.tasks[0].outputs().map(|o| o["rows"].as_str()), Some("42"));
    assert_eq!(r.tasks[1].outputs(), None);
    assert_eq!(
        (r.trigger, r.rerun_of, r.scheduled_at, r.created_at),
        (Trigger::Rerun, Some(1), t(100), t(500))
    );
    let tasks: Vec<(&str, TaskState, bool, usize)> = r
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.state, t.carried, t.attempts.len()))
        .collect();
    assert_eq!(
        tasks,
        [
            ("a", TaskState::Succeeded, true, 0),
            ("b", TaskState::Pending, false, 0)
        ]
    );
    assert_eq!(s.get_run(1).await.unwrap().unwrap().rerun_of, None);
    let results = s
        .write(&[
            Write::TaskState {
                run: 2,
                task: "b".into(),
                from: TaskState::Pending,
                to: TaskState::Ready,
            },
            Write::TaskState {
                run: 2,
                task: "a".into(),
                from: TaskState::Pending,
                to: TaskState::Ready,
            },
        ])
        .await
        .unwrap();
    assert_eq!(results[0], WriteResult::Done);
    assert!(
        matches!(&results[1], WriteResult::Conflict(_)),
        "a carried task is finished: {results:?}"
    );
}

/// A mapped task's instances are tasks after the run's own, with their
/// items; the expansion is recorded once; its end keeps a note and the
/// gathered outputs; a re-run keeps instances with their items.
pub async fn a_mapped_task_expands_once_into_instances_after_the_tasks<S: Store>(s: &S) {
    s.write(&[fire(100, Some(new_run(1, 100)))]).await.unwrap();
    let expand = |items: &[&str]| Write::Expand {
        run: 1,
        task: "a".into(),
        items: items.iter().map(|i| i.to_string()).collect(),
    };
    let results = s
        .write(&[
            expand(&["\"eu\"", "{\"n\":2}"]),
            Write::TaskState {
                run: 1,
                task: "a[1]".into(),
                from: TaskState::Pending,
                to: TaskState::Ready,
            },
        ])
        .await
        .unwrap();
    assert_eq!(results, [WriteResult::Done, WriteResult::Done]);
    let again = s.write(&[expand(&["1"])]).await.unwrap();
    assert!(
        matches!(&again[0], WriteResult::Conflict(m) if m.contains("expanded already")),
        "{again:?}"
    );
    let none = s
        .write(&[Write::Expand {
            run: 1,
            task: "zz".into(),
            items: vec!["1".into()],
        }])
        .await
        .unwrap();
    assert!(matches!(&none[0], WriteResult::Conflict(_)), "{none:?}");
    let gathered = BTreeMap::from([("n".to_string(), "[\"1\",null]".to_string())]);
    s.write(&[
        Write::Gathered {
            run: 1,
            task: "b".into(),
            note: Some("`for_each` gave no items: nothing to run".into()),
            outputs: Default::default(),
        },
        Write::Gathered {
            run: 1,
            task: "a".into(),
            note: None,
            outputs: gathered.clone(),
        },
    ])
    .await
    .unwrap();
    let r = s.get_run(1).await.unwrap().unwrap();
    let tasks: Vec<(&str, TaskState, Option<&str>, Option<&str>)> = r
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.state, t.item.as_deref(), t.note.as_deref()))
        .collect();
    assert_eq!(
        tasks,
        [
            ("a", TaskState::Pending, None, None),
            (
                "b",
                TaskState::Pending,
                None,
                Some("`for_each` gave no items: nothing to run")
            ),
            ("a[0]", TaskState::Pending, Some("\"eu\""), None),
            ("a[1]", TaskState::Ready, Some("{\"n\":2}"), None),
        ]
    );
    assert_eq!(r.tasks[0].outputs(), Some(&gathered));
    // A re-run keeping the expansion, its first instance carried.
    let rerun = NewRun {
        id: 2,
        trigger: Trigger::Rerun,
        rerun_of: Some(1),
        tasks: ["a", "b", "a[0]", "a[1]"].map(String::from).to_vec(),
        carried: BTreeMap::from([("a[0]".to_string(), TaskState::Succeeded)]),
        items: BTreeMap::from([
            ("a[0]".to_string(), "\"eu\"".to_string()),
            ("a[1]".to_string(), "{\"n\":2}".to_string()),
        ]),
        ..new_run(2, 100)
    };
    s.write(&[Write::Run(rerun)]).await.unwrap();
    let r = s.get_run(2).await.unwrap().unwrap();
    let tasks: Vec<(&str, TaskState, Option<&str>)> = r
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.state, t.item.as_deref()))
        .collect();
    assert_eq!(
        tasks,
        [
            ("a", TaskState::Pending, None),
            ("b", TaskState::Pending, None),
            ("a[0]", TaskState::Succeeded, Some("\"eu\"")),
            ("a[1]", TaskState::Pending, Some("{\"n\":2}")),
        ]
    );
}

/// Pause, resume, delete, and list with pagination.
pub async fn pause_delete_and_list_jobs<S: Store>(s: &S) {
    let jobs: Vec<JobUpsert> = (0..5)
        .map(|i| job("ns", &format!("job-{i}"), "{}"))
        .collect();
    s.apply_jobs(&jobs, t(1)).await.unwrap();
    s.apply_jobs(&[job("other", "x", "{}")], t(1))
        .await
        .unwrap();
    assert!(s.set_paused("ns", "job-1", true).await.unwrap());
    assert!(s.get_job("ns", "job-1").await.unwrap().unwrap().paused);
    assert!(!s.set_paused("ns", "missing", true).await.unwrap());
    assert!(s.delete_job("ns", "job-4").await.unwrap());
    assert!(!s.delete_job("ns", "job-4").await.unwrap());
    let p1 = s.list_jobs("ns", 3, None).await.unwrap();
    let names: Vec<&str> = p1.items.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["job-0", "job-1", "job-2"]);
    let p2 = s
        .list_jobs("ns", 3, p1.next_cursor.as_deref())
        .await
        .unwrap();
    let names: Vec<&str> = p2.items.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["job-3"]);
    assert_eq!(p2.next_cursor, None);
    // Every job, in (namespace, name) order, a page at a time across namespaces.
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = s.load_jobs(after.as_ref(), 2).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some((last.namespace.clone(), last.name.clone()));
        pages.push(
            page.iter()
                .map(|j| format!("{}/{}", j.namespace, j.name))
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(
        pages,
        [
            vec!["ns/job-0", "ns/job-1"],
            vec!["ns/job-2", "ns/job-3"],
            vec!["other/x"]
        ]
    );
    let mut all = 0;
    crate::load_all_jobs(s, |_| all += 1).await.unwrap();
    assert_eq!(all, 5);
}

/// What start-up reads of each job makes the timing of its current
/// version, with the job's version, pause and rules, in the order and
/// pages of [`JobStore::load_jobs`].
pub async fn start_up_reads_each_jobs_timing<S: Store>(s: &S) {
    let file = |schedule: &str| {
        let spec = serde_json::json!({
            "name": "j",
            "schedule": schedule,
            "timezone": "Europe/Berlin",
            "misfire": "run_once",
            "tasks": [{"id": "a", "noop": true}],
        });
        dagcron_core::JobFile {
            namespace: "ns".into(),
            calendars: vec![],
            notifiers: vec![],
            notify: vec![],
            jobs: vec![serde_json::from_value(spec).expect("a job spec")],
        }
        .validate()
        .expect("valid")
        .remove(0)
    };
    let (first, second) = (file("0 0 3 * * *"), file("0 30 4 * * *"));
    let other = JobUpsert {
        namespace: "other".into(),
        ..JobUpsert::of(&first)
    };
    s.apply_jobs(&[JobUpsert::of(&first), other], t(1))
        .await
        .unwrap();
    s.apply_jobs(&[JobUpsert::of(&second)], t(2)).await.unwrap();
    assert!(s.set_paused("ns", "j", true).await.unwrap());
    let rows = s.load_job_timings(None, 1).await.unwrap();
    assert_eq!(rows.len(), 1);
    let ns = &rows[0];
    assert_eq!((ns.namespace.as_str(), ns.name.as_str()), ("ns", "j"));
    assert_eq!((ns.version, ns.paused), (2, true));
    assert_eq!(ns.updated_at, t(2));
    assert_eq!(ns.rules, Some(second.rules()));
    let mut cache = dagcron_core::timings::TimetableCache::new();
    let timing = cache.timing_from_canonical("ns", &ns.timing).unwrap();
    assert_eq!(
        format!("{:?}", timing.timing),
        format!("{:?}", second.timing())
    );
    let after = Some(("ns".to_string(), "j".to_string()));
    let rows = s.load_job_timings(after.as_ref(), 1).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].namespace, "other");
    let timing = cache
        .timing_from_canonical("other", &rows[0].timing)
        .unwrap();
    let first_there = dagcron_core::Job::from_canonical("other", &first.canonical()).unwrap();
    assert_eq!(
        format!("{:?}", timing.timing),
        format!("{:?}", first_there.timing())
    );
    let after = Some(("other".to_string(), "j".to_string()));
    assert!(
        s.load_job_timings(after.as_ref(), 1)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A job file's `paused` decides when the job is new or when the file's
/// `paused` changed; otherwise a pause or resume through the API stands.
pub async fn paused_in_a_file_and_through_the_api<S: Store>(s: &S) {
    let file = |spec: &str, paused: bool| JobUpsert {
        paused,
        ..job("ns", "j", spec)
    };
    let paused = async || s.get_job("ns", "j").await.unwrap().unwrap().paused;
    s.apply_jobs(&[file(r#"{"paused":true}"#, true)], t(1))
        .await
        .unwrap();
    assert!(paused().await, "a new job applied paused is stored paused");
    // Resumed through the API; the same file again changes nothing.
    assert!(s.set_paused("ns", "j", false).await.unwrap());
    s.apply_jobs(&[file(r#"{"paused":true}"#, true)], t(2))
        .await
        .unwrap();
    assert!(!paused().await);
    // Another change that keeps the file's `paused`: the API's resume stands.
    s.apply_jobs(&[file(r#"{"paused":true,"x":1}"#, true)], t(3))
        .await
        .unwrap();
    assert!(!paused().await);
    // The file's `paused` changes: the file wins, both ways.
    s.apply_jobs(&[file(r#"{"paused":false}"#, false)], t(4))
        .await
        .unwrap();
    assert!(!paused().await);
    assert!(s.set_paused("ns", "j", true).await.unwrap());
    s.apply_jobs(&[file(r#"{"paused":false,"x":2}"#, false)], t(5))
        .await
        .unwrap();
    assert!(
        paused().await,
        "an API pause survives an edit that keeps `paused`"
    );
    s.apply_jobs(&[file(r#"{"paused":true}"#, true)], t(6))
        .await
        .unwrap();
    s.apply_jobs(&[file(r#"{"paused":false,"y":3}"#, false)], t(7))
        .await
        .unwrap();
    assert!(!paused().await);
}

/// A token is found by the hash of its secret only; revoking it is recorded
/// once; its use is noted.
pub async fn tokens_are_found_by_their_hash_and_revoked<S: Store>(s: &S) {
    let token = |id: &str, ns: Option<&str>| crate::TokenRecord {
        id: id.into(),
        name: format!("token {id}"),
        role: "operator".into(),
        namespace: ns.map(Into::into),
        created_at: t(1),
        expires_at: Some(t(1000)),
        last_used_at: None,
        revoked_at: None,
        created_by: None,
        labels: ns.map(|_| std::collections::BTreeMap::from([("zone".into(), "eu".into())])),
    };
    s.create_token(&token("tok_a", None), b"hash-a")
        .await
        .unwrap();
    s.create_token(&token("tok_b", Some("ns")), b"hash-b")
        .await
        .unwrap();
    assert!(
        s.create_token(&token("tok_c", None), b"hash-a")
            .await
            .is_err(),
        "two tokens with one hash"
    );
    assert_eq!(
        s.find_token(b"hash-b").await.unwrap(),
        Some(token("tok_b", Some("ns")))
    );
    assert_eq!(s.find_token(b"nope").await.unwrap(), None);
    s.token_used("tok_a", t(5)).await.unwrap();
    assert!(s.revoke_token("tok_a", t(6)).await.unwrap());
    assert!(
        !s.revoke_token("tok_a", t(7)).await.unwrap(),
        "revoked once"
    );
    assert!(!s.revoke_token("tok_zz", t(7)).await.unwrap());
    let all = s.list_tokens().await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(
        (all[0].last_used_at, all[0].revoked_at),
        (Some(t(5)), Some(t(6)))
    );
}

/// A setting of the instance is set, replaced and cleared.
pub async fn settings_are_set_replaced_and_cleared<S: Store>(s: &S) {
    assert_eq!(s.get_setting("read_only").await.unwrap(), None);
    s.set_setting("read_only", Some("{\"reason\":\"a\"}"), t(1))
        .await
        .unwrap();
    s.set_setting("read_only", Some("{\"reason\":\"b\"}"), t(2))
        .await
        .unwrap();
    assert_eq!(
        s.get_setting("read_only").await.unwrap().as_deref(),
        Some("{\"reason\":\"b\"}")
    );
    assert_eq!(s.get_setting("other").await.unwrap(), None);
    s.set_setting("quotas/a", Some("{}"), t(2)).await.unwrap();
    let both = |a: &'static str, b: &'static str| s.get_settings([a, b]);
    assert_eq!(
        both("read_only", "quotas/a").await.unwrap(),
        [Some("{\"reason\":\"b\"}".into()), Some("{}".into())]
    );
    assert_eq!(
        both("quotas/a", "other").await.unwrap(),
        [Some("{}".into()), None]
    );
    assert_eq!(
        both("read_only", "read_only").await.unwrap(),
        [
            Some("{\"reason\":\"b\"}".into()),
            Some("{\"reason\":\"b\"}".into())
        ]
    );
    s.set_setting("read_only", None, t(3)).await.unwrap();
    assert_eq!(both("read_only", "quotas/b").await.unwrap(), [None, None]);
    assert_eq!(s.count_unfinished_runs("ns").await.unwrap(), 0);
    assert_eq!(s.get_setting("read_only").await.unwrap(), None);
    // Clearing what is not set is no error.
    s.set_setting("read_only", None, t(4)).await.unwrap();
}

/// A secret's value is replaced in place (a new version) and deleted; one
/// namespace's secrets are not another's.
pub async fn secrets_are_kept_per_namespace<S: Store>(s: &S) {
    let secret = |ns: &str, name: &str, version: i64| crate::SecretRecord {
        namespace: ns.into(),
        name: name.into(),
        version,
        key_id: "k1".into(),
        nonce: vec![version as u8; 12],
        ciphertext: vec![1, 2, 3],
        updated_at: t(version),
    };
    s.put_secret(&secret("a", "db", 1)).await.unwrap();
    s.put_secret(&secret("a", "db", 2)).await.unwrap();
    s.put_secret(&secret("b", "db", 1)).await.unwrap();
    assert_eq!(
        s.get_secret("a", "db").await.unwrap(),
        Some(secret("a", "db", 2))
    );
    assert_eq!(s.list_secrets("a").await.unwrap(), [secret("a", "db", 2)]);
    assert_eq!(s.count_secrets().await.unwrap(), 2);
    assert_eq!(s.list_all_secrets().await.unwrap().len(), 2);
    assert!(s.delete_secret("a", "db").await.unwrap());
    assert!(!s.delete_secret("a", "db").await.unwrap());
    assert_eq!(s.get_secret("a", "db").await.unwrap(), None);
    assert_eq!(
        s.get_secret("b", "db").await.unwrap(),
        Some(secret("b", "db", 1))
    );
}

/// Audit rows appended concurrently form one unbroken chain, read back a
/// page at a time and by namespace.
pub async fn the_audit_log_is_one_chain<S: Store>(s: &S) {
    let entry = |i: u16| crate::AuditEntry {
        seq: 0,
        at: t(i64::from(i)),
        principal: Some("tok_a".into()),
        principal_name: Some("ci".into()),
        action: format!("POST /api/v1/namespaces/n{}/jobs/j/trigger", i % 2),
        namespace: Some(format!("n{}", i % 2)),
        outcome: 201,
        address: None,
        prev_hash: vec![],
        hash: vec![],
    };
    let appends: Vec<_> = (0..20).map(|i| s.append_audit(entry(i))).collect();
    for r in futures_join(appends).await {
        r.unwrap();
    }
    let mut all = s.list_audit(0, 7, None).await.unwrap();
    assert_eq!(all.len(), 7);
    loop {
        let page = s
            .list_audit(all.last().unwrap().seq, 7, None)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        all.extend(page);
    }
    assert_eq!(all.len(), 20);
    assert_eq!(crate::verify_audit(&all, None), Ok(()));
    let n1 = s.list_audit(0, 100, Some("n1")).await.unwrap();
    assert_eq!(n1.len(), 10);
    assert!(n1.iter().all(|e| e.namespace.as_deref() == Some("n1")));
    // Newest first, a page at a time from a position.
    let newest = s.list_audit_newest(i64::MAX, 3, None).await.unwrap();
    assert_eq!(
        newest.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [20, 19, 18]
    );
    let before = s.list_audit_newest(18, 2, Some("n1")).await.unwrap();
    let want: Vec<i64> = n1
        .iter()
        .rev()
        .map(|r| r.seq)
        .filter(|&q| q < 18)
        .take(2)
        .collect();
    assert_eq!(before.iter().map(|r| r.seq).collect::<Vec<_>>(), want);
    assert!(s.list_audit_newest(1, 10, None).await.unwrap().is_empty());

    // Retention: five newer rows, then every row older than them goes;
    // the checkpoint keeps the chain verifiable, and appends go on after it.
    assert_eq!(s.audit_checkpoint().await.unwrap(), None);
    for i in 1000..1005 {
        s.append_audit(entry(i)).await.unwrap();
    }
    let twentieth = all.iter().find(|r| r.seq == 20).unwrap().hash.clone();
    assert_eq!(s.prune_audit(t(1000)).await.unwrap(), 20);
    let checkpoint = s.audit_checkpoint().await.unwrap().unwrap();
    assert_eq!(checkpoint, (20, twentieth));
    let left = s.list_audit(0, 100, None).await.unwrap();
    assert_eq!(left.len(), 5);
    assert_eq!(crate::verify_audit(&left, Some(&checkpoint)), Ok(()));
    assert!(
        crate::verify_audit(&left, None).is_err(),
        "cut, without its checkpoint"
    );
    assert_eq!(s.prune_audit(t(0)).await.unwrap(), 0, "nothing older");
    // Everything is old: the newest row stays, for the next to chain after.
    assert_eq!(s.prune_audit(t(1_000_000)).await.unwrap(), 4);
    s.append_audit(entry(2000)).await.unwrap();
    let left = s.list_audit(0, 100, None).await.unwrap();
    assert_eq!(left.iter().map(|r| r.seq).collect::<Vec<_>>(), [25, 26]);
    let checkpoint = s.audit_checkpoint().await.unwrap().unwrap();
    assert_eq!(checkpoint.0, 24);
    assert_eq!(crate::verify_audit(&left, Some(&checkpoint)), Ok(()));
}

/// The ledger's unique key refuses a second record of the same fire, and the
/// run of the refused write is not created.
pub async fn a_fire_is_recorded_once<S: Store>(s: &S) {
    let r = s.write(&[fire(100, Some(new_run(1, 100)))]).await.unwrap();
    assert_eq!(r, [WriteResult::Done]);
    let r = s
        .write(&[fire(100, Some(new_run(2, 100))), fire(101, None)])
        .await
        .unwrap();
    assert!(matches!(r[0], WriteResult::Conflict(_)), "{r:?}");
    assert_eq!(
        r[1],
        WriteResult::Done,
        "one conflict does not undo the rest of the batch"
    );
    assert!(
        s.get_run(2).await.unwrap().is_none(),
        "the refused fire's run was not created"
    );
    let run = s.get_run(1).await.unwrap().unwrap();
    assert_eq!(
        run.tasks
            .iter()
            .map(|t| (t.id.as_str(), t.state))
            .collect::<Vec<_>>(),
        [("a", TaskState::Pending), ("b", TaskState::Pending)]
    );
    assert_eq!(run.params.get("region").map(String::as_str), Some("eu"));
}

/// Many writers racing to record the same fires: each fire gets exactly one run.
pub async fn concurrent_fires_create_one_run<S: Store>(s: &S) {
    let batches: Vec<Vec<Write>> = (0..4i64)
        .map(|w| {
            (0..50)
                .map(|k| fire(1000 + k, Some(new_run(10_000 * (w + 1) + k, 1000 + k))))
                .collect()
        })
        .collect();
    let results = futures_join(batches.iter().map(|b| s.write(b)).collect()).await;
    let done: usize = results
        .into_iter()
        .map(|r| {
            r.unwrap()
                .iter()
                .filter(|x| **x == WriteResult::Done)
                .count()
        })
        .sum();
    assert_eq!(done, 50, "exactly one writer wins each fire");
    let fires = s
        .list_fires("ns", "j", t(0), t(10_000), 1000)
        .await
        .unwrap();
    assert_eq!(fires.len(), 50);
    for f in &fires {
        assert!(s.get_run(f.run_id.unwrap()).await.unwrap().is_some());
    }
}

/// Runs all futures concurrently on the current task.
async fn futures_join<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut set = Vec::with_capacity(futs.len());
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if outputs[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => outputs[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    set.extend(outputs.into_iter().map(|o| o.expect("ready")));
    set
}

/// A run asked to stop keeps the state it will end in, also when the mark
/// comes in a batch with other changes of the run.
pub async fn a_stop_is_recorded_with_its_final_state<S: Store>(s: &S) {
    s.write(&[
        fire(100, Some(new_run(1, 100))),
        fire(101, Some(new_run(2, 101))),
    ])
    .await
    .unwrap();
    assert_eq!(s.get_run(1).await.unwrap().unwrap().closing, None);
    let r = s
        .write(&[
            Write::RunClosing {
                run: 1,
                to: RunState::Cancelled,
            },
            Write::TaskState {
                run: 2,
                task: "a".into(),
                from: TaskState::Pending,
                to: TaskState::Ready,
            },
            Write::RunClosing {
                run: 2,
                to: RunState::Failed,
            },
            Write::RunClosing {
                run: 99,
                to: RunState::Failed,
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        r[..3],
        [WriteResult::Done, WriteResult::Done, WriteResult::Done]
    );
    assert!(matches!(r[3], WriteResult::Conflict(_)), "{r:?}");
    assert_eq!(
        s.get_run(1).await.unwrap().unwrap().closing,
        Some(RunState::Cancelled)
    );
    assert_eq!(
        s.get_run(2).await.unwrap().unwrap().closing,
        Some(RunState::Failed)
    );
    assert_eq!(
        s.active_runs().await.unwrap()[0].closing,
        Some(RunState::Cancelled)
    );
}

/// A withdrawal cancels an attempt that has not ended (waiting to be
/// claimed, or running) and its task; an attempt that ended first keeps
/// its result. One write, always done.
pub async fn a_withdrawn_attempt_is_cancelled_claimed_or_not<S: Store>(s: &S) {
    s.write(&[fire(100, Some(new_run(1, 100)))]).await.unwrap();
    let start = |task: &str, state: AttemptState| Write::AttemptStart {
        priority: Default::default(),
        run: 1,
        task: task.into(),
        number: 1,
        state,
        at: t(101),
        run_on: None,
    };
    let task_to = |task: &str, from: TaskState, to: TaskState| Write::TaskState {
        run: 1,
        task: task.into(),
        from,
        to,
    };
    let withdraw = |task: &str| Write::AttemptWithdraw {
        run: 1,
        task: task.into(),
        number: 1,
        at: t(102),
    };
    let mut setup = vec![];
    for task in ["a", "b"] {
        setup.push(task_to(task, TaskState::Pending, TaskState::Ready));
        setup.push(task_to(task, TaskState::Ready, TaskState::Dispatching));
    }
    setup.push(start("a", AttemptState::Dispatching));
    setup.push(task_to("b", TaskState::Dispatching, TaskState::Running));
    setup.push(start("b", AttemptState::Running));
    assert!(
        s.write(&setup)
            .await
            .unwrap()
            .iter()
            .all(|r| *r == WriteResult::Done)
    );
    let r = s.write(&[withdraw("a"), withdraw("b")]).await.unwrap();
    assert_eq!(r, [WriteResult::Done, WriteResult::Done]);
    let run = s.get_run(1).await.unwrap().unwrap();
    for task in &run.tasks {
        assert_eq!(task.state, TaskState::Cancelled, "{}", task.id);
        let a = &task.attempts[0];
        assert_eq!(a.state, AttemptState::Cancelled, "{}", task.id);
        assert_eq!(a.finished_at, Some(t(102)));
        assert_eq!(a.error.as_deref(), Some(crate::WITHDRAWN));
    }
    assert_eq!(run.tasks[0].attempts[0].node_epoch, None, "no node took it");
    // Withdrawn again (the news crossed): nothing changes.
    assert_eq!(
        s.write(&[withdraw("a")]).await.unwrap(),
        [WriteResult::Done]
    );
    assert_eq!(s.get_run(1).await.unwrap().unwrap(), run);
}

/// A transition from a state the row is not in is refused and changes nothing.
pub async fn state_changes_are_compare_and_set<S: Store>(s: &S) {
    s.write(&[fire(100, Some(new_run(1, 100)))]).await.unwrap();
    let r = s
        .write(&[
            Write::TaskState {
                run: 1,
                task: "a".into(),
                from: TaskState::Pending,
                to: TaskState::Ready,
            },
            Write::TaskState {
                run: 1,
                task: "b".into(),
                from: TaskState::Running,
                to: TaskState::Succeeded,
            },
            Write::RunState {
                run: 1,
                from: RunState::Pending,
                to: RunState::Running,
                at: t(101),
            },
            Write::TaskState {
                run: 1,
                task: "zz".into(),
                from: TaskState::Pending,
                to: TaskState::Ready,
            },
        ])
        .await
        .unwrap();
    assert_eq!(r[0], WriteResult::Done);
    assert!(matches!(r[1], WriteResult::Conflict(_)));
    assert!(
        matches!(r[2], WriteResult::Conflict(_)),
        "the run is running, not pending"
    );
    assert!(matches!(r[3], WriteResult::Conflict(_)), "unknown task");
    let run = s.get_run(1).await.unwrap().unwrap();
    assert_eq!(
        (run.tasks[0].state, run.tasks[1].state),
        (TaskState::Ready, TaskState::Pending)
    );
    let r = s
        .write(&[Write::RunState {
            run: 1,
            from: RunState::Running,
            to: RunState::Succeeded,
            at: t(150),
        }])
        .await
        .unwrap();
    assert_eq!(r, [WriteResult::Done]);
    let run = s.get_run(1).await.unwrap().unwrap();
    assert_eq!(
        (run.state, run.finished_at),
        (RunState::Succeeded, Some(t(150)))
    );
}

/// Successive changes of one row in a batch apply in order: a chain
/// succeeds, a change from a state the row has already left is refused.
pub async fn changes_of_one_row_in_a_batch_apply_in_order<S: Store>(s: &S) {
    s.write(&[fire(100, Some(new_run(1, 100)))]).await.unwrap();
    let task = |name: &str, from, to| Write::TaskState {
        run: 1,
        task: name.into(),
        from,
        to,
    };
    let r = s
        .write(&[
            task("a", TaskState::Pending, TaskState::Ready),
            task("b", TaskState::Pending, TaskState::Ready),
            task("a", TaskState::Ready, TaskState::Dispatching),
            task("a", TaskState::Dispatching, TaskState::Running),
        ])
        .await
        .unwrap();
    assert_eq!(r, vec![WriteResult::Done; 4]);
    let r = s
        .write(&[
            task("b", TaskState::Ready, TaskState::Cancelled),
            task("b", TaskState::Ready, TaskState::Dispatching),
        ])
        .await
        .unwrap();
    assert_eq!(r[0], WriteResult::Done);
    assert!(
        matches!(r[1], WriteResult::Conflict(_)),
        "b was cancelled: {r:?}"
    );
    let r = s
        .write(&[
            Write::RunState {
                run: 1,
                from: RunState::Running,
                to: RunState::Failed,
                at: t(130),
            },
            Write::RunState {
                run: 1,
                from: RunState::Running,
                to: RunState::Succeeded,
                at: t(140),
            },
        ])
        .await
        .unwrap();
    assert_eq!(r[0], WriteResult::Done);
    assert!(matches!(r[1], WriteResult::Conflict(_)));
    let run = s.get_run(1).await.unwrap().unwrap();
    assert_eq!(
        (
            run.state,
            run.finished_at,
            run.tasks[0].state,
            run.tasks[1].state
        ),
        (
            RunState::Failed,
            Some(t(130)),
            TaskState::Running,
            TaskState::Cancelled
        )
    );
}

/// Attempts are recorded with their results, and their output can be read back.
pub async fn attempts_and_logs<S: Store>(s: &S) {
    s.write(&[fire(100, Some(new_run(1, 100)))]).await.unwrap();
    let start = |n| Write::AttemptStart {
        priority: Default::default(),
        run: 1,
        task: "a".into(),
        number: n,
        state: AttemptState::Running,
        at: t(100 + i64::from(n)),
        run_on: None,
    };
    // Each attempt hands its own outputs (a failed one's are kept too).
    let end = |n, to, code| Write::AttemptEnd {
        outputs: [
            ("attempt".to_string(), format!("{n}")),
            ("quote".to_string(), "it's \"x\"\n".to_string()),
        ]
        .into(),
        run: 1,
        task: "a".into(),
        number: n,
        from: AttemptState::Running,
        to,
        at: t(110 + i64::from(n)),
        exit_code: code,
        error: (to != AttemptState::Succeeded).then(|| "exit status 75".to_string()),
        log: format!("output of attempt {n}").into_bytes(),
        lines: Vec::new(),
        start_error_us: None,
        for_other_node: false,
    };
    let r = s
        .write(&[start(1), end(1, AttemptState::Failed, Some(75)), start(2)])
        .await
        .unwrap();
    assert_eq!(r, [WriteResult::Done, WriteResult::Done, WriteResult::Done]);
    let r = s.write(&[start(2)]).await.unwrap();
    assert!(
        matches!(r[0], WriteResult::Conflict(_)),
        "an attempt number is used once"
    );
    let r = s
        .write(&[end(1, AttemptState::Succeeded, Some(0))])
        .await
        .unwrap();
    assert!(
        matches!(r[0], WriteResult::Conflict(_)),
        "a finished attempt does not change"
    );
    s.write(&[end(2, AttemptState::Succeeded, Some(0))])
        .await
        .unwrap();
    let run = s.get_run(1).await.unwrap().unwrap();
    let a = &run.tasks[0].attempts;
    assert_eq!(a.len(), 2);
    assert_eq!(
        (a[0].number, a[0].state, a[0].exit_code, a[0].finished_at),
        (1, AttemptState::Failed, Some(75), Some(t(111)))
    );
    assert_eq!(a[0].error.as_deref(), Some("exit status 75"));
    assert_eq!(
        (a[1].state, a[1].started_at),
        (AttemptState::Succeeded, t(102))
    );
    assert_eq!(
        (
            a[0].outputs["attempt"].as_str(),
            a[1].outputs["attempt"].as_str()
        ),
        ("1", "2")
    );
    assert_eq!(a[1].outputs["quote"], "it's \"x\"\n");
    assert_eq!(
        s.read_log(1, "a", 1).await.unwrap().unwrap(),
        b"output of attempt 1"
    );
    assert_eq!(s.read_log(1, "a", 9).await.unwrap(), None);
}

/// Runs list newest first, page by page, and a bad cursor is an error.
pub async fn runs_are_paginated_newest_first<S: Store>(s: &S) {
    let batch: Vec<Write> = (1..=7)
        .map(|i| fire(100 * i, Some(new_run(i, 100 * i))))
        .collect();
    s.write(&batch).await.unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = s.list_runs("ns", "j", 3, cursor.as_deref()).await.unwrap();
        seen.extend(page.items.iter().map(|r| r.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, [7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(s.max_run_id().await.unwrap(), 7);
    // All seven are running: the namespace's quota counts them.
    assert_eq!(s.count_unfinished_runs("ns").await.unwrap(), 7);
    assert_eq!(s.count_unfinished_runs("other").await.unwrap(), 0);
    assert!(matches!(
        s.list_runs("ns", "j", 3, Some("not-a-cursor")).await,
        Err(StorageError::Invalid(_))
    ));
    assert!(
        s.list_runs("ns", "other", 3, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// The jobs list's light read gives, per job asked and in that order,
/// what the full reads give: its last runs, and its first fires of a
/// window counted by outcome.
pub async fn a_job_summary_is_its_last_runs_and_its_fires_counted<S: Store>(s: &S) {
    let outcomes = [
        FireOutcome::Fired,
        FireOutcome::SkippedOverlap,
        FireOutcome::MissedSkipped,
        FireOutcome::Suppressed,
    ];
    let mut batch = Vec::new();
    for i in 1..=40i64 {
        let ns = if i % 7 == 0 { "other" } else { "ns" };
        let job = ["j", "k"][(i % 2) as usize];
        let outcome = outcomes[((i / 2) % 4) as usize];
        let run = (outcome == FireOutcome::Fired).then(|| {
            let mut run = new_run(i, 100 * i);
            run.namespace = ns.into();
            run.job = job.into();
            run.state = [RunState::Running, RunState::Pending][((i / 3) % 2) as usize];
            run
        });
        batch.push(Write::Fire {
            namespace: ns.into(),
            job: job.into(),
            scheduled_at: t(100 * i),
            outcome,
            calendar: (outcome == FireOutcome::Suppressed).then(|| "holidays".into()),
            run,
        });
    }
    // Manual runs of j, newer than its scheduled ones.
    batch.extend((41..=42).map(|i| Write::Run(new_run(i, 100 * i))));
    s.write(&batch).await.unwrap();
    // A name asked twice gets its summary twice.
    let asked: Vec<String> = ["k", "j", "none", "k"].map(String::from).to_vec();
    let window = (t(500), t(3500));
    for (strip, fires) in [(3, 4), (10, 1000), (1, 1)] {
        let got = s
            .job_summaries("ns", &asked, strip, window, fires)
            .await
            .unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], got[3]);
        for (job, got) in asked.iter().zip(&got) {
            let runs = s.list_runs("ns", job, strip, None).await.unwrap().items;
            let ledger = s
                .list_fires("ns", job, window.0, window.1, fires)
                .await
                .unwrap();
            let want: Vec<(RunId, RunState)> = runs.iter().map(|r| (r.id, r.state)).collect();
            assert_eq!(got.runs, want, "runs of {job}, strip {strip}");
            assert_eq!(got.fires_read(), ledger.len() as u64, "fires of {job}");
            for outcome in outcomes {
                let n = ledger.iter().filter(|f| f.outcome == outcome).count();
                assert_eq!(got.fires_of(&[outcome]), n as u64, "{outcome:?} of {job}");
            }
        }
    }
    // Pinned: j's newest runs are the manual ones, then its fires'.
    let got = s
        .job_summaries("ns", &asked, 3, window, 1000)
        .await
        .unwrap();
    assert_eq!(
        got[1].runs.iter().map(|r| r.0).collect::<Vec<_>>(),
        [42, 41, 40]
    );
    assert_eq!(got[2], JobSummary::default());
    // k's fires in [500, 3500): the 15 odd seconds' hundreds from 5 to
    // 33, less 7 and 21 (in the other namespace).
    assert_eq!(got[0].fires_read(), 13);
    assert!(
        s.job_summaries("ns", &[], 3, window, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The runs browser lists runs of every job newest first; each filter
/// narrows, together they all hold, and pages follow one another with no
/// run twice or left out.
pub async fn the_runs_browser_filters_across_jobs_newest_first<S: Store>(s: &S) {
    let mut batch = Vec::new();
    for i in 1..=24 {
        let mut run = new_run(i, 1000 + 100 * i);
        run.namespace = ["ns", "other"][(i % 2) as usize].into();
        run.job = ["j", "k", "l"][(i % 3) as usize].into();
        run.trigger = [Trigger::Schedule, Trigger::Manual][((i / 4) % 2) as usize];
        run.state = [RunState::Running, RunState::Pending][((i / 5) % 2) as usize];
        batch.push(Write::Run(run));
    }
    s.write(&batch).await.unwrap();
    let all: Vec<RunRecord> = {
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let page = s
                .browse_runs(&RunFilter::default(), 5, cursor.as_deref())
                .await
                .unwrap();
            assert!(page.items.len() <= 5);
            out.extend(page.items);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        out
    };
    let ids: Vec<RunId> = all.iter().map(|r| r.id).collect();
    assert_eq!(ids, (1..=24).rev().collect::<Vec<_>>());
    let filters = [
        RunFilter {
            namespace: Some("ns".into()),
            ..RunFilter::default()
        },
        RunFilter {
            namespace: Some("other".into()),
            job: Some("k".into()),
            ..RunFilter::default()
        },
        RunFilter {
            job: Some("l".into()),
            states: vec![RunState::Pending],
            ..RunFilter::default()
        },
        RunFilter {
            states: vec![RunState::Pending, RunState::Running],
            trigger: Some(Trigger::Manual),
            ..RunFilter::default()
        },
        RunFilter {
            since: Some(t(1000 + 100 * 6)),
            until: Some(t(1000 + 100 * 19)),
            ..RunFilter::default()
        },
        RunFilter {
            namespace: Some("nowhere".into()),
            ..RunFilter::default()
        },
    ];
    for filter in filters {
        let want: Vec<RunId> = all
            .iter()
            .filter(|r| filter.matches(r))
            .map(|r| r.id)
            .collect();
        let mut got = Vec::new();
        let mut cursor = None;
        loop {
            let page = s.browse_runs(&filter, 2, cursor.as_deref()).await.unwrap();
            assert!(page.items.iter().all(|r| filter.matches(r)), "{filter:?}");
            got.extend(page.items.iter().map(|r| r.id));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(got, want, "{filter:?}");
    }
    // The filters are not all trivial: the narrow ones keep some runs.
    let since = all
        .iter()
        .filter(|r| r.scheduled_at >= t(1600) && r.scheduled_at < t(2900))
        .count();
    assert_eq!(since, 13);
    assert!(matches!(
        s.browse_runs(&RunFilter::default(), 3, Some("run:x")).await,
        Err(StorageError::Invalid(_))
    ));

    // A filter that few runs match is checked on a window of runs a page:
    // a page past the window is empty but says where to look further.
    let first = 100;
    let batch: Vec<Write> = (first..first + crate::BROWSE_SCAN as i64 + 5)
        .map(|i| {
            let mut run = new_run(i, 5000 + i);
            run.trigger = if i < first + 5 {
                Trigger::Backfill
            } else {
                Trigger::Schedule
            };
            Write::Run(run)
        })
        .collect();
    s.write(&batch).await.unwrap();
    let rare = RunFilter {
        trigger: Some(Trigger::Backfill),
        ..RunFilter::default()
    };
    let page = s.browse_runs(&rare, 10, None).await.unwrap();
    assert!(page.items.is_empty());
    let cursor = page.next_cursor.expect("a cursor past the window");
    let page = s.browse_runs(&rare, 10, Some(&cursor)).await.unwrap();
    let ids: Vec<RunId> = page.items.iter().map(|r| r.id).collect();
    assert_eq!(ids, (first..first + 5).rev().collect::<Vec<_>>());
    assert_eq!(page.next_cursor, None);
}

/// The overview's reads: a namespace's paused jobs by name, and its fires
/// that made no run on time (missed or skipped, not fired or suppressed),
/// newest first, from an instant on.
pub async fn the_overview_finds_paused_jobs_and_fires_that_made_no_run<S: Store>(s: &S) {
    let jobs = [
        job("ns", "b", "{}"),
        job("ns", "a", "{}"),
        job("ns", "c", "{}"),
        job("other", "a", "{}"),
    ];
    s.apply_jobs(&jobs, t(1)).await.unwrap();
    for (ns, name) in [("ns", "c"), ("ns", "b"), ("other", "a")] {
        assert!(s.set_paused(ns, name, true).await.unwrap());
    }
    let names: Vec<String> = s
        .attention_jobs("ns", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.name)
        .collect();
    assert_eq!(names, ["b", "c"]);
    assert_eq!(s.attention_jobs("ns", 1).await.unwrap().len(), 1);
    assert!(s.attention_jobs("none", 10).await.unwrap().is_empty());

    let outcome = |job: &str, ns: &str, at: i64, outcome: FireOutcome| Write::Fire {
        namespace: ns.into(),
        job: job.into(),
        scheduled_at: t(at),
        outcome,
        calendar: (outcome == FireOutcome::Suppressed).then(|| "holidays".to_string()),
        run: None,
    };
    s.write(&[
        outcome("a", "ns", 100, FireOutcome::MissedSkipped),
        outcome("b", "ns", 200, FireOutcome::SkippedOverlap),
        outcome("a", "ns", 300, FireOutcome::Suppressed),
        outcome("b", "ns", 400, FireOutcome::SkippedBreaker),
        outcome("a", "other", 500, FireOutcome::MissedSkipped),
        fire(600, Some(new_run(1, 600))),
    ])
    .await
    .unwrap();
    let seen: Vec<(String, i64, FireOutcome)> = s
        .problem_fires("ns", t(150), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(job, f)| (job, f.scheduled_at.as_second(), f.outcome))
        .collect();
    assert_eq!(
        seen,
        [
            ("b".to_string(), 400, FireOutcome::SkippedBreaker),
            ("b".to_string(), 200, FireOutcome::SkippedOverlap),
        ]
    );
    assert_eq!(s.problem_fires("ns", t(0), 1).await.unwrap().len(), 1);
    assert_eq!(s.problem_fires("ns", t(0), 10).await.unwrap().len(), 3);
}

/// Runs planned for an instant are listed soonest first until they are
/// made (or cancelled); recovery finds them among the unfinished runs, and
/// the quota of active runs does not count them.
pub async fn planned_runs_wait_soonest_first_and_count_as_unfinished<S: Store>(s: &S) {
    let planned = |id: i64, at: i64| {
        Write::Run(NewRun {
            trigger: Trigger::Manual,
            state: RunState::Planned,
            created_at: t(10),
            ..new_run(id, at)
        })
    };
    s.write(&[planned(1, 500), planned(2, 300), planned(3, 400)])
        .await
        .unwrap();
    s.write(&[fire(100, Some(new_run(4, 100)))]).await.unwrap();
    let ids = |runs: Vec<RunRecord>| runs.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(s.planned_runs("ns", "j", 10).await.unwrap()), [2, 3, 1]);
    assert_eq!(ids(s.planned_runs("ns", "j", 2).await.unwrap()), [2, 3]);
    assert!(s.planned_runs("ns", "other", 10).await.unwrap().is_empty());
    let r = s.get_run(2).await.unwrap().unwrap();
    assert_eq!((r.state, r.scheduled_at), (RunState::Planned, t(300)));
    assert_eq!(ids(s.active_runs().await.unwrap()), [1, 2, 3, 4]);
    assert_eq!(s.count_unfinished_runs("ns").await.unwrap(), 1);
    // Made at its instant, or cancelled before it: no longer planned.
    s.write(&[
        Write::RunState {
            run: 2,
            from: RunState::Planned,
            to: RunState::Pending,
            at: t(300),
        },
        Write::RunState {
            run: 3,
            from: RunState::Planned,
            to: RunState::Cancelled,
            at: t(310),
        },
    ])
    .await
    .unwrap();
    assert_eq!(ids(s.planned_runs("ns", "j", 10).await.unwrap()), [1]);
    assert_eq!(ids(s.active_runs().await.unwrap()), [1, 2, 4]);
}

/// Recovery reads: the last fire per job, the ledger, and unfinished runs.
pub async fn fires_and_recovery_queries<S: Store>(s: &S) {
    let mut done = new_run(2, 200);
    done.state = RunState::Running;
    s.write(&[
        fire(100, Some(new_run(1, 100))),
        fire(200, Some(done)),
        fire(300, None),
    ])
    .await
    .unwrap();
    s.write(&[Write::RunState {
        run: 2,
        from: RunState::Running,
        to: RunState::Failed,
        at: t(250),
    }])
    .await
    .unwrap();
    let last = s.last_fires().await.unwrap();
    assert_eq!(last, [("ns".to_string(), "j".to_string(), t(300))]);
    let keys = [
        ("ns".to_string(), "never".to_string()),
        ("ns".to_string(), "j".to_string()),
    ];
    assert_eq!(s.last_fires_of(&keys).await.unwrap(), [None, Some(t(300))]);
    let fires = s.list_fires("ns", "j", t(100), t(300), 10).await.unwrap();
    assert_eq!(
        fires
            .iter()
            .map(|f| (f.scheduled_at.as_second(), f.outcome, f.run_id))
            .collect::<Vec<_>>(),
        [
            (100, FireOutcome::Fired, Some(1)),
            (200, FireOutcome::Fired, Some(2))
        ]
    );
    let active = s.active_runs().await.unwrap();
    assert_eq!(active.iter().map(|r| r.id).collect::<Vec<_>>(), [1]);
}

fn ended(run: i64, at: i64) -> Write {
    Write::RunState {
        run,
        from: RunState::Running,
        to: RunState::Succeeded,
        at: t(at),
    }
}

/// The pruner's reads (jobs with history, a job's runs and ledger rows but
/// its newest) and a batch of pruning, which checks each row again: a run
/// still running or re-run by another stays, and so does the job's newest
/// ledger row; a pruned run takes its tasks, attempts and ledger row.
pub async fn retention_reads_the_history_and_prunes_only_what_may_go<S: Store>(s: &S) {
    s.apply_jobs(&[job("ns", "j", "{}"), job("other", "x", "{}")], t(1))
        .await
        .unwrap();
    let mut rerun = new_run(4, 350);
    rerun.trigger = Trigger::Rerun;
    rerun.rerun_of = Some(2);
    s.write(&[
        fire(100, Some(new_run(1, 100))),
        fire(200, Some(new_run(2, 200))),
        fire(300, Some(new_run(3, 300))),
        Write::Run(rerun),
        fire(400, None),
        Write::AttemptStart {
            priority: Default::default(),
            run: 1,
            task: "a".into(),
            number: 1,
            state: AttemptState::Running,
            at: t(101),
            run_on: None,
        },
        ended(1, 150),
        ended(2, 250),
        ended(4, 360),
    ])
    .await
    .unwrap();

    let jobs = s.history_jobs(None, None, 10).await.unwrap();
    let names: Vec<_> = jobs
        .iter()
        .map(|j| (j.namespace.as_str(), j.name.as_str()))
        .collect();
    assert_eq!(names, [("ns", "j"), ("other", "x")]);
    assert_eq!(jobs[0].facts.deleted_at, None);
    assert_eq!(jobs[0].facts.newest_fire, Some((t(400), None)));
    assert_eq!(jobs[1].facts.newest_fire, None);
    let after = s.history_jobs(None, Some(("ns", "j")), 10).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].name, "x");
    assert_eq!(
        s.history_jobs(Some("other"), None, 10).await.unwrap(),
        after
    );
    assert_eq!(s.history_jobs(None, None, 1).await.unwrap().len(), 1);

    let runs = s.run_history("ns", "j", 0, 0, 10).await.unwrap();
    let facts: Vec<_> = runs
        .iter()
        .map(|r| {
            (
                r.id,
                r.state,
                r.rerun,
                r.attempts,
                r.finished_at.is_some(),
                r.fired,
            )
        })
        .collect();
    assert_eq!(
        facts,
        [
            (1, RunState::Succeeded, false, 1, true, true),
            (2, RunState::Succeeded, true, 0, true, true),
            (3, RunState::Running, false, 0, false, true),
            (4, RunState::Succeeded, false, 0, true, false),
        ]
    );
    assert_eq!(runs[0].created_at, t(100));
    let ids = |runs: Vec<dagcron_core::retention::RunFacts>| -> Vec<i64> {
        runs.iter().map(|r| r.id).collect()
    };
    assert_eq!(
        ids(s.run_history("ns", "j", 2, 0, 10).await.unwrap()),
        [1, 2]
    );
    assert_eq!(
        ids(s.run_history("ns", "j", 0, 1, 2).await.unwrap()),
        [2, 3]
    );
    assert!(s.run_history("ns", "j", 4, 0, 10).await.unwrap().is_empty());

    let fires = s.fire_history("ns", "j", 0, None, 10).await.unwrap();
    let facts: Vec<_> = fires
        .iter()
        .map(|f| (f.scheduled_at.as_second(), f.run_stored))
        .collect();
    assert_eq!(facts, [(100, true), (200, true), (300, true), (400, false)]);
    let kept = s
        .fire_history("ns", "j", 1, Some(t(100)), 10)
        .await
        .unwrap();
    assert_eq!(kept.len(), 2, "after 100, but the newest");

    let pruned = s
        .prune(&crate::Prune {
            runs: vec![1, 2, 3],
            fires: vec![("ns".into(), "j".into(), t(400))],
            forget: vec![("ns".into(), "j".into())],
        })
        .await
        .unwrap();
    assert_eq!(
        pruned,
        crate::Pruned {
            runs: 1,
            attempts: 1,
            fires: 1,
            jobs: 0
        }
    );
    assert!(s.get_run(1).await.unwrap().is_none());
    assert!(s.read_log(1, "a", 1).await.unwrap().is_none());
    assert_eq!(s.get_run(2).await.unwrap().unwrap().id, 2, "re-run by 4");
    assert_eq!(
        s.get_run(3).await.unwrap().unwrap().state,
        RunState::Running
    );
    let left: Vec<_> = s
        .list_fires("ns", "j", t(0), t(1000), 10)
        .await
        .unwrap()
        .iter()
        .map(|f| f.scheduled_at.as_second())
        .collect();
    assert_eq!(left, [200, 300, 400]);
    assert_eq!(
        s.list_job_versions("ns", "j", 10, None)
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    // Pruned twice (two nodes at once): nothing more goes.
    let again = s
        .prune(&crate::Prune {
            runs: vec![1],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(again, crate::Pruned::default());
    // Once its re-run has gone, the original may go.
    let both = s
        .prune(&crate::Prune {
            runs: vec![4, 2],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (both.runs, both.fires),
        (1, 0),
        "2 is still re-run by 4 as the batch starts"
    );
    let last = s
        .prune(&crate::Prune {
            runs: vec![2],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((last.runs, last.fires), (1, 1));
}

/// A deleted job has a tombstone with the instant of its deletion; applied
/// again, it has none. Forgetting it (versions, tombstone, ledger) waits
/// until none of its runs is stored, and never touches a job that exists.
pub async fn a_deleted_job_is_forgotten_once_its_runs_are_gone<S: Store>(s: &S) {
    s.apply_jobs(&[job("ns", "j", "{}"), job("ns", "k", "{}")], t(1))
        .await
        .unwrap();
    s.write(&[
        fire(100, Some(new_run(1, 100))),
        ended(1, 150),
        fire(200, None),
    ])
    .await
    .unwrap();
    let before = Timestamp::now();
    assert!(s.delete_job("ns", "j").await.unwrap());
    assert!(s.delete_job("ns", "k").await.unwrap());
    s.apply_jobs(&[job("ns", "k", "{}")], t(2)).await.unwrap();
    let jobs = s.history_jobs(Some("ns"), None, 10).await.unwrap();
    let deleted_at = jobs[0].facts.deleted_at.expect("j is deleted");
    let slack = jiff::SignedDuration::from_secs(60);
    assert!(deleted_at >= before - slack && deleted_at <= Timestamp::now() + slack);
    assert_eq!(jobs[1].facts.deleted_at, None, "k was applied again");

    let forget = crate::Prune {
        forget: vec![("ns".into(), "j".into()), ("ns".into(), "k".into())],
        ..Default::default()
    };
    assert_eq!(
        s.prune(&forget).await.unwrap().jobs,
        0,
        "a run of j is stored"
    );
    let gone = s
        .prune(&crate::Prune {
            runs: vec![1],
            ..forget.clone()
        })
        .await
        .unwrap();
    assert_eq!(
        gone,
        crate::Pruned {
            runs: 1,
            attempts: 0,
            fires: 2,
            jobs: 1
        }
    );
    let jobs = s.history_jobs(Some("ns"), None, 10).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].name, "k");
    assert!(
        s.list_job_versions("ns", "j", 10, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(s.last_fires().await.unwrap().is_empty());
    // Applied again, j starts over at version 1.
    let again = s.apply_jobs(&[job("ns", "j", "{}")], t(3)).await.unwrap();
    assert_eq!(again, [ApplyResult::Created(1)]);
}

fn notification(key: &str, ns: &str, at: i64) -> Write {
    Write::Notify(NewNotification {
        key: key.into(),
        namespace: ns.into(),
        job: "j".into(),
        run: Some(1),
        event: "failed".into(),
        notifier: "oncall".into(),
        channel: r#"{"name":"oncall","webhook":{"url":"https://hooks.example"}}"#.into(),
        payload: format!(r#"{{"id":"{key}"}}"#),
        at: t(at),
    })
}

/// A notification is written in a batch, once per key however often the
/// batch is committed; one node holds it at a time, until its claim ends;
/// each delivery attempt is recorded, and where it leaves the notification.
pub async fn the_outbox_keeps_one_row_a_key_and_one_holder_at_a_time<S: Store>(s: &S) {
    let batch = [
        fire(100, Some(new_run(1, 100))),
        notification("k1", "ns", 100),
        notification("k2", "ns", 116),
        notification("k3", "other", 100),
    ];
    assert!(
        s.write(&batch)
            .await
            .unwrap()
            .iter()
            .all(|r| *r == WriteResult::Done)
    );
    // The same notifications again (a batch committed twice): no new row.
    let again = s.write(&batch[1..]).await.unwrap();
    assert!(again.iter().all(|r| *r == WriteResult::Done));
    let listed = s.list_notifications("ns", false, None, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|n| n.made.key.as_str())
            .collect::<Vec<_>>(),
        ["k2", "k1"],
        "newest first, this namespace's only"
    );
    assert_eq!(listed[1].state, NotificationState::Pending);
    assert_eq!(listed[1].next_at, Some(t(100)));
    assert_eq!(listed[1].made.run, Some(1));
    let (k1, k2) = (listed[1].id, listed[0].id);
    assert!(k1 < k2);
    // Pages go on before an id.
    let page = s
        .list_notifications("ns", false, Some(k2), 10)
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].id, k1);

    // Due at 101: k1 and the other namespace's; k2 at 116.
    let a = s
        .claim_notifications("node-a", t(101), t(131), 10)
        .await
        .unwrap();
    let mut keys: Vec<_> = a.iter().map(|n| n.made.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, ["k1", "k3"]);
    // Held by node a: node b gets nothing until the claim ends.
    assert!(
        s.claim_notifications("node-b", t(110), t(140), 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Node b cannot record what it does not hold.
    let failed = DeliveryAttempt {
        number: 1,
        at: t(102),
        status: Some(500),
        error: Some("answered 500".into()),
    };
    assert!(
        !s.record_delivery(k1, "node-b", Some(&failed), &DeliveryEnd::Retry(t(120)))
            .await
            .unwrap()
    );
    assert!(
        s.record_delivery(k1, "node-a", Some(&failed), &DeliveryEnd::Retry(t(120)))
            .await
            .unwrap()
    );
    let k1_now =
        |list: Vec<crate::NotificationRecord>| list.into_iter().find(|n| n.id == k1).unwrap();
    let n = k1_now(s.list_notifications("ns", false, None, 10).await.unwrap());
    assert_eq!(
        (
            n.state,
            n.attempts,
            n.next_at,
            n.last_status,
            n.last_error.as_deref()
        ),
        (
            NotificationState::Pending,
            1,
            Some(t(120)),
            Some(500),
            Some("answered 500")
        )
    );
    // Not due again before 120; the released claim does not hold it back.
    assert!(
        s.claim_notifications("node-b", t(115), t(145), 10)
            .await
            .unwrap()
            .iter()
            .all(|n| n.id != k1)
    );
    // The other namespace's notification is still node a's until 131;
    // then anyone may take it.
    let b = s
        .claim_notifications("node-b", t(132), t(162), 10)
        .await
        .unwrap();
    let mut keys: Vec<_> = b.iter().map(|n| n.made.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, ["k1", "k2", "k3"]);
    let delivered = DeliveryAttempt {
        number: 2,
        at: t(133),
        status: Some(200),
        error: None,
    };
    assert!(
        s.record_delivery(k1, "node-b", Some(&delivered), &DeliveryEnd::Delivered)
            .await
            .unwrap()
    );
    // Recorded once: a second record of the same end changes nothing.
    assert!(
        !s.record_delivery(k1, "node-b", Some(&delivered), &DeliveryEnd::Delivered)
            .await
            .unwrap()
    );
    assert!(
        s.record_delivery(
            k2,
            "node-b",
            None,
            &DeliveryEnd::Dropped {
                why: "not a recovery".into(),
                at: t(140),
            }
        )
        .await
        .unwrap()
    );
    let list = s.list_notifications("ns", false, None, 10).await.unwrap();
    let n = k1_now(list.clone());
    assert_eq!(
        (
            n.state,
            n.attempts,
            n.next_at,
            n.ended_at,
            n.last_status,
            n.last_error
        ),
        (
            NotificationState::Delivered,
            2,
            None,
            Some(t(133)),
            Some(200),
            None
        )
    );
    let dropped = list.iter().find(|n| n.id == k2).unwrap();
    assert_eq!(
        (
            dropped.state,
            dropped.attempts,
            dropped.last_error.as_deref()
        ),
        (NotificationState::Dropped, 0, Some("not a recovery"))
    );
    assert_eq!(
        s.delivery_attempts(k1).await.unwrap(),
        [failed.clone(), delivered]
    );
    assert!(s.delivery_attempts(k2).await.unwrap().is_empty());
    // Given up: listed among the failed.
    let k3 = b.iter().find(|n| n.made.key == "k3").unwrap().id;
    assert!(
        s.record_delivery(k3, "node-b", Some(&failed), &DeliveryEnd::Failed)
            .await
            .unwrap()
    );
    let failed_only = s.list_notifications("other", true, None, 10).await.unwrap();
    assert_eq!(failed_only.len(), 1);
    assert_eq!(failed_only[0].state, NotificationState::Failed);
    assert!(
        s.list_notifications("ns", true, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Nothing is left to claim.
    assert!(
        s.claim_notifications("node-c", t(10_000), t(10_030), 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Pruning takes what ended before the instant, with its attempts, a
    // page at a time, and nothing pending: k3 (given up) ended at 102, k1
    // (delivered) at 133, k2 (dropped) at 140.
    s.write(&[notification("k4", "ns", 100)]).await.unwrap();
    let ended: Vec<_> = s
        .list_notifications("ns", false, None, 10)
        .await
        .unwrap()
        .into_iter()
        .chain(
            s.list_notifications("other", false, None, 10)
                .await
                .unwrap(),
        )
        .filter_map(|n| n.ended_at.map(|e| (n.made.key, e)))
        .collect();
    assert_eq!(ended.len(), 3, "{ended:?}");
    assert_eq!(s.prune_notifications(t(102), 10).await.unwrap(), 0);
    assert_eq!(s.prune_notifications(t(103), 10).await.unwrap(), 1, "k3");
    assert_eq!(
        s.prune_notifications(t(10_000), 1).await.unwrap(),
        1,
        "a page of one"
    );
    assert_eq!(s.prune_notifications(t(10_000), 10).await.unwrap(), 1);
    assert!(s.delivery_attempts(k1).await.unwrap().is_empty());
    let left = s.list_notifications("ns", false, None, 10).await.unwrap();
    assert_eq!(
        left.iter()
            .map(|n| (n.made.key.as_str(), n.state))
            .collect::<Vec<_>>(),
        [("k4", NotificationState::Pending)]
    );
    assert!(
        s.list_notifications("other", false, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A success is a recovery when the job's last run before it that
/// succeeded or failed had failed; cancelled runs, other jobs' runs and
/// later runs do not count.
pub async fn a_recovery_is_told_by_the_last_run_that_succeeded_or_failed<S: Store>(s: &S) {
    let end = |run: i64, to: RunState| Write::RunState {
        run,
        from: RunState::Running,
        to,
        at: t(200),
    };
    let mut other = new_run(3, 130);
    other.job = "other".into();
    s.write(&[
        fire(100, Some(new_run(1, 100))),
        fire(110, Some(new_run(2, 110))),
        Write::Run(other),
        fire(140, Some(new_run(4, 140))),
        fire(150, Some(new_run(5, 150))),
        end(1, RunState::Failed),
        end(2, RunState::Cancelled),
        end(3, RunState::Succeeded),
        end(5, RunState::Succeeded),
    ])
    .await
    .unwrap();
    assert_eq!(s.previous_run_end("ns", "j", 1).await.unwrap(), None);
    // Run 2 was cancelled; run 3 is another job's; run 4 is unfinished.
    assert_eq!(
        s.previous_run_end("ns", "j", 5).await.unwrap(),
        Some(RunState::Failed)
    );
    assert_eq!(
        s.previous_run_end("ns", "j", 6).await.unwrap(),
        Some(RunState::Succeeded)
    );
    assert_eq!(
        s.previous_run_end("ns", "other", 9).await.unwrap(),
        Some(RunState::Succeeded)
    );
    assert_eq!(s.previous_run_end("elsewhere", "j", 9).await.unwrap(), None);
}

/// A job's failure breaker opens, in the batch that ends its N-th run in
/// a row that failed (counted after the batch's other writes, a cancelled
/// run counting for neither side), with its notifications; it is read
/// back with the job, closes once, and counts only later runs afterwards.
pub async fn a_breaker_opens_at_the_nth_failure_in_a_row_and_closes_once<S: Store>(s: &S) {
    s.apply_jobs(&[job("ns", "j", "{}")], t(1)).await.unwrap();
    let end = |run: i64, to: RunState| Write::RunState {
        run,
        from: RunState::Running,
        to,
        at: t(200),
    };
    let note = |key: &str| NewNotification {
        key: key.into(),
        namespace: "ns".into(),
        job: "j".into(),
        run: None,
        event: "breaker_opened".into(),
        notifier: "ops".into(),
        channel: "{}".into(),
        payload: "{}".into(),
        at: t(300),
    };
    let breaker = |open: Option<(i64, u32)>, key: &str| {
        Write::Breaker(BreakerWrite {
            namespace: "ns".into(),
            job: "j".into(),
            open,
            at: t(300),
            notifications: vec![note(key)],
        })
    };
    let runs: Vec<Write> = (1..=6)
        .map(|i| fire(100 + i, Some(new_run(i, 100 + i))))
        .collect();
    s.write(&runs).await.unwrap();
    // Failed, succeeded, failed, cancelled, failed: two in a row.
    let results = s
        .write(&[
            end(1, RunState::Failed),
            end(2, RunState::Succeeded),
            end(3, RunState::Failed),
            end(4, RunState::Cancelled),
            breaker(Some((5, 2)), "early"),
            end(5, RunState::Failed),
        ])
        .await
        .unwrap();
    // The breaker counted run 5, though written after it in the batch.
    assert_eq!(results[4], WriteResult::Done);
    let stored = s.get_job("ns", "j").await.unwrap().unwrap();
    let opened = stored.breaker.expect("open");
    assert_eq!(
        (opened.run, opened.failures, opened.opened_at),
        (5, 2, t(300))
    );
    let timing = s.load_job_timings(None, 10).await.unwrap();
    assert_eq!(timing[0].breaker, Some(opened));
    // Open already: no second opening, and no second notification.
    let again = s.write(&[breaker(Some((5, 2)), "twice")]).await.unwrap();
    assert!(matches!(&again[0], WriteResult::Conflict(why) if why.contains("stays open")));
    let keys = |list: Vec<NotificationRecord>| -> Vec<String> {
        list.into_iter().map(|n| n.made.key).collect()
    };
    assert_eq!(
        keys(s.list_notifications("ns", false, None, 10).await.unwrap()),
        ["early"]
    );
    // Closed once; a second close changes nothing.
    let closed = s
        .write(&[breaker(None, "closed"), breaker(None, "closed-twice")])
        .await
        .unwrap();
    assert_eq!(closed[0], WriteResult::Done);
    assert!(matches!(&closed[1], WriteResult::Conflict(why) if why.contains("stays closed")));
    assert_eq!(s.get_job("ns", "j").await.unwrap().unwrap().breaker, None);
    // Runs made before the close no longer count: run 6's failure is not
    // one of two.
    s.write(&[
        fire(120, Some(new_run(7, 120))),
        fire(121, Some(new_run(8, 121))),
    ])
    .await
    .unwrap();
    let after = s
        .write(&[
            end(6, RunState::Failed),
            end(7, RunState::Failed),
            breaker(Some((7, 2)), "too-soon"),
        ])
        .await
        .unwrap();
    assert!(matches!(&after[2], WriteResult::Conflict(_)), "{after:?}");
    let now = s
        .write(&[end(8, RunState::Failed), breaker(Some((8, 2)), "again")])
        .await
        .unwrap();
    assert_eq!(now[1], WriteResult::Done);
    assert_eq!(
        keys(s.list_notifications("ns", false, None, 10).await.unwrap()).len(),
        3,
        "early, closed and again"
    );
    // Another job's breaker, or no job: nothing.
    let none = s
        .write(&[Write::Breaker(BreakerWrite {
            namespace: "ns".into(),
            job: "gone".into(),
            open: None,
            at: t(300),
            notifications: vec![],
        })])
        .await
        .unwrap();
    assert!(matches!(&none[0], WriteResult::Conflict(_)));
}

/// A run with a key is stored once per job and key: a second one, in the
/// same batch or a later one, is refused and leaves nothing (its later
/// writes find no run); another job may use the same key; the key finds
/// its run until it is pruned, or its job deleted.
pub async fn a_run_key_makes_one_run_per_job_until_it_is_pruned<S: Store>(s: &S) {
    let keyed = |id: i64, job: &str, key: &str| {
        Write::Run(NewRun {
            job: job.into(),
            trigger: Trigger::Manual,
            key: Some(key.into()),
            created_at: t(10 + id),
            ..new_run(id, 10)
        })
    };
    let results = s
        .write(&[
            keyed(1, "j", "delivery-1"),
            keyed(2, "j", "delivery-1"),
            Write::RunState {
                run: 2,
                from: RunState::Running,
                to: RunState::Failed,
                at: t(20),
            },
            keyed(3, "other", "delivery-1"),
        ])
        .await
        .unwrap();
    assert_eq!(results[0], WriteResult::Done);
    assert!(matches!(&results[1], WriteResult::Conflict(why) if why.contains("delivery-1")));
    assert!(
        matches!(&results[2], WriteResult::Conflict(_)),
        "{results:?}"
    );
    assert_eq!(results[3], WriteResult::Done);
    assert!(
        s.get_run(2).await.unwrap().is_none(),
        "nothing of it stored"
    );
    let again = s.write(&[keyed(4, "j", "delivery-1")]).await.unwrap();
    assert!(matches!(&again[0], WriteResult::Conflict(_)));
    assert!(s.get_run(4).await.unwrap().is_none());
    assert_eq!(
        s.run_of_key("ns", "j", "delivery-1").await.unwrap(),
        Some(1)
    );
    assert_eq!(
        s.run_of_key("ns", "other", "delivery-1").await.unwrap(),
        Some(3)
    );
    assert_eq!(s.run_of_key("ns", "j", "delivery-2").await.unwrap(), None);
    assert_eq!(
        s.run_of_key("elsewhere", "j", "delivery-1").await.unwrap(),
        None
    );
    // A job deleted takes its keys with it; another job's stay.
    s.apply_jobs(&[job("ns", "other", "{}")], t(1))
        .await
        .unwrap();
    assert!(s.delete_job("ns", "other").await.unwrap());
    assert_eq!(
        s.run_of_key("ns", "other", "delivery-1").await.unwrap(),
        None
    );
    assert_eq!(
        s.run_of_key("ns", "j", "delivery-1").await.unwrap(),
        Some(1)
    );
    // Pruned by age, a batch at a time.
    assert_eq!(s.prune_run_keys(t(12), 10).await.unwrap(), 1);
    assert_eq!(s.run_of_key("ns", "j", "delivery-1").await.unwrap(), None);
    assert_eq!(
        s.prune_run_keys(t(100), 10).await.unwrap(),
        0,
        "other's went with it"
    );
    assert_eq!(
        s.write(&[keyed(5, "j", "delivery-1")]).await.unwrap()[0],
        WriteResult::Done
    );
}

/// A fire's SLA miss is recorded in the ledger once, with its
/// notifications the first time only; a fire the ledger does not have
/// records nothing.
pub async fn an_sla_miss_is_recorded_once_with_its_notifications<S: Store>(s: &S) {
    s.write(&[fire(100, Some(new_run(1, 100))), fire(200, None)])
        .await
        .unwrap();
    let miss = |at: i64, key: &str| Write::SlaMissed {
        namespace: "ns".into(),
        job: "j".into(),
        scheduled_at: t(at),
        at: t(at + 50),
        notifications: vec![NewNotification {
            key: key.into(),
            namespace: "ns".into(),
            job: "j".into(),
            run: None,
            event: "sla_missed".into(),
            notifier: "ops".into(),
            channel: "{}".into(),
            payload: "{}".into(),
            at: t(at + 50),
        }],
    };
    let results = s
        .write(&[
            miss(100, "first"),
            miss(100, "again"),
            miss(200, "skipped"),
            miss(300, "none"),
        ])
        .await
        .unwrap();
    assert_eq!(results[0], WriteResult::Done);
    assert!(
        matches!(&results[1], WriteResult::Conflict(_)),
        "{results:?}"
    );
    assert_eq!(
        results[2],
        WriteResult::Done,
        "a fire with no run misses too"
    );
    assert!(matches!(&results[3], WriteResult::Conflict(_)));
    let fires = s.list_fires("ns", "j", t(0), t(1000), 10).await.unwrap();
    assert_eq!(
        fires.iter().map(|f| f.sla_missed_at).collect::<Vec<_>>(),
        [Some(t(150)), Some(t(250))]
    );
    let mut keys: Vec<String> = s
        .list_notifications("ns", false, None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.made.key)
        .collect();
    keys.sort();
    assert_eq!(keys, ["first", "skipped"]);
}
