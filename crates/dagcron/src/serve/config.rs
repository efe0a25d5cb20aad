//! The configuration of `dagcron serve`: its flags (or `DAGCRON_*`
//! variables), the configuration file, and the defaults, merged in one
//! place ([`ServeArgs::config`]).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dagcron_agents::PoolConfig;

/// Command-line flags (or `DAGCRON_*` environment variables). Every one
/// overrides the same key of the configuration file, which overrides the
/// default.
#[derive(Args)]
pub struct ServeArgs {
    /// How log lines are written to standard error: readable text, or one
    /// JSON object per line (its fields: the run, job, namespace, attempt
    /// and node where an event has them).
    #[arg(long, env = "DAGCRON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// A TOML file with any of: data_dir, database, listen, metrics_listen,
    /// metrics_max_jobs, node_id, pool_size, misfire_grace, shutdown_grace,
    /// lease_ttl_ms, max_clock_skew_ms (and the other flags' names).
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
    /// Also serve `/metrics`, without a token, on this address (for a
    /// scraper on a private network); on the API's address, `/metrics`
    /// needs a viewer token over the whole instance.
    #[arg(long, env = "DAGCRON_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Jobs that get metric series of their own; the fires of the others
    /// are counted in their namespace's series [default: 1000].
    #[arg(long, env = "DAGCRON_METRICS_MAX_JOBS")]
    metrics_max_jobs: Option<usize>,
    /// Apply the bundled demo jobs, so that runs appear within seconds.
    #[arg(long)]
    demo: bool,
    /// Write the address the API listens on to this file once it answers
    /// (with `--listen 127.0.0.1:0`, the port the system chose).
    #[arg(long, env = "DAGCRON_ADDRESS_FILE")]
    address_file: Option<PathBuf>,
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
    /// Past this many tasks ready and waiting for a worker, manual triggers
    /// and backfills get 429 (scheduled fires go on) [default: 10000].
    #[arg(long, env = "DAGCRON_MAX_READY_BACKLOG")]
    max_ready_backlog: Option<usize>,
    /// Scheduled fires one namespace may make per second on this node; the
    /// rest make no run and are recorded `skipped_quota` (0: no limit)
    /// [default: 2000].
    #[arg(long, env = "DAGCRON_MAX_FIRES_PER_NAMESPACE")]
    max_fires_per_namespace: Option<u32>,
    /// Days the audit log keeps its rows; older rows are pruned, and the
    /// log's checkpoint keeps the rest verifiable (0: keep every row)
    /// [default: 365].
    #[arg(long, env = "DAGCRON_AUDIT_RETENTION_DAYS")]
    audit_retention_days: Option<u64>,
    /// Mebibytes of the data directory's disk that attempts' output never
    /// takes: output that would leave less free is dropped, with a note in
    /// its place (0: no reserve; the embedded database only) [default: 64].
    #[arg(long, env = "DAGCRON_DISK_RESERVE_MB")]
    disk_reserve_mb: Option<u64>,
    /// Runs of missed fires caught up (after an outage, by the jobs'
    /// misfire policies) that may begin per second on this node; the rest
    /// wait their turn (0: no pace) [default: 50].
    #[arg(long, env = "DAGCRON_CATCH_UP_PER_SECOND")]
    catch_up_per_second: Option<u32>,
    /// ...and per job [default: 5].
    #[arg(long, env = "DAGCRON_CATCH_UP_PER_JOB")]
    catch_up_per_job: Option<u32>,
    /// For fault drills only: this server's clock reads this many
    /// milliseconds ahead of the system's (negative: behind), as a node
    /// whose clock is wrong would.
    #[arg(
        long,
        env = "DAGCRON_FAULT_CLOCK_OFFSET_MS",
        hide = true,
        allow_hyphen_values = true
    )]
    fault_clock_offset_ms: Option<i64>,
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
    /// The SMTP relay e-mail notifications go through:
    /// smtp://[user@]host:587?tls=required (STARTTLS), smtps://host:465
    /// (TLS) or smtp://host:25 (plain, a relay on this host) [default:
    /// none, e-mail notifiers fail].
    #[arg(long, env = "DAGCRON_SMTP_URL")]
    smtp_url: Option<String>,
    /// The sender of e-mail notifications, such as dagcron@example.com.
    #[arg(long, env = "DAGCRON_SMTP_FROM", requires = "smtp_url")]
    smtp_from: Option<String>,
    /// A file holding the password of the SMTP URL's user (sent only over
    /// TLS, or to a relay on this host).
    #[arg(long, env = "DAGCRON_SMTP_PASSWORD_FILE", requires = "smtp_url")]
    smtp_password_file: Option<PathBuf>,
    /// The domains e-mail notifiers may send to (and their subdomains),
    /// such as example.com [default: any].
    #[arg(long, env = "DAGCRON_SMTP_ALLOWED_DOMAINS", value_delimiter = ',')]
    smtp_allowed_domains: Vec<String>,
    /// The NATS server whose JetStream messages start the runs of jobs
    /// with a `nats` trigger, such as nats://127.0.0.1:4222 [default: none,
    /// such jobs run only otherwise].
    #[arg(long, env = "DAGCRON_NATS_URL")]
    nats_url: Option<String>,
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
    metrics_listen: Option<SocketAddr>,
    metrics_max_jobs: Option<usize>,
    pool_size: Option<usize>,
    misfire_grace: Option<u64>,
    shutdown_grace: Option<u64>,
    max_body_bytes: Option<usize>,
    max_ready_backlog: Option<usize>,
    max_fires_per_namespace: Option<u32>,
    audit_retention_days: Option<u64>,
    disk_reserve_mb: Option<u64>,
    catch_up_per_second: Option<u32>,
    catch_up_per_job: Option<u32>,
    key_file: Option<PathBuf>,
    master_key_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    pass_env: Option<Vec<String>>,
    smtp_url: Option<String>,
    smtp_from: Option<String>,
    smtp_password_file: Option<PathBuf>,
    smtp_allowed_domains: Option<Vec<String>>,
    nats_url: Option<String>,
}

/// The settings in force: flags over the configuration file over defaults,
/// merged by [`ServeArgs::config`].
pub struct Config {
    pub(super) backend: Backend,
    pub(super) listen: SocketAddr,
    /// Where `/metrics` is also served, without a token.
    pub(super) metrics_listen: Option<SocketAddr>,
    /// Jobs with metric series of their own.
    pub(super) metrics_max_jobs: usize,
    /// Where to write the bound address once the API answers.
    pub(super) address_file: Option<PathBuf>,
    pub(super) demo: bool,
    pub(super) pool_size: usize,
    pub(super) misfire_grace: Duration,
    pub(super) shutdown_grace: Duration,
    pub(super) max_body_bytes: usize,
    pub(super) max_ready_backlog: usize,
    /// Scheduled fires per second and namespace on this node (none: no limit).
    pub(super) max_fires_per_namespace: Option<u32>,
    /// How long audit rows are kept (none: forever).
    pub(super) audit_retention: Option<Duration>,
    /// Bytes of the data directory's disk kept free of attempts' output.
    pub(super) disk_reserve: u64,
    /// The pace of catch-up runs (none: as they come).
    pub(super) catch_up_pace: Option<dagcron_runtime::CatchUpPace>,
    /// How far this server's clock is set off, for fault drills.
    clock_offset_ms: i64,
    pub(super) agents: PoolConfig,
    pub(super) tls: Option<Arc<rustls::ServerConfig>>,
    /// The SMTP relay of e-mail notifications.
    pub(super) smtp: Option<dagcron_exec::mail::Smtp>,
    /// The NATS server of `nats` triggers.
    pub(super) nats_url: Option<String>,
    pass_env: Vec<String>,
    /// The server's own files, hidden from its shell tasks: the data
    /// directory, the key files, the TLS key and the configuration file.
    server_files: Vec<PathBuf>,
}

/// Where the state lives, and what comes with each backend.
pub(super) enum Backend {
    /// Alone, on SQLite in the data directory.
    Embedded(Embedded),
    /// One node of the cluster that shares a PostgreSQL database.
    Cluster(Member),
}

/// An embedded server's files; the keys are made on the first start.
pub(super) struct Embedded {
    pub(super) data_dir: PathBuf,
    pub(super) key_file: PathBuf,
    pub(super) master_key_file: PathBuf,
}

/// A cluster member's settings; every node is given the same key files.
pub(super) struct Member {
    pub(super) url: String,
    /// Unique and stable across restarts (default: host name and port).
    pub(super) node_id: Option<String>,
    pub(super) key_file: PathBuf,
    /// None: no secrets on this cluster.
    pub(super) master_key_file: Option<PathBuf>,
    /// Older master keys, kept to decrypt while a rotation re-encrypts.
    pub(super) old_master_key_files: Vec<PathBuf>,
    pub(super) lease_ttl: Duration,
    pub(super) max_clock_skew: Duration,
}

/// The form of log lines (see [`ServeArgs::log_format`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Readable text.
    Text,
    /// One JSON object per line.
    Json,
}

impl ServeArgs {
    /// Merges these flags (and the `DAGCRON_*` variables behind them) with
    /// the configuration file they name and the defaults.
    pub fn config(&self) -> Result<Config> {
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
        let data_dir = self
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from("./dagcron-data"));
        let key_file = self.key_file.clone().or(file.key_file);
        let master_key_file = self.master_key_file.clone().or(file.master_key_file);
        let lease_ttl_ms = self.lease_ttl_ms.or(file.lease_ttl_ms).unwrap_or(5000);
        let max_clock_skew_ms = self
            .max_clock_skew_ms
            .or(file.max_clock_skew_ms)
            .unwrap_or(500);
        let backend = match self.database.clone().or(file.database) {
            None => Backend::Embedded(Embedded {
                key_file: key_file.unwrap_or_else(|| data_dir.join("server.key")),
                master_key_file: master_key_file.unwrap_or_else(|| data_dir.join("master.key")),
                data_dir,
            }),
            Some(url) => Backend::Cluster(Member {
                url,
                node_id: self.node_id.clone().or(file.node_id),
                key_file: key_file.context(
                    "a cluster node needs the server key that API tokens are hashed under, the same file on every node: pass --key-file (DAGCRON_KEY_FILE); `dagcron tokens bootstrap --database URL --key-file FILE` creates it with the first admin token",
                )?,
                master_key_file,
                old_master_key_files: self.old_master_key_file.clone(),
                lease_ttl: Duration::from_millis(lease_ttl_ms),
                max_clock_skew: Duration::from_millis(max_clock_skew_ms),
            }),
        };
        let smtp = match self.smtp_url.clone().or(file.smtp_url) {
            None => None,
            Some(url) => {
                let from = self
                    .smtp_from
                    .clone()
                    .or(file.smtp_from)
                    .context("e-mail needs a sender: pass --smtp-from (DAGCRON_SMTP_FROM)")?;
                let password = match self.smtp_password_file.clone().or(file.smtp_password_file) {
                    Some(path) => Some(
                        std::fs::read_to_string(&path)
                            .with_context(|| {
                                format!("reading the SMTP password file {}", path.display())
                            })?
                            .trim_end()
                            .to_string(),
                    ),
                    None => None,
                };
                let allowed = if self.smtp_allowed_domains.is_empty() {
                    file.smtp_allowed_domains.unwrap_or_default()
                } else {
                    self.smtp_allowed_domains.clone()
                };
                Some(
                    dagcron_exec::mail::Smtp::new(
                        &url,
                        password.as_deref(),
                        &from,
                        allowed,
                        Duration::from_secs(30),
                    )
                    .map_err(|e| anyhow::anyhow!("--smtp-url: {e}"))?,
                )
            }
        };
        let client_ca = self.client_ca.clone().or(file.client_ca);
        let tls_key = self.tls_key.clone().or(file.tls_key.clone());
        let mut server_files: Vec<PathBuf> = self.config.iter().chain(&tls_key).cloned().collect();
        match &backend {
            Backend::Embedded(e) => server_files.extend([
                e.data_dir.clone(),
                e.key_file.clone(),
                e.master_key_file.clone(),
            ]),
            Backend::Cluster(m) => {
                server_files.push(m.key_file.clone());
                server_files.extend(m.master_key_file.iter().cloned());
                server_files.extend(m.old_master_key_files.iter().cloned());
            }
        }
        let config = Config {
            backend,
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7700))),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            metrics_max_jobs: self
                .metrics_max_jobs
                .or(file.metrics_max_jobs)
                .unwrap_or(dagcron_runtime::metrics::DEFAULT_MAX_JOB_SERIES),
            address_file: self.address_file.clone(),
            demo: self.demo,
            smtp,
            nats_url: self.nats_url.clone().or(file.nats_url),
            pool_size: self.pool_size.or(file.pool_size).unwrap_or(64),
            misfire_grace: Duration::from_secs(
                self.misfire_grace.or(file.misfire_grace).unwrap_or(60),
            ),
            shutdown_grace: Duration::from_secs(
                self.shutdown_grace.or(file.shutdown_grace).unwrap_or(10),
            ),
            max_ready_backlog: self
                .max_ready_backlog
                .or(file.max_ready_backlog)
                .unwrap_or(10_000),
            max_fires_per_namespace: Some(
                self.max_fires_per_namespace
                    .or(file.max_fires_per_namespace)
                    .unwrap_or(2000),
            )
            .filter(|n| *n > 0),
            audit_retention: Some(
                self.audit_retention_days
                    .or(file.audit_retention_days)
                    .unwrap_or(365),
            )
            .filter(|d| *d > 0)
            .map(|d| Duration::from_secs(d.saturating_mul(86_400))),
            disk_reserve: self
                .disk_reserve_mb
                .or(file.disk_reserve_mb)
                .unwrap_or(64)
                .saturating_mul(1 << 20),
            clock_offset_ms: self.fault_clock_offset_ms.unwrap_or(0),
            catch_up_pace: {
                let default = dagcron_runtime::CatchUpPace::default();
                let per_server = self
                    .catch_up_per_second
                    .or(file.catch_up_per_second)
                    .unwrap_or(default.per_server);
                let per_job = self
                    .catch_up_per_job
                    .or(file.catch_up_per_job)
                    .unwrap_or(default.per_job);
                (per_server > 0 && per_job > 0).then_some(dagcron_runtime::CatchUpPace {
                    per_server,
                    per_job,
                })
            },
            max_body_bytes: self
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(dagcron_api::DEFAULT_MAX_BODY_BYTES),
            agents: PoolConfig {
                lease_ttl: Duration::from_millis(
                    self.agent_lease_ttl_ms
                        .or(file.agent_lease_ttl_ms)
                        .unwrap_or(10_000),
                ),
                token: self.agent_token.clone().or(file.agent_token),
                require_client_certificate: client_ca.is_some(),
                ..PoolConfig::default()
            },
            tls: match (
                self.tls_cert.clone().or(file.tls_cert),
                self.tls_key.clone().or(file.tls_key),
            ) {
                (Some(cert), Some(key)) => Some(crate::tls::server_config(
                    &cert,
                    &key,
                    client_ca.as_deref(),
                )?),
                (None, None) => None,
                _ => anyhow::bail!("TLS needs both tls_cert and tls_key"),
            },
            pass_env: if self.pass_env.is_empty() {
                file.pass_env.unwrap_or_default()
            } else {
                self.pass_env.clone()
            },
            server_files,
        };
        anyhow::ensure!(config.pool_size > 0, "pool_size must be at least 1");
        anyhow::ensure!(
            lease_ttl_ms >= 500,
            "lease_ttl_ms must be at least 500 (heartbeats are a fifth of it)"
        );
        anyhow::ensure!(
            config.agents.lease_ttl >= Duration::from_secs(1),
            "agent_lease_ttl_ms must be at least 1000 (agents heartbeat every quarter of it, and kill their attempts at three quarters without an answer)"
        );
        Ok(config)
    }
}

impl Config {
    /// The configuration that these `dagcron serve` flags give, merged as
    /// the command line merges them (the `DAGCRON_*` variables and the
    /// configuration file included).
    pub fn from_flags<I, T>(flags: I) -> Result<Config>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        #[derive(clap::Parser)]
        #[command(name = "serve")]
        struct Serve {
            #[command(flatten)]
            args: ServeArgs,
        }
        let words =
            std::iter::once(OsString::from("serve")).chain(flags.into_iter().map(Into::into));
        <Serve as clap::Parser>::try_parse_from(words)?
            .args
            .config()
    }

    /// The clock of this server: the system's, unless a fault drill sets
    /// it off.
    pub(super) fn clock(&self) -> std::sync::Arc<dyn dagcron_runtime::Clock> {
        match self.clock_offset_ms {
            0 => std::sync::Arc::new(dagcron_runtime::SystemClock),
            ms => {
                tracing::warn!(
                    "this server's clock is set {ms} ms off the system's (a fault drill)"
                );
                std::sync::Arc::new(dagcron_runtime::SkewedClock {
                    offset: jiff::SignedDuration::from_millis(ms),
                })
            }
        }
    }

    /// The address to bind (the caller binds it: see [`run`]).
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// The variables of the server's environment that tasks receive.
    pub fn pass_env(&self) -> &[String] {
        &self.pass_env
    }

    /// The addresses this server listens on (every address of the machine
    /// when it listens on an unspecified one), which its tenants' http
    /// tasks may not reach unless their policy allows them.
    pub fn own_addresses(&self) -> Vec<std::net::IpAddr> {
        let listening: Vec<std::net::IpAddr> = std::iter::once(self.listen)
            .chain(self.metrics_listen)
            .map(|a| a.ip())
            .collect();
        let mut out: Vec<std::net::IpAddr> = listening
            .iter()
            .copied()
            .filter(|ip| !ip.is_unspecified())
            .collect();
        if listening.iter().any(|ip| ip.is_unspecified())
            && let Ok(interfaces) = nix::ifaddrs::getifaddrs()
        {
            out.extend(interfaces.filter_map(|i| {
                let a = i.address?;
                a.as_sockaddr_in()
                    .map(|v4| std::net::IpAddr::V4(v4.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
            }));
        }
        out
    }

    /// The files and directories of the server that its shell tasks must
    /// not see (see [`dagcron_exec::sandbox`]). An embedded server's data
    /// directory is made first, so that it exists to be hidden.
    pub fn server_files(&self) -> Result<Vec<PathBuf>> {
        if let Backend::Embedded(e) = &self.backend {
            super::backend::private_dir(&e.data_dir)?;
        }
        Ok(self.server_files.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn flags_override_the_file_which_overrides_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dagcron.toml");
        std::fs::write(
            &file,
            "pool_size = 4\nmisfire_grace = 5\nlisten = \"127.0.0.1:0\"\n",
        )
        .unwrap();
        let config = Config::from_flags([
            "--config",
            file.to_str().unwrap(),
            "--pool-size",
            "8",
            "--data-dir",
            "d",
        ])
        .unwrap();
        assert_eq!(config.pool_size, 8, "the flag over the file");
        assert_eq!(
            config.misfire_grace,
            Duration::from_secs(5),
            "the file over the default"
        );
        assert_eq!(
            config.shutdown_grace,
            Duration::from_secs(10),
            "the default"
        );
        assert_eq!(config.listen(), SocketAddr::from(([127, 0, 0, 1], 0)));
        let Backend::Embedded(Embedded {
            key_file,
            master_key_file,
            ..
        }) = &config.backend
        else {
            panic!("no database: embedded");
        };
        assert_eq!(key_file, &Path::new("d").join("server.key"));
        assert_eq!(master_key_file, &Path::new("d").join("master.key"));
    }

    #[test]
    fn a_cluster_node_needs_the_server_key_and_a_sane_lease() {
        let missing = Config::from_flags(["--database", "postgres://db/x"])
            .err()
            .unwrap();
        assert!(missing.to_string().contains("--key-file"), "{missing}");
        let node =
            Config::from_flags(["--database", "postgres://db/x", "--key-file", "k"]).unwrap();
        assert!(
            matches!(node.backend, Backend::Cluster(Member { ref key_file, .. }) if key_file == Path::new("k"))
        );
        let short = Config::from_flags(["--lease-ttl-ms", "100"]).err().unwrap();
        assert!(short.to_string().contains("lease_ttl_ms"), "{short}");
    }
}
