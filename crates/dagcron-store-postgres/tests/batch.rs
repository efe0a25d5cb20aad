//! The PostgreSQL store's write path (a batch's runs read, its writes
//! applied to their rows, the rows written back) against the reference
//! meaning of each write (the in-memory store, one write at a time), on
//! random batches: same results, same runs, tasks and attempts. One
//! database, reset between cases; the batches also make new runs, and
//! change them in the batch that makes them.

use dagcron_store::batches::{same_meaning, seed, write};
use dagcron_store::memory::MemoryStore;
use dagcron_store::prelude::*;
use dagcron_store_postgres::PgStore;
use dagcron_test_pg::TestDatabase;
use proptest::prelude::*;

async fn reset(store: &PgStore, url: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql("TRUNCATE fires, runs, attempt_logs, shared_attempts")
        .execute(&mut conn)
        .await
        .unwrap();
    store.write(&seed()).await.unwrap();
}

#[test]
fn batches_mean_what_the_reference_means() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(TestDatabase::create("batches"));
    let store = rt.block_on(PgStore::connect(&db.url, 2)).unwrap();
    let config = ProptestConfig::with_cases(96);
    proptest!(config, |(batches in proptest::collection::vec(proptest::collection::vec(write(), 1..8), 1..5))| {
        rt.block_on(async {
            let reference = MemoryStore::new();
            reference.write(&seed()).await.unwrap();
            reset(&store, &db.url).await;
            same_meaning(&store, &reference, &batches).await
        })?;
    });
}
