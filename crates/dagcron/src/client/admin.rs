//! `dagcron admin ...`: the instance's read-only mode, the quotas, the
//! execution policy and the retention of a namespace, and pruning.

use std::io::{self, Write};

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use dagcron_api::wire::{
    Policy, PruneAnswer, PruneBody, Quotas, ReadOnlyAnswer, ReadOnlyBody, RetentionAnswer,
    RetentionBody,
};
use dagcron_core::Dur;

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
    /// The quotas of a namespace; with flags, changes those named (an
    /// instance admin), keeping the others.
    Quotas {
        /// Namespace.
        namespace: String,
        /// Jobs the namespace may hold.
        #[arg(long)]
        max_jobs: Option<u32>,
        /// Schedules one job may have.
        #[arg(long)]
        max_schedules_per_job: Option<u32>,
        /// Runs unfinished at once for a trigger to be accepted.
        #[arg(long)]
        max_active_runs: Option<u32>,
        /// Manual triggers and backfills per second, per server.
        #[arg(long)]
        max_triggers_per_second: Option<u32>,
        /// Remove every quota of the namespace first.
        #[arg(long)]
        clear: bool,
    },
    /// The execution policy of a namespace, or without one the instance's
    /// default: what jobs' code may do (executors, WebAssembly directories
    /// and variables, http destinations, the user of shell tasks, the
    /// share of the pool); with `--file`, replaces it (an instance admin).
    Policy {
        /// Namespace (none: the instance's default policy).
        namespace: Option<String>,
        /// A policy, whole, as YAML or JSON (`shell: agents`,
        /// `http_allow: [10.0.0.0/8]`, ...; a field left out takes its default).
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// A namespace back to the instance's default policy; the
        /// instance's default back to the built-in one.
        #[arg(long, conflicts_with = "file")]
        default: bool,
    },
    /// The retention of a namespace; with flags, changes what is named (an
    /// instance admin), keeping the other.
    Retention {
        /// Namespace.
        namespace: String,
        /// How long history is kept (`30d`, `12h`; at least `1h`).
        #[arg(long, value_parser = Dur::parse)]
        max_age: Option<Dur>,
        /// How many of each job's newest runs are kept, however old.
        #[arg(long)]
        keep_last: Option<u32>,
        /// Back to the instance's default.
        #[arg(long, conflicts_with_all = ["max_age", "keep_last"])]
        default: bool,
    },
    /// Prunes history by each namespace's retention now (an instance
    /// admin); `--dry-run` only says what would go.
    Prune {
        /// One namespace (none: every namespace).
        namespace: Option<String>,
        /// Count only; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

impl Show for RetentionAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let days = self.max_age_seconds as f64 / 86_400.0;
        writeln!(
            out,
            "keep {days} day(s) ({}s) and at least the last {} run(s) of each job{}",
            self.max_age_seconds,
            self.keep_last,
            if self.default {
                " (the instance's default)"
            } else {
                ""
            }
        )
    }
}

impl Show for PruneAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let verb = if self.dry_run { "would go" } else { "pruned" };
        if self.namespaces.is_empty() {
            return writeln!(out, "nothing {verb}");
        }
        for n in &self.namespaces {
            writeln!(
                out,
                "{}: {} run(s), {} attempt(s), {} ledger row(s), {} deleted job(s) {verb}",
                n.namespace, n.runs, n.attempts, n.fires, n.jobs
            )?;
        }
        Ok(())
    }
}

impl Show for Policy {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let shell = match self.shell {
            dagcron_api::wire::ShellPlace::Server => "on the server (sandboxed) and on agents",
            dagcron_api::wire::ShellPlace::Agents => "on agents only",
            dagcron_api::wire::ShellPlace::None => "not allowed",
        };
        writeln!(out, "shell            {shell}")?;
        writeln!(
            out,
            "http             {}",
            if self.http { "allowed" } else { "not allowed" }
        )?;
        writeln!(
            out,
            "wasm             {}",
            if self.wasm { "allowed" } else { "not allowed" }
        )?;
        writeln!(out, "wasm_modules     {}", list(&self.wasm_modules))?;
        writeln!(out, "wasm_dirs        {}", list(&self.wasm_dirs))?;
        writeln!(out, "wasm_write_dirs  {}", list(&self.wasm_write_dirs))?;
        writeln!(out, "wasm_env         {}", list(&self.wasm_env))?;
        writeln!(out, "http_allow       {}", list(&self.http_allow))?;
        writeln!(out, "nats_streams     {}", list(&self.nats_streams))?;
        writeln!(
            out,
            "run_as           {}",
            self.run_as.as_deref().unwrap_or("nobody (the default)")
        )?;
        writeln!(out, "weight           {}", self.weight)
    }
}

impl Show for Quotas {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let show = |v: Option<u32>| v.map_or_else(|| "no limit".to_string(), |v| v.to_string());
        writeln!(out, "max_jobs                 {}", show(self.max_jobs))?;
        writeln!(
            out,
            "max_schedules_per_job    {}",
            show(self.max_schedules_per_job)
        )?;
        writeln!(
            out,
            "max_active_runs          {}",
            show(self.max_active_runs)
        )?;
        writeln!(
            out,
            "max_triggers_per_second  {}",
            show(self.max_triggers_per_second)
        )
    }
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
        AdminCommand::Quotas {
            namespace,
            max_jobs,
            max_schedules_per_job,
            max_active_runs,
            max_triggers_per_second,
            clear,
        } => {
            let path = format!("/api/v1/namespaces/{namespace}/quotas");
            let current: Quotas = c.get(&path).await?;
            let asked = [
                max_jobs,
                max_schedules_per_job,
                max_active_runs,
                max_triggers_per_second,
            ];
            if !clear && asked.iter().all(Option::is_none) {
                return out.show(&current);
            }
            let base = if clear { Quotas::default() } else { current };
            let wanted = Quotas {
                max_jobs: max_jobs.or(base.max_jobs),
                max_schedules_per_job: max_schedules_per_job.or(base.max_schedules_per_job),
                max_active_runs: max_active_runs.or(base.max_active_runs),
                max_triggers_per_second: max_triggers_per_second.or(base.max_triggers_per_second),
            };
            out.show(&c.put::<Quotas>(&path, &wanted).await?)
        }
        AdminCommand::Policy {
            namespace,
            file,
            default,
        } => {
            let path = match &namespace {
                Some(ns) => format!("/api/v1/namespaces/{ns}/policy"),
                None => "/api/v1/admin/policy".to_string(),
            };
            let wanted: Policy = match (file, default) {
                (None, true) if namespace.is_some() => {
                    c.delete(&path).await?;
                    return out.show(&c.get::<Policy>(&path).await?);
                }
                (Some(file), _) => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("reading the policy file {}", file.display()))?;
                    serde_saphyr::from_str(&text)
                        .map_err(|e| anyhow::anyhow!("the policy file {}: {e}", file.display()))?
                }
                (None, true) => serde_json::from_str("{}").expect("the default policy"),
                (None, false) => return out.show(&c.get::<Policy>(&path).await?),
            };
            out.show(&c.put::<Policy>(&path, &wanted).await?)
        }
        AdminCommand::Retention {
            namespace,
            max_age,
            keep_last,
            default,
        } => {
            let path = format!("/api/v1/namespaces/{namespace}/retention");
            let current: RetentionAnswer = c.get(&path).await?;
            let wanted = if default {
                RetentionBody::default()
            } else if max_age.is_none() && keep_last.is_none() {
                return out.show(&current);
            } else {
                RetentionBody {
                    max_age_seconds: Some(
                        max_age.map_or(current.max_age_seconds, |d| d.0.as_secs()),
                    ),
                    keep_last: Some(keep_last.unwrap_or(current.keep_last)),
                }
            };
            out.show(&c.put::<RetentionAnswer>(&path, &wanted).await?)
        }
        AdminCommand::Prune { namespace, dry_run } => {
            let body = PruneBody { dry_run, namespace };
            out.show(&c.post::<PruneAnswer>("/api/v1/admin/prune", &body).await?)
        }
    }
}
