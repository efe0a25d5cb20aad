//! `dagcron serve`: the server. Alone on embedded SQLite by default; with
//! `--database postgres://...`, one node of a cluster sharing that database.
//!
//! [`ServeArgs::config`] merges the flags, the configuration file and the
//! defaults into a [`Config`], in one place. [`run`] serves a configuration
//! on a listener it is given until a shutdown future it is given completes:
//! the binary installs the signal handlers and binds the port first, a test
//! binds `127.0.0.1:0` and passes a future of its own. Whatever the backend
//! (`backend.rs` prepares each), one runner starts the engine (and a
//! cluster member's coordinator), serves the API and drains.

mod backend;
mod config;
mod messages;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use dagcron_agents::AgentPool;
use dagcron_api::secrets::StoredSecrets;
use dagcron_api::{AppState, router};
use dagcron_core::JobFile;
use dagcron_runtime::{
    Engine, EngineConfig, EngineHandle, EngineMetrics, Outbox, OutboxConfig, OutputReserve,
    PolicySource, PruneConfig, Pruner, RemoteWorkers, SecretSource, SystemClock,
};
use dagcron_store::StorageError;
use dagcron_store::prelude::*;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use backend::{Node, default_node_id, embedded, join_tokens, member};
use config::Backend;
pub use config::{Config, LogFormat, ServeArgs};

/// The jobs `--demo` applies.
const DEMO: &str = include_str!("../../../../examples/demo.yaml");

/// The module of the demo's WebAssembly task, and where its job expects it.
#[cfg(feature = "wasm")]
const DEMO_MODULE: &str = include_str!("../../../../examples/hello.wat");
#[cfg(feature = "wasm")]
const DEMO_MODULE_PATH: &str = "/tmp/dagcron-demo/hello.wat";

/// Writes the demo's module where its job reads it (whole, by a rename,
/// so that a task never reads half of it).
#[cfg(feature = "wasm")]
fn write_demo_module() -> Result<()> {
    let path = std::path::Path::new(DEMO_MODULE_PATH);
    let dir = path.parent().expect("an absolute path");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial = dir.join(format!(".hello.wat.{}", std::process::id()));
    std::fs::write(&partial, DEMO_MODULE)
        .and_then(|()| std::fs::rename(&partial, path))
        .with_context(|| format!("writing {DEMO_MODULE_PATH}"))
}

/// How a server ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Asked to stop: it drained and stopped.
    Stopped,
    /// Its lease ended before it could renew it: it must stop at once, and
    /// a restart registers it again (exit code [`EXIT_FENCED`]).
    Fenced,
}

/// The exit code of a node that was fenced: its lease ended before it could
/// renew it. Restart it (a supervisor does) and it registers again.
pub const EXIT_FENCED: u8 = 75;

/// Serves `config` on `listener` until `shutdown` completes, then drains
/// (running attempts get the shutdown grace) and returns; or returns
/// [`Exit::Fenced`] as soon as a cluster node's lease has ended.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<Exit> {
    let address = listener.local_addr().context("the listener's address")?;
    let agents = AgentPool::new(config.agents.clone());
    // The API and the agents' streams stay up while the engine drains, so
    // that remote attempts can report; they stop when the engine is done,
    // or when this returns early.
    let api_stop = CancellationToken::new();
    let _api_stop = api_stop.clone().drop_guard();
    agents.start(api_stop.clone());
    let serving = Serving {
        config: &config,
        listener,
        address,
        agents,
        api_stop,
    };
    match &config.backend {
        Backend::Embedded(settings) => embedded(settings).await?.run(serving, shutdown).await,
        Backend::Cluster(settings) => {
            // Joining may wait (a database too far away): a signal meanwhile stops it.
            let mut shutdown = std::pin::pin!(shutdown);
            let node = tokio::select! {
                node = member(settings, &config, address, &serving.agents) => node?,
                () = &mut shutdown => return Ok(Exit::Stopped),
            };
            node.run(serving, shutdown).await
        }
    }
}

/// What the runner serves with, whatever the backend.
struct Serving<'a> {
    config: &'a Config,
    listener: TcpListener,
    address: SocketAddr,
    agents: AgentPool,
    /// Stops the API and the agents' streams.
    api_stop: CancellationToken,
}

impl<S: Store> Node<S> {
    /// Starts the engine (and a member's coordinator), serves the API until
    /// `shutdown`, drains, and stops the API last.
    async fn run(self, serving: Serving<'_>, shutdown: impl Future<Output = ()>) -> Result<Exit> {
        let Serving {
            config,
            listener,
            address,
            agents,
            api_stop,
        } = serving;
        agents.set_authenticate(join_tokens(self.store.clone(), self.keyring.clone()));
        let node_id = self
            .node_id
            .clone()
            .unwrap_or_else(|| default_node_id(address));
        let (traced, mut exporter) = traces(&node_id)?;
        let metrics = Arc::new(EngineMetrics::new(config.metrics_max_jobs));
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let peak = dagcron_api::schedules::register_peak(&mut registry);
        let quota = Arc::new(dagcron_api::quotas::QuotaState::default());
        quota.register(&mut registry);
        let pruned = dagcron_runtime::PruneMetrics::default();
        pruned.register(&mut registry);
        let peak_task = tokio::spawn(dagcron_api::schedules::keep_peak(self.store.clone(), peak));
        let _peak_task = AbortOnDrop(peak_task);
        let outboxed = dagcron_runtime::OutboxMetrics::default();
        outboxed.register(&mut registry);
        let secrets = SecretSource(Arc::new(StoredSecrets {
            store: self.store.clone(),
            key: self.master_key.clone(),
        }));
        let policies = PolicySource(Arc::new(dagcron_api::policy::StoredPolicies::new(
            self.store.clone(),
        )));
        let wake_outbox = Arc::new(tokio::sync::Notify::new());
        let engine_config = EngineConfig {
            metrics: Some(metrics),
            outbox: Some(wake_outbox.clone()),
            tracing: traced,
            pool_size: config.pool_size,
            max_ready_backlog: config.max_ready_backlog,
            max_fires_per_namespace: config.max_fires_per_namespace,
            misfire_grace: config.misfire_grace,
            remote: Some(RemoteWorkers(Arc::new(agents.clone()))),
            secrets: Some(secrets.clone()),
            policies: Some(policies.clone()),
            node: self.identity,
            catch_up_pace: config.catch_up_pace,
            output_reserve: self
                .data_dir
                .clone()
                .filter(|_| config.disk_reserve > 0)
                .map(|dir| OutputReserve {
                    dir,
                    bytes: config.disk_reserve,
                }),
            ..EngineConfig::default()
        };
        let (engine, handle) = Engine::start(self.store.clone(), config.clock(), engine_config)
            .await
            .context("starting the engine")?;
        let stop = CancellationToken::new();
        let drained = CancellationToken::new();
        let (cluster, mut coordinator) = match self.join {
            Some(join) => {
                let (view, task) = join(handle.clone(), stop.clone(), drained.clone());
                (Some(view), Some(task))
            }
            None => (None, None),
        };
        let mut engine_task = tokio::spawn(engine.run(stop.clone(), config.shutdown_grace));
        // A cluster member publishes the output of the attempts it runs, for
        // the other nodes to show while they run.
        let _live_task = cluster.is_some().then(|| {
            AbortOnDrop(tokio::spawn(dagcron_runtime::live::publish(
                self.store.clone(),
                handle.clone(),
                stop.clone(),
            )))
        });
        // Retention, beside the engine: its own task, small transactions.
        let pruner = Pruner::new(
            self.store.clone(),
            Arc::new(SystemClock),
            PruneConfig {
                audit_max_age: config.audit_retention,
                ..PruneConfig::default()
            },
            pruned.clone(),
        );
        let _prune_task = AbortOnDrop(tokio::spawn(pruner.run(stop.clone())));
        // Notifications, beside the engine: its own task. A claim is this
        // process's: after a crash, what it held waits for its claim to end.
        let outbox = Outbox::new(
            self.store.clone(),
            Arc::new(SystemClock),
            OutboxConfig {
                owner: format!(
                    "{node_id}/{}/{}",
                    std::process::id(),
                    jiff::Timestamp::now().as_microsecond()
                ),
                smtp: config.smtp.clone(),
                // Alone, only what a previous process left (its retries,
                // its claims) is not woken for: an idle node's looks grow
                // apart up to a claim's length.
                poll: if cluster.is_some() {
                    OutboxConfig::default().poll
                } else {
                    OutboxConfig::default().claim
                },
                ..OutboxConfig::default()
            },
            Some(secrets),
            Some(policies.clone()),
            outboxed,
            wake_outbox,
        );
        let _outbox_task = AbortOnDrop(tokio::spawn(outbox.run(stop.clone())));
        // Messages that start runs, when a NATS server is configured.
        let _messages_task = config.nats_url.clone().map(|url| {
            AbortOnDrop(tokio::spawn(messages::run(
                url,
                handle.clone(),
                policies.clone(),
                stop.clone(),
            )))
        });
        tracing::info!(
            "{} listening on {}://{address}{}",
            self.name,
            if config.tls.is_some() {
                "https"
            } else {
                "http"
            },
            self.data_dir
                .map(|d| format!(" (data in {})", d.display()))
                .unwrap_or_default()
        );
        let state = AppState {
            store: self.store,
            engine: handle.clone(),
            cluster,
            workers: Some(agents),
            max_body_bytes: config.max_body_bytes,
            keyring: self.keyring,
            master_key: self.master_key,
            metrics: Some(Arc::new(registry)),
            quota,
            pruned: pruned.clone(),
        };
        if let Some(at) = config.metrics_listen {
            serve_metrics(at, state.clone(), api_stop.clone()).await?;
        }
        let api = serve_api(
            listener,
            state,
            config.demo,
            config.tls.clone(),
            api_stop.clone(),
        )
        .await?;
        if let Some(file) = &config.address_file {
            write_address(file, address)?;
        }
        give_back_code_pages();
        let _trim_task = AbortOnDrop(tokio::spawn(give_back_pages_when_quiet(handle.clone())));
        let fenced = |e: &StorageError| matches!(e, StorageError::Fenced(_));
        let mut shutdown = std::pin::pin!(shutdown);
        let mut asked = false;
        loop {
            tokio::select! {
                () = &mut shutdown, if !asked => {
                    asked = true;
                    stop.cancel();
                }
                () = handle.fenced() => {
                    // The lease ended and every attempt was killed, whatever
                    // the engine's loop and the coordinator are waiting on (a
                    // database that no longer answers): stop now.
                    tracing::error!("this node's lease ended; exiting so that a restart registers it again");
                    return Ok(Exit::Fenced);
                }
                ended = &mut engine_task => {
                    match ended.context("engine task")? {
                        Err(e) if fenced(&e) => {
                            tracing::error!("{e}; exiting so that a restart registers this node again");
                            return Ok(Exit::Fenced);
                        }
                        other => other.context("engine")?,
                    }
                    // The engine drained: its last spans go, then it leaves the cluster.
                    if let Some(exporter) = exporter.take() {
                        exporter.flush().await;
                    }
                    if let Some(task) = coordinator.take() {
                        drained.cancel();
                        task.await.context("cluster task")?.context("leaving the cluster")?;
                    }
                    break;
                }
                ended = until_done(&mut coordinator) => {
                    let e = match ended.context("cluster task")? {
                        Ok(()) => anyhow::bail!("the cluster task ended early"),
                        Err(e) => e,
                    };
                    // The lease is revoked: the engine kills its attempts and stops.
                    let _ = engine_task.await;
                    tracing::error!("{e}; exiting so that a restart registers this node again");
                    return Ok(Exit::Fenced);
                }
            }
        }
        api_stop.cancel();
        let _ = api.await;
        tracing::info!("stopped");
        Ok(Exit::Stopped)
    }
}

#[cfg(feature = "otlp")]
type Exporter = crate::otlp::Exporter;

/// Without the `otlp` feature there is nothing to flush.
#[cfg(not(feature = "otlp"))]
struct Exporter;

#[cfg(not(feature = "otlp"))]
impl Exporter {
    async fn flush(self) {}
}

/// Tracing as the `OTEL_*` variables ask (see `otlp.rs`), and the exporter
/// to flush once the engine has stopped.
fn traces(node: &str) -> Result<(Option<dagcron_runtime::trace::Tracing>, Option<Exporter>)> {
    #[cfg(feature = "otlp")]
    {
        Ok(match crate::otlp::from_env(node)? {
            Some((tracing, exporter)) => (Some(tracing), Some(exporter)),
            None => (None, None),
        })
    }
    #[cfg(not(feature = "otlp"))]
    {
        let _ = node;
        if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
            tracing::warn!(
                "this build has no OTLP exporter (the `otlp` feature): no traces are sent"
            );
        }
        Ok((None, None))
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The task's end, or never if there is no task.
async fn until_done<T>(task: &mut Option<JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match task {
        Some(task) => task.await,
        None => std::future::pending().await,
    }
}

/// Writes the bound address to `file`, whole or not at all (a reader
/// polling for it never sees half of it).
fn write_address(file: &Path, address: SocketAddr) -> Result<()> {
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, format!("{address}\n"))
        .and_then(|()| std::fs::rename(&partial, file))
        .with_context(|| format!("writing the address to {}", file.display()))
}

/// Serves `/metrics` alone, without a token, on `at` until `shutdown`.
async fn serve_metrics<S: Store>(
    at: SocketAddr,
    state: AppState<S>,
    shutdown: CancellationToken,
) -> Result<()> {
    let listener = TcpListener::bind(at)
        .await
        .with_context(|| format!("listening for metrics on {at}"))?;
    tracing::info!("metrics on http://{at}/metrics");
    let app = dagcron_api::metrics_router(state);
    tokio::spawn(crate::listen::serve(
        listener,
        app,
        None,
        shutdown,
        crate::listen::Limits::default(),
    ));
    Ok(())
}

/// Applies the demo jobs if asked, then serves the API until `shutdown`.
async fn serve_api<S: Store>(
    listener: tokio::net::TcpListener,
    state: AppState<S>,
    demo: bool,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    if demo {
        #[allow(unused_mut)]
        let mut file: JobFile = serde_saphyr::from_str(DEMO)
            .map_err(|e| anyhow::anyhow!("the bundled demo file: {e}"))?;
        #[cfg(feature = "wasm")]
        if let Err(e) = write_demo_module() {
            tracing::warn!("the demo's WebAssembly task will fail: {e:#}");
        }
        // A build without WebAssembly support leaves that job out.
        #[cfg(not(feature = "wasm"))]
        file.jobs
            .retain(|job| job.tasks.iter().all(|task| task.wasm.is_none()));
        let jobs = file
            .validate()
            .map_err(|e| anyhow::anyhow!("the bundled demo file: {e}"))?;
        state
            .engine
            .apply(jobs)
            .await
            .context("applying the demo jobs")?;
        tracing::info!("demo jobs applied in namespace `demo`: try `dagcron jobs list demo`");
    }
    // Remote agents speak gRPC on the API's port.
    let agents = state.workers.clone().expect("the server has an agent pool");
    let grpc = tonic::service::Routes::new(agents.service()).into_axum_router();
    // The web UI answers its own paths and hands the rest to the API.
    let app = dagcron_api::with_grpc(dagcron_ui::with_ui(state.clone(), router(state)), grpc);
    Ok(tokio::spawn(crate::listen::serve(
        listener,
        app,
        tls,
        shutdown,
        crate::listen::Limits::default(),
    )))
}

/// How often a server looks whether it is quiet, to give back the code
/// pages mapped since (by its periodic passes: retention, the peak of
/// fires, the outbox), and for how long it must have nothing to do.
const QUIET_EVERY: std::time::Duration = std::time::Duration::from_secs(15);
const QUIET_FOR: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// Gives back the program's code pages whenever the engine is quiet for
/// [`QUIET_FOR`]: nothing runs, nothing is due. A node with work keeps
/// its pages (a fire never waits for its code to be mapped again).
async fn give_back_pages_when_quiet(engine: EngineHandle) {
    loop {
        tokio::time::sleep(QUIET_EVERY).await;
        if let Ok(gauges) = engine.gauges().await
            && gauges.quiet_for(jiff::Timestamp::now(), QUIET_FOR)
        {
            give_back_code_pages();
        }
    }
}

/// Code that does not run again (start-up's, or a quiet server's periodic
/// passes) goes back to the page cache instead of staying counted in this
/// process's resident memory (see `dagcron_exec::residency`).
pub fn give_back_code_pages() {
    match dagcron_exec::residency::release_program_pages() {
        Ok(bytes) => tracing::debug!(bytes, "start-up's code pages given back"),
        Err(e) => tracing::debug!("start-up's code pages kept: {e}"),
    }
}
