//! `dagcron cluster status` and `dagcron workers list`.

use std::io::{self, Write};

use anyhow::Result;
use clap::Subcommand;
use dagcron_api::wire::{ClusterAnswer, WorkersAnswer};

use super::output::{Output, Show, instant};
use super::{ApiFailure, Client};

#[derive(Subcommand)]
pub(crate) enum WorkersCommand {
    /// Every agent: labels, capacity, running attempts, last heartbeat, clock offset, version.
    List,
}

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Every node, and this server's view of itself.
    Status,
}

impl Show for WorkersAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:<20} {:>8} {:<8} {:<27} {:>10} {:<8} LABELS",
            "AGENT", "RUNNING", "STATE", "LAST_HEARTBEAT", "OFFSET_MS", "VERSION"
        )?;
        for w in &self.items {
            let labels: Vec<String> = w.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let state = if !w.connected {
                "gone"
            } else if w.draining {
                "draining"
            } else {
                "ready"
            };
            writeln!(
                out,
                "{:<20} {:>8} {:<8} {:<27} {:>10.3} {:<8} {}",
                w.id,
                format!("{}/{}", w.running, w.capacity),
                state,
                instant(&w.last_heartbeat),
                w.clock_offset_us as f64 / 1000.0,
                w.version,
                labels.join(",")
            )?;
        }
        Ok(())
    }
}

impl Show for ClusterAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let me = &self.this_node;
        writeln!(
            out,
            "this node: {} (epoch {}), {} jobs owned, ring of {}, clock {} ms off the database's{}",
            me.node_id,
            me.epoch,
            me.owned_jobs,
            me.ring_size,
            me.clock_skew_us as f64 / 1000.0,
            if me.clock_ok {
                ""
            } else {
                " (TOO FAR: owning no jobs)"
            }
        )?;
        writeln!(
            out,
            "{:<20} {:>6} {:<9} {:<6} {:>6} {:>10} {:<27} ADDRESS",
            "NODE", "EPOCH", "STATE", "LEASE", "JOBS", "SKEW_MS", "LEASE_UNTIL"
        )?;
        for n in &self.nodes {
            writeln!(
                out,
                "{:<20} {:>6} {:<9} {:<6} {:>6} {:>10.1} {:<27} {}",
                n.id,
                n.epoch,
                n.state,
                if n.lease_valid { "valid" } else { "ended" },
                n.owned_jobs,
                n.clock_skew_us as f64 / 1000.0,
                instant(&n.lease_until),
                n.address,
            )?;
        }
        Ok(())
    }
}

pub(super) async fn workers(c: &Client, cmd: WorkersCommand, out: &mut Output) -> Result<()> {
    match cmd {
        WorkersCommand::List => out.show(&c.get::<WorkersAnswer>("/api/v1/workers").await?),
    }
}

pub(super) async fn cluster(c: &Client, cmd: ClusterCommand, out: &mut Output) -> Result<()> {
    match cmd {
        ClusterCommand::Status => match c.get::<ClusterAnswer>("/api/v1/cluster").await {
            Ok(answer) => out.show(&answer),
            // A server alone is a fine status to report, not a failure.
            Err(e) if e.downcast_ref::<ApiFailure>().is_some_and(|f| f.code == "no_cluster") => {
                out.say("a single server, no cluster: it runs alone on its embedded database (nodes started with --database postgres://... form a cluster)")
            }
            Err(e) => Err(e),
        },
    }
}
