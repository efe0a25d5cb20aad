//! The `dagcron` binary: the server, and a command line for it.

mod client;
mod cron_cmd;
mod dag_cmd;
mod serve;
mod tls;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// dagcron: a distributed job scheduler with cron schedules and DAG jobs.
#[derive(Parser)]
#[command(name = "dagcron", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    conn: client::Conn,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: scheduler, workers and API on one port.
    Serve(Box<serve::ServeArgs>),
    /// Work with cron expressions: preview fires, explain, check.
    #[command(subcommand)]
    Cron(cron_cmd::CronCommand),
    /// Run a remote worker agent: it runs the tasks with `run_on` that match its labels.
    Worker(worker::WorkerArgs),
    /// Check a job file or show the order its tasks run in (offline).
    #[command(subcommand)]
    Dag(dag_cmd::DagCommand),
    /// Apply, inspect and operate jobs and runs on a server.
    #[command(flatten)]
    Client(client::ClientCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Cron(cmd) => cron_cmd::run(cmd),
        Command::Dag(cmd) => dag_cmd::run(cmd),
        Command::Serve(args) => runtime().and_then(|rt| rt.block_on(serve::run(*args))),
        Command::Worker(args) => runtime().and_then(|rt| rt.block_on(worker::run(args))),
        Command::Client(cmd) => runtime().and_then(|rt| rt.block_on(client::run(cmd, cli.conn))),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
