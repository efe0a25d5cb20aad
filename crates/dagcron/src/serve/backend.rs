//! What each backend starts with: an embedded server its data directory,
//! its keys (made on the first start) and a first admin token; a cluster
//! member the shared database, the key files every node is given, and its
//! registration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use dagcron_agents::AgentPool;
use dagcron_api::auth::Keyring;
use dagcron_api::secrets::{KeyFiles, KeySet, MasterKey};
use dagcron_core::authz::Role;
use dagcron_runtime::cluster::{self, ClusterConfig, ClusterHandle, Coordinator};
use dagcron_runtime::{EngineHandle, NodeIdentity};
use dagcron_store::StorageError;
use dagcron_store::cluster::Coordination;
use dagcron_store::prelude::*;
use dagcron_store_postgres::PgStore;
use dagcron_store_sqlite::SqliteStore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Config;
use super::config::{Embedded, Member};

/// Starts a cluster member's coordinator beside its engine (given the
/// engine's handle, the shutdown token and the token that says the engine
/// has drained); returns the cluster's view for the API and the task.
pub(super) type Join = Box<
    dyn FnOnce(
            EngineHandle,
            CancellationToken,
            CancellationToken,
        ) -> (ClusterHandle, JoinHandle<Result<(), StorageError>>)
        + Send,
>;

/// A server ready to start its engine: its store and keys, and for a
/// member of a cluster, its identity and what joins it to the others.
pub(super) struct Node<S: Store> {
    pub(super) store: Arc<S>,
    pub(super) keyring: Arc<Keyring>,
    pub(super) master_key: Option<Arc<KeySet>>,
    /// A cluster member's slot and lease, which its engine writes under.
    pub(super) identity: Option<NodeIdentity>,
    pub(super) join: Option<Join>,
    /// How the start-up line names it.
    pub(super) name: String,
    /// A cluster member's id (an embedded server is named by its host and port).
    pub(super) node_id: Option<String>,
    /// Where its data lives, for the start-up line (an embedded server).
    pub(super) data_dir: Option<PathBuf>,
}

/// An embedded server: SQLite in the data directory (0700, its files 0600),
/// the server key and the master key made there on the first start, and
/// an instance-admin token for the command line on this machine.
pub(super) async fn embedded(settings: &Embedded) -> Result<Node<SqliteStore>> {
    let Embedded {
        data_dir,
        key_file,
        master_key_file,
    } = settings;
    private_dir(data_dir)?;
    let db = data_dir.join("dagcron.db");
    let store = Arc::new(
        SqliteStore::open(&db)
            .await
            .with_context(|| format!("opening {}", db.display()))?,
    );
    private_files(&db)?;
    let (keyring, new_key) = Keyring::load_or_create(key_file)
        .with_context(|| format!("reading the server key {}", key_file.display()))?;
    bootstrap_admin(&*store, &keyring, new_key, &data_dir.join("admin.token")).await?;
    let files = KeyFiles {
        current: master_key_file.to_path_buf(),
        old: data_dir.join("master-keys"),
    };
    let master_key = KeySet::load_files(files, master_key(&*store, master_key_file, true).await?)
        .context("reading the older master keys")?;
    Ok(Node {
        store,
        keyring: Arc::new(keyring),
        master_key: Some(Arc::new(master_key)),
        identity: None,
        join: None,
        name: "dagcron".into(),
        node_id: None,
        data_dir: Some(data_dir.to_path_buf()),
    })
}

/// A cluster member: opens the shared database and registers this node (a
/// new epoch and lease); the coordinator starts once the engine does.
pub(super) async fn member(
    settings: &Member,
    config: &Config,
    address: SocketAddr,
    agents: &AgentPool,
) -> Result<Node<PgStore>> {
    let keyring = Keyring::load(&settings.key_file)
        .with_context(|| format!("reading the server key {}", settings.key_file.display()))?;
    // At most 16 connections a node: its two write lanes, claims, leases
    // and the API's reads share them, and three nodes stay well under
    // PostgreSQL's default of 100 connections.
    let store = PgStore::connect(&settings.url, (config.pool_size as u32).clamp(4, 16))
        .await
        .context("opening the PostgreSQL database")?;
    let clock = config.clock();
    let cluster_config = ClusterConfig {
        lease_ttl: settings.lease_ttl,
        max_clock_skew: settings.max_clock_skew,
        ..ClusterConfig::new(
            settings
                .node_id
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
    let master_key = match &settings.master_key_file {
        Some(file) => {
            let old = settings
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
    // Read before the engine reads the jobs: the coordinator brings it
    // the changes made after this.
    let jobs_revision = store
        .jobs_revision()
        .await
        .context("reading the jobs revision")?;
    let name = format!("dagcron node {}", registration.id);
    let node_id = Some(registration.id.clone());
    let coordinated = store.clone();
    let member = identity.clone();
    let join: Join = Box::new(move |engine, shutdown, stopped| {
        let coordinator = Coordinator::new(
            coordinated,
            engine,
            cluster_config,
            &registration,
            &member,
            clock,
            Some(jobs_revision),
        );
        let view = coordinator.handle();
        (view, tokio::spawn(coordinator.run(shutdown, stopped)))
    });
    Ok(Node {
        store: Arc::new(store),
        keyring: Arc::new(keyring),
        master_key,
        identity: Some(identity),
        join: Some(join),
        name,
        node_id,
        data_dir: None,
    })
}

/// Creates the data directory, or tightens an existing one, so that only
/// this user can enter it (0700).
pub(super) fn private_dir(dir: &Path) -> Result<()> {
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
fn private_files(db: &Path) -> Result<()> {
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
pub(super) fn join_tokens<S: Store>(
    store: Arc<S>,
    keyring: Arc<Keyring>,
) -> dagcron_agents::Authenticate {
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
async fn master_key<S: Store>(store: &S, file: &Path, create: bool) -> Result<MasterKey> {
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
async fn bootstrap_admin<S: Store>(
    store: &S,
    keyring: &Keyring,
    new_key: bool,
    file: &Path,
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
pub(super) fn default_node_id(address: SocketAddr) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| address.ip().to_string());
    format!("{host}:{}", address.port())
}
