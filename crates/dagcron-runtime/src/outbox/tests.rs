//! The outbox against a real receiver on loopback, on the in-memory store,
//! under a manual clock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use dagcron_core::exec_policy::ExecPolicy;
use dagcron_store::memory::MemoryStore;
use dagcron_store::{NewNotification, NotificationState, Write};
use hmac::{KeyInit, Mac};

use super::*;
use crate::ManualClock;
use crate::engine::{Policies, PolicyLookup, Resolved, Secrets};

/// What a receiver got: each request's headers and body.
type Got = Arc<Mutex<Vec<(HeaderMap, String)>>>;

/// A receiver on loopback that answers `codes` in turn (then 200), and
/// keeps what it got.
async fn receiver(codes: Vec<u16>) -> (String, Got) {
    let got: Got = Arc::default();
    let codes = Arc::new(Mutex::new(codes.into_iter()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let (keep, codes) = (keep.clone(), codes.clone());
            async move {
                keep.lock().unwrap().push((headers, body));
                let code = codes.lock().unwrap().next().unwrap_or(200);
                StatusCode::from_u16(code).unwrap()
            }
        }),
    );
    (serve("127.0.0.1", app).await, got)
}

/// Serves `app` on loopback address `ip`; its `/hook` URL.
async fn serve(ip: &str, app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

struct FixedSecrets(BTreeMap<String, String>);

impl Secrets for FixedSecrets {
    fn resolve<'a>(&'a self, _namespace: &'a str, names: &'a BTreeSet<String>) -> Resolved<'a> {
        Box::pin(async move {
            names
                .iter()
                .map(|n| {
                    self.0
                        .get(n)
                        .map(|v| (n.clone(), v.clone()))
                        .ok_or_else(|| format!("no secret {n}"))
                })
                .collect()
        })
    }
}

struct FixedPolicy(Arc<ExecPolicy>);

impl Policies for FixedPolicy {
    fn policy<'a>(&'a self, _namespace: &'a str) -> PolicyLookup<'a> {
        Box::pin(async move { Ok(self.0.clone()) })
    }
}

fn start() -> Timestamp {
    "2026-03-01T03:00:00Z".parse().unwrap()
}

fn note(key: &str, event: &str, channel: serde_json::Value) -> Write {
    Write::Notify(NewNotification {
        key: key.into(),
        namespace: "billing".into(),
        job: "nightly".into(),
        run: Some(7),
        event: event.into(),
        notifier: "oncall".into(),
        channel: channel.to_string(),
        payload: serde_json::json!({
            "schema": notify::SCHEMA, "id": key, "event": event, "at": start(),
            "namespace": "billing", "job": "nightly",
            "run": { "id": 7, "state": "failed", "trigger": "schedule", "scheduled_at": start() },
        })
        .to_string(),
        at: start(),
    })
}

struct Setup {
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            store: Arc::new(MemoryStore::new()),
            clock: Arc::new(ManualClock::new(start())),
        }
    }

    fn outbox(&self, owner: &str, policy: Option<ExecPolicy>) -> Outbox<MemoryStore> {
        Outbox::new(
            self.store.clone(),
            self.clock.clone(),
            OutboxConfig {
                owner: owner.into(),
                ..OutboxConfig::default()
            },
            Some(SecretSource(Arc::new(FixedSecrets(BTreeMap::from([(
                "hook-key".to_string(),
                "s3cret".to_string(),
            )]))))),
            policy.map(|p| PolicySource(Arc::new(FixedPolicy(Arc::new(p))))),
            OutboxMetrics::default(),
            Arc::new(Notify::new()),
        )
    }

    async fn the_one(&self) -> NotificationRecord {
        let mut all = self
            .store
            .list_notifications("billing", false, None, 10)
            .await
            .unwrap();
        assert_eq!(all.len(), 1);
        all.remove(0)
    }
}

fn loopback_allowed() -> ExecPolicy {
    ExecPolicy {
        http_allow: vec!["127.0.0.1/32".into()],
        ..ExecPolicy::default()
    }
}

#[tokio::test]
async fn a_receiver_that_fails_three_times_gets_four_attempts_and_one_delivery() {
    let (url, got) = receiver(vec![500, 500, 503]).await;
    let s = Setup::new();
    let channel = serde_json::json!({
        "name": "oncall", "webhook": { "url": url, "secret": { "secret": "hook-key" } }
    });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    let outbox = s.outbox("node-a", Some(loopback_allowed()));
    let mut passes = 0;
    while s.the_one().await.state == NotificationState::Pending {
        passes += 1;
        assert!(passes <= 10, "still pending after {passes} passes");
        assert_eq!(outbox.pass().await.unwrap(), 1);
        // The next attempt is due within the backoff: at most 20 s later
        // for the third retry.
        s.clock.advance(SignedDuration::from_secs(20));
    }
    let n = s.the_one().await;
    assert_eq!(
        (n.state, n.attempts, n.last_status),
        (NotificationState::Delivered, 4, Some(200))
    );
    let attempts = s.store.delivery_attempts(n.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.status).collect::<Vec<_>>(),
        [Some(500), Some(500), Some(503), Some(200)]
    );
    assert!(
        attempts[0].error.as_deref().unwrap().contains("500"),
        "{attempts:?}"
    );
    assert!(attempts[3].error.is_none());
    // The same body, key and valid signature every time.
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 4);
    for (headers, body) in got.iter() {
        assert_eq!(body, &got[0].1);
        assert_eq!(headers["idempotency-key"], "k1");
        assert_eq!(headers["x-dagcron-event"], "failed");
        assert_eq!(headers["content-type"], "application/json");
        let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(b"s3cret").unwrap();
        mac.update(body.as_bytes());
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(headers["x-dagcron-signature-256"], format!("sha256={hex}"));
    }
    let body: serde_json::Value = serde_json::from_str(&got[0].1).unwrap();
    assert_eq!(body["schema"], notify::SCHEMA);
    assert_eq!(body["run"]["id"], 7);
}

#[tokio::test]
async fn a_retry_waits_for_its_backoff() {
    let (url, got) = receiver(vec![500]).await;
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": url } });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    let outbox = s.outbox("node-a", None);
    assert_eq!(outbox.pass().await.unwrap(), 1);
    let next = s.the_one().await.next_at.unwrap();
    let wait = next.duration_since(start()).as_secs_f64();
    assert!((2.5..=5.0).contains(&wait), "first retry after {wait}s");
    // Not before it is due.
    s.clock
        .set(next.checked_sub(SignedDuration::from_millis(1)).unwrap());
    assert_eq!(outbox.pass().await.unwrap(), 0);
    s.clock.set(next);
    assert_eq!(outbox.pass().await.unwrap(), 1);
    assert_eq!(got.lock().unwrap().len(), 2);
    assert_eq!(s.the_one().await.state, NotificationState::Delivered);
}

/// An outbox whose poll is far off (a node alone polls rarely) still
/// tries failed deliveries again when their retries come due: it wakes
/// for each retry it decided, the later ones too.
#[tokio::test]
async fn retries_wake_an_outbox_that_polls_rarely() {
    let (url, got) = receiver(vec![500, 500]).await;
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": url } });
    s.store
        .write(&[
            note("k1", "failed", channel.clone()),
            note("k2", "failed", channel),
        ])
        .await
        .unwrap();
    let mut outbox = s.outbox("node-a", Some(loopback_allowed()));
    outbox.config.poll = std::time::Duration::from_secs(3600);
    let stop = CancellationToken::new();
    let running = tokio::spawn(outbox.run(stop.clone()));
    let all = async || {
        s.store
            .list_notifications("billing", false, None, 10)
            .await
            .unwrap()
    };
    let mut due = dagcron_testkit::until_async("both first attempts recorded", async || {
        let due: Vec<_> = all()
            .await
            .iter()
            .filter(|n| n.attempts == 1)
            .filter_map(|n| n.next_at)
            .collect();
        (due.len() == 2).then_some(due)
    })
    .await;
    due.sort();
    assert_ne!(due[0], due[1], "the retries' jitter differs by key");
    for (i, at) in due.into_iter().enumerate() {
        s.clock.set(at);
        dagcron_testkit::until_async("the retry due delivered", async || {
            let delivered = all()
                .await
                .iter()
                .filter(|n| n.state == NotificationState::Delivered)
                .count();
            (delivered == i + 1).then_some(())
        })
        .await;
    }
    assert_eq!(got.lock().unwrap().len(), 4);
    stop.cancel();
    running.await.unwrap();
}

#[tokio::test]
async fn a_slack_notifier_gets_one_line_at_the_address_its_secret_holds() {
    let (url, got) = receiver(vec![]).await;
    let s = Setup::new();
    let outbox = Outbox::new(
        s.store.clone(),
        s.clock.clone(),
        OutboxConfig::default(),
        Some(SecretSource(Arc::new(FixedSecrets(BTreeMap::from([(
            "slack-url".to_string(),
            url,
        )]))))),
        None,
        OutboxMetrics::default(),
        Arc::new(Notify::new()),
    );
    let channel =
        serde_json::json!({ "name": "chat", "slack": { "url": { "secret": "slack-url" } } });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    outbox.pass().await.unwrap();
    assert_eq!(s.the_one().await.state, NotificationState::Delivered);
    let got = got.lock().unwrap();
    let body: serde_json::Value = serde_json::from_str(&got[0].1).unwrap();
    assert_eq!(
        body,
        serde_json::json!({ "text": "dagcron: run 7 of billing/nightly (schedule, scheduled for 2026-03-01T03:00:00Z) failed" })
    );
}

#[tokio::test]
async fn the_execution_policy_keeps_a_notifier_from_internal_addresses() {
    let (url, got) = receiver(vec![]).await;
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": url } });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    // The default policy: public addresses only.
    s.outbox("node-a", Some(ExecPolicy::default()))
        .pass()
        .await
        .unwrap();
    let n = s.the_one().await;
    assert_eq!(
        (n.state, n.attempts, n.last_status),
        (NotificationState::Pending, 1, None)
    );
    assert!(
        n.last_error
            .as_deref()
            .unwrap()
            .contains("refused by the namespace's execution policy"),
        "{n:?}"
    );
    assert!(
        got.lock().unwrap().is_empty(),
        "nothing reached the receiver"
    );
}

#[tokio::test]
async fn a_missing_secret_is_an_attempt_that_failed_and_says_which() {
    let (url, got) = receiver(vec![]).await;
    let s = Setup::new();
    let channel = serde_json::json!({
        "name": "oncall", "webhook": { "url": url, "secret": { "secret": "gone" } }
    });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    s.outbox("node-a", None).pass().await.unwrap();
    let n = s.the_one().await;
    assert_eq!(n.state, NotificationState::Pending);
    assert!(
        n.last_error.as_deref().unwrap().contains("no secret gone"),
        "{n:?}"
    );
    assert!(got.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_success_is_sent_as_a_recovery_only_after_a_failure() {
    let (url, got) = receiver(vec![]).await;
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": url } });
    // No run before run 7: not a recovery.
    s.store
        .write(&[note("k1", "recovered", channel.clone())])
        .await
        .unwrap();
    s.outbox("node-a", None).pass().await.unwrap();
    let n = s.the_one().await;
    assert_eq!((n.state, n.attempts), (NotificationState::Dropped, 0));
    assert!(got.lock().unwrap().is_empty());
    // Run 5 of the job failed: run 7's success is a recovery.
    let mut run = dagcron_store::conformance::new_run(5, 100);
    run.namespace = "billing".into();
    run.job = "nightly".into();
    s.store
        .write(&[
            Write::Run(run),
            Write::RunState {
                run: 5,
                from: dagcron_core::RunState::Running,
                to: dagcron_core::RunState::Failed,
                at: start(),
            },
            note("k2", "recovered", channel),
        ])
        .await
        .unwrap();
    s.outbox("node-a", None).pass().await.unwrap();
    let list = s
        .store
        .list_notifications("billing", false, None, 10)
        .await
        .unwrap();
    assert_eq!(list[0].made.key, "k2");
    assert_eq!(list[0].state, NotificationState::Delivered);
    assert_eq!(got.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn two_nodes_delivering_at_once_send_each_notification_once() {
    let (url, got) = receiver(vec![]).await;
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": url } });
    let writes: Vec<Write> = (0..50)
        .map(|i| note(&format!("k{i}"), "failed", channel.clone()))
        .collect();
    s.store.write(&writes).await.unwrap();
    let (a, b) = (s.outbox("node-a", None), s.outbox("node-b", None));
    loop {
        let (x, y) = tokio::join!(a.pass(), b.pass());
        if x.unwrap() + y.unwrap() == 0 {
            break;
        }
    }
    let got = got.lock().unwrap();
    let keys: BTreeSet<String> = got
        .iter()
        .map(|(h, _)| h["idempotency-key"].to_str().unwrap().to_string())
        .collect();
    assert_eq!((got.len(), keys.len()), (50, 50));
}

#[test]
fn the_jitter_of_a_retry_is_drawn_from_its_key() {
    assert_eq!(draw("a", 1), draw("a", 1));
    assert_ne!(draw("a", 1), draw("a", 2));
    assert_ne!(draw("a", 1), draw("b", 1));
    for i in 0..1000 {
        let d = draw(&format!("k{i}"), i);
        assert!((0.0..1.0).contains(&d));
    }
}

#[tokio::test]
async fn a_receiver_that_answers_without_end_gives_only_the_start_of_its_answer() {
    // 500, then a body that never ends: the attempt ends with the start of
    // it, not with the whole (nor with the timeout of reading it all).
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async {
            let endless = futures_util::stream::repeat_with(|| {
                Ok::<_, std::io::Error>(axum::body::Bytes::from_static(&[b'x'; 4096]))
            });
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::body::Body::from_stream(endless),
            )
        }),
    );
    let url = serve("127.0.0.1", app).await;
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": url } });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    s.outbox("node-a", None).pass().await.unwrap();
    let n = s.the_one().await;
    assert_eq!(
        (n.state, n.last_status),
        (NotificationState::Pending, Some(500))
    );
    let error = n.last_error.unwrap();
    assert!(error.contains("xxxxxxxx"), "{error}");
    assert!(error.len() < 600, "{} bytes kept", error.len());
}

#[tokio::test]
async fn the_outbox_stops_when_asked_while_its_receivers_hang() {
    // A receiver that accepts and never answers, and more notifications
    // than a pass claims: the outbox stops at once, not pass after pass.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(socket);
        }
    });
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": url } });
    let writes: Vec<Write> = (0..100)
        .map(|i| note(&format!("k{i}"), "failed", channel.clone()))
        .collect();
    s.store.write(&writes).await.unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(s.outbox("node-a", None).run(stop.clone()));
    dagcron_testkit::until_async("a delivery under way", async || {
        match accepted.load(std::sync::atomic::Ordering::SeqCst) {
            0 => Err(0),
            n => Ok(n),
        }
    })
    .await;
    stop.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(30), running)
        .await
        .expect("the outbox stopped while its pass hung")
        .unwrap();
    held.abort();
}

#[tokio::test]
async fn a_notifier_cannot_redirect_its_way_to_an_address_the_policy_refuses() {
    // The namespace may reach 127.0.0.1 only; its receiver there answers
    // with a redirect to a service on 127.0.0.2, which must get nothing.
    let reached: Got = Arc::default();
    let keep = reached.clone();
    let internal = serve(
        "127.0.0.2",
        axum::Router::new().fallback(move || {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push((HeaderMap::new(), String::new()));
                "secret"
            }
        }),
    )
    .await;
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let to = internal.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [("location", to)]) }
        }),
    );
    let outside = serve("127.0.0.1", app).await;
    let s = Setup::new();
    let channel = serde_json::json!({ "name": "oncall", "webhook": { "url": outside } });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    s.outbox("node-a", Some(loopback_allowed()))
        .pass()
        .await
        .unwrap();
    let n = s.the_one().await;
    assert_eq!(n.state, NotificationState::Pending, "{n:?}");
    assert!(
        n.last_error.as_deref().unwrap().contains("redirect"),
        "{n:?}"
    );
    assert!(
        reached.lock().unwrap().is_empty(),
        "the internal service was reached"
    );
}

/// Secrets by namespace: only `other` has `hook-key`.
struct NamespacedSecrets;

impl Secrets for NamespacedSecrets {
    fn resolve<'a>(&'a self, namespace: &'a str, names: &'a BTreeSet<String>) -> Resolved<'a> {
        Box::pin(async move {
            names
                .iter()
                .map(|n| match (namespace, n.as_str()) {
                    ("other", "hook-key") => Ok((n.clone(), "theirs".to_string())),
                    _ => Err(format!("no secret {n} in namespace {namespace}")),
                })
                .collect()
        })
    }
}

#[tokio::test]
async fn a_notifier_reads_the_secrets_of_its_own_namespace_only() {
    // billing's notifier names a secret only another namespace has:
    // nothing is sent, signed with it or otherwise.
    let (url, got) = receiver(vec![]).await;
    let s = Setup::new();
    let outbox = Outbox::new(
        s.store.clone(),
        s.clock.clone(),
        OutboxConfig::default(),
        Some(SecretSource(Arc::new(NamespacedSecrets))),
        None,
        OutboxMetrics::default(),
        Arc::new(Notify::new()),
    );
    let channel = serde_json::json!({
        "name": "oncall", "webhook": { "url": url, "secret": { "secret": "hook-key" } }
    });
    s.store
        .write(&[note("k1", "failed", channel)])
        .await
        .unwrap();
    outbox.pass().await.unwrap();
    let n = s.the_one().await;
    assert_eq!(n.state, NotificationState::Pending);
    assert!(
        n.last_error
            .as_deref()
            .unwrap()
            .contains("no secret hook-key in namespace billing"),
        "{n:?}"
    );
    assert!(got.lock().unwrap().is_empty());
}
