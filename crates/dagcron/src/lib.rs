//! The server's wiring as a library, beside the `dagcron` binary
//! (`main.rs`, the command line): [`serve::run`] takes its listener and its
//! shutdown signal, so that tests start a real server in-process on
//! `127.0.0.1:0`.

#[cfg(feature = "otlp")]
mod listen;
mod otlp;
pub mod serve;
mod tls;
