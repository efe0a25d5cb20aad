//! The route handlers, a file per resource. Each reads from the store
//! or sends a change to the engine; what they share (the state, the look-ups,
//! the JSON error shape) is in the crate's root modules.

pub mod audit;
pub(crate) mod health;
pub(crate) mod hooks;
pub(crate) mod interventions;
pub(crate) mod jobs;
pub(crate) mod notifications;
pub(crate) mod operations;
pub mod policy;
pub mod quotas;
pub(crate) mod reruns;
pub(crate) mod retention;
pub(crate) mod runs;
pub mod schedules;
pub mod secrets;
pub mod tokens;
pub(crate) mod upcoming;
pub(crate) mod versions;
