//! The engine's own tests (the integration tests are in tests/engine.rs).

use super::*;

/// One backfill over a job with many schedules held the loop for 52 s,
/// every other job firing that late. Handling the command now only
/// starts the listing beside the loop: nothing is decided until the
/// listed fires come back as a command of their own.
#[tokio::test]
async fn regression_a_backfill_does_not_hold_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        dagcron_store_sqlite::SqliteStore::open(&dir.path().join("db"))
            .await
            .unwrap(),
    );
    let clock = Arc::new(crate::ManualClock::new(
        "2026-01-10T00:00:00Z".parse().unwrap(),
    ));
    let (mut engine, _handle) = Engine::start(store, clock, EngineConfig::default())
        .await
        .unwrap();
    let mut commands = engine.commands.take().unwrap();
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
    let (reply, applied) = oneshot::channel();
    engine
        .on_command(Command::Apply {
            jobs: file.validate().unwrap(),
            reply,
        })
        .await;
    engine.flush().await.unwrap();
    applied.await.unwrap().unwrap();
    let (reply, done) = oneshot::channel();
    engine
        .on_command(Command::Backfill {
            namespace: "t".into(),
            name: "wide".into(),
            from: "2026-01-09T21:30:00Z".parse().unwrap(),
            to: "2026-01-10T00:00:00Z".parse().unwrap(),
            reply,
        })
        .await;
    // The loop is free at once: no run decided, no write queued.
    assert!(engine.writes.is_empty() && engine.runs.is_empty());
    // The listing comes back as a command; handled, it makes the runs.
    let listed = tokio::time::timeout(Duration::from_secs(30), commands.recv())
        .await
        .expect("the listing comes back")
        .unwrap();
    assert!(matches!(listed, Command::Backfilled { .. }));
    engine.on_command(listed).await;
    engine.flush().await.unwrap();
    assert_eq!(done.await.unwrap().unwrap().len(), 9000);
}
