//! Shell tasks: a child process in its own process group, output captured
//! with a cap. When the attempt is stopped on timeout or cancellation, or
//! exits while something still holds its output open, every process it
//! started is killed, descendants that left the group included (see
//! [`crate::tree`]); output is read for at most [`PIPE_GRACE`] after that.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagcron_core::Failure;
use dagcron_core::model::{EnvValue, ShellCommand};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::outputs::{self, OutputsFile};
use crate::sandbox;
use crate::tree::{self, MARK_VAR};
use dagcron_core::log::Stream;

use crate::{AttemptContext, CappedLog, Ending, Limits, LiveLog, Outcome};

/// How long output is still read once an attempt's processes were killed: a
/// process that escaped the kill (it cleared its environment and left the
/// process group) may hold the pipes open, and must not keep the attempt
/// running.
pub const PIPE_GRACE: Duration = Duration::from_secs(2);

/// Waits for the readers of the output pipes; each one that ends is taken
/// out, so that a wait cut short by a timeout can be taken up again.
async fn drain(pipes: &mut [Option<tokio::task::JoinHandle<()>>; 2]) {
    for pipe in pipes.iter_mut() {
        if let Some(reader) = pipe {
            let _ = reader.await;
            *pipe = None;
        }
    }
}

/// After a task's process exits, how long its pipes may stay open before
/// the processes it left behind are looked for and killed.
const LINGER: Duration = Duration::from_millis(100);

/// Removes a spawned child from [`tree::SPAWNED`] once it has been waited for.
struct Spawned(u32);

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(s) = tree::SPAWNED.lock().expect("spawned lock").as_mut() {
            s.remove(&self.0);
        }
    }
}

async fn pump(
    mut from: impl AsyncRead + Unpin,
    stream: Stream,
    log: Arc<Mutex<CappedLog>>,
    live: Option<LiveLog>,
) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        log.lock().expect("log lock").push_from(&buf[..n], stream);
        if let Some(live) = &live {
            live.push(&buf[..n]);
        }
    }
}

pub(crate) async fn run(
    cmd: &ShellCommand,
    ctx: &AttemptContext,
    timeout: Option<Duration>,
    cancel: CancellationToken,
    limits: Limits,
    live: Option<&LiveLog>,
) -> Outcome {
    let mut command = if cmd.args.is_empty() {
        let mut c = Command::new("/bin/sh");
        // Parameters are data, never shell code: each is one quoted word.
        match ctx.substitute_shell(&cmd.command) {
            Ok(script) => c.arg("-c").arg(script),
            Err(why) => return Outcome::not_started(ctx.secrets.redact_str(&why)),
        };
        c
    } else {
        let mut c = Command::new(ctx.substitute(&cmd.command));
        c.args(cmd.args.iter().map(|a| ctx.substitute(a)));
        c
    };
    // A clean environment: nothing of the server's (or the agent's) own
    // but the basics and what the operator passes through.
    command.env_clear();
    for (k, v) in crate::inherited_env() {
        command.env(k, v);
    }
    for (k, v) in ctx.identity() {
        command.env(format!("DAGCRON_{k}"), v);
    }
    for (name, value) in ctx.trace.iter().flat_map(|t| t.pairs()) {
        command.env(name.to_ascii_uppercase(), value);
    }
    for (k, v) in &cmd.env {
        let value = match v {
            EnvValue::Plain(text) => ctx.substitute(text),
            EnvValue::Secret { secret } => match ctx.secrets.0.get(secret) {
                Some(value) => value.clone(),
                None => {
                    return Outcome::not_started(format!(
                        "the secret {secret} of variable {k} was not given to this attempt"
                    ));
                }
            },
        };
        command.env(k, value);
    }
    let cwd = cmd.cwd.as_ref().map(|dir| ctx.substitute(dir));
    if let Some(dir) = &cwd {
        command.current_dir(dir);
    }
    let run_as = match ctx.policy.as_ref().and_then(|p| p.run_as.as_deref()) {
        Some(name) if sandbox::enabled() => match sandbox::TaskUser::lookup(name) {
            Ok(user) => Some(user),
            Err(e) => return Outcome::not_started(format!("the namespace's policy: {e}")),
        },
        _ => None,
    };
    let user = match sandbox::prepare(run_as) {
        None => None,
        Some(Ok(prepared)) => {
            let user = prepared.user();
            prepared.install(&mut command);
            user
        }
        Some(Err(why)) => return Outcome::not_started(why),
    };
    let outputs_file = match OutputsFile::make(user) {
        Ok(f) => f,
        Err(why) => return Outcome::not_started(why),
    };
    command.env(outputs::VAR, outputs_file.path());
    for (k, v) in ctx
        .output_vars()
        .chain(ctx.item_var().map(|(k, v)| (k.to_string(), v)))
    {
        command.env(k, v);
    }
    let mark = tree::new_mark();
    command
        .env(MARK_VAR, &mark)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let spawned = {
        let mut listed = tree::SPAWNED.lock().expect("spawned lock");
        command.spawn().map(|child| {
            let id = child.id().unwrap_or(0);
            listed.get_or_insert_with(Default::default).insert(id);
            (child, Spawned(id))
        })
    };
    let (mut child, _listed) = match spawned {
        Ok(c) => c,
        Err(e) if sandbox::enabled() && !matches!(e.kind(), std::io::ErrorKind::NotFound) => {
            sandbox::refused();
            return Outcome::not_started(format!(
                "the task's sandbox could not be made ({e}); the task was not run"
            ));
        }
        Err(e) => {
            let error = match &cwd {
                Some(dir) if !std::path::Path::new(dir).is_dir() => format!(
                    "could not start {:?}: its working directory {dir:?} does not exist or is not a directory",
                    cmd.command
                ),
                _ => format!("could not start {:?}: {e}", cmd.command),
            };
            return Outcome::not_started(error);
        }
    };
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let log = Arc::new(Mutex::new(CappedLog::new(limits.max_output)));
    let out = tokio::spawn(pump(
        child.stdout.take().expect("piped"),
        Stream::Stdout,
        log.clone(),
        live.cloned(),
    ));
    let err = tokio::spawn(pump(
        child.stderr.take().expect("piped"),
        Stream::Stderr,
        log.clone(),
        live.cloned(),
    ));
    let sleep = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let kill_group = || {
        if let Some(pgid) = pgid {
            // The group may already be gone; nothing to do then.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    };
    let (ending, status) = tokio::select! {
        status = child.wait() => (None, status.ok()),
        () = sleep => { kill_group(); (Some(Ending::TimedOut), child.wait().await.ok()) }
        () = cancel.cancelled() => { kill_group(); (Some(Ending::Cancelled), child.wait().await.ok()) }
    };
    // The attempt's other processes, in its group or not, may hold the pipes
    // open: end them all, then read what is left for a bounded time. After
    // a timeout or a cancel every marked process is hunted down; after a
    // plain exit only when something still holds the pipes (the `/proc`
    // scan is not free, and most tasks leave nothing behind).
    kill_group();
    let stopped = ending.is_some();
    let mut pipes = [Some(out), Some(err)];
    if !stopped {
        let _ = tokio::time::timeout(LINGER, drain(&mut pipes)).await;
    }
    if stopped || pipes.iter().any(Option::is_some) {
        let _ = tokio::task::spawn_blocking(move || tree::kill_marked(&mark)).await;
    }
    if tokio::time::timeout(PIPE_GRACE, drain(&mut pipes))
        .await
        .is_err()
    {
        for pipe in pipes.iter().flatten() {
            pipe.abort();
        }
    }
    tree::sweep_adopted();
    // Aborted readers may still hold the buffer for a moment: take its contents.
    let mut log = std::mem::replace(&mut *log.lock().expect("log lock"), CappedLog::new(0));
    let lines = log.take_marks();
    let log = log.finish();
    let exit_code = status.and_then(|s| s.code());
    let (ending, error) = match ending {
        Some(Ending::TimedOut) => (
            Ending::TimedOut,
            Some(format!(
                "timed out after {}",
                timeout.map(|d| format!("{d:?}")).unwrap_or_default()
            )),
        ),
        Some(e) => (e, Some("cancelled".to_string())),
        None => match status {
            Some(s) if s.success() => (Ending::Succeeded, None),
            Some(s) => {
                use std::os::unix::process::ExitStatusExt;
                let error = match (s.code(), s.signal()) {
                    (Some(c), _) => format!("exit status {c}"),
                    (None, Some(sig)) => format!("killed by signal {sig}"),
                    _ => "failed".to_string(),
                };
                (Ending::Failed(Failure::Exit(s.code())), Some(error))
            }
            None => (
                Ending::Failed(Failure::Error("lost track of the process".into())),
                Some("lost track of the process".into()),
            ),
        },
    };
    // What the task wrote counts only if it ended well (a failed attempt
    // hands nothing downstream); a success whose outputs are refused
    // fails, saying why.
    let (ending, error, outputs) = match (ending, outputs_file.read()) {
        (Ending::Succeeded, Ok(o)) => (Ending::Succeeded, error, o),
        (Ending::Succeeded, Err(why)) => {
            let why = ctx.secrets.redact_str(&why);
            (
                Ending::Failed(Failure::Error(why.clone())),
                Some(why),
                Default::default(),
            )
        }
        (ending, _) => (ending, error, Default::default()),
    };
    drop(outputs_file);
    Outcome {
        ending,
        exit_code,
        error,
        log,
        lines,
        outputs: ctx.secrets.redact_outputs(outputs),
        start_error_us: None,
    }
}
