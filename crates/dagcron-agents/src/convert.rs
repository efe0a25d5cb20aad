//! Between the domain's executors and outcomes and the protocol's messages.

use std::collections::HashMap;

use dagcron_core::model::{ByteSize, DirGrant, EnvValue, Grants, HttpSpec, ShellCommand, WasmSpec};
use dagcron_core::{Executor, Failure};
use dagcron_exec::{Ending, Outcome};
use dagcron_proto::v1;

/// A task's environment for the wire: a secret goes as its placeholder;
/// its value goes with the assignment's secrets, and the agent puts it in.
fn env_to_proto(env: &std::collections::BTreeMap<String, EnvValue>) -> HashMap<String, String> {
    env.iter()
        .map(|(k, v)| {
            let text = match v {
                EnvValue::Plain(t) => t.clone(),
                EnvValue::Secret { secret } => format!("{{{{secrets.{secret}}}}}"),
            };
            (k.clone(), text)
        })
        .collect()
}

fn env_from_proto(env: &HashMap<String, String>) -> std::collections::BTreeMap<String, EnvValue> {
    env.iter()
        .map(|(k, v)| (k.clone(), EnvValue::Plain(v.clone())))
        .collect()
}

fn wasm_to_proto(w: &WasmSpec) -> v1::Wasm {
    v1::Wasm {
        module: w.module.clone(),
        sha256: w.sha256.clone().unwrap_or_default(),
        args: w.args.clone(),
        env: env_to_proto(&w.env),
        stdin: w.stdin.clone(),
        memory: w.memory.map_or(0, |m| m.0),
        fuel: w.fuel,
        grant_dirs: w
            .grants
            .dirs
            .iter()
            .map(|d| v1::DirGrant {
                host: d.host.clone(),
                guest: d.guest.clone(),
                write: d.write,
            })
            .collect(),
        grant_env: w.grants.env.clone(),
        grant_http: w.grants.http.clone(),
    }
}

fn wasm_from_proto(w: &v1::Wasm) -> WasmSpec {
    WasmSpec {
        module: w.module.clone(),
        sha256: (!w.sha256.is_empty()).then(|| w.sha256.clone()),
        args: w.args.clone(),
        env: env_from_proto(&w.env),
        stdin: w.stdin.clone(),
        memory: (w.memory > 0).then_some(ByteSize(w.memory)),
        fuel: w.fuel,
        grants: Grants {
            dirs: w
                .grant_dirs
                .iter()
                .map(|d| DirGrant {
                    host: d.host.clone(),
                    guest: d.guest.clone(),
                    write: d.write,
                })
                .collect(),
            env: w.grant_env.clone(),
            http: w.grant_http.clone(),
        },
    }
}

pub(crate) fn executor_to_proto(e: &Executor) -> v1::Executor {
    let kind = match e {
        Executor::Shell(s) => v1::executor::Kind::Shell(v1::Shell {
            command: s.command.clone(),
            args: s.args.clone(),
            env: env_to_proto(&s.env),
            cwd: s.cwd.clone().unwrap_or_default(),
        }),
        Executor::Wasm(w) => v1::executor::Kind::Wasm(wasm_to_proto(w)),
        Executor::Http(h) => v1::executor::Kind::Http(v1::Http {
            method: h.method.clone(),
            url: h.url.clone(),
            headers: h
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            body: h.body.clone(),
            expect: h.expect.iter().map(|s| u32::from(*s)).collect(),
            outputs: h
                .outputs
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }),
        Executor::Noop => v1::executor::Kind::Noop(v1::Noop {}),
    };
    v1::Executor { kind: Some(kind) }
}

pub(crate) fn executor_from_proto(e: &v1::Executor) -> Result<Executor, String> {
    let sorted = |m: &HashMap<String, String>| -> std::collections::BTreeMap<String, String> {
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    match &e.kind {
        Some(v1::executor::Kind::Shell(s)) => Ok(Executor::Shell(ShellCommand {
            command: s.command.clone(),
            args: s.args.clone(),
            env: env_from_proto(&s.env),
            cwd: (!s.cwd.is_empty()).then(|| s.cwd.clone()),
        })),
        Some(v1::executor::Kind::Wasm(w)) => Ok(Executor::Wasm(wasm_from_proto(w))),
        Some(v1::executor::Kind::Http(h)) => Ok(Executor::Http(HttpSpec {
            outputs: sorted(&h.outputs),
            method: h.method.clone(),
            url: h.url.clone(),
            headers: sorted(&h.headers),
            body: h.body.clone(),
            expect: h
                .expect
                .iter()
                .map(|s| u16::try_from(*s).map_err(|_| format!("{s} is not an HTTP status")))
                .collect::<Result<_, _>>()?,
        })),
        Some(v1::executor::Kind::Noop(_)) => Ok(Executor::Noop),
        None => Err("the assignment names no executor".into()),
    }
}

pub(crate) fn outcome_to_result(attempt: v1::AttemptRef, o: &Outcome) -> v1::Result {
    use v1::result::Ending as E;
    let ending = match &o.ending {
        Ending::Succeeded => E::Succeeded,
        Ending::Failed(_) => E::Failed,
        Ending::TimedOut => E::TimedOut,
        Ending::Cancelled => E::Cancelled,
    };
    v1::Result {
        attempt: Some(attempt),
        ending: ending as i32,
        exit_code: o.exit_code,
        error: o.error.clone().unwrap_or_default(),
        started_at_us: 0,
        finished_at_us: 0,
        start_error_us: 0,
        output: o.log.clone(),
        lines: dagcron_core::log::encode(&o.lines),
        outputs: o
            .outputs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// The outcome a result reports, for the engine (`is_http` tells how to read
/// a failure's code).
pub(crate) fn outcome_from_result(r: &v1::Result, is_http: bool) -> Outcome {
    use v1::result::Ending as E;
    let error = (!r.error.is_empty()).then(|| r.error.clone());
    let ending = match E::try_from(r.ending).unwrap_or(E::Unspecified) {
        E::Succeeded => Ending::Succeeded,
        E::TimedOut => Ending::TimedOut,
        E::Cancelled => Ending::Cancelled,
        E::Failed | E::Unspecified => Ending::Failed(match (is_http, r.exit_code) {
            (true, Some(code)) => Failure::HttpStatus(u16::try_from(code).unwrap_or(0)),
            (false, code @ Some(_)) => Failure::Exit(code),
            (_, None) => Failure::Error(error.clone().unwrap_or_else(|| "failed".into())),
        }),
    };
    // An agent's outputs keep to the same limits as the server's own.
    let outputs: dagcron_core::outputs::Outputs = r
        .outputs
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let (ending, error, outputs) = match dagcron_core::outputs::check(&outputs) {
        Ok(()) => (ending, error, outputs),
        Err(e) if ending == Ending::Succeeded => (
            Ending::Failed(Failure::Error(e.to_string())),
            Some(e.to_string()),
            Default::default(),
        ),
        Err(_) => (ending, error, Default::default()),
    };
    Outcome {
        outputs,
        ending,
        exit_code: r.exit_code,
        error,
        log: r.output.clone(),
        lines: dagcron_core::log::decode(&r.lines),
        start_error_us: None,
    }
}

/// The outcome of an attempt whose agent vanished.
pub(crate) fn lost(why: &str) -> Outcome {
    Outcome {
        outputs: Default::default(),
        ending: Ending::Failed(Failure::Lost),
        exit_code: None,
        error: Some(why.to_string()),
        log: vec![],
        lines: Vec::new(),
        start_error_us: None,
    }
}
