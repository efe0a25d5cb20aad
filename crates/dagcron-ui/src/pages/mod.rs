//! The pages, one module per view.

pub(crate) mod cluster;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod notifications;
pub(crate) mod playground;
pub(crate) mod run;
pub(crate) mod signin;
