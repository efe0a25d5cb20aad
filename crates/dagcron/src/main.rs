//! The `dagcron` binary: the server, and a command line for it. What
//! belongs to the process (logging, signals, the port, the child
//! subreaper) is set up here; the server itself is the library's
//! [`dagcron::serve`].

mod client;
mod cron_cmd;
mod dag_cmd;
mod worker;

use std::future::Future;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use dagcron::serve::{self, Exit};

/// mimalloc rather than the system's allocator: registering or reading
/// back a million jobs, and each fire, allocate and free many small values
/// (docs/benchmarks-history.md has the figures before and after).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// The variables that carry a secret of the server's or the agent's: read
/// by the command line, then forgotten before any thread starts.
const SECRET_VARIABLES: [&str; 3] = [
    "DAGCRON_AGENT_TOKEN",
    "DAGCRON_DATABASE_URL",
    "DAGCRON_TOKEN",
];

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_) | Command::Worker(_)) {
        dagcron_exec::environ::forget(&SECRET_VARIABLES);
        // No transparent huge pages for this process: mimalloc asks for
        // them over its whole heap, and each 2 MiB region touched then
        // becomes resident whole (an idle server held 35 MiB, most of it
        // such pages). Task processes inherit the flag, as they would the
        // system's setting.
        if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
            eprintln!("cannot turn transparent huge pages off ({e}); memory use may be higher");
        }
    }
    let result = match cli.command {
        Command::Cron(cmd) => cron_cmd::run(cmd),
        Command::Dag(cmd) => dag_cmd::run(cmd),
        Command::Serve(args) => runtime().and_then(|rt| rt.block_on(run_server(*args))),
        Command::Worker(args) => runtime().and_then(|rt| rt.block_on(worker::run(args))),
        Command::Client(cmd) => runtime().and_then(|rt| rt.block_on(client::run(cmd, cli.conn))),
    };
    match result {
        Ok(code) => code,
        // The reader of the output went away (`dagcron runs list | head`):
        // nothing is wrong, and there is no one left to tell.
        Err(err) if broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `err` comes from writing to a pipe whose reader has gone.
fn broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// `dagcron serve`: the configuration merged, logging installed, the
/// process made the subreaper of task processes, the signal handlers
/// installed and the port bound; then [`serve::run`] until a signal.
async fn run_server(args: serve::ServeArgs) -> anyhow::Result<ExitCode> {
    let config = args.config()?;
    init_logging(args.log_format);
    // Descendants of attempts whose parent died are adopted by this
    // process, which kills them with their attempt.
    if !dagcron_exec::tree::become_subreaper() {
        tracing::warn!("cannot become the child subreaper of task processes");
    }
    dagcron_exec::pass_env(config.pass_env().to_vec());
    // Shell tasks run in a sandbox that hides the server's files; if this
    // kernel cannot make it, they fail with the reason rather than run
    // without it.
    dagcron_exec::own_addresses(config.own_addresses());
    let hidden = config.server_files()?;
    match dagcron_exec::sandbox::enable(&hidden, dagcron_exec::sandbox::TaskUser::nobody()) {
        Ok(()) => tracing::info!(hidden = ?hidden, "shell tasks run in a sandbox"),
        Err(why) => tracing::error!("shell tasks cannot run on this server: {why}"),
    }
    let shutdown = shutdown_signal()?;
    let listen = config.listen();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    Ok(match serve::run(config, listener, shutdown).await? {
        Exit::Stopped => ExitCode::SUCCESS,
        Exit::Fenced => ExitCode::from(serve::EXIT_FENCED),
    })
}

/// Logs to standard error, at `info` unless `RUST_LOG` says otherwise, as
/// text or as one JSON object per line.
fn init_logging(format: serve::LogFormat) {
    let logs = tracing_subscriber::fmt().with_env_filter(
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
    );
    match format {
        serve::LogFormat::Text => logs.init(),
        serve::LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

/// Completes at the first SIGTERM or SIGINT; the handlers are installed
/// when this is called, not when the future is first polled.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}
