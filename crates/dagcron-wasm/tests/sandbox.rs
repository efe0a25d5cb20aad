//! The sandbox end to end: WAT modules written here, compiled and run by
//! the real engine, with real files for the grants.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dagcron_wasm::{DirGrant, Ending, Invocation, Report, run};
use tokio_util::sync::CancellationToken;

/// WASI preview 1 imports the modules below use.
const IMPORTS: &str = r#"
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
"#;

/// A module that writes `text` on standard output, then runs `rest`.
fn printing(text: &str, rest: &str) -> String {
    format!(
        r#"(module {IMPORTS}
  (memory (export "memory") 1)
  (data (i32.const 1024) "{text}")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const {len}))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    {rest}))"#,
        len = text.len(),
        text = text.replace('\n', "\\n"),
    )
}

/// A module that opens `path` in its first granted directory (descriptor
/// 3) and prints what it reads there; it exits with the error number
/// when the open is refused.
fn reading(path: &str) -> String {
    format!(
        r#"(module {IMPORTS}
  (memory (export "memory") 1)
  (data (i32.const 100) "{path}")
  (func (export "_start") (local $err i32)
    (local.set $err (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const {len})
      (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 200)))
    (if (local.get $err) (then (call $exit (local.get $err))))
    (i32.store (i32.const 0) (i32.const 300))
    (i32.store (i32.const 4) (i32.const 64))
    (drop (call $read (i32.load (i32.const 200)) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 4) (i32.load (i32.const 8)))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#,
        len = path.len()
    )
}

const LOOP: &str = "(loop $forever (br $forever))";

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

fn invocation(module: PathBuf) -> Invocation {
    Invocation {
        module,
        program: "task".into(),
        memory: 16 << 20,
        max_output: 1 << 20,
        ..Invocation::default()
    }
}

async fn go(inv: &Invocation) -> Report {
    run(inv, CancellationToken::new(), None).await
}

fn log(r: &Report) -> String {
    String::from_utf8_lossy(&r.log).into_owned()
}

#[tokio::test]
async fn a_module_prints_and_exits_0() {
    let dir = Dir::new();
    let inv = invocation(dir.write("hello.wat", &printing("hello from wasm\n", "")));
    let r = go(&inv).await;
    assert_eq!(r.ending, Ending::Exited(0));
    assert_eq!(log(&r), "hello from wasm\n");
}

#[tokio::test]
async fn a_module_exits_3() {
    let dir = Dir::new();
    let inv = invocation(dir.write(
        "three.wat",
        &printing("failing\n", "(call $exit (i32.const 3))"),
    ));
    let r = go(&inv).await;
    assert_eq!(r.ending, Ending::Exited(3));
    assert_eq!(log(&r), "failing\n", "output before the exit is kept");
}

#[tokio::test]
async fn a_module_that_never_returns_is_stopped_at_its_timeout() {
    let dir = Dir::new();
    let mut inv = invocation(dir.write("loop.wat", &printing("looping\n", LOOP)));
    inv.timeout = Some(Duration::from_millis(300));
    let r = go(&inv).await;
    assert_eq!(r.ending, Ending::TimedOut);
    assert_eq!(log(&r), "looping\n");
}

#[tokio::test]
async fn a_module_that_never_returns_is_stopped_by_a_cancel() {
    let dir = Dir::new();
    let inv = invocation(dir.write("loop.wat", &printing("looping\n", LOOP)));
    assert_eq!(cancel_once_started(inv).await.ending, Ending::Cancelled);
}

/// Runs `inv` and cancels it once it has written something (the modules
/// here write before they loop or wait); the report, within a minute.
async fn cancel_once_started(inv: Invocation) -> Report {
    let cancel = CancellationToken::new();
    let started = Arc::new(tokio::sync::Notify::new());
    let seen = started.clone();
    let on_output: dagcron_wasm::OnOutput = Arc::new(move |_: &[u8]| seen.notify_one());
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { run(&inv, cancel, Some(on_output)).await }
    });
    tokio::time::timeout(Duration::from_secs(60), started.notified())
        .await
        .expect("the module starts");
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("a cancel stops the module")
        .unwrap()
}

#[tokio::test]
async fn growing_memory_past_the_limit_fails_with_the_reason() {
    let dir = Dir::new();
    let mut inv = invocation(dir.write(
        "grow.wat",
        &printing("growing\n", "(drop (memory.grow (i32.const 32)))"),
    ));
    inv.memory = 1 << 20;
    let r = go(&inv).await;
    expect_test::expect![[r#"
        Failed(
            "memory limit reached: the module asked for 2112KiB of memory, its limit is 1MiB",
        )
    "#]]
    .assert_debug_eq(&r.ending);
    // Within the limit, the same growth succeeds.
    inv.memory = 4 << 20;
    assert_eq!(go(&inv).await.ending, Ending::Exited(0));
}

#[tokio::test]
async fn a_module_whose_initial_memory_is_over_the_limit_does_not_start() {
    let dir = Dir::new();
    let mut inv = invocation(dir.write(
        "big.wat",
        r#"(module (memory (export "memory") 64) (func (export "_start")))"#,
    ));
    inv.memory = 1 << 20;
    let r = go(&inv).await;
    assert!(
        matches!(&r.ending, Ending::Failed(m) if m.starts_with("memory limit reached: the module asked for 4MiB")),
        "{:?}",
        r.ending
    );
}

#[tokio::test]
async fn files_are_refused_without_a_grant_and_read_with_one() {
    let dir = Dir::new();
    let data = Dir::new();
    std::fs::write(data.path().join("data.txt"), "granted contents\n").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "not for the module\n").unwrap();
    let mut inv = invocation(dir.write("read.wat", &reading("data.txt")));
    let r = go(&inv).await;
    // No directory is open: descriptor 3 is EBADF (8).
    assert_eq!(r.ending, Ending::Exited(8), "{}", log(&r));
    inv.dirs = vec![DirGrant {
        host: data.path().display().to_string(),
        guest: "/data".into(),
        write: false,
    }];
    let r = go(&inv).await;
    assert_eq!(r.ending, Ending::Exited(0));
    assert_eq!(log(&r), "granted contents\n");
    // A path that leaves the granted directory is refused (EPERM, 63).
    let mut escape = invocation(dir.write("escape.wat", &reading("../secret.txt")));
    escape.dirs = inv.dirs.clone();
    let r = go(&escape).await;
    assert_eq!(r.ending, Ending::Exited(63), "{}", log(&r));
}

#[tokio::test]
async fn fuel_runs_out() {
    let dir = Dir::new();
    let mut inv = invocation(dir.write("spin.wat", &printing("spinning\n", LOOP)));
    inv.fuel = Some(100_000);
    let r = go(&inv).await;
    assert_eq!(
        r.ending,
        Ending::Failed("fuel exhausted: the module used its whole budget of 100000".into())
    );
    // A budget large enough for the work lets it finish.
    let mut done = invocation(dir.write("done.wat", &printing("done\n", "")));
    done.fuel = Some(100_000);
    assert_eq!(go(&done).await.ending, Ending::Exited(0));
}

#[tokio::test]
async fn a_module_is_checked_against_its_digest() {
    let dir = Dir::new();
    let mut inv = invocation(dir.write("hello.wat", &printing("hi\n", "")));
    inv.sha256 = Some("0".repeat(64));
    let r = go(&inv).await;
    assert!(
        matches!(&r.ending, Ending::Failed(m) if m.contains("has SHA-256") && m.ends_with(&format!("the task expects {}", "0".repeat(64)))),
        "{:?}",
        r.ending
    );
    use sha2::Digest;
    let sum = sha2::Sha256::digest(std::fs::read(&inv.module).unwrap());
    inv.sha256 = Some(sum.iter().map(|b| format!("{b:02X}")).collect());
    assert_eq!(go(&inv).await.ending, Ending::Exited(0));
}

#[tokio::test]
async fn missing_and_broken_modules_fail_with_the_reason() {
    let dir = Dir::new();
    let r = go(&invocation(dir.path().join("absent.wasm"))).await;
    assert!(
        matches!(&r.ending, Ending::Failed(m) if m.starts_with("cannot read the module") && m.contains("absent.wasm")),
        "{:?}",
        r.ending
    );
    let r = go(&invocation(dir.write("bad.wat", "(module (func"))).await;
    assert!(
        matches!(&r.ending, Ending::Failed(m) if m.starts_with("the module does not compile")),
        "{:?}",
        r.ending
    );
    let r = go(&invocation(
        dir.write("lib.wat", "(module (func (export \"f\")))"),
    ))
    .await;
    assert!(
        matches!(&r.ending, Ending::Failed(m) if m.contains("no `_start`")),
        "{:?}",
        r.ending
    );
    let r = go(&invocation(dir.write(
        "sockets.wat",
        r#"(module (import "env" "connect" (func)) (func (export "_start")))"#,
    )))
    .await;
    assert!(
        matches!(&r.ending, Ending::Failed(m) if m.starts_with("the module cannot be linked")),
        "{:?}",
        r.ending
    );
}

/// A task names its module's path, so a module can be any file of the
/// host: a file that does not compile must never be quoted in the error
/// (the parser's message shows the offending line).
#[tokio::test]
async fn a_file_that_is_not_a_module_is_never_quoted() {
    let dir = Dir::new();
    for (name, text) in [
        ("admin.wat", "s3cr3t-admin-token-value\nsecond line\n"),
        ("admin.token", "s3cr3t-admin-token-value\n"),
        (
            "half.wat",
            "(module (func (call $s3cr3t-admin-token-value)))",
        ),
    ] {
        let r = go(&invocation(dir.write(name, text))).await;
        let Ending::Failed(m) = &r.ending else {
            panic!("{name}: {:?}", r.ending);
        };
        assert!(m.starts_with("the module does not compile"), "{name}: {m}");
        assert!(!m.contains("s3cr3t"), "{name}: {m}");
        assert!(!m.contains("second"), "{name}: {m}");
    }
    let r = go(&invocation(dir.write("bad.wat", "\n\n  (module (func"))).await;
    assert!(
        matches!(&r.ending, Ending::Failed(m) if m.contains("at line 3")),
        "where it fails is still said: {:?}",
        r.ending
    );
}

#[tokio::test]
async fn output_is_capped() {
    let dir = Dir::new();
    let mut inv = invocation(dir.write("hello.wat", &printing("0123456789", "")));
    inv.max_output = 4;
    let r = go(&inv).await;
    assert_eq!(
        log(&r),
        "0123\n[dagcron: output truncated, 6 more bytes dropped]\n"
    );
}

#[tokio::test]
async fn compiled_modules_are_cached_by_their_digest() {
    let dir = Dir::new();
    let inv = invocation(dir.write("cached.wat", &printing("cached\n", "")));
    let compiled: Vec<bool> = [go(&inv).await, go(&inv).await, go(&inv).await]
        .iter()
        .map(|r| r.compiled)
        .collect();
    assert_eq!(compiled, [true, false, false]);
    // The same bytes for the fuel engine are compiled for it.
    let mut metered = inv.clone();
    metered.fuel = Some(1_000_000);
    assert!(go(&metered).await.compiled);
    // A changed file is compiled again, and runs as it now is.
    std::fs::write(&inv.module, printing("changed\n", "")).unwrap();
    let r = go(&inv).await;
    assert!(r.compiled);
    assert_eq!(log(&r), "changed\n");
}

/// A preview 2 command component: `run` returns `ok` or `err`.
fn component(ok: bool) -> String {
    format!(
        r#"(component
  (core module $m (func (export "run") (result i32) i32.const {}))
  (core instance $i (instantiate $m))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $cli (export "run" (func $run)))
  (export "wasi:cli/run@0.2.0" (instance $cli)))"#,
        if ok { 0 } else { 1 }
    )
}

#[tokio::test]
async fn preview_2_command_components_run() {
    let dir = Dir::new();
    let r = go(&invocation(dir.write("ok.wat", &component(true)))).await;
    assert_eq!(r.ending, Ending::Exited(0));
    let r = go(&invocation(dir.write("err.wat", &component(false)))).await;
    assert_eq!(r.ending, Ending::Exited(1));
}

#[tokio::test]
async fn traps_and_bad_exits_say_what_happened() {
    let dir = Dir::new();
    let r = go(&invocation(
        dir.write("trap.wat", &printing("x", "unreachable")),
    ))
    .await;
    assert_eq!(
        r.ending,
        Ending::Failed(
            "the module stopped: wasm trap: wasm `unreachable` instruction executed".into()
        )
    );
    let r = go(&invocation(dir.write(
        "bad-exit.wat",
        &printing("x", "(call $exit (i32.const 300))"),
    )))
    .await;
    assert_eq!(
        r.ending,
        Ending::Failed(
            "the module failed: exit with invalid exit status outside of [0..126)".into()
        )
    );
}

#[tokio::test]
async fn the_memory_limit_holds_for_all_memories_together() {
    let dir = Dir::new();
    // Two memories of 10 pages each: 1280KiB in all.
    let mut inv = invocation(dir.write(
        "two.wat",
        r#"(module (memory 10) (memory 10) (func (export "_start")))"#,
    ));
    inv.memory = 1 << 20;
    assert_eq!(
        go(&inv).await.ending,
        Ending::Failed(
            "memory limit reached: the module asked for 1280KiB of memory, its limit is 1MiB"
                .into()
        )
    );
    inv.memory = 2 << 20;
    assert_eq!(go(&inv).await.ending, Ending::Exited(0));
}

/// Prints `sleeping`, then waits an hour in a host call (`poll_oneoff` on
/// the monotonic clock), where no epoch check runs.
const SLEEPING: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "sleeping\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 9))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    ;; One clock subscription at 256: monotonic, relative, one hour.
    (i64.store (i32.const 256) (i64.const 0))
    (i32.store8 (i32.const 264) (i32.const 0))
    (i32.store (i32.const 272) (i32.const 1))
    (i64.store (i32.const 280) (i64.const 3600000000000))
    (i64.store (i32.const 288) (i64.const 0))
    (i32.store16 (i32.const 296) (i32.const 0))
    (drop (call $poll (i32.const 256) (i32.const 512) (i32.const 1) (i32.const 600)))))"#;

#[tokio::test]
async fn the_watchdog_stops_a_module_waiting_in_a_host_call() {
    let dir = Dir::new();
    let mut inv = invocation(dir.write("sleep.wat", SLEEPING));
    inv.timeout = Some(Duration::from_millis(300));
    let r = tokio::time::timeout(Duration::from_secs(60), go(&inv))
        .await
        .expect("the deadline holds in a host call");
    assert_eq!(r.ending, Ending::TimedOut);
    assert_eq!(log(&r), "sleeping\n");
    // A cancel reaches it there too.
    inv.timeout = None;
    assert_eq!(cancel_once_started(inv).await.ending, Ending::Cancelled);
}
