//! The API through its router, without a socket, on a real SQLite store and engine.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use dagcron_api::{AppState, router};
use dagcron_runtime::{Engine, EngineConfig, SystemClock};
use dagcron_store_sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

struct Api {
    app: axum::Router,
    _dir: tempfile::TempDir,
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
    Api {
        app: router(AppState {
            cluster: None,
            workers: None,
            store,
            engine: handle,
            max_body_bytes: 64 << 10,
        }),
        _dir: dir,
        _shutdown: shutdown.drop_guard(),
    }
}

impl Api {
    async fn call(
        &self,
        method: Method,
        uri: &str,
        content_type: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
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
            .replace("{n}", "1");
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
