//! `dagcron dag validate|plan FILE`: offline checks of a job file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use dagcron_core::JobFile;

#[derive(Subcommand)]
pub(crate) enum DagCommand {
    /// Check a job file: schedules, DAG, policies. Exit 2 with every problem if invalid.
    Validate {
        /// The job file (YAML or JSON).
        file: PathBuf,
    },
    /// Show the order in which each job's tasks would run (waves of tasks that may run together).
    Plan {
        /// The job file (YAML or JSON).
        file: PathBuf,
    },
}

/// Reads a job file, YAML or JSON (by extension; `-`: standard input,
/// JSON if it starts with `{`).
pub(crate) fn read_file(path: &Path) -> Result<(JobFile, String)> {
    let text = read_text(path)?;
    let file = parse_file(path, &text).map_err(anyhow::Error::msg)?;
    Ok((file, text))
}

/// The text of the file at `path`, or of standard input for `-`.
fn read_text(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the job file from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Whether the job file at `path` (with this `text`) is JSON.
pub(crate) fn is_json(path: &Path, text: &str) -> bool {
    if path == Path::new("-") {
        text.trim_start().starts_with('{')
    } else {
        path.extension().is_some_and(|e| e == "json")
    }
}

/// The job file `text` read from `path`, or what is wrong with it (where,
/// and what was likely meant).
fn parse_file(path: &Path, text: &str) -> Result<JobFile, String> {
    let name = if path == Path::new("-") {
        "standard input".to_string()
    } else {
        path.display().to_string()
    };
    let problem = if is_json(path, text) {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        dagcron_core::yaml::from_str_all(text, &name).map_err(|all| all.join("\n"))
    };
    problem.map_err(|why| format!("{name} is not a valid job file: {why}"))
}

pub(crate) fn run(cmd: DagCommand) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let (DagCommand::Validate { file } | DagCommand::Plan { file }) = &cmd;
    let text = read_text(file)?;
    // A file that cannot be read as a job file is invalid, as one whose
    // jobs are: both exit 2.
    let parsed = match parse_file(file, &text) {
        Ok(parsed) => parsed,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(ExitCode::from(2));
        }
    };
    let jobs = match parsed.validate() {
        Ok(jobs) => jobs,
        Err(errors) => {
            eprintln!("{}: {} problem(s)", file.display(), errors.0.len());
            for e in &errors.0 {
                eprintln!("  {}: {}", e.path, e.message);
            }
            return Ok(ExitCode::from(2));
        }
    };
    match cmd {
        DagCommand::Validate { .. } => {
            writeln!(
                out,
                "{}: valid ({} job(s) in namespace {})",
                file.display(),
                jobs.len(),
                parsed.namespace
            )?;
        }
        DagCommand::Plan { .. } => {
            for job in &jobs {
                writeln!(out, "{}", job.key())?;
                for (i, wave) in job.dag.waves().iter().enumerate() {
                    let names: Vec<String> = wave
                        .iter()
                        .map(|&t| {
                            let task = &job.tasks[t];
                            let deps: Vec<&str> = job.dag.upstream[t]
                                .iter()
                                .map(|&u| job.tasks[u].id.as_str())
                                .collect();
                            if deps.is_empty() {
                                task.id.clone()
                            } else {
                                format!("{} (after {})", task.id, deps.join(", "))
                            }
                        })
                        .collect();
                    writeln!(out, "  {}. {}", i + 1, names.join(", "))?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
