//! The `dagcron` binary: command-line interface over the dagcron crates.

mod cron_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// dagcron: a distributed job scheduler with cron schedules and DAG jobs.
#[derive(Parser)]
#[command(name = "dagcron", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with cron expressions: preview fires, explain, check.
    #[command(subcommand)]
    Cron(cron_cmd::CronCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Cron(cmd) => cron_cmd::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
