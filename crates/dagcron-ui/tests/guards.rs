//! The UI's guards over plain HTTP (no browser), through the router on a
//! real SQLite store and engine: no session, no page; a viewer's action is
//! refused by the API's own authorization; a form without the session's
//! CSRF token is refused; another namespace's objects are not shown.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use dagcron_api::{AppState, router};
use dagcron_core::authz::{Grant, Role};
use dagcron_runtime::{Engine, EngineConfig, SystemClock};
use dagcron_store::prelude::*;
use dagcron_store_sqlite::SqliteStore;
use http_body_util::BodyExt;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

struct Ui {
    app: axum::Router,
    store: Arc<SqliteStore>,
    keyring: dagcron_api::auth::Keyring,
    _dir: tempfile::TempDir,
    _stop: tokio_util::sync::DropGuard,
}

async fn ui() -> Ui {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("db")).await.unwrap());
    let (engine, handle) = Engine::start(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(engine.run(stop.clone(), Duration::from_secs(1)));
    let keyring = dagcron_api::auth::Keyring::from_bytes([7; 32]);
    let state = AppState {
        cluster: None,
        workers: None,
        store: store.clone(),
        engine: handle,
        max_body_bytes: 64 << 10,
        keyring: Arc::new(keyring.clone()),
        master_key: None,
        metrics: None,
        quota: Default::default(),
        pruned: Default::default(),
    };
    let app = dagcron_ui::with_ui(state.clone(), router(state));
    Ui {
        app,
        store,
        keyring,
        _dir: dir,
        _stop: stop.drop_guard(),
    }
}

struct Answer {
    status: StatusCode,
    location: String,
    cookies: Vec<String>,
    body: String,
}

impl Ui {
    async fn token(&self, role: Role, namespace: Option<&str>) -> String {
        let grant = Grant {
            role,
            namespace: namespace.map(Into::into),
        };
        let (record, secret) = dagcron_api::auth::new_token(
            &format!("{role}"),
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

    async fn send(
        &self,
        method: Method,
        uri: &str,
        cookie: &str,
        form: &str,
        bearer: Option<&str>,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(uri);
        if !cookie.is_empty() {
            req = req.header(header::COOKIE, cookie);
        }
        if let Some(t) = bearer {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            req = req.header(header::CONTENT_TYPE, "application/yaml");
        } else {
            req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let resp = self
            .app
            .clone()
            .oneshot(req.body(Body::from(form.to_string())).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let location = resp
            .headers()
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let cookies = resp
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            location,
            cookies,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// Signs in with `token`; returns the session's cookie and CSRF token.
    async fn sign_in(&self, token: &str) -> (String, String) {
        let form = self.send(Method::GET, "/", "", "", None).await;
        let pre = form.cookies[0].split(';').next().unwrap().to_string();
        let csrf = csrf_of(&form.body);
        let a = self
            .send(
                Method::POST,
                "/signin",
                &pre,
                &format!("csrf={csrf}&token={token}"),
                None,
            )
            .await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
        let session = a
            .cookies
            .iter()
            .find(|c| c.starts_with("dagcron_session="))
            .unwrap();
        assert!(
            session.contains("HttpOnly") && session.contains("SameSite=Strict"),
            "{session}"
        );
        let cookie = session.split(';').next().unwrap().to_string();
        let page = self.send(Method::GET, "/", &cookie, "", None).await;
        (cookie, csrf_of(&page.body))
    }

    async fn apply(&self, admin: &str, ns: &str) {
        let file = format!(
            "namespace: {ns}\njobs:\n  - {{ name: j, tasks: [{{ id: t, noop: true }}] }}\n"
        );
        let a = self
            .send(Method::POST, "/api/v1/apply", "", &file, Some(admin))
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    }
}

fn csrf_of(html: &str) -> String {
    let at = html
        .find(r#"name="csrf" value=""#)
        .expect("a form with a CSRF token")
        + 19;
    html[at..at + 64].to_string()
}

/// The UI's routes, with a value for each parameter.
const PAGES: &[&str] = &[
    "/jobs",
    "/jobs?ns=a",
    "/runs",
    "/runs?state=failed",
    "/preferences",
    "/jobs/a/j",
    "/runs/1",
    "/runs/1/tasks/t/attempts/1/log",
    "/playground",
    "/playground?expr=*+*+*+*+*&tz=UTC",
    "/cluster",
    "/audit",
    "/notifications/a",
];
const ACTIONS: &[&str] = &[
    "/signout",
    "/jobs/a/j/trigger",
    "/jobs/a/j/pause",
    "/jobs/a/j/resume",
    "/jobs/a/j/backfill",
    "/runs/1/cancel",
    "/runs/1/rerun",
    "/runs/1/tasks/t/retry",
    "/preferences",
];

#[tokio::test]
async fn without_a_session_every_page_sends_to_the_sign_in_form_and_nothing_changes() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    ui.apply(&admin, "a").await;
    let home = ui.send(Method::GET, "/", "", "", None).await;
    assert_eq!(home.status, StatusCode::OK);
    assert!(home.body.contains(r#"action="/signin""#));
    assert!(home.cookies[0].contains("HttpOnly; SameSite=Strict"));
    for cookie in ["", "dagcron_session=forged"] {
        for page in PAGES {
            let a = ui.send(Method::GET, page, cookie, "", None).await;
            assert_eq!(
                (a.status, a.location.as_str()),
                (StatusCode::SEE_OTHER, "/"),
                "{page}"
            );
        }
        for action in ACTIONS {
            let a = ui.send(Method::POST, action, cookie, "csrf=x", None).await;
            assert_eq!(
                (a.status, a.location.as_str()),
                (StatusCode::SEE_OTHER, "/"),
                "{action}"
            );
        }
    }
    let job = ui.store.get_job("a", "j").await.unwrap().unwrap();
    assert!(!job.paused);
    // The API and the assets are where they were.
    let api = ui
        .send(Method::GET, "/api/v1/namespaces/a/jobs", "", "", None)
        .await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);
    assert!(api.body.contains(r#""code":"unauthenticated""#));
    assert_eq!(
        ui.send(Method::GET, "/healthz", "", "", None).await.status,
        StatusCode::OK
    );
    let js = ui
        .send(Method::GET, "/assets/htmx.min.js", "", "", None)
        .await;
    assert_eq!(js.status, StatusCode::OK);
    assert!(js.body.contains("htmx"));
    // A sign-in form not sent by this site's page is refused.
    let a = ui
        .send(
            Method::POST,
            "/signin",
            "",
            &format!("csrf=x&token={admin}"),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert!(a.cookies.iter().all(|c| !c.starts_with("dagcron_session=")));
}

#[tokio::test]
async fn a_viewer_is_offered_no_action_and_its_posted_actions_are_refused() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    ui.apply(&admin, "a").await;
    let viewer = ui.token(Role::Viewer, None).await;
    let (cookie, csrf) = ui.sign_in(&viewer).await;
    let page = ui.send(Method::GET, "/jobs/a/j", &cookie, "", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("<svg"), "the DAG is drawn");
    assert!(
        !page.body.contains(r#"method="post" action="/jobs"#),
        "no action form"
    );
    // A task action of a viewer: refused before it reaches the run.
    let a = ui
        .send(
            Method::POST,
            "/runs/1/tasks/t/retry",
            &cookie,
            &format!("csrf={csrf}"),
            None,
        )
        .await;
    assert!(
        [StatusCode::FORBIDDEN, StatusCode::NOT_FOUND].contains(&a.status),
        "{}",
        a.body
    );
    // Preferences are the viewer's own: a bad value is refused in the page.
    let a = ui
        .send(
            Method::POST,
            "/preferences",
            &cookie,
            &format!("csrf={csrf}&theme=%22%3E%3Cscript%3E&zone="),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert!(!a.body.contains("<script>"), "{}", a.body);
    let a = ui
        .send(
            Method::POST,
            "/preferences",
            &cookie,
            &format!("csrf={csrf}&theme=dark&zone=Mars%2FOlympus%0D%0ASet-Cookie%3A+x%3D1"),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert!(a.cookies.is_empty(), "{:?}", a.cookies);
    for action in ["pause", "trigger"] {
        let a = ui
            .send(
                Method::POST,
                &format!("/jobs/a/j/{action}"),
                &cookie,
                &format!("csrf={csrf}"),
                None,
            )
            .await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{action}: {}", a.body);
        assert!(a.body.contains("needs the operator role"), "{}", a.body);
    }
    assert!(!ui.store.get_job("a", "j").await.unwrap().unwrap().paused);
    let runs = ui.store.list_runs("a", "j", 10, None).await.unwrap();
    assert!(runs.items.is_empty());
    // The refusals are in the audit log, as any refused call of the API.
    let log = ui.store.list_audit(0, 100, None).await.unwrap();
    assert!(
        log.iter()
            .any(|e| e.action == "POST /api/v1/namespaces/a/jobs/j/pause" && e.outcome == 403)
    );
    // An operator's pause goes through.
    let op = ui.token(Role::Operator, None).await;
    let (cookie, csrf) = ui.sign_in(&op).await;
    let page = ui.send(Method::GET, "/jobs/a/j", &cookie, "", None).await;
    assert!(page.body.contains(r#"id="pause""#));
    let a = ui
        .send(
            Method::POST,
            "/jobs/a/j/pause",
            &cookie,
            &format!("csrf={csrf}"),
            None,
        )
        .await;
    assert_eq!(
        (a.status, a.location.as_str()),
        (StatusCode::SEE_OTHER, "/jobs/a/j")
    );
    assert!(ui.store.get_job("a", "j").await.unwrap().unwrap().paused);
}

#[tokio::test]
async fn a_form_without_the_sessions_csrf_token_is_refused() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    ui.apply(&admin, "a").await;
    let (cookie, csrf) = ui.sign_in(&admin).await;
    for form in [
        "",
        "csrf=",
        "csrf=0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        let a = ui
            .send(Method::POST, "/jobs/a/j/pause", &cookie, form, None)
            .await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{form:?}");
        assert!(a.body.contains("CSRF"));
    }
    assert!(!ui.store.get_job("a", "j").await.unwrap().unwrap().paused);
    // Another session's token is not this session's.
    let (other, _) = ui.sign_in(&admin).await;
    let a = ui
        .send(
            Method::POST,
            "/jobs/a/j/pause",
            &other,
            &format!("csrf={csrf}"),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    // Signing out needs it too, and then the session is gone.
    let a = ui.send(Method::POST, "/signout", &cookie, "", None).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let a = ui
        .send(
            Method::POST,
            "/signout",
            &cookie,
            &format!("csrf={csrf}"),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    let a = ui.send(Method::GET, "/jobs/a/j", &cookie, "", None).await;
    assert_eq!(
        (a.status, a.location.as_str()),
        (StatusCode::SEE_OTHER, "/")
    );
}

#[tokio::test]
async fn another_namespaces_jobs_and_runs_are_not_shown() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    ui.apply(&admin, "a").await;
    ui.apply(&admin, "b").await;
    let trigger = ui
        .send(
            Method::POST,
            "/api/v1/namespaces/b/jobs/j/trigger",
            "",
            "",
            Some(&admin),
        )
        .await;
    assert_eq!(trigger.status, StatusCode::CREATED, "{}", trigger.body);
    let run: serde_json::Value = serde_json::from_str(&trigger.body).unwrap();
    let run = run["id"].as_i64().unwrap();
    let scoped = ui.token(Role::Admin, Some("a")).await;
    let (cookie, csrf) = ui.sign_in(&scoped).await;
    // An action on another namespace's run is refused as if it did not
    // exist, and changes nothing.
    for action in ["retry", "mark_succeeded", "fail"] {
        let a = ui
            .send(
                Method::POST,
                &format!("/runs/{run}/tasks/t/{action}"),
                &cookie,
                &format!("csrf={csrf}"),
                None,
            )
            .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{action}: {}", a.body);
        assert!(!a.body.contains("\"b\""));
    }
    let overview = ui.send(Method::GET, "/", &cookie, "", None).await;
    assert!(overview.body.contains(r#"id="ns-a""#), "{}", overview.body);
    let other = ui.send(Method::GET, "/?ns=b", &cookie, "", None).await;
    for page in [&overview, &other] {
        assert_eq!(page.status, StatusCode::OK);
        assert!(!page.body.contains(r#"id="ns-b""#) && !page.body.contains("/jobs/b/"));
    }
    // The runs browser: its namespace's runs (none), whatever it asks for.
    for path in ["/runs", "/runs?ns=b", "/runs?ns=&state=running"] {
        let runs = ui.send(Method::GET, path, &cookie, "", None).await;
        assert_eq!(runs.status, StatusCode::OK, "{path}");
        assert!(
            runs.body.contains(r#"id="no-runs""#),
            "{path}: {}",
            runs.body
        );
        assert!(!runs.body.contains(&format!("/runs/{run}\"")), "{path}");
    }
    let home = ui.send(Method::GET, "/jobs", &cookie, "", None).await;
    assert!(home.body.contains("/jobs/a/j"));
    assert!(
        !home.body.contains("/jobs/b/"),
        "only its namespace is offered"
    );
    let other = ui.send(Method::GET, "/jobs?ns=b", &cookie, "", None).await;
    assert_eq!(other.status, StatusCode::OK);
    assert!(
        !other.body.contains("/jobs/b/j"),
        "another namespace lists as empty"
    );
    for page in [
        "/jobs/b/j".to_string(),
        format!("/runs/{run}"),
        format!("/runs/{run}/tasks/t/attempts/1/log"),
        "/notifications/b".to_string(),
    ] {
        let a = ui.send(Method::GET, &page, &cookie, "", None).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{page}");
        assert!(!a.body.contains("\"b\""));
    }
    // The whole instance's audit log is not a namespace admin's.
    let audit = ui.send(Method::GET, "/audit", &cookie, "", None).await;
    assert_eq!(audit.status, StatusCode::OK);
    assert!(!audit.body.contains("/namespaces/b/"), "{}", audit.body);
    // The instance admin sees both.
    let (cookie, _) = ui.sign_in(&admin).await;
    let a = ui
        .send(Method::GET, &format!("/runs/{run}"), &cookie, "", None)
        .await;
    assert_eq!(a.status, StatusCode::OK);
    let runs = ui.send(Method::GET, "/runs", &cookie, "", None).await;
    assert!(
        runs.body.contains(&format!("/runs/{run}\"")),
        "{}",
        runs.body
    );
    let overview = ui.send(Method::GET, "/", &cookie, "", None).await;
    assert!(overview.body.contains(r#"id="ns-a""#) && overview.body.contains(r#"id="ns-b""#));
    let home = ui.send(Method::GET, "/jobs?ns=b", &cookie, "", None).await;
    assert!(home.body.contains("/jobs/b/j"));
    assert!(
        home.body.contains(r#"<option value="a""#) && home.body.contains(r#"<option value="b""#)
    );
}

/// While the instance is read-only every page says so, with the reason;
/// once it is off, no page does.
#[tokio::test]
async fn every_page_says_when_the_instance_is_read_only() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    ui.apply(&admin, "a").await;
    let (cookie, _) = ui.sign_in(&admin).await;
    let pages = [
        "/",
        "/jobs",
        "/runs",
        "/jobs/a/j",
        "/playground",
        "/cluster",
        "/audit",
    ];
    for page in pages {
        let a = ui.send(Method::GET, page, &cookie, "", None).await;
        assert!(!a.body.contains(r#"class="banner""#), "{page}");
    }
    let on = ui
        .send(
            Method::PUT,
            "/api/v1/admin/read-only",
            "",
            r#"{"read_only": true, "reason": "db upgrade"}"#,
            Some(&admin),
        )
        .await;
    assert!(on.status.is_success(), "{}", on.body);
    for page in pages {
        let a = ui.send(Method::GET, page, &cookie, "", None).await;
        assert_eq!(a.status, StatusCode::OK, "{page}");
        assert!(
            a.body
                .contains(r#"<p class="banner" role="status">This instance is read-only since "#)
                && a.body.contains(": db upgrade."),
            "{page}: {}",
            a.body
        );
    }
}

/// Cancel asks first (in a browser with scripts) and the run's page then
/// follows the run to its end, cancelled.
#[tokio::test]
async fn a_run_cancelled_from_its_page_ends_cancelled_there() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    let file = "namespace: a\njobs:\n  - { name: long, tasks: [{ id: t, shell: 'sleep 30' }] }\n";
    let a = ui
        .send(Method::POST, "/api/v1/apply", "", file, Some(&admin))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let run = ui
        .send(
            Method::POST,
            "/api/v1/namespaces/a/jobs/long/trigger",
            "",
            "{}",
            Some(&admin),
        )
        .await;
    let id = serde_json::from_str::<serde_json::Value>(&run.body).unwrap()["id"].clone();
    let (cookie, csrf) = ui.sign_in(&admin).await;
    let page = format!("/runs/{id}");
    let shown = ui.send(Method::GET, &page, &cookie, "", None).await;
    assert!(
        shown
            .body
            .contains(&format!(r#"data-confirm="Cancel run {id}?"#)),
        "{}",
        shown.body
    );
    let a = ui
        .send(
            Method::POST,
            &format!("/runs/{id}/cancel"),
            &cookie,
            &format!("csrf={csrf}"),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    dagcron_testkit::until_async("the run's page shows it cancelled", async || {
        let shown = ui.send(Method::GET, &page, &cookie, "", None).await;
        if shown.body.contains(r#"id="run-state">cancelled<"#) {
            Ok(())
        } else {
            Err(shown.body)
        }
    })
    .await;
}

/// A job's page shows its notification rules and leads to its namespace's
/// outbox, which lists what its runs made, and only those given up when
/// asked.
#[tokio::test]
async fn the_outbox_of_a_namespace_lists_its_notifications() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    let file = r#"
namespace: a
notifiers: [{ name: oncall, webhook: { url: "https://hooks.example.com/x" } }]
jobs:
  - name: bad
    notify: [{ on: [failed, recovered], to: [oncall] }]
    tasks: [{ id: t, shell: "exit 3" }]
"#;
    let a = ui
        .send(Method::POST, "/api/v1/apply", "", file, Some(&admin))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let run = ui
        .send(
            Method::POST,
            "/api/v1/namespaces/a/jobs/bad/trigger",
            "",
            "{}",
            Some(&admin),
        )
        .await;
    let id = serde_json::from_str::<serde_json::Value>(&run.body).unwrap()["id"].clone();
    let viewer = ui.token(Role::Viewer, Some("a")).await;
    let (cookie, _) = ui.sign_in(&viewer).await;
    let job = ui.send(Method::GET, "/jobs/a/bad", &cookie, "", None).await;
    assert!(
        job.body
            .contains("<td>failed, recovered</td><td>oncall (webhook)</td>"),
        "{}",
        job.body
    );
    assert!(job.body.contains(r#"href="/notifications/a" id="outbox""#));
    dagcron_testkit::until_async("the outbox lists the run's notification", async || {
        let page = ui
            .send(Method::GET, "/notifications/a", &cookie, "", None)
            .await;
        if page.status == StatusCode::OK
            && page
                .body
                .contains(&format!(r#"<a href="/runs/{id}">{id}</a>"#))
            && page.body.contains("<td>failed</td><td>oncall</td>")
        {
            Ok(())
        } else {
            Err(page.body)
        }
    })
    .await;
    // Nothing was given up.
    let failed = ui
        .send(Method::GET, "/notifications/a?failed=1", &cookie, "", None)
        .await;
    assert!(failed.body.contains(r#"id="none""#), "{}", failed.body);
}

/// A job whose failure breaker opened shows why on its page and in the
/// list, offers Resume to an operator, and the Resume closes it.
#[tokio::test]
async fn a_job_with_its_breaker_open_says_why_and_resumes() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    let file = r#"
namespace: a
jobs:
  - name: bad
    breaker: { after_failures: 1 }
    tasks: [{ id: t, shell: "exit 3" }]
"#;
    let a = ui
        .send(Method::POST, "/api/v1/apply", "", file, Some(&admin))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    ui.send(
        Method::POST,
        "/api/v1/namespaces/a/jobs/bad/trigger",
        "",
        "{}",
        Some(&admin),
    )
    .await;
    let operator = ui.token(Role::Operator, Some("a")).await;
    let (cookie, csrf) = ui.sign_in(&operator).await;
    dagcron_testkit::until_async("the job's page says its breaker is open", async || {
        let job = ui.send(Method::GET, "/jobs/a/bad", &cookie, "", None).await;
        if job.body.contains("breaker open") && job.body.contains(r#"id="breaker""#) {
            Ok(())
        } else {
            Err(job.body)
        }
    })
    .await;
    let job = ui.send(Method::GET, "/jobs/a/bad", &cookie, "", None).await;
    assert!(
        job.body.contains("after 1 consecutive failed runs"),
        "{}",
        job.body
    );
    assert!(job.body.contains(r#"id="resume""#), "{}", job.body);
    let list = ui.send(Method::GET, "/jobs?ns=a", &cookie, "", None).await;
    assert!(list.body.contains("breaker open"), "{}", list.body);
    let resumed = ui
        .send(
            Method::POST,
            "/jobs/a/bad/resume",
            &cookie,
            &format!("csrf={csrf}"),
            None,
        )
        .await;
    assert!(resumed.status.is_redirection(), "{}", resumed.body);
    let job = ui.send(Method::GET, "/jobs/a/bad", &cookie, "", None).await;
    assert!(!job.body.contains(r#"id="breaker""#), "{}", job.body);
}

/// A job's page says what starts its runs besides its schedule.
#[tokio::test]
async fn a_jobs_page_names_its_after_trigger_and_webhook() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    let file = r#"
namespace: a
jobs:
  - name: up
    tasks: [{ id: t, noop: true }]
  - name: down
    after: { job: up, on: [succeeded, failed], pass_params: true }
    webhook: { secret: { secret: gh-hook }, max_per_minute: 10 }
    tasks: [{ id: t, noop: true }]
"#;
    let a = ui
        .send(Method::POST, "/api/v1/apply", "", file, Some(&admin))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let viewer = ui.token(Role::Viewer, Some("a")).await;
    let (cookie, _) = ui.sign_in(&viewer).await;
    let page = ui
        .send(Method::GET, "/jobs/a/down", &cookie, "", None)
        .await;
    assert!(
        page.body
            .contains("each run of up that ends succeeded or failed, with its parameters"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("POST /api/v1/hooks/a/down (secret gh-hook, at most 10 a minute)"),
        "{}",
        page.body
    );
    let up = ui.send(Method::GET, "/jobs/a/up", &cookie, "", None).await;
    assert!(!up.body.contains(r#"id="triggers""#));
}

/// The jobs page pages by 25, with or without a filter: 30 jobs make a
/// page of 25 and one of 5; a filter skips what it leaves out.
#[tokio::test]
async fn the_jobs_page_pages_by_twenty_five_with_or_without_a_filter() {
    let ui = ui().await;
    let admin = ui.token(Role::Admin, None).await;
    let jobs: String = (0..30)
        .map(|i| {
            format!(
                "  - {{ name: j{i:02}, paused: {}, tasks: [{{ id: t, noop: true }}] }}\n",
                i % 3 == 0
            )
        })
        .collect();
    let file = format!("namespace: a\njobs:\n{jobs}");
    let a = ui
        .send(Method::POST, "/api/v1/apply", "", &file, Some(&admin))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let (cookie, _) = ui.sign_in(&admin).await;
    let names = |body: &str| -> Vec<String> {
        (0..30)
            .map(|i| format!("j{i:02}"))
            .filter(|n| body.contains(&format!("href=\"/jobs/a/{n}\"")))
            .collect()
    };
    let next = |body: &str| -> Option<String> {
        let at = body.find("rel=\"next\"")?;
        let href = body[..at].rfind("href=\"")? + 6;
        Some(body[href..].split('"').next()?.replace("&amp;", "&"))
    };
    let first = ui.send(Method::GET, "/jobs?ns=a", &cookie, "", None).await;
    assert_eq!(names(&first.body).len(), 25);
    let rest = ui
        .send(
            Method::GET,
            &next(&first.body).expect("a next page"),
            &cookie,
            "",
            None,
        )
        .await;
    assert_eq!(names(&rest.body), ["j25", "j26", "j27", "j28", "j29"]);
    assert_eq!(next(&rest.body), None);
    let paused = ui
        .send(Method::GET, "/jobs?ns=a&show=paused", &cookie, "", None)
        .await;
    let want: Vec<String> = (0..30).step_by(3).map(|i| format!("j{i:02}")).collect();
    assert_eq!(names(&paused.body), want);
    assert_eq!(next(&paused.body), None);
}
