//! The engine under load, side by side with tokio-cron-scheduler and
//! APScheduler 3 on the same fire workload.
//!
//! Run with `scripts/bench-engine` (it installs APScheduler for Python), or
//! `cargo bench -p dagcron-runtime --bench engine` (it fails if Python
//! cannot import APScheduler, unless `DAGCRON_BENCH_APSCHEDULER=0` leaves
//! it out). `DAGCRON_BENCH_SCALES=1000,100000` limits the
//! registered-schedule scales (default 1000,100000,1000000; 10000000 works
//! too, and takes minutes). While iterating on registration and restart,
//! `DAGCRON_BENCH_ONLY=scales` runs the registered-schedule rows alone and
//! `DAGCRON_BENCH_WINDOW=0` skips their 10 s of fires (the fire columns
//! then read `-`).
//!
//! dagcron's figures are durable: every fire is a committed run on a real
//! SQLite file, every attempt a committed row. The peers keep nothing.

/// The allocator of the `dagcron` binary, which this benchmark stands for.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dagcron_core::model::RetrySpec;
use dagcron_core::model::Schedules;
use dagcron_core::{Concurrency, JobFile, JobSpec, Misfire, TaskSpec, TriggerRule};
use dagcron_runtime::{Engine, EngineConfig, EngineEvent, EngineHandle, Observer, SystemClock};
use dagcron_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

fn rss_mib() -> f64 {
    proc_status_mib("VmRSS:")
}

/// A memory figure of this process from /proc/self/status (VmRSS, VmHWM for the peak).
fn proc_status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn task(id: &str, deps: &[&str]) -> TaskSpec {
    TaskSpec {
        for_each: Default::default(),
        max_parallel: Default::default(),
        priority: Default::default(),
        id: id.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        trigger_rule: TriggerRule::AllSuccess,
        timeout: None,
        retry: None,
        on_exhausted: None,
        shell: None,
        http: None,
        wasm: None,
        noop: true,
        run_on: None,
        when: None,
        skip_on_exit_code: vec![],
    }
}

fn job(name: String, schedule: Option<String>, tasks: Vec<TaskSpec>) -> JobSpec {
    JobSpec {
        priority: Default::default(),
        name,
        schedule: schedule.map(Schedules::One),
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
        tasks,
    }
}

struct Probe {
    late_ms: Mutex<Vec<f64>>,
    fires: AtomicU64,
    attempts: AtomicU64,
}

async fn engine_at(
    dir: &std::path::Path,
    pool: usize,
) -> (EngineHandle, Arc<Probe>, CancellationToken) {
    engine_with(dir, pool, Instruments::default()).await
}

/// Which instruments the engine runs with.
#[derive(Clone, Copy, Default)]
struct Instruments {
    metrics: bool,
    traces: bool,
}

impl Instruments {
    fn name(self) -> &'static str {
        match (self.metrics, self.traces) {
            (false, false) => "off",
            (true, false) => "metrics",
            (false, true) => "traces",
            (true, true) => "metrics and traces",
        }
    }
}

/// A span sink as the server's OTLP exporter is: a bounded queue, drained
/// by a task of its own that makes the spans.
struct Queue(tokio::sync::mpsc::Sender<dagcron_runtime::trace::Ended>);

impl dagcron_runtime::trace::SpanSink for Queue {
    fn export(&self, ended: dagcron_runtime::trace::Ended) {
        let _ = self.0.try_send(ended);
    }
}

async fn engine_with(
    dir: &std::path::Path,
    pool: usize,
    instruments: Instruments,
) -> (EngineHandle, Arc<Probe>, CancellationToken) {
    let store = Arc::new(SqliteStore::open(&dir.join("bench.db")).await.unwrap());
    let probe = Arc::new(Probe {
        late_ms: Mutex::new(Vec::new()),
        fires: AtomicU64::new(0),
        attempts: AtomicU64::new(0),
    });
    let p = probe.clone();
    let observer = Observer(Arc::new(move |e| match e {
        EngineEvent::Fired { scheduled_at, at } => {
            p.fires.fetch_add(1, Ordering::Relaxed);
            let late = at.duration_since(scheduled_at).as_secs_f64() * 1000.0;
            p.late_ms.lock().unwrap().push(late);
        }
        EngineEvent::AttemptFinished => {
            p.attempts.fetch_add(1, Ordering::Relaxed);
        }
    }));
    let tracing = instruments.traces.then(|| {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<dagcron_runtime::trace::Ended>(8192);
        tokio::spawn(async move {
            let mut spans = Vec::new();
            while rx.recv_many(&mut spans, 512).await > 0 {
                for ended in spans.drain(..) {
                    std::hint::black_box(ended.span("bench"));
                }
            }
        });
        dagcron_runtime::trace::Tracing {
            sink: Arc::new(Queue(tx)),
            sampler: dagcron_runtime::trace::Sampler::AlwaysOn,
        }
    });
    let config = EngineConfig {
        pool_size: pool,
        misfire_grace: Duration::from_secs(3600),
        observer: Some(observer),
        metrics: instruments
            .metrics
            .then(|| Arc::new(dagcron_runtime::EngineMetrics::new(1000))),
        tracing,
        ..EngineConfig::default()
    };
    let (engine, handle) = Engine::start(store, Arc::new(SystemClock), config)
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(engine.run(shutdown.clone(), Duration::from_secs(1)));
    (handle, probe, shutdown)
}

/// `jobs` as a file of the benchmark's namespace.
fn bench_file(jobs: Vec<JobSpec>) -> JobFile {
    JobFile {
        namespace: "bench".into(),
        calendars: vec![],
        notifiers: vec![],
        notify: vec![],
        jobs,
    }
}

/// `n` one-task jobs, each firing once an hour at its own second (see [`hourly`]).
fn hourly_jobs(n: usize) -> impl Iterator<Item = JobSpec> {
    (0..n).map(move |i| job(format!("j{i}"), Some(hourly(i, n)), vec![task("a", &[])]))
}

/// Applies the specs in files of 20,000 jobs, made as they are applied (as
/// a user applying files one after another would), so that the memory
/// measured is the scheduler's, not the benchmark's.
async fn apply(handle: &EngineHandle, mut specs: impl Iterator<Item = JobSpec>) {
    loop {
        let chunk: Vec<JobSpec> = specs.by_ref().take(20_000).collect();
        if chunk.is_empty() {
            return;
        }
        let jobs = bench_file(chunk).validate().unwrap();
        handle.apply(jobs).await.unwrap();
    }
}

struct Row {
    fires: u64,
    attempts: u64,
    secs: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

/// The fire columns of a row whose window was skipped.
const NO_FIRES: &str = "- | - | - | -";

impl Row {
    /// Fires, p50, p99 and max lateness, as table columns.
    fn fire_columns(&self) -> String {
        format!(
            "{} | {:.2} ms | {:.2} ms | {:.2} ms",
            self.fires, self.p50, self.p99, self.max
        )
    }
}

async fn measure(probe: &Probe, secs: u64) -> Row {
    // Align to a second boundary, then count a whole window.
    probe.late_ms.lock().unwrap().clear();
    let (f0, a0) = (
        probe.fires.load(Ordering::Relaxed),
        probe.attempts.load(Ordering::Relaxed),
    );
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let secs = t0.elapsed().as_secs_f64();
    probe.row(f0, a0, secs)
}

impl Probe {
    /// The fires and attempts since the counts `f0` and `a0`, and the
    /// lateness of the fires since the list was last cleared.
    fn row(&self, f0: u64, a0: u64, secs: f64) -> Row {
        let mut late = self.late_ms.lock().unwrap().clone();
        late.sort_by(f64::total_cmp);
        Row {
            fires: self.fires.load(Ordering::Relaxed) - f0,
            attempts: self.attempts.load(Ordering::Relaxed) - a0,
            secs,
            p50: percentile(&late, 0.5),
            p99: percentile(&late, 0.99),
            max: late.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// Schedule `i` of `n` fires once an hour; the `n` schedules are spread
/// evenly over the hour, so that `n`/3600 fire each second.
fn hourly(i: usize, n: usize) -> String {
    let second_of_hour = i * 3600 / n;
    format!("{} {} * * * *", second_of_hour % 60, second_of_hour / 60)
}

async fn tokio_cron_scheduler(n: usize, every_second: bool, secs: u64) -> (u64, f64, f64, f64) {
    use tokio_cron_scheduler::{Job, JobScheduler};
    let late = Arc::new(Mutex::new(Vec::<f64>::new()));
    let rss0 = rss_mib();
    let sched = JobScheduler::new().await.unwrap();
    for i in 0..n {
        let l = late.clone();
        let expr = if every_second {
            "* * * * * *".to_string()
        } else {
            hourly(i, n)
        };
        let job = Job::new(expr.as_str(), move |_, _| {
            let now = jiff::Timestamp::now();
            l.lock()
                .unwrap()
                .push(f64::from(now.subsec_nanosecond()) / 1e6);
        })
        .unwrap();
        sched.add(job).await.unwrap();
    }
    sched.start().await.unwrap();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let rss = rss_mib() - rss0;
    let mut data = late.lock().unwrap().clone();
    let mut s = sched;
    let _ = s.shutdown().await;
    data.sort_by(f64::total_cmp);
    (
        data.len() as u64,
        percentile(&data, 0.5),
        percentile(&data, 0.99),
        rss,
    )
}

/// APScheduler's figures for `mode` (none only when left out on purpose
/// with `DAGCRON_BENCH_APSCHEDULER=0`). A peer the report names that
/// cannot run fails the benchmark: skipped silently, its rows went missing
/// from reports unnoticed (a script of `bench/` shadowed Python's `queue`).
fn apscheduler(mode: &str, n: usize, secs: u64) -> Option<serde_json::Value> {
    if std::env::var("DAGCRON_BENCH_APSCHEDULER").as_deref() == Ok("0") {
        return None;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/apscheduler_fire.py"
    );
    let out = std::process::Command::new("python3")
        .args([script, mode, &n.to_string(), &secs.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("APScheduler cannot run: python3: {e}"));
    assert!(
        out.status.success(),
        "APScheduler cannot run ({}): install it with `python3 -m pip install 'apscheduler>=3.11,<4'` (scripts/bench-engine does), or leave it out with DAGCRON_BENCH_APSCHEDULER=0",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
    Some(
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("APScheduler's figures cannot be read: {e}")),
    )
}

/// Runs one dagcron measurement in a child process (`mode` is the variable
/// that selects it: [`fresh_child`], [`restart_child`] or the
/// tokio-cron-scheduler run); prints its row.
fn in_child(mode: &str, dir: &std::path::Path, n: usize) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--bench")
        .env(mode, dir)
        .env("DAGCRON_BENCH_N", n.to_string())
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Whether the registered-schedule rows measure their 10 s of fires
/// (`DAGCRON_BENCH_WINDOW=0`: no, registration and restart alone).
fn fire_window() -> bool {
    std::env::var("DAGCRON_BENCH_WINDOW").map_or(true, |v| v != "0")
}

/// Registers `n` schedules spread over an hour, then measures their fires.
async fn fresh_child(dir: std::path::PathBuf, n: usize) {
    let rss0 = rss_mib();
    let (handle, probe, shutdown) = engine_at(&dir, 256).await;
    let t = Instant::now();
    apply(&handle, hourly_jobs(n)).await;
    let register = t.elapsed().as_secs_f64();
    let rss = rss_mib() - rss0;
    // The jobs applied first fire while the others are applied (those of
    // the current second of the hour, once applied).
    let during = probe.row(0, 0, register);
    println!(
        "| {n} | dagcron, fires while registering | - | - | {} |",
        during.fire_columns()
    );
    if fire_window() {
        // Let the database settle (the WAL checkpoint after a large apply).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let row = measure(&probe, 10).await;
        println!(
            "| {n} | dagcron (durable) | {register:.1} | {rss:.0} | {} |",
            row.fire_columns()
        );
    } else {
        let peak = proc_status_mib("VmHWM:") - rss0;
        println!(
            "| {n} | dagcron (durable, peak {peak:.0} MiB) | {register:.1} | {rss:.0} | {NO_FIRES} |"
        );
    }
    shutdown.cancel();
    drop(handle);
    // Let the engine stop before the process ends.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Where registering `n` schedules spends its time, stage by stage, each
/// timed on its own, one file of 20,000 jobs after another (as [`apply`]
/// makes them): validating the file, making each job's upsert (its
/// canonical JSON, timing and rules), and the floor of the store's part:
/// the same rows written by the same statements in a plain rusqlite loop,
/// one transaction per file, on a database of the store's schema.
async fn register_limit(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("register.db");
    drop(SqliteStore::open(&path).await.unwrap());
    tokio::task::spawn_blocking(move || register_limit_loop(&path, n))
        .await
        .unwrap();
}

fn register_limit_loop(path: &std::path::Path, n: usize) {
    use rusqlite::params;
    let mut conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA cache_size = -65536; PRAGMA wal_autocheckpoint = 16384;",
    )
    .unwrap();
    let at = jiff::Timestamp::now().as_microsecond();
    let (mut validate, mut upsert, mut write) = (0.0, 0.0, 0.0);
    let mut specs = hourly_jobs(n);
    loop {
        let chunk: Vec<JobSpec> = specs.by_ref().take(20_000).collect();
        if chunk.is_empty() {
            break;
        }
        let t = Instant::now();
        let file = bench_file(chunk).validate().unwrap();
        validate += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let upserts: Vec<dagcron_store::JobUpsert> =
            file.iter().map(dagcron_store::JobUpsert::of).collect();
        upsert += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        {
            let mut insert = tx.prepare_cached("INSERT INTO jobs (namespace, name, version, timing, paused, updated_at, rules) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)").unwrap();
            let mut version = tx.prepare_cached("INSERT OR REPLACE INTO job_versions (namespace, name, version, spec, created_at, applied_by, applied_by_name, rollback_of, rules) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)").unwrap();
            let rules = upserts[0].rules.as_ref().map(|r| r.to_json());
            for j in &upserts {
                insert
                    .execute(params![j.namespace, j.name, 1, j.timing, false, at, rules])
                    .unwrap();
                version
                    .execute(params![
                        j.namespace,
                        j.name,
                        1,
                        j.spec,
                        at,
                        None::<String>,
                        None::<String>,
                        None::<i64>,
                        rules
                    ])
                    .unwrap();
            }
        }
        tx.commit().unwrap();
        write += t.elapsed().as_secs_f64();
    }
    println!(
        "| {n} | validate {validate:.2} s | upserts {upsert:.2} s | rows in a plain rusqlite loop {write:.2} s |"
    );
}

/// The same schedules after a restart: the engine reads the jobs back from
/// the database.
async fn restart_child(dir: std::path::PathBuf, n: String) {
    let rss0 = rss_mib();
    let t = Instant::now();
    let (handle, probe, shutdown) = engine_at(&dir, 256).await;
    let start = t.elapsed().as_secs_f64();
    let rss = rss_mib() - rss0;
    let fires = if fire_window() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        measure(&probe, 10).await.fire_columns()
    } else {
        NO_FIRES.to_string()
    };
    let peak = proc_status_mib("VmHWM:") - rss0;
    println!(
        "| {n} | dagcron, restarted (peak {peak:.0} MiB) | {start:.1} (start) | {rss:.0} | {fires} |"
    );
    shutdown.cancel();
    drop(handle);
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with `cargo bench -p dagcron-runtime --bench engine`");
        return;
    }
    let n = std::env::var("DAGCRON_BENCH_N").unwrap_or_default();
    let child = |future| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(future)
    };
    if let Ok(dir) = std::env::var("DAGCRON_BENCH_FRESH") {
        let n = n.parse().expect("a number");
        return child(
            Box::pin(fresh_child(dir.into(), n)) as std::pin::Pin<Box<dyn Future<Output = ()>>>
        );
    }
    if std::env::var("DAGCRON_BENCH_TOKIO_CRON").is_ok() {
        let n: usize = n.parse().expect("a number");
        return child(Box::pin(async move {
            let (fires, p50, p99, rss) = tokio_cron_scheduler(n, false, 10).await;
            println!(
                "| {n} | tokio-cron-scheduler | - | {rss:.0} | {fires} | {p50:.2} ms | {p99:.2} ms | - |"
            );
        }));
    }
    if let Ok(dir) = std::env::var("DAGCRON_BENCH_RESTART") {
        return child(Box::pin(restart_child(dir.into(), n)));
    }
    let scales: Vec<usize> = std::env::var("DAGCRON_BENCH_SCALES")
        .unwrap_or_else(|_| "1000,100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("a number"))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // `DAGCRON_BENCH_ONLY=burst` runs the burst alone (for profiling);
    // `DAGCRON_BENCH_ONLY=instruments` the cost of metrics and traces alone.
    let only = std::env::var("DAGCRON_BENCH_ONLY").unwrap_or_default();
    if only == "instruments" {
        return rt.block_on(instruments());
    }
    if only == "register-limit" {
        let n = n.parse().unwrap_or(1_000_000);
        return rt.block_on(register_limit(n));
    }
    let only_burst = only == "burst";
    let only_scales = only == "scales";
    rt.block_on(async {
      if !only_burst {
        println!("## Engine: dagcron vs tokio-cron-scheduler vs APScheduler 3\n");
        println!("### Registered schedules, each firing once an hour at a distinct second (N/3600 fires/s), one no-op task each\n");
        println!("| N | scheduler | register (s) | RSS added (MiB) | fires in 10 s | p50 lateness | p99 lateness | max |");
        println!("|---|---|---|---|---|---|---|---|");
        for &n in &scales {
            // dagcron in processes of its own (the peers' leftovers must not
            // disturb it): one registers the schedules, a second restarts on
            // the same database.
            let dir = tempfile::tempdir().unwrap();
            in_child("DAGCRON_BENCH_FRESH", dir.path(), n);
            in_child("DAGCRON_BENCH_RESTART", dir.path(), n);
            if n <= 100_000 {
                // In a process of its own too: it may leave tasks behind.
                in_child("DAGCRON_BENCH_TOKIO_CRON", dir.path(), n);
                if let Some(v) = apscheduler("hourly", n, 10) {
                    println!("| {n} | APScheduler 3 | - | {:.0} (max RSS) | {} | {:.2} ms | {:.2} ms | {:.2} ms |", v["rss_mib"].as_f64().unwrap_or(f64::NAN), v["fires"], v["p50_ms"].as_f64().unwrap_or(f64::NAN), v["p99_ms"].as_f64().unwrap_or(f64::NAN), v["max_ms"].as_f64().unwrap_or(f64::NAN));
                }
            }
        }

        if only_scales {
            return;
        }
        println!("\n### 1,000 schedules firing every second, one no-op task each (10 s)\n");
        println!("| scheduler | fires/s | attempts completed/s | p50 lateness | p99 lateness |");
        println!("|---|---|---|---|---|");
        let row = every_second(Instruments::default()).await;
        println!("| dagcron (durable) | {:.0} | {:.0} | {:.2} ms | {:.2} ms |", row.fires as f64 / row.secs, row.attempts as f64 / row.secs, row.p50, row.p99);
        let (fires, p50, p99, _) = tokio_cron_scheduler(1000, true, 10).await;
        println!("| tokio-cron-scheduler | {:.0} | - | {p50:.2} ms | {p99:.2} ms |", fires as f64 / 10.0);
        if let Some(v) = apscheduler("every-second", 1000, 10) {
            println!("| APScheduler 3 | {:.0} | - | {:.2} ms | {:.2} ms |", v["fires_per_s"].as_f64().unwrap_or(f64::NAN), v["p50_ms"].as_f64().unwrap_or(f64::NAN), v["p99_ms"].as_f64().unwrap_or(f64::NAN));
        }

      }
        println!("\n### A burst of manual triggers of a 3-task DAG of no-op tasks (durable on SQLite)\n");
        let (triggers, secs) = burst(Instruments::default()).await;
        let burst_rate = 3.0 * triggers as f64 / secs;
        println!("{triggers} runs, {} attempts in {secs:.2} s: {:.0} runs/s, {burst_rate:.0} attempts completed/s", 3 * triggers, triggers as f64 / secs);
        let (runs, limit_secs) = limit(triggers, triggers).await;
        let limit_rate = 3.0 * runs as f64 / limit_secs;
        println!("limit (the same rows and statements in a plain rusqlite loop, one transaction per step of all runs): {} attempts in {limit_secs:.2} s: {limit_rate:.0} attempts/s; the burst is {:.2}x of it", 3 * runs, burst_rate / limit_rate);
        let (runs, pool_secs) = limit(triggers, 256).await;
        let pool_rate = 3.0 * runs as f64 / pool_secs;
        println!("the same loop, one transaction per step of 256 runs at a time (the engine's pool): {pool_secs:.2} s: {pool_rate:.0} attempts/s; the burst is {:.2}x of it", burst_rate / pool_rate);
    });
}

/// 1,000 schedules firing every second, one no-op task each, for 10 s.
async fn every_second(instruments: Instruments) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let (handle, probe, shutdown) = engine_with(dir.path(), 256, instruments).await;
    apply(
        &handle,
        (0..1000).map(|i| {
            job(
                format!("s{i}"),
                Some("* * * * * *".into()),
                vec![task("a", &[])],
            )
        }),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let row = measure(&probe, 10).await;
    shutdown.cancel();
    row
}

/// 10,000 manual triggers at once of a 3-task DAG of no-op tasks: the
/// runs, and the seconds until their 30,000 attempts have completed.
async fn burst(instruments: Instruments) -> (u64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let (handle, probe, shutdown) = engine_with(dir.path(), 256, instruments).await;
    apply(
        &handle,
        std::iter::once(job(
            "dag".into(),
            None,
            vec![task("a", &[]), task("b", &["a"]), task("c", &["b"])],
        )),
    )
    .await;
    let triggers = 10_000;
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..triggers {
        let h = handle.clone();
        set.spawn(async move { h.trigger("bench", "dag", BTreeMap::new()).await.unwrap() });
    }
    while set.join_next().await.is_some() {}
    while probe.attempts.load(Ordering::Relaxed) < 3 * triggers {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    shutdown.cancel();
    (triggers, secs)
}

/// The limit of the burst: the rows and statements the engine's SQLite
/// writer commits for `n` runs of the burst's 3-task DAG (see
/// `dagcron-store-sqlite`'s `writer.rs`: a batch planned, each task's
/// successive changes in it merged into one compare-and-set, a new run's
/// tasks inserted in the state the batch's changes leave them in), written
/// by a plain rusqlite loop (no engine, no async) on a fresh database made
/// by the store's own migrations, with the writer's pragmas, batched as
/// perfectly as a 3-task chain allows: one transaction per step of all
/// runs. Step 1 inserts each run (`running`) and its 3 tasks, `a` already
/// `running` (its `pending -> ready -> dispatching -> running` folded into
/// the insert), and `a`'s attempt; steps 2 and 3 end the attempt of the
/// task before (`succeeded`, and its task), move the next task from
/// `pending` to `running` (one compare-and-set) and insert its attempt;
/// step 4 ends the last attempt, its task and the run. Every
/// compare-and-set checks that it changed its row. With `chunk` below `n`,
/// the runs go through the four steps `chunk` at a time (the engine's
/// batches hold at most its pool's attempts). Returns the runs and the
/// seconds of the transactions.
async fn limit(n: u64, chunk: u64) -> (u64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limit.db");
    drop(SqliteStore::open(&path).await.unwrap());
    let secs = tokio::task::spawn_blocking(move || limit_loop(&path, n, chunk))
        .await
        .unwrap();
    (n, secs)
}

fn limit_loop(path: &std::path::Path, n: u64, chunk: u64) -> f64 {
    use rusqlite::params;
    let mut conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
    )
    .unwrap();
    conn.set_prepared_statement_cache_capacity(64);
    let tasks = ["a", "b", "c"];
    let now = || jiff::Timestamp::now().as_microsecond();
    let first = now();
    let set_task = |tx: &rusqlite::Transaction<'_>, run: i64, task: &str, from: &str, to: &str| {
        let changed = tx
            .prepare_cached(
                "UPDATE tasks SET state = ?1 WHERE run_id = ?2 AND task_id = ?3 AND state = ?4",
            )
            .unwrap()
            .execute(params![to, run, task, from])
            .unwrap();
        assert_eq!(changed, 1);
    };
    let attempt = |tx: &rusqlite::Transaction<'_>, run: i64, task: &str, at: i64| {
        let inserted = tx
            .prepare_cached("INSERT INTO attempts (run_id, task_id, number, state, started_at) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING")
            .unwrap()
            .execute(params![run, task, 1, "running", at])
            .unwrap();
        assert_eq!(inserted, 1);
    };
    let end = |tx: &rusqlite::Transaction<'_>, run: i64, task: &str, at: i64| {
        let log: Vec<u8> = vec![];
        let changed = tx
            .prepare_cached(
                "UPDATE attempts SET state = ?1, finished_at = ?2, exit_code = ?3, error = ?4, log = ?5, start_error_us = ?10
                 WHERE run_id = ?6 AND task_id = ?7 AND number = ?8 AND state = ?9",
            )
            .unwrap()
            .execute(params!["succeeded", at, None::<i32>, None::<String>, log, run, task, 1, "running", None::<i64>])
            .unwrap();
        assert_eq!(changed, 1);
        set_task(tx, run, task, "running", "succeeded");
    };
    let t = Instant::now();
    for (from, to) in (0..n)
        .step_by(chunk as usize)
        .map(|i| (first + i as i64, first + (i + chunk).min(n) as i64))
    {
        for step in 0..4 {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .unwrap();
            for run in from..to {
                let at = now();
                if step == 0 {
                    let params_json =
                        serde_json::to_string(&BTreeMap::<String, String>::new()).unwrap();
                    tx.prepare_cached(
                    "INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at, trace, rerun_of)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                )
                .unwrap()
                .execute(params![run, "bench", "dag", 1, "manual", at, "running", params_json, at, Some(at), None::<i64>, None::<String>, None::<i64>])
                .unwrap();
                    let mut insert = tx
                    .prepare_cached("INSERT INTO tasks (run_id, task_id, position, state, carried) VALUES (?1, ?2, ?3, ?4, ?5)")
                    .unwrap();
                    for (position, task) in tasks.iter().enumerate() {
                        let state = if position == 0 { "running" } else { "pending" };
                        insert
                            .execute(params![run, task, position as i64, state, false])
                            .unwrap();
                    }
                    drop(insert);
                    attempt(&tx, run, tasks[0], at);
                } else {
                    end(&tx, run, tasks[step - 1], at);
                    if step < 3 {
                        set_task(&tx, run, tasks[step], "pending", "running");
                        attempt(&tx, run, tasks[step], at);
                    } else {
                        let changed = tx
                        .prepare_cached(
                            "UPDATE runs SET state = ?1, started_at = COALESCE(?2, started_at), finished_at = COALESCE(?3, finished_at)
                             WHERE id = ?4 AND state = ?5",
                        )
                        .unwrap()
                        .execute(params!["succeeded", None::<i64>, at, run, "running"])
                        .unwrap();
                        assert_eq!(changed, 1);
                    }
                }
            }
            tx.commit().unwrap();
        }
    }
    t.elapsed().as_secs_f64()
}

/// Fires/s and lateness of 1,000 every-second schedules (10 s), then a
/// burst of 10,000 triggers of a 3-task DAG, with metrics and traces off
/// and on, three times each in turns, in one sitting.
async fn instruments() {
    println!(
        "\n### The cost of metrics and traces (1,000 every-second schedules for 10 s; a burst of 10,000 runs of a 3-task DAG)\n"
    );
    println!("| round | instruments | fires/s | p50 lateness | p99 lateness | burst attempts/s |");
    println!("|---|---|---|---|---|---|");
    let variants = [
        Instruments::default(),
        Instruments {
            metrics: true,
            traces: false,
        },
        Instruments {
            metrics: true,
            traces: true,
        },
    ];
    for round in 1..=3 {
        for instruments in variants {
            let row = every_second(instruments).await;
            let (triggers, secs) = burst(instruments).await;
            let burst = 3.0 * triggers as f64 / secs;
            println!(
                "| {round} | {} | {:.0} | {:.2} ms | {:.2} ms | {burst:.0} |",
                instruments.name(),
                row.fires as f64 / row.secs,
                row.p50,
                row.p99
            );
        }
    }
}
