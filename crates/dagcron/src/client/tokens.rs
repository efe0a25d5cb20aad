//! `dagcron tokens ...`: API tokens, and a cluster's first one.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Subcommand;
use dagcron_api::wire::{CreatedToken, NewTokenBody, TokenList};

use super::output::{Output, Show, instant};
use super::{Client, parse_kv};

#[derive(Subcommand)]
pub(crate) enum TokensCommand {
    /// Create a token and print its secret (shown this once).
    Create {
        /// What it is for.
        #[arg(long)]
        name: String,
        /// viewer, operator, developer or admin (at most your own).
        #[arg(long)]
        role: String,
        /// Limit it to one namespace (default: the whole instance).
        #[arg(long)]
        namespace: Option<String>,
        /// Valid for this long, such as 30d (default: until revoked).
        #[arg(long)]
        expires: Option<String>,
        /// For an agent's join token: the only labels an agent may claim,
        /// `k=v,...` (default: any).
        #[arg(long, value_delimiter = ',', value_parser = parse_kv)]
        labels: Vec<(String, String)>,
    },
    /// The tokens you administer (never their secrets).
    List,
    /// Revoke a token: it is refused from then on.
    Revoke {
        /// Its id (tok_...).
        id: String,
    },
    /// Create a cluster's server key file (if missing) and its first
    /// instance-admin token, directly in the database; prints the token.
    Bootstrap {
        /// The cluster's PostgreSQL URL.
        #[arg(long, env = "DAGCRON_DATABASE_URL")]
        database: String,
        /// The server key file every node is started with (--key-file).
        #[arg(long, env = "DAGCRON_KEY_FILE")]
        key_file: PathBuf,
    },
}

/// Where a token's authority lies, in words.
fn scope(namespace: Option<&str>) -> String {
    namespace.map_or("over the instance".to_string(), |n| {
        format!("in namespace {n}")
    })
}

impl Show for CreatedToken {
    /// The secret alone on standard output (for a script to take), what it
    /// is on standard error.
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", self.token)?;
        eprintln!(
            "token {} ({} {}): the secret above is shown only this once",
            self.details.id,
            self.details.role,
            scope(self.details.namespace.as_deref())
        );
        Ok(())
    }
}

impl Show for TokenList {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:<18} {:<10} {:<16} {:<28} {:<28} NAME",
            "ID", "ROLE", "NAMESPACE", "LAST_USED", "STATE"
        )?;
        for t in &self.items {
            let state = if let Some(at) = &t.revoked_at {
                format!("revoked {at}")
            } else if let Some(at) = &t.expires_at {
                format!("expires {at}")
            } else {
                "valid".into()
            };
            writeln!(
                out,
                "{:<18} {:<10} {:<16} {:<28} {:<28} {}",
                t.id,
                t.role,
                t.namespace.as_deref().unwrap_or("*"),
                t.last_used_at
                    .as_ref()
                    .map_or_else(|| "never".to_string(), instant),
                state,
                t.name
            )?;
        }
        Ok(())
    }
}

pub(super) async fn run(c: &Client, cmd: TokensCommand, out: &mut Output) -> Result<()> {
    match cmd {
        TokensCommand::Create {
            name,
            role,
            namespace,
            expires,
            labels,
        } => {
            let body = NewTokenBody {
                name,
                role,
                namespace,
                expires_in: expires,
                labels: (!labels.is_empty()).then(|| labels.into_iter().collect()),
            };
            out.show(&c.post::<CreatedToken>("/api/v1/tokens", &body).await?)
        }
        TokensCommand::List => out.show(&c.get::<TokenList>("/api/v1/tokens").await?),
        TokensCommand::Revoke { id } => {
            c.delete(&format!("/api/v1/tokens/{id}")).await?;
            out.say(format_args!("revoked {id}"))
        }
        TokensCommand::Bootstrap { database, key_file } => {
            bootstrap(&database, &key_file, out).await
        }
    }
}

/// Makes the server key (if missing) and the first instance-admin token of
/// a cluster, in its database: no server runs yet to ask.
async fn bootstrap(database: &str, key_file: &Path, out: &mut Output) -> Result<()> {
    use dagcron_store::prelude::*;
    let (keyring, created) = dagcron_api::auth::Keyring::load_or_create(key_file)
        .with_context(|| format!("the server key {}", key_file.display()))?;
    if created {
        eprintln!(
            "created the server key {} (0600): start every node with --key-file pointing at a copy of it",
            key_file.display()
        );
    }
    let store = dagcron_store_postgres::PgStore::connect(database, 2)
        .await
        .context("opening the PostgreSQL database")?;
    let (record, secret) = dagcron_api::auth::instance_admin_token(jiff::Timestamp::now());
    store
        .create_token(&record, &keyring.hash(&secret))
        .await
        .context("storing the token")?;
    out.say(&secret)?;
    eprintln!(
        "instance-admin token {}: the secret above is shown only this once",
        record.id
    );
    Ok(())
}
