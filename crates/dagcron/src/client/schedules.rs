//! `dagcron schedules hotspots`: the seconds of the coming window at which
//! the most jobs fire together, and how to spread them with `H`.

use std::io::{self, Write};

use anyhow::Result;
use clap::Subcommand;
use dagcron_api::wire::{HotspotAnswer, HotspotReport};

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
        // Seconds with the same jobs (a job every minute beside another,
        // say) are one block: the first, and when the others come.
        let mut groups: Vec<Vec<&HotspotAnswer>> = Vec::new();
        for h in &self.hotspots {
            match groups.iter_mut().find(|g| same_jobs(g[0], h)) {
                Some(group) => group.push(h),
                None => groups.push(vec![h]),
            }
        }
        for group in groups {
            let h = group[0];
            write!(out, "\n{}  {} jobs", instant(&h.at), h.count)?;
            if group.len() > 1 {
                let more: Vec<String> = group[1..].iter().take(5).map(|o| instant(&o.at)).collect();
                let ellipsis = if group.len() > 6 { ", ..." } else { "" };
                write!(
                    out,
                    "; the same jobs at {} more second(s): {}{ellipsis}",
                    group.len() - 1,
                    more.join(", ")
                )?;
            }
            writeln!(out)?;
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

/// Whether two hot seconds have the same jobs, by the same expressions.
fn same_jobs(a: &HotspotAnswer, b: &HotspotAnswer) -> bool {
    a.count == b.count
        && a.jobs.len() == b.jobs.len()
        && a.jobs.iter().zip(&b.jobs).all(|(x, y)| {
            (&x.namespace, &x.name, &x.expression) == (&y.namespace, &y.name, &y.expression)
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use dagcron_api::wire::HotJobAnswer;

    fn second(at: &str, jobs: &[(&str, &str)]) -> HotspotAnswer {
        HotspotAnswer {
            at: at.parse().unwrap(),
            count: jobs.len() as u32,
            jobs: jobs
                .iter()
                .map(|(name, expression)| HotJobAnswer {
                    namespace: "n".into(),
                    name: (*name).into(),
                    expression: (*expression).into(),
                    suggestion: None,
                })
                .collect(),
            advice: "spread them".into(),
        }
    }

    /// The same two jobs every minute filled the report with one block
    /// ten times.
    #[test]
    fn seconds_with_the_same_jobs_are_one_block() {
        let pair = [("a", "0 * * * * *"), ("b", "*/10 * * * * *")];
        let mut hotspots: Vec<HotspotAnswer> = (0..8)
            .map(|m| second(&format!("2026-01-01T00:0{m}:00Z"), &pair))
            .collect();
        hotspots.push(second(
            "2026-01-01T00:00:30Z",
            &[("b", "*/10 * * * * *"), ("c", "30 * * * * *")],
        ));
        let report = HotspotReport {
            from: "2026-01-01T00:00:00Z".parse().unwrap(),
            to: "2026-01-01T01:00:00Z".parse().unwrap(),
            jobs: 3,
            fires: 500,
            peak_per_second: 2,
            hotspots,
            capped: None,
        };
        let mut text = Vec::new();
        report.text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert_eq!(text.matches("spread them").count(), 2, "{text}");
        assert!(
            text.contains("2026-01-01T00:00:00Z  2 jobs; the same jobs at 7 more second(s): 2026-01-01T00:01:00Z,"),
            "{text}"
        );
        assert!(text.contains(", ...\n"), "{text}");
        assert!(text.contains("2026-01-01T00:00:30Z  2 jobs\n"), "{text}");
    }
}
