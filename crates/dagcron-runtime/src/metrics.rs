//! What the engine counts for Prometheus: fires by job and ledger outcome,
//! fire lateness, next-fire and last-success timestamps per job, run
//! durations, attempts, retries, queue wait and store commits.
//!
//! The engine calls these as it decides (a batch that fails to commit stops
//! the engine, so nothing counted is undone). Gauges of the engine's
//! current state (active runs, queue depth, pool use) are not kept here:
//! they are read from the engine when scraped ([`crate::EngineHandle::gauges`]).
//!
//! Per-job series are bounded: the first `max_job_series` jobs seen get
//! series of their own; the fires of any job beyond that are counted in its
//! namespace's series `job="_other"` (no job's name starts with `_`), and
//! such a job has no next-fire, last-success or period gauge. A deleted job
//! gives its place back to the next new job. So a million jobs never make a
//! million series.
//!
//! A job's fire counters start at zero for every outcome when it gets its
//! series, so that `increase()` sees its first missed or skipped fire.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use dagcron_core::policy::FireOutcome;
use dagcron_core::{AttemptState, RunState};
use jiff::Timestamp;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// A job: (namespace, name).
type JobKey = (String, String);

/// How many jobs get series of their own unless configured otherwise.
pub const DEFAULT_MAX_JOB_SERIES: usize = 1000;

/// The `job` of the series of the jobs past the bound.
pub const OTHER_JOBS: &str = "_other";

/// A job's series labels: its namespace and its name (or [`OTHER_JOBS`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct JobLabel(Arc<JobKey>);

impl EncodeLabelSet for JobLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        ("namespace", self.0.0.as_str()).encode(encoder.encode_label())?;
        ("job", self.0.1.as_str()).encode(encoder.encode_label())
    }
}

/// A namespace label, taken from a job key without copying it (equal by
/// namespace alone).
#[derive(Clone, Debug)]
struct Namespace(Arc<JobKey>);

impl PartialEq for Namespace {
    fn eq(&self, other: &Namespace) -> bool {
        self.0.0 == other.0.0
    }
}

impl Eq for Namespace {}

impl Hash for Namespace {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.0.hash(state);
    }
}

impl EncodeLabelSet for Namespace {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        ("namespace", self.0.0.as_str()).encode(encoder.encode_label())
    }
}

/// Labels with a fixed vocabulary after the job or namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct With<L> {
    base: L,
    names: [(&'static str, &'static str); 2],
    used: usize,
}

impl<L> With<L> {
    fn one(base: L, name: &'static str, value: &'static str) -> With<L> {
        With {
            base,
            names: [(name, value), ("", "")],
            used: 1,
        }
    }

    fn two(
        base: L,
        first: (&'static str, &'static str),
        second: (&'static str, &'static str),
    ) -> With<L> {
        With {
            base,
            names: [first, second],
            used: 2,
        }
    }
}

impl<L: EncodeLabelSet> EncodeLabelSet for With<L> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        self.base.encode(encoder)?;
        for label in &self.names[..self.used] {
            label.encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

type Timestamps = Family<JobLabel, Gauge<f64, AtomicU64>>;
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from a few milliseconds to about an hour: lateness, queue wait.
fn short_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 20))
}

/// Seconds from a tenth of a second to about a day: run durations.
fn long_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 20))
}

/// Seconds from a tenth of a millisecond to about a minute: commits.
fn commit_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// Which jobs have series of their own.
#[derive(Debug)]
struct Places {
    max: usize,
    own: HashSet<Arc<JobKey>>,
    /// The collapsed label of each namespace.
    namespaces: HashMap<String, Arc<JobKey>>,
}

/// The engine's counters and histograms; see the module documentation.
#[derive(Debug)]
pub struct EngineMetrics {
    fires: Family<With<JobLabel>, Counter>,
    next_fire: Timestamps,
    last_success: Timestamps,
    period: Timestamps,
    lateness: Histograms<Namespace>,
    run_duration: Histograms<With<Namespace>>,
    attempts: Family<With<Namespace>, Counter>,
    retries: Family<Namespace, Counter>,
    sla_missed: Family<Namespace, Counter>,
    queue_wait: Histograms<Namespace>,
    commit: Histogram,
    batch_writes: Histogram,
    commit_retries: Counter,
    early_fires: Counter,
    output_dropped: Counter,
    degraded: prometheus_client::metrics::gauge::Gauge,
    places: Mutex<Places>,
}

impl EngineMetrics {
    /// Metrics with series of their own for at most `max_job_series` jobs.
    pub fn new(max_job_series: usize) -> EngineMetrics {
        EngineMetrics {
            fires: Family::default(),
            next_fire: Family::default(),
            last_success: Family::default(),
            period: Family::default(),
            lateness: Family::new_with_constructor(short_seconds),
            run_duration: Family::new_with_constructor(long_seconds),
            attempts: Family::default(),
            retries: Family::default(),
            sla_missed: Family::default(),
            queue_wait: Family::new_with_constructor(short_seconds),
            commit: commit_seconds(),
            batch_writes: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
            commit_retries: Counter::default(),
            early_fires: Counter::default(),
            output_dropped: Counter::default(),
            degraded: Default::default(),
            places: Mutex::new(Places {
                max: max_job_series,
                own: HashSet::new(),
                namespaces: HashMap::new(),
            }),
        }
    }

    /// Registers every series (names prefixed `dagcron_`).
    pub fn register(self: &Arc<EngineMetrics>, registry: &mut Registry) {
        let r = registry;
        r.register(
            "dagcron_fires",
            "Expected fires by job and ledger outcome (fired, skipped_overlap, missed_caught_up, missed_skipped, suppressed)",
            self.fires.clone(),
        );
        r.register_with_unit(
            "dagcron_job_next_fire_timestamp",
            "When the job fires next (Unix time); in the past means a stuck scheduler",
            Unit::Seconds,
            self.next_fire.clone(),
        );
        r.register_with_unit(
            "dagcron_job_last_success_timestamp",
            "When a run of the job last succeeded (Unix time)",
            Unit::Seconds,
            self.last_success.clone(),
        );
        r.register_with_unit(
            "dagcron_job_period",
            "Time between the job's last fire and its next one",
            Unit::Seconds,
            self.period.clone(),
        );
        r.register_with_unit(
            "dagcron_fire_lateness",
            "From a fire's scheduled instant to its run's creation (fires on time)",
            Unit::Seconds,
            self.lateness.clone(),
        );
        r.register_with_unit(
            "dagcron_run_duration",
            "From a run's creation to its end, by result",
            Unit::Seconds,
            self.run_duration.clone(),
        );
        r.register(
            "dagcron_attempts",
            "Attempts ended, by executor and result",
            self.attempts.clone(),
        );
        r.register("dagcron_retries", "Retries armed", self.retries.clone());
        r.register(
            "dagcron_sla_missed",
            "Scheduled runs that had not succeeded by their job's SLA (or fires that made no run), found by this server",
            self.sla_missed.clone(),
        );
        r.register_with_unit(
            "dagcron_queue_wait",
            "From a task being ready to its attempt starting",
            Unit::Seconds,
            self.queue_wait.clone(),
        );
        r.register_with_unit(
            "dagcron_store_commit",
            "Time to commit one batch of decisions, retries included",
            Unit::Seconds,
            self.commit.clone(),
        );
        r.register(
            "dagcron_store_batch_writes",
            "Changes in one committed batch",
            self.batch_writes.clone(),
        );
        r.register(
            "dagcron_store_commit_retries",
            "Commits tried again after the database failed",
            self.commit_retries.clone(),
        );
        r.register(
            "dagcron_early_fires_refused",
            "Fires the database refused because they were made before their instant by its clock (this node's clock is ahead)",
            self.early_fires.clone(),
        );
        r.register(
            "dagcron_output_dropped_bytes",
            "Bytes of attempts' output dropped because the disk of the data was within its reserve",
            self.output_dropped.clone(),
        );
        r.register(
            "dagcron_store_degraded",
            "1 while the store refuses this server's commits for lack of space (nothing starts meanwhile), else 0",
            self.degraded.clone(),
        );
    }

    /// The label of `key`'s series: its own while there is room (it takes
    /// a place if it has none, its fire counters made at zero), or its
    /// namespace's [`OTHER_JOBS`].
    fn label(&self, key: &Arc<JobKey>) -> (JobLabel, bool) {
        let mut places = self.places.lock().expect("metrics lock");
        if places.own.contains(key) {
            return (JobLabel(key.clone()), true);
        }
        if places.own.len() < places.max {
            places.own.insert(key.clone());
            return (JobLabel(key.clone()), true);
        }
        let other = places
            .namespaces
            .entry(key.0.clone())
            .or_insert_with(|| Arc::new((key.0.clone(), OTHER_JOBS.to_string())));
        (JobLabel(other.clone()), false)
    }

    /// The handles on `key`'s series, taken once and kept with the job so
    /// that counting a fire is an atomic addition, not a lookup.
    pub fn job(&self, key: &Arc<JobKey>) -> JobSeries {
        let (label, own) = self.label(key);
        let fires = FireOutcome::ALL.map(|outcome| {
            self.fires
                .get_or_create_owned(&With::one(label.clone(), "outcome", outcome.as_str()))
        });
        JobSeries {
            lateness: self.lateness.get_or_create_owned(&Namespace(key.clone())),
            label,
            own,
            fires,
            next_fire: None,
            period: None,
        }
    }

    /// A fire recorded in the ledger; `lateness` for a run made on time.
    pub fn fire(&self, series: &JobSeries, outcome: FireOutcome, lateness: Option<f64>) {
        series.fires[outcome as usize].inc();
        if let Some(seconds) = lateness {
            series.lateness.observe(seconds.max(0.0));
        }
    }

    /// The job's next fire (none: it has none, is paused or is not this
    /// node's), and the time from its last fire to it.
    pub fn next_fire(&self, series: &mut JobSeries, at: Option<Timestamp>, period: Option<f64>) {
        if !series.own {
            return;
        }
        let Some(at) = at else {
            if series.next_fire.take().is_some() {
                self.next_fire.remove(&series.label);
            }
            return;
        };
        series
            .next_fire
            .get_or_insert_with(|| self.next_fire.get_or_create_owned(&series.label))
            .set(unix(at));
        if let Some(p) = period {
            series
                .period
                .get_or_insert_with(|| self.period.get_or_create_owned(&series.label))
                .set(p);
        }
    }

    /// A run ended in `state` after `seconds`.
    pub fn run_finished(&self, key: &Arc<JobKey>, state: RunState, seconds: f64, at: Timestamp) {
        self.run_duration
            .get_or_create(&With::one(Namespace(key.clone()), "result", state.as_str()))
            .observe(seconds.max(0.0));
        if state == RunState::Succeeded {
            let (label, own) = self.label(key);
            if own {
                self.last_success.get_or_create(&label).set(unix(at));
            }
        }
    }

    /// An attempt of `executor` ended in `state`.
    pub fn attempt_ended(&self, key: &Arc<JobKey>, executor: &'static str, state: AttemptState) {
        self.attempts
            .get_or_create(&With::two(
                Namespace(key.clone()),
                ("executor", executor),
                ("result", state.as_str()),
            ))
            .inc();
    }

    /// A retry was armed.
    pub fn retry(&self, key: &Arc<JobKey>) {
        self.retries.get_or_create(&Namespace(key.clone())).inc();
    }

    /// A fire of job `key` missed its SLA.
    pub fn sla_missed(&self, key: &JobKey) {
        let key = Arc::new(key.clone());
        self.sla_missed.get_or_create(&Namespace(key)).inc();
    }

    /// An attempt started `seconds` after its task was ready.
    pub fn queue_wait(&self, key: &Arc<JobKey>, seconds: f64) {
        self.queue_wait
            .get_or_create(&Namespace(key.clone()))
            .observe(seconds.max(0.0));
    }

    /// A batch of `writes` changes committed in `seconds`.
    pub fn committed(&self, seconds: f64, writes: usize) {
        self.commit.observe(seconds);
        self.batch_writes.observe(writes as f64);
    }

    /// A commit is tried again.
    pub fn commit_retried(&self) {
        self.commit_retries.inc();
    }

    /// A fire made before its instant by the database's clock was refused.
    pub fn early_fire_refused(&self) {
        self.early_fires.inc();
    }

    /// `bytes` of an attempt's output were dropped to keep the disk's reserve.
    pub fn output_dropped(&self, bytes: u64) {
        self.output_dropped.inc_by(bytes);
    }

    /// Whether commits fail for lack of space.
    pub fn set_degraded(&self, degraded: bool) {
        self.degraded.set(i64::from(degraded));
    }

    /// A deleted job: its series go, and its place is free.
    pub fn forget(&self, key: &Arc<JobKey>) {
        let mut places = self.places.lock().expect("metrics lock");
        if !places.own.remove(key) {
            return;
        }
        drop(places);
        let label = JobLabel(key.clone());
        for outcome in FireOutcome::ALL {
            self.fires
                .remove(&With::one(label.clone(), "outcome", outcome.as_str()));
        }
        self.next_fire.remove(&label);
        self.last_success.remove(&label);
        self.period.remove(&label);
    }
}

/// A job's handles on its series (see [`EngineMetrics::job`]).
#[derive(Debug)]
pub struct JobSeries {
    label: JobLabel,
    /// Its own series, or its namespace's [`OTHER_JOBS`].
    own: bool,
    /// By outcome, in the order of [`FireOutcome::ALL`].
    fires: [Counter; FireOutcome::ALL.len()],
    lateness: Histogram,
    /// While the gauge is exported.
    next_fire: Option<Gauge<f64, AtomicU64>>,
    period: Option<Gauge<f64, AtomicU64>>,
}

/// Unix time in seconds.
fn unix(at: Timestamp) -> f64 {
    at.as_millisecond() as f64 / 1000.0
}

/// The engine's state when scraped: what is running and waiting now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineGauges {
    /// Runs in memory by (namespace, state), `stopping` for those asked to stop.
    pub runs: Vec<(String, &'static str, u64)>,
    /// Tasks `held` (waiting for an operator) in the runs in memory, by
    /// namespace (only namespaces that have some).
    pub held: Vec<(String, u64)>,
    /// Tasks ready and waiting for this process's pool.
    pub ready_local: u64,
    /// Tasks ready and waiting for a remote agent.
    pub ready_remote: u64,
    /// The pool's size.
    pub pool_slots: u64,
    /// Attempts running in the pool.
    pub pool_in_use: u64,
    /// Attempts handed to remote agents and not ended.
    pub remote_running: u64,
    /// How far behind its instant the earliest due timer is (0 when on time).
    pub timers_overdue_seconds: f64,
    /// The earliest instant the engine wakes for (a fire, a retry, a
    /// deadline), if any.
    pub next_timer_at: Option<Timestamp>,
}

impl EngineGauges {
    /// Whether the engine is quiet at `now` for `ahead` at least: no run
    /// in memory, nothing ready or running, and no timer before then.
    pub fn quiet_for(&self, now: Timestamp, ahead: jiff::SignedDuration) -> bool {
        let idle = self.runs.is_empty()
            && self.ready_local == 0
            && self.ready_remote == 0
            && self.pool_in_use == 0
            && self.remote_running == 0;
        idle && self
            .next_timer_at
            .is_none_or(|at| now.checked_add(ahead).is_ok_and(|until| at >= until))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    /// Quiet: nothing in memory, running or ready, and no timer within the
    /// span asked; anything else is not.
    #[test]
    fn the_engine_is_quiet_only_with_nothing_to_do_for_the_span() {
        let now = Timestamp::from_second(1_000).unwrap();
        let span = SignedDuration::from_secs(60);
        let quiet = EngineGauges::default();
        assert!(quiet.quiet_for(now, span));
        let at = |s: i64| Some(Timestamp::from_second(s).unwrap());
        let later = EngineGauges {
            next_timer_at: at(1_060),
            ..EngineGauges::default()
        };
        assert!(later.quiet_for(now, span));
        let busy = [
            EngineGauges {
                next_timer_at: at(1_059),
                ..EngineGauges::default()
            },
            EngineGauges {
                runs: vec![("ns".into(), "running", 1)],
                ..EngineGauges::default()
            },
            EngineGauges {
                ready_local: 1,
                ..EngineGauges::default()
            },
            EngineGauges {
                ready_remote: 1,
                ..EngineGauges::default()
            },
            EngineGauges {
                pool_in_use: 1,
                ..EngineGauges::default()
            },
            EngineGauges {
                remote_running: 1,
                ..EngineGauges::default()
            },
        ];
        for gauges in busy {
            assert!(!gauges.quiet_for(now, span), "{gauges:?}");
        }
    }
}
