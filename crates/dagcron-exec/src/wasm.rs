//! WebAssembly tasks: the attempt's identity, parameters and secrets
//! turned into a module's invocation, run by `dagcron-wasm` in its sandbox
//! (with the `wasm` feature; without it, such a task fails and says why).

use std::time::Duration;

use dagcron_core::Failure;
use dagcron_core::model::WasmSpec;
use tokio_util::sync::CancellationToken;

use crate::{AttemptContext, Ending, Limits, LiveLog, Outcome};

fn failed(error: String, exit_code: Option<i32>, log: Vec<u8>) -> Outcome {
    let failure = match exit_code {
        Some(_) => Failure::Exit(exit_code),
        None => Failure::Error(error.clone()),
    };
    Outcome {
        outputs: Default::default(),
        ending: Ending::Failed(failure),
        exit_code,
        error: Some(error),
        log,
        lines: Vec::new(),
        start_error_us: None,
    }
}

#[cfg(not(feature = "wasm"))]
pub(crate) async fn run(
    _spec: &WasmSpec,
    _ctx: &AttemptContext,
    _timeout: Option<Duration>,
    _cancel: CancellationToken,
    _limits: Limits,
    _live: Option<&LiveLog>,
) -> Outcome {
    failed(
        "this build of dagcron cannot run WebAssembly tasks: build it with the `wasm` feature (the default)".into(),
        None,
        vec![],
    )
}

/// The module's environment: the identity (`DAGCRON_*`, as a shell task
/// gets it), the trace context, the task's variables, and the host's
/// variables that the task is granted.
#[cfg(feature = "wasm")]
fn environment(spec: &WasmSpec, ctx: &AttemptContext) -> Result<Vec<(String, String)>, String> {
    use dagcron_core::EnvValue;
    let mut env: Vec<(String, String)> = ctx
        .identity()
        .into_iter()
        .map(|(k, v)| (format!("DAGCRON_{k}"), v))
        .collect();
    for (name, value) in ctx.trace.iter().flat_map(|t| t.pairs()) {
        env.push((name.to_ascii_uppercase(), value.to_string()));
    }
    for name in &spec.grants.env {
        if let Ok(value) = std::env::var(name) {
            env.push((name.clone(), value));
        }
    }
    for (k, v) in &spec.env {
        let value = match v {
            EnvValue::Plain(text) => ctx.substitute(text),
            EnvValue::Secret { secret } => ctx.secrets.0.get(secret).cloned().ok_or_else(|| {
                format!("the secret {secret} of variable {k} was not given to this attempt")
            })?,
        };
        env.push((k.clone(), value));
    }
    Ok(env)
}

/// Refuses what the attempt's policy does not allow, on the real paths
/// (a symbolic link into a refused directory is refused): the module
/// outside `wasm_modules`, a directory grant outside `wasm_dirs` (or
/// `wasm_write_dirs`), a host variable not in `wasm_env`; and, whatever
/// the policy says, a module or directory that is one of the server's
/// hidden files or holds one, and a directory that holds the attempts'
/// outputs files or is inside it.
#[cfg(feature = "wasm")]
fn check_policy(spec: &WasmSpec, ctx: &AttemptContext) -> Result<(), String> {
    use std::path::Path;
    let real = |p: &str| {
        Path::new(p)
            .canonicalize()
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_else(|_| p.to_string())
    };
    let holds_hidden = |p: &str| {
        crate::sandbox::hidden()
            .iter()
            .any(|h| h.starts_with(p) || Path::new(p).starts_with(h))
    };
    let module = real(&spec.module);
    if crate::sandbox::is_hidden(Path::new(&module)) {
        return Err(format!(
            "{:?} is a file of the server's own, never a module",
            spec.module
        ));
    }
    for dir in &spec.grants.dirs {
        if holds_hidden(&real(&dir.host)) {
            return Err(format!(
                "the grant of {:?} would show the server's own files, which no task sees",
                dir.host
            ));
        }
    }
    if let Some(policy) = &ctx.policy {
        check_grants(spec, &module, policy, real)?;
    }
    // The attempts' outputs files, a module's own aside, are no task's.
    let outputs = crate::outputs::base()?;
    for dir in &spec.grants.dirs {
        let host = real(&dir.host);
        if outputs.starts_with(&host) || Path::new(&host).starts_with(outputs) {
            return Err(format!(
                "the grant of {:?} would show other attempts' outputs files",
                dir.host
            ));
        }
    }
    Ok(())
}

/// What the namespace's `policy` lets a module read and be granted.
#[cfg(feature = "wasm")]
fn check_grants(
    spec: &WasmSpec,
    module: &str,
    policy: &dagcron_core::exec_policy::ExecPolicy,
    real: impl Fn(&str) -> String,
) -> Result<(), String> {
    use dagcron_core::exec_policy::within;
    if !within(module, &policy.wasm_modules) {
        return Err(format!(
            "{:?} is outside the directories the namespace's policy lets modules be read from",
            spec.module
        ));
    }
    for dir in &spec.grants.dirs {
        let host = real(&dir.host);
        let may = within(&host, &policy.wasm_write_dirs)
            || (!dir.write && within(&host, &policy.wasm_dirs));
        if !may {
            return Err(format!(
                "the namespace's policy does not let a task mount {:?}{}",
                dir.host,
                if dir.write { " for writing" } else { "" }
            ));
        }
    }
    if let Some(name) = spec
        .grants
        .env
        .iter()
        .find(|n| !policy.wasm_env.contains(n))
    {
        return Err(format!(
            "the namespace's policy does not let a task read the host's variable {name}"
        ));
    }
    Ok(())
}

#[cfg(feature = "wasm")]
pub(crate) async fn run(
    spec: &WasmSpec,
    ctx: &AttemptContext,
    timeout: Option<Duration>,
    cancel: CancellationToken,
    limits: Limits,
    live: Option<&LiveLog>,
) -> Outcome {
    if let Err(error) = check_policy(spec, ctx) {
        return failed(error, None, vec![]);
    }
    let env = match environment(spec, ctx) {
        Ok(env) => env,
        Err(error) => return failed(error, None, vec![]),
    };
    let connect = match dagcron_wasm::resolve_hosts(&spec.grants.http).await {
        Ok(addrs) => addrs,
        Err(error) => return failed(error, None, vec![]),
    };
    // The hosts a component may connect to are destinations like an http
    // task's, checked after DNS against the namespace's policy.
    if let Some(policy) = &ctx.policy
        && let Some(why) = connect
            .iter()
            .find_map(|a| policy.destination(a.ip(), crate::http::own()).err())
    {
        return failed(format!("a host in grants.http: {why}"), None, vec![]);
    }
    // The module writes its outputs in a directory of the attempt's own,
    // granted after the task's.
    let outputs_file = match crate::outputs::OutputsFile::make(None) {
        Ok(f) => f,
        Err(error) => return failed(error, None, vec![]),
    };
    let mut env = env;
    env.push((
        crate::outputs::VAR.to_string(),
        format!("{}/outputs", dagcron_core::wasm::OUTPUTS_DIR),
    ));
    env.extend(ctx.output_vars().map(|(k, v)| (k, v.to_string())));
    env.extend(ctx.item_var().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut dirs = spec.grants.dirs.clone();
    dirs.push(dagcron_core::model::DirGrant {
        host: outputs_file.dir().to_string_lossy().into_owned(),
        guest: dagcron_core::wasm::OUTPUTS_DIR.to_string(),
        write: true,
    });
    let module = std::path::PathBuf::from(&spec.module);
    let program = module
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let inv = dagcron_wasm::Invocation {
        module,
        sha256: spec.sha256.clone(),
        program,
        args: spec.args.iter().map(|a| ctx.substitute(a)).collect(),
        env,
        stdin: spec
            .stdin
            .as_deref()
            .map(|s| ctx.substitute(s).into_bytes())
            .unwrap_or_default(),
        memory: spec.memory_limit(),
        fuel: spec.fuel,
        dirs,
        connect,
        timeout,
        max_output: limits.max_output,
    };
    let on_output: Option<dagcron_wasm::OnOutput> = live.cloned().map(|live| {
        let push: dagcron_wasm::OnOutput = std::sync::Arc::new(move |b: &[u8]| live.push(b));
        push
    });
    let report = dagcron_wasm::run(&inv, cancel, on_output).await;
    let read = outputs_file.read();
    drop(outputs_file);
    let (ending, exit_code, error, outputs) = match (report.ending, read) {
        (dagcron_wasm::Ending::Exited(0), Ok(outputs)) => {
            (Ending::Succeeded, Some(0), None, outputs)
        }
        (dagcron_wasm::Ending::Exited(0), Err(why)) => {
            return Outcome {
                exit_code: Some(0),
                ..failed(ctx.secrets.redact_str(&why), None, report.log)
            };
        }
        (dagcron_wasm::Ending::Exited(code), _) => {
            return failed(format!("exit status {code}"), Some(code), report.log);
        }
        (dagcron_wasm::Ending::TimedOut, _) => (
            Ending::TimedOut,
            None,
            Some(format!("timed out after {:?}", timeout.unwrap_or_default())),
            Default::default(),
        ),
        (dagcron_wasm::Ending::Cancelled, _) => (
            Ending::Cancelled,
            None,
            Some("cancelled".into()),
            Default::default(),
        ),
        (dagcron_wasm::Ending::Failed(error), _) => return failed(error, None, report.log),
    };
    Outcome {
        outputs: ctx.secrets.redact_outputs(outputs),
        ending,
        exit_code,
        error,
        log: report.log,
        lines: Vec::new(),
        start_error_us: None,
    }
}
