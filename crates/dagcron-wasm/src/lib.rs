//! The WebAssembly executor: one attempt of a WASI preview 1 module or a
//! preview 2 command component, in a sandbox.
//!
//! Each attempt gets a fresh store: its own memory, the arguments,
//! environment and standard input it was given, and only the directories
//! and hosts granted to it. Limits: linear memory and tables (a refused
//! growth traps and is named in the error), a wall-clock deadline by epoch
//! interruption (the module yields to the runtime at every tick, so a
//! timeout or a cancel stops even a module that never returns), an
//! optional fuel budget, and a watchdog on the whole call that counts the
//! time spent in host calls too, which neither epochs nor fuel see.
//! Compiled modules are cached by the SHA-256 of their file and the
//! engine that compiled them.
//!
//! # How it works
//!
//! The WebAssembly sandbox, and the only crate that knows wasmtime (48,
//! without default features: no C build). `engine.rs` holds two engines (one
//! metering fuel, one not), each with its WASI linkers (preview 1 for core
//! modules, preview 2 for command components) and its cache of compiled,
//! pre-linked modules keyed by the file's SHA-256, and one thread that
//! advances both engines' epochs every 5 ms. `host.rs` builds an attempt's WASI context from its
//! grants (preopened directories, granted socket addresses; nothing else) and
//! the limiter of memory and tables, which remembers a refusal so that the
//! error names it; `output.rs` is one capped sink for stdout and stderr. An
//! attempt reads the file (checking `sha256`), gets the prepared module, and
//! runs it in a fresh store whose epoch callback yields at every tick and
//! interrupts at the deadline or a cancel; the whole call is also raced
//! against both, which covers time spent in host calls.
//!
//! **Architecture Invariant:** a module reaches nothing of its host that its
//! task does not grant, and no module outlives its attempt's deadline or
//! cancel (the module is interrupted at its next tick, the call dropped).

mod engine;
mod host;
mod output;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::I32Exit;

pub use dagcron_core::wasm::DirGrant;
pub use output::OnOutput;

use engine::Prepared;
use host::{Limited, Limiter, P1, P2};

/// Why a module could not be run at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WasmError {
    /// The module's file could not be read.
    #[error("cannot read the module {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// What the system said.
        message: String,
    },
    /// The file is not the one the task names by its digest.
    #[error("the module {path} has SHA-256 {actual}, the task expects {expected}")]
    Digest {
        /// The file.
        path: String,
        /// The task's `sha256`.
        expected: String,
        /// The file's.
        actual: String,
    },
    /// Not valid WebAssembly (or WAT).
    #[error("the module does not compile: {0}")]
    Compile(String),
    /// It imports what the sandbox does not provide, or is no command.
    #[error("the module cannot be linked: {0}")]
    Link(String),
    /// A granted directory cannot be opened.
    #[error("the granted directory {host} cannot be opened: {message}")]
    Grant {
        /// The host directory.
        host: String,
        /// What the system said.
        message: String,
    },
    /// The engine could not be set up.
    #[error("the WebAssembly engine cannot start: {0}")]
    Engine(String),
}

/// One attempt, everything resolved: parameters substituted, secrets put
/// in, the host's variables granted read.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    /// The module's file (`.wasm`, or `.wat` text).
    pub module: PathBuf,
    /// The SHA-256 the file must have, in hex.
    pub sha256: Option<String>,
    /// The program's name, `argv[0]`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Its standard input.
    pub stdin: Vec<u8>,
    /// Most bytes of linear memory.
    pub memory: u64,
    /// A fuel budget.
    pub fuel: Option<u64>,
    /// Directories it sees.
    pub dirs: Vec<DirGrant>,
    /// Socket addresses it may connect to (resolved from the granted hosts).
    pub connect: Vec<SocketAddr>,
    /// The attempt's time limit.
    pub timeout: Option<Duration>,
    /// Output kept; the rest is dropped with a marker.
    pub max_output: usize,
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The program exited (returning from `_start` or `run` is 0, an
    /// error result from a component's `run` is 1).
    Exited(i32),
    /// It ran past its timeout.
    TimedOut,
    /// It was cancelled.
    Cancelled,
    /// It failed without an exit code: a trap, a limit, or it could not start.
    Failed(String),
}

/// The report of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// How it ended.
    pub ending: Ending,
    /// Standard output and error, interleaved, capped.
    pub log: Vec<u8>,
    /// Whether this attempt compiled the module (it was not cached).
    pub compiled: bool,
}

/// Resolves granted hosts (`name` or `name:port`; 80 and 443 without a
/// port) to the addresses a module may connect to.
pub async fn resolve_hosts(hosts: &[String]) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::new();
    for host in hosts {
        let targets: Vec<String> = if host.rsplit_once(':').is_some() {
            vec![host.clone()]
        } else {
            vec![format!("{host}:80"), format!("{host}:443")]
        };
        for target in targets {
            let found = tokio::net::lookup_host(&target)
                .await
                .map_err(|e| format!("the granted host {host} cannot be resolved: {e}"))?;
            out.extend(found);
        }
    }
    Ok(out)
}

/// The largest module file read (a compiler's output for a big program is
/// tens of MiB).
const MAX_MODULE_BYTES: u64 = 256 << 20;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the module, checks its digest and compiles it (or finds it
/// compiled), for the engine of `fuel`.
async fn load(inv: &Invocation) -> Result<(Prepared, bool), WasmError> {
    let path = inv.module.display().to_string();
    let unreadable = |message: String| WasmError::Read {
        path: path.clone(),
        message,
    };
    let size = tokio::fs::metadata(&inv.module)
        .await
        .map_err(|e| unreadable(e.to_string()))?
        .len();
    if size > MAX_MODULE_BYTES {
        return Err(unreadable(format!(
            "it is {size} bytes, more than the {MAX_MODULE_BYTES} a module may have"
        )));
    }
    let bytes = tokio::fs::read(&inv.module)
        .await
        .map_err(|e| unreadable(e.to_string()))?;
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    if let Some(expected) = &inv.sha256 {
        let actual = hex(&digest);
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(WasmError::Digest {
                path,
                expected: expected.clone(),
                actual,
            });
        }
    }
    let text = inv.module.extension().is_some_and(|e| e == "wat");
    engine::flavor(inv.fuel.is_some())?
        .prepare(digest, bytes, text)
        .await
}

/// Sets a fresh store's limits: memory and tables, fuel, and an epoch
/// deadline that yields at every tick and interrupts at the deadline or a
/// cancel.
fn limit<T: Limited + Send + 'static>(
    store: &mut Store<T>,
    inv: &Invocation,
    deadline: Option<Instant>,
    cancel: CancellationToken,
) {
    store.limiter(|s| s.limiter() as &mut dyn wasmtime::ResourceLimiter);
    if let Some(fuel) = inv.fuel {
        store.set_fuel(fuel).expect("the engine meters fuel");
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if cancel.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d) {
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
}

/// What an error out of the module means: an exit, a limit, a trap.
fn ending_of(
    e: &wasmtime::Error,
    limiter: &Limiter,
    inv: &Invocation,
    cancel: &CancellationToken,
) -> Ending {
    if let Some(exit) = e.downcast_ref::<I32Exit>() {
        return Ending::Exited(exit.0);
    }
    if let Some(asked) = limiter.refused_memory {
        return Ending::Failed(format!(
            "memory limit reached: the module asked for {} of memory, its limit is {}",
            dagcron_core::wasm::ByteSize(asked as u64),
            dagcron_core::wasm::ByteSize(inv.memory)
        ));
    }
    if let Some(asked) = limiter.refused_table {
        return Ending::Failed(format!(
            "table limit reached: the module asked for {asked} table elements"
        ));
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Ending::Failed(format!(
            "fuel exhausted: the module used its whole budget of {}",
            inv.fuel.unwrap_or_default()
        )),
        Some(Trap::Interrupt) if cancel.is_cancelled() => Ending::Cancelled,
        Some(Trap::Interrupt) => Ending::TimedOut,
        Some(trap) => Ending::Failed(format!("the module stopped: {trap}")),
        // The wasm backtrace is context on top: the cause says what happened.
        None => Ending::Failed(format!("the module failed: {}", e.root_cause())),
    }
}

async fn execute(
    inv: &Invocation,
    prepared: Prepared,
    sink: &output::Sink,
    deadline: Option<Instant>,
    cancel: CancellationToken,
) -> Result<Ending, WasmError> {
    let allowed = Arc::new(inv.connect.iter().copied().collect::<HashSet<_>>());
    let mut wasi = host::wasi(inv, sink, allowed)?;
    let engine = &engine::flavor(inv.fuel.is_some())?.engine;
    let _ticking = engine::Ticking::start();
    match prepared {
        Prepared::Module(pre) => {
            let state = P1 {
                wasi: wasi.build_p1(),
                limiter: Limiter::new(inv.memory),
            };
            let mut store = Store::new(engine, state);
            limit(&mut store, inv, deadline, cancel.clone());
            let run = async {
                let instance = pre.instantiate_async(&mut store).await?;
                let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
                start.call_async(&mut store, ()).await
            };
            let result = run.await;
            Ok(match result {
                Ok(()) => Ending::Exited(0),
                Err(e) => ending_of(&e, &store.data().limiter, inv, &cancel),
            })
        }
        Prepared::Component(pre) => {
            let state = P2 {
                ctx: wasi.build(),
                table: wasmtime::component::ResourceTable::new(),
                limiter: Limiter::new(inv.memory),
            };
            let mut store = Store::new(engine, state);
            limit(&mut store, inv, deadline, cancel.clone());
            let run = async {
                let command = pre.instantiate_async(&mut store).await?;
                command.wasi_cli_run().call_run(&mut store).await
            };
            let result = run.await;
            Ok(match result {
                Ok(Ok(())) => Ending::Exited(0),
                Ok(Err(())) => Ending::Exited(1),
                Err(e) => ending_of(&e, &store.data().limiter, inv, &cancel),
            })
        }
    }
}

/// Runs one attempt. `on_output` sees the output as it is written.
pub async fn run(
    inv: &Invocation,
    cancel: CancellationToken,
    on_output: Option<OnOutput>,
) -> Report {
    let started = Instant::now();
    let deadline = inv.timeout.map(|t| started + t);
    let sink = output::Sink::new(inv.max_output, on_output);
    let compiled = std::sync::atomic::AtomicBool::new(false);
    let work = async {
        let (prepared, fresh) = load(inv).await?;
        compiled.store(fresh, std::sync::atomic::Ordering::Relaxed);
        execute(inv, prepared, &sink, deadline, cancel.clone()).await
    };
    // The watchdog: the module is interrupted at its next epoch tick, but
    // time spent in a host call (or in compiling) is not seen there, so
    // the whole call is also raced against the deadline and the cancel;
    // dropping the call abandons whatever it was waiting for.
    let watchdog = async {
        match deadline {
            // A tick after the epoch deadline, which reports more precisely.
            Some(d) => tokio::time::sleep_until((d + engine::TICK * 2).into()).await,
            None => std::future::pending().await,
        }
    };
    let ending = tokio::select! {
        r = work => r.unwrap_or_else(|e| Ending::Failed(e.to_string())),
        () = watchdog => Ending::TimedOut,
        () = cancel.cancelled() => Ending::Cancelled,
    };
    Report {
        ending,
        log: sink.take(),
        compiled: compiled.load(std::sync::atomic::Ordering::Relaxed),
    }
}
