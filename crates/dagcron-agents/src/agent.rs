//! The agent: `dagcron worker --server URL`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagcron_exec::{AttemptContext, Limits};
use dagcron_proto::v1::agents_client::AgentsClient;
use dagcron_proto::v1::{self, agent_message, server_message};
use dagcron_proto::{ClockEstimate, ClockSample, PROTOCOL_VERSION};
use jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::convert;

/// Settings of an agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The server's URL (`http://host:port`); several for the nodes of a
    /// cluster: the agent stays with one while it answers and moves to the
    /// next when it does not.
    pub servers: Vec<String>,
    /// The agent's name, stable across restarts.
    pub agent_id: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Attempts at once.
    pub capacity: u32,
    /// The shared secret the server expects, if any.
    pub token: Option<String>,
    /// The certificate (PEM) of the authority that signed the server's, for
    /// `https://` servers whose certificate is not publicly trusted.
    pub ca: Option<Vec<u8>>,
    /// The agent's own certificate and key (PEM), for a server that wants
    /// mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Why the agent stopped.
#[derive(Debug)]
pub enum AgentError {
    /// The server refused it (wrong protocol version or token): retrying will not help.
    Refused(String),
}

impl std::fmt::Display for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentError::Refused(why) => write!(f, "the server refused this agent: {why}"),
        }
    }
}

impl std::error::Error for AgentError {}

fn now_us() -> i64 {
    Timestamp::now().as_microsecond()
}

/// Waits until `at` (this agent's clock, in microseconds) to within a few
/// microseconds: the runtime's timer, whose granularity is a millisecond,
/// for all but the last 2 ms, then yielding until the instant.
async fn wait_until_us(at: i64) {
    const SPIN_US: i64 = 2_000;
    let wait = at - now_us() - SPIN_US;
    if wait > 0 {
        tokio::time::sleep(Duration::from_micros(wait.unsigned_abs())).await;
    }
    while now_us() < at {
        tokio::task::yield_now().await;
    }
}

fn send(body: agent_message::Body) -> v1::AgentMessage {
    v1::AgentMessage {
        sent_at_us: now_us(),
        body: Some(body),
    }
}

/// What the agent keeps across connections.
struct Local {
    /// Running attempts by fencing token.
    running: HashMap<i64, (v1::AttemptRef, CancellationToken)>,
    /// Results not yet delivered.
    unreported: Vec<v1::Result>,
    clock: ClockEstimate,
    draining: bool,
    watch: Watch,
}

/// The part of its lease that an agent trusts: the server keeps an agent's
/// attempts for its lease after it last heard from it, then gives them to
/// another agent. The agent counts the lease from the last message the
/// server acknowledged (sent at or before the server heard it), and stops
/// trusting it a quarter early, leaving the server's grace for the kill.
const TRUSTED_PART: f64 = 0.75;

/// An assignment that reaches the agent later than this after the server
/// sent it is not started: the server may already have given it to another
/// agent (it waits 5 s for an acceptance, and this leaves a second for the
/// error of the agent's estimate of the server's clock).
const ASSIGNMENT_MAX_AGE_US: i64 = 4_000_000;

/// The agent's side of its lease (see [`TRUSTED_PART`]): when it ends
/// without a word from the server, every running attempt is killed, so
/// that its retry elsewhere never runs beside it. Kept apart from the
/// connection's loop, which may wait on a stalled stream.
#[derive(Clone, Default)]
struct Watch(Arc<Mutex<Trust>>);

#[derive(Default)]
struct Trust {
    until: Option<Instant>,
    /// The parent of the running attempts' tokens.
    attempts: CancellationToken,
}

impl Watch {
    /// The server has heard the agent at or after `heard`: its lease runs
    /// to `heard + lease` on the server's side.
    fn heard(&self, heard: Instant, lease: Duration) {
        let until = heard + lease.mul_f64(TRUSTED_PART);
        let mut trust = self.0.lock().expect("watch lock");
        trust.until = Some(trust.until.map_or(until, |u| u.max(until)));
    }

    /// The lease's token now: cancelled when the lease ends (the parent
    /// of the attempts' tokens).
    fn lease_token(&self) -> CancellationToken {
        self.0.lock().expect("watch lock").attempts.clone()
    }

    /// Whether the agent's lease holds at `now`.
    fn trusted(&self, now: Instant) -> bool {
        self.0
            .lock()
            .expect("watch lock")
            .until
            .is_some_and(|u| now < u)
    }

    /// Kills the running attempts if the lease has ended by `now`; true
    /// if it had.
    fn expire(&self, now: Instant) -> bool {
        let mut trust = self.0.lock().expect("watch lock");
        match trust.until {
            Some(until) if now >= until => {
                trust.until = None;
                std::mem::take(&mut trust.attempts).cancel();
                true
            }
            _ => false,
        }
    }

    /// Checks the lease every 100 ms until dropped.
    async fn guard(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            if self.expire(Instant::now()) {
                tracing::error!(
                    "no word from the server within this agent's lease: its running attempts are killed, as the server will give them to another agent"
                );
            }
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the agent until `shutdown`, then drains: it takes nothing new and
/// finishes (and reports) what it runs.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> Result<(), AgentError> {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<v1::Result>();
    let mut local = Local {
        running: HashMap::new(),
        unreported: vec![],
        clock: ClockEstimate::default(),
        draining: false,
        watch: Watch::default(),
    };
    let guard = tokio::spawn(local.watch.clone().guard());
    let _guard = AbortOnDrop(guard);
    if config.servers.is_empty() {
        return Err(AgentError::Refused("no server URL given".into()));
    }
    let mut failures: u32 = 0;
    let mut next = 0;
    loop {
        if local.draining && local.running.is_empty() && local.unreported.is_empty() {
            return Ok(());
        }
        let server = &config.servers[next % config.servers.len()];
        match session(
            &config,
            server,
            &mut local,
            &done_tx,
            &mut done_rx,
            &shutdown,
        )
        .await
        {
            Ok(()) => return Ok(()),
            Err(Some(refused)) => return Err(refused),
            // The next server in the list, if there are several.
            Err(None) => next += 1,
        }
        // Reconnect with exponential backoff and full jitter, capped at 5 s.
        failures = (failures + 1).min(6);
        let cap = Duration::from_millis(100 << failures).min(Duration::from_secs(5));
        let jitter = (now_us().unsigned_abs() % 1000) as u32;
        let wait = cap * jitter / 1000;
        tracing::info!("reconnecting in {wait:?}");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            Some(result) = done_rx.recv() => {
                local.running.remove(&result.attempt.as_ref().map_or(0, |a| a.fencing_token));
                local.unreported.push(result);
            }
            () = shutdown.cancelled(), if !local.draining => local.draining = true,
        }
    }
}

/// One connection. `Ok`: drained and done; `Err(Some)`: refused; `Err(None)`: reconnect.
async fn session(
    config: &AgentConfig,
    server: &str,
    local: &mut Local,
    done_tx: &mpsc::UnboundedSender<v1::Result>,
    done_rx: &mut mpsc::UnboundedReceiver<v1::Result>,
    shutdown: &CancellationToken,
) -> Result<(), Option<AgentError>> {
    let endpoint = match tonic::transport::Endpoint::from_shared(server.to_string()) {
        Ok(e) => e.tcp_nodelay(true).connect_timeout(Duration::from_secs(5)),
        Err(e) => {
            return Err(Some(AgentError::Refused(format!(
                "bad server URL {server:?}: {e}"
            ))));
        }
    };
    let endpoint = if server.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = &config.ca {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &config.identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        match endpoint.tls_config(tls) {
            Ok(e) => e,
            Err(e) => {
                return Err(Some(AgentError::Refused(format!(
                    "TLS settings for {server}: {e}"
                ))));
            }
        }
    } else {
        endpoint
    };
    let mut client = match endpoint.connect().await {
        Ok(channel) => AgentsClient::new(channel),
        Err(e) => {
            tracing::warn!("cannot reach {server}: {e}");
            return Err(None);
        }
    };
    // Heartbeats, acceptances and results go apart from the output, taken
    // in turn with it: much output on a slow link never holds them up.
    let (out, rx) = mpsc::channel::<v1::AgentMessage>(1024);
    let (logs, logs_rx) = mpsc::channel::<v1::AgentMessage>(256);
    let hello = v1::Hello {
        agent_id: config.agent_id.clone(),
        labels: config
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        capacity: config.capacity,
        version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: PROTOCOL_VERSION,
        token: config.token.clone().unwrap_or_default(),
        unreported: std::mem::take(&mut local.unreported),
    };
    let reported = hello.unreported.clone();
    let hello_sent = Instant::now();
    let _ = out.send(send(agent_message::Body::Hello(hello))).await;
    let outbound = ReceiverStream::new(rx).merge(ReceiverStream::new(logs_rx));
    let mut inbound = match client.attach(outbound).await {
        Ok(r) => r.into_inner(),
        Err(e) => {
            tracing::warn!("attaching failed: {e}");
            local.unreported = reported;
            return Err(None);
        }
    };
    let mut every = Duration::from_secs(1);
    let mut heartbeat = tokio::time::interval(every);
    let mut lease = Duration::ZERO;
    // The heartbeats sent lately, to tell from an acknowledgement when the
    // server heard the agent.
    let mut beats: VecDeque<(i64, Instant)> = VecDeque::new();
    let mut last_heard = Instant::now();
    loop {
        tokio::select! {
            msg = inbound.message() => {
                let msg = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) | Err(_) => {
                        tracing::warn!("lost the connection to the server");
                        return Err(None);
                    }
                };
                last_heard = Instant::now();
                match msg.body {
                    Some(server_message::Body::Welcome(w)) => {
                        tracing::info!(session = %w.session_id, "connected to {server}");
                        every = Duration::from_millis(u64::from(w.heartbeat_interval_ms.max(50)));
                        heartbeat = tokio::time::interval(every);
                        lease = Duration::from_millis(u64::from(w.lease_ttl_ms));
                        local.watch.heard(hello_sent, lease);
                    }
                    Some(server_message::Body::Refusal(r)) => {
                        return Err(Some(AgentError::Refused(r.reason)));
                    }
                    Some(server_message::Body::HeartbeatAck(ack)) => {
                        if let Some(&(_, sent)) = beats.iter().find(|(at, _)| *at == ack.agent_sent_at_us) {
                            local.watch.heard(sent, lease);
                        }
                        local.clock.add(ClockSample {
                            t0: ack.agent_sent_at_us,
                            t1: ack.received_at_us,
                            t2: msg.sent_at_us,
                            t3: now_us(),
                        });
                    }
                    // A draining agent takes nothing new: left unaccepted, the
                    // assignment goes to another agent.
                    Some(server_message::Body::Assignment(_)) if local.draining => {
                        tracing::info!("draining: an assignment is left for another agent");
                    }
                    Some(server_message::Body::Assignment(_)) if !local.watch.trusted(Instant::now()) => {
                        tracing::warn!("an assignment came after this agent's lease ended: not started");
                    }
                    Some(server_message::Body::Assignment(a)) => {
                        // Its age by the server's clock, as this agent estimates it.
                        let age_us = local.clock.best().map(|_| now_us() - local.clock.to_agent_clock(msg.sent_at_us));
                        match age_us {
                            Some(age_us) if age_us > ASSIGNMENT_MAX_AGE_US => tracing::warn!(
                                "an assignment came {:.1} s after the server sent it: not started (the server gives it to another agent)",
                                age_us as f64 / 1e6
                            ),
                            _ => start(a, local, &out, &logs, done_tx).await,
                        }
                    }
                    Some(server_message::Body::Cancel(c)) => {
                        let token = c.attempt.map_or(0, |a| a.fencing_token);
                        if let Some((_, cancel)) = local.running.get(&token) {
                            tracing::info!(token, "cancelled by the server: {}", c.reason);
                            cancel.cancel();
                        }
                    }
                    None => {}
                }
            }
            Some(result) = done_rx.recv() => {
                local.running.remove(&result.attempt.as_ref().map_or(0, |a| a.fencing_token));
                if out.send(send(agent_message::Body::Result(result.clone()))).await.is_err() {
                    local.unreported.push(result);
                    return Err(None);
                }
                if local.draining && local.running.is_empty() {
                    drop(logs);
                    close(out, inbound).await;
                    return Ok(());
                }
            }
            _ = heartbeat.tick() => {
                // A cut that leaves the connection open (packets dropped)
                // is seen by the silence, not by the socket.
                let silence = last_heard.elapsed();
                if silence > every * 2 + Duration::from_secs(1) {
                    tracing::warn!("no word from the server for {:.1} s: reconnecting", silence.as_secs_f64());
                    return Err(None);
                }
                let best = local.clock.best();
                let beat = v1::Heartbeat {
                    running: local.running.values().map(|(r, _)| r.clone()).collect(),
                    load: load_average(),
                    clock_offset_us: local.clock.offset_us(),
                    round_trip_us: best.map_or(0, |s| s.round_trip_us()),
                    draining: local.draining,
                };
                let message = send(agent_message::Body::Heartbeat(beat));
                beats.push_back((message.sent_at_us, Instant::now()));
                if beats.len() > 64 {
                    beats.pop_front();
                }
                // A stream that takes nothing more is as good as cut.
                if out.try_send(message).is_err() {
                    tracing::warn!("the connection to the server takes nothing more: reconnecting");
                    return Err(None);
                }
            }
            () = shutdown.cancelled(), if !local.draining => {
                tracing::info!("draining: finishing {} attempts, taking no new ones", local.running.len());
                local.draining = true;
                heartbeat.reset_immediately();
                if local.running.is_empty() {
                    // Say so, then go.
                    let beat = v1::Heartbeat { draining: true, ..Default::default() };
                    let _ = out.send(send(agent_message::Body::Heartbeat(beat))).await;
                    drop(logs);
                    close(out, inbound).await;
                    return Ok(());
                }
            }
        }
    }
}

/// Ends a session cleanly: closes this side of the stream and waits
/// (briefly) for the server to close its side, which it does after taking
/// every message sent, so that the last results are not lost on exit.
async fn close(
    out: mpsc::Sender<v1::AgentMessage>,
    mut inbound: tonic::Streaming<v1::ServerMessage>,
) {
    drop(out);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
}

/// Accepts an assignment and runs it.
async fn start(
    a: v1::Assignment,
    local: &mut Local,
    out: &mpsc::Sender<v1::AgentMessage>,
    logs: &mpsc::Sender<v1::AgentMessage>,
    done_tx: &mpsc::UnboundedSender<v1::Result>,
) {
    let Some(attempt) = a.attempt.clone() else {
        return;
    };
    let token = attempt.fencing_token;
    let lease = local.watch.lease_token();
    let cancel = lease.child_token();
    local
        .running
        .insert(token, (attempt.clone(), cancel.clone()));
    // Started at the instant asked, in this agent's clock.
    let start_at = (a.start_at_us != 0).then(|| local.clock.to_agent_clock(a.start_at_us));
    let _ = out
        .send(send(agent_message::Body::Accepted(v1::Accepted {
            attempt: Some(attempt.clone()),
            start_at_us: start_at.unwrap_or_else(now_us),
        })))
        .await;
    let done = done_tx.clone();
    let live = dagcron_exec::LiveLog::new(a.max_output_bytes as usize);
    // Output goes to the server as it comes, for whoever follows the attempt.
    let forward = {
        let (live, out, attempt) = (live.clone(), logs.clone(), attempt.clone());
        async move {
            let mut offset = 0;
            loop {
                live.wait(Duration::from_millis(200)).await;
                let (bytes, ended) = live.read_from(offset);
                if !bytes.is_empty() {
                    let chunk = v1::LogChunk {
                        attempt: Some(attempt.clone()),
                        offset: offset as u64,
                        data: bytes,
                    };
                    offset += chunk.data.len();
                    if out
                        .send(send(agent_message::Body::Log(chunk)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                if ended {
                    return;
                }
            }
        }
    };
    tokio::spawn(forward);
    tokio::spawn(async move {
        let outcome = match prepare(&a) {
            Err(e) => dagcron_exec::Outcome {
                outputs: Default::default(),
                ending: dagcron_exec::Ending::Failed(dagcron_core::Failure::Error(e.clone())),
                exit_code: None,
                error: Some(e),
                log: vec![],
                lines: Vec::new(),
                start_error_us: None,
            },
            Ok((executor, ctx)) => {
                if let Some(at) = start_at {
                    wait_until_us(at).await;
                }
                let timeout =
                    (a.timeout_ms > 0).then(|| Duration::from_millis(u64::from(a.timeout_ms)));
                let limits = Limits {
                    max_output: a.max_output_bytes as usize,
                };
                let started = now_us();
                let mut outcome =
                    dagcron_exec::run_live(&executor, &ctx, timeout, cancel, limits, Some(&live))
                        .await;
                if lease.is_cancelled() {
                    // Killed for the lease, not cancelled by the server: a
                    // failure its retries may take up.
                    let why =
                        "killed by its agent: no word from the server within the agent's lease";
                    outcome.ending =
                        dagcron_exec::Ending::Failed(dagcron_core::Failure::Error(why.into()));
                    outcome.error = Some(why.into());
                }
                let mut result = convert::outcome_to_result(attempt.clone(), &outcome);
                result.started_at_us = started;
                result.finished_at_us = now_us();
                result.start_error_us = start_at.map_or(0, |at| started - at);
                let _ = done.send(result);
                return;
            }
        };
        live.finish();
        let _ = done.send(convert::outcome_to_result(attempt, &outcome));
    });
}

fn prepare(a: &v1::Assignment) -> Result<(dagcron_core::Executor, AttemptContext), String> {
    let executor = convert::executor_from_proto(a.executor.as_ref().ok_or("no executor")?)?;
    let attempt = a.attempt.as_ref().ok_or("no attempt")?;
    let scheduled_at: Timestamp = a
        .scheduled_at
        .parse()
        .map_err(|e| format!("scheduled_at {:?}: {e}", a.scheduled_at))?;
    let ctx = AttemptContext {
        item: a.item.as_ref().map(|i| (i.index as usize, i.value.clone())),
        outputs: a
            .upstream
            .iter()
            .map(|u| {
                let outputs = u.outputs.iter().map(|(k, v)| (k.clone(), v.clone()));
                (u.task.clone(), std::sync::Arc::new(outputs.collect()))
            })
            .collect(),
        namespace: a.namespace.clone(),
        job: a.job.clone(),
        run_id: attempt.run_id,
        task_id: attempt.task_id.clone(),
        attempt: attempt.attempt,
        scheduled_at,
        idempotency_key: a.idempotency_key.clone(),
        params: a
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        secrets: dagcron_exec::SecretValues(
            a.secrets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        trace: (!a.traceparent.is_empty()).then(|| dagcron_exec::TraceHeaders {
            traceparent: a.traceparent.clone(),
            tracestate: (!a.tracestate.is_empty()).then(|| a.tracestate.clone()),
        }),
        policy: None,
    };
    Ok((executor, ctx))
}

/// The one-minute load average (0 where it cannot be read).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
