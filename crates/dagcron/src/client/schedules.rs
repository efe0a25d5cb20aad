//! `dagcron schedules hotspots`: the seconds of the coming window at which
//! the most jobs fire together, and how to spread them with `H`.

use std::io::{self, Write};

use anyhow::Result;
use clap::Subcommand;
use dagcron_api::wire::HotspotReport;

use super::Client;
use super::output::{Output, Show, instant};

#[derive(Subcommand)]
pub(crate) enum SchedulesCommand {
    /// The seconds at which the most jobs fire together in the coming
    /// window, the jobs behind each, and their expressions spread with `H`.
    Hotspots {
        /// How far ahead to look, such as 30m, 1h or 12h (at most 1d).
        #[arg(long, default_value = "1h")]
        window: String,
        /// At most this many seconds (1 to 100).
        #[arg(long, default_value_t = 10)]
        top: u32,
        /// Only the jobs of this namespace.
        #[arg(long)]
        namespace: Option<String>,
    },
}

impl Show for HotspotReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{} to {}: {} jobs, {} fires, at most {} in one second",
            instant(&self.from),
            instant(&self.to),
            self.jobs,
            self.fires,
            self.peak_per_second
        )?;
        if let Some(capped) = &self.capped {
            writeln!(out, "incomplete: {capped}")?;
        }
        if self.hotspots.is_empty() {
            return writeln!(out, "no second has more than one fire");
        }
        for h in &self.hotspots {
            writeln!(out, "\n{}  {} jobs", instant(&h.at), h.count)?;
            for j in &h.jobs {
                let job = format!("{}/{}", j.namespace, j.name);
                match &j.suggestion {
                    Some(s) => writeln!(out, "  {job:<40} {:<24} -> {s}", j.expression)?,
                    None => writeln!(out, "  {job:<40} {}", j.expression)?,
                }
            }
            let unlisted = (h.count as usize).saturating_sub(h.jobs.len());
            if unlisted > 0 {
                writeln!(out, "  ... and {unlisted} more")?;
            }
            writeln!(out, "  {}", h.advice)?;
        }
        Ok(())
    }
}

pub(super) async fn run(c: &Client, cmd: SchedulesCommand, out: &mut Output) -> Result<()> {
    match cmd {
        SchedulesCommand::Hotspots {
            window,
            top,
            namespace,
        } => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("window", &window);
            query.append_pair("top", &top.to_string());
            if let Some(ns) = &namespace {
                query.append_pair("namespace", ns);
            }
            let path = format!("/api/v1/schedules/hotspots?{}", query.finish());
            out.show(&c.get::<HotspotReport>(&path).await?)
        }
    }
}
