//! The server's wiring as a library, beside the `dagcron` binary
//! (`main.rs`, the command line): [`serve::run`] takes its listener and its
//! shutdown signal, so that tests start a real server in-process on
//! `127.0.0.1:0`.
//!
//! # How it works
//!
//! The binary and a small library beside it. The library is the server's
//! wiring (`serve/`: `config.rs`, `backend.rs`, `mod.rs`): the configuration merged once (flags over the file
//! over defaults), one runner for every backend (embedded SQLite, or a
//! PostgreSQL cluster member with its coordinator) and
//! `run(config, listener, shutdown)`, which tests call in-process on a
//! listener bound to `127.0.0.1:0`. The binary (`main.rs`) sets mimalloc as
//! the allocator (so does the engine benchmark, which stands for it), installs logging
//! and the signal handlers, binds the port and calls it; it also has `worker`
//! (a remote agent), the client commands over the REST API (`client/`, a
//! file per group of commands; answers are read into the API's wire types
//! and printed, as JSON or as text, by `client/output.rs`), and the `cron`
//! and `dag` offline commands. It is the only crate that uses `anyhow`,
//! reads the environment or installs logging. `otlp.rs` (behind the default
//! `otlp` feature) is the `SpanSink` that sends spans over OTLP/gRPC from a
//! bounded queue, set up by the `OTEL_*` variables. `listen.rs` serves the
//! API (plain or TLS) and the metrics address: a bound on connections per
//! client address, a timeout for a connection's first bytes and HTTP/1
//! headers, and a bounded wait for open connections at shutdown.

#[cfg(feature = "otlp")]
mod listen;
mod otlp;
pub mod serve;
mod tls;
