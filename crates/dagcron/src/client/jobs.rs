//! `dagcron apply`, `dagcron jobs ...` and `dagcron backfill`.

use std::io::{self, Write};
use std::path::Path;

use anyhow::Result;
use clap::Subcommand;
use dagcron_api::wire::{
    ApplyAnswer, BackfillAnswer, BulkPauseAnswer, JobAnswer, RunAnswer, TriggerBody, UpcomingAnswer,
};
use serde::Serialize;

use super::output::{Output, Show, or_dash};
use super::{Client, Empty, job_path, parse_kv};

#[derive(Subcommand)]
pub(crate) enum JobsCommand {
    /// The jobs of a namespace.
    List {
        /// Namespace.
        #[arg(default_value = "default")]
        namespace: String,
    },
    /// One job: its version, state and next fire, then its definition as YAML (`--json`: the API's answer).
    Show { job: String },
    /// Stop firing (fires due while paused follow the misfire policy on resume).
    Pause {
        /// NAMESPACE/JOB.
        #[arg(required_unless_present = "all")]
        job: Option<String>,
        /// Every job of this namespace instead.
        #[arg(long, value_name = "NAMESPACE", conflicts_with = "job")]
        all: Option<String>,
    },
    /// Fire again.
    Resume {
        /// NAMESPACE/JOB.
        #[arg(required_unless_present = "all")]
        job: Option<String>,
        /// Every job of this namespace instead.
        #[arg(long, value_name = "NAMESPACE", conflicts_with = "job")]
        all: Option<String>,
    },
    /// Start a run now, or plan one for an instant (`--at`).
    Trigger {
        job: String,
        /// Parameters, `key=value`, overriding the job's defaults.
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// Make the run at this instant (RFC 3339 with its offset, such as
        /// 2027-01-15T09:30:00Z) instead of now; it is `planned` until
        /// then and `dagcron runs cancel` cancels it.
        #[arg(long, value_parser = parse_instant)]
        at: Option<jiff::Timestamp>,
    },
    /// When a job runs next: its scheduled fires (suppressed ones marked)
    /// and its planned runs, soonest first.
    Upcoming {
        job: String,
        /// At most this many of each kind.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
        limit: u32,
    },
    /// Delete a job (its history stays).
    Delete { job: String },
    /// The versions of a job, newest first (`*`: the current one): when and
    /// by whom each was applied, rollbacks, the rules its fires were
    /// computed with.
    Versions { job: String },
    /// What changed between two versions of a job: a unified diff of their
    /// canonical YAML.
    Diff {
        job: String,
        /// The older version.
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        from: i64,
        /// The newer version.
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        to: i64,
    },
    /// Roll a job back to an older version: a new version equal to it.
    Rollback {
        job: String,
        /// The version to roll back to.
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        to: i64,
    },
}

impl Show for ApplyAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        for j in &self.jobs {
            writeln!(
                out,
                "{:<40} {} (version {})",
                j.job, j.result.result, j.result.version
            )?;
        }
        Ok(())
    }
}

/// Every job of a namespace, all pages.
#[derive(Serialize)]
#[serde(transparent)]
struct Jobs(Vec<JobAnswer>);

/// A job: what it is now, then its definition as the canonical YAML of
/// its job file (`--json`: the API's answer).
impl Show for JobAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let state = match (self.paused, &self.breaker) {
            (true, _) => "paused",
            (false, Some(_)) => "breaker open",
            (false, None) => "active",
        };
        writeln!(
            out,
            "{}/{}  version {}  {state}  updated {}",
            self.namespace,
            self.name,
            self.version,
            super::output::instant(&self.updated_at)
        )?;
        match &self.next_fire {
            Some(at) => writeln!(out, "next fire: {}", super::output::instant(at))?,
            None => writeln!(out, "next fire: none")?,
        }
        if let Some(changed) = &self.rules_changed {
            writeln!(out, "warning: {}", changed.message)?;
        }
        if let Some(breaker) = &self.breaker {
            writeln!(out, "breaker: {}", breaker.reason)?;
        }
        let yaml = super::versions::canonical_yaml(Some(&self.spec))
            .map_err(|e| io::Error::other(e.to_string()))?;
        write!(out, "---\n{yaml}")
    }
}

impl Show for Jobs {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:<30} {:>7} {:<7} {:<30} next fire",
            "job", "version", "paused", "schedule"
        )?;
        for j in &self.0 {
            let schedule = match j.spec.get("schedule") {
                None | Some(serde_json::Value::Null) => "-".to_string(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            writeln!(
                out,
                "{:<30} {:>7} {:<7} {:<30} {}",
                j.name,
                j.version,
                j.paused,
                schedule,
                or_dash(j.next_fire.as_ref())
            )?;
        }
        Ok(())
    }
}

impl Show for UpcomingAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{:<25} {:<9} note", "at", "kind")?;
        for f in &self.items {
            let note = match (&f.run_id, &f.suppressed_by) {
                (Some(id), _) => format!("run {id}"),
                (None, Some(calendar)) => format!("suppressed by {calendar}"),
                (None, None) => String::new(),
            };
            writeln!(out, "{:<25} {:<9} {note}", f.at.to_string(), f.kind)?;
        }
        Ok(())
    }
}

/// An instant as `--at` takes it.
fn parse_instant(s: &str) -> Result<jiff::Timestamp, String> {
    s.parse().map_err(|_| {
        format!("`{s}` is not an RFC 3339 instant with its offset, such as 2027-01-15T09:30:00Z")
    })
}

impl Show for BackfillAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "created {} run(s)", self.runs.len())
    }
}

/// `dagcron apply -f FILE`: the file is sent as it is, YAML or JSON.
pub(super) async fn apply(c: &Client, file: &Path, out: &mut Output) -> Result<()> {
    let (_, text) = crate::dag_cmd::read_file(file)?;
    let content_type = if crate::dag_cmd::is_json(file, &text) {
        "application/json"
    } else {
        "application/yaml"
    };
    let req = c
        .http
        .post(c.url("/api/v1/apply"))
        .header("content-type", content_type)
        .body(text);
    let answer: ApplyAnswer = c.send(req).await?.json().await?;
    out.show(&answer)
}

pub(super) async fn run(c: &Client, cmd: JobsCommand, out: &mut Output) -> Result<()> {
    match cmd {
        JobsCommand::List { namespace } => {
            let path = format!("/api/v1/namespaces/{namespace}/jobs");
            out.show(&Jobs(c.all_pages(&path).await?))
        }
        JobsCommand::Show { job } => out.show(&c.get::<JobAnswer>(&job_path(&job)?).await?),
        JobsCommand::Pause { all: Some(ns), .. } => bulk(c, &ns, "pause", "paused", out).await,
        JobsCommand::Resume { all: Some(ns), .. } => bulk(c, &ns, "resume", "resumed", out).await,
        JobsCommand::Pause { job, .. } => {
            let job = job.unwrap_or_default();
            let j: JobAnswer = c
                .post(&format!("{}/pause", job_path(&job)?), &Empty {})
                .await?;
            out.say(format_args!("{}/{} paused", j.namespace, j.name))
        }
        JobsCommand::Resume { job, .. } => {
            let job = job.unwrap_or_default();
            let j: JobAnswer = c
                .post(&format!("{}/resume", job_path(&job)?), &Empty {})
                .await?;
            out.say(format_args!(
                "{}/{} resumed; next fire {}",
                j.namespace,
                j.name,
                or_dash(j.next_fire.as_ref())
            ))
        }
        JobsCommand::Trigger { job, params, at } => {
            let body = TriggerBody {
                params: params.into_iter().collect(),
                at,
            };
            let run: RunAnswer = c
                .post(&format!("{}/trigger", job_path(&job)?), &body)
                .await?;
            out.show(&run)
        }
        JobsCommand::Upcoming { job, limit } => {
            let path = format!("{}/upcoming?limit={limit}", job_path(&job)?);
            out.show(&c.get::<UpcomingAnswer>(&path).await?)
        }
        JobsCommand::Delete { job } => {
            c.delete(&job_path(&job)?).await?;
            out.say(format_args!("deleted {job}"))
        }
        JobsCommand::Versions { job } => super::versions::list(c, &job, out).await,
        JobsCommand::Diff { job, from, to } => super::versions::diff(c, &job, from, to, out).await,
        JobsCommand::Rollback { job, to } => super::versions::rollback(c, &job, to, out).await,
    }
}

/// The range as given: the server reads the instants (and says what is
/// wrong with one that does not parse).
#[derive(Serialize)]
struct Range<'a> {
    from: &'a str,
    to: &'a str,
}

/// `dagcron backfill JOB --from --to`.
pub(super) async fn backfill(
    c: &Client,
    job: &str,
    from: &str,
    to: &str,
    out: &mut Output,
) -> Result<()> {
    let answer: BackfillAnswer = c
        .post(&format!("{}/backfill", job_path(job)?), &Range { from, to })
        .await?;
    out.show(&answer)
}

/// What `jobs pause|resume --all` changed.
#[derive(Serialize)]
struct Bulk<'a> {
    #[serde(flatten)]
    answer: BulkPauseAnswer,
    #[serde(skip)]
    ns: &'a str,
    #[serde(skip)]
    done: &'a str,
}

impl Show for Bulk<'_> {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{}: {} job(s) {}, {} already so",
            self.ns, self.answer.changed, self.done, self.answer.unchanged
        )
    }
}

/// `dagcron jobs pause|resume --all NAMESPACE`.
async fn bulk(c: &Client, ns: &str, verb: &str, done: &str, out: &mut Output) -> Result<()> {
    let answer: BulkPauseAnswer = c
        .post(&format!("/api/v1/namespaces/{ns}/{verb}"), &Empty {})
        .await?;
    out.show(&Bulk { answer, ns, done })
}
