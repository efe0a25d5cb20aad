//! Shell tasks: a child process in its own process group, output captured
//! with a cap, the whole group killed on timeout or cancellation.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagcron_core::Failure;
use dagcron_core::model::ShellCommand;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::{AttemptContext, CappedLog, Ending, Limits, LiveLog, Outcome};

async fn pump(mut from: impl AsyncRead + Unpin, log: Arc<Mutex<CappedLog>>, live: Option<LiveLog>) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        log.lock().expect("log lock").push(&buf[..n]);
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
        c.arg("-c").arg(ctx.substitute(&cmd.command));
        c
    } else {
        let mut c = Command::new(ctx.substitute(&cmd.command));
        c.args(cmd.args.iter().map(|a| ctx.substitute(a)));
        c
    };
    for (k, v) in ctx.identity() {
        command.env(format!("DAGCRON_{k}"), v);
    }
    for (k, v) in &cmd.env {
        command.env(k, ctx.substitute(v));
    }
    if let Some(dir) = &cmd.cwd {
        command.current_dir(ctx.substitute(dir));
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let error = format!("could not start {:?}: {e}", cmd.command);
            return Outcome {
                ending: Ending::Failed(Failure::Error(error.clone())),
                exit_code: None,
                error: Some(error),
                log: vec![],
                start_error_us: None,
            };
        }
    };
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let log = Arc::new(Mutex::new(CappedLog::new(limits.max_output)));
    let out = tokio::spawn(pump(
        child.stdout.take().expect("piped"),
        log.clone(),
        live.cloned(),
    ));
    let err = tokio::spawn(pump(
        child.stderr.take().expect("piped"),
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
    // The group's other processes may hold the pipes open: end them too, then drain.
    kill_group();
    let _ = out.await;
    let _ = err.await;
    let log = Arc::try_unwrap(log)
        .map(|m| m.into_inner().expect("log lock").finish())
        .unwrap_or_default();
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
    Outcome {
        ending,
        exit_code,
        error,
        log,
        start_error_us: None,
    }
}
