//! The engine's own tests (the integration tests are in tests/engine.rs).

use super::*;
use dagcron_store::memory::MemoryStore;

/// The next command that work done beside the loop sends back.
async fn back(commands: &mut mpsc::Receiver<Command>) -> Command {
    tokio::time::timeout(Duration::from_secs(30), commands.recv())
        .await
        .expect("the work beside the loop reports back")
        .expect("the channel is open")
}

/// Applies `jobs` as the loop would: the store's answer comes back as a
/// command, handled then.
async fn apply<S: Store>(
    engine: &mut Engine<S>,
    commands: &mut mpsc::Receiver<Command>,
    jobs: Vec<Job>,
) {
    let (reply, applied) = oneshot::channel();
    engine.on_command(Request::Apply {
        jobs,
        origin: Origin::default(),
        reply,
    });
    assert!(
        engine.jobs.table.is_empty(),
        "nothing changes before the store answers"
    );
    let answer = back(commands).await;
    assert!(matches!(answer, Command::Done(Completion::Applied { .. })));
    engine.on_command(answer);
    while engine.jobs.installing.is_some() {
        let now = engine.clock.now();
        engine.install_some(now);
    }
    engine.flush().await.unwrap();
    applied.await.unwrap().unwrap();
}

/// A large apply is answered once the store has it, then installed a
/// slice at a time (the loop looks at its timers between slices, and takes
/// no other command until the whole apply is in).
#[tokio::test]
async fn a_large_apply_is_installed_a_slice_at_a_time() {
    let (mut engine, clock, (mut commands, _handle)) = engine_at("2026-01-10T00:00:00Z").await;
    let n = INSTALL_SLICE * 2 + INSTALL_SLICE / 2;
    let mut yaml = String::from("namespace: t\njobs:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ name: j{i}, schedule: '0 0 * * * *', tasks: [{{ id: a, noop: true }}] }}\n"
        ));
    }
    let (reply, mut applied) = oneshot::channel();
    engine.on_command(Request::Apply {
        jobs: jobs(&yaml),
        origin: Origin::default(),
        reply,
    });
    let answer = back(&mut commands).await;
    assert!(applied.try_recv().is_err(), "answered once committed");
    engine.on_command(answer);
    let answer = applied.try_recv().unwrap().unwrap();
    assert_eq!(answer.len(), n);
    let now = clock.now();
    for installed in [INSTALL_SLICE, 2 * INSTALL_SLICE] {
        assert_eq!(engine.jobs.table.len(), installed);
        assert!(engine.jobs.installing.is_some());
        engine.install_some(now);
    }
    assert_eq!(engine.jobs.table.len(), n);
    assert!(engine.jobs.installing.is_none());
    assert!(
        answer
            .iter()
            .all(|(_, r)| matches!(r, ApplyResult::Created(1)))
    );
    // Each is armed for its first fire (a timer that reads the job ahead
    // of it: an hourly job is not kept in memory).
    let hour = "2026-01-10T01:00:00Z".parse().unwrap();
    let mut armed = 0;
    while let Some(timer) = engine.timers.queue.pop_due(hour) {
        assert!(matches!(timer, Timer::Prepare { at, .. } if at == hour));
        armed += 1;
    }
    assert_eq!(armed, n);
}

/// An engine on a new in-memory store at `at`, not yet running.
async fn engine_at(
    at: &str,
) -> (
    Engine<MemoryStore>,
    Arc<crate::ManualClock>,
    (mpsc::Receiver<Command>, EngineHandle),
) {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(crate::ManualClock::new(at.parse().unwrap()));
    let (mut engine, handle) = Engine::start(store, clock.clone(), EngineConfig::default())
        .await
        .unwrap();
    // The handle keeps the channel open for the work done beside the loop.
    let commands = engine.life.commands.take().unwrap();
    (engine, clock, (commands, handle))
}

fn jobs(yaml: &str) -> Vec<Job> {
    let file: dagcron_core::JobFile = serde_saphyr::from_str(yaml).unwrap();
    file.validate().unwrap()
}

/// A job read from the store ahead of its fire held every timer while the
/// store answered; so did a trigger of a job not in memory. Both reads now
/// run beside the loop and come back as commands.
#[tokio::test]
async fn reads_of_jobs_for_fires_and_triggers_do_not_hold_the_loop() {
    let (mut engine, clock, (mut commands, _handle)) = engine_at("2026-01-10T00:00:00Z").await;
    apply(
        &mut engine,
        &mut commands,
        jobs("namespace: t\njobs:\n  - { name: hourly, schedule: '@hourly', concurrency: allow, tasks: [{ id: a, noop: true }] }\n"),
    )
    .await;
    let key = ("t".to_string(), "hourly".to_string());
    assert!(
        engine.jobs.table[&key].job.is_none(),
        "its fire is far: let go"
    );

    // Half a second before the fire, the job is read beside the loop.
    clock.set("2026-01-10T00:59:59.6Z".parse().unwrap());
    engine.on_timers();
    assert!(engine.batch.writes.is_empty() && engine.jobs.table[&key].job.is_none());
    let read = back(&mut commands).await;
    assert!(matches!(read, Command::Done(Completion::Prepared { .. })));
    engine.on_command(read);
    assert!(engine.jobs.table[&key].job.is_some());
    clock.set("2026-01-10T01:00:00Z".parse().unwrap());
    engine.on_timers();
    assert_eq!(engine.runs.table.len(), 1, "fired on time");

    // A trigger of a job not in memory.
    let (mut engine2, _, (mut commands2, _handle2)) = engine_at("2026-01-10T00:00:00Z").await;
    apply(
        &mut engine2,
        &mut commands2,
        jobs("namespace: t\njobs:\n  - { name: manual, tasks: [{ id: a, noop: true }] }\n"),
    )
    .await;
    let key = ("t".to_string(), "manual".to_string());
    engine2.jobs.table.get_mut(&key).unwrap().job = None;
    // Triggers that come while it is read wait for the same read.
    let mut answers = Vec::new();
    for runs in [1, 3] {
        let (reply, triggered) = oneshot::channel();
        engine2.on_command(Request::Trigger {
            namespace: key.0.clone(),
            name: key.1.clone(),
            ask: handle::WaitingTrigger {
                runs: vec![Default::default(); runs],
                caller: None,
                at: None,
                by: TriggerBy::default(),
                reply,
                key_checked: false,
            },
        });
        answers.push(triggered);
    }
    assert!(engine2.runs.table.is_empty() && engine2.batch.writes.is_empty());
    assert_eq!(
        engine2.jobs.loading[&key].len(),
        2,
        "one read, two triggers waiting"
    );
    let read = back(&mut commands2).await;
    assert!(matches!(read, Command::Done(Completion::Loaded { .. })));
    engine2.on_command(read);
    assert!(engine2.jobs.loading.is_empty());
    engine2.flush().await.unwrap();
    let mut made = Vec::new();
    for answer in answers {
        made.extend(answer.await.unwrap().unwrap().into_iter().map(|r| r.id));
    }
    assert_eq!(made.len(), 4);
    for id in made {
        assert!(
            engine2.store.get_run(id).await.unwrap().is_some(),
            "committed"
        );
    }
}

/// One backfill over a job with many schedules held the loop for 52 s,
/// every other job firing that late. Handling the command now only
/// starts the listing beside the loop: nothing is decided until the
/// listed fires come back as a command of their own.
#[tokio::test]
async fn regression_a_backfill_does_not_hold_the_loop() {
    let (mut engine, _clock, (mut commands, _handle)) = engine_at("2026-01-10T00:00:00Z").await;
    // 64 schedules: one per second of each minute, and 4 more at the same instants.
    let schedules: Vec<String> = (0..64)
        .map(|i| match i {
            0..60 => format!("'{i} * * * * *'"),
            _ => format!("'{} */2 * * * *'", i - 60),
        })
        .collect();
    let file: dagcron_core::JobFile = serde_saphyr::from_str(&format!(
        "namespace: t\njobs:\n  - {{ name: wide, schedule: [{}], concurrency: allow, tasks: [{{ id: a, noop: true }}] }}\n",
        schedules.join(", ")
    ))
    .unwrap();
    apply(&mut engine, &mut commands, file.validate().unwrap()).await;
    let (reply, done) = oneshot::channel();
    engine.on_command(Request::Backfill {
        namespace: "t".into(),
        name: "wide".into(),
        from: "2026-01-09T21:30:00Z".parse().unwrap(),
        to: "2026-01-10T00:00:00Z".parse().unwrap(),
        reply,
    });
    // The loop is free at once: no run decided, no write queued.
    assert!(engine.batch.writes.is_empty() && engine.runs.table.is_empty());
    // The listing comes back as a command; handled, it makes the runs.
    let listed = back(&mut commands).await;
    assert!(matches!(
        listed,
        Command::Done(Completion::Backfilled { .. })
    ));
    engine.on_command(listed);
    engine.flush().await.unwrap();
    assert_eq!(done.await.unwrap().unwrap().len(), 9000);
}

/// Resuming a job whose fires were missed while it was paused read the
/// job in the loop, holding every timer while the store answered. The job
/// of the fires to catch up is now read beside the loop; the fires are
/// recorded when it comes back.
#[tokio::test]
async fn the_job_of_missed_fires_is_read_beside_the_loop() {
    let (mut engine, clock, (mut commands, _handle)) = engine_at("2026-01-10T00:00:30Z").await;
    apply(
        &mut engine,
        &mut commands,
        jobs("namespace: t\njobs:\n  - { name: minutely, schedule: '* * * * *', misfire: run_once, tasks: [{ id: a, noop: true }] }\n"),
    )
    .await;
    let pause = |paused| {
        let (reply, answered) = oneshot::channel();
        let cmd = Request::Pause {
            namespace: "t".into(),
            name: "minutely".into(),
            paused,
            reply,
        };
        (cmd, answered)
    };
    let (cmd, answered) = pause(true);
    engine.on_command(cmd);
    let stored = back(&mut commands).await;
    engine.on_command(stored);
    engine.flush().await.unwrap();
    answered.await.unwrap().unwrap();

    clock.set("2026-01-10T00:10:30Z".parse().unwrap());
    let (cmd, answered) = pause(false);
    engine.on_command(cmd);
    let stored = back(&mut commands).await;
    assert!(matches!(stored, Command::Done(Completion::Paused { .. })));
    engine.on_command(stored);
    assert!(
        engine.runs.table.is_empty() && engine.batch.writes.is_empty(),
        "nothing decided yet"
    );
    let read = back(&mut commands).await;
    assert!(matches!(read, Command::Done(Completion::CaughtUp(_))));
    engine.on_command(read);
    let fires: Vec<FireOutcome> = engine
        .batch
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::Fire { outcome, .. } => Some(*outcome),
            _ => None,
        })
        .collect();
    assert_eq!(fires.len(), 10, "the fires of 00:01 to 00:10");
    assert_eq!(fires[9], FireOutcome::MissedCaughtUp);
    assert_eq!(engine.runs.table.len(), 1, "the last one runs");
    engine.flush().await.unwrap();
    answered.await.unwrap().unwrap();
}

/// The fires of an instant that many jobs share are warmed up a little
/// before it: the loop wakes then and reads their entries, deciding
/// nothing; they fire at the instant, and each job's next fire is armed
/// once all of them are handled. An instant of a few fires is not worth
/// the extra wake-up.
#[tokio::test]
async fn an_instant_of_many_fires_is_warmed_up_ahead_and_fires_at_its_time() {
    let (mut engine, clock, (mut commands, _handle)) = engine_at("2026-01-10T00:00:00.5Z").await;
    let many: String = (0..timers::WARM_UP_FIRES)
        .map(|i| {
            format!(
                "  - {{ name: j{i}, schedule: '* * * * * *', tasks: [{{ id: a, noop: true }}] }}\n"
            )
        })
        .collect();
    apply(
        &mut engine,
        &mut commands,
        jobs(&format!("namespace: t\njobs:\n{many}")),
    )
    .await;
    let instant: Timestamp = "2026-01-10T00:00:01Z".parse().unwrap();
    assert_eq!(engine.timers.queue.next_at(), Some(instant));
    let wake = instant.checked_sub(timers::WARM_UP_AHEAD).unwrap();
    assert_eq!(engine.warm_up_at(Some(instant)), Some(wake));

    clock.set(wake);
    engine.warm_up(instant);
    assert!(
        engine.runs.table.is_empty() && engine.batch.writes.is_empty(),
        "nothing decided"
    );
    assert!(engine.runs.table.capacity() >= timers::WARM_UP_FIRES);
    assert_eq!(engine.warm_up_at(Some(instant)), None, "warmed up once");
    assert_eq!(engine.timers.queue.next_at(), Some(instant));

    clock.set(instant);
    engine.on_timers();
    assert_eq!(
        engine.runs.table.len(),
        timers::WARM_UP_FIRES,
        "all fired at the instant"
    );
    let next = instant.checked_add(SignedDuration::from_secs(1)).unwrap();
    assert_eq!(engine.timers.queue.next_at(), Some(next));
    assert_eq!(
        engine.timers.queue.first_len(),
        timers::WARM_UP_FIRES,
        "every next fire armed"
    );

    // A few fires: no wake-up ahead of them.
    let (mut engine2, _, (mut commands2, _handle2)) = engine_at("2026-01-10T00:00:00.5Z").await;
    apply(
        &mut engine2,
        &mut commands2,
        jobs("namespace: t\njobs:\n  - { name: one, schedule: '* * * * * *', tasks: [{ id: a, noop: true }] }\n"),
    )
    .await;
    assert_eq!(engine2.warm_up_at(engine2.timers.queue.next_at()), None);
}

/// A fire the store refused as made before its instant by its clock was
/// lost: its run was dropped and the series had moved on. It is now made
/// again a little later, with a new run, and the series is not armed twice.
#[tokio::test]
async fn a_fire_refused_as_early_is_made_again_later() {
    let (mut engine, clock, (mut commands, _handle)) = engine_at("2026-01-10T00:00:00.5Z").await;
    apply(
        &mut engine,
        &mut commands,
        jobs("namespace: t\njobs:\n  - { name: s, schedule: '* * * * * *', concurrency: allow, tasks: [{ id: a, noop: true }] }\n"),
    )
    .await;
    let at: Timestamp = "2026-01-10T00:00:01Z".parse().unwrap();
    clock.set(at);
    engine.on_timers();
    let writes = std::mem::take(&mut engine.batch.writes);
    let effects = std::mem::take(&mut engine.batch.effects);
    let first = writes
        .iter()
        .find_map(|w| match w {
            Write::Fire {
                scheduled_at,
                run: Some(run),
                ..
            } if *scheduled_at == at => Some(run.id),
            _ => None,
        })
        .expect("fired");
    // The store refuses the fire as early, and so every write of its run.
    let results: Vec<WriteResult> = writes
        .iter()
        .map(|w| match w {
            Write::Fire { .. } => WriteResult::Early("early".into()),
            _ => WriteResult::Conflict("no such run".into()),
        })
        .collect();
    engine.committed(&writes, &results, effects);
    assert!(
        !engine.runs.table.contains_key(&first),
        "its run is dropped"
    );
    let fires_of = |engine: &Engine<_>, when: Timestamp| {
        engine
            .batch
            .writes
            .iter()
            .filter(|w| matches!(w, Write::Fire { scheduled_at, .. } if *scheduled_at == when))
            .count()
    };
    // 100 ms later: made again, with a new run.
    clock.set("2026-01-10T00:00:01.1Z".parse().unwrap());
    engine.on_timers();
    assert_eq!(fires_of(&engine, at), 1, "made again");
    assert!(engine.runs.table.keys().any(|id| *id != first));
    engine.flush().await.unwrap();
    // The next second fires once.
    let next: Timestamp = "2026-01-10T00:00:02Z".parse().unwrap();
    clock.set(next);
    engine.on_timers();
    assert_eq!(fires_of(&engine, next), 1, "the series is armed once");
}
