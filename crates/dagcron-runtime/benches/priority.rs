//! Priorities under saturation, on a real engine, a real SQLite file and
//! real shell processes: a pool of `DAGCRON_BENCH_POOL` slots (4) is handed
//! a backlog of `DAGCRON_BENCH_BULK` runs (40) of 10 tasks of 50 ms each at
//! the default priority; while it drains, one urgent run (one 50 ms task)
//! is triggered every 100 ms, `DAGCRON_BENCH_URGENT` times (40). Reported:
//! how long the urgent task waited for a slot (from its run's creation to
//! its attempt's start), p50, p99 and max, and how long the whole backlog
//! took, with the urgent job at priority 50 and again with every job at the
//! default (the same run without priorities).
//!
//! Run: `cargo bench -p dagcron-runtime --bench priority`

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dagcron_core::{JobFile, RunState};
use dagcron_runtime::{Engine, EngineConfig, SystemClock};
use dagcron_store::prelude::*;
use dagcron_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

struct Outcome {
    waits_ms: Vec<f64>,
    backlog_s: f64,
}

async fn pass(priority: i32, pool: usize, bulk: usize, urgent: usize) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(&dir.path().join("bench.db"))
            .await
            .unwrap(),
    );
    let config = EngineConfig {
        pool_size: pool,
        ..EngineConfig::default()
    };
    let (engine, handle) = Engine::start(store.clone(), Arc::new(SystemClock), config)
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(engine.run(shutdown.clone(), Duration::from_secs(1)));
    let tasks: String = (0..10)
        .map(|i| format!("      - {{ id: t{i}, shell: 'sleep 0.05' }}\n"))
        .collect();
    let yaml = format!(
        "namespace: bench\njobs:\n  - name: bulk\n    concurrency: allow\n    max_active_runs: 1000\n    tasks:\n{tasks}  - name: urgent\n    concurrency: allow\n    max_active_runs: 1000\n    priority: {priority}\n    tasks:\n      - {{ id: now, shell: 'sleep 0.05' }}\n"
    );
    let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
    handle.apply(file.validate().unwrap()).await.unwrap();
    let started = Instant::now();
    let backlog = handle
        .trigger_runs("bench", "bulk", vec![BTreeMap::new(); bulk], None, None)
        .await
        .unwrap();
    let mut urgent_runs = Vec::new();
    for _ in 0..urgent {
        tokio::time::sleep(Duration::from_millis(100)).await;
        urgent_runs.push(
            handle
                .trigger("bench", "urgent", BTreeMap::new())
                .await
                .unwrap(),
        );
    }
    let ended = async |id| {
        store
            .get_run(id)
            .await
            .unwrap()
            .is_some_and(|r| r.state != RunState::Running && r.state != RunState::Pending)
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut backlog_s = 0.0;
    for run in &backlog {
        while !ended(run.id).await {
            assert!(
                Instant::now() < deadline,
                "the backlog did not drain in 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        backlog_s = started.elapsed().as_secs_f64();
    }
    let mut waits_ms = Vec::new();
    for id in urgent_runs {
        while !ended(id).await {
            assert!(
                Instant::now() < deadline,
                "an urgent run did not end in 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = store.get_run(id).await.unwrap().unwrap();
        assert_eq!(r.state, RunState::Succeeded, "{r:?}");
        let attempt = &r.tasks[0].attempts[0];
        waits_ms.push(
            attempt
                .started_at
                .duration_since(r.created_at)
                .as_secs_f64()
                * 1000.0,
        );
    }
    waits_ms.sort_by(f64::total_cmp);
    shutdown.cancel();
    let _ = running.await;
    Outcome {
        waits_ms,
        backlog_s,
    }
}

fn main() {
    let (pool, bulk, urgent) = (
        env("DAGCRON_BENCH_POOL", 4),
        env("DAGCRON_BENCH_BULK", 40),
        env("DAGCRON_BENCH_URGENT", 40),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!(
        "pool {pool}, backlog {bulk} runs x 10 tasks of 50 ms, {urgent} urgent runs one every 100 ms"
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>12}",
        "urgent job", "wait p50", "wait p99", "wait max", "backlog took"
    );
    let mut rows = Vec::new();
    for (label, priority) in [("priority 0 (no priorities)", 0), ("priority 50", 50)] {
        let o = rt.block_on(pass(priority, pool, bulk, urgent));
        println!(
            "{label:<28} {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>11.1}s",
            percentile(&o.waits_ms, 0.5),
            percentile(&o.waits_ms, 0.99),
            o.waits_ms.last().unwrap(),
            o.backlog_s
        );
        rows.push(o);
    }
    let ratio =
        |p: f64| percentile(&rows[0].waits_ms, p) / percentile(&rows[1].waits_ms, p).max(0.001);
    println!(
        "with priorities the urgent task waits {:.0}x less at p50, {:.0}x less at p99; the backlog takes {:.2}x as long",
        ratio(0.5),
        ratio(0.99),
        rows[1].backlog_s / rows[0].backlog_s
    );
}
