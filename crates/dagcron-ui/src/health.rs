//! The schedule-health timeline: every fire the schedule expected in a
//! window, beside what the fire ledger says happened to it, with the
//! reason. Pure: the expected fires, the ledger, the runs' starts and the
//! instant are arguments.

use std::collections::{BTreeMap, HashMap};

use dagcron_core::policy::FireOutcome;
use dagcron_store::{FireRecord, RunId};
use jiff::{SignedDuration, Timestamp};

/// A run that started this much after its fire was late.
pub(crate) const LATE: SignedDuration = SignedDuration::from_secs(1);
/// A fire this recent with no record yet is not called missing: the
/// scheduler may be recording it.
pub(crate) const GRACE: SignedDuration = SignedDuration::from_secs(5);

/// One line of the timeline.
#[derive(Debug, PartialEq)]
pub(crate) struct Line {
    pub(crate) at: Timestamp,
    /// Whether the current schedule expects this fire.
    pub(crate) expected: bool,
    /// A class name: an outcome (`fired`, `skipped_overlap`, ...), or
    /// `late`, `missing`, `upcoming`.
    pub(crate) what: &'static str,
    pub(crate) reason: String,
    pub(crate) run: Option<RunId>,
}

/// Joins the expected fires with the ledger's records of `[from, to)`.
/// `started` gives, for the runs known, when they started.
pub(crate) fn timeline(
    expected: &[Timestamp],
    ledger: &[FireRecord],
    started: &HashMap<RunId, Timestamp>,
    now: Timestamp,
) -> Vec<Line> {
    let mut by_at: BTreeMap<Timestamp, Line> = BTreeMap::new();
    for &at in expected {
        let (what, reason) = if at > now {
            ("upcoming", "not due yet".to_string())
        } else if now.duration_since(at) < GRACE {
            ("upcoming", "due just now; being recorded".to_string())
        } else {
            (
                "missing",
                "no record in the fire ledger: the scheduler has not recorded it (down, or the job was not loaded); recovery applies the misfire policy".to_string(),
            )
        };
        by_at.insert(
            at,
            Line {
                at,
                expected: true,
                what,
                reason,
                run: None,
            },
        );
    }
    for f in ledger {
        let (what, mut reason) = explain(f, started);
        if let Some(at) = f.sla_missed_at {
            reason.push_str(&format!("; missed its SLA (found at {at})"));
        }
        let expected = by_at.contains_key(&f.scheduled_at);
        by_at.insert(
            f.scheduled_at,
            Line {
                at: f.scheduled_at,
                expected,
                what,
                reason: if expected {
                    reason
                } else {
                    format!("{reason} (not a fire of the current schedule: it changed since)")
                },
                run: f.run_id,
            },
        );
    }
    by_at.into_values().collect()
}

fn explain(f: &FireRecord, started: &HashMap<RunId, Timestamp>) -> (&'static str, String) {
    match f.outcome {
        FireOutcome::Fired => {
            let late = f
                .run_id
                .and_then(|r| started.get(&r))
                .map(|s| s.duration_since(f.scheduled_at))
                .filter(|d| *d >= LATE);
            match late {
                Some(d) => (
                    "late",
                    format!(
                        "fired late: its run was created {} after the scheduled instant",
                        crate::format::duration(d)
                    ),
                ),
                None => ("fired", "fired on time: a run was created".into()),
            }
        }
        FireOutcome::SkippedOverlap => (
            "skipped_overlap",
            "skipped by the overlap policy: a run was still active (concurrency: forbid) or one already waited (buffer_one)".into(),
        ),
        FireOutcome::SkippedBacklog => (
            "skipped_backlog",
            "skipped: as many runs were waiting as max_pending_runs allows".into(),
        ),
        FireOutcome::SkippedQuota => (
            "skipped_quota",
            "skipped: the namespace had made as many scheduled fires that second as its quota allows".into(),
        ),
        FireOutcome::SkippedBreaker => (
            "skipped_breaker",
            "skipped: the job's failure breaker was open after consecutive failed runs (resume the job to close it)".into(),
        ),
        FireOutcome::MissedCaughtUp => (
            "missed_caught_up",
            "missed while the server was down or the job paused, then run by the misfire policy".into(),
        ),
        FireOutcome::MissedSkipped => (
            "missed_skipped",
            "missed while the server was down or the job paused, and not run (misfire policy)".into(),
        ),
        FireOutcome::Suppressed => match &f.calendar {
            Some(c) => (
                "suppressed",
                format!("suppressed by the exclusion calendar {c}"),
            ),
            None => (
                "suppressed",
                "suppressed: the job was paused when it came due".into(),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn rec(at: i64, outcome: FireOutcome, run: Option<RunId>) -> FireRecord {
        FireRecord {
            scheduled_at: t(at),
            outcome,
            calendar: None,
            run_id: run,
            sla_missed_at: None,
        }
    }

    #[test]
    fn every_expected_fire_is_beside_what_happened_to_it() {
        let expected: Vec<_> = (0..7).map(|i| t(i * 60)).collect();
        let mut cal = rec(240, FireOutcome::Suppressed, None);
        cal.calendar = Some("holidays".into());
        let ledger = [
            rec(0, FireOutcome::Fired, Some(1)),
            rec(60, FireOutcome::Fired, Some(2)),
            rec(120, FireOutcome::SkippedOverlap, None),
            cal,
            rec(300, FireOutcome::MissedCaughtUp, Some(3)),
            rec(30, FireOutcome::Fired, Some(4)),
        ];
        let started = HashMap::from([(1, t(0)), (2, t(63))]);
        let lines = timeline(&expected, &ledger, &started, t(362));
        let got: Vec<_> = lines
            .iter()
            .map(|l| (l.at.as_second() - 1_800_000_000, l.expected, l.what))
            .collect();
        assert_eq!(
            got,
            [
                (0, true, "fired"),
                (30, false, "fired"),
                (60, true, "late"),
                (120, true, "skipped_overlap"),
                (180, true, "missing"),
                (240, true, "suppressed"),
                (300, true, "missed_caught_up"),
                (360, true, "upcoming"),
            ]
        );
        assert!(
            lines[2].reason.contains("3.0 s after"),
            "{}",
            lines[2].reason
        );
        assert!(lines[5].reason.contains("holidays"));
        assert!(lines[1].reason.contains("schedule: it changed"));
    }
}
