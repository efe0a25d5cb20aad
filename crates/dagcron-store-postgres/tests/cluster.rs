//! Membership, leases, fencing and hand-over on a real PostgreSQL server.

use dagcron_testkit::until_async;
use std::time::Duration;

use dagcron_core::{AttemptState, FireOutcome, RunState, TaskState};
use dagcron_store::cluster::{Coordination, Heartbeat, NodeState};
use dagcron_store::conformance::new_run;
use dagcron_store::prelude::*;
use dagcron_store::{JobUpsert, StorageError, Write, WriteResult};
use dagcron_store_postgres::PgStore;
use dagcron_test_pg::TestDatabase;
use jiff::Timestamp;
use sqlx::Connection;

const TTL: Duration = Duration::from_secs(60);

fn fire(at: i64, run_id: i64) -> Write {
    Write::Fire {
        namespace: "ns".into(),
        job: "j".into(),
        scheduled_at: Timestamp::from_second(at).unwrap(),
        outcome: FireOutcome::Fired,
        calendar: None,
        run: Some(new_run(run_id, at)),
    }
}

async fn node(db: &TestDatabase, id: &str) -> PgStore {
    let store = PgStore::connect(&db.url, 4).await.unwrap();
    store
        .register(id, "127.0.0.1:0", "test", TTL)
        .await
        .unwrap();
    store
}

/// Ends a node's lease by moving it into the past, as if time had passed.
async fn expire(db: &TestDatabase, id: &str) {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("UPDATE nodes SET lease_until = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn registrations_get_distinct_epochs_and_slots() {
    let db = TestDatabase::create("registrations").await;
    let a = PgStore::connect(&db.url, 2).await.unwrap();
    let b = PgStore::connect(&db.url, 2).await.unwrap();
    let ra = a.register("a", "x", "v", TTL).await.unwrap();
    let rb = b.register("b", "y", "v", TTL).await.unwrap();
    assert_ne!(ra.epoch, rb.epoch);
    assert_ne!(ra.slot, rb.slot);
    let again = a.register("a", "x", "v", TTL).await.unwrap();
    assert!(again.epoch > rb.epoch, "a new registration is a new epoch");
    let nodes = a.nodes().await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(
        nodes
            .iter()
            .all(|n| n.state == NodeState::Alive && n.lease_valid)
    );
    // A node owns no job until a heartbeat has checked its clock.
    assert!(nodes.iter().all(|n| !n.eligible), "{nodes:?}");
    assert!(
        a.heartbeat(
            Heartbeat {
                eligible: false,
                clock_skew_us: 1234,
                owned_jobs: 7
            },
            TTL
        )
        .await
        .unwrap()
    );
    let n = &a.nodes().await.unwrap()[0];
    assert_eq!(
        (n.eligible, n.clock_skew_us, n.owned_jobs),
        (false, 1234, 7)
    );
}

/// A fire is never made before its instant by the database's clock: one
/// made early (its node's clock ahead) is refused and nothing is written;
/// a run made ahead of its instant on purpose (`send_ahead`, made before
/// its instant by its node's clock too) is not refused.
#[tokio::test]
async fn a_fire_made_before_its_instant_by_the_database_clock_is_refused() {
    let db = TestDatabase::create("early-fires").await;
    let a = node(&db, "a").await;
    let soon = Timestamp::now().as_second() + 30;
    match &a.write(&[fire(soon, 1)]).await.unwrap()[..] {
        [WriteResult::Early(why)] => assert!(why.contains("before its instant"), "{why}"),
        other => panic!("expected an early fire refused, got {other:?}"),
    }
    assert!(a.get_run(1).await.unwrap().is_none(), "nothing was written");
    let skipped = Write::Fire {
        namespace: "ns".into(),
        job: "j".into(),
        scheduled_at: Timestamp::from_second(soon).unwrap(),
        outcome: FireOutcome::SkippedOverlap,
        calendar: None,
        run: None,
    };
    assert!(matches!(
        &a.write(&[skipped]).await.unwrap()[..],
        [WriteResult::Early(_)]
    ));
    let mut ahead = fire(soon, 2);
    if let Write::Fire { run: Some(r), .. } = &mut ahead {
        r.created_at = Timestamp::from_second(soon - 5).unwrap();
    }
    assert_eq!(a.write(&[ahead]).await.unwrap(), [WriteResult::Done]);
    // The same instant once it has come is no longer early.
    assert_eq!(
        a.write(&[fire(Timestamp::now().as_second() - 1, 3)])
            .await
            .unwrap(),
        [WriteResult::Done]
    );
}

#[tokio::test]
async fn an_expired_or_replaced_node_cannot_write() {
    let db = TestDatabase::create("fencing").await;
    let a = node(&db, "a").await;
    assert_eq!(a.write(&[fire(1, 1)]).await.unwrap(), [WriteResult::Done]);

    expire(&db, "a").await;
    match a.write(&[fire(2, 2)]).await {
        Err(StorageError::Fenced(m)) => assert!(m.contains("node a"), "{m}"),
        other => panic!("expected a fenced write, got {other:?}"),
    }
    assert!(
        !a.heartbeat(
            Heartbeat {
                eligible: true,
                clock_skew_us: 0,
                owned_jobs: 0
            },
            TTL
        )
        .await
        .unwrap(),
        "an ended lease is not renewed"
    );
    assert!(a.get_run(2).await.unwrap().is_none(), "nothing was written");

    // A second process registering under the same name fences the first.
    let b = node(&db, "b").await;
    let a2 = node(&db, "b").await;
    assert!(matches!(
        b.write(&[fire(3, 3)]).await,
        Err(StorageError::Fenced(_))
    ));
    assert_eq!(a2.write(&[fire(3, 3)]).await.unwrap(), [WriteResult::Done]);
}

#[tokio::test]
async fn runs_of_a_dead_node_are_adopted_once() {
    let db = TestDatabase::create("adoption").await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    let c = node(&db, "c").await;
    a.write(&[fire(1, 1), fire(2, 2)]).await.unwrap();
    b.write(&[fire(3, 3)]).await.unwrap();
    assert!(b.orphan_runs().await.unwrap().is_empty(), "a is alive");
    assert!(b.active_runs().await.unwrap().iter().all(|r| r.id == 3));

    expire(&db, "a").await;
    let reaped = b.reap().await.unwrap();
    assert_eq!(reaped.len(), 1);
    assert_eq!(
        (reaped[0].id.as_str(), reaped[0].state),
        ("a", NodeState::Dead)
    );
    let orphans: Vec<i64> = b
        .orphan_runs()
        .await
        .unwrap()
        .iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(orphans, [1, 2]);

    let taken = b.adopt_runs(&[1]).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].state, RunState::Running);
    assert!(c.adopt_runs(&[1]).await.unwrap().is_empty(), "adopted once");
    assert_eq!(c.adopt_runs(&[1, 2]).await.unwrap().len(), 1);
    let mut mine: Vec<i64> = b
        .active_runs()
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    mine.sort();
    assert_eq!(mine, [1, 3]);

    // Cancellation asked through any node reaches the owner.
    assert!(a.request_cancel(2).await.unwrap());
    assert!(b.take_cancel_requests().await.unwrap().is_empty());
    assert_eq!(c.take_cancel_requests().await.unwrap(), [2]);
    assert!(c.take_cancel_requests().await.unwrap().is_empty());

    // So do interventions on tasks, in the order they were asked.
    assert!(a.request_intervention(1, "t", "retry").await.unwrap());
    assert!(c.request_intervention(3, "t", "fail").await.unwrap());
    assert!(
        a.request_intervention(1, "u", "mark_skipped")
            .await
            .unwrap()
    );
    assert!(
        !a.request_intervention(99, "t", "retry").await.unwrap(),
        "no such run"
    );
    assert!(c.take_intervention_requests().await.unwrap().is_empty());
    let asked = |run: i64, task: &str, action: &str| (run, task.to_string(), action.to_string());
    assert_eq!(
        b.take_intervention_requests().await.unwrap(),
        [
            asked(1, "t", "retry"),
            asked(3, "t", "fail"),
            asked(1, "u", "mark_skipped")
        ]
    );
    assert!(b.take_intervention_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn graceful_leave_hands_runs_over_without_waiting_for_the_lease() {
    let db = TestDatabase::create("leave").await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    a.write(&[fire(1, 1)]).await.unwrap();
    a.set_state(NodeState::Draining).await.unwrap();
    assert!(
        b.orphan_runs().await.unwrap().is_empty(),
        "a drains its runs"
    );
    a.write(&[Write::RunState {
        run: 1,
        from: RunState::Running,
        to: RunState::Succeeded,
        at: Timestamp::from_second(5).unwrap(),
    }])
    .await
    .expect("a draining node may still write");
    a.set_state(NodeState::Left).await.unwrap();
    assert!(matches!(
        a.write(&[fire(9, 9)]).await,
        Err(StorageError::Fenced(_))
    ));
    let nodes = b.nodes().await.unwrap();
    assert!(!nodes[0].lease_valid && nodes[0].state == NodeState::Left);
}

#[tokio::test]
async fn job_changes_bump_the_revision_and_wake_listeners() {
    let db = TestDatabase::create("revision").await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    let r0 = b.jobs_revision().await.unwrap();
    assert!(
        b.wait_for_change(Duration::from_millis(50))
            .await
            .unwrap()
            .is_empty()
    );
    let job = dagcron_store::JobUpsert {
        namespace: "ns".into(),
        name: "j".into(),
        spec: "{}".into(),
        timing: "{}".into(),
        paused: false,
        origin: Default::default(),
        rules: None,
    };
    a.apply_jobs(
        std::slice::from_ref(&job),
        Timestamp::from_second(1).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        b.wait_for_change(Duration::from_secs(10)).await.unwrap(),
        ["jobs"]
    );
    let r1 = b.jobs_revision().await.unwrap();
    assert!(r1 > r0);
    a.apply_jobs(&[job], Timestamp::from_second(2).unwrap())
        .await
        .unwrap();
    assert_eq!(
        b.jobs_revision().await.unwrap(),
        r1,
        "unchanged jobs change nothing"
    );
    a.set_paused("ns", "j", true).await.unwrap();
    assert!(b.jobs_revision().await.unwrap() > r1);
    let now = b.database_now().await.unwrap();
    assert!((Timestamp::now().as_second() - now.as_second()).abs() < 5);
}

/// A node catches up on jobs by reading only what changed after the jobs
/// revision it has seen: applies, pauses, deletions (as tombstones, gone
/// again when the job comes back).
#[tokio::test]
async fn a_node_reads_only_the_jobs_changed_since_its_revision() {
    let db = TestDatabase::create("changes").await;
    let store = PgStore::connect(&db.url, 4).await.unwrap();
    let upsert = |name: &str, spec: &str| JobUpsert {
        namespace: "ns".into(),
        name: name.into(),
        spec: spec.into(),
        timing: spec.into(),
        paused: false,
        origin: Default::default(),
        rules: None,
    };
    let at = Timestamp::from_second(1).unwrap();
    let since = async |revision: i64| {
        let c = store.jobs_changed_since(revision).await.unwrap();
        let mut changed: Vec<String> = c
            .changed
            .iter()
            .map(|j| format!("{}:{}:{}", j.name, j.version, j.paused))
            .collect();
        changed.sort();
        let deleted: Vec<String> = c.deleted.iter().map(|(_, n)| n.clone()).collect();
        (c.revision, changed, deleted)
    };
    let r0 = store.jobs_revision().await.unwrap();
    store
        .apply_jobs(&[upsert("a", "{1}"), upsert("b", "{1}")], at)
        .await
        .unwrap();
    let (r1, changed, deleted) = since(r0).await;
    assert_eq!(
        (changed, deleted),
        (vec!["a:1:false".to_string(), "b:1:false".into()], vec![])
    );
    assert!(r1 > r0);
    assert_eq!(since(r1).await.1.len(), 0, "nothing new");

    store
        .apply_jobs(&[upsert("a", "{1}"), upsert("b", "{2}")], at)
        .await
        .unwrap();
    let (r2, changed, _) = since(r1).await;
    assert_eq!(changed, ["b:2:false"], "the unchanged job is not read");
    assert!(store.set_paused("ns", "a", true).await.unwrap());
    let (r3, changed, _) = since(r2).await;
    assert_eq!(changed, ["a:1:true"]);
    assert!(store.delete_job("ns", "b").await.unwrap());
    let (r4, changed, deleted) = since(r3).await;
    assert_eq!((changed.len(), deleted), (0, vec!["b".to_string()]));
    store.apply_jobs(&[upsert("b", "{3}")], at).await.unwrap();
    let (_, changed, deleted) = since(r4).await;
    assert_eq!(
        (changed, deleted.len()),
        (vec!["b:3:false".to_string()], 0),
        "the tombstone is gone"
    );
    let (_, changed, deleted) = since(-1).await;
    assert_eq!(
        changed,
        ["a:1:true", "b:3:false"],
        "everything, for a node that saw nothing"
    );
    assert!(deleted.is_empty());
}

/// Updates of `table` so far, once the store's backends have sent their
/// statistics (at most once a second, and when they close).
async fn updates(db: &TestDatabase, table: &str, at_least: i64) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut conn)
            .await
            .unwrap();
        let all: i64 =
            sqlx::query_scalar("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = $1")
                .bind(table)
                .fetch_one(&mut conn)
                .await
                .unwrap();
        if all >= at_least || std::time::Instant::now() > deadline {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn task_to(task: &str, from: TaskState, to: TaskState) -> Write {
    Write::TaskState {
        run: 1,
        task: task.into(),
        from,
        to,
    }
}

fn attempt_end(task: &str, at: Timestamp, for_other_node: bool) -> Write {
    Write::AttemptEnd {
        outputs: Default::default(),
        run: 1,
        task: task.into(),
        number: 1,
        from: AttemptState::Running,
        to: AttemptState::Succeeded,
        at,
        exit_code: Some(0),
        error: None,
        log: b"done".to_vec(),
        lines: Vec::new(),
        start_error_us: None,
        for_other_node,
    }
}

/// Run 1 on node `a`: its task a started there, its task b handed to the
/// cluster, both at `at`.
async fn one_task_here_one_shared(a: &PgStore, at: Timestamp) {
    a.write(&[fire(1, 1)]).await.unwrap();
    let start = |task: &str, state: AttemptState| Write::AttemptStart {
        priority: Default::default(),
        run: 1,
        task: task.into(),
        number: 1,
        state,
        at,
        run_on: None,
    };
    let done = a
        .write(&[
            task_to("a", TaskState::Pending, TaskState::Running),
            start("a", AttemptState::Running),
            task_to("b", TaskState::Pending, TaskState::Dispatching),
            start("b", AttemptState::Dispatching),
        ])
        .await
        .unwrap();
    assert!(done.iter().all(|r| *r == WriteResult::Done), "{done:?}");
}

/// A run's tasks and attempts are kept in its row: each batch that changes
/// them writes that one row once. An attempt handed to the cluster waits in
/// the queue until a node takes it or it is withdrawn; either way it leaves
/// the queue.
#[tokio::test]
async fn a_batch_writes_a_run_and_its_tasks_and_attempts_as_one_row() {
    let db = TestDatabase::create("one_row").await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    one_task_here_one_shared(&a, Timestamp::from_second(2).unwrap()).await;
    let ended = a
        .write(&[
            attempt_end("a", Timestamp::from_second(3).unwrap(), false),
            task_to("a", TaskState::Running, TaskState::Succeeded),
        ])
        .await
        .unwrap();
    assert!(ended.iter().all(|r| *r == WriteResult::Done), "{ended:?}");
    let queued = "SELECT count(*) FROM shared_attempts WHERE node_epoch IS NULL";
    assert_eq!(db.scalar(queued), 1);

    // Withdrawn before any node took it: out of the queue, and no node ran it.
    let withdrawn = Write::AttemptWithdraw {
        run: 1,
        task: "b".into(),
        number: 1,
        at: Timestamp::from_second(4).unwrap(),
    };
    assert_eq!(a.write(&[withdrawn]).await.unwrap(), [WriteResult::Done]);
    assert_eq!(db.scalar(queued), 0);
    assert!(
        b.claim_attempts(8, &[], Timestamp::from_second(5).unwrap())
            .await
            .unwrap()
            .is_empty()
    );
    let run = a.get_run(1).await.unwrap().unwrap();
    let node_of = |t: &str| {
        let task = run.tasks.iter().find(|x| x.id == t).unwrap();
        (task.attempts[0].state, task.attempts[0].node_epoch)
    };
    let epoch = db.scalar("SELECT epoch FROM nodes WHERE id = 'a'");
    assert_eq!(node_of("a"), (AttemptState::Succeeded, Some(epoch)));
    assert_eq!(node_of("b"), (AttemptState::Cancelled, None));

    // The run was inserted once and written once by each of the three
    // batches that changed it (the starts, the end of a, the withdrawal);
    // the claim that found nothing to take wrote nothing.
    drop((a, b));
    assert_eq!(updates(&db, "runs", 3).await, 3);
    assert_eq!(
        db.scalar("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'runs'"),
        1
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM attempt_logs"),
        1,
        "the output of a's attempt, kept apart"
    );
}

/// An attempt a node claimed and ran for another node's run: its end wakes
/// the run's owner, which reads it among its remote attempts. The end of an
/// attempt of the node's own run wakes no one.
#[tokio::test]
async fn the_end_of_an_attempt_run_for_another_node_wakes_its_owner() {
    let db = TestDatabase::create("foreign_end").await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    let at = Timestamp::from_second(2).unwrap();
    one_task_here_one_shared(&a, at).await;
    let claimed = b.claim_attempts(8, &[], at).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].run, claimed[0].task.as_str()), (1, "b"));
    // What the setup woke (attempts to claim) is read first.
    for _ in 0..10 {
        if a.wait_for_change(Duration::from_millis(200))
            .await
            .unwrap()
            .is_empty()
        {
            break;
        }
    }

    assert_eq!(
        a.write(&[attempt_end("a", at, false)]).await.unwrap(),
        [WriteResult::Done]
    );
    let woken = a.wait_for_change(Duration::from_millis(500)).await.unwrap();
    assert!(!woken.iter().any(|w| w == "attempts"), "{woken:?}");

    assert_eq!(
        b.write(&[attempt_end("b", at, true)]).await.unwrap(),
        [WriteResult::Done]
    );
    let woken = a.wait_for_change(Duration::from_secs(10)).await.unwrap();
    assert!(woken.iter().any(|w| w == "attempts"), "{woken:?}");
    let remote = a.remote_attempts().await.unwrap();
    assert_eq!(remote.len(), 1);
    assert_eq!(
        (remote[0].task.as_str(), remote[0].state),
        ("b", AttemptState::Succeeded)
    );
}

/// Two batches that end the same runs, committed at once on two
/// connections, one in the other's reverse order: both held up by the
/// middle run, locked elsewhere. Each writes its rows in order of id, and
/// the one that comes second finds them changed, reads them again and is
/// refused. Each run ends once, as the batch that got to it first says;
/// the other batch is told, run by run, that the run had moved on. The engine never sends such batches side by side; the store holds
/// if it did.
#[tokio::test]
async fn batches_racing_over_the_same_runs_end_each_run_once() {
    let db = TestDatabase::create("racing_batches").await;
    let a = node(&db, "a").await;
    let ids: Vec<i64> = (1..=200).collect();
    let fires: Vec<Write> = ids.iter().map(|&i| fire(i, i)).collect();
    a.write(&fires).await.unwrap();
    let end = |to: RunState, ids: &[i64]| -> Vec<Write> {
        ids.iter()
            .map(|&run| Write::RunState {
                run,
                from: RunState::Running,
                to,
                at: Timestamp::from_second(1_000).unwrap(),
            })
            .collect()
    };
    let reversed: Vec<i64> = ids.iter().rev().copied().collect();
    let (succeeded, failed) = (
        end(RunState::Succeeded, &ids),
        end(RunState::Failed, &reversed),
    );

    // The middle run is held, so that both batches wait for it with half
    // of the runs each.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE id = 100 FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let (x, y, ()) = tokio::join!(a.write(&succeeded), a.write(&failed), async {
        waiting_for_locks(&db, 2).await;
        sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    });
    let (x, y) = (x.unwrap(), y.unwrap());
    for (k, &run) in ids.iter().enumerate() {
        let (first, second) = (&x[k], &y[ids.len() - 1 - k]);
        let done = [first, second]
            .iter()
            .filter(|r| ***r == WriteResult::Done)
            .count();
        assert_eq!(done, 1, "run {run}: {first:?} and {second:?}");
        let expected = if *first == WriteResult::Done {
            RunState::Succeeded
        } else {
            RunState::Failed
        };
        assert_eq!(
            a.get_run(run).await.unwrap().unwrap().state,
            expected,
            "run {run}"
        );
    }
}

/// Waits (bounded) until `n` sessions of the test's database wait for a lock.
async fn waiting_for_locks(db: &TestDatabase, n: i64) {
    let mut watcher = sqlx::PgConnection::connect(&db.url).await.unwrap();
    until_async(&format!("{n} session(s) wait for a lock"), async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting == n { Ok(()) } else { Err(waiting) }
    })
    .await;
}

/// A run deleted (by retention, say) after a batch read its row and before
/// the batch wrote it: the batch reads it again, finds nothing, and its
/// writes of that run are refused as writes of no run would be. Nothing
/// they would have done is kept: no output of an attempt of a run that is
/// gone.
#[tokio::test]
async fn the_writes_of_a_run_deleted_under_a_batch_find_no_run() {
    let db = TestDatabase::create("deleted_under_batch").await;
    let a = node(&db, "a").await;
    one_task_here_one_shared(&a, Timestamp::from_second(2).unwrap()).await;

    // The run's row is held, so that the batch reads it and then waits to
    // write it; meanwhile it is deleted.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE id = 1 FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let writes = [
        attempt_end("a", Timestamp::from_second(3).unwrap(), false),
        task_to("a", TaskState::Running, TaskState::Succeeded),
    ];
    let (results, ()) = tokio::join!(a.write(&writes), async {
        waiting_for_locks(&db, 1).await;
        sqlx::query("DELETE FROM runs WHERE id = 1")
            .execute(&mut holder)
            .await
            .unwrap();
        sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    });
    let results = results.unwrap();
    assert!(
        results.iter().all(|r| *r != WriteResult::Done),
        "{results:?}"
    );
    assert!(a.get_run(1).await.unwrap().is_none());
    assert_eq!(db.scalar("SELECT count(*) FROM attempt_logs"), 0);
}

/// The cluster's queue is claimed in order of rank: the instant an attempt
/// was handed over less 10 s a level of priority. Priority 5 handed over
/// at 105 s ranks 55 s, before priority 0 at 100 s; priority -10 handed
/// over first, at 50 s, ranks 150 s and goes last.
#[tokio::test]
async fn the_cluster_queue_is_claimed_by_priority_and_waiting() {
    let db = TestDatabase::create("queue_rank").await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    a.write(&[fire(1, 1), fire(2, 2)]).await.unwrap();
    let hand_over = |run: i64, task: &str, at: i64, priority: i32| {
        [
            Write::TaskState {
                run,
                task: task.into(),
                from: TaskState::Pending,
                to: TaskState::Dispatching,
            },
            Write::AttemptStart {
                run,
                task: task.into(),
                number: 1,
                state: AttemptState::Dispatching,
                at: Timestamp::from_second(at).unwrap(),
                run_on: None,
                priority,
            },
        ]
    };
    for (run, task, at, priority) in [(1, "b", 50, -10), (1, "a", 100, 0), (2, "a", 105, 5)] {
        let done = a.write(&hand_over(run, task, at, priority)).await.unwrap();
        assert!(done.iter().all(|r| *r == WriteResult::Done), "{done:?}");
    }
    // The rank is computed by the database from the instant and the
    // priority; a node of the version before, which writes neither
    // priority nor rank, queues at its instant.
    let rank = "SELECT rank FROM shared_attempts WHERE run_id = 1 AND task_id = 'b'";
    assert_eq!(db.scalar(rank), 150_000_000);
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM shared_attempts WHERE rank = queued_at - priority * 10000000"
        ),
        3
    );
    let mut order = Vec::new();
    for _ in 0..3 {
        let claimed = b
            .claim_attempts(1, &[], Timestamp::from_second(200).unwrap())
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "{claimed:?}");
        order.push((claimed[0].run, claimed[0].task.clone()));
    }
    assert_eq!(
        order,
        [
            (2, "a".to_string()),
            (1, "a".to_string()),
            (1, "b".to_string())
        ]
    );
}
