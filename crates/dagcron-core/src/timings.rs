//! What a scheduler keeps of each job, made without the rest of the job:
//! a [`Timing`] read straight from a job's stored canonical form (at
//! start-up, a million times), and compiled timetables shared between the
//! jobs that have the same schedules.
//!
//! Sharing is exact: two jobs share timetables only when everything their
//! compilation depends on is equal (the expressions, the zone, the anchor,
//! the daylight-saving policies) and no expression can contain `H`, whose
//! values depend on the job's identity. What is the job's own (the jitter
//! seed, dates, misfire policy, calendars) stays in each job's `Timing`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use dagcron_cron::{Schedule, Timetable};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

use crate::after::AfterTrigger;
use crate::calendar::Calendar;
use crate::duration::Dur;
use crate::message::NatsTrigger;
use crate::model::{
    Exclude, GapPolicy, Job, Misfire, OverlapPolicy, Schedules, Timing, TimingFields, check_anchor,
    default_catchup, default_tz, schedule_options,
};
use crate::notify::NotifyRule;
use crate::sla::SlaSpec;

/// How many distinct schedules a cache keeps before it starts over (a
/// bound on its memory; sharing is an optimization, never needed).
const MAX_SHARED: usize = 65_536;

/// Compiled timetables by what they were compiled from.
#[derive(Default)]
pub struct TimetableCache {
    shared: HashMap<Box<str>, Arc<[Timetable]>>,
    key: String,
}

impl std::fmt::Debug for TimetableCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimetableCache")
            .field("shared", &self.shared.len())
            .finish()
    }
}

/// What a schedule's compilation depends on, besides the job's identity.
struct Inputs<'a> {
    schedules: &'a [String],
    timezone: &'a str,
    anchor: Option<&'a str>,
    dst_gap: Option<GapPolicy>,
    dst_overlap: Option<OverlapPolicy>,
}

impl TimetableCache {
    /// An empty cache.
    pub fn new() -> TimetableCache {
        TimetableCache::default()
    }

    /// How many distinct schedules it holds.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty()
    }

    /// Makes the key of `inputs` in `self.key`; false if they cannot be
    /// shared (an expression may use `H`, seeded by the job's identity).
    fn make_key(&mut self, inputs: &Inputs<'_>) -> bool {
        if inputs
            .schedules
            .iter()
            .any(|e| e.bytes().any(|b| b.eq_ignore_ascii_case(&b'h')))
        {
            return false;
        }
        let key = &mut self.key;
        key.clear();
        // Each part with its length, so that no two inputs make one key.
        let mut part = |s: &str| {
            let _ = write!(key, "{}:{s};", s.len());
        };
        part(inputs.timezone);
        part(inputs.anchor.unwrap_or("-"));
        part(match inputs.dst_gap {
            None => "-",
            Some(GapPolicy::Shift) => "shift",
            Some(GapPolicy::Skip) => "skip",
        });
        part(match inputs.dst_overlap {
            None => "-",
            Some(OverlapPolicy::First) => "first",
            Some(OverlapPolicy::Last) => "last",
            Some(OverlapPolicy::Both) => "both",
        });
        for e in inputs.schedules {
            part(e);
        }
        true
    }

    fn remember(&mut self, timetables: &Arc<[Timetable]>) {
        if self.shared.len() >= MAX_SHARED {
            self.shared.clear();
        }
        self.shared
            .insert(self.key.as_str().into(), timetables.clone());
    }

    /// The timetables of a validated job, shared with those of an earlier
    /// job of the same schedules if there was one.
    pub fn share(&mut self, job: &Job) -> Arc<[Timetable]> {
        let inputs = Inputs {
            schedules: job.spec.schedule.as_ref().map_or(&[], |s| s.as_slice()),
            timezone: &job.spec.timezone,
            anchor: job.spec.anchor.as_deref(),
            dst_gap: job.spec.dst_gap,
            dst_overlap: job.spec.dst_overlap,
        };
        let shareable = self.make_key(&inputs);
        if shareable {
            if let Some(t) = self.shared.get(self.key.as_str()) {
                return t.clone();
            }
        }
        let timetables: Arc<[Timetable]> = job
            .schedules
            .iter()
            .map(|s| s.timetable().clone())
            .collect();
        if shareable {
            self.remember(&timetables);
        }
        timetables
    }
}

/// A job's timing as read back from the store, the `paused` of the file
/// it was applied from, and the job whose runs' ends start it.
#[derive(Clone, Debug)]
pub struct StoredTiming {
    /// When it fires.
    pub timing: Timing,
    /// The file's `paused`.
    pub file_paused: bool,
    /// Its `after` trigger.
    pub after: Option<AfterTrigger>,
    /// Whether it has an `sla`.
    pub sla: bool,
    /// Its notification rules about fires (see
    /// [`crate::notify::fire_rules`]).
    pub fire_rules: Vec<NotifyRule>,
    /// Its `nats` trigger.
    pub nats: Option<NatsTrigger>,
}

/// The fields of a stored spec that its timing is made from; the others
/// (tasks, policies) are skipped unread.
#[derive(Deserialize)]
struct Fields {
    name: String,
    schedule: Option<Schedules>,
    #[serde(default = "default_tz")]
    timezone: String,
    dst_gap: Option<GapPolicy>,
    dst_overlap: Option<OverlapPolicy>,
    #[serde(default)]
    anchor: Option<String>,
    #[serde(default)]
    misfire: Misfire,
    #[serde(default = "default_catchup")]
    max_catchup: u32,
    #[serde(default)]
    send_ahead: Option<Dur>,
    #[serde(default)]
    jitter: Option<Dur>,
    #[serde(default)]
    exclude: Vec<Exclude>,
    #[serde(default)]
    paused: bool,
    start_date: Option<Timestamp>,
    end_date: Option<Timestamp>,
    #[serde(default)]
    after: Option<AfterTrigger>,
    #[serde(default)]
    sla: Option<SlaSpec>,
    #[serde(default)]
    notify: Vec<NotifyRule>,
    #[serde(default)]
    nats: Option<NatsTrigger>,
}

/// The same fields borrowed from a job, as they are stored beside it for
/// start-up (see [`Job::timing_json`]), each written out (none left to a
/// default, so that a later default cannot change a stored job's fires).
#[derive(Serialize)]
struct FieldsOf<'a> {
    name: &'a str,
    schedule: &'a Option<Schedules>,
    timezone: &'a str,
    dst_gap: Option<GapPolicy>,
    dst_overlap: Option<OverlapPolicy>,
    anchor: &'a Option<String>,
    misfire: Misfire,
    max_catchup: u32,
    send_ahead: Option<Dur>,
    jitter: Option<Dur>,
    exclude: &'a [Exclude],
    paused: bool,
    start_date: Option<Timestamp>,
    end_date: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: &'a Option<AfterTrigger>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sla: &'a Option<SlaSpec>,
    /// Only its rules about fires (see [`crate::notify::fire_rules`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notify: Vec<NotifyRule>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nats: &'a Option<NatsTrigger>,
}

impl Job {
    /// What its timing is made from, as JSON: the fields of its canonical
    /// form that [`TimetableCache::timing_from_canonical`] reads (a third
    /// of the canonical form for a small job; what start-up reads).
    pub fn timing_json(&self) -> String {
        let s = &self.spec;
        serde_json::to_string(&FieldsOf {
            name: &s.name,
            schedule: &s.schedule,
            timezone: &s.timezone,
            dst_gap: s.dst_gap,
            dst_overlap: s.dst_overlap,
            anchor: &s.anchor,
            misfire: s.misfire,
            max_catchup: s.max_catchup,
            send_ahead: s.send_ahead,
            jitter: s.jitter,
            exclude: &s.exclude,
            paused: s.paused,
            start_date: s.start_date,
            end_date: s.end_date,
            after: &s.after,
            sla: &s.sla,
            notify: crate::notify::fire_rules(&s.notify),
            nats: &s.nats,
        })
        .expect("timing fields serialize")
    }
}

impl TimetableCache {
    /// The timing of a job from its canonical form (see
    /// [`Job::canonical`]) or its [`Job::timing_json`], equal to
    /// `Job::from_canonical(..)?.timing()` for every spec that validates. Only what the timing depends on is
    /// read and checked again (the zone, the anchor, the expressions, the
    /// calendars): the rest was validated when the job was applied, and is
    /// validated again whenever the whole job is read for a run.
    pub fn timing_from_canonical(
        &mut self,
        namespace: &str,
        canonical: &str,
    ) -> Result<StoredTiming, String> {
        let f: Fields = serde_json::from_str(canonical).map_err(|e| e.to_string())?;
        let schedules = f.schedule.as_ref().map_or(&[][..], |s| s.as_slice());
        let inputs = Inputs {
            schedules,
            timezone: &f.timezone,
            anchor: f.anchor.as_deref(),
            dst_gap: f.dst_gap,
            dst_overlap: f.dst_overlap,
        };
        let shareable = self.make_key(&inputs);
        let cached = shareable
            .then(|| self.shared.get(self.key.as_str()).cloned())
            .flatten();
        let timetables = match cached {
            Some(t) => t,
            None => {
                let t = compile(namespace, &f.name, &inputs)?;
                if shareable {
                    self.remember(&t);
                }
                t
            }
        };
        let mut calendars = Vec::with_capacity(f.exclude.len());
        for (k, e) in f.exclude.iter().enumerate() {
            match e {
                Exclude::Calendar(cal) => calendars.push(
                    Calendar::compile(cal, &format!("exclude[{k}]"))
                        .map_err(|e| crate::ValidationErrors(e).to_string())?,
                ),
                Exclude::Name(name) => {
                    return Err(format!("exclude[{k}]: unknown calendar {name:?}"));
                }
            }
        }
        Ok(StoredTiming {
            timing: Timing::new(
                namespace,
                &f.name,
                timetables,
                TimingFields {
                    start_date: f.start_date,
                    end_date: f.end_date,
                    misfire: f.misfire,
                    max_catchup: f.max_catchup,
                    send_ahead: f.send_ahead,
                    jitter: f.jitter,
                },
                calendars.into(),
            ),
            file_paused: f.paused,
            after: f.after,
            sla: f.sla.is_some(),
            fire_rules: crate::notify::fire_rules(&f.notify),
            nats: f.nats,
        })
    }
}

/// Compiles a job's schedules as validation does.
fn compile(namespace: &str, name: &str, inputs: &Inputs<'_>) -> Result<Arc<[Timetable]>, String> {
    let tz = TimeZone::get(inputs.timezone)
        .map_err(|_| format!("unknown time zone {:?}", inputs.timezone))?;
    let anchor = inputs.anchor.map(check_anchor).transpose()?;
    let options = schedule_options(
        namespace,
        name,
        tz,
        anchor,
        inputs.dst_gap,
        inputs.dst_overlap,
    );
    inputs
        .schedules
        .iter()
        .map(|expr| {
            Schedule::parse_with(expr, &options)
                .map(|s| s.timetable().clone())
                .map_err(|e| format!("invalid cron expression {expr:?}: {}", e.message))
        })
        .collect()
}

#[cfg(test)]
mod tests;
