//! The pages, one module per view.

pub(crate) mod audit;
pub(crate) mod cluster;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod notifications;
pub(crate) mod overview;
pub(crate) mod playground;
pub(crate) mod preferences;
pub(crate) mod run;
pub(crate) mod runs;
pub(crate) mod signin;
