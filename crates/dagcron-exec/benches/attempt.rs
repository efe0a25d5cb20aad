//! Attempt overhead: a trivial WebAssembly task (a WASI module that
//! returns at once, compiled and cached) against a shell `true` task
//! (`/bin/sh -c true`), in the same run, alternating so that both see the
//! same machine. Each attempt goes through the whole executor: the
//! environment, the module's read and digest (or the process's spawn, its
//! output pipes and its reaping), instantiation, output capture.
//!
//! Run: `cargo bench -p dagcron-exec --features wasm --bench attempt`
//! (`DAGCRON_BENCH_ROUNDS` sets the number of rounds, default 2000;
//! `DAGCRON_BENCH_SANDBOX=1` runs the shell attempts in the server's sandbox).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dagcron_core::Executor;
use dagcron_core::model::{Grants, ShellCommand, WasmSpec};
use dagcron_exec::{AttemptContext, Ending, Limits, run};
use tokio_util::sync::CancellationToken;

const TRIVIAL: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

fn ctx(n: u64) -> AttemptContext {
    AttemptContext {
        item: Default::default(),
        outputs: Default::default(),
        namespace: "bench".into(),
        job: "j".into(),
        run_id: n as i64,
        task_id: "t".into(),
        attempt: 1,
        scheduled_at: jiff::Timestamp::now(),
        idempotency_key: n.to_string(),
        params: BTreeMap::new(),
        secrets: Default::default(),
        trace: None,
        policy: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn once(executor: &Executor, n: u64) -> Duration {
    let started = Instant::now();
    let out = run(
        executor,
        &ctx(n),
        Some(Duration::from_secs(10)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(out.ending, Ending::Succeeded, "{out:?}");
    took
}

fn main() {
    let rounds: u64 = std::env::var("DAGCRON_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("trivial.wat");
    std::fs::write(&module, TRIVIAL).unwrap();
    let wasm = Executor::Wasm(WasmSpec {
        module: module.display().to_string(),
        sha256: None,
        args: vec![],
        env: BTreeMap::new(),
        stdin: None,
        memory: None,
        fuel: None,
        grants: Grants::default(),
    });
    let shell = Executor::Shell(ShellCommand {
        command: "true".into(),
        args: vec![],
        env: BTreeMap::new(),
        cwd: None,
    });
    // With DAGCRON_BENCH_SANDBOX=1 the shell attempts run in the server's
    // sandbox (as `dagcron serve` runs them); run the benchmark with and
    // without it to see what the sandbox costs.
    let sandboxed = std::env::var("DAGCRON_BENCH_SANDBOX").is_ok_and(|v| v == "1");
    if sandboxed {
        // A data directory of the "server", hidden from the tasks.
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        dagcron_exec::sandbox::enable(&[data], dagcron_exec::sandbox::TaskUser::nobody())
            .expect("the sandbox of shell tasks");
    }
    let shell_name = if sandboxed {
        "shell `true` (sandboxed)"
    } else {
        "shell `true`"
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The first attempt sets up the engine and compiles the module.
        let cold = once(&wasm, 0).await;
        for n in 0..20 {
            once(&wasm, n).await;
            once(&shell, n).await;
        }
        let mut w = Vec::new();
        let mut s = Vec::new();
        for n in 0..rounds {
            w.push(once(&wasm, n).await);
            s.push(once(&shell, n).await);
        }
        w.sort();
        s.sort();
        println!("attempts: {rounds} of each, alternating");
        println!(
            "first WASM attempt (engine set-up and compile): {:.0} µs",
            us(cold)
        );
        println!("| task | p50 | p90 | p99 |");
        println!("|---|---|---|---|");
        for (name, v) in [("wasm (cached module)", &w), (shell_name, &s)] {
            println!(
                "| {name} | {:.0} µs | {:.0} µs | {:.0} µs |",
                us(percentile(v, 0.5)),
                us(percentile(v, 0.9)),
                us(percentile(v, 0.99))
            );
        }
        println!(
            "shell / wasm at p50: {:.1}x, at p99: {:.1}x",
            us(percentile(&s, 0.5)) / us(percentile(&w, 0.5)),
            us(percentile(&s, 0.99)) / us(percentile(&w, 0.99))
        );
    });
}
