//! Schedules across jobs: the hot-spot report of seconds at which many
//! jobs fire together.

use dagcron_core::hotspots::{HotJob, Hotspot, Report};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The seconds of a window at which the most jobs fire, busiest first,
/// with how to spread them.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HotspotReport {
    /// The first instant counted (the next whole second after the call).
    #[schema(value_type = String, format = DateTime)]
    pub from: Timestamp,
    /// The first instant after the window.
    #[schema(value_type = String, format = DateTime)]
    pub to: Timestamp,
    /// Jobs counted: those the token may read, not paused.
    pub jobs: u64,
    /// Their fires in the window.
    pub fires: u64,
    /// The largest number of fires due in one second of the window.
    pub peak_per_second: u32,
    /// Seconds at which two jobs or more fire, by count (descending), then
    /// time; at most `top`.
    pub hotspots: Vec<HotspotAnswer>,
    /// Set when a limit stopped the count: what was left out, and how to
    /// count everything.
    pub capped: Option<String>,
}

/// One second at which several jobs fire.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HotspotAnswer {
    /// The second.
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    /// How many jobs fire then (all of them, listed or not).
    pub count: u32,
    /// The first 20 of them.
    pub jobs: Vec<HotJobAnswer>,
    /// How to spread them, in a sentence.
    pub advice: String,
}

/// A job that fires at a hot second.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HotJobAnswer {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The expression that fires then.
    pub expression: String,
    /// The same expression with `H` where it fixes a minute or a second
    /// (none: nothing to spread that way).
    pub suggestion: Option<String>,
}

impl From<&Report> for HotspotReport {
    fn from(r: &Report) -> HotspotReport {
        HotspotReport {
            from: r.from,
            to: r.to,
            jobs: r.jobs as u64,
            fires: r.fires,
            peak_per_second: r.peak_per_second,
            hotspots: r.hotspots.iter().map(HotspotAnswer::from).collect(),
            capped: r.capped.map(|cap| {
                format!(
                    "the count stopped after {} jobs ({cap}): ask for one namespace or a shorter window to count every job",
                    r.jobs
                )
            }),
        }
    }
}

impl From<&Hotspot> for HotspotAnswer {
    fn from(h: &Hotspot) -> HotspotAnswer {
        HotspotAnswer {
            at: h.at,
            count: h.count,
            jobs: h.jobs.iter().map(HotJobAnswer::from).collect(),
            advice: h.advice.clone(),
        }
    }
}

impl From<&HotJob> for HotJobAnswer {
    fn from(j: &HotJob) -> HotJobAnswer {
        HotJobAnswer {
            namespace: j.namespace.clone(),
            name: j.name.clone(),
            expression: j.expression.clone(),
            suggestion: j.suggestion.clone(),
        }
    }
}
