//! The REST API under `/api/v1`, as an axum [`Router`] value: tests call it
//! without a socket, the binary serves it.
//!
//! Reads go to the store; changes go to the engine, which answers after
//! they are committed. Errors are JSON: `{"error": {"code", "message", "details"}}`.

mod error;
mod routes;

use std::sync::Arc;

use axum::Router;
use dagcron_runtime::{ClusterHandle, EngineHandle};
use dagcron_store::Store;

pub use error::ApiError;

/// What the handlers share.
pub struct AppState<S: Store> {
    /// Where history is read from.
    pub store: Arc<S>,
    /// Where changes are sent.
    pub engine: EngineHandle,
    /// The cluster this node belongs to, if any.
    pub cluster: Option<ClusterHandle>,
    /// The remote worker agents connected to this server.
    pub workers: Option<dagcron_agents::AgentPool>,
}

impl<S: Store> Clone for AppState<S> {
    fn clone(&self) -> Self {
        AppState {
            store: self.store.clone(),
            engine: self.engine.clone(),
            cluster: self.cluster.clone(),
            workers: self.workers.clone(),
        }
    }
}

/// The API's routes.
pub fn router<S: Store>(state: AppState<S>) -> Router {
    routes::router(state)
}
