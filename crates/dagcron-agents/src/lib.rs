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

pub mod agent;
mod convert;
mod fair;
mod pool;

pub use pool::{AgentGrant, AgentPool, Authenticate, ClientCertificate, PoolConfig, WorkerInfo};
