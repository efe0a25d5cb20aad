//! Coordinators on a real PostgreSQL database (one per test): a node whose
//! clock is too far from the database's owns no jobs and says why.

use dagcron_testkit::until_async;
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::JobFile;
use dagcron_runtime::cluster::{self, ClusterConfig, Coordinator};
use dagcron_runtime::{Clock, ClusterHandle, Engine, EngineConfig, EngineHandle, SystemClock};
use dagcron_store::cluster::Coordination;
use dagcron_store_postgres::PgStore;
use dagcron_test_pg::TestDatabase;
use jiff::{SignedDuration, Timestamp};
use tokio_util::sync::CancellationToken;

async fn node(db: &TestDatabase, id: &str, clock: Arc<dyn Clock>) -> (EngineHandle, ClusterHandle) {
    let store = PgStore::connect(&db.url, 4).await.unwrap();
    let config = ClusterConfig {
        lease_ttl: Duration::from_secs(5),
        ..ClusterConfig::new(id, "127.0.0.1:0")
    };
    let (registration, identity) = cluster::register(&store, &config, &*clock).await.unwrap();
    let engine_config = EngineConfig {
        node: Some(identity.clone()),
        ..EngineConfig::default()
    };
    let (engine, handle) = Engine::start(Arc::new(store.clone()), clock.clone(), engine_config)
        .await
        .unwrap();
    tokio::spawn(engine.run(CancellationToken::new(), Duration::ZERO));
    let coordinator = Coordinator::new(
        store,
        handle.clone(),
        config,
        &registration,
        &identity,
        clock,
        None,
    );
    let view = coordinator.handle();
    tokio::spawn(coordinator.run(CancellationToken::new(), CancellationToken::new()));
    (handle, view)
}

/// The system clock, ten seconds ahead (a fixed manual clock would drift
/// back towards the truth as the test runs).
struct Ahead;

impl Clock for Ahead {
    fn now(&self) -> Timestamp {
        Timestamp::now() + SignedDuration::from_secs(10)
    }

    fn sleep_until(
        &self,
        at: Timestamp,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        SystemClock.sleep_until(at - SignedDuration::from_secs(10))
    }
}

#[tokio::test]
async fn a_node_with_a_skewed_clock_owns_nothing_and_says_so() {
    let db = TestDatabase::create("skew").await;
    let (engine, good) = node(&db, "good", Arc::new(SystemClock)).await;
    let (_, skewed) = node(&db, "skewed", Arc::new(Ahead)).await;

    let mut yaml = String::from("namespace: s\njobs:\n");
    for i in 0..20 {
        yaml.push_str(&format!(
            "  - {{ name: j{i}, schedule: '0 0 0 1 1 *', tasks: [{{ id: t, noop: true }}] }}\n"
        ));
    }
    let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
    engine.apply(file.validate().unwrap()).await.unwrap();

    let (g, s) = until_async(
        "the good node owns every job, the skewed none",
        async || {
            let (g, s) = (good.local(), skewed.local());
            if g.owned_jobs == 20 && !s.clock_ok && s.owned_jobs == 0 && g.ring_size == 1 {
                Ok((g, s))
            } else {
                Err(format!("{g:?} {s:?}"))
            }
        },
    )
    .await;
    assert!(s.clock_skew_us > 9_000_000, "{}", s.clock_skew_us);
    assert!(g.clock_ok && g.clock_skew_us.abs() < 500_000);
    let nodes = good.nodes().await.unwrap();
    let row = nodes.iter().find(|n| n.id == "skewed").unwrap();
    assert!(!row.eligible && row.lease_valid, "{row:?}");
    let store = PgStore::connect(&db.url, 1).await.unwrap();
    assert_eq!(store.nodes().await.unwrap().len(), 2);
}

/// Two nodes' outboxes, each with its own connections to one PostgreSQL
/// database, deliver side by side: every notification reaches the
/// receiver once (their claims skip the rows the other holds).
#[tokio::test]
async fn two_nodes_outboxes_deliver_each_notification_once() {
    use std::sync::Mutex;

    use dagcron_runtime::{Outbox, OutboxConfig, OutboxMetrics};
    use dagcron_store::prelude::*;
    use dagcron_store::{NewNotification, NotificationState, Write};

    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let keep = keep.clone();
            async move {
                let key = headers["idempotency-key"].to_str().unwrap().to_string();
                keep.lock().unwrap().push(key);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let db = TestDatabase::create("outbox").await;
    let a = Arc::new(PgStore::connect(&db.url, 4).await.unwrap());
    let b = Arc::new(PgStore::connect(&db.url, 4).await.unwrap());
    let at = Timestamp::now();
    let channel = serde_json::json!({ "name": "hook", "webhook": { "url": url } }).to_string();
    let writes: Vec<Write> = (0..300)
        .map(|i| {
            Write::Notify(NewNotification {
                key: format!("t/j/run-{i}/failed/hook"),
                namespace: "t".into(),
                job: "j".into(),
                run: Some(i),
                event: "failed".into(),
                notifier: "hook".into(),
                channel: channel.clone(),
                payload: "{}".into(),
                at,
            })
        })
        .collect();
    a.write(&writes).await.unwrap();
    let listed = a.list_notifications("t", false, None, 500).await.unwrap();
    assert_eq!(listed.len(), 300, "written");
    let outbox = |store: &Arc<PgStore>, owner: &str| {
        Outbox::new(
            store.clone(),
            Arc::new(SystemClock),
            OutboxConfig {
                owner: owner.into(),
                ..OutboxConfig::default()
            },
            None,
            None,
            OutboxMetrics::default(),
            Arc::new(tokio::sync::Notify::new()),
        )
    };
    let (x, y) = (outbox(&a, "node-a"), outbox(&b, "node-b"));
    let (sent_a, sent_b) = tokio::join!(
        async {
            let mut n = 0;
            loop {
                match x.pass().await.unwrap() {
                    0 => break n,
                    k => n += k,
                }
            }
        },
        async {
            let mut n = 0;
            loop {
                match y.pass().await.unwrap() {
                    0 => break n,
                    k => n += k,
                }
            }
        }
    );
    assert_eq!(sent_a + sent_b, 300, "a claimed {sent_a}, b {sent_b}");
    let mut keys = got.lock().unwrap().clone();
    assert_eq!(keys.len(), 300);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 300, "a notification was received twice");
    let mut before = None;
    let mut delivered = 0;
    loop {
        let page = a.list_notifications("t", false, before, 100).await.unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        delivered += page
            .iter()
            .filter(|n| n.state == NotificationState::Delivered && n.attempts == 1)
            .count();
    }
    assert_eq!(delivered, 300);
}
