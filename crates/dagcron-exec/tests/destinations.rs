//! http tasks under an execution policy, against real listeners on
//! loopback: a tenant's task reaching a loopback service directly, by a
//! name that resolves to loopback, and through a redirect, is refused; a
//! policy that allows the block lets exactly that block through.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::Executor;
use dagcron_core::exec_policy::ExecPolicy;
use dagcron_core::model::HttpSpec;
use dagcron_exec::{AttemptContext, Ending, Limits, Outcome, run};
use tokio_util::sync::CancellationToken;

/// A "loopback service" (as Redis or the metrics address would be) on
/// `ip`, answering `/secret` and redirecting `/to?u=URL` to `URL`.
async fn service(ip: &str) -> String {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/secret", get(|| async { "internal data" }))
        .route(
            "/to",
            get(
                |axum::extract::Query(q): axum::extract::Query<BTreeMap<String, String>>| async move {
                    axum::response::Redirect::temporary(&q["u"])
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn ctx(policy: ExecPolicy) -> AttemptContext {
    AttemptContext {
        item: Default::default(),
        outputs: Default::default(),
        namespace: "alpha".into(),
        job: "j".into(),
        run_id: 1,
        task_id: "t".into(),
        attempt: 1,
        scheduled_at: "2026-01-01T00:00:00Z".parse().unwrap(),
        idempotency_key: "alpha/j/1/t".into(),
        params: BTreeMap::new(),
        secrets: Default::default(),
        trace: None,
        policy: Some(Arc::new(policy)),
    }
}

async fn get(url: &str, policy: ExecPolicy) -> Outcome {
    let task = Executor::Http(HttpSpec {
        outputs: Default::default(),
        method: "GET".into(),
        url: url.into(),
        headers: BTreeMap::new(),
        body: None,
        expect: vec![],
    });
    run(
        &task,
        &ctx(policy),
        Some(Duration::from_secs(20)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await
}

fn refused(out: &Outcome) -> String {
    assert!(matches!(out.ending, Ending::Failed(_)), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.log).contains("internal data"),
        "{out:?}"
    );
    out.error.clone().unwrap()
}

#[tokio::test]
async fn an_http_task_to_a_loopback_listener_is_refused() {
    let base = service("127.0.0.1").await;
    let out = get(&format!("{base}/secret"), ExecPolicy::default()).await;
    let error = refused(&out);
    assert!(error.contains("127.0.0.1 is a loopback address"), "{error}");
    // By a name that resolves to it: checked after DNS.
    let port = base.rsplit(':').next().unwrap();
    let out = get(
        &format!("http://localhost:{port}/secret"),
        ExecPolicy::default(),
    )
    .await;
    let error = refused(&out);
    assert!(error.contains("loopback"), "{error}");
    // IPv4 written as IPv6, and the unspecified address.
    for url in [
        format!("http://[::ffff:127.0.0.1]:{port}/secret"),
        format!("http://0.0.0.0:{port}/secret"),
    ] {
        refused(&get(&url, ExecPolicy::default()).await);
    }
}

#[tokio::test]
async fn an_http_task_redirected_to_a_loopback_listener_is_refused() {
    // The first hop is allowed (a service of the tenant's own), the second
    // is not: the redirect is checked like the first request.
    let open = service("127.0.0.1").await;
    let hidden = service("127.0.0.2").await;
    let allow_first = ExecPolicy {
        http_allow: vec!["127.0.0.1/32".into()],
        ..ExecPolicy::default()
    };
    let out = get(&format!("{open}/to?u={hidden}/secret"), allow_first.clone()).await;
    let error = refused(&out);
    assert!(error.contains("redirect"), "{error}");
    assert!(error.contains("127.0.0.2"), "{error}");
    // A redirect within the allowed block is followed.
    let out = get(&format!("{open}/to?u={open}/secret"), allow_first).await;
    assert_eq!(out.ending, Ending::Succeeded, "{out:?}");
    assert_eq!(out.log, b"internal data");
}

#[tokio::test]
async fn a_policy_that_allows_a_block_opens_that_block_only() {
    let base = service("127.0.0.1").await;
    let allow = ExecPolicy {
        http_allow: vec!["127.0.0.0/30".into()],
        ..ExecPolicy::default()
    };
    let out = get(&format!("{base}/secret"), allow.clone()).await;
    assert_eq!(out.ending, Ending::Succeeded, "{out:?}");
    let other = service("127.0.0.9").await;
    refused(&get(&format!("{other}/secret"), allow).await);
}
