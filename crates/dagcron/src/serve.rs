//! `dagcron serve`: the embedded server (SQLite, in-process workers, REST API).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dagcron_api::{AppState, router};
use dagcron_core::JobFile;
use dagcron_runtime::{Engine, EngineConfig, SystemClock};
use dagcron_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

/// The jobs `--demo` applies.
const DEMO: &str = include_str!("../../../examples/demo.yaml");

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Where the SQLite database lives.
    #[arg(long, env = "DAGCRON_DATA_DIR", default_value = "./dagcron-data")]
    data_dir: PathBuf,
    /// Address of the API.
    #[arg(long, env = "DAGCRON_LISTEN", default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Apply the bundled demo jobs, so that runs appear within seconds.
    #[arg(long)]
    demo: bool,
    /// Attempts running at once in the in-process worker pool.
    #[arg(long, env = "DAGCRON_POOL_SIZE", default_value_t = 64)]
    pool_size: usize,
    /// Fires overdue by less than this at start-up still count as on time (seconds).
    #[arg(long, env = "DAGCRON_MISFIRE_GRACE", default_value_t = 60)]
    misfire_grace: u64,
    /// On SIGTERM, how long running attempts may finish before the process exits (seconds).
    #[arg(long, env = "DAGCRON_SHUTDOWN_GRACE", default_value_t = 10)]
    shutdown_grace: u64,
}

async fn shutdown_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    token.cancel();
}

pub(crate) async fn run(args: ServeArgs) -> Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data directory {}", args.data_dir.display()))?;
    let db = args.data_dir.join("dagcron.db");
    let store = Arc::new(
        SqliteStore::open(&db)
            .await
            .with_context(|| format!("opening {}", db.display()))?,
    );
    let config = EngineConfig {
        pool_size: args.pool_size,
        misfire_grace: Duration::from_secs(args.misfire_grace),
        ..EngineConfig::default()
    };
    let (engine, handle) = Engine::start(store.clone(), Arc::new(SystemClock), config)
        .await
        .context("starting the engine")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_signal(shutdown.clone()));
    let engine_task =
        tokio::spawn(engine.run(shutdown.clone(), Duration::from_secs(args.shutdown_grace)));
    if args.demo {
        let file: JobFile = serde_saphyr::from_str(DEMO)
            .map_err(|e| anyhow::anyhow!("the bundled demo file: {e}"))?;
        let jobs = file
            .validate()
            .map_err(|e| anyhow::anyhow!("the bundled demo file: {e}"))?;
        handle.apply(jobs).await.context("applying the demo jobs")?;
        tracing::info!("demo jobs applied in namespace `demo`: try `dagcron jobs list demo`");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(
        "dagcron listening on http://{} (data in {})",
        listener.local_addr()?,
        args.data_dir.display()
    );
    let app = router(AppState {
        store,
        engine: handle,
    });
    let token = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { token.cancelled().await })
        .await
        .context("serving the API")?;
    engine_task
        .await
        .context("engine task")?
        .context("engine")?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
