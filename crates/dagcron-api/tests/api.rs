//! The API through its router, without a socket, on a real SQLite store and engine.

use dagcron_testkit::until_async;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use dagcron_api::{AppState, router};
use dagcron_core::authz::{Grant, Role};
use dagcron_runtime::{Engine, EngineConfig, SystemClock};
use dagcron_store::prelude::*;
use dagcron_store_sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

struct Api {
    app: axum::Router,
    store: Arc<SqliteStore>,
    keyring: dagcron_api::auth::Keyring,
    /// An instance-admin token, sent by `call`.
    token: String,
    _dir: tempfile::TempDir,
    /// Stops the engine (on drop too).
    stop: CancellationToken,
    _shutdown: tokio_util::sync::DropGuard,
}

async fn api() -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("db")).await.unwrap());
    let (engine, handle) = Engine::start(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(engine.run(shutdown.clone(), Duration::from_secs(1)));
    let keyring = dagcron_api::auth::Keyring::from_bytes([7; 32]);
    let mut api = Api {
        app: router(AppState {
            cluster: None,
            workers: None,
            store: store.clone(),
            engine: handle,
            max_body_bytes: 64 << 10,
            keyring: Arc::new(keyring.clone()),
            master_key: Some(Arc::new(dagcron_api::secrets::KeySet::one(
                dagcron_api::secrets::MasterKey::from_bytes([9; 32]),
            ))),
            metrics: None,
            quota: Default::default(),
            pruned: Default::default(),
        }),
        store,
        keyring,
        token: String::new(),
        _dir: dir,
        stop: shutdown.clone(),
        _shutdown: shutdown.drop_guard(),
    };
    api.token = api.token_with(Role::Admin, None).await;
    api
}

impl Api {
    /// Stores a new token with this grant; returns its secret.
    async fn token_with(&self, role: Role, namespace: Option<&str>) -> String {
        let grant = Grant {
            role,
            namespace: namespace.map(Into::into),
        };
        let (record, secret) = dagcron_api::auth::new_token(
            &format!("{role} {namespace:?}"),
            &grant,
            None,
            None,
            jiff::Timestamp::now(),
        );
        self.store
            .create_token(&record, &self.keyring.hash(&secret))
            .await
            .unwrap();
        secret
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        content_type: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        self.call_as(Some(&self.token), method, uri, content_type, body)
            .await
    }

    async fn call_as(
        &self,
        token: Option<&str>,
        method: Method,
        uri: &str,
        content_type: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type);
        if let Some(token) = token {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        let req = req.body(Body::from(body.to_string())).unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    /// The whole answer to a request with the token, headers and all.
    async fn raw(&self, method: Method, uri: &str) -> axum::response::Response {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {}", self.token))
            .body(Body::empty())
            .unwrap();
        self.app.clone().oneshot(req).await.unwrap()
    }

    async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.call(Method::GET, uri, "application/json", "").await
    }

    async fn post(&self, uri: &str, body: &str) -> (StatusCode, Value) {
        self.call(Method::POST, uri, "application/json", body).await
    }

    async fn wait_run(&self, id: &Value) -> Value {
        for _ in 0..1000 {
            let (_, run) = self.get(&format!("/api/v1/runs/{id}")).await;
            if ["succeeded", "failed", "cancelled"].contains(&run["state"].as_str().unwrap()) {
                return run;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("run {id} did not finish");
    }
}

const FILE: &str = r#"
namespace: team
jobs:
  - name: report
    schedule: "0 0 3 * * *"
    params: { region: eu }
    tasks:
      - { id: fetch, shell: "echo fetching {{params.region}}" }
      - { id: send, depends_on: [fetch], shell: "echo sent" }
"#;

#[tokio::test]
async fn apply_is_idempotent_and_jobs_are_listed() {
    let api = api().await;
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", FILE)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["jobs"],
        json!([{ "job": "team/report", "result": { "result": "created", "version": 1 } }])
    );
    let (_, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", FILE)
        .await;
    assert_eq!(
        body["jobs"][0]["result"],
        json!({ "result": "unchanged", "version": 1 })
    );
    let (status, job) = api.get("/api/v1/namespaces/team/jobs/report").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (job["version"].clone(), job["paused"].clone()),
        (json!(1), json!(false))
    );
    assert!(
        job["next_fire"].as_str().unwrap().ends_with("T03:00:00Z"),
        "{job}"
    );
    let (_, list) = api.get("/api/v1/namespaces/team/jobs?limit=10").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["next_cursor"], Value::Null);
}

#[tokio::test]
async fn the_next_fire_of_a_job_skips_the_fires_its_calendars_suppress() {
    let api = api().await;
    let file = "namespace: team\ncalendars:\n  - { name: weekdays, timezone: UTC, weekly: [{ days: [MON, TUE, WED, THU, FRI, SAT], from: '00:00', to: '24:00' }] }\njobs:\n  - { name: sunday, schedule: '0 3 * * *', exclude: [weekdays], tasks: [{ id: a, noop: true }] }\n";
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, job) = api.get("/api/v1/namespaces/team/jobs/sunday").await;
    let next: jiff::Timestamp = job["next_fire"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        jiff::tz::TimeZone::UTC.to_datetime(next).weekday(),
        jiff::civil::Weekday::Sunday,
        "{job}"
    );
    assert_eq!(
        job["spec"]["exclude"][0]["name"], "weekdays",
        "stored with the job"
    );
    let unknown = "namespace: team\njobs:\n  - { name: x, schedule: '@daily', exclude: [nope], tasks: [{ id: a, noop: true }] }\n";
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", unknown)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["details"][0]["path"], "jobs[0].exclude[0]");
}

#[tokio::test]
async fn invalid_files_are_rejected_with_paths_and_change_nothing() {
    let api = api().await;
    let bad = "namespace: team\njobs:\n  - name: report\n    schedule: '0 0 30 2 *'\n    tasks: [{ id: a, depends_on: [zz], shell: 'true' }]\n";
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", bad)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid_job_file");
    let details = body["error"]["details"].as_array().unwrap();
    assert_eq!(details[0]["path"], "jobs[0].schedule");
    assert_eq!(details[0]["span"], json!([4, 8]));
    assert_eq!(details[1]["path"], "jobs[0].tasks[0].depends_on[0]");
    let (status, _) = api.get("/api/v1/namespaces/team/jobs/report").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was applied");
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/json",
            "{\"jobs\": 3}",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot read the job file"),
        "{body}"
    );
}

/// The log of a running attempt, without `follow`: its output so far,
/// marked partial; once the attempt has ended, all of it, marked complete.
/// (It was empty until the end: only the stored log was read.)
#[tokio::test]
async fn a_running_attempts_log_is_its_output_so_far() {
    let api = api().await;
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let file = format!(
        "namespace: team\njobs:\n  - name: slow\n    tasks:\n      - id: t\n        shell: \"echo first; while [ ! -e '{}' ]; do sleep 0.02; done; echo second\"\n",
        go.display()
    );
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", &file)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, run) = api
        .post("/api/v1/namespaces/team/jobs/slow/trigger", "{}")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let uri = format!("/api/v1/runs/{}/tasks/t/attempts/1/log", run["id"]);
    let log = async || {
        let req = Request::builder()
            .uri(&uri)
            .header("authorization", format!("Bearer {}", api.token))
            .body(Body::empty())
            .unwrap();
        let resp = api.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let whole = resp
            .headers()
            .get("x-dagcron-log")
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, whole, String::from_utf8_lossy(&bytes).into_owned())
    };
    let so_far = until_async("the attempt's first line is readable", async || {
        let answer = log().await;
        if answer.0 == StatusCode::OK && !answer.2.is_empty() {
            Ok(answer)
        } else {
            Err(format!("{answer:?}"))
        }
    })
    .await;
    assert_eq!(
        so_far,
        (StatusCode::OK, Some("partial".into()), "first\n".into())
    );
    std::fs::write(&go, "").unwrap();
    let run = api.wait_run(&run["id"]).await;
    assert_eq!(run["state"], "succeeded");
    assert_eq!(
        log().await,
        (
            StatusCode::OK,
            Some("complete".into()),
            "first\nsecond\n".into()
        )
    );
}

#[tokio::test]
async fn trigger_run_logs_and_cancel() {
    let api = api().await;
    api.call(Method::POST, "/api/v1/apply", "application/yaml", FILE)
        .await;
    let (status, run) = api
        .post(
            "/api/v1/namespaces/team/jobs/report/trigger",
            r#"{"params": {"region": "us"}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    for field in [
        "id",
        "namespace",
        "job",
        "trigger",
        "scheduled_at",
        "state",
        "created_at",
        "started_at",
        "finished_at",
        "tasks",
    ] {
        assert!(run.get(field).is_some(), "run lacks {field}: {run}");
    }
    assert_eq!(run["trigger"], "manual");
    let run = api.wait_run(&run["id"]).await;
    assert_eq!(run["state"], "succeeded");
    let attempt = &run["tasks"][0]["attempts"][0];
    assert_eq!(
        (
            attempt["number"].clone(),
            attempt["state"].clone(),
            attempt["exit_code"].clone()
        ),
        (json!(1), json!("succeeded"), json!(0))
    );
    let (status, log) = api
        .get(&format!(
            "/api/v1/runs/{}/tasks/fetch/attempts/1/log",
            run["id"]
        ))
        .await;
    assert_eq!((status, log), (StatusCode::OK, json!("fetching us\n")));
    let (_, runs) = api
        .get("/api/v1/namespaces/team/jobs/report/runs?limit=5")
        .await;
    assert_eq!(runs["items"][0]["id"], run["id"]);
    let (status, body) = api
        .post(&format!("/api/v1/runs/{}/cancel", run["id"]), "")
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _) = api.get("/api/v1/runs/12345").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api
        .get("/api/v1/namespaces/team/jobs/report/runs?cursor=nonsense")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn pause_resume_delete_backfill_and_fires() {
    let api = api().await;
    api.call(Method::POST, "/api/v1/apply", "application/yaml", FILE)
        .await;
    let (_, job) = api
        .post("/api/v1/namespaces/team/jobs/report/pause", "")
        .await;
    assert_eq!(
        (job["paused"].clone(), job["next_fire"].clone()),
        (json!(true), Value::Null)
    );
    let (_, job) = api
        .post("/api/v1/namespaces/team/jobs/report/resume", "")
        .await;
    assert_eq!(job["paused"], json!(false));
    let (status, body) = api
        .post(
            "/api/v1/namespaces/team/jobs/report/backfill",
            r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-03T00:00:00Z"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["runs"].as_array().unwrap().len(), 2);
    for id in body["runs"].as_array().unwrap() {
        assert_eq!(api.wait_run(id).await["state"], "succeeded");
    }
    let (_, fires) = api.get("/api/v1/namespaces/team/jobs/report/fires?from=2026-01-01T00:00:00Z&to=2026-02-01T00:00:00Z").await;
    let items = fires["items"].as_array().unwrap();
    assert_eq!(
        items
            .iter()
            .map(|f| f["scheduled_at"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["2026-01-01T03:00:00Z", "2026-01-02T03:00:00Z"]
    );
    assert_eq!(items[0]["outcome"], "fired");
    let (status, _) = api
        .call(
            Method::DELETE,
            "/api/v1/namespaces/team/jobs/report",
            "application/json",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = api
        .post("/api/v1/namespaces/team/jobs/report/trigger", "")
        .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn put_a_single_job() {
    let api = api().await;
    let spec = r#"{"name": "one", "schedule": "@hourly", "tasks": [{"id": "a", "shell": "true"}]}"#;
    let (status, job) = api
        .call(
            Method::PUT,
            "/api/v1/namespaces/team/jobs/one",
            "application/json",
            spec,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["version"], 1);
    let (status, body) = api
        .call(
            Method::PUT,
            "/api/v1/namespaces/team/jobs/other",
            "application/json",
            spec,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// Every error answer is the JSON error shape with a stable code: axum's
/// own rejections were plain text (`413`, path and query parse errors) or
/// empty (`405`), and an unknown path looked like success.
#[tokio::test]
async fn regression_every_error_is_the_json_error_shape() {
    let api = api().await;
    let cases: Vec<(Method, &str, String, StatusCode, &str)> = vec![
        (
            Method::GET,
            "/api/v1/nope",
            String::new(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/nope",
            String::new(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::DELETE,
            "/api/v1/apply",
            String::new(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::GET,
            "/api/v1/runs/abc",
            String::new(),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::GET,
            "/api/v1/namespaces/a/jobs?limit=x",
            String::new(),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::GET,
            "/api/v1/runs/1/tasks/a/attempts/-1/log",
            String::new(),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::POST,
            "/api/v1/apply",
            "x".repeat(100 << 10),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
    ];
    for (method, uri, body, status, code) in cases {
        let (got, value) = api
            .call(method.clone(), uri, "application/json", &body)
            .await;
        assert_eq!(got, status, "{method} {uri}: {value}");
        assert_eq!(value["error"]["code"], code, "{method} {uri}: {value}");
        assert!(
            value["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{method} {uri}: {value}"
        );
    }
}

/// A hot-spot report asked with a window or a `top` out of bounds, or
/// that does not parse, is a `400` in the JSON error shape, with the reason.
#[tokio::test]
async fn hotspot_queries_out_of_bounds_are_refused() {
    let api = api().await;
    for (query, reason) in [
        ("window=0", "the window is empty"),
        ("window=0s", "the window is empty"),
        ("window=25h", "too long: at most 1d"),
        ("window=1500ms", "not a whole number of seconds"),
        ("window=soon", "invalid duration"),
        ("window=", "invalid duration"),
        ("top=0", "top must be at least 1"),
        ("top=101", "at most 100"),
        ("top=99999999999", ""),
        ("top=-1", ""),
        ("top=x", ""),
    ] {
        let (status, body) = api
            .get(&format!("/api/v1/schedules/hotspots?{query}"))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{query}: {message}");
    }
    let (status, body) = api.get("/api/v1/schedules/hotspots?window=30m&top=5").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            body["jobs"].clone(),
            body["peak_per_second"].clone(),
            body["hotspots"].clone()
        ),
        (json!(0), json!(0), json!([]))
    );
}

/// Trigger parameters were accepted with 201 whatever they held (empty
/// names, `../../x`, NUL bytes, 200 KB values) and failed at start.
#[tokio::test]
async fn regression_trigger_parameters_are_validated() {
    let api = api().await;
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            "namespace: p\njobs:\n  - { name: j, tasks: [{ id: a, noop: true }] }\n",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let big = "v".repeat(20_000);
    for params in [
        json!({ "": "x" }),
        json!({ "../../x": "x" }),
        json!({ "1st": "x" }),
        json!({ "ok": "a\u{0}b" }),
        json!({ "ok": big }),
    ] {
        let body = json!({ "params": params }).to_string();
        let (status, value) = api.post("/api/v1/namespaces/p/jobs/j/trigger", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
        assert_eq!(value["error"]["code"], "invalid_params", "{value}");
    }
    let (_, runs) = api.get("/api/v1/namespaces/p/jobs/j/runs").await;
    assert_eq!(runs["items"], json!([]), "a refused trigger made no run");
    let (status, _) = api
        .post(
            "/api/v1/namespaces/p/jobs/j/trigger",
            r#"{"params": {"region_2": "eu"}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
}

/// A batch trigger makes many runs of a job in one call, each with its
/// parameters, all answered as committed (each readable at once) and run;
/// a batch with any bad item, or one that would pass the job's backlog or
/// overlap policy, the namespace's quotas or the trigger bound, is refused
/// whole: no run is made.
#[tokio::test]
async fn a_batch_trigger_makes_every_run_or_none() {
    let api = api().await;
    let file = "namespace: p\njobs:
  - { name: j, params: { region: eu }, tasks: [{ id: a, noop: true }, { id: b, depends_on: [a], noop: true }] }
  - { name: q, concurrency: queue, max_active_runs: 1, max_pending_runs: 2, tasks: [{ id: a, shell: 'sleep 30' }] }
  - { name: f, concurrency: forbid, tasks: [{ id: a, shell: 'sleep 30' }] }
  - { name: r, concurrency: replace, tasks: [{ id: a, noop: true }] }
";
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let runs_of = |job: &'static str| {
        let api = &api;
        async move {
            let (_, page) = api
                .get(&format!("/api/v1/namespaces/p/jobs/{job}/runs?limit=1000"))
                .await;
            page["items"].as_array().unwrap().len()
        }
    };
    let batch = |job: &'static str, body: String| {
        let api = &api;
        async move {
            api.post(
                &format!("/api/v1/namespaces/p/jobs/{job}/trigger-batch"),
                &body,
            )
            .await
        }
    };

    let body =
        json!({ "runs": [{}, { "params": { "region": "us" } }, { "params": { "day": "2" } }] });
    let (status, answer) = batch("j", body.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let runs = answer["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    let regions: Vec<&Value> = runs.iter().map(|r| &r["params"]["region"]).collect();
    assert_eq!(regions, [&json!("eu"), &json!("us"), &json!("eu")]);
    assert_eq!(runs[2]["params"]["day"], "2");
    let ids: Vec<i64> = runs.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "in the order asked: {ids:?}"
    );
    for run in runs {
        assert_eq!(run["trigger"], "manual");
        assert!(
            ["pending", "running"].contains(&run["state"].as_str().unwrap()),
            "{run}"
        );
        assert_eq!(run["tasks"].as_array().unwrap().len(), 2);
        // Durable before the answer: the store has it already.
        let (status, stored) = api.get(&format!("/api/v1/runs/{}", run["id"])).await;
        assert_eq!(status, StatusCode::OK, "{stored}");
        assert_eq!(stored["params"], run["params"]);
        assert_eq!(api.wait_run(&run["id"]).await["state"], "succeeded");
    }
    let (_, audit) = api.get("/api/v1/audit?limit=1000").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(
                |row| row["action"] == "POST /api/v1/namespaces/p/jobs/j/trigger-batch"
                    && row["outcome"] == 201
            ),
        "the batch is in the audit log: {audit}"
    );

    // Bad input: refused whole, nothing made.
    let too_many = json!({ "runs": vec![json!({}); 1001] }).to_string();
    for (body, code, why) in [
        ("".to_string(), "bad_request", "expected"),
        ("{}".into(), "bad_request", "runs"),
        (r#"{"runs": []}"#.into(), "bad_request", "1 to 1000"),
        (r#"{"runs": {}}"#.into(), "bad_request", "expected"),
        (
            r#"{"runs": [{"parms": {}}]}"#.into(),
            "bad_request",
            "parms",
        ),
        (
            r#"{"runs": [{}], "extra": 1}"#.into(),
            "bad_request",
            "extra",
        ),
        (
            r#"{"runs": [{}], "at": "tomorrow"}"#.into(),
            "bad_request",
            "RFC 3339",
        ),
        (too_many, "bad_request", "not 1001"),
        (
            json!({ "runs": [{}, { "params": { "../x": "1" } }] }).to_string(),
            "invalid_params",
            "runs[1].params",
        ),
    ] {
        let (status, answer) = batch("j", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
        assert!(answer.to_string().contains(why), "{body}: {answer}");
    }
    assert_eq!(runs_of("j").await, 3, "a refused batch made no run");
    let (status, answer) = batch("nope", r#"{"runs": [{}]}"#.into()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    // The job's backlog: one runs, two may wait; a fourth refuses all four.
    let four = json!({ "runs": [{}, {}, {}, {}] }).to_string();
    let (status, answer) = batch("q", four).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_pending_runs"),
        "{answer}"
    );
    assert_eq!(runs_of("q").await, 0);
    let (status, answer) = batch("q", json!({ "runs": [{}, {}, {}] }).to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let states: Vec<&Value> = answer["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["state"])
        .collect();
    assert_eq!(
        states,
        [&json!("running"), &json!("pending"), &json!("pending")]
    );
    let (status, _) = batch("q", r#"{"runs": [{}]}"#.into()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(runs_of("q").await, 3);
    // Forbid: the second run of the batch would overlap the first.
    let (status, answer) = batch("f", r#"{"runs": [{}, {}]}"#.into()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this trigger"),
        "{answer}"
    );
    assert_eq!(runs_of("f").await, 0);
    // Replace: each run would cancel the one before it.
    let (status, answer) = batch("r", r#"{"runs": [{}, {}]}"#.into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(runs_of("r").await, 0);
    let (status, _) = batch("r", r#"{"runs": [{}]}"#.into()).await;
    assert_eq!(status, StatusCode::CREATED);

    // The namespace's quotas count each run of a batch.
    let (status, _) = api
        .call(
            Method::PUT,
            "/api/v1/namespaces/p/quotas",
            "application/json",
            r#"{"max_active_runs": 5, "max_triggers_per_second": 4}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, answer) = batch("j", json!({ "runs": [{}, {}, {}] }).to_string()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unfinished"),
        "{answer}"
    );
    let (status, answer) = batch("j", json!({ "runs": [{}, {}] }).to_string()).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "3 unfinished and 2 more: {answer}"
    );
    let (status, _) = api
        .call(
            Method::PUT,
            "/api/v1/namespaces/p/quotas",
            "application/json",
            r#"{"max_triggers_per_second": 4}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, answer) = batch("j", json!({ "runs": [{}, {}, {}, {}, {}] }).to_string()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 4 at a time"),
        "{answer}"
    );
    assert_eq!(runs_of("j").await, 5);
    for job in ["q", "f", "r"] {
        let (_, page) = api
            .get(&format!("/api/v1/namespaces/p/jobs/{job}/runs"))
            .await;
        for run in page["items"].as_array().unwrap() {
            api.post(&format!("/api/v1/runs/{}/cancel", run["id"]), "")
                .await;
        }
    }
}

/// A batch with `at` plans every run for that instant.
#[tokio::test]
async fn a_batch_trigger_at_an_instant_plans_every_run() {
    let api = api().await;
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            "namespace: p\njobs:\n  - { name: j, max_pending_runs: 3, tasks: [{ id: a, noop: true }] }\n",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let at = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(5))
        .round(jiff::Unit::Second)
        .unwrap();
    let uri = "/api/v1/namespaces/p/jobs/j/trigger-batch";
    let four = json!({ "at": at.to_string(), "runs": [{}, {}, {}, {}] }).to_string();
    let (status, answer) = api.post(uri, &four).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "past max_pending_runs: {answer}"
    );
    let three = json!({ "at": at.to_string(), "runs": [{}, {}, {}] }).to_string();
    let (status, answer) = api.post(uri, &three).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    for run in answer["runs"].as_array().unwrap() {
        assert_eq!(
            (&run["state"], &run["scheduled_at"]),
            (&json!("planned"), &json!(at.to_string()))
        );
    }
    let (_, upcoming) = api
        .get("/api/v1/namespaces/p/jobs/j/upcoming?limit=10")
        .await;
    let planned = upcoming["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "planned")
        .count();
    assert_eq!(planned, 3, "{upcoming}");
}

/// A trigger with `at` plans a run: `planned` at that instant, listed
/// among the job's upcoming fires beside its schedule's, cancellable
/// before it is made; an instant that has passed, or a malformed one, is
/// refused and plans nothing.
#[tokio::test]
async fn a_trigger_at_an_instant_plans_a_run_listed_with_the_upcoming_fires() {
    let api = api().await;
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            "namespace: p\njobs:\n  - { name: j, schedule: '0 0 12 * * *', tasks: [{ id: a, noop: true }] }\n",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let now = jiff::Timestamp::now();
    let at = |hours: i64| {
        (now + jiff::SignedDuration::from_hours(hours))
            .round(jiff::Unit::Second)
            .unwrap()
    };
    for (body, why) in [
        (json!({ "at": at(-1).to_string() }), "has passed"),
        (json!({ "at": "tomorrow" }), "RFC 3339"),
        (json!({ "at": "2026-01-01T00:00:00" }), "RFC 3339"),
        (json!({ "at": at(24 * 366 * 11).to_string() }), "ten years"),
        (json!({ "at": 5 }), "RFC 3339"),
    ] {
        let (status, value) = api
            .post("/api/v1/namespaces/p/jobs/j/trigger", &body.to_string())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {value}");
        assert!(
            value["error"]["message"].as_str().unwrap().contains(why),
            "{body}: {value}"
        );
    }
    let (_, runs) = api.get("/api/v1/namespaces/p/jobs/j/runs").await;
    assert_eq!(runs["items"], json!([]), "a refused plan made no run");

    let body = json!({ "at": at(30).to_string(), "params": { "region": "eu" } });
    let (status, run) = api
        .post("/api/v1/namespaces/p/jobs/j/trigger", &body.to_string())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["state"], "planned");
    assert_eq!(run["scheduled_at"], at(30).to_string());
    assert_eq!(run["params"]["region"], "eu");
    let id = run["id"].as_i64().unwrap();

    let (status, upcoming) = api
        .get("/api/v1/namespaces/p/jobs/j/upcoming?limit=3")
        .await;
    assert_eq!(status, StatusCode::OK, "{upcoming}");
    let items = upcoming["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    // Three noon fires in 3 days, and the planned run 30 hours ahead among them.
    assert_eq!(kinds.iter().filter(|k| **k == "schedule").count(), 3);
    let planned: Vec<&Value> = items.iter().filter(|i| i["kind"] == "planned").collect();
    assert_eq!(planned.len(), 1);
    assert_eq!(planned[0]["run_id"], id);
    assert_eq!(planned[0]["at"], at(30).to_string());
    let ats: Vec<jiff::Timestamp> = items
        .iter()
        .map(|i| i["at"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(
        ats.windows(2).all(|w| w[0] <= w[1]),
        "soonest first: {upcoming}"
    );
    for bad in ["limit=0", "limit=101", "limit=x"] {
        let (status, value) = api
            .get(&format!("/api/v1/namespaces/p/jobs/j/upcoming?{bad}"))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {value}");
    }

    let (status, _) = api.post(&format!("/api/v1/runs/{id}/cancel"), "").await;
    assert!(status.is_success(), "{status}");
    let (_, run) = api.get(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(run["state"], "cancelled");
    let (_, upcoming) = api.get("/api/v1/namespaces/p/jobs/j/upcoming").await;
    assert!(
        upcoming["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["kind"] == "schedule"),
        "{upcoming}"
    );
}

/// The agents' gRPC service was the fallback of every path: a typo in a
/// REST path answered `200` with `content-type: application/grpc`.
#[tokio::test]
async fn regression_only_grpc_requests_reach_the_grpc_service() {
    let api = api().await;
    let grpc = axum::Router::new().fallback(|| async { "grpc" });
    let app = dagcron_api::with_grpc(api.app.clone(), grpc);
    let send = async |content_type: &str| {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/dagcron.agent.v1.Agents/Session")
            .header("content-type", content_type)
            .header("authorization", format!("Bearer {}", api.token))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).to_string())
    };
    assert_eq!(
        send("application/grpc").await,
        (StatusCode::OK, "grpc".into())
    );
    let (status, body) = send("application/json").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains(r#""code":"not_found""#), "{body}");
}

/// The routes the router declares, read from its source: (method, path).
fn declared_routes() -> std::collections::BTreeSet<(String, String)> {
    let source = include_str!("../src/routes.rs");
    let mut out = std::collections::BTreeSet::new();
    for chunk in source.split(".route(").skip(1) {
        let chunk = chunk.split(".fallback(").next().unwrap();
        let path = chunk.split('"').nth(1).unwrap().to_string();
        for method in ["get", "post", "put", "delete", "patch"] {
            if chunk.contains(&format!("{method}(")) {
                out.insert((method.to_string(), path.clone()));
            }
        }
    }
    out
}

/// Every route is in the OpenAPI document with its methods, and every
/// operation of the document reaches a handler.
#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let api = api().await;
    let (status, doc) = api.get("/api/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let mut documented = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let declared = declared_routes();
    assert!(declared.len() >= 18, "{declared:?}");
    let missing: Vec<_> = declared.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "routes missing from the OpenAPI document: {missing:?}"
    );
    let extra: Vec<_> = documented.difference(&declared).collect();
    assert!(extra.is_empty(), "documented but not routed: {extra:?}");
    for (method, path) in &documented {
        let uri = path
            .replace("{ns}", "n")
            .replace("{name}", "j")
            .replace("{id}", "1")
            .replace("{task}", "t")
            .replace("{n}", "1")
            .replace("{version}", "1");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let (status, value) = api
            .call(method.clone(), &uri, "application/json", "{}")
            .await;
        let fallback = status == StatusCode::METHOD_NOT_ALLOWED
            || value["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no such path"));
        assert!(
            !fallback,
            "{method} {uri} is documented but not routed: {value}"
        );
        // Every answer's status is one the document lists for the operation.
        let op = &doc["paths"][path][method.as_str().to_lowercase()];
        assert!(
            op["responses"].get(status.as_str()).is_some(),
            "{method} {uri} answered {status}, which its document does not list"
        );
    }
}

/// Who a route is for: which grant it needs, on what.
#[derive(Clone, Copy, Debug)]
enum Guard {
    /// Anyone, no token.
    Public,
    /// A role in the namespace of the object (`a` here).
    Namespace(Role),
    /// A role over the instance.
    Instance(Role),
    /// Token administration: an admin over the token's namespace (`a`).
    Tokens,
    /// A report over namespaces: a role anywhere; a scoped token sees its
    /// own namespace only.
    Scoped(Role),
    /// A webhook: no token, a signed body; a job that takes no deliveries
    /// answers as a wrong signature does, whoever calls.
    Signed,
}

/// Every route the router declares, with the guard it must enforce. A
/// route missing here fails the test: no route goes unclassified.
fn guard_of(method: &str, path: &str) -> Option<Guard> {
    use Guard::*;
    use Role::*;
    Some(match (method, path) {
        ("get", "/healthz" | "/readyz" | "/api/v1/openapi.json") => Public,
        ("post", "/api/v1/hooks/{ns}/{name}") => Signed,
        (
            "get",
            "/api/v1/cluster"
            | "/api/v1/workers"
            | "/metrics"
            | "/api/v1/admin/read-only"
            | "/api/v1/admin/policy",
        ) => Instance(Viewer),
        ("delete", "/api/v1/namespaces/{ns}/policy") => Instance(Admin),
        (
            "put",
            "/api/v1/admin/read-only"
            | "/api/v1/admin/policy"
            | "/api/v1/namespaces/{ns}/quotas"
            | "/api/v1/namespaces/{ns}/policy"
            | "/api/v1/namespaces/{ns}/retention",
        ) => Instance(Admin),
        ("post", "/api/v1/admin/prune") => Instance(Admin),
        (
            "get",
            "/api/v1/namespaces/{ns}/quotas"
            | "/api/v1/namespaces/{ns}/policy"
            | "/api/v1/namespaces/{ns}/retention",
        ) => Namespace(Viewer),
        ("post", "/api/v1/namespaces/{ns}/pause" | "/api/v1/namespaces/{ns}/resume") => {
            Namespace(Operator)
        }
        ("post", "/api/v1/apply") => Namespace(Developer),
        ("get", "/api/v1/namespaces/{ns}/jobs") => Namespace(Viewer),
        ("get", "/api/v1/namespaces/{ns}/jobs/{name}") => Namespace(Viewer),
        ("put" | "delete", "/api/v1/namespaces/{ns}/jobs/{name}") => Namespace(Developer),
        (
            "post",
            "/api/v1/namespaces/{ns}/jobs/{name}/pause"
            | "/api/v1/namespaces/{ns}/jobs/{name}/resume"
            | "/api/v1/namespaces/{ns}/jobs/{name}/trigger"
            | "/api/v1/namespaces/{ns}/jobs/{name}/trigger-batch"
            | "/api/v1/namespaces/{ns}/jobs/{name}/backfill",
        ) => Namespace(Operator),
        (
            "get",
            "/api/v1/namespaces/{ns}/jobs/{name}/runs"
            | "/api/v1/namespaces/{ns}/jobs/{name}/fires"
            | "/api/v1/namespaces/{ns}/jobs/{name}/upcoming"
            | "/api/v1/namespaces/{ns}/jobs/{name}/versions"
            | "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}",
        ) => Namespace(Viewer),
        ("post", "/api/v1/namespaces/{ns}/jobs/{name}/versions/{version}/rollback") => {
            Namespace(Developer)
        }
        ("get", "/api/v1/runs/{id}" | "/api/v1/runs/{id}/tasks/{task}/attempts/{n}/log") => {
            Namespace(Viewer)
        }
        (
            "post",
            "/api/v1/runs/{id}/cancel"
            | "/api/v1/runs/{id}/rerun"
            | "/api/v1/runs/{id}/tasks/{task}/{action}",
        ) => Namespace(Operator),
        (
            "get",
            "/api/v1/namespaces/{ns}/held"
            | "/api/v1/namespaces/{ns}/notifications"
            | "/api/v1/namespaces/{ns}/notifications/{id}",
        ) => Namespace(Viewer),
        ("post" | "get", "/api/v1/tokens") | ("delete", "/api/v1/tokens/{id}") => Tokens,
        ("get", "/api/v1/audit") => Tokens,
        ("get", "/api/v1/schedules/hotspots" | "/api/v1/runs") => Scoped(Viewer),
        ("get", "/api/v1/namespaces/{ns}/secrets") => Namespace(Developer),
        ("get", "/api/v1/secrets/keys") | ("post", "/api/v1/secrets/rotate-key") => Instance(Admin),
        ("put" | "delete", "/api/v1/namespaces/{ns}/secrets/{name}") => Namespace(Developer),
        _ => return None,
    })
}

/// Every route, reached with no token and with every role in the object's
/// namespace, in another namespace and over the instance: each answer is
/// what the route's guard says (`401`, `403`, a hidden `404`, or served).
#[tokio::test]
async fn every_route_is_guarded_for_every_role() {
    let api = api().await;
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            "namespace: a\njobs:\n  - { name: j, tasks: [{ id: t, noop: true }] }\n",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, run) = api.post("/api/v1/namespaces/a/jobs/j/trigger", "{}").await;
    let run = run["id"].as_i64().unwrap();
    api.wait_run(&json!(run)).await;
    let unclassified: Vec<_> = declared_routes()
        .into_iter()
        .filter(|(m, p)| guard_of(m, p).is_none())
        .collect();
    assert!(
        unclassified.is_empty(),
        "routes nobody classified: {unclassified:?}"
    );
    let body_for = |path: &str| match path {
        "/api/v1/apply" => r#"{"namespace": "a", "jobs": []}"#.to_string(),
        "/api/v1/namespaces/{ns}/jobs/{name}" => r#"{"name": "other", "tasks": []}"#.into(),
        "/api/v1/namespaces/{ns}/jobs/{name}/backfill" => {
            r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}"#.into()
        }
        "/api/v1/tokens" => r#"{"name": "x", "role": "viewer", "namespace": "a"}"#.into(),
        "/api/v1/admin/read-only" => r#"{"read_only": false}"#.into(),
        "/api/v1/admin/prune" => r#"{"dry_run": true}"#.into(),
        "/api/v1/namespaces/{ns}/jobs/{name}/trigger-batch" => r#"{"runs": [{}]}"#.into(),
        _ => "{}".into(),
    };
    let mut grants: Vec<Option<(Role, Option<&str>)>> = vec![None];
    for role in Role::ALL {
        for ns in [Some("a"), Some("b"), None] {
            grants.push(Some((role, ns)));
        }
    }
    let mut checked = 0;
    for (method, path) in declared_routes() {
        let guard = guard_of(&method, &path).unwrap();
        for grant in &grants {
            let token = match grant {
                Some((role, ns)) => Some(api.token_with(*role, *ns).await),
                None => None,
            };
            let uri = path
                .replace("{ns}", "a")
                .replace("{name}", if method == "delete" { "gone" } else { "j" })
                .replace(
                    "{id}",
                    &if path.starts_with("/api/v1/tokens") {
                        "tok_none".into()
                    } else {
                        run.to_string()
                    },
                )
                .replace("{task}", "t")
                .replace("{action}", "retry")
                .replace("{n}", "1")
                .replace("{version}", "1");
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let (status, value) = api
                .call_as(
                    token.as_deref(),
                    m,
                    &uri,
                    "application/json",
                    &body_for(&path),
                )
                .await;
            let what = format!("{method} {uri} as {grant:?}: {status} {value}");
            let expected: &[StatusCode] = match (guard, grant) {
                (Guard::Public, _) => &[StatusCode::OK],
                (Guard::Signed, _) => &[StatusCode::UNAUTHORIZED],
                (_, None) => &[StatusCode::UNAUTHORIZED],
                (Guard::Namespace(need), Some((role, ns))) => match ns {
                    // Another namespace's listing looks empty, its objects absent.
                    Some("b")
                        if path == "/api/v1/namespaces/{ns}/jobs"
                            || path == "/api/v1/namespaces/{ns}/secrets" =>
                    {
                        assert_eq!(value["items"], json!([]), "{what}");
                        &[StatusCode::OK]
                    }
                    // Applying a file names its namespace: refused, not hidden.
                    Some("b") if path == "/api/v1/apply" => &[StatusCode::FORBIDDEN],
                    Some("b") => &[StatusCode::NOT_FOUND],
                    _ if role < &need => &[StatusCode::FORBIDDEN],
                    _ => &[],
                },
                (Guard::Instance(need), Some((role, ns))) => {
                    if ns.is_some() || role < &need {
                        &[StatusCode::FORBIDDEN]
                    } else {
                        &[]
                    }
                }
                (Guard::Scoped(need), Some((role, _))) => {
                    if role < &need {
                        &[StatusCode::FORBIDDEN]
                    } else {
                        &[]
                    }
                }
                (Guard::Tokens, Some((role, ns))) => {
                    let lists = method == "get";
                    if *role != Role::Admin || (!lists && *ns == Some("b") && method == "post") {
                        &[StatusCode::FORBIDDEN]
                    } else {
                        &[]
                    }
                }
            };
            if expected.is_empty() {
                assert!(
                    ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status)
                        && !status.is_server_error(),
                    "served: {what}"
                );
            } else {
                assert!(expected.contains(&status), "expected {expected:?}: {what}");
            }
            assert!(
                value.get("error").is_some() || status.is_success(),
                "{what}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 21 * 13, "{checked}");
}

/// No token, a malformed one, an unknown one, a revoked one and an expired
/// one are all refused with `401` in the JSON error shape.
#[tokio::test]
async fn calls_without_a_valid_token_are_refused() {
    let api = api().await;
    let grant = Grant {
        role: Role::Admin,
        namespace: None,
    };
    let now = jiff::Timestamp::now();
    let (revoked, revoked_secret) = dagcron_api::auth::new_token("r", &grant, None, None, now);
    api.store
        .create_token(&revoked, &api.keyring.hash(&revoked_secret))
        .await
        .unwrap();
    api.store.revoke_token(&revoked.id, now).await.unwrap();
    let past = now.checked_sub(jiff::SignedDuration::from_secs(1)).unwrap();
    let (expired, expired_secret) =
        dagcron_api::auth::new_token("e", &grant, Some(past), None, now);
    api.store
        .create_token(&expired, &api.keyring.hash(&expired_secret))
        .await
        .unwrap();
    // The same secret under another server key is unknown.
    let other_key = dagcron_api::auth::Keyring::from_bytes([8; 32]);
    assert_ne!(other_key.hash(&api.token), api.keyring.hash(&api.token));
    for token in [
        None,
        Some("garbage"),
        Some("dgc_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        Some(revoked_secret.as_str()),
        Some(expired_secret.as_str()),
    ] {
        let (status, value) = api
            .call_as(token, Method::GET, "/api/v1/namespaces/a/jobs", "", "")
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}: {value}");
        assert_eq!(value["error"]["code"], "unauthenticated");
    }
    let (status, _) = api.call_as(None, Method::GET, "/healthz", "", "").await;
    assert_eq!(status, StatusCode::OK, "liveness needs no token");
}

/// `GET /api/v1/runs/{id}` answered for any namespace; a scoped token now
/// sees another namespace's runs, logs, jobs and fires as absent.
#[tokio::test]
async fn regression_a_scoped_token_sees_nothing_of_another_namespace() {
    let api = api().await;
    api.call(
        Method::POST,
        "/api/v1/apply",
        "application/yaml",
        "namespace: b\njobs:\n  - { name: secret-job, tasks: [{ id: t, shell: 'echo hidden' }] }\n",
    )
    .await;
    let (_, run) = api
        .post("/api/v1/namespaces/b/jobs/secret-job/trigger", "{}")
        .await;
    let id = run["id"].as_i64().unwrap();
    api.wait_run(&json!(id)).await;
    let a = api.token_with(Role::Admin, Some("a")).await;
    let as_a = async |uri: &str| api.call_as(Some(&a), Method::GET, uri, "", "").await;
    let (status, hidden) = as_a(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, absent) = as_a("/api/v1/runs/1").await;
    assert_eq!(
        hidden["error"]["message"]
            .as_str()
            .unwrap()
            .replace(&id.to_string(), "ID"),
        absent["error"]["message"]
            .as_str()
            .unwrap()
            .replace('1', "ID"),
        "a hidden run looks like an absent one"
    );
    let (status, _) = as_a(&format!("/api/v1/runs/{id}/tasks/t/attempts/1/log")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = as_a("/api/v1/namespaces/b/jobs/secret-job/fires").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, jobs) = as_a("/api/v1/namespaces/b/jobs").await;
    assert_eq!((status, jobs["items"].clone()), (StatusCode::OK, json!([])));
    let (status, _) = api
        .call_as(
            Some(&a),
            Method::POST,
            &format!("/api/v1/runs/{id}/cancel"),
            "",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A token gets at most its creator's authority; its secret is answered
/// once and stored only as a keyed hash; a revoked token is refused.
#[tokio::test]
async fn tokens_are_created_within_their_creators_authority() {
    let api = api().await;
    let ns_admin = api.token_with(Role::Admin, Some("a")).await;
    let developer = api.token_with(Role::Developer, Some("a")).await;
    let create = async |token: &str, body: Value| {
        api.call_as(
            Some(token),
            Method::POST,
            "/api/v1/tokens",
            "application/json",
            &body.to_string(),
        )
        .await
    };
    // Beyond the creator's authority: refused.
    for (token, body) in [
        (
            &developer,
            json!({ "name": "x", "role": "viewer", "namespace": "a" }),
        ),
        (&ns_admin, json!({ "name": "x", "role": "viewer" })),
        (
            &ns_admin,
            json!({ "name": "x", "role": "viewer", "namespace": "b" }),
        ),
    ] {
        let (status, value) = create(token, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{value}");
    }
    for body in [
        json!({ "name": "", "role": "viewer", "namespace": "a" }),
        json!({ "name": "x", "role": "root", "namespace": "a" }),
        json!({ "name": "x", "role": "viewer", "namespace": "a", "expires_in": "-1d" }),
        json!({ "name": "x", "role": "viewer", "namespace": "../a" }),
    ] {
        let (status, value) = create(&ns_admin, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
    }
    let (status, made) = create(
        &ns_admin,
        json!({ "name": "ci", "role": "operator", "namespace": "a", "expires_in": "30d" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let secret = made["token"].as_str().unwrap().to_string();
    assert!(secret.starts_with("dgc_"));
    // Listed, never with its secret; the namespace admin sees only its own.
    let (_, list) = api
        .call_as(Some(&ns_admin), Method::GET, "/api/v1/tokens", "", "")
        .await;
    assert!(!list.to_string().contains(&secret));
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["namespace"] == "a")
    );
    let stored = api.store.list_tokens().await.unwrap();
    assert!(stored.iter().any(|t| t.id == made["details"]["id"]));
    // The new token works, within its role; once revoked it is refused.
    let (status, _) = api
        .call_as(
            Some(&secret),
            Method::POST,
            "/api/v1/namespaces/a/jobs/j/pause",
            "",
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an operator may pause (there is no such job)"
    );
    let id = made["details"]["id"].as_str().unwrap();
    let (status, _) = api
        .call_as(
            Some(&ns_admin),
            Method::DELETE,
            &format!("/api/v1/tokens/{id}"),
            "",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = api
        .call_as(
            Some(&secret),
            Method::GET,
            "/api/v1/namespaces/a/jobs",
            "",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// `/readyz` says whether the node can work, check by check, with no token:
/// ready while the store answers and the engine's loop takes commands; not
/// ready, saying why, once the engine has stopped.
#[tokio::test]
async fn readiness_checks_the_store_and_the_engine() {
    let api = api().await;
    let (status, body) = api.call_as(None, Method::GET, "/readyz", "", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"ready": true, "checks": [{"name": "store", "ok": true}, {"name": "engine", "ok": true}, {"name": "writes", "ok": true}]})
    );
    api.stop.cancel();
    let body = until_async("the server is not ready", async || {
        let (status, body) = api.call_as(None, Method::GET, "/readyz", "", "").await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            Ok(body)
        } else {
            Err(body)
        }
    })
    .await;
    assert_eq!(body["ready"], false);
    assert_eq!(body["checks"][0], json!({"name": "store", "ok": true}));
    assert_eq!(
        body["checks"][1],
        json!({"name": "engine", "ok": false, "problem": "the engine has stopped"})
    );
}

/// A call with a token of this grant.
async fn call_with(
    api: &Api,
    token: &str,
    method: Method,
    uri: &str,
    body: &str,
) -> (StatusCode, Value) {
    api.call_as(Some(token), method, uri, "application/json", body)
        .await
}

/// Versions: listed newest first with who applied each and when, read one
/// at a time with their spec (viewer), rolled back (developer: a new
/// version equal to the old one, recorded as a rollback); another
/// namespace's are absent; hostile version numbers are refused and change
/// nothing.
#[tokio::test]
async fn versions_are_listed_read_and_rolled_back_by_role() {
    let api = api().await;
    let developer = api.token_with(Role::Developer, Some("team")).await;
    let operator = api.token_with(Role::Operator, Some("team")).await;
    let viewer = api.token_with(Role::Viewer, Some("team")).await;
    let outsider = api.token_with(Role::Admin, Some("other")).await;
    let apply = async |file: &str| {
        api.call_as(
            Some(&developer),
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            file,
        )
        .await
    };
    let (status, _) = apply(FILE).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = apply(&FILE.replace("region: eu", "region: us")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let base = "/api/v1/namespaces/team/jobs/report/versions";

    let (status, page) = call_with(&api, &viewer, Method::GET, base, "").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let items = page["items"].as_array().unwrap();
    assert_eq!(
        items
            .iter()
            .map(|v| (v["version"].clone(), v["current"].clone()))
            .collect::<Vec<_>>(),
        [(json!(2), json!(true)), (json!(1), json!(false))]
    );
    assert!(
        items[0]["applied_by"]["token_id"]
            .as_str()
            .unwrap()
            .starts_with("tok_")
    );
    assert_eq!(items[0]["applied_by"]["name"], "developer Some(\"team\")");
    assert_eq!(items[0]["rollback_of"], Value::Null);
    assert_eq!(items[0]["rules"]["cron_semantics"], 1);
    assert!(items[0]["rules"]["tzdb"].as_str().unwrap().len() >= 5);
    assert!(items[0].get("spec").is_none(), "a listing leaves specs out");
    let (_, one) = call_with(&api, &viewer, Method::GET, &format!("{base}/1"), "").await;
    assert_eq!(one["spec"]["params"], json!({ "region": "eu" }));
    assert_eq!(one["current"], false);

    // Only a developer rolls back.
    for token in [&viewer, &operator] {
        let (status, _) =
            call_with(&api, token, Method::POST, &format!("{base}/1/rollback"), "").await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    let (status, done) = call_with(
        &api,
        &developer,
        Method::POST,
        &format!("{base}/1/rollback"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(
        done,
        json!({ "job": "team/report", "result": "updated", "version": 3, "rolled_back_to": 1 })
    );
    let (_, job) = api.get("/api/v1/namespaces/team/jobs/report").await;
    assert_eq!(
        (job["version"].clone(), job["spec"]["params"].clone()),
        (json!(3), json!({ "region": "eu" }))
    );
    let (_, v3) = api.get(&format!("{base}/3")).await;
    assert_eq!(
        (v3["rollback_of"].clone(), v3["current"].clone()),
        (json!(1), json!(true))
    );
    assert_eq!(v3["spec"], one["spec"]);
    assert_eq!(v3["applied_by"], items[0]["applied_by"]);
    let (_, again) = call_with(
        &api,
        &developer,
        Method::POST,
        &format!("{base}/1/rollback"),
        "",
    )
    .await;
    assert_eq!(again["result"], "unchanged", "{again}");

    // Pages.
    let (_, first) = api.get(&format!("{base}?limit=2")).await;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, rest) = api.get(&format!("{base}?limit=2&cursor={cursor}")).await;
    assert_eq!(rest["items"][0]["version"], 1);
    assert_eq!(rest["next_cursor"], Value::Null);

    // Hostile numbers and other namespaces: a clear 4xx, nothing changes.
    for (uri, status) in [
        (format!("{base}/0"), StatusCode::BAD_REQUEST),
        (format!("{base}/-1"), StatusCode::BAD_REQUEST),
        (format!("{base}/abc"), StatusCode::BAD_REQUEST),
        (
            format!("{base}/99999999999999999999999"),
            StatusCode::BAD_REQUEST,
        ),
        (format!("{base}/9223372036854775807"), StatusCode::NOT_FOUND),
        (format!("{base}/4"), StatusCode::NOT_FOUND),
        (format!("{base}?cursor=nonsense"), StatusCode::BAD_REQUEST),
        (format!("{base}?limit=0"), StatusCode::BAD_REQUEST),
        (
            "/api/v1/namespaces/team/jobs/none/versions".into(),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let (got, value) = api.get(&uri).await;
        assert_eq!(got, status, "{uri}: {value}");
        assert!(
            value["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{uri}: {value}"
        );
        let rollback = if uri.contains('?') || uri.ends_with("/versions") {
            continue;
        } else {
            format!("{uri}/rollback")
        };
        let (got, value) = call_with(&api, &developer, Method::POST, &rollback, "").await;
        assert_eq!(got, status, "{rollback}: {value}");
    }
    for uri in [base.to_string(), format!("{base}/1")] {
        let (status, _) = call_with(&api, &outsider, Method::GET, &uri, "").await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "another namespace's versions are absent"
        );
    }
    let (status, _) = call_with(
        &api,
        &outsider,
        Method::POST,
        &format!("{base}/2/rollback"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, job) = api.get("/api/v1/namespaces/team/jobs/report").await;
    assert_eq!(job["version"], 3, "nothing changed");

    // The audit log has the rollback, by whom.
    let (_, audit) = api.get("/api/v1/audit?namespace=team").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["action"] == format!("POST {base}/1/rollback")
                && r["outcome"] == 200
                && r["principal_name"] == "developer Some(\"team\")"),
        "{audit}"
    );
}

/// A job whose version was applied under other scheduling rules than the
/// server's (here, other rules for its zone) says so, until it is applied
/// again: a new version recorded with the server's rules.
#[tokio::test]
async fn a_job_applied_under_other_rules_says_so_until_applied_again() {
    let api = api().await;
    let file = "namespace: team\njobs:\n  - { name: berlin, schedule: '0 30 2 * * *', timezone: Europe/Berlin, tasks: [{ id: t, noop: true }] }\n";
    let parsed: dagcron_core::JobFile = serde_saphyr::from_str(file).unwrap();
    let job = parsed.validate().unwrap().pop().unwrap();
    let now = job.rules();
    let then = dagcron_core::Rules {
        tzdb: "2000a".into(),
        zones: [("Europe/Berlin".to_string(), "0123456789abcdef".to_string())].into(),
        ..now.clone()
    };
    api.store
        .apply_jobs(
            &[dagcron_store::JobUpsert {
                rules: Some(then),
                ..dagcron_store::JobUpsert::of(&job)
            }],
            jiff::Timestamp::now(),
        )
        .await
        .unwrap();
    let (_, answer) = api.get("/api/v1/namespaces/team/jobs/berlin").await;
    let change = &answer["rules_changed"];
    assert_eq!(change["zones"], json!(["Europe/Berlin"]), "{answer}");
    assert_eq!(change["stored"]["tzdb"], "2000a");
    assert_eq!(change["now"]["tzdb"], now.tzdb);
    assert!(
        change["message"]
            .as_str()
            .unwrap()
            .contains("Europe/Berlin"),
        "{change}"
    );
    let (_, list) = api.get("/api/v1/namespaces/team/jobs").await;
    assert_eq!(list["items"][0]["rules_changed"], *change);
    let (_, applied) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(
        applied["jobs"][0]["result"],
        json!({ "result": "updated", "version": 2 })
    );
    let (_, answer) = api.get("/api/v1/namespaces/team/jobs/berlin").await;
    assert!(answer.get("rules_changed").is_none(), "{answer}");
    let (_, again) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(again["jobs"][0]["result"]["result"], "unchanged");
}

/// Waits until task `task` of run `id` is in `state`.
async fn wait_task(api: &Api, id: i64, task: usize, state: &str) -> Value {
    for _ in 0..1000 {
        let (_, run) = api.get(&format!("/api/v1/runs/{id}")).await;
        if run["tasks"][task]["state"] == state {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {task} of run {id} never became {state}");
}

/// Manual intervention: a task with `on_exhausted: hold` is held when its
/// last attempt fails, its run waits; held tasks are listed and counted;
/// an operator retries it (a new attempt past `max_attempts`), marks it
/// succeeded (its downstream runs) or fails it; each action is in the
/// audit log with who did it. A viewer may not, another namespace's run
/// is absent, an unknown action or task is not found, an action that does
/// not apply (or on a run that has ended) is a conflict, and none of
/// those changes anything.
#[tokio::test]
async fn held_tasks_are_listed_counted_and_settled_by_an_operator() {
    let api = api().await;
    let dir = tempfile::tempdir().unwrap();
    let fixed = dir.path().join("fixed");
    let file = format!(
        "namespace: team\njobs:\n  - name: etl\n    on_exhausted: hold\n    tasks:\n      - {{ id: a, shell: 'test -e {}' }}\n      - {{ id: b, depends_on: [a], noop: true }}\n      - {{ id: c, shell: 'false', on_exhausted: fail }}\n",
        fixed.display(),
    );
    let (status, _) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", &file)
        .await;
    assert_eq!(status, StatusCode::OK);
    let operator = api.token_with(Role::Operator, Some("team")).await;
    let viewer = api.token_with(Role::Viewer, Some("team")).await;
    let outsider = api.token_with(Role::Admin, Some("other")).await;
    let held_run = async || {
        let (_, run) = api
            .post("/api/v1/namespaces/team/jobs/etl/trigger", "")
            .await;
        let id = run["id"].as_i64().unwrap();
        wait_task(&api, id, 0, "held").await;
        wait_task(&api, id, 2, "failed").await
    };

    // Held: the run goes on, the task is listed and counted.
    let first = held_run().await;
    let id = first["id"].as_i64().unwrap();
    assert_eq!(first["state"], "running", "{first}");
    assert_eq!(first["tasks"][1]["state"], "pending");
    let (status, held) = call_with(
        &api,
        &viewer,
        Method::GET,
        "/api/v1/namespaces/team/held",
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(held["items"].as_array().unwrap().len(), 1, "{held}");
    let item = &held["items"][0];
    assert_eq!(
        (
            item["run"].as_i64(),
            &item["job"],
            &item["task"],
            &item["attempts"]
        ),
        (Some(id), &json!("etl"), &json!("a"), &json!(1))
    );
    assert!(item["held_since"].is_string(), "{item}");
    let (status, hidden) = call_with(
        &api,
        &outsider,
        Method::GET,
        "/api/v1/namespaces/team/held",
        "",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{hidden}");
    let (_, metrics) = api.get("/metrics").await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("dagcron_tasks_held{namespace=\"team\"} 1"),
        "{metrics}"
    );

    // Refused: by role, by namespace, hostile paths, actions that do not apply.
    let retry = format!("/api/v1/runs/{id}/tasks/a/retry");
    let (status, _) = call_with(&api, &viewer, Method::POST, &retry, "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call_with(&api, &outsider, Method::POST, &retry, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for (uri, status) in [
        (
            format!("/api/v1/runs/{id}/tasks/a/succeed"),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("/api/v1/runs/{id}/tasks/zz/retry"),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("/api/v1/runs/{id}/tasks/b/fail"),
            StatusCode::CONFLICT,
        ),
        (
            format!("/api/v1/runs/{id}/tasks/c/retry"),
            StatusCode::CONFLICT,
        ),
        ("/api/v1/runs/1/tasks/a/retry".into(), StatusCode::NOT_FOUND),
        (
            "/api/v1/runs/abc/tasks/a/retry".into(),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (got, value) = call_with(&api, &operator, Method::POST, &uri, "").await;
        assert_eq!(got, status, "{uri}: {value}");
        assert!(
            value["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{value}"
        );
    }
    let (_, unchanged) = api.get(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(unchanged["tasks"], first["tasks"], "nothing changed");

    // Retried by hand, past max_attempts (1): it succeeds, the run goes on.
    std::fs::write(&fixed, "").unwrap();
    let (status, answer) = call_with(&api, &operator, Method::POST, &retry, "").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let done = api.wait_run(&json!(id)).await;
    assert_eq!(done["tasks"][0]["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(
        (
            &done["tasks"][0]["state"],
            &done["tasks"][1]["state"],
            &done["state"]
        ),
        (&json!("succeeded"), &json!("succeeded"), &json!("failed")),
        "c failed, a and its downstream succeeded: {done}"
    );
    // Once ended, nothing more: re-run it instead.
    let (status, ended) = call_with(
        &api,
        &operator,
        Method::POST,
        &format!("/api/v1/runs/{id}/tasks/c/mark_succeeded"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        ended["error"]["message"]
            .as_str()
            .unwrap()
            .contains("rerun"),
        "{ended}"
    );

    // Marked succeeded (and c marked skipped): the run succeeds.
    std::fs::remove_file(&fixed).unwrap();
    let second = held_run().await["id"].as_i64().unwrap();
    for (task, action) in [("c", "mark_skipped"), ("a", "mark_succeeded")] {
        let uri = format!("/api/v1/runs/{second}/tasks/{task}/{action}");
        let (status, answer) = call_with(&api, &operator, Method::POST, &uri, "").await;
        assert_eq!(status, StatusCode::OK, "{uri}: {answer}");
    }
    let done = api.wait_run(&json!(second)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["tasks"][0]["attempts"].as_array().unwrap().len(), 1);

    // Failed by hand: its downstream does not run, the run fails.
    let third = held_run().await["id"].as_i64().unwrap();
    let (status, _) = call_with(
        &api,
        &operator,
        Method::POST,
        &format!("/api/v1/runs/{third}/tasks/a/fail"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let done = api.wait_run(&json!(third)).await;
    assert_eq!(
        (
            &done["state"],
            &done["tasks"][0]["state"],
            &done["tasks"][1]["state"]
        ),
        (
            &json!("failed"),
            &json!("failed"),
            &json!("upstream_failed")
        )
    );
    let (_, held) = api.get("/api/v1/namespaces/team/held").await;
    assert_eq!(held["items"], json!([]));

    // Who did what, in the audit log.
    let (_, audit) = api.get("/api/v1/audit?namespace=team&limit=1000").await;
    let done: Vec<(String, String, u64)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"].as_str().unwrap().contains("/tasks/"))
        .map(|r| {
            (
                r["action"].as_str().unwrap().to_string(),
                r["principal_name"].as_str().unwrap_or("").to_string(),
                r["outcome"].as_u64().unwrap(),
            )
        })
        .filter(|(_, _, outcome)| *outcome == 200)
        .collect();
    let who = "operator Some(\"team\")".to_string();
    assert_eq!(
        done,
        [
            (format!("POST {retry}"), who.clone(), 200),
            (
                format!("POST /api/v1/runs/{second}/tasks/c/mark_skipped"),
                who.clone(),
                200
            ),
            (
                format!("POST /api/v1/runs/{second}/tasks/a/mark_succeeded"),
                who.clone(),
                200
            ),
            (format!("POST /api/v1/runs/{third}/tasks/a/fail"), who, 200),
        ]
    );
}

/// Re-runs: an operator re-runs a finished run, whole or from its failed
/// tasks (the others carried over); a viewer may not; another namespace's
/// run is absent; a run still going, or with nothing failed (from its
/// failed tasks), is a conflict; hostile ids and bodies are refused, and
/// none of them creates a run.
#[tokio::test]
async fn reruns_by_role_and_hostile_ids() {
    let api = api().await;
    let dir = tempfile::tempdir().unwrap();
    let (fixed, gate) = (dir.path().join("fixed"), dir.path().join("gate"));
    let file = format!(
        "namespace: team\njobs:\n  - name: etl\n    tasks:\n      - {{ id: a, shell: 'true' }}\n      - {{ id: b, depends_on: [a], shell: 'test -e {}' }}\n  - name: slow\n    tasks: [{{ id: a, shell: 'while [ ! -e {} ]; do sleep 0.01; done' }}]\n",
        fixed.display(),
        gate.display()
    );
    let (status, _) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", &file)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, run) = api
        .post("/api/v1/namespaces/team/jobs/etl/trigger", "")
        .await;
    let failed = api.wait_run(&run["id"]).await;
    assert_eq!(failed["state"], "failed");
    let id = failed["id"].as_i64().unwrap();
    let operator = api.token_with(Role::Operator, Some("team")).await;
    let viewer = api.token_with(Role::Viewer, Some("team")).await;
    let outsider = api.token_with(Role::Admin, Some("other")).await;
    let rerun = format!("/api/v1/runs/{id}/rerun");
    let runs = async || {
        let (_, page) = api.get("/api/v1/namespaces/team/jobs/etl/runs").await;
        page["items"].as_array().unwrap().len()
    };

    let (status, _) = call_with(&api, &viewer, Method::POST, &rerun, "{}").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, hidden) = call_with(&api, &outsider, Method::POST, &rerun, "{}").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{hidden}");
    for (uri, body, status) in [
        (
            rerun.clone(),
            r#"{"failed_only": "yes"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (rerun.clone(), r#"{"only": true}"#, StatusCode::BAD_REQUEST),
        (rerun.clone(), "[", StatusCode::BAD_REQUEST),
        (rerun.clone(), "[true]", StatusCode::BAD_REQUEST),
        (
            "/api/v1/runs/abc/rerun".into(),
            "{}",
            StatusCode::BAD_REQUEST,
        ),
        ("/api/v1/runs/-5/rerun".into(), "{}", StatusCode::NOT_FOUND),
        (
            "/api/v1/runs/99999999999999999999999/rerun".into(),
            "{}",
            StatusCode::BAD_REQUEST,
        ),
        ("/api/v1/runs/1/rerun".into(), "{}", StatusCode::NOT_FOUND),
    ] {
        let (got, value) = call_with(&api, &operator, Method::POST, &uri, body).await;
        assert_eq!(got, status, "{uri} {body}: {value}");
        assert!(
            value["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{value}"
        );
    }
    assert_eq!(runs().await, 1, "nothing was created");

    std::fs::write(&fixed, "").unwrap();
    let (status, again) = call_with(
        &api,
        &operator,
        Method::POST,
        &rerun,
        r#"{"failed_only": true}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(
        (
            again["trigger"].clone(),
            again["rerun_of"].clone(),
            again["job_version"].clone()
        ),
        (json!("rerun"), json!(id), json!(1))
    );
    let again = api.wait_run(&again["id"]).await;
    assert_eq!(again["state"], "succeeded", "{again}");
    assert_eq!(again["tasks"][0]["carried"], true);
    assert_eq!(again["tasks"][0]["attempts"], json!([]));
    assert!(again["tasks"][1].get("carried").is_none());
    assert_eq!(again["tasks"][1]["attempts"][0]["state"], "succeeded");
    let (status, nothing) = call_with(
        &api,
        &operator,
        Method::POST,
        &format!("/api/v1/runs/{}/rerun", again["id"]),
        r#"{"failed_only": true}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{nothing}");
    let (status, whole) = call_with(
        &api,
        &operator,
        Method::POST,
        &format!("/api/v1/runs/{}/rerun", again["id"]),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{whole}");
    let whole = api.wait_run(&whole["id"]).await;
    assert_eq!(whole["state"], "succeeded");
    assert!(
        whole["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.get("carried").is_none())
    );
    assert_eq!(runs().await, 3);

    // A run still going.
    let (_, going) = api
        .post("/api/v1/namespaces/team/jobs/slow/trigger", "")
        .await;
    let (status, busy) = call_with(
        &api,
        &operator,
        Method::POST,
        &format!("/api/v1/runs/{}/rerun", going["id"]),
        "{}",
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{busy}");
    assert_eq!(busy["error"]["code"], "conflict");
    std::fs::write(&gate, "").unwrap();
    api.wait_run(&going["id"]).await;
}

/// The read-only mode: stored (so every node obeys it), it refuses applies,
/// edits, deletions, rollbacks, triggers, re-runs and backfills with `503 read_only` and the
/// reason, and changes nothing; pauses stay open; off, all works again.
/// Bulk pause and resume change each job of the namespace once.
#[tokio::test]
async fn read_only_refuses_changes_and_pausing_a_namespace_pauses_its_jobs() {
    let api = api().await;
    let file = "namespace: a\njobs:\n  - { name: j, tasks: [{ id: t, noop: true }] }\n  - { name: k, tasks: [{ id: t, noop: true }] }\n";
    let (status, _) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, run) = api.post("/api/v1/namespaces/a/jobs/j/trigger", "").await;
    api.wait_run(&run["id"]).await;
    let rerun = format!("/api/v1/runs/{}/rerun", run["id"]);
    let (status, body) = api
        .call(
            Method::PUT,
            "/api/v1/admin/read-only",
            "application/json",
            r#"{"read_only": true, "reason": "database migration"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["read_only"], &body["reason"]),
        (&json!(true), &json!("database migration"))
    );
    assert!(
        api.store.get_setting("read_only").await.unwrap().is_some(),
        "stored, for every node"
    );
    let changed = "namespace: a\njobs:\n  - { name: j, tasks: [{ id: u, noop: true }] }\n";
    for (method, uri, body) in [
        (Method::POST, "/api/v1/apply", changed),
        (
            Method::PUT,
            "/api/v1/namespaces/a/jobs/j",
            r#"{"name": "j", "tasks": [{"id": "u", "noop": true}]}"#,
        ),
        (Method::DELETE, "/api/v1/namespaces/a/jobs/k", ""),
        (Method::POST, "/api/v1/namespaces/a/jobs/j/trigger", "{}"),
        (
            Method::POST,
            "/api/v1/namespaces/a/jobs/j/trigger-batch",
            r#"{"runs": [{}, {}]}"#,
        ),
        (
            Method::POST,
            "/api/v1/namespaces/a/jobs/j/backfill",
            r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}"#,
        ),
        (
            Method::POST,
            "/api/v1/namespaces/a/jobs/j/versions/1/rollback",
            "",
        ),
        (Method::POST, rerun.as_str(), "{}"),
    ] {
        let kind = if uri.ends_with("/apply") {
            "application/yaml"
        } else {
            "application/json"
        };
        let (status, answer) = api.call(method.clone(), uri, kind, body).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {uri}: {answer}"
        );
        assert_eq!(answer["error"]["code"], "read_only");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("database migration"),
            "{answer}"
        );
    }
    let (_, job) = api.get("/api/v1/namespaces/a/jobs/j").await;
    assert_eq!(job["version"], 1, "nothing changed: {job}");
    let (_, runs) = api.get("/api/v1/namespaces/a/jobs/j/runs").await;
    assert_eq!(runs["items"].as_array().unwrap().len(), 1, "no run made");
    let (_, jobs) = api.get("/api/v1/namespaces/a/jobs").await;
    assert_eq!(
        jobs["items"].as_array().unwrap().len(),
        2,
        "nothing deleted"
    );
    // Pausing is how an operator calms things down: open, in bulk too.
    let (status, answer) = api.post("/api/v1/namespaces/a/pause", "").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (&answer["changed"], &answer["unchanged"]),
        (&json!(2), &json!(0))
    );
    let (_, answer) = api.post("/api/v1/namespaces/a/pause", "").await;
    assert_eq!(
        (&answer["changed"], &answer["unchanged"]),
        (&json!(0), &json!(2))
    );
    let (_, jobs) = api.get("/api/v1/namespaces/a/jobs").await;
    assert!(
        jobs["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["paused"] == true)
    );
    // A reason too long, or with control characters, is refused.
    for body in [
        format!(r#"{{"read_only": true, "reason": "{}"}}"#, "x".repeat(501)),
        r#"{"read_only": true, "reason": "a\u0007b"}"#.to_string(),
        r#"{"read_only": "yes"}"#.to_string(),
    ] {
        let (status, _) = api
            .call(
                Method::PUT,
                "/api/v1/admin/read-only",
                "application/json",
                &body,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    // Off: changes go through again, and the jobs resume in bulk.
    let (status, body) = api
        .call(
            Method::PUT,
            "/api/v1/admin/read-only",
            "application/json",
            r#"{"read_only": false}"#,
        )
        .await;
    assert_eq!(
        (status, &body["read_only"]),
        (StatusCode::OK, &json!(false))
    );
    let (status, _) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", changed)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, answer) = api.post("/api/v1/namespaces/a/resume", "").await;
    assert_eq!(answer["changed"], 2);
    let (_, status_now) = api.get("/api/v1/admin/read-only").await;
    assert_eq!(status_now["read_only"], false);
}

/// 1,000 unauthenticated calls with 60 KB paths under another tenant's
/// namespace: each audit row keeps at most 512 bytes of the path (with a
/// marker) and no namespace (the caller named one it may not); past the
/// address's allowance of failures the calls get 429 with Retry-After and
/// write nothing; a caller with a valid token is still served.
#[tokio::test]
async fn regression_refused_calls_cannot_flood_the_audit_log() {
    let api = api().await;
    let long = format!("/api/v1/namespaces/beta/jobs/{}", "x".repeat(60_000));
    let mut limited = 0;
    let mut refused = 0;
    for _ in 0..1000 {
        let req = Request::builder()
            .method(Method::GET)
            .uri(&long)
            .body(Body::empty())
            .unwrap();
        let resp = api.app.clone().oneshot(req).await.unwrap();
        match resp.status() {
            StatusCode::UNAUTHORIZED => refused += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(resp.headers()["retry-after"], "1");
                limited += 1;
            }
            other => panic!("{other}"),
        }
    }
    assert!(limited >= 700, "{limited} limited, {refused} refused");
    let rows = api.store.list_audit(0, 1000, None).await.unwrap();
    assert_eq!(rows.len(), refused, "a row per refusal, none per 429");
    for row in &rows {
        assert!(row.action.len() < 600, "{}", row.action.len());
        assert!(row.action.contains("more bytes]"), "{}", &row.action[..80]);
        assert_eq!(row.namespace, None);
    }
    let (status, _) = api.get("/api/v1/namespaces/beta/jobs").await;
    assert_eq!(status, StatusCode::OK, "a valid token is still served");
    // A scoped token refused on another namespace writes no row there.
    let alpha = api.token_with(Role::Developer, Some("alpha")).await;
    let (status, _) = api
        .call_as(
            Some(&alpha),
            Method::PUT,
            "/api/v1/namespaces/beta/jobs/j",
            "application/json",
            "{}",
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let rows = api.store.list_audit(0, 1000, Some("beta")).await.unwrap();
    assert!(rows.is_empty(), "{rows:?}");
}

/// Retention cuts the audit log's oldest rows: the page answers the
/// checkpoint, and the rows left verify from it (and not without it).
#[tokio::test]
async fn the_audit_log_cut_by_retention_verifies_from_its_checkpoint() {
    let api = api().await;
    for i in 0..5 {
        let (status, _) = api
            .post(&format!("/api/v1/namespaces/a/jobs/j{i}/pause"), "")
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (_, page) = api.get("/api/v1/audit").await;
    assert_eq!(page["checkpoint"], Value::Null);
    let rows = api.store.list_audit(0, 100, None).await.unwrap();
    assert_eq!(rows.len(), 5);
    let gone = api.store.prune_audit(rows[3].at).await.unwrap();
    assert_eq!(gone, 3);
    let (_, page) = api.get("/api/v1/audit").await;
    let page: dagcron_api::wire::AuditPage = serde_json::from_value(page).unwrap();
    let checkpoint = page.checkpoint.unwrap().stored().unwrap();
    assert_eq!(checkpoint, (rows[2].seq, rows[2].hash.clone()));
    let left: Vec<_> = page.items.iter().map(|r| r.entry().unwrap()).collect();
    assert_eq!(left.len(), 2, "the two newest kept");
    assert_eq!(
        dagcron_store::verify_audit(&left, Some(&checkpoint)),
        Ok(())
    );
    assert!(dagcron_store::verify_audit(&left, None).is_err());
}

/// Execution policies per namespace, set by an instance admin: a file with
/// a task the policy does not allow is refused whole (403, a problem per
/// rule, naming the task), nothing of it applied; a bad policy is refused
/// and changes nothing; another namespace keeps the default.
#[tokio::test]
async fn an_execution_policy_refuses_the_tasks_it_does_not_allow() {
    let api = api().await;
    let put = |body: &'static str| {
        let api = &api;
        async move {
            api.call(
                Method::PUT,
                "/api/v1/namespaces/a/policy",
                "application/json",
                body,
            )
            .await
        }
    };
    let (status, default) = api.get("/api/v1/namespaces/a/policy").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(default["shell"], "server");
    assert_eq!(default["wasm_dirs"], serde_json::json!([]));
    for bad in [
        r#"{"wasm_dirs": ["relative"]}"#,
        r#"{"wasm_dirs": ["/a/../etc"]}"#,
        r#"{"http_allow": ["10.0.0.0/99"]}"#,
        r#"{"shell": "everywhere"}"#,
        r#"{"weight": 0}"#,
        r#"{"weight": 101}"#,
        r#"{"nope": 1}"#,
        r#"[]"#,
    ] {
        let (status, body) = put(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body["error"]["message"].is_string(), "{body}");
    }
    let (status, body) =
        put(r#"{"shell": "agents", "wasm_dirs": ["/srv/in"], "http_allow": ["10.0.0.0/8"]}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let file = r#"namespace: a
jobs:
  - name: hostile
    tasks:
      - { id: sh, shell: "cat /etc/passwd" }
      - { id: far, shell: "true", run_on: { labels: { pool: x } } }
      - { id: web, http: { url: "http://127.0.0.1:9/" } }
      - id: w
        wasm:
          module: /tmp/m.wasm
          grants: { dirs: [{ host: /, guest: /r }, { host: /srv/in/x, guest: /in }], env: [DAGCRON_AGENT_TOKEN] }
"#;
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let paths: Vec<&str> = body["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "jobs[0].tasks[0].shell",
            "jobs[0].tasks[2].http.url",
            "jobs[0].tasks[3].wasm.grants.dirs[0]",
            "jobs[0].tasks[3].wasm.grants.env[0]",
        ],
        "{body}"
    );
    let (status, _) = api.get("/api/v1/namespaces/a/jobs/hostile").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing of the file applied");
    // The instance's default applies to every namespace without a policy
    // of its own; a namespace's own policy removed, the default is its.
    let (status, body) = api
        .call(
            Method::PUT,
            "/api/v1/admin/policy",
            "application/json",
            r#"{"http": false}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, c) = api.get("/api/v1/namespaces/c/policy").await;
    assert_eq!(c["http"], false);
    let (_, a) = api.get("/api/v1/namespaces/a/policy").await;
    assert_eq!(
        (a["http"].clone(), a["shell"].clone()),
        (json!(true), json!("agents"))
    );
    let (status, a) = api
        .call(
            Method::DELETE,
            "/api/v1/namespaces/a/policy",
            "application/json",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(
        (a["http"].clone(), a["shell"].clone()),
        (json!(false), json!("server"))
    );
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            "namespace: c\njobs:\n  - { name: j, tasks: [{ id: t, http: { url: 'https://example.com/' } }] }\n",
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = api
        .call(
            Method::PUT,
            "/api/v1/admin/policy",
            "application/json",
            "{}",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // Another namespace keeps the default policy.
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            "namespace: b\njobs:\n  - { name: j, tasks: [{ id: t, shell: 'true' }] }\n",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Quotas per namespace, set by an instance admin: a file past the jobs or
/// schedules quota is refused (400, with the path), a trigger past the
/// rate or the unfinished runs gets 429; each refusal is counted; another
/// namespace is not limited.
#[tokio::test]
async fn quotas_refuse_what_would_pass_them() {
    let api = api().await;
    let put = |body: &'static str| {
        let api = &api;
        async move {
            api.call(
                Method::PUT,
                "/api/v1/namespaces/a/quotas",
                "application/json",
                body,
            )
            .await
        }
    };
    let (status, body) =
        put(r#"{"max_jobs": 2, "max_schedules_per_job": 1, "max_active_runs": 1}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, read) = api.get("/api/v1/namespaces/a/quotas").await;
    assert_eq!(read["max_jobs"], 2);
    for bad in [
        r#"{"max_jobs": 0}"#,
        r#"{"max_jobs": -1}"#,
        r#"{"max_triggers_per_second": 100000}"#,
        r#"{"nope": 1}"#,
    ] {
        let (status, _) = put(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (status, _) = api.get("/api/v1/namespaces/a/quotas").await;
    assert_eq!(status, StatusCode::OK, "a refused change changed nothing");
    let apply = |file: String| {
        let api = &api;
        async move {
            api.call(Method::POST, "/api/v1/apply", "application/yaml", &file)
                .await
        }
    };
    let two = "namespace: a\njobs:\n  - { name: slow, tasks: [{ id: t, shell: 'sleep 30' }] }\n  - { name: j2, schedule: '0 * * * *', tasks: [{ id: t, noop: true }] }\n";
    assert_eq!(apply(two.into()).await.0, StatusCode::OK);
    let (status, body) = apply(format!(
        "{two}  - {{ name: j3, tasks: [{{ id: t, noop: true }}] }}\n"
    ))
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded");
    assert_eq!(body["error"]["details"][0]["path"], "jobs");
    let (status, body) = apply("namespace: a\njobs:\n  - { name: j2, schedule: ['0 * * * *', '30 * * * *'], tasks: [{ id: t, noop: true }] }\n".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["details"][0]["path"], "jobs[0].schedule");
    // The stored jobs are the same two: the same file again is accepted.
    assert_eq!(apply(two.into()).await.0, StatusCode::OK);
    // One unfinished run at most.
    let (status, run) = api
        .post("/api/v1/namespaces/a/jobs/slow/trigger", "{}")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let (status, body) = api
        .post("/api/v1/namespaces/a/jobs/slow/trigger", "{}")
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unfinished")
    );
    let (status, _) = api
        .post(&format!("/api/v1/runs/{}/cancel", run["id"]), "")
        .await;
    assert_eq!(status, StatusCode::OK);
    api.wait_run(&run["id"]).await;
    // One trigger a second.
    let (status, _) = put(r#"{"max_triggers_per_second": 1}"#).await;
    assert_eq!(status, StatusCode::OK);
    let (first, _) = api.post("/api/v1/namespaces/a/jobs/j2/trigger", "{}").await;
    let (second, body) = api.post("/api/v1/namespaces/a/jobs/j2/trigger", "{}").await;
    assert_eq!(
        (first, second),
        (StatusCode::CREATED, StatusCode::TOO_MANY_REQUESTS),
        "{body}"
    );
    // Another namespace has no quota.
    let other = "namespace: b\njobs:\n  - { name: x, schedule: ['0 * * * *', '30 * * * *'], tasks: [{ id: t, noop: true }] }\n";
    assert_eq!(apply(other.into()).await.0, StatusCode::OK);
    // Cleared: no limit.
    let (status, _) = put("{}").await;
    assert_eq!(status, StatusCode::OK);
    assert!(api.store.get_setting("quotas/a").await.unwrap().is_none());
}

/// Old history written straight into the store: runs 1 to 5 of `a/j`
/// fired and succeeded on 2020-01-01 to 05 (run 1 with an attempt and its
/// log), run 6 still running from 2020-01-06, and ledger rows without a
/// run on 2019-12-30, 2019-12-31 and 2020-01-07 (the job's newest fire).
async fn old_history(store: &SqliteStore) {
    use dagcron_core::{AttemptState, FireOutcome, RunState};
    use dagcron_store::{NewRun, Trigger, Write};
    let day = |d: &str| -> jiff::Timestamp { format!("{d}T00:00:00Z").parse().unwrap() };
    let run = |id: i64, at: jiff::Timestamp| NewRun {
        items: Default::default(),
        carried_outputs: Default::default(),
        id,
        namespace: "a".into(),
        job: "j".into(),
        job_version: 1,
        trigger: Trigger::Schedule,
        scheduled_at: at,
        params: Default::default(),
        state: RunState::Running,
        tasks: vec!["t".into()],
        created_at: at,
        trace: None,
        rerun_of: None,
        carried: Default::default(),
        key: None,
    };
    let fire = |at: jiff::Timestamp, run: Option<NewRun>| Write::Fire {
        namespace: "a".into(),
        job: "j".into(),
        scheduled_at: at,
        outcome: if run.is_some() {
            FireOutcome::Fired
        } else {
            FireOutcome::SkippedOverlap
        },
        calendar: None,
        run,
    };
    let mut batch = vec![fire(day("2019-12-30"), None), fire(day("2019-12-31"), None)];
    for id in 1..=6 {
        let at = day(&format!("2020-01-0{id}"));
        batch.push(fire(at, Some(run(id, at))));
    }
    batch.push(fire(day("2020-01-07"), None));
    let at = day("2020-01-01");
    batch.push(Write::AttemptStart {
        priority: Default::default(),
        run: 1,
        task: "t".into(),
        number: 1,
        state: AttemptState::Running,
        at,
        run_on: None,
    });
    batch.push(Write::AttemptEnd {
        outputs: Default::default(),
        run: 1,
        task: "t".into(),
        number: 1,
        from: AttemptState::Running,
        to: AttemptState::Succeeded,
        at,
        exit_code: Some(0),
        error: None,
        log: b"old output".to_vec(),
        lines: Vec::new(),
        start_error_us: None,
        for_other_node: false,
    });
    for id in 1..=5 {
        batch.push(Write::RunState {
            run: id,
            from: RunState::Running,
            to: RunState::Succeeded,
            at: day(&format!("2020-01-0{id}")),
        });
    }
    for r in store.write(&batch).await.unwrap() {
        assert!(matches!(r, dagcron_store::WriteResult::Done), "{r:?}");
    }
}

/// A namespace's retention through the API: read (the default), refused
/// when out of bounds (and nothing changes), set; a dry run counts what a
/// pass would delete and deletes nothing; the pass deletes exactly that
/// (old finished runs beyond the newest kept, their attempts, logs and
/// ledger rows, old ledger rows without a run) and keeps the unfinished
/// run, the newest runs and the job's newest fire; a second pass finds
/// nothing.
#[tokio::test]
async fn retention_prunes_old_history_by_the_namespace_s_policy() {
    let api = api().await;
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            "namespace: a\njobs:\n  - { name: j, tasks: [{ id: t, noop: true }] }\n",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    old_history(&api.store).await;
    let put = |body: &'static str| {
        api.call(
            Method::PUT,
            "/api/v1/namespaces/a/retention",
            "application/json",
            body,
        )
    };
    let (status, policy) = api.get("/api/v1/namespaces/a/retention").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        policy,
        json!({"max_age_seconds": 2_592_000, "keep_last": 100, "default": true})
    );
    for bad in [
        r#"{"max_age_seconds": 60, "keep_last": 2}"#,
        r#"{"max_age_seconds": 86400}"#,
        r#"{"max_age_seconds": 86400, "keep_last": 2000000}"#,
        r#"{"max_age_seconds": -1, "keep_last": 2}"#,
        r#"{"max_age_seconds": 86400, "keep_last": 2, "extra": 1}"#,
        r#"[86400, 2]"#,
        "not json",
    ] {
        let (status, body) = put(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
    }
    let (status, _) = api
        .call(
            Method::PUT,
            "/api/v1/namespaces/Not%20a%20name/retention",
            "application/json",
            r#"{"max_age_seconds": 86400, "keep_last": 2}"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        api.get("/api/v1/namespaces/a/retention").await.1["default"],
        true
    );
    let (status, policy) = put(r#"{"max_age_seconds": 86400, "keep_last": 2}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        policy,
        json!({"max_age_seconds": 86400, "keep_last": 2, "default": false})
    );
    for bad in [
        r#"{"dry_run": "yes"}"#,
        r#"{"namespace": "Bad name"}"#,
        "[]",
    ] {
        let (status, body) = api.post("/api/v1/admin/prune", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }

    let expected = json!([{"namespace": "a", "runs": 4, "attempts": 1, "fires": 6, "jobs": 0}]);
    let (status, dry) = api
        .post(
            "/api/v1/admin/prune",
            r#"{"dry_run": true, "namespace": "a"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["namespaces"], expected);
    let runs = |page: Value| -> Vec<i64> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_i64().unwrap())
            .collect()
    };
    let (_, page) = api.get("/api/v1/namespaces/a/jobs/j/runs?limit=100").await;
    assert_eq!(runs(page), [6, 5, 4, 3, 2, 1], "a dry run deletes nothing");
    let (status, _) = api.get("/api/v1/runs/1/tasks/t/attempts/1/log").await;
    assert_eq!(status, StatusCode::OK);

    let (status, done) = api.post("/api/v1/admin/prune", "").await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["dry_run"], false);
    assert_eq!(done["namespaces"], expected, "what the dry run said");
    let (_, page) = api.get("/api/v1/namespaces/a/jobs/j/runs?limit=100").await;
    assert_eq!(runs(page), [6, 5]);
    let (status, _) = api.get("/api/v1/runs/1").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api.get("/api/v1/runs/1/tasks/t/attempts/1/log").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let ledger: Vec<String> = api
        .store
        .list_fires(
            "a",
            "j",
            jiff::Timestamp::UNIX_EPOCH,
            jiff::Timestamp::now(),
            100,
        )
        .await
        .unwrap()
        .iter()
        .map(|f| f.scheduled_at.to_string())
        .collect();
    assert_eq!(
        ledger,
        [
            "2020-01-05T00:00:00Z",
            "2020-01-06T00:00:00Z",
            "2020-01-07T00:00:00Z"
        ]
    );
    // Recovery resumes from the newest fire, which stayed.
    assert_eq!(
        api.store
            .last_fires_of(&[("a".into(), "j".into())])
            .await
            .unwrap(),
        [Some("2020-01-07T00:00:00Z".parse().unwrap())]
    );
    let (_, again) = api
        .post("/api/v1/admin/prune", r#"{"namespace": "a"}"#)
        .await;
    assert_eq!(again["namespaces"], json!([]));
    // Back to the default: {} clears the setting.
    let (status, policy) = put("{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(policy["default"], true);
    assert!(
        api.store
            .get_setting("retention/a")
            .await
            .unwrap()
            .is_none()
    );
}

/// The outbox of a namespace: listed newest first to its viewers, one
/// notification with its attempts, another namespace's absent, bad
/// parameters refused in the JSON error shape.
#[tokio::test]
async fn notifications_are_listed_to_their_namespace_only() {
    let api = api().await;
    let file = r#"
namespace: team
notifiers:
  - name: oncall
    webhook: { url: "https://hooks.example.com/x", secret: { secret: hook-key } }
jobs:
  - name: bad
    notify: [{ on: [failed], to: [oncall] }]
    tasks: [{ id: a, shell: "exit 3" }]
"#;
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, run) = api
        .post("/api/v1/namespaces/team/jobs/bad/trigger", "{}")
        .await;
    let id = &run["id"];
    assert_eq!(api.wait_run(id).await["state"], "failed");
    let viewer = api.token_with(Role::Viewer, Some("team")).await;
    let (status, page) = api
        .call_as(
            Some(&viewer),
            Method::GET,
            "/api/v1/namespaces/team/notifications",
            "",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    let n = &items[0];
    assert_eq!(n["key"], format!("team/bad/run-{id}/failed/oncall"));
    assert_eq!(
        (
            &n["job"],
            &n["event"],
            &n["notifier"],
            &n["channel"],
            &n["state"]
        ),
        (
            &json!("bad"),
            &json!("failed"),
            &json!("oncall"),
            &json!("webhook"),
            &json!("pending")
        )
    );
    assert_eq!(n["run"], *id);
    // No answer holds a secret's value or the body: the notifier is named.
    assert!(!page.to_string().contains("hook-key"), "{page}");
    let nid = n["id"].as_i64().unwrap();
    let (status, one) = api
        .call_as(
            Some(&viewer),
            Method::GET,
            &format!("/api/v1/namespaces/team/notifications/{nid}"),
            "",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["deliveries"], json!([]));
    let (_, failed) = api
        .get("/api/v1/namespaces/team/notifications?failed=true")
        .await;
    assert_eq!(failed["items"], json!([]));
    // Another namespace's viewer: absent, as its jobs are.
    let other = api.token_with(Role::Viewer, Some("else")).await;
    for uri in [
        "/api/v1/namespaces/team/notifications".to_string(),
        format!("/api/v1/namespaces/team/notifications/{nid}"),
    ] {
        let (status, body) = api.call_as(Some(&other), Method::GET, &uri, "", "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {body}");
    }
    // Its id in another namespace's path: absent too.
    let (status, _) = api
        .get(&format!("/api/v1/namespaces/else/notifications/{nid}"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for uri in [
        "/api/v1/namespaces/team/notifications?limit=0",
        "/api/v1/namespaces/team/notifications?limit=100000",
        "/api/v1/namespaces/team/notifications?before=-1",
        "/api/v1/namespaces/team/notifications?failed=maybe",
        "/api/v1/namespaces/team/notifications/abc",
        "/api/v1/namespaces/team/notifications/0",
        "/api/v1/namespaces/team/notifications/9223372036854775807",
    ] {
        let (status, body) = api.get(uri).await;
        assert!(status.is_client_error(), "{uri}: {status} {body}");
        assert!(body["error"]["message"].is_string(), "{uri}: {body}");
    }
}

/// Sends a webhook delivery with these headers (no API token).
async fn deliver(
    api: &Api,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(Method::POST).uri(uri);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = api
        .app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let retry = resp.headers().get("retry-after").cloned();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let mut value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if let Some(retry) = retry {
        value["retry_after"] = json!(retry.to_str().unwrap());
    }
    (status, value)
}

/// `sha256=` and the hex HMAC-SHA-256 of `body` under `key`.
fn hub_signature(key: &str, body: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// A job's webhook, attacked: no signature, a wrong one, one made with
/// another namespace's secret of the same name, a replayed delivery id,
/// a body too large, a job that takes no deliveries, an unknown job, a
/// flood past its allowance. Each refusal is in the JSON error shape,
/// makes no run and is audited; a good delivery makes one run with the
/// parameters mapped from its body, and GitHub's headers are accepted.
#[tokio::test]
async fn a_webhook_takes_signed_deliveries_once_and_refuses_the_rest() {
    let api = api().await;
    let file = r#"
namespace: a
jobs:
  - name: build
    params: { branch: none }
    webhook:
      secret: { secret: hook-key }
      params: { branch: "$.ref", repo: "$.repository.full_name" }
      max_per_minute: 5
    tasks: [{ id: t, noop: true }]
  - name: plain
    tasks: [{ id: t, noop: true }]
---
"#;
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/apply",
            "application/yaml",
            file.trim_end_matches("---\n"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml",
            "namespace: b\njobs:\n  - { name: build, webhook: { secret: { secret: hook-key } }, tasks: [{ id: t, noop: true }] }\n")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (ns, value) in [("a", "right-key"), ("b", "b-key")] {
        let (status, body) = api
            .call(
                Method::PUT,
                &format!("/api/v1/namespaces/{ns}/secrets/hook-key"),
                "application/json",
                &json!({ "value": value }).to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let hook = "/api/v1/hooks/a/build";
    let payload = r#"{"ref": "refs/heads/main", "repository": {"full_name": "acme/app"}}"#;
    let good = hub_signature("right-key", payload);
    let runs = async || {
        api.get("/api/v1/namespaces/a/jobs/build/runs").await.1["items"]
            .as_array()
            .unwrap()
            .len()
    };
    // Refused: no signature, a wrong one, b's secret, a malformed header.
    for signature in [
        None,
        Some(hub_signature("wrong", payload)),
        Some(hub_signature("b-key", payload)),
        Some("sha256=zz".into()),
    ] {
        let mut headers = vec![("x-github-delivery", "d-0")];
        if let Some(s) = &signature {
            headers.push(("x-hub-signature-256", s.as_str()));
        }
        let (status, body) = deliver(&api, hook, &headers, payload).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{signature:?}: {body}");
        assert_eq!(body["error"]["code"], "bad_signature");
        assert!(!body.to_string().contains("right-key"));
    }
    // The signature of another body.
    let (status, _) = deliver(&api, hook, &[("x-hub-signature-256", &good)], "{}").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(runs().await, 0, "no refused delivery made a run");
    // Taken, GitHub's way; the same delivery again makes no second run.
    let headers = [
        ("x-hub-signature-256", good.as_str()),
        ("x-github-delivery", "d-1"),
    ];
    let (status, first) = deliver(&api, hook, &headers, payload).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    assert_eq!(first["duplicate"], false);
    let (status, again) = deliver(&api, hook, &headers, payload).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        (&again["run"], &again["duplicate"]),
        (&first["run"], &json!(true))
    );
    let run = api.wait_run(&first["run"]).await;
    assert_eq!(run["trigger"], "webhook");
    assert_eq!(run["params"]["branch"], "refs/heads/main");
    assert_eq!(run["params"]["repo"], "acme/app");
    // dagcron's own headers, no delivery id: each delivery is a run.
    let own = [("x-dagcron-signature-256", good.as_str())];
    assert_eq!(
        deliver(&api, hook, &own, payload).await.0,
        StatusCode::ACCEPTED
    );
    assert_eq!(runs().await, 2);
    // Too large; not JSON while params are mapped; a bad delivery id.
    let huge = "x".repeat(70 * 1024);
    let (status, body) = deliver(
        &api,
        hook,
        &[(
            "x-dagcron-signature-256",
            &hub_signature("right-key", &huge),
        )],
        &huge,
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let (status, body) = deliver(
        &api,
        hook,
        &[(
            "x-dagcron-signature-256",
            &hub_signature("right-key", "nope"),
        )],
        "nope",
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = deliver(
        &api,
        hook,
        &[
            ("x-dagcron-signature-256", &good),
            ("x-dagcron-delivery", "a b"),
        ],
        payload,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A job that takes no deliveries, and one that does not exist, look alike.
    let (s1, b1) = deliver(&api, "/api/v1/hooks/a/plain", &own, payload).await;
    let (s2, b2) = deliver(&api, "/api/v1/hooks/a/nothing", &own, payload).await;
    assert_eq!(
        (s1, s2),
        (StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED)
    );
    assert_eq!(b1, b2, "the same answer");
    assert_eq!(runs().await, 2);
    // Five a minute: the flood is refused with when to come back.
    let mut limited = None;
    for i in 0..10 {
        let (status, body) = deliver(&api, hook, &own, payload).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some((i, body));
            break;
        }
    }
    let (_, body) = limited.expect("the allowance ran out");
    assert_eq!(body["error"]["code"], "rate_limited");
    assert!(
        body["retry_after"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    // Every delivery is in the audit log, refused or taken, with no principal.
    let (_, audit) = api.get("/api/v1/audit?limit=500").await;
    let hooks: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["action"]
                .as_str()
                .unwrap()
                .starts_with("POST /api/v1/hooks/")
        })
        .collect();
    assert!(hooks.len() >= 14, "{hooks:?}");
    assert!(hooks.iter().any(|e| e["outcome"] == 401));
    assert!(hooks.iter().any(|e| e["outcome"] == 202));
    assert!(hooks.iter().all(|e| e["principal"].is_null()));
}

/// The runs browser lists runs of every job the token may read, newest
/// first, filtered: a namespace's token reads its own runs only, another
/// namespace's look empty, and bad filters are refused in the JSON error
/// shape.
#[tokio::test]
async fn the_runs_browser_lists_what_the_token_may_read() {
    let api = api().await;
    for ns in ["a", "b"] {
        let file = format!(
            "namespace: {ns}\njobs:\n  - {{ name: ok, tasks: [{{ id: t, noop: true }}] }}\n  - {{ name: bad, tasks: [{{ id: t, shell: \"exit 3\" }}] }}\n"
        );
        let (status, body) = api
            .call(Method::POST, "/api/v1/apply", "application/yaml", &file)
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let mut made = Vec::new();
    for (ns, job) in [("a", "ok"), ("a", "bad"), ("b", "ok"), ("a", "ok")] {
        let (_, run) = api
            .post(&format!("/api/v1/namespaces/{ns}/jobs/{job}/trigger"), "{}")
            .await;
        api.wait_run(&run["id"]).await;
        made.push((run["id"].as_i64().unwrap(), ns, job));
    }
    let ids = |page: &Value| -> Vec<i64> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_i64().unwrap())
            .collect()
    };
    let newest_first = |pick: &dyn Fn(&str, &str) -> bool| -> Vec<i64> {
        made.iter()
            .rev()
            .filter(|(_, ns, job)| pick(ns, job))
            .map(|(id, _, _)| *id)
            .collect()
    };
    let (status, all) = api.get("/api/v1/runs").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(ids(&all), newest_first(&|_, _| true));
    let (_, failed) = api.get("/api/v1/runs?state=failed,cancelled").await;
    assert_eq!(ids(&failed), newest_first(&|_, job| job == "bad"));
    let (_, page) = api.get("/api/v1/runs?namespace=a&job=ok&limit=1").await;
    assert_eq!(
        ids(&page),
        newest_first(&|ns, job| ns == "a" && job == "ok")[..1]
    );
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    let (_, next) = api
        .get(&format!(
            "/api/v1/runs?namespace=a&job=ok&limit=1&cursor={cursor}"
        ))
        .await;
    assert_eq!(
        ids(&next),
        newest_first(&|ns, job| ns == "a" && job == "ok")[1..]
    );
    let (_, manual) = api
        .get("/api/v1/runs?trigger=manual&since=2000-01-01T00:00:00Z")
        .await;
    assert_eq!(ids(&manual), newest_first(&|_, _| true));
    let (_, none) = api.get("/api/v1/runs?until=2000-01-01T00:00:00Z").await;
    assert_eq!(ids(&none), Vec::<i64>::new());

    // A namespace's viewer: its own runs, and another namespace looks empty.
    let viewer = api.token_with(Role::Viewer, Some("b")).await;
    for (uri, want) in [
        ("/api/v1/runs", newest_first(&|ns, _| ns == "b")),
        ("/api/v1/runs?namespace=a", vec![]),
    ] {
        let (status, page) = api.call_as(Some(&viewer), Method::GET, uri, "", "").await;
        assert_eq!(status, StatusCode::OK, "{uri}: {page}");
        assert_eq!(ids(&page), want, "{uri}");
    }
    // Bad filters: each a 400 naming what is wrong.
    for (uri, says) in [
        ("/api/v1/runs?state=done", "unknown run state"),
        ("/api/v1/runs?trigger=cron", "unknown trigger"),
        ("/api/v1/runs?limit=0", "limit"),
        ("/api/v1/runs?cursor=run:x", "cursor"),
        (
            "/api/v1/runs?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
            "before until",
        ),
        ("/api/v1/runs?since=yesterday", "since"),
    ] {
        let (status, body) = api.get(uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{uri}: {body}");
    }
}

/// An attempt's log line by line: each line with when it was written and
/// whether to stdout or stderr, and as a file to save.
#[tokio::test]
async fn a_log_is_read_line_by_line_with_its_streams_and_downloaded() {
    let api = api().await;
    let file = "namespace: a\njobs:\n  - { name: talk, tasks: [{ id: t, shell: 'echo out one; echo err one >&2; sleep 0.1; echo out two' }] }\n";
    let (status, body) = api
        .call(Method::POST, "/api/v1/apply", "application/yaml", file)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, run) = api
        .post("/api/v1/namespaces/a/jobs/talk/trigger", "{}")
        .await;
    let id = &run["id"];
    assert_eq!(api.wait_run(id).await["state"], "succeeded");
    let (status, lines) = api
        .get(&format!(
            "/api/v1/runs/{id}/tasks/t/attempts/1/log?lines=true"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{lines}");
    assert_eq!(lines["complete"], true);
    let seen: Vec<(String, String)> = lines["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert!(l["at"].as_str().is_some(), "{l}");
            (
                l["stream"].as_str().unwrap().to_string(),
                l["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            ("stderr".to_string(), "err one".to_string()),
            ("stdout".to_string(), "out one".to_string()),
            ("stdout".to_string(), "out two".to_string()),
        ],
        "{seen:?}"
    );
    assert_eq!(seen.last().unwrap().1, "out two");
    let resp = api
        .raw(
            Method::GET,
            &format!("/api/v1/runs/{id}/tasks/t/attempts/1/log?download=true"),
        )
        .await;
    assert_eq!(
        resp.headers()["content-disposition"],
        format!("attachment; filename=\"run-{id}-t-1.log\"")
    );
}
