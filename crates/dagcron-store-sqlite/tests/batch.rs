//! The planned write path (the changes of one row merged into one
//! compare-and-set, a new run's tasks inserted in the state the batch's
//! changes leave them in) against the reference path (one write at a
//! time), on random batches: same results, same rows. Two fresh databases
//! per case.

use dagcron_store::batches::{outside_the_contract, seed, snapshot, write};
use dagcron_store::{Store, WriteResult};
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
            for batch in &batches {
                let want = reference.write(batch).await;
                let got = planned.write(batch).await;
                let (want, got) = match (want, got) {
                    (Ok(want), Ok(got)) => (want, got),
                    (Err(_), Err(_)) => continue,
                    (want, got) => {
                        prop_assert!(false, "{:?} against {:?} for {:?}", got, want, batch);
                        unreachable!()
                    }
                };
                if outside_the_contract(batch, &want) {
                    return Ok(());
                }
                let kinds = |r: &[WriteResult]| r.iter().map(|x| matches!(x, WriteResult::Done)).collect::<Vec<_>>();
                prop_assert_eq!(kinds(&got), kinds(&want), "batch {:?}", batch);
                prop_assert_eq!(snapshot(&planned).await, snapshot(&reference).await, "after {:?}", batch);
            }
            Ok(())
        })?;
    });
}
