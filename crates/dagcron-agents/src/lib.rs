//! Remote worker agents.
//!
//! The server side is an [`AgentPool`]: the engine hands it attempts of
//! tasks that name `run_on`, and it assigns each to a connected agent whose
//! labels match and that has room, over that agent's gRPC stream (the
//! `Agents` service of `dagcron-proto`). Each assignment carries a fencing
//! token; a result with a token that is no longer current is refused. An
//! agent that stops heart-beating or disconnects keeps its attempts for the
//! lease TTL (it may reconnect and report them); after that they are lost
//! and follow the task's delivery policy.
//!
//! The agent side is [`agent::run`]: it connects, registers, runs what it is
//! assigned with the same executors as the server's pool, reconnects with
//! backoff and jitter, reports again what finished while it was cut off, and
//! drains on shutdown.
//!
//! # How it works
//!
//! `pool.rs`, the server's `AgentPool`: it implements the engine's `Remote`
//! trait (attempts of tasks with `run_on`) and the gRPC `Agents` service
//! (served on the API's port). Tasks of every kind travel (`convert.rs`): a
//! WebAssembly task runs in the agent's own sandbox, its module read from
//! the agent's disk. Attempts wait FIFO until an agent with matching
//! labels has room (the least loaded wins); each assignment has a fencing
//! token, and a result whose token is no longer current is refused. Agents
//! that vanish keep their attempts for the agent lease, get nothing new after
//! it, and their attempts are reported lost `KILL_GRACE` (5 s) later. The
//! agent keeps the other side of that rule: it counts its lease from the last
//! heartbeat the server acknowledged and, three quarters of the way, kills
//! every running attempt if no word came (a watchdog apart from the stream,
//! which may stall), so a retry never runs beside the attempt it replaces;
//! such an attempt ends failed (its retries take it up), not cancelled.
//! It notices a silent cut by its own clock (no message for two heartbeat
//! intervals and a second: it reconnects), starts no assignment older than
//! 4 s by its estimate of the server's clock, and the server cancels an
//! acceptance that comes after the assignment went elsewhere; an assignment
//! not accepted in time goes to another agent only once its agent has been
//! heard from since. The pool is pure state plus a shell: assignment, upkeep and
//! the agents' messages decide at the instant they are given (`Moment`:
//! monotonic and wall time) and return what to send and report (`Outs`),
//! carried out once the pool's lock is released. `agent.rs` is the agent (`dagcron worker`). The output of a
//! running attempt, local or remote, is kept in a live log (`exec::LiveLog`,
//! fed by the shell executor as output comes, or by the agent's log chunks)
//! that `GET .../log?follow=true` streams until the attempt ends.
//!
//! Fencing tokens never repeat across servers an agent may reach: a cluster
//! node's start at its epoch times 2^40, a lone server's at its start time. In
//! a cluster, the engine hands a remote task to the shared attempts (with its
//! labels, in `shared_attempts.run_on`) when no agent of its own pool matches; a node
//! claims such attempts for its agents with room (`run_on <@ agent labels`),
//! runs them through its pool, and records the outcome under its epoch, as
//! for any shared attempt. An agent reporting a running attempt whose token
//! the pool never issued (its server died) is told to stop it. A timed
//! attempt carries the instant to start at; the agent converts it to its own
//! clock with the measured offset, sleeps until 2 ms before and then polls
//! the clock, and reports the start error.

pub mod agent;
mod convert;
mod fair;
mod pool;

pub use pool::{AgentGrant, AgentPool, Authenticate, ClientCertificate, PoolConfig, WorkerInfo};
