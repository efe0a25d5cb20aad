//! Dispatch to remote agents over real gRPC on loopback: throughput (a burst
//! of no-op attempts) and latency (assignment sent to result received, at a
//! steady 1,000 attempts/s) with 1, 2 and 4 agents, and the start error of
//! timed instructions (sent 100 ms ahead of their instant, 200 a second; the
//! agent reports how far from the instant it started them). The pool, the
//! server and the agents share one process and this machine's cores.
//!
//! Run: `cargo bench -p dagcron-agents --bench dispatch`
//! (`DAGCRON_BENCH_AGENT_CAPACITY` sets each agent's capacity, default 256).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dagcron_agents::agent::{self, AgentConfig};
use dagcron_agents::{AgentPool, PoolConfig};
use dagcron_core::Executor;
use dagcron_exec::AttemptContext;
use dagcron_runtime::{Remote, RemoteTask};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

type Report = mpsc::UnboundedSender<(u64, Instant, Option<i64>)>;

fn attempt(n: u64, report: Report, start_at: Option<jiff::Timestamp>) -> RemoteTask {
    RemoteTask {
        priority: Default::default(),
        ready_us: Default::default(),
        ctx: AttemptContext {
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
        },
        executor: Executor::Noop,
        timeout: None,
        start_at,
        labels: BTreeMap::new(),
        max_output: 1024,
        cancel: CancellationToken::new(),
        live: None,
        report: Box::new(move |o, _| {
            let _ = report.send((n, Instant::now(), o.start_error_us));
        }),
    }
}

/// Accepted connections with Nagle's algorithm off, as `axum::serve` does.
fn async_stream_nodelay(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        let s = s?;
        s.set_nodelay(true)?;
        Ok(s)
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Figures {
    throughput: f64,
    /// Dispatch latency at 1,000/s, ms: p50, p99, max.
    latency: [f64; 3],
    /// Start error of timed instructions, µs (absolute): p50, p99, max.
    start_error: [f64; 3],
}

async fn run(agents: usize) -> Figures {
    let pool = AgentPool::new(PoolConfig::default());
    let stop = CancellationToken::new();
    pool.start(stop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = pool.service();
    let server_stop = stop.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                async_stream_nodelay(listener),
                server_stop.cancelled_owned(),
            )
            .await
            .unwrap();
    });
    for i in 0..agents {
        tokio::spawn(agent::run(
            AgentConfig {
                servers: vec![format!("http://{addr}")],
                agent_id: format!("a{i}"),
                labels: BTreeMap::new(),
                capacity: std::env::var("DAGCRON_BENCH_AGENT_CAPACITY")
                    .map_or(256, |c| c.parse().unwrap()),
                token: None,
                ca: None,
                identity: None,
            },
            stop.clone(),
        ));
    }
    while pool.workers().len() < agents {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pool: Arc<dyn Remote> = Arc::new(pool);

    // Throughput: a burst.
    let burst = 20_000u64;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    for n in 0..burst {
        pool.submit(attempt(n, tx.clone(), None));
    }
    for _ in 0..burst {
        rx.recv().await.unwrap();
    }
    let throughput = burst as f64 / start.elapsed().as_secs_f64();

    // Latency at a steady 1,000 attempts/s for 5 s.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let total = 5_000u64;
    let mut sent_at = vec![Instant::now(); total as usize];
    let begin = Instant::now();
    let mut latencies = Vec::with_capacity(total as usize);
    let mut next = 0u64;
    while latencies.len() < total as usize {
        let due = begin + Duration::from_micros(next * 1000);
        if next < total && Instant::now() >= due {
            sent_at[next as usize] = Instant::now();
            pool.submit(attempt(next, tx.clone(), None));
            next += 1;
            continue;
        }
        let wait = if next < total {
            due.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(5)
        };
        if let Ok(Some((n, at, _))) = tokio::time::timeout(wait, rx.recv()).await {
            latencies.push((at - sent_at[n as usize]).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(f64::total_cmp);

    // Timed instructions: 1,000, each sent 100 ms ahead of its instant, 200 a second.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let timed = 1_000u64;
    for n in 0..timed {
        let at = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(100);
        pool.submit(attempt(n, tx.clone(), Some(at)));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut errors = Vec::with_capacity(timed as usize);
    for _ in 0..timed {
        let (_, _, error) = rx.recv().await.unwrap();
        errors.push(
            error
                .expect("a timed attempt reports its start error")
                .abs() as f64,
        );
    }
    errors.sort_by(f64::total_cmp);
    stop.cancel();
    let spread = |v: &[f64]| [percentile(v, 0.5), percentile(v, 0.99), *v.last().unwrap()];
    Figures {
        throughput,
        latency: spread(&latencies),
        start_error: spread(&errors),
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| agents | burst of 20,000 no-op attempts (attempts/s) | latency at 1,000/s: p50 | p99 | max | start error of timed instructions: p50 | p99 | max |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for agents in [1, 2, 4] {
        let f = rt.block_on(run(agents));
        let [p50, p99, max] = f.latency;
        let [e50, e99, emax] = f.start_error;
        println!(
            "| {agents} | {:.0} | {p50:.2} ms | {p99:.2} ms | {max:.2} ms | {e50:.0} µs | {e99:.0} µs | {emax:.0} µs |",
            f.throughput
        );
    }
}
