//! The store conformance suite against real SQLite files, one per test.

async fn fresh() -> (dagcron_store_sqlite::SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = dagcron_store_sqlite::SqliteStore::open(&dir.path().join("dagcron.db"))
        .await
        .unwrap();
    (store, dir)
}

dagcron_store::conformance_tests!(fresh());
