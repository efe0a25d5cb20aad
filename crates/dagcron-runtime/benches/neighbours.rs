//! A noisy neighbour: one namespace (`alpha`) with many every-second shell
//! jobs beside another (`beta`) with one. What counts is `beta`'s start
//! lateness: from the scheduled instant to the first line its task prints
//! (its own clock reading), with `beta` alone and beside `alpha`, in one
//! run. The server's pool is shared between namespaces in turn, so
//! `alpha`'s backlog does not stand between `beta`'s fire and a slot.
//!
//! Run: `cargo bench -p dagcron-runtime --bench neighbours`
//! (`DAGCRON_BENCH_NOISY=600` jobs in `alpha`, `DAGCRON_BENCH_SECS=20` a
//! phase, `DAGCRON_BENCH_POOL=64` slots). Shell tasks run in the server's
//! sandbox, as a server runs them.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::model::{RetrySpec, Schedules, ShellSpec};
use dagcron_core::{Concurrency, JobFile, JobSpec, Misfire, TaskSpec, TriggerRule};
use dagcron_runtime::{Engine, EngineConfig, SystemClock};
use dagcron_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn every_second(name: String, script: String) -> JobSpec {
    JobSpec {
        priority: Default::default(),
        name,
        schedule: Some(Schedules::One("* * * * * *".into())),
        timezone: "UTC".into(),
        dst_gap: None,
        dst_overlap: None,
        anchor: None,
        concurrency: Concurrency::Allow,
        max_active_runs: Some(1000),
        max_pending_runs: Some(100_000),
        misfire: Misfire::Skip,
        max_catchup: 10,
        deadline: None,
        send_ahead: None,
        jitter: None,
        exclude: vec![],
        params: BTreeMap::new(),
        retry: RetrySpec::default(),
        on_exhausted: None,
        delivery: Default::default(),
        paused: false,
        start_date: None,
        end_date: None,
        notify: vec![],
        breaker: None,
        webhook: None,
        after: None,
        sla: None,
        nats: None,
        tasks: vec![TaskSpec {
            for_each: Default::default(),
            max_parallel: Default::default(),
            priority: Default::default(),
            id: "t".into(),
            depends_on: vec![],
            trigger_rule: TriggerRule::AllSuccess,
            timeout: None,
            retry: None,
            on_exhausted: None,
            shell: Some(ShellSpec::Script(script)),
            http: None,
            wasm: None,
            noop: false,
            run_on: None,
            when: None,
            skip_on_exit_code: vec![],
        }],
    }
}

fn file(namespace: &str, jobs: Vec<JobSpec>) -> JobFile {
    JobFile {
        namespace: namespace.into(),
        calendars: vec![],
        notifiers: vec![],
        notify: vec![],
        jobs,
    }
}

/// `beta`'s lateness in milliseconds, one per run, from the lines its
/// task wrote to `out` ("scheduled instant" "clock reading").
fn lateness(out: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let mut late: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let (at, now) = l.split_once(' ')?;
            let at: jiff::Timestamp = at.parse().ok()?;
            let now: f64 = now.parse().ok()?;
            Some(now * 1000.0 - at.as_millisecond() as f64)
        })
        .collect();
    late.sort_by(f64::total_cmp);
    late
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// One phase: a fresh engine on a fresh database, `noisy` jobs in `alpha`
/// beside `beta`'s one, for `secs`; `beta`'s lateness and the runs made.
async fn phase(dir: &Path, noisy: u64, secs: u64, pool: usize) -> (Vec<f64>, u64) {
    let phase = dir.join(format!("phase-{noisy}"));
    std::fs::create_dir_all(&phase).unwrap();
    let store = Arc::new(SqliteStore::open(&phase.join("bench.db")).await.unwrap());
    let config = EngineConfig {
        pool_size: pool,
        misfire_grace: Duration::from_secs(3600),
        ..EngineConfig::default()
    };
    let (engine, handle) = Engine::start(store.clone(), Arc::new(SystemClock), config)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(engine.run(stop.clone(), Duration::from_secs(1)));
    let out = dir.join(format!("beta-{noisy}.log"));
    let beta = every_second(
        "quiet".into(),
        format!(
            "echo \"$DAGCRON_SCHEDULED_AT $(date +%s.%N)\" >> {}",
            out.display()
        ),
    );
    let alpha: Vec<JobSpec> = (0..noisy)
        .map(|i| every_second(format!("noisy-{i}"), "echo $DAGCRON_RUN_ID".into()))
        .collect();
    if !alpha.is_empty() {
        handle
            .apply(file("alpha", alpha).validate().unwrap())
            .await
            .unwrap();
    }
    handle
        .apply(file("beta", vec![beta]).validate().unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.cancel();
    let _ = running.await;
    let runs = dagcron_store::RunStore::count_unfinished_runs(&*store, "alpha")
        .await
        .unwrap_or(0);
    (lateness(&out), runs)
}

fn main() {
    let noisy = env("DAGCRON_BENCH_NOISY", 600);
    let secs = env("DAGCRON_BENCH_SECS", 20);
    let pool = env("DAGCRON_BENCH_POOL", 64) as usize;
    let dir = tempfile::tempdir().unwrap();
    // Tasks run as an unprivileged user under root: they write here.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    // The databases are the server's files, hidden from tasks.
    let phases = [0, noisy].map(|n| dir.path().join(format!("phase-{n}")));
    for p in &phases {
        std::fs::create_dir_all(p).unwrap();
    }
    dagcron_exec::sandbox::enable(&phases, dagcron_exec::sandbox::TaskUser::nobody())
        .expect("the sandbox of shell tasks");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    println!(
        "beta: 1 every-second shell job; alpha: {noisy} every-second shell jobs; {secs} s a phase; pool of {pool}"
    );
    println!("| beta | runs measured | p50 | p99 | max | alpha's unfinished runs at the end |");
    println!("|---|---|---|---|---|---|");
    for n in [0, noisy] {
        let (late, backlog) = runtime.block_on(phase(dir.path(), n, secs, pool));
        println!(
            "| {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {} |",
            if n == 0 { "alone" } else { "beside alpha" },
            late.len(),
            percentile(&late, 0.5),
            percentile(&late, 0.99),
            late.last().copied().unwrap_or(f64::NAN),
            backlog
        );
    }
}
