//! The engines (one metered by fuel, one not), the ticker of their epochs,
//! and the cache of compiled modules, keyed by the file's SHA-256 and the
//! engine: an attempt of a cached module only instantiates.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::component::{Component, Linker as ComponentLinker};
use wasmtime::{Config, Engine, InstancePre, Linker, Module};
use wasmtime_wasi::p2::bindings::CommandPre;

use crate::WasmError;
use crate::host::{P1, P2};

/// How often the epoch advances: the granularity of deadlines and of the
/// module yielding to other tasks.
pub(crate) const TICK: Duration = Duration::from_millis(5);

/// Modules kept compiled; past this the cache starts anew.
const CACHE_ENTRIES: usize = 128;

/// A module compiled and linked, ready to instantiate.
#[derive(Clone)]
pub(crate) enum Prepared {
    /// A WASI preview 1 core module.
    Module(InstancePre<P1>),
    /// A WASI preview 2 command component.
    Component(CommandPre<P2>),
}

/// One engine configuration, its linkers and its compiled modules.
pub(crate) struct Flavor {
    pub(crate) engine: Engine,
    p1: Linker<P1>,
    p2: ComponentLinker<P2>,
    cache: Mutex<HashMap<[u8; 32], Prepared>>,
}

fn build(fuel: bool) -> Result<Flavor, WasmError> {
    let setup = |e: wasmtime::Error| WasmError::Engine(format!("{e:#}"));
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .consume_fuel(fuel)
        .wasm_component_model(true);
    let engine = Engine::new(&config).map_err(setup)?;
    let mut p1 = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut p1, |s: &mut P1| &mut s.wasi).map_err(setup)?;
    let mut p2 = ComponentLinker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut p2).map_err(setup)?;
    tick(engine.clone())?;
    Ok(Flavor {
        engine,
        p1,
        p2,
        cache: Mutex::new(HashMap::new()),
    })
}

/// How many module instances run now: the ticker sleeps while none does.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
/// The ticker's thread, woken when the first instance starts.
static TICKER: OnceLock<std::thread::Thread> = OnceLock::new();

/// Held while a module instance runs: the epoch ticks only then, so that
/// an idle server does not wake [`TICK`] after [`TICK`].
pub(crate) struct Ticking(());

impl Ticking {
    pub(crate) fn start() -> Ticking {
        if RUNNING.fetch_add(1, Ordering::SeqCst) == 0 {
            if let Some(t) = TICKER.get() {
                t.unpark();
            }
        }
        Ticking(())
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Advances `engine`'s epoch every [`TICK`] while an instance runs, on
/// the one thread that ticks every engine.
fn tick(engine: Engine) -> Result<(), WasmError> {
    static ENGINES: OnceLock<Arc<Mutex<Vec<Engine>>>> = OnceLock::new();
    let mut started = Ok(());
    let engines = ENGINES.get_or_init(|| {
        let engines = Arc::new(Mutex::new(Vec::<Engine>::new()));
        let ticked = engines.clone();
        started = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                loop {
                    if RUNNING.load(Ordering::SeqCst) == 0 {
                        // Woken by the next instance's start (a wake-up
                        // for no reason only comes back here).
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(TICK);
                    for engine in ticked.lock().expect("engines lock").iter() {
                        engine.increment_epoch();
                    }
                }
            })
            .map(|handle| {
                let _ = TICKER.set(handle.thread().clone());
            });
        engines
    });
    started.map_err(|e| WasmError::Engine(format!("starting the epoch ticker: {e}")))?;
    engines.lock().expect("engines lock").push(engine);
    Ok(())
}

/// The engine for modules with a fuel budget (`fuel: true`) or without.
pub(crate) fn flavor(fuel: bool) -> Result<&'static Flavor, WasmError> {
    static METERED: OnceLock<Result<Flavor, WasmError>> = OnceLock::new();
    static PLAIN: OnceLock<Result<Flavor, WasmError>> = OnceLock::new();
    let cell = if fuel { &METERED } else { &PLAIN };
    cell.get_or_init(|| build(fuel))
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether `bytes` (binary) is a component rather than a core module:
/// after the magic number, a component's header says layer 1.
fn is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[6..8] == [1, 0]
}

impl Flavor {
    /// The prepared module of these bytes, compiled on a blocking thread
    /// the first time they are seen (then the flag is true).
    pub(crate) async fn prepare(
        &'static self,
        digest: [u8; 32],
        bytes: Vec<u8>,
        text: bool,
    ) -> Result<(Prepared, bool), WasmError> {
        if let Some(p) = self.cache.lock().expect("cache lock").get(&digest) {
            return Ok((p.clone(), false));
        }
        let prepared = tokio::task::spawn_blocking(move || self.compile(&bytes, text))
            .await
            .map_err(|e| WasmError::Compile(format!("the compiler stopped: {e}")))??;
        let mut cache = self.cache.lock().expect("cache lock");
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(digest, prepared.clone());
        Ok((prepared, true))
    }

    fn compile(&self, bytes: &[u8], text: bool) -> Result<Prepared, WasmError> {
        let binary;
        let bytes = if text {
            let source = std::str::from_utf8(bytes)
                .map_err(|e| WasmError::Compile(format!("the text is not UTF-8: {e}")))?;
            binary = wat::parse_str(source).map_err(|e| WasmError::Compile(text_error(&e)))?;
            &binary[..]
        } else if !bytes.starts_with(b"\0asm") {
            // Never quote the file: it may be any file of the host.
            return Err(WasmError::Compile(
                "not a WebAssembly module: the file does not start with the `\\0asm` header".into(),
            ));
        } else {
            bytes
        };
        let compile = |e: wasmtime::Error| WasmError::Compile(format!("{e:#}"));
        if is_component(bytes) {
            let component = Component::new(&self.engine, bytes).map_err(compile)?;
            let pre = self
                .p2
                .instantiate_pre(&component)
                .map_err(|e| WasmError::Link(format!("{e:#}")))?;
            let pre = CommandPre::new(pre).map_err(|e| {
                WasmError::Link(format!(
                    "not a WASI command (it must export wasi:cli/run): {e:#}"
                ))
            })?;
            Ok(Prepared::Component(pre))
        } else {
            let module = Module::new(&self.engine, bytes).map_err(compile)?;
            if module.get_export("_start").is_none() {
                return Err(WasmError::Link(
                    "the module exports no `_start` function: build it as a WASI command (a program with `main`)".into(),
                ));
            }
            let pre = self
                .p1
                .instantiate_pre(&module)
                .map_err(|e| WasmError::Link(format!("{e:#}")))?;
            Ok(Prepared::Module(pre))
        }
    }
}

/// Where a text module fails to parse, without quoting the file: the
/// parser's message shows the offending line, and the file may be any file
/// of the host (a task names its module's path).
fn text_error(e: &wat::Error) -> String {
    let shown = e.to_string();
    let place = shown
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("--> "))
        .and_then(|at| {
            let mut parts = at.rsplitn(3, ':');
            let col: u32 = parts.next()?.trim().parse().ok()?;
            let line: u32 = parts.next()?.trim().parse().ok()?;
            Some(format!(" at line {line}, column {col}"))
        })
        .unwrap_or_default();
    format!("not valid WebAssembly text{place} (the file's contents are not shown)")
}
