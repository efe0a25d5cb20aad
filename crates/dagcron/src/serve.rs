//! `dagcron serve`: the server. Alone on embedded SQLite by default; with
//! `--database postgres://...`, one node of a cluster sharing that database.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dagcron_agents::{AgentPool, PoolConfig};
use dagcron_api::auth::Keyring;
use dagcron_api::secrets::{KeyFiles, KeySet, MasterKey, StoredSecrets};
use dagcron_api::{AppState, router};
use dagcron_core::JobFile;
use dagcron_core::authz::Role;
use dagcron_runtime::cluster::{self, ClusterConfig, Coordinator};
use dagcron_runtime::{Engine, EngineConfig, RemoteWorkers, SecretSource, SystemClock};
use dagcron_store::cluster::Coordination;
use dagcron_store::{StorageError, Store};
use dagcron_store_postgres::PgStore;
use dagcron_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

/// The jobs `--demo` applies.
const DEMO: &str = include_str!("../../../examples/demo.yaml");

/// Command-line flags (or `DAGCRON_*` environment variables). Every one
/// overrides the same key of the configuration file, which overrides the
/// default.
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// A TOML file with any of: data_dir, database, listen, node_id, pool_size,
    /// misfire_grace, shutdown_grace, lease_ttl_ms, max_clock_skew_ms.
    #[arg(long, env = "DAGCRON_CONFIG")]
    config: Option<PathBuf>,
    /// Where the SQLite database lives [default: ./dagcron-data].
    #[arg(long, env = "DAGCRON_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// A PostgreSQL URL: run as one node of the cluster that shares this
    /// database, instead of alone on SQLite in the data directory.
    #[arg(long, env = "DAGCRON_DATABASE_URL")]
    database: Option<String>,
    /// This node's name in the cluster, unique and stable across restarts [default: HOSTNAME:PORT].
    #[arg(long, env = "DAGCRON_NODE_ID")]
    node_id: Option<String>,
    /// Milliseconds a node's lease lasts without renewal; a dead node's jobs move after it [default: 5000].
    #[arg(long, env = "DAGCRON_LEASE_TTL_MS")]
    lease_ttl_ms: Option<u64>,
    /// Milliseconds this node's clock may differ from the database's before it stops owning jobs [default: 500].
    #[arg(long, env = "DAGCRON_MAX_CLOCK_SKEW_MS")]
    max_clock_skew_ms: Option<u64>,
    /// Milliseconds a remote agent keeps its attempts without a heartbeat [default: 10000].
    #[arg(long, env = "DAGCRON_AGENT_LEASE_TTL_MS")]
    agent_lease_ttl_ms: Option<u64>,
    /// A secret remote agents must present (`dagcron worker --token`).
    #[arg(long, env = "DAGCRON_AGENT_TOKEN", hide_env_values = true)]
    agent_token: Option<String>,
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
    /// The largest API request body, in bytes; larger ones get 413 [default: 2097152].
    #[arg(long, env = "DAGCRON_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// The server key that API tokens are hashed under (32 bytes) [default:
    /// DATA_DIR/server.key, created on the first start; required in a
    /// cluster, the same file on every node: `dagcron tokens bootstrap` makes one].
    #[arg(long, env = "DAGCRON_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// The certificate chain (PEM) of the API's port: with --tls-key, the
    /// API and the agents' stream are served over TLS (https://).
    #[arg(long, env = "DAGCRON_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "DAGCRON_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// With TLS: agents must present a client certificate signed by this
    /// authority (PEM), mutual TLS; other clients need none.
    #[arg(long, env = "DAGCRON_CLIENT_CA", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// The master key secrets are encrypted under (32 bytes) [default:
    /// DATA_DIR/master.key, created on the first start; in a cluster, the
    /// same file on every node, or no secrets there].
    #[arg(long, env = "DAGCRON_MASTER_KEY_FILE")]
    master_key_file: Option<PathBuf>,
    /// Older master keys that still decrypt what they encrypted, while
    /// `dagcron secrets rotate-key` re-encrypts under the current one (a
    /// cluster's rotation; an embedded server keeps its own in DATA_DIR/master-keys).
    #[arg(long, env = "DAGCRON_OLD_MASTER_KEY_FILES", value_delimiter = ',')]
    old_master_key_file: Vec<PathBuf>,
    /// Variables of the server's environment that tasks receive (tasks get
    /// only PATH, HOME, LANG, LC_*, TZ and their own otherwise), such as
    /// HTTP_PROXY,NO_PROXY.
    #[arg(long, env = "DAGCRON_PASS_ENV", value_delimiter = ',')]
    pass_env: Vec<String>,
}

/// The configuration file. Unknown keys are an error, so that a typo does
/// not silently leave a default in place.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    agent_lease_ttl_ms: Option<u64>,
    agent_token: Option<String>,
    database: Option<String>,
    node_id: Option<String>,
    lease_ttl_ms: Option<u64>,
    max_clock_skew_ms: Option<u64>,
    listen: Option<SocketAddr>,
    pool_size: Option<usize>,
    misfire_grace: Option<u64>,
    shutdown_grace: Option<u64>,
    max_body_bytes: Option<usize>,
    key_file: Option<PathBuf>,
    master_key_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    pass_env: Option<Vec<String>>,
}

/// The settings in force.
struct Settings {
    data_dir: PathBuf,
    agent_lease_ttl_ms: u64,
    agent_token: Option<String>,
    database: Option<String>,
    node_id: Option<String>,
    lease_ttl_ms: u64,
    max_clock_skew_ms: u64,
    listen: SocketAddr,
    pool_size: usize,
    misfire_grace: u64,
    shutdown_grace: u64,
    max_body_bytes: usize,
    key_file: Option<PathBuf>,
    master_key_file: Option<PathBuf>,
    old_master_key_files: Vec<PathBuf>,
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Agents must present a client certificate.
    client_certificates: bool,
    pass_env: Vec<String>,
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
            database: self.database.clone().or(file.database),
            agent_lease_ttl_ms: self
                .agent_lease_ttl_ms
                .or(file.agent_lease_ttl_ms)
                .unwrap_or(10_000),
            agent_token: self.agent_token.clone().or(file.agent_token),
            node_id: self.node_id.clone().or(file.node_id),
            lease_ttl_ms: self.lease_ttl_ms.or(file.lease_ttl_ms).unwrap_or(5000),
            max_clock_skew_ms: self
                .max_clock_skew_ms
                .or(file.max_clock_skew_ms)
                .unwrap_or(500),
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7700))),
            pool_size: self.pool_size.or(file.pool_size).unwrap_or(64),
            misfire_grace: self.misfire_grace.or(file.misfire_grace).unwrap_or(60),
            shutdown_grace: self.shutdown_grace.or(file.shutdown_grace).unwrap_or(10),
            max_body_bytes: self
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(dagcron_api::DEFAULT_MAX_BODY_BYTES),
            key_file: self.key_file.clone().or(file.key_file),
            master_key_file: self.master_key_file.clone().or(file.master_key_file),
            old_master_key_files: self.old_master_key_file.clone(),
            tls: match (
                self.tls_cert.clone().or(file.tls_cert),
                self.tls_key.clone().or(file.tls_key),
            ) {
                (Some(cert), Some(key)) => Some(crate::tls::server_config(
                    &cert,
                    &key,
                    self.client_ca.clone().or(file.client_ca.clone()).as_deref(),
                )?),
                (None, None) => None,
                _ => anyhow::bail!("TLS needs both tls_cert and tls_key"),
            },
            client_certificates: self.client_ca.is_some() || file.client_ca.is_some(),
            pass_env: if self.pass_env.is_empty() {
                file.pass_env.unwrap_or_default()
            } else {
                self.pass_env.clone()
            },
        };
        anyhow::ensure!(settings.pool_size > 0, "pool_size must be at least 1");
        anyhow::ensure!(
            settings.lease_ttl_ms >= 500,
            "lease_ttl_ms must be at least 500 (heartbeats are a fifth of it)"
        );
        Ok(settings)
    }
}

pub(crate) async fn shutdown_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    token.cancel();
}

/// The exit code of a node that was fenced: its lease ended before it could
/// renew it. Restart it (a supervisor does) and it registers again.
const EXIT_FENCED: u8 = 75;

pub(crate) async fn run(args: ServeArgs) -> Result<ExitCode> {
    let demo = args.demo;
    let args = args.settings()?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    // Descendants of attempts whose parent died are adopted by this
    // process, which kills them with their attempt.
    if !dagcron_exec::tree::become_subreaper() {
        tracing::warn!("cannot become the child subreaper of task processes");
    }
    dagcron_exec::pass_env(args.pass_env.clone());
    let clock = Arc::new(SystemClock);
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_signal(shutdown.clone()));
    let agents = AgentPool::new(PoolConfig {
        lease_ttl: Duration::from_millis(args.agent_lease_ttl_ms),
        token: args.agent_token.clone(),
        require_client_certificate: args.client_certificates,
        ..PoolConfig::default()
    });
    // The API and the agents' streams stay up while the engine drains, so
    // that remote attempts can report; they stop when the engine is done.
    let api_stop = CancellationToken::new();
    agents.start(api_stop.clone());
    let config = EngineConfig {
        pool_size: args.pool_size,
        misfire_grace: Duration::from_secs(args.misfire_grace),
        remote: Some(RemoteWorkers(Arc::new(agents.clone()))),
        ..EngineConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address = listener.local_addr()?;

    let Some(url) = &args.database else {
        private_dir(&args.data_dir)?;
        let db = args.data_dir.join("dagcron.db");
        let store = Arc::new(
            SqliteStore::open(&db)
                .await
                .with_context(|| format!("opening {}", db.display()))?,
        );
        private_files(&db)?;
        let key_file = args
            .key_file
            .clone()
            .unwrap_or_else(|| args.data_dir.join("server.key"));
        let (keyring, new_key) = Keyring::load_or_create(&key_file)
            .with_context(|| format!("reading the server key {}", key_file.display()))?;
        let keyring = Arc::new(keyring);
        agents.set_authenticate(join_tokens(store.clone(), keyring.clone()));
        bootstrap_admin(
            &*store,
            &keyring,
            new_key,
            &args.data_dir.join("admin.token"),
        )
        .await?;
        let master_file = args
            .master_key_file
            .clone()
            .unwrap_or_else(|| args.data_dir.join("master.key"));
        let files = KeyFiles {
            current: master_file.clone(),
            old: args.data_dir.join("master-keys"),
        };
        let master_key = Some(Arc::new(
            KeySet::load_files(files, master_key(&*store, &master_file, true).await?)
                .context("reading the older master keys")?,
        ));
        let config = EngineConfig {
            secrets: Some(SecretSource(Arc::new(StoredSecrets {
                store: store.clone(),
                key: master_key.clone(),
            }))),
            ..config
        };
        let (engine, handle) = Engine::start(store.clone(), clock, config)
            .await
            .context("starting the engine")?;
        let engine_task =
            tokio::spawn(engine.run(shutdown.clone(), Duration::from_secs(args.shutdown_grace)));
        tracing::info!(
            "dagcron listening on {}://{address} (data in {})",
            if args.tls.is_some() { "https" } else { "http" },
            args.data_dir.display()
        );
        let state = AppState {
            store,
            engine: handle,
            cluster: None,
            workers: Some(agents),
            max_body_bytes: args.max_body_bytes,
            keyring,
            master_key,
        };
        let api = serve_api(listener, state, demo, args.tls.clone(), api_stop.clone()).await?;
        let result = engine_task.await.context("engine task")?;
        api_stop.cancel();
        let _ = api.await;
        result.context("engine")?;
        tracing::info!("stopped");
        return Ok(ExitCode::SUCCESS);
    };

    let Some(key_file) = &args.key_file else {
        anyhow::bail!(
            "a cluster node needs the server key that API tokens are hashed under, the same file on every node: pass --key-file (DAGCRON_KEY_FILE); `dagcron tokens bootstrap --database URL --key-file FILE` creates it with the first admin token"
        );
    };
    let keyring = Arc::new(
        Keyring::load(key_file)
            .with_context(|| format!("reading the server key {}", key_file.display()))?,
    );
    let store = PgStore::connect(url, (args.pool_size as u32).clamp(4, 32))
        .await
        .context("opening the PostgreSQL database")?;
    agents.set_authenticate(join_tokens(Arc::new(store.clone()), keyring.clone()));
    let cluster_config = ClusterConfig {
        lease_ttl: Duration::from_millis(args.lease_ttl_ms),
        max_clock_skew: Duration::from_millis(args.max_clock_skew_ms),
        ..ClusterConfig::new(
            args.node_id
                .clone()
                .unwrap_or_else(|| default_node_id(address)),
            address.to_string(),
        )
    };
    let (registration, identity) = cluster::register(&store, &cluster_config, &*clock)
        .await
        .context("joining the cluster")?;
    // An agent may move between nodes: fencing tokens must not repeat across them.
    agents.set_token_base(registration.epoch << 40);
    let master_key = match &args.master_key_file {
        Some(file) => {
            let old = args
                .old_master_key_files
                .iter()
                .map(|f| {
                    MasterKey::load(f)
                        .with_context(|| format!("reading the old master key {}", f.display()))
                })
                .collect::<Result<Vec<_>>>()?;
            Some(Arc::new(KeySet::new(
                master_key(&store, file, false).await?,
                old,
                None,
            )))
        }
        None => None,
    };
    let config = EngineConfig {
        node: Some(identity.clone()),
        secrets: Some(SecretSource(Arc::new(StoredSecrets {
            store: Arc::new(store.clone()),
            key: master_key.clone(),
        }))),
        ..config
    };
    // Read before the engine reads the jobs: the coordinator brings it the
    // changes made after this.
    let jobs_revision = store
        .jobs_revision()
        .await
        .context("reading the jobs revision")?;
    let (engine, handle) = Engine::start(Arc::new(store.clone()), clock.clone(), config)
        .await
        .context("starting the engine")?;
    let coordinator = Coordinator::new(
        store.clone(),
        handle.clone(),
        cluster_config,
        &registration,
        &identity,
        clock,
        Some(jobs_revision),
    );
    let cluster = coordinator.handle();
    let stopped = CancellationToken::new();
    let mut coordinator_task = tokio::spawn(coordinator.run(shutdown.clone(), stopped.clone()));
    let mut engine_task =
        tokio::spawn(engine.run(shutdown.clone(), Duration::from_secs(args.shutdown_grace)));
    tracing::info!(
        "dagcron node {} listening on {}://{address}",
        registration.id,
        if args.tls.is_some() { "https" } else { "http" }
    );
    let watch = handle.clone();
    let state = AppState {
        store: Arc::new(store),
        engine: handle,
        cluster: Some(cluster),
        workers: Some(agents),
        max_body_bytes: args.max_body_bytes,
        keyring,
        master_key,
    };
    let api = serve_api(listener, state, demo, args.tls.clone(), api_stop.clone()).await?;
    let fenced = |e: &StorageError| matches!(e, StorageError::Fenced(_));
    tokio::select! {
        () = watch.fenced() => {
            // The lease ended and every attempt was killed, whatever the
            // engine's loop and the coordinator are waiting on (a database
            // that no longer answers): stop now.
            tracing::error!("this node's lease ended; exiting so that a restart registers it again");
            return Ok(ExitCode::from(EXIT_FENCED));
        }
        ended = &mut engine_task => {
            match ended.context("engine task")? {
                Err(e) if fenced(&e) => {
                    tracing::error!("{e}; exiting so that a restart registers this node again");
                    return Ok(ExitCode::from(EXIT_FENCED));
                }
                other => other.context("engine")?,
            }
            // The engine drained: leave the cluster.
            stopped.cancel();
            coordinator_task.await.context("cluster task")?.context("leaving the cluster")?;
            api_stop.cancel();
        }
        ended = &mut coordinator_task => {
            let e = match ended.context("cluster task")? {
                Ok(()) => anyhow::bail!("the cluster task ended early"),
                Err(e) => e,
            };
            // The lease is revoked: the engine kills its attempts and stops.
            let _ = engine_task.await;
            tracing::error!("{e}; exiting so that a restart registers this node again");
            return Ok(ExitCode::from(EXIT_FENCED));
        }
    }
    let _ = api.await;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Creates the data directory, or tightens an existing one, so that only
/// this user can enter it (0700).
fn private_dir(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating data directory {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))
}

/// Makes the database file and its journals readable by this user only (0600).
fn private_files(db: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let path = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("making {} private", path.display()))?;
        }
    }
    Ok(())
}

/// Lets an agent in by its join token: a valid token with the agent role;
/// its namespace and labels bound what the agent takes and claims.
fn join_tokens<S: Store>(store: Arc<S>, keyring: Arc<Keyring>) -> dagcron_agents::Authenticate {
    Arc::new(move |secret: String| {
        let (store, keyring) = (store.clone(), keyring.clone());
        Box::pin(async move {
            let refused = "the agent's join token is unknown, revoked, expired or not an agent's (dagcron tokens create --role agent)";
            let token = store
                .find_token(&keyring.hash(&secret))
                .await
                .map_err(|e| format!("checking the join token: {e}"))?
                .ok_or(refused)?;
            let valid = token.role == Role::Agent.as_str()
                && token.revoked_at.is_none()
                && token.expires_at.is_none_or(|e| e > jiff::Timestamp::now());
            if !valid {
                return Err(refused.to_string());
            }
            Ok(dagcron_agents::AgentGrant {
                token_id: token.id,
                namespace: token.namespace,
                labels: token.labels,
            })
        })
    })
}

/// The master key of secrets: read from `file`, or (`create`) made there on
/// a server whose store holds no secret yet. Secrets stored under a key
/// that is gone cannot be decrypted: a missing key file with stored
/// secrets is an error, never a reason to make a new key silently.
async fn master_key<S: Store>(
    store: &S,
    file: &std::path::Path,
    create: bool,
) -> Result<MasterKey> {
    let stored = store
        .count_secrets()
        .await
        .context("counting the secrets")?;
    let key = if create && stored == 0 {
        MasterKey::load_or_create(file).map(|(k, _)| k)
    } else {
        MasterKey::load(file)
    };
    let key = key.with_context(|| {
        if stored > 0 {
            format!(
                "reading the master key {}: the database holds {stored} secrets encrypted under it; restore the file",
                file.display()
            )
        } else {
            format!("reading the master key {}", file.display())
        }
    })?;
    Ok(key)
}

/// On the first start (no token at all), creates an instance-admin token
/// and writes it to `file` (0600), for the command line on this machine.
/// Tokens stored under a key that is gone can never be checked again: that
/// is an error, not a reason to make a new key silently.
pub(crate) async fn bootstrap_admin<S: Store>(
    store: &S,
    keyring: &Keyring,
    new_key: bool,
    file: &std::path::Path,
) -> Result<()> {
    let tokens = store.list_tokens().await.context("reading the tokens")?;
    if !tokens.is_empty() {
        anyhow::ensure!(
            !new_key,
            "the database holds API tokens but the server key they were hashed under is missing (a new one was just created); restore the old key file, or move the new one aside and revoke the tokens"
        );
        return Ok(());
    }
    let (record, secret) = dagcron_api::auth::instance_admin_token(jiff::Timestamp::now());
    let _ = std::fs::remove_file(file);
    dagcron_api::auth::write_private(file, format!("{secret}\n").as_bytes())
        .with_context(|| format!("writing {}", file.display()))?;
    store
        .create_token(&record, &keyring.hash(&secret))
        .await
        .context("storing the admin token")?;
    tracing::info!(
        "created the instance-admin token {}; its secret is in {} (the command line on this machine reads it)",
        record.id,
        file.display()
    );
    Ok(())
}

/// The machine's host name and the API's port: unique among the nodes of a
/// cluster as long as one machine runs one node per port.
fn default_node_id(address: SocketAddr) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| address.ip().to_string());
    format!("{host}:{}", address.port())
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
        let file: JobFile = serde_saphyr::from_str(DEMO)
            .map_err(|e| anyhow::anyhow!("the bundled demo file: {e}"))?;
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
    let app = dagcron_api::with_grpc(router(state), grpc);
    if let Some(config) = tls {
        return Ok(tokio::spawn(crate::tls::serve(
            listener, app, config, shutdown,
        )));
    }
    Ok(tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    }))
}
