//! Both of the SQLite store's write paths against the reference meaning of
//! each write (the in-memory store, one write at a time: see
//! `dagcron_store::run_row`), on random batches: same results, same rows.
//! The planned path merges the changes of one row into one compare-and-set
//! and inserts a new run's tasks in the state the batch's changes leave
//! them in; the other applies one statement per write. A fresh database
//! per case.

use dagcron_store::batches::{same_meaning, seed, write};
use dagcron_store::memory::MemoryStore;
use dagcron_store::prelude::*;
use dagcron_store_sqlite::SqliteStore;
use proptest::prelude::*;

fn against_the_reference(grouped: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig::with_cases(128);
    proptest!(config, |(batches in proptest::collection::vec(proptest::collection::vec(write(), 1..10), 1..5))| {
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::open(&dir.path().join("dagcron.db"))
                .await
                .unwrap()
                .with_grouped_writes(grouped);
            store.write(&seed()).await.unwrap();
            let reference = MemoryStore::new();
            reference.write(&seed()).await.unwrap();
            same_meaning(&store, &reference, &batches).await
        })?;
    });
}

#[test]
fn planned_batches_mean_what_the_reference_means() {
    against_the_reference(true);
}

#[test]
fn one_write_at_a_time_means_what_the_reference_means() {
    against_the_reference(false);
}
