//! Retention under load: a database holding many runs (10,000,000 by
//! default) is pruned of a tenth of them while an engine fires 100 jobs
//! every second on the same database and a reader lists a job's runs by
//! keyset pages, on SQLite and on PostgreSQL.
//!
//! `cargo bench -p dagcron-runtime --bench retention`; variables:
//! `DAGCRON_BENCH_STORE` (`sqlite`, `postgres`, or both by default),
//! `DAGCRON_BENCH_RUNS` (runs stored, a multiple of 10,000; each job has
//! 10,000 runs, its oldest 1,000 older than the policy's 30 days),
//! `DAGCRON_TEST_POSTGRES` (the server).
//!
//! The fill goes straight through SQL (one run, its ledger row, one task
//! and one attempt with a short log per run); the rest goes through the
//! store, the engine and the pruner as the server runs them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dagcron_core::JobFile;
use dagcron_runtime::{
    Engine, EngineConfig, EngineEvent, EngineHandle, Observer, PruneConfig, PruneMetrics, Pruner,
    SystemClock,
};
use dagcron_store::prelude::*;
use tokio_util::sync::CancellationToken;

/// Runs per job.
const PER_JOB: i64 = 10_000;
/// Of which the oldest are past the policy's age.
const OLD_PER_JOB: i64 = 1_000;
/// Jobs firing every second meanwhile.
const LIVE_JOBS: usize = 100;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// The instants of run `k` of a job (k from 0): the first `OLD_PER_JOB`
/// 40 days ago, the others 20 days ago, a second apart.
fn fill_bases(now_us: i64) -> (i64, i64) {
    let day = 86_400 * 1_000_000i64;
    (now_us - 40 * day, now_us - 20 * day)
}

fn job_file(namespace: &str, n: usize, schedule: Option<&str>) -> JobFile {
    let mut yaml = format!("namespace: {namespace}\njobs:\n");
    for i in 0..n {
        let schedule = schedule.map_or(String::new(), |s| format!(", schedule: '{s}'"));
        yaml.push_str(&format!(
            "  - {{ name: j{i:04}{schedule}, misfire: skip, tasks: [{{ id: t, noop: true }}] }}\n"
        ));
    }
    serde_saphyr::from_str(&yaml).unwrap()
}

struct Sample {
    late_ms: Mutex<Vec<f64>>,
    list_ms: Mutex<Vec<f64>>,
}

impl Sample {
    fn take(&self) -> (Vec<f64>, Vec<f64>) {
        let mut late = std::mem::take(&mut *self.late_ms.lock().unwrap());
        let mut list = std::mem::take(&mut *self.list_ms.lock().unwrap());
        late.sort_by(f64::total_cmp);
        list.sort_by(f64::total_cmp);
        (late, list)
    }
}

fn row(what: &str, secs: f64, late: &[f64], list: &[f64]) {
    println!(
        "| {what} | {secs:.1} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} | {:.2} ms | {:.2} ms |",
        late.len(),
        percentile(late, 0.5),
        percentile(late, 0.99),
        late.last().copied().unwrap_or(f64::NAN),
        list.len(),
        percentile(list, 0.5),
        percentile(list, 0.99),
    );
}

async fn bench<S: Store>(name: &str, store: Arc<S>, runs: i64, fill: impl AsyncFnOnce(i64)) {
    let jobs = (runs / PER_JOB) as usize;
    let t0 = Instant::now();
    fill(runs).await;
    eprintln!(
        "{name}: filled {runs} runs in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let sample = Arc::new(Sample {
        late_ms: Mutex::new(Vec::new()),
        list_ms: Mutex::new(Vec::new()),
    });
    let s = sample.clone();
    let observer = Observer(Arc::new(move |e| {
        if let EngineEvent::Fired { scheduled_at, at } = e {
            let late = at.duration_since(scheduled_at).as_secs_f64() * 1000.0;
            s.late_ms.lock().unwrap().push(late);
        }
    }));
    let config = EngineConfig {
        observer: Some(observer),
        ..EngineConfig::default()
    };
    let (engine, handle): (Engine<S>, EngineHandle) =
        Engine::start(store.clone(), Arc::new(SystemClock), config)
            .await
            .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(engine.run(stop.clone(), Duration::from_secs(1)));
    let t0 = Instant::now();
    handle
        .apply(job_file("bench", jobs, None).validate().unwrap())
        .await
        .unwrap();
    handle
        .apply(
            job_file("live", LIVE_JOBS, Some("* * * * * *"))
                .validate()
                .unwrap(),
        )
        .await
        .unwrap();
    eprintln!("{name}: applied in {:.1} s", t0.elapsed().as_secs_f64());

    // The reader: a random job's newest pages, 50 runs each, five deep.
    let reading = Arc::new(AtomicBool::new(true));
    let reader = {
        let (store, sample, reading) = (store.clone(), sample.clone(), reading.clone());
        tokio::spawn(async move {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            while reading.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let job = format!("j{:04}", x % jobs as u64);
                let mut cursor = None;
                for _ in 0..5 {
                    let t = Instant::now();
                    let page = store
                        .list_runs("bench", &job, 50, cursor.as_deref())
                        .await
                        .unwrap();
                    sample
                        .list_ms
                        .lock()
                        .unwrap()
                        .push(t.elapsed().as_secs_f64() * 1000.0);
                    assert_eq!(page.items.len(), 50);
                    cursor = page.next_cursor;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };

    tokio::time::sleep(Duration::from_secs(3)).await;
    sample.take();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (late, list) = sample.take();
    println!("\n{name}, {runs} runs stored in {jobs} jobs, {LIVE_JOBS} jobs firing every second\n");
    println!(
        "| phase | seconds | fires | p50 lateness | p99 lateness | max | listings | p50 listing | p99 listing |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    row("before pruning", t.elapsed().as_secs_f64(), &late, &list);

    let pruner = Pruner::new(
        store.clone(),
        Arc::new(SystemClock),
        PruneConfig::default(),
        PruneMetrics::default(),
    );
    let t = Instant::now();
    let report = pruner.pass_now(Some("bench"), false).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    let (late, list) = sample.take();
    row("while pruning", secs, &late, &list);
    let pruned = report.namespaces.get("bench").copied().unwrap_or_default();
    println!(
        "\npruned {} runs, {} attempts, {} ledger rows in {secs:.1} s ({:.0} runs/s)",
        pruned.runs,
        pruned.attempts,
        pruned.fires,
        pruned.runs as f64 / secs
    );
    assert_eq!(pruned.runs, (jobs as i64 * OLD_PER_JOB) as u64);
    reading.store(false, Ordering::Relaxed);
    reader.await.unwrap();
    stop.cancel();
}

fn runs_wanted() -> i64 {
    let runs: i64 = std::env::var("DAGCRON_BENCH_RUNS")
        .ok()
        .map_or(10_000_000, |v| {
            v.parse().expect("DAGCRON_BENCH_RUNS is a number")
        });
    assert!(
        runs >= PER_JOB && runs % PER_JOB == 0,
        "a multiple of {PER_JOB}"
    );
    runs
}

async fn sqlite(runs: i64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let store = Arc::new(
        dagcron_store_sqlite::SqliteStore::open(&path)
            .await
            .unwrap(),
    );
    let fill = async |runs: i64| {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .unwrap();
        let (old, new) = fill_bases(jiff::Timestamp::now().as_microsecond());
        let at = format!(
            "(CASE WHEN i % {PER_JOB} < {OLD_PER_JOB} THEN {old} ELSE {new} END + (i % {PER_JOB}) * 1000000)"
        );
        let series = format!(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {}) ",
            runs - 1
        );
        for sql in [
            format!(
                "{series} INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at) SELECT i + 1, 'bench', printf('j%04d', i / {PER_JOB}), 1, 'schedule', {at}, 'succeeded', '{{}}', {at}, {at}, {at} + 1000000 FROM n"
            ),
            format!(
                "{series} INSERT INTO fires (namespace, job, scheduled_at, outcome, run_id) SELECT 'bench', printf('j%04d', i / {PER_JOB}), {at}, 'fired', i + 1 FROM n"
            ),
            format!(
                "{series} INSERT INTO tasks (run_id, task_id, position, state) SELECT i + 1, 't', 0, 'succeeded' FROM n"
            ),
            format!(
                "{series} INSERT INTO attempts (run_id, task_id, number, state, started_at, finished_at, exit_code, log) SELECT i + 1, 't', 1, 'succeeded', {at}, {at} + 1000000, 0, X'6f6b0a' FROM n"
            ),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn)
            .await
            .unwrap();
    };
    bench("SQLite", store, runs, fill).await;
}

async fn postgres(runs: i64) {
    let db = dagcron_test_pg::TestDatabase::create("retention_bench").await;
    let store = Arc::new(
        dagcron_store_postgres::PgStore::connect(&db.url, 16)
            .await
            .unwrap(),
    );
    let url = db.url.clone();
    let fill = async |runs: i64| {
        use sqlx::Connection;
        let mut conn = sqlx::postgres::PgConnection::connect(&url).await.unwrap();
        let (old, new) = fill_bases(jiff::Timestamp::now().as_microsecond());
        let at = format!(
            "(CASE WHEN i % {PER_JOB} < {OLD_PER_JOB} THEN {old}::bigint ELSE {new}::bigint END + (i % {PER_JOB}) * 1000000)"
        );
        let job = format!("'j' || lpad((i / {PER_JOB})::text, 4, '0')");
        let series = format!("FROM generate_series(0::bigint, {}) AS n(i)", runs - 1);
        for sql in [
            // A run's task and attempt live in its row (`runs.tasks`), the
            // attempt's output in a table of its own.
            format!(
                "INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at, tasks) SELECT i + 1, 'bench', {job}, 1, 'schedule', {at}, 'succeeded', '{{}}', {at}, {at}, {at} + 1000000, json_build_array(json_build_object('id', 't', 'state', 'succeeded', 'attempts', json_build_array(json_build_object('number', 1, 'state', 'succeeded', 'started_at', {at}, 'finished_at', {at} + 1000000, 'exit_code', 0))))::text {series}"
            ),
            format!(
                "INSERT INTO fires (namespace, job, scheduled_at, outcome, run_id) SELECT 'bench', {job}, {at}, 'fired', i + 1 {series}"
            ),
            format!(
                "INSERT INTO attempt_logs (run_id, task_id, number, log) SELECT i + 1, 't', 1, '\\x6f6b0a'::bytea {series}"
            ),
            "VACUUM ANALYZE".to_string(),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    };
    bench("PostgreSQL", store, runs, fill).await;
    drop(db);
}

#[tokio::main]
async fn main() {
    let runs = runs_wanted();
    let which = std::env::var("DAGCRON_BENCH_STORE").unwrap_or_default();
    if which.is_empty() || which == "sqlite" {
        sqlite(runs).await;
    }
    if which.is_empty() || which == "postgres" {
        postgres(runs).await;
    }
}
