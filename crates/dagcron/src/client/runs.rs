//! `dagcron runs ...` and `dagcron logs`.

use std::collections::BTreeMap;
use std::io::{self, Write};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use dagcron_api::wire::{HeldPage, RerunBody, RunAnswer, RunPage, TaskAnswer};

use super::output::{Output, Show, instant, or_dash};
use super::{Client, Empty, job_path};

#[derive(Subcommand)]
pub(crate) enum RunsCommand {
    /// Runs of a job, newest first.
    List {
        job: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// One run with its tasks and attempts.
    Show { run: i64 },
    /// Cancel a run.
    Cancel { run: i64 },
    /// Run a finished run again: the same job version and parameters. Every
    /// task runs again, or with --failed only those that failed (or did
    /// not run because of them) and what depends on them; the others keep
    /// their outcome.
    Rerun {
        run: i64,
        /// Only the failed tasks and what is downstream of them.
        #[arg(long)]
        failed: bool,
    },
    /// Tasks of a namespace held after their last retry failed
    /// (on_exhausted: hold), waiting for an operator.
    Held { namespace: String },
    /// Give a held task a new attempt now (past its max_attempts).
    Retry { run: i64, task: String },
    /// Mark a held, failed or upstream_failed task of a run that goes on
    /// as succeeded or skipped: what did not run because of it is decided
    /// again.
    Mark {
        run: i64,
        task: String,
        #[arg(value_enum)]
        outcome: Marked,
    },
    /// Fail a held task: its run goes on without it, by the trigger rules.
    Fail { run: i64, task: String },
}

/// What `runs mark` marks a task as.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum Marked {
    Succeeded,
    Skipped,
}

impl Show for HeldPage {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:<18} {:<20} {:<20} {:<8} {:<22} error",
            "run", "job", "task", "attempts", "held since"
        )?;
        for h in &self.items {
            writeln!(
                out,
                "{:<18} {:<20} {:<20} {:<8} {:<22} {}",
                h.run,
                h.job,
                h.task,
                h.attempts,
                or_dash(h.held_since.as_ref()),
                h.error.as_deref().unwrap_or("")
            )?;
        }
        Ok(())
    }
}

impl Show for RunAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        write!(
            out,
            "run {}  {}/{}  {}  trigger={}  scheduled={}  version={}",
            self.id,
            self.namespace,
            self.job,
            self.state,
            self.trigger,
            self.scheduled_at,
            self.job_version
        )?;
        match self.rerun_of {
            Some(of) => writeln!(out, "  rerun of {of}")?,
            None => writeln!(out)?,
        }
        // A mapped task's instances are shown under it: counted by state,
        // the ones that did not succeed listed (`-o json` has them all).
        let tasks = &self.tasks;
        fn instances_of<'a>(
            tasks: &'a [TaskAnswer],
            id: &'a str,
        ) -> impl Iterator<Item = &'a TaskAnswer> {
            tasks.iter().filter(move |t| {
                t.item.is_some()
                    && dagcron_core::fan_out::parse_instance(&t.id).is_some_and(|(p, _)| p == id)
            })
        }
        for t in self.tasks.iter().filter(|t| t.item.is_none()) {
            task_text(out, t, 2)?;
            if let Some(note) = &t.note {
                writeln!(out, "    {note}")?;
            }
            for (k, v) in &t.outputs {
                writeln!(out, "    output {k} = {}", v.escape_debug())?;
            }
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for i in instances_of(tasks, &t.id) {
                *counts.entry(&i.state).or_default() += 1;
            }
            if counts.is_empty() {
                continue;
            }
            let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
            writeln!(out, "    instances: {}", counts.join(", "))?;
            let unwell = instances_of(tasks, &t.id).filter(|i| i.state != "succeeded");
            for (k, i) in unwell.enumerate() {
                if k == 20 {
                    writeln!(out, "    ... (-o json lists every instance)")?;
                    break;
                }
                task_text(out, i, 4)?;
            }
        }
        Ok(())
    }
}

/// One task of a run, with its attempts, indented by `indent`.
fn task_text(out: &mut dyn Write, t: &TaskAnswer, indent: usize) -> io::Result<()> {
    let pad = " ".repeat(indent);
    let carried = if t.carried {
        "  (carried over from the run re-run)"
    } else {
        ""
    };
    let item = match &t.item {
        Some(item) => format!("  item {}", item.escape_debug()),
        None => String::new(),
    };
    writeln!(out, "{pad}{:<20} {}{carried}{item}", t.id, t.state)?;
    for a in &t.attempts {
        writeln!(
            out,
            "{pad}  attempt {} {:<10} exit={} {} {}",
            a.number,
            a.state,
            or_dash(a.exit_code.as_ref()),
            a.started_at,
            a.error.as_deref().unwrap_or("")
        )?;
        for (k, v) in &a.outputs {
            // One line each: a value's own lines stay visible as \n.
            writeln!(out, "{pad}    output {k} = {}", v.escape_debug())?;
        }
    }
    Ok(())
}

impl Show for RunPage {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:<18} {:<10} {:<9} {:<22} finished",
            "run", "state", "trigger", "scheduled"
        )?;
        for r in &self.items {
            writeln!(
                out,
                "{:<18} {:<10} {:<9} {:<22} {}",
                r.id,
                r.state,
                r.trigger,
                instant(&r.scheduled_at),
                or_dash(r.finished_at.as_ref())
            )?;
        }
        Ok(())
    }
}

pub(super) async fn run(c: &Client, cmd: RunsCommand, out: &mut Output) -> Result<()> {
    match cmd {
        RunsCommand::List { job, limit } => {
            let page: RunPage = c
                .get(&format!("{}/runs?limit={limit}", job_path(&job)?))
                .await?;
            out.show(&page)
        }
        RunsCommand::Show { run } => {
            let r: RunAnswer = c.get(&format!("/api/v1/runs/{run}")).await?;
            out.show(&r)
        }
        RunsCommand::Cancel { run } => {
            let r: RunAnswer = c
                .post(&format!("/api/v1/runs/{run}/cancel"), &Empty {})
                .await?;
            out.say(format_args!("run {} cancelling: {}", r.id, r.state))
        }
        RunsCommand::Rerun { run, failed } => {
            let body = RerunBody {
                failed_only: failed,
            };
            let r: RunAnswer = c.post(&format!("/api/v1/runs/{run}/rerun"), &body).await?;
            out.show(&r)
        }
        RunsCommand::Held { namespace } => {
            let page: HeldPage = c
                .get(&format!("/api/v1/namespaces/{namespace}/held"))
                .await?;
            out.show(&page)
        }
        RunsCommand::Retry { run, task } => intervene(c, run, &task, "retry", out).await,
        RunsCommand::Mark { run, task, outcome } => {
            let action = match outcome {
                Marked::Succeeded => "mark_succeeded",
                Marked::Skipped => "mark_skipped",
            };
            intervene(c, run, &task, action, out).await
        }
        RunsCommand::Fail { run, task } => intervene(c, run, &task, "fail", out).await,
    }
}

/// Does `action` to `task` of `run`; shows the run.
async fn intervene(c: &Client, run: i64, task: &str, action: &str, out: &mut Output) -> Result<()> {
    let r: RunAnswer = c
        .post(
            &format!("/api/v1/runs/{run}/tasks/{}/{action}", segment(task)),
            &Empty {},
        )
        .await?;
    out.show(&r)
}

/// `dagcron logs RUN TASK [--attempt N] [-f]`: the output of an attempt
/// (the latest by default): what there is now, or with `-f` streamed as it
/// comes until the attempt ends.
pub(super) async fn logs(
    c: &Client,
    run: i64,
    task: &str,
    attempt: Option<u32>,
    follow: bool,
    out: &mut Output,
) -> Result<()> {
    let n = match attempt {
        Some(n) => n,
        None => {
            let r: RunAnswer = c.get(&format!("/api/v1/runs/{run}")).await?;
            let t = r
                .tasks
                .iter()
                .find(|t| t.id == task)
                .with_context(|| format!("run {run} has no task {task}"))?;
            if let (true, Some(of)) = (t.carried, r.rerun_of) {
                bail!(
                    "task {task} of run {run} did not run: its outcome was carried over from run {of}, whose log it is (dagcron logs {of} {task})"
                );
            }
            t.attempts.len() as u32
        }
    };
    if n == 0 {
        bail!("task {task} of run {run} has no attempt yet");
    }
    let mut resp = c
        .send(c.http.get(c.url(&format!(
            "/api/v1/runs/{run}/tasks/{}/attempts/{n}/log{}",
            segment(task),
            if follow { "?follow=true" } else { "" }
        ))))
        .await?;
    let partial = resp
        .headers()
        .get("x-dagcron-log")
        .is_some_and(|v| v == "partial");
    while let Some(chunk) = resp.chunk().await? {
        out.raw(&chunk)?;
    }
    if partial {
        // On standard error: the output itself stays as the task wrote it.
        eprintln!(
            "(attempt {n} of task {task} is still running: this is its output so far; `dagcron logs {run} {task} -f` follows it)"
        );
    }
    Ok(())
}

/// A task id as one segment of a path: an instance's brackets
/// (`load[3]`) percent-encoded.
fn segment(task: &str) -> String {
    task.replace('[', "%5B").replace(']', "%5D")
}
