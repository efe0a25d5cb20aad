//! The engine with a manual clock: a year of fires, retries with their
//! exact delays, DAG rules, overlap and misfire policies, cancellation,
//! deadlines, and recovery after the engine is dropped mid-run. Most tests
//! keep their data in the in-memory store (which passes the same
//! conformance suite as the SQL stores; a restart keeps it, as a file
//! would be kept); the tests that say so use a real SQLite file.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::{AttemptState, FireOutcome, JobFile, RunState, TaskState};
use dagcron_runtime::{Clock, Engine, EngineConfig, EngineHandle, EngineMetrics, ManualClock};
use dagcron_store::memory::MemoryStore;
use dagcron_store::prelude::*;
use dagcron_store::{JobUpsert, RunRecord, Trigger};
use dagcron_store_sqlite::SqliteStore;
use dagcron_testkit::until_async;
use jiff::{SignedDuration, Timestamp};
use tokio_util::sync::CancellationToken;

struct Harness {
    store: Arc<MemoryStore>,
    metrics: Arc<EngineMetrics>,
    clock: ManualClock,
    handle: EngineHandle,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// An engine on `store` (a new one, or the one a stopped engine left).
async fn start(store: Arc<MemoryStore>, clock: ManualClock, config: EngineConfig) -> Harness {
    let metrics = config
        .metrics
        .clone()
        .unwrap_or_else(|| Arc::new(EngineMetrics::new(100)));
    let config = EngineConfig {
        metrics: Some(metrics.clone()),
        ..config
    };
    let (engine, handle) = Engine::start(store.clone(), Arc::new(clock.clone()), config)
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    let task = tokio::spawn(async move { engine.run(s, Duration::from_secs(5)).await.unwrap() });
    Harness {
        store,
        metrics,
        clock,
        handle,
        shutdown,
        task,
    }
}

async fn fresh(at: &str) -> Harness {
    fresh_with_grace(at, Duration::ZERO).await
}

/// A year in one jump of the manual clock is, to the engine, a clock step
/// forward: fires overdue by more than the misfire grace follow the misfire
/// policy. Tests that jump far and mean "time went by" give a grace that
/// covers the jump.
const LONG_GRACE: Duration = Duration::from_secs(400 * 86_400);

async fn fresh_with_grace(at: &str, misfire_grace: Duration) -> Harness {
    fresh_with(
        at,
        EngineConfig {
            misfire_grace,
            ..EngineConfig::default()
        },
    )
    .await
}

/// A fresh engine and store at `at`, with `config`.
async fn fresh_with(at: &str, config: EngineConfig) -> Harness {
    start(
        Arc::new(MemoryStore::new()),
        ManualClock::new(ts(at)),
        config,
    )
    .await
}

impl Harness {
    async fn apply(&self, yaml: &str) {
        let file: JobFile = serde_saphyr::from_str(yaml).unwrap();
        self.handle.apply(file.validate().unwrap()).await.unwrap();
    }

    /// Waits (bounded) until `check` holds on the store.
    async fn until<F: AsyncFnMut(&MemoryStore) -> bool>(&self, what: &str, mut check: F) {
        until_async(what, async || check(&self.store).await).await
    }

    /// Waits (bounded) until the ledger of job `job` of namespace `t` has
    /// `n` fires.
    async fn until_fires(&self, job: &str, n: usize) {
        self.until(&format!("{n} fires of {job} recorded"), async |s| {
            s.list_fires("t", job, Timestamp::UNIX_EPOCH, Timestamp::MAX, 10_000)
                .await
                .unwrap()
                .len()
                == n
        })
        .await;
    }

    /// Triggers `job` of namespace `t` and waits (bounded) until the run
    /// has succeeded. With a no-op job, a point where the engine has
    /// handled every timer due at the clock's instant.
    async fn run_to_end(&self, job: &str) -> dagcron_store::RunId {
        let id = self
            .handle
            .trigger("t", job, Default::default())
            .await
            .unwrap();
        self.until(&format!("the run of {job} succeeded"), async |s| {
            s.get_run(id).await.unwrap().unwrap().state == RunState::Succeeded
        })
        .await;
        id
    }

    async fn idle(&self) {
        self.until("no active runs", async |s| {
            s.active_runs().await.unwrap().is_empty()
        })
        .await;
    }

    async fn runs(&self, job: &str) -> Vec<RunRecord> {
        let mut out = self
            .store
            .list_runs("t", job, 10_000, None)
            .await
            .unwrap()
            .items;
        out.reverse();
        out
    }

    /// The value of one series of the engine's metrics (0 if it has none),
    /// such as `dagcron_fires_total{namespace="t",job="a",outcome="fired"}`.
    fn sample(&self, series: &str) -> f64 {
        let mut registry = prometheus_client::registry::Registry::default();
        self.metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |v| v.parse().unwrap())
    }

    async fn stop(self) -> (Arc<MemoryStore>, ManualClock) {
        self.shutdown.cancel();
        self.task.await.unwrap();
        (self.store, self.clock)
    }
}

#[tokio::test]
async fn a_year_of_daily_fires_across_dst_in_one_jump() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    // The year's 365 fires come due at once: room for all of them to wait.
    h.apply("namespace: t\njobs:\n  - name: daily\n    schedule: '0 30 2 * * *'\n    timezone: Europe/Berlin\n    max_pending_runs: 1000\n    tasks: [{ id: a, shell: 'true' }]\n").await;
    h.clock.set(ts("2027-01-01T00:00:00Z"));
    h.until("365 runs finished", async |s| {
        let runs = s.list_runs("t", "daily", 1000, None).await.unwrap().items;
        runs.len() == 365 && runs.iter().all(|r| r.state == RunState::Succeeded)
    })
    .await;
    let fires = h
        .store
        .list_fires(
            "t",
            "daily",
            ts("2026-01-01T00:00:00Z"),
            ts("2027-01-01T00:00:00Z"),
            1000,
        )
        .await
        .unwrap();
    assert_eq!(fires.len(), 365);
    assert!(
        fires
            .iter()
            .all(|f| f.outcome == FireOutcome::Fired && f.run_id.is_some())
    );
    // 02:30 does not exist on 2026-03-29 in Berlin: that day fires at 03:00 local.
    let march_29 = fires
        .iter()
        .find(|f| f.scheduled_at.to_string().starts_with("2026-03-29"))
        .unwrap();
    assert_eq!(march_29.scheduled_at, ts("2026-03-29T01:00:00Z"));
    // The fires are exactly the schedule's, in order.
    let s = dagcron_cron::Schedule::parse("CRON_TZ=Europe/Berlin 0 30 2 * * *").unwrap();
    let want: Vec<Timestamp> = s
        .fires_after(ts("2026-01-01T00:00:00Z"))
        .take(365)
        .map(|f| f.at)
        .collect();
    assert_eq!(
        fires.iter().map(|f| f.scheduled_at).collect::<Vec<_>>(),
        want
    );
    h.stop().await;
}

#[tokio::test]
async fn retries_happen_after_the_configured_delays() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(concat!(
        "namespace: t\njobs:\n  - name: flaky\n    retry: { max_attempts: 4, backoff: exponential, initial: 10s, factor: 3.0, max: 1h }\n",
        "    tasks: [{ id: a, shell: 'test \"$DAGCRON_ATTEMPT\" -ge 3' }]\n"
    ))
    .await;
    let run = h
        .handle
        .trigger("t", "flaky", BTreeMap::new())
        .await
        .unwrap();
    for (n, wait) in [(1, 10), (2, 30)] {
        h.until("attempt failed and waiting", async |s| {
            let r = s.get_run(run).await.unwrap().unwrap();
            r.tasks[0].attempts.len() == n && r.tasks[0].state == TaskState::Retrying
        })
        .await;
        // Not a second early.
        h.clock.advance(SignedDuration::from_secs(wait - 1));
        h.handle.settle().await.unwrap();
        assert_eq!(
            h.store.get_run(run).await.unwrap().unwrap().tasks[0]
                .attempts
                .len(),
            n
        );
        h.clock.advance(SignedDuration::from_secs(1));
    }
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    assert_eq!(r.state, RunState::Succeeded);
    let a = &r.tasks[0].attempts;
    assert_eq!(
        a.iter().map(|a| a.state).collect::<Vec<_>>(),
        [
            AttemptState::Failed,
            AttemptState::Failed,
            AttemptState::Succeeded
        ]
    );
    assert_eq!(
        a[1].started_at.duration_since(a[0].finished_at.unwrap()),
        SignedDuration::from_secs(10)
    );
    assert_eq!(
        a[2].started_at.duration_since(a[1].finished_at.unwrap()),
        SignedDuration::from_secs(30)
    );
    assert_eq!(r.trigger, Trigger::Manual);
    // The metrics saw two failed attempts, their retries and the success.
    let attempts = |result: &str| {
        h.sample(&format!(
            "dagcron_attempts_total{{namespace=\"t\",executor=\"shell\",result=\"{result}\"}}"
        ))
    };
    assert_eq!((attempts("failed"), attempts("succeeded")), (2.0, 1.0));
    assert_eq!(h.sample("dagcron_retries_total{namespace=\"t\"}"), 2.0);
    assert_eq!(
        h.sample("dagcron_run_duration_seconds_count{namespace=\"t\",result=\"succeeded\"}"),
        1.0
    );
    assert_eq!(
        h.sample("dagcron_run_duration_seconds_sum{namespace=\"t\",result=\"succeeded\"}"),
        40.0,
        "created at the trigger, ended 10 + 30 s later"
    );
    assert_eq!(
        h.sample("dagcron_job_last_success_timestamp_seconds{namespace=\"t\",job=\"flaky\"}"),
        r.finished_at.unwrap().as_millisecond() as f64 / 1000.0
    );
    h.stop().await;
}

#[tokio::test]
async fn dag_order_trigger_rules_and_failure_handlers() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    h.apply(&format!(
        r#"
namespace: t
jobs:
  - name: etl
    params: {{ region: eu }}
    tasks:
      - {{ id: extract, shell: "echo extract >> {t}" }}
      - {{ id: transform, depends_on: [extract], shell: "echo transform-$DAGCRON_PARAM_REGION >> {t}; exit 3" }}
      - {{ id: load, depends_on: [transform], shell: "echo load >> {t}" }}
      - {{ id: page, depends_on: [load], trigger_rule: one_failed, shell: "echo page >> {t}" }}
      - {{ id: cleanup, depends_on: [load], trigger_rule: all_done, shell: "echo cleanup >> {t}" }}
"#,
        t = trace.display()
    ))
    .await;
    let run = h
        .handle
        .trigger("t", "etl", BTreeMap::from([("region".into(), "us".into())]))
        .await
        .unwrap();
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    let states: Vec<(&str, TaskState)> = r.tasks.iter().map(|t| (t.id.as_str(), t.state)).collect();
    assert_eq!(
        states,
        [
            ("extract", TaskState::Succeeded),
            ("transform", TaskState::Failed),
            ("load", TaskState::UpstreamFailed),
            ("page", TaskState::Succeeded),
            ("cleanup", TaskState::Succeeded),
        ]
    );
    assert_eq!(r.state, RunState::Failed);
    let lines = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(
        &lines[..2],
        ["extract", "transform-us"],
        "order, and trigger params override defaults"
    );
    assert_eq!(
        h.store
            .read_log(run, "transform", 1)
            .await
            .unwrap()
            .unwrap(),
        b""
    );
    h.stop().await;
}

#[tokio::test]
async fn forbid_skips_overlapping_fires_and_records_them() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    h.apply(&format!(
        "namespace: t\njobs:\n  - name: slow\n    schedule: '* * * * * *'\n    concurrency: forbid\n    tasks: [{{ id: a, shell: 'while [ ! -e {} ]; do sleep 0.01; done' }}]\n",
        gate.display()
    ))
    .await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("first run running", async |s| {
        s.active_runs().await.unwrap().len() == 1
    })
    .await;
    for _ in 0..3 {
        h.clock.advance(SignedDuration::from_secs(1));
    }
    h.until_fires("slow", 4).await;
    std::fs::write(&gate, "").unwrap();
    h.idle().await;
    let fires = h
        .store
        .list_fires("t", "slow", Timestamp::UNIX_EPOCH, Timestamp::MAX, 100)
        .await
        .unwrap();
    let outcomes: Vec<FireOutcome> = fires.iter().map(|f| f.outcome).collect();
    assert_eq!(
        outcomes,
        [
            FireOutcome::Fired,
            FireOutcome::SkippedOverlap,
            FireOutcome::SkippedOverlap,
            FireOutcome::SkippedOverlap
        ]
    );
    let fires = |outcome: &str| {
        h.sample(&format!(
            "dagcron_fires_total{{namespace=\"t\",job=\"slow\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!((fires("fired"), fires("skipped_overlap")), (1.0, 3.0));
    assert_eq!(
        h.sample("dagcron_fire_lateness_seconds_count{namespace=\"t\"}"),
        1.0
    );
    h.stop().await;
}

/// Runs of a job running on other nodes (the cluster's coordinator tells
/// the engine of them) count against the job's overlap policy here: a
/// forbidden fire is skipped, a queued one waits, and starts once they end.
#[tokio::test]
async fn runs_of_a_job_running_on_other_nodes_count_against_its_overlap_policy() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    h.apply("namespace: t\njobs:\n  - { name: f, schedule: '* * * * * *', concurrency: forbid, tasks: [{ id: a, noop: true }] }\n  - { name: q, schedule: '* * * * * *', concurrency: queue, tasks: [{ id: a, noop: true }] }\n").await;
    let job = |name: &str| ("t".to_string(), name.to_string());
    h.handle
        .running_elsewhere(std::collections::HashMap::from([
            (job("f"), 1),
            (job("q"), 1),
        ]))
        .await
        .unwrap();
    h.clock.advance(SignedDuration::from_secs(1));
    h.until_fires("f", 1).await;
    h.until_fires("q", 1).await;
    assert_eq!(
        outcomes_of(&h.fires("f").await),
        [FireOutcome::SkippedOverlap]
    );
    let waiting = h.runs("q").await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].state, RunState::Pending);
    // The run elsewhere ended: the queued run starts.
    h.handle
        .running_elsewhere(std::collections::HashMap::new())
        .await
        .unwrap();
    h.until("the queued run succeeded", async |s| {
        s.get_run(waiting[0].id).await.unwrap().unwrap().state == RunState::Succeeded
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn queue_runs_one_after_another() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    h.apply("namespace: t\njobs:\n  - name: q\n    schedule: '* * * * * *'\n    concurrency: queue\n    tasks: [{ id: a, shell: 'sleep 0.05' }]\n").await;
    h.clock.advance(SignedDuration::from_secs(5));
    h.until("5 runs succeeded", async |s| {
        let runs = s.list_runs("t", "q", 100, None).await.unwrap().items;
        runs.len() == 5 && runs.iter().all(|r| r.state == RunState::Succeeded)
    })
    .await;
    let runs = h.runs("q").await;
    for w in runs.windows(2) {
        assert!(
            w[1].started_at.unwrap() >= w[0].finished_at.unwrap(),
            "runs overlapped"
        );
    }
    h.stop().await;
}

/// Airflow's other trigger rules through the engine: skips and failures
/// propagate as each rule says, and joins after a skipped branch run.
#[tokio::test]
async fn airflow_trigger_rules_propagate_skips_and_failures() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(
        r#"
namespace: t
jobs:
  - name: rules
    tasks:
      - { id: ok, noop: true }
      - { id: bad, shell: "exit 1" }
      - { id: on-bad, depends_on: [ok], trigger_rule: one_failed, noop: true }
      - { id: join, depends_on: [ok, on-bad], trigger_rule: none_failed_min_one_success, noop: true }
      - { id: any, depends_on: [ok, bad], trigger_rule: one_success, noop: true }
      - { id: when-skipped, depends_on: [on-bad], trigger_rule: all_skipped, noop: true }
      - { id: no-skip, depends_on: [ok, bad], trigger_rule: none_skipped, noop: true }
      - { id: strict, depends_on: [ok, on-bad], trigger_rule: all_done_min_one_success, noop: true }
      - { id: clean, depends_on: [bad], trigger_rule: none_failed, noop: true }
      - { id: all-bad, depends_on: [bad], trigger_rule: all_failed, noop: true }
      - { id: done, depends_on: [bad, on-bad], trigger_rule: one_done, noop: true }
"#,
    )
    .await;
    let run = h
        .handle
        .trigger("t", "rules", BTreeMap::new())
        .await
        .unwrap();
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    let states: Vec<(&str, TaskState)> = r.tasks.iter().map(|t| (t.id.as_str(), t.state)).collect();
    assert_eq!(
        states,
        [
            ("ok", TaskState::Succeeded),
            ("bad", TaskState::Failed),
            ("on-bad", TaskState::Skipped),
            ("join", TaskState::Succeeded),
            ("any", TaskState::Succeeded),
            ("when-skipped", TaskState::Succeeded),
            ("no-skip", TaskState::Succeeded),
            ("strict", TaskState::Skipped),
            ("clean", TaskState::UpstreamFailed),
            ("all-bad", TaskState::Succeeded),
            ("done", TaskState::Succeeded),
        ]
    );
    assert_eq!(r.state, RunState::Failed);
    h.stop().await;
}

/// `buffer_one`: one run going on and one waiting behind it; the fires
/// that come while one waits are skipped and recorded, and the waiting run
/// starts when the first ends.
#[tokio::test]
async fn buffer_one_keeps_one_run_waiting_and_skips_the_fires_beyond() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    h.apply(&format!(
        "namespace: t\njobs:\n  - name: slow\n    schedule: '* * * * * *'\n    concurrency: buffer_one\n    tasks: [{{ id: a, shell: 'while [ ! -e {} ]; do sleep 0.01; done' }}]\n",
        gate.display()
    ))
    .await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("first run running", async |s| {
        s.active_runs().await.unwrap().len() == 1
    })
    .await;
    for _ in 0..3 {
        h.clock.advance(SignedDuration::from_secs(1));
    }
    h.until_fires("slow", 4).await;
    let fires = h
        .store
        .list_fires("t", "slow", Timestamp::UNIX_EPOCH, Timestamp::MAX, 100)
        .await
        .unwrap();
    assert_eq!(
        outcomes_of(&fires),
        [
            FireOutcome::Fired,
            FireOutcome::Fired,
            FireOutcome::SkippedOverlap,
            FireOutcome::SkippedOverlap
        ]
    );
    let runs = h.runs("slow").await;
    let states: Vec<(RunState, bool)> = runs
        .iter()
        .map(|r| (r.state, r.started_at.is_some()))
        .collect();
    assert_eq!(
        states,
        [(RunState::Running, true), (RunState::Pending, false)],
        "one running, one waiting"
    );
    assert_eq!(runs[1].scheduled_at, fires[1].scheduled_at);
    std::fs::write(&gate, "").unwrap();
    h.until("both runs succeeded", async |s| {
        let runs = s.list_runs("t", "slow", 100, None).await.unwrap().items;
        runs.len() == 2 && runs.iter().all(|r| r.state == RunState::Succeeded)
    })
    .await;
    let runs = h.runs("slow").await;
    assert!(
        runs[1].started_at.unwrap() >= runs[0].finished_at.unwrap(),
        "the waiting run started once the first had ended"
    );
    let fires = |outcome: &str| {
        h.sample(&format!(
            "dagcron_fires_total{{namespace=\"t\",job=\"slow\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!((fires("fired"), fires("skipped_overlap")), (2.0, 2.0));
    h.stop().await;
}

/// A manual trigger of a `buffer_one` job: it starts, or waits behind the
/// running run; while one waits, it is refused (409 through the API) and
/// makes no run.
#[tokio::test]
async fn buffer_one_refuses_a_trigger_while_a_run_waits() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    h.apply(&format!(
        "namespace: t\njobs:\n  - name: b\n    concurrency: buffer_one\n    tasks: [{{ id: a, shell: 'while [ ! -e {} ]; do sleep 0.01; done' }}]\n",
        gate.display()
    ))
    .await;
    let first = h.handle.trigger("t", "b", BTreeMap::new()).await.unwrap();
    let second = h.handle.trigger("t", "b", BTreeMap::new()).await.unwrap();
    let err = h
        .handle
        .trigger("t", "b", BTreeMap::new())
        .await
        .unwrap_err();
    match err {
        dagcron_runtime::EngineError::Conflict(message) => assert_eq!(
            message,
            "t/b has a run active and one waiting behind it, and its concurrency policy buffer_one keeps at most one waiting; trigger again once the waiting run has started"
        ),
        other => panic!("{other:?}"),
    }
    let state = async |run| h.store.get_run(run).await.unwrap().unwrap().state;
    assert_eq!(state(first).await, RunState::Running);
    assert_eq!(state(second).await, RunState::Pending);
    assert_eq!(
        h.runs("b").await.len(),
        2,
        "the refused trigger made no run"
    );
    std::fs::write(&gate, "").unwrap();
    h.idle().await;
    assert_eq!(state(second).await, RunState::Succeeded);
    h.stop().await;
}

#[tokio::test]
async fn fires_missed_while_down_follow_the_misfire_policy() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: all, schedule: '0 * * * * *', misfire: run_all, max_catchup: 3, concurrency: allow, max_active_runs: 10, tasks: [{ id: a, shell: 'true' }] }\n",
        "  - { name: once, schedule: '0 * * * * *', misfire: run_once, tasks: [{ id: a, shell: 'true' }] }\n",
        "  - { name: skip, schedule: '0 * * * * *', misfire: skip, tasks: [{ id: a, shell: 'true' }] }\n",
    ))
    .await;
    h.clock.advance(SignedDuration::from_secs(60));
    h.until("first fires", async |s| {
        s.last_fires().await.unwrap().len() == 3
    })
    .await;
    h.idle().await;
    let (dir, clock) = h.stop().await;
    // Down for five minutes: fires at minutes 2..=6 are missed.
    clock.advance(SignedDuration::from_secs(5 * 60 + 30));
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(dir, clock, config).await;
    h.idle().await;
    let outcomes = async |job: &str| -> Vec<(i64, FireOutcome, Option<Trigger>)> {
        let fires = h
            .store
            .list_fires("t", job, Timestamp::UNIX_EPOCH, Timestamp::MAX, 100)
            .await
            .unwrap();
        let mut out = Vec::new();
        for f in fires {
            let trigger = match f.run_id {
                Some(id) => Some(h.store.get_run(id).await.unwrap().unwrap().trigger),
                None => None,
            };
            out.push((
                (f.scheduled_at.as_second() - 1_767_225_600) / 60,
                f.outcome,
                trigger,
            ));
        }
        out
    };
    use FireOutcome::*;
    let caught = Some(Trigger::Catchup);
    assert_eq!(
        outcomes("all").await,
        [
            (1, Fired, Some(Trigger::Schedule)),
            (2, MissedSkipped, None),
            (3, MissedSkipped, None),
            (4, MissedCaughtUp, caught),
            (5, MissedCaughtUp, caught),
            (6, MissedCaughtUp, caught)
        ]
    );
    assert_eq!(
        outcomes("once").await,
        [
            (1, Fired, Some(Trigger::Schedule)),
            (2, MissedSkipped, None),
            (3, MissedSkipped, None),
            (4, MissedSkipped, None),
            (5, MissedSkipped, None),
            (6, MissedCaughtUp, caught)
        ]
    );
    assert_eq!(
        outcomes("skip")
            .await
            .iter()
            .filter(|o| o.1 == MissedSkipped)
            .count(),
        5
    );
    // The metrics of the restarted engine count the fires missed while down.
    let fires = |job: &str, outcome: &str| {
        h.sample(&format!(
            "dagcron_fires_total{{namespace=\"t\",job=\"{job}\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!(
        [
            (
                fires("all", "missed_skipped"),
                fires("all", "missed_caught_up")
            ),
            (
                fires("once", "missed_skipped"),
                fires("once", "missed_caught_up")
            ),
            (
                fires("skip", "missed_skipped"),
                fires("skip", "missed_caught_up")
            ),
        ],
        [(2.0, 3.0), (4.0, 1.0), (5.0, 0.0)]
    );
    assert_eq!(
        h.sample("dagcron_fire_lateness_seconds_count{namespace=\"t\"}"),
        0.0,
        "fires caught up are not late fires"
    );
    // And scheduling goes on from there.
    h.clock.advance(SignedDuration::from_secs(30));
    h.until("minute 7 fired", async |s| {
        s.last_fires()
            .await
            .unwrap()
            .iter()
            .all(|(_, _, t)| *t == ts("2026-01-01T00:07:00Z"))
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn an_attempt_running_when_the_engine_died_is_lost_and_retried() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("attempts");
    h.apply(&format!(
        "namespace: t\njobs:\n  - name: long\n    retry: {{ max_attempts: 3, backoff: fixed, initial: 1s, max: 1s }}\n    tasks: [{{ id: a, shell: 'echo $DAGCRON_ATTEMPT >> {m}; if [ $DAGCRON_ATTEMPT -eq 1 ]; then sleep 30; fi' }}]\n",
        m = marker.display()
    ))
    .await;
    let run = h
        .handle
        .trigger("t", "long", BTreeMap::new())
        .await
        .unwrap();
    h.until("attempt 1 running", async |_| {
        std::fs::read_to_string(&marker).is_ok_and(|s| s == "1\n")
    })
    .await;
    // Simulate a crash: the engine task disappears without any cleanup.
    h.task.abort();
    let (dir_h, clock) = (h.store.clone(), h.clock.clone());
    drop(h);
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(dir_h, clock, config).await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    assert_eq!(r.state, RunState::Succeeded);
    let states: Vec<AttemptState> = r.tasks[0].attempts.iter().map(|a| a.state).collect();
    assert_eq!(states, [AttemptState::Lost, AttemptState::Succeeded]);
    h.stop().await;
}

#[tokio::test]
async fn at_most_once_marks_lost_work_failed() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - name: once\n    delivery: at_most_once\n    retry: { max_attempts: 5 }\n    tasks: [{ id: a, shell: 'sleep 30' }]\n").await;
    let run = h
        .handle
        .trigger("t", "once", BTreeMap::new())
        .await
        .unwrap();
    h.until("attempt running", async |s| {
        s.get_run(run).await.unwrap().unwrap().tasks[0]
            .attempts
            .len()
            == 1
    })
    .await;
    h.task.abort();
    let (dir_h, clock) = (h.store.clone(), h.clock.clone());
    drop(h);
    let h = start(dir_h, clock, EngineConfig::default()).await;
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.tasks[0].state, r.tasks[0].attempts[0].state),
        (RunState::Failed, TaskState::Failed, AttemptState::Lost)
    );
    h.stop().await;
}

#[tokio::test]
async fn cancel_and_deadline_stop_running_work() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: c, tasks: [{ id: a, shell: 'sleep 30' }, { id: b, depends_on: [a], shell: 'true' }] }\n",
        "  - { name: d, deadline: 5m, tasks: [{ id: a, shell: 'sleep 30' }] }\n",
    ))
    .await;
    let c = h.handle.trigger("t", "c", BTreeMap::new()).await.unwrap();
    let d = h.handle.trigger("t", "d", BTreeMap::new()).await.unwrap();
    h.until("both running", async |s| {
        s.active_runs()
            .await
            .unwrap()
            .iter()
            .all(|r| r.tasks[0].attempts.len() == 1)
            && s.active_runs().await.unwrap().len() == 2
    })
    .await;
    h.handle.cancel(c).await.unwrap();
    h.clock.advance(SignedDuration::from_secs(5 * 60));
    h.idle().await;
    let rc = h.store.get_run(c).await.unwrap().unwrap();
    assert_eq!(
        (rc.state, rc.tasks[0].state, rc.tasks[1].state),
        (
            RunState::Cancelled,
            TaskState::Cancelled,
            TaskState::Cancelled
        )
    );
    assert_eq!(rc.tasks[0].attempts[0].state, AttemptState::Cancelled);
    let rd = h.store.get_run(d).await.unwrap().unwrap();
    assert_eq!(rd.state, RunState::Failed, "a run past its deadline fails");
    assert!(matches!(
        h.handle.cancel(c).await,
        Err(dagcron_runtime::EngineError::Conflict(_))
    ));
    h.stop().await;
}

#[tokio::test]
async fn pause_suppresses_and_resume_catches_up() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: p, schedule: '0 * * * * *', misfire: run_once, tasks: [{ id: a, shell: 'true' }] }\n").await;
    h.clock.advance(SignedDuration::from_secs(60));
    h.until("first fire", async |s| {
        s.last_fires().await.unwrap().len() == 1
    })
    .await;
    h.handle.pause("t", "p", true).await.unwrap();
    h.clock.advance(SignedDuration::from_secs(180));
    h.handle.settle().await.unwrap();
    assert_eq!(
        h.store
            .list_fires("t", "p", Timestamp::UNIX_EPOCH, Timestamp::MAX, 10)
            .await
            .unwrap()
            .len(),
        1,
        "no fire while paused"
    );
    h.handle.pause("t", "p", false).await.unwrap();
    // The missed fires are caught up beside the loop, after the resume.
    h.until_fires("p", 4).await;
    h.idle().await;
    let outcomes: Vec<FireOutcome> = h
        .store
        .list_fires("t", "p", Timestamp::UNIX_EPOCH, Timestamp::MAX, 10)
        .await
        .unwrap()
        .iter()
        .map(|f| f.outcome)
        .collect();
    assert_eq!(
        outcomes,
        [
            FireOutcome::Fired,
            FireOutcome::MissedSkipped,
            FireOutcome::MissedSkipped,
            FireOutcome::MissedCaughtUp
        ]
    );
    h.stop().await;
}

#[tokio::test]
async fn backfill_creates_one_run_per_missing_fire() {
    let h = fresh("2026-01-10T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: b, schedule: '0 0 0 * * *', max_active_runs: 2, tasks: [{ id: a, shell: 'true' }] }\n").await;
    let first = h
        .handle
        .backfill(
            "t",
            "b",
            ts("2026-01-01T00:00:00Z"),
            ts("2026-01-05T00:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(first.len(), 4);
    let again = h
        .handle
        .backfill(
            "t",
            "b",
            ts("2026-01-01T00:00:00Z"),
            ts("2026-01-06T00:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(
        again.len(),
        1,
        "fires already in the ledger are not run twice"
    );
    h.idle().await;
    let runs = h.runs("b").await;
    assert_eq!(runs.len(), 5);
    assert!(
        runs.iter()
            .all(|r| r.trigger == Trigger::Backfill && r.state == RunState::Succeeded)
    );
    h.stop().await;
}

/// A cluster node's engine arms only the jobs it owns; a job it gains
/// resumes from the ledger (its missed fires caught up); its run ids carry
/// its slot; and once its lease ends it commits nothing more and stops.
#[tokio::test]
async fn a_cluster_node_fires_what_it_owns_and_stops_when_its_lease_ends() {
    use dagcron_runtime::{Lease, NodeIdentity, Ownership};
    use dagcron_store::StorageError;

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(&dir.path().join("db.sqlite"))
            .await
            .unwrap(),
    );
    let clock = ManualClock::new(ts("2026-01-01T00:00:30Z"));
    let lease = Lease::new();
    lease.extend_to(ts("2026-01-01T01:00:30Z"));
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        node: Some(NodeIdentity {
            slot: 3,
            lease: lease.clone(),
            peers: Default::default(),
            ahead_us: Default::default(),
        }),
        ..EngineConfig::default()
    };
    let (engine, handle) = Engine::start(store.clone(), Arc::new(clock.clone()), config)
        .await
        .unwrap();
    let task = tokio::spawn(engine.run(CancellationToken::new(), Duration::from_secs(5)));
    let file: JobFile = serde_saphyr::from_str(
        "namespace: t\njobs:\n  - { name: a, schedule: '0 * * * * *', misfire: run_all, max_catchup: 100, tasks: [{ id: x, noop: true }] }\n  - { name: b, schedule: '0 * * * * *', misfire: run_all, max_catchup: 100, tasks: [{ id: x, noop: true }] }\n",
    )
    .unwrap();
    handle.apply(file.validate().unwrap()).await.unwrap();
    let runs = async |job: &str| store.list_runs("t", job, 100, None).await.unwrap().items;
    let until = async |what: &str, check: &dyn Fn(usize, usize) -> bool| {
        until_async(what, async || {
            let (a, b) = (runs("a").await, runs("b").await);
            let settled = a.iter().chain(&b).all(|r| r.state == RunState::Succeeded);
            settled && check(a.len(), b.len())
        })
        .await
    };

    let only =
        |name: &'static str| -> Ownership { Arc::new(move |_: &str, job: &str| job == name) };
    assert_eq!(handle.set_ownership(only("a")).await.unwrap(), 1);
    clock.set(ts("2026-01-01T00:03:30Z"));
    until("a fires three times, b never", &|a, b| a == 3 && b == 0).await;

    // b moves here: its three missed fires are caught up from the ledger; a stops.
    assert_eq!(handle.set_ownership(only("b")).await.unwrap(), 1);
    until("b catches up", &|a, b| a == 3 && b == 3).await;
    // On time (a jump past a fire would be a clock step, handled as a misfire).
    clock.set(ts("2026-01-01T00:04:00Z"));
    until("b goes on", &|a, b| a == 3 && b == 4).await;
    clock.set(ts("2026-01-01T00:05:00Z"));
    until("b goes on", &|a, b| a == 3 && b == 5).await;
    let b = runs("b").await;
    let catchup = b.iter().filter(|r| r.trigger == Trigger::Catchup).count();
    assert_eq!(catchup, 3);
    for r in runs("a").await.iter().chain(&b) {
        assert_eq!(r.id & 31, 3, "run {} lacks the node's slot", r.id);
    }

    // Past the end of the lease, nothing more is committed.
    clock.set(ts("2026-01-01T02:00:00Z"));
    let result = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the engine stops")
        .unwrap();
    assert!(matches!(result, Err(StorageError::Fenced(_))), "{result:?}");
    assert_eq!(runs("b").await.len(), 5);
    assert!(handle.set_ownership(only("a")).await.is_err(), "stopped");
}

/// A cluster node whose pool is full hands its ready tasks to the cluster
/// only while another live node could claim them: alone, it keeps them in
/// its own queue (handed over, they would only come back to it through the
/// database). Once a peer is known, the next turn of the loop hands them
/// over, a pool's worth at a time.
#[tokio::test]
async fn a_lone_node_keeps_what_its_pool_has_no_room_for() {
    use dagcron_runtime::{Lease, NodeIdentity};
    use std::sync::atomic::{AtomicBool, Ordering};

    let lease = Lease::new();
    lease.extend_to(ts("2026-01-01T01:00:30Z"));
    let peers = Arc::new(AtomicBool::new(false));
    let config = EngineConfig {
        pool_size: 1,
        node: Some(NodeIdentity {
            slot: 1,
            lease,
            peers: peers.clone(),
            ahead_us: Default::default(),
        }),
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:30Z", config).await;
    h.apply("namespace: t\njobs:\n  - { name: fan, schedule: '0 0 0 1 1 *', tasks: [{ id: a, shell: 'sleep 30' }, { id: b, shell: 'sleep 30' }, { id: c, shell: 'sleep 30' }] }\n").await;
    let id = h.handle.trigger("t", "fan", BTreeMap::new()).await.unwrap();
    let attempts = async |state: AttemptState| {
        let run = h.store.get_run(id).await.unwrap().unwrap();
        run.tasks
            .iter()
            .flat_map(|t| &t.attempts)
            .filter(|a| a.state == state)
            .count()
    };
    // The first task's attempt and any hand-over are decided in one turn
    // and committed in one batch.
    h.until("the first attempt runs", async |_| {
        attempts(AttemptState::Running).await == 1
    })
    .await;
    assert_eq!(attempts(AttemptState::Dispatching).await, 0);
    let run = h.store.get_run(id).await.unwrap().unwrap();
    let waiting = run
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Ready)
        .count();
    assert_eq!(waiting, 2, "{:?}", run.tasks);

    peers.store(true, Ordering::Relaxed);
    h.handle.ping().await.unwrap();
    // At most a pool's worth is handed over at a time.
    h.until("a waiting task is handed to the cluster", async |_| {
        attempts(AttemptState::Dispatching).await == 1
    })
    .await;
    h.stop().await;
}

/// A no-op task runs nothing, so its attempt takes no slot of the pool:
/// with the pool's one slot held by a long shell task, a no-op task beside
/// it in the DAG and the no-op runs of another job still start and end.
/// The shell task after it waits for the slot.
#[tokio::test]
async fn a_no_op_task_takes_no_slot_of_the_pool() {
    let config = EngineConfig {
        pool_size: 1,
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:30Z", config).await;
    h.apply("namespace: t\njobs:\n  - { name: busy, schedule: '0 0 0 1 1 *', tasks: [{ id: long, shell: 'sleep 30' }, { id: join, noop: true }, { id: next, shell: 'true' }] }\n  - { name: empty, schedule: '0 0 0 1 1 *', concurrency: allow, tasks: [{ id: a, noop: true }, { id: b, noop: true, depends_on: [a] }] }\n").await;
    let busy = h
        .handle
        .trigger("t", "busy", BTreeMap::new())
        .await
        .unwrap();
    let empty: Vec<_> = (0..5).map(|_| BTreeMap::new()).collect();
    let runs = h
        .handle
        .trigger_runs("t", "empty", empty, None, None)
        .await
        .unwrap();
    let state = async |id, task: &str| {
        let run = h.store.get_run(id).await.unwrap().unwrap();
        run.tasks.iter().find(|t| t.id == task).unwrap().state
    };
    for run in &runs {
        h.until("a no-op run ends beside the long task", async |s| {
            s.get_run(run.id).await.unwrap().unwrap().state == RunState::Succeeded
        })
        .await;
    }
    h.until("the no-op task beside the long one ends", async |_| {
        state(busy, "join").await == TaskState::Succeeded
    })
    .await;
    assert_eq!(state(busy, "long").await, TaskState::Running);
    assert_eq!(
        state(busy, "next").await,
        TaskState::Ready,
        "a shell task waits for the pool's slot"
    );
    h.handle.cancel(busy).await.unwrap();
    h.until("the busy run is cancelled", async |s| {
        s.get_run(busy).await.unwrap().unwrap().state == RunState::Cancelled
    })
    .await;
    h.stop().await;
}

/// A job whose next fire is far keeps only its timing in memory and is read
/// from the store just ahead of its fire; a job firing every second keeps
/// its whole definition. Shown by changing both in the store behind the
/// engine's back: the far one's next run has the stored tasks, the near
/// one's runs keep the tasks the engine was given.
#[tokio::test]
async fn a_job_far_from_its_next_fire_is_read_from_the_store_ahead_of_it() {
    let h = fresh("2026-01-01T00:00:30Z").await;
    let file = |task: &str| {
        format!(
            "namespace: t\njobs:\n  - {{ name: hourly, schedule: '0 0 * * * *', tasks: [{{ id: {task}, noop: true }}] }}\n  - {{ name: busy, schedule: '* * * * * *', max_pending_runs: 10000, tasks: [{{ id: {task}, noop: true }}] }}\n"
        )
    };
    h.apply(&file("a")).await;
    let edited: JobFile = serde_saphyr::from_str(&file("b")).unwrap();
    let upserts: Vec<JobUpsert> = edited
        .validate()
        .unwrap()
        .iter()
        .map(JobUpsert::of)
        .collect();
    h.store.apply_jobs(&upserts, h.clock.now()).await.unwrap();
    // One second at a time up to the hour, so that the busy job fires every second.
    for _ in 0..3570 {
        h.clock.advance(SignedDuration::from_secs(1));
        tokio::task::yield_now().await;
    }
    h.until("the hourly fire", async |s| {
        s.last_fires()
            .await
            .unwrap()
            .iter()
            .any(|(_, job, _)| job == "hourly")
    })
    .await;
    h.idle().await;
    let hourly = h.runs("hourly").await;
    assert_eq!(hourly.len(), 1);
    assert_eq!(hourly[0].tasks[0].id, "b", "read from the store");
    let busy = h.runs("busy").await;
    assert!(busy.len() > 3000, "{}", busy.len());
    assert!(busy.iter().all(|r| r.tasks[0].id == "a"), "kept in memory");
    h.stop().await;
}

/// With `send_ahead`, a scheduled run is made that long before its instant,
/// and its first task starts at the instant, not before; the attempt records
/// the instant as its start and how far from it it started.
#[tokio::test]
async fn a_run_sent_ahead_is_made_early_and_starts_at_its_instant() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: timed, schedule: '0 * * * * *', send_ahead: 2s, tasks: [{ id: a, shell: 'true' }, { id: b, shell: 'true', depends_on: [a] }] }\n").await;
    h.clock.set(ts("2026-01-01T00:00:58.500Z"));
    h.until(
        "the run made ahead, its first attempt recorded",
        async |s| {
            s.list_runs("t", "timed", 10, None)
                .await
                .unwrap()
                .items
                .first()
                .is_some_and(|r| !r.tasks[0].attempts.is_empty())
        },
    )
    .await;
    let run = &h.runs("timed").await[0];
    assert_eq!(run.scheduled_at, ts("2026-01-01T00:01:00Z"));
    assert_eq!(run.created_at, ts("2026-01-01T00:00:58.500Z"));
    assert_eq!(run.tasks[0].attempts.len(), 1);
    assert_eq!(
        run.tasks[0].attempts[0].state,
        AttemptState::Running,
        "waiting for its instant"
    );
    assert_eq!(run.tasks[0].attempts[0].started_at, run.scheduled_at);
    assert!(run.tasks[1].attempts.is_empty());
    h.clock.set(ts("2026-01-01T00:01:00Z"));
    h.idle().await;
    let run = &h.runs("timed").await[0];
    assert_eq!(run.state, RunState::Succeeded);
    let first = &run.tasks[0].attempts[0];
    assert_eq!(first.start_error_us, Some(0), "the manual clock is exact");
    assert_eq!(
        run.tasks[1].attempts[0].start_error_us, None,
        "only what would start before the instant waits for it"
    );
    h.stop().await;
}

fn outcomes_of(fires: &[dagcron_store::FireRecord]) -> Vec<FireOutcome> {
    fires.iter().map(|f| f.outcome).collect()
}

impl Harness {
    async fn fires(&self, job: &str) -> Vec<dagcron_store::FireRecord> {
        self.store
            .list_fires("t", job, Timestamp::UNIX_EPOCH, Timestamp::MAX, 10_000)
            .await
            .unwrap()
    }

    /// Kills the engine (as `kill -9` would) and starts it again on the same data.
    async fn restart(self, config: EngineConfig) -> Harness {
        self.task.abort();
        let (dir, clock) = (self.store.clone(), self.clock.clone());
        drop(self);
        start(dir, clock, config).await
    }
}

/// `paused: true` in a job file was stored but ignored: the job fired, also
/// after a restart.
#[tokio::test]
async fn regression_a_job_applied_paused_does_not_fire() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let paused = "namespace: t\njobs:\n  - { name: p, schedule: '* * * * * *', paused: true, tasks: [{ id: a, noop: true }] }\n";
    h.apply(paused).await;
    h.clock.advance(SignedDuration::from_secs(3));
    // A job firing every second that fired would have a fire by now; the
    // other job shows the engine is firing.
    h.apply("namespace: t\njobs:\n  - { name: witness, schedule: '* * * * * *', tasks: [{ id: a, noop: true }] }\n").await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("the witness fired", async |s| {
        !s.list_fires("t", "witness", Timestamp::UNIX_EPOCH, Timestamp::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    assert!(h.fires("p").await.is_empty(), "a paused job fired");
    let h = h.restart(EngineConfig::default()).await;
    h.clock.advance(SignedDuration::from_secs(2));
    h.until("the witness fired after the restart", async |s| {
        s.list_fires("t", "witness", Timestamp::UNIX_EPOCH, Timestamp::MAX, 10)
            .await
            .unwrap()
            .len()
            >= 3
    })
    .await;
    assert!(
        h.fires("p").await.is_empty(),
        "a paused job fired after a restart"
    );
    // Resumed through the API, the same file applied again keeps it resumed.
    h.handle.pause("t", "p", false).await.unwrap();
    h.apply(paused).await;
    assert!(!h.store.get_job("t", "p").await.unwrap().unwrap().paused);
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("the resumed job fires", async |s| {
        s.list_fires("t", "p", Timestamp::UNIX_EPOCH, Timestamp::MAX, 10)
            .await
            .unwrap()
            .iter()
            .any(|f| f.outcome == FireOutcome::Fired)
    })
    .await;
    h.stop().await;
}

/// Paused before its first fire, a job resumed from "now": the fires due
/// while it was paused were neither recorded nor caught up.
#[tokio::test]
async fn regression_fires_due_while_paused_before_the_first_fire_are_recorded() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: p, schedule: '0 * * * * *', misfire: run_once, tasks: [{ id: a, noop: true }] }\n").await;
    h.handle.pause("t", "p", true).await.unwrap();
    h.clock.advance(SignedDuration::from_secs(180));
    h.handle.pause("t", "p", false).await.unwrap();
    // The missed fires are caught up beside the loop, after the resume.
    h.until_fires("p", 3).await;
    h.idle().await;
    assert_eq!(
        outcomes_of(&h.fires("p").await),
        [
            FireOutcome::MissedSkipped,
            FireOutcome::MissedSkipped,
            FireOutcome::MissedCaughtUp
        ]
    );
    h.stop().await;
}

/// Backfill had its own next-fire search and ignored `start_date` and
/// `end_date`: 12 runs instead of 4.
#[tokio::test]
async fn regression_backfill_keeps_to_the_start_and_end_dates() {
    let h = fresh("2026-01-10T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: b, schedule: '0 0 * * * *', start_date: '2026-01-01T05:00:00Z', end_date: '2026-01-01T08:00:00Z', concurrency: allow, tasks: [{ id: a, noop: true }] }\n").await;
    let runs = h
        .handle
        .backfill(
            "t",
            "b",
            ts("2026-01-01T00:00:00Z"),
            ts("2026-01-01T12:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(runs.len(), 4);
    h.idle().await;
    let at: Vec<String> = h
        .fires("b")
        .await
        .iter()
        .map(|f| f.scheduled_at.to_string())
        .collect();
    assert_eq!(
        at,
        [
            "2026-01-01T05:00:00Z",
            "2026-01-01T06:00:00Z",
            "2026-01-01T07:00:00Z",
            "2026-01-01T08:00:00Z"
        ]
    );
    h.stop().await;
}

/// `allow` behaved as `queue`: `max_active_runs` defaulted to 1.
#[tokio::test]
async fn regression_allow_runs_up_to_16_at_once_by_default() {
    // Not the instant most tests start at: run ids come from the clock, and
    // a test that restarts a server kills the processes of the attempts it
    // finds recorded as running, by their identity (run, task, attempt),
    // machine-wide. Sharing ids with such a test, this one's run
    // 1767225600000001 was killed (signal 9) now and then when the tests
    // ran in parallel.
    let h = fresh("2026-01-02T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    h.apply(&format!(
        "namespace: t\njobs:\n  - {{ name: a, tasks: [{{ id: a, shell: 'while [ ! -e {} ]; do sleep 0.01; done' }}] }}\n",
        gate.display()
    ))
    .await;
    for _ in 0..20 {
        h.handle.trigger("t", "a", BTreeMap::new()).await.unwrap();
    }
    let runs = h.runs("a").await;
    let running = runs.iter().filter(|r| r.state == RunState::Running).count();
    let pending = runs.iter().filter(|r| r.state == RunState::Pending).count();
    assert_eq!((running, pending), (16, 4));
    std::fs::write(&gate, "").unwrap();
    h.idle().await;
    h.stop().await;
}

/// A suspended process (SIGSTOP), or a wall clock stepped forward, fired
/// every missed instant in a burst: 47 runs after 40 s stopped, none
/// recorded as missed.
#[tokio::test]
async fn regression_a_clock_step_forward_follows_the_misfire_policy() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", Duration::from_secs(10)).await;
    h.apply("namespace: t\njobs:\n  - { name: s, schedule: '* * * * * *', misfire: run_once, concurrency: allow, max_active_runs: 100, tasks: [{ id: a, noop: true }] }\n").await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("the first fire", async |s| {
        s.last_fires().await.unwrap().len() == 1
    })
    .await;
    // The process "wakes up" 40 s later.
    h.clock.advance(SignedDuration::from_secs(40));
    h.until_fires("s", 41).await;
    h.idle().await;
    let fires = h.fires("s").await;
    let count = |o: FireOutcome| fires.iter().filter(|f| f.outcome == o).count();
    // 00:00:02 .. 00:00:31 are overdue by more than the grace: one caught
    // up (run_once), the others recorded as missed; the last 10 s on time.
    assert_eq!(
        (
            count(FireOutcome::Fired),
            count(FireOutcome::MissedSkipped),
            count(FireOutcome::MissedCaughtUp)
        ),
        (11, 29, 1)
    );
    assert_eq!(h.runs("s").await.len(), 12);
    h.stop().await;
}

/// `replace` started the new run's first attempt 1-3 ms before the
/// replaced run's attempt was recorded as ended.
#[tokio::test]
async fn regression_replace_starts_the_new_run_once_the_old_one_has_ended() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(&dir.path().join("db.sqlite"))
            .await
            .unwrap(),
    );
    let (engine, handle) = Engine::start(
        store.clone(),
        Arc::new(dagcron_runtime::SystemClock),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(engine.run(shutdown.clone(), Duration::from_secs(5)));
    let file: JobFile = serde_saphyr::from_str(
        "namespace: t\njobs:\n  - { name: r, concurrency: replace, tasks: [{ id: a, shell: 'if [ \"$DAGCRON_PARAM_N\" = 1 ]; then sleep 30; fi' }] }\n",
    )
    .unwrap();
    handle.apply(file.validate().unwrap()).await.unwrap();
    let param = |n: &str| BTreeMap::from([("n".to_string(), n.to_string())]);
    let old = handle.trigger("t", "r", param("1")).await.unwrap();
    until_async("the first attempt started", async || {
        !store.get_run(old).await.unwrap().unwrap().tasks[0]
            .attempts
            .is_empty()
    })
    .await;
    let new = handle.trigger("t", "r", param("2")).await.unwrap();
    let r = until_async("the new run ended", async || {
        let r = store.get_run(new).await.unwrap().unwrap();
        r.state.is_terminal().then_some(r)
    })
    .await;
    assert_eq!(r.state, RunState::Succeeded);
    let old = store.get_run(old).await.unwrap().unwrap();
    let new = store.get_run(new).await.unwrap().unwrap();
    assert_eq!(old.state, RunState::Cancelled);
    let ended = old.tasks[0].attempts[0].finished_at.unwrap();
    let started = new.tasks[0].attempts[0].started_at;
    assert!(
        started >= ended,
        "the new attempt started at {started}, before the replaced one ended at {ended}"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// The mark that a run is being cancelled lived only in memory: after a
/// crash, the cancelled run's lost attempt was retried.
#[tokio::test]
async fn regression_an_acknowledged_cancel_survives_a_crash() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - name: c\n    retry: { max_attempts: 5, backoff: fixed, initial: 1s, max: 1s }\n    tasks: [{ id: a, shell: 'sleep 30' }]\n").await;
    // A cancel is recorded before it is acknowledged.
    let cancelled = h.handle.trigger("t", "c", BTreeMap::new()).await.unwrap();
    h.until("attempt running", async |s| {
        !s.get_run(cancelled).await.unwrap().unwrap().tasks[0]
            .attempts
            .is_empty()
    })
    .await;
    h.handle.cancel(cancelled).await.unwrap();
    let r = h.store.get_run(cancelled).await.unwrap().unwrap();
    assert_eq!(r.closing, Some(RunState::Cancelled));
    // The crash comes between the acknowledged cancel and the end of the
    // attempt: the store then holds what a second run shows here.
    let run = h.handle.trigger("t", "c", BTreeMap::new()).await.unwrap();
    h.until("attempt running", async |s| {
        !s.get_run(run).await.unwrap().unwrap().tasks[0]
            .attempts
            .is_empty()
    })
    .await;
    h.task.abort();
    h.store
        .write(&[dagcron_store::Write::RunClosing {
            run,
            to: RunState::Cancelled,
        }])
        .await
        .unwrap();
    let (dir, clock) = (h.store.clone(), h.clock.clone());
    drop(h);
    let h = start(dir, clock, EngineConfig::default()).await;
    h.clock.advance(SignedDuration::from_secs(5));
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    let states: Vec<AttemptState> = r.tasks[0].attempts.iter().map(|a| a.state).collect();
    assert_eq!(r.state, RunState::Cancelled);
    assert_eq!(
        states,
        [AttemptState::Lost],
        "the cancelled run was retried"
    );
    h.stop().await;
}

/// Per-job series are bounded: past the bound, a job's fires count in its
/// namespace's series and it has no gauges of its own; a deleted job gives
/// its place back.
#[tokio::test]
async fn per_job_series_collapse_into_the_namespace_past_the_bound() {
    let config = EngineConfig {
        misfire_grace: LONG_GRACE,
        metrics: Some(Arc::new(EngineMetrics::new(2))),
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:00Z", config).await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: a, schedule: '*/10 * * * * *', tasks: [{ id: x, noop: true }] }\n",
        "  - { name: b, schedule: '*/10 * * * * *', tasks: [{ id: x, noop: true }] }\n",
        "  - { name: c, schedule: '*/10 * * * * *', tasks: [{ id: x, noop: true }] }\n",
    ))
    .await;
    h.clock.advance(SignedDuration::from_secs(10));
    h.until("three fires", async |s| {
        s.last_fires().await.unwrap().len() == 3
    })
    .await;
    h.idle().await;
    let fired = |job: &str| {
        h.sample(&format!(
            "dagcron_fires_total{{namespace=\"t\",{job}outcome=\"fired\"}}"
        ))
    };
    let next = |job: &str| {
        h.sample(&format!(
            "dagcron_job_next_fire_timestamp_seconds{{namespace=\"t\",job=\"{job}\"}}"
        ))
    };
    assert_eq!(
        [
            fired("job=\"a\","),
            fired("job=\"b\","),
            fired("job=\"c\","),
            fired("job=\"_other\",")
        ],
        [1.0, 1.0, 0.0, 1.0],
        "two jobs have series of their own, the third counts in its namespace"
    );
    let at_20 = ts("2026-01-01T00:00:20Z").as_second() as f64;
    assert_eq!([next("a"), next("b"), next("c")], [at_20, at_20, 0.0]);
    assert_eq!(
        h.sample("dagcron_job_period_seconds{namespace=\"t\",job=\"a\"}"),
        10.0
    );
    // Deleting a job frees its place: the next job seen takes it (a job
    // counted in its namespace stays there, so that no series jumps).
    h.handle.delete("t", "a").await.unwrap();
    h.apply("namespace: t\njobs:\n  - { name: d, schedule: '*/10 * * * * *', tasks: [{ id: x, noop: true }] }\n").await;
    h.clock.advance(SignedDuration::from_secs(10));
    h.until("the fires of b, c and d at :20", async |s| {
        let last = s.last_fires().await.unwrap();
        ["b", "c", "d"].iter().all(|name| {
            last.iter()
                .any(|(_, job, at)| job == name && *at == ts("2026-01-01T00:00:20Z"))
        })
    })
    .await;
    h.idle().await;
    assert_eq!(
        [
            fired("job=\"a\","),
            fired("job=\"b\","),
            fired("job=\"c\","),
            fired("job=\"d\","),
            fired("job=\"_other\",")
        ],
        [0.0, 2.0, 0.0, 1.0, 2.0]
    );
    h.stop().await;
}

/// The states of a run's tasks, whether each was carried over, and how
/// many attempts it had.
fn task_states(r: &RunRecord) -> Vec<(&str, TaskState, bool, usize)> {
    r.tasks
        .iter()
        .map(|t| (t.id.as_str(), t.state, t.carried, t.attempts.len()))
        .collect()
}

/// A re-run runs the job version and parameters of the run it re-runs,
/// linked to it: from its failed tasks (and everything downstream of them,
/// a failure handler included), the others carried over with their
/// outcome and no attempt; or whole. A run still going, a run with
/// nothing failed (asked for its failed tasks), a run of a deleted job and
/// a run that does not exist are refused.
#[tokio::test]
async fn a_rerun_runs_the_failed_tasks_of_the_same_version_again() {
    use dagcron_runtime::EngineError;
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let (trace, fixed, gate) = (
        dir.path().join("trace"),
        dir.path().join("fixed"),
        dir.path().join("gate"),
    );
    let file = |extract: &str| {
        format!(
            r#"
namespace: t
jobs:
  - name: etl
    params: {{ region: eu }}
    tasks:
      - {{ id: extract, shell: "echo {extract} >> {t}" }}
      - {{ id: side, shell: "echo side >> {t}" }}
      - {{ id: transform, depends_on: [extract], shell: "test -e {f} && echo transform-$DAGCRON_PARAM_REGION >> {t}" }}
      - {{ id: load, depends_on: [transform], shell: "echo load >> {t}" }}
      - {{ id: page, depends_on: [load], trigger_rule: one_failed, shell: "echo page >> {t}" }}
  - name: gated
    concurrency: forbid
    tasks: [{{ id: a, shell: "while [ ! -e {g} ]; do sleep 0.01; done" }}]
"#,
            t = trace.display(),
            f = fixed.display(),
            g = gate.display(),
        )
    };
    h.apply(&file("extract-v1")).await;
    let params = BTreeMap::from([("region".to_string(), "us".to_string())]);
    let first = h.handle.trigger("t", "etl", params.clone()).await.unwrap();
    h.until("first run failed", async |s| {
        s.get_run(first).await.unwrap().unwrap().state == RunState::Failed
    })
    .await;
    let lines = || -> Vec<String> {
        let text = std::fs::read_to_string(&trace).unwrap_or_default();
        text.lines().map(str::to_string).collect()
    };
    let mut seen = lines();
    seen.sort();
    assert_eq!(seen, ["extract-v1", "page", "side"]);
    // The job changes; the fix arrives; the failed part runs again, as it was.
    h.apply(&file("extract-v2")).await;
    std::fs::write(&fixed, "").unwrap();
    std::fs::remove_file(&trace).unwrap();
    let again = h.handle.rerun(first, true).await.unwrap();
    h.until("the re-run succeeded", async |s| {
        s.get_run(again).await.unwrap().unwrap().state == RunState::Succeeded
    })
    .await;
    let r = h.store.get_run(again).await.unwrap().unwrap();
    let f = h.store.get_run(first).await.unwrap().unwrap();
    assert_eq!(
        (
            r.trigger,
            r.rerun_of,
            r.job_version,
            &r.params,
            r.scheduled_at
        ),
        (Trigger::Rerun, Some(first), 1, &params, f.scheduled_at),
        "the same version, parameters and instant as the run re-run"
    );
    assert_eq!(
        task_states(&r),
        [
            ("extract", TaskState::Succeeded, true, 0),
            ("side", TaskState::Succeeded, true, 0),
            ("transform", TaskState::Succeeded, false, 1),
            ("load", TaskState::Succeeded, false, 1),
            ("page", TaskState::Skipped, false, 0),
        ],
        "the failure handler is decided again: nothing failed this time"
    );
    assert_eq!(lines(), ["transform-us", "load"]);
    // Nothing failed: there is nothing to re-run from.
    let refused = h.handle.rerun(again, true).await;
    assert!(
        matches!(&refused, Err(EngineError::Conflict(m)) if m.contains("re-run it whole")),
        "{refused:?}"
    );
    // Whole, a re-run of a re-run runs every task of version 1 again.
    std::fs::remove_file(&trace).unwrap();
    let whole = h.handle.rerun(again, false).await.unwrap();
    h.until("the whole re-run succeeded", async |s| {
        s.get_run(whole).await.unwrap().unwrap().state == RunState::Succeeded
    })
    .await;
    let r = h.store.get_run(whole).await.unwrap().unwrap();
    assert_eq!((r.rerun_of, r.job_version), (Some(again), 1));
    assert!(r.tasks.iter().all(|t| !t.carried));
    let mut seen = lines();
    seen.sort();
    assert_eq!(seen, ["extract-v1", "load", "side", "transform-us"]);

    // A run still going is refused, and so is a re-run that its version's
    // concurrency policy declines, and a run that does not exist.
    std::fs::write(&gate, "").unwrap();
    let done = h
        .handle
        .trigger("t", "gated", BTreeMap::new())
        .await
        .unwrap();
    h.idle().await;
    std::fs::remove_file(&gate).unwrap();
    let going = h
        .handle
        .trigger("t", "gated", BTreeMap::new())
        .await
        .unwrap();
    let refused = h.handle.rerun(going, false).await;
    assert!(
        matches!(&refused, Err(EngineError::Conflict(m)) if m.contains("has not finished")),
        "{refused:?}"
    );
    let refused = h.handle.rerun(done, false).await;
    assert!(
        matches!(&refused, Err(EngineError::Conflict(m)) if m.contains("forbid")),
        "{refused:?}"
    );
    std::fs::write(&gate, "").unwrap();
    h.idle().await;
    assert!(matches!(
        h.handle.rerun(424_242, false).await,
        Err(EngineError::NotFound(_))
    ));
    // A run of a deleted job is refused with the reason.
    h.handle.delete("t", "gated").await.unwrap();
    let refused = h.handle.rerun(going, false).await;
    assert!(
        matches!(&refused, Err(EngineError::Conflict(m)) if m.contains("deleted")),
        "{refused:?}"
    );
    assert_eq!(h.runs("gated").await.len(), 2, "nothing was created");
    h.stop().await;
}

/// A re-run of an older version that the engine is restarted in the middle
/// of goes on with that version's tasks, not the job's current ones.
#[tokio::test]
async fn regression_a_rerun_of_an_older_version_survives_a_restart_as_that_version() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let (trace, fixed, gate) = (
        dir.path().join("trace"),
        dir.path().join("fixed"),
        dir.path().join("gate"),
    );
    let file = |word: &str| {
        format!(
            "namespace: t\njobs:\n  - name: j\n    retry: {{ max_attempts: 2, backoff: fixed, initial: 1s, retry_on: {{ exit_codes: [75] }} }}\n    tasks: [{{ id: a, shell: 'test -e {f} || exit 3; while [ ! -e {g} ]; do sleep 0.01; done; echo {word} >> {t}' }}]\n",
            f = fixed.display(),
            g = gate.display(),
            t = trace.display(),
        )
    };
    h.apply(&file("v1")).await;
    let first = h.handle.trigger("t", "j", BTreeMap::new()).await.unwrap();
    h.idle().await;
    h.apply(&file("v2")).await;
    std::fs::write(&fixed, "").unwrap();
    let again = h.handle.rerun(first, true).await.unwrap();
    h.until("the re-run's attempt runs", async |s| {
        !s.get_run(again).await.unwrap().unwrap().tasks[0]
            .attempts
            .is_empty()
    })
    .await;
    h.task.abort();
    let (dir2, clock) = (h.store.clone(), h.clock.clone());
    drop(h);
    let h = start(dir2, clock, EngineConfig::default()).await;
    // The lost attempt is retried after its backoff.
    h.clock.advance(SignedDuration::from_secs(5));
    std::fs::write(&gate, "").unwrap();
    h.until("the re-run succeeded", async |s| {
        s.get_run(again).await.unwrap().unwrap().state == RunState::Succeeded
    })
    .await;
    let r = h.store.get_run(again).await.unwrap().unwrap();
    assert_eq!(r.job_version, 1);
    assert_eq!(
        r.tasks[0]
            .attempts
            .iter()
            .map(|a| a.state)
            .collect::<Vec<_>>(),
        [AttemptState::Lost, AttemptState::Succeeded]
    );
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), "v1\n");
    h.stop().await;
}

/// Versions stored before versions recorded their rules get the rules of
/// the first start that sees them; a version with rules keeps them.
#[tokio::test]
async fn versions_stored_without_rules_are_stamped_at_start() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let file: JobFile = serde_saphyr::from_str(
        "namespace: t\njobs:\n  - { name: old, schedule: '0 0 * * *', timezone: Europe/Berlin, tasks: [{ id: a, noop: true }] }\n  - { name: odd, schedule: '0 0 * * *', tasks: [{ id: a, noop: true }] }\n",
    )
    .unwrap();
    let jobs = file.validate().unwrap();
    let odd = dagcron_core::Rules {
        tzdb: "2000a".into(),
        ..jobs[1].rules()
    };
    h.store
        .apply_jobs(
            &[
                JobUpsert {
                    rules: None,
                    ..JobUpsert::of(&jobs[0])
                },
                JobUpsert {
                    rules: Some(odd.clone()),
                    ..JobUpsert::of(&jobs[1])
                },
            ],
            ts("2026-01-01T00:00:00Z"),
        )
        .await
        .unwrap();
    let (dir, clock) = h.stop().await;
    let h = start(dir, clock, EngineConfig::default()).await;
    let old = h.store.get_job("t", "old").await.unwrap().unwrap();
    assert_eq!(old.rules, Some(jobs[0].rules()));
    let version = h
        .store
        .get_job_version("t", "old", 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(version.info.rules, Some(jobs[0].rules()));
    let kept = h.store.get_job("t", "odd").await.unwrap().unwrap();
    assert_eq!(kept.rules, Some(odd), "recorded rules are never rewritten");
    h.stop().await;
}

/// A job's `anchor` reaches the timing the engine fires by (and the job it
/// reads back from the store ahead of each fire): `@every 90m` anchored at
/// 00:10 fires at 00:10 and 01:40, not on the epoch's 00:00 and 01:30.
#[tokio::test]
async fn an_anchored_every_schedule_fires_from_its_anchor() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    h.apply("namespace: t\njobs:\n  - { name: e, schedule: '@every 90m', anchor: '2026-01-01T08:10:00+08:00', tasks: [{ id: a, noop: true }] }\n").await;
    h.clock.advance(SignedDuration::from_mins(100));
    h.until_fires("e", 2).await;
    h.idle().await;
    let fires = h.fires("e").await;
    let at: Vec<String> = fires.iter().map(|f| f.scheduled_at.to_string()).collect();
    assert_eq!(at, ["2026-01-01T00:10:00Z", "2026-01-01T01:40:00Z"]);
    assert_eq!(
        outcomes_of(&fires),
        [FireOutcome::Fired, FireOutcome::Fired]
    );
    h.stop().await;
}

/// A namespace's scheduled fires per second are bounded on a node
/// (`max_fires_per_namespace`): beyond the quota a fire makes no run and
/// is recorded `skipped_quota`; another namespace's fires are not counted
/// against it, and manual triggers are not scheduled fires.
#[tokio::test]
async fn a_namespace_past_its_fire_quota_skips_fires_and_another_does_not() {
    let config = EngineConfig {
        misfire_grace: LONG_GRACE,
        max_fires_per_namespace: Some(2),
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:00Z", config).await;
    let noisy: String = (0..5)
        .map(|i| {
            format!(
                "  - {{ name: n{i}, schedule: '* * * * * *', tasks: [{{ id: a, noop: true }}] }}\n"
            )
        })
        .collect();
    h.apply(&format!("namespace: t\njobs:\n{noisy}")).await;
    h.apply("namespace: u\njobs:\n  - { name: quiet, schedule: '* * * * * *', tasks: [{ id: a, noop: true }] }\n")
        .await;
    for _ in 0..3 {
        h.clock.advance(SignedDuration::from_secs(1));
    }
    let all = |ns: &'static str, jobs: Vec<String>| {
        let store = h.store.clone();
        async move {
            let mut out = Vec::new();
            for job in jobs {
                out.extend(
                    store
                        .list_fires(ns, &job, Timestamp::UNIX_EPOCH, Timestamp::MAX, 1000)
                        .await
                        .unwrap(),
                );
            }
            out
        }
    };
    let names: Vec<String> = (0..5).map(|i| format!("n{i}")).collect();
    h.until("every fire of three seconds recorded", async |_| {
        all("t", names.clone()).await.len() == 15 && all("u", vec!["quiet".into()]).await.len() == 3
    })
    .await;
    let noisy = all("t", names.clone()).await;
    let count = |o: FireOutcome| noisy.iter().filter(|f| f.outcome == o).count();
    assert_eq!(count(FireOutcome::Fired), 6, "two a second");
    assert_eq!(count(FireOutcome::SkippedQuota), 9);
    assert!(
        noisy
            .iter()
            .filter(|f| f.outcome == FireOutcome::SkippedQuota)
            .all(|f| f.run_id.is_none())
    );
    let quiet = all("u", vec!["quiet".into()]).await;
    assert_eq!(
        outcomes_of(&quiet),
        [FireOutcome::Fired; 3],
        "not counted against t's quota"
    );
    h.handle.trigger("t", "n0", BTreeMap::new()).await.unwrap();
    h.stop().await;
}

/// Backpressure: a job's waiting runs are bounded (`max_pending_runs`): a
/// fire beyond it makes no run and is recorded `skipped_backlog`, a manual
/// trigger is refused as busy; past the ready backlog of the server,
/// triggers and backfills are refused while scheduled fires go on.
#[tokio::test]
async fn backpressure_bounds_waiting_runs_and_refuses_manual_work() {
    let config = EngineConfig {
        misfire_grace: LONG_GRACE,
        pool_size: 1,
        max_ready_backlog: 2,
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:00Z", config).await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let wait = format!("while [ ! -e {} ]; do sleep 0.01; done", gate.display());
    h.apply(&format!(
        concat!(
            "namespace: t\njobs:\n",
            "  - {{ name: q, schedule: '* * * * * *', concurrency: queue, max_pending_runs: 2, tasks: [{{ id: a, shell: '{wait}' }}] }}\n",
            "  - {{ name: wide, tasks: [{{ id: a, shell: '{wait}' }}, {{ id: b, shell: '{wait}' }}, {{ id: c, shell: '{wait}' }}] }}\n",
        ),
        wait = wait
    ))
    .await;
    for _ in 0..5 {
        h.clock.advance(SignedDuration::from_secs(1));
    }
    h.until_fires("q", 5).await;
    assert_eq!(
        outcomes_of(&h.fires("q").await),
        [
            FireOutcome::Fired,
            FireOutcome::Fired,
            FireOutcome::Fired,
            FireOutcome::SkippedBacklog,
            FireOutcome::SkippedBacklog
        ],
        "one runs, two wait, the next fires are the backlog's"
    );
    assert!(matches!(
        h.handle.trigger("t", "q", BTreeMap::new()).await,
        Err(dagcron_runtime::EngineError::Busy(_))
    ));
    // The pool (1) is taken by q's run: wide's three tasks wait, past the
    // server's ready backlog (2).
    h.handle
        .trigger("t", "wide", BTreeMap::new())
        .await
        .unwrap();
    let busy = h.handle.trigger("t", "wide", BTreeMap::new()).await;
    assert!(
        matches!(&busy, Err(dagcron_runtime::EngineError::Busy(m)) if m.contains("ready") && m.contains("3 of them t's")),
        "{busy:?}"
    );
    // The backlog is namespace t's: another namespace, under its share
    // (half of the limit of 2), still gets one run in, not two.
    h.apply(&format!(
        "namespace: u\njobs:\n  - {{ name: other, tasks: [{{ id: a, shell: '{wait}' }}] }}\n"
    ))
    .await;
    h.handle
        .trigger("u", "other", BTreeMap::new())
        .await
        .unwrap();
    let busy = h.handle.trigger("u", "other", BTreeMap::new()).await;
    assert!(
        matches!(&busy, Err(dagcron_runtime::EngineError::Busy(m)) if m.contains("1 of them u's")),
        "{busy:?}"
    );
    let backfill = h
        .handle
        .backfill(
            "t",
            "q",
            ts("2025-12-31T00:00:00Z"),
            ts("2025-12-31T00:00:02Z"),
        )
        .await;
    assert!(matches!(
        backfill,
        Err(dagcron_runtime::EngineError::Busy(_))
    ));
    // Scheduled fires go on meanwhile (recorded, here as the job's backlog).
    h.clock.advance(SignedDuration::from_secs(1));
    h.until_fires("q", 6).await;
    std::fs::write(&gate, "").unwrap();
    h.idle().await;
    h.stop().await;
}

#[tokio::test]
async fn fires_in_an_exclusion_calendar_are_suppressed_on_time_and_after_downtime() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(concat!(
        "namespace: t\ncalendars:\n",
        "  - { name: quiet, timezone: Europe/Berlin, cron: ['2,3,7 * * * *'] }\n",
        "jobs:\n",
        "  - { name: a, schedule: '0 * * * * *', misfire: run_all, exclude: [quiet], tasks: [{ id: a, shell: 'true' }] }\n",
    ))
    .await;
    for n in 1..=5 {
        h.clock.advance(SignedDuration::from_secs(60));
        h.until("the minute's fire recorded", async |s| {
            s.list_fires("t", "a", Timestamp::UNIX_EPOCH, Timestamp::MAX, 100)
                .await
                .unwrap()
                .len()
                == n
        })
        .await;
        h.idle().await;
    }
    use FireOutcome::*;
    assert_eq!(
        outcomes_of(&h.fires("a").await),
        [Fired, Suppressed, Suppressed, Fired, Fired]
    );
    assert!(
        h.fires("a").await[1..3]
            .iter()
            .all(|f| f.run_id.is_none() && f.calendar.as_deref() == Some("quiet")),
        "a suppressed fire makes no run and names its calendar"
    );
    assert_eq!(h.fires("a").await[0].calendar, None);
    assert_eq!(h.runs("a").await.len(), 3);
    assert_eq!(
        h.sample(r#"dagcron_fires_total{namespace="t",job="a",outcome="suppressed"}"#),
        2.0
    );
    // Down over minutes 6 to 9: minute 7 is suppressed, the others are
    // caught up by the misfire policy.
    let (dir, clock) = h.stop().await;
    clock.advance(SignedDuration::from_secs(4 * 60 + 30));
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(dir, clock, config).await;
    h.idle().await;
    let fires = h.fires("a").await;
    assert_eq!(
        outcomes_of(&fires[5..]),
        [MissedCaughtUp, Suppressed, MissedCaughtUp, MissedCaughtUp]
    );
    assert_eq!(fires[6].scheduled_at, ts("2026-01-01T00:07:00Z"));
    assert_eq!(fires[6].calendar.as_deref(), Some("quiet"));
    assert_eq!(h.runs("a").await.len(), 6);
    h.stop().await;
}

#[tokio::test]
async fn a_jittered_fire_is_made_late_by_its_amount_and_keeps_its_instant() {
    let yaml = "namespace: t\njobs:\n  - { name: spread, schedule: '@hourly', jitter: 30m, tasks: [{ id: a, shell: 'true' }] }\n";
    let file: JobFile = serde_saphyr::from_str(yaml).unwrap();
    let timing = file.validate().unwrap()[0].timing();
    let at = ts("2026-01-01T01:00:00Z");
    let due = dagcron_core::fires::jittered(&timing, at);
    let delay = due.duration_since(at);
    assert!(
        delay > SignedDuration::from_secs(1) && delay < SignedDuration::from_mins(30),
        "{delay:?}"
    );
    let h = fresh("2026-01-01T00:30:00Z").await;
    h.apply(yaml).await;
    // At the nominal instant nothing fires yet.
    h.clock.set(at);
    h.handle.ping().await.unwrap();
    h.handle.ping().await.unwrap();
    assert!(h.fires("spread").await.is_empty());
    h.clock.set(due);
    h.until("the jittered fire", async |s| {
        !s.list_runs("t", "spread", 10, None)
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    h.idle().await;
    let fires = h.fires("spread").await;
    assert_eq!(fires.len(), 1);
    assert_eq!(
        fires[0].scheduled_at, at,
        "the ledger keeps the nominal instant"
    );
    assert_eq!(fires[0].outcome, FireOutcome::Fired);
    let run = &h.runs("spread").await[0];
    assert_eq!(run.scheduled_at, at);
    assert_eq!(run.created_at, due, "made at the jittered instant");
    assert_eq!(
        h.sample(r#"dagcron_fire_lateness_seconds_count{namespace="t"}"#),
        1.0
    );
    assert_eq!(
        h.sample(r#"dagcron_fire_lateness_seconds_sum{namespace="t"}"#),
        0.0,
        "the jitter is not lateness"
    );
    assert_eq!(run.state, RunState::Succeeded);
    h.stop().await;
}

/// `@at` fires once at its instant; one that falls while the engine is down
/// follows the misfire policy when it comes back, and nothing fires again.
#[tokio::test]
async fn an_at_schedule_fires_once_and_late_by_the_misfire_policy() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", Duration::from_secs(60)).await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: soon, schedule: '@at 2026-01-01T00:00:30Z', tasks: [{ id: a, noop: true }] }\n",
        "  - { name: late, schedule: '@at 2026-01-01T01:05:00+01:00', misfire: run_once, tasks: [{ id: a, noop: true }] }\n",
        "  - { name: dropped, schedule: '@at 2026-01-01T00:06:00Z', misfire: skip, tasks: [{ id: a, noop: true }] }\n",
        "  - { name: past, schedule: '@at 2025-12-31T23:00:00Z', tasks: [{ id: a, noop: true }] }\n",
    ))
    .await;
    h.clock.advance(SignedDuration::from_secs(40));
    h.until_fires("soon", 1).await;
    h.idle().await;
    let (dir, clock) = h.stop().await;
    // Down across the instants of `late` (00:05 UTC) and `dropped`.
    clock.advance(SignedDuration::from_mins(10));
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(dir, clock, config).await;
    h.until_fires("late", 1).await;
    h.until_fires("dropped", 1).await;
    h.idle().await;
    // Two days on: none fires again.
    h.clock.advance(SignedDuration::from_hours(48));
    h.handle.ping().await.unwrap();
    h.idle().await;
    let soon = h.fires("soon").await;
    assert_eq!(outcomes_of(&soon), [FireOutcome::Fired]);
    assert_eq!(soon[0].scheduled_at, ts("2026-01-01T00:00:30Z"));
    assert_eq!(h.runs("soon").await.len(), 1);
    let late = h.fires("late").await;
    assert_eq!(outcomes_of(&late), [FireOutcome::MissedCaughtUp]);
    assert_eq!(late[0].scheduled_at, ts("2026-01-01T00:05:00Z"));
    let runs = h.runs("late").await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].trigger, Trigger::Catchup);
    assert_eq!(
        outcomes_of(&h.fires("dropped").await),
        [FireOutcome::MissedSkipped]
    );
    assert!(h.runs("dropped").await.is_empty());
    // Applied after its instant: it has nothing left to fire.
    assert!(h.fires("past").await.is_empty());
    h.stop().await;
}

/// A trigger `at` an instant records a `planned` run, made at its instant
/// exactly once; it survives a restart, is made late by the misfire
/// policy when its instant passed while the engine was down, and a cancel
/// before its instant ends it without a task started.
#[tokio::test]
async fn a_run_planned_for_an_instant_is_made_then_once() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", Duration::from_secs(60)).await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: once, misfire: run_once, tasks: [{ id: a, noop: true }] }\n",
        "  - { name: skip, misfire: skip, tasks: [{ id: a, noop: true }] }\n",
    ))
    .await;
    let plan = async |job: &str, at: &str| {
        h.handle
            .trigger_traced("t", job, Default::default(), None, Some(ts(at)))
            .await
            .unwrap()
    };
    let soon = plan("once", "2026-01-01T00:00:30Z").await;
    let cancelled = plan("once", "2026-01-01T00:00:40Z").await;
    let late = plan("once", "2026-01-01T00:10:00Z").await;
    let dropped = plan("skip", "2026-01-01T00:10:00Z").await;
    let state = async |id| h.store.get_run(id).await.unwrap().unwrap().state;
    for id in [soon, cancelled, late, dropped] {
        assert_eq!(state(id).await, RunState::Planned);
    }
    h.handle.cancel(cancelled).await.unwrap();
    h.clock.advance(SignedDuration::from_secs(45));
    h.until("the first planned run made", async |s| {
        s.get_run(soon).await.unwrap().unwrap().state == RunState::Succeeded
    })
    .await;
    let run = h.store.get_run(soon).await.unwrap().unwrap();
    assert_eq!(run.scheduled_at, ts("2026-01-01T00:00:30Z"));
    assert_eq!(run.trigger, Trigger::Manual);
    let cancelled_run = h.store.get_run(cancelled).await.unwrap().unwrap();
    assert_eq!(cancelled_run.state, RunState::Cancelled);
    assert!(cancelled_run.tasks.iter().all(|t| t.attempts.is_empty()));
    // Down from 00:00:45 to 00:20:45, across the instant of the other two.
    let (dir, clock) = h.stop().await;
    clock.advance(SignedDuration::from_mins(20));
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(dir, clock, config).await;
    h.idle().await;
    let late_run = h.store.get_run(late).await.unwrap().unwrap();
    assert_eq!(
        late_run.state,
        RunState::Succeeded,
        "run_once makes it late"
    );
    assert_eq!(late_run.scheduled_at, ts("2026-01-01T00:10:00Z"));
    let dropped_run = h.store.get_run(dropped).await.unwrap().unwrap();
    assert_eq!(dropped_run.state, RunState::Skipped, "skip drops it");
    assert!(dropped_run.tasks.iter().all(|t| t.attempts.is_empty()));
    // Nothing is made twice, now or later.
    h.clock.advance(SignedDuration::from_hours(1));
    h.handle.ping().await.unwrap();
    h.idle().await;
    assert_eq!(h.runs("once").await.len(), 3);
    assert_eq!(h.runs("skip").await.len(), 1);
    assert!(
        h.store
            .planned_runs("t", "once", 10)
            .await
            .unwrap()
            .is_empty()
    );
    h.stop().await;
}

/// A held task: an attempt lost under at-most-once delivery is held, not
/// failed, after the restart (an operator decides whether it ran); a held
/// task stays held across a restart and is retried by hand past its
/// attempts; the run's deadline cancels it.
#[tokio::test]
async fn held_tasks_wait_across_a_restart_until_an_operator_or_the_deadline() {
    use dagcron_core::run::Intervention;
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: once, delivery: at_most_once, on_exhausted: hold, tasks: [{ id: a, shell: 'sleep 30' }, { id: b, depends_on: [a], noop: true }] }\n",
        "  - { name: late, deadline: 10m, retry: { max_attempts: 2, backoff: fixed, initial: 1m }, tasks: [{ id: a, shell: 'false', on_exhausted: hold }] }\n",
    ))
    .await;
    let once = h
        .handle
        .trigger("t", "once", BTreeMap::new())
        .await
        .unwrap();
    let late = h
        .handle
        .trigger("t", "late", BTreeMap::new())
        .await
        .unwrap();
    let task_of = async |s: &MemoryStore, run| {
        let r = s.get_run(run).await.unwrap().unwrap();
        (r.tasks[0].state, r.tasks[0].attempts.len())
    };
    h.until("once's attempt running and late retrying", async |s| {
        task_of(s, once).await.1 == 1 && task_of(s, late).await.0 == TaskState::Retrying
    })
    .await;
    h.clock.advance(SignedDuration::from_secs(60));
    h.until("late held after its 2 attempts", async |s| {
        task_of(s, late).await.0 == TaskState::Held
    })
    .await;
    assert_eq!(
        h.handle.gauges().await.unwrap().held,
        [("t".to_string(), 1)]
    );
    // A crash: once's attempt is lost; at most once, it is not run again.
    h.task.abort();
    let (dir_h, clock) = (h.store.clone(), h.clock.clone());
    drop(h);
    let h = start(dir_h, clock, EngineConfig::default()).await;
    h.until("once held", async |s| {
        task_of(s, once).await.0 == TaskState::Held
    })
    .await;
    let r = h.store.get_run(once).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.tasks[0].attempts[0].state, r.tasks[1].state),
        (RunState::Running, AttemptState::Lost, TaskState::Pending)
    );
    assert_eq!(
        h.handle.gauges().await.unwrap().held,
        [("t".to_string(), 2)]
    );
    // It did run, the operator knows: marked succeeded, the run goes on.
    h.handle
        .intervene(once, "a", Intervention::MarkSucceeded)
        .await
        .unwrap();
    h.until("once succeeded", async |s| {
        s.get_run(once).await.unwrap().unwrap().state == RunState::Succeeded
    })
    .await;
    assert!(matches!(
        h.handle.intervene(once, "a", Intervention::Retry).await,
        Err(dagcron_runtime::EngineError::Conflict(m)) if m.contains("has ended succeeded")
    ));
    // Late's held task, rebuilt held, retried by hand: attempt 3 of 2.
    assert_eq!(task_of(&h.store, late).await.0, TaskState::Held);
    h.handle
        .intervene(late, "a", Intervention::Retry)
        .await
        .unwrap();
    h.until("late held again after attempt 3", async |s| {
        task_of(s, late).await == (TaskState::Held, 3)
    })
    .await;
    assert!(matches!(
        h.handle.intervene(late, "zz", Intervention::Fail).await,
        Err(dagcron_runtime::EngineError::NotFound(_))
    ));
    // Its deadline: the held task is cancelled, the run fails.
    h.clock.advance(SignedDuration::from_secs(10 * 60));
    h.idle().await;
    let r = h.store.get_run(late).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.tasks[0].state),
        (RunState::Failed, TaskState::Cancelled)
    );
    assert!(h.handle.gauges().await.unwrap().held.is_empty());
    h.stop().await;
}

/// A pruner of `store` whose clock stands at `at`, with no pause.
fn pruner_at<S: Store>(
    store: &Arc<S>,
    at: Timestamp,
    metrics: &dagcron_runtime::PruneMetrics,
) -> dagcron_runtime::Pruner<S> {
    dagcron_runtime::Pruner::new(
        store.clone(),
        Arc::new(ManualClock::new(at)),
        dagcron_runtime::PruneConfig {
            pause: Duration::ZERO,
            ..Default::default()
        },
        metrics.clone(),
    )
}

/// The audit log's retention: rows older than its age go when the pruner
/// asks, by the pruner's clock; without an age nothing goes.
#[tokio::test]
async fn the_pruner_cuts_the_audit_log_by_its_age() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("db")).await.unwrap());
    let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    for day in 0..10 {
        let e = dagcron_store::AuditEntry {
            seq: 0,
            at: start + SignedDuration::from_hours(24 * day),
            principal: None,
            principal_name: None,
            action: format!("POST /day/{day}"),
            namespace: None,
            outcome: 200,
            address: None,
            prev_hash: vec![],
            hash: vec![],
        };
        store.append_audit(e).await.unwrap();
    }
    let metrics = dagcron_runtime::PruneMetrics::default();
    let now = start + SignedDuration::from_hours(24 * 10);
    assert_eq!(
        pruner_at(&store, now, &metrics)
            .prune_audit()
            .await
            .unwrap(),
        0
    );
    let keeping = |days: u64| {
        dagcron_runtime::Pruner::new(
            store.clone(),
            Arc::new(ManualClock::new(now)),
            dagcron_runtime::PruneConfig {
                audit_max_age: Some(Duration::from_secs(days * 86_400)),
                ..Default::default()
            },
            metrics.clone(),
        )
    };
    assert_eq!(keeping(3).prune_audit().await.unwrap(), 7, "days 0 to 6 go");
    let left = store.list_audit(0, 100, None).await.unwrap();
    assert_eq!(left.len(), 3);
    let checkpoint = store.audit_checkpoint().await.unwrap().unwrap();
    assert_eq!(
        dagcron_store::verify_audit(&left, Some(&checkpoint)),
        Ok(())
    );
    assert_eq!(keeping(3).prune_audit().await.unwrap(), 0, "nothing more");
}

/// Pruning by a policy that keeps nothing by count leaves a job's newest
/// fire and its run: after a restart, recovery resumes from that fire, so
/// no pruned fire happens again, and the next fire comes on time. The
/// pruner judges ages by its own clock (two days on), counts what it
/// deleted in `dagcron_pruned_total`, and deletes nothing on a second pass.
#[tokio::test]
async fn pruning_never_makes_a_fire_happen_twice() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: hourly, schedule: '0 0 * * * *', misfire: run_all, max_catchup: 100, tasks: [{ id: a, noop: true }] }\n",
    ))
    .await;
    for n in 1..=5 {
        h.clock.advance(SignedDuration::from_secs(3600));
        h.until_fires("hourly", n).await;
        h.idle().await;
    }
    let (store, clock) = h.stop().await;
    store
        .set_setting(
            &dagcron_runtime::prune::setting_key("t"),
            Some(r#"{"max_age_seconds": 3600, "keep_last": 0}"#),
            clock.now(),
        )
        .await
        .unwrap();
    let metrics = dagcron_runtime::PruneMetrics::default();
    let later = clock.now() + SignedDuration::from_hours(48);
    let pruner = pruner_at(&store, later, &metrics);
    let report = pruner.pass_now(None, false).await.unwrap();
    let pruned = report.namespaces["t"];
    assert_eq!((pruned.runs, pruned.attempts, pruned.fires), (4, 4, 4));
    assert!(
        pruner
            .pass_now(None, false)
            .await
            .unwrap()
            .namespaces
            .is_empty()
    );
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("dagcron_pruned_total{what=\"runs\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("dagcron_pruned_total{what=\"jobs\"} 0"),
        "{text}"
    );
    drop(pruner);

    let config = EngineConfig {
        misfire_grace: LONG_GRACE,
        ..EngineConfig::default()
    };
    let h = start(store, clock, config).await;
    h.clock.advance(SignedDuration::from_secs(3600));
    h.until_fires("hourly", 2).await;
    h.idle().await;
    let fires: Vec<_> = h
        .store
        .list_fires("t", "hourly", Timestamp::UNIX_EPOCH, Timestamp::MAX, 100)
        .await
        .unwrap()
        .iter()
        .map(|f| (f.scheduled_at, f.outcome))
        .collect();
    assert_eq!(
        fires,
        [
            (ts("2026-01-01T05:00:00Z"), FireOutcome::Fired),
            (ts("2026-01-01T06:00:00Z"), FireOutcome::Fired)
        ]
    );
    let runs: Vec<_> = h
        .runs("hourly")
        .await
        .iter()
        .map(|r| (r.scheduled_at, r.trigger))
        .collect();
    assert_eq!(
        runs,
        [
            (ts("2026-01-01T05:00:00Z"), Trigger::Schedule),
            (ts("2026-01-01T06:00:00Z"), Trigger::Schedule)
        ]
    );
    h.stop().await;
}

/// A deleted job goes by age alone: once it has been deleted for the
/// policy's age, its runs, its ledger (the newest row too), its versions
/// and its tombstone go, and a dry run says exactly what the pass then
/// deletes.
#[tokio::test]
async fn a_deleted_job_is_forgotten_and_the_dry_run_says_so() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    h.apply(concat!(
        "namespace: t\njobs:\n",
        "  - { name: gone, schedule: '0 0 * * * *', tasks: [{ id: a, noop: true }] }\n",
    ))
    .await;
    for n in 1..=3 {
        h.clock.advance(SignedDuration::from_secs(3600));
        h.until_fires("gone", n).await;
        h.idle().await;
    }
    h.handle.delete("t", "gone").await.unwrap();
    let store = h.store.clone();
    // The database's directory is kept while the store is used: a
    // connection opened after it was removed could not open the file.
    let _dir = h.stop().await;
    // Deleted now (the database's clock); judged 60 days on.
    let later = Timestamp::now() + SignedDuration::from_hours(60 * 24);
    let pruner = pruner_at(&store, later, &Default::default());
    let dry = pruner.pass_now(Some("t"), true).await.unwrap();
    let done = pruner.pass_now(Some("t"), false).await.unwrap();
    assert_eq!(dry, done);
    let pruned = done.namespaces["t"];
    assert_eq!(
        (pruned.runs, pruned.attempts, pruned.fires, pruned.jobs),
        (3, 3, 3, 1)
    );
    assert!(
        store
            .list_runs("t", "gone", 10, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        store
            .list_job_versions("t", "gone", 10, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(store.last_fires().await.unwrap().is_empty());
    assert!(store.history_jobs(None, None, 10).await.unwrap().is_empty());
}

/// After a takeover, a node fired instants another node had already
/// recorded: the ledger refused them, but the runs the engine had made for
/// them stayed in its memory, each holding a place of its job for good (a
/// job of 16 places ran 2 at a time, its pending runs growing). The run of
/// a refused fire is now dropped at once: its task never starts here (the
/// node that recorded the fire runs it), and the next run takes the place.
#[tokio::test]
async fn regression_the_run_of_a_fire_already_recorded_is_dropped() {
    // The engine's log, kept: the refused run's other writes, refused in
    // turn, are no bug to report (a test on one thread sees every line).
    #[derive(Clone, Default)]
    struct Kept(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Kept {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Kept::default();
    let writer = log.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish(),
    );
    let h = fresh("2026-01-01T00:00:59.5Z").await;
    let marks = tempfile::tempdir().unwrap();
    h.apply(&format!(
        "namespace: t\njobs:\n  - name: m\n    schedule: '* * * * * *'\n    concurrency: queue\n    max_active_runs: 1\n    tasks: [{{ id: a, shell: 'touch {}/ran-$DAGCRON_SCHEDULED_AT' }}]\n",
        marks.path().display()
    ))
    .await;
    // Another node fired 00:01:00 first.
    let taken = ts("2026-01-01T00:01:00Z");
    let fire = dagcron_store::Write::Fire {
        namespace: "t".into(),
        job: "m".into(),
        scheduled_at: taken,
        outcome: FireOutcome::Fired,
        calendar: None,
        run: None,
    };
    assert_eq!(
        h.store.write(&[fire]).await.unwrap(),
        [dagcron_store::WriteResult::Done]
    );
    // Both fires come due in one wake: the refused one first.
    h.clock.set(ts("2026-01-01T00:01:01Z"));
    h.until("the run of 00:01:01 succeeded", async |s| {
        let runs = s.list_runs("t", "m", 10, None).await.unwrap().items;
        runs.iter()
            .any(|r| r.scheduled_at == ts("2026-01-01T00:01:01Z") && r.state == RunState::Succeeded)
    })
    .await;
    let runs = h.runs("m").await;
    assert!(
        runs.iter().all(|r| r.scheduled_at != taken),
        "no run of the refused fire: {runs:?}"
    );
    let mut ran: Vec<String> = std::fs::read_dir(marks.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    ran.sort();
    assert_eq!(
        ran,
        ["ran-2026-01-01T00:01:01Z"],
        "the refused fire's task ran here"
    );
    h.stop().await;
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("is already recorded"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

/// A node whose clock was 3 s ahead of the database's fired 3 s early by
/// the database's clock. A node's engine now waits until a fire is due by
/// the database's clock too, as the node's heartbeats measure it.
#[tokio::test]
async fn regression_a_node_ahead_of_the_database_does_not_fire_early() {
    use dagcron_runtime::{Lease, NodeIdentity};
    use std::sync::atomic::AtomicI64;

    let lease = Lease::new();
    lease.extend_to(ts("2026-01-01T01:00:00Z"));
    let config = EngineConfig {
        node: Some(NodeIdentity {
            slot: 1,
            lease,
            peers: Default::default(),
            ahead_us: Arc::new(AtomicI64::new(3_000_000)),
        }),
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:50Z", config).await;
    h.apply("namespace: t\njobs:\n  - { name: m, schedule: '0 * * * * *', tasks: [{ id: a, noop: true }] }\n  - { name: probe, tasks: [{ id: a, noop: true }] }\n").await;
    let all: dagcron_runtime::Ownership = Arc::new(|_: &str, _: &str| true);
    assert_eq!(h.handle.set_ownership(all).await.unwrap(), 2);
    // At 00:01:02 by this node's clock, 00:00:59 by the database's.
    h.clock.set(ts("2026-01-01T00:01:02Z"));
    // The engine has handled its timers due at this instant.
    h.run_to_end("probe").await;
    assert!(
        h.runs("m").await.is_empty(),
        "fired before its instant by the database's clock"
    );
    h.clock.set(ts("2026-01-01T00:01:03Z"));
    h.until_fires("m", 1).await;
    let run = &h.runs("m").await[0];
    assert_eq!(run.scheduled_at, ts("2026-01-01T00:01:00Z"));
    assert!(run.created_at >= ts("2026-01-01T00:01:03Z"), "{run:?}");
    h.stop().await;
}

/// Output is dropped before it fills the disk: an attempt whose output
/// would leave less than the reserve free keeps a note in its place, and
/// the bytes dropped are counted.
#[tokio::test]
async fn output_that_would_eat_into_the_disk_reserve_is_dropped() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let config = EngineConfig {
        // More than any disk has free.
        output_reserve: Some(dagcron_runtime::OutputReserve {
            dir: dir.path().to_path_buf(),
            bytes: u64::MAX / 4,
        }),
        ..EngineConfig::default()
    };
    let h = start(
        Arc::new(MemoryStore::new()),
        ManualClock::new(ts("2026-01-01T00:00:00Z")),
        config,
    )
    .await;
    h.apply("namespace: t\njobs:\n  - { name: loud, tasks: [{ id: a, shell: 'echo hello' }] }\n")
        .await;
    let id = h.run_to_end("loud").await;
    let log = h.store.read_log(id, "a", 1).await.unwrap().unwrap();
    let text = String::from_utf8(log).unwrap();
    assert!(text.contains("6 bytes of output dropped"), "{text}");
    assert_eq!(h.sample("dagcron_output_dropped_bytes_total"), 6.0);
    h.stop().await;
}

/// After a long outage, the catch-up of the missed fires came as one
/// burst (its output filled the disk again). Runs of missed fires now
/// begin at the pace of the server's and their job's allowances, oldest
/// first, each counted against its job from the moment it is made.
#[tokio::test]
async fn catch_up_runs_begin_at_their_pace() {
    let pace = dagcron_runtime::CatchUpPace {
        per_server: 50,
        per_job: 2,
    };
    let config = || EngineConfig {
        misfire_grace: Duration::ZERO,
        catch_up_pace: Some(pace),
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:00.5Z", config()).await;
    h.apply("namespace: t\njobs:\n  - { name: s, schedule: '* * * * * *', misfire: run_all, max_catchup: 10, concurrency: allow, max_active_runs: 100, tasks: [{ id: a, noop: true }] }\n  - { name: probe, tasks: [{ id: a, noop: true }] }\n").await;
    h.clock.set(ts("2026-01-01T00:00:01Z"));
    h.until_fires("s", 1).await;
    let (dir, clock) = h.stop().await;
    // Down for a minute.
    clock.set(ts("2026-01-01T00:01:01.5Z"));
    let h = start(dir, clock, config()).await;
    let caught_up = async |h: &Harness| {
        h.runs("s")
            .await
            .iter()
            .filter(|r| r.trigger == Trigger::Catchup && r.state == RunState::Succeeded)
            .count()
    };
    h.until("the first two caught up", async |_| {
        caught_up(&h).await >= 2
    })
    .await;
    h.run_to_end("probe").await;
    assert_eq!(
        caught_up(&h).await,
        2,
        "one second's worth of the job's allowance"
    );
    let runs = h.runs("s").await;
    let made = runs
        .iter()
        .filter(|r| r.trigger == Trigger::Catchup)
        .count();
    assert_eq!(made, 10, "every catch-up run is made at once, and waits");
    // Two more each second, the job's allowance.
    for (second, expected) in [("02.5", 4), ("03.5", 6), ("04.5", 8), ("05.5", 10)] {
        h.clock.set(ts(&format!("2026-01-01T00:01:{second}Z")));
        h.until(&format!("{expected} caught up"), async |_| {
            caught_up(&h).await == expected
        })
        .await;
        h.run_to_end("probe").await;
        assert_eq!(caught_up(&h).await, expected);
    }
    h.stop().await;
}

/// A run's end puts its notifications in the outbox in the commit that
/// records the end (the run is never seen ended without them), one per
/// notifier and event, and wakes the outbox.
#[tokio::test]
async fn a_runs_end_writes_its_notifications_in_the_same_commit() {
    let wake = Arc::new(tokio::sync::Notify::new());
    let h = fresh_with(
        "2026-01-01T00:00:00Z",
        EngineConfig {
            outbox: Some(wake.clone()),
            ..EngineConfig::default()
        },
    )
    .await;
    h.apply(
        r#"
namespace: t
notifiers:
  - name: oncall
    webhook: { url: "https://hooks.example.com/x" }
  - name: chat
    slack: { url: { secret: slack-url } }
notify:
  - on: [failed, recovered]
    to: [oncall, chat]
jobs:
  - name: bad
    tasks: [{ id: a, shell: "exit 3" }]
  - name: good
    notify: [{ on: [succeeded], to: [chat] }]
    tasks: [{ id: a, noop: true }]
  - name: quiet
    notify: [{ on: [cancelled], to: [oncall] }]
    tasks: [{ id: a, noop: true }]
"#,
    )
    .await;
    let woken = wake.notified();
    let bad = h.handle.trigger("t", "bad", BTreeMap::new()).await.unwrap();
    h.until("the run of bad failed", async |s| {
        s.get_run(bad).await.unwrap().unwrap().state == RunState::Failed
    })
    .await;
    // Seen ended: its notifications are there already.
    let notes = h
        .store
        .list_notifications("t", false, None, 100)
        .await
        .unwrap();
    let mut made: Vec<(String, String, String)> = notes
        .iter()
        .map(|n| {
            (
                n.made.job.clone(),
                n.made.event.clone(),
                n.made.notifier.clone(),
            )
        })
        .collect();
    made.sort();
    assert_eq!(
        made,
        [
            ("bad".into(), "failed".into(), "chat".into()),
            ("bad".into(), "failed".into(), "oncall".into()),
        ]
    );
    let n = notes.iter().find(|n| n.made.notifier == "oncall").unwrap();
    assert_eq!(n.made.key, format!("t/bad/run-{bad}/failed/oncall"));
    assert_eq!(n.made.run, Some(bad));
    let body: serde_json::Value = serde_json::from_str(&n.made.payload).unwrap();
    assert_eq!(body["run"]["trigger"], "manual");
    assert_eq!(body["run"]["state"], "failed");
    let channel: serde_json::Value = serde_json::from_str(&n.made.channel).unwrap();
    assert_eq!(channel["webhook"]["url"], "https://hooks.example.com/x");
    tokio::time::timeout(Duration::from_secs(30), woken)
        .await
        .expect("the outbox was woken after the commit");
    // A success makes `succeeded` where asked; a run whose rules ask for
    // nothing of its end makes nothing.
    let good = h.run_to_end("good").await;
    h.run_to_end("quiet").await;
    let notes = h
        .store
        .list_notifications("t", false, None, 100)
        .await
        .unwrap();
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert_eq!(
        notes[0].made.key,
        format!("t/good/run-{good}/succeeded/chat")
    );
    h.stop().await;
}

/// A task held for an operator is notified in the batch that holds it,
/// with the task and the attempt it was held after.
#[tokio::test]
async fn a_held_task_is_notified_with_its_task_and_attempt() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(
        r#"
namespace: t
notifiers: [{ name: ops, webhook: { url: "https://hooks.example.com/x" } }]
jobs:
  - name: h
    on_exhausted: hold
    notify: [{ on: [held], to: [ops] }]
    tasks: [{ id: a, shell: "exit 3" }]
"#,
    )
    .await;
    let run = h.handle.trigger("t", "h", BTreeMap::new()).await.unwrap();
    h.until("the task held", async |s| {
        s.get_run(run).await.unwrap().unwrap().tasks[0].state == TaskState::Held
    })
    .await;
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].made.key, format!("t/h/run-{run}/held/a/1/ops"));
    assert_eq!(notes[0].made.event, "held");
    let body: serde_json::Value = serde_json::from_str(&notes[0].made.payload).unwrap();
    assert_eq!(body["task"], serde_json::json!({ "id": "a", "attempt": 1 }));
    assert_eq!(body["run"]["state"], "running");
    h.stop().await;
}

/// The pruner deletes notifications that ended a week ago, a batch at a
/// time, and none that wait for delivery.
#[tokio::test]
async fn the_pruner_deletes_notifications_ended_a_week_ago() {
    let store = Arc::new(MemoryStore::new());
    let at = ts("2026-01-01T00:00:00Z");
    let note = |key: &str| {
        dagcron_store::Write::Notify(dagcron_store::NewNotification {
            key: key.into(),
            namespace: "t".into(),
            job: "j".into(),
            run: None,
            event: "failed".into(),
            notifier: "n".into(),
            channel: "{}".into(),
            payload: "{}".into(),
            at,
        })
    };
    let writes: Vec<_> = (0..1200).map(|i| note(&format!("k{i}"))).collect();
    store.write(&writes).await.unwrap();
    store.write(&[note("waiting")]).await.unwrap();
    let claimed = store
        .claim_notifications("me", at, ts("2026-01-01T00:01:00Z"), 2000)
        .await
        .unwrap();
    for n in claimed.iter().filter(|n| n.made.key != "waiting") {
        let attempt = dagcron_store::DeliveryAttempt {
            number: 1,
            at,
            status: Some(200),
            error: None,
        };
        store
            .record_delivery(
                n.id,
                "me",
                Some(&attempt),
                &dagcron_store::DeliveryEnd::Delivered,
            )
            .await
            .unwrap();
    }
    let metrics = dagcron_runtime::PruneMetrics::default();
    let stop = CancellationToken::new();
    // Six days on: nothing is old enough.
    let pruner = pruner_at(&store, ts("2026-01-07T00:00:00Z"), &metrics);
    assert_eq!(pruner.prune_notifications(&stop).await.unwrap(), 0);
    let pruner = pruner_at(&store, ts("2026-01-08T00:00:01Z"), &metrics);
    assert_eq!(pruner.prune_notifications(&stop).await.unwrap(), 1200);
    let left = store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].made.key, "waiting");
}

/// The failure breaker opens in the batch that ends the job's third run
/// in a row that failed, with its notification; the scheduled fires
/// while it is open are recorded `skipped_breaker` and make no run (a
/// trigger by hand still does); a resume closes it, says so, and the next
/// fire makes a run again.
#[tokio::test]
async fn the_breaker_opens_after_n_failures_skips_fires_and_a_resume_closes_it() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(
        r#"
namespace: t
notifiers: [{ name: ops, webhook: { url: "https://hooks.example.com/x" } }]
jobs:
  - name: b
    schedule: "0 * * * * *"
    breaker: { after_failures: 3 }
    notify: [{ on: [breaker_opened, breaker_closed], to: [ops] }]
    tasks: [{ id: a, shell: "exit 3" }]
"#,
    )
    .await;
    let ended = async |h: &Harness, n: usize| {
        h.until(&format!("{n} runs failed"), async |_| {
            h.runs("b")
                .await
                .iter()
                .filter(|r| r.state == RunState::Failed)
                .count()
                == n
        })
        .await;
    };
    for minute in 1..=3 {
        h.clock.set(ts(&format!("2026-01-01T00:0{minute}:00Z")));
        h.until_fires("b", minute).await;
        ended(&h, minute).await;
        let open = h.store.get_job("t", "b").await.unwrap().unwrap().breaker;
        assert_eq!(open.is_some(), minute == 3, "after {minute} failures");
    }
    let third = h.runs("b").await[2].id;
    let open = h
        .store
        .get_job("t", "b")
        .await
        .unwrap()
        .unwrap()
        .breaker
        .unwrap();
    assert_eq!((open.run, open.failures), (third, 3));
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(
        notes[0].made.key,
        format!("t/b/run-{third}/breaker_opened/ops")
    );
    let body: serde_json::Value = serde_json::from_str(&notes[0].made.payload).unwrap();
    assert_eq!(body["event"], "breaker_opened");
    assert_eq!(body["breaker"]["failures"], 3);
    assert_eq!(body["run"]["id"], third);
    // Two fires while open: recorded, no run.
    for minute in 4..=5 {
        h.clock.set(ts(&format!("2026-01-01T00:0{minute}:00Z")));
        h.until_fires("b", minute).await;
    }
    let fires = h
        .store
        .list_fires("t", "b", Timestamp::UNIX_EPOCH, Timestamp::MAX, 10)
        .await
        .unwrap();
    assert_eq!(
        outcomes_of(&fires),
        [
            FireOutcome::Fired,
            FireOutcome::Fired,
            FireOutcome::Fired,
            FireOutcome::SkippedBreaker,
            FireOutcome::SkippedBreaker
        ]
    );
    assert_eq!(h.runs("b").await.len(), 3);
    // By hand it still runs; its failure opens nothing twice.
    h.handle.trigger("t", "b", BTreeMap::new()).await.unwrap();
    ended(&h, 4).await;
    h.handle.settle().await.unwrap();
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    // A resume closes it and says so; the next fire makes a run.
    h.handle.pause("t", "b", false).await.unwrap();
    assert_eq!(
        h.store.get_job("t", "b").await.unwrap().unwrap().breaker,
        None
    );
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    let events: Vec<&str> = notes.iter().map(|n| n.made.event.as_str()).collect();
    assert!(events.contains(&"breaker_closed"), "{events:?}");
    h.clock.set(ts("2026-01-01T00:06:00Z"));
    h.until_fires("b", 6).await;
    ended(&h, 5).await;
    // One failure after the close is not three.
    assert_eq!(
        h.store.get_job("t", "b").await.unwrap().unwrap().breaker,
        None
    );
    h.stop().await;
}

/// A resume of a job that is not paused (as a resume to close a breaker
/// is) used to disarm its next fire until the server restarted.
#[tokio::test]
async fn regression_a_resume_of_a_running_job_keeps_its_fires() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: r, schedule: '0 * * * * *', tasks: [{ id: a, noop: true }] }\n").await;
    h.handle.pause("t", "r", false).await.unwrap();
    h.handle.pause("t", "r", false).await.unwrap();
    h.clock.set(ts("2026-01-01T00:01:00Z"));
    h.until_fires("r", 1).await;
    h.stop().await;
}

/// A trigger with a key makes one run of the job, recorded with its kind;
/// the same key again (one after the other, or both at once) makes none
/// and holds no place of the job; another key makes another run.
#[tokio::test]
async fn a_keyed_trigger_makes_one_run_per_key() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: k, max_active_runs: 1, tasks: [{ id: a, noop: true }] }\n")
        .await;
    let by = |key: &str| dagcron_runtime::TriggerBy {
        kind: dagcron_store::Trigger::Webhook,
        key: Some(key.into()),
    };
    let first = h
        .handle
        .trigger_by("t", "k", BTreeMap::new(), by("d-1"))
        .await
        .unwrap()
        .expect("a run");
    let again = h.handle.trigger_by("t", "k", BTreeMap::new(), by("d-1"));
    let twice = h.handle.trigger_by("t", "k", BTreeMap::new(), by("d-2"));
    let thrice = h.handle.trigger_by("t", "k", BTreeMap::new(), by("d-2"));
    let (again, twice, thrice) = tokio::join!(again, twice, thrice);
    assert_eq!(again.unwrap(), None, "the same delivery again");
    let made: Vec<_> = [twice.unwrap(), thrice.unwrap()]
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(made.len(), 1, "d-2 once: {made:?}");
    h.idle().await;
    let runs = h.runs("k").await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs.iter()
            .all(|r| r.trigger == dagcron_store::Trigger::Webhook)
    );
    assert_eq!(runs[0].id, first);
    assert_eq!(
        h.store.run_of_key("t", "k", "d-2").await.unwrap(),
        Some(made[0])
    );
    // A refused run took no slot: the next run starts.
    h.run_to_end("k").await;
    h.stop().await;
}

/// A run of `extract` that succeeds starts one run of `load` (trigger
/// `after`, the upstream run's parameters passed on), written in the
/// commit of the upstream run's end; a failure starts `cleanup` only; a
/// paused downstream job gets none. After a restart, the jobs are read
/// back and the trigger still works. A file closing a circle with the
/// jobs here is refused.
#[tokio::test]
async fn a_runs_end_starts_the_jobs_after_it_once_also_after_a_restart() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(
        r#"
namespace: t
jobs:
  - name: extract
    params: { day: "1" }
    tasks: [{ id: a, shell: "test {{params.day}} != bad" }]
  - name: load
    params: { day: "0", target: warehouse }
    after: { job: extract, pass_params: true }
    tasks: [{ id: a, noop: true }]
  - name: cleanup
    after: { job: extract, on: [failed] }
    tasks: [{ id: a, noop: true }]
  - name: idle
    paused: true
    after: { job: extract, on: [succeeded, failed] }
    tasks: [{ id: a, noop: true }]
"#,
    )
    .await;
    let up = h.run_to_end("extract").await;
    h.until("load made", async |s| {
        s.run_of_key("t", "load", &format!("after:run-{up}"))
            .await
            .unwrap()
            .is_some()
    })
    .await;
    h.idle().await;
    let load = h.runs("load").await;
    assert_eq!(load.len(), 1);
    assert_eq!(load[0].trigger, dagcron_store::Trigger::After);
    assert_eq!(load[0].params["day"], "1", "passed on");
    assert_eq!(
        load[0].params["target"], "warehouse",
        "its own default kept"
    );
    assert!(h.runs("cleanup").await.is_empty());
    assert!(h.runs("idle").await.is_empty(), "paused");
    // A failure starts cleanup, not load.
    let mut bad = BTreeMap::new();
    bad.insert("day".to_string(), "bad".to_string());
    let failed = h.handle.trigger("t", "extract", bad).await.unwrap();
    h.until("cleanup made", async |s| {
        s.run_of_key("t", "cleanup", &format!("after:run-{failed}"))
            .await
            .unwrap()
            .is_some()
    })
    .await;
    h.idle().await;
    assert_eq!(h.runs("load").await.len(), 1);
    assert_eq!(h.runs("cleanup").await.len(), 1);
    // A circle through the jobs here is refused, and nothing changes.
    let file: JobFile = serde_saphyr::from_str(
        "namespace: t\njobs:\n  - { name: extract, after: { job: load }, tasks: [{ id: a, noop: true }] }\n",
    )
    .unwrap();
    let err = h.handle.apply(file.validate().unwrap()).await.unwrap_err();
    assert!(
        err.to_string().contains("extract → load → extract"),
        "{err}"
    );
    // Restarted: read back from the store, the trigger still works.
    let (store, clock) = h.stop().await;
    let h = start(store, clock, EngineConfig::default()).await;
    let again = h.run_to_end("extract").await;
    h.until("load made after the restart", async |s| {
        s.run_of_key("t", "load", &format!("after:run-{again}"))
            .await
            .unwrap()
            .is_some()
    })
    .await;
    h.idle().await;
    assert_eq!(h.runs("load").await.len(), 2);
    h.stop().await;
}

/// SLA deadlines under a manual clock, across the spring-forward night in
/// Berlin: `finish_by: "02:30"` is 03:30 CEST that night (01:30 UTC). A run
/// still going at its deadline misses it, exactly then and not a second
/// before; a quick success does not; a fire skipped by the overlap
/// policy misses it with no run. Each miss is recorded in the ledger and
/// notified once, also when a restart judges the fires again.
#[tokio::test]
async fn sla_misses_are_told_once_at_their_deadline_across_dst() {
    let h = fresh_with_grace("2026-03-28T23:59:00Z", Duration::from_secs(3600)).await;
    h.apply(
        r#"
namespace: t
notifiers: [{ name: ops, webhook: { url: "https://hooks.example.com/x" } }]
jobs:
  - name: slow
    schedule: "0 30 1 * * *"
    timezone: Europe/Berlin
    concurrency: forbid
    sla: { finish_by: "02:30" }
    notify: [{ on: [sla_missed], to: [ops] }]
    tasks: [{ id: a, shell: "sleep 20" }]
  - name: quick
    schedule: "0 30 1 * * *"
    timezone: Europe/Berlin
    sla: { finish_within: 1h }
    notify: [{ on: [sla_missed], to: [ops] }]
    tasks: [{ id: a, noop: true }]
"#,
    )
    .await;
    // 01:30 CET is 00:30 UTC.
    h.clock.set(ts("2026-03-29T00:30:00Z"));
    h.until_fires("slow", 1).await;
    h.until_fires("quick", 1).await;
    h.until("quick succeeded", async |_| {
        h.runs("quick")
            .await
            .first()
            .is_some_and(|r| r.state == RunState::Succeeded)
    })
    .await;
    async fn missed_of(h: &Harness, job: &str) -> Vec<Option<Timestamp>> {
        h.fires(job).await.iter().map(|f| f.sla_missed_at).collect()
    }
    let missed = async |job: &str| missed_of(&h, job).await;
    h.clock.set(ts("2026-03-29T01:29:59Z"));
    h.handle.settle().await.unwrap();
    assert_eq!(missed("slow").await, [None], "a second before its deadline");
    h.clock.set(ts("2026-03-29T01:30:00Z"));
    h.until("slow's miss recorded", async |_| {
        missed("slow").await[0].is_some()
    })
    .await;
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    let n = &notes[0].made;
    assert_eq!(
        n.key,
        format!(
            "t/slow/fire-{}/sla_missed/ops",
            ts("2026-03-29T00:30:00Z").as_microsecond()
        )
    );
    let body: serde_json::Value = serde_json::from_str(&n.payload).unwrap();
    assert_eq!(body["sla"]["deadline"], "2026-03-29T01:30:00Z");
    assert_eq!(body["run"]["state"], "running");
    // The quick job's deadline (01:30 UTC too) passes without a miss.
    assert_eq!(missed("quick").await, [None]);
    // The next night (01:30 CEST is 23:30 UTC): slow still runs
    // (forbid), so its fire is skipped, and misses with no run at 02:30
    // CEST; quick succeeds in time.
    h.clock.set(ts("2026-03-29T23:30:00Z"));
    h.until_fires("slow", 2).await;
    h.until_fires("quick", 2).await;
    h.until("quick succeeded again", async |_| {
        h.runs("quick")
            .await
            .iter()
            .all(|r| r.state == RunState::Succeeded)
    })
    .await;
    h.clock.set(ts("2026-03-30T00:30:00Z"));
    h.until("the skipped fire's miss", async |_| {
        missed("slow").await.get(1).is_some_and(|m| m.is_some())
    })
    .await;
    h.handle.settle().await.unwrap();
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    let skipped: serde_json::Value = serde_json::from_str(&notes[0].made.payload).unwrap();
    assert!(skipped.get("run").is_none(), "{skipped}");
    // Restarted: the fires are judged again, nothing is told twice.
    let (store, clock) = h.stop().await;
    let h = start(store, clock, EngineConfig::default()).await;
    h.handle.settle().await.unwrap();
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert_eq!(missed_of(&h, "quick").await, [None, None]);
    h.stop().await;
}

/// A fire skipped by the overlap policy and fires missed while the server
/// was down are told to the notifiers that ask for `skipped` and `missed`,
/// once per fire, naming the fire and its outcome; fires on time are not.
#[tokio::test]
async fn skipped_and_missed_fires_are_told_once_each() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", Duration::ZERO).await;
    h.apply(
        r#"
namespace: t
notifiers: [{ name: ops, webhook: { url: "https://hooks.example.com/x" } }]
jobs:
  - name: busy
    schedule: "0 * * * * *"
    concurrency: forbid
    misfire: skip
    notify: [{ on: [skipped, missed], to: [ops] }]
    tasks: [{ id: a, shell: "sleep 20" }]
"#,
    )
    .await;
    h.clock.set(ts("2026-01-01T00:01:00Z"));
    h.until_fires("busy", 1).await;
    h.clock.set(ts("2026-01-01T00:02:00Z"));
    h.until_fires("busy", 2).await;
    h.handle.settle().await.unwrap();
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    assert_eq!(notes.len(), 1, "the fire on time is not told: {notes:?}");
    let n = &notes[0].made;
    assert_eq!(n.event, "skipped");
    assert_eq!(
        n.key,
        format!(
            "t/busy/fire-{}/skipped/ops",
            ts("2026-01-01T00:02:00Z").as_microsecond()
        )
    );
    let body: serde_json::Value = serde_json::from_str(&n.payload).unwrap();
    assert_eq!(body["fire"]["outcome"], "skipped_overlap");
    // Down over two fires: each is missed, and told.
    let (store, clock) = h.stop().await;
    clock.set(ts("2026-01-01T00:04:30Z"));
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(store, clock, config).await;
    h.until_fires("busy", 4).await;
    h.handle.settle().await.unwrap();
    let notes = h
        .store
        .list_notifications("t", false, None, 10)
        .await
        .unwrap();
    let missed: Vec<&str> = notes
        .iter()
        .filter(|n| n.made.event == "missed")
        .map(|n| n.made.key.as_str())
        .collect();
    assert_eq!(missed.len(), 2, "{notes:?}");
    h.stop().await;
}

/// A delivery that came before decides nothing again: under `replace`,
/// the same key does not cancel the run it made. A paused job takes no
/// event's run (an operator's trigger still makes one).
#[tokio::test]
async fn a_duplicate_key_replaces_nothing_and_a_paused_job_takes_no_event() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply("namespace: t\njobs:\n  - { name: r, concurrency: replace, tasks: [{ id: a, shell: 'sleep 20' }] }\n")
        .await;
    let by = |key: &str| dagcron_runtime::TriggerBy {
        kind: dagcron_store::Trigger::Message,
        key: Some(key.into()),
    };
    let first = h
        .handle
        .trigger_by("t", "r", BTreeMap::new(), by("m-1"))
        .await
        .unwrap()
        .expect("a run");
    // In memory still, then once committed and found in the store.
    assert_eq!(
        h.handle
            .trigger_by("t", "r", BTreeMap::new(), by("m-1"))
            .await
            .unwrap(),
        None
    );
    h.handle.settle().await.unwrap();
    assert_eq!(
        h.handle
            .trigger_by("t", "r", BTreeMap::new(), by("m-1"))
            .await
            .unwrap(),
        None
    );
    h.handle.settle().await.unwrap();
    let run = h.store.get_run(first).await.unwrap().unwrap();
    assert_eq!(
        run.state,
        RunState::Running,
        "not replaced by its own duplicate"
    );
    assert_eq!(h.runs("r").await.len(), 1);
    // Paused: an event's trigger is refused, an operator's is not.
    h.handle.pause("t", "r", true).await.unwrap();
    let refused = h
        .handle
        .trigger_by("t", "r", BTreeMap::new(), by("m-2"))
        .await;
    assert!(
        matches!(&refused, Err(dagcron_runtime::EngineError::Conflict(why)) if why.contains("paused")),
        "{refused:?}"
    );
    h.stop().await;
}

/// Outputs reach the tasks downstream (templates, variables, conditions);
/// a condition that does not hold and an exit code of `skip_on_exit_code`
/// skip their task; a re-run of the failed tasks gives the tasks it runs
/// again the outputs of those it carried over.
#[tokio::test]
async fn outputs_flow_downstream_and_decide_conditions_and_reruns() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let flag = dir.path().join("second-time");
    h.apply(&format!(
        r#"
namespace: t
jobs:
  - name: flow
    params: {{ mode: full }}
    tasks:
      - {{ id: extract, shell: "echo rows=42 >> $DAGCRON_OUTPUTS; echo 'file=a b; touch pwned' >> $DAGCRON_OUTPUTS" }}
      - id: load
        depends_on: [extract]
        shell: "echo load {{{{tasks.extract.outputs.rows}}}} {{{{tasks.extract.outputs.file}}}} $DAGCRON_OUTPUT_EXTRACT_ROWS >> {t}; test -e {f} || (touch {f}; exit 1)"
      - {{ id: empty, depends_on: [extract], when: "tasks.extract.outputs.rows == 0", shell: "echo empty >> {t}" }}
      - {{ id: full, depends_on: [extract], when: "params.mode == 'full' and tasks.extract.outputs.rows != 0", shell: "echo full >> {t}" }}
      - {{ id: nothing, depends_on: [extract], shell: "exit 99", skip_on_exit_code: [99] }}
      - {{ id: after, depends_on: [nothing], trigger_rule: none_failed, shell: "echo after >> {t}" }}
"#,
        t = trace.display(),
        f = flag.display(),
    ))
    .await;
    let run = h
        .handle
        .trigger("t", "flow", BTreeMap::new())
        .await
        .unwrap();
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    let states: Vec<(&str, TaskState)> = r.tasks.iter().map(|t| (t.id.as_str(), t.state)).collect();
    assert_eq!(
        states,
        [
            ("extract", TaskState::Succeeded),
            ("load", TaskState::Failed),
            ("empty", TaskState::Skipped),
            ("full", TaskState::Succeeded),
            ("nothing", TaskState::Skipped),
            ("after", TaskState::Succeeded),
        ]
    );
    assert_eq!(r.tasks[0].attempts[0].outputs["rows"], "42");
    assert_eq!(
        r.tasks[4].attempts[0].state,
        dagcron_core::AttemptState::Skipped
    );
    // The re-run runs `load` again with the outputs `extract` had.
    let again = h.handle.rerun(run, true).await.unwrap();
    h.idle().await;
    let r2 = h.store.get_run(again).await.unwrap().unwrap();
    assert_eq!(r2.state, RunState::Succeeded, "{r2:?}");
    assert!(r2.tasks[0].carried);
    let lines = std::fs::read_to_string(&trace).unwrap();
    let loads: Vec<&str> = lines.lines().filter(|l| l.starts_with("load")).collect();
    assert_eq!(loads, ["load 42 a b; touch pwned 42"; 2], "{lines}");
    assert!(!std::path::Path::new("pwned").exists());
    assert!(!lines.contains("empty"));
    h.stop().await;
}

/// `examples/workflow.yaml` as written: with rows, every task runs; with
/// none, the condition and the exit code skip their tasks and the join
/// still runs.
#[tokio::test]
async fn the_workflow_example_runs_and_skips_by_its_outputs() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/workflow.yaml");
    let yaml = std::fs::read_to_string(path).unwrap();
    let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
    h.handle.apply(file.validate().unwrap()).await.unwrap();
    let mut ends = Vec::new();
    for rows in ["2", "0"] {
        let params = BTreeMap::from([("rows".to_string(), rows.to_string())]);
        let run = h
            .handle
            .trigger("analytics", "daily-export", params)
            .await
            .unwrap();
        h.idle().await;
        let r = h.store.get_run(run).await.unwrap().unwrap();
        assert_eq!(r.state, RunState::Succeeded, "{r:?}");
        let states: Vec<TaskState> = r.tasks.iter().map(|t| t.state).collect();
        let log = h.store.read_log(run, "export", 1).await.unwrap();
        ends.push((states, log.map(|l| String::from_utf8(l).unwrap())));
    }
    use TaskState::{Skipped, Succeeded};
    assert_eq!(
        ends,
        [
            (
                vec![Succeeded, Succeeded, Succeeded, Succeeded],
                Some("exporting 2 rows of 2026-01-01T00:00:00Z to warehouse\n".to_string())
            ),
            (vec![Succeeded, Skipped, Skipped, Succeeded], None),
        ]
    );
    h.stop().await;
}

/// A re-run keeps the outputs of the tasks it carried over in the store:
/// after a crash in the middle of it, the task retried still gets them.
#[tokio::test]
async fn a_rerun_carries_its_outputs_across_a_crash() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let (trace, broken) = (dir.path().join("trace"), dir.path().join("broken"));
    std::fs::write(&broken, "").unwrap();
    h.apply(&format!(
        r#"
namespace: t
jobs:
  - name: carry
    retry: {{ max_attempts: 2, backoff: fixed, initial: 1s, max: 1s }}
    tasks:
      - {{ id: extract, shell: "echo rows=42 >> $DAGCRON_OUTPUTS" }}
      - id: load
        depends_on: [extract]
        shell: "test ! -e {b} || exit 1; echo load {{{{tasks.extract.outputs.rows}}}} $DAGCRON_ATTEMPT >> {t}; if [ $DAGCRON_ATTEMPT -eq 1 ]; then sleep 30; fi"
"#,
        t = trace.display(),
        b = broken.display(),
    ))
    .await;
    let run = h
        .handle
        .trigger("t", "carry", BTreeMap::new())
        .await
        .unwrap();
    h.until("load waiting to retry", async |s| {
        s.get_run(run).await.unwrap().unwrap().tasks[1].state == TaskState::Retrying
    })
    .await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("the first run failed", async |s| {
        s.get_run(run).await.unwrap().unwrap().state == RunState::Failed
    })
    .await;
    std::fs::remove_file(&broken).unwrap();
    let again = h.handle.rerun(run, true).await.unwrap();
    h.until("the re-run's load running", async |_| {
        std::fs::read_to_string(&trace).is_ok_and(|s| s == "load 42 1\n")
    })
    .await;
    // A crash: the engine disappears without any cleanup.
    h.task.abort();
    let (store, clock) = (h.store.clone(), h.clock.clone());
    drop(h);
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(store, clock, config).await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.idle().await;
    let r = h.store.get_run(again).await.unwrap().unwrap();
    assert_eq!(r.state, RunState::Succeeded, "{r:?}");
    assert!(r.tasks[0].carried);
    assert_eq!(
        std::fs::read_to_string(&trace).unwrap(),
        "load 42 1\nload 42 2\n",
        "the retry after the crash got the carried output"
    );
    h.stop().await;
}

/// A run's tasks hold at most 1 MiB of outputs together: of seventeen
/// tasks handing 64,001 bytes each, the one whose outputs would pass the
/// bound fails, saying why, whichever it is.
#[tokio::test]
async fn a_runs_outputs_are_bounded_as_a_whole() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let tasks: String = (0..17)
        .map(|i| {
            format!("      - {{ id: t{i}, shell: \"head -c 64000 /dev/zero | tr '\\\\0' x | sed 's/^/v=/' > $DAGCRON_OUTPUTS\" }}\n")
        })
        .collect();
    h.apply(&format!(
        "namespace: t\njobs:\n  - name: big\n    tasks:\n{tasks}"
    ))
    .await;
    let run = h.handle.trigger("t", "big", BTreeMap::new()).await.unwrap();
    h.idle().await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    let failed: Vec<&str> = r
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Failed)
        .map(|t| t.attempts[0].error.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(failed.len(), 1, "{r:?}");
    assert!(
        failed[0].contains("at most 1048576 are taken"),
        "{}",
        failed[0]
    );
    let held: usize = r
        .tasks
        .iter()
        .filter_map(|t| t.outputs())
        .map(dagcron_core::outputs::size)
        .sum();
    assert_eq!(held, 16 * 64_001);
    h.stop().await;
}

/// Priorities in the pool: with its one slot held, a job of priority 50
/// ready after three tasks of priority 0 starts before them; the three keep
/// their order. Default tasks that have waited long enough (here 9 min,
/// fifty-four levels of aging) go before a priority 50 one ready just now.
#[tokio::test]
async fn the_pool_starts_higher_priorities_first_and_ages_the_others() {
    let config = EngineConfig {
        pool_size: 1,
        ..EngineConfig::default()
    };
    let h = fresh_with("2026-01-01T00:00:30Z", config).await;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    h.apply(&format!(
        r#"
namespace: t
jobs:
  - {{ name: hold, tasks: [{{ id: long, shell: 'sleep 30' }}] }}
  - name: low
    concurrency: allow
    tasks:
      - {{ id: a, shell: 'echo low-a >> {t}' }}
      - {{ id: b, shell: 'echo low-b >> {t}' }}
      - {{ id: c, shell: 'echo low-c >> {t}', priority: -5 }}
  - {{ name: high, priority: 50, concurrency: allow, tasks: [{{ id: x, shell: 'echo high >> {t}' }}] }}
"#,
        t = trace.display()
    ))
    .await;
    let order = async |advance: i64| {
        let _ = std::fs::remove_file(&trace);
        let hold = h
            .handle
            .trigger("t", "hold", BTreeMap::new())
            .await
            .unwrap();
        h.until("the slot is held", async |s| {
            s.get_run(hold).await.unwrap().unwrap().tasks[0].state == TaskState::Running
        })
        .await;
        let low = h.handle.trigger("t", "low", BTreeMap::new()).await.unwrap();
        h.until("the low tasks wait", async |s| {
            let r = s.get_run(low).await.unwrap().unwrap();
            r.tasks.iter().all(|t| t.state == TaskState::Ready)
        })
        .await;
        h.clock.advance(SignedDuration::from_secs(advance));
        let high = h
            .handle
            .trigger("t", "high", BTreeMap::new())
            .await
            .unwrap();
        h.until("the high task waits", async |s| {
            s.get_run(high).await.unwrap().unwrap().tasks[0].state == TaskState::Ready
        })
        .await;
        h.handle.cancel(hold).await.unwrap();
        for run in [low, high] {
            h.until("the runs end", async |s| {
                s.get_run(run).await.unwrap().unwrap().state == RunState::Succeeded
            })
            .await;
        }
        std::fs::read_to_string(&trace).unwrap()
    };
    assert_eq!(order(1).await, "high\nlow-a\nlow-b\nlow-c\n");
    // Ready 9 min later, the priority 50 task ranks 9 min - 500 s = 40 s
    // after the default ones and 10 s before the priority -5 one (+50 s).
    assert_eq!(order(540).await, "low-a\nlow-b\nhigh\nlow-c\n");
    h.stop().await;
}

/// A recurrence rule fires through the engine like a cron expression: a
/// year of "the last business day of the month at 18:00 in Berlin, except
/// New Year's Eve" in one jump, twelve fires less the excluded one, each
/// recorded at its instant.
#[tokio::test]
async fn a_year_of_a_recurrence_rule_in_one_jump() {
    let h = fresh_with_grace("2026-01-01T00:00:00Z", LONG_GRACE).await;
    h.apply("namespace: t\njobs:\n  - name: close\n    schedule: |\n      RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1;BYHOUR=18\n      EXDATE:20261231T180000\n    timezone: Europe/Berlin\n    max_pending_runs: 100\n    tasks: [{ id: a, noop: true }]\n").await;
    h.clock.set(ts("2027-01-01T00:00:00Z"));
    h.until("11 runs finished", async |s| {
        let runs = s.list_runs("t", "close", 100, None).await.unwrap().items;
        runs.len() == 11 && runs.iter().all(|r| r.state == RunState::Succeeded)
    })
    .await;
    let fires = h
        .store
        .list_fires(
            "t",
            "close",
            ts("2026-01-01T00:00:00Z"),
            ts("2027-01-01T00:00:00Z"),
            100,
        )
        .await
        .unwrap();
    let mut at: Vec<String> = fires.iter().map(|f| f.scheduled_at.to_string()).collect();
    at.sort();
    assert_eq!(
        at,
        [
            "2026-01-30T17:00:00Z",
            "2026-02-27T17:00:00Z",
            "2026-03-31T16:00:00Z",
            "2026-04-30T16:00:00Z",
            "2026-05-29T16:00:00Z",
            "2026-06-30T16:00:00Z",
            "2026-07-31T16:00:00Z",
            "2026-08-31T16:00:00Z",
            "2026-09-30T16:00:00Z",
            "2026-10-30T17:00:00Z",
            "2026-11-30T17:00:00Z",
        ]
    );
    h.stop().await;
}

/// A task fans out over the list an upstream task wrote: each instance
/// gets its item and index (a hostile item stays data), at most two run at
/// once, one is retried alone, and the task downstream gets each output as
/// a list in the instances' order.
#[tokio::test]
async fn a_task_fans_out_over_an_upstream_list_and_hands_its_outputs_downstream() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let (trace, flag) = (dir.path().join("trace"), dir.path().join("flag"));
    h.apply(&format!(
        r#"
namespace: t
jobs:
  - name: fan
    retry: {{ max_attempts: 2, backoff: fixed, initial: 1s, max: 1s }}
    tasks:
      - {{ id: list, shell: "echo 'parts=[\"a\", \"b c; touch pwned\", 3]' >> $DAGCRON_OUTPUTS" }}
      - id: x
        depends_on: [list]
        for_each: "{{{{tasks.list.outputs.parts}}}}"
        max_parallel: 2
        shell: "echo {{{{index}}}} {{{{item}}}} \"$DAGCRON_INDEX $DAGCRON_ITEM\" >> {t}; echo n=$DAGCRON_INDEX >> $DAGCRON_OUTPUTS; if [ $DAGCRON_INDEX = 1 ] && [ ! -e {f} ]; then touch {f}; exit 1; fi"
      - {{ id: d, depends_on: [x], shell: "echo d {{{{tasks.x.outputs.n}}}} >> {t}" }}
"#,
        t = trace.display(),
        f = flag.display(),
    ))
    .await;
    let run = h.handle.trigger("t", "fan", BTreeMap::new()).await.unwrap();
    h.until("x[1] waiting to retry", async |s| {
        s.get_run(run)
            .await
            .unwrap()
            .unwrap()
            .tasks
            .iter()
            .any(|t| t.id == "x[1]" && t.state == TaskState::Retrying)
    })
    .await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("the run ended", async |s| {
        s.get_run(run).await.unwrap().unwrap().state.is_terminal()
    })
    .await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    assert_eq!(r.state, RunState::Succeeded, "{r:?}");
    let tasks: Vec<(&str, TaskState, usize, Option<&str>)> = r
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.state, t.attempts.len(), t.item.as_deref()))
        .collect();
    use TaskState::Succeeded;
    assert_eq!(
        tasks,
        [
            ("list", Succeeded, 1, None),
            ("x", Succeeded, 0, None),
            ("d", Succeeded, 1, None),
            ("x[0]", Succeeded, 1, Some("\"a\"")),
            ("x[1]", Succeeded, 2, Some("\"b c; touch pwned\"")),
            ("x[2]", Succeeded, 1, Some("3")),
        ]
    );
    assert_eq!(r.tasks[1].outputs().unwrap()["n"], r#"["0","1","2"]"#);
    let lines = std::fs::read_to_string(&trace).unwrap();
    let mut lines: Vec<&str> = lines.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "0 a 0 a",
            "1 b c; touch pwned 1 b c; touch pwned",
            "1 b c; touch pwned 1 b c; touch pwned",
            "2 3 2 3",
            r#"d ["0","1","2"]"#,
        ]
    );
    assert!(!std::path::Path::new("pwned").exists());
    h.stop().await;
}

/// Fan-out over none, one and a thousand items: none skips the task (and
/// says why), one and a thousand run each instance once; a list that is
/// not one fails the task with the reason.
#[tokio::test]
async fn a_task_fans_out_over_none_one_or_a_thousand_items() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    h.apply(
        r#"
namespace: t
jobs:
  - name: fan
    params: { items: "[]" }
    tasks:
      - { id: x, for_each: "{{params.items}}", noop: true }
      - { id: d, depends_on: [x], trigger_rule: all_done, noop: true }
"#,
    )
    .await;
    let thousand = format!(
        "[{}]",
        (0..1000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut seen = Vec::new();
    for items in ["[]", "[\"one\"]", thousand.as_str(), "not a list"] {
        let params = BTreeMap::from([("items".to_string(), items.to_string())]);
        let run = h.handle.trigger("t", "fan", params).await.unwrap();
        h.until("the run ended", async |s| {
            s.get_run(run).await.unwrap().unwrap().state.is_terminal()
        })
        .await;
        let r = h.store.get_run(run).await.unwrap().unwrap();
        let instances = r.tasks.iter().filter(|t| t.item.is_some());
        let ran = instances
            .clone()
            .filter(|t| t.state == TaskState::Succeeded && t.attempts.len() == 1)
            .count();
        seen.push((
            r.state,
            r.tasks[0].state,
            instances.count(),
            ran,
            r.tasks[0].note.clone(),
        ));
    }
    use TaskState::*;
    assert_eq!(
        seen,
        [
            (
                RunState::Succeeded,
                Skipped,
                0,
                0,
                Some("`for_each` gave no items: nothing to run".into())
            ),
            (RunState::Succeeded, Succeeded, 1, 1, None),
            (RunState::Succeeded, Succeeded, 1000, 1000, None),
            (
                RunState::Failed,
                Failed,
                0,
                0,
                Some("parameter `items`: `not a list` is not a JSON array".into())
            ),
        ]
    );
    h.stop().await;
}

/// A re-run of the failed tasks keeps a mapped task's instances: only the
/// one that failed runs again, the others are carried with their outputs,
/// and the task downstream gets all of them. After a crash in the middle
/// of a fan-out, the run goes on where it was.
#[tokio::test]
async fn a_rerun_runs_again_only_the_instances_that_failed_and_a_crash_loses_none() {
    let h = fresh("2026-01-01T00:00:00Z").await;
    let dir = tempfile::tempdir().unwrap();
    let (trace, broken, slow) = (
        dir.path().join("trace"),
        dir.path().join("broken"),
        dir.path().join("slow"),
    );
    std::fs::write(&broken, "").unwrap();
    h.apply(&format!(
        r#"
namespace: t
jobs:
  - name: fan
    retry: {{ max_attempts: 2, backoff: fixed, initial: 1s, max: 1s, retry_on: {{ exit_codes: [75] }} }}
    tasks:
      - id: x
        for_each: [a, b, c]
        shell: "echo {{{{item}}}} >> {t}; echo up={{{{item}}}} >> $DAGCRON_OUTPUTS; if [ {{{{index}}}} = 2 ] && [ -e {b} ]; then exit 1; fi; if [ -e {s} ]; then sleep 30; fi"
      - {{ id: d, depends_on: [x], shell: "echo d {{{{tasks.x.outputs.up}}}} >> {t}" }}
"#,
        t = trace.display(),
        b = broken.display(),
        s = slow.display(),
    ))
    .await;
    let run = h.handle.trigger("t", "fan", BTreeMap::new()).await.unwrap();
    h.until("the run ended", async |s| {
        s.get_run(run).await.unwrap().unwrap().state.is_terminal()
    })
    .await;
    let r = h.store.get_run(run).await.unwrap().unwrap();
    assert_eq!(r.state, RunState::Failed);
    let states: Vec<TaskState> = r.tasks.iter().map(|t| t.state).collect();
    use TaskState::*;
    assert_eq!(
        states,
        [Failed, UpstreamFailed, Succeeded, Succeeded, Failed]
    );
    // The re-run: x[2] alone runs again, slowly; the engine crashes.
    std::fs::remove_file(&broken).unwrap();
    std::fs::write(&slow, "").unwrap();
    std::fs::write(&trace, "").unwrap();
    let again = h.handle.rerun(run, true).await.unwrap();
    h.until("x[2] running again", async |_| {
        std::fs::read_to_string(&trace).is_ok_and(|s| s == "c\n")
    })
    .await;
    h.task.abort();
    let (store, clock) = (h.store.clone(), h.clock.clone());
    drop(h);
    std::fs::remove_file(&slow).unwrap();
    let config = EngineConfig {
        misfire_grace: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = start(store, clock, config).await;
    h.clock.advance(SignedDuration::from_secs(1));
    h.until("the re-run ended", async |s| {
        s.get_run(again).await.unwrap().unwrap().state.is_terminal()
    })
    .await;
    let r = h.store.get_run(again).await.unwrap().unwrap();
    assert_eq!(r.state, RunState::Succeeded, "{r:?}");
    let tasks: Vec<(&str, TaskState, bool)> = r
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.state, t.carried))
        .collect();
    assert_eq!(
        tasks,
        [
            ("x", Succeeded, false),
            ("d", Succeeded, false),
            ("x[0]", Succeeded, true),
            ("x[1]", Succeeded, true),
            ("x[2]", Succeeded, false),
        ]
    );
    // Lost with the crash, then retried after it (a loss is retried once).
    assert_eq!(r.tasks[4].attempts.len(), 2);
    assert_eq!(
        std::fs::read_to_string(&trace).unwrap(),
        "c\nc\nd [\"a\",\"b\",\"c\"]\n"
    );
    h.stop().await;
}
