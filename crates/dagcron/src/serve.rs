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

/// Command-line flags (or `DAGCRON_*` environment variables). Every one
/// overrides the same key of the configuration file, which overrides the
/// default.
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// A TOML file with any of: data_dir, listen, pool_size, misfire_grace, shutdown_grace.
    #[arg(long, env = "DAGCRON_CONFIG")]
    config: Option<PathBuf>,
    /// Where the SQLite database lives [default: ./dagcron-data].
    #[arg(long, env = "DAGCRON_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address of the API [default: 127.0.0.1:7700].
    #[arg(long, env = "DAGCRON_LISTEN")]
    listen: Option<SocketAddr>,
    /// Apply the bundled demo jobs, so that runs appear within seconds.
    #[arg(long)]
    demo: bool,
    /// Attempts running at once in the in-process worker pool [default: 64].
    #[arg(long, env = "DAGCRON_POOL_SIZE")]
    pool_size: Option<usize>,
    /// Fires overdue by less than this many seconds at start-up still count as on time [default: 60].
    #[arg(long, env = "DAGCRON_MISFIRE_GRACE")]
    misfire_grace: Option<u64>,
    /// On SIGTERM, the seconds running attempts get to finish before the process exits [default: 10].
    #[arg(long, env = "DAGCRON_SHUTDOWN_GRACE")]
    shutdown_grace: Option<u64>,
}

/// The configuration file. Unknown keys are an error, so that a typo does
/// not silently leave a default in place.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    pool_size: Option<usize>,
    misfire_grace: Option<u64>,
    shutdown_grace: Option<u64>,
}

/// The settings in force.
struct Settings {
    data_dir: PathBuf,
    listen: SocketAddr,
    pool_size: usize,
    misfire_grace: u64,
    shutdown_grace: u64,
}

impl ServeArgs {
    fn settings(&self) -> Result<Settings> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| {
                    format!("reading the configuration file {}", path.display())
                })?;
                toml::from_str(&text)
                    .with_context(|| format!("in the configuration file {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        let settings = Settings {
            data_dir: self
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./dagcron-data")),
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7700))),
            pool_size: self.pool_size.or(file.pool_size).unwrap_or(64),
            misfire_grace: self.misfire_grace.or(file.misfire_grace).unwrap_or(60),
            shutdown_grace: self.shutdown_grace.or(file.shutdown_grace).unwrap_or(10),
        };
        anyhow::ensure!(settings.pool_size > 0, "pool_size must be at least 1");
        Ok(settings)
    }
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
    let demo = args.demo;
    let args = args.settings()?;
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
    if demo {
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
