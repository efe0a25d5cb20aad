//! The store conformance suite against the in-memory store.

async fn fresh() -> (dagcron_store::memory::MemoryStore, ()) {
    (dagcron_store::memory::MemoryStore::new(), ())
}

dagcron_store::conformance_tests!(fresh());
