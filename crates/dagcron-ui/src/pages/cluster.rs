//! `/cluster`: the nodes (lease, epoch, clock skew, jobs owned) and the
//! remote agents (labels, capacity, running attempts, clock offset), read
//! only.

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use dagcron_api::ApiError;
use dagcron_api::wire::{NodeAnswer, WorkerAnswer};
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;

use crate::{Chrome, Ui, error_page, format, render, viewer};

struct NodeView {
    id: String,
    this: bool,
    address: String,
    state: String,
    lease_valid: bool,
    epoch: i64,
    lease_until: String,
    heartbeat: String,
    skew: String,
    owned: i64,
    version: String,
}

struct AgentView {
    id: String,
    labels: String,
    running: u32,
    capacity: u32,
    connected: bool,
    draining: bool,
    heartbeat: String,
    offset: String,
    version: String,
}

#[derive(Template)]
#[template(path = "cluster.html")]
struct ClusterPage {
    chrome: Chrome,
    nodes: Vec<NodeView>,
    agents: Vec<AgentView>,
}

fn micros(us: i64) -> String {
    format::duration(jiff::SignedDuration::from_micros(us))
}

/// `GET /cluster`.
pub(crate) async fn page<S: Store>(State(ui): State<Ui<S>>, headers: HeaderMap) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    // The instance's state: what `/api/v1/cluster` and `/api/v1/workers` ask.
    if let Err(e) = v
        .who
        .allow(Need::Read, None, || ApiError::not_found("no such page"))
    {
        return error_page(e.status, &e.message);
    }
    let zone = &v.zone;
    let mut nodes = Vec::new();
    if let Some(cluster) = &ui.st.cluster {
        let this = cluster.local();
        let listed = match cluster.nodes().await {
            Ok(n) => n,
            Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        };
        nodes = listed
            .iter()
            .map(NodeAnswer::from)
            .map(|n| NodeView {
                this: n.epoch == this.epoch,
                id: n.id,
                address: n.address,
                state: n.state,
                lease_valid: n.lease_valid,
                epoch: n.epoch,
                lease_until: format::time(n.lease_until, zone),
                heartbeat: format::time(n.heartbeat_at, zone),
                skew: micros(n.clock_skew_us),
                owned: n.owned_jobs,
                version: n.version,
            })
            .collect();
    }
    let agents = ui
        .st
        .workers
        .as_ref()
        .map(|p| p.workers())
        .unwrap_or_default()
        .iter()
        .map(WorkerAnswer::from)
        .map(|a| AgentView {
            id: a.id,
            labels: a
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            running: a.running,
            capacity: a.capacity,
            connected: a.connected,
            draining: a.draining,
            heartbeat: format::time(a.last_heartbeat, zone),
            offset: micros(a.clock_offset_us),
            version: a.version,
        })
        .collect();
    render(&ClusterPage {
        chrome: v.chrome("Cluster", "cluster"),
        nodes,
        agents,
    })
}
