//! Migrations of databases written by earlier versions, on real files.

use std::path::Path;

use dagcron_core::timings::TimetableCache;
use dagcron_store::prelude::*;
use dagcron_store_sqlite::SqliteStore;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// A database migrated up to and including migration `last`, as an
/// earlier version left it.
async fn migrated_up_to(db: &Path, last: u32) {
    let all = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let some = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&all).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let number: u32 = name[..4].parse().unwrap();
        if number <= last {
            std::fs::copy(&path, some.path().join(&name)).unwrap();
        }
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(db)
                .create_if_missing(true),
        )
        .await
        .unwrap();
    sqlx::migrate::Migrator::new(some.path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    pool.close().await;
}

fn job(name: &str, schedule: &str) -> dagcron_core::Job {
    let spec = serde_json::json!({
        "name": name,
        "schedule": schedule,
        "timezone": "Europe/Paris",
        "jitter": "10s",
        "tasks": [{"id": "a", "shell": "true"}],
    });
    dagcron_core::JobFile {
        namespace: "ns".into(),
        calendars: vec![],
        notifiers: vec![],
        notify: vec![],
        jobs: vec![serde_json::from_value(spec).unwrap()],
    }
    .validate()
    .unwrap()
    .remove(0)
}

#[tokio::test]
async fn specs_stored_in_the_jobs_table_move_to_their_versions() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dagcron.db");
    migrated_up_to(&db, 15).await;
    let (a, b) = (job("a", "0 0 3 * * *"), job("b", "H 15 * * * *"));
    let rules = a.rules().to_json();
    {
        let old = rusqlite::Connection::open(&db).unwrap();
        for j in [&a, &b] {
            old.execute(
                "INSERT INTO jobs (namespace, name, version, spec, paused, updated_at, rules) VALUES ('ns', ?1, 3, ?2, 0, 7, ?3)",
                rusqlite::params![j.spec.name, j.canonical(), rules],
            )
            .unwrap();
        }
        // `a`'s current version has its row, as every apply wrote one; `b`'s
        // is missing, which the migration makes good.
        old.execute(
            "INSERT INTO job_versions (namespace, name, version, spec, created_at, rules) VALUES ('ns', 'a', 3, ?1, 7, ?2)",
            rusqlite::params![a.canonical(), rules],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&db).await.unwrap();
    for j in [&a, &b] {
        let stored = store.get_job("ns", &j.spec.name).await.unwrap().unwrap();
        assert_eq!((stored.version, stored.spec), (3, j.canonical()));
        let version = store
            .get_job_version("ns", &j.spec.name, 3)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(version.spec, j.canonical());
    }
    let rows = store.load_job_timings(None, 10).await.unwrap();
    assert_eq!(rows.len(), 2);
    let mut cache = TimetableCache::new();
    for (row, j) in rows.iter().zip([&a, &b]) {
        assert!(row.timing.len() < j.canonical().len(), "{}", row.timing);
        let timing = cache.timing_from_canonical("ns", &row.timing).unwrap();
        assert_eq!(format!("{:?}", timing.timing), format!("{:?}", j.timing()));
    }
    // Applying the same jobs again changes nothing.
    let upserts: Vec<_> = [&a, &b]
        .into_iter()
        .map(dagcron_store::JobUpsert::of)
        .collect();
    let results = store
        .apply_jobs(&upserts, jiff::Timestamp::from_second(9).unwrap())
        .await
        .unwrap();
    assert_eq!(results, [dagcron_store::ApplyResult::Unchanged(3); 2]);
}

fn page_size(db: &Path) -> u32 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap()
}

/// A database the store creates has its large pages; one an earlier
/// version created keeps the size it has (it cannot change in WAL mode),
/// is migrated and written as before.
#[tokio::test]
async fn new_databases_get_large_pages_and_older_ones_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("new.db");
    drop(SqliteStore::open(&new).await.unwrap());
    assert_eq!(page_size(&new), dagcron_store_sqlite::PAGE_SIZE);

    let old = dir.path().join("old.db");
    migrated_up_to(&old, 15).await;
    let before = page_size(&old);
    assert_ne!(before, dagcron_store_sqlite::PAGE_SIZE);
    let store = SqliteStore::open(&old).await.unwrap();
    let applied = store
        .apply_jobs(
            &[dagcron_store::JobUpsert::of(&job("a", "0 * * * *"))],
            jiff::Timestamp::from_second(1_000).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(applied, [dagcron_store::ApplyResult::Created(1)]);
    drop(store);
    assert_eq!(page_size(&old), before);
}
