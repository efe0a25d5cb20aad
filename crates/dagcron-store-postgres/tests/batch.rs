//! The grouped write path (a batch as one statement per kind) against the
//! reference path (one write at a time), on random batches: same results,
//! same rows. Two databases, reset between cases; the batches also make
//! new runs, whose tasks' changes in the same batch the grouped path
//! applies by inserting them in the state the changes leave them in.

use dagcron_store::Store;
use dagcron_store::batches::{same_meaning, seed, write};
use dagcron_store_postgres::PgStore;
use dagcron_test_pg::TestDatabase;
use proptest::prelude::*;

async fn reset(store: &PgStore, url: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql("TRUNCATE fires, runs, tasks, attempts")
        .execute(&mut conn)
        .await
        .unwrap();
    store.write(&seed()).await.unwrap();
}

#[test]
fn grouped_batches_mean_what_one_write_at_a_time_means() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (grouped_db, reference_db) = rt.block_on(async {
        (
            TestDatabase::create("grouped").await,
            TestDatabase::create("reference").await,
        )
    });
    let (grouped, reference) = rt.block_on(async {
        (
            PgStore::connect(&grouped_db.url, 2).await.unwrap(),
            PgStore::connect(&reference_db.url, 2)
                .await
                .unwrap()
                .with_grouped_writes(false),
        )
    });
    let config = ProptestConfig::with_cases(96);
    proptest!(config, |(batches in proptest::collection::vec(proptest::collection::vec(write(), 1..8), 1..5))| {
        rt.block_on(async {
            reset(&grouped, &grouped_db.url).await;
            reset(&reference, &reference_db.url).await;
            same_meaning(&grouped, &reference, &batches).await
        })?;
    });
}
