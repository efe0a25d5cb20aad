//! The planned write path (the changes of one row merged into one
//! compare-and-set, a new run's tasks inserted in the state the batch's
//! changes leave them in) against the reference path (one write at a
//! time), on random batches: same results, same rows. Two fresh databases
//! per case.

use dagcron_store::Store;
use dagcron_store::batches::{same_meaning, seed, write};
use dagcron_store_sqlite::SqliteStore;
use proptest::prelude::*;

async fn fresh(dir: &std::path::Path, name: &str, grouped: bool) -> SqliteStore {
    let store = SqliteStore::open(&dir.join(name))
        .await
        .unwrap()
        .with_grouped_writes(grouped);
    store.write(&seed()).await.unwrap();
    store
}

#[test]
fn planned_batches_mean_what_one_write_at_a_time_means() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig::with_cases(128);
    proptest!(config, |(batches in proptest::collection::vec(proptest::collection::vec(write(), 1..10), 1..5))| {
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let planned = fresh(dir.path(), "planned.db", true).await;
            let reference = fresh(dir.path(), "reference.db", false).await;
            same_meaning(&planned, &reference, &batches).await
        })?;
    });
}
