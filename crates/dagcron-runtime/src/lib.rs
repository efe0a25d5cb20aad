//! dagcron's runtime: the engine that turns schedules into durable runs and
//! runs their tasks, the clock it depends on, and the coordinator that makes
//! it one node of a cluster.

pub mod clock;
pub mod cluster;
pub mod engine;
pub mod metrics;
pub mod prune;
pub mod trace;

pub use clock::{Clock, ManualClock, SystemClock};
pub use cluster::{ClusterConfig, ClusterHandle, Coordinator, LocalStatus};
pub use engine::{
    Engine, EngineConfig, EngineError, EngineEvent, EngineHandle, Intervened, Lease,
    MAX_TRIGGER_RUNS, NodeIdentity, Observer, Ownership, Remote, RemoteTask, RemoteWorkers, Report,
    Resolved, SecretSource, Secrets,
};
pub use metrics::{EngineGauges, EngineMetrics};
pub use prune::{PruneConfig, PruneMetrics, PruneReport, Pruner};

#[allow(missing_docs)]
pub mod diag {
    use jiff::Timestamp;
    use std::sync::Mutex;
    use std::time::Instant;
    pub struct D {
        pub woke: Option<Timestamp>,
        pub iters: std::collections::VecDeque<(&'static str, Instant, f64)>,
        pub fires: Vec<(f64, f64, String)>,
    }
    pub static DIAG: Mutex<Option<D>> = Mutex::new(None);
    pub static ACC: [std::sync::atomic::AtomicU64; 6] =
        [const { std::sync::atomic::AtomicU64::new(0) }; 6];
    pub fn acc(i: usize, t: &mut Instant) {
        let n = Instant::now();
        ACC[i].fetch_add(
            (n - *t).as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        *t = n;
    }
    pub fn woke() {
        if let Some(d) = DIAG.lock().unwrap().as_mut() {
            d.woke = Some(Timestamp::now());
        }
    }
    pub fn iteration(branch: &'static str, start: Instant) {
        if let Some(d) = DIAG.lock().unwrap().as_mut() {
            d.iters
                .push_back((branch, start, start.elapsed().as_secs_f64() * 1e6));
            if d.iters.len() > 32 {
                d.iters.pop_front();
            }
        }
    }
    pub fn fire(at: Timestamp) {
        if let Some(d) = DIAG.lock().unwrap().as_mut() {
            let now = Timestamp::now();
            let woke = d.woke.unwrap_or(now);
            let w = woke.duration_since(at).as_secs_f64() * 1e6;
            let f = now.duration_since(at).as_secs_f64() * 1e6;
            let ctx = if w > 300.0 {
                let t = Instant::now();
                d.iters
                    .iter()
                    .rev()
                    .take(8)
                    .map(|(b, s, dur)| {
                        format!(
                            "{b}@-{:.0}us:{dur:.0}us",
                            t.duration_since(*s).as_secs_f64() * 1e6
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                String::new()
            };
            d.fires.push((w, f, ctx));
        }
    }
}
