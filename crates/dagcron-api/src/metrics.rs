//! `GET /metrics`: the Prometheus text exposition (OpenMetrics) of the
//! engine's counters, of what the engine runs and queues now, of the
//! cluster node and of the remote agents.
//!
//! Counters and histograms live in the [`Registry`] the server was started
//! with (kept between scrapes); the gauges of the current state are read
//! at each scrape (from the engine's loop, the cluster view and the agent
//! pool) into a registry of their own, so that two scrapes never share one.
//!
//! A scraper that accepts OpenMetrics (Prometheus does) gets it; any other
//! client gets the classic Prometheus text format (version 0.0.4), which
//! `promtool check metrics` and older tools read.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router, routing::get};
use dagcron_core::authz::Need;
use dagcron_store::prelude::*;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::auth::Principal;
use crate::wire::Errors;
use crate::{ApiError, AppState};

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the classic Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a scrape waits for the engine's loop or the database.
const SCRAPE_WAIT: Duration = Duration::from_secs(2);

type Labels = Vec<(&'static str, String)>;
type Gauges = Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>;

/// The metrics, for a viewer over the whole instance (a token limited to a
/// namespace would see the others' job names in them).
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Metrics in the classic Prometheus text format, or OpenMetrics when asked for by Accept (see docs/observability.md)",
        content((String = "text/plain"), (String = "application/openmetrics-text"))), Errors))]
pub(crate) async fn metrics<S: Store>(
    State(state): State<AppState<S>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    who.allow(Need::Read, None, || ApiError::not_found("no such path"))?;
    Ok(exposition(&state, &headers).await)
}

/// A router with `/metrics` alone and no authentication, for a separate
/// listening address (`serve --metrics-listen`) that only the scraper reaches.
pub fn metrics_router<S: Store>(state: AppState<S>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(
                |State(state): State<AppState<S>>, headers: HeaderMap| async move {
                    exposition(&state, &headers).await
                },
            ),
        )
        .with_state(state)
}

async fn exposition<S: Store>(state: &AppState<S>, headers: &HeaderMap) -> Response {
    let mut text = String::new();
    let now = current(state).await;
    let written = match &state.metrics {
        Some(kept) => encode_registry(&mut text, kept),
        None => Ok(()),
    }
    .and_then(|()| encode_registry(&mut text, &now))
    .and_then(|()| encode_eof(&mut text));
    if let Err(e) = written {
        let message = format!("encoding the metrics failed: {e}");
        return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            .into_response();
    }
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let (text, kind) = if openmetrics {
        (text, OPENMETRICS)
    } else {
        (classic(&text), PROMETHEUS_TEXT)
    };
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}

/// The classic Prometheus text format of an OpenMetrics text: a counter's
/// family takes its samples' `_total` name, and the `# UNIT` and `# EOF`
/// lines (which it does not have) go.
fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if line.starts_with("# HELP ") {
            if let Some(held) = help.replace(line) {
                out.push_str(held);
                out.push('\n');
            }
            continue;
        }
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        {
            if let Some(held) = help.take() {
                let text = held.strip_prefix(&format!("# HELP {name} ")).unwrap_or("");
                out.push_str(&format!("# HELP {name}_total {text}\n"));
            }
            out.push_str(&format!("# TYPE {name}_total counter\n"));
            continue;
        }
        if let Some(held) = help.take() {
            out.push_str(held);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: f64) {
    let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    g.set(value);
    registry.register(name, help, g);
}

fn gauges(registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Gauges {
    let family = Gauges::default();
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
        None => registry.register(name, help, family.clone()),
    }
    family
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

/// The gauges of this moment.
async fn current<S: Store>(state: &AppState<S>) -> Registry {
    let mut r = Registry::default();
    counter(
        &mut r,
        "dagcron_sandbox_refusals",
        "Shell attempts that failed because the kernel could not make their sandbox",
        dagcron_exec::sandbox::refusals(),
    );
    let build = gauges(&mut r, "dagcron_build_info", "The running version", None);
    build
        .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())])
        .set(1.0);
    match tokio::time::timeout(SCRAPE_WAIT, state.engine.gauges()).await {
        Ok(Ok(g)) => {
            gauge(
                &mut r,
                "dagcron_engine_up",
                "Whether the engine's loop answered this scrape",
                1.0,
            );
            let runs = gauges(
                &mut r,
                "dagcron_runs_active",
                "Runs not finished, by namespace and state (stopping: asked to stop)",
                None,
            );
            for (namespace, run_state, n) in g.runs {
                runs.get_or_create(&vec![("namespace", namespace), ("state", run_state.into())])
                    .set(n as f64);
            }
            let held = gauges(
                &mut r,
                "dagcron_tasks_held",
                "Tasks held after their last retry failed (on_exhausted: hold), waiting for an operator, by namespace",
                None,
            );
            for (namespace, n) in g.held {
                held.get_or_create(&vec![("namespace", namespace)])
                    .set(n as f64);
            }
            let depth = gauges(
                &mut r,
                "dagcron_ready_queue_depth",
                "Tasks ready and waiting: for this process's pool (local) or for a remote agent",
                None,
            );
            depth
                .get_or_create(&vec![("lane", "local".into())])
                .set(g.ready_local as f64);
            depth
                .get_or_create(&vec![("lane", "remote".into())])
                .set(g.ready_remote as f64);
            gauge(
                &mut r,
                "dagcron_pool_slots",
                "Attempts this process runs at once",
                g.pool_slots as f64,
            );
            gauge(
                &mut r,
                "dagcron_pool_slots_in_use",
                "Attempts running in this process's pool",
                g.pool_in_use as f64,
            );
            gauge(
                &mut r,
                "dagcron_remote_attempts_running",
                "Attempts handed to remote agents and not ended",
                g.remote_running as f64,
            );
            let overdue = gauges(
                &mut r,
                "dagcron_timers_overdue",
                "How far behind its instant the earliest due timer is (0 when on time)",
                Some(Unit::Seconds),
            );
            overdue.get_or_create(&vec![]).set(g.timers_overdue_seconds);
        }
        _ => gauge(
            &mut r,
            "dagcron_engine_up",
            "Whether the engine's loop answered this scrape",
            0.0,
        ),
    }
    if let Some(cluster) = &state.cluster {
        let node = cluster.local();
        gauge(
            &mut r,
            "dagcron_cluster_lease_valid",
            "Whether this node's lease runs now",
            f64::from(u8::from(node.lease_valid)),
        );
        gauge(
            &mut r,
            "dagcron_cluster_epoch",
            "This node's fencing epoch",
            node.epoch as f64,
        );
        gauge(
            &mut r,
            "dagcron_cluster_jobs_owned",
            "Jobs this node owns",
            node.owned_jobs as f64,
        );
        let skew = gauges(
            &mut r,
            "dagcron_cluster_clock_skew",
            "This node's clock minus the database's",
            Some(Unit::Seconds),
        );
        skew.get_or_create(&vec![])
            .set(node.clock_skew_us as f64 / 1e6);
        if let Ok(Ok(nodes)) = tokio::time::timeout(SCRAPE_WAIT, cluster.nodes()).await {
            let by_state = gauges(
                &mut r,
                "dagcron_cluster_nodes",
                "Registered nodes by state",
                None,
            );
            for s in dagcron_store::cluster::NodeState::ALL {
                let n = nodes.iter().filter(|n| n.state == s).count();
                by_state
                    .get_or_create(&vec![("state", s.as_str().into())])
                    .set(n as f64);
            }
        }
    }
    if let Some(pool) = &state.workers {
        let agents = pool.workers();
        let by_state = gauges(
            &mut r,
            "dagcron_agents",
            "Remote worker agents by state",
            None,
        );
        for name in ["connected", "draining", "disconnected"] {
            let n = agents.iter().filter(|a| agent_state(a) == name).count();
            by_state
                .get_or_create(&vec![("state", name.into())])
                .set(n as f64);
        }
        let capacity = gauges(
            &mut r,
            "dagcron_agent_capacity",
            "Attempts an agent runs at once",
            None,
        );
        let running = gauges(
            &mut r,
            "dagcron_agent_running",
            "Attempts an agent runs now",
            None,
        );
        let offset = gauges(
            &mut r,
            "dagcron_agent_clock_offset",
            "An agent's clock minus this server's (its own estimate)",
            Some(Unit::Seconds),
        );
        for a in &agents {
            let label = vec![("agent", a.id.clone())];
            capacity.get_or_create(&label).set(f64::from(a.capacity));
            running.get_or_create(&label).set(f64::from(a.running));
            offset
                .get_or_create(&label)
                .set(a.clock_offset_us as f64 / 1e6);
        }
        counter(
            &mut r,
            "dagcron_agent_stale_results",
            "Results refused because their fencing token was stale",
            pool.stale_results(),
        );
        counter(
            &mut r,
            "dagcron_agent_foreign_reports",
            "Messages refused because they came from another agent than the attempt's",
            pool.foreign_reports(),
        );
    }
    r
}

fn agent_state(agent: &dagcron_agents::WorkerInfo) -> &'static str {
    match (agent.connected, agent.draining) {
        (false, _) => "disconnected",
        (true, true) => "draining",
        (true, false) => "connected",
    }
}

#[cfg(test)]
mod tests {
    use super::classic;

    #[test]
    fn the_classic_format_names_a_counter_family_by_its_samples() {
        let openmetrics = "# HELP a_seconds A time.\n# TYPE a_seconds gauge\n# UNIT a_seconds seconds\na_seconds 1.5\n# HELP b Things done.\n# TYPE b counter\nb_total{x=\"1\"} 3\n# EOF\n";
        expect_test::expect![[r#"
            # HELP a_seconds A time.
            # TYPE a_seconds gauge
            a_seconds 1.5
            # HELP b_total Things done.
            # TYPE b_total counter
            b_total{x="1"} 3
        "#]]
        .assert_eq(&classic(openmetrics));
    }
}
