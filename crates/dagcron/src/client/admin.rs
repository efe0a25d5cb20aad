//! `dagcron admin ...`: the instance's read-only mode.

use std::io::{self, Write};

use anyhow::Result;
use clap::{Subcommand, ValueEnum};
use dagcron_api::wire::{ReadOnlyAnswer, ReadOnlyBody};

use super::Client;
use super::output::{Output, Show, or_dash};

#[derive(Subcommand)]
pub(crate) enum AdminCommand {
    /// Whether the instance is read-only; `on` or `off` to change it (an
    /// instance admin). While on, schedules keep firing and runs go on;
    /// applies, edits, manual triggers and backfills are refused.
    ReadOnly {
        /// `on` or `off`; nothing: show.
        state: Option<Switch>,
        /// Why (shown to everyone refused).
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Switch {
    On,
    Off,
}

impl Show for ReadOnlyAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        if !self.read_only {
            return writeln!(out, "read-only: off");
        }
        writeln!(
            out,
            "read-only: on since {} by {}: {}",
            or_dash(self.since.as_ref()),
            self.by.as_deref().unwrap_or("-"),
            self.reason.as_deref().unwrap_or("-")
        )
    }
}

pub(crate) async fn run(c: &Client, cmd: AdminCommand, out: &mut Output) -> Result<()> {
    match cmd {
        AdminCommand::ReadOnly { state: None, .. } => {
            out.show(&c.get::<ReadOnlyAnswer>("/api/v1/admin/read-only").await?)
        }
        AdminCommand::ReadOnly {
            state: Some(state),
            reason,
        } => {
            let body = ReadOnlyBody {
                read_only: matches!(state, Switch::On),
                reason,
            };
            out.show(
                &c.put::<ReadOnlyAnswer>("/api/v1/admin/read-only", &body)
                    .await?,
            )
        }
    }
}
