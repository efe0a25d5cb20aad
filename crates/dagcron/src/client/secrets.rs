//! `dagcron secrets ...`: a namespace's secrets (never their values) and
//! the master keys.

use std::io::{self, Write};

use anyhow::{Context, Result, bail};
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

/// The value read from standard input, its final newline dropped; an
/// empty one is a mistake (an unset variable piped in), not a value.
fn secret_value(input: &str) -> Result<String> {
    let value = input.strip_suffix('\n').unwrap_or(input);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.is_empty() {
        bail!(
            "the value read from standard input is empty; pipe the value in, as in: printf %s \"$VALUE\" | dagcron secrets set NAMESPACE NAME"
        );
    }
    Ok(value.to_string())
}

pub(super) async fn run(c: &Client, cmd: SecretsCommand, out: &mut Output) -> Result<()> {
    match cmd {
        SecretsCommand::Set { namespace, name } => {
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .context("reading the value from standard input")?;
            let body = SecretBody {
                value: secret_value(&value)?,
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

#[cfg(test)]
mod tests {
    use super::secret_value;

    #[test]
    fn a_secret_keeps_its_value_but_the_final_newline() {
        assert_eq!(secret_value("s3cret\n").unwrap(), "s3cret");
        assert_eq!(secret_value("s3cret\r\n").unwrap(), "s3cret");
        assert_eq!(secret_value("two\nlines").unwrap(), "two\nlines");
        assert_eq!(secret_value(" x ").unwrap(), " x ");
    }

    /// `secrets set` stored an empty value silently.
    #[test]
    fn an_empty_value_is_refused() {
        for input in ["", "\n", "\r\n"] {
            let err = secret_value(input).unwrap_err().to_string();
            assert!(err.contains("empty"), "{err}");
        }
    }
}
