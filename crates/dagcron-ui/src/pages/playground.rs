//! playground.
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use dagcron_store::Store;
use crate::Ui;
pub(crate) async fn page<S: Store>(State(_ui): State<Ui<S>>) -> Response { "todo".into_response() }
