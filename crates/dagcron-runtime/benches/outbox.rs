//! The outbox, measured on a real SQLite file and a real receiver on
//! loopback:
//!
//! 1. **Delivery**: notifications delivered per second to a receiver that
//!    answers at once, by one outbox and by two side by side (two nodes of
//!    one database), and that each was received once.
//! 2. **Firing beside a receiver that hangs**: the lateness of every-second
//!    fires (from the scheduled instant to the run's creation) with no
//!    notification rules, and with every run's end notified to a receiver
//!    that accepts connections and never answers.
//!
//! Run: `cargo bench -p dagcron-runtime --bench outbox`
//! (`DAGCRON_BENCH_NOTES=5000` notifications, `DAGCRON_BENCH_JOBS=200`
//! every-second jobs, `DAGCRON_BENCH_SECS=15` a firing phase).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dagcron_core::JobFile;
use dagcron_runtime::{Engine, EngineConfig, Outbox, OutboxConfig, OutboxMetrics, SystemClock};
use dagcron_store::prelude::*;
use dagcron_store::{NewNotification, Write};
use dagcron_store_sqlite::SqliteStore;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// A receiver that answers 200 at once; counts what it got.
async fn answering() -> (String, Arc<AtomicU64>) {
    let got = Arc::new(AtomicU64::new(0));
    let count = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::Relaxed);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

/// A receiver that accepts connections and never answers.
async fn hanging() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

fn outbox(store: &Arc<SqliteStore>, owner: &str, wake: Arc<Notify>) -> Outbox<SqliteStore> {
    Outbox::new(
        store.clone(),
        Arc::new(SystemClock),
        OutboxConfig {
            owner: owner.into(),
            ..OutboxConfig::default()
        },
        None,
        None,
        OutboxMetrics::default(),
        wake,
    )
}

/// Delivers `n` notifications with `nodes` outboxes side by side; the
/// rate, and how many the receiver got.
async fn deliver(dir: &Path, n: u64, nodes: usize) -> (f64, u64) {
    let store = Arc::new(
        SqliteStore::open(&dir.join(format!("deliver-{nodes}.db")))
            .await
            .unwrap(),
    );
    let (url, got) = answering().await;
    let channel = serde_json::json!({ "name": "hook", "webhook": { "url": url } }).to_string();
    let at = jiff::Timestamp::now();
    let writes: Vec<Write> = (0..n)
        .map(|i| {
            Write::Notify(NewNotification {
                key: format!("bench/j/run-{i}/failed/hook"),
                namespace: "bench".into(),
                job: "j".into(),
                run: Some(i as i64),
                event: "failed".into(),
                notifier: "hook".into(),
                channel: channel.clone(),
                payload: format!(r#"{{"schema":"dagcron.notification/v1","id":"bench/j/run-{i}/failed/hook","event":"failed","at":"{at}","namespace":"bench","job":"j","run":{{"id":{i},"state":"failed","trigger":"schedule","scheduled_at":"{at}"}}}}"#),
                at,
            })
        })
        .collect();
    for chunk in writes.chunks(500) {
        store.write(chunk).await.unwrap();
    }
    let started = Instant::now();
    let outboxes: Vec<_> = (0..nodes)
        .map(|i| outbox(&store, &format!("node-{i}"), Arc::new(Notify::new())))
        .collect();
    let mut passes = Vec::new();
    for o in &outboxes {
        passes.push(async move { while o.pass().await.unwrap() > 0 {} });
    }
    futures_util::future::join_all(passes).await;
    let took = started.elapsed().as_secs_f64();
    (n as f64 / took, got.load(Ordering::Relaxed))
}

/// Every-second jobs for `secs`, their ends notified to a hanging receiver
/// or not; the lateness of their fires in milliseconds.
async fn firing(dir: &Path, jobs: u64, secs: u64, notify: Option<&str>) -> Vec<f64> {
    let name = if notify.is_some() {
        "notified"
    } else {
        "plain"
    };
    let store = Arc::new(
        SqliteStore::open(&dir.join(format!("fire-{name}.db")))
            .await
            .unwrap(),
    );
    let wake = Arc::new(Notify::new());
    let config = EngineConfig {
        misfire_grace: Duration::from_secs(3600),
        outbox: Some(wake.clone()),
        ..EngineConfig::default()
    };
    let (engine, handle) = Engine::start(store.clone(), Arc::new(SystemClock), config)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(engine.run(stop.clone(), Duration::from_secs(1)));
    let delivering = tokio::spawn(outbox(&store, "node", wake).run(stop.clone()));
    let mut yaml = String::from("namespace: bench\n");
    if let Some(url) = notify {
        yaml.push_str(&format!(
            "notifiers: [{{ name: hook, webhook: {{ url: \"{url}\" }} }}]\nnotify: [{{ on: [succeeded, failed], to: [hook] }}]\n"
        ));
    }
    yaml.push_str("jobs:\n");
    for i in 0..jobs {
        yaml.push_str(&format!(
            "  - {{ name: j{i}, schedule: \"* * * * * *\", misfire: skip, tasks: [{{ id: t, noop: true }}] }}\n"
        ));
    }
    let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
    handle.apply(file.validate().unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.cancel();
    let _ = running.await;
    let _ = delivering.await;
    let mut late = Vec::new();
    for i in 0..jobs {
        let page = store
            .list_runs("bench", &format!("j{i}"), 10_000, None)
            .await
            .unwrap();
        late.extend(
            page.items
                .iter()
                .map(|r| r.created_at.duration_since(r.scheduled_at).as_secs_f64() * 1000.0),
        );
    }
    late.sort_by(f64::total_cmp);
    late
}

fn main() {
    let notes = env("DAGCRON_BENCH_NOTES", 5000);
    let jobs = env("DAGCRON_BENCH_JOBS", 200);
    let secs = env("DAGCRON_BENCH_SECS", 15);
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        println!("Delivery: {notes} notifications on SQLite to a receiver on loopback answering 200");
        println!("| outboxes | notifications/s | received |");
        println!("|---|---|---|");
        for nodes in [1, 2] {
            let (rate, got) = deliver(dir.path(), notes, nodes).await;
            println!("| {nodes} | {rate:.0} | {got} of {notes} |");
        }
        println!();
        println!("Firing: {jobs} every-second jobs for {secs} s; lateness from the instant to the run's creation");
        println!("| notifications | runs | p50 | p99 | max |");
        println!("|---|---|---|---|---|");
        let url = hanging().await;
        for (what, notify) in [("none", None), ("every end, to a receiver that hangs", Some(url.as_str()))] {
            let late = firing(dir.path(), jobs, secs, notify).await;
            println!(
                "| {what} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
                late.len(),
                percentile(&late, 0.5),
                percentile(&late, 0.99),
                late.last().copied().unwrap_or(f64::NAN)
            );
        }
    });
}
