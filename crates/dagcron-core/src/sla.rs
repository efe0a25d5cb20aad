//! Service-level alerts: a scheduled run that has not succeeded by its
//! deadline is told as `sla_missed`, once.
//!
//! `sla: { finish_within: 2h }` counts from the scheduled instant;
//! `sla: { finish_by: "06:00" }` is the first 06:00 in the job's zone at or
//! after the scheduled instant (on a day whose clocks skip it, moved by
//! the jump: 02:30 becomes 03:30; on a day that has it twice, the first). A fire that made
//! no run (skipped, missed) misses its SLA too, and a run that succeeds
//! after its deadline has still missed it.
//!
//! The decisions are pure ([`SlaSpec::deadline`], [`missed`]); the engine
//! arms a timer at each deadline and asks them there.

use jiff::civil::Time;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::duration::Dur;
use crate::model::ValidationError;
use crate::state::RunState;

/// A job's `sla`: one of its two fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlaSpec {
    /// Succeeded at most this long after the scheduled instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_within: Option<Dur>,
    /// Succeeded by this time of day (`HH:MM` or `HH:MM:SS`) in the job's
    /// zone, the first at or after the scheduled instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_by: Option<String>,
}

/// The longest `finish_within`.
pub const MAX_WITHIN: SignedDuration = SignedDuration::from_hours(24 * 31);

impl SlaSpec {
    /// Every problem of the SLA, at `at`.
    pub fn check(&self, at: &str) -> Vec<ValidationError> {
        let err = |path: String, message: String| ValidationError {
            path,
            message,
            span: None,
        };
        match (&self.finish_within, &self.finish_by) {
            (Some(_), Some(_)) | (None, None) => vec![err(
                at.to_string(),
                "an sla has one of finish_within (such as 2h) or finish_by (such as \"06:00\")"
                    .into(),
            )],
            (Some(d), None) => {
                let d = SignedDuration::try_from(d.0).unwrap_or(SignedDuration::MAX);
                if d <= SignedDuration::ZERO || d > MAX_WITHIN {
                    vec![err(
                        format!("{at}.finish_within"),
                        "must be more than 0 and at most 31 days".into(),
                    )]
                } else {
                    vec![]
                }
            }
            (None, Some(by)) => match parse_time(by) {
                Ok(_) => vec![],
                Err(why) => vec![err(format!("{at}.finish_by"), why)],
            },
        }
    }

    /// How long after its scheduled instant a fire's deadline can be, at
    /// most: how far back a fire may still wait for its judgement.
    pub fn reach(&self) -> SignedDuration {
        match &self.finish_within {
            Some(d) => SignedDuration::try_from(d.0)
                .unwrap_or(MAX_WITHIN)
                .min(MAX_WITHIN),
            // A day and the clocks' largest jump.
            None => SignedDuration::from_hours(26),
        }
    }

    /// The deadline of the run scheduled for `scheduled`, in zone `tz`.
    pub fn deadline(&self, scheduled: Timestamp, tz: &TimeZone) -> Timestamp {
        if let Some(d) = &self.finish_within {
            let d = SignedDuration::try_from(d.0).unwrap_or(MAX_WITHIN);
            return scheduled.saturating_add(d).unwrap_or(Timestamp::MAX);
        }
        let Some(by) = self.finish_by.as_deref().and_then(|t| parse_time(t).ok()) else {
            return scheduled;
        };
        let mut date = tz.to_datetime(scheduled).date();
        // The scheduled day's time, or the next day's if it has passed.
        for _ in 0..3 {
            // `compatible`: a time in a gap is moved by the gap's length, a
            // time that comes twice is the first.
            if let Ok(at) = tz.to_ambiguous_timestamp(date.to_datetime(by)).compatible() {
                if at >= scheduled {
                    return at;
                }
            }
            match date.tomorrow() {
                Ok(next) => date = next,
                Err(_) => break,
            }
        }
        Timestamp::MAX
    }
}

/// `HH:MM` or `HH:MM:SS`.
fn parse_time(text: &str) -> Result<Time, String> {
    let bad = || format!("invalid time of day {text:?}: write it as HH:MM, such as \"06:00\"");
    let parts: Vec<&str> = text.split(':').collect();
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.len() != 2) {
        return Err(bad());
    }
    let n: Vec<i8> = parts
        .iter()
        .map(|p| p.parse::<i8>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    Time::new(n[0], n[1], n.get(2).copied().unwrap_or(0), 0).map_err(|_| bad())
}

/// Whether the run of a fire missed its deadline: it made no run, its run
/// had not ended by then, or ended other than succeeded, or succeeded
/// late. `run` is the run's state and when it ended (none: no run).
pub fn missed(deadline: Timestamp, run: Option<(RunState, Option<Timestamp>)>) -> bool {
    match run {
        Some((RunState::Succeeded, Some(ended))) => ended > deadline,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn by(t: &str) -> SlaSpec {
        SlaSpec {
            finish_within: None,
            finish_by: Some(t.into()),
        }
    }

    #[test]
    fn within_counts_from_the_scheduled_instant() {
        let s = SlaSpec {
            finish_within: Some(Dur(std::time::Duration::from_secs(7200))),
            finish_by: None,
        };
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        assert_eq!(
            s.deadline(ts("2026-03-29T00:30:00Z"), &berlin),
            ts("2026-03-29T02:30:00Z"),
            "an elapsed duration, whatever the clocks do"
        );
    }

    #[test]
    fn by_is_the_next_such_time_in_the_zone_across_dst() {
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        // A normal winter day: 06:00 CET is 05:00 UTC.
        assert_eq!(
            by("06:00").deadline(ts("2026-01-10T02:00:00Z"), &berlin),
            ts("2026-01-10T05:00:00Z")
        );
        // Scheduled after 06:00: the next day's.
        assert_eq!(
            by("06:00").deadline(ts("2026-01-10T06:00:00Z"), &berlin),
            ts("2026-01-11T05:00:00Z")
        );
        // The spring-forward day: 06:00 CEST is 04:00 UTC.
        assert_eq!(
            by("06:00").deadline(ts("2026-03-29T00:30:00Z"), &berlin),
            ts("2026-03-29T04:00:00Z")
        );
        // 02:30 does not exist that day: moved by the jump, to 03:30 CEST.
        assert_eq!(
            by("02:30").deadline(ts("2026-03-28T23:00:00Z"), &berlin),
            ts("2026-03-29T01:30:00Z")
        );
        // 02:30 comes twice on the fall-back day: the first (CEST).
        assert_eq!(
            by("02:30").deadline(ts("2026-10-24T23:00:00Z"), &berlin),
            ts("2026-10-25T00:30:00Z")
        );
    }

    #[test]
    fn a_miss_is_no_success_by_the_deadline() {
        let d = ts("2026-01-10T05:00:00Z");
        assert!(!missed(
            d,
            Some((RunState::Succeeded, Some(ts("2026-01-10T04:59:59Z"))))
        ));
        assert!(!missed(d, Some((RunState::Succeeded, Some(d)))));
        assert!(
            missed(
                d,
                Some((RunState::Succeeded, Some(ts("2026-01-10T05:00:01Z"))))
            ),
            "late is a miss"
        );
        assert!(missed(
            d,
            Some((RunState::Failed, Some(ts("2026-01-10T04:00:00Z"))))
        ));
        assert!(missed(d, Some((RunState::Running, None))));
        assert!(missed(d, None), "no run at all");
    }

    #[test]
    fn its_problems_are_reported_at_their_paths() {
        let both = SlaSpec {
            finish_within: Some(Dur(std::time::Duration::from_secs(60))),
            finish_by: Some("06:00".into()),
        };
        assert_eq!(both.check("jobs[0].sla")[0].path, "jobs[0].sla");
        for bad in ["6:00", "25:00", "06:60", "06", "06:00:00:00", "ab:cd"] {
            let e = by(bad).check("jobs[0].sla");
            assert_eq!(e[0].path, "jobs[0].sla.finish_by", "{bad}");
        }
        assert!(by("06:00:30").check("s").is_empty());
        let zero = SlaSpec {
            finish_within: Some(Dur(std::time::Duration::ZERO)),
            finish_by: None,
        };
        assert_eq!(zero.check("s")[0].path, "s.finish_within");
    }
}
