//! Liveness, readiness, the cluster's nodes and the remote agents.

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use dagcron_store::prelude::*;

use crate::auth::Principal;
use crate::wire::{
    ClusterAnswer, Errors, HealthAnswer, NodeAnswer, NodeStatus, ReadyAnswer, ReadyCheck,
    WorkerAnswer, WorkersAnswer,
};
use crate::{ApiError, AppState};
use dagcron_core::authz::Need;

/// How long a readiness check waits for the store or the engine.
pub(crate) const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Readiness: whether this node can do its work now (the store answers,
/// the engine's loop takes commands, and in a cluster its lease runs and
/// its clock is close to the database's), with the reason when it cannot.
#[utoipa::path(get, path = "/readyz", tag = "meta",
    responses((status = 200, description = "Ready", body = ReadyAnswer), (status = 503, description = "Not ready, with the reason", body = ReadyAnswer), Errors))]
pub(crate) async fn ready<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    let check = |name: &str, problem: Option<String>| ReadyCheck {
        name: name.into(),
        ok: problem.is_none(),
        problem,
    };
    let waited = format!("no answer within {} s", READY_WAIT.as_secs());
    let store = match tokio::time::timeout(READY_WAIT, state.store.get_run(0)).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(waited.clone()),
    };
    let engine = match tokio::time::timeout(READY_WAIT, state.engine.ping()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("the engine's loop gave {waited}")),
    };
    let mut checks = vec![
        check("store", store),
        check("engine", engine),
        check("writes", state.engine.write_problem()),
    ];
    if let Some(cluster) = &state.cluster {
        let node = cluster.local();
        let lease = (!node.lease_valid).then(|| "the lease is not renewed".to_string());
        let clock = (!node.clock_ok).then(|| {
            format!(
                "the clock differs from the database's by {} ms",
                node.clock_skew_us / 1000
            )
        });
        checks.push(check("lease", lease));
        checks.push(check("clock", clock));
    }
    let ready = checks.iter().all(|c| c.ok);
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(ReadyAnswer { ready, checks }))
}

/// Liveness and, in a cluster, this node's standing: a node whose clock is
/// too far from the database's, or whose lease lapsed, answers 503.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, body = HealthAnswer), (status = 503, description = "Degraded", body = HealthAnswer), Errors))]
pub(crate) async fn health<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    let Some(cluster) = &state.cluster else {
        let ok = HealthAnswer {
            status: "ok".into(),
            problem: None,
            node: None,
        };
        return (StatusCode::OK, Json(ok));
    };
    let node = cluster.local();
    let problem = if !node.clock_ok {
        Some(format!(
            "clock differs from the database's by {} ms: owning no jobs",
            node.clock_skew_us / 1000
        ))
    } else if !node.lease_valid {
        Some("lease not renewed: firing stopped".to_string())
    } else {
        node.problem.clone()
    };
    let code = if problem.is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let status = if problem.is_some() { "degraded" } else { "ok" };
    let answer = HealthAnswer {
        status: status.into(),
        problem,
        node: Some(NodeStatus::from(&node)),
    };
    (code, Json(answer))
}

/// The remote worker agents of this server: labels, capacity, running,
/// last heartbeat, clock offset, version.
#[utoipa::path(get, path = "/api/v1/workers", tag = "cluster",
    responses((status = 200, body = WorkersAnswer), Errors))]
pub(crate) async fn workers<S: Store>(
    State(state): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<WorkersAnswer>, ApiError> {
    who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
    let pool = state.workers.as_ref();
    let items = pool
        .map(|p| p.workers())
        .unwrap_or_default()
        .iter()
        .map(WorkerAnswer::from)
        .collect();
    // Results that came back after their attempt had been given up on (a
    // stale fencing token): refused, and counted here.
    let stale = pool.map_or(0, |p| p.stale_results());
    Ok(Json(WorkersAnswer {
        items,
        stale_results_refused: stale,
        foreign_reports_refused: pool.map_or(0, |p| p.foreign_reports()),
    }))
}

/// The nodes of the cluster, their leases, epochs, clock skew and jobs.
#[utoipa::path(get, path = "/api/v1/cluster", tag = "cluster",
    responses((status = 200, body = ClusterAnswer), Errors))]
pub(crate) async fn cluster<S: Store>(
    State(state): State<AppState<S>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<ClusterAnswer>, ApiError> {
    who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_cluster",
            "this server runs alone on its embedded database; start it with --database postgres://... to form a cluster",
        ));
    };
    let nodes = cluster.nodes().await?;
    Ok(Json(ClusterAnswer {
        this_node: NodeStatus::from(&cluster.local()),
        nodes: nodes.iter().map(NodeAnswer::from).collect(),
    }))
}
