//! `dagcron jobs versions`, `dagcron jobs diff` and `dagcron jobs rollback`:
//! a job's versions, what changed between two of them (a unified diff of
//! their canonical YAML), and a rollback to one.

use std::io::{self, Write};

use anyhow::{Context, Result};
use dagcron_api::wire::{RollbackAnswer, VersionAnswer};
use dagcron_core::yaml::unified_diff as unified;
use serde::Serialize;

use super::output::{Output, Show, instant};
use super::{Client, Empty, job_path};

/// Every version of a job, all pages, newest first.
#[derive(Serialize)]
#[serde(transparent)]
struct Versions(Vec<VersionAnswer>);

impl Show for Versions {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:>8}  {:<27} {:<40} {:<16} rules",
            "version", "applied", "by", "note"
        )?;
        for v in &self.0 {
            let mark = if v.current { "*" } else { " " };
            let by = v.applied_by.as_ref().map_or_else(
                || "-".to_string(),
                |a| format!("{} ({})", a.name, a.token_id),
            );
            let note = v
                .rollback_of
                .map_or_else(String::new, |r| format!("rollback of {r}"));
            let rules = v.rules.as_ref().map_or_else(
                || "-".to_string(),
                |r| format!("cron {}, tzdb {}", r.cron_semantics, r.tzdb),
            );
            writeln!(
                out,
                "{:>7}{mark}  {:<27} {:<40} {:<16} {rules}",
                v.version,
                instant(&v.applied_at),
                by,
                note
            )?;
        }
        Ok(())
    }
}

impl Show for RollbackAnswer {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        match self.result.as_str() {
            "unchanged" => writeln!(
                out,
                "{} is already equal to version {} (it stays at version {})",
                self.job, self.rolled_back_to, self.version
            ),
            _ => writeln!(
                out,
                "{} rolled back to version {}: now at version {}",
                self.job, self.rolled_back_to, self.version
            ),
        }
    }
}

/// What `jobs diff` prints: the unified diff (empty: the same).
#[derive(Serialize)]
struct Diff {
    job: String,
    from: i64,
    to: i64,
    diff: String,
}

impl Show for Diff {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.diff.is_empty() {
            writeln!(
                out,
                "versions {} and {} of {} are the same",
                self.from, self.to, self.job
            )
        } else {
            out.write_all(self.diff.as_bytes())
        }
    }
}

/// `dagcron jobs versions JOB`.
pub(super) async fn list(c: &Client, job: &str, out: &mut Output) -> Result<()> {
    let path = format!("{}/versions", job_path(job)?);
    out.show(&Versions(c.all_pages(&path).await?))
}

/// `dagcron jobs diff JOB A B`.
pub(super) async fn diff(
    c: &Client,
    job: &str,
    from: i64,
    to: i64,
    out: &mut Output,
) -> Result<()> {
    let base = format!("{}/versions", job_path(job)?);
    let a: VersionAnswer = c.get(&format!("{base}/{from}")).await?;
    let b: VersionAnswer = c.get(&format!("{base}/{to}")).await?;
    let name = format!("{}/{}", a.namespace, a.name);
    let diff = unified(
        &format!("{name} version {from}"),
        &canonical_yaml(a.spec.as_ref())?,
        &format!("{name} version {to}"),
        &canonical_yaml(b.spec.as_ref())?,
    );
    out.show(&Diff {
        job: name,
        from,
        to,
        diff,
    })
}

/// `dagcron jobs rollback JOB --to V`.
pub(super) async fn rollback(c: &Client, job: &str, to: i64, out: &mut Output) -> Result<()> {
    let answer: RollbackAnswer = c
        .post(
            &format!("{}/versions/{to}/rollback", job_path(job)?),
            &Empty {},
        )
        .await?;
    out.show(&answer)
}

/// A version's spec as YAML, in its canonical form
/// ([`dagcron_core::yaml::canonical_yaml`]).
pub(super) fn canonical_yaml(spec: Option<&serde_json::Value>) -> Result<String> {
    let spec = spec.context("the server answered a version without its spec")?;
    dagcron_core::yaml::canonical_yaml(spec).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_shows_the_changed_lines_with_their_context() {
        let a = "name: j\nschedule: 0 * * * *\ntimezone: UTC\ntasks:\n- id: a\n";
        let b = "name: j\nschedule: 30 * * * *\ntimezone: UTC\ntasks:\n- id: a\n";
        expect_test::expect![[r#"
            --- n/j version 1
            +++ n/j version 2
            @@ -1,5 +1,5 @@
             name: j
            -schedule: 0 * * * *
            +schedule: 30 * * * *
             timezone: UTC
             tasks:
             - id: a
        "#]]
        .assert_eq(&unified("n/j version 1", a, "n/j version 2", b));
        assert_eq!(unified("x", a, "y", a), "");
    }

    #[test]
    fn the_canonical_yaml_keeps_the_job_files_order() {
        let spec = serde_json::json!({
            "tasks": [{ "id": "t", "shell": "echo hi" }],
            "name": "j",
            "schedule": "0 * * * *",
            "params": { "x": "null" }
        });
        let parsed: dagcron_core::JobSpec = serde_json::from_value(spec.clone()).unwrap();
        let yaml = canonical_yaml(Some(&serde_json::to_value(parsed).unwrap())).unwrap();
        let name = yaml.find("name: j").unwrap();
        let tasks = yaml.find("tasks:").unwrap();
        assert!(name < tasks, "{yaml}");
        assert!(
            !yaml.contains("deadline"),
            "unset fields are left out: {yaml}"
        );
        assert!(
            yaml.lines()
                .any(|l| l.trim() == "x: 'null'" || l.trim() == "x: \"null\""),
            "a string null stays: {yaml}"
        );
        assert!(canonical_yaml(None).is_err());
    }
}
