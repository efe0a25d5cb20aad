//! `dagcron worker`: a remote worker agent.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use dagcron_agents::agent::{self, AgentConfig};
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub(crate) struct WorkerArgs {
    /// The server's URL; for a cluster, the URLs of several nodes,
    /// comma-separated: the agent moves to the next when one does not answer.
    #[arg(
        long,
        env = "DAGCRON_SERVER",
        default_value = "http://127.0.0.1:7700",
        value_delimiter = ','
    )]
    server: Vec<String>,
    /// Labels tasks select agents by: `k=v,k2=v2`.
    #[arg(long, value_delimiter = ',', value_parser = crate::client::parse_kv)]
    labels: Vec<(String, String)>,
    /// Attempts it runs at once.
    #[arg(long, default_value_t = 4)]
    capacity: u32,
    /// The secret the server expects (its `--agent-token`).
    #[arg(long, env = "DAGCRON_AGENT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The agent's name, stable across restarts [default: the host name].
    #[arg(long, env = "DAGCRON_AGENT_ID")]
    id: Option<String>,
    /// Variables of the agent's environment that tasks receive (tasks get
    /// only PATH, HOME, LANG, LC_*, TZ and their own otherwise).
    #[arg(long, env = "DAGCRON_PASS_ENV", value_delimiter = ',')]
    pass_env: Vec<String>,
    /// The certificate (PEM) of the authority that signed the server's, for
    /// `https://` servers whose certificate is not publicly trusted.
    #[arg(long, env = "DAGCRON_CA")]
    ca: Option<std::path::PathBuf>,
    /// The agent's certificate (PEM), for a server with --client-ca.
    #[arg(long, env = "DAGCRON_AGENT_CERT", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, env = "DAGCRON_AGENT_KEY", requires = "cert")]
    key: Option<std::path::PathBuf>,
}

pub(crate) async fn run(args: WorkerArgs) -> Result<ExitCode> {
    crate::init_logging(crate::serve::LogFormat::Text);
    anyhow::ensure!(args.capacity > 0, "--capacity must be at least 1");
    dagcron_exec::pass_env(args.pass_env.clone());
    if !dagcron_exec::tree::become_subreaper() {
        tracing::warn!("cannot become the child subreaper of task processes");
    }
    let agent_id = match args.id {
        Some(id) => id,
        None => nix::unistd::gethostname()
            .context("reading the host name (or pass --id)")?
            .into_string()
            .map_err(|_| anyhow::anyhow!("the host name is not UTF-8; pass --id"))?,
    };
    let labels: BTreeMap<String, String> = args.labels.into_iter().collect();
    let shutdown = CancellationToken::new();
    let signal = crate::shutdown_signal()?;
    let token = shutdown.clone();
    tokio::spawn(async move {
        signal.await;
        token.cancel();
    });
    let config = AgentConfig {
        servers: args.server,
        agent_id,
        labels,
        capacity: args.capacity,
        token: args.token,
        ca: match &args.ca {
            Some(path) => Some(
                std::fs::read(path)
                    .with_context(|| format!("reading the CA certificate {}", path.display()))?,
            ),
            None => None,
        },
        identity: match (&args.cert, &args.key) {
            (Some(cert), Some(key)) => Some((
                std::fs::read(cert)
                    .with_context(|| format!("reading the certificate {}", cert.display()))?,
                std::fs::read(key).with_context(|| format!("reading the key {}", key.display()))?,
            )),
            _ => None,
        },
    };
    dagcron::serve::give_back_code_pages();
    agent::run(config, shutdown).await?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
