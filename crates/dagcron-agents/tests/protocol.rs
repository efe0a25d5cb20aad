//! The pool and an agent in one process, over real gRPC on loopback.

use dagcron_testkit::until_async;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use dagcron_agents::agent::{self, AgentConfig};
use dagcron_agents::{AgentPool, PoolConfig};
use dagcron_core::Executor;
use dagcron_core::model::ShellCommand;
use dagcron_exec::{AttemptContext, Ending, Outcome};
use dagcron_proto::v1::agents_client::AgentsClient;
use dagcron_proto::v1::{self, agent_message, server_message};
use dagcron_runtime::{Remote, RemoteTask};
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// Serves the pool on `addr` until `stop`.
async fn serve(
    pool: &AgentPool,
    addr: SocketAddr,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let listener = loop {
        // The port may take a moment to be free again after a previous server.
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let service = pool.service();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.cancelled_owned(),
            )
            .await
            .unwrap();
    })
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn task(script: &str, report: oneshot::Sender<Outcome>) -> RemoteTask {
    RemoteTask {
        priority: Default::default(),
        ready_us: Default::default(),
        ctx: AttemptContext {
            item: Default::default(),
            outputs: Default::default(),
            namespace: "ns".into(),
            job: "j".into(),
            run_id: 1,
            task_id: "t".into(),
            attempt: 1,
            scheduled_at: jiff::Timestamp::now(),
            idempotency_key: "k".into(),
            params: BTreeMap::new(),
            secrets: Default::default(),
            trace: None,
            policy: None,
        },
        executor: Executor::Shell(ShellCommand {
            command: script.into(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: None,
        }),
        timeout: None,
        start_at: None,
        labels: BTreeMap::new(),
        max_output: 1 << 16,
        cancel: CancellationToken::new(),
        live: None,
        report: Box::new(move |o, _| {
            let _ = report.send(o);
        }),
    }
}

#[tokio::test]
async fn a_newer_protocol_revision_is_refused_with_a_reason() {
    let pool = AgentPool::new(PoolConfig::default());
    let addr = free_addr();
    let stop = CancellationToken::new();
    serve(&pool, addr, stop.clone()).await;
    let mut client = loop {
        match AgentsClient::connect(format!("http://{addr}")).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(v1::AgentMessage {
        sent_at_us: 0,
        body: Some(agent_message::Body::Hello(v1::Hello {
            agent_id: "future".into(),
            capacity: 1,
            protocol_version: 99,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut inbound = client
        .attach(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = inbound.message().await.unwrap().unwrap();
    match first.body {
        Some(server_message::Body::Refusal(r)) => {
            assert!(r.reason.contains("revision 99"), "{}", r.reason);
            assert!(
                r.reason.contains("newer than this server's"),
                "{}",
                r.reason
            );
            assert_eq!(r.supported_versions, [1, 2]);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        inbound.message().await.unwrap().is_none(),
        "the stream ends"
    );
    assert!(pool.workers().is_empty());
    stop.cancel();
}

/// The server goes away while the agent runs an attempt; the attempt
/// finishes meanwhile; when a server is back on the same address (same
/// pool, within the lease), the agent reconnects and reports it.
#[tokio::test]
async fn a_result_made_while_cut_off_is_reported_after_reconnecting() {
    let pool = AgentPool::new(PoolConfig {
        lease_ttl: Duration::from_secs(30),
        ..PoolConfig::default()
    });
    let addr = free_addr();
    let first = CancellationToken::new();
    let server = serve(&pool, addr, first.clone()).await;
    let agent_stop = CancellationToken::new();
    let agent = tokio::spawn(agent::run(
        AgentConfig {
            servers: vec![format!("http://{addr}")],
            agent_id: "a".into(),
            labels: BTreeMap::new(),
            capacity: 1,
            token: None,
            ca: None,
            identity: None,
        },
        agent_stop.clone(),
    ));
    until_async("the agent is connected", async || {
        !pool.workers().is_empty()
    })
    .await;
    let (tx, outcome) = oneshot::channel();
    let marks = tempfile::tempdir().unwrap();
    let ended = marks.path().join("ended");
    pool.submit(task(
        &format!("sleep 1; touch {}; echo done", ended.display()),
        tx,
    ));
    until_async("the attempt is assigned", async || {
        pool.workers()[0].running > 0
    })
    .await;
    // Cut: the server goes away while the attempt runs (the pool ends its
    // streams, the server stops).
    let closing = CancellationToken::new();
    pool.start(closing.clone());
    closing.cancel();
    first.cancel();
    let _ = server.await;
    // The attempt ends while no server is there.
    until_async("the attempt ends", async || ended.exists()).await;
    // Back, with the same pool.
    let second = CancellationToken::new();
    serve(&pool, addr, second.clone()).await;
    let outcome = tokio::time::timeout(Duration::from_secs(20), outcome)
        .await
        .expect("the result arrives")
        .unwrap();
    assert_eq!(outcome.ending, Ending::Succeeded, "{outcome:?}");
    assert_eq!(String::from_utf8_lossy(&outcome.log).trim(), "done");
    assert_eq!(pool.stale_results(), 0);
    agent_stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), agent)
        .await
        .expect("the agent drains and stops")
        .unwrap()
        .unwrap();
    second.cancel();
}

/// One agent with one slot; a busy job queued first does not starve a job
/// queued after it: they take turns.
#[tokio::test]
async fn jobs_take_turns_for_a_busy_agent() {
    let pool = AgentPool::new(PoolConfig::default());
    let addr = free_addr();
    let stop = CancellationToken::new();
    serve(&pool, addr, stop.clone()).await;
    tokio::spawn(agent::run(
        AgentConfig {
            servers: vec![format!("http://{addr}")],
            agent_id: "solo".into(),
            labels: BTreeMap::new(),
            capacity: 1,
            token: None,
            ca: None,
            identity: None,
        },
        stop.clone(),
    ));
    until_async("the agent is connected", async || {
        !pool.workers().is_empty()
    })
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let submit = |job: &'static str, n: u32| {
        let (once, done) = oneshot::channel();
        let mut t = task("true", once);
        t.ctx.job = job.into();
        t.ctx.attempt = n;
        t.executor = Executor::Noop;
        let tx = tx.clone();
        tokio::spawn(async move {
            let _ = done.await;
            let _ = tx.send(job);
        });
        pool.submit(t);
    };
    for n in 1..=6 {
        submit("busy", n);
    }
    for n in 1..=2 {
        submit("quiet", n);
    }
    let mut order = Vec::new();
    while order.len() < 8 {
        order.push(
            tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .expect("all attempts finish")
                .unwrap(),
        );
    }
    let last_quiet = order.iter().rposition(|j| *j == "quiet").unwrap();
    assert!(
        last_quiet < 5,
        "the quiet job waited behind the busy one: {order:?}"
    );
    stop.cancel();
}

/// An agent speaking the protocol by hand: its stream to send on, and
/// what the server sends it.
async fn hand_agent(
    addr: SocketAddr,
    id: &str,
    role: &str,
) -> (
    tokio::sync::mpsc::Sender<v1::AgentMessage>,
    tonic::Streaming<v1::ServerMessage>,
) {
    hand_agent_with(addr, id, role, "").await
}

/// [`hand_agent`] presenting the join token `token`.
async fn hand_agent_with(
    addr: SocketAddr,
    id: &str,
    role: &str,
    token: &str,
) -> (
    tokio::sync::mpsc::Sender<v1::AgentMessage>,
    tonic::Streaming<v1::ServerMessage>,
) {
    let mut client = loop {
        match AgentsClient::connect(format!("http://{addr}")).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(v1::AgentMessage {
        sent_at_us: 0,
        body: Some(agent_message::Body::Hello(v1::Hello {
            agent_id: id.into(),
            capacity: 1,
            protocol_version: 1,
            labels: [("role".to_string(), role.to_string())].into(),
            token: token.into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let inbound = client
        .attach(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, inbound)
}

/// Submits a task for the agents labelled `role: worker` and waits for
/// its assignment on `inbound`: the attempt given, and where its outcome
/// will come.
async fn assigned_to_worker(
    pool: &AgentPool,
    inbound: &mut tonic::Streaming<v1::ServerMessage>,
) -> (v1::AttemptRef, oneshot::Receiver<Outcome>) {
    let (tx, outcome) = oneshot::channel();
    let mut t = task("true", tx);
    t.labels = BTreeMap::from([("role".into(), "worker".into())]);
    pool.submit(t);
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), inbound.message())
            .await
            .expect("the assignment arrives")
            .unwrap()
            .unwrap();
        if let Some(server_message::Body::Assignment(a)) = msg.body {
            return (a.attempt.unwrap(), outcome);
        }
    }
}

fn result_of(attempt: v1::AttemptRef, output: &[u8]) -> v1::AgentMessage {
    v1::AgentMessage {
        sent_at_us: 0,
        body: Some(agent_message::Body::Result(v1::Result {
            attempt: Some(attempt),
            ending: v1::result::Ending::Succeeded as i32,
            exit_code: Some(0),
            output: output.to_vec(),
            ..Default::default()
        })),
    }
}

/// Once both agents are connected, a task is assigned to `owner`; the
/// forger reports a result for it first: refused and counted, the attempt
/// goes on; then the owner's real result ends it.
async fn forgery_refused_and_real_result_taken(
    pool: &AgentPool,
    owner_tx: tokio::sync::mpsc::Sender<v1::AgentMessage>,
    owner: &mut tonic::Streaming<v1::ServerMessage>,
    forger_tx: tokio::sync::mpsc::Sender<v1::AgentMessage>,
) {
    until_async("both agents are connected", async || {
        pool.workers().len() >= 2
    })
    .await;
    let (attempt, mut outcome) = assigned_to_worker(pool, owner).await;
    forger_tx
        .send(result_of(attempt.clone(), b"forged output"))
        .await
        .unwrap();
    until_async("the forgery is refused", async || {
        pool.foreign_reports() > 0
    })
    .await;
    assert!(
        outcome.try_recv().is_err(),
        "the forged result ended the attempt"
    );
    owner_tx
        .send(result_of(attempt, b"real output"))
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), outcome)
        .await
        .expect("the real result arrives")
        .unwrap();
    assert_eq!(outcome.ending, Ending::Succeeded, "{outcome:?}");
    assert_eq!(String::from_utf8_lossy(&outcome.log), "real output");
    assert_eq!(pool.foreign_reports(), 1);
    assert_eq!(pool.stale_results(), 0, "the real result was not refused");
}

/// A rogue agent reported a forged `succeeded` result, with forged output,
/// for another agent's attempt (its fencing token was its own plus one): it
/// was accepted, and the real result refused as stale. A report is now
/// taken only from the agent the attempt was given to.
#[tokio::test]
async fn regression_a_forged_result_from_another_agent_is_refused() {
    let pool = AgentPool::new(PoolConfig::default());
    let addr = free_addr();
    let stop = CancellationToken::new();
    serve(&pool, addr, stop.clone()).await;
    let (honest_tx, mut honest) = hand_agent(addr, "honest", "worker").await;
    let (rogue_tx, _rogue) = hand_agent(addr, "rogue", "bait").await;
    forgery_refused_and_real_result_taken(&pool, honest_tx, &mut honest, rogue_tx).await;
    stop.cancel();
}

/// An agent with another namespace's join token that gave the id of the
/// agent an attempt was assigned to forged that attempt's result over
/// gRPC: results were matched on the id the client chose. An agent is now
/// its join token plus its name: the forgery is refused and counted, and
/// the real agent's result is taken.
#[tokio::test]
async fn regression_an_agent_of_another_join_token_under_the_same_name_cannot_report() {
    let pool = AgentPool::new(PoolConfig::default());
    pool.set_authenticate(std::sync::Arc::new(|token: String| {
        Box::pin(async move {
            let (id, namespace) = match token.as_str() {
                "join-of-ns" => ("tok-ns", "ns"),
                "join-of-alpha" => ("tok-alpha", "alpha"),
                _ => return Err("unknown join token".to_string()),
            };
            Ok(dagcron_agents::AgentGrant {
                token_id: id.into(),
                namespace: Some(namespace.into()),
                labels: None,
            })
        })
    }));
    let addr = free_addr();
    let stop = CancellationToken::new();
    serve(&pool, addr, stop.clone()).await;
    let (owner_tx, mut owner) = hand_agent_with(addr, "edge-1", "worker", "join-of-ns").await;
    let (forger_tx, _forger) = hand_agent_with(addr, "edge-1", "worker", "join-of-alpha").await;
    // The task is of namespace `ns`: only the agent of its join token takes it.
    forgery_refused_and_real_result_taken(&pool, owner_tx, &mut owner, forger_tx).await;
    stop.cancel();
}

/// An agent whose connection fails as it reports cannot tell whether the
/// report arrived, and sends it again: the copy of a result already taken
/// is ignored, not counted as a stale result. A token never issued still is.
#[tokio::test]
async fn a_result_sent_twice_is_taken_once_and_not_counted_stale() {
    let pool = AgentPool::new(PoolConfig::default());
    let addr = free_addr();
    let stop = CancellationToken::new();
    serve(&pool, addr, stop.clone()).await;
    let (agent_tx, mut agent) = hand_agent(addr, "a", "worker").await;
    until_async("the agent is connected", async || {
        !pool.workers().is_empty()
    })
    .await;
    let (attempt, outcome) = assigned_to_worker(&pool, &mut agent).await;
    let mut never_issued = attempt.clone();
    never_issued.fencing_token += 1_000_000;
    for m in [
        result_of(attempt.clone(), b"first"),
        result_of(attempt, b"again"),
        result_of(never_issued, b"stale"),
    ] {
        agent_tx.send(m).await.unwrap();
    }
    let outcome = tokio::time::timeout(Duration::from_secs(20), outcome)
        .await
        .expect("the result arrives")
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&outcome.log), "first");
    until_async("the later results are handled", async || {
        pool.stale_results() + pool.duplicate_results() >= 2
    })
    .await;
    assert_eq!(pool.duplicate_results(), 1);
    assert_eq!(
        pool.stale_results(),
        1,
        "only the token never issued is stale"
    );
    stop.cancel();
}

/// The pool's upkeep sleeps while no agent is there, and wakes when one
/// joins: an agent that then falls silent is let go after its lease, and
/// one that joins after it is watched the same way.
#[tokio::test]
async fn a_silent_agent_is_let_go_even_when_it_joined_an_idle_pool() {
    let pool = AgentPool::new(PoolConfig {
        lease_ttl: Duration::from_millis(400),
        ..PoolConfig::default()
    });
    let stop = CancellationToken::new();
    pool.start(stop.clone());
    let addr = free_addr();
    let server = serve(&pool, addr, stop.clone()).await;
    for id in ["first", "second"] {
        // The hand agent says hello and nothing more: no heartbeat.
        let (tx, _inbound) = hand_agent(addr, id, "worker").await;
        until_async("the agent is connected", async || {
            pool.workers().iter().any(|w| w.id == id)
        })
        .await;
        until_async("the silent agent is let go", async || {
            pool.workers().is_empty()
        })
        .await;
        drop(tx);
    }
    stop.cancel();
    let _ = server.await;
}
