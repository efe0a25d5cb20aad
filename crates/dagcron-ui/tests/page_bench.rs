//! The pages' server time on a big database: 10,000 jobs and 1,000,000
//! runs (the newest 20 runs of each job with their tasks and attempts, a
//! fire-ledger record for each of the newest 100). Each page is asked
//! many times through the router (no socket), signed in; p50 and p99 are
//! printed. Not a pass/fail test: it is ignored unless asked for, and its
//! figures go in BENCHMARKS.md.
//!
//! ```text
//! cargo test --release -p dagcron-ui --test page_bench -- --ignored --nocapture
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, header};
use dagcron_api::{AppState, router};
use dagcron_core::JobFile;
use dagcron_core::authz::{Grant, Role};
use dagcron_runtime::{Engine, EngineConfig, SystemClock};
use dagcron_store::JobUpsert;
use dagcron_store::prelude::*;
use dagcron_store_sqlite::SqliteStore;
use http_body_util::BodyExt;
use tower::ServiceExt;

const JOBS: usize = 10_000;
const RUNS_PER_JOB: usize = 100;
const DETAILED_RUNS: usize = 20;
const TASKS: [&str; 4] = ["extract", "transform", "load", "report"];

/// A page of the benchmark: its name, and its address (and whether htmx
/// asks) for the i-th request.
type Page = (&'static str, Box<dyn Fn(usize) -> (String, bool)>);

fn micros(t: jiff::Timestamp) -> i64 {
    t.as_microsecond()
}

async fn fill(path: &std::path::Path) -> Arc<SqliteStore> {
    let store = Arc::new(SqliteStore::open(path).await.unwrap());
    let file: JobFile = serde_saphyr_free(
        r#"{"namespace": "bench", "jobs": [{"name": "x", "schedule": "0 */5 * * * *",
            "tasks": [{"id": "extract", "shell": "true"},
                      {"id": "transform", "shell": "true", "depends_on": ["extract"]},
                      {"id": "load", "shell": "true", "depends_on": ["transform"]},
                      {"id": "report", "shell": "true", "depends_on": ["extract"]}]}]}"#,
    );
    let job = file.validate().unwrap().remove(0);
    let upserts: Vec<JobUpsert> = (0..JOBS)
        .map(|i| {
            let mut j = job.clone();
            j.spec.name = format!("job-{i:05}");
            JobUpsert {
                namespace: "bench".into(),
                ..JobUpsert::of(&j)
            }
        })
        .collect();
    let now = jiff::Timestamp::now();
    for chunk in upserts.chunks(1000) {
        store.apply_jobs(chunk, now).await.unwrap();
    }
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;")
        .unwrap();
    conn.execute_batch("BEGIN").unwrap();
    {
        let mut run = conn
            .prepare("INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at) VALUES (?1, 'bench', ?2, 1, 'schedule', ?3, ?4, '{}', ?3, ?3, ?5)")
            .unwrap();
        let mut task = conn
            .prepare("INSERT INTO tasks (run_id, task_id, position, state) VALUES (?1, ?2, ?3, ?4)")
            .unwrap();
        let mut attempt = conn
            .prepare("INSERT INTO attempts (run_id, task_id, number, state, started_at, finished_at, exit_code, log) VALUES (?1, ?2, 1, ?3, ?4, ?5, 0, ?6)")
            .unwrap();
        let mut fire = conn
            .prepare("INSERT INTO fires (namespace, job, scheduled_at, outcome, run_id) VALUES ('bench', ?1, ?2, ?3, ?4)")
            .unwrap();
        let base = micros(now) - (RUNS_PER_JOB as i64) * 300_000_000;
        let mut id = 0i64;
        for j in 0..JOBS {
            let name = format!("job-{j:05}");
            for r in 0..RUNS_PER_JOB {
                id += 1;
                let at = base + r as i64 * 300_000_000;
                let state = if (j + r) % 17 == 0 {
                    "failed"
                } else {
                    "succeeded"
                };
                run.execute(rusqlite::params![id, name, at, state, at + 2_000_000])
                    .unwrap();
                let outcome = match (j + r) % 23 {
                    0 => "skipped_overlap",
                    1 => "missed_caught_up",
                    _ => "fired",
                };
                fire.execute(rusqlite::params![name, at, outcome, id])
                    .unwrap();
                if r + DETAILED_RUNS >= RUNS_PER_JOB {
                    for (p, t) in TASKS.iter().enumerate() {
                        task.execute(rusqlite::params![id, t, p as i64, state])
                            .unwrap();
                        let log = format!("{t} of run {id}\n").repeat(20);
                        attempt
                            .execute(rusqlite::params![
                                id,
                                t,
                                state,
                                at,
                                at + 500_000,
                                log.as_bytes()
                            ])
                            .unwrap();
                    }
                }
            }
        }
    }
    conn.execute_batch("COMMIT; ANALYZE;").unwrap();
    store
}

/// The job file as JSON (a subset of YAML), read without a YAML parser.
fn serde_saphyr_free(json: &str) -> JobFile {
    serde_json::from_str(json).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --nocapture, in release"]
async fn pages_at_ten_thousand_jobs_and_a_million_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let t = Instant::now();
    let store = fill(&path).await;
    println!(
        "filled {JOBS} jobs and {} runs in {:.1?}",
        JOBS * RUNS_PER_JOB,
        t.elapsed()
    );
    // The engine is started (its handle is the API's) but its loop is not
    // run: no fire competes with the pages.
    let (_engine, handle) = Engine::start(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let keyring = dagcron_api::auth::Keyring::from_bytes([7; 32]);
    let (record, secret) = dagcron_api::auth::new_token(
        "bench",
        &Grant {
            role: Role::Admin,
            namespace: None,
        },
        None,
        None,
        jiff::Timestamp::now(),
    );
    store
        .create_token(&record, &keyring.hash(&secret))
        .await
        .unwrap();
    let state = AppState {
        cluster: None,
        workers: None,
        store: store.clone(),
        engine: handle,
        max_body_bytes: 64 << 10,
        keyring: Arc::new(keyring),
        master_key: None,
        metrics: None,
        quota: Default::default(),
        pruned: Default::default(),
    };
    let app = dagcron_ui::with_ui(state.clone(), router(state));
    let send = |uri: String, cookie: String, body: Option<String>, htmx: bool| {
        let app = app.clone();
        async move {
            let mut req = Request::builder().uri(uri);
            if !cookie.is_empty() {
                req = req.header(header::COOKIE, cookie);
            }
            if htmx {
                req = req.header("hx-request", "true");
            }
            let req = match body {
                Some(b) => req
                    .method("POST")
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(Body::from(b)),
                None => req.body(Body::empty()),
            };
            let resp = app.oneshot(req.unwrap()).await.unwrap();
            let status = resp.status();
            let cookies: Vec<String> = resp
                .headers()
                .get_all(header::SET_COOKIE)
                .iter()
                .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
                .collect();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, cookies, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (_, pre, form) = send("/".into(), String::new(), None, false).await;
    let at = form.find(r#"name="csrf" value=""#).unwrap() + 19;
    let csrf = &form[at..at + 64];
    let (_, cookies, _) = send(
        "/signin".into(),
        pre[0].clone(),
        Some(format!("csrf={csrf}&token={secret}")),
        false,
    )
    .await;
    let cookie = cookies[0].clone();
    // A run with its tasks and attempts: one of the newest of a job.
    let detailed = |i: usize| {
        let job = (i * 7919) % JOBS;
        (job * RUNS_PER_JOB + RUNS_PER_JOB - DETAILED_RUNS + 1 + i % DETAILED_RUNS) as i64
    };
    let pages: Vec<Page> = vec![
        (
            "jobs, first page",
            Box::new(|_| ("/jobs?ns=bench".into(), false)),
        ),
        (
            "jobs, a later page",
            Box::new(|i| {
                (
                    format!("/jobs?ns=bench&cursor=job%3Ajob-{:05}", (i * 37) % JOBS),
                    false,
                )
            }),
        ),
        (
            "jobs, a search",
            Box::new(|i| (format!("/jobs?ns=bench&q=job-0{}", i % 10), false)),
        ),
        (
            "a job",
            Box::new(|i| (format!("/jobs/bench/job-{:05}", (i * 7919) % JOBS), false)),
        ),
        (
            "a run",
            Box::new(move |i| (format!("/runs/{}", detailed(i)), false)),
        ),
        (
            "a log (htmx)",
            Box::new(move |i| {
                (
                    format!("/runs/{}/tasks/load/attempts/1/log", detailed(i)),
                    true,
                )
            }),
        ),
        (
            "playground (htmx)",
            Box::new(|i| {
                (
                    format!(
                        "/playground?expr=0+{}+9+*+*+MON-FRI&tz=Europe/Berlin",
                        i % 60
                    ),
                    true,
                )
            }),
        ),
        ("cluster", Box::new(|_| ("/cluster".into(), false))),
        ("audit log", Box::new(|_| ("/audit".into(), false))),
        (
            "overview (10,000 jobs: sections, 7-day calendar of 200)",
            Box::new(|_| ("/".into(), false)),
        ),
        (
            "runs browser, first page",
            Box::new(|_| ("/runs".into(), false)),
        ),
        (
            "runs browser, a later page",
            Box::new(|i| {
                (
                    format!(
                        "/runs?cursor=run%3A{}",
                        1 + (i * 7919) % (JOBS * RUNS_PER_JOB)
                    ),
                    false,
                )
            }),
        ),
        (
            "runs browser, failed runs",
            Box::new(|_| ("/runs?ns=bench&state=failed".into(), false)),
        ),
        (
            "runs browser, a job's",
            Box::new(|i| {
                (
                    format!("/runs?ns=bench&job=job-{:05}", (i * 7919) % JOBS),
                    false,
                )
            }),
        ),
        (
            "runs browser, a manual trigger (none: scans every run)",
            Box::new(|_| ("/runs?ns=bench&trigger=manual".into(), false)),
        ),
    ];
    println!("| page | requests | p50 | p99 | max |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    // PAGE_BENCH_ONLY=jobs times only the pages whose name has "jobs".
    let only = std::env::var("PAGE_BENCH_ONLY").unwrap_or_default();
    for (name, uri) in pages.iter().filter(|(name, _)| name.contains(&only)) {
        let mut times: Vec<Duration> = Vec::new();
        for i in 0..320 {
            let (u, htmx) = uri(i);
            let t = Instant::now();
            let (status, _, body) = send(u.clone(), cookie.clone(), None, htmx).await;
            let took = t.elapsed();
            assert!(status.is_success(), "{u}: {status} {body}");
            if i >= 20 {
                times.push(took);
            }
        }
        times.sort();
        let q = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            times.len(),
            q(0.5).as_secs_f64() * 1e3,
            q(0.99).as_secs_f64() * 1e3,
            times.last().unwrap().as_secs_f64() * 1e3
        );
    }
}
