//! `dagcron notifications ...`: a namespace's outbox, where each
//! notification went and where it stands.

use std::io::{self, Write};

use anyhow::Result;
use clap::Subcommand;
use dagcron_api::wire::{NotificationAnswer, NotificationPage};

use super::Client;
use super::output::{Output, Show, instant, or_dash};

#[derive(Subcommand)]
pub(crate) enum NotificationsCommand {
    /// A namespace's notifications, newest first.
    List {
        /// Namespace.
        namespace: String,
        /// Only those given up.
        #[arg(long)]
        failed: bool,
        /// At most this many (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One notification and each of its delivery attempts.
    Show {
        /// Namespace.
        namespace: String,
        /// The notification's id (from `list`).
        id: i64,
    },
}

impl Show for NotificationPage {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:>6} {:<24} {:>8} {:<10} {:<16} {:<10} {:>8} {:<20} LAST ERROR",
            "ID", "JOB", "RUN", "EVENT", "NOTIFIER", "STATE", "ATTEMPTS", "CREATED"
        )?;
        for n in &self.items {
            writeln!(
                out,
                "{:>6} {:<24} {:>8} {:<10} {:<16} {:<10} {:>8} {:<20} {}",
                n.id,
                n.job,
                or_dash(n.run.as_ref()),
                n.event,
                n.notifier,
                n.state,
                n.attempts,
                instant(&n.created_at),
                n.last_error.as_deref().unwrap_or("")
            )?;
        }
        if let Some(next) = self.next {
            writeln!(out, "(more before {next})")?;
        }
        Ok(())
    }
}

impl Show for NotificationAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "notification {} ({})", self.id, self.key)?;
        writeln!(
            out,
            "job {}, run {}, event {}",
            self.job,
            or_dash(self.run.as_ref()),
            self.event
        )?;
        writeln!(out, "to {} ({})", self.notifier, self.channel)?;
        let when = match (&self.next_at, &self.ended_at) {
            (Some(next), _) => format!(", next attempt at {}", instant(next)),
            (None, Some(end)) => format!(" at {}", instant(end)),
            (None, None) => String::new(),
        };
        writeln!(out, "{} after {} attempts{when}", self.state, self.attempts)?;
        for d in self.deliveries.iter().flatten() {
            writeln!(
                out,
                "  attempt {} at {}: {}{}",
                d.number,
                instant(&d.at),
                d.status
                    .map_or("no answer".to_string(), |s| format!("status {s}")),
                d.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )?;
        }
        if self.state == "dropped"
            && let Some(why) = &self.last_error
        {
            writeln!(out, "dropped: {why}")?;
        }
        Ok(())
    }
}

pub(super) async fn run(c: &Client, cmd: NotificationsCommand, out: &mut Output) -> Result<()> {
    match cmd {
        NotificationsCommand::List {
            namespace,
            failed,
            limit,
        } => out.show(
            &c.get::<NotificationPage>(&format!(
                "/api/v1/namespaces/{namespace}/notifications?limit={limit}{}",
                if failed { "&failed=true" } else { "" }
            ))
            .await?,
        ),
        NotificationsCommand::Show { namespace, id } => out.show(
            &c.get::<NotificationAnswer>(&format!(
                "/api/v1/namespaces/{namespace}/notifications/{id}"
            ))
            .await?,
        ),
    }
}
