//! `dagcron secrets ...`: a namespace's secrets (never their values) and
//! the master keys.

use std::io::{self, Write};

use anyhow::{Context, Result};
use clap::Subcommand;
use dagcron_api::wire::{KeysAnswer, SecretAnswer, SecretBody, SecretList};

use super::output::{Output, Show, instant};
use super::{Client, Empty};

#[derive(Subcommand)]
pub(crate) enum SecretsCommand {
    /// Set a secret's value, read from standard input (a final newline is dropped).
    Set {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The names and versions of a namespace's secrets (never their values).
    List {
        /// Namespace.
        namespace: String,
    },
    /// Delete a secret.
    Delete {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The master keys and how many secrets each encrypts.
    Keys,
    /// Rotate the master key: a new key (an embedded server makes it), every
    /// secret re-encrypted under it in the background, the old key kept
    /// until no secret uses it.
    RotateKey,
}

impl Show for SecretList {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{:<32} {:>7} {:<10} UPDATED", "NAME", "VERSION", "KEY")?;
        for s in &self.items {
            writeln!(
                out,
                "{:<32} {:>7} {:<10} {}",
                s.name,
                s.version,
                s.key_id,
                instant(&s.updated_at)
            )?;
        }
        Ok(())
    }
}

impl Show for KeysAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        for k in &self.keys {
            let current = if k.key_id == self.current {
                " (current)"
            } else {
                ""
            };
            writeln!(out, "{} {} secrets{current}", k.key_id, k.secrets)?;
        }
        Ok(())
    }
}

pub(super) async fn run(c: &Client, cmd: SecretsCommand, out: &mut Output) -> Result<()> {
    match cmd {
        SecretsCommand::Set { namespace, name } => {
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .context("reading the value from standard input")?;
            let body = SecretBody {
                value: value.strip_suffix('\n').unwrap_or(&value).to_string(),
            };
            let s: SecretAnswer = c
                .put(
                    &format!("/api/v1/namespaces/{namespace}/secrets/{name}"),
                    &body,
                )
                .await?;
            out.say(format_args!("{namespace}/{name} version {}", s.version))
        }
        SecretsCommand::List { namespace } => out.show(
            &c.get::<SecretList>(&format!("/api/v1/namespaces/{namespace}/secrets"))
                .await?,
        ),
        SecretsCommand::Keys => out.show(&c.get::<KeysAnswer>("/api/v1/secrets/keys").await?),
        SecretsCommand::RotateKey => {
            let k: KeysAnswer = c.post("/api/v1/secrets/rotate-key", &Empty {}).await?;
            out.say(format_args!(
                "current key {}; the secrets are being re-encrypted under it (dagcron secrets keys)",
                k.current
            ))
        }
        SecretsCommand::Delete { namespace, name } => {
            c.delete(&format!("/api/v1/namespaces/{namespace}/secrets/{name}"))
                .await?;
            out.say(format_args!("deleted {namespace}/{name}"))
        }
    }
}
