//! Dispatch to remote agents over real gRPC on loopback: throughput (a burst
//! of no-op attempts) and latency (assignment sent to result received, at a
//! steady 1,000 attempts/s) with 1, 2 and 4 agents. The pool, the server and
//! the agents share one process and this machine's cores.
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

fn attempt(n: u64, report: mpsc::UnboundedSender<(u64, Instant)>) -> RemoteTask {
    RemoteTask {
        ctx: AttemptContext {
            namespace: "bench".into(),
            job: "j".into(),
            run_id: n as i64,
            task_id: "t".into(),
            attempt: 1,
            scheduled_at: jiff::Timestamp::now(),
            idempotency_key: n.to_string(),
            params: BTreeMap::new(),
        },
        executor: Executor::Noop,
        timeout: None,
        labels: BTreeMap::new(),
        max_output: 1024,
        cancel: CancellationToken::new(),
        live: None,
        report: Box::new(move |_| {
            let _ = report.send((n, Instant::now()));
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

async fn run(agents: usize) -> (f64, f64, f64, f64) {
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
                server: format!("http://{addr}"),
                agent_id: format!("a{i}"),
                labels: BTreeMap::new(),
                capacity: std::env::var("DAGCRON_BENCH_AGENT_CAPACITY")
                    .map_or(256, |c| c.parse().unwrap()),
                token: None,
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
        pool.submit(attempt(n, tx.clone()));
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
            pool.submit(attempt(next, tx.clone()));
            next += 1;
            continue;
        }
        let wait = if next < total {
            due.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(5)
        };
        if let Ok(Some((n, at))) = tokio::time::timeout(wait, rx.recv()).await {
            latencies.push((at - sent_at[n as usize]).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(f64::total_cmp);
    stop.cancel();
    (
        throughput,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        *latencies.last().unwrap(),
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| agents | burst of 20,000 no-op attempts (attempts/s) | latency at 1,000/s: p50 | p99 | max |"
    );
    println!("|---|---|---|---|---|");
    for agents in [1, 2, 4] {
        let (throughput, p50, p99, max) = rt.block_on(run(agents));
        println!("| {agents} | {throughput:.0} | {p50:.2} ms | {p99:.2} ms | {max:.2} ms |");
    }
}
