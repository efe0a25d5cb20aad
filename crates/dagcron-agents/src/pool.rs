//! The server's side: connected agents, attempts waiting for one, and the
//! `Agents` gRPC service.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
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

/// How many taken results the pool remembers, to tell a result sent again
/// from a stale one.
const TAKEN_KEPT: usize = 4096;

/// How long past an agent's lease the pool waits before it reports the
/// agent's attempts lost (and the engine may retry them): an agent that
/// lost its server kills its attempts before its lease ends on the
/// server's side, and this covers the kill (the processes and their pipes
/// seen gone).
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(5);

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
    /// The join token it presented (its id; empty for the shared token):
    /// with `id`, who it is. Another agent that names itself the same with
    /// another token is someone else.
    principal: String,
    /// The only namespace whose attempts it takes (its join token's).
    namespace: Option<String>,
    labels: BTreeMap<String, String>,
    capacity: u32,
    running: u32,
    version: String,
    /// The protocol revision it speaks.
    protocol: u32,
    tx: Option<Tx>,
    last_seen: Instant,
    /// Not heard from for its lease: it gets nothing new, and its attempts
    /// are lost once [`KILL_GRACE`] more has passed.
    lapsed: bool,
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
        self.serves(&task.ctx.namespace, &task.labels)
            && (task.ctx.item.is_none() || self.protocol >= dagcron_proto::ITEMS_SINCE)
    }

    /// Whether it may run a task of `namespace` needing `labels` (its join
    /// token may limit it to one namespace).
    fn serves(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.matches(labels) && self.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }

    fn has_room(&self) -> bool {
        self.tx.is_some() && !self.draining && !self.lapsed && self.running < self.capacity
    }
}

/// An attempt handed to an agent.
struct Inflight {
    session: u64,
    /// The id of the agent it was given to, and the join token that agent
    /// presented: only that agent's sessions may report on it (a
    /// reconnected session of the same agent, with the same token, may).
    agent: String,
    principal: String,
    task: RemoteTask,
    accepted: bool,
    sent: Instant,
    /// When the agent was told to stop it (the run was cancelled): its
    /// result, once the process is gone, ends the attempt.
    cancel_sent: Option<Instant>,
}

/// The fencing tokens of the last [`TAKEN_KEPT`] results taken.
#[derive(Default)]
struct Taken {
    /// Oldest first.
    order: VecDeque<i64>,
    tokens: HashSet<i64>,
}

impl Taken {
    fn insert(&mut self, token: i64) {
        self.tokens.insert(token);
        self.order.push_back(token);
        if self.order.len() > TAKEN_KEPT {
            if let Some(oldest) = self.order.pop_front() {
                self.tokens.remove(&oldest);
            }
        }
    }

    fn contains(&self, token: i64) -> bool {
        self.tokens.contains(&token)
    }
}

/// Puts an attempt in the queue: behind the others of its job, or (it
/// waited already) ahead of them.
fn wait(queue: &mut FairQueue<RemoteTask>, task: RemoteTask, front: bool) {
    let (ns, job) = (task.ctx.namespace.clone(), task.ctx.job.clone());
    let (priority, ready) = (task.priority, task.ready_us);
    if front {
        queue.push_front(&ns, &job, priority, ready, task);
    } else {
        queue.push_back(&ns, &job, priority, ready, task);
    }
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
    /// The attempts whose results were taken lately: an agent that cannot
    /// tell whether its report arrived (its connection failed as it sent
    /// it) sends it again, and that copy is not a stale result.
    taken: Taken,
    /// Results sent again for an attempt already taken, ignored.
    duplicate_results: u64,
    /// Messages about an attempt from an agent it was not given to.
    foreign_reports: u64,
}

impl State {
    /// Assigns waiting attempts to agents with room, in turn across
    /// namespaces and jobs; an attempt no agent can take now keeps its place.
    fn assign(&mut self, at: Moment, outs: &mut Outs) {
        // Stop as soon as no agent has room: the queue may be long.
        while self.agents.values().any(Agent::has_room) {
            let agents = &self.agents;
            let Some(task) = self.waiting.take(|t| {
                t.cancel.is_cancelled() || agents.values().any(|a| a.has_room() && a.takes(t))
            }) else {
                break;
            };
            if task.cancel.is_cancelled() {
                outs.report(task, cancelled_outcome(), None);
                continue;
            }
            let best = self
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
                wait(&mut self.waiting, task, true);
                break;
            };
            // Increasing, for systems that reject a stale writer, by a
            // random step of up to 2^20: an agent cannot tell another's
            // token from its own (and a message about an attempt is taken
            // only from the agent it was given to, whatever its token).
            let mut step = [0u8; 4];
            getrandom::fill(&mut step).expect("the operating system's random source");
            self.next_token += 1 + i64::from(u32::from_le_bytes(step) % (1 << 20));
            let token = self.next_token;
            let agent = self.agents.get_mut(&session).expect("agent");
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
                item: task.ctx.item.as_ref().map(|(index, value)| v1::MappedItem {
                    index: u32::try_from(*index).unwrap_or(u32::MAX),
                    value: value.clone(),
                }),
                upstream: task
                    .ctx
                    .outputs
                    .iter()
                    .map(|(t, o)| v1::TaskOutputs {
                        task: t.clone(),
                        outputs: o.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    })
                    .collect(),
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
                traceparent: task
                    .ctx
                    .trace
                    .as_ref()
                    .map(|t| t.traceparent.clone())
                    .unwrap_or_default(),
                tracestate: task
                    .ctx
                    .trace
                    .as_ref()
                    .and_then(|t| t.tracestate.clone())
                    .unwrap_or_default(),
            };
            let Some(tx) = agent.tx.as_ref().filter(|tx| !tx.is_closed()) else {
                agent.tx = None;
                wait(&mut self.waiting, task, true);
                continue;
            };
            outs.send(tx, at, server_message::Body::Assignment(assignment));
            agent.running += 1;
            let agent_id = agent.id.clone();
            let principal = agent.principal.clone();
            self.inflight.insert(
                token,
                Inflight {
                    session,
                    agent: agent_id,
                    principal,
                    task,
                    accepted: false,
                    sent: at.mono,
                    cancel_sent: None,
                },
            );
        }
    }

    /// Ends agents whose lease passed (their attempts are lost once the
    /// agent has killed them), sends unaccepted assignments elsewhere, and
    /// stops cancelled attempts.
    /// No agent, and no assignment out: the upkeep has nothing to do.
    fn nothing_to_watch(&self) -> bool {
        self.agents.is_empty() && self.inflight.is_empty()
    }

    fn upkeep(&mut self, config: &PoolConfig, at: Moment, outs: &mut Outs) {
        let state = self;
        let ttl = config.lease_ttl;
        let mut expired = vec![];
        for (session, agent) in &mut state.agents {
            let silent = at.mono.saturating_duration_since(agent.last_seen);
            if silent > ttl + KILL_GRACE {
                expired.push(*session);
            } else if silent > ttl && !agent.lapsed {
                agent.lapsed = true;
                tracing::warn!(agent = %agent.id, "agent lease ended; it gets no new attempts, and its attempts are lost once it has had time to kill them");
            }
        }
        for session in &expired {
            if let Some(agent) = state.agents.remove(session) {
                tracing::warn!(agent = %agent.id, "agent gone; its attempts are lost");
            }
        }
        let tokens: Vec<i64> = state.inflight.keys().copied().collect();
        for token in tokens {
            let inflight = &state.inflight[&token];
            let gone = !state.agents.contains_key(&inflight.session);
            // Not accepted in time by an agent heard from since: it did
            // not take it, and never will (an agent starts no assignment
            // older than the acceptance window). From an agent not heard
            // from, an acceptance may be on its way: it waits for the lease.
            // Any session of the same agent counts: after a reconnection the
            // agent speaks on its new one.
            let heard_since = state.agents.values().any(|a| {
                a.id == inflight.agent
                    && a.principal == inflight.principal
                    && a.last_seen.saturating_duration_since(inflight.sent) > config.accept_timeout
            });
            let late = !inflight.accepted
                && heard_since
                && at.mono.saturating_duration_since(inflight.sent) > config.accept_timeout;
            let cancelled = inflight.task.cancel.is_cancelled();
            if cancelled && !gone && !late {
                // Tell the agent once, then wait for its result (the process
                // is gone then); an agent that does not answer within the
                // accept timeout is not waited for any longer.
                let inflight = state.inflight.get_mut(&token).expect("inflight");
                match inflight.cancel_sent {
                    None => {
                        inflight.cancel_sent = Some(at.mono);
                        let cancel = v1::Cancel {
                            attempt: Some(attempt_ref(&inflight.task, token)),
                            reason: "cancelled".into(),
                        };
                        let session = inflight.session;
                        if let Some(tx) = state.agents.get(&session).and_then(|a| a.tx.as_ref()) {
                            outs.send(tx, at, server_message::Body::Cancel(cancel));
                        }
                        continue;
                    }
                    Some(sent)
                        if at.mono.saturating_duration_since(sent) <= config.accept_timeout =>
                    {
                        continue;
                    }
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
                        let cancel = v1::Cancel {
                            attempt: Some(attempt_ref(&inflight.task, token)),
                            reason: "not accepted in time".into(),
                        };
                        outs.send(tx, at, server_message::Body::Cancel(cancel));
                    }
                }
            }
            if gone {
                let lost = convert::lost("the agent running this attempt stopped");
                outs.report(inflight.task, lost, Some(inflight.agent));
            } else if cancelled {
                outs.report(inflight.task, dagcron_exec::Outcome {
                    error: Some(
                        "cancelled; the agent running it did not confirm in time that it stopped"
                            .into(),
                    ),
                    ..cancelled_outcome()
                }, Some(inflight.agent));
            } else {
                tracing::info!(run = inflight.task.ctx.run_id, task = %inflight.task.ctx.task_id, "assignment not accepted in time; trying another agent");
                wait(&mut state.waiting, inflight.task, true);
            }
        }
        state.assign(at, outs);
    }

    /// Whether the message about attempt `token` comes from the agent it
    /// was given to; counted and logged when it does not.
    fn sent_by_its_agent(&mut self, session: u64, token: i64) -> bool {
        let state = self;
        let Some(inflight) = state.inflight.get(&token) else {
            return true;
        };
        let sender = state.agents.get(&session);
        if sender.is_some_and(|a| a.id == inflight.agent && a.principal == inflight.principal) {
            return true;
        }
        state.foreign_reports += 1;
        tracing::warn!(
            token,
            sender = sender.map_or("?", |a| a.id.as_str()),
            owner = %inflight.agent,
            "refused a message about an attempt given to another agent"
        );
        false
    }

    fn on_result(&mut self, session: u64, result: &v1::Result, outs: &mut Outs) {
        let state = self;
        let token = result.attempt.as_ref().map_or(0, |a| a.fencing_token);
        if !state.sent_by_its_agent(session, token) {
            return;
        }
        let Some(inflight) = state.inflight.remove(&token) else {
            if state.taken.contains(token) {
                state.duplicate_results += 1;
                tracing::debug!(
                    token,
                    "a result sent again for an attempt already taken: ignored"
                );
            } else {
                state.stale_results += 1;
                tracing::warn!(token, "result with a stale fencing token refused");
            }
            return;
        };
        state.taken.insert(token);
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
        outs.report(inflight.task, outcome, Some(inflight.agent));
    }

    fn on_message(&mut self, session: u64, msg: v1::AgentMessage, at: Moment, outs: &mut Outs) {
        let state = self;
        let received_at = at.wall.as_microsecond();
        let Some(agent) = state.agents.get_mut(&session) else {
            return;
        };
        agent.last_seen = at.mono;
        agent.lapsed = false;
        match msg.body {
            Some(agent_message::Body::Heartbeat(h)) => {
                agent.last_heartbeat = at.wall;
                agent.clock_offset_us = h.clock_offset_us;
                agent.load = h.load;
                agent.draining = h.draining;
                if let Some(tx) = &agent.tx {
                    let ack = v1::HeartbeatAck {
                        agent_sent_at_us: msg.sent_at_us,
                        received_at_us: received_at,
                    };
                    outs.send(tx, at, server_message::Body::HeartbeatAck(ack));
                }
                // After a reconnection, the attempts it still runs are this
                // session's; attempts this pool never gave (a server that is
                // gone gave them, and they were lost with it) are stopped.
                let agent_id = agent.id.clone();
                let principal = agent.principal.clone();
                let tx = agent.tx.clone();
                for r in &h.running {
                    let Some(inflight) = state.inflight.get_mut(&r.fencing_token) else {
                        tracing::info!(agent = %agent_id, run = r.run_id, task = %r.task_id, "the agent runs an attempt this server did not give it; stopping it");
                        if let Some(tx) = &tx {
                            let cancel = v1::Cancel {
                                attempt: Some(r.clone()),
                                reason: "no longer this agent's: the server that gave it is gone"
                                    .into(),
                            };
                            outs.send(tx, at, server_message::Body::Cancel(cancel));
                        }
                        continue;
                    };
                    if inflight.agent != agent_id || inflight.principal != principal {
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
                let token = a.attempt.as_ref().map_or(0, |a| a.fencing_token);
                if !state.sent_by_its_agent(session, token) {
                    return;
                }
                if let Some(inflight) = state.inflight.get_mut(&token) {
                    inflight.accepted = true;
                } else if let Some(tx) = state.agents.get(&session).and_then(|a| a.tx.as_ref()) {
                    // Accepted too late: it went to another agent, or ended.
                    let cancel = v1::Cancel {
                        attempt: a.attempt,
                        reason: "accepted too late; the attempt went elsewhere".into(),
                    };
                    outs.send(tx, at, server_message::Body::Cancel(cancel));
                }
            }
            Some(agent_message::Body::Result(r)) => state.on_result(session, &r, outs),
            Some(agent_message::Body::Log(chunk)) => {
                let token = chunk.attempt.as_ref().map_or(0, |a| a.fencing_token);
                if !state.sent_by_its_agent(session, token) {
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
        state.assign(at, outs);
    }
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
    /// Signalled when an agent joins: the upkeep, asleep while there is
    /// nothing to watch, starts again.
    joined: Arc<tokio::sync::Notify>,
    /// The wall clock (the monotonic one is tokio's).
    clock: Arc<dyn dagcron_runtime::Clock>,
}

/// The instant the pool's state decides at: monotonic (for leases and
/// timeouts) and by the wall clock (stamped on messages). Passed in, so that
/// the state can be stepped at any instant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Moment {
    mono: Instant,
    wall: Timestamp,
}

type Tx = mpsc::UnboundedSender<Result<v1::ServerMessage, Status>>;

/// What the pool's state decided: carried out once its lock is released,
/// so that neither a slow agent stream nor the engine's report runs under it.
#[derive(Default)]
#[must_use]
pub(crate) struct Outs(Vec<Out>);

enum Out {
    Send(Tx, Box<v1::ServerMessage>),
    Report(
        dagcron_runtime::Report,
        dagcron_exec::Outcome,
        Option<String>,
    ),
}

impl Outs {
    fn send(&mut self, tx: &Tx, at: Moment, body: server_message::Body) {
        self.0
            .push(Out::Send(tx.clone(), Box::new(message(at, body))));
    }

    /// Reports `outcome` of `task`, run by `agent` (none: no agent took it).
    fn report(&mut self, task: RemoteTask, outcome: dagcron_exec::Outcome, agent: Option<String>) {
        self.0.push(Out::Report(task.report, outcome, agent));
    }

    fn carry_out(self) {
        for out in self.0 {
            match out {
                Out::Send(tx, msg) => {
                    let _ = tx.send(Ok(*msg));
                }
                Out::Report(report, outcome, agent) => report(outcome, agent),
            }
        }
    }
}

fn message(at: Moment, body: server_message::Body) -> v1::ServerMessage {
    v1::ServerMessage {
        sent_at_us: at.wall.as_microsecond(),
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
        AgentPool::with_clock(config, Arc::new(dagcron_runtime::SystemClock))
    }

    /// A pool reading the wall clock from `clock`.
    pub fn with_clock(config: PoolConfig, clock: Arc<dyn dagcron_runtime::Clock>) -> AgentPool {
        let state = State {
            next_token: clock.now().as_microsecond().saturating_mul(1024),
            ..State::default()
        };
        AgentPool {
            state: Arc::new(Mutex::new(state)),
            config,
            authenticate: Arc::default(),
            closing: CancellationToken::new(),
            joined: Arc::default(),
            clock,
        }
    }

    fn moment(&self) -> Moment {
        Moment {
            mono: tokio::time::Instant::now().into_std(),
            wall: self.clock.now(),
        }
    }

    /// Runs `f` on the state under its lock, then carries out what it decided.
    fn with_state<T>(&self, f: impl FnOnce(&mut State, Moment, &mut Outs) -> T) -> T {
        let at = self.moment();
        let mut outs = Outs::default();
        let out = f(&mut self.state.lock().expect("pool lock"), at, &mut outs);
        outs.carry_out();
        out
    }

    /// From now on, agents are let in by the join token `check` accepts
    /// (or by the shared token, if the pool has one). Only the first call counts.
    pub fn set_authenticate(&self, check: Authenticate) {
        let _ = self.authenticate.set(check);
    }

    /// Runs the pool's upkeep (expired agents, unaccepted assignments)
    /// until `stop`; then ends every agent's stream (the server can close
    /// its connections; the agents reconnect to whoever comes next). With
    /// no agent and no assignment out, the upkeep sleeps until an agent
    /// joins: a server that has no agents does not wake for them.
    pub fn start(&self, stop: CancellationToken) {
        let pool = self.clone();
        let every = (self.config.lease_ttl / 8).max(Duration::from_millis(50));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                if pool.state.lock().expect("pool lock").nothing_to_watch() {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = pool.joined.notified() => tick.reset(),
                    }
                    continue;
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {
                        let config = pool.config.clone();
                        pool.with_state(|state, at, outs| state.upkeep(&config, at, outs));
                    }
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

    /// Results received again for attempts already taken, and ignored.
    pub fn duplicate_results(&self) -> u64 {
        self.state.lock().expect("pool lock").duplicate_results
    }

    /// Where this pool's fencing tokens start. Tokens must never repeat
    /// across servers an agent may talk to: by default they start from the
    /// pool's creation time (in microseconds, times 1,024); a cluster node
    /// sets its epoch here (times 2^40), unique across the cluster.
    pub fn set_token_base(&self, base: i64) {
        self.state.lock().expect("pool lock").next_token = base;
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
        outputs: Default::default(),
        ending: dagcron_exec::Ending::Cancelled,
        exit_code: None,
        error: Some("cancelled before an agent took it".into()),
        log: vec![],
        lines: Vec::new(),
        start_error_us: None,
    }
}

impl Remote for AgentPool {
    fn submit(&self, task: RemoteTask) {
        self.with_state(|state, at, outs| {
            wait(&mut state.waiting, task, false);
            state.assign(at, outs);
        });
    }

    fn serves(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let state = self.state.lock().expect("pool lock");
        state
            .agents
            .values()
            .any(|a| a.tx.is_some() && !a.draining && a.serves(namespace, labels))
    }

    fn serves_instances(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let state = self.state.lock().expect("pool lock");
        state.agents.values().any(|a| {
            a.tx.is_some()
                && !a.draining
                && a.serves(namespace, labels)
                && a.protocol >= dagcron_proto::ITEMS_SINCE
        })
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
            let refusal = v1::Refusal {
                reason,
                supported_versions: SUPPORTED_VERSIONS.to_vec(),
            };
            let _ = tx.send(Ok(message(
                self.moment(),
                server_message::Body::Refusal(refusal),
            )));
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
        let welcome = v1::Welcome {
            session_id: String::new(),
            heartbeat_interval_ms: u32::try_from((self.config.lease_ttl / 4).as_millis())
                .unwrap_or(u32::MAX),
            lease_ttl_ms: u32::try_from(self.config.lease_ttl.as_millis()).unwrap_or(u32::MAX),
            protocol_version: PROTOCOL_VERSION,
        };
        let session = self.with_state(|state, at, outs| {
            state.next_session += 1;
            let session = state.next_session;
            // The agent's older sessions get nothing more: it left them.
            for old in state.agents.values_mut() {
                if old.id == hello.agent_id && old.principal == grant.token_id {
                    old.tx = None;
                }
            }
            // A reconnection replaces the agent's previous session, whose
            // attempts move over when the agent's heartbeat lists them.
            state.agents.insert(
                session,
                Agent {
                    id: hello.agent_id.clone(),
                    principal: grant.token_id.clone(),
                    namespace: grant.namespace.clone(),
                    labels: hello
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    capacity: hello.capacity,
                    running: 0,
                    version: hello.version.clone(),
                    protocol: hello.protocol_version,
                    tx: Some(tx.clone()),
                    last_seen: at.mono,
                    lapsed: false,
                    last_heartbeat: at.wall,
                    connected_at: at.wall,
                    clock_offset_us: 0,
                    load: 0.0,
                    draining: false,
                },
            );
            // The welcome first, then results of attempts that finished
            // while it was cut off, then work.
            let welcome = v1::Welcome {
                session_id: session.to_string(),
                ..welcome
            };
            outs.send(&tx, at, server_message::Body::Welcome(welcome));
            for r in &hello.unreported {
                state.on_result(session, r, outs);
            }
            state.assign(at, outs);
            session
        });
        self.joined.notify_one();
        tracing::info!(agent = %hello.agent_id, labels = ?hello.labels, capacity = hello.capacity, "agent connected");
        let pool = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = pool.closing.cancelled() => break,
                    msg = inbound.message() => match msg {
                        Ok(Some(msg)) => pool.with_state(|state, at, outs| state.on_message(session, msg, at, outs)),
                        Ok(None) | Err(_) => break,
                    },
                }
            }
            pool.disconnected(session);
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dagcron_exec::AttemptContext;

    fn task(
        report: impl FnOnce(dagcron_exec::Outcome, Option<String>) + Send + 'static,
    ) -> RemoteTask {
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
                scheduled_at: "2026-12-01T00:00:00Z".parse().unwrap(),
                idempotency_key: "k".into(),
                params: BTreeMap::new(),
                secrets: Default::default(),
                trace: None,
                policy: None,
            },
            executor: Executor::Noop,
            timeout: None,
            start_at: None,
            labels: BTreeMap::new(),
            max_output: 1 << 16,
            cancel: CancellationToken::new(),
            live: None,
            report: Box::new(report),
        }
    }

    fn agent(tx: Tx, at: Moment) -> Agent {
        Agent {
            id: "a1".into(),
            principal: "join-1".into(),
            namespace: None,
            labels: BTreeMap::new(),
            capacity: 1,
            running: 0,
            version: "test".into(),
            protocol: dagcron_proto::PROTOCOL_VERSION,
            tx: Some(tx),
            last_seen: at.mono,
            lapsed: false,
            last_heartbeat: at.wall,
            connected_at: at.wall,
            clock_offset_us: 0,
            load: 0.0,
            draining: false,
        }
    }

    fn at(mono: Instant, wall: &str) -> Moment {
        Moment {
            mono,
            wall: wall.parse().unwrap(),
        }
    }

    /// The state decides at the instants it is given; nothing is sent or
    /// reported until the decisions are carried out.
    #[test]
    fn the_state_decides_at_the_given_instant_and_acts_only_when_carried_out() {
        let start = Instant::now();
        let t0 = at(start, "2026-12-01T00:00:00Z");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut state = State::default();
        state.agents.insert(1, agent(tx, t0));
        let reported = Arc::new(Mutex::new(None));
        let r = reported.clone();
        state.waiting.push_back(
            "ns",
            "j",
            0,
            0,
            task(move |o, _| *r.lock().unwrap() = Some(o)),
        );
        let mut outs = Outs::default();
        state.assign(t0, &mut outs);
        assert!(rx.try_recv().is_err(), "nothing sent before carrying out");
        outs.carry_out();
        let sent = rx.try_recv().unwrap().unwrap();
        assert_eq!(sent.sent_at_us, t0.wall.as_microsecond());
        assert!(matches!(
            sent.body,
            Some(server_message::Body::Assignment(_))
        ));

        // Not accepted within the accept timeout: at the instant given, it
        // goes back to wait (the agent is told to drop it).
        let config = PoolConfig::default();
        let later = at(
            start + config.accept_timeout + Duration::from_millis(1),
            "2026-12-01T00:00:30Z",
        );
        let mut outs = Outs::default();
        state.agents.get_mut(&1).unwrap().last_seen = later.mono;
        state.upkeep(&config, later, &mut outs);
        outs.carry_out();
        let cancel = rx.try_recv().unwrap().unwrap();
        assert!(matches!(cancel.body, Some(server_message::Body::Cancel(_))));
        // ...and is assigned again at once, the agent having room again.
        let again = rx.try_recv().unwrap().unwrap();
        assert!(matches!(
            again.body,
            Some(server_message::Body::Assignment(_))
        ));
        assert!(reported.lock().unwrap().is_none());

        // The agent's lease ends: the attempt is lost, reported when carried out.
        let gone = at(later.mono + config.lease_ttl * 2, "2026-12-01T00:01:00Z");
        let mut outs = Outs::default();
        state.upkeep(&config, gone, &mut outs);
        assert!(
            reported.lock().unwrap().is_none(),
            "not reported under the lock"
        );
        outs.carry_out();
        let outcome = reported.lock().unwrap().take().unwrap();
        assert_eq!(
            outcome.ending,
            dagcron_exec::Ending::Failed(dagcron_core::Failure::Lost)
        );
    }

    /// A report ran while the pool's lock was held: a report that asked
    /// the pool anything (as the engine's may) deadlocked the pool.
    #[tokio::test]
    async fn regression_a_report_runs_after_the_pools_lock_is_released() {
        let pool = AgentPool::new(PoolConfig::default());
        let (tx, _rx) = mpsc::unbounded_channel();
        pool.with_state(|state, at, _| {
            state.agents.insert(1, agent(tx, at));
        });
        let (done, seen) = std::sync::mpsc::channel();
        let asks = pool.clone();
        let cancelled = task(move |o, _| {
            // Locks the pool: possible only once its lock is released.
            let _ = done.send((o.ending, asks.waiting()));
        });
        cancelled.cancel.cancel();
        let submitter = pool.clone();
        std::thread::spawn(move || submitter.submit(cancelled));
        let (ending, waiting) = seen
            .recv_timeout(Duration::from_secs(10))
            .expect("the report ran (it deadlocked under the lock)");
        assert_eq!(ending, dagcron_exec::Ending::Cancelled);
        assert_eq!(waiting, 0);
    }

    /// In a cluster, a node whose only matching agent was limited to another
    /// namespace kept a task for it (no agent here would ever take it)
    /// instead of handing it to the cluster.
    #[test]
    fn regression_an_agent_of_one_namespace_serves_only_that_namespace() {
        let pool = AgentPool::new(PoolConfig::default());
        let (tx, _rx) = mpsc::unbounded_channel();
        pool.with_state(|state, at, _| {
            let mut a = agent(tx, at);
            a.namespace = Some("team-a".into());
            state.agents.insert(1, a);
        });
        let labels = BTreeMap::new();
        assert!(pool.serves("team-a", &labels));
        assert!(!pool.serves("team-b", &labels));
    }

    /// An instance of a mapped task needs its item: an agent of a revision
    /// that does not know items never gets one (it would run `{{item}}`
    /// as written), while it still takes other attempts.
    #[test]
    fn an_instance_goes_only_to_an_agent_that_knows_items() {
        let t0 = at(Instant::now(), "2026-12-01T00:00:00Z");
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut old = agent(tx, t0);
        old.protocol = 1;
        let plain = task(|_, _| {});
        let mut mapped = task(|_, _| {});
        mapped.ctx.item = Some((0, "eu".into()));
        assert!(old.takes(&plain));
        assert!(!old.takes(&mapped));
        // In a cluster, a node whose agents are all of that revision hands
        // instances to the others.
        let pool = AgentPool::new(PoolConfig::default());
        let labels = BTreeMap::new();
        for protocol in [1, dagcron_proto::ITEMS_SINCE] {
            let (tx, _rx) = mpsc::unbounded_channel();
            pool.with_state(|state, at, _| {
                let mut a = agent(tx, at);
                a.protocol = protocol;
                state.agents.insert(1, a);
            });
            assert!(pool.serves("ns", &labels));
            assert_eq!(pool.serves_instances("ns", &labels), protocol >= 2);
        }
        old.protocol = dagcron_proto::ITEMS_SINCE;
        assert!(old.takes(&mapped));
    }

    /// An agent of another namespace's join token that names itself as the
    /// agent an attempt was given to (same id) cannot report for it: its
    /// result and its log are refused and counted, and the attempt stays
    /// with its agent, whose own result is taken.
    #[test]
    fn regression_an_agent_with_another_token_cannot_report_for_an_attempt() {
        let t0 = at(Instant::now(), "2026-12-01T00:00:00Z");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (forger_tx, _forger_rx) = mpsc::unbounded_channel();
        let mut state = State::default();
        let mut owner = agent(tx, t0);
        owner.principal = "join-beta".into();
        state.agents.insert(1, owner);
        let mut forger = agent(forger_tx, t0);
        forger.principal = "join-alpha".into();
        forger.capacity = 0;
        state.agents.insert(2, forger);
        let reported = Arc::new(Mutex::new(None));
        let r = reported.clone();
        state.waiting.push_back(
            "ns",
            "j",
            0,
            0,
            task(move |o, _| *r.lock().unwrap() = Some(o)),
        );
        let mut outs = Outs::default();
        state.assign(t0, &mut outs);
        outs.carry_out();
        let Some(server_message::Body::Assignment(a)) = rx.try_recv().unwrap().unwrap().body else {
            panic!("assigned to its agent");
        };
        let attempt = a.attempt.unwrap();
        let result = |exit_code| v1::AgentMessage {
            body: Some(agent_message::Body::Result(v1::Result {
                attempt: Some(attempt.clone()),
                exit_code,
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut outs = Outs::default();
        state.on_message(2, result(Some(0)), t0, &mut outs);
        outs.carry_out();
        assert_eq!(state.foreign_reports, 1, "refused and counted");
        assert!(reported.lock().unwrap().is_none(), "the attempt goes on");
        assert_eq!(state.inflight.len(), 1);
        let mut outs = Outs::default();
        state.on_message(1, result(Some(3)), t0, &mut outs);
        outs.carry_out();
        let outcome = reported.lock().unwrap().take().expect("its agent's result");
        assert_eq!(outcome.exit_code, Some(3));
    }
}
