//! The store conformance suite against PostgreSQL, one database per test.

use dagcron_store_postgres::PgStore;
use dagcron_test_pg::TestDatabase;

async fn fresh() -> (PgStore, TestDatabase) {
    let db = TestDatabase::create("conformance").await;
    let store = PgStore::connect(&db.url, 8).await.expect("connect");
    (store, db)
}

dagcron_store::conformance_tests!(fresh());
