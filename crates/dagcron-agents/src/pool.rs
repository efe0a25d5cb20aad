//! The server's side: connected agents, attempts waiting for one, and the
//! `Agents` gRPC service.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dagcron_core::Executor;
use dagcron_proto::v1::agents_server::{Agents, AgentsServer};
use dagcron_proto::v1::{self, agent_message, server_message};
use dagcron_proto::{PROTOCOL_VERSION, SUPPORTED_VERSIONS, check_version};
use dagcron_runtime::{Remote, RemoteTask};
use jiff::Timestamp;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::fair::FairQueue;

/// Settings of the pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// How long an agent keeps its attempts without a heartbeat.
    pub lease_ttl: Duration,
    /// How long an assignment may wait for the agent's acceptance before it
    /// goes to another agent.
    pub accept_timeout: Duration,
    /// The shared secret agents may present instead of a join token.
    pub token: Option<String>,
    /// Agents must connect with a client certificate (mutual TLS), checked
    /// by the server's TLS layer, which marks such requests with
    /// [`ClientCertificate`].
    pub require_client_certificate: bool,
}

/// Marks a request whose connection presented a client certificate that
/// the server's TLS layer verified.
#[derive(Clone, Copy, Debug)]
pub struct ClientCertificate;

/// What a join token lets an agent do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentGrant {
    /// The token's id, for the log and the audit.
    pub token_id: String,
    /// The only namespace whose attempts the agent takes; none: every one.
    pub namespace: Option<String>,
    /// The labels the agent may claim; none: any.
    pub labels: Option<BTreeMap<String, String>>,
}

/// Checks a join token: the grant, or why the agent is refused.
pub type Authenticate = std::sync::Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = Result<AgentGrant, String>> + Send>>
        + Send
        + Sync,
>;

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            lease_ttl: Duration::from_secs(10),
            accept_timeout: Duration::from_secs(5),
            token: None,
            require_client_certificate: false,
        }
    }
}

/// An agent, for the API (which answers it as its own `WorkerAnswer`).
#[derive(Clone, Debug)]
pub struct WorkerInfo {
    /// Its name.
    pub id: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Attempts it runs at once.
    pub capacity: u32,
    /// Attempts it runs now.
    pub running: u32,
    /// Whether its stream is open.
    pub connected: bool,
    /// Shutting down.
    pub draining: bool,
    /// Its last heartbeat.
    pub last_heartbeat: Timestamp,
    /// Its clock minus the server's, microseconds (its own estimate).
    pub clock_offset_us: i64,
    /// Its load average.
    pub load: f64,
    /// Its software version.
    pub version: String,
    /// When it connected.
    pub connected_at: Timestamp,
}

struct Agent {
    id: String,
    /// The only namespace whose attempts it takes (its join token's).
    namespace: Option<String>,
    labels: BTreeMap<String, String>,
    capacity: u32,
    running: u32,
    version: String,
    tx: Option<mpsc::UnboundedSender<Result<v1::ServerMessage, Status>>>,
    last_seen: Instant,
    last_heartbeat: Timestamp,
    connected_at: Timestamp,
    clock_offset_us: i64,
    load: f64,
    draining: bool,
}

impl Agent {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        labels.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }

    fn takes(&self, task: &RemoteTask) -> bool {
        self.matches(&task.labels)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == task.ctx.namespace)
    }

    fn has_room(&self) -> bool {
        self.tx.is_some() && !self.draining && self.running < self.capacity
    }
}

/// An attempt handed to an agent.
struct Inflight {
    session: u64,
    /// The id of the agent it was given to: only that agent's sessions
    /// may report on it (a reconnected session of the same agent may).
    agent: String,
    task: RemoteTask,
    accepted: bool,
    sent: Instant,
    /// When the agent was told to stop it (the run was cancelled): its
    /// result, once the process is gone, ends the attempt.
    cancel_sent: Option<Instant>,
}

#[derive(Default)]
struct State {
    agents: HashMap<u64, Agent>,
    waiting: FairQueue<RemoteTask>,
    /// By fencing token.
    inflight: HashMap<i64, Inflight>,
    next_session: u64,
    next_token: i64,
    /// Results refused because their token was stale.
    stale_results: u64,
    /// Messages about an attempt from an agent it was not given to.
    foreign_reports: u64,
}

/// Connected agents and the attempts they run; see the crate documentation.
#[derive(Clone)]
pub struct AgentPool {
    state: Arc<Mutex<State>>,
    config: PoolConfig,
    /// Checks an agent's join token (the `token` of its Hello); unset: any
    /// agent is let in (a pool in a test), or the shared token if set.
    authenticate: Arc<std::sync::OnceLock<Authenticate>>,
    /// Cancelled when the pool stops: every agent stream ends.
    closing: CancellationToken,
}

fn now_us() -> i64 {
    Timestamp::now().as_microsecond()
}

fn message(body: server_message::Body) -> v1::ServerMessage {
    v1::ServerMessage {
        sent_at_us: now_us(),
        body: Some(body),
    }
}

fn attempt_ref(task: &RemoteTask, token: i64) -> v1::AttemptRef {
    v1::AttemptRef {
        run_id: task.ctx.run_id,
        task_id: task.ctx.task_id.clone(),
        attempt: task.ctx.attempt,
        fencing_token: token,
    }
}

impl AgentPool {
    /// A pool; call [`AgentPool::start`] to run its upkeep.
    pub fn new(config: PoolConfig) -> AgentPool {
        let state = State {
            next_token: now_us().saturating_mul(1024),
            ..State::default()
        };
        AgentPool {
            state: Arc::new(Mutex::new(state)),
            config,
            authenticate: Arc::default(),
            closing: CancellationToken::new(),
        }
    }

    /// From now on, agents are let in by the join token `check` accepts
    /// (or by the shared token, if the pool has one). Only the first call counts.
    pub fn set_authenticate(&self, check: Authenticate) {
        let _ = self.authenticate.set(check);
    }

    /// Runs the pool's upkeep (expired agents, unaccepted assignments)
    /// until `stop`; then ends every agent's stream (the server can close
    /// its connections; the agents reconnect to whoever comes next).
    pub fn start(&self, stop: CancellationToken) {
        let pool = self.clone();
        let every = (self.config.lease_ttl / 8).max(Duration::from_millis(50));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => pool.upkeep(),
                }
            }
            pool.closing.cancel();
            let mut state = pool.state.lock().expect("pool lock");
            for agent in state.agents.values_mut() {
                agent.tx = None;
            }
        });
    }

    /// The gRPC service, to serve beside the REST API.
    pub fn service(&self) -> AgentsServer<AgentPool> {
        AgentsServer::new(self.clone())
    }

    /// The agents, for the API.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let state = self.state.lock().expect("pool lock");
        let mut out: Vec<WorkerInfo> = state
            .agents
            .values()
            .map(|a| WorkerInfo {
                id: a.id.clone(),
                labels: a.labels.clone(),
                capacity: a.capacity,
                running: a.running,
                connected: a.tx.is_some(),
                draining: a.draining,
                last_heartbeat: a.last_heartbeat,
                clock_offset_us: a.clock_offset_us,
                load: a.load,
                version: a.version.clone(),
                connected_at: a.connected_at,
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Attempts waiting for an agent.
    pub fn waiting(&self) -> usize {
        self.state.lock().expect("pool lock").waiting.len()
    }

    /// Messages refused so far because they came from another agent than
    /// the one the attempt was given to (a forged result, for one).
    pub fn foreign_reports(&self) -> u64 {
        self.state.lock().expect("pool lock").foreign_reports
    }

    /// Results refused so far because their fencing token was stale.
    pub fn stale_results(&self) -> u64 {
        self.state.lock().expect("pool lock").stale_results
    }

    /// Where this pool's fencing tokens start. Tokens must never repeat
    /// across servers an agent may talk to: by default they start from the
    /// pool's creation time (in microseconds, times 1,024); a cluster node
    /// sets its epoch here (times 2^40), unique across the cluster.
    pub fn set_token_base(&self, base: i64) {
        self.state.lock().expect("pool lock").next_token = base;
    }

    /// Assigns waiting attempts to agents with room, in turn across
    /// namespaces and jobs; an attempt no agent can take now keeps its place.
    fn assign(state: &mut State) {
        // Stop as soon as no agent has room: the queue may be long.
        while state.agents.values().any(Agent::has_room) {
            let agents = &state.agents;
            let Some(task) = state.waiting.take(|t| {
                t.cancel.is_cancelled() || agents.values().any(|a| a.has_room() && a.takes(t))
            }) else {
                break;
            };
            if task.cancel.is_cancelled() {
                (task.report)(cancelled_outcome());
                continue;
            }
            let best = state
                .agents
                .iter()
                .filter(|(_, a)| a.has_room() && a.takes(&task))
                .min_by(|(_, a), (_, b)| {
                    // The least loaded, relative to its capacity.
                    (u64::from(a.running) * u64::from(b.capacity))
                        .cmp(&(u64::from(b.running) * u64::from(a.capacity)))
                })
                .map(|(s, _)| *s);
            let Some(session) = best else {
                // `take` saw an agent for it: cannot happen; keep it anyway.
                let (ns, job) = (task.ctx.namespace.clone(), task.ctx.job.clone());
                state.waiting.push_front(&ns, &job, task);
                break;
            };
            // Increasing, for systems that reject a stale writer, but not
            // by one: an agent cannot tell another's token from its own.
            let mut step = [0u8; 2];
            getrandom::fill(&mut step).expect("the operating system's random source");
            state.next_token += 1 + i64::from(u16::from_le_bytes(step) % 1024);
            let token = state.next_token;
            let agent = state.agents.get_mut(&session).expect("agent");
            let assignment = v1::Assignment {
                attempt: Some(attempt_ref(&task, token)),
                namespace: task.ctx.namespace.clone(),
                job: task.ctx.job.clone(),
                scheduled_at: task.ctx.scheduled_at.to_string(),
                idempotency_key: task.ctx.idempotency_key.clone(),
                params: task
                    .ctx
                    .params
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                executor: Some(convert::executor_to_proto(&task.executor)),
                timeout_ms: task
                    .timeout
                    .map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX)),
                start_at_us: task.start_at.map_or(0, |t| t.as_microsecond()),
                max_output_bytes: u32::try_from(task.max_output).unwrap_or(u32::MAX),
                secrets: task
                    .ctx
                    .secrets
                    .0
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            };
            let sent = agent.tx.as_ref().is_some_and(|tx| {
                tx.send(Ok(message(server_message::Body::Assignment(assignment))))
                    .is_ok()
            });
            if !sent {
                agent.tx = None;
                let (ns, job) = (task.ctx.namespace.clone(), task.ctx.job.clone());
                state.waiting.push_front(&ns, &job, task);
                continue;
            }
            agent.running += 1;
            let agent_id = agent.id.clone();
            state.inflight.insert(
                token,
                Inflight {
                    session,
                    agent: agent_id,
                    task,
                    accepted: false,
                    sent: Instant::now(),
                    cancel_sent: None,
                },
            );
        }
    }

    /// Ends agents whose lease passed (their attempts are lost), sends
    /// unaccepted assignments elsewhere, and stops cancelled attempts.
    fn upkeep(&self) {
        let mut state = self.state.lock().expect("pool lock");
        let ttl = self.config.lease_ttl;
        let expired: Vec<u64> = state
            .agents
            .iter()
            .filter(|(_, a)| a.last_seen.elapsed() > ttl)
            .map(|(s, _)| *s)
            .collect();
        for session in &expired {
            if let Some(agent) = state.agents.remove(session) {
                tracing::warn!(agent = %agent.id, "agent lease ended; its attempts are lost");
            }
        }
        let tokens: Vec<i64> = state.inflight.keys().copied().collect();
        for token in tokens {
            let inflight = &state.inflight[&token];
            let gone = !state.agents.contains_key(&inflight.session);
            let late = !inflight.accepted && inflight.sent.elapsed() > self.config.accept_timeout;
            let cancelled = inflight.task.cancel.is_cancelled();
            if cancelled && !gone && !late {
                // Tell the agent once, then wait for its result (the process
                // is gone then); an agent that does not answer within the
                // accept timeout is not waited for any longer.
                let inflight = state.inflight.get_mut(&token).expect("inflight");
                match inflight.cancel_sent {
                    None => {
                        inflight.cancel_sent = Some(Instant::now());
                        let cancel = v1::Cancel {
                            attempt: Some(attempt_ref(&inflight.task, token)),
                            reason: "cancelled".into(),
                        };
                        let session = inflight.session;
                        if let Some(tx) = state.agents.get(&session).and_then(|a| a.tx.as_ref()) {
                            let _ = tx.send(Ok(message(server_message::Body::Cancel(cancel))));
                        }
                        continue;
                    }
                    Some(at) if at.elapsed() <= self.config.accept_timeout => continue,
                    Some(_) => {}
                }
            }
            if !(gone || late || cancelled) {
                continue;
            }
            let inflight = state.inflight.remove(&token).expect("inflight");
            if let Some(agent) = state.agents.get_mut(&inflight.session) {
                agent.running = agent.running.saturating_sub(1);
                if late {
                    if let Some(tx) = &agent.tx {
                        let _ = tx.send(Ok(message(server_message::Body::Cancel(v1::Cancel {
                            attempt: Some(attempt_ref(&inflight.task, token)),
                            reason: "not accepted in time".into(),
                        }))));
                    }
                }
            }
            if gone {
                (inflight.task.report)(convert::lost("the agent running this attempt stopped"));
            } else if cancelled {
                (inflight.task.report)(dagcron_exec::Outcome {
                    error: Some(
                        "cancelled; the agent running it did not confirm in time that it stopped"
                            .into(),
                    ),
                    ..cancelled_outcome()
                });
            } else {
                tracing::info!(run = inflight.task.ctx.run_id, task = %inflight.task.ctx.task_id, "assignment not accepted in time; trying another agent");
                let (ns, job) = (
                    inflight.task.ctx.namespace.clone(),
                    inflight.task.ctx.job.clone(),
                );
                state.waiting.push_front(&ns, &job, inflight.task);
            }
        }
        Self::assign(&mut state);
    }

    /// Whether the message about attempt `token` comes from the agent it
    /// was given to; counted and logged when it does not.
    fn from_its_agent(state: &mut State, session: u64, token: i64) -> bool {
        let Some(inflight) = state.inflight.get(&token) else {
            return true;
        };
        let sender = state.agents.get(&session).map(|a| a.id.as_str());
        if sender == Some(inflight.agent.as_str()) {
            return true;
        }
        state.foreign_reports += 1;
        tracing::warn!(
            token,
            sender = sender.unwrap_or("?"),
            owner = %inflight.agent,
            "refused a message about an attempt given to another agent"
        );
        false
    }

    fn on_result(state: &mut State, session: u64, result: &v1::Result) {
        let token = result.attempt.as_ref().map_or(0, |a| a.fencing_token);
        if !Self::from_its_agent(state, session, token) {
            return;
        }
        let Some(inflight) = state.inflight.remove(&token) else {
            state.stale_results += 1;
            tracing::warn!(token, "result with a stale fencing token refused");
            return;
        };
        for s in [inflight.session, session] {
            if let Some(agent) = state.agents.get_mut(&s) {
                if s == inflight.session {
                    agent.running = agent.running.saturating_sub(1);
                }
            }
        }
        let is_http = matches!(inflight.task.executor, Executor::Http(_));
        let mut outcome = convert::outcome_from_result(result, is_http);
        if inflight.task.start_at.is_some() {
            outcome.start_error_us = Some(result.start_error_us);
        }
        (inflight.task.report)(outcome);
    }

    fn on_message(&self, session: u64, msg: v1::AgentMessage, received_at: i64) {
        let mut state = self.state.lock().expect("pool lock");
        let Some(agent) = state.agents.get_mut(&session) else {
            return;
        };
        agent.last_seen = Instant::now();
        match msg.body {
            Some(agent_message::Body::Heartbeat(h)) => {
                agent.last_heartbeat = Timestamp::now();
                agent.clock_offset_us = h.clock_offset_us;
                agent.load = h.load;
                agent.draining = h.draining;
                if let Some(tx) = &agent.tx {
                    let _ = tx.send(Ok(message(server_message::Body::HeartbeatAck(
                        v1::HeartbeatAck {
                            agent_sent_at_us: msg.sent_at_us,
                            received_at_us: received_at,
                        },
                    ))));
                }
                // After a reconnection, the attempts it still runs are this
                // session's; attempts this pool never gave (a server that is
                // gone gave them, and they were lost with it) are stopped.
                let agent_id = agent.id.clone();
                let tx = agent.tx.clone();
                for r in &h.running {
                    let Some(inflight) = state.inflight.get_mut(&r.fencing_token) else {
                        tracing::info!(agent = %agent_id, run = r.run_id, task = %r.task_id, "the agent runs an attempt this server did not give it; stopping it");
                        if let Some(tx) = &tx {
                            let _ =
                                tx.send(Ok(message(server_message::Body::Cancel(v1::Cancel {
                                    attempt: Some(r.clone()),
                                    reason:
                                        "no longer this agent's: the server that gave it is gone"
                                            .into(),
                                }))));
                        }
                        continue;
                    };
                    if inflight.agent != agent_id {
                        // Another agent's attempt: not this one's to claim.
                        continue;
                    }
                    if inflight.session != session {
                        let old = inflight.session;
                        inflight.session = session;
                        inflight.accepted = true;
                        if let Some(a) = state.agents.get_mut(&old) {
                            a.running = a.running.saturating_sub(1);
                        }
                        if let Some(a) = state.agents.get_mut(&session) {
                            a.running += 1;
                        }
                    }
                }
            }
            Some(agent_message::Body::Accepted(a)) => {
                let token = a.attempt.map_or(0, |a| a.fencing_token);
                if !Self::from_its_agent(&mut state, session, token) {
                    return;
                }
                if let Some(inflight) = state.inflight.get_mut(&token) {
                    inflight.accepted = true;
                }
            }
            Some(agent_message::Body::Result(r)) => Self::on_result(&mut state, session, &r),
            Some(agent_message::Body::Log(chunk)) => {
                let token = chunk.attempt.as_ref().map_or(0, |a| a.fencing_token);
                if !Self::from_its_agent(&mut state, session, token) {
                    return;
                }
                if let Some(live) = state
                    .inflight
                    .get(&token)
                    .and_then(|i| i.task.live.as_ref())
                {
                    live.push(&chunk.data);
                }
            }
            Some(agent_message::Body::Hello(_)) | None => {}
        }
        Self::assign(&mut state);
    }

    fn disconnected(&self, session: u64) {
        let mut state = self.state.lock().expect("pool lock");
        if let Some(agent) = state.agents.get_mut(&session) {
            // Its attempts stay its own until the lease ends: it may come back.
            agent.tx = None;
            tracing::info!(agent = %agent.id, "agent disconnected");
        }
    }
}

fn cancelled_outcome() -> dagcron_exec::Outcome {
    dagcron_exec::Outcome {
        ending: dagcron_exec::Ending::Cancelled,
        exit_code: None,
        error: Some("cancelled before an agent took it".into()),
        log: vec![],
        start_error_us: None,
    }
}

impl Remote for AgentPool {
    fn submit(&self, task: RemoteTask) {
        let mut state = self.state.lock().expect("pool lock");
        let (ns, job) = (task.ctx.namespace.clone(), task.ctx.job.clone());
        state.waiting.push_back(&ns, &job, task);
        Self::assign(&mut state);
        drop(state);
    }

    fn serves(&self, labels: &BTreeMap<String, String>) -> bool {
        let state = self.state.lock().expect("pool lock");
        state
            .agents
            .values()
            .any(|a| a.tx.is_some() && !a.draining && a.matches(labels))
    }

    fn rooms(&self) -> Vec<(BTreeMap<String, String>, usize)> {
        let state = self.state.lock().expect("pool lock");
        // Attempts already waiting here come first.
        if state.waiting.len() > 0 {
            return vec![];
        }
        state
            .agents
            .values()
            .filter(|a| a.has_room())
            .map(|a| (a.labels.clone(), (a.capacity - a.running) as usize))
            .collect()
    }
}

type ServerStream = Pin<Box<dyn Stream<Item = Result<v1::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Agents for AgentPool {
    type AttachStream = ServerStream;

    async fn attach(
        &self,
        request: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<ServerStream>, Status> {
        let certified = request.extensions().get::<ClientCertificate>().is_some();
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before Hello"))?;
        let Some(agent_message::Body::Hello(hello)) = first.body else {
            return Err(Status::invalid_argument("the first message must be Hello"));
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let refusal = |reason: String| -> Result<Response<ServerStream>, Status> {
            let (tx, rx) = mpsc::unbounded_channel();
            let _ = tx.send(Ok(message(server_message::Body::Refusal(v1::Refusal {
                reason,
                supported_versions: SUPPORTED_VERSIONS.to_vec(),
            }))));
            Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
        };
        if self.config.require_client_certificate && !certified {
            tracing::warn!(agent = %hello.agent_id, "agent refused: no client certificate");
            return refusal(
                "this server takes agents with a client certificate only (dagcron worker --cert and --key)"
                    .into(),
            );
        }
        if let Err(e) = check_version(hello.protocol_version) {
            tracing::warn!(agent = %hello.agent_id, "agent refused: {e}");
            return refusal(e.to_string());
        }
        let shared = self
            .config
            .token
            .as_ref()
            .is_some_and(|t| *t == hello.token);
        let grant = match self.authenticate.get() {
            _ if shared => AgentGrant::default(),
            None if self.config.token.is_none() => AgentGrant::default(),
            None => {
                tracing::warn!(agent = %hello.agent_id, "agent refused: wrong token");
                return refusal("the agent's token is not the one this server expects".into());
            }
            Some(check) => match check(hello.token.clone()).await {
                Ok(grant) => grant,
                Err(why) => {
                    tracing::warn!(agent = %hello.agent_id, "agent refused: {why}");
                    return refusal(why);
                }
            },
        };
        if let Some(allowed) = &grant.labels {
            if let Some((k, v)) = hello
                .labels
                .iter()
                .find(|(k, v)| allowed.get(*k) != Some(*v))
            {
                tracing::warn!(agent = %hello.agent_id, "agent refused: label {k}={v} not allowed");
                return refusal(format!(
                    "the join token {} does not let an agent claim the label {k}={v}",
                    grant.token_id
                ));
            }
        }
        if hello.agent_id.is_empty() || hello.capacity == 0 {
            return refusal("an agent needs an id and a capacity of at least 1".into());
        }
        let session = {
            let mut state = self.state.lock().expect("pool lock");
            state.next_session += 1;
            let session = state.next_session;
            // A reconnection replaces the agent's previous session, whose
            // attempts move over when the agent's heartbeat lists them.
            state.agents.insert(
                session,
                Agent {
                    id: hello.agent_id.clone(),
                    namespace: grant.namespace.clone(),
                    labels: hello
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    capacity: hello.capacity,
                    running: 0,
                    version: hello.version.clone(),
                    tx: Some(tx.clone()),
                    last_seen: Instant::now(),
                    last_heartbeat: Timestamp::now(),
                    connected_at: Timestamp::now(),
                    clock_offset_us: 0,
                    load: 0.0,
                    draining: false,
                },
            );
            // Results of attempts that finished while it was cut off.
            for r in &hello.unreported {
                Self::on_result(&mut state, session, r);
            }
            let _ = tx.send(Ok(message(server_message::Body::Welcome(v1::Welcome {
                session_id: session.to_string(),
                heartbeat_interval_ms: u32::try_from((self.config.lease_ttl / 4).as_millis())
                    .unwrap_or(u32::MAX),
                lease_ttl_ms: u32::try_from(self.config.lease_ttl.as_millis()).unwrap_or(u32::MAX),
                protocol_version: PROTOCOL_VERSION,
            }))));
            Self::assign(&mut state);
            session
        };
        tracing::info!(agent = %hello.agent_id, labels = ?hello.labels, capacity = hello.capacity, "agent connected");
        let pool = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = pool.closing.cancelled() => break,
                    msg = inbound.message() => match msg {
                        Ok(Some(msg)) => pool.on_message(session, msg, now_us()),
                        Ok(None) | Err(_) => break,
                    },
                }
            }
            pool.disconnected(session);
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}
