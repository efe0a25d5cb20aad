//! The protocol between dagcron servers and remote worker agents.
//!
//! The messages and the `Agents` service come from
//! `proto/dagcron/agent/v1/agent.proto`, compiled at build time without a
//! system `protoc`. This crate adds what both sides need around them: the
//! protocol version check and the clock offset estimate.
//!
//! # How it works
//!
//! The protocol with remote agents: `proto/dagcron/agent/v1/agent.proto`
//! (one bidirectional stream per agent), compiled at build time by protox and
//! tonic-prost-build (no system `protoc`), plus the version check and the
//! NTP-style clock offset estimate both sides use.

/// Generated code of `dagcron.agent.v1` (documented in the `.proto` file).
#[allow(missing_docs)]
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("dagcron.agent.v1");
}

pub mod clock;
pub mod version;

pub use clock::{ClockEstimate, ClockSample};
pub use version::{ITEMS_SINCE, PROTOCOL_VERSION, SUPPORTED_VERSIONS, VersionError, check_version};
